//! Writes to a file LUN in memory received straight into the file's pages
//! (`scsi::fast`, writes received in place): over real sessions, whatever
//! the negotiation splits a write into (immediate data only, immediate
//! data and R2Ts, R2Ts only, segments too small to land on their own,
//! data digests, which never place), many writes in flight at once, the
//! file holds exactly the data written, reads return it, and neighbouring
//! bytes are untouched. A write into a hole, which is not placed, lands
//! right too. Small writes, stored into the file's mapping from user space,
//! survive the file being cut short under the LUN.

mod common;

use std::collections::HashMap;

use common::*;
use initiator::{scsi, Connection, DataDir, LoginConfig};

const SIZE: usize = 16 << 20;
const BLOCK: usize = 512;

/// A file LUN of [`SIZE`] bytes in /dev/shm, its first 12 MiB filled with
/// a pattern (resident pages) and the rest a hole; `None` where there is
/// no /dev/shm.
fn shm_lun() -> Option<(tempfile::TempDir, std::path::PathBuf, Vec<u8>)> {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        return None;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let path = dir.path().join("placed.img");
    let mut data: Vec<u8> = (0..SIZE as u64)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    data[12 << 20..].fill(0);
    let f = std::fs::File::create(&path).unwrap();
    std::io::Write::write_all(&mut &f, &data[..12 << 20]).unwrap();
    f.set_len(SIZE as u64).unwrap();
    Some((dir, path, data))
}

fn lun_config(path: &std::path::Path) -> String {
    format!(
        "[[target.lun]]\nbackend = \"file\"\npath = \"{}\"\nsize = \"{}\"",
        path.display(),
        SIZE
    )
}

fn fill(seed: u64, n: usize) -> Vec<u8> {
    (0..n as u64)
        .map(|i| ((i ^ seed).wrapping_mul(0x9e37_79b9) >> 7) as u8)
        .collect()
}

#[test]
#[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
fn placed_writes_hold_exactly_what_was_written_for_every_negotiation() {
    let (_dir, path, mut want) = shm_lun().expect("/dev/shm");
    let (addrs, _stop) = start(config(&lun_config(&path), ""));
    // (immediate data, first burst, max recv segment, data digest)
    let shapes = [
        (true, 1 << 20, 1 << 20, false),
        (true, 262_144, 262_144, false),
        (false, 262_144, 262_144, false),
        (true, 65_536, 8192, false),
        (true, 262_144, 262_144, true),
    ];
    let mut seed = 1u64;
    for (imm, first, seg, dd) in shapes {
        let what = format!("immediate {imm} first burst {first} segment {seg} data digest {dd}");
        let mut cfg = LoginConfig::new("iqn.2026-11.x:pw", Some(IQN), initiator::random_isid());
        cfg.immediate_data = imm;
        cfg.initial_r2t = false;
        cfg.first_burst = first;
        cfg.max_burst = 1 << 20;
        cfg.max_recv_data_segment = seg;
        cfg.data_digest = dd;
        let mut c = Connection::login(&addrs[0].to_string(), cfg).unwrap();
        // One at a time at odd places and sizes, some across into the
        // hole at 12 MiB, some small (never placed).
        for (lba, blocks) in [
            (0u64, 2048u32),
            (7, 129),
            (4095, 1000),
            ((12 << 20) / BLOCK as u64 - 256, 512),
            ((13 << 20) / BLOCK as u64, 256),
            (20_000, 8),
        ] {
            let d = fill(seed, blocks as usize * BLOCK);
            seed += 1;
            let r = c
                .execute(
                    0,
                    &scsi::rw16(true, lba, blocks, seed.is_multiple_of(2)),
                    DataDir::Write(d.clone().into()),
                )
                .unwrap();
            assert_eq!(r.status, Some(0), "{what}: write lba {lba} blocks {blocks}");
            let at = lba as usize * BLOCK;
            want[at..at + d.len()].copy_from_slice(&d);
            let r = c
                .execute(
                    0,
                    &scsi::rw16(false, lba, blocks, false),
                    DataDir::Read(d.len() as u32),
                )
                .unwrap();
            assert!(
                r.data[..] == d[..],
                "{what}: read back lba {lba} blocks {blocks}"
            );
        }
        // Many 1 MiB and 256 KiB writes in flight at once, none
        // overlapping, then every byte of the file checked.
        let mut sizes = HashMap::new();
        for i in 0..16u64 {
            let blocks = if i % 2 == 0 { 2048 } else { 512 };
            let lba = i * 2048 + 40;
            let d = fill(seed, blocks * BLOCK);
            seed += 1;
            let at = lba as usize * BLOCK;
            want[at..at + d.len()].copy_from_slice(&d);
            let itt = c.submit(
                0,
                &scsi::rw16(true, lba, blocks as u32, false),
                DataDir::Write(d.into()),
            );
            sizes.insert(itt, lba);
        }
        c.flush().unwrap();
        let mut done = Vec::new();
        while done.len() < sizes.len() {
            c.wait(&mut done).unwrap();
        }
        for (itt, r) in &done {
            assert_eq!(r.status, Some(0), "{what}: write at lba {}", sizes[itt]);
        }
        let file = std::fs::read(&path).unwrap();
        if let Some(i) = (0..SIZE).find(|&i| file[i] != want[i]) {
            panic!("{what}: the file differs first at byte {i}");
        }
    }
}

