//! Per-second rates computed from the cumulative counters: sampled once a
//! second, kept for the last [`HISTORY`] seconds for the console's charts
//! and `ironsan top`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

use hdrhistogram::Histogram;
use serde::Serialize;

use server::stats::{LunCounters, Snapshot};

/// Seconds of history kept.
pub const HISTORY: usize = 300;

/// One interval's rates of a LUN or a session.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Rate {
    /// End of the interval, milliseconds since the Unix epoch.
    pub t: u64,
    pub read_iops: f64,
    pub write_iops: f64,
    /// 10^6 bytes per second.
    pub read_mbps: f64,
    pub write_mbps: f64,
    /// Average latency in the interval, microseconds.
    pub read_lat_us: f64,
    pub write_lat_us: f64,
    /// 99th percentile of read and write latency in the interval, µs.
    pub p99_us: f64,
    /// Average commands in flight (sum of latencies / interval).
    pub qd: f64,
    /// CHECK CONDITIONs and other errors in the interval.
    pub errors: u64,
}

/// Computes the rates between two cumulative counter sets over `secs`.
pub fn rate(prev: Option<&LunCounters>, cur: &LunCounters, secs: f64, t: u64) -> Rate {
    let zero = LunCounters::default();
    let p = prev.unwrap_or(&zero);
    let secs = secs.max(1e-3);
    let d = |a: u64, b: u64| a.saturating_sub(b) as f64;
    let (rops, wops) = (d(cur.read_ops, p.read_ops), d(cur.write_ops, p.write_ops));
    let (rlat, wlat) = (
        d(cur.read_lat_ns, p.read_lat_ns),
        d(cur.write_lat_ns, p.write_lat_ns),
    );
    let mut h: Histogram<u64> = cur.read_hist.clone();
    let _ = h.add(&cur.write_hist);
    let mut hp = p.read_hist.clone();
    let _ = hp.add(&p.write_hist);
    // Counters only grow, so the previous histogram is contained in the
    // current one; if not (a session's counters were lost), use it whole.
    if h.subtract(&hp).is_err() {
        h = cur.read_hist.clone();
        let _ = h.add(&cur.write_hist);
    }
    Rate {
        t,
        read_iops: rops / secs,
        write_iops: wops / secs,
        read_mbps: d(cur.read_bytes, p.read_bytes) / secs / 1e6,
        write_mbps: d(cur.write_bytes, p.write_bytes) / secs / 1e6,
        read_lat_us: if rops > 0.0 { rlat / rops / 1e3 } else { 0.0 },
        write_lat_us: if wops > 0.0 { wlat / wops / 1e3 } else { 0.0 },
        p99_us: if h.is_empty() {
            0.0
        } else {
            h.value_at_quantile(0.99) as f64 / 1e3
        },
        qd: (rlat + wlat) / (secs * 1e9),
        errors: (cur.check_conditions + cur.other_errors)
            .saturating_sub(p.check_conditions + p.other_errors),
    }
}

/// The sampler's state.
#[derive(Default)]
pub struct Rates {
    last: Option<(Instant, Snapshot)>,
    /// Per "target/lun".
    pub luns: BTreeMap<String, VecDeque<Rate>>,
    /// Latest per session id.
    pub sessions: HashMap<u64, Rate>,
}

/// The key of a LUN in the history.
pub fn lun_key(target: &str, lun: u16) -> String {
    format!("{target}/{lun}")
}

impl Rates {
    /// Adds the interval that ends with `snap`.
    pub fn push(&mut self, snap: Snapshot, now: Instant, t_ms: u64) {
        if let Some((at, prev)) = &self.last {
            let secs = now.duration_since(*at).as_secs_f64();
            for (k, c) in &snap.luns {
                let r = rate(prev.luns.get(k), c, secs, t_ms);
                let q = self.luns.entry(lun_key(&k.0, k.1)).or_default();
                q.push_back(r);
                while q.len() > HISTORY {
                    q.pop_front();
                }
            }
            self.sessions.clear();
            for s in &snap.sessions {
                let p = prev.sessions.iter().find(|x| x.info.id == s.info.id);
                self.sessions
                    .insert(s.info.id, rate(p.map(|p| &p.total), &s.total, secs, t_ms));
            }
        }
        self.last = Some((now, snap));
    }

    /// The newest rate of a LUN.
    pub fn latest(&self, key: &str) -> Option<&Rate> {
        self.luns.get(key).and_then(|q| q.back())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rates_from_deltas() {
        let mut a = LunCounters::default();
        a.record(server::stats::IoKind::Read, 4096, 0, 100_000);
        let mut b = a.clone();
        for _ in 0..1000 {
            b.record(server::stats::IoKind::Read, 4096, 0, 200_000);
        }
        b.record(server::stats::IoKind::Write, 1_000_000, 2, 1_000_000);
        let r = rate(Some(&a), &b, 2.0, 5);
        assert_eq!(r.read_iops, 500.0);
        assert_eq!(r.write_iops, 0.5);
        assert!((r.read_mbps - 4096.0 * 500.0 / 1e6).abs() < 1e-9);
        assert!((r.read_lat_us - 200.0).abs() < 1e-6);
        assert!((r.p99_us - 200.0).abs() < 2.0, "{}", r.p99_us);
        assert_eq!(r.errors, 1);
        // 1000 × 200 µs + 1 ms over 2 s.
        assert!((r.qd - 0.1005).abs() < 1e-9, "{}", r.qd);
    }

    #[test]
    fn history_is_bounded() {
        let mut r = Rates::default();
        let t0 = Instant::now();
        for i in 0..(HISTORY + 10) {
            let mut s = Snapshot::default();
            s.luns.insert(("t".into(), 0), LunCounters::default());
            r.push(s, t0 + Duration::from_secs(i as u64), i as u64);
        }
        assert_eq!(r.luns["t/0"].len(), HISTORY);
        assert_eq!(r.latest("t/0").unwrap().t, (HISTORY + 9) as u64);
    }
}
