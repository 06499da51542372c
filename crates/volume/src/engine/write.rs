//! Journaled writes: one copy into a pooled buffer, credits from the log
//! ledger, publish into the overlay and the running transaction.

use std::cell::Cell;

use super::*;

impl Engine {
    // ----- journaled writes -----------------------------------------------

    /// Applies `ops` atomically through the journal; with `fua`, returns only
    /// once they are durable. Ops are applied in order (later ones win).
    pub fn journaled(&self, ops: &[Op<'_>], fua: bool) -> Result<()> {
        match self.journal_ops(ops, false)? {
            Joined::Nothing if fua => self.flush(),
            Joined::In(tid) if fua => {
                self.wait_commit(tid)?;
                self.ack()
            }
            _ => self.ack(),
        }
    }

    /// [`Engine::journaled`] that does not wait for durability: the ops are
    /// visible when this returns and `done` runs once they are durable (at
    /// once without `fua`), or with the error that stopped them.
    pub fn journaled_then(&self, ops: &[Op<'_>], fua: bool, done: Completion) {
        match self.journal_ops(ops, false) {
            Err(e) => done(Err(e)),
            Ok(Joined::Nothing) if fua => self.flush_then(done),
            Ok(Joined::In(tid)) if fua => self.when_durable(tid, done),
            Ok(_) => done(self.ack()),
        }
    }

    /// [`Engine::journaled`] only if it needs no I/O and no wait for journal
    /// space: None (nothing changed) if it would block; else the outcome of
    /// adding `ops` to the running transaction and what durability still
    /// needs ([`Engine::complete`]). For a caller that must not block (an
    /// NBD network thread), which then hands the request to a thread that may.
    pub fn try_journaled(&self, ops: &[Op<'_>], fua: bool) -> Option<Result<Durability>> {
        match self.journal_ops(ops, true) {
            Err(e) => Some(Err(e)),
            Ok(Joined::WouldBlock) => None,
            Ok(Joined::Nothing) if fua => self.try_flush(),
            Ok(Joined::In(tid)) if fua => Some(Ok(Durability { tid: Some(tid) })),
            Ok(_) => Some(Ok(Durability { tid: None })),
        }
    }

    /// Runs `done` once `d` is satisfied (see [`Engine::try_journaled`]).
    pub fn complete(&self, d: Durability, done: Completion) {
        match d.tid {
            Some(tid) => self.when_durable(tid, done),
            None => done(self.ack()),
        }
    }

    /// Adds `ops` to the running transaction (visible to readers on return).
    /// With `nowait`, gives up (changing nothing) where it would read home
    /// (a partial block) or wait for journal space.
    fn journal_ops(&self, ops: &[Op<'_>], nowait: bool) -> Result<Joined> {
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
            return Ok(Joined::Nothing);
        }
        touched.sort_unstable();
        // Distinct blocks (ascending), and whether each is only partly written.
        let mut lbas: SmallVec<[Lba; 8]> = SmallVec::new();
        let mut partial: SmallVec<[bool; 8]> = SmallVec::new();
        for group in touched.chunk_by(|a, b| a.0 == b.0) {
            lbas.push(group[0].0);
            partial.push(!covers_block(group, self.bs));
        }
        if nowait && partial.iter().any(|&p| p) {
            return Ok(Joined::WouldBlock);
        }
        let n = lbas.len() as u64;
        if credits_for_blocks(n, self.bs) > self.max_txn_blocks {
            return Err(self.too_large(n));
        }
        let shard_ids = Overlay::shards_for_blocks(lbas.iter().copied());
        let stripe_idx = my_stripe();
        let mut conflicts = 0u32;
        // Write pacing (off unless asked for): a caller that must not block
        // leaves the pause to a thread that may.
        if nowait {
            if self.pacing() {
                return Ok(Joined::WouldBlock);
            }
        } else {
            self.pace(n);
        }
        // One copy per write: the data goes once into a pooled buffer. The
        // buffer is taken before the loop, so a write that waits for log
        // space keeps it (and its copied data) across retries. Blocks the
        // request covers whole are filled now, outside any lock; partial
        // blocks get their base under the shard locks, then the request's
        // bytes on top.
        let mut buf = self.pool.take(lbas.len());
        fill_and_seal(&mut buf, ops, &lbas, self.bs, |i| !partial[i]);
        let mut pre_read: SmallVec<[(usize, u64); 4]> = SmallVec::new();
        let mut reads_due = true;
        // Registered once this write has waited for a direct write; dropped
        // (unregistered) on return, after the copy is published.
        let mut waiting: Option<WaitingWriter<'_>> = None;
        loop {
            // Phase 1, no locks held across I/O: read home content of partial
            // blocks that have no newer copy, remembering the shard version.
            // Not again after a wait for credits: phase 2 validates the
            // versions anyway, and credits granted to the stripe can be
            // taken back by a cut while a slow home read runs — a writer
            // that re-read after every grant could go round for ever (seen
            // with the store full and the checkpoint retrying).
            for (i, &b) in lbas.iter().enumerate() {
                if !reads_due || !partial[i] {
                    continue;
                }
                let (is_home, version) = {
                    let sh = self.overlay.lock_block(b);
                    (matches!(sh.source(b, self.bs), Source::Home), sh.version)
                };
                if is_home {
                    self.read_edge(buf.block_mut(i), b)?;
                    pre_read.push((i, version));
                }
            }
            reads_due = false;
            // Credits.
            {
                let (have, need) = {
                    let s = self.stripe(stripe_idx);
                    (s.credits, stripe_charge(&s, n, self.bs))
                };
                if have < need {
                    if nowait {
                        if !self.try_reserve(stripe_idx, need - have)? {
                            return Ok(Joined::WouldBlock);
                        }
                    } else {
                        self.reserve(stripe_idx, need - have)?;
                    }
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
            // IMPORTANT: a direct write's revoke must reach the log before
            // any newer copy of its block (ARCHITECTURE 23), so a block may
            // make this write wait:
            // * its revoke waits in the running transaction: by jbd2's rule
            //   it would cancel a copy in the same transaction too, so the
            //   commit drops it — and if that transaction is later damaged,
            //   recovery puts back a copy older than the direct write.
            //   Commit the revoke first; the copy goes into the next one.
            // * a direct write in flight covers it while the log holds an
            //   older copy: its revoke is not there yet, and a copy
            //   published now would be newer, so the direct write would add
            //   no revoke for the block at all. Wait for the direct write
            //   (then the case above applies).
            let order_wait = lbas.iter().find_map(|&b| {
                let sh = &guards[guard_of(&guards, b)].1;
                if sh.map.get(&b).and_then(|e| e.tomb_tid) == Some(stripe.tid) {
                    Some(OrderWait::Commit(stripe.tid))
                } else {
                    sh.direct_over_logged(b).then_some(OrderWait::DirectWrite)
                }
            });
            if let Some(wait) = order_wait {
                drop(guards);
                drop(stripe);
                if nowait {
                    return Ok(Joined::WouldBlock);
                }
                self.stats.lock().revoke_order_waits += 1;
                match wait {
                    OrderWait::Commit(tid) => self.wait_commit(tid)?,
                    OrderWait::DirectWrite => {
                        if waiting.is_none() {
                            waiting = Some(WaitingWriter::register(self, &lbas));
                        }
                        self.wait_direct_writes(&lbas)?
                    }
                }
                reads_due = true;
                pre_read.clear();
                continue;
            }
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
                                self.read_edge(dst, b)?;
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
                reads_due = true;
                pre_read.clear();
                drop(guards);
                drop(stripe);
                continue;
            }
            // Phase 3: the request's bytes over the bases of partial blocks.
            fill_and_seal(&mut buf, ops, &lbas, self.bs, |i| partial[i]);
            // Phase 4: publish.
            let shared = buf.share();
            let tid = stripe.tid;
            for (i, &b) in lbas.iter().enumerate() {
                let gi = guard_of(&guards, b);
                let sh = &mut guards[gi].1;
                let ver = sh.bump();
                let (buf, offset) = shared.block(i);
                let data = BlockRef {
                    buf: buf.clone(),
                    offset,
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
            return Ok(Joined::In(tid));
        }
    }

    /// Waits until no direct write in flight covers a block of `lbas` that
    /// has an older copy in the log (see `journal_ops`). A direct write
    /// leaves its pending state after its home I/O (many milliseconds for
    /// the large writes that go direct), so polling every 100 us costs
    /// little. The caller is registered as waiting (`WaitingWriter`), so
    /// direct writes that arrive later over its blocks wait for it
    /// (`Engine::wait_for_waiting_writers`): it waits only for those
    /// already in flight, not for a stream of new ones.
    fn wait_direct_writes(&self, lbas: &[Lba]) -> Result<()> {
        loop {
            self.check_writable()?;
            let busy = lbas.iter().any(|&b| {
                let sh = self.overlay.lock_block(b);
                sh.direct_over_logged(b)
            });
            if !busy {
                return Ok(());
            }
            std::thread::sleep(Duration::from_micros(100));
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
    ///
    /// While the backing store is full (the checkpoint cannot take blocks
    /// home, so nothing frees log space), a writer does not wait for ever:
    /// it asks for a checkpoint attempt and fails with
    /// [`VolumeError::StoreFull`] once an attempt made after it started
    /// waiting has failed too.
    pub(super) fn reserve(&self, stripe_idx: usize, need: u64) -> Result<()> {
        let mut st = self.state();
        let mut ticket: Option<Ticket> = None;
        let max_extra = Self::max_extra_credits(&st);
        // `home_full_attempts` when this writer first saw the store full.
        let mut full_seen: Option<u64> = None;
        loop {
            let failed = if st.error.is_some() {
                Some(self.aborted_now())
            } else if st.shutdown {
                Some(VolumeError::Closed)
            } else {
                match (&st.home_full, full_seen) {
                    (Some(f), Some(seen)) if st.home_full_attempts > seen => {
                        Some(VolumeError::StoreFull {
                            reason: f.reason.clone(),
                            closing: false,
                            cause_errno: f.errno,
                        })
                    }
                    _ => None,
                }
            };
            if let Some(e) = failed {
                if let Some(t) = ticket {
                    st.j.space.abandon(t, need);
                    self.sync.space.notify_all();
                }
                return Err(e);
            }
            if let Some(grant) = st.j.space.try_grant(ticket, need, max_extra) {
                if ticket.is_some() {
                    // The next in the queue may be served now.
                    self.sync.space.notify_all();
                }
                self.granted(st, stripe_idx, grant);
                return Ok(());
            }
            if ticket.is_none() {
                ticket = Some(st.j.space.enqueue(need));
                self.stats.lock().log_space_waits += 1;
            }
            // Out of space: get the checkpoint going urgently, and commit
            // the running transaction (leading the commit ourselves if none
            // is in progress) so its blocks can be checkpointed too and the
            // stripes' unspent credits come back.
            if st.home_full.is_some() && full_seen.is_none() {
                full_seen = Some(st.home_full_attempts);
            }
            st.space_waiters += 1;
            st.checkpoint_request = true;
            self.sync.checkpoint_kick.notify_one();
            // Only if something was granted since the last cut: an empty
            // commit frees nothing, and two waiters leading empty commits
            // woke each other (publishing notifies `space`) in a loop that
            // kept the state lock from the checkpoint (found by the
            // simulator's `full` faults).
            //
            // And only if the running transaction holds something: a cut
            // of stripes that hold only credits frees no more than those,
            // and it takes back the caller's own stock — credits it was
            // just granted for this very request, and the `charged` that
            // spared it the commit block — so the request came back short
            // of credits, asked again, led another empty cut, and so on,
            // spinning on the state lock (a million empty commits a second)
            // while the checkpoint thread, which must take that lock to
            // record the failed attempt that ends the wait on a full store,
            // starved (found by the simulator, seed 0xd06f5b3a7ea1b7b8).
            if self.can_lead(&st) && st.credits_since_cut > 0 && self.running_holds_data() {
                st = self.commit_once(st, false);
            }
            let ready = ticket.is_some() && st.j.space.may_grant(ticket, need);
            if !ready && st.error.is_none() && !st.shutdown {
                self.sync
                    .space
                    .wait_for(st.inner(), Duration::from_millis(100));
            }
            st.space_waiters -= 1;
        }
    }
}

thread_local! {
    /// Pause this thread's journaled writes still owe (`Engine::pace`), in
    /// nanoseconds: sleeps are coarse, so small pauses add up until one is
    /// worth taking.
    static PACE_DEBT_NS: Cell<u64> = const { Cell::new(0) };
}

impl Engine {
    /// Reads home block `b` into `dst`: the base of a partial block of an
    /// unaligned write. Its failure says so (session 29's C ABI pass: it
    /// was a bare "io_uring readv failed", with no word that nothing was
    /// applied or that the volume stays usable).
    fn read_edge(&self, dst: &mut [u8], b: Lba) -> Result<()> {
        self.home
            .dev
            .read_at(dst, self.home_offset(b))
            .map_err(|error| VolumeError::EdgeRead {
                offset: b * self.bs as u64,
                request: "an unaligned write or zeroing",
                error,
            })
    }
}

impl Engine {
    /// Whether journaled writes are being paced now.
    pub(super) fn pacing(&self) -> bool {
        self.pace_taken().is_some()
    }

    /// The log's taken fraction (parts per thousand, at most 1000) when
    /// writes are being paced.
    fn pace_taken(&self) -> Option<u64> {
        if !self.opts.write_pacing {
            return None;
        }
        let taken = u64::from(self.hints.log_taken_permille.load(Ordering::Relaxed)).min(1000);
        (taken >= PACE_FROM_PERMILLE).then_some(taken)
    }

    /// Write pacing (`OpenOptions::write_pacing`, ARCHITECTURE 20b): above
    /// `PACE_FROM_PERMILLE` of the log taken, a journaled write of `blocks`
    /// blocks first pauses for a time per block that grows linearly to
    /// `PACE_MAX_PER_BLOCK_NS` at a full log. In steady state writers can go no faster than the checkpoint writes
    /// home; without pacing they ran at memory speed until the log was
    /// full, then all waited for a checkpoint round at once (a tail of
    /// milliseconds on a few writes, nothing on the rest). With it the log
    /// settles where the pause matches the checkpoint's rate and every
    /// write pays a little. Sleeps are taken once at least
    /// `PACE_MIN_SLEEP_NS` is owed, at most `PACE_MAX_SLEEP_NS` at a time.
    fn pace(&self, blocks: u64) {
        let Some(taken) = self.pace_taken() else {
            PACE_DEBT_NS.set(0);
            return;
        };
        let per_block =
            PACE_MAX_PER_BLOCK_NS * (taken - PACE_FROM_PERMILLE) / (1000 - PACE_FROM_PERMILLE);
        let debt = PACE_DEBT_NS.get() + blocks * per_block;
        if debt < PACE_MIN_SLEEP_NS {
            PACE_DEBT_NS.set(debt);
            return;
        }
        let want = debt.min(PACE_MAX_SLEEP_NS);
        let started = Instant::now();
        std::thread::sleep(Duration::from_nanos(want));
        let slept = started.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        PACE_DEBT_NS.set(debt.saturating_sub(slept).min(PACE_MAX_SLEEP_NS));
        let mut s = self.stats.lock();
        s.paced_writes += 1;
        s.pace_sleep_us += slept / 1000;
    }

    /// Whether the running transaction holds a block or a revoke (any
    /// stripe). Called with the state lock held (stripes rank below it).
    fn running_holds_data(&self) -> bool {
        (0..STRIPES).any(|i| {
            let s = self.stripe(i);
            !s.blocks.is_empty() || !s.revokes.is_empty()
        })
    }

    /// [`Engine::reserve`] without waiting: Ok(false) if the credits are not
    /// free right now (or writers queue for space ahead of us).
    pub(super) fn try_reserve(&self, stripe_idx: usize, need: u64) -> Result<bool> {
        let mut st = self.state();
        if st.error.is_some() {
            return Err(self.aborted_now());
        }
        if st.shutdown {
            return Err(VolumeError::Closed);
        }
        let max_extra = Self::max_extra_credits(&st);
        match st.j.space.try_grant(None, need, max_extra) {
            Some(grant) => {
                self.granted(st, stripe_idx, grant);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// A small stock of credits beyond a request's need, so the next writes
    /// of its stripe need not take the state lock; bounded so stripes cannot
    /// hoard the journal.
    fn max_extra_credits(st: &JState) -> u64 {
        (st.j.space.capacity() / (8 * STRIPES as u64)).min(64)
    }

    /// Moves `grant` credits, just taken from the ledger, to a stripe —
    /// under the state lock, so that no cut falls between the two: then
    /// `credits_since_cut == 0` means every stripe is empty (no credits, no
    /// blocks), which `reserve` relies on to skip empty commits.
    fn granted(&self, mut st: Ranked<'_, JState>, stripe_idx: usize, grant: u64) {
        st.credits_since_cut += grant;
        self.note_taken(&st);
        if st.credits_since_cut >= self.max_txn_blocks / 2 {
            self.sync.kick.notify_one();
        }
        self.stripe(stripe_idx).credits += grant;
        drop(st);
    }
}

/// What a request started without blocking still needs before it is
/// complete: nothing, or the commit of a transaction.
#[derive(Clone, Copy, Debug)]
#[must_use]
pub struct Durability {
    pub(super) tid: Option<Tid>,
}

impl Durability {
    /// Nothing to wait for.
    pub const NONE: Durability = Durability { tid: None };
}

/// What a journaled request did to the running transaction.
enum Joined {
    /// It touched no block.
    Nothing,
    /// It joined this transaction.
    In(Tid),
    /// It would have had to wait (only when asked not to): nothing changed.
    WouldBlock,
}

/// [`apply_ops`], then seals every block it filled: the log's checksum
/// and hash of each, computed here in the writer's thread while its bytes
/// are in cache, not in the commit (one thread for every writer's blocks).
fn fill_and_seal(
    buf: &mut WriteBuf,
    ops: &[Op<'_>],
    lbas: &[Lba],
    bs: usize,
    want: impl Fn(usize) -> bool,
) {
    apply_ops(buf, ops, lbas, bs, &want);
    // A request of zeroings only (write-zeroes, trim) marks the blocks it
    // covers whole: the checkpoint may punch those out of home. Not when
    // asked to keep them allocated (NO_HOLE): they are written as data. A partial
    // block keeps bytes of its old content, and a transaction that also
    // writes may have zeroes that are data: not marked.
    let zeroing = ops.iter().all(|op| {
        matches!(
            op,
            Op::Zero {
                zeroing: Zeroing::Deallocate,
                ..
            }
        )
    });
    for i in (0..lbas.len()).filter(|&i| want(i)) {
        buf.seal(i);
        if zeroing && covered_whole(ops, lbas[i], bs) {
            buf.mark_zeroed(i);
        }
    }
}

/// Whether one of `ops` covers block `b` whole.
fn covered_whole(ops: &[Op<'_>], b: Lba, bs: usize) -> bool {
    let (lo, hi) = (b * bs as u64, (b + 1) * bs as u64);
    ops.iter().any(|op| {
        let (s, e) = op.range();
        s <= lo && hi <= e
    })
}

/// Applies `ops` (in order) to the blocks `i` of `buf` for which `want(i)`;
/// `lbas` are the request's distinct blocks, ascending.
pub(super) fn apply_ops(
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

/// True if the pieces `(block, lo, hi)` of one block, sorted by `lo`,
/// cover `[0, bs)`.
pub(super) fn covers_block(pieces: &[(Lba, usize, usize)], bs: usize) -> bool {
    let mut reach = 0;
    for &(_, lo, hi) in pieces {
        if lo > reach {
            return false;
        }
        reach = reach.max(hi);
    }
    reach >= bs
}

/// A journaled writer's blocks in `Shard::waiting` while it waits for the
/// direct writes in flight over them; removed on drop.
struct WaitingWriter<'a> {
    engine: &'a Engine,
    lbas: SmallVec<[Lba; 8]>,
}

impl<'a> WaitingWriter<'a> {
    fn register(engine: &'a Engine, lbas: &[Lba]) -> Self {
        for &b in lbas {
            engine.overlay.lock_block(b).waiting.push(b);
        }
        engine.order_waiters.fetch_add(1, Ordering::SeqCst);
        WaitingWriter {
            engine,
            lbas: lbas.into(),
        }
    }
}

impl Drop for WaitingWriter<'_> {
    fn drop(&mut self) {
        for &b in &self.lbas {
            let mut sh = self.engine.overlay.lock_block(b);
            if let Some(i) = sh.waiting.iter().position(|&w| w == b) {
                sh.waiting.swap_remove(i);
            }
        }
        self.engine.order_waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a journaled write waits for so that a direct write's revoke of one
/// of its blocks reaches the log before its copy (`Engine::journal_ops`).
enum OrderWait {
    /// The commit of this transaction, which holds the revoke.
    Commit(Tid),
    /// A direct write in flight, which has yet to add the revoke.
    DirectWrite,
}
