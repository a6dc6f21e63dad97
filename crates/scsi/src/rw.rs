//! The block commands of SBC-3 §5: READ, WRITE, VERIFY, WRITE AND VERIFY
//! (6/10/12/16 as they exist), PRE-FETCH and SYNCHRONIZE CACHE.
//!
//! Checks run in this order, all before any data moves:
//! 1. protection fields (RDPROTECT / WRPROTECT / VRPROTECT ≠ 0 is INVALID
//!    FIELD IN CDB: the unit has no protection information, SBC-3 §4.22);
//! 2. field values (BYTCHK 10b, transfer length over the Block Limits
//!    MAXIMUM TRANSFER LENGTH: INVALID FIELD IN CDB);
//! 3. write protection (DATA PROTECT / WRITE PROTECTED);
//! 4. the range: an LBA past the last block, or LBA + length past the end
//!    (even for length 0), is LOGICAL BLOCK ADDRESS OUT OF RANGE.
//!
//! DPO is accepted and ignored (nothing is cached here). FUA on a write
//! goes to the backend as `fua`; FUA on a read flushes a write-back cache
//! first, so the data returned is what stable storage holds.
//!
//! When the initiator sent less data-out than the CDB describes (iSCSI
//! EDTL below the transfer length, RFC 7143 §11.4.5.1 residual overflow),
//! the whole blocks it did send are used and the command completes; a
//! partial block fails with ILLEGAL REQUEST / INVALID FIELD IN COMMAND
//! INFORMATION UNIT (0E/03) and nothing is written. Extra data-out beyond
//! the transfer length is ignored (residual underflow).
//!
//! Every command here holds the shared range lock of its blocks
//! ([`crate::locks`]) while it touches the backend, so it is ordered
//! against COMPARE AND WRITE, ORWRITE and WRITE ATOMIC on the same blocks.

use crate::cdb::{self, Lba};
use crate::locks::RangeGuard;
use crate::lu::{backend_error, Command, LogicalUnit, Outcome};
use crate::sense::{Asc, Sense, SenseKey};

/// Verification reads go through a buffer of at most this many bytes.
const VERIFY_CHUNK: usize = 1 << 20;

/// The decoded LBA fields; the dispatcher only sends LBA-range opcodes here.
#[inline]
pub(crate) fn fields(cdb: &[u8]) -> Result<Lba, Sense> {
    cdb::lba_fields(cdb).ok_or(Sense::invalid_opcode())
}

/// Protection field (byte 1, bits 7:5) must be zero: no protection
/// information on this unit.
#[inline]
pub(crate) fn no_protection(f: &Lba) -> Result<(), Sense> {
    if f.flags & 0xE0 != 0 {
        return Err(Sense::invalid_cdb(1, Some(7)));
    }
    Ok(())
}

impl LogicalUnit {
    /// Transfer length within the Block Limits maximum
    /// ([`volume::Volume::check_transfer`]).
    #[inline]
    pub(crate) fn check_length(&self, f: &Lba) -> Result<(), Sense> {
        self.vol
            .check_transfer(f.len)
            .map_err(|_| Sense::invalid_cdb(f.len_byte, None))
    }

    /// `lba .. lba + len` inside the medium, overflow-safe; an LBA past the
    /// last block is out of range even with length 0.
    #[inline]
    pub(crate) fn check_range(&self, lba: u64, len: u32) -> Result<(), Sense> {
        self.check_range64(lba, u64::from(len))
    }

    /// [`Self::check_range`] for a 64-bit block count
    /// ([`volume::Volume::check_range`]).
    #[inline]
    pub(crate) fn check_range64(&self, lba: u64, len: u64) -> Result<(), Sense> {
        self.vol
            .check_range(lba, len)
            .map_err(|_| Sense::lba_out_of_range())
    }

