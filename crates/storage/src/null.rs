//! The null backend: reads return zeros, writes are discarded (like tgt's
//! `null` store and SPDK's null bdev). For measuring the protocol path.
//!
//! Zeroing and discarding are range-checked no-ops (everything reads as
//! zeros already) and every range is deallocated, but the backend does not
//! claim [`crate::Caps::can_deallocate`]: it has no space to free, so the
//! SCSI layer presents it fully provisioned.

use std::io;

use crate::{check_range, check_range_u64, BlockBackend, Caps, Extent, FastPaths, WriteCache};

/// A store of `size` bytes that holds nothing.
#[derive(Debug)]
pub struct NullBackend {
    size: std::sync::atomic::AtomicU64,
}

impl NullBackend {
    /// A null store reporting `size` bytes.
    pub fn new(size: u64) -> Self {
        NullBackend { size: size.into() }
    }
}

impl BlockBackend for NullBackend {
    fn caps(&self) -> Caps {
        Caps {
            volatile: true,
            may_block: false,
            max_atomic_write: u64::MAX,
            ..Caps::new("null", WriteCache::WriteBack)
        }
    }
    fn fast(&self) -> Option<&dyn FastPaths> {
        Some(self)
    }
    fn resize(&self, new_size: u64) -> io::Result<()> {
        self.size
            .store(new_size, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(
            self.size.load(std::sync::atomic::Ordering::Relaxed),
            offset,
            buf.len(),
        )?;
        buf.fill(0);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> io::Result<()> {
        check_range(
            self.size.load(std::sync::atomic::Ordering::Relaxed),
            offset,
            buf.len(),
        )
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn set_write_cache(&self, _policy: WriteCache) -> io::Result<()> {
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range_u64(
            self.size.load(std::sync::atomic::Ordering::Relaxed),
            offset,
            len,
        )
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range_u64(
            self.size.load(std::sync::atomic::Ordering::Relaxed),
            offset,
            len,
        )
    }
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Extent> {
        check_range_u64(
            self.size.load(std::sync::atomic::Ordering::Relaxed),
            offset,
            len,
        )?;
        Ok(Extent {
            allocated: false,
            len,
        })
    }
}

impl FastPaths for NullBackend {
    fn read_chain(&self, offset: u64, len: usize) -> io::Result<bufpool::Chain> {
        check_range(self.size(), offset, len)?;
        // Reads share one static page of zeros: no allocation, no copy.
        static ZEROS: [u8; 1 << 20] = [0; 1 << 20];
        Ok(bufpool::Chain::from(if len <= ZEROS.len() {
            bytes::Bytes::from_static(&ZEROS[..len])
        } else {
            bytes::Bytes::from(vec![0u8; len])
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroing_and_discard_are_range_checked() {
        let n = NullBackend::new(1 << 20);
        n.write_zeroes(0, 1 << 20).unwrap();
        n.discard(4096, 4096).unwrap();
        assert!(n.discard(1 << 20, 1).is_err());
        assert!(n.write_zeroes(u64::MAX, 2).is_err());
        let e = n.allocation(0, 512).unwrap();
        assert!(!e.allocated);
        assert!(!n.caps().can_deallocate);
    }
}
