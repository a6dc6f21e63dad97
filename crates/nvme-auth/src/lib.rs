//! NVMe in-band authentication with DH-HMAC-CHAP, sans-IO (NVM Express
//! Base Specification 2.0 §8.13 "NVMe in-band authentication", §8.13.5
//! "DH-HMAC-CHAP protocol"; the Fabrics commands "Authentication Send"
//! (fctype 05h) and "Authentication Receive" (fctype 06h), SECP E9h).
//!
//! # What is here
//! - [`Secret`]: the `DHHC-1:xx:<base64>:` representation of a secret (a
//!   32, 48 or 64-byte key and its CRC-32), and its transformation
//!   (§8.13.5.7): with `xx` naming SHA-256/384/512, the key used is
//!   HMAC(secret, NQN ‖ "NVMe-over-Fabrics"); with `00`, the secret itself.
//! - [`Controller`]: one queue's transaction as the controller runs it.
//! - [`HostTransaction`]: the host's side, for ironsan's own initiator.
//!
//! # The transaction (one per queue, after its Connect)
//! ```text
//!  host                                   controller
//!  Connect                  ───────────▶  result DW0 bit 17 (ATR): authenticate
//!  AUTH_Negotiate (Send)    ───────────▶  picks a hash and the DH group
//!  (Receive)                ◀───────────  DH-HMAC-CHAP_Challenge: C1, S1
//!  DH-HMAC-CHAP_Reply (Send)───────────▶  checks R1; C2, S2 if bidirectional
//!  (Receive)                ◀───────────  DH-HMAC-CHAP_Success1 [R2]
//!  DH-HMAC-CHAP_Success2    ───────────▶  (bidirectional only)
//! ```
//! R1 = HMAC(K'host, C1 ‖ S1 ‖ T_ID ‖ 00h ‖ "HostHost" ‖ NQNhost ‖ 00h ‖
//! NQNsubsys) and R2 = HMAC(K'ctrl, C2 ‖ S2 ‖ T_ID ‖ 00h ‖ "Controller" ‖
//! NQNsubsys ‖ 00h ‖ NQNhost), with the negotiated hash; sequence numbers
//! little-endian 32 bits, T_ID 16. A failed check answers the next
//! Authentication Receive with AUTH_Failure1 and the controller ends the
//! association (the host cannot try another secret on it). Until a queue is
//! authenticated, every command on it but Authentication Send/Receive and
//! Disconnect gets Authentication Required (SCT 1h, SC 91h).
//!
//! Only the NULL DH group is served: the challenges are used as they are
//! (no ephemeral Diffie-Hellman exchange). This is the group Linux's nvmet
//! uses unless configured otherwise, and Linux's host offers it.

use hmac::{Hmac, Mac};
use sha2::{Sha256, Sha384, Sha512};

/// Security protocol of NVMe in-band authentication.
pub const SECP: u8 = 0xe9;
/// SPSP0 and SPSP1 of the DH-HMAC-CHAP protocol.
pub const SPSP0: u8 = 0x01;
pub const SPSP1: u8 = 0x01;
/// Fabrics command types.
pub const FCTYPE_SEND: u8 = 0x05;
pub const FCTYPE_RECEIVE: u8 = 0x06;
/// Connect response DW0: authentication transaction required (ATR).
pub const AUTHREQ_ATR: u32 = 1 << 17;
/// Authentication Required: status code type 1h, status code 91h.
pub const AUTH_REQUIRED: (u8, u8) = (0x1, 0x91);
/// Largest message either side sends or accepts (Linux uses 4096).
pub const MAX_MESSAGE: usize = 4096;

const TYPE_COMMON: u8 = 0x00;
const TYPE_DHCHAP: u8 = 0x01;
const ID_NEGOTIATE: u8 = 0x00;
const ID_CHALLENGE: u8 = 0x01;
const ID_REPLY: u8 = 0x02;
const ID_SUCCESS1: u8 = 0x03;
const ID_SUCCESS2: u8 = 0x04;
const ID_FAILURE2: u8 = 0xf0;
const ID_FAILURE1: u8 = 0xf1;
/// The DH-HMAC-CHAP protocol descriptor's AUTHID.
const AUTHID_DHCHAP: u8 = 0x01;
/// The NULL DH group.
const DHGROUP_NULL: u8 = 0x00;
/// AUTH_Negotiate: 8-byte header and one 64-byte protocol descriptor.
const NEGOTIATE_LEN: usize = 72;

