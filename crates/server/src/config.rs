//! Target configuration: the TOML file of `ironsan serve --config`, and the
//! same structure built from the quick flags. Everything is validated by
//! [`Config::validate`] before any socket is opened or file touched.
//!
//! ```toml
//! listen = ["127.0.0.1:3260", "127.0.0.1:3261"]   # each address is a portal
//!
//! [limits]
//! queue_depth = 128            # command window per session (1..=8192)
//! max_recv_data_segment = 262144
//! max_burst = 1048576
//! first_burst = 262144
//! header_digest = "allowed"    # off | allowed | required
//! data_digest = "allowed"
//!
//! [alua]                       # optional: default is one group per portal
//! explicit = false             # allow SET TARGET PORT GROUPS (TPGS 11b)
//! [[alua.group]]
//! id = 1
//! portals = [1]                # positions in `listen`, from 1
//! state = "active-optimized"   # | active-non-optimized | standby | unavailable
//! [[alua.group]]
//! id = 2
//! portals = [2]
//! state = "active-non-optimized"
//!
//! [[target]]
//! name = "iqn.2026-11.io.ironsan:disk0"
//! alias = "disk0"
//! allow = ["iqn.2026-11.io.example:host1"]   # initiator names; empty: any
//! allow_net = ["10.0.0.0/8"]                  # source networks; empty: any
//! chap = { user = "host1", secret_file = "/etc/ironsan/host1.secret" }
//! mutual_chap = { user = "disk0", secret = "another-secret" }
//! # NVMe/TCP hosts authenticate with DH-HMAC-CHAP (`nvme gen-dhchap-key`)
//! dhchap = { secret_file = "/etc/ironsan/disk0.dhchap", ctrl_secret_file = "/etc/ironsan/disk0.ctrl" }
//!
//! [[target.lun]]
//! backend = "file"             # mem | null | file
//! path = "/var/lib/ironsan/disk0.img"
//! size = "10G"                 # creates the file when missing
//! block_size = 512             # 512 or 4096
//! physical_block_size = 4096   # optional: block_size × 2^n (4096 with 512: "512e")
//! write_cache = "through"      # through (default) | back
//! thin = true                  # default; false: fully provisioned
//!
//! [[target.lun]]                # a Ceph RBD image (the image must exist)
//! backend = "rbd"
//! pool = "rbd"
//! image = "disk1"
//! ceph_conf = "/etc/ceph/ceph.conf"   # default: librados' search ($CEPH_CONF, /etc/ceph)
//! ceph_client = "client.ironsan"      # default: client.admin ("ironsan" = client.ironsan)
//! ceph_keyring = "/etc/ceph/ceph.client.ironsan.keyring"  # default: from ceph.conf
//! ceph_op_timeout = 25                # seconds a cluster request may take (0: forever)
//! ceph_start_wait = 5                 # seconds serve waits for the image before it listens
//! ceph_retry = 30                     # longest pause between attempts to open it (0: fail at start)
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;

use iscsi_proto::params::{DigestPolicy, Limits, MAX_QUEUE_DEPTH};
use serde::Deserialize;
use thiserror::Error;

pub use crate::access::{AuthConfig, Cidr, CredConfig, DhchapConfig, SecretString};
use crate::size::parse_size;

/// The default target name when none is given.
pub const DEFAULT_TARGET: &str = "iqn.2026-11.io.ironsan:target0";
/// The default portal.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:3260";

/// Why a configuration was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A value is out of range or inconsistent.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The whole target configuration.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Portals to listen on; the n-th (from 1) is target portal group n.
    #[serde(default = "default_listen")]
    pub listen: Vec<SocketAddr>,
    /// NVMe/TCP ports to listen on (none by default): every target is
    /// also an NVMe subsystem there ([`TargetConfig::nqn`]), its LUNs the
    /// namespaces (NSID = LUN + 1).
    #[serde(default)]
    pub nvme_listen: Vec<SocketAddr>,
    /// Negotiation limits and the command window.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Timeouts and keep-alive.
    #[serde(default)]
    pub timeouts: TimeoutsConfig,
    /// ALUA target port groups of the portals.
    #[serde(default)]
    pub alua: AluaConfig,
    /// Event loop threads serving connections (default: one per CPU).
    #[serde(default)]
    pub workers: Option<usize>,
    /// The targets served.
    #[serde(default)]
    pub target: Vec<TargetConfig>,
    /// Directory for state that must survive a restart: persistent
    /// reservations made with APTPL = 1, one file per LU
    /// (`<target name>.lun<N>.pr`). Unset (the default): APTPL is refused
    /// and reservations do not survive a restart.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// The admin endpoint (JSON API, /metrics, web console).
    #[serde(default)]
    pub admin: AdminConfig,
    /// Authentication of discovery sessions (CHAP, optionally mutual).
    #[serde(default)]
    pub discovery: AuthConfig,
    /// One of several gateways serving the same RBD images as the same
    /// LUs (docs/GATEWAYS.md); none: a standalone target.
    #[serde(default)]
    pub gateway: Option<GatewayConfig>,
}

/// This process as one gateway of several in front of shared RBD images.
/// Every gateway is configured with the same targets and LUNs (so they
/// report the same identities); each has its own portal tags and ALUA
/// group. The gateway holding the images' exclusive locks is
/// active/optimized, the others standby; SET TARGET PORT GROUPS asking for
/// a standby gateway's group to be active moves the locks there.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// This gateway's ALUA target port group id (all of its portals).
    pub group: u16,
    /// Portal group tag, and relative target port id, of the first portal
    /// in `listen`; the next portals count up from it. The gateways of one
    /// LU must use distinct tags (e.g. 1 on the first gateway, 17 on the
    /// second).
    #[serde(default = "one")]
    pub first_portal_tag: u16,
    /// The other gateways.
    #[serde(default)]
    pub peer: Vec<GatewayPeerConfig>,
    /// How often ownership is re-read from the cluster, in milliseconds
    /// (a lock lost to a takeover, another gateway taking over).
    #[serde(default = "default_gateway_check_ms")]
    pub check_interval_ms: u64,
    /// Take the images over when a command reaches this standby gateway
    /// and the owner is no longer connected to the cluster
    /// (initiators that fail over without SET TARGET PORT GROUPS).
    #[serde(default = "yes")]
    pub implicit_failover: bool,
    /// How long the owner has to answer a liveness probe before a standby
    /// that initiators have turned to fences it and takes over, in
    /// milliseconds (implicit failover).
    #[serde(default = "default_owner_timeout_ms")]
    pub owner_timeout_ms: u64,
}

fn yes() -> bool {
    true
}

/// Another gateway of the same LUs.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GatewayPeerConfig {
    /// Its ALUA target port group id.
    pub group: u16,
    /// Its relative target port ids (the portal tags of its portals).
    pub ports: Vec<u16>,
}

fn one() -> u16 {
    1
}

fn default_gateway_check_ms() -> u64 {
    1000
}

fn default_owner_timeout_ms() -> u64 {
    3000
}

/// The admin endpoint: `ironsan serve --admin` and `--admin-token-file`
/// override these. Every request is authenticated (docs/ADMIN.md "Trust
/// model"): over the Unix socket by the peer's user id, over HTTP by the
/// token (or a console session cookie obtained with it).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Address to serve the admin API on over HTTP; none: no admin
    /// endpoint (neither HTTP nor the socket).
    pub listen: Option<SocketAddr>,
    /// The bearer token HTTP requests must carry
    /// (`Authorization: Bearer TOKEN`); at least 16 bytes. Prefer
    /// `token_file`: this file is then a secret too.
    pub token: Option<SecretString>,
    /// A file whose first line is the token. Neither: the token in
    /// `<dir>/admin.token`, generated (32 random bytes, mode 0600) at the
    /// first start.
    pub token_file: Option<PathBuf>,
    /// Where the admin socket (`admin.sock`, mode 0600) and the generated
    /// token live. Default: `state_dir` when set, else `/var/lib/ironsan`
    /// for root and `$XDG_STATE_HOME/ironsan` (`~/.local/state/ironsan`)
    /// for other users.
    pub dir: Option<PathBuf>,
    /// Host names (besides the bound address and `localhost`) that HTTP
    /// requests may name in `Host` and `Origin`, e.g. the name of a
    /// reverse proxy or of this host.
    pub allowed_hosts: Vec<String>,
    /// Serve `GET /metrics` without a token (read-only counters, never a
    /// secret), for a Prometheus that cannot send one.
    pub metrics_open: bool,
    /// Directories under which a file or block-device LUN added through
    /// the API may lie (symlinks resolved first). Default: `<dir>/luns`
    /// and the directories of the file LUNs of the configuration.
    pub lun_roots: Option<Vec<PathBuf>>,
    /// Directories under which a `secret_file` given through the API (and
    /// a `ceph_conf`/`ceph_keyring` of an RBD LUN added through it) may
    /// lie. Default: `<dir>`, `/etc/ceph` and the directories of the files
    /// the configuration names.
    pub secret_roots: Option<Vec<PathBuf>>,
    /// Let a file LUN added through the API open (and grow) an existing
    /// regular file under `lun_roots`. Default: the API only creates new
    /// files.
    pub api_existing_files: bool,
}

