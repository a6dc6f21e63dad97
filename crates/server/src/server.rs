//! Portals, the session registry and shutdown.
//!
//! Every configured listen address is a portal and its own target portal
//! group (tag and relative target port = its position, from 1), and a
//! member of one ALUA target port group (by default its own, with the same
//! id; see [`crate::config::AluaConfig`]). Every target is reachable
//! through every portal.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use iscsi_proto::discovery::Listing;
use iscsi_proto::params::Limits;
use iscsi_wire::pdu::Lun;
use parking_lot::Mutex;
use scsi::NexusId;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinSet;

use crate::config::Config;
use crate::conn;
use crate::lunmap::TargetRt;

/// A portal: where connections arrive.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Portal {
    pub addr: SocketAddr,
    /// Target portal group tag, also the relative target port identifier.
    pub tpgt: u16,
    /// The ALUA target port group the port belongs to.
    pub alua_group: u16,
    /// An NVMe/TCP port (else iSCSI).
    pub nvme: bool,
}

/// Identity of a session for reinstatement (RFC 7143 §4.4.3, §6.3.5):
/// the initiator name and ISID, the target and the target portal group (a
/// session with the same ISID through another portal group is another
/// session, i.e. another I_T nexus, not a reinstatement).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SessionKey {
    pub initiator: String,
    pub isid: [u8; 6],
    pub target: String,
    pub tpgt: u16,
}

/// A live session in the registry.
#[derive(Debug)]
pub(crate) struct SessionEntry {
    pub tsih: u16,
    pub nexus: NexusId,
    /// Where the session's connection comes from (for access rules
    /// changed at run time).
    pub peer: std::net::IpAddr,
    /// Notified to make the session's connection close (reinstatement,
    /// access revoked by the admin API).
    pub kill: Arc<Notify>,
    /// LUNs whose tasks this session must abort (PREEMPT AND ABORT).
    pub aborts: Arc<AbortRequests>,
    /// The connection's CID (MaxConnections is 1: the only one).
    pub cid: u16,
    /// Which connection serves the session now (a connection
    /// reinstatement hands the entry to a new one); 0 while the session has
    /// failed and is kept for DefaultTime2Wait + DefaultTime2Retain
    /// (RFC 7143 §6.3.6, §13.16) waiting for a reinstatement.
    pub conn: u64,
    /// While failed: the connection whose end failed it (its timer
    /// discards the session unless another connection took over since).
    pub failed_by: u64,
    /// Notified when that connection has ended.
    pub done: Arc<Notify>,
}

/// Task-set aborts asked of one session by another session's PERSISTENT
/// RESERVE OUT PREEMPT AND ABORT: the LUNs, and a wake-up for the
/// session's connection task.
#[derive(Debug, Default)]
pub(crate) struct AbortRequests {
    pub luns: Mutex<Vec<Lun>>,
    pub notify: Notify,
}

impl AbortRequests {
    fn push(&self, lun: Lun) {
        let mut l = self.luns.lock();
        if !l.contains(&lun) {
            l.push(lun);
        }
        drop(l);
        self.notify.notify_one();
    }
}

