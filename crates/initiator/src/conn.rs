//! One initiator connection over a blocking socket.

use std::io::{self, IoSlice, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use iscsi_proto::initiator::{
    DataDir, InitiatorEvent, InitiatorLogin, InitiatorSession, LoginConfig, LoginError,
    LoginProgress, TaskResult,
};
use iscsi_proto::params::SessionParams;
use iscsi_proto::session::LAND_MIN;
use iscsi_wire::frame::{data_segment_len, frame_len, header_len, split_pdu, FrameLimits, BHS_LEN};
use iscsi_wire::landing::Landing;
use iscsi_wire::outbox::{Digests, MAX_IOVECS};
use iscsi_wire::pdu::{Itt, LoginResp, Lun, Opcode, TmfFunction, TmfResponse};
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
    rbuf: BytesMut,
    /// The Data-In segment being received straight into its read's buffer.
    landing: Option<Landing>,
    /// After a landed segment, the next read into the receive buffer takes
    /// only this many bytes (the next basic header and its digest; 0: no
    /// limit), so that the next large segment is not read into the receive
    /// buffer only to be copied out of it.
    header_first: usize,
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
            rbuf: BytesMut::with_capacity(512 * 1024),
            landing: None,
            header_first: 0,
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
        while !self.out.is_empty() {
            let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
            let n = self.out.io_slices(&mut iov);
            let w = self.stream.write_vectored(&iov[..n])?;
            if w == 0 {
                return Err(Error::Closed);
            }
            self.out.advance(w);
        }
        Ok(())
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

    /// One `recv(2)`: into the buffer of the segment being landed, exactly
    /// up to its end, else into the receive buffer. `Ok(0)` at end of
    /// stream.
    fn recv(&mut self, flags: libc::c_int) -> io::Result<usize> {
        use netio::recv_into;
        use std::os::fd::AsFd;
        let sock = self.stream.as_fd();
        if let Some(l) = self.landing.as_mut().filter(|l| l.left() > 0) {
            return recv_into(sock, &mut l.room(), flags);
        }
        if self.rbuf.capacity() - self.rbuf.len() < 128 * 1024 {
            self.rbuf.reserve(512 * 1024);
        }
        // Just what completes a landed segment's PDU and the next header.
        let want = match &self.landing {
            Some(l) => l.trailer() + self.header_first,
            None => self.header_first,
        }
        .saturating_sub(self.rbuf.len());
        if want > 0 {
            recv_into(sock, &mut (&mut self.rbuf).limit(want), flags)
        } else {
            recv_into(sock, &mut self.rbuf, flags)
        }
    }

    /// The next complete PDU received, `Ok(None)` when more bytes are
    /// needed. A large Data-In segment the session has a place for is
    /// received straight into it: the header is cut off the receive buffer,
    /// whatever part of the segment is already there is copied over, and
    /// [`Self::recv`] reads the rest from the socket; padding and digest
    /// come through the receive buffer.
    fn take_pdu(&mut self) -> Result<Option<RawPdu>, Error> {
        if let Some(l) = &self.landing {
            if l.left() > 0 || self.rbuf.len() < l.trailer() {
                return Ok(None);
            }
            let l = self.landing.take().expect("checked above");
            self.header_first = BHS_LEN + if self.lim.header_digest { 4 } else { 0 };
            return Ok(Some(l.finish(&mut self.rbuf, &self.lim)));
        }
        let hlen = match header_len(&self.rbuf, &self.lim) {
            Ok(Some(n)) => n,
            Ok(None) => return Ok(None),
            Err(e) => return Err(Error::Protocol(e.to_string())),
        };
        // Bounded by our MaxRecvDataSegmentLength (header_len checked it).
        let dlen = data_segment_len(&self.rbuf) as usize;
        if dlen >= LAND_MIN as usize {
            let bhs: [u8; BHS_LEN] = self.rbuf[..BHS_LEN].try_into().expect("a BHS");
            if let Some(buf) = self.session.landing(&bhs) {
                self.landing = Some(Landing::start(&mut self.rbuf, hlen, buf, &self.lim));
                return self.take_pdu();
            }
        }
        match frame_len(&self.rbuf, &self.lim) {
            Ok(Some(n)) => {
                self.header_first = 0;
                split_pdu(&mut self.rbuf, n, &self.lim)
                    .map(Some)
                    .map_err(|e| Error::Protocol(e.to_string()))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(Error::Protocol(e.to_string())),
        }
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
