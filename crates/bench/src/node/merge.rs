//! Merging the nodes' results: counts summed, latency histograms added
//! (`Histogram::add`; percentiles are never averaged), and the stonewall.

use std::time::Duration;

use crate::engine::PathStat;
use crate::node::msg::Sample;
use crate::run::{DirStats, RunResult, Second};

/// The aggregate over the window when every node was running: from the
/// barrier start until the first job of any node finished (elbencho's
/// stonewall). Each node's I/Os at that moment come from its timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct Stonewall {
    /// When the first job finished (measured time).
    pub at: Duration,
    /// The node whose job finished first (index into the nodes).
    pub first_node: usize,
    /// I/Os and bytes of all nodes until `at`.
    pub ios: u64,
    pub bytes: u64,
}

impl Stonewall {
    /// I/Os per second in the window.
    pub fn iops(&self) -> f64 {
        self.ios as f64 / self.at.as_secs_f64().max(1e-9)
    }

    /// Bytes per second in the window.
    pub fn bw(&self) -> f64 {
        self.bytes as f64 / self.at.as_secs_f64().max(1e-9)
    }
}

/// A node's cumulative (I/Os, bytes) at `us` microseconds, interpolated
/// linearly between the samples around it.
pub fn at(timeline: &[Sample], us: u64) -> (u64, u64) {
    let Some(last) = timeline.last() else {
        return (0, 0);
    };
    if us >= last.us {
        return (last.ios, last.bytes);
    }
    let i = timeline.partition_point(|s| s.us <= us);
    let (a, b) = match i {
        0 => (
            Sample {
                us: 0,
                ios: 0,
                bytes: 0,
            },
            timeline[0],
        ),
        i => (timeline[i - 1], timeline[i]),
    };
    let span = (b.us - a.us).max(1) as f64;
    let f = (us.saturating_sub(a.us)) as f64 / span;
    let lerp = |x: u64, y: u64| x + ((y.saturating_sub(x)) as f64 * f).round() as u64;
    (lerp(a.ios, b.ios), lerp(a.bytes, b.bytes))
}

/// The stonewall over the nodes' results and timelines (`None` without
/// nodes).
pub fn stonewall(nodes: &[(&RunResult, &[Sample])]) -> Option<Stonewall> {
    let (first_node, first) = nodes
        .iter()
        .enumerate()
        .min_by_key(|(_, (r, _))| r.first_finish)?;
    let t = first.0.first_finish;
    let us = u64::try_from(t.as_micros()).unwrap_or(u64::MAX);
    let (mut ios, mut bytes) = (0, 0);
    for (_, tl) in nodes {
        let (i, b) = at(tl, us);
        ios += i;
        bytes += b;
    }
    Some(Stonewall {
        at: t,
        first_node,
        ios,
        bytes,
    })
}

