//! The admin command set a host needs of a fabrics controller (NVM Express
//! Base Specification 2.0, "Admin Command Set": Identify, Get Log Page,
//! Get/Set Features, Keep Alive, Asynchronous Event Request, Abort) and the
//! Fabrics commands on the admin queue (NVMe over Fabrics 1.1, "Property
//! Get", "Property Set"), with the discovery controller's Discovery log
//! page ("Discovery Log Page"). Unsupported commands get Invalid Command
//! Opcode, unsupported fields Invalid Field in Command.
//!
//! The identity of a namespace is its volume's: the NGUID is the 16-byte
//! NAA designator the SCSI personality reports in VPD page 83h, so a host
//! that sees the volume through both protocols can tell it is one.

use std::net::SocketAddr;
use std::sync::Arc;

use bufpool::Chain;
use nvme_tcp_wire::capsule::{fctype, Sqe, Status, OPC_FABRICS};
use volume::access::AccessState;
use volume::Volume;

use crate::ctrl::{Controller, Registry, DISCOVERY_NQN, MAX_ADMIN_ENTRIES, MAX_QUEUE_ENTRIES};
use crate::queue::IO_IN_CAPSULE;

/// Admin opcodes.
pub mod opc {
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0a;
    pub const ASYNC_EVENT: u8 = 0x0c;
    pub const KEEP_ALIVE: u8 = 0x18;
}

/// MDTS: 2^11 × 4 KiB = `volume::MAX_TRANSFER_BYTES` (8 MiB).
pub const MDTS: u8 = 11;
/// The highest NSID (LUN 255 + 1).
pub const MAX_NSID: u32 = 256;
/// Outstanding Asynchronous Event Requests accepted (AERL + 1).
pub const MAX_AERS: usize = 4;
/// The ANA group of every namespace: their state through a controller is
/// that of the controller's port group (module docs).
pub const ANA_GROUP: u32 = 1;
/// Asynchronous Event Configuration bit: ANA change notices.
pub const AEC_ANA_CHANGE: u32 = 1 << 11;
/// Asynchronous Event Configuration bit: Namespace Attribute notices.
pub const AEC_NS_ATTR: u32 = 1 << 8;
/// The Asynchronous Event Request completion of a namespace change: type
/// notice (2h), information Namespace Attribute Changed (00h), log page
/// 04h (Changed Namespace List).
pub const AEN_NS_CHANGED: u64 = 0x02 | (0x04 << 16);
/// The Asynchronous Event Request completion of an ANA change: type notice
/// (2h), information ANA change (03h), log page 0Ch.
pub const AEN_ANA_CHANGE: u64 = 0x02 | (0x03 << 8) | (0x0c << 16);

/// The ANA state code of an ALUA access state (Base 2.0 "Asymmetric
/// Namespace Access Reporting"): optimized 01h, non-optimized 02h,
/// inaccessible 03h (standby and unavailable ports serve no I/O).
pub fn ana_code(s: AccessState) -> u8 {
    match s {
        AccessState::ActiveOptimized => 0x01,
        AccessState::ActiveNonOptimized => 0x02,
        AccessState::Standby | AccessState::Unavailable => 0x03,
    }
}

/// A command's answer: status, the result (CQE dwords 0-1) and data for
/// the host.
#[derive(Debug, Default)]
pub struct Reply {
    pub status: Status,
    pub result: u64,
    pub data: Chain,
}

impl Reply {
    pub fn status(status: Status) -> Reply {
        Reply {
            status,
            ..Reply::default()
        }
    }

    fn ok(result: u64) -> Reply {
        Reply {
            result,
            ..Reply::default()
        }
    }

    /// Success with `data`, cut to what the host's buffer holds.
    pub(crate) fn data(mut data: Vec<u8>, host_len: u32) -> Reply {
        data.resize(host_len as usize, 0);
        Reply {
            data: Chain::from(data),
            ..Reply::default()
        }
    }
}

