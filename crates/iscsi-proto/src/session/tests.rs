use super::*;
use iscsi_wire::frame::{frame_len, split_pdu, FrameLimits};

struct TestHost;
impl Host for TestHost {
    fn send_targets(&self, _i: &str, _v: &str, _s: Option<&str>) -> Vec<u8> {
        text::encode(&[("TargetName", "iqn.t")])
    }
    fn lun_exists(&self, lun: Lun) -> bool {
        lun.index() == Some(0)
    }
    fn data_out_len(&self, _lun: Lun, cdb: &[u8]) -> u32 {
        // WRITE(10): transfer length in blocks of 512.
        if cdb[0] == 0x2a {
            u32::from(u16::from_be_bytes([cdb[7], cdb[8]])) * 512
        } else {
            0
        }
    }
    fn reset(&self, _a: TmfAction) {}
}

fn params(initial_r2t: bool) -> SessionParams {
    let mut p = SessionParams::rfc_defaults();
    p.initiator_name = "iqn.i".into();
    p.target_name = "iqn.t".into();
    p.initial_r2t = initial_r2t;
    p.send_max_data_segment = 8192;
    p.recv_max_data_segment = 262_144;
    p
}

fn session(initial_r2t: bool) -> Session {
    let l = Limits {
        queue_depth: 4,
        ..Limits::default()
    };
    Session::new(params(initial_r2t), l, Sn(10), Sn(100))
}

fn cmd(itt: u32, sn: u32, cdb0: u8, len_blocks: u16, edtl: u32, data: &[u8]) -> RawPdu {
    let mut cdb = [0u8; 16];
    cdb[0] = cdb0;
    cdb[7..9].copy_from_slice(&len_blocks.to_be_bytes());
    let write = cdb0 == 0x2a;
    let c = ScsiCommand {
        immediate: false,
        final_: true,
        read: !write,
        write,
        attr: TaskAttr::Simple,
        lun: Lun::from_index(0),
        itt: Itt(itt),
        edtl,
        cmd_sn: Sn(sn),
        exp_stat_sn: Sn(0),
        cdb,
    };
    raw(c.encode(data.len()), data)
}

fn raw(bhs: Bhs, data: &[u8]) -> RawPdu {
    RawPdu {
        bhs,
        ahs: Bytes::new(),
        data: Bytes::copy_from_slice(data),
        data_digest_ok: true,
        landed: None,
    }
}

fn sent(out: &mut Outbox) -> Vec<(Pdu, Bytes)> {
    let mut buf = BytesMut::from(&out.to_vec()[..]);
    out.advance(out.len());
    let lim = FrameLimits {
        header_digest: false,
        data_digest: false,
        max_data_segment: 1 << 24,
    };
    let mut v = Vec::new();
    while let Ok(Some(n)) = frame_len(&buf, &lim) {
        let r = split_pdu(&mut buf, n, &lim).unwrap();
        v.push((Pdu::parse(&r.bhs), r.data));
    }
    assert!(buf.is_empty());
    v
}

fn run(s: &mut Session, p: RawPdu, out: &mut Outbox) -> Vec<Event> {
    let mut ev = Vec::new();
    s.handle_pdu(p, &TestHost, out, &mut ev);
    ev
}

#[test]
fn read_returns_data_with_status_in_last_data_in() {
    let mut s = session(false);
    let mut out = Outbox::new();
    let ev = run(&mut s, cmd(1, 10, 0x28, 4, 2048 * 5, &[]), &mut out);
    let [Event::Execute(req)] = &ev[..] else {
        panic!("{ev:?}")
    };
    assert_eq!(s.in_flight(), 1);
    let data = Bytes::from(vec![9u8; 2048 * 5]);
    s.complete(
        req.itt,
        Completion {
            data_in: data.into(),
            ..Default::default()
        },
        &mut out,
    );
    let pdus = sent(&mut out);
    assert_eq!(pdus.len(), 2, "10 KiB in 8 KiB segments");
    let Pdu::DataIn(first) = pdus[0].0 else {
        panic!()
    };
    assert!(first.status.is_none() && !first.final_);
    let Pdu::DataIn(last) = pdus[1].0 else {
        panic!()
    };
    assert_eq!(last.status, Some(0));
    assert_eq!(last.data_sn, 1);
    assert_eq!(last.buffer_offset, 8192);
    assert_eq!(last.sn.stat_sn, Sn(100));
    assert_eq!(last.sn.exp_cmd_sn, Sn(11));
    assert_eq!(last.sn.max_cmd_sn, Sn(14), "window of 4 reopened");
    assert_eq!(s.in_flight(), 0);
}

