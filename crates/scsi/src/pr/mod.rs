//! Reservations: SPC-2 RESERVE / RELEASE and SPC-4 persistent reservations
//! (SPC-4 §5.9, PERSISTENT RESERVE IN §6.15, PERSISTENT RESERVE OUT §6.16).
//!
//! # Identity
//! Persistent reservations belong to I_T nexuses: an initiator port (the
//! iSCSI initiator port name `iqn…,i,0x<ISID>`, SPC-4 §7.6.4.6) through a
//! target port (`iqn…,t,0x<TPGT>`). They outlive sessions: a registration
//! made through a session stays when the session ends and applies to the
//! next session with the same initiator name, ISID and portal group. The
//! same initiator through two portals is two I_T nexuses; ALL_TG_PT = 1
//! registers the initiator port through every target port at once (one
//! registration record, reported with ALL_TG_PT = 1 by READ FULL STATUS).
//!
//! SPC-2 reservations belong to one session ([`NexusId`]) and end with it
//! ([`crate::LogicalUnit::nexus_lost`]), with a LOGICAL UNIT RESET or a target
//! reset ([`crate::LogicalUnit::reset`]); persistent ones survive all three.
//!
//! # Holder rules (SPC-4 §5.9.10)
//! ```text
//!                      RESERVE (registered, key matches)
//!   +--------------+ ---------------------------------> +--------------------+
//!   | not reserved |                                    | reserved, type T   |
//!   |              | <--------------------------------- | holder(s) below    |
//!   +--------------+  RELEASE by a holder (type = T)    +--------------------+
//!         ^           CLEAR by any registrant                 |   ^
//!         |           holder unregisters (T not AR)           |   | PREEMPT (holder's key):
//!         |           last registrant leaves (T AR)           |   | holder := preemptor,
//!         +---------------------------------------------------+   | type := new type
//!                                                                 |
//! ```
//!
//! | type            | holder(s)                       | others registered      | not registered          |
//! |-----------------|---------------------------------|------------------------|-------------------------|
//! | WE (1h)         | the reserving I_T nexus         | read only              | read only               |
//! | EA (3h)         | the reserving I_T nexus         | no access              | no access               |
//! | WE-RO (5h)      | the reserving I_T nexus         | full access            | read only               |
//! | EA-RO (6h)      | the reserving I_T nexus         | full access            | no access               |
//! | WE-AR (7h)      | every registrant                | (all are holders)      | read only               |
//! | EA-AR (8h)      | every registrant                | (all are holders)      | no access               |
//!
//! "read only" / "no access" follow the command classes of [`access`].
//! READ RESERVATION reports key 0 for the all-registrants types. When the
//! holder of a WE/EA/RO reservation unregisters, the reservation is
//! released (RO types: RESERVATIONS RELEASED to the other registrants);
//! an all-registrants reservation lasts while any registrant remains.
//!
//! # Unit attentions
//! | event                                   | condition                  | to                                       |
//! |-----------------------------------------|----------------------------|------------------------------------------|
//! | RELEASE of an RO/AR reservation         | RESERVATIONS RELEASED 2A/04| other registrants                        |
//! | RO holder unregisters                   | RESERVATIONS RELEASED 2A/04| other registrants                        |
//! | CLEAR                                   | RESERVATIONS PREEMPTED 2A/03 | other registrants                      |
//! | PREEMPT (AND ABORT) removes a registration | REGISTRATIONS PREEMPTED 2A/05 | each removed I_T nexus but the issuer |
//! | PREEMPT changes the type                | RESERVATIONS RELEASED 2A/04| remaining registrants but the issuer     |
//!
//! A condition for an I_T nexus goes to every live session ([`NexusId`])
//! of that nexus (ALL_TG_PT registrations: of that initiator port).
//!
//! # PREEMPT AND ABORT
//! The logical unit cannot abort tasks queued in the transport. It calls
//! the hook set with [`crate::LogicalUnit::set_preempt_abort_hook`] with the
//! sessions whose registrations were preempted, before the command
//! returns GOOD; the transport aborts their tasks for this logical unit
//! (as ABORT TASK SET would, without status).
//!
//! # What we report (REPORT CAPABILITIES)
//! CRH = 1 (SPC-4 §5.9.3: RESERVE/RELEASE from a persistent reservation
//! holder complete with GOOD and do nothing), SIP_C = 0 (SPEC_I_PT is
//! refused with INVALID FIELD IN PARAMETER LIST), ATP_C = 1, PTPL_C = 1
//! only when the logical unit has a state file (`LuConfig::pr_state`),
//! TMV = 1 with all six types, ALLOW COMMANDS = 011b.
//!
//! # NVMe hosts
//! The same logical unit served as an NVMe namespace keeps one reservation
//! state for both protocols ([`host`]): an NVMe host registers as the
//! initiator port `nvme-host:<Host Identifier>` through every target port
//! (as ALL_TG_PT = 1), and its Reservation Register / Acquire / Release
//! commands run the service actions above. A SCSI initiator sees NVMe
//! registrants in READ KEYS and READ FULL STATUS (TransportID format 00b
//! with that name); an NVMe host sees SCSI registrants in its Reservation
//! Report under a Host Identifier digested from their port names.

