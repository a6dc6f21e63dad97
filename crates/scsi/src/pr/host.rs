//! Reservations taken by NVMe hosts (NVMe Base 2.0 §8.19 "Reservations";
//! the I/O commands "Reservation Register", "Reservation Acquire",
//! "Reservation Release" and "Reservation Report"), kept in the logical
//! unit's one reservation state beside the SCSI initiators' (module docs
//! of [`super`], "NVMe hosts").
//!
//! NVMe's model is SPC-4's with other codes, so each NVMe action is the
//! SPC-4 service action with the same effect, run on the same state under
//! the same lock, stored the same way:
//!
//! | NVMe                                   | SPC-4 service action                      |
//! |----------------------------------------|-------------------------------------------|
//! | Register (RREGA 000b), not registered  | REGISTER AND IGNORE EXISTING KEY, ALL_TG_PT |
//! | Register, registered with NRKEY        | nothing (Success)                         |
//! | Register, registered with another key  | Reservation Conflict                      |
//! | Unregister (001b)                      | REGISTER with SERVICE ACTION KEY 0        |
//! | Replace (010b), NRKEY ≠ 0              | REGISTER with the new key                 |
//! | Replace, NRKEY = 0                     | REGISTER with key 0: unregisters, as Linux's block layer means it |
//! | Acquire (RACQA 000b)                   | RESERVE                                   |
//! | Preempt / Preempt and Abort (001b/010b)| PREEMPT / PREEMPT AND ABORT               |
//! | Release (RRELA 000b)                   | RELEASE (a type mismatch: Invalid Field)  |
//! | Clear (001b)                           | CLEAR                                     |
//!
//! Unregister and Replace by an unregistered host, or with a CRKEY that is
//! not its key (IEKEY 0), conflict. IEKEY is refused on Acquire and
//! Release (Invalid Field), as Linux's nvmet refuses it. CPTPL 11b (persist
//! through power loss) needs the logical unit's state file, as APTPL does.
//!
//! SCSI initiators affected by an NVMe host's action get the unit
//! attentions of the table in [`super`]; a PREEMPT AND ABORT aborts their
//! tasks through the same hook. NVMe hosts get no reservation notices (the
//! Reservation Notification log page is not served, and Identify does not
//! claim it); their commands already running when they are preempted
//! complete, later ones conflict.

use super::prout::{clear, commit, preempt, register, release, reserve, take_effect, Basic};
use super::state::{nvme_host_port, HostAction, HostRefusal, HostReport, It, NVME_TARGET_PORT};
use super::{access, denied};
use crate::lu::{LogicalUnit, NexusId, Outcome};
use crate::sense::SenseKey;
use crate::status;

use std::sync::atomic::Ordering;

/// The issuer of an NVMe host's action where the SPC-4 code names a
/// session (to spare it unit attentions): no session has this number.
const NVME_ISSUER: NexusId = NexusId(u64::MAX);

/// The refusal of an SPC-4 service action's outcome.
fn refusal(o: Outcome) -> HostRefusal {
    if o.status == status::RESERVATION_CONFLICT {
        return HostRefusal::Conflict;
    }
    match o.sense {
        Some(s) if s.key == SenseKey::HardwareError => HostRefusal::Internal,
        _ => HostRefusal::InvalidField,
    }
}

impl LogicalUnit {
    /// Whether anything is registered or reserved (one atomic load): while
    /// not, no command of any host conflicts.
    #[inline]
    pub fn reservations_active(&self) -> bool {
        self.pr.active.load(Ordering::Acquire)
    }

    /// Whether persist through power loss can be honoured (the logical
    /// unit has a reservation state file).
    pub fn reservations_persist(&self) -> bool {
        self.pr.can_persist()
    }

    /// Whether a reservation denies the NVMe host `host_id` a command of
    /// the write group (Write, Write Zeroes, Dataset Management, Flush) or,
    /// with `write` false, of the read group (Read, Compare) (NVMe Base
    /// 2.0 §8.19, "Command Behavior in the Presence of a Reservation", the
    /// same table as SPC-4's).
    pub fn host_conflicts(&self, host_id: &[u8; 16], write: bool) -> bool {
        if !self.reservations_active() {
            return false;
        }
        let port = nvme_host_port(host_id);
        let it = host_it(&port);
        let inner = self.pr.inner.lock();
        if inner.spc2.is_some() {
            // An SPC-2 reservation is a SCSI session's: nothing else runs.
            return true;
        }
        let class = if write {
            access::Access::Write
        } else {
            access::Access::Read
        };
        denied(&inner.st, &it, class)
    }

    /// Runs an NVMe host's reservation action.
    pub fn host_reservation(&self, host_id: &[u8; 16], act: HostAction) -> Result<(), HostRefusal> {
        let port = nvme_host_port(host_id);
        let it = host_it(&port);
        let ptpl = match act {
            HostAction::Register { ptpl, .. }
            | HostAction::Unregister { ptpl, .. }
            | HostAction::Replace { ptpl, .. } => ptpl,
            _ => None,
        };
        if ptpl == Some(true) && !self.pr.can_persist() {
            return Err(HostRefusal::InvalidField);
        }
        let pr = &self.pr;
        let mut inner = pr.inner.lock();
        if inner.spc2.is_some() {
            return Err(HostRefusal::Conflict);
        }
        let mut next = inner.st.clone();
        let aptpl = ptpl.unwrap_or(inner.st.aptpl);
        let basic = |key, sa_key| Basic {
            key,
            sa_key,
            all_tg_pt: true,
            aptpl,
        };
        let mine = next.reg_of(&it).map(|i| next.regs[i].key);
        let n = NVME_ISSUER;
        let fx = match act {
            HostAction::Register { nrkey, .. } => {
                if nrkey == 0 {
                    return Err(HostRefusal::InvalidField);
                }
                match mine {
                    None => register(&mut next, &inner, &it, n, &basic(0, nrkey), true),
                    Some(k) if k == nrkey => {
                        next.aptpl = aptpl;
                        Ok(Default::default())
                    }
                    Some(_) => return Err(HostRefusal::Conflict),
                }
            }
            HostAction::Unregister { crkey, iekey, .. } => match mine {
                Some(k) if iekey || k == crkey => {
                    register(&mut next, &inner, &it, n, &basic(k, 0), false)
                }
                _ => return Err(HostRefusal::Conflict),
            },
            HostAction::Replace {
                crkey,
                nrkey,
                iekey,
                ..
            } => match mine {
                Some(k) if iekey || k == crkey => {
                    register(&mut next, &inner, &it, n, &basic(k, nrkey), false)
                }
                _ => return Err(HostRefusal::Conflict),
            },
            HostAction::Acquire { crkey, kind } => reserve(&mut next, &it, crkey, kind),
            HostAction::Preempt {
                crkey,
                prkey,
                kind,
                abort,
            } => preempt(&mut next, &inner, &it, n, &basic(crkey, prkey), kind, abort),
            HostAction::Release { crkey, kind } => release(&mut next, &inner, &it, n, crkey, kind),
            HostAction::Clear { crkey } => clear(&mut next, &inner, &it, n, crkey),
        }
        .map_err(refusal)?;
        commit(pr, &mut inner, next).map_err(refusal)?;
        drop(inner);
        take_effect(self, fx);
        Ok(())
    }

    /// What a Reservation Report tells of the state.
    pub fn host_reservation_report(&self) -> HostReport {
        HostReport::of(&self.pr.inner.lock().st)
    }
}

fn host_it(port: &str) -> It<'_> {
    It {
        initiator: port,
        target: NVME_TARGET_PORT,
        rel_port: 0,
    }
}
