//! The read-modify-write and atomic block commands: COMPARE AND WRITE
//! (SBC-3 §5.2), ORWRITE(16) (SBC-3 §5.8) and WRITE ATOMIC(16) (SBC-4
//! §5.48).
//!
//! Each holds the *exclusive* range lock of its blocks ([`crate::locks`])
//! from the first read to the last write, and every other command that
//! reads or writes blocks holds the shared one, so from any session or path:
//! * COMPARE AND WRITE compares and writes as "an uninterrupted series of
//!   actions" (what VMware's ATS relies on);
//! * ORWRITE's read, OR and write cannot interleave with another write;
//! * a WRITE ATOMIC is seen by other commands whole or not at all.
//!
//! COMPARE AND WRITE: NUMBER OF LOGICAL BLOCKS up to
//! [`crate::MAX_COMPARE_AND_WRITE_BLOCKS`] (VPD B0h MAXIMUM COMPARE AND
//! WRITE LENGTH; more is INVALID FIELD IN CDB), 0 does nothing; the
//! data-out is the verify half then the write half, exactly 2 × blocks ×
//! block size: a transport expected length that differs (also for 0
//! blocks), or a short transfer, is INVALID FIELD IN CDB pointing at the
//! NUMBER OF LOGICAL BLOCKS, as Linux LIO answers, and nothing is written.
//! A mismatch
//! is MISCOMPARE / MISCOMPARE DURING VERIFY OPERATION (0E/1D/00) with
//! INFORMATION = offset of the first differing byte in the data-out, and
//! nothing is written. FUA: the compare reads stable data (a write-back
//! cache is flushed first) and the write is FUA.
//!
//! WRITE ATOMIC(16): TRANSFER LENGTH up to the MAXIMUM ATOMIC TRANSFER
//! LENGTH of VPD B0h, the LBA a multiple of its ATOMIC ALIGNMENT when that
//! is not 0 (else INVALID FIELD IN CDB, checked after the range: SBC-4
//! §5.48); no granularity requirement; ATOMIC BOUNDARY must be 0,
//! boundaries are not supported. All of the data-out must be there (a
//! short transfer writes nothing). How large a write survives a crash
//! whole is the backend's [`storage::Caps::max_atomic_write`] and
//! [`storage::Caps::atomic_alignment`]: volatile backends allow
//! the maximum transfer length, RBD one object on an object boundary,
//! others one block.

use crate::cdb::{be16, be32, be64};
use crate::lu::{backend_error, Command, LogicalUnit, Outcome};
use crate::rw::{first_difference, miscompare};
use crate::sense::{Asc, Sense, SenseKey};
use crate::MAX_COMPARE_AND_WRITE_BLOCKS;

/// WRPROTECT / ORPROTECT (byte 1, bits 7:5) must be zero: no protection
/// information on this unit.
fn no_protection(cdb: &[u8]) -> Result<(), Sense> {
    if cdb[1] & 0xE0 != 0 {
        return Err(Sense::invalid_cdb(1, Some(7)));
    }
    Ok(())
}

/// FUA (byte 1 bit 3).
fn fua(cdb: &[u8]) -> bool {
    cdb[1] & 0x08 != 0
}

/// Reads `buf.len()` bytes at block `lba`.
fn read(lu: &LogicalUnit, buf: &mut [u8], lba: u64) -> Result<(), Sense> {
    lu.vol
        .backend()
        .read_at(buf, lba << lu.vol.block_shift())
        .map_err(|e| backend_error(&e, Asc::UNRECOVERED_READ_ERROR))
}

/// Writes `data` at block `lba`.
fn write(lu: &LogicalUnit, data: &[u8], lba: u64, fua: bool) -> Result<(), Sense> {
    lu.vol
        .backend()
        .write_at(data, lba << lu.vol.block_shift(), fua)
        .map_err(|e| backend_error(&e, Asc::WRITE_ERROR))
}

/// With FUA under a write-back cache: make what the read will see stable.
fn flush_for_fua(lu: &LogicalUnit, fua: bool) -> Result<(), Sense> {
    if fua && lu.vol.write_back() {
        lu.vol
            .flush()
            .map_err(|e| backend_error(&e, Asc::WRITE_ERROR))?;
    }
    Ok(())
}