pub mod access;
mod host;
mod persist;
mod prin;
mod prout;
/// The holders themselves are the volume's ([`volume::reservations`]).
use volume::reservations as state;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::cdb::op;
use crate::lu::{Command, LogicalUnit, NexusId, Outcome};
use crate::sense::{Asc, Sense};
use crate::status;

pub(crate) use prin::persistent_reserve_in;
pub(crate) use prout::persistent_reserve_out;
use state::{It, PrState, Registration};

/// Most registrations one logical unit keeps (further ones get
/// INSUFFICIENT REGISTRATION RESOURCES).
pub const MAX_REGISTRATIONS: usize = 1024;
/// Longest PERSISTENT RESERVE OUT parameter list accepted: 24 bytes plus
/// one TransportID (REGISTER AND MOVE); longer lists are refused before
/// any data is solicited.
pub const MAX_PARAMETER_LIST: u32 = 24 + 4 + 1024;

/// Called with the sessions whose registrations a PREEMPT AND ABORT
/// removed; see the module docs.
pub type PreemptAbortHook = Arc<dyn Fn(&[NexusId]) + Send + Sync>;

/// A live session as reservations know it.
#[derive(Clone, Debug)]
struct Seen {
    initiator: String,
    target: String,
    rel_port: u16,
}

#[derive(Debug, Default)]
struct Inner {
    st: PrState,
    /// The SPC-2 reservation holder.
    spc2: Option<NexusId>,
    /// Every session that has sent a command, for unit attentions and to
    /// map relative target port identifiers to target ports.
    seen: HashMap<NexusId, Seen>,
}

impl Inner {
    fn seen_nexuses(&self, r: &Registration) -> impl Iterator<Item = NexusId> + '_ {
        let r = r.clone();
        self.seen
            .iter()
            .filter(move |(_, s)| r.covers(&s.initiator, &s.target))
            .map(|(n, _)| *n)
    }
}

/// The reservation state of one logical unit.
pub(crate) struct Reservations {
    inner: Mutex<Inner>,
    /// True while anything is reserved or registered: commands then take
    /// the lock to check for conflicts; otherwise they do not.
    active: AtomicBool,
    path: Option<PathBuf>,
    abort_hook: OnceLock<PreemptAbortHook>,
}

impl std::fmt::Debug for Reservations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservations")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// RESERVATION CONFLICT, without sense data.
pub(crate) fn conflict() -> Outcome {
    Outcome {
        status: status::RESERVATION_CONFLICT,
        sense: None,
        data: bytes::Bytes::new(),
        more: Vec::new(),
        sums: Default::default(),
    }
}

