//! Unit attention conditions, kept per I_T nexus (SAM-5 §5.14, SPC-4
//! §5.8.7 with UA_INTLCK_CTRL = 00b).
//!
//! A logical unit *establishes* a unit attention for some nexuses (after a
//! LOGICAL UNIT RESET every nexus, after MODE SELECT every other nexus);
//! the next command from such a nexus, other than INQUIRY, REPORT LUNS and
//! REQUEST SENSE, is terminated with CHECK CONDITION / UNIT ATTENTION and
//! the oldest condition is cleared. REQUEST SENSE returns it as its sense
//! data and clears it too.
//!
//! # Cost on the data path
//!
//! Every command asks [`UnitAttentions::is_quiet`] first. That is a
//! lock-free probe of [`KnownNexuses`], a read-mostly open-addressed table
//! of the nexuses seen so far, each slot with an "attention" flag that is
//! set exactly while that nexus has a condition queued: usually one load
//! of the slot and one of its flag, cache lines that stay shared between
//! cores. Only a nexus seen for the first time, or one with something to
//! report, takes the mutex; an idle session with an unreported condition
//! slows down nobody else.
//!
//! A nexus is "seen" once it has sent a command to this logical unit; a
//! session that never did is unknown here and gets no UA from a reset that
//! happened before its first command (it had no state to lose).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::lu::NexusId;
use crate::sense::{Asc, Sense, SenseKey};

/// How many conditions one nexus can have queued; further distinct ones
/// replace the newest (SAM-5 lets a logical unit coalesce them).
const MAX_QUEUED: usize = 8;

/// The registry of unit attention conditions of one logical unit.
#[derive(Debug)]
pub struct UnitAttentions {
    /// Lock-free view of `inner`: which nexuses exist and which have
    /// something queued. Written only under the mutex.
    known: KnownNexuses,
    /// Establish POWER ON, RESET, OR BUS DEVICE RESET OCCURRED for a nexus
    /// on its first command (read when a nexus is first seen).
    power_on: std::sync::atomic::AtomicBool,
    inner: Mutex<HashMap<NexusId, VecDeque<Sense>>>,
}

impl UnitAttentions {
    /// An empty registry; with `power_on`, every new nexus starts with a
    /// POWER ON, RESET, OR BUS DEVICE RESET OCCURRED (29/00) condition.
    pub fn new(power_on: bool) -> Self {
        UnitAttentions {
            known: KnownNexuses::new(),
            power_on: power_on.into(),
            inner: Mutex::new(HashMap::new()),
        }
    }