#[test]
fn read_residuals() {
    let mut s = session(false);
    let mut out = Outbox::new();
    for (sn, edtl, sent_len, over, count) in [
        (10, 200u32, 200usize, true, 312u32),
        (11, 0, 0, true, 512),
        (12, 10000, 512, false, 9488),
    ] {
        let ev = run(&mut s, cmd(sn, sn, 0x28, 1, edtl, &[]), &mut out);
        let [Event::Execute(req)] = &ev[..] else {
            panic!()
        };
        s.complete(
            req.itt,
            Completion {
                data_in: Bytes::from(vec![1u8; 512]).into(),
                ..Default::default()
            },
            &mut out,
        );
        let pdus = sent(&mut out);
        let total: usize = pdus.iter().map(|(_, d)| d.len()).sum();
        assert_eq!(total, sent_len);
        let residual = match pdus.last().unwrap().0 {
            Pdu::DataIn(d) => d.residual,
            Pdu::ScsiResponse(r) => r.residual,
            ref p => panic!("{p:?}"),
        };
        assert_eq!(
            (residual.overflow, residual.underflow, residual.count),
            (over, !over, count)
        );
    }
}

#[test]
fn cmdsn_window_drops_and_holds() {
    let mut s = session(false);
    let mut out = Outbox::new();
    // Too low and too high are ignored; ExpCmdSN stays.
    assert!(run(&mut s, cmd(1, 9, 0x00, 0, 0, &[]), &mut out).is_empty());
    assert!(run(&mut s, cmd(2, 14, 0x00, 0, 0, &[]), &mut out).is_empty());
    // Ahead but in the window: held until the gap fills.
    assert!(run(&mut s, cmd(3, 11, 0x00, 0, 0, &[]), &mut out).is_empty());
    let ev = run(&mut s, cmd(4, 10, 0x00, 0, 0, &[]), &mut out);
    let itts: Vec<u32> = ev
        .iter()
        .map(|e| match e {
            Event::Execute(r) => r.itt.0,
            _ => 0,
        })
        .collect();
    assert_eq!(itts, vec![4, 3]);
    assert!(sent(&mut out).is_empty());
    // Window: 4 slots, 2 in flight.
    s.complete(Itt(4), Completion::default(), &mut out);
    let pdus = sent(&mut out);
    let Pdu::ScsiResponse(r) = pdus[0].0 else {
        panic!()
    };
    assert_eq!(r.sn.exp_cmd_sn, Sn(12));
    assert_eq!(r.sn.max_cmd_sn, Sn(14));
}

