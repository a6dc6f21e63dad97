//! The image's exclusive lock and metadata, for gateways that share one
//! image (see `server::gateway` and docs/GATEWAYS.md).
//!
//! RBD's exclusive-lock image feature lets one client at a time write. A
//! client that takes the lock with `rbd_lock_acquire` holds it under
//! librbd's "standard" policy: it never hands the lock over when another
//! client asks, so writes from any other client fail with `EROFS` (reads
//! need no lock). Another client can only take the lock by breaking it
//! (`rbd_lock_break`), which first blocklists the holder at the OSDs
//! (`rbd_blocklist_on_break_lock`, on by default): from then on every
//! request of the old holder fails with `ESHUTDOWN`, so a gateway that was
//! only slow or cut off from its initiators cannot write after a takeover.
//!
//! Metadata (`rbd_metadata_get`/`_set`) is a small key-value store kept in
//! the image header; gateways record there which target port group owns
//! the image, so every gateway reports the same ALUA states.

use std::ffi::{c_char, CStr};
use std::io;
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rbd_sys::{rbd_image_watcher_t, rbd_lock_mode_t, RBD_LOCK_MODE_EXCLUSIVE};

use super::notify::{parse_reply, Reply, Watch};
use super::watch::SizeWatch;
use super::{cstring, Conn, RbdBackend};
use crate::{Liveness, Ownership};

/// Most lock owners read at once (an exclusive lock has one).
const MAX_OWNERS: usize = 8;
/// Longest metadata value read.
const MAX_VALUE: usize = 64 << 10;

impl RbdBackend {
    /// Takes the exclusive lock if no other client holds it: true when this
    /// client holds it on return, false when another does. Fails when the
    /// image lacks the exclusive-lock feature.
    ///
    /// librbd's own acquire, when another client holds the lock, asks that
    /// client to hand it over (a notify) and waits for the answer, which
    /// a dead or hung holder never gives: the call would block for the
    /// notify's timeout (30 s). So a lock with a holder is reported held
    /// without asking (the holders keep it under the standard policy).
    pub fn lock_acquire(&self) -> io::Result<bool> {
        Ok(self.acquire_or_holders()?.is_ok())
    }

