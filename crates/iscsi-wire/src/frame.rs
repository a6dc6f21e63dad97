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

use crate::digest::{crc32c_parts, pad_len, Crc32c};

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
#[derive(Debug)]
pub struct RawPdu {
    /// The basic header segment.
    pub bhs: [u8; BHS_LEN],
    /// Additional header segments (without the header digest).
    pub ahs: Bytes,
    /// The data segment without padding or digest.
    pub data: Bytes,
    /// False when a data digest was negotiated and did not match.
    pub data_digest_ok: bool,
    /// The data segment when the receiver read it straight into a buffer
    /// meant for it (see [`header_len`]) instead of into `data`, which is
    /// then empty: the segment is the last
    /// [`data_segment_len`] bytes of this buffer (or, for a write received
    /// in place, of this range of the medium).
    pub landed: Option<bufpool::LandBuf>,
}

impl RawPdu {
    /// Length of the data segment, wherever it was received.
    pub fn data_len(&self) -> usize {
        match &self.landed {
            Some(_) => data_segment_len(&self.bhs) as usize,
            None => self.data.len(),
        }
    }
}

/// Returns the length of the header segments (BHS, AHS and header digest)
/// of the PDU at the start of `buf` once they are all there, with the data
/// segment length bounded and the header digest checked as by
/// [`frame_len`] and [`split_pdu`]: a receiver may then read the data
/// segment elsewhere, and the rest with [`trailer_len`] and
/// [`trailer_digest_ok`].
pub fn header_len(buf: &[u8], lim: &FrameLimits) -> Result<Option<usize>, FrameError> {
    if buf.len() < BHS_LEN {
        return Ok(None);
    }
    checked_data_len(buf, lim)?;
    let ahs_end = BHS_LEN + ahs_len(buf);
    let total = ahs_end + if lim.header_digest { 4 } else { 0 };
    if buf.len() < total {
        return Ok(None);
    }
    if lim.header_digest {
        let want = u32::from_le_bytes(buf[ahs_end..total].try_into().expect("4 bytes"));
        if crc32c_parts(&[&buf[..ahs_end]]) != want {
            return Err(FrameError::HeaderDigest);
        }
    }
    Ok(Some(total))
}

/// Bytes after a data segment of `dlen` bytes: padding and data digest.
pub fn trailer_len(dlen: usize, lim: &FrameLimits) -> usize {
    if dlen == 0 {
        return 0;
    }
    pad_len(dlen) + if lim.data_digest { 4 } else { 0 }
}

/// Checks the data digest of a data segment of `dlen` bytes, all of which
/// `crc` has taken in (as they arrived), against its `trailer` (padding,
/// then the digest; [`trailer_len`] bytes with data digests on).
pub fn trailer_digest_ok(mut crc: Crc32c, dlen: usize, trailer: &[u8]) -> bool {
    let pad = pad_len(dlen);
    let Some(d) = trailer.get(pad..pad + 4) else {
        return false;
    };
    crc.update(&trailer[..pad]);
    crc.value().to_le_bytes() == d
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
    let dlen = checked_data_len(buf, lim)?;
    let header = BHS_LEN + ahs_len(buf) + if lim.header_digest { 4 } else { 0 };
    let total = header + dlen + trailer_len(dlen, lim);
    Ok((buf.len() >= total).then_some(total))
}

/// The data segment length of the BHS at the start of `buf`, refused when
/// over the negotiated limit (before anything is allocated for it).
fn checked_data_len(buf: &[u8], lim: &FrameLimits) -> Result<usize, FrameError> {
    let dlen = data_segment_len(buf);
    if dlen > lim.max_data_segment {
        return Err(FrameError::DataSegmentTooLong {
            len: dlen,
            max: lim.max_data_segment,
        });
    }
    Ok(dlen as usize)
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
        landed: None,
    })
}
