//! A userspace NVMe/TCP host (NVMe/TCP Transport 1.0; NVMe over Fabrics
//! 1.1 "Connect", "Property Get/Set"): one queue per [`NvmeQueue`] over a
//! blocking socket, commands pipelined up to the queue size, and the
//! controller bring-up a host does ([`Controller::connect`]: admin queue,
//! CC.EN, CSTS.RDY, Number of Queues, then I/O queues joined by CNTLID).
//!
//! Data to the controller goes in the capsule up to the controller's
//! in-capsule size (IOCCSZ), else in H2CData PDUs of at most MAXH2CDATA
//! when the controller sends R2T; data from it comes in C2HData PDUs, the
//! completion in a response capsule or folded into the last C2HData (the
//! SUCCESS flag, when SQ flow control is disabled, as this host asks).

use std::collections::VecDeque;
use std::io::{IoSlice, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use nvme_tcp_wire::capsule::{fctype, ConnectData, Cqe, Sgl, Sqe, Status, OPC_FABRICS};
use nvme_tcp_wire::{
    data_digest_ok, frame, DataHeader, Ic, Layout, Negotiated, PduType, IC_LEN, LAST_PDU, SUCCESS,
};

use crate::Error;

/// The default NVMe/TCP port.
pub const DEFAULT_PORT: u16 = 4420;

/// Most data one C2HData PDU may carry that this host accepts.
const MAX_C2H: u32 = 16 << 20;

/// A completed command.
#[derive(Debug, Clone)]
pub struct Completion {
    pub cid: u16,
    pub status: Status,
    pub result: u64,
    /// Data from the controller.
    pub data: Bytes,
}

impl Completion {
    /// `Err` describing a failed status.
    pub fn ok(&self) -> Result<(), Error> {
        if self.status.is_success() {
            Ok(())
        } else {
            Err(Error::Protocol(format!(
                "NVMe status SCT {:#x} SC {:#04x}{}",
                self.status.sct,
                self.status.sc,
                if self.status.dnr { " (DNR)" } else { "" }
            )))
        }
    }
}

/// A command in flight.
struct Pending {
    /// Data to send when the controller asks (R2T).
    write: Bytes,
    /// Data received so far: the C2HData PDU's own bytes when one carried
    /// it all (no copy), else gathered.
    read: Option<Received>,
}

enum Received {
    Whole(Bytes),
    Gathered(BytesMut),
}

impl Received {
    fn len(&self) -> usize {
        match self {
            Received::Whole(b) => b.len(),
            Received::Gathered(b) => b.len(),
        }
    }

    fn freeze(self) -> Bytes {
        match self {
            Received::Whole(b) => b,
            Received::Gathered(b) => b.freeze(),
        }
    }
}

/// One NVMe/TCP connection: one queue (module docs).
pub struct NvmeQueue {
    stream: TcpStream,
    tx: Layout,
    rx: Negotiated,
    maxh2cdata: u32,
    /// Data this queue sends in the capsule at most.
    in_capsule: u32,
    rbuf: BytesMut,
    /// Headers laid out for sending: split off as each is queued.
    arena: BytesMut,
    out: VecDeque<Bytes>,
    /// Commands in flight, by CID (CIDs are below the depth).
    inflight: Vec<Option<Pending>>,
    outstanding: usize,
    free: Vec<u16>,
    depth: u16,
    /// How long [`Self::wait`] tries the socket without sleeping.
    busy_poll: Duration,
    pub qid: u16,
}

impl NvmeQueue {
    /// Connects to `addr` and initializes the connection (ICReq/ICResp)
    /// with header and data digests as asked.
    pub fn open(addr: SocketAddr, header_digest: bool, data_digest: bool) -> Result<Self, Error> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
        stream.set_nodelay(true)?;
        let ic = Ic {
            pfv: 0,
            pda: 0,
            header_digest,
            data_digest,
            max: 0,
        };
        stream.write_all(&ic.encode(false))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut b = [0u8; IC_LEN];
        stream.read_exact(&mut b)?;
        stream.set_read_timeout(None)?;
        if b[0] != PduType::IcResp as u8 {
            return Err(Error::Protocol(format!(
                "expected ICResp, got PDU type {:#04x}",
                b[0]
            )));
        }
        let r = Ic::decode(&b);
        if r.pfv != 0 || r.max < nvme_tcp_wire::MIN_MAXH2CDATA || r.pda > 31 {
            return Err(Error::Protocol(format!("ICResp not acceptable: {r:?}")));
        }
        Ok(NvmeQueue {
            stream,
            tx: Layout {
                header_digest: r.header_digest,
                data_digest: r.data_digest,
                alignment: 4 * (u32::from(r.pda) + 1),
            },
            rx: Negotiated {
                header_digest: r.header_digest,
                data_digest: r.data_digest,
                alignment: 0,
                max_data: MAX_C2H,
            },
            maxh2cdata: r.max,
            in_capsule: 8192,
            rbuf: BytesMut::with_capacity(256 * 1024),
            arena: BytesMut::with_capacity(64 * 1024),
            out: VecDeque::new(),
            inflight: (0..32).map(|_| None).collect(),
            outstanding: 0,
            free: (0..32).rev().collect(),
            depth: 32,
            busy_poll: Duration::ZERO,
            qid: 0,
        })
    }

    /// Commands this queue may have in flight (its size less one).
    pub fn set_depth(&mut self, depth: u16) {
        self.depth = depth;
        self.free = (0..depth).rev().collect();
        self.inflight = (0..depth).map(|_| None).collect();
        self.outstanding = 0;
    }

    /// Queues `b` (a header or a digest) through the arena.
    fn queue_small(&mut self, b: &[u8]) {
        if self.arena.capacity() - self.arena.len() < b.len() {
            self.arena = BytesMut::with_capacity(64 * 1024);
        }
        self.arena.extend_from_slice(b);
        self.out.push_back(self.arena.split().freeze());
    }

    /// Takes command `cid` out of flight.
    fn finish(&mut self, cid: u16) -> Option<Pending> {
        let p = self.inflight.get_mut(usize::from(cid))?.take()?;
        self.outstanding -= 1;
        self.free.push(cid);
        Some(p)
    }

    /// Data sent in the capsule at most (the controller's IOCCSZ less the
    /// 64-byte command).
    pub fn set_in_capsule(&mut self, bytes: u32) {
        self.in_capsule = bytes;
    }

    /// Polls the socket for up to `budget` before sleeping in
    /// [`Self::wait`] (as the iSCSI initiator's `set_busy_poll`).
    pub fn set_busy_poll(&mut self, budget: Duration) {
        self.busy_poll = budget;
    }

    /// Reads what the socket has into the receive buffer, blocking or not;
    /// `Ok(0)` when a non-blocking read found nothing.
    fn fill(&mut self, block: bool) -> Result<usize, Error> {
        if self.rbuf.capacity() - self.rbuf.len() < 64 * 1024 {
            self.rbuf.reserve(256 * 1024);
        }
        let flags = if block { 0 } else { libc::MSG_DONTWAIT };
        use std::os::fd::AsFd;
        match netio::recv_into(self.stream.as_fd(), &mut self.rbuf, flags) {
            Ok(0) => Err(Error::Closed),
            Ok(n) => Ok(n),
            Err(e) if !block && e.kind() == std::io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Bounds how long [`Self::wait`] and [`Self::call`] block on the
    /// socket (an error once it passes); `None`: for ever.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> Result<(), Error> {
        self.stream.set_read_timeout(t)?;
        Ok(())
    }

    /// Whether another command may be submitted.
    pub fn can_submit(&self) -> bool {
        !self.free.is_empty()
    }

    /// Commands in flight.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Queues command `sqe` (its CID is set here and returned) with `write`
    /// data to the controller or room for `read_len` bytes from it. Sent by
    /// the next [`Self::wait`] or [`Self::flush`].
    pub fn submit(&mut self, mut sqe: Sqe, write: Bytes, read_len: u32) -> Result<u16, Error> {
        let cid = self
            .free
            .pop()
            .ok_or_else(|| Error::Protocol("queue full".into()))?;
        sqe.0[2..4].copy_from_slice(&cid.to_le_bytes());
        // SGL, and PSDT 01b (SGLs).
        sqe.0[1] = (sqe.0[1] & !0xc0) | 0x40;
        let in_capsule = !write.is_empty() && write.len() as u32 <= self.in_capsule;
        let sgl = if in_capsule {
            Sgl::InCapsule {
                offset: 0,
                length: write.len() as u32,
            }
        } else {
            Sgl::Transport {
                length: if write.is_empty() {
                    read_len
                } else {
                    write.len() as u32
                },
            }
        };
        sqe.0[24..40].copy_from_slice(&sgl.encode());
        let mut psh = [0u8; 64];
        psh.copy_from_slice(&sqe.0);
        let data_len = if in_capsule { write.len() } else { 0 };
        let h = self.tx.header(PduType::CapsuleCmd, 0, &psh, data_len);
        self.queue_small(&h);
        if in_capsule {
            let d = self.tx.data_digest_of(&write);
            self.out.push_back(write.clone());
            if let Some(d) = d {
                self.queue_small(&d);
            }
        }
        self.inflight[usize::from(cid)] = Some(Pending {
            write: if in_capsule { Bytes::new() } else { write },
            read: None,
        });
        self.outstanding += 1;
        Ok(cid)
    }

    /// Sends everything queued.
    pub fn flush(&mut self) -> Result<(), Error> {
        while !self.out.is_empty() {
            let mut iov = [IoSlice::new(&[]); 64];
            let k = self.out.len().min(64);
            for (s, b) in iov.iter_mut().zip(self.out.iter()) {
                *s = IoSlice::new(b);
            }
            let mut n = self.stream.write_vectored(&iov[..k])?;
            if n == 0 {
                return Err(Error::Closed);
            }
            while n > 0 {
                let f = self.out.front_mut().expect("bytes were written from it");
                if n >= f.len() {
                    n -= f.len();
                    self.out.pop_front();
                } else {
                    let _ = f.split_to(n);
                    n = 0;
                }
            }
        }
        Ok(())
    }

    /// Sends what is queued and waits for at least one completion (when
    /// commands are in flight); appends every completion received.
    pub fn wait(&mut self, done: &mut Vec<Completion>) -> Result<(), Error> {
        let before = done.len();
        loop {
            self.flush()?;
            self.take_received(done)?;
            if done.len() > before || self.outstanding == 0 {
                return self.flush();
            }
            if !self.out.is_empty() {
                // Data an R2T asked for: send it before waiting.
                continue;
            }
            let start = Instant::now();
            let mut got = 0;
            while !self.busy_poll.is_zero() && got == 0 {
                got = self.fill(false)?;
                if start.elapsed() >= self.busy_poll {
                    break;
                }
                std::hint::spin_loop();
            }
            if got == 0 {
                self.fill(true)?;
            }
        }
    }

    /// Sends what is queued and appends the completions the socket has
    /// now, without blocking (for a caller that polls several queues).
    pub fn poll_completions(&mut self, done: &mut Vec<Completion>) -> Result<(), Error> {
        self.flush()?;
        while self.fill(false)? > 0 {}
        self.take_received(done)?;
        // Data an R2T asked for goes out at once.
        self.flush()
    }

    /// The socket, for poll(2).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.stream.as_raw_fd()
    }

    /// Handles every complete PDU received.
    fn take_received(&mut self, done: &mut Vec<Completion>) -> Result<(), Error> {
        loop {
            let f = match frame(&self.rbuf, &self.rx) {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(()),
                Err(e) => return Err(Error::Protocol(format!("from the controller: {e}"))),
            };
            let pdu = self.rbuf.split_to(f.len).freeze();
            match f.ch.pdu_type {
                PduType::CapsuleResp => {
                    let cqe = Cqe::decode(pdu[8..24].try_into().expect("framed: 24 bytes"));
                    let Some(p) = self.finish(cqe.cid) else {
                        return Err(Error::Protocol(format!(
                            "a response for command {} not in flight",
                            cqe.cid
                        )));
                    };
                    done.push(Completion {
                        cid: cqe.cid,
                        status: cqe.status,
                        result: cqe.result,
                        data: p.read.map_or_else(Bytes::new, Received::freeze),
                    });
                }
                PduType::C2hData => {
                    let h = DataHeader::decode(&pdu);
                    if !data_digest_ok(&pdu, &f) {
                        return Err(Error::Protocol("C2HData data digest mismatch".into()));
                    }
                    let Some(p) = self
                        .inflight
                        .get_mut(usize::from(h.cccid))
                        .and_then(Option::as_mut)
                    else {
                        return Err(Error::Protocol(format!(
                            "C2HData for command {} not in flight",
                            h.cccid
                        )));
                    };
                    let have = p.read.as_ref().map_or(0, Received::len);
                    if h.offset as usize != have || h.length as usize != f.data.len() {
                        return Err(Error::Protocol(format!(
                            "C2HData at {} of {} bytes, {have} expected next",
                            h.offset, h.length
                        )));
                    }
                    let piece = pdu.slice(f.data.clone());
                    p.read = Some(match p.read.take() {
                        None => Received::Whole(piece),
                        Some(r) => {
                            let mut g = match r {
                                Received::Whole(b) => BytesMut::from(&b[..]),
                                Received::Gathered(g) => g,
                            };
                            g.extend_from_slice(&piece);
                            Received::Gathered(g)
                        }
                    });
                    if f.ch.flags & SUCCESS != 0 {
                        if f.ch.flags & LAST_PDU == 0 {
                            return Err(Error::Protocol("SUCCESS without LAST_PDU".into()));
                        }
                        let p = self.finish(h.cccid).expect("present");
                        done.push(Completion {
                            cid: h.cccid,
                            status: Status::SUCCESS,
                            result: 0,
                            data: p.read.map_or_else(Bytes::new, Received::freeze),
                        });
                    }
                }
                PduType::R2t => {
                    let h = DataHeader::decode(&pdu);
                    let Some(p) = self
                        .inflight
                        .get(usize::from(h.cccid))
                        .and_then(Option::as_ref)
                    else {
                        return Err(Error::Protocol(format!(
                            "R2T for command {} not in flight",
                            h.cccid
                        )));
                    };
                    let end = h.offset as usize + h.length as usize;
                    if end > p.write.len() || h.length == 0 {
                        return Err(Error::Protocol(format!(
                            "R2T for {} bytes at {} of a {}-byte write",
                            h.length,
                            h.offset,
                            p.write.len()
                        )));
                    }
                    let data = p.write.slice(h.offset as usize..end);
                    let mut off = 0usize;
                    while off < data.len() {
                        let n = (data.len() - off).min(self.maxh2cdata as usize);
                        let last = off + n == data.len();
                        let dh = DataHeader {
                            cccid: h.cccid,
                            ttag: h.ttag,
                            offset: h.offset + off as u32,
                            length: n as u32,
                        };
                        let hdr = self.tx.h2c_data(&dh, last);
                        let piece = data.slice(off..off + n);
                        let dd = self.tx.data_digest_of(&piece);
                        self.queue_small(&hdr);
                        self.out.push_back(piece);
                        if let Some(d) = dd {
                            self.queue_small(&d);
                        }
                        off += n;
                    }
                }
                PduType::C2hTermReq => {
                    let fes = u16::from_le_bytes([pdu[8], pdu[9]]);
                    return Err(Error::Protocol(format!(
                        "the controller terminated the connection (C2HTermReq, FES {fes:#x})"
                    )));
                }
                t => {
                    return Err(Error::Protocol(format!(
                        "unexpected PDU {t:?} from the controller"
                    )))
                }
            }
        }
    }

    /// Runs one command and waits for it.
    pub fn call(&mut self, sqe: Sqe, write: Bytes, read_len: u32) -> Result<Completion, Error> {
        let cid = self.submit(sqe, write, read_len)?;
        let mut done = Vec::new();
        loop {
            self.wait(&mut done)?;
            if let Some(i) = done.iter().position(|c| c.cid == cid) {
                return Ok(done.swap_remove(i));
            }
        }
    }

    /// Fabrics Connect of this queue as queue `qid` with `sqsize` entries;
    /// the controller ID (`Ok`), or the refusal. A controller that asks
    /// for authentication is refused here: see [`Self::connect_auth`].
    pub fn connect(
        &mut self,
        qid: u16,
        sqsize: u16,
        data: &ConnectData,
        kato_ms: u32,
    ) -> Result<u16, Error> {
        self.connect_auth(qid, sqsize, data, kato_ms, None)
    }

    /// [`Self::connect`], then, when the controller asks for it (AUTHREQ
    /// ATR), this queue's DH-HMAC-CHAP transaction with `auth`'s secrets.
    pub fn connect_auth(
        &mut self,
        qid: u16,
        sqsize: u16,
        data: &ConnectData,
        kato_ms: u32,
        auth: Option<&Dhchap>,
    ) -> Result<u16, Error> {
        let mut s = [0u8; 64];
        s[0] = OPC_FABRICS;
        s[4] = fctype::CONNECT;
        s[42..44].copy_from_slice(&qid.to_le_bytes());
        s[44..46].copy_from_slice(&(sqsize - 1).to_le_bytes());
        s[46] = 0x04; // CATTR: SQ flow control disabled
        s[48..52].copy_from_slice(&kato_ms.to_le_bytes());
        let c = self.call(Sqe(s), Bytes::copy_from_slice(&data.encode()), 0)?;
        c.ok().map_err(|e| {
            Error::Protocol(format!("Connect refused: {e} (result {:#x})", c.result))
        })?;
        self.qid = qid;
        self.set_depth(sqsize - 1);
        if c.result & u64::from(nvme_auth::AUTHREQ_ATR) != 0 {
            let a = auth.ok_or_else(|| {
                Error::Protocol(
                    "the controller requires DH-HMAC-CHAP authentication and no secret was given"
                        .into(),
                )
            })?;
            self.authenticate(a, data, qid)?;
        }
        Ok(c.result as u16)
    }

    /// One DH-HMAC-CHAP transaction (NVMe Base 2.0 §8.13) on this queue.
    fn authenticate(&mut self, a: &Dhchap, data: &ConnectData, qid: u16) -> Result<(), Error> {
        let mut t = nvme_auth::HostTransaction::new(
            &a.secret,
            a.ctrl_secret.as_ref(),
            &data.hostnqn,
            &data.subnqn,
            qid,
        );
        let send = |q: &mut NvmeQueue, m: Vec<u8>| -> Result<(), Error> {
            let c = q.call(auth_sqe(true, m.len()), Bytes::from(m), 0)?;
            c.ok()
        };
        let receive = |q: &mut NvmeQueue| -> Result<Bytes, Error> {
            let c = q.call(auth_sqe(false, 4096), Bytes::new(), 4096)?;
            c.ok()?;
            Ok(c.data)
        };
        let refused = |e: nvme_auth::HostError| Error::Protocol(format!("DH-HMAC-CHAP: {e}"));
        send(self, t.negotiate())?;
        let challenge = receive(self)?;
        let reply = t
            .reply(&challenge, &mut |b: &mut [u8]| {
                getrandom::fill(b).expect("the OS random source")
            })
            .map_err(refused)?;
        send(self, reply)?;
        let success1 = receive(self)?;
        match t.success1(&success1) {
            Ok(Some(s2)) => send(self, s2),
            Ok(None) => Ok(()),
            Err(e) => {
                let _ = send(self, t.failure2(nvme_auth::Reason::Failed));
                Err(refused(e))
            }
        }
    }
}

