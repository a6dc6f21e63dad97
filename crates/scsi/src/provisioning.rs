//! Logical block provisioning (SBC-3 §4.7) and the commands that zero or
//! deallocate: WRITE SAME(10/16) (SBC-3 §5.41–5.42, NDOB from SBC-4
//! §5.51), UNMAP (SBC-3 §5.28) and GET LBA STATUS (SBC-3 §5.21).
//!
//! The unit is *thin provisioned* ([`LogicalUnit::thin`]) when the
//! configuration asks for it and the backend can free space; it then
//! reports LBPME = 1 and LBPRZ = 1 (deallocated blocks read as zeros, which
//! every backend guarantees) in READ CAPACITY(16), serves VPD B2h (LBPU,
//! LBPWS, LBPWS10, LBPRZ, provisioning type thin) and the UNMAP limits of
//! VPD B0h. A fully provisioned unit refuses UNMAP (INVALID COMMAND
//! OPERATION CODE) and WRITE SAME with UNMAP = 1 (INVALID FIELD IN CDB).
//!
//! WRITE SAME: PBDATA, LBDATA and ANCHOR are refused (ANC_SUP = 0); a
//! NUMBER OF LOGICAL BLOCKS of 0 means "to the last block" (WSNZ = 0); more
//! than MAXIMUM WRITE SAME LENGTH blocks is INVALID FIELD IN CDB. The
//! data-out must be exactly one block (none with NDOB, which means a block
//! of zeros), whatever the UNMAP bit says.
//!
//! With UNMAP = 1 the range is deallocated *whatever the data-out block
//! holds*: SBC-4 §5.49/§5.50 (WRITE SAME(10)/(16)), table "ANCHOR bit,
//! UNMAP bit and ANC_SUP bit relationships" (Seagate SCSI Commands
//! Reference Rev. J, table 237, quotes it): UNMAP = 1, ANCHOR = 0 is the
//! action "Unmap", and a thin provisioned logical unit *should deallocate
//! each LBA* specified by the command; WRITE SAME's own text lets the
//! device server, for each LBA, either write the block or perform an unmap
//! operation. Deallocated blocks read as zeros (LBPRZ = 1), so an initiator
//! that sends a non-zero block with UNMAP = 1 reads zeros back from them,
//! as it does from LIO. Only LBAs that cannot be deallocated get the write operation
//! with the data-out block: those of a physical block the range does not
//! cover whole (below).
//!
//! With UNMAP = 0 a block of zeros is zeroed and stays mapped, and any
//! other block is written to every LBA from a buffer of at most 1 MiB.
//! Nothing allocates in proportion to the block count.
//!
//! UNMAP: the parameter list is checked whole before anything is
//! deallocated: a PARAMETER LIST LENGTH of 1–7, a list shorter than its
//! header, or lengths in the header that run past the list are PARAMETER
//! LIST LENGTH ERROR; more descriptors than MAXIMUM UNMAP BLOCK DESCRIPTOR
//! COUNT or more blocks in total than MAXIMUM UNMAP LBA COUNT are INVALID
//! FIELD IN PARAMETER LIST (pointing at the field); a descriptor whose
//! range runs past the last block is LOGICAL BLOCK ADDRESS OUT OF RANGE.
//! An incomplete trailing descriptor is ignored (SBC-3 §5.28.2).
//!
//! Physical blocks ([`crate::LuConfig::physical_block_size`], told in READ
//! CAPACITY(16) as LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT, lowest
//! aligned LBA 0): a physical block is deallocated only whole. UNMAP and
//! WRITE SAME with UNMAP = 1 split their range into the whole physical
//! blocks it covers, which are deallocated, and the partial physical
//! blocks at either end (the last physical block of the unit counts as
//! covered when the range runs to the last LBA), whose LBAs stay mapped
//! and are zero-filled by both commands, so that every LBA they name
//! reads as zeros afterwards, as LBPRZ = 1 leads initiators to expect
//! (libiscsi's Unmap.Simple and WriteSame10.UnmapUntilEnd read them back;
//! WRITE SAME performs the same unmap operation as UNMAP on each LBA). The
//! backend in turn frees whole allocation units of what is deallocated
//! and zero-fills the rest, which it keeps allocated (GET LBA STATUS
//! reports it mapped; a status of 0h means "mapped or unknown"). OPTIMAL
//! UNMAP GRANULARITY (VPD B0h) is the larger of the two units.
//!
//! GET LBA STATUS returns as many LBA status descriptors as the allocation
//! length holds (at least one, at most 64), the first starting at the
//! STARTING LOGICAL BLOCK ADDRESS (SBC-4 "LBA status descriptor
//! relationships"; never rounded to a physical block), each
//! mapped or deallocated as the backend's allocation query says; a block
//! only partly deallocated in the backend counts as mapped. A fully
//! provisioned unit reports everything mapped.

