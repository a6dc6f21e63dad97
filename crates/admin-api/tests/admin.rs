//! The admin API against a running server with a session connected: LUNs
//! added, resized and removed at run time reach the session (REPORT LUNS,
//! unit attentions, LOGICAL UNIT NOT SUPPORTED), /metrics counts its I/O,
//! and changes written to the configuration file survive a restart.

mod common;

use common::{http, start};
use initiator::{scsi, Connection, DataDir, LoginConfig};
use server::Config;

const IQN: &str = "iqn.2026-11.io.ironsan:admin";

fn luns(c: &mut Connection) -> Vec<u16> {
    let r = c
        .execute(0, &scsi::report_luns(4096), DataDir::Read(4096))
        .unwrap();
    scsi::parse_report_luns(&r.data)
}

fn sense_of(c: &mut Connection, lun: u16) -> Option<(u8, u8, u8)> {
    let r = c
        .execute(lun, &scsi::test_unit_ready(), DataDir::None)
        .unwrap();
    (r.status != Some(0))
        .then(|| scsi::sense_code(&r.sense))
        .flatten()
}

#[test]
fn runtime_lun_changes_reach_sessions_and_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ironsan.toml");
    std::fs::write(
        &path,
        format!("# kept\nlisten = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{IQN}\"\n[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"\n"),
    )
    .unwrap();
    let run = start(&path, None);
    let mut c = Connection::login(
        &run.iscsi.to_string(),
        LoginConfig::new("iqn.2026-11.x:test", Some(IQN), initiator::random_isid()),
    )
    .unwrap();
    assert_eq!(luns(&mut c), vec![0]);
    assert_eq!(sense_of(&mut c, 0), None);
    let r = c
        .execute(0, &scsi::rw10(false, 0, 8), DataDir::Read(4096))
        .unwrap();
    assert_eq!(r.status, Some(0));

    // Add LUN 1 with the session connected (a new file under the default
    // lun_roots, the admin directory's luns/).
    let file = dir.path().join("luns/lun1.img");
    let body = format!(
        "{{\"backend\":\"file\",\"path\":{:?},\"size\":\"2M\"}}",
        file.display().to_string()
    );
    let (code, text) = http(
        run.admin,
        "POST",
        &format!("/api/targets/{IQN}/luns"),
        &body,
        None,
    );
    assert_eq!(code, 201, "{text}");
    assert!(text.contains("\"persisted\":true"), "{text}");
    // The session learns of it: 3F/0E on its next command to LUN 0.
    assert_eq!(sense_of(&mut c, 0), Some((6, 0x3f, 0x0e)));
    assert_eq!(luns(&mut c), vec![0, 1]);
    let r = c
        .execute(1, &scsi::read_capacity16(), DataDir::Read(32))
        .unwrap();
    assert_eq!(scsi::parse_capacity16(&r.data), Some((4096, 512)));

    // Grow it: CAPACITY DATA HAS CHANGED, then the new size.
    let (code, text) = http(
        run.admin,
        "POST",
        &format!("/api/targets/{IQN}/luns/1/resize"),
        "{\"size\":\"4M\"}",
        None,
    );
    assert_eq!(code, 200, "{text}");
    assert_eq!(sense_of(&mut c, 1), Some((6, 0x2a, 0x09)));
    let r = c
        .execute(1, &scsi::read_capacity16(), DataDir::Read(32))
        .unwrap();
    assert_eq!(scsi::parse_capacity16(&r.data), Some((8192, 512)));
    // Shrinking is refused.
    let (code, _) = http(
        run.admin,
        "POST",
        &format!("/api/targets/{IQN}/luns/1/resize"),
        "{\"size\":\"1M\"}",
        None,
    );
    assert_eq!(code, 400);

    // /metrics counted the session's READ.
    // (Connections publish their counters every 100 ms.)
    let want = format!("ironsan_lun_read_ops_total{{target=\"{IQN}\",lun=\"0\"}} 1");
    let mut m = String::new();
    for _ in 0..50 {
        let (code, text) = http(run.admin, "GET", "/metrics", "", None);
        assert_eq!(code, 200);
        m = text;
        if m.lines().any(|l| l == want) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(m.lines().any(|l| l == want), "{m}");
    let (_, s) = http(run.admin, "GET", "/api/sessions", "", None);
    assert!(s.contains("iqn.2026-11.x:test"), "{s}");

    drop(c);
    drop(run);
    // A restart serves LUN 1 with its new size, from the file.
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("# kept"), "{text}");
    let run = start(&path, None);
    let mut c = Connection::login(
        &run.iscsi.to_string(),
        LoginConfig::new("iqn.2026-11.x:test", Some(IQN), initiator::random_isid()),
    )
    .unwrap();
    assert_eq!(luns(&mut c), vec![0, 1]);
    let _ = sense_of(&mut c, 1);
    let r = c
        .execute(1, &scsi::read_capacity16(), DataDir::Read(32))
        .unwrap();
    assert_eq!(scsi::parse_capacity16(&r.data), Some((8192, 512)));

    // Remove LUN 0: LOGICAL UNIT NOT SUPPORTED, LUN 1 keeps its number.
    let (code, text) = http(
        run.admin,
        "DELETE",
        &format!("/api/targets/{IQN}/luns/0"),
        "",
        None,
    );
    assert_eq!(code, 200, "{text}");
    assert_eq!(sense_of(&mut c, 0), Some((5, 0x25, 0)));
    assert_eq!(sense_of(&mut c, 1), Some((6, 0x3f, 0x0e)));
    assert_eq!(luns(&mut c), vec![1]);
    let (code, _) = http(
        run.admin,
        "DELETE",
        &format!("/api/targets/{IQN}/luns/0"),
        "",
        None,
    );
    assert_eq!(code, 404);
    drop(c);
    drop(run);
    let c = Config::from_file(&path).unwrap();
    assert_eq!(c.target[0].lun.len(), 1);
    assert_eq!(c.target[0].lun[0].number, Some(1));
}

