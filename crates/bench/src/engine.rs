//! I/O engines: where a job's I/Os go. Every engine takes submissions up
//! to its depth and hands back completions; the job loop times them.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use initiator::scsi;
use initiator::{Connection, DataDir, Url};
use iscsi_wire::pdu::Itt;

/// What an I/O does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    /// Deallocates the range: UNMAP (SBC-4 §5.30) on a LUN, a punched hole
    /// in a file, BLKDISCARD on a block device.
    Trim,
}

impl Op {
    /// fio's data direction number (0 read, 1 write, 2 trim), as in its
    /// logs and terse output.
    pub fn ddir(self) -> u8 {
        match self {
            Op::Read => 0,
            Op::Write => 1,
            Op::Trim => 2,
        }
    }
}

/// The SCSI command carrying an I/O on a LU of `bs`-byte blocks: (CDB
/// bytes, CDB length, data). A write sends the first `io.len` bytes of
/// `payload`; a trim is an UNMAP of the range.
pub(crate) fn scsi_io(io: &Io, bs: u32, payload: &Bytes) -> ([u8; 16], usize, DataDir) {
    let lba = io.offset / u64::from(bs);
    let blocks = io.len / bs;
    match io.op {
        Op::Read => (
            scsi::rw16(false, lba, blocks, false),
            16,
            DataDir::Read(io.len),
        ),
        Op::Write => (
            scsi::rw16(true, lba, blocks, false),
            16,
            DataDir::Write(payload.slice(..io.len as usize)),
        ),
        Op::Trim => {
            let list = scsi::unmap_list(lba, blocks);
            let mut cdb = [0u8; 16];
            cdb[..10].copy_from_slice(&scsi::unmap(list.len() as u16));
            (cdb, 10, DataDir::Write(Bytes::copy_from_slice(&list)))
        }
    }
}

/// One I/O to submit.
#[derive(Clone, Copy, Debug)]
pub struct Io {
    pub op: Op,
    pub offset: u64,
    pub len: u32,
    /// The caller's slot number, handed back on completion.
    pub slot: usize,
}

/// A finished I/O.
#[derive(Clone, Debug)]
pub struct Done {
    pub slot: usize,
    /// `Err` with a description when the I/O failed.
    pub result: Result<(), String>,
    /// Data read (when the engine was asked to keep it).
    pub data: Option<Bytes>,
}

/// An I/O engine.
pub trait Engine: Send {
    /// Bytes addressable.
    fn capacity(&self) -> u64;
    /// Smallest I/O unit (logical block size).
    fn block_size(&self) -> u32;
    /// True when another I/O may be submitted now.
    fn can_submit(&self) -> bool;
    /// Submits an I/O. `payload` is written for writes (its length is `io.len`).
    fn submit(&mut self, io: Io, payload: &Bytes) -> Result<(), String>;
    /// Waits for at least one completion and appends all available.
    fn reap(&mut self, done: &mut Vec<Done>) -> Result<(), String>;
    /// Per-path I/O counts and failures (multipath engines).
    fn path_stats(&self) -> Vec<PathStat> {
        Vec::new()
    }
    /// UNIT ATTENTIONs met and retried, by sense key/ASC/ASCQ.
    fn unit_attentions(&self) -> Vec<((u8, u8, u8), u64)> {
        Vec::new()
    }
}

/// How often one I/O is sent again after a UNIT ATTENTION before its
/// CHECK CONDITION counts as an error (each UA is reported once per I_T
/// nexus; a few in a row are already unusual).
pub const UA_RETRIES: u8 = 8;

/// One path of a multipath engine, for reports.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathStat {
    /// `host:port` of the portal.
    pub name: String,
    /// I/Os completed on it.
    pub ios: u64,
    /// Why it was dropped, if it was.
    pub failed: Option<String>,
    /// Its ALUA target port group (VPD 0x83), when the target has ALUA.
    #[serde(default)]
    pub group: Option<u16>,
    /// Its group's asymmetric access state as last reported
    /// (`active/optimized`, `standby` …), when the target has ALUA.
    #[serde(default)]
    pub state: Option<String>,
    /// I/Os it answered with a condition that is retried (NOT READY
    /// 04/0A-0C, UNIT ATTENTION 2A/06, 29/xx, 3F/0E).
    #[serde(default)]
    pub retries: u64,
    /// SET TARGET PORT GROUPS sent through it that the target accepted.
    #[serde(default)]
    pub failovers: u64,
}

