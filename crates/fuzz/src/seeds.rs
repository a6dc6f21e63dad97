//! Seed inputs: valid login streams (plain, CHAP with mutual CHAP,
//! discovery) followed by full feature phase traffic, and CDBs. The
//! runner writes them to `fuzz/corpus/` with `--write-seeds`.

use iscsi_proto::chap::{self, Secret};
use iscsi_wire::pdu::*;
use iscsi_wire::{text, Sn};

fn pad(v: &mut Vec<u8>) {
    while !v.len().is_multiple_of(4) {
        v.push(0);
    }
}

fn login(csg: u8, nsg: u8, transit: bool, keys: &[(&str, &str)], out: &mut Vec<u8>) {
    let body = text::encode(keys);
    let r = LoginReq {
        transit,
        cont: false,
        csg,
        nsg,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 0, 0, 1],
        tsih: 0,
        itt: Itt(1),
        cid: 0,
        cmd_sn: Sn(10),
        exp_stat_sn: Sn(0),
    };
    out.extend_from_slice(&r.encode(body.len()));
    out.extend_from_slice(&body);
    pad(out);
}

fn cmd(itt: u32, sn: u32, cdb: &[u8], edtl: u32, read: bool, data: &[u8], out: &mut Vec<u8>) {
    let mut c = [0u8; 16];
    c[..cdb.len()].copy_from_slice(cdb);
    let s = ScsiCommand {
        immediate: false,
        final_: true,
        read,
        write: !data.is_empty(),
        attr: TaskAttr::Simple,
        lun: Lun::from_index(0),
        itt: Itt(itt),
        edtl,
        cmd_sn: Sn(sn),
        exp_stat_sn: Sn(1),
        cdb: c,
    };
    out.extend_from_slice(&s.encode(data.len()));
    out.extend_from_slice(data);
    pad(out);
}

fn traffic(out: &mut Vec<u8>) {
    cmd(1, 10, &[0; 6], 0, false, &[], out);
    let mut w = vec![0x2a, 0, 0, 0, 0, 8, 0, 0, 2, 0];
    cmd(2, 11, &w, 1024, false, &[0xab; 1024], out);
    w[0] = 0x28;
    cmd(3, 12, &w, 1024, true, &[], out);
    cmd(4, 13, &[0x12, 0, 0, 0, 96, 0], 96, true, &[], out);
    // A write whose data comes unsolicited after the command.
    let mut c = [0u8; 16];
    c[..10].copy_from_slice(&[0x2a, 0, 0, 0, 0, 16, 0, 0, 4, 0]);
    let s = ScsiCommand {
        immediate: false,
        final_: false,
        read: false,
        write: true,
        attr: TaskAttr::Simple,
        lun: Lun::from_index(0),
        itt: Itt(5),
        edtl: 2048,
        cmd_sn: Sn(14),
        exp_stat_sn: Sn(1),
        cdb: c,
    };
    out.extend_from_slice(&s.encode(1024));
    out.extend_from_slice(&[1; 1024]);
    let d = DataOut {
        final_: true,
        lun: Lun::from_index(0),
        itt: Itt(5),
        ttt: RESERVED_TAG,
        exp_stat_sn: Sn(1),
        data_sn: 0,
        buffer_offset: 1024,
    };
    out.extend_from_slice(&d.encode(1024));
    out.extend_from_slice(&[2; 1024]);
    let t = TextReq {
        immediate: false,
        final_: true,
        cont: false,
        lun: Lun::default(),
        itt: Itt(6),
        ttt: RESERVED_TAG,
        cmd_sn: Sn(15),
        exp_stat_sn: Sn(1),
    };
    let body = b"SendTargets=All\0";
    out.extend_from_slice(&t.encode(body.len()));
    out.extend_from_slice(body);
    let n = NopOut {
        immediate: true,
        lun: Lun::default(),
        itt: Itt(7),
        ttt: RESERVED_TAG,
        cmd_sn: Sn(16),
        exp_stat_sn: Sn(1),
    };
    out.extend_from_slice(&n.encode(0));
    let m = TaskMgmtReq {
        immediate: true,
        function: TmfFunction::AbortTask,
        lun: Lun::from_index(0),
        itt: Itt(8),
        ref_task_tag: Itt(5),
        cmd_sn: Sn(16),
        exp_stat_sn: Sn(1),
        ref_cmd_sn: Sn(14),
        exp_data_sn: 0,
    };
    out.extend_from_slice(&m.encode());
    let l = LogoutReq {
        immediate: false,
        reason: LogoutReason::CloseSession,
        itt: Itt(9),
        cid: 0,
        cmd_sn: Sn(16),
        exp_stat_sn: Sn(1),
    };
    out.extend_from_slice(&l.encode());
}

