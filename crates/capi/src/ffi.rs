//! The exported `extern "C"` functions.
//!
//! Shape of every entry point: convert and check the raw arguments (the only
//! `unsafe` code, in the small helpers at the top), then call the safe Rust
//! API inside [`ffi_call`], which turns errors into negative errno values and
//! stops panics at the boundary.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;

use ::jbdev_volume::{TxnExtents, Volume, VolumeError, WriteFlags};

use crate::error::{close_error, ffi_call, with_last_error, Error, Result};
use crate::handle::{Kind, Table};
use crate::types::{
    jbdev_format_options, jbdev_open_options, jbdev_stats, jbdev_txn, jbdev_volume,
    FORMAT_OPTIONS_V1_SIZE, JBDEV_ABI_VERSION, JBDEV_GROW_PREALLOCATE, JBDEV_WRITE_FUA,
    JBDEV_ZERO_NO_HOLE, OPEN_OPTIONS_V1_SIZE,
};

/// An open volume as the handle table holds it.
struct VolumeEntry {
    volume: Volume,
    /// Checked here so that misuse fails the same way whatever the engine does.
    read_only: bool,
}

/// A transaction being built. The Rust `Transaction` borrows its `Volume`,
/// which a C handle cannot express, so the extents are buffered here and
/// replayed into a Rust transaction by `jbdev_txn_commit` (all within one
/// call, so atomicity is the engine's).
struct TxnState {
    volume: usize,
    /// The extents so far, checked as they are added (writes and zeroings
    /// alike, as the commit counts them), so the extent that does not fit
    /// is refused and the rest still commits.
    extents: TxnExtents,
}

static VOLUMES: Table<VolumeEntry> = Table::new(Kind::Volume);
static TXNS: Table<TxnState> = Table::new(Kind::Transaction);

fn volume_ptr(handle: usize) -> *mut jbdev_volume {
    std::ptr::without_provenance_mut(handle)
}

fn txn_ptr(handle: usize) -> *mut jbdev_txn {
    std::ptr::without_provenance_mut(handle)
}

// ---------------------------------------------------------------------------
// Raw-argument helpers: all the unsafe code of the crate.
// ---------------------------------------------------------------------------

/// Decodes a required path argument.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string readable for the call.
unsafe fn c_path(p: *const c_char, what: &str) -> Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    if p.is_null() {
        return Err(Error::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL checked above; NUL termination and validity are the
    // caller's contract.
    let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
    if bytes.is_empty() {
        return Err(Error::invalid(format!("{what} is empty")));
    }
    Ok(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
}

/// Decodes an optional path argument (NULL = none).
///
/// # Safety
/// As [`c_path`].
unsafe fn c_opt_path(p: *const c_char, what: &str) -> Result<Option<PathBuf>> {
    if p.is_null() {
        Ok(None)
    } else {
        // SAFETY: forwarded contract.
        unsafe { c_path(p, what) }.map(Some)
    }
}

/// A caller buffer to read from. NULL is accepted only with `len == 0`.
///
/// # Safety
/// `buf` is NULL or valid for reads of `len` bytes, not written concurrently,
/// for the lifetime `'a` chosen by the caller (one call).
unsafe fn in_slice<'a>(buf: *const c_void, len: usize) -> Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if buf.is_null() {
        return Err(Error::invalid("buffer is NULL"));
    }
    if len > isize::MAX as usize {
        return Err(Error::invalid(format!("length {len} is too large")));
    }
    // SAFETY: non-NULL, u8 has alignment 1, len <= isize::MAX; validity and
    // absence of concurrent writes are the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) })
}

/// A caller buffer to fill. NULL is accepted only with `len == 0`. The
/// buffer is zeroed first: C hands over uninitialised memory (malloc), and a
/// `&mut [u8]` must only cover initialised bytes.
///
/// # Safety
/// `buf` is NULL or valid for writes of `len` bytes and not accessed by
/// anyone else for the lifetime `'a` chosen by the caller (one call).
unsafe fn out_slice<'a>(buf: *mut c_void, len: usize) -> Result<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if buf.is_null() {
        return Err(Error::invalid("buffer is NULL"));
    }
    if len > isize::MAX as usize {
        return Err(Error::invalid(format!("length {len} is too large")));
    }
    let p = buf.cast::<u8>();
    // SAFETY: non-NULL, alignment 1, writable for len bytes (caller's
    // contract); after write_bytes every byte is initialised and nobody else
    // accesses the memory during the call (caller's contract).
    unsafe {
        std::ptr::write_bytes(p, 0, len);
        Ok(std::slice::from_raw_parts_mut(p, len))
    }
}

