//! Group commit: waiting, leading, batching, cutting, writing and
//! publishing transactions in order.

use super::*;

impl Engine {
    /// Whether a new commit may start now: nobody is cutting, fewer than
    /// `pipeline_depth` commits are in flight, no error, not shut down.
    pub(super) fn can_lead(&self, st: &JState) -> bool {
        !st.cutting && st.j.has_room() && st.error.is_none() && !st.shutdown
    }

    /// The background size trigger: the running transaction holds half a
    /// transaction's worth of credits.
    fn sized(&self, st: &JState) -> bool {
        st.credits_since_cut >= self.max_txn_blocks / 2
    }

    /// The background age trigger: the running transaction is older than
    /// `commit_interval`.
    fn aged(&self, st: &JState) -> bool {
        st.running_created.elapsed() >= self.opts.commit_interval
    }

    /// Commits that may be in flight at once.
    pub fn pipeline_depth(&self) -> u32 {
        self.state().j.depth()
    }

    pub(super) fn slot(tid: Tid) -> usize {
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
            return Err(self.aborted_now());
        }
        if st.j.committed() >= tid {
            return Ok(());
        }
        self.register_sync_waiter(&mut st, tid);
        while st.j.committed() < tid && st.error.is_none() {
            if tid == st.j.running() && self.can_lead(&st) {
                st = self.commit_once(st, true);
                continue;
            }
            self.sync.done[Self::slot(tid)].wait(st.inner());
        }
        st.sync_waiters -= 1;
        if st.j.committed() >= tid && st.error.is_none() {
            Ok(())
        } else {
            Err(self.aborted_now())
        }
    }

    /// Counts a sync request for transaction `tid` (a sleeping thread or a
    /// completion) for the batching policy, and wakes a batching leader if
    /// that completes its batch. Only the arrival that completes the batch
    /// wakes it (its exit condition): a wake-up per arrival costs a context
    /// switch each, which on a small machine eats the time batching saves.
    fn register_sync_waiter(&self, st: &mut JState, tid: Tid) {
        st.sync_waiters += 1;
        st.want_commit = st.want_commit.max(tid);
        st.sync_peak = st.sync_peak.max(st.sync_waiters);
        if tid == st.j.running() {
            st.running_waiters += 1;
            if st.running_first_sync.is_none() {
                st.running_first_sync = Some(Instant::now());
            }
        }
        if st.running_waiters >= Self::batch_target(st) {
            self.sync.joined.notify_one();
        }
    }

    /// [`Engine::wait_commit`] without waiting: `done` runs once transaction
    /// `tid` is committed (with the error if the journal aborts first).
    ///
    /// The caller counts as a sync waiter for the batching policy, like a
    /// thread in `wait_commit`, but never leads: the commit thread commits
    /// for completions, so a thread that has many requests in flight (an
    /// NBD worker) never sits out a batching wait or a commit's I/O.
    pub fn when_durable(&self, tid: Tid, done: Completion) {
        let mut st = self.state();
        if st.error.is_some() || st.j.committed() >= tid {
            drop(st);
            return done(self.ack());
        }
        if st.shutdown {
            // The commit thread may be gone: commit in place.
            drop(st);
            return done(self.wait_commit(tid).and_then(|()| self.ack()));
        }
        st.async_want = st.async_want.max(tid);
        st.durable_cbs.push((tid, done));
        self.register_sync_waiter(&mut st, tid);
        // Only the first completion of a transaction finds the commit thread
        // free to lead (it then holds `cutting`): one wake-up per commit.
        if tid == st.j.running() && self.can_lead(&st) {
            self.sync.kick.notify_one();
        }
    }

    /// Runs the completions whose outcome is known, without the state lock;
    /// returns with the lock held again.
    pub(super) fn run_due<'a>(&'a self, mut st: Ranked<'a, JState>) -> Ranked<'a, JState> {
        if st.cbs_due.is_empty() {
            return st;
        }
        let due = std::mem::take(&mut st.cbs_due);
        drop(st);
        for done in due {
            let outcome = self.ack();
            // A callback's panic is its owner's bug: it must not end the
            // thread that runs everybody's completions (the commit thread,
            // or a writer leading a commit). The panic hook has printed it.
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || done(outcome)));
            if res.is_err() {
                tracing::error!("a completion callback panicked; ignored");
            }
        }
        self.state()
    }

    /// Makes every write that returned before this call durable.
    pub fn flush(&self) -> Result<()> {
        self.check_writable()?;
        let tid = self.state().j.running();
        self.wait_commit(tid)?;
        self.flush_home()?;
        self.ack()
    }

    /// [`Engine::flush`] only if it needs no I/O on this thread (no direct
    /// home write waits for a home flush): what it waits for, to pass to
    /// [`Engine::complete`]; None if it would block.
    pub fn try_flush(&self) -> Option<Result<Durability>> {
        if let Err(e) = self.check_writable() {
            return Some(Err(e));
        }
        let written = self.home.written_gen.load(Ordering::Acquire);
        if written > self.home.flushed_gen.load(Ordering::Acquire) {
            return None;
        }
        Some(Ok(Durability {
            tid: Some(self.state().j.running()),
        }))
    }

    /// [`Engine::flush`] reporting to `done` instead of waiting.
    pub fn flush_then(&self, done: Completion) {
        if let Err(e) = self.check_writable().and_then(|()| self.flush_home()) {
            return done(Err(e));
        }
        let tid = self.state().j.running();
        self.when_durable(tid, done);
    }

    /// Direct writes bypass the journal: flushes the home device if any
    /// completed that no finished flush covers. (A flag cleared by one
    /// flusher would let a second one return before the first's device
    /// flush finished.)
    fn flush_home(&self) -> Result<()> {
        let written = self.home.written_gen.load(Ordering::Acquire);
        if written > self.home.flushed_gen.load(Ordering::Acquire) {
            if let Err(e) = self.home.flusher.flush(self.home.dev.as_ref()) {
                self.home_write_failed(format!("flush of the home device failed: {e}"), e.errno());
                return Err(e.into());
            }
            self.home.flushed_gen.fetch_max(written, Ordering::AcqRel);
        }
        Ok(())
    }

    // ----- commit thread --------------------------------------------------

    /// Locks every stripe, takes what they hold and starts transaction `tid + 1`.
    pub(super) fn cut(&self, tid: Tid) -> Cut {
        let mut guards: SmallVec<[_; STRIPES]> = (0..STRIPES).map(|i| self.stripe(i)).collect();
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
    pub(super) fn batch_target(st: &JState) -> u32 {
        (st.sync_population * 3).div_ceil(4).max(2)
    }

    pub(super) fn batch_deadline(&self, st: &JState) -> Option<Instant> {
        let multi = st.sync_waiters > 1 || st.last_batch_waiters > 1;
        match self.opts.batch_policy {
            BatchPolicy::None => None,
            BatchPolicy::Fixed(d) if multi => Some(Instant::now() + d),
            BatchPolicy::Fixed(_) => None,
            BatchPolicy::Adaptive if multi => {
                // A wait pays where it is short next to the commit whose
                // fixed cost it shares out (a slow flush); where the
                // released writers take about as long to rejoin as a
                // commit takes (a fast device, the CPUs busy running
                // them), committing at once and letting them join the next
                // commit keeps the device busy instead (measured on ram at
                // 32 writers: waiting cost 8-24% against no wait). Every
                // BATCH_PROBE_EVERY-th commit waits anyway, to keep the
                // measure current.
                if st.avg_batch_wait_ns * BATCH_WAIT_PAYS > st.avg_commit_ns
                    && st.batch_waits_skipped < BATCH_PROBE_EVERY
                {
                    return None;
                }
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
            let timed = self.aged(&st);
            let sized = self.sized(&st);
            // A sync request nobody leads (a leader that hit shutdown).
            let orphan = st.want_commit >= st.j.running() && st.shutdown;
            // Completions are led here (see `when_durable`).
            let completions = st.async_want >= st.j.running();
            let drain = st.shutdown;
            // Only commits somebody waits for overlap one in flight: a
            // background commit (age or size) waits until the log is idle.
            // Overlapping them split the stream of plain writes into more,
            // smaller commits for nobody's benefit (mixed-iops on ram lost
            // 13% of its IOPS at depth 2).
            let urgent = completions || orphan || drain;
            if !(self.can_lead(&st) || (drain && !st.cutting && st.j.has_room()))
                || st.error.is_some()
                || !(timed || sized || urgent)
                || !(urgent || st.j.in_flight() == 0)
            {
                // An age trigger already due but held back by a commit in
                // flight is kicked when that commit publishes; the fallback
                // timeout only bounds a missed kick (never a busy loop).
                let due = st.running_created + self.opts.commit_interval;
                let now = Instant::now();
                let deadline = if due > now {
                    due
                } else {
                    now + self.opts.commit_interval
                };
                self.sync.kick.wait_until(st.inner(), deadline);
                continue;
            }
            let tid = st.j.running();
            st = self.commit_once(st, completions);
            if drain && st.j.committed() >= tid && st.last_cut_empty {
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
    pub(super) fn commit_once<'a>(
        &'a self,
        mut st: Ranked<'a, JState>,
        sync: bool,
    ) -> Ranked<'a, JState> {
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
            let adaptive = self.opts.batch_policy == BatchPolicy::Adaptive;
            match self.batch_deadline(&st) {
                Some(deadline) => {
                    let began = Instant::now();
                    while Instant::now() < deadline
                        && !(adaptive && st.running_waiters >= Self::batch_target(&st))
                        && !st.shutdown
                        && st.error.is_none()
                    {
                        self.sync.joined.wait_until(st.inner(), deadline);
                    }
                    if adaptive {
                        let ns = began.elapsed().as_nanos().min(u64::MAX as u128) as u64;
                        st.avg_batch_wait_ns = if st.avg_batch_wait_ns == 0 {
                            ns
                        } else {
                            (st.avg_batch_wait_ns * 3 + ns) / 4
                        };
                        st.batch_waits_skipped = 0;
                    }
                }
                None if adaptive => st.batch_waits_skipped += 1,
                None => {}
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
        let tid = st.j.running();
        let waiters = st.running_waiters;
        st.running_waiters = 0;
        st.sync_population = st.sync_peak;
        st.sync_peak = st.sync_waiters;
        let started = Instant::now();
        let (blocks, revokes, charged, unspent) = self.cut(tid);
        st.j.space.give_back(unspent);
        self.note_taken(&st);
        st.running_created = started;
        st.running_first_sync = None;
        st.credits_since_cut = 0;
        let empty = blocks.is_empty() && revokes.is_empty();
        st.last_cut_empty = empty;
        st.cutting = false;
        let planned = if empty {
            let cut = st.j.cut(None);
            debug_assert_eq!(cut.tid, tid);
            None
        } else {
            let (newest, revoke_list) = resolve(blocks, revokes);
            let k = writer::transaction_blocks(self.bs, newest.len(), revoke_list.len());
            let cut = st.j.cut(Some(k));
            debug_assert_eq!(cut.tid, tid);
            let at = cut.placement.expect("laid out");
            let layout = Layout {
                sequence: at.sequence,
                head: at.head,
                overlap: cut.overlap,
            };
            Some((newest, revoke_list, layout))
        };
        if waiters > 0 {
            st.last_batch_waiters = waiters;
        }
        // Hand the lead: a waiter of the next transaction may start its
        // commit now, while ours is written (pipelining).
        self.hand_lead(&st);
        let outcome = match planned {
            None => {
                // No block was written: the cut's credits return at once.
                st.j.space.give_back(charged);
                self.note_taken(&st);
                Outcome::Empty
            }
            Some((newest, revoke_list, layout)) => {
                drop(st);
                // Phase 3. Bulk reads hold back while a commit somebody
                // waits for is on the device (see `Engine::read_home_runs_yielding`).
                let urgent = waiters > 0;
                if urgent {
                    self.hints.sync_commits_in_io.fetch_add(1, Ordering::AcqRel);
                    self.hints
                        .last_sync_commit_us
                        .fetch_max(self.micros_since_born(), Ordering::AcqRel);
                }
                // A panic here (a bug) must not leave the transaction in
                // flight for ever: its waiters, the next leader and close
                // would wait on it. It fails the commit like an I/O error.
                let res = contain_panic("journal commit", || {
                    self.write_commit(tid, &layout, newest, revoke_list, charged)
                });
                if urgent {
                    self.hints.sync_commits_in_io.fetch_sub(1, Ordering::AcqRel);
                }
                st = self.state();
                match res {
                    Ok(mut txn) => {
                        txn.elapsed = started.elapsed();
                        Outcome::Written(txn)
                    }
                    Err(e) => {
                        // The journal's failure (a failed home flush before
                        // revokes was noted as the home's, and vetoes the
                        // salvage): what was committed before it is written
                        // home from memory (`Engine::salvage`).
                        self.note_journal_failed();
                        // IMPORTANT: recorded under the same lock hold that
                        // ends the commit, before anything could publish past it.
                        self.record_abort(
                            &mut st,
                            AbortCause::Failed(format!("journal commit failed: {e}"), e.errno()),
                        );
                        Outcome::Failed
                    }
                }
            }
        };
        // Phase 4.
        st.j.finish(tid, outcome);
        self.publish_ready(&mut st);
        self.run_due(st)
    }

    /// Publishes, in tid order, every finished transaction whose
    /// predecessors are all published: `committed_tid`, log space, the
    /// checkpoint queue, statistics; wakes their waiters.
    pub(super) fn publish_ready(&self, st: &mut JState) {
        // After an error the journal publishes nothing (`Journal::fail`).
        while let Some((tid, txn)) = st.j.publish_next() {
            if let Some(txn) = txn {
                let ns = txn.elapsed.as_nanos().min(u64::MAX as u128) as u64;
                st.avg_commit_ns = if st.avg_commit_ns == 0 {
                    ns
                } else {
                    (st.avg_commit_ns * 3 + ns) / 4
                };
                st.last_published = Instant::now();
                {
                    let mut s = self.stats.lock();
                    s.commits += 1;
                    s.data_blocks += txn.blocks.len() as u64;
                    s.log_blocks += txn.log_blocks;
                    let _ = s
                        .commit_latency_us
                        .record((txn.elapsed.as_micros() as u64).max(1));
                }
                self.log.committed.lock().push_back(txn);
                if st
                    .j
                    .space
                    .fill_at_least(CHECKPOINT_START.0, CHECKPOINT_START.1)
                {
                    self.sync.checkpoint_kick.notify_one();
                }
            }
            self.sync.done[Self::slot(tid)].notify_all();
        }
        self.note_taken(st);
        if !st.durable_cbs.is_empty() && st.error.is_none() {
            let mut i = 0;
            while i < st.durable_cbs.len() {
                if st.durable_cbs[i].0 <= st.j.committed() {
                    let (_, done) = st.durable_cbs.swap_remove(i);
                    st.cbs_due.push(done);
                    st.sync_waiters -= 1;
                } else {
                    i += 1;
                }
            }
        }
        if st.error.is_some() {
            self.wake_all_waiters();
            return;
        }
        // Hand the lead to one waiter of the running transaction, if any.
        self.hand_lead(st);
        // The commit thread only has work here if a size or age trigger or
        // the drain was held back by the commit in flight. Waking it after
        // every commit cost a context switch per commit: 14% of the CPU of
        // a lone syncing writer.
        if self.sized(st) || st.shutdown || (st.credits_since_cut > 0 && self.aged(st)) {
            self.sync.kick.notify_one();
        }
        if st.space_waiters > 0 {
            self.sync.space.notify_all();
        }
    }

    /// Lets the next commit start if somebody wants it and it may: one
    /// sleeping waiter of the running transaction leads it, or — for
    /// completions — the commit thread.
    fn hand_lead(&self, st: &JState) {
        if st.want_commit >= st.j.running() && self.can_lead(st) {
            self.sync.done[Self::slot(st.j.running())].notify_one();
            if st.async_want >= st.j.running() {
                self.sync.kick.notify_one();
            }
        }
    }

    pub(super) fn wake_all_waiters(&self) {
        self.sync.done.iter().for_each(|c| {
            c.notify_all();
        });
        self.sync.space.notify_all();
        self.sync.kick.notify_all();
    }

    pub(super) fn write_commit(
        &self,
        tid: Tid,
        layout: &Layout,
        newest: Vec<(Lba, u64, BlockRef)>,
        revoke_list: Vec<Lba>,
        charged: u64,
    ) -> Result<CommittedTxn> {
        #[cfg(test)]
        if self.panic_next_commit.swap(false, Ordering::AcqRel) {
            panic!("injected panic in a commit (test)");
        }
        let (sequence, head) = (layout.sequence, layout.head);
        let bs = self.bs;
        let mut builder = self.log.builders.lock().pop().unwrap_or_default();
        let log: Vec<LogBlock<'_>> = builder.build(
            &self.log.params,
            writer::TxnHead {
                sequence,
                overlap: layout.overlap,
                now: SystemTime::now(),
            },
            newest.len(),
            |i| (newest[i].0, newest[i].2.bytes(bs), newest[i].2.sums(bs)),
            &revoke_list,
        );
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
        let len = self.log.region.len_blocks();
        if !revoke_list.is_empty() {
            // IMPORTANT: revokes protect data that direct writes put home;
            // that data must be durable before a revoke can be.
            self.home
                .flusher
                .flush(self.home.dev.as_ref())
                .inspect_err(|_| self.note_home_failed())?;
        }
        if layout.overlap > 0 {
            // IMPORTANT: written while older commits are still on the device
            // (pipelining). Safe because (a) commits are acknowledged strictly
            // in order (`publish_ready`), so this one is never reported
            // durable before its predecessors are, and (b) its commit block
            // records the overlap, so recovery does not read it as proof that
            // a torn predecessor was once complete (torn tail, not damage).
            // Each commit stays one FUA write: no second flush.
            self.stats.lock().chained_commits += 1;
        }
        let end_pos = {
            match self.opts.commit_mode {
                CommitMode::SingleFlush => {
                    // IMPORTANT: one force-unit-access write (RWF_DSYNC) of
                    // every block of the transaction: durable when it
                    // returns, with no separate flush round trip. Torn
                    // commits are still caught by the block checksums and
                    // the data digest.
                    writer::write_log_blocks(
                        &self.log.region,
                        self.log.first,
                        head,
                        &log,
                        &prio,
                        true,
                    )?
                }
                CommitMode::TwoFlush => {
                    let (body, commit) = log.split_at(log.len() - 1);
                    let mid = writer::write_log_blocks(
                        &self.log.region,
                        self.log.first,
                        head,
                        body,
                        &prio,
                        false,
                    )?;
                    self.log.region.flush()?;
                    let end = writer::write_log_blocks(
                        &self.log.region,
                        self.log.first,
                        mid,
                        commit,
                        &|| IoPriority::Urgent,
                        false,
                    )?;
                    self.log.region.flush()?;
                    end
                }
            }
        };
        // The layout fixed at the cut is what was written.
        debug_assert_eq!(
            end_pos,
            writer::advance(head, log.len(), self.log.first, len)
        );
        builder.recycle(log);
        self.log.builders.lock().push(builder);
        Ok(CommittedTxn {
            tid,
            sequence,
            start_pos: head,
            log_blocks: k,
            charged,
            blocks: newest,
            revokes: revoke_list,
            elapsed: Duration::ZERO,
        })
    }
}

/// Adaptive batching waits only while its waits average less than
/// `1 / BATCH_WAIT_PAYS` of a commit's time.
const BATCH_WAIT_PAYS: u64 = 2;

/// Commits without a wait, at most, before one waits again to measure.
const BATCH_PROBE_EVERY: u32 = 16;

/// Newest version per block (in block order), and the revokes that still
/// apply (in block order): a journaled copy newer than a revoke cancels the
/// revoke; an older one is dropped (the direct write superseded it).
/// Works in place on the cut's list, which becomes the transaction's.
pub(super) fn resolve<R>(
    mut blocks: Vec<(Lba, u64, R)>,
    mut revokes: Vec<(Lba, u64)>,
) -> (Vec<(Lba, u64, R)>, Vec<Lba>) {
    // Per block, newest version first; keep only that one.
    blocks.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    blocks.dedup_by(|later, kept| later.0 == kept.0);
    if revokes.is_empty() {
        return (blocks, Vec::new());
    }
    revokes.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    revokes.dedup_by(|later, kept| later.0 == kept.0);
    let mut kept = Vec::with_capacity(revokes.len());
    let mut dropped = false;
    for (b, rv) in revokes {
        match blocks.binary_search_by(|e| e.0.cmp(&b)) {
            Ok(i) if blocks[i].1 > rv => {}
            Ok(i) => {
                // Marked here, removed below (keeps the search valid;
                // versions count writes and never reach u64::MAX).
                blocks[i].1 = u64::MAX;
                dropped = true;
                kept.push(b);
            }
            Err(_) => kept.push(b),
        }
    }
    if dropped {
        blocks.retain(|e| e.1 != u64::MAX);
    }
    (blocks, kept)
}

#[cfg(test)]
mod tests {
    use super::resolve;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// The rule, written the obvious way (the engine's first version).
    fn model(
        blocks: &[(u64, u64, u32)],
        revokes: &[(u64, u64)],
    ) -> (Vec<(u64, u64, u32)>, Vec<u64>) {
        let mut newest: BTreeMap<u64, (u64, u32)> = BTreeMap::new();
        for &(b, v, r) in blocks {
            if newest.get(&b).is_none_or(|(old, _)| *old < v) {
                newest.insert(b, (v, r));
            }
        }
        let mut rev: BTreeMap<u64, u64> = BTreeMap::new();
        for &(b, v) in revokes {
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
        (
            newest.into_iter().map(|(b, (v, r))| (b, v, r)).collect(),
            rev.into_keys().collect(),
        )
    }

    proptest! {
        #[test]
        fn resolve_keeps_the_newest_copy_and_the_revokes_that_win(
            writes in proptest::collection::vec((0u64..40, any::<u32>()), 0..120),
            revs in proptest::collection::vec((0u64..40, 0usize..150), 0..40),
        ) {
            // Versions are unique and grow with arrival, as in the engine.
            let blocks: Vec<(u64, u64, u32)> = writes
                .iter()
                .enumerate()
                .map(|(i, &(b, r))| (b, 2 * i as u64 + 1, r))
                .collect();
            let revokes: Vec<(u64, u64)> = revs.iter().map(|&(b, at)| (b, 2 * at as u64)).collect();
            let got = resolve(blocks.clone(), revokes.clone());
            prop_assert_eq!(got, model(&blocks, &revokes));
        }
    }
}
