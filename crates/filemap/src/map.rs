//! [`FileMap`]: a read-only shared mapping of a whole file in memory
//! (tmpfs), from which the kernel copies a large read straight into the
//! socket.
//!
//! Why not `sendfile(2)`: it queues references to the page cache pages,
//! and on loopback the *receiver* then copies them out of memory the
//! target never touched, cold. The initiator (one thread, as iscsi-perf
//! is) becomes the bottleneck: 128 KiB reads cost it 42-57 µs each from a
//! tmpfs file against 21-24 µs from a RAM LUN, whose replies it copies out
//! of socket buffers the target has just written (docs/PERFORMANCE.md,
//! "What makes it fast"). A `writev` from the mapping makes the target do that
//! copy, as the RAM LUN does, in the header's `writev`.
//!
//! The mapping is read in user space only by [`FileMap::read_guarded`]
//! (a data digest over the pages that are then sent, with the file's
//! writers held off by a [`crate::WriteGate`]) and [`FileMap::load`] (a
//! small read's copy, in place of `pread`), which recover from SIGBUS;
//! otherwise its bytes are only handed to the kernel
//! ([`FileMap::kernel_slice`]). If the file shrinks under it,
//! the kernel's copy from a page past the end fails with `EFAULT` (the
//! write is refused) where a user-space read would raise SIGBUS. And it is
//! only used where every page is known to be in the page cache
//! ([`FileMap::known_present`], [`FileMap::resident`]): a read fault on a
//! hole of a tmpfs file would allocate the page (`sendfile` and `pread`
//! serve holes from the zero page instead).
//!
//! A mapping made by [`FileMap::writable`] is also `PROT_WRITE`: a write's
//! data-out is received straight into it ([`crate::Placed`]), by the
//! kernel (`recv(2)` into the mapping), and small writes already in user
//! space are stored into it by [`FileMap::store`], a copy that recovers
//! from SIGBUS (`store.rs`); nothing else in user space touches it.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Arc;

/// Pages [`FileMap::resident`] asks `mincore(2)` about per call.
const RESIDENT_BATCH: usize = 256;

/// A `PROT_READ` (or, [`FileMap::writable`], `PROT_READ | PROT_WRITE`),
/// `MAP_SHARED` mapping of the first `len` bytes of a file.
#[derive(Debug)]
pub struct FileMap {
    ptr: NonNull<u8>,
    len: usize,
    /// The file, when the mapping is writable (what [`FileMap::store`]
    /// cannot store goes by `pwrite(2)` on it).
    file: Option<Arc<File>>,
    /// The file's writers, when its owner announces them there
    /// ([`Self::with_gate`]): then reads of it can be pinned
    /// ([`crate::FileRange::pin`]) and writes received into it announce
    /// themselves ([`Self::place`]).
    gate: Option<Arc<crate::WriteGate>>,
    /// Pages known to be in the page cache ([`Self::mark_present`],
    /// `known.rs`): asked before `mincore(2)`, and all that small reads
    /// ([`Self::load`]) ask.
    known: crate::known::KnownPages,
}

// SAFETY: the mapping is owned by this value alone (unmapped once, on
// drop); user space stores through it only with `FileMap::store`'s copy
// (outside Rust's memory model, like the kernel's stores into ranges a
// `Placed` has to itself), so sharing its address between threads is
// sound.
unsafe impl Send for FileMap {}
// SAFETY: as above; nothing here mutates through the pointer.
unsafe impl Sync for FileMap {}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

impl FileMap {
    /// Maps the first `len` bytes of `file` (which must be open for
    /// reading). `len` may run past the file's end (those pages are never
    /// resident); it must not be 0.
    pub fn new(file: &File, len: usize) -> io::Result<FileMap> {
        Self::map(file, len, libc::PROT_READ).map(|(ptr, len)| FileMap {
            ptr,
            len,
            file: None,
            gate: None,
            known: crate::known::KnownPages::new(len, page_size()),
        })
    }

    /// Maps the first `len` bytes of `file` (open for reading and writing)
    /// for reading and writing: [`Self::place`] hands out ranges of it that
    /// a write's data is received into.
    pub fn writable(file: Arc<File>, len: usize) -> io::Result<FileMap> {
        Self::map(&file, len, libc::PROT_READ | libc::PROT_WRITE).map(|(ptr, len)| FileMap {
            ptr,
            len,
            file: Some(file),
            gate: None,
            known: crate::known::KnownPages::new(len, page_size()),
        })
    }

    /// The mapping, with `gate` as the gate every writer of the file passes
    /// (the caller's promise: [`crate::WriteGate`]).
    pub fn with_gate(mut self, gate: Arc<crate::WriteGate>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// The gate the file's writers pass, if they do.
    pub fn gate(&self) -> Option<&Arc<crate::WriteGate>> {
        self.gate.as_ref()
    }

    /// Whether [`Self::place`] can hand out ranges.
    pub fn is_writable(&self) -> bool {
        self.file.is_some()
    }

    /// The file, when the mapping is writable.
    pub(crate) fn file(&self) -> Option<&File> {
        self.file.as_deref()
    }

    /// The mapping's address (for the kernel only, see [`Self::kernel_slice`]).
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.ptr
    }

    fn map(file: &File, len: usize, prot: libc::c_int) -> io::Result<(NonNull<u8>, usize)> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        // SAFETY: a fresh mapping at an address the kernel chooses; the
        // descriptor is valid for the call (the mapping keeps its own
        // reference to the file).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok((ptr, len))
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (an empty mapping cannot be made).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Records that the pages holding bytes `off .. off + len` are in the
    /// page cache: the caller wrote them, or found them there (`SEEK_DATA`).
    /// [`Self::store`] records what it stores by itself.
    pub fn mark_present(&self, off: usize, len: usize) {
        self.known.mark(off, len);
    }

