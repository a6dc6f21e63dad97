//! The reservation holders of a volume: registrations (one per registered
//! I_T nexus, or per initiator port through every target port), the
//! reservation if any and its holder, the generation counter and whether
//! the state persists through power loss. SPC-4 §5.9.1 (persistent
//! reservations) defines it; NVMe reservations (NVMe Base Specification
//! 2.0 §8.19) are the same model (registrants with keys, a holder, six
//! types with the same meaning under other codes), so both personalities
//! keep their registrants here. Pure data and queries: the service actions
//! that change it and their wire format are the personality's (the `scsi`
//! crate's `pr` module: PERSISTENT RESERVE IN/OUT and the APTPL file).

/// A reservation type, by its SPC-4 code (§6.16.3, table 211; NVMe numbers
/// the same six types 1h to 6h in this order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrType {
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
    pub fn from_code(code: u8) -> Option<Self> {
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
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Every registrant is a reservation holder (types 7h and 8h).
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveAllRegistrants | PrType::ExclusiveAccessAllRegistrants
        )
    }

    /// Registrants that are not the holder still have access (5h, 6h).
    pub fn registrants_only(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveRegistrantsOnly | PrType::ExclusiveAccessRegistrantsOnly
        )
    }

    /// Reads stay open to every I_T nexus (1h, 5h, 7h).
    pub fn write_exclusive(self) -> bool {
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
pub struct It<'a> {
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
pub struct Registration {
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
    pub fn covers(&self, initiator: &str, target: &str) -> bool {
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
pub struct Holder {
    pub initiator: String,
    pub target: String,
}

/// The persistent reservation, when one exists (scope is always LU_SCOPE).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub kind: PrType,
    /// The holder; `None` for all-registrants types, whose holders are
    /// all registrants.
    pub holder: Option<Holder>,
}

/// Everything SPC-4 lets persist through power loss with APTPL = 1.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrState {
    /// PRgeneration (SPC-4 §6.15.2).
    pub generation: u32,
    /// The last APTPL value received with a registration.
    pub aptpl: bool,
    pub regs: Vec<Registration>,
    pub res: Option<Reservation>,
}

impl PrState {
    /// The registration of the I_T nexus `it`.
    pub fn reg_of(&self, it: &It<'_>) -> Option<usize> {
        self.regs
            .iter()
            .position(|r| r.covers(it.initiator, it.target))
    }

    /// Whether `it` holds the reservation (SPC-4 §5.9.10).
    pub fn is_holder(&self, it: &It<'_>) -> bool {
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
    pub fn reg_holds(&self, i: usize) -> bool {
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
    pub fn holder_key(&self) -> u64 {
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
    pub fn is_empty(&self) -> bool {
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
