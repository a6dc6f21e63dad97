//! A fault-injecting wrapper for tests: makes reads, writes or flushes of
//! an inner backend fail with a chosen OS error (EIO, ENOSPC, …) or take
//! longer (a slow device, for hosts' command timeouts and task management)
//! until told otherwise, and counts what reached the inner backend.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;

use crate::{BlockBackend, Caps, Extent, WriteCache};

/// Which calls fail, as OS error numbers (0: pass through).
pub struct FaultBackend {
    inner: Arc<dyn BlockBackend>,
    read: AtomicI32,
    write: AtomicI32,
    flush: AtomicI32,
    /// Milliseconds every read and write waits first (0: none).
    delay_ms: AtomicU64,
    /// Made to delay: every call runs on the I/O pool, never inline on an
    /// event loop, so a slow call stalls only itself.
    delaying: AtomicBool,
    /// Writes that reached the inner backend.
    pub writes: AtomicU64,
}

impl std::fmt::Debug for FaultBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultBackend")
            .field("inner", &self.inner.caps().kind)
            .field("read", &self.read)
            .field("write", &self.write)
            .field("flush", &self.flush)
            .finish()
    }
}

impl FaultBackend {
    /// Wraps `inner`; nothing fails until a `fail_*` call.
    pub fn new(inner: Arc<dyn BlockBackend>) -> Self {
        FaultBackend {
            inner,
            read: AtomicI32::new(0),
            write: AtomicI32::new(0),
            flush: AtomicI32::new(0),
            delay_ms: AtomicU64::new(0),
            delaying: AtomicBool::new(false),
            writes: AtomicU64::new(0),
        }
    }

    /// Wraps `inner` to be slowed down with [`Self::set_delay_ms`]: its
    /// calls run on the I/O pool from the start.
    pub fn slowable(inner: Arc<dyn BlockBackend>) -> Self {
        let f = FaultBackend::new(inner);
        f.delaying.store(true, Ordering::SeqCst);
        f
    }

    /// Every read and write waits `ms` milliseconds first (0: none).
    pub fn set_delay_ms(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::SeqCst);
    }

    fn wait(&self) {
        let ms = self.delay_ms.load(Ordering::SeqCst);
        if ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    }

    /// Reads fail with `errno` (0: succeed).
    pub fn fail_reads(&self, errno: i32) {
        self.read.store(errno, Ordering::SeqCst);
    }

    /// Writes (including zeroing and discards) fail with `errno`.
    pub fn fail_writes(&self, errno: i32) {
        self.write.store(errno, Ordering::SeqCst);
    }

    /// Flushes (and FUA or write-through writes' sync) fail with `errno`.
    pub fn fail_flushes(&self, errno: i32) {
        self.flush.store(errno, Ordering::SeqCst);
    }

    fn check(a: &AtomicI32) -> io::Result<()> {
        match a.load(Ordering::SeqCst) {
            0 => Ok(()),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }
}

impl BlockBackend for FaultBackend {
    fn caps(&self) -> Caps {
        let inner = self.inner.caps();
        let delaying = self.delaying.load(Ordering::Relaxed);
        Caps {
            kind: "fault",
            may_block: delaying || inner.may_block,
            inline_write_max: if delaying { 0 } else { inner.inline_write_max },
            ..inner
        }
    }
    fn ownership(&self) -> Option<&dyn crate::Ownership> {
        self.inner.ownership()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.wait();
        Self::check(&self.read)?;
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.wait();
        Self::check(&self.write)?;
        // A write that must be stable on return fails like its sync would.
        if fua || self.inner.caps().write_cache == WriteCache::WriteThrough {
            Self::check(&self.flush)?;
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> io::Result<()> {
        Self::check(&self.flush)?;
        self.inner.flush()
    }
    fn set_write_cache(&self, policy: WriteCache) -> io::Result<()> {
        self.inner.set_write_cache(policy)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        Self::check(&self.write)?;
        self.inner.write_zeroes(offset, len)
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        Self::check(&self.write)?;
        self.inner.discard(offset, len)
    }
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Extent> {
        Self::check(&self.read)?;
        self.inner.allocation(offset, len)
    }
}
