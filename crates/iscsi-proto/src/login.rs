//! The target side of the login phase (RFC 7143 §6, §11.12, §11.13, §13).
//!
//! ```text
//!            first request (CSG=0)            (CSG=1)
//!   Start ─────────────────────► Security ───────────► Operational
//!     │                              │  T=1,NSG=1            │
//!     │ first request (CSG=1)        └──────────────────────►│
//!     └─────────────────────────────────────────────────────►│
//!                                    T=1,NSG=3 from either    ▼
//!                                    ───────────────────► FullFeature
//! ```
//!
//! [`TargetLogin::handle`] takes one Login Request and returns the response
//! to send and whether login continues, completes or fails. Keys are
//! negotiated by their RFC 7143 §13 rule (boolean OR/AND, numerical
//! minimum/maximum, list selection, declarative); unknown keys are answered
//! `NotUnderstood`, malformed values `Reject`. The security stage runs
//! the authentication exchange of `auth` (AuthMethod=None or CHAP with
//! MD5, optionally mutual) as the target's [`ChapPolicy`] demands; the
//! operational stage cannot be entered before it has succeeded. The CHAP
//! challenge comes from the caller ([`TargetLogin::seed_challenge`]), which
//! draws it from the OS random source.

use std::collections::HashSet;

use iscsi_wire::pdu::{stage, Itt, LoginReq, LoginResp, SnTriple};
use iscsi_wire::text::{self, Continuation};
use iscsi_wire::Sn;

use crate::chap::{ChapPolicy, CHALLENGE_LEN};
use crate::params::{DigestPolicy, Limits, SessionParams, SessionType};

mod auth;

/// Most Login Requests one login may take (continuations included).
pub const MAX_LOGIN_REQUESTS: u32 = 64;

/// A target as the login phase needs to know it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetInfo {
    pub name: String,
    pub alias: Option<String>,
    /// Target portal group tag of the portal the login came through.
    pub tpgt: u16,
}

/// Looks targets up by name for the portal a connection arrived on.
pub trait TargetDirectory {
    /// The target called `name`, if it exists.
    fn find(&self, name: &str, initiator: &str) -> Option<TargetInfo>;

    /// Whether `initiator` may log in to the target `name` (its ACL). A
    /// refusal is login status 0x0202 (authorization failure).
    fn authorize(&self, _name: &str, _initiator: &str) -> bool {
        true
    }

    /// The authentication a login to `target` (`None`: a discovery
    /// session) must pass.
    fn chap(&self, _target: Option<&str>) -> ChapPolicy {
        ChapPolicy::default()
    }
}

/// Login status classes and details (RFC 7143 §11.13.5).
pub use iscsi_wire::pdu::LoginStatus;

/// What a completed login established.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginOutcome {
    pub params: SessionParams,
    pub target: Option<TargetInfo>,
    pub isid: [u8; 6],
    /// TSIH the initiator sent (0 for a new session).
    pub tsih: u16,
    pub cid: u16,
    /// The CmdSN the full feature phase expects next.
    pub exp_cmd_sn: Sn,
    /// The StatSN the next response will carry.
    pub next_stat_sn: Sn,
}

/// The result of one Login Request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoginStep {
    /// Send `resp` with `text`; more requests follow.
    Continue { resp: LoginResp, text: Vec<u8> },
    /// Send `resp` with `text` (after setting its TSIH); the connection is
    /// in full feature phase.
    Complete {
        resp: LoginResp,
        text: Vec<u8>,
        outcome: Box<LoginOutcome>,
    },
    /// Send `resp` and close the connection.
    Fail { resp: LoginResp, reason: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Start,
    Security,
    Operational,
}

/// Login state of one connection.
#[derive(Debug)]
pub struct TargetLogin {
    limits: Limits,
    tpgt: u16,
    stage: Stage,
    params: SessionParams,
    target: Option<TargetInfo>,
    isid: [u8; 6],
    tsih: u16,
    cid: u16,
    itt: Itt,
    cmd_sn: Sn,
    stat_sn: Sn,
    seen: HashSet<String>,
    cont: Continuation,
    declared_mrdsl: bool,
    sent_tpgt: bool,
    auth: auth::Auth,
    requests: u32,
}

struct Fail(LoginStatus, String);

