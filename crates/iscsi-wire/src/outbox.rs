//! The send queue of one connection: PDUs laid out for a single vectored
//! write (DESIGN.md "batch everything").
//!
//! Headers, digests, padding and small data segments are copied into one
//! growing arena; large data segments are queued as reference-counted
//! [`Bytes`] without copying. [`Outbox::io_slices`] yields the pending bytes
//! as `IoSlice`s for one `writev`/`sendmsg`, and [`Outbox::advance`] drops
//! what the kernel took.

use std::collections::VecDeque;
use std::io::IoSlice;

use bufpool::Chain;
use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::digest::{crc32c_parts, pad_len, PAD};
use crate::frame::BHS_LEN;

/// Data segments up to this size are copied next to their header rather
/// than queued as a separate iovec.
const COPY_THRESHOLD: usize = 2048;

/// Largest number of iovecs handed to one vectored write.
pub const MAX_IOVECS: usize = 64;

/// Digest settings for PDUs sent on a connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// Padding and data digest that follow a data segment: up to 8 bytes.
fn trailer(data: &[u8], dg: Digests) -> ([u8; 8], usize) {
    trailer_of(std::iter::once(data), data.len(), dg)
}

/// [`trailer`] of a data segment of `len` bytes held in `parts`.
fn trailer_of<'a>(
    parts: impl Iterator<Item = &'a [u8]>,
    len: usize,
    dg: Digests,
) -> ([u8; 8], usize) {
    let mut t = [0u8; 8];
    if len == 0 {
        return (t, 0);
    }
    let pad = pad_len(len);
    let mut n = pad;
    if dg.data {
        let crc = parts.fold(crc32c::crc32c(&[]), crc32c::crc32c_append);
        let crc = crc32c::crc32c_append(crc, &PAD[..pad]);
        t[n..n + 4].copy_from_slice(&crc.to_le_bytes());
        n += 4;
    }
    (t, n)
}

/// Pending output of one connection.
#[derive(Debug, Default)]
pub struct Outbox {
    pending: BytesMut,
    queue: VecDeque<Bytes>,
    len: usize,
}

impl Outbox {
    /// An empty outbox.
    pub fn new() -> Self {
        Outbox {
            pending: BytesMut::with_capacity(64 * 1024),
            queue: VecDeque::new(),
            len: 0,
        }
    }

    /// Bytes waiting to be sent.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing waits to be sent.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues a PDU: `bhs` (whose data segment length field must already be
    /// `data.len()`), no AHS, and `data` as the data segment.
    pub fn push(&mut self, bhs: &[u8; BHS_LEN], data: &[u8], dg: Digests) {
        self.push_header(bhs, dg);
        self.pending.extend_from_slice(data);
        self.len += data.len();
        self.push_trailer(&[data], dg);
    }

    /// Queues a PDU whose data segment is shared, not copied, when large.
    pub fn push_bytes(&mut self, bhs: &[u8; BHS_LEN], data: Bytes, dg: Digests) {
        if data.len() <= COPY_THRESHOLD {
            return self.push(bhs, &data, dg);
        }
        self.push_header(bhs, dg);
        self.seal();
        self.len += data.len();
        // The trailer (padding, digest) is computed before the data is
        // queued, so the buffer is moved rather than shared a second time.
        let (t, n) = trailer(&data, dg);
        self.queue.push_back(data);
        self.pending.extend_from_slice(&t[..n]);
        self.len += n;
    }

    /// Queues a PDU whose data segment is `data`, segments shared rather
    /// than copied when large; the data digest runs over all of them.
    pub fn push_chain(&mut self, bhs: &[u8; BHS_LEN], data: Chain, dg: Digests) {
        let data = match data.into_single() {
            Ok(one) => return self.push_bytes(bhs, one, dg),
            Err(many) => many,
        };
        self.push_header(bhs, dg);
        self.seal();
        let len = data.len();
        let (t, n) = trailer_of(data.segments().map(|b| &b[..]), len, dg);
        let (first, rest) = data.into_parts();
        self.queue.push_back(first);
        self.queue.extend(rest);
        self.len += len;
        self.pending.extend_from_slice(&t[..n]);
        self.len += n;
    }

