//! Subsystems and their controllers (NVMe over Fabrics 1.1, "Controller
//! Model", "Connect Command and Response"; NVM Express Base Specification
//! 2.0, "Controller Registers", "Keep Alive"): who may connect to what, the
//! dynamic controller model (a controller made for each admin queue's
//! Connect, its I/O queues joining it by CNTLID), the controller
//! properties a host reads and writes with Property Get/Set, and the keep
//! alive timer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use nvme_tcp_wire::capsule::{ConnectData, Sqe, Status};
use parking_lot::Mutex;
use volume::access::{AccessState, PortGroups};
use volume::Volume;

/// The well-known discovery subsystem NQN.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Entries of an I/O submission queue at most (CAP.MQES + 1).
pub const MAX_QUEUE_ENTRIES: u16 = 1024;
/// Entries of the admin submission queue at most.
pub const MAX_ADMIN_ENTRIES: u16 = 32;
/// I/O queues a controller grants at most.
pub const MAX_IO_QUEUES: u16 = 128;

/// Property offsets (Base 2.0, "Controller Registers").
pub mod prop {
    pub const CAP: u32 = 0x00;
    pub const VS: u32 = 0x08;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1c;
    pub const NSSR: u32 = 0x20;
}

/// The version reported (VS and Identify Controller VER): 2.0.0.
pub const VERSION: u32 = 0x0002_0000;

/// The namespaces of a subsystem: the LUNs of an iSCSI target, NSID = LUN
/// + 1 (a ready LUN only; one becoming ready is not active yet).
pub trait Namespaces: Send + Sync {
    /// Active NSIDs, ascending.
    fn active(&self) -> Vec<u32>;
    /// The volume of namespace `nsid`, if active.
    fn volume(&self, nsid: u32) -> Option<Arc<Volume>>;
    /// A number that changes whenever the set of namespaces or their
    /// volumes change (lookups may be cached until it does).
    fn generation(&self) -> u64;
    /// The reservation state of namespace `nsid` ([`crate::resv`]); none:
    /// the reservation commands are not served (Invalid Command Opcode).
    fn reservations(&self, _nsid: u32) -> Option<Arc<dyn crate::resv::Reservations>> {
        None
    }
    /// Whether the namespaces serve reservations (Identify Controller
    /// ONCS).
    fn reservations_supported(&self) -> bool {
        false
    }
}

/// What a subsystem is.
pub struct Subsystem {
    pub nqn: String,
    /// Serial number (Identify Controller SN, 20 ASCII characters).
    pub serial: String,
    pub namespaces: Arc<dyn Namespaces>,
    /// Host NQNs allowed to connect; empty: any host.
    pub allowed_hosts: Vec<String>,
    /// The access states of the ports' groups (ALUA's, which are the ANA
    /// states here); none: every port optimized.
    pub groups: Option<Arc<PortGroups>>,
    /// DH-HMAC-CHAP secrets: every queue of every host authenticates
    /// after its Connect (`nvme_auth`); none: no authentication.
    pub dhchap: Option<Arc<nvme_auth::Keys>>,
}

impl Subsystem {
    /// A subsystem named `nqn` serving `namespaces`; its serial number is
    /// derived from the name (stable across restarts).
    pub fn new(
        nqn: String,
        namespaces: Arc<dyn Namespaces>,
        allowed_hosts: Vec<String>,
        groups: Option<Arc<PortGroups>>,
    ) -> Self {
        // FNV-1a of the NQN: 16 hex digits, stable and distinct enough.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in nqn.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        Subsystem {
            nqn,
            serial: format!("{h:016x}"),
            namespaces,
            allowed_hosts,
            groups,
            dhchap: None,
        }
    }

    /// The same subsystem, its hosts authenticated with `keys`.
    pub fn with_dhchap(mut self, keys: Arc<nvme_auth::Keys>) -> Self {
        self.dhchap = Some(keys);
        self
    }

    fn admits(&self, hostnqn: &str) -> bool {
        self.allowed_hosts.is_empty() || self.allowed_hosts.iter().any(|h| h == hostnqn)
    }
}

impl std::fmt::Debug for Subsystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subsystem").field("nqn", &self.nqn).finish()
    }
}

/// The ANA state as last counted for the log page and as last notified.
#[derive(Debug, Default)]
struct AnaSeen {
    counted: Option<AccessState>,
    count: u64,
    notified: Option<AccessState>,
}