/// A LUN through the built-in initiator.
pub struct IscsiEngine {
    conn: Connection,
    lun: u16,
    bs: u32,
    capacity: u64,
    /// Commands in flight: their slot, the I/O, (writes) the payload, kept
    /// so they can be submitted again after a reconnect, a UNIT ATTENTION
    /// or a NOT READY, and what they met so far.
    inflight: HashMap<u32, (usize, Io, Bytes, Tries)>,
    /// Commands answered NOT READY, waiting to be sent again: when, the
    /// I/O, its payload, and what they met so far.
    held: std::collections::VecDeque<(Instant, Io, Bytes, Tries)>,
    keep_data: bool,
    scratch: Vec<(Itt, initiator::TaskResult)>,
    /// Times the connection was lost and the session reinstated.
    reconnects: u32,
    /// UNIT ATTENTIONs and NOT READYs retried, by sense key/ASC/ASCQ.
    unit_attentions: std::collections::BTreeMap<(u8, u8, u8), u64>,
}

/// How long one I/O answered NOT READY (becoming ready, a transition, a
/// standby or unavailable port) is sent again before it fails, as the
/// Linux SCSI layer retries within its 30 s command timeout.
pub const NOT_READY_DEADLINE: Duration = Duration::from_secs(30);
/// The pause before an I/O answered NOT READY is sent again.
const NOT_READY_BACKOFF: Duration = Duration::from_millis(100);

/// What one I/O of the iSCSI engine met before: how often it was sent
/// again after a UNIT ATTENTION, and when it was first answered NOT READY.
#[derive(Clone, Copy, Debug, Default)]
struct Tries {
    unit_attentions: u8,
    not_ready_since: Option<Instant>,
}

/// How often a single-path engine logs in again before giving up.
const MAX_RECONNECTS: u32 = 5;

/// Logs in to the URL's target, clears unit attentions and reads the
/// LUN's capacity: (connection, LUN, capacity in bytes, block size).
pub fn open_session(
    url: &Url,
    initiator_name: &str,
) -> Result<(Connection, u16, u64, u32), String> {
    let (mut conn, lun) = login_lun(url, initiator_name)?;
    // A LUN becoming ready (storage still opening), in transition, or with
    // a unit attention: asked again for as long as an I/O would be.
    let deadline = Instant::now() + NOT_READY_DEADLINE;
    let mut told = false;
    let r = loop {
        let r = read_capacity(&mut conn, lun).map_err(|e| format!("{url}: {e}"))?;
        let again = r.status == Some(0x02)
            && matches!(scsi::sense_code(&r.sense), Some((2, 0x04, _) | (6, _, _)));
        if !again || Instant::now() >= deadline {
            break r;
        }
        if !told && scsi::sense_code(&r.sense).is_some_and(|(k, _, _)| k == 2) {
            eprintln!(
                "ironsan: {url}: not ready ({}); asking again for up to {} s",
                task_result(&r).err().unwrap_or_default(),
                NOT_READY_DEADLINE.as_secs()
            );
            told = true;
        }
        std::thread::sleep(NOT_READY_BACKOFF * 3);
    };
    match (r.status, scsi::parse_capacity16(&r.data)) {
        (Some(0), Some((blocks, bs))) => Ok((conn, lun, blocks * u64::from(bs), bs)),
        _ if scsi::sense_code(&r.sense) == Some((5, 0x25, 0)) => Err(format!(
            "{url}: the target has no LUN {lun} (LOGICAL UNIT NOT SUPPORTED; `ironsan ls` lists its LUNs)"
        )),
        _ => Err(format!(
            "{url}: READ CAPACITY(16) failed: {}",
            task_result(&r).err().unwrap_or_else(|| "no capacity data".into())
        )),
    }
}

/// Logs in to the URL's target and clears unit attentions (a few TEST UNIT
/// READYs): (connection, LUN).
pub fn login_lun(url: &Url, initiator_name: &str) -> Result<(Connection, u16), String> {
    let target = url.target.as_deref().ok_or("URL without a target")?;
    let lun = url.lun.unwrap_or(0);
    let cfg = url.login_config(initiator_name, Some(target));
    let mut conn = Connection::login(&url.addr(), cfg).map_err(|e| format!("{url}: {e}"))?;
    for _ in 0..5 {
        let r = conn
            .execute(lun, &scsi::test_unit_ready(), DataDir::None)
            .map_err(|e| format!("{url}: {e}"))?;
        if r.status == Some(0) {
            break;
        }
    }
    Ok((conn, lun))
}

