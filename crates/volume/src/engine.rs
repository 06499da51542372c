//! The journaling engine: joining transactions, group commit, checkpointing.
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
//!   had); otherwise until the transaction (aged from its first sync
//!   request) is as old as the average commit time (a running average, each
//!   new sample weighted 1/4), capped at `max_batch` — or until three
//!   quarters as many writers have joined as the previous commit served.
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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use crossbeam_utils::CachePadded;
use jbdev_device::{AlignedBuf, BlockDevice, FlushCoalescer, IoPriority, WriteReq};
use jbdev_journal::format::{DescriptorBlock, JournalSuperblock, RevokeBlock};
use jbdev_journal::space::{LogSpace, Placement, Ticket};
use jbdev_journal::writer::{self, LogBlock};
use jbdev_journal::JournalRegion;
use parking_lot::{Condvar, Mutex, RwLock};
use smallvec::SmallVec;

use crate::bufpool::{BufPool, WriteBuf};
use crate::lockorder::{Rank, Ranked};

use crate::overlay::{BlockRef, Lba, Overlay, Pending, Source, Tid, Version};
use crate::{BatchPolicy, CommitMode, OpenOptions, Result, VolumeError};

/// Shard guards a request holds, in ascending shard order.
type ShardGuards<'a> = SmallVec<[(usize, Ranked<'a, crate::overlay::Shard>); 8]>;

/// Runs `(first block index, count)` of a read that come from home.
type HomeRuns = SmallVec<[(usize, usize); 4]>;

/// Number of transaction-join stripes (power of two).
pub const STRIPES: usize = 32;

/// Blocks validated and written per checkpoint chunk (the home lock is
/// held for one chunk at a time, so direct writes wait at most that long).
const CHECKPOINT_CHUNK_BLOCKS: usize = 512;
/// Blocks per checkpoint round: the tail advances (and space is freed)
/// after every round instead of after the whole backlog.
const CHECKPOINT_ROUND_BLOCKS: usize = 4096;
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
}

/// How a cut transaction's I/O ended.
enum Finished {
    /// Nothing to write (an empty cut still takes its turn in order).
    Empty,
    Written(CommittedTxn, Duration),
    /// The journal was aborted with the error when the I/O failed.
    Failed,
}

/// The log layout of a cut transaction, fixed under the state lock so that
/// transactions in flight at once never overlap in the log.
struct Layout {
    sequence: u32,
    head: u32,
    /// An older transaction was in flight at the cut: write the body now
    /// but the commit block only once that one is published.
    chained: bool,
}

/// State shared by writers, the commit thread and the checkpoint thread.
struct JState {
    running_tid: Tid,
    running_created: Instant,
    /// When the first sync request for the running transaction arrived.
    running_first_sync: Option<Instant>,
    committed_tid: Tid,
    /// A leader is between deciding to commit the running transaction and
    /// cutting it (its batching wait): nobody else may start one.
    cutting: bool,
    /// Transactions cut and not yet published (their I/O runs, or they wait
    /// for an older one to be published first). At most `pipeline_depth`.
    in_flight: u32,
    /// Transactions whose I/O finished, waiting to be published in order.
    finished: BTreeMap<Tid, Finished>,
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
    credits_since_cut: u64,
    /// The log ring's ledger: placement and sequence of the next
    /// transaction, used / granted / free blocks, the space queue, how far
    /// the tail may move.
    log: LogSpace,
    space_waiters: u32,
    checkpointed_tid: Tid,
    error: Option<String>,
    shutdown: bool,
    checkpoint_shutdown: bool,
    checkpoint_request: bool,
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
    pub direct_writes: u64,
    /// Commits whose body overlapped an older commit in flight.
    pub chained_commits: u64,
    pub log_space_waits: u64,
}

/// One write operation of a journaled request, in bytes.
pub enum Op<'a> {
    Write { offset: u64, data: &'a [u8] },
    Zero { offset: u64, len: u64 },
}

impl Op<'_> {
    fn range(&self) -> (u64, u64) {
        match self {
            Op::Write { offset, data } => (*offset, *offset + data.len() as u64),
            Op::Zero { offset, len } => (*offset, *offset + *len),
        }
    }
}

