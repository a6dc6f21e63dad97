//! Who may use the admin endpoint (docs/ADMIN.md "Trust model").
//!
//! - **The Unix socket** (`<dir>/admin.sock`, mode 0600 in a 0700
//!   directory): the kernel lets only the service user (and root) connect;
//!   the peer's user id (`SO_PEERCRED`) is checked again at accept, and a
//!   request that came through it needs nothing more.
//! - **HTTP** (the `listen` address): every request carries the token
//!   (`Authorization: Bearer`, compared in constant time) or the cookie of
//!   a console session opened with it (`HttpOnly; SameSite=Strict`). The
//!   token is never accepted in a URL. `Host` must name the bound address,
//!   `localhost` or an `allowed_hosts` entry (DNS rebinding), and `Origin`,
//!   when a browser sends one, the same with the bound port; a request
//!   authenticated by cookie that changes something must carry a matching
//!   `Origin` (cross-site request forgery).
//!
//! Open without credentials: the console page itself (static, no data),
//! the log-in exchanges, and `/metrics` when `metrics_open` says so.

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap, Method, StatusCode};
use parking_lot::Mutex;
use subtle::ConstantTimeEq;

/// Shortest token accepted (bytes).
pub const MIN_TOKEN_LEN: usize = 16;
/// The generated token file's name under the admin directory.
pub const TOKEN_FILE: &str = "admin.token";
/// The socket's name under the admin directory.
pub const SOCKET_FILE: &str = "admin.sock";
/// The console session cookie.
pub const COOKIE: &str = "ironsan_session";
/// How long a console session lasts.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Console sessions kept at once (the oldest goes first).
const MAX_SESSIONS: usize = 64;
/// How long a one-time log-in code is good for.
pub const CODE_TTL: Duration = Duration::from_secs(60);
/// One-time codes outstanding at once.
const MAX_CODES: usize = 16;

/// The admin directory when none is configured: `$IRONSAN_STATE_DIR`, else
/// `/var/lib/ironsan` for root, `$XDG_STATE_HOME/ironsan` or
/// `~/.local/state/ironsan` otherwise.
pub fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("IRONSAN_STATE_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
    {
        return d;
    }
    if effective_uid() == 0 {
        return PathBuf::from("/var/lib/ironsan");
    }
    let abs = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").and_then(abs) {
        return x.join("ironsan");
    }
    match std::env::var_os("HOME").and_then(abs) {
        Some(h) => h.join(".local/state/ironsan"),
        None => PathBuf::from(format!("/tmp/ironsan-{}", effective_uid())),
    }
}

/// This process's effective user id.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Creates `dir` (mode 0700) when missing.
pub fn ensure_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// The first line of a token file; refuses one that others may read.
pub fn read_token_file(path: &Path) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{}: readable by other users; chmod 600 it",
            path.display()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let t = text.lines().next().unwrap_or("").trim().to_string();
    check_token(&t).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(t)
}

/// A token must be long enough not to be guessed.
pub fn check_token(t: &str) -> Result<(), String> {
    if t.len() < MIN_TOKEN_LEN || t.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "the admin token must be at least {MIN_TOKEN_LEN} bytes without spaces"
        ));
    }
    Ok(())
}

/// Random bytes as lower-case hex.
pub fn random_hex(n: usize) -> std::io::Result<String> {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).map_err(std::io::Error::other)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The token in `dir/admin.token`, generated (mode 0600) when missing.
/// Returns it and whether it was created now.
pub fn load_or_create_token(dir: &Path) -> Result<(String, bool), String> {
    load_or_create_token_file(&dir.join(TOKEN_FILE))
}

/// The token in `path`, or a new one (32 random bytes as hex) written
/// there (mode 0600, never through a symlink; its directory created 0700).
/// Returns it and whether it was created now.
pub fn load_or_create_token_file(path: &Path) -> Result<(String, bool), String> {
    if path.exists() {
        return read_token_file(path).map(|t| (t, false));
    }
    if let Some(dir) = path.parent() {
        ensure_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let token = random_hex(32).map_err(|e| format!("random token: {e}"))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(f, "{token}")
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((token, true))
}

/// How a request reached the endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// Over TCP, to this bound address.
    Http(SocketAddr),
    /// Over the Unix socket, from a permitted user.
    Socket,
}

/// The HTTP side's credentials and the console's sessions.
pub(crate) struct Gate {
    token: String,
    allowed_hosts: Vec<String>,
    pub metrics_open: bool,
    /// Console sessions: cookie value → expiry.
    sessions: Mutex<Vec<(String, Instant)>>,
    /// One-time log-in codes → expiry.
    codes: Mutex<HashMap<String, Instant>>,
}

