//! [`Chain`]: bytes held as a short sequence of shared segments.
//!
//! A large read from a RAM LUN is served from the unit's own memory (one
//! reference per chunk it touches) rather than copied into one buffer, so
//! its data-in is several [`Bytes`] in order. The send queue writes them
//! with one vectored write. The common case, one segment, holds no vector
//! and allocates nothing.

//!
//! A chain may instead stand for a range of an open file
//! ([`Chain::from_file`], [`FileRange`]): a large read of a file LUN in
//! memory (tmpfs) that the connection sends with `sendfile(2)` from the page
//! cache, never copying it through user space. Such a chain has no byte
//! segments: [`Chain::segments`] and [`Chain::parts`] are empty, and only
//! code that knows about [`Chain::file`] (the send queue) may take one.

use std::sync::Arc;

use bytes::Bytes;

use filemap::{BlockSums, FileRange};

/// Bytes in one or more segments, in order; or a range of a file.
///
/// A segment may carry the [`BlockSums`] of the buffer it is a slice of
/// ([`Chain::push_summed`]), which the send queue uses for its data
/// digest. Sums are a cache: two chains are equal when their bytes are.
#[derive(Clone, Debug, Default)]
pub struct Chain {
    first: Bytes,
    rest: Vec<Bytes>,
    len: usize,
    src: Source,
}

/// Where a chain's bytes are: in its segments (with their buffers' sums,
/// if known), or in a file. One or the other, so a chain is no larger
/// than before it carried sums.
#[derive(Clone, Debug)]
enum Source {
    Segments(SegmentSums),
    File(FileRange),
}

impl Default for Source {
    fn default() -> Self {
        Source::Segments(SegmentSums::NONE)
    }
}

/// The [`BlockSums`] of a chain's segments, kept apart from them while
/// the segments travel as a first buffer and a vector of the others
/// ([`Chain::into_summed_parts`], [`Chain::from_summed_parts`]).
#[derive(Clone, Debug, Default)]
pub struct SegmentSums {
    first: Option<Arc<BlockSums>>,
    /// `None` until some later segment has sums, then one entry per later
    /// segment. (A boxed slice rather than a vector: the chain is moved by
    /// value along the data path, and this keeps it small.)
    rest: Option<Box<[Option<Arc<BlockSums>>]>>,
}

impl SegmentSums {
    const NONE: SegmentSums = SegmentSums {
        first: None,
        rest: None,
    };

    fn is_empty(&self) -> bool {
        self.first.is_none() && self.rest.iter().flatten().all(Option::is_none)
    }

    /// Records `sums` for segment `rest_len` of the later ones (the one
    /// being appended).
    fn push_rest(&mut self, rest_len: usize, sums: Option<Arc<BlockSums>>) {
        if sums.is_none() && self.rest.is_none() {
            return;
        }
        let mut v = Vec::with_capacity(rest_len + 1);
        v.extend(self.rest.take().into_iter().flat_map(Vec::from));
        v.resize(rest_len, None);
        v.push(sums);
        self.rest = Some(v.into_boxed_slice());
    }

    fn rest(&self, i: usize) -> Option<&Arc<BlockSums>> {
        self.rest.as_ref()?.get(i)?.as_ref()
    }
}

/// Sums are a cache of what the bytes say: any two are equal, so that
/// what holds them compares by its bytes.
impl PartialEq for SegmentSums {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for SegmentSums {}

impl PartialEq for Chain {
    fn eq(&self, o: &Self) -> bool {
        self.len == o.len && self.file() == o.file() && self.segments().eq(o.segments())
    }
}
impl Eq for Chain {}

impl From<Bytes> for Chain {
    fn from(b: Bytes) -> Self {
        let len = b.len();
        Chain {
            first: b,
            len,
            ..Chain::new()
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
            src: Source::Segments(SegmentSums::NONE),
        }
    }

    /// A chain standing for `r` (see the module docs).
    pub fn from_file(r: FileRange) -> Self {
        Chain {
            len: r.len(),
            src: Source::File(r),
            ..Chain::new()
        }
    }

    /// The file range this chain stands for, if it is one.
    pub fn file(&self) -> Option<&FileRange> {
        match &self.src {
            Source::File(r) => Some(r),
            Source::Segments(_) => None,
        }
    }

