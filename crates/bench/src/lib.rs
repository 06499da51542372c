//! `jbdev bench`: the experiments behind jbdev's design lessons (flushes
//! without a lock held, no shared per-I/O counter, adaptive group commit,
//! urgent commit I/O only when someone waits) and the sync-writers load,
//! each run through jbdev and through the kernel's own path on the same
//! backing in one run, so that the ratios hold on a noisy machine.
//!
//! Layout: [`backing`] sets up loop devices and ext4 mounts, [`cleanup`]
//! tears them down on every path (Ctrl-C included), [`load`] drives worker
//! threads and records latencies, one module per scenario family
//! ([`sync`], [`mixed`], [`readlat`]), and [`report`]/[`plot`] turn the
//! records into tables, JSON and SVG/PNG plots.
#![deny(unsafe_code)]
// Parses tool output and /proc: never panic on what it reads.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]
// Output goes through `outln!`/`out!` (jbdev_device::stdout), which return
// an error when stdout is gone: `println!` would panic on a closed pipe.
#![deny(clippy::print_stdout)]

#[macro_use]
extern crate jbdev_device;

pub mod backing;
pub mod cleanup;
pub mod cli;
pub mod cpu;
pub mod ctx;
pub mod devstat;
mod error;
pub mod large;
pub mod load;
pub mod mixed;
pub mod pattern;
pub mod plot;
pub mod progress;
#[cfg(feature = "rbd")]
pub mod rbd;
pub mod readlat;
pub mod report;
pub mod slow;
pub mod sync;

use std::io::Write;
use std::path::Path;
use std::time::Duration;

pub use error::{BenchError, Result};

use backing::{Backing, BackingConfig, BackingKind};
use cli::{Baseline, BenchCommand, CommonArgs};
use ctx::{Ctx, RunConfig};
use jbdev_volume::BatchPolicy;
use plot::{Chart, Series};
use progress::Progress;
use report::{Machine, Report, ScenarioReport};

/// One scenario with its parameters.
#[derive(Clone, Debug)]
pub enum Plan {
    SyncWriters(sync::SyncWritersParams),
    OsyncWriters(sync::OsyncParams),
    FsyncBatch(sync::FsyncBatchParams),
    MixedIops(mixed::MixedParams),
    ReadLatency(readlat::ReadLatencyParams),
    LargeWrites(large::LargeWritesParams),
}

impl Plan {
    fn name(&self) -> &'static str {
        match self {
            Plan::SyncWriters(_) => "sync-writers",
            Plan::OsyncWriters(_) => "osync-writers",
            Plan::FsyncBatch(_) => "fsync-batch",
            Plan::MixedIops(_) => "mixed-iops",
            Plan::ReadLatency(_) => "read-latency",
            Plan::LargeWrites(_) => "large-writes",
        }
    }

    /// Planned measuring time, for the progress bar.
    fn planned(&self, d: Duration) -> Duration {
        match self {
            Plan::SyncWriters(p) => {
                d * (p.threads.len() * if p.kernel_baseline { 2 } else { 1 }) as u32
            }
            Plan::OsyncWriters(_) | Plan::MixedIops(_) => d * 2,
            Plan::FsyncBatch(p) => {
                d * (p.threads.len() * (p.policies.len() + 1 + usize::from(p.fs_mark))) as u32
            }
            Plan::ReadLatency(p) => p.interval * (4 * p.samples) as u32 + d * 4,
            // Bytes, not time: about 300 MiB/s written, four streams each.
            Plan::LargeWrites(p) => Duration::from_secs_f64(
                (4 * p.stream_reps as u64 * p.stream_bytes) as f64 / (300u64 << 20) as f64,
            ),
        }
    }

    fn run(&self, ctx: &Ctx<'_>) -> Result<ScenarioReport> {
        match self {
            Plan::SyncWriters(p) => sync::sync_writers(ctx, p),
            Plan::OsyncWriters(p) => sync::osync_writers(ctx, p),
            Plan::FsyncBatch(p) => sync::fsync_batch(ctx, p),
            Plan::MixedIops(p) => mixed::mixed_iops(ctx, p),
            Plan::ReadLatency(p) => readlat::read_latency(ctx, p),
            Plan::LargeWrites(p) => large::large_writes(ctx, p),
        }
    }
}