/// What an admin command came to.
#[derive(Debug)]
pub enum Outcome {
    Reply(Reply),
    /// An Asynchronous Event Request: held until an event (or the end).
    Held,
}

/// A port a controller may be reached through (the discovery log page's
/// entries).
#[derive(Debug, Clone, Copy)]
pub struct Port {
    pub id: u16,
    pub addr: SocketAddr,
}

/// What an admin command needs besides the controller.
pub struct Context<'a> {
    pub registry: &'a Registry,
    pub ports: &'a [Port],
    /// Asynchronous Event Requests held on this admin queue.
    pub aers_held: usize,
}

/// The host's buffer length: the SGL's (data to the host).
fn host_len(sqe: &Sqe) -> u32 {
    u32::from_le_bytes(sqe.0[32..36].try_into().expect("4 bytes"))
}

/// Runs admin command `sqe` on `c` (no admin command served takes data
/// from the host).
pub fn execute(c: &Controller, cx: &Context<'_>, sqe: &Sqe) -> Outcome {
    c.alive();
    if sqe.opcode() == OPC_FABRICS {
        return Outcome::Reply(fabrics(c, sqe));
    }
    if !c.ready() {
        // Command Sequence Error: the controller is not enabled.
        return Outcome::Reply(Reply::status(Status::generic(0x0c, true)));
    }
    let r = match sqe.opcode() {
        opc::IDENTIFY => identify(c, sqe),
        opc::GET_LOG_PAGE => get_log_page(c, cx, sqe),
        opc::SET_FEATURES if !c.discovery => set_features(c, sqe),
        opc::GET_FEATURES => get_features(c, sqe),
        opc::KEEP_ALIVE => Reply::ok(0),
        opc::ASYNC_EVENT => {
            if cx.aers_held >= MAX_AERS {
                // Asynchronous Event Request Limit Exceeded.
                Reply::status(Status::specific(0x05))
            } else {
                return Outcome::Held;
            }
        }
        // Abort: the command was not aborted (bit 0 of the result); it
        // completes on its own.
        opc::ABORT if !c.discovery => Reply::ok(1),
        _ => Reply::status(Status::INVALID_OPCODE),
    };
    Outcome::Reply(r)
}

/// Property Get and Set (Connect is the driver's, before any controller).
fn fabrics(c: &Controller, sqe: &Sqe) -> Reply {
    let b = &sqe.0;
    let eight = b[40] & 7 == 1;
    let offset = u32::from_le_bytes(b[44..48].try_into().expect("4 bytes"));
    match sqe.fctype() {
        fctype::PROPERTY_GET => match c.property_get(offset, eight) {
            Ok(v) => Reply::ok(v),
            Err(s) => Reply::status(s),
        },
        fctype::PROPERTY_SET => {
            let v = u64::from_le_bytes(b[48..56].try_into().expect("8 bytes"));
            match c.property_set(offset, eight, v) {
                Ok(()) => Reply::ok(0),
                Err(s) => Reply::status(s),
            }
        }
        _ => Reply::status(Status::INVALID_OPCODE),
    }
}

