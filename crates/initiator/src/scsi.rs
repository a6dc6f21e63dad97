//! The SCSI commands the tools send, built and parsed here (SPC-4, SBC-3).

use bytes::Bytes;

/// TEST UNIT READY.
pub fn test_unit_ready() -> [u8; 6] {
    [0; 6]
}

/// INQUIRY, standard data or a VPD page.
pub fn inquiry(vpd: Option<u8>, alloc: u16) -> [u8; 6] {
    let [a, b] = alloc.to_be_bytes();
    match vpd {
        Some(p) => [0x12, 1, p, a, b, 0],
        None => [0x12, 0, 0, a, b, 0],
    }
}

/// READ CAPACITY(16).
pub fn read_capacity16() -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x10;
    c[13] = 32;
    c
}

/// REPORT LUNS.
pub fn report_luns(alloc: u32) -> [u8; 12] {
    let mut c = [0u8; 12];
    c[0] = 0xa0;
    c[6..10].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// READ(16) or WRITE(16) of `blocks` blocks at `lba`, optionally FUA.
pub fn rw16(write: bool, lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = if write { 0x8a } else { 0x88 };
    c[1] = if fua { 0x08 } else { 0 };
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// READ(10) or WRITE(10) (LBA below 2^32, at most 65535 blocks).
pub fn rw10(write: bool, lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = if write { 0x2a } else { 0x28 };
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// SYNCHRONIZE CACHE(10) of the whole LU.
pub fn synchronize_cache() -> [u8; 10] {
    [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0]
}

/// Capacity from READ CAPACITY(16) data: (blocks, block size).
pub fn parse_capacity16(d: &[u8]) -> Option<(u64, u32)> {
    if d.len() < 12 {
        return None;
    }
    let last = u64::from_be_bytes(d[0..8].try_into().ok()?);
    let bs = u32::from_be_bytes(d[8..12].try_into().ok()?);
    Some((last.checked_add(1)?, bs))
}

/// LUN numbers from REPORT LUNS data (single-level peripheral or flat).
pub fn parse_report_luns(d: &[u8]) -> Vec<u16> {
    if d.len() < 8 {
        return Vec::new();
    }
    let len = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize;
    d[8..]
        .chunks_exact(8)
        .take(len / 8)
        .filter_map(|e| {
            let lun = iscsi_wire::pdu::Lun(e.try_into().ok()?);
            lun.index()
        })
        .collect()
}

/// Standard INQUIRY fields: (peripheral device type, vendor, product, revision).
pub fn parse_inquiry(d: &[u8]) -> Option<(u8, String, String, String)> {
    if d.len() < 36 {
        return None;
    }
    let s = |r: std::ops::Range<usize>| String::from_utf8_lossy(&d[r]).trim_end().to_string();
    Some((d[0] & 0x1f, s(8..16), s(16..32), s(32..36)))
}

/// Designators of VPD page 0x83: (association, type, value bytes).
pub fn parse_designators(d: &[u8]) -> Vec<(u8, u8, Bytes)> {
    let mut out = Vec::new();
    if d.len() < 4 {
        return out;
    }
    let end = (4 + usize::from(u16::from_be_bytes([d[2], d[3]]))).min(d.len());
    let mut i = 4;
    while i + 4 <= end {
        let len = usize::from(d[i + 3]);
        if i + 4 + len > end {
            break;
        }
        out.push((
            (d[i + 1] >> 4) & 3,
            d[i + 1] & 0x0f,
            Bytes::copy_from_slice(&d[i + 4..i + 4 + len]),
        ));
        i += 4 + len;
    }
    out
}

/// The LU's NAA designator as the `naa.` hex string hosts show.
pub fn naa_id(vpd83: &[u8]) -> Option<String> {
    parse_designators(vpd83)
        .into_iter()
        .find(|(assoc, kind, _)| *assoc == 0 && *kind == 3)
        .map(|(_, _, v)| {
            let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
            format!("naa.{hex}")
        })
}

/// Sense key, ASC and ASCQ of fixed or descriptor sense data.
pub fn sense_code(s: &[u8]) -> Option<(u8, u8, u8)> {
    match s.first().map(|b| b & 0x7f) {
        Some(0x70 | 0x71) if s.len() >= 14 => Some((s[2] & 0x0f, s[12], s[13])),
        Some(0x72 | 0x73) if s.len() >= 4 => Some((s[1] & 0x0f, s[2], s[3])),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        let mut cap = vec![0u8; 32];
        cap[7] = 0xff;
        cap[10] = 2;
        assert_eq!(parse_capacity16(&cap), Some((256, 512)));
        let rl = [
            0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(parse_report_luns(&rl), vec![0, 1]);
        let vpd = [0, 0x83, 0, 12, 1, 3, 0, 8, 0x60, 1, 2, 3, 4, 5, 6, 7];
        assert_eq!(naa_id(&vpd).as_deref(), Some("naa.6001020304050607"));
        assert_eq!(
            sense_code(&[0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x21, 0]),
            Some((5, 0x21, 0))
        );
        assert_eq!(sense_code(&[0x72, 6, 0x29, 3]), Some((6, 0x29, 3)));
    }
}
