//! [`BlockSums`]: the CRC32C of each 4 KiB block of one immutable buffer,
//! kept beside it so that data digests (RFC 7143 §12.1) over its bytes
//! need not read them again.
//!
//! A RAM LUN's chunks are immutable while anything shares them (a write
//! copies a shared chunk first), so the CRC of a block, once computed, is
//! true for as long as the chunk lives. The send queue folds the cached
//! block CRCs of a data segment into its digest (CRC combination) instead
//! of running CRC32C over every byte; a block not yet known is computed
//! once, from the bytes being sent, and stored for the next read.
//!
//! This crate only keeps the values; computing and folding them is the
//! digest code's (`iscsi_wire::digest`).
//!
//! # The rule that keeps a cached CRC true
//!
//! A block's CRC is stored only by code that holds a [`Bytes`] slice of
//! the buffer, computed from that slice. A buffer that some slice shares
//! cannot be changed in place (its owner must copy it first, and then
//! gives the copy sums of its own), so a stored CRC always describes the
//! buffer's bytes. The owner changes bytes in place only when it holds the
//! buffer alone ([`Bytes::try_into_mut`]), and then calls
//! [`BlockSums::forget`] for what it changed; the release of the last
//! other handle (an atomic reference count) orders every store made while
//! it was held before that.
//!
//! [`Bytes`]: bytes::Bytes

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

/// Bytes covered by one cached CRC.
pub const SUM_BLOCK: usize = 4096;

/// Blocks one [`BlockSums`] holds at most: a buffer of up to 1 MiB (a RAM
/// LUN's chunk), so that the sums are one allocation.
pub const MAX_SUM_BLOCKS: usize = 256;

/// CRC32C of each [`SUM_BLOCK`] of one buffer (see the module docs).
#[derive(Debug)]
pub struct BlockSums {
    /// Address of the buffer's first byte.
    base: usize,
    /// The buffer's length, whole blocks only count.
    len: usize,
    vals: [AtomicU32; MAX_SUM_BLOCKS],
    /// Bit `i` set: `vals[i]` holds block `i`'s CRC.
    known: [AtomicU64; MAX_SUM_BLOCKS / 64],
}

