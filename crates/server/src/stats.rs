//! I/O statistics per LUN, per session and per portal, counted without
//! cost on the data path.
//!
//! # Who writes what
//!
//! Each connection owns a [`ConnStats`]: plain (non-atomic) counters and
//! latency histograms per LUN, written only by the connection's event loop
//! thread. Latency is measured per batch, not per command: the instant the
//! socket read returned is the start of every command framed from it (the
//! connection already takes it), and one clock read after the batch's
//! responses were handed to the socket is the end of every command that
//! completed in the batch. A command handed to an I/O thread carries its
//! start instant through the completion channel.
//!
//! Every [`PUBLISH_EVERY`] (and when it ends) the connection copies its
//! counters into its [`SessionStats`] under a mutex nobody else holds for
//! long: one uncontended lock per connection per publication, none per I/O.
//!
//! Readers ([`StatsRegistry::snapshot`]) merge the published copies of the
//! live sessions with the totals of the ended ones, so every counter only
//! grows (Prometheus counters must not go back when a session logs out).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::Serialize;

/// How often a connection publishes its counters.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// Latency histograms cover 1 ns ..= 60 s with 2 significant digits.
const HIST_MAX_NS: u64 = 60_000_000_000;

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_NS, 2).expect("valid histogram bounds")
}

/// What a SCSI command is, for the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
    Other,
}

impl IoKind {
    /// Classifies a CDB by its operation code: the READ and WRITE family
    /// (including WRITE AND VERIFY, WRITE SAME and COMPARE AND WRITE)
    /// count as I/O, the rest as other commands.
    #[inline]
    pub fn of(op: u8) -> IoKind {
        match op {
            0x08 | 0x28 | 0xa8 | 0x88 => IoKind::Read,
            0x0a | 0x2a | 0xaa | 0x8a | 0x2e | 0x8e | 0x41 | 0x93 | 0x89 => IoKind::Write,
            _ => IoKind::Other,
        }
    }
}

/// The counters of one LUN (as seen by one session, or merged).
#[derive(Clone, Debug)]
pub struct LunCounters {
    pub read_ops: u64,
    pub write_ops: u64,
    pub other_ops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Commands that ended with CHECK CONDITION.
    pub check_conditions: u64,
    /// Commands that ended with another non-GOOD status (BUSY,
    /// RESERVATION CONFLICT, TASK SET FULL).
    pub other_errors: u64,
    /// Sum of read and write latencies, nanoseconds (with the elapsed time,
    /// the average number of I/Os in flight: Little's law).
    pub read_lat_ns: u64,
    pub write_lat_ns: u64,
    pub read_hist: Histogram<u64>,
    pub write_hist: Histogram<u64>,
}

impl Default for LunCounters {
    fn default() -> Self {
        LunCounters {
            read_ops: 0,
            write_ops: 0,
            other_ops: 0,
            read_bytes: 0,
            write_bytes: 0,
            check_conditions: 0,
            other_errors: 0,
            read_lat_ns: 0,
            write_lat_ns: 0,
            read_hist: new_hist(),
            write_hist: new_hist(),
        }
    }
}

impl LunCounters {
    /// Counts one command.
    #[inline]
    pub fn record(&mut self, kind: IoKind, bytes: u32, status: u8, lat_ns: u64) {
        match kind {
            IoKind::Read => {
                self.read_ops += 1;
                self.read_bytes += u64::from(bytes);
                self.read_lat_ns += lat_ns;
                self.read_hist.saturating_record(lat_ns.max(1));
            }
            IoKind::Write => {
                self.write_ops += 1;
                self.write_bytes += u64::from(bytes);
                self.write_lat_ns += lat_ns;
                self.write_hist.saturating_record(lat_ns.max(1));
            }
            IoKind::Other => self.other_ops += 1,
        }
        match status {
            0 => {}
            scsi::status::CHECK_CONDITION => self.check_conditions += 1,
            _ => self.other_errors += 1,
        }
    }