/// READ CAPACITY(16), as answered.
pub fn read_capacity(
    conn: &mut Connection,
    lun: u16,
) -> Result<initiator::TaskResult, initiator::Error> {
    conn.execute(lun, &scsi::read_capacity16(), DataDir::Read(32))
}

/// A command's outcome as an I/O result.
pub fn task_result(r: &initiator::TaskResult) -> Result<(), String> {
    match r.status {
        Some(0) => Ok(()),
        Some(s) => Err(match scsi::sense_code(&r.sense) {
            Some((k, a, q)) => match scsi::sense_meaning(k, a, q) {
                Some(m) => format!("status {s:#04x}, sense {k:x}/{a:02x}/{q:02x} ({m})"),
                None => format!("status {s:#04x}, sense {k:x}/{a:02x}/{q:02x}"),
            },
            None => format!("status {s:#04x}"),
        }),
        None => Err("command rejected by the target".into()),
    }
}

impl IscsiEngine {
    /// Logs in to the URL's target and reads the LUN's capacity.
    /// `busy_poll`: see [`Connection::set_busy_poll`].
    pub fn open(
        url: &Url,
        initiator_name: &str,
        keep_data: bool,
        busy_poll: std::time::Duration,
    ) -> Result<IscsiEngine, String> {
        let (mut conn, lun, capacity, bs) = open_session(url, initiator_name)?;
        conn.set_busy_poll(busy_poll);
        Ok(IscsiEngine {
            conn,
            lun,
            bs,
            capacity,
            inflight: HashMap::new(),
            keep_data,
            scratch: Vec::new(),
            held: Default::default(),
            reconnects: 0,
            unit_attentions: Default::default(),
        })
    }

    fn send(&mut self, io: Io, payload: Bytes) {
        self.send_again(io, payload, Tries::default());
    }

    /// Sends `io`, which met `tries` before.
    fn send_again(&mut self, io: Io, payload: Bytes, tries: Tries) {
        let (cdb, n, dir) = scsi_io(&io, self.bs, &payload);
        let itt = self.conn.submit(self.lun, &cdb[..n], dir);
        self.inflight.insert(itt.0, (io.slot, io, payload, tries));
    }

    /// After a lost connection: log in again (the target reinstates the
    /// session) and submit every outstanding I/O again.
    fn recover(&mut self, why: &str) -> Result<(), String> {
        loop {
            self.reconnects += 1;
            if self.reconnects > MAX_RECONNECTS {
                return Err(format!("{why} (gave up after {MAX_RECONNECTS} reconnects)"));
            }
            std::thread::sleep(std::time::Duration::from_millis(
                100 * u64::from(self.reconnects),
            ));
            match self.conn.reconnect() {
                Ok(()) => break,
                Err(e) => eprintln!("ironsan bench: reconnect failed: {e}"),
            }
        }
        let pending: Vec<_> = self.inflight.drain().map(|(_, v)| v).collect();
        eprintln!(
            "ironsan bench: connection lost ({why}); session reinstated, {} I/Os submitted again",
            pending.len()
        );
        for (_, io, payload, tries) in pending {
            self.send_again(io, payload, tries);
        }
        Ok(())
    }

    /// Commands in flight or waiting to be sent again.
    pub fn outstanding(&self) -> usize {
        self.inflight.len() + self.held.len()
    }

    /// Sends the I/Os held after a NOT READY whose pause is over; when
    /// nothing else is in flight, first sleeps until the next one is due.
    fn send_held(&mut self) {
        if self.inflight.is_empty() {
            if let Some((due, ..)) = self.held.front() {
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
            }
        }
        let now = Instant::now();
        while self.held.front().is_some_and(|(due, ..)| *due <= now) {
            let Some((_, io, payload, tries)) = self.held.pop_front() else {
                break;
            };
            self.send_again(io, payload, tries);
        }
    }
}

