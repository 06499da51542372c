//! Error codes and the per-thread "last error" message.
//!
//! Every exported function returns `0` (or a non-negative value) on success
//! and a negative errno on failure. The human-readable reason of the most
//! recent failure on the calling thread is kept in a thread-local buffer, so
//! threads never see each other's messages and no lock is needed.

use std::cell::RefCell;
use std::ffi::{c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use jbdev_volume::{Stats, VolumeError};

/// A failure on its way to C: a positive errno and a message.
#[derive(Debug)]
pub(crate) struct Error {
    /// Positive POSIX errno; the C caller sees `-errno`.
    pub(crate) errno: c_int,
    pub(crate) message: String,
}

impl Error {
    pub(crate) fn new(errno: c_int, message: impl Into<String>) -> Self {
        Self {
            errno,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(libc::EINVAL, message)
    }

    pub(crate) fn bad_handle(kind: &str) -> Self {
        Self::new(
            libc::EBADF,
            format!("{kind} handle is NULL, closed, or was never returned by jbdev"),
        )
    }
}

impl From<VolumeError> for Error {
    fn from(e: VolumeError) -> Self {
        // The volume's message tells an operator to watch the log for
        // "salvage complete"; a C program has no log unless it asks for
        // one, so it is told where it can see the same.
        let note = match e {
            VolumeError::JournalFileLost(_) => {
                " (from C: jbdev_get_stats() shows salvage_running = 1 while the salvage goes on \
                 and salvage_complete = 1 once it is complete; jbdev_close() waits for it and \
                 says how it ended; JBDEV_LOG=warn in the environment sends the log to stderr)"
            }
            _ => "",
        };
        Self::new(e.errno(), format!("{e}{note}"))
    }
}

/// The error of `jbdev_close`, with the salvage's outcome when there was
/// one (`stats` as the close left it: the salvage has ended): after the
/// close the caller cannot ask `jbdev_get_stats` any more.
pub(crate) fn close_error(e: VolumeError, stats: &Stats) -> Error {
    let outcome = stats.close_outcome(&e);
    Error::new(e.errno(), format!("{e}{outcome}"))
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

thread_local! {
    /// Message of the latest failed call on this thread. Invariant: never
    /// contains an interior NUL (see [`set_last_error`]).
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error.
pub(crate) fn set_last_error(message: &str) {
    // Interior NULs would truncate the C string; replace them rather than
    // losing the message.
    let bytes: Vec<u8> = message
        .bytes()
        .map(|b| if b == 0 { b'?' } else { b })
        .collect();
    let c = CString::new(bytes).unwrap_or_default();
    // try_with: during thread teardown the slot may already be gone; losing
    // the message then is better than panicking across the boundary.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = c);
}

/// Runs `f` with the pointer to this thread's last-error string (valid until
/// the next failing call on this thread).
pub(crate) fn with_last_error<R>(f: impl FnOnce(&CString) -> R) -> Option<R> {
    LAST_ERROR.try_with(|slot| f(&slot.borrow())).ok()
}

/// The one way into the library: runs `f`, turns its error into a negative
/// errno plus a last-error message, and stops any panic at the boundary
/// (unwinding into C is undefined behaviour).
///
/// `AssertUnwindSafe` is sound here because state shared between calls lives
/// behind locks whose poisoning the handle table deliberately ignores: a
/// panic inside one call reports `-EIO` to its caller and leaves the handle
/// usable (or closable) by others.
pub(crate) fn ffi_call(f: impl FnOnce() -> Result<c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => value,
        Ok(Err(e)) => {
            set_last_error(&e.message);
            // errno values are small positive numbers; guard anyway so a
            // mistake can never turn a failure into a "success" code.
            -e.errno.max(1)
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic payload".to_owned());
            set_last_error(&format!("internal error in jbdev (panic): {what}"));
            -libc::EIO
        }
    }
}
