//! ironsan's userspace iSCSI initiator: drives LUNs of any iSCSI target
//! with no kernel help.
//!
//! [`Connection`] is one logged-in TCP connection (one session) over a
//! blocking socket, driving the sans-IO [`iscsi_proto::initiator`] state
//! machine: [`Connection::submit`] queues commands up to the target's
//! command window, [`Connection::wait`] sends everything queued in one
//! vectored write and gathers completions from as many PDUs as one read
//! returns. [`Url`] parses libiscsi's `iscsi://` URLs; [`scsi`] builds and
//! parses the SCSI commands the tools need.

mod conn;
pub mod nvme;
pub mod scsi;
mod url;

pub use conn::{discover, discover_with, Connection, Error};
pub use iscsi_proto::initiator::{DataDir, LoginConfig, TaskResult};
pub use url::Url;

/// The initiator name used when none is given.
pub const DEFAULT_INITIATOR: &str = "iqn.2026-11.io.ironsan:initiator";

/// Bytes from the OS random source (`getrandom`, for CHAP challenges and
/// ISIDs). Panics if the OS has none to give: a challenge must never be
/// predictable.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the OS random source");
    b
}

/// A random ISID of the "random" type (RFC 7143 §11.12.5, T=10b).
pub fn random_isid() -> [u8; 6] {
    let mut b = random_bytes::<6>();
    b[0] = 0x80;
    b
}
