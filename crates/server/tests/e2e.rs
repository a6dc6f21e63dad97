//! End-to-end tests of the target over loopback with a minimal blocking
//! initiator written against `iscsi-wire`.

mod common;

use common::*;
use iscsi_wire::pdu::*;
use iscsi_wire::text;

#[test]
fn login_write_read_report_luns() {
    let (addrs, _stop) = start(config("[[target.lun]]\nbackend = \"mem\"\nsize = \"16M\"\n[[target.lun]]\nbackend = \"null\"\nsize = \"1G\"", ""));
    let mut c = Client::connect(addrs[0]);
    c.login_normal([0x80, 0, 0, 0, 0, 1], &[]);
    let (st, _, _) = c.command(&[0; 6], 0, false, &[], 0);
    assert_eq!(st, 0, "TEST UNIT READY");
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    let (st, _, sense) = c.command(
        &rw10(0x2a, 100, 128),
        data.len() as u32,
        false,
        &data,
        data.len(),
    );
    assert_eq!(st, 0, "WRITE(10) {sense:02x?}");
    let (st, back, _) = c.command(&rw10(0x28, 100, 128), data.len() as u32, true, &[], 0);
    assert_eq!(st, 0);
    assert_eq!(back, data);
    let (st, luns, _) = c.command(&[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], 256, true, &[], 0);
    assert_eq!(st, 0);
    assert_eq!(&luns[..4], &16u32.to_be_bytes());
    assert_eq!(&luns[16..24], &Lun::from_index(1).0);
    // Past the end: CHECK CONDITION, ILLEGAL REQUEST, LBA OUT OF RANGE.
    let (st, _, sense) = c.command(&rw10(0x28, 32767, 2), 1024, true, &[], 0);
    assert_eq!(st, 2);
    assert_eq!((sense[2] & 0xf, sense[12]), (5, 0x21));
}

#[test]
fn writes_solicited_by_r2t_and_digests_off_by_choice() {
    let (addrs, _stop) = start(config(
        "[[target.lun]]\nbackend = \"mem\"\nsize = \"16M\"",
        "",
    ));
    let mut c = Client::connect(addrs[1]);
    c.login_normal(
        [0x80, 0, 0, 0, 0, 2],
        &[
            ("ImmediateData", "No"),
            ("InitialR2T", "Yes"),
            ("MaxBurstLength", "65536"),
        ],
    );
    let data: Vec<u8> = (0..1024 * 1024u32).map(|i| (i % 253) as u8).collect();
    let (st, _, _) = c.command(&rw10(0x2a, 0, 2048), data.len() as u32, false, &data, 0);
    assert_eq!(st, 0);
    let (st, back, _) = c.command(&rw10(0x28, 0, 2048), data.len() as u32, true, &[], 0);
    assert_eq!(st, 0);
    assert!(back == data);
}

#[test]
fn discovery_lists_both_portals() {
    let (addrs, _stop) = start(config(
        "[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"",
        "",
    ));
    let mut c = Client::connect(addrs[0]);
    let r = c.login(
        [0x80, 0, 0, 0, 0, 3],
        &[
            ("InitiatorName", "iqn.2026-11.test:e2e"),
            ("SessionType", "Discovery"),
        ],
    );
    assert_eq!(r.status.class, 0);
    let t = TextReq {
        immediate: true,
        final_: true,
        cont: false,
        lun: Lun::default(),
        itt: Itt(9),
        ttt: RESERVED_TAG,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.stat_sn,
    };
    c.send(t.encode(16), b"SendTargets=All\0");
    let resp = c.recv().unwrap();
    let pairs = text::parse(&resp.data).unwrap();
    assert_eq!(pairs[0], ("TargetName".to_string(), IQN.to_string()));
    for (i, a) in addrs.iter().enumerate() {
        assert!(
            pairs.contains(&("TargetAddress".to_string(), format!("{a},{}", i + 1))),
            "{pairs:?}"
        );
    }
}

