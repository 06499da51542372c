//! Direct home writes, with revoke records for journaled copies.

use super::*;

/// Least time between two log lines about direct writes that found the
/// backing store full.
pub(super) const STORE_FULL_LOG_EVERY: Duration = Duration::from_secs(10);

/// What a direct write must make durable before it returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectSync {
    /// Nothing (a plain write: durable after a later flush).
    None,
    /// This write only (FUA, and nothing of the same request went into the
    /// journal).
    Alone,
    /// This write and the running transaction, which holds journaled parts
    /// of the same request (FUA with partial edge blocks, or zeroing).
    WithRunning,
}

impl Engine {
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
    ///
    /// `sync` says what must be durable when this returns (see
    /// [`DirectSync`]). No `data` zeroes the range, as `zeroing` says.
    pub fn direct(
        &self,
        start: Lba,
        end: Lba,
        data: Option<DirectData>,
        zeroing: Zeroing,
        sync: DirectSync,
    ) -> Result<()> {
        self.check_writable()?;
        if start >= end {
            return Ok(());
        }
        self.wait_for_waiting_writers(start, end)?;
        self.direct_under(self.home.lock.read(), start, end, data, zeroing, sync)
    }

    /// Waits while a journaled writer waits, for direct writes already in
    /// flight, to log a copy of a block of `[start, end)` (`Shard::waiting`,
    /// ARCHITECTURE 23). Registering now would make that writer wait for
    /// this write too, and a stream of overlapping direct writes could keep
    /// it waiting for ever; after it, this write's revoke follows its copy
    /// as for any older copy. Waiters wait only for direct writes that
    /// registered before them, so this wait ends. Holds no lock while it
    /// sleeps.
    fn wait_for_waiting_writers(&self, start: Lba, end: Lba) -> Result<()> {
        let mut counted = false;
        while self.order_waiters.load(Ordering::SeqCst) > 0 {
            let busy = Overlay::shards_for_range(start, end).iter().any(|&s| {
                let sh = self.overlay.lock(s);
                sh.waiting.iter().any(|&b| start <= b && b < end)
            });
            if !busy {
                break;
            }
            if !counted {
                counted = true;
                self.stats.lock().revoke_order_waits += 1;
            }
            std::thread::sleep(Duration::from_micros(100));
            self.check_writable()?;
        }
        Ok(())
    }

    /// Journal credits a direct write of `[start, end)` reserves for its
    /// revoke records.
    fn direct_charge(&self, start: Lba, end: Lba) -> u64 {
        let bound = (end - start).min(self.log.region.len_blocks() as u64 * 2);
        bound.div_ceil(RevokeBlock::capacity(self.bs) as u64) + 1
    }

