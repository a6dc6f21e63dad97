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
//! * **Durability.** When [`Caps::write_cache`] is
//!   [`WriteCache::WriteThrough`], a write returns only once its data is on
//!   stable storage (the write is acknowledged = it survives power loss).
//!   With [`WriteCache::WriteBack`], a write may sit in a volatile cache
//!   until [`BlockBackend::flush`] returns, or is stable at once when `fua`
//!   is set. A backend that is not durable at all (RAM, null) says so in
//!   [`Caps::volatile`], so that the SCSI layer reports it honestly
//!   and the CLI refuses to let it pass for user data.
//! * **Errors.** Every failure, including a failed flush, comes back as an
//!   `Err`; the SCSI layer turns it into sense data. A failed call is never
//!   reported as success.
//! * **Blocking.** [`Caps::may_block`] tells the driver whether a
//!   call can wait on a device. Backends that never wait (RAM, null) run on
//!   the connection's event loop; others run on a pool of I/O threads, so a
//!   slow device never stalls parsing and serving other commands.
//! * **Provisioning and zeroing.** [`BlockBackend::write_zeroes`] leaves
//!   the range reading as zeros and allocated (provisioned);
//!   [`BlockBackend::discard`] leaves it reading as zeros and frees
//!   whatever whole allocation units ([`Caps::discard_granularity`])
//!   it covers, zero-filling the rest. Both are writes for the ordering and
//!   durability rules above (stable on return under write-through, made
//!   stable by `flush` under write-back). Only a backend whose
//!   [`Caps::can_deallocate`] is true really frees space; the SCSI
//!   layer reports thin provisioning (LBPME, LBPRZ) only for those.
//!   [`BlockBackend::allocation`] tells which ranges hold allocated data
//!   (GET LBA STATUS); a backend that cannot tell reports everything
//!   allocated, which is always a truthful answer.
//! * **Atomicity.** [`Caps::max_atomic_write`] is the largest
//!   `write_at` the backend lands all-or-nothing even across a crash
//!   (SBC-4 §4.29 atomic writes); concurrent commands are kept apart by the
//!   SCSI layer's range locks, not by the backend.

pub mod fault;
mod file;
mod mem;
mod null;
#[cfg(feature = "rbd")]
pub mod rbd;

/// `POOL[/NAMESPACE]/IMAGE[@SNAPSHOT]`, as `rbd` names an image (with or
/// without the `rbd` feature: configurations name images either way).
pub fn rbd_spec(
    pool: &str,
    namespace: Option<&str>,
    image: &str,
    snapshot: Option<&str>,
) -> String {
    let mut s = pool.to_owned();
    if let Some(ns) = namespace {
        s = format!("{s}/{ns}");
    }
    s = format!("{s}/{image}");
    if let Some(snap) = snapshot {
        s = format!("{s}@{snap}");
    }
    s
}

pub use fault::FaultBackend;
pub use file::FileBackend;
pub use mem::MemBackend;
pub use null::NullBackend;
#[cfg(feature = "rbd")]
pub use rbd::{RbdBackend, RbdOptions};

use std::io;

pub use bufpool::WriteData;

/// The write cache policy a backend is running with (the Caching mode
/// page's WCE bit, SBC-3 §6.4.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteCache {
    /// Acknowledged writes are stable.
    WriteThrough,
    /// Writes may be cached until a flush or a FUA write.
    WriteBack,
}

impl WriteCache {
    /// `WriteBack` when `write_back`, else `WriteThrough`.
    pub fn from_write_back(write_back: bool) -> WriteCache {
        if write_back {
            WriteCache::WriteBack
        } else {
            WriteCache::WriteThrough
        }
    }
}

/// What [`Ownership::on_resized_elsewhere`] calls with the new size in
/// bytes.
pub type SizeChanged = std::sync::Arc<dyn Fn(u64) + Send + Sync>;