/// Stores `value` through an out-pointer.
///
/// # Safety
/// `out` is NULL or valid and aligned for a write of `T`.
unsafe fn write_out<T>(out: *mut T, value: T, what: &str) -> Result<()> {
    if out.is_null() {
        return Err(Error::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL; validity and alignment are the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// Reads a versioned options struct whose first field is `u32 struct_size`.
/// Accepts any size from version 1 upwards; bytes past the fields this
/// library knows must be zero (a newer caller asking for something this
/// library cannot do gets `-E2BIG`, never a silent ignore).
///
/// # Safety
/// `p` is NULL or points to a readable, aligned `T` whose first field is a
/// `u32` size, and the caller's object is at least that many bytes long.
unsafe fn read_options<T: Copy>(p: *const T, v1_size: usize, what: &str) -> Result<T> {
    if p.is_null() {
        return Err(Error::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and aligned for T, hence for its leading u32.
    let size = unsafe { p.cast::<u32>().read() } as usize;
    if size < v1_size {
        return Err(Error::invalid(format!(
            "{what}: struct_size {size} is smaller than {v1_size}; fill it with its _init function"
        )));
    }
    let known = std::mem::size_of::<T>();
    if size > known {
        // SAFETY: the caller's object is `size` bytes long (contract).
        let extra = unsafe { std::slice::from_raw_parts(p.cast::<u8>().add(known), size - known) };
        if extra.iter().any(|&b| b != 0) {
            return Err(Error::new(
                libc::E2BIG,
                format!("{what}: fields past byte {known} are set, which this jbdev version does not know"),
            ));
        }
    }
    // SAFETY: at least `known` bytes are readable (size >= known here or
    // size >= v1_size == known for version 1); every field is an integer or
    // a raw pointer, so any bit pattern is a valid T.
    Ok(unsafe { p.read() })
}

fn write_flags(flags: u32) -> Result<WriteFlags> {
    if flags & !JBDEV_WRITE_FUA != 0 {
        return Err(Error::invalid(format!("unknown write flags {flags:#x}")));
    }
    Ok(WriteFlags {
        fua: flags & JBDEV_WRITE_FUA != 0,
    })
}

/// Refuses a byte range that reaches past the end of `volume` with
/// `-ENOSPC`, as the volume would, before the caller's buffer is looked
/// at: a length no buffer can have (`SIZE_MAX`) reaches past the end like
/// any other, and a refused read leaves the buffer untouched.
fn check_range(volume: &Volume, offset: u64, len: usize) -> Result<()> {
    let size = volume.size();
    let len = u64::try_from(len).unwrap_or(u64::MAX);
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(VolumeError::OutOfRange { offset, len, size }.into()),
    }
}

fn check_writable(e: &VolumeEntry) -> Result<()> {
    if e.read_only {
        return Err(VolumeError::ReadOnly.into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Library information and errors.
// ---------------------------------------------------------------------------

/// The ABI version this library implements (`JBDEV_ABI_VERSION`).
#[no_mangle]
pub extern "C" fn jbdev_abi_version() -> u32 {
    JBDEV_ABI_VERSION
}

/// The library version as a static NUL-terminated string, e.g. "0.1.0".
#[no_mangle]
pub extern "C" fn jbdev_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The message of the most recent failed jbdev call on the calling thread
/// ("" if none). The string belongs to the library and stays valid until the
/// next failing jbdev call on the same thread or the thread's exit; copy it
/// (or use `jbdev_last_error_copy`) to keep it. Successful calls leave it
/// unchanged, as errno.
#[no_mangle]
pub extern "C" fn jbdev_last_error() -> *const c_char {
    // The CString's heap buffer outlives the borrow: it is replaced, never
    // mutated in place, by set_last_error.
    with_last_error(|c| c.as_ptr()).unwrap_or(c"".as_ptr())
}

/// Copies the calling thread's last error message into `buf` (at most
/// `buf_len` bytes including the terminating NUL; truncated if longer).
/// Returns the full message length without the NUL, like snprintf.
///
/// # Safety
/// `buf` is NULL (then `buf_len` must be 0) or writable for `buf_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn jbdev_last_error_copy(buf: *mut c_char, buf_len: usize) -> usize {
    let result = std::panic::catch_unwind(|| {
        with_last_error(|c| {
            let msg = c.as_bytes();
            if !buf.is_null() && buf_len > 0 {
                let n = msg.len().min(buf_len - 1);
                // SAFETY: buf is writable for buf_len > n bytes (contract);
                // msg is a distinct Rust allocation, so no overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(msg.as_ptr(), buf.cast::<u8>(), n);
                    buf.add(n).write(0);
                }
            }
            msg.len()
        })
        .unwrap_or(0)
    });
    result.unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Options.
// ---------------------------------------------------------------------------

/// Fills `*opts` with the defaults and `struct_size = sizeof(*opts)`.
/// `size_bytes` must then be set. Returns 0 or -EINVAL (NULL).
///
/// # Safety
/// `opts` is NULL or valid for writing a `jbdev_format_options`.
#[no_mangle]
pub unsafe extern "C" fn jbdev_format_options_init(opts: *mut jbdev_format_options) -> c_int {
    ffi_call(|| {
        // SAFETY: forwarded contract.
        unsafe { write_out(opts, jbdev_format_options::defaults(), "format options") }?;
        Ok(0)
    })
}

/// Fills `*opts` with the defaults and `struct_size = sizeof(*opts)`.
/// Returns 0 or -EINVAL (NULL).
///
/// # Safety
/// `opts` is NULL or valid for writing a `jbdev_open_options`.
#[no_mangle]
pub unsafe extern "C" fn jbdev_open_options_init(opts: *mut jbdev_open_options) -> c_int {
    ffi_call(|| {
        // SAFETY: forwarded contract.
        unsafe { write_out(opts, jbdev_open_options::defaults(), "open options") }?;
        Ok(0)
    })
}

/// Decodes optional open options (NULL = defaults).
///
/// # Safety
/// `opts` is NULL or a valid `jbdev_open_options` (see `read_options`) whose
/// `journal_path` is NULL or a NUL-terminated string.
unsafe fn open_options(opts: *const jbdev_open_options) -> Result<::jbdev_volume::OpenOptions> {
    if opts.is_null() {
        return jbdev_open_options::defaults().to_rust(None);
    }
    // SAFETY: forwarded contract.
    let o = unsafe { read_options(opts, OPEN_OPTIONS_V1_SIZE, "open options") }?;
    // SAFETY: forwarded contract.
    let journal = unsafe { c_opt_path(o.journal_path, "open options journal_path") }?;
    o.to_rust(journal)
}

// ---------------------------------------------------------------------------
// Volume lifetime.
// ---------------------------------------------------------------------------

/// Formats `path` (creating the file if needed) as a new volume and opens
/// it. Whatever `path` held is overwritten without a check: unlike the
/// `jbdev format` command, this call does not refuse a target that holds a
/// volume or other data. `open_opts` may be NULL for the defaults. On success stores the handle
/// in `*out` and returns 0; on failure stores NULL (when `out` is not NULL)
/// and returns a negative errno.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string; `format_opts` is NULL or a
/// `jbdev_format_options` filled by `jbdev_format_options_init`; `open_opts`
/// likewise; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn jbdev_create(
    path: *const c_char,
    format_opts: *const jbdev_format_options,
    open_opts: *const jbdev_open_options,
    out: *mut *mut jbdev_volume,
) -> c_int {
    ffi_call(|| {
        crate::log::init_from_env();
        // SAFETY: forwarded contract; done first so a failure below leaves
        // *out NULL.
        unsafe { write_out(out, std::ptr::null_mut(), "out") }?;
        // SAFETY: forwarded contract.
        let path = unsafe { c_path(path, "path") }?;
        // SAFETY: forwarded contract.
        let f = unsafe { read_options(format_opts, FORMAT_OPTIONS_V1_SIZE, "format options") }?;
        // SAFETY: forwarded contract.
        let journal = unsafe { c_opt_path(f.journal_path, "format options journal_path") }?;
        let fopts = f.to_rust(journal)?;
        // SAFETY: forwarded contract.
        let oopts = unsafe { open_options(open_opts) }?;
        let read_only = oopts.read_only;
        let volume = Volume::create(&path, &fopts, &oopts)
            .map_err(|e| Error::new(e.errno(), format!("create {}: {e}", path.display())))?;
        let handle = VOLUMES.insert(VolumeEntry { volume, read_only })?;
        // SAFETY: forwarded contract (checked non-NULL above).
        unsafe { write_out(out, volume_ptr(handle), "out") }?;
        Ok(0)
    })
}

/// Opens an existing volume, running journal recovery if needed.
/// `opts` may be NULL for the defaults. On success stores the handle in
/// `*out` and returns 0; on failure stores NULL (when `out` is not NULL) and
/// returns a negative errno (-EUCLEAN: not a jbdev volume or corrupt;
/// -EINVAL: among others, `journal_path` set for a volume whose journal is
/// internal, which the `jbdev` command refuses too).
///
/// # Safety
/// `path` is NULL or a NUL-terminated string; `opts` is NULL or a
/// `jbdev_open_options` filled by `jbdev_open_options_init`; `out` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn jbdev_open(
    path: *const c_char,
    opts: *const jbdev_open_options,
    out: *mut *mut jbdev_volume,
) -> c_int {
    ffi_call(|| {
        crate::log::init_from_env();
        // SAFETY: forwarded contract.
        unsafe { write_out(out, std::ptr::null_mut(), "out") }?;
        // SAFETY: forwarded contract.
        let path = unsafe { c_path(path, "path") }?;
        // SAFETY: forwarded contract.
        let oopts = unsafe { open_options(opts) }?;
        let read_only = oopts.read_only;
        let volume = Volume::open(&path, &oopts)
            .map_err(|e| Error::new(e.errno(), format!("open {}: {e}", path.display())))?;
        let handle = VOLUMES.insert(VolumeEntry { volume, read_only })?;
        // SAFETY: forwarded contract (checked non-NULL above).
        unsafe { write_out(out, volume_ptr(handle), "out") }?;
        Ok(0)
    })
}

/// Grows the volume at `path`, which must not be open (in this process or
/// another), to `size_bytes`: a multiple of its block size, not below its
/// size now. An image file is extended and an RBD image resized as needed;
/// `size_bytes` 0 means all of its block device or RBD image (an image
/// file needs a size). With `JBDEV_GROW_PREALLOCATE` the added range of an
/// image file is allocated. The storage grows and is made durable before
/// the volume's superblock records the size, so a crash leaves the old
/// size or the new one. Stores the volume's size now in `*new_size` when it
/// is not NULL (the old size when there was nothing to do). Returns 0, or a
/// negative errno: -EBUSY when the volume is open, -EINVAL for a shrink, a
/// partial block, 0 for an image file, a block device too small or an
/// unknown flag, -EUCLEAN when `path` is not a jbdev volume.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string; `new_size` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn jbdev_grow(
    path: *const c_char,
    size_bytes: u64,
    flags: u32,
    new_size: *mut u64,
) -> c_int {
    ffi_call(|| {
        crate::log::init_from_env();
        // SAFETY: forwarded contract.
        let path = unsafe { c_path(path, "path") }?;
        if flags & !JBDEV_GROW_PREALLOCATE != 0 {
            return Err(Error::invalid(format!("unknown grow flags {flags:#x}")));
        }
        let size = (size_bytes != 0).then_some(size_bytes);
        let preallocate = flags & JBDEV_GROW_PREALLOCATE != 0;
        let g = ::jbdev_volume::grow(
            &path,
            size,
            preallocate,
            &::jbdev_volume::OpenOptions::default(),
        )
        .map_err(|e| Error::new(e.errno(), format!("grow {}: {e}", path.display())))?;
        if !new_size.is_null() {
            // SAFETY: forwarded contract (non-NULL checked above).
            unsafe { write_out(new_size, g.new_size, "new_size") }?;
        }
        Ok(0)
    })
}

/// Closes a volume: waits for calls in flight on this handle, flushes,
/// checkpoints and marks the journal clean. The handle is closed even when
/// this returns an error (the error says the final flush failed). Any later
/// use of the handle, including a second close, returns -EBADF; it is never
/// undefined behaviour. Transactions begun on it fail with -EBADF at commit
/// and must still be committed or aborted to free them. A `vol` that is not
/// an open volume's handle (a transaction handle, a value jbdev never
/// returned) gets -EBADF and closes nothing.
///
/// Safe to call while other threads use the handle.
#[no_mangle]
pub extern "C" fn jbdev_close(vol: *mut jbdev_volume) -> c_int {
    ffi_call(|| {
        let entry = VOLUMES.remove(vol.addr())?;
        let (res, stats) = entry.volume.close_with_stats();
        res.map_err(|e| close_error(e, &stats))?;
        Ok(0)
    })
}

// ---------------------------------------------------------------------------
// Volume geometry and metrics.
// ---------------------------------------------------------------------------

/// Stores the volume size in bytes in `*size_bytes`.
///
/// # Safety
/// `size_bytes` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn jbdev_size(vol: *const jbdev_volume, size_bytes: *mut u64) -> c_int {
    ffi_call(|| {
        let v = VOLUMES.with(vol.addr(), |e| Ok(e.volume.size()))?;
        // SAFETY: forwarded contract.
        unsafe { write_out(size_bytes, v, "size_bytes") }?;
        Ok(0)
    })
}

/// Stores the volume block size in bytes in `*block_size`.
///
/// # Safety
/// `block_size` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn jbdev_block_size(vol: *const jbdev_volume, block_size: *mut u32) -> c_int {
    ffi_call(|| {
        let v = VOLUMES.with(vol.addr(), |e| Ok(e.volume.block_size()))?;
        // SAFETY: forwarded contract.
        unsafe { write_out(block_size, v, "block_size") }?;
        Ok(0)
    })
}

/// Stores the largest write or transaction that is atomic across a crash,
/// in bytes, in `*max_bytes`.
///
/// # Safety
/// `max_bytes` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn jbdev_max_transaction_bytes(
    vol: *const jbdev_volume,
    max_bytes: *mut u64,
) -> c_int {
    ffi_call(|| {
        let v = VOLUMES.with(vol.addr(), |e| Ok(e.volume.max_transaction_bytes()))?;
        // SAFETY: forwarded contract.
        unsafe { write_out(max_bytes, v, "max_bytes") }?;
        Ok(0)
    })
}

