//! A volume: what a logical unit is apart from any command set.
//!
//! A SCSI logical unit (SBC-3 §4.1, the `scsi` crate) and an NVMe
//! namespace (NVMe Base Specification 2.0 §3.2, "Namespaces") describe the
//! same thing in two encodings: a run of logical blocks on a medium, with a
//! size that may change, a write cache, limits on a transfer, atomicity,
//! thin provisioning, and commands that must not interleave with each other
//! on the same blocks. This crate holds that part once, so that a second
//! command set drives the very same volume (one set of range locks, one
//! capacity) instead of a copy of it:
//!
//! * **Geometry**: logical block size (512 or 4096 bytes), physical block
//!   size as a power-of-two multiple of it, capacity in blocks
//!   ([`Volume::num_blocks`]), following resizes made here
//!   ([`Volume::resize`]) or by someone else ([`Volume::medium_resized`]).
//! * **Limits**: the largest transfer ([`Volume::max_transfer_blocks`]),
//!   the largest atomic write and its alignment (from the backend's
//!   [`storage::Caps`]).
//! * **Checks**, in the terms of no command set ([`Refusal`]): a transfer
//!   too long, a range past the end, a write to a read-only volume. Each
//!   personality maps them to its own answer (sense data, NVMe status).
//! * **Range locks** ([`locks`]): plain reads and writes share, the
//!   read-modify-write commands (COMPARE AND WRITE, fused Compare and
//!   Write) hold their blocks exclusive.
//! * **I/O** in blocks under those locks: [`Volume::read`],
//!   [`Volume::write`] (the command's [`WriteData`] as received),
//!   [`Volume::flush`].
//! * **The write cache**: whether it is write-back now and by default, and
//!   switching it ([`Volume::set_write_back`]: SCSI's Caching mode page
//!   WCE bit, NVMe's Volatile Write Cache feature).
//! * **Reservation holders** ([`reservations`]): registrants, their keys,
//!   the reservation and its holder, as data the personalities' service
//!   actions change.
//! * **Identity** ([`Identity`]): the 16-byte NAA designator, serial
//!   number, vendor, product and revision, checked once, that every
//!   personality shows (SCSI VPD pages 80h/83h and INQUIRY; NVMe's NGUID and
//!   serial), so that tools can tell two paths lead to one volume.
//!
//! What stays with each personality: decoding its commands, its error
//! encoding, its identification pages' layout, unit attentions or
//! asynchronous events, reservations' wire format, access states'
//! reporting. See
//! docs/ARCHITECTURE.md, "The volume layer".

pub mod access;
pub mod locks;
pub mod reservations;

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bufpool::{Chain, WriteData};
use storage::{BlockBackend, WriteCache};

use locks::LbaLocks;

/// Largest transfer one command may ask for, in bytes (the SCSI Block
/// Limits page's MAXIMUM TRANSFER LENGTH is this divided by the block
/// size; an NVMe controller's MDTS will say the same).
pub const MAX_TRANSFER_BYTES: u32 = 8 << 20;

/// Largest LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT (a 4-bit field in
/// SCSI's READ CAPACITY(16), SBC-3 §5.17, the narrowest of the encodings a
/// volume must fit).
pub const MAX_LBPPB_EXPONENT: u32 = 15;

/// Why a volume cannot be made of a backend.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GeometryError {
    /// Only 512 and 4096 are supported.
    #[error("block size {0} is not supported (512 or 4096)")]
    BlockSize(u32),
    /// The physical block size is not the block size times a power of two
    /// (at most 2^[`MAX_LBPPB_EXPONENT`]).
    #[error(
        "physical block size {physical} is not a power-of-two multiple of the block size \
         {block_size} (at most 2^{MAX_LBPPB_EXPONENT} times it)"
    )]
    PhysicalBlockSize {
        /// The physical block size asked for.
        physical: u32,
        /// The (logical) block size.
        block_size: u32,
    },
    /// The backend holds no block at all.
    #[error("backend size is zero")]
    Empty,
    /// The backend's size is not a whole number of blocks.
    #[error("backend size {size} is not a multiple of the block size {block_size}")]
    Unaligned {
        /// Backend size in bytes.
        size: u64,
        /// The block size.
        block_size: u32,
    },
}

