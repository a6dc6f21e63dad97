//! One LU over several paths (`--multipath rr[:N]|lqd`): one session per
//! iscsi:// URL, I/Os spread by a path selection policy, failed paths
//! dropped and their I/Os re-submitted on the others.
//!
//! At open every path must report the same LU identity (the NAA designator
//! of VPD page 0x83) and capacity; anything else is refused, since
//! spreading I/O over two different LUs silently corrupts data.
//!
//! Waiting: with one live path the engine blocks in [`Connection::wait`]
//! like the single-path engine. With several it sends what each path has
//! queued, then poll(2)s the sockets of the paths with I/Os in flight and
//! drains the readable ones without blocking
//! ([`Connection::poll_completions`]).

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use initiator::{scsi, Connection, DataDir, Url};
use iscsi_wire::pdu::Itt;

use crate::engine::{open_session, task_result, Done, Engine, Io, PathStat};
use crate::spec::Multipath;

/// How long to wait for any completion before giving up.
const STALL_MS: i32 = 30_000;

struct Path {
    name: String,
    conn: Option<Connection>,
    /// ITT -> the I/O and its payload (kept for re-submission).
    inflight: HashMap<u32, (Io, Bytes)>,
    ios: u64,
    failed: Option<String>,
}

/// A LU over several paths.
pub struct MultipathEngine {
    paths: Vec<Path>,
    policy: Multipath,
    lun: u16,
    bs: u32,
    capacity: u64,
    keep_data: bool,
    rr_cur: usize,
    rr_count: u32,
    /// I/Os of failed paths waiting for a window on a live one.
    pending: VecDeque<(Io, Bytes)>,
    scratch: Vec<(Itt, initiator::TaskResult)>,
    pollfds: Vec<libc::pollfd>,
    pollidx: Vec<usize>,
}

impl MultipathEngine {
    /// Logs in on every URL and checks they are one LU.
    pub fn open(
        urls: &[Url],
        initiator_name: &str,
        keep_data: bool,
        policy: Multipath,
    ) -> Result<MultipathEngine, String> {
        let mut paths = Vec::new();
        let mut ident: Option<(String, String, u64, u32)> = None;
        let mut lun0 = 0;
        for url in urls {
            let (mut conn, lun, capacity, bs) = open_session(url, initiator_name)?;
            let id = conn
                .execute(lun, &scsi::inquiry(Some(0x83), 1024), DataDir::Read(1024))
                .map_err(|e| format!("{url}: {e}"))?;
            let naa = match (id.status, scsi::naa_id(&id.data)) {
                (Some(0), Some(n)) => n,
                _ => {
                    return Err(format!(
                        "--multipath: {url} reports no NAA designator in VPD page 0x83, so it \
                         cannot be shown to be the same LU as the other paths; refusing"
                    ))
                }
            };
            match &ident {
                None => {
                    ident = Some((url.to_string(), naa, capacity, bs));
                    lun0 = lun;
                }
                Some((first, n, c, b)) => {
                    if *n != naa {
                        return Err(format!(
                            "--multipath: {first} is LU {n} but {url} is LU {naa}: the paths \
                             are not the same LU; refusing to spread I/O over them"
                        ));
                    }
                    if (*c, *b) != (capacity, bs) {
                        return Err(format!(
                            "--multipath: {first} and {url} report the same NAA {n} but \
                             different capacities ({c} bytes in {b}-byte blocks vs {capacity} in \
                             {bs}); refusing"
                        ));
                    }
                }
            }
            paths.push(Path {
                name: url.addr(),
                conn: Some(conn),
                inflight: HashMap::new(),
                ios: 0,
                failed: None,
            });
        }
        let (_, _, capacity, bs) = ident.ok_or("--multipath: no paths")?;
        Ok(MultipathEngine {
            paths,
            policy,
            lun: lun0,
            bs,
            capacity,
            keep_data,
            rr_cur: 0,
            rr_count: 0,
            pending: VecDeque::new(),
            scratch: Vec::new(),
            pollfds: Vec::new(),
            pollidx: Vec::new(),
        })
    }

    fn ready(&self, i: usize) -> bool {
        self.paths[i].conn.as_ref().is_some_and(|c| c.can_submit())
    }

    /// The path for the next I/O, by policy, among live paths with room.
    fn pick(&mut self) -> Option<usize> {
        let n = self.paths.len();
        match self.policy {
            Multipath::RoundRobin(per) => {
                for k in 0..n {
                    let i = (self.rr_cur + k) % n;
                    if self.ready(i) {
                        if k > 0 {
                            self.rr_cur = i;
                            self.rr_count = 0;
                        }
                        self.rr_count += 1;
                        if self.rr_count >= per {
                            self.rr_count = 0;
                            self.rr_cur = (i + 1) % n;
                        }
                        return Some(i);
                    }
                }
                None
            }
            Multipath::LeastQueueDepth => (0..n)
                .filter(|&i| self.ready(i))
                .min_by_key(|&i| self.paths[i].inflight.len()),
        }
    }

    fn send(&mut self, i: usize, io: Io, payload: Bytes) {
        let lba = io.offset / u64::from(self.bs);
        let cdb = scsi::rw16(io.write, lba, io.len / self.bs, false);
        let dir = if io.write {
            DataDir::Write(payload.slice(..io.len as usize))
        } else {
            DataDir::Read(io.len)
        };
        let p = &mut self.paths[i];
        let Some(conn) = p.conn.as_mut() else {
            self.pending.push_back((io, payload));
            return;
        };
        let itt = conn.submit(self.lun, &cdb, dir);
        p.inflight.insert(itt.0, (io, payload));
    }