    /// Exactly `want` bytes of data-out, for commands whose data-out must
    /// match the CDB (COMPARE AND WRITE, WRITE SAME): a transport expected
    /// length that differs, or fewer bytes, is INVALID FIELD IN COMMAND
    /// INFORMATION UNIT (0E/03).
    pub(crate) fn exact_data<'d>(
        &self,
        expected: Option<u32>,
        want: usize,
        data: &'d [u8],
    ) -> Result<&'d [u8], Sense> {
        let bad = Sense::new(
            SenseKey::IllegalRequest,
            Asc::INVALID_FIELD_IN_INFORMATION_UNIT,
        );
        if expected.is_some_and(|e| e as usize != want) {
            return Err(bad);
        }
        data.get(..want).ok_or(bad)
    }

    /// Writes accepted ([`volume::Volume::check_writable`]).
    #[inline]
    pub(crate) fn check_writable(&self) -> Result<(), Sense> {
        self.vol
            .check_writable()
            .map_err(|_| Sense::new(SenseKey::DataProtect, Asc::WRITE_PROTECTED))
    }

    /// The checks of a READ or WRITE CDB before the medium is touched, in
    /// the order their sense data takes precedence: the fields, no
    /// protection information, the transfer length, write protection (for
    /// a write), the LBA range. One place for `read`, `write` and the
    /// completion-driven path (`scsi::fast`), so that they cannot drift
    /// apart.
    #[inline]
    pub(crate) fn checked_rw(&self, cdb: &[u8], write: bool) -> Result<Lba, Sense> {
        let f = fields(cdb)?;
        no_protection(&f)?;
        self.check_length(&f)?;
        if write {
            self.check_writable()?;
        }
        self.check_range(f.lba, f.len)?;
        Ok(f)
    }

    /// The data-out to use for `blocks` blocks; see the module docs.
    #[inline]
    pub(crate) fn received<'d>(&self, blocks: u32, data: &'d [u8]) -> Result<&'d [u8], Sense> {
        Ok(&data[..self.received_len(blocks, data.len())?])
    }

    /// How many of `have` data-out bytes to use for `blocks` blocks: all
    /// the blocks when enough came, else the whole blocks that did (a
    /// partial block is INVALID FIELD IN COMMAND INFORMATION UNIT).
    #[inline]
    pub(crate) fn received_len(&self, blocks: u32, have: usize) -> Result<usize, Sense> {
        let want = (blocks as usize) << self.vol.block_shift();
        if have >= want {
            return Ok(want);
        }
        if have & (self.cfg.block_size as usize - 1) != 0 {
            return Err(Sense::new(
                SenseKey::IllegalRequest,
                Asc::INVALID_FIELD_IN_INFORMATION_UNIT,
            ));
        }
        Ok(have)
    }

    /// Reads `blocks` blocks from `lba` in chunks and hands each chunk and
    /// its byte offset to `check`, which may stop with sense data.
    pub(crate) fn scan(
        &self,
        lba: u64,
        blocks: u64,
        mut check: impl FnMut(usize, &[u8]) -> Option<Sense>,
    ) -> Result<(), Sense> {
        let total = (blocks as usize) << self.vol.block_shift();
        let mut buf = vec![0u8; total.min(VERIFY_CHUNK)];
        let mut done = 0usize;
        while done < total {
            let n = (total - done).min(VERIFY_CHUNK);
            let chunk = &mut buf[..n];
            let at = (lba << self.vol.block_shift()) + done as u64;
            if let Err(e) = self.vol.backend().read_at(chunk, at) {
                return Err(backend_error(&e, Asc::UNRECOVERED_READ_ERROR));
            }
            if let Some(s) = check(done, chunk) {
                return Err(s);
            }
            done += n;
        }
        Ok(())
    }

    /// Byte-by-byte comparison of `data` with the medium from `lba`;
    /// MISCOMPARE carries the offset of the first differing byte.
    fn compare(&self, lba: u64, data: &[u8]) -> Result<(), Sense> {
        let blocks = (data.len() >> self.vol.block_shift()) as u64;
        self.scan(lba, blocks, |off, medium| {
            let expect = &data[off..off + medium.len()];
            first_difference(medium, expect).map(|i| miscompare(off + i))
        })
    }
}

/// MISCOMPARE / MISCOMPARE DURING VERIFY OPERATION with INFORMATION set to
/// `offset`, the first differing byte.
pub(crate) fn miscompare(offset: usize) -> Sense {
    Sense::new(SenseKey::Miscompare, Asc::MISCOMPARE_DURING_VERIFY).with_information(offset as u64)
}

/// The offset of the first byte where `a` and `b` differ.
pub(crate) fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None;
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// READ(6/10/12/16) (SBC-3 §5.13–5.16).
pub fn read(lu: &LogicalUnit, cdb: &[u8]) -> Result<Outcome, Sense> {
    let f = lu.checked_rw(cdb, false)?;
    if f.len == 0 {
        return Ok(Outcome::good());
    }
    // FUA: what we return must be what stable storage holds (the volume
    // flushes a write-back cache first).
    let data = lu
        .vol
        .read(f.lba, f.len, f.flags & 0x08 != 0)
        .map_err(io_sense)?;
    Ok(Outcome::with_chain(data))
}

/// Writes the whole blocks `data` at `lba` under the shared range lock,
/// which it returns still held, so that a caller may keep the blocks
/// ordered against exclusive holders for what follows.
fn write_blocks<'l>(
    lu: &'l LogicalUnit,
    lba: u64,
    data: &[u8],
    fua: bool,
) -> Result<RangeGuard<'l>, Sense> {
    let range = lu
        .vol
        .locks()
        .shared(lba, (data.len() >> lu.vol.block_shift()) as u64);
    if !data.is_empty() {
        lu.vol
            .backend()
            .write_at(data, lba << lu.vol.block_shift(), fua)
            .map_err(|e| backend_error(&e, Asc::WRITE_ERROR))?;
    }
    Ok(range)
}

