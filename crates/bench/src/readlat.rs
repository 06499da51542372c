//! `read-latency`: does background (journal and checkpoint) writeback
//! starve readers, and does a streaming reader starve sync writers?
//!
//! Part 1: a reader reads 1 MiB at a random offset every interval, first
//! on an idle device, then while a streaming writer keeps it busy; the
//! figures are the mean and the 10 slowest reads. Part 2, the reverse:
//! sync-write throughput (4 KiB writes made durable) with and without a
//! streaming reader.
//!
//! jbdev side: everything through one volume; the streaming writer issues
//! plain (non-FUA) writes, which the engine commits and checkpoints in the
//! background. Kernel side: ext4 on the same backing, a buffered streaming
//! writer, `O_DIRECT` reads of a file written beforehand, and
//! `pwrite` + `fdatasync` writers (jbd2's path). The kernel streaming
//! writer calls `posix_fadvise(DONTNEED)` behind itself, which starts
//! asynchronous writeback of what it wrote: with this machine's 24 GiB of
//! RAM the dirty thresholds would otherwise keep the whole stream in the
//! page cache and the device would never be loaded.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use jbdev_volume::{BatchPolicy, WriteFlags};
use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
use rand::{Rng, SeedableRng};

use crate::cleanup;
use crate::ctx::{prefill, stats_json, Ctx};
use crate::error::{io_err, BenchError, Result};
use crate::load::{probe_series, run_load, Op};
use crate::pattern::pattern_buf;
use crate::report::{LatencySummary, RunRecord, ScenarioReport, TargetCheck};

/// Arguments of `read-latency`.
#[derive(Clone, Debug)]
pub struct ReadLatencyParams {
    pub samples: usize,
    pub interval: Duration,
    pub read_bytes: usize,
    /// Bytes per streaming write.
    pub write_bytes: usize,
    /// Region the reader reads from (written beforehand).
    pub read_region_bytes: u64,
    /// Region the streaming writer cycles over.
    pub write_region_bytes: u64,
    /// Threads of the sync-write half.
    pub sync_threads: usize,
    pub policy: BatchPolicy,
}

/// Bound on streaming iterations (the loops also stop on a flag).
const STREAM_OPS_MAX: u64 = 100_000_000;

fn probe_record(
    engine: &str,
    variant: &str,
    phase: &str,
    samples: &[f64],
    note: String,
) -> RunRecord {
    let mut slowest = samples.to_vec();
    slowest.sort_by(|a, b| b.total_cmp(a));
    slowest.truncate(10);
    RunRecord {
        engine: engine.into(),
        variant: variant.into(),
        phase: phase.into(),
        threads: 1,
        iodepth: 1,
        ops: samples.len() as u64,
        read_ops: samples.len() as u64,
        latency: LatencySummary::from_samples_us(samples),
        slowest_us: slowest,
        note,
        ..Default::default()
    }
}

/// Runs `stream(seq)` in a background thread until `body` returns; returns
/// `body`'s result and the bytes streamed per second.
fn with_stream<S, B, T>(mut stream: S, body: B) -> Result<(T, f64)>
where
    S: FnMut(u64) -> Result<u64> + Send,
    B: FnOnce() -> Result<T>,
{
    let stop = AtomicBool::new(false);
    let bytes = AtomicU64::new(0);
    let t0 = Instant::now();
    let (res, stream_res) = std::thread::scope(|s| {
        let h = s.spawn(|| -> Result<()> {
            for seq in 0..STREAM_OPS_MAX {
                if stop.load(Ordering::Relaxed) || cleanup::stop_requested() {
                    break;
                }
                let n = stream(seq)?;
                bytes.fetch_add(n, Ordering::Relaxed);
            }
            Ok(())
        });
        // Let the stream get going before measuring.
        std::thread::sleep(Duration::from_millis(300));
        let res = body();
        stop.store(true, Ordering::Relaxed);
        (res, h.join().expect("streaming thread panicked"))
    });
    stream_res?;
    let rate = bytes.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64() / (1 << 20) as f64;
    Ok((res?, rate))
}

