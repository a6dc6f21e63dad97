//! Hand-written bindings to the part of Ceph's C client libraries that
//! ironsan uses: librados (cluster handle, pool I/O context) and librbd
//! (image open/close/size, asynchronous I/O with completions, exclusive
//! lock, header update watches).
//!
//! Every declaration below was written from Debian 12's
//! `/usr/include/rados/librados.h` and `/usr/include/rbd/librbd.h`
//! (librados 2 / librbd 1.16, Ceph 16.2 "Pacific"); the comment on each
//! names the C prototype it mirrors.
//!
//! # Loaded at run time
//!
//! The libraries are opened with `dlopen` the first time [`api`] is called,
//! not linked: the workspace builds, tests and serves other LUN kinds on a
//! machine without Ceph, and only an `rbd:` LUN needs `librbd.so.1` and
//! `librados.so.2` (Debian packages `librbd1` and `librados2`). A missing
//! library or symbol is a [`LoadError`] naming what is missing and how to
//! install it. `IRONSAN_LIBRADOS` and `IRONSAN_LIBRBD` override the file
//! names (a path, or a name the dynamic loader searches for).
//!
//! # Safety
//!
//! The functions are raw C entry points: callers uphold librbd's rules
//! (valid handles, buffers alive and unmoved until a completion fires,
//! each completion released once). The safe layer is `storage::rbd`.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};
use std::fmt;
use std::sync::OnceLock;

use libloading::Library;

/// `typedef void *rados_t;` a cluster handle.
pub type rados_t = *mut c_void;
/// `typedef void *rados_ioctx_t;` an I/O context bound to one pool.
pub type rados_ioctx_t = *mut c_void;
/// `typedef void *rbd_image_t;` an open image.
pub type rbd_image_t = *mut c_void;
/// `typedef void *rbd_completion_t;` an asynchronous I/O completion.
pub type rbd_completion_t = *mut c_void;
/// `typedef void (*rbd_callback_t)(rbd_completion_t cb, void *arg);` called
/// on a librbd thread when an asynchronous operation completes.
pub type rbd_callback_t = Option<unsafe extern "C" fn(cb: rbd_completion_t, arg: *mut c_void)>;
/// `typedef void (*rbd_update_callback_t)(void *arg);` called on a librbd
/// thread when the image's header changes (a resize, a snapshot, a lock
/// owner change), by any client.
pub type rbd_update_callback_t = Option<unsafe extern "C" fn(arg: *mut c_void)>;
/// `typedef enum { RBD_LOCK_MODE_EXCLUSIVE = 0, RBD_LOCK_MODE_SHARED = 1 }
/// rbd_lock_mode_t;` (a C enum: `int`-sized).
pub type rbd_lock_mode_t = c_int;
/// `RBD_LOCK_MODE_EXCLUSIVE`.
pub const RBD_LOCK_MODE_EXCLUSIVE: rbd_lock_mode_t = 0;
/// `RBD_LOCK_MODE_SHARED`.
pub const RBD_LOCK_MODE_SHARED: rbd_lock_mode_t = 1;
/// `RBD_WRITE_ZEROES_FLAG_THICK_PROVISION`: zeroes are written and stay
/// allocated (without it, write-zeroes may deallocate, like a discard that
/// always zeroes partial objects).
pub const RBD_WRITE_ZEROES_FLAG_THICK_PROVISION: c_int = 1;
/// `LIBRADOS_OP_FLAG_FADVISE_FUA`: an op flag asking for force unit access.
pub const LIBRADOS_OP_FLAG_FADVISE_FUA: c_int = 0x80;
/// `RBD_MAX_BLOCK_NAME_SIZE`.
pub const RBD_MAX_BLOCK_NAME_SIZE: usize = 24;
/// `RBD_MAX_IMAGE_NAME_SIZE`.
pub const RBD_MAX_IMAGE_NAME_SIZE: usize = 96;

/// `rbd_image_watcher_t`, filled by `rbd_watchers_list`: a client watching
/// the image header (every client with the image open).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rbd_image_watcher_t {
    /// `char *addr`.
    pub addr: *mut c_char,
    /// `int64_t id`: the client's global id (`client.<id>`).
    pub id: i64,
    /// `uint64_t cookie`.
    pub cookie: u64,
}

