//! Who may log in: CHAP credentials, initiator allow-lists (by name and by
//! source network), the limits on connections and sessions, and the log of
//! failed logins (docs/ARCHITECTURE.md "Security").
//!
//! The configuration types live here ([`AuthConfig`], [`CredConfig`]);
//! [`AccessControl`] is what the server keeps at run time. Secrets are
//! read (inline or from a file) when the configuration is validated and
//! never appear in `Debug` output or logs.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iscsi_proto::chap::{self, ChapPolicy, Credential};
use parking_lot::{Mutex, RwLock};
use serde::Deserialize;

use crate::config::ConfigError;

/// A secret as written in the configuration. `Debug` never shows it.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct SecretString(pub String);

impl std::fmt::Debug for SecretString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A CHAP name and secret: the secret inline, or in a file (its first line;
/// keep the file readable by the target's user only).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CredConfig {
    /// CHAP name (CHAP_N).
    pub user: String,
    /// The secret, 12..=255 bytes.
    #[serde(default)]
    pub secret: Option<SecretString>,
    /// A file whose first line is the secret.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
}

impl CredConfig {
    /// Parses the quick-flag form `USER:SECRET`.
    pub fn from_spec(spec: &str) -> Result<CredConfig, String> {
        let (u, s) = spec
            .split_once(':')
            .filter(|(u, s)| !u.is_empty() && !s.is_empty())
            .ok_or("expected USER:SECRET")?;
        Ok(CredConfig {
            user: u.to_string(),
            secret: Some(SecretString(s.to_string())),
            secret_file: None,
        })
    }

    /// The credential, reading the secret file if one is named.
    pub fn resolve(&self, at: &str) -> Result<Credential, ConfigError> {
        let inv = |m: String| ConfigError::Invalid(format!("{at}: {m}"));
        if self.user.is_empty() || self.user.len() > 255 || self.user.contains('\0') {
            return Err(inv("user must be 1..=255 bytes without NUL".into()));
        }
        let secret = match (&self.secret, &self.secret_file) {
            (Some(s), None) => s.0.clone(),
            (None, Some(p)) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| inv(format!("cannot read secret_file {}: {e}", p.display())))?;
                text.lines().next().unwrap_or("").to_string()
            }
            _ => return Err(inv("give exactly one of secret and secret_file".into())),
        };
        if !(chap::MIN_SECRET_LEN..=chap::MAX_SECRET_LEN).contains(&secret.len()) {
            return Err(inv(format!(
                "the secret must be {}..={} bytes (RFC 7143 §12.1.3: at least 96 bits)",
                chap::MIN_SECRET_LEN,
                chap::MAX_SECRET_LEN
            )));
        }
        Ok(Credential::new(&self.user, secret.as_bytes()))
    }
}

/// DH-HMAC-CHAP secrets of a target's NVMe/TCP subsystem (NVMe in-band
/// authentication, the counterpart of `chap` / `mutual_chap`): each in
/// the `DHHC-1:xx:<base64>:` form `nvme gen-dhchap-key` prints, inline or
/// as the first line of a file (keep it readable by the target's user
/// only).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DhchapConfig {
    /// The hosts' secret: every host proves it knows it.
    #[serde(default)]
    pub secret: Option<SecretString>,
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// The controller's secret, for hosts that ask the controller to
    /// prove itself (bidirectional authentication).
    #[serde(default)]
    pub ctrl_secret: Option<SecretString>,
    #[serde(default)]
    pub ctrl_secret_file: Option<PathBuf>,
}

