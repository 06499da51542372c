//! `large-writes`: issue 11's target — a single 16 MiB write and a 512 MiB
//! stream of 16 MiB writes take time linear in bytes, within 1.2x of the
//! same bytes written as 1 MiB writes.
//!
//! jbdev only (the ratio compares jbdev with itself), one writer thread,
//! the two sides alternated within one run so that the drift of this noisy
//! machine hits both alike:
//!
//! 1. **single**: one 16 MiB `write_at` + `flush` against sixteen 1 MiB
//!    `write_at` + one `flush`, the same bytes at a fresh offset each time,
//!    repeated (sides alternating which goes first) on one volume; the
//!    figure is the median wall time. Before every timed repetition the
//!    volume is let settle (checkpoint lag drained, bounded wait) so that
//!    one side's background checkpoint does not land in the other's timing.
//! 2. **stream**: `--stream-size` bytes written sequentially as 16 MiB and
//!    as 1 MiB writes, each on a freshly formatted volume, `flush` at the
//!    end (and, as a second variant, FUA on every write); MiB/s of each.
//!
//! Each run records the deltas of the volume's counters over its timed
//! part (commits, direct writes, log-space waits, write buffers allocated
//! and reused, ...) so the JSON shows which path the large writes took:
//! requests larger than one transaction go straight home (ARCHITECTURE.md
//! item 23), smaller ones through the journal.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use jbdev_volume::{BatchPolicy, Stats, Volume, WriteFlags};
use serde::Serialize;

use crate::cleanup;
use crate::cpu;
use std::os::unix::fs::FileExt;

use crate::backing::open_kernel;
use crate::ctx::Ctx;
use crate::error::{io_err, BenchError, Result};
use crate::pattern::pattern_buf;
use crate::report::{LatencySummary, RunRecord, ScenarioReport, TargetCheck};

/// Arguments of `large-writes`.
#[derive(Clone, Debug)]
pub struct LargeWritesParams {
    /// The large write (16 MiB).
    pub large_bytes: usize,
    /// The small write the same bytes are cut into (1 MiB).
    pub small_bytes: usize,
    /// Timed repetitions of each side of the single-write phase.
    pub reps: usize,
    /// Bytes of each stream (512 MiB; 128 MiB with --quick).
    pub stream_bytes: u64,
    /// Streams per side and variant, alternating which side goes first
    /// (median).
    pub stream_reps: usize,
    /// Also run the stream with FUA on every write.
    pub fua_stream: bool,
    pub policy: BatchPolicy,
}

/// The target ratio time(large writes) / time(small writes).
pub const TARGET_RATIO: f64 = 1.2;

/// Upper bound of one settle wait (checkpoint lag drained).
const SETTLE_MAX: Duration = Duration::from_secs(5);
const SETTLE_POLL: Duration = Duration::from_millis(5);

/// Counters of [`Stats`] over a timed part of a run.
#[derive(Clone, Copy, Debug, Default, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct StatsDelta {
    pub commits: u64,
    pub commits_pipelined: u64,
    pub blocks_journaled: u64,
    pub direct_writes: u64,
    pub device_flushes: u64,
    pub log_space_waits: u64,
    pub write_buffers_allocated: u64,
    pub write_buffers_reused: u64,
    pub checkpoints: u64,
    pub checkpoint_blocks: u64,
}

impl StatsDelta {
    fn between(a: &Stats, b: &Stats) -> StatsDelta {
        StatsDelta {
            commits: b.commits.saturating_sub(a.commits),
            commits_pipelined: b.commits_pipelined.saturating_sub(a.commits_pipelined),
            blocks_journaled: b.blocks_journaled.saturating_sub(a.blocks_journaled),
            direct_writes: b.direct_writes.saturating_sub(a.direct_writes),
            device_flushes: b.device_flushes.saturating_sub(a.device_flushes),
            log_space_waits: b.log_space_waits.saturating_sub(a.log_space_waits),
            write_buffers_allocated: b
                .write_buffers_allocated
                .saturating_sub(a.write_buffers_allocated),
            write_buffers_reused: b
                .write_buffers_reused
                .saturating_sub(a.write_buffers_reused),
            checkpoints: b.checkpoints.saturating_sub(a.checkpoints),
            checkpoint_blocks: b.checkpoint_blocks.saturating_sub(a.checkpoint_blocks),
        }
    }