/// State shared by every connection.
pub(crate) struct Shared {
    pub limits: Limits,
    pub access: crate::access::AccessControl,
    pub socket_buffer: u32,
    /// Congestion control asked for on every connection.
    pub tcp_congestion: String,
    /// How long a connection polls its socket before it sleeps.
    pub busy_poll: Duration,
    pub login_timeout: Duration,
    /// The security stage must be over within this time of the connection.
    pub security_timeout: Duration,
    pub nop_interval: Duration,
    pub nop_timeout: Duration,
    /// Every target (the admin API may add and remove some).
    pub targets: parking_lot::RwLock<Vec<Arc<TargetRt>>>,
    /// The server's ALUA target port groups as they are now (portals
    /// added and removed, states set): what a target added at run time
    /// starts from.
    pub groups: Arc<volume::access::PortGroups>,
    /// Where LUs keep persistent state (`state_dir`).
    pub state_dir: Option<std::path::PathBuf>,
    /// This process is one of several gateways (`[gateway]`).
    pub gateway_mode: bool,
    /// Every portal, in order (the admin API may add some).
    pub portals: parking_lot::RwLock<Vec<Portal>>,
    pub registry: Mutex<HashMap<SessionKey, SessionEntry>>,
    pub stats: crate::stats::StatsRegistry,
    /// New portals for the accept loops of [`Server::run`].
    pub new_portals: mpsc::UnboundedSender<(TcpListener, Portal)>,
    /// Per portal (by tag): set to `true` to stop accepting on it and to
    /// close its connections once their commands are done (portal removed
    /// at run time, or shutdown).
    pub portal_stops: Mutex<HashMap<u16, watch::Sender<bool>>>,
    /// The tag of the next portal added at run time on a new address: a
    /// tag never moves to another address while the server runs (a removed
    /// portal's tag may still be known to initiators as a relative port
    /// identifier).
    pub next_tpgt: AtomicU16,
    /// Portals removed at run time: added again on the same address, a
    /// portal is the same target port again (its tag and ALUA group), as
    /// hosts whose paths went down with it expect.
    pub removed_portals: Mutex<Vec<Portal>>,
    next_tsih: AtomicU16,
    next_nexus: AtomicU64,
    /// NVMe/TCP: subsystems, controllers, ports.
    pub nvme: crate::nvme::NvmeState,
    /// The ALUA group of each NVMe/TCP port (by port ID).
    pub nvme_groups: Mutex<HashMap<u16, u16>>,
}

/// The first stop-signal key of the NVMe/TCP ports (iSCSI portal tags are
/// below it).
pub(crate) const NVME_PORT_TAGS: u16 = 0xf000;

impl Shared {
    pub fn target(&self, name: &str) -> Option<Arc<TargetRt>> {
        self.targets.read().iter().find(|t| t.name == name).cloned()
    }

    /// The target whose NVMe subsystem is `nqn`.
    pub fn target_by_nqn(&self, nqn: &str) -> Option<Arc<TargetRt>> {
        self.targets.read().iter().find(|t| t.nqn == nqn).cloned()
    }

    /// Every target, as they are now.
    pub fn all_targets(&self) -> Vec<Arc<TargetRt>> {
        self.targets.read().clone()
    }

    /// A stop signal for the connections and accept loop of portal `tpgt`;
    /// one that has fired already when the portal is gone.
    pub fn portal_stop(&self, tpgt: u16) -> watch::Receiver<bool> {
        match self.portal_stops.lock().get(&tpgt) {
            Some(tx) => tx.subscribe(),
            // The sender is dropped at once: `changed()` returns at once.
            None => watch::channel(true).1,
        }
    }

    /// Registers portal `tpgt`'s stop signal.
    pub fn add_portal_stop(&self, tpgt: u16) {
        self.portal_stops
            .lock()
            .insert(tpgt, watch::channel(false).0);
    }

    /// Fires portal `tpgt`'s stop signal and forgets it.
    pub fn stop_portal(&self, tpgt: u16) {
        if let Some(tx) = self.portal_stops.lock().remove(&tpgt) {
            tx.send_replace(true);
        }
    }

    /// What SendTargets tells: every target through every portal.
    pub fn listings(&self) -> Vec<Listing> {
        let portals: Vec<(SocketAddr, u16)> = self
            .portals
            .read()
            .iter()
            .map(|p| (p.addr, p.tpgt))
            .collect();
        self.targets
            .read()
            .iter()
            .map(|t| Listing {
                name: t.name.clone(),
                portals: portals.clone(),
            })
            .collect()
    }

    /// A TSIH no live session uses (never 0).
    pub fn fresh_tsih(&self) -> u16 {
        loop {
            let t = self.next_tsih.fetch_add(1, Ordering::Relaxed);
            if t != 0 && !self.registry.lock().values().any(|e| e.tsih == t) {
                return t;
            }
        }
    }

    pub fn fresh_nexus(&self) -> NexusId {
        NexusId(self.next_nexus.fetch_add(1, Ordering::Relaxed))
    }
}

