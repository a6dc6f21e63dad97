//! Running a [`JobSpec`]: one thread per job, each keeping `iodepth` I/Os
//! in flight on its own engine, timing every I/O into HDR histograms
//! (nanoseconds) and counting completions per second.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;

use crate::engine::{Done, Engine, Io, IscsiEngine, Op, PathStat, PsyncEngine};
use crate::multipath::MultipathEngine;
use crate::spec::{IoEngineKind, JobSpec, TargetSpec};
use crate::uring::UringEngine;
use crate::verify::{self, RunIdCheck};
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
    /// Empty, with the bounds every run uses (1 ns to 1 hour, 3 digits).
    pub fn new() -> DirStats {
        DirStats {
            ios: 0,
            bytes: 0,
            errors: 0,
            lat: Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("bounds"),
        }
    }

    /// Adds another run's totals; histograms are added, never averaged.
    pub fn merge(&mut self, o: &DirStats) {
        self.ios += o.ios;
        self.bytes += o.bytes;
        self.errors += o.errors;
        self.lat.add(&o.lat).expect("same bounds");
    }
}

/// What fio reports beside the I/O totals: queue depths at submission,
/// completions per reap, and the process's CPU time, context switches and
/// page faults over the run.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// I/Os submitted with the job's in-flight count (after the submit) in
    /// fio's iodepth_level buckets: 1, 2-3, 4-7, 8-15, 16-31, 32-63, >=64.
    pub depth: [u64; 7],
    /// Reaps by completions returned, in fio's iodepth_complete buckets:
    /// 0, 1-4, 5-8, 9-16, 17-32, 33-64, >64.
    pub complete: [u64; 7],
    /// Submit calls (each submits one I/O).
    pub submits: u64,
    /// CPU time in user and system mode over the run (the whole process).
    pub usr: Duration,
    pub sys: Duration,
    /// Context switches (voluntary and not), major and minor page faults.
    pub ctx: u64,
    pub majf: u64,
    pub minf: u64,
}

impl Counters {
    /// fio's iodepth_level bucket of an in-flight count.
    pub fn depth_bucket(n: usize) -> usize {
        match n {
            0 | 1 => 0,
            2..=3 => 1,
            4..=7 => 2,
            8..=15 => 3,
            16..=31 => 4,
            32..=63 => 5,
            _ => 6,
        }
    }

    /// fio's iodepth_submit/complete bucket of a batch size.
    pub fn batch_bucket(n: usize) -> usize {
        match n {
            0 => 0,
            1..=4 => 1,
            5..=8 => 2,
            9..=16 => 3,
            17..=32 => 4,
            33..=64 => 5,
            _ => 6,
        }
    }

    fn merge(&mut self, o: &Counters) {
        for i in 0..7 {
            self.depth[i] += o.depth[i];
            self.complete[i] += o.complete[i];
        }
        self.submits += o.submits;
    }
}

/// The process's resource usage now: (user, system, context switches,
/// major faults, minor faults).
fn rusage() -> (Duration, Duration, u64, u64, u64) {
    // SAFETY: an all-zero rusage is a valid value for getrusage to fill.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid rusage to write; RUSAGE_SELF needs nothing else.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return Default::default();
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    (
        tv(u.ru_utime),
        tv(u.ru_stime),
        (u.ru_nvcsw + u.ru_nivcsw).max(0) as u64,
        u.ru_majflt.max(0) as u64,
        u.ru_minflt.max(0) as u64,
    )
}

/// The result of a run, merged across jobs.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub read: DirStats,
    pub write: DirStats,
    pub trim: DirStats,
    /// Measured time.
    pub elapsed: Duration,
    /// Completions per second of the measured time.
    pub series: Vec<Second>,
    /// I/Os per path, for multipath runs (summed over jobs).
    pub paths: Vec<PathStat>,
    /// First errors seen (at most 10).
    pub error_samples: Vec<String>,
    /// The engine used (`iscsi`, `multipath`, `io_uring`, `psync`).
    pub engine: &'static str,
    /// Things the user should know (an engine fallback).
    pub notes: Vec<String>,
    /// With `--verify`: the run id written or checked.
    pub verify_id: Option<u64>,
    /// With `--verify`: bytes read and checked.
    pub verified_bytes: u64,
    /// The target's size in bytes.
    pub capacity: u64,
    /// Measured time until the first job finished (the stonewall: until
    /// then every job was running).
    pub first_finish: Duration,
    /// Depths, batches and CPU (fio's job-level fields).
    pub counters: Counters,
}