/// A command the volume refuses before touching the medium, in the terms
/// of no command set.
#[derive(Debug)]
pub enum Refusal {
    /// More blocks than [`Volume::max_transfer_blocks`].
    TooLong,
    /// The range runs past the last block (or starts past it).
    OutOfRange,
    /// A write to a read-only volume.
    WriteProtected,
}

/// Why an I/O of the volume failed (the caller made the checks before).
#[derive(Debug)]
pub enum IoError {
    /// The medium failed a read.
    Read(io::Error),
    /// The medium failed a write or a flush (a flush that a FUA read needs
    /// first fails this way too).
    Write(io::Error),
}

/// Why the write cache could not be switched.
#[derive(Debug, thiserror::Error)]
pub enum WriteCacheError {
    /// The backend cannot switch its write cache.
    #[error("the write cache cannot be switched on this medium")]
    Unsupported,
    /// The backend accepted the change but did not make it.
    #[error("the medium kept its write cache as it was")]
    NotSwitched,
    /// The switch failed on the medium (a flush before write-through).
    #[error(transparent)]
    Io(io::Error),
}

/// What identifies a volume to every personality (module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// The NAA IEEE Registered Extended (type 6) designator, 16 bytes,
    /// stable across restarts (SCSI VPD page 83h; an NVMe NGUID).
    pub naa: [u8; 16],
    /// Serial number: printable ASCII, 1 to [`MAX_SERIAL_LEN`] characters.
    pub serial: String,
    /// T10 vendor identification, at most 8 printable ASCII characters.
    pub vendor: String,
    /// Product identification, at most 16 printable ASCII characters.
    pub product: String,
    /// Product revision level, at most 4 printable ASCII characters.
    pub revision: String,
}

/// Longest serial number accepted (it also goes into SCSI's T10 vendor ID
/// designator, whose length is one byte).
pub const MAX_SERIAL_LEN: usize = 200;

/// Why an [`Identity`] is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field} {value:?}: {reason}")]
pub struct IdentityError {
    /// Which field.
    pub field: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Identity {
    /// Checks every field: printable ASCII within its length, a serial
    /// number that is not empty.
    pub fn check(&self) -> Result<(), IdentityError> {
        check_ascii("vendor", &self.vendor, 8)?;
        check_ascii("product", &self.product, 16)?;
        check_ascii("revision", &self.revision, 4)?;
        check_ascii("serial", &self.serial, MAX_SERIAL_LEN)?;
        if self.serial.trim().is_empty() {
            return Err(IdentityError {
                field: "serial",
                value: self.serial.clone(),
                reason: "empty",
            });
        }
        Ok(())
    }
}

fn check_ascii(field: &'static str, value: &str, max: usize) -> Result<(), IdentityError> {
    let err = |reason| {
        Err(IdentityError {
            field,
            value: value.to_owned(),
            reason,
        })
    };
    if value.len() > max {
        return err("too long");
    }
    if !value.bytes().all(|b| (0x20..=0x7E).contains(&b)) {
        return err("not printable ASCII");
    }
    Ok(())
}

/// A volume over a backend (module docs).
pub struct Volume {
    backend: Arc<dyn BlockBackend>,
    block_size: u32,
    block_shift: u32,
    lbppb_shift: u32,
    /// Capacity in blocks; changes only by [`Volume::resize`] and
    /// [`Volume::medium_resized`].
    num_blocks: AtomicU64,
    max_transfer_blocks: u32,
    read_only: bool,
    thin: bool,
    max_atomic_blocks: u32,
    atomic_align_blocks: u32,
    locks: Arc<LbaLocks>,
    /// The write cache's policy when the volume was made.
    default_write_back: bool,
    identity: Identity,
    /// A UUID the operator gave the volume (an NVMe namespace's UUID
    /// designator); set once, before the volume is served.
    uuid: std::sync::OnceLock<[u8; 16]>,
}

impl std::fmt::Debug for Volume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Volume")
            .field("backend", &self.backend.caps().kind)
            .field("block_size", &self.block_size)
            .field("num_blocks", &self.num_blocks())
            .finish_non_exhaustive()
    }
}

