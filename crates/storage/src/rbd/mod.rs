//! The Ceph RBD backend: a LUN whose blocks live in an RBD image.
//!
//! librados and librbd are loaded at run time (crate `rbd-sys`), so this
//! module builds everywhere; [`RbdBackend::open`] fails with a message
//! naming the missing library on a machine without them.
//!
//! # How the contract is kept
//!
//! | call           | librbd                                                        |
//! |----------------|---------------------------------------------------------------|
//! | `read_at`      | `rbd_aio_read`, waited for                                    |
//! | `write_at`     | `rbd_aio_write`, waited for                                   |
//! | `flush`        | `rbd_aio_flush`                                               |
//! | `write_zeroes` | `rbd_aio_write_zeroes` with `THICK_PROVISION` (stays allocated)|
//! | `discard`      | `rbd_aio_write_zeroes` without it: whole objects are removed, |
//! |                | partial ones zeroed (`rbd_aio_discard` may skip partial ranges|
//! |                | under `rbd_discard_granularity_bytes`, leaving old data)      |
//! | `allocation`   | `rbd_diff_iterate2` from the image's creation                 |
//! | `resize`       | `rbd_resize`                                                  |
//! | `on_resized_elsewhere` | `rbd_update_watch`, then `rbd_get_size` (see `watch`)  |
//!
//! **Durability.** An OSD acknowledges a write once it is stable on every
//! replica, so without librbd's client cache every acknowledged write is
//! stable. The cache (`rbd_cache`, on by default in Ceph, switching to
//! write-back after the first flush) is therefore forced off when the
//! image is opened, whatever ceph.conf says: write-through is then true,
//! and write-back (WCE=1, opt-in) is honest too, since nothing is ever
//! held back; FUA needs no extra work.
//!
//! **Blocking.** Each call submits an asynchronous request and waits for
//! its completion, so [`Caps::may_block`] is true and the target
//! runs it on its I/O thread pool. Many calls may be in flight at once:
//! librbd's image handle is safe to use from several threads.
//! Its [`crate::AsyncIo`] (`submit_read`, `submit_write`) is the
//! completion-driven alternative (nothing waits; a callback gets the
//! result), the primitive of a non-blocking data path: see `aio`. Whoever
//! submits keeps the backend alive until every callback has run.
//!
//! **Errors.** A negative errno from librbd becomes an `io::Error` with
//! that OS error (so `ENOSPC`/`EDQUOT` report space allocation failure),
//! except `EINVAL`, which becomes an error of kind `Other`: the SCSI layer
//! reads `InvalidInput` as "LBA out of range", which this module checks
//! itself before calling librbd; and `ESHUTDOWN` (blocklisted), `EROFS`
//! (exclusive lock held by another client) and `ETIMEDOUT` (no answer
//! within [`RbdOptions::op_timeout`]), which become
//! [`crate::NotAccessible`]: another gateway owns the image (see `lock`).

use std::ffi::{c_char, c_int, c_void, CString};
use std::io;
use std::path::PathBuf;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use rbd_sys::{rados_ioctx_t, rados_t, rbd_completion_t, rbd_image_t, Api};

use crate::{
    check_range, check_range_u64, AsyncIo, BlockBackend, Caps, Extent, FastPaths, WriteCache,
};

mod aio;
mod lock;
mod notify;
mod watch;

/// Where an RBD image is and how to reach its cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RbdOptions {
    /// The pool.
    pub pool: String,
    /// The image in the pool.
    pub image: String,
    /// The RADOS namespace of the image, if any.
    pub namespace: Option<String>,
    /// Open this snapshot of the image (read-only), if any.
    pub snapshot: Option<String>,
    /// ceph.conf to read; none: librados' default search (`$CEPH_CONF`,
    /// `/etc/ceph/ceph.conf`, `~/.ceph/config`, `./ceph.conf`).
    pub ceph_conf: Option<PathBuf>,
    /// Ceph entity name (`client.ironsan`); none: `client.admin`.
    pub client_name: Option<String>,
    /// Keyring file; none: what ceph.conf says.
    pub keyring: Option<PathBuf>,
    /// Open the image read-only (writes fail with `EROFS`).
    pub read_only: bool,
    /// Grow the image to at least this many bytes when it is smaller
    /// (never shrinks it).
    pub min_size: Option<u64>,
    /// Seconds an OSD or monitor request may take before it fails with
    /// `ETIMEDOUT` (answered NOT READY, so initiators try another
    /// gateway); 0: no limit.
    pub op_timeout: u64,
}

impl RbdOptions {
    /// `POOL[/NAMESPACE]/IMAGE[@SNAPSHOT]`, as `rbd` names it.
    pub fn spec(&self) -> String {
        crate::rbd_spec(
            &self.pool,
            self.namespace.as_deref(),
            &self.image,
            self.snapshot.as_deref(),
        )
    }
}

