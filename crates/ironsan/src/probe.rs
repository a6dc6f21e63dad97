//! Measurement probes for the side-by-side script (scripts/sidebyside.py):
//!
//! * `null-target`: the smallest iSCSI responder clients accept — reads
//!   answered with zeros, writes dropped, a fixed identity — to measure what
//!   a client can do at all (its ceiling). Deliberately independent of the
//!   target's code: only the PDU codec is shared.
//! * `nvme-null-target`: the same for NVMe/TCP (`probe_nvme`).
//! * `loopback`: a raw TCP request/response probe (fixed-size requests,
//!   fixed-size replies, a fixed number outstanding): the transport ceiling
//!   for the same shapes; with `--source-bytes` the replies come from a
//!   large written region instead of one cached buffer, which shows what
//!   reading memory (not the cache) costs the same exchange.
//! * `cores`: how long two CPUs take to hand a cache line back and forth.
//!   On a virtual machine the hypervisor moves virtual CPUs between physical
//!   cores; two that share a last-level cache hand a line over in well under
//!   100 ns, two on different dies take several times that. Every I/O over
//!   loopback crosses between initiator and target threads several times,
//!   so a queue-depth-1 exchange runs a third slower in the far placement.
//!   The side-by-side script probes before and after every sample to know
//!   which placement a sample ran in.

use iscsi_wire::outbox::{FileRange, WriteOut};
use iscsi_wire::receive::{ReadInto, Receiver};
use scsi_sense::{status, Asc, Sense, SenseKey};
use std::io::{IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::{Args, Subcommand};
use iscsi_wire::frame::FrameLimits;
use iscsi_wire::outbox::Digests;
use iscsi_wire::pdu::*;
use iscsi_wire::{text, Outbox, Sn};

#[derive(Subcommand, Debug)]
pub enum Probe {
    /// A null iSCSI responder (reads return zeros, writes are dropped).
    NullTarget(NullArgs),
    /// A null NVMe/TCP controller (reads return zeros, writes are dropped).
    NvmeNullTarget(crate::probe_nvme::NvmeNullArgs),
    /// A raw loopback TCP request/response probe.
    Loopback(LoopArgs),
    /// Cache-line round trip between two CPUs, in nanoseconds.
    Cores(CoresArgs),
}

#[derive(Args, Debug)]
pub struct CoresArgs {
    /// The two CPUs (as numbered by the kernel); default: the first two this
    /// process may run on.
    #[arg(long, num_args = 2, value_names = ["A", "B"])]
    cpus: Option<Vec<usize>>,
    /// Round trips per measurement; the median of five measurements is
    /// printed.
    #[arg(long, default_value_t = 4000)]
    trips: u64,
}

#[derive(Args, Debug)]
pub struct NullArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3299")]
    listen: String,
    /// Reported capacity in bytes.
    #[arg(long, default_value_t = 1 << 30)]
    size: u64,
}

#[derive(Args, Debug)]
pub struct LoopArgs {
    /// Request size in bytes.
    #[arg(long, default_value_t = 48)]
    req: usize,
    /// Response size in bytes.
    #[arg(long, default_value_t = 4144)]
    resp: usize,
    /// Requests outstanding.
    #[arg(long, default_value_t = 32)]
    qd: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 5.0)]
    secs: f64,
    /// Send the replies from a region of this many bytes, written once and
    /// walked in order (as a RAM LUN serves sequential reads), instead of
    /// from one buffer that stays in the cache (as a null responder does).
    #[arg(long, default_value_t = 0)]
    source_bytes: usize,
}

pub fn run(p: Probe) -> Result<()> {
    match p {
        Probe::NullTarget(a) => null_target(a),
        Probe::NvmeNullTarget(a) => crate::probe_nvme::run(a),
        Probe::Loopback(a) => loopback(a),
        Probe::Cores(a) => cores(a),
    }
}

fn null_target(a: NullArgs) -> Result<()> {
    let l = TcpListener::bind(&a.listen)?;
    println!("null-target: listening on {}", l.local_addr()?);
    for s in l.incoming() {
        let s = s?;
        let size = a.size;
        std::thread::spawn(move || {
            let _ = NullConn::new(s, size).serve();
        });
    }
    Ok(())
}

/// The null responder's blocking socket, read with `recv(2)` and written
/// with `writev(2)`.
struct Blocking<'a>(&'a TcpStream);

