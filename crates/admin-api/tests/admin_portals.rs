//! Portals removed and added at run time through the admin API: the
//! removed one refuses connections, its sessions close, SendTargets and
//! REPORT TARGET PORT GROUPS stop listing it, the last one stays, and the
//! configuration file follows.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{http, start};
use initiator::{scsi, Connection, DataDir, LoginConfig};
use server::Config;

const IQN: &str = "iqn.2026-11.io.ironsan:portals";
const HOST: &str = "iqn.2026-11.io.example:host";

fn login(addr: SocketAddr) -> Connection {
    Connection::login(
        &addr.to_string(),
        LoginConfig::new(HOST, Some(IQN), initiator::random_isid()),
    )
    .unwrap()
}

/// The portals SendTargets lists for the target.
fn listed(addr: SocketAddr) -> Vec<String> {
    initiator::discover(&addr.to_string(), HOST)
        .unwrap()
        .into_iter()
        .find(|(t, _)| t == IQN)
        .map(|(_, p)| p)
        .unwrap_or_default()
}

/// REPORT TARGET PORT GROUPS: (group id, member relative ports).
fn port_groups(c: &mut Connection) -> Vec<(u16, Vec<u16>)> {
    let mut cdb = [0u8; 12];
    cdb[0] = 0xa3;
    cdb[1] = 0x0a;
    cdb[6..10].copy_from_slice(&4096u32.to_be_bytes());
    // Unit attentions first (none expected for a membership change).
    let mut r = c.execute(0, &cdb, DataDir::Read(4096)).unwrap();
    for _ in 0..4 {
        if r.status == Some(0) {
            break;
        }
        r = c.execute(0, &cdb, DataDir::Read(4096)).unwrap();
    }
    assert_eq!(r.status, Some(0));
    let d = &r.data;
    let len = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize + 4;
    let mut at = 4;
    let mut out = Vec::new();
    while at + 8 <= len.min(d.len()) {
        let id = u16::from_be_bytes([d[at + 2], d[at + 3]]);
        let n = usize::from(d[at + 7]);
        let ports = (0..n)
            .map(|k| u16::from_be_bytes([d[at + 8 + 4 * k + 2], d[at + 8 + 4 * k + 3]]))
            .collect();
        out.push((id, ports));
        at += 8 + 4 * n;
    }
    out
}