/// Fills `*out` with the volume's metrics. `out_size` is `sizeof(*out)` as
/// the caller compiled it, at least 4 (the `struct_size` field; a smaller
/// size is refused with -EINVAL); the library fills at most that many
/// bytes and sets `out->struct_size` to the number it filled. Fields are
/// only ever appended (see `jbdev_stats` and `JBDEV_STATS_HAS`).
///
/// # Safety
/// `out` is NULL or writable for `out_size` bytes and aligned for
/// `jbdev_stats`.
#[no_mangle]
pub unsafe extern "C" fn jbdev_get_stats(
    vol: *const jbdev_volume,
    out: *mut jbdev_stats,
    out_size: usize,
) -> c_int {
    ffi_call(|| {
        if out.is_null() {
            return Err(Error::invalid("stats out is NULL"));
        }
        if out_size < std::mem::size_of::<u32>() {
            return Err(Error::invalid(format!(
                "stats out_size {out_size} is too small; pass sizeof(jbdev_stats)"
            )));
        }
        let mut stats = VOLUMES.with(vol.addr(), |e| {
            Ok(jbdev_stats::from_rust(&e.volume.stats()))
        })?;
        let n = out_size.min(std::mem::size_of::<jbdev_stats>());
        stats.struct_size = n as u32;
        // SAFETY: `out` is writable for out_size >= n bytes (contract) and
        // `stats` is a distinct local; a byte copy of a prefix is fine for a
        // struct of plain numbers.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&stats as *const jbdev_stats).cast::<u8>(),
                out.cast::<u8>(),
                n,
            )
        };
        Ok(0)
    })
}

