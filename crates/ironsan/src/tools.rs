//! `ironsan cdm` (CrystalDiskMark's tests) and `ironsan gpfsperf`
//! (Spectrum Scale's gpfsperf command line and report).

use anyhow::{bail, Context, Result};
use bench::cdm::{self, Options, Profile};
use bench::spec::{IoEngineKind, Multipath};
use bench::{JobSpec, Rw, TargetSpec};
use clap::Args;
use std::time::Duration;

use crate::client::{parse_duration, size_arg};

/// `ironsan cdm`: CrystalDiskMark's table of read and write MB/s and IOPS.
#[derive(Args, Debug)]
pub struct CdmArgs {
    /// iscsi://host[:port]/iqn/lun (several with --multipath),
    /// nvme-tcp://host[:port]/subnqn/nsid, a file or a block device. Its test area is overwritten.
    #[arg(required = true)]
    targets: Vec<String>,
    /// cdm8 (SEQ1M Q8T1, SEQ1M Q1T1, RND4K Q32T1, RND4K Q1T1), cdm6 (Seq 128K Q32T1, 4KiB Q8T8, 4KiB Q32T1, 4KiB Q1T1) or nvme (SEQ1M Q8T1, SEQ128K Q32T1, RND4K Q32T16, RND4K Q1T1).
    #[arg(long, default_value = "cdm8")]
    profile: String,
    /// Passes per test and direction; the best is shown (CrystalDiskMark's "count").
    #[arg(long, default_value_t = 5)]
    passes: u32,
    /// Measuring time of each pass.
    #[arg(long, default_value = "5s")]
    duration: String,
    /// Test area from the start of the target.
    #[arg(long, default_value = "1G")]
    size: String,
    /// Pause before each pass (CrystalDiskMark's "interval"; it uses 5s).
    #[arg(long, default_value = "0")]
    interval: String,
    /// Only the read tests (nothing is written).
    #[arg(long)]
    read_only: bool,
    /// Do not write the test area once before measuring.
    #[arg(long)]
    no_prepare: bool,
    /// Multipath policy over several URLs of one LU: rr, rr:N or lqd.
    #[arg(long)]
    multipath: Option<String>,
    /// I/O engine for files and block devices: io_uring or psync.
    #[arg(long, default_value = "auto")]
    ioengine: String,
    /// O_DIRECT for files and block devices.
    #[arg(long)]
    direct: bool,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Initiator name for iSCSI targets.
    #[arg(long, default_value = initiator::DEFAULT_INITIATOR)]
    initiator: String,
}

pub fn cdm(a: CdmArgs) -> Result<()> {
    let targets = a
        .targets
        .iter()
        .map(|t| TargetSpec::parse(t))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let o = Options {
        profile: Profile::parse(&a.profile).map_err(anyhow::Error::msg)?,
        passes: a.passes,
        duration: parse_duration(&a.duration).map_err(|e| anyhow::anyhow!("--duration: {e}"))?,
        size: size_arg("--size", &a.size)?,
        interval: parse_duration(&a.interval).map_err(|e| anyhow::anyhow!("--interval: {e}"))?,
        read_only: a.read_only,
        prepare: !a.no_prepare,
    };
    o.validate().map_err(anyhow::Error::msg)?;
    let base = JobSpec {
        name: "cdm".into(),
        targets,
        rw: Rw::Read,
        rwmixread: 50,
        bs: 4096,
        iodepth: 1,
        numjobs: 1,
        size: Some(o.size),
        offset: 0,
        runtime: Some(o.duration),
        ramp_time: Duration::ZERO,
        randseed: 0x1234_5678,
        direct: a.direct,
        create: true,
        initiator: a.initiator,
        multipath: a
            .multipath
            .as_deref()
            .map(Multipath::parse)
            .transpose()
            .map_err(anyhow::Error::msg)?,
        ioengine: IoEngineKind::parse(&a.ioengine).map_err(anyhow::Error::msg)?,
        verify: false,
        verify_id: None,
        share: Default::default(),
        busy_poll: std::time::Duration::ZERO,
    };
    cdm::validate(&base, &o).map_err(anyhow::Error::msg)?;
    let name = a.targets.join(" ");
    // Progress on stderr (the report goes to stdout at the end, in
    // CrystalDiskMark's layout: [Read] then [Write]).
    let tests = o.profile.tests().len() as u32;
    let per_test = o.passes * if o.read_only { 1 } else { 2 };
    let mut step = 0u32;
    let rows = cdm::run_profile(&base, &o, |what| {
        if !what.starts_with("preparing") {
            step += 1;
        }
        eprintln!("ironsan cdm: [{step}/{}] {what}", tests * per_test);
    })
    .map_err(anyhow::Error::msg)?;
    if !a.json {
        print!("{}", cdm::export(&name, &o, &rows));
    }
    let json = a.json;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&cdm::json(&name, &o, &rows))?
        );
    }
    Ok(())
}

/// `ironsan gpfsperf`: gpfsperf's command line and report.
#[derive(Args, Debug)]
#[command(disable_help_flag = true)]
pub struct GpfsperfArgs {
    /// create|read|write|mixrw seq|rand TARGET [-r RECSIZE] [-n BYTES] [-th THREADS] [-readratio PERCENT] [-dio]
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    args: Vec<String>,
    /// Initiator name for iSCSI targets.
    #[arg(long, default_value = initiator::DEFAULT_INITIATOR)]
    initiator: String,
}

/// Writes back and drops the page cache of `path` (a file or block
/// device).
fn drop_page_cache(path: &std::path::Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
    let _ = f.sync_all();
    // SAFETY: the descriptor is open for the call; offset 0 and length 0
    // cover the whole file.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        bail!(
            "{}: dropping its page cache: {}",
            path.display(),
            std::io::Error::from_raw_os_error(r)
        );
    }
    Ok(())
}

pub fn gpfsperf(a: GpfsperfArgs) -> Result<()> {
    if a.args.is_empty() || a.args.iter().any(|x| x == "-h" || x == "--help") {
        println!("{}", bench::gpfsperf::USAGE);
        if a.args.is_empty() {
            bail!("no arguments");
        }
        return Ok(());
    }
    let g = bench::gpfsperf::parse(&a.args).map_err(anyhow::Error::msg)?;
    let spec = g.job(&a.initiator).map_err(anyhow::Error::msg)?;
    // gpfsperf measures the file system, not this host's page cache: a
    // read of a file without -dio starts from a cold cache (what fio's
    // invalidate=1 does).
    let reads = matches!(g.op, bench::gpfsperf::Op::Read | bench::gpfsperf::Op::MixRw);
    let dropped = (reads && !g.dio && !g.target.starts_with("iscsi://"))
        .then(|| drop_page_cache(std::path::Path::new(&g.target)))
        .transpose()?
        .is_some();
    let r = bench::run(&spec, None).map_err(anyhow::Error::msg)?;
    if dropped {
        eprintln!(
            "ironsan: note: {}'s page cache was dropped before the run (posix_fadvise DONTNEED), so reads start from the medium; -dio bypasses the cache throughout",
            g.target
        );
    }
    for n in &r.notes {
        eprintln!("ironsan: note: {n}");
    }
    print!("{}", bench::gpfsperf::report(&g, &spec, &r, r.capacity));
    if r.errors() > 0 {
        for e in &r.error_samples {
            eprintln!("ironsan: error: {e}");
        }
        bail!("{} I/O errors", r.errors());
    }
    Ok(())
}
