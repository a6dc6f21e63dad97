//! The NVMe/TCP connection driver: a socket on an event loop driving one
//! `nvme::Queue` (NVMe/TCP Transport 1.0), its controller's admin
//! commands (`nvme::admin`) and the NVM commands on the LUNs' volumes
//! (`nvme::nvm`). Each target of the configuration is a subsystem
//! (`TargetConfig::subsystem_nqn`), its ready LUNs the namespaces, NSID =
//! LUN + 1; they are the very volumes the iSCSI sessions use.
//!
//! The rules of the iSCSI driver hold here too (docs/ARCHITECTURE.md):
//! everything the socket has is framed and handled before the output is
//! written with one vectored write; commands on a backend that never
//! blocks run on the loop, others on the blocking pool, their completions
//! coming back through a channel.
//!
//! Access: a Connect is refused (Connect Invalid Host) to a host NQN not in
//! the target's `nvme_allow`, from a source address outside its
//! `allow_net`, and to any host while the target requires CHAP but has no
//! DH-HMAC-CHAP secret (`dhchap`): a target with credentials must not be
//! reachable without them. With `dhchap`, every queue's Connect answers
//! "authentication required" and the queue serves nothing but NVMe
//! in-band authentication (NVMe Base 2.0 §8.13, `nvme_auth`) until the
//! host has proved it knows the secret.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bufpool::Chain;
use bytes::BytesMut;
use nvme::admin::{self, Context, Outcome, Port, Reply};
use nvme::ctrl::{ConnectCmd, Controller, Namespaces, Registry, Subsystem};
use nvme::queue::direction;
use nvme::resv::{self, Reservations};
use nvme::{Command, Queue, Stop};
use nvme_tcp_wire::capsule::{fctype, ConnectData, Status, OPC_FABRICS};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use volume::access::AccessState;
use volume::reservations::{HostAction, HostRefusal, HostReport};
use volume::Volume;

use crate::conn::{configure_socket, poll_socket, Out};
use crate::lunmap::{TableCell, TargetRt};
use crate::server::{Portal, Shared};
use crate::stats::{ConnStats, IoKind, SessionInfo, SessionStats, PUBLISH_EVERY};

/// What a receive read aims to take.
const READ_CHUNK: usize = 256 * 1024;
/// Reading pauses while more than this waits to be sent.
const OUTPUT_HIGH_WATER: usize = 8 << 20;

/// The NVMe/TCP side of the server: the subsystems and the ports.
pub(crate) struct NvmeState {
    pub registry: Registry,
    pub ports: parking_lot::RwLock<Vec<Port>>,
}

impl NvmeState {
    pub fn new() -> NvmeState {
        NvmeState {
            registry: Registry::new(),
            ports: parking_lot::RwLock::new(Vec::new()),
        }
    }
}

/// A target's LUN table as a subsystem's namespaces.
pub(crate) struct TargetNamespaces(pub Arc<TableCell>);

impl Namespaces for TargetNamespaces {
    fn active(&self) -> Vec<u32> {
        self.0.get().iter().map(|(n, _)| u32::from(n) + 1).collect()
    }

    fn volume(&self, nsid: u32) -> Option<Arc<Volume>> {
        let n = usize::try_from(nsid.checked_sub(1)?).ok()?;
        let t = self.0.get();
        t.luns.get(n)?.as_ref().map(|lu| lu.shared_volume().clone())
    }

    fn generation(&self) -> u64 {
        self.0.generation()
    }

    fn reservations(&self, nsid: u32) -> Option<Arc<dyn Reservations>> {
        let n = usize::try_from(nsid.checked_sub(1)?).ok()?;
        let t = self.0.get();
        let lu = t.luns.get(n)?.as_ref()?.clone();
        // A gateway's LU has none (docs/GATEWAYS.md): its state would be
        // one gateway's alone. The commands are then Invalid Opcode.
        lu.has_reservations()
            .then(|| Arc::new(LuReservations(lu)) as Arc<dyn Reservations>)
    }

    fn reservations_supported(&self) -> bool {
        self.0
            .get()
            .luns
            .iter()
            .flatten()
            .all(|lu| lu.has_reservations())
    }
}

/// A namespace's reservations are its logical unit's: one state for the
/// SCSI initiators and the NVMe hosts (`scsi::pr`, "NVMe hosts").
struct LuReservations(Arc<scsi::LogicalUnit>);

impl Reservations for LuReservations {
    #[inline]
    fn active(&self) -> bool {
        self.0.reservations_active()
    }

    fn conflicts(&self, host_id: &[u8; 16], write: bool) -> bool {
        self.0.host_conflicts(host_id, write)
    }

    fn apply(&self, host_id: &[u8; 16], act: HostAction) -> Result<(), HostRefusal> {
        self.0.host_reservation(host_id, act)
    }