impl TargetLogin {
    /// Login state for a connection that arrived on a portal of group `tpgt`.
    pub fn new(limits: Limits, tpgt: u16) -> Self {
        let mut params = SessionParams::rfc_defaults();
        params.recv_max_data_segment = limits.max_recv_data_segment;
        TargetLogin {
            limits,
            tpgt,
            stage: Stage::Start,
            params,
            target: None,
            isid: [0; 6],
            tsih: 0,
            cid: 0,
            itt: Itt(0),
            cmd_sn: Sn(0),
            stat_sn: Sn(0),
            seen: HashSet::new(),
            cont: Continuation::default(),
            declared_mrdsl: false,
            sent_tpgt: false,
            auth: auth::Auth::new(),
            requests: 0,
        }
    }

    /// Supplies the CHAP identifier and challenge this login will send if
    /// CHAP is negotiated: fresh bytes from the OS random source for every
    /// connection (RFC 7143 §12.1.3: challenges are never reused).
    pub fn seed_challenge(&mut self, id: u8, challenge: [u8; CHALLENGE_LEN]) {
        self.auth.seed(id, challenge);
    }

    /// Checks a Login Request's header against the login so far (RFC 7143
    /// §6.3, §11.12): the number of requests, the version, the ISID, TSIH
    /// and CID staying the same, the stage it is in and where it may go;
    /// moves the login to that request's stage.
    fn check_request(&mut self, req: &LoginReq, first: bool) -> Result<(), Fail> {
        self.requests += 1;
        if self.requests > MAX_LOGIN_REQUESTS {
            return Err(Fail(
                LoginStatus::INITIATOR_ERROR,
                format!("more than {MAX_LOGIN_REQUESTS} login requests"),
            ));
        }
        if req.version_min > 0 {
            return Err(Fail(
                LoginStatus::UNSUPPORTED_VERSION,
                format!("version-min {}", req.version_min),
            ));
        }
        if !first && (req.isid != self.isid || req.tsih != self.tsih || req.cid != self.cid) {
            return Err(Fail(
                LoginStatus::INVALID_DURING_LOGIN,
                "ISID/TSIH/CID changed during login".into(),
            ));
        }
        let csg = req.csg;
        let expected = match self.stage {
            Stage::Start => csg == stage::SECURITY || csg == stage::OPERATIONAL,
            Stage::Security => csg == stage::SECURITY || csg == stage::OPERATIONAL,
            Stage::Operational => csg == stage::OPERATIONAL,
        };
        if !expected {
            return Err(Fail(
                LoginStatus::INVALID_DURING_LOGIN,
                format!("CSG {csg} not valid now"),
            ));
        }
        if req.transit && (req.nsg <= csg || req.nsg == 2) {
            return Err(Fail(
                LoginStatus::INVALID_DURING_LOGIN,
                format!("transit from {csg} to {}", req.nsg),
            ));
        }
        if req.transit && req.cont {
            return Err(Fail(
                LoginStatus::INVALID_DURING_LOGIN,
                "T and C both set".into(),
            ));
        }
        self.stage = if csg == stage::SECURITY {
            Stage::Security
        } else {
            Stage::Operational
        };
        Ok(())
    }

    /// The first request's names: the initiator's, and for a normal
    /// session the target's, which must exist, admit the initiator
    /// (`FORBIDDEN` otherwise) and decides the authentication asked for.
    fn first_request(
        &mut self,
        pairs: &[(String, String)],
        dir: &dyn TargetDirectory,
    ) -> Result<(), Fail> {
        if self.params.initiator_name.is_empty() {
            return Err(Fail(
                LoginStatus::MISSING_PARAMETER,
                "no InitiatorName".into(),
            ));
        }
        if self.params.session_type == SessionType::Normal {
            let name = pairs
                .iter()
                .find(|(k, _)| k == "TargetName")
                .map(|(_, v)| v.as_str());
            let Some(name) = name else {
                return Err(Fail(LoginStatus::MISSING_PARAMETER, "no TargetName".into()));
            };
            let Some(t) = dir.find(name, &self.params.initiator_name) else {
                return Err(Fail(LoginStatus::NOT_FOUND, format!("no target {name}")));
            };
            if !dir.authorize(&t.name, &self.params.initiator_name) {
                return Err(Fail(
                    LoginStatus::FORBIDDEN,
                    format!("initiator not allowed on {}", t.name),
                ));
            }
            self.params.target_name = t.name.clone();
            self.auth.policy = dir.chap(Some(&t.name));
            self.target = Some(t);
        } else {
            self.auth.policy = dir.chap(None);
        }
        Ok(())
    }

