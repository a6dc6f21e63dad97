//! The real `ironsan` binary: argument validation, start-up output and
//! graceful shutdown on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn ironsan() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ironsan"))
}

fn refused(args: &[&str], needle: &str) {
    let out = ironsan().args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} was accepted");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(needle),
        "{args:?}: error {err:?} does not mention {needle:?}"
    );
}

/// `ironsan --log LOG serve --listen 127.0.0.1:0 --lun mem:1M`, stderr to
/// `stderr`: the child and its portal, once it printed its start-up lines.
fn serve(log: &str, stderr: Stdio) -> (std::process::Child, String) {
    let mut child = ironsan()
        .args([
            "--log",
            log,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--lun",
            "mem:1M",
        ])
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut addr = String::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(a) = line.strip_prefix("ironsan: listening on ") {
            addr = a.to_string();
        }
        if line.contains("try ") {
            break;
        }
    }
    assert!(!addr.is_empty(), "no listening line");
    (child, addr)
}

#[test]
fn bad_arguments_are_refused_before_starting() {
    refused(&["serve", "--lun", "disk:1G"], "--lun");
    refused(&["serve", "--lun", "mem:lots"], "not a size");
    refused(&["serve", "--lun", "mem:1000"], "block size");
    refused(&["serve", "--queue-depth", "9000"], "queue_depth");
    refused(
        &["serve", "--target", "not-an-iqn", "--lun", "mem:1M"],
        "iqn.",
    );
    refused(&["serve", "--digest", "sometimes"], "--digest");
    refused(&["serve", "--listen", "nowhere"], "--listen");
    refused(
        &[
            "serve",
            "--lun",
            "file:/nonexistent-ironsan-dir/disk0.img:1G",
        ],
        "the directory /nonexistent-ironsan-dir does not exist",
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "listen = [\"127.0.0.1:0\"]\nbogus = 1\n").unwrap();
    refused(&["serve", "--config", cfg.to_str().unwrap()], "bogus");
    refused(
        &["serve", "--config", "/nonexistent/ironsan.toml"],
        "cannot read",
    );
}

#[test]
fn serves_then_stops_on_sigterm() {
    let mut child = ironsan()
        .args([
            "--log",
            "warn",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--lun",
            "mem:8M",
            "--lun",
            "null:1G",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut addr = None;
    let mut text = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        text.push_str(&line);
        text.push('\n');
        if let Some(a) = line.strip_prefix("ironsan: listening on ") {
            addr = Some(a.to_string());
        }
        if line.contains("try ") {
            break;
        }
    }
    let addr = addr.expect("a listening line");
    assert!(text.contains("LUN 0: RAM (volatile"), "{text}");
    assert!(text.contains("LUN 1: null"), "{text}");
    assert!(text.contains("iscsi-ls -s iscsi://"), "{text}");
    let conn = std::net::TcpStream::connect(&addr).unwrap();
    // SAFETY: kill(2) on our own child's pid with a valid signal number.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(conn);
    assert!(status.success(), "{status:?}");
}

/// `inq` and `bench` on a LUN the target does not have: an error naming
/// it, not an empty INQUIRY or a bare status.
#[test]
fn a_missing_lun_is_named() {
    let (mut child, addr) = serve("warn", Stdio::null());
    let url = |lun: u8| format!("iscsi://{addr}/iqn.2026-11.io.ironsan:target0/{lun}");
    refused(&["inq", &url(7)], "the target has no LUN 7");
    refused(
        &["bench", "--runtime", "1s", &url(9)],
        "the target has no LUN 9",
    );
    let out = ironsan().args(["inq", &url(0)]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("naa."));
    let _ = child.kill();
    let _ = child.wait();
}

/// Logs that go to a file (or journald) carry no terminal colour codes.
#[test]
fn logs_off_a_terminal_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let (mut child, _) = serve("info", Stdio::from(std::fs::File::create(&log).unwrap()));
    // SAFETY: kill(2) on our own child's pid with a valid signal number.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("shutting down"), "{text}");
    assert!(!text.contains('\x1b'), "escape codes in the log: {text:?}");
}