    /// Drops a path: its I/Os go back to the queue for the others.
    fn fail(&mut self, i: usize, why: String) {
        let p = &mut self.paths[i];
        if let Some(c) = p.conn.take() {
            c.shutdown();
        }
        p.failed = Some(format!(
            "{why} (after {} I/Os, {} re-submitted)",
            p.ios,
            p.inflight.len()
        ));
        let mut moved: Vec<(Io, Bytes)> = p.inflight.drain().map(|(_, v)| v).collect();
        moved.sort_by_key(|(io, _)| io.slot);
        self.pending.extend(moved);
    }

    fn live(&self) -> usize {
        self.paths.iter().filter(|p| p.conn.is_some()).count()
    }

    fn all_failed(&self) -> String {
        let why: Vec<String> = self
            .paths
            .iter()
            .map(|p| format!("{}: {}", p.name, p.failed.as_deref().unwrap_or("?")))
            .collect();
        format!("all {} paths failed: {}", self.paths.len(), why.join("; "))
    }

    /// Takes path `i`'s completions after a wait or poll that returned
    /// `r`; a failure fails the path, after the completions it delivered.
    fn settle(&mut self, i: usize, r: Result<(), initiator::Error>, done: &mut Vec<Done>) {
        self.collect(i, done);
        if let Err(e) = r {
            self.fail(i, e.to_string());
        }
    }

    fn collect(&mut self, i: usize, done: &mut Vec<Done>) {
        let p = &mut self.paths[i];
        for (itt, r) in self.scratch.drain(..) {
            let Some((io, _)) = p.inflight.remove(&itt.0) else {
                continue;
            };
            p.ios += 1;
            done.push(Done {
                slot: io.slot,
                result: task_result(&r),
                data: self.keep_data.then_some(r.data),
            });
        }
    }
}

impl Engine for MultipathEngine {
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn block_size(&self) -> u32 {
        self.bs
    }
    fn can_submit(&self) -> bool {
        self.pending.is_empty() && (0..self.paths.len()).any(|i| self.ready(i))
    }
    fn submit(&mut self, io: Io, payload: &Bytes) -> Result<(), String> {
        let payload = if io.write {
            payload.clone()
        } else {
            Bytes::new()
        };
        match self.pick() {
            Some(i) => self.send(i, io, payload),
            None => self.pending.push_back((io, payload)),
        }
        Ok(())
    }
    fn reap(&mut self, done: &mut Vec<Done>) -> Result<(), String> {
        if self.live() == 0 {
            return Err(self.all_failed());
        }
        while let Some((io, payload)) = self.pending.pop_front() {
            match self.pick() {
                Some(i) => self.send(i, io, payload),
                None => {
                    self.pending.push_front((io, payload));
                    break;
                }
            }
        }
        let busy: Vec<usize> = (0..self.paths.len())
            .filter(|&i| self.paths[i].conn.is_some() && !self.paths[i].inflight.is_empty())
            .collect();
        if busy.is_empty() {
            return Ok(());
        }
        if busy.len() == 1 {
            let i = busy[0];
            let r = match self.paths[i].conn.as_mut() {
                Some(c) => c.wait(&mut self.scratch),
                None => Ok(()),
            };
            self.settle(i, r, done);
            return if self.live() == 0 {
                Err(self.all_failed())
            } else {
                Ok(())
            };
        }
        // Several paths busy: send everything, then wait on any of them.
        self.pollfds.clear();
        self.pollidx.clear();
        for &i in &busy {
            let r = self.paths[i].conn.as_mut().map(|c| c.flush());
            if let Some(Err(e)) = r {
                self.fail(i, e.to_string());
                continue;
            }
            if let Some(c) = &self.paths[i].conn {
                self.pollfds.push(libc::pollfd {
                    fd: c.raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                self.pollidx.push(i);
            }
        }
        if self.pollfds.is_empty() {
            return if self.live() == 0 {
                Err(self.all_failed())
            } else {
                Ok(())
            };
        }
        // SAFETY: `pollfds` is a valid array of `len` pollfd structures that
        // lives across the call.
        let n = unsafe {
            libc::poll(
                self.pollfds.as_mut_ptr(),
                self.pollfds.len() as libc::nfds_t,
                STALL_MS,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(format!("poll: {e}"));
        }
        if n == 0 {
            return Err(format!(
                "no completion on any path for {} s",
                STALL_MS / 1000
            ));
        }
        for k in 0..self.pollfds.len() {
            if self.pollfds[k].revents == 0 {
                continue;
            }
            let i = self.pollidx[k];
            let r = match self.paths[i].conn.as_mut() {
                Some(c) => c.poll_completions(&mut self.scratch),
                None => Ok(()),
            };
            self.settle(i, r, done);
        }
        if self.live() == 0 {
            return Err(self.all_failed());
        }
        Ok(())
    }
    fn path_stats(&self) -> Vec<PathStat> {
        self.paths
            .iter()
            .map(|p| PathStat {
                name: p.name.clone(),
                ios: p.ios,
                failed: p.failed.clone(),
            })
            .collect()
    }
}
