//! Run-time changes through the admin API, seen by the in-repo initiator
//! over loopback: initiator ACLs and CHAP credentials (new logins refused
//! or admitted at once, existing sessions kept or dropped on request, the
//! configuration file kept in step), and a RAM LUN grown and shrunk
//! (CAPACITY DATA HAS CHANGED, READ CAPACITY).

mod common;

use std::net::SocketAddr;
use std::path::Path;

use common::{http, start};
use initiator::{scsi, Connection, DataDir, Error, LoginConfig, Url};
use server::Config;

const IQN: &str = "iqn.2026-11.io.ironsan:acl";
const HOST_A: &str = "iqn.2026-11.io.example:host-a";
const HOST_B: &str = "iqn.2026-11.io.example:host-b";

fn write_config(path: &Path, extra_target: &str) {
    std::fs::write(
        path,
        format!(
            "# kept\nlisten = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{IQN}\"\n{extra_target}\n[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"\n"
        ),
    )
    .unwrap();
}

fn login(addr: SocketAddr, initiator: &str) -> Result<Connection, Error> {
    Connection::login(
        &addr.to_string(),
        LoginConfig::new(initiator, Some(IQN), initiator::random_isid()),
    )
}

/// A login with the credentials of a libiscsi-style URL
/// (`user%secret@`, `?target_user=&target_password=`).
fn login_url(addr: SocketAddr, auth: &str, query: &str) -> Result<Connection, Error> {
    let u: Url = format!("iscsi://{auth}{addr}/{IQN}/0{query}")
        .parse()
        .unwrap();
    Connection::login(&addr.to_string(), u.login_config(HOST_A, None))
}

fn refused(r: Result<Connection, Error>) -> bool {
    matches!(r, Err(Error::Login(_)))
}

fn tur(c: &mut Connection) -> Result<Option<u8>, Error> {
    c.execute(0, &scsi::test_unit_ready(), DataDir::None)
        .map(|r| r.status)
}

