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

use parking_lot::{Mutex, RwLock};

use crate::config::{BackendKind, CacheConfig, LunConfig, TargetConfig};
use crate::opening::{Deferred, LunError, OpenFn, Opening, PendingLu, Progress, Waited};

/// The LUNs of one target at one moment: `luns[n]` is LUN n, `None` where
/// no LUN is (after a removal, or numbers left out in the configuration).
/// Immutable: a change builds a new table (see [`TargetRt::install`]), so a
/// connection can keep one and look LUNs up with no lock per command.
#[derive(Default)]
pub struct LunTable {
    pub luns: Vec<Option<Arc<LogicalUnit>>>,
    /// LUNs becoming ready: their storage is being opened
    /// ([`crate::opening`]). Never at a number `luns` holds.
    pub pending: Vec<(u16, Arc<PendingLu>)>,
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

    /// How many LUNs are ready.
    pub fn count(&self) -> usize {
        self.luns.iter().filter(|l| l.is_some()).count()
    }

    /// The LUN at `lun` becoming ready, if one is.
    pub fn pending_at(&self, lun: Lun) -> Option<&Arc<PendingLu>> {
        let n = lun.index()?;
        self.pending_number(n)
    }

    /// The LUN numbered `n` becoming ready, if one is.
    pub fn pending_number(&self, n: u16) -> Option<&Arc<PendingLu>> {
        self.pending.iter().find(|(m, _)| *m == n).map(|(_, p)| p)
    }

    /// Whether LUN number `n` is served, ready or becoming ready.
    pub fn in_use(&self, n: u16) -> bool {
        self.luns.get(usize::from(n)).is_some_and(Option::is_some)
            || self.pending_number(n).is_some()
    }

    /// Every LUN number served, ready or becoming ready, ascending.
    pub fn numbers(&self) -> Vec<u16> {
        let mut v: Vec<u16> = self.iter().map(|(n, _)| n).collect();
        v.extend(self.pending.iter().map(|(n, _)| *n));
        v.sort_unstable();
        v
    }
}

/// Runs when an LU is put in a table after start ([`TableCell::replace_pending`]).
pub type InstallHook = Box<dyn Fn(u16, &LogicalUnit) + Send + Sync>;

/// A target's current LUN table, shared with the threads that open LUNs in
/// the background ([`crate::opening`]).
#[derive(Default)]
pub struct TableCell {
    table: RwLock<Arc<LunTable>>,
    generation: AtomicU64,
    /// What every LU installed by [`TableCell::replace_pending`] gets
    /// first (the server's reservation abort hook).
    on_install: std::sync::OnceLock<InstallHook>,
}

impl TableCell {
    /// The current table.
    pub fn get(&self) -> Arc<LunTable> {
        self.table.read().clone()
    }

    /// Moves each time the table changes.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Makes a new table from the current one with `f`.
    fn change<R>(&self, f: impl FnOnce(&mut LunTable) -> R) -> R {
        let mut t = self.table.write();
        let mut new = LunTable {
            luns: t.luns.clone(),
            pending: t.pending.clone(),
        };
        let r = f(&mut new);
        while new.luns.last().is_some_and(Option::is_none) {
            new.luns.pop();
        }
        *t = Arc::new(new);
        self.generation.fetch_add(1, Ordering::Release);
        r
    }

    /// Puts `lu` at LUN `n` (or removes LUN `n`, ready or becoming ready,
    /// with `None`) and returns the ready LU that was there.
    fn install(&self, n: u16, lu: Option<Arc<LogicalUnit>>) -> Option<Arc<LogicalUnit>> {
        self.change(|t| {
            t.pending.retain(|(m, _)| *m != n);
            let i = usize::from(n);
            if t.luns.len() <= i {
                t.luns.resize(i + 1, None);
            }
            std::mem::replace(&mut t.luns[i], lu)
        })
    }

    /// Serves `p` as LUN `n` while it becomes ready.
    fn install_pending(&self, n: u16, p: Arc<PendingLu>) {
        self.change(|t| {
            if let Some(l) = t.luns.get_mut(usize::from(n)) {
                *l = None;
            }
            t.pending.retain(|(m, _)| *m != n);
            t.pending.push((n, p));
        });
    }

    /// Whether LUN `n` is still `p`, becoming ready.
    pub fn has_pending(&self, n: u16, p: &Arc<PendingLu>) -> bool {
        self.get()
            .pending_number(n)
            .is_some_and(|q| Arc::ptr_eq(q, p))
    }

