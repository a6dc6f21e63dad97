//! The admin endpoint: a JSON REST API over HTTP/1.1 (axum), `GET /metrics`
//! for Prometheus and the web console at `/`.
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/` | the web console (one self-contained page) |
//! | GET | `/metrics` | Prometheus text format |
//! | GET | `/api/targets` | targets, LUNs (NAA, size), ALUA states |
//! | POST | `/api/targets/{iqn}/luns` | add a LUN: a `[[target.lun]]` table as JSON (`number` optional) |
//! | DELETE | `/api/targets/{iqn}/luns/{n}` | remove a LUN |
//! | POST | `/api/targets/{iqn}/luns/{n}/resize` | `{"size": "2G", "shrink": false}`: grow a LUN (shrink RAM/null LUNs with `"shrink": true`) |
//! | GET | `/api/targets/{iqn}/acl` | initiator names and networks allowed, CHAP `set`/`unset` (never a secret) |
//! | POST | `/api/targets/{iqn}/acl` | `{"initiator": "iqn…"}` or `{"network": "10.0.0.0/8"}`: allow it |
//! | DELETE | `/api/targets/{iqn}/acl/{entry}` | remove an initiator name or a network (`/` as `%2F`); the last one needs `?allow_any=true` |
//! | PUT | `/api/targets/{iqn}/chap` | `{"user": u, "secret": s}` (or `"secret_file"`): initiators must log in with CHAP |
//! | DELETE | `/api/targets/{iqn}/chap` | no CHAP (clears `mutual_chap` too) |
//! | PUT/DELETE | `/api/targets/{iqn}/mutual_chap` | the target's credentials for mutual CHAP |
//! | GET | `/api/discovery` | discovery sessions' CHAP `set`/`unset` |
//! | PUT/DELETE | `/api/discovery/chap`, `/api/discovery/mutual_chap` | CHAP of discovery sessions (`[discovery]`) |
//! | GET | `/api/portals` | portals |
//! | POST | `/api/portals` | `{"addr": "ip:port", "alua_group": n?}`: add a portal |
//! | DELETE | `/api/portals/{tpgt or ip:port}` | remove a portal: no longer listened on or listed by SendTargets; its connections finish their commands and close; not the last one |
//! | PUT | `/api/alua/{group}` | `{"state": "standby"}`: set an ALUA group's state |
//! | GET | `/api/sessions` | sessions: initiator, ISID, portal, negotiated parameters, counters |
//! | GET | `/api/stats` | per LUN and per session: totals and the last second's rates |
//! | GET | `/api/history` | per LUN: the last 300 seconds of rates |
//!
//! ACL and CHAP changes apply to the next login; sessions already logged
//! in keep running unless the request says `?drop_sessions=true`, which
//! ends those the new rules no longer allow (after a CHAP change: every
//! session of the target).
//!
//! Every request is authenticated (the `auth` module): over the Unix
//! socket by the peer's user id, over HTTP by the token or a console
//! session cookie, with `Host` and `Origin` checked. Paths the API names
//! are under policy (the `paths` module). Changes are serialised; when the
//! server was started with `--config`, each change is written to the file
//! first (the `persist` module) and applied only if that succeeded.

mod acl;
pub mod auth;
pub mod paths;
mod persist;
mod prom;
mod rates;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;

use server::config::{LunConfig, TargetConfig};
use server::control::{Control, ControlError};
use server::size::parse_size;
use server::stats::LunCounters;

pub use rates::{Rate, HISTORY};

/// How the admin endpoint is set up.
#[derive(Clone, Debug)]
pub struct AdminOptions {
    /// The HTTP address.
    pub listen: SocketAddr,
    /// The token HTTP requests must carry (at least 16 bytes).
    pub token: String,
    /// The Unix socket (mode 0600) for `ironsan admin`; none: HTTP only.
    pub socket: Option<PathBuf>,
    /// Host names HTTP requests may name besides the bound address and
    /// `localhost`.
    pub allowed_hosts: Vec<String>,
    /// `GET /metrics` without a token.
    pub metrics_open: bool,
    /// Which files the API may make the server open.
    pub paths: paths::PathPolicy,
    /// The configuration file to keep in step (`serve --config`).
    pub config_path: Option<PathBuf>,
}

struct AdminState {
    ctl: Control,
    /// The bound HTTP address.
    http: SocketAddr,
    gate: auth::Gate,
    paths: paths::PathPolicy,
    config_path: Option<PathBuf>,
    /// Serialises changes (and their file writes).
    change: tokio::sync::Mutex<()>,
    rates: parking_lot::Mutex<rates::Rates>,
}

type St = State<Arc<AdminState>>;

/// A bound admin endpoint.
pub struct Admin {
    listener: tokio::net::TcpListener,
    socket: Option<auth::PeerChecked>,
    state: Arc<AdminState>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").finish_non_exhaustive()
    }
}

impl Admin {
    /// Checks the options and binds the address and the socket.
    pub async fn bind(opts: AdminOptions, ctl: Control) -> Result<Admin, String> {
        auth::check_token(&opts.token)?;
        let listener = tokio::net::TcpListener::bind(opts.listen)
            .await
            .map_err(|e| format!("admin endpoint {}: {e}", opts.listen))?;
        let http = listener
            .local_addr()
            .map_err(|e| format!("admin endpoint {}: {e}", opts.listen))?;
        let socket = opts
            .socket
            .as_deref()
            .map(auth::PeerChecked::bind)
            .transpose()?;
        Ok(Admin {
            listener,
            socket,
            state: Arc::new(AdminState {
                ctl,
                http,
                gate: auth::Gate::new(opts.token, opts.allowed_hosts, opts.metrics_open),
                paths: opts.paths,
                config_path: opts.config_path,
                change: tokio::sync::Mutex::new(()),
                rates: parking_lot::Mutex::default(),
            }),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until the task is dropped; samples rates every second.
    pub async fn run(self) {
        let st = self.state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let snap = st.ctl.stats();
                let t_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                st.rates.lock().push(snap, Instant::now(), t_ms);
            }
        });
        let bound = match self.listener.local_addr() {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(error = %e, "admin endpoint has no address");
                return;
            }
        };
        let http = axum::serve(
            self.listener,
            router(self.state.clone(), auth::Via::Http(bound)),
        );
        match self.socket {
            Some(sock) => {
                let unix = axum::serve(sock, router(self.state, auth::Via::Socket));
                tokio::select! {
                    r = http => if let Err(e) = r {
                        tracing::error!(error = %e, "admin endpoint stopped");
                    },
                    r = unix => if let Err(e) = r {
                        tracing::error!(error = %e, "admin socket stopped");
                    },
                }
            }
            None => {
                if let Err(e) = http.await {
                    tracing::error!(error = %e, "admin endpoint stopped");
                }
            }
        }
    }
}

fn router(state: Arc<AdminState>, via: auth::Via) -> Router {
    Router::new()
        .route("/", get(console))
        .route("/login", get(login_with_code))
        .route("/api/session", post(open_session).delete(close_session))
        .route("/api/login-codes", post(new_login_code))
        .route("/metrics", get(metrics))
        .route("/api/targets", get(targets).post(add_target))
        .route(
            "/api/targets/{target}",
            axum::routing::delete(remove_target),
        )
        .route("/api/targets/{target}/luns", post(add_lun))
        .route(
            "/api/targets/{target}/luns/{lun}",
            axum::routing::delete(remove_lun),
        )
        .route("/api/targets/{target}/luns/{lun}/resize", post(resize_lun))
        .route(
            "/api/targets/{target}/acl",
            get(acl::get_acl).post(acl::add_acl),
        )
        .route(
            "/api/targets/{target}/acl/{entry}",
            axum::routing::delete(acl::remove_acl),
        )
        .route(
            "/api/targets/{target}/chap",
            put(acl::put_chap).delete(acl::delete_chap),
        )
        .route(
            "/api/targets/{target}/mutual_chap",
            put(acl::put_mutual_chap).delete(acl::delete_mutual_chap),
        )
        .route("/api/discovery", get(acl::get_discovery))
        .route(
            "/api/discovery/{role}",
            put(acl::put_discovery).delete(acl::delete_discovery),
        )
        .route("/api/portals", get(portals).post(add_portal))
        .route(
            "/api/portals/{portal}",
            axum::routing::delete(remove_portal),
        )
        .route("/api/nvme-ports", get(nvme_ports).post(add_nvme_port))
        .route(
            "/api/nvme-ports/{port}",
            axum::routing::delete(remove_nvme_port),
        )
        .route("/api/alua/{group}", put(set_alua))
        .route("/api/sessions", get(sessions))
        .route("/api/stats", get(stats))
        .route("/api/history", get(history))
        // Refusals are JSON like every other answer (docs/ADMIN.md).
        .fallback(|| async { err(StatusCode::NOT_FOUND, "no such endpoint (docs/ADMIN.md)") })
        .method_not_allowed_fallback(|| async {
            err(
                StatusCode::METHOD_NOT_ALLOWED,
                "this endpoint does not take that method (docs/ADMIN.md)",
            )
        })
        .layer(middleware::from_fn_with_state((state.clone(), via), guard))
        .with_state(state)
}

/// Every request passes here first (the `auth` module).
async fn guard(
    State((st, via)): State<(Arc<AdminState>, auth::Via)>,
    req: Request,
    next: Next,
) -> Response {
    if let auth::Via::Http(bound) = via {
        if let Err(r) = st
            .gate
            .check(req.method(), req.uri().path(), req.headers(), bound)
        {
            let (code, msg) = auth::refusal_status(&r);
            let mut resp = err(code, msg);
            if code == StatusCode::UNAUTHORIZED {
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer realm=\"ironsan\""),
                );
            }
            return resp;
        }
    }
    next.run(req).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginReq {
    token: String,
}

/// The console's cookie for a session.
fn set_cookie(id: &str, max_age: u64) -> header::HeaderValue {
    header::HeaderValue::from_str(&format!(
        "{}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}",
        auth::COOKIE
    ))
    .unwrap_or_else(|_| header::HeaderValue::from_static(""))
}

/// `POST /api/session {"token": …}`: opens a console session (a cookie).
async fn open_session(State(st): St, Body(r): Body<LoginReq>) -> Response {
    if !st.gate.is_token(r.token.trim()) {
        // Tokens are long and random; still, make guessing slow.
        tokio::time::sleep(Duration::from_millis(500)).await;
        return err(StatusCode::UNAUTHORIZED, "wrong token");
    }
    cookie_answer(&st, StatusCode::NO_CONTENT)
}

/// `code` with a new session's cookie (and, for a redirect, to `/`).
fn cookie_answer(st: &AdminState, code: StatusCode) -> Response {
    match st.gate.open_session() {
        Ok(id) => {
            let mut r = code.into_response();
            r.headers_mut()
                .insert(header::SET_COOKIE, set_cookie(&id, 12 * 3600));
            if code.is_redirection() {
                r.headers_mut()
                    .insert(header::LOCATION, header::HeaderValue::from_static("/"));
            }
            r
        }
        Err(e) => err(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// `DELETE /api/session`: ends the console session.
async fn close_session(State(st): St, headers: HeaderMap) -> Response {
    if let Some(c) = auth::session_cookie(&headers) {
        st.gate.close_session(c);
    }
    let mut r = StatusCode::NO_CONTENT.into_response();
    r.headers_mut()
        .insert(header::SET_COOKIE, set_cookie("", 0));
    r
}

#[derive(Deserialize)]
struct CodeQuery {
    code: String,
}

/// `GET /login?code=…`: spends a one-time code from `ironsan admin
/// console` and opens a console session.
async fn login_with_code(State(st): St, Query(q): Query<CodeQuery>) -> Response {
    if !st.gate.spend_code(&q.code) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        return err(
            StatusCode::UNAUTHORIZED,
            "this log-in link was used or has expired: run `ironsan admin console` again",
        );
    }
    cookie_answer(&st, StatusCode::SEE_OTHER)
}