#[test]
fn login_failures_and_reinstatement() {
    let (addrs, _stop) = start(config(
        "[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"",
        "",
    ));
    let mut c = Client::connect(addrs[0]);
    let r = c.login(
        [0x80, 0, 0, 0, 0, 4],
        &[("InitiatorName", "iqn.x"), ("TargetName", "iqn.nope")],
    );
    assert_eq!(r.status, iscsi_wire::pdu::LoginStatus::new(2, 3));
    assert!(c.recv().is_none(), "connection closed after a failed login");

    let mut a = Client::connect(addrs[0]);
    a.login_normal([0x80, 0, 0, 0, 0, 5], &[]);
    let (st, _, _) = a.command(&[0; 6], 0, false, &[], 0);
    assert_eq!(st, 0);
    // The same ISID through the other portal group is another session
    // (RFC 7143 §4.4.3: the session identifier includes the TPGT).
    let mut other = Client::connect(addrs[1]);
    other.login_normal([0x80, 0, 0, 0, 0, 5], &[]);
    let mut b = Client::connect(addrs[0]);
    b.login_normal([0x80, 0, 0, 0, 0, 5], &[]);
    // The first session was replaced: its connection is closed.
    assert!(a.recv().is_none());
    // The I_T nexus continues in the new session, which learns of the loss.
    let (st, _, sense) = b.command(&[0; 6], 0, false, &[], 0);
    assert_eq!(st, 2);
    assert_eq!((sense[2] & 0x0F, sense[12], sense[13]), (0x06, 0x29, 0x07));
    let (st, _, _) = b.command(&[0; 6], 0, false, &[], 0);
    assert_eq!(st, 0);
    let (st, _, _) = other.command(&[0; 6], 0, false, &[], 0);
    assert_eq!(st, 0, "the session through portal 2 is untouched");
}

#[test]
fn file_lun_write_through_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun.img");
    let luns = format!(
        "[[target.lun]]\nbackend = \"file\"\npath = \"{}\"\nsize = \"8M\"",
        path.display()
    );
    let data = vec![0x5au8; 8192];
    {
        let (addrs, _stop) = start(config(&luns, ""));
        let mut c = Client::connect(addrs[0]);
        c.login_normal([0x80, 0, 0, 0, 0, 6], &[]);
        let (st, _, _) = c.command(&rw10(0x2a, 8, 16), 8192, false, &data, 8192);
        assert_eq!(st, 0);
    }
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(&on_disk[4096..4096 + 8192], &data[..]);
    let (addrs, _stop) = start(config(&luns, ""));
    let mut c = Client::connect(addrs[0]);
    c.login_normal([0x80, 0, 0, 0, 0, 7], &[]);
    let (st, back, _) = c.command(&rw10(0x28, 8, 16), 8192, true, &[], 0);
    assert_eq!(st, 0);
    assert_eq!(back, data);
}

/// Collects the designators of a VPD 0x83 page: (association and type, value).
fn designators(page: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut i = 4;
    while i + 4 <= page.len() {
        let len = usize::from(page[i + 3]);
        out.push((page[i + 1] & 0x3F, page[i + 4..i + 4 + len].to_vec()));
        i += 4 + len;
    }
    out
}

fn rtpg_cdb(extended: bool) -> Vec<u8> {
    let mut c = vec![
        0xA3,
        0x0A | if extended { 0x20 } else { 0 },
        0,
        0,
        0,
        0,
        0,
        0,
        4,
        0,
        0,
        0,
    ];
    c[6..10].copy_from_slice(&1024u32.to_be_bytes());
    c
}

