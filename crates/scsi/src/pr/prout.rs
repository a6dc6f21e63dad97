//! PERSISTENT RESERVE OUT (SPC-4 §6.16, behaviour in §5.9.5–§5.9.11):
//! REGISTER, REGISTER AND IGNORE EXISTING KEY, RESERVE, RELEASE, CLEAR,
//! PREEMPT, PREEMPT AND ABORT, REGISTER AND MOVE.
//!
//! Each service action is applied to a copy of the state; the copy is
//! written to the state file (when APTPL is or was in force) and only then
//! replaces the live state, so a failed write changes nothing and never
//! answers GOOD. Unit attentions are established after the change, before
//! the command returns.
//!
//! The PRgeneration is incremented by every REGISTER, REGISTER AND IGNORE
//! EXISTING KEY, CLEAR, PREEMPT, PREEMPT AND ABORT and REGISTER AND MOVE
//! that completes with GOOD, never by RESERVE and RELEASE (SPC-4 §6.15.2).

use super::state::{Holder, It, PrState, PrType, Registration, Reservation};
use super::{conflict, it_of, note_locked, persist, Effects, Inner, MAX_PARAMETER_LIST};
use super::{PreemptAbortHook, MAX_REGISTRATIONS};
use crate::cdb::{be16, be32};
use crate::lu::{Command, LogicalUnit, NexusId, Outcome};
use crate::sense::{Asc, Sense, SenseKey};

const REGISTER: u8 = 0x00;
const RESERVE: u8 = 0x01;
const RELEASE: u8 = 0x02;
const CLEAR: u8 = 0x03;
const PREEMPT: u8 = 0x04;
const PREEMPT_AND_ABORT: u8 = 0x05;
const REGISTER_AND_IGNORE: u8 = 0x06;
const REGISTER_AND_MOVE: u8 = 0x07;

/// The basic parameter list (SPC-4 §6.16.4), 24 bytes.
#[derive(Debug)]
pub(super) struct Basic {
    pub key: u64,
    pub sa_key: u64,
    pub all_tg_pt: bool,
    pub aptpl: bool,
}

/// The REGISTER AND MOVE parameter list (SPC-4 §6.16.5).
#[derive(Debug)]
struct Move {
    key: u64,
    sa_key: u64,
    unreg: bool,
    aptpl: bool,
    rel_port: u16,
    /// The destination initiator port name (from the TransportID).
    initiator: String,
}

fn plle() -> Sense {
    Sense::new(SenseKey::IllegalRequest, Asc::PARAMETER_LIST_LENGTH_ERROR)
}

fn be64(d: &[u8], i: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[i..i + 8]);
    u64::from_be_bytes(b)
}

/// The parameter list the CDB announces, all of it received.
fn param_list<'a>(cdb: &[u8], data: &'a [u8]) -> Result<&'a [u8], Sense> {
    let plen = be32(cdb, 5);
    if plen > MAX_PARAMETER_LIST {
        return Err(plle());
    }
    let plen = plen as usize;
    if data.len() < plen {
        return Err(plle());
    }
    Ok(&data[..plen])
}

/// Decodes and checks the basic parameter list.
fn basic(data: &[u8], sa: u8, can_persist: bool) -> Result<Basic, Sense> {
    if data.len() >= 24 && data[20] & 0x08 != 0 {
        // SPEC_I_PT: not supported (SIP_C = 0).
        return Err(Sense::invalid_param(20, Some(3)));
    }
    if data.len() != 24 {
        return Err(plle());
    }
    let registering = sa == REGISTER || sa == REGISTER_AND_IGNORE;
    let aptpl = registering && data[20] & 0x01 != 0;
    if aptpl && !can_persist {
        return Err(Sense::invalid_param(20, Some(0)));
    }
    Ok(Basic {
        key: be64(data, 0),
        sa_key: be64(data, 8),
        all_tg_pt: registering && data[20] & 0x04 != 0,
        aptpl,
    })
}

