//! CDB decoding: the opcodes this logical unit implements, their lengths
//! (SPC-4 §4.2.5: the group code in the top three bits of the opcode fixes
//! the length of standard CDBs), and the fixed-offset fields of the block
//! commands (SBC-3 §5).
//!
//! Nothing here allocates or panics: every accessor is called only after
//! [`min_len`] has been checked against the CDB length, which is what
//! [`crate::LogicalUnit::execute`] and [`crate::LogicalUnit::plan`] do first.

/// Defines the opcode constants and the table of their names and lengths.
macro_rules! opcodes {
    ($($(#[$doc:meta])* $name:ident = $code:literal, $len:literal, $text:literal;)*) => {
        /// Operation codes (SPC-4 annex D, SBC-3 §5).
        pub mod op {
            $($(#[$doc])* pub const $name: u8 = $code;)*
        }

        /// The CDB length and name of an opcode this logical unit implements.
        pub fn info(opcode: u8) -> Option<(usize, &'static str)> {
            match opcode {
                $($code => Some(($len, $text)),)*
                _ => None,
            }
        }
    };
}

opcodes! {
    /// SPC-4 §6.47.
    TEST_UNIT_READY = 0x00, 6, "TEST UNIT READY";
    /// SPC-4 §6.39.
    REQUEST_SENSE = 0x03, 6, "REQUEST SENSE";
    /// SBC-3 §5.13.
    READ_6 = 0x08, 6, "READ(6)";
    /// SBC-3 §5.39.
    WRITE_6 = 0x0A, 6, "WRITE(6)";
    /// SPC-4 §6.6.
    INQUIRY = 0x12, 6, "INQUIRY";
    /// SPC-4 §6.9.
    MODE_SELECT_6 = 0x15, 6, "MODE SELECT(6)";
    /// SPC-2 §7.21.
    RESERVE_6 = 0x16, 6, "RESERVE(6)";
    /// SPC-2 §7.19.
    RELEASE_6 = 0x17, 6, "RELEASE(6)";
    /// SPC-4 §6.11.
    MODE_SENSE_6 = 0x1A, 6, "MODE SENSE(6)";
    /// SBC-3 §5.25.
    START_STOP_UNIT = 0x1B, 6, "START STOP UNIT";
    /// SBC-3 §5.11.
    PREVENT_ALLOW_MEDIUM_REMOVAL = 0x1E, 6, "PREVENT ALLOW MEDIUM REMOVAL";
    /// SBC-3 §5.16.
    READ_CAPACITY_10 = 0x25, 10, "READ CAPACITY(10)";
    /// SBC-3 §5.14.
    READ_10 = 0x28, 10, "READ(10)";
    /// SBC-3 §5.40.
    WRITE_10 = 0x2A, 10, "WRITE(10)";
    /// SBC-3 §5.43.
    WRITE_AND_VERIFY_10 = 0x2E, 10, "WRITE AND VERIFY(10)";
    /// SBC-3 §5.33.
    VERIFY_10 = 0x2F, 10, "VERIFY(10)";
    /// SBC-3 §5.9.
    PRE_FETCH_10 = 0x34, 10, "PRE-FETCH(10)";
    /// SBC-3 §5.26.
    SYNCHRONIZE_CACHE_10 = 0x35, 10, "SYNCHRONIZE CACHE(10)";
    /// SBC-3 §5.18.
    READ_DEFECT_DATA_10 = 0x37, 10, "READ DEFECT DATA(10)";
    /// SBC-3 §5.40 (WRITE SAME(10)).
    WRITE_SAME_10 = 0x41, 10, "WRITE SAME(10)";
    /// SBC-3 §5.28.
    UNMAP = 0x42, 10, "UNMAP";
    /// SBC-3 §5.2.
    COMPARE_AND_WRITE = 0x89, 16, "COMPARE AND WRITE";
    /// SBC-3 §5.8 (ORWRITE(16)).
    ORWRITE_16 = 0x8B, 16, "ORWRITE(16)";
    /// SBC-3 §5.42 (WRITE SAME(16)).
    WRITE_SAME_16 = 0x93, 16, "WRITE SAME(16)";
    /// SBC-4 §5.48.
    WRITE_ATOMIC_16 = 0x9C, 16, "WRITE ATOMIC(16)";
    /// SBC-3 §5.19.
    READ_DEFECT_DATA_12 = 0xB7, 12, "READ DEFECT DATA(12)";
    /// SPC-4 §6.10.
    MODE_SELECT_10 = 0x55, 10, "MODE SELECT(10)";
    /// SPC-2 §7.22.
    RESERVE_10 = 0x56, 10, "RESERVE(10)";
    /// SPC-2 §7.20.
    RELEASE_10 = 0x57, 10, "RELEASE(10)";
    /// SPC-4 §6.12.
    MODE_SENSE_10 = 0x5A, 10, "MODE SENSE(10)";
    /// SPC-4 §6.15.
    PERSISTENT_RESERVE_IN = 0x5E, 10, "PERSISTENT RESERVE IN";
    /// SPC-4 §6.16.
    PERSISTENT_RESERVE_OUT = 0x5F, 10, "PERSISTENT RESERVE OUT";
    /// EXTENDED COPY; LID1 is service action 00h (SPC-4 §6.4).
    EXTENDED_COPY = 0x83, 16, "EXTENDED COPY";
    /// RECEIVE COPY RESULTS; COPY STATUS 00h, OPERATING PARAMETERS 03h
    /// (SPC-4 §6.18).
    RECEIVE_COPY_RESULTS = 0x84, 16, "RECEIVE COPY RESULTS";
    /// SBC-3 §5.16.
    READ_16 = 0x88, 16, "READ(16)";
    /// SBC-3 §5.42.
    WRITE_16 = 0x8A, 16, "WRITE(16)";
    /// SBC-3 §5.45.
    WRITE_AND_VERIFY_16 = 0x8E, 16, "WRITE AND VERIFY(16)";
    /// SBC-3 §5.35.
    VERIFY_16 = 0x8F, 16, "VERIFY(16)";
    /// SBC-3 §5.10.
    PRE_FETCH_16 = 0x90, 16, "PRE-FETCH(16)";
    /// SBC-3 §5.27.
    SYNCHRONIZE_CACHE_16 = 0x91, 16, "SYNCHRONIZE CACHE(16)";
    /// SERVICE ACTION IN(16); READ CAPACITY(16) is service action 10h (SBC-3 §5.16).
    SERVICE_ACTION_IN_16 = 0x9E, 16, "SERVICE ACTION IN(16)";
    /// MAINTENANCE IN; REPORT SUPPORTED OPERATION CODES is service action
    /// 0Ch (SPC-4 §6.35).
    MAINTENANCE_IN = 0xA3, 12, "MAINTENANCE IN";
    /// MAINTENANCE OUT; SET TARGET PORT GROUPS is service action 0Ah
    /// (SPC-4 §6.46).
    MAINTENANCE_OUT = 0xA4, 12, "MAINTENANCE OUT";
    /// SBC-3 §5.15.
    READ_12 = 0xA8, 12, "READ(12)";
    /// SBC-3 §5.41.
    WRITE_12 = 0xAA, 12, "WRITE(12)";
    /// SBC-3 §5.44.
    WRITE_AND_VERIFY_12 = 0xAE, 12, "WRITE AND VERIFY(12)";
    /// SBC-3 §5.34.
    VERIFY_12 = 0xAF, 12, "VERIFY(12)";
}

/// READ CAPACITY(16) service action of SERVICE ACTION IN(16).
pub const SA_READ_CAPACITY_16: u8 = 0x10;
/// GET LBA STATUS service action of SERVICE ACTION IN(16) (SBC-3 §5.21).
pub const SA_GET_LBA_STATUS: u8 = 0x12;
/// REPORT SUPPORTED OPERATION CODES service action of MAINTENANCE IN.
pub const SA_REPORT_SUPPORTED_OPCODES: u8 = 0x0C;
/// REPORT TARGET PORT GROUPS service action of MAINTENANCE IN (SPC-4 §6.36).
pub const SA_REPORT_TARGET_PORT_GROUPS: u8 = 0x0A;
/// SET TARGET PORT GROUPS service action of MAINTENANCE OUT (SPC-4 §6.46).
pub const SA_SET_TARGET_PORT_GROUPS: u8 = 0x0A;
/// EXTENDED COPY(LID1) service action of EXTENDED COPY (SPC-4 §6.4).
pub const SA_EXTENDED_COPY_LID1: u8 = 0x00;
/// COPY STATUS service action of RECEIVE COPY RESULTS (SPC-4 §6.18.3).
pub const SA_COPY_STATUS: u8 = 0x00;
/// OPERATING PARAMETERS service action of RECEIVE COPY RESULTS (SPC-4 §6.18.4).
pub const SA_OPERATING_PARAMETERS: u8 = 0x03;

/// The CDB length an implemented opcode needs, `None` for others.
#[inline]
pub fn min_len(opcode: u8) -> Option<usize> {
    info(opcode).map(|(len, _)| len)
}

/// Big-endian u16 at `i` (caller checked the length).
#[inline]
pub fn be16(c: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([c[i], c[i + 1]])
}

/// Big-endian u32 at `i` (caller checked the length).
#[inline]
pub fn be32(c: &[u8], i: usize) -> u32 {
    u32::from_be_bytes([c[i], c[i + 1], c[i + 2], c[i + 3]])
}

/// Big-endian u64 at `i` (caller checked the length).
#[inline]
pub fn be64(c: &[u8], i: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&c[i..i + 8]);
    u64::from_be_bytes(b)
}

/// The fields shared by the block commands that address an LBA range
/// (READ, WRITE, VERIFY, WRITE AND VERIFY, PRE-FETCH, SYNCHRONIZE CACHE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lba {
    /// First logical block.
    pub lba: u64,
    /// Number of blocks (READ(6)/WRITE(6): 0 already turned into 256).
    pub len: u32,
    /// Byte 1 (protection, DPO, FUA, BYTCHK, IMMED bits); 0 for 6-byte CDBs,
    /// whose byte 1 holds LBA bits.
    pub flags: u8,
    /// Offset of the transfer length field, for field pointers.
    pub len_byte: u16,
}

/// Decodes the LBA, length and flags of an LBA-range command; `None` for
/// other opcodes. The CDB must be at least [`min_len`] bytes.
#[inline]
pub fn lba_fields(cdb: &[u8]) -> Option<Lba> {
    let f = match cdb[0] {
        op::READ_10
        | op::WRITE_10
        | op::VERIFY_10
        | op::WRITE_AND_VERIFY_10
        | op::PRE_FETCH_10
        | op::SYNCHRONIZE_CACHE_10 => Lba {
            lba: u64::from(be32(cdb, 2)),
            len: u32::from(be16(cdb, 7)),
            flags: cdb[1],
            len_byte: 7,
        },
        op::READ_16
        | op::WRITE_16
        | op::VERIFY_16
        | op::WRITE_AND_VERIFY_16
        | op::PRE_FETCH_16
        | op::SYNCHRONIZE_CACHE_16 => Lba {
            lba: be64(cdb, 2),
            len: be32(cdb, 10),
            flags: cdb[1],
            len_byte: 10,
        },
        op::READ_12 | op::WRITE_12 | op::VERIFY_12 | op::WRITE_AND_VERIFY_12 => Lba {
            lba: u64::from(be32(cdb, 2)),
            len: be32(cdb, 6),
            flags: cdb[1],
            len_byte: 6,
        },
        op::READ_6 | op::WRITE_6 => Lba {
            lba: u64::from(u32::from_be_bytes([0, cdb[1] & 0x1F, cdb[2], cdb[3]])),
            len: if cdb[4] == 0 { 256 } else { u32::from(cdb[4]) },
            flags: 0,
            len_byte: 4,
        },
        _ => return None,
    };
    Some(f)
}

/// The BYTCHK field of VERIFY and WRITE AND VERIFY (byte 1, bits 2:1).
#[inline]
pub fn bytchk(flags: u8) -> u8 {
    (flags >> 1) & 0x03
}

/// Data-out / data-in byte counts a CDB implies; see
/// [`crate::LogicalUnit::plan`]. `max_blocks` is the MAXIMUM TRANSFER LENGTH
/// of the Block Limits page: longer block transfers are rejected by
/// `execute` before any data moves, so they plan no transfer.
pub fn plan(cdb: &[u8], block_size: u32, max_blocks: u32) -> (u32, u32) {
    let Some(&opcode) = cdb.first() else {
        return (0, 0);
    };
    match min_len(opcode) {
        Some(n) if cdb.len() >= n => {}
        _ => return (0, 0),
    }
    let blocks = |len: u32| {
        if len <= max_blocks {
            len.checked_mul(block_size).unwrap_or(0)
        } else {
            0
        }
    };
    match opcode {
        op::READ_6 | op::READ_10 | op::READ_12 | op::READ_16 => {
            lba_fields(cdb).map_or((0, 0), |f| (0, blocks(f.len)))
        }
        op::WRITE_6
        | op::WRITE_10
        | op::WRITE_12
        | op::WRITE_16
        | op::WRITE_AND_VERIFY_10
        | op::WRITE_AND_VERIFY_12
        | op::WRITE_AND_VERIFY_16 => lba_fields(cdb).map_or((0, 0), |f| (blocks(f.len), 0)),
        op::VERIFY_10 | op::VERIFY_12 | op::VERIFY_16 => match lba_fields(cdb) {
            Some(f) if bytchk(f.flags) == 1 => (blocks(f.len), 0),
            Some(f) if bytchk(f.flags) == 3 && f.len != 0 && f.len <= max_blocks => (block_size, 0),
            _ => (0, 0),
        },
        op::INQUIRY => (0, u32::from(be16(cdb, 3))),
        op::REQUEST_SENSE | op::MODE_SENSE_6 => (0, u32::from(cdb[4])),
        op::MODE_SENSE_10 => (0, u32::from(be16(cdb, 7))),
        op::MODE_SELECT_6 => (u32::from(cdb[4]), 0),
        op::MODE_SELECT_10 => (u32::from(be16(cdb, 7)), 0),
        op::READ_CAPACITY_10 => (0, 8),
        op::SERVICE_ACTION_IN_16 if cdb[1] & 0x1F == SA_READ_CAPACITY_16 => (0, be32(cdb, 10)),
        op::MAINTENANCE_IN if cdb[1] & 0x1F == SA_REPORT_SUPPORTED_OPCODES => (0, be32(cdb, 6)),
        // The compare half and the write half.
        op::COMPARE_AND_WRITE if cdb[13] <= crate::MAX_COMPARE_AND_WRITE_BLOCKS => {
            (2 * blocks(u32::from(cdb[13])), 0)
        }
        op::ORWRITE_16 => (blocks(be32(cdb, 10)), 0),
        op::WRITE_ATOMIC_16 => (blocks(u32::from(be16(cdb, 12))), 0),
        // One block of data, none with NDOB (WRITE SAME(16) byte 1 bit 0).
        op::WRITE_SAME_10 => (block_size, 0),
        op::WRITE_SAME_16 if cdb[1] & 0x01 == 0 => (block_size, 0),
        op::UNMAP => (u32::from(be16(cdb, 7)), 0),
        op::READ_DEFECT_DATA_10 => (0, u32::from(be16(cdb, 7))),
        op::READ_DEFECT_DATA_12 => (0, be32(cdb, 6)),
        op::SERVICE_ACTION_IN_16 if cdb[1] & 0x1F == SA_GET_LBA_STATUS => (0, be32(cdb, 10)),
        op::PERSISTENT_RESERVE_IN => (0, u32::from(be16(cdb, 7))),
        op::PERSISTENT_RESERVE_OUT => match be32(cdb, 5) {
            n if n <= crate::pr::MAX_PARAMETER_LIST => (n, 0),
            _ => (0, 0),
        },
        op::MAINTENANCE_IN if cdb[1] & 0x1F == SA_REPORT_TARGET_PORT_GROUPS => (0, be32(cdb, 6)),
        op::MAINTENANCE_OUT if cdb[1] & 0x1F == SA_SET_TARGET_PORT_GROUPS => {
            let len = be32(cdb, 6);
            (
                if len <= crate::alua::MAX_STPG_LIST {
                    len
                } else {
                    0
                },
                0,
            )
        }
        op::EXTENDED_COPY if cdb[1] & 0x1F == SA_EXTENDED_COPY_LID1 => {
            let len = be32(cdb, 10);
            (
                if len <= crate::xcopy::MAX_PARAM_LIST {
                    len
                } else {
                    0
                },
                0,
            )
        }
        op::RECEIVE_COPY_RESULTS
            if matches!(cdb[1] & 0x1F, SA_COPY_STATUS | SA_OPERATING_PARAMETERS) =>
        {
            (0, be32(cdb, 10))
        }
        _ => (0, 0),
    }
}

/// WRITE(6/10/12/16): the commands that take data-out in segments.
pub(crate) fn is_plain_write(cdb: &[u8]) -> bool {
    matches!(
        cdb.first(),
        Some(&(op::WRITE_6 | op::WRITE_10 | op::WRITE_12 | op::WRITE_16))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_follow_group_codes() {
        for code in 0..=255u8 {
            if let Some(len) = min_len(code) {
                let by_group = match code >> 5 {
                    0 => 6,
                    1 | 2 => 10,
                    4 => 16,
                    5 => 12,
                    _ => unreachable!("no implemented opcode in group {}", code >> 5),
                };
                assert_eq!(len, by_group, "opcode {code:#04x}");
            }
        }
        assert_eq!(info(op::READ_16).map(|i| i.1), Some("READ(16)"));
        assert_eq!(min_len(0xA0), None, "REPORT LUNS belongs to the target");
    }

    #[test]
    fn decodes_lba_fields() {
        let r6 = [op::READ_6, 0xFF, 0x34, 0x56, 0, 0];
        assert_eq!(
            lba_fields(&r6),
            Some(Lba {
                lba: 0x1F3456,
                len: 256,
                flags: 0,
                len_byte: 4
            })
        );
        let r10 = [op::READ_10, 0x18, 0, 0, 1, 0, 0, 0x01, 0x02, 0];
        assert_eq!(
            lba_fields(&r10),
            Some(Lba {
                lba: 256,
                len: 258,
                flags: 0x18,
                len_byte: 7
            })
        );
        let mut r16 = [0u8; 16];
        r16[0] = op::WRITE_16;
        r16[2..10].copy_from_slice(&u64::MAX.to_be_bytes());
        r16[10..14].copy_from_slice(&7u32.to_be_bytes());
        assert_eq!(
            lba_fields(&r16),
            Some(Lba {
                lba: u64::MAX,
                len: 7,
                flags: 0,
                len_byte: 10
            })
        );
        let mut r12 = [0u8; 12];
        r12[0] = op::VERIFY_12;
        r12[1] = 0x02;
        r12[6..10].copy_from_slice(&9u32.to_be_bytes());
        let f = lba_fields(&r12).unwrap();
        assert_eq!((f.len, bytchk(f.flags)), (9, 1));
        assert_eq!(lba_fields(&[op::INQUIRY, 0, 0, 0, 0, 0]), None);
    }

    #[test]
    fn plans() {
        let bs = 512;
        let max = 1024;
        assert_eq!(plan(&[], bs, max), (0, 0));
        assert_eq!(plan(&[op::READ_10, 0, 0], bs, max), (0, 0), "short CDB");
        assert_eq!(
            plan(&[op::READ_10, 0, 0, 0, 0, 0, 0, 0, 8, 0], bs, max),
            (0, 4096)
        );
        assert_eq!(plan(&[op::READ_6, 0, 0, 0, 0, 0], bs, max), (0, 256 * 512));
        assert_eq!(
            plan(&[op::WRITE_10, 0, 0, 0, 0, 0, 0, 0, 2, 0], bs, max),
            (1024, 0)
        );
        assert_eq!(
            plan(&[op::WRITE_10, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0], bs, max),
            (0, 0),
            "over the maximum transfer length"
        );
        let v = |b1: u8| [op::VERIFY_10, b1, 0, 0, 0, 0, 0, 0, 4, 0];
        assert_eq!(plan(&v(0), bs, max), (0, 0));
        assert_eq!(plan(&v(2), bs, max), (2048, 0));
        assert_eq!(plan(&v(6), bs, max), (512, 0));
        assert_eq!(plan(&[op::INQUIRY, 0, 0, 1, 4, 0], bs, max), (0, 260));
        assert_eq!(
            plan(&[op::MODE_SELECT_6, 0x10, 0, 0, 24, 0], bs, max),
            (24, 0)
        );
        assert_eq!(
            plan(&[op::MODE_SENSE_10, 0, 0x3F, 0, 0, 0, 0, 1, 0, 0], bs, max),
            (0, 256)
        );
        let mut rc16 = [0u8; 16];
        rc16[0] = op::SERVICE_ACTION_IN_16;
        rc16[1] = SA_READ_CAPACITY_16;
        rc16[13] = 32;
        assert_eq!(plan(&rc16, bs, max), (0, 32));
        assert_eq!(plan(&[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], bs, max), (0, 0));
        assert_eq!(plan(&[0xA0; 12], bs, max), (0, 0));
    }
}