impl Volume {
    /// A volume of `block_size`-byte blocks (physical blocks of
    /// `physical_block_size`, the block size when `None`) over `backend`.
    /// `thin`: deallocation is offered when the backend can free space.
    pub fn new(
        backend: Arc<dyn BlockBackend>,
        block_size: u32,
        physical_block_size: Option<u32>,
        read_only: bool,
        thin: bool,
    ) -> Result<Volume, GeometryError> {
        let bs = block_size;
        if bs != 512 && bs != 4096 {
            return Err(GeometryError::BlockSize(bs));
        }
        let pbs = physical_block_size.unwrap_or(bs);
        let ratio = pbs / bs;
        if pbs < bs
            || !pbs.is_multiple_of(bs)
            || !ratio.is_power_of_two()
            || ratio.trailing_zeros() > MAX_LBPPB_EXPONENT
        {
            return Err(GeometryError::PhysicalBlockSize {
                physical: pbs,
                block_size: bs,
            });
        }
        let size = backend.size();
        if size == 0 {
            return Err(GeometryError::Empty);
        }
        if size & (u64::from(bs) - 1) != 0 {
            return Err(GeometryError::Unaligned {
                size,
                block_size: bs,
            });
        }
        let caps = backend.caps();
        let max_transfer_blocks = MAX_TRANSFER_BYTES / bs;
        // A single block is as atomic as any write; more only when the
        // backend lands it whole across a crash.
        let atomic = caps.max_atomic_write / u64::from(bs);
        let max_atomic_blocks = atomic.clamp(1, u64::from(max_transfer_blocks)) as u32;
        // An alignment of one block or less is no requirement (0).
        let align = caps.atomic_alignment / u64::from(bs);
        let atomic_align_blocks = if align <= 1 {
            0
        } else {
            align.min(u64::from(u32::MAX)) as u32
        };
        Ok(Volume {
            block_size: bs,
            block_shift: bs.trailing_zeros(),
            lbppb_shift: ratio.trailing_zeros(),
            num_blocks: AtomicU64::new(size / u64::from(bs)),
            max_transfer_blocks,
            read_only,
            thin: thin && caps.can_deallocate,
            max_atomic_blocks,
            atomic_align_blocks,
            locks: Arc::new(LbaLocks::new(bs.trailing_zeros())),
            default_write_back: caps.write_cache == WriteCache::WriteBack,
            identity: Identity::default(),
            uuid: std::sync::OnceLock::new(),
            backend,
        })
    }

    /// The volume identified as `identity` (checked: [`Identity::check`]).
    pub fn with_identity(mut self, identity: Identity) -> Result<Self, IdentityError> {
        identity.check()?;
        self.identity = identity;
        Ok(self)
    }

    /// What identifies the volume ([`Self::with_identity`]; all empty
    /// until then).
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Gives the volume a UUID (once; a second call changes nothing and
    /// says so).
    pub fn set_uuid(&self, uuid: [u8; 16]) -> bool {
        self.uuid.set(uuid).is_ok()
    }

    /// The UUID the operator gave the volume, if any.
    pub fn uuid(&self) -> Option<[u8; 16]> {
        self.uuid.get().copied()
    }

    /// The write cache is write-back now: a write is durable only after a
    /// flush, or when written with FUA.
    #[inline]
    pub fn write_back(&self) -> bool {
        self.backend.caps().write_cache == WriteCache::WriteBack
    }

    /// The write cache was write-back when the volume was made (SCSI's
    /// default Caching mode page).
    pub fn default_write_back(&self) -> bool {
        self.default_write_back
    }

    /// The write cache may be switched: the medium is not volatile (a
    /// RAM volume loses everything at power off, so write-through would
    /// promise nothing).
    pub fn write_cache_switchable(&self) -> bool {
        !self.backend.caps().volatile
    }

    /// Switches the write cache to write-back (`true`) or write-through;
    /// going write-through flushes what the cache holds first (the
    /// backend's contract).
    pub fn set_write_back(&self, on: bool) -> Result<(), WriteCacheError> {
        let policy = if on {
            WriteCache::WriteBack
        } else {
            WriteCache::WriteThrough
        };
        match self.backend.set_write_cache(policy) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                return Err(WriteCacheError::Unsupported)
            }
            Err(e) => return Err(WriteCacheError::Io(e)),
        }
        if self.write_back() != on {
            return Err(WriteCacheError::NotSwitched);
        }
        Ok(())
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn BlockBackend> {
        &self.backend
    }

