//! CHAP and ACLs in the login state machines: our initiator against our
//! target with no sockets, and hand-made hostile security-stage requests.

use iscsi_proto::chap::{self, ChapPolicy, Credential, Secret};
use iscsi_proto::initiator::{
    InitiatorLogin, LoginConfig, LoginError, LoginProgress, MutualChap, Negotiated,
};
use iscsi_proto::login::{LoginOutcome, LoginStatus, LoginStep, TargetDirectory, TargetInfo};
use iscsi_proto::params::Limits;
use iscsi_proto::TargetLogin;
use iscsi_wire::pdu::{Itt, LoginReq};
use iscsi_wire::text;
use iscsi_wire::Sn;

const ISEC: &[u8] = b"initiator-secret-1";
const TSEC: &[u8] = b"target-secret-22";
const CHALLENGE: [u8; 16] = *b"0123456789abcdef";

struct Dir {
    policy: ChapPolicy,
    allowed: bool,
}

impl TargetDirectory for Dir {
    fn find(&self, name: &str, _i: &str) -> Option<TargetInfo> {
        (name == "iqn.t").then(|| TargetInfo {
            name: name.into(),
            alias: None,
            tpgt: 1,
        })
    }
    fn authorize(&self, _name: &str, _initiator: &str) -> bool {
        self.allowed
    }
    fn chap(&self, _target: Option<&str>) -> ChapPolicy {
        self.policy.clone()
    }
}

fn dir(mutual: bool) -> Dir {
    Dir {
        policy: ChapPolicy {
            initiator: Some(Credential::new("ini", ISEC)),
            target: mutual.then(|| Credential::new("tgt", TSEC)),
        },
        allowed: true,
    }
}

fn cfg(target: Option<&str>, user: &str, secret: &[u8]) -> LoginConfig {
    let mut c = LoginConfig::new("iqn.i", target, [0x80, 0, 0, 0, 0, 1]);
    c.chap = Some(Credential::new(user, secret));
    c
}

fn mutual(c: &mut LoginConfig, secret: &[u8]) {
    c.mutual = Some(MutualChap {
        user: Some("tgt".into()),
        secret: Secret::new(secret),
        id: 9,
        challenge: b"fedcba9876543210".to_vec(),
    });
}

#[derive(Debug)]
enum End {
    Ok(Box<Negotiated>, Box<LoginOutcome>),
    TargetRefused(LoginStatus, String),
    InitiatorError(#[allow(dead_code)] LoginError),
}

fn run(cfg: LoginConfig, d: &Dir) -> End {
    let mut il = InitiatorLogin::new(cfg, Sn(1), Itt(3));
    let mut tl = TargetLogin::new(Limits::default(), 1);
    tl.seed_challenge(42, CHALLENGE);
    let (mut req, mut body) = il.start();
    for _ in 0..20 {
        let (resp, rtext, done) = match tl.handle(&req, &body, d) {
            LoginStep::Continue { resp, text } => (resp, text, None),
            LoginStep::Complete {
                resp,
                text,
                outcome,
            } => (resp, text, Some(outcome)),
            LoginStep::Fail { resp, reason } => return End::TargetRefused(resp.status, reason),
        };
        match il.handle(&resp, &rtext) {
            Ok(LoginProgress::Send(r, t)) => (req, body) = (r, t),
            Ok(LoginProgress::Done(n)) => return End::Ok(n, done.expect("target done")),
            Err(e) => return End::InitiatorError(e),
        }
    }
    panic!("login did not end");
}

#[test]
fn chap_one_way_and_mutual_succeed() {
    let End::Ok(n, o) = run(cfg(Some("iqn.t"), "ini", ISEC), &dir(false)) else {
        panic!()
    };
    assert_eq!(o.params.target_name, "iqn.t");
    assert_eq!(n.params.initiator_name, "iqn.i");
    let mut c = cfg(Some("iqn.t"), "ini", ISEC);
    mutual(&mut c, TSEC);
    assert!(matches!(run(c, &dir(true)), End::Ok(..)));
    // Discovery sessions authenticate the same way.
    let mut c = cfg(None, "ini", ISEC);
    mutual(&mut c, TSEC);
    let End::Ok(_, o) = run(c, &dir(true)) else {
        panic!()
    };
    assert_eq!(o.params.session_type, iscsi_proto::SessionType::Discovery);
}

#[test]
fn wrong_credentials_fail_with_0201() {
    for c in [
        cfg(Some("iqn.t"), "ini", b"wrong-secret-99"),
        cfg(Some("iqn.t"), "intruder", ISEC),
        LoginConfig::new("iqn.i", Some("iqn.t"), [0x80, 0, 0, 0, 0, 1]),
    ] {
        match run(c, &dir(false)) {
            End::TargetRefused(code, reason) => {
                assert_eq!(code, LoginStatus::AUTH_FAILED, "{reason}");
                assert!(!reason.contains("initiator-secret"), "{reason}");
            }
            e => panic!("{e:?}"),
        }
    }
}

#[test]
fn mutual_failures() {
    // The target does not know the secret the initiator expects.
    let mut c = cfg(Some("iqn.t"), "ini", ISEC);
    mutual(&mut c, b"other-target-secret");
    assert!(matches!(run(c, &dir(true)), End::InitiatorError(_)));
    // Mutual asked of a target without credentials of its own.
    let mut c = cfg(Some("iqn.t"), "ini", ISEC);
    mutual(&mut c, TSEC);
    assert!(matches!(
        run(c, &dir(false)),
        End::TargetRefused(LoginStatus::AUTH_FAILED, _)
    ));
    // Identical secrets in both directions: the initiator refuses before
    // answering the challenge.
    let mut c = cfg(Some("iqn.t"), "ini", ISEC);
    mutual(&mut c, ISEC);
    assert!(matches!(run(c, &dir(true)), End::InitiatorError(_)));
}

#[test]
fn acl_refusal_is_0202() {
    let d = Dir {
        policy: ChapPolicy::default(),
        allowed: false,
    };
    let c = LoginConfig::new("iqn.i", Some("iqn.t"), [0x80, 0, 0, 0, 0, 1]);
    assert!(matches!(
        run(c, &d),
        End::TargetRefused(LoginStatus::FORBIDDEN, _)
    ));
}

// Hand-made requests against the target alone.

fn req(csg: u8, transit: bool) -> LoginReq {
    LoginReq {
        transit,
        cont: false,
        csg,
        nsg: if csg == 0 { 1 } else { 3 },
        version_max: 0,
        version_min: 0,
        isid: [0x80, 0, 0, 0, 0, 1],
        tsih: 0,
        itt: Itt(3),
        cid: 0,
        cmd_sn: Sn(1),
        exp_stat_sn: Sn(0),
    }
}

/// Runs requests (CSG, T, keys) and returns the last step.
/// One scripted request: CSG, T bit, keys.
type Step<'a> = (u8, bool, Vec<(&'a str, String)>);