/// A hash function of DH-HMAC-CHAP (its identifier is the enum value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hash {
    Sha256 = 1,
    Sha384 = 2,
    Sha512 = 3,
}

impl Hash {
    /// The hash of identifier `id`.
    pub fn from_id(id: u8) -> Option<Hash> {
        match id {
            1 => Some(Hash::Sha256),
            2 => Some(Hash::Sha384),
            3 => Some(Hash::Sha512),
            _ => None,
        }
    }

    /// The digest length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
            Hash::Sha512 => 64,
        }
    }

    /// HMAC of the concatenation of `parts` under `key`.
    pub fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            let mut m = <M as hmac::digest::KeyInit>::new_from_slice(key)
                .expect("HMAC takes keys of any length");
            for p in parts {
                m.update(p);
            }
            m.finalize().into_bytes().to_vec()
        }
        match self {
            Hash::Sha256 => run::<Hmac<Sha256>>(key, parts),
            Hash::Sha384 => run::<Hmac<Sha384>>(key, parts),
            Hash::Sha512 => run::<Hmac<Sha512>>(key, parts),
        }
    }
}

/// Why a `DHHC-1` secret was refused (the secret itself is never shown).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("not of the form DHHC-1:xx:<base64>:")]
    Form,
    #[error("the transformation hash must be 00, 01, 02 or 03")]
    Transform,
    #[error("not valid base64")]
    Base64,
    #[error("the key must be 32, 48 or 64 bytes (with its CRC-32: 36, 52 or 68)")]
    Length,
    #[error("the CRC-32 does not match the key")]
    Crc,
}

