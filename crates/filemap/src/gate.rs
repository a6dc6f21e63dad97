//! [`WriteGate`]: what lets a data digest (RFC 7143 §12.1) be computed over
//! a file's pages in place and the same pages then be sent, without a copy
//! in between.
//!
//! A data digest must cover exactly the bytes that go out. When a read of
//! a file LUN in memory is sent from the file's mapping ([`FileRange`]
//! with a [`FileMap`]), the kernel copies the bytes at send time, which is
//! later than the digest is computed; a write landing in between would
//! make the digest wrong. Copying the range out first (`pread`) fixes the
//! bytes, at the price of a pass over every byte (40 % of the target's
//! time on 1 MiB digested reads, docs/PERFORMANCE.md). The gate fixes them
//! without a copy, by keeping the file's writers and such a read apart:
//!
//! * Every write to the file by the backend announces itself for its
//!   range ([`WriteGate::writing`], a [`WriteToken`] held until the bytes
//!   are in; a write received in place holds one for as long as its data
//!   takes to arrive).
//! * A read that wants its digest computed in place takes a [`Pin`] on its
//!   range ([`WriteGate::pin`]). A pin is refused while any write is in
//!   progress on the file (the read then copies, as before). A pin is
//!   *guarding* while the digest is computed and while the kernel copies
//!   the bytes (`writev`), and only then: both are short and never wait on
//!   the network. In between (the data queued behind other output) it is
//!   *spoilable*.
//! * A write that starts while pins exist looks at those overlapping it:
//!   it waits for a guarding one to stop guarding, and marks a spoilable
//!   one *spoiled*. A spoiled pin refuses to guard again
//!   ([`Pin::guard`]): its digest no longer describes the file, and the
//!   sender copies the range afresh. (A range partly sent when its pin
//!   stops guarding has the rest copied first, so it is never spoiled
//!   half way.)
//!
//! Cost for writers when no pin exists (every workload without data
//! digests): one atomic add on a counter of their own thread's shard, one
//! load of the pin count, and one atomic subtract (on the shard of the
//! thread that ends the write, which may be another: only the sum over
//! the shards means anything, in wrapping arithmetic). The pin count and
//! the writer counts are read and written in sequentially consistent
//! order (Dekker): either the pin sees the write, or the write sees the
//! pin.
//!
//! The gate also keeps the file's block CRCs ([`FileSums`]), recorded by
//! digests computed in place under a guarding pin and forgotten by every
//! write on its way in (after it has met the pins), so that a later digest
//! over the same blocks is folded from them instead of read off every
//! byte. Why they stay true: see [`FileSums`].
//!
//! Writes from outside the process (another program writing the LUN's
//! file) do not pass the gate, as with any other zero-copy read of the
//! file; the block CRCs are forgotten when the file's ctime says another
//! program changed it ([`FileSums::check`]).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::FileSums;

/// Writer counters, one per shard of threads, each on its own cache line.
const SHARDS: usize = 8;

#[repr(align(128))]
#[derive(Default)]
struct Shard(AtomicUsize);

/// One pinned range.
#[derive(Debug)]
struct Entry {
    id: u64,
    start: u64,
    end: u64,
    guarding: bool,
    spoiled: bool,
}

#[derive(Debug, Default)]
struct Pins {
    next_id: u64,
    entries: Vec<Entry>,
    /// Writers waiting for a guarding pin.
    waiting: usize,
}

/// Keeps a file's writers and in-place digested reads apart (module docs).
#[derive(Default)]
pub struct WriteGate {
    writers: [Shard; SHARDS],
    pins: AtomicUsize,
    registry: Mutex<Pins>,
    unguarded: Condvar,
    sums: FileSums,
}

impl std::fmt::Debug for WriteGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteGate")
            .field("writers", &self.writers_now())
            .field("pins", &self.pins.load(SeqCst))
            .finish()
    }
}