impl RunResult {
    /// I/O errors in every direction.
    pub fn errors(&self) -> u64 {
        self.read.errors + self.write.errors + self.trim.errors
    }
}

/// One second of the series.
#[derive(Clone, Debug)]
pub struct Second {
    pub read_ios: u64,
    pub write_ios: u64,
    pub trim_ios: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub trim_bytes: u64,
    /// Latency of the I/Os completed in this second (2 significant digits).
    pub lat: Histogram<u64>,
}

impl Second {
    /// Empty (2 significant digits).
    pub fn new() -> Second {
        Second {
            read_ios: 0,
            write_ios: 0,
            trim_ios: 0,
            read_bytes: 0,
            write_bytes: 0,
            trim_bytes: 0,
            lat: Histogram::new_with_bounds(1, 3_600_000_000_000, 2).expect("bounds"),
        }
    }

    /// Adds another second's counts and latencies.
    pub fn merge(&mut self, o: &Second) {
        self.read_ios += o.read_ios;
        self.write_ios += o.write_ios;
        self.trim_ios += o.trim_ios;
        self.read_bytes += o.read_bytes;
        self.write_bytes += o.write_bytes;
        self.trim_bytes += o.trim_bytes;
        self.lat.add(&o.lat).expect("same bounds");
    }
}

struct JobOut {
    read: DirStats,
    write: DirStats,
    trim: DirStats,
    series: Vec<Second>,
    paths: Vec<PathStat>,
    errors: Vec<String>,
    verified: u64,
    /// UNIT ATTENTIONs the engine retried.
    unit_attentions: Vec<((u8, u8, u8), u64)>,
    counters: Counters,
}

/// An opened engine with its name and a note on any fallback.
pub struct Opened {
    pub engine: Box<dyn Engine>,
    pub name: &'static str,
    pub note: Option<String>,
}

/// Opens the engine for one job.
pub fn open_engine(spec: &JobSpec, keep_data: bool) -> Result<Opened, String> {
    let plain = |engine: Box<dyn Engine>, name| Opened {
        engine,
        name,
        note: None,
    };
    match &spec.targets[0] {
        TargetSpec::Iscsi(u) if spec.targets.len() == 1 => Ok(plain(
            Box::new(IscsiEngine::open(
                u,
                &spec.initiator,
                keep_data,
                spec.busy_poll,
            )?),
            "iscsi",
        )),
        TargetSpec::Nvme(u) if spec.targets.len() == 1 => Ok(plain(
            Box::new(crate::nvme::NvmeEngine::open(
                u,
                &spec.initiator,
                keep_data,
                spec.iodepth,
                spec.busy_poll,
            )?),
            "nvme-tcp",
        )),
        TargetSpec::Nvme(_) => {
            let urls = spec
                .targets
                .iter()
                .filter_map(|t| match t {
                    TargetSpec::Nvme(u) => Some(u.clone()),
                    TargetSpec::File(_) | TargetSpec::Iscsi(_) => None,
                })
                .collect::<Vec<_>>();
            let policy = spec.multipath.ok_or("several targets need --multipath")?;
            Ok(plain(
                Box::new(crate::nvme_multipath::NvmeMultipathEngine::open(
                    &urls,
                    &spec.initiator,
                    keep_data,
                    policy,
                    spec.iodepth,
                    spec.busy_poll,
                )?),
                "nvme-multipath",
            ))
        }
        TargetSpec::Iscsi(_) => {
            let urls = spec
                .targets
                .iter()
                .filter_map(|t| match t {
                    TargetSpec::Iscsi(u) => Some(u.clone()),
                    TargetSpec::File(_) | TargetSpec::Nvme(_) => None,
                })
                .collect::<Vec<_>>();
            let policy = spec.multipath.ok_or("several targets need --multipath")?;
            Ok(plain(
                Box::new(MultipathEngine::open(
                    &urls,
                    &spec.initiator,
                    keep_data,
                    policy,
                    spec.busy_poll,
                )?),
                "multipath",
            ))
        }
        TargetSpec::File(p) => {
            let create = spec
                .create
                .then(|| spec.offset + spec.size.unwrap_or(0))
                .filter(|s| *s > 0);
            let psync = || -> Result<Box<dyn Engine>, String> {
                Ok(Box::new(PsyncEngine::open(
                    p,
                    spec.direct,
                    create,
                    spec.bs,
                    keep_data,
                )?))
            };
            match spec.ioengine {
                IoEngineKind::Psync => Ok(plain(psync()?, "psync")),
                IoEngineKind::IoUring | IoEngineKind::Auto => {
                    match UringEngine::open(
                        p,
                        spec.direct,
                        create,
                        spec.bs,
                        spec.iodepth,
                        keep_data,
                    ) {
                        Ok(e) => Ok(plain(Box::new(e), "io_uring")),
                        Err(e)
                            if spec.ioengine == IoEngineKind::Auto
                                && e.starts_with("io_uring unavailable") =>
                        {
                            Ok(Opened {
                                engine: psync()?,
                                name: "psync",
                                note: Some(format!(
                                    "{e}; falling back to psync (one I/O at a time per job)"
                                )),
                            })
                        }
                        Err(e) => Err(e),
                    }
                }
                IoEngineKind::Iscsi => Err("--ioengine iscsi needs an iscsi:// target".into()),
            }
        }
    }
}

