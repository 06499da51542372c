//! The journaling engine: joining transactions, group commit, checkpointing.
//!
//! # Parts
//! * this module — the engine's state (`Engine`, the journal state `JState`
//!   under the state lock, stripes), construction, errors and shutdown;
//! * [`mod@write`] — journaled writes (one copy into a pooled buffer, credits
//!   from the log ledger `jbdev_journal::space::LogSpace`, publish);
//! * [`read`] — consistent reads over the overlay and home;
//! * [`commit`] — leader/follower group commit, batching, cut, commit I/O,
//!   in-order publish;
//! * [`direct`] — direct home writes with revokes;
//! * [`checkpoint`] — the checkpoint thread and the tail.
//!
//! The rules of the log itself — space, placement, cut order, in-flight
//! depth, in-order publication, nothing published after a failure, how far
//! the tail may move — are `jbdev_journal::Journal`'s (unit-tested there);
//! the engine keeps one in its state and does the I/O and the waiting.
//!
//! # Joining a transaction
//! Writers never touch one global lock or counter per write: a cache line
//! every write touches caps throughput however many cores there are.
//! Each thread is bound to one of [`STRIPES`] stripes; a stripe holds the
//! blocks its threads added to the running transaction and a small stock of
//! journal-space credits. A write locks its stripe, then the overlay shards
//! of its blocks (ascending), validates read-modify-write bases, inserts the
//! new versions and appends them to the stripe. Only when its stripe runs out
//! of credits does a writer take the journal state lock.
//!
//! The commit thread closes ("cuts") the running transaction by locking all
//! stripes at once, so every write — which holds one stripe lock while it
//! inserts — lies entirely before or after the cut, and versions of a block
//! are ordered the same way as the transactions holding them.
//!
//! # Group commit (the batching wait is tuned to the device)
//! A FUA write or a flush registers as a sync waiter for the transaction it
//! needs and wakes the commit thread. While commit N is in flight, new
//! arrivals join N+1 (natural batching). When the commit thread is idle and
//! a sync request arrives, the batching policy decides how long to wait for
//! more joiners:
//! * `none` — not at all;
//! * `fixed:<us>` — that long whenever more than one writer is syncing;
//! * `adaptive` — not at all when only one writer is syncing (judged by the
//!   outstanding sync requests and by how many waiters the previous commit
//!   had); otherwise until the transaction (aged from the later of its first
//!   sync request and the previous commit's end) is as old as the average
//!   commit time (a running average, each new sample weighted 1/4), capped
//!   at `max_batch` — or until three quarters of the writers syncing in all
//!   have joined this transaction (see `Engine::batch_target`).
//!
//! # Writeout priority (urgent only when somebody waits)
//! Commit blocks go out at background priority unless someone waits for the
//! commit; the priority is re-read between chunks, so a commit that somebody
//! starts waiting for finishes urgently. Checkpoint writes are background and
//! paced in chunks, and urgent only while journal space runs low.
//!
//! # Durability
//! A transaction is committed once all its journal blocks completed and a
//! flush issued after them returned. The commit thread never waits for
//! journal space: every write pays for its journal blocks in advance
//! (credits), so a commit always fits.

use std::collections::{BTreeMap, VecDeque};
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use crossbeam_utils::CachePadded;
use jbdev_device::{AlignedBuf, BlockDevice, FlushCoalescer, IoPriority, WriteReq};
use jbdev_journal::format::{DescriptorBlock, JournalSuperblock, RevokeBlock};
use jbdev_journal::space::{Placement, Ticket};
use jbdev_journal::writer::{self, LogBlock};
use jbdev_journal::JournalRegion;
use jbdev_journal::{Journal, Outcome};
use parking_lot::{Condvar, Mutex, RwLock};
use smallvec::SmallVec;

use crate::bufpool::{BufPool, WriteBuf};
use crate::lockorder::{Leaf, Rank, Ranked};

use crate::error::is_no_space;
use crate::overlay::{BlockRef, DirectData, Lba, Overlay, Pending, Source, Tid, Version};
use crate::{BatchPolicy, CommitMode, OpenOptions, Result, VolumeError};

mod checkpoint;
mod commit;
mod direct;
mod read;
mod write;

pub use direct::DirectSync;
pub use write::Durability;

/// Shard guards a request holds, in ascending shard order.
type ShardGuards<'a> = SmallVec<[(usize, Ranked<'a, crate::overlay::Shard>); 8]>;

/// Runs `(first block index, count)` of a read that come from home.
type HomeRuns = SmallVec<[(usize, usize); 4]>;

/// Number of transaction-join stripes (power of two).
pub const STRIPES: usize = 32;
/// Direct-write buffers kept for reuse: how many, how many bytes in all,
/// and the smallest worth keeping. Enough for every NBD worker's 256 KiB
/// bulk write at once (a fresh buffer of that size costs its page faults
/// on every write: measured at 40% of the server's CPU under nbdcopy).
const DIRECT_BUFS_KEPT: usize = 64;
const DIRECT_BUFS_BYTES: usize = 64 << 20;
const DIRECT_BUF_MIN_BYTES: usize = 64 << 10;

/// Runs `f`, turning a panic in it into an error: the engine's threads
/// must fail-stop (abort the volume, fail the waiters) on a bug, not die
/// or unwind past state that others wait on. The panic still prints
/// through the panic hook.
fn contain_panic<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        Err(VolumeError::Internal(format!("{what} panicked ({msg})")))
    })
}