impl Reservations {
    /// The state of a logical unit, loaded from `path` when given (an
    /// absent file is a fresh state).
    pub(crate) fn open(path: Option<PathBuf>) -> Result<Self, String> {
        let st = match &path {
            Some(p) => persist::load(p).map_err(|e| format!("{}: {e}", p.display()))?,
            None => PrState::default(),
        };
        let active = !st.is_empty();
        Ok(Reservations {
            inner: Mutex::new(Inner {
                st,
                ..Inner::default()
            }),
            active: AtomicBool::new(active),
            path,
            abort_hook: OnceLock::new(),
        })
    }

    /// Whether APTPL can be honoured (a state file is configured).
    pub(crate) fn can_persist(&self) -> bool {
        self.path.is_some()
    }

    pub(crate) fn set_abort_hook(&self, hook: PreemptAbortHook) -> bool {
        self.abort_hook.set(hook).is_ok()
    }

    fn update_active(&self, inner: &Inner) {
        let on = inner.spc2.is_some() || !inner.st.is_empty();
        self.active.store(on, Ordering::Release);
    }

    /// Records the I_T nexus identity of session `n` (first command of a
    /// session, and every reservation command).
    pub(crate) fn note(&self, cmd: &Command<'_>) {
        let mut inner = self.inner.lock();
        note_locked(&mut inner, cmd);
    }

    /// The session `n` ended: its SPC-2 reservation is released; its
    /// persistent registrations stay (they belong to the I_T nexus).
    pub(crate) fn nexus_lost(&self, n: NexusId) {
        let mut inner = self.inner.lock();
        inner.seen.remove(&n);
        if inner.spc2 == Some(n) {
            inner.spc2 = None;
        }
        self.update_active(&inner);
    }

    /// LOGICAL UNIT RESET or target reset: the SPC-2 reservation is
    /// released (SPC-2 §5.5.1); persistent reservations are not affected.
    pub(crate) fn reset(&self) {
        let mut inner = self.inner.lock();
        inner.spc2 = None;
        self.update_active(&inner);
    }

    /// RESERVATION CONFLICT for a command that a reservation held by
    /// another I_T nexus does not allow (see [`access`]); `None` lets it
    /// run. Lock-free while nothing is reserved or registered. PERSISTENT
    /// RESERVE IN/OUT and RESERVE/RELEASE are checked by their handlers.
    #[inline]
    pub(crate) fn check(&self, cmd: &Command<'_>, cdb: &[u8]) -> Option<Outcome> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        if is_reservation_opcode(cdb[0]) {
            return None;
        }
        let inner = self.inner.lock();
        if let Some(h) = inner.spc2 {
            return (h != cmd.nexus && !access::spc2_allowed(cdb)).then(conflict);
        }
        inner.st.res.as_ref()?;
        denied(&inner.st, &it_of(cmd), access::classify(cdb)).then(conflict)
    }

    /// RESERVE(6) / RESERVE(10) (SPC-2 §7.21, §7.22) with the SPC-4 §5.9.3
    /// exceptions (CRH = 1).
    fn reserve(&self, cmd: &Command<'_>) -> Outcome {
        let mut inner = self.inner.lock();
        note_locked(&mut inner, cmd);
        if let Some(o) = crh(&inner, cmd) {
            return o;
        }
        match inner.spc2 {
            Some(h) if h != cmd.nexus => conflict(),
            _ => {
                inner.spc2 = Some(cmd.nexus);
                self.update_active(&inner);
                Outcome::good()
            }
        }
    }

    /// RELEASE(6) / RELEASE(10) (SPC-2 §7.19, §7.20): releases this
    /// session's reservation; GOOD and nothing else for anyone else.
    fn release(&self, cmd: &Command<'_>) -> Outcome {
        let mut inner = self.inner.lock();
        note_locked(&mut inner, cmd);
        if let Some(o) = crh(&inner, cmd) {
            return o;
        }
        if inner.spc2 == Some(cmd.nexus) {
            inner.spc2 = None;
            self.update_active(&inner);
        }
        Outcome::good()
    }
}

