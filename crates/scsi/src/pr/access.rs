//! Which commands a reservation lets through (SPC-4 §5.9.1 table 55 "SPC
//! commands that are allowed in the presence of various reservations",
//! SBC-3 §4.17 table 13 for the block commands; SPC-2 §5.5.1 for RESERVE).
//!
//! A command from an I_T nexus that holds the persistent reservation, or
//! that is registered while a registrants-only or all-registrants
//! reservation exists, always runs. For every other nexus:
//!
//! | class     | commands (ours)                                         | WE, WE-RO, WE-AR | EA, EA-RO, EA-AR |
//! |-----------|---------------------------------------------------------|------------------|------------------|
//! | `Allowed` | INQUIRY, REQUEST SENSE, TEST UNIT READY, READ CAPACITY(10/16), REPORT LUNS, REPORT TARGET PORT GROUPS, LOG SENSE, PREVENT ALLOW MEDIUM REMOVAL (PREVENT = 0), START STOP UNIT (START = 1, POWER CONDITION = 0) | allowed | allowed |
//! | `Read`    | READ(6/10/12/16), VERIFY, PRE-FETCH, MODE SENSE, REPORT SUPPORTED OPERATION CODES / TASK MANAGEMENT FUNCTIONS, GET LBA STATUS, READ BUFFER, RECEIVE DIAGNOSTIC RESULTS, READ DEFECT DATA | allowed | RESERVATION CONFLICT |
//! | `Write`   | everything else: WRITE, WRITE AND VERIFY, SYNCHRONIZE CACHE, MODE SELECT, other START STOP UNIT / PREVENT ALLOW, and any command not listed | RESERVATION CONFLICT | RESERVATION CONFLICT |
//!
//! PERSISTENT RESERVE IN is always allowed; PERSISTENT RESERVE OUT and the
//! SPC-2 RESERVE / RELEASE commands decide for themselves (SPC-4 table 56
//! and §5.9.3), so they never reach this table.
//!
//! This is ALLOW COMMANDS = 011b in REPORT CAPABILITIES: TEST UNIT READY
//! passes Write Exclusive and Exclusive Access reservations, and the
//! read-type commands (MODE SENSE, REPORT SUPPORTED OPERATION CODES, …)
//! pass Write Exclusive ones.
//!
//! Under an SPC-2 reservation held by another nexus only INQUIRY, REQUEST
//! SENSE (and REPORT LUNS, answered above the LU) are allowed.

use crate::cdb::op;

/// How a command fares against a reservation it does not hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Never conflicts.
    Allowed,
    /// Conflicts with Exclusive Access types only.
    Read,
    /// Conflicts with every type.
    Write,
}

/// MAINTENANCE IN service actions.
const SA_REPORT_TARGET_PORT_GROUPS: u8 = 0x0A;
const SA_REPORT_SUPPORTED_OPCODES: u8 = 0x0C;
const SA_REPORT_SUPPORTED_TMFS: u8 = 0x0D;
/// SERVICE ACTION IN(16) service actions.
const SA_READ_CAPACITY_16: u8 = 0x10;
const SA_GET_LBA_STATUS: u8 = 0x12;
/// Opcodes this crate may not implement, classified all the same.
const LOG_SENSE: u8 = 0x4D;
const READ_BUFFER: u8 = 0x3C;
const RECEIVE_DIAGNOSTIC_RESULTS: u8 = 0x1C;
const READ_DEFECT_DATA_10: u8 = 0x37;
const READ_DEFECT_DATA_12: u8 = 0xB7;
const REPORT_LUNS: u8 = 0xA0;

/// The class of `cdb` (at least its opcode's length).
pub(crate) fn classify(cdb: &[u8]) -> Access {
    let b = |i: usize| cdb.get(i).copied().unwrap_or(0);
    match cdb[0] {
        op::INQUIRY
        | op::REQUEST_SENSE
        | op::TEST_UNIT_READY
        | op::READ_CAPACITY_10
        | op::PERSISTENT_RESERVE_IN
        | REPORT_LUNS
        | LOG_SENSE => Access::Allowed,
        op::PREVENT_ALLOW_MEDIUM_REMOVAL if b(4) & 0x03 == 0 => Access::Allowed,
        // START = 1, LOEJ = 0, POWER CONDITION = 0.
        op::START_STOP_UNIT if b(4) & 0xF3 == 0x01 => Access::Allowed,
        op::SERVICE_ACTION_IN_16 => match b(1) & 0x1F {
            SA_READ_CAPACITY_16 => Access::Allowed,
            SA_GET_LBA_STATUS => Access::Read,
            _ => Access::Write,
        },
        op::MAINTENANCE_IN => match b(1) & 0x1F {
            SA_REPORT_TARGET_PORT_GROUPS => Access::Allowed,
            SA_REPORT_SUPPORTED_OPCODES | SA_REPORT_SUPPORTED_TMFS => Access::Read,
            _ => Access::Write,
        },
        op::READ_6
        | op::READ_10
        | op::READ_12
        | op::READ_16
        | op::VERIFY_10
        | op::VERIFY_12
        | op::VERIFY_16
        | op::PRE_FETCH_10
        | op::PRE_FETCH_16
        | op::MODE_SENSE_6
        | op::MODE_SENSE_10
        | READ_BUFFER
        | RECEIVE_DIAGNOSTIC_RESULTS
        | READ_DEFECT_DATA_10
        | READ_DEFECT_DATA_12 => Access::Read,
        _ => Access::Write,
    }
}

/// Whether a nexus other than the SPC-2 reservation holder may run `cdb`.
pub(crate) fn spc2_allowed(cdb: &[u8]) -> bool {
    matches!(cdb[0], op::INQUIRY | op::REQUEST_SENSE | REPORT_LUNS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(classify(&[op::TEST_UNIT_READY; 6]), Access::Allowed);
        assert_eq!(classify(&[op::READ_10; 10]), Access::Read);
        assert_eq!(classify(&[op::WRITE_10; 10]), Access::Write);
        assert_eq!(classify(&[op::SYNCHRONIZE_CACHE_10; 10]), Access::Write);
        assert_eq!(
            classify(&[op::START_STOP_UNIT, 0, 0, 0, 1, 0]),
            Access::Allowed
        );
        assert_eq!(
            classify(&[op::START_STOP_UNIT, 0, 0, 0, 0, 0]),
            Access::Write
        );
        assert_eq!(
            classify(&[op::PREVENT_ALLOW_MEDIUM_REMOVAL, 0, 0, 0, 1, 0]),
            Access::Write
        );
        let mut rc16 = [0u8; 16];
        rc16[0] = op::SERVICE_ACTION_IN_16;
        rc16[1] = SA_READ_CAPACITY_16;
        assert_eq!(classify(&rc16), Access::Allowed);
        let mut rsoc = [0u8; 12];
        rsoc[0] = op::MAINTENANCE_IN;
        rsoc[1] = SA_REPORT_SUPPORTED_OPCODES;
        assert_eq!(classify(&rsoc), Access::Read);
        assert_eq!(
            classify(&[0xC0; 16]),
            Access::Write,
            "unknown opcodes conflict"
        );
        assert!(spc2_allowed(&[op::INQUIRY; 6]) && !spc2_allowed(&[op::TEST_UNIT_READY; 6]));
    }
}
