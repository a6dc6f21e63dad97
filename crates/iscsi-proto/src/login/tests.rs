use super::*;
use iscsi_wire::text;

struct Dir;
impl TargetDirectory for Dir {
    fn find(&self, name: &str, _i: &str) -> Option<TargetInfo> {
        (name == "iqn.2026-11.t:x").then(|| TargetInfo {
            name: name.into(),
            alias: Some("x".into()),
            tpgt: 1,
        })
    }
}

fn req(csg: u8, nsg: u8, transit: bool) -> LoginReq {
    LoginReq {
        transit,
        cont: false,
        csg,
        nsg,
        version_max: 0,
        version_min: 0,
        isid: [0x80, 1, 2, 3, 4, 5],
        tsih: 0,
        itt: Itt(7),
        cid: 0,
        cmd_sn: Sn(1000),
        exp_stat_sn: Sn(55),
    }
}

fn keys(pairs: &[(&str, &str)]) -> Vec<u8> {
    text::encode(pairs)
}

fn libiscsi_keys() -> Vec<u8> {
    keys(&[
        ("InitiatorName", "iqn.i"),
        ("TargetName", "iqn.2026-11.t:x"),
        ("SessionType", "Normal"),
        ("HeaderDigest", "None,CRC32C"),
        ("DataDigest", "None"),
        ("InitialR2T", "No"),
        ("ImmediateData", "Yes"),
        ("MaxBurstLength", "262144"),
        ("FirstBurstLength", "262144"),
        ("DefaultTime2Wait", "2"),
        ("DefaultTime2Retain", "0"),
        ("MaxOutstandingR2T", "1"),
        ("ErrorRecoveryLevel", "0"),
        ("IFMarker", "No"),
        ("OFMarker", "No"),
        ("MaxConnections", "1"),
        ("MaxRecvDataSegmentLength", "262144"),
        ("DataPDUInOrder", "Yes"),
        ("DataSequenceInOrder", "Yes"),
    ])
}

#[test]
fn operational_only_login_completes() {
    let mut l = TargetLogin::new(Limits::default(), 1);
    let step = l.handle(&req(1, 3, true), &libiscsi_keys(), &Dir);
    let LoginStep::Complete {
        resp,
        text: t,
        outcome,
    } = step
    else {
        panic!("{step:?}")
    };
    assert!(resp.transit);
    assert_eq!((resp.csg, resp.nsg), (1, 3));
    assert_eq!(resp.status.class, 0);
    // Login does not consume a CmdSN.
    assert_eq!(resp.sn.exp_cmd_sn, Sn(1000));
    assert_eq!(resp.sn.stat_sn, Sn(55));
    assert_eq!(outcome.next_stat_sn, Sn(56));
    let answers = text::parse(&t).unwrap();
    let get = |k: &str| answers.iter().find(|(a, _)| a == k).map(|(_, v)| v.clone());
    assert_eq!(get("HeaderDigest").as_deref(), Some("None"));
    assert_eq!(get("InitialR2T").as_deref(), Some("No"));
    assert_eq!(get("ImmediateData").as_deref(), Some("Yes"));
    assert_eq!(get("MaxRecvDataSegmentLength").as_deref(), Some("262144"));
    assert_eq!(get("TargetPortalGroupTag").as_deref(), Some("1"));
    assert_eq!(get("ErrorRecoveryLevel").as_deref(), Some("0"));
    assert_eq!(get("DefaultTime2Retain").as_deref(), Some("0"));
    assert_eq!(outcome.params.send_max_data_segment, 262_144);
    assert_eq!(outcome.params.target_name, "iqn.2026-11.t:x");
    assert_eq!(outcome.params.first_burst, 262_144);
}

#[test]
fn security_then_operational() {
    let mut l = TargetLogin::new(Limits::default(), 2);
    let k = keys(&[
        ("InitiatorName", "iqn.i"),
        ("TargetName", "iqn.2026-11.t:x"),
        ("AuthMethod", "CHAP,None"),
    ]);
    let LoginStep::Continue { resp, text: t } = l.handle(&req(0, 1, true), &k, &Dir) else {
        panic!()
    };
    assert!(resp.transit);
    assert_eq!(resp.nsg, 1);
    let a = text::parse(&t).unwrap();
    assert!(a.contains(&("AuthMethod".into(), "None".into())));
    let step = l.handle(
        &req(1, 3, true),
        &keys(&[("MaxRecvDataSegmentLength", "8192")]),
        &Dir,
    );
    assert!(matches!(step, LoginStep::Complete { .. }));
}

