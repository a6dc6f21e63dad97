//! Hostile input over real sockets: each case gets the protocol's answer
//! (Reject, CHECK CONDITION, login failure, or that connection closed) and
//! another session keeps working in the same test.

mod common;

use std::time::{Duration, Instant};

use common::*;
use iscsi_wire::pdu::*;
use iscsi_wire::{text, Sn};

const LUN: &str = "[[target.lun]]\nbackend = \"mem\"\nsize = \"16M\"";

fn srv() -> (Vec<std::net::SocketAddr>, Stopper) {
    start(config(LUN, "[timeouts]\nlogin = 2"))
}

fn login_req(cont: bool, transit: bool) -> LoginReq {
    LoginReq {
        transit,
        cont,
        csg: 1,
        nsg: 3,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 0, 9, 9],
        tsih: 0,
        itt: Itt(0),
        cid: 0,
        cmd_sn: Sn(1),
        exp_stat_sn: Sn(0),
    }
}

fn normal_keys() -> Vec<(&'static str, String)> {
    vec![
        ("InitiatorName", "iqn.2026-11.test:hostile".into()),
        ("TargetName", IQN.into()),
        ("SessionType", "Normal".into()),
    ]
}

/// Sends one login PDU; returns the status of the answer (None: closed).
fn login_status(c: &mut Client, body: &[u8]) -> Option<LoginStatus> {
    c.send(login_req(false, true).encode(body.len()), body);
    let r = c.recv_within(Duration::from_secs(5))?;
    let resp = LoginResp::decode(&r.bhs);
    Some(resp.status)
}

