use std::path::PathBuf;
use std::time::Duration;

use jbdev_device::Backend;

/// Where the journal lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JournalPlacement {
    /// A region of the volume's own file or device.
    Internal,
    /// A separate file or device (created if it is a missing file).
    External(PathBuf),
}

/// Parameters of `jbdev format` / [`crate::Volume::create`].
#[derive(Clone, Debug)]
pub struct FormatOptions {
    /// Size of the volume users see, in bytes (a multiple of `block_size`).
    pub size_bytes: u64,
    /// Journal size in bytes; default 64 MiB or a quarter of the volume,
    /// whichever is smaller (at least 1 MiB).
    pub journal_bytes: Option<u64>,
    pub journal: JournalPlacement,
    /// Block size of the volume and of the journal (1024..=65536, power of
    /// two; the on-disk format could describe 512, but a journal block
    /// must hold the jbd2 headers and tags, so format refuses it).
    pub block_size: u32,
}

impl FormatOptions {
    pub fn new(size_bytes: u64) -> Self {
        Self {
            size_bytes,
            journal_bytes: None,
            journal: JournalPlacement::Internal,
            block_size: 4096,
        }
    }
}

/// Group commit batching policy: how long a committing leader waits for
/// more writers to join (a fixed wait ruins fast devices).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchPolicy {
    /// Commit as soon as a sync request arrives and the device is idle.
    None,
    /// Sleep this long before every sync commit (the old jbd one-jiffy sleep).
    Fixed(Duration),
    /// Wait for more joiners only while the running transaction is younger
    /// than the average commit time, never longer than `max_batch`, and not
    /// at all when only one writer is active.
    Adaptive,
}

impl std::str::FromStr for BatchPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "adaptive" => Ok(Self::Adaptive),
            _ => match s.strip_prefix("fixed:") {
                Some(us) => us
                    .parse::<u64>()
                    .map(|us| Self::Fixed(Duration::from_micros(us)))
                    .map_err(|_| format!("bad microseconds in {s:?}")),
                None => Err(format!(
                    "unknown batching policy {s:?} (none, fixed:<us>, adaptive)"
                )),
            },
        }
    }
}

impl std::fmt::Display for BatchPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => write!(f, "none"),
            Self::Fixed(d) => write!(f, "fixed:{}", d.as_micros()),
            Self::Adaptive => write!(f, "adaptive"),
        }
    }
}

/// How a transaction is committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CommitMode {
    /// Descriptor, data and commit blocks in one write, then one flush. A
    /// torn commit is detected by the per-block checksums at recovery.
    #[default]
    SingleFlush,
    /// jbd2's classic order: descriptor and data, flush, commit block, flush.
    TwoFlush,
}

