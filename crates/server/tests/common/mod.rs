//! A minimal blocking raw-socket initiator and a server harness shared by
//! the end-to-end, hostile-input, limits and fault tests, with raw-PDU
//! helpers for sending what a well-behaved initiator would not.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::BytesMut;
use iscsi_wire::frame::{frame_len, split_pdu, FrameLimits, RawPdu};
use iscsi_wire::pdu::*;
use iscsi_wire::{text, Sn};
use server::{Config, Server};

pub const IQN: &str = "iqn.2026-11.io.ironsan:e2e";

pub fn config(luns: &str, extra: &str) -> Config {
    let text = format!(
        "listen = [\"127.0.0.1:0\", \"127.0.0.1:0\"]\n{extra}\n[[target]]\nname = \"{IQN}\"\n{luns}"
    );
    Config::from_toml(&text).unwrap()
}

/// Starts a server on a runtime of its own; returns its portals and a
/// handle that stops it when dropped.
pub fn start(cfg: Config) -> (Vec<SocketAddr>, Stopper) {
    let (addrs, _, stop) = start_both(cfg);
    (addrs, stop)
}

/// [`start`], returning the NVMe/TCP ports too.
pub fn start_both(cfg: Config) -> (Vec<SocketAddr>, Vec<SocketAddr>, Stopper) {
    let (a, n, _, stop) = start_controlled(cfg);
    (a, n, stop)
}

/// [`start_both`], returning the server's control handle too (what the
/// admin API drives).
#[allow(dead_code)]
pub fn start_controlled(
    cfg: Config,
) -> (
    Vec<SocketAddr>,
    Vec<SocketAddr>,
    server::control::Control,
    Stopper,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let th = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let s = Server::bind(cfg).await.unwrap();
            tx.send((s.local_addrs(), s.nvme_addrs(), s.control()))
                .unwrap();
            s.run(async move {
                let _ = stop_rx.await;
            })
            .await;
        });
    });
    let (a, n, c) = rx.recv().unwrap();
    (a, n, c, Stopper(Some(stop_tx), Some(th)))
}

pub struct Stopper(
    Option<tokio::sync::oneshot::Sender<()>>,
    Option<std::thread::JoinHandle<()>>,
);
impl Drop for Stopper {
    fn drop(&mut self) {
        let _ = self.0.take().unwrap().send(());
        self.1.take().unwrap().join().unwrap();
    }
}

pub struct Client {
    pub s: TcpStream,
    pub buf: BytesMut,
    pub cmd_sn: Sn,
    pub stat_sn: Sn,
    pub itt: u32,
    /// The LUN commands go to.
    pub lun: u16,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        Client {
            s,
            buf: BytesMut::new(),
            cmd_sn: Sn(77),
            stat_sn: Sn(0),
            itt: 1,
            lun: 0,
        }
    }

    pub fn send(&mut self, bhs: Bhs, data: &[u8]) {
        let mut v = bhs.to_vec();
        v.extend_from_slice(data);
        v.resize(v.len() + iscsi_wire::digest::pad_len(data.len()), 0);
        self.s.write_all(&v).unwrap();
    }

    pub fn recv(&mut self) -> Option<RawPdu> {
        let lim = FrameLimits {
            header_digest: false,
            data_digest: false,
            max_data_segment: 1 << 24,
        };
        loop {
            if let Some(n) = frame_len(&self.buf, &lim).unwrap() {
                return Some(split_pdu(&mut self.buf, n, &lim).unwrap());
            }
            let mut tmp = [0u8; 65536];
            match self.s.read(&mut tmp) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
            }
        }
    }

    pub fn login(&mut self, isid: [u8; 6], keys: &[(&str, &str)]) -> LoginResp {
        let req = LoginReq {
            transit: true,
            cont: false,
            csg: 1,
            nsg: 3,
            version_max: 0,
            version_min: 0,
            isid,
            tsih: 0,
            itt: Itt(0),
            cid: 0,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: Sn(0),
        };
        let body = text::encode(keys);
        self.send(req.encode(body.len()), &body);
        let r = self.recv().expect("login response");
        let resp = LoginResp::decode(&r.bhs);
        self.stat_sn = resp.sn.stat_sn.next();
        resp
    }

    pub fn login_normal(&mut self, isid: [u8; 6], extra: &[(&str, &str)]) {
        let mut keys = vec![
            ("InitiatorName", "iqn.2026-11.test:e2e"),
            ("TargetName", IQN),
            ("SessionType", "Normal"),
        ];
        keys.extend_from_slice(extra);
        let r = self.login(isid, &keys);
        assert_eq!(r.status, iscsi_wire::pdu::LoginStatus::new(0, 0));
        assert!(r.transit && r.nsg == 3);
        assert_ne!(r.tsih, 0);
    }

    /// Runs a command; returns (status, data-in, sense).
    pub fn command(
        &mut self,
        cdb: &[u8],
        edtl: u32,
        read: bool,
        data: &[u8],
        immediate: usize,
    ) -> (u8, Vec<u8>, Vec<u8>) {
        let imm = &data[..immediate.min(data.len())];
        let itt = self.cmd(cdb, edtl, read, !data.is_empty(), true, imm);
        let mut din = Vec::new();
        loop {
            let r = self.recv().expect("response");
            match Pdu::parse(&r.bhs) {
                Pdu::DataIn(d) => {
                    assert_eq!(d.itt, itt);
                    assert_eq!(d.buffer_offset as usize, din.len());
                    din.extend_from_slice(&r.data);
                    if let Some(st) = d.status {
                        self.stat_sn = d.sn.stat_sn.next();
                        return (st, din, Vec::new());
                    }
                }
                Pdu::R2t(t) => {
                    let mut off = t.buffer_offset as usize;
                    let end = off + t.desired_len as usize;
                    let mut sn = 0;
                    while off < end {
                        let n = (end - off).min(8192);
                        let d = DataOut {
                            final_: off + n == end,
                            lun: Lun::from_index(self.lun),
                            itt,
                            ttt: t.ttt,
                            exp_stat_sn: self.stat_sn,
                            data_sn: sn,
                            buffer_offset: off as u32,
                        };
                        self.send(d.encode(n), &data[off..off + n]);
                        sn += 1;
                        off += n;
                    }
                }
                Pdu::ScsiResponse(s) => {
                    assert_eq!(s.itt, itt);
                    self.stat_sn = s.sn.stat_sn.next();
                    let sense = if r.data.len() > 2 {
                        r.data[2..].to_vec()
                    } else {
                        Vec::new()
                    };
                    return (s.status, din, sense);
                }
                Pdu::NopIn(_) => {}
                p => panic!("unexpected {p:?}"),
            }
        }
    }
}

