//! Writes received in place (`LogicalUnit::place_write`, `scsi::fast`): a
//! file LU in memory gives a WRITE's place on the medium only when
//! `execute` would have accepted the command, the bytes received there
//! (by `pwrite` and by the kernel reading a socket into the mapping) are
//! what reads return, and anything that would refuse the write, or make
//! placing it unsafe, means no place.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use bufpool::WriteData;
use bytes::BufMut;
use scsi::{status, Command, LogicalUnit, LuConfig, NexusId, Outcome};
use storage::{BlockBackend, FileBackend, MemBackend, WriteCache};

const SIZE: usize = 4 << 20;

fn config(read_only: bool) -> LuConfig {
    LuConfig {
        block_size: 512,
        physical_block_size: None,
        naa: [0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16],
        serial: "PLACED1".into(),
        vendor: "IRONSAN".into(),
        product: "placed".into(),
        revision: "0.1".into(),
        read_only,
        thin: true,
        pr_state: None,
    }
}

/// A file LU on /dev/shm whose first half is written (resident) and whose
/// second half is a hole; `None` where there is no /dev/shm.
fn file_lu(read_only: bool) -> Option<(tempfile::TempDir, std::path::PathBuf, LogicalUnit)> {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        return None;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let path = dir.path().join("placed.img");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(SIZE as u64).unwrap();
    (&f).write_all(&vec![0x11u8; SIZE / 2]).unwrap();
    let b = FileBackend::open(&path, None, WriteCache::WriteThrough).unwrap();
    let lu = LogicalUnit::new(Arc::new(b), config(read_only)).unwrap();
    Some((dir, path, lu))
}

fn cmd<'a>(cdb: &'a [u8], data: &'a WriteData, nexus: u64) -> Command<'a> {
    Command {
        cdb,
        data_out: data,
        nexus: NexusId(nexus),
        relative_port: 1,
        tpg: 1,
        target_port_name: "iqn.2026-11.io.ironsan:p,t,0x0001",
        initiator_port_name: if nexus == 1 {
            "iqn.2026-11.test:i,i,0x800000000001"
        } else {
            "iqn.2026-11.test:j,i,0x800000000002"
        },
        expected_data_out: Some(data.len() as u32),
        lus: None,
    }
}

fn run(lu: &LogicalUnit, cdb: &[u8], data: &[u8], nexus: u64) -> Outcome {
    let data = WriteData::from(bufpool::Chain::from(bytes::Bytes::copy_from_slice(data)));
    lu.execute(&cmd(cdb, &data, nexus))
}

fn rw10(op: u8, flags: u8, lba: u32, n: u16) -> [u8; 10] {
    let mut c = [op, flags, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&n.to_be_bytes());
    c
}

fn write16(lba: u64, n: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x8a;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&n.to_be_bytes());
    c
}

fn read_back(lu: &LogicalUnit, lba: u32, n: u16) -> Vec<u8> {
    let o = run(lu, &rw10(0x28, 0, lba, n), &[], 1);
    assert_eq!(o.status, status::GOOD, "{o:?}");
    let mut v = o.data.to_vec();
    o.more.iter().for_each(|b| v.extend_from_slice(b));
    v
}

/// Clears the power-on unit attention of nexus 1.
fn quiet(lu: &LogicalUnit) {
    run(lu, &[0; 6], &[], 1);
}