/// `POST /api/login-codes` (authenticated): a one-time code for the
/// console, good for a minute.
async fn new_login_code(State(st): St) -> Response {
    match st.gate.new_code() {
        Ok(code) => (
            StatusCode::CREATED,
            Json(json!({
                "code": code,
                "path": format!("/login?code={code}"),
                "http": st.http,
                "expires_in_s": auth::CODE_TTL.as_secs(),
            })),
        )
            .into_response(),
        Err(e) => err(StatusCode::TOO_MANY_REQUESTS, e),
    }
}

fn err(code: StatusCode, msg: impl std::fmt::Display) -> Response {
    (code, Json(json!({ "error": msg.to_string() }))).into_response()
}

/// A JSON request body; a body that is not valid JSON for `T` gets a
/// 400 with a JSON error, like every other refusal.
struct Body<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for Body<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(e) => Err(err(StatusCode::BAD_REQUEST, e.body_text())),
        }
    }
}

/// Query parameters; bad ones get a 400 with a JSON error.
struct Params<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequestParts<S>
    for Params<T>
{
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => Ok(Params(v)),
            Err(e) => Err(err(StatusCode::BAD_REQUEST, e.body_text())),
        }
    }
}

/// The answer to a change the server refused: 404, 409 or 400 with the
/// reason.
fn refused(e: ControlError) -> Response {
    let code = match e {
        ControlError::NotFound(_) => StatusCode::NOT_FOUND,
        ControlError::Conflict(_) => StatusCode::CONFLICT,
        ControlError::Invalid(_) => StatusCode::BAD_REQUEST,
    };
    err(code, e)
}