/// Lets every LU's PREEMPT AND ABORT reach the sessions it preempted: the
/// hook finds their registry entries and asks them to abort their tasks
/// for that LUN. Holds the shared state weakly (the LUs live inside it).
fn install_abort_hooks(shared: &Arc<Shared>) {
    for t in shared.all_targets() {
        install_target_abort_hooks(shared, &t);
    }
}

/// [`install_abort_hooks`] for one target (also for targets added at run
/// time).
pub(crate) fn install_target_abort_hooks(shared: &Arc<Shared>, t: &TargetRt) {
    for (i, lu) in t.luns().iter() {
        install_abort_hook(shared, &t.name, i, lu);
    }
    // LUs that open later ([`crate::opening`]) get it too.
    let weak = Arc::downgrade(shared);
    let name = t.name.clone();
    t.cell().on_install(Box::new(move |n, lu| {
        if let Some(shared) = weak.upgrade() {
            install_abort_hook(&shared, &name, n, lu);
        }
    }));
}

/// [`install_abort_hooks`] for one LU (also for LUs added at run time).
pub(crate) fn install_abort_hook(
    shared: &Arc<Shared>,
    target: &str,
    n: u16,
    lu: &scsi::LogicalUnit,
) {
    let weak: Weak<Shared> = Arc::downgrade(shared);
    let target = target.to_string();
    let lun = Lun::from_index(n);
    lu.set_preempt_abort_hook(Arc::new(move |victims: &[NexusId]| {
        let Some(shared) = weak.upgrade() else { return };
        let reg = shared.registry.lock();
        for (k, e) in reg.iter() {
            if k.target == target && victims.contains(&e.nexus) {
                e.aborts.push(lun);
            }
        }
    }));
}

/// A bound, not yet running target.
pub struct Server {
    shared: Arc<Shared>,
    /// Event loop threads.
    workers: usize,
    listeners: Vec<(TcpListener, Portal)>,
    new_portals: mpsc::UnboundedReceiver<(TcpListener, Portal)>,
}

/// Tells a running server to stop.
#[derive(Clone, Debug)]
pub struct ServerHandle {
    tx: watch::Sender<bool>,
}

impl ServerHandle {
    /// Starts a graceful shutdown.
    pub fn shutdown(&self) {
        let _ = self.tx.send(true);
    }
}

