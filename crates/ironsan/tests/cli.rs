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