    /// Logical block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// log2 of the logical block size.
    #[inline]
    pub fn block_shift(&self) -> u32 {
        self.block_shift
    }

    /// LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT: a physical block is
    /// `1 << lbppb_shift` logical blocks.
    pub fn lbppb_shift(&self) -> u32 {
        self.lbppb_shift
    }

    /// Physical block size in bytes.
    pub fn physical_block_size(&self) -> u32 {
        self.block_size << self.lbppb_shift
    }

    /// Capacity in logical blocks.
    #[inline]
    pub fn num_blocks(&self) -> u64 {
        self.num_blocks.load(Ordering::Relaxed)
    }

    /// The largest transfer of one command, in blocks.
    #[inline]
    pub fn max_transfer_blocks(&self) -> u32 {
        self.max_transfer_blocks
    }

    /// Whether writes are refused.
    #[inline]
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Thin provisioned: asked for, and the backend can free space.
    pub fn thin(&self) -> bool {
        self.thin
    }

    /// The largest write, in blocks, that lands all-or-nothing.
    pub fn max_atomic_blocks(&self) -> u32 {
        self.max_atomic_blocks
    }

    /// The alignment, in blocks, an atomic write needs; 0 for none.
    pub fn atomic_align_blocks(&self) -> u32 {
        self.atomic_align_blocks
    }

    /// The range locks of the volume's blocks.
    #[inline]
    pub fn locks(&self) -> &Arc<LbaLocks> {
        &self.locks
    }

    /// `blocks` within [`Self::max_transfer_blocks`].
    #[inline]
    pub fn check_transfer(&self, blocks: u32) -> Result<(), Refusal> {
        if blocks > self.max_transfer_blocks {
            return Err(Refusal::TooLong);
        }
        Ok(())
    }

    /// `lba .. lba + blocks` inside the medium, overflow-safe; an LBA past
    /// the last block is out of range even with no blocks.
    #[inline]
    pub fn check_range(&self, lba: u64, blocks: u64) -> Result<(), Refusal> {
        let n = self.num_blocks();
        if lba >= n || blocks > n - lba {
            return Err(Refusal::OutOfRange);
        }
        Ok(())
    }

    /// Writes are accepted.
    #[inline]
    pub fn check_writable(&self) -> Result<(), Refusal> {
        if self.read_only {
            return Err(Refusal::WriteProtected);
        }
        Ok(())
    }

    /// Reads `blocks` blocks at `lba` (checked by the caller) under the
    /// shared range lock. With `fua` on a write-back cache, what the
    /// medium holds is made stable first, so that what is returned is what
    /// stable storage holds.
    pub fn read(&self, lba: u64, blocks: u32, fua: bool) -> Result<Chain, IoError> {
        if fua && self.write_back() {
            self.backend.flush().map_err(IoError::Write)?;
        }
        let _range = self.locks.shared(lba, u64::from(blocks));
        let (offset, len) = (
            lba << self.block_shift,
            (blocks as usize) << self.block_shift,
        );
        storage::read_chain(&*self.backend, offset, len).map_err(IoError::Read)
    }

    /// A hint that `blocks` blocks at `lba` are read soon
    /// ([`storage::FastPaths::prefetch`]); nothing is checked or read.
    pub fn prefetch(&self, lba: u64, blocks: u32) {
        if let (Some(f), Some(offset)) = (self.backend.fast(), lba.checked_shl(self.block_shift)) {
            if offset >> self.block_shift == lba {
                f.prefetch(offset, (blocks as usize) << self.block_shift);
            }
        }
    }

    /// Writes `data` (whole blocks, checked by the caller) at `lba` under
    /// the shared range lock; with `fua` it is stable on return.
    pub fn write(&self, lba: u64, data: &WriteData, fua: bool) -> Result<(), IoError> {
        let blocks = (data.len() >> self.block_shift) as u64;
        let _range = self.locks.shared(lba, blocks);
        self.backend
            .write(data, lba << self.block_shift, fua)
            .map_err(IoError::Write)
    }

