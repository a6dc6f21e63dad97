//! Unit tests of the logical unit, driven through [`LogicalUnit::execute`]
//! as the target does, against [`MemBackend`] or [`TestBackend`].

mod alua;
mod atomic;
mod fast;
mod inquiry;
mod misc;
mod mode;
mod physical;
mod pr;
mod props;
mod provisioning;
mod rw;
mod xcopy;

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bufpool::WriteData;
use storage::{BlockBackend, MemBackend, WriteCache};
use volume::GeometryError;

use crate::cdb::op;
use crate::{status, Asc, Command, LogicalUnit, LuConfig, NexusId, Outcome, SenseKey};

pub const BS: u32 = 512;
pub const BLOCKS: u64 = 4096;
pub const N1: NexusId = NexusId(1);
pub const N2: NexusId = NexusId(2);
pub const PORT_NAME: &str = "iqn.2026-11.io.ironsan:t0,t,0x0001";

pub fn cfg() -> LuConfig {
    LuConfig {
        block_size: BS,
        physical_block_size: None,
        naa: [
            0x60, 0x01, 0x40, 0x5A, 0xBC, 0xDE, 0xF0, 0x12, 0x34, 0x56, 0x78, 0x9A, 0xBC, 0xDE,
            0xF0, 0x01,
        ],
        serial: "SN0123456789".into(),
        vendor: "IRONSAN".into(),
        product: "ironsan-disk".into(),
        revision: "0.1".into(),
        read_only: false,
        thin: true,
        pr_state: None,
    }
}

/// A RAM logical unit of [`BLOCKS`] blocks.
pub fn mem_lu() -> LogicalUnit {
    LogicalUnit::new(Arc::new(MemBackend::new(BLOCKS * u64::from(BS))), cfg()).unwrap()
}

/// A logical unit over a [`TestBackend`], which it returns too.
pub fn test_lu(cfg: LuConfig) -> (LogicalUnit, Arc<TestBackend>) {
    let b = Arc::new(TestBackend::new(BLOCKS * u64::from(cfg.block_size)));
    let lu = LogicalUnit::new(b.clone(), cfg).unwrap();
    (lu, b)
}

/// `data` as a transport hands it over when it received it into a larger
/// buffer (shared segments the backend copies).
pub fn wd(data: &[u8]) -> WriteData {
    WriteData::from(bufpool::Chain::from(bytes::Bytes::copy_from_slice(data)))
}

pub fn cmd<'a>(cdb: &'a [u8], data: &'a WriteData, n: NexusId) -> Command<'a> {
    Command {
        cdb,
        data_out: data,
        nexus: n,
        relative_port: 3,
        tpg: 2,
        target_port_name: PORT_NAME,
        initiator_port_name: "iqn.2026-11.test:init,i,0x800000000001",
        expected_data_out: None,
        lus: None,
    }
}

/// Runs `cdb` with `data` from nexus [`N1`].
pub fn run(lu: &LogicalUnit, cdb: &[u8], data: &[u8]) -> Outcome {
    lu.execute(&cmd(cdb, &wd(data), N1))
}

#[track_caller]
pub fn good(o: &Outcome) {
    assert_eq!(o.status, status::GOOD, "expected GOOD, got {:?}", o.sense);
    assert!(o.sense.is_none());
}

#[track_caller]
pub fn sense(o: &Outcome, key: SenseKey, code: Asc) {
    assert_eq!(
        o.status,
        status::CHECK_CONDITION,
        "expected CHECK CONDITION: {o:?}"
    );
    let s = o.sense.expect("sense data");
    assert_eq!((s.key, s.code), (key, code), "sense {s:?}");
    assert!(o.data.is_empty());
}

/// INVALID FIELD IN CDB with this field pointer.
#[track_caller]
pub fn invalid_cdb(o: &Outcome, byte: u16, bit: Option<u8>) {
    sense(o, SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB);
    let f = o.sense.unwrap().field.expect("field pointer");
    assert!(f.in_cdb);
    assert_eq!((f.byte, f.bit), (byte, bit));
}

#[track_caller]
pub fn lba_oob(o: &Outcome) {
    sense(o, SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE);
}

/// A 10-byte CDB with LBA in bytes 2–5 and length in bytes 7–8.
pub fn cdb10(opcode: u8, flags: u8, lba: u32, len: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = opcode;
    c[1] = flags;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&len.to_be_bytes());
    c
}

/// A 12-byte CDB with LBA in bytes 2–5 and length in bytes 6–9.
pub fn cdb12(opcode: u8, flags: u8, lba: u32, len: u32) -> [u8; 12] {
    let mut c = [0u8; 12];
    c[0] = opcode;
    c[1] = flags;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[6..10].copy_from_slice(&len.to_be_bytes());
    c
}