    fn add(&mut self, o: &StatsDelta) {
        self.commits += o.commits;
        self.commits_pipelined += o.commits_pipelined;
        self.blocks_journaled += o.blocks_journaled;
        self.direct_writes += o.direct_writes;
        self.device_flushes += o.device_flushes;
        self.log_space_waits += o.log_space_waits;
        self.write_buffers_allocated += o.write_buffers_allocated;
        self.write_buffers_reused += o.write_buffers_reused;
        self.checkpoints += o.checkpoints;
        self.checkpoint_blocks += o.checkpoint_blocks;
    }
}

/// Waits (bounded) until every committed transaction is checkpointed and
/// the checkpoint counters stopped moving (the journal space is freed a
/// moment before the checkpoint's own bookkeeping ends); returns whether it
/// got there.
fn settle(vol: &Volume) -> bool {
    let t0 = Instant::now();
    let mut last_ckpt = None;
    loop {
        let s = vol.stats();
        let idle = s.checkpoint_lag_blocks == 0 && s.checkpoint_lag_transactions == 0;
        if idle && last_ckpt == Some(s.checkpoint_blocks) {
            return true;
        }
        last_ckpt = idle.then_some(s.checkpoint_blocks);
        if t0.elapsed() >= SETTLE_MAX || cleanup::stop_requested() {
            return false;
        }
        std::thread::sleep(SETTLE_POLL);
    }
}

fn mib(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    match (s.get(n / 2), n.checked_sub(1).and_then(|i| s.get(i / 2))) {
        (Some(hi), Some(lo)) if n.is_multiple_of(2) => (hi + lo) / 2.0,
        (Some(m), _) => *m,
        _ => 0.0,
    }
}

/// Writes `data` at `offset` as writes of `piece` bytes with `flags`.
/// Returns each write's latency in microseconds.
fn write_pieces(
    vol: &Volume,
    data: &[u8],
    offset: u64,
    piece: usize,
    flags: WriteFlags,
    lat_us: &mut Vec<f64>,
) -> Result<()> {
    for (i, chunk) in data.chunks(piece.max(1)).enumerate() {
        let t = Instant::now();
        vol.write_at(chunk, offset + (i * piece) as u64, flags)?;
        lat_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(())
}

/// The two sides of a comparison: index 0 large writes, 1 small writes.
const SIDES: [Side; 2] = [Side::Large, Side::Small];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Large,
    Small,
}

impl Side {
    fn bytes(self, p: &LargeWritesParams) -> usize {
        match self {
            Side::Large => p.large_bytes,
            Side::Small => p.small_bytes,
        }
    }
}

fn record(
    phase: &str,
    variant: String,
    write_bytes: usize,
    times_s: Vec<f64>,
    bytes_per_time: u64,
    lat_us: &[f64],
) -> RunRecord {
    let total: f64 = times_s.iter().sum();
    let secs = total.max(1e-9);
    let ops = lat_us.len() as u64;
    RunRecord {
        engine: "jbdev".into(),
        variant,
        phase: phase.into(),
        threads: 1,
        iodepth: 1,
        block_bytes: write_bytes as u64,
        duration_s: total,
        ops,
        write_ops: ops,
        ops_per_sec: ops as f64 / secs,
        mib_per_sec: (bytes_per_time as f64 * times_s.len() as f64) / secs / (1 << 20) as f64,
        latency: LatencySummary::from_samples_us(lat_us),
        times_s,
        ..Default::default()
    }
}

fn stats_record(delta: &StatsDelta, after: &Stats) -> serde_json::Value {
    serde_json::json!({
        "delta": delta,
        "after": after,
    })
}