/// Why a request is turned away.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// 403: a Host or Origin this endpoint does not answer to.
    Forbidden(&'static str),
    /// 401: no valid credential.
    Unauthenticated,
}

impl Gate {
    pub fn new(token: String, allowed_hosts: Vec<String>, metrics_open: bool) -> Gate {
        Gate {
            token,
            allowed_hosts: allowed_hosts
                .into_iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
            metrics_open,
            sessions: Mutex::default(),
            codes: Mutex::default(),
        }
    }

    /// Whether `t` is the token (constant time).
    pub fn is_token(&self, t: &str) -> bool {
        t.as_bytes().ct_eq(self.token.as_bytes()).into()
    }

    /// Whether the host part of a `Host` or `Origin` authority is one this
    /// endpoint answers to.
    fn host_allowed(&self, host: &str, bound: SocketAddr) -> bool {
        let host = host.to_ascii_lowercase();
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(&host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            // An address cannot be rebound: any of this host's addresses
            // when bound to all of them, else the bound one (or loopback
            // for a loopback endpoint).
            return ip == bound.ip()
                || bound.ip().is_unspecified()
                || (bound.ip().is_loopback() && ip.is_loopback());
        }
        host == "localhost" || self.allowed_hosts.contains(&host)
    }

    /// Checks `Host` and `Origin`, then the credential (for the public
    /// requests, only `Host` and `Origin`).
    pub fn check(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        bound: SocketAddr,
    ) -> Result<(), Refusal> {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .ok_or(Refusal::Forbidden("a Host header is required"))?;
        let (name, port) = split_authority(host);
        if !self.host_allowed(name, bound) || port.is_some_and(|p| p != bound.port()) {
            return Err(Refusal::Forbidden(
                "the Host header names no address of this endpoint (see [admin] allowed_hosts)",
            ));
        }
        let origin = headers
            .get(header::ORIGIN)
            .map(|v| v.to_str().unwrap_or("?"));
        if let Some(o) = origin {
            if !self.origin_allowed(o, bound) {
                return Err(Refusal::Forbidden("cross-origin requests are refused"));
            }
        }
        if is_public(method, path, self.metrics_open) {
            return Ok(());
        }
        if let Some(b) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
        {
            return if self.is_token(b.trim()) {
                Ok(())
            } else {
                Err(Refusal::Unauthenticated)
            };
        }
        let Some(cookie) = session_cookie(headers) else {
            return Err(Refusal::Unauthenticated);
        };
        if !self.session_valid(cookie) {
            return Err(Refusal::Unauthenticated);
        }
        // A browser sends Origin with every request that is not a GET or
        // HEAD; a cookie-borne change without one did not come from the
        // console.
        if !matches!(*method, Method::GET | Method::HEAD) && origin.is_none() {
            return Err(Refusal::Forbidden(
                "a change made with the console's cookie must carry Origin",
            ));
        }
        Ok(())
    }

    fn origin_allowed(&self, origin: &str, bound: SocketAddr) -> bool {
        let Some(auth) = origin.strip_prefix("http://") else {
            return false;
        };
        let (name, port) = split_authority(auth);
        self.host_allowed(name, bound) && port.unwrap_or(80) == bound.port()
    }

    /// Opens a console session; returns the cookie value.
    pub fn open_session(&self) -> std::io::Result<String> {
        let id = random_hex(32)?;
        let now = Instant::now();
        let mut s = self.sessions.lock();
        s.retain(|(_, exp)| *exp > now);
        if s.len() >= MAX_SESSIONS {
            s.remove(0);
        }
        s.push((id.clone(), now + SESSION_TTL));
        Ok(id)
    }

    fn session_valid(&self, cookie: &str) -> bool {
        let now = Instant::now();
        let s = self.sessions.lock();
        // Every entry compared in constant time; no early exit.
        s.iter().fold(false, |hit, (id, exp)| {
            let same: bool = id.as_bytes().ct_eq(cookie.as_bytes()).into();
            hit | (same && *exp > now)
        })
    }

    /// Ends the console session `cookie`.
    pub fn close_session(&self, cookie: &str) {
        self.sessions
            .lock()
            .retain(|(id, _)| !bool::from(id.as_bytes().ct_eq(cookie.as_bytes())));
    }

    /// A one-time code that opens a console session (`GET /login?code=`).
    pub fn new_code(&self) -> std::io::Result<String> {
        let code = random_hex(16)?;
        let now = Instant::now();
        let mut c = self.codes.lock();
        c.retain(|_, exp| *exp > now);
        if c.len() >= MAX_CODES {
            return Err(std::io::Error::other(
                "too many log-in codes outstanding; wait a minute",
            ));
        }
        c.insert(code.clone(), now + CODE_TTL);
        Ok(code)
    }