    /// Adds `o` into `self`.
    pub fn merge(&mut self, o: &LunCounters) {
        self.read_ops += o.read_ops;
        self.write_ops += o.write_ops;
        self.other_ops += o.other_ops;
        self.read_bytes += o.read_bytes;
        self.write_bytes += o.write_bytes;
        self.check_conditions += o.check_conditions;
        self.other_errors += o.other_errors;
        self.read_lat_ns += o.read_lat_ns;
        self.write_lat_ns += o.write_lat_ns;
        // Same bounds everywhere: adding cannot fail.
        let _ = self.read_hist.add(&o.read_hist);
        let _ = self.write_hist.add(&o.write_hist);
    }

    /// Copies `o` into `self`, reusing the histograms' memory.
    fn copy_from(&mut self, o: &LunCounters) {
        self.read_ops = o.read_ops;
        self.write_ops = o.write_ops;
        self.other_ops = o.other_ops;
        self.read_bytes = o.read_bytes;
        self.write_bytes = o.write_bytes;
        self.check_conditions = o.check_conditions;
        self.other_errors = o.other_errors;
        self.read_lat_ns = o.read_lat_ns;
        self.write_lat_ns = o.write_lat_ns;
        self.read_hist.reset();
        let _ = self.read_hist.add(&o.read_hist);
        self.write_hist.reset();
        let _ = self.write_hist.add(&o.write_hist);
    }

    /// All commands counted.
    pub fn ops(&self) -> u64 {
        self.read_ops + self.write_ops + self.other_ops
    }
}

/// What the session list shows of a session: fixed at login.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SessionInfo {
    /// Unique while the server runs.
    pub id: u64,
    /// `iscsi`, or `nvme-tcp` for an NVMe/TCP I/O queue (then the
    /// initiator is the host NQN, the ISID `CNTLID.QID`, the TSIH the
    /// controller ID, and the LUNs are NSID − 1).
    pub protocol: &'static str,
    pub initiator: String,
    pub initiator_alias: Option<String>,
    /// Hex, 12 digits.
    pub isid: String,
    pub tsih: u16,
    pub target: String,
    pub peer: String,
    /// The portal (listen address) and its group tag.
    pub portal: String,
    pub tpgt: u16,
    /// Login time, seconds since the Unix epoch.
    pub since: u64,
    pub header_digest: bool,
    pub data_digest: bool,
    /// MaxRecvDataSegmentLength declared by the initiator (what we send).
    pub send_max_data_segment: u32,
    /// MaxRecvDataSegmentLength we declared (what we accept).
    pub recv_max_data_segment: u32,
    pub max_burst: u32,
    pub first_burst: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub max_outstanding_r2t: u16,
    /// The command window (MaxCmdSN − ExpCmdSN + 1 when idle).
    pub queue_depth: u32,
}

/// What a connection last published.
#[derive(Debug)]
pub struct Published {
    pub at: Instant,
    /// Per LUN number.
    pub luns: BTreeMap<u16, LunCounters>,
    /// Commands received and not yet answered, at publication.
    pub in_flight: u32,
    /// The most commands in flight since login.
    pub max_in_flight: u32,
    /// Reject PDUs sent.
    pub rejects: u64,
}

/// One session's shared statistics: its fixed description and its last
/// published counters.
#[derive(Debug)]
pub struct SessionStats {
    pub info: SessionInfo,
    pub published: Mutex<Published>,
}

/// Counters of one portal, updated once per connection event (never per
/// I/O).
#[derive(Clone, Debug, Default, Serialize)]
pub struct PortalEvents {
    pub connections: u64,
    pub logins: u64,
    pub login_failures: u64,
    /// Connections that ended other than by logout or shutdown.
    pub dropped: u64,
}

