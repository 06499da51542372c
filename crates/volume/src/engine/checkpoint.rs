//! The checkpoint thread: committed transactions home, the tail forward.

use super::*;
use std::collections::{HashMap, HashSet};

/// Shortest run of all-zero blocks the checkpoint punches out of home
/// instead of writing.
const ZERO_PUNCH_MIN_BYTES: usize = 64 << 10;

impl Engine {
    // ----- checkpoint thread ----------------------------------------------

    pub fn checkpoint_thread(self: &Arc<Self>) {
        loop {
            let urgent;
            let round_blocks;
            {
                let mut st = self.state();
                loop {
                    if st.error.is_some() {
                        return;
                    }
                    let have = !self.committed.lock().is_empty();
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
                        .checkpoint_kick
                        .wait_for(st.inner(), self.opts.checkpoint_interval)
                        .timed_out();
                    if timed_out {
                        if !self.committed.lock().is_empty() {
                            break;
                        }
                        // Idle for a whole interval: give the write
                        // buffers kept for reuse back (outside the lock).
                        let direct_kept = !self.direct_bufs.lock().is_empty();
                        if self.pool.stats().kept_bytes > 0 || direct_kept {
                            drop(st);
                            self.pool.trim();
                            self.direct_bufs.lock().clear();
                            st = self.state();
                        }
                    }
                }
                urgent = st.space_waiters > 0
                    || st
                        .j
                        .space
                        .fill_at_least(CHECKPOINT_URGENT.0, CHECKPOINT_URGENT.1)
                    || st.checkpoint_shutdown;
                st.checkpoint_request = false;
                // A quarter of the log at most, so that when the checkpoint
                // starts (half full) newer committed transactions stay
                // behind the round and supersede some of its copies.
                round_blocks =
                    (st.j.space.capacity() as usize / 8).clamp(1, CHECKPOINT_ROUND_BLOCKS);
            }
            let (batch, later) = {
                let mut q = self.committed.lock();
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
            if let Err(e) = self.checkpoint(batch, &later, urgent) {
                self.abort(format!("checkpoint failed: {e}"));
                return;
            }
        }
    }

    /// Writes the blocks of `batch` (oldest first) home, makes them durable,
    /// advances the journal tail and forgets them.
    /// `later` maps blocks of the batch to a newer version in a committed
    /// transaction that stays in the log ([`newer_committed`]).
    pub(super) fn checkpoint(
        &self,
        batch: Vec<CommittedTxn>,
        later: &HashMap<Lba, u64>,
        urgent: bool,
    ) -> Result<()> {
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
        let mut superseded = 0u64;
        for chunk in all.chunks(CHECKPOINT_CHUNK_BLOCKS) {
            let _home = self.home_lock.write();
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
            // Runs of consecutive blocks, all zero or all data; long zero
            // runs become hole punches.
            let mut runs: Vec<(usize, usize, bool)> = Vec::new();
            let mut i = 0;
            while i < todo.len() {
                let zero = jbdev_device::is_zero(todo[i].2.bytes(bs));
                let mut j = i + 1;
                while j < todo.len()
                    && todo[j].0 == todo[j - 1].0 + 1
                    && jbdev_device::is_zero(todo[j].2.bytes(bs)) == zero
                {
                    j += 1;
                }
                // A short zero run is cheaper written as data than punched
                // (a hole punch per 4 KiB block cost more kernel time than
                // the writes under `qemu-img bench -w`, which writes zeroes).
                let punch = zero && (j - i) * bs >= ZERO_PUNCH_MIN_BYTES;
                runs.push((i, j, punch));
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
            st.j.checkpointed(last.tid, freed);

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
        s.checkpoint_blocks_skipped += superseded;
        Ok(())
    }
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
