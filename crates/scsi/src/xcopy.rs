//! The copy manager: EXTENDED COPY (LID1) (SPC-4 §6.4) and RECEIVE COPY
//! RESULTS (SPC-4 §6.18), the third-party copy that VAAI "XCOPY" (ESXi
//! full copy / clone) uses.
//!
//! Supported descriptors (SPC-4 §6.4.5, §6.4.6): the Identification
//! Descriptor CSCD descriptor (E4h), naming a block device by its NAA
//! designator with association logical unit, and the block device to block
//! device segment descriptor (02h). Copy sources and destinations are
//! logical units of this target that the nexus may reach, found through
//! [`crate::Command::lus`] (without it, only the unit addressed).
//!
//! # Order of checks
//!
//! Everything is checked before any data moves:
//! 1. parameter list: a length of zero copies nothing (GOOD); the header,
//!    descriptor lists and inline data must fit in the list and within
//!    [`MAX_DESCRIPTOR_LIST`] (PARAMETER LIST LENGTH ERROR); LIST ID USAGE
//!    01b and inline data are invalid fields;
//! 2. CSCD descriptors: more than [`MAX_CSCD_DESCRIPTORS`] is TOO MANY
//!    TARGET DESCRIPTORS, a type other than E4h UNSUPPORTED TARGET
//!    DESCRIPTOR TYPE CODE;
//! 3. segment descriptors: more than [`MAX_SEGMENT_DESCRIPTORS`] is TOO MANY
//!    SEGMENT DESCRIPTORS, a type other than 02h UNSUPPORTED SEGMENT
//!    DESCRIPTOR TYPE CODE, a segment over [`MAX_SEGMENT_BYTES`] or not a
//!    whole number of both units' blocks INVALID FIELD IN PARAMETER LIST;
//! 4. per segment, against its copy source and destination: a CSCD index
//!    past the list, or a designator that names no reachable unit, is COPY
//!    ABORTED / COPY TARGET DEVICE NOT REACHABLE; a block range past the end
//!    of either unit is COPY ABORTED / NO ADDITIONAL SENSE and a read-only
//!    destination COPY ABORTED / WRITE PROTECTED, the field pointer (SD = 0:
//!    relative to the parameter list) naming the offending field.
//!
//! Then the segments are processed in order, in chunks of at most 1 MiB;
//! a read or write failure is COPY ABORTED with the backend's error.
//! Overlapping ranges of one unit are copied as by `memmove`.
//!
//! # Bounded work
//!
//! One command moves at most [`MAX_SEGMENT_DESCRIPTORS`] ×
//! [`MAX_SEGMENT_BYTES`] (256 MiB), each limit advertised by RECEIVE COPY
//! RESULTS / OPERATING PARAMETERS and enforced here; at most
//! [`MAX_CONCURRENT_COPIES`] commands copy at once per unit (more are
//! refused with INSUFFICIENT RESOURCES).
//!
//! # Copy status
//!
//! With LIST ID USAGE 00b the result (status, segments processed, bytes
//! moved) is held per I_T nexus and LIST IDENTIFIER until RECEIVE COPY
//! RESULTS / COPY STATUS reads it once (at most [`HELD_RESULTS`] per
//! nexus, the oldest dropped first); 10b and 11b hold nothing. A list
//! identifier still in use by a copy of the same nexus is refused with
//! OPERATION IN PROGRESS. Results are forgotten with the nexus.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::cdb::{be16, be32, be64};
use crate::lu::{backend_error, data_in, Command, LogicalUnit, NexusId, Outcome};
use crate::sense::{Asc, FieldPointer, Sense, SenseKey};

/// Most CSCD descriptors in one command.
pub const MAX_CSCD_DESCRIPTORS: u16 = 8;
/// Most segment descriptors in one command.
pub const MAX_SEGMENT_DESCRIPTORS: u16 = 16;
/// Most bytes of CSCD and segment descriptors together.
pub const MAX_DESCRIPTOR_LIST: u32 = 1024;
/// Most bytes one segment descriptor may copy.
pub const MAX_SEGMENT_BYTES: u32 = 16 << 20;
/// Longest EXTENDED COPY parameter list accepted: header and descriptors
/// (no inline data is supported).
pub const MAX_PARAM_LIST: u32 = HEADER_LEN as u32 + MAX_DESCRIPTOR_LIST;
/// Most EXTENDED COPY commands copying at once on one logical unit.
pub const MAX_CONCURRENT_COPIES: u8 = 8;
/// Copy results held per nexus for RECEIVE COPY RESULTS.
pub const HELD_RESULTS: usize = 16;

