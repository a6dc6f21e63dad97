//! Client commands: `ls`, `inq` and `bench`.

use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bench::spec::{IoEngineKind, Multipath};
use bench::{JobSpec, Rw, TargetSpec};
use clap::Args;
use initiator::{scsi, Connection, DataDir, Url};

/// `ironsan ls`: discovery, and with `-s` the LUNs of every target.
#[derive(Args, Debug)]
pub struct LsArgs {
    /// iscsi://host[:port], or nvme-tcp://host[:port] (its discovery log)
    url: String,
    /// Also log in to each target and list its LUNs (NVMe/TCP: connect to
    /// each subsystem and list its namespaces) with their size.
    #[arg(short = 's', long)]
    show_luns: bool,
    /// Initiator name (NVMe/TCP: the host NQN when it is one).
    #[arg(long, default_value = initiator::DEFAULT_INITIATOR)]
    initiator: String,
}

/// `ironsan inq`: INQUIRY, identification and capacity of one LUN.
#[derive(Args, Debug)]
pub struct InqArgs {
    /// iscsi://host[:port]/iqn/lun, or nvme-tcp://host[:port]/subnqn/nsid
    url: String,
    /// Initiator name (NVMe/TCP: the host NQN when it is one, else a fresh
    /// one of the UUID form).
    #[arg(long, default_value = initiator::DEFAULT_INITIATOR)]
    initiator: String,
}