#[test]
fn alua_states_change_through_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(
        &path,
        format!("listen = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{IQN}\"\n[[target.lun]]\nbackend = \"null\"\nsize = \"1M\"\n"),
    )
    .unwrap();
    let run = start(&path, None);
    // ALUA: group 1 exists (one group per portal by default).
    let (code, t) = http(
        run.admin,
        "PUT",
        "/api/alua/1",
        "{\"state\":\"standby\"}",
        None,
    );
    assert_eq!(code, 200, "{t}");
    let (_, t) = http(run.admin, "GET", "/api/targets", "", None);
    assert!(t.contains("\"state\":\"standby\""), "{t}");
    assert_eq!(
        Config::from_file(&path).unwrap().alua.group[0].state,
        server::config::AluaStateConfig::Standby
    );
    assert_eq!(
        http(
            run.admin,
            "PUT",
            "/api/alua/9",
            "{\"state\":\"standby\"}",
            None
        )
        .0,
        404
    );
}

#[test]
fn targets_added_and_removed_through_the_api_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ironsan.toml");
    std::fs::write(
        &path,
        format!("# kept\nlisten = [\"127.0.0.1:0\"]\n[[target]]\nname = \"{IQN}\"\n[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"\n"),
    )
    .unwrap();
    const NEW: &str = "iqn.2026-12.io.ironsan:new";
    let run = start(&path, None);
    let file = dir.path().join("luns/new.img");
    let body = format!(
        "{{\"name\":\"{NEW}\",\"nqn\":\"blktests-subsystem-1\",\"allow\":[\"iqn.2026-11.x:test\"],\
         \"lun\":[{{\"backend\":\"file\",\"path\":{:?},\"size\":\"2M\",\
         \"uuid\":\"91fdba0d-f87b-4c25-b80f-db7be1418b9e\"}}]}}",
        file.display().to_string()
    );
    // Refused: a LUN file outside the LUN roots, credentials in the body,
    // a name that is not an iSCSI name, an unknown key.
    for bad in [
        body.replace(&dir.path().join("luns").display().to_string(), "/etc"),
        body.replace(
            "\"allow\"",
            "\"chap\":{\"user\":\"u\",\"secret\":\"0123456789abcdef\"},\"allow\"",
        ),
        body.replace(NEW, "not-an-iqn"),
        body.replace("\"allow\"", "\"bogus\":1,\"allow\""),
    ] {
        let (code, text) = http(run.admin, "POST", "/api/targets", &bad, None);
        assert!((400..=422).contains(&code), "{code} {text} for {bad}");
    }
    let (code, text) = http(run.admin, "POST", "/api/targets", &body, None);
    assert_eq!(code, 201, "{text}");
    assert!(text.contains("\"persisted\":true"), "{text}");
    let (code, _) = http(run.admin, "POST", "/api/targets", &body, None);
    assert_eq!(code, 409);
    let mut c = Connection::login(
        &run.iscsi.to_string(),
        LoginConfig::new("iqn.2026-11.x:test", Some(NEW), initiator::random_isid()),
    )
    .unwrap();
    assert_eq!(luns(&mut c), vec![0]);
    // Its ACL holds from the start.
    assert!(Connection::login(
        &run.iscsi.to_string(),
        LoginConfig::new("iqn.2026-11.x:other", Some(NEW), initiator::random_isid()),
    )
    .is_err());
    drop(c);
    drop(run);

    // A restart serves it from the file, with its NQN and UUID.
    let cfg = Config::from_file(&path).unwrap();
    assert_eq!(cfg.target.len(), 2);
    assert_eq!(cfg.target[1].nqn.as_deref(), Some("blktests-subsystem-1"));
    assert_eq!(
        cfg.target[1].lun[0].uuid.as_deref(),
        Some("91fdba0d-f87b-4c25-b80f-db7be1418b9e")
    );
    let run = start(&path, None);
    let mut c = Connection::login(
        &run.iscsi.to_string(),
        LoginConfig::new("iqn.2026-11.x:test", Some(NEW), initiator::random_isid()),
    )
    .unwrap();
    assert_eq!(luns(&mut c), vec![0]);

    // Removed: the session ends, and the file no longer names it.
    let (code, text) = http(
        run.admin,
        "DELETE",
        &format!("/api/targets/{NEW}"),
        "",
        None,
    );
    assert_eq!(code, 200, "{text}");
    assert!(c
        .execute(0, &scsi::test_unit_ready(), DataDir::None)
        .is_err());
    let (code, _) = http(
        run.admin,
        "DELETE",
        &format!("/api/targets/{NEW}"),
        "",
        None,
    );
    assert_eq!(code, 404);
    let (code, _) = http(
        run.admin,
        "DELETE",
        &format!("/api/targets/{IQN}"),
        "",
        None,
    );
    assert_eq!(code, 409, "the last target");
    drop(run);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("# kept"), "{text}");
    assert_eq!(Config::from_file(&path).unwrap().target.len(), 1);
}