/// Live progress shared with the caller (for a progress line).
#[derive(Debug, Default)]
pub struct Progress {
    /// Measured I/Os completed (after the ramp).
    pub ios: AtomicU64,
    pub bytes: AtomicU64,
    /// When the jobs started, past their common barrier (the first job's
    /// clock; measured time starts `ramp_time` later).
    pub started: std::sync::OnceLock<Instant>,
}

/// Runs the plan. `progress` is updated as I/Os complete.
pub fn run(spec: &JobSpec, progress: Option<Arc<Progress>>) -> Result<RunResult, String> {
    prepare(spec)?.run(progress, None)
}

/// A plan with its engines open (sessions logged in, files opened, buffers
/// allocated) and the region checked: everything but the I/O, so that
/// several nodes can prepare and then start together.
pub struct Prepared {
    spec: JobSpec,
    engines: Vec<Box<dyn Engine>>,
    notes: Vec<String>,
    engine_name: &'static str,
    cap: u64,
    target_bs: u32,
    region: u64,
}

/// Opens one engine per job and checks the region against the target.
pub fn prepare(spec: &JobSpec) -> Result<Prepared, String> {
    spec.validate()?;
    let keep_data = spec.verify && spec.rw.read_percent(spec.rwmixread) > 0;
    let mut engines = Vec::new();
    let mut notes = Vec::new();
    let mut engine_name = "";
    for _ in 0..spec.numjobs {
        let o = open_engine(spec, keep_data)?;
        engine_name = o.name;
        if let Some(n) = o.note {
            if !notes.contains(&n) {
                notes.push(n);
            }
        }
        engines.push(o.engine);
    }
    let cap = engines[0].capacity();
    let target_bs = engines[0].block_size();
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
    if let Some(size) = spec.size.filter(|s| *s > cap - spec.offset) {
        return Err(format!(
            "--size {size} is beyond the target: it has {} bytes from --offset {} (fio refuses too)",
            cap - spec.offset,
            spec.offset
        ));
    }
    let region = spec.size.unwrap_or(cap - spec.offset);
    if region < bs {
        return Err(format!(
            "the target has {region} bytes from --offset, less than --bs"
        ));
    }
    Ok(Prepared {
        spec: spec.clone(),
        engines,
        notes,
        engine_name,
        cap,
        target_bs,
        region,
    })
}

impl Prepared {
    /// The engine the jobs use (`iscsi`, `multipath`, `io_uring`, `psync`).
    pub fn engine_name(&self) -> &'static str {
        self.engine_name
    }

    /// The target's size in bytes.
    pub fn capacity(&self) -> u64 {
        self.cap
    }

    /// Runs the jobs. Setting `abort` makes every job stop submitting and
    /// finish what it has in flight; the result then covers the I/Os done.
    pub fn run(
        self,
        progress: Option<Arc<Progress>>,
        abort: Option<Arc<AtomicBool>>,
    ) -> Result<RunResult, String> {
        let Prepared {
            spec,
            engines,
            notes,
            engine_name,
            cap,
            target_bs,
            region,
        } = self;
        run_prepared(
            &spec,
            engines,
            notes,
            engine_name,
            cap,
            target_bs,
            region,
            progress,
            abort.unwrap_or_default(),
        )
    }
}