fn default_listen() -> Vec<SocketAddr> {
    vec![DEFAULT_LISTEN.parse().expect("valid default")]
}

/// Default of [`LimitsConfig::busy_poll_us`] (docs/PERFORMANCE.md, "What makes it fast",
/// busy polling: enough to catch the next request of a client that
/// answers at once, on 2 cores over loopback).
pub const DEFAULT_BUSY_POLL_US: u32 = 50;
/// Largest [`LimitsConfig::busy_poll_us`].
pub const MAX_BUSY_POLL_US: u32 = 10_000;

/// Negotiation limits (RFC 7143 §13).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// MaxCmdSN − ExpCmdSN + 1 of an idle session (1..=8192).
    pub queue_depth: u32,
    /// MaxRecvDataSegmentLength we declare (512..=16777215).
    pub max_recv_data_segment: u32,
    /// MaxBurstLength we offer (512..=16777215).
    pub max_burst: u32,
    /// FirstBurstLength we offer (512..=max_burst).
    pub first_burst: u32,
    /// MaxOutstandingR2T we offer (1..=65535).
    pub max_outstanding_r2t: u16,
    /// Offer InitialR2T=Yes (no unsolicited data).
    pub initial_r2t: bool,
    /// Offer ImmediateData=Yes.
    pub immediate_data: bool,
    /// Header digest: off, allowed or required.
    pub header_digest: DigestConfig,
    /// Data digest: off, allowed or required.
    pub data_digest: DigestConfig,
    /// Socket send and receive buffer size in bytes (0: the OS default).
    pub socket_buffer: u32,
    /// TCP congestion control of every connection ("system": the kernel's
    /// default; see `netio` for why it is not left to the kernel).
    pub tcp_congestion: String,
    /// Microseconds a connection keeps polling its socket, without
    /// sleeping, after it ran out of work (0: sleep at once). Waking a
    /// sleeping thread costs tens of microseconds on virtual machines;
    /// polling through the gap between one batch of commands and the next
    /// saves the wake-up on both sides. At most 10000.
    pub busy_poll_us: u32,
    /// Connections at once, logging in or logged in (0: no limit). More
    /// are closed at once.
    pub max_connections: usize,
    /// Normal sessions at once over all targets (0: no limit). More are
    /// refused at login with 0x0302 (out of resources).
    pub max_sessions: usize,
    /// Connections still logging in, over all sources. At the bound a new
    /// connection evicts an older one still logging in (one that sent
    /// nothing first, one whose initiator is on an ACL last).
    pub max_pending: usize,
    /// Connections still logging in from one source address; at the bound
    /// a new one evicts that address's least promising one.
    pub max_pending_per_source: usize,
    /// Connections at once from one source address, logging in or logged
    /// in (0: no limit). More are closed at once.
    pub max_connections_per_source: usize,
    /// Failed CHAP responses per source address or initiator name answered
    /// without delay (within 5 minutes).
    pub chap_free_failures: u32,
    /// The largest spacing between two CHAP responses checked for one
    /// source address or initiator name after failures, in milliseconds.
    pub chap_max_delay_ms: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let l = Limits::default();
        LimitsConfig {
            queue_depth: l.queue_depth,
            max_recv_data_segment: l.max_recv_data_segment,
            max_burst: l.max_burst,
            first_burst: l.first_burst,
            max_outstanding_r2t: l.max_outstanding_r2t,
            initial_r2t: l.initial_r2t,
            immediate_data: l.immediate_data,
            header_digest: DigestConfig::Allowed,
            data_digest: DigestConfig::Allowed,
            socket_buffer: 1 << 20,
            tcp_congestion: netio::DEFAULT_CONGESTION.into(),
            busy_poll_us: DEFAULT_BUSY_POLL_US,
            max_connections: 4096,
            max_sessions: 1024,
            max_pending: 512,
            max_pending_per_source: 32,
            max_connections_per_source: 1024,
            chap_free_failures: 3,
            chap_max_delay_ms: 1000,
        }
    }
}

/// Digest policy as written in the config.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DigestConfig {
    Off,
    Allowed,
    Required,
}

impl From<DigestConfig> for DigestPolicy {
    fn from(d: DigestConfig) -> Self {
        match d {
            DigestConfig::Off => DigestPolicy::Off,
            DigestConfig::Allowed => DigestPolicy::Allowed,
            DigestConfig::Required => DigestPolicy::Required,
        }
    }
}

/// Timeouts, in seconds.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TimeoutsConfig {
    /// A login must complete within this time.
    pub login: u64,
    /// A login must be past its security stage (authenticated, RFC 7143
    /// §6.3) within this time of the connection.
    pub security: u64,
    /// Send a NOP-In ping after this much silence from the initiator.
    pub nop_interval: u64,
    /// Drop the connection when a ping stays unanswered this long.
    pub nop_timeout: u64,
}

impl Default for TimeoutsConfig {
    fn default() -> Self {
        TimeoutsConfig {
            login: 15,
            security: 5,
            nop_interval: 10,
            nop_timeout: 30,
        }
    }
}

/// Asymmetric logical unit access (SPC-4 §5.15): how the portals (target
/// ports, relative port id = position in `listen` from 1) are grouped and
/// in which state each group is. Every target has its own copy of these
/// states (SET TARGET PORT GROUPS through one target changes only it).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AluaConfig {
    /// Explicit ALUA: initiators may change states with SET TARGET PORT
    /// GROUPS (INQUIRY TPGS = 11b); otherwise implicit only (01b) and the
    /// states below never change.
    pub explicit: bool,
    /// The groups. Empty: each portal is its own group, with id = its
    /// portal group tag (its position), active/optimized. Otherwise every
    /// portal must be in exactly one group.
    pub group: Vec<AluaGroupConfig>,
}

/// One target port group.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AluaGroupConfig {
    /// TARGET PORT GROUP identifier, 1..=65535.
    pub id: u16,
    /// Member portals: positions in `listen`, from 1.
    pub portals: Vec<u16>,
    /// Asymmetric access state at start.
    #[serde(default)]
    pub state: AluaStateConfig,
    /// Report the group as preferred (PREF bit).
    #[serde(default)]
    pub preferred: bool,
}

/// An asymmetric access state as written in the config.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum AluaStateConfig {
    /// Every command, full performance.
    #[default]
    ActiveOptimized,
    /// Every command, possibly slower (the initiator prefers other paths).
    ActiveNonOptimized,
    /// Management commands only; I/O gets NOT READY 04/0B.
    Standby,
    /// Identification commands only; the rest gets NOT READY 04/0C.
    Unavailable,
}

impl From<AluaStateConfig> for scsi::AccessState {
    fn from(s: AluaStateConfig) -> Self {
        match s {
            AluaStateConfig::ActiveOptimized => scsi::AccessState::ActiveOptimized,
            AluaStateConfig::ActiveNonOptimized => scsi::AccessState::ActiveNonOptimized,
            AluaStateConfig::Standby => scsi::AccessState::Standby,
            AluaStateConfig::Unavailable => scsi::AccessState::Unavailable,
        }
    }
}

impl Config {
    /// The target port groups for `listen`: as configured, or one
    /// active/optimized group per portal with id = its position.
    pub fn port_groups(&self) -> Vec<scsi::GroupSpec> {
        if let Some(g) = &self.gateway {
            // Every group starts standby: the gateway decides from the
            // images' locks before the first login is accepted.
            let own = scsi::GroupSpec {
                id: g.group,
                ports: (1..=self.listen.len())
                    .map(|i| self.portal_tag(i as u16))
                    .collect(),
                state: scsi::AccessState::Standby,
                preferred: false,
            };
            let mut groups: Vec<scsi::GroupSpec> = std::iter::once(own)
                .chain(g.peer.iter().map(|p| scsi::GroupSpec {
                    id: p.group,
                    ports: p.ports.clone(),
                    state: scsi::AccessState::Standby,
                    preferred: false,
                }))
                .collect();
            // In id order: every gateway reports the groups alike.
            groups.sort_by_key(|g| g.id);
            return groups;
        }
        if self.alua.group.is_empty() {
            return (1..=self.listen.len())
                .map(|i| {
                    let port = u16::try_from(i).unwrap_or(u16::MAX);
                    scsi::GroupSpec {
                        id: port,
                        ports: vec![port],
                        state: scsi::AccessState::ActiveOptimized,
                        preferred: false,
                    }
                })
                .collect();
        }
        self.alua
            .group
            .iter()
            .map(|g| scsi::GroupSpec {
                id: g.id,
                ports: g.portals.clone(),
                state: g.state.into(),
                preferred: g.preferred,
            })
            .collect()
    }

