//! The file backend: a regular file or a block device.
//!
//! Two descriptors are kept open on the same file: one with `O_DSYNC`, used
//! for write-through and for FUA writes (each write is stable when `pwrite`
//! returns), and one without, used for write-back writes, which
//! [`BlockBackend::flush`] makes stable with `fdatasync`. Write-through is
//! the default; write-back is opt-in (config, or MODE SELECT setting WCE).
//!
//! A file in memory (tmpfs, ramfs) is also mapped: large reads are sent
//! from the mapping, small reads of pages known to be there (written
//! through this backend, or found at open) copied out of it
//! (`filemap::FileMap::load`: 0.61 µs for a cold 4 KiB block against
//! 0.95 µs by `pread`),
//! large writes received into it, and smaller writes
//! stored into it from user space (`filemap::FileMap::store`, which
//! survives a page gone from under it: the rest goes by `pwrite`), at half
//! the cost of `pwrite` (from 256 KiB by non-temporal stores, which do not
//! read the destination's cache lines first: the 1 MiB writes that data
//! digests keep from being received in place). Memory is such a file's medium, so a store is as
//! stable as an `O_DSYNC` write. Stores do not update the file's mtime.
//! Every write, whichever way it goes, first passes the file's
//! [`filemap::WriteGate`], so that a read under a data digest can compute
//! the digest over the mapping and be sent from it with no write in
//! between.
//!
//! Zeroing and thin provisioning (`fallocate(2)`, `lseek(2)`):
//!
//! | call           | regular file                           | block device                              |
//! |----------------|----------------------------------------|-------------------------------------------|
//! | `write_zeroes` | `FALLOC_FL_ZERO_RANGE`                 | `FALLOC_FL_ZERO_RANGE` (BLKZEROOUT path)  |
//! | `discard`      | `FALLOC_FL_PUNCH_HOLE \| KEEP_SIZE`     | `FALLOC_FL_PUNCH_HOLE \| KEEP_SIZE`        |
//! | `allocation`   | `SEEK_DATA` / `SEEK_HOLE`              | everything allocated                      |
//!
//! On a block device the kernel turns `PUNCH_HOLE` into a write-zeroes
//! request that may unmap but must read back zeros (it fails rather than
//! fall back when the device cannot), so discarded blocks always read as
//! zeros. BLKDISCARD is never used: whether discarded blocks read back as
//! zeros is not guaranteed. As a block device's allocation cannot be
//! queried, it does not claim [`Caps::can_deallocate`] and is
//! presented fully provisioned. When a filesystem or device refuses a
//! `fallocate` mode (`EOPNOTSUPP`), zeros are written instead. Under
//! write-through the change is made stable with `fdatasync` before return.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard, RwLock};

use crate::{
    check_range, check_range_u64, write_zeroes_by_writing, BlockBackend, Caps, Extent, FastPaths,
    WriteCache, WriteData,
};

/// Writes larger than this to a file in memory run on an I/O thread
/// ([`Caps::inline_write_max`]), so that a copy of several MiB into
/// tmpfs does not hold up the event loop's other connections. Up to 1 MiB
/// the copy runs on the event loop, from the buffer the data just landed
/// in (still in that core's cache): 1 MiB writes Q8 to a file on a huge-page
/// tmpfs ran 10-20 % faster so than handed to an I/O thread (ironsan bench
/// 2513-4021 vs 2158-3915 MB/s, qemu-img 2177-2585 vs 1443-2088, nine
/// alternating rounds; docs/PERFORMANCE.md, "What makes it fast"). The fourth
/// session had measured the opposite with 256 KiB while our initiator's
/// sends were still paced by BBR, which left the machine half idle.
const INLINE_WRITE_MAX: usize = 1 << 20;

/// A store backed by a file or block device.
#[derive(Debug)]
pub struct FileBackend {
    path: PathBuf,
    /// Shared with the large reads in flight ([`FastPaths::splice_source`]).
    plain: Arc<File>,
    dsync: File,
    size: AtomicU64,
    write_back: AtomicBool,
    block_device: bool,
    /// The file lives in memory (tmpfs, ramfs): I/O never waits on a
    /// device, so it can run on the event loop.
    in_memory: bool,
    /// The filesystem's block size (`st_blksize`): the unit holes are
    /// punched in.
    fs_block: u64,
    /// Held by large writes to a file in memory, which run on I/O threads:
    /// the filesystem writes one file at a time anyway (inode lock), and
    /// threads queued here sleep, where on the inode lock they spin.
    large_writes: Mutex<()>,
    /// A file in memory mapped whole, from which large reads of written
    /// pages are sent ([`FastPaths::splice_source`], [`filemap::FileMap`]);
    /// replaced when the LUN is resized.
    map: RwLock<Option<Arc<filemap::FileMap>>>,
    /// Every write to the file announces itself here, so that a read under
    /// a data digest can compute it over the mapping and be sent from it
    /// with no write in between ([`filemap::WriteGate`]).
    gate: Arc<filemap::WriteGate>,
}

