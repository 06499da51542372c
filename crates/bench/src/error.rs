//! The benchmark's error type.

/// Result of a benchmark operation.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// An error while setting up, running or reporting a benchmark.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// An I/O call failed; `what` names the call and the path. The OS
    /// error is in the message, and not also a `source` (an error chain
    /// printed with `{:#}` would repeat it).
    #[error("{what}: {error}")]
    Io { what: String, error: std::io::Error },
    /// The volume under test returned an error.
    #[error(transparent)]
    Volume(#[from] jbdev_volume::VolumeError),
    /// An external tool (losetup, mkfs.ext4, mount, fs_mark) failed.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        cmd: String,
        status: String,
        stderr: String,
    },
    /// The environment cannot run the requested backing or baseline.
    #[error("{0}")]
    Setup(String),
    /// A bad option value.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Writing a plot failed.
    #[error("plot {path}: {msg}")]
    Plot { path: String, msg: String },
    /// Writing the JSON report failed.
    #[error("json report: {0}")]
    Json(#[from] serde_json::Error),
    /// Writing the tables to stdout failed (a closed pipe, a full disk):
    /// the run stops there.
    #[error(transparent)]
    Stdout(#[from] jbdev_device::stdout::StdoutError),
    /// SIGINT or SIGTERM arrived; everything was torn down.
    #[error("interrupted; what the run set up (loop devices, mounts, files or RBD images it created) was torn down")]
    Interrupted,
}

/// Wraps an `io::Error` with what was being done.
pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let what = what.into();
    move |error| BenchError::Io { what, error }
}
