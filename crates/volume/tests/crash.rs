//! Crash-consistency tests of the volume (issue 2, "Tests: crash consistency").
//!
//! The contract checked is stated in `common/mod.rs`. In short: acknowledged
//! data is durable after a FUA write or a later-called flush returns;
//! journaled writes and transactions are all-or-nothing and persist in each
//! thread's order; nothing else changes; direct writes, trims and large
//! write_zeroes are per-sector old-or-new until durable.
//!
//! Method (after redb's crash backend and tigerbeetle's exhaustive recovery
//! tests): run a seeded workload on a [`FaultDevice`] that loses power after
//! a chosen number of mutating ops, then take several *crash images* (every
//! unflushed device write dropped, kept or torn per sector, chosen by seed),
//! recover each with `Volume::open_device` and compare it with the model.
//! A *crash point* is one recovered image verified; identical images of one
//! run are verified once. Recovery itself is crashed too and recovered again.
//!
//! Env vars: `JBDEV_CRASH_KEEP_GOING=1` reports every failing case instead
//! of stopping at the first; `JBDEV_CRASH_SOAK=<cases>` runs that many random cases per
//! randomized test (default: enough for ≥ 10,000 crash points in all);
//! `JBDEV_CRASH_SEED=<seed>` replays one case (the failure message prints it).
//! Thread interleavings are not reproducible, so a replay re-runs the same
//! workload and crash op count, not the same schedule: replay in a loop.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use jbdev_device::fault::{CrashOdds, FaultDevice};
use jbdev_volume::{BatchPolicy, CommitMode, OpenOptions, Volume, VolumeError, WriteFlags};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Data area of every crash-test volume.
const DATA_BYTES: u64 = 256 * 1024;
/// Crash op counts are drawn from `0..=OPS_PER_OP_ESTIMATE * workload ops`;
/// a draw past the real total makes a "crash at the end" case. A constant
/// (not learned during the run) so that a seed replays the same crash point.
const OPS_PER_OP_ESTIMATE: u64 = 4;
/// Per-case time limit (a hang fails the test with the seed).
const CASE_LIMIT: Duration = Duration::from_secs(60);

/// Which op mix a workload uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mix {
    /// Only journaled ops: checked with the prefix (order + atomicity) model.
    Journaled,
    /// Direct writes, trims and large write_zeroes mixed in: checked per sector.
    Direct,
}

/// Everything a case is derived from.
#[derive(Clone, Debug)]
struct CaseParams {
    seed: u64,
    mix: Mix,
    threads: usize,
    ops_per_thread: usize,
    journal_bytes: u64,
    policy: BatchPolicy,
    commit_mode: CommitMode,
    commit_interval: Duration,
    direct_threshold: u64,
    /// `None`: run to the end, then cut power.
    crash_after: Option<u64>,
}

impl CaseParams {
    fn random(seed: u64, mix: Mix, ops_estimate: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let threads = rng.gen_range(2..=6);
        let ops_per_thread = rng.gen_range(6..=30);
        let journal_bytes = if rng.gen_bool(0.5) { 64 } else { 128 } * 1024;
        let policy = match rng.gen_range(0..10) {
            0..=5 => BatchPolicy::None,
            6..=8 => BatchPolicy::Adaptive,
            _ => BatchPolicy::Fixed(Duration::from_micros(50)),
        };
        let commit_mode = if rng.gen_bool(0.25) {
            CommitMode::TwoFlush
        } else {
            CommitMode::SingleFlush
        };
        let commit_interval = match rng.gen_range(0..3) {
            0 => Duration::from_millis(1),
            1 => Duration::from_millis(20),
            _ => Duration::from_secs(5),
        };
        let direct_threshold = match mix {
            Mix::Journaled => u64::MAX,
            Mix::Direct => 2 * BLOCK,
        };
        let total_ops = (threads * ops_per_thread) as u64;
        let crash_after = if rng.gen_bool(0.1) {
            None
        } else {
            Some(rng.gen_range(0..=ops_estimate * total_ops))
        };
        Self {
            seed,
            mix,
            threads,
            ops_per_thread,
            journal_bytes,
            policy,
            commit_mode,
            commit_interval,
            direct_threshold,
            crash_after,
        }
    }

    fn open_options(&self) -> OpenOptions {
        OpenOptions {
            batch_policy: self.policy,
            max_batch: Duration::from_millis(1),
            commit_mode: self.commit_mode,
            commit_interval: self.commit_interval,
            direct_write_threshold: self.direct_threshold,
            ..OpenOptions::default()
        }
    }
}

/// A formatted, filled volume image to start cases from.
struct Base {
    image: Vec<u8>,
    content: Vec<u8>,
}

fn bases() -> [Arc<Base>; 2] {
    [64 * 1024, 128 * 1024].map(|journal_bytes| {
        let (image, content) = base_image(Geometry {
            data_bytes: DATA_BYTES,
            journal_bytes,
        });
        Arc::new(Base { image, content })
    })
}

fn base_for(bases: &[Arc<Base>; 2], journal_bytes: u64) -> Arc<Base> {
    bases[usize::from(journal_bytes != 64 * 1024)].clone()
}

/// What a finished (or crashed) run leaves for verification.
struct RunResult {
    dev: Arc<FaultDevice>,
    trace: Option<Arc<TraceDev>>,
    histories: Vec<History>,
    flushes: Vec<FlushRec>,
    /// Mutating device ops the workload issued (after open).
    workload_ops: u64,
    powered_off_early: bool,
}

/// The block-aligned region of thread `t` of `threads` (a one-block gap
/// after each region stays untouched).
fn region(t: usize, threads: usize) -> (u64, u64) {
    let slot_blocks = DATA_BYTES / BLOCK / threads as u64;
    let lo = t as u64 * slot_blocks * BLOCK;
    (lo, lo + (slot_blocks - 1) * BLOCK)
}