    /// Whether SET TARGET PORT GROUPS is supported: configured, or a
    /// gateway (failover is asked for with it).
    pub fn alua_explicit(&self) -> bool {
        self.alua.explicit || self.gateway.is_some()
    }

    /// The portal group tag (and relative target port id) of portal
    /// `position` (from 1): the position, or counted from a gateway's
    /// `first_portal_tag`.
    pub fn portal_tag(&self, position: u16) -> u16 {
        let first = self.gateway.as_ref().map_or(1, |g| g.first_portal_tag);
        first.saturating_add(position - 1)
    }

    /// The ALUA target port group of portal `position` (from 1).
    pub fn group_of_portal(&self, position: u16) -> u16 {
        if let Some(g) = &self.gateway {
            return g.group;
        }
        self.alua
            .group
            .iter()
            .find(|g| g.portals.contains(&position))
            .map_or(position, |g| g.id)
    }

    fn validate_alua(&self) -> Result<(), ConfigError> {
        let inv = |m: String| Err(ConfigError::Invalid(m));
        if self.listen.len() > usize::from(u16::MAX) {
            return inv("listen: too many portals".into());
        }
        let n = self.listen.len() as u16;
        for g in &self.alua.group {
            if let Some(p) = g.portals.iter().find(|&&p| p == 0 || p > n) {
                return inv(format!(
                    "alua.group {}: portal {p} does not exist (portals are 1..={n}, positions in listen)",
                    g.id
                ));
            }
        }
        if !self.alua.group.is_empty() {
            if let Some(p) =
                (1..=n).find(|p| !self.alua.group.iter().any(|g| g.portals.contains(p)))
            {
                return inv(format!("alua: portal {p} is in no group"));
            }
        }
        self.validate_gateway()?;
        scsi::PortGroups::new(self.port_groups(), self.alua_explicit())
            .map_err(|e| ConfigError::Invalid(format!("alua: {e}")))?;
        Ok(())
    }

    /// NVMe/TCP ports and subsystem names: distinct ([`check_nqn`]).
    fn validate_nvme(&self) -> Result<(), ConfigError> {
        let inv = |m: String| Err(ConfigError::Invalid(m));
        for (i, a) in self.nvme_listen.iter().enumerate() {
            if a.port() != 0 && (self.nvme_listen[..i].contains(a) || self.listen.contains(a)) {
                return inv(format!("nvme_listen: {a} is given twice"));
            }
        }
        let mut seen = Vec::new();
        for t in &self.target {
            let n = t.subsystem_nqn();
            if seen.contains(&n) {
                return inv(format!(
                    "target {}: NQN {n} is another target's too",
                    t.name
                ));
            }
            seen.push(n);
        }
        Ok(())
    }

    fn validate_gateway(&self) -> Result<(), ConfigError> {
        let Some(g) = &self.gateway else {
            return Ok(());
        };
        let inv = |m: String| Err(ConfigError::Invalid(m));
        if !self.alua.group.is_empty() {
            return inv(
                "gateway: the ALUA groups of a gateway follow the image locks; remove [[alua.group]]"
                    .into(),
            );
        }
        if g.first_portal_tag == 0
            || usize::from(g.first_portal_tag) + self.listen.len() - 1 > usize::from(u16::MAX)
        {
            return inv(format!(
                "gateway.first_portal_tag = {}: the portal tags must be 1..=65535",
                g.first_portal_tag
            ));
        }
        if !(100..=60_000).contains(&g.check_interval_ms) {
            return inv("gateway.check_interval_ms: must be 100..=60000".into());
        }
        if !(500..=60_000).contains(&g.owner_timeout_ms) {
            return inv("gateway.owner_timeout_ms: must be 500..=60000".into());
        }
        if g.peer.is_empty() {
            return inv("gateway: name the other gateways ([[gateway.peer]] group, ports)".into());
        }
        // Group ids and ports are checked for overlaps by the port group
        // table built from them (PortGroups::new).
        for t in &self.target {
            if t.lun.is_empty() {
                return inv(format!("gateway: target {} has no LUN", t.name));
            }
            if let Some(l) = t.lun.iter().find(|l| l.backend != BackendKind::Rbd) {
                return inv(format!(
                    "gateway: target {} has a {:?} LUN; every LUN of a gateway must be an rbd \
                     image the other gateways serve too",
                    t.name, l.backend
                ));
            }
        }
        Ok(())
    }
}

/// One target.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// The iSCSI name (iqn., eui. or naa. form).
    pub name: String,
    /// TargetAlias sent at login.
    #[serde(default)]
    pub alias: Option<String>,
    /// LUNs, numbered from 0 in order.
    #[serde(default)]
    pub lun: Vec<LunConfig>,
    /// Initiator names that may log in (and see the target in discovery);
    /// empty: any.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Source networks (CIDR) logins may come from; empty: any.
    #[serde(default)]
    pub allow_net: Vec<String>,
    /// Initiators must authenticate with CHAP as this user.
    #[serde(default)]
    pub chap: Option<CredConfig>,
    /// The target's own CHAP credentials for mutual CHAP.
    #[serde(default)]
    pub mutual_chap: Option<CredConfig>,
    /// Sessions to this target at once (0: only the global limit).
    #[serde(default)]
    pub max_sessions: usize,
    /// Its NVMe subsystem NQN; default: the iSCSI name with `iqn.` made
    /// `nqn.` (`nqn.2026-12.io.ironsan:` and the name otherwise).
    #[serde(default)]
    pub nqn: Option<String>,
    /// Host NQNs that may connect over NVMe/TCP; empty: any (still within
    /// `allow_net`).
    #[serde(default)]
    pub nvme_allow: Vec<String>,
    /// NVMe/TCP hosts authenticate with DH-HMAC-CHAP. A target with
    /// `chap` is served over NVMe/TCP only with this.
    #[serde(default)]
    pub dhchap: Option<DhchapConfig>,
}

impl TargetConfig {
    /// A target with these LUNs and no access rules.
    pub fn new(name: &str, lun: Vec<LunConfig>) -> TargetConfig {
        TargetConfig {
            name: name.to_string(),
            alias: None,
            lun,
            allow: Vec::new(),
            allow_net: Vec::new(),
            chap: None,
            mutual_chap: None,
            max_sessions: 0,
            nqn: None,
            nvme_allow: Vec::new(),
            dhchap: None,
        }
    }