/// A LUN on an RBD image; see the module docs.
pub struct RbdBackend {
    api: &'static Api,
    /// How to connect again ([`crate::Ownership::reconnect`]).
    opts: RbdOptions,
    /// The connection I/O goes through: replaced after this client was
    /// fenced. Every call clones it and holds it for as long as librbd
    /// may use the image (to the completion, for asynchronous requests).
    conn: parking_lot::RwLock<Arc<Conn>>,
    spec: Arc<str>,
    /// The size ranges are checked against; shared with the helper of
    /// [`crate::Ownership::on_resized_elsewhere`] (`watch`).
    size: Arc<AtomicU64>,
    obj_size: u64,
    write_back: AtomicBool,
    /// Offer [`AsyncIo`]; `IRONSAN_RBD_WAIT=1` at open turns it off (every
    /// call then runs on the I/O pool, for comparison).
    completions: bool,
    /// The header watch that follows resizes made elsewhere, once asked
    /// for, and its callback (to watch again through a new connection).
    size_watch: parking_lot::Mutex<Option<(watch::SizeWatch, crate::SizeChanged)>>,
}

/// One connection to the cluster and the image opened through it. The
/// image is closed and the cluster handle shut down when the last holder
/// lets go: the backend, a blocking call, or a request in flight.
pub(super) struct Conn {
    api: &'static Api,
    cluster: rados_t,
    ioctx: rados_ioctx_t,
    image: rbd_image_t,
    /// `rbd_header.<id>`: the object every client of the image watches.
    header: CString,
}

// SAFETY: the handles are plain pointers to librados/librbd objects that
// are documented thread-safe (QEMU and tcmu-runner issue aio on one image
// from many threads); they are freed only in Drop, when no holder is left.
unsafe impl Send for Conn {}
// SAFETY: as above; librbd serialises internally.
unsafe impl Sync for Conn {}

thread_local! {
    /// Set while a librbd completion callback runs on this thread.
    static ON_LIBRBD_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A raw handle moved to the thread that closes it.
struct Handle(*mut c_void);
// SAFETY: librados/librbd handles may be closed from any thread.
unsafe impl Send for Handle {}

impl Drop for Conn {
    fn drop(&mut self) {
        let api = self.api;
        let handles = [Handle(self.image), Handle(self.ioctx), Handle(self.cluster)];
        let close = move || {
            let [image, ioctx, cluster] = handles;
            // SAFETY: handles created in `Conn::open`, closed once, image
            // before its ioctx before its cluster; no holder is left.
            unsafe {
                (api.rbd_close)(image.0);
                (api.rados_ioctx_destroy)(ioctx.0);
                (api.rados_shutdown)(cluster.0);
            }
        };
        // The last holder may be a request completing on librbd's own
        // thread, where closing the image would wait for itself.
        if ON_LIBRBD_THREAD.with(std::cell::Cell::get) {
            if let Err(e) = std::thread::Builder::new()
                .name("rbd-close".into())
                .spawn(close)
            {
                tracing::warn!("rbd: cannot start a thread to close an old connection: {e}");
            }
        } else {
            close();
        }
    }
}

impl std::fmt::Debug for RbdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdBackend")
            .field("image", &self.spec)
            .field("size", &self.size())
            .field("obj_size", &self.obj_size)
            .finish_non_exhaustive()
    }
}

/// An error of `op` on `spec` from a negative errno `r` (see the module
/// docs for the mapping).
pub fn rbd_error(spec: &str, op: &str, r: i64) -> io::Error {
    let errno = i32::try_from(r.unsigned_abs()).unwrap_or(libc::EIO);
    let os = io::Error::from_raw_os_error(errno);
    match errno {
        // Kept raw: the SCSI layer looks at the errno.
        libc::ENOSPC | libc::EDQUOT => os,
        // This client was blocklisted (EBLOCKLISTED is ESHUTDOWN in Ceph):
        // fenced for good, another gateway took the image over.
        libc::ESHUTDOWN => crate::NotAccessible::fenced(format!(
            "rbd {spec}: {op}: {os} (this client was fenced: another gateway took the image over)"
        )),
        // It wrote without the exclusive lock another client holds (an
        // image opened read-only never gets that far, writes to a
        // read-only LUN are refused by the SCSI layer).
        libc::EROFS => crate::NotAccessible::error(format!(
            "rbd {spec}: {op}: {os} (another gateway owns the image)"
        )),
        // The cluster did not answer within `op_timeout`: an OSD or
        // monitor is down or slow; nothing says another gateway is better
        // placed.
        libc::ETIMEDOUT => crate::Unresponsive::error(format!(
            "rbd {spec}: {op}: the cluster did not answer in time ({os})"
        )),
        // Not "LBA out of range" (which InvalidInput means to the SCSI
        // layer): ranges are checked here before librbd sees them.
        libc::EINVAL => io::Error::other(format!("rbd {spec}: {op}: {os}")),
        _ => io::Error::new(os.kind(), format!("rbd {spec}: {op}: {os}")),
    }
}

fn cstring(what: &str, s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} {s:?} contains a NUL byte"),
        )
    })
}

fn path_cstring(what: &str, p: &std::path::Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} {} contains a NUL byte", p.display()),
        )
    })
}

/// Releases a cluster handle (and its I/O context) if opening fails part
/// way.
struct Partial {
    api: &'static Api,
    cluster: rados_t,
    ioctx: rados_ioctx_t,
}

impl Drop for Partial {
    fn drop(&mut self) {
        // SAFETY: each handle is either null or was created by librados
        // and not yet destroyed; the ioctx goes before its cluster.
        unsafe {
            if !self.ioctx.is_null() {
                (self.api.rados_ioctx_destroy)(self.ioctx);
            }
            if !self.cluster.is_null() {
                (self.api.rados_shutdown)(self.cluster);
            }
        }
    }
}

