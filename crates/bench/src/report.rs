//! Reports: fio-style text, and JSON with fio's field names where one
//! exists (`jobs[].read.iops`, `bw_bytes`, `clat_ns.percentile`, …) so
//! tools that read fio's JSON read ours.

use serde_json::{json, Value};

use crate::engine::Op;
use crate::run::{DirStats, RunResult};
use crate::spec::JobSpec;

/// The percentiles reported.
pub const PERCENTILES: [f64; 7] = [1.0, 5.0, 50.0, 90.0, 99.0, 99.9, 99.99];

/// fio's default percentile list (`percentile_list`), as in its JSON.
pub const FIO_PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

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
    s += &dir_text("trim", &r.trim, r);
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

/// `{min, max, mean, stddev, N}` of a latency histogram (ns).
fn lat_stats(d: &DirStats) -> serde_json::Map<String, Value> {
    let l = &d.lat;
    let mut m = serde_json::Map::new();
    if d.ios == 0 {
        m.insert("min".into(), json!(0));
        m.insert("max".into(), json!(0));
        m.insert("mean".into(), json!(0.0));
        m.insert("stddev".into(), json!(0.0));
        m.insert("N".into(), json!(0));
    } else {
        m.insert("min".into(), json!(l.min()));
        m.insert("max".into(), json!(l.max()));
        m.insert("mean".into(), json!(l.mean()));
        m.insert("stddev".into(), json!(l.stdev()));
        m.insert("N".into(), json!(d.ios));
    }
    m
}

/// fio's `clat_ns`: the statistics, its 17 default percentiles and, for
/// json+, the histogram's bins (`"ns": count`; fio's own tools, such as
/// fio_jsonplus_clat2csv, read them).
fn clat_json(d: &DirStats, plus: bool, percentiles: &[f64]) -> Value {
    let mut m = lat_stats(d);
    if d.ios > 0 {
        let mut pct = serde_json::Map::new();
        for &q in percentiles {
            pct.insert(format!("{q:.6}"), json!(d.lat.value_at_quantile(q / 100.0)));
        }
        m.insert("percentile".into(), Value::Object(pct));
    }
    // As fio: no bins for a direction without I/O.
    if plus && d.ios > 0 {
        let mut bins = serde_json::Map::new();
        for v in d.lat.iter_recorded() {
            bins.insert(
                d.lat.highest_equivalent(v.value_iterated_to()).to_string(),
                json!(v.count_at_value()),
            );
        }
        m.insert("bins".into(), Value::Object(bins));
    }
    Value::Object(m)
}

/// Per-second samples of one direction: (bandwidth KiB/s, IOPS).
fn samples(r: &RunResult, op: Op) -> (Vec<f64>, Vec<f64>) {
    r.series
        .iter()
        .map(|s| {
            let (ios, bytes) = second(s, op);
            (bytes as f64 / 1024.0, ios as f64)
        })
        .unzip()
}

/// min, max, mean, population standard deviation.
fn spread(v: &[f64]) -> (f64, f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0, 0.0);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (min, max, mean, var.sqrt())
}

fn dir_json(d: &DirStats, r: &RunResult, op: Op, plus: bool, percentiles: &[f64]) -> Value {
    let (bw_s, iops_s) = samples(r, op);
    let (bw_min, bw_max, bw_mean, bw_dev) = spread(&bw_s);
    let (io_min, io_max, io_mean, io_dev) = spread(&iops_s);
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
        // Submission latency is not measured apart: no samples (what fio
        // reports for synchronous engines).
        "slat_ns": {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0},
        "clat_ns": clat_json(d, plus, percentiles),
        "lat_ns": Value::Object(lat_stats(d)),
        "bw_min": bw_min as u64,
        "bw_max": bw_max as u64,
        "bw_agg": if d.ios > 0 { 100.0 } else { 0.0 },
        "bw_mean": bw_mean,
        "bw_dev": bw_dev,
        "bw_samples": bw_s.len(),
        "iops_min": io_min as u64,
        "iops_max": io_max as u64,
        "iops_mean": io_mean,
        "iops_stddev": io_dev,
        "iops_samples": iops_s.len(),
        "errors": d.errors,
    })
}