impl DhchapConfig {
    /// The secrets, files read and parsed.
    pub fn resolve(&self, at: &str) -> Result<nvme_auth::Keys, ConfigError> {
        let inv = |m: String| ConfigError::Invalid(format!("{at}: {m}"));
        let one = |inline: &Option<SecretString>, file: &Option<PathBuf>, what: &str| {
            let text = match (inline, file) {
                (Some(s), None) => s.0.clone(),
                (None, Some(p)) => std::fs::read_to_string(p)
                    .map_err(|e| inv(format!("cannot read {what}_file {}: {e}", p.display())))?
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string(),
                (None, None) => return Ok(None),
                _ => return Err(inv(format!("give at most one of {what} and {what}_file"))),
            };
            nvme_auth::Secret::parse(&text)
                .map(Some)
                .map_err(|e| inv(format!("{what}: {e}")))
        };
        let host = one(&self.secret, &self.secret_file, "secret")?
            .ok_or_else(|| inv("give secret or secret_file".into()))?;
        let ctrl = one(&self.ctrl_secret, &self.ctrl_secret_file, "ctrl_secret")?;
        if ctrl.is_some() && self.ctrl_secret == self.secret && self.ctrl_secret.is_some() {
            return Err(inv("secret and ctrl_secret must differ".into()));
        }
        Ok(nvme_auth::Keys { host, ctrl })
    }
}

/// Authentication and access of a target, or of discovery sessions.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Initiators must log in with CHAP as this user.
    pub chap: Option<CredConfig>,
    /// The target authenticates itself with this user when the initiator
    /// asks (mutual CHAP). Its secret must differ from `chap`'s.
    pub mutual_chap: Option<CredConfig>,
}

impl AuthConfig {
    /// The CHAP policy, secrets read and checked.
    pub fn policy(&self, at: &str) -> Result<ChapPolicy, ConfigError> {
        let initiator = self
            .chap
            .as_ref()
            .map(|c| c.resolve(&format!("{at} chap")))
            .transpose()?;
        let target = self
            .mutual_chap
            .as_ref()
            .map(|c| c.resolve(&format!("{at} mutual_chap")))
            .transpose()?;
        match (&initiator, &target) {
            (None, Some(_)) => {
                return Err(ConfigError::Invalid(format!(
                    "{at}: mutual_chap needs chap"
                )))
            }
            (Some(i), Some(t)) if chap::ct_eq(i.secret.expose(), t.secret.expose()) => {
                return Err(ConfigError::Invalid(format!(
                    "{at}: chap and mutual_chap secrets must differ (RFC 7143 §12.1.3)"
                )))
            }
            _ => {}
        }
        Ok(ChapPolicy { initiator, target })
    }
}

/// An IPv4 or IPv6 network in CIDR notation (`10.0.0.0/8`, `::1/128`; a
/// bare address is a /32 or /128).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `ADDR[/PREFIX]`.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a.parse().map_err(|_| format!("{s:?}: not an address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|&p| p <= max)
                .ok_or_else(|| format!("{s:?}: prefix must be 0..={max}"))?,
            None => max,
        };
        Ok(Cidr { addr, prefix })
    }

    /// True when `ip` is in the network (IPv4-mapped IPv6 addresses match
    /// IPv4 networks).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let bits = |a: IpAddr| -> u128 {
            match a {
                IpAddr::V4(v) => u128::from(u32::from(v)) << 96,
                IpAddr::V6(v) => u128::from(v),
            }
        };
        if self.addr.is_ipv4() != ip.is_ipv4() {
            return false;
        }
        let mask = if self.prefix == 0 {
            0
        } else {
            u128::MAX << (128 - u32::from(self.prefix))
        };
        bits(self.addr) & mask == bits(ip) & mask
    }
}

/// One target's access rules at run time. The admin API replaces them
/// whole ([`AccessControl::update`]); a login reads them once per step.
#[derive(Clone, Debug)]
pub(crate) struct TargetAccess {
    pub chap: ChapPolicy,
    /// Initiator names allowed; empty: any.
    pub allow: Vec<String>,
    /// Source networks allowed; empty: any.
    pub nets: Vec<Cidr>,
    /// `nets` as written (shown by the admin API, written to the file).
    pub net_specs: Vec<String>,
    /// At most this many sessions (0: no limit beyond the global one).
    pub max_sessions: usize,
}

