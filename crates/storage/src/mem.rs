//! The RAM backend: a LUN held in memory, for benchmarks and tests.
//!
//! Memory is taken in 1 MiB chunks on first write, so a large RAM LUN costs
//! only what has been written; never-written chunks read as zeros. Each
//! chunk has its own reader/writer lock, so I/O to different chunks never
//! contends and a read never sees a torn write within a chunk.
//!
//! Large reads are not copied: [`FastPaths::read_chain`] of at least
//! [`SHARE_MIN`] bytes hands out shared references to the chunks
//! themselves (and to a static zero page for never-written ones), which
//! the send queue writes straight to the socket. A chunk is immutable while
//! shared: a write to a chunk that some read still holds copies it first
//! (copy-on-write), so data already handed out never changes under the
//! reader — the data digest computed over it stays true. Smaller reads are
//! shared too while their chunk is quiet (no write for [`QUIET_MS`]), and
//! copied into a pooled buffer while writes hit it: a write to a chunk a
//! small read still holds copies the whole chunk, which writes spread over
//! few chunks would pay again and again (measured, 4 KiB 70/30 random
//! read/write at Q32 on a 64 MiB LUN: 142K IOPS sharing, 721K copying),
//! while sharing a chunk that only reads touch saves the copy (4 KiB
//! random reads, ~10% more IOPS).
//!
//! Each chunk keeps the CRC32C of its 4 KiB blocks as they become known
//! ([`BlockSums`]): the shared slices of a large read carry them, and the
//! send queue folds them into a data digest instead of reading the bytes
//! again (RFC 7143 §12.1). Immutability is what keeps them true: a write
//! that changes a chunk in place (nothing shares it) forgets the blocks it
//! touches, and a copy-on-write gives the copy the sums of the blocks it
//! left alone.
//!
//! Thin provisioning: [`BlockBackend::discard`] frees every whole chunk it
//! covers and zero-fills the partial ones; [`BlockBackend::allocation`]
//! reports chunks held as allocated and the others as deallocated.
//!
//! Resizing ([`BlockBackend::resize`], the admin API) needs no lock on the
//! I/O path: the chunk table is a list of segments of doubling length
//! (1, 2, 4, … chunks), each allocated on the first write into it and never
//! moved, so growing only publishes the new size (a never-written segment
//! reads as zeros and costs nothing). Shrinking publishes the smaller size
//! first, then frees the chunks past it; growing again reads zeros there
//! (chunks past the old end are cleared before the new size is published,
//! which also covers a write that raced a shrink). A store is at most
//! [`MemBackend::MAX_SIZE`] bytes.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};

use bufpool::Chain;
use bytes::{Bytes, BytesMut};
use filemap::BlockSums;
use parking_lot::{Mutex, RwLock};

use crate::{
    check_range, check_range_u64, BlockBackend, Caps, Extent, FastPaths, WriteCache, WriteData,
};

const CHUNK_SHIFT: u32 = 20;
const CHUNK: u64 = 1 << CHUNK_SHIFT;
/// Segments in the chunk table: segment k holds 2^k chunks, so 25 of them
/// address 2^25 - 1 chunks, more than [`MemBackend::MAX_SIZE`] needs.
const SEGMENTS: usize = 25;
const _: () = assert!((1u64 << SEGMENTS) > MemBackend::MAX_SIZE >> CHUNK_SHIFT);

/// Reads of at least this many bytes share the chunks instead of copying.
pub const SHARE_MIN: usize = 64 * 1024;

/// What never-written chunks read as, shared by large reads.
static ZEROS: [u8; CHUNK as usize] = [0; CHUNK as usize];

/// The block CRCs of [`ZEROS`], shared by every RAM LUN.
static ZERO_SUMS: LazyLock<Arc<BlockSums>> =
    LazyLock::new(|| Arc::new(BlockSums::new(ZEROS.as_ptr(), ZEROS.len())));

/// One 1 MiB chunk, allocated on first write; shared (read-only) with the
/// large reads in flight.
type Chunk = RwLock<Option<Stored>>;

