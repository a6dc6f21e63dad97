use super::*;
use proptest::prelude::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn read10_command_vector() {
    // SCSI Command, F+R, SIMPLE, LUN 0, ITT 0x11, EDTL 4096, CmdSN 7,
    // ExpStatSN 3, CDB READ(10) LBA 0x20 length 8.
    let b: Bhs = hex(
        "01c10000 00000000 00000000 00000000 00000011 00001000 00000007 00000003
         28000000 00200000 08000000 00000000",
    )
    .try_into()
    .unwrap();
    let Pdu::ScsiCommand(c) = Pdu::parse(&b) else {
        panic!("not a command")
    };
    assert!(c.final_ && c.read && !c.write && !c.immediate);
    assert_eq!(c.attr, TaskAttr::Simple);
    assert_eq!(c.itt, Itt(0x11));
    assert_eq!(c.edtl, 4096);
    assert_eq!(c.cmd_sn, Sn(7));
    assert_eq!(c.cdb[0], 0x28);
    assert_eq!(c.lun.index(), Some(0));
    assert_eq!(c.encode(0), b);
}

#[test]
fn login_response_vector() {
    let r = LoginResp {
        transit: true,
        cont: false,
        csg: 1,
        nsg: 3,
        version_max: 0,
        version_active: 0,
        isid: [0x80, 0, 0x02, 0x3d, 0, 0],
        tsih: 0x0102,
        itt: Itt(1),
        sn: SnTriple {
            stat_sn: Sn(9),
            exp_cmd_sn: Sn(2),
            max_cmd_sn: Sn(129),
        },
        status: LoginStatus::NOT_FOUND,
    };
    let b = r.encode(10);
    assert_eq!(
        b.to_vec(),
        hex(
            "23870000 0000000a 8000023d 00000102 00000001 00000000 00000009 00000002
             00000081 02030000 00000000 00000000"
        )
    );
    assert_eq!(LoginResp::decode(&b), r);
}

#[test]
fn unknown_opcode_is_a_variant() {
    let mut b = [0u8; 48];
    b[0] = 0x1c;
    assert_eq!(Pdu::parse(&b), Pdu::Unknown(0x1c));
}

#[test]
fn lun_addressing() {
    assert_eq!(Lun::from_index(3).0, [0, 3, 0, 0, 0, 0, 0, 0]);
    assert_eq!(Lun::from_index(300).index(), Some(300));
    assert_eq!(Lun([0xc0, 0, 0, 0, 0, 0, 0, 0]).index(), None);
    assert_eq!(Lun([0, 1, 0, 0, 0, 0, 0, 1]).index(), None);
}

fn sn() -> impl Strategy<Value = Sn> {
    any::<u32>().prop_map(Sn)
}
fn triple() -> impl Strategy<Value = SnTriple> {
    (sn(), sn(), sn()).prop_map(|(a, b, c)| SnTriple {
        stat_sn: a,
        exp_cmd_sn: b,
        max_cmd_sn: c,
    })
}