/// What a backend is and promises ([`BlockBackend::caps`]): fixed once it
/// is open, but for the write cache policy (MODE SELECT changes it) and a
/// test wrapper's fault injection, so read it when it matters rather than
/// keeping a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// A short name of the backend kind (`mem`, `null`, `file`, `rbd`,
    /// `fault`).
    pub kind: &'static str,
    /// The cache policy in force.
    pub write_cache: WriteCache,
    /// No write ever reaches stable storage (RAM, null).
    pub volatile: bool,
    /// A call may wait on a device; see the module docs.
    pub may_block: bool,
    /// The largest write, in bytes, worth running on the event loop of a
    /// backend that never blocks (`may_block` false). A larger one costs a
    /// long copy (a file in memory copies it into the page cache), so the
    /// driver runs it on an I/O thread and its loop goes on receiving
    /// meanwhile, on another core. `usize::MAX`: no limit (the RAM backend
    /// keeps the received buffer, null drops it).
    pub inline_write_max: usize,
    /// [`BlockBackend::discard`] frees space (thin provisioning is
    /// possible) and [`BlockBackend::allocation`] tells freed ranges apart.
    pub can_deallocate: bool,
    /// The unit, in bytes, that [`BlockBackend::discard`] frees whole (a
    /// power of two); partial units are zero-filled and stay allocated.
    pub discard_granularity: u64,
    /// The largest write, in bytes, that lands all-or-nothing even across
    /// a crash or power loss; 0 when the backend promises nothing beyond
    /// what the device does for a single logical block. Volatile backends
    /// lose everything in a crash, so they say `u64::MAX`.
    pub max_atomic_write: u64,
    /// The alignment, in bytes, an atomic write needs to be all-or-nothing
    /// up to `max_atomic_write` (its offset a multiple of this); 0 when any
    /// block-aligned offset will do. A backend whose writes are atomic only
    /// inside one allocation unit (an RBD object) says so here.
    pub atomic_alignment: u64,
}

impl Caps {
    /// A durable backend of `kind` with `write_cache` that may block, frees
    /// nothing and promises no atomicity; backends change what differs.
    pub const fn new(kind: &'static str, write_cache: WriteCache) -> Caps {
        Caps {
            kind,
            write_cache,
            volatile: false,
            may_block: true,
            inline_write_max: usize::MAX,
            can_deallocate: false,
            discard_granularity: 4096,
            max_atomic_write: 0,
            atomic_alignment: 0,
        }
    }
}

/// A byte-addressed store with the contract in the module docs: a small
/// core every backend implements, and the fast paths of those that have
/// them behind [`BlockBackend::fast`].
pub trait BlockBackend: Send + Sync + 'static {
    /// What the backend is and promises.
    fn caps(&self) -> Caps;

    /// Capacity in bytes.
    fn size(&self) -> u64;

    /// Reads `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// Writes `buf` at `offset`; with `fua` the data is stable on return
    /// whatever the cache policy.
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()>;

    /// Writes a command's data-out at `offset` ([`WriteData`], one type
    /// from the session to here), as one write for the ordering and
    /// durability rules; with `fua` it is stable on return whatever the
    /// cache policy. Segments are written one after another and copied;
    /// an owned buffer may be kept instead of copied by a backend that
    /// keeps its data in memory (it is immutable, as every
    /// [`bytes::Bytes`], and other handles to it may still exist for a
    /// while); data placed on the medium already ([`FastPaths::place_write`])
    /// is only made as stable as `fua` and the cache policy ask. The
    /// default is [`write_by_segments`].
    fn write(&self, data: &WriteData, offset: u64, fua: bool) -> io::Result<()> {
        write_by_segments(self, data, offset, fua)
    }

    /// Makes every completed write stable.
    fn flush(&self) -> io::Result<()>;

    /// Writes `len` zero bytes at `offset`; the range stays allocated.
    /// Durable like a `write_at` without FUA. The default writes zeros
    /// from a bounded buffer.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        write_zeroes_by_writing(self, offset, len)
    }

    /// Deallocates `len` bytes at `offset`: afterwards the range reads as
    /// zeros, and the whole allocation units it covers are freed when
    /// [`Caps::can_deallocate`] is true. Durable like a `write_at` without
    /// FUA. The default zeroes the range without freeing anything.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.write_zeroes(offset, len)
    }

    /// The allocation state of the bytes from `offset`: the first run of
    /// `len` bytes at most that is all allocated or all deallocated.
    /// `offset` lies inside the store and `len` is at least 1. The default
    /// reports everything allocated.
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Extent> {
        check_range_u64(self.size(), offset, len)?;
        Ok(Extent {
            allocated: true,
            len,
        })
    }

    /// Changes the size to `new_size` bytes (the admin API's resize).
    /// Data below both sizes is kept; after growing, the new space reads
    /// as zeros. Calls racing a resize see the old or the new size. Backends
    /// that cannot change size return `Unsupported` (the default).
    fn resize(&self, new_size: u64) -> io::Result<()> {
        let _ = new_size;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this backend cannot be resized",
        ))
    }

    /// Switches the cache policy (MODE SELECT of the WCE bit). Backends
    /// that cannot switch return an error of kind `Unsupported`.
    fn set_write_cache(&self, policy: WriteCache) -> io::Result<()>;

    /// The fast paths, for a backend that has some; `None` (the default):
    /// reads go through [`Self::read_at`] into a new buffer.
    fn fast(&self) -> Option<&dyn FastPaths> {
        None
    }

    /// The owner arbitration of storage several gateways serve at once
    /// (an RBD image's exclusive lock), with its resize notifications;
    /// `None` for storage only this process uses.
    fn ownership(&self) -> Option<&dyn Ownership> {
        None
    }
}

