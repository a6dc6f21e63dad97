//! `GET /metrics`: the counters in the Prometheus text exposition format
//! (version 0.0.4): `# HELP` and `# TYPE` once per family, label values
//! escaped, latency as histograms in seconds with cumulative `le` buckets.

use std::fmt::Write;

use hdrhistogram::Histogram;

use server::control::TargetView;
use server::stats::{LunCounters, Snapshot};

/// Latency bucket bounds, seconds.
const BUCKETS: [f64; 16] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 1.0, 10.0,
];

/// The admission and CHAP throttle counters (server::admission), appended
/// to `text`.
pub fn render_admission(text: &mut String, c: &server::admission::AdmissionCounters) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut o = Out {
        text: std::mem::take(text),
    };
    for (name, help, v) in [
        (
            "ironsan_connections_evicted_total",
            "Connections still logging in closed to admit a newer one (per-source and overall bounds).",
            &c.evicted,
        ),
        (
            "ironsan_security_timeouts_total",
            "Logins that did not finish the security stage in time.",
            &c.security_timeouts,
        ),
        (
            "ironsan_chap_failures_total",
            "CHAP responses that failed.",
            &c.chap_failures,
        ),
        (
            "ironsan_chap_delayed_total",
            "CHAP responses held back by the per-address and per-name throttle.",
            &c.chap_delayed,
        ),
        (
            "ironsan_chap_refused_total",
            "CHAP responses refused unchecked: the throttle's wait would have been too long.",
            &c.chap_refused,
        ),
    ] {
        o.family(name, "counter", help);
        o.sample(name, "", v.load(Relaxed));
    }
    *text = o.text;
}

/// Escapes a label value (backslash, double quote, newline).
pub fn escape(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

struct Out {
    text: String,
}

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &str, v: impl std::fmt::Display) {
        if labels.is_empty() {
            let _ = writeln!(self.text, "{name} {v}");
        } else {
            let _ = writeln!(self.text, "{name}{{{labels}}} {v}");
        }
    }

    fn histogram(&mut self, name: &str, labels: &str, h: &Histogram<u64>, sum_ns: u64) {
        let sep = if labels.is_empty() { "" } else { "," };
        for b in BUCKETS {
            let le_ns = (b * 1e9) as u64;
            let n = if h.is_empty() {
                0
            } else {
                h.count_between(0, le_ns)
            };
            let _ = writeln!(self.text, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {n}");
        }
        let _ = writeln!(
            self.text,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            h.len()
        );
        let _ = writeln!(self.text, "{name}_sum{{{labels}}} {}", sum_ns as f64 / 1e9);
        let _ = writeln!(self.text, "{name}_count{{{labels}}} {}", h.len());
    }
}

type Counter = (&'static str, &'static str, fn(&LunCounters) -> u64);

/// The counter families kept per LUN, per session and per portal.
const COUNTERS: [Counter; 7] = [
    ("read_ops_total", "READ commands completed.", |c| c.read_ops),
    ("write_ops_total", "WRITE commands completed.", |c| {
        c.write_ops
    }),
    ("other_ops_total", "Other SCSI commands completed.", |c| {
        c.other_ops
    }),
    ("read_bytes_total", "Bytes read.", |c| c.read_bytes),
    ("write_bytes_total", "Bytes written.", |c| c.write_bytes),
    (
        "check_conditions_total",
        "Commands ended with CHECK CONDITION.",
        |c| c.check_conditions,
    ),
    (
        "other_errors_total",
        "Commands ended with BUSY, RESERVATION CONFLICT or TASK SET FULL.",
        |c| c.other_errors,
    ),
];

/// Labels and counters of one row of a counter family.
type Rows<'a> = Vec<(String, &'a LunCounters)>;