#[derive(Default)]
struct Inner {
    live: Vec<Arc<SessionStats>>,
    /// Totals of ended sessions per (target, LUN).
    retired_luns: BTreeMap<(String, u16), LunCounters>,
    /// Totals of ended sessions per portal group tag.
    retired_portals: BTreeMap<u16, LunCounters>,
    retired_rejects: BTreeMap<u16, u64>,
    portals: BTreeMap<u16, PortalEvents>,
    next_id: u64,
}

/// Every session's statistics, and the totals of sessions gone.
#[derive(Default)]
pub struct StatsRegistry {
    inner: Mutex<Inner>,
    started: Option<Instant>,
}

impl std::fmt::Debug for StatsRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsRegistry").finish_non_exhaustive()
    }
}

/// Everything counted, merged.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub at: Option<Instant>,
    pub uptime: Duration,
    /// Per (target, LUN).
    pub luns: BTreeMap<(String, u16), LunCounters>,
    /// Per portal group tag: I/O of its sessions.
    pub portals: BTreeMap<u16, LunCounters>,
    pub portal_events: BTreeMap<u16, PortalEvents>,
    pub portal_rejects: BTreeMap<u16, u64>,
    pub sessions: Vec<SessionSnapshot>,
}

/// One live session, merged over its LUNs.
#[derive(Debug)]
pub struct SessionSnapshot {
    pub info: SessionInfo,
    pub total: LunCounters,
    pub luns: BTreeMap<u16, LunCounters>,
    pub in_flight: u32,
    pub max_in_flight: u32,
    pub rejects: u64,
}

impl StatsRegistry {
    pub fn new() -> Self {
        StatsRegistry {
            inner: Mutex::default(),
            started: Some(Instant::now()),
        }
    }

    /// A fresh session id.
    pub fn next_id(&self) -> u64 {
        let mut i = self.inner.lock();
        i.next_id += 1;
        i.next_id
    }

    /// Counts a connection event on portal `tpgt`.
    pub fn portal_event(&self, tpgt: u16, f: impl FnOnce(&mut PortalEvents)) {
        f(self.inner.lock().portals.entry(tpgt).or_default());
    }

    /// Registers a session that entered full feature phase.
    pub fn register(&self, info: SessionInfo) -> Arc<SessionStats> {
        let s = Arc::new(SessionStats {
            info,
            published: Mutex::new(Published {
                at: Instant::now(),
                luns: BTreeMap::new(),
                in_flight: 0,
                max_in_flight: 0,
                rejects: 0,
            }),
        });
        self.inner.lock().live.push(s.clone());
        s
    }

    /// Moves an ended session's final counters to the totals.
    pub fn retire(&self, s: &Arc<SessionStats>) {
        let p = s.published.lock();
        let mut i = self.inner.lock();
        i.live.retain(|x| !Arc::ptr_eq(x, s));
        let tpgt = s.info.tpgt;
        for (lun, c) in &p.luns {
            i.retired_luns
                .entry((s.info.target.clone(), *lun))
                .or_default()
                .merge(c);
            i.retired_portals.entry(tpgt).or_default().merge(c);
        }
        *i.retired_rejects.entry(tpgt).or_default() += p.rejects;
    }

    /// Merges everything counted so far.
    pub fn snapshot(&self) -> Snapshot {
        let (live, mut snap) = {
            let i = self.inner.lock();
            (
                i.live.clone(),
                Snapshot {
                    at: Some(Instant::now()),
                    uptime: self.started.map(|s| s.elapsed()).unwrap_or_default(),
                    luns: i.retired_luns.clone(),
                    portals: i.retired_portals.clone(),
                    portal_events: i.portals.clone(),
                    portal_rejects: i.retired_rejects.clone(),
                    sessions: Vec::new(),
                },
            )
        };
        for s in live {
            let p = s.published.lock();
            let mut total = LunCounters::default();
            for (lun, c) in &p.luns {
                total.merge(c);
                snap.luns
                    .entry((s.info.target.clone(), *lun))
                    .or_default()
                    .merge(c);
            }
            snap.portals.entry(s.info.tpgt).or_default().merge(&total);
            *snap.portal_rejects.entry(s.info.tpgt).or_default() += p.rejects;
            snap.sessions.push(SessionSnapshot {
                info: s.info.clone(),
                total,
                luns: p.luns.clone(),
                in_flight: p.in_flight,
                max_in_flight: p.max_in_flight,
                rejects: p.rejects,
            });
        }
        snap
    }
}

