//! The send queue of one connection: PDUs laid out for a single vectored
//! write (docs/ARCHITECTURE.md "Batch everything").
//!
//! Headers, digests, padding and small data segments are copied into one
//! growing arena; large data segments are queued as reference-counted
//! [`Bytes`] without copying. [`Outbox::io_slices`] yields the pending bytes
//! as `IoSlice`s for one `writev`/`sendmsg`, and [`Outbox::advance`] drops
//! what the kernel took.
//!
//! A data segment may also be a range of a file ([`filemap::FileRange`], a
//! zero-copy read of a file LUN in memory). It is queued in its place in the
//! stream, never read here: [`Outbox::io_slices`] stops in front of it, and
//! once everything before it has gone, [`Outbox::front_file`] hands it to
//! the driver, which sends it with `sendfile(2)` and calls
//! [`Outbox::advance`] with what the kernel took, like after a `writev`;
//! the padding and the next PDUs follow in the arena. Queues without file
//! ranges work exactly as before.
//!
//! Under a data digest the digest must cover exactly the bytes that go
//! out, and it is computed here, when the PDU is queued. A mapped range
//! whose file has a write gate ([`filemap::WriteGate`]) is *pinned*: the
//! digest is computed over the file's pages in place, and the range is
//! sent from them like any mapped range; the pin guards the range (holds
//! the file's writers off it) while the digest is computed and again from
//! [`Outbox::io_slices`] to the [`Outbox::advance`] (or
//! [`Outbox::unguard`]) after the `writev`, so the kernel copies the very
//! bytes the digest covers. If the `writev` takes only part of the range,
//! the rest is copied (`pread`) before the pin stops guarding, so that the
//! two halves are always one version of the data. A write that touched a
//! range while it waited unguarded spoils its pin: the range is then read
//! afresh (`pread`) and its digest recomputed. Writers are thus held off
//! only for the length of a digest computation or a `writev`, never while
//! the connection waits for the network. The digest computed in place
//! records the CRCs of the range's 4 KiB blocks in the file's
//! [`filemap::FileSums`] (the guarding pin is what makes that sound), and
//! is folded from them the next time instead of read off every byte.
//! Any other range under a data digest is read into memory when queued.
//!
//! A file range that carries a mapping of its file ([`FileRange::with_map`])
//! is not held back: [`Outbox::io_slices`] yields its bytes in the mapping
//! like any other slice, for the kernel to copy in the same `writev` as
//! the headers around it. Those bytes are only ever handed to the kernel,
//! never read here (see [`filemap::FileMap`]).
//!
//! [`Outbox::write_to`] is the sending half every connection driver shares:
//! it does no I/O itself but hands the queue to the driver's socket calls
//! ([`WriteOut`]) in the order and the pieces described above.

use std::collections::VecDeque;
use std::io::{self, IoSlice};

use bufpool::Chain;
use bytes::{Buf, BufMut, Bytes, BytesMut};
/// The file range type [`WriteOut::send_file`] takes.
pub use filemap::FileRange;
use filemap::Pin;

use crate::digest::{
    crc32c, crc32c_combine, crc32c_file_summed, crc32c_parts, crc32c_summed, pad_len,
    prepare_folding, Crc32c, PAD,
};
use crate::frame::BHS_LEN;