fn default_fsync_threads(quick: bool) -> Vec<usize> {
    if quick {
        vec![1, 4, 32]
    } else {
        vec![1, 2, 4, 8, 16, 32]
    }
}

fn default_policies() -> Vec<BatchPolicy> {
    vec![
        BatchPolicy::None,
        BatchPolicy::Fixed(Duration::from_micros(1000)),
        BatchPolicy::Adaptive,
    ]
}

fn default_samples(quick: bool) -> usize {
    if quick {
        8
    } else {
        20
    }
}

/// The scenarios a command runs, and its common options.
pub fn plans(cmd: &BenchCommand) -> Result<(Vec<Plan>, &CommonArgs)> {
    let to_usize = |v: u64, what: &str| {
        usize::try_from(v)
            .map_err(|_| BenchError::InvalidArgument(format!("{what} {v} is too large")))
    };
    let plans = match cmd {
        BenchCommand::SyncWriters(a) => {
            if a.block_size == 0 || a.block_size % 512 != 0 {
                return Err(BenchError::InvalidArgument(
                    "--block-size must be a multiple of 512".into(),
                ));
            }
            vec![Plan::SyncWriters(sync::SyncWritersParams {
                threads: a.threads.clone(),
                kernel_baseline: a.baseline == Baseline::Kernel,
                policy: a.policy,
                block_bytes: to_usize(a.block_size, "block size")?,
            })]
        }
        BenchCommand::OsyncWriters(a) => {
            if a.region_size == 0 || a.region_size % 4096 != 0 {
                return Err(BenchError::InvalidArgument(
                    "--region-size must be a multiple of 4096".into(),
                ));
            }
            vec![Plan::OsyncWriters(sync::OsyncParams {
                threads: a.threads,
                region_bytes: to_usize(a.region_size, "region size")?,
                policy: a.policy,
            })]
        }
        BenchCommand::FsyncBatch(a) => vec![Plan::FsyncBatch(sync::FsyncBatchParams {
            threads: a
                .threads
                .clone()
                .unwrap_or_else(|| default_fsync_threads(a.common.quick)),
            policies: a.policies.clone(),
            fs_mark: !a.no_fs_mark,
        })],
        BenchCommand::MixedIops(a) => vec![Plan::MixedIops(mixed::MixedParams {
            threads: a.threads,
            iodepth: a.iodepth,
            read_percent: a.read_percent.min(100),
            working_set_bytes: a.working_set / 4096 * 4096,
            policy: a.policy,
        })],
        BenchCommand::ReadLatency(a) => {
            if a.write_size == 0 || a.write_size % 4096 != 0 {
                return Err(BenchError::InvalidArgument(
                    "--write-size must be a multiple of 4096".into(),
                ));
            }
            vec![Plan::ReadLatency(readlat::ReadLatencyParams {
                samples: a.samples.unwrap_or_else(|| default_samples(a.common.quick)),
                interval: Duration::from_millis(a.interval_ms),
                read_bytes: 1 << 20,
                write_bytes: to_usize(a.write_size, "write size")?,
                read_region_bytes: 64 << 20,
                write_region_bytes: 256 << 20,
                sync_threads: a.sync_threads,
                policy: a.policy,
            })]
        }
        BenchCommand::LargeWrites(a) => {
            let d = default_large_writes(a.common.quick);
            vec![Plan::LargeWrites(large::LargeWritesParams {
                large_bytes: to_usize(a.large_size, "large size")?,
                small_bytes: to_usize(a.small_size, "small size")?,
                reps: a.reps.unwrap_or(d.reps),
                stream_bytes: a.stream_size.unwrap_or(d.stream_bytes),
                stream_reps: a.stream_reps.unwrap_or(d.stream_reps),
                fua_stream: !a.no_fua,
                policy: a.policy,
            })]
        }
        BenchCommand::All(a) => all_plans(a.common.quick),
    };
    let common = cmd.common();
    if let Some(j) = common.journal_size {
        // The volume under test has 4 KiB blocks; refused here, not once
        // the backing is set up.
        let blocks = j / 4096;
        if !(jbdev_volume::MIN_JOURNAL_BLOCKS..=u64::from(u32::MAX)).contains(&blocks) {
            return Err(BenchError::InvalidArgument(format!(
                "--journal-size {j} must be between {} KiB and 16 TiB in whole 4 KiB blocks",
                jbdev_volume::MIN_JOURNAL_BLOCKS * 4
            )));
        }
    }
    for p in &plans {
        let threads_ok = match p {
            Plan::SyncWriters(s) => {
                s.threads.iter().all(|&t| (1..=1024).contains(&t)) && !s.threads.is_empty()
            }
            Plan::OsyncWriters(s) => (1..=1024).contains(&s.threads),
            Plan::FsyncBatch(s) => {
                s.threads.iter().all(|&t| (1..=1024).contains(&t)) && !s.threads.is_empty()
            }
            Plan::MixedIops(s) => (1..=1024).contains(&(s.threads * s.iodepth)),
            Plan::ReadLatency(s) => (1..=256).contains(&s.sync_threads) && s.samples >= 1,
            Plan::LargeWrites(s) => {
                (1..=1000).contains(&s.reps) && (1..=100).contains(&s.stream_reps)
            }
        };
        if !threads_ok {
            return Err(BenchError::InvalidArgument(format!(
                "{}: thread counts must be 1..=1024 (threads × iodepth for mixed-iops), samples at least 1, --reps 1..=1000 and --stream-reps 1..=100",
                p.name()
            )));
        }
    }
    Ok((plans, common))
}