impl Conn {
    /// Connects to the cluster and opens the image. Blocks until the
    /// monitors answer, at most 30 s (`client_mount_timeout`).
    fn open(api: &'static Api, o: &RbdOptions) -> io::Result<Conn> {
        let spec = o.spec();
        let fail = |op: &str, r: c_int| rbd_error(&spec, op, i64::from(r));
        let name = cstring(
            "client name",
            o.client_name.as_deref().unwrap_or("client.admin"),
        )?;
        let cluster_name = cstring("cluster name", "ceph")?;
        let mut p = Partial {
            api,
            cluster: ptr::null_mut(),
            ioctx: ptr::null_mut(),
        };
        // SAFETY: valid out pointer and NUL-terminated strings.
        let r =
            unsafe { (api.rados_create2)(&mut p.cluster, cluster_name.as_ptr(), name.as_ptr(), 0) };
        if r < 0 {
            return Err(fail("rados_create2", r));
        }
        let conf = o
            .ceph_conf
            .as_deref()
            .map(|c| path_cstring("ceph_conf", c))
            .transpose()?;
        // SAFETY: a live cluster handle; NULL asks for the default search.
        let r = unsafe {
            (api.rados_conf_read_file)(p.cluster, conf.as_ref().map_or(ptr::null(), |c| c.as_ptr()))
        };
        if r < 0 {
            let what = match &o.ceph_conf {
                Some(c) => format!("reading {}", c.display()),
                None => "finding ceph.conf ($CEPH_CONF, /etc/ceph/ceph.conf)".into(),
            };
            return Err(fail(&what, r));
        }
        let mut settings = vec![
            // See the module docs: acknowledged writes must be stable.
            ("rbd_cache", "false".to_string()),
            ("client_mount_timeout", "30".to_string()),
            ("rados_osd_op_timeout", o.op_timeout.to_string()),
            ("rados_mon_op_timeout", o.op_timeout.to_string()),
        ];
        if let Some(k) = &o.keyring {
            let k = k.to_str().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "keyring path is not UTF-8")
            })?;
            settings.push(("keyring", k.to_string()));
        }
        for (k, v) in &settings {
            let (ck, cv) = (cstring("option", k)?, cstring("value", v)?);
            // SAFETY: a live cluster handle and NUL-terminated strings.
            let r = unsafe { (api.rados_conf_set)(p.cluster, ck.as_ptr(), cv.as_ptr()) };
            if r < 0 {
                return Err(fail(&format!("setting {k} = {v}"), r));
            }
        }
        // SAFETY: a configured cluster handle.
        let r = unsafe { (api.rados_connect)(p.cluster) };
        if r < 0 {
            return Err(fail("connecting to the cluster", r));
        }
        let pool = cstring("pool", &o.pool)?;
        // SAFETY: a connected cluster, a NUL-terminated name, an out pointer.
        let r = unsafe { (api.rados_ioctx_create)(p.cluster, pool.as_ptr(), &mut p.ioctx) };
        if r == -libc::ENOENT {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "rbd {spec}: no pool {:?} (create it: ceph osd pool create {0}; rbd pool init {0})",
                    o.pool
                ),
            ));
        }
        if r < 0 {
            return Err(fail(&format!("opening pool {}", o.pool), r));
        }
        if let Some(ns) = &o.namespace {
            let ns = cstring("namespace", ns)?;
            // SAFETY: a live ioctx and a NUL-terminated name.
            unsafe { (api.rados_ioctx_set_namespace)(p.ioctx, ns.as_ptr()) };
        }
        let image_name = cstring("image", &o.image)?;
        let snap = o
            .snapshot
            .as_deref()
            .map(|s| cstring("snapshot", s))
            .transpose()?;
        let mut image: rbd_image_t = ptr::null_mut();
        let open = if o.read_only || snap.is_some() {
            api.rbd_open_read_only
        } else {
            api.rbd_open
        };
        // SAFETY: a live ioctx, a NUL-terminated name, an out pointer, and
        // a snapshot name or NULL for the image itself.
        let r = unsafe {
            open(
                p.ioctx,
                image_name.as_ptr(),
                &mut image,
                snap.as_ref().map_or(ptr::null(), |s| s.as_ptr()),
            )
        };
        if r == -libc::ENOENT {
            let hint = match (&o.namespace, &o.snapshot) {
                (_, Some(_)) => format!(
                    "no such image or snapshot (rbd snap ls {})",
                    RbdOptions {
                        snapshot: None,
                        ..o.clone()
                    }
                    .spec()
                ),
                (Some(ns), None) => format!(
                    "no such image or namespace (rbd namespace create {}/{ns}; \
                     rbd create --size SIZE {spec})",
                    o.pool
                ),
                (None, None) => format!("no such image (create it: rbd create --size SIZE {spec})"),
            };
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("rbd {spec}: {hint}"),
            ));
        }
        if r < 0 {
            return Err(fail("opening the image", r));
        }
        let (cluster, ioctx) = (p.cluster, p.ioctx);
        std::mem::forget(p);
        let mut conn = Conn {
            api,
            cluster,
            ioctx,
            image,
            header: CString::default(),
        };
        let mut id = [0u8; 64];
        // SAFETY: an open image and a buffer of the length passed.
        let r = unsafe { (api.rbd_get_id)(image, id.as_mut_ptr().cast::<c_char>(), id.len()) };
        if r < 0 {
            return Err(fail("rbd_get_id", r));
        }
        let id = std::ffi::CStr::from_bytes_until_nul(&id)
            .map_err(|_| io::Error::other(format!("rbd {spec}: the image id is too long")))?;
        conn.header = cstring(
            "header object",
            &format!("rbd_header.{}", id.to_string_lossy()),
        )?;
        Ok(conn)
    }
}

