//! The NVM command set on a volume (NVM Command Set Specification 1.0,
//! "I/O Commands for the NVM Command Set": Flush, Write, Read, Compare,
//! Write Zeroes, Dataset Management): the same volume, range locks and
//! write cache the SCSI personality serves, so a LU served over iSCSI and
//! NVMe/TCP at once is one volume. Unsupported commands get Invalid Command
//! Opcode.
//!
//! The fused Compare and Write (NVMe Base 2.0 "Fused Operations"; NVM
//! Command Set 1.0 "Compare command"), VMware's ATS on NVMe, runs as
//! [`compare_and_write`] under the range's exclusive lock, the same lock
//! SCSI's COMPARE AND WRITE takes: one atomic test-and-set whichever
//! protocol the hosts use.

use bufpool::{Chain, WriteData};
use nvme_tcp_wire::capsule::{Sqe, Status};
use volume::{IoError, Refusal, Volume};

use crate::admin::Reply;

/// NVM command set opcodes.
pub mod opc {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const COMPARE: u8 = 0x05;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DSM: u8 = 0x09;
}

/// Data SGL Length Invalid.
const SGL_LENGTH_INVALID: Status = Status::generic(0x0f, true);
/// Namespace is Write Protected.
const WRITE_PROTECTED: Status = Status::generic(0x20, true);
/// Write Fault.
const WRITE_FAULT: Status = Status::media(0x80, false);
/// Unrecovered Read Error.
const READ_ERROR: Status = Status::media(0x81, false);
/// Compare Failure.
const COMPARE_FAILURE: Status = Status::media(0x85, true);
/// Command Aborted due to Failed Fused Command.
pub const FAILED_FUSED: Status = Status::generic(0x09, false);
/// Command Aborted due to Missing Fused Command.
pub const MISSING_FUSED: Status = Status::generic(0x0a, true);

/// Most Dataset Management ranges (NR is 8 bits, 0's based).
const MAX_DSM_RANGES: usize = 256;

/// Whether `op` is an NVM command served here (others get Invalid Command
/// Opcode before a namespace is looked up).
pub fn is_known(op: u8) -> bool {
    matches!(
        op,
        opc::FLUSH | opc::WRITE | opc::READ | opc::COMPARE | opc::WRITE_ZEROES | opc::DSM
    )
}

/// The data length the command's SGL describes.
fn sgl_len(sqe: &Sqe) -> u32 {
    u32::from_le_bytes(sqe.0[32..36].try_into().expect("4 bytes"))
}

fn refusal(r: Refusal) -> Status {
    match r {
        Refusal::TooLong => Status::INVALID_FIELD,
        Refusal::OutOfRange => Status::LBA_OUT_OF_RANGE,
        Refusal::WriteProtected => WRITE_PROTECTED,
    }
}

fn io_error(e: IoError) -> Status {
    match e {
        IoError::Read(_) => READ_ERROR,
        IoError::Write(_) => WRITE_FAULT,
    }
}

/// SLBA, NLB (as a count) and FUA of a Read/Write/Compare/Write Zeroes.
fn range(sqe: &Sqe) -> (u64, u32, bool) {
    let slba = u64::from(sqe.dw(10)) | (u64::from(sqe.dw(11)) << 32);
    let d12 = sqe.dw(12);
    (slba, (d12 & 0xffff) + 1, d12 & (1 << 30) != 0)
}

/// For a Read, hints `v` that its blocks are read soon
/// ([`Volume::prefetch`]): the driver calls it one command ahead.
pub fn prefetch(v: &Volume, sqe: &Sqe) {
    if sqe.opcode() == opc::READ && sqe.fuse() == 0 {
        let (slba, nlb, _) = range(sqe);
        v.prefetch(slba, nlb);
    }
}

/// Whether `first` (FUSE 01b) and `second` (FUSE 10b) make a Compare and
/// Write: a Compare then a Write of the same blocks of the same namespace.
pub fn is_compare_and_write(first: &Sqe, second: &Sqe) -> bool {
    first.fuse() == 1
        && second.fuse() == 2
        && first.opcode() == opc::COMPARE
        && second.opcode() == opc::WRITE
        && first.nsid() == second.nsid()
        && first.dw(10) == second.dw(10)
        && first.dw(11) == second.dw(11)
        && first.dw(12) & 0xffff == second.dw(12) & 0xffff
}

/// The fused Compare and Write ([`is_compare_and_write`]) on `v`: the
/// blocks are compared with `expected` and, only if they match, replaced
/// by `new`, with no other command touching them in between. The replies
/// of the Compare and of the Write: a Compare that fails (Compare Failure,
/// or any error) aborts the Write (Command Aborted due to Failed Fused
/// Command), and a Write that cannot run aborts the Compare likewise.
pub fn compare_and_write(
    v: &Volume,
    cmp: &Sqe,
    expected: Chain,
    wr: &Sqe,
    new: Chain,
) -> (Reply, Reply) {
    let fail_first = |s| (Reply::status(s), Reply::status(FAILED_FUSED));
    let fail_second = |s| (Reply::status(FAILED_FUSED), Reply::status(s));
    let (slba, nlb, fua_cmp) = range(cmp);
    let fua = range(wr).2;
    if let Err(s) = checked(v, cmp, slba, nlb) {
        return fail_first(s);
    }
    if let Err(s) = checked(v, wr, slba, nlb).and_then(|()| v.check_writable().map_err(refusal)) {
        return fail_second(s);
    }
    let len = (nlb as usize) << v.block_shift();
    if expected.len() != len {
        return fail_first(SGL_LENGTH_INVALID);
    }
    if new.len() != len {
        return fail_second(SGL_LENGTH_INVALID);
    }
    let shift = v.block_shift();
    let backend = v.backend();
    let _range = v.locks().exclusive(slba, u64::from(nlb));
    if fua_cmp && v.write_back() && v.flush().is_err() {
        return fail_first(READ_ERROR);
    }
    let mut medium = vec![0u8; len];
    if backend.read_at(&mut medium, slba << shift).is_err() {
        return fail_first(READ_ERROR);
    }
    if medium != expected.to_vec() {
        return fail_first(COMPARE_FAILURE);
    }
    if backend.write_at(&new.to_vec(), slba << shift, fua).is_err() {
        return fail_second(WRITE_FAULT);
    }
    (Reply::default(), Reply::default())
}

