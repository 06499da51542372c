//! The C-visible types and constants, and their conversion to the Rust API.
//!
//! Every field is a fixed-width integer or a pointer, never a Rust `bool` or
//! `enum`: C may store any bit pattern there, and for those Rust types an
//! unexpected value would be undefined behaviour. Enumerations are `u32`
//! constants validated on the way in.
#![allow(non_camel_case_types)]

use std::ffi::c_char;
use std::time::Duration;

use ::jbdev_volume::{
    BatchPolicy, CommitMode, FormatOptions, JournalPlacement, OpenOptions, Stats,
};
use jbdev_device::Backend;

use crate::error::{Error, Result};

/// An open volume. Opaque: only ever passed back to jbdev functions.
pub struct jbdev_volume {
    _opaque: [u8; 0],
}

/// A transaction being built. Opaque: only ever passed back to jbdev functions.
pub struct jbdev_txn {
    _opaque: [u8; 0],
}

/// Version of this C ABI. Bumped on incompatible changes only; growing a
/// struct (see `struct_size`) is compatible.
pub const JBDEV_ABI_VERSION: u32 = 1;

/// Write flag: return only once the data is durable (force unit access).
pub const JBDEV_WRITE_FUA: u32 = 1;

/// `jbdev_grow` flag: allocate the added range of an image file now
/// (`fallocate`), so writes there cannot fail later for want of space.
pub const JBDEV_GROW_PREALLOCATE: u32 = 1;

/// `jbdev_write_zeroes` flag: keep the zeroed range allocated (NBD's
/// `NO_HOLE`, `fallocate`'s `ZERO_RANGE`), so a preallocated image keeps
/// its space. Without it the range may be deallocated.
pub const JBDEV_ZERO_NO_HOLE: u32 = 2;

/// `jbdev_open_options.backend`: io_uring when available, else pread/pwrite.
pub const JBDEV_BACKEND_AUTO: u32 = 0;
/// `jbdev_open_options.backend`: io_uring only.
pub const JBDEV_BACKEND_URING: u32 = 1;
/// `jbdev_open_options.backend`: portable pread/pwrite.
pub const JBDEV_BACKEND_PREAD: u32 = 2;

/// `jbdev_open_options.batch_policy`: adaptive group commit (default).
pub const JBDEV_BATCH_ADAPTIVE: u32 = 0;
/// `jbdev_open_options.batch_policy`: commit as soon as a sync request arrives.
pub const JBDEV_BATCH_NONE: u32 = 1;
/// `jbdev_open_options.batch_policy`: sleep `batch_fixed_us` before each sync commit.
pub const JBDEV_BATCH_FIXED: u32 = 2;

/// `jbdev_open_options.commit_mode`: descriptor, data and commit, one flush (default).
pub const JBDEV_COMMIT_SINGLE_FLUSH: u32 = 0;
/// `jbdev_open_options.commit_mode`: jbd2's classic two-flush commit.
pub const JBDEV_COMMIT_TWO_FLUSH: u32 = 1;

/// How to format a new volume. Fill with `jbdev_format_options_init`, then
/// change fields.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct jbdev_format_options {
    /// `sizeof(jbdev_format_options)` as the caller compiled it; set by
    /// `jbdev_format_options_init`. Lets the struct grow compatibly.
    pub struct_size: u32,
    /// Block size of the volume and its journal: a power of two, 1024..=65536.
    pub block_size: u32,
    /// Size of the volume users see, in bytes (a multiple of `block_size`).
    pub size_bytes: u64,
    /// Journal size in bytes; 0 picks the default (64 MiB or a quarter of
    /// the volume, whichever is smaller, at least 1 MiB). At most 2^32
    /// blocks. Create writes the whole journal (zeroes), and an open volume
    /// may hold up to a journal's worth of written data in memory until it
    /// is checkpointed: size it to the memory you can give it.
    pub journal_bytes: u64,
    /// NULL: the journal lives inside the volume's file. Otherwise the path of
    /// a separate journal file or device (created if it is a missing file).
    pub journal_path: *const c_char,
}