proptest! {
    #[test]
    fn scsi_command_round_trip(imm: bool, f: bool, r: bool, w: bool, attr in 0u8..8, lun: [u8; 8],
                               itt: u32, edtl: u32, cs in sn(), es in sn(), cdb: [u8; 16], dl in 0usize..1<<24) {
        let c = ScsiCommand { immediate: imm, final_: f, read: r, write: w, attr: attr.into(), lun: Lun(lun),
            itt: Itt(itt), edtl, cmd_sn: cs, exp_stat_sn: es, cdb };
        let b = c.encode(dl);
        prop_assert_eq!(crate::frame::data_segment_len(&b) as usize, dl);
        prop_assert_eq!(ScsiCommand::decode(&b), c);
    }

    #[test]
    fn data_in_round_trip(f: bool, a: bool, st in proptest::option::of(any::<u8>()), itt: u32, ttt: u32,
                          t in triple(), dsn: u32, off: u32, o: bool, u: bool, cnt: u32) {
        let t = if st.is_some() { t } else { SnTriple { stat_sn: Sn(0), ..t } };
        let residual = if st.is_some() { Residual { overflow: o, underflow: u, count: cnt } } else { Residual::default() };
        let d = DataIn { final_: f, ack: a, status: st, lun: Lun::default(), itt: Itt(itt), ttt, sn: t,
            data_sn: dsn, buffer_offset: off, residual };
        prop_assert_eq!(DataIn::decode(&d.encode(4096)), d);
    }

    #[test]
    fn login_round_trip(t: bool, c: bool, csg in 0u8..4, nsg in 0u8..4, isid: [u8; 6], tsih: u16,
                        itt: u32, cid: u16, cs in sn(), es in sn()) {
        let l = LoginReq { transit: t, cont: c, csg, nsg, version_max: 0, version_min: 0, isid, tsih,
            itt: Itt(itt), cid, cmd_sn: cs, exp_stat_sn: es };
        prop_assert_eq!(LoginReq::decode(&l.encode(100)), l);
    }

    #[test]
    fn response_round_trips(resp: u8, status: u8, itt: u32, t in triple(), eds: u32, o: bool, u: bool, cnt: u32,
                            r2tsn: u32, off: u32, len: u32, ttt: u32) {
        let r = ScsiResponse { response: resp.into(), status, itt: Itt(itt), sn: t, exp_data_sn: eds,
            residual: Residual { overflow: o, underflow: u, count: cnt } };
        prop_assert_eq!(ScsiResponse::decode(&r.encode(18)), r);
        let r2 = R2t { lun: Lun::from_index(1), itt: Itt(itt), ttt, sn: t, r2t_sn: r2tsn, buffer_offset: off, desired_len: len };
        prop_assert_eq!(R2t::decode(&r2.encode()), r2);
        let n = NopIn { lun: Lun::default(), itt: Itt(itt), ttt, sn: t };
        prop_assert_eq!(NopIn::decode(&n.encode(0)), n);
        let tm = TaskMgmtResp { response: resp.into(), itt: Itt(itt), sn: t };
        prop_assert_eq!(TaskMgmtResp::decode(&tm.encode()), tm);
        let lo = LogoutResp { response: resp.into(), itt: Itt(itt), sn: t, time2wait: 2, time2retain: 20 };
        prop_assert_eq!(LogoutResp::decode(&lo.encode()), lo);
        let rj = Reject { reason: resp.into(), sn: t, data_sn: r2tsn };
        prop_assert_eq!(Reject::decode(&rj.encode(48)), rj);
        let tr = TextResp { final_: o, cont: u, lun: Lun::default(), itt: Itt(itt), ttt, sn: t };
        prop_assert_eq!(TextResp::decode(&tr.encode(10)), tr);
        let am = AsyncMsg { lun: Lun::default(), sn: t, event: resp.into(), vcode: status, param1: 1, param2: 2, param3: 3 };
        prop_assert_eq!(AsyncMsg::decode(&am.encode(0)), am);
    }

    #[test]
    fn request_round_trips(imm: bool, itt: u32, ttt: u32, cs in sn(), es in sn(), f in 0u8..0x80, off: u32, dsn: u32) {
        let n = NopOut { immediate: imm, lun: Lun::default(), itt: Itt(itt), ttt, cmd_sn: cs, exp_stat_sn: es };
        prop_assert_eq!(NopOut::decode(&n.encode(0)), n);
        let tm = TaskMgmtReq { immediate: imm, function: TmfFunction::from_byte(f), lun: Lun::default(), itt: Itt(itt),
            ref_task_tag: Itt(ttt), cmd_sn: cs, exp_stat_sn: es, ref_cmd_sn: cs, exp_data_sn: dsn };
        prop_assert_eq!(TaskMgmtReq::decode(&tm.encode()), tm);
        let d = DataOut { final_: imm, lun: Lun::default(), itt: Itt(itt), ttt, exp_stat_sn: es, data_sn: dsn, buffer_offset: off };
        prop_assert_eq!(DataOut::decode(&d.encode(512)), d);
        let t = TextReq { immediate: imm, final_: true, cont: false, lun: Lun::default(), itt: Itt(itt), ttt, cmd_sn: cs, exp_stat_sn: es };
        prop_assert_eq!(TextReq::decode(&t.encode(20)), t);
        let l = LogoutReq { immediate: imm, reason: (f & 3).into(), itt: Itt(itt), cid: 1, cmd_sn: cs, exp_stat_sn: es };
        prop_assert_eq!(LogoutReq::decode(&l.encode()), l);
        let s = SnackReq { kind: f & 0xf, lun: Lun::default(), itt: Itt(itt), ttt, exp_stat_sn: es, beg_run: off, run_length: dsn };
        prop_assert_eq!(SnackReq::decode(&s.encode()), s);
    }

    #[test]
    fn parse_never_panics(b: [u8; 32], c: [u8; 16]) {
        let mut bhs = [0u8; 48];
        bhs[..32].copy_from_slice(&b);
        bhs[32..].copy_from_slice(&c);
        let _ = Pdu::parse(&bhs);
    }
}