#[test]
fn write_solicited_by_r2t_with_datasn_checked() {
    let mut s = session(true);
    let mut out = Outbox::new();
    assert!(run(&mut s, cmd(7, 10, 0x2a, 2, 1024, &[]), &mut out).is_empty());
    let pdus = sent(&mut out);
    let Pdu::R2t(r2t) = pdus[0].0 else {
        panic!("{pdus:?}")
    };
    assert_eq!((r2t.buffer_offset, r2t.desired_len), (0, 1024));
    let d = |sn: u32, off: u32, f: bool| DataOut {
        final_: f,
        lun: Lun::from_index(0),
        itt: Itt(7),
        ttt: r2t.ttt,
        exp_stat_sn: Sn(0),
        data_sn: sn,
        buffer_offset: off,
    };
    assert!(run(&mut s, raw(d(0, 0, false).encode(512), &[1; 512]), &mut out).is_empty());
    let ev = run(
        &mut s,
        raw(d(1, 512, true).encode(512), &[2; 512]),
        &mut out,
    );
    let [Event::Execute(req)] = &ev[..] else {
        panic!()
    };
    assert_eq!(req.data_out.len(), 1024);
    assert_eq!(req.data_out.to_vec()[600], 2);

    // A wrong DataSN fails the command: Reject, then CHECK CONDITION.
    assert!(run(&mut s, cmd(8, 11, 0x2a, 1, 512, &[]), &mut out).is_empty());
    let Pdu::R2t(r2t) = sent(&mut out)[0].0 else {
        panic!()
    };
    let mut bad = d(27, 0, true);
    bad.itt = Itt(8);
    bad.ttt = r2t.ttt;
    assert!(run(&mut s, raw(bad.encode(512), &[0; 512]), &mut out).is_empty());
    let pdus = sent(&mut out);
    assert!(matches!(pdus[0].0, Pdu::Reject(r) if r.reason == RejectReason::ProtocolError));
    assert_eq!(&pdus[0].1[16..20], &8u32.to_be_bytes());
    assert!(matches!(pdus[1].0, Pdu::ScsiResponse(r) if r.status == 2));
    // Late data for the failed task is dropped silently.
    assert!(run(&mut s, raw(bad.encode(512), &[0; 512]), &mut out).is_empty());
    assert!(sent(&mut out).is_empty());
}

#[test]
fn immediate_and_unsolicited_data() {
    let mut s = session(false);
    let mut out = Outbox::new();
    // Whole write as immediate data: executed at once, no copy needed.
    let ev = run(&mut s, cmd(1, 10, 0x2a, 8, 4096, &[5; 4096]), &mut out);
    assert!(matches!(&ev[..], [Event::Execute(r)] if r.data_out.len() == 4096));
    // More immediate data than the CDB wants: only what it wants is used.
    let ev = run(&mut s, cmd(2, 11, 0x2a, 1, 10000, &[6; 10000]), &mut out);
    assert!(matches!(&ev[..], [Event::Execute(r)] if r.data_out.len() == 512));
    // Immediate data when the command has no data-out is a protocol error.
    run(&mut s, cmd(3, 12, 0x28, 1, 512, &[1; 16]), &mut out);
    assert!(matches!(sent(&mut out)[..], [(Pdu::Reject(_), _)]));
}

#[test]
fn task_management() {
    let mut s = session(true);
    let mut out = Outbox::new();
    let tmf = |f: TmfFunction, rtt: u32, lun: u16| TaskMgmtReq {
        immediate: true,
        function: f,
        lun: Lun::from_index(lun),
        itt: Itt(900),
        ref_task_tag: Itt(rtt),
        cmd_sn: Sn(11),
        exp_stat_sn: Sn(0),
        ref_cmd_sn: Sn(10),
        exp_data_sn: 0,
    };
    let resp = |out: &mut Outbox| match sent(out)[..] {
        [(Pdu::TaskMgmtResp(r), _)] => u8::from(r.response),
        ref p => panic!("{p:?}"),
    };
    // A completed task does not exist any more.
    run(
        &mut s,
        raw(tmf(TmfFunction::AbortTask, 1, 0).encode(), &[]),
        &mut out,
    );
    assert_eq!(resp(&mut out), 1);
    // A write waiting for data is aborted and never answered.
    run(&mut s, cmd(5, 10, 0x2a, 1, 512, &[]), &mut out);
    sent(&mut out);
    run(
        &mut s,
        raw(tmf(TmfFunction::AbortTask, 5, 0).encode(), &[]),
        &mut out,
    );
    assert_eq!(resp(&mut out), 0);
    assert_eq!(s.in_flight(), 0);
    s.complete(Itt(5), Completion::default(), &mut out);
    assert!(sent(&mut out).is_empty());
    run(
        &mut s,
        raw(
            tmf(TmfFunction::LogicalUnitReset, RESERVED_TAG, 3).encode(),
            &[],
        ),
        &mut out,
    );
    assert_eq!(resp(&mut out), 2);
    run(
        &mut s,
        raw(
            tmf(TmfFunction::LogicalUnitReset, RESERVED_TAG, 0).encode(),
            &[],
        ),
        &mut out,
    );
    assert_eq!(resp(&mut out), 0);
    run(
        &mut s,
        raw(tmf(TmfFunction::TaskReassign, 1, 0).encode(), &[]),
        &mut out,
    );
    assert_eq!(resp(&mut out), 4);
}

