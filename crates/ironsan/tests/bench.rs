//! `ironsan bench`, `cdm` and `gpfsperf` end to end against `ironsan serve`
//! on loopback: engines, multipath policies and failover, --verify, report
//! shapes and argument validation.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const IQN: &str = "iqn.2026-11.io.ironsan:target0";

fn ironsan() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ironsan"));
    c.env("RUST_BACKTRACE", "0");
    c
}

/// `ironsan serve` on loopback, killed on drop.
struct Server {
    child: Child,
    addrs: Vec<String>,
}

impl Server {
    fn start(portals: usize, luns: &[&str]) -> Server {
        Server::start_with(portals, luns, &[])
    }

    /// With `extra` serve options.
    fn start_with(portals: usize, luns: &[&str], extra: &[&str]) -> Server {
        let mut args = vec!["--log", "warn", "serve"];
        args.extend(extra);
        for _ in 0..portals {
            args.extend(["--listen", "127.0.0.1:0"]);
        }
        for l in luns {
            args.extend(["--lun", l]);
        }
        let mut child = ironsan()
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut addrs = Vec::new();
        let out = child.stdout.take().unwrap();
        for line in BufReader::new(out).lines() {
            let line = line.unwrap();
            if let Some(a) = line.strip_prefix("ironsan: listening on ") {
                addrs.push(a.to_string());
            }
            if line.contains("try ") {
                break;
            }
        }
        assert_eq!(addrs.len(), portals, "listening lines");
        Server { child, addrs }
    }

    fn url(&self, portal: usize, lun: u16) -> String {
        format!("iscsi://{}/{IQN}/{lun}", self.addrs[portal])
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(args: &[&str]) -> Output {
    ironsan().args(args).output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = run(args);
    let so = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{args:?} failed: {}\n{so}",
        String::from_utf8_lossy(&out.stderr)
    );
    so
}

fn json(args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.push("--json");
    serde_json::from_str(&ok(&a)).unwrap()
}

fn refused(args: &[&str], needle: &str) -> String {
    let out = run(args);
    assert!(!out.status.success(), "{args:?} was accepted");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        err.contains(needle),
        "{args:?}: error {err:?} does not mention {needle:?}"
    );
    err
}

fn fio_shape(v: &serde_json::Value, dir: &str) -> f64 {
    let d = &v["jobs"][0][dir];
    let iops = d["iops"].as_f64().unwrap();
    assert!(iops > 0.0, "{dir} iops {d}");
    assert!(d["bw_bytes"].as_u64().unwrap() > 0);
    assert!(d["clat_ns"]["percentile"]["99.000000"].as_u64().unwrap() > 0);
    iops
}

#[test]
fn iscsi_engine_json_and_plot() {
    let s = Server::start(1, &["mem:32M"]);
    let u = s.url(0, 0);
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("run.svg");
    let v = json(&[
        "bench",
        "--rw",
        "randrw",
        "--runtime",
        "1",
        "--plot",
        svg.to_str().unwrap(),
        &u,
    ]);
    fio_shape(&v, "read");
    fio_shape(&v, "write");
    assert_eq!(v["ironsan"]["ioengine"], "iscsi");
    let series = v["ironsan"]["series"].as_array().unwrap();
    assert!(!series.is_empty() && series[0]["lat_ns"]["p99"].as_u64().unwrap() > 0);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    assert!(text.contains("IOPS over time") && text.contains("Latency histogram"));
    assert!(text.contains("<polyline") && text.contains("<rect"));
}

#[test]
fn file_engines() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("data");
    let f = f.to_str().unwrap();
    for engine in ["io_uring", "psync"] {
        let v = json(&[
            "bench",
            "--ioengine",
            engine,
            "--rw",
            "randrw",
            "--size",
            "8M",
            "--runtime",
            "1",
            f,
        ]);
        fio_shape(&v, "read");
        let used = v["ironsan"]["ioengine"].as_str().unwrap();
        // io_uring may be refused by the kernel; then psync with a note.
        assert!(used == engine || used == "psync", "{used}");
    }
    assert_eq!(std::fs::metadata(f).unwrap().len(), 8 << 20);
    // O_DIRECT needs aligned buffers; where the file system refuses O_DIRECT
    // (tmpfs), the error names the file.
    let out = run(&[
        "bench", "--direct", "--rw", "read", "--bs", "64k", "--size", "8M", f,
    ]);
    if !out.status.success() {
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains("data"), "{e}");
    }
}

