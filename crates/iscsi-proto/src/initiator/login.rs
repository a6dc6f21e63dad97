//! Login from the initiator's side (RFC 7143 §6.2, §13): offers our keys,
//! reads the target's answers by each key's negotiation rule, walks the
//! stages to full feature phase.
//!
//! Without credentials the login starts in the operational stage. With
//! CHAP credentials ([`LoginConfig::chap`]) it starts in the security
//! stage: AuthMethod=CHAP, then CHAP_A=5, then CHAP_N/CHAP_R answering the
//! target's challenge — and, for mutual CHAP ([`LoginConfig::mutual`]),
//! our own CHAP_I/CHAP_C, whose answer must prove the target knows the
//! target secret before we go on.

use iscsi_wire::pdu::LoginStatus;
use iscsi_wire::pdu::{stage, Itt, LoginReq, LoginResp};
use iscsi_wire::text;
use iscsi_wire::Sn;
use thiserror::Error;

use crate::chap::{self, Credential, Secret};
use crate::params::{SessionParams, SessionType};

/// Mutual CHAP: what the target must prove, and the challenge we send it
/// (fresh random bytes from the caller for every login).
#[derive(Clone, Debug)]
pub struct MutualChap {
    /// The name the target must answer with; `None` accepts any.
    pub user: Option<String>,
    /// The target's secret.
    pub secret: Secret,
    /// CHAP_I we send.
    pub id: u8,
    /// CHAP_C we send (1..=1024 bytes; 16 is usual).
    pub challenge: Vec<u8>,
}

/// What we ask for at login.
#[derive(Clone, Debug)]
pub struct LoginConfig {
    pub initiator_name: String,
    /// The target to log in to; `None` for a discovery session.
    pub target_name: Option<String>,
    pub isid: [u8; 6],
    /// Offer CRC32C header digests (first choice when `true`).
    pub header_digest: bool,
    /// Offer CRC32C data digests.
    pub data_digest: bool,
    /// Our MaxRecvDataSegmentLength.
    pub max_recv_data_segment: u32,
    pub max_burst: u32,
    pub first_burst: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub max_outstanding_r2t: u16,
    /// Authenticate with CHAP as this name and secret.
    pub chap: Option<Credential>,
    /// Also make the target authenticate (needs [`LoginConfig::chap`]).
    pub mutual: Option<MutualChap>,
}

impl LoginConfig {
    /// A configuration with fast defaults: immediate and unsolicited data,
    /// 256 KiB segments, 1 MiB bursts, no digests.
    pub fn new(initiator_name: &str, target_name: Option<&str>, isid: [u8; 6]) -> Self {
        LoginConfig {
            initiator_name: initiator_name.to_string(),
            target_name: target_name.map(str::to_string),
            isid,
            header_digest: false,
            data_digest: false,
            max_recv_data_segment: 256 * 1024,
            max_burst: 1024 * 1024,
            first_burst: 256 * 1024,
            immediate_data: true,
            initial_r2t: false,
            max_outstanding_r2t: 16,
            chap: None,
            mutual: None,
        }
    }
}

/// Why a login failed.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LoginError {
    /// The target refused with this status.
    #[error("login refused: status {0}")]
    Refused(LoginStatus),
    /// The target broke the protocol.
    #[error("login protocol error: {0}")]
    Protocol(String),
}

/// What login established.
#[derive(Clone, Debug)]
pub struct Negotiated {
    pub params: SessionParams,
    pub tsih: u16,
    /// The CmdSN of the first command.
    pub cmd_sn: Sn,
    pub exp_stat_sn: Sn,
    pub max_cmd_sn: Sn,
    /// TargetPortalGroupTag the target reported, if any.
    pub tpgt: Option<u16>,
}

