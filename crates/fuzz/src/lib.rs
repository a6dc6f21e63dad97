//! Fuzz target bodies. Each takes arbitrary bytes and must neither panic
//! nor allocate beyond the protocol's bounds, whatever the input.
//!
//! * [`pdu`]: framing (`frame_len`, `split_pdu`) and `Pdu::parse` under
//!   every combination of digests and segment limits.
//! * [`text`]: the key=value codec and C-bit continuation.
//! * [`cdb`]: `scsi::LogicalUnit::execute` on a RAM LU with an arbitrary
//!   CDB and data-out.
//! * [`login_session`]: the target's login state machine (with CHAP) and
//!   then the full feature phase, fed an arbitrary byte stream framed as
//!   the driver frames it.
//! * [`nvme_tcp`]: NVMe/TCP framing (`nvme_tcp_wire::frame`) and header
//!   decoding under every combination of digests, data alignment and data
//!   limit.
//! * [`nvme_controller`]: an NVMe/TCP connection as the server drives it
//!   (`nvme::Queue`, Connect through `nvme::Registry`, admin commands,
//!   NVM commands on a RAM namespace), fed an arbitrary byte stream.
//!
//! The libFuzzer targets in `fuzz/fuzz_targets/` call these; the runner in
//! `src/main.rs` drives them on the stable toolchain from the seed corpora
//! in `fuzz/corpus/<target>/`.

use bufpool::WriteData;
use std::sync::Arc;

pub mod seeds;

use bytes::{Bytes, BytesMut};
use iscsi_proto::chap::{ChapPolicy, Credential};
use iscsi_proto::login::{LoginStep, TargetDirectory, TargetInfo, TargetLogin};
use iscsi_proto::params::Limits;
use iscsi_proto::session::{Completion, Event, Host, Session, TmfAction};
use iscsi_wire::frame::{frame_len, split_pdu, FrameLimits};
use iscsi_wire::pdu::{opcode, LoginReq, Lun, Opcode, Pdu};
use iscsi_wire::Outbox;

/// A fuzz target body.
pub type Target = fn(&[u8]);

/// The fuzz targets by name.
pub const TARGETS: &[(&str, Target)] = &[
    ("pdu", pdu),
    ("text", text),
    ("cdb", cdb),
    ("login_session", login_session),
    ("nvme_tcp", nvme_tcp),
    ("nvme_controller", nvme_controller),
];

/// The namespaces of [`nvme_controller`]: one RAM volume.
struct OneNamespace(Arc<volume::Volume>);

impl nvme::Namespaces for OneNamespace {
    fn active(&self) -> Vec<u32> {
        vec![1]
    }
    fn volume(&self, nsid: u32) -> Option<Arc<volume::Volume>> {
        (nsid == 1).then(|| self.0.clone())
    }
    fn generation(&self) -> u64 {
        0
    }
}

/// The subsystem NQN [`nvme_controller`] serves.
pub const FUZZ_NQN: &str = "nqn.2026-12.io.ironsan:fuzz";
/// The host of [`nvme_controller`]'s controller 1.
pub const FUZZ_HOST: &str = "nqn.2026-12.io.ironsan:fuzz-host";