/// A mapping of the first `size` bytes of `f`, if it can be made (if not,
/// large reads go by sendfile).
/// A shared mapping of the whole file, writable (writes are received
/// into it, [`FastPaths::place_write`]) or, where that is refused,
/// read-only.
fn map_file(
    f: &Arc<File>,
    size: u64,
    gate: &Arc<filemap::WriteGate>,
) -> Option<Arc<filemap::FileMap>> {
    let len = usize::try_from(size).ok()?;
    let m = filemap::FileMap::writable(f.clone(), len)
        .or_else(|_| filemap::FileMap::new(f, len))
        .ok()?;
    mark_data(f, size, &m);
    Some(Arc::new(m.with_gate(gate.clone())))
}

/// Records the file's data (`SEEK_DATA` to `SEEK_HOLE`; on tmpfs, the
/// pages it holds) as present in `m`, so that small reads of what was
/// written before the mapping was made are copied from it too
/// ([`FileBackend::read_bytes`]). Called before anything else can write
/// the file through this backend (at open, and on resize under the gate).
fn mark_data(f: &File, size: u64, m: &filemap::FileMap) {
    let mut at = 0;
    while at < size {
        // A filesystem that cannot tell (or any error): nothing more is
        // known, and small reads of the rest go by `pread`.
        let Ok(e) = extent_at(f, at, size) else {
            return;
        };
        if e.allocated {
            // Both fit: `size` is the mapping's length, a usize.
            m.mark_present(at as usize, e.len as usize);
        }
        at += e.len;
    }
}

/// The extent of `f` that starts at `offset`, up to `end` (> `offset`):
/// data up to the next hole, or a hole up to the next data (`SEEK_DATA`,
/// `SEEK_HOLE`). EINVAL: the filesystem cannot tell.
fn extent_at(f: &File, offset: u64, end: u64) -> io::Result<Extent> {
    match seek_file(f, offset, libc::SEEK_DATA)? {
        // A hole from `offset` up to the next data (or the end).
        Some(d) if d > offset => Ok(Extent {
            allocated: false,
            len: d.min(end) - offset,
        }),
        None => Ok(Extent {
            allocated: false,
            len: end - offset,
        }),
        // Data at `offset`, up to the next hole (EOF counts as one).
        Some(_) => {
            let hole = seek_file(f, offset, libc::SEEK_HOLE)?.unwrap_or(end);
            Ok(Extent {
                allocated: true,
                len: hole.clamp(offset + 1, end) - offset,
            })
        }
    }
}

/// `lseek(whence)` on `f` from `offset`; `None` for ENXIO (no data / hole
/// past `offset`).
fn seek_file(f: &File, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    use std::os::fd::AsRawFd;
    let off = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
    // SAFETY: lseek(2) on an open descriptor. The file position it moves
    // is never used: all I/O is positional.
    let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(r as u64))
}