#[allow(clippy::too_many_arguments)]
fn run_prepared(
    spec: &JobSpec,
    engines: Vec<Box<dyn Engine>>,
    mut notes: Vec<String>,
    engine_name: &'static str,
    cap: u64,
    target_bs: u32,
    region: u64,
    progress: Option<Arc<Progress>>,
    stop: Arc<AtomicBool>,
) -> Result<RunResult, String> {
    let barrier = Arc::new(Barrier::new(spec.numjobs as usize));
    let writes = spec.rw.modifies(spec.rwmixread);
    let verify_id = match (spec.verify, spec.verify_id) {
        (false, _) => None,
        (true, Some(id)) => Some(id),
        (true, None) if writes => Some(verify::new_run_id()),
        (true, None) => None,
    };
    let shared = VerifyShared {
        write_id: verify_id,
        check: verify_id.map_or(RunIdCheck::Learn(None), RunIdCheck::Exact),
        learned: AtomicU64::new(0),
        target_bs,
    };
    let shared = Arc::new(shared);
    let usage_before = rusage();
    let mut handles = Vec::new();
    for (j, engine) in engines.into_iter().enumerate() {
        let spec = spec.clone();
        let barrier = barrier.clone();
        let stop = stop.clone();
        let progress = progress.clone();
        let shared = shared.clone();
        handles.push(std::thread::spawn(move || {
            let r = job(
                &spec,
                j as u32,
                engine,
                region,
                &barrier,
                &stop,
                progress.as_deref(),
                &shared,
            );
            if r.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            r
        }));
    }
    let mut read = DirStats::new();
    let mut write = DirStats::new();
    let mut trim = DirStats::new();
    let mut series: Vec<Second> = Vec::new();
    let mut paths: Vec<PathStat> = Vec::new();
    let mut error_samples = Vec::new();
    let mut unit_attentions = std::collections::BTreeMap::new();
    let mut counters = Counters::default();
    let mut elapsed = Duration::ZERO;
    let mut first_finish: Option<Duration> = None;
    let mut verified_bytes = 0;
    let mut first_err = None;
    for h in handles {
        let (out, took) = match h.join() {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
                continue;
            }
            Err(_) => {
                first_err.get_or_insert("a job thread panicked".to_string());
                continue;
            }
        };
        read.merge(&out.read);
        write.merge(&out.write);
        trim.merge(&out.trim);
        for (i, s) in out.series.iter().enumerate() {
            if series.len() <= i {
                series.push(Second::new());
            }
            series[i].merge(s);
        }
        for p in out.paths {
            match paths.iter_mut().find(|q| q.name == p.name) {
                Some(q) => {
                    q.ios += p.ios;
                    q.retries += p.retries;
                    q.failovers += p.failovers;
                    if q.failed.is_none() {
                        q.failed = p.failed;
                    }
                    if q.group.is_none() {
                        q.group = p.group;
                    }
                    if p.state.is_some() {
                        q.state = p.state;
                    }
                }
                None => paths.push(p),
            }
        }
        error_samples.extend(out.errors);
        counters.merge(&out.counters);
        for (code, n) in out.unit_attentions {
            *unit_attentions.entry(code).or_insert(0u64) += n;
        }
        verified_bytes += out.verified;
        elapsed = elapsed.max(took);
        first_finish = Some(first_finish.map_or(took, |f| f.min(took)));
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    error_samples.truncate(10);
    let usage_after = rusage();
    counters.usr = usage_after.0.saturating_sub(usage_before.0);
    counters.sys = usage_after.1.saturating_sub(usage_before.1);
    counters.ctx = usage_after.2.saturating_sub(usage_before.2);
    counters.majf = usage_after.3.saturating_sub(usage_before.3);
    counters.minf = usage_after.4.saturating_sub(usage_before.4);
    if !unit_attentions.is_empty() {
        let list: Vec<String> = unit_attentions
            .iter()
            .map(
                |(&(k, a, q), n)| match initiator::scsi::sense_meaning(k, a, q) {
                    Some(m) => format!("{n} x {k:x}/{a:02x}/{q:02x} ({m})"),
                    None => format!("{n} x {k:x}/{a:02x}/{q:02x}"),
                },
            )
            .collect();
        notes.push(format!(
            "UNIT ATTENTIONs and NOT READYs retried, as initiators do (a UNIT ATTENTION up to \
             8 times per I/O, a NOT READY for up to 30 s): {}",
            list.join(", ")
        ));
    }
    let learned = shared.learned.load(Ordering::Relaxed);
    Ok(RunResult {
        read,
        write,
        trim,
        elapsed,
        series,
        paths,
        error_samples,
        engine: engine_name,
        notes,
        verify_id: verify_id.or((spec.verify && learned != 0).then_some(learned)),
        verified_bytes,
        capacity: cap,
        first_finish: first_finish.unwrap_or(elapsed),
        counters,
    })
}