/// This host's DH-HMAC-CHAP secrets: its own, and the controller's for
/// bidirectional authentication (`DHHC-1:…` as `nvme gen-dhchap-key`
/// prints them).
#[derive(Debug)]
pub struct Dhchap {
    pub secret: nvme_auth::Secret,
    pub ctrl_secret: Option<nvme_auth::Secret>,
}

/// Authentication Send (`send`) or Receive of `len` bytes.
fn auth_sqe(send: bool, len: usize) -> Sqe {
    let mut s = [0u8; 64];
    s[0] = OPC_FABRICS;
    s[4] = if send {
        nvme_auth::FCTYPE_SEND
    } else {
        nvme_auth::FCTYPE_RECEIVE
    };
    s[41] = nvme_auth::SPSP0;
    s[42] = nvme_auth::SPSP1;
    s[43] = nvme_auth::SECP;
    s[44..48].copy_from_slice(&(len as u32).to_le_bytes());
    Sqe(s)
}

/// An admin or fabrics command with `cdw10..` filled by the caller.
pub fn sqe(opcode: u8, nsid: u32, dws: &[(usize, u32)]) -> Sqe {
    let mut s = [0u8; 64];
    s[0] = opcode;
    s[4..8].copy_from_slice(&nsid.to_le_bytes());
    for &(n, v) in dws {
        s[n * 4..n * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    Sqe(s)
}

/// Property Get/Set commands.
fn property(set: bool, offset: u32, eight: bool, value: u64) -> Sqe {
    let mut s = [0u8; 64];
    s[0] = OPC_FABRICS;
    s[4] = if set {
        fctype::PROPERTY_SET
    } else {
        fctype::PROPERTY_GET
    };
    s[40] = u8::from(eight);
    s[44..48].copy_from_slice(&offset.to_le_bytes());
    if set {
        s[48..56].copy_from_slice(&value.to_le_bytes());
    }
    Sqe(s)
}

/// A namespace's geometry (Identify Namespace).
#[derive(Debug, Clone, Copy)]
pub struct NamespaceInfo {
    pub blocks: u64,
    pub block_size: u32,
    /// NGUID.
    pub nguid: [u8; 16],
    /// Its ANA group (ANAGRPID; 0 when the controller reports no ANA).
    pub anagrpid: u32,
}

/// A controller: its admin queue and how to open I/O queues.
pub struct Controller {
    pub admin: NvmeQueue,
    pub addr: SocketAddr,
    pub cntlid: u16,
    pub connect: ConnectData,
    pub digests: (bool, bool),
    /// I/O queues granted.
    pub io_queues: u16,
    /// In-capsule data size of I/O queues (IOCCSZ × 16 − 64).
    pub in_capsule: u32,
    /// Largest transfer (MDTS), bytes.
    pub max_transfer: u32,
    /// DH-HMAC-CHAP secrets, for each queue's transaction.
    pub auth: Option<std::sync::Arc<Dhchap>>,
}

impl Controller {
    /// Brings a controller of `subnqn` up: admin queue, enable, wait
    /// ready, Identify Controller, Number of Queues (`queues` asked).
    pub fn connect(
        addr: SocketAddr,
        subnqn: &str,
        hostnqn: &str,
        digests: (bool, bool),
        queues: u16,
    ) -> Result<Controller, Error> {
        Self::connect_auth(addr, subnqn, hostnqn, digests, queues, None)
    }

    /// [`Self::connect`] with DH-HMAC-CHAP secrets for a subsystem that
    /// authenticates its hosts (every queue authenticates).
    pub fn connect_auth(
        addr: SocketAddr,
        subnqn: &str,
        hostnqn: &str,
        digests: (bool, bool),
        queues: u16,
        auth: Option<std::sync::Arc<Dhchap>>,
    ) -> Result<Controller, Error> {
        let mut admin = NvmeQueue::open(addr, digests.0, digests.1)?;
        let host_id = crate::random_bytes::<16>();
        let mut connect = ConnectData {
            host_id,
            cntlid: 0xffff,
            subnqn: subnqn.to_owned(),
            hostnqn: hostnqn.to_owned(),
        };
        let cntlid = admin.connect_auth(0, 32, &connect, 0, auth.as_deref())?;
        connect.cntlid = cntlid;
        // CC: EN, IOSQES 6, IOCQES 4.
        let cc = 1u64 | (6 << 16) | (4 << 20);
        admin
            .call(property(true, 0x14, false, cc), Bytes::new(), 0)?
            .ok()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let c = admin.call(property(false, 0x1c, false, 0), Bytes::new(), 0)?;
            c.ok()?;
            if c.result & 1 != 0 {
                break;
            }
            if c.result & 2 != 0 || Instant::now() > deadline {
                return Err(Error::Protocol(format!(
                    "controller not ready (CSTS {:#x})",
                    c.result
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let id = admin.call(sqe(0x06, 0, &[(10, 1)]), Bytes::new(), 4096)?;
        id.ok()?;
        let mdts = id.data[77];
        let ioccsz = u32::from_le_bytes(id.data[1792..1796].try_into().expect("4 bytes"));
        let max_transfer = if mdts == 0 {
            MAX_C2H
        } else {
            (4096u64 << mdts).min(u64::from(MAX_C2H)) as u32
        };
        let q = queues.max(1) - 1;
        let nq = admin.call(
            sqe(
                0x09,
                0,
                &[(10, 0x07), (11, u32::from(q) | (u32::from(q) << 16))],
            ),
            Bytes::new(),
            0,
        )?;
        nq.ok()?;
        let granted = (nq.result as u16).min((nq.result >> 16) as u16) + 1;
        Ok(Controller {
            admin,
            addr,
            cntlid,
            connect,
            digests,
            io_queues: granted,
            in_capsule: (ioccsz * 16).saturating_sub(64),
            max_transfer,
            auth,
        })
    }

    /// The active NSIDs (Identify, CNS 02h).
    pub fn active_namespaces(&mut self) -> Result<Vec<u32>, Error> {
        let c = self
            .admin
            .call(sqe(0x06, 0, &[(10, 2)]), Bytes::new(), 4096)?;
        c.ok()?;
        Ok(c.data
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .take_while(|&n| n != 0)
            .collect())
    }

    /// Identify Namespace `nsid`.
    pub fn namespace(&mut self, nsid: u32) -> Result<NamespaceInfo, Error> {
        let c = self
            .admin
            .call(sqe(0x06, nsid, &[(10, 0)]), Bytes::new(), 4096)?;
        c.ok()?;
        let d = &c.data;
        let blocks = u64::from_le_bytes(d[0..8].try_into().expect("8 bytes"));
        let flbas = usize::from(d[26] & 0x0f);
        let lbads = d[128 + flbas * 4 + 2];
        if blocks == 0 || !(9..=16).contains(&lbads) {
            return Err(Error::Protocol(format!(
                "namespace {nsid} is not active (NSZE {blocks}, LBADS {lbads})"
            )));
        }
        Ok(NamespaceInfo {
            blocks,
            block_size: 1 << lbads,
            nguid: d[104..120].try_into().expect("16 bytes"),
            anagrpid: u32::from_le_bytes(d[92..96].try_into().expect("4 bytes")),
        })
    }

    /// Opens I/O queue `qid` (1..=granted) of `entries` entries.
    pub fn io_queue(&self, qid: u16, entries: u16) -> Result<NvmeQueue, Error> {
        let mut q = NvmeQueue::open(self.addr, self.digests.0, self.digests.1)?;
        q.connect_auth(qid, entries, &self.connect, 0, self.auth.as_deref())?;
        q.set_in_capsule(self.in_capsule);
        Ok(q)
    }
}

/// One entry of a Discovery log page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// 2: an NVM subsystem; 3: the discovery subsystem itself.
    pub subtype: u8,
    pub port_id: u16,
    pub subnqn: String,
    pub traddr: String,
    pub trsvcid: String,
}

/// Asks the discovery controller at `addr` for its log page: every
/// subsystem `hostnqn` may connect to, at every port.
pub fn discover(addr: SocketAddr, hostnqn: &str) -> Result<Vec<DiscoveryEntry>, Error> {
    let mut q = NvmeQueue::open(addr, false, false)?;
    let d = ConnectData {
        host_id: crate::random_bytes::<16>(),
        cntlid: 0xffff,
        subnqn: "nqn.2014-08.org.nvmexpress.discovery".into(),
        hostnqn: hostnqn.to_owned(),
    };
    q.connect(0, 32, &d, 0)?;
    q.call(property(true, 0x14, false, 1), Bytes::new(), 0)?
        .ok()?;
    let page = |q: &mut NvmeQueue, len: u32| -> Result<Bytes, Error> {
        let numd = len / 4 - 1;
        let c = q.call(
            sqe(0x02, 0, &[(10, 0x70 | (numd << 16))]),
            Bytes::new(),
            len,
        )?;
        c.ok()?;
        Ok(c.data)
    };
    let head = page(&mut q, 1024)?;
    let n = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes")).min(1000) as u32;
    let all = page(&mut q, 1024 * (n + 1))?;
    let text = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .trim_end_matches(['\0', ' '])
            .to_string()
    };
    Ok(all[1024..]
        .chunks_exact(1024)
        .map(|e| DiscoveryEntry {
            subtype: e[2],
            port_id: u16::from_le_bytes([e[4], e[5]]),
            trsvcid: text(&e[32..64]),
            subnqn: text(&e[256..512]),
            traddr: text(&e[512..768]),
        })
        .collect())
}

/// An `nvme-tcp://HOST[:PORT]/SUBNQN[/NSID][?digests]` URL (`?digests`:
/// header and data digests; `?header_digest`, `?data_digest`: one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeUrl {
    pub addr: SocketAddr,
    pub subnqn: String,
    pub nsid: u32,
    /// Header and data digests asked for.
    pub digests: (bool, bool),
}

impl std::fmt::Display for NvmeUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "nvme-tcp://{}/{}/{}", self.addr, self.subnqn, self.nsid)?;
        match self.digests {
            (true, true) => write!(f, "?digests"),
            (true, false) => write!(f, "?header_digest"),
            (false, true) => write!(f, "?data_digest"),
            (false, false) => Ok(()),
        }
    }
}

