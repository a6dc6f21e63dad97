//! The multi-node bench (like fio's `--server`/`--client` and elbencho's
//! service mode): `ironsan bench --server` on each load node runs the jobs
//! a coordinator (`ironsan bench --client HOST … <job>`) sends; the
//! coordinator starts all nodes together, collects each node's result with
//! its HDR histograms and merges them (histograms added, never averaged),
//! and reports a stonewall figure.
//!
//! [`frame`] is the framing (bounded, versioned by the hello), [`msg`] the
//! messages and the wire form of results, [`server`] and [`coordinator`]
//! the two sides, [`merge`] the merge and the stonewall, [`report`] the
//! text and JSON.

pub mod coordinator;
pub mod frame;
pub mod merge;
pub mod msg;
pub mod report;
pub mod server;

/// The port a bench server listens on by default (127.0.0.1:9261).
pub const DEFAULT_PORT: u16 = 9261;
