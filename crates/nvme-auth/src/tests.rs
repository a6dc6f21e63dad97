//! Secrets, responses (vectors computed independently with Python's hmac
//! from the formulas of the module docs), and whole transactions between
//! [`Controller`] and [`HostTransaction`], with the failures each side
//! must see.

use super::*;
use std::sync::Arc;

/// The example secret of the NVMe specification (a 32-byte key, CRC-32).
const SPEC: &str = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
const SUBSYS: &str = "nqn.2024-01.io.example:subsys1";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn counting(start: u8) -> impl FnMut(&mut [u8]) {
    let mut n = start;
    move |b: &mut [u8]| {
        for x in b.iter_mut() {
            *x = n;
            n = n.wrapping_add(1);
        }
    }
}

#[test]
fn secrets_parse_and_refuse() {
    let s = Secret::parse(SPEC).unwrap();
    assert_eq!(
        hex(&s.key),
        "89aeb31a874eaf84841b46736b0dfdf2ba58d30aa2a545a3e235a3521e07594c"
    );
    assert_eq!(format!("{s:?}"), "Secret(redacted)");
    assert_eq!(Secret::represent(&s.key, None), SPEC);
    let t = Secret::parse(&Secret::represent(&s.key, Some(Hash::Sha256))).unwrap();
    assert_eq!(
        hex(&t.transformed(HOST)),
        "30ec326a9164ef751470fc129b83a2f17593c43d19f4c615c46e65ba3ff72021"
    );
    assert_eq!(
        hex(&t.transformed(SUBSYS)),
        "d18e9f486cc18ae55fc39adf5c26d9cddb47c3532f81e7f2e6753493553eb1e0"
    );
    let bad_crc = SPEC.replace("aQ2n", "aQ2m");
    for (text, e) in [
        ("secret", SecretError::Form),
        ("DHHC-1:00:abc", SecretError::Form),
        (
            "DHHC-1:04:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:",
            SecretError::Transform,
        ),
        ("DHHC-1:00:!!!!:", SecretError::Base64),
        ("DHHC-1:00:AAAA:", SecretError::Length),
        (bad_crc.as_str(), SecretError::Crc),
    ] {
        assert_eq!(Secret::parse(text).unwrap_err(), e, "{text}");
    }
}

#[test]
fn responses_match_the_reference_computation() {
    let k = Secret::parse(SPEC).unwrap().key.clone();
    let c1: Vec<u8> = (0..32).collect();
    let r1 = host_response(&k, Hash::Sha256, &c1, 0x0102_0304, 1, HOST, SUBSYS);
    assert_eq!(
        hex(&r1),
        "b38e8efc1eea8e20d9c879819a2d93f3d0351b944fd88bab88e53b91ed361c61"
    );
    let t = Secret::parse(&Secret::represent(&k, Some(Hash::Sha256))).unwrap();
    let r1 = host_response(
        &t.transformed(HOST),
        Hash::Sha256,
        &c1,
        0x0102_0304,
        1,
        HOST,
        SUBSYS,
    );
    assert_eq!(
        hex(&r1),
        "68ac90b73486e42d0532f6246c8dd1f1715dbf83d953bc68b8e4da5f82db3ed1"
    );
    let c2: Vec<u8> = (0..32).map(|i| 0xff - i).collect();
    let r2 = ctrl_response(
        &t.transformed(SUBSYS),
        Hash::Sha256,
        &c2,
        0x0a0b_0c0d,
        1,
        HOST,
        SUBSYS,
    );
    assert_eq!(
        hex(&r2),
        "59bcc0f87a636ae24281b7a994d6849708b878065da37450dcccd9686dc16023"
    );
}

fn keys(host: &str, ctrl: Option<&str>) -> Arc<Keys> {
    Arc::new(Keys {
        host: Secret::parse(host).unwrap(),
        ctrl: ctrl.map(|c| Secret::parse(c).unwrap()),
    })
}

