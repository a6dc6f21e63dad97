//! Changing who may log in to a running target: initiator ACLs (names and
//! source networks) and CHAP credentials (what the admin API calls).
//!
//! A change applies to the next login (and the next discovery: SendTargets
//! lists only the targets an initiator may log in to). Sessions already
//! logged in keep running: access is checked at login, as on every iSCSI
//! target. [`Control::drop_sessions`] ends the sessions a change no longer
//! allows (the admin API's `drop_sessions`); their initiators then log in
//! again under the new rules, or are refused.

use iscsi_proto::chap::{self, ChapPolicy, Credential};
use serde::Serialize;

use crate::access::{Cidr, CredConfig, TargetAccess};
use crate::config::check_iscsi_name;
use crate::control::{Control, ControlError};

/// A target's access rules as the API shows them: never a secret.
#[derive(Clone, Debug, Serialize)]
pub struct AclView {
    pub target: String,
    /// Initiator names allowed; empty: any.
    pub initiators: Vec<String>,
    /// Source networks allowed; empty: any.
    pub networks: Vec<String>,
    /// `"set"` or `"unset"`: initiators must authenticate with CHAP.
    pub chap: &'static str,
    /// The CHAP user name initiators log in as (not a secret).
    pub chap_user: Option<String>,
    /// `"set"` or `"unset"`: the target answers mutual CHAP.
    pub mutual_chap: &'static str,
    /// The user name the target authenticates itself as.
    pub mutual_chap_user: Option<String>,
}

/// Which of a target's two CHAP credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChapRole {
    /// The initiator authenticates to the target (`chap`).
    Initiator,
    /// The target authenticates to the initiator (`mutual_chap`).
    Target,
}

/// Whose CHAP credentials: a target's, or those of discovery sessions
/// (`[discovery]` in the configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChapScope<'a> {
    Target(&'a str),
    Discovery,
}

impl std::fmt::Display for ChapScope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChapScope::Target(n) => write!(f, "target {n}"),
            ChapScope::Discovery => f.write_str("discovery"),
        }
    }
}

impl ChapRole {
    /// The configuration key: `chap` or `mutual_chap`.
    pub fn key(self) -> &'static str {
        match self {
            ChapRole::Initiator => "chap",
            ChapRole::Target => "mutual_chap",
        }
    }
}

/// One initiator ACL entry: an initiator name or a source network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AclEntry {
    /// An iSCSI initiator name (`iqn.`, `eui.`, `naa.`).
    Initiator(String),
    /// A source network in CIDR notation (a bare address is one host).
    Network(String),
}

impl AclEntry {
    /// Reads an entry as the API's DELETE path names it: a name when it
    /// starts with `iqn.`, `eui.` or `naa.`, otherwise a network.
    pub fn parse(s: &str) -> Result<AclEntry, ControlError> {
        let e = if s.starts_with("iqn.") || s.starts_with("eui.") || s.starts_with("naa.") {
            AclEntry::Initiator(s.to_string())
        } else {
            AclEntry::Network(s.to_string())
        };
        e.check()?;
        Ok(e)
    }

    /// Checks the name (RFC 7143 §4.2.7) or the network.
    pub fn check(&self) -> Result<(), ControlError> {
        match self {
            AclEntry::Initiator(n) => check_iscsi_name(n)
                .map_err(|m| ControlError::Invalid(format!("initiator name {n:?}: {m}"))),
            AclEntry::Network(n) => Cidr::parse(n).map(|_| ()).map_err(|m| {
                ControlError::Invalid(format!(
                    "network: {m} (ADDR[/PREFIX]; an initiator name starts with iqn., eui. or naa.)"
                ))
            }),
        }
    }
}

fn set(c: bool) -> &'static str {
    if c {
        "set"
    } else {
        "unset"
    }
}

