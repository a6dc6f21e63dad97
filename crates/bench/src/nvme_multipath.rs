//! One namespace over several NVMe/TCP paths (several nvme-tcp:// URLs with
//! `--multipath rr[:N]|lqd`): a controller and one I/O queue per path, I/Os
//! spread by the policy, as Linux's native NVMe multipath does it.
//!
//! At open every path must show the same namespace (NGUID) and geometry;
//! anything else is refused, since spreading I/O over two namespaces
//! silently corrupts data.
//!
//! # ANA
//!
//! Asymmetric Namespace Access (NVMe Base 2.0 §8.1.3): each path's state
//! for the namespace's ANA group comes from the ANA log page (Get Log Page
//! 0Ch) of that path's controller. The policy chooses among live paths in
//! the optimized state, else the non-optimized ones; inaccessible,
//! persistent-loss and change states get no I/O. An I/O completed with an
//! ANA path status (SCT 3h, SC 01h persistent loss, 02h inaccessible, 03h
//! transition) is not an error: it is queued again and every path's state
//! is read again before more I/O goes out; they are read every second
//! anyway, so that a path that became usable again carries I/O again (the
//! Linux host learns it from ANA change notices). A path whose connection fails
//! is dropped and its I/Os go to the others. While no path is usable the
//! states are read again every [`REREAD`], and I/Os waiting longer than
//! [`crate::multipath::RETRY_DEADLINE`] with nothing completing fail.
//!
//! Waiting: with one busy path the engine blocks on it; with several it
//! poll(2)s the sockets of the paths with commands in flight and drains
//! the readable ones without blocking.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use initiator::nvme::{host_nqn, sqe, Completion, Controller, NvmeQueue, NvmeUrl};

use crate::engine::{Done, Engine, Io, PathStat};
use crate::multipath::RETRY_DEADLINE;
use crate::spec::Multipath;

/// Most queue entries asked of each controller.
const MAX_ENTRIES: u32 = 1024;
/// How long to wait for any completion before giving up.
const STALL_MS: i32 = 30_000;
/// How often the states are read while no path is usable.
const REREAD: Duration = Duration::from_millis(200);
/// How often they are read anyway (a path that became usable again is
/// used again; Linux learns it from ANA change notices).
const REFRESH: Duration = Duration::from_secs(1);
/// The ANA log page read (room for the groups ironsan and nvmet report).
const ANA_LOG_BYTES: u32 = 4096;

/// ANA states (Get Log Page 0Ch, ANA group descriptor byte 32).
const OPTIMIZED: u8 = 0x01;
const NON_OPTIMIZED: u8 = 0x02;

fn state_name(s: u8) -> &'static str {
    match s {
        0x01 => "optimized",
        0x02 => "non-optimized",
        0x03 => "inaccessible",
        0x04 => "persistent-loss",
        0x0f => "change",
        _ => "unknown",
    }
}

struct Path {
    name: String,
    /// The admin queue: the controller lives as long as it does.
    ctrl: Option<Controller>,
    q: Option<NvmeQueue>,
    /// CID -> the I/O and its payload (kept for re-submission).
    inflight: HashMap<u16, (Io, Bytes)>,
    ios: u64,
    failed: Option<String>,
    /// ANA state of the namespace's group through this path (optimized
    /// when the controller has no ANA).
    state: u8,
    retries: u64,
}

impl Path {
    fn usable(&self, tier: u8) -> bool {
        self.failed.is_none() && self.state == tier
    }
}

/// A namespace over several NVMe/TCP paths.
pub struct NvmeMultipathEngine {
    paths: Vec<Path>,
    policy: Multipath,
    nsid: u32,
    /// The namespace's ANA group (0: no ANA).
    anagrpid: u32,
    bs: u32,
    capacity: u64,
    keep_data: bool,
    rr_cur: usize,
    rr_count: u32,
    /// I/Os of failed paths, and retried ones, waiting for a usable path.
    pending: VecDeque<(Io, Bytes)>,
    /// The states are to be read again before more I/O goes out.
    stale: bool,
    last_read: Option<Instant>,
    scratch: Vec<Completion>,
    /// Since when I/Os have waited without any I/O completing.
    stuck_since: Option<Instant>,
    last_status: String,
}