const OPS: &[(&str, &str)] = &[
    ("HeaderDigest", "None"),
    ("DataDigest", "None"),
    ("ImmediateData", "Yes"),
    ("InitialR2T", "No"),
    ("FirstBurstLength", "65536"),
    ("MaxRecvDataSegmentLength", "65536"),
];

/// Login streams followed by traffic.
pub fn streams() -> Vec<(&'static str, Vec<u8>)> {
    let mut plain = Vec::new();
    let mut keys = vec![
        ("InitiatorName", "iqn.i"),
        ("TargetName", "iqn.t"),
        ("SessionType", "Normal"),
    ];
    keys.extend_from_slice(OPS);
    login(1, 3, true, &keys, &mut plain);
    traffic(&mut plain);

    let mut chap_s = Vec::new();
    login(
        0,
        1,
        false,
        &[
            ("InitiatorName", "iqn.i"),
            ("TargetName", "iqn.c"),
            ("AuthMethod", "CHAP,None"),
        ],
        &mut chap_s,
    );
    login(0, 1, false, &[("CHAP_A", "5")], &mut chap_s);
    let r = chap::response(
        7,
        &Secret::new(&b"initiator-secret"[..]),
        b"fuzz-challenge-0",
    );
    let r = chap::encode_hex(&r);
    login(
        0,
        1,
        true,
        &[
            ("CHAP_N", "user"),
            ("CHAP_R", &r),
            ("CHAP_I", "3"),
            ("CHAP_C", "0x00112233445566778899aabbccddeeff"),
        ],
        &mut chap_s,
    );
    login(1, 3, true, OPS, &mut chap_s);
    traffic(&mut chap_s);

    let mut disc = Vec::new();
    login(
        1,
        3,
        true,
        &[("InitiatorName", "iqn.i"), ("SessionType", "Discovery")],
        &mut disc,
    );
    traffic(&mut disc);
    vec![("plain", plain), ("chap", chap_s), ("discovery", disc)]
}

/// Seeds for every target.
pub fn all() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut v = Vec::new();
    for (name, s) in streams() {
        v.push(("login_session", name.to_string(), s.clone()));
        let mut p = vec![0u8];
        p.extend_from_slice(&s);
        v.push(("pdu", name.to_string(), p));
    }
    v.push((
        "text",
        "login".into(),
        text::encode(&[
            ("InitiatorName", "iqn.i"),
            ("CHAP_C", "0b3q2+7w=="),
            ("CHAP_I", "0x10"),
        ]),
    ));
    v.push(("text", "odd".into(), b"a=b\0=c\0noeq\0\0k=\xff\0".to_vec()));
    let cdbs: &[(&str, &[u8])] = &[
        ("read10", &[0x28, 0, 0, 0, 0, 1, 0, 0, 8, 0]),
        ("write10", &[0x2a, 0, 0, 0, 0, 1, 0, 0, 1, 0]),
        ("inquiry", &[0x12, 1, 0x83, 0, 255, 0]),
        ("modesense10", &[0x5a, 0, 0x3f, 0, 0, 0, 0, 0xff, 0xff, 0]),
        (
            "rsoc",
            &[0xa3, 0x0c, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
        ),
        ("unmap", &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0]),
        (
            "writesame16",
            &[0x93, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0],
        ),
        ("prout", &[0x5f, 0, 0, 0, 0, 0, 0, 0, 24, 0]),
        (
            "xcopy",
            &[0x83, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0],
        ),
    ];
    for (name, c) in cdbs {
        let mut v2 = vec![c.len() as u8 - 6];
        v2.extend_from_slice(c);
        v2.extend_from_slice(&[
            0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0, 0,
        ]);
        v2.resize(v2.len() + 512, 0x5a);
        v.push(("cdb", name.to_string(), v2));
    }
    v.extend(nvme_tcp_seeds());
    v.extend(nvme_controller_seeds());
    v
}