impl RbdBackend {
    /// Connects to the cluster and opens the image, growing it to
    /// `min_size` when smaller. Blocks until the monitors answer, at most
    /// 30 s (`client_mount_timeout`).
    pub fn open(o: &RbdOptions, policy: WriteCache) -> io::Result<RbdBackend> {
        let spec = o.spec();
        let api = rbd_sys::api()
            .map_err(|e| io::Error::new(io::ErrorKind::NotFound, format!("rbd {spec}: {e}")))?;
        let conn = Conn::open(api, o)?;
        tracing::info!(
            image = %spec,
            client = o.client_name.as_deref().unwrap_or("client.admin"),
            read_only = o.read_only || o.snapshot.is_some(),
            "rbd: image open"
        );
        let image = conn.image;
        let b = RbdBackend {
            api,
            opts: o.clone(),
            conn: parking_lot::RwLock::new(Arc::new(conn)),
            spec: spec.into(),
            size: Arc::new(AtomicU64::new(0)),
            obj_size: 0,
            write_back: AtomicBool::new(policy == WriteCache::WriteBack),
            completions: std::env::var_os("IRONSAN_RBD_WAIT").is_none_or(|v| v != "1"),
            size_watch: parking_lot::Mutex::new(None),
        };
        let mut b = b;
        let mut info = rbd_sys::rbd_image_info_t::default();
        // SAFETY: an open image and a struct of the size passed.
        let r = unsafe {
            (api.rbd_stat)(
                image,
                &mut info,
                std::mem::size_of::<rbd_sys::rbd_image_info_t>(),
            )
        };
        if r < 0 {
            return Err(b.err("rbd_stat", i64::from(r)));
        }
        b.obj_size = if info.obj_size.is_power_of_two() {
            info.obj_size
        } else {
            4 << 20
        };
        b.size.store(info.size, Ordering::Relaxed);
        if let Some(want) = o.min_size {
            if info.size < want {
                b.resize(want)?;
            }
        }
        if b.size() == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("rbd {}: the image is empty", b.spec),
            ));
        }
        Ok(b)
    }

    /// The connection to use now (see [`RbdBackend::conn`]'s field docs).
    fn conn(&self) -> Arc<Conn> {
        self.conn.read().clone()
    }

    /// `POOL/IMAGE`.
    pub fn spec(&self) -> &str {
        &self.spec
    }

    /// The image's object size in bytes.
    pub fn object_size(&self) -> u64 {
        self.obj_size
    }

    fn err(&self, op: &str, r: i64) -> io::Error {
        rbd_error(&self.spec, op, r)
    }

    /// Submits one asynchronous request with `submit` (given a fresh
    /// completion) and waits for it; returns the completion's value.
    fn run(&self, op: &str, submit: impl FnOnce(rbd_completion_t) -> i64) -> io::Result<isize> {
        let mut c: rbd_completion_t = ptr::null_mut();
        // SAFETY: no callback, so the argument is never used; out pointer.
        let r = unsafe { (self.api.rbd_aio_create_completion)(ptr::null_mut(), None, &mut c) };
        if r < 0 {
            return Err(self.err("rbd_aio_create_completion", i64::from(r)));
        }
        let r = submit(c);
        let ret = if r < 0 {
            Err(self.err(op, r))
        } else {
            // SAFETY: a submitted completion; waiting blocks this thread
            // until librbd completes it, after which the buffers the
            // request used are no longer touched.
            unsafe { (self.api.rbd_aio_wait_for_complete)(c) };
            // SAFETY: a completed completion.
            let v = unsafe { (self.api.rbd_aio_get_return_value)(c) };
            if v < 0 {
                Err(self.err(op, v as i64))
            } else {
                Ok(v)
            }
        };
        // SAFETY: created above, released once; when submission failed
        // librbd never took it.
        unsafe { (self.api.rbd_aio_release)(c) };
        ret
    }

    /// Reads into `ptr..ptr+len`; every byte is written on success.
    ///
    /// # Safety
    /// `ptr` must be valid for `len` bytes of writes for the whole call.
    unsafe fn read_raw(&self, ptr: *mut u8, len: usize, offset: u64) -> io::Result<()> {
        let conn = self.conn();
        check_range(self.size(), offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let n = self.run("read", |c| {
            // SAFETY: the caller guarantees the buffer; `run` waits for the
            // completion before returning, so it outlives the request.
            i64::from(unsafe {
                (self.api.rbd_aio_read)(conn.image, offset, len, ptr.cast::<c_char>(), c)
            })
        })?;
        if usize::try_from(n).ok() != Some(len) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "rbd {}: short read at {offset}: {n} of {len} bytes",
                    self.spec
                ),
            ));
        }
        Ok(())
    }
}

