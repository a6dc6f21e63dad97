//! A write's data-out, one type from the session to the medium.
//!
//! The iSCSI session gathers a command's data-out (RFC 7143 §10.7,
//! immediate, unsolicited and solicited Data-Out) and hands it on as a
//! [`WriteData`]; the SCSI layer checks it against the CDB (SBC-3 §5.39
//! WRITE) and passes the same value to the backend's `write`. The variant
//! says what the receiving side did with the bytes, which decides what the
//! medium may do with them:
//!
//! * [`WriteData::Segments`]: slices of buffers others use (a receive
//!   buffer), or gathered small segments: copy them, never keep them.
//! * [`WriteData::Owned`]: one buffer made for this command (the data-out
//!   was received into it): a medium that keeps data in memory may keep the
//!   buffer itself instead of copying it.
//! * [`WriteData::Placed`]: the bytes were received straight into their
//!   place on the medium (a file on tmpfs, see [`filemap::Placed`]); only
//!   their durability is left to do.

use std::borrow::Cow;

use bytes::Bytes;

use filemap::Placed;

use crate::Chain;

/// A command's data-out (module docs).
#[derive(Debug, Default)]
pub enum WriteData {
    /// No data-out.
    #[default]
    None,
    /// Shared segments the medium must copy, never keep.
    Segments(Chain),
    /// One buffer of the command's own, which the medium may keep.
    Owned(Bytes),
    /// Received into its place on the medium already.
    Placed(Placed),
}

impl From<Chain> for WriteData {
    fn from(c: Chain) -> Self {
        if c.is_empty() {
            WriteData::None
        } else {
            WriteData::Segments(c)
        }
    }
}

impl WriteData {
    /// Bytes of data-out (for [`WriteData::Placed`], those received).
    pub fn len(&self) -> usize {
        match self {
            WriteData::None => 0,
            WriteData::Segments(c) => c.len(),
            WriteData::Owned(b) => b.len(),
            WriteData::Placed(p) => p.len(),
        }
    }

    /// True when there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True for data received into its place on the medium.
    pub fn is_placed(&self) -> bool {
        matches!(self, WriteData::Placed(_))
    }

    /// The bytes in memory, segment by segment (none for
    /// [`WriteData::Placed`]: they are on the medium).
    pub fn segments(&self) -> impl Iterator<Item = &[u8]> {
        let (one, chain): (Option<&[u8]>, Option<&Chain>) = match self {
            WriteData::Owned(b) => (Some(&b[..]), None),
            WriteData::Segments(c) => (None, Some(c)),
            WriteData::None | WriteData::Placed(_) => (None, None),
        };
        one.into_iter()
            .chain(chain.into_iter().flat_map(|c| c.segments().map(|s| &s[..])))
    }

    /// The number of segments [`Self::segments`] yields.
    pub fn segment_count(&self) -> usize {
        match self {
            WriteData::Owned(_) => 1,
            WriteData::Segments(c) => c.segment_count(),
            WriteData::None | WriteData::Placed(_) => 0,
        }
    }

    /// The first segment (all the bytes when there is one).
    pub fn first(&self) -> &[u8] {
        self.segments().next().unwrap_or(&[])
    }

    /// The first segment as shared bytes (`None` when there is none).
    pub fn first_bytes(&self) -> Option<&Bytes> {
        match self {
            WriteData::Owned(b) => Some(b),
            WriteData::Segments(c) => Some(c.parts().0),
            WriteData::None | WriteData::Placed(_) => None,
        }
    }

    /// All the bytes in memory as one slice: borrowed when there is at
    /// most one segment, joined otherwise.
    pub fn contiguous(&self) -> Cow<'_, [u8]> {
        if self.segment_count() <= 1 {
            return Cow::Borrowed(self.first());
        }
        let mut v = Vec::with_capacity(self.len());
        self.segments().for_each(|s| v.extend_from_slice(s));
        Cow::Owned(v)
    }

    /// Copies the bytes in memory into a new vector (tests and
    /// diagnostics).
    pub fn to_vec(&self) -> Vec<u8> {
        self.contiguous().into_owned()
    }

    /// The first `n` bytes in memory, sharing the buffers (an owned buffer
    /// stays owned: a share of its front is still the command's own).
    /// `None` for placed data, or when there are fewer than `n` bytes.
    pub fn prefix(&self, n: usize) -> Option<WriteData> {
        if n > self.len() || self.is_placed() {
            return None;
        }
        Some(match self {
            _ if n == 0 => WriteData::None,
            WriteData::Owned(b) => WriteData::Owned(b.slice(..n)),
            WriteData::Segments(c) => WriteData::Segments(c.slice(0, n)),
            WriteData::None | WriteData::Placed(_) => unreachable!("excluded above"),
        })
    }

    /// The segments, to give their buffers back (`None` for placed data or
    /// no data).
    pub fn into_chain(self) -> Option<Chain> {
        match self {
            WriteData::Owned(b) => Some(Chain::from(b)),
            WriteData::Segments(c) => Some(c),
            WriteData::None | WriteData::Placed(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segmented() -> WriteData {
        let mut c = Chain::new();
        c.push(Bytes::from_static(b"abc"));
        c.push(Bytes::from_static(b"defg"));
        WriteData::Segments(c)
    }

    #[test]
    fn views_agree_on_every_variant() {
        let s = segmented();
        assert_eq!((s.len(), s.segment_count(), s.first()), (7, 2, &b"abc"[..]));
        assert_eq!(&*s.contiguous(), b"abcdefg");
        assert!(matches!(s.contiguous(), Cow::Owned(_)));
        let o = WriteData::Owned(Bytes::from_static(b"xyz"));
        assert_eq!((o.len(), o.segment_count(), o.first()), (3, 1, &b"xyz"[..]));
        assert!(matches!(o.contiguous(), Cow::Borrowed(b"xyz")));
        let n = WriteData::None;
        assert_eq!((n.len(), n.segment_count(), n.first()), (0, 0, &b""[..]));
        assert!(n.is_empty() && n.into_chain().is_none());
        assert!(matches!(WriteData::from(Chain::new()), WriteData::None));
    }

    #[test]
    fn prefixes_share_and_keep_ownership() {
        let s = segmented();
        let p = s.prefix(5).unwrap();
        assert!(matches!(p, WriteData::Segments(_)));
        assert_eq!(&*p.contiguous(), b"abcde");
        assert!(s.prefix(8).is_none());
        assert!(matches!(s.prefix(0), Some(WriteData::None)));
        let o = WriteData::Owned(Bytes::from_static(b"xyz"));
        assert!(matches!(o.prefix(2), Some(WriteData::Owned(b)) if &b[..] == b"xy"));
    }
}