/// Blocks validated and written per checkpoint chunk (the home lock is
/// held for one chunk at a time, so direct writes wait at most that long).
const CHECKPOINT_CHUNK_BLOCKS: usize = 512;
/// Most blocks per checkpoint round (and at most a quarter of the log): the
/// tail advances (and space is freed) after every round instead of after
/// the whole backlog.
const CHECKPOINT_ROUND_BLOCKS: usize = 4096;
/// The checkpoint starts when committed transactions fill this fraction of
/// the log (or after `checkpoint_interval`), and takes the oldest round at a
/// time (at most an eighth of the log): the newer committed transactions
/// behind the round then hold the rewrites that supersede copies in it,
/// which the checkpoint skips (a block rewritten all the time goes home
/// about once per log wrap), and room remains for a transaction of the
/// largest size (a quarter).
const CHECKPOINT_START: (u64, u64) = (1, 4);
/// Above this fill the checkpoint's writes go out at urgent priority.
const CHECKPOINT_URGENT: (u64, u64) = (3, 4);
/// Write pacing (`Engine::pace`): from this much of the log taken (parts
/// per thousand; the checkpoint is urgent from here too), up to this pause
/// per block at a full log; sleeps of at least / at most these.
const PACE_FROM_PERMILLE: u64 = 875;
const PACE_MAX_PER_BLOCK_NS: u64 = 500_000;
const PACE_MIN_SLEEP_NS: u64 = 100_000;
const PACE_MAX_SLEEP_NS: u64 = 20_000_000;
/// Condition variables for commit waiters (see `Engine::done`).
const DONE_SLOTS: usize = 32;
/// Most commits in flight (also the journal's refusal limit).
const MAX_PIPELINE_DEPTH: u32 = jbdev_journal::recovery::MAX_PIPELINE_DEPTH;
/// Lock-free attempts of a read (or of a read-modify-write's home read)
/// before it reads home under the shard locks, which always succeeds.
const READ_OPTIMISTIC_TRIES: u32 = 3;

thread_local! {
    static STRIPE_INDEX: usize = {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        // A one-time registration per thread, not a per-I/O counter.
        (NEXT.fetch_add(1, Ordering::Relaxed) as usize) % STRIPES
    };
}

fn my_stripe() -> usize {
    STRIPE_INDEX.with(|i| *i)
}

/// Blocks a thread's writes added to the running transaction.
#[derive(Default)]
struct Stripe {
    tid: Tid,
    blocks: Vec<(Lba, u64, BlockRef)>,
    revokes: Vec<(Lba, u64)>,
    /// Journal blocks reserved and not yet used.
    credits: u64,
    /// Credits spent in the running transaction.
    charged: u64,
    /// Data blocks this stripe added to the running transaction (for its
    /// share of descriptor blocks).
    data_blocks: u64,
}

/// What a cut takes from the stripes: blocks (with versions), revokes
/// (with versions), the credits they paid, and the unspent credits the
/// stripes held (returned to the pool, so no stripe keeps journal space
/// across transactions — a stripe whose threads went quiet would otherwise
/// strand it).
type Cut = (Vec<(Lba, u64, BlockRef)>, Vec<(Lba, u64)>, u64, u64);

/// A committed transaction waiting for checkpoint.
pub struct CommittedTxn {
    pub tid: Tid,
    pub sequence: u32,
    pub start_pos: u32,
    pub log_blocks: u64,
    /// Journal credits the transaction paid (released when published).
    pub charged: u64,
    pub blocks: Vec<(Lba, u64, BlockRef)>,
    pub revokes: Vec<Lba>,
    /// How long its commit took (cut to flushed).
    pub elapsed: Duration,
}

impl jbdev_journal::LogCost for CommittedTxn {
    fn log_blocks(&self) -> u64 {
        self.log_blocks
    }
    fn charged(&self) -> u64 {
        self.charged
    }
}

/// The log layout of a cut transaction, fixed under the state lock so that
/// transactions in flight at once never overlap in the log.
struct Layout {
    sequence: u32,
    head: u32,
    /// Older transactions in flight at the cut: this one is written at once
    /// all the same, and its commit block says so (see `Cut::overlap`).
    overlap: u32,
}

