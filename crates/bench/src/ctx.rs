//! What every scenario needs: the backing, run-wide settings, the progress
//! bar, and helpers to open jbdev's side on it (the kernel's side opens
//! the raw backing with [`crate::backing::open_kernel`]).

use std::time::Duration;

use jbdev_device::Backend;
use jbdev_volume::{BatchPolicy, FormatOptions, OpenOptions, Volume};

use crate::backing::{Backing, KERNEL_AREA_BYTES};
use crate::error::Result;
use crate::load::LoadSpec;
use crate::pattern::pattern_buf;
use crate::progress::Progress;

/// Settings shared by every scenario of a run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Length of one measured run.
    pub duration: Duration,
    /// `--quick`: fewer points and samples.
    pub quick: bool,
    /// Journal size given to `jbdev format` (None: the engine's default).
    pub journal_bytes: Option<u64>,
    /// Device backend of the volume under test.
    pub backend: Backend,
    /// Upper bound of adaptive batching (None: the engine's default).
    pub max_batch: Option<Duration>,
    /// Direct-write threshold of the volume (None: the engine's default).
    pub direct_write_threshold: Option<u64>,
    pub pipeline_depth: Option<u32>,
    pub write_pacing: bool,
    /// Bound on operations per thread per run (every load loop is bounded).
    pub max_ops_per_thread: u64,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(3),
            quick: false,
            journal_bytes: None,
            backend: Backend::Auto,
            max_batch: None,
            direct_write_threshold: None,
            pipeline_depth: None,
            write_pacing: false,
            max_ops_per_thread: 50_000_000,
        }
    }
}

/// A scenario's view of the world.
pub struct Ctx<'a> {
    pub backing: &'a Backing,
    pub cfg: &'a RunConfig,
    pub progress: &'a Progress,
    /// Which round of `--rounds` this is, from 1: scenarios that compare
    /// variants one after the other alternate their order by it.
    pub round: u32,
}

/// The journal of the volume under test when `--journal-size` is not given.
const DEFAULT_JOURNAL_BYTES: u64 = 64 << 20;

/// Size of the jbdev volume on a backing of `backing_bytes` with a journal
/// of `journal_bytes` (see [`Ctx::volume_bytes`]); 0 when none fits.
pub fn volume_bytes(backing_bytes: u64, journal_bytes: Option<u64>) -> u64 {
    let usable = backing_bytes
        .saturating_sub(journal_bytes.unwrap_or(DEFAULT_JOURNAL_BYTES))
        .saturating_sub(KERNEL_AREA_BYTES);
    (usable / 8 * 7) & !((1u64 << 20) - 1)
}

/// Fails when a backing of `backing_bytes` (`what`: how the user gave it)
/// leaves no room for a volume beside its journal and the kernel
/// baselines' area, saying how big it must be.
pub fn check_room(what: &str, backing_bytes: u64, journal_bytes: Option<u64>) -> Result<()> {
    if volume_bytes(backing_bytes, journal_bytes) > 0 {
        return Ok(());
    }
    let journal = journal_bytes.unwrap_or(DEFAULT_JOURNAL_BYTES);
    // Room for a 1 MiB volume after the eighth left as slack.
    let least = (journal + KERNEL_AREA_BYTES + (2 << 20)).div_ceil(1 << 20);
    Err(crate::BenchError::InvalidArgument(format!(
        "{what} is too small: the volume under test needs room beside its {journal}-byte \
         journal and the {KERNEL_AREA_BYTES}-byte area of the kernel baselines; give at least \
         {least} MiB"
    )))
}

