//! One initiator connection over a blocking socket.

use std::io::{self, IoSlice, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use bytes::Bytes;
use iscsi_proto::initiator::{
    DataDir, InitiatorEvent, InitiatorLogin, InitiatorSession, LoginConfig, LoginError,
    LoginProgress, TaskResult,
};
use iscsi_proto::params::SessionParams;
use iscsi_proto::session::LAND_MIN;
use iscsi_wire::frame::FrameLimits;
use iscsi_wire::outbox::{Digests, FileRange, WriteOut};
use iscsi_wire::pdu::{Itt, LoginResp, Lun, Opcode, TmfFunction, TmfResponse};
use iscsi_wire::receive::{ReadInto, Receiver};
use iscsi_wire::{text, Outbox, RawPdu, Sn};
use thiserror::Error;

/// Why an initiator operation failed.
#[derive(Debug, Error)]
pub enum Error {
    /// The socket failed or timed out.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The target refused the login.
    #[error(transparent)]
    Login(#[from] LoginError),
    /// The target broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The connection closed.
    #[error("connection closed by the target")]
    Closed,
}

/// A logged-in connection (one session, one connection).
pub struct Connection {
    stream: TcpStream,
    session: InitiatorSession,
    /// Received bytes, cut into PDUs; large Data-In segments are received
    /// straight into their read's buffer.
    rx: Receiver,
    out: Outbox,
    lim: FrameLimits,
    events: Vec<InitiatorEvent>,
    /// The target portal group tag reported at login.
    pub tpgt: Option<u16>,
    /// The TSIH the target assigned.
    pub tsih: u16,
    /// How long [`Connection::wait`] polls the socket before it sleeps.
    busy_poll: Duration,
    /// Where and how this connection logged in, for [`Connection::reconnect`].
    addr: String,
    cfg: LoginConfig,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("session", &self.session)
            .finish()
    }
}

fn open(addr: &str, timeout: Duration) -> Result<TcpStream, Error> {
    let mut last = None;
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => {
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(Duration::from_secs(30)))?;
                s.set_write_timeout(Some(Duration::from_secs(30)))?;
                let sock = socket2::SockRef::from(&s);
                let _ = sock.set_recv_buffer_size(1 << 20);
                let _ = sock.set_send_buffer_size(1 << 20);
                // As the target does (`netio`: BBR's pacing slows
                // the bursts of writes); a kernel without it keeps its own.
                let _ =
                    netio::set_congestion(std::os::fd::AsFd::as_fd(&s), netio::DEFAULT_CONGESTION);
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.map_or_else(|| Error::Protocol(format!("{addr}: no address")), Error::Io))
}

impl Connection {
    /// Connects to `addr` (`host:port`) and logs in.
    pub fn login(addr: &str, cfg: LoginConfig) -> Result<Connection, Error> {
        let stream = open(addr, Duration::from_secs(10))?;
        let mut c = Connection {
            stream,
            session: InitiatorSession::new(SessionParams::rfc_defaults(), Sn(0), Sn(0), Sn(0)),
            rx: Receiver::new(),
            out: Outbox::new(),
            lim: FrameLimits::LOGIN,
            events: Vec::new(),
            tpgt: None,
            tsih: 0,
            busy_poll: Duration::ZERO,
            addr: addr.to_string(),
            cfg: cfg.clone(),
        };
        let mut login = InitiatorLogin::new(cfg, Sn(1), Itt(0));
        let (mut req, mut body) = login.start();
        loop {
            c.out
                .push(&req.encode(body.len()), &body, Digests::default());
            c.flush()?;
            let raw = c.next_pdu()?;
            if iscsi_wire::pdu::opcode(&raw.bhs) != Opcode::LoginResp {
                return Err(Error::Protocol("expected a Login Response".into()));
            }
            let resp = LoginResp::decode(&raw.bhs);
            match login.handle(&resp, &raw.data)? {
                LoginProgress::Send(r, b) => {
                    req = r;
                    body = b;
                }
                LoginProgress::Done(n) => {
                    c.lim = FrameLimits {
                        header_digest: n.params.header_digest,
                        data_digest: n.params.data_digest,
                        max_data_segment: n.params.recv_max_data_segment,
                    };
                    c.tpgt = n.tpgt;
                    c.tsih = n.tsih;
                    c.session =
                        InitiatorSession::new(n.params, n.cmd_sn, n.exp_stat_sn, n.max_cmd_sn);
                    return Ok(c);
                }
            }
        }
    }

