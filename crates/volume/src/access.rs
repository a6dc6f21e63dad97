//! Access states of a volume through its ports' groups: SPC-4 §5.15
//! asymmetric logical unit access (target port groups) and, the same model
//! under other names, NVMe asymmetric namespace access (ANA groups, NVMe
//! Base Specification 2.0 §8.1). A personality reports and changes them in
//! its own encoding (the `scsi` crate's `alua` module: REPORT and SET
//! TARGET PORT GROUPS, the commands a standby or unavailable port refuses).
//!
//! One [`PortGroups`] per target, shared (`Arc`) by every volume of it:
//! all of them are seen through a port in the same state, as multipath
//! hosts expect. The groups are configured ([`GroupSpec`]) and may gain or
//! lose ports at run time; a state changes by explicit request
//! ([`PortGroups::apply`], or an [`AccessOwner`] that decides for several
//! processes sharing storage) or by management ([`PortGroups::set_state`]).
//! Transitions are instantaneous.
//!
//! A command's access state is one scan over the (few) groups and one
//! relaxed atomic load: no lock. Only changes take a mutex.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use parking_lot::{Mutex, RwLock};

/// What set a group's state last (SPC-4's STATUS CODE in REPORT TARGET PORT
/// GROUPS has the same three values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ChangedBy {
    /// Nothing since it was configured.
    Nobody = 0,
    /// An explicit request (SET TARGET PORT GROUPS).
    Request = 1,
    /// A management action or an implicit change.
    Management = 2,
}

/// Most target port groups of one target (a STPG list names each once).
pub const MAX_GROUPS: usize = 256;
/// Most target ports in one group (the TARGET PORT COUNT field is a byte).
pub const MAX_PORTS_PER_GROUP: usize = 255;
/// An asymmetric access state (SPC-4 §6.36.2, table 168).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AccessState {
    /// Every command is processed at full performance.
    ActiveOptimized = 0x0,
    /// Every command is processed, possibly more slowly.
    ActiveNonOptimized = 0x1,
    /// Only management commands; others NOT READY 04/0B.
    Standby = 0x2,
    /// Only identification commands; others NOT READY 04/0C.
    Unavailable = 0x3,
}

impl AccessState {
    /// The state with ASYMMETRIC ACCESS STATE code `c`, if supported.
    pub fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            0x0 => AccessState::ActiveOptimized,
            0x1 => AccessState::ActiveNonOptimized,
            0x2 => AccessState::Standby,
            0x3 => AccessState::Unavailable,
            _ => return None,
        })
    }

    /// The ASYMMETRIC ACCESS STATE code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The configuration spelling: `active-optimized`,
    /// `active-non-optimized`, `standby`, `unavailable`.
    pub const fn name(self) -> &'static str {
        match self {
            AccessState::ActiveOptimized => "active-optimized",
            AccessState::ActiveNonOptimized => "active-non-optimized",
            AccessState::Standby => "standby",
            AccessState::Unavailable => "unavailable",
        }
    }

    /// Parses [`Self::name`].
    pub fn parse(s: &str) -> Option<Self> {
        [
            AccessState::ActiveOptimized,
            AccessState::ActiveNonOptimized,
            AccessState::Standby,
            AccessState::Unavailable,
        ]
        .into_iter()
        .find(|st| st.name() == s)
    }

    /// True for the two active states, in which every command runs.
    #[inline]
    pub const fn is_active(self) -> bool {
        matches!(
            self,
            AccessState::ActiveOptimized | AccessState::ActiveNonOptimized
        )
    }
}

/// Why an owner of the states refuses (each personality answers in its own
/// terms: SCSI sense data, NVMe status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessRefusal {
    /// A transition between states is under way (SCSI: NOT READY, 04/0A;
    /// NVMe: Asymmetric Access Transition).
    Transitioning,
    /// The path is in this (inactive) state and cannot serve the request.
    InState(AccessState),
    /// The `k`-th requested change (from 0, in the request's order) cannot
    /// be made.
    InvalidChange(usize),
    /// Carrying the change out failed.
    Failed,
}

