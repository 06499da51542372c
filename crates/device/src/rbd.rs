//! A [`BlockDevice`] on a Ceph RBD image, through librbd's asynchronous API
//! (cargo feature `rbd`).
//!
//! Targets are named in qemu's vocabulary:
//! `rbd:POOL/IMAGE[:conf=PATH][:id=USER][:KEY=VALUE]...` — `conf` is the
//! ceph.conf to read (default: librados' search, `$CEPH_CONF` first), `id`
//! the client name without `client.`, and any other `KEY=VALUE` a librados
//! option set before connecting (as qemu does). `\:` escapes a colon.
//!
//! Every request is an `rbd_aio_*` call with its own completion; a
//! [`BlockDevice::write_batch`] submits all its writes before waiting for any,
//! so librbd keeps them all in flight (the device queue), and
//! [`BlockDevice::queue`] is a native queue on the same calls (see
//! [`queue`]: many requests in flight from one thread). librbd's own cache
//! is off unless the target asks for it (`:rbd_cache=true`): the volume
//! batches and flushes itself, and with the cache off a completed write is
//! already committed by the OSDs. A flush is still `rbd_aio_flush`, so the
//! contract holds under any configuration.
//!
//! A read-write open takes the image's exclusive lock (`rbd_lock_acquire`,
//! managed mode: librbd never hands it to another client on request), so a
//! second writer on any machine is refused with the holder's name.
//! [`crate::OpenOptions::break_lock`] breaks the current holder's lock first
//! (librbd blocklists that client, so a holder that is in fact alive is
//! fenced, not silently shared with). Without it, only the lock of a holder
//! that no longer watches the image (dead) is broken, loudly.
//!
//! While open, the device refuses every write, zeroing and flush once the
//! image was shrunk under it ([`Health`]: checked around every mutation and
//! by a header-update watch) or once a request timed out; dropping it waits
//! at most [`CLOSE_WAIT`] for librbd's close.
//!
//! The FFI below is written by hand rather than generated with bindgen: the
//! backend uses about twenty functions with plain C signatures (opaque
//! pointers, integers, `iovec`s), and a hand-written module keeps libclang
//! out of the build (bindgen needs it at build time, on every machine that
//! builds with `--features rbd`). The declarations follow Ceph 16.2's
//! `rados/librados.h` and `rbd/librbd.h`; every function used exists since
//! Ceph 14 (`rbd_aio_write_zeroes` since 15).

mod queue;

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io::{self, IoSlice, IoSliceMut};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{
    check_request, iov_len, iov_len_mut, BlockDevice, DeviceError, Extent, IoPriority, IoQueue,
    Result, WriteReq,
};

#[allow(non_camel_case_types)]
mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    pub type rados_t = *mut c_void;
    pub type rados_ioctx_t = *mut c_void;
    pub type rbd_image_t = *mut c_void;
    pub type rbd_completion_t = *mut c_void;
    pub type rbd_callback_t = Option<unsafe extern "C" fn(rbd_completion_t, *mut c_void)>;
    /// `rbd_update_callback_t`: called after the image's header changed.
    pub type rbd_update_callback_t = Option<unsafe extern "C" fn(*mut c_void)>;
    /// `rbd_lock_mode_t`: a C enum (int).
    pub type rbd_lock_mode_t = c_int;
    pub const RBD_LOCK_MODE_EXCLUSIVE: rbd_lock_mode_t = 0;

    /// `rbd_image_watcher_t`.
    #[repr(C)]
    pub struct rbd_image_watcher_t {
        pub addr: *mut c_char,
        pub id: i64,
        pub cookie: u64,
    }

    #[link(name = "rados")]
    extern "C" {
        pub fn rados_create(cluster: *mut rados_t, id: *const c_char) -> c_int;
        pub fn rados_conf_read_file(cluster: rados_t, path: *const c_char) -> c_int;
        pub fn rados_conf_set(
            cluster: rados_t,
            option: *const c_char,
            value: *const c_char,
        ) -> c_int;
        pub fn rados_conf_get(
            cluster: rados_t,
            option: *const c_char,
            buf: *mut c_char,
            len: usize,
        ) -> c_int;
        pub fn rados_connect(cluster: rados_t) -> c_int;
        pub fn rados_cluster_fsid(cluster: rados_t, buf: *mut c_char, len: usize) -> c_int;
        pub fn rados_shutdown(cluster: rados_t);
        pub fn rados_ioctx_create(
            cluster: rados_t,
            pool_name: *const c_char,
            ioctx: *mut rados_ioctx_t,
        ) -> c_int;
        pub fn rados_ioctx_destroy(io: rados_ioctx_t);
        pub fn rados_set_pool_full_try(io: rados_ioctx_t);
    }

    #[link(name = "rbd")]
    extern "C" {
        pub fn rbd_create(
            io: rados_ioctx_t,
            name: *const c_char,
            size: u64,
            order: *mut c_int,
        ) -> c_int;
        pub fn rbd_remove(io: rados_ioctx_t, name: *const c_char) -> c_int;
        pub fn rbd_open(
            io: rados_ioctx_t,
            name: *const c_char,
            image: *mut rbd_image_t,
            snap_name: *const c_char,
        ) -> c_int;
        pub fn rbd_open_read_only(
            io: rados_ioctx_t,
            name: *const c_char,
            image: *mut rbd_image_t,
            snap_name: *const c_char,
        ) -> c_int;
        pub fn rbd_close(image: rbd_image_t) -> c_int;
        pub fn rbd_get_size(image: rbd_image_t, size: *mut u64) -> c_int;
        pub fn rbd_get_id(image: rbd_image_t, id: *mut c_char, id_len: usize) -> c_int;
        pub fn rbd_resize(image: rbd_image_t, size: u64) -> c_int;

        pub fn rbd_lock_acquire(image: rbd_image_t, lock_mode: rbd_lock_mode_t) -> c_int;
        pub fn rbd_is_exclusive_lock_owner(image: rbd_image_t, is_owner: *mut c_int) -> c_int;
        pub fn rbd_lock_get_owners(
            image: rbd_image_t,
            lock_mode: *mut rbd_lock_mode_t,
            lock_owners: *mut *mut c_char,
            max_lock_owners: *mut usize,
        ) -> c_int;
        pub fn rbd_lock_get_owners_cleanup(lock_owners: *mut *mut c_char, lock_owner_count: usize);
        pub fn rbd_lock_break(
            image: rbd_image_t,
            lock_mode: rbd_lock_mode_t,
            lock_owner: *const c_char,
        ) -> c_int;
        pub fn rbd_watchers_list(
            image: rbd_image_t,
            watchers: *mut rbd_image_watcher_t,
            max_watchers: *mut usize,
        ) -> c_int;
        pub fn rbd_watchers_list_cleanup(watchers: *mut rbd_image_watcher_t, num_watchers: usize);

        pub fn rbd_aio_create_completion(
            cb_arg: *mut c_void,
            complete_cb: rbd_callback_t,
            c: *mut rbd_completion_t,
        ) -> c_int;
        pub fn rbd_aio_is_complete(c: rbd_completion_t) -> c_int;
        pub fn rbd_aio_wait_for_complete(c: rbd_completion_t) -> c_int;
        pub fn rbd_aio_get_return_value(c: rbd_completion_t) -> isize;
        pub fn rbd_aio_release(c: rbd_completion_t);

        pub fn rbd_aio_writev(
            image: rbd_image_t,
            iov: *const libc::iovec,
            iovcnt: c_int,
            off: u64,
            c: rbd_completion_t,
        ) -> c_int;
        pub fn rbd_aio_readv(
            image: rbd_image_t,
            iov: *const libc::iovec,
            iovcnt: c_int,
            off: u64,
            c: rbd_completion_t,
        ) -> c_int;
        pub fn rbd_aio_write_zeroes(
            image: rbd_image_t,
            off: u64,
            len: usize,
            c: rbd_completion_t,
            zero_flags: c_int,
            op_flags: c_int,
        ) -> c_int;
        pub fn rbd_aio_flush(image: rbd_image_t, c: rbd_completion_t) -> c_int;

        pub fn rbd_update_watch(
            image: rbd_image_t,
            handle: *mut u64,
            watch_cb: rbd_update_callback_t,
            arg: *mut c_void,
        ) -> c_int;
        pub fn rbd_update_unwatch(image: rbd_image_t, handle: u64) -> c_int;

        pub fn rbd_diff_iterate2(
            image: rbd_image_t,
            fromsnapname: *const c_char,
            ofs: u64,
            len: u64,
            include_parent: u8,
            whole_object: u8,
            cb: Option<unsafe extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int>,
            arg: *mut c_void,
        ) -> c_int;
    }
}

/// The logical block size the RBD backend reports (librbd takes any byte
/// range; 512 keeps the volume's superblock write to one sector).
pub const RBD_BLOCK_SIZE: u32 = 512;

/// Most iovecs one request passes to librbd; longer vectors are bounced
/// through one buffer.
const MAX_IOV: usize = 1024;

/// Largest range one `rbd_aio_write_zeroes` call zeroes: larger ones are
/// split (librbd takes a `size_t` length, and one call per GiB keeps each
/// request's work bounded).
const ZEROES_STEP: u64 = 1 << 30;

/// Longest pool or image name a target may give, in bytes.
pub const MAX_NAME_BYTES: usize = 255;

/// The `rados_osd_op_timeout` (seconds) every connection gets unless the
/// target sets its own (`:rados_osd_op_timeout=N`; 0 is librados' own
/// default, no timeout). Without it an OSD that stops answering blocks a
/// request — and with it the volume, and a server's shutdown — for ever; with
/// it the request fails with `ETIMEDOUT` and the volume aborts (fail-stop).
/// A timed-out write may still land later: that is safe, see
/// ARCHITECTURE.md ("An OSD that stops answering").
pub const DEFAULT_OSD_OP_TIMEOUT_SECS: u32 = 30;

/// A parsed `rbd:POOL/IMAGE[:conf=PATH][:id=USER][:KEY=VALUE]...` target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdTarget {
    pub pool: String,
    pub image: String,
    /// ceph.conf path (`conf=`).
    pub conf: Option<String>,
    /// Client id without `client.` (`id=`).
    pub id: Option<String>,
    /// Other `KEY=VALUE` options, set with `rados_conf_set` in order.
    pub options: Vec<(String, String)>,
}