    /// Puts `lu` in the place of `p` at LUN `n`; false (and nothing done)
    /// when LUN `n` is no longer `p` (removed meanwhile).
    pub fn replace_pending(&self, n: u16, p: &Arc<PendingLu>, lu: Arc<LogicalUnit>) -> bool {
        if let Some(hook) = self.on_install.get() {
            hook(n, &lu);
        }
        self.change(|t| {
            let Some(k) = t
                .pending
                .iter()
                .position(|(m, q)| *m == n && Arc::ptr_eq(q, p))
            else {
                return false;
            };
            t.pending.remove(k);
            let i = usize::from(n);
            if t.luns.len() <= i {
                t.luns.resize(i + 1, None);
            }
            t.luns[i] = Some(lu);
            true
        })
    }

    /// Sets what every LU installed later gets first (once).
    pub fn on_install(&self, hook: InstallHook) {
        let _ = self.on_install.set(hook);
    }
}

/// One target at run time. Its LUN table can change while sessions run
/// (the admin API): connections check [`TargetRt::generation`] once per
/// batch of PDUs and take a fresh [`TargetRt::luns`] snapshot only when it
/// moved.
pub struct TargetRt {
    pub name: String,
    /// Its NVMe subsystem NQN.
    pub nqn: String,
    pub alias: Option<String>,
    cell: Arc<TableCell>,
    /// The ALUA target port groups of this target (shared by its LUs).
    pub port_groups: Arc<PortGroups>,
    /// Where LUs keep persistent reservation state.
    pub state_dir: Option<PathBuf>,
    /// The gateway role, when this process is one of several gateways of
    /// the target's LUs ([`crate::gateway`]): set once every LU is open
    /// (at start, or later when the cluster did not answer then).
    pub gateway: Option<Arc<std::sync::OnceLock<Arc<crate::gateway::Gateway>>>>,
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
    /// follow the images' locks ([`crate::gateway`]). An rbd LUN whose
    /// cluster does not answer in time is served becoming ready and opened
    /// in the background ([`crate::opening`]).
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
        let name = cfg.name.as_str();
        if gateway.is_some() {
            if let Some(l) = cfg.lun.iter().find(|l| l.backend != BackendKind::Rbd) {
                return Err(format!(
                    "gateway: target {name}: a {} LUN has no owner arbitration (only rbd LUNs can \
                     be served by several gateways)",
                    l.backend.name()
                ));
            }
        }
        let reservations = gateway.is_none();
        let numbered = cfg
            .lun
            .iter()
            .enumerate()
            .map(|(i, l)| (l.number.unwrap_or(i as u16), l));
        let t0 = std::time::Instant::now();
        let mut ready = Vec::new();
        let mut opening = Vec::new();
        for (n, l) in numbered {
            let Some(retry) = l.open_retry() else {
                let lu = build_lu(
                    name,
                    usize::from(n),
                    l,
                    &port_groups,
                    state_dir,
                    reservations,
                )
                .map_err(|e| e.msg)?;
                ready.push((n, lu));
                continue;
            };
            let (target, l2, pg, dir) = (
                name.to_string(),
                l.clone(),
                port_groups.clone(),
                state_dir.map(Path::to_path_buf),
            );
            let open: OpenFn = Box::new(move || {
                build_lu(
                    &target,
                    usize::from(n),
                    &l2,
                    &pg,
                    dir.as_deref(),
                    reservations,
                )
            });
            let o = Opening::start(format!("target {name} LUN {n}"), retry, open)?;
            opening.push((n, l, o, t0 + retry.start_wait));
        }
        let mut pending = Vec::new();
        for (n, l, o, deadline) in opening {
            match o.wait(deadline) {
                Waited::Opened(lu) => ready.push((n, lu)),
                Waited::Failed(e) => return Err(e.msg),
                Waited::Pending => pending.push((n, l, o)),
            }
        }
        let cell = Arc::new(TableCell::default());
        let slot = gateway.map(|_| Arc::new(std::sync::OnceLock::new()));
        match (gateway, &slot) {
            (Some(g), Some(slot)) if pending.is_empty() => {
                for (n, lu) in &ready {
                    cell.install(*n, Some(lu.clone()));
                }
                let lus: Vec<Arc<LogicalUnit>> = ready.into_iter().map(|(_, lu)| lu).collect();
                let gw = crate::gateway::Gateway::start(name, g, &port_groups, &lus)?;
                let _ = slot.set(gw);
            }
            (Some(g), Some(slot)) => {
                // Every LUN waits for the others and for the gateway role.
                let asm = Arc::new(Assembly {
                    target: name.to_string(),
                    cfg: g.clone(),
                    pg: port_groups.clone(),
                    cell: Arc::downgrade(&cell),
                    slot: slot.clone(),
                    units: Mutex::new(Vec::new()),
                });
                for (n, lu) in ready {
                    let p = pending_lu(name, n, cfg_of(cfg, n), &port_groups, None)?;
                    cell.install_pending(n, p.clone());
                    asm.units.lock().push((n, p, Some(lu)));
                }
                for (n, l, o) in pending {
                    let p = pending_lu(name, n, l, &port_groups, Some(&o))?;
                    cell.install_pending(n, p.clone());
                    asm.units.lock().push((n, p.clone(), None));
                    let (asm2, w) = (asm.clone(), Arc::downgrade(&cell));
                    o.defer(Deferred {
                        wanted: Box::new(move || w.upgrade().is_some_and(|c| c.has_pending(n, &p))),
                        deliver: Box::new(move |lu| asm2.opened(n, lu)),
                    });
                }
            }
            _ => {
                for (n, lu) in ready {
                    cell.install(n, Some(lu));
                }
                for (n, l, o) in pending {
                    let p = pending_lu(name, n, l, &port_groups, Some(&o))?;
                    cell.install_pending(n, p.clone());
                    let w = Arc::downgrade(&cell);
                    let (w2, p2) = (w.clone(), p.clone());
                    o.defer(Deferred {
                        wanted: Box::new(move || w.upgrade().is_some_and(|c| c.has_pending(n, &p))),
                        deliver: Box::new(move |lu| {
                            if let Some(c) = w2.upgrade() {
                                c.replace_pending(n, &p2, lu);
                            }
                        }),
                    });
                }
            }
        }
        Ok(TargetRt {
            name: cfg.name.clone(),
            nqn: cfg.subsystem_nqn(),
            alias: cfg.alias.clone(),
            cell,
            port_groups,
            state_dir: state_dir.map(Path::to_path_buf),
            gateway: slot,
        })
    }

    /// The current LUN table.
    pub fn luns(&self) -> Arc<LunTable> {
        self.cell.get()
    }

    /// The table, for what changes it later (the server's install hook).
    pub fn cell(&self) -> &Arc<TableCell> {
        &self.cell
    }

    /// Moves each time the LUN table changes.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.cell.generation.load(Ordering::Acquire)
    }

    /// Puts `lu` at LUN `n` (or removes LUN `n`, ready or becoming ready,
    /// with `None`) and returns the ready LU that was there. Sessions see
    /// the change at their next batch of PDUs.
    pub fn install(&self, n: u16, lu: Option<Arc<LogicalUnit>>) -> Option<Arc<LogicalUnit>> {
        self.cell.install(n, lu)
    }
}

