//! The ACL and CHAP endpoints: `/api/targets/{iqn}/acl`, `…/chap` and
//! `…/mutual_chap`, and `/api/discovery/{chap,mutual_chap}`. Every change is checked, written to the configuration
//! file (when there is one) and then applied to the next login; with
//! `?drop_sessions=true` the sessions it no longer allows are ended.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use crate::{persist, Body, Params, St};
use server::config::CredConfig;
use server::control::ControlError;
use server::control_acl::{AclEntry, AclView, ChapRole, ChapScope};

/// Query flags of the changing requests (others, such as the console's
/// `token`, are ignored).
#[derive(Debug, Default, Deserialize)]
pub(super) struct ChangeFlags {
    /// End the sessions the change no longer allows.
    #[serde(default)]
    drop_sessions: bool,
    /// Allow removing the last entry of a list (then anyone may log in).
    #[serde(default)]
    allow_any: bool,
}

/// `POST /api/targets/{iqn}/acl`: exactly one of the two.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AddReq {
    #[serde(default)]
    initiator: Option<String>,
    #[serde(default)]
    network: Option<String>,
}

pub(super) async fn get_acl(State(st): St, Path(target): Path<String>) -> Response {
    match st.ctl.acl(&target) {
        Ok(v) => Json(v).into_response(),
        Err(e) => crate::refused(e),
    }
}

fn answer(st: &crate::AdminState, v: AclView, persisted: bool, drop: Option<bool>) -> Response {
    let dropped = match drop {
        Some(all) => match st.ctl.drop_sessions(&v.target, all) {
            Ok(n) => n,
            Err(e) => return crate::refused(e),
        },
        None => 0,
    };
    Json(json!({ "acl": v, "persisted": persisted, "dropped_sessions": dropped })).into_response()
}

async fn change_acl(
    st: &crate::AdminState,
    target: &str,
    lists: Result<(Vec<String>, Vec<String>), ControlError>,
    flags: &ChangeFlags,
) -> Response {
    let (names, nets) = match lists {
        Ok(l) => l,
        Err(e) => return crate::refused(e),
    };
    let persisted = match crate::persist(st, |d| persist::set_acl(d, target, &names, &nets)) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    match st.ctl.set_acl(target, names, nets) {
        Ok(v) => answer(st, v, persisted, flags.drop_sessions.then_some(false)),
        Err(e) => crate::refused(e),
    }
}

pub(super) async fn add_acl(
    State(st): St,
    Path(target): Path<String>,
    Params(flags): Params<ChangeFlags>,
    Body(r): Body<AddReq>,
) -> Response {
    let _g = st.change.lock().await;
    let e = match (r.initiator, r.network) {
        (Some(i), None) => AclEntry::Initiator(i),
        (None, Some(n)) => AclEntry::Network(n),
        _ => {
            return crate::err(
                StatusCode::BAD_REQUEST,
                "give exactly one of \"initiator\" (an iSCSI name) and \"network\" (CIDR)",
            )
        }
    };
    let lists = st.ctl.acl_with(&target, &e);
    let mut resp = change_acl(&st, &target, lists, &flags).await;
    if resp.status() == StatusCode::OK {
        *resp.status_mut() = StatusCode::CREATED;
    }
    resp
}

pub(super) async fn remove_acl(
    State(st): St,
    Path((target, entry)): Path<(String, String)>,
    Params(flags): Params<ChangeFlags>,
) -> Response {
    let _g = st.change.lock().await;
    let lists =
        AclEntry::parse(&entry).and_then(|e| st.ctl.acl_without(&target, &e, flags.allow_any));
    change_acl(&st, &target, lists, &flags).await
}