/// Every scenario with its defaults.
pub fn all_plans(quick: bool) -> Vec<Plan> {
    vec![
        Plan::SyncWriters(sync::SyncWritersParams {
            threads: vec![1, 32],
            kernel_baseline: true,
            policy: BatchPolicy::Adaptive,
            block_bytes: 4096,
        }),
        Plan::OsyncWriters(sync::OsyncParams {
            threads: 64,
            region_bytes: 64 << 10,
            policy: BatchPolicy::Adaptive,
        }),
        Plan::FsyncBatch(sync::FsyncBatchParams {
            threads: default_fsync_threads(quick),
            policies: default_policies(),
            fs_mark: true,
        }),
        Plan::MixedIops(mixed::MixedParams {
            threads: 4,
            iodepth: 8,
            read_percent: 50,
            working_set_bytes: 128 << 20,
            policy: BatchPolicy::Adaptive,
        }),
        Plan::ReadLatency(readlat::ReadLatencyParams {
            samples: default_samples(quick),
            interval: Duration::from_millis(500),
            read_bytes: 1 << 20,
            write_bytes: 512 << 10,
            read_region_bytes: 64 << 20,
            write_region_bytes: 256 << 20,
            sync_threads: 4,
            policy: BatchPolicy::Adaptive,
        }),
        Plan::LargeWrites(default_large_writes(quick)),
    ]
}

/// `large-writes` with its defaults (about 10 s per backing with --quick).
fn default_large_writes(quick: bool) -> large::LargeWritesParams {
    large::LargeWritesParams {
        large_bytes: 16 << 20,
        small_bytes: 1 << 20,
        reps: if quick { 5 } else { 9 },
        stream_bytes: if quick { 128 << 20 } else { 512 << 20 },
        stream_reps: if quick { 2 } else { 3 },
        fua_stream: true,
        policy: BatchPolicy::Adaptive,
    }
}