/// `ironsan bench`: fio-style workloads against iSCSI LUNs, files or block devices.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Targets: iscsi://host[:port]/iqn/lun (several with --multipath),
    /// nvme-tcp://host[:port]/subnqn/nsid[?digests], a file or a block device;
    /// or one fio job file (JOB.fio: a [global] section and one job section). With --client:
    /// the targets of every node without its own.
    #[arg(required_unless_present_any = ["server", "clients", "filename"])]
    pub(crate) targets: Vec<String>,
    /// fio's name for the targets: a file, a block device or iscsi://… (repeatable; ':'
    /// separates several, as in fio).
    #[arg(long, value_name = "PATH")]
    filename: Vec<String>,
    /// read, write, randread, randwrite, randrw or rw.
    #[arg(long, default_value = "randread")]
    rw: String,
    /// Percentage of reads for randrw/rw.
    #[arg(long, default_value_t = 50)]
    rwmixread: u8,
    /// Percentage of writes for randrw/rw (fio: 100 - rwmixread).
    #[arg(long, conflicts_with = "rwmixread")]
    rwmixwrite: Option<u8>,
    /// Block size (4k, 1m, 4096 ...).
    #[arg(long, default_value = "4k")]
    bs: String,
    /// I/Os in flight per job.
    #[arg(long, default_value_t = 32)]
    iodepth: u32,
    /// Parallel jobs (each with its own session or file handle).
    #[arg(long, default_value_t = 1)]
    numjobs: u32,
    /// Bytes of the target to use (default: all of it).
    #[arg(long)]
    size: Option<String>,
    /// Start offset in bytes.
    #[arg(long, default_value = "0")]
    offset: String,
    /// Run time (10, 10s, 1m, 500ms); without it, each job does --size bytes.
    #[arg(long)]
    runtime: Option<String>,
    /// Warm-up time before measuring.
    #[arg(long = "ramp_time", default_value = "0")]
    ramp_time: String,
    /// iSCSI targets: poll the socket this long (50us, 1ms) before sleeping while
    /// waiting for completions, like fio's hipri: costs a core, saves the wake-up per batch.
    #[arg(long = "busy-poll", value_name = "DURATION", default_value = "0")]
    busy_poll: String,
    /// Seed of the offset generator.
    #[arg(long, default_value_t = 0x1234_5678)]
    randseed: u64,
    /// O_DIRECT for files and block devices (fio's --direct=1; --direct alone means 1).
    #[arg(long, num_args = 0..=1, default_value = "0", default_missing_value = "1",
          value_parser = fio_bool, value_name = "0|1")]
    direct: bool,
    /// fio's time_based: with --runtime, run for that long, going over the region as often
    /// as it takes (what ironsan bench always does with --runtime).
    #[arg(long = "time_based", requires = "runtime")]
    time_based: bool,
    /// fio's group_reporting: one report for all --numjobs jobs (what ironsan bench always
    /// prints).
    #[arg(long = "group_reporting")]
    group_reporting: bool,
    /// fio's stonewall (also wait_for_previous): in a job file, this job starts when every
    /// job before it has finished, and begins a new group (its groupid).
    #[arg(long, alias = "wait_for_previous")]
    stonewall: bool,
    /// fio's write_bw_log: NAME_bw.1.log, per-second KiB/s per direction (log_avg_msec=1000).
    #[arg(long = "write_bw_log", value_name = "NAME")]
    write_bw_log: Option<String>,
    /// fio's write_iops_log: NAME_iops.1.log, per-second IOPS per direction.
    #[arg(long = "write_iops_log", value_name = "NAME")]
    write_iops_log: Option<String>,
    /// fio's write_lat_log: NAME_clat.1.log and NAME_lat.1.log, per-second mean latency in ns
    /// (jobs that only read or only write).
    #[arg(long = "write_lat_log", value_name = "NAME")]
    write_lat_log: Option<String>,
    /// fio's log_avg_msec: only 1000 (per-second averages) is supported.
    #[arg(long = "log_avg_msec", value_name = "MSEC", default_value_t = 1000)]
    log_avg_msec: u64,
    /// fio's percentile_list for the JSON (colon-separated, e.g. 50:99:99.9); default fio's 17.
    #[arg(long = "percentile_list", value_name = "P:P:...")]
    percentile_list: Option<String>,
    /// fio's output format: normal (text), json (as --json), json+ (with the latency
    /// histogram's bins) or terse (fio's version 3 line).
    #[arg(long = "output-format", value_name = "FORMAT")]
    output_format: Option<String>,
    /// Multipath policy over several URLs of one LU: rr, rr:N (switch path every N I/Os) or lqd (least queue depth).
    #[arg(long)]
    multipath: Option<String>,
    /// I/O engine for files and block devices: io_uring (default where the kernel allows) or psync; iscsi for URLs.
    #[arg(long, default_value = "auto")]
    ioengine: String,
    /// Writes stamp every 512-byte sector with a self-describing pattern (LBA, run id, sequence, CRC32C); reads check every sector and stop with a non-zero exit at the first mismatch.
    #[arg(long)]
    verify: bool,
    /// The run id to stamp (writes) or expect (reads), as printed by a --verify write pass.
    #[arg(long = "verify-id", value_name = "ID")]
    verify_id: Option<String>,
    /// Also draw IOPS and latency over time and the latency histogram into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<std::path::PathBuf>,
    /// Print fio-compatible JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// Job name in reports.
    #[arg(long, default_value = "ironsan")]
    name: String,
    /// Initiator name for iSCSI targets.
    #[arg(long, default_value = initiator::DEFAULT_INITIATOR)]
    initiator: String,
    /// Be a bench server on this machine, running the jobs a coordinator
    /// (`--client`) sends, one at a time (default address 127.0.0.1:9261; prints the
    /// address bound; port 0 picks one). Other bench options are the coordinator's.
    #[arg(long, value_name = "ADDR:PORT", num_args = 0..=1,
          default_missing_value = crate::multinode::DEFAULT_SERVER,
          conflicts_with = "clients", help_heading = "Multi-node")]
    pub(crate) server: Option<std::net::SocketAddr>,
    /// Run the job on this bench server (repeatable; port 9261 by default),
    /// start all together and merge the results. `=TARGET[,TARGET]` gives this node its
    /// own targets (else the job's TARGETS). Nodes on the same targets split them like
    /// --numjobs jobs do.
    #[arg(
        long = "client",
        value_name = "HOST[:PORT][=TARGET,..]",
        help_heading = "Multi-node"
    )]
    pub(crate) clients: Vec<String>,
    /// The shared token servers require and coordinators present. Visible
    /// in `ps`: prefer --token-file or IRONSAN_BENCH_TOKEN. Without any, a
    /// server generates one into bench.token in the state directory, which
    /// a coordinator on the same host reads.
    #[arg(long, value_name = "TOKEN", help_heading = "Multi-node")]
    pub(crate) token: Option<String>,
    /// A file whose first line is the shared token.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "token",
        help_heading = "Multi-node"
    )]
    pub(crate) token_file: Option<std::path::PathBuf>,
    /// (--server) Also accept jobs on files and block devices of this machine
    /// (default: iscsi:// targets only).
    #[arg(long, requires = "server", help_heading = "Multi-node")]
    pub(crate) allow_files: bool,
    /// (--client) Give up on a server silent for this long (connecting,
    /// hello, progress during the run).
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "10s",
        help_heading = "Multi-node"
    )]
    pub(crate) client_timeout: String,
}

/// Parses `10`, `10s`, `1m`, `500ms`, `1h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, mul_us) = if let Some(n) = t.strip_suffix("us") {
        (n, 1)
    } else if let Some(n) = t.strip_suffix("ms") {
        (n, 1000)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1_000_000)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60_000_000)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3_600_000_000)
    } else {
        (t, 1_000_000)
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("not a duration: {s:?} (try 10s, 1m, 500ms, 50us)"))?;
    Ok(Duration::from_micros(n.saturating_mul(mul_us)))
}

