//! Heap allocations per I/O on the target's data path, counted by a global
//! allocator: the target's session state machine, SCSI execution on a RAM
//! LU (and on a file LU on /dev/shm, whose small reads are copied out of
//! its mapping) and the send queue, driven in a loop by the initiator state
//! machine (no sockets). Only allocations made inside the target's calls
//! are counted. Run: `cargo bench -p server --bench alloc_per_io`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use iscsi_proto::initiator::{
    DataDir, InitiatorEvent, InitiatorLogin, InitiatorSession, LoginConfig, LoginProgress,
};
use iscsi_proto::login::{LoginStep, TargetDirectory, TargetInfo, TargetLogin};
use iscsi_proto::params::Limits;
use iscsi_proto::session::{Completion, Event, Host, Session, TmfAction};
use iscsi_wire::frame::{frame_len, split_pdu, FrameLimits};
use iscsi_wire::pdu::{Itt, Lun};
use iscsi_wire::{Outbox, Sn};
use scsi::{LogicalUnit, LuConfig, NexusId};
use storage::MemBackend;

struct Counting;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: defers to the system allocator; the counters are thread-local
// cells initialised without allocating.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ON.with(Cell::get) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if ON.with(Cell::get) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn counted<T>(f: impl FnOnce() -> T) -> T {
    ON.with(|o| o.set(true));
    let r = f();
    ON.with(|o| o.set(false));
    r
}

struct T {
    lu: Arc<LogicalUnit>,
}

impl TargetDirectory for T {
    fn find(&self, name: &str, _i: &str) -> Option<TargetInfo> {
        Some(TargetInfo {
            name: name.into(),
            alias: None,
            tpgt: 1,
        })
    }
}

impl Host for T {
    fn send_targets(&self, _i: &str, _v: &str, _s: Option<&str>) -> Vec<u8> {
        Vec::new()
    }
    fn lun_exists(&self, lun: Lun) -> bool {
        lun.index() == Some(0)
    }
    fn data_out_len(&self, _lun: Lun, cdb: &[u8]) -> u32 {
        self.lu.plan(cdb).data_out
    }
    fn reset(&self, _a: TmfAction) {}
}

fn frames(out: &mut Outbox, lim: &FrameLimits) -> Vec<iscsi_wire::RawPdu> {
    let mut buf = BytesMut::from(&out.to_vec()[..]);
    out.advance(out.len());
    let mut v = Vec::new();
    while let Some(n) = frame_len(&buf, lim).unwrap() {
        v.push(split_pdu(&mut buf, n, lim).unwrap());
    }
    v
}

fn main() {
    let ram = [
        READ_4K,
        WRITE_4K,
        ("1 MiB WRITE(10), R2Ts, landed", true, 2048),
    ];
    let mut worst = run("RAM LU", Arc::new(MemBackend::new(64 << 20)), &ram);
    // Written first, so that the reads find pages the LU knows are there.
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        let dir = tempfile::tempdir_in(shm).unwrap();
        let file = storage::FileBackend::open(
            &dir.path().join("lun"),
            Some(64 << 20),
            storage::WriteCache::WriteThrough,
        )
        .unwrap();
        let cases = [WRITE_4K, READ_4K];
        worst = worst.max(run("file LU on /dev/shm", Arc::new(file), &cases));
    }
    // Amortised growth of long-lived buffers may show as a handful in
    // 20000 I/Os; anything near one per hundred I/Os is a regression.
    if worst * 100 > 20_000 {
        eprintln!("the data path allocates in steady state");
        std::process::exit(1);
    }
}