/// Decides explicit state changes (SCSI's SET TARGET PORT GROUPS) when the
/// states are not this process's alone to set: a gateway whose groups
/// follow who owns storage shared with other gateways (`server::gateway`,
/// docs/GATEWAYS.md).
pub trait AccessOwner: Send + Sync + std::fmt::Debug {
    /// Makes the requested `(group id, state)` changes hold (the ids are
    /// those of existing groups, each once), setting states with
    /// [`PortGroups::set_state`] without establishing unit attentions;
    /// may block (it runs on the I/O pool). Returns whether some state
    /// changed, or why not.
    fn set_states(&self, changes: &[(u16, AccessState)]) -> Result<bool, AccessRefusal>;

    /// A command came through group `tpg`, which is in `state` (standby
    /// or unavailable) and refuses it: an initiator tries this path. What
    /// to answer instead of the plain refusal (e.g. a transition it set
    /// off runs), or `None`. Must not block: it runs on the event loop.
    fn refused_access(&self, tpg: u16, state: AccessState) -> Option<AccessRefusal> {
        let _ = (tpg, state);
        None
    }
}

/// One target port group as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSpec {
    /// TARGET PORT GROUP identifier (1..=65535).
    pub id: u16,
    /// Relative target port identifiers of its members (1..=65535).
    pub ports: Vec<u16>,
    /// Initial (and, with implicit ALUA only, permanent) state.
    pub state: AccessState,
    /// PREF: the group is a preferred path.
    pub preferred: bool,
}

impl GroupSpec {
    /// Group `id` of `ports` in `state`, not preferred.
    pub fn new(id: u16, ports: &[u16], state: AccessState) -> Self {
        GroupSpec {
            id,
            ports: ports.to_vec(),
            state,
            preferred: false,
        }
    }
}

/// Why a port group description was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    /// Group identifier 0 is not usable.
    #[error("target port group id 0 is not allowed (1..=65535)")]
    ZeroGroup,
    /// Relative target port identifier 0 is reserved (SPC-4 §7.8.6.7).
    #[error("relative target port 0 is reserved (1..=65535)")]
    ZeroPort,
    /// Two groups with one id.
    #[error("target port group {0} is defined twice")]
    DuplicateGroup(u16),
    /// A port in two groups (or twice in one).
    #[error("target port {0} is in more than one target port group")]
    DuplicatePort(u16),
    /// A group without ports.
    #[error("target port group {0} has no target port")]
    EmptyGroup(u16),
    /// More groups or ports than the formats carry.
    #[error("too many target port groups or ports (at most {MAX_GROUPS} groups of {MAX_PORTS_PER_GROUP} ports)")]
    TooMany,
}

/// One target port group and its state ([`PortGroups::groups`]).
#[derive(Debug)]
pub struct Group {
    id: u16,
    /// Member relative target ports; changes when the target driver adds
    /// or removes a port at run time (read only by REPORT TARGET PORT
    /// GROUPS and [`PortGroups::group_of`], never on the I/O path).
    ports: RwLock<Vec<u16>>,
    preferred: bool,
    state: AtomicU8,
    status: AtomicU8,
}

impl Group {
    /// The group identifier.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// Its member ports now (empty when every one was removed).
    pub fn ports(&self) -> Vec<u16> {
        self.ports.read().clone()
    }

    /// The group is a preferred path.
    pub fn preferred(&self) -> bool {
        self.preferred
    }

    /// What set its state last.
    pub fn changed_by(&self) -> ChangedBy {
        match self.status.load(Ordering::Relaxed) {
            1 => ChangedBy::Request,
            2 => ChangedBy::Management,
            _ => ChangedBy::Nobody,
        }
    }

    /// Its access state.
    #[inline]
    pub fn state(&self) -> AccessState {
        AccessState::from_code(self.state.load(Ordering::Relaxed))
            .unwrap_or(AccessState::ActiveOptimized)
    }
}