// ---------------------------------------------------------------------------
// I/O.
// ---------------------------------------------------------------------------

/// Reads `len` bytes at byte `offset` into `buf` (no alignment needed).
/// Returns 0, or -ENOSPC if the range reaches past the end (whatever
/// `len`, `SIZE_MAX` too; `buf` is then untouched), -EBADF for a bad
/// handle, -EINVAL for a NULL buffer.
///
/// # Safety
/// `buf` is NULL (then `len` must be 0) or writable for `len` bytes, and
/// not touched by other threads during the call.
#[no_mangle]
pub unsafe extern "C" fn jbdev_read(
    vol: *const jbdev_volume,
    buf: *mut c_void,
    len: usize,
    offset: u64,
) -> c_int {
    ffi_call(|| {
        VOLUMES.with(vol.addr(), |e| {
            check_range(&e.volume, offset, len)?;
            // SAFETY: forwarded contract.
            let buf = unsafe { out_slice(buf, len) }?;
            e.volume.read_at(buf, offset)?;
            Ok(0)
        })
    })
}

/// Writes `len` bytes from `buf` at byte `offset` (no alignment needed).
/// Once it returns, every reader sees the data; with `JBDEV_WRITE_FUA` in
/// `flags` it is also durable. A write of at most
/// `jbdev_max_transaction_bytes` is atomic across a crash (all or nothing);
/// a larger one is accepted but is not atomic: it goes straight to its home
/// location, so a crash before it returns (or, without FUA, before the next
/// flush) can leave any mix of its old and new sectors, as on a plain disk.
/// So does one of at least a lowered `direct_write_threshold_bytes`, at any
/// alignment: its whole blocks go straight home (old or new per sector
/// until durable), only its partial first and last blocks are journaled.
/// Returns 0 or a negative errno: -EROFS, -EINVAL, -EBADF, -ENOSPC (the
/// range reaches past the end, whatever `len`, or the backing store is
/// full: no abort;
/// free space and write again on the same handle), -EIO (the journal
/// aborted). An error other than a refused argument (-EINVAL, -EBADF,
/// -EROFS, -ENOSPC past the end) means the write may or may not have
/// happened: its data may already be visible, and durable after a reopen;
/// read it back to know.
///
/// # Safety
/// `buf` is NULL (then `len` must be 0) or readable for `len` bytes and not
/// written by other threads during the call.
#[no_mangle]
pub unsafe extern "C" fn jbdev_write(
    vol: *const jbdev_volume,
    buf: *const c_void,
    len: usize,
    offset: u64,
    flags: u32,
) -> c_int {
    ffi_call(|| {
        let flags = write_flags(flags)?;
        VOLUMES.with(vol.addr(), |e| {
            check_writable(e)?;
            check_range(&e.volume, offset, len)?;
            // SAFETY: forwarded contract.
            let data = unsafe { in_slice(buf, len) }?;
            e.volume.write_at(data, offset, flags)?;
            Ok(0)
        })
    })
}

