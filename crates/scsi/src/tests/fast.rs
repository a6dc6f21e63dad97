//! The completion-driven READ/WRITE split ([`crate::fast`]): admitted only
//! when `execute` would go straight to the backend, and finishing with the
//! same outcome.

use bytes::Bytes;

use super::*;
use crate::FastKind;

fn admit(lu: &LogicalUnit, cdb: &[u8], data: &Bytes) -> Option<crate::FastIo> {
    lu.admit_fast(&cmd(
        cdb,
        &WriteData::from(bufpool::Chain::from(data.clone())),
        N1,
    ))
}

/// A unit whose nexus N1 has seen its power-on unit attention.
fn quiet(lu: &LogicalUnit) {
    let _ = run(lu, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], &[]);
    good(&run(lu, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], &[]));
}

#[test]
fn plain_reads_and_writes_are_admitted() {
    let lu = mem_lu();
    quiet(&lu);
    let none = Bytes::new();
    let io = admit(&lu, &read10(8, 2), &none).expect("a READ(10)");
    assert_eq!(
        (io.offset, io.len, io.kind.clone()),
        (8 * 512, 1024, FastKind::Read)
    );
    let data = Bytes::from(pattern(1024, 7));
    let io = admit(&lu, &cdb16(op::WRITE_16, 0x08, 4, 2), &data).expect("a WRITE(16) FUA");
    assert_eq!(
        io.kind,
        FastKind::Write {
            data: data.clone(),
            fua: true
        }
    );
    good(&lu.finish_fast(io, Ok(Bytes::new())));
    let io = admit(&lu, &read10(8, 2), &none).unwrap();
    let o = lu.finish_fast(io, Ok(data.clone()));
    good(&o);
    assert_eq!(o.data, data);
}

#[test]
fn anything_else_takes_the_ordinary_path() {
    let lu = mem_lu();
    let none = Bytes::new();
    // The power-on unit attention is still pending for N1.
    assert!(admit(&lu, &read10(0, 1), &none).is_none());
    quiet(&lu);
    assert!(admit(&lu, &read10(0, 1), &none).is_some());
    // Other opcodes, the 6/12-byte forms, zero length, out of range,
    // protection bits, NACA, a short data-out.
    assert!(admit(&lu, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], &none).is_none());
    assert!(admit(&lu, &cdb12(op::READ_12, 0, 0, 1), &none).is_none());
    assert!(admit(&lu, &read10(0, 0), &none).is_none());
    assert!(admit(&lu, &read10(BLOCKS as u32, 1), &none).is_none());
    assert!(admit(&lu, &cdb10(op::READ_10, 0x20, 0, 1), &none).is_none());
    let mut naca = read10(0, 1);
    naca[9] = 0x04;
    assert!(admit(&lu, &naca, &none).is_none());
    let short = Bytes::from(vec![0u8; 512]);
    assert!(admit(&lu, &write10(0, 2), &short).is_none());
    // An exclusive holder (COMPARE AND WRITE) on the range: no waiting.
    let x = lu.vol.locks().exclusive(0, 1);
    assert!(admit(&lu, &read10(0, 1), &none).is_none());
    assert!(
        admit(&lu, &read10(4096 - 1, 1), &none).is_some(),
        "another region"
    );
    drop(x);
    assert!(admit(&lu, &read10(0, 1), &none).is_some());
    // Write protect.
    let mut c = cfg();
    c.read_only = true;
    let ro = LogicalUnit::new(Arc::new(MemBackend::new(BLOCKS * 512)), c).unwrap();
    quiet(&ro);
    assert!(admit(&ro, &write10(0, 1), &short).is_none());
    assert!(admit(&ro, &read10(0, 1), &none).is_some());
}

