//! One LU over several paths (`--multipath rr[:N]|lqd`): one session per
//! iscsi:// URL, I/Os spread by a path selection policy, failed paths
//! dropped and their I/Os re-submitted on the others.
//!
//! At open every path must report the same LU identity (the NAA designator
//! of VPD page 0x83) and capacity; anything else is refused, since
//! spreading I/O over two different LUs silently corrupts data.
//!
//! # ALUA
//!
//! When the target reports ALUA (INQUIRY TPGS ≠ 0 and REPORT TARGET PORT
//! GROUPS answered), the engine behaves like Linux `scsi_dh_alua` with
//! dm-multipath: each path's target port group comes from VPD 0x83, the
//! policy chooses only among live paths of active/optimized groups (else
//! active/non-optimized ones), and standby, unavailable or transitioning
//! paths get no I/O. An I/O answered NOT READY 04/0A-0C or UNIT ATTENTION
//! 2A/06, 29/xx or 3F/0E is not an error: it is queued again, the states
//! are read again through a live path before more I/O goes out, and when
//! no live path is active the engine sends SET TARGET PORT GROUPS (explicit
//! ALUA) to make a standby path's group active/optimized, or waits for the
//! target to do it. An I/O retried for [`RETRY_DEADLINE`] without any I/O
//! completing fails with the last sense. See [`alua`] for the states.
//!
//! Without ALUA the paths are equal, as before.
//!
//! Waiting: with one busy path the engine blocks in [`Connection::wait`]
//! like the single-path engine. With several it sends what each path has
//! queued, then poll(2)s the sockets of the paths with commands in flight
//! and drains the readable ones without blocking
//! ([`Connection::poll_completions`]).

pub mod alua;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use initiator::scsi::{self, AluaState, PathCondition};
use initiator::{Connection, DataDir, TaskResult, Url};
use iscsi_wire::pdu::Itt;

use self::alua::{Groups, Next, PathView};
use crate::engine::{login_lun, read_capacity, task_result, Done, Engine, Io, PathStat};
use crate::spec::Multipath;

/// How long to wait for any completion before giving up.
const STALL_MS: i32 = 30_000;
/// How long I/Os are retried (sense conditions, no active path) without
/// any I/O completing before they fail.
pub const RETRY_DEADLINE: Duration = Duration::from_secs(30);
/// Allocation length of REPORT TARGET PORT GROUPS.
const RTPG_ALLOC: u32 = 4096;

struct Path {
    name: String,
    conn: Option<Connection>,
    /// ITT -> the I/O and its payload (kept for re-submission).
    inflight: HashMap<u32, (Io, Bytes)>,
    ios: u64,
    failed: Option<String>,
    /// Target port group and relative target port (VPD 0x83).
    tpg: Option<u16>,
    rel_port: Option<u16>,
    retries: u64,
    failovers: u64,
}

/// Where the engine is with the target port groups' states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Known: I/O goes to the usable paths.
    Ready,
    /// To be read again, not before the instant.
    Stale(Instant),
    /// REPORT TARGET PORT GROUPS in flight on a path (index, ITT).
    Reading(usize, u32),
    /// SET TARGET PORT GROUPS in flight on a path (index, ITT).
    Activating(usize, u32),
}

/// The ALUA view of a target that has it.
struct AluaCtl {
    groups: Groups,
    phase: Phase,
    /// SET TARGET PORT GROUPS may be sent (TPGS 1xb, never refused).
    stpg: bool,
    /// Consecutive waits, for the back-off.
    waits: u32,
    /// A condition came back while REPORT TARGET PORT GROUPS was in
    /// flight: its answer may predate the change, so read once more.
    again: bool,
}

/// A LU over several paths.
pub struct MultipathEngine {
    paths: Vec<Path>,
    policy: Multipath,
    lun: u16,
    bs: u32,
    capacity: u64,
    keep_data: bool,
    rr_cur: usize,
    rr_count: u32,
    /// I/Os of failed paths, and retried ones, waiting for a usable path.
    pending: VecDeque<(Io, Bytes)>,
    scratch: Vec<(Itt, TaskResult)>,
    pollfds: Vec<libc::pollfd>,
    pollidx: Vec<usize>,
    alua: Option<AluaCtl>,
    /// Paths the policy may choose (live ones of the best ALUA tier).
    allowed: Vec<bool>,
    /// Since when I/Os have been retried without any I/O completing.
    stuck_since: Option<Instant>,
    /// The last retried condition, for the error at the deadline.
    last_sense: String,
    /// No I/O before this instant (NOT READY without ALUA).
    hold_until: Option<Instant>,
    /// How long to poll the busy paths' sockets before sleeping in poll(2).
    busy_poll: Duration,
}