impl BenchArgs {
    /// JSON output (`--json` or `--output-format=json`).
    pub(crate) fn json_out(&self) -> bool {
        self.json || matches!(self.output_format.as_deref(), Some("json" | "json+"))
    }
}

/// The block device under a file or device target: its name and its
/// `stat` file in sysfs.
fn disk_of(p: &std::path::Path) -> Option<(String, std::path::PathBuf)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::metadata(p)
        .ok()
        .or_else(|| std::fs::metadata(p.parent()?).ok())?;
    let dev = if m.file_type().is_block_device() {
        m.rdev()
    } else {
        m.dev()
    };
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    let sys = std::path::PathBuf::from(format!("/sys/dev/block/{maj}:{min}"));
    let name = std::fs::canonicalize(&sys)
        .ok()?
        .file_name()?
        .to_string_lossy()
        .into_owned();
    Some((name, sys.join("stat")))
}

/// The counters of a sysfs block `stat` file.
fn disk_stat(p: &std::path::Path) -> Option<Vec<u64>> {
    let t = std::fs::read_to_string(p).ok()?;
    Some(
        t.split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect(),
    )
}

/// `--percentile_list` (fio's default 17 without it).
fn percentiles(a: &BenchArgs) -> Result<Vec<f64>> {
    let Some(l) = &a.percentile_list else {
        return Ok(bench::report::FIO_PERCENTILES.to_vec());
    };
    l.split(':')
        .map(|p| {
            p.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| *v > 0.0 && *v <= 100.0)
                .ok_or_else(|| {
                    anyhow::anyhow!("--percentile_list {l}: {p:?} is not a percentile in (0, 100]")
                })
        })
        .collect()
}

/// fio's booleans: 1/0, true/false, yes/no.
fn fio_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!("{s:?}: expected 1 or 0")),
    }
}

/// Options for one job of a fio job file, parsed like the command line.
#[derive(clap::Parser, Debug)]
#[command(no_binary_name = true)]
struct JobFileArgs {
    #[command(flatten)]
    a: BenchArgs,
}

/// A fio job file (`[global]` and job sections of `key=value` lines, `;`
/// and `#` comments) as command-line options, one list per job:
/// `key=value` becomes `--key=value`, a bare `key` `--key`; a job
/// section's name is its `--name`. Unknown keys are refused by name, as
/// on the command line.
pub fn job_file_args(text: &str) -> Result<Vec<Vec<String>>> {
    let mut global = Vec::new();
    let mut jobs: Vec<(String, Vec<String>)> = Vec::new();
    let mut section: Option<String> = None;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.trim().to_string();
            if name != "global" {
                jobs.push((name.clone(), Vec::new()));
            }
            section = Some(name);
            continue;
        }
        let Some(sec) = &section else {
            bail!("job file line {}: {line:?} is outside any [section]", n + 1);
        };
        let opt = match line.split_once('=') {
            Some((k, v)) => format!("--{}={}", k.trim(), v.trim()),
            None => format!("--{line}"),
        };
        if sec == "global" {
            global.push(opt);
        } else if let Some((_, o)) = jobs.last_mut() {
            o.push(opt);
        }
    }
    if jobs.is_empty() {
        bail!("the job file has no job section (only [global])");
    }
    Ok(jobs
        .into_iter()
        .map(|(name, opts)| {
            let mut argv = vec![format!("--name={name}")];
            argv.extend(global.iter().cloned());
            argv.extend(opts);
            argv
        })
        .collect())
}

/// `--verify-id`: hex with 0x, or decimal.
fn parse_id(s: &str) -> Result<u64> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| anyhow::anyhow!("--verify-id {s:?}: expected a number such as 0x1a2b3c"))
}

/// `--plot` must name a writable .svg file; checked before any I/O.
pub fn check_plot_path(p: &std::path::Path) -> Result<()> {
    if p.extension().and_then(|e| e.to_str()) != Some("svg") {
        bail!("--plot {}: the file name must end in .svg", p.display());
    }
    let dir = p
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if !dir.is_dir() {
        bail!("--plot {}: no directory {}", p.display(), dir.display());
    }
    Ok(())
}

pub fn size_arg(opt: &str, s: &str) -> Result<u64> {
    server::size::parse_size(s).map_err(|e| anyhow::anyhow!("{opt}: {e}"))
}

