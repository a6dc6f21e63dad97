//! INQUIRY (SPC-4 §6.6): standard data and the vital product data pages.
//!
//! Pages served (listed in page 00h, ascending as SPC-4 §7.8.13 requires):
//!
//! | page | name                          | reference      |
//! |------|-------------------------------|----------------|
//! | 00h  | Supported VPD Pages           | SPC-4 §7.8.13  |
//! | 80h  | Unit Serial Number            | SPC-4 §7.8.15  |
//! | 83h  | Device Identification         | SPC-4 §7.8.6   |
//! | 86h  | Extended INQUIRY Data         | SPC-4 §7.8.7   |
//! | B0h  | Block Limits                  | SBC-3 §6.5.3   |
//! | B1h  | Block Device Characteristics  | SBC-3 §6.5.2   |
//! | B2h  | Logical Block Provisioning    | SBC-3 §6.5.4 (thin units only) |
//!
//! Logical Block Provisioning (B2h) is served and listed only when the unit
//! is thin provisioned (READ CAPACITY(16) LBPME = 1, see
//! [`crate::provisioning`]). Extended INQUIRY Data (86h) is not served: it
//! describes protection information and ordering attributes this unit does
//! not have, and neither libiscsi nor Linux needs it. Any other page, a
//! page code without EVPD, and the obsolete CMDDT bit answer INVALID FIELD
//! IN CDB. Every answer is cut to the allocation length.

use crate::cdb::be16;
use crate::lu::{data_in, Command, LogicalUnit, Outcome, OPTIMAL_TRANSFER_BYTES};
use crate::sense::Sense;

/// Length of the standard INQUIRY data we return.
pub const STD_INQUIRY_LEN: usize = 96;

/// Version descriptors claimed (SPC-4 §6.6.2, table 144): SAM-5, iSCSI,
/// SPC-4, SBC-3 (each "no version claimed").
const VERSION_DESCRIPTORS: [u16; 4] = [0x00A0, 0x0960, 0x0460, 0x04C0];

/// VPD pages served, ascending; the last one only when thin provisioned.
const SUPPORTED_PAGES: [u8; 7] = [0x00, 0x80, 0x83, 0x86, 0xB0, 0xB1, 0xB2];

/// Protocol identifier of iSCSI (SPC-4 §7.6.1, table 362).
const PROTOCOL_ISCSI: u8 = 0x5;