impl ReadInto for Blocking<'_> {
    fn read_into<B: bytes::BufMut>(&mut self, buf: &mut B) -> std::io::Result<usize> {
        use std::os::fd::AsFd;
        netio::recv_into(self.0.as_fd(), buf, 0)
    }
}

impl WriteOut for Blocking<'_> {
    fn write_vectored(&mut self, iov: &[IoSlice<'_>], _more: bool) -> std::io::Result<usize> {
        let mut s = self.0;
        s.write_vectored(iov)
    }

    fn send_file(&mut self, _: &FileRange) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::Unsupported.into())
    }
}

struct NullConn {
    s: TcpStream,
    rx: Receiver,
    out: Outbox,
    size: u64,
    stat_sn: Sn,
    exp_cmd_sn: Sn,
    /// Writes waiting for solicited data: (itt, expected, received).
    writes: Vec<(Itt, u32, u32)>,
    zeros: bytes::Bytes,
}

impl NullConn {
    fn new(s: TcpStream, size: u64) -> Self {
        let _ = s.set_nodelay(true);
        NullConn {
            s,
            rx: Receiver::new(),
            out: Outbox::new(),
            size,
            stat_sn: Sn(1),
            exp_cmd_sn: Sn(0),
            writes: Vec::new(),
            zeros: bytes::Bytes::from(vec![0u8; 256 * 1024]),
        }
    }

    fn sn(&mut self, advance: bool) -> SnTriple {
        let t = SnTriple {
            stat_sn: self.stat_sn,
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.exp_cmd_sn.plus(1023),
        };
        if advance {
            self.stat_sn = self.stat_sn.next();
        }
        t
    }