/// Whether the session ends soon (a dropped session's connection closes
/// once its task sees the request).
fn closes(c: &mut Connection) -> bool {
    (0..50).any(|_| {
        let gone = tur(c).is_err();
        if !gone {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        gone
    })
}

fn visible_to(addr: SocketAddr, initiator: &str) -> bool {
    initiator::discover(&addr.to_string(), initiator)
        .unwrap()
        .iter()
        .any(|(t, _)| t == IQN)
}

#[test]
fn acl_changes_apply_to_new_logins() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ironsan.toml");
    write_config(&path, "");
    let run = start(&path, None);
    let acl = format!("/api/targets/{IQN}/acl");

    // Open target: host A logs in.
    let mut a = login(run.iscsi, HOST_A).unwrap();
    assert_eq!(tur(&mut a).unwrap(), Some(0));
    let (code, text) = http(run.admin, "GET", &acl, "", None);
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("\"initiators\":[]"), "{text}");

    // Allow only host B. A's running session keeps working; a new login
    // by A is refused and discovery no longer shows A the target.
    let (code, text) = http(
        run.admin,
        "POST",
        &acl,
        &format!("{{\"initiator\":\"{HOST_B}\"}}"),
        None,
    );
    assert_eq!(code, 201, "{text}");
    assert!(text.contains("\"persisted\":true"), "{text}");
    assert_eq!(tur(&mut a).unwrap(), Some(0), "existing session kept");
    assert!(refused(login(run.iscsi, HOST_A)));
    assert!(!visible_to(run.iscsi, HOST_A));
    assert!(visible_to(run.iscsi, HOST_B));
    let mut b = login(run.iscsi, HOST_B).unwrap();
    assert_eq!(tur(&mut b).unwrap(), Some(0));

    // Refusals are JSON: a bad name, a duplicate, both keys, a bad network.
    for (body, want) in [
        ("{\"initiator\":\"host b\"}", 400),
        (&*format!("{{\"initiator\":\"{HOST_B}\"}}"), 409),
        (
            "{\"initiator\":\"iqn.x:y\",\"network\":\"10.0.0.0/8\"}",
            400,
        ),
        ("{\"network\":\"10.0.0.0/33\"}", 400),
        ("{\"bogus\":1}", 400),
    ] {
        let (code, text) = http(run.admin, "POST", &acl, body, None);
        assert_eq!(code, want, "{body}: {text}");
        assert!(text.starts_with("{\"error\":"), "{text}");
    }

    // A network entry: 10.0.0.0/8 leaves loopback out, for B too.
    let (code, text) = http(
        run.admin,
        "POST",
        &acl,
        "{\"network\":\"10.0.0.0/8\"}",
        None,
    );
    assert_eq!(code, 201, "{text}");
    assert!(refused(login(run.iscsi, HOST_B)));
    let (code, text) = http(
        run.admin,
        "DELETE",
        &format!("{acl}/10.0.0.0%2F8?allow_any=true"),
        "",
        None,
    );
    assert_eq!(code, 200, "{text}");
    drop(login(run.iscsi, HOST_B).unwrap());

    // The last name cannot go without saying so (it would open the
    // target to everyone).
    let (code, text) = http(run.admin, "DELETE", &format!("{acl}/{HOST_B}"), "", None);
    assert_eq!(code, 409, "{text}");
    let (code, _) = http(run.admin, "DELETE", &format!("{acl}/{HOST_A}"), "", None);
    assert_eq!(code, 404);

    // Replace B by A, dropping the sessions the new rule does not allow.
    let (code, text) = http(
        run.admin,
        "POST",
        &acl,
        &format!("{{\"initiator\":\"{HOST_A}\"}}"),
        None,
    );
    assert_eq!(code, 201, "{text}");
    let (code, text) = http(
        run.admin,
        "DELETE",
        &format!("{acl}/{HOST_B}?drop_sessions=true"),
        "",
        None,
    );
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("\"dropped_sessions\":1"), "{text}");
    assert!(closes(&mut b), "B's session was dropped");
    assert_eq!(tur(&mut a).unwrap(), Some(0), "A's session is allowed");
    assert!(refused(login(run.iscsi, HOST_B)));
    drop(login(run.iscsi, HOST_A).unwrap());

    drop(a);
    drop(run);
    // The file kept its comment and now allows A only; a restart too.
    assert!(std::fs::read_to_string(&path)
        .unwrap()
        .starts_with("# kept"));
    let c = Config::from_file(&path).unwrap();
    assert_eq!(c.target[0].allow, vec![HOST_A.to_string()]);
    assert!(c.target[0].allow_net.is_empty());
    let run = start(&path, None);
    assert!(refused(login(run.iscsi, HOST_B)));
    drop(login(run.iscsi, HOST_A).unwrap());
}

