//! Connection admission that a flood cannot starve, and CHAP guessing
//! slowed across connections (docs/ADMIN.md "Trust model").
//!
//! - **Connections not yet logged in** are bounded overall
//!   (`max_pending`) and per source address (`max_pending_per_source`).
//!   At a bound a new connection is not refused: it evicts an older one
//!   still logging in — first one that has sent nothing, then one that
//!   named an initiator on no ACL, and only then one whose initiator is on
//!   an ACL (the reserve). Thousands of idle sockets therefore hold at most
//!   `max_pending` descriptors and cannot keep an allowed initiator out;
//!   whoever reconnects only evicts its own oldest sockets first.
//! - **The security stage** (RFC 7143 §6.3) must end within
//!   `timeouts.security` seconds of the connection (the whole login within
//!   `timeouts.login`).
//! - **CHAP responses** are answered no faster than one per spacing per
//!   source address and per initiator name, across connections, where the
//!   spacing grows with the recent failures of that address or name: none
//!   for the first `chap_free_failures` (3), then 125 ms doubling up to
//!   `chap_max_delay_ms` (1 s). A response that would wait longer than [`MAX_WAIT`] is
//!   refused without being checked (authentication failure), after
//!   [`MAX_WAIT`]: a refusal costs a guesser as much time as a check.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;

/// How far a login waiting to be checked may be pushed back.
pub const MAX_WAIT: Duration = Duration::from_secs(10);
/// Failures are forgotten after this long without another.
const FAILURE_WINDOW: Duration = Duration::from_secs(300);
/// Addresses and names remembered by the throttle at most.
const MAX_KEYS: usize = 8192;

/// How much a connection still logging in is worth keeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Standing {
    /// Nothing received yet.
    Silent,
    /// Sent a login request, for an initiator on no ACL.
    Talking,
    /// Its initiator name is on a target's ACL.
    Listed,
}

/// Counters for /metrics.
#[derive(Debug, Default)]
pub struct AdmissionCounters {
    /// Connections still logging in closed to admit a newer one.
    pub evicted: AtomicU64,
    /// Logins that did not finish the security stage in time.
    pub security_timeouts: AtomicU64,
    /// CHAP responses that failed.
    pub chap_failures: AtomicU64,
    /// CHAP responses held back by the throttle.
    pub chap_delayed: AtomicU64,
    /// CHAP responses refused because the wait would be too long.
    pub chap_refused: AtomicU64,
}

#[derive(Debug)]
struct Entry {
    ip: IpAddr,
    standing: Standing,
    evict: Arc<Notify>,
}

#[derive(Debug, Default)]
struct Pending {
    next: u64,
    by_id: BTreeMap<u64, Entry>,
    per_ip: HashMap<IpAddr, usize>,
}

impl Pending {
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.by_id.remove(&id)?;
        if let Some(n) = self.per_ip.get_mut(&e.ip) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&e.ip);
            }
        }
        Some(e)
    }

    /// The least worth keeping (lowest standing, then oldest), among those
    /// from `ip` if given.
    fn victim(&self, ip: Option<IpAddr>) -> Option<u64> {
        self.by_id
            .iter()
            .filter(|(_, e)| ip.is_none_or(|ip| e.ip == ip))
            .min_by_key(|(id, e)| (e.standing, **id))
            .map(|(id, _)| *id)
    }
}

/// The connections still logging in.
#[derive(Debug)]
pub(crate) struct Admission {
    pending: Arc<Mutex<Pending>>,
    max_pending: usize,
    max_per_source: usize,
    pub counters: Arc<AdmissionCounters>,
}

/// A connection's place among those logging in; given up when dropped.
#[derive(Debug)]
pub(crate) struct Ticket {
    pending: Arc<Mutex<Pending>>,
    id: u64,
    /// Fires when a newer connection took this one's place.
    pub evicted: Arc<Notify>,
}