impl RbdTarget {
    /// True if `s` names an RBD target (starts with `rbd:`).
    pub fn is_target(s: &str) -> bool {
        s.starts_with("rbd:")
    }

    /// Parses a target string. Errors name what is wrong; nothing panics.
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        let rest = s.strip_prefix("rbd:").ok_or_else(|| {
            format!("{s:?} is not an RBD target (rbd:POOL/IMAGE[:conf=PATH][:id=USER])")
        })?;
        let fields = split_unescaped(rest)?;
        let mut it = fields.into_iter();
        let spec = it.next().unwrap_or_default();
        let (pool, image) = spec
            .split_once('/')
            .ok_or_else(|| format!("RBD target {s:?}: expected POOL/IMAGE after rbd:"))?;
        if pool.is_empty() || image.is_empty() {
            return Err(format!("RBD target {s:?}: empty pool or image name"));
        }
        if image.contains('/') {
            return Err(format!(
                "RBD target {s:?}: namespaces (POOL/NS/IMAGE) are not supported"
            ));
        }
        if image.contains('@') {
            return Err(format!(
                "RBD target {s:?}: snapshots (IMAGE@SNAP) are not supported: a volume needs a writable image"
            ));
        }
        for (what, part) in [("pool", pool), ("image", image)] {
            if part.contains('\0') {
                return Err(format!(
                    "RBD target {s:?}: the {what} name contains a NUL byte"
                ));
            }
            if part.len() > MAX_NAME_BYTES {
                return Err(format!(
                    "RBD target {s:?}: the {what} name is too long ({} bytes; at most {MAX_NAME_BYTES})",
                    part.len()
                ));
            }
        }
        let mut t = RbdTarget {
            pool: pool.to_string(),
            image: image.to_string(),
            conf: None,
            id: None,
            options: Vec::new(),
        };
        for opt in it {
            let (k, v) = opt
                .split_once('=')
                .ok_or_else(|| format!("RBD target {s:?}: option {opt:?} is not KEY=VALUE"))?;
            if k.is_empty() || k.contains('\0') || v.contains('\0') {
                return Err(format!("RBD target {s:?}: bad option {opt:?}"));
            }
            match k {
                "conf" => t.conf = Some(v.to_string()),
                "id" => t.id = Some(v.to_string()),
                _ => t.options.push((k.to_string(), v.to_string())),
            }
        }
        Ok(t)
    }

    /// `rbd:POOL/IMAGE` (no options): how logs and errors name it.
    pub fn short_name(&self) -> String {
        format!("rbd:{}/{}", self.pool, self.image)
    }

    /// The full target string, which [`RbdTarget::parse`] reads back as
    /// this target (`:` and `\` in values escaped).
    pub fn spec(&self) -> String {
        let esc = |s: &str| s.replace('\\', "\\\\").replace(':', "\\:");
        let mut out = format!("rbd:{}/{}", esc(&self.pool), esc(&self.image));
        let named = [("conf", &self.conf), ("id", &self.id)];
        for (k, v) in named
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (*k, v)))
        {
            out.push_str(&format!(":{k}={}", esc(v)));
        }
        for (k, v) in &self.options {
            out.push_str(&format!(":{}={}", esc(k), esc(v)));
        }
        out
    }

    /// True if the target says which cluster it connects to, or as whom:
    /// `conf=`, `id=`, or one of [`CLUSTER_OPTIONS`].
    pub fn names_cluster(&self) -> bool {
        self.conf.is_some()
            || self.id.is_some()
            || self.options.iter().any(|(k, _)| {
                let k = k.replace('-', "_");
                CLUSTER_OPTIONS.contains(&k.as_str())
            })
    }

    /// This target (a volume's external journal) on the cluster of `home`
    /// (the volume's home image): a journal target that names no cluster
    /// ([`RbdTarget::names_cluster`]) takes the home's `conf=`, `id=` and
    /// options, then its own options (which override them). One that names
    /// a cluster is taken as given. Without this a bare `rbd:POOL/IMAGE`
    /// journal would be opened on the node's default cluster
    /// (`$CEPH_CONF`, /etc/ceph/ceph.conf), which need not be the home's.
    pub fn on_cluster_of(&self, home: &RbdTarget) -> RbdTarget {
        if self.names_cluster() {
            return self.clone();
        }
        RbdTarget {
            pool: self.pool.clone(),
            image: self.image.clone(),
            conf: home.conf.clone(),
            id: home.id.clone(),
            options: home
                .options
                .iter()
                .chain(self.options.iter())
                .cloned()
                .collect(),
        }
    }
}

/// The librados options (with `_` for `-`) that say which cluster a
/// target connects to or as whom, besides `conf=` and `id=`: a journal
/// target naming one of them is not put on its home's cluster
/// ([`RbdTarget::on_cluster_of`]).
pub const CLUSTER_OPTIONS: &[&str] = &[
    "mon_host",
    "mon_dns_srv_name",
    "keyring",
    "key",
    "keyfile",
    "name",
    "cluster",
];

/// Splits on `:` not preceded by a backslash; `\:` becomes `:` and `\\` a
/// backslash.
fn split_unescaped(s: &str) -> std::result::Result<Vec<String>, String> {
    let mut out = vec![String::new()];
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(n) => out.last_mut().map(|l| l.push(n)).unwrap_or_default(),
                None => return Err(format!("RBD target {s:?} ends in a lone backslash")),
            },
            ':' => out.push(String::new()),
            c => out.last_mut().map(|l| l.push(c)).unwrap_or_default(),
        }
    }
    Ok(out)
}

/// How to open an RBD target.
#[derive(Clone, Debug, Default)]
pub struct RbdOpenOptions {
    pub read_only: bool,
    /// Take the exclusive lock (read-write opens only).
    pub exclusive: bool,
    /// Break the current holder's exclusive lock before taking it.
    pub break_lock: bool,
    /// Create the image with this size if it does not exist; grow a
    /// smaller one to it.
    pub create_size: Option<u64>,
}

fn cstring(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| DeviceError::Invalid(format!("{what} contains a NUL byte")))
}

fn rbd_err(op: &'static str, what: &str, r: c_int) -> DeviceError {
    DeviceError::io(op, what, io::Error::from_raw_os_error(r.saturating_neg()))
}

/// A connected librados client.
struct Cluster(ffi::rados_t);

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.0.is_null() {
            return; // handed to the close thread (`Closing`)
        }
        // SAFETY: the handle came from a successful rados_create, every ioctx
        // and image opened on it was dropped before (field order of
        // RbdDevice and `Closing`), and it is shut down exactly once here.
        unsafe { ffi::rados_shutdown(self.0) }
    }
}

/// An I/O context on one pool.
struct Ioctx(ffi::rados_ioctx_t);

impl Drop for Ioctx {
    fn drop(&mut self) {
        if self.0.is_null() {
            return; // handed to the close thread (`Closing`)
        }
        // SAFETY: from a successful rados_ioctx_create; the image opened on
        // it is closed before (field order of RbdDevice and `Closing`);
        // destroyed once.
        unsafe { ffi::rados_ioctx_destroy(self.0) }
    }
}

/// One librbd completion. Dropping it waits for the request it was given to
/// (if any) before releasing it, so a buffer borrowed by the request is
/// never freed while librbd may still touch it — also on early returns.
struct Completion {
    c: ffi::rbd_completion_t,
    submitted: bool,
    waited: bool,
}

impl Completion {
    fn new(what: &str) -> Result<Self> {
        let mut c: ffi::rbd_completion_t = ptr::null_mut();
        // SAFETY: no callback and a null argument; `c` is a valid out pointer.
        let r = unsafe { ffi::rbd_aio_create_completion(ptr::null_mut(), None, &mut c) };
        if r < 0 || c.is_null() {
            return Err(rbd_err(
                "rbd_aio_create_completion",
                what,
                r.min(-libc::ENOMEM),
            ));
        }
        Ok(Self {
            c,
            submitted: false,
            waited: false,
        })
    }

    /// Records the result of the submitting call (`r` < 0: not submitted).
    fn submitted(&mut self, op: &'static str, what: &str, r: c_int) -> Result<()> {
        if r < 0 {
            return Err(rbd_err(op, what, r));
        }
        self.submitted = true;
        Ok(())
    }

    /// Waits for the request and returns its result (bytes or 0).
    fn wait(&mut self, op: &'static str, what: &str) -> Result<u64> {
        self.wait_done();
        self.result(op, what)
    }

    /// Waits until the submitted request completed (at once if it did).
    fn wait_done(&mut self) {
        if self.submitted && !self.waited {
            // SAFETY: `c` is a live completion that was handed to a request.
            unsafe { ffi::rbd_aio_wait_for_complete(self.c) };
        }
        self.waited = true;
    }

    /// Whether the submitted request completed, without blocking. Once it
    /// says yes, librbd is done with the request's memory, as after
    /// `rbd_aio_wait_for_complete` (both wait for the same final state).
    fn is_complete(&mut self) -> bool {
        if !self.submitted {
            return false;
        }
        if !self.waited {
            // SAFETY: `c` is a live completion that was handed to a request.
            self.waited = unsafe { ffi::rbd_aio_is_complete(self.c) } != 0;
        }
        self.waited
    }

    /// The result of a completed request (bytes or 0). Call only after
    /// `wait_done` or a `true` from `is_complete`.
    fn result(&self, op: &'static str, what: &str) -> Result<u64> {
        debug_assert!(self.submitted && self.waited);
        // SAFETY: the request completed (callers waited or saw it complete);
        // reading its value is allowed until release.
        let r = unsafe { ffi::rbd_aio_get_return_value(self.c) };
        if r < 0 {
            return Err(rbd_err(op, what, c_int::try_from(r).unwrap_or(-libc::EIO)));
        }
        Ok(r as u64)
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if self.submitted && !self.waited {
            // SAFETY: a submitted request not yet waited for: wait so that
            // its buffers outlive it.
            unsafe { ffi::rbd_aio_wait_for_complete(self.c) };
        }
        // SAFETY: created by rbd_aio_create_completion, released exactly once,
        // and (above) never while its request is in flight.
        unsafe { ffi::rbd_aio_release(self.c) }
    }
}