use crate::cdb::{be16, be32, be64, op};
use crate::lu::{backend_error, data_in, Command, LogicalUnit, Outcome};
use crate::sense::{Asc, Sense, SenseKey};
use crate::{MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS, MAX_WRITE_SAME_BYTES};

/// WRITE SAME writes a repeated block from a buffer of at most this size.
const PATTERN_BUF: usize = 1 << 20;
/// Most LBA status descriptors one GET LBA STATUS returns.
const MAX_LBA_STATUS_DESCRIPTORS: usize = 64;
/// Longest range one allocation query covers, in bytes.
const MAX_QUERY_BYTES: u64 = 1 << 36;

impl LogicalUnit {
    /// MAXIMUM WRITE SAME LENGTH (VPD B0h) in blocks.
    pub(crate) fn max_write_same_blocks(&self) -> u64 {
        MAX_WRITE_SAME_BYTES >> self.vol.block_shift()
    }

    /// OPTIMAL UNMAP GRANULARITY (VPD B0h) in blocks: the backend's
    /// allocation unit or the physical block, whichever is larger.
    pub(crate) fn unmap_granularity_blocks(&self) -> u32 {
        let g = (self.vol.backend().caps().discard_granularity >> self.vol.block_shift())
            .max(1 << self.vol.lbppb_shift());
        g.min(u64::from(u32::MAX)) as u32
    }
}

/// WRITE SAME(10) and WRITE SAME(16).
pub fn write_same(lu: &LogicalUnit, cdb: &[u8], cmd: &Command<'_>) -> Result<Outcome, Sense> {
    let sixteen = cdb[0] == op::WRITE_SAME_16;
    let flags = cdb[1];
    if flags & 0xE0 != 0 {
        return Err(Sense::invalid_cdb(1, Some(7))); // WRPROTECT
    }
    if flags & 0x10 != 0 {
        return Err(Sense::invalid_cdb(1, Some(4))); // ANCHOR: ANC_SUP = 0
    }
    let unmap = flags & 0x08 != 0;
    if unmap && !lu.vol.thin() {
        return Err(Sense::invalid_cdb(1, Some(3)));
    }
    if flags & 0x04 != 0 {
        return Err(Sense::invalid_cdb(1, Some(2))); // PBDATA
    }
    if flags & 0x02 != 0 {
        return Err(Sense::invalid_cdb(1, Some(1))); // LBDATA
    }
    // Bit 0: NDOB in WRITE SAME(16), reserved in WRITE SAME(10).
    let ndob = flags & 0x01 != 0;
    if ndob && !sixteen {
        return Err(Sense::invalid_cdb(1, Some(0)));
    }
    let (lba, count, len_byte) = if sixteen {
        (be64(cdb, 2), u64::from(be32(cdb, 10)), 10)
    } else {
        (u64::from(be32(cdb, 2)), u64::from(be16(cdb, 7)), 7)
    };
    let max = lu.max_write_same_blocks();
    if count > max {
        return Err(Sense::invalid_cdb(len_byte, None));
    }
    lu.check_writable()?;
    let count = if count == 0 {
        // To the last block (WSNZ = 0).
        lu.check_range64(lba, 0)?;
        let rest = lu.num_blocks() - lba;
        if rest > max {
            return Err(Sense::invalid_cdb(len_byte, None));
        }
        rest
    } else {
        lu.check_range64(lba, count)?;
        count
    };
    let bs = lu.cfg.block_size as usize;
    let block = if ndob {
        None
    } else {
        Some(lu.exact_data(cmd.expected_data_out, bs, cmd.data())?)
    };
    let zeros = block.is_none_or(|b| b.iter().all(|&x| x == 0));
    let offset = lba << lu.vol.block_shift();
    let bytes = count << lu.vol.block_shift();
    let _range = lu.vol.locks().shared(lba, count);
    let write = |offset: u64, bytes: u64| match block {
        _ if zeros => lu.vol.backend().write_zeroes(offset, bytes),
        Some(b) => write_pattern(lu, b, offset, bytes),
        None => unreachable!("NDOB is all zeros"),
    };
    let result = if unmap {
        // "Unmap" (SBC-4 WRITE SAME, ANCHOR/UNMAP/ANC_SUP table): every
        // LBA gets the unmap operation UNMAP performs, whatever the
        // data-out block holds: whole physical blocks are deallocated, the
        // LBAs of partial ones zero-filled, so the whole range reads as
        // zeros (LBPRZ = 1) however it is aligned.
        lu.vol
            .deallocate_physical(lba, count, |o, n| lu.vol.backend().write_zeroes(o, n))
    } else {
        write(offset, bytes)
    };
    result.map_err(|e| backend_error(&e, Asc::WRITE_ERROR))?;
    Ok(Outcome::good())
}