impl NvmeMultipathEngine {
    /// Connects to every URL's subsystem (host NQN `hostnqn` when it is one,
    /// else one fresh UUID form for all paths, as one host), checks they
    /// show one namespace and reads each path's ANA state.
    pub fn open(
        urls: &[NvmeUrl],
        hostnqn: &str,
        keep_data: bool,
        policy: Multipath,
        iodepth: u32,
        busy_poll: Duration,
    ) -> Result<Self, String> {
        let host = if hostnqn.starts_with("nqn.") {
            hostnqn.to_owned()
        } else {
            host_nqn(&initiator::random_bytes::<16>())
        };
        let entries = (iodepth + 1).clamp(2, MAX_ENTRIES) as u16;
        let mut paths = Vec::new();
        let mut first: Option<(String, [u8; 16], u64, u32, u32)> = None;
        for url in urls {
            let err = |e: initiator::Error| format!("{url}: {e}");
            let mut ctrl =
                Controller::connect(url.addr, &url.subnqn, &host, url.digests, 1).map_err(err)?;
            let ns = ctrl.namespace(url.nsid).map_err(err)?;
            match &first {
                None => {
                    first = Some((
                        url.to_string(),
                        ns.nguid,
                        ns.blocks,
                        ns.block_size,
                        ns.anagrpid,
                    ))
                }
                Some((f, nguid, blocks, bs, _)) => {
                    if *nguid != ns.nguid || url.nsid != urls[0].nsid {
                        return Err(format!(
                            "--multipath: {f} and {url} are not the same namespace (NGUID \
                             {} vs {}); refusing to spread I/O over them",
                            crate::verify::hex(nguid),
                            crate::verify::hex(&ns.nguid)
                        ));
                    }
                    if (*blocks, *bs) != (ns.blocks, ns.block_size) {
                        return Err(format!(
                            "--multipath: {f} and {url} show the same NGUID but different \
                             sizes ({blocks} × {bs} vs {} × {}); refusing",
                            ns.blocks, ns.block_size
                        ));
                    }
                }
            }
            let mut q = ctrl.io_queue(1, entries).map_err(err)?;
            q.set_busy_poll(busy_poll);
            paths.push(Path {
                name: url.addr.to_string(),
                ctrl: Some(ctrl),
                q: Some(q),
                inflight: HashMap::new(),
                ios: 0,
                failed: None,
                state: OPTIMIZED,
                retries: 0,
            });
        }
        let (_, _, blocks, bs, anagrpid) = first.ok_or("--multipath: no path")?;
        let mut e = NvmeMultipathEngine {
            paths,
            policy,
            nsid: urls[0].nsid,
            anagrpid,
            bs,
            capacity: blocks * u64::from(bs),
            keep_data,
            rr_cur: 0,
            rr_count: 0,
            pending: VecDeque::new(),
            stale: false,
            last_read: None,
            scratch: Vec::new(),
            stuck_since: None,
            last_status: String::new(),
        };
        e.read_states();
        Ok(e)
    }

    /// Reads each live path's ANA state for the namespace's group (Get Log
    /// Page 0Ch through its controller); a path whose admin queue fails is
    /// dropped.
    fn read_states(&mut self) {
        self.stale = false;
        self.last_read = Some(Instant::now());
        if self.anagrpid == 0 {
            return;
        }
        for i in 0..self.paths.len() {
            let p = &mut self.paths[i];
            let Some(ctrl) = p.ctrl.as_mut() else {
                continue;
            };
            let numd = ANA_LOG_BYTES / 4 - 1;
            let r = ctrl.admin.call(
                sqe(0x02, 0xffff_ffff, &[(10, 0x0c | (numd << 16))]),
                Bytes::new(),
                ANA_LOG_BYTES,
            );
            match r {
                Ok(c) if c.ok().is_ok() => {
                    p.state = ana_state(&c.data, self.anagrpid).unwrap_or(0x03);
                }
                Ok(c) => {
                    let why = format!("ANA log page refused: {:?}", c.status);
                    self.fail_path(i, why);
                }
                Err(e) => self.fail_path(i, format!("admin queue: {e}")),
            }
        }
    }

    /// Drops path `i`: its I/Os wait for another.
    fn fail_path(&mut self, i: usize, why: String) {
        let p = &mut self.paths[i];
        if p.failed.is_none() {
            p.failed = Some(why);
        }
        p.q = None;
        p.ctrl = None;
        let mut moved: Vec<(Io, Bytes)> = p.inflight.drain().map(|(_, v)| v).collect();
        moved.sort_by_key(|(io, _)| io.slot);
        self.pending.extend(moved);
    }