/// Runs a transaction: the host's outcome and the controller after it.
fn run(
    ctrl_keys: Arc<Keys>,
    host_key: &Secret,
    host_ctrl_key: Option<&Secret>,
) -> (Result<(), HostError>, Controller) {
    let mut c = Controller::new(ctrl_keys, HOST, SUBSYS);
    let mut h = HostTransaction::new(host_key, host_ctrl_key, HOST, SUBSYS, 7);
    assert!(!c.authenticated());
    c.send(&h.negotiate());
    let ch = c.receive(4096, &mut counting(0)).unwrap();
    assert_eq!(ch.len(), 4096, "zero-filled to the allocation length");
    let reply = match h.reply(&ch, &mut counting(100)) {
        Ok(r) => r,
        Err(e) => return (Err(e), c),
    };
    c.send(&reply);
    let s1 = c.receive(4096, &mut counting(0)).unwrap();
    match h.success1(&s1) {
        Ok(Some(s2)) => {
            c.send(&s2);
            (Ok(()), c)
        }
        Ok(None) => (Ok(()), c),
        Err(e) => {
            c.send(&h.failure2(Reason::Failed));
            (Err(e), c)
        }
    }
}

#[test]
fn transactions_one_way_and_both_ways() {
    let host = Secret::represent(&[0x11; 32], Some(Hash::Sha256));
    let ctrl = Secret::represent(&[0x22; 48], Some(Hash::Sha384));
    let hk = Secret::parse(&host).unwrap();
    let ck = Secret::parse(&ctrl).unwrap();
    let (r, c) = run(keys(&host, None), &hk, None);
    assert_eq!(r, Ok(()));
    assert!(c.authenticated() && !c.fatal());
    let (r, c) = run(keys(&host, Some(&ctrl)), &hk, Some(&ck));
    assert_eq!(r, Ok(()));
    assert!(c.authenticated(), "after Success2");
    // A host with the controller secret asked of a controller without one.
    let (r, c) = run(keys(&host, None), &hk, Some(&ck));
    assert_eq!(r, Err(HostError::Refused(Reason::Failed)));
    assert!(!c.authenticated() && c.fatal());
}

#[test]
fn a_queue_reauthenticating_keeps_serving_until_it_fails() {
    let host = Secret::represent(&[0x11; 32], None);
    let hk = Secret::parse(&host).unwrap();
    let (r, mut c) = run(keys(&host, None), &hk, None);
    assert_eq!(r, Ok(()));
    // A second transaction on the live queue: authenticated throughout.
    let mut h = HostTransaction::new(&hk, None, HOST, SUBSYS, 8);
    c.send(&h.negotiate());
    assert!(c.authenticated());
    let ch = c.receive(4096, &mut counting(9)).unwrap();
    c.send(&h.reply(&ch, &mut counting(0)).unwrap());
    c.receive(4096, &mut counting(0)).unwrap();
    assert!(c.authenticated() && !c.fatal());
    // One with a wrong secret: refused, and the queue with it.
    let other = Secret::parse(&Secret::represent(&[0x12; 32], None)).unwrap();
    let mut h = HostTransaction::new(&other, None, HOST, SUBSYS, 9);
    c.send(&h.negotiate());
    let ch = c.receive(4096, &mut counting(9)).unwrap();
    c.send(&h.reply(&ch, &mut counting(0)).unwrap());
    assert!(!c.authenticated());
    c.receive(4096, &mut counting(0)).unwrap();
    assert!(c.fatal());
}

#[test]
fn wrong_secrets_fail_on_the_side_that_checks() {
    let host = Secret::represent(&[0x11; 32], None);
    let other = Secret::parse(&Secret::represent(&[0x12; 32], None)).unwrap();
    let (r, c) = run(keys(&host, None), &other, None);
    assert_eq!(r, Err(HostError::Refused(Reason::Failed)));
    assert!(!c.authenticated() && c.fatal());
    // The controller's secret is not the one the host knows: the host
    // refuses the controller, which stays unauthenticated.
    let ctrl = Secret::represent(&[0x22; 32], None);
    let hk = Secret::parse(&host).unwrap();
    let (r, c) = run(keys(&host, Some(&ctrl)), &hk, Some(&other));
    assert_eq!(r, Err(HostError::ControllerNotAuthenticated));
    assert!(!c.authenticated() && !c.fatal());
}

