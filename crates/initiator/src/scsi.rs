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

/// UNMAP (SBC-4 §5.30) with a parameter list of `param_len` bytes.
pub fn unmap(param_len: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x42;
    c[7..9].copy_from_slice(&param_len.to_be_bytes());
    c
}

/// UNMAP's parameter list with one block descriptor (SBC-4 §5.30.2):
/// `blocks` blocks from `lba`.
pub fn unmap_list(lba: u64, blocks: u32) -> [u8; 24] {
    let mut p = [0u8; 24];
    // UNMAP DATA LENGTH counts the bytes after itself; BLOCK DESCRIPTOR
    // DATA LENGTH the descriptors.
    p[0..2].copy_from_slice(&22u16.to_be_bytes());
    p[2..4].copy_from_slice(&16u16.to_be_bytes());
    p[8..16].copy_from_slice(&lba.to_be_bytes());
    p[16..20].copy_from_slice(&blocks.to_be_bytes());
    p
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

/// What a sense key, ASC and ASCQ mean (SPC-4 §4.5.6, Table 49: the ones a
/// host meets), for messages.
pub fn sense_meaning(k: u8, asc: u8, ascq: u8) -> Option<&'static str> {
    Some(match (k, asc, ascq) {
        (5, 0x25, 0) => "LOGICAL UNIT NOT SUPPORTED",
        (5, 0x20, 0) => "INVALID COMMAND OPERATION CODE",
        (5, 0x21, 0) => "LOGICAL BLOCK ADDRESS OUT OF RANGE",
        (5, 0x24, 0) => "INVALID FIELD IN CDB",
        (7, 0x27, _) => "WRITE PROTECTED",
        (2, 0x04, 0x01) => "NOT READY: LOGICAL UNIT IS IN PROCESS OF BECOMING READY",
        (2, 0x04, 0x0a) => "NOT READY: ASYMMETRIC ACCESS STATE TRANSITION",
        (2, 0x04, 0x0b) => "NOT READY: TARGET PORT IN STANDBY STATE",
        (2, 0x04, 0x0c) => "NOT READY: TARGET PORT IN UNAVAILABLE STATE",
        (2, 0x04, _) => "NOT READY",
        (6, 0x29, _) => "UNIT ATTENTION: POWER ON, RESET OR I_T NEXUS LOSS",
        (6, 0x2a, 0x09) => "UNIT ATTENTION: CAPACITY DATA HAS CHANGED",
        (6, 0x2a, 0x06) => "UNIT ATTENTION: ASYMMETRIC ACCESS STATE CHANGED",
        (6, 0x3f, 0x0e) => "UNIT ATTENTION: REPORTED LUNS DATA HAS CHANGED",
        (6, _, _) => "UNIT ATTENTION",
        (0xb, _, _) => "ABORTED COMMAND",
        (3, _, _) => "MEDIUM ERROR",
        _ => return None,
    })
}

/// MAINTENANCE IN service action and MAINTENANCE OUT service action of the
/// target port group commands (SPC-4 §6.36, §6.46).
const SA_TARGET_PORT_GROUPS: u8 = 0x0a;

/// REPORT TARGET PORT GROUPS (SPC-4 §6.36): MAINTENANCE IN (A3h), service
/// action 0Ah, length-only header format (000b).
pub fn report_target_port_groups(alloc: u32) -> [u8; 12] {
    let mut c = [0u8; 12];
    c[0] = 0xa3;
    c[1] = SA_TARGET_PORT_GROUPS;
    c[6..10].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// SET TARGET PORT GROUPS (SPC-4 §6.46): MAINTENANCE OUT (A4h), service
/// action 0Ah, with a parameter list of `len` bytes (see [`stpg_list`]).
pub fn set_target_port_groups(len: u32) -> [u8; 12] {
    let mut c = [0u8; 12];
    c[0] = 0xa4;
    c[1] = SA_TARGET_PORT_GROUPS;
    c[6..10].copy_from_slice(&len.to_be_bytes());
    c
}

/// The SET TARGET PORT GROUPS parameter list that moves group `tpg` to
/// `state`: four reserved bytes, then one descriptor (state in byte 0 bits
/// 3:0, the group in bytes 2–3).
pub fn stpg_list(tpg: u16, state: AluaState) -> [u8; 8] {
    let [hi, lo] = tpg.to_be_bytes();
    [0, 0, 0, 0, state.code() & 0x0f, 0, hi, lo]
}

/// An asymmetric access state (SPC-4 §6.36.2, table 168).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AluaState {
    /// 0h: every command at full performance.
    ActiveOptimized,
    /// 1h: every command, possibly more slowly.
    ActiveNonOptimized,
    /// 2h: management commands only (others NOT READY 04/0B).
    Standby,
    /// 3h: identification commands only (others NOT READY 04/0C).
    Unavailable,
    /// 4h: logical block dependent.
    LbaDependent,
    /// Eh: offline.
    Offline,
    /// Fh: changing between states (NOT READY 04/0A meanwhile).
    Transitioning,
    /// A reserved code.
    Unknown(u8),
}

