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
//! The groups and their states are the volume layer's
//! ([`volume::access`], which NVMe's ANA groups will share); this module is
//! their SCSI encoding.
//!
//! # Cost on the data path
//!
//! A command's access state is one scan over the (few) groups and one
//! relaxed atomic load: no lock. Only SET TARGET PORT GROUPS takes a mutex.

pub use volume::access::{
    AccessOwner as AluaOwner, AccessRefusal, AccessState, GroupError as AluaError, GroupSpec,
    PortGroups, MAX_GROUPS,
};

use crate::cdb::{be32, op, SA_REPORT_TARGET_PORT_GROUPS, SA_SET_TARGET_PORT_GROUPS};
use crate::lu::{data_in, Command, LogicalUnit, Outcome};
use crate::sense::{Asc, Sense, SenseKey};
use volume::access::ChangedBy;

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

/// The TPGS field of the standard INQUIRY data: 01b (implicit only) or
/// 11b (implicit and explicit).
pub(crate) fn tpgs(pg: &PortGroups) -> u8 {
    if pg.is_explicit() {
        0b11
    } else {
        0b01
    }
}

/// The sense data answering an owner's refusal ([`AccessRefusal`]).
pub(crate) fn refusal_sense(r: AccessRefusal) -> Sense {
    match r {
        AccessRefusal::Transitioning => {
            Sense::new(SenseKey::NotReady, Asc::NOT_ACCESSIBLE_TRANSITIONING)
        }
        AccessRefusal::InState(st) => not_ready(st),
        // The ASYMMETRIC ACCESS STATE field of the k-th descriptor.
        AccessRefusal::InvalidChange(k) => Sense::invalid_param((4 + 4 * k) as u16, Some(3)),
        AccessRefusal::Failed => Sense::new(SenseKey::HardwareError, Asc::INTERNAL_TARGET_FAILURE),
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
    if pg.groups().next().is_none() {
        descriptor(
            AccessState::ActiveOptimized,
            false,
            cmd.tpg,
            0,
            &mut std::iter::once(cmd.relative_port),
        );
    } else {
        for g in pg.groups() {
            let ports = g.ports();
            if ports.is_empty() {
                // Every port of the group was removed at run time.
                continue;
            }
            let status = match g.changed_by() {
                ChangedBy::Nobody => 0,
                ChangedBy::Request => STATUS_ALTERED_BY_STPG,
                ChangedBy::Management => STATUS_ALTERED_IMPLICITLY,
            };
            descriptor(
                g.state(),
                g.preferred(),
                g.id(),
                status,
                &mut ports.into_iter(),
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
    if !pg.is_explicit() {
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
        let Some(i) = pg.index_of(id) else {
            return Outcome::check(Sense::invalid_param(at + 2, None));
        };
        if changes.iter().any(|&(j, _)| j == i) {
            return Outcome::check(Sense::invalid_param(at + 2, None));
        }
        changes.push((i, state));
    }
    let changed = match pg.owner() {
        Some(owner) => {
            let ids: Vec<(u16, AccessState)> = changes
                .iter()
                .filter_map(|&(i, st)| pg.groups().nth(i).map(|g| (g.id(), st)))
                .collect();
            match owner.set_states(&ids) {
                Ok(changed) => changed,
                Err(r) => return Outcome::check(refusal_sense(r)),
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

    #[test]
    fn tpgs_follows_explicit() {
        let pg = PortGroups::new(
            vec![GroupSpec::new(10, &[1], AccessState::ActiveOptimized)],
            true,
        )
        .unwrap();
        assert_eq!(tpgs(&pg), 0b11);
        assert_eq!(tpgs(&PortGroups::default()), 0b01);
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