impl TargetAccess {
    /// Target `t`'s rules, checked.
    pub fn from_config(t: &crate::config::TargetConfig) -> Result<TargetAccess, ConfigError> {
        let at = format!("target {:?}", t.name);
        let nets = t
            .allow_net
            .iter()
            .map(|n| Cidr::parse(n))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|m| ConfigError::Invalid(format!("{at} allow_net: {m}")))?;
        for a in &t.allow {
            crate::config::check_iscsi_name(a)
                .map_err(|m| ConfigError::Invalid(format!("{at} allow {a:?}: {m}")))?;
        }
        Ok(TargetAccess {
            chap: t.auth().policy(&at)?,
            allow: t.allow.clone(),
            nets,
            net_specs: t.allow_net.clone(),
            max_sessions: t.max_sessions,
        })
    }
}

impl TargetAccess {
    pub fn permits(&self, initiator: &str, peer: IpAddr) -> bool {
        (self.allow.is_empty() || self.allow.iter().any(|a| a == initiator))
            && (self.nets.is_empty() || self.nets.iter().any(|n| n.contains(peer)))
    }
}

/// Access rules, limits and the failed-login log, shared by every
/// connection. The per-target rules change at run time (the admin API):
/// logins read them under a lock that is never held across I/O; sessions
/// already logged in are not affected unless the admin asks to drop them.
#[derive(Debug)]
pub(crate) struct AccessControl {
    targets: RwLock<HashMap<String, TargetAccess>>,
    /// CHAP of discovery sessions (changes at run time too).
    discovery: RwLock<ChapPolicy>,
    /// Connections at once, logging in or logged in (0: no limit).
    pub max_connections: usize,
    /// Normal sessions at once over all targets (0: no limit).
    pub max_sessions: usize,
    connections: Arc<AtomicUsize>,
    pub failures: FailureLog,
    /// Connections at once from one address (0: no limit).
    max_per_source: usize,
    per_source: PerSource,
    /// Connections still logging in (bounded, evicting).
    pub admission: crate::admission::Admission,
    /// CHAP responses spaced across connections.
    pub throttle: crate::admission::Throttle,
    /// Their counters (/metrics).
    pub counters: Arc<crate::admission::AdmissionCounters>,
}

/// Connections at once per source address.
type PerSource = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// Holds one connection slot (overall and for its source address);
/// released when dropped.
#[derive(Debug)]
pub(crate) struct ConnSlot {
    all: Arc<AtomicUsize>,
    source: Option<(PerSource, IpAddr)>,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.all.fetch_sub(1, Ordering::AcqRel);
        if let Some((m, ip)) = &self.source {
            let mut m = m.lock();
            if let Some(n) = m.get_mut(ip) {
                *n -= 1;
                if *n == 0 {
                    m.remove(ip);
                }
            }
        }
    }
}

impl AccessControl {
    pub fn from_config(cfg: &crate::Config) -> Result<AccessControl, ConfigError> {
        let mut targets = HashMap::new();
        for t in &cfg.target {
            targets.insert(t.name.clone(), TargetAccess::from_config(t)?);
        }
        let counters = Arc::<crate::admission::AdmissionCounters>::default();
        Ok(AccessControl {
            admission: crate::admission::Admission::new(
                cfg.limits.max_pending,
                cfg.limits.max_pending_per_source,
                counters.clone(),
            ),
            throttle: crate::admission::Throttle::new(
                cfg.limits.chap_free_failures,
                Duration::from_millis(cfg.limits.chap_max_delay_ms),
            ),
            max_per_source: cfg.limits.max_connections_per_source,
            per_source: Arc::default(),
            counters,
            targets: RwLock::new(targets),
            discovery: RwLock::new(cfg.discovery.policy("discovery")?),
            max_connections: cfg.limits.max_connections,
            max_sessions: cfg.limits.max_sessions,
            connections: Arc::default(),
            failures: FailureLog::default(),
        })
    }