    /// Checks this target on its own: its name, NQN, LUNs and access
    /// rules (what [`Config::validate`] checks of each target, and what a
    /// target added at run time must pass).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let inv = |m: String| Err(ConfigError::Invalid(m));
        let t = self;
        check_iscsi_name(&t.name)
            .map_err(|m| ConfigError::Invalid(format!("target {:?}: {m}", t.name)))?;
        check_nqn(&t.subsystem_nqn())
            .map_err(|m| ConfigError::Invalid(format!("target {}: {m}", t.name)))?;
        if let Some(d) = &t.dhchap {
            d.resolve(&format!("target {} dhchap", t.name))?;
        }
        if t.lun.is_empty() {
            return inv(format!("target {:?} has no LUN", t.name));
        }
        if t.lun.len() > 256 {
            return inv(format!("target {:?}: at most 256 LUNs", t.name));
        }
        let mut seen = std::collections::HashSet::new();
        for (li, lun) in t.lun.iter().enumerate() {
            let n = lun.number.unwrap_or(li as u16);
            let at = format!("target {:?} LUN {n}", t.name);
            if n > 255 {
                return inv(format!("{at}: LUN numbers are 0..=255"));
            }
            if !seen.insert(n) {
                return inv(format!("{at}: LUN number used twice"));
            }
            if lun.block_size != 512 && lun.block_size != 4096 {
                return inv(format!(
                    "{at}: block_size {} (must be 512 or 4096)",
                    lun.block_size
                ));
            }
            check_physical_block_size(&at, lun)?;
            if let Some(u) = &lun.uuid {
                parse_uuid(u)
                    .map_err(|m| ConfigError::Invalid(format!("{at}: uuid {u:?}: {m}")))?;
            }
            let size = lun
                .size_bytes()
                .map_err(|m| ConfigError::Invalid(format!("{at}: {m}")))?;
            match lun.backend {
                BackendKind::Mem | BackendKind::Null => {
                    if lun.path.is_some() {
                        return inv(format!("{at}: a {:?} LUN takes no path", lun.backend));
                    }
                    let Some(size) = size else {
                        return inv(format!("{at}: size is required"));
                    };
                    check_lun_size(&at, size, lun.block_size)?;
                    if lun.backend == BackendKind::Mem && size > storage::MemBackend::MAX_SIZE {
                        return inv(format!(
                            "{at}: a RAM LUN holds at most {} bytes (16T)",
                            storage::MemBackend::MAX_SIZE
                        ));
                    }
                }
                BackendKind::File => {
                    if lun.path.is_none() {
                        return inv(format!("{at}: path is required for a file LUN"));
                    }
                    if let Some(size) = size {
                        check_lun_size(&at, size, lun.block_size)?;
                    }
                }
                BackendKind::Rbd => {
                    if lun.path.is_some() {
                        return inv(format!("{at}: an rbd LUN takes pool and image, not path"));
                    }
                    for (what, v) in [("pool", &lun.pool), ("image", &lun.image)] {
                        let Some(v) = v else {
                            return inv(format!("{at}: {what} is required for an rbd LUN"));
                        };
                        check_rbd_name(what, v)
                            .map_err(|m| ConfigError::Invalid(format!("{at}: {m}")))?;
                    }
                    for (what, v) in [
                        ("ceph_client", &lun.ceph_client),
                        ("namespace", &lun.namespace),
                        ("snapshot", &lun.snapshot),
                    ] {
                        if let Some(v) = v {
                            check_rbd_name(what, v)
                                .map_err(|m| ConfigError::Invalid(format!("{at}: {m}")))?;
                        }
                    }
                    if lun.snapshot.is_some() && !lun.read_only {
                        return inv(format!(
                            "{at}: a snapshot is served read-only (read_only = true)"
                        ));
                    }
                    if let Some(size) = size {
                        check_lun_size(&at, size, lun.block_size)?;
                    }
                }
            }
            if lun.backend != BackendKind::Rbd
                && (lun.pool.is_some()
                    || lun.image.is_some()
                    || lun.namespace.is_some()
                    || lun.snapshot.is_some()
                    || lun.ceph_conf.is_some()
                    || lun.ceph_client.is_some()
                    || lun.ceph_keyring.is_some()
                    || lun.ceph_op_timeout.is_some()
                    || lun.ceph_start_wait.is_some()
                    || lun.ceph_retry.is_some())
            {
                return inv(format!(
                    "{at}: pool, image and ceph_* belong to rbd LUNs only"
                ));
            }
        }
        crate::access::TargetAccess::from_config(t)?;
        Ok(())
    }

    /// The NVMe subsystem NQN ([`TargetConfig::nqn`]).
    pub fn subsystem_nqn(&self) -> String {
        if let Some(n) = &self.nqn {
            return n.clone();
        }
        match self.name.strip_prefix("iqn.") {
            Some(rest) => format!("nqn.{rest}"),
            None => format!("nqn.2026-12.io.ironsan:{}", self.name),
        }
    }

    /// The target's authentication settings.
    pub fn auth(&self) -> AuthConfig {
        AuthConfig {
            chap: self.chap.clone(),
            mutual_chap: self.mutual_chap.clone(),
        }
    }
}

/// Where a LUN's data lives.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// RAM, lost at exit: for benchmarks and tests.
    Mem,
    /// Reads zeros, discards writes: for measuring the protocol path.
    Null,
    /// A regular file or a block device.
    File,
    /// A Ceph RBD image (needs librbd at run time).
    Rbd,
}

impl BackendKind {
    /// As written in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Mem => "mem",
            BackendKind::Null => "null",
            BackendKind::File => "file",
            BackendKind::Rbd => "rbd",
        }
    }
}

/// Write cache policy as written in the config.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum CacheConfig {
    /// Acknowledged writes are stable (WCE=0).
    #[default]
    Through,
    /// Writes may be cached until SYNCHRONIZE CACHE or FUA (WCE=1).
    Back,
}

/// One LUN.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LunConfig {
    /// mem, null, file or rbd.
    pub backend: BackendKind,
    /// Capacity (`64M`, `1G`): required for mem and null; for file, the
    /// size to create or extend it to; for rbd, the size to grow the image
    /// to when it is smaller (an image is never shrunk at start).
    #[serde(default)]
    pub size: Option<String>,
    /// File or block device path (file backend).
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Logical block size: 512 or 4096.
    #[serde(default = "default_block_size")]
    pub block_size: u32,
    /// Physical block size: `block_size` times a power of two, at most
    /// 2^15 times it (4096 with 512-byte blocks is a "512e" disk). Told in
    /// READ CAPACITY(16) and VPD B0h; UNMAP deallocates whole physical
    /// blocks only. Absent: one logical block per physical block.
    #[serde(default)]
    pub physical_block_size: Option<u32>,
    /// Write cache policy (file backend).
    #[serde(default)]
    pub write_cache: CacheConfig,
    /// Refuse writes (DATA PROTECT) and report write protect.
    #[serde(default)]
    pub read_only: bool,
    /// Thin provisioning: UNMAP and WRITE SAME with UNMAP free space, and
    /// the LUN says so (LBPME). On by default; it takes effect only where
    /// the backend can free space (mem, and file on a regular file; not a
    /// block device or null). `thin = false` presents the LUN fully
    /// provisioned.
    #[serde(default = "default_thin")]
    pub thin: bool,
    /// Unit serial number (VPD 0x80); derived from the target and LUN when
    /// absent, so it stays the same across restarts.
    #[serde(default)]
    pub serial: Option<String>,
    /// A UUID for the namespace this LUN is over NVMe/TCP
    /// (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`): listed among its
    /// identification descriptors beside the NGUID (Linux then names the
    /// disk `uuid.…`). None by default: the NGUID (the LUN's NAA) alone
    /// names it, the same designator as over iSCSI.
    #[serde(default)]
    pub uuid: Option<String>,
    /// The LUN number (0..=255); by default its position in the list. The
    /// admin API writes it for every LUN of a target it changes, so that
    /// removing one LUN does not renumber the others.
    #[serde(default)]
    pub number: Option<u16>,
    /// The Ceph pool of the image (rbd backend).
    #[serde(default)]
    pub pool: Option<String>,
    /// The RBD image in `pool` (rbd backend); it must exist.
    #[serde(default)]
    pub image: Option<String>,
    /// The RADOS namespace of the image within `pool` (rbd backend;
    /// `rbd namespace create POOL/NAMESPACE`); default: none.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Serve this snapshot of the image, read-only (rbd backend).
    #[serde(default)]
    pub snapshot: Option<String>,
    /// ceph.conf of the cluster (rbd backend); default: librados' search
    /// (`$CEPH_CONF`, `/etc/ceph/ceph.conf`, `~/.ceph/config`).
    #[serde(default)]
    pub ceph_conf: Option<PathBuf>,
    /// The Ceph client to connect as (rbd backend): a full entity name
    /// (`client.ironsan`) or an id (`ironsan`); default `client.admin`.
    #[serde(default)]
    pub ceph_client: Option<String>,
    /// The keyring holding the client's key (rbd backend); default: what
    /// ceph.conf says.
    #[serde(default)]
    pub ceph_keyring: Option<PathBuf>,
    /// Seconds a cluster request may take before it fails (rbd backend;
    /// librados' `rados_osd_op_timeout` and `rados_mon_op_timeout`), so a
    /// gateway cut off from the cluster answers NOT READY and initiators
    /// move to another path before their own command timeout (30 s on
    /// Linux and ESXi); 0: wait forever. Default 25.
    #[serde(default)]
    pub ceph_op_timeout: Option<u64>,
    /// Seconds `serve` waits at start for the image to open before it
    /// listens without it (rbd backend): the LU is then reported becoming
    /// ready (NOT READY 04/01) and opened in the background. Default 5.
    #[serde(default)]
    pub ceph_start_wait: Option<u64>,
    /// The longest pause, in seconds, between two attempts to open the
    /// image while the cluster does not answer (rbd backend; pauses start
    /// at 1 s and double); 0: no retry, `serve` fails at start as for any
    /// other error. Default 30.
    #[serde(default)]
    pub ceph_retry: Option<u64>,
    /// Test builds only (feature `test-delay`): a file holding a number of
    /// milliseconds every read and write of this LUN waits first, re-read
    /// every 100 ms, so a test can make the LU slow and fast again (hosts'
    /// command timeouts and task management). Release builds refuse the key.
    #[cfg(feature = "test-delay")]
    #[serde(default)]
    pub test_delay_file: Option<PathBuf>,
}