/// Checks a transfer of `nlb` blocks at `slba` and its data length.
fn checked(v: &Volume, sqe: &Sqe, slba: u64, nlb: u32) -> Result<(), Status> {
    v.check_transfer(nlb).map_err(refusal)?;
    v.check_range(slba, u64::from(nlb)).map_err(refusal)?;
    if u64::from(sgl_len(sqe)) != u64::from(nlb) << v.block_shift() {
        return Err(SGL_LENGTH_INVALID);
    }
    Ok(())
}

/// Runs NVM command `sqe` on `v` with the host's `data` (`owned`: one
/// buffer of the command's own, which the medium may keep; it goes back to
/// the thread's pool otherwise).
pub fn execute(v: &Volume, sqe: &Sqe, data: Chain, owned: bool) -> Reply {
    match run(v, sqe, data, owned) {
        Ok(r) => r,
        Err(s) => Reply::status(s),
    }
}

fn run(v: &Volume, sqe: &Sqe, data: Chain, owned: bool) -> Result<Reply, Status> {
    match sqe.opcode() {
        opc::READ => {
            let (slba, nlb, fua) = range(sqe);
            checked(v, sqe, slba, nlb)?;
            let data = v.read(slba, nlb, fua).map_err(io_error)?;
            Ok(Reply {
                data,
                ..Reply::default()
            })
        }
        opc::WRITE => {
            let (slba, nlb, fua) = range(sqe);
            checked(v, sqe, slba, nlb)?;
            v.check_writable().map_err(refusal)?;
            if data.len() as u64 != u64::from(nlb) << v.block_shift() {
                return Err(SGL_LENGTH_INVALID);
            }
            let wd = match data.into_single() {
                Ok(b) if owned => WriteData::Owned(b),
                Ok(b) => WriteData::from(Chain::from(b)),
                Err(c) => WriteData::from(c),
            };
            let r = v.write(slba, &wd, fua);
            if let WriteData::Owned(b) = wd {
                bufpool::give(b);
            }
            r.map_err(io_error)?;
            Ok(Reply::default())
        }
        opc::FLUSH => {
            v.flush().map_err(|_| WRITE_FAULT)?;
            Ok(Reply::default())
        }
        opc::COMPARE => {
            let (slba, nlb, fua) = range(sqe);
            checked(v, sqe, slba, nlb)?;
            if data.len() as u64 != u64::from(nlb) << v.block_shift() {
                return Err(SGL_LENGTH_INVALID);
            }
            let have = v.read(slba, nlb, fua).map_err(io_error)?;
            if have.to_vec() != data.to_vec() {
                return Err(COMPARE_FAILURE);
            }
            Ok(Reply::default())
        }
        opc::WRITE_ZEROES => {
            let (slba, nlb, fua) = range(sqe);
            v.check_range(slba, u64::from(nlb)).map_err(refusal)?;
            v.check_writable().map_err(refusal)?;
            let deallocate = sqe.dw(12) & (1 << 25) != 0 && v.thin();
            let shift = v.block_shift();
            let n = u64::from(nlb);
            let _range = v.locks().shared(slba, n);
            let backend = v.backend();
            let r = if deallocate {
                v.deallocate_physical(slba, n, |o, l| backend.write_zeroes(o, l))
            } else {
                backend.write_zeroes(slba << shift, n << shift)
            };
            r.map_err(|_| WRITE_FAULT)?;
            if fua && v.write_back() {
                v.flush().map_err(|_| WRITE_FAULT)?;
            }
            Ok(Reply::default())
        }
        opc::DSM => {
            let nr = (sqe.dw(10) & 0xff) as usize + 1;
            let deallocate = sqe.dw(11) & (1 << 2) != 0;
            // The data may be longer than NR ranges (Linux always sends
            // room for 256, 4 KiB): only the first NR count.
            if data.len() < nr * 16 || data.len() > MAX_DSM_RANGES * 16 {
                return Err(SGL_LENGTH_INVALID);
            }
            if !deallocate || !v.thin() {
                // Attributes only, or nothing to free: advisory, done.
                return Ok(Reply::default());
            }
            v.check_writable().map_err(refusal)?;
            let b = data.to_vec();
            let ranges: Vec<(u64, u64)> = b
                .chunks_exact(16)
                .take(nr)
                .map(|r| {
                    let len = u32::from_le_bytes(r[4..8].try_into().expect("4 bytes"));
                    let slba = u64::from_le_bytes(r[8..16].try_into().expect("8 bytes"));
                    (slba, u64::from(len))
                })
                .collect();
            for &(slba, n) in &ranges {
                v.check_range(slba, n).map_err(refusal)?;
            }
            let backend = v.backend();
            for (slba, n) in ranges.into_iter().filter(|r| r.1 > 0) {
                let _range = v.locks().shared(slba, n);
                v.deallocate_physical(slba, n, |o, l| backend.write_zeroes(o, l))
                    .map_err(|_| WRITE_FAULT)?;
            }
            Ok(Reply::default())
        }
        _ => Err(Status::INVALID_OPCODE),
    }
}