    /// [`Engine::direct`] once the home lock is held (shared).
    fn direct_under(
        &self,
        home_guard: parking_lot::RwLockReadGuard<'_, ()>,
        start: Lba,
        end: Lba,
        data: Option<DirectData>,
        zeroing: Zeroing,
        sync: DirectSync,
    ) -> Result<()> {
        let data = data.map(Arc::new);
        let id = self.pending_id.fetch_add(1, Ordering::Relaxed);
        let charge = self.direct_charge(start, end);
        let stripe_idx = my_stripe();
        let shard_ids = Overlay::shards_for_range(start, end);
        // Blocks of the range with an overlay entry in shard `s`: looked up
        // block by block in the shard's pieces of a small range (a 16 MiB
        // write once hashed every block of the range for every shard),
        // found among the shard's entries for a large one.
        let pieces = (end - start < 8192).then(|| Overlay::pieces_by_shard(start, end));
        let in_range = |sh: &crate::overlay::Shard, s: usize| -> Vec<Lba> {
            if let Some(pieces) = &pieces {
                let from = pieces.partition_point(|p| p.0 < s);
                pieces[from..]
                    .iter()
                    .take_while(|p| p.0 == s)
                    .flat_map(|&(_, lo, hi)| lo..hi)
                    .filter(|b| sh.map.contains_key(b))
                    .collect()
            } else {
                sh.map
                    .keys()
                    .copied()
                    .filter(|&b| start <= b && b < end)
                    .collect()
            }
        };
        // Step 1 (the home lock is held).
        let mut shard_versions: Vec<(usize, u64)> = Vec::with_capacity(shard_ids.len());
        // Whether any block of the range has a journaled copy or a revoke
        // in the log now: copies that appear later are newer than this
        // write and need no revoke.
        let mut in_log = false;
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
                in_log = true;
            }
            shard_versions.push((s, rv));
        }
        // A FUA write of data alone, over blocks nothing in the log
        // covers, is one force-unit-access write: no revoke has to become
        // durable with it (the kernel's O_DIRECT|O_SYNC write, one device
        // round trip instead of a write, a commit and a flush).
        let durable_alone =
            sync == DirectSync::Alone && !in_log && data.is_some() && !self.home_writes_cached();
        // Step 2.
        let res = match &data {
            Some(buf) if durable_alone => self.home.dev.write_vectored_durable_at(
                &[IoSlice::new(buf)],
                self.home_offset(start),
                IoPriority::Urgent,
            ),
            // Through the page cache when there is one (ARCHITECTURE 22c):
            // durable, like the O_DIRECT write, only after a home flush.
            Some(buf) if self.home_writes_cached() => self
                .home
                .dev
                .write_cached(&[IoSlice::new(buf)], self.home_offset(start)),
            Some(buf) => self
                .home
                .dev
                .write_at(buf, self.home_offset(start), IoPriority::Urgent),
            None => {
                let (off, len) = (self.home_offset(start), (end - start) * self.bs as u64);
                match zeroing {
                    Zeroing::Deallocate => self.home.dev.write_zeroes(off, len),
                    Zeroing::KeepAllocated => self.home.dev.write_zeroes_allocated(off, len),
                }
            }
        };
        if let Err(e) = res {
            // IMPORTANT: abort while still holding the home lock. Step 1 told
            // the checkpoint to skip the journaled copies this write
            // supersedes; the write failed, so those copies are the only good
            // data. The checkpoint validates under the home lock (exclusive)
            // and stops once aborted, so it can never skip them and then move
            // the tail past them (found by the simulator: a durable FUA write
            // read back as the initial content after such a failure).
            //
            // A write that cancelled no copy (nothing of its range is in the
            // log) changed nothing the checkpoint or replay looks at: if the
            // store is only full, it fails alone and the volume goes on.
            // (Undoing `cancel_below` instead would be wrong when two
            // overlapping direct writes fail: the second cannot know what
            // the first had raised it from.)
            let store_full = !in_log && is_no_space(e.errno());
            // A trim or write-zeroes is named as such (a failed large TRIM
            // was logged as a failed write: session 31's fault pass).
            let what = if data.is_some() {
                "direct write to the home location"
            } else {
                "zeroing (trim or write-zeroes) of the home location"
            };
            if is_no_space(e.errno()) && self.abort_if_home_shrunk() {
                return Err(self.aborted_now());
            }
            if !store_full {
                self.home_write_failed(format!("{what} failed: {e}"), e.errno());
            }
            drop(home_guard);
            for &(s, _) in &shard_versions {
                let mut sh = self.overlay.lock(s);
                sh.pending.retain(|p| p.id != id);
                sh.bump();
            }
            if store_full {
                let err = VolumeError::StoreFull {
                    reason: format!("{what} failed: {e}"),
                    closing: false,
                    cause_errno: e.errno(),
                };
                self.log_store_full(&err);
                return Err(err);
            }
            return Err(e.into());
        }
        drop(home_guard);
        // Step 3 (credits first: waiting for space needs no lock of ours).
        let mut revoked = false;
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
                    revoked = true;
                }
                sh.bump();
            }
            stripe.credits -= charge;
            stripe.charged += charge;
            break;
        }
        let uncopied = matches!(data.as_deref(), Some(DirectData::Caller(..)));
        {
            let mut stats = self.stats.lock();
            stats.direct_writes += 1;
            stats.direct_writes_uncopied += u64::from(uncopied);
        }
        self.home.written_gen.fetch_add(1, Ordering::AcqRel);
        // The pending entries are gone: unless a reader still holds it for a
        // moment, the buffer is ours again and the next large write reuses it.
        if let Some(DirectData::Engine(buf)) = data.and_then(|d| Arc::try_unwrap(d).ok()) {
            self.recycle_direct_buf(buf);
        }
        // IMPORTANT: a revoke added after all (a racing writer made a copy
        // and a racing direct write cancelled it) must be durable before the
        // ack like any other: then flush as a plain FUA direct write does.
        match sync {
            DirectSync::None => {}
            DirectSync::Alone if durable_alone && !revoked => {}
            DirectSync::Alone | DirectSync::WithRunning => self.flush()?,
        }
        self.ack()
    }

    /// Logs a direct write's [`VolumeError::StoreFull`], at most once per
    /// [`STORE_FULL_LOG_EVERY`] (a bulk copy meets it on every request).
    fn log_store_full(&self, e: &VolumeError) {
        if let Some(held) = self.store_full_log.pass(Instant::now()) {
            let more = self.store_full_log.held_note(held, "such write(s)");
            tracing::error!("a write failed: {e}{more}");
        }
    }

    /// Whether a direct write can go home from the caller's own buffer at
    /// `data` (no copy): through the page cache any address will do, an
    /// `O_DIRECT` write needs an aligned one.
    pub(crate) fn takes_caller_buf(&self, data: *const u8) -> bool {
        self.home_writes_cached() || AlignedBuf::is_aligned(data, jbdev_device::MAX_ALIGN)
    }

    /// Whether direct writes go through the page cache (`write_cache` on a
    /// device with a buffered descriptor: ARCHITECTURE 22c).
    pub(crate) fn home_writes_cached(&self) -> bool {
        self.opts.write_cache && self.home.dev.has_write_cache()
    }

    /// An aligned buffer of `len` bytes for the aligned middle of a large
    /// write (contents unspecified: the caller overwrites all of it). Large
    /// buffers are reused: a fresh 16 MiB allocation costs more in page
    /// faults and zeroing (measured: 8.8-9.1 ms) than writing it to the
    /// device, and makes one 16 MiB write slower than sixteen 1 MiB ones.
    pub fn direct_buf(&self, len: usize) -> AlignedBuf {
        let mut kept = self.home.direct_bufs.lock();
        match kept.iter().position(|b| b.len() == len) {
            Some(i) => kept.swap_remove(i),
            None => {
                drop(kept);
                AlignedBuf::zeroed(len)
            }
        }
    }

    /// Keeps a large buffer for reuse: at most [`DIRECT_BUFS_KEPT`] of them
    /// and [`DIRECT_BUFS_BYTES`] in all (the oldest goes first); small
    /// buffers are cheap to allocate and are not kept.
    pub(super) fn recycle_direct_buf(&self, buf: AlignedBuf) {
        if buf.len() < DIRECT_BUF_MIN_BYTES || buf.len() > DIRECT_BUFS_BYTES {
            return;
        }
        let mut kept = self.home.direct_bufs.lock();
        kept.push(buf);
        while kept.len() > DIRECT_BUFS_KEPT
            || kept.iter().map(|b| b.len()).sum::<usize>() > DIRECT_BUFS_BYTES
        {
            kept.remove(0);
        }
    }
}