/// An open RBD image.
pub struct RbdDevice {
    // Field order is drop order: the image closes before its ioctx, the
    // ioctx before the cluster connection. (`Drop for RbdDevice` hands all
    // three to a close thread; these drops then do nothing.)
    image: Image,
    _io: Ioctx,
    _cluster: Cluster,
    name: String,
    size: u64,
    read_only: bool,
    /// This handle took the image's exclusive lock.
    locked: bool,
    /// Shrinks and timeouts seen; shared with the header-update callback.
    health: Arc<Health>,
    /// The image's id (None if librbd would not say) and `POOL/IMAGE`.
    identity: Option<crate::Identity>,
    /// The `rbd_update_watch` handle of [`on_header_update`], if registered.
    update_watch: Option<u64>,
}

struct Image(ffi::rbd_image_t);

impl Drop for Image {
    fn drop(&mut self) {
        if self.0.is_null() {
            return; // handed to the close thread (`Closing`)
        }
        // SAFETY: from a successful rbd_open; every request on it has
        // completed (each call waits for its completions before returning,
        // and a queue, which borrows the device, waits for its requests when
        // it is dropped); closed once. Closing releases the exclusive lock.
        unsafe { ffi::rbd_close(self.0) };
    }
}

/// How long dropping a device waits for librbd to close the image — which
/// releases the exclusive lock, an OSD request — before it returns and
/// leaves the close to finish (or time out) on its own thread. On a
/// healthy cluster the close takes milliseconds; an OSD that does not
/// answer would hold it for `rados_osd_op_timeout` per request (a server's
/// SIGTERM took four of them, two minutes, before session 21).
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// What the device learnt while open that makes later requests fail at
/// once: the image was shrunk under it, or a request timed out. Shared
/// with librbd's header-update callback ([`on_header_update`]).
struct Health {
    image: ffi::rbd_image_t,
    name: String,
    /// `POOL/IMAGE`, as the `rbd` tool names it.
    spec: String,
    /// The image's size when it was opened.
    open_size: u64,
    /// The bytes its user touches ([`BlockDevice::set_bytes_in_use`]; the
    /// open size until told): a shrink below this fails the device.
    in_use: AtomicU64,
    /// The smaller size the image was found at (`u64::MAX`: never).
    shrunk_to: AtomicU64,
    /// A request failed with `ETIMEDOUT` (`rados_osd_op_timeout`).
    timed_out: AtomicBool,
    /// That timeout, as librados prints it (for messages).
    op_timeout: String,
    /// When the device was opened: the origin of `proof_ns`.
    opened: Instant,
    /// Nanoseconds after `opened` when the newest request known to have
    /// succeeded on the cluster was submitted: proof that this client was
    /// not blocklisted then, since the OSDs refuse every request they
    /// process after a blocklisting ([`BlockDevice::confirm_ownership`]).
    /// The submission, not the completion: a request submitted before a
    /// blocklisting may complete after it.
    proof_ns: AtomicU64,
    /// One ownership probe at a time; the others wait for its answer, and
    /// those that asked after it was sent send the next.
    probing: std::sync::Mutex<()>,
    /// This client took the image's exclusive lock at open.
    locked: bool,
    /// librbd said the image's header changed (features, size, ...): the
    /// next request asks whether the lock is still this client's.
    header_changed: AtomicBool,
    /// The exclusive lock is no longer this client's (the feature was
    /// disabled, or another client took the lock): every request fails with
    /// ESHUTDOWN from then on.
    lock_lost: AtomicBool,
}

// SAFETY: the image handle is used only for rbd_get_size, which librbd
// allows on a shared handle from any thread (see RbdDevice's Send); the
// rest is atomics and immutable strings.
unsafe impl Send for Health {}
// SAFETY: as for Send: every method takes &self and is thread-safe.
unsafe impl Sync for Health {}

impl Health {
    /// Fails with ESHUTDOWN once the image's exclusive lock is no longer
    /// this client's. librbd lets another client disable the
    /// exclusive-lock feature of an image in use (the owner carries the
    /// change out), and then a second writer can open it; this client is
    /// not blocklisted, so its requests still succeed, and its memory may
    /// hold blocks the other writer overwrote (session 25's RBD pass read
    /// such a block back). Asked after each header change librbd reports,
    /// and after a failed request.
    fn check_lock(&self, op: &'static str) -> Result<()> {
        if !self.locked {
            return Ok(());
        }
        // A load first: every request comes here, and an unconditional
        // swap would make them all write one shared cache line.
        if self.header_changed.load(Ordering::Acquire)
            && self.header_changed.swap(false, Ordering::AcqRel)
            && !self.lock_lost.load(Ordering::Acquire)
        {
            self.ask_lock_owner();
        }
        if self.lock_lost.load(Ordering::Acquire) {
            return Err(DeviceError::io(
                op,
                format!(
                    "{} (its exclusive lock is no longer this client's: the exclusive-lock \
                     feature was disabled, or the lock taken, by another client; reopen the \
                     image once no other client writes it)",
                    self.name
                ),
                io::Error::from_raw_os_error(libc::ESHUTDOWN),
            ));
        }
        Ok(())
    }

    /// Asks librbd whether this client still owns the exclusive lock, and
    /// records (and logs, once) that it does not.
    fn ask_lock_owner(&self) {
        let mut owner: c_int = 0;
        // SAFETY: an open image (as for rbd_get_size) and a valid out pointer.
        let r = unsafe { ffi::rbd_is_exclusive_lock_owner(self.image, &mut owner) };
        if r == 0 && owner == 0 && !self.lock_lost.swap(true, Ordering::AcqRel) {
            tracing::error!(
                "{}: this client no longer holds the image's exclusive lock (another client \
                 disabled the exclusive-lock feature, or took the lock): every request fails \
                 from now on, reads included (another writer may have changed the image)",
                self.name
            );
        }
    }

    /// A request succeeded on the cluster just now.
    /// Now, in nanoseconds after `opened`: a request's submission time.
    fn now_ns(&self) -> u64 {
        self.opened.elapsed().as_nanos() as u64
    }

    /// Records that a request submitted at `submitted_ns` succeeded. A
    /// load first: a store only when it is newer than the record, not a
    /// shared read-modify-write per completion.
    fn confirmed(&self, submitted_ns: u64) {
        if submitted_ns > self.proof_ns.load(Ordering::Acquire) {
            self.proof_ns.fetch_max(submitted_ns, Ordering::AcqRel);
        }
    }

    /// Whether a request submitted at or after `since` has succeeded.
    fn proven_since(&self, since: Instant) -> bool {
        let since_ns = since.saturating_duration_since(self.opened).as_nanos() as u64;
        self.proof_ns.load(Ordering::Acquire) >= since_ns
    }

    /// The image's size now (librbd refreshes its header first if another
    /// client changed it); a size below the open size is recorded, logged
    /// once, and returned as the error every later write gets.
    fn poll_size(&self, op: &'static str) -> Result<()> {
        if let Some(e) = self.shrink_error(op) {
            return Err(e);
        }
        let mut size = 0u64;
        // SAFETY: an open image (the device, or the close thread before it
        // unwatches, keeps it open while this runs) and a valid out pointer.
        let r = unsafe { ffi::rbd_get_size(self.image, &mut size) };
        if r < 0 {
            return Err(rbd_err("rbd_get_size", &self.name, r));
        }
        if size < self.in_use.load(Ordering::Acquire) {
            if self
                .shrunk_to
                .compare_exchange(u64::MAX, size, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                tracing::error!("{}: {}", self.name, self.shrink_text(size));
            }
            return Err(self.shrink_error(op).unwrap_or_else(|| {
                DeviceError::io(op, self.name.clone(), io::Error::other("image shrunk"))
            }));
        }
        Ok(())
    }

    fn shrink_error(&self, op: &'static str) -> Option<DeviceError> {
        let to = self.shrunk_to.load(Ordering::Acquire);
        (to != u64::MAX).then(|| {
            DeviceError::io(
                op,
                self.name.clone(),
                io::Error::other(self.shrink_text(to)),
            )
        })
    }

    fn shrink_text(&self, to: u64) -> String {
        let from = self.open_size;
        let used = self.in_use.load(Ordering::Acquire).min(from);
        format!(
            "the image was shrunk from {from} to {to} bytes by another client (rbd resize \
             --allow-shrink) while it was open, below the {used} bytes in use: every write to \
             it is refused from then on, and reads past byte {to} fail; whatever had reached \
             bytes {to}..{used} was deleted with the shrink. Grow it back (rbd resize --size \
             {from}B {}) and reopen it: the journal replays what it still holds",
            self.spec
        )
    }

    /// Notes a failed request: a timeout marks the cluster as not
    /// answering (logged once). Returns the error, or the shrink error if
    /// the image was shrunk (a read past the new end fails with EINVAL).
    fn failed(&self, op: &'static str, e: DeviceError) -> DeviceError {
        // A request refused because the lock went elsewhere (EPERM, EIO,
        // EROFS from librbd) is the lock's loss, said as such.
        if self.locked && !self.lock_lost.load(Ordering::Acquire) {
            self.ask_lock_owner();
        }
        if let Err(lost) = self.check_lock(op) {
            return lost;
        }
        if let DeviceError::Io { error, .. } = &e {
            if error.raw_os_error() == Some(libc::ETIMEDOUT)
                && !self.timed_out.swap(true, Ordering::AcqRel)
            {
                tracing::error!(
                    "{}: a request timed out (rados_osd_op_timeout {} s): the cluster is taken as \
                     not answering, and every later write and flush fails at once until the \
                     image is reopened",
                    self.name,
                    self.op_timeout
                );
            }
        }
        match self.poll_size(op) {
            Err(shrunk) if self.shrunk_to.load(Ordering::Acquire) != u64::MAX => shrunk,
            _ => e,
        }
    }

    /// Before a write, zeroing or flush is sent: refused at once after a
    /// timeout, or when the image was shrunk.
    fn check_mutation(&self, op: &'static str) -> Result<()> {
        self.check_lock(op)?;
        if self.timed_out.load(Ordering::Acquire) {
            return Err(DeviceError::io(
                op,
                self.name.clone(),
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "not sent: an earlier request timed out (rados_osd_op_timeout {} s), so \
                         the cluster is taken as not answering until the image is reopened",
                        self.op_timeout
                    ),
                ),
            ));
        }
        self.poll_size(op)
    }
}

