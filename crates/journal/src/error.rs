//! Errors of the journal layer.

use jbdev_device::DeviceError;

use crate::format::FormatError;

/// Result of a journal operation.
pub type Result<T, E = JournalError> = std::result::Result<T, E>;

/// An error of the journal layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The journal superblock is unreadable or unsupported.
    #[error("journal superblock: {0}")]
    Superblock(#[source] FormatError),
    /// A transaction in the middle of the log is damaged while later
    /// transactions are intact: replaying would half-apply history.
    #[error(
        "transaction {sequence} at journal block {pos} is corrupt ({reason}) but later transactions exist; \
         refusing to replay (open read-only to rescue data)"
    )]
    CorruptMiddle {
        sequence: u32,
        pos: u32,
        reason: String,
    },
    /// The log is inconsistent with the superblock (e.g. it wraps onto itself).
    #[error("journal log is inconsistent: {0}")]
    Inconsistent(String),
}
