//! iSCSI protocol logic for the target role, free of sockets, threads and
//! clocks ("sans-IO", as quinn-proto): inputs are PDUs, outputs are PDUs
//! written to an [`iscsi_wire::Outbox`] and events for the driver.
//!
//! * [`params`]: the operational parameters (RFC 7143 §13) and our limits.
//! * [`login`]: the login phase — stages, key negotiation, status classes
//!   (§6, §11.12–11.13).
//! * [`session`]: the full feature phase of one connection — CmdSN window,
//!   immediate/unsolicited data and R2T, Data-In with status, NOP, task
//!   management, logout, text (§4.2, §11).
//! * [`chap`]: CHAP with MD5 — responses, encodings, redacted secrets.
//! * [`discovery`]: SendTargets answers (§13 Appendix C).

pub mod chap;
pub mod discovery;
pub mod initiator;
pub mod login;
pub mod params;
pub mod session;
mod tags;

pub use login::{LoginOutcome, LoginStep, TargetDirectory, TargetInfo, TargetLogin};
pub use params::{DigestPolicy, Limits, SessionParams, SessionType};
pub use session::{Event, ExecRequest, Session, TmfAction};