/// A command the driver is executing when ABORT TASK, ABORT TASK SET or
/// LOGICAL UNIT RESET names it is terminated only when the driver is done
/// with it: the response waits, so an aborted write cannot reach the
/// medium after the initiator was told it is gone (SAM-5 §7.2).
#[test]
fn task_management_waits_for_commands_in_the_driver() {
    let mut s = session(true);
    let mut out = Outbox::new();
    let tmf = |f: TmfFunction, itt: u32, rtt: u32, sn: u32| TaskMgmtReq {
        immediate: true,
        function: f,
        lun: Lun::from_index(0),
        itt: Itt(itt),
        ref_task_tag: Itt(rtt),
        cmd_sn: Sn(sn),
        exp_stat_sn: Sn(0),
        ref_cmd_sn: Sn(10),
        exp_data_sn: 0,
    };
    let tmf_resps = |out: &mut Outbox| -> Vec<(u32, u8)> {
        sent(out)
            .iter()
            .filter_map(|(p, _)| match p {
                Pdu::TaskMgmtResp(r) => Some((r.itt.0, u8::from(r.response))),
                _ => None,
            })
            .collect()
    };
    // Two reads handed to the driver.
    let ev = run(&mut s, cmd(5, 10, 0x28, 1, 512, &[]), &mut out);
    assert!(matches!(ev[..], [Event::Execute(_)]));
    let ev = run(&mut s, cmd(6, 11, 0x28, 1, 512, &[]), &mut out);
    assert!(matches!(ev[..], [Event::Execute(_)]));
    sent(&mut out);
    // ABORT TASK of the first: no response while it runs, and again for a
    // second request naming it.
    run(
        &mut s,
        raw(tmf(TmfFunction::AbortTask, 900, 5, 12).encode(), &[]),
        &mut out,
    );
    assert!(
        tmf_resps(&mut out).is_empty(),
        "answered while the command runs"
    );
    run(
        &mut s,
        raw(tmf(TmfFunction::AbortTask, 901, 5, 12).encode(), &[]),
        &mut out,
    );
    assert!(tmf_resps(&mut out).is_empty());
    assert_eq!(s.pending_task_management(), 2);
    assert_eq!(s.in_flight(), 2, "the aborted command keeps its slot");
    s.complete(Itt(5), Completion::default(), &mut out);
    assert_eq!(
        tmf_resps(&mut out),
        vec![(900, 0), (901, 0)],
        "no status, both answered"
    );
    assert_eq!(s.in_flight(), 1);
    // LOGICAL UNIT RESET waits for the other one.
    run(
        &mut s,
        raw(
            tmf(TmfFunction::LogicalUnitReset, 902, RESERVED_TAG, 12).encode(),
            &[],
        ),
        &mut out,
    );
    assert!(tmf_resps(&mut out).is_empty());
    s.complete(Itt(6), Completion::default(), &mut out);
    let after = sent(&mut out);
    assert!(
        matches!(after[..], [(Pdu::TaskMgmtResp(r), _)] if r.itt.0 == 902 && r.response == TmfResponse::Complete),
        "only the reset's response, no status for the aborted read: {after:?}"
    );
    assert_eq!((s.in_flight(), s.pending_task_management()), (0, 0));
}

