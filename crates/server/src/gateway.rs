//! One of several gateways serving shared RBD images as the same LUs, with
//! ALUA (SPC-4 §5.15) telling initiators which gateway to use
//! (docs/GATEWAYS.md).
//!
//! Every gateway is configured with the same targets and LUNs, so they
//! report the same LU identities (NAA, serial), and with all gateways'
//! target port groups: its own (its portals) and its peers' (their
//! relative port ids). The owner of the images' exclusive locks
//! ([`storage::Ownership`]) is the only one that may write.
//!
//! # Ownership, as one state machine
//!
//! A gateway's [`Role`] for its target's images changes only through
//! [`next`], given an [`Event`]; [`Role::states`] is what REPORT TARGET
//! PORT GROUPS then says, the same on every gateway once each has seen the
//! same lock:
//!
//! | role | this group | the owner's group | other peers |
//! |---|---|---|---|
//! | `Owner` | active/optimized | — | standby |
//! | `Standby(g)` | standby (04/0B) | active/optimized | standby |
//! | `Fenced(g)` | unavailable (04/0C) | active/optimized | standby |
//!
//! | event | from | to | and |
//! |---|---|---|---|
//! | `HoldAll` (every lock held here) | any | `Owner` | |
//! | `HoldNotAll(g)` (the recorded owner `g`) | any | `Standby(g)` | locks held here are released: a target fails over whole |
//! | `CutOff` (this client fenced: blocklisted) | any | `Fenced(g)` | reconnect |
//! | `Unknown` (the cluster did not answer) | `Fenced` | `Fenced` | reconnect again |
//! | `Unknown` | others | unchanged | |
//! | `Reconnected(g)` | any | `Standby(g)` | |
//! | `TookOver` | any | `Owner` | |
//! | `Released` | `Owner` | `Standby(None)` | |
//! | `Released` | `Standby(g)`, `Fenced(g)` | `Standby(g)` | |
//!
//! In `Fenced(g)`, `g` is the owner recorded before, or, when this gateway
//! was the owner and has one peer, that peer (only a peer breaks the lock).
//!
//! Events come from three places:
//!
//! * **every `check_interval_ms`** the locks and the recorded owner are
//!   read (`HoldAll`, `HoldNotAll`, `CutOff`, `Unknown`); after `CutOff`
//!   the gateway opens a new cluster connection (a blocklisted client
//!   instance is dead for good) and is a standby again (`Reconnected`),
//!   able to take over later;
//! * **SET TARGET PORT GROUPS** asking for this gateway's group to be
//!   active takes the locks over, whoever holds them (the holder is
//!   fenced first: blocklisted by the cluster, so a gateway that was only
//!   slow or cut off cannot write afterwards), records this group as the
//!   owner (`TookOver`). This is how initiators fail over (Linux
//!   `scsi_dh_alua`, ESXi `VMW_SATP_ALUA` with explicit ALUA, Windows
//!   MSDSM). Asking for this group to be standby releases the locks
//!   (`Released`). A peer's group cannot be changed from here (only its
//!   own gateway can take the locks): a list that asks for a state the
//!   peer is not in is refused, INVALID FIELD IN PARAMETER LIST;
//! * **implicit failover** (initiators that never send SET TARGET PORT
//!   GROUPS, e.g. ESXi's default `VMW_SATP_ALUA`, or libiscsi, whose login
//!   sends TEST UNIT READY): a command this standby gateway refuses sets
//!   off a probe (at most one per check interval, on a thread of its
//!   own): the owner is asked whether it is there
//!   ([`storage::Ownership::owner_liveness`]) and has `owner_timeout_ms`
//!   to answer; a dead or hung owner does not, and the locks are taken
//!   over as above (`TookOver`); commands get ASYMMETRIC ACCESS STATE
//!   TRANSITION (04/0A) while that runs. An owner that answers is never
//!   taken over implicitly, so initiators probing standby paths cannot
//!   make the gateways fight.
//!
//! Each change of the states establishes ASYMMETRIC ACCESS STATE CHANGED
//! (2A/06) for every nexus. At start a gateway takes the locks if nobody
//! holds them (the first one up becomes the owner), and otherwise probes
//! the holder as above: a restarted owner takes its dead former self's
//! locks back at once instead of when an initiator knocks. Reservations are
//! refused (see [`scsi::LogicalUnit::without_reservations`]): their state
//! would live in one gateway only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use scsi::{AccessRefusal, AccessState, AluaOwner, Asc, LogicalUnit, PortGroups};
use storage::{Liveness, NotAccessible};

