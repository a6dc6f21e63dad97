//! Nobody in through the admin endpoint's side doors (docs/ADMIN.md "Trust
//! model"), as a hostile local process or a web page would try: requests
//! without the token, with a wrong one, with the token in the URL, with a
//! rebinding Host or a foreign Origin, cookie-borne changes without Origin;
//! LUN and secret paths outside the policy, through symlinks, onto
//! existing files. And the ways in that must work: the token, the console's
//! cookie, a one-time code, the Unix socket.

mod common;

use std::io::Write;
use std::os::unix::fs::symlink;
use std::os::unix::net::UnixStream;

use common::{answer, http, raw, start, TOKEN};

const IQN: &str = "iqn.2026-12.io.ironsan:auth";

fn config(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let path = dir.join("c.toml");
    std::fs::write(
        &path,
        format!(
            "listen = [\"127.0.0.1:0\"]\n{extra}[[target]]\nname = \"{IQN}\"\n[[target.lun]]\nbackend = \"null\"\nsize = \"1M\"\n"
        ),
    )
    .unwrap();
    path
}

/// Sends `method path` with the given extra header lines (each ending in
/// CRLF) and a proper Host unless one is among them; returns the status,
/// the head and the body.
fn req(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String, String) {
    let host = if headers.to_ascii_lowercase().contains("host:") {
        String::new()
    } else {
        format!("Host: {addr}\r\n")
    };
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\n{host}Connection: close\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = String::new();
    std::io::Read::read_to_string(&mut s, &mut r).unwrap();
    let code = r[9..12].parse().unwrap();
    let (head, body) = r.split_once("\r\n\r\n").unwrap_or((&r, ""));
    (code, head.to_string(), body.to_string())
}

#[test]
fn every_http_request_needs_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let run = start(&config(dir.path(), ""), None);
    let a = run.admin;
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "private").unwrap();
    let lun = format!(
        "{{\"backend\":\"file\",\"path\":\"{}\",\"size\":\"4K\"}}",
        victim.display()
    );
    let chap = format!("/api/targets/{IQN}/chap");
    let luns = format!("/api/targets/{IQN}/luns");
    for (m, p, b) in [
        ("GET", "/api/targets", ""),
        ("GET", "/api/sessions", ""),
        ("GET", "/metrics", ""),
        ("DELETE", chap.as_str(), ""),
        ("POST", luns.as_str(), lun.as_str()),
        ("POST", "/api/portals", "{\"addr\":\"127.0.0.1:1\"}"),
        ("POST", "/api/login-codes", "{}"),
    ] {
        let (code, head, _) = req(a, m, p, "", b);
        assert_eq!(code, 401, "{m} {p} without a token");
        assert!(head.contains("www-authenticate: Bearer"), "{head}");
        let (code, _, _) = req(
            a,
            m,
            p,
            "Authorization: Bearer wrong-token-000000000\r\n",
            b,
        );
        assert_eq!(code, 401, "{m} {p} with a wrong token");
        let q = format!("{p}?token={TOKEN}");
        assert_eq!(req(a, m, &q, "", b).0, 401, "{m} {p}: a token in the URL");
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"private", "untouched");
    // The token lets in; the console page itself is open (no data in it).
    assert_eq!(http(a, "GET", "/api/targets", "", None).0, 200);
    assert_eq!(req(a, "GET", "/", "", "").0, 200);
    // Unknown endpoints and methods: JSON refusals like the rest.
    let (code, body) = http(a, "GET", "/api/nosuch", "", None);
    assert_eq!(code, 404);
    assert!(body.contains("\"error\""), "{body}");
    let (code, body) = http(a, "PATCH", "/api/targets", "", None);
    assert_eq!(code, 405);
    assert!(body.contains("\"error\""), "{body}");
}