/// `jbdev bench read-latency`.
pub fn read_latency(ctx: &Ctx<'_>, p: &ReadLatencyParams) -> Result<ScenarioReport> {
    let mut rep = ScenarioReport::new("read-latency", ctx.backing.name(), &ctx.backing.description);
    let vol_bytes = ctx.volume_bytes();
    let sync_region = (p.sync_threads as u64) * 64 * 4096;
    if p.read_region_bytes + p.write_region_bytes + sync_region > vol_bytes
        || p.read_region_bytes < p.read_bytes as u64
        || p.write_region_bytes < p.write_bytes as u64
    {
        return Err(BenchError::InvalidArgument(format!(
            "read region {} + write region {} + sync region {} bytes do not fit the {vol_bytes}-byte volume",
            p.read_region_bytes, p.write_region_bytes, sync_region
        )));
    }
    if ctx.backing.can_mount() {
        kernel_side(ctx, p, &mut rep)?;
    } else {
        rep.notes
            .push("kernel side skipped: ext4 needs a block device backing".into());
    }
    jbdev_side(ctx, p, &mut rep)?;
    targets(&mut rep);
    Ok(rep)
}

fn random_read_offset(rng: &mut rand::rngs::StdRng, region: u64, len: usize) -> u64 {
    let slots = region / len as u64;
    rng.gen_range(0..slots) * len as u64
}

fn jbdev_side(ctx: &Ctx<'_>, p: &ReadLatencyParams, rep: &mut ScenarioReport) -> Result<()> {
    let name = ctx.backing.name();
    let vol = ctx.create_volume(p.policy)?;
    let read_base = 0u64;
    let write_base = p.read_region_bytes;
    let sync_base = write_base + p.write_region_bytes;
    ctx.progress.step(format!(
        "{name} jbdev: writing the {} MiB read region",
        p.read_region_bytes >> 20
    ));
    prefill(&vol, read_base, p.read_region_bytes, 7)?;

    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    // Aligned, as the kernel side's O_DIRECT reads need (a `Vec` would cost
    // jbdev a bounce copy the kernel side does not pay).
    let mut buf = pattern_buf(p.read_bytes, 0);
    let mut read_probe = |_i: usize| -> Result<()> {
        let off = random_read_offset(&mut rng, p.read_region_bytes, p.read_bytes);
        vol.read_at(&mut buf, read_base + off)?;
        Ok(())
    };
    ctx.progress.step(format!("{name} jbdev: reads, idle"));
    let idle = probe_series(p.samples, p.interval, ctx.progress, &mut read_probe)?;
    rep.runs.push(probe_record(
        "jbdev",
        "1 MiB read",
        "idle",
        &idle,
        String::new(),
    ));

    ctx.progress
        .step(format!("{name} jbdev: reads under a streaming writer"));
    let wbuf = pattern_buf(p.write_bytes, 8);
    let slots = p.write_region_bytes / p.write_bytes as u64;
    let vref = &vol;
    let (loaded, rate) = with_stream(
        |seq| {
            vref.write_at(
                &wbuf,
                write_base + (seq % slots) * p.write_bytes as u64,
                WriteFlags::NONE,
            )?;
            Ok(p.write_bytes as u64)
        },
        || probe_series(p.samples, p.interval, ctx.progress, &mut read_probe),
    )?;
    rep.runs.push(probe_record(
        "jbdev",
        "1 MiB read",
        "loaded",
        &loaded,
        format!(
            "streaming writer: {rate:.1} MiB/s of {} KiB plain writes",
            p.write_bytes >> 10
        ),
    ));
    vol.flush()?;

    // The reverse: durable 4 KiB writes with and without a streaming reader.
    let sync_run = |phase: &str| -> Result<RunRecord> {
        ctx.progress
            .step(format!("{name} jbdev: sync writes, {phase}"));
        let r = run_load(&ctx.spec(p.sync_threads), ctx.progress, |i| {
            let b = pattern_buf(4096, i as u64 + 1);
            Ok(move |seq: u64| {
                let off = sync_base + (i as u64 * 64 + seq % 64) * 4096;
                vref.write_at(&b, off, WriteFlags::FUA)?;
                Ok(Op::write(4096))
            })
        })?;
        let mut rec = RunRecord::from_load("jbdev", "4 KiB FUA write", p.sync_threads, 1, 4096, &r);
        rec.phase = phase.into();
        Ok(rec)
    };
    rep.runs.push(sync_run("without-reader")?);
    let rslots = p.read_region_bytes / (1 << 20);
    let mut rbuf = pattern_buf(1 << 20, 0);
    let (mut with, rate) = with_stream(
        |seq| {
            vref.read_at(&mut rbuf, read_base + (seq % rslots) * (1 << 20))?;
            Ok(1 << 20)
        },
        || sync_run("with-reader"),
    )?;
    with.note = format!("streaming reader: {rate:.1} MiB/s (its CPU is in this phase's cpu_us/op)");
    with.volume_stats = stats_json(&vol);
    rep.runs.push(with);
    vol.close()?;
    Ok(())
}

