//! One of several gateways serving shared RBD images as the same LUs, with
//! ALUA (SPC-4 §5.15) telling initiators which gateway to use
//! (docs/GATEWAYS.md).
//!
//! Every gateway is configured with the same targets and LUNs, so they
//! report the same LU identities (NAA, serial), and with all gateways'
//! target port groups: its own (its portals) and its peers' (their
//! relative port ids). The owner of the images' exclusive locks
//! ([`storage::Ownership`]) is the only one that may write, so:
//!
//! * the owner reports its own group **active/optimized** and the peers'
//!   **standby**; a gateway without the locks reports its own group
//!   standby (media access refused with NOT READY 04/0B) and the group of
//!   the gateway recorded as owner in the images' notes active/optimized;
//! * **SET TARGET PORT GROUPS** asking for this gateway's group to be
//!   active takes the locks over, whoever holds them (the holder is
//!   fenced first: blocklisted by the cluster, so a gateway that was only
//!   slow or cut off cannot write afterwards), records this group as the
//!   owner and reports itself active/optimized. This is how initiators
//!   fail over (Linux `scsi_dh_alua`, ESXi `VMW_SATP_ALUA` with explicit
//!   ALUA, Windows MSDSM): when the path to the owner fails they activate
//!   a standby path's group. Asking for this group to be standby releases
//!   the locks. A peer's group cannot be changed from here (only its own
//!   gateway can take the locks): a list that asks for a state the peer
//!   is not in is refused, INVALID FIELD IN PARAMETER LIST;
//! * every `check_interval_ms` the locks are re-read: a gateway whose
//!   locks were taken over reports standby, and the peers' states follow
//!   the recorded owner; each change establishes ASYMMETRIC ACCESS STATE
//!   CHANGED (2A/06) for every nexus.
//!
//! * **implicit failover** (initiators that never send SET TARGET PORT
//!   GROUPS, e.g. ESXi's default `VMW_SATP_ALUA`, or libiscsi, whose login
//!   sends TEST UNIT READY): a command this standby gateway refuses sets
//!   off a probe (at most one per check
//!   interval, on a thread of its own): when the gateway holding the locks
//!   is no longer connected to the cluster (its watch on the image has
//!   expired, `osd_client_watch_timeout`, 30 s by default), the locks are
//!   taken over as above; commands get ASYMMETRIC ACCESS STATE TRANSITION
//!   (04/0A) while that runs. A live owner is never taken over implicitly,
//!   so initiators probing standby paths cannot make the gateways fight.
//!
//! At start a gateway takes the locks if nobody holds them (the first one
//! up becomes the owner). The LUs of a target fail over together (one
//! group state per target). Reservations are refused (see
//! [`scsi::LogicalUnit::without_reservations`]): their state would live in
//! one gateway only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use scsi::{AccessRefusal, AccessState, AluaOwner, Asc, LogicalUnit, PortGroups};

use crate::config::GatewayConfig;

/// The note (image metadata key) naming the owner's target port group.
pub const OWNER_NOTE: &str = "ironsan.owner_group";

/// The gateway role of one target; see the module docs.
#[derive(Debug)]
pub struct Gateway {
    target: String,
    own: u16,
    peers: Vec<u16>,
    pg: Weak<PortGroups>,
    lus: Vec<Weak<LogicalUnit>>,
    /// Serialises takeovers, releases and checks.
    busy: Mutex<()>,
    /// Take over when a command reaches this standby gateway when the
    /// owner is gone ([`GatewayConfig::implicit_failover`]).
    implicit: bool,
    /// The check interval: also the least time between two probes of the
    /// owner's liveness set off by refused commands.
    every: Duration,
    /// When a refused command last set off a probe.
    last_probe: Mutex<Option<Instant>>,
    /// An implicit takeover is running (commands get 04/0A meanwhile).
    transitioning: AtomicBool,
    /// This gateway, for the probe thread.
    me: Weak<Gateway>,
}

/// What the locks say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// This gateway holds every lock.
    Me,
    /// Another gateway (its group, when recorded) does.
    Other(Option<u16>),
}

