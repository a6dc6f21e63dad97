//! ironsan's benchmark: the workloads storage engineers run (fio's
//! `rw`/`bs`/`iodepth`/`numjobs`, CrystalDiskMark's tests, gpfsperf's
//! create/read/mixrw), driven through I/O engines — the userspace iSCSI
//! initiator, or files and block devices — with per-I/O latency recorded in
//! HDR histograms that are merged across jobs, never averaged.
//!
//! [`spec::JobSpec`] is the validated plan; [`run::run`] executes it with
//! one thread per job, each keeping `iodepth` I/Os in flight on its own
//! engine; [`report`] prints text and fio-compatible JSON.

pub mod cdm;
pub mod engine;
pub mod gpfsperf;
pub mod multipath;
pub mod node;
pub mod nvme;
pub mod nvme_multipath;
pub mod plot;
pub mod report;
pub mod run;
pub mod spec;
pub mod uring;
pub mod verify;
pub mod workload;

pub use run::{run, RunResult};
pub use spec::{JobSpec, Rw, TargetSpec};