/// The address of an `nvme-tcp://HOST[:PORT][/…]` URL (port 4420 when
/// none is given): what discovery needs.
pub fn portal_of(s: &str) -> Result<SocketAddr, String> {
    let rest = s
        .strip_prefix("nvme-tcp://")
        .ok_or_else(|| format!("{s}: not an nvme-tcp:// URL"))?;
    let host = rest.split(['/', '?']).next().unwrap_or_default();
    let host = if host.contains(']') || host.matches(':').count() == 1 {
        host.to_owned()
    } else {
        format!("{host}:{DEFAULT_PORT}")
    };
    host.to_socket_addrs()
        .map_err(|e| format!("{s}: {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{s}: {host}: no address"))
}

impl NvmeUrl {
    pub fn parse(s: &str) -> Result<NvmeUrl, String> {
        let rest = s
            .strip_prefix("nvme-tcp://")
            .ok_or_else(|| format!("{s}: not an nvme-tcp:// URL"))?;
        let (rest, digests) = match rest.split_once('?') {
            None => (rest, (false, false)),
            Some((r, "digests")) => (r, (true, true)),
            Some((r, "header_digest")) => (r, (true, false)),
            Some((r, "data_digest")) => (r, (false, true)),
            Some((_, q)) => {
                return Err(format!(
                    "{s}: unknown option {q:?} (digests, header_digest, data_digest)"
                ))
            }
        };
        let (host, path) = rest
            .split_once('/')
            .ok_or_else(|| format!("{s}: no subsystem NQN (nvme-tcp://HOST:PORT/NQN/NSID)"))?;
        let host = if host.contains(']') || host.matches(':').count() == 1 {
            host.to_owned()
        } else {
            format!("{host}:{DEFAULT_PORT}")
        };
        let addr = host
            .to_socket_addrs()
            .map_err(|e| format!("{s}: {host}: {e}"))?
            .next()
            .ok_or_else(|| format!("{s}: {host}: no address"))?;
        let (subnqn, nsid) = match path.rsplit_once('/') {
            Some((n, id)) if id.parse::<u32>().is_ok() => (n, id.parse().expect("checked")),
            _ => (path.trim_end_matches('/'), 1),
        };
        // Any NQN a target may serve (NVMe Base 2.0 §4.5 asks for the
        // nqn. form; targets such as Linux nvmet serve others too), but
        // not an iSCSI name given by mistake.
        if ["iqn.", "eui.", "naa."]
            .iter()
            .any(|p| subnqn.starts_with(p))
        {
            return Err(format!(
                "{s}: {subnqn} is an iSCSI name: give the subsystem's NQN (ironsan: the name \
                 with iqn. made nqn.), or use an iscsi:// URL"
            ));
        }
        if subnqn.is_empty()
            || subnqn.len() > 223
            || !subnqn.bytes().all(|b| b.is_ascii_graphic())
            || nsid == 0
        {
            return Err(format!(
                "{s}: expected nvme-tcp://HOST:PORT/NQN/NSID (an NQN of 1..=223 printable \
                 bytes; NSID from 1)"
            ));
        }
        Ok(NvmeUrl {
            addr,
            subnqn: subnqn.to_owned(),
            nsid,
            digests,
        })
    }
}