/// Renders `snap` (and the LUN sizes of `targets`).
pub fn render(snap: &Snapshot, targets: &[TargetView]) -> String {
    let mut o = Out {
        text: String::with_capacity(16 * 1024),
    };
    server_gauges(&mut o, snap, targets);
    let lun_labels: Rows<'_> = snap
        .luns
        .iter()
        .map(|((t, l), c)| (format!("target=\"{}\",lun=\"{l}\"", escape(t)), c))
        .collect();
    let sess_labels: Rows<'_> = snap
        .sessions
        .iter()
        .map(|s| {
            (
                format!(
                    "session=\"{}\",initiator=\"{}\",isid=\"{}\",target=\"{}\",portal=\"{}\"",
                    s.info.id,
                    escape(&s.info.initiator),
                    s.info.isid,
                    escape(&s.info.target),
                    escape(&s.info.portal)
                ),
                &s.total,
            )
        })
        .collect();
    let portal_labels: Rows<'_> = snap
        .portals
        .iter()
        .map(|(tpgt, c)| (format!("tpgt=\"{tpgt}\""), c))
        .collect();
    counters(&mut o, &lun_labels, &sess_labels, &portal_labels);
    latency_histograms(&mut o, &lun_labels);
    session_gauges(&mut o, snap, &sess_labels);
    portal_events(&mut o, snap);
    o.text
}

/// Uptime, sessions and LUN sizes.
fn server_gauges(o: &mut Out, snap: &Snapshot, targets: &[TargetView]) {
    o.family(
        "ironsan_uptime_seconds",
        "gauge",
        "Seconds since the server started.",
    );
    o.sample("ironsan_uptime_seconds", "", snap.uptime.as_secs_f64());
    o.family(
        "ironsan_sessions",
        "gauge",
        "Sessions in full feature phase.",
    );
    o.sample("ironsan_sessions", "", snap.sessions.len());
    o.family(
        "ironsan_storage_faults_total",
        "counter",
        "Commands ended on a storage fault, by kind: unresponsive (NOT READY 04/01, retried on \
         the same path), not_accessible (04/0B, another gateway owns the storage), no_space, \
         medium (MEDIUM ERROR).",
    );
    for (kind, n) in scsi::storage_faults() {
        o.sample(
            "ironsan_storage_faults_total",
            &format!("kind=\"{}\"", kind.name()),
            n,
        );
    }

    o.family("ironsan_lun_size_bytes", "gauge", "Capacity of the LUN.");
    for t in targets {
        for l in &t.luns {
            let lab = format!(
                "target=\"{}\",lun=\"{}\",naa=\"{}\"",
                escape(&t.name),
                l.lun,
                l.naa
            );
            o.sample("ironsan_lun_size_bytes", &lab, l.size_bytes);
        }
    }
}

/// The command counters per LUN, per session and per portal.
fn counters(o: &mut Out, lun_labels: &Rows<'_>, sess_labels: &Rows<'_>, portal_labels: &Rows<'_>) {
    for (scope, rows) in [
        ("lun", lun_labels),
        ("session", sess_labels),
        ("portal", portal_labels),
    ] {
        for (suffix, help, f) in COUNTERS {
            let name = format!("ironsan_{scope}_{suffix}");
            o.family(&name, "counter", help);
            for (lab, c) in rows.iter() {
                o.sample(&name, lab, f(c));
            }
        }
    }
}

/// READ and WRITE latency histograms per LUN.
fn latency_histograms(o: &mut Out, lun_labels: &Rows<'_>) {
    for (dir, help) in [("read", "READ latency"), ("write", "WRITE latency")] {
        let name = format!("ironsan_lun_{dir}_latency_seconds");
        o.family(
            &name,
            "histogram",
            &format!("{help} at the target, from the command's arrival to its status leaving."),
        );
        for (lab, c) in lun_labels {
            let (h, sum) = if dir == "read" {
                (&c.read_hist, c.read_lat_ns)
            } else {
                (&c.write_hist, c.write_lat_ns)
            };
            o.histogram(&name, lab, h, sum);
        }
    }
}

/// Commands in flight and rejects per session.
fn session_gauges(o: &mut Out, snap: &Snapshot, sess_labels: &Rows<'_>) {
    type Field = fn(&server::stats::SessionSnapshot) -> u64;
    let families: [(&str, &str, &str, Field); 3] = [
        (
            "ironsan_session_in_flight",
            "gauge",
            "Commands received and not yet answered (queue depth in use).",
            |s| u64::from(s.in_flight),
        ),
        (
            "ironsan_session_in_flight_max",
            "gauge",
            "The most commands in flight since login.",
            |s| u64::from(s.max_in_flight),
        ),
        (
            "ironsan_session_rejects_total",
            "counter",
            "Reject PDUs sent to the session.",
            |s| s.rejects,
        ),
    ];
    for (name, kind, help, f) in families {
        o.family(name, kind, help);
        for (s, (lab, _)) in snap.sessions.iter().zip(sess_labels) {
            o.sample(name, lab, f(s));
        }
    }
}

