//! PDU framing (RFC 7143 §11.2): a 48-byte basic header segment, optional
//! additional header segments, an optional header digest, a data segment
//! padded to four bytes and an optional data digest.
//!
//! [`frame_len`] checks a receive buffer for one complete PDU and bounds the
//! data segment length against [`FrameLimits`] before the caller reserves any
//! memory for it; [`split_pdu`] then cuts the PDU out without copying the
//! data segment.

use bytes::{Bytes, BytesMut};
use thiserror::Error;

use crate::digest::{crc32c_parts, pad_len};

/// Length of the basic header segment.
pub const BHS_LEN: usize = 48;

/// What the receiver of a PDU will accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLimits {
    /// A CRC32C header digest follows the header segments.
    pub header_digest: bool,
    /// A CRC32C data digest follows a non-empty data segment.
    pub data_digest: bool,
    /// Largest data segment accepted (our MaxRecvDataSegmentLength; before
    /// and during login, 8192 per RFC 7143 §13.12).
    pub max_data_segment: u32,
}

impl FrameLimits {
    /// Limits in force during login: no digests, 8 KiB data segments.
    pub const LOGIN: FrameLimits = FrameLimits {
        header_digest: false,
        data_digest: false,
        max_data_segment: 8192,
    };
}

/// A PDU that cannot be framed. All of these end the connection at
/// ErrorRecoveryLevel 0 except a data digest error, which
/// [`split_pdu`] reports in [`RawPdu::data_digest_ok`] instead.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    /// The data segment length exceeds what we declared we accept.
    #[error("data segment of {len} bytes exceeds the limit of {max}")]
    DataSegmentTooLong { len: u32, max: u32 },
    /// The header digest does not match: the header cannot be trusted, so
    /// neither can the framing of anything after it.
    #[error("header digest mismatch")]
    HeaderDigest,
}

/// One PDU cut out of the receive stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawPdu {
    /// The basic header segment.
    pub bhs: [u8; BHS_LEN],
    /// Additional header segments (without the header digest).
    pub ahs: Bytes,
    /// The data segment without padding or digest.
    pub data: Bytes,
    /// False when a data digest was negotiated and did not match.
    pub data_digest_ok: bool,
}

/// Data segment length field of a BHS (bytes 5..8).
pub fn data_segment_len(bhs: &[u8]) -> u32 {
    u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]])
}

/// Total AHS length in bytes (byte 4 counts four-byte words).
pub fn ahs_len(bhs: &[u8]) -> usize {
    usize::from(bhs[4]) * 4
}

/// Returns the length of the complete PDU at the start of `buf`, `Ok(None)`
/// when more bytes are needed, or an error when the header announces a PDU
/// that must not be accepted.
pub fn frame_len(buf: &[u8], lim: &FrameLimits) -> Result<Option<usize>, FrameError> {
    if buf.len() < BHS_LEN {
        return Ok(None);
    }
    let dlen = data_segment_len(buf);
    if dlen > lim.max_data_segment {
        return Err(FrameError::DataSegmentTooLong {
            len: dlen,
            max: lim.max_data_segment,
        });
    }
    let dlen = dlen as usize;
    let mut total = BHS_LEN + ahs_len(buf);
    if lim.header_digest {
        total += 4;
    }
    if dlen > 0 {
        total += dlen + pad_len(dlen);
        if lim.data_digest {
            total += 4;
        }
    }
    Ok((buf.len() >= total).then_some(total))
}

/// Splits the PDU of `len` bytes (as returned by [`frame_len`]) off the front
/// of `buf` and checks its digests.
pub fn split_pdu(buf: &mut BytesMut, len: usize, lim: &FrameLimits) -> Result<RawPdu, FrameError> {
    let whole = buf.split_to(len).freeze();
    let mut bhs = [0u8; BHS_LEN];
    bhs.copy_from_slice(&whole[..BHS_LEN]);
    let ahs_end = BHS_LEN + ahs_len(&bhs);
    let mut pos = ahs_end;
    if lim.header_digest {
        let want = u32::from_le_bytes(whole[pos..pos + 4].try_into().expect("4 bytes"));
        if crc32c_parts(&[&whole[..ahs_end]]) != want {
            return Err(FrameError::HeaderDigest);
        }
        pos += 4;
    }
    let dlen = data_segment_len(&bhs) as usize;
    let mut data_digest_ok = true;
    let data = if dlen > 0 {
        let padded = dlen + pad_len(dlen);
        if lim.data_digest {
            let at = pos + padded;
            let want = u32::from_le_bytes(whole[at..at + 4].try_into().expect("4 bytes"));
            data_digest_ok = crc32c_parts(&[&whole[pos..at]]) == want;
        }
        whole.slice(pos..pos + dlen)
    } else {
        Bytes::new()
    };
    Ok(RawPdu {
        bhs,
        ahs: whole.slice(BHS_LEN..ahs_end),
        data,
        data_digest_ok,
    })
}