#[test]
fn protocol_violations_end_in_failure1() {
    let k = keys(&Secret::represent(&[0x11; 32], None), None);
    let hk = Secret::parse(&Secret::represent(&[0x11; 32], None)).unwrap();
    let h = HostTransaction::new(&hk, None, HOST, SUBSYS, 1);
    let failure = |c: &mut Controller| {
        let m = c.receive(4096, &mut counting(0)).unwrap();
        assert!(c.fatal());
        (m[0], m[1], m[7])
    };
    // Receive before Negotiate.
    let mut c = Controller::new(k.clone(), HOST, SUBSYS);
    assert_eq!(c.receive(4096, &mut counting(0)), Err(OutOfSequence));
    // No NULL DH group offered.
    let mut n = h.negotiate();
    n[42] = 1;
    c.send(&n);
    assert_eq!(failure(&mut c), (0, 0xf1, Reason::DhgroupUnusable as u8));
    // No known hash.
    let mut c = Controller::new(k.clone(), HOST, SUBSYS);
    let mut n = h.negotiate();
    n[12..15].copy_from_slice(&[9, 9, 9]);
    c.send(&n);
    assert_eq!(failure(&mut c), (0, 0xf1, Reason::HashUnusable as u8));
    // Short messages, a Reply before the Challenge, a TLS concatenation.
    for m in [vec![0u8; 4], {
        let mut r = vec![0u8; 80];
        r[0] = 1;
        r[1] = ID_REPLY;
        r
    }] {
        let mut c = Controller::new(k.clone(), HOST, SUBSYS);
        c.send(&m);
        assert!(matches!(c.step, Step::Failure1(_)));
    }
    let mut c = Controller::new(k.clone(), HOST, SUBSYS);
    let mut n = h.negotiate();
    n[6] = 1;
    c.send(&n);
    assert_eq!(failure(&mut c), (0, 0xf1, Reason::ConcatMismatch as u8));
    // A transaction ID that changes between Negotiate and Reply.
    let mut c = Controller::new(k, HOST, SUBSYS);
    let mut h = HostTransaction::new(&hk, None, HOST, SUBSYS, 1);
    c.send(&h.negotiate());
    let ch = c.receive(64, &mut counting(0)).unwrap();
    let mut reply = h.reply(&ch, &mut counting(0)).unwrap();
    reply[4] = 9;
    c.send(&reply);
    assert_eq!(failure(&mut c), (0, 0xf1, Reason::IncorrectPayload as u8));
    assert!(!c.authenticated());
}

#[test]
fn commands_are_checked() {
    let cdw10 = u32::from_le_bytes([0, SPSP0, SPSP1, SECP]);
    assert_eq!(check_command(cdw10, 72), Some(72));
    assert_eq!(check_command(cdw10, 0), None);
    assert_eq!(check_command(cdw10, MAX_MESSAGE as u32 + 1), None);
    assert_eq!(check_command(cdw10 ^ (1 << 24), 72), None);
    assert_eq!(check_command(cdw10 & !(1 << 8), 72), None);
}

proptest::proptest! {
    /// Whatever a host sends, in whatever order, the controller answers
    /// without panicking and authenticates nobody who did not reply with
    /// the right R1 (a random message cannot carry it).
    #[test]
    fn hostile_messages_never_panic_nor_authenticate(
        msgs in proptest::collection::vec(
            (proptest::bool::ANY, proptest::collection::vec(proptest::num::u8::ANY, 0..200)),
            0..12,
        ),
        al in 0usize..5000,
    ) {
        let k = keys(&Secret::represent(&[0x11; 32], None), None);
        let mut c = Controller::new(k, HOST, SUBSYS);
        for (receive, mut m) in msgs {
            if receive {
                if let Ok(r) = c.receive(al, &mut counting(0)) {
                    proptest::prop_assert_eq!(r.len(), al.min(MAX_MESSAGE));
                }
            } else {
                // Half the time a well-formed header, to get past the first checks.
                if m.len() >= 2 && m[0] & 1 == 0 {
                    m[0] = if m[1] & 1 == 0 { 0 } else { 1 };
                    m[1] &= 0x07;
                }
                c.send(&m);
            }
            proptest::prop_assert!(!c.authenticated());
        }
    }
}
