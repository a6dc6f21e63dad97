//! One connection's driver: the login phase, then the full feature phase
//! loop (docs/ARCHITECTURE.md "The data path").
//!
//! The loop reads whatever the socket has into one buffer, frames and
//! handles every complete PDU in it, runs commands whose backend cannot
//! block right there and hands the others to I/O threads, then sends all
//! queued responses with vectored writes. Reading pauses while more than
//! [`OUTPUT_HIGH_WATER`] bytes wait to be sent, so an initiator that stops
//! reading costs bounded memory and nothing to other connections.

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bufpool::WriteData;
use bytes::BufMut;
use iscsi_proto::login::{LoginStatus, LoginStep, TargetLogin};
use iscsi_proto::session::{CloseReason, Completion, Event, ExecRequest, Host, Session, TmfAction};
use iscsi_proto::SessionType;
use iscsi_wire::frame::FrameLimits;
use iscsi_wire::outbox::{Digests, WriteOut};
use iscsi_wire::pdu::{opcode, Itt, LoginReq, LoginResp, Lun, Opcode, SnTriple};
use iscsi_wire::receive::{ReadInto, Receiver};
use iscsi_wire::{FrameError, Outbox, RawPdu};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use crate::lunmap::{answer_above_lu, run_on_lu, submit_fast, LunTable, Origin, TargetRt};
use crate::server::{AbortRequests, Portal, SessionEntry, SessionKey, Shared};
use crate::stats::{ConnStats, SessionInfo, PUBLISH_EVERY};

/// Numbers the connections that serve sessions (crate::server::SessionEntry::conn).
static NEXT_CONN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// How long a connection reinstatement waits for the old connection to end.
const REINSTATE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How often an idle connection publishes its stats and checks whether to
/// ping (`PUBLISH_EVERY` while it works).
const IDLE_TICK: std::time::Duration = std::time::Duration::from_secs(1);
/// Stop reading while this much output is queued.
const OUTPUT_HIGH_WATER: usize = 8 << 20;

struct ConnHost<'a> {
    shared: &'a Shared,
    lus: Option<&'a LunTable>,
    peer: std::net::IpAddr,
    /// The session's nexus and port, for writes received in place.
    origin: &'a Origin,
}

impl Host for ConnHost<'_> {
    fn send_targets(&self, initiator: &str, value: &str, session_target: Option<&str>) -> Vec<u8> {
        // Discovery shows only the targets this initiator may log in to.
        let visible: Vec<_> = self
            .shared
            .listings()
            .into_iter()
            .filter(|l| self.shared.access.visible(&l.name, initiator, self.peer))
            .collect();
        iscsi_proto::discovery::send_targets(&visible, value, session_target)
    }

    fn lun_exists(&self, lun: Lun) -> bool {
        self.lus.is_some_and(|t| t.get(lun).is_some())
    }

    fn data_out_len(&self, lun: Lun, cdb: &[u8]) -> u32 {
        self.lus
            .and_then(|t| t.get(lun))
            .map_or(0, |lu| lu.plan(cdb).data_out)
    }

    fn place_write(&self, lun: Lun, cdb: &[u8], len: u32) -> Option<filemap::Placed> {
        let lu = self.lus?.get(lun)?;
        crate::lunmap::place_write(lu, cdb, len, self.origin)
    }

    fn reset(&self, action: TmfAction) {
        let Some(t) = self.lus else { return };
        match action {
            TmfAction::LunReset(lun) => {
                if let Some(lu) = t.get(lun) {
                    lu.reset();
                }
            }
            TmfAction::TargetReset { .. } => t.iter().for_each(|(_, lu)| lu.reset()),
        }
    }
}

/// Serves one accepted connection until it closes.
pub(crate) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    portal: Portal,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(_slot) = shared.access.connection_slot(peer.ip()) else {
        tracing::warn!(%peer, "connection limit reached: closed");
        return;
    };
    // Its place among the connections still logging in (a newer one may
    // take it: crate::admission).
    let ticket = shared.access.admission.admit(peer.ip());
    let mut c = Conn::new(stream, peer, &shared);
    // A connection still logging in has nothing in flight: shutdown ends it.
    let login = tokio::select! {
        r = tokio::time::timeout(shared.login_timeout, c.login(&shared, portal, &ticket)) => r,
        _ = shutdown.changed() => return,
        _ = ticket.evicted.notified() => {
            tracing::debug!(%peer, "still logging in and evicted for a newer connection");
            return;
        }
    };
    drop(ticket);
    let login = match login {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "connection ended during login");
            None
        }
        Err(_) => {
            tracing::warn!(%peer, "login timed out");
            None
        }
    };
    let Some((session, joined, isid)) = login else {
        shared
            .stats
            .portal_event(portal.tpgt, |e| e.login_failures += 1);
        return;
    };
    shared.stats.portal_event(portal.tpgt, |e| e.logins += 1);
    // What the login registered, taken then: another login of the same
    // session may replace or remove the registry entry since (this
    // connection's kill is then notified, and it ends at once).
    let (key, nexus, kill, aborts, tsih, conn_id, done) = match joined {
        Some(j) => (
            Some(j.key),
            j.nexus,
            j.kill,
            j.aborts,
            j.tsih,
            j.conn,
            Some(j.done),
        ),
        None => (
            None,
            shared.fresh_nexus(),
            Arc::new(tokio::sync::Notify::new()),
            Arc::default(),
            0,
            0,
            None,
        ),
    };
    let target = shared.target(&session.params().target_name);
    tracing::info!(
        %peer,
        initiator = %session.params().initiator_name,
        target = %session.params().target_name,
        discovery = session.params().session_type == SessionType::Discovery,
        header_digest = session.params().header_digest,
        data_digest = session.params().data_digest,
        "login"
    );
    let origin = origin_of(&session, nexus, portal, isid, target.as_deref());
    let stats = key.as_ref().map(|_| {
        shared
            .stats
            .register(session_info(&shared, &session, peer, portal, isid, tsih))
    });
    let mut conn_stats = ConnStats::new(stats.clone());
    // How long the session outlives a failed connection (RFC 7143 §13.16:
    // DefaultTime2Retain is also the session state timeout when the last
    // connection fails; 0: discarded at once).
    let retain = {
        let p = session.params();
        (p.time2retain > 0).then(|| {
            std::time::Duration::from_secs(u64::from(p.time2wait) + u64::from(p.time2retain))
        })
    };
    let why = c
        .full_feature(
            session,
            &shared,
            target.as_deref(),
            origin,
            (kill, aborts),
            shutdown,
            &mut conn_stats,
        )
        .await;
    conn_stats.finish();
    tracing::info!(%peer, reason = %why, "connection closed");
    if let Some(s) = &stats {
        shared.stats.retire(s);
    }
    if !matches!(why, Closed::Logout | Closed::ShuttingDown) {
        shared.stats.portal_event(portal.tpgt, |e| e.dropped += 1);
    }
    // A connection reinstatement (RFC 7143 §6.3.4) handed the session, and
    // its I_T nexus, to a new connection: the nexus goes on there. A
    // connection that failed (no logout, not ended by the target) leaves
    // its session failed but kept for the negotiated time, waiting for a
    // reinstatement; then it is discarded (RFC 7143 §6.3.6).
    let failed = !matches!(
        why,
        Closed::Logout | Closed::ShuttingDown | Closed::EndedByTarget
    );
    let keep_nexus = key
        .as_ref()
        .is_some_and(|k| keep_session(&shared, k, nexus, conn_id, retain.filter(|_| failed), tsih));
    if let (Some(t), false) = (target, keep_nexus) {
        t.luns().iter().for_each(|(_, lu)| lu.nexus_lost(nexus));
    }
    if let Some(d) = done {
        d.notify_one();
    }
    crate::memory::connection_ended();
}

