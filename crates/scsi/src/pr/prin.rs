//! PERSISTENT RESERVE IN (SPC-4 §6.15): READ KEYS, READ RESERVATION,
//! REPORT CAPABILITIES, READ FULL STATUS. Every answer is built whole and
//! cut to the ALLOCATION LENGTH; the length fields keep the untruncated
//! values (SPC-4 §4.2.5.6).

use super::state::PrState;
use super::{conflict, note_locked, Registration};
use crate::cdb::be16;
use crate::lu::{data_in, Command, LogicalUnit, Outcome};
use crate::sense::Sense;

const READ_KEYS: u8 = 0x00;
const READ_RESERVATION: u8 = 0x01;
const REPORT_CAPABILITIES: u8 = 0x02;
const READ_FULL_STATUS: u8 = 0x03;

/// iSCSI protocol identifier (SPC-4 table 362).
const PROTOCOL_ISCSI: u8 = 0x5;

/// PERSISTENT RESERVE IN; `cdb` is at least 10 bytes.
pub(crate) fn persistent_reserve_in(lu: &LogicalUnit, cmd: &Command<'_>, cdb: &[u8]) -> Outcome {
    let sa = cdb[1] & 0x1F;
    if sa > READ_FULL_STATUS {
        return Outcome::check(Sense::invalid_cdb(1, Some(4)));
    }
    let alloc = usize::from(be16(cdb, 7));
    let mut inner = lu.pr.inner.lock();
    note_locked(&mut inner, cmd);
    if inner.spc2.is_some() {
        // SPC-2 §5.5.1: while an SPC-2 reservation exists, PERSISTENT
        // RESERVE IN conflicts, whoever sends it.
        return conflict();
    }
    let st = &inner.st;
    let data = match sa {
        READ_KEYS => read_keys(st),
        READ_RESERVATION => read_reservation(st),
        REPORT_CAPABILITIES => report_capabilities(st, lu.pr.can_persist()),
        _ => read_full_status(st),
    };
    data_in(data, alloc)
}

fn header(st: &PrState, additional: usize) -> Vec<u8> {
    let mut d = Vec::with_capacity(8 + additional);
    d.extend_from_slice(&st.generation.to_be_bytes());
    d.extend_from_slice(&u32::try_from(additional).unwrap_or(u32::MAX).to_be_bytes());
    d
}

/// READ KEYS (SPC-4 §6.15.2): one key per registration.
fn read_keys(st: &PrState) -> Vec<u8> {
    let mut d = header(st, 8 * st.regs.len());
    for r in &st.regs {
        d.extend_from_slice(&r.key.to_be_bytes());
    }
    d
}

/// READ RESERVATION (SPC-4 §6.15.3).
fn read_reservation(st: &PrState) -> Vec<u8> {
    let Some(res) = &st.res else {
        return header(st, 0);
    };
    let mut d = header(st, 16);
    d.extend_from_slice(&st.holder_key().to_be_bytes());
    d.extend_from_slice(&[0; 4]); // obsolete
    d.push(0);
    d.push(res.kind.code()); // SCOPE 0h (LU_SCOPE) | TYPE
    d.extend_from_slice(&[0; 2]); // obsolete
    d
}

/// REPORT CAPABILITIES (SPC-4 §6.15.4).
fn report_capabilities(st: &PrState, ptpl_c: bool) -> Vec<u8> {
    let mut d = vec![0u8; 8];
    d[1] = 8; // LENGTH
              // CRH (bit 4), SIP_C = 0 (bit 3), ATP_C (bit 2), PTPL_C (bit 0).
    d[2] = 0x10 | 0x04 | u8::from(ptpl_c);
    // TMV (bit 7), ALLOW COMMANDS 011b (bits 6:4), PTPL_A (bit 0).
    d[3] = 0x80 | (0b011 << 4) | u8::from(st.aptpl && ptpl_c);
    // WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX | EX_AC_AR.
    d[4] = 0x80 | 0x40 | 0x20 | 0x08 | 0x02;
    d[5] = 0x01;
    d
}

/// READ FULL STATUS (SPC-4 §6.15.5): one descriptor per registration,
/// with the TransportID of its initiator port.
fn read_full_status(st: &PrState) -> Vec<u8> {
    let mut body = Vec::new();
    for (i, r) in st.regs.iter().enumerate() {
        let tid = transport_id(r);
        body.extend_from_slice(&r.key.to_be_bytes());
        body.extend_from_slice(&[0; 4]);
        let holds = st.reg_holds(i);
        body.push((u8::from(r.target.is_none()) << 1) | u8::from(holds));
        body.push(match (&st.res, holds) {
            (Some(res), true) => res.kind.code(),
            _ => 0,
        });
        body.extend_from_slice(&[0; 4]);
        body.extend_from_slice(&r.rel_port.to_be_bytes());
        body.extend_from_slice(&u32::try_from(tid.len()).unwrap_or(0).to_be_bytes());
        body.extend_from_slice(&tid);
    }
    let mut d = header(st, body.len());
    d.extend_from_slice(&body);
    d
}

/// The iSCSI TransportID of a registration's initiator port (SPC-4
/// §7.6.4.6): format 01b (`name,i,0x<ISID>`) when the port name carries
/// an ISID, else format 00b (the name); NUL-terminated, padded to a
/// multiple of 4, at least 20 bytes of additional length.
pub(crate) fn transport_id(r: &Registration) -> Vec<u8> {
    let name = r.initiator.as_bytes();
    let format: u8 = if r.initiator.contains(",i,0x") { 1 } else { 0 };
    let mut add = name.len() + 1;
    add = add.div_ceil(4) * 4;
    add = add.max(20);
    let mut d = Vec::with_capacity(4 + add);
    d.push((format << 6) | PROTOCOL_ISCSI);
    d.push(0);
    d.extend_from_slice(&u16::try_from(add).unwrap_or(0).to_be_bytes());
    d.extend_from_slice(name);
    d.resize(4 + add, 0);
    d
}