const HEADER_LEN: usize = 16;
/// Identification Descriptor CSCD descriptor (SPC-4 §6.4.5.2).
const CSCD_IDENTIFICATION: u8 = 0xE4;
const CSCD_LEN: usize = 32;
/// Block device to block device segment descriptor (SPC-4 §6.4.6.5).
const SEG_BLOCK_TO_BLOCK: u8 = 0x02;
const SEG_B2B_LEN: usize = 28;
/// Data moves through a buffer of at most this many bytes.
const COPY_CHUNK: usize = 1 << 20;

/// COPY MANAGER STATUS values (SPC-4 §6.18.3, LID1).
const STATUS_IN_PROGRESS: u8 = 0x00;
const STATUS_DONE: u8 = 0x01;
const STATUS_FAILED: u8 = 0x02;

/// What the copy manager keeps between commands.
#[derive(Debug, Default)]
pub(crate) struct CopyState {
    inner: Mutex<CopyInner>,
}

#[derive(Debug, Default)]
struct CopyInner {
    /// Copies running now on this unit.
    running: u8,
    /// Per nexus: copies running or held, oldest first.
    lists: HashMap<NexusId, VecDeque<Record>>,
}

#[derive(Clone, Copy, Debug)]
struct Record {
    list_id: u8,
    /// Held for COPY STATUS once done (LIST ID USAGE 00b).
    hold: bool,
    status: u8,
    segments: u16,
    bytes: u64,
}

impl CopyState {
    /// Forgets everything about nexus `n`.
    pub(crate) fn forget(&self, n: NexusId) {
        self.inner.lock().lists.remove(&n);
    }

    /// Registers a starting copy; the sense data when it may not start.
    fn start(&self, n: NexusId, list_id: Option<u8>, hold: bool) -> Result<(), Sense> {
        let mut g = self.inner.lock();
        if g.running >= MAX_CONCURRENT_COPIES {
            return Err(Sense::new(
                SenseKey::IllegalRequest,
                Asc::INSUFFICIENT_RESOURCES,
            ));
        }
        if let Some(id) = list_id {
            let q = g.lists.entry(n).or_default();
            if q.iter()
                .any(|r| r.list_id == id && r.status == STATUS_IN_PROGRESS)
            {
                return Err(Sense::new(
                    SenseKey::IllegalRequest,
                    Asc::OPERATION_IN_PROGRESS,
                ));
            }
            // A new copy with this identifier replaces a held result.
            q.retain(|r| r.list_id != id);
            q.push_back(Record {
                list_id: id,
                hold,
                status: STATUS_IN_PROGRESS,
                segments: 0,
                bytes: 0,
            });
            let mut held = q.len();
            while held > HELD_RESULTS {
                match q.iter().position(|r| r.status != STATUS_IN_PROGRESS) {
                    Some(i) => {
                        q.remove(i);
                        held -= 1;
                    }
                    None => break,
                }
            }
        }
        g.running += 1;
        Ok(())
    }

    /// Records the end of a copy started with [`Self::start`].
    fn finish(&self, n: NexusId, list_id: Option<u8>, ok: bool, segments: u16, bytes: u64) {
        let mut g = self.inner.lock();
        g.running = g.running.saturating_sub(1);
        let Some(id) = list_id else { return };
        let Some(q) = g.lists.get_mut(&n) else { return };
        let Some(i) = q
            .iter()
            .position(|r| r.list_id == id && r.status == STATUS_IN_PROGRESS)
        else {
            return;
        };
        if q[i].hold {
            q[i].status = if ok { STATUS_DONE } else { STATUS_FAILED };
            q[i].segments = segments;
            q[i].bytes = bytes;
        } else {
            q.remove(i);
        }
    }

