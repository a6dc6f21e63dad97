//! SIGKILL of the real `ironsan serve` during a write stream, then a
//! restart on the same file: every acknowledged write (write-through), and
//! in write-back mode every write acknowledged before an acknowledged
//! SYNCHRONIZE CACHE, reads back intact.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use initiator::{scsi, Connection, DataDir, LoginConfig};

const IQN: &str = "iqn.2026-11.io.ironsan:crash";
const BLOCK: usize = 4096;

fn serve(path: &Path, write_back: bool) -> (Child, String) {
    let spec = format!("file:{}:64M", path.display());
    let mut args = vec![
        "--log",
        "warn",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--target",
        IQN,
        "--lun",
        &spec,
    ];
    if write_back {
        args.push("--write-back");
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_ironsan"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut addr = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(a) = line.strip_prefix("ironsan: listening on ") {
            addr = Some(a.to_string());
            break;
        }
    }
    // Stop reading stdout: the server must survive its output going
    // nowhere (it once panicked on EPIPE).
    drop(lines);
    (child, addr.expect("listening line"))
}

fn pattern(lba: u64) -> Bytes {
    let mut v = vec![0u8; BLOCK];
    for (i, c) in v.chunks_mut(8).enumerate() {
        c.copy_from_slice(&(lba * 1000 + i as u64).to_be_bytes());
    }
    Bytes::from(v)
}

/// Writes 4 KiB blocks at increasing LBAs (8 in flight) until the
/// connection dies; records every acknowledged LBA and, in write-back mode,
/// the acknowledged writes covered by each acknowledged SYNCHRONIZE CACHE.
fn stream(addr: String, acked: Arc<Mutex<Vec<u64>>>, synced: Arc<Mutex<usize>>, write_back: bool) {
    let cfg = LoginConfig::new(
        "iqn.2026-11.test:crash",
        Some(IQN),
        initiator::random_isid(),
    );
    let mut c = match Connection::login(&addr, cfg) {
        Ok(c) => c,
        Err(e) => panic!("login: {e}"),
    };
    let mut inflight: HashMap<u32, u64> = HashMap::new();
    let mut next = 0u64;
    let mut sync: Option<(u32, usize)> = None;
    let mut done = Vec::new();
    loop {
        while inflight.len() < 8 && c.can_submit() && next < 16000 {
            let cdb = scsi::rw16(true, next * 8, 8, false);
            let itt = c.submit(0, &cdb, DataDir::Write(pattern(next)));
            inflight.insert(itt.0, next);
            next += 1;
        }
        if write_back && sync.is_none() && next.is_multiple_of(64) && c.can_submit() {
            let covered = acked.lock().unwrap().len();
            let itt = c.submit(0, &scsi::synchronize_cache(), DataDir::None);
            sync = Some((itt.0, covered));
        }
        done.clear();
        if let Err(e) = c.wait(&mut done) {
            eprintln!("stream ends: {e}");
            return;
        }
        for (itt, r) in done.drain(..) {
            if let Some(lba) = inflight.remove(&itt.0) {
                if r.status == Some(0) {
                    acked.lock().unwrap().push(lba);
                } else if lba > 8 {
                    panic!("write {lba}: {:?} {:02x?}", r.status, &r.sense[..]);
                }
            } else if sync.is_some_and(|(s, _)| s == itt.0) {
                if r.status == Some(0) {
                    *synced.lock().unwrap() = sync.unwrap().1;
                }
                sync = None;
            }
        }
    }
}

fn crash_and_check(write_back: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun.img");
    let (mut child, addr) = serve(&path, write_back);
    let acked = Arc::new(Mutex::new(Vec::new()));
    let synced = Arc::new(Mutex::new(0usize));
    let w = {
        let (a, s) = (acked.clone(), synced.clone());
        std::thread::spawn(move || stream(addr, a, s, write_back))
    };
    let t0 = Instant::now();
    // Enough acknowledged writes and, in write-back, an acknowledged
    // SYNCHRONIZE CACHE covering some of them, before the kill.
    while (acked.lock().unwrap().len() < 300 || (write_back && *synced.lock().unwrap() == 0))
        && t0.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    w.join().unwrap();
    let acked = acked.lock().unwrap().clone();
    let synced = *synced.lock().unwrap();
    assert!(
        acked.len() >= 300,
        "only {} writes acknowledged",
        acked.len()
    );
    // Write-through: every acknowledged write. Write-back: those before
    // the last acknowledged SYNCHRONIZE CACHE.
    let must = if write_back {
        assert!(synced > 0, "no SYNCHRONIZE CACHE acknowledged");
        &acked[..synced]
    } else {
        &acked[..]
    };
    let (mut child, addr) = serve(&path, write_back);
    let cfg = LoginConfig::new(
        "iqn.2026-11.test:crash",
        Some(IQN),
        initiator::random_isid(),
    );
    let mut c = Connection::login(&addr, cfg).unwrap();
    let _ = c.execute(0, &scsi::test_unit_ready(), DataDir::None);
    for &lba in must {
        let r = c
            .execute(
                0,
                &scsi::rw16(false, lba * 8, 8, false),
                DataDir::Read(BLOCK as u32),
            )
            .unwrap();
        assert_eq!(r.status, Some(0));
        assert!(r.data == pattern(lba), "acknowledged block {lba} lost");
    }
    eprintln!(
        "write_back={write_back}: {} acknowledged, {} checked after SIGKILL",
        acked.len(),
        must.len()
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn sigkill_during_writes_loses_no_acknowledged_write() {
    crash_and_check(false);
}

#[test]
fn sigkill_in_write_back_keeps_synchronized_writes() {
    crash_and_check(true);
}
