//! The RAM backend: a LUN held in memory, for benchmarks and tests.
//!
//! Memory is taken in 1 MiB chunks on first write, so a large RAM LUN costs
//! only what has been written; never-written chunks read as zeros. Each
//! chunk has its own reader/writer lock, so I/O to different chunks never
//! contends and a read never sees a torn write within a chunk.
//!
//! Thin provisioning: [`BlockBackend::discard`] frees every whole chunk it
//! covers and zero-fills the partial ones; [`BlockBackend::allocation`]
//! reports chunks held as allocated and the others as deallocated.
//!
//! Resizing ([`BlockBackend::resize`], the admin API) needs no lock on the
//! I/O path: the chunk table is a list of segments of doubling length
//! (1, 2, 4, … chunks), each allocated once and never moved, so growing
//! only adds segments and publishes the new size. Shrinking publishes the
//! smaller size first, then frees the chunks past it; growing again reads
//! zeros there (chunks past the old end are cleared before the new size is
//! published, which also covers a write that raced a shrink).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use parking_lot::{Mutex, RwLock};

use crate::{check_range, check_range_u64, BlockBackend, Extent, WriteCache};

const CHUNK_SHIFT: u32 = 20;
const CHUNK: u64 = 1 << CHUNK_SHIFT;
/// Segments in the chunk table: segment k holds 2^k chunks, so 45 of them
/// address 2^45 - 1 chunks, more than a `u64` of bytes.
const SEGMENTS: usize = 45;

/// One 1 MiB chunk, allocated on first write.
type Chunk = RwLock<Option<Box<[u8]>>>;

/// A volatile in-memory store.
pub struct MemBackend {
    size: AtomicU64,
    /// Segment k: chunks 2^k - 1 ..= 2^(k+1) - 2.
    segments: [OnceLock<Box<[Chunk]>>; SEGMENTS],
    /// Serialises resizes.
    resizing: Mutex<()>,
}

/// The segment and the index in it of chunk `i`.
#[inline]
fn locate(i: usize) -> (usize, usize) {
    let j = i + 1;
    let k = (usize::BITS - 1 - j.leading_zeros()) as usize;
    (k, j - (1 << k))
}

impl std::fmt::Debug for MemBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemBackend")
            .field("size", &self.len())
            .finish()
    }
}

impl MemBackend {
    /// A zero-filled store of `size` bytes; memory is taken as it is written.
    pub fn new(size: u64) -> Self {
        let m = MemBackend {
            size: AtomicU64::new(size),
            segments: std::array::from_fn(|_| OnceLock::new()),
            resizing: Mutex::new(()),
        };
        m.make_room(size);
        m
    }

    /// Allocates the segments that chunks below `size` bytes live in.
    fn make_room(&self, size: u64) {
        let chunks = size.div_ceil(CHUNK) as usize;
        if chunks == 0 {
            return;
        }
        let (last, _) = locate(chunks - 1);
        for (k, seg) in self.segments.iter().enumerate().take(last + 1) {
            seg.get_or_init(|| (0..1usize << k).map(|_| RwLock::new(None)).collect());
        }
    }

    /// Chunk `i`. Callers only ask for chunks below a size the table was
    /// made room for ([`Self::make_room`] runs before a size is published).
    #[inline]
    fn chunk(&self, i: usize) -> &Chunk {
        let (k, at) = locate(i);
        // Invariant: segments are allocated before any size covering them
        // is stored, and never freed.
        &self.segments[k].get().expect("segment allocated")[at]
    }

    /// Every chunk allocated so far, whatever the current size.
    fn all_chunks(&self) -> impl Iterator<Item = &Chunk> {
        self.segments
            .iter()
            .map_while(OnceLock::get)
            .flat_map(|s| s.iter())
    }

    /// Bytes of memory currently held for data.
    pub fn resident_bytes(&self) -> u64 {
        self.all_chunks().filter(|c| c.read().is_some()).count() as u64 * CHUNK
    }

