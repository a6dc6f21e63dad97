//! Header and data digests (RFC 7143 §12.1): CRC32C over the BHS and AHS, and
//! over the data segment including its padding.
//!
//! The `crc-fast` crate folds the data with carry-less multiplication
//! (AVX-512 VPCLMULQDQ where the processor has it, else SSE/PCLMULQDQ):
//! about 5x what the SSE4.2 `crc32` instruction reaches on segments of
//! 64 KiB and more (`cargo bench -p iscsi-wire --bench codec`), which is
//! what keeps data digests on large transfers within reach of digests off.
//!
//! Where the data's 4 KiB blocks have known CRCs ([`BlockSums`], kept
//! beside a RAM LUN's chunks), [`crc32c_summed`] folds them into the
//! segment's CRC instead of reading the bytes: the CRC of a concatenation
//! is `crc(A ‖ B) = Z|B|(crc(A)) ⊕ crc(B)`, where `Zn` is the (linear)
//! effect of `n` zero bytes on the CRC register, and `Z4096` is applied by
//! four table look-ups.

use std::sync::LazyLock;

use crc_fast::{CrcAlgorithm, Digest};
use filemap::{BlockSums, FileSums, SUM_BLOCK, SUM_CHUNK};

/// CRC32C (Castagnoli, as iSCSI uses it) of `data`.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// A CRC32C computed over bytes given piece by piece.
#[derive(Clone, Copy, Debug)]
pub struct Crc32c(Digest);

impl Crc32c {
    /// The CRC32C of nothing so far.
    #[inline]
    pub fn new() -> Self {
        Crc32c(Digest::new(CrcAlgorithm::Crc32Iscsi))
    }

    /// Takes in the next bytes.
    #[inline]
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The CRC32C of all bytes taken in.
    #[inline]
    pub fn value(&self) -> u32 {
        self.0.finalize() as u32
    }
}

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

/// CRC32C of `parts` taken as one byte string.
pub fn crc32c_parts(parts: &[&[u8]]) -> u32 {
    match parts {
        [one] => crc32c(one),
        _ => {
            let mut c = Crc32c::new();
            for p in parts {
                c.update(p);
            }
            c.value()
        }
    }
}

/// The CRC32C of `A ‖ B` from `crc(A)`, `crc(B)` and `B`'s length.
#[inline]
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    crc_fast::checksum_combine(
        CrcAlgorithm::Crc32Iscsi,
        crc_a.into(),
        crc_b.into(),
        len_b as u64,
    ) as u32
}

/// CRC32C's reflected polynomial.
const POLY: u32 = 0x82f6_3b78;

/// `Z` over one zero byte: the register after a zero byte goes in.
const fn zero_byte(mut s: u32) -> u32 {
    let mut k = 0;
    while k < 8 {
        s = if s & 1 != 0 { (s >> 1) ^ POLY } else { s >> 1 };
        k += 1;
    }
    s
}

/// `Z4096` as four tables, one per byte of the register: linear, so the
/// image of a register is the XOR of its bytes' images.
static ZERO_BLOCK: LazyLock<[[u32; 256]; 4]> = LazyLock::new(|| {
    let mut bit = [0u32; 32];
    for (i, b) in bit.iter_mut().enumerate() {
        let mut s = 1u32 << i;
        for _ in 0..SUM_BLOCK {
            s = zero_byte(s);
        }
        *b = s;
    }
    let mut t = [[0u32; 256]; 4];
    for (k, table) in t.iter_mut().enumerate() {
        for (v, e) in table.iter_mut().enumerate() {
            *e = (0..8)
                .filter(|j| v & (1 << j) != 0)
                .fold(0, |acc, j| acc ^ bit[8 * k + j]);
        }
    }
    t
});

/// `crc(A ‖ B)` for a block `B` of [`SUM_BLOCK`] bytes.
#[inline]
fn append_block(t: &[[u32; 256]; 4], crc_a: u32, crc_b: u32) -> u32 {
    let [b0, b1, b2, b3] = crc_a.to_le_bytes();
    t[0][b0 as usize] ^ t[1][b1 as usize] ^ t[2][b2 as usize] ^ t[3][b3 as usize] ^ crc_b
}

/// CRC32C of `data`, a slice of the buffer `sums` describes: the whole
/// blocks it covers come from `sums` (computed and recorded when not yet
/// known, so the caller must hold `data`: see [`BlockSums`]), the bytes
/// around them are read. A slice of some other buffer is read whole.
pub fn crc32c_summed(data: &[u8], sums: &BlockSums) -> u32 {
    match sums.offset_of(data) {
        Some(at) => crc32c_summed_at(data, at, sums),
        None => crc32c(data),
    }
}

/// [`crc32c_summed`] of `data`, the bytes from `at` of the buffer `sums`
/// describes (which must hold them: `at + data.len()` within it).
fn crc32c_summed_at(data: &[u8], at: usize, sums: &BlockSums) -> u32 {
    let first = at.div_ceil(SUM_BLOCK);
    let end = ((at + data.len()) / SUM_BLOCK).min(sums.blocks());
    if first >= end {
        return crc32c(data);
    }
    let head = first * SUM_BLOCK - at;
    let t = &*ZERO_BLOCK;
    let mut crc = crc32c(&data[..head]);
    for i in first..end {
        let block = sums.get(i).unwrap_or_else(|| {
            let off = i * SUM_BLOCK - at;
            let v = crc32c(&data[off..off + SUM_BLOCK]);
            sums.set(i, v);
            v
        });
        crc = append_block(t, crc, block);
    }
    let tail = &data[end * SUM_BLOCK - at..];
    if tail.is_empty() {
        crc
    } else {
        crc32c_combine(crc, crc32c(tail), tail.len())
    }
}