/// Parameters of [`crate::Volume::open`].
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub read_only: bool,
    /// The journal file or device of a volume formatted with an external
    /// journal (`None`: the path recorded at format time). Refused with
    /// `InvalidArgument` for a volume whose journal is internal.
    pub journal_path: Option<PathBuf>,
    pub backend: Backend,
    /// Use O_DIRECT on files (default true).
    pub direct_io: bool,
    /// Serve reads of home blocks from the page cache (a second, buffered
    /// descriptor; writes stay O_DIRECT unless `write_cache`). Default false.
    pub read_cache: bool,
    /// With `read_cache`: large direct writes (the ones that go straight
    /// home, see `direct_write_threshold`) go through the page cache too, so
    /// a bulk copy reads back without device I/O; durable at the next flush
    /// as before. The journal and the checkpoint stay O_DIRECT
    /// (ARCHITECTURE 22c). Default false (`jbdev serve` turns it on with
    /// its read cache).
    pub write_cache: bool,
    pub batch_policy: BatchPolicy,
    /// Upper bound of the adaptive batching wait (default 15 ms).
    pub max_batch: Duration,
    pub commit_mode: CommitMode,
    /// A transaction nobody waits for is committed after this long (default 5 s).
    pub commit_interval: Duration,
    /// Committed transactions are checkpointed at least this often (also
    /// sooner when the journal is a quarter full). Default 1 s.
    pub checkpoint_interval: Duration,
    /// Writes (and write-zeroes/trims) of at least this many bytes go
    /// straight to their home location (with revokes) instead of through the
    /// journal — giving up all-or-nothing for them. Default `u64::MAX`: every
    /// request that fits in one transaction is journaled (atomic), and only
    /// larger ones go home directly.
    pub direct_write_threshold: u64,
    /// Commits that may be in flight at once (1 ..= 16, default 1): with
    /// more than one, transaction N+1 is cut, laid out and built (descriptors,
    /// checksums, digest) while N's write is in flight, and written the
    /// moment N is published. Commits are always acknowledged in order.
    /// Default 1 (one commit at a time): on this project's test machine the
    /// overlap measured no gain (docs/BENCHMARKS.md).
    pub pipeline_depth: u32,
    /// Write pacing (default off): once 7/8 of the log is taken, each
    /// journaled write first sleeps a little per block (up to 0.5 ms per
    /// block at a full log), so writers slow down smoothly to the rate the
    /// checkpoint writes home instead of running at memory speed until the
    /// log is full and then waiting for a whole checkpoint round. Trades
    /// some throughput for much shorter write-latency tails under sustained
    /// random writes (docs/BENCHMARKS.md, session 9).
    pub write_pacing: bool,
    /// RBD homes and journals (`rbd:POOL/IMAGE`): break the current
    /// holder's exclusive lock before taking it — the operator's explicit
    /// word that the holder is dead (`--break-lock`). Default false: a held
    /// lock is refused, naming its holder.
    pub break_lock: bool,
    /// A read-write open of a journal damaged in the middle of its log
    /// replays the transactions before the damage home and discards the
    /// damaged one and every later one (`jbdev journal rescue`): the volume
    /// keeps the state a read-only open serves, and the writes only the
    /// discarded transactions held are lost. Default false: such an open is
    /// refused, and nothing changes. No effect on an undamaged log.
    pub discard_after_damage: bool,
}

/// Longest interval or batching wait [`OpenOptions::validate`] accepts: a
/// day.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Most commits [`OpenOptions::pipeline_depth`] lets be in flight at once
/// (recovery judges a torn tail by it).
pub const MAX_PIPELINE_DEPTH: u32 = jbdev_journal::recovery::MAX_PIPELINE_DEPTH;

impl OpenOptions {
    /// Refuses options no volume can run with: a commit or checkpoint
    /// interval under 1 ms (the background threads would spin on the
    /// journal lock, starving every writer); an interval or batching wait
    /// over [`MAX_WAIT`] (deadlines past what a clock can add: the thread
    /// computing one panicked); a pipeline depth outside 1..=16.
    pub fn validate(&self) -> crate::Result<()> {
        let bad = |m: String| Err(crate::VolumeError::InvalidArgument(m));
        for (name, d) in [
            ("commit interval", self.commit_interval),
            ("checkpoint interval", self.checkpoint_interval),
        ] {
            if d < Duration::from_millis(1) {
                return bad(format!("the {name} must be at least 1 ms (it is {d:?})"));
            }
        }
        let fixed = match self.batch_policy {
            BatchPolicy::Fixed(d) => d,
            _ => Duration::ZERO,
        };
        for (name, d) in [
            ("commit interval", self.commit_interval),
            ("checkpoint interval", self.checkpoint_interval),
            ("batching wait (max_batch)", self.max_batch),
            ("fixed batching wait", fixed),
        ] {
            if d > MAX_WAIT {
                return bad(format!(
                    "the {name} must be at most {} s (it is {d:?})",
                    MAX_WAIT.as_secs()
                ));
            }
        }
        if !(1..=MAX_PIPELINE_DEPTH).contains(&self.pipeline_depth) {
            return bad(format!(
                "the pipeline depth must be 1 to {MAX_PIPELINE_DEPTH} (it is {})",
                self.pipeline_depth
            ));
        }
        Ok(())
    }
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            read_only: false,
            journal_path: None,
            backend: Backend::Auto,
            direct_io: true,
            read_cache: false,
            write_cache: false,
            batch_policy: BatchPolicy::Adaptive,
            max_batch: Duration::from_millis(15),
            commit_mode: CommitMode::SingleFlush,
            commit_interval: Duration::from_secs(5),
            checkpoint_interval: Duration::from_secs(1),
            direct_write_threshold: u64::MAX,
            pipeline_depth: 1,
            write_pacing: false,
            break_lock: false,
            discard_after_damage: false,
        }
    }
}
