//! Errors of the device layer.

use std::io;

/// Result of a device operation.
pub type Result<T, E = DeviceError> = std::result::Result<T, E>;

/// An error of the device layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The request's offset or length is not a multiple of the logical block size.
    #[error("request at offset {offset} length {len} is not aligned to the {block_size}-byte logical block size")]
    Misaligned {
        offset: u64,
        len: u64,
        block_size: u32,
    },
    /// The request reaches past the end of the device.
    #[error(
        "request at offset {offset} length {len} reaches past the end of the {size}-byte device"
    )]
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// An I/O error from the operating system.
    #[error("{op} failed on {what}: {error}")]
    Io {
        op: &'static str,
        what: String,
        /// The OS error (shown in the message, so not a `source()`).
        error: io::Error,
    },
    /// The device was opened by another process or handle. The string
    /// names it and, in parentheses, who may hold it.
    #[error("{0} is already open")]
    Busy(String),
    /// The fault-injecting device has "lost power": every operation fails.
    #[error("device lost power (fault injection)")]
    PowerCut,
    /// An error injected by the fault-injecting device.
    #[error("injected I/O error on {0}")]
    Injected(&'static str),
    /// A device flush failed earlier; no later flush through the same
    /// coalescer can vouch for data written before that failure.
    /// It says the first failure's errno (a flush that found no space
    /// keeps saying ENOSPC: session 23, a flaky test showed a later caller
    /// turning it into EIO).
    #[error("an earlier flush of this device failed ({why}); writes before it may be lost, so no flush can succeed until the device is reopened")]
    FlushFailed { why: String, errno: i32 },
    /// A request queue already holds as many requests as its depth.
    #[error("the request queue is full ({depth} requests in flight); reap completions before pushing more")]
    QueueFull { depth: u32 },
    /// Bad argument when opening (size, path kind, block size).
    #[error("{0}")]
    Invalid(String),
}

impl DeviceError {
    /// Wraps an OS error with the operation and the object it failed on.
    pub fn io(op: &'static str, what: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            op,
            what: what.into(),
            error: source,
        }
    }

    /// An I/O error that also says what the caller was doing (other
    /// errors unchanged): "readv failed on IMG (reading the volume
    /// superblock): ...", not a bare path and errno.
    pub fn doing(self, task: &str) -> Self {
        match self {
            Self::Io { op, what, error } => Self::Io {
                op,
                what: format!("{what} ({task})"),
                error,
            },
            other => other,
        }
    }

    /// The closest POSIX errno, for the C ABI and the NBD server.
    pub fn errno(&self) -> i32 {
        match self {
            Self::Misaligned { .. } | Self::Invalid(_) => libc::EINVAL,
            Self::OutOfRange { .. } => libc::ENOSPC,
            Self::Io { error, .. } => error.raw_os_error().unwrap_or(libc::EIO),
            Self::Busy(_) => libc::EBUSY,
            Self::QueueFull { .. } => libc::EAGAIN,
            Self::FlushFailed { errno, .. } => *errno,
            Self::PowerCut | Self::Injected(_) => libc::EIO,
        }
    }
}