    /// Spends a one-time code: whether it was outstanding.
    pub fn spend_code(&self, code: &str) -> bool {
        let now = Instant::now();
        let mut c = self.codes.lock();
        let hit = c
            .iter()
            .find(|(k, exp)| bool::from(k.as_bytes().ct_eq(code.as_bytes())) && **exp > now)
            .map(|(k, _)| k.clone());
        hit.is_some_and(|k| c.remove(&k).is_some())
    }
}

/// Requests answered without a credential (Host and Origin still checked).
fn is_public(method: &Method, path: &str, metrics_open: bool) -> bool {
    match (method, path) {
        (&Method::GET, "/" | "/login") => true,
        (&Method::POST | &Method::DELETE, "/api/session") => true,
        (&Method::GET, "/metrics") => metrics_open,
        _ => false,
    }
}

/// The console session cookie's value, if the request has one.
pub(crate) fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == COOKIE).then_some(v)
        })
}

/// `host[:port]` or `[v6][:port]` → (host, port).
fn split_authority(a: &str) -> (&str, Option<u16>) {
    let a = a.trim().trim_end_matches('/');
    if let Some(rest) = a.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((h, p)) => (
                &a[..h.len() + 2],
                p.strip_prefix(':').and_then(|p| p.parse().ok()),
            ),
            None => (a, None),
        };
    }
    match a.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => match p.parse() {
            Ok(port) => (h, Some(port)),
            Err(_) => (a, Some(0)),
        },
        _ => (a, None),
    }
}

/// The status and message for a refusal.
pub(crate) fn refusal_status(r: &Refusal) -> (StatusCode, &'static str) {
    match r {
        Refusal::Forbidden(m) => (StatusCode::FORBIDDEN, m),
        Refusal::Unauthenticated => (
            StatusCode::UNAUTHORIZED,
            "authentication required: Authorization: Bearer TOKEN (the token is in the admin directory's admin.token), or use the Unix socket",
        ),
    }
}

/// A Unix listener that admits only this user and root (`SO_PEERCRED`),
/// behind the socket file's own 0600 mode.
pub(crate) struct PeerChecked {
    pub listener: tokio::net::UnixListener,
    pub path: PathBuf,
}

impl PeerChecked {
    /// Binds `path` (mode 0600), replacing a stale socket file but never a
    /// live one.
    pub fn bind(path: &Path) -> Result<PeerChecked, String> {
        if let Some(dir) = path.parent() {
            ensure_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(format!("{}: exists and is not a socket", path.display()));
            }
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(format!(
                    "{}: another ironsan serves its admin socket here; give this one another --state-dir (or [admin] dir)",
                    path.display()
                ));
            }
            std::fs::remove_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        let listener = tokio::net::UnixListener::bind(path)
            .map_err(|e| format!("admin socket {}: {e}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(PeerChecked {
            listener,
            path: path.to_path_buf(),
        })
    }
}