    fn report(&self) -> HostReport {
        self.0.host_reservation_report()
    }

    fn can_persist(&self) -> bool {
        self.0.reservations_persist()
    }
}

/// Makes every target a subsystem.
pub(crate) fn register_targets(shared: &Shared, cfg: &crate::Config) {
    for t in &cfg.target {
        if let Some(rt) = shared.target(&t.name) {
            register_target(shared, t, &rt);
        }
    }
}

/// Makes target `t` (configured as `cfg`) a subsystem.
pub(crate) fn register_target(shared: &Shared, cfg: &crate::config::TargetConfig, t: &TargetRt) {
    let dhchap = match &cfg.dhchap {
        Some(d) => match d.resolve(&format!("target {} dhchap", cfg.name)) {
            Ok(k) => Some(Arc::new(k)),
            Err(e) => {
                tracing::error!(target = %cfg.name, "not served over NVMe/TCP: {e}");
                return;
            }
        },
        None => None,
    };
    if cfg.chap.is_some() && dhchap.is_none() {
        tracing::warn!(target = %cfg.name, "not served over NVMe/TCP: the target requires CHAP and has no DH-HMAC-CHAP secret (`dhchap`) for NVMe/TCP hosts");
        return;
    }
    let nqn = cfg.subsystem_nqn();
    if !nqn.starts_with("nqn.") {
        tracing::warn!(target = %cfg.name, nqn = %nqn, "the subsystem NQN is not in the nqn.yyyy-mm.domain:… form NVMe Base 2.0 §4.5 asks for (served anyway, as Linux nvmet serves it)");
    }
    let mut s = Subsystem::new(
        nqn,
        Arc::new(TargetNamespaces(t.cell().clone())),
        cfg.nvme_allow.clone(),
        Some(t.port_groups.clone()),
    );
    if let Some(k) = dhchap {
        s = s.with_dhchap(k);
    }
    shared.nvme.registry.add(Arc::new(s));
}

/// A command completed off the loop.
struct Done {
    cid: u16,
    reply: Reply,
    /// What the statistics count of it.
    io: Counted,
}

/// A command as the statistics see it.
#[derive(Clone, Copy)]
struct Counted {
    /// LUN (NSID − 1); `u16::MAX`: not counted.
    lun: u16,
    kind: IoKind,
    bytes: u32,
    start: Instant,
}

/// Serves one NVMe/TCP connection until it ends.
pub(crate) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    portal: Portal,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
) {
    let Some(_slot) = shared.access.connection_slot(peer.ip()) else {
        tracing::warn!(%peer, "connection limit reached: closed");
        return;
    };
    configure_socket(&stream, &shared);
    let (tx, rx) = mpsc::unbounded_channel();
    let mut d = Driver {
        stream,
        peer,
        portal,
        shared,
        queue: Queue::new(volume::MAX_TRANSFER_BYTES),
        ctrl: None,
        rbuf: BytesMut::with_capacity(READ_CHUNK),
        tx,
        rx,
        running: 0,
        held_aers: Vec::new(),
        closing: false,
        aen_pending: false,
        ns_aen_pending: false,
        fused: None,
        landing: None,
        header_first: 0,
        held: None,
        ns_vols: Vec::new(),
        ns_generation: None,
        stats: ConnStats::new(None),
        stats_shared: None,
        received_at: Instant::now(),
        auth: None,
    };
    match d.run(stop).await {
        Ok(()) => {}
        Err(e) => tracing::debug!(peer = %d.peer, error = %e, "NVMe/TCP connection ended"),
    }
    d.stats.finish();
    if let Some(s) = &d.stats_shared {
        d.shared.stats.retire(s);
    }
    if let Some(c) = &d.ctrl {
        if d.queue.qid == 0 {
            // The admin queue is the association: its end ends the
            // controller and its I/O queues.
            c.kill();
            tracing::info!(peer = %d.peer, cntlid = c.cntlid, subsystem = %c.subsystem.nqn, "NVMe/TCP controller ended");
        }
    }
}

/// A namespace as an I/O queue uses it.
#[derive(Clone)]
struct NsEntry {
    vol: Arc<Volume>,
    resv: Option<Arc<dyn Reservations>>,
}