impl FileBackend {
    /// For a large write to a file in memory, the turn to write
    /// ([`Self::large_writes`]).
    fn one_large_write(&self, len: usize) -> Option<MutexGuard<'_, ()>> {
        (self.in_memory && len > INLINE_WRITE_MAX).then(|| self.large_writes.lock())
    }

    /// Opens `path` for reading and writing. A regular file is created
    /// (sparse) when `create_size` is given and it does not exist, and
    /// extended to that size when shorter.
    pub fn open(path: &Path, create_size: Option<u64>, policy: WriteCache) -> io::Result<Self> {
        let mut opts = OpenOptions::new();
        opts.read(true).write(true);
        if create_size.is_some() {
            opts.create(true);
        }
        let plain = opts.open(path)?;
        no_atime(&plain);
        let meta = plain.metadata()?;
        let block_device = meta.file_type().is_block_device();
        let fs_block = {
            use std::os::unix::fs::MetadataExt;
            let b = meta.blksize();
            if b.is_power_of_two() && (512..=(1 << 20)).contains(&b) {
                b
            } else {
                4096
            }
        };
        let size = if block_device {
            block_device_size(&plain)?
        } else {
            if let Some(want) = create_size {
                if meta.len() < want {
                    plain.set_len(want)?;
                }
            }
            plain.metadata()?.len()
        };
        if size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is empty; give a size to create it", path.display()),
            ));
        }
        let dsync = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DSYNC)
            .open(path)?;
        let in_memory = !block_device && memory_filesystem(&plain);
        let plain = Arc::new(plain);
        let gate = Arc::new(filemap::WriteGate::new());
        let map = if in_memory {
            map_file(&plain, size, &gate)
        } else {
            None
        };
        Ok(FileBackend {
            path: path.to_path_buf(),
            plain,
            dsync,
            size: size.into(),
            write_back: AtomicBool::new(policy == WriteCache::WriteBack),
            block_device,
            in_memory,
            fs_block,
            large_writes: Mutex::new(()),
            map: RwLock::new(map),
            gate,
        })
    }

    /// `fallocate(mode)` over the range; `Ok(false)` when the filesystem
    /// or device does not support the mode.
    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<bool> {
        use std::os::fd::AsRawFd;
        let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "range too large",
            ));
        };
        loop {
            // SAFETY: plain fallocate(2) on a descriptor open for the
            // lifetime of `self`; no memory is passed.
            let r = unsafe { libc::fallocate(self.plain.as_raw_fd(), mode, off, n) };
            if r == 0 {
                return Ok(true);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => return Ok(false),
                _ => return Err(e),
            }
        }
    }

    /// After a `fallocate`: under write-through the change must be stable.
    fn settle(&self) -> io::Result<()> {
        if self.write_back.load(Ordering::Relaxed) {
            Ok(())
        } else {
            self.plain.sync_data()
        }
    }

    /// Before punching a hole into `offset .. offset + len` (or zeroing it,
    /// which may punch): its pages are no longer known to be there.
    fn forget_present(&self, offset: u64, len: u64) {
        if let (Some(m), Ok(off), Ok(n)) = (
            self.map.read().as_ref(),
            usize::try_from(offset),
            usize::try_from(len),
        ) {
            m.forget_present(off, n);
        }
    }

    /// Reads `len` bytes at `offset` into one pooled buffer, without
    /// zeroing it first ([`FastPaths::read_chain`]).
    pub fn read_bytes(&self, offset: u64, len: usize) -> io::Result<bytes::Bytes> {
        check_range(self.size.load(Ordering::Relaxed), offset, len)?;
        // A pooled buffer filled by `pread` straight into its spare
        // capacity: no zeroing first, no allocation in steady state.
        let mut v = bufpool::take(len);
        let spare = &mut v.spare_capacity_mut()[..len];
        // Pages this backend knows are in the page cache (it wrote them,
        // or found them there) are copied out of the mapping, which spares
        // `pread`'s system call and page cache walk (a cold 4 KiB block:
        // 0.61 µs against 0.95). What the copy could not take (a file
        // cut short under the mapping) goes by `pread`, which says why.
        let mut done = 0;
        if let (true, Ok(off)) = (self.in_memory, usize::try_from(offset)) {
            if let Some(m) = self.map.read().as_ref() {
                if m.known_present(off, len) {
                    done = m.load(off, spare);
                }
            }
        }
        if done < len {
            pread_exact_uninit(&self.plain, &mut spare[done..], offset + done as u64)?;
        }
        // SAFETY: `load` initialised the first `done` bytes of the spare
        // capacity and `pread_exact_uninit`, which returned Ok, the rest.
        unsafe { v.set_len(len) };
        Ok(v.freeze())
    }

    /// The path this backend serves.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `bufs` one after another from `offset` (the body of every
    /// write: stores into the mapping of a file in memory, else
    /// `pwritev`).
    fn write_slices(&self, bufs: &[&[u8]], offset: u64, fua: bool) -> io::Result<()> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        check_range(self.size.load(Ordering::Relaxed), offset, total)?;
        let _one = self.one_large_write(total);
        let _w = self.gate.writing(offset, total as u64);
        let first = offset;
        // A file in memory takes the pieces by stores into its mapping
        // (`FileMap::store`), half the cost of `pwrite`'s page cache walk;
        // memory is its medium, so they are as stable there as `pwrite`
        // with `O_DSYNC` makes them. What a store could not take (a page
        // that cannot be had) goes by `pwritev` with the pieces after it,
        // which says why.
        let (mut offset, mut done, mut cut) = (offset, 0, 0);
        if let (true, Ok(mut off)) = (self.in_memory, usize::try_from(offset)) {
            if let Some(m) = self.map.read().as_ref() {
                for b in bufs {
                    let n = m.store(off, b);
                    offset += n as u64;
                    off += n;
                    if n < b.len() {
                        cut = n;
                        break;
                    }
                    done += 1;
                }
            }
        }
        if done == bufs.len() {
            return Ok(());
        }
        let f = if fua || !self.write_back.load(Ordering::Relaxed) {
            &self.dsync
        } else {
            &self.plain
        };
        let left = total - (offset - first) as usize;
        if cut == 0 {
            pwritev_all(f, &bufs[done..], offset)?;
        } else {
            let mut rest = Vec::with_capacity(bufs.len() - done);
            rest.push(&bufs[done][cut..]);
            rest.extend_from_slice(&bufs[done + 1..]);
            pwritev_all(f, &rest, offset)?;
        }
        // The pages written are in the page cache now (stores record
        // theirs themselves).
        if let (true, Ok(off)) = (self.in_memory, usize::try_from(offset)) {
            if let Some(m) = self.map.read().as_ref() {
                m.mark_present(off, left);
            }
        }
        Ok(())
    }
}

