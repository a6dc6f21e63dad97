//! The benchmark plan, validated before any I/O.

use std::path::PathBuf;
use std::time::Duration;

use initiator::Url;
use serde::{Deserialize, Serialize};

/// fio's `rw` modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    Read,
    Write,
    RandRead,
    RandWrite,
    /// Random mixed reads and writes (`rwmixread` percent reads).
    RandRw,
    /// Sequential mixed reads and writes.
    Rw,
    /// Sequential trims (UNMAP on a LUN, a punched hole in a file,
    /// BLKDISCARD on a block device).
    Trim,
    /// Random trims.
    RandTrim,
}

impl Rw {
    /// Parses fio's names (`read`, `write`, `randread`, `randwrite`,
    /// `randrw`, `rw`/`readwrite`, `trim`, `randtrim`).
    pub fn parse(s: &str) -> Result<Rw, String> {
        Ok(match s {
            "read" => Rw::Read,
            "write" => Rw::Write,
            "randread" => Rw::RandRead,
            "randwrite" => Rw::RandWrite,
            "randrw" => Rw::RandRw,
            "rw" | "readwrite" => Rw::Rw,
            "trim" => Rw::Trim,
            "randtrim" => Rw::RandTrim,
            _ => {
                return Err(format!(
                    "--rw {s:?}: expected read, write, randread, randwrite, randrw, rw, trim \
                     or randtrim"
                ))
            }
        })
    }

    /// fio's name.
    pub fn name(self) -> &'static str {
        match self {
            Rw::Read => "read",
            Rw::Write => "write",
            Rw::RandRead => "randread",
            Rw::RandWrite => "randwrite",
            Rw::RandRw => "randrw",
            Rw::Rw => "rw",
            Rw::Trim => "trim",
            Rw::RandTrim => "randtrim",
        }
    }

    /// True for random offsets.
    pub fn random(self) -> bool {
        matches!(
            self,
            Rw::RandRead | Rw::RandWrite | Rw::RandRw | Rw::RandTrim
        )
    }

    /// True for the trim modes.
    pub fn trim(self) -> bool {
        matches!(self, Rw::Trim | Rw::RandTrim)
    }

    /// Percentage of reads given `rwmixread` (trims are not reads).
    pub fn read_percent(self, rwmixread: u8) -> u8 {
        match self {
            Rw::Read | Rw::RandRead => 100,
            Rw::Write | Rw::RandWrite | Rw::Trim | Rw::RandTrim => 0,
            Rw::RandRw | Rw::Rw => rwmixread,
        }
    }

    /// True when the run changes the target's data (writes or trims).
    pub fn modifies(self, rwmixread: u8) -> bool {
        self.read_percent(rwmixread) < 100
    }
}

/// What to drive. On the wire (the multi-node bench) a target is its
/// full text form: an `iscsi://` URL with its credentials and digest
/// parameters, or a path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum TargetSpec {
    /// A LUN through the built-in initiator.
    Iscsi(Url),
    /// A namespace through the built-in NVMe/TCP host.
    Nvme(initiator::nvme::NvmeUrl),
    /// A file or block device.
    File(PathBuf),
}

impl TargetSpec {
    /// `iscsi://…` URLs, anything else is a path.
    pub fn parse(s: &str) -> Result<TargetSpec, String> {
        if s.starts_with("iscsi://") {
            let u: Url = s.parse()?;
            if u.target.is_none() || u.lun.is_none() {
                return Err(format!(
                    "{s}: the URL must name a target and a LUN (iscsi://host/iqn/lun)"
                ));
            }
            Ok(TargetSpec::Iscsi(u))
        } else if s.starts_with("nvme-tcp://") {
            Ok(TargetSpec::Nvme(initiator::nvme::NvmeUrl::parse(s)?))
        } else if s.is_empty() {
            Err("empty target".into())
        } else {
            Ok(TargetSpec::File(PathBuf::from(s)))
        }
    }
}

impl TryFrom<String> for TargetSpec {
    type Error = String;
    fn try_from(s: String) -> Result<TargetSpec, String> {
        TargetSpec::parse(&s)
    }
}

impl From<TargetSpec> for String {
    /// The full form, credentials included (unlike `Display`).
    fn from(t: TargetSpec) -> String {
        match t {
            TargetSpec::Iscsi(u) => u.to_full_string(),
            TargetSpec::Nvme(u) => u.to_string(),
            TargetSpec::File(p) => p.to_string_lossy().into_owned(),
        }
    }
}

impl std::fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetSpec::Iscsi(u) => u.fmt(f),
            TargetSpec::Nvme(u) => u.fmt(f),
            TargetSpec::File(p) => p.display().fmt(f),
        }
    }
}