/// `probe cores` (the side-by-side script's placement probe) measures a
/// round trip between two CPUs, or says why it cannot, and never hangs.
#[test]
fn cores_probe_measures_two_cpus_or_says_why_not() {
    refused(
        &["probe", "cores", "--cpus", "0", "0"],
        "two different CPUs",
    );
    // No machine has this CPU: the pinning fails on one side, and the other
    // side must stop waiting for it.
    refused(
        &["probe", "cores", "--cpus", "0", "4000"],
        "cannot run on CPU 4000",
    );
    refused(
        &["probe", "cores", "--cpus", "4000", "0"],
        "cannot run on CPU 4000",
    );
    let out = ironsan()
        .args(["probe", "cores", "--trips", "1000"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("may run on only one CPU") {
        return;
    }
    assert!(out.status.success(), "{err}");
    let ns: f64 = text
        .split_whitespace()
        .nth(3)
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no figure in {text:?}"));
    // A cache line cannot cross between cores in under a nanosecond, and a
    // round trip of a second would mean the two were never both running.
    assert!(ns > 1.0 && ns < 1e9, "{text}");
}

/// `probe nvme-null-target` (the NVMe/TCP ceiling of the side-by-side
/// script) is a controller the userspace host brings up and drives: reads
/// in one and several C2HData PDUs, writes in the capsule and after an R2T
/// (several H2CData PDUs), with digests off and on, and with no error.
#[test]
fn nvme_null_target_serves_the_userspace_host() {
    let mut child = ironsan()
        .args(["probe", "nvme-null-target", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("nvme-null-target: listening on ")
        .unwrap_or_else(|| panic!("start-up line {line:?}"))
        .to_owned();
    let url = format!("nvme-tcp://{addr}/nqn.2026-11.io.ironsan:null/1");
    for (rw, bs) in [
        ("randread", "4k"),
        ("randwrite", "4k"),
        ("read", "1m"),
        ("write", "1m"),
    ] {
        for u in [url.clone(), format!("{url}?digests")] {
            let out = ironsan()
                .args(["bench", "--rw", rw, "--bs", bs, "--iodepth", "8"])
                .args(["--size", "8M", &u])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{rw} {bs} {u}: {text}{err}");
            assert!(text.contains(" 0 errors"), "{rw} {bs} {u}: {text}");
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// `ironsan ls` and `ironsan inq` over NVMe/TCP: the discovery log lists
/// the subsystem, `-s` its namespaces, and `inq` the namespace's size, its
/// NGUID (the LUN's NAA, as `inq` over iSCSI prints it), its UUID when
/// the LUN has one, and its ANA state.
#[test]
fn ls_and_inq_speak_nvme_tcp() {
    const U: &str = "91fdba0d-f87b-4c25-b80f-db7be1418b9e";
    let mut child = ironsan()
        .args(["--log", "warn", "serve", "--listen", "127.0.0.1:0"])
        .args(["--nvme-listen", "127.0.0.1:0", "--lun", "mem:1M"])
        .args(["--lun", &format!("mem:2M,uuid={U}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (mut iscsi, mut nvme) = (String::new(), String::new());
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(a) = line.strip_prefix("ironsan: listening on ") {
            iscsi = a.to_string();
        }
        if let Some(a) = line.strip_prefix("ironsan: NVMe/TCP on ") {
            nvme = a.to_string();
        }
        if line.contains("try ") && line.contains("iscsi") {
            break;
        }
    }
    assert!(!iscsi.is_empty() && !nvme.is_empty(), "start-up lines");
    let run = |args: &[&str]| {
        let out = ironsan().args(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let nqn = "nqn.2026-11.io.ironsan:target0";
    let ls = run(&["ls", "-s", &format!("nvme-tcp://{nvme}")]);
    assert!(ls.contains(&format!("Subsystem:{nqn} Port:{nvme}")), "{ls}");
    assert!(
        ls.contains("Namespace:1 (1048576 bytes, 512-byte blocks)"),
        "{ls}"
    );
    assert!(
        ls.contains("Namespace:2 (2097152 bytes, 512-byte blocks)"),
        "{ls}"
    );
    let inq = run(&["inq", &format!("nvme-tcp://{nvme}/{nqn}/2")]);
    assert!(
        inq.contains("Capacity: 2097152 bytes (4096 blocks of 512 bytes)"),
        "{inq}"
    );
    assert!(inq.contains(&format!("UUID: {U}")), "{inq}");
    assert!(
        inq.contains("ANA group 1: optimized through this port"),
        "{inq}"
    );
    let nguid = inq
        .lines()
        .find_map(|l| l.strip_prefix("NGUID: "))
        .unwrap_or_else(|| panic!("no NGUID: {inq}"))
        .to_string();
    let scsi = run(&[
        "inq",
        &format!("iscsi://{iscsi}/iqn.2026-11.io.ironsan:target0/1"),
    ]);
    assert!(
        scsi.contains(&format!("Device identifier: naa.{nguid}")),
        "{scsi} / NGUID {nguid}"
    );
    let one = run(&["inq", &format!("nvme-tcp://{nvme}/{nqn}/1")]);
    assert!(!one.contains("UUID"), "{one}");
    let out = ironsan()
        .args(["inq", &format!("nvme-tcp://{nvme}/{nqn}/9")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let _ = child.kill();
    let _ = child.wait();
}