/// How to open a volume. Fill with `jbdev_open_options_init`, then change
/// fields.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct jbdev_open_options {
    /// `sizeof(jbdev_open_options)` as the caller compiled it; set by
    /// `jbdev_open_options_init`.
    pub struct_size: u32,
    /// Non-zero: open read-only (writes fail with -EROFS).
    pub read_only: u32,
    /// Non-zero (default): O_DIRECT on files.
    pub direct_io: u32,
    /// One of `JBDEV_BACKEND_*`.
    pub backend: u32,
    /// One of `JBDEV_BATCH_*`.
    pub batch_policy: u32,
    /// One of `JBDEV_COMMIT_*`.
    pub commit_mode: u32,
    /// Sleep of `JBDEV_BATCH_FIXED`, in microseconds.
    pub batch_fixed_us: u64,
    /// Upper bound of the adaptive batching wait, in microseconds.
    pub max_batch_us: u64,
    /// A transaction nobody waits for is committed after this long, in
    /// milliseconds (at least 1; 0 is refused with -EINVAL).
    pub commit_interval_ms: u64,
    /// Writes at least this large, at any alignment, send their whole blocks
    /// straight home instead of through the journal (old or new per sector
    /// until durable; their partial first and last blocks are journaled);
    /// `UINT64_MAX` (the default) journals every write that fits in a
    /// transaction, all-or-nothing.
    pub direct_write_threshold_bytes: u64,
    /// Journal file or device of a volume formatted with an external
    /// journal, when it is not at the path recorded at format time (NULL:
    /// that path). Must be NULL for a volume whose journal is internal
    /// (-EINVAL otherwise, as `jbdev` refuses `--journal` there), and for
    /// `jbdev_create` when the format options' `journal_path` is NULL.
    pub journal_path: *const c_char,
}

