//! A namespace through the built-in NVMe/TCP host (`initiator::nvme`):
//! one controller and one I/O queue per job, commands pipelined up to the
//! job's depth. Reads, writes and trims (Dataset Management, deallocate).

use bytes::Bytes;
use initiator::nvme::{host_nqn, sqe, Completion, Controller, NvmeQueue, NvmeUrl};

use crate::engine::{Done, Engine, Io, Op};

/// Most queue entries asked of the controller.
const MAX_ENTRIES: u32 = 1024;

/// A namespace over NVMe/TCP.
pub struct NvmeEngine {
    /// Kept open: the admin queue is the controller's life.
    _ctrl: Controller,
    q: NvmeQueue,
    nsid: u32,
    bs: u32,
    capacity: u64,
    keep_data: bool,
    /// The slot of each command in flight, by CID.
    inflight: Vec<usize>,
    scratch: Vec<Completion>,
}

impl NvmeEngine {
    /// Connects to `url`'s subsystem (host NQN `hostnqn` when it is one,
    /// else a fresh UUID form) and opens one I/O queue for `iodepth`
    /// commands.
    pub fn open(
        url: &NvmeUrl,
        hostnqn: &str,
        keep_data: bool,
        iodepth: u32,
        busy_poll: std::time::Duration,
    ) -> Result<Self, String> {
        let host = if hostnqn.starts_with("nqn.") {
            hostnqn.to_owned()
        } else {
            host_nqn(&initiator::random_bytes::<16>())
        };
        let err = |e: initiator::Error| format!("{url}: {e}");
        let mut ctrl =
            Controller::connect(url.addr, &url.subnqn, &host, url.digests, 1).map_err(err)?;
        let ns = ctrl.namespace(url.nsid).map_err(err)?;
        let entries = (iodepth + 1).clamp(2, MAX_ENTRIES) as u16;
        let mut q = ctrl.io_queue(1, entries).map_err(err)?;
        q.set_busy_poll(busy_poll);
        Ok(NvmeEngine {
            _ctrl: ctrl,
            q,
            nsid: url.nsid,
            bs: ns.block_size,
            capacity: ns.blocks * u64::from(ns.block_size),
            keep_data,
            inflight: vec![usize::MAX; usize::from(entries)],
            scratch: Vec::new(),
        })
    }
}

/// Queues on `q` the NVM command for `io` on namespace `nsid` of
/// `bs`-byte blocks (read, write, or deallocate); its CID.
pub(crate) fn submit_io(
    q: &mut NvmeQueue,
    nsid: u32,
    bs: u32,
    io: Io,
    payload: &Bytes,
) -> Result<u16, initiator::Error> {
    let lba = io.offset / u64::from(bs);
    let nlb = io.len / bs;
    let (lo, hi) = (lba as u32, (lba >> 32) as u32);
    let (cmd, write, read_len) = match io.op {
        Op::Read => (
            sqe(0x02, nsid, &[(10, lo), (11, hi), (12, nlb - 1)]),
            Bytes::new(),
            io.len,
        ),
        Op::Write => (
            sqe(0x01, nsid, &[(10, lo), (11, hi), (12, nlb - 1)]),
            payload.slice(..io.len as usize),
            0,
        ),
        Op::Trim => {
            let mut r = vec![0u8; 16];
            r[4..8].copy_from_slice(&nlb.to_le_bytes());
            r[8..16].copy_from_slice(&lba.to_le_bytes());
            // Dataset Management, one range, deallocate.
            (sqe(0x09, nsid, &[(10, 0), (11, 1 << 2)]), Bytes::from(r), 0)
        }
    };
    q.submit(cmd, write, read_len)
}

impl Engine for NvmeEngine {
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn block_size(&self) -> u32 {
        self.bs
    }
    fn can_submit(&self) -> bool {
        self.q.can_submit()
    }
    fn submit(&mut self, io: Io, payload: &Bytes) -> Result<(), String> {
        let cid =
            submit_io(&mut self.q, self.nsid, self.bs, io, payload).map_err(|e| e.to_string())?;
        self.inflight[usize::from(cid)] = io.slot;
        Ok(())
    }
    fn reap(&mut self, done: &mut Vec<Done>) -> Result<(), String> {
        if self.q.outstanding() == 0 {
            return Ok(());
        }
        self.q.wait(&mut self.scratch).map_err(|e| e.to_string())?;
        for c in self.scratch.drain(..) {
            let Some(slot) = self
                .inflight
                .get_mut(usize::from(c.cid))
                .map(|s| std::mem::replace(s, usize::MAX))
                .filter(|&s| s != usize::MAX)
            else {
                continue;
            };
            done.push(Done {
                slot,
                result: c.ok().map_err(|e| e.to_string()),
                data: self.keep_data.then_some(c.data),
            });
        }
        Ok(())
    }
}
