//! Self-describing data for `--verify`.
//!
//! A write pass with `--verify` stamps every 512-byte sector it writes:
//!
//! ```text
//! bytes   0..8    magic "IRNSANv1"
//! bytes   8..16   sector number (byte offset / 512), little endian
//! bytes  16..24   run id, little endian
//! bytes  24..32   sequence number of the write, little endian
//! bytes  32..508  fill derived from (sector number, run id)
//! bytes 508..512  CRC32C of bytes 0..508, little endian
//! ```
//!
//! A read pass with `--verify` checks every sector it reads on its own,
//! whatever order the writes came in: the magic, that the sector number is
//! the one read (a block written at another LBA is caught), that the run id
//! is the expected one (a stale block from another run is caught), the fill
//! and the checksum. The first mismatch stops the run with a message naming
//! the LBA, the byte offset, what was expected and what was found.

use std::fmt::Write as _;

/// Bytes per stamped sector.
pub const SECTOR: usize = 512;
/// The magic at the start of every stamped sector.
pub const MAGIC: [u8; 8] = *b"IRNSANv1";
const FILL: std::ops::Range<usize> = 32..508;

/// A run id that is unlikely to repeat (time and process id).
pub fn new_run_id() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut r = crate::workload::Rng::new(
        (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 40) ^ 0x5eed,
    );
    r.next_u64()
}

fn fill(sector: u64, run_id: u64, out: &mut [u8]) {
    let mut r = crate::workload::Rng::new(sector.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ run_id);
    for chunk in out.chunks_mut(8) {
        let v = r.next_u64().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// Stamps `buf` (a multiple of 512 bytes) as written at byte `offset`.
pub fn stamp(buf: &mut [u8], offset: u64, run_id: u64, seq: u64) {
    for (i, s) in buf.chunks_exact_mut(SECTOR).enumerate() {
        let sector = offset / SECTOR as u64 + i as u64;
        s[0..8].copy_from_slice(&MAGIC);
        s[8..16].copy_from_slice(&sector.to_le_bytes());
        s[16..24].copy_from_slice(&run_id.to_le_bytes());
        s[24..32].copy_from_slice(&seq.to_le_bytes());
        fill(sector, run_id, &mut s[FILL]);
        let crc = iscsi_wire::digest::crc32c(&s[..508]);
        s[508..512].copy_from_slice(&crc.to_le_bytes());
    }
}

/// What the reader expects of the run id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunIdCheck {
    /// This exact id (`--verify-id`).
    Exact(u64),
    /// The id of the first block read; every later block must carry it.
    Learn(Option<u64>),
}

/// A verification failure, with everything needed to find the block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Byte offset of the sector on the target.
    pub offset: u64,
    /// Byte within the sector where the first difference is.
    pub byte: usize,
    pub what: String,
}

impl Mismatch {
    /// The message printed, naming the LBA in the target's block size.
    pub fn describe(&self, block_size: u32) -> String {
        let bs = u64::from(block_size.max(1));
        let at = self.offset + self.byte as u64;
        format!(
            "verify failed at LBA {} (block size {bs}, byte offset {at} of the target: \
             byte {} of the block, byte {} of the 512-byte sector at {}): {}",
            at / bs,
            at % bs,
            self.byte,
            self.offset,
            self.what
        )
    }
}