/// State shared by writers, the commit thread and the checkpoint thread.
struct JState {
    /// The journal's core: the log ring's ledger (placement, sequence,
    /// used / granted / free blocks, the space queue, the tail) and the
    /// commit order (running, in flight, published, checkpointed).
    j: Journal<CommittedTxn>,
    running_created: Instant,
    /// When the first sync request for the running transaction arrived.
    running_first_sync: Option<Instant>,
    /// A leader is between deciding to commit the running transaction and
    /// cutting it (its batching wait): nobody else may start one.
    cutting: bool,
    /// The newest cut found nothing to commit (drain is complete).
    last_cut_empty: bool,
    /// Highest transaction somebody asked to be committed.
    want_commit: Tid,
    sync_waiters: u32,
    /// Sync waiters that joined the running transaction (reset at the cut).
    /// Not `sync_waiters`: that also counts the writers a just-published
    /// commit released but which have not run yet to leave — on a loaded
    /// machine, most of them — and a batch counted with them looked
    /// complete before the released writers could rejoin.
    running_waiters: u32,
    last_batch_waiters: u32,
    /// Most sync waiters present at once since the last cut, and its value
    /// at the last cut: how many writers are syncing in all, including the
    /// ones a commit in flight will release (they were waiting on it).
    sync_peak: u32,
    sync_population: u32,
    /// When the last transaction was published (its writers released).
    last_published: Instant,
    avg_commit_ns: u64,
    /// How long adaptive batching waits have lasted (running average):
    /// how long the writers a commit released take to rejoin. Batching
    /// waits only while this is short next to a commit (`Engine::batch_deadline`).
    avg_batch_wait_ns: u64,
    /// Commits since the last adaptive wait (waits skipped because they
    /// did not pay): every `BATCH_PROBE_EVERY`th waits anyway, to measure.
    batch_waits_skipped: u32,
    credits_since_cut: u64,
    space_waiters: u32,
    /// Sync requests that did not wait ([`Engine::when_durable`]): their
    /// transaction and what to tell when it is published. The commit thread
    /// leads their commits.
    durable_cbs: Vec<(Tid, Completion)>,
    /// Highest transaction in `durable_cbs`.
    async_want: Tid,
    /// Completions whose transaction was published (or failed), run once
    /// the state lock is released (see `Engine::run_due`).
    cbs_due: Vec<Completion>,
    error: Option<String>,
    shutdown: bool,
    checkpoint_shutdown: bool,
    checkpoint_request: bool,
    /// The checkpoint's last attempt found the backing store full (see
    /// [`HomeFull`]); None once an attempt succeeds.
    home_full: Option<HomeFull>,
    /// Checkpoint attempts that failed for lack of space since open: a
    /// writer waiting for log space fails once an attempt made after it
    /// arrived has failed too.
    home_full_attempts: u64,
}

/// The backing store had no room for a checkpoint's home write.
#[derive(Clone, Debug)]
pub(super) struct HomeFull {
    /// The failed write, with the device's error.
    reason: String,
    /// `ENOSPC` or `EDQUOT`.
    errno: i32,
    since: Instant,
}

/// Metrics owned by the background threads.
pub struct StatsInner {
    pub started: Instant,
    pub commits: u64,
    pub data_blocks: u64,
    pub log_blocks: u64,
    pub commit_latency_us: hdrhistogram::Histogram<u64>,
    pub checkpoints: u64,
    pub checkpoint_blocks: u64,
    pub checkpoint_blocks_skipped: u64,
    pub direct_writes: u64,
    /// Direct writes that went home from the caller's own buffer.
    pub direct_writes_uncopied: u64,
    /// Commits written while an older commit was in flight.
    pub chained_commits: u64,
    pub log_space_waits: u64,
    /// Journaled writes that waited for a direct write's revoke of their
    /// block to reach the log first, and direct writes that waited for such
    /// a journaled write to log its copy (ARCHITECTURE 23).
    pub revoke_order_waits: u64,
    /// Journaled writes that paused (`Engine::pace`), and the time they slept.
    pub paced_writes: u64,
    pub pace_sleep_us: u64,
    /// Bulk reads that waited for a commit writers wait for (22a).
    pub bulk_read_yields: u64,
    /// Home reads done again because the range changed meanwhile, and
    /// reads that finished under the shard locks (`Engine::read_blocks`).
    pub read_retries: u64,
    pub locked_reads: u64,
    /// Blocks of committed transactions written home after the journal
    /// failed ([`Engine::salvage`]), and whether that salvage finished
    /// (every committed block home and flushed).
    pub salvaged_blocks: u64,
    pub salvage_complete: bool,
    /// Blocks the salvage could not take home because no commit had made
    /// them durable: plain writes still in the running transaction, or in
    /// a commit that failed or was in flight when the journal failed.
    pub salvage_uncommitted_blocks: u64,
}

/// Receives the outcome of a request that did not wait for durability
/// (`Engine::when_durable`, `Volume::write_at_then`): called exactly once,
/// on the caller's thread or on a commit's, never under an engine lock. It
/// should only hand the outcome on (queue a reply, wake a task).
pub type Completion = Box<dyn FnOnce(Result<()>) + Send + 'static>;

/// One write operation of a journaled request, in bytes.
pub enum Op<'a> {
    Write {
        offset: u64,
        data: &'a [u8],
    },
    Zero {
        offset: u64,
        len: u64,
        zeroing: Zeroing,
    },
}

/// What zeroing does to the home blocks' allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zeroing {
    /// They may become holes (trim, write-zeroes): the checkpoint punches
    /// whole zeroed blocks out of home, a large range is punched in place.
    Deallocate,
    /// They stay allocated (NBD's `NO_HOLE`): zero blocks are written home,
    /// a large range is zeroed with `ZERO_RANGE` / BLKZEROOUT.
    KeepAllocated,
}

impl Op<'_> {
    fn range(&self) -> (u64, u64) {
        match self {
            Op::Write { offset, data } => (*offset, *offset + data.len() as u64),
            Op::Zero { offset, len, .. } => (*offset, *offset + *len),
        }
    }

    /// Touches no byte.
    pub(crate) fn is_empty(&self) -> bool {
        let (s, e) = self.range();
        s == e
    }
}

