//! `probe nvme-null-target`: the smallest NVMe/TCP controller hosts accept,
//! the ceiling of the side-by-side NVMe/TCP rows as `probe null-target` is
//! of the iSCSI ones. Reads are answered with zeros, writes are received
//! (in capsule or after one R2T for the whole transfer) and dropped; one
//! namespace (NSID 1, 512-byte blocks) in one subsystem, whatever NQN the
//! host asks for. Deliberately independent of the target's code: only the
//! PDU codec (`nvme_tcp_wire`) is shared.
//!
//! What it implements, by the NVMe/TCP transport specification 1.0
//! sections: connection initialization (3.6.2.2-3: ICReq/ICResp, digests
//! as the host asks, CPDA 0, MAXH2CDATA 128 KiB), command capsules with
//! in-capsule data (3.3.2, 16 KiB on I/O queues), R2T and H2CData
//! (3.3.3), C2HData with the SUCCESS flag when the host disabled SQ flow
//! control (3.3.4); of NVMe over Fabrics 1.1: Connect, Property Get/Set
//! (CAP, VS, CC, CSTS), Disconnect; of the base specification 2.0: the
//! admin commands a host needs to start (Identify CNS 00h-03h, Set/Get
//! Features, Get Log Page answered with zeros, Keep Alive; Asynchronous
//! Event Requests are held), and Read, Write and Flush. Anything else
//! gets Invalid Command Opcode.

use anyhow::Result;
use clap::Args;
use nvme_tcp_wire::capsule::{fctype, Cqe, Sgl, Sqe, Status, OPC_FABRICS};
use nvme_tcp_wire::{frame, DataHeader, Frame, Ic, Layout, Negotiated, PduType, IC_LEN, LAST_PDU};
use std::io::{IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};

#[derive(Args, Debug)]
pub struct NvmeNullArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:4499")]
    listen: String,
    /// The namespace's capacity in bytes.
    #[arg(long, default_value_t = 1 << 30)]
    size: u64,
    /// Microseconds a receive tries the socket before it sleeps (the
    /// target's `limits.busy_poll_us`); 0, the default, blocks at once, as
    /// the iSCSI null responders do.
    #[arg(long, default_value_t = 0)]
    busy_poll_us: u64,
}

/// The most one H2CData PDU may carry (MAXH2CDATA).
const MAXH2CDATA: u32 = 128 * 1024;
/// In-capsule data on I/O queues (IOCCSZ = (64 + this) / 16).
const IN_CAPSULE: u32 = 16 * 1024;
/// The largest C2HData this responder sends.
const C2H_CHUNK: usize = 256 * 1024;
/// Block size of the namespace: 512 bytes, as ironsan's LUNs by default.
const LBADS: u8 = 9;

pub fn run(a: NvmeNullArgs) -> Result<()> {
    let l = TcpListener::bind(&a.listen)?;
    println!("nvme-null-target: listening on {}", l.local_addr()?);
    for s in l.incoming() {
        let s = s?;
        let size = a.size;
        let busy = std::time::Duration::from_micros(a.busy_poll_us);
        std::thread::spawn(move || {
            let _ = Conn::new(s, size, busy).serve();
        });
    }
    Ok(())
}

struct Conn {
    s: TcpStream,
    size: u64,
    rbuf: Vec<u8>,
    /// Bytes of `rbuf` received.
    have: usize,
    rx: Negotiated,
    tx: Layout,
    /// Headers, responses and small data to send, in order.
    out: Vec<u8>,
    /// The queue this connection is, once connected (0: admin).
    qid: Option<u16>,
    sqsize: u16,
    sqhd: u16,
    /// SQ flow control disabled by the host (CATTR bit 2): completions of
    /// reads may ride in the last C2HData.
    no_sqfc: bool,
    cc: u32,
    /// Writes waiting for their data: (CID, transfer length, received).
    writes: Vec<(u16, u32, u32)>,
    zeros: Vec<u8>,
    /// How long a receive tries the socket before it sleeps.
    busy_poll: std::time::Duration,
}

impl Conn {
    fn new(s: TcpStream, size: u64, busy_poll: std::time::Duration) -> Conn {
        let _ = s.set_nodelay(true);
        Conn {
            s,
            size,
            rbuf: vec![0; 2 * MAXH2CDATA as usize],
            have: 0,
            rx: Negotiated::default(),
            tx: Layout::default(),
            out: Vec::with_capacity(64 * 1024),
            qid: None,
            sqsize: 32,
            sqhd: 0,
            no_sqfc: false,
            cc: 0,
            writes: Vec::new(),
            zeros: vec![0; C2H_CHUNK],
            busy_poll,
        }
    }