/// `rbd_image_info_t`, filled by `rbd_stat`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rbd_image_info_t {
    /// Image size in bytes.
    pub size: u64,
    /// Object size in bytes (`1 << order`).
    pub obj_size: u64,
    /// Number of objects.
    pub num_objs: u64,
    /// log2 of the object size.
    pub order: c_int,
    /// Deprecated in the header.
    pub block_name_prefix: [c_char; RBD_MAX_BLOCK_NAME_SIZE],
    /// Deprecated in the header.
    pub parent_pool: i64,
    /// Deprecated in the header.
    pub parent_name: [c_char; RBD_MAX_IMAGE_NAME_SIZE],
}

impl Default for rbd_image_info_t {
    fn default() -> Self {
        rbd_image_info_t {
            size: 0,
            obj_size: 0,
            num_objs: 0,
            order: 0,
            block_name_prefix: [0; RBD_MAX_BLOCK_NAME_SIZE],
            parent_pool: 0,
            parent_name: [0; RBD_MAX_IMAGE_NAME_SIZE],
        }
    }
}

/// `int (*cb)(uint64_t, size_t, int, void *)` of `rbd_diff_iterate2`:
/// offset, length, whether the extent exists (1) or is a hole (0), argument.
pub type rbd_diff_cb = Option<unsafe extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int>;