/// The engine. Shared by the `Volume` handle and the background threads.
///
/// Its state is in named parts, each with its own locks (their ranks are in
/// [`crate::lockorder`]): the home area ([`Home`]), the log area ([`Log`]),
/// the journal state lock and the condition variables that go with it
/// ([`StateSync`]), the write path's stripes, the overlay and the buffer
/// pool, lock-free hints between threads ([`Hints`]) and the abort flag
/// ([`AbortFlag`]).
pub struct Engine {
    /// Fixed for the volume's life.
    pub bs: usize,
    pub size_bytes: u64,
    pub max_txn_blocks: u64,
    pub read_only: bool,
    pub opts: OpenOptions,
    pub home: Home,
    pub log: Log,
    pub overlay: Overlay,
    /// Buffers of journaled writes (one copy per write, reused).
    pub pool: BufPool,
    stripes: Box<[CachePadded<Mutex<Stripe>>]>,
    /// Ids of pending direct writes in the overlay.
    pending_id: AtomicU64,
    /// Journaled writers registered in `Shard::waiting` (so a direct write
    /// looks there only when one is).
    order_waiters: AtomicUsize,
    /// Direct writes that found the store full: at most one log line per
    /// `direct::STORE_FULL_LOG_EVERY`.
    store_full_log: crate::ratelimit::RateLimit,
    /// Whether the home device (false) or the external journal's (true)
    /// shrank below the volume's end, as the file watch would find it now,
    /// with the watch's message (set by `Volume::watch_files`; see
    /// [`Engine::shrunk`]).
    pub(crate) shrink_probe: OnceLock<ShrinkProbe>,
    sync: StateSync,
    hints: Hints,
    abort: AbortFlag,
    pub stats: Leaf<StatsInner>,
    /// Test failpoint: the next commit panics in its I/O phase.
    #[cfg(test)]
    pub(crate) panic_next_commit: AtomicBool,
    /// Test failpoint: the next checkpoint round panics.
    #[cfg(test)]
    pub(crate) panic_next_checkpoint: AtomicBool,
}

/// The home area: where every block lives once checkpointed, and where
/// direct writes go.
pub struct Home {
    pub dev: Arc<dyn BlockDevice>,
    /// Coalesces concurrent flushes of `dev` (shared with the log when the
    /// journal is internal).
    pub flusher: Arc<FlushCoalescer>,
    /// Byte offset of home block 0 on `dev`.
    pub offset: u64,
    /// Excludes checkpoint writes (exclusive) from direct home writes
    /// (shared), so the two never have writes to one block in flight at once.
    lock: RwLock<()>,
    /// Direct home writes completed / covered by a finished home flush.
    /// Touched only by direct writes and flushes, never by journaled I/O.
    written_gen: AtomicU64,
    flushed_gen: AtomicU64,
    /// Bytes the checkpoint has written home so far (each write counted as
    /// it completes): how a close that waits for the checkpoint tells a
    /// slow store from a hung one, within a round (a round can be one
    /// whole transaction, minutes of writing on a slow store).
    pub checkpoint_written_bytes: AtomicU64,
    /// Large buffers of direct writes kept for reuse (a leaf lock, never
    /// held with another).
    direct_bufs: Leaf<Vec<AlignedBuf>>,
    /// The volume superblock (block 0 of `dev`) as the open stamped it,
    /// for the checkpoint's mark (`checkpoint_sequence`); `None` until
    /// [`Engine::record_checkpoints_in`], and for a read-only volume.
    superblock: Leaf<Option<crate::superblock::VolumeSuperblock>>,
}

/// The log area: the journal's device region and superblock, what a commit
/// needs to lay out a transaction, and the committed transactions waiting
/// for the checkpoint.
pub struct Log {
    pub region: JournalRegion,
    pub jsb: Leaf<JournalSuperblock>,
    /// What laying out a transaction needs of the journal superblock
    /// (block size, checksum seed, uuid): fixed for the volume's life.
    params: writer::LogParams,
    /// Transaction builders kept between commits (one per commit in
    /// flight at most): a commit allocates no log buffers or lists.
    builders: Leaf<Vec<writer::TxnBuilder>>,
    /// Published transactions, oldest first, until the checkpoint takes them.
    committed: Leaf<VecDeque<CommittedTxn>>,
    /// First log block after the journal superblock.
    first: u32,
}

/// The journal state lock and the condition variables its holders sleep on.
struct StateSync {
    st: Mutex<JState>,
    /// The commit thread sleeps here for a trigger (age, size, completions,
    /// drain).
    kick: Condvar,
    /// A batching leader waits here for more sync waiters to join.
    joined: Condvar,
    /// Waiters for transaction `t` sleep on `done[t % DONE_SLOTS]`: only the
    /// in-flight transactions and the running one can have waiters (at most
    /// `pipeline_depth + 1 <= DONE_SLOTS`), so a commit wakes only its own.
    done: [Condvar; DONE_SLOTS],
    /// Writers waiting for log space.
    space: Condvar,
    /// The checkpoint thread sleeps here.
    checkpoint_kick: Condvar,
}

/// Hints one thread leaves another without a lock: reading a stale value
/// costs a little speed, never correctness.
struct Hints {
    /// The log's `LogSpace::taken_permille`, refreshed whenever the state
    /// lock changes it: journaled writes pace themselves by it without
    /// taking that lock (`Engine::pace`).
    log_taken_permille: AtomicU32,
    /// Commits somebody waits for whose I/O is in progress (bulk reads
    /// hold back for them: `Engine::read_home_runs_yielding`).
    sync_commits_in_io: AtomicU32,
    /// When the last such commit started, in microseconds since `born`:
    /// while sync writers are active, bulk reads go out in pieces.
    last_sync_commit_us: AtomicU64,
    /// The engine's time base for `last_sync_commit_us`.
    born: Instant,
}