impl Ctx<'_> {
    /// A load of `threads` threads for the configured duration.
    pub fn spec(&self, threads: usize) -> LoadSpec {
        LoadSpec {
            threads,
            duration: self.cfg.duration,
            max_ops_per_thread: self.cfg.max_ops_per_thread,
        }
    }

    /// Size of the jbdev volume on this backing. The journal (internal),
    /// the superblocks and the kernel baselines' area must fit beside it;
    /// an eighth of the remainder is left as slack so the figure does not
    /// depend on the engine's exact layout.
    pub fn volume_bytes(&self) -> u64 {
        volume_bytes(self.backing.size_bytes, self.cfg.journal_bytes)
    }

    /// Where the raw-device kernel baselines of the synchronous scenarios
    /// write: the last [`KERNEL_AREA_BYTES`] of the backing, which no volume
    /// uses. So kernel and jbdev runs can alternate on one formatted
    /// volume, and drift of this noisy machine hits both sides alike.
    pub fn kernel_base(&self) -> u64 {
        self.backing.size_bytes.saturating_sub(KERNEL_AREA_BYTES) & !4095
    }

    fn open_options(&self, policy: BatchPolicy) -> OpenOptions {
        let mut o = OpenOptions {
            backend: self.cfg.backend,
            direct_io: true,
            batch_policy: policy,
            ..OpenOptions::default()
        };
        if let Some(m) = self.cfg.max_batch {
            o.max_batch = m;
        }
        if let Some(t) = self.cfg.direct_write_threshold {
            o.direct_write_threshold = t;
        }
        if let Some(d) = self.cfg.pipeline_depth {
            o.pipeline_depth = d;
        }
        o.write_pacing = self.cfg.write_pacing;
        o
    }

    /// Formats a fresh volume on the backing (destroying what the kernel
    /// baselines left) and opens it with `policy`.
    pub fn create_volume(&self, policy: BatchPolicy) -> Result<Volume> {
        let mut f = FormatOptions::new(self.volume_bytes());
        f.journal_bytes = self.cfg.journal_bytes;
        let o = self.open_options(policy);
        while_busy(|| Volume::create(&self.backing.path, &f, &o))
    }

    /// Reopens the volume with another batching policy.
    pub fn open_volume(&self, policy: BatchPolicy) -> Result<Volume> {
        let o = self.open_options(policy);
        while_busy(|| Volume::open(&self.backing.path, &o))
    }
}

/// Runs `open` again while the backing block device is held
/// exclusively (EBUSY), for at most [`BUSY_WAIT`]: the kernel releases
/// a device some time after the phase before let go of it (an unmount
/// of the kernel side's ext4, the last reference of an io_uring that
/// is being torn down), and a round that starts in that window must
/// not fail. Held longer, the error is the device's own.
fn while_busy(mut open: impl FnMut() -> jbdev_volume::Result<Volume>) -> Result<Volume> {
    let deadline = std::time::Instant::now() + BUSY_WAIT;
    let mut said = false;
    loop {
        match open() {
            Err(jbdev_volume::VolumeError::Device(jbdev_device::DeviceError::Busy(what)))
                if std::time::Instant::now() < deadline =>
            {
                if !said {
                    eprintln!(
                        "jbdev bench: {what} is still held; waiting up to {} s for its release",
                        BUSY_WAIT.as_secs()
                    );
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            r => return Ok(r?),
        }
    }
}

/// Longest wait for a backing device the previous phase held to be released.
const BUSY_WAIT: Duration = Duration::from_secs(10);

/// Writes `len_bytes` of pattern `seed` at `base` in 1 MiB pieces, then
/// flushes, so the measured reads find written (not sparse) blocks.
pub fn prefill(vol: &Volume, base: u64, len_bytes: u64, seed: u64) -> Result<()> {
    let chunk = pattern_buf(1 << 20, seed);
    let mut off = 0;
    while off < len_bytes {
        let n = (len_bytes - off).min(chunk.len() as u64) as usize;
        #[allow(clippy::indexing_slicing)] // n <= chunk.len(): the min above
        let data = &chunk[..n];
        vol.write_at(data, base + off, jbdev_volume::WriteFlags::NONE)?;
        off += n as u64;
    }
    vol.flush()?;
    Ok(())
}

/// The volume's metrics as JSON (for the report).
pub fn stats_json(vol: &Volume) -> Option<serde_json::Value> {
    serde_json::to_value(vol.stats()).ok()
}