/// Operator metrics of an open volume (`jbdev_get_stats`).
///
/// Versioning: fields are only ever appended, never reordered, resized or
/// removed, and `JBDEV_ABI_VERSION` stays the same when fields are added.
/// `jbdev_get_stats` fills the first `min(out_size, sizeof(jbdev_stats) of
/// the library)` bytes and sets `struct_size` to that count, so a program
/// built against an older header gets the fields it knows, and one built
/// against a newer header than the library gets a `struct_size` that
/// stops before the fields the library does not have (their bytes are left
/// untouched). Read a field only when `JBDEV_STATS_HAS(&stats, field)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct jbdev_stats {
    /// Bytes of this struct the library filled in.
    pub struct_size: u32,
    pub _reserved: u32,
    /// Transactions committed (with journal I/O) since open.
    pub commits: u64,
    pub commits_per_sec: f64,
    /// Data blocks written to the journal since open.
    pub blocks_journaled: u64,
    /// Mean data blocks per committed transaction.
    pub mean_transaction_blocks: f64,
    pub commit_latency_us_p50: u64,
    pub commit_latency_us_p99: u64,
    pub commit_latency_us_max: u64,
    /// Running average commit time used by adaptive batching.
    pub avg_commit_us: u64,
    /// Fraction of the journal holding committed, not yet checkpointed
    /// transactions, 0.0..=1.0.
    pub journal_fill_ratio: f64,
    /// Journal blocks waiting for checkpoint.
    pub checkpoint_lag_blocks: u64,
    /// Transactions committed but not yet checkpointed.
    pub checkpoint_lag_transactions: u64,
    pub checkpoints: u64,
    pub checkpoint_blocks: u64,
    /// Writes that went straight to their home location.
    pub direct_writes: u64,
    /// Fields from here on were added in version 2 (check `struct_size`).
    /// Block copies the checkpoint skipped because a newer committed copy
    /// superseded them.
    pub checkpoint_blocks_skipped: u64,
    /// Direct writes that went home from the caller's buffer without a copy.
    pub direct_writes_uncopied: u64,
    /// Commits written while an older commit was still in flight.
    pub commits_pipelined: u64,
    /// Cache flushes issued to the home and journal devices.
    pub device_flushes: u64,
    /// Times a writer found the journal full and waited for space.
    pub log_space_waits: u64,
    /// Journaled writes paused by write pacing, and the milliseconds they
    /// slept in all.
    pub paced_writes: u64,
    pub pace_sleep_ms: u64,
    /// Bulk reads that held back for a commit writers waited for.
    pub bulk_read_yields: u64,
    /// Reads from home done again because their range changed meanwhile,
    /// and reads that finished while holding writers of their range back.
    pub read_retries: u64,
    pub locked_reads: u64,
    /// Journaled-write buffers allocated from the heap / reused from the
    /// pool, and the bytes the pool keeps now.
    pub write_buffers_allocated: u64,
    pub write_buffers_reused: u64,
    pub write_buffer_pool_bytes: u64,
    /// Fields from here on were added in version 3 (check `struct_size`,
    /// or `JBDEV_STATS_HAS`): the volume's failure state.
    /// 1 once the journal aborted (a failed journal or home write or flush,
    /// the external journal file deleted or truncated, a bug): every later
    /// write, flush and commit fails (-EIO, or -ENOSPC when a full store
    /// caused it) until the volume is closed and opened again. A full
    /// backing store alone is no abort (see `store_full`).
    pub aborted: u32,
    /// 1 while the salvage after a journal failure (its device failed, or
    /// its file was deleted or truncated while the volume was open, and
    /// the volume's own device works) is due or under way: it writes every
    /// committed block home from memory, in the background, and flushes.
    /// It ends with `salvage_complete` = 1, or, if a write or flush of the
    /// volume's own device fails meanwhile, with both 0 (the journal then
    /// keeps what it holds for the next open).
    pub salvage_running: u32,
    /// 1 once that salvage is complete: every write committed before the
    /// journal failed (every write a flush or FUA acknowledged) is durable
    /// on the volume's own device, and after
    /// `jbdev_close` the command `jbdev journal reset PATH` gives the
    /// volume a new journal.
    pub salvage_complete: u32,
    /// 1 while the backing store is full (ENOSPC or EDQUOT writing home):
    /// no abort; writes that need space fail with -ENOSPC until space is
    /// freed, then succeed again on the same handle.
    pub store_full: u32,
    /// Blocks the salvage has written home so far.
    pub salvaged_blocks: u64,
    /// Checkpoint attempts that found the backing store full since open.
    pub store_full_attempts: u64,
    /// Blocks the salvage could not take home because no commit had made
    /// them durable (plain writes no flush or FUA covered yet): readable
    /// until `jbdev_close`, lost then.
    pub salvage_uncommitted_blocks: u64,
    /// Fields from here on were added in version 4 (check `struct_size`,
    /// or `JBDEV_STATS_HAS`).
    /// Journaled writes that waited so that a large (direct) write's
    /// revoke of one of their blocks reaches the journal before their copy,
    /// and large writes that waited for such a journaled write.
    pub revoke_order_waits: u64,
}

/// Size of version 1 of each struct: the smallest `struct_size` accepted.
/// Later versions append fields and keep accepting these sizes.
pub(crate) const FORMAT_OPTIONS_V1_SIZE: usize = std::mem::size_of::<jbdev_format_options>();
pub(crate) const OPEN_OPTIONS_V1_SIZE: usize = std::mem::size_of::<jbdev_open_options>();

impl jbdev_format_options {
    pub(crate) fn defaults() -> Self {
        let d = FormatOptions::new(0);
        Self {
            struct_size: FORMAT_OPTIONS_V1_SIZE as u32,
            block_size: d.block_size,
            size_bytes: 0,
            journal_bytes: d.journal_bytes.unwrap_or(0),
            journal_path: std::ptr::null(),
        }
    }