/// Whether the journal aborted, and why.
struct AbortFlag {
    /// Read on every write; written once, when the journal aborts.
    raised: AtomicBool,
    /// Why the journal aborted. A `OnceLock`, not a field of `JState`, so
    /// that a writer can report it while holding a stripe or shard lock.
    reason: OnceLock<AbortCause>,
    /// The journal failed (its device, or its file deleted or truncated)
    /// while the home device, as far as anything has shown, works: the
    /// checkpoint thread then salvages every committed transaction home
    /// from memory before it exits ([`Engine::salvage`]).
    journal_failed: AtomicBool,
    /// A home write or flush failed (or the checkpoint panicked): nothing
    /// is salvaged, the journal keeps what it holds.
    home_failed: AtomicBool,
}

/// The file watch's look at a device now: its message if it shrank.
pub(crate) type ShrinkProbe = Box<dyn Fn(bool) -> Option<String> + Send + Sync>;

/// Why the journal aborted: what every later request's error says.
#[derive(Clone, Debug)]
pub enum AbortCause {
    /// A write, flush or engine thread failed: what failed, and the errno
    /// of that failure (`EIO` if it had none). [`VolumeError::Aborted`].
    Failed(String, i32),
    /// The external journal file was deleted or truncated under the open
    /// volume (the journal watch): what happened and what the operator can
    /// do. [`VolumeError::JournalFileLost`].
    JournalFileLost(String),
}

impl AbortCause {
    fn text(&self) -> &str {
        match self {
            Self::Failed(why, _) | Self::JournalFileLost(why) => why,
        }
    }

    fn into_error(self) -> VolumeError {
        match self {
            Self::Failed(reason, cause_errno) => VolumeError::Aborted {
                reason,
                cause_errno,
            },
            Self::JournalFileLost(why) => VolumeError::JournalFileLost(why),
        }
    }
}

/// Most journal credits a journaled request of `n` blocks can pay: the
/// journal's own count of a transaction of `n` data blocks (blocks, their
/// descriptor blocks, a commit block) — one formula for both.
pub fn credits_for_blocks(n: u64, bs: usize) -> u64 {
    writer::transaction_blocks(bs, n as usize, 0) as u64
}

/// Credits a request of `n` blocks pays in a stripe that already added
/// `stripe.data_blocks` to the running transaction: the blocks, the
/// descriptor blocks the stripe's total newly needs, and — for the stripe's
/// first charge in the transaction — a commit block. Summed over stripes
/// this covers the transaction (`ceil(a/c) + ceil(b/c) >= ceil((a+b)/c)`),
/// while a stream of 4 KiB writes pays about one credit each instead of three.
fn stripe_charge(stripe: &Stripe, n: u64, bs: usize) -> u64 {
    let cap = DescriptorBlock::capacity(bs) as u64;
    let b = stripe.data_blocks;
    n + (b + n).div_ceil(cap) - b.div_ceil(cap) + u64::from(stripe.charged == 0)
}