/// Decodes and checks the REGISTER AND MOVE parameter list, including
/// the iSCSI TransportID (SPC-4 §7.6.4.6; format 01b, which names an
/// initiator port, is required).
fn register_and_move_params(data: &[u8], can_persist: bool) -> Result<Move, Sense> {
    if data.len() < 24 {
        return Err(plle());
    }
    let tid_len = be32(data, 20) as usize;
    if tid_len > data.len() - 24 {
        return Err(plle());
    }
    let tid = &data[24..24 + tid_len];
    if tid.len() < 24 {
        return Err(Sense::invalid_param(20, None));
    }
    if tid[0] & 0x0F != 0x05 {
        return Err(Sense::invalid_param(24, Some(3))); // PROTOCOL IDENTIFIER
    }
    if tid[0] >> 6 != 0x01 {
        return Err(Sense::invalid_param(24, Some(7))); // FORMAT CODE
    }
    let add = usize::from(be16(tid, 2));
    if add > tid.len() - 4 {
        return Err(Sense::invalid_param(26, None));
    }
    let raw = &tid[4..4 + add];
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let name = std::str::from_utf8(&raw[..end])
        .ok()
        .filter(|s| s.bytes().all(|b| b.is_ascii_graphic()))
        .filter(|s| {
            s.find(",i,0x")
                .is_some_and(|i| i > 0 && s.len() > i + 5 && s.len() <= i + 5 + 12)
        })
        .ok_or(Sense::invalid_param(28, None))?;
    let aptpl = data[17] & 0x01 != 0;
    if aptpl && !can_persist {
        return Err(Sense::invalid_param(17, Some(0)));
    }
    Ok(Move {
        key: be64(data, 0),
        sa_key: be64(data, 8),
        unreg: data[17] & 0x02 != 0,
        aptpl,
        rel_port: be16(data, 18),
        initiator: name.to_owned(),
    })
}

/// PERSISTENT RESERVE OUT; `cdb` is at least 10 bytes.
pub(crate) fn persistent_reserve_out(lu: &LogicalUnit, cmd: &Command<'_>, cdb: &[u8]) -> Outcome {
    match run(lu, cmd, cdb) {
        Ok(fx) => {
            take_effect(lu, fx);
            Outcome::good()
        }
        Err(o) => o,
    }
}

/// Establishes the unit attentions of a change and aborts the tasks of
/// the sessions it preempted (after the state lock is released).
pub(super) fn take_effect(lu: &LogicalUnit, fx: Effects) {
    for (n, code) in fx.uas {
        lu.ua.establish(n, code);
    }
    if !fx.aborted.is_empty() {
        if let Some(hook) = lu.pr.abort_hook.get() {
            let hook: &PreemptAbortHook = hook;
            hook(&fx.aborted);
        }
    }
}

/// Makes `next` the live state: written to the state file first when
/// APTPL is or was in force, so a failed write changes nothing.
pub(super) fn commit(
    pr: &super::Reservations,
    inner: &mut Inner,
    next: PrState,
) -> Result<(), Outcome> {
    if let Some(path) = &pr.path {
        if (next.aptpl || inner.st.aptpl) && next != inner.st {
            if let Err(e) = persist::store(path, &next) {
                let _ = e; // reported as a failure of the command; state unchanged
                return Err(Outcome::check(Sense::new(
                    SenseKey::HardwareError,
                    Asc::INTERNAL_TARGET_FAILURE,
                )));
            }
        }
    }
    inner.st = next;
    pr.update_active(inner);
    Ok(())
}