fn script(d: &Dir, steps: &[Step]) -> LoginStep {
    let mut tl = TargetLogin::new(Limits::default(), 1);
    tl.seed_challenge(42, CHALLENGE);
    let mut last = None;
    for (csg, t, keys) in steps {
        let body = text::encode(keys);
        let s = tl.handle(&req(*csg, *t), &body, d);
        let fail = matches!(s, LoginStep::Fail { .. });
        last = Some(s);
        if fail {
            break;
        }
    }
    last.unwrap()
}

fn first() -> Vec<(&'static str, String)> {
    vec![
        ("InitiatorName", "iqn.i".into()),
        ("TargetName", "iqn.t".into()),
        ("AuthMethod", "CHAP".into()),
    ]
}

fn good_r() -> String {
    chap::encode_hex(&chap::response(42, &Secret::new(ISEC), &CHALLENGE))
}

fn code(s: &LoginStep) -> LoginStatus {
    match s {
        LoginStep::Fail { resp, .. } | LoginStep::Continue { resp, .. } => resp.status,
        LoginStep::Complete { resp, .. } => resp.status,
    }
}

fn answers(s: &LoginStep) -> Vec<(String, String)> {
    match s {
        LoginStep::Continue { text: t, .. } | LoginStep::Complete { text: t, .. } => {
            text::parse(t).unwrap()
        }
        LoginStep::Fail { .. } => Vec::new(),
    }
}

