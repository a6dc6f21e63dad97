//! Header and data digests (RFC 7143 §12.1): CRC32C over the BHS and AHS, and
//! over the data segment including its padding.
//!
//! The `crc-fast` crate folds the data with carry-less multiplication
//! (AVX-512 VPCLMULQDQ where the processor has it, else SSE/PCLMULQDQ):
//! about 5x what the SSE4.2 `crc32` instruction reaches on segments of
//! 64 KiB and more (`cargo bench -p iscsi-wire --bench codec`), which is
//! what keeps data digests on large transfers within reach of digests off.

use crc_fast::{CrcAlgorithm, Digest};

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
    fn padding() {
        assert_eq!(pad_len(0), 0);
        assert_eq!(pad_len(1), 3);
        assert_eq!(pad_len(4), 0);
        assert_eq!(pad_len(4097), 3);
    }
}