pub fn rw10(op: u8, lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![op, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

impl Client {
    /// Writes raw bytes; false when the connection is gone.
    pub fn raw(&mut self, b: &[u8]) -> bool {
        self.s.write_all(b).is_ok()
    }

    /// The next PDU within `t`, or None on timeout or close.
    pub fn recv_within(&mut self, t: Duration) -> Option<RawPdu> {
        self.s.set_read_timeout(Some(t)).unwrap();
        let r = self.recv();
        self.s
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        r
    }

    /// True when the target closes the connection within `t` (PDUs sent
    /// before closing are skipped).
    pub fn closed_within(&mut self, t: Duration) -> bool {
        let end = std::time::Instant::now() + t;
        let mut tmp = [0u8; 65536];
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            self.s.set_read_timeout(Some(left)).unwrap();
            match self.s.read(&mut tmp) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    return false
                }
                Err(_) => return true,
            }
        }
    }

    /// A SCSI Command PDU with every field chosen by the caller.
    #[allow(clippy::too_many_arguments)]
    pub fn cmd(
        &mut self,
        cdb: &[u8],
        edtl: u32,
        read: bool,
        write: bool,
        final_: bool,
        imm: &[u8],
    ) -> Itt {
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        let itt = Itt(self.itt);
        self.itt += 1;
        let cmd = ScsiCommand {
            immediate: false,
            final_,
            read,
            write,
            attr: TaskAttr::Simple,
            lun: Lun::from_index(self.lun),
            itt,
            edtl,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.stat_sn,
            cdb: c,
        };
        self.cmd_sn = self.cmd_sn.next();
        self.send(cmd.encode(imm.len()), imm);
        itt
    }

    pub fn data_out(
        &mut self,
        itt: Itt,
        ttt: u32,
        data_sn: u32,
        offset: u32,
        final_: bool,
        data: &[u8],
    ) {
        let d = DataOut {
            final_,
            lun: Lun::from_index(self.lun),
            itt,
            ttt,
            exp_stat_sn: self.stat_sn,
            data_sn,
            buffer_offset: offset,
        };
        self.send(d.encode(data.len()), data);
    }

    /// Reads PDUs until the status of `itt` (SCSI Response or Data-In with
    /// status); returns (status, sense) or None if the connection closed.
    /// Rejects and R2Ts on the way are collected in `seen`.
    pub fn status_of(&mut self, itt: Itt, seen: &mut Vec<Pdu>) -> Option<(u8, Vec<u8>)> {
        loop {
            let r = self.recv()?;
            let p = Pdu::parse(&r.bhs);
            match &p {
                Pdu::ScsiResponse(s) if s.itt == itt => {
                    self.stat_sn = s.sn.stat_sn.next();
                    let sense = if r.data.len() > 2 {
                        r.data[2..].to_vec()
                    } else {
                        Vec::new()
                    };
                    return Some((s.status, sense));
                }
                Pdu::DataIn(d) if d.itt == itt && d.status.is_some() => {
                    self.stat_sn = d.sn.stat_sn.next();
                    return Some((d.status.unwrap(), Vec::new()));
                }
                _ => seen.push(p),
            }
        }
    }

    /// A NOP-Out ping answered by a NOP-In: the session is alive.
    pub fn ping(&mut self) -> bool {
        let itt = Itt(self.itt);
        self.itt += 1;
        let n = NopOut {
            immediate: true,
            lun: Lun::default(),
            itt,
            ttt: RESERVED_TAG,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.stat_sn,
        };
        self.send(n.encode(0), &[]);
        loop {
            let Some(r) = self.recv() else { return false };
            if let Pdu::NopIn(n) = Pdu::parse(&r.bhs) {
                if n.itt == itt {
                    return true;
                }
            }
        }
    }
}

/// A fresh session writes 4 KiB and reads it back: the target still
/// serves others.
pub fn sanity(addr: SocketAddr, tag: u8) {
    let mut c = Client::connect(addr);
    c.login_normal([0x80, 0, 0, 0, 0x77, tag], &[]);
    let data = vec![tag; 4096];
    let (st, _, sense) = c.command(&rw10(0x2a, 8 * u32::from(tag), 8), 4096, false, &data, 4096);
    assert_eq!(st, 0, "sanity write {sense:02x?}");
    let (st, back, _) = c.command(&rw10(0x28, 8 * u32::from(tag), 8), 4096, true, &[], 0);
    assert_eq!(st, 0);
    assert!(back == data, "sanity read back differs");
}