/// After a connection of session `k` closed: whether the session's I_T
/// nexus goes on. It does when a connection reinstatement (RFC 7143
/// §6.3.4) handed the session to a new connection, or when the connection
/// failed and the session is kept for `retain` (its negotiated time),
/// waiting for a reinstatement, then discarded (RFC 7143 §6.3.6).
fn keep_session(
    shared: &Arc<Shared>,
    k: &SessionKey,
    nexus: scsi::NexusId,
    conn_id: u64,
    retain: Option<std::time::Duration>,
    tsih: u16,
) -> bool {
    let mut keep_nexus = false;
    let mut reg = shared.registry.lock();
    match reg.get_mut(k) {
        Some(e) if e.nexus == nexus && e.conn != conn_id => keep_nexus = true,
        Some(e) if e.nexus == nexus => match retain {
            Some(wait) => {
                e.conn = 0;
                e.failed_by = conn_id;
                keep_nexus = true;
                tracing::info!(
                    initiator = %k.initiator,
                    tsih,
                    seconds = wait.as_secs(),
                    "session failed: kept for reinstatement"
                );
                tokio::spawn(discard_failed_session(
                    shared.clone(),
                    k.clone(),
                    conn_id,
                    wait,
                ));
            }
            None => {
                reg.remove(k);
            }
        },
        _ => {}
    }
    keep_nexus
}

/// What a login registered for its session (a copy of its registry entry
/// as it was then).
struct Joined {
    key: SessionKey,
    nexus: scsi::NexusId,
    kill: Arc<tokio::sync::Notify>,
    aborts: Arc<AbortRequests>,
    tsih: u16,
    conn: u64,
    done: Arc<tokio::sync::Notify>,
}

impl Joined {
    fn of(key: SessionKey, e: &SessionEntry) -> Joined {
        Joined {
            key,
            nexus: e.nexus,
            kill: e.kill.clone(),
            aborts: e.aborts.clone(),
            tsih: e.tsih,
            conn: e.conn,
            done: e.done.clone(),
        }
    }
}

/// The session's nexus and port as the LUs see it, from the login.
fn origin_of(
    session: &Session,
    nexus: scsi::NexusId,
    portal: Portal,
    isid: [u8; 6],
    target: Option<&TargetRt>,
) -> Origin {
    let p = session.params();
    Origin {
        nexus,
        relative_port: portal.tpgt,
        tpg: portal.alua_group,
        port_name: format!("{},t,0x{:04x}", p.target_name, portal.tpgt),
        initiator_port_name: format!(
            "{},i,0x{}",
            p.initiator_name,
            isid.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
        lus: target.map(|t| crate::lunmap::LunSet(t.luns())),
        // Under a data digest too: the outbox computes the digest over the
        // file's pages with its writers held off (iscsi_wire::outbox).
        zero_copy_reads: true,
    }
}

/// Discards session `k`, failed when connection `conn` ended, after
/// `wait` unless a connection took it over (or another session replaced
/// it) meanwhile: its I_T nexus is then lost.
async fn discard_failed_session(
    shared: Arc<Shared>,
    k: SessionKey,
    conn: u64,
    wait: std::time::Duration,
) {
    tokio::time::sleep(wait).await;
    let gone = {
        let mut reg = shared.registry.lock();
        match reg.get(&k) {
            Some(e) if e.conn == 0 && e.failed_by == conn => reg.remove(&k),
            _ => None,
        }
    };
    if let Some(e) = gone {
        tracing::info!(initiator = %k.initiator, tsih = e.tsih, "failed session discarded (Time2Retain over)");
        if let Some(t) = shared.target(&k.target) {
            t.luns().iter().for_each(|(_, lu)| lu.nexus_lost(e.nexus));
        }
    }
}

/// The value of `key` (e.g. `b"CHAP_R="`) in a login text segment
/// (NUL-separated `key=value` pairs, RFC 7143 §6.1).
fn text_value<'a>(data: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    data.split(|b| *b == 0).find_map(|kv| kv.strip_prefix(key))
}

