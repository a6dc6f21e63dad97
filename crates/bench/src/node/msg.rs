//! The messages of the multi-node bench protocol and the wire form of a
//! node's result (histograms in HdrHistogram's V2 encoding, base64).
//!
//! ```text
//! coordinator                         server
//!   Hello{version, token}      ->
//!                              <-     Hello{version, host} | Error
//!   Job{spec}                  ->     prepares: logs in, opens, allocates
//!                              <-     Ready{engine, capacity} | Error
//!   (once every server is ready)
//!   Start                      ->     runs
//!                              <-     Progress{..} every second
//!                              <-     Result{..} | Error
//!   Abort (any time), or closing the connection: the job stops.
//! ```

use std::time::Duration;

use base64::Engine as _;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::engine::PathStat;
use crate::run::{DirStats, RunResult, Second};
use crate::spec::JobSpec;

/// The protocol version; both sides must speak the same.
pub const VERSION: u32 = 1;

/// Coordinator to server.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToServer {
    /// The first message: the protocol version and the shared token.
    Hello { version: u32, token: Option<String> },
    /// The job to prepare.
    Job { spec: Box<JobSpec> },
    /// Start the prepared job now (the barrier).
    Start,
    /// Stop the job (prepared or running) and report nothing.
    Abort,
}

/// Server to coordinator.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToCoordinator {
    /// Answer to `Hello`: the server's version and host name.
    Hello { version: u32, host: String },
    /// The job is prepared.
    Ready { engine: String, capacity: u64 },
    /// Measured I/Os so far (sent about once a second; also a heartbeat).
    Progress {
        elapsed_ms: u64,
        ios: u64,
        bytes: u64,
    },
    /// The job's result.
    Result { result: Box<NodeRun> },
    /// The job (or the hello) failed; the server closes the connection.
    Error { message: String },
}

/// Cumulative measured I/Os at a moment of a node's run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sample {
    /// Microseconds since the node's measurement began.
    pub us: u64,
    pub ios: u64,
    pub bytes: u64,
}

/// One direction's totals on the wire.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireDir {
    pub ios: u64,
    pub bytes: u64,
    pub errors: u64,
    /// The latency histogram (ns), V2-encoded, base64.
    pub lat: String,
}

/// One second of the series on the wire.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireSecond {
    pub read_ios: u64,
    pub write_ios: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    #[serde(default)]
    pub trim_ios: u64,
    #[serde(default)]
    pub trim_bytes: u64,
    pub lat: String,
}

/// A node's [`RunResult`] on the wire, plus its timeline for the stonewall.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeRun {
    pub read: WireDir,
    pub write: WireDir,
    /// Trims (absent when the run had none).
    #[serde(default)]
    pub trim: Option<WireDir>,
    pub elapsed_us: u64,
    pub first_finish_us: u64,
    pub series: Vec<WireSecond>,
    pub paths: Vec<PathStat>,
    pub errors: Vec<String>,
    pub engine: String,
    pub notes: Vec<String>,
    pub verify_id: Option<u64>,
    pub verified_bytes: u64,
    pub capacity: u64,
    /// Cumulative measured I/Os over time, from 0 to the end of the run.
    pub timeline: Vec<Sample>,
}

/// Bounds of the whole-run latency histograms (ns, 3 significant digits).
const DIR_BOUNDS: (u64, u64, u8) = (1, 3_600_000_000_000, 3);
/// Bounds of the per-second histograms (2 significant digits).
const SECOND_BOUNDS: (u64, u64, u8) = (1, 3_600_000_000_000, 2);
const V2_COOKIE: u32 = 0x1c84_9313;
const V2_HEADER: usize = 40;

/// Encodes a histogram with HdrHistogram's V2 serializer, in base64.
pub fn encode_hist(h: &Histogram<u64>) -> String {
    let mut v = Vec::new();
    // Serializing into a Vec only fails for histograms over 2^24 counts
    // buckets, which ours (fixed bounds) are not.
    let _ = V2Serializer::new().serialize(h, &mut v);
    base64::engine::general_purpose::STANDARD.encode(v)
}