/// Copies `s` space-padded into `f`.
fn ascii(f: &mut [u8], s: &str) {
    f.fill(b' ');
    let n = s.len().min(f.len());
    f[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn identify(c: &Controller, sqe: &Sqe) -> Reply {
    let cns = sqe.dw(10) as u8;
    let csi = (sqe.dw(11) >> 24) as u8;
    let nsid = sqe.nsid();
    let len = host_len(sqe).min(4096);
    let ns = &c.subsystem.namespaces;
    let valid_nsid = (1..=MAX_NSID).contains(&nsid);
    match cns {
        0x00 if c.discovery => Reply::status(Status::INVALID_FIELD),
        // NSID FFFFFFFFh: what every namespace has in common (the one LBA
        // format list is per namespace, so nothing).
        0x00 if nsid == 0xffff_ffff => Reply::data(Vec::new(), len),
        0x00 if !valid_nsid => Reply::status(Status::INVALID_NAMESPACE),
        0x00 => match ns.volume(nsid) {
            Some(v) => {
                let resv = ns.reservations(nsid).map(|r| r.can_persist());
                Reply::data(identify_namespace(&v, resv), len)
            }
            // An inactive NSID: a zero-filled structure.
            None => Reply::data(Vec::new(), len),
        },
        0x01 => Reply::data(identify_controller(c), len),
        0x02 if c.discovery => Reply::status(Status::INVALID_FIELD),
        0x02 if nsid >= 0xffff_fffe => Reply::status(Status::INVALID_NAMESPACE),
        0x02 => {
            let mut b = vec![0u8; 4096];
            for (i, n) in ns
                .active()
                .into_iter()
                .filter(|&n| n > nsid)
                .take(1024)
                .enumerate()
            {
                put32(&mut b, i * 4, n);
            }
            Reply::data(b, len)
        }
        0x03 if c.discovery => Reply::status(Status::INVALID_FIELD),
        0x03 => match ns.volume(nsid) {
            Some(v) => Reply::data(descriptors(&v), len),
            None => Reply::status(Status::INVALID_NAMESPACE),
        },
        // The NVM command set's I/O command set specific controller
        // structure: no limits beyond MDTS to report.
        0x06 if csi == 0 && !c.discovery => Reply::data(Vec::new(), len),
        _ => Reply::status(Status::INVALID_FIELD),
    }
}

/// Identify Controller (Base 2.0 "Identify Controller Data Structure").
fn identify_controller(c: &Controller) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    ascii(&mut b[4..24], &c.subsystem.serial);
    ascii(&mut b[24..64], "ironsan");
    ascii(&mut b[64..72], env!("CARGO_PKG_VERSION"));
    b[72] = 6; // RAB
               // CMIC: several ports and several controllers may share namespaces,
               // ANA reporting.
    b[76] = if c.discovery { 0 } else { 0x0b };
    b[77] = MDTS;
    put16(&mut b, 78, c.cntlid);
    put32(&mut b, 80, crate::ctrl::VERSION);
    if !c.discovery {
        // OAES: ANA change and Namespace Attribute notices.
        put32(&mut b, 92, AEC_ANA_CHANGE | AEC_NS_ATTR);
    }
    b[111] = if c.discovery { 2 } else { 1 }; // CNTRLTYPE
    b[258] = 3; // ACL: 4 Aborts
    b[259] = (MAX_AERS - 1) as u8; // AERL
    b[260] = 0x03; // FRMW: one slot, read-only
                   // LPA: the command effects log (not on a discovery controller),
                   // extended data for Get Log Page.
    b[261] = if c.discovery { 0x04 } else { 0x06 };
    put16(&mut b, 320, 1); // KAS: 100 ms granularity
    if !c.discovery {
        b[343] = 10; // ANATT: seconds
                     // ANACAP: optimized, non-optimized, inaccessible reported; the
                     // ANAGRPID does not change while attached.
        b[344] = 0x07 | 0x40;
        put32(&mut b, 345, ANA_GROUP); // ANAGRPMAX
        put32(&mut b, 349, ANA_GROUP); // NANAGRPID
    }
    b[512] = 0x66; // SQES
    b[513] = 0x44; // CQES
    put16(&mut b, 514, MAX_QUEUE_ENTRIES);
    if !c.discovery {
        put32(&mut b, 516, MAX_NSID);
        // ONCS: Compare, Dataset Management, Write Zeroes; Reservations
        // where the namespaces keep them.
        let resv = c.subsystem.namespaces.reservations_supported();
        put16(
            &mut b,
            520,
            0x0001 | 0x0004 | 0x0008 | (u16::from(resv) << 5),
        );
        // FUSES: Compare and Write (ACWU 0: one block is atomic, as any
        // length is here: the range is locked).
        put16(&mut b, 522, 0x0001);
        // VWC present; Flush with NSID FFFFFFFFh applies to all.
        b[525] = 0x07;
        // MNAN: as many namespaces as NN (a host with ANA needs it).
        put32(&mut b, 540, MAX_NSID);
    }
    // SGLS: SGLs supported (byte aligned), address as offset (in-capsule).
    put32(&mut b, 536, 0x0000_0001 | (1 << 20));
    let nqn = if c.discovery {
        DISCOVERY_NQN
    } else {
        &c.subsystem.nqn
    };
    let n = nqn.len().min(255);
    b[768..768 + n].copy_from_slice(&nqn.as_bytes()[..n]);
    // Fabrics: IOCCSZ, IORCSZ (16-byte units), ICDOFF 0, dynamic
    // controller model, one SGL descriptor.
    put32(&mut b, 1792, (64 + IO_IN_CAPSULE) / 16);
    put32(&mut b, 1796, 1);
    b[1803] = 1;
    b
}

/// Identify Namespace (NVM Command Set 1.0 "Identify Namespace Data
/// Structure"); `resv`: reservations are served, and whether they can
/// persist through power loss.
fn identify_namespace(v: &Volume, resv: Option<bool>) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    let n = v.num_blocks();
    put64(&mut b, 0, n); // NSZE
    put64(&mut b, 8, n); // NCAP
    put64(&mut b, 16, n); // NUSE
    let ppb = 1u16 << v.lbppb_shift();
    // NSFEAT: thin provisioning; NPWG and friends are valid.
    b[24] = u8::from(v.thin()) | 0x10;
    b[25] = 0; // NLBAF: one format
    b[26] = 0; // FLBAS: format 0
    b[30] = 1; // NMIC: may be shared (several controllers, ports)
    b[31] = resv.map_or(0, crate::resv::rescap); // RESCAP
                                                 // DLFEAT: deallocated blocks read as zeros, the Deallocate bit of
                                                 // Write Zeroes is honoured.
    if v.thin() {
        b[33] = 0x01 | 0x08;
    }
    for at in [64, 66, 68, 70, 72] {
        // NPWG, NPWA, NPDG, NPDA, NOWS (0's based, blocks).
        put16(&mut b, at, ppb - 1);
    }
    put32(&mut b, 92, ANA_GROUP); // ANAGRPID
    b[99] = u8::from(v.read_only()); // NSATTR: write protected
    b[104..120].copy_from_slice(&v.identity().naa); // NGUID
                                                    // LBA format 0: LBADS, no metadata, best relative performance.
    b[130] = v.block_shift() as u8;
    b
}