    /// `count` blocks from `lba` split by physical block: the LBAs before
    /// the first physical block the range covers whole, the whole physical
    /// blocks, and the LBAs after them, each as (lba, blocks). A range
    /// that runs to the last LBA covers the last physical block. With no
    /// whole physical block in the range, everything is in the first part.
    pub fn split_physical(&self, lba: u64, count: u64) -> [(u64, u64); 3] {
        let ppb = 1u64 << self.lbppb_shift();
        let end = lba + count;
        let first = lba.next_multiple_of(ppb);
        let last = if end == self.num_blocks() {
            end
        } else {
            end & !(ppb - 1)
        };
        if first >= last {
            return [(lba, count), (end, 0), (end, 0)];
        }
        [
            (lba, first - lba),
            (first, last - first),
            (last, end - last),
        ]
    }

    /// Deallocates the whole physical blocks of `count` blocks from `lba`
    /// and hands the LBAs of partial ones to `partial(offset, bytes)`. The
    /// caller has checked the range and holds its lock.
    pub fn deallocate_physical(
        &self,
        lba: u64,
        count: u64,
        partial: impl Fn(u64, u64) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let shift = self.block_shift();
        let [head, whole, tail] = self.split_physical(lba, count);
        for (l, n) in [head, tail] {
            if n > 0 {
                partial(l << shift, n << shift)?;
            }
        }
        match whole {
            (_, 0) => Ok(()),
            (l, n) => self.backend().discard(l << shift, n << shift),
        }
    }

    /// Makes every completed write stable.
    pub fn flush(&self) -> io::Result<()> {
        self.backend.flush()
    }

    /// Changes the capacity to `bytes` (a positive multiple of the block
    /// size). Growing: the backend has the room before commands may use
    /// it. Shrinking: new commands past the new end are refused before the
    /// backend lets the space go, and one already running there fails with
    /// an error, never with stale data. Whether shrinking is acceptable is
    /// the caller's decision (it cuts off data).
    pub fn resize(&self, bytes: u64) -> Result<(), String> {
        let bs = u64::from(self.block_size);
        if bytes == 0 || !bytes.is_multiple_of(bs) {
            return Err(format!(
                "{bytes} bytes is not a positive multiple of the block size {bs}"
            ));
        }
        let blocks = bytes / bs;
        if blocks >= self.num_blocks() {
            self.backend.resize(bytes).map_err(|e| e.to_string())?;
            self.num_blocks.store(blocks, Ordering::Relaxed);
        } else {
            let before = self.num_blocks.swap(blocks, Ordering::Relaxed);
            if let Err(e) = self.backend.resize(bytes) {
                self.num_blocks.store(before, Ordering::Relaxed);
                return Err(e.to_string());
            }
        }
        Ok(())
    }