impl AluaState {
    /// The state of a 4-bit code.
    pub fn from_code(c: u8) -> AluaState {
        match c & 0x0f {
            0x0 => AluaState::ActiveOptimized,
            0x1 => AluaState::ActiveNonOptimized,
            0x2 => AluaState::Standby,
            0x3 => AluaState::Unavailable,
            0x4 => AluaState::LbaDependent,
            0xe => AluaState::Offline,
            0xf => AluaState::Transitioning,
            c => AluaState::Unknown(c),
        }
    }

    /// The 4-bit code.
    pub fn code(self) -> u8 {
        match self {
            AluaState::ActiveOptimized => 0x0,
            AluaState::ActiveNonOptimized => 0x1,
            AluaState::Standby => 0x2,
            AluaState::Unavailable => 0x3,
            AluaState::LbaDependent => 0x4,
            AluaState::Offline => 0xe,
            AluaState::Transitioning => 0xf,
            AluaState::Unknown(c) => c & 0x0f,
        }
    }

    /// The name hosts show (`multipath -ll`, `sg_rtpg`).
    pub fn name(self) -> &'static str {
        match self {
            AluaState::ActiveOptimized => "active/optimized",
            AluaState::ActiveNonOptimized => "active/non-optimized",
            AluaState::Standby => "standby",
            AluaState::Unavailable => "unavailable",
            AluaState::LbaDependent => "lba-dependent",
            AluaState::Offline => "offline",
            AluaState::Transitioning => "transitioning",
            AluaState::Unknown(_) => "unknown",
        }
    }
}

/// One target port group of REPORT TARGET PORT GROUPS data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TpgDescriptor {
    /// PREF: the group is preferred.
    pub preferred: bool,
    /// Its asymmetric access state.
    pub state: AluaState,
    /// The target port group identifier.
    pub id: u16,
    /// STATUS CODE (0: no status, 1: altered by STPG, 2: altered implicitly).
    pub status: u8,
    /// Relative target port identifiers of its ports.
    pub ports: Vec<u16>,
}

/// Why REPORT TARGET PORT GROUPS data could not be parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RtpgError {
    /// Shorter than its header or than a descriptor it announces.
    Truncated,
}

/// Parses REPORT TARGET PORT GROUPS data in the length-only (000b) or the
/// extended (001b, recognised by FORMAT TYPE in byte 4) header format.
/// Descriptors beyond the bytes received (a short allocation length) are
/// an error, never a guess.
pub fn parse_rtpg(d: &[u8]) -> Result<Vec<TpgDescriptor>, RtpgError> {
    if d.len() < 4 {
        return Err(RtpgError::Truncated);
    }
    let len = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize;
    let end = len.checked_add(4).ok_or(RtpgError::Truncated)?;
    if end > d.len() {
        return Err(RtpgError::Truncated);
    }
    // The extended header has FORMAT TYPE 001b in byte 4 bits 6:4; a
    // length-only descriptor has byte 4 = PREF | state, whose bits 6:4
    // are reserved (zero).
    let mut i = if end >= 8 && (d[4] >> 4) & 0x07 == 1 {
        8
    } else {
        4
    };
    let mut out = Vec::new();
    while i < end {
        if i + 8 > end {
            return Err(RtpgError::Truncated);
        }
        let count = usize::from(d[i + 7]);
        let next = i + 8 + 4 * count;
        if next > end {
            return Err(RtpgError::Truncated);
        }
        out.push(TpgDescriptor {
            preferred: d[i] & 0x80 != 0,
            state: AluaState::from_code(d[i]),
            id: u16::from_be_bytes([d[i + 2], d[i + 3]]),
            status: d[i + 5],
            ports: d[i + 8..next]
                .chunks_exact(4)
                .map(|p| u16::from_be_bytes([p[2], p[3]]))
                .collect(),
        });
        i = next;
    }
    Ok(out)
}

