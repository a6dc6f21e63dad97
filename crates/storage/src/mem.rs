//! The RAM backend: a LUN held in memory, for benchmarks and tests.
//!
//! Memory is taken in 1 MiB chunks on first write, so a large RAM LUN costs
//! only what has been written; never-written chunks read as zeros. Each
//! chunk has its own reader/writer lock, so I/O to different chunks never
//! contends and a read never sees a torn write within a chunk.

use std::io;

use parking_lot::RwLock;

use crate::{check_range, BlockBackend, WriteCache};

const CHUNK_SHIFT: u32 = 20;
const CHUNK: u64 = 1 << CHUNK_SHIFT;

/// One 1 MiB chunk, allocated on first write.
type Chunk = RwLock<Option<Box<[u8]>>>;

/// A volatile in-memory store.
pub struct MemBackend {
    size: u64,
    chunks: Box<[Chunk]>,
}

impl std::fmt::Debug for MemBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemBackend")
            .field("size", &self.size)
            .finish()
    }
}

impl MemBackend {
    /// A zero-filled store of `size` bytes; memory is taken as it is written.
    pub fn new(size: u64) -> Self {
        let n = size.div_ceil(CHUNK) as usize;
        MemBackend {
            size,
            chunks: (0..n).map(|_| RwLock::new(None)).collect(),
        }
    }

    /// Bytes of memory currently held for data.
    pub fn resident_bytes(&self) -> u64 {
        self.chunks.iter().filter(|c| c.read().is_some()).count() as u64 * CHUNK
    }

    /// Calls `f(chunk_index, offset_in_chunk, range_in_buf)` for each chunk
    /// the range touches.
    fn for_each_chunk(
        offset: u64,
        len: usize,
        mut f: impl FnMut(usize, usize, std::ops::Range<usize>),
    ) {
        let mut done = 0usize;
        while done < len {
            let pos = offset + done as u64;
            let idx = (pos >> CHUNK_SHIFT) as usize;
            let within = (pos & (CHUNK - 1)) as usize;
            let n = (CHUNK as usize - within).min(len - done);
            f(idx, within, done..done + n);
            done += n;
        }
    }
}

impl BlockBackend for MemBackend {
    fn kind(&self) -> &'static str {
        "mem"
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size, offset, buf.len())?;
        Self::for_each_chunk(offset, buf.len(), |idx, within, r| {
            let n = r.len();
            match &*self.chunks[idx].read() {
                Some(c) => buf[r].copy_from_slice(&c[within..within + n]),
                None => buf[r].fill(0),
            }
        });
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> io::Result<()> {
        check_range(self.size, offset, buf.len())?;
        Self::for_each_chunk(offset, buf.len(), |idx, within, r| {
            let n = r.len();
            let mut g = self.chunks[idx].write();
            let c = g.get_or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice());
            c[within..within + n].copy_from_slice(&buf[r]);
        });
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_was_written_across_chunks() {
        let m = MemBackend::new(3 * CHUNK);
        let data: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
        let at = CHUNK - 4096;
        m.write_at(&data, at, false).unwrap();
        let mut back = vec![0u8; 8192];
        m.read_at(&mut back, at).unwrap();
        assert_eq!(back, data);
        let mut z = vec![1u8; 512];
        m.read_at(&mut z, 2 * CHUNK).unwrap();
        assert!(z.iter().all(|&b| b == 0));
        assert_eq!(m.resident_bytes(), 2 * CHUNK);
        assert!(m.read_at(&mut z, 3 * CHUNK - 100).is_err());
    }
}