    /// The medium is now `bytes` long (resized by someone else; cut down
    /// to whole blocks): the capacity follows. Whether it changed.
    pub fn medium_resized(&self, bytes: u64) -> bool {
        let blocks = bytes / u64::from(self.block_size);
        self.num_blocks.swap(blocks, Ordering::Relaxed) != blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use storage::MemBackend;

    fn vol(bytes: u64, read_only: bool) -> Volume {
        Volume::new(Arc::new(MemBackend::new(bytes)), 512, None, read_only, true).unwrap()
    }

    fn identity() -> Identity {
        Identity {
            naa: [0x60; 16],
            serial: "S1".into(),
            vendor: "IRONSAN".into(),
            product: "VOLUME".into(),
            revision: "0001".into(),
        }
    }

    #[test]
    fn identity_is_checked_once_and_kept() {
        let v = vol(1 << 20, false).with_identity(identity()).unwrap();
        assert_eq!(v.identity(), &identity());
        for (field, bad) in [
            (
                "vendor",
                Identity {
                    vendor: "NINE_CHRS".into(),
                    ..identity()
                },
            ),
            (
                "product",
                Identity {
                    product: "p\u{e9}".into(),
                    ..identity()
                },
            ),
            (
                "revision",
                Identity {
                    revision: "12345".into(),
                    ..identity()
                },
            ),
            (
                "serial",
                Identity {
                    serial: "   ".into(),
                    ..identity()
                },
            ),
            (
                "serial",
                Identity {
                    serial: "x".repeat(MAX_SERIAL_LEN + 1),
                    ..identity()
                },
            ),
        ] {
            let e = vol(1 << 20, false).with_identity(bad).unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
    }

    #[test]
    fn write_cache_switches_on_the_medium_or_says_why_not() {
        // RAM is volatile: its cache is write-back and stays so.
        let ram = vol(1 << 20, false);
        assert!(ram.write_back() && ram.default_write_back());
        assert!(!ram.write_cache_switchable());
        assert!(matches!(
            ram.set_write_back(false),
            Err(WriteCacheError::Unsupported | WriteCacheError::NotSwitched)
        ));
        assert!(ram.write_back());
        // A file switches both ways; the default stays what it was.
        let dir = std::env::temp_dir().join(format!("volume-wc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lun");
        let file =
            storage::FileBackend::open(&path, Some(1 << 20), WriteCache::WriteThrough).unwrap();
        let v = Volume::new(Arc::new(file), 512, None, false, false).unwrap();
        assert!(!v.write_back() && !v.default_write_back() && v.write_cache_switchable());
        v.set_write_back(true).unwrap();
        assert!(v.write_back() && !v.default_write_back());
        v.set_write_back(false).unwrap();
        assert!(!v.write_back());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn geometry_is_checked() {
        let mem = || Arc::new(MemBackend::new(1 << 20)) as Arc<dyn BlockBackend>;
        assert_eq!(
            Volume::new(mem(), 1024, None, false, false).unwrap_err(),
            GeometryError::BlockSize(1024)
        );
        assert!(matches!(
            Volume::new(mem(), 512, Some(1536), false, false),
            Err(GeometryError::PhysicalBlockSize { .. })
        ));
        assert!(matches!(
            Volume::new(mem(), 512, Some(512 << 16), false, false),
            Err(GeometryError::PhysicalBlockSize { .. })
        ));
        let odd = Arc::new(MemBackend::new((1 << 20) + 100));
        assert!(matches!(
            Volume::new(odd, 512, None, false, false),
            Err(GeometryError::Unaligned { .. })
        ));
        let v = Volume::new(mem(), 512, Some(4096), false, true).unwrap();
        assert_eq!(
            (v.num_blocks(), v.lbppb_shift(), v.physical_block_size()),
            (2048, 3, 4096)
        );
        assert!(v.thin(), "RAM frees space");
    }

    #[test]
    fn checks_refuse_what_the_medium_cannot_take() {
        let v = vol(1 << 20, false);
        assert!(v.check_range(0, 2048).is_ok());
        assert!(matches!(v.check_range(2047, 2), Err(Refusal::OutOfRange)));
        assert!(matches!(v.check_range(2048, 0), Err(Refusal::OutOfRange)));
        assert!(matches!(
            v.check_range(1, u64::MAX),
            Err(Refusal::OutOfRange)
        ));
        assert!(v.check_transfer(v.max_transfer_blocks()).is_ok());
        assert!(matches!(
            v.check_transfer(v.max_transfer_blocks() + 1),
            Err(Refusal::TooLong)
        ));
        assert!(v.check_writable().is_ok());
        assert!(matches!(
            vol(1 << 20, true).check_writable(),
            Err(Refusal::WriteProtected)
        ));
    }

    #[test]
    fn writes_read_back_and_resizes_move_the_end() {
        let v = vol(1 << 20, false);
        let data = WriteData::Owned(bytes::Bytes::from(vec![7u8; 1024]));
        v.write(10, &data, true).unwrap();
        assert_eq!(v.read(10, 2, true).unwrap().to_vec(), vec![7u8; 1024]);
        v.resize(2 << 20).unwrap();
        assert_eq!(v.num_blocks(), 4096);
        assert!(v.resize(1000).is_err());
        assert!(!v.medium_resized(2 << 20));
        assert!(v.medium_resized(1 << 20));
        assert_eq!(v.num_blocks(), 2048);
    }
}