/// The configuration of LUN `n` of `cfg`.
fn cfg_of(cfg: &TargetConfig, n: u16) -> &LunConfig {
    cfg.lun
        .iter()
        .enumerate()
        .find(|(i, l)| l.number.unwrap_or(*i as u16) == n)
        .map(|(_, l)| l)
        .expect("a LUN of this configuration")
}

/// The stand-in of LUN `n` (configured as `l`) while it becomes ready,
/// following `o`'s attempts (none: already open).
fn pending_lu(
    target: &str,
    n: u16,
    l: &LunConfig,
    pg: &PortGroups,
    o: Option<&Opening>,
) -> Result<Arc<PendingLu>, String> {
    let at = format!("target {target} LUN {n}");
    let unit = scsi::BecomingReady::new(identity_for(target, usize::from(n), l), pg)
        .map_err(|e| format!("{at}: {e}"))?;
    let what = match l.rbd_options() {
        Ok(Some(o)) => format!("rbd {}", o.spec()),
        _ => l.backend.name().to_string(),
    };
    let progress = o.map_or_else(|| Arc::new(Progress::done()), |o| o.progress.clone());
    match progress.last_error() {
        Some(e) => tracing::warn!(
            "{at}: {e}; served as becoming ready (NOT READY 04/01) while it is opened in the \
             background"
        ),
        None if o.is_some() => tracing::warn!(
            "{at}: {what} is not open yet; served as becoming ready (NOT READY 04/01) while it is \
             opened in the background"
        ),
        None => {}
    }
    Ok(Arc::new(PendingLu {
        unit,
        what,
        block_size: l.block_size,
        read_only: l.read_only,
        progress,
    }))
}

/// The LUs of a gateway's target gathering while they open: handed over
/// together once all are open and the gateway role has started
/// ([`crate::opening`]).
struct Assembly {
    target: String,
    cfg: crate::config::GatewayConfig,
    pg: Arc<PortGroups>,
    cell: std::sync::Weak<TableCell>,
    slot: Arc<std::sync::OnceLock<Arc<crate::gateway::Gateway>>>,
    units: Mutex<Vec<Gathered>>,
}