#[test]
fn chap_set_at_run_time_is_required_at_the_next_login() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ironsan.toml");
    write_config(&path, "");
    let run = start(&path, None);
    let chap = format!("/api/targets/{IQN}/chap");
    let mutual = format!("/api/targets/{IQN}/mutual_chap");
    let mut open = login(run.iscsi, HOST_A).unwrap();

    // Checked first: secrets of 12..=255 bytes, a user, one secret source.
    for body in [
        "{\"user\":\"host\",\"secret\":\"short\"}",
        "{\"user\":\"host\",\"secret\":\"\"}",
        "{\"user\":\"\",\"secret\":\"host-secret-12\"}",
        "{\"user\":\"host\"}",
        "{\"user\":\"host\",\"secret\":\"host-secret-12\",\"extra\":1}",
    ] {
        let (code, text) = http(run.admin, "PUT", &chap, body, None);
        assert_eq!(code, 400, "{body}: {text}");
        assert!(text.starts_with("{\"error\":"), "{text}");
    }
    // Mutual CHAP needs CHAP.
    let (code, _) = http(
        run.admin,
        "PUT",
        &mutual,
        "{\"user\":\"disk\",\"secret\":\"target-secret-2\"}",
        None,
    );
    assert_eq!(code, 409);

    let (code, text) = http(
        run.admin,
        "PUT",
        &chap,
        "{\"user\":\"host\",\"secret\":\"host-secret-12\"}",
        None,
    );
    assert_eq!(code, 200, "{text}");
    assert!(!text.contains("host-secret-12"), "{text}");
    let (_, text) = http(
        run.admin,
        "GET",
        &format!("/api/targets/{IQN}/acl"),
        "",
        None,
    );
    assert!(text.contains("\"chap\":\"set\""), "{text}");
    assert!(text.contains("\"chap_user\":\"host\""), "{text}");
    assert!(!text.contains("host-secret-12"), "{text}");

    // New logins: without CHAP or with a wrong secret refused, with it fine.
    assert!(refused(login(run.iscsi, HOST_A)));
    assert!(refused(login_url(run.iscsi, "host%wrong-secret-9@", "")));
    let mut c = login_url(run.iscsi, "host%host-secret-12@", "").unwrap();
    assert_eq!(tur(&mut c).unwrap(), Some(0));
    assert_eq!(tur(&mut open).unwrap(), Some(0), "existing session kept");

    // Mutual CHAP: the same secret both ways is refused; then the target
    // proves itself, and a wrong target secret is caught by the initiator.
    let (code, _) = http(
        run.admin,
        "PUT",
        &mutual,
        "{\"user\":\"disk\",\"secret\":\"host-secret-12\"}",
        None,
    );
    assert_eq!(code, 400);
    let (code, text) = http(
        run.admin,
        "PUT",
        &format!("{mutual}?drop_sessions=true"),
        "{\"user\":\"disk\",\"secret\":\"target-secret-2\"}",
        None,
    );
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("\"mutual_chap\":\"set\""), "{text}");
    assert!(text.contains("\"dropped_sessions\":2"), "{text}");
    assert!(closes(&mut open), "dropped on request");
    let q = "?target_user=disk&target_password=target-secret-2";
    drop(login_url(run.iscsi, "host%host-secret-12@", q).unwrap());
    let bad = "?target_user=disk&target_password=not-the-target-1";
    assert!(login_url(run.iscsi, "host%host-secret-12@", bad).is_err());

    drop(run);
    let c = Config::from_file(&path).unwrap();
    assert_eq!(c.target[0].chap.as_ref().unwrap().user, "host");
    assert_eq!(c.target[0].mutual_chap.as_ref().unwrap().user, "disk");
    // After a restart CHAP is still required; clearing it opens the target.
    let run = start(&path, None);
    assert!(refused(login(run.iscsi, HOST_A)));
    let (code, text) = http(run.admin, "DELETE", &chap, "", None);
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("\"mutual_chap\":\"unset\""), "{text}");
    drop(login(run.iscsi, HOST_A).unwrap());
    drop(run);
    let c = Config::from_file(&path).unwrap();
    assert!(c.target[0].chap.is_none() && c.target[0].mutual_chap.is_none());
}

fn sense_of(c: &mut Connection) -> Option<(u8, u8, u8)> {
    let r = c
        .execute(0, &scsi::test_unit_ready(), DataDir::None)
        .unwrap();
    (r.status != Some(0))
        .then(|| scsi::sense_code(&r.sense))
        .flatten()
}

fn capacity(c: &mut Connection) -> (u64, u32) {
    let r = c
        .execute(0, &scsi::read_capacity16(), DataDir::Read(32))
        .unwrap();
    scsi::parse_capacity16(&r.data).unwrap()
}

