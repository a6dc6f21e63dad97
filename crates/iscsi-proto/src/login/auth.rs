//! The authentication exchange of the security stage, target side
//! (RFC 7143 §6.3.1, §12.1.3):
//!
//! ```text
//!   Open ──AuthMethod=None──► NoAuth                       (policy: none)
//!    │
//!    └──AuthMethod=CHAP──► WaitAlgorithm ──CHAP_A=5──► WaitResponse
//!                            (we answer CHAP_A, CHAP_I, CHAP_C)   │
//!                                    CHAP_N, CHAP_R [, CHAP_I, CHAP_C]
//!                                                                 ▼
//!                                                               Done
//! ```
//!
//! The initiator's response is checked before we answer a mutual
//! challenge, so a stranger cannot use the target to compute responses.
//! Any failure is status 0x0201 (authentication failure) and ends the
//! login; the reason never contains a secret or a response.

use crate::chap::{self, ChapPolicy, CHALLENGE_LEN};
use iscsi_wire::text;

use super::{Fail, LoginStatus};

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// No AuthMethod agreed yet.
    Open,
    /// AuthMethod=None agreed.
    NoAuth,
    /// AuthMethod=CHAP agreed, waiting for CHAP_A.
    WaitAlgorithm,
    /// Challenge sent, waiting for CHAP_N and CHAP_R.
    WaitResponse { id: u8, challenge: Vec<u8> },
    /// The initiator proved itself.
    Done,
}

/// Authentication state of one login.
#[derive(Debug)]
pub(super) struct Auth {
    pub policy: ChapPolicy,
    seed: Option<(u8, [u8; CHALLENGE_LEN])>,
    state: State,
}

fn fail<T>(why: impl Into<String>) -> Result<T, Fail> {
    Err(Fail(LoginStatus::AUTH_FAILED, why.into()))
}

/// A peer-supplied string made safe to log: quoted, at most 64 bytes.
fn shown(s: &str) -> String {
    let mut s = s.to_string();
    if s.len() > 64 {
        let mut cut = 64;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    format!("{s:?}")
}

impl Auth {
    pub fn new() -> Self {
        Auth {
            policy: ChapPolicy::default(),
            seed: None,
            state: State::Open,
        }
    }

    /// The CHAP identifier and challenge to send, from the caller's random
    /// source.
    pub fn seed(&mut self, id: u8, challenge: [u8; CHALLENGE_LEN]) {
        self.seed = Some((id, challenge));
    }

    /// True when the login may leave the security stage.
    pub fn complete(&self) -> bool {
        match self.state {
            State::Done => true,
            State::Open | State::NoAuth => self.policy.initiator.is_none(),
            State::WaitAlgorithm | State::WaitResponse { .. } => false,
        }
    }

    /// True while a CHAP exchange is under way (the target answers T=0).
    pub fn in_exchange(&self) -> bool {
        matches!(
            self.state,
            State::WaitAlgorithm | State::WaitResponse { .. }
        )
    }

    /// Handles the AuthMethod and CHAP_* keys of one security-stage
    /// request, appending our answers to `out`.
    pub fn handle(&mut self, keys: &[(String, String)], out: &mut Vec<u8>) -> Result<(), Fail> {
        let get = |k: &str| keys.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
        if let Some(v) = get("AuthMethod") {
            if self.state != State::Open {
                return Err(Fail(
                    LoginStatus::INITIATOR_ERROR,
                    "AuthMethod negotiated again".into(),
                ));
            }
            let offers: Vec<&str> = v.split(',').collect();
            if self.policy.initiator.is_some() {
                if !offers.contains(&"CHAP") {
                    return fail(format!("CHAP required; initiator offered {}", shown(v)));
                }
                text::push(out, "AuthMethod", "CHAP");
                self.state = State::WaitAlgorithm;
            } else if offers.contains(&"None") {
                text::push(out, "AuthMethod", "None");
                self.state = State::NoAuth;
            } else {
                return fail(format!("no acceptable AuthMethod in {}", shown(v)));
            }
        }
        let chap_keys = keys.iter().filter(|(k, _)| k.starts_with("CHAP_")).count();
        match std::mem::replace(&mut self.state, State::Open) {
            State::WaitAlgorithm => {
                self.state = State::WaitAlgorithm;
                let Some(a) = get("CHAP_A") else {
                    if chap_keys > 0 {
                        return fail("CHAP keys before CHAP_A");
                    }
                    return Ok(());
                };
                if chap_keys > 1 {
                    return fail("CHAP keys other than CHAP_A before the challenge");
                }
                let md5 = a
                    .split(',')
                    .any(|x| x.trim().parse::<u32>() == Ok(chap::ALGORITHM_MD5));
                if !md5 {
                    return fail(format!("CHAP_A={}: only 5 (MD5) is supported", shown(a)));
                }
                let Some((id, challenge)) = self.seed.take() else {
                    return Err(Fail(
                        LoginStatus::TARGET_ERROR,
                        "no CHAP challenge available".into(),
                    ));
                };
                text::push(out, "CHAP_A", "5");
                text::push(out, "CHAP_I", &id.to_string());
                text::push(out, "CHAP_C", &chap::encode_hex(&challenge));
                self.state = State::WaitResponse {
                    id,
                    challenge: challenge.to_vec(),
                };
            }
            State::WaitResponse { id, challenge } => {
                if chap_keys == 0 {
                    self.state = State::WaitResponse { id, challenge };
                    return Ok(());
                }
                self.verify(id, &challenge, &get, out)?;
                self.state = State::Done;
            }
            s => {
                self.state = s;
                if chap_keys > 0 {
                    return fail("CHAP keys without AuthMethod=CHAP");
                }
            }
        }
        Ok(())
    }

    fn verify<'a>(
        &self,
        id: u8,
        challenge: &[u8],
        get: &dyn Fn(&str) -> Option<&'a str>,
        out: &mut Vec<u8>,
    ) -> Result<(), Fail> {
        let (Some(name), Some(r)) = (get("CHAP_N"), get("CHAP_R")) else {
            return fail("CHAP_N and CHAP_R are required");
        };
        if get("CHAP_A").is_some() {
            return fail("CHAP_A sent twice");
        }
        let Some(cred) = &self.policy.initiator else {
            return fail("no CHAP credentials configured");
        };
        let Some(r) = chap::decode_binary(r) else {
            return fail("malformed CHAP_R");
        };
        let want = chap::response(id, &cred.secret, challenge);
        // Both comparisons always run: the time taken tells nothing.
        let name_ok = chap::ct_eq(name.as_bytes(), cred.user.as_bytes());
        let resp_ok = chap::ct_eq(&r, &want);
        if !(name_ok & resp_ok) {
            return fail(format!(
                "CHAP name or response wrong (name {})",
                shown(name)
            ));
        }
        match (get("CHAP_I"), get("CHAP_C")) {
            (None, None) => Ok(()),
            (Some(i), Some(c)) => {
                let Some(tc) = &self.policy.target else {
                    return fail("initiator asked for mutual CHAP; target has no credentials");
                };
                let Some(i) = chap::parse_id(i) else {
                    return fail("malformed CHAP_I");
                };
                let Some(c) = chap::decode_binary(c) else {
                    return fail("malformed CHAP_C");
                };
                if c == challenge {
                    return fail("reflected CHAP challenge");
                }
                text::push(out, "CHAP_N", &tc.user);
                let resp = chap::response(i, &tc.secret, &c);
                text::push(out, "CHAP_R", &chap::encode_hex(&resp));
                Ok(())
            }
            _ => fail("CHAP_I and CHAP_C must come together"),
        }
    }
}