#[test]
fn multipath_round_robin_and_least_queue_depth() {
    let s = Server::start(2, &["mem:32M"]);
    let (a, b) = (s.url(0, 0), s.url(1, 0));
    let v = json(&[
        "bench",
        "--multipath",
        "rr",
        "--runtime",
        "1",
        "--iodepth",
        "16",
        &a,
        &b,
    ]);
    fio_shape(&v, "read");
    let paths = v["ironsan"]["paths"].as_array().unwrap();
    assert_eq!(paths.len(), 2);
    let c: Vec<f64> = paths
        .iter()
        .map(|p| p["ios"].as_u64().unwrap() as f64)
        .collect();
    let share = c[0] / (c[0] + c[1]);
    assert!((0.45..=0.55).contains(&share), "rr split {c:?}");
    assert_eq!(v["ironsan"]["ioengine"], "multipath");

    let v = json(&["bench", "--multipath", "lqd", "--runtime", "1", &a, &b]);
    let paths = v["ironsan"]["paths"].as_array().unwrap();
    assert!(
        paths.iter().all(|p| p["ios"].as_u64().unwrap() > 0),
        "{paths:?}"
    );

    let t = ok(&["bench", "--multipath", "rr:8", "--runtime", "1", &a, &b]);
    assert!(t.contains("paths: ") && t.contains(&s.addrs[1]), "{t}");
}

#[test]
fn busy_polling_one_path_and_several() {
    let s = Server::start(2, &["mem:32M"]);
    let (a, b) = (s.url(0, 0), s.url(1, 0));
    for rw in ["randread", "randwrite"] {
        let v = json(&[
            "bench",
            "--busy-poll",
            "200us",
            "--rw",
            rw,
            "--runtime",
            "1",
            &a,
        ]);
        fio_shape(&v, rw.trim_start_matches("rand"));
    }
    let v = json(&[
        "bench",
        "--busy-poll",
        "1ms",
        "--multipath",
        "rr",
        "--runtime",
        "1",
        &a,
        &b,
    ]);
    fio_shape(&v, "read");
    let paths = v["ironsan"]["paths"].as_array().unwrap();
    assert!(
        paths.iter().all(|p| p["ios"].as_u64().unwrap() > 0),
        "{paths:?}"
    );
}

#[test]
fn multipath_refuses_different_lus() {
    let s = Server::start(2, &["mem:8M", "mem:8M"]);
    refused(
        &[
            "bench",
            "--multipath",
            "rr",
            "--runtime",
            "1",
            &s.url(0, 0),
            &s.url(1, 1),
        ],
        "not the same LU",
    );
}

