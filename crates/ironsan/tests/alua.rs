//! `ironsan bench --multipath` against a target with ALUA groups, as Linux
//! `scsi_dh_alua` + dm-multipath would drive it: I/O only through the
//! active/optimized group, failover to a standby group (explicit SET TARGET
//! PORT GROUPS, or the target's own move) when the optimized portal goes
//! away, and state changes retried, never failed.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const IQN: &str = "iqn.2026-11.io.ironsan:alua";

fn ironsan() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ironsan"));
    c.env("RUST_BACKTRACE", "0")
        .env_remove("IRONSAN_ADMIN_URL")
        .env_remove("IRONSAN_ADMIN_SOCKET")
        .env_remove("IRONSAN_ADMIN_TOKEN");
    c
}

/// A free loopback port (bound and released: `listen` needs distinct ports).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `ironsan serve` with two portals, each its own ALUA group (ids 1 and 2),
/// and the admin API; killed on drop.
struct Server {
    child: Child,
    portals: Vec<String>,
    /// NVMe/TCP ports: port n's ANA state is portal n's ALUA group's.
    nvme: Vec<String>,
    admin: String,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(explicit: bool, states: [&str; 2]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("alua.toml");
        let (p1, p2) = (free_port(), free_port());
        let (n1, n2) = (free_port(), free_port());
        std::fs::write(
            &cfg,
            format!(
                "listen = [\"127.0.0.1:{p1}\", \"127.0.0.1:{p2}\"]\n\
                 nvme_listen = [\"127.0.0.1:{n1}\", \"127.0.0.1:{n2}\"]\n\
                 [alua]\nexplicit = {explicit}\n\
                 [[alua.group]]\nid = 1\nportals = [1]\nstate = \"{}\"\n\
                 [[alua.group]]\nid = 2\nportals = [2]\nstate = \"{}\"\n\
                 [[target]]\nname = \"{IQN}\"\n\
                 [[target.lun]]\nbackend = \"mem\"\nsize = \"32M\"\n",
                states[0], states[1]
            ),
        )
        .unwrap();
        let mut child = ironsan()
            .args(["--log", "warn", "serve", "--config"])
            .arg(&cfg)
            .args(["--admin", "127.0.0.1:0", "--state-dir"])
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let mut lines = BufReader::new(out).lines();
        let (mut portals, mut admin, mut nvme) = (Vec::new(), String::new(), Vec::new());
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(a) = line.strip_prefix("ironsan: NVMe/TCP on ") {
                nvme.push(a.trim().to_string());
            }
            if let Some(a) = line.strip_prefix("ironsan: listening on ") {
                portals.push(a.trim().to_string());
            }
            if let Some(a) = line.strip_prefix("ironsan: admin API and console on ") {
                admin = a.trim().trim_end_matches('/').to_string();
            }
            if line.contains("try  iscsi-ls") {
                break;
            }
        }
        std::thread::spawn(move || for _ in lines {});
        assert_eq!(portals.len(), 2, "listening lines");
        assert!(!admin.is_empty(), "admin line");
        assert_eq!(nvme.len(), 2, "NVMe/TCP lines");
        Server {
            child,
            portals,
            nvme,
            admin,
            _dir: dir,
        }
    }

    fn url(&self, portal: usize) -> String {
        format!("iscsi://{}/{IQN}/0", self.portals[portal])
    }

    /// The namespace of LUN 0 through NVMe/TCP port `port`.
    fn nvme_url(&self, port: usize) -> String {
        format!(
            "nvme-tcp://{}/nqn.{}/1",
            self.nvme[port],
            IQN.trim_start_matches("iqn.")
        )
    }

    fn admin(&self, args: &[&str]) {
        let out = ironsan()
            .args(["admin", "--url", &self.admin, "--state-dir"])
            .arg(self._dir.path())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "admin {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn json_of(args: &[&str], out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn bench(args: &[&str]) -> serde_json::Value {
    let mut a = vec!["bench"];
    a.extend(args);
    a.push("--json");
    let out = ironsan().args(&a).output().unwrap();
    json_of(&a, &out)
}

/// Fills the test area with verify patterns; returns the run id.
fn fill(s: &Server) -> String {
    fill_paths(&s.url(0), &s.url(1))
}

/// Fills the test area through paths `a` and `b`; returns the run id.
fn fill_paths(a: &str, b: &str) -> String {
    let v = bench(&[
        "--multipath",
        "lqd",
        "--rw",
        "write",
        "--verify",
        "--size",
        "8M",
        a,
        b,
    ]);
    v["ironsan"]["verify"]["run_id"]
        .as_str()
        .expect("run id")
        .to_string()
}

/// Runs a verified randrw bench for `secs` over both portals, calling
/// `during` after `at`; returns its report.
fn bench_while(
    s: &Server,
    id: &str,
    secs: u32,
    at: Duration,
    during: impl FnOnce(),
) -> serde_json::Value {
    let runtime = secs.to_string();
    let args = [
        "bench",
        "--multipath",
        "lqd",
        "--rw",
        "randrw",
        "--verify",
        "--verify-id",
        id,
        "--size",
        "8M",
        "--runtime",
        &runtime,
        "--json",
        &s.url(0),
        &s.url(1),
    ];
    verified_while(&args, at, during)
}

