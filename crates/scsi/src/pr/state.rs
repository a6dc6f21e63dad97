//! The persistent reservation state of one logical unit (SPC-4 §5.9.1):
//! registrations (one per registered I_T nexus, or per initiator port with
//! ALL_TG_PT), the reservation if any, the PRgeneration counter and the
//! APTPL setting. Pure data and queries; the service actions that change it
//! are in [`super::prout`].

/// A persistent reservation type (SPC-4 §6.16.3, table 211).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PrType {
    /// 1h: writes only by the holder; reads by anyone.
    WriteExclusive = 1,
    /// 3h: any access only by the holder.
    ExclusiveAccess = 3,
    /// 5h: writes only by registrants.
    WriteExclusiveRegistrantsOnly = 5,
    /// 6h: any access only by registrants.
    ExclusiveAccessRegistrantsOnly = 6,
    /// 7h: writes only by registrants, every registrant is a holder.
    WriteExclusiveAllRegistrants = 7,
    /// 8h: any access only by registrants, every registrant is a holder.
    ExclusiveAccessAllRegistrants = 8,
}

impl PrType {
    /// The type for a TYPE field value, `None` for reserved values.
    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => PrType::WriteExclusive,
            3 => PrType::ExclusiveAccess,
            5 => PrType::WriteExclusiveRegistrantsOnly,
            6 => PrType::ExclusiveAccessRegistrantsOnly,
            7 => PrType::WriteExclusiveAllRegistrants,
            8 => PrType::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    /// The TYPE field value.
    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    /// Every registrant is a reservation holder (types 7h and 8h).
    pub(crate) fn all_registrants(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveAllRegistrants | PrType::ExclusiveAccessAllRegistrants
        )
    }

    /// Registrants that are not the holder still have access (5h, 6h).
    pub(crate) fn registrants_only(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveRegistrantsOnly | PrType::ExclusiveAccessRegistrantsOnly
        )
    }

    /// Reads stay open to every I_T nexus (1h, 5h, 7h).
    pub(crate) fn write_exclusive(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusive
                | PrType::WriteExclusiveRegistrantsOnly
                | PrType::WriteExclusiveAllRegistrants
        )
    }
}

/// The I_T nexus a command came through, as reservations see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct It<'a> {
    /// iSCSI initiator port name, `iqn…,i,0x<ISID>`.
    pub initiator: &'a str,
    /// SCSI target port name, `iqn…,t,0x<TPGT>`.
    pub target: &'a str,
    /// Relative target port identifier of that target port.
    pub rel_port: u16,
}

/// One registration: an I_T nexus (or, with ALL_TG_PT, an initiator port
/// through every target port) and its reservation key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Registration {
    /// Initiator port name.
    pub initiator: String,
    /// Target port name; `None` when registered with ALL_TG_PT = 1.
    pub target: Option<String>,
    /// Relative target port identifier (0 with ALL_TG_PT).
    pub rel_port: u16,
    /// The reservation key, never 0.
    pub key: u64,
}

impl Registration {
    /// Whether this registration covers the I_T nexus `initiator`/`target`.
    pub(crate) fn covers(&self, initiator: &str, target: &str) -> bool {
        self.initiator.eq_ignore_ascii_case(initiator)
            && self
                .target
                .as_deref()
                .is_none_or(|t| t.eq_ignore_ascii_case(target))
    }
}

/// The I_T nexus holding a reservation that is not of an all-registrants
/// type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    pub initiator: String,
    pub target: String,
}

/// The persistent reservation, when one exists (scope is always LU_SCOPE).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reservation {
    pub kind: PrType,
    /// The holder; `None` for all-registrants types, whose holders are
    /// all registrants.
    pub holder: Option<Holder>,
}

/// Everything SPC-4 lets persist through power loss with APTPL = 1.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PrState {
    /// PRgeneration (SPC-4 §6.15.2).
    pub generation: u32,
    /// The last APTPL value received with a registration.
    pub aptpl: bool,
    pub regs: Vec<Registration>,
    pub res: Option<Reservation>,
}

impl PrState {
    /// The registration of the I_T nexus `it`.
    pub(crate) fn reg_of(&self, it: &It<'_>) -> Option<usize> {
        self.regs
            .iter()
            .position(|r| r.covers(it.initiator, it.target))
    }

    /// Whether `it` holds the reservation (SPC-4 §5.9.10).
    pub(crate) fn is_holder(&self, it: &It<'_>) -> bool {
        match &self.res {
            None => false,
            Some(r) => match &r.holder {
                None => self.reg_of(it).is_some(),
                Some(h) => {
                    h.initiator.eq_ignore_ascii_case(it.initiator)
                        && h.target.eq_ignore_ascii_case(it.target)
                }
            },
        }
    }

    /// Whether registration `i` is (or, with ALL_TG_PT, includes) a
    /// reservation holder.
    pub(crate) fn reg_holds(&self, i: usize) -> bool {
        match &self.res {
            None => false,
            Some(r) => match &r.holder {
                None => true,
                Some(h) => self.regs[i].covers(&h.initiator, &h.target),
            },
        }
    }

    /// The RESERVATION KEY READ RESERVATION reports: the holder's key, 0
    /// for all-registrants types (SPC-4 §6.15.3).
    pub(crate) fn holder_key(&self) -> u64 {
        match &self.res {
            Some(Reservation {
                holder: Some(h), ..
            }) => self
                .regs
                .iter()
                .find(|r| r.covers(&h.initiator, &h.target))
                .map_or(0, |r| r.key),
            _ => 0,
        }
    }

    /// Whether anything is registered or reserved.
    pub(crate) fn is_empty(&self) -> bool {
        self.regs.is_empty() && self.res.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_codes_round_trip() {
        for c in 0..16u8 {
            match PrType::from_code(c) {
                Some(t) => assert_eq!(t.code(), c),
                None => assert!(matches!(c, 0 | 2 | 4 | 9..=15)),
            }
        }
        let ar = PrType::ExclusiveAccessAllRegistrants;
        assert!(ar.all_registrants() && !ar.registrants_only() && !ar.write_exclusive());
        assert!(PrType::WriteExclusiveRegistrantsOnly.write_exclusive());
    }

    #[test]
    fn all_tg_pt_registration_covers_every_target_port() {
        let r = Registration {
            initiator: "iqn.a,i,0x01".into(),
            target: None,
            rel_port: 0,
            key: 1,
        };
        assert!(r.covers("IQN.A,i,0x01", "t1") && r.covers("iqn.a,i,0x01", "t2"));
        assert!(!r.covers("iqn.a,i,0x02", "t1"));
    }
}