/// COMPARE AND WRITE (SBC-3 §5.2).
pub fn compare_and_write(
    lu: &LogicalUnit,
    cdb: &[u8],
    cmd: &Command<'_>,
) -> Result<Outcome, Sense> {
    no_protection(cdb)?;
    let lba = be64(cdb, 2);
    let blocks = cdb[13];
    if blocks > MAX_COMPARE_AND_WRITE_BLOCKS {
        return Err(Sense::invalid_cdb(13, None));
    }
    lu.check_writable()?;
    lu.check_range(lba, u32::from(blocks))?;
    let half = usize::from(blocks) << lu.vol.block_shift();
    let data = lu
        .exact_data(cmd.expected_data_out, 2 * half, cmd.data())
        .map_err(|_| Sense::invalid_cdb(13, None))?;
    if blocks == 0 {
        return Ok(Outcome::good());
    }
    let (verify, new) = data.split_at(half);
    let fua = fua(cdb);
    let mut medium = vec![0u8; half];
    let _range = lu.vol.locks().exclusive(lba, u64::from(blocks));
    flush_for_fua(lu, fua)?;
    read(lu, &mut medium, lba)?;
    if let Some(i) = first_difference(&medium, verify) {
        return Err(miscompare(i));
    }
    write(lu, new, lba, fua)?;
    Ok(Outcome::good())
}

/// ORWRITE(16) (SBC-3 §5.8): each block becomes its old contents ORed with
/// the data-out. The received whole blocks are used, as for WRITE.
pub fn orwrite(lu: &LogicalUnit, cdb: &[u8], data_out: &[u8]) -> Result<Outcome, Sense> {
    no_protection(cdb)?;
    let lba = be64(cdb, 2);
    let len = be32(cdb, 10);
    if len > lu.vol.max_transfer_blocks() {
        return Err(Sense::invalid_cdb(10, None));
    }
    lu.check_writable()?;
    lu.check_range(lba, len)?;
    let data = lu.received(len, data_out)?;
    if data.is_empty() {
        return Ok(Outcome::good());
    }
    let fua = fua(cdb);
    let mut buf = vec![0u8; data.len()];
    let _range = lu
        .vol
        .locks()
        .exclusive(lba, (data.len() >> lu.vol.block_shift()) as u64);
    flush_for_fua(lu, fua)?;
    read(lu, &mut buf, lba)?;
    buf.iter_mut().zip(data).for_each(|(m, d)| *m |= d);
    write(lu, &buf, lba, fua)?;
    Ok(Outcome::good())
}

/// WRITE ATOMIC(16) (SBC-4 §5.48).
pub fn write_atomic(lu: &LogicalUnit, cdb: &[u8], data_out: &[u8]) -> Result<Outcome, Sense> {
    no_protection(cdb)?;
    let lba = be64(cdb, 2);
    let len = be16(cdb, 12);
    // The range first: a request past the end is LOGICAL BLOCK ADDRESS
    // OUT OF RANGE whatever else is wrong with it (SBC-4 §5.48, as for
    // every write).
    lu.check_range(lba, u32::from(len))?;
    if be16(cdb, 10) != 0 {
        // ATOMIC BOUNDARY: MAXIMUM ATOMIC BOUNDARY SIZE is 0.
        return Err(Sense::invalid_cdb(10, None));
    }
    if u32::from(len) > lu.vol.max_atomic_blocks() {
        return Err(Sense::invalid_cdb(12, None));
    }
    lu.check_writable()?;
    if lu.vol.atomic_align_blocks() != 0
        && !lba.is_multiple_of(u64::from(lu.vol.atomic_align_blocks()))
    {
        return Err(Sense::invalid_cdb(2, None));
    }
    if len == 0 {
        return Ok(Outcome::good());
    }
    let want = usize::from(len) << lu.vol.block_shift();
    let Some(data) = data_out.get(..want) else {
        return Err(Sense::new(
            SenseKey::IllegalRequest,
            Asc::INVALID_FIELD_IN_INFORMATION_UNIT,
        ));
    };
    let _range = lu.vol.locks().exclusive(lba, u64::from(len));
    write(lu, data, lba, fua(cdb))?;
    Ok(Outcome::good())
}
