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

use rbd_sys::{rbd_image_watcher_t, rbd_lock_mode_t, RBD_LOCK_MODE_EXCLUSIVE};

use super::{cstring, RbdBackend};
use crate::Ownership;

/// Most lock owners read at once (an exclusive lock has one).
const MAX_OWNERS: usize = 8;
/// Longest metadata value read.
const MAX_VALUE: usize = 64 << 10;

impl RbdBackend {
    /// Takes the exclusive lock if no other client holds it: true when this
    /// client holds it on return, false when another does. Fails when the
    /// image lacks the exclusive-lock feature.
    pub fn lock_acquire(&self) -> io::Result<bool> {
        // SAFETY: an open image.
        let r = unsafe { (self.api.rbd_lock_acquire)(self.image, RBD_LOCK_MODE_EXCLUSIVE) };
        match -r {
            0 => Ok(true),
            libc::EROFS | libc::EBUSY | libc::EAGAIN => Ok(false),
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
        let mut owner = 0;
        // SAFETY: an open image and an out pointer.
        let r = unsafe { (self.api.rbd_is_exclusive_lock_owner)(self.image, &mut owner) };
        if r < 0 {
            return Err(self.err("rbd_is_exclusive_lock_owner", i64::from(r)));
        }
        Ok(owner != 0)
    }

    /// The clients holding the lock, by address (empty when nobody does).
    pub fn lock_owners(&self) -> io::Result<Vec<String>> {
        let mut mode: rbd_lock_mode_t = 0;
        let mut owners: [*mut c_char; MAX_OWNERS] = [ptr::null_mut(); MAX_OWNERS];
        let mut n = MAX_OWNERS;
        // SAFETY: an open image, an array of `n` pointers and out pointers.
        let r = unsafe {
            (self.api.rbd_lock_get_owners)(self.image, &mut mode, owners.as_mut_ptr(), &mut n)
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

    /// The addresses of the clients watching the image (every client
    /// that has it open and is still connected: a dead client's watch
    /// expires after the OSDs' `osd_client_watch_timeout`, 30 s by
    /// default), as `rbd status` shows them (`127.0.0.1:0/3504330499`).
    pub fn watchers(&self) -> io::Result<Vec<String>> {
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
            let r = unsafe { (self.api.rbd_watchers_list)(self.image, list.as_mut_ptr(), &mut n) };
            if r == -libc::ERANGE && n > cap && n <= 4096 {
                cap = n;
                continue;
            }
            if r < 0 {
                return Err(self.err("rbd_watchers_list", i64::from(r)));
            }
            let n = n.min(cap);
            let addrs = list[..n]
                .iter()
                .filter(|w| !w.addr.is_null())
                .map(|w| {
                    // SAFETY: librbd filled `addr` with a C string.
                    let addr = unsafe { CStr::from_ptr(w.addr) };
                    addr.to_string_lossy().into_owned()
                })
                .collect();
            // SAFETY: the entries librbd filled, released once.
            unsafe { (self.api.rbd_watchers_list_cleanup)(list.as_mut_ptr(), n) };
            return Ok(addrs);
        }
    }

    /// Whether another client holds the exclusive lock and is still
    /// connected to the cluster (it watches the image).
    pub fn lock_owner_alive(&self) -> io::Result<bool> {
        if self.is_lock_owner()? {
            return Ok(false);
        }
        let owners = self.lock_owners()?;
        if owners.is_empty() {
            return Ok(false);
        }
        // librbd names a lock owner by its client's address.
        let watching = self.watchers()?;
        Ok(owners.iter().any(|o| watching.contains(o)))
    }

    /// Takes the exclusive lock whoever holds it: breaks (and so
    /// blocklists) every other holder, then acquires. Blocks for as long as
    /// the monitors and OSDs take (seconds).
    pub fn lock_take_over(&self) -> io::Result<()> {
        for _ in 0..5 {
            if self.is_lock_owner()? || self.lock_acquire()? {
                return Ok(());
            }
            for owner in self.lock_owners()? {
                let c = cstring("lock owner", &owner)?;
                // SAFETY: an open image and a NUL-terminated owner name.
                let r = unsafe {
                    (self.api.rbd_lock_break)(self.image, RBD_LOCK_MODE_EXCLUSIVE, c.as_ptr())
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
        if !self.is_lock_owner()? {
            return Ok(());
        }
        // SAFETY: an open image.
        let r = unsafe { (self.api.rbd_lock_release)(self.image) };
        if r < 0 && r != -libc::EINVAL {
            return Err(self.err("rbd_lock_release", i64::from(r)));
        }
        Ok(())
    }

    /// The image metadata value of `key`, if set.
    pub fn metadata_get(&self, key: &str) -> io::Result<Option<String>> {
        let k = cstring("metadata key", key)?;
        let mut buf = vec![0u8; 256];
        loop {
            let mut len = buf.len();
            // SAFETY: an open image, a NUL-terminated key and a buffer of
            // `len` bytes.
            let r = unsafe {
                (self.api.rbd_metadata_get)(
                    self.image,
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
        let (k, v) = (
            cstring("metadata key", key)?,
            cstring("metadata value", value)?,
        );
        // SAFETY: an open image and NUL-terminated strings.
        let r = unsafe { (self.api.rbd_metadata_set)(self.image, k.as_ptr(), v.as_ptr()) };
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
    fn take_over(&self) -> io::Result<()> {
        self.lock_take_over()
    }
    fn release(&self) -> io::Result<()> {
        self.lock_release()
    }
    fn other_owner_alive(&self) -> io::Result<bool> {
        self.lock_owner_alive()
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
        let mut w = self.size_watch.lock();
        // The old watch (and its helper) ends before the new one starts.
        drop(w.take());
        match super::watch::SizeWatch::start(
            self.api,
            self.image,
            &self.spec,
            self.size.clone(),
            changed,
        ) {
            Ok(sw) => *w = Some(sw),
            Err(e) => tracing::warn!(error = %e, "rbd: resizes made elsewhere will not be seen"),
        }
    }
}