/// What the jobs of one run share for `--verify`.
struct VerifyShared {
    /// The run id writes stamp.
    write_id: Option<u64>,
    /// What reads expect.
    check: RunIdCheck,
    /// The id learned from the first block read (0: none yet).
    learned: AtomicU64,
    target_bs: u32,
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
    vshared: &VerifyShared,
) -> Result<(JobOut, Duration), String> {
    // Jobs are numbered across the nodes of a multi-node run.
    let (index, jobs) = spec.global_job(index);
    let mut wl = Workload::new(
        spec.rw,
        spec.rwmixread,
        spec.bs,
        spec.offset,
        region,
        spec.randseed,
        index,
        jobs,
    );
    let payload = Bytes::from(pattern(spec.bs as usize, spec.randseed ^ u64::from(index)));
    let depth = spec.iodepth as usize;
    let mut started: Vec<(Instant, Op, u64)> = vec![(Instant::now(), Op::Read, 0); depth];
    let mut free: Vec<usize> = (0..depth).rev().collect();
    let mut done: Vec<Done> = Vec::with_capacity(depth);
    let mut out = JobOut::new();
    let mut ids = vshared.check;
    let mut seq: u64 = u64::from(index) << 48;
    let byte_budget = byte_budget(spec, region, index, jobs);
    let mut issued: u64 = 0;
    barrier.wait();
    let t0 = Instant::now();
    if let Some(p) = progress {
        let _ = p.started.set(t0);
    }
    let measure_from = t0 + spec.ramp_time;
    let deadline = spec.runtime.map(|r| measure_from + r);
    let last_second = spec.runtime.map_or(usize::MAX, |r| {
        (r.as_nanos().div_ceil(1_000_000_000) as usize).max(1) - 1
    });
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
                let (op, offset) = wl.next_io();
                let stamped;
                let data = match vshared.write_id {
                    Some(id) if op == Op::Write => {
                        let mut v = vec![0u8; spec.bs as usize];
                        verify::stamp(&mut v, offset, id, seq);
                        seq += 1;
                        stamped = Bytes::from(v);
                        &stamped
                    }
                    _ => &payload,
                };
                started[slot] = (Instant::now(), op, offset);
                engine.submit(
                    Io {
                        op,
                        offset,
                        len: spec.bs,
                        slot,
                    },
                    data,
                )?;
                issued += u64::from(spec.bs);
                inflight += 1;
                out.counters.submits += 1;
                out.counters.depth[Counters::depth_bucket(inflight)] += 1;
            }
        }
        if inflight == 0 {
            break;
        }
        engine.reap(&mut done)?;
        out.counters.complete[Counters::batch_bucket(done.len())] += 1;
        let now = Instant::now();
        for d in done.drain(..) {
            inflight -= 1;
            free.push(d.slot);
            let (start, op, offset) = started[d.slot];
            if spec.verify && op == Op::Read && d.result.is_ok() {
                let data = d.data.as_deref().unwrap_or(&[]);
                verify_read(spec, vshared, data, offset, &mut ids)?;
                out.verified += u64::from(spec.bs);
            }
            if start < measure_from {
                continue;
            }
            let ns = now
                .duration_since(start)
                .as_nanos()
                .min(u128::from(u64::MAX)) as u64;
            // The I/Os still in flight at the deadline complete after it:
            // they count in the run's last second, not in a second of
            // their own.
            let sec = (now.duration_since(measure_from).as_secs() as usize).min(last_second);
            out.record(op, offset, spec.bs, d.result, ns, sec, progress);
        }
    }
    let took = Instant::now().saturating_duration_since(measure_from);
    out.paths = engine.path_stats();
    out.unit_attentions = engine.unit_attentions();
    Ok((out, took))
}

