//! CrystalDiskMark's tests (`ironsan cdm`): each test runs reads then
//! writes for `passes` passes of `duration` over a test area of `size`
//! bytes, and the best pass is reported, in MB/s (10^6 bytes/s) and IOPS,
//! as CrystalDiskMark does. `QnTm` is n I/Os in flight in each of m jobs
//! (threads; for iSCSI, m sessions).

use std::time::Duration;

use serde_json::{json, Value};

use crate::run::{run, RunResult};
use crate::spec::{JobSpec, Rw};

/// A CrystalDiskMark profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// CrystalDiskMark 8's default.
    Cdm8,
    /// CrystalDiskMark 6's four tests.
    Cdm6,
    /// CrystalDiskMark 8's NVMe SSD profile.
    Nvme,
}

impl Profile {
    /// `cdm8` (or `default`), `cdm6` or `nvme`.
    pub fn parse(s: &str) -> Result<Profile, String> {
        match s {
            "cdm8" | "default" | "8" => Ok(Profile::Cdm8),
            "cdm6" | "6" => Ok(Profile::Cdm6),
            "nvme" => Ok(Profile::Nvme),
            _ => Err(format!(
                "--profile {s:?}: expected cdm8 (default), cdm6 or nvme"
            )),
        }
    }

    /// The name printed.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Cdm8 => "CrystalDiskMark 8 default",
            Profile::Cdm6 => "CrystalDiskMark 6",
            Profile::Nvme => "CrystalDiskMark 8 NVMe SSD",
        }
    }

    /// The profile's tests, in CrystalDiskMark's order.
    pub fn tests(self) -> Vec<Test> {
        let t = |label, seq, bs, q, th| Test {
            label,
            seq,
            bs,
            q,
            t: th,
        };
        match self {
            Profile::Cdm8 => vec![
                t("SEQ1M Q8T1", true, 1 << 20, 8, 1),
                t("SEQ1M Q1T1", true, 1 << 20, 1, 1),
                t("RND4K Q32T1", false, 4096, 32, 1),
                t("RND4K Q1T1", false, 4096, 1, 1),
            ],
            // CrystalDiskMark 6's "Seq Q32T1" used 128 KiB blocks.
            Profile::Cdm6 => vec![
                t("Seq Q32T1", true, 128 << 10, 32, 1),
                t("4KiB Q8T8", false, 4096, 8, 8),
                t("4KiB Q32T1", false, 4096, 32, 1),
                t("4KiB Q1T1", false, 4096, 1, 1),
            ],
            Profile::Nvme => vec![
                t("SEQ1M Q8T1", true, 1 << 20, 8, 1),
                t("SEQ128K Q32T1", true, 128 << 10, 32, 1),
                t("RND4K Q32T16", false, 4096, 32, 16),
                t("RND4K Q1T1", false, 4096, 1, 1),
            ],
        }
    }
}

/// One test of a profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Test {
    pub label: &'static str,
    /// Sequential (else random) offsets.
    pub seq: bool,
    pub bs: u32,
    /// Queue depth per job.
    pub q: u32,
    /// Jobs.
    pub t: u32,
}

/// How to run the profile.
#[derive(Clone, Debug)]
pub struct Options {
    pub profile: Profile,
    pub passes: u32,
    pub duration: Duration,
    /// Test area in bytes.
    pub size: u64,
    /// Pause between runs (CrystalDiskMark's "Interval").
    pub interval: Duration,
    /// Skip the writes.
    pub read_only: bool,
    /// Write the test area once before measuring (as CrystalDiskMark
    /// prepares its test file).
    pub prepare: bool,
}

impl Options {
    /// Checks the options; the message names the one at fault.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=9).contains(&self.passes) {
            return Err(format!("--passes {}: must be 1..=9", self.passes));
        }
        if self.duration < Duration::from_millis(100) || self.duration > Duration::from_secs(3600) {
            return Err(format!(
                "--duration {:?}: must be 100ms..=1h",
                self.duration
            ));
        }
        if self.size < 1 << 20 {
            return Err(format!("--size {}: must be at least 1 MiB", self.size));
        }
        Ok(())
    }
}

/// The best pass of one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Best {
    /// 10^6 bytes per second.
    pub mbps: f64,
    pub iops: f64,
    /// Mean completion latency in microseconds.
    pub lat_us: f64,
}

/// One row of the table.
#[derive(Clone, Debug)]
pub struct Row {
    pub test: Test,
    pub read: Best,
    pub write: Option<Best>,
}

fn best_of(r: &RunResult, write: bool) -> Best {
    let d = if write { &r.write } else { &r.read };
    let secs = r.elapsed.as_secs_f64().max(1e-9);
    Best {
        mbps: d.bytes as f64 / secs / 1e6,
        iops: d.ios as f64 / secs,
        lat_us: if d.ios > 0 {
            d.lat.mean() / 1000.0
        } else {
            0.0
        },
    }
}

/// The job of one run of one test.
pub fn job_for(base: &JobSpec, o: &Options, t: &Test, write: bool) -> JobSpec {
    let mut s = base.clone();
    s.name = format!("{} {}", t.label, if write { "write" } else { "read" });
    s.rw = match (t.seq, write) {
        (true, false) => Rw::Read,
        (true, true) => Rw::Write,
        (false, false) => Rw::RandRead,
        (false, true) => Rw::RandWrite,
    };
    s.bs = t.bs;
    s.iodepth = t.q;
    s.numjobs = t.t;
    s.size = Some(o.size);
    s.runtime = Some(o.duration);
    s.create = true;
    s
}

