//! [`Placed`]: a write's data-out received straight into its place on the
//! medium, a range of a writable [`FileMap`] of a LUN's file in memory
//! (the landing buffer `bufpool::LandBuf::Placed`), so that it is copied once, by `recv(2)`,
//! straight into the file's pages (docs/ARCHITECTURE.md: data lands where it is
//! going), instead of into a buffer and then by `pwrite(2)` into the file.
//!
//! A [`Placed`] range is written by the kernel only. Its [`BufMut`] chunk
//! is for `recv(2)`-like reads into it; [`BufMut::put_slice`], for bytes
//! that are already in user space (the part of a segment read together
//! with its header), goes through `pwrite(2)` on the file. So a page that
//! cannot be had (the file cut short under the LUN, a full tmpfs) is an
//! error returned by a system call, `EFAULT` or `ENOSPC`, and never a
//! SIGBUS. A failed `pwrite` is remembered ([`Placed::error`]) and fails
//! the command.
//!
//! Whoever places a write holds what makes that safe until the data is
//! in: [`Placed::holding`] keeps a [`Held`] (a logical unit's shared range
//! lock) that is released when the `Placed` is dropped, wherever that is:
//! the command done, aborted, failed, or its connection gone.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::buf::UninitSlice;
use bytes::BufMut;

use crate::FileMap;

/// Something held for a [`Placed`] range and given back with `token` when
/// it is dropped (a logical unit's range locks: `token` says which).
pub trait Release: Send + Sync {
    /// Gives back what `token` stands for; called once per [`Held`].
    fn release(&self, token: u64);
}

/// One thing held; released on drop.
#[must_use = "released when dropped"]
pub struct Held {
    by: Arc<dyn Release>,
    token: u64,
}

impl Held {
    /// `token` of `by`, to be given back with [`Release::release`] on drop.
    pub fn new(by: Arc<dyn Release>, token: u64) -> Self {
        Held { by, token }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.by.release(self.token);
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held").field("token", &self.token).finish()
    }
}

/// A range of a writable [`FileMap`] that one write's data is received
/// into, front to back.
pub struct Placed {
    map: Arc<FileMap>,
    offset: usize,
    cap: usize,
    filled: usize,
    error: Option<io::Error>,
    hold: Option<Held>,
}

impl Drop for Placed {
    fn drop(&mut self) {
        // `place` announced the write to the map's gate, if it has one.
        if let Some(g) = self.map.gate() {
            g.leave();
        }
    }
}

impl std::fmt::Debug for Placed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placed")
            .field("offset", &self.offset)
            .field("cap", &self.cap)
            .field("filled", &self.filled)
            .field("error", &self.error)
            .finish()
    }
}

impl FileMap {
    /// Bytes `offset .. offset + len` of the file, to be received into
    /// (announced as a write to the file's gate until dropped);
    /// `None` unless the mapping is writable, the range lies inside it
    /// and is not empty, and every page of it is in the page cache
    /// ([`FileMap::resident`]: a hole is not filled by a fault).
    pub fn place(self: &Arc<Self>, offset: usize, len: usize) -> Option<Placed> {
        if !self.is_writable() || len == 0 || !self.resident(offset, len) {
            return None;
        }
        if let Some(g) = self.gate() {
            g.enter(offset as u64, len as u64);
        }
        Some(Placed {
            map: self.clone(),
            offset,
            cap: len,
            filled: 0,
            error: None,
            hold: None,
        })
    }
}

impl Placed {
    /// The same range, keeping `held` until it is dropped.
    pub fn holding(mut self, held: Held) -> Self {
        self.hold = Some(held);
        self
    }

    /// Bytes received so far.
    pub fn len(&self) -> usize {
        self.filled
    }

    /// True before the first byte is in.
    pub fn is_empty(&self) -> bool {
        self.filled == 0
    }

    /// Length of the range.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    fn left(&self) -> usize {
        self.cap - self.filled
    }

    /// The first error of a `pwrite` into the range, if any: the bytes of
    /// the range are then not all the data, and the command must fail.
    pub fn error(&self) -> Option<&io::Error> {
        self.error.as_ref()
    }

    fn file(&self) -> &File {
        self.map.file().expect("placed only in writable mappings")
    }
}