fn default_block_size() -> u32 {
    512
}

fn default_thin() -> bool {
    true
}

/// The `,KEY=VALUE` options of a `--lun` spec.
const SPEC_OPTIONS: [&str; 8] = [
    "physical_block_size",
    "uuid",
    "ceph_client",
    "ceph_conf",
    "ceph_keyring",
    "ceph_op_timeout",
    "ceph_start_wait",
    "ceph_retry",
];

impl LunConfig {
    /// Parses the quick-flag form: `mem:SIZE`, `null:SIZE`, `file:PATH`,
    /// `file:PATH:SIZE` or `rbd:POOL/IMAGE` (the cluster from `$CEPH_CONF`
    /// or `/etc/ceph/ceph.conf`, as `client.admin`), each optionally
    /// followed by `,KEY=VALUE` options; the one option is
    /// `physical_block_size=BYTES`. Values are checked by
    /// [`Config::validate`].
    pub fn from_spec(spec: &str) -> Result<LunConfig, ConfigError> {
        let bad = || {
            ConfigError::Invalid(format!(
                "--lun {spec:?}: expected mem:SIZE, null:SIZE, file:PATH, file:PATH:SIZE or \
                 rbd:POOL/IMAGE, optionally followed by ,physical_block_size=BYTES"
            ))
        };
        // Options are taken from the end, so that a path may hold commas.
        let mut main = spec;
        let mut opts: Vec<(&str, &str)> = Vec::new();
        while let Some((head, opt)) = main.rsplit_once(',') {
            let Some((key, value)) = opt.split_once('=') else {
                break;
            };
            if !SPEC_OPTIONS.contains(&key) {
                return Err(ConfigError::Invalid(format!(
                    "--lun {spec:?}: unknown option {key:?} (the options are {})",
                    SPEC_OPTIONS.join(", ")
                )));
            }
            if opts.iter().any(|(k, _)| *k == key) {
                return Err(ConfigError::Invalid(format!(
                    "--lun {spec:?}: {key} is given twice"
                )));
            }
            opts.push((key, value));
            main = head;
        }
        let opt = |k: &str| opts.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
        let physical_block_size = opt("physical_block_size")
            .map(|v| {
                v.parse::<u32>().map_err(|_| {
                    ConfigError::Invalid(format!(
                        "--lun {spec:?}: physical_block_size {v:?} is not a number of bytes"
                    ))
                })
            })
            .transpose()?;
        let (kind, rest) = main.split_once(':').ok_or_else(bad)?;
        let mut l = LunConfig {
            backend: BackendKind::Mem,
            size: None,
            path: None,
            block_size: 512,
            physical_block_size,
            write_cache: CacheConfig::Through,
            read_only: false,
            thin: true,
            serial: None,
            uuid: opt("uuid").map(str::to_string),
            number: None,
            pool: None,
            image: None,
            namespace: None,
            snapshot: None,
            ceph_conf: None,
            ceph_client: None,
            ceph_keyring: None,
            ceph_op_timeout: None,
            ceph_start_wait: None,
            ceph_retry: None,
            #[cfg(feature = "test-delay")]
            test_delay_file: None,
        };
        match kind {
            "mem" | "null" => {
                l.backend = if kind == "mem" {
                    BackendKind::Mem
                } else {
                    BackendKind::Null
                };
                l.size = Some(rest.to_string());
            }
            "file" => {
                l.backend = BackendKind::File;
                match rest.rsplit_once(':') {
                    Some((p, s)) if parse_size(s).is_ok() => {
                        l.path = Some(PathBuf::from(p));
                        l.size = Some(s.to_string());
                    }
                    _ => l.path = Some(PathBuf::from(rest)),
                }
            }
            "rbd" => {
                l.backend = BackendKind::Rbd;
                let form =
                    "expected rbd:POOL/IMAGE, rbd:POOL/NAMESPACE/IMAGE, optionally @SNAPSHOT";
                let invalid =
                    |m: String| ConfigError::Invalid(format!("--lun {spec:?}: {m} ({form})"));
                let (path, snapshot) = match rest.split_once('@') {
                    Some((p, snap)) => (p, Some(snap)),
                    None => (rest, None),
                };
                let parts: Vec<&str> = path.split('/').collect();
                let (pool, namespace, image) = match parts[..] {
                    [pool, image] => (pool, None, image),
                    [pool, ns, image] => (pool, Some(ns), image),
                    _ => return Err(invalid("not POOL/IMAGE".into())),
                };
                check_rbd_name("pool", pool).map_err(invalid)?;
                check_rbd_name("image", image).map_err(invalid)?;
                if let Some(ns) = namespace {
                    check_rbd_name("namespace", ns).map_err(invalid)?;
                }
                if let Some(snap) = snapshot {
                    check_rbd_name("snapshot", snap).map_err(invalid)?;
                    l.read_only = true;
                }
                l.pool = Some(pool.to_string());
                l.image = Some(image.to_string());
                l.namespace = namespace.map(str::to_string);
                l.snapshot = snapshot.map(str::to_string);
                l.ceph_client = opt("ceph_client").map(str::to_string);
                l.ceph_conf = opt("ceph_conf").map(PathBuf::from);
                l.ceph_keyring = opt("ceph_keyring").map(PathBuf::from);
                let secs = |k: &str| {
                    opt(k)
                        .map(|v| {
                            v.parse::<u64>().map_err(|_| {
                                invalid(format!("{k} {v:?} is not a number of seconds"))
                            })
                        })
                        .transpose()
                };
                l.ceph_op_timeout = secs("ceph_op_timeout")?;
                l.ceph_start_wait = secs("ceph_start_wait")?;
                l.ceph_retry = secs("ceph_retry")?;
            }
            _ => return Err(bad()),
        }
        if l.backend == BackendKind::File
            && l.path.as_ref().is_none_or(|p| p.as_os_str().is_empty())
        {
            return Err(bad());
        }
        if let Some(u) = &l.uuid {
            parse_uuid(u)
                .map_err(|m| ConfigError::Invalid(format!("--lun {spec:?}: uuid {u:?}: {m}")))?;
        }
        if l.backend != BackendKind::Rbd {
            if let Some((k, _)) = opts.iter().find(|(k, _)| k.starts_with("ceph_")) {
                return Err(ConfigError::Invalid(format!(
                    "--lun {spec:?}: {k} belongs to rbd LUNs only"
                )));
            }
        }
        Ok(l)
    }

    /// The configured size in bytes, if any.
    pub fn size_bytes(&self) -> Result<Option<u64>, ConfigError> {
        self.size
            .as_deref()
            .map(parse_size)
            .transpose()
            .map_err(ConfigError::Invalid)
    }
}

