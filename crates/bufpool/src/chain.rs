//! [`Chain`]: bytes held as a short sequence of shared segments.
//!
//! A large read from a RAM LUN is served from the unit's own memory (one
//! reference per chunk it touches) rather than copied into one buffer, so
//! its data-in is several [`Bytes`] in order. The send queue writes them
//! with one vectored write. The common case, one segment, holds no vector
//! and allocates nothing.

use bytes::Bytes;

/// Bytes in one or more segments, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    first: Bytes,
    rest: Vec<Bytes>,
    len: usize,
}

impl From<Bytes> for Chain {
    fn from(b: Bytes) -> Self {
        let len = b.len();
        Chain {
            first: b,
            rest: Vec::new(),
            len,
        }
    }
}

impl From<Vec<u8>> for Chain {
    fn from(v: Vec<u8>) -> Self {
        Chain::from(Bytes::from(v))
    }
}

impl Chain {
    /// An empty chain.
    pub const fn new() -> Self {
        Chain {
            first: Bytes::new(),
            rest: Vec::new(),
            len: 0,
        }
    }

    /// A chain of `first` followed by `rest`.
    pub fn from_parts(first: Bytes, rest: Vec<Bytes>) -> Self {
        let mut c = Chain::from(first);
        for b in rest {
            c.push(b);
        }
        c
    }

    /// The first segment (empty when the chain is) and the others.
    pub fn parts(&self) -> (&Bytes, &[Bytes]) {
        (&self.first, &self.rest)
    }

    /// The first segment and the others.
    pub fn into_parts(self) -> (Bytes, Vec<Bytes>) {
        (self.first, self.rest)
    }

    /// Appends a segment; empty ones are skipped.
    pub fn push(&mut self, b: Bytes) {
        if b.is_empty() {
            return;
        }
        self.len += b.len();
        if self.first.is_empty() {
            self.first = b;
        } else {
            self.rest.push(b);
        }
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the chain holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of non-empty segments.
    pub fn segment_count(&self) -> usize {
        usize::from(!self.first.is_empty()) + self.rest.len()
    }

    /// The segments, in order.
    pub fn segments(&self) -> impl Iterator<Item = &Bytes> {
        std::iter::once(&self.first)
            .filter(|b| !b.is_empty())
            .chain(self.rest.iter())
    }

    /// The segment when there is at most one, else `Err(self)`.
    pub fn into_single(self) -> Result<Bytes, Self> {
        if self.rest.is_empty() {
            Ok(self.first)
        } else {
            Err(self)
        }
    }

    /// Bytes `off .. off + n` as a chain of shared slices (nothing copied).
    ///
    /// # Panics
    /// When the range runs past the end.
    pub fn slice(&self, off: usize, n: usize) -> Chain {
        assert!(
            off.checked_add(n).is_some_and(|end| end <= self.len),
            "slice {off}+{n} beyond a chain of {}",
            self.len
        );
        let mut out = Chain::new();
        let mut skip = off;
        let mut want = n;
        for seg in self.segments() {
            if want == 0 {
                break;
            }
            if skip >= seg.len() {
                skip -= seg.len();
                continue;
            }
            let take = (seg.len() - skip).min(want);
            out.push(seg.slice(skip..skip + take));
            skip = 0;
            want -= take;
        }
        out
    }

    /// The bytes as one contiguous buffer: shared when there is one
    /// segment, copied otherwise.
    pub fn contiguous(&self) -> Bytes {
        if self.rest.is_empty() {
            return self.first.clone();
        }
        let mut v = Vec::with_capacity(self.len);
        for s in self.segments() {
            v.extend_from_slice(s);
        }
        Bytes::from(v)
    }

    /// Copies the bytes into a new vector (tests and diagnostics).
    pub fn to_vec(&self) -> Vec<u8> {
        self.contiguous().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Chain {
        let mut c = Chain::new();
        c.push(Bytes::from_static(b"abc"));
        c.push(Bytes::new());
        c.push(Bytes::from_static(b"defg"));
        c.push(Bytes::from_static(b"hi"));
        c
    }

    #[test]
    fn slices_across_segments_without_copying() {
        let c = three();
        assert_eq!(c.len(), 9);
        assert_eq!(c.segment_count(), 3);
        assert_eq!(c.to_vec(), b"abcdefghi");
        for off in 0..=9 {
            for n in 0..=9 - off {
                assert_eq!(c.slice(off, n).to_vec(), &b"abcdefghi"[off..off + n]);
            }
        }
        let s = c.slice(1, 4);
        assert_eq!(s.segment_count(), 2);
        assert!(c.slice(3, 4).into_single().is_ok(), "one whole segment");
    }

    #[test]
    #[should_panic(expected = "beyond a chain")]
    fn slice_past_end_panics() {
        let _ = three().slice(5, 5);
    }

    #[test]
    fn single_segment_is_shared() {
        let b = Bytes::from(vec![7u8; 100]);
        let c = Chain::from(b.clone());
        assert_eq!(c.contiguous().as_ptr(), b.as_ptr());
        assert_eq!(c.into_single().unwrap().as_ptr(), b.as_ptr());
        assert!(Chain::new().is_empty());
        assert_eq!(Chain::new().segment_count(), 0);
    }
}
