//! Reservations over NVMe (NVMe Base 2.0 §8.19 "Reservations"; the I/O
//! commands "Reservation Register" 0Dh, "Reservation Report" 0Eh,
//! "Reservation Acquire" 11h and "Reservation Release" 15h; the "Command
//! Behavior in the Presence of a Reservation" table): the commands'
//! decoding and the Reservation Status data structure. The state is the
//! namespace's [`Reservations`], which the server keeps with the logical
//! unit's SCSI persistent reservations so that iSCSI and NVMe hosts see
//! one reservation.
//!
//! Registrants are hosts, named by their 128-bit Host Identifier (the
//! Connect command's HOSTID): every controller of a host shares its
//! registration. Reports use the extended data structure only (EDS = 1):
//! a fabrics host identifier is 128 bits, and a report without EDS gets
//! Host Identifier Inconsistent Format, as Linux's nvmet answers it.

use bufpool::Chain;
use nvme_tcp_wire::capsule::{Sqe, Status};
use volume::reservations::{nvme_type, nvme_type_code, HostAction, HostRefusal, HostReport};

use crate::admin::Reply;
use crate::nvm::opc as nvm;

/// Reservation opcodes (NVM command set, I/O queues).
pub mod opc {
    pub const REGISTER: u8 = 0x0d;
    pub const REPORT: u8 = 0x0e;
    pub const ACQUIRE: u8 = 0x11;
    pub const RELEASE: u8 = 0x15;
}

/// Reservation Conflict.
pub const RESERVATION_CONFLICT: Status = Status::generic(0x83, true);
/// Host Identifier Inconsistent Format.
pub const HOST_ID_INCONSISTENT: Status = Status::generic(0x22, true);
/// Internal Error (the state could not be stored).
const INTERNAL: Status = Status::generic(0x06, false);
/// Data SGL Length Invalid.
const SGL_LENGTH_INVALID: Status = Status::generic(0x0f, true);

/// The Reservation Status extended data structure's header and each
/// Registered Controller extended data structure, in bytes.
const REPORT_HEADER: usize = 64;
const REPORT_ENTRY: usize = 64;
/// Controller ID reported for every registrant: the dynamic controller
/// model has no fixed controller per host.
const CNTLID_DYNAMIC: u16 = 0xffff;

/// A namespace's reservation state, as the server keeps it (with the
/// logical unit's).
pub trait Reservations: Send + Sync {
    /// Whether anything is registered or reserved; while not, no command
    /// conflicts (checked per command: keep it one atomic load).
    fn active(&self) -> bool;
    /// Whether a reservation denies host `host_id` a command of the write
    /// group or (`write` false) of the read group.
    fn conflicts(&self, host_id: &[u8; 16], write: bool) -> bool;
    /// Runs a Register, Acquire or Release action of host `host_id`.
    fn apply(&self, host_id: &[u8; 16], act: HostAction) -> Result<(), HostRefusal>;
    /// The state, for a Reservation Report.
    fn report(&self) -> HostReport;
    /// Whether persist through power loss can be honoured.
    fn can_persist(&self) -> bool;
}

/// Whether `op` is a reservation command.
pub fn is_reservation(op: u8) -> bool {
    matches!(
        op,
        opc::REGISTER | opc::REPORT | opc::ACQUIRE | opc::RELEASE
    )
}

/// The group of an NVM command in the presence of a reservation: `Some(true)`
/// for the write group (Write, Write Zeroes, Dataset Management, Flush),
/// `Some(false)` for the read group (Read, Compare), `None` for commands a
/// reservation does not hold back (the reservation commands decide for
/// themselves).
pub fn write_group(op: u8) -> Option<bool> {
    match op {
        nvm::WRITE | nvm::WRITE_ZEROES | nvm::DSM | nvm::FLUSH => Some(true),
        nvm::READ | nvm::COMPARE => Some(false),
        _ => None,
    }
}

/// Identify Namespace RESCAP: persist through power loss when `persist`,
/// and all six reservation types.
pub fn rescap(persist: bool) -> u8 {
    0x7e | u8::from(persist)
}

