//! The LUNs of each target, and the commands answered above any single LU:
//! REPORT LUNS (SPC-4 §6.33) and commands addressed to a LUN that does not
//! exist (SPC-4 §5.8.4: INQUIRY reports peripheral qualifier 011b, other
//! commands LOGICAL UNIT NOT SUPPORTED).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use iscsi_proto::session::{Completion, ExecRequest};
use iscsi_wire::pdu::Lun;
use scsi::{GroupSpec, LogicalUnit, LuConfig, NexusId, PortGroups, TargetLus};
use storage::{BlockBackend, FileBackend, MemBackend, NullBackend, WriteCache};

use crate::config::{BackendKind, CacheConfig, TargetConfig};

/// One target at run time.
pub struct TargetRt {
    pub name: String,
    pub alias: Option<String>,
    /// LUN n is `luns[n]`.
    pub luns: Arc<[Arc<LogicalUnit>]>,
}

/// The LUs of one target as a logical unit sees its siblings (EXTENDED
/// COPY sources and destinations, SET TARGET PORT GROUPS): every LU of the
/// session's target, which every initiator logged in to it may reach.
#[derive(Clone)]
pub struct LunSet(pub Arc<[Arc<LogicalUnit>]>);

impl std::fmt::Debug for LunSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LunSet({} LUs)", self.0.len())
    }
}

impl TargetLus for LunSet {
    fn by_naa(&self, naa: &[u8]) -> Option<Arc<LogicalUnit>> {
        self.0
            .iter()
            .find(|lu| lu.config().naa[..] == *naa)
            .cloned()
    }

    fn for_each_lu(&self, f: &mut dyn FnMut(&LogicalUnit)) {
        self.0.iter().for_each(|lu| f(lu));
    }
}

impl std::fmt::Debug for TargetRt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetRt")
            .field("name", &self.name)
            .field("luns", &self.luns.len())
            .finish()
    }
}