impl BlockSums {
    /// Sums, none known yet, for the `len` bytes at `base`.
    ///
    /// # Panics
    /// When `len` is more than [`MAX_SUM_BLOCKS`] blocks.
    pub fn new(base: *const u8, len: usize) -> Self {
        assert!(len <= MAX_SUM_BLOCKS * SUM_BLOCK, "sums for {len} bytes");
        BlockSums {
            base: base as usize,
            len,
            vals: std::array::from_fn(|_| AtomicU32::new(0)),
            known: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Makes these sums (held alone) describe another buffer of the same
    /// length, none known, without allocating.
    ///
    /// # Panics
    /// When `len` differs.
    pub fn rebase(&mut self, base: *const u8, len: usize) {
        assert_eq!(len, self.len, "rebase onto a buffer of another length");
        self.base = base as usize;
        for k in self.known.iter_mut() {
            *k.get_mut() = 0;
        }
    }

    /// A copy for a copy of the buffer at `base`: the same blocks known.
    pub fn copy_to(&self, base: *const u8) -> Self {
        // The known bits first: a bit seen set orders its value's store
        // before the value is read.
        let known = std::array::from_fn(|i| AtomicU64::new(self.known[i].load(Ordering::Acquire)));
        BlockSums {
            base: base as usize,
            len: self.len,
            vals: std::array::from_fn(|i| AtomicU32::new(self.vals[i].load(Ordering::Relaxed))),
            known,
        }
    }

    /// True when these sums describe the buffer starting at `base`.
    pub fn is_for(&self, base: *const u8) -> bool {
        self.base == base as usize
    }

    /// Where `s` starts in the buffer, if it lies inside it.
    #[inline]
    pub fn offset_of(&self, s: &[u8]) -> Option<usize> {
        let at = (s.as_ptr() as usize).checked_sub(self.base)?;
        (at.checked_add(s.len())? <= self.len).then_some(at)
    }

    /// Number of whole blocks.
    pub fn blocks(&self) -> usize {
        self.len / SUM_BLOCK
    }

    /// Block `i`'s CRC, when known.
    #[inline]
    pub fn get(&self, i: usize) -> Option<u32> {
        let known = self.known[i / 64].load(Ordering::Acquire);
        (known & (1 << (i % 64)) != 0).then(|| self.vals[i].load(Ordering::Relaxed))
    }

    /// Records block `i`'s CRC, computed from a slice of the buffer the
    /// caller holds (module docs).
    #[inline]
    pub fn set(&self, i: usize, crc: u32) {
        self.vals[i].store(crc, Ordering::Relaxed);
        self.known[i / 64].fetch_or(1 << (i % 64), Ordering::Release);
    }

    /// Forgets the blocks that bytes `off .. off + n` touch: the owner is
    /// about to change them in place.
    pub fn forget(&self, off: usize, n: usize) {
        if n == 0 {
            return;
        }
        let first = off / SUM_BLOCK;
        let end = (off + n).div_ceil(SUM_BLOCK).min(self.blocks());
        for i in first..end {
            self.known[i / 64].fetch_and(!(1 << (i % 64)), Ordering::Release);
        }
    }

    /// Number of blocks whose CRC is known (tests and diagnostics).
    pub fn known(&self) -> usize {
        self.known
            .iter()
            .map(|k| k.load(Ordering::Relaxed).count_ones() as usize)
            .sum()
    }
}

/// Bytes one [`BlockSums`] of a [`FileSums`] covers: 1 MiB of the file.
pub const SUM_CHUNK: usize = MAX_SUM_BLOCKS * SUM_BLOCK;

/// Chunks (of [`SUM_CHUNK`]) one second-level table of a [`FileSums`]
/// covers: 4 GiB of the file.
const LEVEL_CHUNKS: usize = 4096;

/// Second-level tables a [`FileSums`] has: with [`LEVEL_CHUNKS`], the first
/// 16 TiB of a file can have sums; blocks past that are always read.
const LEVELS: usize = 4096;

type Level = Box<[OnceLock<Box<BlockSums>>]>;

/// The CRC32C of a file's 4 KiB blocks, by offset in the file: the
/// [`BlockSums`] of each MiB, made when a data digest first covers it.
///
/// A file's bytes are not immutable as a RAM LUN's shared chunks are, so
/// the rule that keeps these true is the file's [`crate::WriteGate`]'s:
/// a block's CRC is recorded ([`BlockSums::set`]) only while a guarding
/// [`crate::Pin`] covers the block (no write to it can be in progress, and
/// none can start), and every write the gate lets through forgets the
/// blocks it touches first ([`Self::forget`], from [`crate::WriteGate`]'s
/// entry, after it has waited for the guarding pins over its range). The
/// gate's lock and counters order a recording before the forgetting of any
/// later write (gate.rs).
///
/// Writes by other programs do not pass the gate. Those made by `write(2)`
/// or `fallocate(2)` (`cp`, `dd`, `qemu-img`) change the file's ctime, and
/// every digest computed in place first compares the ctime with the one
/// last seen ([`Self::check`]): when it differs, everything is forgotten.
/// (Our own writes change it too, harmlessly: by `fallocate`, by `pwrite`
/// where a store could not take the bytes, and by a store or receive into
/// the mapping at a page's first write fault.) On kernels
/// with multigrain timestamps (6.13 and later, tmpfs included) a change
/// made after the ctime was looked at always gets a new one. What is not
/// seen: stores by another program through its own mapping of the file,
/// and writes by another program racing the reads (torn data, with or
/// without sums). As with any zero-copy read, the LUN's file is to be
/// written only through ironsan while it is served.
///
/// Memory: a 96 KiB table once the first digest is computed in place, a
/// 64 KiB table per 4 GiB of the file read so, and about 1.1 KiB per MiB
/// (0.1 %) read so. Only files in memory are read in place, so the sums
/// are 0.1 % of the memory the file's read pages already take. They live
/// as long as the gate.
#[derive(Debug, Default)]
pub struct FileSums {
    levels: OnceLock<Box<[OnceLock<Level>]>>,
    /// The file's ctime (ns since the epoch) when last checked.
    seen: AtomicU64,
}

impl FileSums {
    /// Sums with nothing known, and no memory taken.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets everything when `file`'s ctime is not the one seen last
    /// time (or cannot be had): another program changed it (see above).
    /// One `statx(2)`.
    pub fn check(&self, file: &std::fs::File) {
        use std::os::unix::fs::MetadataExt;
        let now = file
            .metadata()
            .ok()
            .and_then(|m| {
                let s = u64::try_from(m.ctime()).ok()?;
                s.checked_mul(1_000_000_000)?
                    .checked_add(u64::try_from(m.ctime_nsec()).ok()?)
            })
            .unwrap_or(u64::MAX);
        if now == u64::MAX || self.seen.load(Ordering::Acquire) != now {
            // Forgotten before the new time is published: whoever sees it
            // finds nothing from before.
            self.forget(0, u64::MAX);
            self.seen.store(now, Ordering::Release);
        }
    }

    /// Makes room for the sums of every block of `offset .. offset + len`
    /// (within the first 16 TiB), so that [`Self::chunk`] finds them
    /// without allocating. May allocate.
    pub fn prepare(&self, offset: u64, len: u64) {
        let Some((first, end)) = chunk_span(offset, len) else {
            return;
        };
        let levels = self
            .levels
            .get_or_init(|| (0..LEVELS).map(|_| OnceLock::new()).collect());
        for c in first..end {
            let level = levels[c / LEVEL_CHUNKS]
                .get_or_init(|| (0..LEVEL_CHUNKS).map(|_| OnceLock::new()).collect());
            level[c % LEVEL_CHUNKS]
                .get_or_init(|| Box::new(BlockSums::new(std::ptr::null(), SUM_CHUNK)));
        }
    }

    /// The sums of chunk `c` (bytes `c * SUM_CHUNK ..` of the file), if
    /// made. Never allocates or blocks.
    #[inline]
    pub fn chunk(&self, c: u64) -> Option<&BlockSums> {
        let c = usize::try_from(c).ok()?;
        let level = self.levels.get()?.get(c / LEVEL_CHUNKS)?.get()?;
        level[c % LEVEL_CHUNKS].get().map(|b| &**b)
    }

    /// Forgets the blocks that bytes `offset .. offset + len` of the file
    /// touch: a write is about to change them. Nothing to do (one load)
    /// while no digest was ever computed in place.
    #[inline]
    pub fn forget(&self, offset: u64, len: u64) {
        let Some(levels) = self.levels.get() else {
            return;
        };
        let Some((first, end)) = chunk_span(offset, len) else {
            return;
        };
        let mut c = first;
        while c < end {
            let level_end = (c / LEVEL_CHUNKS + 1) * LEVEL_CHUNKS;
            let stop = end.min(level_end);
            if let Some(level) = levels[c / LEVEL_CHUNKS].get() {
                for i in c..stop {
                    if let Some(s) = level[i % LEVEL_CHUNKS].get() {
                        let base = (i * SUM_CHUNK) as u64;
                        let from = offset.max(base) - base;
                        let to = offset.saturating_add(len).min(base + SUM_CHUNK as u64) - base;
                        s.forget(from as usize, (to - from) as usize);
                    }
                }
            }
            c = stop;
        }
    }
}

/// The chunks `offset .. offset + len` touches, clipped to the table's
/// reach; `None` when that leaves none.
fn chunk_span(offset: u64, len: u64) -> Option<(usize, usize)> {
    if len == 0 {
        return None;
    }
    let reach = (LEVELS * LEVEL_CHUNKS) as u64;
    let first = offset / SUM_CHUNK as u64;
    let end = (offset.saturating_add(len).div_ceil(SUM_CHUNK as u64)).min(reach);
    (first < end).then_some((first as usize, end as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_forgets_and_locates() {
        let buf = vec![0u8; 5 * SUM_BLOCK + 100];
        let mut s = BlockSums::new(buf.as_ptr(), buf.len());
        assert_eq!(s.blocks(), 5);
        assert_eq!(s.get(3), None);
        s.set(3, 77);
        s.set(4, 78);
        assert_eq!((s.get(3), s.get(4), s.known()), (Some(77), Some(78), 2));
        s.forget(3 * SUM_BLOCK + 4095, 1);
        assert_eq!((s.get(3), s.get(4)), (None, Some(78)));
        s.forget(5 * SUM_BLOCK, 100);
        assert_eq!(s.get(4), Some(78), "the partial tail is no block");
        assert_eq!(s.offset_of(&buf[SUM_BLOCK..2 * SUM_BLOCK]), Some(SUM_BLOCK));
        assert_eq!(s.offset_of(&buf[..]), Some(0));
        let other = vec![0u8; 10];
        assert_eq!(s.offset_of(&other), None);
        let c = s.copy_to(other.as_ptr());
        assert_eq!(c.get(4), Some(78));
        s.rebase(buf.as_ptr(), buf.len());
        assert_eq!(s.known(), 0);
    }

    #[test]
    fn file_sums_are_made_on_demand_and_forgotten_by_range() {
        let f = FileSums::new();
        assert!(f.chunk(0).is_none());
        f.forget(0, u64::MAX); // nothing made: nothing to do
        let mib = SUM_CHUNK as u64;
        f.prepare(mib - 4096, 8192);
        assert!(f.chunk(0).is_some() && f.chunk(1).is_some());
        assert!(f.chunk(2).is_none(), "only the chunks asked for");
        // The sizes the docs give.
        assert_eq!(std::mem::size_of::<OnceLock<Level>>() * LEVELS, 96 << 10);
        assert_eq!(
            std::mem::size_of::<OnceLock<Box<BlockSums>>>() * LEVEL_CHUNKS,
            64 << 10
        );
        for c in 0..2 {
            for b in 0..MAX_SUM_BLOCKS {
                f.chunk(c).unwrap().set(b, b as u32);
            }
        }
        // The last block of chunk 0 and the first two of chunk 1.
        f.forget(mib - 1, 4098);
        let c0 = f.chunk(0).unwrap();
        let c1 = f.chunk(1).unwrap();
        assert_eq!((c0.get(254), c0.get(255)), (Some(254), None));
        assert_eq!((c1.get(0), c1.get(1), c1.get(2)), (None, None, Some(2)));
        f.forget(0, u64::MAX);
        assert_eq!(c0.known() + c1.known(), 0, "a resize forgets everything");
        // Past the table's reach: nothing made, nothing known.
        let far = (LEVELS * LEVEL_CHUNKS) as u64 * mib;
        f.prepare(far, 4096);
        assert!(f.chunk(far / mib).is_none());
        f.forget(far - 1, 2);
        f.prepare(u64::MAX - 10, 100);
    }

    #[test]
    #[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
    fn file_sums_are_forgotten_when_another_program_changes_the_file() {
        use std::io::Write;
        use std::os::unix::fs::MetadataExt;
        // tmpfs, where file LUNs are read in place.
        let mut file =
            crate::unlinked_file(std::path::Path::new("/dev/shm"), "ctime").expect("/dev/shm");
        file.write_all(&[1u8; 8192]).unwrap();
        let f = FileSums::new();
        f.prepare(0, 8192);
        let c = f.chunk(0).unwrap();
        f.check(&file);
        c.set(0, 5);
        f.check(&file);
        assert_eq!(c.get(0), Some(5), "the file did not change");
        // A write that is not ours, at once: with multigrain timestamps
        // the ctime differs; with coarse ones, only in the next tick.
        let before = file.metadata().unwrap().ctime_nsec();
        file.write_all(&[2u8; 10]).unwrap();
        if file.metadata().unwrap().ctime_nsec() == before {
            std::thread::sleep(std::time::Duration::from_millis(20));
            file.write_all(&[2u8; 10]).unwrap();
        }
        f.check(&file);
        assert_eq!(c.get(0), None);
    }
}