/// A TCP proxy whose connections can be cut.
struct Proxy {
    port: u16,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(upstream: String) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let c2 = conns.clone();
        std::thread::spawn(move || {
            for down in l.incoming() {
                let Ok(down) = down else { return };
                let up = TcpStream::connect(&upstream).unwrap();
                c2.lock().unwrap().push(down.try_clone().unwrap());
                c2.lock().unwrap().push(up.try_clone().unwrap());
                for (mut from, mut to) in [
                    (down.try_clone().unwrap(), up.try_clone().unwrap()),
                    (up, down),
                ] {
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; 256 * 1024];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if to.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, conns }
    }

    fn cut(&self) {
        for c in self.conns.lock().unwrap().iter() {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

#[test]
fn multipath_survives_a_path_cut_mid_run() {
    let s = Server::start(1, &["mem:32M"]);
    let proxy = Proxy::start(s.addrs[0].clone());
    let via_proxy = format!("iscsi://127.0.0.1:{}/{IQN}/0", proxy.port);
    for policy in ["rr", "lqd"] {
        let child = ironsan()
            .args([
                "bench",
                "--multipath",
                policy,
                "--rw",
                "randrw",
                "--runtime",
                "3",
                "--json",
                &s.url(0, 0),
                &via_proxy,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1200));
        proxy.cut();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{policy}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["jobs"][0]["error"], 0);
        let paths = v["ironsan"]["paths"].as_array().unwrap();
        assert!(paths[0]["failed"].is_null(), "{paths:?}");
        assert!(paths[1]["failed"].is_string(), "{paths:?}");
        assert!(paths[1]["ios"].as_u64().unwrap() > 0, "{paths:?}");
        // The surviving path went on after the cut.
        let series = v["ironsan"]["series"].as_array().unwrap();
        assert!(series.len() >= 3, "{series:?}");
        assert!(series[2]["read_iops"].as_u64().unwrap() > 0);
    }
    // With the only path cut, the initiator logs in again (the target
    // reinstates the session), submits what was in flight again, and the
    // run completes without errors.
    let child = ironsan()
        .args([
            "bench",
            "--rw",
            "randrw",
            "--runtime",
            "3",
            "--json",
            &via_proxy,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    proxy.cut();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("session reinstated"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["jobs"][0]["error"], 0);
    let series = v["ironsan"]["series"].as_array().unwrap();
    assert!(
        series.last().unwrap()["read_iops"].as_u64().unwrap() > 0,
        "{series:?}"
    );
}

#[test]
fn verify_catches_a_block_changed_behind_the_targets_back() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("lun.img");
    std::fs::write(&img, vec![0u8; 8 << 20]).unwrap();
    let spec = format!("file:{}", img.display());
    let s = Server::start(1, &[&spec]);
    let u = s.url(0, 0);
    let w = ok(&["bench", "--rw", "write", "--verify", "--size", "4M", &u]);
    assert!(w.contains("run id 0x"), "{w}");
    let id = w
        .split("--verify-id ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    // Random writes of the same run over the area keep it checkable.
    ok(&[
        "bench",
        "--rw",
        "randwrite",
        "--verify",
        "--verify-id",
        &id,
        "--size",
        "4M",
        "--runtime",
        "1",
        &u,
    ]);
    let r = ok(&[
        "bench",
        "--rw",
        "randread",
        "--verify",
        "--size",
        "4M",
        "--runtime",
        "1",
        &u,
    ]);
    assert!(r.contains("all blocks good"), "{r}");
    ok(&[
        "bench",
        "--rw",
        "read",
        "--verify",
        "--verify-id",
        &id,
        "--size",
        "4M",
        &u,
    ]);
    // Another run's id: refused.
    let e = refused(
        &[
            "bench",
            "--rw",
            "read",
            "--verify",
            "--verify-id",
            "0x1234",
            "--iodepth",
            "1",
            "--size",
            "4M",
            &u,
        ],
        "another run",
    );
    assert!(e.contains("LBA 0 "), "{e}");
    // Change one byte in the file behind the target: LBA 2000 (512-byte
    // blocks), byte 100 of it.
    let mut f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&[0xee], 2000 * 512 + 100).unwrap();
    f.flush().unwrap();
    let e = refused(
        &["bench", "--rw", "read", "--verify", "--size", "4M", &u],
        "verify failed at LBA 2000 ",
    );
    assert!(
        e.contains(&format!("byte offset {}", 2000 * 512 + 100)),
        "{e}"
    );
    assert!(e.contains("expected") && e.contains("found"), "{e}");
    // Reading beyond what was written: zeros are not a pass.
    refused(
        &[
            "bench", "--rw", "read", "--verify", "--offset", "4M", "--size", "1M", &u,
        ],
        "zeros",
    );
}

#[test]
fn verify_on_files() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("v");
    let f = f.to_str().unwrap();
    ok(&[
        "bench", "--rw", "write", "--bs", "64k", "--verify", "--size", "2M", f,
    ]);
    ok(&[
        "bench",
        "--rw",
        "randread",
        "--verify",
        "--size",
        "2M",
        "--runtime",
        "1",
        f,
    ]);
    let file = std::fs::OpenOptions::new().write(true).open(f).unwrap();
    use std::os::unix::fs::FileExt;
    file.write_all_at(&[1, 2, 3], 1 << 20).unwrap();
    refused(
        &[
            "bench", "--rw", "read", "--bs", "64k", "--verify", "--size", "2M", f,
        ],
        "verify failed at LBA 2048 ",
    );
}

#[test]
fn cdm_table_and_json() {
    let s = Server::start(1, &["mem:32M"]);
    let u = s.url(0, 0);
    let quick = ["--passes", "1", "--duration", "200ms", "--size", "8M"];
    let mut args = vec!["cdm"];
    args.extend(quick);
    args.push(&u);
    let out = run(&args);
    assert!(out.status.success());
    let t = String::from_utf8_lossy(&out.stdout).to_string();
    // CrystalDiskMark 8's text export: [Read] then [Write], each test as
    // `  SEQ    1MiB (Q=  8, T= 1):  N MB/s [N IOPS] <N us>`.
    let (read, write) = t
        .split_once("[Read]\n")
        .and_then(|(_, r)| r.split_once("\n[Write]\n"))
        .unwrap_or_else(|| panic!("{t}"));
    for block in [read, write] {
        let labels = [
            "SEQ    1MiB (Q=  8, T= 1)",
            "SEQ    1MiB (Q=  1, T= 1)",
            "RND    4KiB (Q= 32, T= 1)",
            "RND    4KiB (Q=  1, T= 1)",
        ];
        for label in labels {
            let line = block
                .lines()
                .find(|l| l.starts_with(&format!("  {label}: ")))
                .unwrap_or_else(|| panic!("{label}: {t}"));
            let rest = line.split_once("): ").unwrap().1;
            let nums: Vec<f64> = rest
                .replace(['[', ']', '<', '>'], " ")
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            assert_eq!(nums.len(), 3, "{line}");
            assert!(nums.iter().all(|n| *n > 0.0), "{line}");
            assert!(
                rest.contains(" MB/s [") && rest.contains(" IOPS] <") && rest.ends_with(" us>")
            );
        }
    }
    assert!(
        t.contains("\nProfile: Default\n   Test: 8 MiB (x1) ["),
        "{t}"
    );
    assert!(
        t.contains("   Time: Measure 200 ms / Interval 0 sec\n"),
        "{t}"
    );
    assert!(t.contains("   Date: ") && t.contains("     OS: "), "{t}");
    // Progress, test by test, on stderr.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("[1/8] SEQ    1MiB (Q=  8, T= 1) read pass 1/1"),
        "{err}"
    );
    assert!(
        err.contains("[8/8] RND    4KiB (Q=  1, T= 1) write pass 1/1"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("cdm");
    let mut args = vec!["cdm", "--profile", "cdm6"];
    args.extend(quick);
    args.push(f.to_str().unwrap());
    let v = json(&args);
    let tests = v["tests"].as_array().unwrap();
    let labels: Vec<_> = tests.iter().map(|t| t["test"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        ["Seq Q32T1", "4KiB Q8T8", "4KiB Q32T1", "4KiB Q1T1"]
    );
    assert_eq!(tests[1]["threads"], 8);
    assert!(tests[0]["read"]["mb_per_s"].as_f64().unwrap() > 0.0);
    assert!(tests[3]["write"]["iops"].as_f64().unwrap() > 0.0);
}

#[test]
fn gpfsperf_reference_commands_on_a_file_and_a_lun() {
    let s = Server::start(1, &["mem:64M"]);
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("n1aa");
    let file = f.to_str().unwrap().to_string();
    for target in [file, s.url(0, 0)] {
        for cmd in [
            "create seq T -r 1m -th 2 -n 32M",
            "read seq T -r 1m -th 2",
            "mixrw seq T -r 1m -th 2 -n 32M -readratio 70",
            "write rand T -r 4k -th 4 -n 2M",
        ] {
            let mut args = vec!["gpfsperf".to_string()];
            args.extend(cmd.split_whitespace().map(|w| {
                if w == "T" {
                    target.clone()
                } else {
                    w.to_string()
                }
            }));
            let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
            let out = ok(&a);
            assert!(out.contains("recSize "), "{out}");
            assert!(out.contains("nThreadsPerProcess "), "{out}");
            let last = out.lines().last().unwrap();
            assert!(
                last.contains("Data rate was ")
                    && last.contains(" Kbytes/sec, Op Rate was ")
                    && last.contains("Avg Latency was ")
                    && last.contains(" milliseconds"),
                "{out}"
            );
            if cmd.starts_with("create") || cmd.starts_with("mixrw") {
                assert!(last.contains("bytesTransferred 33554432"), "{out}");
            }
            if cmd.starts_with("mixrw") {
                assert!(out.contains("read ratio 70%"), "{out}");
            }
        }
    }
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 32 << 20);
    // Reads of a file without -dio start from a cold page cache, said so;
    // with -dio the cache is bypassed and nothing needs saying.
    let read = |extra: &[&str]| {
        let mut a = vec!["gpfsperf", "read", "seq", f.to_str().unwrap(), "-r", "1m"];
        a.extend(extra);
        run(&a)
    };
    let out = read(&[]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("page cache was dropped"), "{err}");
    let out = read(&["-dio"]);
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("page cache"));
}

#[test]
fn bad_arguments_are_refused_before_any_io() {
    // Nothing listens on port 1: a message about it would mean I/O was tried.
    let u = "iscsi://127.0.0.1:1/iqn.x/0";
    refused(&["bench", "--bs", "1000", u], "--bs");
    refused(&["bench", "--iodepth", "0", u], "--iodepth");
    refused(&["bench", "--rw", "sideways", u], "--rw");
    refused(&["bench", "--ioengine", "libaio", u], "--ioengine");
    refused(&["bench", "--ioengine", "io_uring", u], "--ioengine");
    refused(&["bench", "--direct", u], "--direct");
    refused(&["bench", "--verify-id", "0x12", u], "--verify-id");
    refused(
        &["bench", "--verify", "--verify-id", "zz", u],
        "--verify-id",
    );
    refused(&["bench", "--plot", "out.png", u], "--plot");
    refused(&["bench", "--plot", "/nonexistent/dir/x.svg", u], "--plot");
    refused(&["bench", "--multipath", "rr:0", u, u], "--multipath");
    refused(&["bench", u, u], "--multipath");
    refused(&["bench", "--multipath", "rr", u, "/tmp/x"], "--multipath");
    refused(&["bench", "--runtime", "soon", u], "--runtime");
    refused(&["bench", "--busy-poll", "2s", u], "--busy-poll");
    refused(&["bench", "--busy-poll", "50us", "/tmp/x"], "--busy-poll");
    refused(&["cdm", "--profile", "cdm7", u], "--profile");
    refused(&["cdm", "--passes", "0", u], "--passes");
    refused(&["cdm", "--size", "100k", u], "--size");
    refused(&["cdm", "--duration", "forever", u], "--duration");
    let out = run(&["cdm", "--multipath", "rr", u, "/tmp/x"]);
    assert!(!out.status.success() && out.stdout.is_empty(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--multipath"));
    refused(&["gpfsperf", "read", "seq", u, "-bogus"], "-bogus");
    refused(&["gpfsperf", "read", "seq", u, "-r", "1000"], "-r");
    refused(&["gpfsperf", "read", "seq", u, "-th", "0"], "-th");
    refused(
        &["gpfsperf", "mixrw", "seq", u, "-readratio", "170"],
        "-readratio",
    );
    refused(&["gpfsperf", "copy", "seq", u], "operation");
    refused(&["gpfsperf", "read", "seq", u, "-dio"], "-dio");
    refused(&["gpfsperf", "create", "seq", "/nonexistent-dir/f"], "-n");
}

/// A LUN added and another resized while `cdm` and `bench` run: the UNIT
/// ATTENTIONs every session then gets (3F/0E, 2A/09) are retried as
/// initiators do, and the runs finish with no error.
#[test]
fn unit_attentions_do_not_end_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    let s = Server::start_with(
        1,
        &["mem:64M"],
        &["--admin", "127.0.0.1:0", "--state-dir", state],
    );
    let addr = &s.addrs[0];
    let url = format!("iscsi://{addr}/{IQN}/0");
    let admin = |args: &[&str]| {
        let out = ironsan()
            .arg("admin")
            .arg("--state-dir")
            .arg(dir.path())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for (i, run) in [
        vec!["bench", "--runtime", "3s", "--iodepth", "8", url.as_str()],
        vec![
            "cdm",
            "--passes",
            "1",
            "--duration",
            "400ms",
            "--size",
            "16M",
            url.as_str(),
        ],
    ]
    .into_iter()
    .enumerate()
    {
        let job = ironsan()
            .args(&run)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1200));
        admin(&["add-lun", IQN, "mem:1M"]);
        admin(&["resize-lun", IQN, "0", &format!("{}M", 65 + i)]);
        let out = job.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{run:?}: {text}");
        assert!(
            !text.contains("Error") && !text.contains("failed"),
            "{run:?}: {text}"
        );
        if i == 0 {
            assert!(text.contains(" 0 errors"), "{text}");
            assert!(
                text.contains("UNIT ATTENTIONs and NOT READYs retried"),
                "{text}"
            );
        }
        admin(&["remove-lun", IQN, "1"]);
    }
}

/// A read run on a file that does not exist lays it out first, as fio
/// does (no holes to "read" at memory speed); nothing is made up under
/// /dev; a --size beyond a LUN is refused rather than cut short.
#[test]
fn files_are_laid_out_and_sizes_are_honest() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("new.img");
    let fs = f.to_str().unwrap();
    ok(&[
        "bench",
        "--rw",
        "read",
        "--size",
        "8M",
        "--runtime",
        "300ms",
        fs,
    ]);
    let m = std::fs::metadata(&f).unwrap();
    assert_eq!(m.len(), 8 << 20);
    assert!(
        m.blocks() * 512 >= 8 << 20,
        "sparse: {} bytes allocated",
        m.blocks() * 512
    );
    let data = std::fs::read(&f).unwrap();
    assert!(
        data.iter().any(|&b| b != 0),
        "laid out with data, not zeros"
    );
    refused(
        &[
            "bench",
            "--rw",
            "read",
            "--size",
            "8M",
            "--runtime",
            "300ms",
            "/dev/ironsan-no-such-disk",
        ],
        "no such device",
    );
    assert!(!std::path::Path::new("/dev/ironsan-no-such-disk").exists());
    let s = Server::start(1, &["mem:16M"]);
    refused(
        &["bench", "--size", "1G", "--runtime", "300ms", &s.url(0, 0)],
        "beyond the target",
    );
}

/// `trim`/`randtrim` deallocate for real: a punched hole in a file (psync
/// and io_uring), UNMAP through the built-in initiator on one path and on
/// several, reported in fio's `trim` section and logs (ddir 2); a LU
/// without UNMAP answers INVALID COMMAND OPERATION CODE and the run fails.
#[test]
fn trims_deallocate_files_and_luns() {
    use std::os::unix::fs::MetadataExt;
    let allocated = |p: &std::path::Path| std::fs::metadata(p).unwrap().blocks() * 512;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("data");
    let fs = f.to_str().unwrap();
    ok(&["bench", "--rw", "write", "--bs", "1M", "--size", "16M", fs]);
    assert!(allocated(&f) >= 16 << 20, "{}", allocated(&f));
    let v = json(&[
        "bench",
        "--ioengine",
        "psync",
        "--rw",
        "trim",
        "--bs",
        "1M",
        "--size",
        "8M",
        fs,
    ]);
    let t = &v["jobs"][0]["trim"];
    assert_eq!(t["total_ios"], 8, "{t}");
    assert_eq!(t["io_bytes"], 8 << 20, "{t}");
    assert_eq!(v["jobs"][0]["read"]["total_ios"], 0);
    assert_eq!(v["jobs"][0]["write"]["total_ios"], 0);
    assert!(t["clat_ns"]["percentile"]["99.000000"].as_u64().unwrap() > 0);
    let a = allocated(&f);
    assert!(
        (8 << 20..12 << 20).contains(&a),
        "{a} bytes allocated after trimming half"
    );
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 16 << 20, "size kept");
    // io_uring, random, with fio's logs.
    let log = dir.path().join("trimlog");
    let log = log.to_str().unwrap();
    let v = json(&[
        "bench",
        "--ioengine",
        "io_uring",
        "--rw",
        "randtrim",
        "--bs",
        "64k",
        "--runtime",
        "1",
        "--write_iops_log",
        log,
        fs,
    ]);
    assert!(v["jobs"][0]["trim"]["iops"].as_f64().unwrap() > 0.0);
    assert!(allocated(&f) < a, "random trims freed nothing");
    let lines = std::fs::read_to_string(format!("{log}_iops.1.log")).unwrap();
    assert!(
        !lines.is_empty() && lines.lines().all(|l| l.split(", ").nth(2) == Some("2")),
        "{lines}"
    );
    refused(
        &["bench", "--verify", "--rw", "randtrim", "--size", "1M", fs],
        "--verify",
    );

    // Through the target: UNMAP reaches the LUN's file.
    let lun = dir.path().join("lun");
    let lun_spec = format!("file:{}:16M", lun.display());
    let s = Server::start(2, &[&lun_spec, "null:16M"]);
    let url = s.url(0, 0);
    ok(&["bench", "--rw", "write", "--bs", "1M", &url]);
    assert!(allocated(&lun) >= 16 << 20);
    let v = json(&["bench", "--rw", "trim", "--bs", "1M", "--size", "8M", &url]);
    assert_eq!(v["jobs"][0]["trim"]["total_ios"], 8);
    assert!(allocated(&lun) <= 8 << 20, "{}", allocated(&lun));
    let v = json(&[
        "bench",
        "--multipath",
        "rr",
        "--rw",
        "randtrim",
        "--bs",
        "64k",
        "--runtime",
        "1",
        &url,
        &s.url(1, 0),
    ]);
    assert!(v["jobs"][0]["trim"]["total_ios"].as_u64().unwrap() > 0);
    assert!(v["ironsan"]["paths"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["ios"].as_u64().unwrap() > 0));
    assert!(allocated(&lun) < 8 << 20, "{}", allocated(&lun));
    // The null LU has no thin provisioning: UNMAP is not a command there.
    refused(
        &[
            "bench",
            "--rw",
            "randtrim",
            "--runtime",
            "300ms",
            &s.url(0, 1),
        ],
        "I/O errors",
    );
    let out = run(&[
        "bench",
        "--rw",
        "randtrim",
        "--runtime",
        "300ms",
        &s.url(0, 1),
    ]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("INVALID COMMAND OPERATION CODE"),
        "{out:?}"
    );
}

/// fio's spellings: --name=value forms, --filename, --direct=1,
/// --time_based, --output-format=json, --group_reporting, --rwmixwrite;
/// a fio job file; unsupported options and formats refused by name.
#[test]
fn fio_command_lines_and_job_files() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f.img");
    let fs = f.to_str().unwrap();
    let fname = format!("--filename={fs}");
    let v = json(&[
        "bench",
        &fname,
        "--size=8M",
        "--direct=1",
        "--time_based",
        "--runtime=500ms",
        "--output-format=json",
        "--group_reporting",
        "--rw=randrw",
        "--rwmixwrite=30",
        "--numjobs=2",
        "--ioengine=psync",
    ]);
    let job = &v["jobs"][0];
    let (r, w) = (
        job["read"]["total_ios"].as_f64().unwrap(),
        job["write"]["total_ios"].as_f64().unwrap(),
    );
    assert!(r > 0.0 && w > 0.0, "{job}");
    let share = w / (r + w);
    assert!(
        (0.2..0.4).contains(&share),
        "writes {share:.2} of I/Os, want about 0.30"
    );