/// A command whose latency is measured when the batch it completed in has
/// been sent.
#[derive(Clone, Copy, Debug)]
struct Pending {
    lun: u16,
    kind: IoKind,
    status: u8,
    bytes: u32,
    start: Instant,
}

/// A connection's own counters (see the module documentation).
pub struct ConnStats {
    luns: Vec<Option<Box<LunCounters>>>,
    pending: Vec<Pending>,
    shared: Option<Arc<SessionStats>>,
    max_in_flight: u32,
    in_flight: u32,
    rejects: u64,
    dirty: bool,
}

impl ConnStats {
    /// Counters published to `shared` (none: a discovery session, counted
    /// nowhere).
    pub fn new(shared: Option<Arc<SessionStats>>) -> Self {
        ConnStats {
            luns: Vec::new(),
            pending: Vec::with_capacity(256),
            shared,
            max_in_flight: 0,
            in_flight: 0,
            rejects: 0,
            dirty: false,
        }
    }

    /// Notes a completed command that started at `start`; its latency ends
    /// at the next [`ConnStats::sent`].
    #[inline]
    pub fn completed(&mut self, lun: u16, op: u8, bytes: u32, status: u8, start: Instant) {
        self.completed_kind(lun, IoKind::of(op), bytes, status, start);
    }

    /// [`ConnStats::completed`] of a command already classified (`status`:
    /// SCSI's, 0 for success).
    #[inline]
    pub fn completed_kind(
        &mut self,
        lun: u16,
        kind: IoKind,
        bytes: u32,
        status: u8,
        start: Instant,
    ) {
        if self.shared.is_some() {
            self.pending.push(Pending {
                lun,
                kind,
                status,
                bytes,
                start,
            });
        }
    }

    /// The responses of the pending commands were handed to the socket;
    /// `in_flight` commands remain and `rejects` Reject PDUs were sent so
    /// far.
    #[inline]
    pub fn sent(&mut self, in_flight: u32, rejects: u64) {
        self.in_flight = in_flight;
        self.rejects = rejects;
        self.max_in_flight = self.max_in_flight.max(in_flight);
        if self.pending.is_empty() {
            return;
        }
        let now = Instant::now();
        for p in self.pending.drain(..) {
            let i = usize::from(p.lun);
            if self.luns.len() <= i {
                self.luns.resize_with(i + 1, || None);
            }
            let c = self.luns[i].get_or_insert_with(Box::default);
            let lat = now.saturating_duration_since(p.start).as_nanos();
            c.record(
                p.kind,
                p.bytes,
                p.status,
                u64::try_from(lat).unwrap_or(u64::MAX),
            );
        }
        self.dirty = true;
    }

    /// The connection ended: counts what is pending and publishes.
    pub fn finish(&mut self) {
        self.sent(0, self.rejects);
        self.publish();
    }