impl Server {
    /// Opens every LUN and binds every portal.
    pub async fn bind(cfg: Config) -> Result<Server, String> {
        cfg.validate().map_err(|e| e.to_string())?;
        let targets = cfg
            .target
            .iter()
            .map(|t| {
                TargetRt::build(
                    t,
                    cfg.port_groups(),
                    cfg.alua_explicit(),
                    cfg.state_dir.as_deref(),
                    cfg.gateway.as_ref(),
                )
                .map(Arc::new)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let groups = Arc::new(
            volume::access::PortGroups::new(cfg.port_groups(), cfg.alua_explicit())
                .map_err(|e| format!("alua: {e}"))?,
        );
        let mut listeners = Vec::new();
        for (i, addr) in cfg.listen.iter().enumerate() {
            let l = TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
            let bound = l.local_addr().map_err(|e| e.to_string())?;
            listeners.push((
                l,
                Portal {
                    addr: bound,
                    tpgt: cfg.portal_tag((i + 1) as u16),
                    alua_group: cfg.group_of_portal((i + 1) as u16),
                    nvme: false,
                },
            ));
        }
        // NVMe/TCP ports: port IDs from 1, stop signals keyed from
        // NVME_PORT_TAGS up (apart from the iSCSI portal tags).
        let mut nvme_ports = Vec::new();
        for (i, addr) in cfg.nvme_listen.iter().enumerate() {
            let l = TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr} (NVMe/TCP): {e}"))?;
            let bound = l.local_addr().map_err(|e| e.to_string())?;
            nvme_ports.push(nvme::admin::Port {
                id: (i + 1) as u16,
                addr: bound,
            });
            listeners.push((
                l,
                Portal {
                    addr: bound,
                    tpgt: NVME_PORT_TAGS + i as u16,
                    // The ANA state through NVMe port n is that of the ALUA
                    // group of iSCSI portal n (the last one beyond them).
                    alua_group: cfg.group_of_portal((i + 1).min(cfg.listen.len()).max(1) as u16),
                    nvme: true,
                },
            ));
        }
        // Whether the kernel has the congestion control asked for is known
        // only when a socket asks: ask now, not at the first connection.
        if let Some((l, _)) = listeners.first() {
            use std::os::fd::AsFd;
            let name = &cfg.limits.tcp_congestion;
            if let Err(e) = netio::set_congestion(l.as_fd(), name) {
                let have =
                    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
                        .unwrap_or_default();
                let msg = format!(
                    "limits.tcp_congestion {name:?}: {e} (this kernel has: {}; \"system\" keeps its default)",
                    have.trim()
                );
                // The default is a preference (a kernel without it keeps
                // its own); a name the operator gave must exist.
                if name != netio::DEFAULT_CONGESTION {
                    return Err(msg);
                }
                tracing::warn!("{msg}");
            }
        }
        let portals = listeners
            .iter()
            .filter(|(_, p)| !p.nvme)
            .map(|(_, p)| *p)
            .collect();
        let (new_portals, new_portals_rx) = mpsc::unbounded_channel();
        let shared = Shared {
            access: crate::access::AccessControl::from_config(&cfg).map_err(|e| e.to_string())?,
            limits: cfg.limits(),
            socket_buffer: cfg.limits.socket_buffer,
            tcp_congestion: cfg.limits.tcp_congestion.clone(),
            busy_poll: Duration::from_micros(u64::from(cfg.limits.busy_poll_us)),
            login_timeout: Duration::from_secs(cfg.timeouts.login.max(1)),
            security_timeout: Duration::from_secs(cfg.timeouts.security.max(1)),
            nop_interval: Duration::from_secs(cfg.timeouts.nop_interval),
            nop_timeout: Duration::from_secs(cfg.timeouts.nop_timeout.max(1)),
            targets: parking_lot::RwLock::new(targets),
            groups,
            state_dir: cfg.state_dir.clone(),
            gateway_mode: cfg.gateway.is_some(),
            portals: parking_lot::RwLock::new(portals),
            registry: Mutex::new(HashMap::new()),
            stats: crate::stats::StatsRegistry::new(),
            new_portals,
            portal_stops: Mutex::new(HashMap::new()),
            next_tpgt: AtomicU16::new(cfg.portal_tag(cfg.listen.len() as u16).saturating_add(1)),
            removed_portals: Mutex::new(Vec::new()),
            next_tsih: AtomicU16::new(1),
            next_nexus: AtomicU64::new(1),
            nvme: crate::nvme::NvmeState::new(),
            nvme_groups: Mutex::new(
                listeners
                    .iter()
                    .filter(|(_, p)| p.nvme)
                    .map(|(_, p)| (p.tpgt - NVME_PORT_TAGS + 1, p.alua_group))
                    .collect(),
            ),
        };
        *shared.nvme.ports.write() = nvme_ports;
        crate::nvme::register_targets(&shared, &cfg);
        let shared = Arc::new(shared);
        for (_, p) in &listeners {
            shared.add_portal_stop(p.tpgt);
        }
        install_abort_hooks(&shared);
        let workers = cfg
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        Ok(Server {
            shared,
            workers,
            listeners,
            new_portals: new_portals_rx,
        })
    }

    /// The handle the admin API changes the running server through.
    pub fn control(&self) -> crate::control::Control {
        crate::control::Control::new(self.shared.clone())
    }

    /// The bound portal addresses, in configuration order.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter(|(_, p)| !p.nvme)
            .map(|(_, p)| p.addr)
            .collect()
    }