/// Namespace Identification Descriptor list: NGUID, the UUID when the
/// LUN has one (`uuid` in its configuration), and the command set (NVM).
fn descriptors(v: &Volume) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    b[0] = 0x02; // NIDT: NGUID
    b[1] = 16;
    b[4..20].copy_from_slice(&v.identity().naa);
    let mut at = 20;
    if let Some(u) = v.uuid() {
        b[at] = 0x03; // NIDT: UUID
        b[at + 1] = 16;
        b[at + 4..at + 20].copy_from_slice(&u);
        at += 20;
    }
    b[at] = 0x04; // NIDT: Command Set Identifier
    b[at + 1] = 1;
    b[at + 4] = 0; // NVM
    b
}

fn get_log_page(c: &Controller, cx: &Context<'_>, sqe: &Sqe) -> Reply {
    let d10 = sqe.dw(10);
    let lid = d10 as u8;
    let numd = ((u64::from(sqe.dw(11) & 0xffff) << 16) | u64::from(d10 >> 16)) + 1;
    let offset = u64::from(sqe.dw(12)) | (u64::from(sqe.dw(13)) << 32);
    let len = (numd * 4).min(u64::from(host_len(sqe)));
    let page = match lid {
        0x70 if c.discovery => discovery_log(c, cx),
        _ if c.discovery => return Reply::status(Status::specific(0x09)),
        // Error Information: one empty entry.
        0x01 => vec![0u8; 64],
        0x02 => smart(),
        0x03 => {
            let mut b = vec![0u8; 512];
            b[0] = 1; // AFI: slot 1 active
            ascii(&mut b[8..16], env!("CARGO_PKG_VERSION"));
            b
        }
        // Changed Namespace List; read, it is cleared unless RAE (bit 15).
        0x04 => c.take_changed_namespaces(d10 & (1 << 15) != 0),
        0x05 => effects(c.subsystem.namespaces.reservations_supported()),
        0x0c => ana_log(c, (d10 >> 8) & 1 != 0),
        // Invalid Log Page.
        _ => return Reply::status(Status::specific(0x09)),
    };
    if offset % 4 != 0 || offset > page.len() as u64 {
        return Reply::status(Status::INVALID_FIELD);
    }
    let from = offset as usize;
    let to = (from + len as usize).min(page.len());
    Reply::data(page[from..to].to_vec(), len as u32)
}