/// The target port groups of one SCSI target device and their states.
///
/// `PortGroups::default()` has no group and implicit ALUA only: every port
/// is active/optimized, and REPORT TARGET PORT GROUPS describes just the
/// group of the port the command came through.
#[derive(Debug, Default)]
pub struct PortGroups {
    explicit: bool,
    /// The groups, in configuration order, then those added at run time
    /// ([`PortGroups::add_group`]): [`MAX_GROUPS`] slots, filled from the
    /// front and never emptied, so readers need no lock.
    groups: Box<[OnceLock<Group>]>,
    /// Serialises SET TARGET PORT GROUPS so a list applies atomically
    /// (and membership changes).
    change: Mutex<()>,
    /// Who carries out SET TARGET PORT GROUPS, when not this table.
    owner: OnceLock<std::sync::Arc<dyn AccessOwner>>,
}

impl PortGroups {
    /// Groups as configured; `explicit` allows SET TARGET PORT GROUPS.
    pub fn new(specs: Vec<GroupSpec>, explicit: bool) -> Result<Self, GroupError> {
        if specs.len() > MAX_GROUPS {
            return Err(GroupError::TooMany);
        }
        let mut seen_ports = std::collections::HashSet::new();
        for (i, g) in specs.iter().enumerate() {
            if g.id == 0 {
                return Err(GroupError::ZeroGroup);
            }
            if specs[..i].iter().any(|o| o.id == g.id) {
                return Err(GroupError::DuplicateGroup(g.id));
            }
            if g.ports.is_empty() {
                return Err(GroupError::EmptyGroup(g.id));
            }
            if g.ports.len() > MAX_PORTS_PER_GROUP {
                return Err(GroupError::TooMany);
            }
            for &p in &g.ports {
                if p == 0 {
                    return Err(GroupError::ZeroPort);
                }
                if !seen_ports.insert(p) {
                    return Err(GroupError::DuplicatePort(p));
                }
            }
        }
        let groups: Box<[OnceLock<Group>]> = (0..MAX_GROUPS).map(|_| OnceLock::new()).collect();
        for (slot, g) in groups.iter().zip(specs) {
            let _ = slot.set(Group {
                id: g.id,
                ports: RwLock::new(g.ports),
                preferred: g.preferred,
                state: AtomicU8::new(g.state.code()),
                status: AtomicU8::new(0),
            });
        }
        Ok(PortGroups {
            explicit,
            groups,
            change: Mutex::new(()),
            owner: OnceLock::new(),
        })
    }

    /// Hands SET TARGET PORT GROUPS to `owner` (once; later calls are
    /// ignored and return false).
    pub fn set_owner(&self, owner: std::sync::Arc<dyn AccessOwner>) -> bool {
        self.owner.set(owner).is_ok()
    }

    /// Every group, in order.
    #[inline]
    fn iter(&self) -> impl Iterator<Item = &Group> {
        self.groups.iter().map_while(OnceLock::get)
    }

    /// Every group, in order (for reports of the states).
    pub fn groups(&self) -> impl Iterator<Item = &Group> {
        self.iter()
    }

    /// The position of group `id` among [`Self::groups`].
    pub fn index_of(&self, id: u16) -> Option<usize> {
        self.iter().position(|g| g.id == id)
    }

    /// Who carries out explicit requests, when not this table.
    pub fn owner(&self) -> Option<&std::sync::Arc<dyn AccessOwner>> {
        self.owner.get()
    }

    /// Adds group `id` with the one port `port` in `state` (a portal added
    /// at run time in a group of its own); false when the id or the port
    /// is in use, or every slot is.
    pub fn add_group(&self, id: u16, port: u16, state: AccessState) -> bool {
        let _guard = self.change.lock();
        if id == 0 || port == 0 || self.iter().any(|g| g.id == id) || self.group_of(port).is_some()
        {
            return false;
        }
        let Some(slot) = self.groups.iter().find(|s| s.get().is_none()) else {
            return false;
        };
        slot.set(Group {
            id,
            ports: RwLock::new(vec![port]),
            preferred: false,
            state: AtomicU8::new(state.code()),
            status: AtomicU8::new(0),
        })
        .is_ok()
    }