/// The session list's description of a session that just logged in.
fn session_info(
    shared: &Shared,
    session: &Session,
    peer: SocketAddr,
    portal: Portal,
    isid: [u8; 6],
    tsih: u16,
) -> SessionInfo {
    let p = session.params();
    SessionInfo {
        id: shared.stats.next_id(),
        protocol: "iscsi",
        initiator: p.initiator_name.clone(),
        initiator_alias: p.initiator_alias.clone(),
        isid: isid.iter().map(|b| format!("{b:02x}")).collect(),
        tsih,
        target: p.target_name.clone(),
        peer: peer.to_string(),
        portal: portal.addr.to_string(),
        tpgt: portal.tpgt,
        since: crate::stats::unix_now(),
        header_digest: p.header_digest,
        data_digest: p.data_digest,
        send_max_data_segment: p.send_max_data_segment,
        recv_max_data_segment: p.recv_max_data_segment,
        max_burst: p.max_burst,
        first_burst: p.first_burst,
        immediate_data: p.immediate_data,
        initial_r2t: p.initial_r2t,
        max_outstanding_r2t: p.max_outstanding_r2t,
        queue_depth: shared.limits.queue_depth,
    }
}

struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    /// Received bytes, cut into PDUs, large data segments landed in place.
    rx: Receiver,
    out: Outbox,
}

