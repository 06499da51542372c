//! jbdev's volume: a journaled block device with byte-addressed reads and
//! writes, flush, FUA, trim, write-zeroes and atomic multi-extent
//! transactions.
//!
//! # Durability semantics
//! * When a write returns, every reader sees its data.
//! * It is durable once a FUA write returns, or once a [`Volume::flush`]
//!   called after it returned has returned.
//! * Every write and every transaction up to
//!   [`Volume::max_transaction_bytes`] is all-or-nothing across a crash,
//!   and journaled writes of one thread survive in order. Aligned writes of
//!   at least `direct_write_threshold` bytes, and large trims or
//!   write-zeroes, go straight home and are old-or-new per sector until
//!   flushed.
#![deny(unsafe_code)]

mod bufpool;
mod engine;
mod error;
pub mod grow;
pub mod inspect;
mod lockorder;
mod options;
mod overlay;
pub mod ratelimit;
pub mod reset;
pub mod superblock;
mod volume;

pub use engine::{Completion, Durability};
pub use error::{is_no_space, is_not_writable, Result, VolumeError};
pub use grow::{grow, Grown};
pub use jbdev_journal as journal;
pub use options::{
    BatchPolicy, CommitMode, FormatOptions, JournalPlacement, OpenOptions, MAX_PIPELINE_DEPTH,
    MAX_WAIT,
};
pub use overlay::CallerBuf;
pub use reset::{
    rebuild_journal_superblock, reset_journal, reset_journal_device, reset_journal_with,
    JournalReset, ResetOptions,
};
pub use volume::{
    check_replay_plan, default_journal_bytes, describe_scan_end, file_format_would_create,
    foreign_journal, format_layout, home_behind_journal, journal_behind_home, journal_target,
    refusal_by_superblocks, relative_recorded_journal, scan_journal, session_mismatch,
    stale_journal, unreadable_journal_advice, CreateTarget, Extent, ExtentState, FormatLayout,
    JournalAt, JournalProbe, ProgressTicker, RecoveryReport, SessionMismatch, Stats, TargetRole,
    TouchedBlocks, Transaction, TxnExtents, Volume, WriteFlags, MIN_JOURNAL_BLOCKS,
    TXN_HELD_FACTOR,
};