    /// The tier the policy chooses from now: optimized if any live path is,
    /// else non-optimized; `None` when no path is usable.
    fn tier(&self) -> Option<u8> {
        [OPTIMIZED, NON_OPTIMIZED]
            .into_iter()
            .find(|&t| self.paths.iter().any(|p| p.usable(t)))
    }

    /// The path for the next I/O.
    fn choose(&mut self) -> Option<usize> {
        let tier = self.tier()?;
        let fits = |p: &Path| p.usable(tier) && p.q.as_ref().is_some_and(NvmeQueue::can_submit);
        let n = self.paths.len();
        match self.policy {
            Multipath::RoundRobin(k) => {
                let cur_ok = fits(&self.paths[self.rr_cur]);
                if !cur_ok || self.rr_count >= k {
                    self.rr_count = 0;
                    let next = (1..=n)
                        .map(|d| (self.rr_cur + d) % n)
                        .find(|&i| fits(&self.paths[i]))?;
                    self.rr_cur = next;
                }
                self.rr_count += 1;
                Some(self.rr_cur)
            }
            Multipath::LeastQueueDepth => (0..n)
                .filter(|&i| fits(&self.paths[i]))
                .min_by_key(|&i| self.paths[i].inflight.len()),
        }
    }

    fn send(&mut self, i: usize, io: Io, payload: Bytes) -> Result<(), String> {
        let (nsid, bs) = (self.nsid, self.bs);
        let p = &mut self.paths[i];
        let q = p.q.as_mut().ok_or("path is down")?;
        let cid = crate::nvme::submit_io(q, nsid, bs, io, &payload).map_err(|e| e.to_string())?;
        p.inflight.insert(cid, (io, payload));
        Ok(())
    }

    /// Sends waiting I/Os on usable paths while they have room.
    fn drain_pending(&mut self) {
        while let Some((io, payload)) = self.pending.pop_front() {
            let Some(i) = self.choose() else {
                self.pending.push_front((io, payload));
                return;
            };
            if let Err(e) = self.send(i, io, payload.clone()) {
                self.pending.push_front((io, payload));
                self.fail_path(i, e);
            }
        }
    }

    /// Handles path `i`'s completions in `self.scratch`.
    fn complete(&mut self, i: usize, done: &mut Vec<Done>) {
        let keep = self.keep_data;
        for c in std::mem::take(&mut self.scratch) {
            let Some((io, payload)) = self.paths[i].inflight.remove(&c.cid) else {
                continue;
            };
            // Path related: ANA persistent loss, inaccessible, transition.
            if c.status.sct == 3 && (1..=3).contains(&c.status.sc) {
                let p = &mut self.paths[i];
                p.retries += 1;
                self.last_status = format!("{}: ANA path status {:#x}", p.name, c.status.sc);
                self.stale = true;
                self.pending.push_back((io, payload));
                continue;
            }
            self.paths[i].ios += 1;
            self.stuck_since = None;
            done.push(Done {
                slot: io.slot,
                result: c.ok().map_err(|e| e.to_string()),
                data: keep.then_some(c.data),
            });
        }
    }

    fn busy(&self) -> Vec<usize> {
        (0..self.paths.len())
            .filter(|&i| !self.paths[i].inflight.is_empty() && self.paths[i].q.is_some())
            .collect()
    }
}

/// The state of ANA group `grp` in an ANA log page.
fn ana_state(page: &[u8], grp: u32) -> Option<u8> {
    let n = usize::from(u16::from_le_bytes(page.get(8..10)?.try_into().ok()?));
    let mut off = 16;
    for _ in 0..n {
        let d = page.get(off..off + 32)?;
        let id = u32::from_le_bytes(d[0..4].try_into().ok()?);
        let nnsid = u32::from_le_bytes(d[4..8].try_into().ok()?) as usize;
        if id == grp {
            return Some(d[16] & 0x0f);
        }
        off += 32 + 4 * nnsid;
    }
    None
}