#[test]
fn nop_text_logout() {
    let mut s = session(false);
    let mut out = Outbox::new();
    let nop = NopOut {
        immediate: true,
        lun: Lun::default(),
        itt: Itt(3),
        ttt: RESERVED_TAG,
        cmd_sn: Sn(10),
        exp_stat_sn: Sn(0),
    };
    run(&mut s, raw(nop.encode(4), b"ping"), &mut out);
    let pdus = sent(&mut out);
    assert!(matches!(pdus[0].0, Pdu::NopIn(n) if n.itt == Itt(3) && n.sn.stat_sn == Sn(100)));
    assert_eq!(&pdus[0].1[..], b"ping");
    s.ping(&mut out);
    assert!(s.ping_outstanding());
    let Pdu::NopIn(p) = sent(&mut out)[0].0 else {
        panic!()
    };
    assert_eq!(p.sn.stat_sn, Sn(101), "a ping does not advance StatSN");
    let answer = NopOut {
        immediate: true,
        lun: Lun::default(),
        itt: Itt(RESERVED_TAG),
        ttt: p.ttt,
        cmd_sn: Sn(10),
        exp_stat_sn: Sn(101),
    };
    run(&mut s, raw(answer.encode(0), &[]), &mut out);
    assert!(!s.ping_outstanding());
    assert!(sent(&mut out).is_empty());
    let t = TextReq {
        immediate: true,
        final_: true,
        cont: false,
        lun: Lun::default(),
        itt: Itt(4),
        ttt: RESERVED_TAG,
        cmd_sn: Sn(10),
        exp_stat_sn: Sn(0),
    };
    run(&mut s, raw(t.encode(16), b"SendTargets=All\0"), &mut out);
    let pdus = sent(&mut out);
    assert!(matches!(pdus[0].0, Pdu::TextResp(r) if r.final_));
    assert_eq!(&pdus[0].1[..], b"TargetName=iqn.t\0");
    let l = LogoutReq {
        immediate: true,
        reason: LogoutReason::CloseSession,
        itt: Itt(5),
        cid: 0,
        cmd_sn: Sn(10),
        exp_stat_sn: Sn(0),
    };
    let ev = run(&mut s, raw(l.encode(), &[]), &mut out);
    assert!(matches!(ev[..], [Event::Logout]));
    assert!(
        matches!(sent(&mut out)[0].0, Pdu::LogoutResp(r) if r.response == LogoutResponse::Closed)
    );
}

#[test]
fn unknown_and_misplaced_pdus_are_rejected() {
    let mut s = session(false);
    let mut out = Outbox::new();
    let mut b = [0u8; 48];
    b[0] = 0x1c;
    run(&mut s, raw(b, &[]), &mut out);
    assert!(
        matches!(sent(&mut out)[0].0, Pdu::Reject(r) if r.reason == RejectReason::CommandNotSupported)
    );
    let mut p = params(false);
    p.session_type = SessionType::Discovery;
    let mut d = Session::new(p, Limits::default(), Sn(10), Sn(1));
    let mut ev = Vec::new();
    d.handle_pdu(cmd(1, 10, 0x00, 0, 0, &[]), &TestHost, &mut out, &mut ev);
    assert!(ev.is_empty());
    assert!(
        matches!(sent(&mut out)[0].0, Pdu::Reject(r) if r.reason == RejectReason::ProtocolError)
    );
}

#[test]
fn abort_lun_tasks_drops_them_silently() {
    // PREEMPT AND ABORT from another session (SPC-4 §5.9.11.5).
    let mut s = session(true);
    let mut out = Outbox::new();
    // A write waiting for its data and a read handed to the driver.
    run(&mut s, cmd(5, 10, 0x2a, 1, 512, &[]), &mut out);
    let ev = run(&mut s, cmd(6, 11, 0x28, 1, 512, &[]), &mut out);
    assert!(matches!(ev[..], [Event::Execute(_)]));
    sent(&mut out);
    assert_eq!(s.abort_lun_tasks(Lun::from_index(1)), 0, "other LUN");
    assert_eq!(s.abort_lun_tasks(Lun::from_index(0)), 2);
    // The read the driver executes holds its window slot until it ends.
    assert_eq!(s.in_flight(), 1);
    s.complete(Itt(6), Completion::default(), &mut out);
    assert!(sent(&mut out).is_empty(), "no status for aborted tasks");
    assert_eq!(s.in_flight(), 0);
}