fn refusal(r: HostRefusal) -> Status {
    match r {
        HostRefusal::Conflict => RESERVATION_CONFLICT,
        HostRefusal::InvalidField => Status::INVALID_FIELD,
        HostRefusal::Internal => INTERNAL,
    }
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The SGL's data length.
fn sgl_len(sqe: &Sqe) -> u32 {
    u32::from_le_bytes(sqe.0[32..36].try_into().expect("4 bytes"))
}

/// Runs reservation command `sqe` (see [`is_reservation`]) of host
/// `host_id` with the host's `data`.
pub fn execute(r: &dyn Reservations, host_id: &[u8; 16], sqe: &Sqe, data: Chain) -> Reply {
    match run(r, host_id, sqe, data) {
        Ok(reply) => reply,
        Err(s) => Reply::status(s),
    }
}

/// Decodes a Register, Acquire or Release, whose data is `need` bytes of
/// keys (Linux sends 16 for a Release too).
fn action(sqe: &Sqe, data: &[u8]) -> Result<HostAction, Status> {
    let dw10 = sqe.dw(10);
    let act = dw10 & 0x7;
    let iekey = dw10 & (1 << 3) != 0;
    let need = if sqe.opcode() == opc::RELEASE { 8 } else { 16 };
    if data.len() < need || data.len() > 16 {
        return Err(SGL_LENGTH_INVALID);
    }
    let crkey = le64(data, 0);
    let second = if need == 16 { le64(data, 8) } else { 0 };
    let kind = || nvme_type(((dw10 >> 8) & 0xff) as u8).ok_or(Status::INVALID_FIELD);
    Ok(match sqe.opcode() {
        opc::REGISTER => {
            let ptpl = match dw10 >> 30 {
                0 => None,
                2 => Some(false),
                3 => Some(true),
                _ => return Err(Status::INVALID_FIELD),
            };
            match act {
                0 => HostAction::Register {
                    nrkey: second,
                    ptpl,
                },
                1 => HostAction::Unregister { crkey, iekey, ptpl },
                2 => HostAction::Replace {
                    crkey,
                    nrkey: second,
                    iekey,
                    ptpl,
                },
                _ => return Err(Status::INVALID_FIELD),
            }
        }
        // IEKEY has no meaning for Acquire and Release: refused, as
        // Linux's nvmet refuses it.
        _ if iekey => return Err(Status::INVALID_FIELD),
        opc::ACQUIRE => match act {
            0 => HostAction::Acquire {
                crkey,
                kind: kind()?,
            },
            1 | 2 => HostAction::Preempt {
                crkey,
                prkey: second,
                kind: kind()?,
                abort: act == 2,
            },
            _ => return Err(Status::INVALID_FIELD),
        },
        _ => match act {
            0 => HostAction::Release {
                crkey,
                kind: kind()?,
            },
            1 => HostAction::Clear { crkey },
            _ => return Err(Status::INVALID_FIELD),
        },
    })
}

fn run(r: &dyn Reservations, host_id: &[u8; 16], sqe: &Sqe, data: Chain) -> Result<Reply, Status> {
    if sqe.opcode() == opc::REPORT {
        if sqe.dw(11) & 1 == 0 {
            return Err(HOST_ID_INCONSISTENT);
        }
        let want = (u64::from(sqe.dw(10)) + 1) * 4;
        let len = want.min(u64::from(sgl_len(sqe)));
        if len < REPORT_HEADER as u64 {
            return Err(Status::INVALID_FIELD);
        }
        let mut b = report(&r.report());
        // `len` is at most the SGL's length, which the queue bounded.
        b.resize(len as usize, 0);
        return Ok(Reply {
            data: Chain::from(b),
            ..Reply::default()
        });
    }
    let act = action(sqe, &data.to_vec())?;
    r.apply(host_id, act).map_err(refusal)?;
    Ok(Reply::default())
}

/// The Reservation Status extended data structure of `rep`.
pub fn report(rep: &HostReport) -> Vec<u8> {
    let mut b = vec![0u8; REPORT_HEADER + REPORT_ENTRY * rep.registrants.len()];
    b[0..4].copy_from_slice(&rep.generation.to_le_bytes());
    b[4] = rep.kind.map_or(0, nvme_type_code);
    let n = u16::try_from(rep.registrants.len()).unwrap_or(u16::MAX);
    b[5..7].copy_from_slice(&n.to_le_bytes());
    b[9] = u8::from(rep.ptpl);
    for (i, g) in rep.registrants.iter().enumerate() {
        let e = &mut b[REPORT_HEADER + i * REPORT_ENTRY..][..REPORT_ENTRY];
        e[0..2].copy_from_slice(&CNTLID_DYNAMIC.to_le_bytes());
        e[2] = u8::from(g.holds);
        e[8..16].copy_from_slice(&g.key.to_le_bytes());
        e[16..32].copy_from_slice(&g.host_id);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use volume::reservations::{HostRegistrant, PrType};

    /// Records the actions it is given.
    #[derive(Default)]
    struct Log(Mutex<Vec<HostAction>>);

    impl Reservations for Log {
        fn active(&self) -> bool {
            true
        }
        fn conflicts(&self, _: &[u8; 16], write: bool) -> bool {
            write
        }
        fn apply(&self, _: &[u8; 16], act: HostAction) -> Result<(), HostRefusal> {
            self.0.lock().push(act);
            match act {
                HostAction::Clear { .. } => Err(HostRefusal::Conflict),
                _ => Ok(()),
            }
        }
        fn report(&self) -> HostReport {
            HostReport {
                generation: 9,
                kind: Some(PrType::ExclusiveAccessRegistrantsOnly),
                ptpl: true,
                registrants: vec![HostRegistrant {
                    host_id: [0xab; 16],
                    key: 0x1122,
                    holds: true,
                }],
            }
        }
        fn can_persist(&self) -> bool {
            true
        }
    }

    fn sqe(op: u8, dw10: u32, dw11: u32, len: u32) -> Sqe {
        let mut s = Sqe([0; 64]);
        s.0[0] = op;
        s.0[4..8].copy_from_slice(&1u32.to_le_bytes());
        s.0[32..36].copy_from_slice(&len.to_le_bytes());
        s.0[40..44].copy_from_slice(&dw10.to_le_bytes());
        s.0[44..48].copy_from_slice(&dw11.to_le_bytes());
        s
    }

    fn keys(a: u64, b: u64) -> Chain {
        let mut v = a.to_le_bytes().to_vec();
        v.extend_from_slice(&b.to_le_bytes());
        Chain::from(v)
    }

    #[test]
    fn commands_decode_to_actions() {
        let log = Log::default();
        let h = [1u8; 16];
        let ok = |s: Sqe, d: Chain| assert!(execute(&log, &h, &s, d).status.is_success());
        // Linux's IOC_PR_REGISTER: Replace, IEKEY, CPTPL 11b.
        ok(sqe(opc::REGISTER, 2 | 8 | (3 << 30), 0, 16), keys(5, 6));
        ok(sqe(opc::REGISTER, 0, 0, 16), keys(0, 7));
        ok(sqe(opc::ACQUIRE, 2 | (4 << 8), 0, 16), keys(7, 5));
        ok(
            sqe(opc::RELEASE, 6 << 8, 0, 8),
            Chain::from(7u64.to_le_bytes().to_vec()),
        );
        assert_eq!(
            *log.0.lock(),
            vec![
                HostAction::Replace {
                    crkey: 5,
                    nrkey: 6,
                    iekey: true,
                    ptpl: Some(true)
                },
                HostAction::Register {
                    nrkey: 7,
                    ptpl: None
                },
                HostAction::Preempt {
                    crkey: 7,
                    prkey: 5,
                    kind: PrType::ExclusiveAccessRegistrantsOnly,
                    abort: true
                },
                HostAction::Release {
                    crkey: 7,
                    kind: PrType::ExclusiveAccessAllRegistrants
                },
            ]
        );
        let status = |s: Sqe, d: Chain| execute(&log, &h, &s, d).status;
        assert_eq!(
            status(sqe(opc::RELEASE, 1, 0, 16), keys(1, 0)),
            RESERVATION_CONFLICT
        );
        for (s, d) in [
            (sqe(opc::REGISTER, 3, 0, 16), keys(0, 1)), // RREGA 011b
            (sqe(opc::REGISTER, 1 << 30, 0, 16), keys(0, 1)), // CPTPL 01b
            (sqe(opc::ACQUIRE, 7 << 8, 0, 16), keys(1, 0)), // RTYPE 7
            (sqe(opc::ACQUIRE, 8 | (1 << 8), 0, 16), keys(1, 0)), // IEKEY
            (sqe(opc::RELEASE, 2, 0, 8), keys(1, 0)),   // RRELA 010b
        ] {
            assert_eq!(status(s, d), Status::INVALID_FIELD);
        }
        assert_eq!(
            status(sqe(opc::REGISTER, 0, 0, 8), Chain::from(vec![0; 8])),
            SGL_LENGTH_INVALID
        );
        assert_eq!(log.0.lock().len(), 5, "refused commands reach no state");
    }

    #[test]
    fn report_is_the_extended_structure_cut_to_numd() {
        let log = Log::default();
        let h = [1u8; 16];
        let no_eds = execute(&log, &h, &sqe(opc::REPORT, 1023, 0, 4096), Chain::new());
        assert_eq!(no_eds.status, HOST_ID_INCONSISTENT);
        let short = execute(&log, &h, &sqe(opc::REPORT, 14, 1, 4096), Chain::new());
        assert_eq!(short.status, Status::INVALID_FIELD, "less than the header");
        let r = execute(&log, &h, &sqe(opc::REPORT, 1023, 1, 4096), Chain::new());
        let d = r.data.to_vec();
        assert_eq!(d.len(), 4096);
        assert_eq!(d[0..4], 9u32.to_le_bytes());
        assert_eq!((d[4], d[5], d[6], d[9]), (4, 1, 0, 1));
        assert_eq!(d[64..66], [0xff, 0xff]);
        assert_eq!(d[66], 1);
        assert_eq!(d[72..80], 0x1122u64.to_le_bytes());
        assert_eq!(d[80..96], [0xab; 16]);
        let cut = execute(&log, &h, &sqe(opc::REPORT, 15, 1, 4096), Chain::new());
        assert_eq!(cut.data.len(), 64, "NUMD 15: 16 dwords");
        assert_eq!(
            write_group(nvm::FLUSH).zip(write_group(nvm::COMPARE)),
            Some((true, false))
        );
        assert_eq!(write_group(opc::REPORT), None);
    }
}
