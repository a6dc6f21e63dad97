//! The receiving half of a connection driver, shared by the target's and
//! the initiator's connections: a PDU stream cut into PDUs (RFC 7143 §11,
//! framing by [`crate::frame`]) with large data segments received straight
//! into their place ([`crate::landing`]).
//!
//! Nothing here performs I/O: the driver owns the socket and hands
//! [`Receiver::read`] something that reads ([`ReadInto`]); the receiver
//! decides where the bytes go. Into the buffer of the data segment being
//! landed, exactly up to its end; else into the receive buffer, and right
//! after a landed segment only as much as completes its PDU and the next
//! header, so that the next large segment is not read into the receive
//! buffer only to be copied out of it.
//!
//! The receive buffer is never reallocated under the PDUs cut from it.
//! They are shared slices of it, and a write keeps its large Data-Out
//! segments as such slices until it has run, so the buffer may still be
//! pinned when it fills up. Then reading goes on in another buffer (one
//! retired earlier and free again, else a new one) and the pinned one is
//! retired, to be reused when its last slice is gone. Only the bytes of a
//! PDU not yet complete are copied over. In steady state nothing is
//! allocated.

use std::io;

use bufpool::LandBuf;
use bytes::{BufMut, BytesMut};

use crate::frame::{
    data_segment_len, frame_len, header_len, split_pdu, FrameError, FrameLimits, RawPdu, BHS_LEN,
};
use crate::landing::Landing;

/// What one read of the receive buffer aims to take.
const READ_CHUNK: usize = 256 * 1024;
/// Capacity of a new receive buffer.
const RECV_BUF: usize = 1 << 20;
/// Receive buffers kept while PDUs cut from them are still held.
const RETIRED_MAX: usize = 8;

/// Something that reads from the connection into the spare room of a
/// buffer, as `recv(2)` does: the driver's socket call. `Ok(0)` at end of
/// stream.
pub trait ReadInto {
    /// Reads into `buf`'s spare room and advances it by what came.
    fn read_into<B: BufMut>(&mut self, buf: &mut B) -> io::Result<usize>;
}

/// A connection's received bytes and the PDU being landed (module docs).
#[derive(Debug)]
pub struct Receiver {
    rbuf: BytesMut,
    retired: Vec<BytesMut>,
    /// The data segment being received straight into its buffer.
    landing: Option<Landing>,
    /// After a landed segment, the next read into the receive buffer takes
    /// only this many bytes (the next basic header and its digest; 0: no
    /// limit).
    header_first: usize,
}

impl Default for Receiver {
    fn default() -> Self {
        Self::new()
    }
}

impl Receiver {
    /// An empty receiver.
    pub fn new() -> Self {
        Receiver {
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            retired: Vec::new(),
            landing: None,
            header_first: 0,
        }
    }

    /// Reads once through `from` into the right place (module docs).
    /// `Ok(0)` at end of stream.
    pub fn read(&mut self, from: &mut impl ReadInto) -> io::Result<usize> {
        match &mut self.landing {
            Some(l) if l.left() > 0 => from.read_into(&mut l.room()),
            l => {
                let want = match l {
                    Some(l) => l.trailer() + self.header_first,
                    None => self.header_first,
                }
                .saturating_sub(self.rbuf.len());
                self.make_room();
                if want > 0 {
                    from.read_into(&mut (&mut self.rbuf).limit(want))
                } else {
                    from.read_into(&mut self.rbuf)
                }
            }
        }
    }

