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
pub mod scsi;
mod url;

pub use conn::{discover, discover_with, Connection, Error};
pub use iscsi_proto::initiator::{DataDir, LoginConfig, TaskResult};
pub use url::Url;

/// The initiator name used when none is given.
pub const DEFAULT_INITIATOR: &str = "iqn.2026-11.io.ironsan:initiator";

/// Bytes from the OS random source (for CHAP challenges). Panics if
/// `/dev/urandom` cannot be read: a challenge must never be predictable.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    use std::io::Read;
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("reading /dev/urandom");
    b
}

/// A random ISID of the "random" type (RFC 7143 §11.12.5, T=10b).
pub fn random_isid() -> [u8; 6] {
    let mut b = [0u8; 6];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b[1..]);
    } else {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        b[1..].copy_from_slice(&t.subsec_nanos().to_be_bytes()[..4].repeat(2)[..5]);
    }
    b[0] = 0x80;
    b
}