/// Small writes go into the file's mapping by a store that recovers from a
/// missing page (`filemap::FileMap::store`). The file cut short behind the
/// target's back: writes past its new end, and across it, still complete
/// with GOOD (what the store could not take goes by `pwrite`, which extends
/// the file again), read back right, and the target lives on.
#[test]
#[cfg_attr(no_shm, ignore = "needs /dev/shm (tmpfs)")]
fn small_writes_survive_the_file_cut_short_under_the_lun() {
    let (_dir, path, _want) = shm_lun().expect("/dev/shm");
    let (addrs, _stop) = start(config(&lun_config(&path), ""));
    let cfg = LoginConfig::new("iqn.2026-11.x:pw", Some(IQN), initiator::random_isid());
    let mut c = Connection::login(&addrs[0].to_string(), cfg).unwrap();
    // A first write maps what it needs; then the file loses all but 1 MiB.
    let d = fill(99, 4096);
    let r = c
        .execute(
            0,
            &scsi::rw16(true, 8, 8, false),
            DataDir::Write(d.clone().into()),
        )
        .unwrap();
    assert_eq!(r.status, Some(0));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let past = (4 << 20) / BLOCK as u64;
    let across = (1 << 20) / BLOCK as u64 - 4;
    for (lba, seed) in [(past, 1u64), (across, 2), (past + 1000, 3)] {
        let d = fill(seed, 4096);
        let r = c
            .execute(
                0,
                &scsi::rw16(true, lba, 8, false),
                DataDir::Write(d.clone().into()),
            )
            .unwrap();
        assert_eq!(r.status, Some(0), "write at lba {lba}");
        let r = c
            .execute(0, &scsi::rw16(false, lba, 8, false), DataDir::Read(4096))
            .unwrap();
        assert_eq!(r.status, Some(0), "read at lba {lba}");
        assert!(r.data[..] == d[..], "read back at lba {lba}");
    }
    // Another session is served as before.
    let cfg = LoginConfig::new("iqn.2026-11.x:pw2", Some(IQN), initiator::random_isid());
    let mut c2 = Connection::login(&addrs[0].to_string(), cfg).unwrap();
    let r = c2
        .execute(0, &scsi::rw16(false, 8, 8, false), DataDir::Read(4096))
        .unwrap();
    assert_eq!(r.status, Some(0));
    assert!(r.data[..] == d[..]);
}