    fn serve(mut self) -> std::io::Result<()> {
        let lim = FrameLimits {
            header_digest: false,
            data_digest: false,
            max_data_segment: 1 << 20,
        };
        loop {
            while let Some(raw) = self
                .rx
                .next_pdu(&lim, usize::MAX, |_| None)
                .map_err(std::io::Error::other)?
            {
                if !self.handle(raw) {
                    self.flush()?;
                    return Ok(());
                }
            }
            self.flush()?;
            if self.rx.read(&mut Blocking(&self.s))? == 0 {
                return Ok(());
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // A blocking socket: the queue is empty when this returns Ok (a
        // write that would block could only be a timeout).
        if self.out.write_to(&mut Blocking(&self.s))? {
            Ok(())
        } else {
            Err(std::io::ErrorKind::TimedOut.into())
        }
    }

    fn handle(&mut self, raw: iscsi_wire::RawPdu) -> bool {
        let dg = Digests::default();
        match Pdu::parse(&raw.bhs) {
            Pdu::LoginReq(r) => {
                self.exp_cmd_sn = r.cmd_sn;
                self.stat_sn = r.exp_stat_sn;
                let discovery = raw.data.windows(19).any(|w| w == b"SessionType=Discove");
                let mut t = Vec::new();
                for (k, v) in [
                    ("HeaderDigest", "None"),
                    ("DataDigest", "None"),
                    ("InitialR2T", "Yes"),
                    ("ImmediateData", "Yes"),
                    ("MaxRecvDataSegmentLength", "262144"),
                    ("MaxBurstLength", "262144"),
                    ("FirstBurstLength", "262144"),
                    ("MaxOutstandingR2T", "1"),
                    ("ErrorRecoveryLevel", "0"),
                    ("TargetPortalGroupTag", "1"),
                ] {
                    if !discovery || k.ends_with("Digest") || k.starts_with("MaxRecv") {
                        text::push(&mut t, k, v);
                    }
                }
                let resp = LoginResp {
                    transit: true,
                    cont: false,
                    csg: r.csg,
                    nsg: 3,
                    version_max: 0,
                    version_active: 0,
                    isid: r.isid,
                    tsih: 1,
                    itt: r.itt,
                    sn: self.sn(true),
                    status: iscsi_wire::pdu::LoginStatus::SUCCESS,
                };
                self.out.push(&resp.encode(t.len()), &t, dg);
            }
            Pdu::TextReq(t) => {
                let addr = self
                    .s
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                let body = text::encode(&[
                    ("TargetName", "iqn.2026-11.io.ironsan:null"),
                    ("TargetAddress", &format!("{addr},1")),
                ]);
                let r = TextResp {
                    final_: true,
                    cont: false,
                    lun: t.lun,
                    itt: t.itt,
                    ttt: RESERVED_TAG,
                    sn: self.sn(true),
                };
                self.out.push(&r.encode(body.len()), &body, dg);
            }
            Pdu::NopOut(n) => {
                if n.itt.0 != RESERVED_TAG {
                    let r = NopIn {
                        lun: n.lun,
                        itt: n.itt,
                        ttt: RESERVED_TAG,
                        sn: self.sn(true),
                    };
                    self.out.push_bytes(&r.encode(raw.data.len()), raw.data, dg);
                }
            }
            Pdu::LogoutReq(l) => {
                let r = LogoutResp {
                    response: LogoutResponse::Closed,
                    itt: l.itt,
                    sn: self.sn(true),
                    time2wait: 0,
                    time2retain: 0,
                };
                self.out.push(&r.encode(), &[], dg);
                return false;
            }
            Pdu::ScsiCommand(c) => {
                if !c.immediate {
                    self.exp_cmd_sn = self.exp_cmd_sn.next();
                }
                self.command(c, raw.data.len() as u32);
            }
            Pdu::DataOut(d) => {
                if let Some(i) = self.writes.iter().position(|w| w.0 == d.itt) {
                    self.writes[i].2 += raw.data.len() as u32;
                    if self.writes[i].2 >= self.writes[i].1 {
                        self.writes.swap_remove(i);
                        self.status(d.itt, 0, &[]);
                    }
                }
            }
            Pdu::TaskMgmtReq(t) => {
                let r = TaskMgmtResp {
                    response: TmfResponse::Complete,
                    itt: t.itt,
                    sn: self.sn(true),
                };
                self.out.push(&r.encode(), &[], dg);
            }
            _ => return false,
        }
        true
    }

    fn status(&mut self, itt: Itt, status: u8, sense: &[u8]) {
        let mut d = Vec::new();
        if !sense.is_empty() {
            d.extend_from_slice(&(sense.len() as u16).to_be_bytes());
            d.extend_from_slice(sense);
        }
        let r = ScsiResponse {
            response: IscsiResponse::Completed,
            status,
            itt,
            sn: self.sn(true),
            exp_data_sn: 0,
            residual: Residual::default(),
        };
        self.out.push(&r.encode(d.len()), &d, Digests::default());
    }

    fn data(&mut self, c: &ScsiCommand, data: &[u8]) {
        let n = data.len().min(c.edtl as usize);
        let d = DataIn {
            final_: true,
            ack: false,
            status: Some(0),
            lun: c.lun,
            itt: c.itt,
            ttt: RESERVED_TAG,
            sn: self.sn(true),
            data_sn: 0,
            buffer_offset: 0,
            residual: Residual::of(c.edtl, data.len() as u32),
        };
        self.out.push(&d.encode(n), &data[..n], Digests::default());
    }

    fn command(&mut self, c: ScsiCommand, imm: u32) {
        let cdb = c.cdb;
        let blocks = self.size / 512;
        match cdb[0] {
            0x08 | 0x28 | 0xa8 | 0x88 => {
                // READ: zeros, in 256 KiB Data-In PDUs, status in the last.
                let total = c.edtl as usize;
                let mut off = 0;
                let mut data_sn = 0;
                while off < total || total == 0 {
                    let n = (total - off).min(self.zeros.len());
                    let last = off + n == total;
                    let d = DataIn {
                        final_: last,
                        ack: false,
                        status: last.then_some(0),
                        lun: c.lun,
                        itt: c.itt,
                        ttt: RESERVED_TAG,
                        sn: self.sn(last),
                        data_sn,
                        buffer_offset: off as u32,
                        residual: Residual::default(),
                    };
                    self.out
                        .push_bytes(&d.encode(n), self.zeros.slice(..n), Digests::default());
                    data_sn += 1;
                    off += n;
                    if total == 0 {
                        break;
                    }
                }
            }
            0x0a | 0x2a | 0xaa | 0x8a | 0x2e | 0x8e => {
                if imm >= c.edtl {
                    self.status(c.itt, 0, &[]);
                } else {
                    let r = R2t {
                        lun: c.lun,
                        itt: c.itt,
                        ttt: c.itt.0,
                        sn: self.sn(false),
                        r2t_sn: 0,
                        buffer_offset: imm,
                        desired_len: c.edtl - imm,
                    };
                    self.out.push(&r.encode(), &[], Digests::default());
                    self.writes.push((c.itt, c.edtl, imm));
                }
            }
            0x00 | 0x35 | 0x91 | 0x1b | 0x1e | 0x2f | 0x8f => self.status(c.itt, 0, &[]),
            0x12 => {
                let mut d = vec![0u8; 96];
                if cdb[1] & 1 == 0 {
                    d[2] = 6;
                    d[3] = 2;
                    d[4] = 91;
                    d[7] = 0x02;
                    d[8..16].copy_from_slice(b"IRONSAN ");
                    d[16..32].copy_from_slice(b"NULL RESPONDER  ");
                    d[32..36].copy_from_slice(b"0001");
                } else {
                    match cdb[2] {
                        0x00 => d = vec![0, 0, 0, 2, 0x00, 0x80],
                        0x80 => d = [&[0, 0x80, 0, 8][..], b"NULL0001"].concat(),
                        _ => return self.status(c.itt, status::CHECK_CONDITION, &invalid_field()),
                    }
                }
                self.data(&c, &d);
            }
            0x25 => {
                let mut d = [0u8; 8];
                d[..4].copy_from_slice(&(blocks.min(0xffff_ffff) as u32 - 1).to_be_bytes());
                d[4..].copy_from_slice(&512u32.to_be_bytes());
                self.data(&c, &d);
            }
            0x9e if cdb[1] & 0x1f == 0x10 => {
                let mut d = [0u8; 32];
                d[..8].copy_from_slice(&(blocks - 1).to_be_bytes());
                d[8..12].copy_from_slice(&512u32.to_be_bytes());
                self.data(&c, &d);
            }
            0xa0 => self.data(&c, &[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            0x1a => self.data(&c, &[3, 0, 0, 0]),
            0x5a => self.data(&c, &[0, 6, 0, 0, 0, 0, 0, 0]),
            _ => self.status(
                c.itt,
                status::CHECK_CONDITION,
                &Sense::invalid_opcode().to_bytes(),
            ),
        }
    }
}

fn invalid_field() -> Vec<u8> {
    Sense::new(SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB).to_bytes()
}

fn loopback(a: LoopArgs) -> Result<()> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let (req, resp) = (a.req.max(1), a.resp);
    // Replies from one buffer (in the cache), or walked through a region
    // written once (as large as asked, at least 256 replies).
    let region = if a.source_bytes > 0 {
        a.source_bytes.max(resp * 256)
    } else {
        resp * 256
    };
    // Written before the clock starts.
    let out = vec![0x5au8; region];
    std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        let mut inb = vec![0u8; (1 << 20).max(4 * req)];
        let walk = region > resp * 256;
        let mut at = 0;
        let mut have = 0;
        loop {
            let r = s.read(&mut inb[have..])?;
            if r == 0 {
                return Ok(());
            }
            have += r;
            let mut n = have / req;
            while n > 0 {
                if at + resp > region {
                    at = 0;
                }
                let k = n.min(256).min((region - at) / resp);
                s.write_all(&out[at..at + resp * k])?;
                if walk {
                    at += resp * k;
                }
                n -= k;
            }
            let used = have / req * req;
            inb.copy_within(used..have, 0);
            have -= used;
        }
    });
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let qd = a.qd.max(1);
    let half = (qd / 2).max(1);
    let reqs = vec![0u8; req * qd];
    let mut resps = vec![0u8; resp * half];
    s.write_all(&reqs)?;
    let start = Instant::now();
    let mut ops = 0u64;
    let secs = Duration::from_secs_f64(a.secs);
    loop {
        s.read_exact(&mut resps)?;
        ops += half as u64;
        s.write_all(&reqs[..req * half])?;
        if ops % 1024 < half as u64 && start.elapsed() > secs {
            break;
        }
    }
    let el = start.elapsed().as_secs_f64();
    println!(
        "req={} resp={} qd={}: {:.0} ops/s, {:.1} MB/s",
        req,
        resp,
        qd,
        ops as f64 / el,
        ops as f64 * resp as f64 / el / 1e6
    );
    Ok(())
}

/// The CPUs this process may run on, in order.
fn allowed_cpus() -> Result<Vec<usize>> {
    // SAFETY: all-zero bytes are a valid (empty) cpu_set_t.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes at most the size given, which is the set's.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: CPU_ISSET only reads the set, at an index below CPU_SETSIZE.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect())
}

/// Binds the calling thread to one CPU.
fn pin_to(cpu: usize) -> std::io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: all-zero bytes are a valid (empty) cpu_set_t.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes within the set: cpu < CPU_SETSIZE (above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the kernel reads at most the size given, which is the set's.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn cores(a: CoresArgs) -> Result<()> {
    let (x, y) = match a.cpus.as_deref() {
        Some(&[x, y]) => (x, y),
        _ => first_two_cpus()?,
    };
    let ns = cache_line_round_trip(x, y, a.trips)?;
    println!("cpus {x} {y}: {ns:.0} ns per cache-line round trip");
    Ok(())
}

/// The first two CPUs this process may run on.
pub fn first_two_cpus() -> Result<(usize, usize)> {
    match allowed_cpus()?[..] {
        [x, y, ..] => Ok((x, y)),
        _ => anyhow::bail!("cores: this process may run on only one CPU"),
    }
}

/// Nanoseconds per round trip of a cache line between CPUs `x` and `y`:
/// a counter on a line of its own, bounced between two pinned threads (one
/// writes odd values, the other answers with the next even one), `trips`
/// round trips per measurement; the median of five, after a warm-up. Both
/// threads are its own: the caller's CPU affinity is left as it was.
pub fn cache_line_round_trip(x: usize, y: usize, trips: u64) -> Result<f64> {
    std::thread::spawn(move || pinned_round_trip(x, y, trips))
        .join()
        .map_err(|_| anyhow::anyhow!("cores: the measuring thread panicked"))?
}

fn pinned_round_trip(x: usize, y: usize, trips: u64) -> Result<f64> {
    use std::sync::atomic::{AtomicU64, Ordering};
    #[repr(align(128))]
    struct Line(AtomicU64);
    /// Written instead of a count when either side gives up.
    const STOP: u64 = u64::MAX;
    const ROUNDS: usize = 6; // a warm-up, then five measured

    anyhow::ensure!(x != y, "cores: two different CPUs are needed");
    let trips = trips.clamp(100, 100_000_000);
    let line = std::sync::Arc::new(Line(AtomicU64::new(0)));
    let echo = {
        let line = line.clone();
        std::thread::spawn(move || -> std::io::Result<()> {
            if let Err(e) = pin_to(y) {
                line.0.store(STOP, Ordering::Release);
                return Err(e);
            }
            let mut want = 1;
            loop {
                match line.0.load(Ordering::Acquire) {
                    STOP => return Ok(()),
                    v if v == want => {
                        line.0.store(v + 1, Ordering::Release);
                        want += 2;
                    }
                    _ => std::hint::spin_loop(),
                }
            }
        })
    };
    let mut ns = Vec::with_capacity(ROUNDS);
    let pinned = pin_to(x);
    if pinned.is_ok() {
        let mut v = 1;
        'rounds: for _ in 0..ROUNDS {
            let t = Instant::now();
            for _ in 0..trips {
                // Only this thread writes odd values, so the swap fails only
                // when the echo thread has written STOP.
                if line
                    .0
                    .compare_exchange(v - 1, v, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    break 'rounds;
                }
                loop {
                    match line.0.load(Ordering::Acquire) {
                        w if w == v + 1 => break,
                        STOP => break 'rounds,
                        _ => std::hint::spin_loop(),
                    }
                }
                v += 2;
            }
            ns.push(t.elapsed().as_nanos() as f64 / trips as f64);
        }
    }
    line.0.store(STOP, Ordering::Release);
    let echoed = echo
        .join()
        .map_err(|_| anyhow::anyhow!("cores: the echo thread panicked"))?;
    pinned.map_err(|e| anyhow::anyhow!("cores: cannot run on CPU {x}: {e}"))?;
    echoed.map_err(|e| anyhow::anyhow!("cores: cannot run on CPU {y}: {e}"))?;
    anyhow::ensure!(ns.len() == ROUNDS, "cores: the exchange stopped early");
    let mut measured = ns[1..].to_vec();
    measured.sort_by(f64::total_cmp);
    Ok(measured[measured.len() / 2])
}