/// The next step of a login.
#[derive(Debug)]
pub enum LoginProgress {
    /// Send this request.
    Send(LoginReq, Vec<u8>),
    /// Full feature phase reached.
    Done(Box<Negotiated>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Auth {
    /// No security stage (no credentials).
    Skipped,
    /// AuthMethod offered.
    Offered,
    /// CHAP_A sent; waiting for the challenge.
    WaitChallenge,
    /// CHAP_R sent; waiting for the target's transit (and, for mutual
    /// CHAP, its response).
    WaitTarget,
    /// Authenticated (or AuthMethod=None accepted); leaving the stage.
    Done,
}

/// Initiator login state.
#[derive(Debug)]
pub struct InitiatorLogin {
    cfg: LoginConfig,
    params: SessionParams,
    cmd_sn: Sn,
    itt: Itt,
    rounds: u32,
    tpgt: Option<u16>,
    answered: Vec<String>,
    auth: Auth,
    target_proved: bool,
    operational_sent: bool,
}

impl InitiatorLogin {
    /// A login that will use CmdSN `cmd_sn` and task tag `itt`.
    pub fn new(cfg: LoginConfig, cmd_sn: Sn, itt: Itt) -> Self {
        let mut params = SessionParams::rfc_defaults();
        params.initiator_name = cfg.initiator_name.clone();
        params.target_name = cfg.target_name.clone().unwrap_or_default();
        params.session_type = if cfg.target_name.is_some() {
            SessionType::Normal
        } else {
            SessionType::Discovery
        };
        params.recv_max_data_segment = cfg.max_recv_data_segment;
        InitiatorLogin {
            cfg,
            params,
            cmd_sn,
            itt,
            rounds: 0,
            tpgt: None,
            answered: Vec::new(),
            auth: Auth::Skipped,
            target_proved: false,
            operational_sent: false,
        }
    }

    fn request(&self, text: Vec<u8>) -> (LoginReq, Vec<u8>) {
        self.request_at(stage::OPERATIONAL, true, text)
    }

    fn request_at(&self, csg: u8, transit: bool, text: Vec<u8>) -> (LoginReq, Vec<u8>) {
        let nsg = if csg == stage::SECURITY {
            stage::OPERATIONAL
        } else {
            stage::FULL_FEATURE
        };
        let req = LoginReq {
            transit,
            cont: false,
            csg,
            nsg,
            version_max: 0,
            version_min: 0,
            isid: self.cfg.isid,
            tsih: 0,
            itt: self.itt,
            cid: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: Sn(0),
        };
        (req, text)
    }

    /// The first Login Request: with CHAP credentials, the security stage
    /// offering AuthMethod=CHAP; otherwise the operational stage straight
    /// to full feature phase, all our keys offered.
    pub fn start(&mut self) -> (LoginReq, Vec<u8>) {
        let c = &self.cfg;
        let mut t = Vec::new();
        text::push(&mut t, "InitiatorName", &c.initiator_name);
        match &c.target_name {
            Some(n) => {
                text::push(&mut t, "TargetName", n);
                text::push(&mut t, "SessionType", "Normal");
            }
            None => text::push(&mut t, "SessionType", "Discovery"),
        }
        if c.chap.is_some() {
            // With mutual CHAP the target must authenticate: None is not
            // offered.
            let offer = if c.mutual.is_some() {
                "CHAP"
            } else {
                "CHAP,None"
            };
            text::push(&mut t, "AuthMethod", offer);
            self.auth = Auth::Offered;
            return self.request_at(stage::SECURITY, false, t);
        }
        self.operational(t)
    }

    /// The operational stage request with every key we negotiate,
    /// appended to `t`.
    fn operational(&mut self, mut t: Vec<u8>) -> (LoginReq, Vec<u8>) {
        self.operational_sent = true;
        let c = &self.cfg;
        let dg = |on: bool| if on { "CRC32C,None" } else { "None" };
        text::push(&mut t, "HeaderDigest", dg(c.header_digest));
        text::push(&mut t, "DataDigest", dg(c.data_digest));
        text::push(
            &mut t,
            "MaxRecvDataSegmentLength",
            &c.max_recv_data_segment.to_string(),
        );
        if c.target_name.is_some() {
            text::push(
                &mut t,
                "InitialR2T",
                if c.initial_r2t { "Yes" } else { "No" },
            );
            text::push(
                &mut t,
                "ImmediateData",
                if c.immediate_data { "Yes" } else { "No" },
            );
            text::push(&mut t, "MaxBurstLength", &c.max_burst.to_string());
            text::push(&mut t, "FirstBurstLength", &c.first_burst.to_string());
            text::push(
                &mut t,
                "MaxOutstandingR2T",
                &c.max_outstanding_r2t.to_string(),
            );
            text::push(&mut t, "MaxConnections", "1");
            text::push(&mut t, "DataPDUInOrder", "Yes");
            text::push(&mut t, "DataSequenceInOrder", "Yes");
            text::push(&mut t, "DefaultTime2Wait", "2");
            text::push(&mut t, "DefaultTime2Retain", "0");
        }
        text::push(&mut t, "ErrorRecoveryLevel", "0");
        self.request(t)
    }

    /// Handles a Login Response with its text.
    pub fn handle(&mut self, resp: &LoginResp, data: &[u8]) -> Result<LoginProgress, LoginError> {
        if !resp.status.is_success() {
            return Err(LoginError::Refused(resp.status));
        }
        if resp.itt != self.itt || resp.isid != self.cfg.isid {
            return Err(LoginError::Protocol(
                "response does not match the request".into(),
            ));
        }
        let pairs = text::parse(data).map_err(|e| LoginError::Protocol(e.to_string()))?;
        if resp.csg == stage::SECURITY && !self.operational_sent {
            self.rounds += 1;
            if self.rounds > 8 {
                return Err(LoginError::Protocol(
                    "target does not complete the security stage".into(),
                ));
            }
            return self.security(resp, &pairs);
        }
        for (k, v) in pairs {
            self.answer(&k, &v)?;
            self.answered.push(k);
        }
        self.rounds += 1;
        if resp.transit && resp.nsg == stage::FULL_FEATURE {
            let p = &mut self.params;
            p.first_burst = p.first_burst.min(p.max_burst);
            return Ok(LoginProgress::Done(Box::new(Negotiated {
                params: self.params.clone(),
                tsih: resp.tsih,
                cmd_sn: resp.sn.exp_cmd_sn,
                exp_stat_sn: resp.sn.stat_sn.next(),
                max_cmd_sn: resp.sn.max_cmd_sn,
                tpgt: self.tpgt,
            })));
        }
        if self.rounds > 8 {
            return Err(LoginError::Protocol(
                "target does not complete the login".into(),
            ));
        }
        // The target wants another round: ask again to move on.
        Ok(LoginProgress::Send(self.request(Vec::new()).0, Vec::new()))
    }

    /// Handles a security-stage response.
    fn security(
        &mut self,
        resp: &LoginResp,
        pairs: &[(String, String)],
    ) -> Result<LoginProgress, LoginError> {
        let proto = |m: &str| Err(LoginError::Protocol(m.to_string()));
        let get = |k: &str| pairs.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
        for (k, v) in pairs {
            if k == "TargetPortalGroupTag" {
                self.answer(k, v)?;
            }
        }
        let mut t = Vec::new();
        match self.auth {
            Auth::Offered => match get("AuthMethod") {
                Some("CHAP") => {
                    text::push(&mut t, "CHAP_A", "5");
                    self.auth = Auth::WaitChallenge;
                }
                Some("None") if self.cfg.mutual.is_none() => self.auth = Auth::Done,
                Some(m) => return proto(&format!("target chose AuthMethod {m:?}")),
                None => return proto("target did not answer AuthMethod"),
            },
            Auth::WaitChallenge => {
                let (Some(a), Some(i), Some(c)) = (get("CHAP_A"), get("CHAP_I"), get("CHAP_C"))
                else {
                    return proto("target sent no CHAP challenge");
                };
                if a.parse::<u32>() != Ok(chap::ALGORITHM_MD5) {
                    return proto("target chose a CHAP algorithm other than MD5");
                }
                let (Some(id), Some(challenge)) = (chap::parse_id(i), chap::decode_binary(c))
                else {
                    return proto("malformed CHAP_I or CHAP_C");
                };
                let Some(cred) = &self.cfg.chap else {
                    return proto("no CHAP credentials");
                };
                if let Some(m) = &self.cfg.mutual {
                    if m.secret == cred.secret {
                        return proto("identical CHAP secrets in both directions refused");
                    }
                    if m.challenge == challenge {
                        return proto("target reflected our CHAP challenge");
                    }
                }
                text::push(&mut t, "CHAP_N", &cred.user);
                let r = chap::response(id, &cred.secret, &challenge);
                text::push(&mut t, "CHAP_R", &chap::encode_hex(&r));
                if let Some(m) = &self.cfg.mutual {
                    text::push(&mut t, "CHAP_I", &m.id.to_string());
                    text::push(&mut t, "CHAP_C", &chap::encode_hex(&m.challenge));
                }
                self.auth = Auth::WaitTarget;
                return Ok(LoginProgress::Send(
                    self.request_at(stage::SECURITY, true, Vec::new()).0,
                    t,
                ));
            }
            Auth::WaitTarget => {
                if let Some(m) = &self.cfg.mutual {
                    if !self.target_proved {
                        let (Some(n), Some(r)) = (get("CHAP_N"), get("CHAP_R")) else {
                            return proto("target did not answer our CHAP challenge");
                        };
                        let want = chap::response(m.id, &m.secret, &m.challenge);
                        let name_ok = m
                            .user
                            .as_deref()
                            .is_none_or(|u| chap::ct_eq(u.as_bytes(), n.as_bytes()));
                        let r = chap::decode_binary(r).unwrap_or_default();
                        if !(name_ok & chap::ct_eq(&r, &want)) {
                            return proto("target failed mutual CHAP authentication");
                        }
                        self.target_proved = true;
                    }
                }
                self.auth = Auth::Done;
            }
            Auth::Done | Auth::Skipped => {}
        }
        if self.auth == Auth::Done {
            if resp.transit && resp.nsg == stage::OPERATIONAL {
                return Ok(self.operational_progress());
            }
            return Ok(LoginProgress::Send(
                self.request_at(stage::SECURITY, true, Vec::new()).0,
                Vec::new(),
            ));
        }
        Ok(LoginProgress::Send(
            self.request_at(stage::SECURITY, false, Vec::new()).0,
            t,
        ))
    }

    fn operational_progress(&mut self) -> LoginProgress {
        let (req, body) = self.operational(Vec::new());
        LoginProgress::Send(req, body)
    }

    fn answer(&mut self, k: &str, v: &str) -> Result<(), LoginError> {
        let p = &mut self.params;
        let num = |v: &str| -> Result<u32, LoginError> {
            v.parse::<u32>()
                .map_err(|_| LoginError::Protocol(format!("bad value {v:?} for {k}")))
        };
        match (k, v) {
            (_, "Reject") => return Err(LoginError::Protocol(format!("target rejected {k}"))),
            (_, "NotUnderstood" | "Irrelevant") => {}
            ("HeaderDigest", v) => p.header_digest = v == "CRC32C",
            ("DataDigest", v) => p.data_digest = v == "CRC32C",
            ("MaxRecvDataSegmentLength", v) => {
                p.send_max_data_segment = num(v)?.clamp(512, (1 << 24) - 1)
            }
            ("MaxBurstLength", v) => p.max_burst = num(v)?.clamp(512, (1 << 24) - 1),
            ("FirstBurstLength", v) => p.first_burst = num(v)?.clamp(512, (1 << 24) - 1),
            ("MaxOutstandingR2T", v) => p.max_outstanding_r2t = num(v)?.clamp(1, 65535) as u16,
            ("InitialR2T", v) => p.initial_r2t = v == "Yes",
            ("ImmediateData", v) => p.immediate_data = v == "Yes",
            ("ErrorRecoveryLevel", v) => p.error_recovery_level = num(v)?.min(2) as u8,
            ("TargetPortalGroupTag", v) => self.tpgt = Some(num(v)?.min(65535) as u16),
            _ => {}
        }
        Ok(())
    }
}