/// The engine. Shared by the `Volume` handle and the background threads.
pub struct Engine {
    pub bs: usize,
    pub size_bytes: u64,
    pub home: Arc<dyn BlockDevice>,
    pub home_flusher: Arc<FlushCoalescer>,
    pub data_offset: u64,
    pub region: JournalRegion,
    pub jsb: Mutex<JournalSuperblock>,
    pub overlay: Overlay,
    /// Buffers of journaled writes (one copy per write, reused).
    pub pool: BufPool,
    stripes: Box<[CachePadded<Mutex<Stripe>>]>,
    st: Mutex<JState>,
    kick: Condvar,
    /// A batching leader waits here for more sync waiters to join.
    joined: Condvar,
    /// Waiters for transaction `t` sleep on `done[t % DONE_SLOTS]`: only the
    /// in-flight transactions and the running one can have waiters (at most
    /// `pipeline_depth + 1 <= DONE_SLOTS`), so a commit wakes only its own.
    done: [Condvar; DONE_SLOTS],
    pipeline_depth: u32,
    space: Condvar,
    checkpoint_kick: Condvar,
    committed: Mutex<VecDeque<CommittedTxn>>,
    /// Excludes checkpoint writes (exclusive) from direct home writes
    /// (shared), so the two never have writes to one block in flight at once.
    home_lock: RwLock<()>,
    /// Direct home writes completed / covered by a finished home flush.
    /// Touched only by direct writes and flushes, never by journaled I/O.
    home_written_gen: AtomicU64,
    home_flushed_gen: AtomicU64,
    /// Read on every write; written once, when the journal aborts.
    aborted: AtomicBool,
    /// Why the journal aborted. A `OnceLock`, not a field of `st`, so that a
    /// writer can report it while holding a stripe or shard lock.
    abort_reason: OnceLock<String>,
    pending_id: AtomicU64,
    pub opts: OpenOptions,
    pub max_txn_blocks: u64,
    pub read_only: bool,
    pub stats: Mutex<StatsInner>,
    first: u32,
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
            running_tid: tid0,
            running_created: Instant::now(),
            running_first_sync: None,
            committed_tid: tid0 - 1,
            cutting: false,
            in_flight: 0,
            finished: BTreeMap::new(),
            last_cut_empty: false,
            want_commit: 0,
            sync_waiters: 0,
            running_waiters: 0,
            last_batch_waiters: 0,
            sync_peak: 0,
            sync_population: 0,
            last_published: Instant::now(),
            avg_commit_ns: 0,
            credits_since_cut: 0,
            log: LogSpace::new(first, jsb.max_len, jsb.sequence),
            space_waiters: 0,
            checkpointed_tid: 0,
            error: None,
            shutdown: false,
            checkpoint_shutdown: false,
            checkpoint_request: false,
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
            home,
            home_flusher,
            data_offset,
            region,
            jsb: Mutex::new(jsb),
            overlay: Overlay::new(),
            // Keeps up to a journal's worth (bounded at 64 MiB): the
            // buffers one checkpoint round frees are what the next writes
            // take.
            pool: BufPool::new(bs, 64 << 20),
            stripes,
            st: Mutex::new(st),
            kick: Condvar::new(),
            joined: Condvar::new(),
            done: std::array::from_fn(|_| Condvar::new()),
            pipeline_depth: opts.pipeline_depth.clamp(1, MAX_PIPELINE_DEPTH),
            space: Condvar::new(),
            checkpoint_kick: Condvar::new(),
            committed: Mutex::new(VecDeque::new()),
            home_lock: RwLock::new(()),
            home_written_gen: AtomicU64::new(0),
            home_flushed_gen: AtomicU64::new(0),
            aborted: AtomicBool::new(false),
            abort_reason: OnceLock::new(),
            pending_id: AtomicU64::new(1),
            opts,
            max_txn_blocks,
            read_only,
            stats: Mutex::new(StatsInner {
                started: Instant::now(),
                commits: 0,
                data_blocks: 0,
                log_blocks: 0,
                commit_latency_us: hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3)
                    .expect("static histogram bounds"),
                checkpoints: 0,
                checkpoint_blocks: 0,
                direct_writes: 0,
                chained_commits: 0,
                log_space_waits: 0,
            }),
            first,
        }
    }

    /// Largest number of data blocks one journaled request may hold.
    pub fn max_atomic_blocks(&self) -> u64 {
        let mut n = self.max_txn_blocks;
        while n > 0 && credits_for_blocks(n, self.bs) > self.max_txn_blocks {
            n -= 1;
        }
        n
    }

    /// The journal state lock (rank 1 in [`crate::lockorder`]).
    fn state(&self) -> Ranked<'_, JState> {
        Ranked::lock(&self.st, Rank::State)
    }

    /// A stripe lock (rank 2).
    fn stripe(&self, i: usize) -> Ranked<'_, Stripe> {
        Ranked::lock(&self.stripes[i], Rank::Stripe)
    }

    fn home_offset(&self, lba: Lba) -> u64 {
        self.data_offset + lba * self.bs as u64
    }

    // ----- errors ---------------------------------------------------------

    pub fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(VolumeError::ReadOnly);
        }
        if self.aborted.load(Ordering::Acquire) {
            return Err(self.aborted_now());
        }
        Ok(())
    }

    /// The error every request gets after an abort. Lock-free.
    fn aborted_now(&self) -> VolumeError {
        VolumeError::Aborted(self.abort_reason.get().cloned().unwrap_or_default())
    }

    /// IMPORTANT: the last check before acknowledging anything. After an
    /// abort nothing is acknowledged, even a request whose own I/O finished:
    /// the caller then treats it as "may or may not have happened", which is
    /// always true of a failed request.
    fn ack(&self) -> Result<()> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(self.aborted_now());
        }
        Ok(())
    }

    /// Aborts the journal: every later write fails until the volume is reopened.
    pub fn abort(&self, why: String) {
        let mut st = self.state();
        self.record_abort(&mut st, why);
    }

    /// [`Engine::abort`] for a caller that holds the state lock: records
    /// the first reason, raises the flag and wakes every waiter.
    fn record_abort(&self, st: &mut JState, why: String) {
        tracing::error!("journal aborted: {why}");
        let _ = self.abort_reason.set(why.clone());
        if st.error.is_none() {
            st.error = Some(why);
        }
        self.aborted.store(true, Ordering::Release);
        self.done.iter().for_each(|c| {
            c.notify_all();
        });
        // A batching leader sleeps here: it must not go on to commit and
        // acknowledge after the abort.
        self.joined.notify_all();
        self.space.notify_all();
        self.kick.notify_all();
        self.checkpoint_kick.notify_all();
    }

    fn aborted_error(st: &JState) -> VolumeError {
        VolumeError::Aborted(st.error.clone().unwrap_or_default())
    }

    // ----- reads ----------------------------------------------------------

    /// Reads whole blocks `[lba, lba + n)` into `out` (n * bs bytes).
    ///
    /// The view is consistent: every journaled write overlapping the range
    /// is seen whole or not at all. Blocks are resolved under all the
    /// range's shard locks at once (a journaled write publishes all its
    /// blocks under its shard locks). Blocks whose newest copy is home are
    /// read after the locks are dropped, then the shard versions are checked
    /// again: any publish, checkpoint completion or direct write in the
    /// range bumps them, and the read is retried — otherwise a checkpoint
    /// could put one block of a write home before we read it and another
    /// after. After [`READ_OPTIMISTIC_TRIES`] tries the home reads are done
    /// under the shard locks, so a read always finishes.
    pub fn read_blocks(&self, lba: Lba, out: &mut [u8]) -> Result<()> {
        let n = out.len() / self.bs;
        let shard_ids = Overlay::shards_for_range(lba, lba + n as u64);
        let mut home_runs: HomeRuns = SmallVec::new();
        for attempt in 0.. {
            let locked = attempt >= READ_OPTIMISTIC_TRIES;
            home_runs.clear();
            let guards: ShardGuards<'_> = shard_ids
                .iter()
                .map(|&s| (s, self.overlay.lock(s)))
                .collect();
            self.resolve_blocks(lba, out, &guards, &mut home_runs);
            if home_runs.is_empty() {
                return Ok(());
            }
            if locked {
                self.read_home_runs(lba, out, &home_runs)?;
                return Ok(());
            }
            let versions: SmallVec<[u64; 8]> = guards.iter().map(|(_, g)| g.version).collect();
            drop(guards);
            self.read_home_runs(lba, out, &home_runs)?;
            let unchanged = shard_ids
                .iter()
                .zip(&versions)
                .all(|(&s, &v)| self.overlay.lock(s).version == v);
            if unchanged {
                return Ok(());
            }
        }
        unreachable!("the locked attempt always returns")
    }

    /// Copies every block of `[lba, ..)` that has a newer copy than home
    /// into `out`; lists the runs that must come from home.
    fn resolve_blocks(
        &self,
        lba: Lba,
        out: &mut [u8],
        guards: &[(usize, Ranked<'_, crate::overlay::Shard>)],
        home_runs: &mut HomeRuns,
    ) {
        let bs = self.bs;
        for i in 0..out.len() / bs {
            let b = lba + i as u64;
            let gi = guards
                .binary_search_by_key(&Overlay::shard_of(b), |(s, _)| *s)
                .expect("shard locked");
            let dst = &mut out[i * bs..(i + 1) * bs];
            match guards[gi].1.source(b, bs) {
                Source::Journaled(r) => dst.copy_from_slice(r.bytes(bs)),
                Source::Pending(buf, off) => dst.copy_from_slice(&buf[off..off + bs]),
                Source::Zero => dst.fill(0),
                Source::Home => match home_runs.last_mut() {
                    Some((s, len)) if *s + *len == i => *len += 1,
                    _ => home_runs.push((i, 1)),
                },
            }
        }
    }

    fn read_home_runs(&self, lba: Lba, out: &mut [u8], runs: &[(usize, usize)]) -> Result<()> {
        let bs = self.bs;
        for &(s, len) in runs {
            self.home.read_at(
                &mut out[s * bs..(s + len) * bs],
                self.home_offset(lba + s as u64),
            )?;
        }
        Ok(())
    }

    // ----- journaled writes -----------------------------------------------

    /// Applies `ops` atomically through the journal; with `fua`, returns only
    /// once they are durable. Ops are applied in order (later ones win).
    pub fn journaled(&self, ops: &[Op<'_>], fua: bool) -> Result<()> {
        self.check_writable()?;
        let bs = self.bs as u64;
        // Blocks touched, with the byte coverage of each piece, sorted by
        // block then start: small requests stay in inline storage (no heap
        // allocation per write for the bookkeeping).
        let mut touched: SmallVec<[(Lba, usize, usize); 8]> = SmallVec::new();
        for op in ops {
            let (s, e) = op.range();
            if s == e {
                continue;
            }
            for b in s / bs..e.div_ceil(bs) {
                let bstart = b * bs;
                let lo = s.max(bstart) - bstart;
                let hi = e.min(bstart + bs) - bstart;
                touched.push((b, lo as usize, hi as usize));
            }
        }
        if touched.is_empty() {
            if fua {
                return self.flush();
            }
            return Ok(());
        }
        touched.sort_unstable();
        // Distinct blocks (ascending), and whether each is only partly written.
        let mut lbas: SmallVec<[Lba; 8]> = SmallVec::new();
        let mut partial: SmallVec<[bool; 8]> = SmallVec::new();
        for group in touched.chunk_by(|a, b| a.0 == b.0) {
            lbas.push(group[0].0);
            partial.push(!covers_block(group, self.bs));
        }
        let n = lbas.len() as u64;
        if credits_for_blocks(n, self.bs) > self.max_txn_blocks {
            return Err(VolumeError::TooLarge {
                len: n * bs,
                max: self.max_atomic_blocks() * bs,
            });
        }
        let shard_ids = Overlay::shards_for_blocks(lbas.iter().copied());
        let stripe_idx = my_stripe();
        let mut conflicts = 0u32;
        // One copy per write: the data goes once into a pooled buffer. The
        // buffer is taken before the loop, so a write that waits for log
        // space keeps it (and its copied data) across retries. Blocks the
        // request covers whole are filled now, outside any lock; partial
        // blocks get their base under the shard locks, then the request's
        // bytes on top.
        let mut buf = self.pool.take(lbas.len());
        apply_ops(&mut buf, ops, &lbas, self.bs, |i| !partial[i]);
        loop {
            // Phase 1, no locks held across I/O: read home content of partial
            // blocks that have no newer copy, remembering the shard version.
            let mut pre_read: SmallVec<[(usize, u64); 4]> = SmallVec::new();
            for (i, &b) in lbas.iter().enumerate() {
                if !partial[i] {
                    continue;
                }
                let (is_home, version) = {
                    let sh = self.overlay.lock_block(b);
                    (matches!(sh.source(b, self.bs), Source::Home), sh.version)
                };
                if is_home {
                    self.home.read_at(buf.block_mut(i), self.home_offset(b))?;
                    pre_read.push((i, version));
                }
            }
            // Credits.
            {
                let (have, need) = {
                    let s = self.stripe(stripe_idx);
                    (s.credits, stripe_charge(&s, n, self.bs))
                };
                if have < need {
                    self.reserve(stripe_idx, need - have)?;
                    continue;
                }
            }
            let mut stripe = self.stripe(stripe_idx);
            let charge = stripe_charge(&stripe, n, self.bs);
            if stripe.credits < charge {
                continue;
            }
            self.check_writable()?;
            let mut guards: ShardGuards<'_> = shard_ids
                .iter()
                .map(|&s| (s, self.overlay.lock(s)))
                .collect();
            let guard_of = |g: &ShardGuards<'_>, b: Lba| {
                g.binary_search_by_key(&Overlay::shard_of(b), |(s, _)| *s)
                    .expect("shard locked")
            };
            // Phase 2: validate and fill in the bases of partial blocks.
            let mut conflict = false;
            for (i, &b) in lbas.iter().enumerate() {
                if !partial[i] {
                    continue;
                }
                let gi = guard_of(&guards, b);
                let sh = &guards[gi].1;
                let dst = buf.block_mut(i);
                match sh.source(b, self.bs) {
                    Source::Journaled(r) => dst.copy_from_slice(r.bytes(self.bs)),
                    Source::Pending(p, off) => dst.copy_from_slice(&p[off..off + self.bs]),
                    Source::Zero => dst.fill(0),
                    Source::Home => {
                        let pre = pre_read.iter().find(|(pi, _)| *pi == i);
                        match pre {
                            Some(&(_, v)) if v == sh.version => {}
                            // Writers elsewhere in the shard keep changing
                            // its version: read home under the lock, where
                            // nothing can change it (progress guaranteed).
                            _ if conflicts >= READ_OPTIMISTIC_TRIES => {
                                self.home.read_at(dst, self.home_offset(b))?;
                            }
                            _ => {
                                conflict = true;
                                break;
                            }
                        }
                    }
                }
            }
            if conflict {
                conflicts += 1;
                drop(guards);
                drop(stripe);
                continue;
            }
            // Phase 3: the request's bytes over the bases of partial blocks.
            apply_ops(&mut buf, ops, &lbas, self.bs, |i| partial[i]);
            // Phase 4: publish.
            let (chunks, per) = buf.share();
            let tid = stripe.tid;
            for (i, &b) in lbas.iter().enumerate() {
                let gi = guard_of(&guards, b);
                let sh = &mut guards[gi].1;
                let ver = sh.bump();
                let data = BlockRef {
                    buf: chunks[i / per].clone(),
                    offset: (i % per) * self.bs,
                };
                sh.map.entry(b).or_default().newest = Some(Version {
                    ver,
                    data: data.clone(),
                });
                stripe.blocks.push((b, ver, data));
            }
            stripe.credits -= charge;
            stripe.charged += charge;
            stripe.data_blocks += n;
            drop(guards);
            drop(stripe);
            if fua {
                self.wait_commit(tid)?;
            }
            return self.ack();
        }
    }

    /// Moves at least `need` journal blocks of credit to a stripe, waiting
    /// for checkpoints if the journal is full.
    ///
    /// Writers that find the journal full are served in arrival order (a
    /// ticket queue): a large write keeps its place, and writes that arrive
    /// later may take free space only if what they take leaves enough for
    /// every queued writer (`space_wanted`) — so they cannot starve it, and
    /// the queue forms only when the journal is really full (no convoy).
    fn reserve(&self, stripe_idx: usize, need: u64) -> Result<()> {
        let mut st = self.state();
        let mut ticket: Option<Ticket> = None;
        // A small stock so the next writes of this stripe need not come
        // here; bounded so stripes cannot hoard the journal.
        let max_extra = (st.log.capacity() / (8 * STRIPES as u64)).min(64);
        loop {
            let failed = if st.error.is_some() {
                Some(Self::aborted_error(&st))
            } else if st.shutdown {
                Some(VolumeError::Closed)
            } else {
                None
            };
            if let Some(e) = failed {
                if ticket.is_some() {
                    st.log.abandon(need);
                    self.space.notify_all();
                }
                return Err(e);
            }
            if let Some(grant) = st.log.try_grant(ticket, need, max_extra) {
                if ticket.is_some() {
                    // The next in the queue may be served now.
                    self.space.notify_all();
                }
                st.credits_since_cut += grant;
                if st.credits_since_cut >= self.max_txn_blocks / 2 {
                    self.kick.notify_one();
                }
                drop(st);
                self.stripe(stripe_idx).credits += grant;
                return Ok(());
            }
            if ticket.is_none() {
                ticket = Some(st.log.enqueue(need));
                self.stats.lock().log_space_waits += 1;
            }
            // Out of space: get the checkpoint going urgently, and commit
            // the running transaction (leading the commit ourselves if none
            // is in progress) so its blocks can be checkpointed too and the
            // stripes' unspent credits come back.
            st.space_waiters += 1;
            st.checkpoint_request = true;
            self.checkpoint_kick.notify_one();
            if self.can_lead(&st) {
                st = self.commit_once(st, false);
            }
            let ready = ticket.is_some_and(|t| st.log.is_head(t)) && st.log.free() >= need;
            if !ready && st.error.is_none() && !st.shutdown {
                self.space.wait_for(st.inner(), Duration::from_millis(100));
            }
            st.space_waiters -= 1;
        }
    }

    /// Whether a new commit may start now: nobody is cutting, fewer than
    /// `pipeline_depth` commits are in flight, no error, not shut down.
    fn can_lead(&self, st: &JState) -> bool {
        !st.cutting && st.in_flight < self.pipeline_depth && st.error.is_none() && !st.shutdown
    }

    fn slot(tid: Tid) -> usize {
        (tid % DONE_SLOTS as u64) as usize
    }

    /// Waits until transaction `tid` is committed (durable).
    ///
    /// Leader/follower group commit: if a commit may start (nobody cutting,
    /// fewer than `pipeline_depth` in flight), the caller becomes the leader
    /// and commits the running transaction itself (after the batching wait),
    /// so a lone syncing writer pays no thread hand-off. Otherwise it
    /// follows: it sleeps until the commit covering `tid` is published, or
    /// until a leader hands it the lead.
    pub fn wait_commit(&self, tid: Tid) -> Result<()> {
        let mut st = self.state();
        if st.error.is_some() {
            return Err(Self::aborted_error(&st));
        }
        if st.committed_tid >= tid {
            return Ok(());
        }
        st.sync_waiters += 1;
        if st.want_commit < tid {
            st.want_commit = tid;
        }
        st.sync_peak = st.sync_peak.max(st.sync_waiters);
        if tid == st.running_tid {
            st.running_waiters += 1;
        }
        if tid == st.running_tid && st.running_first_sync.is_none() {
            st.running_first_sync = Some(Instant::now());
        }
        // Wake a batching leader only when its batch is complete (its exit
        // condition); a wake-up per arrival costs a context switch each, which
        // on a small machine eats the time batching was meant to save.
        if st.running_waiters >= Self::batch_target(&st) {
            self.joined.notify_one();
        }
        while st.committed_tid < tid && st.error.is_none() {
            if tid == st.running_tid && self.can_lead(&st) {
                st = self.commit_once(st, true);
                continue;
            }
            self.done[Self::slot(tid)].wait(st.inner());
        }
        st.sync_waiters -= 1;
        if st.committed_tid >= tid && st.error.is_none() {
            Ok(())
        } else {
            Err(Self::aborted_error(&st))
        }
    }

    /// Makes every write that returned before this call durable.
    pub fn flush(&self) -> Result<()> {
        self.check_writable()?;
        let tid = self.state().running_tid;
        self.wait_commit(tid)?;
        // Direct writes bypass the journal: flush the home device if any
        // completed that no finished flush covers. (A flag cleared by one
        // flusher would let a second one return before the first's device
        // flush finished.)
        let written = self.home_written_gen.load(Ordering::Acquire);
        if written > self.home_flushed_gen.load(Ordering::Acquire) {
            if let Err(e) = self.home_flusher.flush(self.home.as_ref()) {
                self.abort(format!("flush of the home device failed: {e}"));
                return Err(e.into());
            }
            self.home_flushed_gen.fetch_max(written, Ordering::AcqRel);
        }
        self.ack()
    }

    // ----- direct home writes ---------------------------------------------

    /// Writes whole blocks `[start, end)` straight to their home location
    /// (`data` = None writes zeroes), with revoke records for any journaled
    /// copies so replay can never resurrect them.
    ///
    /// Order, and why:
    /// 1. Under the home lock (shared) and each shard lock: register the
    ///    write as pending (reads and read-modify-writes see the new data at
    ///    once) and set `cancel_below` on journaled copies, so the checkpoint
    ///    never writes an older copy over the new data. The checkpoint skips
    ///    such copies only while holding the home lock exclusively, so it
    ///    either wrote them before step 1 or runs after step 2 completed —
    ///    and then its home flush, which precedes its tail update, covers
    ///    this write.
    /// 2. The home I/O.
    /// 3. Only now add revoke records to the running transaction. A commit
    ///    carrying revokes flushes the home device before writing its blocks,
    ///    so a revoke can never be durable while the data it protects is not.
    ///    No revoke is added for a block that already has a journaled copy
    ///    newer than this write: replay must not cancel that copy, and it
    ///    supersedes older ones anyway.
    pub fn direct(&self, start: Lba, end: Lba, data: Option<AlignedBuf>, fua: bool) -> Result<()> {
        self.check_writable()?;
        if start >= end {
            return Ok(());
        }
        let data = data.map(Arc::new);
        let id = self.pending_id.fetch_add(1, Ordering::Relaxed);
        let bound = (end - start).min(self.region.len_blocks() as u64 * 2);
        let charge = bound.div_ceil(RevokeBlock::capacity(self.bs) as u64) + 1;
        let stripe_idx = my_stripe();
        let shard_ids = Overlay::shards_for_range(start, end);
        let in_range = |sh: &crate::overlay::Shard, s: usize| -> Vec<Lba> {
            if end - start < 8192 {
                (start..end)
                    .filter(|&b| Overlay::shard_of(b) == s && sh.map.contains_key(&b))
                    .collect()
            } else {
                sh.map
                    .keys()
                    .copied()
                    .filter(|&b| start <= b && b < end)
                    .collect()
            }
        };
        // Step 1.
        let home_guard = self.home_lock.read();
        let mut shard_versions: Vec<(usize, u64)> = Vec::with_capacity(shard_ids.len());
        for &s in &shard_ids {
            let mut sh = self.overlay.lock(s);
            let rv = sh.bump();
            sh.pending.push(Pending {
                id,
                start,
                end,
                ver: rv,
                data: data.clone(),
            });
            for b in in_range(&sh, s) {
                let e = sh.map.get_mut(&b).expect("entry present");
                e.cancel_below = e.cancel_below.max(rv);
            }
            shard_versions.push((s, rv));
        }
        // Step 2.
        let res = match &data {
            Some(buf) => self
                .home
                .write_at(buf, self.home_offset(start), IoPriority::Urgent),
            None => self
                .home
                .write_zeroes(self.home_offset(start), (end - start) * self.bs as u64),
        };
        if let Err(e) = res {
            // IMPORTANT: abort while still holding the home lock. Step 1 told
            // the checkpoint to skip the journaled copies this write
            // supersedes; the write failed, so those copies are the only good
            // data. The checkpoint validates under the home lock (exclusive)
            // and stops once aborted, so it can never skip them and then move
            // the tail past them (found by the simulator: a durable FUA write
            // read back as the initial content after such a failure).
            self.abort(format!("direct write to the home location failed: {e}"));
            drop(home_guard);
            for &(s, _) in &shard_versions {
                let mut sh = self.overlay.lock(s);
                sh.pending.retain(|p| p.id != id);
                sh.bump();
            }
            return Err(e.into());
        }
        drop(home_guard);
        // Step 3 (credits first: waiting for space needs no lock of ours).
        loop {
            let have = self.stripe(stripe_idx).credits;
            if have < charge {
                if let Err(e) = self.reserve(stripe_idx, charge - have) {
                    for &(s, _) in &shard_versions {
                        self.overlay.lock(s).pending.retain(|p| p.id != id);
                    }
                    return Err(e);
                }
                continue;
            }
            let mut stripe = self.stripe(stripe_idx);
            if stripe.credits < charge {
                continue;
            }
            let tid = stripe.tid;
            for &(s, rv) in &shard_versions {
                let mut sh = self.overlay.lock(s);
                sh.pending.retain(|p| p.id != id);
                for b in in_range(&sh, s) {
                    let e = sh.map.get_mut(&b).expect("entry present");
                    match &e.newest {
                        Some(v) if v.ver > rv => continue,
                        Some(_) => e.newest = None,
                        None => {}
                    }
                    e.tomb_tid = Some(tid);
                    stripe.revokes.push((b, rv));
                }
                sh.bump();
            }
            stripe.credits -= charge;
            stripe.charged += charge;
            break;
        }
        self.stats.lock().direct_writes += 1;
        self.home_written_gen.fetch_add(1, Ordering::AcqRel);
        if fua {
            self.flush()?;
        }
        self.ack()
    }

    // ----- commit thread --------------------------------------------------

    /// Locks every stripe, takes what they hold and starts transaction `tid + 1`.
    fn cut(&self, tid: Tid) -> Cut {
        let mut guards: Vec<_> = (0..STRIPES).map(|i| self.stripe(i)).collect();
        let (mut blocks, mut revokes, mut charged, mut unspent) = (Vec::new(), Vec::new(), 0, 0);
        for g in guards.iter_mut() {
            debug_assert_eq!(g.tid, tid);
            blocks.append(&mut g.blocks);
            revokes.append(&mut g.revokes);
            charged += g.charged;
            unspent += g.credits;
            g.charged = 0;
            g.credits = 0;
            g.data_blocks = 0;
            g.tid = tid + 1;
        }
        (blocks, revokes, charged, unspent)
    }

    /// How many sync waiters make a batch complete for the adaptive
    /// policy: three quarters of the writers syncing in all (waiting for the
    /// last stragglers costs more than they add), at least two.
    ///
    /// "In all" is the most waiters present at once since the previous cut,
    /// not the previous batch: with one commit in flight, the writers split
    /// into the cohort it will release and the cohort waiting for the next
    /// one, and a target of 3/4 of the previous batch is met by the waiting
    /// cohort alone — the two halves then alternate forever, each commit
    /// carrying half the writers (measured on the slow backing: 16.5 blocks
    /// per commit at 32 writers). Counting both makes the leader wait,
    /// within the window, for the released cohort to come back.
    fn batch_target(st: &JState) -> u32 {
        (st.sync_population * 3).div_ceil(4).max(2)
    }

    fn batch_deadline(&self, st: &JState) -> Option<Instant> {
        let multi = st.sync_waiters > 1 || st.last_batch_waiters > 1;
        match self.opts.batch_policy {
            BatchPolicy::None => None,
            BatchPolicy::Fixed(d) if multi => Some(Instant::now() + d),
            BatchPolicy::Fixed(_) => None,
            BatchPolicy::Adaptive if multi => {
                let wait = Duration::from_nanos(st.avg_commit_ns).min(self.opts.max_batch);
                // From the later of the first sync request and the previous
                // commit's end: the writers that commit released can only
                // rejoin after it, so a window that started before it
                // (the waiting cohort joined long ago) would never wait
                // for them.
                let since = st
                    .running_first_sync
                    .unwrap_or_else(Instant::now)
                    .max(st.last_published);
                Some(since + wait)
            }
            BatchPolicy::Adaptive => None,
        }
    }

    /// The background committer: commits transactions nobody waits for
    /// (age or size trigger), and drains at shutdown. Sync requests are
    /// committed by their own leaders (see [`Engine::wait_commit`]).
    pub fn commit_thread(self: &Arc<Self>) {
        let mut st = self.state();
        loop {
            if st.error.is_some() && st.shutdown {
                return;
            }
            let timed = st.running_created.elapsed() >= self.opts.commit_interval;
            let sized = st.credits_since_cut >= self.max_txn_blocks / 2;
            // A sync request nobody leads (a leader that hit shutdown).
            let orphan = st.want_commit >= st.running_tid && st.shutdown;
            let drain = st.shutdown;
            if !(self.can_lead(&st) || (drain && !st.cutting && st.in_flight < self.pipeline_depth))
                || st.error.is_some()
                || !(timed || sized || drain || orphan)
            {
                let deadline = st.running_created + self.opts.commit_interval;
                self.kick.wait_until(st.inner(), deadline);
                continue;
            }
            let tid = st.running_tid;
            st = self.commit_once(st, false);
            if drain && st.committed_tid >= tid && st.last_cut_empty {
                return;
            }
        }
    }

    /// Commits the running transaction. The caller holds the state lock and
    /// [`Engine::can_lead`] allowed it (or the commit thread drains at
    /// shutdown); the lock is released for the batching wait and the I/O and
    /// held again on return.
    ///
    /// Phases: (1) batching wait, sync commits only; (2) under the state lock
    /// and all stripe locks: cut, resolve revokes against blocks, and fix the
    /// transaction's log position and disk sequence (so transactions in
    /// flight at once never overlap in the log), then hand the lead to a
    /// waiter of the next transaction — its commit may run while ours
    /// writes; (3) build and write, no lock held; (4) record the outcome and
    /// publish every transaction whose predecessors are all published:
    /// commits are acknowledged strictly in order, so a transaction is never
    /// reported durable while an older one might still be lost.
    fn commit_once<'a>(&'a self, mut st: Ranked<'a, JState>, sync: bool) -> Ranked<'a, JState> {
        assert!(!st.cutting, "two leaders cutting at once");
        // IMPORTANT: after a failed commit no later transaction may be
        // committed: `committed_tid` would pass the failed one and its
        // waiters would be told their data is durable.
        if st.error.is_some() {
            return st;
        }
        st.cutting = true;
        // Phase 1.
        if sync && !st.shutdown {
            if let Some(deadline) = self.batch_deadline(&st) {
                let adaptive = self.opts.batch_policy == BatchPolicy::Adaptive;
                while Instant::now() < deadline
                    && !(adaptive && st.running_waiters >= Self::batch_target(&st))
                    && !st.shutdown
                    && st.error.is_none()
                {
                    self.joined.wait_until(st.inner(), deadline);
                }
            }
        }
        // IMPORTANT: the journal may have aborted during the wait (abort
        // wakes `joined`); committing now could acknowledge FUA writers.
        if st.error.is_some() {
            st.cutting = false;
            self.wake_all_waiters();
            return st;
        }
        // Phase 2.
        let tid = st.running_tid;
        let waiters = st.running_waiters;
        st.running_waiters = 0;
        st.sync_population = st.sync_peak;
        st.sync_peak = st.sync_waiters;
        let started = Instant::now();
        let (blocks, revokes, charged, unspent) = self.cut(tid);
        st.log.give_back(unspent);
        st.running_tid = tid + 1;
        st.running_created = started;
        st.running_first_sync = None;
        st.credits_since_cut = 0;
        let empty = blocks.is_empty() && revokes.is_empty();
        st.last_cut_empty = empty;
        st.cutting = false;
        st.in_flight += 1;
        let planned = (!empty).then(|| {
            let (newest, revoke_list) = resolve(blocks, revokes);
            let k = writer::transaction_blocks(self.bs, newest.len(), revoke_list.len());
            let at = st.log.lay_out(tid, k);
            let layout = Layout {
                sequence: at.sequence,
                head: at.head,
                chained: st.in_flight > 1,
            };
            (newest, revoke_list, layout)
        });
        if waiters > 0 {
            st.last_batch_waiters = waiters;
        }
        // Hand the lead: a waiter of the next transaction may start its
        // commit now, while ours is written (pipelining).
        if st.want_commit >= st.running_tid && self.can_lead(&st) {
            self.done[Self::slot(st.running_tid)].notify_one();
        }
        let outcome = match planned {
            None => {
                // No block was written: the cut's credits return at once.
                st.log.give_back(charged);
                Finished::Empty
            }
            Some((newest, revoke_list, layout)) => {
                drop(st);
                // Phase 3.
                let res = self.write_commit(tid, &layout, newest, revoke_list, charged);
                st = self.state();
                match res {
                    Ok(txn) => Finished::Written(txn, started.elapsed()),
                    Err(e) => {
                        // IMPORTANT: recorded under the same lock hold that
                        // ends the commit, before anything could publish past it.
                        self.record_abort(&mut st, format!("journal commit failed: {e}"));
                        Finished::Failed
                    }
                }
            }
        };
        // Phase 4.
        st.finished.insert(tid, outcome);
        self.publish_ready(&mut st);
        st
    }

    /// Publishes, in tid order, every finished transaction whose
    /// predecessors are all published: `committed_tid`, log space, the
    /// checkpoint queue, statistics; wakes their waiters.
    fn publish_ready(&self, st: &mut JState) {
        while let Some(outcome) = st.finished.remove(&(st.committed_tid + 1)) {
            let tid = st.committed_tid + 1;
            if st.error.is_some() {
                // Nothing is published after an error; drop what is left.
                st.finished.clear();
                break;
            }
            st.in_flight -= 1;
            match outcome {
                Finished::Empty => st.committed_tid = tid,
                Finished::Written(txn, elapsed) => {
                    let ns = elapsed.as_nanos().min(u64::MAX as u128) as u64;
                    st.avg_commit_ns = if st.avg_commit_ns == 0 {
                        ns
                    } else {
                        (st.avg_commit_ns * 3 + ns) / 4
                    };
                    st.committed_tid = tid;
                    st.last_published = Instant::now();
                    st.log.publish(tid, txn.log_blocks, txn.charged);
                    {
                        let mut s = self.stats.lock();
                        s.commits += 1;
                        s.data_blocks += txn.blocks.len() as u64;
                        s.log_blocks += txn.log_blocks;
                        let _ = s
                            .commit_latency_us
                            .record((elapsed.as_micros() as u64).max(1));
                    }
                    self.committed.lock().push_back(txn);
                    if st.log.fill_at_least(1, 4) {
                        self.checkpoint_kick.notify_one();
                    }
                }
                Finished::Failed => unreachable!("a failure sets the error first"),
            }
            self.done[Self::slot(tid)].notify_all();
        }
        if st.error.is_some() {
            st.in_flight = 0;
            self.wake_all_waiters();
            return;
        }
        // Hand the lead to one waiter of the running transaction, if any.
        if st.want_commit >= st.running_tid && self.can_lead(st) {
            self.done[Self::slot(st.running_tid)].notify_one();
        }
        // The commit thread only has work here if a size trigger or the
        // drain was held back by the commit in flight (its age trigger is a
        // timed wait). Waking it after every commit cost a context switch
        // per commit: 14% of the CPU of a lone syncing writer.
        if st.credits_since_cut >= self.max_txn_blocks / 2 || st.shutdown {
            self.kick.notify_one();
        }
        if st.space_waiters > 0 {
            self.space.notify_all();
        }
    }

    /// Waits until transaction `tid` is published (durable and
    /// acknowledged), or the journal aborts.
    fn wait_published(&self, tid: Tid) -> Result<()> {
        let mut st = self.state();
        while st.committed_tid < tid && st.error.is_none() {
            self.done[Self::slot(tid)].wait(st.inner());
        }
        match &st.error {
            Some(_) => Err(Self::aborted_error(&st)),
            None => Ok(()),
        }
    }

    fn wake_all_waiters(&self) {
        self.done.iter().for_each(|c| {
            c.notify_all();
        });
        self.space.notify_all();
        self.kick.notify_all();
    }

    fn write_commit(
        &self,
        tid: Tid,
        layout: &Layout,
        newest: BTreeMap<Lba, (u64, BlockRef)>,
        revoke_list: Vec<Lba>,
        charged: u64,
    ) -> Result<CommittedTxn> {
        let (sequence, head) = (layout.sequence, layout.head);
        let bs = self.bs;
        let data: Vec<(u64, &[u8])> = newest.iter().map(|(&b, (_, r))| (b, r.bytes(bs))).collect();
        let jsb = self.jsb.lock().clone();
        let log: Vec<LogBlock<'_>> =
            writer::build_transaction(&jsb, sequence, &data, &revoke_list, SystemTime::now());
        let k = log.len() as u64;
        if k > charged {
            return Err(VolumeError::CorruptJournal(format!(
                "internal accounting error: transaction needs {k} journal blocks but paid for {charged}"
            )));
        }
        let prio = || {
            let st = self.state();
            if st.want_commit >= tid || st.shutdown || st.space_waiters > 0 {
                IoPriority::Urgent
            } else {
                IoPriority::Background
            }
        };
        let len = self.region.len_blocks();
        if !revoke_list.is_empty() {
            // IMPORTANT: revokes protect data that direct writes put home;
            // that data must be durable before a revoke can be.
            self.home_flusher.flush(self.home.as_ref())?;
        }
        if layout.chained {
            // IMPORTANT: everything above (cut, layout, descriptors,
            // checksums, digest) ran while the older commit was in flight;
            // the I/O waits until that one is published. So no block of
            // this transaction reaches the log before its predecessor is
            // durable — recovery's "a later commit block proves the earlier
            // transaction was durable" holds — and a commit still costs one
            // FUA write: on devices that emulate FUA with a cache flush
            // (every loop device over a file), writing the body early would
            // cost a second flush per commit (measured: 0.4x at 8 threads).
            self.stats.lock().chained_commits += 1;
            self.wait_published(tid - 1)?;
        }
        let end_pos = {
            match self.opts.commit_mode {
                CommitMode::SingleFlush => {
                    // IMPORTANT: one force-unit-access write (RWF_DSYNC) of
                    // every block of the transaction: durable when it
                    // returns, with no separate flush round trip. Torn
                    // commits are still caught by the block checksums and
                    // the data digest.
                    writer::write_log_blocks(&self.region, self.first, head, &log, &prio, true)?
                }
                CommitMode::TwoFlush => {
                    let (body, commit) = log.split_at(log.len() - 1);
                    let mid = writer::write_log_blocks(
                        &self.region,
                        self.first,
                        head,
                        body,
                        &prio,
                        false,
                    )?;
                    self.region.flush()?;
                    let end = writer::write_log_blocks(
                        &self.region,
                        self.first,
                        mid,
                        commit,
                        &|| IoPriority::Urgent,
                        false,
                    )?;
                    self.region.flush()?;
                    end
                }
            }
        };
        // The layout fixed at the cut is what was written.
        debug_assert_eq!(end_pos, writer::advance(head, log.len(), self.first, len));
        drop(log);
        drop(data);
        Ok(CommittedTxn {
            tid,
            sequence,
            start_pos: head,
            log_blocks: k,
            charged,
            blocks: newest.into_iter().map(|(b, (v, r))| (b, v, r)).collect(),
            revokes: revoke_list,
        })
    }

    // ----- checkpoint thread ----------------------------------------------

    pub fn checkpoint_thread(self: &Arc<Self>) {
        loop {
            let urgent;
            {
                let mut st = self.state();
                loop {
                    if st.error.is_some() {
                        return;
                    }
                    let have = !self.committed.lock().is_empty();
                    let fill_high = st.log.fill_at_least(1, 4);
                    if have && (st.checkpoint_request || fill_high || st.checkpoint_shutdown) {
                        break;
                    }
                    if st.checkpoint_shutdown && !have && st.committed_tid + 1 >= st.running_tid {
                        return;
                    }
                    let timed_out = self
                        .checkpoint_kick
                        .wait_for(st.inner(), self.opts.checkpoint_interval)
                        .timed_out();
                    if timed_out {
                        if !self.committed.lock().is_empty() {
                            break;
                        }
                        // Idle for a whole interval: give the write
                        // buffers kept for reuse back (outside the lock).
                        if self.pool.stats().kept_bytes > 0 {
                            drop(st);
                            self.pool.trim();
                            st = self.state();
                        }
                    }
                }
                urgent =
                    st.space_waiters > 0 || st.log.fill_at_least(3, 4) || st.checkpoint_shutdown;
                st.checkpoint_request = false;
            }
            let batch: Vec<CommittedTxn> = {
                let mut q = self.committed.lock();
                let mut blocks = 0;
                let mut n = 0;
                while n < q.len()
                    && (n == 0 || blocks + q[n].blocks.len() <= CHECKPOINT_ROUND_BLOCKS)
                {
                    blocks += q[n].blocks.len();
                    n += 1;
                }
                q.drain(..n).collect()
            };
            if batch.is_empty() {
                continue;
            }
            if let Err(e) = self.checkpoint(batch, urgent) {
                self.abort(format!("checkpoint failed: {e}"));
                return;
            }
        }
    }

    /// Writes the blocks of `batch` (oldest first) home, makes them durable,
    /// advances the journal tail and forgets them.
    fn checkpoint(&self, batch: Vec<CommittedTxn>, urgent: bool) -> Result<()> {
        let bs = self.bs;
        let mut writes: BTreeMap<Lba, (u64, BlockRef)> = BTreeMap::new();
        for t in &batch {
            for (b, v, r) in &t.blocks {
                writes.insert(*b, (*v, r.clone()));
            }
        }
        let all: Vec<(Lba, u64, BlockRef)> = writes
            .iter()
            .map(|(&b, (v, r))| (b, *v, r.clone()))
            .collect();
        let mut written = 0u64;
        for chunk in all.chunks(CHECKPOINT_CHUNK_BLOCKS) {
            let _home = self.home_lock.write();
            // Validate under the shard locks: skip versions a direct write
            // superseded (cancel_below) — their revoke protects replay.
            let todo: Vec<&(Lba, u64, BlockRef)> = chunk
                .iter()
                .filter(|(b, v, _)| {
                    let sh = self.overlay.lock_block(*b);
                    sh.map.get(b).is_some_and(|e| *v >= e.cancel_below)
                })
                .collect();
            // IMPORTANT: a copy is only skippable because a direct write
            // superseded it; a direct write that failed aborted first (under
            // the home lock we hold now), so after an abort nothing may be
            // skipped — or checkpointed: the journal keeps everything.
            self.ack()?;
            let prio = if urgent || self.state().space_waiters > 0 {
                IoPriority::Urgent
            } else {
                IoPriority::Background
            };
            // Runs of consecutive blocks, all zero or all data.
            let mut runs: Vec<(usize, usize, bool)> = Vec::new();
            let mut i = 0;
            while i < todo.len() {
                let zero = is_zero(todo[i].2.bytes(bs));
                let mut j = i + 1;
                while j < todo.len()
                    && todo[j].0 == todo[j - 1].0 + 1
                    && is_zero(todo[j].2.bytes(bs)) == zero
                {
                    j += 1;
                }
                runs.push((i, j, zero));
                i = j;
            }
            // Zero runs are hole punches; data runs go out as one device
            // batch (queue depth without a thread per write).
            let mut batch: Vec<(u64, Vec<IoSlice<'_>>)> = Vec::new();
            let mut res: Result<()> = Ok(());
            for &(i, j, zero) in &runs {
                let off = self.home_offset(todo[i].0);
                if zero {
                    res = self
                        .home
                        .write_zeroes(off, (j - i) as u64 * bs as u64)
                        .map_err(Into::into);
                    if res.is_err() {
                        break;
                    }
                } else {
                    let iov = todo[i..j]
                        .iter()
                        .map(|(_, _, r)| IoSlice::new(r.bytes(bs)))
                        .collect();
                    batch.push((off, iov));
                }
            }
            if res.is_ok() && !batch.is_empty() {
                let reqs: Vec<WriteReq<'_>> = batch
                    .iter()
                    .map(|(offset, bufs)| WriteReq {
                        offset: *offset,
                        bufs,
                        durable: false,
                    })
                    .collect();
                res = self.home.write_batch(&reqs, prio).map_err(Into::into);
            }
            if let Err(e) = res {
                // Abort at once: no write may be acknowledged after a
                // failure is seen.
                self.abort(format!("checkpoint write failed: {e}"));
                return Err(e);
            }
            written += todo.len() as u64;
            drop(_home);
            if !urgent {
                // Pace background writeback so foreground reads get the device.
                std::thread::yield_now();
            }
        }
        self.home_flusher.flush(self.home.as_ref())?;
        // Advance the tail: to the oldest transaction still in the log, or
        // to the head when the log is empty.
        let last = batch.last().expect("non-empty batch");
        let (tail_pos, tail_seq) = {
            let st = self.state();
            let q = self.committed.lock();
            // IMPORTANT: never past a transaction still in flight: it may be
            // acknowledged after this superblock update, and recovery must
            // then still find it.
            let at = st.log.tail(q.front().map(|t| Placement {
                sequence: t.sequence,
                head: t.start_pos,
            }));
            (at.head, at.sequence)
        };
        // IMPORTANT: never move the tail after an abort: recovery replays
        // whatever the journal still holds.
        self.ack()?;
        {
            let mut jsb = self.jsb.lock();
            jsb.start = tail_pos;
            jsb.sequence = tail_seq;
            // IMPORTANT: the new tail must be durable before the space it
            // frees is reused, or recovery would start in overwritten log.
            self.region.update_superblock(&jsb)?;
            self.region.flush()?;
        }
        let freed: u64 = batch.iter().map(|t| t.log_blocks).sum();
        {
            let mut st = self.state();
            st.log.checkpointed(freed);
            st.checkpointed_tid = last.tid;
            self.space.notify_all();
        }
        // Forget versions that are now home and durable, and tombstones
        // whose revoke records left the log.
        let last_tid = last.tid;
        for (b, (v, _)) in &writes {
            let mut sh = self.overlay.lock_block(*b);
            forget(&mut sh, *b, Some(*v), last_tid);
        }
        for t in &batch {
            for b in &t.revokes {
                let mut sh = self.overlay.lock_block(*b);
                forget(&mut sh, *b, None, last_tid);
            }
        }
        let mut s = self.stats.lock();
        s.checkpoints += 1;
        s.checkpoint_blocks += written;
        Ok(())
    }

    // ----- shutdown -------------------------------------------------------

    /// Tells the commit thread to commit what is left and exit.
    pub fn stop_commit(&self) {
        let mut st = self.state();
        st.shutdown = true;
        self.kick.notify_all();
    }

    /// Tells the checkpoint thread to checkpoint everything and exit.
    pub fn stop_checkpoint(&self) {
        let mut st = self.state();
        st.checkpoint_shutdown = true;
        self.checkpoint_kick.notify_all();
    }

    /// After both threads exited cleanly: mark the journal clean.
    pub fn mark_clean(&self) -> Result<()> {
        let st = self.state();
        if let Some(e) = &st.error {
            return Err(VolumeError::Aborted(e.clone()));
        }
        let next = st.log.next_sequence();
        drop(st);
        self.home_flusher.flush(self.home.as_ref())?;
        let mut jsb = self.jsb.lock();
        jsb.start = 0;
        jsb.sequence = next;
        self.region.update_superblock(&jsb)?;
        self.region.flush()?;
        Ok(())
    }

    /// Snapshot of the journal state for stats.
    pub fn journal_state(&self) -> (u64, u64, Tid, Tid) {
        let st = self.state();
        (
            st.log.used(),
            st.log.capacity(),
            st.committed_tid,
            st.checkpointed_tid,
        )
    }

    /// Device cache flushes issued (home, plus the journal's when external).
    pub fn device_flushes(&self) -> u64 {
        let home = self.home_flusher.flushes_issued();
        let journal = self.region.flusher();
        if Arc::ptr_eq(journal, &self.home_flusher) {
            home
        } else {
            home + journal.flushes_issued()
        }
    }

    /// Transactions committed and waiting for checkpoint.
    pub fn committed_len(&self) -> usize {
        self.committed.lock().len()
    }

    pub fn avg_commit(&self) -> Duration {
        Duration::from_nanos(self.state().avg_commit_ns)
    }
}

/// Drops the entry's newest version if it is `ver` (now home), and the
/// entry itself once nothing journaled or revoked remains in the log.
fn forget(sh: &mut crate::overlay::Shard, b: Lba, ver: Option<u64>, checkpointed: Tid) {
    let Some(e) = sh.map.get_mut(&b) else { return };
    if let (Some(v), Some(n)) = (ver, e.newest.as_ref()) {
        if n.ver == v {
            e.newest = None;
        }
    }
    if e.newest.is_none() && e.tomb_tid.is_none_or(|t| t <= checkpointed) {
        sh.map.remove(&b);
        sh.bump();
    }
}

/// Newest version per block, and the revokes that still apply: a
/// journaled copy newer than a revoke cancels the revoke; an older one is
/// dropped (the direct write superseded it).
fn resolve(
    blocks: Vec<(Lba, u64, BlockRef)>,
    revokes: Vec<(Lba, u64)>,
) -> (BTreeMap<Lba, (u64, BlockRef)>, Vec<Lba>) {
    let mut newest: BTreeMap<Lba, (u64, BlockRef)> = BTreeMap::new();
    for (b, v, r) in blocks {
        match newest.get(&b) {
            Some((old, _)) if *old > v => {}
            _ => {
                newest.insert(b, (v, r));
            }
        }
    }
    let mut rev: BTreeMap<Lba, u64> = BTreeMap::new();
    for (b, v) in revokes {
        let e = rev.entry(b).or_insert(v);
        *e = (*e).max(v);
    }
    rev.retain(|b, rv| match newest.get(b) {
        Some((v, _)) if *v > *rv => false,
        Some(_) => {
            newest.remove(b);
            true
        }
        None => true,
    });
    (newest, rev.keys().copied().collect())
}

/// True if the pieces `(block, lo, hi)` of one block, sorted by `lo`,
/// cover `[0, bs)`.
/// Applies `ops` (in order) to the blocks `i` of `buf` for which `want(i)`;
/// `lbas` are the request's distinct blocks, ascending.
fn apply_ops(
    buf: &mut WriteBuf,
    ops: &[Op<'_>],
    lbas: &[Lba],
    bs: usize,
    want: impl Fn(usize) -> bool,
) {
    let bs64 = bs as u64;
    for op in ops {
        let (s, e) = op.range();
        let mut off = s;
        while off < e {
            let b = off / bs64;
            let inb = (off % bs64) as usize;
            let take = (bs - inb).min((e - off) as usize);
            let i = lbas.binary_search(&b).expect("block of the request");
            if want(i) {
                let dst = &mut buf.block_mut(i)[inb..inb + take];
                match op {
                    Op::Write { data, .. } => {
                        let pos = (off - s) as usize;
                        dst.copy_from_slice(&data[pos..pos + take]);
                    }
                    Op::Zero { .. } => dst.fill(0),
                }
            }
            off += take as u64;
        }
    }
}

fn covers_block(pieces: &[(Lba, usize, usize)], bs: usize) -> bool {
    let mut reach = 0;
    for &(_, lo, hi) in pieces {
        if lo > reach {
            return false;
        }
        reach = reach.max(hi);
    }
    reach >= bs
}

fn is_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}
