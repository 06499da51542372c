//! The journal of jbdev, in jbd2's on-disk format.
//!
//! * [`format`](mod@format) — encode/decode of every on-disk structure (big-endian, crc32c).
//! * [`region`] — where the journal lives and block I/O to it.
//! * [`writer`] — lays out one transaction as revoke, descriptor, data and
//!   commit blocks.
//! * [`recovery`] — scan, revoke and replay passes.
//! * [`space`] — the log ring's ledger: placement, sequence, space
//!   accounting and its wait queue, how far the tail may move.
//! * [`order`] — [`Journal`]: the ledger plus the commit order (cut,
//!   in-flight depth, in-order publication, stop after a failure, the
//!   checkpointed transaction).
//!
//! The threads (commit, group commit's waiting, checkpoint I/O) live in the
//! volume crate, which owns what transactions hold; the rules they follow
//! are here.
#![deny(unsafe_code)]

pub mod error;
pub mod format;
pub mod order;
pub mod recovery;
pub mod region;
pub mod space;
pub mod writer;

pub use error::{JournalError, Result};
pub use order::{Journal, LogCost, Outcome};
pub use region::JournalRegion;

/// Position of the next log block after `pos` in a log occupying
/// `first..len_blocks` (the log is circular).
pub fn next_pos(pos: u32, first: u32, len_blocks: u32) -> u32 {
    if pos + 1 >= len_blocks {
        first
    } else {
        pos + 1
    }
}