/// What one path reported at open.
struct Opened {
    conn: Connection,
    lun: u16,
    naa: String,
    /// (capacity, block size), `None` when the path's state refused READ
    /// CAPACITY (standby, unavailable).
    capacity: Option<(u64, u32)>,
    tpg: Option<u16>,
    rel_port: Option<u16>,
    tpgs: u8,
}

fn open_path(url: &Url, initiator_name: &str) -> Result<Opened, String> {
    let (mut conn, lun) = login_lun(url, initiator_name)?;
    let e = |e: initiator::Error| format!("{url}: {e}");
    let id = conn
        .execute(lun, &scsi::inquiry(Some(0x83), 1024), DataDir::Read(1024))
        .map_err(e)?;
    let naa = match (id.status, scsi::naa_id(&id.data)) {
        (Some(0), Some(n)) => n,
        _ => {
            return Err(format!(
                "--multipath: {url} reports no NAA designator in VPD page 0x83, so it \
                 cannot be shown to be the same LU as the other paths; refusing"
            ))
        }
    };
    let (tpg, rel_port) = scsi::target_port_ids(&id.data);
    let std = conn
        .execute(lun, &scsi::inquiry(None, 96), DataDir::Read(96))
        .map_err(e)?;
    let tpgs = if std.status == Some(0) {
        scsi::tpgs(&std.data)
    } else {
        0
    };
    let mut capacity = None;
    let deadline = Instant::now() + crate::engine::NOT_READY_DEADLINE;
    let mut tries = 0;
    loop {
        tries += 1;
        let r = read_capacity(&mut conn, lun).map_err(e)?;
        if let (Some(0), Some((blocks, bs))) = (r.status, scsi::parse_capacity16(&r.data)) {
            capacity = Some((blocks * u64::from(bs), bs));
            break;
        }
        match PathCondition::of_sense(&r.sense) {
            Some(PathCondition::Standby | PathCondition::Unavailable)
            | Some(PathCondition::Transitioning)
                if tpgs != 0 =>
            {
                break
            }
            // The LU's storage is still opening: asked again for as long
            // as an I/O would be.
            Some(PathCondition::BecomingReady) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(300));
            }
            Some(_) if tries < 3 => {}
            Some(_) => break,
            None => {
                return Err(format!(
                    "{url}: READ CAPACITY(16) failed ({})",
                    task_result(&r).err().unwrap_or_default()
                ))
            }
        }
    }
    Ok(Opened {
        conn,
        lun,
        naa,
        capacity,
        tpg,
        rel_port,
        tpgs,
    })
}

/// REPORT TARGET PORT GROUPS at open, through one path: `None` when the
/// target does not support it.
fn read_groups(conn: &mut Connection, lun: u16) -> Result<Option<Groups>, String> {
    for _ in 0..5 {
        let r = conn
            .execute(
                lun,
                &scsi::report_target_port_groups(RTPG_ALLOC),
                DataDir::Read(RTPG_ALLOC),
            )
            .map_err(|e| e.to_string())?;
        if r.status == Some(0) {
            return match scsi::parse_rtpg(&r.data) {
                Ok(d) => Ok(Some(Groups::from_rtpg(&d))),
                Err(e) => Err(format!("REPORT TARGET PORT GROUPS data: {e:?}")),
            };
        }
        match scsi::sense_code(&r.sense) {
            Some((0x6, _, _)) => continue,
            _ => return Ok(None),
        }
    }
    Ok(None)
}