pub fn bench(a: BenchArgs) -> Result<()> {
    // `ironsan bench job.fio`: the job file's options, as if given here.
    if let [one] = a.targets.as_slice() {
        let p = std::path::Path::new(one);
        if p.extension().is_some_and(|e| e == "fio") && p.is_file() {
            let text = std::fs::read_to_string(p).with_context(|| one.clone())?;
            let mut jobs = Vec::new();
            for argv in job_file_args(&text).with_context(|| one.clone())? {
                let mut parsed = <JobFileArgs as clap::Parser>::try_parse_from(&argv)
                    .map_err(|e| anyhow::anyhow!("{one}: {}", e.to_string().trim()))?;
                // The report's form comes from the command line, as with fio.
                if a.output_format.is_some() {
                    parsed.a.output_format.clone_from(&a.output_format);
                }
                parsed.a.json |= a.json;
                jobs.push(parsed.a);
            }
            if jobs.len() == 1 {
                return bench(jobs.remove(0));
            }
            return run_jobs(jobs);
        }
    }
    if let Some(addr) = a.server {
        return crate::multinode::server(&a, addr);
    }
    let spec = build_spec(&a)?;
    if let Some(p) = &a.plot {
        check_plot_path(p)?;
    }
    if !a.clients.is_empty() {
        return crate::multinode::coordinator(&a, spec);
    }
    spec.validate().map_err(anyhow::Error::msg)?;
    run_local(&a, &spec)
}

/// The job the options describe (not yet validated: a multi-node job's
/// targets may come from the --client options).
fn build_spec(a: &BenchArgs) -> Result<JobSpec> {
    if let Some(f) = a.output_format.as_deref() {
        if !matches!(f, "normal" | "json" | "json+" | "terse") {
            bail!("--output-format={f}: expected normal, json, json+ or terse");
        }
    }
    if a.log_avg_msec != 1000 {
        bail!(
            "--log_avg_msec={}: only 1000 is supported (logs are per-second averages)",
            a.log_avg_msec
        );
    }
    percentiles(a)?;
    let filenames = a.filename.iter().flat_map(|f| {
        // fio separates several files with ':' (iscsi://host:port/… keeps its own).
        if f.starts_with("iscsi://") {
            vec![f.clone()]
        } else {
            f.split(':')
                .filter(|x| !x.is_empty())
                .map(str::to_string)
                .collect()
        }
    });
    let targets = a
        .targets
        .iter()
        .cloned()
        .chain(filenames)
        .map(|t| TargetSpec::parse(&t))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let bs = size_arg("--bs", &a.bs)?;
    Ok(JobSpec {
        name: a.name.clone(),
        targets,
        rw: Rw::parse(&a.rw).map_err(anyhow::Error::msg)?,
        rwmixread: match a.rwmixwrite {
            Some(w) if w > 100 => bail!("--rwmixwrite {w}: 0..=100"),
            Some(w) => 100 - w,
            None => a.rwmixread,
        },
        bs: u32::try_from(bs).map_err(|_| anyhow::anyhow!("--bs {bs}: too large"))?,
        iodepth: a.iodepth,
        numjobs: a.numjobs,
        size: a
            .size
            .as_deref()
            .map(|s| size_arg("--size", s))
            .transpose()?,
        offset: size_arg("--offset", &a.offset)?,
        runtime: a
            .runtime
            .as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--runtime: {e}"))?,
        ramp_time: parse_duration(&a.ramp_time).map_err(|e| anyhow::anyhow!("--ramp_time: {e}"))?,
        randseed: a.randseed,
        direct: a.direct,
        create: true,
        initiator: a.initiator.clone(),
        multipath: a
            .multipath
            .as_deref()
            .map(Multipath::parse)
            .transpose()
            .map_err(anyhow::Error::msg)?,
        ioengine: IoEngineKind::parse(&a.ioengine).map_err(anyhow::Error::msg)?,
        verify: a.verify,
        verify_id: a.verify_id.as_deref().map(parse_id).transpose()?,
        share: Default::default(),
        busy_poll: parse_duration(&a.busy_poll).map_err(|e| anyhow::anyhow!("--busy-poll: {e}"))?,
    })
}