/// Makes every write that returned before this call durable. On an error
/// (-EIO, -ENOSPC when the backing store is full) none of them is known to
/// be durable, though any of them may be.
#[no_mangle]
pub extern "C" fn jbdev_flush(vol: *const jbdev_volume) -> c_int {
    ffi_call(|| {
        VOLUMES.with(vol.addr(), |e| {
            e.volume.flush()?;
            Ok(0)
        })
    })
}

/// Deallocates `[offset, offset + len)`; it then reads as zeroes.
/// `flags` as for `jbdev_write`.
#[no_mangle]
pub extern "C" fn jbdev_trim(vol: *const jbdev_volume, offset: u64, len: u64, flags: u32) -> c_int {
    ffi_call(|| {
        let flags = write_flags(flags)?;
        VOLUMES.with(vol.addr(), |e| {
            check_writable(e)?;
            e.volume.trim(offset, len, flags)?;
            Ok(0)
        })
    })
}

/// Zeroes `[offset, offset + len)`. `flags` as for `jbdev_write`, plus
/// `JBDEV_ZERO_NO_HOLE` to keep the range allocated (without it, it may be
/// deallocated).
#[no_mangle]
pub extern "C" fn jbdev_write_zeroes(
    vol: *const jbdev_volume,
    offset: u64,
    len: u64,
    flags: u32,
) -> c_int {
    ffi_call(|| {
        let no_hole = flags & JBDEV_ZERO_NO_HOLE != 0;
        let flags = write_flags(flags & !JBDEV_ZERO_NO_HOLE)?;
        VOLUMES.with(vol.addr(), |e| {
            check_writable(e)?;
            if no_hole {
                e.volume.write_zeroes_allocated(offset, len, flags)?;
            } else {
                e.volume.write_zeroes(offset, len, flags)?;
            }
            Ok(0)
        })
    })
}