    /// Forgets the pages holding bytes `off .. off + len`, whole or in part,
    /// before the caller punches a hole there (`known.rs`).
    pub fn forget_present(&self, off: usize, len: usize) {
        self.known.forget(off, len);
    }

    /// True when every page holding bytes `off .. off + len` is recorded as
    /// in the page cache ([`Self::mark_present`]); no system call. False
    /// for an empty range and ranges outside the mapping.
    pub fn known_present(&self, off: usize, len: usize) -> bool {
        off.checked_add(len).is_some_and(|e| e <= self.len) && self.known.all(off, len)
    }

    /// True when every page holding bytes `off .. off + len` is in the page
    /// cache, so that reading them through the mapping allocates nothing:
    /// known so ([`Self::known_present`]), or found so by `mincore(2)`
    /// (and then recorded). False for ranges outside the mapping, and when
    /// the question cannot be asked.
    pub fn resident(&self, off: usize, len: usize) -> bool {
        let Some(end) = off.checked_add(len) else {
            return false;
        };
        if len == 0 || end > self.len {
            return len == 0 && off <= self.len;
        }
        if self.known.all(off, len) {
            return true;
        }
        let page = page_size();
        let mut at = off & !(page - 1);
        let mut vec = [0u8; RESIDENT_BATCH];
        while at < end {
            let n = (end - at).min(RESIDENT_BATCH * page);
            let pages = n.div_ceil(page);
            // SAFETY: `at` is page-aligned and `at .. at + n` lies inside
            // the mapping (`end <= self.len`); `vec` has room for one byte
            // per page of it. mincore only reads the page tables.
            let r = unsafe {
                libc::mincore(self.ptr.as_ptr().add(at).cast(), n, vec.as_mut_ptr().cast())
            };
            if r != 0 || vec[..pages].iter().any(|&v| v & 1 == 0) {
                return false;
            }
            at += n;
        }
        self.known.mark(off, len);
        true
    }

    /// Bytes `off .. off + len` of the mapping, or `None` when the range is
    /// not inside it.
    ///
    /// # Safety
    /// The slice may only be handed to the kernel (as an iovec of `writev`
    /// or `sendmsg`), never read in user space: if the file shrinks, its
    /// pages past the new end raise SIGBUS when touched. The caller must
    /// also not keep it beyond the mapping's life (the borrow ensures it).
    pub unsafe fn kernel_slice(&self, off: usize, len: usize) -> Option<&[u8]> {
        let end = off.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: inside the mapping, which lives as long as `self`;
        // see the caller's obligations above.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) })
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `new` with this address and
        // length and is unmapped only here.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{IoSlice, Write};
    use std::os::unix::fs::FileExt;

    fn shm_file(tag: &str) -> Option<File> {
        crate::unlinked_file(std::path::Path::new("/dev/shm"), tag).ok()
    }

    #[test]
    #[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
    fn resident_sees_written_pages_and_not_holes() {
        let f = shm_file("resident").expect("/dev/shm");
        let page = page_size();
        f.set_len(64 * page as u64).unwrap();
        f.write_all_at(&vec![7u8; 8 * page], 0).unwrap();
        f.write_all_at(&[1u8], 40 * page as u64).unwrap();
        let m = FileMap::new(&f, 64 * page).unwrap();
        assert!(m.resident(0, 8 * page));
        assert!(m.resident(100, 3 * page), "unaligned start");
        assert!(!m.resident(7 * page, 2 * page), "page 8 is a hole");
        assert!(m.resident(40 * page, 1));
        assert!(!m.resident(39 * page, page + 1));
        assert!(!m.resident(60 * page, 8 * page), "past the mapping");
        assert!(!m.resident(usize::MAX, 2));
        // Asking did not allocate the holes (an allocated page would be
        // resident now).
        assert!(!m.resident(8 * page, page));
        assert!(!m.resident(39 * page, 1));
    }

    #[test]
    #[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
    fn the_kernel_copies_from_the_mapping_and_refuses_pages_cut_off() {
        let f = shm_file("shrink").expect("/dev/shm");
        let page = page_size();
        let data: Vec<u8> = (0..4 * page).map(|i| (i * 13) as u8).collect();
        f.write_all_at(&data, 0).unwrap();
        let m = FileMap::new(&f, 4 * page).unwrap();
        let (mut rx, mut tx) = std::os::unix::net::UnixStream::pair().unwrap();
        // SAFETY: handed to the kernel only.
        let s = unsafe { m.kernel_slice(page, 2 * page) }.unwrap();
        assert_eq!(tx.write_vectored(&[IoSlice::new(s)]).unwrap(), 2 * page);
        let mut back = vec![0u8; 2 * page];
        std::io::Read::read_exact(&mut rx, &mut back).unwrap();
        assert_eq!(back, &data[page..3 * page]);
        // The file shrinks: the kernel's copy from the pages past its end
        // fails (EFAULT), the process lives on.
        f.set_len(page as u64).unwrap();
        // SAFETY: handed to the kernel only.
        let s = unsafe { m.kernel_slice(2 * page, page) }.unwrap();
        let e = tx.write_vectored(&[IoSlice::new(s)]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
        // SAFETY: as above.
        assert!(unsafe { m.kernel_slice(3 * page, page + 1) }.is_none());
    }
}