/// A host NQN of the UUID form (NVMe Base 2.0 "NVMe Qualified Names").
pub fn host_nqn(id: &[u8; 16]) -> String {
    let h: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "nqn.2014-08.org.nvmexpress:uuid:{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = NvmeUrl::parse("nvme-tcp://127.0.0.1:4421/nqn.2026-12.io.ironsan:t/2").unwrap();
        assert_eq!(u.addr.port(), 4421);
        assert_eq!(u.subnqn, "nqn.2026-12.io.ironsan:t");
        assert_eq!(u.nsid, 2);
        let u = NvmeUrl::parse("nvme-tcp://127.0.0.1/nqn.2026-12.io.ironsan:t").unwrap();
        assert_eq!((u.addr.port(), u.nsid), (DEFAULT_PORT, 1));
        assert!(NvmeUrl::parse("iscsi://127.0.0.1/x/0").is_err());
        assert!(NvmeUrl::parse("nvme-tcp://127.0.0.1:1/iqn.x/1").is_err());
        assert!(NvmeUrl::parse("nvme-tcp://127.0.0.1:1/nqn.x/0").is_err());
        // The free-form names Linux nvmet serves (blktests uses them).
        let u = NvmeUrl::parse("nvme-tcp://127.0.0.1:1/blktests-subsystem-1/1").unwrap();
        assert_eq!(u.subnqn, "blktests-subsystem-1");
        assert!(NvmeUrl::parse("nvme-tcp://127.0.0.1:1/two words/1").is_err());
        let u = NvmeUrl::parse("nvme-tcp://127.0.0.1:9/nqn.x:y/3?digests").unwrap();
        assert_eq!(u.digests, (true, true));
        assert_eq!(u.to_string(), "nvme-tcp://127.0.0.1:9/nqn.x:y/3?digests");
        assert_eq!(NvmeUrl::parse(&u.to_string()).unwrap(), u);
        assert!(NvmeUrl::parse("nvme-tcp://127.0.0.1:9/nqn.x/1?bogus").is_err());
    }

    #[test]
    fn host_nqns_are_uuids() {
        assert_eq!(
            host_nqn(&[0xab; 16]),
            "nqn.2014-08.org.nvmexpress:uuid:abababab-abab-abab-abab-abababababab"
        );
    }
}