// ---------------------------------------------------------------------------
// Transactions.
// ---------------------------------------------------------------------------

/// Begins an atomic multi-extent transaction on `vol`; stores its handle in
/// `*out`. A transaction belongs to the thread building it (calls on one
/// transaction from several threads are serialised, not undefined).
/// Returns 0 or a negative errno: -EBADF for a bad handle, -EROFS for a
/// volume opened read-only (refused here, before any extent is added),
/// -EINVAL for a NULL `out`.
///
/// # Safety
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn jbdev_txn_begin(
    vol: *const jbdev_volume,
    out: *mut *mut jbdev_txn,
) -> c_int {
    ffi_call(|| {
        // SAFETY: forwarded contract.
        unsafe { write_out(out, std::ptr::null_mut(), "out") }?;
        let volume = vol.addr();
        VOLUMES.with(volume, check_writable)?;
        let handle = TXNS.insert(TxnState {
            volume,
            extents: TxnExtents::default(),
        })?;
        // SAFETY: forwarded contract (checked non-NULL above).
        unsafe { write_out(out, txn_ptr(handle), "out") }?;
        Ok(0)
    })
}

/// Adds a write of `len` bytes from `buf` at `offset` to the transaction.
/// The data is copied; `buf` may be reused at once. Nothing is visible until
/// commit. Returns 0 or a negative errno (-ENOSPC past the end, -EFBIG when
/// the transaction would then touch more blocks than one atomic transaction
/// holds, `jbdev_max_transaction_bytes` / block size + 1 distinct blocks:
/// one extent of `jbdev_max_transaction_bytes` fits at any alignment, and
/// blocks written twice count once, but several unaligned extents of that
/// many bytes in all may touch more blocks and not fit; -EFBIG too
/// when it would then keep more than four times that in memory until the
/// commit, counting each write's bytes plus 64 (with a 64 MiB journal,
/// about a million writes of a byte or two): a write that covers earlier extents replaces
/// them, but writes that overlap earlier ones only in part are each kept
/// whole); the
/// transaction stays usable after an error, without the refused extent.
///
/// # Safety
/// `buf` is NULL (then `len` must be 0) or readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn jbdev_txn_write(
    txn: *mut jbdev_txn,
    buf: *const c_void,
    len: usize,
    offset: u64,
) -> c_int {
    ffi_call(|| {
        TXNS.with_mut(txn.addr(), |t| {
            VOLUMES.with(t.volume, |e| check_range(&e.volume, offset, len))?;
            // SAFETY: forwarded contract.
            let data = unsafe { in_slice(buf, len) }?;
            VOLUMES.with(t.volume, |e| {
                Ok(t.extents.write(&e.volume, data, offset)?)
            })?;
            Ok(0)
        })
    })
}