    /// Takes a connection slot for a connection from `ip`, or `None` at
    /// the overall or the per-address limit.
    pub fn connection_slot(&self, ip: IpAddr) -> Option<ConnSlot> {
        let n = self.connections.fetch_add(1, Ordering::AcqRel);
        let mut slot = ConnSlot {
            all: self.connections.clone(),
            source: None,
        };
        if self.max_connections != 0 && n >= self.max_connections {
            return None;
        }
        if self.max_per_source != 0 {
            let mut m = self.per_source.lock();
            let c = m.entry(ip).or_default();
            if *c >= self.max_per_source {
                return None;
            }
            *c += 1;
            slot.source = Some((self.per_source.clone(), ip));
        }
        Some(slot)
    }

    /// Whether one more normal session to `target` fits, given the live
    /// sessions' targets.
    pub fn session_fits<'a>(&self, target: &str, live: impl Iterator<Item = &'a str>) -> bool {
        let (mut all, mut this) = (0usize, 0usize);
        for t in live {
            all += 1;
            this += usize::from(t == target);
        }
        let per = self
            .targets
            .read()
            .get(target)
            .map_or(0, |t| t.max_sessions);
        (self.max_sessions == 0 || all < self.max_sessions) && (per == 0 || this < per)
    }

    /// Whether `initiator` is named on some target's ACL (its connections
    /// are kept longest while logging in).
    pub fn listed(&self, initiator: &str) -> bool {
        self.targets
            .read()
            .values()
            .any(|t| t.allow.iter().any(|a| a == initiator))
    }

    /// The targets `initiator` from `peer` may log in to.
    pub fn visible(&self, name: &str, initiator: &str, peer: IpAddr) -> bool {
        self.targets
            .read()
            .get(name)
            .is_some_and(|t| t.permits(initiator, peer))
    }

    /// A copy of target `name`'s rules.
    pub fn rules(&self, name: &str) -> Option<TargetAccess> {
        self.targets.read().get(name).cloned()
    }

    /// Changes target `name`'s rules with `f`; they apply to the next
    /// login. `None` when the target has no rules (does not exist).
    pub fn update<R>(&self, name: &str, f: impl FnOnce(&mut TargetAccess) -> R) -> Option<R> {
        self.targets.write().get_mut(name).map(f)
    }

    /// Adds the rules of a target added at run time.
    pub fn add_target(&self, name: &str, rules: TargetAccess) {
        self.targets.write().insert(name.to_string(), rules);
    }

    /// Forgets the rules of a removed target (nobody may log in to it).
    pub fn remove_target(&self, name: &str) {
        self.targets.write().remove(name);
    }

    /// The CHAP policy of discovery sessions.
    pub fn discovery_chap(&self) -> ChapPolicy {
        self.discovery.read().clone()
    }

    /// Changes the CHAP policy of discovery sessions with `f`.
    pub fn update_discovery<R>(&self, f: impl FnOnce(&mut ChapPolicy) -> R) -> R {
        f(&mut self.discovery.write())
    }

    /// The CHAP policy of target `name` (none for an unknown target).
    pub fn chap_of(&self, name: &str) -> ChapPolicy {
        self.targets
            .read()
            .get(name)
            .map(|a| a.chap.clone())
            .unwrap_or_default()
    }
}