fn refuses_connections(addr: SocketAddr) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn removed_portal_stops_listening_and_leaves_send_targets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ironsan.toml");
    std::fs::write(
        &path,
        format!(
            "listen = [\"127.0.0.1:0\", \"127.0.0.1:0\"]\n[[target]]\nname = \"{IQN}\"\n[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"\n"
        ),
    )
    .unwrap();
    let run = start(&path, None);
    let (p1, p2) = (run.portals[0], run.portals[1]);
    assert_eq!(listed(p1).len(), 2);
    let mut on1 = login(p1);
    let mut on2 = login(p2);
    assert_eq!(
        port_groups(&mut on1),
        vec![(1, vec![1]), (2, vec![2])],
        "one group per portal"
    );

    // Refusals: a name that is neither a tag nor an address, an unknown one.
    let (code, text) = http(run.admin, "DELETE", "/api/portals/bogus", "", None);
    assert_eq!(code, 400, "{text}");
    let (code, _) = http(run.admin, "DELETE", "/api/portals/9", "", None);
    assert_eq!(code, 404);

    // Remove portal 2 by its address.
    let (code, text) = http(run.admin, "DELETE", &format!("/api/portals/{p2}"), "", None);
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("\"persisted\":true"), "{text}");
    assert!(refuses_connections(p2), "{p2} still accepts connections");
    // Its session is closed; the one on portal 1 goes on.
    let closed = (0..50).any(|_| {
        let gone = on2
            .execute(0, &scsi::test_unit_ready(), DataDir::None)
            .is_err();
        if !gone {
            std::thread::sleep(Duration::from_millis(50));
        }
        gone
    });
    assert!(closed, "the session on the removed portal is still open");
    let r = on1
        .execute(0, &scsi::test_unit_ready(), DataDir::None)
        .unwrap();
    assert_eq!(r.status, Some(0));
    // SendTargets, REPORT TARGET PORT GROUPS and the API forget it.
    let l = listed(p1);
    assert_eq!(l, vec![format!("{p1},1")]);
    assert_eq!(port_groups(&mut on1), vec![(1, vec![1])]);
    let (_, text) = http(run.admin, "GET", "/api/portals", "", None);
    assert!(!text.contains(&p2.to_string()), "{text}");
    let (_, text) = http(run.admin, "GET", "/api/targets", "", None);
    assert!(!text.contains("\"group\":2"), "{text}");

    // The last portal stays.
    let (code, text) = http(run.admin, "DELETE", "/api/portals/1", "", None);
    assert_eq!(code, 409, "{text}");
    assert!(text.starts_with("{\"error\":"), "{text}");

    // An address that cannot be bound is refused and not written.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (code, text) = http(
        run.admin,
        "POST",
        "/api/portals",
        &format!("{{\"addr\":\"{}\"}}", taken.local_addr().unwrap()),
        None,
    );
    assert_eq!(code, 400, "{text}");
    assert_eq!(Config::from_file(&path).unwrap().listen.len(), 1);
    drop(taken);

    // A portal added now gets a fresh tag and a group of its own.
    let (code, text) = http(
        run.admin,
        "POST",
        "/api/portals",
        "{\"addr\":\"127.0.0.1:15871\"}",
        None,
    );
    assert_eq!(code, 201, "{text}");
    assert!(text.contains("\"tpgt\":3"), "{text}");
    let p3: SocketAddr = "127.0.0.1:15871".parse().unwrap();
    assert_eq!(listed(p1).len(), 2);
    assert_eq!(
        port_groups(&mut on1),
        vec![(1, vec![1]), (3, vec![3])],
        "the new portal's group is reported"
    );
    drop(login(p3));
    // The removed portal's address again: the same target port returns
    // (tag 2, group 2), as hosts whose paths went down with it expect
    // (Linux's ALUA handler asks for the group its VPD page named).
    let (code, text) = http(
        run.admin,
        "POST",
        "/api/portals",
        &format!("{{\"addr\":\"{p2}\"}}"),
        None,
    );
    assert_eq!(code, 201, "{text}");
    assert!(text.contains("\"tpgt\":2"), "{text}");
    assert_eq!(
        port_groups(&mut on1),
        vec![(1, vec![1]), (2, vec![2]), (3, vec![3])],
        "the returned portal is in its old group"
    );
    assert_eq!(listed(p1).len(), 3);
    drop(login(p2));
    // ALUA states of its group can be set, and persist.
    let (code, text) = http(
        run.admin,
        "PUT",
        "/api/alua/3",
        "{\"state\":\"standby\"}",
        None,
    );
    assert_eq!(code, 200, "{text}");

    drop(on1);
    drop(on2);
    drop(run);
    let c = Config::from_file(&path).unwrap();
    assert_eq!(c.listen.len(), 3);
    assert_eq!((c.listen[1], c.listen[2]), (p3, p2));
    let g: Vec<_> = c
        .alua
        .group
        .iter()
        .map(|g| (g.id, g.portals.clone(), g.state))
        .collect();
    assert_eq!(
        g,
        vec![
            (1, vec![1], server::config::AluaStateConfig::ActiveOptimized),
            (2, vec![3], server::config::AluaStateConfig::ActiveOptimized),
            (3, vec![2], server::config::AluaStateConfig::Standby),
        ]
    );
}

