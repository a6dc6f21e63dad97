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

/// Runs the profile; `progress` is told what starts (the preparation,
/// then each pass of each test).
pub fn run_profile(
    base: &JobSpec,
    o: &Options,
    mut progress: impl FnMut(&str),
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
        progress(&format!("preparing the test area ({} MiB)", o.size >> 20));
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
            for pass in 1..=o.passes {
                progress(&progress_text(t, write, pass, o.passes));
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
        rows.push(row);
    }
    Ok(rows)
}

/// A test's label as CrystalDiskMark 8's text export writes it:
/// `SEQ    1MiB (Q=  8, T= 1)`.
pub fn export_label(t: &Test) -> String {
    let size = if t.bs >= 1 << 20 {
        format!("{}MiB", t.bs >> 20)
    } else {
        format!("{}KiB", t.bs >> 10)
    };
    format!(
        "{} {size:>7} (Q={:>3}, T={:>2})",
        if t.seq { "SEQ" } else { "RND" },
        t.q,
        t.t
    )
}

/// One result line of the export: `  LABEL: MB/s [IOPS] <latency us>`.
fn export_line(t: &Test, b: &Best) -> String {
    format!(
        "  {}: {:>9.3} MB/s [{:>9.1} IOPS] <{:>9.2} us>\n",
        export_label(t),
        b.mbps,
        b.iops,
        b.lat_us
    )
}

/// The profile's name as CrystalDiskMark 8 prints it after `Profile:`.
fn export_profile(p: Profile) -> &'static str {
    match p {
        Profile::Cdm8 => "Default",
        Profile::Nvme => "NVMe SSD",
        Profile::Cdm6 => "CrystalDiskMark 6 (Seq Q32T1 128KiB, 4KiB Q8T8, Q32T1, Q1T1)",
    }
}

/// `YYYY/MM/DD HH:MM:SS` (UTC) for `secs` since the epoch.
pub fn date_text(secs: u64) -> String {
    // Days to civil date (Howard Hinnant's algorithm, proleptic Gregorian).
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}/{m:02}/{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The operating system line: `Linux 6.1.0 (x86_64)`.
fn os_text() -> String {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{} {} ({})",
        std::env::consts::OS.replace("linux", "Linux"),
        release.trim(),
        std::env::consts::ARCH
    )
}

/// The results in CrystalDiskMark 8's text export layout: the banner, the
/// `[Read]` and `[Write]` blocks with MB/s, IOPS and mean latency, then the
/// profile, test size and passes, measuring time and interval, date and
/// OS.
pub fn export(target: &str, o: &Options, rows: &[Row]) -> String {
    let rule = "-".repeat(78);
    let mut s = format!(
        "{rule}\nironsan cdm {} (CrystalDiskMark 8's tests and text export)\n{:>78}\n{rule}\n\
         * MB/s = 1,000,000 bytes/s [SATA/600 = 600,000,000 bytes/s]\n\
         * KB = 1000 bytes, KiB = 1024 bytes\n\n[Read]\n",
        env!("CARGO_PKG_VERSION"),
        target
    );
    for r in rows {
        s += &export_line(&r.test, &r.read);
    }
    if rows.iter().any(|r| r.write.is_some()) {
        s += "\n[Write]\n";
        for r in rows {
            if let Some(w) = &r.write {
                s += &export_line(&r.test, w);
            }
        }
    }
    let size = if o.size >= 1 << 30 && o.size.is_multiple_of(1 << 30) {
        format!("{} GiB", o.size >> 30)
    } else {
        format!("{} MiB", o.size >> 20)
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    s += &format!(
        "\nProfile: {}{}\n   Test: {size} (x{}) [{target}]\n   Time: Measure {} / Interval {}\n   Date: {} UTC\n     OS: {}\n",
        export_profile(o.profile),
        if o.read_only { " [Read]" } else { "" },
        o.passes,
        duration_text(o.duration),
        duration_text(o.interval),
        date_text(now),
        os_text()
    );
    s
}

/// `5 sec`, `300 ms`.
fn duration_text(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} sec", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// What a test is doing, for a progress line.
pub fn progress_text(t: &Test, write: bool, pass: u32, passes: u32) -> String {
    format!(
        "{} {} pass {pass}/{passes}",
        export_label(t),
        if write { "write" } else { "read" }
    )
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
        let s = export("x", &o, &rows);
        assert!(
            s.contains("[Read]\n  RND    4KiB (Q= 32, T= 1):   400.000 MB/s [  97656.2 IOPS] <   300.00 us>\n"),
            "{s}"
        );
        assert!(!s.contains("[Write]"), "{s}");
        assert!(s.contains("Profile: Default\n   Test: 1 GiB (x5) [x]\n   Time: Measure 5 sec / Interval 0 sec\n"), "{s}");
        assert_eq!(
            export_label(&Profile::Cdm8.tests()[0]),
            "SEQ    1MiB (Q=  8, T= 1)"
        );
        assert_eq!(
            export_label(&Profile::Cdm6.tests()[0]),
            "SEQ  128KiB (Q= 32, T= 1)"
        );
        assert_eq!(date_text(0), "1970/01/01 00:00:00");
        assert_eq!(date_text(1_796_577_297), "2026/12/06 17:14:57");
        assert_eq!(json("x", &o, &rows)["tests"][0]["read"]["iops"], 97656.2);
    }
}
