//! The multi-node bench end to end: three `ironsan bench --server`
//! processes and one `ironsan serve` on loopback, driven by a coordinator
//! (`ironsan bench --client …`); dead and vanishing peers.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const IQN: &str = "iqn.2026-11.io.ironsan:target0";

fn ironsan() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ironsan"));
    // Servers always require a token: every process here shares this one
    // unless a test says otherwise.
    c.env("RUST_BACKTRACE", "0")
        .env("IRONSAN_BENCH_TOKEN", "test-bench-token-0123");
    c
}

/// A child process killed on drop, with the address it printed.
struct Proc {
    child: Child,
    addr: String,
}

impl Proc {
    /// Starts `args` and waits for the stdout line starting with `prefix`.
    fn start(args: &[&str], prefix: &str) -> Proc {
        let mut child = ironsan()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let mut lines = BufReader::new(out).lines();
        let addr = loop {
            let line = lines.next().expect("the address line").unwrap();
            if let Some(a) = line.strip_prefix(prefix) {
                break a.trim().to_string();
            }
        };
        // Keep reading stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Proc { child, addr }
    }

    fn target() -> Proc {
        Proc::start(
            &[
                "--log",
                "warn",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--lun",
                "null:256M",
            ],
            "ironsan: listening on ",
        )
    }

    fn bench_server(extra: &[&str]) -> Proc {
        let mut a = vec!["--log", "warn", "bench", "--server", "127.0.0.1:0"];
        a.extend(extra);
        Proc::start(&a, "ironsan bench: server listening on ")
    }