/// The socket calls [`Outbox::write_to`] sends through: the driver's.
pub trait WriteOut {
    /// One vectored write (`writev`/`sendmsg`); `more`: more data follows
    /// at once (`MSG_MORE`). `Ok(0)` only if nothing could be written.
    fn write_vectored(&mut self, iov: &[IoSlice<'_>], more: bool) -> io::Result<usize>;

    /// Sends what the socket takes of `r` from the page cache
    /// (`sendfile(2)`); `Ok(0)` when the file ended before the range did.
    /// A driver whose queue never holds file ranges may refuse.
    fn send_file(&mut self, r: &FileRange) -> io::Result<usize>;
}

/// Data segments up to this size are copied next to their header rather
/// than queued as a separate iovec.
const COPY_THRESHOLD: usize = 2048;

/// Mapped ranges under a data digest from this size fold it from the
/// file's block CRCs ([`filemap::FileSums`]); shorter ones are read whole.
/// Looking the sums up costs a `statx(2)` (500 ns here, the CRC of about
/// 20 KiB at 106 ns per 4 KiB), and a short range has few blocks to save.
const FILE_SUMS_MIN: usize = 64 * 1024;

/// Largest number of iovecs handed to one vectored write.
pub const MAX_IOVECS: usize = 64;

/// Digest settings for PDUs sent on a connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// Data digests only (the trailer of a data segment does not depend on the
/// header digest).
const DATA_DIGEST: Digests = Digests {
    header: false,
    data: true,
};

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
    if len == 0 {
        return ([0u8; 8], 0);
    }
    if !dg.data {
        return ([0u8; 8], pad_len(len));
    }
    let mut crc = Crc32c::new();
    parts.for_each(|p| crc.update(p));
    crc.update(&PAD[..pad_len(len)]);
    tail(len, crc.value())
}

/// The padding and data digest (`crc`, over the data and the padding)
/// after a data segment of `len` bytes.
fn tail(len: usize, crc: u32) -> ([u8; 8], usize) {
    let mut t = [0u8; 8];
    let pad = pad_len(len);
    t[pad..pad + 4].copy_from_slice(&crc.to_le_bytes());
    (t, pad + 4)
}

/// The data digest of `r` (and its padding) computed over the file's
/// mapping, which `pin` guards; `None` when the file was cut short. The
/// whole blocks' CRCs come from the file's sums where known, and are
/// recorded there where not ([`filemap::FileSums`]: the pin is what makes
/// recording them sound).
fn digest_in_place(r: &FileRange, pin: &Pin) -> Option<u32> {
    let mut crc = 0;
    let sums = if r.len() >= FILE_SUMS_MIN {
        r.sums()
    } else {
        None
    };
    let ok = match sums {
        Some(sums) => {
            // Everything the fold needs is made before the bytes are read.
            sums.prepare(r.offset(), r.len() as u64);
            prepare_folding();
            let at = r.offset();
            // SAFETY: the closure folds bytes and block CRCs (atomics in
            // tables `prepare` made) into a value on the stack: it owns
            // nothing that needs dropping, allocates nothing, takes no
            // lock, and does not panic, so a fault may skip its frames.
            unsafe { r.read_pinned(pin, &mut |b| crc = crc32c_file_summed(b, at, sums)) }
        }
        None => {
            let mut c = Crc32c::new();
            // SAFETY: as above; the closure only updates a CRC state.
            let ok = unsafe { r.read_pinned(pin, &mut |b| c.update(b)) };
            crc = c.value();
            ok
        }
    };
    ok.then(|| padded(crc, r.len()))
}

/// The data digest of a segment of `len` bytes whose CRC is `crc`: the
/// CRC with the segment's padding appended.
fn padded(crc: u32, len: usize) -> u32 {
    match pad_len(len) {
        0 => crc,
        pad => crc32c_combine(crc, crc32c(&PAD[..pad]), pad),
    }
}

/// The data digest of `data` (and its padding), folded from the block
/// CRCs its segments carry ([`filemap::BlockSums`]) where they do.
fn summed_digest(data: &Chain) -> u32 {
    let mut crc = None;
    for (b, sums) in data.summed_segments() {
        let c = match sums {
            Some(s) => crc32c_summed(b, s),
            None => crc32c(b),
        };
        crc = Some(crc.map_or(c, |a| crc32c_combine(a, c, b.len())));
    }
    padded(crc.unwrap_or(0), data.len())
}

/// One queued piece of the stream.
#[derive(Debug)]
enum Seg {
    Mem(Bytes),
    File(FileRange),
    /// A mapped range whose data digest was computed in place, with the
    /// pin that keeps it true (module docs). None of it has been written:
    /// once part has, the rest is copied.
    Pinned {
        r: FileRange,
        pin: Pin,
    },
    /// The padding and data digest after a [`Seg::Pinned`], from byte `at`
    /// (kept apart so that the digest can be recomputed).
    Tail {
        t: [u8; 8],
        at: u8,
        n: u8,
    },
}

impl Seg {
    fn len(&self) -> usize {
        match self {
            Seg::Mem(b) => b.len(),
            Seg::File(r) | Seg::Pinned { r, .. } => r.len(),
            Seg::Tail { at, n, .. } => usize::from(n - at),
        }
    }
}

/// Pending output of one connection.
#[derive(Debug, Default)]
pub struct Outbox {
    pending: BytesMut,
    queue: VecDeque<Seg>,
    len: usize,
    /// File ranges in `queue` that go by `sendfile` (not mapped).
    files: usize,
    /// A data segment could not be read when queued: the stream is wrong
    /// from there on.
    broken: bool,
    /// Pins in the queue's first [`MAX_IOVECS`] segments may be guarding
    /// (from [`Self::io_slices`] to [`Self::advance`] or [`Self::unguard`]).
    guarding: bool,
    /// [`Seg::Pinned`] segments in `queue`: without any, a flush does not
    /// look for pins.
    pinned: usize,
}

impl Outbox {
    /// An empty outbox.
    pub fn new() -> Self {
        Outbox {
            pending: BytesMut::with_capacity(64 * 1024),
            queue: VecDeque::new(),
            len: 0,
            files: 0,
            broken: false,
            guarding: false,
            pinned: 0,
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
        self.queue.push_back(Seg::Mem(data));
        self.pending.extend_from_slice(&t[..n]);
        self.len += n;
    }

    /// Queues a PDU whose data segment is `data`, segments shared rather
    /// than copied when large; the data digest runs over all of them.
    pub fn push_chain(&mut self, bhs: &[u8; BHS_LEN], data: Chain, dg: Digests) {
        let data = match data.into_file() {
            Ok(r) => return self.push_file(bhs, r, dg),
            Err(data) => data,
        };
        // Segments that carry their buffers' block CRCs (a RAM LUN's
        // chunks) have their digest folded from those, not read.
        let summed = dg.data && data.is_summed() && data.len() > COPY_THRESHOLD;
        let data = if summed {
            data
        } else {
            match data.into_single() {
                Ok(one) => return self.push_bytes(bhs, one, dg),
                Err(many) => many,
            }
        };
        self.push_header(bhs, dg);
        self.seal();
        let len = data.len();
        let (t, n) = if summed {
            tail(len, summed_digest(&data))
        } else {
            trailer_of(data.segments().map(|b| &b[..]), len, dg)
        };
        let (first, rest) = data.into_parts();
        self.queue.push_back(Seg::Mem(first));
        self.queue.extend(rest.into_iter().map(Seg::Mem));
        self.len += len;
        self.pending.extend_from_slice(&t[..n]);
        self.len += n;
    }

    /// Queues a PDU whose data segment is the file range `r`, to be sent
    /// by the driver from the file ([`Self::front_file`]). Small ranges,
    /// and any range under a data digest, are read now and queued as bytes;
    /// if that read fails (the file shrank) the outbox is
    /// [broken](Self::is_broken).
    pub fn push_file(&mut self, bhs: &[u8; BHS_LEN], r: FileRange, dg: Digests) {
        if dg.data && r.len() > COPY_THRESHOLD {
            if let Some(pin) = r.pin() {
                return self.push_pinned(bhs, r, pin, dg);
            }
        }
        if dg.data || r.len() <= COPY_THRESHOLD {
            match r.read(bufpool::take(r.len())) {
                Ok(b) => self.push_bytes(bhs, b, dg),
                Err(_) => self.broken = true,
            }
            return;
        }
        self.push_header(bhs, dg);
        self.seal();
        let pad = pad_len(r.len());
        self.len += r.len() + pad;
        self.files += usize::from(!r.is_mapped());
        self.queue.push_back(Seg::File(r));
        self.pending.extend_from_slice(&PAD[..pad]);
    }

    /// [`Self::push_file`] of a mapped range under a data digest, with `pin`
    /// guarding it: the digest is computed over the mapping (module docs).
    fn push_pinned(&mut self, bhs: &[u8; BHS_LEN], r: FileRange, mut pin: Pin, dg: Digests) {
        let crc = digest_in_place(&r, &pin);
        pin.unguard();
        let Some(crc) = crc else {
            // The file was cut short under the mapping.
            self.broken = true;
            return;
        };
        self.push_header(bhs, dg);
        self.seal();
        let (t, n) = tail(r.len(), crc);
        self.len += r.len() + n;
        self.queue.push_back(Seg::Pinned { r, pin });
        self.queue.push_back(Seg::Tail {
            t,
            at: 0,
            n: n as u8,
        });
        self.pinned += 1;
    }

    /// Guards the pins among the first [`MAX_IOVECS`] segments, up to the
    /// first unmapped file range; a spoiled one is read afresh (none of it
    /// has gone). Returns how many segments may be written: fewer when that
    /// read fails (the file was cut short), which breaks the outbox.
    fn guard_pins(&mut self) -> usize {
        let end = self.queue.len().min(MAX_IOVECS);
        if self.pinned == 0 {
            return end;
        }
        for i in 0..end {
            let (r, pin) = match &mut self.queue[i] {
                Seg::File(r) if !r.is_mapped() => return i,
                Seg::Pinned { r, pin } => (r, pin),
                _ => continue,
            };
            self.guarding = true;
            if pin.guard() {
                continue;
            }
            // Spoiled while queued: send a copy, with its digest.
            let Ok(b) = r.read(bufpool::take(r.len())) else {
                self.broken = true;
                return i;
            };
            let (t, n) = trailer(&b, DATA_DIGEST);
            self.queue[i] = Seg::Mem(b);
            self.pinned -= 1;
            if let Some(Seg::Tail { t: old, n: on, .. }) = self.queue.get_mut(i + 1) {
                (*old, *on) = (t, n as u8);
            }
        }
        end
    }

    /// Lets the file writers held off by [`Self::io_slices`] go: call it
    /// after a write that failed or took nothing ([`Self::advance`] does it
    /// otherwise). Pins must never guard while the connection waits for the
    /// network.
    pub fn unguard(&mut self) {
        if !std::mem::take(&mut self.guarding) {
            return;
        }
        for seg in self.queue.iter_mut().take(MAX_IOVECS) {
            if let Seg::Pinned { pin, .. } = seg {
                pin.unguard();
            }
        }
    }

    /// True when a data segment could not be read as it was queued: what
    /// is queued is not the stream the peer was promised, and the
    /// connection must be closed.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// True when a file range waits in the queue: a write of the slices
    /// in front of it may tell the kernel more follows (`MSG_MORE`).
    pub fn has_file(&self) -> bool {
        self.files > 0
    }

    /// The file range to send next with `sendfile`, when everything queued
    /// before it has gone (then [`Self::io_slices`] yields nothing). Mapped
    /// ranges are never returned: [`Self::io_slices`] yields them.
    pub fn front_file(&mut self) -> Option<&FileRange> {
        self.seal();
        match self.queue.front() {
            Some(Seg::File(r)) if !r.is_mapped() => Some(r),
            _ => None,
        }
    }

    /// Queues a PDU of another transport laid out by its caller: `header`
    /// (every byte up to the data, digest and padding included), `data`
    /// (shared, not copied, when large; file ranges are read) and
    /// `trailer` (the data digest, if any). The NVMe/TCP driver's send
    /// queue: its PDUs have their own header and digest rules
    /// (`nvme_tcp_wire::Layout`), and no iSCSI padding.
    pub fn push_raw(&mut self, header: &[u8], data: Chain, trailer: &[u8]) {
        self.pending.extend_from_slice(header);
        self.len += header.len();
        let data = match data.into_file() {
            Ok(r) => match r.read(bufpool::take(r.len())) {
                Ok(b) => Chain::from(b),
                Err(_) => {
                    self.broken = true;
                    return;
                }
            },
            Err(data) => data,
        };
        self.len += data.len();
        if data.len() <= COPY_THRESHOLD {
            for s in data.segments() {
                self.pending.extend_from_slice(s);
            }
        } else {
            self.seal();
            let (first, rest) = data.into_parts();
            self.queue.push_back(Seg::Mem(first));
            self.queue.extend(rest.into_iter().map(Seg::Mem));
        }
        self.pending.extend_from_slice(trailer);
        self.len += trailer.len();
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
            self.queue
                .push_back(Seg::Mem(self.pending.split().freeze()));
        }
    }

