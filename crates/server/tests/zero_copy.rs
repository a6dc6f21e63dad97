//! Zero-copy reads of a file LUN in memory (`scsi::fast`, `sendfile` in
//! `conn`): the bytes that arrive are the file's, in their place in the
//! stream, with and without digests, for any segment size; a file that
//! shrinks under a read never yields GOOD status with short or made-up
//! data; and under data digests (computed over the file's pages in place,
//! `iscsi_wire::outbox`, or folded from a RAM LUN's cached block CRCs,
//! `filemap::BlockSums`), writes from another session racing the reads
//! never make a digest wrong.

mod common;

use std::time::Duration;

use common::*;
use initiator::{scsi, Connection, DataDir, LoginConfig};

/// A file LUN of `size` bytes in /dev/shm filled with a pattern; `None`
/// where there is no /dev/shm.
fn shm_lun(size: usize) -> Option<(tempfile::TempDir, std::path::PathBuf, Vec<u8>)> {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        return None;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let path = dir.path().join("zc.img");
    let data: Vec<u8> = (0..size as u64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&path, &data).unwrap();
    Some((dir, path, data))
}

fn lun_config(path: &std::path::Path, size: usize) -> String {
    format!(
        "[[target.lun]]\nbackend = \"file\"\npath = \"{}\"\nsize = \"{}\"",
        path.display(),
        size
    )
}

