//! Receiving a large data segment straight into the buffer it is meant for
//! (docs/ARCHITECTURE.md: data lands where it is going): a target's Data-Out and
//! immediate data into its command's buffer, an initiator's Data-In into
//! its read's buffer.
//!
//! The receiver frames the header as usual ([`header_len`](crate::frame::header_len), which bounds
//! the data segment length first), asks its session for a buffer, and
//! [`Landing::start`]s: the header is cut off the receive buffer and what
//! part of the segment is already there is copied onto the buffer's end.
//! The rest is read from the socket into [`Landing::room`], exactly up to
//! the segment's end; padding and data digest come through the receive
//! buffer, and [`Landing::finish`] checks the digest over the bytes as
//! landed and hands the PDU over with its data in [`RawPdu::landed`].
//!
//! With data digests on, the CRC32C is folded in as the bytes arrive: each
//! call of [`Landing::room`] first takes in what the socket wrote since the
//! last one, while it is still in the cache, so `finish` only has the last
//! read's bytes and the padding left, not a second pass over the segment.

use bufpool::LandBuf;
use bytes::buf::Limit;
use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::digest::Crc32c;
use crate::frame::{
    ahs_len, data_segment_len, trailer_digest_ok, trailer_len, FrameLimits, RawPdu, BHS_LEN,
};

/// A PDU whose data segment is being received into a buffer of its own.
#[derive(Debug)]
pub struct Landing {
    bhs: [u8; BHS_LEN],
    ahs: Bytes,
    /// The buffer (or place on the medium); the segment goes onto its end.
    buf: LandBuf,
    /// Length of the data segment.
    len: usize,
    /// `buf`'s length once the whole segment is in.
    end: usize,
    /// Padding and data digest after the segment ([`trailer_len`]).
    trailer: usize,
    /// With data digests: the CRC32C of the segment's bytes up to
    /// `buf[..digested]`.
    digest: Option<Crc32c>,
    digested: usize,
}

impl Landing {
    /// Starts landing the PDU whose header, `hlen` bytes as [`header_len`]
    /// measured them, is at the front of `rbuf`, onto the end of `buf`
    /// (which gets room for the whole segment). A place on the medium
    /// ([`LandBuf::Placed`]) is never read in user space, so it takes no
    /// data digest: it is for segments without one.
    ///
    /// [`header_len`]: crate::frame::header_len
    pub fn start(
        rbuf: &mut BytesMut,
        hlen: usize,
        buf: impl Into<LandBuf>,
        lim: &FrameLimits,
    ) -> Self {
        let mut buf = buf.into();
        let bhs: [u8; BHS_LEN] = rbuf[..BHS_LEN].try_into().expect("a whole header");
        let len = data_segment_len(&bhs) as usize;
        let hdr = rbuf.split_to(hlen).freeze();
        buf.reserve(len);
        let start = buf.len();
        let end = start + len;
        let have = len.min(rbuf.len());
        buf.put_slice(&rbuf[..have]);
        rbuf.advance(have);
        Landing {
            ahs: hdr.slice(BHS_LEN..BHS_LEN + ahs_len(&bhs)),
            bhs,
            buf,
            len,
            end,
            trailer: trailer_len(len, lim),
            digest: (lim.data_digest && len > 0).then(Crc32c::new),
            digested: start,
        }
    }

    /// Takes what landed since the last call into the running digest.
    fn digest_landed(&mut self) {
        match (&mut self.digest, self.buf.user_bytes()) {
            (Some(c), Some(b)) if self.digested < b.len() => {
                c.update(&b[self.digested..]);
                self.digested = b.len();
            }
            _ => {}
        }
    }

    /// Bytes of the segment still to come from the socket.
    pub fn left(&self) -> usize {
        self.end - self.buf.len()
    }

    /// Bytes after the segment (padding, data digest) that the receive
    /// buffer must hold before [`Self::finish`].
    pub fn trailer(&self) -> usize {
        self.trailer
    }

    /// Where the next bytes of the segment go: the buffer's room, limited
    /// to what is left of the segment. What the last read put there is
    /// digested first.
    pub fn room(&mut self) -> Limit<&mut LandBuf> {
        self.digest_landed();
        let left = self.left();
        (&mut self.buf).limit(left)
    }

