//! The checkpoint thread: committed transactions home, the tail forward.
//!
//! # Writes as a stream
//! The thread owns one request queue on the home device
//! ([`CHECKPOINT_QUEUE_DEPTH`] deep, made at its first checkpoint and kept
//! for the thread's life). A chunk's runs of consecutive blocks go out as
//! vectored writes (zero runs as `write_zeroes`) that point at the
//! journaled block buffers themselves ([`HomeBlocks`]: no copy), and the
//! queue is kept full: each reaped completion makes room for the next run,
//! instead of a batch of writes waiting for its slowest one before the next
//! batch starts. The chunk's protocol is unchanged: its writes are all
//! reaped before the home lock is released, and the first failure stops new
//! pushes, is reaped with what is in flight, and aborts the volume. A
//! device that cannot give a queue gets the same writes as one
//! `write_batch` per chunk.

use super::*;
use jbdev_device::{IoBuf, IoQueue, IoRequest};
use std::collections::{HashMap, HashSet};

/// Shortest run of all-zero blocks the checkpoint punches out of home
/// instead of writing.
const ZERO_PUNCH_MIN_BYTES: usize = 64 << 10;

/// Shortest and longest wait between checkpoint attempts while the
/// backing store is full (the wait grows with the episode's length); a
/// shorter checkpoint interval shortens both (see `Engine::home_is_full`).
const HOME_FULL_RETRY_MIN: Duration = Duration::from_millis(100);
const HOME_FULL_RETRY_MAX: Duration = Duration::from_secs(2);

/// Most checkpoint writes in flight on the home device at once: enough to
/// keep a disk's or an SSD's queue busy with random home blocks, and a
/// bound on what one chunk's failure can leave in flight.
pub(super) const CHECKPOINT_QUEUE_DEPTH: u32 = 32;

// A run is at most a chunk, and a queued write carries at most IOV_MAX buffers.
const _: () = assert!(CHECKPOINT_CHUNK_BLOCKS <= jbdev_device::IOV_MAX);

/// Consecutive journaled blocks handed to the home queue without a copy:
/// `len` bytes of one pooled buffer from `first`'s offset (the blocks of a
/// multi-block write sit back to back in their buffer, so a run usually
/// needs one or a few of these). The buffer is shared and never written
/// after it is shared, so `bytes()` is the same slice every time.
struct HomeBlocks {
    first: BlockRef,
    len: usize,
}

impl IoBuf for HomeBlocks {
    fn bytes(&self) -> &[u8] {
        &self.first.buf[self.first.offset..self.first.offset + self.len]
    }
}

/// The checkpoint thread's queue on the home device.
pub(super) enum HomeQueue<'a> {
    /// Not asked for yet (made at the first checkpoint).
    NotYet,
    Ready(Box<dyn IoQueue + 'a>),
    /// The device could not give one: checkpoints use `write_batch`.
    Unavailable,
}

/// A run of consecutive blocks of a chunk, `todo[start..end]`, all zero or
/// all data; `punch`: written as a hole.
struct Run {
    start: usize,
    end: usize,
    punch: bool,
}

impl Run {
    /// The bytes of home the run covers.
    fn bytes(&self, bs: usize) -> u64 {
        ((self.end - self.start) * bs) as u64
    }
}

impl Engine {
    // ----- checkpoint thread ----------------------------------------------

    pub fn checkpoint_thread(self: &Arc<Self>) {
        let mut queue = HomeQueue::NotYet;
        self.checkpoint_rounds(&mut queue);
        if self.salvage_due() {
            self.salvage(&mut queue);
        }
    }

