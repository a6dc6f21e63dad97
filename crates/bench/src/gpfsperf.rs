//! `ironsan gpfsperf`: IBM Spectrum Scale's `gpfsperf` sample benchmark,
//! with its command line (single-dash options as gpfsperf spells them)
//! and its report, against files, block devices and iSCSI LUNs.
//!
//! ```text
//! ironsan gpfsperf create|read|write|mixrw seq|rand TARGET
//!         [-r RECSIZE] [-n BYTES] [-th THREADS] [-readratio PERCENT] [-dio]
//! ```
//!
//! Each of the `-th` threads does one record at a time (gpfsperf's threads
//! are synchronous); together they transfer `-n` bytes (default: the whole
//! file or LUN) in records of `-r` bytes. `create` makes a file of `-n`
//! bytes (on a LUN it writes them), `mixrw` reads `-readratio` percent of
//! the records and writes the rest. The report ends with gpfsperf's line:
//! data rate (Kbytes/sec, 1024 bytes), op rate, average latency.

use std::time::Duration;

use crate::run::RunResult;
use crate::spec::{IoEngineKind, JobSpec, Rw, TargetSpec};

/// gpfsperf's operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Create,
    Read,
    Write,
    MixRw,
}

/// The parsed command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args {
    pub op: Op,
    pub random: bool,
    pub target: String,
    pub rec: u64,
    pub n: Option<u64>,
    pub threads: u32,
    pub readratio: u8,
    pub dio: bool,
}

/// The usage text.
pub const USAGE: &str = "usage: ironsan gpfsperf create|read|write|mixrw seq|rand TARGET \
[-r RECSIZE] [-n BYTES] [-th THREADS] [-readratio PERCENT] [-dio]
  TARGET       a file, a block device or iscsi://host[:port]/iqn/lun
  -r RECSIZE   record size (default 256K; suffixes k, m, g are powers of 1024)
  -n BYTES     bytes to transfer (default: the size of the file or LUN; create needs it for a new file)
  -th THREADS  threads, each doing one record at a time (default 1)
  -readratio P percent of records read by mixrw (default 50)
  -dio         O_DIRECT for files and block devices";

/// Parses `64k`, `1m`, `3072M`, `1g`, `4096` (powers of 1024, as
/// gpfsperf's `-r` and `-n` take them; the `parse-size` crate's binary
/// units, as `server::size`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .map_err(|e| format!("{s:?} is not a size ({e}; try 4096, 64k, 1m, 3g)"))
}

fn value<'a>(it: &mut impl Iterator<Item = &'a String>, opt: &str) -> Result<&'a String, String> {
    it.next()
        .ok_or_else(|| format!("{opt} needs a value\n{USAGE}"))
}

/// Parses gpfsperf's command line (after `gpfsperf`).
pub fn parse(args: &[String]) -> Result<Args, String> {
    let mut pos = Vec::new();
    let mut a = Args {
        op: Op::Read,
        random: false,
        target: String::new(),
        rec: 256 << 10,
        n: None,
        threads: 1,
        readratio: 50,
        dio: false,
    };
    let mut it = args.iter();
    let mut ratio_given = false;
    while let Some(x) = it.next() {
        match x.as_str() {
            "-r" => {
                let v = value(&mut it, "-r")?;
                a.rec = parse_size(v).map_err(|e| format!("-r: {e}"))?;
            }
            "-n" => {
                let v = value(&mut it, "-n")?;
                a.n = Some(parse_size(v).map_err(|e| format!("-n: {e}"))?);
            }
            "-th" => {
                let v = value(&mut it, "-th")?;
                a.threads = v
                    .parse()
                    .map_err(|_| format!("-th {v:?}: expected a number of threads"))?;
            }
            "-readratio" => {
                let v = value(&mut it, "-readratio")?;
                a.readratio = v
                    .parse()
                    .map_err(|_| format!("-readratio {v:?}: expected a percentage 0..=100"))?;
                ratio_given = true;
            }
            "-dio" => a.dio = true,
            s if s.starts_with('-') && s.len() > 1 => {
                return Err(format!("unknown option {s}\n{USAGE}"))
            }
            _ => pos.push(x.clone()),
        }
    }
    let [op, pattern, target] = pos.as_slice() else {
        return Err(format!(
            "expected an operation, a pattern and a target, got {} arguments\n{USAGE}",
            pos.len()
        ));
    };
    a.op = match op.as_str() {
        "create" => Op::Create,
        "read" => Op::Read,
        "write" => Op::Write,
        "mixrw" => Op::MixRw,
        _ => {
            return Err(format!(
                "operation {op:?}: expected create, read, write or mixrw\n{USAGE}"
            ))
        }
    };
    a.random = match pattern.as_str() {
        "seq" => false,
        "rand" => true,
        _ => {
            return Err(format!(
                "pattern {pattern:?}: expected seq or rand\n{USAGE}"
            ))
        }
    };
    a.target = target.clone();
    if a.rec == 0 || !a.rec.is_multiple_of(512) || a.rec > 64 << 20 {
        return Err(format!(
            "-r {}: the record size must be a multiple of 512 up to 64M",
            a.rec
        ));
    }
    if !(1..=1024).contains(&a.threads) {
        return Err(format!("-th {}: must be 1..=1024", a.threads));
    }
    if a.readratio > 100 {
        return Err(format!("-readratio {}: must be 0..=100", a.readratio));
    }
    if ratio_given && a.op != Op::MixRw {
        return Err("-readratio is for mixrw".into());
    }
    if let Some(n) = a.n {
        if n < a.rec {
            return Err(format!(
                "-n {n} is smaller than the record size -r {}",
                a.rec
            ));
        }
    }
    Ok(a)
}

