//! Command-line arguments of `jbdev bench` (clap), shared with the CLI crate.

use std::path::PathBuf;
use std::time::Duration;

use jbdev_device::Backend;
use jbdev_volume::BatchPolicy;

use crate::backing::BackingKind;

/// `jbdev bench <scenario>`.
#[derive(clap::Subcommand, Clone, Debug)]
pub enum BenchCommand {
    /// N threads each writing 4 KiB with FUA (ops/s, latency percentiles);
    /// `--baseline kernel` runs O_DIRECT|O_SYNC pwrite on the same backing.
    SyncWriters(SyncWritersArgs),
    /// T threads each rewriting its own 64 KiB region synchronously (do
    /// writers serialize while the device flushes?); MiB/s, per-second
    /// series, latency.
    OsyncWriters(OsyncArgs),
    /// Group commit: 4 KiB write + sync at 1..32 threads for each batching
    /// policy, the kernel's O_DIRECT|O_SYNC path and fs_mark on ext4.
    FsyncBatch(FsyncBatchArgs),
    /// 4 KiB random 50/50 read/write, threads × queue depth (IOPS scaling).
    MixedIops(MixedArgs),
    /// 1 MiB read latency under a streaming writer, and sync-write
    /// throughput under a streaming reader.
    ReadLatency(ReadLatencyArgs),
    /// Issue 11: one 16 MiB write vs sixteen 1 MiB writes (+ flush), and a
    /// 512 MiB stream as 16 MiB vs 1 MiB writes; time ratio (target <= 1.2x)
    /// and the volume counters showing which path the writes took.
    LargeWrites(LargeWritesArgs),
    /// Every scenario above with its defaults (`--quick`: under 3 minutes).
    All(AllArgs),
}

impl BenchCommand {
    /// The options every scenario takes, as given to this one.
    pub fn common(&self) -> &CommonArgs {
        match self {
            BenchCommand::SyncWriters(a) => &a.common,
            BenchCommand::OsyncWriters(a) => &a.common,
            BenchCommand::FsyncBatch(a) => &a.common,
            BenchCommand::MixedIops(a) => &a.common,
            BenchCommand::ReadLatency(a) => &a.common,
            BenchCommand::LargeWrites(a) => &a.common,
            BenchCommand::All(a) => &a.common,
        }
    }
}

/// Options every scenario takes.
#[derive(clap::Args, Clone, Debug)]
pub struct CommonArgs {
    /// Backings, comma separated: ram (loop over /dev/shm), disk (loop with
    /// direct-io over a file in --backing-dir), slow (loop over a file on a
    /// FUSE file system whose fsync takes --slow-flush-ms; needs /dev/fuse).
    #[arg(long, value_delimiter = ',', default_value = "ram,disk")]
    pub backing: Vec<BackingKind>,
    /// Extra milliseconds of every fsync/flush on the slow backing.
    #[arg(long, default_value_t = 2.0, value_name = "MS")]
    pub slow_flush_ms: f64,
    /// Where the slow backing's reads and writes go: a store file in
    /// /dev/shm (ram) or in --backing-dir (disk).
    #[arg(long, value_enum, default_value = "ram")]
    pub slow_store: SlowStore,
    /// Benchmark this block device or file instead. ITS CONTENT IS DESTROYED;
    /// one that holds a jbdev volume, a jbdev journal or a file system is
    /// refused unless --force.
    #[arg(long, value_name = "PATH")]
    pub device: Option<PathBuf>,
    /// Overwrite a --device that holds a jbdev volume, a jbdev journal or a file system.
    #[arg(long)]
    pub force: bool,
    /// Size of the backing file of ram/disk (K/M/G suffixes).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub backing_size: u64,
    /// Directory of the disk backing file.
    #[arg(long, default_value = "/var/tmp")]
    pub backing_dir: PathBuf,
    /// Seconds per measured run, 0.1 to 3600 (default 3; 1 with --quick).
    /// Runs below a second suit smoke tests: their MET/MISS verdicts are
    /// start-up noise.
    #[arg(long, value_name = "SECS", value_parser = parse_duration_secs)]
    pub duration: Option<f64>,
    /// Fewer points, samples and seconds.
    #[arg(long)]
    pub quick: bool,
    /// Write every figure as JSON here (opened before the run: a path that
    /// cannot be written fails at once).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Directory of the SVG and PNG plots (created before the run; plots
    /// that fail end the run with an error).
    #[arg(long, default_value = "bench-results")]
    pub plot_dir: PathBuf,
    /// Do not draw plots.
    #[arg(long)]
    pub no_plots: bool,
    /// Journal size of the volume under test (K/M/G suffix); default: the engine's.
    #[arg(long, value_parser = parse_size)]
    pub journal_size: Option<u64>,
    /// Device backend of the volume under test: auto, uring or pread.
    #[arg(long, default_value = "auto")]
    pub backend: Backend,
    /// Upper bound of adaptive batching, in microseconds (default: the engine's 15 ms).
    #[arg(long)]
    pub max_batch_us: Option<u64>,
    /// Writes of at least this many bytes bypass the journal (K/M/G
    /// suffix); default: the engine's (never: only requests larger than one
    /// transaction go straight home).
    #[arg(long, value_parser = parse_size)]
    pub direct_write_threshold: Option<u64>,
    /// Commits in flight at once in the volume under test (1 = one commit
    /// at a time, the first engine's behaviour); default: the engine's.
    #[arg(long)]
    pub pipeline_depth: Option<u32>,
    /// Write pacing in the volume under test (see `jbdev serve --write-pacing`).
    #[arg(long)]
    pub write_pacing: bool,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Runs every scenario this many times, one after the other, and
    /// judges each target by the median of its rounds' ratios (every
    /// round's ratio is printed next to it). This machine's run-to-run
    /// noise is 10-15%; one round cannot tell 0.95x from 1.05x.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=15))]
    pub rounds: u32,
    /// Exit with status 2 when a target was missed (a CI gate). Without
    /// it a bench that ran exits 0 whatever its MET/MISS verdicts: a missed
    /// target is a finding, not a failure of the tool.
    #[arg(long)]
    pub fail_on_miss: bool,
}