impl Gateway {
    /// Sets up the gateway role of a target whose units are `lus` in the
    /// groups `pg`: takes the locks when free, sets the states, hands SET
    /// TARGET PORT GROUPS to it and starts the periodic check (a thread
    /// that ends when the units are gone).
    pub fn start(
        target: &str,
        cfg: &GatewayConfig,
        pg: &Arc<PortGroups>,
        lus: &[Arc<LogicalUnit>],
    ) -> Result<Arc<Gateway>, String> {
        if let Some(lu) = lus.iter().find(|lu| lu.backend().ownership().is_none()) {
            return Err(format!(
                "gateway: target {target}: a {} LUN has no owner arbitration (only rbd LUNs can be \
                 served by several gateways)",
                lu.backend_kind()
            ));
        }
        let every = Duration::from_millis(cfg.check_interval_ms);
        let gw = Arc::new_cyclic(|me| Gateway {
            target: target.to_string(),
            own: cfg.group,
            peers: cfg.peer.iter().map(|p| p.group).collect(),
            pg: Arc::downgrade(pg),
            lus: lus.iter().map(Arc::downgrade).collect(),
            busy: Mutex::new(()),
            implicit: cfg.implicit_failover,
            every,
            last_probe: Mutex::new(None),
            transitioning: AtomicBool::new(false),
            me: me.clone(),
        });
        let owner = gw
            .try_acquire()
            .map_err(|e| format!("gateway: target {target}: {e}"))?;
        gw.show(owner, false);
        tracing::info!(target = %target, group = gw.own, ?owner, "gateway started");
        pg.set_owner(gw.clone());
        let weak = Arc::downgrade(&gw);
        std::thread::Builder::new()
            .name("gateway".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                let Some(gw) = weak.upgrade() else { return };
                if !gw.check() {
                    return;
                }
            })
            .map_err(|e| format!("gateway: cannot start the check thread: {e}"))?;
        Ok(gw)
    }

    /// The units still served.
    fn units(&self) -> Vec<Arc<LogicalUnit>> {
        self.lus.iter().filter_map(Weak::upgrade).collect()
    }

    /// Takes every lock when none is held by another; otherwise releases
    /// what it took (all or nothing).
    fn try_acquire(&self) -> std::io::Result<Owner> {
        let _g = self.busy.lock();
        let units = self.units();
        let mut all = true;
        for lu in &units {
            let o = ownership(lu);
            if !o.acquire()? {
                all = false;
                break;
            }
        }
        if all {
            for lu in &units {
                ownership(lu).set_note(OWNER_NOTE, &self.own.to_string())?;
            }
            return Ok(Owner::Me);
        }
        for lu in &units {
            ownership(lu).release()?;
        }
        Ok(Owner::Other(self.recorded_owner(&units)))
    }

    /// The group recorded as owner in the first unit's notes.
    fn recorded_owner(&self, units: &[Arc<LogicalUnit>]) -> Option<u16> {
        let lu = units.first()?;
        let note = ownership(lu).note(OWNER_NOTE).ok()??;
        note.trim().parse().ok().filter(|g| *g != self.own)
    }

    /// Re-reads the locks and updates the states; false when the target
    /// is gone (the check thread then ends).
    fn check(&self) -> bool {
        let units = self.units();
        if units.is_empty() || self.pg.upgrade().is_none() {
            return false;
        }
        let _g = self.busy.lock();
        let mut mine = 0;
        for lu in &units {
            match ownership(lu).is_owner() {
                Ok(true) => mine += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(target = %self.target, "gateway: cannot read the lock: {e}");
                    return true;
                }
            }
        }
        let owner = if mine == units.len() {
            Owner::Me
        } else {
            if mine > 0 {
                // Some locks lost (taken over): give the rest up too, the
                // LUs of a target fail over together.
                for lu in &units {
                    if let Err(e) = ownership(lu).release() {
                        tracing::warn!(target = %self.target, "gateway: releasing a lock: {e}");
                    }
                }
            }
            Owner::Other(self.recorded_owner(&units))
        };
        self.show(owner, true);
        true
    }

    /// Sets the group states for `owner`; with `tell`, a change
    /// establishes 2A/06 on every nexus. Returns whether a state changed.
    fn show(&self, owner: Owner, tell: bool) -> bool {
        let Some(pg) = self.pg.upgrade() else {
            return false;
        };
        let (own, peer_owner) = match owner {
            Owner::Me => (AccessState::ActiveOptimized, None),
            Owner::Other(g) => (AccessState::Standby, g),
        };
        let mut changed = pg.set_state(self.own, own).unwrap_or(false);
        for &p in &self.peers {
            let st = if peer_owner == Some(p) {
                AccessState::ActiveOptimized
            } else {
                AccessState::Standby
            };
            changed |= pg.set_state(p, st).unwrap_or(false);
        }
        if changed {
            tracing::info!(target = %self.target, group = self.own, ?owner, "gateway: ALUA states changed");
            if tell {
                for lu in self.units() {
                    lu.unit_attention_all(Asc::ASYMMETRIC_ACCESS_STATE_CHANGED);
                }
            }
        }
        changed
    }

    /// Takes every lock over and records this group as the owner.
    fn take_over(&self) -> std::io::Result<()> {
        let units = self.units();
        for lu in &units {
            ownership(lu).take_over()?;
        }
        for lu in &units {
            ownership(lu).set_note(OWNER_NOTE, &self.own.to_string())?;
        }
        tracing::warn!(target = %self.target, group = self.own, "gateway: took the images over");
        Ok(())
    }

    /// Takes the images over if no other gateway holding them is still
    /// connected to the cluster (implicit failover).
    fn take_over_if_owner_gone(&self) {
        let _g = self.busy.lock();
        let units = self.units();
        for lu in &units {
            match ownership(lu).other_owner_alive() {
                Ok(false) => {}
                Ok(true) => {
                    tracing::debug!(target = %self.target, "gateway: the owner is alive; staying standby");
                    return;
                }
                Err(e) => {
                    tracing::warn!(target = %self.target, "gateway: cannot tell whether the owner is alive: {e}");
                    return;
                }
            }
        }
        self.transitioning.store(true, Ordering::Release);
        match self.take_over() {
            Ok(()) => {
                self.show(Owner::Me, true);
            }
            Err(e) => {
                tracing::error!(target = %self.target, "gateway: implicit take-over failed: {e}")
            }
        }
        self.transitioning.store(false, Ordering::Release);
    }

    /// Gives every lock up.
    fn release(&self) -> std::io::Result<()> {
        for lu in self.units() {
            ownership(&lu).release()?;
        }
        Ok(())
    }
}

