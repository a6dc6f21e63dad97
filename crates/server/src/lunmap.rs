//! The LUNs of each target, and the commands answered above any single LU:
//! REPORT LUNS (SPC-4 §6.33) and commands addressed to a LUN that does not
//! exist (SPC-4 §5.8.4: INQUIRY reports peripheral qualifier 011b, other
//! commands LOGICAL UNIT NOT SUPPORTED).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use iscsi_proto::session::{Completion, ExecRequest};
use iscsi_wire::pdu::Lun;
use scsi::{
    Asc, GroupSpec, LogicalUnit, LuConfig, NexusId, Outcome, PortGroups, Sense, SenseKey, TargetLus,
};
use storage::{BlockBackend, FileBackend, MemBackend, NullBackend, WriteCache, WriteData};

use parking_lot::RwLock;

use crate::config::{BackendKind, CacheConfig, LunConfig, TargetConfig};

/// The LUNs of one target at one moment: `luns[n]` is LUN n, `None` where
/// no LUN is (after a removal, or numbers left out in the configuration).
/// Immutable: a change builds a new table (see [`TargetRt::install`]), so a
/// connection can keep one and look LUNs up with no lock per command.
#[derive(Default)]
pub struct LunTable {
    pub luns: Vec<Option<Arc<LogicalUnit>>>,
}

impl LunTable {
    /// The logical unit at `lun`, if it exists.
    #[inline]
    pub fn get(&self, lun: Lun) -> Option<&Arc<LogicalUnit>> {
        lun.index()
            .and_then(|i| self.luns.get(usize::from(i)))
            .and_then(Option::as_ref)
    }

    /// Every LUN number with its logical unit, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u16, &Arc<LogicalUnit>)> {
        self.luns
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.as_ref().map(|l| (i as u16, l)))
    }

    /// How many LUNs exist.
    pub fn count(&self) -> usize {
        self.luns.iter().filter(|l| l.is_some()).count()
    }
}

/// One target at run time. Its LUN table can change while sessions run
/// (the admin API): connections check [`TargetRt::generation`] once per
/// batch of PDUs and take a fresh [`TargetRt::luns`] snapshot only when it
/// moved.
pub struct TargetRt {
    pub name: String,
    pub alias: Option<String>,
    table: RwLock<Arc<LunTable>>,
    generation: AtomicU64,
    /// The ALUA target port groups of this target (shared by its LUs).
    pub port_groups: Arc<PortGroups>,
    /// Where LUs keep persistent reservation state.
    pub state_dir: Option<PathBuf>,
    /// The gateway role, when this process is one of several gateways of
    /// the target's LUs ([`crate::gateway`]).
    pub gateway: Option<Arc<crate::gateway::Gateway>>,
}

/// The LUs of one target as a logical unit sees its siblings (EXTENDED
/// COPY sources and destinations, SET TARGET PORT GROUPS): every LU of the
/// session's target, which every initiator logged in to it may reach.
#[derive(Clone)]
pub struct LunSet(pub Arc<LunTable>);

impl std::fmt::Debug for LunSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LunSet({} LUs)", self.0.count())
    }
}

impl TargetLus for LunSet {
    fn by_naa(&self, naa: &[u8]) -> Option<Arc<LogicalUnit>> {
        self.0
            .iter()
            .find(|(_, lu)| lu.volume().identity().naa[..] == *naa)
            .map(|(_, lu)| lu.clone())
    }

    fn for_each_lu(&self, f: &mut dyn FnMut(&LogicalUnit)) {
        self.0.iter().for_each(|(_, lu)| f(lu));
    }
}