/// Runs a `jbdev bench` command: tables on stdout, plots and JSON as asked.
pub fn run(cmd: &BenchCommand) -> Result<Report> {
    cleanup::install_signal_handler();
    let (plans, common) = plans(cmd)?;
    let visible = !common.no_progress;
    run_plans(
        &plans,
        common,
        &mut std::io::stdout(),
        visible,
        &format!("{cmd:?}"),
    )
}

/// Runs `plans` on the backings `common` names; writes tables to `out`.
pub fn run_plans(
    plans: &[Plan],
    common: &CommonArgs,
    out: &mut dyn Write,
    progress_visible: bool,
    command: &str,
) -> Result<Report> {
    let kinds: Vec<BackingKind> = match &common.device {
        Some(p) => vec![BackingKind::Device(p.clone())],
        None => common.backing.clone(),
    };
    if kinds.is_empty() {
        return Err(BenchError::InvalidArgument("no backing given".into()));
    }
    let needs_loop = kinds.iter().any(|k| !matches!(k, BackingKind::Device(_)));
    if needs_loop && !backing::loop_devices_available() {
        return Err(BenchError::Setup(
            "the ram, disk and slow backings need root and loop devices (losetup); run as root or use --device PATH".into(),
        ));
    }
    if needs_loop {
        ctx::check_room(
            &format!("--backing-size {}", common.backing_size),
            common.backing_size,
            common.journal_size,
        )?;
    }
    // The output paths first: one that cannot be written fails now, not
    // after the whole run.
    let mut json = common.json.as_deref().map(JsonReport::open).transpose()?;
    if !common.no_plots {
        std::fs::create_dir_all(&common.plot_dir).map_err(error::io_err(format!(
            "create the plot directory {}",
            common.plot_dir.display()
        )))?;
    }
    let cfg = RunConfig {
        duration: common.run_duration(),
        quick: common.quick,
        journal_bytes: common.journal_size,
        backend: common.backend,
        max_batch: common.max_batch_us.map(Duration::from_micros),
        direct_write_threshold: common.direct_write_threshold,
        pipeline_depth: common.pipeline_depth,
        write_pacing: common.write_pacing,
        ..RunConfig::default()
    };
    let bcfg = BackingConfig {
        size_bytes: common.backing_size,
        disk_dir: common.backing_dir.clone(),
        force: common.force,
        slow_flush: Duration::from_secs_f64(common.slow_flush_ms.clamp(0.0, 1000.0) / 1e3),
        slow_on_disk: common.slow_store == cli::SlowStore::Disk,
        ..BackingConfig::default()
    };
    let mut report = Report {
        tool: format!("jbdev-bench {}", env!("CARGO_PKG_VERSION")),
        started_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        machine: Machine::detect(),
        quick: common.quick,
        command: command.to_string(),
        scenarios: Vec::new(),
        verdicts: Vec::new(),
    };
    outln!(to out,
        "jbdev bench: {} cpus ({}), kernel {}, {} s per run{}",
        report.machine.cpus,
        report.machine.cpu_model,
        report.machine.kernel,
        cfg.duration.as_secs_f64(),
        if cfg.quick { ", quick" } else { "" }
    )?;
    let mut failures = Vec::new();
    // Whether every failure so far refused a flag's value (a backing or
    // `--device` too small, a region that does not fit the volume): the
    // run then fails as a usage error, as `plans` refusals do.
    let mut usage_only = true;
    'backings: for kind in &kinds {
        let b = match Backing::setup(kind, &bcfg) {
            Ok(b) => b,
            Err(BenchError::Interrupted) => return Err(BenchError::Interrupted),
            Err(e) => {
                usage_only &= matches!(e, BenchError::InvalidArgument(_));
                failures.push(format!("backing {}: {e}", kind.name()));
                continue;
            }
        };
        if let Err(e) = ctx::check_room(
            &format!("{} ({} bytes)", b.path.display(), b.size_bytes),
            b.size_bytes,
            common.journal_size,
        ) {
            usage_only &= matches!(e, BenchError::InvalidArgument(_));
            failures.push(format!("backing {}: {e}", kind.name()));
            continue;
        }
        for plan in plans {
            // This plan's rounds are the reports pushed from here on.
            let first_round = report.scenarios.len();
            for round in 1..=common.rounds {
                if common.rounds > 1 {
                    outln!(to out,
                        "\n--- {} on {}: round {round} of {}",
                        plan.name(),
                        kind.name(),
                        common.rounds
                    )?;
                }
                let progress = if progress_visible {
                    Progress::new(plan.planned(cfg.duration), true)
                } else {
                    Progress::hidden()
                };
                let ctx = Ctx {
                    backing: &b,
                    cfg: &cfg,
                    progress: &progress,
                    round,
                };
                let res = plan.run(&ctx);
                progress.finish();
                match res {
                    Ok(mut rep) => {
                        if let Some(e) = finish_scenario(&mut rep, plan, &b, common, out)? {
                            usage_only = false;
                            failures.push(format!(
                                "plots of {} on {}: {e}",
                                plan.name(),
                                kind.name()
                            ));
                        }
                        report.scenarios.push(rep);
                    }
                    Err(BenchError::Interrupted) => {
                        drop(b);
                        return Err(BenchError::Interrupted);
                    }
                    Err(e) => {
                        usage_only &= matches!(e, BenchError::InvalidArgument(_));
                        let msg = format!("{} on {}: {e}", plan.name(), kind.name());
                        outln!(to out, "\n=== {msg}")?;
                        failures.push(msg);
                    }
                }
                if cleanup::stop_requested() {
                    break 'backings;
                }
            }
            let rounds_done = report.scenarios.get(first_round..).unwrap_or_default();
            if common.rounds > 1 && !rounds_done.is_empty() {
                let verdicts = report::median_verdicts(rounds_done);
                if !verdicts.is_empty() {
                    outln!(to out,
                        "\n=== {} on {}: targets by the median of {} rounds",
                        plan.name(),
                        kind.name(),
                        rounds_done.len()
                    )?;
                    for v in &verdicts {
                        outln!(to out, "{}", report::render_target(v))?;
                    }
                }
                report.verdicts.extend(verdicts);
            }
        }
    }
    if cleanup::stop_requested() {
        return Err(BenchError::Interrupted);
    }
    let all_targets = report.final_targets();
    if !all_targets.is_empty() {
        let met = all_targets.iter().filter(|t| t.met).count();
        let by = if !report.verdicts.is_empty() {
            format!(" (each by the median of {} rounds)", common.rounds)
        } else {
            String::new()
        };
        outln!(to out, "\ntargets: {met} of {} met{by}", all_targets.len())?;
    }
    if let Some(j) = &mut json {
        j.write(&report)?;
        outln!(to out, "json: {}", j.path.display())?;
    }
    let plots_failed = failures.iter().any(|f| f.starts_with("plots of "));
    if !common.no_plots && !report.scenarios.is_empty() && !plots_failed {
        outln!(to out, "plots: {}", common.plot_dir.display())?;
    }
    if !failures.is_empty() {
        let what = format!("{} failed: {}", failures.len(), failures.join("; "));
        return Err(if usage_only {
            BenchError::InvalidArgument(what)
        } else {
            BenchError::Setup(what)
        });
    }
    Ok(report)
}