    /// The next complete PDU received, `Ok(None)` when more bytes are
    /// needed, `Err` when the stream cannot be framed (a header digest
    /// that does not match, a data segment past `lim`). A data segment of
    /// at least `land_min` bytes for which `land` gives a buffer (or a
    /// place on the medium) is received straight into it: the header is
    /// cut off the receive buffer, whatever part of the segment is already
    /// there is copied over, and [`Self::read`] reads the rest of it;
    /// padding and digest come through the receive buffer.
    pub fn next_pdu(
        &mut self,
        lim: &FrameLimits,
        land_min: usize,
        mut land: impl FnMut(&[u8; BHS_LEN]) -> Option<LandBuf>,
    ) -> Result<Option<RawPdu>, FrameError> {
        if let Some(l) = &self.landing {
            if l.left() > 0 || self.rbuf.len() < l.trailer() {
                return Ok(None);
            }
            let l = self.landing.take().expect("checked above");
            self.header_first = BHS_LEN + if lim.header_digest { 4 } else { 0 };
            return Ok(Some(l.finish(&mut self.rbuf, lim)));
        }
        let Some(hlen) = header_len(&self.rbuf, lim)? else {
            return Ok(None);
        };
        // Bounded by our MaxRecvDataSegmentLength (header_len checked it).
        if data_segment_len(&self.rbuf) as usize >= land_min {
            let bhs: [u8; BHS_LEN] = self.rbuf[..BHS_LEN].try_into().expect("a BHS");
            if let Some(buf) = land(&bhs) {
                self.landing = Some(Landing::start(&mut self.rbuf, hlen, buf, lim));
                return self.next_pdu(lim, land_min, land);
            }
        }
        let Some(len) = frame_len(&self.rbuf, lim)? else {
            return Ok(None);
        };
        self.header_first = 0;
        split_pdu(&mut self.rbuf, len, lim).map(Some)
    }

    /// Makes at least a quarter of [`READ_CHUNK`] free in the receive
    /// buffer without allocating in steady state (module docs).
    fn make_room(&mut self) {
        if self.rbuf.capacity() - self.rbuf.len() >= READ_CHUNK / 4 {
            return;
        }
        if self.rbuf.try_reclaim(READ_CHUNK) {
            return;
        }
        let mut next = match self
            .retired
            .iter_mut()
            .position(|b| b.try_reclaim(READ_CHUNK))
        {
            Some(i) => self.retired.swap_remove(i),
            None => BytesMut::with_capacity(RECV_BUF),
        };
        if next.capacity() - self.rbuf.len() < READ_CHUNK {
            next.reserve(self.rbuf.len() + READ_CHUNK);
        }
        next.extend_from_slice(&self.rbuf);
        let mut old = std::mem::replace(&mut self.rbuf, next);
        old.clear();
        if self.retired.len() == RETIRED_MAX {
            self.retired.remove(0);
        }
        self.retired.push(old);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads from a byte string in pieces of at most `step` bytes.
    struct Pieces<'a> {
        left: &'a [u8],
        step: usize,
    }

    impl ReadInto for Pieces<'_> {
        fn read_into<B: BufMut>(&mut self, buf: &mut B) -> io::Result<usize> {
            let n = self.left.len().min(self.step).min(buf.remaining_mut());
            buf.put_slice(&self.left[..n]);
            self.left = &self.left[n..];
            Ok(n)
        }
    }

    /// A SCSI Data-Out PDU (F bit set) carrying `data`.
    fn pdu(data: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; BHS_LEN];
        v[0] = 0x05;
        v[1] = 0x80;
        v[5..8].copy_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
        v.extend_from_slice(data);
        v.resize(v.len().next_multiple_of(4), 0);
        v
    }

    /// Every PDU comes out whole and in order, whatever the read sizes,
    /// with large segments landed in buffers of their own and small ones
    /// through the receive buffer.
    #[test]
    fn frames_and_lands_any_split() {
        let lim = FrameLimits {
            header_digest: false,
            data_digest: false,
            max_data_segment: 1 << 20,
        };
        let sizes = [5usize, 70_000, 0, 300_000, 17, 65_536];
        let mut stream = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            stream.extend(pdu(&vec![i as u8 + 1; n]));
        }
        for step in [1usize, 7, 4096, 100_000, usize::MAX] {
            let mut rx = Receiver::new();
            let mut from = Pieces {
                left: &stream,
                step,
            };
            let mut got = Vec::new();
            let mut landed = 0;
            while got.len() < sizes.len() {
                let next = rx
                    .next_pdu(&lim, 64 * 1024, |_| {
                        landed += 1;
                        Some(LandBuf::from(BytesMut::new()))
                    })
                    .unwrap();
                match next {
                    Some(p) => got.push(p),
                    None => assert!(rx.read(&mut from).unwrap() > 0, "step {step}: stalled"),
                }
            }
            assert_eq!(landed, 3, "step {step}");
            for (i, (p, &n)) in got.iter().zip(&sizes).enumerate() {
                let data = match &p.landed {
                    Some(LandBuf::Pooled(b)) => &b[..],
                    _ => &p.data[..],
                };
                assert_eq!(data.len(), n, "step {step}, PDU {i}");
                assert!(data.iter().all(|&b| b == i as u8 + 1));
            }
        }
    }
}