    /// Handles one Login Request with its data segment.
    pub fn handle(&mut self, req: &LoginReq, data: &[u8], dir: &dyn TargetDirectory) -> LoginStep {
        let first = self.stage == Stage::Start;
        if first {
            self.isid = req.isid;
            self.tsih = req.tsih;
            self.cid = req.cid;
            self.stat_sn = req.exp_stat_sn;
        }
        self.itt = req.itt;
        self.cmd_sn = req.cmd_sn;
        match self.step(req, data, dir, first) {
            Ok(step) => step,
            Err(Fail(code, reason)) => LoginStep::Fail {
                resp: self.response(req, false, code),
                reason,
            },
        }
    }

    fn response(&mut self, req: &LoginReq, transit: bool, code: LoginStatus) -> LoginResp {
        let stat_sn = self.stat_sn;
        self.stat_sn = self.stat_sn.next();
        LoginResp {
            transit,
            cont: false,
            csg: req.csg,
            nsg: if transit { req.nsg } else { 0 },
            version_max: 0,
            version_active: 0,
            isid: self.isid,
            tsih: self.tsih,
            itt: req.itt,
            sn: SnTriple {
                stat_sn,
                exp_cmd_sn: self.cmd_sn,
                max_cmd_sn: self.cmd_sn.plus(self.limits.queue_depth.max(1) - 1),
            },
            status: code,
        }
    }

    fn step(
        &mut self,
        req: &LoginReq,
        data: &[u8],
        dir: &dyn TargetDirectory,
        first: bool,
    ) -> Result<LoginStep, Fail> {
        let csg = req.csg;
        self.check_request(req, first)?;

        let whole = match self.cont.push(data, req.cont) {
            Ok(Some(t)) => t,
            Ok(None) => {
                let resp = self.response(req, false, LoginStatus::SUCCESS);
                return Ok(LoginStep::Continue {
                    resp,
                    text: Vec::new(),
                });
            }
            Err(e) => return Err(Fail(LoginStatus::INITIATOR_ERROR, e.to_string())),
        };
        let pairs =
            text::parse(&whole).map_err(|e| Fail(LoginStatus::INITIATOR_ERROR, e.to_string()))?;

        let mut out = Vec::new();
        let mut security = Vec::new();
        for (k, v) in &pairs {
            if !self.seen.insert(k.clone()) {
                return Err(Fail(
                    LoginStatus::INITIATOR_ERROR,
                    format!("key {k} negotiated twice"),
                ));
            }
            let auth_key = k == "AuthMethod" || k.starts_with("CHAP_");
            if csg == stage::SECURITY && auth_key {
                security.push((k.clone(), v.clone()));
                continue;
            }
            if k.starts_with("CHAP_") {
                return Err(Fail(
                    LoginStatus::INITIATOR_ERROR,
                    format!("{k} outside the security stage"),
                ));
            }
            self.negotiate(k, v, &mut out)?;
        }

        if first {
            self.first_request(&pairs, dir)?;
        }
        if csg == stage::SECURITY {
            self.auth.handle(&security, &mut out)?;
            if req.transit && !self.auth.complete() && !self.auth.in_exchange() {
                return Err(Fail(
                    LoginStatus::AUTH_FAILED,
                    "authentication required".into(),
                ));
            }
        } else if !self.auth.complete() {
            return Err(Fail(
                LoginStatus::AUTH_FAILED,
                "authentication required".into(),
            ));
        }
        if self.params.session_type == SessionType::Normal && !self.sent_tpgt {
            text::push(&mut out, "TargetPortalGroupTag", &self.tpgt.to_string());
            self.sent_tpgt = true;
        }
        if csg == stage::OPERATIONAL && !self.declared_mrdsl {
            text::push(
                &mut out,
                "MaxRecvDataSegmentLength",
                &self.limits.max_recv_data_segment.to_string(),
            );
            self.declared_mrdsl = true;
        }

        // Mid-exchange the target holds the initiator in the security
        // stage by answering T=0 (RFC 7143 §6.3).
        let transit = req.transit && self.auth.complete();
        if transit && req.nsg == stage::FULL_FEATURE {
            if let Some(alias) = self.target.as_ref().and_then(|t| t.alias.clone()) {
                if !self.seen.contains("TargetAlias") {
                    text::push(&mut out, "TargetAlias", &alias);
                }
            }
            // Keep FirstBurstLength within MaxBurstLength (§13.14).
            self.params.first_burst = self.params.first_burst.min(self.params.max_burst);
            let resp = self.response(req, true, LoginStatus::SUCCESS);
            let outcome = LoginOutcome {
                params: self.params.clone(),
                target: self.target.clone(),
                isid: self.isid,
                tsih: self.tsih,
                cid: self.cid,
                exp_cmd_sn: self.cmd_sn,
                next_stat_sn: self.stat_sn,
            };
            return Ok(LoginStep::Complete {
                resp,
                text: out,
                outcome: Box::new(outcome),
            });
        }
        if transit {
            self.stage = Stage::Operational;
        }
        let resp = self.response(req, transit, LoginStatus::SUCCESS);
        Ok(LoginStep::Continue { resp, text: out })
    }