impl std::fmt::Debug for TargetRt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetRt")
            .field("name", &self.name)
            .field("luns", &self.luns().count())
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
    /// [`pr_state_file`]. With `gateway`, this process is one of several
    /// gateways of the LUs: reservations are refused and the ALUA states
    /// follow the images' locks ([`crate::gateway`]).
    pub fn build(
        cfg: &TargetConfig,
        groups: Vec<GroupSpec>,
        explicit: bool,
        state_dir: Option<&Path>,
        gateway: Option<&crate::config::GatewayConfig>,
    ) -> Result<TargetRt, String> {
        if let Some(d) = state_dir {
            std::fs::create_dir_all(d).map_err(|e| format!("state_dir {}: {e}", d.display()))?;
        }
        let port_groups = Arc::new(
            PortGroups::new(groups, explicit).map_err(|e| format!("target {}: {e}", cfg.name))?,
        );
        let mut table = LunTable::default();
        for (i, l) in cfg.lun.iter().enumerate() {
            let n = usize::from(l.number.unwrap_or(i as u16));
            let lu = build_lu(&cfg.name, n, l, &port_groups, state_dir, gateway.is_none())?;
            if table.luns.len() <= n {
                table.luns.resize(n + 1, None);
            }
            table.luns[n] = Some(lu);
        }
        let gateway = match gateway {
            Some(g) => {
                let lus: Vec<Arc<LogicalUnit>> = table.luns.iter().flatten().cloned().collect();
                Some(crate::gateway::Gateway::start(
                    &cfg.name,
                    g,
                    &port_groups,
                    &lus,
                )?)
            }
            None => None,
        };
        Ok(TargetRt {
            name: cfg.name.clone(),
            alias: cfg.alias.clone(),
            table: RwLock::new(Arc::new(table)),
            generation: AtomicU64::new(0),
            port_groups,
            state_dir: state_dir.map(Path::to_path_buf),
            gateway,
        })
    }

    /// The current LUN table.
    pub fn luns(&self) -> Arc<LunTable> {
        self.table.read().clone()
    }

    /// Moves each time the LUN table changes.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Puts `lu` at LUN `n` (or removes LUN `n` with `None`) and returns
    /// what was there. Sessions see the change at their next batch of PDUs.
    pub fn install(&self, n: u16, lu: Option<Arc<LogicalUnit>>) -> Option<Arc<LogicalUnit>> {
        let mut t = self.table.write();
        let mut luns = t.luns.clone();
        let n = usize::from(n);
        if luns.len() <= n {
            luns.resize(n + 1, None);
        }
        let old = std::mem::replace(&mut luns[n], lu);
        while luns.last().is_some_and(Option::is_none) {
            luns.pop();
        }
        *t = Arc::new(LunTable { luns });
        self.generation.fetch_add(1, Ordering::Release);
        old
    }
}

/// Test builds: `backend` slowed by the milliseconds in `file`, re-read
/// every 100 ms by a thread that ends with the backend.
#[cfg(feature = "test-delay")]
fn slowed(backend: Arc<dyn BlockBackend>, file: std::path::PathBuf) -> Arc<dyn BlockBackend> {
    let f = Arc::new(storage::FaultBackend::slowable(backend));
    let weak = Arc::downgrade(&f);
    std::thread::spawn(move || {
        while let Some(f) = weak.upgrade() {
            let ms = std::fs::read_to_string(&file)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(0);
            f.set_delay_ms(ms);
            drop(f);
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    });
    f
}

/// Opens the backend of LUN `n` of `target` as `l` describes and builds its
/// logical unit in the target port groups `pg`; without `reservations`
/// the unit refuses reservation commands (a gateway's units).
pub fn build_lu(
    target: &str,
    n: usize,
    l: &LunConfig,
    pg: &Arc<PortGroups>,
    state_dir: Option<&Path>,
    reservations: bool,
) -> Result<Arc<LogicalUnit>, String> {
    let at = format!("target {target} LUN {n}");
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
            Arc::new(FileBackend::open(path, size, policy).map_err(|e| {
                match path
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty() && !d.exists())
                {
                    // Say which part is missing: the file is created, its
                    // directory is not.
                    Some(d) if e.kind() == std::io::ErrorKind::NotFound => format!(
                        "{at}: {}: the directory {} does not exist (create it first)",
                        path.display(),
                        d.display()
                    ),
                    _ => format!("{at}: {}: {e}", path.display()),
                }
            })?)
        }
        BackendKind::Rbd => open_rbd(l, policy).map_err(|e| format!("{at}: {e}"))?,
    };
    #[cfg(feature = "test-delay")]
    let backend = match &l.test_delay_file {
        Some(f) => slowed(backend, f.clone()),
        None => backend,
    };
    let serial = l.serial.clone().unwrap_or_else(|| serial_for(target, n));
    let lu_cfg = LuConfig {
        block_size: l.block_size,
        physical_block_size: l.physical_block_size,
        naa: naa_for(target, n, &serial),
        serial,
        vendor: "IRONSAN".into(),
        product: match l.backend {
            BackendKind::Mem => "RAM DISK".into(),
            BackendKind::Null => "NULL DISK".into(),
            BackendKind::File => "FILE DISK".into(),
            BackendKind::Rbd => "RBD DISK".into(),
        },
        revision: "0001".into(),
        read_only: l.read_only,
        thin: l.thin,
        pr_state: state_dir.map(|d| pr_state_file(d, target, n)),
    };
    let lu = LogicalUnit::new(backend, lu_cfg)
        .map_err(|e| format!("{at}: {e}"))?
        .with_port_groups(pg.clone());
    let lu = Arc::new(if reservations {
        lu
    } else {
        lu.without_reservations()
    });
    lu.follow_backend_size();
    Ok(lu)
}