/// One measured workload: its name, whether it writes, and its length in
/// 512-byte blocks.
type Case = (&'static str, bool, u16);

const READ_4K: Case = ("4 KiB READ(10)", false, 8);
const WRITE_4K: Case = ("4 KiB WRITE(10)", true, 8);

/// Runs `cases` against an LU on `backend`; the most allocations any small
/// case made in its steady state (large writes are checked here).
fn run(label: &str, backend: Arc<dyn storage::BlockBackend>, cases: &[Case]) -> u64 {
    let cfg = LuConfig {
        block_size: 512,
        physical_block_size: None,
        naa: [0x60; 16],
        serial: "ALLOC".into(),
        vendor: "IRONSAN".into(),
        product: "RAM DISK".into(),
        revision: "0001".into(),
        read_only: false,
        thin: true,
        pr_state: None,
    };
    let host = T {
        lu: Arc::new(LogicalUnit::new(backend, cfg).unwrap()),
    };
    let limits = Limits::default();
    let mut il = InitiatorLogin::new(
        LoginConfig::new("iqn.i", Some("iqn.t"), [0x80, 0, 0, 0, 0, 1]),
        Sn(1),
        Itt(0),
    );
    let mut tl = TargetLogin::new(limits.clone(), 1);
    let (req, text) = il.start();
    let LoginStep::Complete {
        resp,
        text: rt,
        outcome,
    } = tl.handle(&req, &text, &host)
    else {
        panic!("login")
    };
    let LoginProgress::Done(n) = il.handle(&resp, &rt).unwrap() else {
        panic!("login")
    };
    let mut ini = InitiatorSession::new(n.params.clone(), n.cmd_sn, n.exp_stat_sn, n.max_cmd_sn);
    let mut tgt = Session::new(
        outcome.params.clone(),
        limits,
        outcome.exp_cmd_sn,
        outcome.next_stat_sn,
    );
    let lim = FrameLimits {
        header_digest: false,
        data_digest: false,
        max_data_segment: 1 << 24,
    };
    let payload = Bytes::from(vec![0x5au8; 4096]);
    let big = Bytes::from(vec![0xa5u8; 1 << 20]);

    let mut worst = 0u64;
    for &(name, write, blocks) in cases {
        let mut total = 0u64;
        let rounds = 20_000u64;
        let mut tout = Outbox::new();
        let mut iout = Outbox::new();
        let mut events = Vec::new();
        let mut ievents = Vec::new();
        for i in 0..rounds + 1000 {
            // Large writes chunk-aligned: whole-chunk writes, which the
            // RAM LU stores into the chunks it holds.
            let span = if blocks > 8 { 98_304 } else { 100_000 };
            let lba = (i * u64::from(blocks) % span) as u32;
            let mut cdb = [0u8; 10];
            cdb[0] = if write { 0x2a } else { 0x28 };
            cdb[2..6].copy_from_slice(&lba.to_be_bytes());
            cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
            let dir = match (write, blocks) {
                (true, 8) => DataDir::Write(payload.clone()),
                (true, _) => DataDir::Write(big.clone()),
                _ => DataDir::Read(4096),
            };
            ini.submit(Lun::default(), &cdb, dir, &mut iout);
            COUNT.with(|c| c.set(0));
            // Until the status: R2Ts go back and forth.
            loop {
                let pdus = frames(&mut iout, &lim);
                // The target's side of one I/O: handle the PDU, execute, respond.
                counted(|| {
                    for mut p in pdus {
                        // What the driver does with a large segment.
                        if let Some(mut b) = tgt.landing(&p.bhs, &host) {
                            bytes::BufMut::put_slice(&mut b, &p.data);
                            p.data = Bytes::new();
                            p.landed = Some(b);
                        }
                        tgt.handle_pdu(p, &host, &mut tout, &mut events);
                    }
                    for e in events.drain(..) {
                        if let Event::Execute(r) = e {
                            let cmd = scsi::Command {
                                cdb: r.cdb.as_slice(),
                                data_out: &r.data_out,
                                nexus: NexusId(1),
                                relative_port: 1,
                                tpg: 1,
                                target_port_name: "iqn.t,t,0x0001",
                                initiator_port_name: "iqn.i,i,0x800000000001",
                                expected_data_out: Some(r.edtl),
                                lus: None,
                            };
                            let o = host.lu.execute(&cmd);
                            let c = Completion {
                                status: o.status,
                                sense: o.sense.map(|s| Bytes::from(s.to_bytes())),
                                data_in: bufpool::Chain::from_parts(o.data, o.more),
                                data_out_wanted: r.cdb_data_out,
                            };
                            tgt.complete(r.itt, c, &mut tout);
                            if let Some(c) = r.data_out.into_chain() {
                                let (first, rest) = c.into_parts();
                                bufpool::give(first);
                                rest.into_iter().for_each(bufpool::give);
                            }
                        }
                    }
                });
                // Sending: the iovecs a vectored write would take (counted),
                // copied out for the initiator (not counted).
                let mut wire = Vec::new();
                ON.with(|o| o.set(true));
                let mut iov = [std::io::IoSlice::new(&[]); iscsi_wire::outbox::MAX_IOVECS];
                let k = tout.io_slices(&mut iov);
                ON.with(|o| o.set(false));
                for s in &iov[..k] {
                    wire.extend_from_slice(s);
                }
                counted(|| tout.advance(wire.len()));
                let mut buf = BytesMut::from(&wire[..]);
                while let Some(n) = frame_len(&buf, &lim).unwrap() {
                    ini.handle_pdu(
                        split_pdu(&mut buf, n, &lim).unwrap(),
                        &mut iout,
                        &mut ievents,
                    );
                }
                if let Some(e) = ievents.pop() {
                    assert!(matches!(e, InitiatorEvent::Done(_, r) if r.status == Some(0)));
                    break;
                }
            }
            if i >= 1000 {
                total += COUNT.with(Cell::get);
            }
        }
        println!(
            "{label}, {name}: {:.3} heap allocations per I/O on the target path ({total} in {rounds} I/Os, steady state)",
            total as f64 / rounds as f64
        );
        // A large write solicited by R2T reuses its session's spare write
        // state and R2T queue, its landing buffer comes from the pool, and
        // the RAM LU stores it into the chunk it holds: nothing either.
        worst = worst.max(total);
    }
    worst
}
