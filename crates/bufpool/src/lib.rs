//! Per-thread pools of I/O buffers (docs/ARCHITECTURE.md: "no allocation or copy per
//! I/O that can be avoided").
//!
//! A read fills a buffer from [`take`]; the buffer travels as [`Bytes`]
//! through the SCSI and iSCSI layers to the send queue, which hands it back
//! with [`give`] once the socket has taken it. [`give`] keeps it only when
//! no other handle to it is alive ([`Bytes::try_into_mut`]), so a buffer is
//! never reused while something can still read it. The target serves each
//! connection on one thread (thread-per-core), so a buffer normally comes
//! back to the pool it came from, and no lock is involved.
//!
//! Buffers are pooled by power-of-two capacity from 4 KiB to 1 MiB, at most
//! [`MAX_POOLED_BYTES`] per thread and [`MAX_CLASS_BYTES`] per capacity;
//! anything else is a plain allocation. The second bound keeps one size
//! from taking the whole pool: without it, a burst of 4 KiB I/O left the
//! pool full of 4 KiB buffers, and every 1 MiB write after it allocated
//! (and faulted in) a fresh 1 MiB buffer.

mod chain;
pub mod huge;
mod land;
mod stream;
mod write;
pub use chain::{Chain, SegmentSums};
pub use huge::HugeAlloc;
pub use land::LandBuf;
pub use stream::copy_streaming;
pub use write::WriteData;

use std::cell::RefCell;

use bytes::{Bytes, BytesMut};

/// Smallest pooled capacity.
const MIN_CLASS: usize = 4096;
/// Largest pooled capacity.
const MAX_CLASS: usize = 1 << 20;
const CLASSES: usize = 9; // 4K, 8K, …, 1M
/// Bytes a thread keeps in its pool at most.
pub const MAX_POOLED_BYTES: usize = 32 << 20;
/// Bytes a thread keeps in its pool at most of one capacity.
pub const MAX_CLASS_BYTES: usize = MAX_POOLED_BYTES / 4;

struct Pool {
    free: [Vec<BytesMut>; CLASSES],
    bytes: usize,
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool { free: Default::default(), bytes: 0 });
}

/// Bytes in this thread's pool now, per capacity from 4 KiB up
/// (for tests and benchmarks).
pub fn pooled() -> [usize; CLASSES] {
    POOL.with(|p| {
        let p = p.borrow();
        std::array::from_fn(|c| p.free[c].len() * (MIN_CLASS << c))
    })
}

fn class_of(cap: usize) -> Option<usize> {
    if !(MIN_CLASS..=MAX_CLASS).contains(&cap) || !cap.is_power_of_two() {
        return None;
    }
    Some((cap.trailing_zeros() - MIN_CLASS.trailing_zeros()) as usize)
}

/// An empty buffer with room for at least `len` bytes.
pub fn take(len: usize) -> BytesMut {
    let cap = len.next_power_of_two().max(MIN_CLASS);
    if let Some(c) = class_of(cap) {
        let got = POOL.with(|p| {
            let mut p = p.borrow_mut();
            let b = p.free[c].pop();
            if b.is_some() {
                p.bytes -= cap;
            }
            b
        });
        if let Some(b) = got {
            return b;
        }
        return BytesMut::with_capacity(cap);
    }
    BytesMut::with_capacity(len)
}

/// Returns a buffer to this thread's pool if nothing else holds it and it
/// has a pooled size; otherwise it is simply dropped.
pub fn give(b: Bytes) {
    let Ok(mut m) = b.try_into_mut() else { return };
    m.clear();
    // A read sent as several Data-In PDUs comes back slice by slice, and
    // only the last, whose view starts inside the buffer, is unique: take
    // the rest of the buffer back (without this, every 1 MiB file read
    // under data digests allocated and faulted in a fresh buffer).
    let mut want = m.capacity().max(MIN_CLASS / 2) * 2;
    while want <= MAX_CLASS && m.try_reclaim(want) {
        want *= 2;
    }
    let cap = m.capacity();
    let Some(c) = class_of(cap) else { return };
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        if p.bytes + cap <= MAX_POOLED_BYTES && (p.free[c].len() + 1) * cap <= MAX_CLASS_BYTES {
            p.bytes += cap;
            p.free[c].push(m);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_unique_buffers_only() {
        let mut a = take(4096);
        a.extend_from_slice(&[1; 4096]);
        let ptr = a.as_ptr();
        let frozen = a.freeze();
        let other = frozen.clone();
        give(frozen);
        // Still shared: not pooled.
        assert_ne!(take(4096).as_ptr(), ptr);
        give(other);
        let b = take(4000);
        assert_eq!(b.as_ptr(), ptr, "the unique buffer came back");
        assert!(b.is_empty() && b.capacity() >= 4096);
        // Odd sizes are not pooled.
        give(Bytes::from(vec![0u8; 5000]));
        assert!(take(100).capacity() >= 100);
    }

    #[test]
    fn a_buffer_sent_in_slices_comes_back_whole() {
        let mut a = take(1 << 20);
        a.extend_from_slice(&vec![5u8; 1 << 20]);
        let ptr = a.as_ptr();
        let whole = a.freeze();
        let parts: Vec<Bytes> = (0..4)
            .map(|i| whole.slice(i << 18..(i + 1) << 18))
            .collect();
        drop(whole);
        // Given back in order, as the send queue does: only the last one
        // is unique, and it brings back the whole buffer.
        for p in parts {
            give(p);
        }
        let b = take(1 << 20);
        assert_eq!(b.as_ptr(), ptr, "the 1 MiB buffer came back");
        assert!(b.capacity() >= 1 << 20);
        // Empty and odd buffers are dropped, not pooled (nor looped on).
        give(Bytes::new());
        give(Bytes::from(Vec::with_capacity(0)));
        give(Bytes::from(vec![1u8; 100]).slice(100..));
    }

    #[test]
    fn one_size_cannot_take_the_whole_pool() {
        // Far more 4 KiB buffers than the pool keeps come back.
        for _ in 0..2 * MAX_POOLED_BYTES / 4096 {
            give(Bytes::from(BytesMut::with_capacity(4096)));
        }
        assert_eq!(pooled()[0], MAX_CLASS_BYTES);
        // A 1 MiB buffer still finds room, and comes back out.
        let mut big = BytesMut::with_capacity(1 << 20);
        big.extend_from_slice(&[7; 1 << 20]);
        let ptr = big.as_ptr();
        give(big.freeze());
        assert_eq!(pooled()[CLASSES - 1], 1 << 20);
        assert_eq!(take(1 << 20).as_ptr(), ptr);
        // The whole pool stays within its bound.
        for c in 0..CLASSES {
            for _ in 0..MAX_CLASS_BYTES / (MIN_CLASS << c) + 1 {
                give(Bytes::from(BytesMut::with_capacity(MIN_CLASS << c)));
            }
        }
        let p = pooled();
        assert!(p.iter().sum::<usize>() <= MAX_POOLED_BYTES, "{p:?}");
        assert!(p.iter().all(|&b| b <= MAX_CLASS_BYTES), "{p:?}");
    }
}