impl Drop for RbdBackend {
    fn drop(&mut self) {
        // The watch ends (and its helper is joined) while the image is
        // open; the connection closes when its last holder lets go.
        drop(self.size_watch.get_mut().take());
    }
}

/// State for `rbd_diff_iterate2`'s callback in [`RbdBackend::allocation`].
struct DiffScan {
    start: u64,
    end: u64,
    /// The first run found: (allocated, end offset).
    run: Option<(bool, u64)>,
}

/// Returned from the callback to stop the iteration once the first run is
/// known.
const STOP: c_int = -libc::ECANCELED;

/// How long `resize` waits for this handle to see the size it set (the
/// header update from the lock owner arrives within milliseconds).
const RESIZE_SEEN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

unsafe extern "C" fn diff_cb(off: u64, len: usize, exists: c_int, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `DiffScan` that `allocation` passes and keeps
    // alive across the synchronous `rbd_diff_iterate2` call.
    let s = unsafe { &mut *arg.cast::<DiffScan>() };
    let e_start = off.max(s.start);
    let e_end = off.saturating_add(len as u64).min(s.end);
    if e_end <= e_start {
        return 0;
    }
    let exists = exists != 0;
    match s.run {
        None if e_start > s.start => {
            // A hole before the first extent reported.
            s.run = Some((false, e_start));
            if exists {
                return STOP;
            }
            s.run = Some((false, e_end));
        }
        None => s.run = Some((exists, e_end)),
        Some((a, end)) if a == exists && e_start == end => s.run = Some((a, e_end)),
        Some((false, end)) if !exists => s.run = Some((false, e_end.max(end))),
        Some(_) => return STOP,
    }
    0
}

impl BlockBackend for RbdBackend {
    /// A write inside one RADOS object is applied by the OSD as one
    /// operation: all or nothing. So an atomic write may be as large as an
    /// object, starting on an object boundary.
    fn caps(&self) -> Caps {
        let write_cache = WriteCache::from_write_back(self.write_back.load(Ordering::Relaxed));
        Caps {
            can_deallocate: true,
            discard_granularity: self.obj_size,
            max_atomic_write: self.obj_size,
            atomic_alignment: self.obj_size,
            ..Caps::new("rbd", write_cache)
        }
    }

    fn fast(&self) -> Option<&dyn FastPaths> {
        Some(self)
    }

    fn ownership(&self) -> Option<&dyn crate::Ownership> {
        Some(self)
    }

    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        // SAFETY: a live exclusive borrow of the buffer for the call.
        unsafe { self.read_raw(buf.as_mut_ptr(), buf.len(), offset) }
    }

    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> io::Result<()> {
        let conn = self.conn();
        // Without librbd's cache an acknowledged write is stable: FUA needs
        // nothing more (module docs).
        check_range(self.size(), offset, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        self.run("write", |c| {
            // SAFETY: `buf` is borrowed for the call and `run` waits for the
            // completion.
            i64::from(unsafe {
                (self.api.rbd_aio_write)(
                    conn.image,
                    offset,
                    buf.len(),
                    buf.as_ptr().cast::<c_char>(),
                    c,
                )
            })
        })?;
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let conn = self.conn();
        self.run("flush", |c| {
            // SAFETY: an open image and a fresh completion.
            i64::from(unsafe { (self.api.rbd_aio_flush)(conn.image, c) })
        })?;
        Ok(())
    }

    fn resize(&self, new_size: u64) -> io::Result<()> {
        let conn = self.conn();
        // SAFETY: an open image; librbd serialises a resize against I/O.
        let r = unsafe { (self.api.rbd_resize)(conn.image, new_size) };
        if r < 0 {
            return Err(self.err("resize", i64::from(r)));
        }
        // When another client holds the image's exclusive lock, librbd
        // hands the resize to that client and only marks this handle for
        // a refresh, which its reads do not perform: a read past the old
        // end fails EINVAL until something refreshes the handle (seen
        // with librbd 16.2). `rbd_get_size` refreshes it; asking until it
        // shows the new size makes a returned resize one that this
        // handle's own I/O obeys.
        let deadline = std::time::Instant::now() + RESIZE_SEEN_TIMEOUT;
        loop {
            let mut seen = 0u64;
            // SAFETY: an open image; out pointer to a local.
            let r = unsafe { (self.api.rbd_get_size)(conn.image, &mut seen) };
            if r < 0 {
                return Err(self.err("get size", i64::from(r)));
            }
            if seen == new_size {
                break;
            }
            if std::time::Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "rbd {}: resized to {new_size} bytes, but this client still sees {seen} after {:?}",
                        self.spec, RESIZE_SEEN_TIMEOUT
                    ),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.size.store(new_size, Ordering::Release);
        Ok(())
    }

    fn set_write_cache(&self, policy: WriteCache) -> io::Result<()> {
        // Either policy is true of an uncached image (module docs).
        self.write_back
            .store(policy == WriteCache::WriteBack, Ordering::Relaxed);
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zero(offset, len, rbd_sys::RBD_WRITE_ZEROES_FLAG_THICK_PROVISION)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zero(offset, len, 0)
    }

    fn allocation(&self, offset: u64, len: u64) -> io::Result<Extent> {
        let conn = self.conn();
        check_range_u64(self.size(), offset, len)?;
        let mut scan = DiffScan {
            start: offset,
            end: offset + len,
            run: None,
        };
        // SAFETY: an open image; NULL = since creation; the callback gets
        // `scan`, alive for this synchronous call.
        let r = unsafe {
            (self.api.rbd_diff_iterate2)(
                conn.image,
                ptr::null(),
                offset,
                len,
                1,
                0,
                Some(diff_cb),
                (&mut scan as *mut DiffScan).cast::<c_void>(),
            )
        };
        if r < 0 && r != STOP {
            return Err(self.err("allocation (rbd_diff_iterate2)", i64::from(r)));
        }
        Ok(match scan.run {
            None => Extent {
                allocated: false,
                len,
            },
            Some((allocated, end)) => Extent {
                allocated,
                len: end - offset,
            },
        })
    }
}