impl Conn {
    /// An accepted connection, with the socket options the server is
    /// configured for (no Nagle, buffer sizes, congestion control).
    fn new(stream: TcpStream, peer: SocketAddr, shared: &Shared) -> Conn {
        configure_socket(&stream, shared);
        Conn {
            stream,
            peer,
            rx: Receiver::new(),
            out: Outbox::new(),
        }
    }
    /// Reads more bytes; `Ok(false)` at end of stream.
    async fn fill(&mut self) -> io::Result<bool> {
        loop {
            self.stream.readable().await?;
            let mut from = Via(ReadVia::Tokio, &self.stream);
            match self.rx.read(&mut from) {
                Ok(n) => return Ok(n > 0),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads once the socket was found readable (`ready`: how waiting for
    /// that went): `Ok(true)` when bytes came, `Err(why)` when the
    /// connection is over.
    fn read_ready(&mut self, ready: io::Result<()>, via: ReadVia) -> Result<bool, Closed> {
        ready.map_err(|_| Closed::ReadFailed)?;
        match self.rx.read(&mut Via(via, &self.stream)) {
            Ok(0) => Err(Closed::ByInitiator),
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(_) => Err(Closed::ReadFailed),
        }
    }

    /// The next complete PDU received, `Ok(None)` when more bytes are
    /// needed, `Err(why)` when the stream cannot be framed. A large data
    /// segment the session has a place for is received straight into it
    /// (docs/ARCHITECTURE.md: data-out lands where it is going;
    /// [`iscsi_wire::receive`]).
    fn next_pdu(
        &mut self,
        lim: &FrameLimits,
        session: &mut Session,
        host: &dyn Host,
    ) -> Result<Option<RawPdu>, Closed> {
        let land_min = iscsi_proto::session::LAND_MIN as usize;
        self.rx
            .next_pdu(lim, land_min, |bhs| session.landing(bhs, host))
            .map_err(|e| match e {
                FrameError::HeaderDigest => {
                    tracing::warn!(error = %e, "bad PDU");
                    Closed::HeaderDigestError
                }
                e => {
                    tracing::warn!(error = %e, "unframeable PDU");
                    Closed::Unframeable
                }
            })
    }

    /// Writes everything queued.
    async fn flush(&mut self) -> io::Result<()> {
        while !self.out.is_empty() {
            self.stream.writable().await?;
            self.try_flush()?;
        }
        Ok(())
    }

    /// Writes what the socket takes without waiting ([`Outbox::write_to`]:
    /// file ranges by `sendfile` or from their mapping; a range that ends
    /// early is an error that closes the connection).
    fn try_flush(&mut self) -> io::Result<()> {
        self.out.write_to(&mut Out(&self.stream)).map(|_| ())
    }

    fn push_login(&mut self, resp: &LoginResp, text: &[u8]) {
        self.out
            .push(&resp.encode(text.len()), text, Digests::default());
    }

    /// Runs the login phase. `Ok(None)` when it ended without a session.
    async fn login(
        &mut self,
        shared: &Shared,
        portal: Portal,
        ticket: &crate::admission::Ticket,
    ) -> io::Result<Option<(Session, Option<Joined>, [u8; 6])>> {
        let mut login = TargetLogin::new(shared.limits.clone(), portal.tpgt);
        let (id, challenge) = crate::access::random_challenge()?;
        login.seed_challenge(id, challenge);
        let dir = crate::access::Directory {
            shared,
            tpgt: portal.tpgt,
            peer: self.peer.ip(),
        };
        let lim = FrameLimits::LOGIN;
        let mut first = true;
        // Until the security stage is over, reading is bounded by its
        // deadline (crate::admission).
        let security_deadline = tokio::time::Instant::now() + shared.security_timeout;
        let mut authenticated = false;
        let mut initiator = String::new();
        loop {
            let Some(raw) = self
                .login_pdu(shared, &lim, authenticated, security_deadline)
                .await?
            else {
                return Ok(None);
            };
            if opcode(&raw.bhs) != Opcode::LoginReq {
                // Only Login Requests are valid before full feature phase.
                let r = login_reject(&raw.bhs, LoginStatus::INVALID_DURING_LOGIN);
                self.push_login(&r, &[]);
                self.flush().await?;
                return Ok(None);
            }
            let req = LoginReq::decode(&raw.bhs);
            if first && req.tsih != 0 {
                // A connection for an existing session (reconnect_refusal).
                let code = reconnect_refusal(shared, &req);
                if let Some(code) = code {
                    self.push_login(&login_reject(&raw.bhs, code), &[]);
                    self.flush().await?;
                    return Ok(None);
                }
            }
            first = false;
            if let Some(name) = text_value(&raw.data, b"InitiatorName=") {
                if initiator.is_empty() {
                    initiator = String::from_utf8_lossy(name).into_owned();
                    ticket.stand(if shared.access.listed(&initiator) {
                        crate::admission::Standing::Listed
                    } else {
                        crate::admission::Standing::Talking
                    });
                }
            }
            // A CHAP response waits its turn with others from the same
            // address or for the same initiator name (crate::admission).
            let chap_response = text_value(&raw.data, b"CHAP_R=").is_some();
            if chap_response && !self.chap_turn(shared, &initiator, &raw.bhs).await? {
                return Ok(None);
            }
            let step = login.handle(&req, &raw.data, &dir);
            if chap_response {
                let ok = !matches!(step, LoginStep::Fail { .. });
                if !ok {
                    shared
                        .access
                        .counters
                        .chap_failures
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                shared
                    .access
                    .throttle
                    .outcome(self.peer.ip(), &initiator, ok, Instant::now());
            }
            match step {
                LoginStep::Continue { resp, text } => {
                    authenticated |= resp.csg >= 1 || (resp.transit && resp.nsg >= 1);
                    self.push_login(&resp, &text);
                    self.flush().await?;
                }
                LoginStep::Fail { resp, reason } => {
                    let code = resp.status;
                    let delay = crate::access::refused(shared, self.peer, code, &reason);
                    tokio::time::sleep(delay).await;
                    self.push_login(&resp, &[]);
                    self.flush().await?;
                    return Ok(None);
                }
                LoginStep::Complete {
                    resp,
                    text,
                    outcome,
                } => {
                    return self
                        .complete_login(shared, portal, &raw.bhs, resp, &text, outcome)
                        .await;
                }
            }
        }
    }

    /// The next Login Request PDU (or any PDU, which the caller refuses),
    /// read within the security stage's deadline until `authenticated`;
    /// `None` when the connection is to end (closed, timed out, malformed).
    async fn login_pdu(
        &mut self,
        shared: &Shared,
        lim: &FrameLimits,
        authenticated: bool,
        security_deadline: tokio::time::Instant,
    ) -> io::Result<Option<RawPdu>> {
        loop {
            match self.rx.next_pdu(lim, usize::MAX, |_| None) {
                Ok(Some(raw)) => return Ok(Some(raw)),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "malformed PDU during login");
                    return Ok(None);
                }
            }
            let more = if authenticated {
                self.fill().await?
            } else {
                match tokio::time::timeout_at(security_deadline, self.fill()).await {
                    Ok(r) => r?,
                    Err(_) => {
                        shared
                            .access
                            .counters
                            .security_timeouts
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tracing::warn!(peer = %self.peer, "security stage timed out");
                        return Ok(None);
                    }
                }
            };
            if !more {
                return Ok(None);
            }
        }
    }

    /// Waits a CHAP response's turn after failed ones from the same
    /// address or initiator name (crate::admission); false when it is
    /// refused unchecked (the refusal has been sent).
    async fn chap_turn(
        &mut self,
        shared: &Shared,
        initiator: &str,
        bhs: &[u8; 48],
    ) -> io::Result<bool> {
        let now = Instant::now();
        let counters = &shared.access.counters;
        match shared
            .access
            .throttle
            .reserve(self.peer.ip(), initiator, now)
        {
            Some(w) if w.is_zero() => {}
            Some(w) => {
                counters
                    .chap_delayed
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // At most one a second per address or name: the
                // throttle itself bounds this log.
                tracing::warn!(
                    peer = %self.peer,
                    %initiator,
                    wait_ms = w.as_millis() as u64,
                    "CHAP response held back after failed ones"
                );
                tokio::time::sleep(w).await;
            }
            None => {
                // Refused unchecked, but not at once: an answer
                // must cost a guesser as much as a check would.
                counters
                    .chap_refused
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(crate::admission::MAX_WAIT).await;
                crate::access::refused(
                    shared,
                    self.peer,
                    LoginStatus::AUTH_FAILED,
                    "too many failed CHAP responses: refused without checking",
                );
                self.push_login(&login_reject(bhs, LoginStatus::AUTH_FAILED), &[]);
                self.flush().await?;
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A login that completed: admission by the session limits, session
    /// or connection reinstatement (RFC 7143 §6.3.5, §6.3.4) or a new
    /// session in the registry, then the final Login Response.
    async fn complete_login(
        &mut self,
        shared: &Shared,
        portal: Portal,
        bhs: &[u8; 48],
        mut resp: LoginResp,
        text: &[u8],
        outcome: Box<iscsi_proto::LoginOutcome>,
    ) -> io::Result<Option<(Session, Option<Joined>, [u8; 6])>> {
        let mut key: Option<Joined> = None;
        if let Some(code) = crate::access::session_refused(shared, &outcome, portal.tpgt) {
            crate::access::refused(shared, self.peer, code, "session limit reached");
            self.push_login(&login_reject(bhs, code), &[]);
            self.flush().await?;
            return Ok(None);
        }
        let normal = (outcome.params.session_type == SessionType::Normal).then(|| SessionKey {
            initiator: outcome.params.initiator_name.clone(),
            isid: outcome.isid,
            target: outcome.params.target_name.clone(),
            tpgt: portal.tpgt,
        });
        if let (Some(k), true) = (&normal, outcome.tsih != 0) {
            let k = k.clone();
            match self.reinstate_connection(shared, &k, &outcome).await {
                Some(j) => {
                    resp.tsih = j.tsih;
                    key = Some(j);
                }
                None => {
                    let code = LoginStatus::SESSION_DOES_NOT_EXIST;
                    crate::access::refused(shared, self.peer, code, "no such session");
                    self.push_login(&login_reject(bhs, code), &[]);
                    self.flush().await?;
                    return Ok(None);
                }
            }
        } else if let Some(k) = normal {
            let tsih = shared.fresh_tsih();
            let nexus = shared.fresh_nexus();
            let entry = SessionEntry {
                tsih,
                nexus,
                peer: self.peer.ip(),
                kill: Arc::new(tokio::sync::Notify::new()),
                aborts: Arc::default(),
                cid: outcome.cid,
                conn: NEXT_CONN.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                failed_by: 0,
                done: Arc::new(tokio::sync::Notify::new()),
            };
            let joined = Joined::of(k.clone(), &entry);
            let old = shared.registry.lock().insert(k.clone(), entry);
            if let Some(old) = old {
                // Session reinstatement: the old session ends.
                tracing::info!(initiator = %k.initiator, "session reinstated");
                old.kill.notify_one();
                if let Some(t) = shared.target(&k.target) {
                    // The same I_T nexus continues in the new
                    // session: it learns of the loss (29/07).
                    t.luns().iter().for_each(|(_, lu)| {
                        lu.nexus_lost(old.nexus);
                        lu.nexus_reinstated(nexus);
                    });
                }
            }
            resp.tsih = tsih;
            key = Some(joined);
        } else {
            resp.tsih = shared.fresh_tsih();
        }
        self.push_login(&resp, text);
        self.flush().await?;
        let s = Session::new(
            outcome.params,
            shared.limits.clone(),
            outcome.exp_cmd_sn,
            outcome.next_stat_sn,
        );
        Ok(Some((s, key, outcome.isid)))
    }

    /// Connection reinstatement (RFC 7143 §6.3.4, §7.1.4.3 at
    /// ErrorRecoveryLevel 0): session `k` with this TSIH and CID goes on in
    /// this connection. The old connection is ended, its tasks terminated
    /// without responses, and waited for (up to [`REINSTATE_WAIT`]); the
    /// session keeps its TSIH and I_T nexus (reservations, unit attentions
    /// and mode pages stay), and its command numbering starts again from
    /// this login's CmdSN. Returns the TSIH, or `None` when no such session
    /// exists for this initiator, target and portal group.
    async fn reinstate_connection(
        &self,
        shared: &Shared,
        k: &SessionKey,
        outcome: &iscsi_proto::LoginOutcome,
    ) -> Option<Joined> {
        let (old_kill, old_done, joined) = {
            let mut reg = shared.registry.lock();
            let e = reg
                .get_mut(k)
                .filter(|e| e.tsih == outcome.tsih && e.cid == outcome.cid)?;
            let old = (e.kill.clone(), e.done.clone());
            e.kill = Arc::new(tokio::sync::Notify::new());
            e.done = Arc::new(tokio::sync::Notify::new());
            e.conn = NEXT_CONN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            e.failed_by = 0;
            e.peer = self.peer.ip();
            (old.0, old.1, Joined::of(k.clone(), e))
        };
        let tsih = joined.tsih;
        old_kill.notify_one();
        let ended = tokio::time::timeout(REINSTATE_WAIT, old_done.notified())
            .await
            .is_ok();
        tracing::info!(
            initiator = %k.initiator,
            tsih,
            cid = outcome.cid,
            old_connection_ended = ended,
            "connection reinstated"
        );
        Some(joined)
    }

    /// The full feature phase; returns why the connection ended.
    #[allow(clippy::too_many_arguments)]
    async fn full_feature(
        &mut self,
        mut session: Session,
        shared: &Shared,
        target: Option<&TargetRt>,
        mut origin: Origin,
        (kill, aborts): (Arc<tokio::sync::Notify>, Arc<AbortRequests>),
        mut shutdown: watch::Receiver<bool>,
        stats: &mut ConnStats,
    ) -> Closed {
        let p = session.params().clone();
        let lim = FrameLimits {
            header_digest: p.header_digest,
            data_digest: p.data_digest,
            max_data_segment: p.recv_max_data_segment,
        };
        // The LUN table, refreshed when the admin API changed it.
        let mut lus = target.map(|t| t.luns());
        let mut lus_gen = target.map_or(0, |t| t.generation());
        let (tx, mut rx) = mpsc::unbounded_channel::<Done>();
        let mut events = Vec::new();
        let mut last_rx = Instant::now();
        session.note_received(last_rx);
        // When the connection last finished handling what it was woken for
        // (bytes read, answers sent, commands finished by I/O threads): it
        // busy-polls until `shared.busy_poll` after that.
        let mut last_work = last_rx;
        let mut worked = false;
        // Commands running off the loop (the I/O pool, a backend's
        // completion thread), whose `Done` will wake the connection.
        let off_loop = std::cell::Cell::new(0u32);
        // Stats publishing and NOP-In pings: every PUBLISH_EVERY while the
        // connection works, every IDLE_TICK once it has been idle that long
        // (each wake-up costs tens of microseconds on a VM: 64 idle sessions
        // cost 64 of them a second, not 640).
        let tick = tokio::time::sleep(PUBLISH_EVERY);
        tokio::pin!(tick);
        let mut stopping = false;
        let mut closing: Option<Closed> = None;
        loop {
            // Frame and handle everything buffered.
            if !stopping && closing.is_none() {
                if let Some(t) = target {
                    let g = t.generation();
                    if g != lus_gen {
                        lus_gen = g;
                        let fresh = t.luns();
                        origin.lus = Some(crate::lunmap::LunSet(fresh.clone()));
                        lus = Some(fresh);
                    }
                }
                let host = ConnHost {
                    shared,
                    lus: lus.as_deref(),
                    peer: self.peer.ip(),
                    origin: &origin,
                };
                let env = Env {
                    lus: lus.as_deref(),
                    origin: &origin,
                    tx: &tx,
                    start: last_rx,
                    off_loop: &off_loop,
                };
                match self.handle_buffered(&lim, &mut session, &host, &env, &mut events, stats) {
                    Ok(c) => closing = c,
                    Err(why) => return why,
                }
            }
            if let Err(e) = self.try_flush() {
                tracing::debug!(error = %e, "write failed");
                return Closed::WriteFailed;
            }
            stats.sent(session.in_flight(), session.rejects_sent());
            if let Some(why) = closing {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(5), self.flush()).await;
                return why;
            }
            if stopping && session.in_flight() == 0 {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(5), self.flush()).await;
                return Closed::ShuttingDown;
            }
            let want_read = !stopping && self.out.len() < OUTPUT_HIGH_WATER;
            let want_write = !self.out.is_empty();
            let now = Instant::now();
            if worked {
                // Counted from now, after the batch was handled and its
                // answers sent: a batch of 32 commands takes tens of µs.
                last_work = now;
                worked = false;
            }
            let poll_until = last_work + shared.busy_poll;
            // Not while commands run off the loop: their completions wake
            // the connection anyway, and the threads running them (librbd's,
            // the I/O pool) need the CPU a poll would take (on RBD, polling
            // cost 7 % of 4K random-read IOPS on 2 cores).
            let busy_poll = want_read && !want_write && now < poll_until && off_loop.get() == 0;
            if now - last_work < PUBLISH_EVERY && tick.deadline().into_std() > now + PUBLISH_EVERY {
                // Work again after an idle spell: publish at the usual pace.
                tick.as_mut().reset((now + PUBLISH_EVERY).into());
            }
            tokio::select! {
                biased;
                Some(d) = rx.recv() => {
                    let mut n = 1;
                    d.finish(&mut session, &mut self.out, stats);
                    while let Ok(d) = rx.try_recv() {
                        d.finish(&mut session, &mut self.out, stats);
                        n += 1;
                    }
                    off_loop.set(off_loop.get().saturating_sub(n));
                    worked = true;
                }
                r = self.stream.readable(), if want_read => match self.read_ready(r, ReadVia::Tokio) {
                    Ok(true) => {
                        last_rx = Instant::now();
                        session.note_received(last_rx);
                        worked = true;
                    }
                    Ok(false) => {}
                    Err(why) => return why,
                },
                r = self.stream.writable(), if want_write => {
                    if r.is_err() {
                        return Closed::WriteFailed;
                    }
                    // Answers are going out: the next command may follow.
                    worked = true;
                }
                _ = kill.notified() => return self.ended_by_target(tx, rx).await,
                _ = aborts.notify.notified() => {
                    let luns = std::mem::take(&mut *aborts.luns.lock());
                    for lun in luns {
                        let n = session.abort_lun_tasks(lun);
                        tracing::info!(?lun, tasks = n, "tasks aborted by PREEMPT AND ABORT");
                    }
                }
                _ = shutdown.changed(), if !stopping => stopping = true,
                _ = &mut tick => {
                    let now = Instant::now();
                    let next = if now - last_work >= IDLE_TICK { IDLE_TICK } else { PUBLISH_EVERY };
                    tick.as_mut().reset((now + next).into());
                    stats.publish();
                    if let Err(why) = session.poll_keepalive(now, shared.nop_interval, shared.nop_timeout, &mut self.out) {
                        return Closed::Session(why);
                    }
                }
                // Last: every other source is looked at between two polls.
                r = poll_socket(&self.stream, poll_until), if busy_poll => match self.read_ready(r, ReadVia::Recv) {
                    Ok(true) => {
                        last_rx = Instant::now();
                        session.note_received(last_rx);
                        worked = true;
                    }
                    Ok(false) => {}
                    Err(why) => return why,
                },
            }
        }
    }

    /// Frames and handles every PDU buffered, running the commands they
    /// carry, until the buffer is empty or the session asks to close (the
    /// reason: `Ok(Some(_))`); `Err` when the connection must end at once.
    fn handle_buffered(
        &mut self,
        lim: &FrameLimits,
        session: &mut Session,
        host: &ConnHost<'_>,
        env: &Env<'_>,
        events: &mut Vec<Event>,
        stats: &mut ConnStats,
    ) -> Result<Option<Closed>, Closed> {
        let mut closing = None;
        while closing.is_none() {
            let Some(raw) = self.next_pdu(lim, session, host)? else {
                break;
            };
            session.handle_pdu(raw, host, &mut self.out, events);
            for ev in events.drain(..) {
                match ev {
                    Event::Execute(req) => execute(req, env, session, &mut self.out, stats),
                    Event::Logout => closing = Some(Closed::Logout),
                    Event::Close(why) => closing = Some(Closed::Session(why)),
                    Event::TaskManagement {
                        function,
                        lun,
                        referenced,
                        response,
                        waiting,
                    } => tracing::warn!(
                        peer = %self.peer,
                        function = ?function,
                        lun = ?lun.index(),
                        task = format_args!("{:#x}", referenced.0),
                        response = %response,
                        waiting,
                        "task management request"
                    ),
                }
            }
        }
        Ok(closing)
    }

    /// The target ended this connection (a reinstatement replaced it): its
    /// tasks end without responses (RFC 7143 §7.1.4.3 at ErrorRecoveryLevel
    /// 0), but backend I/O already under way finishes first. Every such I/O
    /// holds a sender, so the channel closes when the last one is done:
    /// nothing of this connection reaches a LU after the session has moved
    /// on to a reinstated connection.
    async fn ended_by_target(
        &self,
        tx: mpsc::UnboundedSender<Done>,
        mut rx: mpsc::UnboundedReceiver<Done>,
    ) -> Closed {
        drop(tx);
        let drained =
            tokio::time::timeout(REINSTATE_WAIT, async { while rx.recv().await.is_some() {} })
                .await;
        if drained.is_err() {
            tracing::warn!(peer = %self.peer, "backend I/O still running after the connection was ended");
        }
        Closed::EndedByTarget
    }
}

/// Asks for the configured congestion control (`netio`). A kernel
/// without it is reported once; the connection goes on with the default.
/// The socket options the server is configured for, on an accepted
/// connection (iSCSI or NVMe/TCP): no Nagle, buffer sizes, congestion
/// control.
pub(crate) fn configure_socket(stream: &TcpStream, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    if shared.socket_buffer > 0 {
        let s = socket2::SockRef::from(stream);
        let _ = s.set_recv_buffer_size(shared.socket_buffer as usize);
        let _ = s.set_send_buffer_size(shared.socket_buffer as usize);
    }
    set_congestion(stream, &shared.tcp_congestion);
}

fn set_congestion(stream: &TcpStream, name: &str) {
    use std::os::fd::AsFd;
    static REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if let Err(e) = netio::set_congestion(stream.as_fd(), name) {
        if !REPORTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(error = %e, congestion = name, "cannot set the TCP congestion control; connections keep the kernel default (limits.tcp_congestion)");
        }
    }
}

/// Resolves as soon as the socket has bytes (or its end) to read, trying
/// without sleeping until `deadline`, then never: the busy-poll of a
/// connection that just worked (`limits.busy_poll_us`).
///
/// Sleeping until the socket is readable costs a wake-up on both sides
/// when the next command comes a few microseconds later: the initiator's
/// send has to wake this thread, and on virtual machines that costs tens
/// of microseconds of both (docs/PERFORMANCE.md, "Limits on this hardware"). Between
/// two tries the event loop runs its other connections and, in the
/// connection's `select!`, every other source of work is looked at first.
/// The deadline is `limits.busy_poll_us` after the connection's last work
/// (bytes read, a command finished by an I/O thread), so idle connections
/// sleep, whatever else (timers) wakes them.
pub(crate) async fn poll_socket(stream: &TcpStream, deadline: Instant) -> io::Result<()> {
    let mut byte = [std::mem::MaybeUninit::<u8>::uninit()];
    loop {
        // A peek: tokio's readiness is left alone (the reader that follows
        // is a plain recv(2) too), and nothing is consumed.
        match socket2::SockRef::from(stream)
            .recv_with_flags(&mut byte, libc::MSG_PEEK | libc::MSG_DONTWAIT)
        {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if Instant::now() >= deadline {
            return std::future::pending().await;
        }
        tokio::task::yield_now().await;
    }
}

/// How the connection reads its socket ([`Via`]).
#[derive(Clone, Copy)]
enum ReadVia {
    /// Tokio's `try_read`, which clears the socket's readiness on
    /// `WouldBlock` (so that the loop waits for it again) and does not even
    /// try while it believes the socket is not readable.
    Tokio,
    /// A plain non-blocking `recv(2)`, for polling: it tries whatever tokio
    /// believes, and leaves tokio's readiness as it is (a stale "readable"
    /// costs one `WouldBlock` later).
    Recv,
}

/// The connection's socket read through a [`ReadVia`], for the receiver.
struct Via<'a>(ReadVia, &'a TcpStream);

impl ReadInto for Via<'_> {
    fn read_into<B: BufMut>(&mut self, buf: &mut B) -> io::Result<usize> {
        self.0.read(self.1, buf)
    }
}

impl ReadVia {
    /// Reads into the spare room of `buf`.
    fn read(self, stream: &TcpStream, buf: &mut impl BufMut) -> io::Result<usize> {
        match self {
            ReadVia::Tokio => stream.try_read_buf(buf),
            ReadVia::Recv => {
                use std::os::fd::AsFd;
                netio::recv_into(stream.as_fd(), buf, libc::MSG_DONTWAIT)
            }
        }
    }
}

/// Largest piece of a file range given to one `sendfile` call.
const SENDFILE_MAX: usize = 1 << 20;

/// The connection's socket as the send queue writes to it, through tokio's
/// `try_io`, so that tokio forgets the socket's write readiness on EAGAIN
/// and the loop waits for it again.
pub(crate) struct Out<'a>(pub &'a TcpStream);

impl WriteOut for Out<'_> {
    fn write_vectored(&mut self, iov: &[IoSlice<'_>], more: bool) -> io::Result<usize> {
        if !more {
            return self.0.try_write_vectored(iov);
        }
        // The bytes in front of a file range: more follows at once.
        self.0.try_io(tokio::io::Interest::WRITABLE, || {
            socket2::SockRef::from(self.0).send_vectored_with_flags(iov, libc::MSG_MORE)
        })
    }

    fn send_file(&mut self, r: &filemap::FileRange) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let stream = self.0;
        let mut off = libc::off_t::try_from(r.offset())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        let len = r.len().min(SENDFILE_MAX);
        stream.try_io(tokio::io::Interest::WRITABLE, || {
            // SAFETY: both descriptors are open for the call (the stream and
            // the range's file are borrowed), and `off` is a valid, exclusive
            // pointer to an off_t; sendfile(2) moves no memory of ours.
            let n =
                unsafe { libc::sendfile(stream.as_raw_fd(), r.file().as_raw_fd(), &mut off, len) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        })
    }
}

/// Why a connection ended (logged, counted and deciding what becomes of
/// its session).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Closed {
    /// The initiator logged out.
    Logout,
    /// The initiator closed the TCP connection.
    ByInitiator,
    /// Reading the socket failed.
    ReadFailed,
    /// Writing the socket failed.
    WriteFailed,
    /// A header failed its digest (RFC 7143 §7.8: the connection goes).
    HeaderDigestError,
    /// The byte stream could not be cut into PDUs.
    Unframeable,
    /// The session asked for it.
    Session(CloseReason),
    /// The target is shutting down, or the portal was removed.
    ShuttingDown,
    /// The target ended the session (reinstated elsewhere, access revoked).
    EndedByTarget,
}

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Closed::Logout => f.write_str("logout"),
            Closed::ByInitiator => f.write_str("closed by initiator"),
            Closed::ReadFailed => f.write_str("read failed"),
            Closed::WriteFailed => f.write_str("write failed"),
            Closed::HeaderDigestError => f.write_str("header digest error"),
            Closed::Unframeable => f.write_str("unframeable PDU"),
            Closed::Session(why) => why.fmt(f),
            Closed::ShuttingDown => f.write_str("target shutting down or portal removed"),
            Closed::EndedByTarget => {
                f.write_str("session ended by the target (reinstated or access revoked)")
            }
        }
    }
}