use crate::config::GatewayConfig;

/// The note (image metadata key) naming the owner's target port group.
pub const OWNER_NOTE: &str = "ironsan.owner_group";

/// What this gateway is for its target's images; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Holds every lock.
    Owner,
    /// Another gateway holds the locks: the one of this group, when
    /// recorded.
    Standby(Option<u16>),
    /// This gateway's cluster client was fenced (blocklisted) and a new
    /// one is not up yet; the owner is thought to be this group's.
    Fenced(Option<u16>),
}

/// What a gateway learned, or did; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Every lock is held by this gateway.
    HoldAll,
    /// Not every lock is held here (`some`: some are); the recorded owner.
    HoldNotAll { some: bool, recorded: Option<u16> },
    /// The cluster says this client was fenced.
    CutOff,
    /// Reading the locks failed for another reason: nothing is known.
    Unknown,
    /// A new cluster connection is up; the recorded owner.
    Reconnected(Option<u16>),
    /// This gateway took every lock.
    TookOver,
    /// This gateway gave every lock up.
    Released,
}

/// The outcome of [`next`]: the new role, and what the gateway must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub role: Role,
    /// Release the locks still held here.
    pub release: bool,
    /// Open a new cluster connection.
    pub reconnect: bool,
}

/// The one transition function of a gateway's ownership (module docs);
/// `peers` are the other gateways' groups.
pub fn next(role: Role, event: Event, peers: &[u16]) -> Step {
    let step = |role| Step {
        role,
        release: false,
        reconnect: false,
    };
    match event {
        Event::HoldAll | Event::TookOver => step(Role::Owner),
        Event::HoldNotAll { some, recorded } => Step {
            release: some,
            ..step(Role::Standby(recorded))
        },
        Event::CutOff => {
            let owner = match role {
                Role::Owner => match peers {
                    [only] => Some(*only),
                    _ => None,
                },
                Role::Standby(g) | Role::Fenced(g) => g,
            };
            Step {
                reconnect: true,
                ..step(Role::Fenced(owner))
            }
        }
        Event::Unknown => Step {
            reconnect: matches!(role, Role::Fenced(_)),
            ..step(role)
        },
        Event::Reconnected(recorded) => step(Role::Standby(recorded)),
        Event::Released => step(Role::Standby(match role {
            Role::Owner => None,
            Role::Standby(g) | Role::Fenced(g) => g,
        })),
    }
}

impl Role {
    /// The access state of every group, this gateway's (`own`) first, for
    /// this role.
    pub fn states(self, own: u16, peers: &[u16]) -> Vec<(u16, AccessState)> {
        let (mine, owner) = match self {
            Role::Owner => (AccessState::ActiveOptimized, None),
            Role::Standby(g) => (AccessState::Standby, g),
            Role::Fenced(g) => (AccessState::Unavailable, g),
        };
        let mut v = vec![(own, mine)];
        v.extend(peers.iter().map(|&p| {
            let st = if owner == Some(p) {
                AccessState::ActiveOptimized
            } else {
                AccessState::Standby
            };
            (p, st)
        }));
        v
    }
}

