//! Backend failures become sense data and are never acknowledged: EIO on
//! read and write, ENOSPC, failing flushes, through storage's
//! FaultBackend.

use bufpool::WriteData;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use scsi::{status, Command, LogicalUnit, LuConfig, NexusId, Outcome};
use storage::{BlockBackend, FaultBackend, MemBackend};

const EIO: i32 = 5;
const ENOSPC: i32 = 28;

fn lu() -> (LogicalUnit, Arc<FaultBackend>) {
    let b = Arc::new(FaultBackend::new(Arc::new(MemBackend::new(1 << 20))));
    let cfg = LuConfig {
        block_size: 512,
        physical_block_size: None,
        naa: [0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
        serial: "FAULT1".into(),
        vendor: "IRONSAN".into(),
        product: "fault".into(),
        revision: "0.1".into(),
        read_only: false,
        thin: true,
        pr_state: None,
    };
    let lu = LogicalUnit::new(b.clone(), cfg).unwrap();
    // Clear the power-on unit attention.
    run(&lu, &[0; 6], &[]);
    (lu, b)
}

fn run(lu: &LogicalUnit, cdb: &[u8], data: &[u8]) -> Outcome {
    let data_out = WriteData::from(bufpool::Chain::from(bytes::Bytes::copy_from_slice(data)));
    lu.execute(&Command {
        cdb,
        data_out: &data_out,
        nexus: NexusId(1),
        relative_port: 1,
        tpg: 1,
        target_port_name: "iqn.2026-11.io.ironsan:f,t,0x0001",
        initiator_port_name: "iqn.2026-11.test:i,i,0x800000000001",
        expected_data_out: Some(data.len() as u32),
        lus: None,
    })
}

fn rw10(op: u8, flags: u8, lba: u32, n: u16) -> [u8; 10] {
    let mut c = [op, flags, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&n.to_be_bytes());
    c
}

#[track_caller]
fn check(o: &Outcome, key: u8, asc: u8) {
    assert_eq!(o.status, status::CHECK_CONDITION, "{o:?}");
    let s = o.sense.expect("sense").to_bytes();
    assert_eq!((s[2] & 0xf, s[12]), (key, asc), "{s:02x?}");
    assert!(o.data.is_empty(), "data returned with an error");
}

#[test]
fn eio_on_read_and_write_is_medium_error() {
    let (lu, b) = lu();
    let data = vec![0x5a; 1024];
    assert_eq!(run(&lu, &rw10(0x2a, 0, 8, 2), &data).status, 0);
    b.fail_reads(EIO);
    check(&run(&lu, &rw10(0x28, 0, 8, 2), &[]), 0x3, 0x11);
    b.fail_reads(0);
    b.fail_writes(EIO);
    let before = b.writes.load(Ordering::SeqCst);
    check(&run(&lu, &rw10(0x2a, 0, 8, 2), &[0xee; 1024]), 0x3, 0x0c);
    assert_eq!(
        b.writes.load(Ordering::SeqCst),
        before,
        "failed write reached the disk"
    );
    b.fail_writes(0);
    let o = run(&lu, &rw10(0x28, 0, 8, 2), &[]);
    assert_eq!(o.status, 0);
    assert_eq!(&o.data[..], &data[..], "the failed write changed data");
}

#[test]
fn enospc_is_space_allocation_failed() {
    let (lu, b) = lu();
    b.fail_writes(ENOSPC);
    check(&run(&lu, &rw10(0x2a, 0, 8, 1), &[1; 512]), 0x7, 0x27);
    // WRITE SAME and UNMAP fail the same way, never GOOD.
    let mut ws = [0u8; 16];
    ws[0] = 0x93;
    ws[13] = 4;
    assert_eq!(run(&lu, &ws, &[0; 512]).status, status::CHECK_CONDITION);
}

#[test]
fn failing_flush_is_never_acknowledged() {
    let (lu, b) = lu();
    b.fail_flushes(EIO);
    // SYNCHRONIZE CACHE(10).
    let o = run(&lu, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(o.status, status::CHECK_CONDITION, "{o:?}");
    assert_eq!(o.sense.unwrap().to_bytes()[2] & 0xf, 0x3);
    // A FUA write, and (the LU is write-through) any write, needs the sync.
    let o = run(&lu, &rw10(0x2a, 0x08, 16, 1), &[2; 512]);
    assert_eq!(o.status, status::CHECK_CONDITION, "FUA write acknowledged");
    if b.caps().write_cache == storage::WriteCache::WriteThrough {
        let o = run(&lu, &rw10(0x2a, 0, 16, 1), &[2; 512]);
        assert_eq!(
            o.status,
            status::CHECK_CONDITION,
            "write-through write acknowledged"
        );
    }
    b.fail_flushes(0);
    assert_eq!(run(&lu, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]).status, 0);
}