/// A DH-HMAC-CHAP secret (module docs). Shown nowhere: `Debug` prints no
/// byte of it, and its memory is cleared when dropped.
pub struct Secret {
    key: Vec<u8>,
    transform: Option<Hash>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(redacted)")
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        for b in self.key.iter_mut() {
            // SAFETY: `b` is a valid, aligned, exclusive reference; a
            // volatile write keeps the clearing from being optimised away.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

impl Secret {
    /// Parses `DHHC-1:xx:<base64 of key ‖ CRC-32 LE>:`.
    pub fn parse(text: &str) -> Result<Secret, SecretError> {
        use base64::Engine;
        let rest = text
            .trim()
            .strip_prefix("DHHC-1:")
            .ok_or(SecretError::Form)?;
        let (xx, rest) = rest.split_once(':').ok_or(SecretError::Form)?;
        let b64 = rest.strip_suffix(':').ok_or(SecretError::Form)?;
        if xx.len() != 2 || b64.is_empty() || b64.contains(':') {
            return Err(SecretError::Form);
        }
        let transform = match xx {
            "00" => None,
            _ => Some(
                xx.parse::<u8>()
                    .ok()
                    .and_then(Hash::from_id)
                    .ok_or(SecretError::Transform)?,
            ),
        };
        if b64.len() > 128 {
            return Err(SecretError::Length);
        }
        let mut raw = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| SecretError::Base64)?;
        if !matches!(raw.len(), 36 | 52 | 68) {
            return Err(SecretError::Length);
        }
        let n = raw.len() - 4;
        let crc = u32::from_le_bytes(raw[n..].try_into().expect("4 bytes"));
        if crc32fast::hash(&raw[..n]) != crc {
            return Err(SecretError::Crc);
        }
        raw.truncate(n);
        Ok(Secret {
            key: raw,
            transform,
        })
    }

    /// The `DHHC-1` representation of `key` (32, 48 or 64 bytes) with
    /// transformation `transform`, as `nvme gen-dhchap-key` prints it.
    pub fn represent(key: &[u8], transform: Option<Hash>) -> String {
        use base64::Engine;
        let mut raw = key.to_vec();
        raw.extend_from_slice(&crc32fast::hash(key).to_le_bytes());
        let xx = transform.map_or(0, |h| h as u8);
        format!(
            "DHHC-1:{xx:02}:{}:",
            base64::engine::general_purpose::STANDARD.encode(&raw)
        )
    }

    /// The key the responses are computed with, for the party named `nqn`
    /// (the host's NQN for the host secret, the subsystem's for the
    /// controller secret).
    pub fn transformed(&self, nqn: &str) -> Vec<u8> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => h.hmac(&self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}

/// The secrets a controller checks a host with: the host's, and the
/// controller's own for bidirectional authentication.
#[derive(Debug)]
pub struct Keys {
    pub host: Secret,
    pub ctrl: Option<Secret>,
}

/// AUTH_Failure reason code explanations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Failed = 1,
    NotUsable = 2,
    ConcatMismatch = 3,
    HashUnusable = 4,
    DhgroupUnusable = 5,
    IncorrectPayload = 6,
    IncorrectMessage = 7,
}

impl Reason {
    fn from_code(c: u8) -> Reason {
        match c {
            2 => Reason::NotUsable,
            3 => Reason::ConcatMismatch,
            4 => Reason::HashUnusable,
            5 => Reason::DhgroupUnusable,
            6 => Reason::IncorrectPayload,
            7 => Reason::IncorrectMessage,
            _ => Reason::Failed,
        }
    }
}

fn header(kind: u8, id: u8, t_id: u16, len: usize) -> Vec<u8> {
    let mut m = vec![0u8; len];
    m[0] = kind;
    m[1] = id;
    m[4..6].copy_from_slice(&t_id.to_le_bytes());
    m
}

fn t_id_of(m: &[u8]) -> u16 {
    u16::from_le_bytes([m[4], m[5]])
}

fn le32(m: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(m[at..at + 4].try_into().expect("4 bytes"))
}

/// Equality in time independent of where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// R1, the host's response.
fn host_response(
    key: &[u8],
    h: Hash,
    c1: &[u8],
    s1: u32,
    t_id: u16,
    hostnqn: &str,
    subnqn: &str,
) -> Vec<u8> {
    h.hmac(
        key,
        &[
            c1,
            &s1.to_le_bytes(),
            &t_id.to_le_bytes(),
            &[0],
            b"HostHost",
            hostnqn.as_bytes(),
            &[0],
            subnqn.as_bytes(),
        ],
    )
}

/// R2, the controller's response (bidirectional authentication).
fn ctrl_response(
    key: &[u8],
    h: Hash,
    c2: &[u8],
    s2: u32,
    t_id: u16,
    hostnqn: &str,
    subnqn: &str,
) -> Vec<u8> {
    h.hmac(
        key,
        &[
            c2,
            &s2.to_le_bytes(),
            &t_id.to_le_bytes(),
            &[0],
            b"Controller",
            subnqn.as_bytes(),
            &[0],
            hostnqn.as_bytes(),
        ],
    )
}

/// Checks an Authentication Send/Receive command's CDW10 (SECP, SPSP0,
/// SPSP1) and its transfer or allocation length (CDW11): the length, or
/// `None` for Invalid Field in Command.
pub fn check_command(cdw10: u32, cdw11: u32) -> Option<usize> {
    let b = cdw10.to_le_bytes();
    let len = cdw11 as usize;
    (b[1] == SPSP0 && b[2] == SPSP1 && b[3] == SECP && (1..=MAX_MESSAGE).contains(&len))
        .then_some(len)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Waiting for AUTH_Negotiate.
    Negotiate,
    /// The Challenge is to be received.
    Challenge,
    /// Waiting for the Reply.
    Reply,
    /// Success1 is to be received.
    Success1,
    /// Waiting for Success2 (bidirectional).
    Success2,
    /// Failure1 is to be received, then the association ends.
    Failure1(Reason),
    Done,
}

/// Why an Authentication Receive cannot be answered now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfSequence;

/// One queue's authentication as the controller runs it (module docs).
#[derive(Debug)]
pub struct Controller {
    keys: std::sync::Arc<Keys>,
    hostnqn: String,
    subnqn: String,
    step: Step,
    t_id: u16,
    hash: Hash,
    c1: Vec<u8>,
    s1: u32,
    /// The host's challenge and sequence number (bidirectional).
    c2: Option<(Vec<u8>, u32)>,
    authenticated: bool,
    fatal: bool,
}

impl Controller {
    /// A transaction for host `hostnqn` on subsystem `subnqn`.
    pub fn new(keys: std::sync::Arc<Keys>, hostnqn: &str, subnqn: &str) -> Controller {
        Controller {
            keys,
            hostnqn: hostnqn.to_owned(),
            subnqn: subnqn.to_owned(),
            step: Step::Negotiate,
            t_id: 0,
            hash: Hash::Sha256,
            c1: Vec::new(),
            s1: 0,
            c2: None,
            authenticated: false,
            fatal: false,
        }
    }