/// Applies `edit` to the configuration file, validates it and writes it;
/// `Ok(false)` when there is no file to keep in step.
fn persist(
    st: &AdminState,
    edit: impl FnOnce(&mut toml_edit::DocumentMut) -> Result<(), String>,
) -> Result<bool, Box<Response>> {
    let Some(path) = &st.config_path else {
        return Ok(false);
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        Box::new(err(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{}: {e}", path.display()),
        ))
    })?;
    let mut doc =
        persist::parse(&text).map_err(|e| Box::new(err(StatusCode::INTERNAL_SERVER_ERROR, e)))?;
    edit(&mut doc).map_err(|e| Box::new(err(StatusCode::CONFLICT, e)))?;
    persist::validate(&doc).map_err(|e| Box::new(err(StatusCode::BAD_REQUEST, e)))?;
    persist::write_atomic(path, &doc.to_string()).map_err(|e| {
        Box::new(err(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("writing {}: {e}", path.display()),
        ))
    })?;
    Ok(true)
}

async fn console() -> impl IntoResponse {
    (
        [
            (header::CACHE_CONTROL, "no-store"),
            // Never inside another site's frame (clickjacking).
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CONTENT_SECURITY_POLICY, "frame-ancestors 'none'"),
        ],
        Html(include_str!("console.html")),
    )
}