/// The TPGS field of standard INQUIRY data (byte 5 bits 5:4): 00b no ALUA,
/// 01b implicit only, 10b explicit only, 11b both.
pub fn tpgs(std_inquiry: &[u8]) -> u8 {
    std_inquiry.get(5).map_or(0, |b| (b >> 4) & 0x03)
}

/// The target port this VPD page 0x83 came through: (target port group,
/// relative target port), from the designators of association target port
/// (1) and type 5h and 4h.
pub fn target_port_ids(vpd83: &[u8]) -> (Option<u16>, Option<u16>) {
    let mut tpg = None;
    let mut rel = None;
    for (assoc, kind, v) in parse_designators(vpd83) {
        if assoc != 1 || v.len() < 4 {
            continue;
        }
        let id = u16::from_be_bytes([v[2], v[3]]);
        match kind {
            5 => tpg = Some(id),
            4 => rel = Some(id),
            _ => {}
        }
    }
    (tpg, rel)
}

/// A CHECK CONDITION a multipath initiator retries instead of failing the
/// command: the path's group is not (yet) accessible or the target told of
/// a change (SPC-4 §5.15.2.4, §5.15.2.6; scsi_dh_alua's choices).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathCondition {
    /// NOT READY 04/01: the LU is becoming ready (storage slow to answer);
    /// retried on the same path.
    BecomingReady,
    /// NOT READY 04/0A: asymmetric access state transition.
    Transitioning,
    /// NOT READY 04/0B: target port in standby state.
    Standby,
    /// NOT READY 04/0C: target port in unavailable state.
    Unavailable,
    /// UNIT ATTENTION 2A/06: asymmetric access state changed.
    StateChanged,
    /// UNIT ATTENTION 29/xx: power on, reset or I_T nexus loss.
    Reset,
    /// UNIT ATTENTION 3F/0E: reported LUNs data changed.
    LunsChanged,
}