fn acl_view(name: &str, a: &TargetAccess) -> AclView {
    AclView {
        target: name.to_string(),
        initiators: a.allow.clone(),
        networks: a.net_specs.clone(),
        chap: set(a.chap.initiator.is_some()),
        chap_user: a.chap.initiator.as_ref().map(|c| c.user.clone()),
        mutual_chap: set(a.chap.target.is_some()),
        mutual_chap_user: a.chap.target.as_ref().map(|c| c.user.clone()),
    }
}

/// Discovery sessions as the API shows them: no ACL (SendTargets lists
/// only what each initiator may log in to), CHAP state.
fn discovery_view(p: &ChapPolicy) -> AclView {
    AclView {
        target: "discovery".into(),
        initiators: Vec::new(),
        networks: Vec::new(),
        chap: set(p.initiator.is_some()),
        chap_user: p.initiator.as_ref().map(|c| c.user.clone()),
        mutual_chap: set(p.target.is_some()),
        mutual_chap_user: p.target.as_ref().map(|c| c.user.clone()),
    }
}

impl Control {
    fn rules(&self, name: &str) -> Result<TargetAccess, ControlError> {
        self.shared
            .access
            .rules(name)
            .ok_or_else(|| ControlError::NotFound(format!("no target {name}")))
    }

    /// Target `name`'s ACL and CHAP state (no secrets).
    pub fn acl(&self, name: &str) -> Result<AclView, ControlError> {
        Ok(acl_view(name, &self.rules(name)?))
    }

    /// The entries of target `name` after adding `e` (checked; a duplicate
    /// is a conflict), without applying them: (initiators, networks).
    pub fn acl_with(
        &self,
        name: &str,
        e: &AclEntry,
    ) -> Result<(Vec<String>, Vec<String>), ControlError> {
        e.check()?;
        let a = self.rules(name)?;
        let (mut names, mut nets) = (a.allow, a.net_specs);
        let (list, v) = match e {
            AclEntry::Initiator(n) => (&mut names, n),
            AclEntry::Network(n) => (&mut nets, n),
        };
        if list.contains(v) {
            return Err(ControlError::Conflict(format!(
                "{v} is in the ACL of {name} already"
            )));
        }
        list.push(v.clone());
        Ok((names, nets))
    }

    /// The entries of target `name` after removing `e`, without applying
    /// them. Removing the last entry of a list lets any initiator (or any
    /// address) in, so it needs `allow_any`.
    pub fn acl_without(
        &self,
        name: &str,
        e: &AclEntry,
        allow_any: bool,
    ) -> Result<(Vec<String>, Vec<String>), ControlError> {
        let a = self.rules(name)?;
        let (mut names, mut nets) = (a.allow, a.net_specs);
        let (list, v, what) = match e {
            AclEntry::Initiator(n) => (&mut names, n, "initiator"),
            AclEntry::Network(n) => (&mut nets, n, "network"),
        };
        let before = list.len();
        list.retain(|x| x != v);
        if list.len() == before {
            return Err(ControlError::NotFound(format!(
                "{v} is not in the ACL of {name}"
            )));
        }
        if list.is_empty() && !allow_any {
            return Err(ControlError::Conflict(format!(
                "{v} is the last {what} entry of {name}: without it any {what} may log in; \
                 say allow_any=true (--allow-any) to mean that"
            )));
        }
        Ok((names, nets))
    }