/// At open, when no path could read the capacity: SET TARGET PORT GROUPS
/// on a standby or unavailable path (explicit ALUA), then the states and
/// the capacity through it.
fn activate_at_open(
    paths: &mut [Path],
    lun: u16,
    a: &mut AluaCtl,
) -> Result<Option<(String, u64, u32)>, String> {
    let views: Vec<PathView> = paths.iter().map(view).collect();
    let Next::Activate { path, tpg } = alua::decide(&views, &a.groups, a.stpg) else {
        return Ok(None);
    };
    let p = &mut paths[path];
    let Some(c) = p.conn.as_mut() else {
        return Ok(None);
    };
    let e = |e: initiator::Error| format!("{}: {e}", p.name);
    let list = scsi::stpg_list(tpg, AluaState::ActiveOptimized);
    let r = c
        .execute(
            lun,
            &scsi::set_target_port_groups(list.len() as u32),
            DataDir::Write(Bytes::copy_from_slice(&list)),
        )
        .map_err(e)?;
    if r.status != Some(0) {
        return Ok(None);
    }
    p.failovers += 1;
    if let Some(g) = read_groups(c, lun).map_err(|m| format!("{}: {m}", p.name))? {
        a.groups = g;
    }
    let r = read_capacity(c, lun).map_err(e)?;
    Ok(scsi::parse_capacity16(&r.data)
        .filter(|_| r.status == Some(0))
        .map(|(blocks, bs)| (p.name.clone(), blocks * u64::from(bs), bs)))
}

impl MultipathEngine {
    /// Logs in on every URL, checks they are one LU and reads the ALUA
    /// target port groups.
    pub fn open(
        urls: &[Url],
        initiator_name: &str,
        keep_data: bool,
        policy: Multipath,
        busy_poll: Duration,
    ) -> Result<MultipathEngine, String> {
        let mut paths = Vec::new();
        let mut first: Option<(String, String)> = None;
        let mut cap: Option<(String, u64, u32)> = None;
        let mut lun0 = 0;
        let mut tpgs = 0;
        for url in urls {
            let mut o = open_path(url, initiator_name)?;
            o.conn.set_busy_poll(busy_poll);
            match &first {
                None => {
                    first = Some((url.to_string(), o.naa.clone()));
                    lun0 = o.lun;
                    tpgs = o.tpgs;
                }
                Some((f, n)) => {
                    if *n != o.naa {
                        return Err(format!(
                            "--multipath: {f} is LU {n} but {url} is LU {}: the paths \
                             are not the same LU; refusing to spread I/O over them",
                            o.naa
                        ));
                    }
                }
            }
            if let Some((capacity, bs)) = o.capacity {
                match &cap {
                    None => cap = Some((url.to_string(), capacity, bs)),
                    Some((f, c, b)) if (*c, *b) != (capacity, bs) => {
                        return Err(format!(
                            "--multipath: {f} and {url} report the same NAA {} but \
                             different capacities ({c} bytes in {b}-byte blocks vs {capacity} \
                             in {bs}); refusing",
                            o.naa
                        ));
                    }
                    Some(_) => {}
                }
            }
            paths.push(Path {
                name: url.addr(),
                conn: Some(o.conn),
                inflight: HashMap::new(),
                ios: 0,
                failed: None,
                tpg: o.tpg,
                rel_port: o.rel_port,
                retries: 0,
                failovers: 0,
            });
        }
        if paths.is_empty() {
            return Err("--multipath: no paths".into());
        }
        let mut alua = None;
        if tpgs != 0 {
            let p = &mut paths[0];
            if let Some(c) = p.conn.as_mut() {
                let groups = read_groups(c, lun0).map_err(|e| format!("{}: {e}", p.name))?;
                alua = groups.map(|groups| AluaCtl {
                    groups,
                    // Decided below, once every path is known.
                    phase: Phase::Stale(Instant::now()),
                    stpg: tpgs & 0b10 != 0,
                    waits: 0,
                    again: false,
                });
            }
        }
        if cap.is_none() {
            // Every path is standby or unavailable: activate one (explicit
            // ALUA) and read the capacity through it, as scsi_dh_alua
            // activates a path before sd reads the capacity.
            if let Some(a) = &mut alua {
                cap = activate_at_open(&mut paths, lun0, a)?;
            }
        }
        let (_, capacity, bs) = cap.ok_or(
            "--multipath: no path answered READ CAPACITY (every path is standby or \
             unavailable)",
        )?;
        let n = paths.len();
        let mut e = MultipathEngine {
            paths,
            policy,
            lun: lun0,
            bs,
            capacity,
            keep_data,
            rr_cur: 0,
            rr_count: 0,
            pending: VecDeque::new(),
            scratch: Vec::new(),
            pollfds: Vec::new(),
            pollidx: Vec::new(),
            alua,
            allowed: vec![true; n],
            stuck_since: None,
            last_sense: String::new(),
            hold_until: None,
            busy_poll,
        };
        if let Some(a) = &mut e.alua {
            // The states just read: ready when a path is active, else the
            // first reap activates a group or waits.
            let views: Vec<PathView> = e.paths.iter().map(view).collect();
            if alua::best_tier(&views, &a.groups).is_some() {
                a.phase = Phase::Ready;
            }
        }
        e.refresh_allowed();
        Ok(e)
    }