#[test]
fn large_data_out_segments_are_held_small_ones_gathered() {
    use super::{Gather, HOLD_MIN};
    let mut g = Gather::new(HOLD_MIN + 300);
    let big = Bytes::from(vec![1u8; HOLD_MIN]);
    g.push(Bytes::from(vec![2u8; 100]));
    g.push(Bytes::from(vec![3u8; 100]));
    g.push(big.clone());
    g.push(Bytes::from(vec![4u8; 100]));
    assert_eq!(g.len(), HOLD_MIN + 300);
    let c = g.finish().expect("a chain");
    assert_eq!(c.segment_count(), 3, "small, held, small");
    let segs: Vec<_> = c.segments().collect();
    assert_eq!(segs[1].as_ptr(), big.as_ptr(), "not copied");
    let v = c.to_vec();
    assert_eq!((v[0], v[150], v[200], v[HOLD_MIN + 250]), (2, 3, 1, 4));
}

/// Receives `data` onto the end of `buf` as the driver does for a landed
/// segment and hands the PDU in.
fn landed(bhs: Bhs, mut buf: LandBuf, data: &[u8]) -> RawPdu {
    buf.put_slice(data);
    RawPdu {
        bhs,
        ahs: Bytes::new(),
        data: Bytes::new(),
        data_digest_ok: true,
        landed: Some(buf),
    }
}

#[test]
fn large_segments_land_in_the_commands_buffer() {
    const SEG: usize = 256 * 1024;
    let mut p = params(false);
    p.first_burst = SEG as u32;
    p.max_burst = 1 << 20;
    let mut s = Session::new(p, Limits::default(), Sn(10), Sn(100));
    let mut out = Outbox::new();
    // 1 MiB WRITE(10) (2048 blocks) with 256 KiB of immediate data.
    let c = cmd(1, 10, 0x2a, 2048, 1 << 20, &[1; SEG]);
    let buf = s.landing(&c.bhs, &TestHost).expect("immediate data lands");
    assert!(buf.is_empty() && buf.spare() >= 1 << 20);
    let base = buf.user_bytes().expect("a pooled buffer").as_ptr();
    assert!(run(&mut s, landed(c.bhs, buf, &[1; SEG]), &mut out).is_empty());
    let Pdu::R2t(r2t) = sent(&mut out)[0].0 else {
        panic!()
    };
    assert_eq!(
        (r2t.buffer_offset, r2t.desired_len),
        (SEG as u32, 3 * SEG as u32)
    );
    let d = |sn: u32, off: usize, f: bool| DataOut {
        final_: f,
        lun: Lun::from_index(0),
        itt: Itt(1),
        ttt: r2t.ttt,
        exp_stat_sn: Sn(0),
        data_sn: sn,
        buffer_offset: off as u32,
    };
    // Only the next offset, within the command, gets a place.
    assert!(s
        .landing(&d(0, 2 * SEG, false).encode(SEG), &TestHost)
        .is_none());
    assert!(
        s.landing(&d(0, SEG, false).encode(4096), &TestHost)
            .is_none(),
        "small"
    );
    let mut over = d(0, 3 * SEG, false).encode(SEG);
    over[16..20].copy_from_slice(&9u32.to_be_bytes());
    assert!(s.landing(&over, &TestHost).is_none(), "unknown task");
    let h = d(0, SEG, false).encode(SEG);
    let buf = s.landing(&h, &TestHost).expect("data-out lands");
    assert_eq!(buf.len(), SEG);
    assert!(run(&mut s, landed(h, buf, &[2; SEG]), &mut out).is_empty());
    // A small segment in between is copied into the same buffer.
    assert!(run(
        &mut s,
        raw(d(1, 2 * SEG, false).encode(4096), &[3; 4096]),
        &mut out
    )
    .is_empty());
    let h = d(2, 2 * SEG + 4096, true).encode(SEG - 4096 + SEG);
    assert!(s
        .landing(&h, &TestHost)
        .is_some_and(|b| b.len() == 2 * SEG + 4096));
    // (taken and given back by hand: the real driver always hands it in)
    let h2 = d(2, 2 * SEG + 4096, true).encode(2 * SEG - 4096);
    let tail = vec![4u8; 2 * SEG - 4096];
    let Some(Task::Receiving(w)) = s.tasks.get_mut(&1) else {
        panic!()
    };
    assert!(w.buf.whole.is_none(), "out with the driver");
    let _ = h;
    let ev = run(
        &mut s,
        RawPdu {
            bhs: h2,
            ahs: Bytes::new(),
            data: Bytes::copy_from_slice(&tail),
            data_digest_ok: true,
            landed: None,
        },
        &mut out,
    );
    assert!(ev.is_empty(), "data with the buffer out is refused");
    let pdus = sent(&mut out);
    assert!(matches!(pdus[..], [(Pdu::Reject(_), _), (Pdu::ScsiResponse(r), _)] if r.status == 2));

    // A clean run: the whole data-out is one buffer of its own.
    let c = cmd(2, 11, 0x2a, 2048, 1 << 20, &[1; SEG]);
    let buf = s.landing(&c.bhs, &TestHost).unwrap();
    run(&mut s, landed(c.bhs, buf, &[1; SEG]), &mut out);
    let Pdu::R2t(r2t) = sent(&mut out)[0].0 else {
        panic!()
    };
    let mut last = Vec::new();
    for i in 1..4 {
        let dd = DataOut {
            final_: i == 3,
            lun: Lun::from_index(0),
            itt: Itt(2),
            ttt: r2t.ttt,
            exp_stat_sn: Sn(0),
            data_sn: i - 1,
            buffer_offset: i * SEG as u32,
        }
        .encode(SEG);
        let buf = s.landing(&dd, &TestHost).unwrap();
        last = run(&mut s, landed(dd, buf, &[i as u8 + 1; SEG]), &mut out);
    }
    let [Event::Execute(req)] = &last[..] else {
        panic!("{last:?}")
    };
    assert!(matches!(req.data_out, bufpool::WriteData::Owned(_)));
    assert_eq!(req.data_out.segment_count(), 1);
    let v = req.data_out.to_vec();
    assert_eq!((v[0], v[SEG], v[2 * SEG], v[(1 << 20) - 1]), (1, 2, 3, 4));
    let _ = base;
}