    fn serve(mut self) -> std::io::Result<()> {
        let mut ic = [0u8; IC_LEN];
        self.s.read_exact(&mut ic)?;
        if ic[0] != PduType::IcReq as u8 {
            return Ok(());
        }
        let req = Ic::decode(&ic);
        let resp = Ic {
            pfv: 0,
            pda: 0,
            header_digest: req.header_digest,
            data_digest: req.data_digest,
            max: MAXH2CDATA,
        };
        self.s.write_all(&resp.encode(true))?;
        self.rx = Negotiated {
            header_digest: req.header_digest,
            data_digest: req.data_digest,
            alignment: 4,
            max_data: MAXH2CDATA.max(IN_CAPSULE),
        };
        self.tx = Layout {
            header_digest: req.header_digest,
            data_digest: req.data_digest,
            alignment: 4 * (u32::from(req.pda.min(31)) + 1),
        };
        loop {
            let mut at = 0;
            loop {
                let f = match frame(&self.rbuf[at..self.have], &self.rx) {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    // A null responder answers nothing it cannot frame.
                    Err(_) => return Ok(()),
                };
                let end = at + f.len;
                if !self.handle(at, &f)? {
                    self.flush()?;
                    return Ok(());
                }
                at = end;
            }
            self.flush()?;
            self.rbuf.copy_within(at..self.have, 0);
            self.have -= at;
            let n = self.receive()?;
            if n == 0 {
                return Ok(());
            }
            self.have += n;
        }
    }