    /// Converts to the Rust options. `journal_path` is the already decoded
    /// `self.journal_path`.
    pub(crate) fn to_rust(self, journal_path: Option<std::path::PathBuf>) -> Result<FormatOptions> {
        if self.size_bytes == 0 {
            return Err(Error::invalid("format options: size_bytes must be > 0"));
        }
        let mut f = FormatOptions::new(self.size_bytes);
        f.block_size = self.block_size;
        f.journal_bytes = (self.journal_bytes != 0).then_some(self.journal_bytes);
        f.journal = match journal_path {
            Some(p) => JournalPlacement::External(p),
            None => JournalPlacement::Internal,
        };
        Ok(f)
    }
}

fn flag(name: &str, value: u32) -> Result<bool> {
    match value {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(Error::invalid(format!(
            "open options: {name} must be 0 or 1, not {v}"
        ))),
    }
}

impl jbdev_open_options {
    pub(crate) fn defaults() -> Self {
        let d = OpenOptions::default();
        Self {
            struct_size: OPEN_OPTIONS_V1_SIZE as u32,
            read_only: u32::from(d.read_only),
            direct_io: u32::from(d.direct_io),
            backend: match d.backend {
                Backend::Uring => JBDEV_BACKEND_URING,
                Backend::Pread => JBDEV_BACKEND_PREAD,
                _ => JBDEV_BACKEND_AUTO,
            },
            batch_policy: match d.batch_policy {
                BatchPolicy::None => JBDEV_BATCH_NONE,
                BatchPolicy::Fixed(_) => JBDEV_BATCH_FIXED,
                BatchPolicy::Adaptive => JBDEV_BATCH_ADAPTIVE,
            },
            commit_mode: match d.commit_mode {
                CommitMode::TwoFlush => JBDEV_COMMIT_TWO_FLUSH,
                CommitMode::SingleFlush => JBDEV_COMMIT_SINGLE_FLUSH,
            },
            batch_fixed_us: match d.batch_policy {
                BatchPolicy::Fixed(t) => t.as_micros().try_into().unwrap_or(u64::MAX),
                // The old jbd one-jiffy sleep, if someone picks FIXED
                // without setting a duration.
                _ => 1000,
            },
            max_batch_us: d.max_batch.as_micros().try_into().unwrap_or(u64::MAX),
            commit_interval_ms: d.commit_interval.as_millis().try_into().unwrap_or(u64::MAX),
            direct_write_threshold_bytes: d.direct_write_threshold,
            journal_path: std::ptr::null(),
        }
    }

    /// Converts to the Rust options, validating every enumeration.
    pub(crate) fn to_rust(self, journal_path: Option<std::path::PathBuf>) -> Result<OpenOptions> {
        let mut o = OpenOptions {
            read_only: flag("read_only", self.read_only)?,
            direct_io: flag("direct_io", self.direct_io)?,
            journal_path,
            ..OpenOptions::default()
        };
        o.backend = match self.backend {
            JBDEV_BACKEND_AUTO => Backend::Auto,
            JBDEV_BACKEND_URING => Backend::Uring,
            JBDEV_BACKEND_PREAD => Backend::Pread,
            v => return Err(Error::invalid(format!("open options: unknown backend {v}"))),
        };
        o.batch_policy = match self.batch_policy {
            JBDEV_BATCH_ADAPTIVE => BatchPolicy::Adaptive,
            JBDEV_BATCH_NONE => BatchPolicy::None,
            JBDEV_BATCH_FIXED => BatchPolicy::Fixed(Duration::from_micros(self.batch_fixed_us)),
            v => {
                return Err(Error::invalid(format!(
                    "open options: unknown batch_policy {v}"
                )))
            }
        };
        o.commit_mode = match self.commit_mode {
            JBDEV_COMMIT_SINGLE_FLUSH => CommitMode::SingleFlush,
            JBDEV_COMMIT_TWO_FLUSH => CommitMode::TwoFlush,
            v => {
                return Err(Error::invalid(format!(
                    "open options: unknown commit_mode {v}"
                )))
            }
        };
        o.max_batch = Duration::from_micros(self.max_batch_us);
        o.commit_interval = Duration::from_millis(self.commit_interval_ms);
        o.direct_write_threshold = self.direct_write_threshold_bytes;
        Ok(o)
    }
}