fn run_local(a: &BenchArgs, spec: &JobSpec) -> Result<()> {
    let done = collect(a, spec, true)?;
    let doc = report(a, spec, &done)?;
    if let Some(v) = doc {
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    let r = &done.0;
    if r.errors() > 0 {
        match r.error_samples.first() {
            Some(first) => bail!("{} I/O errors, first: {first}", r.errors()),
            None => bail!("{} I/O errors", r.errors()),
        }
    }
    Ok(())
}

/// A finished run and the disk_util entries of its devices.
type Collected = (bench::RunResult, Vec<serde_json::Value>);

/// Runs the job (with a live progress line when `ticker` and stderr is a
/// terminal) and measures the block devices under it.
fn collect(a: &BenchArgs, spec: &JobSpec, ticker: bool) -> Result<Collected> {
    let progress = Arc::new(bench::run::Progress::default());
    let live = ticker && std::io::stderr().is_terminal() && !a.json_out();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ticker = live.then(|| {
        let (p, stop, total) = (progress.clone(), stop.clone(), spec.runtime);
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            let (mut last_ios, mut last_bytes) = (0, 0);
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(1));
                let (ios, bytes) = (
                    p.ios.load(Ordering::Relaxed),
                    p.bytes.load(Ordering::Relaxed),
                );
                let eta = total.map_or(String::new(), |t| {
                    format!(", ETA {}s", t.saturating_sub(start.elapsed()).as_secs())
                });
                eprint!(
                    "\r  {} IOPS, {:.1} MB/s{eta}        ",
                    ios - last_ios,
                    (bytes - last_bytes) as f64 / 1e6
                );
                (last_ios, last_bytes) = (ios, bytes);
            }
            eprint!("\r{:60}\r", "");
        })
    });
    // fio's disk_util: the block devices under file and device targets.
    let disks: Vec<(String, std::path::PathBuf)> = spec
        .targets
        .iter()
        .filter_map(|t| match t {
            TargetSpec::File(p) => disk_of(p),
            TargetSpec::Iscsi(_) | TargetSpec::Nvme(_) => None,
        })
        .collect();
    let before: Vec<Option<Vec<u64>>> = disks.iter().map(|(_, s)| disk_stat(s)).collect();
    let t0 = std::time::Instant::now();
    let r = bench::run(spec, Some(progress));
    let wall_ms = t0.elapsed().as_millis() as u64;
    let disk_util: Vec<serde_json::Value> = disks
        .iter()
        .zip(&before)
        .filter_map(|((name, stat), b)| {
            let (b, a) = (b.as_ref()?, disk_stat(stat)?);
            let d = |i: usize| {
                a.get(i)
                    .zip(b.get(i))
                    .map_or(0, |(x, y)| x.saturating_sub(*y))
            };
            // /sys/block/<dev>/stat (Documentation/block/stat.rst): 0 read
            // I/Os, 1 read merges, 3 read ticks, 4 write I/Os, 5 write
            // merges, 7 write ticks, 9 io_ticks, 10 time in queue (ms).
            Some(serde_json::json!({
                "name": name,
                "read_ios": d(0), "write_ios": d(4),
                "read_merges": d(1), "write_merges": d(5),
                "read_ticks": d(3), "write_ticks": d(7),
                "in_queue": d(10),
                "util": (d(9) as f64 * 100.0 / wall_ms.max(1) as f64).min(100.0),
            }))
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = ticker {
        let _ = t.join();
    }
    Ok((r.map_err(anyhow::Error::msg)?, disk_util))
}

/// Prints the notes, writes the plot and logs, prints the text report or
/// returns the JSON document.
fn report(a: &BenchArgs, spec: &JobSpec, done: &Collected) -> Result<Option<serde_json::Value>> {
    let (r, disk_util) = (&done.0, &done.1);
    for n in &r.notes {
        eprintln!("ironsan: note: {n}");
    }
    if let Some(p) = &a.plot {
        std::fs::write(p, bench::plot::svg(spec, r))
            .with_context(|| format!("--plot {}", p.display()))?;
    }
    if a.write_lat_log.is_some() && r.read.ios > 0 && r.write.ios > 0 {
        eprintln!(
            "ironsan: note: --write_lat_log: per-direction latency is not kept per second; the mixed job's lat logs give both directions' mean"
        );
    }
    bench::report::write_logs(
        r,
        a.write_bw_log.as_deref(),
        a.write_iops_log.as_deref(),
        a.write_lat_log.as_deref(),
    )
    .context("writing the logs")?;
    if a.json_out() {
        let mut v = bench::report::json_with(
            spec,
            r,
            a.output_format.as_deref() == Some("json+"),
            &percentiles(a)?,
        );
        v["disk_util"] = serde_json::Value::Array(disk_util.clone());
        return Ok(Some(v));
    }
    if a.output_format.as_deref() == Some("terse") {
        print!(
            "{}",
            bench::report::terse(spec, r, disk_util.first(), &percentiles(a)?)
        );
        return Ok(None);
    }
    print!("{}", bench::report::text(spec, r));
    Ok(None)
}

/// Group ids of a job file's jobs: a job with `stonewall` begins a new
/// group (fio's rule; the first job is group 0 either way).
fn group_ids(stonewalls: &[bool]) -> Vec<u32> {
    let mut g = 0;
    stonewalls
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            if s && i > 0 {
                g += 1;
            }
            g
        })
        .collect()
}