#[test]
fn reused_write_states_start_clean() {
    // Write 1 completes and leaves its state (and R2T queue) for reuse;
    // write 2 takes it over and must see nothing of write 1: a fresh
    // R2TSN, its own data, and write 1's TTT refused.
    let mut s = session(true);
    let mut out = Outbox::new();
    let data_out = |itt: u32, ttt: u32, sn: u32, off: u32| DataOut {
        final_: true,
        lun: Lun::from_index(0),
        itt: Itt(itt),
        ttt,
        exp_stat_sn: Sn(0),
        data_sn: sn,
        buffer_offset: off,
    };
    let r2t_of = |out: &mut Outbox| match sent(out)[..] {
        [(Pdu::R2t(r), _)] => r,
        ref p => panic!("{p:?}"),
    };
    assert!(run(&mut s, cmd(1, 10, 0x2a, 1, 512, &[]), &mut out).is_empty());
    let r1 = r2t_of(&mut out);
    let ev = run(
        &mut s,
        raw(data_out(1, r1.ttt, 0, 0).encode(512), &[1; 512]),
        &mut out,
    );
    assert!(matches!(&ev[..], [Event::Execute(r)] if r.data_out.to_vec() == [1; 512]));
    assert_eq!(s.spare_writes.len(), 1, "write 1's state kept for reuse");

    assert!(run(&mut s, cmd(2, 11, 0x2a, 1, 512, &[]), &mut out).is_empty());
    assert!(s.spare_writes.is_empty(), "write 2 took it");
    let r2 = r2t_of(&mut out);
    assert_eq!((r2.r2t_sn, r2.buffer_offset, r2.desired_len), (0, 0, 512));
    assert_ne!(r2.ttt, r1.ttt);
    // Write 1's TTT is not write 2's: refused, and write 2 fails.
    let ev = run(
        &mut s,
        raw(data_out(2, r1.ttt, 0, 0).encode(512), &[9; 512]),
        &mut out,
    );
    assert!(ev.is_empty());
    let pdus = sent(&mut out);
    assert!(matches!(pdus[0].0, Pdu::Reject(_)), "{pdus:?}");
    assert!(matches!(pdus[1].0, Pdu::ScsiResponse(r) if r.status == 2));

    // Several waiting at once, completed out of order, each with its data.
    for itt in 3..6u32 {
        assert!(run(&mut s, cmd(itt, 9 + itt, 0x2a, 1, 512, &[]), &mut out).is_empty());
    }
    let r2ts: Vec<R2t> = sent(&mut out)
        .into_iter()
        .map(|(p, _)| match p {
            Pdu::R2t(r) => r,
            p => panic!("{p:?}"),
        })
        .collect();
    for r in r2ts.iter().rev() {
        let byte = r.itt.0 as u8;
        let ev = run(
            &mut s,
            raw(data_out(r.itt.0, r.ttt, 0, 0).encode(512), &[byte; 512]),
            &mut out,
        );
        let [Event::Execute(req)] = &ev[..] else {
            panic!("{ev:?}")
        };
        assert_eq!((req.itt, req.data_out.to_vec()), (r.itt, vec![byte; 512]));
    }
    assert_eq!(s.spare_writes.len(), 3);
}