    /// The record of `list_id` for COPY STATUS; a finished one is released.
    fn status(&self, n: NexusId, list_id: u8) -> Option<Record> {
        let mut g = self.inner.lock();
        let q = g.lists.get_mut(&n)?;
        let i = q.iter().position(|r| r.list_id == list_id && r.hold)?;
        let r = q[i];
        if r.status != STATUS_IN_PROGRESS {
            q.remove(i);
        }
        Some(r)
    }
}

fn length_error() -> Sense {
    Sense::new(SenseKey::IllegalRequest, Asc::PARAMETER_LIST_LENGTH_ERROR)
}

fn illegal(code: Asc, byte: usize) -> Sense {
    Sense {
        key: SenseKey::IllegalRequest,
        code,
        information: None,
        field: Some(param_field(byte)),
    }
}

fn aborted(code: Asc, byte: usize) -> Sense {
    Sense {
        key: SenseKey::CopyAborted,
        code,
        information: None,
        field: Some(param_field(byte)),
    }
}

/// A field pointer into the parameter list (for COPY ABORTED this is the
/// segment pointer with SD = 0, SPC-4 §4.5.2.4.6).
fn param_field(byte: usize) -> FieldPointer {
    FieldPointer {
        in_cdb: false,
        byte: u16::try_from(byte).unwrap_or(u16::MAX),
        bit: None,
    }
}

/// One parsed CSCD descriptor.
struct Cscd {
    /// Offset in the parameter list.
    at: usize,
    /// The unit it names, when it names one this nexus reaches.
    lu: Option<Arc<LogicalUnit>>,
    /// DISK BLOCK LENGTH.
    block_len: u32,
}

/// One parsed block-to-block segment descriptor.
struct Segment {
    at: usize,
    src: u16,
    dst: u16,
    dc: bool,
    blocks: u16,
    src_lba: u64,
    dst_lba: u64,
}

/// A segment checked against its units, ready to run.
struct Job<'l> {
    src: &'l LogicalUnit,
    dst: &'l LogicalUnit,
    src_off: u64,
    dst_off: u64,
    bytes: u64,
}

/// Parses one Identification Descriptor CSCD descriptor at `at`.
fn cscd(cmd: &Command<'_>, p: &[u8], at: usize) -> Result<Cscd, Sense> {
    let d = &p[at..at + CSCD_LEN];
    // Byte 1: LU ID TYPE (ignored for E4h in SPC-4), NUL (obsolete),
    // PERIPHERAL DEVICE TYPE: only block devices (00h).
    if d[1] & 0x1F != 0 {
        return Err(illegal(Asc::INVALID_FIELD_IN_PARAMETER_LIST, at + 1));
    }
    // Designation descriptor (SPC-4 §7.8.6.1) at bytes 4..=27: code set,
    // association and type, length; only an NAA designator (binary,
    // association logical unit) can name a unit here.
    let code_set = d[4] & 0x0F;
    let association = (d[5] >> 4) & 0x03;
    let kind = d[5] & 0x0F;
    let len = usize::from(d[7]);
    if len > 20 {
        return Err(illegal(Asc::INVALID_FIELD_IN_PARAMETER_LIST, at + 7));
    }
    let target = if code_set == 1 && association == 0 && kind == 3 {
        cmd.lus.and_then(|lus| lus.by_naa(&d[8..8 + len]))
    } else {
        None
    };
    Ok(Cscd {
        at,
        lu: target,
        block_len: u32::from_be_bytes([0, d[29], d[30], d[31]]),
    })
}

/// EXTENDED COPY(LID1) (SPC-4 §6.4). `cdb` is 16 bytes with service
/// action 00h.
pub(crate) fn extended_copy(lu: &LogicalUnit, cmd: &Command<'_>, cdb: &[u8]) -> Outcome {
    match run(lu, cmd, cdb) {
        Ok(()) => Outcome::good(),
        Err(s) => Outcome::check(s),
    }
}