fn run(lu: &LogicalUnit, cmd: &Command<'_>, cdb: &[u8]) -> Result<Effects, Outcome> {
    let check = |s: Sense| Outcome::check(s);
    let sa = cdb[1] & 0x1F;
    if sa > REGISTER_AND_MOVE {
        return Err(check(Sense::invalid_cdb(1, Some(4))));
    }
    let kind = if matches!(sa, RESERVE | RELEASE | PREEMPT | PREEMPT_AND_ABORT) {
        if cdb[2] >> 4 != 0 {
            return Err(check(Sense::invalid_cdb(2, Some(7)))); // SCOPE: LU_SCOPE only
        }
        match PrType::from_code(cdb[2] & 0x0F) {
            Some(t) => Some(t),
            None => return Err(check(Sense::invalid_cdb(2, Some(3)))),
        }
    } else {
        None
    };
    let data = param_list(cdb, cmd.data()).map_err(check)?;
    let can_persist = lu.pr.can_persist();
    let it = it_of(cmd);
    let pr = &lu.pr;
    let mut inner = pr.inner.lock();
    note_locked(&mut inner, cmd);
    if inner.spc2.is_some() {
        // SPC-2 §5.5.1: PERSISTENT RESERVE OUT conflicts with an SPC-2
        // reservation, whoever holds it.
        return Err(conflict());
    }
    let mut next = inner.st.clone();
    let n = cmd.nexus;
    let fx = if sa == REGISTER_AND_MOVE {
        let p = register_and_move_params(data, can_persist).map_err(check)?;
        register_and_move(&mut next, &inner, &it, &p)?
    } else {
        let p = basic(data, sa, can_persist).map_err(check)?;
        let t = kind.unwrap_or(PrType::WriteExclusive);
        match sa {
            REGISTER => register(&mut next, &inner, &it, n, &p, false)?,
            REGISTER_AND_IGNORE => register(&mut next, &inner, &it, n, &p, true)?,
            RESERVE => reserve(&mut next, &it, p.key, t)?,
            RELEASE => release(&mut next, &inner, &it, n, p.key, t)?,
            CLEAR => clear(&mut next, &inner, &it, n, p.key)?,
            _ => preempt(&mut next, &inner, &it, n, &p, t, sa == PREEMPT_AND_ABORT)?,
        }
    };
    commit(pr, &mut inner, next)?;
    Ok(fx)
}

/// The registration of `it` whose key is `key`, else RESERVATION CONFLICT
/// (SPC-4 §5.9.11.1: unregistered nexuses and wrong keys conflict).
fn registered(st: &PrState, it: &It<'_>, key: u64) -> Result<usize, Outcome> {
    match st.reg_of(it) {
        Some(i) if st.regs[i].key == key => Ok(i),
        _ => Err(conflict()),
    }
}

/// Establishes `code` for every live session of `reg` but the issuer.
fn ua_to(inner: &Inner, reg: &Registration, code: Asc, fx: &mut Effects, issuer: NexusId) {
    for n in inner.seen_nexuses(reg) {
        if n != issuer && !fx.uas.contains(&(n, code)) {
            fx.uas.push((n, code));
        }
    }
}

fn bump(st: &mut PrState) {
    st.generation = st.generation.wrapping_add(1);
}

/// REGISTER and REGISTER AND IGNORE EXISTING KEY (SPC-4 §5.9.7, tables
/// 53 and 54).
pub(super) fn register(
    st: &mut PrState,
    inner: &Inner,
    it: &It<'_>,
    n: NexusId,
    p: &Basic,
    ignore: bool,
) -> Result<Effects, Outcome> {
    let mut fx = Effects::default();
    match st.reg_of(it) {
        None => {
            if !ignore && p.key != 0 {
                return Err(conflict());
            }
            if p.sa_key != 0 {
                if st.regs.len() >= MAX_REGISTRATIONS {
                    return Err(Outcome::check(Sense::new(
                        SenseKey::IllegalRequest,
                        Asc::INSUFFICIENT_REGISTRATION_RESOURCES,
                    )));
                }
                if p.all_tg_pt
                    && st
                        .regs
                        .iter()
                        .any(|r| r.initiator.eq_ignore_ascii_case(it.initiator))
                {
                    // The initiator port is registered through another
                    // target port already.
                    return Err(conflict());
                }
                st.regs.push(Registration {
                    initiator: it.initiator.to_owned(),
                    target: (!p.all_tg_pt).then(|| it.target.to_owned()),
                    rel_port: if p.all_tg_pt { 0 } else { it.rel_port },
                    key: p.sa_key,
                });
                st.aptpl = p.aptpl;
            }
        }
        Some(i) => {
            if !ignore && p.key != st.regs[i].key {
                return Err(conflict());
            }
            if p.sa_key == 0 {
                unregister(st, inner, i, n, &mut fx);
            } else {
                st.regs[i].key = p.sa_key;
            }
            st.aptpl = p.aptpl;
        }
    }
    bump(st);
    Ok(fx)
}