/// Decodes a histogram, refusing any whose header does not carry exactly
/// `bounds` (checked before the decoder allocates anything) or whose
/// payload length is not what follows the header.
pub fn decode_hist(s: &str, bounds: (u64, u64, u8)) -> Result<Histogram<u64>, String> {
    let b = base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|e| format!("histogram: bad base64: {e}"))?;
    if b.len() < V2_HEADER {
        return Err(format!(
            "histogram: {} bytes, shorter than a header",
            b.len()
        ));
    }
    let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let u64_at = |i: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[i..i + 8]);
        u64::from_be_bytes(a)
    };
    if u32_at(0) != V2_COOKIE {
        return Err("histogram: not V2 encoding (compressed or unknown)".into());
    }
    if u32_at(4) as usize != b.len() - V2_HEADER {
        return Err(format!(
            "histogram: payload length {} but {} bytes follow the header",
            u32_at(4),
            b.len() - V2_HEADER
        ));
    }
    let got = (u64_at(16), u64_at(24), u32_at(12));
    if got != (bounds.0, bounds.1, u32::from(bounds.2)) {
        return Err(format!(
            "histogram: bounds {got:?}, expected {bounds:?} (another ironsan version?)"
        ));
    }
    check_varints(&b[V2_HEADER..])?;
    Deserializer::new()
        .deserialize(&mut &b[..])
        .map_err(|e| format!("histogram: {e:?}"))
}

/// Refuses the one count encoding the decoder cannot take: the varint of
/// `u64::MAX`, whose zig-zag decoding `i64::MIN` overflows when the
/// decoder negates it (a panic with overflow checks on). Varints are 7 bits
/// per byte with a continuation bit, the ninth byte all 8 bits.
fn check_varints(payload: &[u8]) -> Result<(), String> {
    let mut i = 0;
    while i < payload.len() {
        let mut v: u64 = 0;
        let mut k = 0;
        loop {
            let Some(&b) = payload.get(i) else {
                // Truncated: the decoder reports it.
                return Ok(());
            };
            i += 1;
            if k == 8 {
                v |= u64::from(b) << 56;
                break;
            }
            v |= u64::from(b & 0x7f) << (7 * k);
            if b & 0x80 == 0 {
                break;
            }
            k += 1;
        }
        if v == u64::MAX {
            return Err("histogram: a count out of range".into());
        }
    }
    Ok(())
}

fn dir_to_wire(d: &DirStats) -> WireDir {
    WireDir {
        ios: d.ios,
        bytes: d.bytes,
        errors: d.errors,
        lat: encode_hist(&d.lat),
    }
}