/// WRITE(6/10/12/16) (SBC-3 §5.39–5.42): the command's data-out goes to
/// the backend as the transport received it ([`storage::BlockBackend::write`]:
/// segments, an owned buffer the backend may keep, or data placed on the
/// medium already), cut to the blocks the CDB asks for.
pub fn write(lu: &LogicalUnit, cdb: &[u8], cmd: &Command<'_>) -> Result<Outcome, Sense> {
    let f = lu.checked_rw(cdb, true)?;
    let data = cmd.data_out;
    let want = lu.received_len(f.len, data.len())?;
    if want == 0 {
        return Ok(Outcome::good());
    }
    let cut;
    let data = if want == data.len() {
        data
    } else {
        cut = data.prefix(want).ok_or_else(|| {
            Sense::new(
                SenseKey::IllegalRequest,
                Asc::INVALID_FIELD_IN_INFORMATION_UNIT,
            )
        })?;
        &cut
    };
    lu.vol
        .write(f.lba, data, f.flags & 0x08 != 0)
        .map_err(io_sense)?;
    Ok(Outcome::good())
}

/// The sense data of a volume I/O that failed: a failed read as
/// UNRECOVERED READ ERROR, a failed write or flush as WRITE ERROR (or NOT
/// READY when another gateway owns the medium: `backend_error`).
fn io_sense(e: volume::IoError) -> Sense {
    match e {
        volume::IoError::Read(e) => backend_error(&e, Asc::UNRECOVERED_READ_ERROR),
        volume::IoError::Write(e) => backend_error(&e, Asc::WRITE_ERROR),
    }
}

/// VERIFY(10/12/16) (SBC-3 §5.33–5.35). BYTCHK 00b reads the blocks and
/// reports a medium error if one fails; 01b compares the data-out with
/// them; 11b compares one block of data-out with each of them; 10b is
/// reserved.
pub fn verify(lu: &LogicalUnit, cdb: &[u8], data_out: &[u8]) -> Result<Outcome, Sense> {
    let f = fields(cdb)?;
    no_protection(&f)?;
    let bytchk = cdb::bytchk(f.flags);
    if bytchk == 2 {
        return Err(Sense::invalid_cdb(1, Some(2)));
    }
    lu.check_length(&f)?;
    lu.check_range(f.lba, f.len)?;
    if f.len == 0 {
        return Ok(Outcome::good());
    }
    let _range = lu.vol.locks().shared(f.lba, u64::from(f.len));
    match bytchk {
        0 => lu.scan(f.lba, u64::from(f.len), |_, _| None)?,
        1 => {
            let data = lu.received(f.len, data_out)?;
            lu.compare(f.lba, data)?;
        }
        _ => {
            let bs = lu.cfg.block_size as usize;
            let Some(one) = data_out.get(..bs) else {
                return Err(Sense::new(
                    SenseKey::IllegalRequest,
                    Asc::INVALID_FIELD_IN_INFORMATION_UNIT,
                ));
            };
            lu.scan(f.lba, u64::from(f.len), |_, medium| {
                medium
                    .chunks_exact(bs)
                    .find_map(|block| first_difference(block, one))
                    .map(miscompare)
            })?;
        }
    }
    Ok(Outcome::good())
}

/// WRITE AND VERIFY(10/12/16) (SBC-3 §5.43–5.45): the data is written
/// with FUA (verification is of the medium, so it must be there), then
/// read back; with BYTCHK 01b it is also compared. BYTCHK 1xb is refused.
pub fn write_and_verify(lu: &LogicalUnit, cdb: &[u8], data_out: &[u8]) -> Result<Outcome, Sense> {
    let f = fields(cdb)?;
    no_protection(&f)?;
    let bytchk = cdb::bytchk(f.flags);
    if bytchk >= 2 {
        return Err(Sense::invalid_cdb(1, Some(2)));
    }
    lu.check_length(&f)?;
    lu.check_writable()?;
    lu.check_range(f.lba, f.len)?;
    let data = lu.received(f.len, data_out)?;
    if data.is_empty() {
        return Ok(Outcome::good());
    }
    // The range stays locked through the verify.
    let _range = write_blocks(lu, f.lba, data, true)?;
    if bytchk == 1 {
        lu.compare(f.lba, data)?;
    } else {
        let blocks = (data.len() >> lu.vol.block_shift()) as u64;
        lu.scan(f.lba, blocks, |_, _| None)?;
    }
    Ok(Outcome::good())
}

/// PRE-FETCH(10/16) (SBC-3 §5.9–5.10). Nothing is cached by this unit, so
/// after the range check the answer is GOOD: SBC-3 reserves CONDITION MET
/// for a cache that could take every block.
pub fn pre_fetch(lu: &LogicalUnit, cdb: &[u8]) -> Result<Outcome, Sense> {
    let f = fields(cdb)?;
    lu.check_range(f.lba, f.len)?;
    Ok(Outcome::good())
}

/// SYNCHRONIZE CACHE(10/16) (SBC-3 §5.26–5.27): after the range check
/// (length 0 means "to the end") the whole backend is flushed; IMMED = 1
/// is honoured by flushing before status all the same.
pub fn synchronize_cache(lu: &LogicalUnit, cdb: &[u8]) -> Result<Outcome, Sense> {
    let f = fields(cdb)?;
    lu.check_range(f.lba, f.len)?;
    lu.vol
        .flush()
        .map_err(|e| backend_error(&e, Asc::WRITE_ERROR))?;
    Ok(Outcome::good())
}
