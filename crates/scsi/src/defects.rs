//! READ DEFECT DATA(10) and (12) (SBC-3 §5.18–5.19) for a medium without
//! defects: the requested primary (PLIST) and grown (GLIST) lists are
//! reported valid and empty, in the requested address descriptor format
//! (an empty list is the same in every format); the reserved format 111b
//! is INVALID FIELD IN CDB.

use crate::cdb::{be16, be32, op};
use crate::lu::{data_in, Outcome};
use crate::sense::Sense;

/// READ DEFECT DATA(10) (REQ_PLIST, REQ_GLIST and the format in byte 2) or
/// READ DEFECT DATA(12) (in byte 1; SBC-4 ADDRESS DESCRIPTOR INDEX in bytes
/// 2–5, past the end of an empty list whatever its value).
pub fn read_defect_data(cdb: &[u8]) -> Result<Outcome, Sense> {
    let twelve = cdb[0] == op::READ_DEFECT_DATA_12;
    let at = if twelve { 1 } else { 2 };
    let flags = cdb[at];
    let format = flags & 0x07;
    if format == 0x07 {
        return Err(Sense::invalid_cdb(at as u16, Some(2)));
    }
    // PLISTV and GLISTV: the lists asked for are valid (and empty).
    let b1 = flags & 0x1F;
    let (d, alloc) = if twelve {
        // Header: byte 1 flags, bytes 2-3 GENERATION CODE, 4-7 length.
        (vec![0, b1, 0, 0, 0, 0, 0, 0], be32(cdb, 6) as usize)
    } else {
        // Header: byte 1 flags, bytes 2-3 DEFECT LIST LENGTH.
        (vec![0, b1, 0, 0], usize::from(be16(cdb, 7)))
    };
    Ok(data_in(d, alloc))
}