/// A command run on an I/O thread, back with its outcome.
struct Done {
    itt: Itt,
    c: Completion,
    lun: u16,
    op: u8,
    bytes: u32,
    start: Instant,
    /// The write's data, back to this thread's buffer pool.
    data_out: Option<WriteData>,
}

impl Done {
    fn finish(self, session: &mut Session, out: &mut Outbox, stats: &mut ConnStats) {
        stats.completed(self.lun, self.op, self.bytes, self.c.status, self.start);
        session.complete(self.itt, self.c, out);
        if let Some(d) = self.data_out {
            give_back(d);
        }
    }
}

/// Returns a write's buffers to this thread's pool (those the backend kept,
/// and slices of the receive buffer, are simply dropped).
fn give_back(data_out: WriteData) {
    if let Some(c) = data_out.into_chain() {
        let (first, rest) = c.into_parts();
        bufpool::give(first);
        rest.into_iter().for_each(bufpool::give);
    }
}

/// What [`execute`] needs from the connection.
struct Env<'a> {
    lus: Option<&'a LunTable>,
    origin: &'a Origin,
    tx: &'a mpsc::UnboundedSender<Done>,
    /// When the bytes of the command were read.
    start: Instant,
    /// Commands running off the loop: one more for each sent away, one
    /// less for each `Done` received.
    off_loop: &'a std::cell::Cell<u32>,
}