/// A LUN number, its stand-in, the LU once open.
type Gathered = (u16, Arc<PendingLu>, Option<Arc<LogicalUnit>>);

impl Assembly {
    /// LUN `n` is open; the last one starts the gateway.
    fn opened(self: Arc<Self>, n: u16, lu: Arc<LogicalUnit>) {
        let all = {
            let mut units = self.units.lock();
            if let Some(u) = units.iter_mut().find(|u| u.0 == n) {
                u.2 = Some(lu);
            }
            units.iter().all(|u| u.2.is_some())
        };
        if all {
            let spawned = std::thread::Builder::new()
                .name("gateway-start".into())
                .spawn(move || self.start_gateway());
            if let Err(e) = spawned {
                tracing::error!("gateway: cannot start a thread: {e}");
            }
        }
    }

    /// Starts the gateway role, retrying while the cluster fails it, then
    /// serves every LU.
    fn start_gateway(&self) {
        let units = self.units.lock().clone();
        let lus: Vec<Arc<LogicalUnit>> = units.iter().filter_map(|u| u.2.clone()).collect();
        let mut pause = std::time::Duration::from_secs(1);
        let gw = loop {
            if self.cell.upgrade().is_none() {
                return;
            }
            match crate::gateway::Gateway::start(&self.target, &self.cfg, &self.pg, &lus) {
                Ok(gw) => break gw,
                Err(e) => {
                    tracing::warn!("{e}; trying again in {} s", pause.as_secs());
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_secs(30));
                }
            }
        };
        let _ = self.slot.set(gw);
        let Some(cell) = self.cell.upgrade() else {
            return;
        };
        for (n, p, lu) in units {
            if let Some(lu) = lu {
                lu.announce_power_on();
                cell.replace_pending(n, &p, lu);
            }
        }
        tracing::info!(target = %self.target, "gateway: every LUN is open; served");
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

/// The identity of LUN `n` of `target` configured as `l`: its serial
/// number (configured or derived), NAA designator, vendor, product and
/// revision, the same in every process serving it.
pub fn identity_for(target: &str, n: usize, l: &LunConfig) -> volume::Identity {
    let serial = l.serial.clone().unwrap_or_else(|| serial_for(target, n));
    volume::Identity {
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
    }
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
) -> Result<Arc<LogicalUnit>, LunError> {
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
        BackendKind::Rbd => open_rbd(l, policy).map_err(|e| LunError {
            msg: format!("{at}: {}", e.msg),
            transient: e.transient,
        })?,
    };
    #[cfg(feature = "test-delay")]
    let backend = match &l.test_delay_file {
        Some(f) => slowed(backend, f.clone()),
        None => backend,
    };
    let id = identity_for(target, n, l);
    let lu_cfg = LuConfig {
        block_size: l.block_size,
        physical_block_size: l.physical_block_size,
        naa: id.naa,
        serial: id.serial,
        vendor: id.vendor,
        product: id.product,
        revision: id.revision,
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
    if let Some(u) = &l.uuid {
        let u = crate::config::parse_uuid(u).map_err(|m| format!("{at}: uuid {u:?}: {m}"))?;
        lu.shared_volume().set_uuid(u);
    }
    lu.follow_backend_size();
    Ok(lu)
}

/// Opens the RBD image of an rbd LUN.
#[cfg(feature = "rbd")]
fn open_rbd(l: &LunConfig, policy: WriteCache) -> Result<Arc<dyn BlockBackend>, LunError> {
    let o = l
        .rbd_options()
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "not an rbd LUN".to_string())?;
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
    match storage::RbdBackend::open(&opts, policy) {
        Ok(b) => Ok(Arc::new(b)),
        Err(e) => Err(LunError::from_io(&e)),
    }
}