struct Driver {
    stream: TcpStream,
    peer: SocketAddr,
    portal: Portal,
    shared: Arc<Shared>,
    queue: Queue,
    ctrl: Option<Arc<Controller>>,
    rbuf: BytesMut,
    tx: mpsc::UnboundedSender<Done>,
    rx: mpsc::UnboundedReceiver<Done>,
    /// Commands running off the loop.
    running: usize,
    /// Asynchronous Event Requests held (their CIDs).
    held_aers: Vec<u16>,
    /// Ending: send what is queued, then close.
    closing: bool,
    /// An ANA change waits for an Asynchronous Event Request to report it.
    aen_pending: bool,
    /// So does a namespace attached, detached or resized.
    ns_aen_pending: bool,
    /// The first command of a fused operation (a Compare, FUSE 01b),
    /// waiting for its second (a Write, FUSE 10b), which must be the next
    /// command this queue takes.
    fused: Option<Command>,
    /// A large H2CData PDU's data being received into its command's
    /// buffer (docs/ARCHITECTURE.md "Data lands where it is going").
    landing: Option<nvme::queue::Landing>,
    /// After a landed H2CData PDU, the next read into the receive buffer
    /// takes only its digest and this many bytes (the next data PDU's
    /// header; 0: no limit), as iSCSI's receiver does
    /// (`iscsi_wire::receive`).
    header_first: usize,
    /// A Read received, run when the next command comes or the batch
    /// ends ([`Driver::take`]).
    held: Option<Command>,
    /// The namespaces' volumes and reservations by NSID, as of
    /// `ns_generation` (looked up once per change of the LUN table, not
    /// per command).
    ns_vols: Vec<Option<NsEntry>>,
    ns_generation: Option<u64>,
    /// The I/O queue's counters, published as a session's (admin API,
    /// /metrics, `ironsan top`).
    stats: ConnStats,
    stats_shared: Option<Arc<SessionStats>>,
    /// When the PDUs being handled were received: the start of the
    /// latency of every command among them (one clock read per batch,
    /// not per command).
    received_at: Instant,
    /// This queue's DH-HMAC-CHAP transaction, when its subsystem
    /// authenticates hosts: nothing but authentication (and Disconnect)
    /// runs until it succeeds.
    auth: Option<nvme_auth::Controller>,
}