/// librbd's header-update callback: a resize by another client (the lock
/// owner, which is this process, carries it out for them) is noticed at
/// once, and logged, not only at the next request.
unsafe extern "C" fn on_header_update(arg: *mut c_void) {
    // SAFETY: `arg` is the `Health` registered with this callback; the
    // device keeps it alive until `rbd_update_unwatch` returned, which
    // waits for a callback in progress (`Closing::close`).
    let health = unsafe { &*arg.cast::<Health>() };
    // Asked outside librbd's callback, by the next request.
    health.header_changed.store(true, Ordering::Release);
    let _ = health.poll_size("header update");
}

/// The handles of a device being closed, for the close thread (see
/// [`CLOSE_WAIT`]). Field order is drop order.
struct Closing {
    image: Image,
    _io: Ioctx,
    _cluster: Cluster,
    update_watch: Option<u64>,
    _health: Arc<Health>,
}

// SAFETY: librbd and librados handles may be closed from any thread; this
// one is their only owner.
unsafe impl Send for Closing {}

impl Closing {
    /// Unwatches and closes the image (releasing its lock); `rbd_close`'s
    /// result. The ioctx and cluster go when `self` is dropped.
    fn close(mut self) -> c_int {
        if let Some(h) = self.update_watch.take() {
            // SAFETY: an open image and the handle rbd_update_watch gave;
            // waits for a callback in progress, whose Health we still hold.
            unsafe { ffi::rbd_update_unwatch(self.image.0, h) };
        }
        let image = std::mem::replace(&mut self.image.0, ptr::null_mut());
        // SAFETY: from a successful rbd_open, closed once (the Image drop
        // now sees null); every request on it completed (see Image).
        unsafe { ffi::rbd_close(image) }
    }
}

impl Drop for RbdDevice {
    /// Closes the image on its own thread and waits at most [`CLOSE_WAIT`]:
    /// an OSD that does not answer cannot hold a server's shutdown for
    /// `rados_osd_op_timeout` per request. If the close does not finish,
    /// the lock stays with this client: the log says so and how it ends.
    fn drop(&mut self) {
        let take = |p: &mut *mut c_void| std::mem::replace(p, ptr::null_mut());
        let closing = Closing {
            image: Image(take(&mut self.image.0)),
            _io: Ioctx(take(&mut self._io.0)),
            _cluster: Cluster(take(&mut self._cluster.0)),
            update_watch: self.update_watch.take(),
            _health: self.health.clone(),
        };
        let rx = match crate::bounded::spawn_with_result("jbdev-rbd-close", move || closing.close())
        {
            Ok(rx) => rx,
            Err(e) => {
                // The closure (and the handles in it) was dropped unrun: the
                // Image drop closed the image inline.
                tracing::warn!("{}: closed without a close thread ({e})", self.name);
                return;
            }
        };
        let lock = if self.locked {
            "; the exclusive lock could not be released: it stays with this client until \
             the next read-write open breaks it, which it does once this client's watch on \
             the image has expired (osd_client_watch_timeout, 30 s by default)"
        } else {
            ""
        };
        match rx.recv_timeout(CLOSE_WAIT) {
            Ok(0) => {}
            Ok(r) => tracing::warn!(
                "{}: closing the image failed ({}){lock}",
                self.name,
                io::Error::from_raw_os_error(-r)
            ),
            Err(_) => tracing::warn!(
                "{}: the cluster did not answer the close within {} s{lock}",
                self.name,
                CLOSE_WAIT.as_secs()
            ),
        }
    }
}

// SAFETY: librbd image, ioctx and cluster handles are safe to use from any
// thread and concurrently (librbd serializes internally; qemu and rbd-nbd
// issue aio on one image from many threads). The handles are only closed in
// Drop, which has exclusive access.
unsafe impl Send for RbdDevice {}
// SAFETY: see Send: every method takes &self and only issues librbd calls
// that are documented thread-safe on a shared image handle.
unsafe impl Sync for RbdDevice {}

impl RbdDevice {
    /// Opens (and with `create_size` creates) the image a target names.
    pub fn open(target: &RbdTarget, opts: &RbdOpenOptions) -> Result<Self> {
        let name = target.short_name();
        let (cluster, io) = connect_pool(target, &name)?;
        let img_name = cstring("image name", &target.image)?;
        let image = match open_image(&io, &img_name, opts.read_only, &name) {
            Err(DeviceError::Io { error, .. })
                if error.raw_os_error() == Some(libc::ENOENT)
                    && opts.create_size.is_some()
                    && !opts.read_only =>
            {
                let size = opts.create_size.unwrap_or_default();
                let mut order: c_int = 0;
                // SAFETY: a live ioctx, a NUL-terminated name, a valid out pointer
                // (order 0: librbd's default object size).
                let r = unsafe { ffi::rbd_create(io.0, img_name.as_ptr(), size, &mut order) };
                if r < 0 && r != -libc::EEXIST {
                    return Err(rbd_err("rbd_create", &name, r));
                }
                tracing::info!("created RBD image {name} of {size} bytes");
                open_image(&io, &img_name, false, &name)?
            }
            other => other?,
        };
        let locked = !opts.read_only && opts.exclusive;
        if locked {
            let break_lock = opts.break_lock.then(|| break_lock_wait(&cluster));
            lock(&image, &name, break_lock)?;
        }
        let identity = image_id(&image).map(|id| crate::Identity {
            id: format!("rbd:{}/{id}", target.pool),
            name: format!("rbd:{}/{}", target.pool, target.image),
        });
        let mut size = image_size(&image, &name)?;
        if let Some(want) = opts.create_size.filter(|_| !opts.read_only) {
            if size < want {
                // SAFETY: an open, writable (and locked) image.
                let r = unsafe { ffi::rbd_resize(image.0, want) };
                if r < 0 {
                    return Err(rbd_err("rbd_resize", &name, r));
                }
                size = image_size(&image, &name)?;
            }
        }
        let health = Arc::new(Health {
            image: image.0,
            name: name.clone(),
            spec: format!("{}/{}", target.pool, target.image),
            open_size: size,
            in_use: AtomicU64::new(size),
            shrunk_to: AtomicU64::new(u64::MAX),
            timed_out: AtomicBool::new(false),
            op_timeout: conf_get(&cluster, "rados_osd_op_timeout").unwrap_or_else(|| "?".into()),
            opened: Instant::now(),
            // The open took the lock before `opened`: proof as of then.
            proof_ns: AtomicU64::new(0),
            probing: std::sync::Mutex::new(()),
            locked,
            header_changed: AtomicBool::new(false),
            lock_lost: AtomicBool::new(false),
        });
        let mut handle = 0u64;
        // SAFETY: an open image; the callback's argument is the Health
        // this device keeps (an Arc) until the watch is removed in its
        // close (`Closing::close`).
        let r = unsafe {
            ffi::rbd_update_watch(
                image.0,
                &mut handle,
                Some(on_header_update),
                Arc::as_ptr(&health).cast_mut().cast::<c_void>(),
            )
        };
        if r < 0 {
            // Every request still checks the size; only the early log goes.
            tracing::debug!(
                "{name}: no header-update watch ({})",
                io::Error::from_raw_os_error(-r)
            );
        }
        Ok(Self {
            image,
            _io: io,
            _cluster: cluster,
            name,
            size: size - size % u64::from(RBD_BLOCK_SIZE),
            read_only: opts.read_only,
            locked,
            health,
            identity,
            update_watch: (r >= 0).then_some(handle),
        })
    }

    /// `rbd:POOL/IMAGE`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The value of a librados/librbd option on this device's connection
    /// (e.g. `rados_osd_op_timeout`), as librados prints it.
    pub fn conf_value(&self, key: &str) -> Option<String> {
        conf_get(&self._cluster, key)
    }

    fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(DeviceError::io(
                "write",
                self.name.clone(),
                io::Error::from_raw_os_error(libc::EROFS),
            ));
        }
        Ok(())
    }

    /// [`RbdDevice::check_writable`], then [`Health::check_mutation`].
    fn check_mutation(&self, op: &'static str) -> Result<()> {
        self.check_writable()?;
        self.health.check_mutation(op)
    }

    /// Submits one vectored write on `comp` (not waited for).
    fn submit_write(&self, comp: &mut Completion, bufs: &[IoSlice<'_>], offset: u64) -> Result<()> {
        // IoSlice is ABI-compatible with struct iovec on Unix (std documents it).
        let iov = bufs.as_ptr().cast::<libc::iovec>();
        // SAFETY: `bufs` (≤ MAX_IOV entries, checked by the callers) stays
        // borrowed until `comp` is waited for (the callers wait, or
        // Completion::drop does); the image is open.
        let r =
            unsafe { ffi::rbd_aio_writev(self.image.0, iov, bufs.len() as c_int, offset, comp.c) };
        comp.submitted("rbd_aio_writev", &self.name, r)
    }

    /// Writes `bufs` at `offset` and waits (bouncing very long vectors).
    fn write_wait(&self, bufs: &[IoSlice<'_>], offset: u64) -> Result<()> {
        let bounce;
        let one;
        let bufs = if bufs.len() > MAX_IOV {
            bounce = bufs
                .iter()
                .flat_map(|b| b.iter().copied())
                .collect::<Vec<u8>>();
            one = [IoSlice::new(&bounce)];
            &one[..]
        } else {
            bufs
        };
        if bufs.is_empty() {
            return Ok(());
        }
        let mut c = Completion::new(&self.name)?;
        let sent = self.health.now_ns();
        self.submit_write(&mut c, bufs, offset)?;
        self.done("rbd write", sent, c.wait("rbd write", &self.name))
            .map(drop)
    }

    fn flush_wait(&self) -> Result<()> {
        self.health.check_mutation("rbd flush")?;
        let mut c = Completion::new(&self.name)?;
        let sent = self.health.now_ns();
        // SAFETY: an open image and a fresh completion.
        let r = unsafe { ffi::rbd_aio_flush(self.image.0, c.c) };
        c.submitted("rbd_aio_flush", &self.name, r)?;
        let r = c.wait("rbd flush", &self.name);
        r.map(|_| self.health.confirmed(sent))
            .map_err(|e| self.health.failed("rbd flush", e))
    }

    /// The result of a completed write or zeroing: a failure is noted
    /// ([`Health::failed`]), and a success is checked against a shrink of
    /// the image (librbd clips a write that crosses the image's new end to
    /// the part below it and reports success: none of it may count as
    /// written). `sent`: when it was submitted ([`Health::now_ns`]).
    fn done(&self, op: &'static str, sent: u64, r: Result<u64>) -> Result<u64> {
        match r {
            Ok(n) => {
                self.health.confirmed(sent);
                self.health.poll_size(op).map(|()| n)
            }
            Err(e) => Err(self.health.failed(op, e)),
        }
    }
}

fn connect(target: &RbdTarget, name: &str) -> Result<Cluster> {
    let id = target
        .id
        .as_deref()
        .map(|i| cstring("client id", i))
        .transpose()?;
    let mut h: ffi::rados_t = ptr::null_mut();
    // SAFETY: valid out pointer; the id is NUL-terminated or null (default "admin").
    let r = unsafe { ffi::rados_create(&mut h, id.as_ref().map_or(ptr::null(), |c| c.as_ptr())) };
    if r < 0 {
        return Err(rbd_err("rados_create", name, r));
    }
    let cluster = Cluster(h);
    let conf = target
        .conf
        .as_deref()
        .map(|c| cstring("conf path", c))
        .transpose()?;
    // SAFETY: a created (unconnected) handle; path NUL-terminated or null
    // (null: librados' default search, $CEPH_CONF first).
    let r = unsafe {
        ffi::rados_conf_read_file(cluster.0, conf.as_ref().map_or(ptr::null(), |c| c.as_ptr()))
    };
    if r < 0 {
        let which = target
            .conf
            .as_deref()
            .unwrap_or("the default ceph.conf ($CEPH_CONF, /etc/ceph/ceph.conf)");
        return Err(rbd_err(
            "reading ceph configuration",
            &format!("{which} for {name}"),
            r,
        ));
    }
    // Our defaults first, then the target's own options (which may override them).
    for (k, v) in conf_options(target) {
        let (ck, cv) = (cstring("option", &k)?, cstring("option value", &v)?);
        // SAFETY: an unconnected handle and NUL-terminated strings.
        let r = unsafe { ffi::rados_conf_set(cluster.0, ck.as_ptr(), cv.as_ptr()) };
        if r == -libc::ENOENT {
            return Err(DeviceError::Invalid(format!(
                "{name}: unknown Ceph option {k:?} (image options are :conf=PATH, :id=USER, \
                 or a librados/librbd setting KEY=VALUE such as :rados_osd_op_timeout=60)"
            )));
        }
        if r < 0 {
            return Err(DeviceError::Invalid(format!(
                "{name}: ceph option {k}={v} refused: {}",
                io::Error::from_raw_os_error(-r)
            )));
        }
    }
    // SAFETY: a configured, unconnected handle.
    let r = unsafe { ffi::rados_connect(cluster.0) };
    if r < 0 {
        // Which monitors were tried, and where that came from: "timed
        // out" alone does not say which cluster, or which config, is wrong.
        let mons = conf_get(&cluster, "mon_host")
            .filter(|m| !m.trim().is_empty())
            .map_or_else(
                || "no mon_host set".to_string(),
                |m| format!("monitors {m}"),
            );
        let from = match &target.conf {
            Some(c) => format!("config {c}"),
            None => "the default config ($CEPH_CONF, /etc/ceph/ceph.conf)".to_string(),
        };
        let by_target = if target.options.iter().any(|(k, _)| {
            matches!(
                k.replace('-', "_").as_str(),
                "mon_host" | "mon_dns_srv_name"
            )
        }) {
            ", overridden by the target"
        } else {
            ""
        };
        return Err(rbd_err(
            "connecting to the Ceph cluster",
            &format!("{name} ({mons}, from {from}{by_target})"),
            r,
        ));
    }
    Ok(cluster)
}

/// The librados options a connection for `target` sets, in order: our
/// defaults first, then the target's own `KEY=VALUE`s (which override them).
fn conf_options(target: &RbdTarget) -> Vec<(String, String)> {
    let timeout = DEFAULT_OSD_OP_TIMEOUT_SECS.to_string();
    let defaults = [
        ("rbd_cache", "false"),
        ("client_mount_timeout", "20"),
        ("rados_osd_op_timeout", timeout.as_str()),
        // The same for the monitors: breaking a lock blocklists its holder
        // through them, and with a monitor that stopped answering after the
        // connect, `--break-lock` waited for ever (session 25's RBD pass).
        ("rados_mon_op_timeout", timeout.as_str()),
    ];
    defaults
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .chain(target.options.iter().cloned())
        .collect()
}

/// The value of a librados option on a connected client.
fn conf_get(cluster: &Cluster, key: &str) -> Option<String> {
    let k = CString::new(key).ok()?;
    let mut buf = [0u8; 256];
    // SAFETY: a live handle, a NUL-terminated key and a buffer of `len` bytes.
    let r =
        unsafe { ffi::rados_conf_get(cluster.0, k.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return None;
    }
    let v = CStr::from_bytes_until_nul(&buf).ok()?;
    Some(v.to_string_lossy().into_owned())
}

/// The fsid of the cluster a connected client talks to.
fn cluster_fsid(cluster: &Cluster) -> Option<String> {
    let mut buf = [0u8; 64];
    // SAFETY: a connected handle and a buffer of `len` bytes.
    let r = unsafe { ffi::rados_cluster_fsid(cluster.0, buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return None;
    }
    let v = CStr::from_bytes_until_nul(&buf).ok()?;
    Some(v.to_string_lossy().into_owned())
}

/// The image's id: unique in its pool, kept by a rename (`rbd mv`), new for
/// a copy (`rbd cp`) or an image created again under the same name.
fn image_id(image: &Image) -> Option<String> {
    let mut buf = [0u8; 128];
    // SAFETY: an open image; `buf` is writable for its length.
    let r = unsafe { ffi::rbd_get_id(image.0, buf.as_mut_ptr().cast::<c_char>(), buf.len()) };
    if r < 0 {
        return None;
    }
    let id = CStr::from_bytes_until_nul(&buf).ok()?.to_str().ok()?;
    (!id.is_empty()).then(|| id.to_string())
}

fn open_image(io: &Ioctx, img: &CStr, read_only: bool, name: &str) -> Result<Image> {
    let mut image: ffi::rbd_image_t = ptr::null_mut();
    // SAFETY: a live ioctx, a NUL-terminated name, a valid out pointer and no
    // snapshot (null).
    let r = unsafe {
        if read_only {
            ffi::rbd_open_read_only(io.0, img.as_ptr(), &mut image, ptr::null())
        } else {
            ffi::rbd_open(io.0, img.as_ptr(), &mut image, ptr::null())
        }
    };
    if r < 0 {
        return Err(rbd_err("rbd_open", name, r));
    }
    Ok(Image(image))
}

fn image_size(image: &Image, name: &str) -> Result<u64> {
    let mut size = 0u64;
    // SAFETY: an open image and a valid out pointer.
    let r = unsafe { ffi::rbd_get_size(image.0, &mut size) };
    if r < 0 {
        return Err(rbd_err("rbd_get_size", name, r));
    }
    Ok(size)
}

/// Current holders of the image's exclusive lock (client address and cookie
/// strings as librbd reports them).
fn lock_owners(image: &Image, name: &str) -> Result<Vec<String>> {
    let mut owners: [*mut c_char; 8] = [ptr::null_mut(); 8];
    let mut n = owners.len();
    let mut mode: ffi::rbd_lock_mode_t = 0;
    // SAFETY: an open image; `owners` has room for `n` pointers.
    let r = unsafe { ffi::rbd_lock_get_owners(image.0, &mut mode, owners.as_mut_ptr(), &mut n) };
    if r == -libc::ENOENT {
        return Ok(Vec::new());
    }
    if r < 0 {
        return Err(rbd_err("rbd_lock_get_owners", name, r));
    }
    let n = n.min(owners.len());
    let out = owners[..n]
        .iter()
        .filter(|p| !p.is_null())
        // SAFETY: librbd filled these with NUL-terminated strings that stay
        // valid until the cleanup call below.
        .map(|&p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        .collect();
    // SAFETY: frees exactly the `n` strings librbd allocated above.
    unsafe { ffi::rbd_lock_get_owners_cleanup(owners.as_mut_ptr(), n) };
    Ok(out)
}

/// Who holds the exclusive lock of `target`, without taking it (for
/// `jbdev info`). Empty if nobody does.
pub fn lock_holders(target: &RbdTarget) -> Result<Vec<String>> {
    let name = target.short_name();
    let (cluster, io) = connect_pool(target, &name)?;
    // Read-write handle, but no lock is taken and nothing written: librbd
    // reports lock owners only to a handle that could take the lock.
    let image = open_image(&io, &cstring("image name", &target.image)?, false, &name)?;
    let owners = lock_owners(&image, &name);
    drop(image);
    drop(io);
    drop(cluster);
    owners
}

/// Refuses (`Busy`, naming the owners, as a second writer is refused) an
/// image some client holds the exclusive lock of; for read-only opens that
/// must not see a live writer: a read-only replay (`serve --read-only`) or a
/// `check`/`journal dump` of a journal that is being appended and
/// checkpointed under them would show a state that never existed. (A file
/// volume refuses them through its shared `flock`.) No lock is taken — a
/// reader cannot hold an RBD image off — so a writer that starts after this
/// check is not seen. A missing image passes (the open that follows says
/// so).
///
/// The owners are listed through a read-write handle that takes no lock
/// and writes nothing (librbd reports owners only to a handle that could
/// take the lock); a client not allowed that handle skips the check.
pub fn refuse_if_held(target: &RbdTarget) -> Result<()> {
    let name = target.short_name();
    let (cluster, io) = connect_pool(target, &name)?;
    let img = cstring("image name", &target.image)?;
    let owners = match open_image(&io, &img, false, &name) {
        Ok(image) => lock_owners(&image, &name).unwrap_or_default(),
        Err(e) => {
            tracing::debug!("{name}: cannot list lock owners ({e})");
            Vec::new()
        }
    };
    drop(io);
    drop(cluster);
    if owners.is_empty() {
        return Ok(());
    }
    Err(DeviceError::Busy(format!(
        "{name} (exclusive lock held by {}; a read-only open of a volume that is being \
         written would show a state that never existed; if that holder is dead, a \
         read-write open with --break-lock breaks its lock)",
        owners.join(", ")
    )))
}

/// True if the two RBD targets name the same image: same pool and image
/// name (namespaces are not supported, so always the default one) on the
/// same cluster. Options that only change how the client behaves
/// (`rbd_cache=…`) do not make it another image; a different `conf=`/`id=`
/// or `mon_host=` may name another cluster, so then the clusters' fsids are
/// compared (an unreachable cluster counts as the same: refusing is the
/// safe answer, and such a target cannot be opened anyway). Anything that
/// does not parse as an RBD target is not the same as anything.
pub fn same_image(a: &str, b: &str) -> bool {
    let (Ok(x), Ok(y)) = (RbdTarget::parse(a), RbdTarget::parse(b)) else {
        return false;
    };
    if x.pool != y.pool || x.image != y.image {
        return false;
    }
    let cluster_key = |t: &RbdTarget| {
        let mons: Vec<&(String, String)> = t
            .options
            .iter()
            .filter(|(k, _)| matches!(k.as_str(), "mon_host" | "mon-host"))
            .collect();
        (t.conf.clone(), format!("{mons:?}"))
    };
    if cluster_key(&x) == cluster_key(&y) {
        return true;
    }
    let fsid = |t: &RbdTarget| {
        connect(t, &t.short_name())
            .ok()
            .and_then(|c| cluster_fsid(&c))
    };
    match (fsid(&x), fsid(&y)) {
        (Some(f), Some(g)) => f == g,
        _ => true,
    }
}

/// Whether the image `target` names exists (an unreachable cluster or a
/// missing pool is an error).
pub fn image_exists(target: &RbdTarget) -> Result<bool> {
    let name = target.short_name();
    let (cluster, io) = connect_pool(target, &name)?;
    let img = cstring("image name", &target.image)?;
    let r = match open_image(&io, &img, true, &name) {
        Ok(_) => Ok(true),
        Err(DeviceError::Io { error, .. }) if error.raw_os_error() == Some(libc::ENOENT) => {
            Ok(false)
        }
        Err(e) => Err(e),
    };
    drop(io);
    drop(cluster);
    r
}

/// Removes the image `target` names (`rbd rm`); a missing image is not an
/// error. An image some client has open fails with `Busy`.
pub fn remove_image(target: &RbdTarget) -> Result<()> {
    let name = target.short_name();
    let (cluster, io) = connect_pool(target, &name)?;
    let img = cstring("image name", &target.image)?;
    // SAFETY: a live ioctx and a NUL-terminated name.
    let r = unsafe { ffi::rbd_remove(io.0, img.as_ptr()) };
    drop(io);
    drop(cluster);
    match r {
        0 => Ok(()),
        r if r == -libc::ENOENT => Ok(()),
        r if r == -libc::EBUSY => Err(DeviceError::Busy(format!(
            "{name} (open by a client: not removed)"
        ))),
        r => Err(rbd_err("rbd_remove", &name, r)),
    }
}

/// Connects to the cluster `target` names and opens its pool. Bind the
/// result as `let (cluster, io) = …`: the pool handle, declared last, is then
/// dropped first, as librados requires.
fn connect_pool(target: &RbdTarget, name: &str) -> Result<(Cluster, Ioctx)> {
    let cluster = connect(target, name)?;
    let pool = cstring("pool name", &target.pool)?;
    let mut io: ffi::rados_ioctx_t = ptr::null_mut();
    // SAFETY: a connected cluster handle, a NUL-terminated pool name and a
    // valid out pointer.
    let r = unsafe { ffi::rados_ioctx_create(cluster.0, pool.as_ptr(), &mut io) };
    if r < 0 {
        return Err(rbd_err(
            "opening pool",
            &format!("{name} (pool {:?})", target.pool),
            r,
        ));
    }
    // A full pool (its quota reached, or the cluster full) answers writes
    // with EDQUOT/ENOSPC at once, which the volume treats as a full store,
    // instead of librados holding them until the pool has room again — in
    // practice until rados_osd_op_timeout, and then ETIMEDOUT, an abort
    // (found by a new-user pass). librbd's image handles duplicate this
    // ioctx (IoCtxImpl::dup copies the flag) and carry it into the
    // IOContext of their data requests (ImageCtx::rebuild_data_io_context).
    // SAFETY: a live ioctx, before any request on it.
    unsafe { ffi::rados_set_pool_full_try(io) };
    Ok((cluster, Ioctx(io)))
}

/// How long `--break-lock` waits for a holder's watch on the image to go
/// away: the OSDs drop the watch of a client that stopped pinging
/// (`kill -9`, a dead node) after `osd_client_watch_timeout` (30 s by
/// default; read from this client's configuration, which normally shares
/// the cluster's ceph.conf), and a margin for the ping interval.
fn break_lock_wait(cluster: &Cluster) -> Duration {
    let secs = conf_get(cluster, "osd_client_watch_timeout")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(30);
    Duration::from_secs(secs + BREAK_LOCK_MARGIN_SECS)
}

/// What `--break-lock` waits beyond `osd_client_watch_timeout`.
const BREAK_LOCK_MARGIN_SECS: u64 = 10;

/// Addresses of the clients that watch the image (a live librbd client
/// that has it open keeps a watch on its header; a killed one's expires).
fn watcher_addrs(image: &Image, name: &str) -> Result<Vec<String>> {
    let mut cap = 16usize;
    loop {
        let mut ws: Vec<ffi::rbd_image_watcher_t> = (0..cap)
            .map(|_| ffi::rbd_image_watcher_t {
                addr: ptr::null_mut(),
                id: 0,
                cookie: 0,
            })
            .collect();
        let mut n = cap;
        // SAFETY: an open image; `ws` has room for `n` entries.
        let r = unsafe { ffi::rbd_watchers_list(image.0, ws.as_mut_ptr(), &mut n) };
        if r == -libc::ERANGE && n > cap {
            cap = n;
            continue;
        }
        if r < 0 {
            return Err(rbd_err("rbd_watchers_list", name, r));
        }
        let n = n.min(cap);
        let out = ws[..n]
            .iter()
            .filter(|w| !w.addr.is_null())
            .map(|w| {
                // SAFETY: NUL-terminated strings librbd allocated, valid
                // until the cleanup below.
                unsafe { CStr::from_ptr(w.addr) }
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        // SAFETY: frees exactly the `n` entries librbd filled.
        unsafe { ffi::rbd_watchers_list_cleanup(ws.as_mut_ptr(), n) };
        return Ok(out);
    }
}

/// A client address as librbd prints it, without the messenger prefix
/// (`v1:`, `v2:`, `any:`) and brackets, so lock owners and watchers compare.
fn bare_addr(a: &str) -> &str {
    let a = a.trim().trim_start_matches('[').trim_end_matches(']');
    ["v1:", "v2:", "any:"]
        .iter()
        .find_map(|p| a.strip_prefix(p))
        .unwrap_or(a)
}

/// True if `owner` (a lock owner's address) still watches the image:
/// it is alive (its librbd client pings the OSDs), or it died less than
/// `osd_client_watch_timeout` ago.
fn owner_watches(owner: &str, watchers: &[String]) -> bool {
    watchers.iter().any(|w| bare_addr(w) == bare_addr(owner))
}

/// `--break-lock` of `owner`: only once it has no watch on the image. A
/// holder with a watch is alive (or killed less than the watch timeout
/// ago): waits up to `wait` for the watch to go, saying so, and refuses a
/// holder whose watch stays (found by a new-user pass: a refused `serve
/// --break-lock` had already broken a live server's lock and blocklisted
/// it, which went fail-stop).
fn wait_for_dead_owner(image: &Image, name: &str, owner: &str, wait: Duration) -> Result<()> {
    let start = Instant::now();
    let mut said = false;
    loop {
        let watchers = watcher_addrs(image, name)?;
        if !owner_watches(owner, &watchers) {
            return Ok(());
        }
        if start.elapsed() >= wait {
            return Err(DeviceError::Busy(format!(
                "{name} (exclusive lock held by {owner}, which is alive: it still watches the \
                 image ({}s after --break-lock started waiting for its watch to expire); \
                 --break-lock breaks only a dead holder's lock: stop that client first \
                 (`rbd status` lists the image's watchers); nothing was changed)",
                wait.as_secs()
            )));
        }
        if !said {
            said = true;
            let msg = format!(
                "{name}: the lock holder {owner} still watches the image: waiting up to {}s \
                 for its watch to expire (a killed client's lasts about \
                 osd_client_watch_timeout, 30 s by default); a live holder's lock is not broken",
                wait.as_secs()
            );
            tracing::warn!("{msg}");
        }
        std::thread::sleep(Duration::from_millis(500).min(wait.saturating_sub(start.elapsed())));
    }
}

/// Takes the exclusive lock; `break_lock`: break a dead holder's lock
/// first, waiting at most this long for its watch to expire.
fn lock(image: &Image, name: &str, break_lock: Option<Duration>) -> Result<()> {
    if let Some(wait) = break_lock {
        let owners = lock_owners(image, name)?;
        // Every holder is checked before any lock is broken.
        for owner in &owners {
            wait_for_dead_owner(image, name, owner, wait)?;
        }
        break_locks(
            image,
            name,
            owners,
            "--break-lock; it no longer watches the image",
        )?;
    } else {
        // A holder that still watches the image is refused at once: it is
        // alive, or died less than osd_client_watch_timeout ago (left to
        // itself, rbd_lock_acquire would wait for that watch to expire and
        // then break the lock silently). A holder without a watch is dead,
        // or has not reached the OSDs for longer than that timeout — and so,
        // with rados_osd_op_timeout at most as long, has had its own
        // requests time out: its lock is broken, loudly, and librbd
        // blocklists it, so it cannot write behind us. That is what lets a
        // server that could not release its lock (an OSD that did not
        // answer its close, a kill -9) restart without --break-lock once
        // its watch has gone. (An image without the exclusive-lock feature
        // cannot list owners: the acquire below says so clearly.)
        let owners = lock_owners(image, name).unwrap_or_default();
        if !owners.is_empty() {
            let Ok(watchers) = watcher_addrs(image, name) else {
                return Err(held_by(name, &owners));
            };
            if owners.iter().any(|o| owner_watches(o, &watchers)) {
                return Err(held_by(name, &owners));
            }
            break_locks(
                image,
                name,
                owners,
                "it no longer watches the image: it is dead, or has not reached the cluster \
                 for longer than osd_client_watch_timeout",
            )?;
        }
    }
    // SAFETY: an open, writable image.
    let r = unsafe { ffi::rbd_lock_acquire(image.0, ffi::RBD_LOCK_MODE_EXCLUSIVE) };
    if r == 0 {
        return Ok(());
    }
    if r == -libc::EINVAL || r == -libc::EOPNOTSUPP {
        return Err(DeviceError::Invalid(format!(
            "{name}: cannot take the exclusive lock ({}); the image needs the exclusive-lock feature (rbd feature enable POOL/IMAGE exclusive-lock)",
            io::Error::from_raw_os_error(-r)
        )));
    }
    let owners = lock_owners(image, name).unwrap_or_default();
    if owners.is_empty() && r != -libc::EROFS && r != -libc::EBUSY {
        return Err(rbd_err("rbd_lock_acquire", name, r));
    }
    Err(held_by(name, &owners))
}

/// Breaks the exclusive lock of each of `owners`, saying so and `why`
/// (librbd blocklists each).
fn break_locks(image: &Image, name: &str, owners: Vec<String>, why: &str) -> Result<()> {
    for owner in owners {
        tracing::warn!(
            "{name}: breaking the exclusive lock held by {owner} ({why}); that client is blocklisted"
        );
        let o = cstring("lock owner", &owner)?;
        // SAFETY: an open image and a NUL-terminated owner string.
        let r = unsafe { ffi::rbd_lock_break(image.0, ffi::RBD_LOCK_MODE_EXCLUSIVE, o.as_ptr()) };
        if r < 0 && r != -libc::ENOENT {
            // Breaking blocklists the holder through the monitors: a
            // monitor that does not answer within rados_mon_op_timeout
            // ends it here (librbd says EIO or ETIMEDOUT).
            return Err(rbd_err(
                "rbd_lock_break",
                &format!(
                    "{name} (blocklisting {owner} through the monitors; are they answering? \
                     rados_mon_op_timeout bounds the wait)"
                ),
                r,
            ));
        }
    }
    Ok(())
}

fn held_by(name: &str, owners: &[String]) -> DeviceError {
    let who = if owners.is_empty() {
        "another client".to_string()
    } else {
        owners.join(", ")
    };
    DeviceError::Busy(format!(
        "{name} (exclusive lock held by {who}, which still watches the image: it is alive, or \
         stopped less than osd_client_watch_timeout (30 s by default) ago, and then a plain \
         open works once its watch has expired; if that holder is dead, --break-lock waits \
         for that and breaks its lock)"
    ))
}

impl BlockDevice for RbdDevice {
    fn size_bytes(&self) -> u64 {
        self.size
    }

    fn identity(&self) -> Option<crate::Identity> {
        self.identity.clone()
    }

    fn logical_block_size(&self) -> u32 {
        RBD_BLOCK_SIZE
    }

    fn read_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> Result<()> {
        let len = iov_len_mut(bufs);
        check_request(self.size, RBD_BLOCK_SIZE, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        if bufs.len() > MAX_IOV {
            let mut bounce = vec![0u8; len as usize];
            self.read_vectored_at(&mut [IoSliceMut::new(&mut bounce)], offset)?;
            let mut src = &bounce[..];
            for b in bufs.iter_mut() {
                let (head, rest) = src.split_at(b.len());
                b.copy_from_slice(head);
                src = rest;
            }
            return Ok(());
        }
        let mut c = Completion::new(&self.name)?;
        let sent = self.health.now_ns();
        // IoSliceMut is ABI-compatible with struct iovec on Unix.
        let iov = bufs.as_ptr().cast::<libc::iovec>();
        // SAFETY: `bufs` stays mutably borrowed until the completion is
        // waited for below (or by Completion::drop on an early return).
        let r = unsafe { ffi::rbd_aio_readv(self.image.0, iov, bufs.len() as c_int, offset, c.c) };
        c.submitted("rbd_aio_readv", &self.name, r)?;
        let n = c
            .wait("rbd read", &self.name)
            .map_err(|e| self.health.failed("rbd read", e))?;
        if n != len {
            let short = DeviceError::io(
                "rbd read",
                self.name.clone(),
                io::Error::new(io::ErrorKind::UnexpectedEof, format!("{n} of {len} bytes")),
            );
            return Err(self.health.failed("rbd read", short));
        }
        self.health.confirmed(sent);
        Ok(())
    }

    fn set_bytes_in_use(&self, bytes: u64) {
        self.health
            .in_use
            .store(bytes.min(self.health.open_size), Ordering::Release);
    }

    fn ownership_probe_due(&self, since: Instant) -> bool {
        self.locked
            && (!self.health.proven_since(since)
                || self.health.header_changed.load(Ordering::Acquire)
                || self.health.lock_lost.load(Ordering::Acquire))
    }

    fn confirm_ownership(&self, since: Instant) -> Result<()> {
        self.health.check_lock("ownership probe")?;
        if !self.locked || self.health.proven_since(since) {
            return Ok(());
        }
        // Callers that asked before the probe in flight was sent share its
        // answer; the rest send the next one. A blocklisting can take
        // effect at any instant, and another client may take the lock and
        // write at once (an operator's `ceph osd blocklist add` drops the
        // watch, so nobody waits the watch timeout: session 26's pass saw
        // another holder's write acknowledged 0.17 s later), so only a
        // request sent after the read arrived can vouch for the memory.
        let _one = self
            .health
            .probing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.health.proven_since(since) {
            return Ok(());
        }
        if self.health.timed_out.load(Ordering::Acquire) {
            // The cluster is taken as not answering (see Health::failed):
            // nothing can confirm the lock, and a probe would wait another
            // rados_osd_op_timeout.
            return Err(DeviceError::io(
                "ownership probe",
                self.name.clone(),
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "not sent: an earlier request timed out (rados_osd_op_timeout {} s), so \
                         this client cannot confirm it still holds the image's lock",
                        self.health.op_timeout
                    ),
                ),
            ));
        }
        // Any request would do: the OSDs refuse every request of a
        // blocklisted client (ESHUTDOWN). A read changes nothing.
        let mut probe = [0u8; RBD_BLOCK_SIZE as usize];
        self.read_vectored_at(&mut [IoSliceMut::new(&mut probe)], 0)
    }

    fn write_vectored_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        _prio: IoPriority,
    ) -> Result<()> {
        check_request(self.size, RBD_BLOCK_SIZE, offset, iov_len(bufs))?;
        self.check_mutation("rbd write")?;
        self.write_wait(bufs, offset)
    }

    fn write_batch(&self, reqs: &[WriteReq<'_>], _prio: IoPriority) -> Result<()> {
        for r in reqs {
            check_request(self.size, RBD_BLOCK_SIZE, r.offset, iov_len(r.bufs))?;
        }
        self.check_mutation("rbd write")?;
        // Long vectors go one by one (bounced); the rest all at once.
        let (long, short): (Vec<&WriteReq<'_>>, Vec<&WriteReq<'_>>) = reqs
            .iter()
            .filter(|r| !r.bufs.is_empty())
            .partition(|r| r.bufs.len() > MAX_IOV);
        for r in &long {
            self.write_wait(r.bufs, r.offset)?;
        }
        let mut comps = Vec::with_capacity(short.len());
        let mut first_err = None;
        let sent = self.health.now_ns();
        for r in &short {
            let mut c = Completion::new(&self.name)?;
            match self.submit_write(&mut c, r.bufs, r.offset) {
                Ok(()) => comps.push(c),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        // Every submitted request is waited for, error or not.
        for c in &mut comps {
            if let Err(e) = self.done("rbd write", sent, c.wait("rbd write", &self.name)) {
                first_err.get_or_insert(e);
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if reqs.iter().any(|r| r.durable) {
            self.flush_wait()?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.flush_wait()
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        check_request(self.size, RBD_BLOCK_SIZE, offset, len)?;
        self.check_mutation("rbd write zeroes")?;
        let mut done = 0;
        while done < len {
            let n = (len - done).min(ZEROES_STEP);
            let mut c = Completion::new(&self.name)?;
            let sent = self.health.now_ns();
            // SAFETY: an open image and a fresh completion; no buffer involved.
            let r = unsafe {
                ffi::rbd_aio_write_zeroes(self.image.0, offset + done, n as usize, c.c, 0, 0)
            };
            c.submitted("rbd_aio_write_zeroes", &self.name, r)?;
            self.done(
                "rbd write zeroes",
                sent,
                c.wait("rbd write zeroes", &self.name),
            )?;
            done += n;
        }
        Ok(())
    }

    /// What librbd reports allocated (`rbd_diff_iterate2` from the image's
    /// creation, parent included): an object never written, or removed by
    /// a zeroing of all of it, is a hole; within a written object, the
    /// extents the OSD reports. Holes read as zeroes.
    fn allocation(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        check_request(self.size, RBD_BLOCK_SIZE, offset, len)?;
        let mut data: Vec<(u64, u64)> = Vec::new();
        // SAFETY: an open image, no snapshot (null: since creation), and a
        // callback whose argument is `data`, used only during this call.
        let r = unsafe {
            ffi::rbd_diff_iterate2(
                self.image.0,
                ptr::null(),
                offset,
                len,
                1,
                0,
                Some(on_diff_extent),
                (&mut data as *mut Vec<(u64, u64)>).cast::<c_void>(),
            )
        };
        if r < 0 {
            return Err(self.health.failed(
                "rbd_diff_iterate2",
                rbd_err("rbd_diff_iterate2", &self.name, r),
            ));
        }
        Ok(allocation_map(offset, len, data))
    }

    /// A native queue: every request an `rbd_aio_*` call of its own, up to
    /// `depth` in flight at once (see [`queue`]).
    fn queue(&self, depth: u32) -> Result<Box<dyn IoQueue + '_>> {
        Ok(Box::new(queue::RbdQueue::new(self, depth)?))
    }

    fn backend_name(&self) -> &'static str {
        "rbd"
    }
}

/// `rbd_diff_iterate2`'s callback: collects the extents that exist.
unsafe extern "C" fn on_diff_extent(
    off: u64,
    len: usize,
    exists: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: `arg` is the Vec RbdDevice::allocation passed, alive and not
    // otherwise borrowed during the call that runs this callback.
    let data = unsafe { &mut *arg.cast::<Vec<(u64, u64)>>() };
    if exists != 0 && len > 0 {
        data.push((off, len as u64));
    }
    0
}

/// `[offset, offset+len)` as consecutive extents: the `data` ranges
/// (any order, may overlap or stick out) allocated, the rest holes.
fn allocation_map(offset: u64, len: u64, mut data: Vec<(u64, u64)>) -> Vec<Extent> {
    let end = offset + len;
    data.sort_unstable();
    let mut out: Vec<Extent> = Vec::new();
    let mut pos = offset;
    let push = |out: &mut Vec<Extent>, at: u64, to: u64, allocated: bool| {
        if to <= at {
            return;
        }
        match out.last_mut() {
            Some(l) if l.allocated == allocated && l.offset + l.len == at => l.len += to - at,
            _ => out.push(Extent {
                offset: at,
                len: to - at,
                allocated,
            }),
        }
    };
    for (off, n) in data {
        let (s, e) = (off.max(pos), (off + n).min(end));
        if e <= s {
            continue;
        }
        push(&mut out, pos, s, false);
        push(&mut out, s, e, true);
        pos = e;
    }
    push(&mut out, pos, end, false);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_maps_cover_the_range_in_order() {
        let m = allocation_map(100, 100, vec![(150, 10), (90, 20), (155, 10), (190, 50)]);
        let got: Vec<(u64, u64, bool)> = m.iter().map(|e| (e.offset, e.len, e.allocated)).collect();
        assert_eq!(
            got,
            vec![
                (100, 10, true),
                (110, 40, false),
                (150, 15, true),
                (165, 25, false),
                (190, 10, true)
            ]
        );
        let empty = allocation_map(0, 8, vec![]);
        assert_eq!(empty.len(), 1);
        assert!(!empty[0].allocated);
    }

    #[test]
    fn targets_parse_like_qemu() {
        let t = RbdTarget::parse("rbd:rbd/vol1").unwrap();
        assert_eq!((t.pool.as_str(), t.image.as_str()), ("rbd", "vol1"));
        assert_eq!((t.conf, t.id), (None, None));
        let t = RbdTarget::parse("rbd:p/i:conf=/tmp/x\\:y/ceph.conf:id=jb:rbd_cache=true").unwrap();
        assert_eq!(t.conf.as_deref(), Some("/tmp/x:y/ceph.conf"));
        assert_eq!(t.id.as_deref(), Some("jb"));
        assert_eq!(
            t.options,
            vec![("rbd_cache".to_string(), "true".to_string())]
        );
        assert_eq!(t.short_name(), "rbd:p/i");
        assert!(RbdTarget::is_target("rbd:x/y") && !RbdTarget::is_target("./rbd:x/y"));
    }

    #[test]
    fn bad_targets_are_errors() {
        for bad in [
            "rbd:",
            "rbd:pool",
            "rbd:/img",
            "rbd:pool/",
            "rbd:pool/ns/img",
            "rbd:pool/img@snap",
            "rbd:pool/img:conf",
            "rbd:pool/img:=x",
            "rbd:pool/img\\",
            "file.img",
            "rbd:po\0ol/img",
        ] {
            assert!(RbdTarget::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn a_too_long_name_says_so_and_the_limit() {
        let long = "x".repeat(300);
        let e = RbdTarget::parse(&format!("rbd:rbd/{long}")).unwrap_err();
        assert!(
            e.contains("image name is too long (300 bytes; at most 255)"),
            "{e}"
        );
        let e = RbdTarget::parse(&format!("rbd:{long}/img")).unwrap_err();
        assert!(e.contains("pool name is too long"), "{e}");
        assert!(RbdTarget::parse(&format!("rbd:rbd/{}", "x".repeat(255))).is_ok());
    }

    #[test]
    fn a_spec_parses_back_to_its_target() {
        for s in [
            "rbd:p/i",
            "rbd:p/i:conf=/tmp/x\\:y/c\\\\d.conf:id=jb:rbd_cache=true:mon_host=1.2.3.4\\:6789",
        ] {
            let t = RbdTarget::parse(s).unwrap();
            assert_eq!(RbdTarget::parse(&t.spec()).unwrap(), t, "{s}");
        }
    }

    /// A bare journal target is opened on its home's cluster (found by a
    /// new-user pass: it was opened on the node's default cluster, and a
    /// `journal reset` there lost an acknowledged write).
    #[test]
    fn a_journal_naming_no_cluster_takes_the_homes() {
        let home =
            RbdTarget::parse("rbd:h/vol:conf=/a/ceph.conf:id=jb:rados_osd_op_timeout=60").unwrap();
        let j = RbdTarget::parse("rbd:j/vol-j")
            .unwrap()
            .on_cluster_of(&home);
        assert_eq!((j.pool.as_str(), j.image.as_str()), ("j", "vol-j"));
        assert_eq!(j.conf.as_deref(), Some("/a/ceph.conf"));
        assert_eq!(j.id.as_deref(), Some("jb"));
        assert_eq!(j.options, home.options);
        // Its own client options come after the home's, so they win.
        let j = RbdTarget::parse("rbd:j/vol-j:rados_osd_op_timeout=5")
            .unwrap()
            .on_cluster_of(&home);
        assert_eq!(j.conf.as_deref(), Some("/a/ceph.conf"));
        assert_eq!(
            j.options.last(),
            Some(&("rados_osd_op_timeout".to_string(), "5".to_string()))
        );
        // A journal that names a cluster (or who connects) is taken as given.
        for own in [
            "rbd:j/vol-j:conf=/b/ceph.conf",
            "rbd:j/vol-j:id=other",
            "rbd:j/vol-j:mon_host=10.0.0.1",
            "rbd:j/vol-j:mon-host=10.0.0.1",
            "rbd:j/vol-j:keyring=/b/keyring",
        ] {
            let t = RbdTarget::parse(own).unwrap();
            assert_eq!(t.on_cluster_of(&home), t, "{own}");
        }
        // A home on the default cluster leaves a bare journal bare.
        let bare = RbdTarget::parse("rbd:j/vol-j").unwrap();
        let default_home = RbdTarget::parse("rbd:h/vol").unwrap();
        assert_eq!(bare.on_cluster_of(&default_home), bare);
    }

    #[test]
    fn our_defaults_come_first_and_the_target_overrides_them() {
        let t = RbdTarget::parse("rbd:p/i:rados_osd_op_timeout=0").unwrap();
        let opts = conf_options(&t);
        let pos = |k: &str, v: &str| opts.iter().position(|(a, b)| a == k && b == v);
        let default = pos("rados_osd_op_timeout", "30").expect("default timeout set");
        assert!(pos("rados_osd_op_timeout", "0").unwrap() > default);
    }
}

/// A shared throwaway cluster for tests of this and other crates
/// (`scripts/ceph-test-cluster.sh`, started once per state directory under
/// a file lock; `scripts/test.sh` stops it at the end).
pub mod test_cluster {
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The state directory: `$JBDEV_CEPH_DIR` or `/tmp/jbdev-ceph-test`.
    pub fn dir() -> PathBuf {
        std::env::var_os("JBDEV_CEPH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp/jbdev-ceph-test"))
    }

    /// The pid of the cluster's one OSD (from the state directory's `pids`
    /// file), for tests that freeze it (SIGSTOP) to make the store hang.
    pub fn osd_pid() -> String {
        let pids = std::fs::read_to_string(dir().join("pids")).expect("the cluster's pids file");
        pids.lines()
            .find_map(|l| l.strip_prefix("osd "))
            .expect("the cluster's OSD pid")
            .trim()
            .to_string()
    }

    /// The project's cluster script.
    pub fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-test-cluster.sh")
    }

    /// [`ensure`] for a test: the conf, or None after printing why the
    /// test skips.
    pub fn or_skip() -> Option<PathBuf> {
        match ensure() {
            Ok(conf) => Some(conf),
            Err(why) => {
                println!("SKIP: {why}");
                None
            }
        }
    }

    /// Whether the image a target string names exists (a test's check).
    pub fn exists(target: &str) -> bool {
        super::image_exists(&super::RbdTarget::parse(target).expect("an rbd: target"))
            .expect("asking the cluster whether the image exists")
    }

    /// Starts the cluster if it is not running and returns its ceph.conf, or
    /// `Err(reason)` when Ceph is not installed (the caller skips, printing
    /// the reason). A cluster that is installed but fails to start is an
    /// error too — unless `JBDEV_REQUIRE_CEPH=1`, when it panics (test.sh
    /// sets it, so a broken cluster never passes as a skip there).
    pub fn ensure() -> Result<PathBuf, String> {
        let required = std::env::var("JBDEV_REQUIRE_CEPH").is_ok_and(|v| v == "1");
        let installed = ["ceph-mon", "ceph-osd", "ceph"].iter().all(|t| {
            Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .output()
                .is_ok_and(|o| o.status.success())
        });
        if !installed {
            let why =
                "Ceph is not installed (apt-get install ceph-mon ceph-osd ceph-mgr ceph-common)"
                    .to_string();
            assert!(!required, "JBDEV_REQUIRE_CEPH=1 but {why}");
            return Err(why);
        }
        let d = dir();
        let lock = format!("{}.lock", d.display());
        // -o: the daemons the script starts must not inherit the lock.
        let out = Command::new("flock")
            .arg("-o")
            .arg(&lock)
            .arg(script())
            .arg("start")
            .arg(&d)
            .output()
            .map_err(|e| format!("running {}: {e}", script().display()))?;
        if !out.status.success() {
            let why = format!(
                "the test cluster did not start: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            assert!(!required, "JBDEV_REQUIRE_CEPH=1 but {why}");
            return Err(why);
        }
        // Targets name it (`:conf=`); no environment variable is set, since
        // other test threads may be reading the environment in librados.
        Ok(d.join("ceph.conf"))
    }

    /// A fresh image name (pid, counter and time make it unique).
    pub fn unique_image(prefix: &str) -> String {
        static N: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!(
            "{prefix}-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            t % 1_000_000_000
        )
    }

    /// `rbd:rbd/NAME:conf=CONF`.
    pub fn target(conf: &Path, image: &str) -> String {
        format!("rbd:rbd/{image}:conf={}", conf.display())
    }
}