fn open_direct_read(path: &Path) -> Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(io_err(format!("open O_DIRECT {}", path.display())))
}

fn kernel_side(ctx: &Ctx<'_>, p: &ReadLatencyParams, rep: &mut ScenarioReport) -> Result<()> {
    let name = ctx.backing.name();
    ctx.progress
        .step(format!("{name} kernel: mkfs.ext4 and mount"));
    let mnt = ctx.backing.mount_ext4()?;
    let read_path = mnt.dir.join("read.dat");
    let stream_path = mnt.dir.join("stream.dat");
    {
        let mut f =
            File::create(&read_path).map_err(io_err(format!("create {}", read_path.display())))?;
        let chunk = pattern_buf(1 << 20, 7);
        let mut left = p.read_region_bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            #[allow(clippy::indexing_slicing)] // n <= chunk.len(): the min above
            let data = &chunk[..n];
            std::io::Write::write_all(&mut f, data).map_err(io_err("write read.dat"))?;
            left -= n as u64;
        }
        f.sync_all().map_err(io_err("fsync read.dat"))?;
    }
    let reader = open_direct_read(&read_path)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    let mut buf = pattern_buf(p.read_bytes, 0);
    let mut read_probe = |_i: usize| -> Result<()> {
        let off = random_read_offset(&mut rng, p.read_region_bytes, p.read_bytes);
        reader
            .read_exact_at(&mut buf, off)
            .map_err(io_err("pread read.dat"))?;
        Ok(())
    };
    ctx.progress.step(format!("{name} kernel: reads, idle"));
    let idle = probe_series(p.samples, p.interval, ctx.progress, &mut read_probe)?;
    rep.runs.push(probe_record(
        "kernel",
        "ext4 O_DIRECT 1 MiB read",
        "idle",
        &idle,
        String::new(),
    ));

    ctx.progress.step(format!(
        "{name} kernel: reads under a buffered streaming writer"
    ));
    let writer =
        File::create(&stream_path).map_err(io_err(format!("create {}", stream_path.display())))?;
    let wbuf = pattern_buf(p.write_bytes, 8);
    let slots = p.write_region_bytes / p.write_bytes as u64;
    let (loaded, rate) = with_stream(
        |seq| {
            let off = (seq % slots) * p.write_bytes as u64;
            writer
                .write_all_at(&wbuf, off)
                .map_err(io_err("write stream.dat"))?;
            // Start writeback of what was just written (see the module doc).
            posix_fadvise(
                &writer,
                off as i64,
                p.write_bytes as i64,
                PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            )
            .map_err(|e| io_err("posix_fadvise stream.dat")(std::io::Error::from(e)))?;
            Ok(p.write_bytes as u64)
        },
        || probe_series(p.samples, p.interval, ctx.progress, &mut read_probe),
    )?;
    rep.runs.push(probe_record(
        "kernel",
        "ext4 O_DIRECT 1 MiB read",
        "loaded",
        &loaded,
        format!("buffered streaming writer: {rate:.1} MiB/s"),
    ));
    writer.sync_all().map_err(io_err("fsync stream.dat"))?;
    drop(writer);

    let files: Vec<File> = (0..p.sync_threads)
        .map(|i| {
            let path = mnt.dir.join(format!("sync-{i}.dat"));
            let f = File::create(&path).map_err(io_err(format!("create {}", path.display())))?;
            f.write_all_at(&pattern_buf(64 * 4096, i as u64), 0)
                .map_err(io_err("prefill sync file"))?;
            f.sync_all().map_err(io_err("fsync sync file"))?;
            Ok(f)
        })
        .collect::<Result<_>>()?;
    let sync_run = |phase: &str| -> Result<RunRecord> {
        ctx.progress
            .step(format!("{name} kernel: sync writes, {phase}"));
        let r = run_load(&ctx.spec(p.sync_threads), ctx.progress, |i| {
            let b = pattern_buf(4096, i as u64 + 1);
            let f = files
                .get(i)
                .ok_or_else(|| BenchError::Setup(format!("no sync file for thread {i}")))?;
            Ok(move |seq: u64| {
                f.write_all_at(&b, (seq % 64) * 4096)
                    .map_err(io_err("pwrite sync file"))?;
                f.sync_data().map_err(io_err("fdatasync sync file"))?;
                Ok(Op::write(4096))
            })
        })?;
        let mut rec = RunRecord::from_load(
            "kernel",
            "ext4 4 KiB write+fdatasync",
            p.sync_threads,
            1,
            4096,
            &r,
        );
        rec.phase = phase.into();
        Ok(rec)
    };
    rep.runs.push(sync_run("without-reader")?);
    let rslots = p.read_region_bytes / (1 << 20);
    let mut rbuf = pattern_buf(1 << 20, 0);
    let (mut with, rate) = with_stream(
        |seq| {
            reader
                .read_exact_at(&mut rbuf, (seq % rslots) * (1 << 20))
                .map_err(io_err("pread read.dat"))?;
            Ok(1 << 20)
        },
        || sync_run("with-reader"),
    )?;
    with.note = format!(
        "streaming O_DIRECT reader: {rate:.1} MiB/s (its CPU is in this phase's cpu_us/op)"
    );
    rep.runs.push(with);
    drop(files);
    drop(reader);
    drop(mnt);
    Ok(())
}