/// One NVMe/TCP connection driven as the server drives it: bytes framed
/// and received by an `nvme::Queue`, its first command a Connect, then
/// admin commands (queue 0) or NVM commands on a 1 MiB RAM namespace,
/// every reply completed into the queue's outbox (drained as it goes).
pub fn nvme_controller(data: &[u8]) {
    use nvme::admin::{self, Context, Outcome};
    use nvme::ctrl::ConnectCmd;
    use nvme_tcp_wire::capsule::{fctype, ConnectData, Status, OPC_FABRICS};
    let vol = volume::Volume::new(
        Arc::new(storage::MemBackend::new(1 << 20)),
        512,
        None,
        false,
        true,
    )
    .expect("a valid geometry");
    let registry = nvme::Registry::new();
    registry.add(Arc::new(nvme::Subsystem::new(
        FUZZ_NQN.into(),
        Arc::new(OneNamespace(Arc::new(vol))),
        Vec::new(),
        None,
    )));
    let ports = [nvme::Port {
        id: 1,
        addr: "127.0.0.1:4420".parse().expect("an address"),
    }];
    // A controller for I/O queues to join (CNTLID 1, the seeds' host).
    let admin = registry
        .connect(
            &ConnectCmd {
                recfmt: 0,
                qid: 0,
                sqsize: 31,
                cattr: 0,
                kato_ms: 0,
            },
            &ConnectData {
                host_id: [0; 16],
                cntlid: 0xffff,
                subnqn: FUZZ_NQN.into(),
                hostnqn: FUZZ_HOST.into(),
            },
            1,
        )
        .expect("the first controller");
    admin
        .property_set(0x14, false, 1 | (6 << 16) | (4 << 20))
        .expect("CC");
    admin.grant_queues(3, 3);
    let mut q = nvme::Queue::new(1 << 20);
    let mut ctrl = None;
    let mut buf = BytesMut::from(data);
    let mut held = 0;
    while let Ok(Some(f)) = q.frame(&buf) {
        assert!(f.len <= buf.len());
        // As the server's driver does (the capsules without data are read
        // in place).
        let cmd = match q.receive_from(&mut buf, &f) {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(_) => break,
        };
        let cid = cmd.sqe.cid();
        let Some(c) = ctrl.clone() else {
            if cmd.sqe.opcode() == OPC_FABRICS && cmd.sqe.fctype() == fctype::CONNECT {
                let cc = ConnectCmd::decode(&cmd.sqe);
                if let Ok(d) = ConnectData::decode(&cmd.data.to_vec()) {
                    if let Ok(c) = registry.connect(&cc, &d, 1) {
                        q.connected(cc.qid, cc.sqsize.saturating_add(1), cc.sqflow_disabled());
                        ctrl = Some(c);
                    }
                }
            }
            q.complete(cid, Status::SUCCESS, 0, bufpool::Chain::new());
            continue;
        };
        if q.qid == 0 {
            let cx = Context {
                registry: &registry,
                ports: &ports,
                aers_held: held,
            };
            match admin::execute(&c, &cx, &cmd.sqe) {
                Outcome::Reply(r) => q.complete(cid, r.status, r.result, r.data),
                Outcome::Held => held += 1,
            }
        } else if let Some(v) = c.subsystem.namespaces.volume(cmd.sqe.nsid()) {
            let r = nvme::nvm::execute(&v, &cmd.sqe, cmd.data, cmd.owned);
            q.complete(cid, r.status, r.result, r.data);
        }
        let sent = q.out.to_vec().len();
        q.out.advance(sent);
    }
}

/// NVMe/TCP framing of one receive buffer: the first byte picks the
/// negotiated digests (bits 0, 1), the data alignment (bits 2-3: 4 to 32
/// bytes) and the data limit (bit 4: 4 KiB, else 128 KiB).
pub fn nvme_tcp(data: &[u8]) {
    use nvme_tcp_wire::{data_digest_ok, frame, DataHeader, Ic, Negotiated, PduType, IC_LEN};
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let n = Negotiated {
        header_digest: flags & 1 != 0,
        data_digest: flags & 2 != 0,
        alignment: 4 << ((flags >> 2) & 3),
        max_data: if flags & 16 != 0 { 4096 } else { 128 << 10 },
    };
    let mut at = 0;
    while let Ok(Some(f)) = frame(&rest[at..], &n) {
        assert!(
            f.len >= 24 && f.len <= rest.len() - at,
            "a frame within the buffer"
        );
        assert!(f.data.start <= f.data.end && f.data.end <= f.len);
        assert!(f.data.len() <= (n.max_data as usize).max(128));
        let b = &rest[at..at + f.len];
        let _ = data_digest_ok(b, &f);
        match f.ch.pdu_type {
            PduType::IcReq | PduType::IcResp => {
                let _ = Ic::decode(b[..IC_LEN].try_into().expect("128 bytes"));
            }
            PduType::H2cData | PduType::C2hData | PduType::R2t => {
                let _ = DataHeader::decode(b);
            }
            _ => {}
        }
        at += f.len;
    }
}

/// Framing and decoding of one receive buffer.
pub fn pdu(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let lim = FrameLimits {
        header_digest: flags & 1 != 0,
        data_digest: flags & 2 != 0,
        max_data_segment: if flags & 4 != 0 { 8192 } else { 1 << 20 },
    };
    let mut buf = BytesMut::from(rest);
    while let Ok(Some(n)) = frame_len(&buf, &lim) {
        assert!(n <= buf.len());
        match split_pdu(&mut buf, n, &lim) {
            Ok(raw) => {
                assert!(raw.data.len() <= lim.max_data_segment as usize);
                let _ = Pdu::parse(&raw.bhs);
                let _ = opcode(&raw.bhs);
            }
            Err(_) => return,
        }
    }
}