#[test]
#[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
fn bytes_received_in_place_are_what_reads_return() {
    let (_dir, path, lu) = file_lu(false).expect("/dev/shm");
    quiet(&lu);
    let data: Vec<u8> = (0..256 * 1024u32).map(|i| ((i * 31) >> 3) as u8).collect();
    // WRITE(16) at LBA 100, 256 KiB: the first 1000 bytes as a driver puts
    // what came with the header, the rest read from a socket by the kernel.
    let cdb = write16(100, 512);
    let mut p = lu
        .place_write(&cmd(&cdb, &WriteData::None, 1), data.len())
        .expect("placed");
    p.put_slice(&data[..1000]);
    let (mut tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
    let rest = data[1000..].to_vec();
    let sender = std::thread::spawn(move || tx.write_all(&rest).unwrap());
    while p.remaining_mut() > 0 {
        let c = p.chunk_mut();
        // SAFETY: read(2) into the chunk: the kernel writes it.
        let n = unsafe { libc::read(rx.as_raw_fd(), c.as_mut_ptr().cast(), c.len()) };
        assert!(n > 0);
        // SAFETY: read(2) wrote `n` bytes there.
        unsafe { p.advance_mut(n as usize) };
    }
    sender.join().unwrap();
    let o = lu.finish_placed(&cdb, p);
    assert_eq!(o.status, status::GOOD, "{o:?}");
    assert_eq!(read_back(&lu, 100, 512), data);
    let file = std::fs::read(&path).unwrap();
    assert!(file[100 * 512..100 * 512 + data.len()] == data[..]);
    assert!(
        file[..100 * 512].iter().all(|&b| b == 0x11),
        "nothing before"
    );
    assert_eq!(file[100 * 512 + data.len()], 0x11, "nothing after");

    // WRITE(10) with FUA on the write-through unit: GOOD, and the range
    // lock is free again (a COMPARE AND WRITE over it runs).
    let cdb = rw10(0x2a, 0x08, 0, 128);
    let mut p = lu
        .place_write(&cmd(&cdb, &WriteData::None, 1), 65536)
        .expect("placed");
    p.put_slice(&[0x22; 65536]);
    assert_eq!(lu.finish_placed(&cdb, p).status, status::GOOD);
    assert!(read_back(&lu, 0, 128).iter().all(|&b| b == 0x22));
}

#[test]
#[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
fn no_place_where_execute_would_refuse_or_placing_is_unsafe() {
    let (_dir, _path, lu) = file_lu(false).expect("/dev/shm");
    let place = |cdb: &[u8], len: usize, nexus: u64| {
        lu.place_write(&cmd(cdb, &WriteData::None, nexus), len)
    };
    // A unit attention pending (power on): execute reports it first.
    assert!(place(&rw10(0x2a, 0, 0, 128), 65536, 1).is_none());
    quiet(&lu);
    assert!(place(&rw10(0x2a, 0, 0, 128), 65536, 1).is_some());
    // Not a plain WRITE(10/16), or not exactly its data.
    assert!(place(&rw10(0x28, 0, 0, 128), 65536, 1).is_none(), "READ");
    assert!(
        place(&rw10(0x2e, 0, 0, 128), 65536, 1).is_none(),
        "WRITE AND VERIFY"
    );
    assert!(
        place(&rw10(0x2a, 0, 0, 128), 65536 - 512, 1).is_none(),
        "short"
    );
    assert!(place(&rw10(0x2a, 0, 0, 0), 0, 1).is_none(), "empty");
    assert!(
        place(&rw10(0x2a, 0x20, 0, 128), 65536, 1).is_none(),
        "WRPROTECT"
    );
    let blocks = (SIZE / 512) as u32;
    assert!(
        place(&rw10(0x2a, 0, blocks - 64, 128), 65536, 1).is_none(),
        "past the end"
    );
    assert!(
        place(&rw10(0x2a, 0x04, 0, 128), 65536, 1).is_some(),
        "DPO is fine"
    );
    // A hole: receiving into it would allocate the page in the kernel's
    // copy; it goes by pwrite instead.
    let hole = (SIZE / 2 / 512) as u32;
    assert!(place(&rw10(0x2a, 0, hole, 128), 65536, 1).is_none(), "hole");
    assert!(place(&rw10(0x2a, 0, hole - 128, 128), 65536, 1).is_some());
    assert!(
        place(&rw10(0x2a, 0, hole - 64, 128), 65536, 1).is_none(),
        "half a hole"
    );

    // A reservation another nexus holds (WRITE EXCLUSIVE): refused.
    run(&lu, &[0; 6], &[], 2);
    let mut reg = [0u8; 24];
    reg[8..16].copy_from_slice(&7u64.to_be_bytes());
    let pr_out = |sa: u8, ty: u8| [0x5f, sa, ty, 0, 0, 0, 0, 0, 24, 0];
    assert_eq!(run(&lu, &pr_out(0, 0), &reg, 2).status, status::GOOD);
    let mut res = [0u8; 24];
    res[..8].copy_from_slice(&7u64.to_be_bytes());
    assert_eq!(run(&lu, &pr_out(1, 1), &res, 2).status, status::GOOD);
    assert_eq!(
        run(&lu, &rw10(0x2a, 0, 0, 1), &[0; 512], 1).status,
        status::RESERVATION_CONFLICT
    );
    assert!(
        place(&rw10(0x2a, 0, 0, 128), 65536, 1).is_none(),
        "reserved"
    );
    assert!(
        place(&rw10(0x2a, 0, 0, 128), 65536, 2).is_some(),
        "the holder"
    );
    assert_eq!(run(&lu, &pr_out(2, 1), &res, 2).status, status::GOOD);
    assert!(
        place(&rw10(0x2a, 0, 0, 128), 65536, 1).is_some(),
        "released"
    );

    // Once COMPARE AND WRITE has run on the unit, never again.
    let mut caw = [0u8; 16];
    caw[0] = 0x89;
    caw[13] = 1;
    let old = read_back(&lu, 2000, 1);
    let mut both = old.clone();
    both.extend_from_slice(&[0x33; 512]);
    assert_eq!(
        run(&lu, &caw_at(&mut caw, 2000), &both, 1).status,
        status::GOOD
    );
    assert!(
        place(&rw10(0x2a, 0, 0, 128), 65536, 1).is_none(),
        "after CAW"
    );
}

fn caw_at(cdb: &mut [u8; 16], lba: u64) -> [u8; 16] {
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    *cdb
}

#[test]
#[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
fn read_only_units_and_memory_units_give_no_place() {
    let (_dir, _path, lu) = file_lu(true).expect("/dev/shm");
    quiet(&lu);
    assert!(lu
        .place_write(&cmd(&rw10(0x2a, 0, 0, 128), &WriteData::None, 1), 65536)
        .is_none());
    let mem: Arc<dyn BlockBackend> = Arc::new(MemBackend::new(SIZE as u64));
    let lu = LogicalUnit::new(mem, config(false)).unwrap();
    quiet(&lu);
    assert_eq!(
        run(&lu, &rw10(0x2a, 0, 0, 1), &[1; 512], 1).status,
        status::GOOD
    );
    assert!(lu
        .place_write(&cmd(&rw10(0x2a, 0, 0, 128), &WriteData::None, 1), 65536)
        .is_none());
}
