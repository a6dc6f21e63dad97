//! End-to-end tests of the target over loopback with a minimal blocking
//! initiator written against `iscsi-wire`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::BytesMut;
use iscsi_wire::frame::{frame_len, split_pdu, FrameLimits, RawPdu};
use iscsi_wire::pdu::*;
use iscsi_wire::{text, Sn};
use target::{Config, Server};

const IQN: &str = "iqn.2026-11.io.ironsan:e2e";

fn config(luns: &str, extra: &str) -> Config {
    let text = format!(
        "listen = [\"127.0.0.1:0\", \"127.0.0.1:0\"]\n{extra}\n[[target]]\nname = \"{IQN}\"\n{luns}"
    );
    Config::from_toml(&text).unwrap()
}

/// Starts a server on a runtime of its own; returns its portals and a
/// handle that stops it when dropped.
fn start(cfg: Config) -> (Vec<SocketAddr>, Stopper) {
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
            tx.send(s.local_addrs()).unwrap();
            s.run(async move {
                let _ = stop_rx.await;
            })
            .await;
        });
    });
    (rx.recv().unwrap(), Stopper(Some(stop_tx), Some(th)))
}

struct Stopper(
    Option<tokio::sync::oneshot::Sender<()>>,
    Option<std::thread::JoinHandle<()>>,
);
impl Drop for Stopper {
    fn drop(&mut self) {
        let _ = self.0.take().unwrap().send(());
        self.1.take().unwrap().join().unwrap();
    }
}