/// Picks `[off, off+len)` inside `[lo, hi)` with `len` in `1..=max_len`.
fn pick(rng: &mut StdRng, lo: u64, hi: u64, max_len: u64) -> (u64, u64) {
    let len = rng.gen_range(1..=max_len.min(hi - lo));
    let off = rng.gen_range(lo..=hi - len);
    (off, len)
}

/// Picks a block-aligned range of `blocks` blocks inside `[lo, hi)`.
fn pick_aligned(rng: &mut StdRng, lo: u64, hi: u64, blocks: u64) -> (u64, u64) {
    let avail = (hi - lo) / BLOCK;
    let blocks = blocks.min(avail).max(1);
    let first = rng.gen_range(0..=avail - blocks);
    (lo + first * BLOCK, blocks * BLOCK)
}

fn blocks_spanned(off: u64, len: u64) -> u64 {
    if len == 0 {
        return 0;
    }
    (off + len - 1) / BLOCK - off / BLOCK + 1
}

/// One thread's workload: issues its ops in order, records them, stops at
/// the first error.
fn thread_workload(
    vol: &Volume,
    clock: &Clock,
    p: &CaseParams,
    t: usize,
    max_tx_bytes: u64,
    trace: Option<&TraceDev>,
) -> (History, Vec<FlushRec>) {
    let (lo, hi) = region(t, p.threads);
    let mut rng = StdRng::seed_from_u64(p.seed ^ ((t as u64 + 1) << 56));
    let mut h = History {
        thread: t,
        lo,
        hi,
        ops: Vec::new(),
    };
    let mut flushes = Vec::new();
    let max_tx_blocks = (max_tx_bytes / BLOCK).max(1);
    // Single journaled writes stay well inside one transaction.
    let max_write = (4 * BLOCK).min(max_tx_bytes);
    for seq in 0..p.ops_per_thread {
        let id = ((t as u64 + 1) << 32) | (seq as u64 + 1);
        let fua = rng.gen_bool(0.25);
        let r = rng.gen_range(0..100);
        let op: Op;
        let res: jbdev_volume::Result<()>;
        if r < 8 {
            let start = clock.tick();
            let res = vol.flush();
            let ack = res.is_ok().then(|| clock.tick());
            if let Some(tr) = trace {
                tr.mark(format!("t{t} flush start@{start} ack {ack:?}"));
            }
            flushes.push(FlushRec { start, ack });
            if res.is_err() {
                break;
            }
            continue;
        }
        let direct_mix = p.mix == Mix::Direct;
        if direct_mix && r >= 88 {
            // Non-atomic ops: direct write, trim, large write_zeroes.
            let blocks = rng.gen_range(2..=4);
            let (off, len) = pick_aligned(&mut rng, lo, hi, blocks);
            let which = rng.gen_range(0..3);
            let (kind, data) = match which {
                0 => (OpKind::Direct, stamped(id, off, len as usize)),
                1 => (OpKind::Trim, vec![0; len as usize]),
                _ => (OpKind::BigZeroes, vec![0; len as usize]),
            };
            res = match kind {
                OpKind::Direct => vol.write_at(&data, off, flags(fua)),
                OpKind::Trim => vol.trim(off, len, flags(fua)),
                _ => vol.write_zeroes(off, len, flags(fua)),
            };
            // A direct write below the threshold would be journaled: the
            // per-sector model covers both.
            op = Op {
                id,
                kind,
                fua,
                extents: vec![(off, data)],
                ack: None,
            };
        } else if r < 38 {
            // Sub-block, unaligned.
            let max_len = if rng.gen_bool(0.5) { 600 } else { BLOCK };
            let (off, len) = pick(&mut rng, lo, hi, max_len);
            let data = stamped(id, off, len as usize);
            res = vol.write_at(&data, off, flags(fua));
            op = Op {
                id,
                kind: OpKind::Write,
                fua,
                extents: vec![(off, data)],
                ack: None,
            };
        } else if r < 53 {
            let (off, len) = pick_aligned(&mut rng, lo, hi, 1);
            let data = stamped(id, off, len as usize);
            res = vol.write_at(&data, off, flags(fua));
            op = Op {
                id,
                kind: OpKind::Write,
                fua,
                extents: vec![(off, data)],
                ack: None,
            };
        } else if r < 65 {
            // Multi-block, aligned or not; journaled (below the threshold).
            let blocks = rng.gen_range(2..=(max_write / BLOCK).max(2));
            let (mut off, mut len) = pick_aligned(&mut rng, lo, hi, blocks);
            if len >= p.direct_threshold || rng.gen_bool(0.5) {
                // Unaligned: shift the start, shorten the end.
                let cut = rng.gen_range(1..BLOCK);
                off += cut;
                len -= cut + rng.gen_range(0..BLOCK / 2);
            }
            let mut len = len.min(max_write);
            if max_tx_bytes < hi - lo && rng.gen_bool(0.15) {
                // The contract's edge: a single write of max_transaction_bytes()
                // (aligned or not, or a little less) is still all-or-nothing.
                len = max_tx_bytes - rng.gen_range(0..=1u64) * rng.gen_range(0..BLOCK);
                off = rng.gen_range(lo..=hi - len);
                if rng.gen_bool(0.5) {
                    off = off / BLOCK * BLOCK;
                }
            }
            let data = stamped(id, off, len as usize);
            res = vol.write_at(&data, off, flags(fua));
            op = Op {
                id,
                kind: OpKind::Write,
                fua,
                extents: vec![(off, data)],
                ack: None,
            };
        } else if r < 73 {
            // Small write_zeroes (journaled: far below the threshold).
            let (off, len) = pick(&mut rng, lo, hi, 2 * BLOCK);
            let len = len.min(p.direct_threshold - 1);
            res = vol.write_zeroes(off, len, flags(fua));
            op = Op {
                id,
                kind: OpKind::Zeroes,
                fua,
                extents: vec![(off, vec![0; len as usize])],
                ack: None,
            };
        } else {
            // A multi-extent transaction inside the region.
            let n = rng.gen_range(2..=4);
            let mut extents = Vec::new();
            let mut blocks = 0;
            for _ in 0..n {
                let (off, len) = pick(&mut rng, lo, hi, 2 * BLOCK);
                if blocks + blocks_spanned(off, len) > max_tx_blocks {
                    break;
                }
                blocks += blocks_spanned(off, len);
                let data = if rng.gen_bool(0.25) {
                    vec![0; len as usize]
                } else {
                    stamped(id, off, len as usize)
                };
                extents.push((off, data));
            }
            if extents.is_empty() {
                let (off, len) = pick(&mut rng, lo, hi, 512);
                extents.push((off, stamped(id, off, len as usize)));
            }
            res = (|| {
                let mut tx = vol.transaction();
                for (off, data) in &extents {
                    if data.iter().all(|&b| b == 0) {
                        tx.write_zeroes(*off, data.len() as u64)?;
                    } else {
                        tx.write(data, *off)?;
                    }
                }
                tx.commit(flags(fua))
            })();
            op = Op {
                id,
                kind: OpKind::Txn,
                fua,
                extents,
                ack: None,
            };
        }
        let ack = res.is_ok().then(|| clock.tick());
        let op = Op { ack, ..op };
        if let Some(tr) = trace {
            tr.mark(format!("t{t} returned {}", op.summary()));
        }
        h.ops.push(op);
        match res {
            Ok(()) => {}
            // Power cut or injected failure: the thread stops here.
            Err(
                VolumeError::Device(_) | VolumeError::EdgeRead { .. } | VolumeError::Aborted { .. },
            ) => break,
            Err(e) => panic!(
                "case seed {:#x} thread {t}: {} failed with an error no fault explains: {e}",
                p.seed,
                h.ops.last().map(Op::summary).unwrap_or_default()
            ),
        }
    }
    (h, flushes)
}