/// The text codec: parse, continuation, chunking.
pub fn text(data: &[u8]) {
    if let Ok(pairs) = iscsi_wire::text::parse(data) {
        let enc = iscsi_wire::text::encode(&pairs);
        assert_eq!(iscsi_wire::text::parse(&enc).as_ref(), Ok(&pairs));
    }
    let mut c = iscsi_wire::text::Continuation::default();
    for (i, piece) in data.chunks(97).enumerate() {
        let _ = c.push(piece, i % 3 != 2);
    }
    let max = usize::from(data.first().copied().unwrap_or(1)).max(1);
    let joined: Vec<u8> = iscsi_wire::text::chunks(data, max)
        .flatten()
        .copied()
        .collect();
    assert_eq!(joined, data);
    for (_, v) in iscsi_wire::text::parse(data).unwrap_or_default() {
        let _ = iscsi_proto::chap::decode_binary(&v);
        let _ = iscsi_proto::chap::parse_id(&v);
    }
}

const BS: u32 = 512;
const BLOCKS: u64 = 2048;

fn lu_config() -> scsi::LuConfig {
    scsi::LuConfig {
        block_size: BS,
        physical_block_size: None,
        naa: [0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
        serial: "FUZZ0001".into(),
        vendor: "IRONSAN".into(),
        product: "fuzz".into(),
        revision: "0.1".into(),
        read_only: false,
        thin: true,
        pr_state: None,
    }
}

fn new_lu() -> scsi::LogicalUnit {
    let b = Arc::new(storage::MemBackend::new(BLOCKS * u64::from(BS)));
    scsi::LogicalUnit::new(b, lu_config()).expect("valid LU config")
}

fn run_cdb(lu: &scsi::LogicalUnit, cdb: &[u8], data_out: &WriteData, nexus: u64) -> Completion {
    let plan = lu.plan(cdb);
    let total = data_out.len();
    let o = lu.execute(&scsi::Command {
        cdb,
        data_out,
        nexus: scsi::NexusId(nexus),
        relative_port: 1,
        tpg: 1,
        target_port_name: "iqn.2026-11.io.ironsan:fuzz,t,0x0001",
        initiator_port_name: "iqn.2026-11.io.ironsan:i,i,0x800000000001",
        expected_data_out: Some(total as u32),
        lus: None,
    });
    Completion {
        status: o.status,
        sense: o.sense.map(|s| Bytes::from(s.to_bytes())),
        data_in: bufpool::Chain::from_parts(o.data, o.more),
        data_out_wanted: plan.data_out,
    }
}

/// One CDB (first byte: its length, 6..=32) with the rest as data-out,
/// twice over the same LU (state carries over: reservations, UAs).
pub fn cdb(data: &[u8]) {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = (usize::from(n) % 27 + 6).min(rest.len());
    let (c, dout) = rest.split_at(n);
    if c.is_empty() {
        return;
    }
    let lu = new_lu();
    // The second run gets the data-out in segments, as large Data-Out PDUs
    // arrive, so the segmented paths see the same hostile input.
    let cut = dout.len() / 3;
    let whole = WriteData::Owned(Bytes::copy_from_slice(dout));
    let mut parts = bufpool::Chain::new();
    for (from, to) in [(0, cut), (cut, 2 * cut), (2 * cut, dout.len())] {
        parts.push(Bytes::copy_from_slice(&dout[from..to]));
    }
    let parts = WriteData::from(parts);
    for (nexus, data) in [(1, &whole), (2, &parts)] {
        let r = run_cdb(&lu, c, data, nexus);
        if r.status == 0 {
            assert!(r.sense.is_none());
        }
    }
}

struct Fixture {
    lu: scsi::LogicalUnit,
}

impl TargetDirectory for Fixture {
    fn find(&self, name: &str, _i: &str) -> Option<TargetInfo> {
        (name == "iqn.t" || name == "iqn.c").then(|| TargetInfo {
            name: name.into(),
            alias: Some("fuzz".into()),
            tpgt: 1,
        })
    }
    fn authorize(&self, _name: &str, initiator: &str) -> bool {
        initiator != "iqn.denied"
    }
    fn chap(&self, target: Option<&str>) -> ChapPolicy {
        if target == Some("iqn.c") {
            ChapPolicy {
                initiator: Some(Credential::new("user", b"initiator-secret")),
                target: Some(Credential::new("tgt", b"target-secret-1")),
            }
        } else {
            ChapPolicy::default()
        }
    }
}

impl Host for Fixture {
    fn send_targets(&self, _i: &str, v: &str, s: Option<&str>) -> Vec<u8> {
        let l = iscsi_proto::discovery::Listing {
            name: "iqn.t".into(),
            portals: vec![("127.0.0.1:3260".parse().expect("address"), 1)],
        };
        iscsi_proto::discovery::send_targets(&[l], v, s)
    }
    fn lun_exists(&self, lun: Lun) -> bool {
        lun.index() == Some(0)
    }
    fn data_out_len(&self, lun: Lun, cdb: &[u8]) -> u32 {
        if self.lun_exists(lun) {
            self.lu.plan(cdb).data_out
        } else {
            0
        }
    }
    fn reset(&self, _a: TmfAction) {
        self.lu.reset();
    }
}

/// A byte stream from an initiator: login (CHAP for `iqn.c`), then the full
/// feature phase, framed as the driver frames it.
pub fn login_session(data: &[u8]) {
    let _ = drive_session(data);
}

/// [`login_session`]'s body: the number of full feature phase PDUs
/// handled, or `None` when the login did not complete.
pub fn drive_session(data: &[u8]) -> Option<u32> {
    let fx = Fixture { lu: new_lu() };
    let limits = Limits {
        queue_depth: 16,
        max_transfer: 1 << 20,
        ..Limits::default()
    };
    let mut buf = BytesMut::from(data);
    let mut login = TargetLogin::new(limits.clone(), 1);
    login.seed_challenge(7, *b"fuzz-challenge-0");
    let lim = FrameLimits::LOGIN;
    let mut session = loop {
        let Ok(Some(n)) = frame_len(&buf, &lim) else {
            return None;
        };
        let Ok(raw) = split_pdu(&mut buf, n, &lim) else {
            return None;
        };
        if opcode(&raw.bhs) != Opcode::LoginReq {
            return None;
        }
        match login.handle(&LoginReq::decode(&raw.bhs), &raw.data, &fx) {
            LoginStep::Continue { .. } => {}
            LoginStep::Fail { .. } => return None,
            LoginStep::Complete { outcome, .. } => {
                break Session::new(
                    outcome.params,
                    limits.clone(),
                    outcome.exp_cmd_sn,
                    outcome.next_stat_sn,
                )
            }
        }
    };
    let p = session.params().clone();
    let lim = FrameLimits {
        header_digest: p.header_digest,
        data_digest: p.data_digest,
        max_data_segment: p.recv_max_data_segment,
    };
    let mut out = Outbox::new();
    let mut events = Vec::new();
    let mut pending = Vec::new();
    let mut handled = 0;
    for round in 0.. {
        let Ok(Some(n)) = frame_len(&buf, &lim) else {
            break;
        };
        let Ok(raw) = split_pdu(&mut buf, n, &lim) else {
            break;
        };
        session.handle_pdu(raw, &fx, &mut out, &mut events);
        handled += 1;
        for ev in events.drain(..) {
            match ev {
                Event::Execute(req) => pending.push(req),
                Event::Logout | Event::Close(_) => return Some(handled),
                Event::TaskManagement { .. } => {}
            }
        }
        // Complete some commands now and some later, out of order.
        if round % 2 == 1 {
            while let Some(req) = pending.pop() {
                let c = if req.lun.index() == Some(0) {
                    run_cdb(&fx.lu, req.cdb.as_slice(), &req.data_out, 1)
                } else {
                    Completion::default()
                };
                session.complete(req.itt, c, &mut out);
            }
        }
        if session.in_flight() == 0 && round % 3 == 0 {
            session.ping(&mut out);
        }
        // The outbox is drained as a socket would.
        let n = out.len();
        out.advance(n);
    }
    for req in pending {
        session.complete(req.itt, Completion::default(), &mut out);
    }
    Some(handled)
}
