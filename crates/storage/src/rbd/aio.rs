//! Completion-driven reads and writes: the primitive of a future
//! non-blocking data path, where the connection's event loop submits a
//! READ or WRITE to librbd and goes on serving other commands, and the
//! result comes back through a callback instead of a thread waiting for it.
//!
//! ```text
//!   event loop                 librbd                 librbd callback thread
//!   submit_read(off, len, done)
//!     Box<Pending{buf, done}> ──► rbd_aio_read ──► OSD ──► complete(c, arg)
//!     returns at once                                       Box::from_raw(arg)
//!                                                           rbd_aio_get_return_value
//!                                                           rbd_aio_release
//!                                                           done(Ok(bytes))  (must not block:
//!                                                                             e.g. an mpsc send
//!                                                                             that wakes the loop)
//! ```
//!
//! `done` is called exactly once: on librbd's callback thread when the
//! request was submitted, or on the caller's thread, before the submit call
//! returns, when it was refused (range, errno). It must be quick and must
//! not block: it runs on the thread that completes every request of the
//! process. A panic in it is caught (unwinding into C is not allowed) and
//! the request's result is lost, so it must not panic either.

use std::ffi::{c_char, c_void};
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::Arc;

use bytes::Bytes;
use rbd_sys::{rbd_completion_t, Api};

use super::{rbd_error, Conn, RbdBackend};
use crate::{check_range, AsyncIo, BlockBackend, ReadDone, WriteDone};

enum Op {
    Read { buf: Vec<u8>, done: ReadDone },
    Write { _data: Bytes, done: WriteDone },
}

/// What a request owns until it completes: its buffer and its callback.
/// Boxed and handed to librbd as the completion's argument.
struct Pending {
    api: &'static Api,
    /// The connection the request went through, open until it completes.
    _conn: Arc<Conn>,
    spec: Arc<str>,
    offset: u64,
    op: Op,
}

impl Pending {
    /// Delivers librbd's return value `r` to the callback.
    fn finish(self, r: i64) {
        let Pending {
            spec, offset, op, ..
        } = self;
        match op {
            Op::Read { mut buf, done } => {
                let len = buf.capacity();
                let res = if r < 0 {
                    Err(rbd_error(&spec, "read", r))
                } else if usize::try_from(r).ok() != Some(len) {
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("rbd {spec}: short read at {offset}: {r} of {len} bytes"),
                    ))
                } else {
                    // SAFETY: librbd wrote all `len` bytes of the capacity
                    // (the return value says so) before completing.
                    unsafe { buf.set_len(len) };
                    Ok(Bytes::from(buf))
                };
                done(res);
            }
            Op::Write { done, .. } => {
                done(if r < 0 {
                    Err(rbd_error(&spec, "write", r))
                } else {
                    Ok(())
                });
            }
        }
    }

    /// Fails the request before librbd saw it.
    fn refuse(self, e: io::Error) {
        match self.op {
            Op::Read { done, .. } => done(Err(e)),
            Op::Write { done, .. } => done(Err(e)),
        }
    }
}

/// librbd's completion callback (`rbd_callback_t`).
unsafe extern "C" fn complete(c: rbd_completion_t, arg: *mut c_void) {
    // SAFETY: `arg` is the `Box<Pending>` leaked by `submit`, and librbd
    // calls the callback exactly once per completion.
    let p = unsafe { Box::from_raw(arg.cast::<Pending>()) };
    // SAFETY: `c` is complete (we are in its callback); it is released
    // here, once, and not used afterwards (as QEMU's rbd driver does).
    let r = unsafe {
        let r = (p.api.rbd_aio_get_return_value)(c);
        (p.api.rbd_aio_release)(c);
        r
    };
    // Dropping the request may drop the last holder of an old connection,
    // which must not be closed on this (librbd's) thread.
    super::ON_LIBRBD_THREAD.with(|f| f.set(true));
    let _ = catch_unwind(AssertUnwindSafe(move || p.finish(r as i64)));
    super::ON_LIBRBD_THREAD.with(|f| f.set(false));
}

impl AsyncIo for RbdBackend {
    fn submit_read(&self, offset: u64, len: usize, done: ReadDone) {
        let mut buf: Vec<u8> = Vec::with_capacity(len);
        // The heap block does not move when the Vec does.
        let ptr = buf.as_mut_ptr().cast::<c_char>();
        let conn = self.conn();
        let image = conn.image;
        let p = Box::new(Pending {
            api: self.api,
            _conn: conn,
            spec: self.spec.clone(),
            offset,
            op: Op::Read { buf, done },
        });
        if let Err(e) = check_range(self.size(), offset, len) {
            return p.refuse(e);
        }
        let api = self.api;
        self.submit(p, |c| {
            // SAFETY: the buffer has `len` bytes of capacity and lives in
            // the Pending that librbd hands back at completion, so it stays
            // valid and unmoved until then.
            unsafe { (api.rbd_aio_read)(image, offset, len, ptr, c) }
        });
    }

    /// Stable when `done` gets `Ok` whatever `fua` says: librbd's cache is
    /// off (module docs).
    fn submit_write(&self, offset: u64, data: Bytes, _fua: bool, done: WriteDone) {
        let len = data.len();
        let ptr = data.as_ptr().cast::<c_char>();
        let conn = self.conn();
        let image = conn.image;
        let p = Box::new(Pending {
            api: self.api,
            _conn: conn,
            spec: self.spec.clone(),
            offset,
            op: Op::Write { _data: data, done },
        });
        if let Err(e) = check_range(self.size(), offset, len) {
            return p.refuse(e);
        }
        let api = self.api;
        self.submit(p, |c| {
            // SAFETY: `ptr` points into the `Bytes` kept in the Pending until
            // completion; `Bytes` never moves its data.
            unsafe { (api.rbd_aio_write)(image, offset, len, ptr, c) }
        });
    }
}

impl RbdBackend {
    /// Creates a completion carrying `p` and submits with `start`; on any
    /// refusal `p` is failed on this thread.
    fn submit(&self, p: Box<Pending>, start: impl FnOnce(rbd_completion_t) -> i32) {
        // Leaked before submission: the callback may run (and free it) on
        // another thread before `start` even returns.
        let arg = Box::into_raw(p);
        let mut c: rbd_completion_t = ptr::null_mut();
        // SAFETY: `arg` is a live leaked Box; an out pointer.
        let r = unsafe {
            (self.api.rbd_aio_create_completion)(arg.cast::<c_void>(), Some(complete), &mut c)
        };
        if r < 0 {
            // SAFETY: no completion exists, so nothing else owns `arg`.
            let p = unsafe { Box::from_raw(arg) };
            let e = rbd_error(&self.spec, "rbd_aio_create_completion", i64::from(r));
            return p.refuse(e);
        }
        let r = start(c);
        if r < 0 {
            // SAFETY: librbd refused the request, so the completion never
            // fires and `arg` is ours again; the completion is released once.
            let p = unsafe {
                (self.api.rbd_aio_release)(c);
                Box::from_raw(arg)
            };
            let e = rbd_error(&self.spec, "submit", i64::from(r));
            p.refuse(e);
        }
        // Otherwise librbd owns the request now; `complete` frees it.
    }
}