/// Writes `block` over `bytes` bytes from `offset` through a bounded buffer.
fn write_pattern(lu: &LogicalUnit, block: &[u8], offset: u64, bytes: u64) -> std::io::Result<()> {
    let per_buf = (PATTERN_BUF / block.len()).max(1);
    let buf_len = (per_buf * block.len()).min(usize::try_from(bytes).unwrap_or(usize::MAX));
    let buf = block.repeat(buf_len / block.len());
    let mut done = 0u64;
    while done < bytes {
        let n = (bytes - done).min(buf.len() as u64) as usize;
        lu.vol.backend().write_at(&buf[..n], offset + done, false)?;
        done += n as u64;
    }
    Ok(())
}

/// PARAMETER LIST LENGTH ERROR.
fn list_length_error() -> Sense {
    Sense::new(SenseKey::IllegalRequest, Asc::PARAMETER_LIST_LENGTH_ERROR)
}

/// UNMAP (SBC-3 §5.28).
pub fn unmap(lu: &LogicalUnit, cdb: &[u8], data_out: &[u8]) -> Result<Outcome, Sense> {
    if !lu.vol.thin() {
        return Err(Sense::invalid_opcode());
    }
    if cdb[1] & 0x01 != 0 {
        return Err(Sense::invalid_cdb(1, Some(0))); // ANCHOR: ANC_SUP = 0
    }
    let plen = usize::from(be16(cdb, 7));
    lu.check_writable()?;
    if plen == 0 {
        return Ok(Outcome::good());
    }
    let list = &data_out[..data_out.len().min(plen)];
    if plen < 8 || list.len() < 8 {
        return Err(list_length_error());
    }
    // UNMAP DATA LENGTH counts the bytes after itself; the block
    // descriptor data follows the 8-byte header.
    let data_len = usize::from(be16(list, 0));
    let bd_len = usize::from(be16(list, 2));
    if data_len + 2 > list.len() || bd_len + 8 > list.len() {
        return Err(list_length_error());
    }
    if bd_len + 6 > data_len {
        return Err(Sense::invalid_param(2, None));
    }
    let n = bd_len / 16;
    if n > MAX_UNMAP_DESCRIPTORS as usize {
        return Err(Sense::invalid_param(2, None));
    }
    let descriptors = || {
        list[8..8 + 16 * n]
            .chunks_exact(16)
            .map(|d| (be64(d, 0), u64::from(be32(d, 8))))
    };
    let mut total = 0u64;
    for (i, (lba, blocks)) in descriptors().enumerate() {
        if lba > lu.num_blocks() || blocks > lu.num_blocks() - lba {
            return Err(Sense::lba_out_of_range());
        }
        total += blocks;
        if total > u64::from(MAX_UNMAP_BLOCKS) {
            return Err(Sense::invalid_param((8 + 16 * i + 8) as u16, None));
        }
    }
    for (lba, blocks) in descriptors().filter(|&(_, b)| b > 0) {
        let _range = lu.vol.locks().shared(lba, blocks);
        // Whole physical blocks are deallocated; the LBAs of partial ones
        // stay mapped and are zero-filled.
        lu.vol
            .deallocate_physical(lba, blocks, |o, n| lu.vol.backend().write_zeroes(o, n))
            .map_err(|e| backend_error(&e, Asc::WRITE_ERROR))?;
    }
    Ok(Outcome::good())
}

