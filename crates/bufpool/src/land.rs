//! Where a large data segment is received (RFC 7143 §10.7, immediate data
//! and Data-Out): a pooled buffer of its own ([`LandBuf::Pooled`]), or its
//! place on the medium itself ([`LandBuf::Placed`], a [`Placed`] range of a
//! LUN file's mapping, so that `recv(2)` copies the bytes once, straight
//! into the file's pages).

use bytes::buf::UninitSlice;
use bytes::{BufMut, BytesMut};
use filemap::Placed;

/// Where a data segment is received.
#[derive(Debug)]
pub enum LandBuf {
    /// A buffer of the segment's command (from [`crate::take`]).
    Pooled(BytesMut),
    /// The segment's place on the medium.
    Placed(Placed),
}

impl From<BytesMut> for LandBuf {
    fn from(b: BytesMut) -> Self {
        LandBuf::Pooled(b)
    }
}

impl LandBuf {
    /// Bytes in.
    pub fn len(&self) -> usize {
        match self {
            LandBuf::Pooled(b) => b.len(),
            LandBuf::Placed(p) => p.len(),
        }
    }

    /// True when nothing is in yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes that fit before the buffer must grow (a placed range never
    /// grows).
    pub fn spare(&self) -> usize {
        match self {
            LandBuf::Pooled(b) => b.capacity() - b.len(),
            LandBuf::Placed(p) => p.capacity() - p.len(),
        }
    }

    /// Makes room for `more` bytes (a pooled buffer may grow; a placed
    /// range must already have it).
    pub fn reserve(&mut self, more: usize) {
        match self {
            LandBuf::Pooled(b) => b.reserve(more),
            LandBuf::Placed(p) => debug_assert!(p.capacity() - p.len() >= more),
        }
    }

    /// The bytes in, where user space may read them: a pooled buffer's;
    /// `None` for a placed range (kernel only, see the module docs).
    pub fn user_bytes(&self) -> Option<&[u8]> {
        match self {
            LandBuf::Pooled(b) => Some(b),
            LandBuf::Placed(_) => None,
        }
    }

    /// The pooled buffer; `None` for a placed range.
    pub fn into_pooled(self) -> Option<BytesMut> {
        match self {
            LandBuf::Pooled(b) => Some(b),
            LandBuf::Placed(_) => None,
        }
    }
}

// SAFETY: every method forwards to the buffer's own implementation.
unsafe impl BufMut for LandBuf {
    fn remaining_mut(&self) -> usize {
        match self {
            LandBuf::Pooled(b) => b.remaining_mut(),
            LandBuf::Placed(p) => p.remaining_mut(),
        }
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        match self {
            // SAFETY: forwarded; the caller's obligations are the same.
            LandBuf::Pooled(b) => unsafe { b.advance_mut(cnt) },
            // SAFETY: as above.
            LandBuf::Placed(p) => unsafe { p.advance_mut(cnt) },
        }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        match self {
            LandBuf::Pooled(b) => b.chunk_mut(),
            LandBuf::Placed(p) => p.chunk_mut(),
        }
    }

    fn put_slice(&mut self, src: &[u8]) {
        match self {
            LandBuf::Pooled(b) => b.extend_from_slice(src),
            LandBuf::Placed(p) => p.put_slice(src),
        }
    }
}