#[test]
fn hostile_chap_exchanges_are_refused() {
    let d = dir(true);
    let a5 = vec![("CHAP_A", "5".to_string())];
    let resp = |n: &str, r: String| vec![("CHAP_N", n.to_string()), ("CHAP_R", r)];
    let refused = |steps: &[Step], why: &str| {
        let s = script(&d, steps);
        assert!(
            matches!(s, LoginStep::Fail { .. }),
            "{why}: accepted: {s:?}"
        );
        assert_eq!(code(&s).class, 2, "{why}");
    };
    // The good exchange, for reference: CHAP_A answered with I and C.
    let s = script(&d, &[(0, false, first()), (0, false, a5.clone())]);
    let a = answers(&s);
    assert!(a.contains(&("CHAP_A".into(), "5".into())));
    assert!(a.contains(&("CHAP_I".into(), "42".into())));
    assert!(a.contains(&("CHAP_C".into(), chap::encode_hex(&CHALLENGE))));
    let s = script(
        &d,
        &[
            (0, false, first()),
            (0, false, a5.clone()),
            (0, true, resp("ini", good_r())),
        ],
    );
    assert!(matches!(s, LoginStep::Continue { ref resp, .. } if resp.transit));
    // A base64 response is as good.
    let r64 = {
        let r = chap::response(42, &Secret::new(ISEC), &CHALLENGE);
        // 16 bytes in base64, by hand: encode via hex round trip check.
        let table = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut s = String::from("0b");
        for c in r.chunks(3) {
            let n = c.iter().fold(0u32, |a, &b| a << 8 | u32::from(b)) << (8 * (3 - c.len()));
            for i in 0..=c.len() {
                s.push(table[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
            for _ in c.len()..3 {
                s.push('=');
            }
        }
        s
    };
    let s = script(
        &d,
        &[
            (0, false, first()),
            (0, false, a5.clone()),
            (0, true, resp("ini", r64)),
        ],
    );
    assert!(
        matches!(s, LoginStep::Continue { ref resp, .. } if resp.transit),
        "{s:?}"
    );

    refused(
        &[
            (0, false, first()),
            (0, false, vec![("CHAP_A", "7,6".into())]),
        ],
        "algorithm other than MD5",
    );
    refused(
        &[(0, false, first()), (0, false, resp("ini", good_r()))],
        "response before CHAP_A",
    );
    for bad in [
        "0x".to_string(),
        "0xzz".into(),
        "deadbeef".into(),
        format!("0x{}", "00".repeat(1025)),
        "0b====".into(),
        "".into(),
    ] {
        refused(
            &[
                (0, false, first()),
                (0, false, a5.clone()),
                (0, true, resp("ini", bad.clone())),
            ],
            &format!("malformed CHAP_R {bad:.20}"),
        );
    }
    // Reflection: the initiator sends our challenge back as its own.
    let mut reflect = resp("ini", good_r());
    reflect.push(("CHAP_I", "42".into()));
    reflect.push(("CHAP_C", chap::encode_hex(&CHALLENGE)));
    refused(
        &[
            (0, false, first()),
            (0, false, a5.clone()),
            (0, true, reflect),
        ],
        "reflected challenge",
    );
    // Mutual keys that are malformed or incomplete.
    for (i, c) in [
        (Some("300"), Some("0x0102")),
        (Some("1"), Some("0xgg")),
        (Some("1"), None),
        (None, Some("0x0102")),
        (Some("1"), Some(&*format!("0x{}", "ab".repeat(1025)))),
    ] {
        let mut k = resp("ini", good_r());
        if let Some(i) = i {
            k.push(("CHAP_I", i.into()));
        }
        if let Some(c) = c {
            k.push(("CHAP_C", c.into()));
        }
        refused(
            &[(0, false, first()), (0, false, a5.clone()), (0, true, k)],
            "bad mutual keys",
        );
    }
    refused(
        &[(
            0,
            true,
            vec![
                ("InitiatorName", "iqn.i".into()),
                ("TargetName", "iqn.t".into()),
                ("AuthMethod", "None".into()),
            ],
        )],
        "AuthMethod=None where CHAP is required",
    );
    refused(
        &[(
            1,
            true,
            vec![
                ("InitiatorName", "iqn.i".into()),
                ("TargetName", "iqn.t".into()),
            ],
        )],
        "skipping the security stage",
    );
    refused(
        &[(
            0,
            true,
            vec![
                ("InitiatorName", "iqn.i".into()),
                ("TargetName", "iqn.t".into()),
            ],
        )],
        "leaving the security stage without authenticating",
    );
    refused(
        &[
            (0, false, first()),
            (0, false, a5.clone()),
            (1, true, vec![("MaxBurstLength", "4096".into())]),
        ],
        "operational stage before the response",
    );
    refused(
        &[
            (0, false, first()),
            (0, false, a5.clone()),
            (0, true, resp("ini", good_r())),
            (1, true, vec![("CHAP_N", "ini".into())]),
        ],
        "CHAP key in the operational stage",
    );
    refused(
        &[
            (0, false, first()),
            (0, false, a5.clone()),
            (0, false, a5.clone()),
        ],
        "CHAP_A twice",
    );
    // Mid-exchange, T=1 is answered with T=0 rather than transit.
    let s = script(&d, &[(0, true, first())]);
    assert!(matches!(s, LoginStep::Continue { ref resp, .. } if !resp.transit));
}

#[test]
fn no_challenge_no_chap() {
    // A driver that forgot to seed the challenge cannot run CHAP with a
    // predictable one.
    let mut tl = TargetLogin::new(Limits::default(), 1);
    let d = dir(false);
    let _ = tl.handle(&req(0, false), &text::encode(&first()), &d);
    let s = tl.handle(&req(0, false), &text::encode(&[("CHAP_A", "5")]), &d);
    assert_eq!(code(&s), LoginStatus::TARGET_ERROR);
}

#[test]
fn endless_login_is_bounded() {
    let mut tl = TargetLogin::new(Limits::default(), 1);
    let d = Dir {
        policy: ChapPolicy::default(),
        allowed: true,
    };
    let mut r = req(1, false);
    let mut ended = false;
    let keys = text::encode(&[("InitiatorName", "iqn.i"), ("TargetName", "iqn.t")]);
    for i in 0..200 {
        r.cont = true;
        let body = if i == 0 { &keys[..] } else { &[][..] };
        if let LoginStep::Fail { .. } = tl.handle(&r, body, &d) {
            ended = true;
            break;
        }
    }
    assert!(ended, "endless C-bit continuation accepted");
}