impl Engine for NvmeMultipathEngine {
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn block_size(&self) -> u32 {
        self.bs
    }
    fn can_submit(&self) -> bool {
        self.pending.is_empty()
            && !self.stale
            && self.tier().is_some_and(|t| {
                self.paths
                    .iter()
                    .any(|p| p.usable(t) && p.q.as_ref().is_some_and(NvmeQueue::can_submit))
            })
    }
    fn submit(&mut self, io: Io, payload: &Bytes) -> Result<(), String> {
        self.pending.push_back((io, payload.clone()));
        self.drain_pending();
        Ok(())
    }
    fn reap(&mut self, done: &mut Vec<Done>) -> Result<(), String> {
        let before = done.len();
        if self.anagrpid != 0 && self.last_read.is_none_or(|t| t.elapsed() >= REFRESH) {
            self.stale = true;
        }
        loop {
            if self.stale {
                self.read_states();
            }
            self.drain_pending();
            let busy = self.busy();
            if busy.is_empty() {
                if self.pending.is_empty() {
                    return Ok(());
                }
                // Nothing usable: read the states again after a while.
                let since = *self.stuck_since.get_or_insert_with(Instant::now);
                if self.paths.iter().all(|p| p.failed.is_some()) {
                    let why: Vec<String> = self
                        .paths
                        .iter()
                        .map(|p| format!("{}: {}", p.name, p.failed.as_deref().unwrap_or("")))
                        .collect();
                    return Err(format!("every path failed ({})", why.join("; ")));
                }
                if since.elapsed() > RETRY_DEADLINE {
                    return Err(format!(
                        "no usable path for {} s ({})",
                        RETRY_DEADLINE.as_secs(),
                        if self.last_status.is_empty() {
                            "every path inaccessible"
                        } else {
                            &self.last_status
                        }
                    ));
                }
                let wait = self
                    .last_read
                    .map_or(Duration::ZERO, |t| REREAD.saturating_sub(t.elapsed()));
                std::thread::sleep(wait);
                self.stale = true;
                continue;
            }
            if let [i] = busy[..] {
                let r = self.paths[i]
                    .q
                    .as_mut()
                    .expect("busy paths have a queue")
                    .wait(&mut self.scratch);
                match r {
                    Ok(()) => self.complete(i, done),
                    Err(e) => self.fail_path(i, e.to_string()),
                }
            } else {
                for &i in &busy {
                    if let Err(e) = self.paths[i].q.as_mut().expect("busy").flush() {
                        self.fail_path(i, e.to_string());
                    }
                }
                let busy = self.busy();
                let mut fds: Vec<libc::pollfd> = busy
                    .iter()
                    .map(|&i| libc::pollfd {
                        fd: self.paths[i].q.as_ref().expect("busy").raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    })
                    .collect();
                // SAFETY: `fds` is a valid array of `fds.len()` pollfds.
                let n =
                    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, STALL_MS) };
                if n < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(format!("poll: {e}"));
                    }
                    continue;
                }
                if n == 0 {
                    return Err(format!("no completion in {} s", STALL_MS / 1000));
                }
                for (k, &i) in busy.iter().enumerate() {
                    if fds[k].revents == 0 {
                        continue;
                    }
                    let r = self.paths[i]
                        .q
                        .as_mut()
                        .expect("busy")
                        .poll_completions(&mut self.scratch);
                    match r {
                        Ok(()) => self.complete(i, done),
                        Err(e) => self.fail_path(i, e.to_string()),
                    }
                }
            }
            if done.len() > before {
                // Retried I/Os go out again before the caller waits.
                if self.stale {
                    self.read_states();
                }
                self.drain_pending();
                return Ok(());
            }
        }
    }
    fn path_stats(&self) -> Vec<PathStat> {
        self.paths
            .iter()
            .map(|p| PathStat {
                name: p.name.clone(),
                ios: p.ios,
                failed: p.failed.clone(),
                group: (self.anagrpid != 0).then_some(self.anagrpid as u16),
                state: (self.anagrpid != 0).then(|| state_name(p.state).to_string()),
                retries: p.retries,
                failovers: 0,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ana_log_pages_are_read_by_group() {
        // Two groups: 1 (NSIDs 1, 2) optimized, 7 (none) inaccessible.
        let mut p = vec![0u8; 16 + 32 + 8 + 32];
        p[8] = 2;
        p[16..20].copy_from_slice(&1u32.to_le_bytes());
        p[20..24].copy_from_slice(&2u32.to_le_bytes());
        p[32] = 0x01;
        p[48..52].copy_from_slice(&1u32.to_le_bytes());
        p[52..56].copy_from_slice(&2u32.to_le_bytes());
        p[56..60].copy_from_slice(&7u32.to_le_bytes());
        p[72] = 0x03;
        assert_eq!(ana_state(&p, 1), Some(0x01));
        assert_eq!(ana_state(&p, 7), Some(0x03));
        assert_eq!(ana_state(&p, 2), None);
        // Cut short: no panic.
        assert_eq!(ana_state(&p[..40], 7), None);
    }
}