/// The jobs of a fio job file, run as fio runs them: at once, except that
/// a `stonewall` job waits for every job before it (each group runs after
/// the one before); their reports in the file's order (one JSON document
/// with every job, each with its groupid).
fn run_jobs(jobs: Vec<BenchArgs>) -> Result<()> {
    let mut specs = Vec::new();
    for a in &jobs {
        if a.server.is_some() || !a.clients.is_empty() {
            bail!("a job file with several jobs runs on this machine only");
        }
        let spec = build_spec(a)?;
        spec.validate().map_err(anyhow::Error::msg)?;
        specs.push(spec);
    }
    let groups = group_ids(&jobs.iter().map(|a| a.stonewall).collect::<Vec<_>>());
    let mut results: Vec<Result<Collected>> = Vec::new();
    let mut from = 0;
    while from < jobs.len() {
        let to = (from..jobs.len())
            .find(|&i| groups[i] != groups[from])
            .unwrap_or(jobs.len());
        results.extend(std::thread::scope(|sc| {
            let hs: Vec<_> = jobs[from..to]
                .iter()
                .zip(&specs[from..to])
                .map(|(a, s)| sc.spawn(move || collect(a, s, false)))
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a job panicked")))
                })
                .collect::<Vec<_>>()
        }));
        from = to;
    }
    let mut doc: Option<serde_json::Value> = None;
    let mut errors = 0;
    for (((a, spec), r), group) in jobs.iter().zip(&specs).zip(results).zip(&groups) {
        let done = r.with_context(|| format!("job {}", spec.name))?;
        errors += done.0.errors();
        if let Some(mut v) = report(a, spec, &done)? {
            v["jobs"][0]["groupid"] = (*group).into();
            match &mut doc {
                None => doc = Some(v),
                Some(d) => {
                    let job = v["jobs"][0].clone();
                    if let Some(j) = d["jobs"].as_array_mut() {
                        j.push(job);
                    }
                    if let (Some(du), Some(more)) =
                        (d["disk_util"].as_array_mut(), v["disk_util"].as_array())
                    {
                        for x in more {
                            if !du.iter().any(|y| y["name"] == x["name"]) {
                                du.push(x.clone());
                            }
                        }
                    }
                }
            }
        }
    }
    if let Some(d) = doc {
        println!("{}", serde_json::to_string_pretty(&d)?);
    }
    if errors > 0 {
        bail!("{errors} I/O errors");
    }
    Ok(())
}

/// The host NQN of `ironsan ls/inq` over NVMe/TCP: `--initiator` when it
/// is an NQN, else a fresh one of the UUID form.
fn nvme_host(initiator: &str) -> String {
    if initiator.starts_with("nqn.") {
        initiator.to_owned()
    } else {
        initiator::nvme::host_nqn(&initiator::random_bytes::<16>())
    }
}