impl Ticket {
    /// Raises (never lowers) this connection's standing.
    pub fn stand(&self, s: Standing) {
        if let Some(e) = self.pending.lock().by_id.get_mut(&self.id) {
            e.standing = e.standing.max(s);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.pending.lock().remove(self.id);
    }
}

impl Admission {
    pub fn new(
        max_pending: usize,
        max_per_source: usize,
        counters: Arc<AdmissionCounters>,
    ) -> Self {
        Admission {
            pending: Arc::default(),
            max_pending: max_pending.max(1),
            max_per_source: max_per_source.max(1),
            counters,
        }
    }

    /// Admits a connection from `ip`, evicting older ones at the bounds.
    pub fn admit(&self, ip: IpAddr) -> Ticket {
        let mut p = self.pending.lock();
        let evict = |p: &mut Pending, from: Option<IpAddr>| {
            if let Some(e) = p.victim(from).and_then(|id| p.remove(id)) {
                e.evict.notify_one();
                self.counters.evicted.fetch_add(1, Ordering::Relaxed);
            }
        };
        if p.per_ip.get(&ip).copied().unwrap_or(0) >= self.max_per_source {
            evict(&mut p, Some(ip));
        }
        if p.by_id.len() >= self.max_pending {
            evict(&mut p, None);
        }
        let id = p.next;
        p.next += 1;
        let notify = Arc::new(Notify::new());
        p.by_id.insert(
            id,
            Entry {
                ip,
                standing: Standing::Silent,
                evict: notify.clone(),
            },
        );
        *p.per_ip.entry(ip).or_default() += 1;
        Ticket {
            pending: self.pending.clone(),
            id,
            evicted: notify,
        }
    }

    /// Connections still logging in.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.pending.lock().by_id.len()
    }
}

/// One address's or name's record.
#[derive(Debug, Clone, Copy)]
struct Record {
    /// When the next CHAP response may be checked.
    next_free: Instant,
    failures: u32,
    last_failure: Instant,
}

/// CHAP responses spaced per source address and per initiator name.
#[derive(Debug)]
pub(crate) struct Throttle {
    keys: Mutex<HashMap<Key, Record>>,
    /// Failures answered without delay.
    free: u32,
    /// The largest spacing.
    max: Duration,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new(3, Duration::from_secs(1))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Addr(IpAddr),
    Name(String),
}

impl Throttle {
    /// `free` failures answered at once, then a spacing from 125 ms
    /// doubling up to `max`.
    pub fn new(free: u32, max: Duration) -> Throttle {
        Throttle {
            keys: Mutex::default(),
            free,
            max,
        }
    }

    /// The spacing after `failures` recent failures.
    fn spacing(&self, failures: u32) -> Duration {
        if failures < self.free {
            return Duration::ZERO;
        }
        let n = (failures - self.free).min(16);
        Duration::from_millis(125u64 << n).min(self.max)
    }

    /// Reserves the next check of a CHAP response from `ip` for
    /// `initiator`: how long to wait first, or `None` when that would be
    /// longer than [`MAX_WAIT`] (refuse it).
    pub fn reserve(&self, ip: IpAddr, initiator: &str, now: Instant) -> Option<Duration> {
        let mut m = self.keys.lock();
        if m.len() >= MAX_KEYS {
            m.retain(|_, r| {
                now.duration_since(r.last_failure) < FAILURE_WINDOW || r.next_free > now
            });
        }
        let keys = [Key::Addr(ip), Key::Name(initiator.to_string())];
        let mut start = now;
        for k in &keys {
            if let Some(r) = m.get_mut(k) {
                if now.duration_since(r.last_failure) >= FAILURE_WINDOW {
                    r.failures = 0;
                }
                start = start.max(r.next_free);
            }
        }
        let wait = start - now;
        if wait > MAX_WAIT {
            return None;
        }
        for k in keys {
            if m.len() >= MAX_KEYS && !m.contains_key(&k) {
                continue;
            }
            let r = m.entry(k).or_insert(Record {
                next_free: now,
                failures: 0,
                last_failure: now,
            });
            r.next_free = start + self.spacing(r.failures);
        }
        Some(wait)
    }