fn ownership(lu: &LogicalUnit) -> &dyn storage::Ownership {
    lu.backend()
        .ownership()
        .expect("checked at start: every unit has owner arbitration")
}

impl AluaOwner for Gateway {
    fn refused_access(&self, tpg: u16, state: AccessState) -> Option<AccessRefusal> {
        if tpg != self.own || !self.implicit || state != AccessState::Standby {
            return None;
        }
        if self.transitioning.load(Ordering::Acquire) {
            return Some(AccessRefusal::Transitioning);
        }
        {
            let mut last = self.last_probe.lock();
            if last.is_some_and(|t| t.elapsed() < self.every) {
                return None;
            }
            *last = Some(Instant::now());
        }
        // Cluster calls block: probe on a thread of its own; this command
        // gets the plain standby answer, later ones 04/0A while a
        // takeover runs, then the active group serves them.
        let me = self.me.clone();
        let spawned = std::thread::Builder::new()
            .name("gateway-probe".into())
            .spawn(move || {
                if let Some(gw) = me.upgrade() {
                    gw.take_over_if_owner_gone();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("gateway: cannot start a probe: {e}");
        }
        None
    }

    fn set_states(&self, changes: &[(u16, AccessState)]) -> Result<bool, AccessRefusal> {
        let _g = self.busy.lock();
        // The peers' groups: only their present state may be asked for.
        let pg = self
            .pg
            .upgrade()
            .ok_or(AccessRefusal::InState(AccessState::Unavailable))?;
        let mine = changes
            .iter()
            .find(|(g, _)| *g == self.own)
            .map(|&(_, st)| st);
        for (k, &(g, st)) in changes.iter().enumerate() {
            if g == self.own {
                continue;
            }
            let now = pg.state(g);
            // After this gateway becomes active, every peer is standby.
            let then = if mine.is_some_and(AccessState::is_active) {
                AccessState::Standby
            } else {
                now
            };
            if st != then {
                return Err(AccessRefusal::InvalidChange(k));
            }
        }
        let owner = match mine {
            None => return Ok(false),
            Some(st) if st.is_active() => {
                if let Err(e) = self.take_over() {
                    tracing::error!(target = %self.target, "gateway: take-over failed: {e}");
                    return Err(AccessRefusal::InState(AccessState::Standby));
                }
                Owner::Me
            }
            Some(st) => {
                if let Err(e) = self.release() {
                    tracing::error!(target = %self.target, "gateway: release failed: {e}");
                    return Err(AccessRefusal::Failed);
                }
                // Standby or unavailable, as asked; the peers keep theirs.
                return Ok(pg.set_state(self.own, st).unwrap_or(false));
            }
        };
        Ok(self.show(owner, false))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};
    use std::io;

    use scsi::{Command, GroupSpec, LuConfig, NexusId};
    use storage::{BlockBackend, MemBackend, NotAccessible, Ownership, WriteCache};

    use super::*;
    use crate::config::GatewayPeerConfig;

    /// One image several gateways reach, with an exclusive lock like RBD's.
    #[derive(Default)]
    struct Cluster {
        owner: Option<u32>,
        fenced: HashSet<u32>,
        /// Clients that died (no longer connected).
        dead: HashSet<u32>,
        notes: HashMap<String, String>,
    }

    /// One gateway's client of the image.
    struct Client {
        id: u32,
        cluster: Arc<Mutex<Cluster>>,
        data: Arc<MemBackend>,
    }

    impl Client {
        fn usable(&self, write: bool) -> io::Result<()> {
            let c = self.cluster.lock();
            if c.fenced.contains(&self.id) || (write && c.owner != Some(self.id)) {
                return Err(NotAccessible::error(format!("client {}", self.id)));
            }
            Ok(())
        }
    }

    impl BlockBackend for Client {
        fn caps(&self) -> storage::Caps {
            storage::Caps::new("shared", WriteCache::WriteThrough)
        }
        fn size(&self) -> u64 {
            self.data.size()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.usable(false)?;
            self.data.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
            self.usable(true)?;
            self.data.write_at(buf, offset, fua)
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn set_write_cache(&self, _: WriteCache) -> io::Result<()> {
            Ok(())
        }
        fn ownership(&self) -> Option<&dyn Ownership> {
            Some(self)
        }
    }

    impl Ownership for Client {
        fn acquire(&self) -> io::Result<bool> {
            let mut c = self.cluster.lock();
            if c.owner.is_none() {
                c.owner = Some(self.id);
            }
            Ok(c.owner == Some(self.id))
        }
        fn is_owner(&self) -> io::Result<bool> {
            Ok(self.cluster.lock().owner == Some(self.id))
        }
        fn take_over(&self) -> io::Result<()> {
            let mut c = self.cluster.lock();
            if let Some(old) = c.owner.filter(|&o| o != self.id) {
                c.fenced.insert(old);
            }
            c.owner = Some(self.id);
            Ok(())
        }
        fn other_owner_alive(&self) -> io::Result<bool> {
            let c = self.cluster.lock();
            Ok(c.owner
                .is_some_and(|o| o != self.id && !c.dead.contains(&o)))
        }
        fn release(&self) -> io::Result<()> {
            let mut c = self.cluster.lock();
            if c.owner == Some(self.id) {
                c.owner = None;
            }
            Ok(())
        }
        fn note(&self, key: &str) -> io::Result<Option<String>> {
            Ok(self.cluster.lock().notes.get(key).cloned())
        }
        fn set_note(&self, key: &str, value: &str) -> io::Result<()> {
            self.cluster.lock().notes.insert(key.into(), value.into());
            Ok(())
        }
        fn on_resized_elsewhere(&self, _changed: storage::SizeChanged) {}
    }

    struct Gw {
        pg: Arc<PortGroups>,
        lu: Arc<LogicalUnit>,
        gw: Arc<Gateway>,
        group: u16,
        port: u16,
    }

    fn gateway(
        id: u32,
        group: u16,
        port: u16,
        peer: (u16, u16),
        cluster: &Arc<Mutex<Cluster>>,
        data: &Arc<MemBackend>,
    ) -> Gw {
        let pg = Arc::new(
            PortGroups::new(
                vec![
                    GroupSpec {
                        id: group,
                        ports: vec![port],
                        state: AccessState::Standby,
                        preferred: false,
                    },
                    GroupSpec {
                        id: peer.0,
                        ports: vec![peer.1],
                        state: AccessState::Standby,
                        preferred: false,
                    },
                ],
                true,
            )
            .unwrap(),
        );
        let backend = Arc::new(Client {
            id,
            cluster: cluster.clone(),
            data: data.clone(),
        });
        let cfg = LuConfig {
            block_size: 512,
            physical_block_size: None,
            naa: [0x60; 16],
            serial: "gw".into(),
            vendor: "IRONSAN".into(),
            product: "TEST".into(),
            revision: "0001".into(),
            read_only: false,
            thin: false,
            pr_state: None,
        };
        let lu = Arc::new(
            LogicalUnit::new(backend, cfg)
                .unwrap()
                .with_port_groups(pg.clone())
                .without_reservations(),
        );
        let gcfg = GatewayConfig {
            group,
            first_portal_tag: port,
            peer: vec![GatewayPeerConfig {
                group: peer.0,
                ports: vec![peer.1],
            }],
            check_interval_ms: 100,
            implicit_failover: true,
        };
        let gw = Gateway::start("iqn.test:gw", &gcfg, &pg, std::slice::from_ref(&lu)).unwrap();
        Gw {
            pg,
            lu,
            gw,
            group,
            port,
        }
    }

    fn run(g: &Gw, cdb: &[u8], data_out: &[u8]) -> scsi::Outcome {
        let data = bufpool::WriteData::Owned(bytes::Bytes::copy_from_slice(data_out));
        let cmd = Command {
            cdb,
            data_out: &data,
            nexus: NexusId(7),
            relative_port: g.port,
            tpg: g.group,
            target_port_name: "iqn.test:gw,t,0x0001",
            initiator_port_name: "iqn.test:host,i,0x000000000001",
            expected_data_out: Some(data_out.len() as u32),
            lus: None,
        };
        g.lu.execute(&cmd)
    }

    fn write10(lba: u8) -> [u8; 10] {
        [0x2A, 0, 0, 0, 0, lba, 0, 0, 1, 0]
    }

    fn stpg(group: u16, state: AccessState) -> ([u8; 12], Vec<u8>) {
        let mut list = vec![0u8; 8];
        list[4] = state.code();
        list[6..8].copy_from_slice(&group.to_be_bytes());
        ([0xA4, 0x0A, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0], list)
    }

    fn sense_of(o: &scsi::Outcome) -> (u8, u8, u8) {
        let s = o.sense.as_ref().expect("CHECK CONDITION");
        (s.key as u8, s.code.asc, s.code.ascq)
    }

    #[test]
    fn first_gateway_owns_and_failover_moves_the_lock() {
        let cluster = Arc::new(Mutex::new(Cluster::default()));
        let data = Arc::new(MemBackend::new(1 << 20));
        let a = gateway(1, 1, 1, (2, 17), &cluster, &data);
        let b = gateway(2, 2, 17, (1, 1), &cluster, &data);
        // Both report the same states: A active/optimized, B standby.
        for g in [&a, &b] {
            assert_eq!(g.pg.state(1), AccessState::ActiveOptimized);
            assert_eq!(g.pg.state(2), AccessState::Standby);
        }
        let block = vec![0xABu8; 512];
        assert!(run(&a, &write10(0), &block).is_good());
        // B refuses media access in standby.
        assert_eq!(sense_of(&run(&b, &write10(0), &block)), (0x02, 0x04, 0x0B));
        // Reservations are refused on a gateway.
        let prin = [0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0];
        assert_eq!(sense_of(&run(&a, &prin, &[])), (0x05, 0x20, 0x00));
        // B cannot make A standby or itself unavailable-and-A-active.
        let (cdb, list) = stpg(1, AccessState::Standby);
        assert_eq!(sense_of(&run(&b, &cdb, &list)).0, 0x05);
        // Failover: the initiator activates B's group through B.
        let (cdb, list) = stpg(2, AccessState::ActiveOptimized);
        assert!(run(&b, &cdb, &list).is_good());
        assert_eq!(b.pg.state(2), AccessState::ActiveOptimized);
        assert_eq!(b.pg.state(1), AccessState::Standby);
        assert!(run(&b, &write10(1), &block).is_good());
        // A was fenced: its writes fail NOT READY, not MEDIUM ERROR, even
        // before its check notices.
        assert_eq!(a.pg.state(1), AccessState::ActiveOptimized);
        let o = run(&a, &write10(2), &block);
        assert_eq!(sense_of(&o), (0x02, 0x04, 0x0B));
        // A's check sees the lock gone and the recorded owner.
        assert!(a.gw.check());
        assert_eq!(a.pg.state(1), AccessState::Standby);
        assert_eq!(a.pg.state(2), AccessState::ActiveOptimized);
        // Nothing A wrote after the takeover landed.
        let mut back = vec![0u8; 512];
        data.read_at(&mut back, 2 * 512).unwrap();
        assert!(back.iter().all(|&x| x == 0));
        data.read_at(&mut back, 512).unwrap();
        assert_eq!(back, block);
        // B gives up: standby as asked, the lock released.
        let (cdb, list) = stpg(2, AccessState::Standby);
        assert!(run(&b, &cdb, &list).is_good());
        assert_eq!(b.pg.state(2), AccessState::Standby);
        assert_eq!(cluster.lock().owner, None);
    }

    /// Waits (bounded) for `f` to hold.
    fn eventually(what: &str, f: impl Fn() -> bool) {
        for _ in 0..200 {
            if f() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("never: {what}");
    }

    #[test]
    fn media_access_takes_over_only_from_a_dead_owner() {
        let cluster = Arc::new(Mutex::new(Cluster::default()));
        let data = Arc::new(MemBackend::new(1 << 20));
        let a = gateway(1, 1, 1, (2, 17), &cluster, &data);
        let b = gateway(2, 2, 17, (1, 1), &cluster, &data);
        let block = vec![0x11u8; 512];
        // A alive: writes through B are refused, however often.
        for _ in 0..3 {
            assert_eq!(sense_of(&run(&b, &write10(0), &block)), (0x02, 0x04, 0x0B));
            std::thread::sleep(Duration::from_millis(120));
        }
        assert_eq!(cluster.lock().owner, Some(1));
        // A dies: the next command through B sets off the takeover.
        cluster.lock().dead.insert(1);
        let o = run(&b, &write10(0), &block);
        assert_eq!(sense_of(&o).0, 0x02, "refused while it takes over");
        eventually("B active", || b.pg.state(2) == AccessState::ActiveOptimized);
        // The nexus hears of the change once, then writes.
        assert_eq!(sense_of(&run(&b, &write10(0), &block)), (0x06, 0x2A, 0x06));
        assert!(run(&b, &write10(0), &block).is_good());
        assert!(cluster.lock().fenced.contains(&1));
        assert!(a.gw.check());
        assert_eq!(a.pg.state(2), AccessState::ActiveOptimized);
    }
}