/// Runs the workload of `p` from `base`; cuts power at `p.crash_after` ops
/// (or at the end).
fn run_case(p: &CaseParams, base: &Base) -> Result<RunResult, String> {
    let dev = Arc::new(FaultDevice::from_image(base.image.clone(), SECTOR as u32));
    let trace = Arc::new(TraceDev {
        inner: dev.clone(),
        log: parking_lot::Mutex::new(Vec::new()),
    });
    let vol = Volume::open_device(trace.clone(), None, &p.open_options())
        .map_err(|e| format!("open of the base image failed: {e}"))?;
    let ops_at_open = dev.ops();
    if let Some(n) = p.crash_after {
        dev.crash_after_ops(n);
    }
    let max_tx = vol.max_transaction_bytes();
    let clock = Clock::default();
    let results: Vec<(History, Vec<FlushRec>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..p.threads)
            .map(|t| {
                let (vol, clock) = (&vol, &clock);
                {
                    let trace: &TraceDev = &trace;
                    s.spawn(move || thread_workload(vol, clock, p, t, max_tx, Some(trace)))
                }
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("workload thread panicked"))
            .collect()
    });
    let powered_off_early = dev.is_powered_off();
    let workload_ops = dev.ops() - ops_at_open;
    // Visibility: with power still on, every op returned, and reads must
    // show the state after all of them (before any crash question arises).
    let mut live_error = None;
    if !powered_off_early {
        if let Ok(content) = read_all(&vol) {
            for (h, _) in &results {
                if let Err(e) = check_prefix(&base.content, h, h.ops.len(), &content) {
                    live_error = Some(format!("reads before the crash (no crash yet): {e}"));
                }
            }
        }
    }
    // Power goes now if it did not go earlier: whatever the engine has not
    // flushed yet is at the mercy of the crash image.
    dev.cut_power();
    drop(vol);
    if let Some(e) = live_error {
        return Err(e);
    }
    let mut histories = Vec::new();
    let mut flushes = Vec::new();
    for (h, f) in results {
        histories.push(h);
        flushes.extend(f);
    }
    Ok(RunResult {
        dev,
        trace: Some(trace),
        histories,
        flushes,
        workload_ops,
        powered_off_early,
    })
}

/// Verifies one recovered volume content against the run's model.
fn check_content(
    mix: Mix,
    base: &[u8],
    histories: &[History],
    flushes: &[FlushRec],
    content: &[u8],
) -> Result<(), String> {
    let horizon = durable_horizon(flushes);
    if content.len() < base.len() {
        return Err(format!(
            "recovered volume has {} bytes, expected {}",
            content.len(),
            base.len()
        ));
    }
    for h in histories {
        match mix {
            Mix::Journaled => {
                check_prefix(base, h, h.floor(horizon), content)?;
            }
            Mix::Direct => check_sectors(base, h, horizon, content)?,
        }
    }
    let regions: Vec<(u64, u64)> = histories.iter().map(|h| (h.lo, h.hi)).collect();
    check_untouched(base, &regions, content)
}

/// Counters of one test.
#[derive(Default, Debug)]
struct Counts {
    cases: u64,
    crash_points: u64,
    recovery_crash_points: u64,
    crashed_mid_run: u64,
}

