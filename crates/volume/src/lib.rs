//! jbdev's volume: a journaled block device with byte-addressed reads and
//! writes, flush, FUA, trim, write-zeroes and atomic multi-extent
//! transactions. See the crate README section "Durability semantics".
#![deny(unsafe_code)]

mod error;
mod options;
pub mod superblock;
mod volume;

pub use error::{Result, VolumeError};
pub use options::{BatchPolicy, CommitMode, FormatOptions, JournalPlacement, OpenOptions};
pub use volume::{Extent, ExtentState, Stats, Transaction, Volume, WriteFlags};