impl Config {
    /// Reads and validates a TOML file.
    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        Self::from_toml(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.into(),
                message,
            },
            e => e,
        })
    }

    /// Parses and validates TOML text.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let c: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?;
        c.validate()?;
        Ok(c)
    }

    /// The negotiation limits in protocol terms.
    pub fn limits(&self) -> Limits {
        let l = &self.limits;
        Limits {
            max_recv_data_segment: l.max_recv_data_segment,
            max_burst: l.max_burst,
            first_burst: l.first_burst,
            max_outstanding_r2t: l.max_outstanding_r2t,
            initial_r2t: l.initial_r2t,
            immediate_data: l.immediate_data,
            header_digest: l.header_digest.into(),
            data_digest: l.data_digest.into(),
            queue_depth: l.queue_depth,
            ..Limits::default()
        }
    }

    /// Checks every value; the error names the offending field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let inv = |m: String| Err(ConfigError::Invalid(m));
        if self.listen.is_empty() {
            return inv("listen: at least one portal address is needed".into());
        }
        for (i, a) in self.listen.iter().enumerate() {
            if a.port() != 0 && self.listen[..i].contains(a) {
                return inv(format!("listen: {a} is given twice"));
            }
        }
        self.validate_alua()?;
        self.validate_nvme()?;
        let l = &self.limits;
        if !(1..=MAX_QUEUE_DEPTH).contains(&l.queue_depth) {
            return inv(format!(
                "limits.queue_depth = {}: must be 1..={MAX_QUEUE_DEPTH}",
                l.queue_depth
            ));
        }
        for (name, v) in [
            ("max_recv_data_segment", l.max_recv_data_segment),
            ("max_burst", l.max_burst),
            ("first_burst", l.first_burst),
        ] {
            if !(512..(1 << 24)).contains(&v) {
                return inv(format!("limits.{name} = {v}: must be 512..=16777215"));
            }
        }
        if l.first_burst > l.max_burst {
            return inv(format!(
                "limits.first_burst ({}) exceeds limits.max_burst ({})",
                l.first_burst, l.max_burst
            ));
        }
        if l.max_outstanding_r2t == 0 {
            return inv("limits.max_outstanding_r2t must be at least 1".into());
        }
        if l.socket_buffer > 64 << 20 {
            return inv("limits.socket_buffer: at most 64 MiB".into());
        }
        if l.busy_poll_us > MAX_BUSY_POLL_US {
            return inv(format!("limits.busy_poll_us: at most {MAX_BUSY_POLL_US}"));
        }
        netio::check_congestion_name(&l.tcp_congestion)
            .map_err(|m| ConfigError::Invalid(format!("limits.tcp_congestion: {m}")))?;
        if self.workers.is_some_and(|w| !(1..=256).contains(&w)) {
            return inv("workers: must be 1..=256".into());
        }
        if self.target.is_empty() {
            return inv("no target configured".into());
        }
        for (ti, t) in self.target.iter().enumerate() {
            if self.target[..ti].iter().any(|o| o.name == t.name) {
                return inv(format!("target {:?} is configured twice", t.name));
            }
            t.validate()?;
        }
        crate::access::AccessControl::from_config(self)?;
        Ok(())
    }
}

/// A subsystem NQN as this target accepts it (NVMe Base 2.0 §4.5, "NVMe
/// Qualified Names"): 1..=223 bytes of printable ASCII without spaces, not
/// the discovery NQN. Names in the `nqn.yyyy-mm.reverse-domain:…` form are
/// what the specification asks for; others are accepted as the Linux
/// kernel's target accepts them (hosts connect to whatever NQN they are
/// given), with a warning at start.
pub fn check_nqn(n: &str) -> Result<(), String> {
    if n.is_empty() || n.len() > 223 {
        return Err(format!("NQN {n:?} must be 1..=223 bytes"));
    }
    if !n.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("NQN {n:?}: printable ASCII without spaces only"));
    }
    if n == nvme::DISCOVERY_NQN {
        return Err("the discovery NQN names the discovery controller".into());
    }
    Ok(())
}

/// `physical_block_size` must be `block_size` times a power of two, at
/// most 2^[`scsi::MAX_LBPPB_EXPONENT`] (the LOGICAL BLOCKS PER PHYSICAL
/// BLOCK EXPONENT of READ CAPACITY(16) is 4 bits).
fn check_physical_block_size(at: &str, lun: &LunConfig) -> Result<(), ConfigError> {
    let bs = lun.block_size;
    let Some(pbs) = lun.physical_block_size else {
        return Ok(());
    };
    let max = u64::from(bs) << scsi::MAX_LBPPB_EXPONENT;
    if pbs < bs || !pbs.is_multiple_of(bs) || !(pbs / bs).is_power_of_two() || u64::from(pbs) > max
    {
        return Err(ConfigError::Invalid(format!(
            "{at}: physical_block_size {pbs} must be a power-of-two multiple of block_size {bs} \
             ({bs}, {}, {} … {max}; 4096 with 512-byte blocks is 512e)",
            2 * bs,
            4 * bs
        )));
    }
    Ok(())
}

/// A UUID in its usual text form (8-4-4-4-12 hexadecimal digits), as 16
/// bytes; the nil UUID is refused (it means "none" to NVMe hosts).
pub fn parse_uuid(s: &str) -> Result<[u8; 16], String> {
    let parts: Vec<&str> = s.split('-').collect();
    let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
    if lens != [8, 4, 4, 4, 12] {
        return Err("not a UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)".into());
    }
    let hex: String = parts.concat();
    if !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err("not a UUID: hexadecimal digits only".into());
    }
    let mut b = [0u8; 16];
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| "not a UUID: hexadecimal digits only".to_string())?;
    }
    if b == [0u8; 16] {
        return Err("the nil UUID names nothing".into());
    }
    Ok(b)
}

fn check_lun_size(at: &str, size: u64, bs: u32) -> Result<(), ConfigError> {
    if size == 0 || !size.is_multiple_of(u64::from(bs)) {
        return Err(ConfigError::Invalid(format!(
            "{at}: size {size} is not a positive multiple of the block size {bs}"
        )));
    }
    Ok(())
}

/// Checks a Ceph pool, image or client name as this target accepts it:
/// non-empty, at most 255 bytes, printable, without `/` or `@` (no
/// namespaces or snapshots).
pub fn check_rbd_name(what: &str, n: &str) -> Result<(), String> {
    if n.is_empty() {
        return Err(format!("{what} name is empty"));
    }
    if n.len() > 255 {
        return Err(format!("{what} name longer than 255 bytes"));
    }
    if n.chars()
        .any(|c| c == '/' || c == '@' || c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "{what} name {n:?} contains '/', '@', whitespace or control characters"
        ));
    }
    Ok(())
}

impl LunConfig {
    /// The RBD image options of an rbd LUN (`None` for other backends).
    pub fn rbd_options(&self) -> Result<Option<RbdLun>, ConfigError> {
        if self.backend != BackendKind::Rbd {
            return Ok(None);
        }
        let need = |v: &Option<String>, what: &str| {
            v.clone()
                .ok_or_else(|| ConfigError::Invalid(format!("{what} is required for an rbd LUN")))
        };
        Ok(Some(RbdLun {
            pool: need(&self.pool, "pool")?,
            image: need(&self.image, "image")?,
            namespace: self.namespace.clone(),
            snapshot: self.snapshot.clone(),
            ceph_conf: self.ceph_conf.clone(),
            client_name: self.ceph_client.as_ref().map(|c| {
                if c.contains('.') {
                    c.clone()
                } else {
                    format!("client.{c}")
                }
            }),
            keyring: self.ceph_keyring.clone(),
            min_size: self.size_bytes()?,
            op_timeout: self.ceph_op_timeout.unwrap_or(DEFAULT_CEPH_OP_TIMEOUT),
        }))
    }
}

/// Where an rbd LUN's image is (the backend-independent part of
/// `storage::RbdOptions`, so that configuration works without the `rbd`
/// feature).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdLun {
    /// The pool.
    pub pool: String,
    /// The image.
    pub image: String,
    /// The RADOS namespace, if any.
    pub namespace: Option<String>,
    /// The snapshot served (read-only), if any.
    pub snapshot: Option<String>,
    /// ceph.conf, or librados' default search.
    pub ceph_conf: Option<PathBuf>,
    /// Full entity name (`client.x`), or `client.admin`.
    pub client_name: Option<String>,
    /// Keyring, or what ceph.conf says.
    pub keyring: Option<PathBuf>,
    /// Grow the image to this size when smaller.
    pub min_size: Option<u64>,
    /// Cluster request timeout in seconds (0: none).
    pub op_timeout: u64,
}

impl RbdLun {
    /// `POOL[/NAMESPACE]/IMAGE[@SNAPSHOT]`, as `rbd` names it (what
    /// `storage::RbdOptions::spec` says once the image is opened).
    pub fn spec(&self) -> String {
        storage::rbd_spec(
            &self.pool,
            self.namespace.as_deref(),
            &self.image,
            self.snapshot.as_deref(),
        )
    }
}

/// Default [`LunConfig::ceph_op_timeout`]: under the initiators' 30 s.
pub const DEFAULT_CEPH_OP_TIMEOUT: u64 = 25;

/// Default [`LunConfig::ceph_start_wait`].
pub const DEFAULT_CEPH_START_WAIT: u64 = 5;

/// Default [`LunConfig::ceph_retry`].
pub const DEFAULT_CEPH_RETRY: u64 = 30;

/// How an LU whose storage may not answer at start is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenRetry {
    /// How long `serve` waits for it before listening without it.
    pub start_wait: std::time::Duration,
    /// The longest pause between two attempts (never zero).
    pub max_pause: std::time::Duration,
}