struct Client {
    s: TcpStream,
    buf: BytesMut,
    cmd_sn: Sn,
    stat_sn: Sn,
    itt: u32,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        Client {
            s,
            buf: BytesMut::new(),
            cmd_sn: Sn(77),
            stat_sn: Sn(0),
            itt: 1,
        }
    }

    fn send(&mut self, bhs: Bhs, data: &[u8]) {
        let mut v = bhs.to_vec();
        v.extend_from_slice(data);
        v.resize(v.len() + iscsi_wire::digest::pad_len(data.len()), 0);
        self.s.write_all(&v).unwrap();
    }

    fn recv(&mut self) -> Option<RawPdu> {
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

    fn login(&mut self, isid: [u8; 6], keys: &[(&str, &str)]) -> LoginResp {
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

    fn login_normal(&mut self, isid: [u8; 6], extra: &[(&str, &str)]) {
        let mut keys = vec![
            ("InitiatorName", "iqn.2026-11.test:e2e"),
            ("TargetName", IQN),
            ("SessionType", "Normal"),
        ];
        keys.extend_from_slice(extra);
        let r = self.login(isid, &keys);
        assert_eq!((r.status_class, r.status_detail), (0, 0));
        assert!(r.transit && r.nsg == 3);
        assert_ne!(r.tsih, 0);
    }

    /// Runs a command; returns (status, data-in, sense).
    fn command(
        &mut self,
        cdb: &[u8],
        edtl: u32,
        read: bool,
        data: &[u8],
        immediate: usize,
    ) -> (u8, Vec<u8>, Vec<u8>) {
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        let itt = Itt(self.itt);
        self.itt += 1;
        let imm = &data[..immediate.min(data.len())];
        let cmd = ScsiCommand {
            immediate: false,
            final_: true,
            read,
            write: !data.is_empty(),
            attr: 1,
            lun: Lun::from_index(0),
            itt,
            edtl,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.stat_sn,
            cdb: c,
        };
        self.cmd_sn = self.cmd_sn.next();
        self.send(cmd.encode(imm.len()), imm);
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
                            lun: Lun::from_index(0),
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

fn rw10(op: u8, lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![op, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

#[test]
fn login_write_read_report_luns() {
    let (addrs, _stop) = start(config("[[target.lun]]\nbackend = \"mem\"\nsize = \"16M\"\n[[target.lun]]\nbackend = \"null\"\nsize = \"1G\"", ""));
    let mut c = Client::connect(addrs[0]);
    c.login_normal([0x80, 0, 0, 0, 0, 1], &[]);
    let (st, _, _) = c.command(&[0; 6], 0, false, &[], 0);
    assert_eq!(st, 0, "TEST UNIT READY");
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    let (st, _, sense) = c.command(
        &rw10(0x2a, 100, 128),
        data.len() as u32,
        false,
        &data,
        data.len(),
    );
    assert_eq!(st, 0, "WRITE(10) {sense:02x?}");
    let (st, back, _) = c.command(&rw10(0x28, 100, 128), data.len() as u32, true, &[], 0);
    assert_eq!(st, 0);
    assert_eq!(back, data);
    let (st, luns, _) = c.command(&[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], 256, true, &[], 0);
    assert_eq!(st, 0);
    assert_eq!(&luns[..4], &16u32.to_be_bytes());
    assert_eq!(&luns[16..24], &Lun::from_index(1).0);
    // Past the end: CHECK CONDITION, ILLEGAL REQUEST, LBA OUT OF RANGE.
    let (st, _, sense) = c.command(&rw10(0x28, 32767, 2), 1024, true, &[], 0);
    assert_eq!(st, 2);
    assert_eq!((sense[2] & 0xf, sense[12]), (5, 0x21));
}

#[test]
fn writes_solicited_by_r2t_and_digests_off_by_choice() {
    let (addrs, _stop) = start(config(
        "[[target.lun]]\nbackend = \"mem\"\nsize = \"16M\"",
        "",
    ));
    let mut c = Client::connect(addrs[1]);
    c.login_normal(
        [0x80, 0, 0, 0, 0, 2],
        &[
            ("ImmediateData", "No"),
            ("InitialR2T", "Yes"),
            ("MaxBurstLength", "65536"),
        ],
    );
    let data: Vec<u8> = (0..1024 * 1024u32).map(|i| (i % 253) as u8).collect();
    let (st, _, _) = c.command(&rw10(0x2a, 0, 2048), data.len() as u32, false, &data, 0);
    assert_eq!(st, 0);
    let (st, back, _) = c.command(&rw10(0x28, 0, 2048), data.len() as u32, true, &[], 0);
    assert_eq!(st, 0);
    assert!(back == data);
}

#[test]
fn discovery_lists_both_portals() {
    let (addrs, _stop) = start(config(
        "[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"",
        "",
    ));
    let mut c = Client::connect(addrs[0]);
    let r = c.login(
        [0x80, 0, 0, 0, 0, 3],
        &[
            ("InitiatorName", "iqn.2026-11.test:e2e"),
            ("SessionType", "Discovery"),
        ],
    );
    assert_eq!(r.status_class, 0);
    let t = TextReq {
        immediate: true,
        final_: true,
        cont: false,
        lun: Lun::default(),
        itt: Itt(9),
        ttt: RESERVED_TAG,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.stat_sn,
    };
    c.send(t.encode(16), b"SendTargets=All\0");
    let resp = c.recv().unwrap();
    let pairs = text::parse(&resp.data).unwrap();
    assert_eq!(pairs[0], ("TargetName".to_string(), IQN.to_string()));
    for (i, a) in addrs.iter().enumerate() {
        assert!(
            pairs.contains(&("TargetAddress".to_string(), format!("{a},{}", i + 1))),
            "{pairs:?}"
        );
    }
}

#[test]
fn login_failures_and_reinstatement() {
    let (addrs, _stop) = start(config(
        "[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"",
        "",
    ));
    let mut c = Client::connect(addrs[0]);
    let r = c.login(
        [0x80, 0, 0, 0, 0, 4],
        &[("InitiatorName", "iqn.x"), ("TargetName", "iqn.nope")],
    );
    assert_eq!((r.status_class, r.status_detail), (2, 3));
    assert!(c.recv().is_none(), "connection closed after a failed login");

    let mut a = Client::connect(addrs[0]);
    a.login_normal([0x80, 0, 0, 0, 0, 5], &[]);
    let mut b = Client::connect(addrs[1]);
    b.login_normal([0x80, 0, 0, 0, 0, 5], &[]);
    // The first session was replaced: its connection is closed.
    assert!(a.recv().is_none());
    let (st, _, _) = b.command(&[0; 6], 0, false, &[], 0);
    assert_eq!(st, 0);
}

#[test]
fn file_lun_write_through_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lun.img");
    let luns = format!(
        "[[target.lun]]\nbackend = \"file\"\npath = \"{}\"\nsize = \"8M\"",
        path.display()
    );
    let data = vec![0x5au8; 8192];
    {
        let (addrs, _stop) = start(config(&luns, ""));
        let mut c = Client::connect(addrs[0]);
        c.login_normal([0x80, 0, 0, 0, 0, 6], &[]);
        let (st, _, _) = c.command(&rw10(0x2a, 8, 16), 8192, false, &data, 8192);
        assert_eq!(st, 0);
    }
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(&on_disk[4096..4096 + 8192], &data[..]);
    let (addrs, _stop) = start(config(&luns, ""));
    let mut c = Client::connect(addrs[0]);
    c.login_normal([0x80, 0, 0, 0, 0, 7], &[]);
    let (st, back, _) = c.command(&rw10(0x28, 8, 16), 8192, true, &[], 0);
    assert_eq!(st, 0);
    assert_eq!(back, data);
}