/// What a backend can do faster than the core calls of [`BlockBackend`]
/// ([`BlockBackend::fast`]): every method has a meaning that the core calls
/// could also serve, more slowly.
pub trait FastPaths: Send + Sync {
    /// Reads `len` bytes at `offset` as one or more shared segments, with
    /// no zeroing first: this is the read hot path. A backend that holds
    /// its data in memory may hand out references to it instead of copying
    /// (it must then never change bytes it has handed out).
    fn read_chain(&self, offset: u64, len: usize) -> io::Result<bufpool::Chain>;

    /// A hint that a read of `len` bytes at `offset` comes soon (the next
    /// command in a batch): a backend that copies small reads out of memory
    /// may start loading the first bytes into the CPU cache, so that the
    /// copy, after the work on the commands before it, finds them there.
    /// Nothing is read or checked; the default does nothing.
    fn prefetch(&self, offset: u64, len: usize) {
        let _ = (offset, len);
    }

    /// True when [`Self::splice_source`] can answer large reads: cheap,
    /// asked before any other work on the read path.
    fn can_splice(&self) -> bool {
        false
    }

    /// `len` bytes at `offset` as a range of a file the connection may
    /// send straight from the page cache (its mapping, or `sendfile(2)`),
    /// instead of reading them here (`None`: use [`Self::read_chain`]).
    /// Only for a file whose pages are in memory (tmpfs), so that the send
    /// never waits on a device on the event loop. The bytes are read by
    /// the kernel when it sends them, after this returns: the caller
    /// decides when that is acceptable (data digests, writes in flight;
    /// see `server::conn`).
    fn splice_source(&self, offset: u64, len: usize) -> Option<filemap::FileRange> {
        let _ = (offset, len);
        None
    }

    /// The place of a `len`-byte write at `offset` on the medium itself,
    /// for its data to be received straight into (`None`: the backend has
    /// no such place, or not for this range now; write with
    /// [`BlockBackend::write`]). Only a backend whose medium is memory the
    /// kernel can receive into without waiting (a file on tmpfs, its pages
    /// all there) gives one. The bytes are on the medium as they arrive:
    /// the caller decides when that is acceptable (`scsi::fast`: the
    /// command admitted, no data digest) and makes them stable with
    /// [`BlockBackend::write`] of the [`WriteData::Placed`].
    fn place_write(&self, offset: u64, len: usize) -> Option<filemap::Placed> {
        let _ = (offset, len);
        None
    }

    /// The completion-driven interface, for backends whose I/O completes
    /// on a thread of their own (RBD): the driver then submits plain READs
    /// and WRITEs from its event loop without waiting, instead of running
    /// them on the I/O pool. `None` (the default): only the calls of
    /// [`BlockBackend`].
    fn async_io(&self) -> Option<&dyn AsyncIo> {
        None
    }
}

/// Reads `len` bytes at `offset` of `b` into a new buffer: by its
/// [`FastPaths::read_chain`] when it has one, else by
/// [`BlockBackend::read_at`] into a zeroed buffer.
pub fn read_chain(b: &dyn BlockBackend, offset: u64, len: usize) -> io::Result<bufpool::Chain> {
    if let Some(f) = b.fast() {
        return f.read_chain(offset, len);
    }
    let mut buf = vec![0u8; len];
    b.read_at(&mut buf, offset)?;
    Ok(bufpool::Chain::from(bytes::Bytes::from(buf)))
}

/// Receives the data of an [`AsyncIo::submit_read`].
pub type ReadDone = Box<dyn FnOnce(io::Result<bytes::Bytes>) + Send>;
/// Receives the outcome of an [`AsyncIo::submit_write`].
pub type WriteDone = Box<dyn FnOnce(io::Result<()>) + Send>;