impl jbdev_stats {
    pub(crate) fn from_rust(s: &Stats) -> Self {
        Self {
            struct_size: std::mem::size_of::<Self>() as u32,
            _reserved: 0,
            commits: s.commits,
            commits_per_sec: s.commits_per_sec,
            blocks_journaled: s.blocks_journaled,
            mean_transaction_blocks: s.mean_transaction_blocks,
            commit_latency_us_p50: s.commit_latency_us_p50,
            commit_latency_us_p99: s.commit_latency_us_p99,
            commit_latency_us_max: s.commit_latency_us_max,
            avg_commit_us: s.avg_commit_us,
            journal_fill_ratio: s.journal_fill_ratio,
            checkpoint_lag_blocks: s.checkpoint_lag_blocks,
            checkpoint_lag_transactions: s.checkpoint_lag_transactions,
            checkpoints: s.checkpoints,
            checkpoint_blocks: s.checkpoint_blocks,
            direct_writes: s.direct_writes,
            checkpoint_blocks_skipped: s.checkpoint_blocks_skipped,
            direct_writes_uncopied: s.direct_writes_uncopied,
            commits_pipelined: s.commits_pipelined,
            device_flushes: s.device_flushes,
            log_space_waits: s.log_space_waits,
            paced_writes: s.paced_writes,
            pace_sleep_ms: s.pace_sleep_ms,
            bulk_read_yields: s.bulk_read_yields,
            read_retries: s.read_retries,
            locked_reads: s.locked_reads,
            write_buffers_allocated: s.write_buffers_allocated,
            write_buffers_reused: s.write_buffers_reused,
            write_buffer_pool_bytes: s.write_buffer_pool_bytes,
            aborted: u32::from(s.aborted),
            salvage_running: u32::from(s.salvage_running),
            salvage_complete: u32::from(s.salvage_complete),
            store_full: u32::from(s.store_full),
            salvaged_blocks: s.salvaged_blocks,
            store_full_attempts: s.store_full_attempts,
            salvage_uncommitted_blocks: s.salvage_uncommitted_blocks,
            revoke_order_waits: s.revoke_order_waits,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_defaults_round_trip_to_the_rust_defaults() {
        let o = jbdev_open_options::defaults().to_rust(None).unwrap();
        let d = OpenOptions::default();
        assert_eq!(o.read_only, d.read_only);
        assert_eq!(o.direct_io, d.direct_io);
        assert_eq!(o.batch_policy, d.batch_policy);
        assert_eq!(o.commit_mode, d.commit_mode);
        assert_eq!(o.max_batch, d.max_batch);
        assert_eq!(o.commit_interval, d.commit_interval);
        assert_eq!(o.direct_write_threshold, d.direct_write_threshold);
    }

    #[test]
    fn bad_enumerations_are_rejected() {
        let mut o = jbdev_open_options::defaults();
        o.backend = 9;
        assert_eq!(o.to_rust(None).unwrap_err().errno, libc::EINVAL);
        let mut o = jbdev_open_options::defaults();
        o.read_only = 2;
        assert_eq!(o.to_rust(None).unwrap_err().errno, libc::EINVAL);
        let mut o = jbdev_open_options::defaults();
        o.batch_policy = JBDEV_BATCH_FIXED;
        o.batch_fixed_us = 250;
        assert_eq!(
            o.to_rust(None).unwrap().batch_policy,
            BatchPolicy::Fixed(Duration::from_micros(250))
        );
    }

    #[test]
    fn format_requires_a_size() {
        let f = jbdev_format_options::defaults();
        assert_eq!(f.to_rust(None).unwrap_err().errno, libc::EINVAL);
    }
}