async fn metrics(State(st): St) -> impl IntoResponse {
    let mut text = prom::render(&st.ctl.stats(), &st.ctl.targets());
    prom::render_admission(&mut text, &st.ctl.admission_counters());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
}

async fn targets(State(st): St) -> impl IntoResponse {
    Json(st.ctl.targets())
}

async fn portals(State(st): St) -> impl IntoResponse {
    Json(st.ctl.portals())
}

/// Adds a target: its name, LUNs and access lists ([`TargetConfig`]).
/// Credentials are not taken here: a target that must require CHAP is
/// added with an `allow` list that keeps everyone out until `set-chap`.
async fn add_target(State(st): St, Body(mut c): Body<TargetConfig>) -> Response {
    let _g = st.change.lock().await;
    if c.chap.is_some() || c.mutual_chap.is_some() {
        return err(
            StatusCode::BAD_REQUEST,
            "credentials are set with PUT /api/targets/{target}/chap once the target exists \
             (give it an allow list meanwhile)",
        );
    }
    // DH-HMAC-CHAP secrets come as files under secret_roots, never inline,
    // and every failure to use one is answered alike (as for CHAP).
    if let Some(d) = &mut c.dhchap {
        if d.secret.is_some() || d.ctrl_secret.is_some() {
            return err(
                StatusCode::BAD_REQUEST,
                "DH-HMAC-CHAP secrets are given as files (dhchap.secret_file, \
                 dhchap.ctrl_secret_file) under secret_roots",
            );
        }
        for f in [&mut d.secret_file, &mut d.ctrl_secret_file]
            .into_iter()
            .flatten()
        {
            match st.paths.secret_path(f) {
                Ok(p) => *f = p,
                Err(m) => return err(StatusCode::BAD_REQUEST, m),
            }
        }
        if d.resolve("dhchap").is_err() {
            return err(StatusCode::BAD_REQUEST, st.paths.secret_refusal());
        }
    }
    if st.ctl.target_exists(&c.name).is_ok() {
        return err(StatusCode::CONFLICT, format!("target {} exists", c.name));
    }
    // Checked whole (at most 256 LUNs, …) before any file is touched.
    if let Err(e) = c.validate() {
        return err(StatusCode::BAD_REQUEST, e);
    }
    // Paths under policy; files created here are removed again if the
    // target does not go into service.
    let mut created = Vec::new();
    for l in &mut c.lun {
        match st.paths.admit_lun(l) {
            Ok(g) => created.push(g),
            Err(m) => return err(StatusCode::FORBIDDEN, m),
        }
    }
    let persisted = match persist(&st, |d| persist::add_target(d, &c)) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    match st.ctl.add_target(&c) {
        Ok(v) => {
            created.into_iter().for_each(|g| g.keep());
            (
                StatusCode::CREATED,
                Json(json!({ "target": v, "persisted": persisted })),
            )
                .into_response()
        }
        Err(e) => {
            if persisted {
                // The file must not name a target that is not served.
                let _ = persist(&st, |d| persist::remove_target(d, &c.name));
            }
            refused(e)
        }
    }
}

