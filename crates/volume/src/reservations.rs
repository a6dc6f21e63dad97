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

/// The initiator port name under which an NVMe host's registrations are
/// kept: NVMe Base 2.0 §8.19.1 makes a host, named by its 128-bit Host
/// Identifier, the registrant (one registration for every controller of
/// that host, the counterpart of an ALL_TG_PT registration).
pub fn nvme_host_port(host_id: &[u8; 16]) -> String {
    let mut s = String::with_capacity(NVME_HOST_PREFIX.len() + 32);
    s.push_str(NVME_HOST_PREFIX);
    for b in host_id {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The target port name of an NVMe host's I_T nexus as reservations see
/// it: one for every controller, so that a holder is the host whichever
/// controller it uses.
pub const NVME_TARGET_PORT: &str = "nvme";

const NVME_HOST_PREFIX: &str = "nvme-host:";

/// The Host Identifier an NVMe Reservation Report gives a registrant: the
/// NVMe host's own, and for a SCSI initiator port a stable 128-bit digest
/// of its name (two FNV-1a hashes), so each registrant has one.
pub fn host_id_of(initiator: &str) -> [u8; 16] {
    if let Some(hex) = initiator.strip_prefix(NVME_HOST_PREFIX) {
        let mut id = [0u8; 16];
        if hex.len() == 32
            && hex
                .as_bytes()
                .chunks_exact(2)
                .zip(id.iter_mut())
                .all(|(c, o)| {
                    std::str::from_utf8(c)
                        .ok()
                        .and_then(|c| u8::from_str_radix(c, 16).ok())
                        .map(|v| *o = v)
                        .is_some()
                })
        {
            return id;
        }
    }
    let fnv = |seed: u64| {
        let mut h = seed;
        for b in initiator.bytes() {
            h = (h ^ u64::from(b.to_ascii_lowercase())).wrapping_mul(0x0100_0000_01b3);
        }
        h
    };
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&fnv(0xcbf2_9ce4_8422_2325).to_be_bytes());
    id[8..].copy_from_slice(&fnv(0x8422_2325_cbf2_9ce4).to_be_bytes());
    id
}

/// The NVMe reservation type code (NVMe Base 2.0 §8.19, "Reservation
/// Type Encoding": 1h to 6h) of a type.
pub fn nvme_type_code(t: PrType) -> u8 {
    match t {
        PrType::WriteExclusive => 1,
        PrType::ExclusiveAccess => 2,
        PrType::WriteExclusiveRegistrantsOnly => 3,
        PrType::ExclusiveAccessRegistrantsOnly => 4,
        PrType::WriteExclusiveAllRegistrants => 5,
        PrType::ExclusiveAccessAllRegistrants => 6,
    }
}

/// The type of an NVMe RTYPE value, `None` for reserved values.
pub fn nvme_type(code: u8) -> Option<PrType> {
    Some(match code {
        1 => PrType::WriteExclusive,
        2 => PrType::ExclusiveAccess,
        3 => PrType::WriteExclusiveRegistrantsOnly,
        4 => PrType::ExclusiveAccessRegistrantsOnly,
        5 => PrType::WriteExclusiveAllRegistrants,
        6 => PrType::ExclusiveAccessAllRegistrants,
        _ => return None,
    })
}

/// A reservation command of an NVMe host (NVMe Base 2.0, I/O commands
/// "Reservation Register", "Reservation Acquire", "Reservation Release"),
/// decoded. A
/// `ptpl` of `Some` changes the persist-through-power-loss state (CPTPL
/// 10b: off, 11b: on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostAction {
    /// Register with `nrkey`; already registered with that key: nothing.
    Register {
        nrkey: u64,
        ptpl: Option<bool>,
    },
    Unregister {
        crkey: u64,
        iekey: bool,
        ptpl: Option<bool>,
    },
    /// A new key 0 unregisters, as Linux's block layer means it.
    Replace {
        crkey: u64,
        nrkey: u64,
        iekey: bool,
        ptpl: Option<bool>,
    },
    Acquire {
        crkey: u64,
        kind: PrType,
    },
    Preempt {
        crkey: u64,
        prkey: u64,
        kind: PrType,
        abort: bool,
    },
    Release {
        crkey: u64,
        kind: PrType,
    },
    Clear {
        crkey: u64,
    },
}

/// Why a host's reservation command was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostRefusal {
    /// Reservation Conflict (83h).
    Conflict,
    /// Invalid Field in Command.
    InvalidField,
    /// The state could not be stored (Internal Error).
    Internal,
}

/// One registrant as a Reservation Report lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRegistrant {
    pub host_id: [u8; 16],
    pub key: u64,
    /// Holds the reservation (every registrant, for all-registrants types).
    pub holds: bool,
}

/// What a Reservation Report tells.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostReport {
    pub generation: u32,
    pub kind: Option<PrType>,
    /// Persist through power loss is in force.
    pub ptpl: bool,
    pub registrants: Vec<HostRegistrant>,
}

impl HostReport {
    /// The report of `st`.
    pub fn of(st: &PrState) -> HostReport {
        HostReport {
            generation: st.generation,
            kind: st.res.as_ref().map(|r| r.kind),
            ptpl: st.aptpl,
            registrants: st
                .regs
                .iter()
                .enumerate()
                .map(|(i, r)| HostRegistrant {
                    host_id: host_id_of(&r.initiator),
                    key: r.key,
                    holds: st.reg_holds(i),
                })
                .collect(),
        }
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

    #[test]
    fn nvme_hosts_keep_their_identifier() {
        let id: [u8; 16] = core::array::from_fn(|i| i as u8 * 17);
        assert_eq!(host_id_of(&nvme_host_port(&id)), id);
        let a = host_id_of("iqn.a,i,0x01");
        assert_eq!(a, host_id_of("IQN.A,i,0x01"));
        assert_ne!(a, host_id_of("iqn.a,i,0x02"));
        for c in 0..8u8 {
            match nvme_type(c) {
                Some(t) => assert_eq!(nvme_type_code(t), c),
                None => assert!(c == 0 || c == 7),
            }
        }
    }
}