/// Reads and writes that return at once and report through a callback
/// ([`FastPaths::async_io`]). The contract of [`BlockBackend`] holds
/// with "the call returns" read as "`done` is called": a write is stable
/// (write-through, or `fua`) when its `done` gets `Ok`; a read submitted
/// after a write's `done` ran sees that write.
///
/// `done` is called exactly once, either on the backend's completion
/// thread or, when the request is refused before it starts (range, a full
/// queue), on the caller's thread before the submit call returns. It must
/// be quick and never block (it may run on the thread that completes every
/// request of the process), and must not panic. Whoever submits keeps the
/// backend alive until every `done` has run.
pub trait AsyncIo: Send + Sync {
    /// Starts reading `len` bytes at `offset`.
    fn submit_read(&self, offset: u64, len: usize, done: ReadDone);
    /// Starts writing `data` at `offset` (stable on `Ok` when `fua`).
    fn submit_write(&self, offset: u64, data: bytes::Bytes, fua: bool, done: WriteDone);
}

/// A run of bytes with one allocation state ([`BlockBackend::allocation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// True when the run holds allocated (mapped) data; false when it was
    /// never written or was discarded, and reads as zeros.
    pub allocated: bool,
    /// Length of the run in bytes.
    pub len: u64,
}

/// The error a backend returns when this process may not serve the data
/// now although the data itself is fine: another gateway owns the image
/// (an RBD exclusive lock taken over, this client blocklisted). The SCSI
/// layer answers NOT READY, LOGICAL UNIT NOT ACCESSIBLE (SPC-4 §5.15.2.4)
/// rather than MEDIUM ERROR, so initiators retry on another path.
#[derive(Debug, thiserror::Error)]
#[error("{msg}")]
pub struct NotAccessible {
    /// What happened, for logs.
    pub msg: String,
    /// This process was cut off from the storage for good (an RBD client
    /// blocklisted): only a new connection ([`Ownership::reconnect`]) can
    /// serve again.
    pub fenced: bool,
}

impl NotAccessible {
    /// An `io::Error` carrying a `NotAccessible` with `msg`.
    pub fn error(msg: impl Into<String>) -> io::Error {
        io::Error::other(NotAccessible {
            msg: msg.into(),
            fenced: false,
        })
    }

    /// An `io::Error` saying this process was fenced (see
    /// [`NotAccessible::fenced`]).
    pub fn fenced(msg: impl Into<String>) -> io::Error {
        io::Error::other(NotAccessible {
            msg: msg.into(),
            fenced: true,
        })
    }

    /// Whether `e` was made by [`NotAccessible::error`] or
    /// [`NotAccessible::fenced`].
    pub fn is(e: &io::Error) -> bool {
        e.get_ref().is_some_and(|i| i.is::<NotAccessible>())
    }

    /// Whether `e` was made by [`NotAccessible::fenced`].
    pub fn is_fenced(e: &io::Error) -> bool {
        e.get_ref()
            .and_then(|i| i.downcast_ref::<NotAccessible>())
            .is_some_and(|n| n.fenced)
    }
}

/// The error a backend returns when the storage did not answer in time
/// (a RADOS operation past its timeout: an OSD down or paused) while this
/// process may well be allowed to serve. The data is fine and the path is
/// the right one; the SCSI layer answers with a status initiators retry on
/// the same path, not a path failure and not MEDIUM ERROR.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unresponsive(pub String);

impl Unresponsive {
    /// An `io::Error` carrying an `Unresponsive` with `msg`.
    pub fn error(msg: impl Into<String>) -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, Unresponsive(msg.into()))
    }

    /// Whether `e` was made by [`Unresponsive::error`].
    pub fn is(e: &io::Error) -> bool {
        e.get_ref().is_some_and(|i| i.is::<Unresponsive>())
    }
}

/// Whether the process holding shared storage answers, as far as another
/// process can tell ([`Ownership::owner_liveness`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Nobody else owns the storage (free, or this process owns it).
    NoOtherOwner,
    /// Another process owns it and answered.
    Answers,
    /// Another process, named here, owns it and is gone or did not answer
    /// in time (dead, hung, or cut off): it may be fenced and the storage
    /// taken ([`Ownership::take_over`] with this name).
    Silent(String),
}