/// Runs a command inline when its backend never blocks, else on an I/O
/// thread whose completion comes back through `tx`.
fn execute(
    req: ExecRequest,
    env: &Env<'_>,
    session: &mut Session,
    out: &mut Outbox,
    stats: &mut ConnStats,
) {
    let Some(t) = env.lus else { return };
    let op = req.cdb.as_slice()[0];
    let lun = req.lun.index().unwrap_or(u16::MAX);
    if let Some(c) = answer_above_lu(t, &req, env.origin) {
        if t.get(req.lun).is_some() {
            stats.completed(lun, op, 0, c.status, env.start);
        }
        return session.complete(req.itt, c, out);
    }
    let lu = t.get(req.lun).expect("checked by answer_above_lu").clone();
    if let WriteData::Placed(placed) = req.data_out {
        // The data is on the medium already: only its durability is left.
        let c = crate::lunmap::finish_placed(&lu, req.cdb.as_slice(), placed, req.cdb_data_out);
        stats.completed(lun, op, req.edtl, c.status, env.start);
        return session.complete(req.itt, c, out);
    }
    let data_out = if req.write { req.edtl as usize } else { 0 };
    if !lu.runs_off_loop(req.cdb.as_slice(), data_out) {
        let c = run_on_lu(&lu, &req, env.origin);
        stats.completed(lun, op, req.edtl, c.status, env.start);
        session.complete(req.itt, c, out);
        // A gathered write buffer goes back to this thread's pool.
        give_back(req.data_out);
        return;
    }
    let start = env.start;
    if lu.async_io().is_some() {
        // Submitted from here and completed on the backend's thread: no
        // I/O-pool thread waits for it (scsi::fast).
        let tx = env.tx.clone();
        let (itt, bytes) = (req.itt, req.edtl);
        let done = move |c| {
            let _ = tx.send(Done {
                itt,
                c,
                lun,
                op,
                bytes,
                start,
                data_out: None,
            });
        };
        if submit_fast(&lu, &req, env.origin, done).is_ok() {
            env.off_loop.set(env.off_loop.get() + 1);
            return;
        }
    }
    let origin = env.origin.clone();
    let tx = env.tx.clone();
    env.off_loop.set(env.off_loop.get() + 1);
    tokio::task::spawn_blocking(move || {
        let c = run_on_lu(&lu, &req, &origin);
        let _ = tx.send(Done {
            itt: req.itt,
            c,
            lun,
            op,
            bytes: req.edtl,
            start,
            // Back to the loop's pool: the next write lands in it.
            data_out: Some(req.data_out),
        });
    });
}