/// Runs `ironsan ARGS` (a verified bench), calling `during` after `at`;
/// its report, which must show no error and verified data.
fn verified_while(args: &[&str], at: Duration, during: impl FnOnce()) -> serde_json::Value {
    let child = ironsan()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(at);
    during();
    let out = child.wait_with_output().unwrap();
    let v = json_of(args, &out);
    assert_eq!(v["jobs"][0]["error"], 0, "{v}");
    assert!(
        v["ironsan"]["verify"]["verified_bytes"].as_u64().unwrap() > 0,
        "{}",
        v["ironsan"]["verify"]
    );
    v
}

fn paths(v: &serde_json::Value) -> Vec<serde_json::Value> {
    v["ironsan"]["paths"].as_array().unwrap().clone()
}

#[test]
fn io_goes_only_to_the_optimized_group() {
    let s = Server::start(true, ["active-optimized", "standby"]);
    for policy in ["lqd", "rr"] {
        let v = bench(&[
            "--multipath",
            policy,
            "--rw",
            "randrw",
            "--runtime",
            "1",
            &s.url(0),
            &s.url(1),
        ]);
        let p = paths(&v);
        assert!(p[0]["ios"].as_u64().unwrap() > 0, "{p:?}");
        assert_eq!(p[1]["ios"], 0, "{policy}: {p:?}");
        assert_eq!(
            (&p[0]["group"], &p[0]["state"]),
            (&1.into(), &"active/optimized".into())
        );
        assert_eq!(
            (&p[1]["group"], &p[1]["state"]),
            (&2.into(), &"standby".into())
        );
        assert_eq!(p[1]["failovers"], 0);
    }
    // The standby path alone: the engine activates its group first.
    let v = bench(&["--multipath", "lqd", "--runtime", "1", &s.url(1), &s.url(1)]);
    let p = paths(&v);
    assert_eq!(p[0]["state"], "active/optimized", "{p:?}");
    assert!(p[0]["ios"].as_u64().unwrap() > 0, "{p:?}");
}

#[test]
fn explicit_failover_when_the_optimized_portal_goes_away() {
    let s = Server::start(true, ["active-optimized", "standby"]);
    let id = fill(&s);
    let v = bench_while(&s, &id, 4, Duration::from_millis(1500), || {
        s.admin(&["remove-portal", "1"])
    });
    let p = paths(&v);
    assert!(p[0]["failed"].is_string(), "{p:?}");
    assert!(p[1]["ios"].as_u64().unwrap() > 0, "{p:?}");
    assert_eq!(p[1]["failovers"], 1, "{p:?}");
    assert_eq!(p[1]["state"], "active/optimized", "{p:?}");
    // I/O went on after the failover.
    let series = v["ironsan"]["series"].as_array().unwrap();
    assert!(series.len() >= 4, "{series:?}");
    assert!(series[3]["read_iops"].as_u64().unwrap() > 0, "{series:?}");
}

#[test]
fn implicit_takeover_is_waited_for() {
    // Without explicit ALUA the initiator cannot move the groups: it keeps
    // reading them until the target (here: the admin) activates one.
    let s = Server::start(false, ["active-optimized", "standby"]);
    let id = fill(&s);
    let v = bench_while(&s, &id, 4, Duration::from_millis(1000), || {
        s.admin(&["remove-portal", "1"]);
        std::thread::sleep(Duration::from_millis(700));
        s.admin(&["set-alua", "2", "active-optimized"]);
    });
    let p = paths(&v);
    assert!(p[0]["failed"].is_string(), "{p:?}");
    assert!(p[1]["ios"].as_u64().unwrap() > 0, "{p:?}");
    assert_eq!(p[1]["failovers"], 0, "{p:?}");
    assert_eq!(p[1]["state"], "active/optimized", "{p:?}");
}

#[test]
fn state_changes_are_retried_not_failed() {
    // The target moves the optimized group from portal 1 to portal 2 while
    // I/O runs: the I/Os answered ASYMMETRIC ACCESS STATE CHANGED or
    // NOT READY (standby) are sent again, through portal 2.
    let s = Server::start(true, ["active-optimized", "standby"]);
    let id = fill(&s);
    let v = bench_while(&s, &id, 4, Duration::from_millis(1000), || {
        s.admin(&["set-alua", "2", "active-optimized"]);
        s.admin(&["set-alua", "1", "standby"]);
    });
    let p = paths(&v);
    assert!(p.iter().all(|p| p["failed"].is_null()), "{p:?}");
    assert!(p.iter().all(|p| p["ios"].as_u64().unwrap() > 0), "{p:?}");
    let retries: u64 = p.iter().map(|p| p["retries"].as_u64().unwrap()).sum();
    assert!(retries > 0, "{p:?}");
    assert_eq!(
        (&p[0]["state"], &p[1]["state"]),
        (&"standby".into(), &"active/optimized".into()),
        "{p:?}"
    );
    // The initiator followed the target's choice instead of undoing it.
    assert!(p.iter().all(|p| p["failovers"] == 0), "{p:?}");
}