/// The most entries of the Changed Namespace List log page; more changes
/// than this are reported as its overflow entry, FFFFFFFFh (Base 2.0
/// "Changed Namespace List").
pub const CHANGED_NS_MAX: usize = 1024;

/// The namespaces as last notified, and what changed since the host last
/// read the Changed Namespace List.
#[derive(Debug, Default)]
struct NsSeen {
    /// (NSID, blocks) of every active namespace when last looked at; None
    /// before the first look.
    notified: Option<Vec<(u32, u64)>>,
    /// NSIDs attached, detached or resized since the list was last read,
    /// ascending, at most [`CHANGED_NS_MAX`].
    changed: Vec<u32>,
    overflow: bool,
}

/// What a controller's registers and features hold.
#[derive(Debug, Default)]
struct Regs {
    cc: u32,
    csts: u32,
    /// Granted I/O queues (0's based count; None until Set Features).
    queues: Option<u16>,
    /// Asynchronous Event Configuration.
    aec: u32,
}

/// One controller: an association of a host with a subsystem (module
/// docs).
#[derive(Debug)]
pub struct Controller {
    pub cntlid: u16,
    pub subsystem: Arc<Subsystem>,
    /// None: the discovery controller.
    pub discovery: bool,
    pub hostnqn: String,
    pub host_id: [u8; 16],
    /// The ALUA target port group of the port the host came through: the
    /// ANA state of every namespace through this controller is its state.
    pub port_group: u16,
    regs: Mutex<Regs>,
    kato_ms: AtomicU64,
    started: Instant,
    /// Milliseconds from `started` to the last command that proves the
    /// host alive.
    last_alive: AtomicU64,
    /// What was seen of the ANA state through this controller.
    ana_seen: Mutex<AnaSeen>,
    /// What was seen of the namespaces.
    ns_seen: Mutex<NsSeen>,
    /// Ended: keep alive expired, shut down, or the admin queue closed.
    /// Every queue's connection closes when it sees this.
    dead: AtomicBool,
}

impl Controller {
    /// The host proved alive now (any admin command, a Keep Alive).
    pub fn alive(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_alive.store(ms, Ordering::Relaxed);
    }