fn block_device_size(f: &File) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    let mut size: u64 = 0;
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    // SAFETY: the descriptor is open for the duration of the call and the
    // ioctl writes exactly one u64 to the pointer given.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

/// Asks that reads of `f` leave its access time alone (`O_NOATIME`):
/// otherwise every `pread`, `sendfile` or `splice` of a LUN's data asks
/// whether to update it (`touch_atime`, a few percent of the target's
/// time at 4 KiB reads from tmpfs). Only the file's owner (or
/// `CAP_FOWNER`) may; for anyone else the file keeps its atime.
fn no_atime(f: &File) {
    use std::os::fd::AsRawFd;
    let fd = f.as_raw_fd();
    // SAFETY: fcntl(2) F_GETFL/F_SETFL on a descriptor open for the call;
    // no memory is passed.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            let _ = libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NOATIME);
        }
    }
}

/// True when `f` is on tmpfs or ramfs (statfs(2) magic numbers).
fn memory_filesystem(f: &File) -> bool {
    use std::os::fd::AsRawFd;
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    const RAMFS_MAGIC: u64 = 0x8584_58f6;
    // SAFETY: an all-zero statfs is a valid value to be overwritten.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open and `st` is a valid out-pointer.
    if unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    matches!(st.f_type as u64, TMPFS_MAGIC | RAMFS_MAGIC)
}

impl BlockBackend for FileBackend {
    fn caps(&self) -> Caps {
        let write_cache = WriteCache::from_write_back(self.write_back.load(Ordering::Relaxed));
        Caps {
            may_block: !self.in_memory,
            inline_write_max: INLINE_WRITE_MAX,
            can_deallocate: !self.block_device,
            discard_granularity: self.fs_block,
            ..Caps::new("file", write_cache)
        }
    }
    fn fast(&self) -> Option<&dyn FastPaths> {
        Some(self)
    }
    fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }
    fn resize(&self, new_size: u64) -> io::Result<()> {
        if self.block_device {
            // A block device is resized under us: take its new size.
            let n = block_device_size(&self.plain)?;
            if n != new_size {
                return Err(io::Error::other(format!(
                    "the block device has {n} bytes, not {new_size}"
                )));
            }
        } else {
            let _w = self.gate.writing(0, u64::MAX);
            self.plain.set_len(new_size)?;
            self.plain.sync_all()?;
            if self.in_memory {
                // Reads in flight keep the old mapping; any of its pages
                // past a smaller end are refused to the kernel (EFAULT),
                // which ends that connection as a short sendfile does.
                *self.map.write() = map_file(&self.plain, new_size, &self.gate);
            }
        }
        self.size.store(new_size, Ordering::Relaxed);
        Ok(())
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size.load(Ordering::Relaxed), offset, buf.len())?;
        self.plain.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.write_slices(&[buf], offset, fua)
    }
    fn write(&self, data: &WriteData, offset: u64, fua: bool) -> io::Result<()> {
        match data {
            WriteData::Owned(b) => self.write_slices(&[b], offset, fua),
            WriteData::Segments(c) if c.segment_count() == 1 => {
                self.write_slices(&[c.parts().0], offset, fua)
            }
            WriteData::Segments(_) => {
                let bufs: Vec<&[u8]> = data.segments().collect();
                self.write_slices(&bufs, offset, fua)
            }
            WriteData::None | WriteData::Placed(_) => {
                crate::write_by_segments(self, data, offset, fua)
            }
        }
    }
    fn flush(&self) -> io::Result<()> {
        self.plain.sync_data()
    }
    fn set_write_cache(&self, policy: WriteCache) -> io::Result<()> {
        let wb = policy == WriteCache::WriteBack;
        if !wb && self.write_back.load(Ordering::Relaxed) {
            // Leaving write-back: what was cached must be stable first.
            self.flush()?;
        }
        self.write_back.store(wb, Ordering::Relaxed);
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range_u64(self.size.load(Ordering::Relaxed), offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let _w = self.gate.writing(offset, len);
        self.forget_present(offset, len);
        if self.fallocate(libc::FALLOC_FL_ZERO_RANGE, offset, len)? {
            return self.settle();
        }
        write_zeroes_by_writing(self, offset, len)
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range_u64(self.size.load(Ordering::Relaxed), offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let _w = self.gate.writing(offset, len);
        self.forget_present(offset, len);
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        if self.fallocate(mode, offset, len)? {
            return self.settle();
        }
        self.write_zeroes(offset, len)
    }
    fn allocation(&self, offset: u64, len: u64) -> io::Result<Extent> {
        check_range_u64(self.size.load(Ordering::Relaxed), offset, len)?;
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty range"));
        }
        let whole = Extent {
            allocated: true,
            len,
        };
        if self.block_device {
            return Ok(whole);
        }
        match extent_at(&self.plain, offset, offset + len) {
            // No SEEK_DATA support: everything counts as allocated.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(whole),
            r => r,
        }
    }
}