    /// Checkpoint rounds until shutdown or an abort.
    fn checkpoint_rounds<'a>(&'a self, queue: &mut HomeQueue<'a>) {
        loop {
            let urgent;
            let round_blocks;
            {
                let mut st = self.state();
                loop {
                    if st.error.is_some() {
                        return;
                    }
                    let have = !self.log.committed.lock().is_empty();
                    let fill_high =
                        st.j.space
                            .fill_at_least(CHECKPOINT_START.0, CHECKPOINT_START.1);
                    if have && (st.checkpoint_request || fill_high || st.checkpoint_shutdown) {
                        break;
                    }
                    if st.checkpoint_shutdown && !have && st.j.committed() + 1 >= st.j.running() {
                        return;
                    }
                    let timed_out = self
                        .sync
                        .checkpoint_kick
                        .wait_for(st.inner(), self.opts.checkpoint_interval)
                        .timed_out();
                    if timed_out {
                        if !self.log.committed.lock().is_empty() {
                            break;
                        }
                        // Idle for a whole interval: give the write
                        // buffers kept for reuse back (outside the lock).
                        let direct_kept = !self.home.direct_bufs.lock().is_empty();
                        if self.pool.stats().kept_bytes > 0 || direct_kept {
                            drop(st);
                            self.pool.trim();
                            self.home.direct_bufs.lock().clear();
                            jbdev_device::heap::release_free_memory();
                            st = self.state();
                        }
                    }
                }
                urgent = st.space_waiters > 0
                    || self.pacing()
                    || st
                        .j
                        .space
                        .fill_at_least(CHECKPOINT_URGENT.0, CHECKPOINT_URGENT.1)
                    || st.checkpoint_shutdown;
                st.checkpoint_request = false;
                // An eighth of the log at most, so that when the checkpoint
                // starts (a quarter full) newer committed transactions stay
                // behind the round and supersede some of its copies (22b).
                round_blocks =
                    (st.j.space.capacity() as usize / 8).clamp(1, CHECKPOINT_ROUND_BLOCKS);
            }
            let (batch, later) = {
                let mut q = self.log.committed.lock();
                let mut blocks = 0;
                let mut n = 0;
                while n < q.len() && (n == 0 || blocks + q[n].blocks.len() <= round_blocks) {
                    blocks += q[n].blocks.len();
                    n += 1;
                }
                let batch: Vec<CommittedTxn> = q.drain(..n).collect();
                let later = newer_committed(&batch, q.iter());
                (batch, later)
            };
            if batch.is_empty() {
                continue;
            }
            // A panic (a bug) aborts the volume instead of ending this
            // thread silently, which would leave writers waiting for log
            // space for ever.
            let res = contain_panic("checkpoint", || {
                self.checkpoint(&batch, &later, urgent, queue)
            });
            let Err(e) = res else {
                self.home_has_room();
                continue;
            };
            // The batch goes back to the front of the queue: the journal
            // still holds it (the tail did not move), and so does a salvage.
            {
                let mut q = self.log.committed.lock();
                for t in batch.into_iter().rev() {
                    q.push_front(t);
                }
            }
            // A full store is not an abort: the checkpoint tries again
            // (ARCHITECTURE, failure semantics).
            if is_no_space(e.errno()) && self.ack().is_ok() {
                if self.abort_if_home_shrunk() {
                    return;
                }
                if !self.home_is_full(&e) {
                    return;
                }
                continue;
            }
            if matches!(e, VolumeError::Internal(_)) {
                // A panic (a bug): the salvage would run the same code.
                self.note_home_failed();
            }
            if self.ack().is_ok() {
                self.abort(format!("checkpoint failed: {e}"), e.errno());
            }
            return;
        }
    }

    /// A checkpoint found no room on the backing store; its batch is back
    /// in the committed queue. Records it, tells writers waiting for log
    /// space (they fail now: see [`Engine::reserve`]), and waits before
    /// the next attempt: at least [`HOME_FULL_RETRY_MIN`], at most half
    /// the time the store has been full (up to [`HOME_FULL_RETRY_MAX`]),
    /// sooner when a writer needs space; both bounds at most the
    /// checkpoint interval (tests run with a few milliseconds). False: stop (shutdown or abort; the journal
    /// keeps what it holds and the next open replays it).
    fn home_is_full(&self, e: &VolumeError) -> bool {
        let mut st = self.state();
        let first = st.home_full.is_none();
        if first {
            tracing::error!(
                "the backing store is full: {e}. The checkpoint cannot take journaled blocks \
                 home; writes are accepted while the journal has room, then fail with ENOSPC. \
                 Nothing acknowledged is lost. Free space on the store: the checkpoint retries \
                 by itself and writes resume"
            );
            st.home_full = Some(HomeFull {
                reason: e.to_string(),
                errno: e.errno(),
                since: Instant::now(),
            });
        }
        st.home_full_attempts += 1;
        self.sync.space.notify_all();
        if st.checkpoint_shutdown || st.error.is_some() {
            return false;
        }
        // Half the episode's length so far, within the bounds.
        let since = st.home_full.as_ref().map_or_else(Instant::now, |f| f.since);
        let least = HOME_FULL_RETRY_MIN.min(self.opts.checkpoint_interval);
        let most = HOME_FULL_RETRY_MAX.min(self.opts.checkpoint_interval.max(least));
        let backoff = (since.elapsed() / 2).clamp(least, most);
        let now = Instant::now();
        let (soonest, latest) = (now + least, now + backoff);
        st.checkpoint_request = false;
        loop {
            if st.checkpoint_shutdown || st.error.is_some() {
                return true;
            }
            let now = Instant::now();
            if now >= latest || (now >= soonest && st.checkpoint_request) {
                return true;
            }
            let until = if st.checkpoint_request {
                soonest
            } else {
                latest
            };
            self.sync.checkpoint_kick.wait_until(st.inner(), until);
        }
    }

    /// A checkpoint succeeded: if the store was full, it has room again.
    fn home_has_room(&self) {
        let mut st = self.state();
        if let Some(f) = st.home_full.take() {
            tracing::warn!(
                "the backing store has room again after {:.1} s: the checkpoint resumed",
                f.since.elapsed().as_secs_f64()
            );
            self.sync.space.notify_all();
        }
    }

    /// From now on each checkpoint records the sequence of its newest
    /// transaction in the volume superblock `sb` (block 0 of the home
    /// device), as the open stamped it (FORMAT.md, `checkpoint_sequence`).
    pub fn record_checkpoints_in(&self, sb: crate::superblock::VolumeSuperblock) {
        *self.home.superblock.lock() = Some(sb);
    }

    /// Rewrites the volume superblock with `checkpoint_sequence =
    /// sequence` (not flushed: the checkpoint's home flush covers it).
    /// One sector, written whole, so it is atomic.
    fn write_checkpoint_mark(&self, sequence: u32) -> Result<()> {
        let buf = {
            let mut sb = self.home.superblock.lock();
            let Some(sb) = sb.as_mut() else {
                return Ok(());
            };
            sb.checkpoint_sequence = sequence;
            let mut buf = AlignedBuf::zeroed(sb.block_size as usize);
            sb.encode_block(&mut buf);
            buf
        };
        // Written by the checkpoint thread alone, so no two marks race.
        self.home.dev.write_at(&buf, 0, IoPriority::Background)?;
        Ok(())
    }

    /// Writes the blocks of `batch` (oldest first) home, makes them durable,
    /// advances the journal tail and forgets them.
    /// `later` maps blocks of the batch to a newer version in a committed
    /// transaction that stays in the log ([`newer_committed`]).
    pub(super) fn checkpoint<'a>(
        &'a self,
        batch: &[CommittedTxn],
        later: &HashMap<Lba, u64>,
        urgent: bool,
        queue: &mut HomeQueue<'a>,
    ) -> Result<()> {
        #[cfg(test)]
        if self.panic_next_checkpoint.swap(false, Ordering::AcqRel) {
            panic!("injected panic in a checkpoint (test)");
        }
        if matches!(queue, HomeQueue::NotYet) {
            *queue = match self.home.dev.queue(CHECKPOINT_QUEUE_DEPTH) {
                Ok(q) => HomeQueue::Ready(q),
                Err(e) => {
                    tracing::warn!(
                        "no request queue on the home device ({e}); checkpoints write in batches"
                    );
                    HomeQueue::Unavailable
                }
            };
        }
        let all = newest_blocks(batch);
        let mut written = 0u64;
        let mut superseded = 0u64;
        for chunk in all.chunks(CHECKPOINT_CHUNK_BLOCKS) {
            let _home = self.home.lock.write();
            // Validate under the shard locks: skip versions a direct write
            // superseded (cancel_below) — their revoke protects replay —
            // and versions a newer copy in a committed transaction
            // supersedes: that transaction stays in the log (the tail never
            // passes it) and replays the block after a crash, and its own
            // checkpoint writes the block home (jbd2 drops a buffer from an
            // older transaction's checkpoint list the same way). A block
            // rewritten all the time then goes home about once per log
            // wrap, not once per round.
            let todo: Vec<&(Lba, u64, BlockRef)> = chunk
                .iter()
                .filter(|(b, v, _)| {
                    if later.get(b).is_some_and(|lv| lv > v) {
                        superseded += 1;
                        return false;
                    }
                    self.not_cancelled(*b, *v)
                })
                .collect();
            // IMPORTANT: a copy is only skippable because a direct write
            // superseded it; a direct write that failed aborted first (under
            // the home lock we hold now), so after an abort nothing may be
            // skipped — or checkpointed: the journal keeps everything.
            self.ack()?;
            let prio = if urgent || self.pacing() || self.state().space_waiters > 0 {
                IoPriority::Urgent
            } else {
                IoPriority::Background
            };
            if let Err(e) = self.write_chunk(queue, &todo, prio) {
                if matches!(queue, HomeQueue::Ready(q) if q.in_flight() > 0) {
                    // Only when the queue itself failed: dropping it waits
                    // for what the device still has, before the home lock
                    // lets a direct write near those blocks.
                    *queue = HomeQueue::Unavailable;
                }
                // Abort at once: no write may be acknowledged after a
                // failure is seen (a streamed chunk aborted already). Not
                // for a full store: the journal keeps the batch, and the
                // caller puts it back and tries again later.
                if !is_no_space(e.errno()) {
                    self.home_write_failed(format!("checkpoint write failed: {e}"), e.errno());
                }
                return Err(e);
            }
            written += todo.len() as u64;
            drop(_home);
            if !urgent {
                // Pace background writeback so foreground reads get the device.
                std::thread::yield_now();
            }
        }
        // The mark goes into the same home flush: once the tail moves past
        // `last`, the home says it has everything up to it.
        let last = batch.last().expect("non-empty batch");
        if let Err(e) = self.write_checkpoint_mark(last.sequence) {
            if !is_no_space(e.errno()) {
                self.home_write_failed(format!("checkpoint mark write failed: {e}"), e.errno());
            }
            return Err(e);
        }
        // A failed flush is never "the store is full, retry": the device's
        // flusher keeps it failed (written data may be gone from the page
        // cache), so a retry could only abort later with EIO, after telling
        // the operator writes would resume (session 22's adversarial pass).
        // Abort now, with the flush's own errno: ENOSPC still reads "free
        // space, then reopen", and clients see ENOSPC.
        self.home
            .flusher
            .flush(self.home.dev.as_ref())
            .inspect_err(|e| {
                self.home_write_failed(
                    format!("the checkpoint's flush of the home device failed: {e}"),
                    e.errno(),
                );
            })?;
        // Advance the tail: to the oldest transaction still in the log, or
        // to the head when the log is empty.
        let (tail_pos, tail_seq) = {
            let st = self.state();
            let q = self.log.committed.lock();
            // IMPORTANT: never past a transaction still in flight: it may be
            // acknowledged after this superblock update, and recovery must
            // then still find it.
            let at = st.j.space.tail(q.front().map(|t| Placement {
                sequence: t.sequence,
                head: t.start_pos,
            }));
            (at.head, at.sequence)
        };
        // IMPORTANT: never move the tail after an abort: recovery replays
        // whatever the journal still holds.
        self.ack()?;
        {
            let mut jsb = self.log.jsb.lock();
            jsb.start = tail_pos;
            jsb.sequence = tail_seq;
            // IMPORTANT: the new tail must be durable before the space it
            // frees is reused, or recovery would start in overwritten log.
            let journal_failed = |_: &_| self.note_journal_failed();
            self.log
                .region
                .update_superblock(&jsb)
                .inspect_err(journal_failed)?;
            self.log.region.flush().inspect_err(journal_failed)?;
        }
        let freed: u64 = batch.iter().map(|t| t.log_blocks).sum();
        {
            let mut st = self.state();
            st.j.checkpointed(last.tid, freed);
            self.note_taken(&st);

            self.sync.space.notify_all();
        }
        // Forget versions that are now home and durable, and tombstones
        // whose revoke records left the log.
        let last_tid = last.tid;
        for (b, v, _) in &all {
            let mut sh = self.overlay.lock_block(*b);
            forget(&mut sh, *b, Some(*v), last_tid);
        }
        for t in batch {
            for b in &t.revokes {
                let mut sh = self.overlay.lock_block(*b);
                forget(&mut sh, *b, None, last_tid);
            }
        }
        let mut s = self.stats.lock();
        s.checkpoints += 1;
        s.checkpoint_blocks += written;
        s.checkpoint_blocks_skipped += superseded;
        Ok(())
    }

    /// The journal failed (its device, or its file deleted or truncated)
    /// and the home device has not: writes the newest committed copy of
    /// every block the journal holds home, from the buffers the overlay
    /// keeps in memory, and flushes the home device. Every write
    /// acknowledged before the failure is then durable at home, whatever
    /// becomes of the journal (a dead device, a deleted file gone at exit).
    ///
    /// Safe because it writes only published transactions (acknowledged or
    /// about to be: durable in the journal), newest version per block, and
    /// validates each chunk under the home lock exclusively like a
    /// checkpoint, skipping copies a completed direct write superseded. A
    /// direct write that failed noted the home's failure before it released
    /// that lock, and the salvage stops at the next chunk: the copies it
    /// cancelled are then only in the journal, which is left as it is. The
    /// journal's tail is not moved and nothing is forgotten: the next open
    /// replays whatever the journal still holds, the same data again.
    ///
    /// What no commit made durable (plain writes in the running
    /// transaction, or in a commit that failed or was in flight) is not
    /// written: no journal protects it any more, so a failure while it went
    /// home could leave a write half-applied, and replaying the journal
    /// over it later could roll part of it back. Those writes were never
    /// promised durability (a flush or FUA would have failed); they are
    /// counted (`salvage_uncommitted_blocks`) and named in the log.
    pub(super) fn salvage<'a>(&'a self, queue: &mut HomeQueue<'a>) {
        let all = newest_blocks(self.log.committed.lock().iter());
        let uncommitted = self.uncommitted_blocks(&all);
        self.stats.lock().salvage_uncommitted_blocks = uncommitted;
        tracing::warn!(
            "the journal failed: writing the {} block(s) of its committed transactions home from memory",
            all.len()
        );
        if uncommitted > 0 {
            tracing::warn!(
                "{uncommitted} block(s) of writes no commit had made durable (plain writes that no \
                 flush or FUA covered yet, or FUA writes whose commit failed, which were never \
                 acknowledged) cannot be salvaged: they stay readable until the volume is \
                 closed, and are lost then"
            );
        }
        let stopped = |why: String| {
            tracing::error!(
                "salvage stopped: {why}; writes acknowledged before the journal failed may \
                 exist only in the journal, which the next open replays if it can be read"
            );
        };
        for chunk in all.chunks(CHECKPOINT_CHUNK_BLOCKS) {
            let _home = self.home.lock.write();
            if self.abort.home_failed.load(Ordering::Acquire) {
                return stopped("a write or flush of the home device failed".into());
            }
            let todo: Vec<&(Lba, u64, BlockRef)> = chunk
                .iter()
                .filter(|(b, v, _)| self.not_cancelled(*b, *v))
                .collect();
            if let Err(e) = self.write_chunk(queue, &todo, IoPriority::Urgent) {
                self.note_home_failed();
                return stopped(format!("a home write failed: {e}"));
            }
            self.stats.lock().salvaged_blocks += todo.len() as u64;
        }
        if let Err(e) = self.home.flusher.flush(self.home.dev.as_ref()) {
            self.note_home_failed();
            return stopped(format!("the flush of the home device failed: {e}"));
        }
        let written = {
            let mut s = self.stats.lock();
            s.salvage_complete = true;
            s.salvaged_blocks
        };
        tracing::warn!(
            "salvage complete: {written} block(s) written home and flushed; every write \
             committed before the journal failed (every write a flush or FUA acknowledged) is \
             durable on the home device"
        );
    }

    /// Blocks whose newest version no committed transaction in `committed`
    /// (the salvage's list) holds and no direct write superseded: written,
    /// but never made durable.
    fn uncommitted_blocks(&self, committed: &[(Lba, u64, BlockRef)]) -> u64 {
        let have: HashMap<Lba, u64> = committed.iter().map(|(b, v, _)| (*b, *v)).collect();
        let mut n = 0;
        for i in 0..crate::overlay::SHARDS {
            let sh = self.overlay.lock(i);
            n += sh
                .map
                .iter()
                .filter(|(b, e)| {
                    e.newest.as_ref().is_some_and(|v| {
                        v.ver >= e.cancel_below && have.get(b).is_none_or(|&c| c < v.ver)
                    })
                })
                .count() as u64;
        }
        n
    }

    /// Whether version `v` of block `b` is still to go home: no direct
    /// write superseded it (`cancel_below`). Valid under the home lock held
    /// exclusively (see `Engine::direct`).
    fn not_cancelled(&self, b: Lba, v: u64) -> bool {
        let sh = self.overlay.lock_block(b);
        sh.map.get(&b).is_some_and(|e| v >= e.cancel_below)
    }

    /// Writes a validated chunk home: through the queue when there is one,
    /// else as one device batch.
    fn write_chunk(
        &self,
        queue: &mut HomeQueue<'_>,
        todo: &[&(Lba, u64, BlockRef)],
        prio: IoPriority,
    ) -> Result<()> {
        let runs = runs(todo, self.bs);
        match queue {
            HomeQueue::Ready(q) => self.write_streamed(q.as_mut(), todo, &runs, prio),
            _ => self.write_batched(todo, &runs, prio),
        }
    }

    /// Writes a chunk's runs through the queue, keeping it full: a run is
    /// pushed as soon as a completion makes room. Returns once every write
    /// pushed has been reaped; the first failed write aborts the volume,
    /// stops further pushes, and is returned after the rest are reaped.
    fn write_streamed(
        &self,
        q: &mut dyn IoQueue,
        todo: &[&(Lba, u64, BlockRef)],
        runs: &[Run],
        prio: IoPriority,
    ) -> Result<()> {
        let bs = self.bs;
        let mut next = runs.iter().enumerate();
        let mut failed: Option<jbdev_device::DeviceError> = None;
        let mut done = Vec::with_capacity(q.depth() as usize);
        loop {
            while failed.is_none() && q.in_flight() < q.depth() {
                let Some((tag, run)) = next.next() else { break };
                let off = self.home_offset(todo[run.start].0);
                let req = if run.punch {
                    IoRequest::write_zeroes(off, run.bytes(bs))
                } else {
                    IoRequest::write_v(off, home_bufs(&todo[run.start..run.end], bs))
                };
                if let Err(r) = q.push(req.with_priority(prio), tag as u64) {
                    if !is_no_space(r.error.errno()) {
                        self.home_write_failed(
                            format!("checkpoint write refused: {r}"),
                            r.error.errno(),
                        );
                    }
                    failed = Some(r.error);
                }
            }
            if q.in_flight() == 0 {
                break;
            }
            // IMPORTANT: an error of the queue itself leaves requests in
            // flight; the caller drops the queue (which waits for them).
            q.reap(1, &mut done)?;
            for d in done.drain(..) {
                if d.result.is_ok() {
                    if let Some(run) = runs.get(d.tag as usize) {
                        self.home
                            .checkpoint_written_bytes
                            .fetch_add(run.bytes(bs), Ordering::Relaxed);
                    }
                }
                if let Err(e) = d.result {
                    if failed.is_none() {
                        // Abort at once (nothing is acknowledged after a
                        // failure is seen), then reap what is in flight;
                        // a full store only stops this attempt.
                        if !is_no_space(e.errno()) {
                            self.home_write_failed(
                                format!("checkpoint write failed: {e}"),
                                e.errno(),
                            );
                        }
                        failed = Some(e);
                    }
                }
            }
        }
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Writes a chunk's runs without a queue: zero runs one by one, data
    /// runs as one device batch.
    fn write_batched(
        &self,
        todo: &[&(Lba, u64, BlockRef)],
        runs: &[Run],
        prio: IoPriority,
    ) -> Result<()> {
        let bs = self.bs;
        let mut batch: Vec<(u64, Vec<IoSlice<'_>>)> = Vec::new();
        for run in runs {
            let off = self.home_offset(todo[run.start].0);
            if run.punch {
                self.home.dev.write_zeroes(off, run.bytes(bs))?;
            } else {
                let iov = todo[run.start..run.end]
                    .iter()
                    .map(|(_, _, r)| IoSlice::new(r.bytes(bs)))
                    .collect();
                batch.push((off, iov));
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        let reqs: Vec<WriteReq<'_>> = batch
            .iter()
            .map(|(offset, bufs)| WriteReq {
                offset: *offset,
                bufs,
                durable: false,
            })
            .collect();
        self.home.dev.write_batch(&reqs, prio)?;
        let bytes = runs.iter().map(|r| r.bytes(bs)).sum();
        self.home
            .checkpoint_written_bytes
            .fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }
}

/// The newest version of each block of `txns` (oldest first), in block
/// order: what a checkpoint or a salvage writes home.
fn newest_blocks<'a>(
    txns: impl IntoIterator<Item = &'a CommittedTxn>,
) -> Vec<(Lba, u64, BlockRef)> {
    let mut newest: BTreeMap<Lba, (u64, BlockRef)> = BTreeMap::new();
    for t in txns {
        for (b, v, r) in &t.blocks {
            newest.insert(*b, (*v, r.clone()));
        }
    }
    newest.into_iter().map(|(b, (v, r))| (b, v, r)).collect()
}

/// Splits a chunk (blocks in ascending order) into runs of consecutive
/// blocks; inside a stretch of consecutive blocks long enough to hold one,
/// a run of at least [`ZERO_PUNCH_MIN_BYTES`] of blocks a zeroing request
/// wrote (write-zeroes, trim: [`BlockRef::zeroed`]) becomes a hole punch.
/// Blocks a plain write filled with zeroes are data and are written: a
/// preallocated image must keep its space (found by a failure-mode pass:
/// 8 MiB of zero WRITEs punched out of a `--preallocate` image, whose
/// next write into that range then failed with ENOSPC). Marks, not
/// content: no block is read to find out.
fn runs(todo: &[&(Lba, u64, BlockRef)], bs: usize) -> Vec<Run> {
    let punch_blocks = ZERO_PUNCH_MIN_BYTES.div_ceil(bs);
    let mut runs = Vec::new();
    let mut i = 0;
    while i < todo.len() {
        let mut k = i + 1;
        while k < todo.len() && todo[k].0 == todo[k - 1].0 + 1 {
            k += 1;
        }
        if k - i < punch_blocks {
            runs.push(Run {
                start: i,
                end: k,
                punch: false,
            });
            i = k;
            continue;
        }
        let zero: Vec<bool> = todo[i..k].iter().map(|t| t.2.zeroed(bs)).collect();
        // Zero runs too short to punch are written with their neighbours.
        let mut data_start = i;
        let mut j = i;
        while j < k {
            if !zero[j - i] {
                j += 1;
                continue;
            }
            let z = j;
            while j < k && zero[j - i] {
                j += 1;
            }
            if j - z >= punch_blocks {
                if z > data_start {
                    runs.push(Run {
                        start: data_start,
                        end: z,
                        punch: false,
                    });
                }
                runs.push(Run {
                    start: z,
                    end: j,
                    punch: true,
                });
                data_start = j;
            }
        }
        if data_start < k {
            runs.push(Run {
                start: data_start,
                end: k,
                punch: false,
            });
        }
        i = k;
    }
    runs
}

/// The buffers of a data run: blocks that sit back to back in one pooled
/// buffer are one [`HomeBlocks`].
fn home_bufs(blocks: &[&(Lba, u64, BlockRef)], bs: usize) -> Vec<Box<dyn IoBuf>> {
    let mut out: Vec<HomeBlocks> = Vec::new();
    for (_, _, r) in blocks {
        match out.last_mut() {
            Some(h)
                if std::ptr::eq(h.first.buf.as_ptr(), r.buf.as_ptr())
                    && r.offset == h.first.offset + h.len =>
            {
                h.len += bs
            }
            _ => out.push(HomeBlocks {
                first: r.clone(),
                len: bs,
            }),
        }
    }
    out.into_iter()
        .map(|h| -> Box<dyn IoBuf> { Box::new(h) })
        .collect()
}

/// For each block of `batch` that a transaction of `rest` (committed, newer,
/// staying in the log) also holds: the newest version there. Versions grow
/// with transaction order, so the last one seen is the newest.
fn newer_committed<'a>(
    batch: &[CommittedTxn],
    rest: impl Iterator<Item = &'a CommittedTxn>,
) -> HashMap<Lba, u64> {
    let mut later = HashMap::new();
    let mut rest = rest.peekable();
    if rest.peek().is_none() {
        return later;
    }
    let in_batch: HashSet<Lba> = batch
        .iter()
        .flat_map(|t| t.blocks.iter().map(|(b, _, _)| *b))
        .collect();
    for t in rest {
        for (b, v, _) in &t.blocks {
            if in_batch.contains(b) {
                later.insert(*b, *v);
            }
        }
    }
    later
}

/// Drops the entry's newest version if it is `ver` (now home), and the
/// entry itself once nothing journaled or revoked remains in the log.
pub(super) fn forget(sh: &mut crate::overlay::Shard, b: Lba, ver: Option<u64>, checkpointed: Tid) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bufpool::BufPool;

    const BS: usize = 4096;

    /// Runs of `blocks` (home block, zeroed by a zeroing request?) as
    /// (start, end, punch). Every block's content is zero: only the marks
    /// decide.
    fn runs_of(blocks: &[(Lba, bool)]) -> Vec<(usize, usize, bool)> {
        let pool = BufPool::new(BS, 1 << 30);
        let mut w = pool.take(blocks.len());
        for (i, (_, zeroed)) in blocks.iter().enumerate() {
            w.block_mut(i).fill(0);
            if *zeroed {
                w.mark_zeroed(i);
            }
        }
        let shared = w.share();
        let items: Vec<(Lba, u64, BlockRef)> = blocks
            .iter()
            .enumerate()
            .map(|(i, (lba, _))| {
                let (buf, offset) = shared.block(i);
                let r = BlockRef {
                    buf: buf.clone(),
                    offset,
                };
                (*lba, 1, r)
            })
            .collect();
        let todo: Vec<&(Lba, u64, BlockRef)> = items.iter().collect();
        runs(&todo, BS)
            .into_iter()
            .map(|r| (r.start, r.end, r.punch))
            .collect()
    }

    #[test]
    fn only_long_consecutive_zero_runs_are_punched() {
        let punch = ZERO_PUNCH_MIN_BYTES / BS;
        // Scattered zero blocks: one data run each, never a punch.
        let scattered: Vec<(Lba, bool)> = (0..5).map(|i| (i * 10, true)).collect();
        assert_eq!(
            runs_of(&scattered),
            (0..5).map(|i| (i, i + 1, false)).collect::<Vec<_>>()
        );
        // Consecutive: data, a long zero run, a short zero run inside data.
        let mut b: Vec<(Lba, bool)> = Vec::new();
        b.extend((0..3).map(|i| (100 + i, false)));
        b.extend((3..3 + punch as u64).map(|i| (100 + i, true)));
        let after = 3 + punch as u64;
        b.push((100 + after, false));
        b.push((100 + after + 1, true));
        b.push((100 + after + 2, false));
        let n = b.len();
        assert_eq!(
            runs_of(&b),
            vec![(0, 3, false), (3, 3 + punch, true), (3 + punch, n, false)]
        );
        // A zero run one block short of the minimum is written as data,
        // and a gap in block numbers ends a run.
        let mut c: Vec<(Lba, bool)> = (0..punch as u64 - 1).map(|i| (i, true)).collect();
        c.push((1000, true));
        assert_eq!(
            runs_of(&c),
            vec![(0, punch - 1, false), (punch - 1, punch, false)]
        );
        // Exactly the minimum, at the end of a stretch.
        let d: Vec<(Lba, bool)> = std::iter::once((0, false))
            .chain((1..=punch as u64).map(|i| (i, true)))
            .collect();
        assert_eq!(runs_of(&d), vec![(0, 1, false), (1, 1 + punch, true)]);
        // Zeroes a plain write put there are data, however long the run.
        let e: Vec<(Lba, bool)> = (0..2 * punch as u64).map(|i| (i, false)).collect();
        assert_eq!(runs_of(&e), vec![(0, 2 * punch, false)]);
    }
}