/// Connections, logins, failures, drops and rejects per portal.
fn portal_events(o: &mut Out, snap: &Snapshot) {
    type Ev = (
        &'static str,
        &'static str,
        fn(&server::stats::PortalEvents) -> u64,
    );
    let events: [Ev; 4] = [
        ("connections_total", "TCP connections accepted.", |e| {
            e.connections
        }),
        (
            "logins_total",
            "Logins that reached full feature phase.",
            |e| e.logins,
        ),
        (
            "login_failures_total",
            "Connections that ended during login (refused, timed out or closed).",
            |e| e.login_failures,
        ),
        (
            "dropped_connections_total",
            "Connections that ended other than by logout or shutdown.",
            |e| e.dropped,
        ),
    ];
    for (suffix, help, f) in events {
        let name = format!("ironsan_portal_{suffix}");
        o.family(&name, "counter", help);
        for (tpgt, e) in &snap.portal_events {
            o.sample(&name, &format!("tpgt=\"{tpgt}\""), f(e));
        }
    }
    o.family(
        "ironsan_portal_rejects_total",
        "counter",
        "Reject PDUs sent through the portal.",
    );
    for (tpgt, n) in &snap.portal_rejects {
        o.sample(
            "ironsan_portal_rejects_total",
            &format!("tpgt=\"{tpgt}\""),
            n,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use server::stats::{ConnStats, SessionInfo, StatsRegistry};
    use std::time::{Duration, Instant};

    #[test]
    fn escapes_label_values() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn renders_valid_exposition() {
        let reg = StatsRegistry::new();
        let s = reg.register(SessionInfo {
            id: 7,
            initiator: "iqn.x:\"i\"".into(),
            target: "iqn.t:a".into(),
            tpgt: 1,
            ..SessionInfo::default()
        });
        let mut c = ConnStats::new(Some(s));
        let t0 = Instant::now() - Duration::from_micros(300);
        c.completed(0, 0x28, 4096, 0, t0);
        c.completed(0, 0x28, 4096, 0, t0);
        c.completed(0, 0x2a, 512, 2, t0);
        c.finish();
        let text = render(&reg.snapshot(), &[]);
        assert!(text.contains("ironsan_lun_read_ops_total{target=\"iqn.t:a\",lun=\"0\"} 2\n"));
        assert!(text.contains("ironsan_lun_read_bytes_total{target=\"iqn.t:a\",lun=\"0\"} 8192\n"));
        assert!(
            text.contains("ironsan_lun_check_conditions_total{target=\"iqn.t:a\",lun=\"0\"} 1\n")
        );
        assert!(text.contains("initiator=\"iqn.x:\\\"i\\\"\""));
        // Buckets are cumulative and end with +Inf = _count.
        assert!(text.contains(
            "ironsan_lun_read_latency_seconds_bucket{target=\"iqn.t:a\",lun=\"0\",le=\"0.0001\"} 0\n"
        ));
        assert!(text.contains(
            "ironsan_lun_read_latency_seconds_bucket{target=\"iqn.t:a\",lun=\"0\",le=\"0.001\"} 2\n"
        ));
        assert!(text.contains(
            "ironsan_lun_read_latency_seconds_bucket{target=\"iqn.t:a\",lun=\"0\",le=\"+Inf\"} 2\n"
        ));
        assert!(text
            .contains("ironsan_lun_read_latency_seconds_count{target=\"iqn.t:a\",lun=\"0\"} 2\n"));
        // Every sample line is `name{labels} value` or `name value`, and
        // every family is announced once before its samples.
        let mut families = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap();
                assert!(families.insert(name.to_string()), "{name} twice");
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            let (head, value) = line.rsplit_once(' ').unwrap();
            value.parse::<f64>().unwrap_or_else(|_| panic!("{line}"));
            let name = head.split('{').next().unwrap();
            let base = name
                .trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count");
            assert!(
                families.contains(name) || families.contains(base),
                "{name} before its TYPE"
            );
            assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        }
    }
}