#[test]
fn ram_lun_grows_and_shrinks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ironsan.toml");
    write_config(&path, "");
    let run = start(&path, None);
    let mut c = login(run.iscsi, HOST_A).unwrap();
    let mut d = login(run.iscsi, HOST_B).unwrap();
    assert_eq!(capacity(&mut c), (2048, 512));
    assert_eq!(capacity(&mut d), (2048, 512));
    let resize = format!("/api/targets/{IQN}/luns/0/resize");

    let (code, text) = http(run.admin, "POST", &resize, "{\"size\":\"4M\"}", None);
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("\"size_bytes\":4194304"), "{text}");
    // Every I_T nexus is told, and READ CAPACITY has the new size.
    assert_eq!(sense_of(&mut c), Some((6, 0x2a, 0x09)));
    assert_eq!(sense_of(&mut d), Some((6, 0x2a, 0x09)));
    assert_eq!(capacity(&mut c), (8192, 512));
    // The new space is usable and reads what was written.
    let last = 8191u32;
    let data = initiator::Connection::payload(&[0x5a; 512]);
    let r = c
        .execute(0, &scsi::rw10(true, last, 1), DataDir::Write(data))
        .unwrap();
    assert_eq!(r.status, Some(0));
    let r = d
        .execute(0, &scsi::rw10(false, last, 1), DataDir::Read(512))
        .unwrap();
    assert!(r.data.iter().all(|&b| b == 0x5a));

    // Shrinking needs "shrink": true; then LBAs past the end are refused.
    let (code, text) = http(run.admin, "POST", &resize, "{\"size\":\"2M\"}", None);
    assert_eq!(code, 400, "{text}");
    let (code, text) = http(
        run.admin,
        "POST",
        &resize,
        "{\"size\":\"2M\",\"shrink\":true}",
        None,
    );
    assert_eq!(code, 200, "{text}");
    assert_eq!(sense_of(&mut c), Some((6, 0x2a, 0x09)));
    assert_eq!(capacity(&mut c), (4096, 512));
    let r = c
        .execute(0, &scsi::rw10(false, last, 1), DataDir::Read(512))
        .unwrap();
    assert_eq!(scsi::sense_code(&r.sense), Some((5, 0x21, 0)));
    // Not a multiple of the block size.
    let (code, _) = http(run.admin, "POST", &resize, "{\"size\":\"1000000\"}", None);
    assert_eq!(code, 400);

    drop((c, d));
    drop(run);
    let c = Config::from_file(&path).unwrap();
    assert_eq!(c.target[0].lun[0].size.as_deref(), Some("2M"));
}

#[test]
fn discovery_chap_at_run_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ironsan.toml");
    write_config(&path, "");
    let run = start(&path, None);
    let addr = run.iscsi.to_string();
    let with_chap = |secret: &str| {
        let u: Url = format!("iscsi://disc%{secret}@{addr}").parse().unwrap();
        initiator::discover_with(&addr, u.login_config(HOST_A, None))
    };
    assert!(initiator::discover(&addr, HOST_A).is_ok());
    let (code, text) = http(
        run.admin,
        "PUT",
        "/api/discovery/chap",
        "{\"user\":\"disc\",\"secret\":\"discovery-secret-1\"}",
        None,
    );
    assert_eq!(code, 200, "{text}");
    assert!(!text.contains("discovery-secret-1"), "{text}");
    let (_, text) = http(run.admin, "GET", "/api/discovery", "", None);
    assert!(text.contains("\"chap\":\"set\""), "{text}");
    assert!(initiator::discover(&addr, HOST_A).is_err());
    assert!(with_chap("wrong-secret-99").is_err());
    let found = with_chap("discovery-secret-1").unwrap();
    assert!(found.iter().any(|(t, _)| t == IQN));
    // Normal logins are not affected.
    drop(login(run.iscsi, HOST_A).unwrap());
    let (code, _) = http(
        run.admin,
        "PUT",
        "/api/discovery/other",
        "{\"user\":\"disc\",\"secret\":\"discovery-secret-1\"}",
        None,
    );
    assert_eq!(code, 404);
    let (code, text) = http(run.admin, "DELETE", "/api/discovery/chap", "", None);
    assert_eq!(code, 200, "{text}");
    assert!(initiator::discover(&addr, HOST_A).is_ok());
    drop(run);
    assert!(Config::from_file(&path).unwrap().discovery.chap.is_none());
}