fn targets(rep: &mut ScenarioReport) {
    let name = rep.backing.clone();
    let mut notes = Vec::new();
    for engine in ["jbdev", "kernel"] {
        let idle = rep
            .runs
            .iter()
            .find(|r| r.engine == engine && r.phase == "idle");
        let loaded = rep
            .runs
            .iter()
            .find(|r| r.engine == engine && r.phase == "loaded");
        let without = rep
            .runs
            .iter()
            .find(|r| r.engine == engine && r.phase == "without-reader");
        let with = rep
            .runs
            .iter()
            .find(|r| r.engine == engine && r.phase == "with-reader");
        if let (Some(i), Some(l)) = (idle, loaded) {
            let ratio = l.latency.mean_us / i.latency.mean_us.max(1e-9);
            let detail = format!(
                "loaded mean {:.0} us, idle mean {:.0} us",
                l.latency.mean_us, i.latency.mean_us
            );
            if engine == "jbdev" {
                rep.targets.push(TargetCheck::at_most(
                    format!("read-latency {name} jbdev loaded/idle mean"),
                    ratio,
                    1.5,
                    detail,
                ));
            } else {
                notes.push(format!(
                    "kernel loaded/idle mean read latency: {ratio:.2}x ({detail})"
                ));
            }
        }
        if let (Some(wo), Some(w)) = (without, with) {
            let ratio = w.ops_per_sec / wo.ops_per_sec.max(1e-9);
            let detail = format!(
                "with reader {:.0}/s, without {:.0}/s",
                w.ops_per_sec, wo.ops_per_sec
            );
            if engine == "jbdev" {
                rep.targets.push(TargetCheck::at_least(
                    format!("read-latency {name} jbdev sync writes with/without reader"),
                    ratio,
                    // The target: sync writes with a streaming reader
                    // at least 0.7x of alone (this said 0.9x, stricter than asked).
                    0.7,
                    detail,
                ));
            } else {
                notes.push(format!(
                    "kernel sync writes with/without reader: {ratio:.2}x ({detail})"
                ));
            }
        }
    }
    rep.notes.extend(notes);
}