/// The NVMe/TCP ports the API lists: (id, address).
fn nvme_ports(admin: SocketAddr) -> Vec<(u64, String)> {
    let (code, text) = http(admin, "GET", "/api/nvme-ports", "", None);
    assert_eq!(code, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_u64().unwrap(),
                p["addr"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The ports (trsvcid) the discovery log at `addr` lists the subsystem at.
fn nvme_listed(addr: SocketAddr) -> Vec<String> {
    let host = initiator::nvme::host_nqn(&[3; 16]);
    let mut v: Vec<String> = initiator::nvme::discover(addr, &host)
        .unwrap()
        .into_iter()
        .filter(|e| e.subtype == 2)
        .map(|e| e.trsvcid)
        .collect();
    v.sort();
    v
}

/// Reads block 0 of namespace 1 through an I/O queue of `c`; the queue.
fn read_block0(c: &initiator::nvme::Controller) -> initiator::nvme::NvmeQueue {
    let mut q = c.io_queue(1, 8).unwrap();
    let read = initiator::nvme::sqe(0x02, 1, &[(10, 0), (11, 0), (12, 0)]);
    q.call(read, bytes::Bytes::new(), 512)
        .unwrap()
        .ok()
        .unwrap();
    q
}

/// A server with one iSCSI portal, one NVMe/TCP port and one target, its
/// configuration in a directory of its own.
fn serve_with_nvme_port() -> (tempfile::TempDir, std::path::PathBuf, common::Running) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ironsan.toml");
    std::fs::write(
        &path,
        format!("listen = [\"127.0.0.1:0\"]\nnvme_listen = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{IQN}\"\n[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"\n"),
    )
    .unwrap();
    let run = start(&path, None);
    (dir, path, run)
}

#[test]
fn nvme_ports_added_and_removed_at_run_time() {
    let (_dir, path, run) = serve_with_nvme_port();
    let first: SocketAddr = nvme_ports(run.admin)[0].1.parse().unwrap();
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let body = format!("{{\"addr\":\"{free}\"}}");
    let (code, text) = http(run.admin, "POST", "/api/nvme-ports", &body, None);
    assert_eq!(code, 201, "{text}");
    assert!(text.contains("\"persisted\":true"), "{text}");
    let (code, _) = http(run.admin, "POST", "/api/nvme-ports", &body, None);
    assert_eq!(code, 409, "twice");
    assert_eq!(nvme_ports(run.admin)[1], (2, free.to_string()));
    let mut both = vec![first.port().to_string(), free.port().to_string()];
    both.sort();
    assert_eq!(nvme_listed(free), both);
    // I/O through the new port.
    let host = initiator::nvme::host_nqn(&[4; 16]);
    let nqn = format!("nqn.{}", IQN.trim_start_matches("iqn."));
    let c = initiator::nvme::Controller::connect(free, &nqn, &host, (false, false), 1).unwrap();
    let mut q = read_block0(&c);
    let read = initiator::nvme::sqe(0x02, 1, &[(10, 0), (11, 0), (12, 0)]);

    // Removed by address: out of the log, its connection closes, and
    // nobody connects through it.
    let (code, text) = http(
        run.admin,
        "DELETE",
        &format!("/api/nvme-ports/{free}"),
        "",
        None,
    );
    assert_eq!(code, 200, "{text}");
    assert_eq!(nvme_listed(first), vec![first.port().to_string()]);
    q.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while q.call(read, bytes::Bytes::new(), 512).is_ok() {
        assert!(
            Instant::now() < deadline,
            "a connection of the removed port lives on"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(initiator::nvme::Controller::connect(free, &nqn, &host, (false, false), 1).is_err());
    let (code, _) = http(run.admin, "DELETE", "/api/nvme-ports/2", "", None);
    assert_eq!(code, 404);
    drop(q);
    drop(c);
    drop(run);
    // The file follows: one port again.
    assert_eq!(Config::from_file(&path).unwrap().nvme_listen.len(), 1);
}

/// A target added at run time with DH-HMAC-CHAP secret files: inline
/// secrets, files outside secret_roots and files that hold no secret are
/// refused alike; the files are kept in the configuration; the NVMe/TCP
/// hosts must then authenticate.
#[test]
fn a_target_added_with_dhchap_secret_files_authenticates_its_hosts() {
    use nvme_auth::{Hash, Secret};
    let (dir, path, run) = serve_with_nvme_port();
    let port: SocketAddr = nvme_ports(run.admin)[0].1.parse().unwrap();
    let secret = Secret::represent(&[0x5a; 32], Some(Hash::Sha256));
    let key = dir.path().join("new.dhchap");
    std::fs::write(&key, format!("{secret}\n")).unwrap();
    let junk = dir.path().join("junk.dhchap");
    std::fs::write(&junk, "not a secret\n").unwrap();
    const NEW: &str = "iqn.2026-12.io.ironsan:authed";
    let body = |dhchap: &str| {
        format!("{{\"name\":\"{NEW}\",\"lun\":[{{\"backend\":\"mem\",\"size\":\"1M\"}}],\"dhchap\":{dhchap}}}")
    };
    for (bad, why) in [
        (format!("{{\"secret\":\"{secret}\"}}"), "inline"),
        (
            "{\"secret_file\":\"/etc/passwd\"}".to_string(),
            "outside secret_roots",
        ),
        (
            format!("{{\"secret_file\":{:?}}}", junk.display().to_string()),
            "no secret in it",
        ),
    ] {
        let (code, text) = http(run.admin, "POST", "/api/targets", &body(&bad), None);
        assert_eq!(code, 400, "{why}: {text}");
        assert!(!text.contains("DHHC"), "{text}");
    }
    let good = body(&format!(
        "{{\"secret_file\":{:?}}}",
        key.display().to_string()
    ));
    let (code, text) = http(run.admin, "POST", "/api/targets", &good, None);
    assert_eq!(code, 201, "{text}");
    let cfg = Config::from_file(&path).unwrap();
    let d = cfg.target[1].dhchap.as_ref().expect("dhchap kept");
    assert_eq!(
        d.secret_file.as_deref(),
        Some(key.canonicalize().unwrap().as_path())
    );
    assert!(d.secret.is_none());
    let nqn = format!("nqn.{}", NEW.trim_start_matches("iqn."));
    let host = initiator::nvme::host_nqn(&[6; 16]);
    let e = initiator::nvme::Controller::connect(port, &nqn, &host, (false, false), 1)
        .err()
        .expect("no secret: refused")
        .to_string();
    assert!(e.contains("requires DH-HMAC-CHAP"), "{e}");
    let auth = std::sync::Arc::new(initiator::nvme::Dhchap {
        secret: Secret::parse(&secret).unwrap(),
        ctrl_secret: None,
    });
    let c =
        initiator::nvme::Controller::connect_auth(port, &nqn, &host, (false, false), 1, Some(auth))
            .unwrap();
    read_block0(&c);
}