    fn negotiate(&mut self, key: &str, val: &str, out: &mut Vec<u8>) -> Result<(), Fail> {
        let l = self.limits.clone();
        let p = &mut self.params;
        let is_answer = matches!(val, "NotUnderstood" | "Irrelevant" | "Reject");
        if is_answer {
            return Ok(());
        }
        if let Some((_, rule)) = RULES.iter().find(|(k, _)| *k == key) {
            // A value outside the key's domain is answered Reject
            // (RFC 7143 §6.2.1); otherwise with what the rule settles on.
            let answer = match *rule {
                Rule::Num { min, max, set } => match num(val, min, max) {
                    None => Some("Reject".to_string()),
                    Some(v) => set(p, &l, v).map(|a| a.to_string()),
                },
                Rule::Bool { set } => Some(match boolean(val) {
                    None => "Reject".to_string(),
                    Some(v) => yes_no(set(p, &l, v)).to_string(),
                }),
            };
            if let Some(a) = answer {
                text::push(out, key, &a);
            }
            return Ok(());
        }
        match key {
            "InitiatorName" => {
                if val.is_empty() || val.len() > 223 {
                    return Err(Fail(
                        LoginStatus::INITIATOR_ERROR,
                        "bad InitiatorName".into(),
                    ));
                }
                p.initiator_name = val.to_string();
            }
            "InitiatorAlias" => p.initiator_alias = Some(val.to_string()),
            "TargetName" => {
                if val.len() > 223 {
                    return Err(Fail(
                        LoginStatus::INITIATOR_ERROR,
                        "TargetName too long".into(),
                    ));
                }
            }
            "SessionType" => match val {
                "Normal" => p.session_type = SessionType::Normal,
                "Discovery" => p.session_type = SessionType::Discovery,
                _ => {
                    return Err(Fail(
                        LoginStatus::SESSION_TYPE_UNSUPPORTED,
                        format!("SessionType {val}"),
                    ))
                }
            },
            // In the security stage the key goes to the auth exchange.
            "AuthMethod" => text::push(out, key, "Irrelevant"),
            "HeaderDigest" | "DataDigest" => {
                let policy = if key == "HeaderDigest" {
                    l.header_digest
                } else {
                    l.data_digest
                };
                let pick = val.split(',').find(|d| {
                    matches!(
                        (*d, policy),
                        ("None", DigestPolicy::Off | DigestPolicy::Allowed)
                            | ("CRC32C", DigestPolicy::Allowed | DigestPolicy::Required)
                    )
                });
                match pick {
                    Some(d) => {
                        let on = d == "CRC32C";
                        if key == "HeaderDigest" {
                            p.header_digest = on;
                        } else {
                            p.data_digest = on;
                        }
                        text::push(out, key, d);
                    }
                    None => {
                        return Err(Fail(
                            LoginStatus::INITIATOR_ERROR,
                            format!("{key}={val} not acceptable"),
                        ));
                    }
                }
            }
            "IFMarkInt" | "OFMarkInt" => text::push(out, key, "Irrelevant"),
            "TaskReporting" => text::push(out, key, "RFC3720"),
            "TargetAlias" | "TargetAddress" | "TargetPortalGroupTag" => {
                text::push(out, key, "Irrelevant")
            }
            _ => text::push(out, key, "NotUnderstood"),
        }
        Ok(())
    }
}

/// How the target reads an operational key's value and settles it
/// (RFC 7143 §13): the value is checked against the key's domain first.
#[derive(Clone, Copy)]
enum Rule {
    /// A number in `min..=max` (§6.2: decimal or hex); `set` applies it
    /// and gives the answer, `None` for a declarative key (no answer).
    Num {
        min: u64,
        max: u64,
        set: fn(&mut SessionParams, &Limits, u64) -> Option<u64>,
    },
    /// `Yes` or `No`; `set` applies it and gives the answer.
    Bool {
        set: fn(&mut SessionParams, &Limits, bool) -> bool,
    },
}

/// Lengths are 512 to 2^24-1 bytes (RFC 7143 §13.12-§13.14).
const LEN_MAX: u64 = (1 << 24) - 1;

