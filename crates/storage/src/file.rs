//! The file backend: a regular file or a block device.
//!
//! Two descriptors are kept open on the same file: one with `O_DSYNC`, used
//! for write-through and for FUA writes (each write is stable when `pwrite`
//! returns), and one without, used for write-back writes, which
//! [`BlockBackend::flush`] makes stable with `fdatasync`. Write-through is
//! the default; write-back is opt-in (config, or MODE SELECT setting WCE).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{check_range, BlockBackend, WriteCache};

/// A store backed by a file or block device.
#[derive(Debug)]
pub struct FileBackend {
    path: PathBuf,
    plain: File,
    dsync: File,
    size: u64,
    write_back: AtomicBool,
}

impl FileBackend {
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
        let meta = plain.metadata()?;
        let size = if meta.file_type().is_block_device() {
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
        Ok(FileBackend {
            path: path.to_path_buf(),
            plain,
            dsync,
            size,
            write_back: AtomicBool::new(policy == WriteCache::WriteBack),
        })
    }

    /// The path this backend serves.
    pub fn path(&self) -> &Path {
        &self.path
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

impl BlockBackend for FileBackend {
    fn kind(&self) -> &'static str {
        "file"
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size, offset, buf.len())?;
        self.plain.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        check_range(self.size, offset, buf.len())?;
        if fua || !self.write_back.load(Ordering::Relaxed) {
            self.dsync.write_all_at(buf, offset)
        } else {
            self.plain.write_all_at(buf, offset)
        }
    }
    fn flush(&self) -> io::Result<()> {
        self.plain.sync_data()
    }
    fn write_cache(&self) -> WriteCache {
        if self.write_back.load(Ordering::Relaxed) {
            WriteCache::WriteBack
        } else {
            WriteCache::WriteThrough
        }
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
        assert_eq!(f.write_cache(), WriteCache::WriteBack);
        f.write_at(&[6u8; 512], 0, false).unwrap();
        f.flush().unwrap();
    }

    #[test]
    fn refuses_empty_file_without_size() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("empty");
        std::fs::write(&p, b"").unwrap();
        assert!(FileBackend::open(&p, None, WriteCache::WriteThrough).is_err());
    }
}