    fn push_header(&mut self, bhs: &[u8; BHS_LEN], dg: Digests) {
        let start = self.pending.len();
        self.pending.extend_from_slice(bhs);
        if dg.header {
            self.pending.put_u32_le(crc32c_parts(&[bhs]));
        }
        self.len += self.pending.len() - start;
    }

    fn push_trailer(&mut self, data: &[&[u8]], dg: Digests) {
        debug_assert_eq!(data.len(), 1);
        let (t, n) = trailer(data[0], dg);
        self.pending.extend_from_slice(&t[..n]);
        self.len += n;
    }

    /// Moves the arena's bytes into the queue so that later pushes come
    /// after them.
    fn seal(&mut self) {
        if !self.pending.is_empty() {
            self.queue.push_back(self.pending.split().freeze());
        }
    }

    /// Fills `out` with up to [`MAX_IOVECS`] slices of pending bytes, in
    /// order, and returns how many were filled.
    pub fn io_slices<'a>(&'a mut self, out: &mut [IoSlice<'a>; MAX_IOVECS]) -> usize {
        self.seal();
        let mut n = 0;
        for b in self.queue.iter().take(MAX_IOVECS) {
            out[n] = IoSlice::new(b);
            n += 1;
        }
        n
    }

    /// Drops the first `n` bytes, which have been written.
    pub fn advance(&mut self, mut n: usize) {
        // Bytes still in the arena count too (a caller may advance without
        // having asked for slices first).
        self.seal();
        self.len -= n;
        while n > 0 {
            let front = self.queue.front_mut().expect("advance beyond queued bytes");
            if front.len() <= n {
                n -= front.len();
                if let Some(done) = self.queue.pop_front() {
                    // Sent: a pooled read buffer goes back for reuse.
                    bufpool::give(done);
                }
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }

    /// Everything pending as one contiguous buffer (tests and diagnostics).
    pub fn to_vec(&mut self) -> Vec<u8> {
        self.seal();
        self.queue.iter().flat_map(|b| b.iter().copied()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chained_segments_match_one_buffer() {
        let whole: Vec<u8> = (0..9000u32).map(|i| (i * 7) as u8).collect();
        for dg in [
            Digests::default(),
            Digests {
                header: true,
                data: true,
            },
        ] {
            let mut bhs = [0u8; BHS_LEN];
            bhs[5..8].copy_from_slice(&[0, 0x23, 0x28]);
            let mut one = Outbox::new();
            one.push_bytes(&bhs, Bytes::from(whole.clone()), dg);
            let mut c = Chain::new();
            c.push(Bytes::copy_from_slice(&whole[..3001]));
            c.push(Bytes::copy_from_slice(&whole[3001..]));
            let mut two = Outbox::new();
            two.push_chain(&bhs, c, dg);
            assert_eq!(one.len(), two.len());
            assert_eq!(one.to_vec(), two.to_vec());
        }
    }

    #[test]
    fn copies_small_and_shares_large() {
        let mut o = Outbox::new();
        let mut bhs = [0u8; BHS_LEN];
        bhs[7] = 5;
        o.push(&bhs, b"hello", Digests::default());
        assert_eq!(o.len(), 48 + 8);
        let big = Bytes::from(vec![7u8; 4096]);
        bhs[5..8].copy_from_slice(&[0, 0x10, 0]);
        o.push_bytes(
            &bhs,
            big,
            Digests {
                header: true,
                data: true,
            },
        );
        assert_eq!(o.len(), 56 + 48 + 4 + 4096 + 4);
        let v = o.to_vec();
        assert_eq!(v.len(), o.len());
        let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
        let n = o.io_slices(&mut iov);
        let total: usize = iov[..n].iter().map(|s| s.len()).sum();
        assert_eq!(total, v.len());
        o.advance(100);
        assert_eq!(o.len(), v.len() - 100);
        assert_eq!(o.to_vec(), v[100..]);
    }
}
