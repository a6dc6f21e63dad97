//! Asymmetric logical unit access (SPC-4 §5.15): target port groups and
//! their access states, REPORT TARGET PORT GROUPS (SPC-4 §6.36), SET TARGET
//! PORT GROUPS (SPC-4 §6.46) and the commands a port in the standby or
//! unavailable state refuses (SPC-4 §5.15.2.4.4, §5.15.2.4.5).
//!
//! The target driver describes its target ports (an iSCSI portal is one,
//! its relative target port identifier is its position from 1) and how
//! they are grouped in one [`PortGroups`] per SCSI target device, shared
//! (`Arc`) by every logical unit of that target: all of them are seen
//! through a port in the same state, as VMW_SATP_ALUA and dm-multipath
//! expect. Each command carries the target port group of its path
//! ([`crate::Command::tpg`]).
//!
//! # States
//!
//! ```text
//!          SET TARGET PORT GROUPS (explicit ALUA only), any to any
//!   +-------------------+     +------------------------+
//!   | active/optimized  |<--->| active/non-optimized   |
//!   +-------------------+     +------------------------+
//!            ^   ^                   ^   ^
//!            v   +-------+   +-------+   v
//!   +-------------------+ |   | +------------------------+
//!   | standby           |<+---+>| unavailable            |
//!   +-------------------+         +------------------------+
//! ```
//!
//! With implicit ALUA only (TPGS = 01b) the states are the configured ones
//! and never change; SET TARGET PORT GROUPS is then not implemented (INVALID
//! COMMAND OPERATION CODE). With explicit ALUA (TPGS = 11b) it moves any
//! group to any of the four states at once; transitions are instantaneous,
//! so transitioning is never reported. Every change establishes ASYMMETRIC
//! ACCESS STATE CHANGED (2A/06) for every other I_T nexus (SPC-4 §5.15.2.6).
//!
//! # Cost on the data path
//!
//! A command's access state is one scan over the (few) groups and one
//! relaxed atomic load: no lock. Only SET TARGET PORT GROUPS takes a mutex.

use std::sync::atomic::{AtomicU8, Ordering};

use std::sync::OnceLock;

use parking_lot::{Mutex, RwLock};

use crate::cdb::{be32, op, SA_REPORT_TARGET_PORT_GROUPS, SA_SET_TARGET_PORT_GROUPS};
use crate::lu::{data_in, Command, LogicalUnit, Outcome};
use crate::sense::{Asc, Sense, SenseKey};

/// Most target port groups of one target (a STPG list names each once).
pub const MAX_GROUPS: usize = 256;
/// Most target ports in one group (the TARGET PORT COUNT field is a byte).
pub const MAX_PORTS_PER_GROUP: usize = 255;
/// Longest SET TARGET PORT GROUPS parameter list accepted: the header and
/// one descriptor per group.
pub const MAX_STPG_LIST: u32 = 4 + 4 * MAX_GROUPS as u32;

/// Supported states reported for every group (SPC-4 §6.36.2, table 169):
/// U_SUP, S_SUP, AN_SUP, AO_SUP. Transitioning (T_SUP), offline (O_SUP) and
/// logical block dependent (LBD_SUP) are never used.
const SUPPORTED_STATES: u8 = 0x0F;

/// STATUS CODE: altered by SET TARGET PORT GROUPS (SPC-4 table 170).
const STATUS_ALTERED_BY_STPG: u8 = 0x01;
/// STATUS CODE: altered by implicit asymmetric access state change.
const STATUS_ALTERED_IMPLICITLY: u8 = 0x02;

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

/// Decides SET TARGET PORT GROUPS when the states are not this process's
/// alone to set: a gateway whose groups follow who owns storage shared
/// with other gateways (`server::gateway`, docs/GATEWAYS.md).
pub trait AluaOwner: Send + Sync + std::fmt::Debug {
    /// Makes the requested `(group id, state)` changes hold (the ids are
    /// those of existing groups, each once), setting states with
    /// [`PortGroups::set_state`] without establishing unit attentions;
    /// may block (it runs on the I/O pool). Returns whether some state
    /// changed, or the sense to answer.
    fn set_target_port_groups(&self, changes: &[(u16, AccessState)]) -> Result<bool, Sense>;