/// NVMe/TCP connections for [`crate::nvme_controller`]: an admin queue's
/// bring-up, and an I/O queue joining controller 1 with every NVM command,
/// with and without digests.
fn nvme_controller_seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    use nvme_tcp_wire::capsule::{ConnectData, Sgl};
    use nvme_tcp_wire::{DataHeader, Ic, Layout, PduType};
    fn sqe(op: u8, nsid: u32, dws: &[(usize, u32)], sgl: Sgl) -> [u8; 64] {
        let mut s = [0u8; 64];
        s[0] = op;
        s[1] = 0x40;
        s[4..8].copy_from_slice(&nsid.to_le_bytes());
        s[24..40].copy_from_slice(&sgl.encode());
        for &(n, x) in dws {
            s[n * 4..n * 4 + 4].copy_from_slice(&x.to_le_bytes());
        }
        s
    }
    fn capsule(l: &Layout, mut s: [u8; 64], cid: u16, data: &[u8]) -> Vec<u8> {
        s[2..4].copy_from_slice(&cid.to_le_bytes());
        let mut b = l.header(PduType::CapsuleCmd, 0, &s, data.len()).to_vec();
        b.extend_from_slice(data);
        if let Some(d) = l.data_digest_of(data) {
            b.extend_from_slice(&d);
        }
        b
    }
    fn connect(qid: u16, cntlid: u16) -> ([u8; 64], Vec<u8>) {
        let mut s = sqe(
            0x7f,
            0,
            &[],
            Sgl::InCapsule {
                offset: 0,
                length: 1024,
            },
        );
        s[4] = 0x01;
        s[42..44].copy_from_slice(&qid.to_le_bytes());
        s[44..46].copy_from_slice(&31u16.to_le_bytes());
        s[46] = 0x04;
        let d = ConnectData {
            host_id: [0; 16],
            cntlid,
            subnqn: crate::FUZZ_NQN.into(),
            hostnqn: crate::FUZZ_HOST.into(),
        };
        (s, d.encode().to_vec())
    }
    let none = Sgl::Transport { length: 0 };
    let page = Sgl::Transport { length: 4096 };
    let mut v = Vec::new();
    for digests in [false, true] {
        let l = Layout {
            header_digest: digests,
            data_digest: digests,
            alignment: 4,
        };
        let ic = Ic {
            header_digest: digests,
            data_digest: digests,
            ..Ic::default()
        }
        .encode(false);
        // The admin queue: Connect, CC.EN, Identify, logs, features, AER.
        let mut b = ic.to_vec();
        let (s, d) = connect(0, 0xffff);
        b.extend(capsule(&l, s, 1, &d));
        let mut cc = sqe(0x7f, 0, &[(11, 0x14), (12, 0x0046_0001)], none);
        cc[4] = 0x00;
        b.extend(capsule(&l, cc, 2, &[]));
        let mut get = sqe(0x7f, 0, &[(11, 0x1c)], none);
        get[4] = 0x04;
        b.extend(capsule(&l, get, 3, &[]));
        for (i, (nsid, cns)) in [(0, 1), (1, 0), (0, 2), (1, 3), (0, 6)]
            .into_iter()
            .enumerate()
        {
            b.extend(capsule(
                &l,
                sqe(0x06, nsid, &[(10, cns)], page),
                4 + i as u16,
                &[],
            ));
        }
        for (i, lid) in [0x01u32, 0x02, 0x03, 0x04, 0x05, 0x0c]
            .into_iter()
            .enumerate()
        {
            let d10 = lid | (1023 << 16);
            b.extend(capsule(
                &l,
                sqe(0x02, 0xffff_ffff, &[(10, d10)], page),
                10 + i as u16,
                &[],
            ));
        }
        b.extend(capsule(
            &l,
            sqe(0x09, 0, &[(10, 7), (11, 0x0003_0003)], none),
            20,
            &[],
        ));
        b.extend(capsule(
            &l,
            sqe(0x09, 0, &[(10, 0x0b), (11, 0x800)], none),
            21,
            &[],
        ));
        b.extend(capsule(&l, sqe(0x0a, 0, &[(10, 0x0f)], none), 22, &[]));
        b.extend(capsule(&l, sqe(0x0c, 0, &[], none), 23, &[]));
        b.extend(capsule(&l, sqe(0x18, 0, &[], none), 24, &[]));
        let name = if digests { "admin_digests" } else { "admin" };
        v.push(("nvme_controller", name.to_string(), b));
        // An I/O queue of controller 1: every NVM command.
        let mut b = ic.to_vec();
        let (s, d) = connect(1, 1);
        b.extend(capsule(&l, s, 1, &d));
        let rw = |op: u8, lba: u32, n: u32, sgl| sqe(op, 1, &[(10, lba), (12, n - 1)], sgl);
        let data = vec![0x5au8; 4096];
        let inc = Sgl::InCapsule {
            offset: 0,
            length: 4096,
        };
        b.extend(capsule(&l, rw(0x01, 0, 8, inc), 2, &data));
        b.extend(capsule(&l, rw(0x02, 0, 8, page), 3, &[]));
        b.extend(capsule(&l, rw(0x05, 0, 8, inc), 4, &data));
        // A write whose data comes after the R2T (tag 0).
        b.extend(capsule(&l, rw(0x01, 8, 8, page), 5, &[]));
        let h = DataHeader {
            cccid: 5,
            ttag: 0,
            offset: 0,
            length: 4096,
        };
        b.extend_from_slice(&l.h2c_data(&h, true));
        b.extend_from_slice(&data);
        if let Some(d) = l.data_digest_of(&data) {
            b.extend_from_slice(&d);
        }
        let mut range = vec![0u8; 16];
        range[4..8].copy_from_slice(&8u32.to_le_bytes());
        let dsm = Sgl::InCapsule {
            offset: 0,
            length: 16,
        };
        b.extend(capsule(
            &l,
            sqe(0x09, 1, &[(10, 0), (11, 4)], dsm),
            6,
            &range,
        ));
        b.extend(capsule(
            &l,
            sqe(0x08, 1, &[(10, 16), (12, 7 | 1 << 25)], none),
            7,
            &[],
        ));
        b.extend(capsule(&l, sqe(0x00, 0xffff_ffff, &[], none), 8, &[]));
        let name = if digests { "io_digests" } else { "io" };
        v.push(("nvme_controller", name.to_string(), b));
    }
    v
}