    /// The bound NVMe/TCP port addresses, in configuration order.
    pub fn nvme_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter(|(_, p)| p.nvme)
            .map(|(_, p)| p.addr)
            .collect()
    }

    /// Serves until `shutdown` resolves, then lets in-flight commands finish
    /// (at most 10 s) and closes every connection.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let (tx, rx) = watch::channel(false);
        let handle = ServerHandle { tx };
        // One event loop per core (docs/ARCHITECTURE.md "Cores"): each worker thread
        // runs a single-threaded runtime; accepted connections are dealt to
        // them in turn and stay there, so nothing on the data path is shared
        // between threads or stolen across them.
        let mut workers = Vec::new();
        let mut senders = Vec::new();
        for i in 0..self.workers.max(1) {
            let (wtx, mut wrx) =
                mpsc::unbounded_channel::<(std::net::TcpStream, SocketAddr, Portal)>();
            senders.push(wtx);
            let shared = self.shared.clone();
            let th = std::thread::Builder::new().name(format!("ironsan-io-{i}")).spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start an I/O worker");
                        return;
                    }
                };
                rt.block_on(async move {
                    let mut conns = JoinSet::new();
                    loop {
                        tokio::select! {
                            c = wrx.recv() => match c {
                                Some((s, peer, portal)) => match TcpStream::from_std(s) {
                                    Ok(s) => {
                                        // The portal's signal: it fires at
                                        // shutdown and when the portal is
                                        // removed.
                                        let stop = shared.portal_stop(portal.tpgt);
                                        if portal.nvme {
                                            conns.spawn(crate::nvme::serve(s, peer, portal, shared.clone(), stop));
                                        } else {
                                            conns.spawn(conn::serve(s, peer, portal, shared.clone(), stop));
                                        }
                                    }
                                    Err(e) => tracing::warn!(error = %e, "cannot register a connection"),
                                },
                                None => break,
                            },
                            Some(_) = conns.join_next(), if !conns.is_empty() => {}
                        }
                    }
                    let _ = tokio::time::timeout(Duration::from_secs(10), async {
                        while conns.join_next().await.is_some() {}
                    })
                    .await;
                });
            });
            match th {
                Ok(h) => workers.push(h),
                Err(e) => tracing::error!(error = %e, "cannot start an I/O worker thread"),
            }
        }
        let senders = Arc::new(senders);
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut accepts = JoinSet::new();
        let accept = |l: TcpListener, portal: Portal| {
            let mut stop = rx.clone();
            let mut removed = self.shared.portal_stop(portal.tpgt);
            let senders = senders.clone();
            let next = next.clone();
            let shared = self.shared.clone();
            async move {
                loop {
                    tokio::select! {
                        r = l.accept() => match r {
                            Ok((s, peer)) => {
                                shared.stats.portal_event(portal.tpgt, |e| e.connections += 1);
                                let i = next.fetch_add(1, Ordering::Relaxed) % senders.len().max(1);
                                match s.into_std() {
                                    Ok(s) => {
                                        let _ = senders[i].send((s, peer, portal));
                                    }
                                    Err(e) => tracing::warn!(error = %e, "cannot hand over a connection"),
                                }
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "accept failed");
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                        },
                        _ = stop.changed() => break,
                        _ = removed.changed() => {
                            tracing::info!(addr = %portal.addr, tpgt = portal.tpgt, "portal removed: no longer listening");
                            break;
                        }
                    }
                }
            }
        };
        for (l, portal) in self.listeners {
            accepts.spawn(accept(l, portal));
        }
        let trimmer = tokio::spawn(crate::memory::trim_after_teardown());
        let mut new_portals = self.new_portals;
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                Some((l, portal)) = new_portals.recv() => {
                    tracing::info!(addr = %portal.addr, tpgt = portal.tpgt, "portal added");
                    accepts.spawn(accept(l, portal));
                }
            }
        }
        tracing::info!("shutting down: finishing in-flight commands");
        handle.shutdown();
        for tx in self.shared.portal_stops.lock().values() {
            tx.send_replace(true);
        }
        trimmer.abort();
        while accepts.join_next().await.is_some() {}
        drop(senders);
        let _ = tokio::task::spawn_blocking(move || {
            for w in workers {
                let _ = w.join();
            }
        })
        .await;
        tracing::info!("stopped");
    }
}