    /// Whether the queue may carry other commands.
    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// Whether AUTH_Failure1 was sent: the association must end.
    pub fn fatal(&self) -> bool {
        self.fatal
    }

    fn fail(&mut self, r: Reason) {
        self.authenticated = false;
        self.step = Step::Failure1(r);
    }

    /// An Authentication Send's message. Protocol failures are not command
    /// errors: they are told by the next Authentication Receive.
    pub fn send(&mut self, m: &[u8]) {
        if m.len() < 8 {
            return self.fail(Reason::IncorrectPayload);
        }
        match (m[0], m[1]) {
            // A Negotiate restarts the transaction at any step.
            (TYPE_COMMON, ID_NEGOTIATE) => self.negotiate(m),
            (TYPE_COMMON, ID_FAILURE2) => {
                // The host gave up (e.g. our R2 did not check out): it
                // will not use the queue.
                self.authenticated = false;
                self.step = Step::Negotiate;
            }
            (TYPE_DHCHAP, ID_REPLY) if self.step == Step::Reply => self.reply(m),
            (TYPE_DHCHAP, ID_SUCCESS2) if self.step == Step::Success2 => {
                if m.len() < 16 || t_id_of(m) != self.t_id {
                    return self.fail(Reason::IncorrectPayload);
                }
                self.authenticated = true;
                self.step = Step::Done;
            }
            _ => self.fail(Reason::IncorrectMessage),
        }
    }

    fn negotiate(&mut self, m: &[u8]) {
        // A queue re-authenticating (the host's key changed: Linux runs a
        // new transaction on every live queue) keeps serving its commands
        // meanwhile; only a failed transaction takes that away.
        self.c2 = None;
        if m.len() < NEGOTIATE_LEN {
            return self.fail(Reason::IncorrectPayload);
        }
        self.t_id = t_id_of(m);
        if m[6] != 0 {
            // Secure channel concatenation (TLS) is not served.
            return self.fail(Reason::ConcatMismatch);
        }
        if m[7] != 1 {
            return self.fail(Reason::HashUnusable);
        }
        let d = &m[8..NEGOTIATE_LEN];
        let (halen, dhlen) = (usize::from(d[2]), usize::from(d[3]));
        if d[0] != AUTHID_DHCHAP || halen > 30 || dhlen > 30 {
            return self.fail(Reason::IncorrectPayload);
        }
        let hashes: Vec<Hash> = d[4..4 + halen]
            .iter()
            .filter_map(|&i| Hash::from_id(i))
            .collect();
        let Some(&h) = hashes
            .iter()
            .find(|&&h| h == Hash::Sha256)
            .or(hashes.first())
        else {
            return self.fail(Reason::HashUnusable);
        };
        if !d[34..34 + dhlen].contains(&DHGROUP_NULL) {
            return self.fail(Reason::DhgroupUnusable);
        }
        self.hash = h;
        self.step = Step::Challenge;
    }

    fn reply(&mut self, m: &[u8]) {
        let hl = self.hash.digest_len();
        if m.len() < 16 + 2 * hl || usize::from(m[6]) != hl || t_id_of(m) != self.t_id {
            return self.fail(Reason::IncorrectPayload);
        }
        if u16::from_le_bytes([m[10], m[11]]) != 0 {
            // A DH value with the NULL group.
            return self.fail(Reason::IncorrectPayload);
        }
        let key = self.keys.host.transformed(&self.hostnqn);
        let want = host_response(
            &key,
            self.hash,
            &self.c1,
            self.s1,
            self.t_id,
            &self.hostnqn,
            &self.subnqn,
        );
        if !same(&m[16..16 + hl], &want) {
            return self.fail(Reason::Failed);
        }
        let s2 = le32(m, 12);
        if m[8] != 0 && s2 != 0 {
            if self.keys.ctrl.is_none() {
                // The host asks us to prove ourselves with a secret we
                // were not given.
                return self.fail(Reason::Failed);
            }
            self.c2 = Some((m[16 + hl..16 + 2 * hl].to_vec(), s2));
        } else {
            self.authenticated = true;
        }
        self.step = Step::Success1;
    }