/// Removes a target: its sessions and NVMe/TCP controllers end.
async fn remove_target(State(st): St, Path(target): Path<String>) -> Response {
    let _g = st.change.lock().await;
    if let Err(e) = st.ctl.target_exists(&target) {
        return refused(e);
    }
    if st.ctl.targets().len() == 1 {
        return err(
            StatusCode::CONFLICT,
            "the last target cannot be removed: add another first",
        );
    }
    let persisted = match persist(&st, |d| persist::remove_target(d, &target)) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    match st.ctl.remove_target(&target) {
        Ok(()) => Json(json!({ "removed": target, "persisted": persisted })).into_response(),
        Err(e) => refused(e),
    }
}

async fn add_lun(
    State(st): St,
    Path(target): Path<String>,
    Body(mut c): Body<LunConfig>,
) -> Response {
    let _g = st.change.lock().await;
    let n = match c.number {
        Some(n) => n,
        None => match st.ctl.free_lun(&target) {
            Ok(n) => n,
            Err(e) => return refused(e),
        },
    };
    c.number = Some(n);
    if let Err(e) = st.ctl.target_exists(&target) {
        return refused(e);
    }
    // Paths under policy; a new file is created here and removed again
    // if the LUN does not go into service.
    let created = match st.paths.admit_lun(&mut c) {
        Ok(g) => g,
        Err(m) => return err(StatusCode::FORBIDDEN, m),
    };
    let lu = match st.ctl.build_lun(&target, n, &c) {
        Ok(lu) => lu,
        Err(e) => return refused(e),
    };
    let persisted = match persist(&st, |d| persist::add_lun(d, &target, n, &c)) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    match st.ctl.install_lun(&target, n, lu) {
        Ok(v) => {
            created.keep();
            (
                StatusCode::CREATED,
                Json(json!({ "lun": v, "persisted": persisted })),
            )
                .into_response()
        }
        Err(e) => refused(e),
    }
}

