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
}
