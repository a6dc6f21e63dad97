//! REPORT SUPPORTED OPERATION CODES (SPC-4 §6.35): what this device server
//! implements, with the CDB usage bitmap of each command (the bits of each
//! CDB byte it evaluates) and command timeouts descriptors on request.
//!
//! The usage table below must list exactly the commands [`crate::cdb::info`]
//! implements, plus REPORT LUNS (answered by the target above the LU); a unit
//! test holds the two together.

use crate::cdb::{self, op};
use crate::lu::data_in;
use crate::{Outcome, Sense};

/// REPORT LUNS, answered by the target for every LU (SPC-4 §6.33).
const REPORT_LUNS: u8 = 0xA0;

/// One supported command: opcode, service action (if the opcode has service
/// actions) and the CDB usage data (byte 0 is the opcode).
struct Usage {
    sa: Option<u8>,
    bits: &'static [u8],
}

const LBA4: [u8; 4] = [0xff; 4];

/// The CDB usage data of every supported command, in opcode order.
const USAGE: &[Usage] = &[
    Usage {
        sa: None,
        bits: &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0],
    },
    Usage {
        sa: None,
        bits: &[op::REQUEST_SENSE, 0x01, 0, 0, 0xff, 0],
    },
    Usage {
        sa: None,
        bits: &[op::READ_6, 0x1f, 0xff, 0xff, 0xff, 0],
    },
    Usage {
        sa: None,
        bits: &[op::WRITE_6, 0x1f, 0xff, 0xff, 0xff, 0],
    },
    Usage {
        sa: None,
        bits: &[op::INQUIRY, 0x01, 0xff, 0xff, 0xff, 0],
    },
    Usage {
        sa: None,
        bits: &[op::MODE_SELECT_6, 0x11, 0, 0, 0xff, 0],
    },
    Usage {
        sa: None,
        bits: &[op::RESERVE_6, 0, 0, 0, 0, 0],
    },
    Usage {
        sa: None,
        bits: &[op::RELEASE_6, 0, 0, 0, 0, 0],
    },
    Usage {
        sa: None,
        bits: &[op::MODE_SENSE_6, 0x08, 0xff, 0xff, 0xff, 0],
    },
    Usage {
        sa: None,
        bits: &[op::START_STOP_UNIT, 0x01, 0, 0x0f, 0xf7, 0],
    },
    Usage {
        sa: None,
        bits: &[op::PREVENT_ALLOW_MEDIUM_REMOVAL, 0, 0, 0, 0x03, 0],
    },
    Usage {
        sa: None,
        bits: &[
            op::READ_CAPACITY_10,
            0,
            LBA4[0],
            LBA4[1],
            LBA4[2],
            LBA4[3],
            0,
            0,
            0x01,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[op::READ_10, 0x18, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0],
    },
    Usage {
        sa: None,
        bits: &[op::WRITE_10, 0x18, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0],
    },
    Usage {
        sa: None,
        bits: &[
            op::WRITE_AND_VERIFY_10,
            0x12,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0xff,
            0xff,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::VERIFY_10,
            0x16,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0xff,
            0xff,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::PRE_FETCH_10,
            0x02,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0xff,
            0xff,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::SYNCHRONIZE_CACHE_10,
            0x02,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0xff,
            0xff,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[op::READ_DEFECT_DATA_10, 0, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0],
    },
    Usage {
        sa: None,
        bits: &[
            op::WRITE_SAME_10,
            0x08,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0xff,
            0xff,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[op::UNMAP, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    },
    Usage {
        sa: None,
        bits: &[op::MODE_SELECT_10, 0x11, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    },
    Usage {
        sa: None,
        bits: &[op::RESERVE_10, 0x12, 0, 0, 0, 0, 0, 0, 0, 0],
    },
    Usage {
        sa: None,
        bits: &[op::RELEASE_10, 0x12, 0, 0, 0, 0, 0, 0, 0, 0],
    },
    Usage {
        sa: None,
        bits: &[op::MODE_SENSE_10, 0x18, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0],
    },
    Usage {
        sa: Some(0),
        bits: &[op::PERSISTENT_RESERVE_IN, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    },
    Usage {
        sa: Some(1),
        bits: &[op::PERSISTENT_RESERVE_IN, 1, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    },
    Usage {
        sa: Some(2),
        bits: &[op::PERSISTENT_RESERVE_IN, 2, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    },
    Usage {
        sa: Some(3),
        bits: &[op::PERSISTENT_RESERVE_IN, 3, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    },
    Usage {
        sa: Some(0),
        bits: &[
            op::PERSISTENT_RESERVE_OUT,
            0,
            0xff,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
        ],
    },
    Usage {
        sa: Some(1),
        bits: &[
            op::PERSISTENT_RESERVE_OUT,
            1,
            0xff,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
        ],
    },
    Usage {
        sa: Some(2),
        bits: &[
            op::PERSISTENT_RESERVE_OUT,
            2,
            0xff,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
        ],
    },
    Usage {
        sa: Some(3),
        bits: &[
            op::PERSISTENT_RESERVE_OUT,
            3,
            0xff,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
        ],
    },
    Usage {
        sa: Some(4),
        bits: &[
            op::PERSISTENT_RESERVE_OUT,
            4,
            0xff,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
        ],
    },
    Usage {
        sa: Some(5),
        bits: &[
            op::PERSISTENT_RESERVE_OUT,
            5,
            0xff,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
        ],
    },
    Usage {
        sa: Some(6),
        bits: &[
            op::PERSISTENT_RESERVE_OUT,
            6,
            0xff,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
        ],
    },
    Usage {
        sa: Some(7),
        bits: &[
            op::PERSISTENT_RESERVE_OUT,
            7,
            0xff,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
        ],
    },
    Usage {
        sa: Some(cdb::SA_EXTENDED_COPY_LID1),
        bits: &[
            op::EXTENDED_COPY,
            cdb::SA_EXTENDED_COPY_LID1,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: Some(cdb::SA_COPY_STATUS),
        bits: &[
            op::RECEIVE_COPY_RESULTS,
            cdb::SA_COPY_STATUS,
            0xff,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: Some(cdb::SA_OPERATING_PARAMETERS),
        bits: &[
            op::RECEIVE_COPY_RESULTS,
            cdb::SA_OPERATING_PARAMETERS,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::READ_16,
            0x18,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::COMPARE_AND_WRITE,
            0x18,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
            0,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::WRITE_16,
            0x18,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::ORWRITE_16,
            0x18,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::WRITE_AND_VERIFY_16,
            0x12,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::VERIFY_16,
            0x16,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::PRE_FETCH_16,
            0x02,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::SYNCHRONIZE_CACHE_16,
            0x02,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::WRITE_SAME_16,
            0x09,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::WRITE_ATOMIC_16,
            0x18,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: Some(cdb::SA_READ_CAPACITY_16),
        bits: &[
            op::SERVICE_ACTION_IN_16,
            cdb::SA_READ_CAPACITY_16,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0x01,
            0,
        ],
    },
    Usage {
        sa: Some(cdb::SA_GET_LBA_STATUS),
        bits: &[
            op::SERVICE_ACTION_IN_16,
            cdb::SA_GET_LBA_STATUS,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[REPORT_LUNS, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
    },
    Usage {
        sa: Some(cdb::SA_REPORT_TARGET_PORT_GROUPS),
        bits: &[
            op::MAINTENANCE_IN,
            0xe0 | cdb::SA_REPORT_TARGET_PORT_GROUPS,
            0,
            0,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: Some(cdb::SA_REPORT_SUPPORTED_OPCODES),
        bits: &[
            op::MAINTENANCE_IN,
            cdb::SA_REPORT_SUPPORTED_OPCODES,
            0x87,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: Some(cdb::SA_SET_TARGET_PORT_GROUPS),
        bits: &[
            op::MAINTENANCE_OUT,
            cdb::SA_SET_TARGET_PORT_GROUPS,
            0,
            0,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::READ_12,
            0x18,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::WRITE_12,
            0x18,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::WRITE_AND_VERIFY_12,
            0x12,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::VERIFY_12,
            0x16,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
    Usage {
        sa: None,
        bits: &[
            op::READ_DEFECT_DATA_12,
            0x1f,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0,
            0,
        ],
    },
];

/// Command timeouts descriptor (SPC-4 §6.35.4): length 0Ah, no command
/// specific field, nominal and recommended timeouts in seconds.
fn timeouts(out: &mut Vec<u8>) {
    out.extend_from_slice(&[0x00, 0x0a, 0, 0]);
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(&30u32.to_be_bytes());
}

/// Answers REPORT SUPPORTED OPERATION CODES; `cdb` is a MAINTENANCE IN CDB
/// of at least 12 bytes with service action 0Ch.
#[cfg(test)]
pub(crate) fn report(cdb: &[u8], thin: bool) -> Outcome {
    report_with(cdb, |code, _| thin || code != op::UNMAP)
}

/// As [`report`], listing only the commands for which `enabled(opcode,
/// service action)` holds (those that depend on configuration, such as SET
/// TARGET PORT GROUPS without explicit ALUA, are reported as not supported).
pub(crate) fn report_with(cdb: &[u8], enabled: impl Fn(u8, Option<u8>) -> bool) -> Outcome {
    let usage = || USAGE.iter().filter(|u| enabled(u.bits[0], u.sa));
    let rctd = cdb[2] & 0x80 != 0;
    let options = cdb[2] & 0x07;
    let req_op = cdb[3];
    let req_sa = u16::from_be_bytes([cdb[4], cdb[5]]);
    let alloc = u32::from_be_bytes([cdb[6], cdb[7], cdb[8], cdb[9]]) as usize;
    let mut out = Vec::new();
    match options {
        0 => {
            out.extend_from_slice(&[0; 4]);
            for u in usage() {
                out.push(u.bits[0]);
                out.push(0);
                out.extend_from_slice(&u16::from(u.sa.unwrap_or(0)).to_be_bytes());
                out.push(0);
                out.push((u8::from(rctd) << 1) | u8::from(u.sa.is_some()));
                out.extend_from_slice(&(u.bits.len() as u16).to_be_bytes());
                if rctd {
                    timeouts(&mut out);
                }
            }
            let len = (out.len() - 4) as u32;
            out[..4].copy_from_slice(&len.to_be_bytes());
        }
        1..=3 => {
            let known = usage().any(|u| u.bits[0] == req_op);
            let has_sa = usage().any(|u| u.bits[0] == req_op && u.sa.is_some());
            // 001b: the opcode must not have service actions; 010b: it must.
            if (options == 1 && has_sa) || (options == 2 && known && !has_sa) {
                return Outcome::check(Sense::invalid_cdb(2, Some(0)));
            }
            let found = usage().find(|u| {
                u.bits[0] == req_op
                    && u.sa
                        .is_none_or(|sa| options != 1 && u16::from(sa) == req_sa)
            });
            match found {
                Some(u) => {
                    // CTDP, SUPPORT 011b: supported as the standard says.
                    out.push(0);
                    out.push((u8::from(rctd) << 7) | 0x03);
                    out.extend_from_slice(&(u.bits.len() as u16).to_be_bytes());
                    out.extend_from_slice(u.bits);
                    if rctd {
                        timeouts(&mut out);
                    }
                }
                // SUPPORT 001b: not supported; no usage data.
                None => out.extend_from_slice(&[0, 0x01, 0, 0]),
            }
        }
        _ => return Outcome::check(Sense::invalid_cdb(2, Some(0))),
    }
    data_in(out, alloc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_the_implemented_opcodes() {
        for code in 0..=255u8 {
            let listed = USAGE.iter().any(|u| u.bits[0] == code);
            let implemented = cdb::info(code).is_some() || code == REPORT_LUNS;
            assert_eq!(listed, implemented, "opcode {code:#04x}");
        }
        for u in USAGE {
            let len = if u.bits[0] == REPORT_LUNS {
                12
            } else {
                cdb::info(u.bits[0]).unwrap().0
            };
            assert_eq!(u.bits.len(), len, "usage length of {:#04x}", u.bits[0]);
            if let Some(sa) = u.sa {
                assert_eq!(u.bits[1] & 0x1f, sa);
            }
        }
        // Opcode order; service actions of one opcode in ascending order.
        assert!(USAGE
            .windows(2)
            .all(|w| (w[0].bits[0], w[0].sa) < (w[1].bits[0], w[1].sa)));
    }

    fn rsoc(rctd: bool, options: u8, op: u8, sa: u16, alloc: u32) -> Outcome {
        let mut c = [0u8; 12];
        c[0] = op::MAINTENANCE_IN;
        c[1] = 0x0c;
        c[2] = (u8::from(rctd) << 7) | options;
        c[3] = op;
        c[4..6].copy_from_slice(&sa.to_be_bytes());
        c[6..10].copy_from_slice(&alloc.to_be_bytes());
        report(&c, true)
    }

    #[test]
    fn all_commands_with_and_without_timeouts() {
        let o = rsoc(false, 0, 0, 0, 65535);
        assert!(o.is_good());
        assert_eq!(o.data.len(), 4 + 8 * USAGE.len());
        let o = rsoc(true, 0, 0, 0, 65535);
        assert_eq!(o.data.len(), 4 + 20 * USAGE.len());
        assert_eq!(o.data[4 + 5] & 0x02, 0x02, "CTDP");
        assert_eq!(&o.data[12..14], &[0, 0x0a]);
        let o = rsoc(false, 0, 0, 0, 10);
        assert_eq!(o.data.len(), 10);
    }

    #[test]
    fn one_command() {
        let o = rsoc(false, 1, op::READ_10, 0, 65535);
        assert_eq!(&o.data[..4], &[0, 3, 0, 10]);
        assert_eq!(o.data[4], op::READ_10);
        assert_eq!(o.data[5] & 0x18, 0x18, "DPO and FUA usable");
        // Service actions: 001b refused, 010b answered.
        assert!(!rsoc(false, 1, op::SERVICE_ACTION_IN_16, 0x10, 65535).is_good());
        let o = rsoc(true, 2, op::SERVICE_ACTION_IN_16, 0x10, 65535);
        assert_eq!(o.data[1], 0x83);
        assert_eq!(o.data.len(), 4 + 16 + 12);
        assert!(!rsoc(false, 2, op::READ_10, 0, 65535).is_good());
        assert!(!rsoc(false, 2, REPORT_LUNS, 0, 65535).is_good());
        // Unsupported: SUPPORT 001b.
        assert_eq!(&rsoc(false, 1, 0xC1, 0, 65535).data[..], &[0, 1, 0, 0]);
        assert!(!rsoc(false, 5, 0, 0, 65535).is_good());
    }
}