    /// The file range this chain stands for, or `Err(self)`.
    pub fn into_file(self) -> Result<FileRange, Self> {
        match self.src {
            Source::File(r) => Ok(r),
            Source::Segments(_) => Err(self),
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

    /// [`Self::into_parts`], with the segments' sums.
    pub fn into_summed_parts(self) -> (Bytes, Vec<Bytes>, SegmentSums) {
        let sums = match self.src {
            Source::Segments(s) => s,
            Source::File(_) => SegmentSums::NONE,
        };
        (self.first, self.rest, sums)
    }

    /// The chain [`Self::into_summed_parts`] took apart. Sums that no
    /// longer match the segments one for one are dropped.
    pub fn from_summed_parts(first: Bytes, rest: Vec<Bytes>, sums: SegmentSums) -> Self {
        let mut c = Chain::new();
        c.push_summed(first, sums.first);
        let rest_sums = sums.rest.filter(|r| r.len() == rest.len());
        let mut rest_sums = rest_sums.into_iter().flat_map(Vec::from);
        for b in rest {
            c.push_summed(b, rest_sums.next().flatten());
        }
        c
    }

    /// Appends a segment; empty ones are skipped.
    ///
    /// # Panics
    /// On a chain that stands for a file range.
    pub fn push(&mut self, b: Bytes) {
        self.push_summed(b, None);
    }

    /// Appends a segment with the sums of the buffer it is a slice of
    /// ([`BlockSums`]); empty ones are skipped.
    ///
    /// # Panics
    /// On a chain that stands for a file range.
    pub fn push_summed(&mut self, b: Bytes, sums: Option<Arc<BlockSums>>) {
        let Source::Segments(own) = &mut self.src else {
            panic!("push onto a file range");
        };
        if b.is_empty() {
            return;
        }
        self.len += b.len();
        if self.first.is_empty() {
            self.first = b;
            own.first = sums;
            return;
        }
        own.push_rest(self.rest.len(), sums);
        self.rest.push(b);
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

    /// The segments, in order, each with the sums of its buffer if known.
    pub fn summed_segments(&self) -> impl Iterator<Item = (&Bytes, Option<&Arc<BlockSums>>)> {
        let sums = match &self.src {
            Source::Segments(s) => Some(s),
            Source::File(_) => None,
        };
        std::iter::once((&self.first, sums.and_then(|s| s.first.as_ref())))
            .filter(|(b, _)| !b.is_empty())
            .chain(
                self.rest
                    .iter()
                    .enumerate()
                    .map(move |(i, b)| (b, sums.and_then(|s| s.rest(i)))),
            )
    }

    /// True when some segment carries sums.
    pub fn is_summed(&self) -> bool {
        matches!(&self.src, Source::Segments(s) if !s.is_empty())
    }

    /// The segment when there is at most one, else `Err(self)` (also for
    /// a file range).
    pub fn into_single(self) -> Result<Bytes, Self> {
        if self.rest.is_empty() && self.file().is_none() {
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
        if let Some(r) = self.file() {
            return Chain::from_file(r.slice(off, n));
        }
        let mut out = Chain::new();
        let mut skip = off;
        let mut want = n;
        for (seg, sums) in self.summed_segments() {
            if want == 0 {
                break;
            }
            if skip >= seg.len() {
                skip -= seg.len();
                continue;
            }
            let take = (seg.len() - skip).min(want);
            out.push_summed(seg.slice(skip..skip + take), sums.cloned());
            skip = 0;
            want -= take;
        }
        out
    }

    /// The bytes as one contiguous buffer: shared when there is one
    /// segment, copied otherwise. A file range is read (empty on error:
    /// tests and diagnostics only).
    pub fn contiguous(&self) -> Bytes {
        if let Some(r) = self.file() {
            return r.read(crate::take(r.len())).unwrap_or_default();
        }
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
    fn file_ranges_slice_and_read() {
        use std::io::Write;
        let mut f = tempfile_in_tmp();
        let data: Vec<u8> = (0..10000u32).map(|i| (i * 31) as u8).collect();
        f.write_all(&data).unwrap();
        let f = Arc::new(f);
        let r = FileRange::new(f.clone(), 100, 9000).unwrap();
        let c = Chain::from_file(r.clone());
        assert_eq!(c.len(), 9000);
        assert_eq!(c.segment_count(), 0);
        assert_eq!(c.to_vec(), &data[100..9100]);
        let s = c.slice(1000, 500);
        assert_eq!(s.file().unwrap().offset(), 1100);
        assert_eq!(s.to_vec(), &data[1100..1600]);
        assert!(c.clone().into_single().is_err());
        assert_eq!(c.into_file().unwrap(), r);
        let mut a = r.clone();
        a.advance(8000);
        assert_eq!((a.offset(), a.len()), (8100, 1000));
        // Past the end of the file: an error, never short data.
        let past = FileRange::new(f, 9000, 2000).unwrap();
        assert!(past.read(crate::take(2000)).is_err());
        assert!(FileRange::new(Arc::new(tempfile_in_tmp()), u64::MAX, 1).is_none());
    }

    fn tempfile_in_tmp() -> std::fs::File {
        tempfile::tempfile().unwrap()
    }

    #[test]
    fn sums_travel_with_their_segments() {
        let a = Bytes::from(vec![1u8; 100]);
        let b = Bytes::from(vec![2u8; 100]);
        let sb = Arc::new(BlockSums::new(b.as_ptr(), b.len()));
        let mut c = Chain::new();
        c.push(a.clone());
        c.push_summed(Bytes::new(), Some(sb.clone()));
        c.push_summed(b.clone(), Some(sb.clone()));
        c.push(Bytes::from_static(b"xyz"));
        assert!(c.is_summed());
        let which =
            |c: &Chain| -> Vec<bool> { c.summed_segments().map(|(_, s)| s.is_some()).collect() };
        assert_eq!(which(&c), [false, true, false]);
        assert_eq!(which(&c.slice(150, 53)), [true, false]);
        assert_eq!(which(&c.slice(0, 100)), [false]);
        assert!(!c.slice(0, 100).is_summed());
        let (f, r, s) = c.clone().into_summed_parts();
        let back = Chain::from_summed_parts(f.clone(), r.clone(), s.clone());
        assert_eq!(which(&back), [false, true, false]);
        assert_eq!(back, c);
        // Sums that no longer match the segments one for one are dropped.
        let fewer = Chain::from_summed_parts(f, r[..1].to_vec(), s);
        assert_eq!(which(&fewer), [false, false]);
        let mut first = Chain::new();
        first.push_summed(b, Some(sb));
        assert_eq!(which(&first), [true]);
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