impl Args {
    /// The benchmark job.
    pub fn job(&self, initiator: &str) -> Result<JobSpec, String> {
        let target = TargetSpec::parse(&self.target)?;
        let file = matches!(target, TargetSpec::File(_));
        if file
            && self.op == Op::Create
            && self.n.is_none()
            && !std::path::Path::new(&self.target).exists()
        {
            return Err(format!(
                "-n: create needs the size of the new file {} (e.g. -n 1g)",
                self.target
            ));
        }
        if self.dio && !file {
            return Err("-dio is for files and block devices, not iscsi:// targets".into());
        }
        let rw = match (self.op, self.random) {
            (Op::Read, false) => Rw::Read,
            (Op::Read, true) => Rw::RandRead,
            (Op::Create | Op::Write, false) => Rw::Write,
            (Op::Create | Op::Write, true) => Rw::RandWrite,
            (Op::MixRw, false) => Rw::Rw,
            (Op::MixRw, true) => Rw::RandRw,
        };
        let s = JobSpec {
            name: "gpfsperf".into(),
            targets: vec![target],
            rw,
            rwmixread: self.readratio,
            bs: u32::try_from(self.rec).map_err(|_| "-r: too large".to_string())?,
            iodepth: 1,
            numjobs: self.threads,
            size: self.n,
            offset: 0,
            runtime: None,
            ramp_time: Duration::ZERO,
            randseed: 0x1234_5678,
            direct: self.dio,
            create: self.op == Op::Create,
            initiator: initiator.to_string(),
            multipath: None,
            ioengine: if file {
                IoEngineKind::Psync
            } else {
                IoEngineKind::Auto
            },
            verify: false,
            verify_id: None,
            share: Default::default(),
            busy_poll: std::time::Duration::ZERO,
        };
        s.validate().map_err(|e| {
            e.replace("--bs", "-r")
                .replace("--numjobs", "-th")
                .replace("--size", "-n")
                .replace("--direct", "-dio")
        })?;
        Ok(s)
    }
}

/// gpfsperf's way of writing sizes: 1M, 3G, 256K, or bytes.
pub fn size_text(n: u64) -> String {
    for (shift, suffix) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", n >> shift);
        }
    }
    n.to_string()
}

/// The report, in gpfsperf's layout.
pub fn report(a: &Args, spec: &JobSpec, r: &RunResult, file_size: u64) -> String {
    let op = match a.op {
        Op::Create => "create",
        Op::Read => "read",
        Op::Write => "write",
        Op::MixRw => "mixrw",
    };
    let pattern = if a.random { "rand" } else { "seq" };
    let bytes = r.read.bytes + r.write.bytes;
    let ops = r.read.ios + r.write.ios;
    let secs = r.elapsed.as_secs_f64().max(1e-9);
    let busy_ns = r.read.lat.mean() * r.read.ios as f64 + r.write.lat.mean() * r.write.ios as f64;
    let avg_ms = if ops > 0 {
        busy_ns / ops as f64 / 1e6
    } else {
        0.0
    };
    let util = (busy_ns / 1e9 / (secs * f64::from(spec.numjobs))).min(1.0);
    let mut s = format!(
        "ironsan gpfsperf {op} {pattern} {}\n  recSize {} nBytes {} fileSize {}\n  \
         nProcesses 1 nThreadsPerProcess {}\n",
        a.target,
        size_text(a.rec),
        size_text(spec.size.unwrap_or(file_size).min(file_size)),
        size_text(file_size),
        a.threads
    );
    s += if a.dio {
        "  using direct I/O\n"
    } else {
        "  not using direct I/O\n"
    };
    if a.random {
        s += "  offsets accessed at random within the file segment\n";
    } else {
        s += "  offsets accessed will cycle through the same file segment\n";
    }
    if a.op == Op::MixRw {
        s += &format!(
            "  read ratio {}%: {} reads, {} writes\n",
            a.readratio, r.read.ios, r.write.ios
        );
    }
    s += &format!(
        "    Data rate was {:.2} Kbytes/sec, Op Rate was {:.2} Ops/sec, Avg Latency was {avg_ms:.3} \
         milliseconds, thread utilization {util:.3}, bytesTransferred {bytes}\n",
        bytes as f64 / 1024.0 / secs,
        ops as f64 / secs,
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_gpfsperf_command_lines() {
        let a = parse(&v("create seq /tmp/n1aa -r 1m -th 4 -n 3072M")).unwrap();
        assert_eq!(
            (a.op, a.random, a.rec, a.threads, a.n),
            (Op::Create, false, 1 << 20, 4, Some(3072 << 20))
        );
        let a = parse(&v("mixrw seq /tmp/n1aa -r 1m -th 2 -n 3072M -readratio 70")).unwrap();
        assert_eq!((a.op, a.readratio), (Op::MixRw, 70));
        let a = parse(&v("read rand iscsi://h/iqn.x/0 -r 4k")).unwrap();
        assert!(a.random);
        for (args, want) in [
            ("read seq", "expected an operation"),
            ("copy seq /x", "operation"),
            ("read zigzag /x", "pattern"),
            ("read seq /x -r 1000", "-r"),
            ("read seq /x -th 0", "-th"),
            ("read seq /x -th", "-th needs a value"),
            ("mixrw seq /x -readratio 101", "-readratio"),
            ("read seq /x -readratio 50", "-readratio is for mixrw"),
            ("read seq /x -bogus", "unknown option -bogus"),
            ("read seq /x -n 1k -r 4k", "-n"),
        ] {
            let e = parse(&v(args)).unwrap_err();
            assert!(e.contains(want), "{args}: {e}");
        }
        assert_eq!(size_text(3072 << 20), "3G");
        assert_eq!(size_text(1 << 20), "1M");
        assert_eq!(size_text(1000), "1000");
    }
}