/// Failed logins per source address over the last minute. Logging is
/// rate-limited per address (the first few failures in a window are
/// logged, then one summary per window), and the driver delays its answer
/// to an address that keeps failing, which slows guessing without costing
/// other connections anything.
#[derive(Debug, Default)]
pub(crate) struct FailureLog {
    by_addr: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

/// Failures logged per address per window before going quiet.
const LOGGED_PER_WINDOW: u32 = 5;
const WINDOW: Duration = Duration::from_secs(60);
/// Addresses remembered at most (old entries are dropped first).
const MAX_ADDRS: usize = 4096;

impl FailureLog {
    /// Records a failure from `ip` at `now`; returns whether to log it and
    /// how long to wait before answering.
    pub fn record(&self, ip: IpAddr, now: Instant) -> (bool, Duration) {
        let mut m = self.by_addr.lock();
        if m.len() >= MAX_ADDRS && !m.contains_key(&ip) {
            m.retain(|_, (t, _)| now.duration_since(*t) < WINDOW);
            if m.len() >= MAX_ADDRS {
                return (false, Duration::from_secs(1));
            }
        }
        let e = m.entry(ip).or_insert((now, 0));
        if now.duration_since(e.0) >= WINDOW {
            *e = (now, 0);
        }
        e.1 += 1;
        let n = e.1;
        let log = n <= LOGGED_PER_WINDOW || n.is_power_of_two();
        let delay = if n > 3 {
            Duration::from_millis(250 * u64::from((n - 3).min(8)))
        } else {
            Duration::ZERO
        };
        (log, delay)
    }
}

/// Looks targets up for the login state machine: existence, ACLs (by
/// initiator name and source address) and CHAP policies.
pub(crate) struct Directory<'a> {
    pub shared: &'a crate::server::Shared,
    pub tpgt: u16,
    pub peer: IpAddr,
}

impl iscsi_proto::TargetDirectory for Directory<'_> {
    fn find(&self, name: &str, _initiator: &str) -> Option<iscsi_proto::TargetInfo> {
        let t = self.shared.target(name)?;
        Some(iscsi_proto::TargetInfo {
            name: t.name.clone(),
            alias: t.alias.clone(),
            tpgt: self.tpgt,
        })
    }

    fn authorize(&self, name: &str, initiator: &str) -> bool {
        self.shared.access.visible(name, initiator, self.peer)
    }

    fn chap(&self, target: Option<&str>) -> ChapPolicy {
        match target {
            None => self.shared.access.discovery_chap(),
            Some(t) => self.shared.access.chap_of(t),
        }
    }
}

/// A CHAP identifier and challenge from the OS random source (`getrandom`).
pub(crate) fn random_challenge() -> std::io::Result<(u8, [u8; chap::CHALLENGE_LEN])> {
    let mut b = [0u8; chap::CHALLENGE_LEN + 1];
    getrandom::fill(&mut b).map_err(std::io::Error::other)?;
    let mut c = [0u8; chap::CHALLENGE_LEN];
    c.copy_from_slice(&b[1..]);
    Ok((b[0], c))
}

/// Logs a refused login (rate-limited per source address) and returns how
/// long to wait before answering it.
pub(crate) fn refused(
    shared: &crate::server::Shared,
    peer: std::net::SocketAddr,
    status: iscsi_proto::login::LoginStatus,
    reason: &str,
) -> Duration {
    let auth = status == iscsi_proto::login::LoginStatus::AUTH_FAILED
        || status == iscsi_proto::login::LoginStatus::FORBIDDEN;
    if !auth {
        tracing::warn!(%peer, reason, %status, "login refused");
        return Duration::ZERO;
    }
    let (log, delay) = shared.access.failures.record(peer.ip(), Instant::now());
    if log {
        tracing::warn!(%peer, reason, %status, "login refused");
    }
    delay
}