impl FastPaths for RbdBackend {
    fn read_chain(&self, offset: u64, len: usize) -> io::Result<bufpool::Chain> {
        let mut v: Vec<u8> = Vec::with_capacity(len);
        // SAFETY: the capacity is `len`; on success librbd wrote all of it
        // (a short read is an error), so it is initialised.
        unsafe {
            self.read_raw(v.as_mut_ptr(), len, offset)?;
            v.set_len(len);
        }
        Ok(bufpool::Chain::from(bytes::Bytes::from(v)))
    }

    fn async_io(&self) -> Option<&dyn AsyncIo> {
        self.completions.then_some(self as &dyn AsyncIo)
    }
}

impl RbdBackend {
    fn zero(&self, offset: u64, len: u64, flags: c_int) -> io::Result<()> {
        let conn = self.conn();
        check_range_u64(self.size(), offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let n = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "range too large"))?;
        self.run("write zeroes", |c| {
            // SAFETY: an open image and a fresh completion; no buffer.
            i64::from(unsafe {
                (self.api.rbd_aio_write_zeroes)(conn.image, offset, n, c, flags, 0)
            })
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        let e = rbd_error("p/i", "write", -i64::from(libc::ENOSPC));
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        let e = rbd_error("p/i", "write", -i64::from(libc::EDQUOT));
        assert_eq!(e.raw_os_error(), Some(libc::EDQUOT));
        // EINVAL must not read as "LBA out of range".
        let e = rbd_error("p/i", "read", -i64::from(libc::EINVAL));
        assert_ne!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("rbd p/i: read"), "{e}");
        // Another gateway owns the image (lock held elsewhere, this client
        // blocklisted): the path is not usable, the data is fine.
        for errno in [libc::EROFS, libc::ESHUTDOWN] {
            let e = rbd_error("p/i", "write", -i64::from(errno));
            assert!(crate::NotAccessible::is(&e), "{errno}: {e}");
            assert_eq!(
                crate::NotAccessible::is_fenced(&e),
                errno == libc::ESHUTDOWN
            );
        }
        // The cluster did not answer in time: retry, the path is right.
        let e = rbd_error("p/i", "write", -i64::from(libc::ETIMEDOUT));
        assert!(crate::Unresponsive::is(&e), "{e}");
        assert!(!crate::NotAccessible::is(&e));
        assert!(!e.to_string().contains("another gateway"), "{e}");
        let e = rbd_error("p/i", "read", -i64::from(libc::EIO));
        assert!(!crate::NotAccessible::is(&e));
        assert_eq!(e.raw_os_error(), None);
        assert!(e.to_string().contains("rbd p/i: read"), "{e}");
    }

    #[test]
    fn missing_library_fails_up_front() {
        // Only meaningful where librbd is absent; where it is present, a
        // bogus conf file fails instead. Either way open() fails cleanly.
        let o = RbdOptions {
            pool: "rbd".into(),
            image: "none".into(),
            ceph_conf: Some("/nonexistent/ceph.conf".into()),
            ..RbdOptions::default()
        };
        let e = RbdBackend::open(&o, WriteCache::WriteThrough).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("librbd") || text.contains("/nonexistent/ceph.conf"),
            "{text}"
        );
    }

    fn scan(start: u64, end: u64, extents: &[(u64, usize, c_int)]) -> Option<(bool, u64)> {
        let mut s = DiffScan {
            start,
            end,
            run: None,
        };
        for &(o, l, e) in extents {
            // SAFETY: `s` is a live DiffScan.
            let r = unsafe { diff_cb(o, l, e, (&mut s as *mut DiffScan).cast()) };
            if r == STOP {
                break;
            }
        }
        s.run
    }

    #[test]
    fn first_run_of_a_diff() {
        // Nothing reported: the caller treats it as one hole.
        assert_eq!(scan(0, 100, &[]), None);
        // Data at the start, merged while contiguous.
        assert_eq!(
            scan(0, 100, &[(0, 10, 1), (10, 5, 1), (40, 5, 1)]),
            Some((true, 15))
        );
        // A hole before the first extent.
        assert_eq!(scan(0, 100, &[(30, 10, 1)]), Some((false, 30)));
        // Extents clipped to the query.
        assert_eq!(scan(20, 100, &[(0, 30, 1), (30, 5, 1)]), Some((true, 35)));
        assert_eq!(scan(0, 8, &[(0, 30, 1)]), Some((true, 8)));
    }
}

/// Against a live cluster, when `IRONSAN_RBD_TEST=POOL/IMAGE` names a
/// scratch image (its data is overwritten) and `CEPH_CONF` the cluster
/// (scripts/rbd.sh sets both and runs them with `--ignored`); ignored
/// otherwise.
#[cfg(test)]
mod live {
    use super::*;