async fn remove_lun(State(st): St, Path((target, lun)): Path<(String, u16)>) -> Response {
    let _g = st.change.lock().await;
    if let Err(e) = st.ctl.lun(&target, lun) {
        return refused(e);
    }
    let persisted = match persist(&st, |d| persist::remove_lun(d, &target, lun)) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    match st.ctl.remove_lun(&target, lun) {
        Ok(()) => Json(json!({ "removed": lun, "persisted": persisted })).into_response(),
        Err(e) => refused(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResizeReq {
    size: String,
    /// Allow making a RAM or null LUN smaller (its data past the new end
    /// is lost).
    #[serde(default)]
    shrink: bool,
}

async fn resize_lun(
    State(st): St,
    Path((target, lun)): Path<(String, u16)>,
    Body(r): Body<ResizeReq>,
) -> Response {
    let _g = st.change.lock().await;
    let bytes = match parse_size(&r.size) {
        Ok(b) => b,
        Err(e) => return err(StatusCode::BAD_REQUEST, e),
    };
    if let Err(e) = st.ctl.lun(&target, lun) {
        return refused(e);
    }
    // Resize first (the backend may refuse), then write the file. If the
    // file cannot be written the new size stays in effect (it is not
    // undone: sessions were told already) and the answer is an error.
    let v = match st.ctl.resize_lun(&target, lun, bytes, r.shrink) {
        Ok(v) => v,
        Err(e) => return refused(e),
    };
    match persist(&st, |d| persist::resize_lun(d, &target, lun, &r.size)) {
        Ok(p) => Json(json!({ "lun": v, "persisted": p })).into_response(),
        Err(r) => *r,
    }
}

#[derive(Deserialize)]
struct PortalReq {
    addr: SocketAddr,
    #[serde(default)]
    alua_group: Option<u16>,
}

async fn add_portal(State(st): St, Body(r): Body<PortalReq>) -> Response {
    let _g = st.change.lock().await;
    if r.addr.port() == 0 {
        return err(StatusCode::BAD_REQUEST, "give the portal a port");
    }
    // Bind first (the address may be taken), then write the file; if the
    // file cannot be written the portal is removed again.
    let p = match st.ctl.add_portal(r.addr, r.alua_group).await {
        Ok(p) => p,
        Err(e) => return refused(e),
    };
    // Its position in the file's `listen` (the runtime list is in the same
    // order); at the next start its tag is that position.
    let position = st.ctl.portals().len() as u16;
    let persisted = match persist(&st, |d| {
        persist::add_portal(d, &p.addr, position, p.alua_group)
    }) {
        Ok(x) => x,
        Err(resp) => {
            if let Err(e) = st.ctl.remove_portal(p.tpgt) {
                tracing::error!(error = %e, addr = %p.addr, "cannot take back a portal the file does not have");
            }
            return *resp;
        }
    };
    (
        StatusCode::CREATED,
        Json(json!({ "portal": p, "persisted": persisted })),
    )
        .into_response()
}

async fn nvme_ports(State(st): St) -> impl IntoResponse {
    Json(st.ctl.nvme_ports())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NvmePortReq {
    addr: SocketAddr,
}

async fn add_nvme_port(State(st): St, Body(r): Body<NvmePortReq>) -> Response {
    let _g = st.change.lock().await;
    if r.addr.port() == 0 {
        return err(StatusCode::BAD_REQUEST, "give the port a port number");
    }
    let p = match st.ctl.add_nvme_port(r.addr).await {
        Ok(p) => p,
        Err(e) => return refused(e),
    };
    let persisted = match persist(&st, |d| persist::add_nvme_port(d, &p.addr)) {
        Ok(x) => x,
        Err(resp) => {
            if let Err(e) = st.ctl.remove_nvme_port(p.id) {
                tracing::error!(error = %e, addr = %p.addr, "cannot take back an NVMe/TCP port the file does not have");
            }
            return *resp;
        }
    };
    (
        StatusCode::CREATED,
        Json(json!({ "port": p, "persisted": persisted })),
    )
        .into_response()
}

async fn remove_nvme_port(State(st): St, Path(key): Path<String>) -> Response {
    let _g = st.change.lock().await;
    let (index, p) = match st.ctl.find_nvme_port(&key) {
        Ok(x) => x,
        Err(e) => return refused(e),
    };
    let addr: SocketAddr = match p.addr.parse() {
        Ok(a) => a,
        Err(_) => return err(StatusCode::INTERNAL_SERVER_ERROR, "bad port address"),
    };
    let persisted = match persist(&st, |d| persist::remove_nvme_port(d, index, addr)) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    match st.ctl.remove_nvme_port(p.id) {
        Ok(v) => Json(json!({ "removed": v, "persisted": persisted })).into_response(),
        Err(e) => refused(e),
    }
}

async fn remove_portal(State(st): St, Path(key): Path<String>) -> Response {
    let _g = st.change.lock().await;
    let (index, p) = match st.ctl.find_portal(&key) {
        Ok(x) => x,
        Err(e) => return refused(e),
    };
    if st.ctl.portals().len() == 1 {
        return refused(ControlError::Conflict(
            "the last portal cannot be removed: add another first".into(),
        ));
    }
    let addr: SocketAddr = match p.addr.parse() {
        Ok(a) => a,
        Err(_) => return err(StatusCode::INTERNAL_SERVER_ERROR, "bad portal address"),
    };
    let persisted = match persist(&st, |d| persist::remove_portal(d, index, addr)) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    match st.ctl.remove_portal(p.tpgt) {
        Ok(v) => Json(json!({ "removed": v, "persisted": persisted })).into_response(),
        Err(e) => refused(e),
    }
}

#[derive(Deserialize)]
struct AluaReq {
    state: String,
}

async fn set_alua(State(st): St, Path(group): Path<u16>, Body(r): Body<AluaReq>) -> Response {
    let _g = st.change.lock().await;
    let Some(state) = scsi::AccessState::parse(&r.state) else {
        return err(
            StatusCode::BAD_REQUEST,
            "state: active-optimized, active-non-optimized, standby or unavailable",
        );
    };
    let before: Vec<(u16, String)> = st
        .ctl
        .targets()
        .first()
        .map(|t| t.alua.iter().map(|a| (a.group, a.state.clone())).collect())
        .unwrap_or_default();
    if !before.iter().any(|(g, _)| *g == group) {
        return refused(ControlError::NotFound(format!(
            "no ALUA target port group {group}"
        )));
    }
    // Members by position in `listen` (the runtime list is in file order).
    let portals = st.ctl.portals();
    let after: Vec<persist::GroupState> = before
        .iter()
        .map(|(g, s)| {
            let s = if *g == group {
                state.name()
            } else {
                s.as_str()
            };
            let positions = portals
                .iter()
                .enumerate()
                .filter(|(_, p)| p.alua_group == *g)
                .map(|(i, _)| i as u16 + 1)
                .collect();
            (*g, config_state_name(s), positions)
        })
        .collect();
    let persisted = match persist(&st, |d| persist::set_alua(d, &after)) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    match st.ctl.set_alua(group, state) {
        Ok(()) => Json(json!({ "group": group, "state": state.name(), "persisted": persisted }))
            .into_response(),
        Err(e) => refused(e),
    }
}

/// The configuration file's spelling of an access state name.
fn config_state_name(s: &str) -> String {
    scsi::AccessState::parse(s)
        .map(|st| match st {
            scsi::AccessState::ActiveOptimized => "active-optimized",
            scsi::AccessState::ActiveNonOptimized => "active-non-optimized",
            scsi::AccessState::Standby => "standby",
            scsi::AccessState::Unavailable => "unavailable",
        })
        .unwrap_or("active-optimized")
        .to_string()
}

/// Cumulative counters as the API shows them.
#[derive(Serialize)]
struct Totals {
    read_ops: u64,
    write_ops: u64,
    other_ops: u64,
    read_bytes: u64,
    write_bytes: u64,
    check_conditions: u64,
    other_errors: u64,
    read_p99_us: f64,
    write_p99_us: f64,
}

fn totals(c: &LunCounters) -> Totals {
    let q = |h: &hdrhistogram::Histogram<u64>| {
        if h.is_empty() {
            0.0
        } else {
            h.value_at_quantile(0.99) as f64 / 1e3
        }
    };
    Totals {
        read_ops: c.read_ops,
        write_ops: c.write_ops,
        other_ops: c.other_ops,
        read_bytes: c.read_bytes,
        write_bytes: c.write_bytes,
        check_conditions: c.check_conditions,
        other_errors: c.other_errors,
        read_p99_us: q(&c.read_hist),
        write_p99_us: q(&c.write_hist),
    }
}

fn session_rows(st: &AdminState) -> Vec<serde_json::Value> {
    let snap = st.ctl.stats();
    let rates = st.rates.lock();
    snap.sessions
        .iter()
        .map(|s| {
            json!({
                "info": s.info,
                "in_flight": s.in_flight,
                "max_in_flight": s.max_in_flight,
                "rejects": s.rejects,
                "totals": totals(&s.total),
                "rate": rates.sessions.get(&s.info.id).cloned().unwrap_or_default(),
                "luns": s.luns.keys().collect::<Vec<_>>(),
            })
        })
        .collect()
}

async fn sessions(State(st): St) -> impl IntoResponse {
    Json(session_rows(&st))
}

async fn stats(State(st): St) -> impl IntoResponse {
    let snap = st.ctl.stats();
    let targets = st.ctl.targets();
    let luns: Vec<_> = {
        let rates = st.rates.lock();
        targets
            .iter()
            .flat_map(|t| t.luns.iter().map(move |l| (t, l)))
            .map(|(t, l)| {
                let c = snap.luns.get(&(t.name.clone(), l.lun));
                json!({
                    "target": t.name,
                    "lun": l.lun,
                    "naa": l.naa,
                    "size_bytes": l.size_bytes,
                    "totals": c.map(totals),
                    "rate": rates.latest(&rates::lun_key(&t.name, l.lun)).cloned().unwrap_or_default(),
                })
            })
            .collect()
    };
    let portals: Vec<_> = st
        .ctl
        .portals()
        .into_iter()
        .map(|p| {
            json!({
                "addr": p.addr,
                "tpgt": p.tpgt,
                "events": snap.portal_events.get(&p.tpgt).cloned().unwrap_or_default(),
                "rejects": snap.portal_rejects.get(&p.tpgt).copied().unwrap_or(0),
                "totals": snap.portals.get(&p.tpgt).map(totals),
            })
        })
        .collect();
    Json(json!({
        "uptime_s": snap.uptime.as_secs(),
        "luns": luns,
        "sessions": session_rows(&st),
        "portals": portals,
    }))
}

#[derive(Deserialize)]
struct HistoryQuery {
    /// Only points after this time (ms since the epoch).
    #[serde(default)]
    since: Option<u64>,
}

async fn history(State(st): St, Query(q): Query<HistoryQuery>, _h: HeaderMap) -> impl IntoResponse {
    let rates = st.rates.lock();
    let since = q.since.unwrap_or(0);
    let luns: serde_json::Map<String, serde_json::Value> = rates
        .luns
        .iter()
        .map(|(k, v)| {
            let pts: Vec<&Rate> = v.iter().filter(|r| r.t > since).collect();
            (k.clone(), json!(pts))
        })
        .collect();
    Json(json!({ "luns": luns }))
}