impl FastPaths for FileBackend {
    fn read_chain(&self, offset: u64, len: usize) -> io::Result<bufpool::Chain> {
        self.read_bytes(offset, len).map(bufpool::Chain::from)
    }
    fn can_splice(&self) -> bool {
        self.in_memory
    }
    fn splice_source(&self, offset: u64, len: usize) -> Option<filemap::FileRange> {
        if !self.in_memory {
            return None;
        }
        check_range(self.size.load(Ordering::Relaxed), offset, len).ok()?;
        let r = filemap::FileRange::new(self.plain.clone(), offset, len)?;
        // Written pages go from the mapping; a range with a hole goes by
        // sendfile, which reads holes as the zero page where a read through
        // the mapping would allocate them.
        let map = self.map.read().clone();
        match map {
            // Resident pages lie inside the mapping, so `with_map` takes it.
            Some(m) if m.resident(usize::try_from(offset).ok()?, len) => r.with_map(m),
            _ => Some(r),
        }
    }
    fn place_write(&self, offset: u64, len: usize) -> Option<filemap::Placed> {
        if !self.in_memory {
            return None;
        }
        check_range(self.size.load(Ordering::Relaxed), offset, len).ok()?;
        // Only where every page is there: receiving into a hole would
        // allocate it in the kernel's copy, and fail (EFAULT) on a full
        // tmpfs; such a write goes by pwrite, which reports ENOSPC.
        let map = self.map.read().clone()?;
        map.place(usize::try_from(offset).ok()?, len)
    }
}

/// Fills all of `buf` from `offset` with `pread(2)`, continuing after short
/// reads; end of file before `buf` is full is `UnexpectedEof` (the file
/// shrank under us).
fn pread_exact_uninit(
    f: &File,
    buf: &mut [std::mem::MaybeUninit<u8>],
    mut offset: u64,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut done = 0usize;
    while done < buf.len() {
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        let rest = &mut buf[done..];
        // SAFETY: the kernel writes at most `rest.len()` bytes into `rest`,
        // which is valid for writes; uninitialised memory is fine to
        // overwrite.
        let r = unsafe {
            libc::pread(
                f.as_raw_fd(),
                rest.as_mut_ptr().cast::<libc::c_void>(),
                rest.len(),
                off,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "end of file inside the LUN (the file shrank)",
            ));
        }
        done += r as usize;
        offset += r as u64;
    }
    Ok(())
}

