//! Files and block devices through io_uring (fio's `io_uring` engine): up
//! to `iodepth` reads and writes in flight per job, submitted in one
//! `io_uring_enter` per batch, into 4 KiB-aligned buffers so `--direct`
//! (O_DIRECT) works. Trims are done at submission (a punched hole or
//! BLKDISCARD), as fio's io_uring engine does them.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use bytes::Bytes;
use io_uring::{opcode, types, IoUring};

use crate::engine::{is_block_device, open_file, trim_range, AlignedBuf, Done, Engine, Io, Op};

/// An io_uring engine over one file or block device.
pub struct UringEngine {
    file: File,
    blockdev: bool,
    /// Trims done at submission, handed back at the next reap.
    trimmed: Vec<Done>,
    ring: IoUring,
    capacity: u64,
    max_io: usize,
    bufs: AlignedBuf,
    /// Per slot: (length, is a write) of the I/O in flight.
    lens: Vec<(u32, bool)>,
    inflight: usize,
    depth: usize,
    keep_data: bool,
}

impl UringEngine {
    /// Opens (or with `create_size`, creates) a file or block device and
    /// sets up a ring of `depth` entries. Fails when the kernel has no
    /// io_uring (or it is forbidden, as in some containers).
    pub fn open(
        path: &Path,
        direct: bool,
        create_size: Option<u64>,
        max_io: u32,
        depth: u32,
        keep_data: bool,
    ) -> Result<Self, String> {
        let ring = IoUring::new(depth.next_power_of_two().clamp(1, 32768))
            .map_err(|e| format!("io_uring unavailable: {e}"))?;
        let (file, capacity) = open_file(path, direct, create_size)?;
        let max_io = (max_io as usize).next_multiple_of(4096);
        Ok(UringEngine {
            blockdev: is_block_device(&file),
            trimmed: Vec::new(),
            file,
            ring,
            capacity,
            max_io,
            bufs: AlignedBuf::new(max_io * depth as usize),
            lens: vec![(0, false); depth as usize],
            inflight: 0,
            depth: depth as usize,
            keep_data,
        })
    }
}

impl Engine for UringEngine {
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn block_size(&self) -> u32 {
        512
    }
    fn can_submit(&self) -> bool {
        // A trim is done at submission: hand it back before the next I/O
        // so its latency is its own, not the wait for a full batch.
        self.trimmed.is_empty() && self.inflight < self.depth
    }
    fn submit(&mut self, io: Io, payload: &Bytes) -> Result<(), String> {
        if io.slot >= self.depth || io.len as usize > self.max_io {
            return Err(format!(
                "io_uring: slot {} or length {} out of range",
                io.slot, io.len
            ));
        }
        if io.op == Op::Trim {
            let result = trim_range(&self.file, self.blockdev, io.offset, u64::from(io.len))
                .map_err(|e| e.to_string());
            self.trimmed.push(Done {
                slot: io.slot,
                result,
                data: None,
            });
            return Ok(());
        }
        let write = io.op == Op::Write;
        let start = io.slot * self.max_io;
        let len = io.len as usize;
        let buf = &mut self.bufs.slice(start + len)[start..];
        if write {
            buf.copy_from_slice(&payload[..len]);
        }
        let fd = types::Fd(self.file.as_raw_fd());
        let ptr = buf.as_mut_ptr();
        let sqe = if write {
            opcode::Write::new(fd, ptr, io.len)
                .offset(io.offset)
                .build()
        } else {
            opcode::Read::new(fd, ptr, io.len).offset(io.offset).build()
        }
        .user_data(io.slot as u64);
        self.lens[io.slot] = (io.len, write);
        // SAFETY: the buffer lives in `self.bufs`, owned by this engine; the
        // job loop reuses a slot only after its completion was reaped, and
        // Drop reaps everything in flight before the buffers and the file
        // are freed.
        let pushed = unsafe { self.ring.submission().push(&sqe) };
        if pushed.is_err() {
            self.ring
                .submit()
                .map_err(|e| format!("io_uring submit: {e}"))?;
            // SAFETY: as above.
            unsafe { self.ring.submission().push(&sqe) }
                .map_err(|_| "io_uring: submission queue full".to_string())?;
        }
        self.inflight += 1;
        Ok(())
    }
    fn reap(&mut self, done: &mut Vec<Done>) -> Result<(), String> {
        if !self.trimmed.is_empty() {
            done.append(&mut self.trimmed);
            // Collect what else completed, without waiting.
            if self.inflight > 0 {
                self.ring
                    .submit()
                    .map_err(|e| format!("io_uring_enter: {e}"))?;
                self.drain(done);
            }
            return Ok(());
        }
        if self.inflight == 0 {
            return Ok(());
        }
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("io_uring_enter: {e}")),
            }
        }
        self.drain(done);
        Ok(())
    }
}

impl UringEngine {
    /// Hands back every completion queued.
    fn drain(&mut self, done: &mut Vec<Done>) {
        let mut cq = self.ring.completion();
        cq.sync();
        for cqe in &mut cq {
            let slot = cqe.user_data() as usize;
            let (len, write) = self.lens.get(slot).copied().unwrap_or((0, false));
            let res = cqe.result();
            let result = if res < 0 {
                Err(std::io::Error::from_raw_os_error(-res).to_string())
            } else if res as u32 != len {
                Err(format!(
                    "short {}: {res} of {len} bytes",
                    if write { "write" } else { "read" }
                ))
            } else {
                Ok(())
            };
            let data = (self.keep_data && !write && result.is_ok()).then(|| {
                let start = slot * self.max_io;
                Bytes::copy_from_slice(&self.bufs.slice(start + len as usize)[start..])
            });
            self.inflight -= 1;
            done.push(Done { slot, result, data });
        }
    }
}

impl Drop for UringEngine {
    fn drop(&mut self) {
        // Wait for what is still in flight so the kernel never writes into
        // freed buffers.
        while self.inflight > 0 {
            let mut v = Vec::new();
            if self.reap(&mut v).is_err() {
                break;
            }
        }
    }
}