#[test]
fn oversized_segments_and_truncated_headers_before_login() {
    let (a, _s) = srv();
    // A data segment of 16 MiB announced in a Login Request: closed before
    // anything is allocated for it.
    let mut c = Client::connect(a[0]);
    let mut bhs = login_req(false, true).encode(0);
    bhs[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
    c.raw(&bhs);
    assert!(c.closed_within(Duration::from_secs(3)), "16 MiB segment");
    // Just over the 8 KiB login limit.
    let mut c = Client::connect(a[0]);
    let mut bhs = login_req(false, true).encode(0);
    bhs[5..8].copy_from_slice(&8193u32.to_be_bytes()[1..]);
    c.raw(&bhs);
    assert!(c.closed_within(Duration::from_secs(3)), "8193-byte segment");
    // The largest AHS (1020 bytes) of garbage on a Login Request: answered
    // or closed, nothing else.
    let mut c = Client::connect(a[0]);
    let body = text::encode(&normal_keys());
    let mut bhs = login_req(false, true).encode(body.len());
    bhs[4] = 255;
    let mut v = bhs.to_vec();
    v.extend(std::iter::repeat_n(0xa5u8, 1020));
    v.extend_from_slice(&body);
    v.resize(v.len() + iscsi_wire::digest::pad_len(body.len()), 0);
    c.raw(&v);
    let _ = c.recv_within(Duration::from_secs(3));
    // A truncated header, then silence: the login timeout (2 s) ends it,
    // and meanwhile others are served.
    let mut slow = Client::connect(a[0]);
    slow.raw(&login_req(false, true).encode(0)[..20]);
    let t0 = Instant::now();
    sanity(a[0], 1);
    assert!(
        slow.closed_within(Duration::from_secs(5)),
        "half header kept"
    );
    assert!(t0.elapsed() >= Duration::from_millis(1500));
    sanity(a[1], 2);
}

#[test]
fn malformed_text_keys_fail_the_login() {
    let (a, _s) = srv();
    let base = text::encode(&normal_keys());
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut v = base.clone();
    v.extend_from_slice(b"NoEqualsSign\0");
    cases.push(("key without =", v));
    let mut v = base.clone();
    v.extend_from_slice(b"MaxBurstLength=4096\0MaxBurstLength=8192\0");
    cases.push(("duplicated key", v));
    let mut v = base.clone();
    v.extend_from_slice(format!("{}=1\0", "K".repeat(64)).as_bytes());
    cases.push(("key over 63 bytes", v));
    let mut v = base.clone();
    v.extend_from_slice(b"=value\0");
    cases.push(("empty key", v));
    let mut v = base.clone();
    v.extend_from_slice(&[b'X', b'=', 0xff, 0xfe, 0]);
    cases.push(("not UTF-8", v));
    let mut v = text::encode(&[("TargetName", IQN), ("SessionType", "Normal")]);
    v.extend_from_slice(format!("InitiatorName={}\0", "i".repeat(256)).as_bytes());
    cases.push(("InitiatorName over 223 bytes", v));
    for (what, body) in cases {
        let mut c = Client::connect(a[0]);
        let st = login_status(&mut c, &body);
        assert!(
            matches!(st, Some(LoginStatus { class: 2, .. })),
            "{what}: {st:?}"
        );
        assert!(
            c.closed_within(Duration::from_secs(3)),
            "{what}: not closed"
        );
    }
    // A value over 8192 bytes, sent in two continued PDUs.
    let mut c = Client::connect(a[0]);
    let mut big = base.clone();
    big.extend_from_slice(format!("X-long={}\0", "v".repeat(8200)).as_bytes());
    let (p1, p2) = big.split_at(8000);
    c.send(login_req(true, false).encode(p1.len()), p1);
    let r = c.recv().expect("continue answer");
    assert_eq!(LoginResp::decode(&r.bhs).status.class, 0);
    let st = login_status(&mut c, p2);
    assert!(
        matches!(st, Some(LoginStatus { class: 2, .. })),
        "value over 8192: {st:?}"
    );
    // Endless C-bit continuation: refused after a bounded number.
    let mut c = Client::connect(a[0]);
    let mut failed = false;
    for _ in 0..300 {
        c.send(login_req(true, false).encode(4), b"a=b\0");
        match c.recv_within(Duration::from_secs(3)) {
            Some(r) if LoginResp::decode(&r.bhs).status.class == 0 => {}
            _ => {
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "endless continuation accepted");
    sanity(a[0], 3);
}

#[test]
fn commands_before_login_and_in_discovery() {
    let (a, _s) = srv();
    let mut c = Client::connect(a[0]);
    let itt = c.cmd(&rw10(0x28, 0, 1), 512, true, false, true, &[]);
    let r = c.recv().expect("an answer");
    assert_eq!(opcode(&r.bhs), Opcode::LoginResp);
    let resp = LoginResp::decode(&r.bhs);
    assert_eq!(resp.status, iscsi_wire::pdu::LoginStatus::new(2, 0x0b));
    assert_eq!(resp.itt, itt);
    assert!(c.closed_within(Duration::from_secs(3)));
    // In a discovery session: Reject, and the session goes on.
    let mut d = Client::connect(a[0]);
    let r = d.login(
        [0x80, 0, 0, 0, 8, 8],
        &[
            ("InitiatorName", "iqn.2026-11.test:d"),
            ("SessionType", "Discovery"),
        ],
    );
    assert_eq!(r.status.class, 0);
    d.cmd_sn = r.sn.exp_cmd_sn;
    d.cmd(&rw10(0x28, 0, 1), 512, true, false, true, &[]);
    let r = d.recv().expect("reject");
    assert_eq!(opcode(&r.bhs), Opcode::Reject);
    assert_eq!(Reject::decode(&r.bhs).reason, RejectReason::ProtocolError);
    assert!(d.ping());
    sanity(a[1], 4);
}

#[test]
fn cmd_sn_outside_the_window_and_wrap_around() {
    let (a, _s) = srv();
    let mut c = Client::connect(a[0]);
    // Start just below the wrap so the session crosses 2^32.
    c.cmd_sn = Sn(0xffff_fff0);
    c.login_normal([0x80, 0, 0, 0, 7, 1], &[]);
    for i in 0..40u32 {
        let (st, _, _) = c.command(&[0; 6], 0, false, &[], 0);
        assert_eq!(st, 0, "TEST UNIT READY {i} across the wrap");
    }
    assert!(c.cmd_sn.0 < 0x100, "wrapped");
    // Far ahead, and behind (a duplicate): silently ignored (§4.2.2.1).
    let good = c.cmd_sn;
    for sn in [
        good.0.wrapping_add(1 << 30),
        good.0.wrapping_sub(5),
        good.0.wrapping_add(0x8000_0000),
    ] {
        c.cmd_sn = Sn(sn);
        c.cmd(&rw10(0x28, 0, 1), 512, true, false, true, &[]);
    }
    assert!(
        c.recv_within(Duration::from_millis(500)).is_none(),
        "answered"
    );
    c.cmd_sn = good;
    let (st, _, _) = c.command(&rw10(0x28, 0, 1), 512, true, &[], 0);
    assert_eq!(st, 0, "the window still works");
    sanity(a[1], 5);
}

#[test]
fn hostile_data_out() {
    let (a, _s) = srv();
    let mut c = Client::connect(a[0]);
    c.login_normal([0x80, 0, 0, 0, 7, 2], &[]);
    let data = vec![0x5au8; 8192];
    // (what, ttt from R2T?, data_sn, offset, len)
    type Case = (&'static str, Option<u32>, u32, u32, usize);
    let cases: [Case; 6] = [
        ("unknown TTT", Some(0x1234_5678), 0, 0, 4096),
        ("gapped offset", None, 0, 512, 4096),
        ("overlapping offset", None, 0, 0, 4096),
        ("past EDTL", None, 0, 8192, 512),
        ("duplicate DataSN", None, 0, 0, 4096),
        ("reversed DataSN", None, 1, 0, 4096),
    ];
    for (i, (what, ttt, sn, off, len)) in cases.into_iter().enumerate() {
        let itt = c.cmd(&rw10(0x2a, 16, 16), 8192, false, true, true, &[]);
        let r = c.recv().expect("R2T");
        let Pdu::R2t(r2t) = Pdu::parse(&r.bhs) else {
            panic!("{what}: expected R2T")
        };
        assert_eq!(r2t.desired_len, 8192);
        let t = ttt.unwrap_or(r2t.ttt);
        match i {
            2 => {
                // A good first PDU, then one overlapping it.
                c.data_out(itt, t, 0, 0, false, &data[..4096]);
                c.data_out(itt, t, 1, 2048, false, &data[..4096]);
            }
            4 => {
                c.data_out(itt, t, 0, 0, false, &data[..4096]);
                c.data_out(itt, t, 0, 4096, true, &data[..4096]);
            }
            _ => c.data_out(itt, t, sn, off, true, &data[..len]),
        }
        let mut seen = Vec::new();
        let st = if i == 0 {
            // Data for an unknown TTT cannot be placed: the command fails or
            // waits; finish it with the real data to see which.
            c.data_out(itt, r2t.ttt, 0, 0, true, &data);
            c.status_of(itt, &mut seen)
        } else {
            c.status_of(itt, &mut seen)
        }
        .expect("status");
        assert_eq!(st.0, 2, "{what}: CHECK CONDITION expected, got {st:?}");
        assert!(c.ping(), "{what}: session dead");
    }
    sanity(a[1], 6);
}

#[test]
fn immediate_data_and_flags() {
    let (a, _s) = srv();
    let mut c = Client::connect(a[0]);
    c.login_normal([0x80, 0, 0, 0, 7, 3], &[("FirstBurstLength", "4096")]);
    let data = vec![1u8; 8192];
    // Immediate data over FirstBurstLength: Reject.
    c.cmd(&rw10(0x2a, 0, 16), 8192, false, true, true, &data);
    let r = c.recv().expect("reject");
    assert_eq!(opcode(&r.bhs), Opcode::Reject, "over FirstBurstLength");
    assert!(c.ping());
    // Immediate data on a read: Reject.
    c.cmd(&rw10(0x28, 0, 1), 512, true, false, true, &data[..512]);
    let r = c.recv().expect("reject");
    assert_eq!(opcode(&r.bhs), Opcode::Reject, "data on a read");
    // READ and WRITE bits together: CHECK CONDITION.
    let itt = c.cmd(&rw10(0x2a, 0, 1), 512, true, true, true, &[]);
    let st = c.status_of(itt, &mut Vec::new()).unwrap();
    assert_eq!(st.0, 2, "bidirectional");
    assert!(c.ping());
    // ImmediateData=No, then immediate data anyway.
    let mut d = Client::connect(a[0]);
    d.login_normal([0x80, 0, 0, 0, 7, 4], &[("ImmediateData", "No")]);
    d.cmd(&rw10(0x2a, 0, 1), 512, false, true, true, &data[..512]);
    let r = d.recv().expect("reject");
    assert_eq!(opcode(&r.bhs), Opcode::Reject, "immediate data disallowed");
    assert!(d.ping());
    sanity(a[1], 7);
}

fn sense_key(sense: &[u8]) -> (u8, u8) {
    if sense.len() > 12 {
        (sense[2] & 0xf, sense[12])
    } else {
        (0xff, 0xff)
    }
}

#[test]
fn hostile_cdbs() {
    let (a, _s) = srv();
    let mut c = Client::connect(a[0]);
    c.login_normal([0x80, 0, 0, 0, 7, 5], &[]);
    // LBA + length overflowing u64.
    let mut r16 = [0u8; 16];
    r16[0] = 0x88;
    r16[2..10].copy_from_slice(&(u64::MAX - 1).to_be_bytes());
    r16[10..14].copy_from_slice(&4u32.to_be_bytes());
    let (st, _, sense) = c.command(&r16, 2048, true, &[], 0);
    assert_eq!((st, sense_key(&sense)), (2, (5, 0x21)), "READ(16) overflow");
    let mut w16 = r16;
    w16[0] = 0x8a;
    let (st, _, sense) = c.command(&w16, 2048, false, &[0u8; 2048], 2048);
    assert_eq!((st, sense_key(&sense).0), (2, 5), "WRITE(16) overflow");
    // WRITE SAME(16): NDOB with a huge count, and a count past the end.
    let mut ws = [0u8; 16];
    ws[0] = 0x93;
    ws[1] = 0x01; // NDOB
    ws[10..14].copy_from_slice(&u32::MAX.to_be_bytes());
    let (st, _, _) = c.command(&ws, 0, false, &[], 0);
    assert_eq!(st, 2, "WRITE SAME NDOB huge count");
    ws[1] = 0;
    ws[2..10].copy_from_slice(&30000u64.to_be_bytes());
    ws[10..14].copy_from_slice(&10000u32.to_be_bytes());
    let (st, _, _) = c.command(&ws, 512, false, &[0u8; 512], 512);
    assert_eq!(st, 2, "WRITE SAME past the end");
    // UNMAP with malformed parameter lists.
    let unmap = |len: u16| {
        let mut cdb = [0u8; 10];
        cdb[0] = 0x42;
        cdb[7..9].copy_from_slice(&len.to_be_bytes());
        cdb
    };
    let mut desc_past_end = vec![0u8; 24];
    desc_past_end[0..2].copy_from_slice(&22u16.to_be_bytes());
    desc_past_end[2..4].copy_from_slice(&16u16.to_be_bytes());
    desc_past_end[8..16].copy_from_slice(&(u64::MAX - 2).to_be_bytes());
    desc_past_end[16..20].copy_from_slice(&8u32.to_be_bytes());
    let mut bad_lengths = desc_past_end.clone();
    bad_lengths[0..2].copy_from_slice(&100u16.to_be_bytes());
    bad_lengths[2..4].copy_from_slice(&90u16.to_be_bytes());
    bad_lengths[8..16].copy_from_slice(&0u64.to_be_bytes());
    let mut odd_desc = desc_past_end.clone();
    odd_desc[2..4].copy_from_slice(&15u16.to_be_bytes());
    odd_desc[8..16].copy_from_slice(&0u64.to_be_bytes());
    // (SBC-4 §5.32.2: an incomplete last descriptor is ignored: GOOD.)
    for (what, p, want) in [
        ("descriptor past the end", desc_past_end, 2),
        ("lengths beyond the list", bad_lengths, 2),
        ("descriptor length not a multiple of 16", odd_desc, 0),
        ("short header", vec![0u8, 6, 0, 16, 0, 0], 2),
    ] {
        let (st, _, _) = c.command(&unmap(p.len() as u16), p.len() as u32, false, &p, p.len());
        assert_eq!(st, want, "UNMAP {what}");
    }
    // Odd allocation lengths: GOOD, and never more data than allocated.
    let allocs = [0u32, 1, 0xffff, 0xffff_ffff];
    for alloc in allocs {
        let a16 = alloc.min(0xffff) as u16;
        let cdbs: Vec<(&str, Vec<u8>, u32)> = vec![
            (
                "INQUIRY",
                vec![0x12, 0, 0, (a16 >> 8) as u8, a16 as u8, 0],
                u32::from(a16),
            ),
            (
                "INQUIRY VPD 0x83",
                vec![0x12, 1, 0x83, (a16 >> 8) as u8, a16 as u8, 0],
                u32::from(a16),
            ),
            (
                "REQUEST SENSE",
                vec![0x03, 0, 0, 0, alloc.min(255) as u8, 0],
                alloc.min(255),
            ),
            (
                "MODE SENSE(6)",
                vec![0x1a, 0, 0x3f, 0, alloc.min(255) as u8, 0],
                alloc.min(255),
            ),
            (
                "MODE SENSE(10)",
                vec![0x5a, 0, 0x3f, 0, 0, 0, 0, (a16 >> 8) as u8, a16 as u8, 0],
                u32::from(a16),
            ),
            (
                "REPORT SUPPORTED OPERATION CODES",
                {
                    let mut v = vec![0xa3, 0x0c, 0, 0, 0, 0];
                    v.extend_from_slice(&alloc.to_be_bytes());
                    v.extend_from_slice(&[0, 0]);
                    v
                },
                alloc,
            ),
        ];
        for (what, cdb, alloc) in cdbs {
            let edtl = alloc.min(1 << 20);
            let (st, data, sense) = c.command(&cdb, edtl, true, &[], 0);
            assert_eq!(st, 0, "{what} alloc {alloc}: {sense:02x?}");
            assert!(
                data.len() as u32 <= edtl,
                "{what} alloc {alloc}: {} bytes",
                data.len()
            );
        }
    }
    assert!(c.ping());
    sanity(a[1], 8);
}

#[test]
fn digest_errors_close_only_that_connection() {
    let (a, _s) = srv();
    let keys = [("HeaderDigest", "CRC32C"), ("DataDigest", "CRC32C")];
    // Header digest error: the connection closes.
    let mut c = Client::connect(a[0]);
    c.login_normal([0x80, 0, 0, 0, 7, 6], &keys);
    let cmd = ScsiCommand {
        immediate: false,
        final_: true,
        read: false,
        write: false,
        attr: TaskAttr::Simple,
        lun: Lun::default(),
        itt: Itt(50),
        edtl: 0,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.stat_sn,
        cdb: [0; 16],
    };
    let mut v = cmd.encode(0).to_vec();
    v.extend_from_slice(&0xdead_beefu32.to_le_bytes());
    c.raw(&v);
    assert!(c.closed_within(Duration::from_secs(3)), "header digest");
    // Data digest error: Reject (reason 0x02), then the connection closes.
    let mut c = Client::connect(a[0]);
    c.login_normal([0x80, 0, 0, 0, 7, 7], &keys);
    let mut cmd = cmd;
    cmd.write = true;
    cmd.edtl = 512;
    cmd.cdb[..10].copy_from_slice(&rw10(0x2a, 0, 1));
    cmd.cmd_sn = c.cmd_sn;
    let bhs = cmd.encode(512);
    let mut v = bhs.to_vec();
    v.extend_from_slice(&iscsi_wire::digest::crc32c_parts(&[&bhs]).to_le_bytes());
    v.extend_from_slice(&[7u8; 512]);
    v.extend_from_slice(&0u32.to_le_bytes());
    c.raw(&v);
    let mut lim = iscsi_wire::frame::FrameLimits::LOGIN;
    lim.header_digest = true;
    lim.data_digest = true;
    lim.max_data_segment = 1 << 20;
    let mut got_reject = false;
    let mut tmp = [0u8; 4096];
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        use std::io::Read;
        match c.s.read(&mut tmp) {
            Ok(0) | Err(_) => break,
            Ok(n) => c.buf.extend_from_slice(&tmp[..n]),
        }
        while let Ok(Some(n)) = iscsi_wire::frame::frame_len(&c.buf, &lim) {
            let p = iscsi_wire::frame::split_pdu(&mut c.buf, n, &lim).unwrap();
            if opcode(&p.bhs) == Opcode::Reject
                && Reject::decode(&p.bhs).reason == RejectReason::DataDigestError
            {
                got_reject = true;
            }
        }
    }
    assert!(got_reject, "no data digest Reject");
    sanity(a[1], 9);
}

#[test]
fn an_initiator_that_stops_reading_stalls_nobody() {
    let (a, _s) = srv();
    let mut c = Client::connect(a[0]);
    c.login_normal([0x80, 0, 0, 0, 7, 8], &[]);
    // 128 reads of 1 MiB, none of the answers read: 128 MiB the target
    // may not buffer.
    for _ in 0..128 {
        c.cmd(&rw10(0x28, 0, 2048), 1 << 20, true, false, true, &[]);
    }
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    for i in 0..5 {
        sanity(a[i % 2], 10 + i as u8);
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let rss = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap();
    assert!(rss < 512 * 1024, "target buffers too much: RSS {rss} KiB");
    drop(c);
    sanity(a[0], 20);
}

/// A Login Request on a new connection for session `tsih` with `cid`.
fn relogin(c: &mut Client, isid: [u8; 6], tsih: u16, cid: u16) -> LoginResp {
    let req = LoginReq {
        tsih,
        cid,
        cmd_sn: c.cmd_sn,
        isid,
        ..login_req(false, true)
    };
    let keys = [
        ("InitiatorName", "iqn.2026-11.test:e2e"),
        ("TargetName", IQN),
        ("SessionType", "Normal"),
    ];
    let body = text::encode(&keys);
    c.send(req.encode(body.len()), &body);
    let r = c
        .recv_within(Duration::from_secs(10))
        .expect("login response");
    let resp = LoginResp::decode(&r.bhs);
    c.stat_sn = resp.sn.stat_sn.next();
    resp
}

#[test]
fn connection_reinstatement_mid_write_keeps_the_session_going() {
    let (a, _s) = srv();
    reinstate_mid_write(a[0]);
}

#[test]
fn connection_reinstatement_on_a_file_lun() {
    // A file LUN runs writes on I/O threads: the old connection's are
    // drained before the session moves on.
    let dir = tempfile::tempdir().unwrap();
    let lun = format!(
        "[[target.lun]]\nbackend = \"file\"\npath = \"{}\"\nsize = \"16M\"",
        dir.path().join("lun.img").display()
    );
    let (a, _s) = start(config(&lun, "[timeouts]\nlogin = 2"));
    reinstate_mid_write(a[0]);
}

/// Logs in with `isid` and the `extra` keys: the connection and the
/// session's TSIH.
fn login_with(
    portal: std::net::SocketAddr,
    isid: [u8; 6],
    extra: &[(&str, &str)],
) -> (Client, u16) {
    let mut c = Client::connect(portal);
    let mut keys = vec![
        ("InitiatorName", "iqn.2026-11.test:e2e"),
        ("TargetName", IQN),
        ("SessionType", "Normal"),
    ];
    keys.extend_from_slice(extra);
    let r = c.login(isid, &keys);
    assert_eq!(r.status, iscsi_wire::pdu::LoginStatus::new(0, 0));
    (c, r.tsih)
}

/// Logs in with `isid` (InitialR2T, no immediate data), writes 8 blocks,
/// then starts a 64-block write and sends half its data: returns the
/// connection, left mid-write, and the session's TSIH.
fn half_written(portal: std::net::SocketAddr, isid: [u8; 6]) -> (Client, u16) {
    let (mut c, tsih) = login_with(
        portal,
        isid,
        &[("InitialR2T", "Yes"), ("ImmediateData", "No")],
    );
    let (st, _, _) = c.command(&rw10(0x2a, 0, 8), 4096, false, &[0xaa; 4096], 0);
    assert_eq!(st, 0);
    let itt = c.cmd(&rw10(0x2a, 0, 64), 32768, false, true, true, &[]);
    let r2t = c.recv().expect("R2T");
    let Pdu::R2t(t) = Pdu::parse(&r2t.bhs) else {
        panic!("expected an R2T");
    };
    c.data_out(itt, t.ttt, 0, 0, false, &[0xbb; 16384]);
    (c, tsih)
}

/// After a connection reinstatement: the same I_T nexus (no unit
/// attention; a new session would get 29/07), and I/O goes on — the write
/// done again on the new connection, and read back.
fn session_goes_on(new: &mut Client, seed: u8) {
    let (st, _, sense) = new.command(&[0; 6], 0, false, &[], 0);
    assert_eq!((st, sense), (0, Vec::new()), "TEST UNIT READY");
    let data: Vec<u8> = (0..32768u32).map(|i| (i / 512) as u8 ^ seed).collect();
    let (st, _, _) = new.command(&rw10(0x2a, 0, 64), 32768, false, &data, 0);
    assert_eq!(st, 0);
    let (st, din, _) = new.command(&rw10(0x28, 0, 64), 32768, true, &[], 0);
    assert_eq!(st, 0);
    assert!(din == data, "read back what the new connection wrote");
}

fn reinstate_mid_write(portal: std::net::SocketAddr) {
    let a = [portal];
    let isid = [0x80, 0, 0, 0, 0x42, 1];
    // Mid-write, then the path dies (the target sees no FIN, as when a
    // cable or a switch port goes).
    let (mut old, tsih) = half_written(portal, isid);

    // Another CID of the same session: MaxConnections is 1.
    let mut other = Client::connect(a[0]);
    other.cmd_sn = old.cmd_sn;
    let r = relogin(&mut other, isid, tsih, 1);
    assert_eq!(
        r.status,
        iscsi_proto::login::LoginStatus::TOO_MANY_CONNECTIONS
    );
    // No such session.
    let mut other = Client::connect(a[0]);
    let r = relogin(&mut other, isid, tsih.wrapping_add(100), 0);
    assert_eq!(
        r.status,
        iscsi_proto::login::LoginStatus::SESSION_DOES_NOT_EXIST
    );

    // The initiator logs in again with the same ISID, TSIH and CID.
    let mut new = Client::connect(a[0]);
    new.cmd_sn = old.cmd_sn;
    let r = relogin(&mut new, isid, tsih, 0);
    assert_eq!(
        r.status,
        iscsi_wire::pdu::LoginStatus::new(0, 0),
        "reinstated"
    );
    assert_eq!(r.tsih, tsih, "the same session");
    // The old connection was ended by the target.
    assert!(
        old.closed_within(Duration::from_secs(10)),
        "old connection still open"
    );
    session_goes_on(&mut new, 0x5c);
}

#[test]
fn a_connection_closed_mid_write_is_reinstated_within_time2retain() {
    // The initiator closes its connection (FIN, no logout) in the middle of
    // a write: the session has failed, and with DefaultTime2Retain 20 (the
    // default: not offered) it is kept for Time2Wait + Time2Retain (RFC 7143
    // §6.3.6, §13.16). A login with its ISID, TSIH and CID takes it over.
    let (a, _s) = srv();
    let isid = [0x80, 0, 0, 0, 0x42, 3];
    let (old, tsih) = half_written(a[0], isid);
    let cmd_sn = old.cmd_sn;
    old.s.shutdown(std::net::Shutdown::Both).unwrap();
    drop(old);
    std::thread::sleep(Duration::from_millis(300));
    let mut new = Client::connect(a[0]);
    new.cmd_sn = cmd_sn;
    let r = relogin(&mut new, isid, tsih, 0);
    assert_eq!(
        r.status,
        iscsi_wire::pdu::LoginStatus::new(0, 0),
        "reinstated"
    );
    assert_eq!(r.tsih, tsih);
    session_goes_on(&mut new, 0x3c);
}

#[test]
fn with_time2retain_0_a_closed_connections_session_is_gone() {
    // DefaultTime2Retain=0 (what libiscsi and ironsan's initiator offer):
    // session state is discarded at once (RFC 7143 §13.16); a login with
    // the old TSIH finds no session (0x020A), and a new one (TSIH 0, the
    // same ISID) is made.
    let (a, _s) = srv();
    let isid = [0x80, 0, 0, 0, 0x42, 2];
    let (old, tsih) = login_with(a[0], isid, &[("DefaultTime2Retain", "0")]);
    old.s.shutdown(std::net::Shutdown::Both).unwrap();
    drop(old);
    std::thread::sleep(Duration::from_millis(300));
    let mut again = Client::connect(a[0]);
    let r = relogin(&mut again, isid, tsih, 0);
    assert_eq!(
        r.status,
        iscsi_proto::login::LoginStatus::SESSION_DOES_NOT_EXIST
    );
    let mut fresh = Client::connect(a[0]);
    let r = relogin(&mut fresh, isid, 0, 0);
    assert_eq!(r.status, iscsi_wire::pdu::LoginStatus::new(0, 0));
    assert_ne!(r.tsih, 0);
}

#[test]
fn a_failed_session_is_discarded_after_time2wait_plus_time2retain() {
    // DefaultTime2Retain 1 (Time2Wait: the target's 2): the failed session
    // holds its I_T nexus, and so its RESERVE(6), for about 3 s, then is
    // discarded: the reservation goes, its TSIH no longer logs in.
    let (a, _s) = srv();
    let isid = [0x80, 0, 0, 0, 0x42, 4];
    let (mut old, tsih) = login_with(a[0], isid, &[("DefaultTime2Retain", "1")]);
    let (st, _, _) = old.command(&[0x16, 0, 0, 0, 0, 0], 0, false, &[], 0);
    assert_eq!(st, 0, "RESERVE(6)");
    old.s.shutdown(std::net::Shutdown::Both).unwrap();
    drop(old);
    let mut other = Client::connect(a[0]);
    other.login_normal([0x80, 0, 0, 0, 0x43, 4], &[]);
    std::thread::sleep(Duration::from_millis(300));
    let (st, _, _) = other.command(&rw10(0x28, 0, 1), 512, true, &[], 0);
    assert_eq!(st, 0x18, "still reserved by the failed session");
    std::thread::sleep(Duration::from_secs(4));
    let (st, _, _) = other.command(&rw10(0x28, 0, 1), 512, true, &[], 0);
    assert_eq!(st, 0, "released once the session was discarded");
    let mut late = Client::connect(a[0]);
    let r = relogin(&mut late, isid, tsih, 0);
    assert_eq!(
        r.status,
        iscsi_proto::login::LoginStatus::SESSION_DOES_NOT_EXIST
    );
}