    /// Replaces target `name`'s initiator names and networks (checked).
    pub fn set_acl(
        &self,
        name: &str,
        initiators: Vec<String>,
        networks: Vec<String>,
    ) -> Result<AclView, ControlError> {
        for n in &initiators {
            AclEntry::Initiator(n.clone()).check()?;
        }
        let nets = networks
            .iter()
            .map(|n| Cidr::parse(n).map_err(|m| ControlError::Invalid(format!("network: {m}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let view = self
            .shared
            .access
            .update(name, |a| {
                a.allow = initiators;
                a.nets = nets;
                a.net_specs = networks;
                acl_view(name, a)
            })
            .ok_or_else(|| ControlError::NotFound(format!("no target {name}")))?;
        tracing::info!(
            target = name,
            initiators = ?view.initiators,
            networks = ?view.networks,
            "ACL changed"
        );
        Ok(view)
    }

    /// The CHAP policy of `scope` (a target, or discovery sessions).
    fn chap_policy(&self, scope: ChapScope<'_>) -> Result<ChapPolicy, ControlError> {
        match scope {
            ChapScope::Discovery => Ok(self.shared.access.discovery_chap()),
            ChapScope::Target(name) => Ok(self.rules(name)?.chap),
        }
    }

    /// The CHAP state of `scope` as the API shows it.
    pub fn chap_view(&self, scope: ChapScope<'_>) -> Result<AclView, ControlError> {
        match scope {
            ChapScope::Target(name) => self.acl(name),
            ChapScope::Discovery => Ok(discovery_view(&self.shared.access.discovery_chap())),
        }
    }

    /// Checks `cred` for `role` of `scope` against the other credential
    /// (RFC 7143 §12.1.3: 12..=255-byte secrets, different in each
    /// direction; mutual CHAP needs CHAP) and returns it resolved.
    pub fn check_chap(
        &self,
        scope: ChapScope<'_>,
        role: ChapRole,
        cred: &CredConfig,
    ) -> Result<Credential, ControlError> {
        let policy = self.chap_policy(scope)?;
        let at = format!("{scope} {}", role.key());
        let c = cred.resolve(&at).map_err(|e| match e {
            crate::config::ConfigError::Invalid(m) => ControlError::Invalid(m),
            e => ControlError::Invalid(e.to_string()),
        })?;
        let other = match role {
            ChapRole::Initiator => policy.target.as_ref(),
            ChapRole::Target => {
                if policy.initiator.is_none() {
                    return Err(ControlError::Conflict(format!(
                        "{scope} has no CHAP credentials: set chap before mutual_chap"
                    )));
                }
                policy.initiator.as_ref()
            }
        };
        if other.is_some_and(|o| chap::ct_eq(o.secret.expose(), c.secret.expose())) {
            return Err(ControlError::Invalid(format!(
                "{at}: the secrets of chap and mutual_chap must differ (RFC 7143 §12.1.3)"
            )));
        }
        Ok(c)
    }

    /// Sets (or with `None` clears) the CHAP credential for `role` of
    /// `scope`. Clearing `chap` clears `mutual_chap` too (it means nothing
    /// alone).
    pub fn set_chap(
        &self,
        scope: ChapScope<'_>,
        role: ChapRole,
        cred: Option<Credential>,
    ) -> Result<AclView, ControlError> {
        let apply = |p: &mut ChapPolicy| match role {
            ChapRole::Initiator => {
                if cred.is_none() {
                    p.target = None;
                }
                p.initiator = cred;
            }
            ChapRole::Target => p.target = cred,
        };
        let view = match scope {
            ChapScope::Target(name) => self
                .shared
                .access
                .update(name, |a| {
                    apply(&mut a.chap);
                    acl_view(name, a)
                })
                .ok_or_else(|| ControlError::NotFound(format!("no target {name}")))?,
            ChapScope::Discovery => self.shared.access.update_discovery(|p| {
                apply(p);
                discovery_view(p)
            }),
        };
        tracing::info!(
            scope = %scope,
            chap = view.chap,
            mutual_chap = view.mutual_chap,
            "CHAP changed"
        );
        Ok(view)
    }

    /// Ends target `name`'s sessions that its access rules no longer let
    /// in, or with `all` every one of them (after a CHAP change: they did
    /// not authenticate with the new credentials). Their connections close
    /// at once; the initiators may log in again under the new rules.
    /// Returns how many were ended.
    pub fn drop_sessions(&self, name: &str, all: bool) -> Result<usize, ControlError> {
        let a = self.rules(name)?;
        let reg = self.shared.registry.lock();
        let mut n = 0;
        for (k, e) in reg.iter() {
            if k.target == name && (all || !a.permits(&k.initiator, e.peer)) {
                tracing::info!(target = name, initiator = %k.initiator, peer = %e.peer, "session dropped: access changed");
                e.kill.notify_one();
                n += 1;
            }
        }
        Ok(n)
    }
}