    let jf = dir.path().join("job.fio");
    std::fs::write(
        &jf,
        format!(
            "; fio job file\n[global]\nioengine=psync\ndirect=1\nbs=4k\nsize=8M\n\n[randread-test]\nfilename={fs}\nrw=randread\niodepth=1\nruntime=300ms\ntime_based\n"
        ),
    )
    .unwrap();
    let out = ok(&["bench", jf.to_str().unwrap()]);
    assert!(
        out.starts_with("randread-test: rw=randread, bs=4096"),
        "{out}"
    );
    assert!(out.contains("ioengine=psync"), "{out}");

    let bad = dir.path().join("bad.fio");
    std::fs::write(
        &bad,
        format!("[global]\nbogus_option=1\n[j]\nfilename={fs}\n"),
    )
    .unwrap();
    refused(&["bench", bad.to_str().unwrap()], "--bogus_option");
    // Several jobs run at once, as fio runs them; one JSON document.
    let two = dir.path().join("two.fio");
    std::fs::write(
        &two,
        format!("[global]\nfilename={fs}\nsize=8M\nruntime=300ms\ntime_based\nioengine=psync\n[reader]\nrw=randread\n[writer]\nrw=randwrite\n"),
    )
    .unwrap();
    let v = json(&["bench", "--output-format=json", two.to_str().unwrap()]);
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    assert_eq!(
        (jobs[0]["jobname"].as_str(), jobs[1]["jobname"].as_str()),
        (Some("reader"), Some("writer"))
    );
    assert!(jobs[0]["read"]["total_ios"].as_u64().unwrap() > 0);
    assert!(jobs[1]["write"]["total_ios"].as_u64().unwrap() > 0);
    let text = ok(&["bench", two.to_str().unwrap()]);
    assert!(
        text.contains("reader: rw=randread") && text.contains("writer: rw=randwrite"),
        "{text}"
    );
    // stonewall: the trimmer waits for the reader and writer (which run at
    // once) and is group 1; so the file takes at least two runtimes.
    let walled = dir.path().join("walled.fio");
    std::fs::write(
        &walled,
        format!("[global]\nfilename={fs}\nsize=8M\nruntime=500ms\ntime_based\nioengine=psync\n[reader]\nrw=randread\n[writer]\nrw=randwrite\n[trimmer]\nstonewall\nrw=randtrim\n"),
    )
    .unwrap();
    let t0 = std::time::Instant::now();
    let v = json(&["bench", walled.to_str().unwrap()]);
    let took = t0.elapsed();
    let jobs = v["jobs"].as_array().unwrap();
    let groups: Vec<_> = jobs.iter().map(|j| j["groupid"].as_u64()).collect();
    assert_eq!(groups, vec![Some(0), Some(0), Some(1)]);
    assert!(jobs[2]["trim"]["total_ios"].as_u64().unwrap() > 0);
    assert!(
        took >= Duration::from_millis(1000),
        "{took:?}: not one after the other"
    );
    refused(&["bench", "--output-format=xml", fs], "--output-format=xml");
    refused(
        &["bench", "--rwmixwrite=30", "--rwmixread=70", fs],
        "rwmixread",
    );
    refused(&["bench", "--log_avg_msec=500", fs], "--log_avg_msec=500");
    refused(
        &["bench", "--percentile_list=50:101", fs],
        "--percentile_list",
    );