/// Opens the RBD image of an rbd LUN.
#[cfg(feature = "rbd")]
fn open_rbd(l: &LunConfig, policy: WriteCache) -> Result<Arc<dyn BlockBackend>, String> {
    let o = l
        .rbd_options()
        .map_err(|e| e.to_string())?
        .ok_or("not an rbd LUN")?;
    let opts = storage::RbdOptions {
        pool: o.pool,
        image: o.image,
        namespace: o.namespace,
        snapshot: o.snapshot,
        ceph_conf: o.ceph_conf,
        client_name: o.client_name,
        keyring: o.keyring,
        op_timeout: o.op_timeout,
        read_only: l.read_only,
        min_size: o.min_size,
    };
    let b = storage::RbdBackend::open(&opts, policy).map_err(|e| e.to_string())?;
    Ok(Arc::new(b))
}

/// Without the `rbd` feature an rbd LUN cannot be opened.
#[cfg(not(feature = "rbd"))]
fn open_rbd(l: &LunConfig, _policy: WriteCache) -> Result<Arc<dyn BlockBackend>, String> {
    let _ = l;
    Err("this ironsan was built without the rbd feature (cargo build --features rbd)".into())
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
    /// Large reads may be answered with a file range the connection sends
    /// from the file's mapping or by `sendfile` (`scsi::fast`, zero-copy
    /// reads; under a data digest too, the send queue computing it over
    /// the pages with their writers held off).
    pub zero_copy_reads: bool,
}

/// A CHECK CONDITION completion with `s` as fixed-format sense data.
fn check(s: Sense) -> Completion {
    Completion {
        status: scsi::status::CHECK_CONDITION,
        sense: Some(Bytes::from(s.to_bytes())),
        ..Completion::default()
    }
}

/// ILLEGAL REQUEST, LOGICAL UNIT NOT SUPPORTED (SPC-4 §4.6.4: a LUN the
/// target does not have).
const NO_SUCH_LUN: Sense = Sense::new(SenseKey::IllegalRequest, Asc::LOGICAL_UNIT_NOT_SUPPORTED);

/// `cdb` as the SCSI layer sees it, from the nexus and port of `o`, with
/// `expected_data_out` bytes of data-out expected and none given.
fn bare_command<'a>(cdb: &'a [u8], expected_data_out: u32, o: &'a Origin) -> scsi::Command<'a> {
    scsi::Command {
        cdb,
        data_out: &WriteData::None,
        nexus: o.nexus,
        relative_port: o.relative_port,
        tpg: o.tpg,
        target_port_name: &o.port_name,
        initiator_port_name: &o.initiator_port_name,
        expected_data_out: Some(expected_data_out),
        lus: o.lus.as_ref().map(|l| l as &dyn TargetLus),
    }
}

/// `req` as the SCSI layer sees it, from the nexus and port of `o`.
fn command<'a>(req: &'a ExecRequest, o: &'a Origin) -> scsi::Command<'a> {
    scsi::Command {
        data_out: &req.data_out,
        ..bare_command(req.cdb.as_slice(), if req.write { req.edtl } else { 0 }, o)
    }
}

/// `out` packed for the session, for a command whose CDB calls for
/// `data_out_wanted` bytes of data-out.
fn completion(out: Outcome, data_out_wanted: u32) -> Completion {
    Completion {
        status: out.status,
        sense: out.sense.map(|s| Bytes::from(s.to_bytes())),
        data_in: bufpool::Chain::from_summed_parts(out.data, out.more, out.sums),
        data_out_wanted,
    }
}

/// Runs `req` against `lu` and packs the outcome for the session.
pub fn run_on_lu(lu: &LogicalUnit, req: &ExecRequest, o: &Origin) -> Completion {
    let cmd = command(req, o);
    if o.zero_copy_reads && req.read {
        if let Some(r) = lu.zero_copy_read(&cmd) {
            return Completion {
                data_in: bufpool::Chain::from_file(r),
                data_out_wanted: req.cdb_data_out,
                ..Completion::default()
            };
        }
    }
    completion(lu.execute(&cmd), req.cdb_data_out)
}