/// Checks the options and every job of the profile, before any I/O.
pub fn validate(base: &JobSpec, o: &Options) -> Result<(), String> {
    o.validate()?;
    for t in &o.profile.tests() {
        job_for(base, o, t, false).validate()?;
        job_for(base, o, t, true).validate()?;
    }
    Ok(())
}

/// Runs the profile; `progress` is told about each finished row.
pub fn run_profile(
    base: &JobSpec,
    o: &Options,
    mut progress: impl FnMut(&Row),
) -> Result<Vec<Row>, String> {
    validate(base, o)?;
    let tests = o.profile.tests();
    if o.prepare && !o.read_only {
        let mut p = base.clone();
        p.name = "prepare".into();
        p.rw = Rw::Write;
        p.bs = 1 << 20;
        p.iodepth = 8;
        p.numjobs = 1;
        p.size = Some(o.size);
        p.runtime = None;
        p.create = true;
        let r = run(&p, None)?;
        if r.write.errors > 0 {
            return Err(format!("preparing the test area: {:?}", r.error_samples));
        }
    }
    let mut rows = Vec::new();
    for t in &tests {
        let mut dirs = Vec::new();
        for write in [false, true] {
            if write && o.read_only {
                continue;
            }
            let job = job_for(base, o, t, write);
            let mut best = Best::default();
            for _ in 0..o.passes {
                std::thread::sleep(o.interval);
                let r = run(&job, None)?;
                let errors = r.read.errors + r.write.errors;
                if errors > 0 {
                    return Err(format!(
                        "{}: {errors} I/O errors, first: {}",
                        job.name,
                        r.error_samples.first().map_or("?", |s| s.as_str())
                    ));
                }
                let b = best_of(&r, write);
                if b.mbps > best.mbps {
                    best = b;
                }
            }
            dirs.push(best);
        }
        let row = Row {
            test: *t,
            read: dirs[0],
            write: dirs.get(1).copied(),
        };
        progress(&row);
        rows.push(row);
    }
    Ok(rows)
}

/// The heading of the table.
pub fn header(target: &str, o: &Options) -> String {
    format!(
        "ironsan cdm: {target}\n\
         Profile: {} ({} passes x {:.0?}, test area {} MiB, best pass shown)\n\
         MB/s = 1,000,000 bytes/s; QnTm = n I/Os in flight in each of m jobs\n\n\
         {:<14} {:>11} {:>12} {:>11} {:>12}\n",
        o.profile.name(),
        o.passes,
        o.duration,
        o.size >> 20,
        "Test",
        "Read MB/s",
        "Read IOPS",
        "Write MB/s",
        "Write IOPS"
    )
}

/// One line of the table.
pub fn line(r: &Row) -> String {
    let (wm, wi) = match r.write {
        Some(w) => (format!("{:.2}", w.mbps), format!("{:.1}", w.iops)),
        None => ("-".into(), "-".into()),
    };
    format!(
        "{:<14} {:>11.2} {:>12.1} {:>11} {:>12}\n",
        r.test.label, r.read.mbps, r.read.iops, wm, wi
    )
}

/// The whole table.
pub fn table(target: &str, o: &Options, rows: &[Row]) -> String {
    let mut s = header(target, o);
    for r in rows {
        s += &line(r);
    }
    s
}

/// The table as JSON.
pub fn json(target: &str, o: &Options, rows: &[Row]) -> Value {
    let dir = |b: &Best| json!({"mb_per_s": b.mbps, "iops": b.iops, "lat_us_mean": b.lat_us});
    json!({
        "target": target,
        "profile": o.profile.name(),
        "passes": o.passes,
        "duration_ms": o.duration.as_millis() as u64,
        "size_bytes": o.size,
        "tests": rows.iter().map(|r| json!({
            "test": r.test.label,
            "sequential": r.test.seq,
            "bs": r.test.bs,
            "queue_depth": r.test.q,
            "threads": r.test.t,
            "read": dir(&r.read),
            "write": r.write.as_ref().map(dir),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_and_table() {
        assert_eq!(Profile::parse("nvme"), Ok(Profile::Nvme));
        assert!(Profile::parse("cdm7").unwrap_err().contains("--profile"));
        let labels: Vec<_> = Profile::Cdm8.tests().iter().map(|t| t.label).collect();
        assert_eq!(
            labels,
            ["SEQ1M Q8T1", "SEQ1M Q1T1", "RND4K Q32T1", "RND4K Q1T1"]
        );
        let t = Profile::Cdm6.tests();
        assert_eq!((t[0].bs, t[0].q, t[1].q, t[1].t), (128 << 10, 32, 8, 8));
        assert_eq!(Profile::Nvme.tests()[2].t, 16);
        let o = Options {
            profile: Profile::Cdm8,
            passes: 5,
            duration: Duration::from_secs(5),
            size: 1 << 30,
            interval: Duration::ZERO,
            read_only: false,
            prepare: true,
        };
        assert!(o.validate().is_ok());
        let mut bad = o.clone();
        bad.passes = 0;
        assert!(bad.validate().unwrap_err().contains("--passes"));
        let rows = vec![Row {
            test: Profile::Cdm8.tests()[2],
            read: Best {
                mbps: 400.0,
                iops: 97656.2,
                lat_us: 300.0,
            },
            write: None,
        }];
        let s = table("x", &o, &rows);
        assert!(s.contains("RND4K Q32T1") && s.contains("97656.2"), "{s}");
        assert_eq!(json("x", &o, &rows)["tests"][0]["read"]["iops"], 97656.2);
    }
}