#[test]
fn a_single_path_waits_out_not_ready() {
    // One path, through a port in standby (NOT READY 04/0B) until the
    // target makes it active: the I/Os are sent again (not failed), and
    // the report says so.
    let s = Server::start(false, ["standby", "standby"]);
    let args = [
        "bench",
        "--rw",
        "randwrite",
        "--size",
        "8M",
        "--runtime",
        "3",
        "--json",
    ];
    let url = s.url(0);
    let child = ironsan()
        .args(args)
        .arg(&url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    s.admin(&["set-alua", "1", "active-optimized"]);
    let out = child.wait_with_output().unwrap();
    let v = json_of(&args, &out);
    assert_eq!(v["jobs"][0]["error"], 0, "{v}");
    assert!(
        v["jobs"][0]["write"]["total_ios"].as_u64().unwrap() > 0,
        "{v}"
    );
    let notes = v["ironsan"]["notes"].to_string();
    assert!(
        notes.contains("NOT READYs retried") && notes.contains("2/04/0b"),
        "{notes}"
    );
}

/// A verified randrw bench over both NVMe/TCP ports (native-multipath
/// style, ANA aware) for `secs`, calling `during` after `at`.
fn nvme_bench_while(
    s: &Server,
    secs: u32,
    at: Duration,
    during: impl FnOnce(),
) -> serde_json::Value {
    let runtime = secs.to_string();
    let (u0, u1) = (s.nvme_url(0), s.nvme_url(1));
    // The area written with verify patterns first.
    let id = fill_paths(&u0, &u1);
    let args = [
        "bench",
        "--multipath",
        "rr",
        "--rw",
        "randrw",
        "--verify",
        "--verify-id",
        &id,
        "--size",
        "8M",
        "--runtime",
        &runtime,
        "--json",
        &u0,
        &u1,
    ];
    verified_while(&args, at, during)
}

#[test]
fn nvme_io_follows_the_ana_states() {
    let s = Server::start(true, ["active-optimized", "standby"]);
    // Port 2 is ANA inaccessible: nothing goes there.
    for policy in ["rr", "lqd"] {
        let v = bench(&[
            "--multipath",
            policy,
            "--rw",
            "randrw",
            "--runtime",
            "1",
            &s.nvme_url(0),
            &s.nvme_url(1),
        ]);
        assert_eq!(v["ironsan"]["ioengine"], "nvme-multipath", "{v}");
        let p = paths(&v);
        assert!(p[0]["ios"].as_u64().unwrap() > 0, "{p:?}");
        assert_eq!(p[1]["ios"], 0, "{policy}: {p:?}");
        assert_eq!(
            (&p[0]["state"], &p[1]["state"]),
            (&"optimized".into(), &"inaccessible".into())
        );
    }
    // Both optimized: both carry I/O. Then port 1's group goes standby
    // mid-run: its I/Os come back with ANA Inaccessible, are sent again
    // through port 2, and nothing fails.
    s.admin(&["set-alua", "2", "active-optimized"]);
    // Then it comes back, and carries I/O again.
    let v = nvme_bench_while(&s, 4, Duration::from_millis(1200), || {
        s.admin(&["set-alua", "1", "standby"]);
        std::thread::sleep(Duration::from_millis(1500));
        s.admin(&["set-alua", "1", "active-optimized"]);
    });
    let p = paths(&v);
    assert!(p[0]["ios"].as_u64().unwrap() > 0, "{p:?}");
    assert!(p[1]["ios"].as_u64().unwrap() > 0, "{p:?}");
    assert!(
        p[0]["retries"].as_u64().unwrap() > 0,
        "ANA Inaccessible met: {p:?}"
    );
    assert_eq!(
        (&p[0]["state"], &p[1]["state"]),
        (&"optimized".into(), &"optimized".into()),
        "{p:?}"
    );
    let series = v["ironsan"]["series"].as_array().unwrap();
    assert!(series.len() >= 4, "{series:?}");
    assert!(
        series.iter().all(|s| s["read_iops"].as_u64().unwrap() > 0),
        "I/O went on every second: {series:?}"
    );
}

#[test]
fn nvme_paths_of_different_namespaces_are_refused() {
    let s = Server::start(true, ["active-optimized", "active-optimized"]);
    s.admin(&["add-lun", IQN, "mem:32M"]);
    let other = format!("{}2", s.nvme_url(1).trim_end_matches('1'));
    let out = ironsan()
        .args([
            "bench",
            "--multipath",
            "rr",
            "--runtime",
            "1",
            &s.nvme_url(0),
            &other,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not the same namespace"), "{err}");
}