impl Engine for IscsiEngine {
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn block_size(&self) -> u32 {
        self.bs
    }
    fn can_submit(&self) -> bool {
        self.conn.can_submit()
    }
    fn submit(&mut self, io: Io, payload: &Bytes) -> Result<(), String> {
        let payload = if io.op == Op::Write {
            payload.clone()
        } else {
            Bytes::new()
        };
        self.send(io, payload);
        Ok(())
    }
    fn reap(&mut self, done: &mut Vec<Done>) -> Result<(), String> {
        self.send_held();
        if self.inflight.is_empty() {
            // Everything waits out a NOT READY back-off.
            return Ok(());
        }
        if let Err(e) = self.conn.wait(&mut self.scratch) {
            match e {
                // The connection is gone: reinstate the session and go on.
                initiator::Error::Io(_) | initiator::Error::Closed => {
                    self.scratch.clear();
                    return self.recover(&e.to_string());
                }
                e => return Err(e.to_string()),
            }
        }
        // Taken out so that retries may submit; put back to keep its
        // allocation for the next round.
        let mut results = std::mem::take(&mut self.scratch);
        for (itt, r) in results.drain(..) {
            let Some((slot, io, payload, tries)) = self.inflight.remove(&itt.0) else {
                continue;
            };
            // A UNIT ATTENTION (a LUN added, a resize, a reset) reports an
            // event, not a failure of the command: every initiator sends
            // it again (SAM-5 §5.14), and so does this one.
            if r.status == Some(2) && tries.unit_attentions < UA_RETRIES {
                if let Some(code @ (6, _, _)) = scsi::sense_code(&r.sense) {
                    *self.unit_attentions.entry(code).or_default() += 1;
                    let tries = Tries {
                        unit_attentions: tries.unit_attentions + 1,
                        ..tries
                    };
                    self.send_again(io, payload, tries);
                    continue;
                }
            }
            // NOT READY (the LU becoming ready, an ALUA transition, a
            // standby port a gateway may take over for): sent again after a
            // pause, for up to NOT_READY_DEADLINE, then an error naming it.
            if r.status == Some(2) {
                if let Some(code @ (2, 0x04, _)) = scsi::sense_code(&r.sense) {
                    let now = Instant::now();
                    let first = tries.not_ready_since.unwrap_or(now);
                    if now.duration_since(first) < NOT_READY_DEADLINE {
                        *self.unit_attentions.entry(code).or_default() += 1;
                        // As before, the UNIT ATTENTIONs count again from 0.
                        let tries = Tries {
                            unit_attentions: 0,
                            not_ready_since: Some(first),
                        };
                        self.held
                            .push_back((now + NOT_READY_BACKOFF, io, payload, tries));
                        continue;
                    }
                    let why = task_result(&r).err().unwrap_or_default();
                    done.push(Done {
                        slot,
                        result: Err(format!(
                            "{why} (retried for {} s)",
                            NOT_READY_DEADLINE.as_secs()
                        )),
                        data: None,
                    });
                    continue;
                }
            }
            let result = task_result(&r);
            let data = if self.keep_data {
                Some(r.data)
            } else {
                // A read's buffer goes back to this thread's pool: the
                // next large read lands in it (initiator::Connection).
                bufpool::give(r.data);
                None
            };
            done.push(Done { slot, result, data });
        }
        self.scratch = results;
        Ok(())
    }

    fn unit_attentions(&self) -> Vec<((u8, u8, u8), u64)> {
        self.unit_attentions.iter().map(|(k, v)| (*k, *v)).collect()
    }
}

/// A file or block device with positional reads and writes (fio's
/// `psync`): one I/O at a time per job.
pub struct PsyncEngine {
    file: File,
    blockdev: bool,
    capacity: u64,
    bs: u32,
    buf: AlignedBuf,
    done: Option<Done>,
    keep_data: bool,
}