    /// [`RbdBackend::lock_acquire`], saying who holds the lock when it is
    /// not this client (empty when another took it meanwhile).
    fn acquire_or_holders(&self) -> io::Result<Result<(), Vec<String>>> {
        if self.is_lock_owner()? {
            return Ok(Ok(()));
        }
        let holders = self.lock_owners()?;
        if !holders.is_empty() {
            return Ok(Err(holders));
        }
        let conn = self.conn();
        // SAFETY: an open image.
        let r = unsafe { (self.api.rbd_lock_acquire)(conn.image, RBD_LOCK_MODE_EXCLUSIVE) };
        match -r {
            0 => Ok(Ok(())),
            libc::EROFS | libc::EBUSY | libc::EAGAIN => Ok(Err(Vec::new())),
            libc::EINVAL => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "rbd {}: the image has no exclusive-lock feature (rbd feature enable {} \
                     exclusive-lock)",
                    self.spec, self.spec
                ),
            )),
            _ => Err(self.err("rbd_lock_acquire", i64::from(r))),
        }
    }

    /// Whether this client holds the exclusive lock.
    pub fn is_lock_owner(&self) -> io::Result<bool> {
        let conn = self.conn();
        let mut owner = 0;
        // SAFETY: an open image and an out pointer.
        let r = unsafe { (self.api.rbd_is_exclusive_lock_owner)(conn.image, &mut owner) };
        if r < 0 {
            return Err(self.err("rbd_is_exclusive_lock_owner", i64::from(r)));
        }
        Ok(owner != 0)
    }

    /// The clients holding the lock, by address (empty when nobody does).
    pub fn lock_owners(&self) -> io::Result<Vec<String>> {
        let conn = self.conn();
        let mut mode: rbd_lock_mode_t = 0;
        let mut owners: [*mut c_char; MAX_OWNERS] = [ptr::null_mut(); MAX_OWNERS];
        let mut n = MAX_OWNERS;
        // SAFETY: an open image, an array of `n` pointers and out pointers.
        let r = unsafe {
            (self.api.rbd_lock_get_owners)(conn.image, &mut mode, owners.as_mut_ptr(), &mut n)
        };
        if r == -libc::ENOENT {
            return Ok(Vec::new());
        }
        if r < 0 {
            return Err(self.err("rbd_lock_get_owners", i64::from(r)));
        }
        let n = n.min(MAX_OWNERS);
        let list = owners[..n]
            .iter()
            .filter(|p| !p.is_null())
            // SAFETY: librbd filled the first `n` entries with C strings.
            .map(|&p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            .collect();
        // SAFETY: the array and count librbd filled, released once.
        unsafe { (self.api.rbd_lock_get_owners_cleanup)(owners.as_mut_ptr(), n) };
        Ok(list)
    }

    /// The clients watching the image (every client that has it open and
    /// is still connected: a dead client's watch expires after the OSDs'
    /// `osd_client_watch_timeout`, 30 s by default): address, as `rbd
    /// status` shows it (`127.0.0.1:0/3504330499`), and the watch.
    pub fn watchers(&self) -> io::Result<Vec<(String, Watch)>> {
        let conn = self.conn();
        let mut cap = 16usize;
        loop {
            let empty = rbd_image_watcher_t {
                addr: ptr::null_mut(),
                id: 0,
                cookie: 0,
            };
            let mut list = vec![empty; cap];
            let mut n = cap;
            // SAFETY: an open image, an array of `n` entries, an out count.
            let r = unsafe { (self.api.rbd_watchers_list)(conn.image, list.as_mut_ptr(), &mut n) };
            if r == -libc::ERANGE && n > cap && n <= 4096 {
                cap = n;
                continue;
            }
            if r < 0 {
                return Err(self.err("rbd_watchers_list", i64::from(r)));
            }
            let n = n.min(cap);
            let found = list[..n]
                .iter()
                .filter(|w| !w.addr.is_null())
                .map(|w| {
                    // SAFETY: librbd filled `addr` with a C string.
                    let addr = unsafe { CStr::from_ptr(w.addr) };
                    (addr.to_string_lossy().into_owned(), (w.id as u64, w.cookie))
                })
                .collect();
            // SAFETY: the entries librbd filled, released once.
            unsafe { (self.api.rbd_watchers_list_cleanup)(list.as_mut_ptr(), n) };
            return Ok(found);
        }
    }

    /// Notifies every watcher of the image's header and waits for their
    /// acknowledgements, at most `within` (see `notify`).
    fn notify_watchers(&self, within: Duration) -> io::Result<Reply> {
        let conn = self.conn();
        let mut buf: *mut c_char = ptr::null_mut();
        let mut len = 0usize;
        let ms = u64::try_from(within.as_millis()).unwrap_or(u64::MAX).max(1);
        // SAFETY: a live ioctx, a NUL-terminated object name, an empty
        // payload, and out pointers for the reply librados allocates.
        let r = unsafe {
            (self.api.rados_notify2)(
                conn.ioctx,
                conn.header.as_ptr(),
                ptr::null(),
                0,
                ms,
                &mut buf,
                &mut len,
            )
        };
        let reply = (!buf.is_null()).then(|| {
            // SAFETY: librados allocated `len` bytes at `buf`.
            let bytes = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
            let parsed = parse_reply(bytes);
            // SAFETY: the reply buffer, released once.
            unsafe { (self.api.rados_buffer_free)(buf) };
            parsed
        });
        if r < 0 && r != -libc::ETIMEDOUT {
            return Err(self.err("notify (rados_notify2)", i64::from(r)));
        }
        match reply {
            Some(Some(reply)) => Ok(reply),
            _ => Err(io::Error::other(format!(
                "rbd {}: the notify reply could not be read",
                self.spec
            ))),
        }
    }

    /// Whether another client holds the exclusive lock and answers a
    /// notify within `within` (see `notify`). The probe only counts when
    /// this client's own watch answered it too; otherwise it is an error
    /// (nothing can be concluded).
    pub fn lock_owner_liveness(&self, within: Duration) -> io::Result<Liveness> {
        if self.is_lock_owner()? {
            return Ok(Liveness::NoOtherOwner);
        }
        let owners = self.lock_owners()?;
        if owners.is_empty() {
            return Ok(Liveness::NoOtherOwner);
        }
        // librbd names a lock owner by its client's address.
        let theirs: Vec<Watch> = self
            .watchers()?
            .into_iter()
            .filter(|(addr, _)| owners.contains(addr))
            .map(|(_, w)| w)
            .collect();
        let holder = owners.join(",");
        if theirs.is_empty() {
            // No longer connected to the cluster at all.
            return Ok(Liveness::Silent(holder));
        }
        let reply = self.notify_watchers(within)?;
        // SAFETY: a connected cluster handle.
        let me = unsafe { (self.api.rados_get_instance_id)(self.conn().cluster) };
        if !reply.acked.iter().any(|&(gid, _)| gid == me) {
            return Err(io::Error::other(format!(
                "rbd {}: this client's own watch did not answer the liveness notify                  (acked {:?}, missed {:?})",
                self.spec, reply.acked, reply.missed
            )));
        }
        Ok(if theirs.iter().any(|w| reply.acked.contains(w)) {
            Liveness::Answers
        } else {
            Liveness::Silent(holder)
        })
    }

    /// Watches the header through `conn` for `changed` and keeps the watch
    /// in `slot`; a failure to watch is logged, and the LU then keeps the
    /// size it had.
    fn watch_size(
        &self,
        slot: &mut Option<(SizeWatch, crate::SizeChanged)>,
        conn: Arc<Conn>,
        changed: crate::SizeChanged,
    ) {
        match SizeWatch::start(
            self.api,
            conn,
            &self.spec,
            self.size.clone(),
            changed.clone(),
        ) {
            Ok(sw) => *slot = Some((sw, changed)),
            Err(e) => tracing::warn!(error = %e, "rbd: resizes made elsewhere will not be seen"),
        }
    }

    /// Opens a new connection to the cluster and the image, and moves
    /// every later call (and the size watch) to it; the old one closes
    /// once the requests still using it have ended. A blocklisted client
    /// instance never works again: this is how a fenced gateway becomes a
    /// usable standby.
    pub fn reconnect_now(&self) -> io::Result<()> {
        let conn = Arc::new(Conn::open(self.api, &self.opts)?);
        let mut now = 0u64;
        // SAFETY: an open image; an out pointer to a local.
        let r = unsafe { (self.api.rbd_get_size)(conn.image, &mut now) };
        if r < 0 {
            return Err(self.err("get size", i64::from(r)));
        }
        let old = std::mem::replace(&mut *self.conn.write(), conn.clone());
        let mut w = self.size_watch.lock();
        if let Some((watch, changed)) = w.take() {
            // The old watch (and its helper) ends before the new one starts.
            drop(watch);
            self.watch_size(&mut w, conn, changed.clone());
            if self.size.swap(now, Ordering::AcqRel) != now {
                changed(now);
            }
        } else {
            self.size.store(now, Ordering::Release);
        }
        drop(w);
        tracing::info!(image = %self.spec, "rbd: connected to the cluster again");
        drop(old);
        Ok(())
    }

    /// Takes the exclusive lock: breaks (and so blocklists) every other
    /// holder, then acquires. With `only_from`, only while the holders are
    /// still those (their addresses joined by `,`, as
    /// [`RbdBackend::lock_owner_liveness`] names them; `""`: nobody):
    /// false, nothing broken, when they changed. Blocks for as long as the
    /// monitors and OSDs take (seconds).
    pub fn lock_take_over(&self, only_from: Option<&str>) -> io::Result<bool> {
        let conn = self.conn();
        for _ in 0..5 {
            // The holders are broken first: asking a dead one to hand the
            // lock over would wait for its answer (see `lock_acquire`).
            let Err(owners) = self.acquire_or_holders()? else {
                return Ok(true);
            };
            if only_from.is_some_and(|h| h != owners.join(",")) {
                return Ok(false);
            }
            for owner in owners {
                let c = cstring("lock owner", &owner)?;
                // SAFETY: an open image and a NUL-terminated owner name.
                let r = unsafe {
                    (self.api.rbd_lock_break)(conn.image, RBD_LOCK_MODE_EXCLUSIVE, c.as_ptr())
                };
                // ENOENT: released or broken meanwhile.
                if r < 0 && r != -libc::ENOENT {
                    return Err(self.err(&format!("rbd_lock_break {owner}"), i64::from(r)));
                }
            }
        }
        Err(io::Error::other(format!(
            "rbd {}: the exclusive lock was taken by another client each time it was broken",
            self.spec
        )))
    }

    /// Gives the exclusive lock up (nothing when not held).
    pub fn lock_release(&self) -> io::Result<()> {
        let conn = self.conn();
        if !self.is_lock_owner()? {
            return Ok(());
        }
        // SAFETY: an open image.
        let r = unsafe { (self.api.rbd_lock_release)(conn.image) };
        if r < 0 && r != -libc::EINVAL {
            return Err(self.err("rbd_lock_release", i64::from(r)));
        }
        Ok(())
    }

    /// The image metadata value of `key`, if set.
    pub fn metadata_get(&self, key: &str) -> io::Result<Option<String>> {
        let conn = self.conn();
        let k = cstring("metadata key", key)?;
        let mut buf = vec![0u8; 256];
        loop {
            let mut len = buf.len();
            // SAFETY: an open image, a NUL-terminated key and a buffer of
            // `len` bytes.
            let r = unsafe {
                (self.api.rbd_metadata_get)(
                    conn.image,
                    k.as_ptr(),
                    buf.as_mut_ptr().cast::<c_char>(),
                    &mut len,
                )
            };
            if r == -libc::ENOENT {
                return Ok(None);
            }
            if r == -libc::ERANGE && len > buf.len() && len <= MAX_VALUE {
                buf.resize(len, 0);
                continue;
            }
            if r < 0 {
                return Err(self.err(&format!("rbd_metadata_get {key}"), i64::from(r)));
            }
            let v = &buf[..len.min(buf.len())];
            let v = v.split(|&b| b == 0).next().unwrap_or_default();
            return Ok(Some(String::from_utf8_lossy(v).into_owned()));
        }
    }

    /// Sets image metadata `key` to `value`.
    pub fn metadata_set(&self, key: &str, value: &str) -> io::Result<()> {
        let conn = self.conn();
        let (k, v) = (
            cstring("metadata key", key)?,
            cstring("metadata value", value)?,
        );
        // SAFETY: an open image and NUL-terminated strings.
        let r = unsafe { (self.api.rbd_metadata_set)(conn.image, k.as_ptr(), v.as_ptr()) };
        if r < 0 {
            return Err(self.err(&format!("rbd_metadata_set {key}"), i64::from(r)));
        }
        Ok(())
    }
}