impl Driver {
    async fn run(&mut self, mut stop: watch::Receiver<bool>) -> io::Result<()> {
        let mut tick = tokio::time::interval(PUBLISH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stopping = false;
        let mut last_work = std::time::Instant::now();
        loop {
            self.handle_received();
            self.queue.out.write_to(&mut Out(&self.stream))?;
            self.stats.sent(self.running as u32, 0);
            if self.closing && self.queue.out.is_empty() && self.running == 0 {
                return Ok(());
            }
            if stopping && self.running == 0 && self.queue.out.is_empty() {
                return Ok(());
            }
            let want_read = !self.closing && !stopping && self.queue.out.len() < OUTPUT_HIGH_WATER;
            let want_write = !self.queue.out.is_empty();
            // Busy polling as the iSCSI connections do (conn.rs
            // `poll_socket`): after work, for `limits.busy_poll_us`, while
            // nothing runs off the loop.
            let poll_until = last_work + self.shared.busy_poll;
            let busy_poll = want_read
                && !want_write
                && self.running == 0
                && std::time::Instant::now() < poll_until;
            tokio::select! {
                biased;
                r = self.stream.readable(), if want_read => {
                    r?;
                    if self.read(false)? {
                        last_work = std::time::Instant::now();
                    }
                }
                r = self.stream.writable(), if want_write => r?,
                Some(d) = self.rx.recv() => {
                    last_work = std::time::Instant::now();
                    self.finish_off_loop(d);
                    while let Ok(d) = self.rx.try_recv() {
                        self.finish_off_loop(d);
                    }
                }
                _ = tick.tick() => {
                    self.stats.publish();
                    if let Some(c) = self.ctrl.clone() {
                        if self.queue.qid == 0 && c.expired() {
                            tracing::warn!(peer = %self.peer, cntlid = c.cntlid, kato_ms = c.kato_ms(), "NVMe/TCP keep alive timeout: controller ended");
                        }
                        if c.is_dead() {
                            return Ok(());
                        }
                        if self.queue.qid == 0 && !c.discovery && c.ana_changed() {
                            tracing::info!(peer = %self.peer, cntlid = c.cntlid, state = ?c.access_state(), "NVMe/TCP ANA state changed");
                            self.aen_pending = true;
                        }
                        if self.queue.qid == 0 && !c.discovery && c.namespaces_changed() {
                            tracing::info!(peer = %self.peer, cntlid = c.cntlid, "NVMe/TCP namespaces changed");
                            self.ns_aen_pending = true;
                        }
                        self.deliver_aen(&c);
                    }
                }
                _ = stop.changed(), if !stopping => stopping = true,
                r = poll_socket(&self.stream, poll_until), if busy_poll => {
                    r?;
                    if self.read(true)? {
                        last_work = std::time::Instant::now();
                    }
                }
            }
        }
    }

    /// Reads what the socket has into the receive buffer (through tokio,
    /// or with a plain `recv(2)` when polling); whether anything came.
    fn read(&mut self, polling: bool) -> io::Result<bool> {
        use bytes::BufMut;
        use std::os::fd::AsFd;
        let r = match &mut self.landing {
            // A large H2CData's data: straight into its command's buffer.
            Some(l) if l.left > 0 => {
                let left = l.left;
                let room = self.queue.landing_room(l);
                let mut lim = room.limit(left);
                let r = if polling {
                    netio::recv_into(self.stream.as_fd(), &mut lim, libc::MSG_DONTWAIT)
                } else {
                    self.stream.try_read_buf(&mut lim)
                };
                if let (Ok(n), Some(l)) = (&r, &mut self.landing) {
                    l.left -= n;
                }
                r
            }
            l => {
                if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
                    self.rbuf.reserve(READ_CHUNK);
                }
                // Right after a landed PDU: only its digest and the next
                // header, so that a next H2CData is landed too rather than
                // read here and copied out.
                let want =
                    (l.map_or(0, |l| l.digest) + self.header_first).saturating_sub(self.rbuf.len());
                let lim = if want > 0 { want } else { usize::MAX };
                let mut room = (&mut self.rbuf).limit(lim);
                if polling {
                    netio::recv_into(self.stream.as_fd(), &mut room, libc::MSG_DONTWAIT)
                } else {
                    self.stream.try_read_buf(&mut room)
                }
            }
        };
        match r {
            Ok(0) => Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Frames and handles every complete PDU received.
    fn handle_received(&mut self) {
        self.receive_all();
        self.dispatch_held();
    }

    /// A command received: a Read on an I/O queue is held until the next
    /// command arrives (or the batch ends), and its data prefetched
    /// ([`nvme::nvm::prefetch`]), so that the copy of a RAM LUN's bytes
    /// finds them in the cache after the work on the command before it.
    /// Everything else runs at once, after the held Read; commands still
    /// run in the order they came.
    fn take(&mut self, cmd: Command) {
        let read = self.queue.qid != 0
            && !cmd.bad_digest
            && cmd.sqe.opcode() == nvme::nvm::opc::READ
            && cmd.sqe.fuse() == 0
            && self.fused.is_none();
        if read {
            if let Some(e) = self
                .ns_vols
                .get(cmd.sqe.nsid() as usize)
                .and_then(Option::as_ref)
            {
                nvme::nvm::prefetch(&e.vol, &cmd.sqe);
            }
        }
        self.dispatch_held();
        if read && !self.closing {
            self.held = Some(cmd);
        } else {
            self.dispatch(cmd);
        }
    }

    fn dispatch_held(&mut self) {
        if let Some(h) = self.held.take() {
            self.dispatch(h);
        }
    }

    fn receive_all(&mut self) {
        self.received_at = Instant::now();
        // A controller ended (its subsystem removed, keep-alive expired):
        // nothing more is served, the connection closes.
        if self.ctrl.as_ref().is_some_and(|c| c.is_dead()) {
            self.closing = true;
        }
        while !self.closing {
            if self.landing.is_none() {
                if let Some((header, mut l)) = self.queue.try_land(&self.rbuf) {
                    let _ = self.rbuf.split_to(header);
                    let n = l.left.min(self.rbuf.len());
                    let here = self.rbuf.split_to(n);
                    self.queue.landing_room(&l).extend_from_slice(&here);
                    l.left -= n;
                    self.landing = Some(l);
                }
            }
            if let Some(l) = self.landing {
                if l.left > 0 || self.rbuf.len() < l.digest {
                    return;
                }
                self.landing = None;
                let (hd, _) = self.queue.digests();
                self.header_first = nvme_tcp_wire::DATA_HEADER_LEN + if hd { 4 } else { 0 };
                let digest = self.rbuf.split_to(l.digest);
                match self.queue.finish_landing(l, &digest) {
                    Ok(Some(cmd)) => self.take(cmd),
                    Ok(None) => {}
                    Err(s) => return self.stop(s),
                }
                continue;
            }
            let f = match self.queue.frame(&self.rbuf) {
                Ok(Some(f)) => f,
                Ok(None) => return,
                Err(s) => return self.stop(s),
            };
            self.header_first = 0;
            match self.queue.receive_from(&mut self.rbuf, &f) {
                Ok(Some(cmd)) => self.take(cmd),
                Ok(None) => {}
                Err(s) => return self.stop(s),
            }
        }
    }

    fn stop(&mut self, s: Stop) {
        self.dispatch_held();
        match s {
            Stop::Fatal(f) => {
                tracing::warn!(peer = %self.peer, error = %f, "NVMe/TCP fatal transport error: C2HTermReq sent, connection closed");
            }
            Stop::HostTerminated { fes } => {
                tracing::warn!(peer = %self.peer, fes, "NVMe/TCP host terminated the connection (H2CTermReq)");
            }
        }
        self.closing = true;
    }

    fn complete(&mut self, cid: u16, r: Reply) {
        self.queue.complete(cid, r.status, r.result, r.data);
    }

    /// Answers a command that ran off the loop, and counts it.
    fn finish_off_loop(&mut self, d: Done) {
        self.running -= 1;
        self.count(d.io, &d.reply);
        self.queue
            .complete(d.cid, d.reply.status, d.reply.result, d.reply.data);
    }

    /// Counts an I/O command's completion.
    fn count(&mut self, c: Counted, r: &Reply) {
        if c.lun != u16::MAX {
            let status = if r.status.is_success() { 0 } else { 2 };
            self.stats
                .completed_kind(c.lun, c.kind, c.bytes, status, c.start);
        }
    }

    fn dispatch(&mut self, cmd: Command) {
        let cid = cmd.sqe.cid();
        if cmd.bad_digest {
            return self.complete(cid, Reply::status(Status::TRANSIENT_TRANSPORT_ERROR));
        }
        let Some(ctrl) = self.ctrl.clone() else {
            return self.connect(cmd);
        };
        if cmd.sqe.opcode() == OPC_FABRICS
            && matches!(
                cmd.sqe.fctype(),
                fctype::AUTHENTICATION_SEND | fctype::AUTHENTICATION_RECEIVE
            )
        {
            return self.authenticate(&ctrl, cmd);
        }
        if self.auth.as_ref().is_some_and(|a| !a.authenticated())
            && !(cmd.sqe.opcode() == OPC_FABRICS && cmd.sqe.fctype() == fctype::DISCONNECT)
        {
            let (sct, sc) = nvme_auth::AUTH_REQUIRED;
            return self.complete(cid, Reply::status(Status { sct, sc, dnr: true }));
        }
        if cmd.sqe.opcode() == OPC_FABRICS {
            match cmd.sqe.fctype() {
                // A second Connect on a queue.
                fctype::CONNECT => {
                    return self.complete(cid, Reply::status(Status::generic(0x0c, true)))
                }
                fctype::DISCONNECT if self.queue.qid != 0 => {
                    self.complete(cid, Reply::default());
                    self.closing = true;
                    return;
                }
                _ if self.queue.qid != 0 => {
                    return self.complete(cid, Reply::status(Status::INVALID_OPCODE))
                }
                _ => {}
            }
        }
        if self.queue.qid == 0 {
            let ports = self.shared.nvme.ports.read().clone();
            let cx = Context {
                registry: &self.shared.nvme.registry,
                ports: &ports,
                aers_held: self.held_aers.len(),
            };
            match admin::execute(&ctrl, &cx, &cmd.sqe) {
                Outcome::Reply(r) => self.complete(cid, r),
                Outcome::Held => {
                    self.held_aers.push(cid);
                    self.deliver_aen(&ctrl);
                }
            }
            return;
        }
        self.io(&ctrl, cmd);
    }

    /// Authentication Send / Receive (NVMe Base 2.0 §8.13; `nvme_auth`):
    /// the DH-HMAC-CHAP transaction of this queue. A failed one ends the
    /// association once AUTH_Failure1 is sent.
    fn authenticate(&mut self, ctrl: &Arc<Controller>, cmd: Command) {
        let cid = cmd.sqe.cid();
        let Some(auth) = self.auth.as_mut() else {
            // The subsystem does not authenticate: no such command here.
            return self.complete(cid, Reply::status(Status::INVALID_OPCODE));
        };
        let Some(len) = nvme_auth::check_command(cmd.sqe.dw(10), cmd.sqe.dw(11)) else {
            return self.complete(cid, Reply::status(Status::INVALID_FIELD));
        };
        if cmd.sqe.fctype() == fctype::AUTHENTICATION_SEND {
            if cmd.data.len() != len {
                return self.complete(cid, Reply::status(Status::generic(0x0f, true)));
            }
            auth.send(&cmd.data.to_vec());
            return self.complete(cid, Reply::default());
        }
        let mut random = |b: &mut [u8]| {
            getrandom::fill(b).expect("the OS random source");
        };
        match auth.receive(len, &mut random) {
            Ok(m) => {
                let fatal = auth.fatal();
                let ok = auth.authenticated();
                self.complete(
                    cid,
                    Reply {
                        data: Chain::from(m),
                        ..Reply::default()
                    },
                );
                if fatal {
                    tracing::warn!(peer = %self.peer, host = %ctrl.hostnqn, subsystem = %ctrl.subsystem.nqn, qid = self.queue.qid, "NVMe/TCP DH-HMAC-CHAP authentication failed: controller ended");
                    self.shared
                        .stats
                        .portal_event(self.portal.tpgt, |e| e.login_failures += 1);
                    ctrl.kill();
                    self.closing = true;
                } else if ok {
                    tracing::debug!(peer = %self.peer, host = %ctrl.hostnqn, qid = self.queue.qid, "NVMe/TCP queue authenticated (DH-HMAC-CHAP)");
                }
            }
            // Command Sequence Error.
            Err(_) => self.complete(cid, Reply::status(Status::generic(0x0c, true))),
        }
    }

    /// Completes held Asynchronous Event Requests with the pending notices
    /// (ANA change, Namespace Attribute Changed) the host enabled; a notice
    /// it did not enable is dropped (the log pages still tell).
    fn deliver_aen(&mut self, c: &Controller) {
        let aec = c.aec();
        if self.aen_pending && aec & admin::AEC_ANA_CHANGE == 0 {
            self.aen_pending = false;
        }
        if self.ns_aen_pending && aec & admin::AEC_NS_ATTR == 0 {
            self.ns_aen_pending = false;
        }
        while self.aen_pending || self.ns_aen_pending {
            let Some(cid) = self.held_aers.pop() else {
                return;
            };
            let result = if self.aen_pending {
                self.aen_pending = false;
                admin::AEN_ANA_CHANGE
            } else {
                self.ns_aen_pending = false;
                admin::AEN_NS_CHANGED
            };
            self.queue
                .complete(cid, Status::SUCCESS, result, Chain::new());
        }
    }

    /// An NVM command on an I/O queue.
    fn io(&mut self, ctrl: &Controller, cmd: Command) {
        let cid = cmd.sqe.cid();
        let op = cmd.sqe.opcode();
        // Fused operations (Base 2.0 "Fused Operations"): a Compare marked
        // first waits for the next command; a pair that does not match
        // fails with Missing Fused Command, the rest goes on as usual.
        let second = match self.fused.take() {
            Some(first) if nvme::nvm::is_compare_and_write(&first.sqe, &cmd.sqe) => Some(first),
            Some(first) => {
                self.complete(first.sqe.cid(), Reply::status(nvme::nvm::MISSING_FUSED));
                None
            }
            None => None,
        };
        match cmd.sqe.fuse() {
            0 => {}
            1 if op == nvme::nvm::opc::COMPARE => {
                self.fused = Some(cmd);
                return;
            }
            2 if second.is_some() => {}
            2 => return self.complete(cid, Reply::status(nvme::nvm::MISSING_FUSED)),
            // Only Compare and Write is fused here; FUSE 11b is reserved.
            _ => return self.complete(cid, Reply::status(Status::INVALID_FIELD)),
        }
        if !nvme::nvm::is_known(op) && !resv::is_reservation(op) {
            return self.complete(cid, Reply::status(Status::INVALID_OPCODE));
        }
        // Through a standby or unavailable port group: ANA inaccessible,
        // for the host to go another way.
        if matches!(
            ctrl.access_state(),
            AccessState::Standby | AccessState::Unavailable
        ) {
            return self.refuse(cid, second, Status::path(0x02));
        }
        let ns = &ctrl.subsystem.namespaces;
        let nsid = cmd.sqe.nsid();
        if op == nvme::nvm::opc::FLUSH && nsid == 0xffff_ffff {
            let vols: Vec<Arc<Volume>> = ns
                .active()
                .into_iter()
                .filter_map(|n| ns.volume(n))
                .collect();
            return self.off_loop(cid, move || {
                for v in vols {
                    if v.flush().is_err() {
                        return Reply::status(Status::media(0x80, false));
                    }
                }
                Reply::default()
            });
        }
        let g = ns.generation();
        if self.ns_generation != Some(g) {
            self.ns_vols.clear();
            for n in ns.active() {
                let i = n as usize;
                if self.ns_vols.len() <= i {
                    self.ns_vols.resize(i + 1, None);
                }
                self.ns_vols[i] = ns.volume(n).map(|vol| NsEntry {
                    vol,
                    resv: ns.reservations(n),
                });
            }
            self.ns_generation = Some(g);
        }
        let Some(entry) = self.ns_vols.get(nsid as usize).and_then(Option::as_ref) else {
            return self.refuse(cid, second, Status::INVALID_NAMESPACE);
        };
        if resv::is_reservation(op) {
            let Some(r) = entry.resv.clone() else {
                return self.complete(cid, Reply::status(Status::INVALID_OPCODE));
            };
            // Off the loop: a change may write the reservation state file.
            let host = ctrl.host_id;
            let Command { sqe, data, .. } = cmd;
            return self.off_loop(cid, move || resv::execute(&*r, &host, &sqe, data));
        }
        // Reservations (Base 2.0 "Command Behavior in the Presence of a
        // Reservation"): one atomic load while nothing is reserved. A fused
        // Compare and Write is of the write group.
        if let (Some(r), Some(write)) = (&entry.resv, resv::write_group(op)) {
            if r.active() && r.conflicts(&ctrl.host_id, write || second.is_some()) {
                return self.refuse(cid, second, resv::RESERVATION_CONFLICT);
            }
        }
        let vol = entry.vol.clone();
        if let Some(first) = second {
            return self.compare_and_write(vol, first, cmd);
        }
        let counted = Counted {
            lun: u16::try_from(nsid - 1).unwrap_or(u16::MAX),
            kind: match op {
                nvme::nvm::opc::READ => IoKind::Read,
                nvme::nvm::opc::WRITE => IoKind::Write,
                _ => IoKind::Other,
            },
            bytes: match op {
                nvme::nvm::opc::READ | nvme::nvm::opc::WRITE => {
                    ((cmd.sqe.dw(12) & 0xffff) + 1) << vol.block_shift()
                }
                _ => 0,
            },
            start: self.received_at,
        };
        let caps = vol.backend().caps();
        let inline = !caps.may_block
            && (direction(&cmd.sqe) & 1 == 0 || cmd.data.len() <= caps.inline_write_max);
        if inline {
            let r = nvme::nvm::execute(&vol, &cmd.sqe, cmd.data, cmd.owned);
            self.count(counted, &r);
            return self.complete(cid, r);
        }
        let Command {
            sqe, data, owned, ..
        } = cmd;
        self.off_loop_counted(cid, counted, move || {
            nvme::nvm::execute(&vol, &sqe, data, owned)
        });
    }

    /// Answers command `cid`, and the first command of its fused pair if
    /// it has one, with `status`.
    fn refuse(&mut self, cid: u16, first: Option<Command>, status: Status) {
        if let Some(f) = first {
            self.complete(f.sqe.cid(), Reply::status(status));
        }
        self.complete(cid, Reply::status(status));
    }

    /// A fused Compare and Write (`first` the Compare, `second` the
    /// Write): both complete, on the loop or, on a backend that may block,
    /// from the I/O pool.
    fn compare_and_write(&mut self, vol: Arc<Volume>, first: Command, second: Command) {
        let (c1, c2) = (first.sqe.cid(), second.sqe.cid());
        let lun = u16::try_from(first.sqe.nsid() - 1).unwrap_or(u16::MAX);
        let bytes = second.data.len() as u32;
        let start = self.received_at;
        let counted = |kind, bytes| Counted {
            lun,
            kind,
            bytes,
            start,
        };
        let (k1, k2) = (counted(IoKind::Other, 0), counted(IoKind::Write, bytes));
        let may_block = vol.backend().caps().may_block;
        let run = move || {
            nvme::nvm::compare_and_write(&vol, &first.sqe, first.data, &second.sqe, second.data)
        };
        if !may_block {
            let (r1, r2) = run();
            self.count(k1, &r1);
            self.complete(c1, r1);
            self.count(k2, &r2);
            return self.complete(c2, r2);
        }
        self.running += 2;
        let tx = self.tx.clone();
        tokio::task::spawn_blocking(move || {
            let (r1, r2) = run();
            let _ = tx.send(Done {
                cid: c1,
                reply: r1,
                io: k1,
            });
            let _ = tx.send(Done {
                cid: c2,
                reply: r2,
                io: k2,
            });
        });
    }

    /// Runs `f` on the blocking pool; its reply comes back through the
    /// channel.
    fn off_loop(&mut self, cid: u16, f: impl FnOnce() -> Reply + Send + 'static) {
        let none = Counted {
            lun: u16::MAX,
            kind: IoKind::Other,
            bytes: 0,
            start: Instant::now(),
        };
        self.off_loop_counted(cid, none, f);
    }

    fn off_loop_counted(
        &mut self,
        cid: u16,
        io: Counted,
        f: impl FnOnce() -> Reply + Send + 'static,
    ) {
        self.running += 1;
        let tx = self.tx.clone();
        tokio::task::spawn_blocking(move || {
            let reply = f();
            let _ = tx.send(Done { cid, reply, io });
        });
    }

    /// The first command of a queue: Connect.
    fn connect(&mut self, cmd: Command) {
        let cid = cmd.sqe.cid();
        if cmd.sqe.opcode() != OPC_FABRICS || cmd.sqe.fctype() != fctype::CONNECT {
            // Command Sequence Error: nothing but Connect before Connect.
            return self.complete(cid, Reply::status(Status::generic(0x0c, true)));
        }
        let c = ConnectCmd::decode(&cmd.sqe);
        let data = match ConnectData::decode(&cmd.data.to_vec()) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(peer = %self.peer, error = %e, "NVMe/TCP Connect refused");
                return self.complete(cid, Reply::status(Status::INVALID_FIELD));
            }
        };
        if let Err(why) = self.admitted(&data) {
            tracing::warn!(peer = %self.peer, host = %data.hostnqn, subsystem = %data.subnqn, "NVMe/TCP Connect refused: {why}");
            return self.complete(cid, Reply::status(Status::specific(0x84)));
        }
        match self
            .shared
            .nvme
            .registry
            .connect(&c, &data, self.portal.alua_group)
        {
            Ok(ctrl) => {
                self.queue
                    .connected(c.qid, c.sqsize + 1, c.sqflow_disabled());
                let (hd, dd) = self.queue.digests();
                self.shared
                    .stats
                    .portal_event(self.portal.tpgt, |e| e.logins += 1);
                if c.qid != 0 {
                    self.register_stats(&ctrl, &data, c.qid, c.sqsize + 1);
                }
                if c.qid == 0 {
                    tracing::info!(peer = %self.peer, port = %self.portal.addr, host = %data.hostnqn, subsystem = %data.subnqn, cntlid = ctrl.cntlid, kato_ms = ctrl.kato_ms(), header_digest = hd, data_digest = dd, "NVMe/TCP controller created");
                } else {
                    tracing::debug!(peer = %self.peer, cntlid = ctrl.cntlid, qid = c.qid, sqsize = c.sqsize + 1, "NVMe/TCP I/O queue connected");
                }
                // Connect response: CNTLID in bits 15:0; AUTHREQ ATR
                // when the subsystem authenticates its hosts (every queue
                // then runs its own transaction).
                let mut result = u64::from(ctrl.cntlid);
                if let Some(keys) = &ctrl.subsystem.dhchap {
                    if !ctrl.discovery {
                        result |= u64::from(nvme_auth::AUTHREQ_ATR);
                        self.auth = Some(nvme_auth::Controller::new(
                            keys.clone(),
                            &data.hostnqn,
                            &ctrl.subsystem.nqn,
                        ));
                    }
                }
                self.ctrl = Some(ctrl);
                self.queue
                    .complete(cid, Status::SUCCESS, result, Chain::new());
            }
            Err(r) => {
                self.shared
                    .stats
                    .portal_event(self.portal.tpgt, |e| e.login_failures += 1);
                tracing::warn!(peer = %self.peer, host = %data.hostnqn, subsystem = %data.subnqn, qid = c.qid, status = ?r.status, "NVMe/TCP Connect refused");
                let cqe_status = r.status;
                self.queue.complete(cid, cqe_status, r.result, Chain::new());
            }
        }
    }