/// A heap buffer aligned for O_DIRECT.
pub(crate) struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is owned exclusively by its engine.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    pub(crate) fn new(len: usize) -> AlignedBuf {
        let layout =
            std::alloc::Layout::from_size_align(len.max(4096), 4096).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, layout }
    }
    pub(crate) fn slice(&mut self, len: usize) -> &mut [u8] {
        // SAFETY: the allocation is at least `layout.size()` bytes, zeroed at
        // creation, and `len` is clamped to it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), len.min(self.layout.size())) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Lays a regular file out from `from` to `to` bytes with written data, as
/// fio does before a job: reads of a sparse file would measure holes (the
/// file system answers them from nothing), not the medium. The data does
/// not compress. Written through the page cache, then synced.
fn lay_out(path: &Path, from: u64, to: u64) -> Result<(), String> {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let chunk = crate::run::pattern(1 << 20, 0x1a7d_0ff5);
    let mut at = from;
    while at < to {
        let n = (to - at).min(chunk.len() as u64) as usize;
        f.write_all_at(&chunk[..n], at)
            .map_err(|e| format!("{}: laying the file out: {e}", path.display()))?;
        at += n as u64;
    }
    f.sync_all()
        .map_err(|e| format!("{}: laying the file out: {e}", path.display()))
}

/// `BLKDISCARD` (linux/fs.h: `_IO(0x12, 119)`): discards a byte range
/// `[start, len]` of a block device.
const BLKDISCARD: libc::c_ulong = 0x1277;

/// Deallocates `len` bytes at `offset`: BLKDISCARD on a block device, a
/// punched hole (the size kept) in a regular file. Synchronous, as fio's
/// engines trim.
pub(crate) fn trim_range(file: &File, blockdev: bool, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let r = if blockdev {
        let range: [u64; 2] = [offset, len];
        // SAFETY: BLKDISCARD reads a [u64; 2] through the pointer, which
        // lives across the call.
        unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
    } else {
        let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        // SAFETY: a plain syscall on a descriptor this engine owns.
        unsafe {
            libc::fallocate(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                n,
            )
        }
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// True when `file` is a block device.
pub(crate) fn is_block_device(file: &File) -> bool {
    use std::os::unix::fs::FileTypeExt;
    file.metadata()
        .is_ok_and(|m| m.file_type().is_block_device())
}

/// Opens (or with `create_size`, creates or extends, laid out with data) a
/// file or block device; returns it with its size in bytes.
pub(crate) fn open_file(
    path: &Path,
    direct: bool,
    create_size: Option<u64>,
) -> Result<(File, u64), String> {
    // Devices are never made up: a missing path under /dev is a typo.
    if create_size.is_some() && path.starts_with("/dev") && !path.exists() {
        return Err(format!(
            "{}: no such device (files are not created under /dev)",
            path.display()
        ));
    }
    let mut o = OpenOptions::new();
    o.read(true).write(true);
    if create_size.is_some() {
        o.create(true);
    }
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    let file = o
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    let mut capacity = meta.len();
    use std::os::unix::fs::FileTypeExt;
    if meta.file_type().is_block_device() {
        use std::io::{Seek, SeekFrom};
        let mut f = &file;
        capacity = f.seek(SeekFrom::End(0)).map_err(|e| e.to_string())?;
    } else if let Some(want) = create_size {
        if capacity < want {
            lay_out(path, capacity, want)?;
            capacity = want;
        }
    }
    if capacity == 0 {
        return Err(format!(
            "{}: empty; give --size to create it",
            path.display()
        ));
    }
    Ok((file, capacity))
}

impl PsyncEngine {
    /// Opens (or with `create_size`, creates) a file or block device.
    pub fn open(
        path: &Path,
        direct: bool,
        create_size: Option<u64>,
        max_io: u32,
        keep_data: bool,
    ) -> Result<Self, String> {
        let (file, capacity) = open_file(path, direct, create_size)?;
        Ok(PsyncEngine {
            blockdev: is_block_device(&file),
            file,
            capacity,
            bs: 512,
            buf: AlignedBuf::new(max_io as usize),
            done: None,
            keep_data,
        })
    }
}

impl Engine for PsyncEngine {
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn block_size(&self) -> u32 {
        self.bs
    }
    fn can_submit(&self) -> bool {
        self.done.is_none()
    }
    fn submit(&mut self, io: Io, payload: &Bytes) -> Result<(), String> {
        let len = io.len as usize;
        let buf = self.buf.slice(len);
        let r: io::Result<()> = match io.op {
            Op::Write => {
                buf.copy_from_slice(&payload[..len]);
                self.file.write_all_at(buf, io.offset)
            }
            Op::Read => self.file.read_exact_at(buf, io.offset),
            Op::Trim => trim_range(&self.file, self.blockdev, io.offset, len as u64),
        };
        let data = (self.keep_data && io.op == Op::Read).then(|| Bytes::copy_from_slice(buf));
        self.done = Some(Done {
            slot: io.slot,
            result: r.map_err(|e| e.to_string()),
            data,
        });
        Ok(())
    }
    fn reap(&mut self, done: &mut Vec<Done>) -> Result<(), String> {
        done.extend(self.done.take());
        Ok(())
    }
}