async fn put(
    st: &crate::AdminState,
    scope: ChapScope<'_>,
    role: ChapRole,
    mut c: CredConfig,
    flags: &ChangeFlags,
) -> Response {
    let _g = st.change.lock().await;
    // A secret file named through the API: only under secret_roots, and
    // every failure to use it answered alike (nothing about whether it
    // exists or how long it is).
    if let Some(f) = c.secret_file.clone() {
        match st.paths.secret_path(&f) {
            Ok(p) => c.secret_file = Some(p),
            Err(m) => return crate::err(StatusCode::BAD_REQUEST, m),
        }
        if c.secret.is_none() && c.resolve("secret_file").is_err() {
            return crate::err(StatusCode::BAD_REQUEST, st.paths.secret_refusal());
        }
    }
    let cred = match st.ctl.check_chap(scope, role, &c) {
        Ok(c) => c,
        Err(e) => return crate::refused(e),
    };
    let persisted = match crate::persist(st, |d| persist::set_chap(d, scope, role.key(), Some(&c)))
    {
        Ok(p) => p,
        Err(r) => return *r,
    };
    match st.ctl.set_chap(scope, role, Some(cred)) {
        Ok(v) => answer(st, v, persisted, drop_all(scope, flags)),
        Err(e) => crate::refused(e),
    }
}

async fn delete(
    st: &crate::AdminState,
    scope: ChapScope<'_>,
    role: ChapRole,
    flags: &ChangeFlags,
) -> Response {
    let _g = st.change.lock().await;
    if let Err(e) = st.ctl.chap_view(scope) {
        return crate::refused(e);
    }
    let persisted = match crate::persist(st, |d| persist::set_chap(d, scope, role.key(), None)) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    match st.ctl.set_chap(scope, role, None) {
        Ok(v) => answer(st, v, persisted, drop_all(scope, flags)),
        Err(e) => crate::refused(e),
    }
}

/// After a CHAP change with `drop_sessions`: every session of the target
/// (discovery sessions are short and not kept in the session registry).
fn drop_all(scope: ChapScope<'_>, flags: &ChangeFlags) -> Option<bool> {
    (flags.drop_sessions && matches!(scope, ChapScope::Target(_))).then_some(true)
}

pub(super) async fn put_chap(
    State(st): St,
    Path(target): Path<String>,
    Params(flags): Params<ChangeFlags>,
    Body(c): Body<CredConfig>,
) -> Response {
    put(
        &st,
        ChapScope::Target(&target),
        ChapRole::Initiator,
        c,
        &flags,
    )
    .await
}

pub(super) async fn put_mutual_chap(
    State(st): St,
    Path(target): Path<String>,
    Params(flags): Params<ChangeFlags>,
    Body(c): Body<CredConfig>,
) -> Response {
    put(&st, ChapScope::Target(&target), ChapRole::Target, c, &flags).await
}

pub(super) async fn delete_chap(
    State(st): St,
    Path(target): Path<String>,
    Params(flags): Params<ChangeFlags>,
) -> Response {
    delete(&st, ChapScope::Target(&target), ChapRole::Initiator, &flags).await
}

pub(super) async fn delete_mutual_chap(
    State(st): St,
    Path(target): Path<String>,
    Params(flags): Params<ChangeFlags>,
) -> Response {
    delete(&st, ChapScope::Target(&target), ChapRole::Target, &flags).await
}

/// `chap` or `mutual_chap` in a discovery path.
fn role_of(s: &str) -> Option<ChapRole> {
    match s {
        "chap" => Some(ChapRole::Initiator),
        "mutual_chap" => Some(ChapRole::Target),
        _ => None,
    }
}

fn no_such_role() -> Response {
    crate::err(
        StatusCode::NOT_FOUND,
        "/api/discovery/chap or /api/discovery/mutual_chap",
    )
}

pub(super) async fn get_discovery(State(st): St) -> Response {
    match st.ctl.chap_view(ChapScope::Discovery) {
        Ok(v) => Json(v).into_response(),
        Err(e) => crate::refused(e),
    }
}

pub(super) async fn put_discovery(
    State(st): St,
    Path(role): Path<String>,
    Params(flags): Params<ChangeFlags>,
    Body(c): Body<CredConfig>,
) -> Response {
    match role_of(&role) {
        Some(r) => put(&st, ChapScope::Discovery, r, c, &flags).await,
        None => no_such_role(),
    }
}

pub(super) async fn delete_discovery(
    State(st): St,
    Path(role): Path<String>,
    Params(flags): Params<ChangeFlags>,
) -> Response {
    match role_of(&role) {
        Some(r) => delete(&st, ChapScope::Discovery, r, &flags).await,
        None => no_such_role(),
    }
}