/// Checks the parameters against the volume size.
fn validate(ctx: &Ctx<'_>, p: &LargeWritesParams) -> Result<()> {
    let bad = |m: String| Err(BenchError::InvalidArgument(m));
    if p.small_bytes == 0
        || !p.small_bytes.is_multiple_of(4096)
        || !p.large_bytes.is_multiple_of(p.small_bytes)
    {
        return bad(format!(
            "large-writes: the small write ({} bytes) must be a multiple of 4096 dividing the large one ({} bytes)",
            p.small_bytes, p.large_bytes
        ));
    }
    if p.large_bytes <= p.small_bytes {
        return bad("large-writes: the large write must be larger than the small one".into());
    }
    let vol = ctx.volume_bytes();
    if p.stream_bytes < p.large_bytes as u64 || p.stream_bytes > vol {
        return bad(format!(
            "large-writes: the stream ({} bytes) must hold one large write and fit in the {vol}-byte volume (raise --backing-size)",
            p.stream_bytes
        ));
    }
    if p.reps == 0 || p.stream_reps == 0 {
        return bad("large-writes: --reps and --stream-reps must be at least 1".into());
    }
    Ok(())
}

/// `jbdev bench large-writes`.
pub fn large_writes(ctx: &Ctx<'_>, p: &LargeWritesParams) -> Result<ScenarioReport> {
    let name = ctx.backing.name();
    let mut rep = ScenarioReport::new("large-writes", name, &ctx.backing.description);
    validate(ctx, p)?;
    let (large, small) = (mib(p.large_bytes as u64), mib(p.small_bytes as u64));
    let data = pattern_buf(p.large_bytes, 11);
    let stop = || {
        if cleanup::stop_requested() {
            Err(BenchError::Interrupted)
        } else {
            Ok(())
        }
    };

    // ---- phase 1: one large write vs the same bytes in small writes ----
    let vol = ctx.create_volume(p.policy)?;
    rep.notes.push(format!(
        "volume: at most {} ({} bytes) per transaction, backend {}; writes larger than a transaction go straight home (direct), smaller ones through the journal",
        mib(vol.max_transaction_bytes()),
        vol.max_transaction_bytes(),
        vol.backend_name()
    ));
    let slots = (ctx.volume_bytes() / p.large_bytes as u64).max(1);
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut lats: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut deltas = [StatsDelta::default(); 2];
    let mut unsettled = 0;
    // The device's own linearity, for reference: the same bytes with
    // O_DIRECT pwrite + fdatasync in the area no volume uses.
    let kernel_fits = p.large_bytes as u64 <= crate::backing::KERNEL_AREA_BYTES;
    let (kfile, kdirect) = open_kernel(&ctx.backing.path, false)?;
    let kpath = ctx.backing.path.display().to_string();
    let mut ktimes: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    // What copying the large write into a fresh aligned buffer costs (the
    // direct path does that once per request): a reference figure.
    let mut copy_s = Vec::new();
    for r in 0..p.reps {
        let t0 = Instant::now();
        let copy = jbdev_device::AlignedBuf::from_slice(&data);
        copy_s.push(t0.elapsed().as_secs_f64());
        drop(std::hint::black_box(copy));
        // Alternate which side goes first.
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            stop()?;
            let Some(&side) = SIDES.get(i) else { continue };
            ctx.progress.step(format!(
                "{name} single {} rep {}/{}",
                mib(side.bytes(p) as u64),
                r + 1,
                p.reps
            ));
            if !settle(&vol) {
                unsettled += 1;
            }
            let offset = ((2 * r + i) as u64 % slots) * p.large_bytes as u64;
            let before = vol.stats();
            let mut write_lat = Vec::new();
            let t0 = Instant::now();
            write_pieces(
                &vol,
                &data,
                offset,
                side.bytes(p),
                WriteFlags::NONE,
                &mut write_lat,
            )?;
            vol.flush()?;
            let dt = t0.elapsed();
            ctx.progress.advance(dt);
            let d = StatsDelta::between(&before, &vol.stats());
            if let (Some(t), Some(l), Some(dd)) =
                (times.get_mut(i), lats.get_mut(i), deltas.get_mut(i))
            {
                t.push(dt.as_secs_f64());
                l.push(dt.as_secs_f64() * 1e6);
                dd.add(&d);
            }
            if kernel_fits {
                let t0 = Instant::now();
                for (k, chunk) in data.chunks(side.bytes(p)).enumerate() {
                    kfile
                        .write_all_at(chunk, ctx.kernel_base() + (k * side.bytes(p)) as u64)
                        .map_err(io_err(format!("pwrite {kpath}")))?;
                }
                kfile
                    .sync_data()
                    .map_err(io_err(format!("fdatasync {kpath}")))?;
                if let Some(t) = ktimes.get_mut(i) {
                    t.push(t0.elapsed().as_secs_f64());
                }
            }
        }
    }
    drop(kfile);
    if unsettled > 0 {
        rep.notes.push(format!(
            "single: {unsettled} repetitions started with checkpoint lag left after {} s of waiting",
            SETTLE_MAX.as_secs()
        ));
    }
    let after = vol.stats();
    for (i, side) in SIDES.iter().enumerate() {
        let (Some(t), Some(l), Some(d)) = (times.get(i), lats.get(i), deltas.get(i)) else {
            continue;
        };
        let n = p.large_bytes / side.bytes(p);
        let variant = if n == 1 {
            format!("1 x {large} + flush")
        } else {
            format!("{n} x {small} + flush")
        };
        let mut rr = record(
            "single",
            variant,
            side.bytes(p),
            t.clone(),
            p.large_bytes as u64,
            l,
        );
        rr.volume_stats = Some(stats_record(d, &after));
        rep.runs.push(rr);
    }
    for (i, side) in SIDES.iter().enumerate() {
        let Some(t) = ktimes.get(i).filter(|t| !t.is_empty()) else {
            continue;
        };
        let n = p.large_bytes / side.bytes(p);
        let lat: Vec<f64> = t.iter().map(|x| x * 1e6).collect();
        let mut rr = record(
            "single",
            format!("{n} x {} pwrite + fdatasync", mib(side.bytes(p) as u64)),
            side.bytes(p),
            t.clone(),
            p.large_bytes as u64,
            &lat,
        );
        rr.engine = "kernel".into();
        if !kdirect {
            rr.note = "O_DIRECT refused by the backing; buffered".into();
        }
        rep.runs.push(rr);
    }
    vol.close()?;

    // ---- phase 2: streams, each on a fresh volume ----
    let mut variants = vec![(WriteFlags::NONE, "flush at end")];
    if p.fua_stream {
        variants.push((WriteFlags::FUA, "FUA each write"));
    }
    for (vi, (flags, what)) in variants.iter().enumerate() {
        // Per side: times, write latencies, counter deltas, CPU, drain times.
        #[derive(Default)]
        struct Acc {
            times: Vec<f64>,
            lat: Vec<f64>,
            delta: StatsDelta,
            cpu: Option<(cpu::CpuTime, cpu::CpuTime)>,
            drained: Vec<f64>,
            after: Option<Stats>,
            bytes: u64,
        }
        let mut acc: [Acc; 2] = [Acc::default(), Acc::default()];
        for sr in 0..p.stream_reps {
            let order = if (vi + sr) % 2 == 0 { [0, 1] } else { [1, 0] };
            for i in order {
                stop()?;
                let (Some(&side), Some(a)) = (SIDES.get(i), acc.get_mut(i)) else {
                    continue;
                };
                ctx.progress.step(format!(
                    "{name} stream {} as {} writes, {what} ({}/{})",
                    mib(p.stream_bytes),
                    mib(side.bytes(p) as u64),
                    sr + 1,
                    p.stream_reps
                ));
                let vol = ctx.create_volume(p.policy)?;
                let before = vol.stats();
                let cpu0 = cpu::mark();
                let t0 = Instant::now();
                let mut off = 0u64;
                // Bounded: stream_bytes / large_bytes iterations.
                while off + p.large_bytes as u64 <= p.stream_bytes {
                    if cleanup::stop_requested() {
                        break;
                    }
                    write_pieces(&vol, &data, off, side.bytes(p), *flags, &mut a.lat)?;
                    off += p.large_bytes as u64;
                }
                vol.flush()?;
                let dt = t0.elapsed();
                let cpu_d = cpu::since(cpu0);
                ctx.progress.advance(dt);
                a.delta.add(&StatsDelta::between(&before, &vol.stats()));
                // How long until the journaled data is home too (not timed above).
                let t1 = Instant::now();
                a.drained.push(if settle(&vol) {
                    t1.elapsed().as_secs_f64()
                } else {
                    -1.0
                });
                a.after = Some(vol.stats());
                vol.close()?;
                stop()?;
                a.times.push(dt.as_secs_f64());
                a.bytes = off;
                if let Some(c) = cpu_d {
                    let (p0, d0) = a.cpu.unwrap_or_default();
                    a.cpu = Some((p0.plus(c.process), d0.plus(c.device)));
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            let Some(side) = SIDES.get(i) else { continue };
            if a.times.is_empty() {
                continue;
            }
            let mut rr = record(
                "stream",
                format!("{} as {}, {what}", mib(a.bytes), mib(side.bytes(p) as u64)),
                side.bytes(p),
                a.times.clone(),
                a.bytes,
                &a.lat,
            )
            .with_cpu(a.cpu, a.lat.len() as u64);
            let mut v = stats_record(&a.delta, &a.after.clone().unwrap_or_default());
            if let Some(m) = v.as_object_mut() {
                m.insert(
                    "checkpoint_drained_after_flush_s".into(),
                    serde_json::json!(a.drained),
                );
            }
            rr.volume_stats = Some(v);
            rep.runs.push(rr);
        }
    }

    // ---- targets: time(large) / time(small) for the same bytes ----
    let find = |phase: &str, bytes: usize, var: &str| {
        rep.runs.iter().find(|r| {
            r.engine == "jbdev"
                && r.phase == phase
                && r.block_bytes == bytes as u64
                && r.variant.contains(var)
        })
    };
    let mut targets = Vec::new();
    if let (Some(l), Some(s)) = (
        find("single", p.large_bytes, "flush"),
        find("single", p.small_bytes, "flush"),
    ) {
        let (tl, ts) = (median(&l.times_s), median(&s.times_s));
        targets.push(TargetCheck::at_most(
            format!(
                "large-writes {name}: one {large} write vs {small} writes, + flush (median time)"
            ),
            tl / ts.max(1e-9),
            TARGET_RATIO,
            format!(
                "{large}: {:.1} ms, {small} writes: {:.1} ms (median of {})",
                tl * 1e3,
                ts * 1e3,
                l.times_s.len().min(s.times_s.len())
            ),
        ));
    }
    for (_, what) in &variants {
        if let (Some(l), Some(s)) = (
            find("stream", p.large_bytes, what),
            find("stream", p.small_bytes, what),
        ) {
            let (tl, ts) = (median(&l.times_s), median(&s.times_s));
            let rate = |t: f64| p.stream_bytes as f64 / t.max(1e-9) / (1 << 20) as f64;
            let t = TargetCheck::at_most(
                format!(
                    "large-writes {name}: {} stream, {large} vs {small} writes, {what} (median time)",
                    mib(p.stream_bytes)
                ),
                tl / ts.max(1e-9),
                TARGET_RATIO,
                format!(
                    "{large} writes {:.0} MiB/s, {small} writes {:.0} MiB/s (median of {})",
                    rate(tl),
                    rate(ts),
                    l.times_s.len().min(s.times_s.len())
                ),
            );
            if flags_is_fua(what) {
                // Not the target (durability per write): a note.
                rep.notes.push(format!(
                    "stream with FUA on every write: time ratio {:.2}x — {}",
                    t.ratio, t.detail
                ));
            } else {
                targets.push(t);
            }
        }
    }
    let kfind = |bytes: usize| {
        rep.runs
            .iter()
            .find(|r| r.engine == "kernel" && r.block_bytes == bytes as u64)
    };
    if let (Some(l), Some(s)) = (kfind(p.large_bytes), kfind(p.small_bytes)) {
        let (tl, ts) = (median(&l.times_s), median(&s.times_s));
        rep.notes.push(format!(
            "the device itself (O_DIRECT pwrite + fdatasync of the same bytes): one {large} write {:.1} ms, {small} writes {:.1} ms, ratio {:.2}x",
            tl * 1e3,
            ts * 1e3,
            tl / ts.max(1e-9)
        ));
    }
    if !copy_s.is_empty() {
        rep.notes.push(format!(
            "copying {large} into a fresh aligned buffer (AlignedBuf::from_slice, as the direct path does per request): median {:.1} ms",
            median(&copy_s) * 1e3
        ));
    }
    rep.targets = targets;
    Ok(rep)
}

fn flags_is_fua(what: &str) -> bool {
    what.starts_with("FUA")
}

/// The large-writes table: time and bytes/s of each side, and the volume
/// counters that show which path the writes took.
pub fn render(s: &ScenarioReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nlarge-writes ({}): same bytes as large vs small writes; counters are deltas over the timed parts, summed over repetitions",
        s.backing
    );
    let _ = writeln!(
        out,
        "{:<6} {:<6} {:<34} {:>4} {:>10} {:>10} {:>9} {:>7} {:>6} {:>9} {:>6} {:>6} {:>7} {:>8}",
        "phase",
        "engine",
        "variant",
        "runs",
        "time_ms",
        "MiB/s",
        "write_p50",
        "commits",
        "direct",
        "journaled",
        "lswait",
        "balloc",
        "breused",
        "ckpt_blk"
    );
    for r in &s.runs {
        let d: Option<StatsDelta> = r
            .volume_stats
            .as_ref()
            .and_then(|v| v.get("delta"))
            .and_then(|v| serde_json::from_value::<StatsDelta>(v.clone()).ok());
        let counters: Vec<String> = match d {
            Some(d) => [
                d.commits,
                d.direct_writes,
                d.blocks_journaled,
                d.log_space_waits,
                d.write_buffers_allocated,
                d.write_buffers_reused,
                d.checkpoint_blocks,
            ]
            .iter()
            .map(|v| v.to_string())
            .collect(),
            None => vec!["-".to_string(); 7],
        };
        let c = |i: usize| counters.get(i).map_or("-", String::as_str);
        let m = median(&r.times_s);
        let mib_per_rep = r.mib_per_sec * r.duration_s / r.times_s.len().max(1) as f64;
        let (time, rate) = (m, mib_per_rep / m.max(1e-9));
        let p50 = if r.phase == "single" {
            "-".to_string()
        } else {
            format!("{:.0}us", r.latency.p50_us)
        };
        let _ = writeln!(
            out,
            "{:<6} {:<6} {:<34} {:>4} {:>10.1} {:>10.1} {:>9} {:>7} {:>6} {:>9} {:>6} {:>6} {:>7} {:>8}",
            r.phase,
            r.engine,
            r.variant,
            r.times_s.len(),
            time * 1e3,
            rate,
            p50,
            c(0),
            c(1),
            c(2),
            c(3),
            c(4),
            c(5),
            c(6)
        );
    }
    let _ = writeln!(
        out,
        "(time_ms: median of the repetitions — single: the 16 MiB until the flush returned; stream: the whole stream until its flush returned; MiB/s: the bytes over that median)"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_sizes() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(mib(16 << 20), "16 MiB");
        assert_eq!(mib(256 << 10), "256 KiB");
    }
}