/// The ANA log page: the one group, its state through this controller
/// and (unless `groups_only`) its namespaces.
fn ana_log(c: &Controller, groups_only: bool) -> Vec<u8> {
    let nsids = if groups_only {
        Vec::new()
    } else {
        c.subsystem.namespaces.active()
    };
    let mut b = vec![0u8; 16 + 32 + 4 * nsids.len()];
    let chg = c.ana_changes();
    put64(&mut b, 0, chg);
    put16(&mut b, 8, 1); // NGRPS
    put32(&mut b, 16, ANA_GROUP);
    put32(&mut b, 20, nsids.len() as u32);
    put64(&mut b, 24, chg);
    b[32] = ana_code(c.access_state());
    for (i, n) in nsids.into_iter().enumerate() {
        put32(&mut b, 48 + 4 * i, n);
    }
    b
}

/// SMART / Health Information: healthy, at a nominal temperature.
fn smart() -> Vec<u8> {
    let mut b = vec![0u8; 512];
    put16(&mut b, 1, 300); // composite temperature, kelvin
    b[3] = 100; // available spare
    b[4] = 10; // available spare threshold
    b
}

/// Commands Supported and Effects: admin and NVM commands served (the
/// reservation commands when `resv`).
fn effects(resv: bool) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    for op in [
        opc::GET_LOG_PAGE,
        opc::IDENTIFY,
        opc::ABORT,
        opc::SET_FEATURES,
        opc::GET_FEATURES,
        opc::ASYNC_EVENT,
        opc::KEEP_ALIVE,
    ] {
        put32(&mut b, usize::from(op) * 4, 1);
    }
    use crate::nvm::opc as io;
    put32(&mut b, 0x7f * 4, 1); // Fabrics
    for (op, changes) in [
        (io::FLUSH, false),
        (io::WRITE, true),
        (io::READ, false),
        (io::COMPARE, false),
        (io::WRITE_ZEROES, true),
        (io::DSM, true),
    ]
    .into_iter()
    .chain(
        [
            crate::resv::opc::REGISTER,
            crate::resv::opc::REPORT,
            crate::resv::opc::ACQUIRE,
            crate::resv::opc::RELEASE,
        ]
        .into_iter()
        .filter(|_| resv)
        .map(|op| (op, false)),
    ) {
        // CSUPP, and LBCC for commands that change blocks.
        put32(
            &mut b,
            1024 + usize::from(op) * 4,
            1 | (u32::from(changes) << 1),
        );
    }
    b
}