    /// The member ports of group `id` (empty when it has none left, or
    /// there is no such group).
    pub fn ports_of(&self, id: u16) -> Vec<u16> {
        self.iter()
            .find(|g| g.id == id)
            .map(|g| g.ports.read().clone())
            .unwrap_or_default()
    }

    /// What to answer a command refused through group `tpg` in `state`,
    /// when the owner ([`Self::set_owner`]) has something to say.
    pub fn owner_refusal(&self, tpg: u16, state: AccessState) -> Option<AccessRefusal> {
        self.owner.get()?.refused_access(tpg, state)
    }

    /// Whether SET TARGET PORT GROUPS is supported (TPGS = 11b).
    pub fn is_explicit(&self) -> bool {
        self.explicit
    }

    /// The access state of target port group `tpg`; a group that is not
    /// configured is active/optimized. Lock-free.
    #[inline]
    pub fn state(&self, tpg: u16) -> AccessState {
        for g in self.iter() {
            if g.id == tpg {
                return g.state();
            }
        }
        AccessState::ActiveOptimized
    }

    /// The group relative target port `port` belongs to.
    pub fn group_of(&self, port: u16) -> Option<u16> {
        self.iter()
            .find(|g| g.ports.read().contains(&port))
            .map(|g| g.id)
    }

    /// Adds relative target port `port` to group `id` (a port added at run
    /// time); false when there is no such group, the group is full or the
    /// port is in a group already.
    pub fn add_port(&self, id: u16, port: u16) -> bool {
        let _guard = self.change.lock();
        if port == 0 || self.group_of(port).is_some() {
            return false;
        }
        let Some(g) = self.iter().find(|g| g.id == id) else {
            return false;
        };
        let mut ports = g.ports.write();
        if ports.len() >= MAX_PORTS_PER_GROUP {
            return false;
        }
        ports.push(port);
        true
    }

    /// Removes relative target port `port` from its group (the port was
    /// removed at run time); returns the group it left. A group left
    /// without ports keeps its state but is no longer reported.
    pub fn remove_port(&self, port: u16) -> Option<u16> {
        let _guard = self.change.lock();
        self.iter().find_map(|g| {
            let mut ports = g.ports.write();
            let i = ports.iter().position(|&p| p == port)?;
            ports.remove(i);
            Some(g.id)
        })
    }

    /// Relative target ports in every group: more than one makes the
    /// units multi-port (INQUIRY MULTIP).
    pub fn port_count(&self) -> usize {
        self.iter().map(|g| g.ports.read().len()).sum()
    }

    /// Every group id with its current state, in configuration order.
    pub fn states(&self) -> Vec<(u16, AccessState)> {
        self.iter().map(|g| (g.id, g.state())).collect()
    }

    /// Moves group `id` to `state` by management action (the admin API,
    /// STATUS CODE "altered by implicit asymmetric access state change").
    /// `None` when no such group exists, else whether the state changed;
    /// the caller establishes 2A/06 on the units that use these groups.
    pub fn set_state(&self, id: u16, state: AccessState) -> Option<bool> {
        let g = self.iter().find(|g| g.id == id)?;
        let _guard = self.change.lock();
        let changed = g.state.swap(state.code(), Ordering::Relaxed) != state.code();
        g.status
            .store(ChangedBy::Management as u8, Ordering::Relaxed);
        Some(changed)
    }

