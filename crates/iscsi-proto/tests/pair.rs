//! The in-memory pair harness: the initiator and target state machines
//! talk to each other through real PDU bytes (framing, digests) with no
//! sockets, over a toy disk. A property test drives random reads and writes
//! under random negotiation outcomes and checks every byte.

use std::cell::RefCell;

use bytes::{Bytes, BytesMut};
use iscsi_proto::initiator::{
    DataDir, InitiatorEvent, InitiatorLogin, InitiatorSession, LoginConfig, LoginProgress,
};
use iscsi_proto::login::{LoginStep, TargetDirectory, TargetInfo, TargetLogin};
use iscsi_proto::params::{DigestPolicy, Limits};
use iscsi_proto::session::{Completion, Event, Host, Session, TmfAction};
use iscsi_wire::frame::{frame_len, split_pdu, FrameLimits};
use iscsi_wire::pdu::*;
use iscsi_wire::{Outbox, Sn};
use proptest::prelude::*;

const BS: usize = 512;

struct Disk(RefCell<Vec<u8>>);

impl TargetDirectory for Disk {
    fn find(&self, name: &str, _i: &str) -> Option<TargetInfo> {
        (name == "iqn.t").then(|| TargetInfo {
            name: name.into(),
            alias: None,
            tpgt: 1,
        })
    }
}

impl Host for Disk {
    fn send_targets(&self, _i: &str, _v: &str, _s: Option<&str>) -> Vec<u8> {
        b"TargetName=iqn.t\0".to_vec()
    }
    fn lun_exists(&self, lun: Lun) -> bool {
        lun.index() == Some(0)
    }
    fn data_out_len(&self, _lun: Lun, cdb: &[u8]) -> u32 {
        if cdb[0] == 0x2a {
            u32::from(u16::from_be_bytes([cdb[7], cdb[8]])) * BS as u32
        } else {
            0
        }
    }
    fn reset(&self, _a: TmfAction) {}
}

impl Disk {
    fn execute(&self, r: &iscsi_proto::ExecRequest) -> Completion {
        let c = r.cdb.as_slice();
        let lba = u32::from_be_bytes([c[2], c[3], c[4], c[5]]) as usize * BS;
        let len = usize::from(u16::from_be_bytes([c[7], c[8]])) * BS;
        match c[0] {
            0x28 => {
                // Served as segments of at most 3 blocks, as a RAM LUN serves
                // a large read from several chunks without copying.
                let disk = self.0.borrow();
                let mut data_in = bufpool::Chain::new();
                for piece in disk[lba..lba + len].chunks(3 * BS) {
                    data_in.push(Bytes::copy_from_slice(piece));
                }
                Completion {
                    data_in,
                    ..Default::default()
                }
            }
            0x2a => {
                self.0.borrow_mut()[lba..lba + r.data_out.len()]
                    .copy_from_slice(&r.data_out.to_vec());
                Completion {
                    data_out_wanted: len as u32,
                    ..Default::default()
                }
            }
            _ => Completion::default(),
        }
    }
}

fn frames(out: &mut Outbox, lim: &FrameLimits) -> Vec<iscsi_wire::RawPdu> {
    let mut buf = BytesMut::from(&out.to_vec()[..]);
    out.advance(out.len());
    let mut v = Vec::new();
    while let Some(n) = frame_len(&buf, lim).unwrap() {
        v.push(split_pdu(&mut buf, n, lim).unwrap());
    }
    assert!(buf.is_empty(), "partial PDU left");
    v
}

struct Pair {
    disk: Disk,
    ini: InitiatorSession,
    tgt: Session,
    ini_lim: FrameLimits,
    tgt_lim: FrameLimits,
    /// Hand large Data-In segments to the initiator as a connection that
    /// receives them into the read's buffer does
    /// ([`InitiatorSession::landing`]).
    land: bool,
}