/// Copies `s` into `dst`, padding with spaces (SPC-4 §4.4.1).
fn space_padded(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    let n = s.len().min(dst.len());
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// The standard INQUIRY data (SPC-4 §6.6.2): a connected direct-access
/// device, not removable, SPC-4, response data format 2, command queuing,
/// no ACA, no protection; HISUP, since LUNs are single-level peripheral or
/// flat addresses of SAM-5's hierarchical model (§4.7); implicit ALUA (TPGS
/// 01b, raised to 11b by [`crate::LogicalUnit::with_port_groups`] when SET
/// TARGET PORT GROUPS is allowed) and a copy manager (3PC, SPC-4 §6.4).
pub fn standard_inquiry(id: &volume::Identity) -> [u8; STD_INQUIRY_LEN] {
    let mut d = [0u8; STD_INQUIRY_LEN];
    d[0] = 0x00; // PERIPHERAL QUALIFIER 000b, DEVICE TYPE 00h
    d[1] = 0x00; // RMB = 0
    d[2] = 0x06; // VERSION: SPC-4
    d[3] = 0x10 | 0x02; // NORMACA = 0, HISUP = 1, RESPONSE DATA FORMAT = 2
    d[4] = (STD_INQUIRY_LEN - 5) as u8; // ADDITIONAL LENGTH
    d[5] = 0x10 | 0x08; // TPGS = 01b, 3PC
    d[7] = 0x02; // CMDQUE
    space_padded(&mut d[8..16], &id.vendor);
    space_padded(&mut d[16..32], &id.product);
    space_padded(&mut d[32..36], &id.revision);
    for (i, v) in VERSION_DESCRIPTORS.iter().enumerate() {
        d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
    }
    d
}

/// INQUIRY.
pub fn inquiry(lu: &LogicalUnit, cmd: &Command<'_>, cdb: &[u8]) -> Outcome {
    let evpd = cdb[1] & 0x01 != 0;
    let page = cdb[2];
    let alloc = usize::from(be16(cdb, 3));
    if cdb[1] & 0x02 != 0 {
        return Outcome::check(Sense::invalid_cdb(1, Some(1))); // CMDDT
    }
    if !evpd {
        if page != 0 {
            return Outcome::check(Sense::invalid_cdb(2, None));
        }
        let mut d = lu.std_inquiry.to_vec();
        // MULTIP (SPC-4 §6.6.2): the LU is reachable through more than one
        // target port (portal groups, here or at the other gateways);
        // ports come and go at run time, so it is decided per INQUIRY.
        if lu.alua.port_count() > 1 {
            d[6] |= 0x10;
        }
        return data_in(d, alloc);
    }
    let data = match page {
        0x00 => page_with(0x00, &SUPPORTED_PAGES[..6 + usize::from(lu.vol.thin())]),
        0x80 => page_with(0x80, lu.vol.identity().serial.as_bytes()),
        0x83 => device_identification(lu, cmd),
        0xB0 => block_limits(lu),
        0x86 => extended_inquiry(lu),
        0xB1 => block_device_characteristics(),
        0xB2 if lu.vol.thin() => logical_block_provisioning(),
        _ => return Outcome::check(Sense::invalid_cdb(2, None)),
    };
    data_in(data, alloc)
}

/// A VPD page: the four-byte header (PAGE LENGTH in bytes 2–3) and `body`.
pub(crate) fn page_with(code: u8, body: &[u8]) -> Vec<u8> {
    let mut d = Vec::with_capacity(4 + body.len());
    d.extend_from_slice(&[0x00, code]);
    d.extend_from_slice(&(body.len() as u16).to_be_bytes());
    d.extend_from_slice(body);
    d
}

/// Appends one identification descriptor (SPC-4 §7.8.6.1).
fn designator(d: &mut Vec<u8>, proto_codeset: u8, piv_assoc_type: u8, value: &[u8]) {
    d.extend_from_slice(&[proto_codeset, piv_assoc_type, 0x00, value.len() as u8]);
    d.extend_from_slice(value);
}

/// The SCSI name string designator value: UTF-8, null-terminated, padded
/// with nulls to a multiple of four (SPC-4 §7.8.6.11); `None` when the name
/// is empty, holds a null or does not fit the one-byte length.
fn scsi_name_value(name: &str) -> Option<Vec<u8>> {
    if name.is_empty() || name.contains('\0') {
        return None;
    }
    let padded = (name.len() + 1).next_multiple_of(4);
    if padded > 252 {
        return None;
    }
    let mut v = name.as_bytes().to_vec();
    v.resize(padded, 0);
    Some(v)
}

/// Device Identification (83h). Logical unit: the NAA IEEE Registered
/// Extended designator and a T10 vendor ID designator (vendor + serial).
/// Target port (the path the command came on): the relative target port,
/// the target port group and the port's SCSI name string, each with PIV = 1
/// and protocol identifier iSCSI.
fn device_identification(lu: &LogicalUnit, cmd: &Command<'_>) -> Vec<u8> {
    identification_of(lu.vol.identity(), cmd)
}

/// Device Identification (83h) of the unit identified by `id`, for a
/// command on the path of `cmd` (see [`device_identification`]).
pub(crate) fn identification_of(id: &volume::Identity, cmd: &Command<'_>) -> Vec<u8> {
    let mut d = vec![0x00, 0x83, 0x00, 0x00];
    // NAA, binary, association LU.
    designator(&mut d, 0x01, 0x03, &id.naa);
    // T10 vendor ID, ASCII, association LU.
    let mut t10 = vec![0u8; 8];
    space_padded(&mut t10, &id.vendor);
    t10.extend_from_slice(id.serial.as_bytes());
    designator(&mut d, 0x02, 0x01, &t10);
    let port = (PROTOCOL_ISCSI << 4) | 0x01; // iSCSI, binary
                                             // Relative target port (type 4), PIV, association target port.
    let [hi, lo] = cmd.relative_port.to_be_bytes();
    designator(&mut d, port, 0x80 | 0x10 | 0x04, &[0, 0, hi, lo]);
    // Target port group (type 5), PIV, association target port.
    let [hi, lo] = cmd.tpg.to_be_bytes();
    designator(&mut d, port, 0x80 | 0x10 | 0x05, &[0, 0, hi, lo]);
    // SCSI name string (type 8), UTF-8, PIV, association target port.
    if let Some(name) = scsi_name_value(cmd.target_port_name) {
        designator(
            &mut d,
            (PROTOCOL_ISCSI << 4) | 0x03,
            0x80 | 0x10 | 0x08,
            &name,
        );
    }
    let len = (d.len() - 4) as u16;
    d[2..4].copy_from_slice(&len.to_be_bytes());
    d
}

/// Block Limits (B0h), the SBC-4 length of 3Ch (`b[i]` is byte `i + 4`):
/// WSNZ = 0 (WRITE SAME of 0 blocks means to the end), the COMPARE AND
/// WRITE, transfer and WRITE SAME limits; OPTIMAL TRANSFER LENGTH
/// GRANULARITY of 4 KiB or the physical block, whichever is larger; the
/// UNMAP limits and OPTIMAL UNMAP GRANULARITY, the larger of the backend's
/// allocation unit and the physical block (thin units only; zero
/// otherwise, as UNMAP is then refused), and the
/// atomic write limits: maximum atomic transfer length and the backend's
/// atomic alignment, no granularity requirement, no atomic boundaries.
fn block_limits(lu: &LogicalUnit) -> Vec<u8> {
    let bs = lu.cfg.block_size;
    let mut b = [0u8; 0x3C];
    b[1] = crate::MAX_COMPARE_AND_WRITE_BLOCKS;
    // OPTIMAL TRANSFER LENGTH GRANULARITY (at most 2^15 blocks).
    let granularity = (4096 / bs).max(1 << lu.vol.lbppb_shift()) as u16;
    b[2..4].copy_from_slice(&granularity.to_be_bytes());
    b[4..8].copy_from_slice(&lu.vol.max_transfer_blocks().to_be_bytes());
    b[8..12].copy_from_slice(&(OPTIMAL_TRANSFER_BYTES / bs).to_be_bytes());
    if lu.vol.thin() {
        b[16..20].copy_from_slice(&crate::MAX_UNMAP_BLOCKS.to_be_bytes());
        b[20..24].copy_from_slice(&crate::MAX_UNMAP_DESCRIPTORS.to_be_bytes());
        b[24..28].copy_from_slice(&lu.unmap_granularity_blocks().to_be_bytes());
        // UGAVALID = 1, UNMAP GRANULARITY ALIGNMENT = 0.
        b[28..32].copy_from_slice(&0x8000_0000u32.to_be_bytes());
    }
    b[32..40].copy_from_slice(&lu.max_write_same_blocks().to_be_bytes());
    b[40..44].copy_from_slice(&lu.vol.max_atomic_blocks().to_be_bytes());
    b[44..48].copy_from_slice(&lu.vol.atomic_align_blocks().to_be_bytes());
    // ATOMIC TRANSFER LENGTH GRANULARITY, MAXIMUM ATOMIC TRANSFER LENGTH
    // WITH ATOMIC BOUNDARY, MAXIMUM ATOMIC BOUNDARY SIZE: 0.
    page_with(0xB0, &b)
}

/// Logical Block Provisioning (B2h, SBC-3 §6.5.4): no threshold, LBPU
/// (UNMAP), LBPWS and LBPWS10 (WRITE SAME with UNMAP), LBPRZ = 1
/// (deallocated blocks read as zeros; SBC-4's 3-bit field value 001b sits
/// in the same bit), ANC_SUP = 0, DP = 0, provisioning type 010b (thin).
fn logical_block_provisioning() -> Vec<u8> {
    page_with(0xB2, &[0x00, 0x80 | 0x40 | 0x20 | 0x04, 0x02, 0x00])
}

/// Extended INQUIRY Data (86h), page length 3Ch: no protection
/// information, SIMPLE task attribute only (SIMPSUP; the iSCSI layer does
/// not order HEAD OF QUEUE or ORDERED tasks), V_SUP when the write cache is
/// on (WCE = 1, a volatile cache that SYNCHRONIZE CACHE and FUA empty), no
/// unit attention sense key specific data, sense data length not reported.
fn extended_inquiry(lu: &LogicalUnit) -> Vec<u8> {
    let mut b = [0u8; 0x3C];
    b[1] = 0x01; // SIMPSUP
    if lu.vol.write_back() {
        b[2] = 0x01; // V_SUP
    }
    page_with(0x86, &b)
}

/// Block Device Characteristics (B1h): MEDIUM ROTATION RATE 1 (a
/// non-rotating medium), nothing else claimed.
fn block_device_characteristics() -> Vec<u8> {
    let mut b = [0u8; 0x3C];
    b[0..2].copy_from_slice(&1u16.to_be_bytes());
    page_with(0xB1, &b)
}
