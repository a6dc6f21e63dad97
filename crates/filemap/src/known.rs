//! [`KnownPages`]: the pages of a mapped file that are known to be in the
//! page cache, so that reading them through the mapping allocates nothing.
//!
//! A read fault on a hole of a tmpfs file allocates the page; `mincore(2)`
//! tells holes from pages, but costs more than copying a 4 KiB block out
//! of the mapping (0.98 µs per call against 0.61 µs for the copy of a
//! cold block, and 0.95 µs for its `pread`, on this project's machine).
//! So the file's owner records
//! what it knows for itself: a page it wrote is in the page cache (any
//! store into a page allocates it), and so is a page `mincore` or
//! `SEEK_DATA` found there. It forgets the pages it punches holes into,
//! before punching them.
//!
//! The record is a hint that may only err one way without cost: a page
//! recorded as present that is a hole again (another program punched it,
//! or a read raced our own punch) costs one page of memory when it is
//! read through the mapping, which then allocates it, filled with zeros:
//! the bytes read are still the file's. The same page taken as present
//! for a write received in place ([`crate::FileMap::place`]) is allocated
//! by the kernel's copy, which on a full tmpfs fails that write (WRITE
//! ERROR) where `pwrite` would have said ENOSPC. A page present but not
//! recorded is read with `pread(2)`, as before.
//!
//! One bit per page, in leaves of [`LEAF_PAGES`] pages allocated on their
//! first mark: 4 KiB of record per 128 MiB of file written (4 KiB pages),
//! plus 24 bytes per 128 MiB of mapping for the leaves' slots.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Pages per leaf (one bit each): 4 KiB of words.
const LEAF_PAGES: usize = 512 * 64;

/// Which pages of a mapping of `len` bytes are known to be present.
#[derive(Debug)]
pub(crate) struct KnownPages {
    /// log2 of the page size.
    shift: u32,
    /// Pages the record covers (the mapping's, rounded up).
    pages: usize,
    leaves: Box<[OnceLock<Box<[AtomicU64]>>]>,
}

impl KnownPages {
    /// A record of nothing known, for `len` bytes in pages of `page` bytes
    /// (a power of two).
    pub(crate) fn new(len: usize, page: usize) -> Self {
        debug_assert!(page.is_power_of_two());
        let pages = len.div_ceil(page);
        KnownPages {
            shift: page.trailing_zeros(),
            pages,
            leaves: (0..pages.div_ceil(LEAF_PAGES))
                .map(|_| OnceLock::new())
                .collect(),
        }
    }

    /// The pages holding bytes `off .. off + len`, clipped to the record;
    /// `None` when the range is empty or starts past it.
    fn pages(&self, off: usize, len: usize) -> Option<(usize, usize)> {
        if len == 0 {
            return None;
        }
        let first = off >> self.shift;
        let last = off.saturating_add(len - 1) >> self.shift;
        (first < self.pages).then(|| (first, (last + 1).min(self.pages)))
    }

    /// Runs `f(leaf, word, mask)` for each word of bits for pages
    /// `first .. end`.
    fn each_word(first: usize, end: usize, mut f: impl FnMut(usize, usize, u64) -> bool) -> bool {
        let mut p = first;
        while p < end {
            let (leaf, within) = (p / LEAF_PAGES, p % LEAF_PAGES);
            let (word, bit) = (within / 64, within % 64);
            let n = (64 - bit).min(end - p);
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << bit
            };
            if !f(leaf, word, mask) {
                return false;
            }
            p += n;
        }
        true
    }

    /// Records the pages holding bytes `off .. off + len` as present.
    pub(crate) fn mark(&self, off: usize, len: usize) {
        let Some((first, end)) = self.pages(off, len) else {
            return;
        };
        Self::each_word(first, end, |leaf, word, mask| {
            let words = self.leaves[leaf]
                .get_or_init(|| (0..LEAF_PAGES / 64).map(|_| AtomicU64::new(0)).collect());
            // Skip the read-modify-write when the bits are already set
            // (rewrites of written pages, the common case).
            if words[word].load(Ordering::Relaxed) & mask != mask {
                words[word].fetch_or(mask, Ordering::Relaxed);
            }
            true
        });
    }

    /// Forgets the pages holding bytes `off .. off + len` (whole or in
    /// part: a page partly punched counts as gone).
    pub(crate) fn forget(&self, off: usize, len: usize) {
        let Some((first, end)) = self.pages(off, len) else {
            return;
        };
        Self::each_word(first, end, |leaf, word, mask| {
            if let Some(words) = self.leaves[leaf].get() {
                words[word].fetch_and(!mask, Ordering::Relaxed);
            }
            true
        });
    }

    /// True when every page holding bytes `off .. off + len` is recorded
    /// as present (false for an empty range and one reaching past the
    /// record).
    pub(crate) fn all(&self, off: usize, len: usize) -> bool {
        let Some((first, end)) = self.pages(off, len) else {
            return false;
        };
        if (off.saturating_add(len - 1) >> self.shift) >= self.pages {
            return false;
        }
        Self::each_word(first, end, |leaf, word, mask| {
            self.leaves[leaf]
                .get()
                .is_some_and(|w| w[word].load(Ordering::Relaxed) & mask == mask)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_and_forgets_whole_pages_of_any_byte_range() {
        let k = KnownPages::new(1 << 30, 4096);
        assert!(!k.all(0, 4096), "nothing known at first");
        // One byte makes its page known; the next page is not.
        k.mark(4096 * 7 + 100, 1);
        assert!(k.all(4096 * 7, 4096));
        assert!(!k.all(4096 * 7, 4097));
        // A range over a word boundary (page 63/64) and a leaf boundary.
        k.mark(4096 * 60, 4096 * 10);
        assert!(k.all(4096 * 60, 4096 * 10));
        assert!(!k.all(4096 * 59, 4096 * 2));
        let edge = LEAF_PAGES * 4096;
        k.mark(edge - 4096 * 3, 4096 * 70);
        assert!(k.all(edge - 4096 * 3, 4096 * 70));
        assert!(!k.all(edge - 4096 * 3, 4096 * 71));
        // Forgetting part of a page forgets the page, not its neighbours.
        k.forget(4096 * 65 + 1, 10);
        assert!(!k.all(4096 * 65, 1));
        assert!(k.all(4096 * 60, 4096 * 5));
        assert!(k.all(4096 * 66, 4096 * 4));
        // Forgetting what was never marked (no leaf) is nothing.
        k.forget(4096 * LEAF_PAGES * 5, 1 << 20);
        assert!(!k.all(4096 * LEAF_PAGES * 5, 4096));
    }

    #[test]
    fn ranges_at_and_past_the_end_are_never_known() {
        let k = KnownPages::new(10 * 4096 + 1, 4096);
        k.mark(0, usize::MAX);
        // The last, partial page is covered; nothing past it.
        assert!(k.all(0, 10 * 4096 + 1));
        assert!(k.all(10 * 4096, 1));
        assert!(!k.all(10 * 4096, 4097));
        assert!(!k.all(11 * 4096, 1));
        assert!(!k.all(usize::MAX, 1));
        assert!(!k.all(0, 0), "an empty range is not asked about");
        k.forget(0, usize::MAX);
        assert!(!k.all(0, 1));
    }
}