/// The shortest `--duration`, in seconds: shorter runs time a handful of
/// operations, mostly start-up.
pub const MIN_RUN_SECS: f64 = 0.1;

/// The longest `--duration`, in seconds.
pub const MAX_RUN_SECS: f64 = 3600.0;

impl CommonArgs {
    /// Seconds per measured run.
    pub fn run_duration(&self) -> Duration {
        Duration::from_secs_f64(
            self.duration
                .unwrap_or(if self.quick { 1.0 } else { 3.0 })
                .clamp(MIN_RUN_SECS, MAX_RUN_SECS),
        )
    }
}

/// Parses `--duration`: seconds from [`MIN_RUN_SECS`] to [`MAX_RUN_SECS`]
/// (refused outside that range, and NaN, rather than clamped: a run of
/// almost nothing would still print verdicts).
pub fn parse_duration_secs(s: &str) -> Result<f64, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if (MIN_RUN_SECS..=MAX_RUN_SECS).contains(&secs) {
        Ok(secs)
    } else {
        Err(format!(
            "a measured run lasts from {MIN_RUN_SECS} to {MAX_RUN_SECS} seconds (got {s}): a \
             shorter one measures start-up, not the steady state"
        ))
    }
}

/// `--slow-store`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlowStore {
    /// A file in /dev/shm.
    Ram,
    /// A file in --backing-dir (fdatasync'd after each delayed fsync).
    Disk,
}

/// `--baseline`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Baseline {
    /// O_DIRECT|O_SYNC pwrite on the same backing.
    Kernel,
    /// jbdev only.
    None,
}

#[derive(clap::Args, Clone, Debug)]
pub struct SyncWritersArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Thread counts, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    pub threads: Vec<usize>,
    /// What jbdev is compared with: kernel (O_DIRECT|O_SYNC pwrite on the
    /// same backing) or none.
    #[arg(long, value_enum, default_value = "kernel")]
    pub baseline: Baseline,
    /// Batching policy: none, fixed:N (a wait of N microseconds), adaptive.
    #[arg(long, default_value = "adaptive")]
    pub policy: BatchPolicy,
    /// Bytes per write.
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    pub block_size: u64,
    /// Benchmark on Ceph RBD instead (build with `--features rbd`):
    /// `rbd:POOL/IMAGE[:conf=PATH][:id=USER]` — plain librbd write + flush
    /// per write against jbdev with a local journal (in --backing-dir) and
    /// with its journal on RBD, each on its own image, created if missing:
    /// IMAGE of --backing-size; IMAGE-jl and IMAGE-jr, jbdev volumes of
    /// --backing-size less the journal (--journal-size, default 64M) and
    /// 1M; IMAGE-jr-journal of the journal's size. THEIR CONTENT IS
    /// DESTROYED.
    #[arg(long, value_name = "rbd:POOL/IMAGE")]
    pub target: Option<String>,
}

#[derive(clap::Args, Clone, Debug)]
pub struct OsyncArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Writer threads, each with its own region.
    #[arg(long, default_value_t = 64)]
    pub threads: usize,
    /// Each thread's region, rewritten whole by every write (K/M/G suffixes).
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    pub region_size: u64,
    /// Batching policy: none, fixed:N (a wait of N microseconds), adaptive.
    #[arg(long, default_value = "adaptive")]
    pub policy: BatchPolicy,
}

