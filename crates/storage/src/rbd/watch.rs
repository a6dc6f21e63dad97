//! Following an image's size when another client changes it
//! ([`crate::Ownership::on_resized_elsewhere`]).
//!
//! Several gateways open one image (docs/GATEWAYS.md), and `rbd resize`
//! may run anywhere; each client's handle learns of a new size only when
//! it refreshes. librbd tells every client that watches the image's
//! header of a change (`rbd_update_watch`), on a thread of its own. The
//! callback only wakes a helper thread of ours: that thread asks
//! `rbd_get_size` (which refreshes the handle), publishes the size the
//! backend checks ranges against, and calls the backend's user, which
//! raises CAPACITY DATA HAS CHANGED on the LU. Nothing slow runs on
//! librbd's notification thread.
//!
//! Teardown, in order: unwatch (librbd waits for a callback in flight),
//! close the channel (the helper's loop ends), join the helper (it may be
//! in `rbd_get_size`), and only then may the image be closed. If the last
//! reference to the backend goes away on the helper itself (the LU was
//! removed while its callback ran), the helper is not joined from itself:
//! it has nothing left to do but return.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use rbd_sys::Api;

use super::Conn;
use crate::SizeChanged;

/// A registered watch; see the module docs for how it ends.
pub(super) struct SizeWatch {
    api: &'static Api,
    /// The connection watched through, open until the watch has ended.
    conn: Arc<Conn>,
    /// The watch's handle; `None` when registering it failed.
    handle: Option<u64>,
    /// The callback's argument: boxed so its address stays put.
    wake: Box<Sender<()>>,
    helper: Option<JoinHandle<()>>,
}

unsafe extern "C" fn header_changed(arg: *mut c_void) {
    // SAFETY: `arg` is the boxed sender of a `SizeWatch`, which unwatches
    // (waiting for a callback in flight) before it frees the box.
    let wake = unsafe { &*arg.cast::<Sender<()>>() };
    let _ = wake.send(());
}

impl SizeWatch {
    /// Watches the header of `conn`'s image; on a change, stores the size
    /// `rbd_get_size` reports in `size` and, when it differs, calls
    /// `changed` with it.
    pub(super) fn start(
        api: &'static Api,
        conn: Arc<Conn>,
        spec: &str,
        size: Arc<AtomicU64>,
        changed: SizeChanged,
    ) -> std::io::Result<SizeWatch> {
        let (tx, rx) = channel();
        let wake = Box::new(tx);
        let arg = std::ptr::from_ref::<Sender<()>>(&wake)
            .cast_mut()
            .cast::<c_void>();
        let image = conn.image;
        let held = conn.clone();
        let helper = std::thread::Builder::new()
            .name("rbd-size".into())
            .spawn(move || follow(api, &held, &rx, &size, &changed))?;
        let mut handle = 0u64;
        // SAFETY: an open image, an out pointer, and an argument that lives
        // until `Drop` has unwatched.
        let r = unsafe { (api.rbd_update_watch)(image, &mut handle, Some(header_changed), arg) };
        let w = SizeWatch {
            api,
            conn,
            handle: (r >= 0).then_some(handle),
            wake,
            helper: Some(helper),
        };
        if r < 0 {
            // Dropping `w` ends the helper.
            return Err(super::rbd_error(spec, "rbd_update_watch", i64::from(r)));
        }
        Ok(w)
    }
}

/// The helper's loop: one size check per burst of notifications.
fn follow(
    api: &'static Api,
    conn: &Conn,
    rx: &Receiver<()>,
    size: &AtomicU64,
    changed: &SizeChanged,
) {
    while rx.recv().is_ok() {
        while rx.try_recv().is_ok() {}
        let mut now = 0u64;
        // SAFETY: this thread holds the connection, so the image is open.
        let r = unsafe { (api.rbd_get_size)(conn.image, &mut now) };
        if r < 0 {
            tracing::warn!(errno = -r, "rbd: could not read the image's new size");
            continue;
        }
        if size.swap(now, Ordering::AcqRel) != now {
            tracing::info!(bytes = now, "rbd: the image has a new size");
            changed(now);
        }
    }
}

impl Drop for SizeWatch {
    fn drop(&mut self) {
        if let Some(h) = self.handle {
            // SAFETY: a watch registered on this open image; librbd waits
            // for a callback in flight before returning.
            unsafe { (self.api.rbd_update_unwatch)(self.conn.image, h) };
        }
        // Closing the channel ends the helper's loop.
        let (tx, _) = channel();
        drop(std::mem::replace(&mut *self.wake, tx));
        if let Some(h) = self.helper.take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}