/// One benchmark run. It is also the job a multi-node coordinator sends
/// to every bench server (as JSON), so every field is (de)serializable and
/// unknown fields are refused.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub name: String,
    pub targets: Vec<TargetSpec>,
    pub rw: Rw,
    pub rwmixread: u8,
    /// Block size in bytes.
    pub bs: u32,
    pub iodepth: u32,
    pub numjobs: u32,
    /// Bytes of the target to use from `offset` (None: all of it).
    pub size: Option<u64>,
    pub offset: u64,
    /// Stop after this long (None: after `size` bytes per job).
    pub runtime: Option<Duration>,
    /// Run this long before measuring.
    pub ramp_time: Duration,
    pub randseed: u64,
    /// O_DIRECT for files.
    pub direct: bool,
    /// Create a file target of `size` bytes when missing.
    pub create: bool,
    /// Initiator name for iSCSI targets.
    pub initiator: String,
    /// Multipath policy across several URLs of one LU.
    pub multipath: Option<Multipath>,
    /// The engine for files and block devices.
    pub ioengine: IoEngineKind,
    /// Writes stamp self-describing blocks; reads check them.
    pub verify: bool,
    /// The run id writes stamp and reads expect (default: a fresh one for
    /// writes; reads learn it from the first block).
    pub verify_id: Option<u64>,
    /// This run's share of a multi-node run (default: the whole run).
    #[serde(default)]
    pub share: Share,
    /// iSCSI engines poll their sockets this long before sleeping
    /// (`initiator::Connection::set_busy_poll`; zero: never).
    #[serde(default)]
    pub busy_poll: Duration,
}

/// A node's share of a multi-node run: its jobs are numbers
/// `index * numjobs ..` of `count * numjobs`, so nodes driving the same LU
/// split it like the jobs of one run do (sequential jobs start at their own
/// part of the region, `--size` runs divide the bytes, seeds differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Share {
    /// This node's number, `0..count`.
    pub index: u32,
    /// Nodes driving the same targets.
    pub count: u32,
}

impl Default for Share {
    fn default() -> Share {
        Share { index: 0, count: 1 }
    }
}

impl JobSpec {
    /// The global number of this run's job `j` and the total number of
    /// jobs across the nodes sharing the targets.
    pub fn global_job(&self, j: u32) -> (u32, u32) {
        (
            self.share.index * self.numjobs + j,
            self.share.count * self.numjobs,
        )
    }
}

/// fio's `ioengine`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoEngineKind {
    /// io_uring for files when the kernel allows it (else psync), the
    /// built-in initiator for iscsi:// URLs.
    Auto,
    /// The built-in initiator.
    Iscsi,
    /// io_uring (files and block devices).
    IoUring,
    /// pread/pwrite, one I/O at a time per job.
    Psync,
}

impl IoEngineKind {
    /// `io_uring`, `psync`, `iscsi` or `auto`.
    pub fn parse(s: &str) -> Result<IoEngineKind, String> {
        Ok(match s {
            "auto" => IoEngineKind::Auto,
            "iscsi" => IoEngineKind::Iscsi,
            "io_uring" | "uring" => IoEngineKind::IoUring,
            "psync" | "sync" | "pvsync" => IoEngineKind::Psync,
            _ => {
                return Err(format!(
                    "--ioengine {s:?}: expected io_uring, psync, iscsi or auto"
                ))
            }
        })
    }
}

/// Multipath policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Multipath {
    /// Round robin switching path every N I/Os.
    RoundRobin(u32),
    /// Least queue depth.
    LeastQueueDepth,
}

impl Multipath {
    /// `rr`, `rr:N` or `lqd`.
    pub fn parse(s: &str) -> Result<Multipath, String> {
        match s {
            "rr" => Ok(Multipath::RoundRobin(1)),
            "lqd" => Ok(Multipath::LeastQueueDepth),
            _ => match s.strip_prefix("rr:").map(str::parse::<u32>) {
                Some(Ok(n)) if n > 0 => Ok(Multipath::RoundRobin(n)),
                _ => Err(format!(
                    "--multipath {s:?}: expected rr, rr:N (N >= 1) or lqd"
                )),
            },
        }
    }
}

