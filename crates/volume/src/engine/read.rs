//! Reads: consistent views of journaled and home blocks.

use std::io::IoSliceMut;

use super::*;

/// Reads from home of at least this many bytes yield to commits in flight.
const BULK_READ_BYTES: usize = 256 << 10;
/// Piece size of a bulk read (see [`Engine::read_home_runs_yielding`]).
const BULK_READ_CHUNK_BYTES: usize = 128 << 10;
/// How recently a sync commit must have started for bulk reads to go out
/// in pieces.
const SYNC_ACTIVE_WINDOW_US: u64 = 5_000;
/// Longest a bulk read waits for commits in flight.
const BULK_READ_MAX_YIELD: Duration = Duration::from_millis(2);

impl Engine {
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
            let guards = self.lock_shards(&shard_ids);
            self.resolve_blocks(lba, out, &guards, &mut home_runs);
            if home_runs.is_empty() {
                return Ok(());
            }
            if locked {
                self.read_home_runs(lba, out, &home_runs)?;
                drop(guards);
                self.stats.lock().locked_reads += 1;
                return Ok(());
            }
            let versions: SmallVec<[u64; 8]> = guards.iter().map(|(_, g)| g.version).collect();
            drop(guards);
            self.read_home_runs_yielding(lba, out, &home_runs)?;
            if self.versions_unchanged(&shard_ids, &versions) {
                return Ok(());
            }
            self.stats.lock().read_retries += 1;
        }
        unreachable!("the locked attempt always returns")
    }

    /// Reads `runs` from home like [`Engine::read_home_runs`], giving way
    /// to sync writers. A stream of large reads queued ahead of a commit
    /// makes every durable write wait behind them (the trade the kernel's
    /// I/O schedulers make for synchronous writes), so while sync writers
    /// are active (a commit somebody waits for started within
    /// [`SYNC_ACTIVE_WINDOW_US`]) a bulk read (at least [`BULK_READ_BYTES`]
    /// from home) goes out in pieces of [`BULK_READ_CHUNK_BYTES`] and,
    /// before each piece, waits while such a commit is on the device: a
    /// commit then waits behind at most one piece. Otherwise the read goes
    /// out whole (pieces one after another would multiply its latency
    /// behind background writeback). Small reads never wait; a bulk read
    /// waits at most [`BULK_READ_MAX_YIELD`] in all, so it always
    /// progresses.
    fn read_home_runs_yielding(
        &self,
        lba: Lba,
        out: &mut [u8],
        runs: &[(usize, usize)],
    ) -> Result<()> {
        let bs = self.bs;
        let blocks: usize = runs.iter().map(|&(_, n)| n).sum();
        if blocks * bs < BULK_READ_BYTES {
            return self.read_home_runs(lba, out, runs);
        }
        let until = Instant::now() + BULK_READ_MAX_YIELD;
        let mut yielded = false;
        let piece = (BULK_READ_CHUNK_BYTES / bs).max(1);
        for &(s, len) in runs {
            let mut done = 0;
            while done < len {
                let n = if self.sync_writers_active() {
                    while self.hints.sync_commits_in_io.load(Ordering::Acquire) > 0
                        && Instant::now() < until
                    {
                        yielded = true;
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    piece.min(len - done)
                } else {
                    len - done
                };
                self.read_home_blocks(lba, out, s + done, n)?;
                done += n;
            }
        }
        if yielded {
            self.stats.lock().bulk_read_yields += 1;
        }
        Ok(())
    }

    /// Whether a commit somebody waits for is on the device or started
    /// within [`SYNC_ACTIVE_WINDOW_US`].
    fn sync_writers_active(&self) -> bool {
        let last = self.hints.last_sync_commit_us.load(Ordering::Acquire);
        self.hints.sync_commits_in_io.load(Ordering::Acquire) > 0
            || (last != 0 && self.micros_since_born().saturating_sub(last) < SYNC_ACTIVE_WINDOW_US)
    }

    /// Microseconds since the engine was created, plus one (0 in
    /// `last_sync_commit_us` means no sync commit yet).
    pub(super) fn micros_since_born(&self) -> u64 {
        self.hints.born.elapsed().as_micros() as u64 + 1
    }

    /// [`Engine::read_blocks`] only if no device I/O is needed: every block
    /// comes from the overlay or from the home device's cache
    /// (`BlockDevice::try_read_cached`). One optimistic attempt; false (with
    /// `out` unspecified) if anything would block or changed meanwhile.
    pub fn try_read_blocks(&self, lba: Lba, out: &mut [u8]) -> Result<bool> {
        let n = out.len() / self.bs;
        let shard_ids = Overlay::shards_for_range(lba, lba + n as u64);
        let mut home_runs: HomeRuns = SmallVec::new();
        let guards = self.lock_shards(&shard_ids);
        self.resolve_blocks(lba, out, &guards, &mut home_runs);
        if home_runs.is_empty() {
            return Ok(true);
        }
        let versions: SmallVec<[u64; 8]> = guards.iter().map(|(_, g)| g.version).collect();
        drop(guards);
        let bs = self.bs;
        for &(s, len) in &home_runs {
            let buf = &mut out[s * bs..(s + len) * bs];
            let at = self.home_offset(lba + s as u64);
            if !self
                .home
                .dev
                .try_read_cached(&mut [IoSliceMut::new(buf)], at)?
            {
                return Ok(false);
            }
        }
        Ok(self.versions_unchanged(&shard_ids, &versions))
    }

    /// Locks the shards `ids` (ascending), as a read resolves its range.
    fn lock_shards(&self, ids: &[usize]) -> ShardGuards<'_> {
        ids.iter().map(|&s| (s, self.overlay.lock(s))).collect()
    }

    /// Whether no shard of `ids` changed since it showed `versions`.
    fn versions_unchanged(&self, ids: &[usize], versions: &[u64]) -> bool {
        ids.iter()
            .zip(versions)
            .all(|(&s, &v)| self.overlay.lock(s).version == v)
    }

    /// Copies every block of `[lba, ..)` that has a newer copy than home
    /// into `out`; lists the runs that must come from home.
    pub(super) fn resolve_blocks(
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

    pub(super) fn read_home_runs(
        &self,
        lba: Lba,
        out: &mut [u8],
        runs: &[(usize, usize)],
    ) -> Result<()> {
        for &(s, len) in runs {
            self.read_home_blocks(lba, out, s, len)?;
        }
        Ok(())
    }

    /// Reads blocks `[first, first + n)` of a read starting at `lba` from
    /// home into their place in `out`.
    fn read_home_blocks(&self, lba: Lba, out: &mut [u8], first: usize, n: usize) -> Result<()> {
        let bs = self.bs;
        self.home.dev.read_at(
            &mut out[first * bs..(first + n) * bs],
            self.home_offset(lba + first as u64),
        )?;
        Ok(())
    }
}
