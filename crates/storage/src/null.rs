//! The null backend: reads return zeros, writes are discarded (like tgt's
//! `null` store and SPDK's null bdev). For measuring the protocol path.

use std::io;

use crate::{check_range, BlockBackend, WriteCache};

/// A store of `size` bytes that holds nothing.
#[derive(Debug)]
pub struct NullBackend {
    size: u64,
}

impl NullBackend {
    /// A null store reporting `size` bytes.
    pub fn new(size: u64) -> Self {
        NullBackend { size }
    }
}

impl BlockBackend for NullBackend {
    fn kind(&self) -> &'static str {
        "null"
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size, offset, buf.len())?;
        buf.fill(0);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> io::Result<()> {
        check_range(self.size, offset, buf.len())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn write_cache(&self) -> WriteCache {
        WriteCache::WriteBack
    }
    fn set_write_cache(&self, _policy: WriteCache) -> io::Result<()> {
        Ok(())
    }
    fn volatile(&self) -> bool {
        true
    }
    fn may_block(&self) -> bool {
        false
    }
}