impl Engine {
    /// Builds the engine after recovery. `next_sequence` is the first disk
    /// sequence to write; the log is empty and starts at `first`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        home: Arc<dyn BlockDevice>,
        home_flusher: Arc<FlushCoalescer>,
        data_offset: u64,
        size_bytes: u64,
        region: JournalRegion,
        jsb: JournalSuperblock,
        opts: OpenOptions,
        read_only: bool,
    ) -> Self {
        let bs = jsb.block_size as usize;
        // Usable log blocks, minus one so the log never fills completely
        // (a completely full circle would be indistinguishable from a wrap).
        let capacity = u64::from(jsb.max_len - jsb.first).saturating_sub(1);
        // jbd2 caps a transaction at a quarter of the journal so several can
        // be in the log at once; tiny (test) journals allow half.
        let max_txn_blocks = (capacity / 4).max((capacity / 2).min(16)).max(3);
        let first = jsb.first;
        let tid0: Tid = 1;
        let st = JState {
            j: Journal::new(
                first,
                jsb.max_len,
                jsb.sequence,
                tid0,
                opts.pipeline_depth.clamp(1, MAX_PIPELINE_DEPTH),
            ),
            running_created: Instant::now(),
            running_first_sync: None,
            cutting: false,
            last_cut_empty: false,
            want_commit: 0,
            sync_waiters: 0,
            running_waiters: 0,
            last_batch_waiters: 0,
            sync_peak: 0,
            sync_population: 0,
            last_published: Instant::now(),
            avg_commit_ns: 0,
            avg_batch_wait_ns: 0,
            batch_waits_skipped: 0,
            credits_since_cut: 0,
            space_waiters: 0,
            durable_cbs: Vec::new(),
            async_want: 0,
            cbs_due: Vec::new(),
            error: None,
            shutdown: false,
            checkpoint_shutdown: false,
            checkpoint_request: false,
            home_full: None,
            home_full_attempts: 0,
        };
        let stripes = (0..STRIPES)
            .map(|_| {
                CachePadded::new(Mutex::new(Stripe {
                    tid: tid0,
                    ..Default::default()
                }))
            })
            .collect();
        Self {
            bs,
            size_bytes,
            max_txn_blocks,
            read_only,
            opts,
            home: Home {
                dev: home,
                flusher: home_flusher,
                offset: data_offset,
                lock: RwLock::new(()),
                written_gen: AtomicU64::new(0),
                flushed_gen: AtomicU64::new(0),
                checkpoint_written_bytes: AtomicU64::new(0),
                direct_bufs: Leaf::new(Vec::new()),
                superblock: Leaf::new(None),
            },
            log: Log {
                region,
                params: writer::LogParams::of(&jsb),
                jsb: Leaf::new(jsb),
                builders: Leaf::new(Vec::new()),
                committed: Leaf::new(VecDeque::new()),
                first,
            },
            overlay: Overlay::new(),
            // Keeps up to a journal's worth (bounded at 64 MiB): the
            // buffers one checkpoint round frees are what the next writes
            // take.
            pool: BufPool::new(bs, 64 << 20),
            stripes,
            pending_id: AtomicU64::new(1),
            order_waiters: AtomicUsize::new(0),
            store_full_log: crate::ratelimit::RateLimit::new(direct::STORE_FULL_LOG_EVERY),
            shrink_probe: OnceLock::new(),
            sync: StateSync {
                st: Mutex::new(st),
                kick: Condvar::new(),
                joined: Condvar::new(),
                done: std::array::from_fn(|_| Condvar::new()),
                space: Condvar::new(),
                checkpoint_kick: Condvar::new(),
            },
            hints: Hints {
                log_taken_permille: AtomicU32::new(0),
                sync_commits_in_io: AtomicU32::new(0),
                last_sync_commit_us: AtomicU64::new(0),
                born: Instant::now(),
            },
            abort: AbortFlag {
                raised: AtomicBool::new(false),
                reason: OnceLock::new(),
                journal_failed: AtomicBool::new(false),
                home_failed: AtomicBool::new(false),
            },
            #[cfg(test)]
            panic_next_commit: AtomicBool::new(false),
            #[cfg(test)]
            panic_next_checkpoint: AtomicBool::new(false),
            stats: Leaf::new(StatsInner {
                started: Instant::now(),
                commits: 0,
                data_blocks: 0,
                log_blocks: 0,
                commit_latency_us: hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3)
                    .expect("static histogram bounds"),
                checkpoints: 0,
                checkpoint_blocks: 0,
                checkpoint_blocks_skipped: 0,
                direct_writes: 0,
                direct_writes_uncopied: 0,
                chained_commits: 0,
                log_space_waits: 0,
                revoke_order_waits: 0,
                paced_writes: 0,
                pace_sleep_us: 0,
                bulk_read_yields: 0,
                read_retries: 0,
                locked_reads: 0,
                salvaged_blocks: 0,
                salvage_uncommitted_blocks: 0,
                salvage_complete: false,
            }),
        }
    }

    /// Largest number of data blocks one journaled request may hold.
    /// The error of a request that touches `blocks` blocks, more than
    /// [`Engine::max_atomic_blocks`].
    pub fn too_large(&self, blocks: u64) -> VolumeError {
        let max_blocks = self.max_atomic_blocks();
        let bs = self.bs as u64;
        VolumeError::TooLarge {
            blocks,
            max_blocks,
            block_size: bs,
            max_bytes: max_blocks.saturating_sub(1).max(1) * bs,
        }
    }

    pub fn max_atomic_blocks(&self) -> u64 {
        let mut n = self.max_txn_blocks;
        while n > 0 && credits_for_blocks(n, self.bs) > self.max_txn_blocks {
            n -= 1;
        }
        n
    }

    /// The journal state lock (rank 1 in [`crate::lockorder`]).
    fn state(&self) -> Ranked<'_, JState> {
        Ranked::lock(&self.sync.st, Rank::State)
    }

    /// Refreshes `log_taken_permille` from the ledger (only pacing reads
    /// it: without pacing, no shared store on the write path).
    fn note_taken(&self, st: &JState) {
        if self.opts.write_pacing {
            self.hints
                .log_taken_permille
                .store(st.j.space.taken_permille(), Ordering::Relaxed);
        }
    }

    /// A stripe lock (rank 2).
    fn stripe(&self, i: usize) -> Ranked<'_, Stripe> {
        Ranked::lock(&self.stripes[i], Rank::Stripe)
    }

    fn home_offset(&self, lba: Lba) -> u64 {
        self.home.offset + lba * self.bs as u64
    }

    // ----- errors ---------------------------------------------------------

    pub fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(VolumeError::ReadOnly);
        }
        if self.abort.raised.load(Ordering::Acquire) {
            return Err(self.aborted_now());
        }
        Ok(())
    }

    /// Fails once the volume was aborted because its storage was taken from
    /// it: a home or journal request failed with `ESHUTDOWN`, which is how
    /// librbd answers a client another holder blocklisted when it broke
    /// the image's exclusive lock (`jbdev serve --break-lock`, or a plain
    /// open after this client's watch expired). The journal overlay and
    /// the page cache then hold what the new holder may have overwritten,
    /// so reads fail too (session 24's RBD pass read back data another
    /// server had since replaced). After any other abort, reads go on:
    /// nobody else writes the storage, and what is in memory is the newest
    /// data this volume acknowledged.
    ///
    /// A server paused, cut off or blocklisted learns that it lost its lock
    /// only from its next request to the storage, so before answering a
    /// read that arrived at `arrived`, the home device confirms it was
    /// still this client's at some instant since: a request sent since
    /// succeeded (the read's own, when it went to the device), or a probe
    /// ([`BlockDevice::confirm_ownership`]; only RBD sends anything). A
    /// probe refused with `ESHUTDOWN` aborts the volume as above; any other
    /// failure of it fails the read (nothing can say whether another
    /// holder took over). Called after the read's data was gathered, so
    /// that a read that went to the device needs no probe.
    pub fn check_readable(&self, arrived: std::time::Instant) -> Result<()> {
        self.check_not_taken_over()?;
        if let Err(e) = self.home.dev.confirm_ownership(arrived) {
            if e.errno() != libc::ESHUTDOWN {
                return Err(e.into());
            }
            self.home_write_failed(
                format!(
                    "the home device refused this client ({e}): another client took it over \
                     (an RBD image's exclusive lock broken, this client blocklisted), so \
                     nothing in this process's memory may be served any more"
                ),
                libc::ESHUTDOWN,
            );
            return Err(self.aborted_now());
        }
        Ok(())
    }

    /// [`Engine::check_readable`] for a caller that must not block: None
    /// when the home device would have to send an ownership probe.
    pub fn check_readable_now(&self, arrived: std::time::Instant) -> Option<Result<()>> {
        if let Err(e) = self.check_not_taken_over() {
            return Some(Err(e));
        }
        (!self.home.dev.ownership_probe_due(arrived)).then_some(Ok(()))
    }

    /// Fails once the volume was aborted with `ESHUTDOWN` (see
    /// [`Engine::check_readable`]).
    pub fn check_not_taken_over(&self) -> Result<()> {
        if self.abort.raised.load(Ordering::Acquire)
            && matches!(
                self.abort.reason.get(),
                Some(AbortCause::Failed(_, e)) if *e == libc::ESHUTDOWN
            )
        {
            return Err(self.aborted_now());
        }
        Ok(())
    }

    /// The error every request gets after an abort. Lock-free: the reason
    /// is set before `JState::error` and the flag (`record_abort`), so a
    /// caller that saw either finds it.
    fn aborted_now(&self) -> VolumeError {
        self.abort
            .reason
            .get()
            .cloned()
            .unwrap_or_else(|| AbortCause::Failed(String::new(), libc::EIO))
            .into_error()
    }

    /// IMPORTANT: the last check before acknowledging anything. After an
    /// abort nothing is acknowledged, even a request whose own I/O finished:
    /// the caller then treats it as "may or may not have happened", which is
    /// always true of a failed request.
    fn ack(&self) -> Result<()> {
        if self.abort.raised.load(Ordering::Acquire) {
            return Err(self.aborted_now());
        }
        Ok(())
    }

    /// Aborts the journal: every later write fails until the volume is reopened.
    /// `cause_errno` is the errno of the failure (`EIO` if it has none).
    pub fn abort(&self, why: String, cause_errno: i32) {
        self.abort_with(AbortCause::Failed(why, cause_errno));
    }

    /// [`Engine::abort`] for any [`AbortCause`].
    pub fn abort_with(&self, cause: AbortCause) {
        let mut st = self.state();
        self.record_abort(&mut st, cause);
        drop(self.run_due(st));
    }

    /// [`Engine::abort`] for a failure of the journal, not of the home
    /// device: what was committed is written home from memory before the
    /// checkpoint thread exits ([`Engine::salvage`]).
    pub fn abort_journal(&self, cause: AbortCause) {
        self.note_journal_failed();
        self.abort_with(cause);
    }

    /// [`Engine::abort`] for a failure of the home device (its file deleted
    /// or truncated under the open volume): no salvage after it.
    pub fn abort_home(&self, cause: AbortCause) {
        self.note_home_failed();
        self.abort_with(cause);
    }

    /// Records that the failure about to abort the volume is the journal's
    /// (before the abort is raised: [`Engine::salvage_due`] reads it after).
    fn note_journal_failed(&self) {
        self.abort.journal_failed.store(true, Ordering::Release);
    }

    /// Records that a home write or flush failed: no salvage after that.
    /// IMPORTANT: called before the abort it causes is recorded, and by a
    /// direct write while it still holds the home lock, so a salvage chunk
    /// (which holds that lock exclusively) never skips copies a failed
    /// direct write cancelled.
    fn note_home_failed(&self) {
        self.abort.home_failed.store(true, Ordering::Release);
    }

    /// A home write or flush failed: no salvage, and the volume aborts
    /// (once: a salvage's own failure after an abort is only logged).
    fn home_write_failed(&self, why: String, cause_errno: i32) {
        self.note_home_failed();
        if self.abort.raised.load(Ordering::Acquire) {
            tracing::error!("{why}");
        } else {
            self.abort(why, cause_errno);
        }
    }

    /// Whether the checkpoint thread should salvage committed transactions
    /// home: the journal failed and the home device has not.
    pub(crate) fn salvage_due(&self) -> bool {
        self.abort.raised.load(Ordering::Acquire)
            && self.abort.journal_failed.load(Ordering::Acquire)
            && !self.abort.home_failed.load(Ordering::Acquire)
    }

    /// The file watch's message if the home device (`journal` false) or the
    /// external journal's device shrank below the volume's end (None if
    /// not, or if it is no block device). A write that failed with ENOSPC
    /// asks: past the new end of a shrunk device it is no full store, and
    /// the watch, which looks every 250 ms, may not have seen it yet
    /// (session 33's verify pass: "free space on it" until it did).
    pub(crate) fn shrunk(&self, journal: bool) -> Option<String> {
        self.shrink_probe.get().and_then(|probe| probe(journal))
    }

    /// For a home write that failed with ENOSPC: if the home device
    /// shrank, aborts the volume with the watch's message and says so.
    pub(crate) fn abort_if_home_shrunk(&self) -> bool {
        let Some(msg) = self.shrunk(false) else {
            return false;
        };
        self.abort_home(AbortCause::JournalFileLost(msg));
        true
    }

    /// [`Engine::abort_with`] for a caller that holds the state lock:
    /// records the first reason, raises the flag and wakes every waiter.
    fn record_abort(&self, st: &mut JState, cause: AbortCause) {
        let cause = match cause {
            // A write past the end of a device that shrank, not a full
            // store (a journal write, or a home write on the same device).
            AbortCause::Failed(_, errno) if crate::error::is_no_space(errno) => {
                match self.shrunk(true).or_else(|| self.shrunk(false)) {
                    Some(msg) => AbortCause::JournalFileLost(msg),
                    None => cause,
                }
            }
            cause => cause,
        };
        match &cause {
            AbortCause::Failed(why, errno) if crate::error::is_no_space(*errno) => {
                // The one abort an operator can fix without a new device.
                tracing::error!(
                    "journal aborted: {why}. The backing store is full: free space on it, then \
                     reopen the volume (restart `jbdev serve`). Nothing acknowledged is lost: \
                     what did not reach its home is in the journal and the next open replays it."
                );
            }
            AbortCause::Failed(why, _) => tracing::error!("journal aborted: {why}"),
            // A whole sentence, with what to do.
            AbortCause::JournalFileLost(why) => tracing::error!("{why}"),
        }
        let why = cause.text().to_string();
        let _ = self.abort.reason.set(cause);
        if st.error.is_none() {
            st.error = Some(why);
        }
        self.abort.raised.store(true, Ordering::Release);
        st.j.fail();
        // Completions waiting for a commit fail (run by whoever releases
        // the state lock through `run_due`).
        st.sync_waiters -= st.durable_cbs.len() as u32;
        let failed = std::mem::take(&mut st.durable_cbs);
        st.cbs_due.extend(failed.into_iter().map(|(_, cb)| cb));
        self.sync.done.iter().for_each(|c| {
            c.notify_all();
        });
        // A batching leader sleeps here: it must not go on to commit and
        // acknowledge after the abort.
        self.sync.joined.notify_all();
        self.sync.space.notify_all();
        self.sync.kick.notify_all();
        self.sync.checkpoint_kick.notify_all();
    }

    // ----- shutdown -------------------------------------------------------

    /// Tells the commit thread to commit what is left and exit.
    pub fn stop_commit(&self) {
        let mut st = self.state();
        st.shutdown = true;
        self.sync.kick.notify_all();
    }

    /// Tells the checkpoint thread to checkpoint everything and exit.
    pub fn stop_checkpoint(&self) {
        let mut st = self.state();
        st.checkpoint_shutdown = true;
        self.sync.checkpoint_kick.notify_all();
    }

    /// After both threads exited cleanly: mark the journal clean — unless
    /// the checkpoint left transactions in it because the backing store is
    /// full: they stay, and the next open replays them.
    pub fn mark_clean(&self) -> Result<()> {
        let st = self.state();
        if st.error.is_some() {
            return Err(self.aborted_now());
        }
        let left = self.log.committed.lock().len();
        if left > 0 {
            let kept = format!(
                "{left} committed transactions stay in the journal and the next open replays them"
            );
            return Err(match &st.home_full {
                Some(f) => VolumeError::StoreFull {
                    reason: format!("{}; {kept}", f.reason),
                    closing: true,
                    cause_errno: f.errno,
                },
                None => VolumeError::Internal(format!("the checkpoint thread ended early; {kept}")),
            });
        }
        let next = st.j.space.next_sequence();
        drop(st);
        self.home.flusher.flush(self.home.dev.as_ref())?;
        let mut jsb = self.log.jsb.lock();
        jsb.start = 0;
        jsb.sequence = next;
        self.log.region.update_superblock(&jsb)?;
        self.log.region.flush()?;
        Ok(())
    }

    /// Snapshot of the journal state for stats.
    pub fn journal_state(&self) -> (u64, u64, Tid, Tid) {
        let st = self.state();
        (
            st.j.space.used(),
            st.j.space.capacity(),
            st.j.committed(),
            st.j.checkpointed_tid(),
        )
    }

    /// Device cache flushes issued (home, plus the journal's when external).
    pub fn device_flushes(&self) -> u64 {
        let home = self.home.flusher.flushes_issued();
        let journal = self.log.region.flusher();
        if Arc::ptr_eq(journal, &self.home.flusher) {
            home
        } else {
            home + journal.flushes_issued()
        }
    }

    /// Whether the checkpoint's last attempt found the store full, and how
    /// many attempts have since open.
    pub fn store_full(&self) -> (bool, u64) {
        let st = self.state();
        (st.home_full.is_some(), st.home_full_attempts)
    }

    /// Whether the journal aborted: every later write fails until the
    /// volume is reopened.
    pub fn aborted(&self) -> bool {
        self.abort.raised.load(Ordering::Acquire)
    }

    /// Transactions committed and waiting for checkpoint.
    pub fn committed_len(&self) -> usize {
        self.log.committed.lock().len()
    }

    pub fn avg_commit(&self) -> Duration {
        Duration::from_nanos(self.state().avg_commit_ns)
    }
}