/// Percentages of `counts` under fio's bucket `labels`.
fn buckets(labels: &[&str], counts: &[u64]) -> Value {
    let total: u64 = counts.iter().sum();
    let mut m = serde_json::Map::new();
    for (l, c) in labels.iter().zip(counts) {
        let pct = if total == 0 {
            0.0
        } else {
            *c as f64 * 100.0 / total as f64
        };
        m.insert((*l).into(), json!(pct));
    }
    Value::Object(m)
}

/// fio's latency buckets' bounds: ns and µs share them; ms has two more.
const LAT_NS: [u64; 10] = [2, 4, 10, 20, 50, 100, 250, 500, 750, 1000];
/// One second's (I/Os, bytes) of one direction.
fn second(s: &crate::run::Second, op: Op) -> (u64, u64) {
    match op {
        Op::Read => (s.read_ios, s.read_bytes),
        Op::Write => (s.write_ios, s.write_bytes),
        Op::Trim => (s.trim_ios, s.trim_bytes),
    }
}

/// True when any direction had an error.
fn any_error(r: &RunResult) -> bool {
    r.errors() > 0
}

const LAT_MS: [u64; 11] = [2, 4, 10, 20, 50, 100, 250, 500, 750, 1000, 2000];

/// Percent of all I/Os whose completion latency falls in each of fio's
/// buckets (up to and including the bound): ns, µs, ms (the last ms
/// bucket is >= 2000).
fn latency_percents(r: &RunResult) -> ([f64; 10], [f64; 10], [f64; 12]) {
    let mut ns = [0u64; 10];
    let mut us = [0u64; 10];
    let mut ms = [0u64; 12];
    let total = r.read.ios + r.write.ios + r.trim.ios;
    for d in [&r.read, &r.write, &r.trim] {
        for v in d.lat.iter_recorded() {
            let x = d.lat.highest_equivalent(v.value_iterated_to());
            let c = v.count_at_value();
            if x <= 1000 {
                ns[LAT_NS.iter().position(|&b| x <= b).unwrap_or(9)] += c;
            } else if x <= 1_000_000 {
                us[LAT_NS.iter().position(|&b| x <= b * 1000).unwrap_or(9)] += c;
            } else {
                ms[LAT_MS
                    .iter()
                    .position(|&b| x <= b * 1_000_000)
                    .unwrap_or(11)] += c;
            }
        }
    }
    let pct = |c: u64| {
        if total == 0 {
            0.0
        } else {
            c as f64 * 100.0 / total as f64
        }
    };
    (ns.map(pct), us.map(pct), ms.map(pct))
}

/// fio's latency_ns/us/ms objects.
fn latency_buckets(r: &RunResult) -> (Value, Value, Value) {
    let (ns, us, ms) = latency_percents(r);
    let obj = |labels: Vec<String>, v: &[f64]| {
        let mut m = serde_json::Map::new();
        for (l, x) in labels.into_iter().zip(v) {
            m.insert(l, json!(x));
        }
        Value::Object(m)
    };
    let small = || LAT_NS.iter().map(u64::to_string).collect::<Vec<_>>();
    let mut large: Vec<String> = LAT_MS.iter().map(u64::to_string).collect();
    large.push(">=2000".into());
    (obj(small(), &ns), obj(small(), &us), obj(large, &ms))
}

/// fio-compatible JSON (fio 3.33's layout) with an `ironsan` section for
/// what fio lacks.
pub fn json(spec: &JobSpec, r: &RunResult) -> Value {
    json_with(spec, r, false, &FIO_PERCENTILES)
}