    fn open() -> RbdBackend {
        let spec = std::env::var("IRONSAN_RBD_TEST")
            .expect("IRONSAN_RBD_TEST=POOL/IMAGE names the scratch image (scripts/rbd.sh)");
        let (pool, image) = spec.split_once('/').expect("IRONSAN_RBD_TEST=POOL/IMAGE");
        let o = RbdOptions {
            pool: pool.into(),
            image: image.into(),
            ..RbdOptions::default()
        };
        RbdBackend::open(&o, WriteCache::WriteThrough).expect("open the test image")
    }

    #[test]
    #[ignore = "needs a Ceph cluster: IRONSAN_RBD_TEST=POOL/IMAGE and CEPH_CONF (scripts/rbd.sh runs it)"]
    fn read_write_zero_discard_allocation() {
        let b = open();
        let os = b.object_size();
        assert_eq!(b.caps().discard_granularity, os);
        let size = b.size();
        assert!(size >= 4 * os, "the test image needs 4 objects");
        // Whole-object discard: deallocated, reads zeros.
        b.discard(0, 4 * os).unwrap();
        let e = b.allocation(0, 4 * os).unwrap();
        assert_eq!(
            e,
            Extent {
                allocated: false,
                len: 4 * os
            }
        );
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        b.write_at(&data, os + 4096, true).unwrap();
        let mut back = vec![0u8; 8192];
        b.read_at(&mut back, os + 4096).unwrap();
        assert_eq!(back, data);
        assert_eq!(
            &b.read_chain(os + 4096, 8192).unwrap().to_vec()[..],
            &data[..]
        );
        b.flush().unwrap();
        // The written object is allocated, the first one not.
        let e = b.allocation(0, 4 * os).unwrap();
        assert!(!e.allocated && e.len <= os + 4096, "{e:?}");
        let e = b.allocation(os + 4096, 4096).unwrap();
        assert!(e.allocated, "{e:?}");
        // Partial discard reads back zeros.
        b.discard(os + 4096, 4096).unwrap();
        b.read_at(&mut back, os + 4096).unwrap();
        assert!(back[..4096].iter().all(|&x| x == 0));
        assert_eq!(back[4096..], data[4096..]);
        b.write_zeroes(os + 8192, 4096).unwrap();
        b.read_at(&mut back, os + 4096).unwrap();
        assert!(back.iter().all(|&x| x == 0));
        // Out of range is InvalidInput, checked before librbd.
        let e = b.read_at(&mut back, size).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        // Grow and shrink back.
        b.resize(size + os).unwrap();
        assert_eq!(b.size(), size + os);
        b.read_at(&mut back, size).unwrap();
        b.resize(size).unwrap();
        assert_eq!(b.size(), size);
    }