    /// Receives into the free part of the buffer: tries the socket for up
    /// to `busy_poll` without sleeping, as the target does, then blocks.
    fn receive(&mut self) -> std::io::Result<usize> {
        use std::os::fd::AsFd;
        let start = std::time::Instant::now();
        loop {
            let mut room = &mut self.rbuf[self.have..];
            match netio::recv_into(self.s.as_fd(), &mut room, libc::MSG_DONTWAIT) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if start.elapsed() >= self.busy_poll {
                        let mut room = &mut self.rbuf[self.have..];
                        return netio::recv_into(self.s.as_fd(), &mut room, 0);
                    }
                    std::hint::spin_loop();
                }
                r => return r,
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            self.s.write_all(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    fn respond(&mut self, cid: u16, result: u64, status: Status) {
        self.sqhd = (self.sqhd + 1) % self.sqsize.max(1);
        let cqe = Cqe {
            result,
            sqhd: self.sqhd,
            sqid: self.qid.unwrap_or(0),
            cid,
            status,
        };
        self.out
            .extend_from_slice(&self.tx.capsule_resp(&cqe.encode()));
    }

    /// Sends `data` (zeros when `None`) as C2HData, then the completion.
    fn send_data(&mut self, cid: u16, len: usize, data: Option<&[u8]>) -> std::io::Result<()> {
        let mut off = 0;
        while off < len {
            let n = (len - off).min(C2H_CHUNK);
            let last = off + n == len;
            let h = DataHeader {
                cccid: cid,
                ttag: 0,
                offset: off as u32,
                length: n as u32,
            };
            let success = last && self.no_sqfc;
            let hdr = self.tx.c2h_data(&h, last, success);
            let chunk: &[u8] = match data {
                Some(d) => &d[off..off + n],
                None => &self.zeros[..n],
            };
            let digest = self.tx.data_digest_of(chunk);
            if n <= 4096 {
                self.out.extend_from_slice(&hdr);
                self.out.extend_from_slice(chunk);
                if let Some(d) = digest {
                    self.out.extend_from_slice(&d);
                }
            } else {
                // Large reads go out in one writev behind what is queued.
                let d = digest.unwrap_or_default();
                let dl = if digest.is_some() { 4 } else { 0 };
                let iov = [
                    IoSlice::new(&self.out),
                    IoSlice::new(&hdr),
                    IoSlice::new(chunk),
                    IoSlice::new(&d[..dl]),
                ];
                write_all_vectored(&mut self.s, &iov)?;
                self.out.clear();
            }
            off += n;
        }
        if len == 0 || !self.no_sqfc {
            self.respond(cid, 0, Status::SUCCESS);
        } else {
            self.sqhd = (self.sqhd + 1) % self.sqsize.max(1);
        }
        Ok(())
    }

    /// Handles the PDU `f` at `at` in the receive buffer; false to close.
    fn handle(&mut self, at: usize, f: &Frame) -> std::io::Result<bool> {
        let b = at..at + f.len;
        match f.ch.pdu_type {
            PduType::CapsuleCmd => {
                let sqe = Sqe(self.rbuf[b.start + 8..b.start + 72]
                    .try_into()
                    .expect("64 bytes"));
                let data = at + f.data.start..at + f.data.end;
                self.command(&sqe, data)
            }
            PduType::H2cData => {
                let h = DataHeader::decode(&self.rbuf[b.start..b.start + 24]);
                if let Some(i) = self.writes.iter().position(|w| w.0 == h.cccid) {
                    self.writes[i].2 += f.data.len() as u32;
                    if f.ch.flags & LAST_PDU != 0 || self.writes[i].2 >= self.writes[i].1 {
                        let (cid, want, got) = self.writes.swap_remove(i);
                        if got >= want {
                            self.respond(cid, 0, Status::SUCCESS);
                        }
                    }
                }
                Ok(true)
            }
            PduType::H2cTermReq => Ok(false),
            _ => Ok(false),
        }
    }

    fn command(&mut self, sqe: &Sqe, data: std::ops::Range<usize>) -> std::io::Result<bool> {
        let cid = sqe.cid();
        let in_capsule = data.len();
        if sqe.opcode() == OPC_FABRICS {
            return self.fabrics(sqe, data);
        }
        let Some(qid) = self.qid else {
            // Nothing but Connect before Connect.
            self.respond(cid, 0, Status::generic(0x0c, true));
            return Ok(true);
        };
        let transfer = match sqe.sgl() {
            Sgl::Transport { length } => length,
            Sgl::InCapsule { length, .. } => length,
            _ => 0,
        };
        if qid == 0 {
            return self.admin(sqe).map(|()| true);
        }
        match sqe.opcode() {
            // Flush.
            0x00 => self.respond(cid, 0, Status::SUCCESS),
            // Write: data in the capsule, or one R2T for all of it.
            0x01 => {
                if in_capsule > 0 || transfer == 0 {
                    self.respond(cid, 0, Status::SUCCESS);
                } else {
                    self.writes.push((cid, transfer, 0));
                    let h = DataHeader {
                        cccid: cid,
                        ttag: cid,
                        offset: 0,
                        length: transfer,
                    };
                    let r = self.tx.r2t(&h);
                    self.out.extend_from_slice(&r);
                }
            }
            // Read: zeros.
            0x02 => {
                let nlb = (sqe.dw(12) & 0xffff) as usize + 1;
                let len = (nlb << LBADS).min(transfer as usize);
                self.send_data(cid, len, None)?;
            }
            _ => self.respond(cid, 0, Status::INVALID_OPCODE),
        }
        Ok(true)
    }

    fn fabrics(&mut self, sqe: &Sqe, _data: std::ops::Range<usize>) -> std::io::Result<bool> {
        let cid = sqe.cid();
        let s = &sqe.0;
        match sqe.fctype() {
            fctype::CONNECT => {
                let qid = u16::from_le_bytes([s[42], s[43]]);
                self.sqsize = u16::from_le_bytes([s[44], s[45]]).saturating_add(1);
                self.no_sqfc = s[46] & 0x04 != 0;
                self.qid = Some(qid);
                self.sqhd = 0;
                // The controller ID: 1.
                self.respond(cid, 1, Status::SUCCESS);
            }
            fctype::PROPERTY_GET => {
                let off = u32::from_le_bytes([s[44], s[45], s[46], s[47]]);
                let v: u64 = match off {
                    // CAP: MQES 1023, CQR, TO 10 (5 s), CSS NVM, MPSMIN 0.
                    0x00 => 1023 | (1 << 16) | (10 << 24) | (1 << 37),
                    // VS: 2.0.
                    0x08 => 0x0002_0000,
                    0x14 => u64::from(self.cc),
                    // CSTS: RDY follows EN; SHST complete after a shutdown.
                    0x1c => u64::from(self.cc & 1) | if self.cc & 0xc000 != 0 { 0x8 } else { 0 },
                    _ => 0,
                };
                self.respond(cid, v, Status::SUCCESS);
            }
            fctype::PROPERTY_SET => {
                let off = u32::from_le_bytes([s[44], s[45], s[46], s[47]]);
                if off == 0x14 {
                    self.cc = u32::from_le_bytes([s[48], s[49], s[50], s[51]]);
                }
                self.respond(cid, 0, Status::SUCCESS);
            }
            fctype::DISCONNECT => {
                self.respond(cid, 0, Status::SUCCESS);
                return Ok(false);
            }
            _ => self.respond(cid, 0, Status::INVALID_OPCODE),
        }
        Ok(true)
    }

    fn admin(&mut self, sqe: &Sqe) -> std::io::Result<()> {
        let cid = sqe.cid();
        match sqe.opcode() {
            // Identify.
            0x06 => {
                let mut d = [0u8; 4096];
                match sqe.dw(10) & 0xff {
                    0x00 if sqe.nsid() == 1 => {
                        let blocks = self.size >> LBADS;
                        d[0..8].copy_from_slice(&blocks.to_le_bytes());
                        d[8..16].copy_from_slice(&blocks.to_le_bytes());
                        d[16..24].copy_from_slice(&blocks.to_le_bytes());
                        d[104..120].copy_from_slice(&NGUID);
                        d[130] = LBADS;
                    }
                    0x00 => return self.send_data(cid, 4096, Some(&d)),
                    0x01 => {
                        d[0..2].copy_from_slice(&0x1d1du16.to_le_bytes());
                        d[4..24].copy_from_slice(b"00000000000000000001");
                        d[24..64].copy_from_slice(&[b' '; 40]);
                        d[24..40].copy_from_slice(b"ironsan nvmenull");
                        d[64..72].copy_from_slice(b"0       ");
                        // MDTS: 1 MiB (256 × 4 KiB).
                        d[77] = 8;
                        d[78..80].copy_from_slice(&1u16.to_le_bytes());
                        d[80..84].copy_from_slice(&0x0002_0000u32.to_le_bytes());
                        // SQES, CQES; NN 1.
                        d[512] = 0x66;
                        d[513] = 0x44;
                        d[516..520].copy_from_slice(&1u32.to_le_bytes());
                        let nqn = b"nqn.2026-11.io.ironsan:null";
                        d[768..768 + nqn.len()].copy_from_slice(nqn);
                        // IOCCSZ, IORCSZ (16-byte units).
                        d[1792..1796].copy_from_slice(&((64 + IN_CAPSULE) / 16).to_le_bytes());
                        d[1796..1800].copy_from_slice(&1u32.to_le_bytes());
                    }
                    0x02 => d[0..4].copy_from_slice(&1u32.to_le_bytes()),
                    0x03 if sqe.nsid() == 1 => {
                        // The NGUID descriptor.
                        d[0] = 2;
                        d[1] = 16;
                        d[4..20].copy_from_slice(&NGUID);
                    }
                    _ => {
                        self.respond(cid, 0, Status::INVALID_FIELD);
                        return Ok(());
                    }
                }
                self.send_data(cid, 4096, Some(&d))
            }
            // Get Log Page: zeros, as long as asked.
            0x02 => {
                let numd = (sqe.dw(10) >> 16) as usize | ((sqe.dw(11) as usize & 0xffff) << 16);
                let len = ((numd + 1) * 4).min(C2H_CHUNK);
                self.send_data(cid, len, None)
            }
            // Set Features: Number of Queues granted as asked, up to 64.
            0x09 => {
                let r = if sqe.dw(10) & 0xff == 0x07 {
                    let v = sqe.dw(11);
                    let sq = (v & 0xffff).min(63);
                    let cq = (v >> 16).min(63);
                    u64::from(sq | (cq << 16))
                } else {
                    0
                };
                self.respond(cid, r, Status::SUCCESS);
                Ok(())
            }
            // Get Features, Keep Alive.
            0x0a | 0x18 => {
                self.respond(cid, 0, Status::SUCCESS);
                Ok(())
            }
            // Asynchronous Event Request: held (nothing ever happens).
            0x0c => Ok(()),
            _ => {
                self.respond(cid, 0, Status::INVALID_OPCODE);
                Ok(())
            }
        }
    }
}

/// The namespace's NGUID.
const NGUID: [u8; 16] = *b"ironsan-nullns01";

fn write_all_vectored(s: &mut TcpStream, iov: &[IoSlice<'_>; 4]) -> std::io::Result<()> {
    let mut bufs = *iov;
    let mut v = &mut bufs[..];
    while !v.is_empty() {
        let n = s.write_vectored(v)?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut v, n);
    }
    Ok(())
}