thread_local! {
    /// This thread's writer shard; `usize::MAX` until first used.
    static SHARD: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

fn my_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    SHARD.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % SHARDS);
        }
        s.get()
    })
}

/// A write in progress on the gate's file; ends on drop.
#[must_use = "the write counts as in progress until this is dropped"]
#[derive(Debug)]
pub struct WriteToken<'a> {
    gate: &'a WriteGate,
}

impl Drop for WriteToken<'_> {
    fn drop(&mut self) {
        self.gate.leave();
    }
}

impl WriteGate {
    /// A gate with no writes and no pins.
    pub fn new() -> Self {
        Self::default()
    }

    fn writers_now(&self) -> usize {
        self.writers
            .iter()
            .fold(0usize, |n, s| n.wrapping_add(s.0.load(SeqCst)))
    }

    fn lock(&self) -> MutexGuard<'_, Pins> {
        // A panic while holding the lock leaves the registry consistent
        // (every change is one statement), so poisoning is ignored.
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Announces a write of `len` bytes at `offset`, waiting first for any
    /// guarding pin overlapping it and spoiling the other overlapping pins
    /// (module docs). The write may proceed while the token lives.
    pub fn writing(&self, offset: u64, len: u64) -> WriteToken<'_> {
        self.enter(offset, len);
        WriteToken { gate: self }
    }

    /// [`Self::writing`] without a token: the caller calls [`Self::leave`]
    /// once, when the write is over ([`crate::Placed`], whose data arrives
    /// later).
    pub(crate) fn enter(&self, offset: u64, len: u64) {
        self.writers[my_shard()].0.fetch_add(1, SeqCst);
        if self.pins.load(SeqCst) != 0 {
            self.meet_pins(offset, offset.saturating_add(len));
        }
        // No pin guards the range now, and none can until the write ends.
        self.sums.forget(offset, len);
    }

    /// The file's block CRCs, to be recorded only under a guarding pin
    /// over the blocks (module docs).
    pub fn sums(&self) -> &FileSums {
        &self.sums
    }

    /// Ends a write begun by [`Self::enter`] (on any thread).
    pub(crate) fn leave(&self) {
        self.writers[my_shard()].0.fetch_sub(1, SeqCst);
    }

    /// The slow path of a write while pins exist.
    fn meet_pins(&self, start: u64, end: u64) {
        let mut reg = self.lock();
        loop {
            let mut guarded = false;
            for e in reg.entries.iter_mut() {
                if e.start < end && start < e.end {
                    if e.guarding {
                        guarded = true;
                    } else {
                        e.spoiled = true;
                    }
                }
            }
            if !guarded {
                return;
            }
            reg.waiting += 1;
            reg = self.unguarded.wait(reg).unwrap_or_else(|p| p.into_inner());
            reg.waiting -= 1;
        }
    }

    /// A pin on `len` bytes at `offset`, guarding (the caller computes the
    /// digest now, then [`Pin::unguard`]s it); `None` while any write to
    /// the file is in progress.
    pub fn pin(self: &Arc<Self>, offset: u64, len: u64) -> Option<Pin> {
        let id = {
            let mut reg = self.lock();
            let id = reg.next_id;
            reg.next_id += 1;
            reg.entries.push(Entry {
                id,
                start: offset,
                end: offset.saturating_add(len),
                guarding: true,
                spoiled: false,
            });
            self.pins.fetch_add(1, SeqCst);
            id
        };
        let pin = Pin {
            gate: self.clone(),
            id,
            guarding: true,
        };
        // After the pin is counted: a write that started before it is
        // seen here, one that starts after sees the pin.
        if self.writers_now() != 0 {
            return None; // dropping the pin unregisters it
        }
        Some(pin)
    }
}

/// A range of the file whose writers are held off or noticed (module
/// docs); unregistered on drop.
#[derive(Debug)]
pub struct Pin {
    gate: Arc<WriteGate>,
    id: u64,
    /// Mirrors the entry's `guarding`, which only this pin changes.
    guarding: bool,
}