#[derive(clap::Args, Clone, Debug)]
pub struct FsyncBatchArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Thread counts (default 1,2,4,8,16,32; with --quick 1,4,32).
    #[arg(long, value_delimiter = ',')]
    pub threads: Option<Vec<usize>>,
    /// Batching policies to compare.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,fixed:1000,adaptive"
    )]
    pub policies: Vec<BatchPolicy>,
    /// Skip the fs_mark reference on ext4.
    #[arg(long)]
    pub no_fs_mark: bool,
}

#[derive(clap::Args, Clone, Debug)]
pub struct MixedArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Threads; each keeps --iodepth requests in flight (threads × iodepth
    /// submitters, each with one synchronous request).
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Requests in flight per thread.
    #[arg(long, default_value_t = 8)]
    pub iodepth: usize,
    /// Percentage of the requests that are reads (the rest are plain writes).
    #[arg(long, default_value_t = 50)]
    pub read_percent: u32,
    /// Range the random offsets fall in (K/M/G suffixes).
    #[arg(long, default_value = "128M", value_parser = parse_size)]
    pub working_set: u64,
    /// Batching policy: none, fixed:N (a wait of N microseconds), adaptive.
    #[arg(long, default_value = "adaptive")]
    pub policy: BatchPolicy,
}

#[derive(clap::Args, Clone, Debug)]
pub struct ReadLatencyArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Reads per phase (default 20; 8 with --quick; the seed took 90).
    #[arg(long)]
    pub samples: Option<usize>,
    /// Milliseconds between reads.
    #[arg(long, default_value_t = 500)]
    pub interval_ms: u64,
    /// Bytes per streaming write (K/M/G suffixes).
    #[arg(long, default_value = "512K", value_parser = parse_size)]
    pub write_size: u64,
    /// Threads of the sync-write half.
    #[arg(long, default_value_t = 4)]
    pub sync_threads: usize,
    /// Batching policy: none, fixed:N (a wait of N microseconds), adaptive.
    #[arg(long, default_value = "adaptive")]
    pub policy: BatchPolicy,
}

#[derive(clap::Args, Clone, Debug)]
pub struct LargeWritesArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The large write.
    #[arg(long, default_value = "16M", value_parser = parse_size)]
    pub large_size: u64,
    /// The small writes the same bytes are cut into.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub small_size: u64,
    /// Bytes of each stream (default 512M; 128M with --quick).
    #[arg(long, value_parser = parse_size)]
    pub stream_size: Option<u64>,
    /// Timed repetitions of each side of the single-write phase (default 9;
    /// 5 with --quick); the figure is the median.
    #[arg(long)]
    pub reps: Option<usize>,
    /// Streams per side and variant, alternating which side goes first; the
    /// figure is the median (default 3; 2 with --quick).
    #[arg(long)]
    pub stream_reps: Option<usize>,
    /// Skip the stream variant with FUA on every write.
    #[arg(long)]
    pub no_fua: bool,
    /// Batching policy: none, fixed:N (a wait of N microseconds), adaptive.
    #[arg(long, default_value = "adaptive")]
    pub policy: BatchPolicy,
}

#[derive(clap::Args, Clone, Debug)]
pub struct AllArgs {
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Parses a size in bytes — "4096", "64K", "1M", "2G", "1T", also spelled
/// "KiB"/"KB"/"k" (every suffix is a power of 1024) — for every size option
/// of the `jbdev` command.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = (t.get(..digits_end), t.get(digits_end..));
    let (Some(digits), Some(suffix)) = (digits, suffix) else {
        return Err(format!("bad size {s:?}"));
    };
    if digits.is_empty() {
        return Err(format!(
            "bad size {s:?}: expected a number with an optional K, M, G or T suffix"
        ));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("bad size {s:?}: number too large"))?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        other => {
            return Err(format!(
                "bad size {s:?}: unknown suffix {other:?} (use K, M, G or T)"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("bad size {s:?}: too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("8 MB"), Ok(8 << 20));
        assert_eq!(parse_size(" 1t "), Ok(1 << 40));
        assert_eq!(parse_size("512B"), Ok(512));
        assert!(parse_size("1X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("K").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert!(parse_size("99999999999999999999").is_err());
    }

    #[test]
    fn durations_parse_within_their_range() {
        assert_eq!(parse_duration_secs("0.1"), Ok(0.1));
        assert_eq!(parse_duration_secs("3"), Ok(3.0));
        assert_eq!(parse_duration_secs("3600"), Ok(3600.0));
        for bad in ["0", "-1", "0.05", "NaN", "inf", "3601", "", "3s"] {
            assert!(parse_duration_secs(bad).is_err(), "{bad}");
        }
    }
}