impl LunConfig {
    /// How this LU is opened when its storage does not answer: `None`
    /// (every backend but rbd, or `ceph_retry = 0`) when it must open at
    /// once or `serve` fails.
    pub fn open_retry(&self) -> Option<OpenRetry> {
        if self.backend != BackendKind::Rbd {
            return None;
        }
        let retry = self.ceph_retry.unwrap_or(DEFAULT_CEPH_RETRY);
        (retry > 0).then(|| OpenRetry {
            start_wait: std::time::Duration::from_secs(
                self.ceph_start_wait.unwrap_or(DEFAULT_CEPH_START_WAIT),
            ),
            max_pause: std::time::Duration::from_secs(retry),
        })
    }
}

/// Checks an iSCSI name (RFC 7143 §4.2.7): iqn., eui. or naa. form, at
/// most 223 bytes, no spaces.
pub fn check_iscsi_name(n: &str) -> Result<(), String> {
    if n.len() > 223 {
        return Err("longer than 223 bytes".into());
    }
    if !(n.starts_with("iqn.") || n.starts_with("eui.") || n.starts_with("naa.")) {
        return Err("must start with iqn., eui. or naa.".into());
    }
    if n.bytes()
        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err("contains whitespace or control characters".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_file_parses() {
        let c = Config::from_toml(
            r#"
            listen = ["127.0.0.1:3260", "127.0.0.1:3261"]
            [limits]
            queue_depth = 8192
            [[target]]
            name = "iqn.2026-11.io.ironsan:a"
            [[target.lun]]
            backend = "mem"
            size = "64M"
            block_size = 4096
            "#,
        )
        .unwrap();
        assert_eq!(c.listen.len(), 2);
        assert_eq!(c.limits().queue_depth, 8192);
        assert_eq!(c.target[0].lun[0].size_bytes().unwrap(), Some(64 << 20));
        assert!(c.target[0].lun[0].thin, "thin by default");
    }

    #[test]
    fn thin_can_be_turned_off() {
        let c = Config::from_toml(
            "[[target]]\nname = \"iqn.2026-11.x:y\"\n[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"\nthin = false\n",
        )
        .unwrap();
        assert!(!c.target[0].lun[0].thin);
        let rt = crate::lunmap::TargetRt::build(&c.target[0], c.port_groups(), false, None, None)
            .unwrap();
        assert!(!rt.luns().luns[0].as_ref().unwrap().thin());
        assert!(LunConfig::from_spec("mem:1M").unwrap().thin);
    }

    #[test]
    fn refuses_bad_values() {
        let base = |extra: &str, lun: &str| {
            format!("{extra}\n[[target]]\nname = \"iqn.2026-11.x:y\"\n[[target.lun]]\n{lun}\n")
        };
        let cases = [
            base(
                "[limits]\nqueue_depth = 9000",
                "backend = \"mem\"\nsize = \"1M\"",
            ),
            base("", "backend = \"mem\""),
            base("", "backend = \"mem\"\nsize = \"1000\""),
            base("", "backend = \"mem\"\nsize = \"17T\""),
            base("", "backend = \"file\""),
            base("", "backend = \"mem\"\nsize = \"1M\"\nblock_size = 1024"),
            base(
                "",
                "backend = \"mem\"\nsize = \"1M\"\nphysical_block_size = 256",
            ),
            base(
                "",
                "backend = \"mem\"\nsize = \"1M\"\nphysical_block_size = 1536",
            ),
            base(
                "",
                "backend = \"mem\"\nsize = \"1M\"\nblock_size = 4096\nphysical_block_size = 2048",
            ),
            base(
                "",
                "backend = \"mem\"\nsize = \"1M\"\nphysical_block_size = 33554432",
            ),
            base("", "backend = \"mem\"\nsize = \"1M\"\nbogus = 1"),
            base(
                "[limits]\nfirst_burst = 2000000\nmax_burst = 1000000",
                "backend = \"mem\"\nsize = \"1M\"",
            ),
            "[[target]]\nname = \"bad name\"\n[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"\n"
                .to_string(),
        ];
        for c in cases {
            assert!(Config::from_toml(&c).is_err(), "accepted:\n{c}");
        }
    }

    #[test]
    fn state_dir_is_optional() {
        let lun = "[[target]]\nname = \"iqn.2026-11.x:y\"\n[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"\n";
        let c = Config::from_toml(lun).unwrap();
        assert_eq!(c.state_dir, None);
        let c = Config::from_toml(&format!("state_dir = \"/var/lib/ironsan\"\n{lun}")).unwrap();
        assert_eq!(
            c.state_dir.as_deref(),
            Some(std::path::Path::new("/var/lib/ironsan"))
        );
    }

    #[test]
    fn gateway_groups_and_tags() {
        let base = "listen = [\"127.0.0.1:3260\", \"127.0.0.1:3261\"]\n";
        let rbd = "[[target]]\nname = \"iqn.2026-11.x:y\"\n[[target.lun]]\nbackend = \"rbd\"\n\
                   pool = \"rbd\"\nimage = \"i\"\n";
        let gw = "[gateway]\ngroup = 2\nfirst_portal_tag = 17\n[[gateway.peer]]\ngroup = 1\nports = [1, 2]\n";
        let c = Config::from_toml(&format!("{base}{gw}{rbd}")).unwrap();
        assert!(c.alua_explicit());
        assert_eq!((c.portal_tag(1), c.portal_tag(2)), (17, 18));
        assert_eq!(c.group_of_portal(2), 2);
        let g = c.port_groups();
        assert_eq!((g[0].id, g[0].ports.clone()), (1, vec![1, 2]));
        assert_eq!((g[1].id, g[1].ports.clone()), (2, vec![17, 18]));
        assert!(g.iter().all(|g| g.state == scsi::AccessState::Standby));
        // Without a gateway the tags are the positions.
        let plain = Config::from_toml(&format!("{base}{rbd}")).unwrap();
        assert_eq!(plain.portal_tag(2), 2);
        // Refused: a non-rbd LUN, ALUA groups beside it, no peer, a peer
        // port equal to one of ours, a peer with our group id, tag 0.
        let mem = "[[target]]\nname = \"iqn.2026-11.x:y\"\n[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"\n";
        for bad in [
            format!("{base}{gw}{mem}"),
            format!("{base}[alua]\n[[alua.group]]\nid = 5\nportals = [1, 2]\n{gw}{rbd}"),
            format!("{base}[gateway]\ngroup = 2\n{rbd}"),
            format!("{base}[gateway]\ngroup = 2\n[[gateway.peer]]\ngroup = 1\nports = [2]\n{rbd}"),
            format!("{base}[gateway]\ngroup = 2\nfirst_portal_tag = 9\n[[gateway.peer]]\ngroup = 2\nports = [1]\n{rbd}"),
            format!("{base}[gateway]\ngroup = 2\nfirst_portal_tag = 0\n[[gateway.peer]]\ngroup = 1\nports = [1]\n{rbd}"),
        ] {
            assert!(Config::from_toml(&bad).is_err(), "accepted:\n{bad}");
        }
    }

    #[test]
    fn alua_groups() {
        let base = "listen = [\"127.0.0.1:3260\", \"127.0.0.1:3261\", \"127.0.0.1:3262\"]\n";
        let target = "[[target]]\nname = \"iqn.2026-11.x:y\"\n[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"\n";
        // Default: one active/optimized group per portal, id = position.
        let c = Config::from_toml(&format!("{base}{target}")).unwrap();
        let g = c.port_groups();
        assert_eq!(g.len(), 3);
        assert_eq!((g[2].id, g[2].ports.clone()), (3, vec![3]));
        assert_eq!(c.group_of_portal(2), 2);
        assert!(!c.alua.explicit);
        // Configured groups.
        let alua = "[alua]\nexplicit = true\n[[alua.group]]\nid = 7\nportals = [1, 3]\n\
                    [[alua.group]]\nid = 9\nportals = [2]\nstate = \"standby\"\npreferred = true\n";
        let c = Config::from_toml(&format!("{base}{alua}{target}")).unwrap();
        assert!(c.alua.explicit);
        assert_eq!(c.group_of_portal(3), 7);
        assert_eq!(c.group_of_portal(2), 9);
        let g = c.port_groups();
        assert_eq!(g[1].state, scsi::AccessState::Standby);
        assert!(g[1].preferred);
        // Refused: a portal that does not exist, a portal in no group, a
        // portal in two groups, duplicate ids, id 0, an unknown state.
        for bad in [
            "[[alua.group]]\nid = 1\nportals = [1, 2, 3, 4]\n",
            "[[alua.group]]\nid = 1\nportals = [1, 2]\n",
            "[[alua.group]]\nid = 1\nportals = [1, 2]\n[[alua.group]]\nid = 2\nportals = [2, 3]\n",
            "[[alua.group]]\nid = 1\nportals = [1]\n[[alua.group]]\nid = 1\nportals = [2, 3]\n",
            "[[alua.group]]\nid = 0\nportals = [1, 2, 3]\n",
            "[[alua.group]]\nid = 1\nportals = [1, 2, 3]\nstate = \"offline\"\n",
            "[[alua.group]]\nid = 1\nportals = [1, 2, 3]\nbogus = 1\n",
        ] {
            let text = format!("{base}[alua]\n{bad}{target}");
            assert!(Config::from_toml(&text).is_err(), "accepted:\n{text}");
        }
    }

    #[test]
    fn lun_specs() {
        assert_eq!(
            LunConfig::from_spec("mem:1G").unwrap().size.as_deref(),
            Some("1G")
        );
        let f = LunConfig::from_spec("file:/tmp/x.img:64M").unwrap();
        assert_eq!(f.path.as_deref(), Some(std::path::Path::new("/tmp/x.img")));
        assert_eq!(f.size.as_deref(), Some("64M"));
        assert_eq!(LunConfig::from_spec("file:/dev/sdb").unwrap().size, None);
        assert!(LunConfig::from_spec("disk:1G").is_err());
        assert!(LunConfig::from_spec("file:").is_err());
    }

    #[test]
    fn physical_block_size() {
        // Spec options, also after a file path with commas in it.
        let l = LunConfig::from_spec("mem:64M,physical_block_size=4096").unwrap();
        assert_eq!(
            (l.size.as_deref(), l.physical_block_size),
            (Some("64M"), Some(4096))
        );
        let f = LunConfig::from_spec("file:/tmp/a,b.img:1G,physical_block_size=8192").unwrap();
        assert_eq!(
            f.path.as_deref(),
            Some(std::path::Path::new("/tmp/a,b.img"))
        );
        assert_eq!(
            (f.size.as_deref(), f.physical_block_size),
            (Some("1G"), Some(8192))
        );
        assert_eq!(
            LunConfig::from_spec("mem:1M").unwrap().physical_block_size,
            None
        );
        for bad in [
            "mem:1M,physical_block_size=4k",
            "mem:1M,physical_block_size=",
            "mem:1M,pbs=4096",
            "mem:1M,physical_block_size=4096,physical_block_size=4096",
        ] {
            assert!(LunConfig::from_spec(bad).is_err(), "accepted {bad}");
        }
        // TOML, told by the LU; validation names the field.
        let text = |pbs: u32, bs: u32| {
            format!(
                "[[target]]\nname = \"iqn.2026-11.x:y\"\n[[target.lun]]\nbackend = \"mem\"\n\
                 size = \"1M\"\nblock_size = {bs}\nphysical_block_size = {pbs}\n"
            )
        };
        let c = Config::from_toml(&text(4096, 512)).unwrap();
        assert_eq!(c.target[0].lun[0].physical_block_size, Some(4096));
        let rt = crate::lunmap::TargetRt::build(&c.target[0], c.port_groups(), false, None, None)
            .unwrap();
        assert_eq!(
            rt.luns().luns[0].as_ref().unwrap().physical_block_size(),
            4096
        );
        assert!(Config::from_toml(&text(16384, 4096)).is_ok());
        assert!(Config::from_toml(&text(512 << 15, 512)).is_ok());
        for (pbs, bs) in [(768, 512), (2048, 4096), (512 << 16, 512), (0, 512)] {
            let e = Config::from_toml(&text(pbs, bs)).unwrap_err().to_string();
            assert!(
                e.contains(&format!(
                    "physical_block_size {pbs} must be a power-of-two multiple of block_size {bs}"
                )),
                "{e}"
            );
        }
    }

    #[test]
    fn rbd_specs() {
        let l = LunConfig::from_spec("rbd:rbd/ironsan").unwrap();
        assert_eq!(l.backend, BackendKind::Rbd);
        let o = l.rbd_options().unwrap().unwrap();
        assert_eq!((o.pool.as_str(), o.image.as_str()), ("rbd", "ironsan"));
        assert_eq!((o.ceph_conf, o.client_name, o.min_size), (None, None, None));
        assert_eq!(o.op_timeout, DEFAULT_CEPH_OP_TIMEOUT);
        let l = LunConfig::from_spec(
            "rbd:rbd/ns/img@monday,ceph_client=ironsan,ceph_keyring=/k,ceph_conf=/c.conf,\
             ceph_op_timeout=10",
        )
        .unwrap();
        let o = l.rbd_options().unwrap().unwrap();
        assert_eq!(
            (o.pool.as_str(), o.namespace.as_deref(), o.image.as_str()),
            ("rbd", Some("ns"), "img")
        );
        assert_eq!(o.snapshot.as_deref(), Some("monday"));
        assert!(l.read_only, "a snapshot is served read-only");
        assert_eq!(o.client_name.as_deref(), Some("client.ironsan"));
        assert_eq!(o.keyring.as_deref(), Some(std::path::Path::new("/k")));
        assert_eq!(
            o.ceph_conf.as_deref(),
            Some(std::path::Path::new("/c.conf"))
        );
        assert_eq!(o.op_timeout, 10);
        for bad in [
            "rbd:",
            "rbd:ironsan",
            "rbd:/ironsan",
            "rbd:rbd/",
            "rbd:rbd//img",
            "rbd:rbd/a/b/c",
            "rbd:rbd/img@",
            "rbd:rbd/img@a@b",
            "rbd:rb d/img",
            "rbd:rbd/img,ceph_op_timeout=soon",
            "rbd:rbd/img,ceph_client=a,ceph_client=b",
            "mem:1M,ceph_client=a",
            "rbd:rbd/img,colour=red",
        ] {
            assert!(LunConfig::from_spec(bad).is_err(), "accepted {bad}");
        }
        assert_eq!(
            LunConfig::from_spec("mem:1M")
                .unwrap()
                .rbd_options()
                .unwrap(),
            None
        );
    }

    #[test]
    fn rbd_in_toml() {
        let base = "[[target]]\nname = \"iqn.2026-11.x:y\"\n[[target.lun]]\nbackend = \"rbd\"\n";
        let c = Config::from_toml(&format!(
            "{base}pool = \"p\"\nimage = \"i\"\nceph_conf = \"/c/ceph.conf\"\n\
             ceph_client = \"ironsan\"\nceph_keyring = \"/c/k\"\nsize = \"1G\"\n"
        ))
        .unwrap();
        let o = c.target[0].lun[0].rbd_options().unwrap().unwrap();
        assert_eq!(o.client_name.as_deref(), Some("client.ironsan"));
        assert_eq!(
            o.ceph_conf.as_deref(),
            Some(std::path::Path::new("/c/ceph.conf"))
        );
        assert_eq!(o.keyring.as_deref(), Some(std::path::Path::new("/c/k")));
        assert_eq!(o.min_size, Some(1 << 30));
        let t = Config::from_toml(&format!(
            "{base}pool = \"p\"\nimage = \"i\"\nceph_op_timeout = 0\n"
        ))
        .unwrap();
        assert_eq!(
            t.target[0].lun[0]
                .rbd_options()
                .unwrap()
                .unwrap()
                .op_timeout,
            0
        );
        let full = Config::from_toml(&format!(
            "{base}pool = \"p\"\nimage = \"i\"\nceph_client = \"client.x\"\n"
        ))
        .unwrap();
        let o = full.target[0].lun[0].rbd_options().unwrap().unwrap();
        assert_eq!(o.client_name.as_deref(), Some("client.x"));
        for bad in [
            "pool = \"p\"\n",
            "image = \"i\"\n",
            "pool = \"p\"\nimage = \"a/b\"\n",
            "pool = \"p\"\nimage = \"i\"\npath = \"/x\"\n",
            "pool = \"p\"\nimage = \"i\"\nsize = \"1000\"\n",
            "pool = \"p\"\nimage = \"i\"\nceph_user = \"x\"\n",
        ] {
            let text = format!("{base}{bad}");
            assert!(Config::from_toml(&text).is_err(), "accepted:\n{text}");
        }
        // Ceph fields on another backend are refused.
        let text = "[[target]]\nname = \"iqn.2026-11.x:y\"\n[[target.lun]]\nbackend = \"mem\"\n\
                    size = \"1M\"\npool = \"p\"\n";
        assert!(Config::from_toml(text).is_err());
    }
}