/// `ironsan ls nvme-tcp://HOST[:PORT]`: the discovery log page, and with
/// `-s` every namespace of every subsystem listed.
fn ls_nvme(a: &LsArgs) -> Result<()> {
    use initiator::nvme::{discover, Controller};
    let addr = initiator::nvme::portal_of(&a.url).map_err(anyhow::Error::msg)?;
    let host = nvme_host(&a.initiator);
    let entries = discover(addr, &host).with_context(|| format!("discovery at {addr}"))?;
    let mut seen = Vec::new();
    for e in entries.iter().filter(|e| e.subtype == 2) {
        println!(
            "Subsystem:{} Port:{}:{} (port {})",
            e.subnqn, e.traddr, e.trsvcid, e.port_id
        );
        if seen.contains(&e.subnqn) {
            continue;
        }
        seen.push(e.subnqn.clone());
        if a.show_luns {
            let mut c = Controller::connect(addr, &e.subnqn, &host, (false, false), 1)
                .with_context(|| format!("connect to {}", e.subnqn))?;
            for nsid in c.active_namespaces()? {
                let ns = c.namespace(nsid)?;
                println!(
                    "  Namespace:{nsid} ({} bytes, {}-byte blocks) NGUID {}",
                    ns.blocks * u64::from(ns.block_size),
                    ns.block_size,
                    hex(&ns.nguid)
                );
            }
        }
    }
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `ironsan inq nvme-tcp://HOST[:PORT]/SUBNQN/NSID`: Identify Controller
/// and Namespace, the namespace's designators and its ANA state through
/// this port.
fn inq_nvme(a: &InqArgs) -> Result<()> {
    use initiator::nvme::{sqe, Controller, NvmeUrl};
    let u = NvmeUrl::parse(&a.url).map_err(anyhow::Error::msg)?;
    let host = nvme_host(&a.initiator);
    let mut c = Controller::connect(u.addr, &u.subnqn, &host, u.digests, 1)
        .with_context(|| format!("connect to {}", u.subnqn))?;
    let id = c
        .admin
        .call(sqe(0x06, 0, &[(10, 1)]), bytes::Bytes::new(), 4096)?;
    id.ok()?;
    let d = &id.data;
    let text = |r: std::ops::Range<usize>| {
        String::from_utf8_lossy(&d[r])
            .trim_end_matches(['\0', ' '])
            .to_string()
    };
    let ver = u32::from_le_bytes(d[80..84].try_into().expect("4 bytes"));
    println!("Model: {}", text(24..64));
    println!("Serial number: {}", text(4..24));
    println!("Firmware: {}", text(64..72));
    println!("Subsystem: {}", text(768..1024));
    println!(
        "Controller: {} (NVMe {}.{}.{})",
        c.cntlid,
        ver >> 16,
        (ver >> 8) & 0xff,
        ver & 0xff
    );
    let ns = c.namespace(u.nsid).map_err(|e| {
        anyhow::anyhow!(
            "{}: {e} (`ironsan ls -s nvme-tcp://{}` lists the namespaces)",
            a.url,
            u.addr
        )
    })?;
    println!("Namespace: {}", u.nsid);
    println!(
        "Capacity: {} bytes ({} blocks of {} bytes)",
        ns.blocks * u64::from(ns.block_size),
        ns.blocks,
        ns.block_size
    );
    println!("NGUID: {}", hex(&ns.nguid));
    let descs = c
        .admin
        .call(sqe(0x06, u.nsid, &[(10, 3)]), bytes::Bytes::new(), 4096)?;
    if descs.ok().is_ok() {
        let b = &descs.data;
        let mut at = 0;
        while at + 4 <= b.len() && b[at] != 0 {
            let len = usize::from(b[at + 1]);
            if at + 4 + len > b.len() {
                break;
            }
            if b[at] == 3 && len == 16 {
                let h = hex(&b[at + 4..at + 20]);
                println!(
                    "UUID: {}-{}-{}-{}-{}",
                    &h[0..8],
                    &h[8..12],
                    &h[12..16],
                    &h[16..20],
                    &h[20..32]
                );
            }
            at += 4 + len;
        }
    }
    // ANA (CMIC bit 3): the state of each group through this port.
    if d[76] & 0x08 != 0 {
        let numd = 4096 / 4 - 1;
        let r = c.admin.call(
            sqe(0x02, 0xffff_ffff, &[(10, 0x0c | (numd << 16))]),
            bytes::Bytes::new(),
            4096,
        )?;
        if r.ok().is_ok() && r.data.len() >= 16 {
            let b = &r.data;
            let groups = u16::from_le_bytes([b[8], b[9]]);
            let mut at = 16;
            for _ in 0..groups {
                if at + 32 > b.len() {
                    break;
                }
                let g = u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
                let n = u32::from_le_bytes(b[at + 4..at + 8].try_into().expect("4 bytes"));
                let state = match b[at + 16] & 0x0f {
                    1 => "optimized",
                    2 => "non-optimized",
                    3 => "inaccessible",
                    4 => "persistent loss",
                    0xf => "change",
                    _ => "reserved",
                };
                println!("ANA group {g}: {state} through this port");
                at += 32 + 4 * n as usize;
            }
        }
    }
    Ok(())
}

pub fn ls(a: LsArgs) -> Result<()> {
    if a.url.starts_with("nvme-tcp://") {
        return ls_nvme(&a);
    }
    let url: Url = a.url.parse().map_err(anyhow::Error::msg)?;
    let targets = initiator::discover_with(&url.addr(), url.login_config(&a.initiator, None))
        .with_context(|| format!("discovery at {}", url.addr()))?;
    for (name, portals) in targets {
        for p in &portals {
            println!("Target:{name} Portal:{p}");
        }
        if portals.is_empty() {
            println!("Target:{name}");
        }
        if a.show_luns {
            let cfg = url.login_config(&a.initiator, Some(&name));
            let mut c =
                Connection::login(&url.addr(), cfg).with_context(|| format!("login to {name}"))?;
            let r = c.execute(0, &scsi::report_luns(4096), DataDir::Read(4096))?;
            for lun in scsi::parse_report_luns(&r.data) {
                let _ = c.execute(lun, &scsi::test_unit_ready(), DataDir::None);
                let inq = c.execute(lun, &scsi::inquiry(None, 96), DataDir::Read(96))?;
                let cap = c.execute(lun, &scsi::read_capacity16(), DataDir::Read(32))?;
                let kind = scsi::parse_inquiry(&inq.data)
                    .map_or("?".to_string(), |(t, v, p, _)| format!("type {t} {v} {p}"));
                let size = scsi::parse_capacity16(&cap.data).map_or("?".to_string(), |(n, bs)| {
                    format!("{} bytes, {bs}-byte blocks", n * u64::from(bs))
                });
                println!("  Lun:{lun} {kind} ({size})");
            }
            let _ = c.logout();
        }
    }
    Ok(())
}

pub fn inq(a: InqArgs) -> Result<()> {
    if a.url.starts_with("nvme-tcp://") {
        return inq_nvme(&a);
    }
    let url: Url = a.url.parse().map_err(anyhow::Error::msg)?;
    let Some(target) = url.target.clone() else {
        bail!(
            "{}: the URL must name a target (iscsi://host/iqn/lun)",
            a.url
        )
    };
    let lun = url.lun.unwrap_or(0);
    let cfg = url.login_config(&a.initiator, Some(&target));
    let mut c =
        Connection::login(&url.addr(), cfg).with_context(|| format!("login to {target}"))?;
    let _ = c.execute(lun, &scsi::test_unit_ready(), DataDir::None);
    let inq = c.execute(lun, &scsi::inquiry(None, 255), DataDir::Read(255))?;
    // Peripheral qualifier 011b: no logical unit at this LUN (SPC-4 §6.6.2).
    if inq.status != Some(0) || inq.data.first().is_none_or(|b| b >> 5 == 3) {
        let _ = c.logout();
        bail!(
            "{}: the target has no LUN {lun} (`ironsan ls` lists its LUNs)",
            a.url
        );
    }
    if let Some((t, v, p, r)) = scsi::parse_inquiry(&inq.data) {
        println!("Peripheral device type: {t}\nVendor: {v}\nProduct: {p}\nRevision: {r}");
    }
    let sn = c.execute(lun, &scsi::inquiry(Some(0x80), 255), DataDir::Read(255))?;
    if sn.status == Some(0) && sn.data.len() > 4 {
        println!(
            "Unit serial number: {}",
            String::from_utf8_lossy(&sn.data[4..]).trim()
        );
    }
    let id = c.execute(lun, &scsi::inquiry(Some(0x83), 1024), DataDir::Read(1024))?;
    if let Some(naa) = scsi::naa_id(&id.data) {
        println!("Device identifier: {naa}");
    }
    let cap = c.execute(lun, &scsi::read_capacity16(), DataDir::Read(32))?;
    match scsi::parse_capacity16(&cap.data) {
        Some((n, bs)) if cap.status == Some(0) => println!(
            "Capacity: {} bytes ({n} blocks of {bs} bytes)",
            n * u64::from(bs)
        ),
        // Not ready (storage still opening), or another refusal: say which.
        _ => {
            let why = scsi::sense_code(&cap.sense).map_or_else(
                || format!("status {:?}", cap.status),
                |(k, asc, ascq)| {
                    let code = format!("sense {k:x}/{asc:02x}/{ascq:02x}");
                    match scsi::sense_meaning(k, asc, ascq) {
                        Some(m) => format!("{m} ({code})"),
                        None => code,
                    }
                },
            );
            println!("Capacity: not reported: {why}");
        }
    }
    if let Some(t) = c.tpgt {
        println!("Target portal group: {t}");
    }
    let tpgs = scsi::tpgs(&inq.data);
    if tpgs != 0 {
        let (group, port) = scsi::target_port_ids(&id.data);
        let mode = match tpgs {
            1 => "implicit",
            2 => "explicit",
            _ => "implicit and explicit",
        };
        let here = match (group, port) {
            (Some(g), Some(p)) => format!(", this path: group {g}, relative port {p}"),
            _ => String::new(),
        };
        println!("ALUA: {mode}{here}");
        let r = c.execute(
            lun,
            &scsi::report_target_port_groups(4096),
            DataDir::Read(4096),
        )?;
        if r.status == Some(0) {
            if let Ok(groups) = scsi::parse_rtpg(&r.data) {
                for g in groups {
                    let ports: Vec<String> = g.ports.iter().map(u16::to_string).collect();
                    println!(
                        "  group {}: {}{} (ports {})",
                        g.id,
                        g.state.name(),
                        if g.preferred { ", preferred" } else { "" },
                        ports.join(", ")
                    );
                }
            }
        }
    }
    let _ = c.logout();
    Ok(())
}