pub(crate) fn hex(b: &[u8]) -> String {
    let mut s = String::new();
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

fn le(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Checks `data` read at byte `offset`. `ids` is updated when learning.
pub fn check(data: &[u8], offset: u64, ids: &mut RunIdCheck) -> Result<(), Mismatch> {
    for (i, s) in data.chunks_exact(SECTOR).enumerate() {
        let off = offset + (i * SECTOR) as u64;
        check_sector(s, off, ids)?;
    }
    Ok(())
}

fn check_sector(s: &[u8], offset: u64, ids: &mut RunIdCheck) -> Result<(), Mismatch> {
    let sector = offset / SECTOR as u64;
    let bad = |byte: usize, what: String| Err(Mismatch { offset, byte, what });
    if s[0..8] != MAGIC {
        let byte = (0..8).find(|&i| s[i] != MAGIC[i]).unwrap_or(0);
        let what = if s.iter().all(|&b| b == 0) {
            "expected an ironsan verify pattern, found zeros (never written by a --verify \
             write pass?)"
                .to_string()
        } else {
            format!(
                "expected magic {} (\"IRNSANv1\"), found {} (not written by a --verify write \
                 pass, or overwritten)",
                hex(&MAGIC),
                hex(&s[0..8])
            )
        };
        return bad(byte, what);
    }
    let found_sector = le(&s[8..16]);
    let found_id = le(&s[16..24]);
    let seq = le(&s[24..32]);
    let crc = u32::from_le_bytes([s[508], s[509], s[510], s[511]]);
    let crc_ok = iscsi_wire::digest::crc32c(&s[..508]) == crc;
    if crc_ok && found_sector != sector {
        let byte = (8..16)
            .find(|&i| s[i] != sector.to_le_bytes()[i - 8])
            .unwrap_or(8);
        return bad(
            byte,
            format!(
                "expected the block of sector {sector}, found the block written for sector \
                 {found_sector} (byte offset {}): misplaced write",
                found_sector * SECTOR as u64
            ),
        );
    }
    let want_id = match ids {
        RunIdCheck::Exact(id) => Some(*id),
        RunIdCheck::Learn(id) => *id,
    };
    if crc_ok {
        match want_id {
            Some(id) if id != found_id => {
                let byte = (16..24)
                    .find(|&i| s[i] != id.to_le_bytes()[i - 16])
                    .unwrap_or(16);
                return bad(
                    byte,
                    format!(
                        "expected run id {id:#018x}, found run id {found_id:#018x} (sequence \
                         {seq}): a block from another run"
                    ),
                );
            }
            Some(_) => {}
            None => *ids = RunIdCheck::Learn(Some(found_id)),
        }
    }
    // Rebuild what should be there from the block's own header (or what we
    // know) and find the first differing byte.
    let mut want = [0u8; SECTOR];
    want[0..8].copy_from_slice(&MAGIC);
    want[8..16].copy_from_slice(&sector.to_le_bytes());
    let id = want_id.unwrap_or(found_id);
    want[16..24].copy_from_slice(&id.to_le_bytes());
    want[24..32].copy_from_slice(&seq.to_le_bytes());
    fill(sector, id, &mut want[FILL]);
    let wcrc = iscsi_wire::digest::crc32c(&want[..508]);
    want[508..512].copy_from_slice(&wcrc.to_le_bytes());
    if let Some(byte) = (0..SECTOR).find(|&i| s[i] != want[i]) {
        let field = match byte {
            0..=7 => "magic",
            8..=15 => "sector number",
            16..=23 => "run id",
            24..=31 => "sequence",
            508..=511 => "checksum",
            _ => "data",
        };
        let end = (byte + 8).min(if byte < 508 { 508 } else { SECTOR });
        return bad(
            byte,
            format!(
                "{field} corrupted (sequence {seq}, stored crc32c {crc:#010x}, computed \
                 {:#010x}): expected {} found {} at that byte",
                iscsi_wire::digest::crc32c(&s[..508]),
                hex(&want[byte..end]),
                hex(&s[byte..end])
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamped_blocks_check_and_damage_is_named() {
        let mut b = vec![0u8; 4096];
        stamp(&mut b, 8192, 77, 3);
        let mut ids = RunIdCheck::Learn(None);
        check(&b, 8192, &mut ids).unwrap();
        assert_eq!(ids, RunIdCheck::Learn(Some(77)));
        // Read at another offset: misplaced.
        let e = check(&b, 4096, &mut RunIdCheck::Exact(77)).unwrap_err();
        assert!(e.what.contains("misplaced"), "{e:?}");
        // Another run.
        let e = check(&b, 8192, &mut RunIdCheck::Exact(78)).unwrap_err();
        assert!(e.what.contains("another run"), "{e:?}");
        let e = check(&b, 8192, &mut RunIdCheck::Learn(Some(5))).unwrap_err();
        assert!(e.what.contains("another run"), "{e:?}");
        // One flipped byte in the data of the third sector.
        let mut d = b.clone();
        d[1024 + 100] ^= 0x40;
        let e = check(&d, 8192, &mut RunIdCheck::Exact(77)).unwrap_err();
        assert_eq!((e.offset, e.byte), (8192 + 1024, 100));
        let msg = e.describe(4096);
        assert!(
            msg.contains("LBA 2 ") && msg.contains("byte offset 9316"),
            "{msg}"
        );
        assert!(msg.contains("data corrupted"), "{msg}");
        // A damaged sequence number shows as such.
        let mut d = b.clone();
        d[25] ^= 1;
        let e = check(&d, 8192, &mut RunIdCheck::Exact(77)).unwrap_err();
        assert!(e.what.contains("checksum corrupted"), "{e:?}");
        // Zeros.
        let e = check(&[0u8; 512], 0, &mut RunIdCheck::Learn(None)).unwrap_err();
        assert!(e.what.contains("zeros"), "{e:?}");
    }
}