/// Writes all of `bufs` at `offset` with `pwritev(2)`, one system call per
/// at most `IOV_MAX` buffers, continuing after short writes.
fn pwritev_all(f: &File, bufs: &[&[u8]], mut offset: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    const IOV_MAX: usize = 1024;
    let mut iov: Vec<libc::iovec> = bufs
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
    let mut start = 0;
    while start < iov.len() {
        let n = (iov.len() - start).min(IOV_MAX);
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        // SAFETY: the iovecs point into `bufs`, which outlive the call; the
        // kernel only reads them.
        let r = unsafe { libc::pwritev(f.as_raw_fd(), iov[start..].as_ptr(), n as i32, off) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwritev wrote nothing",
            ));
        }
        let mut done = r as usize;
        offset += done as u64;
        while done > 0 {
            let v = &mut iov[start];
            if done >= v.iov_len {
                done -= v.iov_len;
                start += 1;
            } else {
                // SAFETY: stays inside the same buffer.
                v.iov_base = unsafe { (v.iov_base as *mut u8).add(done) } as *mut libc::c_void;
                v.iov_len -= done;
                done = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_reads_and_writes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lun.img");
        let f = FileBackend::open(&p, Some(1 << 20), WriteCache::WriteThrough).unwrap();
        assert_eq!(f.size(), 1 << 20);
        f.write_at(&[5u8; 4096], 8192, false).unwrap();
        let mut b = vec![0u8; 4096];
        f.read_at(&mut b, 8192).unwrap();
        assert!(b.iter().all(|&x| x == 5));
        assert!(f.write_at(&[0u8; 512], (1 << 20) - 256, false).is_err());
        f.set_write_cache(WriteCache::WriteBack).unwrap();
        assert_eq!(f.caps().write_cache, WriteCache::WriteBack);
        f.write_at(&[6u8; 512], 0, false).unwrap();
        f.flush().unwrap();
    }

    #[test]
    fn reads_leave_the_access_time_alone() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let f = FileBackend::open(
            &dir.path().join("atime.img"),
            Some(1 << 20),
            WriteCache::WriteBack,
        )
        .unwrap();
        // SAFETY: F_GETFL on a descriptor the backend holds open.
        let flags = unsafe { libc::fcntl(f.plain.as_raw_fd(), libc::F_GETFL) };
        assert!(
            flags >= 0 && flags & libc::O_NOATIME != 0,
            "flags {flags:#x}"
        );
    }

    #[test]
    fn read_bytes_fills_pooled_buffers_and_reports_a_shrunk_file() {
        // On disk (pread), and in memory (copies out of the mapping, which
        // recover from the pages cut off).
        let disk = tempfile::tempdir().unwrap();
        let shm = std::path::Path::new("/dev/shm");
        let shm = shm.is_dir().then(|| tempfile::tempdir_in(shm).unwrap());
        for dir in std::iter::once(&disk).chain(shm.as_ref()) {
            read_bytes_in(&dir.path().join("rb.img"));
        }
    }

    fn read_bytes_in(p: &Path) {
        let f = FileBackend::open(p, Some(1 << 20), WriteCache::WriteBack).unwrap();
        let pattern: Vec<u8> = (0..65536u32).map(|i| (i * 13 + 1) as u8).collect();
        f.write_at(&pattern, 4096, false).unwrap();
        for _ in 0..3 {
            // A reused (dirty) pooled buffer must be fully overwritten.
            let b = f.read_bytes(4096, pattern.len()).unwrap();
            assert_eq!(&b[..], &pattern[..]);
            bufpool::give(b);
            let z = f.read_bytes(1 << 19, 4096).unwrap();
            assert!(z.iter().all(|&x| x == 0));
            bufpool::give(z);
        }
        assert!(f.read_bytes((1 << 20) - 512, 1024).is_err());
        // Shrunk behind the backend's back: an error, never short data.
        f.plain.set_len(8192).unwrap();
        let e = f.read_bytes(4096, 8192).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    #[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
    fn small_reads_copy_known_pages_and_never_fill_holes() {
        let (_dir, f) = shm_backend(1 << 20).expect("/dev/shm");
        const PAGE: u64 = 4096;
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
        f.write_at(&data, 4 * PAGE, false).unwrap();
        let m = f.map.read().clone().unwrap();
        assert!(m.known_present(4 * 4096, 8192), "written pages are known");
        assert_eq!(&f.read_bytes(4 * PAGE, 8192).unwrap()[..], &data[..]);
        let b = f.read_bytes(4 * PAGE + 100, 5000).unwrap();
        assert_eq!(&b[..], &data[100..5100]);
        // A hole reads as zeros (by pread), and stays a hole.
        assert!(!m.known_present(64 * 4096, 4096));
        let z = f.read_bytes(64 * PAGE, 4096).unwrap();
        assert!(z.iter().all(|&x| x == 0));
        assert!(!f.allocation(64 * PAGE, PAGE).unwrap().allocated);
        // A discarded page is forgotten before the punch, so reading it
        // afterwards does not fill the hole again through the mapping.
        f.discard(4 * PAGE, PAGE).unwrap();
        assert!(!m.known_present(4 * 4096, 4096));
        assert!(m.known_present(5 * 4096, 4096));
        let b = f.read_bytes(4 * PAGE, 8192).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 0));
        assert_eq!(&b[4096..], &data[4096..]);
        let e = f.allocation(4 * PAGE, PAGE).unwrap();
        assert!(!e.allocated, "the read filled the hole: {e:?}");
        // Written again, known again.
        f.write_at(&data[..4096], 4 * PAGE, false).unwrap();
        assert!(m.known_present(4 * 4096, 8192));
    }

    #[test]
    #[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
    fn pages_written_before_the_mapping_was_made_are_known() {
        let shm = std::path::Path::new("/dev/shm");
        let dir = tempfile::tempdir_in(shm).unwrap();
        let p = dir.path().join("pre.img");
        let data = vec![0x5Au8; 8192];
        {
            let f = File::create(&p).unwrap();
            f.set_len(1 << 20).unwrap();
            f.write_all_at(&data, 65536).unwrap();
        }
        let f = FileBackend::open(&p, None, WriteCache::WriteThrough).unwrap();
        let known = |off, len| f.map.read().as_ref().unwrap().known_present(off, len);
        assert!(known(65536, 8192));
        assert!(!known(0, 4096));
        assert!(!known(65536 + 8192, 4096));
        assert_eq!(&f.read_bytes(65536, 8192).unwrap()[..], &data[..]);
        // Resized: the new mapping knows the file's data as well.
        f.resize(2 << 20).unwrap();
        assert!(known(65536, 8192));
        assert!(!known(1 << 20, 4096));
    }

    #[test]
    fn discard_punches_holes_and_allocation_sees_them() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("thin.img");
        let size = 4u64 << 20;
        let f = FileBackend::open(&p, Some(size), WriteCache::WriteThrough).unwrap();
        assert!(f.caps().can_deallocate);
        let g = f.caps().discard_granularity;
        assert!(g.is_power_of_two());
        // A fresh sparse file is one hole.
        let e = f.allocation(0, size).unwrap();
        assert_eq!(
            e,
            Extent {
                allocated: false,
                len: size
            }
        );
        f.write_at(&vec![9u8; 1 << 20], 1 << 20, false).unwrap();
        let e = f.allocation(0, size).unwrap();
        assert_eq!(
            e,
            Extent {
                allocated: false,
                len: 1 << 20
            }
        );
        let e = f.allocation(1 << 20, size - (1 << 20)).unwrap();
        assert_eq!(
            e,
            Extent {
                allocated: true,
                len: 1 << 20
            }
        );
        let e = f.allocation((1 << 20) + 512, 100).unwrap();
        assert_eq!(
            e,
            Extent {
                allocated: true,
                len: 100
            }
        );
        // Punch the middle: zeros there, data around, a hole in between.
        let (at, n) = ((1 << 20) + 4 * g, 8 * g);
        f.discard(at, n).unwrap();
        let mut b = vec![1u8; 1 << 20];
        f.read_at(&mut b, 1 << 20).unwrap();
        let (lo, hi) = ((4 * g) as usize, (12 * g) as usize);
        assert!(b[..lo].iter().all(|&x| x == 9));
        assert!(b[lo..hi].iter().all(|&x| x == 0));
        assert!(b[hi..].iter().all(|&x| x == 9));
        let e = f.allocation(at, n).unwrap();
        assert_eq!(
            e,
            Extent {
                allocated: false,
                len: n
            }
        );
        // A partial discard zero-fills.
        f.discard((1 << 20) + 100, 200).unwrap();
        let mut s = vec![1u8; 300];
        f.read_at(&mut s, (1 << 20) + 50).unwrap();
        assert!(s[..50].iter().all(|&x| x == 9));
        assert!(s[50..250].iter().all(|&x| x == 0));
        assert!(s[250..].iter().all(|&x| x == 9));
        assert!(f.discard(size - 512, 1024).is_err());
        assert!(f.allocation(size, 1).is_err());
    }

    #[test]
    fn write_zeroes_allocates_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("z.img");
        let f = FileBackend::open(&p, Some(1 << 20), WriteCache::WriteBack).unwrap();
        f.write_at(&[3u8; 8192], 0, false).unwrap();
        f.write_zeroes(512, 4096).unwrap();
        let mut b = vec![1u8; 8192];
        f.read_at(&mut b, 0).unwrap();
        assert!(b[..512].iter().all(|&x| x == 3));
        assert!(b[512..4608].iter().all(|&x| x == 0));
        assert!(b[4608..].iter().all(|&x| x == 3));
        assert!(f.allocation(0, 8192).unwrap().allocated);
        assert!(f.write_zeroes(1 << 20, 1).is_err());
        f.flush().unwrap();
    }

    /// A write-through backend on a new file of `size` bytes in /dev/shm
    /// (tmpfs), with the directory that holds it; `None` without /dev/shm.
    fn shm_backend(size: u64) -> Option<(tempfile::TempDir, FileBackend)> {
        let shm = std::path::Path::new("/dev/shm");
        if !shm.is_dir() {
            return None;
        }
        let dir = tempfile::tempdir_in(shm).unwrap();
        let f = FileBackend::open(
            &dir.path().join("lun"),
            Some(size),
            WriteCache::WriteThrough,
        )
        .unwrap();
        Some((dir, f))
    }

    #[test]
    #[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
    fn files_in_memory_do_not_block() {
        let (_dir, f) = shm_backend(1 << 20).expect("/dev/shm");
        assert!(
            !f.caps().may_block,
            "a tmpfs file is served on the event loop"
        );
        assert!(f.can_splice());
        f.write_at(&[3u8; 8192], 4096, false).unwrap();
        let r = f
            .splice_source(4096, 8192)
            .expect("tmpfs ranges are spliced");
        assert_eq!((r.offset(), r.len()), (4096, 8192));
        assert!(r
            .read(bytes::BytesMut::new())
            .unwrap()
            .iter()
            .all(|&b| b == 3));
        assert!(r.is_mapped(), "written pages are sent from the mapping");
        assert!(f.splice_source((1 << 20) - 4096, 8192).is_none());
        // A range with a hole goes by sendfile, and asking did not fill it.
        let holed = f.splice_source(0, 65536).unwrap();
        assert!(!holed.is_mapped());
        assert!(!f.allocation(65536, 4096).unwrap().allocated);
        // Resized: the new space is mapped too once written.
        f.resize(2 << 20).unwrap();
        f.write_at(&[4u8; 65536], 1 << 20, false).unwrap();
        let grown = f.splice_source(1 << 20, 65536).unwrap();
        assert!(grown.is_mapped());
        assert!(grown
            .read(bytes::BytesMut::new())
            .unwrap()
            .iter()
            .all(|&b| b == 4));
    }

    /// Every way the backend changes a file's bytes passes its gate, and so
    /// forgets the block CRCs recorded for them (`filemap::FileSums`): a
    /// path that bypassed the gate would leave a digest folded from stale
    /// CRCs.
    #[test]
    #[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
    fn every_change_forgets_the_block_crcs_it_touches() {
        let (_dir, f) = shm_backend(4 << 20).expect("/dev/shm");
        f.write_at(&[1u8; 4 << 20], 0, false).unwrap();
        let sums = f.gate.sums();
        // As a digest computed in place under a pin records them.
        let know_all = || {
            sums.prepare(0, 4 << 20);
            for c in 0..4 {
                let s = sums.chunk(c).unwrap();
                (0..s.blocks()).for_each(|b| s.set(b, 1));
            }
        };
        let known = |at: u64| {
            let s = sums.chunk(at / filemap::SUM_CHUNK as u64).unwrap();
            s.get((at % filemap::SUM_CHUNK as u64) as usize / 4096)
                .is_some()
        };
        know_all();
        f.write_at(&[2u8; 100], 8192 + 7, false).unwrap();
        f.write_slices(&[&[3u8; 4096], &[3u8; 4096]], 1 << 20, true)
            .unwrap();
        f.write_zeroes(2 << 20, 4096).unwrap();
        f.discard(3 << 20, 65536).unwrap();
        for (at, forgotten) in [
            (4096, false),
            (8192, true),
            (12288, false),
            ((1 << 20) + 4096, true),
            ((1 << 20) + 8192, false),
            (2 << 20, true),
            ((2 << 20) + 4096, false),
            ((3 << 20) + 61440, true),
            ((3 << 20) + 65536, false),
        ] {
            assert_eq!(!known(at), forgotten, "block at {at}");
        }
        // A large write received into the file's pages.
        know_all();
        let placed = f.place_write(1 << 20, 1 << 20).expect("placed");
        assert!(!known((1 << 20) + 4096) && known(0));
        drop(placed);
        // A resize forgets everything.
        know_all();
        f.resize(8 << 20).unwrap();
        assert!(!known(0) && !known(3 << 20));
    }

    #[test]
    fn files_on_disk_are_not_spliced() {
        let dir = tempfile::tempdir_in(".").unwrap();
        let f = FileBackend::open(
            &dir.path().join("lun"),
            Some(1 << 20),
            WriteCache::WriteBack,
        )
        .unwrap();
        if f.in_memory {
            return;
        }
        assert!(!f.can_splice());
        assert!(f.splice_source(0, 65536).is_none());
    }

    #[test]
    fn refuses_empty_file_without_size() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("empty");
        std::fs::write(&p, b"").unwrap();
        assert!(FileBackend::open(&p, None, WriteCache::WriteThrough).is_err());
    }

    #[test]
    fn vectored_writes_land_in_order() {
        // On disk (pwritev), and in memory (stores into the mapping).
        let disk = tempfile::tempdir().unwrap();
        let shm = std::path::Path::new("/dev/shm");
        let shm = shm.is_dir().then(|| tempfile::tempdir_in(shm).unwrap());
        for dir in std::iter::once(&disk).chain(shm.as_ref()) {
            let p = dir.path().join("v.img");
            let f = FileBackend::open(&p, Some(1 << 20), WriteCache::WriteBack).unwrap();
            let a = vec![1u8; 3000];
            let b = vec![2u8; 5000];
            let c = vec![3u8; 192];
            f.write_slices(&[&a, &[], &b, &c], 4096, false).unwrap();
            let mut back = vec![0u8; 8192];
            f.read_at(&mut back, 4096).unwrap();
            assert!(back[..3000].iter().all(|&x| x == 1));
            assert!(back[3000..8000].iter().all(|&x| x == 2));
            assert!(back[8000..].iter().all(|&x| x == 3));
            assert!(f.write_slices(&[&a], (1 << 20) - 512, true).is_err());
            // The file cut short behind our back: a store stops at its end
            // (in a piece), and the rest goes by pwritev, which extends it.
            f.plain.set_len(65536 + 4000).unwrap();
            let d = vec![4u8; 6000];
            f.write_slices(&[&a, &d, &c], 65536, false).unwrap();
            let mut back = vec![0u8; 9192];
            f.read_at(&mut back, 65536).unwrap();
            assert!(back[..3000].iter().all(|&x| x == 1));
            assert!(back[3000..9000].iter().all(|&x| x == 4));
            assert!(back[9000..].iter().all(|&x| x == 3));
            assert_eq!(f.plain.metadata().unwrap().len(), 65536 + 9192);
        }
    }
}