/// The bytes job `index` of `jobs` does without --runtime: together the
/// jobs (of every node) do the region's whole blocks once, job i of n the
/// blocks [b*i/n, b*(i+1)/n). With --runtime, no limit.
fn byte_budget(spec: &JobSpec, region: u64, index: u32, jobs: u32) -> u64 {
    if spec.runtime.is_some() {
        return u64::MAX;
    }
    let blocks = u128::from(region / u64::from(spec.bs));
    let share = |i: u32| blocks * u128::from(i) / u128::from(jobs);
    // At most `blocks`, which fits in u64.
    (share(index + 1) - share(index)) as u64 * u64::from(spec.bs)
}

/// --verify: checks a block read at `offset` (its stamp, and that every job
/// reads the same run's blocks).
fn verify_read(
    spec: &JobSpec,
    vshared: &VerifyShared,
    data: &[u8],
    offset: u64,
    ids: &mut RunIdCheck,
) -> Result<(), String> {
    if data.len() < spec.bs as usize {
        return Err(format!(
            "verify: the read at byte offset {offset} returned {} of {} bytes",
            data.len(),
            spec.bs
        ));
    }
    let before = *ids;
    verify::check(&data[..spec.bs as usize], offset, ids)
        .map_err(|m| m.describe(vshared.target_bs))?;
    if let (RunIdCheck::Learn(None), RunIdCheck::Learn(Some(id))) = (before, *ids) {
        // Every job must have read the same run's blocks.
        if let Err(other) =
            vshared
                .learned
                .compare_exchange(0, id, Ordering::Relaxed, Ordering::Relaxed)
        {
            if other != id {
                return Err(format!(
                    "verify failed at byte offset {offset}: blocks of two runs \
                     found, run id {other:#018x} and {id:#018x} (give --verify-id \
                     to say which is expected)"
                ));
            }
        }
    }
    Ok(())
}

impl JobOut {
    fn new() -> Self {
        JobOut {
            read: DirStats::new(),
            write: DirStats::new(),
            trim: DirStats::new(),
            series: Vec::new(),
            paths: Vec::new(),
            errors: Vec::new(),
            verified: 0,
            unit_attentions: Vec::new(),
            counters: Counters::default(),
        }
    }

    /// Counts one measured completion of `bs` bytes at `offset`, `ns` after
    /// it was submitted, in second `sec` of the run.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        op: Op,
        offset: u64,
        bs: u32,
        result: Result<(), String>,
        ns: u64,
        sec: usize,
        progress: Option<&Progress>,
    ) {
        let st = match op {
            Op::Read => &mut self.read,
            Op::Write => &mut self.write,
            Op::Trim => &mut self.trim,
        };
        match result {
            Ok(()) => {
                st.ios += 1;
                st.bytes += u64::from(bs);
                st.lat.saturating_record(ns.max(1));
                while self.series.len() <= sec {
                    self.series.push(Second::new());
                }
                let e = &mut self.series[sec];
                e.lat.saturating_record(ns.max(1));
                let (ios, bytes) = match op {
                    Op::Read => (&mut e.read_ios, &mut e.read_bytes),
                    Op::Write => (&mut e.write_ios, &mut e.write_bytes),
                    Op::Trim => (&mut e.trim_ios, &mut e.trim_bytes),
                };
                *ios += 1;
                *bytes += u64::from(bs);
                if let Some(p) = progress {
                    p.ios.fetch_add(1, Ordering::Relaxed);
                    p.bytes.fetch_add(u64::from(bs), Ordering::Relaxed);
                }
            }
            Err(e) => {
                st.errors += 1;
                if self.errors.len() < 10 {
                    let what = match op {
                        Op::Read => "read",
                        Op::Write => "write",
                        Op::Trim => "trim",
                    };
                    self.errors.push(format!("{what} at byte {offset}: {e}"));
                }
            }
        }
    }
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

impl Default for DirStats {
    fn default() -> DirStats {
        DirStats::new()
    }
}

impl Default for Second {
    fn default() -> Second {
        Second::new()
    }
}