    /// Fills `out` with up to [`MAX_IOVECS`] slices of pending bytes, in
    /// order, up to the first file range that is not mapped, and returns
    /// how many were filled. The slices are for the kernel only: those of a
    /// mapped range must not be read in user space. Pinned ranges among
    /// them guard until [`Self::advance`] or [`Self::unguard`], which the
    /// caller must call after its write whatever its outcome.
    pub fn io_slices<'a>(&'a mut self, out: &mut [IoSlice<'a>; MAX_IOVECS]) -> usize {
        self.seal();
        let end = self.guard_pins();
        let mut n = 0;
        for seg in self.queue.iter().take(end) {
            let b = match seg {
                Seg::Mem(b) => &b[..],
                Seg::Tail { t, at, n } => &t[usize::from(*at)..usize::from(*n)],
                // SAFETY: these slices go to the kernel (the contract
                // above), which refuses pages a shrunk file no longer has.
                Seg::File(r) | Seg::Pinned { r, .. } => match unsafe { r.kernel_bytes() } {
                    Some(b) => b,
                    None => break,
                },
            };
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
                match self.queue.pop_front() {
                    // Sent: a pooled read buffer goes back for reuse.
                    Some(Seg::Mem(done)) => bufpool::give(done),
                    Some(Seg::File(r)) => self.files -= usize::from(!r.is_mapped()),
                    Some(Seg::Pinned { .. }) => self.pinned -= 1,
                    _ => {}
                }
            } else {
                match front {
                    Seg::Mem(b) => b.advance(n),
                    Seg::File(r) => r.advance(n),
                    Seg::Pinned { r, pin, .. } => {
                        // Half sent: the rest is copied now, while the pin
                        // still guards it, so that no write can come
                        // between the two halves (module docs).
                        r.advance(n);
                        debug_assert!(pin.is_guarding());
                        match r.read(bufpool::take(r.len())) {
                            Ok(b) => {
                                *front = Seg::Mem(b);
                                self.pinned -= 1;
                            }
                            Err(_) => self.broken = true,
                        }
                    }
                    Seg::Tail { at, .. } => *at += n as u8,
                }
                n = 0;
            }
        }
        self.unguard();
    }