/// Whether the persistent reservation of `st` denies `it` a command of
/// class `class` (the table of the module docs).
fn denied(st: &PrState, it: &It<'_>, class: access::Access) -> bool {
    let Some(res) = st.res.as_ref() else {
        return false;
    };
    if st.is_holder(it) || (res.kind.registrants_only() && st.reg_of(it).is_some()) {
        return false;
    }
    match class {
        access::Access::Allowed => false,
        access::Access::Read => !res.kind.write_exclusive(),
        access::Access::Write => true,
    }
}

fn note_locked(inner: &mut Inner, cmd: &Command<'_>) {
    if inner.seen.contains_key(&cmd.nexus) {
        return;
    }
    inner.seen.insert(
        cmd.nexus,
        Seen {
            initiator: cmd.initiator_port_name.to_owned(),
            target: cmd.target_port_name.to_owned(),
            rel_port: cmd.relative_port,
        },
    );
}

/// The SPC-4 §5.9.3 rules for RESERVE and RELEASE while persistent
/// reservations exist: GOOD without effect from a holder (or a registrant
/// of an RO/AR reservation), RESERVATION CONFLICT from anyone else while
/// any registration exists; `None` when SPC-2 processing applies.
fn crh(inner: &Inner, cmd: &Command<'_>) -> Option<Outcome> {
    let it = it_of(cmd);
    let st = &inner.st;
    if let Some(res) = &st.res {
        let registered = st.reg_of(&it).is_some();
        if st.is_holder(&it) || (registered && res.kind.registrants_only()) {
            return Some(Outcome::good());
        }
    }
    (!st.regs.is_empty()).then(conflict)
}

fn it_of<'a>(cmd: &Command<'a>) -> It<'a> {
    It {
        initiator: cmd.initiator_port_name,
        target: cmd.target_port_name,
        rel_port: cmd.relative_port,
    }
}

/// RESERVE(6) / RESERVE(10). RESERVE(10)'s third-party and long-ID forms
/// are not supported (INVALID FIELD IN CDB).
pub(crate) fn reserve(lu: &LogicalUnit, cmd: &Command<'_>, cdb: &[u8]) -> Outcome {
    if let Some(o) = third_party(cdb) {
        return o;
    }
    lu.pr.reserve(cmd)
}

/// RELEASE(6) / RELEASE(10).
pub(crate) fn release(lu: &LogicalUnit, cmd: &Command<'_>, cdb: &[u8]) -> Outcome {
    if let Some(o) = third_party(cdb) {
        return o;
    }
    lu.pr.release(cmd)
}

/// Refuses 3RDPTY and LONGID in RESERVE(10) / RELEASE(10).
fn third_party(cdb: &[u8]) -> Option<Outcome> {
    if cdb[0] == op::RESERVE_10 || cdb[0] == op::RELEASE_10 {
        if cdb[1] & 0x10 != 0 {
            return Some(Outcome::check(Sense::invalid_cdb(1, Some(4))));
        }
        if cdb[1] & 0x02 != 0 {
            return Some(Outcome::check(Sense::invalid_cdb(1, Some(1))));
        }
    }
    None
}

/// Unit attentions and aborts a persistent reservation change causes.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    /// (session, condition) pairs to establish.
    pub uas: Vec<(NexusId, Asc)>,
    /// Sessions whose tasks PREEMPT AND ABORT aborts.
    pub aborted: Vec<NexusId>,
}

/// The reservation commands (SPC-4 §5.13, SPC-2 RESERVE/RELEASE).
pub(crate) fn is_reservation_opcode(code: u8) -> bool {
    matches!(
        code,
        op::PERSISTENT_RESERVE_IN
            | op::PERSISTENT_RESERVE_OUT
            | op::RESERVE_6
            | op::RESERVE_10
            | op::RELEASE_6
            | op::RELEASE_10
    )
}