    /// Records how the check went.
    pub fn outcome(&self, ip: IpAddr, initiator: &str, ok: bool, now: Instant) {
        let mut m = self.keys.lock();
        for k in [Key::Addr(ip), Key::Name(initiator.to_string())] {
            let Some(r) = m.get_mut(&k) else { continue };
            if ok {
                // The name proved itself; the address keeps its record.
                if matches!(k, Key::Name(_)) {
                    r.failures = 0;
                }
            } else {
                r.failures = r.failures.saturating_add(1);
                r.last_failure = now;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_evicts_its_own_oldest_and_never_the_listed() {
        let a = Admission::new(8, 4, Arc::default());
        let flood: IpAddr = "192.0.2.1".parse().unwrap();
        let honest: IpAddr = "192.0.2.2".parse().unwrap();
        let mut tickets: Vec<Ticket> = (0..100).map(|_| a.admit(flood)).collect();
        assert_eq!(
            a.len(),
            4,
            "one source holds at most max_pending_per_source"
        );
        let ok = a.admit(honest);
        ok.stand(Standing::Listed);
        tickets.extend((0..100).map(|_| a.admit(flood)));
        assert_eq!(a.len(), 5);
        assert_eq!(a.counters.evicted.load(Ordering::Relaxed), 196);
        // Many sources: the global bound, silent ones go first.
        let others: Vec<Ticket> = (0..20)
            .map(|i| a.admit(IpAddr::from([198, 51, 100, i])))
            .collect();
        assert_eq!(a.len(), 8);
        assert!(
            a.pending.lock().by_id.contains_key(&ok.id),
            "the listed one stays"
        );
        drop(others);
        drop(tickets);
        drop(ok);
        assert_eq!(a.len(), 0);
        assert!(a.pending.lock().per_ip.is_empty());
    }

    #[test]
    fn evicted_tickets_are_told() {
        let a = Admission::new(1, 1, Arc::default());
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let first = a.admit(ip);
        let _second = a.admit(ip);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(1), first.evicted.notified())
                .await
                .expect("told at once (the permit is stored)");
        });
    }

    #[test]
    fn guessing_is_spaced_across_connections() {
        let t = Throttle::default();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let t0 = Instant::now();
        // An honest first try waits for nothing.
        assert_eq!(t.reserve(ip, "iqn.x:a", t0), Some(Duration::ZERO));
        t.outcome(ip, "iqn.x:a", true, t0);
        // Fifty guessers from one address with many names, at once.
        let mut last = Duration::ZERO;
        let mut guesses_in_10s = 0;
        for i in 0..200 {
            let name = format!("iqn.x:guess{}", i % 50);
            match t.reserve(ip, &name, t0) {
                Some(w) => {
                    assert!(w >= last, "in order");
                    last = w;
                    guesses_in_10s += 1;
                    t.outcome(ip, &name, false, t0 + w);
                }
                None => break,
            }
        }
        // Three free, then 125, 250, 500 ms, then 1 s each, up to 10 s.
        assert!(guesses_in_10s <= 3 + 3 + 9 + 1, "{guesses_in_10s}");
        assert!(last <= MAX_WAIT);
        assert_eq!(t.reserve(ip, "iqn.x:late", t0), None, "refused, not queued");
        // Another address and name are not held up.
        assert_eq!(
            t.reserve("192.0.2.9".parse().unwrap(), "iqn.x:b", t0),
            Some(Duration::ZERO)
        );
        // The failures are forgotten after a quiet window.
        let later = t0 + MAX_WAIT + FAILURE_WINDOW;
        assert_eq!(t.reserve(ip, "iqn.x:a", later), Some(Duration::ZERO));
    }
}