/// Removes registration `i`; a holder that unregisters releases its
/// reservation (SPC-4 §5.9.11.2), an all-registrants reservation ends
/// with its last registrant.
fn unregister(st: &mut PrState, inner: &Inner, i: usize, n: NexusId, fx: &mut Effects) {
    let reg = st.regs.remove(i);
    let Some(res) = st.res.clone() else { return };
    match &res.holder {
        None => {
            if st.regs.is_empty() {
                st.res = None;
            }
        }
        Some(h) if reg.covers(&h.initiator, &h.target) => {
            st.res = None;
            if res.kind.registrants_only() {
                for r in &st.regs {
                    ua_to(inner, r, Asc::RESERVATIONS_RELEASED, fx, n);
                }
            }
        }
        Some(_) => {}
    }
}

/// RESERVE (SPC-4 §5.9.9).
pub(super) fn reserve(
    st: &mut PrState,
    it: &It<'_>,
    key: u64,
    kind: PrType,
) -> Result<Effects, Outcome> {
    registered(st, it, key)?;
    match &st.res {
        None => {
            st.res = Some(Reservation {
                kind,
                holder: (!kind.all_registrants()).then(|| Holder {
                    initiator: it.initiator.to_owned(),
                    target: it.target.to_owned(),
                }),
            });
        }
        // The holder reserving again with the same type: nothing to do.
        Some(r) if r.kind == kind && st.is_holder(it) => {}
        Some(_) => return Err(conflict()),
    }
    Ok(Effects::default())
}

/// RELEASE (SPC-4 §5.9.11.2).
pub(super) fn release(
    st: &mut PrState,
    inner: &Inner,
    it: &It<'_>,
    n: NexusId,
    key: u64,
    kind: PrType,
) -> Result<Effects, Outcome> {
    registered(st, it, key)?;
    let mut fx = Effects::default();
    let Some(res) = st.res.clone() else {
        return Ok(fx);
    };
    if !st.is_holder(it) {
        return Ok(fx);
    }
    if res.kind != kind {
        return Err(Outcome::check(Sense::new(
            SenseKey::IllegalRequest,
            Asc::INVALID_RELEASE_OF_PERSISTENT_RESERVATION,
        )));
    }
    st.res = None;
    if res.kind.registrants_only() || res.kind.all_registrants() {
        for r in &st.regs {
            ua_to(inner, r, Asc::RESERVATIONS_RELEASED, &mut fx, n);
        }
    }
    Ok(fx)
}

/// CLEAR (SPC-4 §5.9.11.6).
pub(super) fn clear(
    st: &mut PrState,
    inner: &Inner,
    it: &It<'_>,
    n: NexusId,
    key: u64,
) -> Result<Effects, Outcome> {
    registered(st, it, key)?;
    let mut fx = Effects::default();
    for r in &st.regs {
        ua_to(inner, r, Asc::RESERVATIONS_PREEMPTED, &mut fx, n);
    }
    st.regs.clear();
    st.res = None;
    bump(st);
    Ok(fx)
}