    /// The PDU, once the whole segment is in ([`Self::left`] is 0) and
    /// `rbuf` starts with its trailer, which is taken off it; the data
    /// digest is checked over the bytes as landed.
    pub fn finish(mut self, rbuf: &mut BytesMut, lim: &FrameLimits) -> RawPdu {
        debug_assert_eq!(self.left(), 0);
        debug_assert_eq!(self.digest.is_some(), lim.data_digest && self.len > 0);
        let t = rbuf.split_to(self.trailer);
        self.digest_landed();
        // A digest over a place that could not be read fails the PDU.
        let digest_whole = self.digested == self.end || self.len == 0;
        let data_digest_ok = self
            .digest
            .is_none_or(|c| digest_whole && trailer_digest_ok(c, self.len, &t));
        RawPdu {
            bhs: self.bhs,
            ahs: self.ahs,
            data: Bytes::new(),
            data_digest_ok,
            landed: Some(self.buf),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::crc32c;
    use crate::pdu::{DataIn, Itt, Lun, Residual, SnTriple};

    fn pdu(data: &[u8], lim: &FrameLimits) -> Vec<u8> {
        let bhs = DataIn {
            final_: false,
            ack: false,
            status: None,
            lun: Lun::default(),
            itt: Itt(7),
            ttt: 0xffff_ffff,
            sn: SnTriple::default(),
            data_sn: 0,
            buffer_offset: 0,
            residual: Residual::default(),
        }
        .encode(data.len());
        let mut v = bhs.to_vec();
        if lim.header_digest {
            v.extend_from_slice(&crc32c(&bhs).to_le_bytes());
        }
        v.extend_from_slice(data);
        let pad = crate::digest::pad_len(data.len());
        v.extend_from_slice(&[0; 4][..pad]);
        if lim.data_digest {
            let mut c = crate::digest::Crc32c::new();
            c.update(data);
            c.update(&[0; 4][..pad]);
            v.extend_from_slice(&c.value().to_le_bytes());
        }
        v
    }

    /// Lands the PDU `wire` (header `hlen` bytes) with `first` bytes after
    /// the header already received and the rest read in pieces of 9999
    /// bytes; whether its data digest held.
    fn land(wire: &[u8], hlen: usize, first: usize, lim: &FrameLimits) -> bool {
        let mut rbuf = BytesMut::from(&wire[..hlen + first]);
        let mut l = Landing::start(&mut rbuf, hlen, BytesMut::new(), lim);
        let mut at = hlen + first;
        while l.left() > 0 {
            let n = l.left().min(9999);
            l.room().put_slice(&wire[at..at + n]);
            at += n;
        }
        rbuf.extend_from_slice(&wire[at..]);
        l.finish(&mut rbuf, lim).data_digest_ok
    }

    #[test]
    fn lands_any_split_and_checks_the_digest() {
        let data: Vec<u8> = (0..70_001u32).map(|i| (i * 7) as u8).collect();
        for dd in [false, true] {
            let lim = FrameLimits {
                header_digest: true,
                data_digest: dd,
                max_data_segment: 1 << 20,
            };
            let wire = pdu(&data, &lim);
            let hlen = BHS_LEN + 4;
            // The receive buffer held the header and `first` bytes more.
            for first in [0, 1, 4096, data.len(), wire.len() - hlen] {
                let mut rbuf = BytesMut::from(&wire[..hlen + first]);
                let mut prefix = BytesMut::new();
                prefix.extend_from_slice(b"earlier");
                let mut l = Landing::start(&mut rbuf, hlen, prefix, &lim);
                let mut at = hlen + first.min(data.len());
                while l.left() > 0 {
                    let n = l.left().min(9999);
                    l.room().put_slice(&wire[at..at + n]);
                    at += n;
                }
                assert_eq!(l.room().remaining_mut(), 0, "never past the segment");
                // The trailer: what the receive buffer has of it, then the rest.
                let seg_end = hlen + data.len();
                let had = (hlen + first).saturating_sub(seg_end);
                rbuf.extend_from_slice(&wire[seg_end + had..]);
                assert_eq!(rbuf.len(), l.trailer());
                let raw = l.finish(&mut rbuf, &lim);
                let b = raw.landed.and_then(LandBuf::into_pooled).expect("landed");
                assert_eq!(&b[..7], b"earlier");
                assert!(b[7..] == data[..]);
                assert!(raw.data_digest_ok && rbuf.is_empty());
            }
            if dd {
                // A flipped byte fails the digest, wherever it is (in what
                // the receive buffer held, in the first, a middle or the
                // last piece read into the room, in the padding, in the
                // digest) and however the segment arrived.
                let seg_end = hlen + data.len();
                for flip in [
                    hlen + 5,
                    hlen + 5000,
                    hlen + 40_000,
                    seg_end - 1,
                    seg_end,
                    seg_end + 3,
                ] {
                    for first in [0, 4096, data.len()] {
                        let mut bad = wire.clone();
                        bad[flip] ^= 1;
                        assert!(
                            !land(&bad, hlen, first, &lim),
                            "flip at {flip}, first {first}"
                        );
                    }
                }
                let mut rbuf = BytesMut::from(&wire[..]);
                let l = Landing::start(&mut rbuf, hlen, BytesMut::new(), &lim);
                assert_eq!(l.left(), 0);
                assert!(l.finish(&mut rbuf, &lim).data_digest_ok);
            }
        }
    }
}