fn run(lu: &LogicalUnit, cmd: &Command<'_>, cdb: &[u8]) -> Result<(), Sense> {
    let len = be32(cdb, 10);
    if len == 0 {
        return Ok(()); // SPC-4 §6.4.1: nothing is copied, not an error.
    }
    if len > MAX_PARAM_LIST {
        return Err(length_error());
    }
    let len = len as usize;
    if len < HEADER_LEN || cmd.data().len() < len {
        return Err(length_error());
    }
    let p = &cmd.data()[..len];
    let h = header(p)?;
    let (cscds, at) = cscds(cmd, p, h.tdl)?;
    let segments = segments(p, at, h.sdl)?;
    let jobs = plan(lu, cmd, p, &cscds, &segments)?;
    let (list_id, usage) = (h.list_id, h.usage);
    let tracked = (usage != 0b11).then_some(list_id);
    lu.copies.start(cmd.nexus, tracked, usage == 0b00)?;
    let mut moved = 0u64;
    let mut done = 0u16;
    let mut result = Ok(());
    for j in &jobs {
        if let Err(e) = copy(j, &mut moved) {
            result = Err(Sense {
                field: Some(param_field(segments[usize::from(done)].at)),
                ..e
            });
            break;
        }
        done += 1;
    }
    lu.copies
        .finish(cmd.nexus, tracked, result.is_ok(), done, moved);
    result
}

/// The parameter list header (SPC-4 §6.4.3.1) of a LID1 EXTENDED COPY.
struct Header {
    list_id: u8,
    /// LIST ID USAGE.
    usage: u8,
    /// CSCD DESCRIPTOR LIST LENGTH.
    tdl: usize,
    /// SEGMENT DESCRIPTOR LIST LENGTH.
    sdl: usize,
}

/// Checks the header of the parameter list `p` (the whole list, at least
/// HEADER_LEN bytes) against the list's length and what we support.
fn header(p: &[u8]) -> Result<Header, Sense> {
    let len = p.len();
    let list_id = p[0];
    let usage = (p[1] >> 3) & 0x03;
    let tdl = usize::from(be16(p, 2));
    let sdl = be32(p, 8) as usize;
    let idl = be32(p, 12) as usize;
    if tdl
        .checked_add(sdl)
        .and_then(|n| n.checked_add(idl))
        .is_none_or(|n| HEADER_LEN + n > len)
    {
        return Err(length_error());
    }
    if tdl + sdl > MAX_DESCRIPTOR_LIST as usize {
        return Err(length_error());
    }
    if usage == 0b01 {
        return Err(Sense::invalid_param(1, Some(4)));
    }
    if usage == 0b11 && list_id != 0 {
        return Err(Sense::invalid_param(0, None));
    }
    if idl != 0 {
        // MAXIMUM INLINE DATA LENGTH is zero.
        return Err(Sense::invalid_param(12, None));
    }
    Ok(Header {
        list_id,
        usage,
        tdl,
        sdl,
    })
}

/// Parses the CSCD descriptors; returns them and where the segment
/// descriptors start.
fn cscds(cmd: &Command<'_>, p: &[u8], tdl: usize) -> Result<(Vec<Cscd>, usize), Sense> {
    let mut cscds = Vec::new();
    let mut at = HEADER_LEN;
    let end = HEADER_LEN + tdl;
    while at < end {
        if cscds.len() == usize::from(MAX_CSCD_DESCRIPTORS) {
            return Err(illegal(Asc::TOO_MANY_TARGET_DESCRIPTORS, at));
        }
        if p[at] != CSCD_IDENTIFICATION {
            return Err(illegal(Asc::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE, at));
        }
        if at + CSCD_LEN > end {
            return Err(length_error());
        }
        cscds.push(cscd(cmd, p, at)?);
        at += CSCD_LEN;
    }
    Ok((cscds, at))
}

/// Parses the block-to-block segment descriptors from `at`.
fn segments(p: &[u8], mut at: usize, sdl: usize) -> Result<Vec<Segment>, Sense> {
    let mut segments = Vec::new();
    let end = at + sdl;
    while at < end {
        if segments.len() == usize::from(MAX_SEGMENT_DESCRIPTORS) {
            return Err(illegal(Asc::TOO_MANY_SEGMENT_DESCRIPTORS, at));
        }
        if at + 4 > end {
            return Err(length_error());
        }
        if p[at] != SEG_BLOCK_TO_BLOCK {
            return Err(illegal(Asc::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE, at));
        }
        if usize::from(be16(p, at + 2)) != SEG_B2B_LEN - 4 {
            return Err(illegal(Asc::INVALID_FIELD_IN_PARAMETER_LIST, at + 2));
        }
        if at + SEG_B2B_LEN > end {
            return Err(length_error());
        }
        segments.push(Segment {
            at,
            dc: p[at + 1] & 0x02 != 0,
            src: be16(p, at + 4),
            dst: be16(p, at + 6),
            blocks: be16(p, at + 10),
            src_lba: be64(p, at + 12),
            dst_lba: be64(p, at + 20),
        });
        at += SEG_B2B_LEN;
    }
    Ok(segments)
}