    #[inline]
    fn len(&self) -> u64 {
        self.size.load(Ordering::Acquire)
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
        self.len()
    }
    /// Grows or shrinks the store. Growing keeps every byte; shrinking
    /// frees the memory past the new end (the data there is gone).
    fn resize(&self, new_size: u64) -> io::Result<()> {
        let _g = self.resizing.lock();
        let old = self.len();
        if new_size >= old {
            self.make_room(new_size);
            // What lies past the old end must read as zeros: the tail of a
            // partial last chunk, and any chunk a shrink left or a write
            // racing it re-created.
            let first_whole = old.div_ceil(CHUNK);
            if !old.is_multiple_of(CHUNK) {
                let idx = (old >> CHUNK_SHIFT) as usize;
                if let Some(c) = self.chunk(idx).write().as_mut() {
                    c[(old & (CHUNK - 1)) as usize..].fill(0);
                }
            }
            for (i, c) in self.all_chunks().enumerate().skip(first_whole as usize) {
                if (i as u64) << CHUNK_SHIFT >= new_size {
                    break;
                }
                *c.write() = None;
            }
            self.size.store(new_size, Ordering::Release);
        } else {
            self.size.store(new_size, Ordering::Release);
            let keep = new_size.div_ceil(CHUNK) as usize;
            for c in self.all_chunks().skip(keep) {
                *c.write() = None;
            }
        }
        Ok(())
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.len(), offset, buf.len())?;
        Self::for_each_chunk(offset, buf.len(), |idx, within, r| {
            let n = r.len();
            match &*self.chunk(idx).read() {
                Some(c) => buf[r].copy_from_slice(&c[within..within + n]),
                None => buf[r].fill(0),
            }
        });
        Ok(())
    }
    fn read_bytes(&self, offset: u64, len: usize) -> io::Result<bytes::Bytes> {
        check_range(self.len(), offset, len)?;
        // Filled by copying straight from the chunks into a pooled buffer:
        // no zeroing first, no allocation in steady state.
        let mut v = bufpool::take(len);
        Self::for_each_chunk(offset, len, |idx, within, r| {
            let n = r.len();
            match &*self.chunk(idx).read() {
                Some(c) => v.extend_from_slice(&c[within..within + n]),
                None => v.resize(v.len() + n, 0),
            }
        });
        Ok(v.freeze())
    }
    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> io::Result<()> {
        check_range(self.len(), offset, buf.len())?;
        Self::for_each_chunk(offset, buf.len(), |idx, within, r| {
            let n = r.len();
            let mut g = self.chunk(idx).write();
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
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range_u64(self.len(), offset, len)?;
        self.for_each_range(offset, len, |idx, within, n| {
            let mut g = self.chunk(idx).write();
            let c = g.get_or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice());
            c[within..within + n].fill(0);
        });
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let size = self.len();
        check_range_u64(size, offset, len)?;
        self.for_each_range(offset, len, |idx, within, n| {
            let mut g = self.chunk(idx).write();
            // The last chunk may be short: whole means up to the end.
            let chunk_len = (size - ((idx as u64) << CHUNK_SHIFT)).min(CHUNK) as usize;
            if within == 0 && n == chunk_len {
                *g = None;
            } else if let Some(c) = g.as_mut() {
                c[within..within + n].fill(0);
            }
        });
        Ok(())
    }
    fn can_deallocate(&self) -> bool {
        true
    }
    fn discard_granularity(&self) -> u64 {
        CHUNK
    }
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Extent> {
        check_range_u64(self.len(), offset, len)?;
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty range"));
        }
        let state = |idx: usize| self.chunk(idx).read().is_some();
        let first = (offset >> CHUNK_SHIFT) as usize;
        let allocated = state(first);
        let mut end = ((first as u64) + 1) << CHUNK_SHIFT;
        while end < offset + len && state((end >> CHUNK_SHIFT) as usize) == allocated {
            end += CHUNK;
        }
        Ok(Extent {
            allocated,
            len: end.min(offset + len) - offset,
        })
    }
    fn max_atomic_write(&self) -> u64 {
        u64::MAX
    }
}

impl MemBackend {
    /// [`Self::for_each_chunk`] for a `u64` length, without a buffer:
    /// calls `f(chunk_index, offset_in_chunk, bytes)`.
    fn for_each_range(&self, offset: u64, len: u64, mut f: impl FnMut(usize, usize, usize)) {
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let idx = (pos >> CHUNK_SHIFT) as usize;
            let within = pos & (CHUNK - 1);
            let n = (CHUNK - within).min(len - done);
            f(idx, within as usize, n as usize);
            done += n;
        }
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