#[test]
fn refusals_carry_the_right_status() {
    let cases: Vec<(Vec<u8>, LoginReq, LoginStatus)> = vec![
        (
            keys(&[("TargetName", "iqn.2026-11.t:x")]),
            req(1, 3, true),
            LoginStatus::MISSING_PARAMETER,
        ),
        (
            keys(&[("InitiatorName", "iqn.i")]),
            req(1, 3, true),
            LoginStatus::MISSING_PARAMETER,
        ),
        (
            keys(&[("InitiatorName", "iqn.i"), ("TargetName", "iqn.nope")]),
            req(1, 3, true),
            LoginStatus::NOT_FOUND,
        ),
        (
            keys(&[
                ("InitiatorName", "iqn.i"),
                ("InitiatorName", "iqn.j"),
                ("TargetName", "iqn.2026-11.t:x"),
            ]),
            req(1, 3, true),
            LoginStatus::INITIATOR_ERROR,
        ),
        (
            keys(&[
                ("InitiatorName", "iqn.i"),
                ("TargetName", "iqn.2026-11.t:x"),
                ("AuthMethod", "CHAP"),
            ]),
            req(0, 1, true),
            LoginStatus::AUTH_FAILED,
        ),
        (
            b"InitiatorName\0".to_vec(),
            req(1, 3, true),
            LoginStatus::INITIATOR_ERROR,
        ),
        (
            keys(&[("InitiatorName", "iqn.i"), ("SessionType", "Bogus")]),
            req(1, 3, true),
            LoginStatus::SESSION_TYPE_UNSUPPORTED,
        ),
    ];
    for (k, r, want) in cases {
        let mut l = TargetLogin::new(Limits::default(), 1);
        match l.handle(&r, &k, &Dir) {
            LoginStep::Fail { resp, .. } => {
                assert_eq!(resp.status, want, "{:?}", String::from_utf8_lossy(&k))
            }
            other => panic!("accepted {:?}: {other:?}", String::from_utf8_lossy(&k)),
        }
    }
    let mut l = TargetLogin::new(Limits::default(), 1);
    let mut r = req(1, 3, true);
    r.version_min = 1;
    assert!(
        matches!(l.handle(&r, &libiscsi_keys(), &Dir), LoginStep::Fail { resp, .. } if resp.status.detail == 5)
    );
    let mut l = TargetLogin::new(Limits::default(), 1);
    assert!(matches!(
        l.handle(&req(3, 0, false), &libiscsi_keys(), &Dir),
        LoginStep::Fail { .. }
    ));
}

#[test]
fn odd_values_are_answered_not_fatal() {
    let mut l = TargetLogin::new(Limits::default(), 1);
    let k = keys(&[
        ("InitiatorName", "iqn.i"),
        ("SessionType", "Discovery"),
        ("MaxBurstLength", "12"),
        ("X-com.example.Foo", "1"),
        ("InitialR2T", "Maybe"),
    ]);
    let LoginStep::Complete {
        text: t, outcome, ..
    } = l.handle(&req(1, 3, true), &k, &Dir)
    else {
        panic!()
    };
    let a = text::parse(&t).unwrap();
    assert!(a.contains(&("MaxBurstLength".into(), "Reject".into())));
    assert!(a.contains(&("X-com.example.Foo".into(), "NotUnderstood".into())));
    assert!(a.contains(&("InitialR2T".into(), "Reject".into())));
    assert!(!a.iter().any(|(k, _)| k == "TargetPortalGroupTag"));
    assert_eq!(outcome.params.session_type, SessionType::Discovery);
}