/// Why a login for an existing session (TSIH not 0) is refused at its
/// first PDU: with the CID of the session's connection it is a connection
/// reinstatement (RFC 7143 §6.3.4, checked again when the login completes);
/// any other CID would be a second connection, and MaxConnections is 1.
fn reconnect_refusal(shared: &Shared, req: &LoginReq) -> Option<LoginStatus> {
    let cid = shared
        .registry
        .lock()
        .iter()
        .find(|(k, e)| e.tsih == req.tsih && k.isid == req.isid)
        .map(|(_, e)| e.cid);
    match cid {
        Some(c) if c == req.cid => None,
        Some(_) => Some(LoginStatus::TOO_MANY_CONNECTIONS),
        None => Some(LoginStatus::SESSION_DOES_NOT_EXIST),
    }
}

fn login_reject(bhs: &[u8; 48], code: LoginStatus) -> LoginResp {
    let req = LoginReq::decode(bhs);
    LoginResp {
        transit: false,
        cont: false,
        csg: req.csg,
        nsg: 0,
        version_max: 0,
        version_active: 0,
        isid: req.isid,
        tsih: 0,
        itt: req.itt,
        sn: SnTriple {
            stat_sn: req.exp_stat_sn,
            exp_cmd_sn: req.cmd_sn,
            max_cmd_sn: req.cmd_sn,
        },
        status: code,
    }
}