    fn ready(&self, i: usize) -> bool {
        self.allowed[i] && self.paths[i].conn.as_ref().is_some_and(|c| c.can_submit())
    }

    /// Recomputes which paths the policy may choose.
    fn refresh_allowed(&mut self) {
        match &self.alua {
            None => self.allowed.iter_mut().for_each(|a| *a = true),
            Some(a) if a.phase != Phase::Ready => self.allowed.iter_mut().for_each(|a| *a = false),
            Some(a) => {
                let views: Vec<PathView> = self.paths.iter().map(view).collect();
                self.allowed = alua::usable(&views, &a.groups);
            }
        }
    }

    /// The path for the next I/O, by policy, among usable paths with room.
    fn pick(&mut self) -> Option<usize> {
        if self.hold_until.is_some() {
            return None;
        }
        let n = self.paths.len();
        match self.policy {
            Multipath::RoundRobin(per) => {
                for k in 0..n {
                    let i = (self.rr_cur + k) % n;
                    if self.ready(i) {
                        if k > 0 {
                            self.rr_cur = i;
                            self.rr_count = 0;
                        }
                        self.rr_count += 1;
                        if self.rr_count >= per {
                            self.rr_count = 0;
                            self.rr_cur = (i + 1) % n;
                        }
                        return Some(i);
                    }
                }
                None
            }
            Multipath::LeastQueueDepth => (0..n)
                .filter(|&i| self.ready(i))
                .min_by_key(|&i| self.paths[i].inflight.len()),
        }
    }

    fn send(&mut self, i: usize, io: Io, payload: Bytes) {
        let (cdb, n, dir) = crate::engine::scsi_io(&io, self.bs, &payload);
        let p = &mut self.paths[i];
        let Some(conn) = p.conn.as_mut() else {
            self.pending.push_back((io, payload));
            return;
        };
        let itt = conn.submit(self.lun, &cdb[..n], dir);
        p.inflight.insert(itt.0, (io, payload));
    }

    /// Drops a path: its I/Os go back to the queue for the others, and the
    /// groups' states are read again (through another path).
    fn fail(&mut self, i: usize, why: String) {
        let p = &mut self.paths[i];
        if let Some(c) = p.conn.take() {
            c.shutdown();
        }
        p.failed = Some(format!(
            "{why} (after {} I/Os, {} re-submitted)",
            p.ios,
            p.inflight.len()
        ));
        let mut moved: Vec<(Io, Bytes)> = p.inflight.drain().map(|(_, v)| v).collect();
        moved.sort_by_key(|(io, _)| io.slot);
        self.pending.extend(moved);
        if let Some(a) = &mut self.alua {
            match a.phase {
                Phase::Reading(j, _) | Phase::Activating(j, _) if j != i => {}
                _ => a.phase = Phase::Stale(Instant::now()),
            }
        }
        self.refresh_allowed();
    }

    fn live(&self) -> usize {
        self.paths.iter().filter(|p| p.conn.is_some()).count()
    }

    fn all_failed(&self) -> String {
        let why: Vec<String> = self
            .paths
            .iter()
            .map(|p| format!("{}: {}", p.name, p.failed.as_deref().unwrap_or("?")))
            .collect();
        format!("all {} paths failed: {}", self.paths.len(), why.join("; "))
    }

    /// Takes path `i`'s completions after a wait or poll that returned
    /// `r`; a failure fails the path, after the completions it delivered.
    fn settle(&mut self, i: usize, r: Result<(), initiator::Error>, done: &mut Vec<Done>) {
        self.collect(i, done);
        if let Err(e) = r {
            self.fail(i, e.to_string());
        }
    }