    fn url(&self) -> String {
        format!("iscsi://{}/{IQN}/0", self.addr)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(args: &[&str]) -> Output {
    ironsan().args(args).output().unwrap()
}

fn client_args(servers: &[String]) -> Vec<&str> {
    servers
        .iter()
        .flat_map(|s| ["--client", s.as_str()])
        .collect()
}

#[test]
fn three_servers_merge_into_one_result() {
    let t = Proc::target();
    let servers: Vec<Proc> = (0..3).map(|_| Proc::bench_server(&[])).collect();
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    let url = t.url();
    let mut args = vec!["bench"];
    args.extend(client_args(&addrs));
    args.extend([
        "--rw",
        "randrw",
        "--bs",
        "4k",
        "--iodepth",
        "4",
        "--runtime",
        "1s",
        "--json",
        &url,
    ]);
    let out = run(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let clients = v["client_stats"].as_array().unwrap();
    assert_eq!(clients.len(), 4, "three nodes and All clients");
    let nodes = v["ironsan"]["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);
    for (i, a) in addrs.iter().enumerate() {
        assert_eq!(clients[i]["client"], a.as_str());
        assert_eq!(nodes[i]["client"], a.as_str());
        assert_eq!(nodes[i]["share"]["count"], 3);
    }
    let merged = &v["jobs"][0];
    assert_eq!(clients[3]["hostname"], "All clients");
    assert_eq!(clients[3]["read"], merged["read"]);
    assert_eq!(clients[3]["write"], merged["write"]);
    for dir in ["read", "write"] {
        let sum: u64 = clients[..3]
            .iter()
            .map(|c| c[dir]["total_ios"].as_u64().unwrap())
            .sum();
        let lat_n: u64 = clients[..3]
            .iter()
            .map(|c| c[dir]["clat_ns"]["N"].as_u64().unwrap())
            .sum();
        for c in &clients[..3] {
            assert!(c[dir]["total_ios"].as_u64().unwrap() > 0, "{dir}: {c}");
        }
        assert!(sum > 0);
        assert_eq!(merged[dir]["total_ios"].as_u64().unwrap(), sum, "{dir}");
        assert_eq!(
            merged[dir]["clat_ns"]["N"].as_u64().unwrap(),
            lat_n,
            "{dir}"
        );
        assert_eq!(lat_n, sum);
        // Percentiles in order, within the nodes' extremes.
        let p = &merged[dir]["clat_ns"]["percentile"];
        let q: Vec<u64> = ["50.000000", "99.000000", "99.900000", "99.990000"]
            .iter()
            .map(|k| p[*k].as_u64().unwrap())
            .collect();
        assert!(q.windows(2).all(|w| w[0] <= w[1]), "{q:?}");
        let min = merged[dir]["clat_ns"]["min"].as_u64().unwrap();
        let max = merged[dir]["clat_ns"]["max"].as_u64().unwrap();
        assert!(min > 0 && min <= q[0] && q[3] <= max, "{min} {q:?} {max}");
        let node_max = clients[..3]
            .iter()
            .map(|c| c[dir]["clat_ns"]["max"].as_u64().unwrap())
            .max()
            .unwrap();
        assert_eq!(max, node_max);
        let iops = merged[dir]["iops"].as_f64().unwrap();
        let node_iops: f64 = clients[..3]
            .iter()
            .map(|c| c[dir]["iops"].as_f64().unwrap())
            .sum();
        assert!(
            (iops - node_iops).abs() / node_iops < 0.2,
            "{iops} {node_iops}"
        );
    }
    let w = &v["ironsan"]["stonewall"];
    let total = merged["read"]["total_ios"].as_u64().unwrap()
        + merged["write"]["total_ios"].as_u64().unwrap();
    let sw = w["total_ios"].as_u64().unwrap();
    assert!(sw > 0 && sw <= total, "{w}");
    assert!(w["at_us"].as_u64().unwrap() >= 900_000, "{w}");
    assert!(addrs.contains(&w["first_to_finish"].as_str().unwrap().to_string()));
    let per_node: u64 = nodes
        .iter()
        .map(|n| n["stonewall_ios"].as_u64().unwrap())
        .sum();
    assert_eq!(per_node, sw);

    // The same servers serve the next job; text output names every node.
    let mut args = vec!["bench"];
    args.extend(client_args(&addrs));
    args.extend(["--rw", "read", "--bs", "64k", "--size", "8M", &url]);
    let out = run(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for a in &addrs {
        assert!(text.contains(&format!("node {a} (")), "{text}");
    }
    assert!(text.contains("all 3 nodes, merged:") && text.contains("stonewall: IOPS="));
    // 8 MiB split over three nodes: 128 reads of 64 KiB in all.
    assert!(
        text.contains("All clients:") && text.contains(" 128 I/Os in"),
        "{text}"
    );
}

#[test]
fn per_node_targets_and_the_token() {
    let t1 = Proc::target();
    let t2 = Proc::target();
    let a = Proc::bench_server(&["--token", "tok-123"]);
    let b = Proc::bench_server(&["--token", "tok-123"]);
    let (u1, u2) = (t1.url(), t2.url());
    let cb = format!("{}={u2}", b.addr);
    let args = [
        "bench",
        "--client",
        &a.addr,
        "--client",
        &cb,
        "--runtime",
        "500ms",
        "--json",
        &u1,
    ];
    let out = run(&args);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("token"), "{err}");
    let out = ironsan()
        .args(args)
        .env("IRONSAN_BENCH_TOKEN", "tok-123")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let nodes = v["ironsan"]["nodes"].as_array().unwrap();
    assert_eq!(nodes[0]["ironsan"]["targets"][0], u1.as_str());
    assert_eq!(nodes[1]["ironsan"]["targets"][0], u2.as_str());
    // Different targets: each node has the whole of its own.
    assert_eq!(nodes[0]["share"]["count"], 1);
    assert_eq!(nodes[1]["share"]["count"], 1);
}

#[test]
fn dead_and_vanishing_servers_give_clear_errors() {
    let t = Proc::target();
    let url = t.url();
    // Nothing listening.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    let out = run(&["bench", "--client", &closed_addr, "--runtime", "1s", &url]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&closed_addr) && err.contains("refused"),
        "{err}"
    );
    // Listening, never answering: the hello times out.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    let start = Instant::now();
    let out = run(&[
        "bench",
        "--client",
        &silent_addr,
        "--client-timeout",
        "1s",
        "--runtime",
        "1s",
        &url,
    ]);
    assert!(start.elapsed() < Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no answer within"),
        "{err}"
    );
    drop(silent);

    // A server killed mid-run: the coordinator says which and stops.
    let a = Proc::bench_server(&[]);
    let mut b = Proc::bench_server(&[]);
    let coord = ironsan()
        .args([
            "bench",
            "--client",
            &a.addr,
            "--client",
            &b.addr,
            "--client-timeout",
            "2s",
            "--runtime",
            "30s",
            "--iodepth",
            "1",
            &url,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let _ = b.child.kill();
    let start = Instant::now();
    let out = coord.wait_with_output().unwrap();
    assert!(start.elapsed() < Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(&b.addr), "{err}");

    // The surviving server stopped that job and takes the next one.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = run(&["bench", "--client", &a.addr, "--runtime", "300ms", &url]);
        if out.status.success() {
            break;
        }
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(err.contains("busy") && Instant::now() < deadline, "{err}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_server_without_a_given_token_makes_one() {
    // No token given: the server writes one (0600) into its state
    // directory; a coordinator on the same host reads it there, one
    // without it is refused.
    let state = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let t = Proc::target();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ironsan"))
        .args(["--log", "warn", "bench", "--server", "127.0.0.1:0"])
        .env_remove("IRONSAN_BENCH_TOKEN")
        .env("IRONSAN_STATE_DIR", state.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("the address line").unwrap();
        if let Some(a) = line.strip_prefix("ironsan bench: server listening on ") {
            break a.trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let s = Proc { child, addr };
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(state.path().join("bench.token"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let url = t.url();
    let coord = |dir: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_ironsan"))
            .args(["bench", "--client", &s.addr, "--runtime", "300ms", &url])
            .env_remove("IRONSAN_BENCH_TOKEN")
            .env("IRONSAN_STATE_DIR", dir)
            .output()
            .unwrap()
    };
    let out = coord(elsewhere.path());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("token"));
    let out = coord(state.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn server_refuses_targets_and_coordinator_needs_a_target() {
    let out = run(&["bench", "--server", "127.0.0.1:0", "/tmp/x"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--server takes no targets"));
    let out = run(&["bench", "--client", "127.0.0.1:1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no target"), "{err}");
}