    /// An Authentication Receive of `al` bytes: the message due, padded
    /// with zeros to `al`. `random` fills the challenge's bytes (C1, then
    /// the four of S1).
    pub fn receive(
        &mut self,
        al: usize,
        random: &mut dyn FnMut(&mut [u8]),
    ) -> Result<Vec<u8>, OutOfSequence> {
        let hl = self.hash.digest_len();
        let mut m = match self.step {
            Step::Challenge => {
                let mut c = vec![0u8; hl + 4];
                random(&mut c);
                let mut s1 = le32(&c, hl);
                if s1 == 0 {
                    s1 = 1;
                }
                c.truncate(hl);
                let mut m = header(TYPE_DHCHAP, ID_CHALLENGE, self.t_id, 16 + hl);
                m[6] = hl as u8;
                m[8] = self.hash as u8;
                m[9] = DHGROUP_NULL;
                m[12..16].copy_from_slice(&s1.to_le_bytes());
                m[16..].copy_from_slice(&c);
                self.c1 = c;
                self.s1 = s1;
                self.step = Step::Reply;
                m
            }
            Step::Success1 => {
                let mut m = header(TYPE_DHCHAP, ID_SUCCESS1, self.t_id, 16 + hl);
                m[6] = hl as u8;
                match (&self.c2, &self.keys.ctrl) {
                    (Some((c2, s2)), Some(k)) => {
                        let key = k.transformed(&self.subnqn);
                        let r2 = ctrl_response(
                            &key,
                            self.hash,
                            c2,
                            *s2,
                            self.t_id,
                            &self.hostnqn,
                            &self.subnqn,
                        );
                        m[8] = 1;
                        m[16..].copy_from_slice(&r2);
                        self.step = Step::Success2;
                    }
                    _ => self.step = Step::Done,
                }
                m
            }
            Step::Failure1(r) => {
                let mut m = header(TYPE_COMMON, ID_FAILURE1, self.t_id, 8);
                m[6] = 0x01;
                m[7] = r as u8;
                self.fatal = true;
                self.step = Step::Negotiate;
                m
            }
            _ => return Err(OutOfSequence),
        };
        m.resize(al.max(m.len()).min(MAX_MESSAGE), 0);
        m.truncate(al);
        Ok(m)
    }
}

/// Why the host's transaction failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("the controller refused: AUTH_Failure1, reason {0:?}")]
    Refused(Reason),
    #[error("the controller's message is malformed or unexpected")]
    Payload,
    #[error("the controller chose a DH group other than NULL, which this host does not serve")]
    DhGroup,
    #[error(
        "the controller's response (R2) does not check out: it does not know the controller secret"
    )]
    ControllerNotAuthenticated,
}

/// The host's side of one queue's transaction (ironsan's initiator).
pub struct HostTransaction<'a> {
    pub key: &'a Secret,
    /// The controller secret, for bidirectional authentication.
    pub ctrl_key: Option<&'a Secret>,
    pub hostnqn: &'a str,
    pub subnqn: &'a str,
    pub t_id: u16,
    hash: Option<Hash>,
    c2: Vec<u8>,
    s2: u32,
}

impl<'a> HostTransaction<'a> {
    pub fn new(
        key: &'a Secret,
        ctrl_key: Option<&'a Secret>,
        hostnqn: &'a str,
        subnqn: &'a str,
        t_id: u16,
    ) -> Self {
        HostTransaction {
            key,
            ctrl_key,
            hostnqn,
            subnqn,
            t_id,
            hash: None,
            c2: Vec::new(),
            s2: 0,
        }
    }

