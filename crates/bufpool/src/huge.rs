//! Huge-page backing for the 1 MiB buffers: a global allocator that
//! serves every allocation of exactly [`SLOT`] bytes from 2 MiB-aligned
//! regions the kernel is asked to back with transparent huge pages
//! (`madvise(MADV_HUGEPAGE)`), and everything else from the system
//! allocator.
//!
//! Why: the largest pooled buffers are 1 MiB ([`crate::take`]), and a RAM
//! LUN is made of them (its chunks are such buffers, written or adopted
//! from the network). A random 4 KiB read of a RAM LUN touches a page no
//! recent read touched, so with 4 KiB pages nearly every read missed the
//! TLB and walked the page tables (twice over under a hypervisor's nested
//! paging) before copying a byte: profiled, the copy of 4 KiB out of a
//! 1 GiB RAM LUN took more of the target's time than the rest of the read.
//! Behind 2 MiB pages, 1 GiB is 512 TLB entries. The system allocator
//! cannot give this: it maps each 1 MiB allocation on its own, never
//! 2 MiB-aligned, so the kernel never backs it with a huge page, whatever
//! the THP policy.
//!
//! How: a region is 2 MiB, aligned to 2 MiB, holding two slots. Free
//! slots wait in one set; a slot freed while the set already holds
//! [`KEEP_FREE`] slots gives its memory back to the kernel: the whole
//! region when its partner is free too, else the slot's pages. Where THP is off (`never`), the regions are ordinary pages
//! and nothing else changes. No other size is touched: their layouts never
//! reach the slot code, so a slot is freed only by the layout that took it
//! (`GlobalAlloc`'s contract), and `realloc` across the boundary copies.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeSet;
use std::sync::Mutex;

/// The size served from huge-page regions: the largest pooled capacity.
pub const SLOT: usize = 1 << 20;
/// A region: one transparent huge page, two slots.
const REGION: usize = 2 << 20;
/// Free slots kept mapped before a free region is given back (64 MiB).
pub const KEEP_FREE: usize = 64;

/// Free slots (their addresses). The set's own nodes are small
/// allocations, served by the system allocator, so taking this lock never
/// re-enters it.
static FREE: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

/// The global allocator (module docs): `#[global_allocator] static A:
/// bufpool::HugeAlloc = bufpool::HugeAlloc;`
#[derive(Debug, Clone, Copy, Default)]
pub struct HugeAlloc;

#[inline]
fn is_slot(l: Layout) -> bool {
    l.size() == SLOT && l.align() <= 4096
}

/// A slot, and whether it is fresh from the kernel (so already zero).
fn take_slot() -> Option<(*mut u8, bool)> {
    let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = free.pop_first() {
        return Some((s as *mut u8, false));
    }
    let r = map_region()?;
    free.insert(r + SLOT);
    Some((r as *mut u8, true))
}

/// Maps one 2 MiB-aligned region and asks for a huge page behind it.
fn map_region() -> Option<usize> {
    let len = 2 * REGION;
    // SAFETY: an anonymous private mapping of fresh memory, at an address
    // the kernel picks; nothing else refers to it yet.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let p = p as usize;
    let start = p.next_multiple_of(REGION);
    let (head, tail) = (start - p, p + len - (start + REGION));
    // SAFETY: both ranges lie in the mapping just made, outside the
    // aligned region kept; no one has seen their addresses.
    unsafe {
        if head > 0 {
            libc::munmap(p as *mut libc::c_void, head);
        }
        if tail > 0 {
            libc::munmap((start + REGION) as *mut libc::c_void, tail);
        }
        // Advice only: where THP is unavailable the region keeps small
        // pages, which is what the system allocator would have given.
        libc::madvise(start as *mut libc::c_void, REGION, libc::MADV_HUGEPAGE);
    }
    Some(start)
}

fn free_slot(p: *mut u8) {
    let s = p as usize;
    let partner = s ^ SLOT;
    let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
    if free.len() >= KEEP_FREE {
        if free.remove(&partner) {
            drop(free);
            // SAFETY: both slots of this region are free (this one is being
            // freed, its partner was in the free set and is now out of it),
            // so nothing refers to the region.
            unsafe { libc::munmap((s & !(REGION - 1)) as *mut libc::c_void, REGION) };
            return;
        }
        // Its partner is in use: the memory goes back all the same (the
        // kernel splits the huge page), and the slot stays mapped, to be
        // faulted in again, zeroed, if it is taken. Without this a LUN's
        // discarded chunks could keep half of every region they shared.
        // SAFETY: the slot is being freed: nothing refers to it, and
        // MADV_DONTNEED on private anonymous memory only drops its pages.
        unsafe { libc::madvise(p.cast(), SLOT, libc::MADV_DONTNEED) };
    }
    free.insert(s);
}