    fn collect(&mut self, i: usize, done: &mut Vec<Done>) {
        let now = Instant::now();
        let mut scratch = std::mem::take(&mut self.scratch);
        for (itt, r) in scratch.drain(..) {
            if self.control_done(i, itt.0, &r, now) {
                continue;
            }
            let p = &mut self.paths[i];
            let Some((io, payload)) = p.inflight.remove(&itt.0) else {
                continue;
            };
            if r.status == Some(2) {
                if let Some(c) = PathCondition::of_sense(&r.sense) {
                    p.retries += 1;
                    self.last_sense = format!(
                        "{} ({c:?}, retried for {} s)",
                        task_result(&r).err().unwrap_or_default(),
                        RETRY_DEADLINE.as_secs()
                    );
                    let since = *self.stuck_since.get_or_insert(now);
                    if now.duration_since(since) < RETRY_DEADLINE {
                        self.pending.push_front((io, payload));
                        self.on_condition(c, now);
                        continue;
                    }
                    self.paths[i].ios += 1;
                    done.push(Done {
                        slot: io.slot,
                        result: Err(self.last_sense.clone()),
                        data: None,
                    });
                    continue;
                }
            }
            let p = &mut self.paths[i];
            p.ios += 1;
            if r.status == Some(0) {
                self.stuck_since = None;
            }
            done.push(Done {
                slot: io.slot,
                result: task_result(&r),
                data: self.keep_data.then_some(r.data),
            });
        }
        self.scratch = scratch;
    }

    /// An I/O came back with a condition to retry: stop sending and read
    /// the states again (ALUA), or hold back a little (no ALUA, NOT READY).
    fn on_condition(&mut self, c: PathCondition, now: Instant) {
        if c == PathCondition::BecomingReady {
            // Not about paths: the storage behind every one is slow.
            self.hold_until = Some(now + alua::BACKOFF_MAX);
            return;
        }
        let Some(a) = &mut self.alua else {
            if matches!(
                c,
                PathCondition::Transitioning | PathCondition::Standby | PathCondition::Unavailable
            ) {
                self.hold_until = Some(now + alua::BACKOFF_MAX);
            }
            return;
        };
        if matches!(a.phase, Phase::Reading(..)) {
            a.again = true;
        }
        if a.phase == Phase::Ready {
            let after = if c == PathCondition::Transitioning {
                alua::backoff(a.waits)
            } else {
                Duration::ZERO
            };
            a.phase = Phase::Stale(now + after);
            self.refresh_allowed();
        }
    }

    /// Handles the answer to an RTPG or STPG in flight; false when `itt`
    /// on path `i` is not one.
    fn control_done(&mut self, i: usize, itt: u32, r: &TaskResult, now: Instant) -> bool {
        let Some(a) = &mut self.alua else {
            return false;
        };
        match a.phase {
            Phase::Reading(j, t) if (j, t) == (i, itt) => {
                let parsed = (r.status == Some(0))
                    .then(|| scsi::parse_rtpg(&r.data).ok())
                    .flatten();
                match parsed {
                    Some(d) if std::mem::take(&mut a.again) => {
                        a.groups = Groups::from_rtpg(&d);
                        a.phase = Phase::Stale(now);
                    }
                    Some(d) => {
                        a.groups = Groups::from_rtpg(&d);
                        let views: Vec<PathView> = self.paths.iter().map(view).collect();
                        match alua::decide(&views, &a.groups, a.stpg) {
                            Next::Ready => {
                                a.phase = Phase::Ready;
                                a.waits = 0;
                            }
                            Next::Activate { path, tpg } => {
                                a.phase = Phase::Stale(now);
                                if let Some(c) = self.paths[path].conn.as_mut() {
                                    let list = scsi::stpg_list(tpg, AluaState::ActiveOptimized);
                                    let cdb = scsi::set_target_port_groups(list.len() as u32);
                                    let itt = c.submit(
                                        self.lun,
                                        &cdb,
                                        DataDir::Write(Bytes::copy_from_slice(&list)),
                                    );
                                    a.phase = Phase::Activating(path, itt.0);
                                }
                            }
                            Next::Wait => {
                                a.phase = Phase::Stale(now + alua::backoff(a.waits));
                                a.waits = a.waits.saturating_add(1);
                            }
                        }
                    }
                    None => {
                        // A unit attention on this nexus: read again at once;
                        // anything else: after a back-off.
                        let ua = scsi::sense_code(&r.sense).is_some_and(|(k, _, _)| k == 6);
                        let after = if ua {
                            Duration::ZERO
                        } else {
                            alua::backoff(a.waits)
                        };
                        a.waits = a.waits.saturating_add(u32::from(!ua));
                        a.phase = Phase::Stale(now + after);
                    }
                }
            }
            Phase::Activating(j, t) if (j, t) == (i, itt) => {
                if r.status == Some(0) {
                    self.paths[i].failovers += 1;
                    a.phase = Phase::Stale(now);
                } else {
                    // ILLEGAL REQUEST: not supported, or refused for good;
                    // the target may still move on its own.
                    if scsi::sense_code(&r.sense).is_some_and(|(k, _, _)| k == 5) {
                        a.stpg = false;
                    }
                    a.phase = Phase::Stale(now + alua::backoff(a.waits));
                    a.waits = a.waits.saturating_add(1);
                }
            }
            _ => return false,
        }
        self.refresh_allowed();
        true
    }

