//! Reports: fio-style text, and JSON with fio's field names where one
//! exists (`jobs[].read.iops`, `bw_bytes`, `clat_ns.percentile`, …) so
//! tools that read fio's JSON read ours.

use serde_json::{json, Value};

use crate::run::{DirStats, RunResult};
use crate::spec::JobSpec;

/// The percentiles reported.
pub const PERCENTILES: [f64; 7] = [1.0, 5.0, 50.0, 90.0, 99.0, 99.9, 99.99];

/// IOPS of one direction.
pub fn iops(d: &DirStats, r: &RunResult) -> f64 {
    d.ios as f64 / r.elapsed.as_secs_f64().max(1e-9)
}

/// Bytes per second of one direction.
pub fn bw(d: &DirStats, r: &RunResult) -> f64 {
    d.bytes as f64 / r.elapsed.as_secs_f64().max(1e-9)
}

fn human(n: f64) -> String {
    if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

fn usec(ns: f64) -> String {
    format!("{:.1}", ns / 1000.0)
}

fn dir_text(name: &str, d: &DirStats, r: &RunResult) -> String {
    if d.ios == 0 && d.errors == 0 {
        return String::new();
    }
    let l = &d.lat;
    let mut s = format!(
        "  {name}: IOPS={}, BW={:.1}MiB/s ({:.1}MB/s), {} I/Os in {:.1}s, {} errors\n",
        human(iops(d, r)),
        bw(d, r) / (1 << 20) as f64,
        bw(d, r) / 1e6,
        d.ios,
        r.elapsed.as_secs_f64(),
        d.errors
    );
    if d.ios > 0 {
        s += &format!(
            "    clat (usec): min={}, avg={}, max={}, stdev={}\n",
            usec(l.min() as f64),
            usec(l.mean()),
            usec(l.max() as f64),
            usec(l.stdev())
        );
        let p: Vec<String> = [50.0, 90.0, 99.0, 99.9, 99.99]
            .iter()
            .map(|q| format!("{q}th=[{}]", usec(l.value_at_quantile(q / 100.0) as f64)))
            .collect();
        s += &format!("    clat percentiles (usec): {}\n", p.join(", "));
    }
    s
}

/// fio-style text.
pub fn text(spec: &JobSpec, r: &RunResult) -> String {
    let mut s = format!(
        "{}: rw={}, bs={}, iodepth={}, numjobs={}, ioengine={}, target={}\n",
        spec.name,
        spec.rw.name(),
        spec.bs,
        spec.iodepth,
        spec.numjobs,
        r.engine,
        spec.targets
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    s += &dir_text("read", &r.read, r);
    s += &dir_text("write", &r.write, r);
    if !r.paths.is_empty() {
        let total: u64 = r.paths.iter().map(|p| p.ios).sum::<u64>().max(1);
        let p: Vec<String> = r
            .paths
            .iter()
            .map(|p| {
                let mut t = format!(
                    "{}={} ({:.1}%)",
                    p.name,
                    p.ios,
                    p.ios as f64 * 100.0 / total as f64
                );
                if let (Some(g), Some(st)) = (p.group, &p.state) {
                    t += &format!(" [group {g} {st}]");
                }
                if p.retries > 0 || p.failovers > 0 {
                    t += &format!(" [retries {}, failovers {}]", p.retries, p.failovers);
                }
                if let Some(f) = &p.failed {
                    t += &format!(" [failed: {f}]");
                }
                t
            })
            .collect();
        s += &format!("  paths: {}\n", p.join(", "));
    }
    if spec.verify {
        match (r.verify_id, spec.rw.read_percent(spec.rwmixread)) {
            (Some(id), 100) => {
                s += &format!(
                    "  verify: {} bytes read and checked, all blocks good (run id {id:#018x})\n",
                    r.verified_bytes
                )
            }
            (Some(id), _) => {
                s += &format!(
                    "  verify: blocks written with run id {id:#018x}; check them with \
                     --rw read --verify --verify-id {id:#x}\n"
                );
                if r.verified_bytes > 0 {
                    s += &format!(
                        "  verify: {} bytes read and checked, all good\n",
                        r.verified_bytes
                    );
                }
            }
            (None, _) => s += "  verify: nothing read\n",
        }
    }
    for n in &r.notes {
        s += &format!("  note: {n}\n");
    }
    for e in &r.error_samples {
        s += &format!("  error: {e}\n");
    }
    s
}

fn lat_json(d: &DirStats) -> Value {
    let l = &d.lat;
    let mut pct = serde_json::Map::new();
    for q in PERCENTILES {
        pct.insert(
            format!("{q:.6}"),
            json!(if d.ios > 0 {
                l.value_at_quantile(q / 100.0)
            } else {
                0
            }),
        );
    }
    if d.ios == 0 {
        return json!({"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0, "percentile": pct});
    }
    json!({"min": l.min(), "max": l.max(), "mean": l.mean(), "stddev": l.stdev(), "N": d.ios, "percentile": pct})
}

fn dir_json(d: &DirStats, r: &RunResult) -> Value {
    json!({
        "io_bytes": d.bytes,
        "io_kbytes": d.bytes / 1024,
        "bw_bytes": bw(d, r) as u64,
        "bw": (bw(d, r) / 1024.0) as u64,
        "iops": iops(d, r),
        "runtime": r.elapsed.as_millis() as u64,
        "total_ios": d.ios,
        "short_ios": 0,
        "drop_ios": 0,
        "errors": d.errors,
        "clat_ns": lat_json(d),
        "lat_ns": lat_json(d),
    })
}

/// fio-compatible JSON with an `ironsan` section for what fio lacks.
pub fn json(spec: &JobSpec, r: &RunResult) -> Value {
    let series: Vec<Value> = r
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let q = |p: f64| if s.lat.is_empty() { 0 } else { s.lat.value_at_quantile(p) };
            json!({"second": i, "read_iops": s.read_ios, "write_iops": s.write_ios,
                "read_bytes": s.read_bytes, "write_bytes": s.write_bytes,
                "lat_ns": {"p50": q(0.5), "p99": q(0.99), "max": if s.lat.is_empty() { 0 } else { s.lat.max() }}})
        })
        .collect();
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    json!({
        "fio version": concat!("ironsan-", env!("CARGO_PKG_VERSION")),
        "timestamp": ts,
        "global options": {
            "rw": spec.rw.name(),
            "bs": spec.bs.to_string(),
            "iodepth": spec.iodepth.to_string(),
            "numjobs": spec.numjobs.to_string(),
        },
        "jobs": [{
            "jobname": spec.name,
            "groupid": 0,
            "error": u64::from(r.read.errors + r.write.errors > 0),
            "job options": {"rw": spec.rw.name(), "bs": spec.bs.to_string(), "iodepth": spec.iodepth.to_string()},
            "read": dir_json(&r.read, r),
            "write": dir_json(&r.write, r),
            "job_runtime": r.elapsed.as_millis() as u64,
        }],
        "ironsan": {
            "targets": spec.targets.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
            "series": series,
            "ioengine": r.engine,
            "paths": r.paths.iter().map(|p| json!({"path": p.name, "ios": p.ios, "failed": p.failed, "group": p.group, "state": p.state, "retries": p.retries, "failovers": p.failovers})).collect::<Vec<_>>(),
            "errors": r.error_samples,
            "notes": r.notes,
            "verify": if spec.verify {
                json!({"run_id": r.verify_id.map(|i| format!("{i:#x}")), "verified_bytes": r.verified_bytes})
            } else {
                Value::Null
            },
        }
    })
}