    /// Writes what `to` takes without waiting: `Ok(true)` when the queue
    /// is empty, `Ok(false)` when the socket would block.
    ///
    /// A file range without a mapping goes by [`WriteOut::send_file`] once
    /// everything before it has been written, and the `writev` in front of
    /// it says more follows at once ([`WriteOut::write_vectored`] with
    /// `more`), so that a header is not sent in a packet of its own. A
    /// range that ends early (the file shrank after its status was queued
    /// ahead of it: `sendfile` stops short, the `writev` of its mapping fails
    /// with `EFAULT`) is an error that must close the connection: short or
    /// made-up data must never go out under GOOD status.
    pub fn write_to(&mut self, to: &mut impl WriteOut) -> io::Result<bool> {
        loop {
            if self.is_broken() {
                return Err(io::Error::other(
                    "a read's file shrank, or was written while half sent under a data digest",
                ));
            }
            if self.is_empty() {
                return Ok(true);
            }
            if let Some(r) = self.front_file() {
                match to.send_file(r) {
                    Ok(0) => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "a read's file shrank before it was sent",
                        ))
                    }
                    Ok(w) => self.advance(w),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
                continue;
            }
            let more = self.has_file();
            let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
            let n = self.io_slices(&mut iov);
            let r = to.write_vectored(&iov[..n], more);
            if !matches!(r, Ok(w) if w > 0) {
                // Writers held off for the write must not wait for the
                // network (advance does this after a write that took some).
                self.unguard();
            }
            match r {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(w) => self.advance(w),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                    return Err(io::Error::other(
                        "a read's file shrank before it was sent (mapped pages refused)",
                    ))
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Everything pending as one contiguous buffer (tests and diagnostics).
    pub fn to_vec(&mut self) -> Vec<u8> {
        self.seal();
        let mut v = Vec::with_capacity(self.len);
        for seg in &self.queue {
            match seg {
                Seg::Mem(b) => v.extend_from_slice(b),
                Seg::Tail { t, at, n } => {
                    v.extend_from_slice(&t[usize::from(*at)..usize::from(*n)])
                }
                Seg::File(r) | Seg::Pinned { r, .. } => {
                    v.extend_from_slice(&r.read(bufpool::take(r.len())).unwrap_or_default())
                }
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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
    fn summed_segments_carry_the_digest_of_their_bytes() {
        use filemap::{BlockSums, SUM_BLOCK};
        let dg = Digests {
            header: true,
            data: true,
        };
        let buf = Bytes::from(
            (0..9 * SUM_BLOCK as u32)
                .map(|i| (i * 13) as u8)
                .collect::<Vec<u8>>(),
        );
        let other = Bytes::from(vec![7u8; 5000]);
        let sums = Arc::new(BlockSums::new(buf.as_ptr(), buf.len()));
        // One segment; two (the second unsummed); odd lengths (padding).
        let cases: [&[(Bytes, bool)]; 3] = [
            &[(buf.slice(..), true)],
            &[
                (buf.slice(SUM_BLOCK - 3..8 * SUM_BLOCK), true),
                (other.slice(..), false),
            ],
            &[
                (other.slice(..4001), false),
                (buf.slice(5..2 * SUM_BLOCK + 2), true),
            ],
        ];
        for case in cases {
            let mut bhs = [0u8; BHS_LEN];
            let len: usize = case.iter().map(|(b, _)| b.len()).sum();
            bhs[5..8].copy_from_slice(&(len as u32).to_be_bytes()[1..]);
            let mut plain = Outbox::new();
            plain.push(
                &bhs,
                &case
                    .iter()
                    .flat_map(|(b, _)| b.to_vec())
                    .collect::<Vec<u8>>(),
                dg,
            );
            let chain = |sums: &Arc<BlockSums>| {
                let mut c = Chain::new();
                for (b, summed) in case {
                    c.push_summed(b.clone(), summed.then(|| sums.clone()));
                }
                c
            };
            // Twice: the blocks computed and recorded, then folded.
            for _ in 0..2 {
                let mut o = Outbox::new();
                o.push_chain(&bhs, chain(&sums), dg);
                assert_eq!(o.to_vec(), plain.to_vec());
            }
            // The recorded CRCs are what the digest is made of.
            let wrong = Arc::new(BlockSums::new(buf.as_ptr(), buf.len()));
            (0..wrong.blocks()).for_each(|i| wrong.set(i, 0));
            let mut o = Outbox::new();
            o.push_chain(&bhs, chain(&wrong), dg);
            assert_ne!(o.to_vec(), plain.to_vec());
        }
    }

    fn temp_file(data: &[u8]) -> std::sync::Arc<std::fs::File> {
        use std::io::Write;
        let p = std::env::temp_dir().join(format!(
            "outbox-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        let _ = std::fs::remove_file(&p);
        f.write_all(data).unwrap();
        std::sync::Arc::new(f)
    }

    /// The 70001-byte `whole` between two small PDUs, from memory.
    fn around(whole: &[u8], dg: Digests) -> Outbox {
        let mut bhs = [0u8; BHS_LEN];
        bhs[5..8].copy_from_slice(&[0x01, 0x11, 0x71]); // 70001
        let mut want = Outbox::new();
        want.push(&bhs, b"before", dg);
        want.push_bytes(&bhs, Bytes::copy_from_slice(whole), dg);
        want.push(&bhs, b"after", dg);
        want
    }

    /// A 70001-byte data segment between two small PDUs: the stream as it
    /// must go out (the segment in memory) and an outbox with the segment
    /// queued as the range `r` of a file holding it.
    fn around_a_range(whole: &[u8], r: FileRange, dg: Digests) -> (Vec<u8>, Outbox) {
        let mut bhs = [0u8; BHS_LEN];
        bhs[5..8].copy_from_slice(&[0x01, 0x11, 0x71]); // 70001
        let mut want = around(whole, dg);
        let mut got = Outbox::new();
        got.push(&bhs, b"before", dg);
        got.push_chain(&bhs, Chain::from_file(r), dg);
        got.push(&bhs, b"after", dg);
        assert_eq!(got.len(), want.len());
        (want.to_vec(), got)
    }

    /// A socket that takes a few bytes a call, says "would block" every
    /// third call, and sends file ranges in short pieces.
    struct Trickle {
        sent: Vec<u8>,
        calls: usize,
        more_before_file: usize,
    }

    impl WriteOut for Trickle {
        fn write_vectored(&mut self, iov: &[IoSlice<'_>], more: bool) -> io::Result<usize> {
            self.calls += 1;
            if self.calls.is_multiple_of(3) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.more_before_file += usize::from(more);
            let k = iov[0].len().min(13);
            self.sent.extend_from_slice(&iov[0][..k]);
            Ok(k)
        }

        fn send_file(&mut self, r: &FileRange) -> io::Result<usize> {
            self.calls += 1;
            if self.calls.is_multiple_of(3) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let piece = r.slice(0, r.len().min(9999)).read(BytesMut::new())?;
            self.sent.extend_from_slice(&piece);
            Ok(piece.len())
        }
    }

    #[test]
    fn write_to_sends_the_stream_in_order_through_the_drivers_calls() {
        let whole: Vec<u8> = (0..70001u32).map(|i| (i * 7) as u8).collect();
        let file = temp_file(&whole);
        let r = FileRange::new(file, 0, whole.len()).unwrap();
        let (expect, mut got) = around_a_range(&whole, r, Digests::default());
        let mut to = Trickle {
            sent: Vec::new(),
            calls: 0,
            more_before_file: 0,
        };
        let mut blocked = 0;
        while !got.write_to(&mut to).unwrap() {
            blocked += 1;
        }
        assert_eq!(to.sent, expect);
        assert!(blocked > 0 && got.is_empty());
        assert!(
            to.more_before_file > 0,
            "the bytes before the range say more follows"
        );
    }

    #[test]
    fn file_ranges_keep_their_place_in_the_stream() {
        let whole: Vec<u8> = (0..70001u32).map(|i| (i * 11) as u8).collect();
        let file = temp_file(&whole);
        for dg in [
            Digests::default(),
            Digests {
                header: true,
                data: false,
            },
            Digests {
                header: true,
                data: true,
            },
        ] {
            let r = FileRange::new(file.clone(), 0, whole.len()).unwrap();
            let (expect, mut got) = around_a_range(&whole, r, dg);
            assert_eq!(got.has_file(), !dg.data, "a data digest reads the range");
            assert_eq!(got.to_vec(), expect);
            // Drain as a driver would: slices up to the range, then the
            // range in odd pieces (short sendfile), then the rest.
            let mut sent = Vec::new();
            while !got.is_empty() {
                if let Some(r) = got.front_file() {
                    let piece = r
                        .slice(0, r.len().min(9999))
                        .read(bytes::BytesMut::new())
                        .unwrap();
                    sent.extend_from_slice(&piece);
                    got.advance(piece.len());
                    continue;
                }
                let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
                let n = got.io_slices(&mut iov);
                assert!(n > 0);
                // Partial writes: at most 7 bytes of the first slice.
                let k = iov[0].len().min(7);
                sent.extend_from_slice(&iov[0][..k]);
                got.advance(k);
            }
            assert_eq!(sent, expect);
            assert!(!got.has_file() && !got.is_broken());
        }
    }

    #[test]
    fn mapped_file_ranges_go_in_the_vectored_write() {
        use std::io::{Read, Write};
        let whole: Vec<u8> = (0..70001u32).map(|i| (i * 11) as u8).collect();
        let file = temp_file(&whole);
        let map = std::sync::Arc::new(filemap::FileMap::new(&file, whole.len()).unwrap());
        let dg = Digests {
            header: true,
            data: false,
        };
        let r = FileRange::new(file.clone(), 0, whole.len()).unwrap();
        assert!(
            r.clone()
                .with_map(std::sync::Arc::new(
                    filemap::FileMap::new(&file, whole.len() - 1).unwrap()
                ))
                .is_none(),
            "a mapping too short is not used"
        );
        let r = r.with_map(map).unwrap();
        let (expect, mut got) = around_a_range(&whole, r, dg);
        assert!(!got.has_file(), "nothing left for sendfile");
        assert!(got.front_file().is_none());
        // Drained by the kernel (the mapped bytes must not be read here),
        // through a socket small enough for partial writes.
        let (mut rx, mut tx) = std::os::unix::net::UnixStream::pair().unwrap();
        tx.set_nonblocking(true).unwrap();
        let reader = std::thread::spawn(move || {
            let mut v = Vec::new();
            rx.read_to_end(&mut v).unwrap();
            v
        });
        let mut writes = 0;
        while !got.is_empty() {
            let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
            let n = got.io_slices(&mut iov);
            if writes == 0 {
                // Headers and "before"; the range; padding, header, "after".
                assert_eq!(n, 3, "the range is in the first vectored write");
            }
            match tx.write_vectored(&iov[..n]) {
                Ok(w) => {
                    writes += 1;
                    got.advance(w);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        drop(tx);
        assert_eq!(reader.join().unwrap(), expect);
        assert!(writes >= 1);
    }

    /// Sends everything queued through a socket small enough for partial
    /// writes, as the connection does (the kernel copies mapped ranges),
    /// calling `between` after each write; returns what arrived.
    fn drain(mut o: Outbox, mut between: impl FnMut(&mut Outbox)) -> Vec<u8> {
        use std::io::{Read, Write};
        let (mut rx, mut tx) = std::os::unix::net::UnixStream::pair().unwrap();
        tx.set_nonblocking(true).unwrap();
        let reader = std::thread::spawn(move || {
            let mut v = Vec::new();
            rx.read_to_end(&mut v).unwrap();
            v
        });
        while !o.is_empty() {
            assert!(!o.is_broken());
            let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
            let n = o.io_slices(&mut iov);
            match tx.write_vectored(&iov[..n]) {
                Ok(w) => o.advance(w),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    o.unguard();
                    std::thread::yield_now()
                }
                Err(e) => panic!("{e}"),
            }
            between(&mut o);
        }
        assert_eq!(o.pinned, 0, "every pinned segment accounted for");
        drop(tx);
        reader.join().unwrap()
    }

    /// A file holding `whole`, mapped writable with a write gate, and the
    /// range of all of it sent from that mapping.
    fn gated(whole: &[u8]) -> (Arc<std::fs::File>, Arc<filemap::WriteGate>, FileRange) {
        let file = temp_file(whole);
        let gate = Arc::new(filemap::WriteGate::new());
        let map = filemap::FileMap::writable(file.clone(), whole.len())
            .unwrap()
            .with_gate(gate.clone());
        let r = FileRange::new(file.clone(), 0, whole.len())
            .unwrap()
            .with_map(Arc::new(map))
            .unwrap();
        (file, gate, r)
    }

    const BOTH: Digests = Digests {
        header: true,
        data: true,
    };

    fn pinned(o: &Outbox) -> usize {
        let n = o
            .queue
            .iter()
            .filter(|s| matches!(s, Seg::Pinned { .. }))
            .count();
        assert_eq!(o.pinned, n, "the count of pinned segments is kept right");
        n
    }

    #[test]
    fn a_pinned_range_carries_the_digest_of_the_bytes_sent() {
        let whole: Vec<u8> = (0..70001u32).map(|i| (i * 11 + 3) as u8).collect();
        let (_file, _gate, r) = gated(&whole);
        let (expect, got) = around_a_range(&whole, r, BOTH);
        assert_eq!(pinned(&got), 1, "digested in place, not read");
        assert!(!got.has_file());
        assert_eq!(drain(got, |_| {}), expect);
    }

    /// A pinned range's digest is folded from the file's block CRCs once
    /// they are known, and a write through the gate makes the CRCs of the
    /// blocks it touches be computed afresh.
    #[test]
    fn pinned_ranges_fold_their_digest_from_the_files_block_crcs() {
        use std::os::unix::fs::FileExt;
        let mib = filemap::SUM_CHUNK;
        let mut whole: Vec<u8> = (0..3 * mib as u32 + 1001)
            .map(|i| (i * 7 + (i >> 13)) as u8)
            .collect();
        let (file, gate, all) = gated(&whole);
        // Unaligned at both ends, across two chunk boundaries.
        let (off, n) = (5000, 2 * mib + 9001);
        let digest_of = |whole: &[u8]| {
            let (expect, got) = around_a_range(&whole[off..off + n], all.slice(off, n), BOTH);
            assert_eq!(pinned(&got), 1);
            (expect, drain(got, |_| {}))
        };
        let sums = gate.sums();
        // Short ranges are read whole, and record nothing.
        let (expect, got) = around_a_range(&whole[..65535], all.slice(0, 65535), BOTH);
        assert_eq!(pinned(&got), 1);
        assert_eq!(drain(got, |_| {}), expect);
        assert!(sums.chunk(0).is_none());
        let (expect, got) = digest_of(&whole);
        assert_eq!(got, expect, "computed and recorded");
        let known: usize = (0..3).map(|c| sums.chunk(c).unwrap().known()).sum();
        assert_eq!(known, n / 4096 - 1, "every whole block of the range");
        let (expect, got) = digest_of(&whole);
        assert_eq!(got, expect, "folded from the recorded CRCs");
        // The fold is what gives the digest: a wrong recorded CRC shows.
        let block = sums.chunk(1).unwrap();
        let right = block.get(7).unwrap();
        block.set(7, right ^ 1);
        let (expect, got) = digest_of(&whole);
        assert_ne!(got, expect);
        block.set(7, right);
        // Writes through the gate: one inside a block, one across a chunk
        // boundary, one at the range's unaligned start.
        for (at, len) in [(mib + 7 * 4096 + 100, 10), (2 * mib - 3, 6), (4999, 2)] {
            whole[at..at + len].iter_mut().for_each(|b| *b ^= 0x5a);
            let _w = gate.writing(at as u64, len as u64);
            file.write_all_at(&whole[at..at + len], at as u64).unwrap();
        }
        let (expect, got) = digest_of(&whole);
        assert_eq!(got, expect, "the blocks written were computed afresh");
    }

    #[test]
    fn a_range_written_while_queued_is_read_afresh_with_its_digest() {
        use std::os::unix::fs::FileExt;
        let whole: Vec<u8> = (0..70001u32).map(|i| (i * 11 + 3) as u8).collect();
        let (file, gate, r) = gated(&whole);
        let (_, got) = around_a_range(&whole, r, BOTH);
        assert_eq!(pinned(&got), 1);
        // A write to the range after it was queued, announced to the gate
        // as the backend announces its writes.
        let mut newer = whole.clone();
        newer[30000..30100].fill(0xee);
        {
            let _w = gate.writing(30000, 100);
            file.write_all_at(&newer[30000..30100], 30000).unwrap();
        }
        let expect = around(&newer, BOTH).to_vec();
        assert_eq!(
            drain(got, |_| {}),
            expect,
            "the new bytes, with their digest"
        );
    }

    #[test]
    fn a_half_sent_range_is_finished_from_a_copy() {
        use std::os::unix::fs::FileExt;
        let whole: Vec<u8> = (0..70001u32).map(|i| (i * 11 + 3) as u8).collect();
        let (file, gate, r) = gated(&whole);
        let (expect, mut got) = around_a_range(&whole, r, BOTH);
        // The first write takes the first PDU and part of the range.
        let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
        let n = got.io_slices(&mut iov);
        assert!(
            n >= 2 && iov[1].len() == whole.len(),
            "the range is the 2nd slice"
        );
        let head = iov[0].len();
        let mut sent = iov[0].to_vec();
        sent.extend_from_slice(&whole[..1000]);
        got.advance(head + 1000);
        assert_eq!(pinned(&got), 0, "the rest was copied");
        // A write now must neither wait nor change what goes out.
        {
            let _w = gate.writing(0, 70001);
            file.write_all_at(&[0u8; 70001], 0).unwrap();
        }
        sent.extend(drain(got, |_| {}));
        assert_eq!(sent, expect);
    }

    #[test]
    fn writers_wait_while_a_pinned_range_is_in_the_write() {
        let whole: Vec<u8> = (0..70001u32).map(|i| (i * 11 + 3) as u8).collect();
        let (_file, gate, r) = gated(&whole);
        let (_, mut got) = around_a_range(&whole, r, BOTH);
        got.io_slices(&mut [IoSlice::new(&[]); MAX_IOVECS]);
        let (tx, rx) = std::sync::mpsc::channel();
        let g = gate.clone();
        let t = std::thread::spawn(move || {
            let _w = g.writing(69000, 10);
            tx.send(()).unwrap();
        });
        let wait = std::time::Duration::from_millis(200);
        assert!(rx.recv_timeout(wait).is_err(), "held off during the write");
        got.unguard();
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("free once the write is over");
        t.join().unwrap();
        // Not in the range: no wait.
        got.io_slices(&mut [IoSlice::new(&[]); MAX_IOVECS]);
        drop(gate.writing(70001, 10));
        got.unguard();
    }

    #[test]
    fn a_range_is_not_pinned_while_its_file_is_written() {
        let whole: Vec<u8> = (0..70001u32).map(|i| (i * 11 + 3) as u8).collect();
        let (_file, gate, r) = gated(&whole);
        let w = gate.writing(1 << 30, 1);
        let (expect, got) = around_a_range(&whole, r, BOTH);
        drop(w);
        assert_eq!(pinned(&got), 0, "read into memory instead");
        assert_eq!(drain(got, |_| {}), expect);
    }

    #[test]
    fn an_unreadable_range_under_a_digest_breaks_the_outbox() {
        let file = temp_file(&[1u8; 4096]);
        let mut o = Outbox::new();
        let r = FileRange::new(file, 0, 65536).unwrap();
        let dg = Digests {
            header: false,
            data: true,
        };
        o.push_chain(&[0u8; BHS_LEN], Chain::from_file(r), dg);
        assert!(o.is_broken());
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
