//! Reservations: SPC-2 RESERVE/RELEASE, PERSISTENT RESERVE IN/OUT, the
//! conflict table, unit attentions and APTPL persistence.

use std::sync::Mutex as StdMutex;

use super::*;
use crate::pr::PreemptAbortHook;

const TUR: [u8; 6] = [op::TEST_UNIT_READY, 0, 0, 0, 0, 0];
const MODE_SENSE: [u8; 6] = [op::MODE_SENSE_6, 0, 0x3F, 0, 255, 0];

const WE: u8 = 1;
const EA: u8 = 3;
const WE_RO: u8 = 5;
const EA_RO: u8 = 6;
const WE_AR: u8 = 7;
const EA_AR: u8 = 8;
const TYPES: [u8; 6] = [WE, EA, WE_RO, EA_RO, WE_AR, EA_AR];

const REGISTER: u8 = 0;
const RESERVE: u8 = 1;
const RELEASE: u8 = 2;
const CLEAR: u8 = 3;
const PREEMPT: u8 = 4;
const PREEMPT_AND_ABORT: u8 = 5;
const REGISTER_AND_IGNORE: u8 = 6;
const REGISTER_AND_MOVE: u8 = 7;

const TARGET_A: &str = "iqn.2026-11.io.ironsan:t0,t,0x0001";
const TARGET_B: &str = "iqn.2026-11.io.ironsan:t0,t,0x0002";
const INIT_1: &str = "iqn.2026-11.test:one,i,0x800000000001";
const INIT_2: &str = "iqn.2026-11.test:two,i,0x800000000002";
const INIT_3: &str = "iqn.2026-11.test:three,i,0x800000000003";

/// One session: its nexus id and I_T nexus names.
#[derive(Clone, Copy)]
struct S {
    n: NexusId,
    init: &'static str,
    target: &'static str,
    rel: u16,
}

const A: S = S {
    n: NexusId(1),
    init: INIT_1,
    target: TARGET_A,
    rel: 1,
};
const B: S = S {
    n: NexusId(2),
    init: INIT_2,
    target: TARGET_A,
    rel: 1,
};
const C: S = S {
    n: NexusId(3),
    init: INIT_3,
    target: TARGET_A,
    rel: 1,
};
/// Initiator port 1 through the second target port.
const A2: S = S {
    n: NexusId(4),
    init: INIT_1,
    target: TARGET_B,
    rel: 2,
};

fn exec(lu: &LogicalUnit, s: S, cdb: &[u8], data: &[u8]) -> Outcome {
    lu.execute(&Command {
        cdb,
        data_out: &wd(data),
        nexus: s.n,
        relative_port: s.rel,
        tpg: s.rel,
        target_port_name: s.target,
        initiator_port_name: s.init,
        expected_data_out: None,
        lus: None,
    })
}

fn prout_cdb(sa: u8, kind: u8, len: u32) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = op::PERSISTENT_RESERVE_OUT;
    c[1] = sa;
    c[2] = kind;
    c[5..9].copy_from_slice(&len.to_be_bytes());
    c
}