// SAFETY: slots are disjoint 1 MiB ranges of mappings this allocator owns,
// each handed out once until freed; every other layout is the system
// allocator's, untouched.
unsafe impl GlobalAlloc for HugeAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if is_slot(l) {
            return take_slot().map_or(std::ptr::null_mut(), |(p, _)| p);
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(l) }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if is_slot(l) {
            return match take_slot() {
                Some((p, true)) => p,
                Some((p, false)) => {
                    // SAFETY: the slot is ours, SLOT bytes, in no one's hands.
                    unsafe { p.write_bytes(0, SLOT) };
                    p
                }
                None => std::ptr::null_mut(),
            };
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if is_slot(l) {
            free_slot(p);
            return;
        }
        // SAFETY: `p` came from the system allocator with `l` (only slot
        // layouts are served otherwise).
        unsafe { System.dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract: `new_size` with `l`'s alignment
        // is a valid layout.
        let n = unsafe { Layout::from_size_align_unchecked(new_size, l.align()) };
        if !is_slot(l) && !is_slot(n) {
            // SAFETY: the caller's contract, passed on.
            return unsafe { System.realloc(p, l, new_size) };
        }
        // SAFETY: `n` is valid (above).
        let q = unsafe { self.alloc(n) };
        if !q.is_null() {
            // SAFETY: both blocks are live and distinct; the smaller size
            // is in both.
            unsafe {
                std::ptr::copy_nonoverlapping(p, q, l.size().min(new_size));
                self.dealloc(p, l);
            }
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests share the one free set: one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn slots_are_halves_of_aligned_regions_and_come_back() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let a = HugeAlloc;
        let l = Layout::from_size_align(SLOT, 1).unwrap();
        // SAFETY: valid layouts; every block is freed once with its layout.
        unsafe {
            let p = a.alloc_zeroed(l);
            assert!(!p.is_null());
            assert_eq!(p as usize % SLOT, 0);
            assert!(std::slice::from_raw_parts(p, SLOT).iter().all(|&b| b == 0));
            p.write_bytes(7, SLOT);
            a.dealloc(p, l);
            // Recycled or not, a zeroed slot is zero.
            let q = a.alloc_zeroed(l);
            assert!(std::slice::from_raw_parts(q, SLOT).iter().all(|&b| b == 0));
            // Growing into a slot and out of it keeps the bytes.
            let s = Layout::from_size_align(100, 1).unwrap();
            let r = a.alloc(s);
            r.write_bytes(9, 100);
            let r = a.realloc(r, s, SLOT);
            assert_eq!(r as usize % SLOT, 0);
            assert!(std::slice::from_raw_parts(r, 100).iter().all(|&b| b == 9));
            let r = a.realloc(r, l, 50);
            assert!(std::slice::from_raw_parts(r, 50).iter().all(|&b| b == 9));
            a.dealloc(r, Layout::from_size_align(50, 1).unwrap());
            a.dealloc(q, l);
        }
    }

    #[test]
    fn free_regions_beyond_the_reserve_are_given_back() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let a = HugeAlloc;
        let l = Layout::from_size_align(SLOT, 1).unwrap();
        let n = 2 * KEEP_FREE + 8;
        // SAFETY: valid layouts; every block is freed once.
        let held: Vec<_> = (0..n).map(|_| unsafe { a.alloc(l) }).collect();
        for &p in &held {
            // SAFETY: taken above with `l`.
            unsafe { a.dealloc(p, l) };
        }
        let free = FREE.lock().unwrap().len();
        // What this test freed beyond the reserve went back in whole
        // regions.
        assert!(free <= KEEP_FREE + 2, "{free} free slots kept");
    }

    /// Whether the first page of `p` is in memory.
    fn resident(p: *mut u8) -> bool {
        let mut v = [0u8; 1];
        // SAFETY: `p` is page-aligned and mapped; `v` has room for one page.
        let r = unsafe { libc::mincore(p.cast(), 4096, v.as_mut_ptr()) };
        assert_eq!(r, 0);
        v[0] & 1 == 1
    }

    #[test]
    fn a_slot_freed_past_the_reserve_gives_its_pages_back() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let a = HugeAlloc;
        let l = Layout::from_size_align(SLOT, 1).unwrap();
        // Taken in pairs (both halves of a region); every page touched.
        let n = 2 * (KEEP_FREE + 4);
        // SAFETY: valid layouts; every block is freed once, with `l`.
        let held: Vec<_> = (0..n)
            .map(|_| unsafe {
                let p = a.alloc(l);
                p.write_bytes(0xab, SLOT);
                p
            })
            .collect();
        // One half of each region freed, its partner still held: past the
        // reserve, the freed half's pages go back.
        let halves: Vec<_> = held
            .iter()
            .copied()
            .filter(|&p| p as usize & SLOT == 0)
            .collect();
        for &p in &halves {
            // SAFETY: taken above with `l`.
            unsafe { a.dealloc(p, l) };
        }
        let last = *halves.last().unwrap();
        assert!(FREE.lock().unwrap().len() > KEEP_FREE);
        assert!(
            !resident(last),
            "a freed slot past the reserve keeps its pages"
        );
        // Still mapped (to be taken again), reading as zeros.
        // SAFETY: the slot's mapping stays; nothing else uses it.
        assert_eq!(unsafe { last.read_volatile() }, 0);
        for &p in held.iter().filter(|&&p| p as usize & SLOT != 0) {
            // SAFETY: the other halves, taken above with `l`.
            unsafe { a.dealloc(p, l) };
        }
    }
}