#[test]
fn continued_text_is_joined() {
    let mut l = TargetLogin::new(Limits::default(), 1);
    let all = libiscsi_keys();
    let (a, b) = all.split_at(40);
    let mut r = req(1, 3, false);
    r.cont = true;
    let LoginStep::Continue { resp, text: t } = l.handle(&r, a, &Dir) else {
        panic!()
    };
    assert!(!resp.transit && t.is_empty());
    assert!(matches!(
        l.handle(&req(1, 3, true), b, &Dir),
        LoginStep::Complete { .. }
    ));
}

#[test]
fn digest_policies() {
    let mut lim = Limits {
        header_digest: DigestPolicy::Required,
        ..Limits::default()
    };
    let mut l = TargetLogin::new(lim.clone(), 1);
    let LoginStep::Complete { outcome, .. } = l.handle(&req(1, 3, true), &libiscsi_keys(), &Dir)
    else {
        panic!()
    };
    assert!(outcome.params.header_digest);
    lim.data_digest = DigestPolicy::Required;
    let mut l = TargetLogin::new(lim, 1);
    assert!(matches!(
        l.handle(&req(1, 3, true), &libiscsi_keys(), &Dir),
        LoginStep::Fail { .. }
    ));
}

/// Each operational key negotiated by value: the answer for a value in
/// its domain, and Reject for one outside it (RFC 7143 §6.2.1, §13).
#[test]
fn operational_keys_are_answered_by_their_rules() {
    let lim = Limits::default();
    let answer = |key: &str, val: &str| {
        let mut l = TargetLogin::new(Limits::default(), 1);
        let mut out = Vec::new();
        assert!(l.negotiate(key, val, &mut out).is_ok());
        let pairs = text::parse(&out).unwrap();
        assert!(pairs.len() <= 1, "{pairs:?}");
        pairs.into_iter().next().map(|(k, v)| {
            assert_eq!(k, key);
            v
        })
    };
    let some = |s: &str| Some(s.to_string());
    let yn = |b: bool| some(if b { "Yes" } else { "No" });
    assert_eq!(answer("MaxConnections", "4"), some("1"));
    assert_eq!(answer("MaxConnections", "0"), some("Reject"));
    assert_eq!(answer("InitialR2T", "No"), yn(lim.initial_r2t));
    assert_eq!(answer("InitialR2T", "Yes"), some("Yes"));
    assert_eq!(answer("ImmediateData", "Yes"), yn(lim.immediate_data));
    assert_eq!(answer("ImmediateData", "Maybe"), some("Reject"));
    assert_eq!(answer("DataPDUInOrder", "No"), some("Yes"));
    assert_eq!(answer("DataSequenceInOrder", "No"), some("Yes"));
    assert_eq!(answer("MaxRecvDataSegmentLength", "8192"), None);
    assert_eq!(answer("MaxRecvDataSegmentLength", "100"), some("Reject"));
    assert_eq!(
        answer("MaxRecvDataSegmentLength", "16777216"),
        some("Reject")
    );
    let mb = lim.max_burst.to_string();
    assert_eq!(answer("MaxBurstLength", "16777215"), some(&mb));
    assert_eq!(answer("FirstBurstLength", "512"), some("512"));
    let t2w = lim.time2wait.to_string();
    assert_eq!(answer("DefaultTime2Wait", "0"), some(&t2w));
    assert_eq!(answer("DefaultTime2Retain", "3601"), some("Reject"));
    let r2t = 16.min(lim.max_outstanding_r2t).to_string();
    assert_eq!(answer("MaxOutstandingR2T", "0x10"), some(&r2t));
    assert_eq!(answer("ErrorRecoveryLevel", "2"), some("0"));
    assert_eq!(answer("ErrorRecoveryLevel", "3"), some("Reject"));
    assert_eq!(answer("IFMarker", "Yes"), some("No"));
    assert_eq!(answer("OFMarker", "x"), some("Reject"));
    assert_eq!(answer("iSCSIProtocolLevel", "0x1f"), some("1"));
    assert_eq!(answer("iSCSIProtocolLevel", "0"), some("0"));
    assert_eq!(answer("iSCSIProtocolLevel", "32"), some("Reject"));
    assert_eq!(answer("X-vendor.Key", "1"), some("NotUnderstood"));
}