    // fio's percentile_list, and its per-second logs.
    let v = json(&[
        "bench",
        "--size=8M",
        "--runtime=2",
        "--percentile_list=50:99:99.9",
        "--output-format=json",
        &format!("--write_bw_log={}/run", dir.path().display()),
        &format!("--write_iops_log={}/run", dir.path().display()),
        &format!("--write_lat_log={}/run", dir.path().display()),
        fs,
    ]);
    let pct = v["jobs"][0]["read"]["clat_ns"]["percentile"]
        .as_object()
        .unwrap();
    let keys: Vec<_> = pct.keys().map(String::as_str).collect();
    assert_eq!(keys, ["50.000000", "99.000000", "99.900000"]);
    for log in [
        "run_bw.1.log",
        "run_iops.1.log",
        "run_clat.1.log",
        "run_lat.1.log",
    ] {
        let text = std::fs::read_to_string(dir.path().join(log)).unwrap();
        let first = text
            .lines()
            .next()
            .unwrap_or_else(|| panic!("{log} is empty"));
        let f: Vec<&str> = first.split(", ").collect();
        assert_eq!(f.len(), 5, "{log}: {first}");
        assert_eq!(
            (f[0], f[2], f[3], f[4]),
            ("1000", "0", "0", "0"),
            "{log}: {first}"
        );
        assert!(f[1].parse::<u64>().unwrap() > 0, "{log}: {first}");
        // A 2 s run has two seconds: the I/Os in flight at the deadline
        // count in the second, not in a third of their own.
        let secs: std::collections::BTreeSet<&str> =
            text.lines().filter_map(|l| l.split(", ").next()).collect();
        assert_eq!(
            secs.into_iter().collect::<Vec<_>>(),
            ["1000", "2000"],
            "{log}"
        );
    }
}