/// Where a WRITE of `cdb`, `len` bytes of data-out, from the session of
/// `o` may be received straight into its place on the medium
/// (`scsi::fast`, writes received in place).
pub fn place_write(lu: &LogicalUnit, cdb: &[u8], len: u32, o: &Origin) -> Option<filemap::Placed> {
    lu.place_write(&bare_command(cdb, len, o), len as usize)
}

/// The completion of a WRITE of `cdb` whose data-out (`data_out_wanted`
/// bytes) was received into `placed`.
pub fn finish_placed(
    lu: &LogicalUnit,
    cdb: &[u8],
    placed: filemap::Placed,
    data_out_wanted: u32,
) -> Completion {
    completion(lu.finish_placed(cdb, placed), data_out_wanted)
}

/// Starts `req` on `lu`'s completion-driven path when the backend has one
/// and the LU admits the command (a plain READ or WRITE, see
/// `scsi::fast`): returns at once, and `done` gets the completion on the
/// backend's completion thread (or on this one, when the backend refuses
/// the request outright). `Err(done)`: not started; run it with
/// [`run_on_lu`].
pub fn submit_fast<F>(
    lu: &Arc<LogicalUnit>,
    req: &ExecRequest,
    o: &Origin,
    done: F,
) -> Result<(), F>
where
    F: FnOnce(Completion) + Send + 'static,
{
    let Some(aio) = lu.async_io() else {
        return Err(done);
    };
    let cmd = command(req, o);
    let Some(io) = lu.admit_fast(&cmd) else {
        return Err(done);
    };
    let wanted = req.cdb_data_out;
    let (offset, len, kind) = (io.offset, io.len, io.kind.clone());
    let lu2 = lu.clone();
    let finish = move |r: std::io::Result<Bytes>| {
        done(completion(lu2.finish_fast(io, r), wanted));
        // This runs on the backend's completion thread. Were this the last
        // reference (the LUN removed meanwhile), dropping the LU here would
        // close the image from inside a completion, which waits for that
        // very thread: drop it on a thread of its own instead.
        if let Some(last) = Arc::into_inner(lu2) {
            std::thread::spawn(move || drop(last));
        }
    };
    match kind {
        scsi::FastKind::Read => aio.submit_read(offset, len, Box::new(finish)),
        scsi::FastKind::Write { data, fua } => aio.submit_write(
            offset,
            data,
            fua,
            Box::new(move |r: std::io::Result<()>| finish(r.map(|()| Bytes::new()))),
        ),
    }
    Ok(())
}

/// Answers commands that no single LU can: REPORT LUNS, and anything sent
/// to a LUN that does not exist. Returns `None` when `lu` should run it.
pub fn answer_above_lu(t: &LunTable, req: &ExecRequest) -> Option<Completion> {
    let cdb = req.cdb.as_slice();
    let op = cdb[0];
    if op == 0xa0 {
        return Some(report_luns(t, cdb));
    }
    if t.get(req.lun).is_some() {
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
                data_in: Bytes::from(d).into(),
                ..Completion::default()
            }
        }
        0x03 => {
            // REQUEST SENSE: the sense data says why.
            let alloc = usize::from(cdb[4]);
            let mut s = NO_SUCH_LUN.to_bytes();
            s.truncate(alloc.min(s.len()));
            Completion {
                data_in: Bytes::from(s).into(),
                ..Completion::default()
            }
        }
        _ => check(NO_SUCH_LUN),
    })
}

/// REPORT LUNS (SPC-4 §6.33).
fn report_luns(t: &LunTable, cdb: &[u8]) -> Completion {
    let select = cdb[2];
    let alloc = u32::from_be_bytes([cdb[6], cdb[7], cdb[8], cdb[9]]) as usize;
    if !matches!(select, 0x00..=0x02) {
        return invalid_field_in_cdb(2);
    }
    if alloc < 16 {
        return invalid_field_in_cdb(6);
    }
    let n = t.count();
    let mut d = Vec::with_capacity(8 + 8 * n);
    d.extend_from_slice(&((8 * n) as u32).to_be_bytes());
    d.extend_from_slice(&[0; 4]);
    for (i, _) in t.iter() {
        d.extend_from_slice(&Lun::from_index(i).0);
    }
    d.truncate(alloc);
    Completion {
        data_in: Bytes::from(d).into(),
        ..Completion::default()
    }
}

fn invalid_field_in_cdb(byte: u16) -> Completion {
    check(Sense::invalid_cdb(byte, None))
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