/// The Discovery log page: every subsystem this host may connect to, at
/// every port, and this discovery subsystem itself.
fn discovery_log(c: &Controller, cx: &Context<'_>) -> Vec<u8> {
    let subs = cx.registry.visible_to(&c.hostnqn);
    let mut entries: Vec<(String, u8)> = subs.iter().map(|s| (s.nqn.clone(), 2)).collect();
    entries.push((DISCOVERY_NQN.to_owned(), 3));
    let n = entries.len() * cx.ports.len();
    let mut b = vec![0u8; 1024 * (n + 1)];
    put64(&mut b, 0, cx.registry.generation());
    put64(&mut b, 8, n as u64);
    let mut at = 1024;
    for (nqn, subtype) in &entries {
        for p in cx.ports {
            let e = &mut b[at..at + 1024];
            e[0] = 3; // TRTYPE: TCP
            e[1] = if p.addr.is_ipv4() { 1 } else { 2 };
            e[2] = *subtype;
            // TREQ: secure channel not required; SQ flow control may be
            // disabled.
            e[3] = 0x02 | 0x04;
            put16(e, 4, p.id);
            put16(e, 6, 0xffff);
            put16(e, 8, MAX_ADMIN_ENTRIES);
            ascii(&mut e[32..64], &p.addr.port().to_string());
            e[32 + p.addr.port().to_string().len()..64].fill(0);
            let k = nqn.len().min(255);
            e[256..256 + k].copy_from_slice(&nqn.as_bytes()[..k]);
            let a = p.addr.ip().to_string();
            e[512..512 + a.len()].copy_from_slice(a.as_bytes());
            at += 1024;
        }
    }
    b
}

fn set_features(c: &Controller, sqe: &Sqe) -> Reply {
    let d10 = sqe.dw(10);
    let fid = d10 as u8;
    let v = sqe.dw(11);
    if d10 >> 31 != 0 {
        // Feature Identifier Not Saveable.
        return Reply::status(Status::specific(0x0d));
    }
    match fid {
        0x07 => {
            let (nsqr, ncqr) = (v as u16, (v >> 16) as u16);
            if nsqr == 0xffff || ncqr == 0xffff {
                return Reply::status(Status::INVALID_FIELD);
            }
            let g = u32::from(c.grant_queues(nsqr, ncqr));
            Reply::ok(u64::from(g | (g << 16)))
        }
        0x0f => {
            c.set_kato_ms(v);
            Reply::ok(0)
        }
        0x0b => {
            c.set_aec(v);
            Reply::ok(0)
        }
        0x06 => {
            let wce = v & 1 != 0;
            let ns = &c.subsystem.namespaces;
            for n in ns.active() {
                if let Some(vol) = ns.volume(n) {
                    if vol.write_back() != wce && vol.set_write_back(wce).is_err() {
                        // Feature Not Changeable.
                        return Reply::status(Status::specific(0x0e));
                    }
                }
            }
            Reply::ok(0)
        }
        // Arbitration, power state 0, temperature threshold, interrupt
        // coalescing, write atomicity: accepted, nothing to change here.
        0x01 | 0x04 | 0x08 | 0x0a => Reply::ok(0),
        0x02 if v & 0x1f == 0 => Reply::ok(0),
        _ => Reply::status(Status::INVALID_FIELD),
    }
}

fn get_features(c: &Controller, sqe: &Sqe) -> Reply {
    let fid = sqe.dw(10) as u8;
    let sel = (sqe.dw(10) >> 8) & 7;
    if sel == 3 {
        // Supported capabilities: none saveable or namespace specific;
        // the changeable ones.
        return Reply::ok(u64::from(
            0x4 * u32::from(matches!(fid, 0x06 | 0x07 | 0x0b | 0x0f)),
        ));
    }
    let r = match fid {
        0x07 if !c.discovery => {
            let g = u32::from(c.io_queues().max(1) - 1);
            g | (g << 16)
        }
        0x0f => c.kato_ms(),
        0x0b => c.aec(),
        0x06 if !c.discovery => {
            let ns = &c.subsystem.namespaces;
            let any = ns
                .active()
                .into_iter()
                .filter_map(|n| ns.volume(n))
                .any(|v: Arc<Volume>| v.write_back());
            u32::from(any)
        }
        0x04 => 343, // over-temperature threshold, kelvin
        0x01 | 0x02 | 0x08 | 0x0a if !c.discovery => 0,
        _ => return Reply::status(Status::INVALID_FIELD),
    };
    Reply::ok(u64::from(r))
}