/// One result for all nodes: totals summed, histograms added, the series
/// summed second by second, the elapsed time that of the longest node.
/// `labels` name the nodes in merged error lines.
pub fn merge(results: &[&RunResult], labels: &[String]) -> RunResult {
    let mut read = DirStats::new();
    let mut write = DirStats::new();
    let mut trim = DirStats::new();
    let mut series: Vec<Second> = Vec::new();
    let mut paths: Vec<PathStat> = Vec::new();
    let mut error_samples = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let mut elapsed = Duration::ZERO;
    let mut first_finish: Option<Duration> = None;
    let mut verified_bytes = 0;
    let mut engine: Option<&'static str> = None;
    for (i, r) in results.iter().enumerate() {
        read.merge(&r.read);
        write.merge(&r.write);
        trim.merge(&r.trim);
        for (k, s) in r.series.iter().enumerate() {
            if series.len() <= k {
                series.push(Second::new());
            }
            series[k].merge(s);
        }
        for p in &r.paths {
            match paths.iter_mut().find(|q| q.name == p.name) {
                Some(q) => {
                    q.ios += p.ios;
                    q.retries += p.retries;
                    q.failovers += p.failovers;
                    if q.failed.is_none() {
                        q.failed.clone_from(&p.failed);
                    }
                    if q.group.is_none() {
                        q.group = p.group;
                    }
                }
                None => paths.push(p.clone()),
            }
        }
        let label = labels.get(i).map_or("?", String::as_str);
        error_samples.extend(r.error_samples.iter().map(|e| format!("{label}: {e}")));
        for n in &r.notes {
            if !notes.contains(n) {
                notes.push(n.clone());
            }
        }
        elapsed = elapsed.max(r.elapsed);
        first_finish = Some(first_finish.map_or(r.first_finish, |f| f.min(r.first_finish)));
        verified_bytes += r.verified_bytes;
        engine = match engine {
            None => Some(r.engine),
            Some(e) if e == r.engine => Some(e),
            Some(_) => Some("mixed"),
        };
    }
    error_samples.truncate(10);
    let verify_id = results.first().and_then(|r| r.verify_id);
    RunResult {
        read,
        write,
        trim,
        elapsed,
        series,
        paths,
        error_samples,
        engine: engine.unwrap_or(""),
        notes,
        verify_id: verify_id.filter(|id| results.iter().all(|r| r.verify_id == Some(*id))),
        verified_bytes,
        capacity: results.iter().map(|r| r.capacity).min().unwrap_or(0),
        first_finish: first_finish.unwrap_or(elapsed),
        // Depths and CPU are per node: not merged.
        counters: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(lat: &[u64], elapsed_ms: u64, first_ms: u64) -> RunResult {
        let mut read = DirStats::new();
        for &l in lat {
            read.ios += 1;
            read.bytes += 4096;
            read.lat.record(l).unwrap();
        }
        RunResult {
            read,
            write: DirStats::new(),
            trim: DirStats::new(),
            elapsed: Duration::from_millis(elapsed_ms),
            series: Vec::new(),
            paths: Vec::new(),
            error_samples: Vec::new(),
            engine: "iscsi",
            notes: Vec::new(),
            verify_id: None,
            verified_bytes: 0,
            capacity: 1 << 30,
            first_finish: Duration::from_millis(first_ms),
            counters: Default::default(),
        }
    }

    #[test]
    fn histograms_are_added_not_averaged() {
        // A fast node (1000 I/Os at 10 us) and a slow one (10 at 10 ms):
        // averaging the nodes' p99 would give ~5 ms; the merged p99 is 10 us
        // because 99% of all I/Os were fast.
        let fast = result(&[10_000; 1000], 1000, 1000);
        let slow = result(&[10_000_000; 10], 1000, 900);
        let m = merge(&[&fast, &slow], &["a".into(), "b".into()]);
        assert_eq!(m.read.ios, 1010);
        assert_eq!(m.read.lat.len(), 1010);
        assert_eq!(m.read.bytes, 1010 * 4096);
        let p99 = m.read.lat.value_at_quantile(0.99);
        assert!((9_990..=10_010).contains(&p99), "{p99}");
        let p999 = m.read.lat.value_at_quantile(0.999);
        assert!(p999 >= 9_990_000, "{p999}");
        assert_eq!(m.first_finish, Duration::from_millis(900));
        assert_eq!(m.elapsed, Duration::from_millis(1000));
    }

    #[test]
    fn stonewall_counts_every_node_until_the_first_finishes() {
        let a = result(&[1000; 10], 1000, 1000);
        let b = result(&[1000; 10], 2000, 500);
        let ta = [
            Sample {
                us: 0,
                ios: 0,
                bytes: 0,
            },
            Sample {
                us: 1_000_000,
                ios: 1000,
                bytes: 1000 * 4096,
            },
        ];
        let tb = [
            Sample {
                us: 0,
                ios: 0,
                bytes: 0,
            },
            Sample {
                us: 400_000,
                ios: 400,
                bytes: 400 * 4096,
            },
            Sample {
                us: 600_000,
                ios: 800,
                bytes: 800 * 4096,
            },
            Sample {
                us: 2_000_000,
                ios: 900,
                bytes: 900 * 4096,
            },
        ];
        let s = stonewall(&[(&a, &ta[..]), (&b, &tb[..])]).unwrap();
        assert_eq!(s.first_node, 1);
        assert_eq!(s.at, Duration::from_millis(500));
        // a: 500 at 0.5 s; b: halfway between 400 and 800.
        assert_eq!(s.ios, 500 + 600);
        assert!((s.iops() - 2200.0).abs() < 1e-6);
        assert_eq!(at(&tb, 5_000_000), (900, 900 * 4096));
        assert_eq!(at(&[], 5), (0, 0));
        assert!(stonewall(&[]).is_none());
    }
}