    /// Logs in again after the connection was lost, with the same ISID and
    /// TSIH 0, so the target reinstates the session (RFC 7143 §6.3.5) and
    /// drops whatever the old connection had in flight. Commands that were
    /// outstanding are forgotten: the caller submits them again.
    pub fn reconnect(&mut self) -> Result<(), Error> {
        let mut fresh = Connection::login(&self.addr, self.cfg.clone())?;
        fresh.busy_poll = self.busy_poll;
        *self = fresh;
        Ok(())
    }

    /// Makes [`Connection::wait`] poll the socket for up to `budget`
    /// before it sleeps in `recv(2)` (zero, the default: sleep at once).
    /// Like polled completions (fio's `hipri`, SPDK), this trades CPU for
    /// the wake-up a sleeping thread costs when the answer comes a few
    /// microseconds later: tens of microseconds on virtual machines.
    pub fn set_busy_poll(&mut self, budget: Duration) {
        self.busy_poll = budget;
    }

    /// The session state (negotiated parameters, window).
    pub fn session(&self) -> &InitiatorSession {
        &self.session
    }

    /// True when the target's command window admits another command.
    pub fn can_submit(&self) -> bool {
        self.session.can_submit()
    }

    /// Queues a command; it is sent by the next [`Connection::wait`] or
    /// [`Connection::flush`].
    pub fn submit(&mut self, lun: u16, cdb: &[u8], dir: DataDir) -> Itt {
        self.session
            .submit(Lun::from_index(lun), cdb, dir, &mut self.out)
    }