/// Checks every segment against its units, before anything moves.
fn plan<'l>(
    lu: &'l LogicalUnit,
    cmd: &Command<'_>,
    p: &[u8],
    cscds: &'l [Cscd],
    segments: &[Segment],
) -> Result<Vec<Job<'l>>, Sense> {
    let unit = |idx: u16, field: usize| -> Result<(&LogicalUnit, &Cscd), Sense> {
        let c = cscds
            .get(usize::from(idx))
            .ok_or_else(|| aborted(Asc::COPY_TARGET_NOT_REACHABLE, field))?;
        let u: &LogicalUnit = match &c.lu {
            Some(a) => a,
            None if cmd.lus.is_none() && names(lu, p, c.at) => lu,
            None => return Err(aborted(Asc::COPY_TARGET_NOT_REACHABLE, c.at + 4)),
        };
        if c.block_len != u.cfg.block_size {
            return Err(illegal(Asc::INVALID_FIELD_IN_PARAMETER_LIST, c.at + 29));
        }
        Ok((u, c))
    };
    let mut jobs = Vec::with_capacity(segments.len());
    for s in segments {
        let (src, _) = unit(s.src, s.at + 4)?;
        let (dst, _) = unit(s.dst, s.at + 6)?;
        let (sbs, dbs) = (u64::from(src.cfg.block_size), u64::from(dst.cfg.block_size));
        let bytes = u64::from(s.blocks) * if s.dc { dbs } else { sbs };
        if bytes > u64::from(MAX_SEGMENT_BYTES)
            || !bytes.is_multiple_of(sbs)
            || !bytes.is_multiple_of(dbs)
        {
            return Err(illegal(Asc::INVALID_FIELD_IN_PARAMETER_LIST, s.at + 10));
        }
        let fits = |u: &LogicalUnit, lba: u64, bs: u64| {
            lba < u.num_blocks() && bytes / bs <= u.num_blocks() - lba
        };
        if !fits(src, s.src_lba, sbs) {
            return Err(aborted(Asc::NO_ADDITIONAL_SENSE, s.at + 12));
        }
        if !fits(dst, s.dst_lba, dbs) {
            return Err(aborted(Asc::NO_ADDITIONAL_SENSE, s.at + 20));
        }
        if dst.vol.read_only() {
            return Err(aborted(Asc::WRITE_PROTECTED, s.at + 6));
        }
        jobs.push(Job {
            src,
            dst,
            src_off: s.src_lba * sbs,
            dst_off: s.dst_lba * dbs,
            bytes,
        });
    }
    Ok(jobs)
}

/// True when the CSCD descriptor at `at` names `lu` by its NAA designator.
fn names(lu: &LogicalUnit, p: &[u8], at: usize) -> bool {
    let d = &p[at..at + CSCD_LEN];
    let len = usize::from(d[7]);
    d[4] & 0x0F == 1
        && d[5] & 0x3F == 0x03
        && len <= 20
        && d[8..8 + len] == lu.vol.identity().naa[..]
}

/// Moves one segment's bytes, backwards when a forward copy would
/// overwrite source bytes not yet read (same unit, destination after an
/// overlapping source).
fn copy(j: &Job<'_>, moved: &mut u64) -> Result<(), Sense> {
    if j.bytes == 0 {
        return Ok(());
    }
    let same = std::ptr::eq(j.src, j.dst);
    let backwards = same && j.dst_off > j.src_off && j.dst_off < j.src_off + j.bytes;
    let mut buf = vec![0u8; (j.bytes as usize).min(COPY_CHUNK)];
    let mut left = j.bytes;
    while left > 0 {
        let n = left.min(COPY_CHUNK as u64);
        let rel = if backwards { left - n } else { j.bytes - left };
        let chunk = &mut buf[..n as usize];
        j.src
            .vol
            .backend()
            .read_at(chunk, j.src_off + rel)
            .map_err(|e| copy_error(&e, Asc::UNRECOVERED_READ_ERROR))?;
        j.dst
            .vol
            .backend()
            .write_at(chunk, j.dst_off + rel, false)
            .map_err(|e| copy_error(&e, Asc::WRITE_ERROR))?;
        left -= n;
        *moved += n;
    }
    Ok(())
}