/// FNV-1a, 64 bits: a hash that is the same on every build and run, for
/// identifiers that must survive restarts.
fn fnv(seed: u64, parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for p in parts {
        for b in *p {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The NAA IEEE Registered Extended designator (SPC-4 §7.8.6.6.4) of LUN
/// `index` of `target`: NAA 6, then 124 bits derived from the names.
pub fn naa_for(target: &str, index: usize, serial: &str) -> [u8; 16] {
    let idx = index.to_be_bytes();
    let hi = fnv(1, &[target.as_bytes(), &idx, serial.as_bytes()]);
    let lo = fnv(2, &[target.as_bytes(), &idx, serial.as_bytes()]);
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&hi.to_be_bytes());
    b[8..].copy_from_slice(&lo.to_be_bytes());
    b[0] = 0x60 | (b[0] & 0x0f);
    b
}

/// The persistent reservation state file of LUN `index` of `target` in
/// `dir`: `<target>.lun<index>.pr`, with characters other than ASCII
/// letters, digits, `.`, `-` and `_` in the name replaced by `_`.
pub fn pr_state_file(dir: &Path, target: &str, index: usize) -> PathBuf {
    let safe: String = target
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("{safe}.lun{index}.pr"))
}

/// The default unit serial number of LUN `index` of `target`.
pub fn serial_for(target: &str, index: usize) -> String {
    format!(
        "{:016x}",
        fnv(3, &[target.as_bytes(), &index.to_be_bytes()])
    )
}

impl TargetRt {
    /// Opens every LUN's backend and builds its logical unit, with the
    /// ALUA target port groups `groups` (explicit ALUA if `explicit`); with
    /// `state_dir`, each LU keeps its persistent reservation state in
    /// [`pr_state_file`].
    pub fn build(
        cfg: &TargetConfig,
        groups: Vec<GroupSpec>,
        explicit: bool,
        state_dir: Option<&Path>,
    ) -> Result<TargetRt, String> {
        if let Some(d) = state_dir {
            std::fs::create_dir_all(d).map_err(|e| format!("state_dir {}: {e}", d.display()))?;
        }
        let port_groups = Arc::new(
            PortGroups::new(groups, explicit).map_err(|e| format!("target {}: {e}", cfg.name))?,
        );
        let mut luns = Vec::new();
        for (i, l) in cfg.lun.iter().enumerate() {
            let at = format!("target {} LUN {i}", cfg.name);
            let size = l.size_bytes().map_err(|e| format!("{at}: {e}"))?;
            let policy = match l.write_cache {
                CacheConfig::Through => WriteCache::WriteThrough,
                CacheConfig::Back => WriteCache::WriteBack,
            };
            let backend: Arc<dyn BlockBackend> = match l.backend {
                BackendKind::Mem => Arc::new(MemBackend::new(size.unwrap_or(0))),
                BackendKind::Null => Arc::new(NullBackend::new(size.unwrap_or(0))),
                BackendKind::File => {
                    let path = l.path.as_deref().ok_or_else(|| format!("{at}: no path"))?;
                    Arc::new(
                        FileBackend::open(path, size, policy)
                            .map_err(|e| format!("{at}: {}: {e}", path.display()))?,
                    )
                }
            };
            let serial = l.serial.clone().unwrap_or_else(|| serial_for(&cfg.name, i));
            let lu_cfg = LuConfig {
                block_size: l.block_size,
                naa: naa_for(&cfg.name, i, &serial),
                serial,
                vendor: "IRONSAN".into(),
                product: match l.backend {
                    BackendKind::Mem => "RAM DISK".into(),
                    BackendKind::Null => "NULL DISK".into(),
                    BackendKind::File => "FILE DISK".into(),
                },
                revision: "0001".into(),
                read_only: l.read_only,
                thin: l.thin,
                pr_state: state_dir.map(|d| pr_state_file(d, &cfg.name, i)),
            };
            let lu = LogicalUnit::new(backend, lu_cfg)
                .map_err(|e| format!("{at}: {e}"))?
                .with_port_groups(port_groups.clone());
            luns.push(Arc::new(lu));
        }
        Ok(TargetRt {
            name: cfg.name.clone(),
            alias: cfg.alias.clone(),
            luns: luns.into(),
        })
    }

    /// The logical unit at `lun`, if it exists.
    pub fn lu(&self, lun: Lun) -> Option<&Arc<LogicalUnit>> {
        lun.index().and_then(|i| self.luns.get(usize::from(i)))
    }
}

/// Where a command came from, for VPD 0x83 and per-nexus state.
#[derive(Clone, Debug)]
pub struct Origin {
    pub nexus: NexusId,
    pub relative_port: u16,
    pub tpg: u16,
    pub port_name: String,
    /// `initiator-name,i,0x<ISID>` of the session.
    pub initiator_port_name: String,
    /// The LUs of the session's target.
    pub lus: Option<LunSet>,
}

const ILLEGAL_REQUEST: u8 = 0x05;

fn sense(key: u8, asc: u8, ascq: u8) -> Bytes {
    let mut s = vec![0u8; 18];
    s[0] = 0x70;
    s[2] = key;
    s[7] = 10;
    s[12] = asc;
    s[13] = ascq;
    Bytes::from(s)
}

fn check(key: u8, asc: u8, ascq: u8) -> Completion {
    Completion {
        status: scsi::status::CHECK_CONDITION,
        sense: Some(sense(key, asc, ascq)),
        ..Completion::default()
    }
}

/// Runs `req` against `lu` and packs the outcome for the session.
pub fn run_on_lu(lu: &LogicalUnit, req: &ExecRequest, o: &Origin) -> Completion {
    let cmd = scsi::Command {
        cdb: req.cdb.as_slice(),
        data_out: &req.data_out,
        nexus: o.nexus,
        relative_port: o.relative_port,
        tpg: o.tpg,
        target_port_name: &o.port_name,
        initiator_port_name: &o.initiator_port_name,
        expected_data_out: Some(if req.write { req.edtl } else { 0 }),
        lus: o.lus.as_ref().map(|l| l as &dyn TargetLus),
    };
    let out = lu.execute(&cmd);
    Completion {
        status: out.status,
        sense: out.sense.map(|s| Bytes::from(s.to_bytes())),
        data_in: out.data,
        data_out_wanted: if req.write {
            lu.plan(req.cdb.as_slice()).data_out
        } else {
            0
        },
    }
}

/// Answers commands that no single LU can: REPORT LUNS, and anything sent
/// to a LUN that does not exist. Returns `None` when `lu` should run it.
pub fn answer_above_lu(t: &TargetRt, req: &ExecRequest) -> Option<Completion> {
    let cdb = req.cdb.as_slice();
    let op = cdb[0];
    if op == 0xa0 {
        return Some(report_luns(t, cdb));
    }
    if t.lu(req.lun).is_some() {
        return None;
    }
    Some(match op {
        0x12 => {
            // INQUIRY: peripheral qualifier 011b, device type 1Fh.
            let alloc = usize::from(u16::from_be_bytes([cdb[3], cdb[4]]));
            let mut d = vec![0u8; 36];
            d[0] = 0x7f;
            d[2] = 0x06;
            d[3] = 0x02;
            d[4] = 31;
            d.truncate(alloc.min(36));
            Completion {
                data_in: Bytes::from(d),
                ..Completion::default()
            }
        }
        0x03 => {
            // REQUEST SENSE: the sense data says why.
            let alloc = usize::from(cdb[4]);
            let mut s = sense(ILLEGAL_REQUEST, 0x25, 0).to_vec();
            s.truncate(alloc.min(18));
            Completion {
                data_in: Bytes::from(s),
                ..Completion::default()
            }
        }
        _ => check(ILLEGAL_REQUEST, 0x25, 0x00),
    })
}

/// REPORT LUNS (SPC-4 §6.33).
fn report_luns(t: &TargetRt, cdb: &[u8]) -> Completion {
    let select = cdb[2];
    let alloc = u32::from_be_bytes([cdb[6], cdb[7], cdb[8], cdb[9]]) as usize;
    if !matches!(select, 0x00..=0x02) {
        return invalid_field_in_cdb(2);
    }
    if alloc < 16 {
        return invalid_field_in_cdb(6);
    }
    let n = t.luns.len();
    let mut d = Vec::with_capacity(8 + 8 * n);
    d.extend_from_slice(&((8 * n) as u32).to_be_bytes());
    d.extend_from_slice(&[0; 4]);
    for i in 0..n {
        d.extend_from_slice(&Lun::from_index(i as u16).0);
    }
    d.truncate(alloc);
    Completion {
        data_in: Bytes::from(d),
        ..Completion::default()
    }
}

fn invalid_field_in_cdb(byte: u16) -> Completion {
    let mut s = sense(ILLEGAL_REQUEST, 0x24, 0).to_vec();
    // Sense-key specific: SKSV=1, C/D=1 (CDB), field pointer.
    s[15] = 0xc0;
    s[16..18].copy_from_slice(&byte.to_be_bytes());
    Completion {
        status: scsi::status::CHECK_CONDITION,
        sense: Some(Bytes::from(s)),
        ..Completion::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_stable_and_distinct() {
        let a = naa_for("iqn.x:y", 0, "s");
        assert_eq!(a, naa_for("iqn.x:y", 0, "s"));
        assert_ne!(a, naa_for("iqn.x:y", 1, "s"));
        assert_eq!(a[0] >> 4, 6);
        assert_eq!(serial_for("iqn.x:y", 0).len(), 16);
        assert_eq!(serial_for("iqn.x:y", 3), serial_for("iqn.x:y", 3));
    }

    #[test]
    fn state_files_are_per_lun_and_safe_names() {
        let d = Path::new("/state");
        assert_eq!(
            pr_state_file(d, "iqn.2026-11.io.ironsan:disk0", 1),
            Path::new("/state/iqn.2026-11.io.ironsan_disk0.lun1.pr")
        );
        assert_eq!(
            pr_state_file(d, "../x/y", 0),
            Path::new("/state/.._x_y.lun0.pr")
        );
    }
}