/// Without the `rbd` feature an rbd LUN cannot be opened.
#[cfg(not(feature = "rbd"))]
fn open_rbd(l: &LunConfig, _policy: WriteCache) -> Result<Arc<dyn BlockBackend>, LunError> {
    let _ = l;
    Err(LunError::lasting(
        "this ironsan was built without the rbd feature (cargo build --features rbd)",
    ))
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

/// Answers commands that no single LU can: REPORT LUNS, anything sent to
/// a LUN that does not exist, and anything sent to one becoming ready
/// ([`crate::opening`]). Returns `None` when `lu` should run it.
pub fn answer_above_lu(t: &LunTable, req: &ExecRequest, o: &Origin) -> Option<Completion> {
    let cdb = req.cdb.as_slice();
    let op = cdb[0];
    if op == 0xa0 {
        return Some(report_luns(t, cdb));
    }
    if t.get(req.lun).is_some() {
        return None;
    }
    if let Some(p) = t.pending_at(req.lun) {
        return Some(completion(
            p.unit.execute(&command(req, o)),
            req.cdb_data_out,
        ));
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
    let numbers = t.numbers();
    let n = numbers.len();
    let mut d = Vec::with_capacity(8 + 8 * n);
    d.extend_from_slice(&((8 * n) as u32).to_be_bytes());
    d.extend_from_slice(&[0; 4]);
    for i in numbers {
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

    fn origin() -> Origin {
        Origin {
            nexus: NexusId(1),
            relative_port: 1,
            tpg: 1,
            port_name: "iqn.x:t,t,0x0001".into(),
            initiator_port_name: "iqn.y,i,0x1".into(),
            lus: None,
            zero_copy_reads: false,
        }
    }

    fn req(lun: u16, cdb: &[u8]) -> ExecRequest {
        let mut b = [0u8; 16];
        b[..cdb.len()].copy_from_slice(cdb);
        ExecRequest {
            lun: Lun::from_index(lun),
            cdb: iscsi_proto::session::Cdb::Short(b),
            ..ExecRequest::default()
        }
    }

    fn sense(c: &Completion) -> Option<(u8, u8, u8)> {
        c.sense.as_ref().map(|s| (s[2] & 0x0f, s[12], s[13]))
    }

    #[test]
    fn a_lun_becoming_ready_is_listed_identified_and_replaced_once_open() {
        let mut l = LunConfig::from_spec("mem:1M").unwrap();
        l.backend = BackendKind::Rbd;
        let pg = Arc::new(PortGroups::default());
        let p = pending_lu("iqn.x:t", 2, &l, &pg, None).unwrap();
        let cell = TableCell::default();
        let lu = build_lu(
            "iqn.x:t",
            0,
            &LunConfig::from_spec("mem:1M").unwrap(),
            &pg,
            None,
            true,
        )
        .unwrap();
        cell.install(0, Some(lu));
        cell.install_pending(2, p.clone());
        let t = cell.get();
        assert!(t.in_use(2) && !t.in_use(1));
        assert_eq!(t.numbers(), vec![0, 2]);

        // REPORT LUNS lists both.
        let rl =
            answer_above_lu(&t, &req(0, &[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0]), &origin()).unwrap();
        let d = rl.data_in.contiguous();
        assert_eq!(&d[..4], &16u32.to_be_bytes());
        assert_eq!(&d[16..24], &Lun::from_index(2).0);

        // INQUIRY: the identity it will have; TEST UNIT READY: not yet.
        let inq = answer_above_lu(&t, &req(2, &[0x12, 0, 0, 0, 96, 0]), &origin()).unwrap();
        assert_eq!(inq.status, 0);
        assert_eq!(&inq.data_in.contiguous()[16..24], b"RBD DISK");
        let id = identity_for("iqn.x:t", 2, &l);
        let vpd = answer_above_lu(&t, &req(2, &[0x12, 1, 0x80, 0, 255, 0]), &origin()).unwrap();
        assert_eq!(&vpd.data_in.contiguous()[4..], id.serial.as_bytes());
        let tur = answer_above_lu(&t, &req(2, &[0, 0, 0, 0, 0, 0]), &origin()).unwrap();
        assert_eq!(sense(&tur), Some((2, 0x04, 0x01)));
        // A LUN that does not exist stays one.
        let none = answer_above_lu(&t, &req(1, &[0, 0, 0, 0, 0, 0]), &origin()).unwrap();
        assert_eq!(sense(&none), Some((5, 0x25, 0)));

        // Once open, the LU takes its place; a stand-in removed meanwhile
        // is not brought back.
        let mem = LunConfig::from_spec("mem:1M").unwrap();
        let open = build_lu("iqn.x:t", 2, &mem, &pg, None, true).unwrap();
        assert!(cell.has_pending(2, &p));
        assert!(cell.replace_pending(2, &p, open.clone()));
        assert!(!cell.has_pending(2, &p));
        let t = cell.get();
        assert!(t.pending.is_empty() && t.get(Lun::from_index(2)).is_some());
        assert!(answer_above_lu(&t, &req(2, &[0, 0, 0, 0, 0, 0]), &origin()).is_none());
        let q = pending_lu("iqn.x:t", 3, &l, &pg, None).unwrap();
        cell.install_pending(3, q.clone());
        cell.install(3, None);
        assert!(!cell.replace_pending(3, &q, open));
        assert!(!cell.get().in_use(3));
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