/// The `--json` file, opened before the run, so that a path that cannot be
/// written fails at once; written (replacing what it held) at the end.
/// Removed again if this run created it and ends without writing it.
struct JsonReport {
    file: std::fs::File,
    path: std::path::PathBuf,
    created: bool,
    written: bool,
}

impl JsonReport {
    fn open(path: &Path) -> Result<JsonReport> {
        let created = std::fs::symlink_metadata(path).is_err();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(error::io_err(format!("create {}", path.display())))?;
        Ok(JsonReport {
            file,
            path: path.to_path_buf(),
            created,
            written: false,
        })
    }

    fn write(&mut self, report: &Report) -> Result<()> {
        let what = || format!("write {}", self.path.display());
        self.file.set_len(0).map_err(error::io_err(what()))?;
        let mut w = std::io::BufWriter::new(&self.file);
        serde_json::to_writer_pretty(&mut w, report)?;
        w.flush().map_err(error::io_err(what()))?;
        self.written = true;
        Ok(())
    }
}

impl Drop for JsonReport {
    fn drop(&mut self) {
        if self.created && !self.written {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Adds a finished scenario's notes (CPU accounting, the slow backing's
/// counters) and plots, and prints its tables. Returns why its plots
/// failed, if they did (the run goes on, and ends with an error).
fn finish_scenario(
    rep: &mut ScenarioReport,
    plan: &Plan,
    b: &Backing,
    common: &CommonArgs,
    out: &mut dyn Write,
) -> Result<Option<String>> {
    if rep.runs.iter().any(|r| r.cpu_us_per_op.is_some()) {
        rep.notes.push(report::CPU_NOTE.into());
    }
    if let Some(s) = b.slow_server() {
        rep.notes.push(format!(
            "slow backing: FUSE saw {} fsyncs and {} flushes so far, {:.1} ms each; its server threads' CPU is excluded from cpu_us/op",
            s.stats.fsyncs.load(std::sync::atomic::Ordering::Relaxed),
            s.stats.flushes.load(std::sync::atomic::Ordering::Relaxed),
            s.delay.as_secs_f64() * 1e3
        ));
    }
    let mut plots_failed = None;
    if !common.no_plots {
        match write_plots(rep, &common.plot_dir) {
            Ok(files) => rep.plots = files,
            Err(e) => {
                rep.notes.push(format!("plots failed: {e}"));
                plots_failed = Some(e.to_string());
            }
        }
    }
    out!(to out,
        "{}",
        report::render_scenario(rep, plan.name() == "mixed-iops")
    )?;
    if plan.name() == "fsync-batch" {
        out!(to out, "{}", report::render_matrix(rep))?;
    }
    if plan.name() == "large-writes" {
        out!(to out, "{}", large::render(rep))?;
    }
    Ok(plots_failed)
}

/// Throughput and latency-CDF plots of one scenario.
pub fn write_plots(rep: &ScenarioReport, dir: &Path) -> Result<Vec<String>> {
    let stem = format!("{}-{}", rep.scenario, rep.backing);
    let mut charts: Vec<(String, Chart)> = Vec::new();
    let label = |r: &report::RunRecord| format!("{} {}", r.engine, r.variant);
    match rep.scenario.as_str() {
        "sync-writers" | "fsync-batch" => {
            let mut series: Vec<Series> = Vec::new();
            for r in &rep.runs {
                let name = label(r);
                match series.iter_mut().find(|s| s.name == name) {
                    Some(s) => s.points.push((r.threads as f64, r.ops_per_sec)),
                    None => series.push(Series {
                        name,
                        points: vec![(r.threads as f64, r.ops_per_sec)],
                    }),
                }
            }
            charts.push((
                "throughput".into(),
                Chart {
                    title: format!(
                        "{} on {}: durable 4 KiB writes/s",
                        rep.scenario, rep.backing
                    ),
                    x_label: "threads".into(),
                    y_label: "ops/s".into(),
                    x_log: true,
                    series,
                },
            ));
            let mut cpu: Vec<Series> = Vec::new();
            for r in rep.runs.iter().filter(|r| r.engine != "fs_mark") {
                let Some(v) = r.cpu_us_per_op else { continue };
                let name = label(r);
                match cpu.iter_mut().find(|s| s.name == name) {
                    Some(s) => s.points.push((r.threads as f64, v)),
                    None => cpu.push(Series {
                        name,
                        points: vec![(r.threads as f64, v)],
                    }),
                }
            }
            charts.push((
                "cpu".into(),
                Chart {
                    title: format!(
                        "{} on {}: CPU us per op (bench process; kernel threads not counted)",
                        rep.scenario, rep.backing
                    ),
                    x_label: "threads".into(),
                    y_label: "user+sys us/op".into(),
                    x_log: true,
                    series: cpu,
                },
            ));
            let max_t = rep.runs.iter().map(|r| r.threads).max().unwrap_or(1);
            charts.push((
                "latency-cdf".into(),
                cdf_chart(
                    rep,
                    |r| r.threads == max_t && r.latency.samples > 0,
                    &format!("at {max_t} threads"),
                ),
            ));
        }
        "osync-writers" | "mixed-iops" => {
            let (y, f): (&str, fn(&report::RunRecord) -> Vec<f64>) =
                if rep.scenario == "osync-writers" {
                    ("MiB/s", |r| r.per_second_mib.clone())
                } else {
                    ("IOPS", |r| {
                        r.per_second_ops.iter().map(|&v| v as f64).collect()
                    })
                };
            charts.push((
                "per-second".into(),
                Chart {
                    title: format!("{} on {}: {y} each second", rep.scenario, rep.backing),
                    x_label: "second".into(),
                    y_label: y.into(),
                    x_log: false,
                    series: rep
                        .runs
                        .iter()
                        .map(|r| Series {
                            name: label(r),
                            points: f(r)
                                .iter()
                                .enumerate()
                                .map(|(i, v)| (i as f64 + 1.0, *v))
                                .collect(),
                        })
                        .collect(),
                },
            ));
            charts.push((
                "latency-cdf".into(),
                cdf_chart(rep, |r| r.latency.samples > 0, ""),
            ));
        }
        "read-latency" => {
            charts.push((
                "reads".into(),
                Chart {
                    title: format!(
                        "read-latency on {}: 1 MiB read latency, slowest first",
                        rep.backing
                    ),
                    x_label: "rank".into(),
                    y_label: "latency (ms)".into(),
                    x_log: false,
                    series: rep
                        .runs
                        .iter()
                        .filter(|r| !r.slowest_us.is_empty())
                        .map(|r| Series {
                            name: r.label(),
                            points: r
                                .slowest_us
                                .iter()
                                .enumerate()
                                .map(|(i, v)| (i as f64 + 1.0, v / 1000.0))
                                .collect(),
                        })
                        .collect(),
                },
            ));
            charts.push((
                "sync-cdf".into(),
                cdf_chart(
                    rep,
                    |r| r.slowest_us.is_empty() && r.latency.samples > 0,
                    "sync writes",
                ),
            ));
        }
        _ => {}
    }
    let mut files = Vec::new();
    for (kind, chart) in charts {
        if chart.series.iter().all(|s| s.points.is_empty()) {
            continue;
        }
        for p in plot::write_chart(&chart, dir, &format!("{stem}-{kind}"))? {
            files.push(p.display().to_string());
        }
    }
    Ok(files)
}

fn cdf_chart(rep: &ScenarioReport, pick: impl Fn(&report::RunRecord) -> bool, what: &str) -> Chart {
    Chart {
        title: format!(
            "{} on {}: completion latency CDF {what}",
            rep.scenario, rep.backing
        ),
        x_label: "latency (us, log)".into(),
        y_label: "fraction of operations".into(),
        x_log: true,
        series: rep
            .runs
            .iter()
            .filter(|r| pick(r))
            .map(|r| Series {
                name: format!("{} x{}", r.label(), r.threads * r.iodepth.max(1)),
                points: r.latency.cdf.clone(),
            })
            .collect(),
    }
}
