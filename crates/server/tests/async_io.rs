//! The completion-driven data path over real sockets, without Ceph: a RAM
//! backend that offers `AsyncIo` and completes every request on a thread
//! of its own, as librbd does. READ and WRITE go that way (and are counted),
//! everything else through the I/O pool, and the data is the same.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use bytes::Bytes;
use common::*;
use scsi::{LogicalUnit, LuConfig};
use storage::{AsyncIo, BlockBackend, MemBackend, ReadDone, WriteCache, WriteDone};

const LUN: &str = "[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"";

enum Job {
    Read(u64, usize, ReadDone),
    Write(u64, Bytes, WriteDone),
}

/// RAM, with a completion thread.
struct Completing {
    mem: Arc<MemBackend>,
    jobs: Mutex<mpsc::Sender<Job>>,
    reads: AtomicUsize,
    writes: AtomicUsize,
}

impl Completing {
    fn new(size: u64) -> Completing {
        let mem = Arc::new(MemBackend::new(size));
        let (tx, rx) = mpsc::channel::<Job>();
        let m = mem.clone();
        std::thread::spawn(move || {
            for j in rx {
                match j {
                    Job::Read(off, len, done) => done(m.read_bytes(off, len)),
                    Job::Write(off, data, done) => done(m.write_at(&data, off, true)),
                }
            }
        });
        Completing {
            mem,
            jobs: Mutex::new(tx),
            reads: AtomicUsize::new(0),
            writes: AtomicUsize::new(0),
        }
    }
}

impl AsyncIo for Completing {
    fn submit_read(&self, offset: u64, len: usize, done: ReadDone) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let _ = self.jobs.lock().unwrap().send(Job::Read(offset, len, done));
    }
    fn submit_write(&self, offset: u64, data: Bytes, _fua: bool, done: WriteDone) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .jobs
            .lock()
            .unwrap()
            .send(Job::Write(offset, data, done));
    }
}

impl BlockBackend for Completing {
    fn caps(&self) -> storage::Caps {
        storage::Caps {
            volatile: true,
            ..storage::Caps::new("completing", WriteCache::WriteThrough)
        }
    }
    fn fast(&self) -> Option<&dyn storage::FastPaths> {
        Some(self)
    }
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.mem.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> std::io::Result<()> {
        self.mem.write_at(buf, offset, fua)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn set_write_cache(&self, _: WriteCache) -> std::io::Result<()> {
        Ok(())
    }
}

/// Reads as the core calls do; writes and reads also complete on a
/// thread of their own.
impl storage::FastPaths for Completing {
    fn read_chain(&self, offset: u64, len: usize) -> std::io::Result<bufpool::Chain> {
        storage::read_chain(&*self.mem, offset, len)
    }
    fn async_io(&self) -> Option<&dyn AsyncIo> {
        Some(self)
    }
}

fn lu_config() -> LuConfig {
    LuConfig {
        block_size: 512,
        physical_block_size: None,
        naa: [0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
        serial: "ASYNC1".into(),
        vendor: "IRONSAN".into(),
        product: "ASYNC DISK".into(),
        revision: "0001".into(),
        read_only: false,
        thin: false,
        pr_state: None,
    }
}

#[test]
fn reads_and_writes_complete_from_the_backend_thread() {
    let backend = Arc::new(Completing::new(16 << 20));
    let b2 = backend.clone();
    let (tx, rx) = mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let th = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let cfg = config(LUN, "");
            // The same groups as the target's (one active/optimized per portal).
            let pg = Arc::new(scsi::PortGroups::new(cfg.port_groups(), false).unwrap());
            let s = server::Server::bind(cfg).await.unwrap();
            let lu = LogicalUnit::new(b2, lu_config())
                .unwrap()
                .with_port_groups(pg);
            s.control().install_lun(IQN, 1, Arc::new(lu)).unwrap();
            tx.send(s.local_addrs()).unwrap();
            s.run(async move {
                let _ = stop_rx.await;
            })
            .await;
        });
    });
    let a: Vec<std::net::SocketAddr> = rx.recv().unwrap();
    let mut c = Client::connect(a[0]);
    c.login_normal([0x80, 0, 0, 0, 0x61, 1], &[]);
    c.lun = 1;
    // The power-on unit attention goes through the I/O pool.
    let _ = c.command(&[0; 6], 0, false, &[], 0);
    for i in 0..32u32 {
        let data: Vec<u8> = (0..4096u32).map(|x| (x * 7 + i) as u8).collect();
        let (st, _, sense) = c.command(&rw10(0x2a, i * 8, 8), 4096, false, &data, 4096);
        assert_eq!(st, 0, "write {i}: {sense:02x?}");
        let (st, back, _) = c.command(&rw10(0x28, i * 8, 8), 4096, true, &[], 0);
        assert_eq!(st, 0);
        assert_eq!(back, data, "read {i}");
    }
    assert_eq!(backend.writes.load(Ordering::Relaxed), 32);
    assert_eq!(backend.reads.load(Ordering::Relaxed), 32);
    // Out of range: refused on the ordinary path with LBA OUT OF RANGE.
    let (st, _, sense) = c.command(&rw10(0x28, 32768, 1), 512, true, &[], 0);
    assert_eq!(st, 2);
    assert_eq!((sense[2] & 0x0f, sense[12]), (0x05, 0x21));
    assert_eq!(backend.reads.load(Ordering::Relaxed), 32);
    // VERIFY (not a fast command) sees what the fast writes wrote.
    let (st, _, _) = c.command(&rw10(0x2f, 0, 8), 0, false, &[], 0);
    assert_eq!(st, 0);
    drop(c);
    let _ = stop_tx.send(());
    th.join().unwrap();
}