impl Pin {
    /// Holds writers of the range off until [`Self::unguard`], unless a
    /// write has touched it since the pin last guarded: then `false`, and
    /// the pin stays spoilable.
    pub fn guard(&mut self) -> bool {
        if self.guarding {
            return true;
        }
        let mut reg = self.gate.lock();
        let Some(e) = reg.entries.iter_mut().find(|e| e.id == self.id) else {
            return false;
        };
        if e.spoiled {
            return false;
        }
        e.guarding = true;
        self.guarding = true;
        true
    }

    /// Lets writers of the range go again (they spoil it from now on).
    pub fn unguard(&mut self) {
        if !self.guarding {
            return;
        }
        let mut reg = self.gate.lock();
        if let Some(e) = reg.entries.iter_mut().find(|e| e.id == self.id) {
            e.guarding = false;
        }
        self.guarding = false;
        if reg.waiting > 0 {
            self.gate.unguarded.notify_all();
        }
    }

    /// True while writers of the range are held off.
    pub fn is_guarding(&self) -> bool {
        self.guarding
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut reg = self.gate.lock();
        if let Some(i) = reg.entries.iter().position(|e| e.id == self.id) {
            reg.entries.swap_remove(i);
        }
        self.gate.pins.fetch_sub(1, SeqCst);
        if self.guarding && reg.waiting > 0 {
            self.gate.unguarded.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_pin_is_refused_while_a_write_is_in_progress() {
        let g = Arc::new(WriteGate::new());
        let w = g.writing(0, 4096);
        assert!(
            g.pin(1 << 20, 4096).is_none(),
            "any write, overlapping or not"
        );
        drop(w);
        assert!(g.pin(0, 4096).is_some());
        assert_eq!(
            g.pins.load(SeqCst),
            0,
            "refused and dropped pins unregister"
        );
    }

    #[test]
    fn writes_spoil_overlapping_spoilable_pins_only() {
        let g = Arc::new(WriteGate::new());
        let mut a = g.pin(0, 8192).unwrap();
        let mut b = g.pin(65536, 8192).unwrap();
        a.unguard();
        b.unguard();
        drop(g.writing(4096, 100));
        assert!(!a.guard(), "the write touched a's range");
        assert!(b.guard(), "b's range was not touched");
        assert!(b.is_guarding() && !a.is_guarding());
        b.unguard();
        drop(g.writing(0, 1 << 30));
        assert!(!b.guard());
    }

    #[test]
    fn a_write_waits_for_a_guarding_pin() {
        let g = Arc::new(WriteGate::new());
        let mut p = g.pin(0, 4096).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let g2 = g.clone();
        let t = std::thread::spawn(move || {
            let _w = g2.writing(100, 10);
            tx.send(()).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "the write must wait while the pin guards"
        );
        p.unguard();
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the write goes once the pin stops guarding");
        t.join().unwrap();
        assert!(!p.guard(), "and it spoiled the pin");
    }

    #[test]
    fn dropping_a_guarding_pin_lets_waiting_writers_go() {
        let g = Arc::new(WriteGate::new());
        let p = g.pin(0, 4096).unwrap();
        let g2 = g.clone();
        let t = std::thread::spawn(move || drop(g2.writing(0, 1)));
        std::thread::sleep(Duration::from_millis(50));
        drop(p);
        t.join().unwrap();
        assert_eq!(g.writers_now(), 0);
    }

    #[test]
    fn a_write_may_end_on_another_thread() {
        let g = Arc::new(WriteGate::new());
        g.enter(0, 1);
        assert!(g.pin(0, 1).is_none());
        let g2 = g.clone();
        std::thread::spawn(move || g2.leave()).join().unwrap();
        assert_eq!(g.writers_now(), 0);
        assert!(g.pin(0, 1).is_some());
    }
}