#[test]
fn rebinding_hosts_and_foreign_origins_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = start(&config(dir.path(), ""), None);
    let a = run.admin;
    let bearer = format!("Authorization: Bearer {TOKEN}\r\n");
    let portal = "{\"addr\":\"0.0.0.0:0\"}";
    let (code, _, body) = req(
        a,
        "POST",
        "/api/portals",
        &format!("Host: rebind.evil.example:{}\r\n{bearer}", a.port()),
        portal,
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("Host"), "{body}");
    for origin in [
        "http://evil.example".to_string(),
        format!("http://localhost:{}", a.port() ^ 1),
        "null".into(),
    ] {
        let (code, _, body) = req(
            a,
            "POST",
            "/api/portals",
            &format!("{bearer}Origin: {origin}\r\n"),
            portal,
        );
        assert_eq!(code, 403, "Origin {origin}: {body}");
    }
    let (code, _, _) = req(a, "GET", "/api/portals", &bearer, "");
    assert_eq!(code, 200);
    let (_, _, p) = req(a, "GET", "/api/portals", &bearer, "");
    assert!(!p.contains("0.0.0.0"), "no portal was added: {p}");
}

#[test]
fn the_console_logs_in_with_a_cookie_or_a_one_time_code() {
    let dir = tempfile::tempdir().unwrap();
    let run = start(&config(dir.path(), ""), None);
    let a = run.admin;
    let origin = format!("Origin: http://{a}\r\n");
    let (code, _, _) = req(
        a,
        "POST",
        "/api/session",
        &origin,
        "{\"token\":\"wrong-token-0000000\"}",
    );
    assert_eq!(code, 401);
    let (code, head, _) = req(
        a,
        "POST",
        "/api/session",
        &origin,
        &format!("{{\"token\":\"{TOKEN}\"}}"),
    );
    assert_eq!(code, 204, "{head}");
    let cookie_line = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .expect("a cookie")
        .to_string();
    assert!(cookie_line.contains("HttpOnly"), "{cookie_line}");
    assert!(cookie_line.contains("SameSite=Strict"), "{cookie_line}");
    assert!(!cookie_line.contains(TOKEN), "the cookie is not the token");
    let cookie = cookie_line
        .split_once(':')
        .unwrap()
        .1
        .split(';')
        .next()
        .unwrap()
        .trim()
        .to_string();
    let with = format!("Cookie: {cookie}\r\n");
    assert_eq!(req(a, "GET", "/api/targets", &with, "").0, 200);
    // A change by cookie must come from the console's own origin.
    let alua = "{\"state\":\"active-optimized\"}";
    assert_eq!(req(a, "PUT", "/api/alua/1", &with, alua).0, 403);
    assert_eq!(
        req(a, "PUT", "/api/alua/1", &format!("{with}{origin}"), alua).0,
        200
    );
    // Logged out: the cookie is worth nothing.
    assert_eq!(
        req(a, "DELETE", "/api/session", &format!("{with}{origin}"), "").0,
        204
    );
    assert_eq!(req(a, "GET", "/api/targets", &with, "").0, 401);

    // A one-time code (what `ironsan admin console` prints).
    let (code, text) = http(a, "POST", "/api/login-codes", "{}", None);
    assert_eq!(code, 201, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let path = v["path"].as_str().unwrap().to_string();
    let (code, head, _) = req(a, "GET", &path, "", "");
    assert_eq!(code, 303, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("set-cookie: ironsan_session="),
        "{head}"
    );
    assert_eq!(req(a, "GET", &path, "", "").0, 401, "spent");
}

#[test]
fn the_socket_needs_no_token_and_is_private() {
    let dir = tempfile::tempdir().unwrap();
    let run = start(&config(dir.path(), ""), None);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&run.socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    let mut s = UnixStream::connect(&run.socket).unwrap();
    s.write_all(b"GET /api/targets HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (code, body) = answer(&mut s);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(IQN));
}

#[test]
fn lun_paths_are_under_policy() {
    let dir = tempfile::tempdir().unwrap();
    let run = start(&config(dir.path(), ""), None);
    let a = run.admin;
    let luns = format!("/api/targets/{IQN}/luns");
    let add = |path: &std::path::Path, size: Option<&str>| {
        let size = size.map_or(String::new(), |s| format!(",\"size\":\"{s}\""));
        http(
            a,
            "POST",
            &luns,
            &format!(
                "{{\"backend\":\"file\",\"path\":\"{}\"{size}}}",
                path.display()
            ),
            None,
        )
    };
    // Outside the roots (default: <dir>/luns; the config names no file LUN).
    let private = tempfile::tempdir().unwrap();
    let secret = private.path().join("root-only");
    std::fs::write(&secret, "root-only data").unwrap();
    let (code, e1) = add(&secret, Some("4K"));
    assert_eq!(code, 403, "{e1}");
    assert!(e1.contains("lun_roots"), "{e1}");
    let (code, e2) = add(&private.path().join("does-not-exist"), Some("4K"));
    assert_eq!(
        (code, &e2),
        (403, &e1),
        "the same words whether the file exists or not"
    );
    assert!(!e1.contains("root-only"), "{e1}");
    assert_eq!(
        std::fs::read(&secret).unwrap(),
        b"root-only data",
        "not grown"
    );
    // Through a symlink planted in the root.
    let root = dir.path().join("luns");
    symlink(&secret, root.join("planted.img")).unwrap();
    assert_eq!(add(&root.join("planted.img"), Some("4K")).0, 403);
    // A block device is not under the root either.
    assert_eq!(add(std::path::Path::new("/dev/null"), None).0, 403);
    // A new file in the root: created, served, in the file.
    let (code, text) = add(&root.join("new.img"), Some("1M"));
    assert_eq!(code, 201, "{text}");
    assert_eq!(
        std::fs::metadata(root.join("new.img")).unwrap().len(),
        1 << 20
    );
    // Now it exists: not opened again through the API.
    http(a, "DELETE", &format!("{luns}/1"), "", None);
    assert_eq!(add(&root.join("new.img"), Some("2M")).0, 403);

    // secret_file through the API: only under secret_roots, one answer.
    let chap = format!("/api/targets/{IQN}/chap");
    let put = |p: &std::path::Path| {
        http(
            a,
            "PUT",
            &chap,
            &format!("{{\"user\":\"u\",\"secret_file\":\"{}\"}}", p.display()),
            None,
        )
    };
    let (code, s1) = put(&secret);
    assert_eq!(code, 400, "{s1}");
    let (_, s2) = put(&private.path().join("missing"));
    let (_, s3) = put(std::path::Path::new("/etc/shadow"));
    assert!(s1.contains("secret_roots"), "{s1}");
    assert_eq!((&s1, &s1), (&s2, &s3), "no hint of existence or length");
    // Under the root (the admin directory) but too short: the same words.
    let short = dir.path().join("short.secret");
    std::fs::write(&short, "short").unwrap();
    assert_eq!(put(&short).1, s1);
    let good = dir.path().join("good.secret");
    std::fs::write(&good, "a-long-enough-secret\n").unwrap();
    assert_eq!(put(&good).0, 200);
}

#[test]
fn the_metrics_may_be_opened_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), "");
    // metrics_open comes from the options the runner passes: run one here.
    let cfg = server::Config::from_file(&path).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = server::Server::bind(cfg).await.unwrap();
        let admin = admin_api::Admin::bind(
            admin_api::AdminOptions {
                listen: "127.0.0.1:0".parse().unwrap(),
                token: TOKEN.into(),
                socket: None,
                allowed_hosts: vec![],
                metrics_open: true,
                paths: Default::default(),
                config_path: None,
            },
            s.control(),
        )
        .await
        .unwrap();
        let a = admin.local_addr().unwrap();
        tokio::spawn(admin.run());
        let (m, t) = tokio::task::spawn_blocking(move || {
            (
                raw(
                    a,
                    &format!("GET /metrics HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n"),
                ),
                raw(
                    a,
                    &format!("GET /api/targets HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n"),
                ),
            )
        })
        .await
        .unwrap();
        assert_eq!(m.0, 200);
        assert_eq!(t.0, 401, "only /metrics is open");
        // A short token is refused at start.
        let e = admin_api::Admin::bind(
            admin_api::AdminOptions {
                listen: "127.0.0.1:0".parse().unwrap(),
                token: "short".into(),
                socket: None,
                allowed_hosts: vec![],
                metrics_open: false,
                paths: Default::default(),
                config_path: None,
            },
            s.control(),
        )
        .await
        .unwrap_err();
        assert!(e.contains("at least 16"), "{e}");
    });
}