/// A 16-byte CDB with LBA in bytes 2–9 and length in bytes 10–13.
pub fn cdb16(opcode: u8, flags: u8, lba: u64, len: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&len.to_be_bytes());
    c
}

pub fn read10(lba: u32, len: u16) -> [u8; 10] {
    cdb10(op::READ_10, 0, lba, len)
}

pub fn write10(lba: u32, len: u16) -> [u8; 10] {
    cdb10(op::WRITE_10, 0, lba, len)
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A non-volatile in-memory backend with a switchable write cache, error
/// injection and counters.
pub struct TestBackend {
    mem: MemBackend,
    pub write_back: AtomicBool,
    pub fail_read: AtomicBool,
    pub fail_write: AtomicBool,
    pub fail_flush: AtomicBool,
    /// `set_write_cache` answers Ok but changes nothing.
    pub stuck_cache: AtomicBool,
    pub flushes: AtomicUsize,
    pub fua_writes: AtomicUsize,
    pub writes: AtomicUsize,
    /// What `on_resized_elsewhere` was given ([`Self::resize_elsewhere`]).
    resized: parking_lot::Mutex<Option<storage::SizeChanged>>,
}

impl TestBackend {
    pub fn new(size: u64) -> Self {
        TestBackend {
            mem: MemBackend::new(size),
            write_back: AtomicBool::new(false),
            fail_read: AtomicBool::new(false),
            fail_write: AtomicBool::new(false),
            fail_flush: AtomicBool::new(false),
            stuck_cache: AtomicBool::new(false),
            flushes: AtomicUsize::new(0),
            fua_writes: AtomicUsize::new(0),
            writes: AtomicUsize::new(0),
            resized: parking_lot::Mutex::new(None),
        }
    }

    /// Another client resizes the medium: the store changes size and the
    /// backend's user hears of it.
    pub fn resize_elsewhere(&self, bytes: u64) {
        self.mem.resize(bytes).unwrap();
        if let Some(f) = &*self.resized.lock() {
            f(bytes);
        }
    }

    pub fn count(c: &AtomicUsize) -> usize {
        c.load(Ordering::SeqCst)
    }

    pub fn set(flag: &AtomicBool, v: bool) {
        flag.store(v, Ordering::SeqCst);
    }
}

fn eio() -> io::Error {
    io::Error::other("injected")
}

impl BlockBackend for TestBackend {
    fn caps(&self) -> storage::Caps {
        let wc = if self.write_back.load(Ordering::SeqCst) {
            WriteCache::WriteBack
        } else {
            WriteCache::WriteThrough
        };
        storage::Caps::new("test", wc)
    }
    fn ownership(&self) -> Option<&dyn storage::Ownership> {
        Some(self)
    }
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.fail_read.load(Ordering::SeqCst) {
            return Err(eio());
        }
        self.mem.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        if self.fail_write.load(Ordering::SeqCst) {
            return Err(eio());
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
        if fua {
            self.fua_writes.fetch_add(1, Ordering::SeqCst);
        }
        self.mem.write_at(buf, offset, fua)
    }
    fn flush(&self) -> io::Result<()> {
        if self.fail_flush.load(Ordering::SeqCst) {
            return Err(eio());
        }
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn set_write_cache(&self, policy: WriteCache) -> io::Result<()> {
        if !self.stuck_cache.load(Ordering::SeqCst) {
            self.write_back
                .store(policy == WriteCache::WriteBack, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// Only the resize notifications (`follow_backend_size`); no owner
/// arbitration.
impl storage::Ownership for TestBackend {
    fn acquire(&self) -> io::Result<bool> {
        Ok(true)
    }
    fn is_owner(&self) -> io::Result<bool> {
        Ok(true)
    }
    fn take_over(&self, _only_from: Option<&str>) -> io::Result<bool> {
        Ok(true)
    }
    fn release(&self) -> io::Result<()> {
        Ok(())
    }
    fn owner_liveness(&self, _within: std::time::Duration) -> io::Result<storage::Liveness> {
        Ok(storage::Liveness::NoOtherOwner)
    }
    fn reconnect(&self) -> io::Result<()> {
        Ok(())
    }
    fn note(&self, _key: &str) -> io::Result<Option<String>> {
        Ok(None)
    }
    fn set_note(&self, _key: &str, _value: &str) -> io::Result<()> {
        Ok(())
    }
    fn on_resized_elsewhere(&self, changed: storage::SizeChanged) {
        *self.resized.lock() = Some(changed);
    }
}