/// PREEMPT and PREEMPT AND ABORT (SPC-4 §5.9.11.4, §5.9.11.5).
pub(super) fn preempt(
    st: &mut PrState,
    inner: &Inner,
    it: &It<'_>,
    n: NexusId,
    p: &Basic,
    kind: PrType,
    abort: bool,
) -> Result<Effects, Outcome> {
    let me = registered(st, it, p.key)?;
    let mut fx = Effects::default();
    let old = st.res.clone();
    // §5.9.11.4.3: the SERVICE ACTION RESERVATION KEY names the holder (or
    // is 0 with an all-registrants reservation): the reservation moves.
    let takes_reservation = match &old {
        Some(r) if r.kind.all_registrants() => p.sa_key == 0,
        Some(_) => p.sa_key != 0 && st.holder_key() == p.sa_key,
        None => false,
    };
    if !takes_reservation && p.sa_key == 0 {
        return Err(Outcome::check(Sense::invalid_param(8, None)));
    }
    let mut removed = Vec::new();
    let mut kept = Vec::new();
    for (j, r) in std::mem::take(&mut st.regs).into_iter().enumerate() {
        let named = p.sa_key == 0 || r.key == p.sa_key;
        // The issuer keeps its registration when it takes the reservation.
        if named && !(takes_reservation && j == me) {
            removed.push(r);
        } else {
            kept.push(r);
        }
    }
    st.regs = kept;
    if takes_reservation {
        st.res = Some(Reservation {
            kind,
            holder: (!kind.all_registrants()).then(|| Holder {
                initiator: it.initiator.to_owned(),
                target: it.target.to_owned(),
            }),
        });
        if old.as_ref().is_some_and(|r| r.kind != kind) {
            for r in &st.regs {
                ua_to(inner, r, Asc::RESERVATIONS_RELEASED, &mut fx, n);
            }
        }
    } else {
        // §5.9.11.4.4: only registrations are removed.
        if removed.is_empty() {
            return Err(conflict());
        }
        let holder_gone = match &st.res {
            Some(r) => match &r.holder {
                None => st.regs.is_empty(),
                Some(h) => !st.regs.iter().any(|x| x.covers(&h.initiator, &h.target)),
            },
            None => false,
        };
        if holder_gone {
            st.res = None;
        }
    }
    for r in &removed {
        ua_to(inner, r, Asc::REGISTRATIONS_PREEMPTED, &mut fx, n);
        if abort {
            for x in inner.seen_nexuses(r) {
                if x != n && !fx.aborted.contains(&x) {
                    fx.aborted.push(x);
                }
            }
        }
    }
    bump(st);
    Ok(fx)
}

/// REGISTER AND MOVE (SPC-4 §5.9.8): the holder of a reservation that is
/// not of an all-registrants type hands it to another I_T nexus, which is
/// registered with the SERVICE ACTION RESERVATION KEY if it was not.
fn register_and_move(
    st: &mut PrState,
    inner: &Inner,
    it: &It<'_>,
    p: &Move,
) -> Result<Effects, Outcome> {
    let me = registered(st, it, p.key)?;
    let Some(res) = st.res.clone() else {
        return Err(conflict());
    };
    if res.kind.all_registrants() || !st.is_holder(it) {
        return Err(conflict());
    }
    if p.sa_key == 0 {
        return Err(Outcome::check(Sense::invalid_param(8, None)));
    }
    // The destination target port, by relative target port identifier.
    let target = if p.rel_port == it.rel_port {
        Some(it.target.to_owned())
    } else {
        inner
            .seen
            .values()
            .find(|s| s.rel_port == p.rel_port)
            .map(|s| s.target.clone())
            .or_else(|| {
                st.regs
                    .iter()
                    .find(|r| r.rel_port == p.rel_port)
                    .and_then(|r| r.target.clone())
            })
    };
    let Some(target) = target else {
        return Err(Outcome::check(Sense::invalid_param(18, None)));
    };
    if st.regs[me].covers(&p.initiator, &target) {
        // The destination is the issuing I_T nexus (or covered by its
        // ALL_TG_PT registration).
        return Err(Outcome::check(Sense::invalid_param(24, None)));
    }
    if !st.regs.iter().any(|r| r.covers(&p.initiator, &target)) {
        if st.regs.len() >= MAX_REGISTRATIONS {
            return Err(Outcome::check(Sense::new(
                SenseKey::IllegalRequest,
                Asc::INSUFFICIENT_REGISTRATION_RESOURCES,
            )));
        }
        st.regs.push(Registration {
            initiator: p.initiator.clone(),
            target: Some(target.clone()),
            rel_port: p.rel_port,
            key: p.sa_key,
        });
    }
    st.res = Some(Reservation {
        kind: res.kind,
        holder: Some(Holder {
            initiator: p.initiator.clone(),
            target,
        }),
    });
    if p.unreg {
        st.regs.remove(me);
    }
    st.aptpl = p.aptpl;
    bump(st);
    Ok(Effects::default())
}