#[test]
fn alua_groups_and_identity_through_both_portals() {
    let alua = "[alua]\nexplicit = true\n\
        [[alua.group]]\nid = 10\nportals = [1]\npreferred = true\n\
        [[alua.group]]\nid = 20\nportals = [2]\nstate = \"active-non-optimized\"\n";
    let (addrs, _stop) = start(config(
        "[[target.lun]]\nbackend = \"mem\"\nsize = \"4M\"",
        alua,
    ));
    let mut paths: Vec<Client> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let mut c = Client::connect(*a);
            c.login_normal([0x80, 0, 0, 0, 1, i as u8], &[]);
            c
        })
        .collect();
    let mut naas = Vec::new();
    let mut reports = Vec::new();
    for (i, c) in paths.iter_mut().enumerate() {
        let (st, inq, _) = c.command(&[0x12, 0, 0, 0, 96, 0], 96, true, &[], 0);
        assert_eq!(st, 0);
        assert_eq!(inq[5] & 0x38, 0x38, "TPGS 11b and 3PC");
        let (st, page, _) = c.command(&[0x12, 1, 0x83, 1, 0, 0], 256, true, &[], 0);
        assert_eq!(st, 0);
        let d = designators(&page);
        let find = |t: u8| d.iter().find(|(k, _)| *k == t).map(|(_, v)| v.clone());
        naas.push(find(0x03).expect("NAA designator"));
        let port = find(0x14).expect("relative target port");
        let group = find(0x15).expect("target port group");
        assert_eq!(u16::from_be_bytes([port[2], port[3]]), i as u16 + 1);
        assert_eq!(u16::from_be_bytes([group[2], group[3]]), [10, 20][i]);
        let (st, rtpg, _) = c.command(&rtpg_cdb(true), 1024, true, &[], 0);
        assert_eq!(st, 0);
        reports.push(rtpg);
    }
    assert_eq!(naas[0], naas[1], "one LU identity on every path");
    assert_eq!(
        reports[0], reports[1],
        "the same report through each portal"
    );
    #[rustfmt::skip]
    let want = [
        0, 0, 0, 28, 0x10, 0, 0, 0,
        0x80, 0x0F, 0, 10, 0, 0, 0, 1, 0, 0, 0, 1,
        0x01, 0x0F, 0, 20, 0, 0, 0, 1, 0, 0, 0, 2,
    ];
    assert_eq!(reports[0], want);

    // Explicit ALUA: put group 20 in standby through portal 1.
    let list = [0, 0, 0, 0, 0x02, 0, 0, 20];
    let mut stpg = vec![0xA4, 0x0A, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0];
    stpg[6..10].copy_from_slice(&8u32.to_be_bytes());
    let (st, _, _) = paths[0].command(&stpg, 8, false, &list, 8);
    assert_eq!(st, 0);
    // The other path learns of it, then its I/O is refused.
    let (st, _, sense) = paths[1].command(&[0; 6], 0, false, &[], 0);
    assert_eq!(st, 2);
    assert_eq!((sense[2] & 0x0F, sense[12], sense[13]), (0x06, 0x2A, 0x06));
    let (st, _, sense) = paths[1].command(&rw10(0x28, 0, 1), 512, true, &[], 0);
    assert_eq!(st, 2);
    assert_eq!((sense[2] & 0x0F, sense[12], sense[13]), (0x02, 0x04, 0x0B));
    let (st, rtpg, _) = paths[1].command(&rtpg_cdb(false), 1024, true, &[], 0);
    assert_eq!(st, 0);
    assert_eq!(
        (rtpg[16] & 0x0F, rtpg[21]),
        (0x02, 0x01),
        "standby, set by STPG"
    );
    // Portal 1 keeps working.
    let (st, _, _) = paths[0].command(&rw10(0x28, 0, 1), 512, true, &[], 0);
    assert_eq!(st, 0);
}