    #[test]
    fn discard_frees_whole_chunks_and_zeroes_partial_ones() {
        let m = MemBackend::new(3 * CHUNK + 8192);
        m.write_at(&vec![7u8; (3 * CHUNK + 8192) as usize], 0, false)
            .unwrap();
        assert_eq!(m.resident_bytes(), 4 * CHUNK);
        // From the middle of chunk 0 to the middle of chunk 2.
        m.discard(CHUNK - 512, CHUNK + 1024).unwrap();
        assert_eq!(m.resident_bytes(), 3 * CHUNK, "chunk 1 freed");
        let mut b = vec![1u8; (2 * CHUNK) as usize];
        m.read_at(&mut b, CHUNK / 2).unwrap();
        let zero_from = (CHUNK / 2 - 512) as usize;
        let zero_to = zero_from + (CHUNK + 1024) as usize;
        assert!(b[..zero_from].iter().all(|&x| x == 7));
        assert!(b[zero_from..zero_to].iter().all(|&x| x == 0));
        assert!(b[zero_to..].iter().all(|&x| x == 7));
        // The short last chunk is freed whole too.
        m.discard(3 * CHUNK, 8192).unwrap();
        assert_eq!(m.resident_bytes(), 2 * CHUNK);
        assert!(m.discard(3 * CHUNK, 8193).is_err());
        assert!(m.discard(u64::MAX, 2).is_err());
    }

    #[test]
    fn write_zeroes_keeps_chunks_allocated() {
        let m = MemBackend::new(2 * CHUNK);
        m.write_zeroes(0, 2 * CHUNK).unwrap();
        assert_eq!(m.resident_bytes(), 2 * CHUNK);
        let e = m.allocation(0, 2 * CHUNK).unwrap();
        assert_eq!(
            e,
            Extent {
                allocated: true,
                len: 2 * CHUNK
            }
        );
        let mut b = vec![1u8; 4096];
        m.read_at(&mut b, CHUNK).unwrap();
        assert!(b.iter().all(|&x| x == 0));
    }

    #[test]
    fn chunk_table_segments() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(1), (1, 0));
        assert_eq!(locate(2), (1, 1));
        assert_eq!(locate(3), (2, 0));
        assert_eq!(locate(6), (2, 3));
        assert_eq!(locate(7), (3, 0));
        let m = MemBackend::new(0);
        assert_eq!(m.size(), 0);
        m.resize(5 * CHUNK).unwrap();
        m.write_at(&[1u8; 512], 5 * CHUNK - 512, false).unwrap();
    }

    #[test]
    fn grows_keeping_data_and_shrinks_freeing_memory() {
        let m = MemBackend::new(CHUNK + 4096);
        m.write_at(&vec![7u8; (CHUNK + 4096) as usize], 0, false)
            .unwrap();
        assert!(m.write_at(&[1u8; 512], CHUNK + 4096, false).is_err());
        m.resize(10 * CHUNK).unwrap();
        assert_eq!(m.size(), 10 * CHUNK);
        let mut b = vec![0u8; (CHUNK + 4096) as usize];
        m.read_at(&mut b, 0).unwrap();
        assert!(b.iter().all(|&x| x == 7), "data kept");
        let mut z = vec![1u8; 8192];
        m.read_at(&mut z, CHUNK + 4096).unwrap();
        assert!(z.iter().all(|&x| x == 0), "new space reads zeros");
        m.write_at(&vec![9u8; CHUNK as usize], 8 * CHUNK, false)
            .unwrap();
        assert_eq!(m.resident_bytes(), 3 * CHUNK);
        // Shrink to the middle of chunk 0: chunks 1 and 8 are freed.
        m.resize(4096).unwrap();
        assert_eq!(m.resident_bytes(), CHUNK);
        assert!(m.read_at(&mut z, 4096).is_err());
        // Grow again: what was cut off reads as zeros, what stayed is kept.
        m.resize(9 * CHUNK).unwrap();
        let mut b = vec![1u8; (9 * CHUNK) as usize];
        m.read_at(&mut b, 0).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 7));
        assert!(b[4096..].iter().all(|&x| x == 0));
    }

    #[test]
    fn allocation_runs() {
        let m = MemBackend::new(4 * CHUNK);
        m.write_at(&[1u8; 512], CHUNK + 5, false).unwrap();
        m.write_at(&[1u8; 512], 2 * CHUNK, false).unwrap();
        let e = m.allocation(100, 4 * CHUNK - 100).unwrap();
        assert_eq!(
            e,
            Extent {
                allocated: false,
                len: CHUNK - 100
            }
        );
        let e = m.allocation(CHUNK, 3 * CHUNK).unwrap();
        assert_eq!(
            e,
            Extent {
                allocated: true,
                len: 2 * CHUNK
            }
        );
        let e = m.allocation(CHUNK + 7, 10).unwrap();
        assert_eq!(
            e,
            Extent {
                allocated: true,
                len: 10
            }
        );
        let e = m.allocation(3 * CHUNK, CHUNK).unwrap();
        assert_eq!(
            e,
            Extent {
                allocated: false,
                len: CHUNK
            }
        );
        assert!(m.allocation(4 * CHUNK, 1).is_err());
        assert!(m.allocation(0, 0).is_err());
    }
}
