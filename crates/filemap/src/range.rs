//! [`FileRange`]: a range of an open file that the send queue hands to the
//! kernel (RFC 7143 §10.7, a Data-In's data segment) without copying it
//! through user space: by `sendfile(2)` from the page cache, or from the
//! file's mapping ([`FileMap`]) in the same vectored write as the headers
//! around it. With a write gate on the file ([`crate::WriteGate`]) a range
//! can be pinned and its bytes read in place for a data digest.

use std::fs::File;
use std::io;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::FileMap;

/// `len` bytes of an open file from `offset`, to be sent by the kernel
/// straight from the page cache. The bytes are whatever the file holds when
/// the kernel reads them, which is later than the moment this is made.
///
/// A range may also carry a mapping of the file ([`FileRange::with_map`],
/// [`FileMap`]): then the kernel copies it from the mapping in the same
/// vectored write as the headers around it, instead of by `sendfile`.
#[derive(Clone, Debug)]
pub struct FileRange {
    file: Arc<File>,
    offset: u64,
    len: usize,
    map: Option<Arc<FileMap>>,
}

impl PartialEq for FileRange {
    fn eq(&self, o: &Self) -> bool {
        Arc::ptr_eq(&self.file, &o.file) && self.offset == o.offset && self.len == o.len
    }
}
impl Eq for FileRange {}

impl FileRange {
    /// `len` bytes of `file` from `offset`; `None` when the end would not
    /// fit in an `off_t`-sized (i64) offset.
    pub fn new(file: Arc<File>, offset: u64, len: usize) -> Option<Self> {
        let end = offset.checked_add(len as u64)?;
        i64::try_from(end).ok()?;
        Some(FileRange {
            file,
            offset,
            len,
            map: None,
        })
    }

    /// The range, to be sent from `map` (a mapping of the same file) when
    /// it lies inside it; `None` when it does not.
    pub fn with_map(mut self, map: Arc<FileMap>) -> Option<Self> {
        let end = usize::try_from(self.offset).ok()?.checked_add(self.len)?;
        if end > map.len() {
            return None;
        }
        self.map = Some(map);
        Some(self)
    }

    /// True when the range is sent from a mapping ([`Self::kernel_bytes`]).
    pub fn is_mapped(&self) -> bool {
        self.map.is_some()
    }

    /// The range's bytes in the mapping it carries.
    ///
    /// # Safety
    /// As [`FileMap::kernel_slice`]: hand them to the kernel, never read
    /// them in user space.
    pub unsafe fn kernel_bytes(&self) -> Option<&[u8]> {
        let m = self.map.as_ref()?;
        // SAFETY: passed on to our caller; `with_map` checked the offset
        // fits a usize and the range lies inside the mapping, and slicing
        // and advancing only shrink it.
        unsafe { m.kernel_slice(self.offset as usize, self.len) }
    }

    /// The file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Offset of the first byte in the file.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes `off .. off + n` of the range.
    ///
    /// # Panics
    /// When the range runs past the end.
    pub fn slice(&self, off: usize, n: usize) -> FileRange {
        assert!(
            off.checked_add(n).is_some_and(|end| end <= self.len),
            "slice {off}+{n} beyond a file range of {}",
            self.len
        );
        FileRange {
            file: self.file.clone(),
            offset: self.offset + off as u64,
            len: n,
            map: self.map.clone(),
        }
    }

    /// The first `n` bytes dropped (they were sent).
    ///
    /// # Panics
    /// When `n` is more than the length.
    pub fn advance(&mut self, n: usize) {
        assert!(
            n <= self.len,
            "advance {n} beyond a file range of {}",
            self.len
        );
        self.offset += n as u64;
        self.len -= n;
    }

    /// A pin on the range ([`crate::WriteGate::pin`]), guarding, so that
    /// its bytes can be read in place with [`Self::read_pinned`] and then
    /// sent from the mapping; `None` when the range has no mapping, its
    /// file no gate, or a write to the file is in progress.
    pub fn pin(&self) -> Option<crate::Pin> {
        let gate = self.map.as_ref()?.gate()?;
        gate.pin(self.offset, self.len as u64)
    }

    /// The block CRCs of the range's file ([`crate::FileSums`], kept by
    /// its gate), when it has a mapping and a gate; checked first against
    /// changes by other programs ([`crate::FileSums::check`]).
    pub fn sums(&self) -> Option<&crate::FileSums> {
        let sums = self.map.as_ref()?.gate()?.sums();
        sums.check(&self.file);
        Some(sums)
    }

    /// Calls `f` with the range's bytes, read from the mapping in user
    /// space, in order; false when they could not all be read (the file
    /// was cut short) and whatever `f` computed is void. `pin` must guard
    /// this range (from [`Self::pin`] on it, or on a range it was sliced or
    /// advanced from).
    ///
    /// # Safety
    /// As [`FileMap::read_guarded`] for `f`: it must own nothing that
    /// needs dropping, take no lock and not panic.
    pub unsafe fn read_pinned(&self, pin: &crate::Pin, f: &mut dyn FnMut(&[u8])) -> bool {
        let Some(m) = self.map.as_ref() else {
            return false;
        };
        if !pin.is_guarding() {
            return false;
        }
        // SAFETY: the pin guards the range, so no writer of ours touches
        // it; `with_map` found its pages resident, and only a write (held
        // off) or a file cut short (recovered) takes them away. `f`: the
        // caller's obligations.
        unsafe { m.read_guarded(self.offset as usize, self.len, f) }
    }

    /// Reads the range into `v` (cleared first; a pooled buffer on the
    /// copying path, e.g. when a data digest must be computed over the
    /// bytes sent). End of file before the end of the range is
    /// `UnexpectedEof`: never short data.
    pub fn read(&self, mut v: BytesMut) -> io::Result<Bytes> {
        use std::os::unix::fs::FileExt;
        v.clear();
        v.resize(self.len, 0);
        self.file.read_exact_at(&mut v, self.offset)?;
        Ok(v.freeze())
    }
}