#[test]
fn backend_errors_finish_as_execute_reports_them() {
    let lu = mem_lu();
    quiet(&lu);
    let none = Bytes::new();
    let eio = || io::Error::other("boom");
    let io = admit(&lu, &read10(0, 1), &none).unwrap();
    sense(
        &lu.finish_fast(io, Err(eio())),
        SenseKey::MediumError,
        Asc::UNRECOVERED_READ_ERROR,
    );
    let d = Bytes::from(vec![1u8; 512]);
    let io = admit(&lu, &write10(0, 1), &d).unwrap();
    sense(
        &lu.finish_fast(io, Err(eio())),
        SenseKey::MediumError,
        Asc::WRITE_ERROR,
    );
    // The range lock went with the command.
    drop(lu.vol.locks().exclusive(0, BLOCKS));
}

/// A unit over a file in /dev/shm (which can be spliced); `None` without
/// /dev/shm. The file is unlinked at once.
fn shm_lu() -> Option<LogicalUnit> {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        return None;
    }
    let p = shm.join(format!(
        "scsi-zc-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let size = BLOCKS * u64::from(BS);
    let b = storage::FileBackend::open(&p, Some(size), storage::WriteCache::WriteBack).unwrap();
    let _ = std::fs::remove_file(&p);
    Some(LogicalUnit::new(Arc::new(b), cfg()).unwrap())
}

#[test]
#[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
fn large_reads_of_a_file_in_memory_are_zero_copy_until_an_exclusive_command() {
    let lu = shm_lu().expect("/dev/shm");
    quiet(&lu);
    let none = WriteData::None;
    let blocks = (crate::ZERO_COPY_MIN / BS as usize) as u16;
    let data = pattern(crate::ZERO_COPY_MIN, 3);
    good(&run(&lu, &write10(16, blocks), &data));
    let zc = |cdb: &[u8]| lu.zero_copy_read(&cmd(cdb, &none, N1));
    let r = zc(&read10(16, blocks)).expect("a large READ(10)");
    assert_eq!((r.offset(), r.len()), (16 * 512, crate::ZERO_COPY_MIN));
    assert_eq!(&r.read(bytes::BytesMut::new()).unwrap()[..], &data[..]);
    assert!(zc(&cdb16(op::READ_16, 0, 16, u32::from(blocks))).is_some());
    // Small, 6/12-byte forms, writes, out of range, protection: not here.
    assert!(zc(&read10(16, blocks - 1)).is_none());
    assert!(zc(&cdb12(op::READ_12, 0, 16, u32::from(blocks))).is_none());
    assert!(zc(&write10(16, blocks)).is_none());
    assert!(zc(&read10(BLOCKS as u32 - 1, blocks)).is_none());
    assert!(zc(&cdb10(op::READ_10, 0x20, 16, blocks)).is_none());
    // A RAM unit shares its memory instead.
    let mem = mem_lu();
    quiet(&mem);
    assert!(mem
        .zero_copy_read(&cmd(&read10(16, blocks), &none, N1))
        .is_none());
    // The first COMPARE AND WRITE switches zero-copy off for good.
    let bs = BS as usize;
    let old = pattern(bs, 3);
    let mut caw = [0u8; 16];
    caw[0] = 0x89;
    caw[2..10].copy_from_slice(&16u64.to_be_bytes());
    caw[13] = 1;
    let both = [old.clone(), pattern(bs, 9)].concat();
    good(&run(&lu, &caw, &both));
    assert!(zc(&read10(16, blocks)).is_none());
    good(&run(&lu, &read10(16, blocks), &[]));
}

#[test]
#[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
fn large_writes_to_a_file_in_memory_run_off_the_event_loop() {
    let lu = shm_lu().expect("/dev/shm");
    let (small, one_mib, large) = (4096, 1 << 20, 4 << 20);
    assert!(!lu.runs_off_loop(&write10(0, 8), small));
    assert!(!lu.runs_off_loop(&write10(0, 2048), one_mib));
    assert!(lu.runs_off_loop(&write10(0, 8192), large));
    // Reads carry no data-out; EXTENDED COPY always goes off the loop.
    assert!(!lu.runs_off_loop(&read10(0, 2048), 0));
    assert!(lu.runs_off_loop(&[op::EXTENDED_COPY], 0));
    // The RAM unit keeps the received buffer: nothing to copy.
    assert!(!mem_lu().runs_off_loop(&write10(0, 8192), large));
}