    /// Whether nexuses seen from now on start with POWER ON, RESET, OR BUS
    /// DEVICE RESET OCCURRED.
    pub fn set_power_on(&self, on: bool) {
        self.power_on
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// True when `n` is known and has nothing queued: the command can run
    /// without looking at unit attentions. Lock-free.
    #[inline]
    pub fn is_quiet(&self, n: NexusId) -> bool {
        self.known.is_quiet(n)
    }

    /// Registers `n` if new and removes and returns its oldest condition.
    pub fn take(&self, n: NexusId) -> Option<Sense> {
        let mut map = self.inner.lock();
        self.register(&mut map, n);
        let q = map.get_mut(&n)?;
        let s = q.pop_front()?;
        if q.is_empty() {
            self.known.set_attention(n, false);
        }
        Some(s)
    }

    /// Registers `n` if new, without touching its conditions (INQUIRY).
    pub fn touch(&self, n: NexusId) {
        if !self.known.contains(n) {
            let mut map = self.inner.lock();
            self.register(&mut map, n);
        }
    }

    /// Establishes `code` (sense key UNIT ATTENTION) for every known nexus
    /// except `except`.
    pub fn broadcast(&self, code: Asc, except: Option<NexusId>) {
        let mut map = self.inner.lock();
        let sense = Sense::new(SenseKey::UnitAttention, code);
        for (id, q) in map.iter_mut() {
            if Some(*id) != except {
                push(q, sense);
                self.known.set_attention(*id, true);
            }
        }
    }

    /// Establishes `code` (sense key UNIT ATTENTION) for the nexus `n`
    /// (registering it if new).
    pub fn establish(&self, n: NexusId, code: Asc) {
        let mut map = self.inner.lock();
        self.register(&mut map, n);
        if let Some(q) = map.get_mut(&n) {
            push(q, Sense::new(SenseKey::UnitAttention, code));
            self.known.set_attention(n, true);
        }
    }

    /// Drops everything about `n` (its session is gone).
    pub fn forget(&self, n: NexusId) {
        let mut map = self.inner.lock();
        map.remove(&n);
        self.known.remove(n);
    }

    /// Number of conditions queued for `n` (tests and diagnostics).
    pub fn queued(&self, n: NexusId) -> usize {
        self.inner.lock().get(&n).map_or(0, VecDeque::len)
    }

    fn register(&self, map: &mut HashMap<NexusId, VecDeque<Sense>>, n: NexusId) {
        if map.contains_key(&n) {
            return;
        }
        let mut q = VecDeque::new();
        if self.power_on.load(std::sync::atomic::Ordering::Relaxed) {
            q.push_back(Sense::new(SenseKey::UnitAttention, Asc::POWER_ON_RESET));
        }
        let attention = !q.is_empty();
        map.insert(n, q);
        if !self.known.insert(n, attention) {
            // The table is crowded with tombstones: rebuild it from the map.
            // Readers that miss an entry meanwhile just take the locked path.
            self.known
                .rebuild(map.iter().map(|(id, q)| (*id, !q.is_empty())));
        }
    }
}

/// Queues `s` unless an identical condition is queued.
fn push(q: &mut VecDeque<Sense>, s: Sense) {
    if q.contains(&s) {
        return;
    }
    if q.len() >= MAX_QUEUED {
        q.pop_back();
    }
    q.push_back(s);
}

/// Slots in the known-nexus table (a power of two).
const SLOTS: usize = 1024;
/// Linear probes before giving up (the nexus is then always looked up
/// under the lock, which is correct, only slower).
const PROBES: usize = 16;
const EMPTY: u64 = 0;
const TOMBSTONE: u64 = u64::MAX;

/// An open-addressed set of nexus ids, each with an attention flag, that
/// readers probe without locks. All writers hold [`UnitAttentions`]'
/// mutex, so plain stores publish; a slot's flag is written before its key
/// so that a reader never sees a fresh key with a stale flag.
struct KnownNexuses {
    keys: Box<[AtomicU64]>,
    attention: Box<[AtomicBool]>,
}

impl std::fmt::Debug for KnownNexuses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KnownNexuses").finish_non_exhaustive()
    }
}