impl PathCondition {
    /// The condition of sense data, if it is one to retry.
    pub fn of_sense(sense: &[u8]) -> Option<PathCondition> {
        match sense_code(sense)? {
            (0x2, 0x04, 0x01) => Some(PathCondition::BecomingReady),
            (0x2, 0x04, 0x0a) => Some(PathCondition::Transitioning),
            (0x2, 0x04, 0x0b) => Some(PathCondition::Standby),
            (0x2, 0x04, 0x0c) => Some(PathCondition::Unavailable),
            (0x6, 0x2a, 0x06) => Some(PathCondition::StateChanged),
            (0x6, 0x29, _) => Some(PathCondition::Reset),
            (0x6, 0x3f, 0x0e) => Some(PathCondition::LunsChanged),
            _ => None,
        }
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

    #[test]
    fn target_port_group_cdbs() {
        assert_eq!(
            report_target_port_groups(0x1234),
            [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 0x12, 0x34, 0, 0]
        );
        assert_eq!(
            set_target_port_groups(8),
            [0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0]
        );
        assert_eq!(
            stpg_list(0x0102, AluaState::ActiveOptimized),
            [0, 0, 0, 0, 0, 0, 1, 2]
        );
        assert_eq!(stpg_list(2, AluaState::Standby), [0, 0, 0, 0, 2, 0, 0, 2]);
        for c in 0..16 {
            assert_eq!(AluaState::from_code(c).code(), c);
        }
    }

    #[test]
    fn parses_rtpg() {
        // Two groups: 1 active/optimized, preferred, ports 1 and 3, altered
        // by STPG; 2 standby, port 2.
        let d = [
            0, 0, 0, 28, //
            0x80, 0x0f, 0, 1, 0, 1, 0, 2, 0, 0, 0, 1, 0, 0, 0, 3, //
            0x02, 0x0f, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2,
        ];
        let g = parse_rtpg(&d).unwrap();
        assert_eq!(
            g,
            vec![
                TpgDescriptor {
                    preferred: true,
                    state: AluaState::ActiveOptimized,
                    id: 1,
                    status: 1,
                    ports: vec![1, 3],
                },
                TpgDescriptor {
                    preferred: false,
                    state: AluaState::Standby,
                    id: 2,
                    status: 0,
                    ports: vec![2],
                },
            ]
        );
        // The extended header (FORMAT TYPE 001b) carries the same list.
        let mut ext = vec![0, 0, 0, 16, 0x10, 0, 0, 0];
        ext.extend_from_slice(&[0x0f, 0x0f, 0, 9, 0, 0, 0, 1, 0, 0, 0, 4]);
        let g = parse_rtpg(&ext).unwrap();
        assert_eq!(g.len(), 1);
        assert_eq!(
            (g[0].state, g[0].id, g[0].ports.clone()),
            (AluaState::Transitioning, 9, vec![4])
        );
        // Empty list; truncated header, descriptor and port list.
        assert_eq!(parse_rtpg(&[0, 0, 0, 0]), Ok(vec![]));
        assert_eq!(parse_rtpg(&[0, 0, 0]), Err(RtpgError::Truncated));
        assert_eq!(parse_rtpg(&d[..20]), Err(RtpgError::Truncated));
        let mut short = d[..20].to_vec();
        short[3] = 16;
        short[11] = 3; // three ports announced, two present
        assert_eq!(parse_rtpg(&short), Err(RtpgError::Truncated));
        assert_eq!(
            parse_rtpg(&[0xff, 0xff, 0xff, 0xff]),
            Err(RtpgError::Truncated)
        );
    }

    #[test]
    fn parses_tpgs_and_port_designators() {
        let mut inq = [0u8; 36];
        assert_eq!(tpgs(&inq), 0);
        inq[5] = 0x30;
        assert_eq!(tpgs(&inq), 3);
        inq[5] = 0x10;
        assert_eq!(tpgs(&inq), 1);
        assert_eq!(tpgs(&[]), 0);
        // NAA (LU), relative target port 2 and target port group 7 (target port).
        let vpd = [
            0, 0x83, 0, 28, //
            1, 3, 0, 8, 0x60, 1, 2, 3, 4, 5, 6, 7, //
            0x51, 0x94, 0, 4, 0, 0, 0, 2, //
            0x51, 0x95, 0, 4, 0, 0, 0, 7,
        ];
        assert_eq!(target_port_ids(&vpd), (Some(7), Some(2)));
        assert_eq!(naa_id(&vpd).as_deref(), Some("naa.6001020304050607"));
        assert_eq!(target_port_ids(&vpd[..16]), (None, None));
    }

    #[test]
    fn path_conditions() {
        let fixed = |k: u8, a: u8, q: u8| {
            let mut s = [0u8; 18];
            s[0] = 0x70;
            s[2] = k;
            s[7] = 10;
            s[12] = a;
            s[13] = q;
            s
        };
        use PathCondition as P;
        for (k, a, q, want) in [
            (2, 4, 0x0a, Some(P::Transitioning)),
            (2, 4, 0x0b, Some(P::Standby)),
            (2, 4, 0x0c, Some(P::Unavailable)),
            (6, 0x2a, 6, Some(P::StateChanged)),
            (6, 0x29, 0, Some(P::Reset)),
            (6, 0x29, 7, Some(P::Reset)),
            (6, 0x3f, 0x0e, Some(P::LunsChanged)),
            (2, 4, 0x02, None),
            (6, 0x2a, 1, None),
            (3, 0x11, 0, None),
            (5, 0x24, 0, None),
        ] {
            assert_eq!(
                PathCondition::of_sense(&fixed(k, a, q)),
                want,
                "{k}/{a:x}/{q:x}"
            );
        }
        assert_eq!(
            PathCondition::of_sense(&[0x72, 2, 4, 0x0b]),
            Some(P::Standby)
        );
        assert_eq!(PathCondition::of_sense(&[]), None);
    }
}