/// The exclusive lock is the owner arbitration; notes are image metadata.
impl Ownership for RbdBackend {
    fn acquire(&self) -> io::Result<bool> {
        self.lock_acquire()
    }
    fn is_owner(&self) -> io::Result<bool> {
        self.is_lock_owner()
    }
    fn take_over(&self, only_from: Option<&str>) -> io::Result<bool> {
        self.lock_take_over(only_from)
    }
    fn release(&self) -> io::Result<()> {
        self.lock_release()
    }
    fn owner_liveness(&self, within: Duration) -> io::Result<Liveness> {
        self.lock_owner_liveness(within)
    }
    fn reconnect(&self) -> io::Result<()> {
        self.reconnect_now()
    }
    fn note(&self, key: &str) -> io::Result<Option<String>> {
        self.metadata_get(key)
    }
    fn set_note(&self, key: &str, value: &str) -> io::Result<()> {
        self.metadata_set(key, value)
    }
    /// Watches the image's header (see `watch`); a failure to watch is
    /// logged, and the LU then keeps the size it had.
    fn on_resized_elsewhere(&self, changed: crate::SizeChanged) {
        let conn = self.conn();
        let mut w = self.size_watch.lock();
        // The old watch (and its helper) ends before the new one starts.
        drop(w.take());
        self.watch_size(&mut w, conn, changed);
    }
}