/// fio's JSON, or with `plus` its json+ (histogram bins in `clat_ns`),
/// with the completion latency at `percentiles` (fio's percentile_list).
pub fn json_with(spec: &JobSpec, r: &RunResult, plus: bool, percentiles: &[f64]) -> Value {
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
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let c = &r.counters;
    let secs = r.elapsed.as_secs_f64().max(1e-9);
    let (lat_ns, lat_us, lat_ms) = latency_buckets(r);
    let batch = ["0", "4", "8", "16", "32", "64", ">=64"];
    let mut submit = [0u64; 7];
    submit[1] = c.submits;
    let mut options = serde_json::Map::new();
    options.insert("name".into(), json!(spec.name));
    options.insert(
        "filename".into(),
        json!(spec
            .targets
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(":")),
    );
    options.insert("rw".into(), json!(spec.rw.name()));
    options.insert("bs".into(), json!(spec.bs.to_string()));
    options.insert("iodepth".into(), json!(spec.iodepth.to_string()));
    options.insert("numjobs".into(), json!(spec.numjobs.to_string()));
    options.insert("ioengine".into(), json!(r.engine));
    if let Some(sz) = spec.size {
        options.insert("size".into(), json!(sz.to_string()));
    }
    if let Some(rt) = spec.runtime {
        options.insert("runtime".into(), json!(format!("{}ms", rt.as_millis())));
        options.insert("time_based".into(), json!("1"));
    }
    if spec.direct {
        options.insert("direct".into(), json!("1"));
    }
    json!({
        "fio version": concat!("ironsan-", env!("CARGO_PKG_VERSION")),
        "timestamp": now.as_secs(),
        "timestamp_ms": now.as_millis() as u64,
        "time": crate::cdm::date_text(now.as_secs()) + " UTC",
        "global options": {
            "rw": spec.rw.name(),
            "bs": spec.bs.to_string(),
            "iodepth": spec.iodepth.to_string(),
            "numjobs": spec.numjobs.to_string(),
        },
        "jobs": [{
            "jobname": spec.name,
            "groupid": 0,
            "error": u64::from(any_error(r)),
            "eta": 0,
            "elapsed": r.elapsed.as_secs(),
            "job options": Value::Object(options),
            "read": dir_json(&r.read, r, Op::Read, plus, percentiles),
            "write": dir_json(&r.write, r, Op::Write, plus, percentiles),
            "trim": dir_json(&r.trim, r, Op::Trim, plus, percentiles),
            "sync": {"total_ios": 0, "lat_ns": {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0}},
            "job_runtime": r.elapsed.as_millis() as u64,
            "usr_cpu": c.usr.as_secs_f64() * 100.0 / secs,
            "sys_cpu": c.sys.as_secs_f64() * 100.0 / secs,
            "ctx": c.ctx,
            "majf": c.majf,
            "minf": c.minf,
            "iodepth_level": buckets(&["1", "2", "4", "8", "16", "32", ">=64"], &c.depth),
            "iodepth_submit": buckets(&batch, &submit),
            "iodepth_complete": buckets(&batch, &c.complete),
            "latency_ns": lat_ns,
            "latency_us": lat_us,
            "latency_ms": lat_ms,
            "latency_depth": spec.iodepth,
            "latency_target": 0,
            "latency_percentile": 100.0,
            "latency_window": 0,
        }],
        "disk_util": [],
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

/// fio's per-second logs (`log_avg_msec=1000`): `NAME_bw.1.log` (KiB/s),
/// `NAME_iops.1.log` and, with `lat`, `NAME_clat.1.log`/`NAME_lat.1.log`
/// (mean ns); lines `msec, value, ddir, 0, 0`, ddir 0 read, 1 write, 2
/// trim.
/// Returns the files written.
pub fn write_logs(
    r: &RunResult,
    bw: Option<&str>,
    iops: Option<&str>,
    lat: Option<&str>,
) -> std::io::Result<Vec<String>> {
    use std::fmt::Write as _;
    let mut written = Vec::new();
    let dirs: Vec<Op> = [
        (Op::Read, r.read.ios),
        (Op::Write, r.write.ios),
        (Op::Trim, r.trim.ios),
    ]
    .iter()
    .filter(|(_, n)| *n > 0)
    .map(|(d, _)| *d)
    .collect();
    let mut emit = |name: String, value: &dyn Fn(&crate::run::Second, Op) -> u64| {
        let mut text = String::new();
        for (i, s) in r.series.iter().enumerate() {
            for &d in &dirs {
                let _ = writeln!(
                    text,
                    "{}, {}, {}, 0, 0",
                    (i + 1) * 1000,
                    value(s, d),
                    d.ddir()
                );
            }
        }
        std::fs::write(&name, text)?;
        written.push(name);
        Ok::<(), std::io::Error>(())
    };
    if let Some(n) = bw {
        emit(format!("{n}_bw.1.log"), &|s, d| second(s, d).1 / 1024)?;
    }
    if let Some(n) = iops {
        emit(format!("{n}_iops.1.log"), &|s, d| second(s, d).0)?;
    }
    if let Some(n) = lat {
        let mean = |s: &crate::run::Second, _: Op| {
            if s.lat.is_empty() {
                0
            } else {
                s.lat.mean() as u64
            }
        };
        emit(format!("{n}_clat.1.log"), &mean)?;
        emit(format!("{n}_lat.1.log"), &mean)?;
    }
    Ok(written)
}

/// fio's terse output, version 3 (`--output-format=terse`): one line of 130
/// `;`-separated fields for the job: version, fio version, name, group,
/// error; for reads then writes 41 fields each (KiB, KiB/s, IOPS, runtime
/// ms, submission and completion latency min/max/mean/dev in µs, 20
/// completion latency percentiles as `P%=µs` padded with `0%=0`, total
/// latency, bandwidth min/max/aggregate %/mean/dev); CPU user and system
/// %, context switches, major and minor faults; 7 I/O depth levels; 10
/// latency buckets in µs and 12 in ms; and the first disk's utilisation
/// (name, I/Os, merges, ticks, time in queue, util %).
pub fn terse(spec: &JobSpec, r: &RunResult, disk: Option<&Value>, percentiles: &[f64]) -> String {
    let mut f: Vec<String> = vec![
        "3".into(),
        concat!("ironsan-", env!("CARGO_PKG_VERSION")).into(),
        spec.name.clone(),
        "0".into(),
        u64::from(any_error(r)).to_string(),
    ];
    let us = |ns: f64| ns / 1000.0;
    // Version 3 has no trim fields (fio added them in version 4).
    for (d, op) in [(&r.read, Op::Read), (&r.write, Op::Write)] {
        f.push((d.bytes / 1024).to_string());
        f.push(((bw(d, r) / 1024.0) as u64).to_string());
        f.push(format!("{:.0}", iops(d, r)));
        f.push(r.elapsed.as_millis().to_string());
        f.extend(["0", "0", "0.000000", "0.000000"].map(String::from));
        let (min, max, mean, dev) = if d.ios == 0 {
            (0.0, 0.0, 0.0, 0.0)
        } else {
            (
                us(d.lat.min() as f64),
                us(d.lat.max() as f64),
                us(d.lat.mean()),
                us(d.lat.stdev()),
            )
        };
        let lat = [
            format!("{min:.0}"),
            format!("{max:.0}"),
            format!("{mean:.6}"),
            format!("{dev:.6}"),
        ];
        f.extend(lat.iter().cloned());
        for i in 0..20 {
            f.push(match percentiles.get(i) {
                Some(p) if d.ios > 0 => format!(
                    "{p:.6}%={:.0}",
                    us(d.lat.value_at_quantile(p / 100.0) as f64)
                ),
                Some(p) => format!("{p:.6}%=0"),
                None => "0%=0".into(),
            });
        }
        f.extend(lat.iter().cloned());
        let (bw_s, _) = samples(r, op);
        let (bmin, bmax, bmean, bdev) = spread(&bw_s);
        f.push((bmin as u64).to_string());
        f.push((bmax as u64).to_string());
        f.push(
            if d.ios > 0 {
                "100.000000%"
            } else {
                "0.000000%"
            }
            .into(),
        );
        f.push(format!("{bmean:.6}"));
        f.push(format!("{bdev:.6}"));
    }
    let c = &r.counters;
    let secs = r.elapsed.as_secs_f64().max(1e-9);
    f.push(format!("{:.6}%", c.usr.as_secs_f64() * 100.0 / secs));
    f.push(format!("{:.6}%", c.sys.as_secs_f64() * 100.0 / secs));
    f.push(c.ctx.to_string());
    f.push(c.majf.to_string());
    f.push(c.minf.to_string());
    let total: u64 = c.depth.iter().sum();
    for n in c.depth {
        f.push(format!(
            "{:.1}%",
            if total == 0 {
                0.0
            } else {
                n as f64 * 100.0 / total as f64
            }
        ));
    }
    let (_, lat_us, lat_ms) = latency_percents(r);
    for x in lat_us.iter().chain(&lat_ms) {
        f.push(format!("{x:.2}%"));
    }
    if let Some(d) = disk {
        let g = |k: &str| d[k].as_u64().unwrap_or(0).to_string();
        f.push(d["name"].as_str().unwrap_or("").into());
        for k in [
            "read_ios",
            "write_ios",
            "read_merges",
            "write_merges",
            "read_ticks",
            "write_ticks",
            "in_queue",
        ] {
            f.push(g(k));
        }
        f.push(format!("{:.2}%", d["util"].as_f64().unwrap_or(0.0)));
    }
    f.join(";") + "\n"
}
