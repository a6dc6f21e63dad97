//! Running a [`JobSpec`]: one thread per job, each keeping `iodepth` I/Os
//! in flight on its own engine, timing every I/O into HDR histograms
//! (nanoseconds) and counting completions per second.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;

use crate::engine::{Done, Engine, Io, IscsiEngine, PsyncEngine};
use crate::spec::{JobSpec, TargetSpec};
use crate::workload::Workload;

/// Totals of one direction.
#[derive(Clone, Debug)]
pub struct DirStats {
    pub ios: u64,
    pub bytes: u64,
    pub errors: u64,
    /// Completion latency in nanoseconds.
    pub lat: Histogram<u64>,
}

impl DirStats {
    fn new() -> DirStats {
        DirStats {
            ios: 0,
            bytes: 0,
            errors: 0,
            lat: Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("bounds"),
        }
    }

    fn merge(&mut self, o: &DirStats) {
        self.ios += o.ios;
        self.bytes += o.bytes;
        self.errors += o.errors;
        self.lat.add(&o.lat).expect("same bounds");
    }
}

/// The result of a run, merged across jobs.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub read: DirStats,
    pub write: DirStats,
    /// Measured time.
    pub elapsed: Duration,
    /// Completions per second: (reads, writes, read bytes, write bytes).
    pub series: Vec<(u64, u64, u64, u64)>,
    /// I/Os per path, for multipath runs.
    pub paths: Vec<(String, u64)>,
    /// First errors seen (at most 10).
    pub error_samples: Vec<String>,
}

struct JobOut {
    read: DirStats,
    write: DirStats,
    series: Vec<(u64, u64, u64, u64)>,
    paths: Vec<(String, u64)>,
    errors: Vec<String>,
}

/// Opens the engine for one job.
pub fn open_engine(spec: &JobSpec, keep_data: bool) -> Result<Box<dyn Engine>, String> {
    match &spec.targets[0] {
        TargetSpec::Iscsi(u) if spec.targets.len() == 1 => {
            Ok(Box::new(IscsiEngine::open(u, &spec.initiator, keep_data)?))
        }
        TargetSpec::Iscsi(_) => Err("multipath is not available in this build".into()),
        TargetSpec::File(p) => {
            let create = spec
                .create
                .then(|| spec.offset + spec.size.unwrap_or(0))
                .filter(|s| *s > 0);
            Ok(Box::new(PsyncEngine::open(
                p,
                spec.direct,
                create,
                spec.bs,
                keep_data,
            )?))
        }
    }
}

/// Live progress shared with the caller (for a progress line).
#[derive(Debug, Default)]
pub struct Progress {
    pub ios: AtomicU64,
    pub bytes: AtomicU64,
}

/// Runs the plan. `progress` is updated as I/Os complete.
pub fn run(spec: &JobSpec, progress: Option<Arc<Progress>>) -> Result<RunResult, String> {
    spec.validate()?;
    let mut engines = Vec::new();
    for _ in 0..spec.numjobs {
        engines.push(open_engine(spec, false)?);
    }
    let cap = engines[0].capacity();
    let bs = u64::from(spec.bs);
    if u64::from(engines[0].block_size()) > bs || bs % u64::from(engines[0].block_size()) != 0 {
        return Err(format!(
            "--bs {} is not a multiple of the target's block size {}",
            spec.bs,
            engines[0].block_size()
        ));
    }
    if spec.offset >= cap {
        return Err(format!(
            "--offset {} is beyond the target's {} bytes",
            spec.offset, cap
        ));
    }
    let region = spec
        .size
        .unwrap_or(cap - spec.offset)
        .min(cap - spec.offset);
    if region < bs {
        return Err(format!(
            "the target has {region} bytes from --offset, less than --bs"
        ));
    }
    let barrier = Arc::new(Barrier::new(spec.numjobs as usize));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for (j, engine) in engines.into_iter().enumerate() {
        let spec = spec.clone();
        let barrier = barrier.clone();
        let stop = stop.clone();
        let progress = progress.clone();
        handles.push(std::thread::spawn(move || {
            job(
                &spec,
                j as u32,
                engine,
                region,
                &barrier,
                &stop,
                progress.as_deref(),
            )
        }));
    }
    let mut read = DirStats::new();
    let mut write = DirStats::new();
    let mut series: Vec<(u64, u64, u64, u64)> = Vec::new();
    let mut paths = Vec::new();
    let mut error_samples = Vec::new();
    let mut elapsed = Duration::ZERO;
    for h in handles {
        let (out, took) = h
            .join()
            .map_err(|_| "a job thread panicked".to_string())??;
        read.merge(&out.read);
        write.merge(&out.write);
        for (i, s) in out.series.iter().enumerate() {
            if series.len() <= i {
                series.push((0, 0, 0, 0));
            }
            series[i].0 += s.0;
            series[i].1 += s.1;
            series[i].2 += s.2;
            series[i].3 += s.3;
        }
        paths.extend(out.paths);
        error_samples.extend(out.errors);
        elapsed = elapsed.max(took);
    }
    error_samples.truncate(10);
    Ok(RunResult {
        read,
        write,
        elapsed,
        series,
        paths,
        error_samples,
    })
}