/// The gateway role of one target; see the module docs.
#[derive(Debug)]
pub struct Gateway {
    target: String,
    own: u16,
    peers: Vec<u16>,
    pg: Weak<PortGroups>,
    lus: Vec<Weak<LogicalUnit>>,
    /// The role, changed only by [`Gateway::apply`]. Its lock also
    /// serialises takeovers, releases and checks.
    role: Mutex<Role>,
    /// Take over when a command reaches this standby gateway when the
    /// owner is gone ([`GatewayConfig::implicit_failover`]).
    implicit: bool,
    /// The check interval: also the least time between two probes of the
    /// owner's liveness set off by refused commands.
    every: Duration,
    /// How long the owner has to answer a probe.
    owner_timeout: Duration,
    /// When a refused command last set off a probe.
    last_probe: Mutex<Option<Instant>>,
    /// An implicit takeover is running (commands get 04/0A meanwhile).
    transitioning: AtomicBool,
    /// This gateway, for the probe thread.
    me: Weak<Gateway>,
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
            role: Mutex::new(Role::Standby(None)),
            implicit: cfg.implicit_failover,
            every,
            owner_timeout: Duration::from_millis(cfg.owner_timeout_ms),
            last_probe: Mutex::new(None),
            transitioning: AtomicBool::new(false),
            me: me.clone(),
        });
        {
            let mut role = gw.role.lock();
            let event = gw
                .try_acquire()
                .map_err(|e| format!("gateway: target {target}: {e}"))?;
            gw.apply(&mut role, event, false);
            tracing::info!(target = %target, group = gw.own, role = ?*role, "gateway started");
        }
        pg.set_owner(gw.clone());
        // A lock held by a gateway that is gone (this one's former self,
        // restarted) is taken over now rather than when an initiator
        // knocks: the LU is served again as soon as possible.
        if gw.implicit && gw.role() != Role::Owner {
            gw.probe();
        }
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

    /// The role now.
    pub fn role(&self) -> Role {
        *self.role.lock()
    }

    /// The units still served.
    fn units(&self) -> Vec<Arc<LogicalUnit>> {
        self.lus.iter().filter_map(Weak::upgrade).collect()
    }

    /// Takes every lock when none is held by another; otherwise releases
    /// what it took (all or nothing).
    fn try_acquire(&self) -> std::io::Result<Event> {
        let units = self.units();
        let mut all = true;
        for lu in &units {
            if !ownership(lu).acquire()? {
                all = false;
                break;
            }
        }
        if all {
            for lu in &units {
                ownership(lu).set_note(OWNER_NOTE, &self.own.to_string())?;
            }
            return Ok(Event::HoldAll);
        }
        Ok(Event::HoldNotAll {
            some: true,
            recorded: self.recorded_owner(&units)?,
        })
    }

    /// The peer group recorded as owner in the first unit's notes.
    fn recorded_owner(&self, units: &[Arc<LogicalUnit>]) -> std::io::Result<Option<u16>> {
        let Some(lu) = units.first() else {
            return Ok(None);
        };
        let note = ownership(lu).note(OWNER_NOTE)?;
        Ok(note
            .and_then(|n| n.trim().parse().ok())
            .filter(|g| *g != self.own))
    }

    /// Reads the locks (and, as owner, the recorded owner, which also
    /// shows that this client still reaches the cluster) into an event.
    fn read_locks(&self, units: &[Arc<LogicalUnit>]) -> Event {
        let classify = |e: std::io::Error| {
            if NotAccessible::is_fenced(&e) {
                tracing::warn!(target = %self.target, "gateway: this client was fenced: {e}");
                Event::CutOff
            } else {
                tracing::warn!(target = %self.target, "gateway: cannot read the lock: {e}");
                Event::Unknown
            }
        };
        let mut mine = 0;
        for lu in units {
            match ownership(lu).is_owner() {
                Ok(true) => mine += 1,
                Ok(false) => {}
                Err(e) => return classify(e),
            }
        }
        match self.recorded_owner(units) {
            Err(e) => classify(e),
            Ok(_) if mine == units.len() => Event::HoldAll,
            Ok(recorded) => Event::HoldNotAll {
                some: mine > 0,
                recorded,
            },
        }
    }

    /// Applies `event` to the role under its lock: releases locks or
    /// reconnects as [`next`] says (a reconnection applies its own event),
    /// and shows the states; with `tell`, a change establishes 2A/06.
    fn apply(&self, role: &mut Role, event: Event, tell: bool) {
        let step = next(*role, event, &self.peers);
        if step.role != *role {
            tracing::info!(target = %self.target, group = self.own, from = ?*role, to = ?step.role, ?event, "gateway: role changed");
        }
        *role = step.role;
        if step.release {
            for lu in self.units() {
                if let Err(e) = ownership(&lu).release() {
                    tracing::warn!(target = %self.target, "gateway: releasing a lock: {e}");
                }
            }
        }
        self.show(*role, tell);
        if step.reconnect {
            match self.reconnect() {
                Ok(recorded) => self.apply(role, Event::Reconnected(recorded), tell),
                Err(e) => {
                    tracing::warn!(target = %self.target, "gateway: cannot connect to the cluster again (retrying every check): {e}")
                }
            }
        }
    }

    /// A new cluster connection for every unit; the recorded owner.
    fn reconnect(&self) -> std::io::Result<Option<u16>> {
        let units = self.units();
        for lu in &units {
            ownership(lu).reconnect()?;
        }
        self.recorded_owner(&units)
    }

    /// Re-reads the locks and updates the role; false when the target is
    /// gone (the check thread then ends).
    fn check(&self) -> bool {
        let units = self.units();
        if units.is_empty() || self.pg.upgrade().is_none() {
            return false;
        }
        let mut role = self.role.lock();
        let event = self.read_locks(&units);
        self.apply(&mut role, event, true);
        true
    }

    /// Sets the group states for `role`; with `tell`, a change
    /// establishes 2A/06 on every nexus. Returns whether a state changed.
    fn show(&self, role: Role, tell: bool) -> bool {
        let Some(pg) = self.pg.upgrade() else {
            return false;
        };
        let mut changed = false;
        for (g, st) in role.states(self.own, &self.peers) {
            changed |= pg.set_state(g, st).unwrap_or(false);
        }
        if changed {
            tracing::info!(target = %self.target, group = self.own, ?role, "gateway: ALUA states changed");
            if tell {
                for lu in self.units() {
                    lu.unit_attention_all(Asc::ASYMMETRIC_ACCESS_STATE_CHANGED);
                }
            }
        }
        changed
    }

    /// Takes every lock over and records this group as the owner. With
    /// `only_from` (one entry per unit), only locks still held by the
    /// holders a probe found silent: false when one moved meanwhile
    /// (another standby took over first), and what was taken is given up
    /// again at the next check.
    fn take_over(&self, only_from: Option<&[String]>) -> std::io::Result<bool> {
        let units = self.units();
        for (k, lu) in units.iter().enumerate() {
            let from = only_from.and_then(|f| f.get(k)).map(String::as_str);
            if !ownership(lu).take_over(from)? {
                tracing::info!(target = %self.target, "gateway: the owner changed meanwhile; not taking over");
                return Ok(false);
            }
        }
        for lu in &units {
            ownership(lu).set_note(OWNER_NOTE, &self.own.to_string())?;
        }
        tracing::warn!(target = %self.target, group = self.own, "gateway: took the images over");
        Ok(true)
    }

    /// The event a failed cluster call means.
    fn failed(&self, what: &str, e: &std::io::Error) -> Event {
        tracing::error!(target = %self.target, "gateway: {what}: {e}");
        if NotAccessible::is_fenced(e) {
            Event::CutOff
        } else {
            Event::Unknown
        }
    }

    /// Takes the images over if the gateway holding them does not answer
    /// (implicit failover).
    fn take_over_if_owner_gone(&self) {
        let mut role = self.role.lock();
        if *role == Role::Owner {
            return;
        }
        let units = self.units();
        // Per unit, the holder found silent ("": none).
        let mut silent = Vec::with_capacity(units.len());
        for lu in &units {
            match ownership(lu).owner_liveness(self.owner_timeout) {
                Ok(Liveness::NoOtherOwner) => silent.push(String::new()),
                Ok(Liveness::Silent(holder)) => silent.push(holder),
                Ok(Liveness::Answers) => {
                    tracing::debug!(target = %self.target, "gateway: the owner answers; staying standby");
                    return;
                }
                Err(e) => {
                    let event = self.failed("cannot tell whether the owner is there", &e);
                    self.apply(&mut role, event, true);
                    return;
                }
            }
        }
        tracing::warn!(target = %self.target, timeout = ?self.owner_timeout, "gateway: the owner does not answer; taking over");
        self.transitioning.store(true, Ordering::Release);
        match self.take_over(Some(&silent)) {
            Ok(true) => self.apply(&mut role, Event::TookOver, true),
            // Another gateway was quicker: the next check reads who.
            Ok(false) => {}
            Err(e) => {
                let event = self.failed("implicit take-over failed", &e);
                self.apply(&mut role, event, true);
            }
        }
        self.transitioning.store(false, Ordering::Release);
    }

    /// Starts a probe of the owner ([`Gateway::take_over_if_owner_gone`])
    /// on a thread of its own (cluster calls block), unless one started
    /// less than a check interval ago.
    fn probe(&self) {
        {
            let mut last = self.last_probe.lock();
            if last.is_some_and(|t| t.elapsed() < self.every) {
                return;
            }
            *last = Some(Instant::now());
        }
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
        // This command gets the plain standby answer, later ones 04/0A
        // while a takeover runs, then the active group serves them.
        self.probe();
        None
    }

    fn set_states(&self, changes: &[(u16, AccessState)]) -> Result<bool, AccessRefusal> {
        let mut role = self.role.lock();
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
        let before = pg.states();
        match mine {
            None => return Ok(false),
            Some(st) if st.is_active() => {
                if let Err(e) = self.take_over(None) {
                    let event = self.failed("take-over failed", &e);
                    self.apply(&mut role, event, false);
                    return Err(AccessRefusal::InState(AccessState::Standby));
                }
                self.apply(&mut role, Event::TookOver, false);
            }
            Some(st) => {
                if let Err(e) = self.release() {
                    tracing::error!(target = %self.target, "gateway: release failed: {e}");
                    return Err(AccessRefusal::Failed);
                }
                self.apply(&mut role, Event::Released, false);
                // Standby or unavailable, as asked; the peers keep theirs.
                pg.set_state(self.own, st);
            }
        }
        Ok(pg.states() != before)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};
    use std::io;

    use scsi::{Command, GroupSpec, LuConfig, NexusId};
    use storage::{BlockBackend, Liveness, MemBackend, NotAccessible, Ownership, WriteCache};

    use super::*;
    use crate::config::GatewayPeerConfig;

    /// One image several gateways reach, with an exclusive lock like RBD's,
    /// and faults to inject.
    #[derive(Default)]
    struct Cluster {
        owner: Option<u32>,
        /// Client instances cut off for good (blocklisted).
        fenced: HashSet<u32>,
        /// Clients that died or hang: they do not answer probes.
        dead: HashSet<u32>,
        /// The cluster does not answer at all.
        unreachable: bool,
        /// New connections are refused.
        refuse_connections: bool,
        /// The last client instance id handed out.
        last_id: u32,
        notes: HashMap<String, String>,
    }

    /// One gateway's client of the image; a reconnection makes it a new
    /// client instance.
    struct Client {
        id: std::sync::atomic::AtomicU32,
        cluster: Arc<Mutex<Cluster>>,
        data: Arc<MemBackend>,
    }

    impl Client {
        fn id(&self) -> u32 {
            self.id.load(Ordering::Relaxed)
        }

        /// The cluster, as this client reaches it.
        fn reach(&self) -> io::Result<parking_lot::MutexGuard<'_, Cluster>> {
            let c = self.cluster.lock();
            if c.unreachable {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer"));
            }
            if c.fenced.contains(&self.id()) {
                return Err(NotAccessible::fenced(format!("client {}", self.id())));
            }
            Ok(c)
        }

        fn usable(&self, write: bool) -> io::Result<()> {
            let c = self.reach()?;
            if write && c.owner != Some(self.id()) {
                return Err(NotAccessible::error(format!("client {}", self.id())));
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
            let mut c = self.reach()?;
            if c.owner.is_none() {
                c.owner = Some(self.id());
            }
            Ok(c.owner == Some(self.id()))
        }
        fn is_owner(&self) -> io::Result<bool> {
            Ok(self.reach()?.owner == Some(self.id()))
        }
        fn take_over(&self, only_from: Option<&str>) -> io::Result<bool> {
            let mut c = self.reach()?;
            let holder = c.owner.map_or(String::new(), |o| o.to_string());
            if only_from.is_some_and(|f| f != holder) && c.owner != Some(self.id()) {
                return Ok(false);
            }
            if let Some(old) = c.owner.filter(|&o| o != self.id()) {
                c.fenced.insert(old);
            }
            c.owner = Some(self.id());
            Ok(true)
        }
        fn owner_liveness(&self, _within: Duration) -> io::Result<Liveness> {
            let c = self.reach()?;
            Ok(match c.owner {
                None => Liveness::NoOtherOwner,
                Some(o) if o == self.id() => Liveness::NoOtherOwner,
                Some(o) if c.dead.contains(&o) => Liveness::Silent(o.to_string()),
                Some(_) => Liveness::Answers,
            })
        }
        fn reconnect(&self) -> io::Result<()> {
            let mut c = self.cluster.lock();
            if c.unreachable || c.refuse_connections {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer"));
            }
            c.last_id += 1;
            self.id.store(c.last_id, Ordering::Relaxed);
            Ok(())
        }
        fn release(&self) -> io::Result<()> {
            let mut c = self.reach()?;
            if c.owner == Some(self.id()) {
                c.owner = None;
            }
            Ok(())
        }
        fn note(&self, key: &str) -> io::Result<Option<String>> {
            Ok(self.reach()?.notes.get(key).cloned())
        }
        fn set_note(&self, key: &str, value: &str) -> io::Result<()> {
            self.reach()?.notes.insert(key.into(), value.into());
            Ok(())
        }
        fn on_resized_elsewhere(&self, _changed: storage::SizeChanged) {}
    }

    struct Gw {
        client: Arc<Client>,
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
                    GroupSpec::new(group, &[port], AccessState::Standby),
                    GroupSpec::new(peer.0, &[peer.1], AccessState::Standby),
                ],
                true,
            )
            .unwrap(),
        );
        {
            let mut c = cluster.lock();
            c.last_id = c.last_id.max(id);
        }
        let backend = Arc::new(Client {
            id: std::sync::atomic::AtomicU32::new(id),
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
        let client = backend.clone();
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
            owner_timeout_ms: 500,
        };
        let gw = Gateway::start("iqn.test:gw", &gcfg, &pg, std::slice::from_ref(&lu)).unwrap();
        Gw {
            client,
            pg,
            lu,
            gw,
            group,
            port,
        }
    }

    /// One image and gateways A (group 1, port 1) and B (group 2, port
    /// 17) on it; A, up first, owns it.
    fn two_gateways() -> (Arc<Mutex<Cluster>>, Arc<MemBackend>, Gw, Gw) {
        let cluster = Arc::new(Mutex::new(Cluster::default()));
        let data = Arc::new(MemBackend::new(1 << 20));
        let a = gateway(1, 1, 1, (2, 17), &cluster, &data);
        let b = gateway(2, 2, 17, (1, 1), &cluster, &data);
        (cluster, data, a, b)
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
        let (cluster, data, a, b) = two_gateways();
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
        let (cluster, _data, a, b) = two_gateways();
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

    #[test]
    fn every_transition_of_the_state_machine() {
        use AccessState::{ActiveOptimized as Ao, Standby as Sb, Unavailable as Ua};
        use Event::*;
        use Role::*;
        let one = [2u16];
        let two = [2u16, 3];
        let go = |role, ev| next(role, ev, &one);
        let plain = |role| Step {
            role,
            release: false,
            reconnect: false,
        };
        for from in [Owner, Standby(Some(2)), Standby(None), Fenced(Some(2))] {
            assert_eq!(go(from, HoldAll), plain(Owner), "{from:?}");
            assert_eq!(go(from, TookOver), plain(Owner), "{from:?}");
            let some = HoldNotAll {
                some: true,
                recorded: Some(2),
            };
            let none = HoldNotAll {
                some: false,
                recorded: Some(2),
            };
            assert_eq!(
                go(from, some),
                Step {
                    release: true,
                    ..plain(Standby(Some(2)))
                }
            );
            assert_eq!(go(from, none), plain(Standby(Some(2))));
            assert_eq!(go(from, Reconnected(None)), plain(Standby(None)));
            assert!(go(from, CutOff).reconnect);
            assert!(matches!(go(from, CutOff).role, Fenced(_)));
        }
        // Fenced: the owner is the one known before, or the only peer.
        assert_eq!(go(Owner, CutOff).role, Fenced(Some(2)));
        assert_eq!(next(Owner, CutOff, &two).role, Fenced(None));
        assert_eq!(go(Standby(Some(2)), CutOff).role, Fenced(Some(2)));
        // Nothing known: only a fenced gateway acts (tries again).
        assert_eq!(go(Owner, Unknown), plain(Owner));
        assert_eq!(go(Standby(Some(2)), Unknown), plain(Standby(Some(2))));
        assert_eq!(
            go(Fenced(Some(2)), Unknown),
            Step {
                reconnect: true,
                ..plain(Fenced(Some(2)))
            }
        );
        // Giving up keeps the owner known.
        assert_eq!(go(Owner, Released), plain(Standby(None)));
        assert_eq!(go(Standby(Some(2)), Released), plain(Standby(Some(2))));
        // What each role reports.
        assert_eq!(Owner.states(1, &two), vec![(1, Ao), (2, Sb), (3, Sb)]);
        assert_eq!(
            Standby(Some(3)).states(1, &two),
            vec![(1, Sb), (2, Sb), (3, Ao)]
        );
        assert_eq!(
            Fenced(Some(2)).states(1, &two),
            vec![(1, Ua), (2, Ao), (3, Sb)]
        );
        assert_eq!(
            Standby(None).states(1, &two),
            vec![(1, Sb), (2, Sb), (3, Sb)]
        );
    }

    fn rtpg_view(g: &Gw) -> Vec<(u16, AccessState)> {
        let mut v = g.pg.states();
        v.sort_by_key(|(g, st)| (*g, st.code()));
        v
    }

    /// A hung owner (SIGSTOP) is taken over; when it resumes it finds
    /// itself fenced, steps down, connects again as a new client and is a
    /// standby that takes over in its turn when the new owner dies: the LU
    /// is never left without a serving gateway.
    #[test]
    fn a_fenced_owner_steps_down_reconnects_and_can_take_over_again() {
        let (cluster, data, a, b) = two_gateways();
        let block = vec![0x22u8; 512];
        // B probed A at its start (A answers); probes are at most one per
        // check interval (100 ms): that probe ends and the interval passes
        // before A hangs.
        std::thread::sleep(Duration::from_millis(150));
        // A hangs: it does not answer probes; a command through B takes over.
        cluster.lock().dead.insert(1);
        let _ = run(&b, &write10(0), &block);
        eventually("B owner", || b.gw.role() == Role::Owner);
        assert!(cluster.lock().fenced.contains(&1), "A was fenced first");
        assert!(run(&b, &write10(0), &[]).sense.is_some(), "2A/06 once");
        assert!(run(&b, &write10(0), &block).is_good());
        // A resumes: its writes fail (fenced), never land.
        cluster.lock().dead.remove(&1);
        let late = vec![0x99u8; 512];
        assert_eq!(sense_of(&run(&a, &write10(1), &late)), (0x02, 0x04, 0x0B));
        // Its next check steps down, reconnects, and agrees with B.
        assert!(a.gw.check());
        assert_eq!(a.gw.role(), Role::Standby(Some(2)));
        assert_eq!(rtpg_view(&a), rtpg_view(&b));
        assert_eq!(a.pg.state(2), AccessState::ActiveOptimized);
        assert_eq!(a.pg.state(1), AccessState::Standby);
        assert!(
            !cluster.lock().fenced.contains(&a.client.id()),
            "a new client"
        );
        // B dies: A takes over on the next command and serves (the first
        // one hears of A's own change, 2A/06).
        cluster.lock().dead.insert(2);
        assert_eq!(sense_of(&run(&a, &write10(2), &block)), (0x06, 0x2A, 0x06));
        assert_eq!(sense_of(&run(&a, &write10(2), &block)), (0x02, 0x04, 0x0B));
        eventually("A owner", || a.gw.role() == Role::Owner);
        let _ = run(&a, &write10(2), &block);
        assert!(run(&a, &write10(2), &block).is_good());
        assert!(b.gw.check());
        assert_eq!(b.gw.role(), Role::Standby(Some(1)));
        assert_eq!(rtpg_view(&a), rtpg_view(&b));
        let mut back = vec![0u8; 512];
        data.read_at(&mut back, 512).unwrap();
        assert!(
            back.iter().all(|&x| x == 0),
            "A's write while fenced never landed"
        );
        data.read_at(&mut back, 1024).unwrap();
        assert_eq!(back, block);
    }

    /// A cluster that does not answer changes nobody's role; a fenced
    /// gateway that cannot reconnect stays unavailable and tries again at
    /// each check.
    #[test]
    fn an_unreachable_cluster_changes_nothing_and_reconnection_is_retried() {
        let (cluster, _data, a, b) = two_gateways();
        cluster.lock().unreachable = true;
        assert!(a.gw.check() && b.gw.check());
        assert_eq!(a.gw.role(), Role::Owner);
        assert_eq!(b.gw.role(), Role::Standby(Some(1)));
        cluster.lock().unreachable = false;
        // B takes over explicitly; A is fenced, and cannot connect again
        // for a while.
        let (cdb, list) = stpg(2, AccessState::ActiveOptimized);
        assert!(run(&b, &cdb, &list).is_good());
        cluster.lock().refuse_connections = true;
        assert!(a.gw.check());
        assert_eq!(a.gw.role(), Role::Fenced(Some(2)));
        assert_eq!(a.pg.state(1), AccessState::Unavailable);
        assert_eq!(a.pg.state(2), AccessState::ActiveOptimized);
        assert_eq!(
            sense_of(&run(&a, &write10(0), &[0u8; 512])),
            (0x02, 0x04, 0x0C)
        );
        assert!(a.gw.check(), "still refused: tries again");
        assert_eq!(a.gw.role(), Role::Fenced(Some(2)));
        cluster.lock().refuse_connections = false;
        assert!(a.gw.check());
        assert_eq!(a.gw.role(), Role::Standby(Some(2)));
        assert_eq!(rtpg_view(&a), rtpg_view(&b));
    }

    /// Two standbys that found the same owner silent: the second to act
    /// leaves the first's fresh lock alone instead of fencing it.
    #[test]
    fn a_standby_beaten_to_the_takeover_leaves_the_new_owner_alone() {
        let (cluster, data, _a, b) = two_gateways();
        let c = gateway(3, 3, 33, (1, 1), &cluster, &data);
        cluster.lock().dead.insert(1);
        let silent = vec!["1".to_string()];
        assert!(c.gw.take_over(Some(&silent)).unwrap());
        assert!(!b.gw.take_over(Some(&silent)).unwrap());
        let cl = cluster.lock();
        assert_eq!(cl.owner, Some(3));
        assert!(cl.fenced.contains(&1) && !cl.fenced.contains(&3));
    }
}