/// Storage that several gateways (processes, machines) serve at once,
/// with one owner at a time that alone may write: an RBD image's exclusive
/// lock. Every call may block on the cluster (seconds).
pub trait Ownership: Send + Sync {
    /// Becomes the owner unless another holds it; whether this process
    /// owns on return.
    fn acquire(&self) -> io::Result<bool>;
    /// Whether this process is the owner. An error for which
    /// [`NotAccessible::is_fenced`] holds means this process was fenced.
    fn is_owner(&self) -> io::Result<bool>;
    /// Becomes the owner, fencing the previous owner first so that it can
    /// no longer write (its I/O then fails with [`NotAccessible`]). With
    /// `only_from`, only while the owner is still that one (a name from
    /// [`Liveness::Silent`]; `""`: nobody): false, and nothing done, when
    /// the ownership changed meanwhile (another standby was quicker).
    fn take_over(&self, only_from: Option<&str>) -> io::Result<bool>;
    /// Stops being the owner (nothing when not).
    fn release(&self) -> io::Result<()>;
    /// Whether another process owns, and if so whether it answers within
    /// `within` (a dead owner's lock stays until broken, and a hung one
    /// still looks connected to the storage until it is asked something).
    fn owner_liveness(&self, within: std::time::Duration) -> io::Result<Liveness>;
    /// Replaces this process's connection to the storage with a new one:
    /// after being fenced the old one is dead for good. I/O in flight on
    /// the old connection ends with errors; later I/O uses the new one.
    fn reconnect(&self) -> io::Result<()>;
    /// A value kept with the storage under `key`, the same for every
    /// gateway (which of them owns it, in their terms).
    fn note(&self, key: &str) -> io::Result<Option<String>>;
    /// Sets the value under `key`.
    fn set_note(&self, key: &str, value: &str) -> io::Result<()>;
    /// Asks to be told when the medium changes size from outside this
    /// process (another gateway, or `rbd resize`, resized the shared
    /// image): `changed(new_size)` is then called on a thread of the
    /// backend's own, once [`BlockBackend::size`] reports the new size. A
    /// later call replaces the callback.
    fn on_resized_elsewhere(&self, changed: SizeChanged);
}

/// Largest buffer [`write_zeroes_by_writing`] allocates.
const ZERO_CHUNK: u64 = 1 << 20;

/// [`BlockBackend::write`] by [`BlockBackend::write_at`] for each segment
/// in turn, and placed data made stable by [`BlockBackend::flush`] when
/// `fua` or write-through asks for it: the default, and what a backend
/// that keeps only some kinds of data itself falls back to.
pub fn write_by_segments<B: BlockBackend + ?Sized>(
    b: &B,
    data: &WriteData,
    offset: u64,
    fua: bool,
) -> io::Result<()> {
    if data.is_placed() {
        if fua || b.caps().write_cache == WriteCache::WriteThrough {
            return b.flush();
        }
        return Ok(());
    }
    check_range(b.size(), offset, data.len())?;
    let mut at = offset;
    for seg in data.segments() {
        b.write_at(seg, at, fua)?;
        at += seg.len() as u64;
    }
    Ok(())
}

/// Writes zeros over `len` bytes at `offset` with `write_at`, from a buffer
/// of at most 1 MiB: the fallback of [`BlockBackend::write_zeroes`].
pub fn write_zeroes_by_writing<B: BlockBackend + ?Sized>(
    b: &B,
    offset: u64,
    len: u64,
) -> io::Result<()> {
    check_range_u64(b.size(), offset, len)?;
    let zeros = vec![0u8; len.min(ZERO_CHUNK) as usize];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(ZERO_CHUNK);
        b.write_at(&zeros[..n as usize], offset + done, false)?;
        done += n;
    }
    Ok(())
}

/// Checks that `len` bytes at `offset` lie inside a store of `size` bytes.
fn check_range(size: u64, offset: u64, len: usize) -> io::Result<()> {
    check_range_u64(size, offset, len as u64)
}

/// [`check_range`] for a `u64` length.
fn check_range_u64(size: u64, offset: u64, len: u64) -> io::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("range {offset}+{len} beyond capacity {size}"),
        )),
    }
}

#[cfg(test)]
mod spec_tests {
    #[test]
    fn rbd_specs_name_namespace_and_snapshot() {
        assert_eq!(super::rbd_spec("rbd", None, "vol", None), "rbd/vol");
        assert_eq!(
            super::rbd_spec("rbd", Some("tenant1"), "vol", Some("monday")),
            "rbd/tenant1/vol@monday"
        );
    }
}