#[allow(clippy::too_many_arguments)]
fn job(
    spec: &JobSpec,
    index: u32,
    mut engine: Box<dyn Engine>,
    region: u64,
    barrier: &Barrier,
    stop: &AtomicBool,
    progress: Option<&Progress>,
) -> Result<(JobOut, Duration), String> {
    let mut wl = Workload::new(
        spec.rw,
        spec.rwmixread,
        spec.bs,
        spec.offset,
        region,
        spec.randseed,
        index,
        spec.numjobs,
    );
    let payload = Bytes::from(pattern(spec.bs as usize, spec.randseed ^ u64::from(index)));
    let depth = spec.iodepth as usize;
    let mut started: Vec<(Instant, bool, u64)> = vec![(Instant::now(), false, 0); depth];
    let mut free: Vec<usize> = (0..depth).rev().collect();
    let mut done: Vec<Done> = Vec::with_capacity(depth);
    let mut out = JobOut {
        read: DirStats::new(),
        write: DirStats::new(),
        series: Vec::new(),
        paths: Vec::new(),
        errors: Vec::new(),
    };
    // Per job, a job of only --size bytes stops after that many bytes.
    let byte_budget = if spec.runtime.is_none() {
        region / u64::from(spec.numjobs)
    } else {
        u64::MAX
    };
    let mut issued: u64 = 0;
    barrier.wait();
    let t0 = Instant::now();
    let measure_from = t0 + spec.ramp_time;
    let deadline = spec.runtime.map(|r| measure_from + r);
    let mut inflight = 0usize;
    loop {
        let now = Instant::now();
        let over = stop.load(Ordering::Relaxed)
            || deadline.is_some_and(|d| now >= d)
            || issued >= byte_budget;
        if !over {
            while let Some(&slot) = free.last() {
                if !engine.can_submit() || issued >= byte_budget {
                    break;
                }
                free.pop();
                let (write, offset) = wl.next_io();
                started[slot] = (Instant::now(), write, offset);
                engine.submit(
                    Io {
                        write,
                        offset,
                        len: spec.bs,
                        slot,
                    },
                    &payload,
                )?;
                issued += u64::from(spec.bs);
                inflight += 1;
            }
        }
        if inflight == 0 {
            break;
        }
        engine.reap(&mut done)?;
        let now = Instant::now();
        for d in done.drain(..) {
            inflight -= 1;
            free.push(d.slot);
            let (start, write, offset) = started[d.slot];
            if start < measure_from {
                continue;
            }
            let st = if write { &mut out.write } else { &mut out.read };
            match d.result {
                Ok(()) => {
                    st.ios += 1;
                    st.bytes += u64::from(spec.bs);
                    let ns = now
                        .duration_since(start)
                        .as_nanos()
                        .min(u128::from(u64::MAX)) as u64;
                    st.lat.saturating_record(ns.max(1));
                    let sec = now.duration_since(measure_from).as_secs() as usize;
                    if out.series.len() <= sec {
                        out.series.resize(sec + 1, (0, 0, 0, 0));
                    }
                    let e = &mut out.series[sec];
                    if write {
                        e.1 += 1;
                        e.3 += u64::from(spec.bs);
                    } else {
                        e.0 += 1;
                        e.2 += u64::from(spec.bs);
                    }
                    if let Some(p) = progress {
                        p.ios.fetch_add(1, Ordering::Relaxed);
                        p.bytes.fetch_add(u64::from(spec.bs), Ordering::Relaxed);
                    }
                }
                Err(e) => {
                    st.errors += 1;
                    if out.errors.len() < 10 {
                        out.errors.push(format!(
                            "{} at byte {offset}: {e}",
                            if write { "write" } else { "read" }
                        ));
                    }
                }
            }
        }
    }
    let took = Instant::now().saturating_duration_since(measure_from);
    out.paths = engine.path_counts();
    Ok((out, took))
}

/// A deterministic, non-compressible payload.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut r = crate::workload::Rng::new(seed);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}