/// Declares the function table: one field per C function, resolved from
/// the named library when loading.
macro_rules! api {
    ($( $lib:ident { $( $(#[$m:meta])* fn $name:ident($($ty:ty),* $(,)?) $(-> $ret:ty)?; )* } )*) => {
        /// The loaded libraries and their entry points. Obtained from
        /// [`api`]; lives for the whole process.
        pub struct Api {
            $($( $(#[$m])* pub $name: unsafe extern "C" fn($($ty),*) $(-> $ret)?, )*)*
            libs: Vec<Library>,
        }

        impl Api {
            fn resolve($($lib: &Library),*) -> Result<Api, LoadError> {
                Ok(Api {
                    $($(
                        // SAFETY: the field's type is the C prototype from
                        // the Ceph 16 headers quoted in its doc comment; the
                        // pointer stays valid because the library is kept in
                        // `libs` for as long as the table lives.
                        $name: unsafe { symbol($lib, stringify!($name))? },
                    )*)*
                    libs: Vec::new(),
                })
            }
        }
    };
}

api! {
    rados {
        /// `int rados_create2(rados_t *pcluster, const char *const clustername,
        /// const char *const name, uint64_t flags);`
        fn rados_create2(*mut rados_t, *const c_char, *const c_char, u64) -> c_int;
        /// `int rados_conf_read_file(rados_t cluster, const char *path);`
        fn rados_conf_read_file(rados_t, *const c_char) -> c_int;
        /// `int rados_conf_set(rados_t cluster, const char *option, const char *value);`
        fn rados_conf_set(rados_t, *const c_char, *const c_char) -> c_int;
        /// `int rados_connect(rados_t cluster);`
        fn rados_connect(rados_t) -> c_int;
        /// `void rados_shutdown(rados_t cluster);`
        fn rados_shutdown(rados_t);
        /// `int rados_ioctx_create(rados_t cluster, const char *pool_name,
        /// rados_ioctx_t *ioctx);`
        fn rados_ioctx_create(rados_t, *const c_char, *mut rados_ioctx_t) -> c_int;
        /// `void rados_ioctx_destroy(rados_ioctx_t io);`
        fn rados_ioctx_destroy(rados_ioctx_t);
        /// `void rados_ioctx_set_namespace(rados_ioctx_t io, const char *nspace);`
        /// (RBD namespaces are RADOS namespaces of the pool).
        fn rados_ioctx_set_namespace(rados_ioctx_t, *const c_char);
        /// `uint64_t rados_get_instance_id(rados_t cluster);` this client's
        /// global id (`client.<id>`), as watchers and notify replies name it.
        fn rados_get_instance_id(rados_t) -> u64;
        /// `int rados_notify2(rados_ioctx_t io, const char *o, const char *buf,
        /// int buf_len, uint64_t timeout_ms, char **reply_buffer,
        /// size_t *reply_buffer_len);` the reply lists who acknowledged and
        /// who timed out, and is set even when the call returns `-ETIMEDOUT`.
        fn rados_notify2(rados_ioctx_t, *const c_char, *const c_char, c_int, u64, *mut *mut c_char, *mut usize) -> c_int;
        /// `void rados_buffer_free(char *buf);`
        fn rados_buffer_free(*mut c_char);
    }
    rbd {
        /// `void rbd_version(int *major, int *minor, int *extra);`
        fn rbd_version(*mut c_int, *mut c_int, *mut c_int);
        /// `int rbd_open(rados_ioctx_t io, const char *name, rbd_image_t *image,
        /// const char *snap_name);`
        fn rbd_open(rados_ioctx_t, *const c_char, *mut rbd_image_t, *const c_char) -> c_int;
        /// `int rbd_open_read_only(rados_ioctx_t io, const char *name,
        /// rbd_image_t *image, const char *snap_name);`
        fn rbd_open_read_only(rados_ioctx_t, *const c_char, *mut rbd_image_t, *const c_char) -> c_int;
        /// `int rbd_close(rbd_image_t image);`
        fn rbd_close(rbd_image_t) -> c_int;
        /// `int rbd_get_size(rbd_image_t image, uint64_t *size);`
        fn rbd_get_size(rbd_image_t, *mut u64) -> c_int;
        /// `int rbd_resize(rbd_image_t image, uint64_t size);`
        fn rbd_resize(rbd_image_t, u64) -> c_int;
        /// `int rbd_stat(rbd_image_t image, rbd_image_info_t *info, size_t infosize);`
        fn rbd_stat(rbd_image_t, *mut rbd_image_info_t, usize) -> c_int;
        /// `int rbd_diff_iterate2(rbd_image_t image, const char *fromsnapname,
        /// uint64_t ofs, uint64_t len, uint8_t include_parent,
        /// uint8_t whole_object, int (*cb)(uint64_t, size_t, int, void *),
        /// void *arg);`
        fn rbd_diff_iterate2(rbd_image_t, *const c_char, u64, u64, u8, u8, rbd_diff_cb, *mut c_void) -> c_int;
        /// `int rbd_aio_write(rbd_image_t image, uint64_t off, size_t len,
        /// const char *buf, rbd_completion_t c);`
        fn rbd_aio_write(rbd_image_t, u64, usize, *const c_char, rbd_completion_t) -> c_int;
        /// `int rbd_aio_write2(rbd_image_t image, uint64_t off, size_t len,
        /// const char *buf, rbd_completion_t c, int op_flags);`
        fn rbd_aio_write2(rbd_image_t, u64, usize, *const c_char, rbd_completion_t, c_int) -> c_int;
        /// `int rbd_aio_read(rbd_image_t image, uint64_t off, size_t len,
        /// char *buf, rbd_completion_t c);`
        fn rbd_aio_read(rbd_image_t, u64, usize, *mut c_char, rbd_completion_t) -> c_int;
        /// `int rbd_aio_discard(rbd_image_t image, uint64_t off, uint64_t len,
        /// rbd_completion_t c);`
        fn rbd_aio_discard(rbd_image_t, u64, u64, rbd_completion_t) -> c_int;
        /// `int rbd_aio_write_zeroes(rbd_image_t image, uint64_t off, size_t len,
        /// rbd_completion_t c, int zero_flags, int op_flags);`
        fn rbd_aio_write_zeroes(rbd_image_t, u64, usize, rbd_completion_t, c_int, c_int) -> c_int;
        /// `ssize_t rbd_aio_compare_and_write(rbd_image_t image, uint64_t off,
        /// size_t len, const char *cmp_buf, const char *buf, rbd_completion_t c,
        /// uint64_t *mismatch_off, int op_flags);`
        fn rbd_aio_compare_and_write(rbd_image_t, u64, usize, *const c_char, *const c_char, rbd_completion_t, *mut u64, c_int) -> isize;
        /// `int rbd_aio_flush(rbd_image_t image, rbd_completion_t c);`
        fn rbd_aio_flush(rbd_image_t, rbd_completion_t) -> c_int;
        /// `int rbd_aio_create_completion(void *cb_arg, rbd_callback_t complete_cb,
        /// rbd_completion_t *c);`
        fn rbd_aio_create_completion(*mut c_void, rbd_callback_t, *mut rbd_completion_t) -> c_int;
        /// `int rbd_aio_wait_for_complete(rbd_completion_t c);`
        fn rbd_aio_wait_for_complete(rbd_completion_t) -> c_int;
        /// `ssize_t rbd_aio_get_return_value(rbd_completion_t c);`
        fn rbd_aio_get_return_value(rbd_completion_t) -> isize;
        /// `void rbd_aio_release(rbd_completion_t c);`
        fn rbd_aio_release(rbd_completion_t);
        /// `int rbd_is_exclusive_lock_owner(rbd_image_t image, int *is_owner);`
        fn rbd_is_exclusive_lock_owner(rbd_image_t, *mut c_int) -> c_int;
        /// `int rbd_lock_acquire(rbd_image_t image, rbd_lock_mode_t lock_mode);`
        fn rbd_lock_acquire(rbd_image_t, rbd_lock_mode_t) -> c_int;
        /// `int rbd_lock_release(rbd_image_t image);`
        fn rbd_lock_release(rbd_image_t) -> c_int;
        /// `int rbd_lock_get_owners(rbd_image_t image, rbd_lock_mode_t *lock_mode,
        /// char **lock_owners, size_t *max_lock_owners);`
        fn rbd_lock_get_owners(rbd_image_t, *mut rbd_lock_mode_t, *mut *mut c_char, *mut usize) -> c_int;
        /// `void rbd_lock_get_owners_cleanup(char **lock_owners,
        /// size_t lock_owner_count);`
        fn rbd_lock_get_owners_cleanup(*mut *mut c_char, usize);
        /// `int rbd_lock_break(rbd_image_t image, rbd_lock_mode_t lock_mode,
        /// const char *lock_owner);`
        fn rbd_lock_break(rbd_image_t, rbd_lock_mode_t, *const c_char) -> c_int;
        /// `int rbd_watchers_list(rbd_image_t image, rbd_image_watcher_t *watchers,
        /// size_t *max_watchers);`
        fn rbd_watchers_list(rbd_image_t, *mut rbd_image_watcher_t, *mut usize) -> c_int;
        /// `void rbd_watchers_list_cleanup(rbd_image_watcher_t *watchers,
        /// size_t num_watchers);`
        fn rbd_watchers_list_cleanup(*mut rbd_image_watcher_t, usize);
        /// `int rbd_metadata_get(rbd_image_t image, const char *key, char *value,
        /// size_t *val_len);`
        fn rbd_metadata_get(rbd_image_t, *const c_char, *mut c_char, *mut usize) -> c_int;
        /// `int rbd_metadata_set(rbd_image_t image, const char *key, const char *value);`
        fn rbd_metadata_set(rbd_image_t, *const c_char, *const c_char) -> c_int;
        /// `int rbd_update_watch(rbd_image_t image, uint64_t *handle,
        /// rbd_update_callback_t watch_cb, void *arg);`
        fn rbd_update_watch(rbd_image_t, *mut u64, rbd_update_callback_t, *mut c_void) -> c_int;
        /// `int rbd_update_unwatch(rbd_image_t image, uint64_t handle);`
        fn rbd_update_unwatch(rbd_image_t, u64) -> c_int;
        /// `int rbd_get_id(rbd_image_t image, char *id, size_t id_len);` the
        /// image's id (its header object is `rbd_header.<id>`).
        fn rbd_get_id(rbd_image_t, *mut c_char, usize) -> c_int;
    }
}

/// The default file name of librados, for the dynamic loader.
pub const LIBRADOS: &str = "librados.so.2";
/// The default file name of librbd, for the dynamic loader.
pub const LIBRBD: &str = "librbd.so.1";

/// Why the Ceph libraries could not be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadError {
    /// The library (or `library: symbol`) that failed.
    pub what: String,
    /// The loader's message.
    pub message: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot use Ceph's client library {}: {} (an rbd: LUN needs librbd.so.1 and \
             librados.so.2 from Ceph 16 or later: apt-get install librbd1 librados2; \
             IRONSAN_LIBRBD / IRONSAN_LIBRADOS override the paths)",
            self.what, self.message
        )
    }
}

impl std::error::Error for LoadError {}

/// Looks a symbol up and copies the function pointer out.
///
/// # Safety
/// `T` must be the function pointer type of the C symbol `name`.
unsafe fn symbol<T: Copy>(lib: &Library, name: &str) -> Result<T, LoadError> {
    // SAFETY: the caller vouches for the type; the pointer is used only
    // while the library stays loaded (see `Api::libs`).
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| LoadError {
            what: format!("symbol {name}"),
            message: e.to_string(),
        })
}

fn open(path: &str) -> Result<Library, LoadError> {
    // SAFETY: loading librados/librbd runs their initialisers (C++ static
    // constructors), which have no preconditions on the caller.
    unsafe { Library::new(path) }.map_err(|e| LoadError {
        what: path.to_string(),
        message: e.to_string(),
    })
}

/// Loads librados from `rados` and librbd from `rbd` (paths or names the
/// dynamic loader searches for) and resolves every entry point. Most
/// callers want the process-wide [`api`].
pub fn load(rados: &str, rbd: &str) -> Result<Api, LoadError> {
    let rados_lib = open(rados)?;
    let rbd_lib = open(rbd)?;
    let mut api = Api::resolve(&rados_lib, &rbd_lib)?;
    api.libs = vec![rados_lib, rbd_lib];
    Ok(api)
}

/// The process-wide table, loaded on first use (`IRONSAN_LIBRADOS`,
/// `IRONSAN_LIBRBD` or the default names). A failure is remembered: the
/// same error comes back on every call.
pub fn api() -> Result<&'static Api, LoadError> {
    static API: OnceLock<Result<Api, LoadError>> = OnceLock::new();
    API.get_or_init(|| {
        let rados = std::env::var("IRONSAN_LIBRADOS").unwrap_or_else(|_| LIBRADOS.into());
        let rbd = std::env::var("IRONSAN_LIBRBD").unwrap_or_else(|_| LIBRBD.into());
        load(&rados, &rbd)
    })
    .as_ref()
    .map_err(Clone::clone)
}

impl Api {
    /// librbd's version as (major, minor, extra), e.g. (1, 16, 0).
    pub fn rbd_version(&self) -> (i32, i32, i32) {
        let (mut a, mut b, mut c) = (0, 0, 0);
        // SAFETY: rbd_version only writes the three ints it is given.
        unsafe { (self.rbd_version)(&mut a, &mut b, &mut c) };
        (a, b, c)
    }
}

impl fmt::Debug for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Api").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_clear_error() {
        let e = load("libironsan-no-such-rados.so.2", LIBRBD).unwrap_err();
        assert_eq!(e.what, "libironsan-no-such-rados.so.2");
        let text = e.to_string();
        assert!(text.contains("apt-get install librbd1 librados2"), "{text}");
        assert!(text.contains("libironsan-no-such-rados.so.2"), "{text}");
    }

    #[test]
    fn a_missing_symbol_is_a_clear_error() {
        // libc is always there and has none of these symbols.
        let e = load("libc.so.6", "libc.so.6").unwrap_err();
        assert_eq!(e.what, "symbol rados_create2");
    }

    #[test]
    fn image_info_has_the_c_layout() {
        // Checked against gcc on Debian 12's <rbd/librbd.h>.
        assert_eq!(std::mem::offset_of!(rbd_image_info_t, order), 24);
        assert_eq!(
            std::mem::offset_of!(rbd_image_info_t, block_name_prefix),
            28
        );
        assert_eq!(std::mem::offset_of!(rbd_image_info_t, parent_pool), 56);
        assert_eq!(std::mem::size_of::<rbd_image_info_t>(), 160);
    }

    /// The real libraries resolve (where librbd is installed:
    /// scripts/rbd.sh installs Ceph and runs it).
    #[test]
    #[ignore = "needs librbd and librados (scripts/rbd.sh installs Ceph and runs it)"]
    fn loads_the_real_libraries() {
        let api = load(LIBRADOS, LIBRBD).expect("librbd and librados load");
        assert!(api.rbd_version().1 >= 16);
    }
}