    /// Copies the counters to the shared view.
    pub fn publish(&mut self) {
        let Some(s) = &self.shared else { return };
        let mut p = s.published.lock();
        p.at = Instant::now();
        p.in_flight = self.in_flight;
        p.max_in_flight = self.max_in_flight;
        p.rejects = self.rejects;
        if !self.dirty {
            return;
        }
        for (i, c) in self.luns.iter().enumerate() {
            if let Some(c) = c {
                p.luns.entry(i as u16).or_default().copy_from(c);
            }
        }
        self.dirty = false;
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A session's description for tests.
    pub(crate) fn info(id: u64, target: &str, tpgt: u16) -> SessionInfo {
        SessionInfo {
            id,
            protocol: "iscsi",
            initiator: "iqn.x:i".into(),
            initiator_alias: None,
            isid: "800000000001".into(),
            tsih: 1,
            target: target.into(),
            peer: "127.0.0.1:1".into(),
            portal: "127.0.0.1:3260".into(),
            tpgt,
            since: 0,
            header_digest: false,
            data_digest: false,
            send_max_data_segment: 0,
            recv_max_data_segment: 0,
            max_burst: 0,
            first_burst: 0,
            immediate_data: true,
            initial_r2t: false,
            max_outstanding_r2t: 1,
            queue_depth: 128,
        }
    }

    #[test]
    fn classifies_opcodes() {
        assert_eq!(IoKind::of(0x28), IoKind::Read);
        assert_eq!(IoKind::of(0x88), IoKind::Read);
        assert_eq!(IoKind::of(0x2a), IoKind::Write);
        assert_eq!(IoKind::of(0x89), IoKind::Write);
        assert_eq!(IoKind::of(0x12), IoKind::Other);
    }

    #[test]
    fn counts_latency_at_send_and_merges_sessions() {
        let reg = StatsRegistry::new();
        let a = reg.register(info(1, "iqn.t:a", 1));
        let b = reg.register(info(2, "iqn.t:a", 2));
        let mut ca = ConnStats::new(Some(a.clone()));
        let mut cb = ConnStats::new(Some(b.clone()));
        let t0 = Instant::now() - Duration::from_micros(50);
        ca.completed(0, 0x28, 4096, 0, t0);
        ca.completed(0, 0x2a, 8192, 0, t0);
        ca.completed(1, 0x28, 512, 2, t0);
        // Nothing counted until the batch is sent.
        ca.publish();
        assert!(reg.snapshot().luns.is_empty());
        ca.sent(3, 2);
        ca.publish();
        cb.completed(0, 0x28, 4096, 0x18, t0);
        cb.sent(1, 0);
        cb.publish();
        let s = reg.snapshot();
        let l0 = &s.luns[&("iqn.t:a".to_string(), 0)];
        assert_eq!((l0.read_ops, l0.write_ops), (2, 1));
        assert_eq!((l0.read_bytes, l0.write_bytes), (8192, 8192));
        assert_eq!(l0.other_errors, 1);
        assert!(l0.read_lat_ns >= 2 * 50_000, "{}", l0.read_lat_ns);
        assert_eq!(l0.read_hist.len(), 2);
        assert!(l0.read_hist.value_at_quantile(0.5) >= 49_000);
        let l1 = &s.luns[&("iqn.t:a".to_string(), 1)];
        assert_eq!(l1.check_conditions, 1);
        assert_eq!(s.portals[&1].ops(), 3);
        assert_eq!(s.portals[&2].ops(), 1);
        assert_eq!(s.portal_rejects[&1], 2);
        assert_eq!(s.sessions.len(), 2);
        assert_eq!(s.sessions[0].max_in_flight, 3);
        // A session that ends keeps its counts in the totals.
        reg.retire(&a);
        let s2 = reg.snapshot();
        assert_eq!(s2.sessions.len(), 1);
        let l0 = &s2.luns[&("iqn.t:a".to_string(), 0)];
        assert_eq!((l0.read_ops, l0.write_ops), (2, 1));
        assert_eq!(s2.portals[&1].ops(), 3);
        assert_eq!(s2.portal_rejects[&1], 2);
    }

    #[test]
    fn discovery_sessions_count_nothing() {
        let mut c = ConnStats::new(None);
        c.completed(0, 0x28, 1, 0, Instant::now());
        assert!(c.pending.is_empty());
        c.finish();
    }
}