#[test]
fn extended_copy_between_luns_of_the_target() {
    let (addrs, _stop) = start(config(
        "[[target.lun]]\nbackend = \"mem\"\nsize = \"4M\"\n[[target.lun]]\nbackend = \"mem\"\nsize = \"4M\"",
        "",
    ));
    let mut c = Client::connect(addrs[0]);
    c.login_normal([0x80, 0, 0, 0, 2, 1], &[]);
    let mut naa = Vec::new();
    for lun in 0..2 {
        c.lun = lun;
        let (st, page, _) = c.command(&[0x12, 1, 0x83, 1, 0, 0], 256, true, &[], 0);
        assert_eq!(st, 0);
        let d = designators(&page);
        naa.push(d.into_iter().find(|(k, _)| *k == 0x03).unwrap().1);
    }
    c.lun = 0;
    let data: Vec<u8> = (0..8 * 512).map(|i| (i * 7 % 251) as u8).collect();
    let (st, _, _) = c.command(&rw10(0x2A, 16, 8), 4096, false, &data, 4096);
    assert_eq!(st, 0);
    // Copy LUN 0 blocks 16..24 to LUN 1 block 100, issued to LUN 1.
    let mut p = vec![0u8; 16];
    p[1] = 0x18; // LIST ID USAGE 11b
    p[3] = 64;
    p[11] = 28;
    for n in &naa {
        let mut d = vec![0u8; 32];
        d[0] = 0xE4;
        d[4] = 1;
        d[5] = 3;
        d[7] = 16;
        d[8..24].copy_from_slice(n);
        d[30] = 2; // 512-byte blocks
        p.extend_from_slice(&d);
    }
    let mut seg = vec![0u8; 28];
    seg[0] = 0x02;
    seg[3] = 0x18;
    seg[7] = 1; // destination: CSCD 1
    seg[11] = 8;
    seg[19] = 16;
    seg[27] = 100;
    p.extend_from_slice(&seg);
    let mut xcopy = vec![0u8; 16];
    xcopy[0] = 0x83;
    xcopy[10..14].copy_from_slice(&(p.len() as u32).to_be_bytes());
    c.lun = 1;
    let (st, _, sense) = c.command(&xcopy, p.len() as u32, false, &p, p.len());
    assert_eq!(st, 0, "sense {sense:02x?}");
    let (st, got, _) = c.command(&rw10(0x28, 100, 8), 4096, true, &[], 0);
    assert_eq!(st, 0);
    assert_eq!(got, data);
}

#[test]
fn read_only_lun_end_to_end() {
    let (addrs, _stop) = start(config(
        "[[target.lun]]\nbackend = \"mem\"\nsize = \"4M\"\nread_only = true",
        "",
    ));
    let mut c = Client::connect(addrs[0]);
    c.login_normal([0x80, 0, 0, 0, 3, 1], &[]);
    let (st, mode, _) = c.command(&[0x1A, 0, 0x3F, 0, 255, 0], 255, true, &[], 0);
    assert_eq!(st, 0);
    assert_eq!(mode[2] & 0x80, 0x80, "WP in the mode parameter header");
    let (st, _, sense) = c.command(&rw10(0x2A, 0, 1), 512, false, &[0; 512], 512);
    assert_eq!(st, 2);
    assert_eq!((sense[2] & 0x0F, sense[12], sense[13]), (0x07, 0x27, 0x00));
    let (st, _, _) = c.command(&rw10(0x28, 0, 1), 512, true, &[], 0);
    assert_eq!(st, 0);
}

/// Logins of one session (same initiator, ISID and portal group) racing
/// each other, each connection closed right after its login: every newer
/// login replaces the session, and a connection whose session was
/// replaced (or already removed) meanwhile ends quietly. The worker
/// threads must not panic (one did when the registry entry it had just
/// made was gone before it read it back), and the target still serves.
#[test]
fn logins_racing_for_one_session_end_cleanly() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static PANICS: AtomicUsize = AtomicUsize::new(0);
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("ironsan-io"))
        {
            PANICS.fetch_add(1, Ordering::SeqCst);
        }
        prev(info);
    }));
    let (addrs, _stop) = start(config(
        "[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"",
        "",
    ));
    let isid = [0x80, 0, 0, 0, 0x0e, 1];
    for _ in 0..150 {
        let racers: Vec<_> = (0..4)
            .map(|_| {
                let a = addrs[0];
                std::thread::spawn(move || {
                    Client::connect(a).login_normal(isid, &[("DefaultTime2Retain", "0")])
                })
            })
            .collect();
        for r in racers {
            r.join().expect("every login succeeds");
        }
    }
    let mut c = Client::connect(addrs[0]);
    c.login_normal(isid, &[]);
    let mut st = 2;
    for _ in 0..3 {
        st = c.command(&[0; 6], 0, false, &[], 0).0;
        if st == 0 {
            break;
        }
    }
    assert_eq!(st, 0, "TEST UNIT READY after the races");
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a worker thread panicked");
}