/// Whether a completed login must be refused for the session limits
/// (a reinstatement replaces a session, so it always fits): the status to
/// send, 0x0302 (out of resources).
pub(crate) fn session_refused(
    shared: &crate::server::Shared,
    outcome: &iscsi_proto::LoginOutcome,
    tpgt: u16,
) -> Option<iscsi_proto::login::LoginStatus> {
    if outcome.params.session_type != iscsi_proto::SessionType::Normal {
        return None;
    }
    let reg = shared.registry.lock();
    let target = &outcome.params.target_name;
    let reinstates = reg.keys().any(|k| {
        k.initiator == outcome.params.initiator_name
            && k.isid == outcome.isid
            && &k.target == target
            && k.tpgt == tpgt
    });
    let fits = reinstates
        || shared
            .access
            .session_fits(target, reg.keys().map(|k| k.target.as_str()));
    (!fits).then_some(iscsi_proto::login::LoginStatus::OUT_OF_RESOURCES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr() {
        let n = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(n.contains("10.1.2.3".parse().unwrap()));
        assert!(!n.contains("10.2.0.1".parse().unwrap()));
        assert!(n.contains("::ffff:10.1.9.9".parse().unwrap()));
        assert!(!n.contains("::1".parse().unwrap()));
        let one = Cidr::parse("127.0.0.1").unwrap();
        assert!(one.contains("127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        assert!(Cidr::parse("fd00::/8")
            .unwrap()
            .contains("fd12::1".parse().unwrap()));
        for bad in ["10.0.0.0/33", "x/8", "::/129", ""] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn credentials() {
        let c = CredConfig::from_spec("bob:0123456789ab").unwrap();
        assert_eq!(c.resolve("t").unwrap().user, "bob");
        assert!(!format!("{c:?}").contains("0123456789ab"));
        assert!(CredConfig::from_spec("bob:short")
            .unwrap()
            .resolve("t")
            .is_err());
        assert!(CredConfig::from_spec("bob").is_err());
        assert!(CredConfig::from_spec(":x").is_err());
        let same = AuthConfig {
            chap: Some(CredConfig::from_spec("a:0123456789ab").unwrap()),
            mutual_chap: Some(CredConfig::from_spec("b:0123456789ab").unwrap()),
        };
        assert!(same.policy("t").is_err(), "identical secrets refused");
        let mutual_only = AuthConfig {
            chap: None,
            mutual_chap: Some(CredConfig::from_spec("b:0123456789ab").unwrap()),
        };
        assert!(mutual_only.policy("t").is_err());
        let dir = std::env::temp_dir().join(format!("ironsan-secret-{}", std::process::id()));
        std::fs::write(&dir, "from-a-file-123\nignored\n").unwrap();
        let f = CredConfig {
            user: "u".into(),
            secret: None,
            secret_file: Some(dir.clone()),
        };
        assert_eq!(f.resolve("t").unwrap().secret.expose(), b"from-a-file-123");
        std::fs::remove_file(dir).unwrap();
    }

    #[test]
    fn connections_are_bounded_per_source() {
        let cfg = crate::Config::from_toml(
            "[limits]\nmax_connections = 4\nmax_connections_per_source = 2\n[[target]]\nname = \"iqn.2026-12.x:t\"\n[[target.lun]]\nbackend = \"null\"\nsize = \"1M\"\n",
        )
        .unwrap();
        let ac = AccessControl::from_config(&cfg).unwrap();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let a1 = ac.connection_slot(a).unwrap();
        let _a2 = ac.connection_slot(a).unwrap();
        assert!(ac.connection_slot(a).is_none(), "a third from one address");
        let _b1 = ac.connection_slot(b).unwrap();
        drop(a1);
        let _a3 = ac.connection_slot(a).expect("a slot freed");
        let _b2 = ac.connection_slot(b).unwrap();
        assert!(
            ac.connection_slot("192.0.2.3".parse().unwrap()).is_none(),
            "the overall limit"
        );
    }

    #[test]
    fn failure_log_is_rate_limited() {
        let f = FailureLog::default();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let t0 = Instant::now();
        let logged = (0..100).filter(|_| f.record(ip, t0).0).count();
        assert!(logged < 12, "{logged}");
        assert!(f.record(ip, t0).1 >= Duration::from_secs(1));
        // A new window starts over.
        assert_eq!(f.record(ip, t0 + WINDOW), (true, Duration::ZERO));
        // Another address is not affected.
        assert_eq!(
            f.record("192.0.2.2".parse().unwrap(), t0),
            (true, Duration::ZERO)
        );
    }
}
