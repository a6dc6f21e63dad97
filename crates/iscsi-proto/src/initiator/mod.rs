//! The initiator role (RFC 7143): login negotiation from the initiator's
//! side and the full feature phase of one connection — CmdSN window
//! tracking, commands with immediate and unsolicited data, answering R2Ts,
//! gathering Data-In, NOP-In answers, task management and logout.
//!
//! Like the target role, nothing here touches sockets or clocks: requests
//! are written into an [`iscsi_wire::Outbox`], received PDUs are fed in,
//! and results come back as [`session::InitiatorEvent`]s.

pub mod login;
pub mod session;

pub use login::{InitiatorLogin, LoginConfig, LoginError, LoginProgress, MutualChap, Negotiated};
pub use session::{DataDir, InitiatorEvent, InitiatorSession, TaskResult};