impl JobSpec {
    /// Checks the plan; the message names the option at fault.
    pub fn validate(&self) -> Result<(), String> {
        if self.targets.is_empty() {
            return Err(
                "no target given (an iscsi:// or nvme-tcp:// URL, a file or a block device)".into(),
            );
        }
        if self.bs == 0 || !self.bs.is_multiple_of(512) || self.bs > 64 << 20 {
            return Err(format!(
                "--bs {}: must be a multiple of 512 up to 64M",
                self.bs
            ));
        }
        if !(1..=65536).contains(&self.iodepth) {
            return Err(format!("--iodepth {}: must be 1..=65536", self.iodepth));
        }
        if !(1..=1024).contains(&self.numjobs) {
            return Err(format!("--numjobs {}: must be 1..=1024", self.numjobs));
        }
        if self.rwmixread > 100 {
            return Err(format!("--rwmixread {}: must be 0..=100", self.rwmixread));
        }
        if !self.offset.is_multiple_of(u64::from(self.bs)) {
            return Err(format!(
                "--offset {} is not a multiple of --bs {}",
                self.offset, self.bs
            ));
        }
        if let Some(s) = self.size {
            if s < u64::from(self.bs) {
                return Err(format!("--size {s} is smaller than --bs {}", self.bs));
            }
        }
        if self.busy_poll > Duration::from_secs(1) {
            return Err("--busy-poll: at most 1s".into());
        }
        if !self.busy_poll.is_zero()
            && self
                .targets
                .iter()
                .any(|t| matches!(t, TargetSpec::File(_)))
        {
            return Err("--busy-poll is for iscsi:// and nvme-tcp:// targets (files and devices use their engine's own waiting)".into());
        }
        if self.targets.len() > 1 && self.multipath.is_none() {
            return Err(
                "several targets: give --multipath rr[:N] or lqd (they must be one LU)".into(),
            );
        }
        if self.multipath.is_some()
            && !(self
                .targets
                .iter()
                .all(|t| matches!(t, TargetSpec::Iscsi(_)))
                || self
                    .targets
                    .iter()
                    .all(|t| matches!(t, TargetSpec::Nvme(_))))
        {
            return Err(
                "--multipath needs iscsi:// targets, or nvme-tcp:// targets (not both)".into(),
            );
        }
        let nvme = matches!(self.targets[0], TargetSpec::Nvme(_));
        if nvme && self.ioengine != IoEngineKind::Auto {
            return Err(
                "nvme-tcp:// targets use the built-in NVMe/TCP host (no --ioengine)".into(),
            );
        }
        if nvme && self.direct {
            return Err("--direct is for files and block devices, not nvme-tcp:// targets".into());
        }
        let iscsi = matches!(self.targets[0], TargetSpec::Iscsi(_));
        match (self.ioengine, iscsi || nvme) {
            (IoEngineKind::IoUring | IoEngineKind::Psync, true) => {
                return Err(
                    "--ioengine io_uring/psync are for files and block devices; iscsi:// targets \
                     use the built-in initiator (--ioengine iscsi)"
                        .into(),
                )
            }
            (IoEngineKind::Iscsi, false) => {
                return Err(
                    "--ioengine iscsi needs an iscsi:// target; for files use io_uring or psync"
                        .into(),
                )
            }
            _ => {}
        }
        if self.direct && iscsi {
            return Err("--direct is for files and block devices, not iscsi:// targets".into());
        }
        if self.verify_id.is_some() && !self.verify {
            return Err("--verify-id needs --verify".into());
        }
        if self.verify && self.rw.trim() {
            return Err(format!(
                "--verify with --rw {}: trimmed blocks carry no pattern to check",
                self.rw.name()
            ));
        }
        let Share { index, count } = self.share;
        if count == 0 || index >= count || self.numjobs.checked_mul(count).is_none() {
            return Err(format!("node share {index} of {count}: out of range"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec {
            name: "t".into(),
            targets: vec![TargetSpec::parse("/tmp/x").unwrap()],
            rw: Rw::RandRead,
            rwmixread: 50,
            bs: 4096,
            iodepth: 32,
            numjobs: 1,
            size: Some(1 << 20),
            offset: 0,
            runtime: None,
            ramp_time: Duration::ZERO,
            randseed: 1,
            direct: false,
            create: false,
            initiator: "iqn.x".into(),
            multipath: None,
            ioengine: IoEngineKind::Auto,
            verify: false,
            verify_id: None,
            share: Share::default(),
            busy_poll: std::time::Duration::ZERO,
        }
    }

    #[test]
    fn validation_names_the_option() {
        assert!(spec().validate().is_ok());
        type Change = Box<dyn Fn(&mut JobSpec)>;
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|s| s.bs = 1000), "--bs"),
            (Box::new(|s| s.iodepth = 0), "--iodepth"),
            (Box::new(|s| s.numjobs = 0), "--numjobs"),
            (Box::new(|s| s.rwmixread = 101), "--rwmixread"),
            (Box::new(|s| s.offset = 100), "--offset"),
            (
                Box::new(|s| s.busy_poll = Duration::from_micros(50)),
                "--busy-poll",
            ),
            (Box::new(|s| s.size = Some(10)), "--size"),
            (
                Box::new(|s| s.targets.push(TargetSpec::File("/y".into()))),
                "--multipath",
            ),
            (Box::new(|s| s.ioengine = IoEngineKind::Iscsi), "--ioengine"),
            (Box::new(|s| s.verify_id = Some(1)), "--verify-id"),
            (
                Box::new(|s| {
                    s.targets = vec![TargetSpec::parse("iscsi://h/iqn.x/0").unwrap()];
                    s.direct = true;
                }),
                "--direct",
            ),
            (
                Box::new(|s| {
                    s.targets = vec![TargetSpec::parse("iscsi://h/iqn.x/0").unwrap()];
                    s.ioengine = IoEngineKind::IoUring;
                }),
                "--ioengine",
            ),
        ];
        for (f, want) in cases {
            let mut s = spec();
            f(&mut s);
            let e = s.validate().unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        assert!(Rw::parse("randrw").is_ok() && Rw::parse("sideways").is_err());
        assert_eq!(Multipath::parse("rr:4"), Ok(Multipath::RoundRobin(4)));
        assert!(Multipath::parse("rr:0").is_err());
        assert!(TargetSpec::parse("iscsi://h/iqn.x").is_err());
        assert!(IoEngineKind::parse("libaio")
            .unwrap_err()
            .contains("--ioengine"));
    }
}