// SAFETY: `chunk_mut` is the unfilled rest of the range, inside the mapping
// (checked by `FileMap::place`), which lives as long as `self.map`; nothing
// else writes there: a range is placed for one command, under its range
// lock, and handed to one reader. `advance_mut` never passes the end.
unsafe impl BufMut for Placed {
    fn remaining_mut(&self) -> usize {
        self.left()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        assert!(cnt <= self.left(), "advance past the placed range");
        self.filled += cnt;
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        let at = self.offset + self.len();
        // SAFETY: `at .. offset + len` lies inside the mapping (see the
        // impl's safety comment); it is only written by the kernel.
        unsafe { UninitSlice::from_raw_parts_mut(self.map.base().as_ptr().add(at), self.left()) }
    }

    /// Writes `src` into the file with `pwrite(2)`, which reports a page
    /// that cannot be had as an error; an error is kept for [`Placed::error`], and
    /// the range counts as filled either way, so that the command's data
    /// accounting goes on and the command fails at its end.
    fn put_slice(&mut self, src: &[u8]) {
        assert!(src.len() <= self.left(), "put past the placed range");
        let at = (self.offset + self.len()) as u64;
        if self.error.is_none() {
            if let Err(e) = self.file().write_all_at(src, at) {
                self.error = Some(e);
            }
        }
        self.filled += src.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn shm_file(tag: &str) -> Option<File> {
        crate::unlinked_file(std::path::Path::new("/dev/shm"), tag).ok()
    }

    struct Count(AtomicU64);
    impl Release for Count {
        fn release(&self, token: u64) {
            self.0.fetch_add(token, Ordering::SeqCst);
        }
    }

    #[test]
    #[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
    fn received_and_put_bytes_reach_the_file_and_the_hold_goes_with_the_range() {
        let f = shm_file("placed").expect("/dev/shm");
        let f = Arc::new(f);
        f.write_all_at(&[0u8; 64 * 1024], 0).unwrap();
        let m = Arc::new(FileMap::writable(f.clone(), 64 * 1024).unwrap());
        let count = Arc::new(Count(AtomicU64::new(0)));
        let mut p = m
            .place(4096, 12288)
            .unwrap()
            .holding(Held::new(count.clone(), 5));
        // The part already in user space, by pwrite.
        p.put_slice(&[1u8; 1000]);
        // The rest as a socket read would: the kernel writes the chunk.
        let (mut tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        std::io::Write::write_all(&mut tx, &[2u8; 11288]).unwrap();
        while p.remaining_mut() > 0 {
            let c = p.chunk_mut();
            // SAFETY: a read(2) into the chunk, which is the kernel writing.
            let n = unsafe {
                libc::read(
                    std::os::fd::AsRawFd::as_raw_fd(&rx),
                    c.as_mut_ptr().cast(),
                    c.len(),
                )
            };
            assert!(n > 0);
            // SAFETY: read(2) wrote `n` bytes there.
            unsafe { p.advance_mut(n as usize) };
        }
        assert_eq!(p.len(), 12288);
        assert!(p.error().is_none());
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        drop(p);
        assert_eq!(count.0.load(Ordering::SeqCst), 5, "released once, on drop");
        let mut back = vec![0u8; 64 * 1024];
        f.read_exact_at(&mut back, 0).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 0));
        assert!(back[4096..5096].iter().all(|&b| b == 1));
        assert!(back[5096..16384].iter().all(|&b| b == 2));
        assert!(back[16384..].iter().all(|&b| b == 0));
    }

    #[test]
    #[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
    fn holes_read_only_maps_and_ranges_outside_are_not_placed() {
        let f = shm_file("unplaced").expect("/dev/shm");
        let f = Arc::new(f);
        f.set_len(64 * 1024).unwrap();
        f.write_all_at(&[9u8; 8192], 0).unwrap();
        let m = Arc::new(FileMap::writable(f.clone(), 64 * 1024).unwrap());
        assert!(m.place(0, 8192).is_some());
        assert!(m.place(0, 8193).is_none(), "the next page is a hole");
        assert!(m.place(0, 0).is_none());
        assert!(m.place(60 * 1024, 8192).is_none(), "past the mapping");
        let ro = Arc::new(FileMap::new(&f, 64 * 1024).unwrap());
        assert!(ro.place(0, 4096).is_none(), "read-only mapping");
    }
}