/// The keepalive timer, driven with made-up times: silence past the
/// interval sends one NOP-In ping (none while commands are in flight, none
/// with the interval zero); the answer clears it; a ping unanswered past
/// the timeout ends the connection.
#[test]
fn keepalive_pings_after_silence_and_gives_up_after_the_timeout() {
    use std::time::{Duration, Instant};
    let (interval, timeout) = (Duration::from_secs(10), Duration::from_secs(30));
    let mut s = session(false);
    let mut out = Outbox::new();
    let t0 = Instant::now();
    s.note_received(t0);
    let at = |secs: u64| t0 + Duration::from_secs(secs);
    assert!(s.poll_keepalive(at(5), interval, timeout, &mut out).is_ok());
    assert!(sent(&mut out).is_empty(), "not silent long enough");
    assert!(s
        .poll_keepalive(at(11), Duration::ZERO, timeout, &mut out)
        .is_ok());
    assert!(sent(&mut out).is_empty(), "keepalive off");
    // A command in flight: no ping however long the silence.
    run(&mut s, cmd(1, 10, 0x28, 1, 512, &[]), &mut out);
    assert_eq!(s.in_flight(), 1);
    sent(&mut out);
    assert!(s
        .poll_keepalive(at(11), interval, timeout, &mut out)
        .is_ok());
    assert!(sent(&mut out).is_empty(), "a command is in flight");
    s.complete(Itt(1), Completion::default(), &mut out);
    sent(&mut out);
    assert!(s
        .poll_keepalive(at(11), interval, timeout, &mut out)
        .is_ok());
    let Pdu::NopIn(p) = sent(&mut out)[0].0 else {
        panic!("a ping after 11 s of silence")
    };
    assert!(s.ping_outstanding());
    // One ping at a time; answered in time, it is forgotten.
    assert!(s
        .poll_keepalive(at(30), interval, timeout, &mut out)
        .is_ok());
    assert!(sent(&mut out).is_empty());
    let answer = NopOut {
        immediate: true,
        lun: Lun::default(),
        itt: Itt(RESERVED_TAG),
        ttt: p.ttt,
        cmd_sn: Sn(101),
        exp_stat_sn: Sn(101),
    };
    s.note_received(at(31));
    run(&mut s, raw(answer.encode(0), &[]), &mut out);
    assert!(!s.ping_outstanding());
    // Silent again: a new ping at 42 s, unanswered; at 72 s it is not
    // yet past the timeout, at 73 s it is.
    assert!(s
        .poll_keepalive(at(42), interval, timeout, &mut out)
        .is_ok());
    assert!(matches!(sent(&mut out)[0].0, Pdu::NopIn(_)));
    assert!(s
        .poll_keepalive(at(72), interval, timeout, &mut out)
        .is_ok());
    assert_eq!(
        s.poll_keepalive(at(73), interval, timeout, &mut out),
        Err(CloseReason::PingUnanswered)
    );
}