fn params(key: u64, sa_key: u64, flags: u8) -> [u8; 24] {
    let mut p = [0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p[20] = flags;
    p
}

fn prout(lu: &LogicalUnit, s: S, sa: u8, kind: u8, key: u64, sa_key: u64) -> Outcome {
    exec(lu, s, &prout_cdb(sa, kind, 24), &params(key, sa_key, 0))
}

fn prin(lu: &LogicalUnit, s: S, sa: u8, alloc: u16) -> Outcome {
    let mut c = [0u8; 10];
    c[0] = op::PERSISTENT_RESERVE_IN;
    c[1] = sa;
    c[7..9].copy_from_slice(&alloc.to_be_bytes());
    exec(lu, s, &c, &[])
}

fn register(lu: &LogicalUnit, s: S, key: u64) {
    good(&prout(lu, s, REGISTER_AND_IGNORE, 0, 0, key));
}

/// PERSISTENT RESERVE IN from a session used once (so that no unit
/// attention meant for A, B or C gets in the way or is consumed).
fn observe(lu: &LogicalUnit, sa: u8) -> Outcome {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(10_000);
    let s = S {
        n: NexusId(NEXT.fetch_add(1, Ordering::Relaxed)),
        init: "iqn.2026-11.test:observer,i,0x800000000fff",
        target: TARGET_A,
        rel: 1,
    };
    let o = prin(lu, s, sa, 8192);
    lu.nexus_lost(s.n);
    o
}

/// (PRgeneration, keys) from READ KEYS.
fn keys(lu: &LogicalUnit) -> (u32, Vec<u64>) {
    let o = observe(lu, 0);
    good(&o);
    let d = &o.data;
    let gen = u32::from_be_bytes(d[0..4].try_into().unwrap());
    let len = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
    assert_eq!(d.len(), 8 + len);
    let k = d[8..]
        .chunks(8)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
        .collect();
    (gen, k)
}

/// (key, type) from READ RESERVATION, `None` when not reserved.
fn reservation(lu: &LogicalUnit) -> Option<(u64, u8)> {
    let o = observe(lu, 1);
    good(&o);
    let d = &o.data;
    if u32::from_be_bytes(d[4..8].try_into().unwrap()) == 0 {
        assert_eq!(d.len(), 8);
        return None;
    }
    assert_eq!(d.len(), 24);
    Some((u64::from_be_bytes(d[8..16].try_into().unwrap()), d[21]))
}

#[track_caller]
fn conflict(o: &Outcome) {
    assert_eq!(o.status, status::RESERVATION_CONFLICT, "{o:?}");
    assert!(o.sense.is_none() && o.data.is_empty());
}

#[track_caller]
fn ua(lu: &LogicalUnit, s: S, code: Asc) {
    sense(&exec(lu, s, &TUR, &[]), SenseKey::UnitAttention, code);
}

#[track_caller]
fn invalid_param(o: &Outcome, byte: u16, bit: Option<u8>) {
    sense(
        o,
        SenseKey::IllegalRequest,
        Asc::INVALID_FIELD_IN_PARAMETER_LIST,
    );
    let f = o.sense.unwrap().field.expect("field pointer");
    assert!(!f.in_cdb);
    assert_eq!((f.byte, f.bit), (byte, bit));
}

/// A fresh LU on which A, B and C have each sent a command.
fn lu3() -> LogicalUnit {
    let lu = mem_lu();
    for s in [A, B, C, A2] {
        good(&exec(&lu, s, &TUR, &[]));
    }
    lu
}

#[test]
fn register_unregister_and_generation() {
    let lu = lu3();
    assert_eq!(keys(&lu), (0, vec![]));
    // REGISTER from an unregistered nexus with a nonzero key: conflict.
    conflict(&prout(&lu, A, REGISTER, 0, 5, 0x11));
    good(&prout(&lu, A, REGISTER, 0, 0, 0x11));
    assert_eq!(keys(&lu), (1, vec![0x11]));
    // Re-registering with the wrong current key conflicts (libiscsi
    // ProutRegister), and changes nothing.
    conflict(&prout(&lu, A, REGISTER, 0, 0, 0x12));
    assert_eq!(keys(&lu), (1, vec![0x11]));
    // With the right key, the key changes.
    good(&prout(&lu, A, REGISTER, 0, 0x11, 0x12));
    // REGISTER AND IGNORE EXISTING KEY ignores the key field.
    good(&prout(&lu, A, REGISTER_AND_IGNORE, 0, 0xdead, 0x13));
    register(&lu, B, 0x21);
    assert_eq!(keys(&lu), (4, vec![0x13, 0x21]));
    // Unregister.
    good(&prout(&lu, A, REGISTER, 0, 0x13, 0));
    assert_eq!(keys(&lu), (5, vec![0x21]));
    // Unregistering an unregistered nexus: GOOD, nothing changes.
    good(&prout(&lu, A, REGISTER_AND_IGNORE, 0, 0, 0));
    assert_eq!(keys(&lu).1, vec![0x21]);
    // The same initiator port through another target port is another nexus.
    register(&lu, A, 0x31);
    conflict(&prout(&lu, A2, REGISTER, 0, 0x31, 0x32));
    register(&lu, A2, 0x32);
    assert_eq!(keys(&lu).1, vec![0x21, 0x31, 0x32]);
}

#[test]
fn read_keys_truncation_keeps_length() {
    let lu = lu3();
    register(&lu, A, 1);
    register(&lu, B, 2);
    let o = prin(&lu, A, 0, 8);
    good(&o);
    assert_eq!(o.data.len(), 8);
    assert_eq!(&o.data[4..8], &16u32.to_be_bytes());
    assert_eq!(prin(&lu, A, 0, 12).data.len(), 12);
    assert_eq!(prin(&lu, A, 0, 0).data.len(), 0);
    assert_eq!(prin(&lu, A, 1, 4).data.len(), 4);
    assert_eq!(prin(&lu, A, 2, 3).data.len(), 3);
    assert_eq!(prin(&lu, A, 3, 10).data.len(), 10);
}

#[test]
fn service_action_ranges_and_cdb_fields() {
    let lu = lu3();
    for sa in 0..4 {
        good(&prin(&lu, A, sa, 100));
    }
    for sa in 4..0x20 {
        invalid_cdb(&prin(&lu, A, sa, 100), 1, Some(4));
    }
    for sa in 8..0x20 {
        invalid_cdb(&prout(&lu, A, sa, 1, 0, 0), 1, Some(4));
    }
    register(&lu, A, 1);
    // Reserved types and scopes other than LU_SCOPE.
    for t in [0, 2, 4, 9, 15] {
        invalid_cdb(&prout(&lu, A, RESERVE, t, 1, 0), 2, Some(3));
    }
    invalid_cdb(&prout(&lu, A, RESERVE, 0x21, 1, 0), 2, Some(7));
    // REGISTER and CLEAR ignore scope and type.
    good(&prout(&lu, A, REGISTER, 0xff, 1, 2));
}

#[test]
fn parameter_list_validation() {
    let lu = lu3();
    let plle = |o: &Outcome| {
        sense(
            o,
            SenseKey::IllegalRequest,
            Asc::PARAMETER_LIST_LENGTH_ERROR,
        )
    };
    let p = params(0, 7, 0);
    plle(&exec(&lu, A, &prout_cdb(REGISTER, 0, 23), &p[..23]));
    let mut long = p.to_vec();
    long.extend_from_slice(&[0; 8]);
    plle(&exec(&lu, A, &prout_cdb(REGISTER, 0, 32), &long));
    // Fewer bytes received than announced.
    plle(&exec(&lu, A, &prout_cdb(REGISTER, 0, 24), &p[..20]));
    plle(&exec(&lu, A, &prout_cdb(REGISTER, 0, u32::MAX), &p));
    // SPEC_I_PT is not supported.
    invalid_param(
        &exec(&lu, A, &prout_cdb(REGISTER, 0, 24), &params(0, 7, 0x08)),
        20,
        Some(3),
    );
    // APTPL without a state file.
    invalid_param(
        &exec(&lu, A, &prout_cdb(REGISTER, 0, 24), &params(0, 7, 0x01)),
        20,
        Some(0),
    );
    assert_eq!(keys(&lu), (0, vec![]));
    // The plan: PR OUT solicits its parameter list, PR IN returns at most
    // the allocation length; oversized lists solicit nothing.
    assert_eq!(lu.plan(&prout_cdb(REGISTER, 0, 24)).data_out, 24);
    assert_eq!(lu.plan(&prout_cdb(REGISTER, 0, 1 << 20)).data_out, 0);
    let mut c = [0u8; 10];
    c[0] = op::PERSISTENT_RESERVE_IN;
    c[7] = 0x40;
    assert_eq!(lu.plan(&c).data_in, 0x4000);
}

#[test]
fn reserve_and_release_every_type() {
    let lu = lu3();
    register(&lu, A, 0xA);
    register(&lu, B, 0xB);
    for t in TYPES {
        // Unregistered nexuses and wrong keys conflict.
        conflict(&prout(&lu, C, RESERVE, t, 0, 0));
        conflict(&prout(&lu, A, RESERVE, t, 0xB, 0));
        good(&prout(&lu, A, RESERVE, t, 0xA, 0));
        let ar = t == WE_AR || t == EA_AR;
        assert_eq!(reservation(&lu), Some((if ar { 0 } else { 0xA }, t)));
        // Reserving again with the same type: GOOD; another type: conflict.
        good(&prout(&lu, A, RESERVE, t, 0xA, 0));
        let other = if t == WE { EA } else { WE };
        conflict(&prout(&lu, A, RESERVE, other, 0xA, 0));
        // Another registrant: a holder only with all-registrants types.
        let o = prout(&lu, B, RESERVE, t, 0xB, 0);
        if ar {
            good(&o);
        } else {
            conflict(&o);
            // RELEASE from a registered non-holder: GOOD, no effect.
            good(&prout(&lu, B, RELEASE, t, 0xB, 0));
            assert!(reservation(&lu).is_some());
        }
        // RELEASE with the wrong type.
        sense(
            &prout(&lu, A, RELEASE, other, 0xA, 0),
            SenseKey::IllegalRequest,
            Asc::INVALID_RELEASE_OF_PERSISTENT_RESERVATION,
        );
        conflict(&prout(&lu, C, RELEASE, t, 0, 0));
        let gen = keys(&lu).0;
        good(&prout(&lu, A, RELEASE, t, 0xA, 0));
        assert_eq!(reservation(&lu), None);
        assert_eq!(keys(&lu).0, gen, "RESERVE and RELEASE leave PRgeneration");
        // RO and AR releases tell the other registrants.
        if t == WE_RO || t == EA_RO || ar {
            ua(&lu, B, Asc::RESERVATIONS_RELEASED);
        }
        good(&exec(&lu, B, &TUR, &[]));
        good(&exec(&lu, A, &TUR, &[]));
        // RELEASE with nothing reserved: GOOD.
        good(&prout(&lu, A, RELEASE, t, 0xA, 0));
    }
}

/// Read and write access of (holder, registered non-holder, unregistered).
#[test]
fn access_per_type() {
    // (type, registered can read, registered can write, unregistered
    // can read, unregistered can write) — the libiscsi Access* matrix.
    let table = [
        (WE, true, false, true, false),
        (EA, false, false, false, false),
        (WE_RO, true, true, true, false),
        (EA_RO, true, true, false, false),
        (WE_AR, true, true, true, false),
        (EA_AR, true, true, false, false),
    ];
    let data = vec![0u8; BS as usize];
    for (t, reg_r, reg_w, unreg_r, unreg_w) in table {
        let lu = lu3();
        register(&lu, A, 0xA);
        register(&lu, B, 0xB);
        good(&prout(&lu, A, RESERVE, t, 0xA, 0));
        let check = |s: S, read: bool, write: bool| {
            let o = exec(&lu, s, &read10(1, 1), &[]);
            if read {
                good(&o)
            } else {
                conflict(&o)
            }
            let o = exec(&lu, s, &write10(1, 1), &data);
            if write {
                good(&o)
            } else {
                conflict(&o)
            }
            let o = exec(&lu, s, &MODE_SENSE, &[]);
            if read {
                good(&o)
            } else {
                conflict(&o)
            }
            let o = exec(&lu, s, &cdb10(op::SYNCHRONIZE_CACHE_10, 0, 0, 0), &[]);
            if write {
                good(&o)
            } else {
                conflict(&o)
            }
            // Always allowed.
            good(&exec(&lu, s, &TUR, &[]));
            good(&exec(&lu, s, &[op::INQUIRY, 0, 0, 0, 36, 0], &[]));
            good(&exec(
                &lu,
                s,
                &[op::READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                &[],
            ));
            good(&exec(&lu, s, &[op::REQUEST_SENSE, 0, 0, 0, 18, 0], &[]));
            good(&prin(&lu, s, 0, 100));
        };
        check(A, true, true);
        check(B, reg_r, reg_w);
        check(C, unreg_r, unreg_w);
        // The holder's initiator port through another target port is
        // another, unregistered, I_T nexus.
        check(A2, unreg_r, unreg_w);
    }
}

#[test]
fn holder_unregistering_releases() {
    for t in TYPES {
        let lu = lu3();
        register(&lu, A, 0xA);
        register(&lu, B, 0xB);
        good(&prout(&lu, A, RESERVE, t, 0xA, 0));
        good(&prout(&lu, A, REGISTER, 0, 0xA, 0));
        if t == WE_AR || t == EA_AR {
            // Shared: B still holds it, and can release it.
            assert_eq!(reservation(&lu), Some((0, t)));
            good(&prout(&lu, B, RELEASE, t, 0xB, 0));
        } else {
            assert_eq!(reservation(&lu), None);
            if t == WE_RO || t == EA_RO {
                ua(&lu, B, Asc::RESERVATIONS_RELEASED);
            }
        }
        good(&exec(&lu, B, &TUR, &[]));
        // The last registrant of an AR reservation leaving ends it.
        good(&prout(&lu, B, RESERVE, EA_AR, 0xB, 0));
        good(&prout(&lu, B, REGISTER, 0, 0xB, 0));
        assert_eq!(reservation(&lu), None);
        assert_eq!(keys(&lu).1, Vec::<u64>::new());
    }
}

#[test]
fn clear_removes_everything_and_tells_the_others() {
    let lu = lu3();
    register(&lu, A, 0xA);
    register(&lu, B, 0xB);
    good(&prout(&lu, A, RESERVE, EA, 0xA, 0));
    let gen = keys(&lu).0;
    conflict(&prout(&lu, C, CLEAR, 0, 0, 0));
    conflict(&prout(&lu, B, CLEAR, 0, 0xA, 0));
    good(&prout(&lu, B, CLEAR, 0, 0xB, 0));
    assert_eq!(keys(&lu), (gen + 1, vec![]));
    assert_eq!(reservation(&lu), None);
    ua(&lu, A, Asc::RESERVATIONS_PREEMPTED);
    good(&exec(&lu, A, &TUR, &[]));
    good(&exec(&lu, B, &TUR, &[]));
    good(&exec(&lu, C, &TUR, &[]));
}

#[test]
fn preempt_registrations_only() {
    // libiscsi ProutPreempt.RemoveRegistration: no reservation.
    let lu = lu3();
    register(&lu, A, 0xA);
    register(&lu, B, 0xB);
    let gen = keys(&lu).0;
    good(&prout(&lu, B, PREEMPT, EA, 0xB, 0xA));
    assert_eq!(keys(&lu), (gen + 1, vec![0xB]));
    assert_eq!(reservation(&lu), None);
    ua(&lu, A, Asc::REGISTRATIONS_PREEMPTED);
    good(&exec(&lu, A, &TUR, &[]));
    good(&exec(&lu, B, &TUR, &[]));
    // A key nobody has: conflict; key 0 without an AR reservation: invalid.
    conflict(&prout(&lu, B, PREEMPT, EA, 0xB, 0x99));
    invalid_param(&prout(&lu, B, PREEMPT, EA, 0xB, 0), 8, None);
    // Unregistered issuer.
    conflict(&prout(&lu, A, PREEMPT, EA, 0xA, 0xB));
}

#[test]
fn preempt_the_holder() {
    let lu = lu3();
    register(&lu, A, 0xA);
    register(&lu, B, 0xB);
    register(&lu, C, 0xC);
    good(&prout(&lu, A, RESERVE, WE_RO, 0xA, 0));
    good(&prout(&lu, B, PREEMPT, EA, 0xB, 0xA));
    assert_eq!(reservation(&lu), Some((0xB, EA)));
    assert_eq!(keys(&lu).1, vec![0xB, 0xC]);
    ua(&lu, A, Asc::REGISTRATIONS_PREEMPTED);
    // The type changed: the remaining registrant hears of it.
    ua(&lu, C, Asc::RESERVATIONS_RELEASED);
    good(&exec(&lu, B, &TUR, &[]));
    // A is gone: EA shuts it out.
    conflict(&exec(&lu, A, &read10(0, 1), &[]));
    // The holder preempting itself changes the type; nobody is removed.
    good(&prout(&lu, B, PREEMPT, WE, 0xB, 0xB));
    assert_eq!(reservation(&lu), Some((0xB, WE)));
    assert_eq!(keys(&lu).1, vec![0xB, 0xC]);
    ua(&lu, C, Asc::RESERVATIONS_RELEASED);
}

#[test]
fn preempt_all_registrants() {
    let lu = lu3();
    register(&lu, A, 0xA);
    register(&lu, B, 0xB);
    register(&lu, C, 0xC);
    good(&prout(&lu, A, RESERVE, WE_AR, 0xA, 0));
    // A nonzero key only removes that registration; the AR reservation stays.
    good(&prout(&lu, A, PREEMPT, WE_AR, 0xA, 0xC));
    assert_eq!(reservation(&lu), Some((0, WE_AR)));
    assert_eq!(keys(&lu).1, vec![0xA, 0xB]);
    ua(&lu, C, Asc::REGISTRATIONS_PREEMPTED);
    // Key 0 removes everybody else and makes the issuer the holder.
    good(&prout(&lu, B, PREEMPT, EA, 0xB, 0));
    assert_eq!(reservation(&lu), Some((0xB, EA)));
    assert_eq!(keys(&lu).1, vec![0xB]);
    ua(&lu, A, Asc::REGISTRATIONS_PREEMPTED);
}

#[test]
fn preempt_and_abort_calls_the_hook() {
    let lu = lu3();
    let seen: Arc<StdMutex<Vec<NexusId>>> = Arc::default();
    let s2 = seen.clone();
    let hook: PreemptAbortHook = Arc::new(move |n: &[NexusId]| s2.lock().unwrap().extend(n));
    assert!(lu.set_preempt_abort_hook(hook.clone()));
    assert!(!lu.set_preempt_abort_hook(hook));
    register(&lu, A, 0xA);
    register(&lu, B, 0xB);
    good(&prout(&lu, A, RESERVE, EA, 0xA, 0));
    good(&prout(&lu, B, PREEMPT, EA, 0xB, 0xA));
    assert!(seen.lock().unwrap().is_empty(), "PREEMPT aborts nothing");
    ua(&lu, A, Asc::REGISTRATIONS_PREEMPTED);
    register(&lu, A, 0xA);
    good(&prout(&lu, A, PREEMPT_AND_ABORT, WE, 0xA, 0xB));
    assert_eq!(*seen.lock().unwrap(), vec![B.n]);
    assert_eq!(reservation(&lu), Some((0xA, WE)));
}

#[test]
fn register_and_move() {
    let lu = lu3();
    register(&lu, A, 0xA);
    good(&prout(&lu, A, RESERVE, EA, 0xA, 0));
    let tid = |name: &str| {
        let mut t = vec![0x45, 0];
        let mut body = name.as_bytes().to_vec();
        body.push(0);
        while !body.len().is_multiple_of(4) || body.len() < 20 {
            body.push(0);
        }
        t.extend_from_slice(&(body.len() as u16).to_be_bytes());
        t.extend_from_slice(&body);
        t
    };
    let ram = |key: u64, sa_key: u64, unreg: bool, rel: u16, t: &[u8]| {
        let mut p = vec![0u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&sa_key.to_be_bytes());
        p[17] = u8::from(unreg) << 1;
        p[18..20].copy_from_slice(&rel.to_be_bytes());
        p[20..24].copy_from_slice(&(t.len() as u32).to_be_bytes());
        p.extend_from_slice(t);
        p
    };
    let run_ram =
        |s: S, p: &[u8]| exec(&lu, s, &prout_cdb(REGISTER_AND_MOVE, 0, p.len() as u32), p);
    // Only the holder may move; the destination must be another nexus.
    conflict(&run_ram(B, &ram(0, 0xB, false, 1, &tid(INIT_2))));
    invalid_param(
        &run_ram(A, &ram(0xA, 0xB, false, 1, &tid(INIT_1))),
        24,
        None,
    );
    invalid_param(&run_ram(A, &ram(0xA, 0, false, 1, &tid(INIT_2))), 8, None);
    invalid_param(
        &run_ram(A, &ram(0xA, 0xB, false, 77, &tid(INIT_2))),
        18,
        None,
    );
    let mut bad = tid(INIT_2);
    bad[0] = 0x05; // format 00b: an initiator device, not a port
    invalid_param(&run_ram(A, &ram(0xA, 0xB, false, 1, &bad)), 24, Some(7));
    let gen = keys(&lu).0;
    good(&run_ram(A, &ram(0xA, 0xB, true, 1, &tid(INIT_2))));
    assert_eq!(keys(&lu), (gen + 1, vec![0xB]));
    assert_eq!(reservation(&lu), Some((0xB, EA)));
    good(&exec(&lu, B, &read10(0, 1), &[]));
    conflict(&exec(&lu, A, &read10(0, 1), &[]));
    // Through the second target port (relative port 2, seen from A2).
    good(&run_ram(B, &ram(0xB, 0xA2, false, 2, &tid(INIT_1))));
    assert_eq!(keys(&lu).1, vec![0xB, 0xA2]);
    good(&exec(&lu, A2, &read10(0, 1), &[]));
    conflict(&exec(&lu, A, &read10(0, 1), &[]));
}

#[test]
fn report_capabilities_and_full_status() {
    let lu = lu3();
    let o = prin(&lu, A, 2, 100);
    good(&o);
    assert_eq!(&o.data[..], &[0, 8, 0x14, 0xB0, 0xEA, 0x01, 0, 0]);
    register(&lu, A, 0xA);
    good(&prout(&lu, B, REGISTER_AND_IGNORE, 0, 0, 0xB));
    // B registers through every target port.
    good(&prout(&lu, B, REGISTER, 0, 0xB, 0)); // unregister first
    good(&exec(
        &lu,
        B,
        &prout_cdb(REGISTER, 0, 24),
        &params(0, 0xB, 0x04),
    ));
    good(&prout(&lu, A, RESERVE, WE, 0xA, 0));
    let o = prin(&lu, C, 3, 4096);
    good(&o);
    let d = &o.data;
    let len = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
    assert_eq!(d.len(), 8 + len);
    // First descriptor: A, the holder, through relative port 1.
    let a = &d[8..];
    assert_eq!(&a[0..8], &0xAu64.to_be_bytes());
    assert_eq!((a[12], a[13]), (0x01, WE));
    assert_eq!(&a[18..20], &[0, 1]);
    let tlen = u32::from_be_bytes(a[20..24].try_into().unwrap()) as usize;
    let t = &a[24..24 + tlen];
    assert_eq!(t[0], 0x45, "iSCSI, format 01b");
    let add = usize::from(u16::from_be_bytes([t[2], t[3]]));
    assert_eq!(add + 4, tlen);
    assert!(add.is_multiple_of(4));
    assert_eq!(&t[4..4 + INIT_1.len()], INIT_1.as_bytes());
    assert_eq!(t[4 + INIT_1.len()], 0);
    // Second: B, ALL_TG_PT, not a holder.
    let b = &a[24 + tlen..];
    assert_eq!(&b[0..8], &0xBu64.to_be_bytes());
    assert_eq!((b[12], b[13]), (0x02, 0));
    // B is registered through port 2 as well.
    let b2 = S {
        n: NexusId(9),
        init: INIT_2,
        target: TARGET_B,
        rel: 2,
    };
    conflict(&prout(&lu, b2, REGISTER, 0, 0, 0xB2));
    good(&prout(&lu, b2, REGISTER, 0, 0xB, 0xB2));
    assert_eq!(keys(&lu).1, vec![0xA, 0xB2]);
}

#[test]
fn spc2_reserve_release() {
    let lu = lu3();
    let r6 = [op::RESERVE_6, 0, 0, 0, 0, 0];
    let rl6 = [op::RELEASE_6, 0, 0, 0, 0, 0];
    let r10 = [op::RESERVE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let rl10 = [op::RELEASE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    good(&exec(&lu, A, &r6, &[]));
    good(&exec(&lu, A, &r10, &[]));
    conflict(&exec(&lu, B, &r6, &[]));
    // RELEASE from another nexus: GOOD, nothing released.
    good(&exec(&lu, B, &rl6, &[]));
    conflict(&exec(&lu, B, &MODE_SENSE, &[]));
    conflict(&exec(&lu, B, &TUR, &[]));
    conflict(&exec(&lu, B, &read10(0, 1), &[]));
    good(&exec(&lu, B, &[op::INQUIRY, 0, 0, 0, 36, 0], &[]));
    good(&exec(&lu, A, &MODE_SENSE, &[]));
    // Persistent reservation commands conflict with an SPC-2 reservation,
    // even from its holder.
    conflict(&prin(&lu, A, 0, 100));
    conflict(&prout(&lu, B, REGISTER, 0, 0, 1));
    good(&exec(&lu, A, &rl10, &[]));
    good(&exec(&lu, B, &r10, &[]));
    // Third-party reservations are not supported.
    invalid_cdb(
        &exec(&lu, A, &[op::RESERVE_10, 0x10, 0, 0, 0, 0, 0, 0, 0, 0], &[]),
        1,
        Some(4),
    );
    invalid_cdb(
        &exec(&lu, A, &[op::RELEASE_10, 0x02, 0, 0, 0, 0, 0, 0, 0, 0], &[]),
        1,
        Some(1),
    );
    // Lost with the session.
    lu.nexus_lost(B.n);
    good(&exec(&lu, A, &r6, &[]));
    // Released by a LUN reset (B's session is new: no unit attention).
    lu.reset();
    good(&exec(&lu, B, &r6, &[]));
    good(&exec(&lu, B, &rl6, &[]));
}

#[test]
fn spc2_with_persistent_reservations() {
    // SPC-4 §5.9.3 (CRH = 1).
    let lu = lu3();
    let r6 = [op::RESERVE_6, 0, 0, 0, 0, 0];
    let rl6 = [op::RELEASE_6, 0, 0, 0, 0, 0];
    register(&lu, A, 0xA);
    register(&lu, B, 0xB);
    // Registrations alone: RESERVE/RELEASE conflict.
    conflict(&exec(&lu, A, &r6, &[]));
    conflict(&exec(&lu, C, &rl6, &[]));
    good(&prout(&lu, A, RESERVE, WE_RO, 0xA, 0));
    // The holder, and registrants of an RO reservation: GOOD, no effect.
    good(&exec(&lu, A, &r6, &[]));
    good(&exec(&lu, B, &rl6, &[]));
    conflict(&exec(&lu, C, &r6, &[]));
    assert_eq!(reservation(&lu), Some((0xA, WE_RO)));
    good(&prin(&lu, C, 0, 100));
}

#[test]
fn persistent_state_outlives_sessions_and_resets() {
    let lu = lu3();
    register(&lu, A, 0xA);
    good(&prout(&lu, A, RESERVE, EA, 0xA, 0));
    lu.nexus_lost(A.n);
    lu.reset();
    ua(&lu, B, Asc::BUS_DEVICE_RESET);
    conflict(&exec(&lu, B, &read10(0, 1), &[]));
    // A new session of the same I_T nexus holds the reservation.
    let a_again = S {
        n: NexusId(50),
        ..A
    };
    good(&exec(&lu, a_again, &read10(0, 1), &[]));
    assert_eq!(reservation(&lu), Some((0xA, EA)));
    // Another ISID of the same initiator is another I_T nexus.
    let other_isid = S {
        n: NexusId(51),
        init: "iqn.2026-11.test:one,i,0x800000000099",
        ..A
    };
    conflict(&exec(&lu, other_isid, &read10(0, 1), &[]));
}

/// A LU configuration with a fresh reservation state file in a directory
/// of its own (`tag` names it): the directory, the file, the config.
fn with_state_file(tag: &str) -> (std::path::PathBuf, std::path::PathBuf, LuConfig) {
    let dir = std::env::temp_dir().join(format!("ironsan-pr-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("lu.pr");
    let _ = std::fs::remove_file(&path);
    let mut c = cfg();
    c.pr_state = Some(path.clone());
    (dir, path, c)
}

fn new_lu(c: &LuConfig) -> LogicalUnit {
    LogicalUnit::new(Arc::new(MemBackend::new(BLOCKS * u64::from(BS))), c.clone()).unwrap()
}

#[test]
fn aptpl_survives_a_new_logical_unit() {
    let (dir, path, c) = with_state_file("lu");
    let lu = new_lu(&c);
    // PTPL_C = 1, PTPL_A = 0.
    assert_eq!(prin(&lu, A, 2, 8).data[2..4], [0x15, 0xB0]);
    register(&lu, B, 0xB);
    assert!(!path.exists(), "APTPL = 0: nothing kept");
    good(&exec(
        &lu,
        A,
        &prout_cdb(REGISTER, 0, 24),
        &params(0, 0xA, 0x01),
    ));
    good(&prout(&lu, A, RESERVE, WE_RO, 0xA, 0));
    assert!(path.exists());
    let gen = keys(&lu).0;
    drop(lu);
    let lu = new_lu(&c);
    assert_eq!(keys(&lu), (gen, vec![0xB, 0xA]));
    assert_eq!(reservation(&lu), Some((0xA, WE_RO)));
    assert_eq!(prin(&lu, A, 2, 8).data[3], 0xB1, "PTPL_A");
    conflict(&exec(&lu, C, &write10(0, 1), &vec![0; BS as usize]));
    good(&exec(&lu, B, &write10(0, 1), &vec![0; BS as usize]));
    // The last registration with APTPL = 0 turns persistence off.
    good(&prout(&lu, B, REGISTER, 0, 0xB, 0xBB));
    assert!(!path.exists());
    drop(lu);
    let lu = new_lu(&c);
    assert_eq!(keys(&lu), (0, vec![]));
    // A corrupt state file stops the LU from starting.
    std::fs::write(&path, "garbage").unwrap();
    let e =
        LogicalUnit::new(Arc::new(MemBackend::new(BLOCKS * u64::from(BS))), c.clone()).unwrap_err();
    assert!(matches!(e, crate::LuError::PrState(_)), "{e}");
    drop(lu);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn registration_resources_are_bounded() {
    let lu = mem_lu();
    let names: Vec<String> = (0..=crate::pr::MAX_REGISTRATIONS)
        .map(|i| format!("iqn.x:{i},i,0x80000000{i:04x}"))
        .collect();
    let cdb = prout_cdb(REGISTER_AND_IGNORE, 0, 24);
    for (i, name) in names.iter().enumerate() {
        let data = wd(&params(0, 1 + i as u64, 0));
        let s = Command {
            cdb: &cdb,
            data_out: &data,
            nexus: NexusId(1000 + i as u64),
            relative_port: 1,
            tpg: 1,
            target_port_name: TARGET_A,
            initiator_port_name: name,
            expected_data_out: None,
            lus: None,
        };
        let o = lu.execute(&s);
        if i < crate::pr::MAX_REGISTRATIONS {
            good(&o);
        } else {
            sense(
                &o,
                SenseKey::IllegalRequest,
                Asc::INSUFFICIENT_REGISTRATION_RESOURCES,
            );
        }
    }
}

/// NVMe hosts (pr::host): one reservation state with the SCSI initiators.
#[test]
fn nvme_hosts_share_the_reservation() {
    use volume::reservations::{host_id_of, HostAction as H, HostRefusal as R, PrType};
    let lu = lu3();
    let (h1, h2) = ([1u8; 16], [2u8; 16]);
    let reg = |h: &[u8; 16], nrkey| lu.host_reservation(h, H::Register { nrkey, ptpl: None });
    assert!(!lu.reservations_active() && !lu.host_conflicts(&h1, true));
    assert_eq!(reg(&h1, 0), Err(R::InvalidField), "NRKEY 0");
    assert_eq!(reg(&h1, 0x1), Ok(()));
    assert_eq!(reg(&h1, 0x1), Ok(()), "again with its key: nothing");
    assert_eq!(
        reg(&h1, 0x9),
        Err(R::Conflict),
        "registered with another key"
    );
    assert_eq!(keys(&lu), (1, vec![0x1]));
    let ea = PrType::ExclusiveAccess;
    assert_eq!(
        lu.host_reservation(
            &h1,
            H::Acquire {
                crkey: 0x2,
                kind: ea
            }
        ),
        Err(R::Conflict),
        "wrong key"
    );
    assert_eq!(
        lu.host_reservation(
            &h1,
            H::Acquire {
                crkey: 0x1,
                kind: ea
            }
        ),
        Ok(())
    );
    assert_eq!(reservation(&lu), Some((0x1, EA)));
    // The NVMe holder keeps SCSI initiators and other hosts out.
    conflict(&exec(&lu, A, &read10(0, 1), &[]));
    assert!(lu.host_conflicts(&h2, false) && !lu.host_conflicts(&h1, true));
    // A SCSI initiator preempts the host; the host's access follows.
    register(&lu, A, 0xA);
    good(&prout(&lu, A, PREEMPT, WE, 0xA, 0x1));
    assert!(lu.host_conflicts(&h1, true) && !lu.host_conflicts(&h1, false));
    let rep = lu.host_reservation_report();
    assert_eq!(rep.kind, Some(PrType::WriteExclusive));
    assert_eq!(rep.registrants.len(), 1);
    assert_eq!(rep.registrants[0].host_id, host_id_of(INIT_1));
    assert!(rep.registrants[0].holds && rep.registrants[0].key == 0xA);
    // Register, unregister and replace.
    assert_eq!(reg(&h1, 0x2), Ok(()));
    let unreg = |h: &[u8; 16], crkey, iekey| {
        lu.host_reservation(
            h,
            H::Unregister {
                crkey,
                iekey,
                ptpl: None,
            },
        )
    };
    let replace = |h: &[u8; 16], crkey, nrkey, iekey| {
        lu.host_reservation(
            h,
            H::Replace {
                crkey,
                nrkey,
                iekey,
                ptpl: None,
            },
        )
    };
    assert_eq!(unreg(&h2, 0, true), Err(R::Conflict), "not registered");
    assert_eq!(replace(&h1, 0x7, 0x3, false), Err(R::Conflict), "wrong key");
    assert_eq!(replace(&h1, 0x7, 0x3, true), Ok(()), "IEKEY");
    assert_eq!(keys(&lu).1, vec![0xA, 0x3]);
    assert_eq!(replace(&h1, 0x3, 0, false), Ok(()), "new key 0 unregisters");
    assert_eq!(keys(&lu).1, vec![0xA]);
    assert_eq!(reg(&h1, 0x4), Ok(()));
    assert_eq!(unreg(&h1, 0x5, false), Err(R::Conflict));
    assert_eq!(unreg(&h1, 0x4, false), Ok(()));
    // Release by the SCSI holder's type only; a host's release with
    // another type than the reservation's is an invalid field.
    assert_eq!(reg(&h1, 0x5), Ok(()));
    good(&prout(&lu, A, RELEASE, WE, 0xA, 0));
    assert_eq!(
        lu.host_reservation(
            &h1,
            H::Acquire {
                crkey: 0x5,
                kind: PrType::WriteExclusiveAllRegistrants
            }
        ),
        Ok(())
    );
    assert_eq!(reservation(&lu), Some((0, WE_AR)));
    assert!(!lu.host_conflicts(&h1, true));
    assert_eq!(
        lu.host_reservation(
            &h1,
            H::Release {
                crkey: 0x5,
                kind: ea
            }
        ),
        Err(R::InvalidField)
    );
    // Clear: everything goes, and the SCSI registrant is told.
    assert_eq!(lu.host_reservation(&h1, H::Clear { crkey: 0x5 }), Ok(()));
    assert_eq!(reservation(&lu), None);
    assert_eq!(keys(&lu).1, Vec::<u64>::new());
    ua(&lu, A, Asc::RESERVATIONS_PREEMPTED);
    // Persist through power loss needs a state file.
    assert_eq!(
        lu.host_reservation(
            &h1,
            H::Register {
                nrkey: 1,
                ptpl: Some(true)
            }
        ),
        Err(R::InvalidField)
    );
}

#[test]
fn nvme_host_registrations_persist_with_ptpl() {
    use volume::reservations::{HostAction as H, PrType};
    let (dir, path, c) = with_state_file("host");
    let lu = new_lu(&c);
    let h = [7u8; 16];
    lu.host_reservation(
        &h,
        H::Register {
            nrkey: 0x77,
            ptpl: Some(true),
        },
    )
    .unwrap();
    lu.host_reservation(
        &h,
        H::Acquire {
            crkey: 0x77,
            kind: PrType::WriteExclusive,
        },
    )
    .unwrap();
    assert!(path.exists());
    drop(lu);
    let lu = new_lu(&c);
    let rep = lu.host_reservation_report();
    assert!(rep.ptpl && rep.kind == Some(PrType::WriteExclusive));
    assert_eq!(rep.registrants[0].host_id, h);
    assert!(!lu.host_conflicts(&h, true) && lu.host_conflicts(&[8; 16], true));
    conflict(&exec(&lu, A, &write10(0, 1), &vec![0; BS as usize]));
    drop(lu);
    std::fs::remove_dir_all(&dir).unwrap();
}