/// The operational keys negotiated by value (RFC 7143 §13) and how.
const RULES: &[(&str, Rule)] = &[
    // §13.2: one connection per session (no MC/S).
    (
        "MaxConnections",
        Rule::Num {
            min: 1,
            max: 65535,
            set: |p, _, v| {
                p.max_connections = v.min(1) as u16;
                Some(u64::from(p.max_connections))
            },
        },
    ),
    // §13.10: OR of both sides.
    (
        "InitialR2T",
        Rule::Bool {
            set: |p, l, v| {
                p.initial_r2t = v || l.initial_r2t;
                p.initial_r2t
            },
        },
    ),
    // §13.11: AND of both sides.
    (
        "ImmediateData",
        Rule::Bool {
            set: |p, l, v| {
                p.immediate_data = v && l.immediate_data;
                p.immediate_data
            },
        },
    ),
    // §13.18, §13.19: this target needs both in order (OR with Yes).
    (
        "DataPDUInOrder",
        Rule::Bool {
            set: |p, _, _| {
                p.data_pdu_in_order = true;
                true
            },
        },
    ),
    (
        "DataSequenceInOrder",
        Rule::Bool {
            set: |p, _, _| {
                p.data_sequence_in_order = true;
                true
            },
        },
    ),
    // §13.12: declarative, what the initiator can receive.
    (
        "MaxRecvDataSegmentLength",
        Rule::Num {
            min: 512,
            max: LEN_MAX,
            set: |p, _, v| {
                p.send_max_data_segment = v as u32;
                None
            },
        },
    ),
    // §13.13, §13.14: the minimum of both sides.
    (
        "MaxBurstLength",
        Rule::Num {
            min: 512,
            max: LEN_MAX,
            set: |p, l, v| {
                p.max_burst = (v as u32).min(l.max_burst);
                Some(u64::from(p.max_burst))
            },
        },
    ),
    (
        "FirstBurstLength",
        Rule::Num {
            min: 512,
            max: LEN_MAX,
            set: |p, l, v| {
                p.first_burst = (v as u32).min(l.first_burst);
                Some(u64::from(p.first_burst))
            },
        },
    ),
    // §13.15: the maximum; §13.16: the minimum.
    (
        "DefaultTime2Wait",
        Rule::Num {
            min: 0,
            max: 3600,
            set: |p, l, v| {
                p.time2wait = (v as u16).max(l.time2wait);
                Some(u64::from(p.time2wait))
            },
        },
    ),
    (
        "DefaultTime2Retain",
        Rule::Num {
            min: 0,
            max: 3600,
            set: |p, l, v| {
                p.time2retain = (v as u16).min(l.time2retain);
                Some(u64::from(p.time2retain))
            },
        },
    ),
    // §13.17: the minimum.
    (
        "MaxOutstandingR2T",
        Rule::Num {
            min: 1,
            max: 65535,
            set: |p, l, v| {
                p.max_outstanding_r2t = (v as u16).min(l.max_outstanding_r2t);
                Some(u64::from(p.max_outstanding_r2t))
            },
        },
    ),
    // §13.20: this target runs ErrorRecoveryLevel 0 (the minimum).
    (
        "ErrorRecoveryLevel",
        Rule::Num {
            min: 0,
            max: 2,
            set: |p, _, _| {
                p.error_recovery_level = 0;
                Some(0)
            },
        },
    ),
    // §13.25, obsoleted keys: markers are answered No (which the RFC
    // allows beside the Reject it prefers).
    (
        "IFMarker",
        Rule::Bool {
            set: |_, _, _| false,
        },
    ),
    (
        "OFMarker",
        Rule::Bool {
            set: |_, _, _| false,
        },
    ),
    // §13.24: level 1 at most (the minimum of both sides).
    (
        "iSCSIProtocolLevel",
        Rule::Num {
            min: 0,
            max: 31,
            set: |_, _, v| Some(v.min(1)),
        },
    ),
];

fn yes_no(b: bool) -> &'static str {
    if b {
        "Yes"
    } else {
        "No"
    }
}

fn boolean(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

/// A numerical value (decimal, or hex with 0x) within `lo..=hi`.
fn num(v: &str, lo: u64, hi: u64) -> Option<u64> {
    let n = if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()?
    } else {
        if v.is_empty() || v.len() > 20 || !v.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        v.parse().ok()?
    };
    (lo..=hi).contains(&n).then_some(n)
}

#[cfg(test)]
mod tests;
