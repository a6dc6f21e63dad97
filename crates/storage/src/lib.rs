//! Block backends: where a LUN's bytes live.
//!
//! # The contract every [`BlockBackend`] keeps
//!
//! * **Addressing.** Offsets and lengths are in bytes; callers (the SCSI
//!   layer) only issue whole logical blocks inside [`BlockBackend::size`].
//! * **Ordering.** Calls may run concurrently from several threads. Two
//!   overlapping writes that are in flight at once land in an unspecified
//!   order, exactly as on a disk; a read issued after a write *completed*
//!   sees that write. Nothing is reordered across a completed call.
//! * **Durability.** When [`BlockBackend::write_cache`] is
//!   [`WriteCache::WriteThrough`], a write returns only once its data is on
//!   stable storage (the write is acknowledged = it survives power loss).
//!   With [`WriteCache::WriteBack`], a write may sit in a volatile cache
//!   until [`BlockBackend::flush`] returns, or is stable at once when `fua`
//!   is set. A backend that is not durable at all (RAM, null) says so in
//!   [`BlockBackend::volatile`], so that the SCSI layer reports it honestly
//!   and the CLI refuses to let it pass for user data.
//! * **Errors.** Every failure, including a failed flush, comes back as an
//!   `Err`; the SCSI layer turns it into sense data. A failed call is never
//!   reported as success.
//! * **Blocking.** [`BlockBackend::may_block`] tells the driver whether a
//!   call can wait on a device. Backends that never wait (RAM, null) run on
//!   the connection's event loop; others run on a pool of I/O threads, so a
//!   slow device never stalls parsing and serving other commands.

mod file;
mod mem;
mod null;

pub use file::FileBackend;
pub use mem::MemBackend;
pub use null::NullBackend;

use std::io;

/// The write cache policy a backend is running with (the Caching mode
/// page's WCE bit, SBC-3 §6.4.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteCache {
    /// Acknowledged writes are stable.
    WriteThrough,
    /// Writes may be cached until a flush or a FUA write.
    WriteBack,
}

/// A byte-addressed store with the contract in the module docs.
pub trait BlockBackend: Send + Sync + 'static {
    /// A short name of the backend kind (`mem`, `null`, `file`).
    fn kind(&self) -> &'static str;

    /// Capacity in bytes.
    fn size(&self) -> u64;

    /// Reads `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// Writes `buf` at `offset`; with `fua` the data is stable on return
    /// whatever the cache policy.
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()>;

    /// Makes every completed write stable.
    fn flush(&self) -> io::Result<()>;

    /// The cache policy in force.
    fn write_cache(&self) -> WriteCache;

    /// Switches the cache policy (MODE SELECT of the WCE bit). Backends
    /// that cannot switch return an error of kind `Unsupported`.
    fn set_write_cache(&self, policy: WriteCache) -> io::Result<()>;

    /// True when no write ever reaches stable storage (RAM, null).
    fn volatile(&self) -> bool {
        false
    }

    /// True when a call may wait on a device; see the module docs.
    fn may_block(&self) -> bool {
        true
    }
}

/// Checks that `len` bytes at `offset` lie inside a store of `size` bytes.
fn check_range(size: u64, offset: u64, len: usize) -> io::Result<()> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("range {offset}+{len} beyond capacity {size}"),
        )),
    }
}