    /// Sends REPORT TARGET PORT GROUPS when the states are stale and their
    /// back-off is over, through a live path with room (an active one
    /// first); no-op otherwise.
    fn alua_step(&mut self, now: Instant) {
        let Some(a) = &mut self.alua else { return };
        if a.phase == Phase::Ready && !self.pending.is_empty() && !self.allowed.iter().any(|&u| u) {
            a.phase = Phase::Stale(now);
        }
        let Phase::Stale(at) = a.phase else { return };
        if now < at {
            return;
        }
        let views: Vec<PathView> = self.paths.iter().map(view).collect();
        let room = |i: &usize| self.paths[*i].conn.as_ref().is_some_and(|c| c.can_submit());
        let via = (0..self.paths.len())
            .filter(room)
            .min_by_key(|&i| alua::tier(a.groups.state_of(&views[i])).unwrap_or(9));
        let Some(i) = via else { return };
        let Some(c) = self.paths[i].conn.as_mut() else {
            return;
        };
        let itt = c.submit(
            self.lun,
            &scsi::report_target_port_groups(RTPG_ALLOC),
            DataDir::Read(RTPG_ALLOC),
        );
        a.phase = Phase::Reading(i, itt.0);
        self.refresh_allowed();
    }

    /// True when path `i` has a command of ours in flight.
    fn busy(&self, i: usize) -> bool {
        let p = &self.paths[i];
        if p.conn.is_none() {
            return false;
        }
        !p.inflight.is_empty()
            || self.alua.as_ref().is_some_and(
                |a| matches!(a.phase, Phase::Reading(j, _) | Phase::Activating(j, _) if j == i),
            )
    }

    /// Fails the run when queued I/Os have found no usable path for
    /// [`RETRY_DEADLINE`] (like every path failing): failing them one by
    /// one would only spin, since the next ones find no path either.
    fn expire(&self, now: Instant) -> Result<(), String> {
        let Some(since) = self.stuck_since else {
            return Ok(());
        };
        if now.duration_since(since) < RETRY_DEADLINE
            || self.pending.is_empty()
            || self.allowed.iter().any(|&u| u)
        {
            return Ok(());
        }
        let states: Vec<String> = self
            .path_stats()
            .iter()
            .map(|p| {
                let st = match (&p.failed, &p.state) {
                    (Some(_), _) => "failed",
                    (None, Some(s)) => s,
                    (None, None) => "held back",
                };
                format!("{} {st}", p.name)
            })
            .collect();
        let mut why = format!(
            "no usable path for {} s ({})",
            RETRY_DEADLINE.as_secs(),
            states.join(", ")
        );
        if !self.last_sense.is_empty() {
            why += &format!("; last: {}", self.last_sense);
        }
        Err(why)
    }

    /// How long to sleep when nothing is in flight but I/Os wait (for a
    /// back-off to end).
    fn idle_wait(&self, now: Instant) -> Duration {
        let until = match (&self.alua, self.hold_until) {
            (_, Some(h)) => Some(h),
            (Some(a), None) => match a.phase {
                Phase::Stale(at) => Some(at),
                _ => None,
            },
            (None, None) => None,
        };
        until.map_or(alua::BACKOFF_MIN, |u| {
            u.saturating_duration_since(now).min(alua::BACKOFF_MAX)
        })
    }
}

fn view(p: &Path) -> PathView {
    PathView {
        live: p.conn.is_some(),
        tpg: p.tpg,
        rel_port: p.rel_port,
    }
}