    /// Sends everything queued.
    pub fn flush(&mut self) -> Result<(), Error> {
        // A blocking socket (a timeout is an error): the queue is empty
        // when this returns Ok.
        match self.out.write_to(&mut Blocking(&self.stream)) {
            Ok(done) => {
                debug_assert!(done, "a blocking write never defers");
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::WriteZero => Err(Error::Closed),
            Err(e) => Err(e.into()),
        }
    }

    fn fill(&mut self) -> Result<(), Error> {
        if self.recv(0)? == 0 {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// Reads what the socket has without blocking; `Ok(false)` when it had
    /// nothing.
    fn fill_nonblocking(&mut self) -> Result<bool, Error> {
        match self.recv(libc::MSG_DONTWAIT) {
            Ok(0) => Err(Error::Closed),
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(true),
            Err(e) => Err(e.into()),
        }
    }

    /// One `recv(2)` with `flags`, into the place the receiver chooses
    /// ([`iscsi_wire::receive`]). `Ok(0)` at end of stream.
    fn recv(&mut self, flags: libc::c_int) -> io::Result<usize> {
        use std::os::fd::AsFd;
        self.rx.read(&mut Recv(self.stream.as_fd(), flags))
    }

    /// The next complete PDU received, `Ok(None)` when more bytes are
    /// needed. A large Data-In segment the session has a place for is
    /// received straight into it.
    fn take_pdu(&mut self) -> Result<Option<RawPdu>, Error> {
        let session = &mut self.session;
        self.rx
            .next_pdu(&self.lim, LAND_MIN as usize, |bhs| {
                session.landing(bhs).map(Into::into)
            })
            .map_err(|e| Error::Protocol(e.to_string()))
    }

    fn next_pdu(&mut self) -> Result<RawPdu, Error> {
        loop {
            if let Some(p) = self.take_pdu()? {
                return Ok(p);
            }
            self.fill()?;
        }
    }

    /// Handles every complete PDU already received; appends finished
    /// commands to `done`.
    fn handle_buffered(&mut self, done: &mut Vec<(Itt, TaskResult)>) -> Result<(), Error> {
        while let Some(p) = self.take_pdu()? {
            self.session.handle_pdu(p, &mut self.out, &mut self.events);
        }
        for e in self.events.drain(..) {
            match e {
                InitiatorEvent::Done(itt, r) => done.push((itt, r)),
                InitiatorEvent::ProtocolError(m) => return Err(Error::Protocol(m)),
                _ => {}
            }
        }
        Ok(())
    }

    /// Sends what is queued, then reads until at least one command
    /// finishes; appends every finished command (and other events) seen in
    /// the bytes read.
    pub fn wait(&mut self, done: &mut Vec<(Itt, TaskResult)>) -> Result<(), Error> {
        self.flush()?;
        let before = done.len();
        loop {
            self.handle_buffered(done)?;
            // Answers to R2Ts and NOP-In pings.
            self.flush()?;
            if done.len() > before {
                return Ok(());
            }
            if !self.poll_briefly()? {
                self.fill()?;
            }
        }
    }

    /// Reads what the socket has, trying without sleeping for up to the
    /// busy-poll budget; `Ok(false)` when nothing came.
    fn poll_briefly(&mut self) -> Result<bool, Error> {
        if self.busy_poll.is_zero() {
            return Ok(false);
        }
        let start = std::time::Instant::now();
        loop {
            if self.fill_nonblocking()? {
                return Ok(true);
            }
            if start.elapsed() >= self.busy_poll {
                return Ok(false);
            }
            std::hint::spin_loop();
        }
    }

    /// Like [`Connection::wait`] but never blocks on the socket: sends what
    /// is queued, then gathers every finished command from the bytes already
    /// received and those the socket has now. For waiting on several
    /// connections at once: poll(2) their [`Connection::raw_fd`]s for
    /// readability, then call this on the readable ones.
    pub fn poll_completions(&mut self, done: &mut Vec<(Itt, TaskResult)>) -> Result<(), Error> {
        self.flush()?;
        loop {
            self.handle_buffered(done)?;
            self.flush()?;
            if !self.fill_nonblocking()? {
                return Ok(());
            }
        }
    }

    /// The socket's file descriptor (to poll it).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.stream.as_raw_fd()
    }

    /// True when commands are queued but not yet sent.
    pub fn has_unsent(&self) -> bool {
        !self.out.is_empty()
    }

    /// Closes the socket in both directions (tests and failover).
    pub fn shutdown(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }

    /// Waits for one non-command event (text, TMF or logout answer).
    fn wait_event(
        &mut self,
        want: impl Fn(&InitiatorEvent) -> bool,
    ) -> Result<InitiatorEvent, Error> {
        self.flush()?;
        loop {
            while let Some(p) = self.take_pdu()? {
                self.session.handle_pdu(p, &mut self.out, &mut self.events);
            }
            if let Some(pos) = self.events.iter().position(&want) {
                return Ok(self.events.remove(pos));
            }
            if let Some(InitiatorEvent::ProtocolError(m)) = self
                .events
                .iter()
                .find(|e| matches!(e, InitiatorEvent::ProtocolError(_)))
            {
                return Err(Error::Protocol(m.clone()));
            }
            self.flush()?;
            self.fill()?;
        }
    }

    /// Runs one command to completion.
    pub fn execute(&mut self, lun: u16, cdb: &[u8], dir: DataDir) -> Result<TaskResult, Error> {
        let itt = self.submit(lun, cdb, dir);
        let mut done = Vec::new();
        loop {
            self.wait(&mut done)?;
            if let Some(pos) = done.iter().position(|(i, _)| *i == itt) {
                return Ok(done.swap_remove(pos).1);
            }
        }
    }

    /// Sends a task management function and returns the target's response.
    pub fn task_mgmt(
        &mut self,
        f: TmfFunction,
        lun: u16,
        ref_itt: Option<Itt>,
    ) -> Result<TmfResponse, Error> {
        let itt = self
            .session
            .task_mgmt(f, Lun::from_index(lun), ref_itt, &mut self.out);
        match self.wait_event(|e| matches!(e, InitiatorEvent::TaskMgmt(i, _) if *i == itt))? {
            InitiatorEvent::TaskMgmt(_, r) => Ok(r),
            _ => unreachable!("filtered above"),
        }
    }

    /// Sends a text request and returns the answer's pairs.
    pub fn text(&mut self, body: &[u8]) -> Result<Vec<(String, String)>, Error> {
        let itt = self.session.text(body, &mut self.out);
        match self.wait_event(|e| matches!(e, InitiatorEvent::Text(i, _) if *i == itt))? {
            InitiatorEvent::Text(_, t) => {
                text::parse(&t).map_err(|e| Error::Protocol(e.to_string()))
            }
            _ => unreachable!("filtered above"),
        }
    }

    /// Logs out and closes the connection.
    pub fn logout(mut self) -> Result<(), Error> {
        self.session.logout(&mut self.out);
        self.wait_event(|e| matches!(e, InitiatorEvent::LoggedOut(_)))?;
        Ok(())
    }

    /// Bytes a write of `len` bytes would share with the caller: a helper to
    /// build write payloads without copying.
    pub fn payload(data: &[u8]) -> Bytes {
        Bytes::copy_from_slice(data)
    }
}

/// A discovery session: every target and its portal addresses
/// (`SendTargets=All`).
pub fn discover(addr: &str, initiator: &str) -> Result<Vec<(String, Vec<String>)>, Error> {
    discover_with(
        addr,
        LoginConfig::new(initiator, None, crate::random_isid()),
    )
}

/// A discovery session logged in with `cfg` (its target name is ignored;
/// CHAP credentials are used).
pub fn discover_with(
    addr: &str,
    mut cfg: LoginConfig,
) -> Result<Vec<(String, Vec<String>)>, Error> {
    cfg.target_name = None;
    let mut c = Connection::login(addr, cfg)?;
    let pairs = c.text(b"SendTargets=All\0")?;
    let _ = c.logout();
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for (k, v) in pairs {
        match k.as_str() {
            "TargetName" => out.push((v, Vec::new())),
            "TargetAddress" => {
                if let Some(last) = out.last_mut() {
                    last.1.push(v);
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// `recv(2)` on the connection's socket with the given flags.
struct Recv<'a>(std::os::fd::BorrowedFd<'a>, libc::c_int);

impl ReadInto for Recv<'_> {
    fn read_into<B: bytes::BufMut>(&mut self, buf: &mut B) -> io::Result<usize> {
        netio::recv_into(self.0, buf, self.1)
    }
}

/// The connection's blocking socket as the send queue writes to it.
struct Blocking<'a>(&'a TcpStream);

impl WriteOut for Blocking<'_> {
    fn write_vectored(&mut self, iov: &[IoSlice<'_>], _more: bool) -> io::Result<usize> {
        let mut s = self.0;
        match s.write_vectored(iov) {
            // On a blocking socket EAGAIN means the write timeout expired:
            // an error, never "try later" (the queue would be left unsent).
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                Err(io::Error::new(io::ErrorKind::TimedOut, e))
            }
            r => r,
        }
    }

    fn send_file(&mut self, _: &FileRange) -> io::Result<usize> {
        // An initiator queues commands and data-out, never file ranges.
        Err(io::ErrorKind::Unsupported.into())
    }
}