/// CRC32C of `data`, the bytes of a file from `offset`, with its whole
/// blocks' CRCs taken from (or recorded in) the file's sums where
/// [`FileSums::prepare`] made room for them; the rest is read. The
/// caller must hold the file's writers off the range ([`FileSums`]).
///
/// Allocates nothing and takes no lock, so it may run over a file's
/// mapping under `filemap::FileRange::read_pinned`; the fold tables are
/// made on first use, so call [`prepare_folding`] before that.
pub fn crc32c_file_summed(data: &[u8], offset: u64, sums: &FileSums) -> u32 {
    let mut crc: Option<u32> = None;
    let mut done = 0;
    while done < data.len() {
        let at = offset + done as u64;
        let within = (at % SUM_CHUNK as u64) as usize;
        let n = (SUM_CHUNK - within).min(data.len() - done);
        let piece = &data[done..done + n];
        let c = match sums.chunk(at / SUM_CHUNK as u64) {
            Some(s) => crc32c_summed_at(piece, within, s),
            None => crc32c(piece),
        };
        crc = Some(crc.map_or(c, |a| crc32c_combine(a, c, n)));
        done += n;
    }
    crc.unwrap_or(0)
}

/// Makes the tables the folding functions use, which they would otherwise
/// make on first use (under a lock).
pub fn prepare_folding() {
    LazyLock::force(&ZERO_BLOCK);
}

/// The padding that brings `len` up to a multiple of four.
pub fn pad_len(len: usize) -> usize {
    (4 - (len & 3)) & 3
}

/// Zero bytes used as padding.
pub const PAD: [u8; 4] = [0; 4];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector() {
        // RFC 3720 B.4: 32 bytes of zeros -> CRC32C 0x8a9136aa.
        assert_eq!(crc32c_parts(&[&[0u8; 32]]), 0x8a91_36aa);
        // 32 bytes of 0xff -> 0x62a8ab43.
        assert_eq!(crc32c_parts(&[&[0xffu8; 16], &[0xffu8; 16]]), 0x62a8_ab43);
        // The check value of CRC-32/ISCSI.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(&[]), 0);
    }

    #[test]
    fn pieces_make_the_whole() {
        // Lengths around the folding widths (16, 64, 256 bytes) and odd
        // splits: the running CRC must equal the one-shot one.
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 31 + 7) as u8).collect();
        for len in [
            0, 1, 3, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1000, 4096, 5000,
        ] {
            let whole = crc32c(&data[..len]);
            for cut in [0, 1, len / 3, len / 2, len.saturating_sub(1), len] {
                let cut = cut.min(len);
                assert_eq!(crc32c_parts(&[&data[..cut], &data[cut..len]]), whole);
                let mut c = Crc32c::new();
                for piece in data[..len].chunks(cut.max(1)) {
                    c.update(piece);
                }
                assert_eq!(c.value(), whole, "len {len} pieces of {cut}");
            }
        }
    }

    #[test]
    fn combined_crcs_make_the_whole() {
        let data: Vec<u8> = (0..3 * SUM_BLOCK as u32)
            .map(|i| (i * 131 + 5) as u8)
            .collect();
        for cut in [0, 1, 100, SUM_BLOCK, data.len() - 3, data.len()] {
            let (a, b) = data.split_at(cut);
            assert_eq!(crc32c_combine(crc32c(a), crc32c(b), b.len()), crc32c(&data));
        }
        let (a, b) = data.split_at(SUM_BLOCK * 2);
        let t = &*ZERO_BLOCK;
        assert_eq!(
            append_block(t, crc32c(a), crc32c(&b[..SUM_BLOCK])),
            crc32c(&data)
        );
    }

    #[test]
    fn summed_crcs_match_reading_the_bytes() {
        let buf = bytes::Bytes::from(
            (0..8 * SUM_BLOCK as u32 + 300)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect::<Vec<u8>>(),
        );
        let sums = BlockSums::new(buf.as_ptr(), buf.len());
        let cases = [
            (0, buf.len()),
            (0, SUM_BLOCK),
            (SUM_BLOCK, 3 * SUM_BLOCK),
            (17, 5 * SUM_BLOCK),
            (SUM_BLOCK - 1, SUM_BLOCK + 2),
            (3 * SUM_BLOCK + 512, 2 * SUM_BLOCK - 1024),
            (100, 200),
            (8 * SUM_BLOCK - 5, 305),
        ];
        // Twice: computing the blocks, then folding what was recorded.
        for round in 0..2 {
            for (off, n) in cases {
                let s = &buf[off..off + n];
                assert_eq!(
                    crc32c_summed(s, &sums),
                    crc32c(s),
                    "round {round} {off}+{n}"
                );
            }
        }
        assert_eq!(sums.known(), 8);
        // A CRC recorded for a block is what is folded in: a wrong one
        // shows (so the test above cannot pass by reading the bytes).
        sums.set(2, sums.get(2).unwrap() ^ 1);
        assert_ne!(crc32c_summed(&buf[..], &sums), crc32c(&buf));
        // Some other buffer's bytes are read.
        let other = vec![9u8; 2 * SUM_BLOCK];
        assert_eq!(crc32c_summed(&other, &sums), crc32c(&other));
    }

    #[test]
    fn padding() {
        assert_eq!(pad_len(0), 0);
        assert_eq!(pad_len(1), 3);
        assert_eq!(pad_len(4), 0);
        assert_eq!(pad_len(4097), 3);
    }
}