    /// A command came through group `tpg`, which is in `state` (standby
    /// or unavailable) and refuses it: an initiator tries this path. The
    /// sense to answer instead of the plain refusal (e.g. ASYMMETRIC ACCESS
    /// STATE TRANSITION while a transition it set off runs), or `None`.
    /// Must not block: it runs on the event loop.
    fn refused_access(&self, tpg: u16, state: AccessState) -> Option<Sense> {
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

/// Why a port group description was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum AluaError {
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

#[derive(Debug)]
struct Group {
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
    #[inline]
    fn state(&self) -> AccessState {
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
    owner: OnceLock<std::sync::Arc<dyn AluaOwner>>,
}

impl PortGroups {
    /// Groups as configured; `explicit` allows SET TARGET PORT GROUPS.
    pub fn new(specs: Vec<GroupSpec>, explicit: bool) -> Result<Self, AluaError> {
        if specs.len() > MAX_GROUPS {
            return Err(AluaError::TooMany);
        }
        let mut seen_ports = std::collections::HashSet::new();
        for (i, g) in specs.iter().enumerate() {
            if g.id == 0 {
                return Err(AluaError::ZeroGroup);
            }
            if specs[..i].iter().any(|o| o.id == g.id) {
                return Err(AluaError::DuplicateGroup(g.id));
            }
            if g.ports.is_empty() {
                return Err(AluaError::EmptyGroup(g.id));
            }
            if g.ports.len() > MAX_PORTS_PER_GROUP {
                return Err(AluaError::TooMany);
            }
            for &p in &g.ports {
                if p == 0 {
                    return Err(AluaError::ZeroPort);
                }
                if !seen_ports.insert(p) {
                    return Err(AluaError::DuplicatePort(p));
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
    pub fn set_owner(&self, owner: std::sync::Arc<dyn AluaOwner>) -> bool {
        self.owner.set(owner).is_ok()
    }

    /// Every group, in order.
    #[inline]
    fn iter(&self) -> impl Iterator<Item = &Group> {
        self.groups.iter().map_while(OnceLock::get)
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

    /// The sense for a command refused through group `tpg`
    /// in `state`, when the owner ([`Self::set_owner`]) has one to say.
    pub(crate) fn owner_refusal(&self, tpg: u16, state: AccessState) -> Option<Sense> {
        self.owner.get()?.refused_access(tpg, state)
    }

    /// Whether SET TARGET PORT GROUPS is supported (TPGS = 11b).
    pub fn is_explicit(&self) -> bool {
        self.explicit
    }

    /// The TPGS field of the standard INQUIRY data: 01b (implicit only) or
    /// 11b (implicit and explicit).
    pub fn tpgs(&self) -> u8 {
        if self.explicit {
            0b11
        } else {
            0b01
        }
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
        g.status.store(STATUS_ALTERED_IMPLICITLY, Ordering::Relaxed);
        Some(changed)
    }

    /// Applies `changes` atomically; true when some state changed.
    fn apply(&self, changes: &[(usize, AccessState)]) -> bool {
        let _guard = self.change.lock();
        let mut changed = false;
        for &(i, st) in changes {
            let Some(g) = self.groups[i].get() else {
                continue;
            };
            changed |= g.state.swap(st.code(), Ordering::Relaxed) != st.code();
            g.status.store(STATUS_ALTERED_BY_STPG, Ordering::Relaxed);
        }
        changed
    }
}

/// The sense data for a command received through a port in `state`, or
/// `None` when the state lets it run. `cdb` is at least the opcode's length.
///
/// Standby (SPC-4 §5.15.2.4.4) allows INQUIRY, LOG SELECT/SENSE, MODE
/// SELECT/SENSE, RECEIVE DIAGNOSTIC RESULTS, SEND DIAGNOSTIC, REPORT (and
/// SET) TARGET PORT GROUPS, REQUEST SENSE, PERSISTENT RESERVE IN/OUT and the
/// echo buffer modes of READ/WRITE BUFFER, and here READ CAPACITY(10/16)
/// too; the rest is NOT READY 04/0B. READ CAPACITY is beyond SPC-4's list,
/// as in Linux's own target: a host sizes each path when it finds it, and
/// Linux, refused there, sizes a standby path at 0 blocks, so after a
/// takeover every I/O through it fails "beyond end of device" until a
/// rescan (seen in the Real hosts gateways scenario).
/// Unavailable (SPC-4 §5.15.2.4.5) allows INQUIRY, REPORT (and SET) TARGET
/// PORT GROUPS, REQUEST SENSE and the echo buffer; the rest is NOT READY
/// 04/0C. REPORT LUNS, allowed in both, is answered by the target.
#[inline]
pub(crate) fn refusal(state: AccessState, cdb: &[u8]) -> Option<Sense> {
    const LOG_SELECT: u8 = 0x4C;
    const LOG_SENSE: u8 = 0x4D;
    const RECEIVE_DIAGNOSTIC_RESULTS: u8 = 0x1C;
    const SEND_DIAGNOSTIC: u8 = 0x1D;
    const PERSISTENT_RESERVE_IN: u8 = 0x5E;
    const PERSISTENT_RESERVE_OUT: u8 = 0x5F;
    const WRITE_BUFFER: u8 = 0x3B;
    const READ_BUFFER: u8 = 0x3C;
    const ECHO_BUFFER_MODE: u8 = 0x0A;

    let sa = cdb.get(1).map_or(0, |b| b & 0x1F);
    let both = match cdb[0] {
        op::INQUIRY | op::REQUEST_SENSE => true,
        op::MAINTENANCE_IN => sa == SA_REPORT_TARGET_PORT_GROUPS,
        op::MAINTENANCE_OUT => sa == SA_SET_TARGET_PORT_GROUPS,
        READ_BUFFER | WRITE_BUFFER => sa == ECHO_BUFFER_MODE,
        _ => false,
    };
    match state {
        AccessState::ActiveOptimized | AccessState::ActiveNonOptimized => None,
        _ if both => None,
        AccessState::Standby => match cdb[0] {
            LOG_SELECT
            | LOG_SENSE
            | op::MODE_SELECT_6
            | op::MODE_SELECT_10
            | op::MODE_SENSE_6
            | op::MODE_SENSE_10
            | RECEIVE_DIAGNOSTIC_RESULTS
            | SEND_DIAGNOSTIC
            | PERSISTENT_RESERVE_IN
            | PERSISTENT_RESERVE_OUT
            | op::READ_CAPACITY_10 => None,
            op::SERVICE_ACTION_IN_16 if sa == crate::cdb::SA_READ_CAPACITY_16 => None,
            _ => Some(not_ready(state)),
        },
        AccessState::Unavailable => Some(not_ready(state)),
    }
}

/// NOT READY with the LOGICAL UNIT NOT ACCESSIBLE code of `state`; `None`
/// for the active states.
pub(crate) fn not_ready_sense(state: AccessState) -> Option<Sense> {
    (!state.is_active()).then(|| not_ready(state))
}

fn not_ready(state: AccessState) -> Sense {
    let code = if state == AccessState::Standby {
        Asc::NOT_ACCESSIBLE_STANDBY
    } else {
        Asc::NOT_ACCESSIBLE_UNAVAILABLE
    };
    Sense::new(SenseKey::NotReady, code)
}

/// REPORT TARGET PORT GROUPS (SPC-4 §6.36): every group with its state,
/// supported states, status code and member ports, in the length-only
/// (000b) or extended header (001b) format.
pub(crate) fn report(pg: &PortGroups, cmd: &Command<'_>, cdb: &[u8]) -> Outcome {
    let format = cdb[1] >> 5;
    if format > 1 {
        return Outcome::check(Sense::invalid_cdb(1, Some(7)));
    }
    let alloc = be32(cdb, 6) as usize;
    let header = if format == 1 { 8 } else { 4 };
    let mut d = vec![0u8; header];
    if format == 1 {
        d[4] = 0x10; // FORMAT TYPE 001b
        d[5] = 0; // IMPLICIT TRANSITION TIME: transitions are immediate
    }
    let mut descriptor = |state: AccessState,
                          preferred: bool,
                          id: u16,
                          status: u8,
                          ports: &mut dyn Iterator<Item = u16>| {
        let at = d.len();
        d.push((u8::from(preferred) << 7) | state.code());
        d.push(SUPPORTED_STATES);
        d.extend_from_slice(&id.to_be_bytes());
        d.extend_from_slice(&[0, status, 0, 0]);
        let mut n = 0u8;
        for p in ports {
            d.extend_from_slice(&[0, 0]);
            d.extend_from_slice(&p.to_be_bytes());
            n += 1;
        }
        d[at + 7] = n; // TARGET PORT COUNT (at most MAX_PORTS_PER_GROUP)
    };
    if pg.iter().next().is_none() {
        descriptor(
            AccessState::ActiveOptimized,
            false,
            cmd.tpg,
            0,
            &mut std::iter::once(cmd.relative_port),
        );
    } else {
        for g in pg.iter() {
            let ports = g.ports.read();
            if ports.is_empty() {
                // Every port of the group was removed at run time.
                continue;
            }
            descriptor(
                g.state(),
                g.preferred,
                g.id,
                g.status.load(Ordering::Relaxed),
                &mut ports.iter().copied(),
            );
        }
    }
    let len = (d.len() - 4) as u32; // RETURN DATA LENGTH: what follows it
    d[..4].copy_from_slice(&len.to_be_bytes());
    data_in(d, alloc)
}

/// SET TARGET PORT GROUPS (SPC-4 §6.46), explicit ALUA only: a 4-byte
/// header and one 4-byte descriptor per group to change (ASYMMETRIC ACCESS
/// STATE in byte 0 bits 3:0, TARGET PORT GROUP in bytes 2–3). The whole
/// list is checked before any state changes.
pub(crate) fn set(lu: &LogicalUnit, cmd: &Command<'_>, cdb: &[u8]) -> Outcome {
    let pg = &*lu.alua;
    if !pg.explicit {
        // TPGS = 01b: the command is not supported (SPC-4 §6.46).
        return Outcome::check(Sense::invalid_opcode());
    }
    let len = be32(cdb, 6);
    if len == 0 {
        return Outcome::good();
    }
    if len > MAX_STPG_LIST {
        return Outcome::check(Sense::invalid_cdb(6, None));
    }
    let len = len as usize;
    let length_error = || {
        Outcome::check(Sense::new(
            SenseKey::IllegalRequest,
            Asc::PARAMETER_LIST_LENGTH_ERROR,
        ))
    };
    if len < 4 || !(len - 4).is_multiple_of(4) || cmd.data().len() < len {
        return length_error();
    }
    let list = &cmd.data()[4..len];
    let mut changes: Vec<(usize, AccessState)> = Vec::with_capacity(list.len() / 4);
    for (k, d) in list.chunks_exact(4).enumerate() {
        let at = (4 + 4 * k) as u16;
        let Some(state) = AccessState::from_code(d[0] & 0x0F) else {
            return Outcome::check(Sense::invalid_param(at, Some(3)));
        };
        let id = u16::from_be_bytes([d[2], d[3]]);
        let Some(i) = pg.iter().position(|g| g.id == id) else {
            return Outcome::check(Sense::invalid_param(at + 2, None));
        };
        if changes.iter().any(|&(j, _)| j == i) {
            return Outcome::check(Sense::invalid_param(at + 2, None));
        }
        changes.push((i, state));
    }
    let changed = match pg.owner.get() {
        Some(owner) => {
            let ids: Vec<(u16, AccessState)> = changes
                .iter()
                .filter_map(|&(i, st)| pg.groups[i].get().map(|g| (g.id, st)))
                .collect();
            match owner.set_target_port_groups(&ids) {
                Ok(changed) => changed,
                Err(sense) => return Outcome::check(sense),
            }
        }
        None => pg.apply(&changes),
    };
    if changed {
        let code = Asc::ASYMMETRIC_ACCESS_STATE_CHANGED;
        lu.ua.broadcast(code, Some(cmd.nexus));
        if let Some(lus) = cmd.lus {
            lus.for_each_lu(&mut |other| {
                if !std::ptr::eq(other, lu) && std::ptr::eq(&*other.alua, pg) {
                    other.ua.broadcast(code, None);
                }
            });
        }
    }
    Outcome::good()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: u16, ports: &[u16], state: AccessState) -> GroupSpec {
        GroupSpec {
            id,
            ports: ports.to_vec(),
            state,
            preferred: false,
        }
    }

    #[test]
    fn validation() {
        use AccessState::*;
        assert_eq!(
            PortGroups::new(vec![spec(0, &[1], ActiveOptimized)], false).unwrap_err(),
            AluaError::ZeroGroup
        );
        assert_eq!(
            PortGroups::new(vec![spec(1, &[0], ActiveOptimized)], false).unwrap_err(),
            AluaError::ZeroPort
        );
        assert_eq!(
            PortGroups::new(vec![spec(1, &[1], Standby), spec(1, &[2], Standby)], false)
                .unwrap_err(),
            AluaError::DuplicateGroup(1)
        );
        assert_eq!(
            PortGroups::new(
                vec![spec(1, &[1, 2], Standby), spec(2, &[2], Standby)],
                false
            )
            .unwrap_err(),
            AluaError::DuplicatePort(2)
        );
        assert_eq!(
            PortGroups::new(vec![spec(3, &[], Standby)], false).unwrap_err(),
            AluaError::EmptyGroup(3)
        );
        let many: Vec<u16> = (1..=256).collect();
        assert_eq!(
            PortGroups::new(vec![spec(3, &many, Standby)], false).unwrap_err(),
            AluaError::TooMany
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
                spec(10, &[1, 3], AccessState::ActiveOptimized),
                spec(20, &[2], AccessState::Standby),
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
        assert_eq!(pg.tpgs(), 0b11);
        assert_eq!(PortGroups::default().tpgs(), 0b01);
    }

    #[test]
    fn filtering_by_state() {
        let cdb = |opcode: u8, b1: u8| {
            let mut c = [0u8; 16];
            c[0] = opcode;
            c[1] = b1;
            c
        };
        let standby = AccessState::Standby;
        let unavailable = AccessState::Unavailable;
        let refused = |st, c: &[u8]| refusal(st, c).map(|s| (s.key, s.code));
        let nr_s = Some((SenseKey::NotReady, Asc::NOT_ACCESSIBLE_STANDBY));
        let nr_u = Some((SenseKey::NotReady, Asc::NOT_ACCESSIBLE_UNAVAILABLE));
        for st in [
            AccessState::ActiveOptimized,
            AccessState::ActiveNonOptimized,
        ] {
            assert_eq!(refusal(st, &cdb(op::WRITE_10, 0)), None);
        }
        // Data commands and TEST UNIT READY are refused in both.
        for o in [op::READ_10, op::WRITE_16, op::TEST_UNIT_READY] {
            assert_eq!(refused(standby, &cdb(o, 0)), nr_s, "{o:#x}");
            assert_eq!(refused(unavailable, &cdb(o, 0)), nr_u, "{o:#x}");
        }
        // GET LBA STATUS shares READ CAPACITY(16)'s opcode and is refused.
        assert_eq!(refused(standby, &cdb(op::SERVICE_ACTION_IN_16, 0x12)), nr_s);
        // Allowed in both.
        for c in [
            cdb(op::INQUIRY, 0),
            cdb(op::REQUEST_SENSE, 0),
            cdb(op::MAINTENANCE_IN, 0x0A),
            cdb(op::MAINTENANCE_OUT, 0x0A),
            cdb(0x3C, 0x0A),
            cdb(0x3B, 0x0A),
        ] {
            assert_eq!(refusal(standby, &c), None);
            assert_eq!(refusal(unavailable, &c), None);
        }
        // Standby only (READ CAPACITY: hosts size a standby path too).
        for c in [
            cdb(op::READ_CAPACITY_10, 0),
            cdb(op::SERVICE_ACTION_IN_16, 0x10),
            cdb(op::MODE_SENSE_6, 0),
            cdb(op::MODE_SELECT_10, 0),
            cdb(0x4D, 0),
            cdb(0x5E, 0),
            cdb(0x5F, 0),
            cdb(0x1C, 0),
        ] {
            assert_eq!(refusal(standby, &c), None);
            assert_eq!(refused(unavailable, &c), nr_u);
        }
        // Other service actions of the allowed opcodes are refused.
        assert_eq!(refused(standby, &cdb(op::MAINTENANCE_IN, 0x0C)), nr_s);
        assert_eq!(refused(unavailable, &cdb(0x3C, 0x02)), nr_u);
    }
}