/// PROVISIONING STATUS of an LBA status descriptor (SBC-3 table 54).
const MAPPED: u8 = 0;
const DEALLOCATED: u8 = 1;

/// GET LBA STATUS (SBC-3 §5.21); REPORT TYPE (SBC-4, byte 14) other than
/// "all" is refused.
pub fn get_lba_status(lu: &LogicalUnit, cdb: &[u8]) -> Result<Outcome, Sense> {
    let start = be64(cdb, 2);
    let alloc = be32(cdb, 10) as usize;
    if cdb[14] & 0x07 != 0 {
        return Err(Sense::invalid_cdb(14, Some(2)));
    }
    lu.check_range64(start, 0)?;
    let room = (alloc.saturating_sub(8) / 16).clamp(1, MAX_LBA_STATUS_DESCRIPTORS);
    let mut runs: Vec<(u64, u64, u8)> = Vec::with_capacity(room);
    let mut pos = start;
    while pos < lu.num_blocks() && runs.len() < room {
        let rest = lu.num_blocks() - pos;
        let (blocks, state) = if lu.vol.thin() {
            status_at(lu, pos, rest)?
        } else {
            (rest, MAPPED)
        };
        // A descriptor counts at most u32::MAX blocks: a longer run ends
        // the answer there (the initiator asks again from its end).
        let (taken, full) = match runs.last_mut() {
            Some(last) if last.2 == state => {
                let add = blocks.min(u64::from(u32::MAX) - last.1);
                last.1 += add;
                (add, add < blocks)
            }
            _ => {
                let b = blocks.min(u64::from(u32::MAX));
                runs.push((pos, b, state));
                (b, b < blocks)
            }
        };
        pos += taken;
        if full {
            break;
        }
    }
    let mut d = Vec::with_capacity(8 + 16 * runs.len());
    d.extend_from_slice(&((4 + 16 * runs.len()) as u32).to_be_bytes());
    d.extend_from_slice(&[0; 4]);
    for (lba, blocks, state) in runs {
        d.extend_from_slice(&lba.to_be_bytes());
        d.extend_from_slice(&(blocks as u32).to_be_bytes());
        d.extend_from_slice(&[state, 0, 0, 0]);
    }
    Ok(data_in(d, alloc))
}

/// The provisioning status of the blocks from `lba` (at most `rest`):
/// how many share the state of the first one.
fn status_at(lu: &LogicalUnit, lba: u64, rest: u64) -> Result<(u64, u8), Sense> {
    let shift = lu.vol.block_shift();
    let offset = lba << shift;
    let len = (rest << shift).min(MAX_QUERY_BYTES);
    let e = lu
        .vol
        .backend()
        .allocation(offset, len)
        .map_err(|e| backend_error(&e, Asc::UNRECOVERED_READ_ERROR))?;
    let end = offset + e.len.clamp(1, len);
    if e.allocated {
        // A partly allocated last block is mapped.
        let blocks = ((end - offset) + (1 << shift) - 1) >> shift;
        return Ok((blocks.min(rest), MAPPED));
    }
    // Only whole blocks are deallocated; a partial one is mapped.
    let blocks = (end - offset) >> shift;
    if blocks == 0 {
        return Ok((1, MAPPED));
    }
    Ok((blocks, DEALLOCATED))
}