/// Every key of a real fio 3.33 `--output-format=json+` report is in
/// bench's (disk_util included: the file's block device), and
/// fio's own fio_jsonplus_clat2csv turns bench's json+ into a CSV with
/// rows and validates it. Needs Debian's fio: scripts/test.sh runs it
/// with --ignored (.ci/run installs fio).
#[test]
#[ignore = "needs Debian's fio and fio_jsonplus_clat2csv: scripts/test.sh runs it with --ignored"]
fn json_has_fios_layout_and_fios_tools_read_it() {
    fn keys(v: &serde_json::Value, at: &str, out: &mut std::collections::BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    let p = format!("{at}{k}");
                    out.insert(p.clone());
                    if k != "bins" {
                        keys(x, &format!("{p}."), out);
                    }
                }
            }
            serde_json::Value::Array(a) => {
                if let Some(x) = a.first() {
                    keys(x, &format!("{at}[]."), out);
                }
            }
            _ => {}
        }
    }
    let have = |c: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {c}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    assert!(
        have("fio") && have("fio_jsonplus_clat2csv"),
        "fio and fio_jsonplus_clat2csv are not installed (apt-get install fio)"
    );
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f.img");
    let fs = f.to_str().unwrap();
    let fio = Command::new("fio")
        .args([
            "--name=ref",
            &format!("--filename={fs}"),
            "--size=4M",
            "--rw=randrw",
            "--bs=4k",
            "--runtime=1",
            "--time_based",
            "--ioengine=psync",
            "--output-format=json+",
        ])
        .output()
        .unwrap();
    assert!(
        fio.status.success(),
        "{}",
        String::from_utf8_lossy(&fio.stderr)
    );
    let reference: serde_json::Value = serde_json::from_slice(&fio.stdout).unwrap();
    let ours = run(&[
        "bench",
        &format!("--filename={fs}"),
        "--size=4M",
        "--rw=randrw",
        "--runtime=1",
        "--time_based",
        "--ioengine=psync",
        "--output-format=json+",
    ]);
    assert!(ours.status.success());
    let mine: serde_json::Value = serde_json::from_slice(&ours.stdout).unwrap();
    let (mut want, mut got) = (Default::default(), Default::default());
    keys(&reference, "", &mut want);
    keys(&mine, "", &mut got);
    let missing: Vec<_> = want.difference(&got).collect();
    assert!(
        missing.is_empty(),
        "keys fio has and bench lacks: {missing:?}"
    );
    let pct = mine["jobs"][0]["read"]["clat_ns"]["percentile"]
        .as_object()
        .unwrap();
    assert_eq!(pct.len(), 17, "fio's 17 default percentiles");
    let json = dir.path().join("bench.json");
    std::fs::write(&json, &ours.stdout).unwrap();
    let csv = dir.path().join("bench.csv");
    let out = Command::new("fio_jsonplus_clat2csv")
        .arg(&json)
        .arg(&csv)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let made = dir.path().join("bench_job0.csv");
    let rows = std::fs::read_to_string(&made).unwrap().lines().count();
    assert!(rows > 10, "{rows} CSV lines");
    let out = Command::new("fio_jsonplus_clat2csv")
        .args(["--validate"])
        .arg(&json)
        .arg(&csv)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("validated"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // fio's terse version 3: as many fields as fio's, of the same kind at
    // every position (numbers, `P%=v` percentiles, `N%` shares, names).
    let terse = |cmd: &mut Command| {
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let common = [
        format!("--filename={fs}"),
        "--size=4M".into(),
        "--rw=randrw".into(),
        "--runtime=1".into(),
        "--time_based".into(),
        "--ioengine=psync".into(),
        "--output-format=terse".into(),
    ];
    let theirs = terse(Command::new("fio").arg("--name=ref").args(&common));
    let ours = terse(ironsan().arg("bench").args(&common));
    let kind = |x: &str| {
        if x.contains("%=") {
            "pct="
        } else if x.ends_with('%') {
            "share"
        } else if x.parse::<f64>().is_ok() {
            "number"
        } else {
            "text"
        }
    };
    let (t, o): (Vec<&str>, Vec<&str>) = (theirs.split(';').collect(), ours.split(';').collect());
    assert_eq!(t.len(), o.len(), "fio: {theirs}\nbench: {ours}");
    for (i, (a, b)) in t.iter().zip(&o).enumerate() {
        assert_eq!(kind(a), kind(b), "field {i}: fio {a:?}, bench {b:?}");
    }
    assert_eq!(o[0], "3");
    // fio2gnuplot reads bench's bandwidth logs.
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let out = run(&[
        "bench",
        &format!("--filename={fs}"),
        "--size=4M",
        "--runtime=2",
        &format!("--write_bw_log={}/bench", logs.display()),
    ]);
    assert!(out.status.success());
    let out = Command::new("fio2gnuplot")
        .args(["-b"])
        .current_dir(&logs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let avg = std::fs::read_to_string(logs.join("result.average")).unwrap();
    assert!(!avg.trim().is_empty(), "fio2gnuplot computed nothing");
}