/// Recovers every distinct crash image of `dev` (taken with `seeds` and the
/// two extremes) and checks it; then crashes the recovery of one image (at
/// one random op, or at every op) and checks the images of that. Returns the number of crash points verified.
#[allow(clippy::too_many_arguments)]
fn verify_images(
    what: &str,
    dev: &FaultDevice,
    mix: Mix,
    base: &[u8],
    histories: &[History],
    flushes: &[FlushRec],
    seeds: &[u64],
    recovery_crash_seed: Option<u64>,
    every_recovery_op: bool,
    counts: &mut Counts,
) -> Result<(), String> {
    let mut images = vec![
        (
            "keep-all".to_string(),
            dev.crash_image_with(0, CrashOdds::KEEP_ALL),
        ),
        (
            "lose-all".to_string(),
            dev.crash_image_with(0, CrashOdds::LOSE_ALL),
        ),
    ];
    for &s in seeds {
        images.push((format!("crash_image({s})"), dev.crash_image(s)));
    }
    let mut seen = std::collections::HashSet::new();
    let opts = verify_open_options();
    let mut recoverable = Vec::new();
    for (name, img) in images {
        if !seen.insert(image_hash(&img)) {
            continue;
        }
        let (content, recovery_ops) =
            recover(img.clone(), &opts).map_err(|e| format!("{what}, image {name}: {e}"))?;
        check_content(mix, base, histories, flushes, &content).map_err(|e| {
            dump_failure(what, &name, dev, &img);
            format!("{what}, image {name}: {e}")
        })?;
        counts.crash_points += 1;
        if recovery_ops > 0 {
            recoverable.push((name, img, recovery_ops));
        }
    }
    // Crash the recovery of an image, then recover what that left.
    let Some(rseed) = recovery_crash_seed else {
        return Ok(());
    };
    if recoverable.is_empty() {
        return Ok(());
    }
    let mut rng = StdRng::seed_from_u64(rseed);
    let (name, img, recovery_ops) = if every_recovery_op {
        // The image whose recovery does the most work.
        recoverable.iter().max_by_key(|r| r.2).expect("non-empty")
    } else {
        &recoverable[rng.gen_range(0..recoverable.len())]
    };
    let crash_points: Vec<u64> = if every_recovery_op {
        (0..*recovery_ops).collect()
    } else {
        vec![rng.gen_range(0..*recovery_ops)]
    };
    for m in crash_points {
        let rdev = recover_interrupted(img.clone(), m, &opts);
        let mut seen = std::collections::HashSet::new();
        for (iname, img2) in [
            ("keep-all", rdev.crash_image_with(0, CrashOdds::KEEP_ALL)),
            ("lose-all", rdev.crash_image_with(0, CrashOdds::LOSE_ALL)),
            ("random", rdev.crash_image(rseed ^ m)),
        ] {
            if !seen.insert(image_hash(&img2)) {
                continue;
            }
            let ctx = format!(
                "{what}, image {name}, recovery crashed after {m} of {recovery_ops} ops, \
                 image {iname} of that"
            );
            let (content, _) = recover(img2, &opts).map_err(|e| format!("{ctx}: {e}"))?;
            check_content(mix, base, histories, flushes, &content)
                .map_err(|e| format!("{ctx}: {e}"))?;
            counts.crash_points += 1;
            counts.recovery_crash_points += 1;
        }
    }
    Ok(())
}

/// Diagnostics: with `JBDEV_CRASH_DUMP=<dir>`, a failing crash image is
/// written there with the device's durable and live images, for offline
/// analysis (the `analyze_dump` test).
fn dump_failure(what: &str, name: &str, dev: &FaultDevice, img: &[u8]) {
    let Some(dir) = std::env::var_os("JBDEV_CRASH_DUMP") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let _ = std::fs::create_dir_all(&dir);
    let tag = format!("{:016x}", image_hash(img));
    let _ = std::fs::write(dir.join(format!("{tag}.crash")), img);
    let _ = std::fs::write(dir.join(format!("{tag}.durable")), dev.durable_image());
    let _ = std::fs::write(dir.join(format!("{tag}.live")), dev.live_image());
    let mut txt = format!("{what}\nimage {name}\n");
    TRACE.with(|t| {
        if let Some(t) = t.borrow().as_ref() {
            for l in t.log.lock().iter() {
                txt += l;
                txt += "\n";
            }
        }
    });
    let _ = std::fs::write(dir.join(format!("{tag}.txt")), txt);
    println!("dumped failing image to {}/{tag}.*", dir.display());
}

/// Diagnostics: a pass-through device recording every mutating op (thread
/// name, kind, offset, the first 16 bytes of every sector written), dumped
/// next to a failing image.
struct TraceDev {
    inner: Arc<FaultDevice>,
    log: parking_lot::Mutex<Vec<String>>,
}

impl TraceDev {
    fn mark(&self, what: String) {
        self.log.lock().push(format!("MARK {what}"));
    }

    /// Runs `op` with the log locked, so the log order is the device's order.
    fn traced(
        &self,
        kind: &str,
        offset: u64,
        len: u64,
        data: Option<&[u8]>,
        op: impl FnOnce() -> jbdev_device::Result<()>,
    ) -> jbdev_device::Result<()> {
        let mut log = self.log.lock();
        let r = op();
        let ok = r.is_ok();
        let th = std::thread::current();
        let mut line = format!(
            "{} {kind} off={offset} len={len} ok={ok}",
            th.name().unwrap_or("?")
        );
        if let Some(d) = data {
            for s in d.chunks(SECTOR) {
                line += " ";
                for b in &s[..16] {
                    line += &format!("{b:02x}");
                }
            }
        }
        log.push(line);
        r
    }
}