    /// Whether the keep alive timer has expired (KATO with no command; the
    /// host sends Keep Alive at half of it). Marks the controller dead.
    pub fn expired(&self) -> bool {
        let kato = self.kato_ms.load(Ordering::Relaxed);
        if kato == 0 {
            return false;
        }
        let now = self.started.elapsed().as_millis() as u64;
        if now.saturating_sub(self.last_alive.load(Ordering::Relaxed)) > kato {
            self.dead.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// The access state of the namespaces through this controller.
    #[inline]
    pub fn access_state(&self) -> AccessState {
        self.subsystem
            .groups
            .as_ref()
            .map_or(AccessState::ActiveOptimized, |g| g.state(self.port_group))
    }

    /// The ANA log page's change count: bumped whenever the state through
    /// this controller differs from the one last counted.
    pub fn ana_changes(&self) -> u64 {
        let now = self.access_state();
        let mut s = self.ana_seen.lock();
        if s.counted.is_some_and(|c| c != now) {
            s.count += 1;
        }
        s.counted = Some(now);
        s.count
    }

    /// Whether the ANA state changed since the last notice (the first call
    /// only records it): an ANA change notice is due. Independent of the
    /// log page: a host that read the new state after a path error is
    /// still told.
    pub fn ana_changed(&self) -> bool {
        let now = self.access_state();
        let mut s = self.ana_seen.lock();
        let changed = s.notified.is_some_and(|n| n != now);
        s.notified = Some(now);
        changed
    }

    /// Whether a namespace was attached, detached or resized since the
    /// last look (the first call only records them): a Namespace Attribute
    /// Changed notice is due. The NSIDs go to the Changed Namespace List
    /// ([`Controller::take_changed_namespaces`]).
    pub fn namespaces_changed(&self) -> bool {
        let ns = &self.subsystem.namespaces;
        let now: Vec<(u32, u64)> = ns
            .active()
            .into_iter()
            .map(|n| (n, ns.volume(n).map_or(0, |v| v.num_blocks())))
            .collect();
        let mut s = self.ns_seen.lock();
        let Some(before) = s.notified.replace(now) else {
            return false;
        };
        let now = s.notified.as_deref().unwrap_or_default();
        // Both lists are ascending by NSID (so by pair): an entry missing
        // from the other list is a namespace attached, detached or resized
        // (a resize is missing both ways: the NSID is listed once).
        let gone = before.iter().filter(|e| now.binary_search(e).is_err());
        let came = now.iter().filter(|e| before.binary_search(e).is_err());
        let diff: Vec<u32> = gone.chain(came).map(|e| e.0).collect();
        if diff.is_empty() {
            return false;
        }
        for n in diff {
            if let Err(at) = s.changed.binary_search(&n) {
                if s.changed.len() < CHANGED_NS_MAX {
                    s.changed.insert(at, n);
                } else {
                    s.overflow = true;
                }
            }
        }
        true
    }

    /// The Changed Namespace List log page (4 KiB: NSIDs, zero-filled; a
    /// first entry FFFFFFFFh when more changed than it holds), cleared
    /// unless `retain` (Retain Asynchronous Event).
    pub fn take_changed_namespaces(&self, retain: bool) -> Vec<u8> {
        let mut b = vec![0u8; 4 * CHANGED_NS_MAX];
        let mut s = self.ns_seen.lock();
        if s.overflow {
            b[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        } else {
            for (i, n) in s.changed.iter().enumerate() {
                b[4 * i..4 * i + 4].copy_from_slice(&n.to_le_bytes());
            }
        }
        if !retain {
            s.changed.clear();
            s.overflow = false;
        }
        b
    }

    /// The keep alive timeout (ms; 0: none).
    pub fn kato_ms(&self) -> u32 {
        self.kato_ms.load(Ordering::Relaxed) as u32
    }

    pub fn set_kato_ms(&self, ms: u32) {
        self.kato_ms.store(u64::from(ms), Ordering::Relaxed);
        self.alive();
    }

    /// The controller is gone: every queue closes.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    /// Ends the controller.
    pub fn kill(&self) {
        self.dead.store(true, Ordering::Relaxed);
    }

    /// CC.EN and CSTS.RDY: the controller is ready for commands.
    pub fn ready(&self) -> bool {
        self.regs.lock().csts & 1 != 0
    }

    /// I/O queues granted (count, not 0's based; 0 before Set Features).
    pub fn io_queues(&self) -> u16 {
        self.regs.lock().queues.map_or(0, |q| q + 1)
    }

    /// Set Features, Number of Queues: asked (0's based) → granted.
    pub fn grant_queues(&self, nsqr: u16, ncqr: u16) -> u16 {
        let mut r = self.regs.lock();
        let g = *r
            .queues
            .get_or_insert(nsqr.min(ncqr).min(MAX_IO_QUEUES - 1));
        g
    }

    pub fn aec(&self) -> u32 {
        self.regs.lock().aec
    }

    pub fn set_aec(&self, v: u32) {
        self.regs.lock().aec = v;
    }

    /// CAP: MQES, CQR, TO (in 500 ms units), CSS (NVM command set),
    /// MPSMIN = MPSMAX = 4 KiB.
    pub fn cap(&self) -> u64 {
        let mqes = u64::from(MAX_QUEUE_ENTRIES - 1);
        let cqr = 1u64 << 16;
        let to = 30u64 << 24; // 15 s
        let css = 1u64 << 37;
        mqes | cqr | to | css
    }

    /// Property Get: `Ok(value)` or the status.
    pub fn property_get(&self, offset: u32, eight: bool) -> Result<u64, Status> {
        let r = self.regs.lock();
        match (offset, eight) {
            (prop::CAP, true) => Ok(self.cap()),
            (prop::VS, false) => Ok(u64::from(VERSION)),
            (prop::CC, false) => Ok(u64::from(r.cc)),
            (prop::CSTS, false) => Ok(u64::from(r.csts)),
            (prop::NSSR, false) => Ok(0),
            _ => Err(Status::INVALID_FIELD),
        }
    }

    /// Property Set: CC (enable, shutdown notification).
    pub fn property_set(&self, offset: u32, eight: bool, value: u64) -> Result<(), Status> {
        if offset != prop::CC || eight {
            return Err(Status::INVALID_FIELD);
        }
        let cc = value as u32;
        let mut r = self.regs.lock();
        // IOSQES 6 (64 bytes) and IOCQES 4 (16 bytes) once enabled.
        let en = cc & 1 != 0;
        if en && (((cc >> 16) & 0xf) != 6 || ((cc >> 20) & 0xf) != 4) && !self.discovery {
            r.csts |= 1 << 1; // CFS
        }
        let shn = (cc >> 14) & 3;
        r.cc = cc;
        if en {
            r.csts |= 1;
        } else {
            r.csts &= !1;
        }
        if shn != 0 {
            // Shutdown processing complete at once: writes are acknowledged
            // only once they are as durable as the namespace promises.
            r.csts = (r.csts & !(3 << 2)) | (2 << 2);
        }
        Ok(())
    }
}

/// Why a Connect is refused: a status and, for invalid parameters, where
/// (the result field: bits 15:0 the offset, bit 16 set when it is in the
/// data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectRefusal {
    pub status: Status,
    pub result: u64,
}

impl ConnectRefusal {
    /// Connect Invalid Parameters (SCT 1, SC 82h), at `offset` of the
    /// command (`in_data` false) or its data.
    fn invalid(offset: u16, in_data: bool) -> Self {
        ConnectRefusal {
            status: Status::specific(0x82),
            result: u64::from(offset) | if in_data { 1 << 16 } else { 0 },
        }
    }

    /// Connect Invalid Parameters for a SUBNQN no subsystem has, without
    /// DNR: a subsystem removed and added again (`admin remove-target`,
    /// `add-target`) must find its hosts still reconnecting, and Linux's
    /// host (since 6.x) gives a controller up at a Connect failed with DNR.
    /// A first `nvme connect` fails all the same.
    fn no_subsystem() -> Self {
        let mut r = Self::invalid(256, true);
        r.status.dnr = false;
        r
    }

    /// Connect Invalid Host (SCT 1, SC 84h).
    fn host() -> Self {
        ConnectRefusal {
            status: Status::specific(0x84),
            result: 0,
        }
    }
}

/// The Connect command's fields (Fabrics 1.1 "Connect Command").
#[derive(Debug, Clone, Copy)]
pub struct ConnectCmd {
    pub recfmt: u16,
    pub qid: u16,
    /// Entries (0's based in the command; here as sent).
    pub sqsize: u16,
    pub cattr: u8,
    pub kato_ms: u32,
}

impl ConnectCmd {
    pub fn decode(sqe: &Sqe) -> ConnectCmd {
        let b = &sqe.0;
        ConnectCmd {
            recfmt: u16::from_le_bytes([b[40], b[41]]),
            qid: u16::from_le_bytes([b[42], b[43]]),
            sqsize: u16::from_le_bytes([b[44], b[45]]),
            cattr: b[46],
            kato_ms: u32::from_le_bytes([b[48], b[49], b[50], b[51]]),
        }
    }

    /// CATTR bit 2: SQ flow control disabled.
    pub fn sqflow_disabled(&self) -> bool {
        self.cattr & 0x04 != 0
    }
}

/// Every subsystem and live controller of a server.
#[derive(Default)]
pub struct Registry {
    subsystems: Mutex<Vec<Arc<Subsystem>>>,
    ctrls: Mutex<HashMap<u16, Weak<Controller>>>,
    next: Mutex<u16>,
    discovery: Mutex<Option<Arc<Subsystem>>>,
    /// Changes with the subsystems (the Discovery log page's GENCTR).
    generation: AtomicU64,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

/// No namespaces: the discovery subsystem's.
struct NoNamespaces;

impl Namespaces for NoNamespaces {
    fn active(&self) -> Vec<u32> {
        Vec::new()
    }
    fn volume(&self, _: u32) -> Option<Arc<Volume>> {
        None
    }
    fn generation(&self) -> u64 {
        0
    }
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Adds (or replaces, by NQN) a subsystem.
    pub fn add(&self, s: Arc<Subsystem>) {
        let mut v = self.subsystems.lock();
        v.retain(|o| o.nqn != s.nqn);
        v.push(s);
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Changes whenever the subsystems do.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// The ports changed (one added or removed): the discovery log's
    /// generation counter moves.
    pub fn ports_changed(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Removes a subsystem; its controllers end.
    pub fn remove(&self, nqn: &str) {
        self.subsystems.lock().retain(|o| o.nqn != nqn);
        self.generation.fetch_add(1, Ordering::Relaxed);
        for c in self.ctrls.lock().values().filter_map(Weak::upgrade) {
            if c.subsystem.nqn == nqn {
                c.kill();
            }
        }
    }

    /// The subsystem named `nqn`.
    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        self.subsystems
            .lock()
            .iter()
            .find(|s| s.nqn == nqn)
            .cloned()
    }

    /// The subsystems a host may see (the discovery log page's entries).
    pub fn visible_to(&self, hostnqn: &str) -> Vec<Arc<Subsystem>> {
        self.subsystems
            .lock()
            .iter()
            .filter(|s| s.admits(hostnqn))
            .cloned()
            .collect()
    }

    fn discovery_subsystem(&self) -> Arc<Subsystem> {
        self.discovery
            .lock()
            .get_or_insert_with(|| {
                Arc::new(Subsystem::new(
                    DISCOVERY_NQN.into(),
                    Arc::new(NoNamespaces),
                    Vec::new(),
                    None,
                ))
            })
            .clone()
    }

    /// A Connect for queue `cmd.qid` with `data`: the controller the queue
    /// belongs to (a new one for an admin queue).
    pub fn connect(
        &self,
        cmd: &ConnectCmd,
        data: &ConnectData,
        port_group: u16,
    ) -> Result<Arc<Controller>, ConnectRefusal> {
        if cmd.recfmt != 0 {
            return Err(ConnectRefusal {
                status: Status::specific(0x80),
                result: 0,
            });
        }
        let max = if cmd.qid == 0 {
            MAX_ADMIN_ENTRIES
        } else {
            MAX_QUEUE_ENTRIES
        };
        // SQSIZE is 0's based; at least 2 entries (1 is invalid).
        if cmd.sqsize == 0 || cmd.sqsize >= max {
            return Err(ConnectRefusal::invalid(44, false));
        }
        let discovery = data.subnqn == DISCOVERY_NQN;
        let subsystem = if discovery {
            self.discovery_subsystem()
        } else {
            self.subsystems
                .lock()
                .iter()
                .find(|s| s.nqn == data.subnqn)
                .cloned()
                .ok_or(ConnectRefusal::no_subsystem())?
        };
        if !subsystem.admits(&data.hostnqn) {
            return Err(ConnectRefusal::host());
        }
        if cmd.qid == 0 {
            if data.cntlid != 0xffff {
                return Err(ConnectRefusal::invalid(16, true));
            }
            let mut ctrls = self.ctrls.lock();
            ctrls.retain(|_, w| w.strong_count() > 0);
            let mut next = self.next.lock();
            let cntlid = loop {
                *next = (*next % 0xffef) + 1;
                if !ctrls.contains_key(&*next) {
                    break *next;
                }
            };
            // KATO 0: no keep alive (the controller still ends with its
            // admin queue's connection).
            let kato = cmd.kato_ms;
            let c = Arc::new(Controller {
                cntlid,
                subsystem,
                discovery,
                hostnqn: data.hostnqn.clone(),
                host_id: data.host_id,
                port_group,
                ana_seen: Mutex::new(AnaSeen::default()),
                ns_seen: Mutex::new(NsSeen::default()),
                regs: Mutex::new(Regs::default()),
                kato_ms: AtomicU64::new(u64::from(kato)),
                started: Instant::now(),
                last_alive: AtomicU64::new(0),
                dead: AtomicBool::new(false),
            });
            c.alive();
            ctrls.insert(cntlid, Arc::downgrade(&c));
            return Ok(c);
        }
        let c = self
            .ctrls
            .lock()
            .get(&data.cntlid)
            .and_then(Weak::upgrade)
            .filter(|c| !c.is_dead())
            .ok_or(ConnectRefusal::invalid(16, true))?;
        if c.subsystem.nqn != data.subnqn || c.hostnqn != data.hostnqn || c.host_id != data.host_id
        {
            return Err(ConnectRefusal::invalid(16, true));
        }
        if c.discovery || !c.ready() || cmd.qid > c.io_queues() {
            return Err(ConnectRefusal::invalid(42, false));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct One(Arc<Volume>);
    impl Namespaces for One {
        fn active(&self) -> Vec<u32> {
            vec![1]
        }
        fn volume(&self, nsid: u32) -> Option<Arc<Volume>> {
            (nsid == 1).then(|| self.0.clone())
        }
        fn generation(&self) -> u64 {
            0
        }
    }

    const NQN: &str = "nqn.2026-12.io.ironsan:t";
    const HOST: &str = "nqn.2026-12.io.ironsan:h";

    /// A 1 MiB RAM volume of 512-byte blocks.
    fn volume() -> Volume {
        Volume::new(
            Arc::new(storage::MemBackend::new(1 << 20)),
            512,
            None,
            false,
            false,
        )
        .unwrap()
    }

    fn registry(allowed: Vec<String>) -> Registry {
        let v = volume();
        let r = Registry::new();
        r.add(Arc::new(Subsystem::new(
            NQN.into(),
            Arc::new(One(Arc::new(v))),
            allowed,
            None,
        )));
        r
    }

    fn cmd(qid: u16, sqsize: u16, kato_ms: u32) -> ConnectCmd {
        ConnectCmd {
            recfmt: 0,
            qid,
            sqsize,
            cattr: 0,
            kato_ms,
        }
    }

    fn data(cntlid: u16, subnqn: &str, hostnqn: &str) -> ConnectData {
        ConnectData {
            host_id: [3; 16],
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
        }
    }

    #[test]
    fn connect_makes_controllers_and_joins_io_queues_to_them() {
        let r = registry(Vec::new());
        let a = r
            .connect(&cmd(0, 31, 5000), &data(0xffff, NQN, HOST), 1)
            .unwrap();
        let b = r
            .connect(&cmd(0, 31, 5000), &data(0xffff, NQN, HOST), 1)
            .unwrap();
        assert_ne!(a.cntlid, b.cntlid);
        // An I/O queue before the controller is enabled and has queues.
        let io = |qid| r.connect(&cmd(qid, 127, 0), &data(a.cntlid, NQN, HOST), 1);
        assert_eq!(io(1).unwrap_err(), ConnectRefusal::invalid(42, false));
        a.property_set(prop::CC, false, 1 | (6 << 16) | (4 << 20))
            .unwrap();
        assert_eq!(a.property_get(prop::CSTS, false).unwrap() & 1, 1);
        assert_eq!(a.grant_queues(1, 1), 1);
        assert_eq!(io(1).unwrap().cntlid, a.cntlid);
        assert_eq!(io(2).unwrap().cntlid, a.cntlid);
        assert_eq!(io(3).unwrap_err(), ConnectRefusal::invalid(42, false));
        // Another host cannot join a's queues; a dead controller none.
        let other = r.connect(&cmd(1, 127, 0), &data(a.cntlid, NQN, "nqn.x:other"), 1);
        assert_eq!(other.unwrap_err(), ConnectRefusal::invalid(16, true));
        a.kill();
        assert!(io(1).is_err());
    }

    #[test]
    fn connect_refusals() {
        let r = registry(vec![HOST.into()]);
        let c = |cmd: ConnectCmd, d: ConnectData| r.connect(&cmd, &d, 1).unwrap_err();
        // Unknown subsystem, a host not allowed, queue sizes out of range,
        // a record format not 0, a specific CNTLID on an admin queue.
        assert_eq!(
            c(cmd(0, 31, 0), data(0xffff, "nqn.x:nosuch", HOST)),
            ConnectRefusal::no_subsystem()
        );
        assert!(!ConnectRefusal::no_subsystem().status.dnr, "may come back");
        assert_eq!(ConnectRefusal::no_subsystem().result, 256 | 1 << 16);
        assert_eq!(
            c(cmd(0, 31, 0), data(0xffff, NQN, "nqn.x:no")).status,
            Status::specific(0x84)
        );
        assert_eq!(
            c(cmd(0, 0, 0), data(0xffff, NQN, HOST)),
            ConnectRefusal::invalid(44, false)
        );
        assert_eq!(
            c(cmd(0, 32, 0), data(0xffff, NQN, HOST)),
            ConnectRefusal::invalid(44, false)
        );
        let mut bad = cmd(0, 31, 0);
        bad.recfmt = 1;
        assert_eq!(
            c(bad, data(0xffff, NQN, HOST)).status,
            Status::specific(0x80)
        );
        assert_eq!(
            c(cmd(0, 31, 0), data(7, NQN, HOST)),
            ConnectRefusal::invalid(16, true)
        );
        // The discovery subsystem takes anyone.
        let d = r.connect(&cmd(0, 31, 0), &data(0xffff, DISCOVERY_NQN, "nqn.x:any"), 1);
        assert!(d.unwrap().discovery);
    }

    /// A set of namespaces a test changes: NSIDs, all on one volume.
    struct Many(Mutex<Vec<u32>>, Arc<Volume>);
    impl Namespaces for Many {
        fn active(&self) -> Vec<u32> {
            self.0.lock().clone()
        }
        fn volume(&self, nsid: u32) -> Option<Arc<Volume>> {
            self.0.lock().contains(&nsid).then(|| self.1.clone())
        }
        fn generation(&self) -> u64 {
            0
        }
    }

    #[test]
    fn namespace_changes_are_listed_until_read() {
        let ns = Arc::new(Many(Mutex::new(vec![1, 3]), Arc::new(volume())));
        let r = Registry::new();
        r.add(Arc::new(Subsystem::new(
            NQN.into(),
            ns.clone(),
            Vec::new(),
            None,
        )));
        let c = r
            .connect(&cmd(0, 31, 0), &data(0xffff, NQN, HOST), 1)
            .unwrap();
        let list = |c: &Controller, retain: bool| -> Vec<u32> {
            c.take_changed_namespaces(retain)
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                .take_while(|&n| n != 0)
                .collect()
        };
        // The first look records; nothing changed.
        assert!(!c.namespaces_changed());
        assert!(!c.namespaces_changed());
        assert!(list(&c, false).is_empty());
        // 3 detached, 2 and 7 attached: all three listed, ascending.
        *ns.0.lock() = vec![1, 2, 7];
        assert!(c.namespaces_changed());
        assert!(!c.namespaces_changed(), "noticed once");
        *ns.0.lock() = vec![1, 7];
        assert!(c.namespaces_changed());
        assert_eq!(list(&c, true), vec![2, 3, 7], "retained");
        assert_eq!(list(&c, false), vec![2, 3, 7]);
        assert!(list(&c, false).is_empty(), "cleared once read");
        // A resize is a change too.
        ns.1.resize(2 << 20).unwrap();
        assert!(c.namespaces_changed());
        assert_eq!(list(&c, false), vec![1, 7]);
        // More than the list holds: FFFFFFFFh first, then cleared.
        *ns.0.lock() = (1..=CHANGED_NS_MAX as u32 + 5).collect();
        assert!(c.namespaces_changed());
        assert_eq!(list(&c, false), vec![u32::MAX]);
        assert!(list(&c, false).is_empty());
    }

    #[test]
    fn keep_alive_expires_only_without_commands() {
        let r = registry(Vec::new());
        let c = r
            .connect(&cmd(0, 31, 100), &data(0xffff, NQN, HOST), 1)
            .unwrap();
        for _ in 0..5 {
            std::thread::sleep(std::time::Duration::from_millis(40));
            c.alive();
            assert!(!c.expired());
        }
        std::thread::sleep(std::time::Duration::from_millis(150));
        assert!(c.expired());
        assert!(c.is_dead());
        // KATO 0: no keep alive.
        let c = r
            .connect(&cmd(0, 31, 0), &data(0xffff, NQN, HOST), 1)
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!c.expired());
    }

    #[test]
    fn properties_and_shutdown() {
        let r = registry(Vec::new());
        let c = r
            .connect(&cmd(0, 31, 0), &data(0xffff, NQN, HOST), 1)
            .unwrap();
        let cap = c.property_get(prop::CAP, true).unwrap();
        assert_eq!(cap & 0xffff, u64::from(MAX_QUEUE_ENTRIES - 1));
        assert_eq!((cap >> 37) & 1, 1, "NVM command set");
        assert_eq!(c.property_get(prop::VS, false).unwrap(), u64::from(VERSION));
        assert!(c.property_get(prop::CAP, false).is_err(), "CAP is 8 bytes");
        assert!(
            c.property_set(prop::CSTS, false, 0).is_err(),
            "CSTS is read-only"
        );
        c.property_set(prop::CC, false, 1 | (6 << 16) | (4 << 20))
            .unwrap();
        assert!(c.ready());
        // Normal shutdown: shutdown processing complete (SHST 10b).
        c.property_set(prop::CC, false, 1 | (1 << 14) | (6 << 16) | (4 << 20))
            .unwrap();
        assert_eq!((c.property_get(prop::CSTS, false).unwrap() >> 2) & 3, 2);
    }
}