/// A chunk's bytes (always [`CHUNK`] of them), their block CRCs, and
/// when they were last written.
#[derive(Debug)]
struct Stored {
    data: Bytes,
    sums: Arc<BlockSums>,
    /// [`now_ms`] at the last write: small reads share the chunk only
    /// once it has been [`QUIET_MS`] without one.
    written_ms: u32,
}

impl Stored {
    /// `data` (just written) with `sums` when they describe it, else with
    /// none known.
    fn new(data: Bytes, sums: Option<Arc<BlockSums>>) -> Self {
        let sums = match sums {
            Some(s) if s.is_for(data.as_ptr()) => s,
            _ => Arc::new(BlockSums::new(data.as_ptr(), data.len())),
        };
        Stored {
            data,
            sums,
            written_ms: now_ms(),
        }
    }

    /// Whether no write came for [`QUIET_MS`].
    fn quiet(&self, now: u32) -> bool {
        now.wrapping_sub(self.written_ms) >= QUIET_MS
    }
}

/// How long a chunk goes without a write before small reads share it
/// rather than copy it (module docs).
const QUIET_MS: u32 = 1000;

/// A millisecond clock, coarse and cheap (the kernel's tick, read through
/// the vDSO), wrapping every 49 days: only differences are used.
fn now_ms() -> u32 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) };
    (t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000) as u32
}

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
    /// The largest store, 16 TiB: its chunk table alone may take a few
    /// hundred MiB once written all over.
    pub const MAX_SIZE: u64 = 1 << 44;

    /// A zero-filled store of `size` bytes (at most [`Self::MAX_SIZE`]:
    /// larger sizes are cut to it); memory is taken as it is written.
    pub fn new(size: u64) -> Self {
        MemBackend {
            size: AtomicU64::new(size.min(Self::MAX_SIZE)),
            segments: std::array::from_fn(|_| OnceLock::new()),
            resizing: Mutex::new(()),
        }
    }

    /// Chunk `i`, if its segment was ever written to (else it reads as
    /// zeros).
    #[inline]
    fn chunk(&self, i: usize) -> Option<&Chunk> {
        let (k, at) = locate(i);
        self.segments[k].get().map(|s| &s[at])
    }

    /// Chunk `i`, allocating its segment (once) for a write.
    #[inline]
    fn chunk_for_write(&self, i: usize) -> &Chunk {
        let (k, at) = locate(i);
        &self.segments[k].get_or_init(|| (0..1usize << k).map(|_| RwLock::new(None)).collect())[at]
    }

    /// Every chunk from index `first` on whose segment exists, with its
    /// index, whatever the current size.
    fn chunks_from(&self, first: usize) -> impl Iterator<Item = (usize, &Chunk)> {
        self.segments
            .iter()
            .enumerate()
            .filter_map(|(k, s)| s.get().map(|s| (k, s)))
            .flat_map(|(k, s)| {
                s.iter()
                    .enumerate()
                    .map(move |(j, c)| ((1 << k) - 1 + j, c))
            })
            .filter(move |(i, _)| *i >= first)
    }

    /// Bytes of memory currently held for data.
    pub fn resident_bytes(&self) -> u64 {
        self.chunks_from(0)
            .filter(|(_, c)| c.read().is_some())
            .count() as u64
            * CHUNK
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
    fn caps(&self) -> Caps {
        Caps {
            volatile: true,
            may_block: false,
            can_deallocate: true,
            discard_granularity: CHUNK,
            max_atomic_write: u64::MAX,
            ..Caps::new("mem", WriteCache::WriteBack)
        }
    }
    fn fast(&self) -> Option<&dyn FastPaths> {
        Some(self)
    }
    fn size(&self) -> u64 {
        self.len()
    }
    /// Grows or shrinks the store. Growing keeps every byte; shrinking
    /// frees the memory past the new end (the data there is gone).
    fn resize(&self, new_size: u64) -> io::Result<()> {
        if new_size > Self::MAX_SIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a RAM LUN holds at most {} bytes", Self::MAX_SIZE),
            ));
        }
        let _g = self.resizing.lock();
        let old = self.len();
        if new_size >= old {
            // What lies past the old end must read as zeros: the tail of a
            // partial last chunk, and any chunk a shrink left or a write
            // racing it re-created.
            if !old.is_multiple_of(CHUNK) {
                let idx = (old >> CHUNK_SHIFT) as usize;
                if self.chunk(idx).is_some_and(|c| c.read().is_some()) {
                    let within = (old & (CHUNK - 1)) as usize;
                    self.modify(idx, within, CHUNK as usize - within, |d| d.fill(0));
                }
            }
            for (_, c) in self.chunks_from(old.div_ceil(CHUNK) as usize) {
                *c.write() = None;
            }
            self.size.store(new_size, Ordering::Release);
        } else {
            self.size.store(new_size, Ordering::Release);
            for (_, c) in self.chunks_from(new_size.div_ceil(CHUNK) as usize) {
                *c.write() = None;
            }
        }
        Ok(())
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.len(), offset, buf.len())?;
        Self::for_each_chunk(offset, buf.len(), |idx, within, r| {
            let n = r.len();
            match self.chunk(idx) {
                Some(c) => match &*c.read() {
                    Some(c) => buf[r].copy_from_slice(&c.data[within..within + n]),
                    None => buf[r].fill(0),
                },
                None => buf[r].fill(0),
            }
        });
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> io::Result<()> {
        check_range(self.len(), offset, buf.len())?;
        Self::for_each_chunk(offset, buf.len(), |idx, within, r| {
            let n = r.len();
            self.modify(idx, within, n, |c| c.copy_from_slice(&buf[r]));
        });
        Ok(())
    }
    /// A write of exactly one whole chunk over a chunk held and shared
    /// with no read is stored into it by non-temporal stores
    /// ([`bufpool::copy_streaming`]); the caller's buffer, still in the
    /// cache where the socket put it, goes back to its pool for the next
    /// write, and nothing is allocated. Otherwise (a chunk never written,
    /// or one a read holds) the buffer becomes that chunk as it is (a
    /// clone of the handle), and the chunk it replaces goes back to this
    /// thread's buffer pool when nothing shares it. Anything else is
    /// copied as by [`BlockBackend::write_at`]. An adopted buffer is
    /// immutable like every chunk: while the caller (or a read) still
    /// holds it, a later write to the chunk copies it first. A read still
    /// holding the replaced chunk keeps it unchanged.
    ///
    /// Why not always adopt: the chunk it replaces has long left the cache,
    /// so the next write, received into it, read every line of it from
    /// memory before overwriting it. Storing into the held chunk leaves
    /// one pooled buffer receiving every write, hot, and writes the chunk
    /// without reading it first.
    fn write(&self, data: &WriteData, offset: u64, fua: bool) -> io::Result<()> {
        let WriteData::Owned(data) = data else {
            return crate::write_by_segments(self, data, offset, fua);
        };
        check_range(self.len(), offset, data.len())?;
        if data.len() != CHUNK as usize || offset & (CHUNK - 1) != 0 {
            return self.write_at(data, offset, fua);
        }
        let idx = (offset >> CHUNK_SHIFT) as usize;
        let mut g = self.chunk_for_write(idx).write();
        let (old, sums) = match g.take() {
            None => (None, None),
            Some(Stored {
                data: held,
                mut sums,
                ..
            }) => match held.try_into_mut() {
                // Nothing shares the bytes (the steady state): stored into
                // them, and no one records a block CRC of them until they
                // are stored again (BlockSums' rule).
                Ok(mut m) => {
                    sums.forget(0, m.len());
                    bufpool::copy_streaming(&mut m, data);
                    *g = Some(Stored::new(m.freeze(), Some(sums)));
                    return Ok(());
                }
                // A read holds them: it keeps them, and the buffer is
                // adopted, with the sums when no read holds those.
                Err(shared) => match Arc::get_mut(&mut sums) {
                    Some(s) => {
                        s.rebase(data.as_ptr(), data.len());
                        (Some(shared), Some(sums))
                    }
                    None => (Some(shared), None),
                },
            },
        };
        *g = Some(Stored::new(data.clone(), sums));
        drop(g);
        if let Some(old) = old {
            bufpool::give(old);
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn set_write_cache(&self, _policy: WriteCache) -> io::Result<()> {
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range_u64(self.len(), offset, len)?;
        self.for_each_range(offset, len, |idx, within, n| {
            self.modify(idx, within, n, |c| c.fill(0));
        });
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let size = self.len();
        check_range_u64(size, offset, len)?;
        self.for_each_range(offset, len, |idx, within, n| {
            // A segment never written to holds nothing to free.
            let Some(c) = self.chunk(idx) else { return };
            let mut g = c.write();
            // The last chunk may be short: whole means up to the end.
            let chunk_len = (size - ((idx as u64) << CHUNK_SHIFT)).min(CHUNK) as usize;
            if within == 0 && n == chunk_len {
                *g = None;
            } else if g.is_some() {
                drop(g);
                self.modify(idx, within, n, |c| c.fill(0));
            }
        });
        Ok(())
    }
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Extent> {
        check_range_u64(self.len(), offset, len)?;
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty range"));
        }
        let state = |idx: usize| self.chunk(idx).is_some_and(|c| c.read().is_some());
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
}

/// Cache lines [`FastPaths::prefetch`] asks for at the start of a read:
/// enough for the processor's own prefetcher to take over the rest of the
/// page; more only queue behind each other (measured: a cold 4 KiB copy
/// between other work took ~720 ns, ~410 ns with 8 lines asked for one
/// command ahead, ~550 ns with all 64).
const PREFETCH_LINES: usize = 8;

impl FastPaths for MemBackend {
    /// Small reads are copied ([`MemBackend::read_bytes`]) or shared and
    /// copied by the kernel as it sends them: either way their first
    /// lines are asked for now, from the chunk as it is (a stale pointer
    /// costs nothing: prefetching never faults, and nothing is read).
    fn prefetch(&self, offset: u64, len: usize) {
        if len >= SHARE_MIN || offset >= self.len() {
            return;
        }
        let idx = (offset >> CHUNK_SHIFT) as usize;
        let within = (offset & (CHUNK - 1)) as usize;
        let Some(c) = self.chunk(idx) else { return };
        let Some(at) = c.read().as_ref().map(|s| s.data.as_ptr() as usize + within) else {
            return;
        };
        let lines = len.div_ceil(64).min(PREFETCH_LINES);
        let first = at & !63;
        for l in 0..lines {
            prefetch_line(first + l * 64);
        }
    }

    fn read_chain(&self, offset: u64, len: usize) -> io::Result<Chain> {
        check_range(self.len(), offset, len)?;
        if len < SHARE_MIN {
            if let Some(c) = self.share_small(offset, len) {
                return Ok(c);
            }
            return self.read_bytes(offset, len).map(Chain::from);
        }
        let mut out = Chain::new();
        Self::for_each_chunk(offset, len, |idx, within, r| {
            let (b, sums) = self
                .shared_piece(idx, within, r.len(), None)
                .expect("shared whatever the chunk's writes");
            out.push_summed(b, Some(sums));
        });
        Ok(out)
    }
}

/// Asks for the cache line at `addr` (a hint: it never faults).
#[inline]
fn prefetch_line(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees and never faults,
    // whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

impl MemBackend {
    /// A small read within one chunk, shared rather than copied when that
    /// costs no write a copy of the chunk: the chunk was never written
    /// (the static zeros), or no write came for [`QUIET_MS`]. `None`: copy
    /// it ([`Self::read_bytes`]).
    fn share_small(&self, offset: u64, len: usize) -> Option<Chain> {
        let within = (offset & (CHUNK - 1)) as usize;
        if within + len > CHUNK as usize {
            return None;
        }
        let idx = (offset >> CHUNK_SHIFT) as usize;
        let (b, sums) = self.shared_piece(idx, within, len, Some(now_ms()))?;
        let mut out = Chain::new();
        out.push_summed(b, Some(sums));
        Some(out)
    }

    /// Bytes `within .. within + n` of chunk `idx` as a shared slice, with
    /// the chunk's block CRCs (the static zeros for a chunk never
    /// written). With `quiet_at`, only a chunk quiet at that time
    /// ([`Stored::quiet`]) is shared: `None` otherwise.
    fn shared_piece(
        &self,
        idx: usize,
        within: usize,
        n: usize,
        quiet_at: Option<u32>,
    ) -> Option<(Bytes, Arc<BlockSums>)> {
        if let Some(c) = self.chunk(idx) {
            if let Some(s) = &*c.read() {
                if quiet_at.is_some_and(|now| !s.quiet(now)) {
                    return None;
                }
                return Some((s.data.slice(within..within + n), s.sums.clone()));
            }
        }
        Some((
            Bytes::from_static(&ZEROS[within..within + n]),
            ZERO_SUMS.clone(),
        ))
    }

    /// Reads `len` bytes at `offset` into one pooled buffer (the reads
    /// below `SHARE_MIN` that are not shared: [`Self::share_small`]).
    pub fn read_bytes(&self, offset: u64, len: usize) -> io::Result<bytes::Bytes> {
        check_range(self.len(), offset, len)?;
        // Filled by copying straight from the chunks into a pooled buffer:
        // no zeroing first, no allocation in steady state.
        let mut v = bufpool::take(len);
        Self::for_each_chunk(offset, len, |idx, within, r| {
            let n = r.len();
            match self.chunk(idx) {
                Some(c) => match &*c.read() {
                    Some(c) => v.extend_from_slice(&c.data[within..within + n]),
                    None => v.resize(v.len() + n, 0),
                },
                None => v.resize(v.len() + n, 0),
            }
        });
        Ok(v.freeze())
    }

    /// Runs `f` on bytes `within .. within + n` of chunk `idx` for
    /// writing: allocated (zeroed) when never written, copied first when a
    /// read still shares it. The blocks it touches are forgotten from the
    /// chunk's sums (the copy's, after a copy).
    fn modify(&self, idx: usize, within: usize, n: usize, f: impl FnOnce(&mut [u8])) {
        let mut g = self.chunk_for_write(idx).write();
        let (mut m, sums) = match g.take() {
            None => (BytesMut::zeroed(CHUNK as usize), None),
            Some(Stored { data, sums, .. }) => match data.try_into_mut() {
                // Nothing shares the bytes, so no one records a block CRC
                // of them until they are stored again (BlockSums' rule).
                Ok(m) => {
                    sums.forget(within, n);
                    (m, Some(sums))
                }
                Err(shared) => {
                    let m = BytesMut::from(&shared[..]);
                    let copied = sums.copy_to(m.as_ptr());
                    copied.forget(within, n);
                    (m, Some(Arc::new(copied)))
                }
            },
        };
        f(&mut m[within..within + n]);
        *g = Some(Stored::new(m.freeze(), sums));
    }

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
    fn small_reads_share_quiet_chunks_and_copy_written_ones() {
        let m = MemBackend::new(2 * CHUNK);
        m.write_at(&[5u8; 4096], 0, false).unwrap();
        let held = |m: &MemBackend| m.chunk(0).unwrap().read().as_ref().unwrap().data.as_ptr();
        let before = held(&m);
        // Just written: copied, so a write while the read is held stores
        // into the chunk.
        let r = m.read_chain(0, 4096).unwrap();
        m.write_at(&[6u8; 512], 8192, false).unwrap();
        assert_eq!(held(&m), before, "written in place");
        assert_eq!(r.to_vec(), vec![5u8; 4096]);
        // Quiet: shared; a write while the read holds it copies the chunk,
        // and the read keeps the bytes it had.
        m.chunk(0).unwrap().write().as_mut().unwrap().written_ms = now_ms().wrapping_sub(QUIET_MS);
        let r = m.read_chain(0, 4096).unwrap();
        m.write_at(&[7u8; 4096], 0, false).unwrap();
        assert_ne!(held(&m), before, "copied before the write");
        assert_eq!(r.to_vec(), vec![5u8; 4096]);
        let mut now = vec![0u8; 4096];
        m.read_at(&mut now, 0).unwrap();
        assert_eq!(now, vec![7u8; 4096]);
        // Never written: the static zeros; across two chunks: copied.
        assert!(m
            .read_chain(CHUNK, 4096)
            .unwrap()
            .to_vec()
            .iter()
            .all(|&b| b == 0));
        let across = m.read_chain(CHUNK - 512, 1024).unwrap().to_vec();
        assert!(across[..512].iter().all(|&b| b == 0) && across[512..].iter().all(|&b| b == 0));
    }

    #[test]
    fn large_reads_share_chunks_and_writes_copy_them_first() {
        let m = MemBackend::new(3 * CHUNK);
        m.write_at(&vec![1u8; CHUNK as usize], 0, false).unwrap();
        // Chunk 0 written, chunk 1 never: both served without copying.
        let at = CHUNK - 4096;
        let len = SHARE_MIN + 8192;
        let held = m.read_chain(at, len).unwrap();
        assert_eq!(held.segment_count(), 2);
        let v = held.to_vec();
        assert!(v[..4096].iter().all(|&b| b == 1));
        assert!(v[4096..].iter().all(|&b| b == 0));
        let first = held.segments().next().unwrap().clone();
        let chunk_ptr = m.chunk(0).unwrap().read().as_ref().unwrap().data.as_ptr();
        assert_eq!(first.as_ptr(), chunk_ptr.wrapping_add(at as usize));
        // A write while the read is held copies the chunk: the held data
        // stays as it was, later reads see the write.
        m.write_at(&[9u8; 4096], at, false).unwrap();
        assert!(held.to_vec()[..4096].iter().all(|&b| b == 1));
        let mut now = vec![0u8; 4096];
        m.read_at(&mut now, at).unwrap();
        assert!(now.iter().all(|&b| b == 9));
        assert_ne!(
            m.chunk(0).unwrap().read().as_ref().unwrap().data.as_ptr(),
            chunk_ptr
        );
        // Small reads are copied: writes after them keep the chunk in place.
        drop((held, first));
        let small = m.read_chain(at, 4096).unwrap();
        let ptr = m.chunk(0).unwrap().read().as_ref().unwrap().data.as_ptr();
        m.write_at(&[3u8; 512], 0, false).unwrap();
        assert_eq!(
            m.chunk(0).unwrap().read().as_ref().unwrap().data.as_ptr(),
            ptr
        );
        assert!(small.to_vec().iter().all(|&b| b == 9));
        assert!(m.read_chain(3 * CHUNK - 100, SHARE_MIN).is_err());
    }

    #[test]
    fn whole_chunk_writes_adopt_a_new_chunk_and_store_into_a_held_one() {
        let m = MemBackend::new(3 * CHUNK);
        let mut b = BytesMut::with_capacity(CHUNK as usize);
        b.resize(CHUNK as usize, 5);
        let ptr = b.as_ptr();
        m.write(&WriteData::Owned(b.freeze()), CHUNK, false)
            .unwrap();
        let held = m.chunk(1).unwrap().read().as_ref().unwrap().data.clone();
        assert_eq!(held.as_ptr(), ptr, "a chunk never written adopts");
        drop(held);
        let mut back = vec![0u8; 8192];
        m.read_at(&mut back, 2 * CHUNK - 4096).unwrap();
        assert!(back[..4096].iter().all(|&x| x == 5));
        assert!(back[4096..].iter().all(|&x| x == 0));
        // A held chunk nothing shares is stored into: it stays where it
        // is, and the caller's buffer is neither kept nor changed.
        let mut next = BytesMut::with_capacity(CHUNK as usize);
        next.resize(CHUNK as usize, 0);
        for (i, x) in next.iter_mut().enumerate() {
            *x = (i % 251) as u8;
        }
        let next = next.freeze();
        let next_ptr = next.as_ptr();
        m.write(&WriteData::Owned(next.clone()), CHUNK, false)
            .unwrap();
        let now = m.chunk(1).unwrap().read().as_ref().unwrap().data.clone();
        assert_eq!(now.as_ptr(), ptr, "stored into, not replaced");
        assert_eq!(now, next);
        drop(now);
        let back = next.try_into_mut().expect("the store kept no handle");
        assert_eq!(back.as_ptr(), next_ptr);
        // Block sums known before the store are not kept for the new bytes.
        let chain = m.read_chain(CHUNK, CHUNK as usize).unwrap();
        assert_eq!(chain.to_vec(), m.read_bytes(CHUNK, CHUNK as usize).unwrap());
        drop(chain);
        // A later small write modifies the chunk in place (nothing shares it).
        m.write_at(&[7u8; 512], CHUNK, false).unwrap();
        assert_eq!(
            m.chunk(1).unwrap().read().as_ref().unwrap().data.as_ptr(),
            ptr
        );
        assert!(m
            .write(
                &WriteData::Owned(Bytes::from(vec![1u8; CHUNK as usize])),
                3 * CHUNK,
                false
            )
            .is_err());
        assert!(m
            .write(
                &WriteData::Owned(Bytes::from(vec![1u8; 512])),
                3 * CHUNK,
                false
            )
            .is_err());
    }

    #[test]
    fn partial_and_shared_buffers_are_copied() {
        let m = MemBackend::new(4 * CHUNK);
        // Unaligned: copied across two chunks.
        let data = Bytes::from((0..CHUNK as u32).map(|i| i as u8).collect::<Vec<u8>>());
        m.write(&WriteData::Owned(data.clone()), 4096, false)
            .unwrap();
        let mut back = vec![0u8; CHUNK as usize];
        m.read_at(&mut back, 4096).unwrap();
        assert_eq!(back, data[..]);
        assert_ne!(
            m.chunk(0).unwrap().read().as_ref().unwrap().data.as_ptr(),
            data.as_ptr()
        );
        // Aligned and still held by the caller: adopted, and a later write
        // to the chunk copies it first, so the caller's bytes never change.
        let held = data.clone();
        m.write(&WriteData::Owned(data.clone()), 2 * CHUNK, false)
            .unwrap();
        assert_eq!(
            m.chunk(2).unwrap().read().as_ref().unwrap().data.as_ptr(),
            held.as_ptr()
        );
        m.write_at(&[9u8; 512], 2 * CHUNK, false).unwrap();
        assert_eq!(held[0], 0);
        assert_ne!(
            m.chunk(2).unwrap().read().as_ref().unwrap().data.as_ptr(),
            held.as_ptr()
        );
        let mut b = vec![0u8; 4];
        m.read_at(&mut b, 2 * CHUNK).unwrap();
        assert_eq!(b, [9u8; 4]);
    }

    #[test]
    fn adopting_never_changes_a_chunk_a_read_holds() {
        let m = MemBackend::new(2 * CHUNK);
        m.write_at(&vec![1u8; CHUNK as usize], 0, false).unwrap();
        let held = m.read_chain(0, CHUNK as usize).unwrap();
        m.write(
            &WriteData::Owned(Bytes::from(vec![2u8; CHUNK as usize])),
            0,
            false,
        )
        .unwrap();
        assert!(held.to_vec().iter().all(|&b| b == 1));
        let mut now = vec![0u8; 4096];
        m.read_at(&mut now, 0).unwrap();
        assert!(now.iter().all(|&b| b == 2));
        // Shrinking frees an adopted chunk like any other; growing reads
        // zeros there.
        m.write(
            &WriteData::Owned(Bytes::from(vec![4u8; CHUNK as usize])),
            CHUNK,
            false,
        )
        .unwrap();
        m.resize(CHUNK).unwrap();
        assert_eq!(m.resident_bytes(), CHUNK);
        m.resize(2 * CHUNK).unwrap();
        m.read_at(&mut now, CHUNK).unwrap();
        assert!(now.iter().all(|&b| b == 0));
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
        // Segments are made on the first write into them: a 16 TiB store
        // costs nothing until written, and a write at its end takes only
        // the last segment.
        m.resize(MemBackend::MAX_SIZE).unwrap();
        assert!(m.resize(MemBackend::MAX_SIZE + CHUNK).is_err());
        let mut b = [1u8; 512];
        m.read_at(&mut b, MemBackend::MAX_SIZE - 512).unwrap();
        assert_eq!(b, [0u8; 512]);
        assert_eq!(m.segments.iter().filter(|s| s.get().is_some()).count(), 1);
        m.discard(MemBackend::MAX_SIZE - CHUNK, CHUNK).unwrap();
        let e = m
            .allocation(MemBackend::MAX_SIZE - 2 * CHUNK, 2 * CHUNK)
            .unwrap();
        assert!(!e.allocated);
        assert_eq!(m.segments.iter().filter(|s| s.get().is_some()).count(), 1);
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

    mod sums {
        //! The chunks' cached block CRCs stay true whatever the writes,
        //! and whatever the reads hold while they happen.
        use super::*;
        use iscsi_wire::digest::{crc32c, crc32c_summed};
        use proptest::prelude::*;

        const SIZE: u64 = 3 * CHUNK;

        #[derive(Debug, Clone)]
        enum Op {
            /// A large read, its digest computed (recording block CRCs)
            /// and the read kept.
            Hold(u64, usize),
            /// The oldest held read let go.
            Release,
            Write(u64, usize, u8),
            WholeChunk(u64, u8),
            Zeroes(u64, u64),
            Discard(u64, u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            let at = (0..SIZE / 512).prop_map(|b| b * 512);
            prop_oneof![
                3 => (at.clone(), 128usize..512).prop_map(|(a, k)| Op::Hold(a, k * 512)),
                2 => Just(Op::Release),
                3 => (at.clone(), 1usize..40, any::<u8>()).prop_map(|(a, k, v)| Op::Write(a, k * 512, v)),
                1 => (0..SIZE / CHUNK, any::<u8>()).prop_map(|(c, v)| Op::WholeChunk(c * CHUNK, v)),
                1 => (at.clone(), 1u64..3000).prop_map(|(a, k)| Op::Zeroes(a, k * 512)),
                1 => (at, 1u64..3000).prop_map(|(a, k)| Op::Discard(a, k * 512)),
            ]
        }

        /// The digest of `c` as the send queue folds it, checked against
        /// its bytes.
        fn check(c: &Chain) {
            for (b, sums) in c.summed_segments() {
                assert_eq!(
                    crc32c_summed(b, sums.expect("large reads carry sums")),
                    crc32c(b)
                );
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            #[test]
            fn known_block_crcs_match_the_bytes(ops in proptest::collection::vec(op(), 1..60)) {
                let m = MemBackend::new(SIZE);
                let mut held = std::collections::VecDeque::new();
                for op in ops {
                    let fits = |a: u64, n: u64| a + n <= SIZE;
                    match op {
                        Op::Hold(a, n) if fits(a, n as u64) => {
                            let c = m.read_chain(a, n).unwrap();
                            check(&c);
                            held.push_back(c);
                        }
                        Op::Release => drop(held.pop_front()),
                        Op::Write(a, n, v) if fits(a, n as u64) => {
                            m.write_at(&vec![v; n], a, false).unwrap()
                        }
                        Op::WholeChunk(a, v) => m
                            .write(&WriteData::Owned(Bytes::from(vec![v; CHUNK as usize])), a, false)
                            .unwrap(),
                        Op::Zeroes(a, n) if fits(a, n) => m.write_zeroes(a, n).unwrap(),
                        Op::Discard(a, n) if fits(a, n) => m.discard(a, n).unwrap(),
                        _ => {}
                    }
                    // What is held still folds to its own bytes, and every
                    // known CRC of every chunk is its block's.
                    held.iter().for_each(check);
                    for (_, c) in m.chunks_from(0) {
                        if let Some(s) = &*c.read() {
                            for i in 0..s.sums.blocks() {
                                if let Some(v) = s.sums.get(i) {
                                    let at = i * filemap::SUM_BLOCK;
                                    prop_assert_eq!(v, crc32c(&s.data[at..at + filemap::SUM_BLOCK]));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