impl KnownNexuses {
    fn new() -> Self {
        KnownNexuses {
            keys: (0..SLOTS).map(|_| AtomicU64::new(EMPTY)).collect(),
            attention: (0..SLOTS).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// The stored form of an id; ids that collide with the markers are
    /// never stored.
    fn key(n: NexusId) -> Option<u64> {
        let k = n.0.wrapping_add(1);
        (k != EMPTY && k != TOMBSTONE).then_some(k)
    }

    fn home(k: u64) -> usize {
        // Fibonacci hashing; the table size is a power of two.
        (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOTS.trailing_zeros())) as usize
    }

    /// The slot holding `n`.
    #[inline]
    fn find(&self, n: NexusId) -> Option<usize> {
        let k = Self::key(n)?;
        let h = Self::home(k);
        for i in 0..PROBES {
            let idx = (h + i) & (SLOTS - 1);
            match self.keys[idx].load(Ordering::Acquire) {
                v if v == k => return Some(idx),
                EMPTY => return None,
                _ => {}
            }
        }
        None
    }

    #[inline]
    fn is_quiet(&self, n: NexusId) -> bool {
        self.find(n)
            .is_some_and(|i| !self.attention[i].load(Ordering::Acquire))
    }

    fn contains(&self, n: NexusId) -> bool {
        self.find(n).is_some()
    }

    fn set_attention(&self, n: NexusId, on: bool) {
        if let Some(i) = self.find(n) {
            self.attention[i].store(on, Ordering::Release);
        }
    }

    /// Inserts `n`; false when no slot was free within [`PROBES`].
    fn insert(&self, n: NexusId, attention: bool) -> bool {
        let Some(k) = Self::key(n) else {
            return true; // never stored; always takes the locked path
        };
        let h = Self::home(k);
        let mut free = None;
        for i in 0..PROBES {
            let idx = (h + i) & (SLOTS - 1);
            match self.keys[idx].load(Ordering::Acquire) {
                v if v == k => return true,
                EMPTY => {
                    free.get_or_insert(idx);
                    break;
                }
                TOMBSTONE => {
                    free.get_or_insert(idx);
                }
                _ => {}
            }
        }
        match free {
            Some(idx) => {
                self.attention[idx].store(attention, Ordering::Release);
                self.keys[idx].store(k, Ordering::Release);
                true
            }
            None => false,
        }
    }

    fn remove(&self, n: NexusId) {
        if let Some(i) = self.find(n) {
            self.keys[i].store(TOMBSTONE, Ordering::Release);
            self.attention[i].store(false, Ordering::Release);
        }
    }

    fn rebuild(&self, entries: impl Iterator<Item = (NexusId, bool)>) {
        for k in self.keys.iter() {
            k.store(EMPTY, Ordering::Release);
        }
        for (n, attention) in entries {
            // A nexus that still finds no slot stays on the locked path.
            let _ = self.insert(n, attention);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: NexusId = NexusId(1);
    const B: NexusId = NexusId(2);

    #[test]
    fn new_nexus_is_registered_and_quiet() {
        let ua = UnitAttentions::new(false);
        assert!(!ua.is_quiet(A));
        assert_eq!(ua.take(A), None);
        assert!(ua.is_quiet(A));
    }

    #[test]
    fn power_on_condition_for_new_nexus() {
        let ua = UnitAttentions::new(true);
        let s = ua.take(A).unwrap();
        assert_eq!(
            (s.key, s.code),
            (SenseKey::UnitAttention, Asc::POWER_ON_RESET)
        );
        assert_eq!(ua.take(A), None);
        assert!(ua.is_quiet(A));
    }

    #[test]
    fn broadcast_reaches_known_nexuses_in_order_and_dedups() {
        let ua = UnitAttentions::new(false);
        ua.touch(A);
        ua.touch(B);
        ua.broadcast(Asc::BUS_DEVICE_RESET, None);
        ua.broadcast(Asc::MODE_PARAMETERS_CHANGED, Some(B));
        ua.broadcast(Asc::BUS_DEVICE_RESET, None);
        assert!(!ua.is_quiet(A));
        assert_eq!(ua.queued(A), 2);
        assert_eq!(ua.queued(B), 1);
        assert_eq!(ua.take(A).unwrap().code, Asc::BUS_DEVICE_RESET);
        assert_eq!(ua.take(A).unwrap().code, Asc::MODE_PARAMETERS_CHANGED);
        assert_eq!(ua.take(A), None);
        assert!(ua.is_quiet(A), "B's condition does not slow A down");
        assert!(!ua.is_quiet(B));
        assert_eq!(ua.take(B).unwrap().code, Asc::BUS_DEVICE_RESET);
        assert!(ua.is_quiet(A) && ua.is_quiet(B));
    }

    #[test]
    fn forget_clears_state() {
        let ua = UnitAttentions::new(false);
        ua.touch(A);
        ua.broadcast(Asc::BUS_DEVICE_RESET, None);
        ua.forget(A);
        assert_eq!(ua.queued(A), 0);
        assert!(!ua.known.contains(A));
        // Back as a new nexus: nothing from before.
        assert_eq!(ua.take(A), None);
    }

    #[test]
    fn queue_is_bounded() {
        let ua = UnitAttentions::new(false);
        ua.touch(A);
        for ascq in 0..20u8 {
            let code = Asc { asc: 0x2A, ascq };
            ua.broadcast(code, None);
        }
        assert_eq!(ua.queued(A), MAX_QUEUED);
    }

    #[test]
    fn rebuild_keeps_attention_flags() {
        let ua = UnitAttentions::new(false);
        ua.touch(A);
        ua.touch(B);
        ua.broadcast(Asc::BUS_DEVICE_RESET, Some(B));
        let entries: Vec<_> = ua
            .inner
            .lock()
            .iter()
            .map(|(id, q)| (*id, !q.is_empty()))
            .collect();
        ua.known.rebuild(entries.into_iter());
        assert!(!ua.is_quiet(A));
        assert!(ua.is_quiet(B));
    }

    #[test]
    fn table_survives_churn_and_marker_ids() {
        let ua = UnitAttentions::new(false);
        for round in 0..10u64 {
            for i in 0..600u64 {
                ua.touch(NexusId(round * 1000 + i));
            }
            for i in 0..600u64 {
                ua.forget(NexusId(round * 1000 + i));
            }
        }
        for i in 0..600u64 {
            ua.touch(NexusId(i));
        }
        let fast = (0..600u64).filter(|&i| ua.is_quiet(NexusId(i))).count();
        assert!(fast > 500, "most nexuses take the lock-free path ({fast})");
        for id in [u64::MAX, u64::MAX - 1] {
            ua.touch(NexusId(id));
            assert!(!ua.is_quiet(NexusId(id)));
            assert_eq!(ua.take(NexusId(id)), None);
        }
    }
}