impl Engine for MultipathEngine {
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn block_size(&self) -> u32 {
        self.bs
    }
    fn can_submit(&self) -> bool {
        // While the ALUA states are being settled no path is usable: take
        // one I/O anyway so the job loop calls `reap`, which settles them.
        let settling = self.alua.as_ref().is_some_and(|a| a.phase != Phase::Ready);
        self.pending.is_empty() && (settling || (0..self.paths.len()).any(|i| self.ready(i)))
    }
    fn submit(&mut self, io: Io, payload: &Bytes) -> Result<(), String> {
        let payload = if io.op == crate::engine::Op::Write {
            payload.clone()
        } else {
            Bytes::new()
        };
        match self.pick() {
            Some(i) => self.send(i, io, payload),
            None => self.pending.push_back((io, payload)),
        }
        Ok(())
    }
    fn reap(&mut self, done: &mut Vec<Done>) -> Result<(), String> {
        if self.live() == 0 {
            return Err(self.all_failed());
        }
        let now = Instant::now();
        if self.hold_until.is_some_and(|h| now >= h) {
            self.hold_until = None;
        }
        if self.stuck_since.is_none() && !self.pending.is_empty() && self.alua.is_some() {
            // No usable path for queued I/Os counts against the deadline.
            if !self.allowed.iter().any(|&u| u) {
                self.stuck_since = Some(now);
            }
        }
        self.expire(now)?;
        self.alua_step(now);
        while let Some((io, payload)) = self.pending.pop_front() {
            match self.pick() {
                Some(i) => self.send(i, io, payload),
                None => {
                    self.pending.push_front((io, payload));
                    break;
                }
            }
        }
        let busy: Vec<usize> = (0..self.paths.len()).filter(|&i| self.busy(i)).collect();
        if busy.is_empty() {
            if !self.pending.is_empty() {
                std::thread::sleep(self.idle_wait(now));
            }
            return Ok(());
        }
        if busy.len() == 1 {
            let i = busy[0];
            let r = match self.paths[i].conn.as_mut() {
                Some(c) => c.wait(&mut self.scratch),
                None => Ok(()),
            };
            self.settle(i, r, done);
            return if self.live() == 0 {
                Err(self.all_failed())
            } else {
                Ok(())
            };
        }
        // Several paths busy: send everything, then wait on any of them.
        self.pollfds.clear();
        self.pollidx.clear();
        for &i in &busy {
            let r = self.paths[i].conn.as_mut().map(|c| c.flush());
            if let Some(Err(e)) = r {
                self.fail(i, e.to_string());
                continue;
            }
            if let Some(c) = &self.paths[i].conn {
                self.pollfds.push(libc::pollfd {
                    fd: c.raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                self.pollidx.push(i);
            }
        }
        if self.pollfds.is_empty() {
            return if self.live() == 0 {
                Err(self.all_failed())
            } else {
                Ok(())
            };
        }
        // Busy-polling (Connection::set_busy_poll) first, then sleeping.
        let spin_start = Instant::now();
        let n = loop {
            let spinning = spin_start.elapsed() < self.busy_poll;
            // SAFETY: `pollfds` is a valid array of `len` pollfd structures
            // that lives across the call.
            let n = unsafe {
                libc::poll(
                    self.pollfds.as_mut_ptr(),
                    self.pollfds.len() as libc::nfds_t,
                    if spinning { 0 } else { STALL_MS },
                )
            };
            if n != 0 || !spinning {
                break n;
            }
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(format!("poll: {e}"));
        }
        if n == 0 {
            return Err(format!(
                "no completion on any path for {} s",
                STALL_MS / 1000
            ));
        }
        for k in 0..self.pollfds.len() {
            if self.pollfds[k].revents == 0 {
                continue;
            }
            let i = self.pollidx[k];
            let r = match self.paths[i].conn.as_mut() {
                Some(c) => c.poll_completions(&mut self.scratch),
                None => Ok(()),
            };
            self.settle(i, r, done);
        }
        if self.live() == 0 {
            return Err(self.all_failed());
        }
        Ok(())
    }
    fn path_stats(&self) -> Vec<PathStat> {
        self.paths
            .iter()
            .map(|p| {
                let v = view(p);
                let (group, state) = match &self.alua {
                    Some(a) => (
                        a.groups.group_of(&v),
                        Some(a.groups.state_of(&v).name().to_string()),
                    ),
                    None => (None, None),
                };
                PathStat {
                    name: p.name.clone(),
                    ios: p.ios,
                    failed: p.failed.clone(),
                    group,
                    state,
                    retries: p.retries,
                    failovers: p.failovers,
                }
            })
            .collect()
    }
}