fn copy_error(e: &std::io::Error, asc: Asc) -> Sense {
    let s = backend_error(e, asc);
    Sense {
        key: SenseKey::CopyAborted,
        ..s
    }
}

/// RECEIVE COPY RESULTS (SPC-4 §6.18): COPY STATUS (00h) and OPERATING
/// PARAMETERS (03h); the other service actions are invalid fields.
pub(crate) fn receive_copy_results(lu: &LogicalUnit, cmd: &Command<'_>, cdb: &[u8]) -> Outcome {
    let alloc = be32(cdb, 10) as usize;
    match cdb[1] & 0x1F {
        crate::cdb::SA_OPERATING_PARAMETERS => data_in(operating_parameters(lu), alloc),
        crate::cdb::SA_COPY_STATUS => match lu.copies.status(cmd.nexus, cdb[2]) {
            // SPC-4 §6.18.3: no copy with this LIST IDENTIFIER.
            None => Outcome::check(Sense::invalid_cdb(2, None)),
            Some(r) => data_in(copy_status(&r), alloc),
        },
        _ => Outcome::check(Sense::invalid_cdb(1, Some(4))),
    }
}

/// COPY STATUS parameter data (SPC-4 §6.18.3): status, segments processed,
/// and the transfer count in the smallest unit that fits 32 bits.
fn copy_status(r: &Record) -> Vec<u8> {
    let mut d = vec![0u8; 12];
    d[..4].copy_from_slice(&8u32.to_be_bytes()); // AVAILABLE DATA
    d[4] = r.status; // HDD = 0
    d[5..7].copy_from_slice(&r.segments.to_be_bytes());
    let mut units = 0u8; // 00h bytes, 01h KiB, 02h MiB, ...
    let mut count = r.bytes;
    while count > u64::from(u32::MAX) {
        count >>= 10;
        units += 1;
    }
    d[7] = units;
    d[8..12].copy_from_slice(&(count as u32).to_be_bytes());
    d
}

/// OPERATING PARAMETERS parameter data (SPC-4 §6.18.4): the limits above
/// and the implemented descriptor type codes 02h and E4h.
fn operating_parameters(lu: &LogicalUnit) -> Vec<u8> {
    let codes = [SEG_BLOCK_TO_BLOCK, CSCD_IDENTIFICATION];
    let mut d = vec![0u8; 44 + codes.len()];
    let len = (d.len() - 4) as u32;
    d[..4].copy_from_slice(&len.to_be_bytes()); // AVAILABLE DATA
    d[4] = 0x01; // SNLID: LIST ID USAGE 11b supported
    d[8..10].copy_from_slice(&MAX_CSCD_DESCRIPTORS.to_be_bytes());
    d[10..12].copy_from_slice(&MAX_SEGMENT_DESCRIPTORS.to_be_bytes());
    d[12..16].copy_from_slice(&MAX_DESCRIPTOR_LIST.to_be_bytes());
    d[16..20].copy_from_slice(&MAX_SEGMENT_BYTES.to_be_bytes());
    // 20..24 MAXIMUM INLINE DATA LENGTH, 24..28 HELD DATA LIMIT and 28..32
    // MAXIMUM STREAM DEVICE TRANSFER SIZE: zero (not supported).
    d[34..36].copy_from_slice(&u16::from(MAX_CONCURRENT_COPIES).to_be_bytes());
    d[36] = MAX_CONCURRENT_COPIES;
    d[37] = lu.cfg.block_size.trailing_zeros() as u8; // DATA SEGMENT GRANULARITY
    d[43] = codes.len() as u8; // IMPLEMENTED DESCRIPTOR LIST LENGTH
    d[44..].copy_from_slice(&codes);
    d
}