/// NVMe/TCP seeds: a connection's first PDUs and data PDUs, with and
/// without digests (the first byte is the target's flags, see
/// [`crate::nvme_tcp`]).
fn nvme_tcp_seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    use nvme_tcp_wire::{c2h_term_req, DataHeader, Fatal, Fes, Ic, Layout};
    let mut v = Vec::new();
    let mut ic = vec![0u8];
    ic.extend_from_slice(&Ic::default().encode(false));
    ic.extend_from_slice(
        &Ic {
            max: 131072,
            ..Ic::default()
        }
        .encode(true),
    );
    v.push(("nvme_tcp", "icreq_icresp".to_string(), ic));
    for (name, flags, hd, dd) in [("data", 0u8, false, false), ("data_digests", 3, true, true)] {
        let l = Layout {
            header_digest: hd,
            data_digest: dd,
            alignment: 4,
        };
        let data = vec![0xa5u8; 512];
        let h = DataHeader {
            cccid: 1,
            ttag: 2,
            offset: 0,
            length: data.len() as u32,
        };
        let mut b = vec![flags];
        b.extend_from_slice(&l.r2t(&h));
        b.extend_from_slice(&l.c2h_data(&h, true, true));
        b.extend_from_slice(&data);
        if let Some(d) = l.data_digest_of(&data) {
            b.extend_from_slice(&d);
        }
        b.extend_from_slice(&l.capsule_resp(&[0; 16]));
        v.push(("nvme_tcp", name.to_string(), b));
    }
    let mut t = vec![0u8];
    t.extend_from_slice(&c2h_term_req(
        Fatal {
            fes: Fes::InvalidHeaderField,
            fei: 2,
        },
        &[0x04; 72],
    ));
    v.push(("nvme_tcp", "term_req".to_string(), t));
    v
}