impl jbdev_device::BlockDevice for TraceDev {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn logical_block_size(&self) -> u32 {
        self.inner.logical_block_size()
    }
    fn read_vectored_at(
        &self,
        bufs: &mut [std::io::IoSliceMut<'_>],
        offset: u64,
    ) -> jbdev_device::Result<()> {
        self.inner.read_vectored_at(bufs, offset)
    }
    fn write_vectored_at(
        &self,
        bufs: &[std::io::IoSlice<'_>],
        offset: u64,
        prio: jbdev_device::IoPriority,
    ) -> jbdev_device::Result<()> {
        let data: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
        self.traced("write", offset, data.len() as u64, Some(&data), || {
            self.inner.write_vectored_at(bufs, offset, prio)
        })
    }
    // IMPORTANT: forwarded, not left to the trait's default (write, then
    // flush): the engine's commits are FUA writes, and the fault device
    // models those exactly only when it sees them as such.
    fn write_vectored_durable_at(
        &self,
        bufs: &[std::io::IoSlice<'_>],
        offset: u64,
        prio: jbdev_device::IoPriority,
    ) -> jbdev_device::Result<()> {
        let data: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
        self.traced("write-fua", offset, data.len() as u64, Some(&data), || {
            self.inner.write_vectored_durable_at(bufs, offset, prio)
        })
    }
    fn flush(&self) -> jbdev_device::Result<()> {
        self.traced("flush", 0, 0, None, || self.inner.flush())
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> jbdev_device::Result<()> {
        self.traced("zeroes", offset, len, None, || {
            self.inner.write_zeroes(offset, len)
        })
    }
    fn backend_name(&self) -> &'static str {
        "trace"
    }
}

thread_local! {
    /// The trace of the case this thread runs (see [`TraceDev`]).
    static TRACE: std::cell::RefCell<Option<Arc<TraceDev>>> = const { std::cell::RefCell::new(None) };
}

/// Runs one random case end to end. Returns the device ops per workload op
/// observed when the case ran to the end (to calibrate crash points).
fn one_case(
    p: &CaseParams,
    bases: &[Arc<Base>; 2],
    counts: &mut Counts,
) -> Result<Option<f64>, String> {
    let base = base_for(bases, p.journal_bytes);
    let p2 = p.clone();
    let base2 = base.clone();
    let run = with_watchdog(&format!("case seed {:#x}", p.seed), CASE_LIMIT, move || {
        run_case(&p2, &base2)
    })?;
    counts.cases += 1;
    TRACE.with(|t| *t.borrow_mut() = run.trace.clone());
    let any_failed = run
        .histories
        .iter()
        .any(|h| h.ops.iter().any(|o| o.ack.is_none()))
        || run.flushes.iter().any(|f| f.ack.is_none());
    if !run.powered_off_early && any_failed {
        return Err(format!(
            "case seed {:#x}: an op failed although the device never lost power",
            p.seed
        ));
    }
    if run.powered_off_early {
        counts.crashed_mid_run += 1;
    }
    let mut rng = StdRng::seed_from_u64(p.seed ^ 0x1111);
    let seeds: Vec<u64> = (0..3).map(|_| rng.gen()).collect();
    let what = format!(
        "case seed {:#x} ({:?}, {} threads, journal {} KiB, {}, {:?}, crash after {:?} ops, \
         workload issued {} device ops)",
        p.seed,
        p.mix,
        p.threads,
        p.journal_bytes / 1024,
        p.policy,
        p.commit_mode,
        p.crash_after,
        run.workload_ops
    );
    verify_images(
        &what,
        &run.dev,
        p.mix,
        &base.content,
        &run.histories,
        &run.flushes,
        &seeds,
        Some(rng.gen()),
        false,
        counts,
    )?;
    let total_ops: usize =
        run.histories.iter().map(|h| h.ops.len()).sum::<usize>() + run.flushes.len();
    Ok((!run.powered_off_early && total_ops > 0)
        .then(|| run.workload_ops as f64 / total_ops as f64))
}

fn random_test(mix: Mix, base_seed: u64, default_cases: u64) {
    let started = Instant::now();
    let bases = bases();
    let mut counts = Counts::default();
    let replay = env_u64("JBDEV_CRASH_SEED");
    let cases = env_u64("JBDEV_CRASH_SOAK").unwrap_or(default_cases);
    // Observed device ops per workload op of runs that reached the end
    // (printed, to keep OPS_PER_OP_ESTIMATE honest).
    let mut ops_per_op_seen: f64 = 0.0;
    let seeds: Vec<u64> = match replay {
        Some(s) => vec![s],
        None => (0..cases).map(|i| case_seed(base_seed, i)).collect(),
    };
    let keep_going = std::env::var_os("JBDEV_CRASH_KEEP_GOING").is_some();
    let mut failures = Vec::new();
    let test_name = match mix {
        Mix::Journaled => "random_workloads",
        Mix::Direct => "direct_writes_trims_and_zeroes",
    };
    for seed in seeds {
        let p = CaseParams::random(seed, mix, OPS_PER_OP_ESTIMATE);
        match one_case(&p, &bases, &mut counts) {
            Ok(Some(r)) => ops_per_op_seen = ops_per_op_seen.max(r),
            Ok(None) => {}
            Err(e) => {
                let msg = format!(
                    "CRASH CONSISTENCY VIOLATION\n{e}\nreplay: JBDEV_CRASH_SEED={seed:#x} cargo \
                     test -p jbdev-volume --test crash {test_name} -- --nocapture\nparams: {p:?}"
                );
                if !keep_going {
                    panic!("{msg}");
                }
                println!("{msg}\n");
                failures.push(seed);
            }
        }
    }
    println!(
        "crash test {mix:?}: {} cases ({} crashed mid-run), {} crash points verified \
         ({} of them after a crash during recovery) in {:.1?}; up to {ops_per_op_seen:.1} \
         device ops per workload op",
        counts.cases,
        counts.crashed_mid_run,
        counts.crash_points,
        counts.recovery_crash_points,
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases failed (JBDEV_CRASH_KEEP_GOING): seeds {failures:#x?}",
        failures.len(),
        counts.cases
    );
    if replay.is_none() {
        assert!(counts.crashed_mid_run > 0, "no case crashed mid-run");
    }
}

/// Seeded random multi-thread workloads of journaled ops, crashed at random
/// op counts (mid-commit, mid-checkpoint with 64–128 KiB journals).
#[test]
fn random_workloads() {
    random_test(Mix::Journaled, 0x6a62_6465_7631, 2000);
}

/// Direct writes, trims and large write_zeroes mixed with journaled ops,
/// checked per sector.
#[test]
fn direct_writes_trims_and_zeroes() {
    random_test(Mix::Direct, 0x6a62_6465_7632, 600);
}

/// A deterministic single-thread workload (ending in `close`) crashed at
/// every mutating op index, and for every such crash, recovery crashed at a
/// spread of its op indexes.
#[test]
fn single_thread_every_crash_point() {
    let started = Instant::now();
    let bases = bases();
    let mut counts = Counts::default();
    for (journal_bytes, mode) in [
        (64 * 1024, CommitMode::SingleFlush),
        (128 * 1024, CommitMode::TwoFlush),
    ] {
        let p = CaseParams {
            seed: 0x5eed_0001 ^ journal_bytes,
            mix: Mix::Journaled,
            threads: 1,
            ops_per_thread: 45,
            journal_bytes,
            policy: BatchPolicy::None,
            commit_mode: mode,
            commit_interval: Duration::from_secs(5),
            direct_threshold: u64::MAX,
            crash_after: None,
        };
        let base = base_for(&bases, journal_bytes);
        // Calibrate: the op count of the whole run, close included.
        let calib = single_thread_run(&p, &base, None);
        let total = calib.workload_ops;
        assert!(total > 10, "the workload issued only {total} device ops");
        for n in 0..=total + 1 {
            let run = single_thread_run(&p, &base, Some(n));
            let what = format!(
                "single-thread seed {:#x}, journal {} KiB, {mode:?}, crash after {n} of {total} ops",
                p.seed,
                journal_bytes / 1024
            );
            let res = verify_images(
                &what,
                &run.dev,
                Mix::Journaled,
                &base.content,
                &run.histories,
                &run.flushes,
                &[n, n + 1_000_000],
                Some(n ^ 0xabc),
                // Every recovery op index, for every 8th workload crash point.
                n % 8 == 0,
                &mut counts,
            );
            if let Err(e) = res {
                panic!("CRASH CONSISTENCY VIOLATION\n{e}");
            }
            counts.cases += 1;
        }
    }
    println!(
        "crash test single-thread: {} crash op indexes, {} crash points verified ({} after a \
         crash during recovery) in {:.1?}",
        counts.cases,
        counts.crash_points,
        counts.recovery_crash_points,
        started.elapsed()
    );
}

/// Runs the single-thread workload of `p` followed by `close()` (recorded as
/// a flush), with power cut after `crash_after` ops.
fn single_thread_run(p: &CaseParams, base: &Base, crash_after: Option<u64>) -> RunResult {
    let dev = Arc::new(FaultDevice::from_image(base.image.clone(), SECTOR as u32));
    let vol = Volume::open_device(as_dev(&dev), None, &p.open_options()).expect("open base");
    let at_open = dev.ops();
    if let Some(n) = crash_after {
        dev.crash_after_ops(n);
    }
    let clock = Clock::default();
    let max_tx = vol.max_transaction_bytes();
    let p2 = p.clone();
    let (h, mut flushes, ops) = with_watchdog(
        &format!("single-thread seed {:#x} crash {crash_after:?}", p.seed),
        CASE_LIMIT,
        {
            let dev = dev.clone();
            move || {
                let (h, mut flushes) = thread_workload(&vol, &clock, &p2, 0, max_tx, None);
                let start = clock.tick();
                let res = vol.close();
                let ack = res.is_ok().then(|| clock.tick());
                flushes.push(FlushRec { start, ack });
                (h, flushes, dev.ops() - at_open)
            }
        },
    );
    let powered_off_early = dev.is_powered_off();
    dev.cut_power();
    flushes.sort_by_key(|f| f.start);
    RunResult {
        dev,
        trace: None,
        histories: vec![h],
        flushes,
        workload_ops: ops,
        powered_off_early,
    }
}

/// Sticky errors: a failed device write or flush (injected at every op index
/// of a workload in turn) makes the volume refuse every later write with
/// `VolumeError::Aborted` until reopened; crash images of that state recover
/// with every acknowledged-durable write intact; reopening the same device
/// recovers the same way and gives a writable volume.
#[test]
fn sticky_error_after_failed_write_or_flush() {
    let started = Instant::now();
    let bases = bases();
    let base = base_for(&bases, 64 * 1024);
    let p = CaseParams {
        seed: 0x571c_c1e5,
        mix: Mix::Journaled,
        threads: 1,
        ops_per_thread: 30,
        journal_bytes: 64 * 1024,
        policy: BatchPolicy::None,
        commit_mode: CommitMode::SingleFlush,
        commit_interval: Duration::from_secs(5),
        direct_threshold: u64::MAX,
        crash_after: None,
    };
    // Calibrate: device ops of the workload (and close) without faults.
    let total = single_thread_run(&p, &base, None).workload_ops;
    let mut counts = Counts::default();
    let mut aborted_runs = 0;
    for k in 1..=total + 1 {
        let what = format!("sticky error: injected failure at device op {k} of {total}");
        let dev = Arc::new(FaultDevice::from_image(base.image.clone(), SECTOR as u32));
        let vol = Volume::open_device(as_dev(&dev), None, &p.open_options()).expect("open");
        let at_open = dev.ops();
        dev.fail_op(k);
        let p2 = p.clone();
        let what2 = what.clone();
        let (h, flushes, aborted) = with_watchdog(&what, CASE_LIMIT, {
            let dev = dev.clone();
            move || {
                let clock = Clock::default();
                let max_tx = vol.max_transaction_bytes();
                let (mut h, mut flushes) = thread_workload(&vol, &clock, &p2, 0, max_tx, None);
                let mut failed = h.ops.last().is_some_and(|o| o.ack.is_none())
                    || flushes.last().is_some_and(|f| f.ack.is_none());
                if !failed {
                    // No error seen yet: one more FUA write. If the injected
                    // failure already happened (in the background), it must
                    // fail; if it did not, the failure may be this write's.
                    let id = u64::MAX - 1;
                    let data = stamped(id, h.lo, 512);
                    // Successful device ops before this write started: if
                    // they reach k, the injected failure was already
                    // returned to the engine (maybe to a background thread).
                    let before = dev.ops() - at_open;
                    let res = vol.write_at(&data, h.lo, WriteFlags::FUA);
                    let ack = res.is_ok().then(|| clock.tick());
                    h.ops.push(Op {
                        id,
                        kind: OpKind::Write,
                        fua: true,
                        extents: vec![(h.lo, data)],
                        ack,
                    });
                    if res.is_ok() && before >= k {
                        panic!(
                            "{what2}: the injected failure was swallowed: a FUA write \
                             still succeeds after it"
                        );
                    }
                    failed = res.is_err();
                }
                if failed {
                    if let Err(e) = check_refuses_writes(&vol, h.lo) {
                        panic!("{what2}: {e}");
                    }
                }
                drop(vol);
                flushes.sort_by_key(|f| f.start);
                (h, flushes, failed)
            }
        });
        if aborted {
            aborted_runs += 1;
        }
        let histories = vec![h];
        // Crash images of the state the failure left.
        let seeds = [k, k + 7_000_000];
        verify_images(
            &what,
            &dev,
            Mix::Journaled,
            &base.content,
            &histories,
            &flushes,
            &seeds,
            None,
            false,
            &mut counts,
        )
        .unwrap_or_else(|e| panic!("CRASH CONSISTENCY VIOLATION\n{e}"));
        // Reopen what the (still powered) device holds: recovery succeeds,
        // the model holds, and the volume takes writes again. A copy of the
        // live image, so an injected failure that never fired (the workload
        // ended first) does not hit the reopened volume.
        let reopened = Arc::new(FaultDevice::from_image(dev.live_image(), SECTOR as u32));
        let vol = Volume::open_device(as_dev(&reopened), None, &verify_open_options())
            .unwrap_or_else(|e| panic!("{what}: reopen failed: {e}"));
        let content = read_all(&vol).expect("read after reopen");
        check_content(
            Mix::Journaled,
            &base.content,
            &histories,
            &flushes,
            &content,
        )
        .unwrap_or_else(|e| panic!("{what}: after reopen: {e}"));
        let off = histories[0].lo + 1000;
        vol.write_at(&[7u8; 100], off, WriteFlags::FUA)
            .unwrap_or_else(|e| panic!("{what}: write after reopen failed: {e}"));
        let mut back = [0u8; 100];
        vol.read_at(&mut back, off).expect("read back");
        assert_eq!(
            back, [7u8; 100],
            "{what}: write after reopen reads back wrong"
        );
        drop(vol);
    }
    println!(
        "sticky error: failure injected at each of {} device ops, {aborted_runs} runs saw the \
         volume abort, {} crash points verified in {:.1?}",
        total + 1,
        counts.crash_points,
        started.elapsed()
    );
    assert!(aborted_runs > 0, "no injected failure aborted the volume");
}

/// Regression: a failed journal write or flush with several threads syncing
/// at once. A failed commit must never be followed by a later one (an empty
/// cut needs no I/O) that moves the committed transaction past it: followers
/// of the failed commit would get Ok for data that never reached the
/// journal. Every acknowledged FUA write and flush must survive, in the crash
/// images of the failed state and on a reopen of the live image. The race
/// is narrow, so each failure point runs several times.
#[test]
fn sticky_error_with_concurrent_syncing_writers() {
    let started = Instant::now();
    let bases = bases();
    let base = base_for(&bases, 64 * 1024);
    let mut counts = Counts::default();
    let mut aborted_runs = 0;
    let mut runs = 0;
    for k in 1..=48u64 {
        for rep in 0..4u64 {
            let seed = 0xfa11_0000 ^ (k << 8) ^ rep;
            let p = CaseParams {
                seed,
                mix: Mix::Journaled,
                threads: 4,
                ops_per_thread: 12,
                journal_bytes: 64 * 1024,
                policy: BatchPolicy::None,
                commit_mode: CommitMode::SingleFlush,
                commit_interval: Duration::from_secs(5),
                direct_threshold: u64::MAX,
                crash_after: None,
            };
            let what = format!("injected failure at device op {k} (run {rep}, seed {seed:#x})");
            let dev = Arc::new(FaultDevice::from_image(base.image.clone(), SECTOR as u32));
            let vol = Volume::open_device(as_dev(&dev), None, &p.open_options()).expect("open");
            dev.fail_op(k);
            let p2 = p.clone();
            let (histories, mut flushes) = with_watchdog(&what, CASE_LIMIT, move || {
                let clock = Clock::default();
                let max_tx = vol.max_transaction_bytes();
                let results: Vec<(History, Vec<FlushRec>)> = std::thread::scope(|s| {
                    let handles: Vec<_> = (0..p2.threads)
                        .map(|t| {
                            let (vol, clock, p2) = (&vol, &clock, &p2);
                            s.spawn(move || thread_workload(vol, clock, p2, t, max_tx, None))
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("workload thread panicked"))
                        .collect()
                });
                drop(vol);
                let mut histories = Vec::new();
                let mut flushes = Vec::new();
                for (h, f) in results {
                    histories.push(h);
                    flushes.extend(f);
                }
                (histories, flushes)
            });
            flushes.sort_by_key(|f| f.start);
            runs += 1;
            if histories
                .iter()
                .any(|h| h.ops.iter().any(|o| o.ack.is_none()))
            {
                aborted_runs += 1;
            }
            verify_images(
                &what,
                &dev,
                Mix::Journaled,
                &base.content,
                &histories,
                &flushes,
                &[seed],
                None,
                false,
                &mut counts,
            )
            .unwrap_or_else(|e| panic!("CRASH CONSISTENCY VIOLATION\n{e}"));
            let reopened = Arc::new(FaultDevice::from_image(dev.live_image(), SECTOR as u32));
            let vol = Volume::open_device(as_dev(&reopened), None, &verify_open_options())
                .unwrap_or_else(|e| panic!("{what}: reopen failed: {e}"));
            let content = read_all(&vol).expect("read after reopen");
            check_content(
                Mix::Journaled,
                &base.content,
                &histories,
                &flushes,
                &content,
            )
            .unwrap_or_else(|e| panic!("{what}: after reopen: {e}"));
        }
    }
    println!(
        "sticky error, concurrent writers: {runs} runs, {aborted_runs} saw the volume abort, \
         {} crash points verified in {:.1?}",
        counts.crash_points,
        started.elapsed()
    );
    assert!(aborted_runs > 0, "no injected failure aborted the volume");
}

/// After a failed write or flush was reported, every later write-like call
/// must fail with `VolumeError::Aborted`. Returns Ok(true).
fn check_refuses_writes(vol: &Volume, off: u64) -> Result<bool, String> {
    let data = vec![0x5au8; 512];
    let mut results: Vec<(&str, jbdev_volume::Result<()>)> = vec![
        ("write_at", vol.write_at(&data, off, WriteFlags::NONE)),
        ("write_at FUA", vol.write_at(&data, off, WriteFlags::FUA)),
        ("flush", vol.flush()),
        ("write_zeroes", vol.write_zeroes(off, 512, WriteFlags::NONE)),
        ("trim", vol.trim(off, BLOCK, WriteFlags::NONE)),
    ];
    let tx = (|| {
        let mut tx = vol.transaction();
        tx.write(&data, off)?;
        tx.commit(WriteFlags::NONE)
    })();
    results.push(("transaction", tx));
    for (name, r) in results {
        match r {
            Err(VolumeError::Aborted { .. }) => {}
            Err(e) => {
                return Err(format!(
                    "{name} after the failure returned {e:?}, not Aborted"
                ))
            }
            Ok(()) => return Err(format!("{name} after the failure succeeded")),
        }
    }
    Ok(true)
}

/// The checkers themselves: they accept every legal recovery of a small
/// history and reject torn, reordered, lost-durable and stray content.
#[test]
fn model_checkers_reject_illegal_recoveries() {
    let size = 16 * BLOCK as usize;
    let base = stamped(INITIAL_ID, 0, size);
    let op = |id: u64, off: u64, len: usize, fua: bool, ack: Option<u64>| Op {
        id,
        kind: OpKind::Write,
        fua,
        extents: vec![(off, stamped(id, off, len))],
        ack,
    };
    let h = History {
        thread: 0,
        lo: 0,
        hi: 8 * BLOCK,
        ops: vec![
            op(1, 100, 3000, false, Some(1)),
            op(2, 4096, 8192, true, Some(2)),
            op(3, 2000, 5000, false, Some(3)),
        ],
    };
    let apply = |k: usize| {
        let mut img = base.clone();
        for o in &h.ops[..k] {
            for (off, d) in &o.extents {
                img[*off as usize..*off as usize + d.len()].copy_from_slice(d);
            }
        }
        img
    };
    // Op 1 (#1, FUA) is durable: floor 2. Prefixes 2 and 3 are legal.
    assert_eq!(h.floor(0), 2);
    assert_eq!(check_prefix(&base, &h, 2, &apply(2)), Ok(2));
    assert_eq!(check_prefix(&base, &h, 2, &apply(3)), Ok(3));
    // Losing the durable write is not.
    assert!(check_prefix(&base, &h, 2, &apply(1)).is_err());
    // Op #2 torn: only its first 48 bytes reached the media.
    let mut torn = apply(2);
    torn[2000..2048].copy_from_slice(&stamped(3, 2000, 48));
    assert!(check_prefix(&base, &h, 2, &torn).is_err());
    // Reordered: op 2 without op 1 (with floor 0, so only order is at stake).
    let mut reordered = base.clone();
    reordered[4096..12288].copy_from_slice(&stamped(2, 4096, 8192));
    assert!(check_prefix(&base, &h, 0, &reordered).is_err());
    // A stray change outside every region.
    let mut stray = apply(3);
    assert_eq!(check_untouched(&base, &[(0, 8 * BLOCK)], &stray), Ok(()));
    stray[9 * BLOCK as usize] ^= 1;
    assert!(check_untouched(&base, &[(0, 8 * BLOCK)], &stray).is_err());
    // Per-sector rules: op 1 is durable (horizon 0 makes only FUA durable).
    assert_eq!(check_sectors(&base, &h, 0, &apply(3)), Ok(()));
    let mut old = apply(3);
    old[4096..4608].copy_from_slice(&base[4096..4608]);
    assert!(
        check_sectors(&base, &h, 0, &old).is_err(),
        "a sector older than its durable write must be rejected"
    );
    // With a flush after op 2 returned, op 2 is durable: its value or newer only.
    let mut lost = apply(3);
    lost[100..612].copy_from_slice(&base[100..612]);
    assert!(check_sectors(&base, &h, 3, &lost).is_err());
    assert_eq!(check_sectors(&base, &h, 3, &apply(3)), Ok(()));
}