impl Drop for PeerChecked {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl axum::serve::Listener for PeerChecked {
    type Io = tokio::net::UnixStream;
    type Addr = ();

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let me = effective_uid();
        loop {
            match self.listener.accept().await {
                Ok((s, _)) => match s.peer_cred() {
                    Ok(c) if c.uid() == me || c.uid() == 0 => return (s, ()),
                    Ok(c) => {
                        tracing::warn!(uid = c.uid(), "admin socket: another user refused")
                    }
                    Err(e) => tracing::warn!(error = %e, "admin socket: no peer credentials"),
                },
                Err(e) => {
                    tracing::warn!(error = %e, "admin socket: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn req(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    const TOKEN: &str = "0123456789abcdef0123";

    #[test]
    fn every_request_needs_the_token_or_a_session() {
        let g = Gate::new(TOKEN.into(), vec![], false);
        let at: SocketAddr = "127.0.0.1:9260".parse().unwrap();
        let get = |h: &[(&str, &str)], path: &str| g.check(&Method::GET, path, &req(h), at);
        let host = ("host", "127.0.0.1:9260");
        assert_eq!(get(&[host], "/api/targets"), Err(Refusal::Unauthenticated));
        assert_eq!(get(&[host], "/metrics"), Err(Refusal::Unauthenticated));
        assert_eq!(
            get(
                &[host, ("authorization", "Bearer wrong-token-0000000")],
                "/api/targets"
            ),
            Err(Refusal::Unauthenticated)
        );
        let bearer = format!("Bearer {TOKEN}");
        assert_eq!(
            get(&[host, ("authorization", &bearer)], "/api/targets"),
            Ok(())
        );
        // Never in the URL.
        assert_eq!(
            get(&[host], &format!("/api/targets?token={TOKEN}")),
            Err(Refusal::Unauthenticated)
        );
        // The console page and /metrics when opened.
        assert_eq!(get(&[host], "/"), Ok(()));
        let open = Gate::new(TOKEN.into(), vec![], true);
        assert_eq!(
            open.check(&Method::GET, "/metrics", &req(&[host]), at),
            Ok(())
        );
        // A session cookie.
        let id = g.open_session().unwrap();
        let cookie = format!("a=b; {COOKIE}={id}");
        assert_eq!(get(&[host, ("cookie", &cookie)], "/api/targets"), Ok(()));
        assert_eq!(
            get(
                &[host, ("cookie", &format!("{COOKIE}=x{id}"))],
                "/api/targets"
            ),
            Err(Refusal::Unauthenticated)
        );
        // A change by cookie needs a matching Origin.
        let post = |h: &[(&str, &str)]| g.check(&Method::POST, "/api/portals", &req(h), at);
        assert!(matches!(
            post(&[host, ("cookie", &cookie)]),
            Err(Refusal::Forbidden(_))
        ));
        assert_eq!(
            post(&[
                host,
                ("cookie", &cookie),
                ("origin", "http://127.0.0.1:9260")
            ]),
            Ok(())
        );
        g.close_session(&id);
        assert_eq!(
            get(&[host, ("cookie", &cookie)], "/api/targets"),
            Err(Refusal::Unauthenticated)
        );
    }

    #[test]
    fn host_and_origin_are_checked() {
        let g = Gate::new(TOKEN.into(), vec!["san1.example".into()], false);
        let at: SocketAddr = "127.0.0.1:9260".parse().unwrap();
        let bearer = format!("Bearer {TOKEN}");
        let check = |host: Option<&str>, origin: Option<&str>| {
            let mut h = vec![("authorization", bearer.as_str())];
            h.extend(host.map(|v| ("host", v)));
            h.extend(origin.map(|v| ("origin", v)));
            g.check(&Method::POST, "/api/portals", &req(&h), at)
        };
        for ok in [
            "127.0.0.1:9260",
            "127.0.0.1",
            "localhost:9260",
            "LOCALHOST",
            "[::1]:9260",
            "san1.example:9260",
        ] {
            assert_eq!(check(Some(ok), None), Ok(()), "{ok}");
        }
        for bad in [
            "rebind.evil.example:9260",
            "127.0.0.1.evil.example",
            "localhost:9261",
            "10.1.1.1:9260",
            "",
        ] {
            assert!(
                matches!(check(Some(bad), None), Err(Refusal::Forbidden(_))),
                "{bad}"
            );
        }
        assert!(matches!(check(None, None), Err(Refusal::Forbidden(_))));
        let host = Some("127.0.0.1:9260");
        assert_eq!(check(host, Some("http://127.0.0.1:9260")), Ok(()));
        assert_eq!(check(host, Some("http://localhost:9260")), Ok(()));
        for bad in [
            "http://evil.example",
            "http://localhost:8000",
            "https://127.0.0.1:9260",
            "null",
        ] {
            assert!(
                matches!(check(host, Some(bad)), Err(Refusal::Forbidden(_))),
                "{bad}"
            );
        }
        // Bound to every address: any address literal, still no names.
        let any: SocketAddr = "0.0.0.0:9260".parse().unwrap();
        let h = req(&[("authorization", &bearer), ("host", "192.0.2.7:9260")]);
        assert_eq!(g.check(&Method::GET, "/api/targets", &h, any), Ok(()));
        let h = req(&[("authorization", &bearer), ("host", "evil.example:9260")]);
        assert!(g.check(&Method::GET, "/api/targets", &h, any).is_err());
    }

    #[test]
    fn codes_are_spent_once() {
        let g = Gate::new(TOKEN.into(), vec![], false);
        let c = g.new_code().unwrap();
        assert!(!g.spend_code("nope"));
        assert!(g.spend_code(&c));
        assert!(!g.spend_code(&c));
        for _ in 0..MAX_CODES {
            g.new_code().unwrap();
        }
        assert!(g.new_code().is_err(), "bounded");
    }

    #[test]
    fn tokens_are_generated_private_and_reused() {
        let d = std::env::temp_dir().join(format!("ironsan-token-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let (t, created) = load_or_create_token(&d).unwrap();
        assert!(created && t.len() == 64);
        let mode = std::fs::metadata(d.join(TOKEN_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load_or_create_token(&d).unwrap(), (t, false));
        std::fs::set_permissions(d.join(TOKEN_FILE), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        assert!(load_or_create_token(&d).unwrap_err().contains("chmod"));
        assert!(check_token("short").is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