    #[test]
    #[ignore = "needs a Ceph cluster: IRONSAN_RBD_TEST=POOL/IMAGE and CEPH_CONF (scripts/rbd.sh runs it)"]
    fn completion_driven_reads_and_writes() {
        use crate::AsyncIo;
        let b = open();
        const N: u64 = 64;
        // Past the objects the other live test uses (tests run in parallel).
        let base = 4 * b.object_size();
        assert!(b.size() >= base + N * 8192, "the test image is too small");
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..N {
            let data = bytes::Bytes::from(vec![i as u8 + 1; 4096]);
            let tx = tx.clone();
            b.submit_write(
                base + i * 8192,
                data,
                false,
                Box::new(move |r| tx.send((i, r)).unwrap()),
            );
        }
        for _ in 0..N {
            let (i, r) = rx.recv().unwrap();
            r.unwrap_or_else(|e| panic!("write {i}: {e}"));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..N {
            let tx = tx.clone();
            b.submit_read(
                base + i * 8192,
                4096,
                Box::new(move |r| tx.send((i, r)).unwrap()),
            );
        }
        for _ in 0..N {
            let (i, r) = rx.recv().unwrap();
            let data = r.unwrap_or_else(|e| panic!("read {i}: {e}"));
            assert!(data.iter().all(|&x| x == i as u8 + 1), "read {i}");
        }
        // Refused before librbd: `done` runs at once, on this thread.
        let got = std::sync::Arc::new(parking_lot::Mutex::new(None));
        let g = got.clone();
        b.submit_read(b.size(), 512, Box::new(move |r| *g.lock() = Some(r)));
        let e = got
            .lock()
            .take()
            .expect("called before returning")
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}

/// The exclusive lock between two clients, when `IRONSAN_RBD_LOCK_TEST=
/// POOL/IMAGE` names an image of its own (the live tests above would
/// fight over the lock) with the exclusive-lock feature; ignored otherwise
/// (scripts/rbd.sh runs it).
#[cfg(test)]
mod live_lock {
    use super::*;
    use crate::Ownership;

    fn open_twice() -> (RbdBackend, RbdBackend) {
        let spec = std::env::var("IRONSAN_RBD_LOCK_TEST").expect(
            "IRONSAN_RBD_LOCK_TEST=POOL/IMAGE names an image to fight over (scripts/rbd.sh)",
        );
        let (pool, image) = spec
            .split_once('/')
            .expect("IRONSAN_RBD_LOCK_TEST=POOL/IMAGE");
        let o = RbdOptions {
            pool: pool.into(),
            image: image.into(),
            ..RbdOptions::default()
        };
        let open = || RbdBackend::open(&o, WriteCache::WriteThrough).expect("open the image");
        (open(), open())
    }

    #[test]
    #[ignore = "needs a Ceph cluster: IRONSAN_RBD_LOCK_TEST=POOL/IMAGE and CEPH_CONF (scripts/rbd.sh runs it)"]
    fn take_over_fences_the_old_owner() {
        let (a, b) = open_twice();
        let data = vec![0xA5u8; 4096];
        assert!(a.lock_acquire().unwrap(), "a takes the free lock");
        assert!(a.is_lock_owner().unwrap());
        a.write_at(&data, 0, true).unwrap();
        // b can read, cannot take the lock without breaking it, cannot write.
        assert!(!b.lock_acquire().unwrap(), "held by a");
        assert!(!b.is_lock_owner().unwrap());
        let owners = b.lock_owners().unwrap();
        assert_eq!(owners.len(), 1);
        eprintln!(
            "lock owners: {owners:?}, watchers: {:?}",
            b.watchers().unwrap()
        );
        assert_eq!(
            b.lock_owner_liveness(std::time::Duration::from_secs(5))
                .unwrap(),
            crate::Liveness::Answers,
            "a holds the lock and answers"
        );
        let mut back = vec![0u8; 4096];
        b.read_at(&mut back, 0).unwrap();
        assert_eq!(back, data);
        let e = b.write_at(&data, 4096, true).unwrap_err();
        assert!(crate::NotAccessible::is(&e), "{e}");
        // Metadata is shared.
        a.metadata_set("ironsan.test", "a").unwrap();
        assert_eq!(
            b.metadata_get("ironsan.test").unwrap().as_deref(),
            Some("a")
        );
        assert_eq!(b.metadata_get("ironsan.none").unwrap(), None);
        // b resizes: librbd hands that to a, the owner, and b's own I/O
        // obeys the new size as soon as resize returns (it used to read
        // EINVAL past the old end until b's handle refreshed itself).
        // a, watching, hears of each resize and checks ranges against it.
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = Arc::new(std::sync::Mutex::new(tx));
        let told = tx.clone();
        let tell: crate::SizeChanged = Arc::new(move |n| {
            let _ = told.lock().unwrap().send(n);
        });
        a.on_resized_elsewhere(tell.clone());
        let heard = || rx.recv_timeout(std::time::Duration::from_secs(10));
        let size = b.size();
        b.resize(size + 4096).unwrap();
        b.read_at(&mut back, size).unwrap();
        assert!(back.iter().all(|&x| x == 0), "the new end reads zeros");
        assert_eq!(heard(), Ok(size + 4096));
        assert_eq!(a.size(), size + 4096);
        a.read_at(&mut back, size).unwrap();
        b.resize(size).unwrap();
        assert_eq!(heard(), Ok(size));
        assert!(a.read_at(&mut back, size).is_err(), "past the end again");
        // A second watch replaces the first (whose helper is joined).
        a.on_resized_elsewhere(Arc::new(|_| {}));
        a.on_resized_elsewhere(tell);
        // b takes over: a is fenced (blocklisted), b writes.
        assert!(b.lock_take_over(None).unwrap());
        assert!(b.is_lock_owner().unwrap());
        b.write_at(&[0x5Au8; 4096], 0, true).unwrap();
        let e = a.write_at(&data, 0, true).unwrap_err();
        assert!(crate::NotAccessible::is(&e), "{e}");
        b.read_at(&mut back, 0).unwrap();
        assert!(
            back.iter().all(|&x| x == 0x5A),
            "a's late write did not land"
        );
        // a finds out it was fenced, connects again as a new client, and is
        // a working standby: it reads, sees b answer, and can take over.
        let owner = a.is_lock_owner();
        let note = a.metadata_get("ironsan.test");
        eprintln!("fenced a: is_lock_owner {owner:?}, metadata_get {note:?}");
        assert!(
            [owner.err(), note.err()]
                .iter()
                .flatten()
                .any(crate::NotAccessible::is_fenced),
            "a fenced client's cluster calls say so"
        );
        a.reconnect_now().unwrap();
        assert!(!a.is_lock_owner().unwrap());
        a.read_at(&mut back, 0).unwrap();
        assert!(back.iter().all(|&x| x == 0x5A));
        let within = std::time::Duration::from_secs(5);
        assert_eq!(
            a.lock_owner_liveness(within).unwrap(),
            crate::Liveness::Answers
        );
        // The size watch moved to the new connection.
        b.resize(size + 4096).unwrap();
        assert_eq!(heard(), Ok(size + 4096));
        b.resize(size).unwrap();
        assert_eq!(heard(), Ok(size));
        assert!(!a.lock_take_over(Some("")).unwrap(), "b holds it");
        assert!(a
            .lock_take_over(Some(&b.lock_owners().unwrap().join(",")))
            .unwrap());
        a.write_at(&data, 0, true).unwrap();
        let e = b.write_at(&data, 0, true).unwrap_err();
        assert!(crate::NotAccessible::is_fenced(&e), "{e}");
        a.lock_release().unwrap();
        assert!(!a.is_lock_owner().unwrap());
    }
}