fn read16(lba: u64, blocks: u32) -> Vec<u8> {
    let mut c = vec![0x88u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

#[test]
#[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
fn large_reads_carry_the_files_bytes_with_and_without_digests() {
    const SIZE: usize = 8 << 20;
    let (_dir, path, data) = shm_lun(SIZE).expect("/dev/shm");
    let (addrs, _stop) = start(config(&lun_config(&path, SIZE), ""));
    for (hd, dd, seg) in [
        (false, false, 262_144),
        (true, false, 8192),
        (false, false, 65_536 + 512),
        (true, true, 262_144),
        (false, true, 8192),
    ] {
        let mut cfg = LoginConfig::new("iqn.2026-11.x:zc", Some(IQN), initiator::random_isid());
        cfg.header_digest = hd;
        cfg.data_digest = dd;
        cfg.max_recv_data_segment = seg;
        let mut c = Connection::login(&addrs[0].to_string(), cfg).unwrap();
        // One at a time, at odd places and sizes (small ones copy).
        for (lba, blocks) in [(0u64, 2048u32), (7, 129), (1000, 8), (16383 - 300, 300)] {
            let r = c
                .execute(0, &read16(lba, blocks), DataDir::Read(blocks * 512))
                .unwrap();
            assert_eq!(r.status, Some(0), "hd {hd} dd {dd} seg {seg}");
            let at = lba as usize * 512;
            assert!(
                r.data[..] == data[at..at + blocks as usize * 512],
                "lba {lba} blocks {blocks} hd {hd} dd {dd} seg {seg}"
            );
        }
        // Many in flight, mixing sizes, so that file ranges and copied
        // segments interleave in one batch of output.
        let mut want = std::collections::HashMap::new();
        for i in 0..24u64 {
            let (lba, blocks) = if i % 3 == 0 {
                (i * 11, 8)
            } else {
                (i * 333, 512)
            };
            let itt = c.submit(0, &read16(lba, blocks), DataDir::Read(blocks * 512));
            want.insert(itt, (lba as usize * 512, blocks as usize * 512));
        }
        c.flush().unwrap();
        let mut done = Vec::new();
        while done.len() < want.len() {
            c.wait(&mut done).unwrap();
        }
        for (itt, r) in done {
            let (at, n) = want[&itt];
            assert_eq!(r.status, Some(0));
            assert!(r.data[..] == data[at..at + n], "at {at} n {n}");
        }
        // Reads see completed writes.
        let fresh = vec![0xa5u8; 128 * 1024];
        let w = c
            .execute(
                0,
                &scsi::rw10(true, 64, 256),
                DataDir::Write(fresh.clone().into()),
            )
            .unwrap();
        assert_eq!(w.status, Some(0));
        let r = c
            .execute(0, &read16(64, 256), DataDir::Read(128 * 1024))
            .unwrap();
        assert!(r.data[..] == fresh[..]);
        let at = 64 * 512;
        // Put back by another program's write, which does not pass the
        // file's gate: the next round's digests must not be folded from
        // block CRCs recorded before it (`filemap::FileSums::check`).
        std::fs::write(&path, &data).unwrap();
        assert_eq!(std::fs::read(&path).unwrap()[at], data[at]);
    }
}

#[test]
#[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
fn a_file_shrunk_under_a_read_never_answers_good_with_short_data() {
    const SIZE: usize = 4 << 20;
    let (_dir, path, _data) = shm_lun(SIZE).expect("/dev/shm");
    let (addrs, _stop) = start(config(&lun_config(&path, SIZE), ""));
    let mut c = Client::connect(addrs[0]);
    c.login_normal(
        [0x80, 0, 0, 0, 0x2c, 1],
        &[("MaxRecvDataSegmentLength", "262144")],
    );
    // The file loses its second half behind the target's back.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(SIZE as u64 / 2)
        .unwrap();
    // 1 MiB straddling the new end: CHECK CONDITION, or the connection
    // drops; never GOOD.
    let itt = c.cmd(
        &rw10(0x28, (SIZE / 2 / 512 - 1024) as u32, 2048),
        1 << 20,
        true,
        false,
        true,
        &[],
    );
    let mut got = 0usize;
    loop {
        let Some(p) = c.recv_within(Duration::from_secs(5)) else {
            break; // closed: the initiator will retry elsewhere
        };
        match iscsi_wire::pdu::Pdu::parse(&p.bhs) {
            iscsi_wire::pdu::Pdu::DataIn(d) => {
                assert_eq!(d.itt, itt);
                got += p.data.len();
                if let Some(st) = d.status {
                    assert_ne!(st, 0, "GOOD with {got} bytes from a shrunk file");
                    break;
                }
            }
            iscsi_wire::pdu::Pdu::ScsiResponse(s) => {
                assert_ne!(s.status, 0, "GOOD from a shrunk file");
                break;
            }
            p => panic!("unexpected {p:?}"),
        }
    }
}

#[test]
#[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
fn a_slow_reader_gets_every_byte_in_order() {
    const SIZE: usize = 32 << 20;
    let (_dir, path, data) = shm_lun(SIZE).expect("/dev/shm");
    let (addrs, _stop) = start(config(&lun_config(&path, SIZE), ""));
    let mut c = Client::connect(addrs[0]);
    c.login_normal(
        [0x80, 0, 0, 0, 0x2c, 2],
        &[("MaxRecvDataSegmentLength", "65536")],
    );
    // 24 MiB of reads queued at once: far more than the socket buffers
    // hold, so sendfile meets a full socket (EAGAIN, short sends) again
    // and again while this side reads in small, slow pieces.
    let mut itts = Vec::new();
    for i in 0..24u32 {
        let lba = i * 2048 + (i % 3) * 7;
        let itt = c.cmd(&rw10(0x28, lba, 2048), 1 << 20, true, false, true, &[]);
        itts.push((itt, lba as usize * 512));
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut got: std::collections::HashMap<u32, Vec<u8>> = Default::default();
    let mut done = 0;
    let mut slow = 0u32;
    while done < itts.len() {
        if slow < 200 {
            slow += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        let p = c.recv().expect("connection stays up");
        match iscsi_wire::pdu::Pdu::parse(&p.bhs) {
            iscsi_wire::pdu::Pdu::DataIn(d) => {
                let buf = got.entry(d.itt.0).or_default();
                assert_eq!(d.buffer_offset as usize, buf.len());
                buf.extend_from_slice(&p.data);
                if let Some(st) = d.status {
                    assert_eq!(st, 0);
                    done += 1;
                }
            }
            p => panic!("unexpected {p:?}"),
        }
    }
    for (itt, at) in itts {
        let b = &got[&itt.0];
        assert!(b[..] == data[at..at + (1 << 20)], "read at {at}");
    }
}

/// Byte `off` of the LUN as written by version `v` of the racing writer
/// (version 0: the file as created). The version is recoverable from any
/// single byte.
fn versioned(off: usize, v: u8) -> u8 {
    ((off as u64).wrapping_mul(2_654_435_761) >> 13) as u8 ^ v
}

const RACE_SIZE: usize = 8 << 20;
/// The racing reads and writes stay below this.
const SPAN: usize = 4 << 20;

/// A WRITE(16) of `bytes` at byte `at`, which must answer GOOD.
fn write_at(c: &mut Connection, at: usize, bytes: Vec<u8>) {
    let mut cdb = vec![0x8au8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    cdb[2..10].copy_from_slice(&((at / 512) as u64).to_be_bytes());
    cdb[10..14].copy_from_slice(&((bytes.len() / 512) as u32).to_be_bytes());
    let r = c.execute(0, &cdb, DataDir::Write(bytes.into())).unwrap();
    assert_eq!(r.status, Some(0));
}

#[test]
#[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
fn digested_reads_racing_writes_from_another_session_stay_true() {
    let (_dir, path, _data) = shm_lun(RACE_SIZE).expect("/dev/shm");
    race_digested_reads(&lun_config(&path, RACE_SIZE), false);
}

/// The same race on a RAM LUN, whose large reads share its chunks and
/// fold their digests from the chunks' cached block CRCs: writes in
/// place, copy-on-write and whole-chunk writes must each make the cached
/// CRCs of what they change be forgotten.
#[test]
fn digested_reads_racing_writes_to_a_ram_lun_stay_true() {
    race_digested_reads(
        &format!("[[target.lun]]\nbackend = \"mem\"\nsize = \"{RACE_SIZE}\""),
        true,
    );
}

/// Reads with digests, eight 1 MiB in flight, racing another session's
/// writes of new versions of the same ranges (`versioned`) for about two
/// seconds; every byte read must be of a version written. `fill` writes
/// version 0 first (a file LUN is created holding it).
fn race_digested_reads(lun: &str, fill: bool) {
    let (addrs, _stop) = start(config(lun, ""));
    let addr = addrs[0].to_string();
    if fill {
        let cfg = LoginConfig::new("iqn.2026-11.x:zcf", Some(IQN), initiator::random_isid());
        let mut c = Connection::login(&addr, cfg).unwrap();
        for at in (0..SPAN).step_by(1 << 20) {
            write_at(
                &mut c,
                at,
                (at..at + (1 << 20)).map(|o| versioned(o, 0)).collect(),
            );
        }
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU8::new(0));
    // The writer: no digests, so its large writes are received straight
    // into a file LUN's pages (or become a RAM LUN's chunks) and its small
    // ones stored into the mapping (or into the chunks, in place or
    // copied), over the ranges the reader reads, version after version.
    let writer = {
        let (addr, stop, written) = (addr.clone(), stop.clone(), written.clone());
        std::thread::spawn(move || {
            let cfg = LoginConfig::new("iqn.2026-11.x:zcw", Some(IQN), initiator::random_isid());
            let mut c = Connection::login(&addr, cfg).unwrap();
            let mut v = 0u8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && v < 250 {
                v += 1;
                written.store(v, std::sync::atomic::Ordering::SeqCst);
                for (at, n) in [
                    (0usize, 1 << 20),
                    (3 << 19, 4096),
                    (2 << 20, 1 << 20),
                    (SPAN - 65536, 65536),
                    // Less than a block, across a 4 KiB boundary.
                    ((5 << 19) + 3584, 1024),
                ] {
                    write_at(&mut c, at, (at..at + n).map(|o| versioned(o, v)).collect());
                }
            }
        })
    };
    // The reader: header and data digests, segments of 256 KiB and 1 MiB
    // reads, eight in flight, for about two seconds.
    let mut cfg = LoginConfig::new("iqn.2026-11.x:zcr", Some(IQN), initiator::random_isid());
    cfg.header_digest = true;
    cfg.data_digest = true;
    cfg.max_recv_data_segment = 262_144;
    let mut c = Connection::login(&addr, cfg).expect("login with digests");
    let t0 = std::time::Instant::now();
    let mut reads = 0u32;
    while t0.elapsed() < Duration::from_secs(2) {
        let mut want = std::collections::HashMap::new();
        for i in 0..8usize {
            let at = ((reads as usize + i) * 3 * 65536) % (SPAN - (1 << 20));
            let itt = c.submit(0, &read16((at / 512) as u64, 2048), DataDir::Read(1 << 20));
            want.insert(itt, at);
        }
        c.flush().unwrap();
        let mut done = Vec::new();
        while done.len() < want.len() {
            c.wait(&mut done)
                .expect("no digest error, no dropped connection");
        }
        let after = written.load(std::sync::atomic::Ordering::SeqCst);
        for (itt, r) in done {
            let at = want[&itt];
            assert_eq!(r.status, Some(0));
            assert_eq!(r.data.len(), 1 << 20);
            for (i, &b) in r.data.iter().enumerate() {
                let v = b ^ versioned(at + i, 0);
                assert!(
                    v <= after,
                    "byte {} of a read at {at}: version {v} never written",
                    at + i
                );
            }
            reads += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert!(reads >= 16, "only {reads} reads in 2 s");
    assert!(
        written.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "the writer must have raced the reads"
    );
}