fn connect(cfg: LoginConfig, limits: Limits) -> Pair {
    let disk = Disk(RefCell::new(vec![0u8; 1 << 20]));
    let mut il = InitiatorLogin::new(cfg, Sn(5000), Itt(1));
    let mut tl = TargetLogin::new(limits.clone(), 1);
    let (mut req, mut text) = il.start();
    loop {
        let step = tl.handle(&req, &text, &disk);
        let (resp, rtext, done) = match step {
            LoginStep::Continue { resp, text } => (resp, text, None),
            LoginStep::Complete {
                mut resp,
                text,
                outcome,
            } => {
                resp.tsih = 9;
                (resp, text, Some(outcome))
            }
            LoginStep::Fail { reason, .. } => panic!("login failed: {reason}"),
        };
        match il.handle(&resp, &rtext).unwrap() {
            LoginProgress::Send(r, t) => {
                req = r;
                text = t;
            }
            LoginProgress::Done(n) => {
                let o = done.expect("target completed too");
                assert_eq!(n.params.header_digest, o.params.header_digest);
                assert_eq!(
                    n.params.send_max_data_segment,
                    o.params.recv_max_data_segment
                );
                assert_eq!(
                    n.params.recv_max_data_segment,
                    o.params.send_max_data_segment
                );
                assert_eq!(n.params.immediate_data, o.params.immediate_data);
                assert_eq!(n.params.initial_r2t, o.params.initial_r2t);
                assert_eq!(n.params.first_burst, o.params.first_burst);
                let ini_lim = FrameLimits {
                    header_digest: n.params.header_digest,
                    data_digest: n.params.data_digest,
                    max_data_segment: n.params.recv_max_data_segment,
                };
                let tgt_lim = FrameLimits {
                    max_data_segment: o.params.recv_max_data_segment,
                    ..ini_lim
                };
                let ini =
                    InitiatorSession::new(n.params.clone(), n.cmd_sn, n.exp_stat_sn, n.max_cmd_sn);
                let tgt = Session::new(o.params.clone(), limits, o.exp_cmd_sn, o.next_stat_sn);
                return Pair {
                    disk,
                    ini,
                    tgt,
                    ini_lim,
                    tgt_lim,
                    land: false,
                };
            }
        }
    }
}

impl Pair {
    /// Moves PDUs both ways until nothing is left; returns the initiator's events.
    fn pump(&mut self, ini_out: &mut Outbox) -> Vec<InitiatorEvent> {
        let mut events = Vec::new();
        let mut tgt_out = Outbox::new();
        loop {
            let mut moved = false;
            for raw in frames(ini_out, &self.tgt_lim) {
                moved = true;
                let mut ev = Vec::new();
                self.tgt.handle_pdu(raw, &self.disk, &mut tgt_out, &mut ev);
                for e in ev {
                    match e {
                        Event::Execute(r) => {
                            let c = self.disk.execute(&r);
                            self.tgt.complete(r.itt, c, &mut tgt_out);
                        }
                        Event::Logout | Event::Close(_) | Event::TaskManagement { .. } => {}
                    }
                }
            }
            for mut raw in frames(&mut tgt_out, &self.ini_lim) {
                moved = true;
                if self.land {
                    if let Some(mut buf) = self.ini.landing(&raw.bhs) {
                        buf.extend_from_slice(&raw.data);
                        raw.data = Bytes::new();
                        raw.landed = Some(buf.into());
                    }
                }
                self.ini.handle_pdu(raw, ini_out, &mut events);
            }
            if !moved {
                return events;
            }
        }
    }
}