    /// AUTH_Negotiate: DH-HMAC-CHAP with SHA-256, 384 or 512, NULL group.
    pub fn negotiate(&self) -> Vec<u8> {
        let mut m = header(TYPE_COMMON, ID_NEGOTIATE, self.t_id, NEGOTIATE_LEN);
        m[7] = 1; // NAPD
        m[8] = AUTHID_DHCHAP;
        m[10] = 3; // HALEN
        m[11] = 1; // DHLEN
        m[12..15].copy_from_slice(&[1, 2, 3]);
        m[42] = DHGROUP_NULL;
        m
    }

    fn check_failure(m: &[u8]) -> Result<(), HostError> {
        if m.len() >= 8 && m[0] == TYPE_COMMON && m[1] == ID_FAILURE1 {
            return Err(HostError::Refused(Reason::from_code(m[7])));
        }
        Ok(())
    }

    /// The Reply to the controller's Challenge `m`; `random` fills the
    /// host's own challenge C2 and S2 when a controller secret is set.
    pub fn reply(
        &mut self,
        m: &[u8],
        random: &mut dyn FnMut(&mut [u8]),
    ) -> Result<Vec<u8>, HostError> {
        Self::check_failure(m)?;
        if m.len() < 16 || m[0] != TYPE_DHCHAP || m[1] != ID_CHALLENGE || t_id_of(m) != self.t_id {
            return Err(HostError::Payload);
        }
        let h = Hash::from_id(m[8]).ok_or(HostError::Payload)?;
        let hl = h.digest_len();
        if usize::from(m[6]) != hl || m.len() < 16 + hl {
            return Err(HostError::Payload);
        }
        if m[9] != DHGROUP_NULL || u16::from_le_bytes([m[10], m[11]]) != 0 {
            return Err(HostError::DhGroup);
        }
        let (c1, s1) = (&m[16..16 + hl], le32(m, 12));
        let key = self.key.transformed(self.hostnqn);
        let r1 = host_response(&key, h, c1, s1, self.t_id, self.hostnqn, self.subnqn);
        let mut out = header(TYPE_DHCHAP, ID_REPLY, self.t_id, 16 + 2 * hl);
        out[6] = hl as u8;
        out[16..16 + hl].copy_from_slice(&r1);
        if self.ctrl_key.is_some() {
            let mut c = vec![0u8; hl + 4];
            random(&mut c);
            self.s2 = le32(&c, hl).max(1);
            c.truncate(hl);
            out[8] = 1; // CVALID
            out[12..16].copy_from_slice(&self.s2.to_le_bytes());
            out[16 + hl..].copy_from_slice(&c);
            self.c2 = c;
        }
        self.hash = Some(h);
        Ok(out)
    }

    /// Checks Success1 `m`: the Success2 to send (bidirectional), or none.
    pub fn success1(&self, m: &[u8]) -> Result<Option<Vec<u8>>, HostError> {
        Self::check_failure(m)?;
        let h = self.hash.ok_or(HostError::Payload)?;
        let hl = h.digest_len();
        if m.len() < 16 || m[0] != TYPE_DHCHAP || m[1] != ID_SUCCESS1 || t_id_of(m) != self.t_id {
            return Err(HostError::Payload);
        }
        let Some(k) = self.ctrl_key else {
            return Ok(None);
        };
        if m[8] == 0 || m.len() < 16 + hl || usize::from(m[6]) != hl {
            return Err(HostError::ControllerNotAuthenticated);
        }
        let key = k.transformed(self.subnqn);
        let want = ctrl_response(
            &key,
            h,
            &self.c2,
            self.s2,
            self.t_id,
            self.hostnqn,
            self.subnqn,
        );
        if !same(&m[16..16 + hl], &want) {
            return Err(HostError::ControllerNotAuthenticated);
        }
        Ok(Some(header(TYPE_DHCHAP, ID_SUCCESS2, self.t_id, 16)))
    }

    /// AUTH_Failure2, when the host gives up on the controller.
    pub fn failure2(&self, r: Reason) -> Vec<u8> {
        let mut m = header(TYPE_COMMON, ID_FAILURE2, self.t_id, 8);
        m[6] = 0x01;
        m[7] = r as u8;
        m
    }
}

#[cfg(test)]
mod tests;