    /// Applies `changes` (group indexes, [`Self::index_of`]) atomically,
    /// as an explicit request; true when some state changed.
    pub fn apply(&self, changes: &[(usize, AccessState)]) -> bool {
        let _guard = self.change.lock();
        let mut changed = false;
        for &(i, st) in changes {
            let Some(g) = self.groups[i].get() else {
                continue;
            };
            changed |= g.state.swap(st.code(), Ordering::Relaxed) != st.code();
            g.status.store(ChangedBy::Request as u8, Ordering::Relaxed);
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        use AccessState::*;
        assert_eq!(
            PortGroups::new(vec![GroupSpec::new(0, &[1], ActiveOptimized)], false).unwrap_err(),
            GroupError::ZeroGroup
        );
        assert_eq!(
            PortGroups::new(vec![GroupSpec::new(1, &[0], ActiveOptimized)], false).unwrap_err(),
            GroupError::ZeroPort
        );
        assert_eq!(
            PortGroups::new(
                vec![
                    GroupSpec::new(1, &[1], Standby),
                    GroupSpec::new(1, &[2], Standby)
                ],
                false
            )
            .unwrap_err(),
            GroupError::DuplicateGroup(1)
        );
        assert_eq!(
            PortGroups::new(
                vec![
                    GroupSpec::new(1, &[1, 2], Standby),
                    GroupSpec::new(2, &[2], Standby)
                ],
                false
            )
            .unwrap_err(),
            GroupError::DuplicatePort(2)
        );
        assert_eq!(
            PortGroups::new(vec![GroupSpec::new(3, &[], Standby)], false).unwrap_err(),
            GroupError::EmptyGroup(3)
        );
        let many: Vec<u16> = (1..=256).collect();
        assert_eq!(
            PortGroups::new(vec![GroupSpec::new(3, &many, Standby)], false).unwrap_err(),
            GroupError::TooMany
        );
    }

    #[test]
    fn state_names_round_trip() {
        for c in 0..16u8 {
            match AccessState::from_code(c) {
                Some(s) => {
                    assert_eq!(s.code(), c);
                    assert_eq!(AccessState::parse(s.name()), Some(s));
                }
                None => assert!(c > 3),
            }
        }
        assert_eq!(AccessState::parse("offline"), None);
    }

    #[test]
    fn lookups() {
        let pg = PortGroups::new(
            vec![
                GroupSpec::new(10, &[1, 3], AccessState::ActiveOptimized),
                GroupSpec::new(20, &[2], AccessState::Standby),
            ],
            true,
        )
        .unwrap();
        assert_eq!(pg.group_of(3), Some(10));
        assert_eq!(pg.group_of(2), Some(20));
        assert_eq!(pg.group_of(4), None);
        // Ports added and removed at run time.
        assert!(pg.add_port(20, 4));
        assert!(!pg.add_port(20, 4), "already a member");
        assert!(!pg.add_port(30, 5), "no such group");
        assert_eq!(pg.group_of(4), Some(20));
        assert!(pg.add_group(30, 5, AccessState::Standby));
        assert!(!pg.add_group(30, 6, AccessState::Standby), "id in use");
        assert!(!pg.add_group(31, 5, AccessState::Standby), "port in use");
        assert_eq!(pg.state(30), AccessState::Standby);
        assert_eq!(pg.ports_of(30), vec![5]);
        assert_eq!(pg.remove_port(2), Some(20));
        assert_eq!(pg.remove_port(2), None);
        assert_eq!(pg.group_of(2), None);
        assert_eq!(pg.state(20), AccessState::Standby);
        assert_eq!(pg.state(99), AccessState::ActiveOptimized);
        assert_eq!(pg.index_of(30), Some(2));
        assert_eq!(pg.groups().map(Group::id).collect::<Vec<_>>(), [10, 20, 30]);
        assert_eq!(pg.set_state(30, AccessState::ActiveOptimized), Some(true));
        assert_eq!(
            pg.groups().nth(2).map(Group::changed_by),
            Some(ChangedBy::Management)
        );
        assert!(pg.apply(&[(1, AccessState::Unavailable)]));
        assert_eq!(
            pg.groups().nth(1).map(Group::changed_by),
            Some(ChangedBy::Request)
        );
    }
}
