//! Header and data digests (RFC 7143 §12.1): CRC32C over the BHS and AHS, and
//! over the data segment including its padding. The `crc32c` crate uses the
//! SSE4.2 instruction where the processor has it.

/// CRC32C of `parts` taken as one byte string.
pub fn crc32c_parts(parts: &[&[u8]]) -> u32 {
    parts.iter().fold(0, |crc, p| crc32c::crc32c_append(crc, p))
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
    }

    #[test]
    fn padding() {
        assert_eq!(pad_len(0), 0);
        assert_eq!(pad_len(1), 3);
        assert_eq!(pad_len(4), 0);
        assert_eq!(pad_len(4097), 3);
    }
}