fn rw(op: u8, lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = op;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

#[test]
fn login_discovery_and_logout() {
    let mut p = connect(
        LoginConfig::new("iqn.i", Some("iqn.t"), [0x80, 0, 0, 0, 0, 1]),
        Limits::default(),
    );
    let mut out = Outbox::new();
    let itt = p.ini.text(b"SendTargets=All\0", &mut out);
    let ev = p.pump(&mut out);
    assert_eq!(
        ev,
        vec![InitiatorEvent::Text(
            itt,
            Bytes::from_static(b"TargetName=iqn.t\0")
        )]
    );
    p.ini.ping(&mut out);
    assert!(p.pump(&mut out).is_empty());
    p.ini.logout(&mut out);
    assert_eq!(
        p.pump(&mut out),
        vec![InitiatorEvent::LoggedOut(LogoutResponse::Closed)]
    );
}

#[test]
fn window_limits_the_initiator() {
    let limits = Limits {
        queue_depth: 4,
        ..Limits::default()
    };
    let mut p = connect(
        LoginConfig::new("iqn.i", Some("iqn.t"), [0x80, 0, 0, 0, 0, 2]),
        limits,
    );
    assert_eq!(p.ini.window(), 4);
    let mut out = Outbox::new();
    for _ in 0..4 {
        assert!(p.ini.can_submit());
        p.ini.submit(
            Lun::default(),
            &rw(0x28, 0, 1),
            DataDir::Read(512),
            &mut out,
        );
    }
    assert!(!p.ini.can_submit(), "window of 4 is full");
    assert_eq!(p.pump(&mut out).len(), 4);
    assert!(p.ini.can_submit());
}

#[test]
fn landing_is_offered_only_at_the_offset_a_read_expects() {
    let mut cfg = LoginConfig::new("iqn.i", Some("iqn.t"), [0x80, 0, 0, 0, 0, 4]);
    cfg.max_recv_data_segment = 65536;
    let limits = Limits {
        max_recv_data_segment: 65536,
        ..Limits::default()
    };
    let mut p = connect(cfg, limits);
    let want: Vec<u8> = (0..256 * 1024).map(|i| (i * 13 / 5) as u8).collect();
    p.disk.0.borrow_mut()[..want.len()].copy_from_slice(&want);
    let mut out = Outbox::new();
    p.ini.submit(
        Lun::default(),
        &rw(0x28, 0, 512),
        DataDir::Read(want.len() as u32),
        &mut out,
    );
    let mut tgt_out = Outbox::new();
    for raw in frames(&mut out, &p.tgt_lim) {
        let mut ev = Vec::new();
        p.tgt.handle_pdu(raw, &p.disk, &mut tgt_out, &mut ev);
        for e in ev {
            if let Event::Execute(r) = e {
                let c = p.disk.execute(&r);
                p.tgt.complete(r.itt, c, &mut tgt_out);
            }
        }
    }
    let pdus = frames(&mut tgt_out, &p.ini_lim);
    assert_eq!(pdus.len(), 4, "four 64 KiB Data-In");
    let mut events = Vec::new();
    for (i, mut raw) in pdus.into_iter().enumerate() {
        // Another offset than the next one expected: not offered.
        let mut moved = raw.bhs;
        moved[40..44].copy_from_slice(&(i as u32 * 65536 + 512).to_be_bytes());
        assert!(p.ini.landing(&moved).is_none());
        let mut buf = p.ini.landing(&raw.bhs).expect("offered at its offset");
        assert_eq!(buf.len(), i * 65536, "the segments so far, in place");
        assert!(buf.capacity() >= want.len());
        buf.extend_from_slice(&raw.data);
        raw.data = Bytes::new();
        raw.landed = Some(buf.into());
        p.ini.handle_pdu(raw, &mut out, &mut events);
    }
    let [InitiatorEvent::Done(_, r)] = &events[..] else {
        panic!("{events:?}")
    };
    assert_eq!(r.status, Some(0));
    assert!(r.data[..] == want[..]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn data_round_trips_under_any_negotiation(
        imm: bool, r2t: bool, hd: bool, dd: bool, land: bool,
        seg in prop::sample::select(vec![512u32, 1024, 4096, 8192, 65536, 65536 + 512]),
        burst in prop::sample::select(vec![512u32, 4096, 65536, 262144]),
        first in prop::sample::select(vec![512u32, 8192, 65536]),
        outstanding in 1u16..4,
        ops in prop::collection::vec((0u32..1500, 1u16..400, any::<u8>()), 1..8),
    ) {
        let mut cfg = LoginConfig::new("iqn.i", Some("iqn.t"), [0x80, 0, 0, 0, 0, 3]);
        cfg.immediate_data = imm;
        cfg.initial_r2t = r2t;
        cfg.header_digest = hd;
        cfg.data_digest = dd;
        cfg.max_recv_data_segment = seg;
        cfg.max_burst = burst;
        cfg.first_burst = first;
        cfg.max_outstanding_r2t = outstanding;
        let limits = Limits {
            max_recv_data_segment: seg.max(1024),
            header_digest: DigestPolicy::Allowed,
            data_digest: DigestPolicy::Allowed,
            ..Limits::default()
        };
        let mut p = connect(cfg, limits);
        p.land = land;
        let mut model = vec![0u8; 1 << 20];
        let mut out = Outbox::new();
        for (lba, blocks, fill) in ops {
            let lba = lba.min(2048 - u32::from(blocks));
            let data: Vec<u8> = (0..usize::from(blocks) * BS).map(|i| fill.wrapping_add((i / 7) as u8)).collect();
            p.ini.submit(Lun::default(), &rw(0x2a, lba, blocks), DataDir::Write(Bytes::from(data.clone())), &mut out);
            let ev = p.pump(&mut out);
            prop_assert!(matches!(&ev[..], [InitiatorEvent::Done(_, r)] if r.status == Some(0)), "{:?}", ev);
            let at = lba as usize * BS;
            model[at..at + data.len()].copy_from_slice(&data);
            p.ini.submit(Lun::default(), &rw(0x28, lba, blocks), DataDir::Read(data.len() as u32), &mut out);
            let ev = p.pump(&mut out);
            let [InitiatorEvent::Done(_, r)] = &ev[..] else { panic!("{ev:?}") };
            prop_assert_eq!(&r.data[..], &model[at..at + data.len()]);
        }
        prop_assert_eq!(&p.disk.0.borrow()[..], &model[..]);
    }
}