/// Adds a zeroing of `[offset, offset + len)` to the transaction. It is
/// journaled like a write and counts against the same limit: -EFBIG when the
/// transaction would then touch more blocks than one atomic transaction
/// holds (a zeroing of a large range belongs outside a transaction, in
/// `jbdev_write_zeroes`).
#[no_mangle]
pub extern "C" fn jbdev_txn_write_zeroes(txn: *mut jbdev_txn, offset: u64, len: u64) -> c_int {
    ffi_call(|| {
        TXNS.with_mut(txn.addr(), |t| {
            VOLUMES.with(t.volume, |e| {
                Ok(t.extents.write_zeroes(&e.volume, offset, len)?)
            })?;
            Ok(0)
        })
    })
}

/// Applies every extent of the transaction atomically (all or nothing, also
/// across a crash); with `JBDEV_WRITE_FUA`, durably before returning. The
/// transaction handle ends with this call whatever it returns. -EINVAL for
/// unknown flags (the transaction is then left open), -EBADF if the volume
/// was closed: then nothing was applied (a read-only volume refused the
/// transaction at `jbdev_txn_begin`).
/// Any other error (-EIO, -ENOSPC when the backing store is full) means the
/// commit may or may not have happened: all of the transaction or none of
/// it may be visible at once and be found after a reopen (never a part of
/// it); read it back to know.
#[no_mangle]
pub extern "C" fn jbdev_txn_commit(txn: *mut jbdev_txn, flags: u32) -> c_int {
    ffi_call(|| {
        let flags = write_flags(flags)?;
        let state = TXNS.remove(txn.addr())?;
        VOLUMES.with(state.volume, |e| {
            check_writable(e)?;
            e.volume.commit_extents(&state.extents, flags)?;
            Ok(0)
        })
    })
}

/// Discards the transaction; nothing of it is applied. The handle ends.
#[no_mangle]
pub extern "C" fn jbdev_txn_abort(txn: *mut jbdev_txn) -> c_int {
    ffi_call(|| {
        TXNS.remove(txn.addr())?;
        Ok(0)
    })
}