fn dir_from_wire(w: &WireDir) -> Result<DirStats, String> {
    let lat = decode_hist(&w.lat, DIR_BOUNDS)?;
    if lat.len() != w.ios {
        return Err(format!(
            "{} I/Os but {} latencies in the histogram",
            w.ios,
            lat.len()
        ));
    }
    Ok(DirStats {
        ios: w.ios,
        bytes: w.bytes,
        errors: w.errors,
        lat,
    })
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The most series seconds, paths and error lines a result may carry.
const MAX_SERIES: usize = 1 << 20;
const MAX_LIST: usize = 4096;

impl NodeRun {
    /// The wire form of a run and its timeline.
    pub fn from_run(r: &RunResult, timeline: Vec<Sample>) -> NodeRun {
        NodeRun {
            read: dir_to_wire(&r.read),
            write: dir_to_wire(&r.write),
            trim: (r.trim.ios + r.trim.errors > 0).then(|| dir_to_wire(&r.trim)),
            elapsed_us: us(r.elapsed),
            first_finish_us: us(r.first_finish),
            series: r
                .series
                .iter()
                .map(|s| WireSecond {
                    read_ios: s.read_ios,
                    write_ios: s.write_ios,
                    read_bytes: s.read_bytes,
                    write_bytes: s.write_bytes,
                    trim_ios: s.trim_ios,
                    trim_bytes: s.trim_bytes,
                    lat: encode_hist(&s.lat),
                })
                .collect(),
            paths: r.paths.clone(),
            errors: r.error_samples.clone(),
            engine: r.engine.to_string(),
            notes: r.notes.clone(),
            verify_id: r.verify_id,
            verified_bytes: r.verified_bytes,
            capacity: r.capacity,
            timeline,
        }
    }

    /// Back to a [`RunResult`] (checking every histogram) and the timeline.
    pub fn into_run(self) -> Result<(RunResult, Vec<Sample>), String> {
        if self.series.len() > MAX_SERIES
            || self.paths.len() > MAX_LIST
            || self.errors.len() > MAX_LIST
            || self.notes.len() > MAX_LIST
        {
            return Err("result with implausibly many entries".into());
        }
        if self.first_finish_us > self.elapsed_us {
            return Err("first job finished after the run ended".into());
        }
        let series = self
            .series
            .iter()
            .map(|s| {
                Ok(Second {
                    read_ios: s.read_ios,
                    write_ios: s.write_ios,
                    read_bytes: s.read_bytes,
                    write_bytes: s.write_bytes,
                    trim_ios: s.trim_ios,
                    trim_bytes: s.trim_bytes,
                    lat: decode_hist(&s.lat, SECOND_BOUNDS)?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let engine = match self.engine.as_str() {
            "iscsi" => "iscsi",
            "multipath" => "multipath",
            "io_uring" => "io_uring",
            "psync" => "psync",
            _ => "unknown",
        };
        Ok((
            RunResult {
                read: dir_from_wire(&self.read)?,
                write: dir_from_wire(&self.write)?,
                trim: match &self.trim {
                    Some(t) => dir_from_wire(t)?,
                    None => DirStats::new(),
                },
                elapsed: Duration::from_micros(self.elapsed_us),
                series,
                paths: self.paths,
                error_samples: self.errors,
                engine,
                notes: self.notes,
                verify_id: self.verify_id,
                verified_bytes: self.verified_bytes,
                capacity: self.capacity,
                first_finish: Duration::from_micros(self.first_finish_us),
                counters: Default::default(),
            },
            self.timeline,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(values: &[u64]) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(DIR_BOUNDS.0, DIR_BOUNDS.1, DIR_BOUNDS.2).unwrap();
        for v in values {
            h.record(*v).unwrap();
        }
        h
    }

    #[test]
    fn histograms_round_trip_and_bad_ones_are_refused() {
        let h = hist(&[1_000, 2_000, 50_000, 1_000_000]);
        let s = encode_hist(&h);
        let back = decode_hist(&s, DIR_BOUNDS).unwrap();
        assert_eq!(back, h);
        // Other bounds: refused before the decoder allocates.
        assert!(decode_hist(&s, SECOND_BOUNDS)
            .unwrap_err()
            .contains("bounds"));
        let mut raw = base64::engine::general_purpose::STANDARD
            .decode(&s)
            .unwrap();
        // A payload length that lies.
        raw[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        let lie = base64::engine::general_purpose::STANDARD.encode(&raw);
        assert!(decode_hist(&lie, DIR_BOUNDS)
            .unwrap_err()
            .contains("payload"));
        // Huge bounds in the header.
        let mut raw = base64::engine::general_purpose::STANDARD
            .decode(&s)
            .unwrap();
        raw[24..32].copy_from_slice(&u64::MAX.to_be_bytes());
        let huge = base64::engine::general_purpose::STANDARD.encode(&raw);
        assert!(decode_hist(&huge, DIR_BOUNDS).is_err());
        for junk in ["", "!!!", "AAAA"] {
            assert!(decode_hist(junk, DIR_BOUNDS).is_err());
        }
        // The varint of u64::MAX (zig-zag i64::MIN) would make the decoder
        // overflow; it is refused first.
        let mut raw = base64::engine::general_purpose::STANDARD
            .decode(&s)
            .unwrap();
        raw.truncate(V2_HEADER);
        raw.extend_from_slice(&[0xff; 9]);
        raw[4..8].copy_from_slice(&9u32.to_be_bytes());
        let min = base64::engine::general_purpose::STANDARD.encode(&raw);
        assert!(decode_hist(&min, DIR_BOUNDS)
            .unwrap_err()
            .contains("out of range"));
    }

    /// Mutated and truncated frames of every message kind: typed errors or
    /// a message, never a panic (a deterministic fuzz loop).
    #[test]
    fn mutated_frames_never_panic() {
        use crate::node::frame::{decode, encode, FrameReader};
        let mut r = DirStats::new();
        for v in [1_000, 5_000, 70_000, 2_000_000] {
            r.ios += 1;
            r.lat.record(v).unwrap();
        }
        let mut sec = Second::new();
        sec.lat.record(3_000).unwrap();
        let run = RunResult {
            read: r.clone(),
            trim: r.clone(),
            write: r,
            elapsed: Duration::from_secs(1),
            series: vec![sec],
            paths: vec![PathStat {
                name: "a:1".into(),
                ios: 3,
                failed: None,
                group: Some(2),
                state: Some("standby".into()),
                retries: 1,
                failovers: 1,
            }],
            error_samples: vec!["e".into()],
            engine: "iscsi",
            notes: vec![],
            verify_id: Some(7),
            verified_bytes: 0,
            capacity: 1 << 20,
            first_finish: Duration::from_millis(900),
            counters: Default::default(),
        };
        let tl = vec![Sample {
            us: 10,
            ios: 1,
            bytes: 4096,
        }];
        let to_coord = [
            encode(&ToCoordinator::Result {
                result: Box::new(NodeRun::from_run(&run, tl)),
            }),
            encode(&ToCoordinator::Hello {
                version: VERSION,
                host: "h".into(),
            }),
            encode(&ToCoordinator::Progress {
                elapsed_ms: 1,
                ios: 2,
                bytes: 3,
            }),
        ];
        let to_server = [encode(&ToServer::Hello {
            version: VERSION,
            token: Some("t".into()),
        })];
        // The clean Result decodes back to the same numbers.
        let Ok(ToCoordinator::Result { result }) = decode(&to_coord[0][8..]) else {
            panic!("the clean result does not decode");
        };
        let (back, tl) = result.into_run().unwrap();
        assert_eq!((back.read.ios, back.read.lat.len()), (4, 4));
        assert_eq!(back.read.lat, run.read.lat);
        assert_eq!(back.trim.lat, run.trim.lat);
        assert_eq!(back.series[0].lat, run.series[0].lat);
        assert_eq!(
            (back.first_finish, back.verify_id),
            (run.first_finish, Some(7))
        );
        assert_eq!(tl.len(), 1);
        let mut rng = crate::workload::Rng::new(42);
        for i in 0..3000 {
            let (server_side, base) = if i % 4 == 3 {
                (true, &to_server[0])
            } else {
                (false, &to_coord[i % 3])
            };
            let mut f = base.clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(f.len() as u64) as usize;
                match rng.below(4) {
                    0 => f[at] = rng.next_u64() as u8,
                    1 => f[at] ^= 1 << rng.below(8),
                    2 => f.truncate(at.max(1)),
                    _ => f.insert(at, b"{}[]\",0\x00"[rng.below(8) as usize]),
                }
            }
            let mut rd = FrameReader::new(1 << 20);
            let mut src = &f[..];
            let body = loop {
                match rd.read_frame(&mut src) {
                    Ok(Some(b)) => break Some(b),
                    Ok(None) => {}
                    Err(_) => break None,
                }
            };
            let Some(body) = body else { continue };
            if server_side {
                let _ = decode::<ToServer>(&body);
            } else if let Ok(ToCoordinator::Result { result }) = decode::<ToCoordinator>(&body) {
                if let Ok((r, _)) = result.into_run() {
                    let mut all = DirStats::new();
                    all.merge(&r.read);
                    all.merge(&r.write);
                    let _ = all.lat.value_at_quantile(0.99);
                }
            }
        }
    }

    #[test]
    fn messages_refuse_unknown_fields_and_types() {
        let m: ToServer =
            serde_json::from_str(r#"{"msg":"hello","version":1,"token":null}"#).unwrap();
        assert!(matches!(m, ToServer::Hello { version: 1, .. }));
        for bad in [
            r#"{"msg":"hello","version":1,"token":null,"extra":1}"#,
            r#"{"msg":"rm_rf"}"#,
            r#"{"version":1}"#,
            r#"{"msg":"job","spec":{"name":"x"}}"#,
        ] {
            assert!(serde_json::from_str::<ToServer>(bad).is_err(), "{bad}");
        }
    }
}