    /// Publishes this I/O queue's counters as a session's.
    fn register_stats(&mut self, ctrl: &Controller, data: &ConnectData, qid: u16, entries: u16) {
        let target = self
            .shared
            .target_by_nqn(&data.subnqn)
            .map_or_else(|| data.subnqn.clone(), |t| t.name.clone());
        let (hd, dd) = self.queue.digests();
        let info = SessionInfo {
            id: self.shared.stats.next_id(),
            protocol: "nvme-tcp",
            initiator: data.hostnqn.clone(),
            isid: format!("{}.{qid}", ctrl.cntlid),
            tsih: ctrl.cntlid,
            target,
            peer: self.peer.to_string(),
            portal: self.portal.addr.to_string(),
            tpgt: self.portal.tpgt,
            since: crate::stats::unix_now(),
            header_digest: hd,
            data_digest: dd,
            send_max_data_segment: volume::MAX_TRANSFER_BYTES,
            recv_max_data_segment: nvme::queue::MAXH2CDATA,
            queue_depth: u32::from(entries),
            ..SessionInfo::default()
        };
        let s = self.shared.stats.register(info);
        self.stats = ConnStats::new(Some(s.clone()));
        self.stats_shared = Some(s);
    }

    /// Whether the target behind `data.subnqn` lets this host in (module
    /// docs); the host NQN allow-list is the registry's.
    fn admitted(&self, data: &ConnectData) -> Result<(), &'static str> {
        if data.subnqn == nvme::DISCOVERY_NQN {
            return Ok(());
        }
        let Some(t) = self.shared.target_by_nqn(&data.subnqn) else {
            return Ok(()); // the registry refuses an unknown NQN
        };
        let dhchap = self
            .shared
            .nvme
            .registry
            .subsystem(&data.subnqn)
            .is_some_and(|s| s.dhchap.is_some());
        if self.shared.access.chap_of(&t.name).initiator.is_some() && !dhchap {
            return Err("the target requires CHAP and has no DH-HMAC-CHAP secret for NVMe/TCP hosts: the subsystem is not reachable over NVMe/TCP");
        }
        let ok =
            self.shared.access.rules(&t.name).is_none_or(|r| {
                r.nets.is_empty() || r.nets.iter().any(|n| n.contains(self.peer.ip()))
            });
        if !ok {
            return Err("source address not in the target's allow_net");
        }
        Ok(())
    }
}
