//! The public volume API.

use std::io::IoSlice;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use jbdev_device::{open_device, AlignedBuf, BlockDevice, FlushCoalescer, IoPriority, WriteReq};
use jbdev_journal::format::JournalSuperblock;
use jbdev_journal::recovery::{self, ScanEnd};
use jbdev_journal::JournalRegion;
use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::bufpool::SharedBuf;
use crate::engine::{AbortCause, Completion, DirectSync, Durability, Engine, Op, Zeroing};
use crate::overlay::{BlockRef, CallerBuf, DirectData, Overlay, Source, Version};
use crate::superblock::{JournalLocation, SuperblockCopy, VolumeSuperblock, BACKUP_OFFSET};
use crate::{FormatOptions, JournalPlacement, OpenOptions, Result, VolumeError};

pub(crate) mod external;
mod session;
mod watch;

pub(crate) use external::*;
pub use external::{file_format_would_create, journal_target, relative_recorded_journal};
pub(crate) use session::*;
pub use session::{
    foreign_journal, home_behind_journal, journal_behind_home, refusal_by_superblocks,
    scan_journal, session_mismatch, stale_journal, JournalAt, SessionMismatch,
};
pub(crate) use watch::*;

/// Flags of a write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteFlags {
    /// Force unit access: the call returns only once the data is durable.
    pub fua: bool,
}

impl WriteFlags {
    pub const NONE: Self = Self { fua: false };
    pub const FUA: Self = Self { fua: true };
}

/// What a range of the volume holds (for NBD block status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtentState {
    /// Allocated; may hold data.
    Data,
    /// Known to read as zeroes without holding data: never written, or
    /// deallocated. A trim or zeroing of less than 64 KiB of consecutive
    /// blocks is journaled as zero blocks and written home as zeroes, so
    /// it reads as zeroes but is reported as `Data`.
    Zero,
}

/// A run of the volume in one state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    pub state: ExtentState,
}

impl Stats {
    /// For the error of a close (`error`, with these stats as the close
    /// left them): how the salvage after a journal failure ended, to
    /// append to the error, or "" when there was none. The abort's own
    /// message was written when the journal failed, before the outcome
    /// was known; a closed volume has no stats to ask any more.
    pub fn close_outcome(&self, error: &VolumeError) -> String {
        if self.salvage_complete {
            let uncommitted = match self.salvage_uncommitted_blocks {
                0 => String::new(),
                n => format!(
                    "; {n} block(s) of writes no commit had made durable (plain writes no \
                     flush or FUA had covered, or FUA writes whose commit failed, never \
                     acknowledged) are lost"
                ),
            };
            format!(
                "; at close: the salvage is complete ({} block(s) written home and flushed): \
                 every write committed before the journal failed (every write a flush or FUA \
                 acknowledged) is on the volume{uncommitted}",
                self.salvaged_blocks
            )
        } else if matches!(error, VolumeError::JournalFileLost(_)) {
            "; at close: the salvage did not complete (a write or flush of the volume's own \
             device failed too): acknowledged writes not yet written home may exist only in \
             the journal"
                .to_owned()
        } else {
            String::new()
        }
    }
}

/// Operator metrics.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    /// Transactions committed (with journal I/O) since open.
    pub commits: u64,
    pub commits_per_sec: f64,
    /// Data blocks written to the journal since open.
    pub blocks_journaled: u64,
    /// Mean data blocks per committed transaction.
    pub mean_transaction_blocks: f64,
    pub commit_latency_us_p50: u64,
    pub commit_latency_us_p99: u64,
    pub commit_latency_us_max: u64,
    /// Running average commit time used by adaptive batching.
    pub avg_commit_us: u64,
    /// Fraction of the journal holding committed, not yet checkpointed transactions.
    pub journal_fill_ratio: f64,
    /// Journal blocks waiting for checkpoint.
    pub checkpoint_lag_blocks: u64,
    /// Transactions committed but not yet checkpointed.
    pub checkpoint_lag_transactions: u64,
    pub checkpoints: u64,
    pub checkpoint_blocks: u64,
    /// Block copies the checkpoint did not write home because a newer copy
    /// in a committed transaction superseded them (rewrites absorbed).
    pub checkpoint_blocks_skipped: u64,
    pub direct_writes: u64,
    /// Direct writes that went home from the caller's own buffer, without
    /// a copy ([`Volume::write_owned`]).
    pub direct_writes_uncopied: u64,
    /// Commits written (whole, commit block included) while an older commit
    /// was still in flight (pipelining at work).
    pub commits_pipelined: u64,
    /// Cache flushes issued to the home and journal devices (shared by
    /// concurrent callers; single-write FUA commits need none).
    pub device_flushes: u64,
    /// Times a writer found the journal full and waited for space.
    pub log_space_waits: u64,
    /// Journaled writes that waited so that a direct write's revoke of
    /// one of their blocks reaches the log before their copy: for the
    /// direct write's home I/O, or for the commit of its revoke; and direct
    /// writes that waited for such a journaled write to log its copy
    /// (ARCHITECTURE 23).
    pub revoke_order_waits: u64,
    /// The checkpoint's last attempt found the backing store full
    /// ([`VolumeError::StoreFull`]): writes fail with `ENOSPC` once the
    /// journal is full, until space is freed.
    pub store_full: bool,
    /// Checkpoint attempts that found the store full, since open.
    pub store_full_attempts: u64,
    /// Journaled writes that paused because the log was filling faster
    /// than the checkpoint empties it (ARCHITECTURE 20b), and the
    /// milliseconds they slept in all.
    pub paced_writes: u64,
    pub pace_sleep_ms: u64,
    /// Bulk reads that held back (at most 2 ms) for a commit writers were
    /// waiting for.
    pub bulk_read_yields: u64,
    /// Reads from home done again because a write or the checkpoint changed
    /// their range meanwhile, and reads that gave up retrying and read home
    /// while holding writers of their range back.
    pub read_retries: u64,
    pub locked_reads: u64,
    /// The journal aborted (a failed journal or home write or flush, the
    /// external journal file deleted or truncated, a bug): every later
    /// write fails until the volume is reopened. Not set by a full backing
    /// store ([`Stats::store_full`]), which is no abort.
    pub aborted: bool,
    /// Blocks written home from memory after the journal failed (its
    /// device, or its file deleted or truncated), and whether that salvage
    /// finished: every write committed before the failure (every write a
    /// flush or FUA acknowledged) is then on the home device and durable.
    pub salvaged_blocks: u64,
    pub salvage_complete: bool,
    /// Blocks that salvage could not take home because no commit had made
    /// them durable (plain writes no flush or FUA covered yet, still in
    /// the running transaction or in a commit that failed): lost at close.
    pub salvage_uncommitted_blocks: u64,
    /// That salvage is due or under way: `salvage_complete` follows, unless
    /// a home write or flush fails, which stops it (both false then; the
    /// journal keeps what it holds for the next open).
    pub salvage_running: bool,
    /// Journaled-write buffers freshly allocated from the heap / reused
    /// from the buffer pool, and the bytes the pool keeps for reuse now.
    pub write_buffers_allocated: u64,
    pub write_buffers_reused: u64,
    pub write_buffer_pool_bytes: u64,
}

/// What `open` found and did; shown by `jbdev info` and `jbdev check`.
#[derive(Clone, Debug)]
pub struct RecoveryReport {
    /// The journal was clean (s_start = 0).
    pub was_clean: bool,
    pub transactions_replayed: usize,
    pub blocks_replayed: usize,
    pub revoked_copies: u64,
    /// How the scan ended, in words.
    pub end: String,
}

/// How often an open's journal scan and replay report how far they got.
const SCAN_REPORT_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// When a long step (an open's journal scan and replay, `journal rescue`'s
/// read-only pass) is due to say how far it got: every
/// 2 s (`SCAN_REPORT_EVERY`), asked from any thread.
pub struct ProgressTicker {
    started: Instant,
    next: parking_lot::Mutex<Instant>,
}

impl Default for ProgressTicker {
    fn default() -> Self {
        Self::new()
    }
}

impl ProgressTicker {
    pub fn new() -> Self {
        let started = Instant::now();
        Self {
            started,
            next: parking_lot::Mutex::new(started + SCAN_REPORT_EVERY),
        }
    }

    /// The whole seconds since the start when a report is due now (to one
    /// caller per period), else `None`.
    pub fn due(&self) -> Option<u64> {
        let mut next = self.next.try_lock()?;
        let now = Instant::now();
        if now < *next {
            return None;
        }
        *next = now + SCAN_REPORT_EVERY;
        Some(self.started.elapsed().as_secs())
    }
}

/// See [`Volume::journal_probe`].
pub struct JournalProbe {
    engine: Arc<Engine>,
}

impl JournalProbe {
    /// Bytes of the journal's log in use (committed, not yet checkpointed
    /// past).
    pub fn used_bytes(&self) -> u64 {
        self.engine.journal_state().0 * self.engine.bs as u64
    }

    /// Bytes the checkpoint has written home since the open, counted as
    /// each write completes: progress inside a checkpoint round, which
    /// frees log space only when it ends.
    pub fn home_written_bytes(&self) -> u64 {
        self.engine
            .home
            .checkpoint_written_bytes
            .load(Ordering::Relaxed)
    }

    /// Bytes of the home's page cache still dirty or being written back
    /// (`cachestat(2)`; None without a page cache or a kernel that says):
    /// progress of a final flush, which on a slow store can take minutes
    /// after the checkpoint's writes have all returned.
    pub fn home_unwritten_bytes(&self) -> Option<u64> {
        self.engine.home.dev.cached_unwritten_bytes()
    }
}

/// A journaled volume. `Send + Sync`: share it (e.g. in an `Arc`) between
/// threads; every method takes `&self`.
pub struct Volume {
    engine: Arc<Engine>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Dropped at shutdown to stop the external journal's watch thread.
    journal_watch: Mutex<Option<JournalWatch>>,
    closed: AtomicBool,
    superblock: VolumeSuperblock,
    recovery: RecoveryReport,
}

fn bad_sb(e: crate::superblock::SuperblockError, what: &str) -> VolumeError {
    use crate::superblock::SuperblockError as E;
    match e {
        E::NotAVolume => VolumeError::NotAVolume(format!(
            "{what} is not a jbdev volume (no JBDEVVOL magic); create one with `jbdev format`"
        )),
        // The checksum held: a newer jbdev's volume, not damage.
        e @ (E::UnsupportedVersion(_) | E::UnsupportedFeatures(_)) => {
            VolumeError::NewerFormat(format!("{what}: {e}"))
        }
        other => VolumeError::BadSuperblock(format!("{what}: {other}")),
    }
}

/// Default journal size: 64 MiB or a quarter of the volume, whichever is
/// smaller, but at least 1 MiB.
pub fn default_journal_bytes(size_bytes: u64) -> u64 {
    (size_bytes / 4).clamp(1 << 20, 64 << 20)
}

/// Smallest journal, in blocks.
pub const MIN_JOURNAL_BLOCKS: u64 = 16;

/// What a format of given options lays out, in bytes: what `jbdev format`
/// must look at before it overwrites anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormatLayout {
    /// Journal length (internal or external).
    pub journal_bytes: u64,
    /// Bytes the volume's own file or device must hold.
    pub needed_bytes: u64,
    /// Where the data region starts. Format writes every byte of the volume
    /// device before it (block 0 and an internal journal), and bytes
    /// `0..journal_bytes` of an external journal; nothing of the data region.
    pub data_offset_bytes: u64,
}

/// The layout a format with `f` produces, or why `f` is refused.
pub fn format_layout(f: &FormatOptions) -> Result<FormatLayout> {
    let (journal_bytes, needed_bytes, data_offset_bytes) = plan_layout(f)?;
    Ok(FormatLayout {
        journal_bytes,
        needed_bytes,
        data_offset_bytes,
    })
}

/// Byte layout a format produces: (journal bytes, total bytes needed on the
/// volume device, data offset).
fn plan_layout(f: &FormatOptions) -> Result<(u64, u64, u64)> {
    let bs = u64::from(f.block_size);
    if !f.block_size.is_power_of_two() || !(1024..=65536).contains(&f.block_size) {
        return Err(VolumeError::InvalidArgument(format!(
            "block size {} must be a power of two between 1024 and 65536",
            f.block_size
        )));
    }
    if f.size_bytes == 0 || !f.size_bytes.is_multiple_of(bs) {
        return Err(VolumeError::InvalidArgument(format!(
            "volume size {} must be a positive multiple of the {bs}-byte block size",
            f.size_bytes
        )));
    }
    let asked = f
        .journal_bytes
        .unwrap_or_else(|| default_journal_bytes(f.size_bytes));
    let journal = asked / bs * bs;
    if journal / bs < MIN_JOURNAL_BLOCKS || journal / bs > u64::from(u32::MAX) {
        // The size asked for, and what whole blocks made of it.
        let rounded = if journal == asked {
            String::new()
        } else {
            format!(" ({journal} in whole {bs}-byte blocks)")
        };
        return Err(VolumeError::InvalidArgument(format!(
            "journal size {asked}{rounded} must be between {MIN_JOURNAL_BLOCKS} blocks ({} \
             bytes) and 2^32 blocks",
            MIN_JOURNAL_BLOCKS * bs
        )));
    }
    let data_offset = match f.journal {
        JournalPlacement::Internal => bs + journal,
        JournalPlacement::External(_) => bs,
    };
    // A file's offsets are signed 64-bit (off_t): a layout past that could
    // not be created, and its sums must not wrap.
    let needed = data_offset
        .checked_add(f.size_bytes)
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| {
            VolumeError::InvalidArgument(format!(
                "volume size {} is too large: superblock, journal and data must fit in {} bytes",
                f.size_bytes,
                i64::MAX
            ))
        })?;
    Ok((journal, needed, data_offset))
}

/// Every home block named by the log must lie inside the volume: a
/// checksummed tag pointing elsewhere is a bug or a forged image, and
/// replaying it would write outside the data area. Applied by every open and
/// by `jbdev check`.
pub fn check_replay_plan(sb: &VolumeSuperblock, plan: &[recovery::ReplayEntry]) -> Result<()> {
    let volume_blocks = sb.size_bytes / u64::from(sb.block_size);
    if let Some(e) = plan.iter().find(|e| e.home >= volume_blocks) {
        return Err(VolumeError::CorruptJournal(format!(
            "transaction {} logs home block {} but the volume has {volume_blocks} blocks",
            e.sequence, e.home
        )));
    }
    Ok(())
}

/// Ro-compat features this jbdev does not know allow only read-only opens
/// (docs/FORMAT.md): a writer that ignored them could break what they mean.
pub(crate) fn refuse_unknown_ro_compat(sb: &VolumeSuperblock, read_only: bool) -> Result<()> {
    let unknown = sb.unknown_ro_compat();
    if unknown != 0 && !read_only {
        return Err(VolumeError::BadSuperblock(format!(
            "the volume uses read-only-compatible features {unknown:#x} this jbdev does not \
             know: it may only be opened read-only (serve --read-only), or by a jbdev \
             that knows them"
        )));
    }
    Ok(())
}

fn now_unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The volume superblock of `dev`, from its first copy or, when that one
/// is damaged, from its backup (said in the log; the next read-write open
/// rewrites both).
pub(crate) fn read_volume_superblock(
    dev: &dyn BlockDevice,
    what: &str,
) -> Result<VolumeSuperblock> {
    let (sb, copy) = read_volume_superblock_copy(dev, what)?;
    if let SuperblockCopy::Backup(e) = copy {
        tracing::warn!(
            "{what}: the volume superblock is damaged ({e}); using its backup copy (bytes \
             {BACKUP_OFFSET}..{} of block 0). A read-write open rewrites both",
            BACKUP_OFFSET + VolumeSuperblock::ENCODED_LEN
        );
    }
    Ok(sb)
}

/// [`read_volume_superblock`], saying which copy it read and not warning.
pub(crate) fn read_volume_superblock_copy(
    dev: &dyn BlockDevice,
    what: &str,
) -> Result<(VolumeSuperblock, SuperblockCopy)> {
    let lbs = (dev.logical_block_size() as usize).max(VolumeSuperblock::ENCODED_LEN);
    if dev.size_bytes() < lbs as u64 {
        return Err(VolumeError::NotAVolume(format!(
            "{what} is too small to be a jbdev volume"
        )));
    }
    // Both copies when the device holds them (whole sectors).
    let both = (BACKUP_OFFSET + VolumeSuperblock::ENCODED_LEN).div_ceil(lbs) * lbs;
    let n = if dev.size_bytes() >= both as u64 {
        both
    } else {
        lbs
    };
    let mut buf = AlignedBuf::zeroed(n);
    dev.read_at(&mut buf, 0)
        .map_err(|e| e.doing("reading the volume superblock, block 0"))?;
    let (sb, copy) = VolumeSuperblock::decode_block(&buf).map_err(|e| bad_sb(e, what))?;
    // Not corruption: the volume is fine, this device cannot address its
    // blocks (a 1 KiB-block volume on a 4 KiB-sector device, say).
    if sb.block_size < dev.logical_block_size() {
        return Err(VolumeError::InvalidArgument(format!(
            "{what} has {}-byte logical blocks, larger than the volume's {}-byte blocks: \
             the volume cannot be used on it (copy it to a device with sectors of at most \
             {} bytes, e.g. a loop device without --sector-size)",
            dev.logical_block_size(),
            sb.block_size,
            sb.block_size
        )));
    }
    // A device shorter than the volume it describes (a truncated image
    // file, a smaller block device) would turn reads and writes of its end
    // into I/O errors: refuse it here, for opens and inspections alike.
    let described = sb.data_offset_bytes.saturating_add(sb.size_bytes);
    if dev.size_bytes() < described {
        return Err(VolumeError::Truncated(format!(
            "{what} is shorter than the volume its superblock describes: it holds {} bytes \
             (in whole {}-byte sectors), the volume needs {described} (a truncated image, or \
             a smaller device)",
            dev.size_bytes(),
            dev.logical_block_size()
        )));
    }
    Ok((sb, copy))
}

/// Fills any holes of the journal's blocks (a read-write open). Format
/// allocates them, but a sparse copy of the volume or of its journal file
/// (`cp --sparse=always`, `rsync -S`, `tar -S`) punches its zeroed parts
/// out again, and on a full file system every commit then failed, at every
/// open, with nothing pointing at the journal (session 22's adversarial
/// pass). Allocated here when there is room; said plainly when there is
/// not, since the first commit into a hole will fail.
fn allocate_journal(region: &JournalRegion, offset: u64, len: u64) {
    if let Err(e) = region.device().allocate(offset, len) {
        let hint = if crate::is_no_space(e.errno()) {
            "its file system has no room left: commits will fail with ENOSPC (the volume aborts) \
             until space is freed there"
        } else {
            "commits may fail where the journal has holes"
        };
        tracing::warn!(
            "could not allocate the journal's blocks ({e}): a sparse copy of the journal or of \
             the volume leaves holes there, and {hint}"
        );
    }
}

/// Starts a read-write volume's commit threads (one per commit that may be
/// in flight: completions, which never lead, see `Engine::when_durable`,
/// then keep the pipeline as full as sleeping writers do; fixed by the
/// options, never by the number of clients) and its checkpoint thread,
/// into `threads`. A thread the system refuses is an error with its errno
/// (EAGAIN under a process or thread limit), not an invalid argument.
fn start_engine_threads(engine: &Arc<Engine>, threads: &mut Vec<JoinHandle<()>>) -> Result<()> {
    let spawn = |name: String, run: fn(&Arc<Engine>)| {
        let e = engine.clone();
        std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || run(&e))
            .map_err(|err| {
                VolumeError::Device(jbdev_device::DeviceError::io(
                    "start a thread",
                    format!("{name} (the system refused a thread: a process or thread limit?)"),
                    err,
                ))
            })
    };
    for i in 0..engine.pipeline_depth() {
        threads.push(spawn(format!("jbdev-commit-{i}"), Engine::commit_thread)?);
    }
    threads.push(spawn("jbdev-checkpoint".into(), Engine::checkpoint_thread)?);
    Ok(())
}

/// Writes block 0 (the volume superblock and its backup copy, zero-padded
/// to a whole block: nothing else lives in block 0) and flushes it. Each
/// copy is one 512-byte sector, written atomically.
pub(crate) fn write_volume_superblock(dev: &dyn BlockDevice, vsb: &VolumeSuperblock) -> Result<()> {
    let mut buf = AlignedBuf::zeroed(vsb.block_size as usize);
    vsb.encode_block(&mut buf);
    let task = "writing the volume superblock, block 0";
    dev.write_at(&buf, 0, IoPriority::Urgent)
        .map_err(|e| e.doing(task))?;
    dev.flush().map_err(|e| e.doing(task))?;
    Ok(())
}

/// Zeroes block 0 of `dev` — a volume superblock there and its second
/// copy (bytes 512..1024) — and flushes: the first step of a format over
/// what may be an older volume. A format interrupted after it leaves no
/// volume superblock, which every command reports as such (and `format`
/// redoes); one interrupted while the old superblock still stood, after
/// the data area was zeroed or the journal rewritten, left the old volume
/// looking whole over zeroed data (session 32's crash pass).
/// Refuses a device a volume of `bs`-byte blocks and `needed` bytes in
/// all does not fit on.
fn format_fits(dev: &dyn BlockDevice, bs: u32, needed: u64) -> Result<()> {
    if dev.logical_block_size() > bs {
        return Err(VolumeError::InvalidArgument(format!(
            "block size {bs} is smaller than the device's {}-byte logical block size",
            dev.logical_block_size()
        )));
    }
    if dev.size_bytes() < needed {
        return Err(VolumeError::InvalidArgument(format!(
            "the device holds {} bytes but the volume needs {needed} (superblock + journal + data)",
            dev.size_bytes()
        )));
    }
    Ok(())
}

fn invalidate_volume_superblock(dev: &dyn BlockDevice, bs: u32) -> Result<()> {
    let len = (bs as usize).max(1024);
    let buf = AlignedBuf::zeroed(len);
    let task = "clearing the old volume superblock, block 0";
    dev.write_at(&buf, 0, IoPriority::Urgent)
        .map_err(|e| e.doing(task))?;
    dev.flush().map_err(|e| e.doing(task))?;
    Ok(())
}

/// The journal region of `len_bytes` at `off` of `dev`, with blocks of
/// `bs` bytes and a flush coalescer of its own: for the commands that work
/// on a journal without a running volume (format, inspection, reset,
/// rescue).
pub(crate) fn journal_region_at(
    dev: Arc<dyn BlockDevice>,
    off: u64,
    len_bytes: u64,
    bs: u32,
) -> Result<JournalRegion> {
    let blocks = (len_bytes / u64::from(bs)) as u32;
    Ok(JournalRegion::new(
        dev,
        Arc::new(FlushCoalescer::new()),
        off,
        bs,
        blocks,
    )?)
}

/// A clean journal superblock for all of `region`: jbd2's transaction cap
/// of a quarter of the journal, this volume's journal `uuid`, the session
/// stamp `session`.
pub(crate) fn fresh_journal_superblock(
    region: &JournalRegion,
    uuid: [u8; 16],
    session: u32,
) -> JournalSuperblock {
    let blocks = region.len_blocks();
    let mut jsb = JournalSuperblock::new(region.block_size(), blocks, uuid);
    jsb.max_transaction = (blocks / 4).max(3);
    jsb.session = session;
    jsb
}

/// Writes an empty journal of `journal_bytes` at `joff` of `jdev`, for a
/// volume whose journal uuid is `uuid`, and flushes it: zeroes over the
/// whole log (not a hole punch: a dump of a fresh journal shows nothing
/// stale, and on a file every journal block is allocated now, so a commit
/// is a pure overwrite and its FUA write costs no file system metadata
/// update), then a clean superblock.
pub(crate) fn write_empty_journal(
    jdev: &Arc<dyn BlockDevice>,
    joff: u64,
    journal_bytes: u64,
    bs: u32,
    uuid: [u8; 16],
    session: u32,
) -> Result<()> {
    let region = journal_region_at(jdev.clone(), joff, journal_bytes, bs)?;
    let zeros = AlignedBuf::zeroed(1 << 20);
    // IMPORTANT: an old journal superblock goes first, and durably: a power
    // loss while the log is being zeroed then leaves no superblock (which
    // `check` names, and this command redoes), never the old one over a
    // log of which some blocks were zeroed and others not — replay of what
    // is left, older copies without the revokes that cancelled them
    // (session 32's crash pass saw a reset leave part of a log replayable).
    jdev.write_at(&zeros[..bs as usize], joff, IoPriority::Urgent)?;
    jdev.flush()?;
    let mut done = u64::from(bs);
    while done < journal_bytes {
        let n = (journal_bytes - done).min(zeros.len() as u64) as usize;
        jdev.write_at(&zeros[..n], joff + done, IoPriority::Urgent)?;
        done += n as u64;
    }
    let mut jsb = fresh_journal_superblock(&region, uuid, session);
    jsb.users = vec![uuid];
    region.write_superblock_full(&jsb)?;
    jdev.flush()?;
    Ok(())
}

/// Which target of [`Volume::create_checked`] its check is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetRole {
    /// The volume's own file, device or image.
    Home,
    /// Its external journal.
    Journal,
}

/// A target of [`Volume::create_checked`], open and locked, nothing
/// written to it yet.
pub struct CreateTarget<'a> {
    pub path: &'a Path,
    pub device: &'a dyn BlockDevice,
    /// This create made it (an empty file or image): nothing was there.
    pub created: bool,
    pub role: TargetRole,
}

impl Volume {
    /// Formats `path` (creating the file, and the external journal file, if
    /// needed) and opens it. Whatever they held is overwritten without a
    /// check (the `jbdev format` command is the one that refuses a target
    /// holding a volume or data; an embedding program decides for itself:
    /// see [`Volume::create_checked`]).
    pub fn create(path: &Path, fopts: &FormatOptions, oopts: &OpenOptions) -> Result<Volume> {
        Self::create_checked(path, fopts, oopts, &mut |_| Ok(()))
    }

    /// [`Volume::create`], calling `check` on each target (the home, then
    /// an external journal) once it is open and locked and before anything
    /// is written to it; an error from `check` ends the create with that
    /// error, nothing written. A check made before the create (is there a
    /// volume or data at the path?) can be overtaken by another process
    /// that creates or formats the path in between; made here, under the
    /// lock, it cannot.
    ///
    /// A failed create removes the files it created (exclusively, so never
    /// one another process created in the meantime) while it still holds
    /// their locks, and the RBD images it created.
    pub fn create_checked(
        path: &Path,
        fopts: &FormatOptions,
        oopts: &OpenOptions,
        check: &mut dyn FnMut(&CreateTarget<'_>) -> Result<()>,
    ) -> Result<Volume> {
        // All checked before anything is created or changed.
        let (journal_bytes, needed, data_offset) = plan_layout(fopts)?;
        oopts.validate()?;
        if matches!(fopts.journal, JournalPlacement::Internal) {
            refuse_unused_journal_path(path, oopts.journal_path.as_deref())?;
        }
        let dopts = |create: u64| jbdev_device::OpenOptions {
            backend: oopts.backend,
            direct: oopts.direct_io,
            create_size: Some(create),
            read_cache: oopts.read_cache,
            break_lock: oopts.break_lock,
            ..Default::default()
        };
        // The journal as it is opened (on the home's cluster: see
        // journal_target); the superblock records it as given.
        let journal = match &fopts.journal {
            JournalPlacement::External(p) => Some(journal_target(path, p)),
            JournalPlacement::Internal => None,
        };
        // RBD images this call creates (files say so when they are opened).
        let new_rbd = |p: &Path| jbdev_device::is_rbd_target(p) && rbd_image_absent(p);
        let rbd_created: Vec<PathBuf> = std::iter::once(path)
            .chain(journal.as_deref())
            .filter(|p| new_rbd(p))
            .map(Path::to_path_buf)
            .collect();
        let mut held: Vec<jbdev_device::OpenedDevice> = Vec::new();
        let mut open = |held: &mut Vec<jbdev_device::OpenedDevice>,
                        p: &Path,
                        size: u64,
                        role: TargetRole|
         -> Result<usize> {
            let o = open_device(p, &dopts(size))?;
            let created = o.created.is_some() || rbd_created.iter().any(|c| c == p);
            held.push(o);
            let o = held.last().expect("just pushed");
            check(&CreateTarget {
                path: p,
                device: &*o.device,
                created,
                role,
            })?;
            Ok(held.len() - 1)
        };
        let res = (|| {
            let home = open(&mut held, path, needed, TargetRole::Home)?;
            let jheld = match &journal {
                None => None,
                Some(p) => {
                    refuse_same_target(path, p)?;
                    Some(open(&mut held, p, journal_bytes, TargetRole::Journal)?)
                }
            };
            let dev = held[home].device.clone();
            let jdev = jheld.map(|j| held[j].device.clone());
            let watch = jheld.and_then(|j| {
                let o = &mut held[j];
                WatchedJournal::of(o.watch.take(), &o.path, path, journal_bytes)
            });
            let home_file = held[home].watch.take();
            // A file or RBD image that was there already: whatever its data
            // area held is zeroed (hole punch, RBD discard), as a new
            // volume reads on fresh storage (session 27's pass: a `format
            // --force` of 32 MiB over a written 128 MiB volume served 8 MiB
            // of the old one's data, where `grow` zeroes such bytes). A
            // block device keeps what it holds, as documented.
            let fresh = held[home].created.is_some() || rbd_created.iter().any(|c| c == path);
            if !fresh {
                format_fits(dev.as_ref(), fopts.block_size, needed)?;
                invalidate_volume_superblock(dev.as_ref(), fopts.block_size)?;
            }
            if !fresh && !held[home].is_block_device {
                let end = (data_offset + fopts.size_bytes).min(dev.size_bytes());
                if end > data_offset {
                    dev.write_zeroes(data_offset, end - data_offset)?;
                }
            }
            // (Its old superblock, if any, was cleared above.)
            Self::format_device_with(dev.clone(), jdev.clone(), fopts, false)?;
            // (A fresh journal needs no replay: only its record of this
            // home, `journal: None`, matters here.)
            let origin = HomeOrigin::of(path, home_file.as_ref(), dev.as_ref());
            let vol = Self::open_device_from(dev, jdev, oopts, Some(&origin))?;
            // Watched like an opened volume's (found by a C ABI pass: a
            // created volume went on acknowledging writes with its journal
            // file deleted).
            if !oopts.read_only {
                let home_watch = WatchedHome::of(home_file, path, vol.superblock());
                vol.watch_files(watch, home_watch)?;
            }
            Ok(vol)
        })();
        if res.is_err() {
            // Files while their locks are still held; RBD images once
            // closed (an open image cannot be removed).
            for o in &held {
                o.remove_if_created();
            }
            drop(held);
            for p in &rbd_created {
                remove_created(p);
            }
        }
        res
    }

    /// Checks, without taking or breaking any lock and without writing,
    /// that [`Volume::open`] of `path` can go ahead: it holds a jbdev
    /// volume, and its external journal (if any) opens. `open` runs it
    /// first when it is to break a lock (`break_lock`), and a caller
    /// opening several volumes with `break_lock` (`jbdev serve`) runs it on
    /// each before opening any: a command that ends up refused must not
    /// have broken a lock and fenced its holder on the way (found by a
    /// new-user pass: `serve --break-lock` of a journal image, or with a
    /// wrong `--journal`, fenced a live server and then failed).
    pub fn check_openable(path: &Path, opts: &OpenOptions) -> Result<()> {
        opts.validate()?;
        let ro = jbdev_device::OpenOptions {
            backend: opts.backend,
            read_only: true,
            exclusive: false,
            ..Default::default()
        };
        let dev = open_device(path, &ro)?.device;
        let sb = read_volume_superblock(dev.as_ref(), &path.display().to_string())?;
        match &sb.journal {
            JournalLocation::Internal { .. } => {
                refuse_unused_journal_path(path, opts.journal_path.as_deref())
            }
            JournalLocation::External {
                path_hint,
                len_bytes,
                uuid,
            } => {
                let given = opts.journal_path.as_deref();
                open_external_journal(path, (path_hint, *uuid), given, *len_bytes, &ro, true)
                    .map(drop)
            }
        }
    }

    /// Opens an existing volume, running journal recovery if needed.
    pub fn open(path: &Path, opts: &OpenOptions) -> Result<Volume> {
        opts.validate()?;
        if opts.break_lock && !opts.read_only {
            Self::check_openable(path, opts)?;
        }
        let dopts = jbdev_device::OpenOptions {
            backend: opts.backend,
            direct: opts.direct_io,
            read_only: opts.read_only,
            read_cache: opts.read_cache,
            break_lock: opts.break_lock,
            ..Default::default()
        };
        if opts.read_only {
            // A file is refused by its shared flock; an RBD image here.
            refuse_held_rbd(path)?;
        }
        let opened = open_device(path, &dopts)?;
        let (dev, home_file) = (opened.device, opened.watch);
        let sb = read_volume_superblock(dev.as_ref(), &path.display().to_string())?;
        let mut origin = HomeOrigin::of(path, home_file.as_ref(), dev.as_ref());
        let (jdev, watch) = match &sb.journal {
            JournalLocation::Internal { .. } => {
                refuse_unused_journal_path(path, opts.journal_path.as_deref())?;
                (None, None)
            }
            JournalLocation::External {
                path_hint,
                len_bytes,
                uuid,
            } => {
                let given = opts.journal_path.as_deref();
                let (jp, jdev, file) = open_external_journal(
                    path,
                    (path_hint, *uuid),
                    given,
                    *len_bytes,
                    &dopts,
                    true,
                )?;
                origin.journal = given.is_none().then(|| jp.clone());
                let watch = WatchedJournal::of(file, &jp, path, *len_bytes);
                (Some(jdev), watch)
            }
        };
        let vol = Self::open_device_from(dev, jdev, opts, Some(&origin))?;
        if !opts.read_only {
            let home_watch = WatchedHome::of(home_file, path, vol.superblock());
            vol.watch_files(watch, home_watch)?;
        }
        Ok(vol)
    }

    /// Starts the thread that checks the external journal file and the
    /// home file every [`JOURNAL_WATCH_INTERVAL`] and aborts the volume if
    /// either was deleted or truncated while open (see
    /// [`WatchedJournal::problem`], [`WatchedHome`]).
    fn watch_files(
        &self,
        journal: Option<WatchedJournal>,
        home: Option<WatchedHome>,
    ) -> Result<()> {
        if journal.is_none() && home.is_none() {
            return Ok(());
        }
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let (journal, home) = (journal.map(Arc::new), home.map(Arc::new));
        // Asked at once by a write that fails with ENOSPC (`Engine::shrunk`).
        let (pj, ph) = (journal.clone(), home.clone());
        let _ = self.engine.shrink_probe.set(Box::new(move |of_journal| {
            if of_journal {
                pj.as_ref()?.shrunk_message()
            } else {
                ph.as_ref()?.shrunk_message()
            }
        }));
        let (j, h) = (journal.clone(), home.clone());
        let engine = Arc::downgrade(&self.engine);
        let t = std::thread::Builder::new()
            .name("jbdev-journal-watch".into())
            .spawn(move || {
                // Ends when the volume shuts down (the sender is dropped).
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(JOURNAL_WATCH_INTERVAL)
                {
                    if let Some((w, p)) = j.as_ref().and_then(|w| Some((w, w.problem()?))) {
                        if let Some(e) = engine.upgrade() {
                            e.abort_journal(AbortCause::JournalFileLost(w.abort_message(&p)));
                        }
                        return;
                    }
                    if let Some((w, p)) = h.as_ref().and_then(|w| Some((w, w.problem()?))) {
                        if let Some(e) = engine.upgrade() {
                            e.abort_home(AbortCause::JournalFileLost(w.abort_message(&p)));
                        }
                        return;
                    }
                }
            })
            .map_err(|e| {
                VolumeError::Device(jbdev_device::DeviceError::io(
                    "start a thread",
                    "the file watch thread",
                    e,
                ))
            })?;
        *self.journal_watch.lock() = Some(JournalWatch {
            _stop: stop,
            watched: journal,
            home,
        });
        self.threads.lock().push(t);
        Ok(())
    }

    /// Formats a volume on already-open devices (`journal` is the external
    /// journal device, if any).
    pub fn format_device(
        dev: Arc<dyn BlockDevice>,
        journal: Option<Arc<dyn BlockDevice>>,
        fopts: &FormatOptions,
    ) -> Result<()> {
        Self::format_device_with(dev, journal, fopts, true)
    }

    /// [`Volume::format_device`]; `clear_old`: first clear a volume
    /// superblock `dev` may hold (false where the caller did, or made
    /// `dev` itself).
    fn format_device_with(
        dev: Arc<dyn BlockDevice>,
        journal: Option<Arc<dyn BlockDevice>>,
        fopts: &FormatOptions,
        clear_old: bool,
    ) -> Result<()> {
        let (journal_bytes, needed, data_offset) = plan_layout(fopts)?;
        let bs = u64::from(fopts.block_size);
        format_fits(dev.as_ref(), fopts.block_size, needed)?;
        let uuid = *uuid::Uuid::new_v4().as_bytes();
        let (location, jdev, joff) = match (&fopts.journal, journal) {
            (JournalPlacement::Internal, _) => (
                JournalLocation::Internal {
                    offset_bytes: bs,
                    len_bytes: journal_bytes,
                },
                dev.clone(),
                bs,
            ),
            (JournalPlacement::External(p), Some(j)) => {
                if j.size_bytes() < journal_bytes {
                    return Err(VolumeError::InvalidArgument(format!(
                        "the journal device holds {} bytes but the journal needs {journal_bytes}",
                        j.size_bytes()
                    )));
                }
                let hint = journal_path_hint(p)?;
                (
                    JournalLocation::External {
                        uuid,
                        len_bytes: journal_bytes,
                        path_hint: hint,
                    },
                    j,
                    0,
                )
            }
            (JournalPlacement::External(_), None) => {
                return Err(VolumeError::InvalidArgument(
                    "external journal placement needs a journal device".into(),
                ))
            }
        };
        // IMPORTANT: an older volume's superblock goes first and the new
        // one last, so an interrupted format never looks like a volume.
        if clear_old {
            invalidate_volume_superblock(dev.as_ref(), bs as u32)?;
        }
        write_empty_journal(&jdev, joff, journal_bytes, bs as u32, uuid, 0)?;
        let vsb = VolumeSuperblock {
            uuid,
            block_size: bs as u32,
            size_bytes: fopts.size_bytes,
            data_offset_bytes: data_offset,
            journal: location,
            feature_compat: 0,
            feature_incompat: 0,
            feature_ro_compat: 0,
            created_unix_secs: now_unix_secs(),
            journal_session: 0,
            journal_session_pending: 0,
            checkpoint_sequence: 0,
            checkpoint_mark_session: 0,
        };
        write_volume_superblock(dev.as_ref(), &vsb)
    }

    /// Opens a volume on already-open devices, running recovery if needed.
    pub fn open_device(
        dev: Arc<dyn BlockDevice>,
        journal: Option<Arc<dyn BlockDevice>>,
        opts: &OpenOptions,
    ) -> Result<Volume> {
        Self::open_device_from(dev, journal, opts, None)
    }

    /// [`Volume::open_device`] of a home opened by path, `origin` saying
    /// which file it is and how its external journal was found.
    fn open_device_from(
        dev: Arc<dyn BlockDevice>,
        journal: Option<Arc<dyn BlockDevice>>,
        opts: &OpenOptions,
        origin: Option<&HomeOrigin>,
    ) -> Result<Volume> {
        opts.validate()?;
        let mut sb = read_volume_superblock(dev.as_ref(), "the volume device")?;
        refuse_unknown_ro_compat(&sb, opts.read_only)?;
        let bs = sb.block_size;
        let home_flusher = Arc::new(FlushCoalescer::new());
        // What the volume touches: an RBD device then fails a shrink below
        // it, not one that took back space past it (s25 RBD pass #5). An
        // external journal device is told its journal's length below.
        let internal_end = match sb.journal {
            JournalLocation::Internal {
                offset_bytes,
                len_bytes,
            } => offset_bytes.saturating_add(len_bytes),
            JournalLocation::External { .. } => 0,
        };
        dev.set_bytes_in_use(
            sb.data_offset_bytes
                .saturating_add(sb.size_bytes)
                .max(internal_end),
        );
        let (jdev, jflusher, joff, jlen) = match (&sb.journal, journal) {
            (
                JournalLocation::Internal {
                    offset_bytes,
                    len_bytes,
                },
                _,
            ) => (dev.clone(), home_flusher.clone(), *offset_bytes, *len_bytes),
            (JournalLocation::External { len_bytes, .. }, Some(j)) => {
                // Said plainly, not as "corrupt journal" from the log's
                // geometry check (a file gets its own advice when opened by
                // path: `truncated_journal_advice`).
                if j.size_bytes() < *len_bytes {
                    return Err(short_journal_device(
                        "the journal device",
                        j.size_bytes(),
                        *len_bytes,
                    ));
                }
                j.set_bytes_in_use(*len_bytes);
                (j, Arc::new(FlushCoalescer::new()), 0, *len_bytes)
            }
            (JournalLocation::External { .. }, None) => {
                return Err(VolumeError::InvalidArgument(
                    "this volume has an external journal: give its path (--journal)".into(),
                ))
            }
        };
        let region = JournalRegion::new(jdev, jflusher, joff, bs, (jlen / u64::from(bs)) as u32)?;
        // A large journal takes seconds to scan (13 s for 4 GiB in session
        // 26's pass, in silence): say how far it got every few seconds.
        let tick = ProgressTicker::new();
        let scan = scan_journal(&region, &sb, &mut |blocks| {
            if let Some(secs) = tick.due() {
                tracing::info!(
                    "journal scan: {} MiB read in {secs} s (the log from its tail, then the \
                     whole {} MiB journal area once)",
                    (blocks * u64::from(bs)) >> 20,
                    jlen >> 20,
                );
            }
        })
        .map_err(|e| match e {
            // Session 31's docs pass: the refusal named no way out, where
            // `check` names the rebuild.
            jbdev_journal::JournalError::Superblock(f)
                if !matches!(f, jbdev_journal::format::FormatError::NewerFeatures(_))
                    && matches!(sb.journal, JournalLocation::Internal { .. }) =>
            {
                VolumeError::CorruptJournal(format!(
                    "journal superblock: {f}: `jbdev journal rescue` rebuilds it from the volume \
                     superblock and keeps the log's committed transactions (`jbdev check` says more)"
                ))
            }
            e => e.into(),
        })?;
        if scan.superblock.uuid != sb.journal_uuid() {
            let at = match (&sb.journal, origin.and_then(|o| o.journal.as_deref())) {
                (JournalLocation::Internal { .. }, _) => JournalAt::Internal,
                (_, Some(recorded)) => JournalAt::Recorded(recorded),
                (_, None) => JournalAt::Device,
            };
            return Err(VolumeError::WrongJournal(foreign_journal(
                at,
                scan.superblock.uuid,
                sb.journal_uuid(),
            )));
        }
        // Another home's journal first: the session stamps of a volume and
        // its copy diverge once both wrote, and "the journal is ahead"
        // advised `journal reset --force`, which discards the other one's
        // acknowledged writes (session 24's RBD pass).
        if let Some(why) = origin.and_then(|o| o.refuses(&scan.superblock, opts.read_only)) {
            return Err(VolumeError::CorruptJournal(why));
        }
        if let Some(why) = stale_journal(&sb, &scan.superblock)
            .or_else(|| journal_behind_home(&sb, &scan))
            .or_else(|| home_behind_journal(&sb, &scan.superblock))
        {
            return Err(VolumeError::CorruptJournal(why));
        }
        if let Some(damage) = &scan.home_damage {
            tracing::warn!(
                "{}: the home already holds that transaction and every one before it up to \
                 the checkpoint mark (transaction {}); recovery goes on after the mark",
                describe_scan_end(damage),
                sb.checkpoint_sequence
            );
        }
        if !opts.read_only {
            allocate_journal(&region, joff, jlen);
        }
        let was_clean = scan.end == ScanEnd::CleanJournal;
        let end = describe_scan_end(&scan.end);
        if let ScanEnd::CorruptMiddle {
            sequence,
            ref reason,
            ..
        } = scan.end
        {
            if let (Some(at), false, false) =
                (scan.unreadable, opts.read_only, opts.discard_after_damage)
            {
                return Err(VolumeError::UnreadableJournal(format!(
                    "transaction {sequence}: {reason}; refusing a read-write open: {}",
                    unreadable_journal_advice(at, sequence)
                )));
            }
            if !opts.read_only && !opts.discard_after_damage {
                return Err(VolumeError::CorruptJournal(format!(
                    "{end}; refusing a read-write open (a read-only open serves the volume with \
                     the transactions before the damage replayed; the committed transactions \
                     after it cannot be replayed by any open; `jbdev journal rescue` keeps \
                     the ones before it for good and discards the rest)"
                )));
            }
            if !opts.read_only {
                let end = match scan.unreadable {
                    Some(at) => format!(
                        "journal block {at}, in transaction {sequence}, could not be read \
                         (an I/O error)"
                    ),
                    None => end.clone(),
                };
                tracing::warn!(
                    "{end}: replaying the {} transaction(s) before it and discarding \
                     transaction {sequence} and every later one, as asked",
                    scan.txns.len()
                );
            }
        }
        let (mut plan, revoked) = recovery::replay_plan(&scan.txns, &scan.late_revokes);
        check_replay_plan(&sb, &plan)?;
        if !was_clean && !plan.is_empty() {
            // Replay can take a while on a large journal: say so first.
            tracing::info!(
                "journal recovery: replaying {} block(s) of {} transaction(s){}",
                plan.len(),
                scan.txns.len(),
                if opts.read_only {
                    " into memory (read-only)"
                } else {
                    ""
                }
            );
        }
        let mut jsb = scan.superblock.clone();
        jsb.sequence = scan.next_sequence;
        let data_offset = sb.data_offset_bytes;
        let engine_jsb = jsb.clone();
        let mut engine = Engine::new(
            dev.clone(),
            home_flusher.clone(),
            data_offset,
            sb.size_bytes,
            region,
            engine_jsb,
            opts.clone(),
            opts.read_only,
        );
        let bsz = bs as usize;
        if opts.read_only {
            // Serve the replayed state from memory; touch nothing on disk.
            load_plan_into_overlay(&engine, &plan, bsz)?;
        } else {
            // Replay: restore every block, make it durable, then mark the log
            // empty but in use (s_start = first) for this session.
            // A window of log blocks per read; its blocks go home as one
            // batch (the device's queue depth), consecutive homes as one
            // write each. The plan has one copy per home block, so the
            // writes are independent, and REPLAY_THREADS threads replay
            // consecutive parts of the log at once (each batch waits for
            // its slowest write; several keep the device busy meanwhile).
            // Progress every few seconds, as for the scan (a 4 GiB log
            // took 12 s to replay in session 26's pass, with one line).
            let replayed = std::sync::atomic::AtomicU64::new(0);
            let tick = ProgressTicker::new();
            let total = plan.len();
            let write_window = |entries: &[&recovery::ReplayEntry], blocks: &[&[u8]]| {
                let done = replayed.fetch_add(entries.len() as u64, Ordering::Relaxed)
                    + entries.len() as u64;
                if let Some(secs) = tick.due() {
                    tracing::info!(
                        "journal replay: {done} of {total} block(s) going home after {secs} s"
                    );
                }
                let mut order: Vec<usize> = (0..entries.len()).collect();
                order.sort_unstable_by_key(|&i| entries[i].home);
                let slices: Vec<IoSlice<'_>> =
                    order.iter().map(|&i| IoSlice::new(blocks[i])).collect();
                let mut reqs = Vec::new();
                let mut at = 0;
                for run in order.chunk_by(|&a, &b| entries[b].home == entries[a].home + 1) {
                    reqs.push(WriteReq {
                        offset: data_offset + entries[run[0]].home * u64::from(bs),
                        bufs: &slices[at..at + run.len()],
                        durable: false,
                    });
                    at += run.len();
                }
                dev.write_batch(&reqs, IoPriority::Urgent)?;
                Ok(())
            };
            // Log order, so each thread gets a consecutive part of the log.
            plan.sort_unstable_by_key(|e| e.pos);
            let part = plan.len().div_ceil(REPLAY_THREADS).max(1);
            let region = &engine.log.region;
            std::thread::scope(|s| -> Result<()> {
                let workers: Vec<_> = plan
                    .chunks(part)
                    .map(|p| {
                        let write_window = &write_window;
                        s.spawn(move || recovery::for_each_replay_window(region, p, write_window))
                    })
                    .collect();
                for w in workers {
                    w.join().map_err(|_| {
                        VolumeError::Internal("a journal replay thread panicked".into())
                    })??;
                }
                Ok(())
            })?;
            if !plan.is_empty() {
                home_flusher.flush(dev.as_ref())?;
            }
            jsb.start = jsb.first;
            // IMPORTANT: durable before the first commit of this session:
            // recovery judges a torn tail by the depth of the session that
            // wrote the log.
            jsb.pipeline_depth = opts.pipeline_depth.clamp(1, recovery::MAX_PIPELINE_DEPTH);
            // This session's stamp: announced in the volume (pending),
            // then into the journal, then the volume's own. A crash in
            // between leaves the journal at most at the pending number,
            // which `session_mismatch` accepts; any other journal ahead of
            // the volume was not this home's.
            let session = sb
                .journal_session
                .max(jsb.session)
                .max(sb.journal_session_pending)
                .wrapping_add(1)
                .max(1);
            sb.journal_session_pending = session;
            write_volume_superblock(dev.as_ref(), &sb)?;
            jsb.session = session;
            jsb.home_id = origin.map_or(0, |o| o.id);
            jsb.home_path_id = origin.map_or(0, |o| o.path_id);
            engine.log.region.update_superblock(&jsb)?;
            engine.log.region.flush()?;
            *engine.log.jsb.get_mut() = jsb;
            sb.journal_session = session;
            // Every transaction before the log (which starts at
            // `next_sequence` now, in the journal written above) is home:
            // checkpointed before, or replayed and flushed above. The mark
            // says so, for this session, so it never falls behind the log
            // (`home_behind_journal`). Written with the session stamp, after
            // the journal's: a crash before leaves the old mark with the old
            // stamps, which still describe the journal as it was.
            sb.checkpoint_sequence = scan.next_sequence.wrapping_sub(1);
            sb.checkpoint_mark_session = session;
            write_volume_superblock(dev.as_ref(), &sb)?;
            engine.record_checkpoints_in(sb.clone());
        }
        if !was_clean {
            tracing::info!(
                "journal recovery: {} transactions, {} blocks replayed, {} copies revoked; {end}",
                scan.txns.len(),
                plan.len(),
                revoked
            );
        }
        let recovery = RecoveryReport {
            was_clean,
            transactions_replayed: scan.txns.len(),
            blocks_replayed: plan.len(),
            revoked_copies: revoked,
            end,
        };
        let engine = Arc::new(engine);
        let mut threads = Vec::new();
        if !opts.read_only {
            if let Err(e) = start_engine_threads(&engine, &mut threads) {
                // IMPORTANT: a failed open holds nothing. The threads that
                // did start own the engine (its devices, its lock): stop
                // and join them, or every later open of this volume in
                // the process failed "already open" (session 22's
                // adversarial pass, under a process limit).
                engine.stop_commit();
                engine.stop_checkpoint();
                for t in threads {
                    let _ = t.join();
                }
                return Err(e);
            }
        }
        Ok(Volume {
            engine,
            threads: Mutex::new(threads),
            journal_watch: Mutex::new(None),
            closed: AtomicBool::new(false),
            superblock: sb,
            recovery,
        })
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.engine.size_bytes
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.engine.bs as u32
    }

    /// Largest write (at any alignment) or transaction extent that is
    /// atomic across a crash. A transaction is accepted while the blocks it
    /// touches fit in one journal transaction (one more block than this
    /// size, to allow for unaligned ends); beyond that it fails with
    /// [`VolumeError::TooLarge`] instead of being split.
    pub fn max_transaction_bytes(&self) -> u64 {
        self.engine.max_atomic_blocks().saturating_sub(1).max(1) * self.engine.bs as u64
    }

    /// The most distinct blocks one write or transaction may touch and
    /// stay atomic (see [`Volume::max_transaction_bytes`]).
    pub fn max_transaction_blocks(&self) -> u64 {
        self.engine.max_atomic_blocks()
    }

    /// The volume superblock.
    pub fn superblock(&self) -> &VolumeSuperblock {
        &self.superblock
    }

    /// What recovery found when the volume was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Name of the device backend in use ("io_uring", "pread", ...).
    pub fn backend_name(&self) -> &'static str {
        self.engine.home.dev.backend_name()
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(VolumeError::Closed);
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.engine.size_bytes => Ok(()),
            _ => Err(VolumeError::OutOfRange {
                offset,
                len,
                size: self.engine.size_bytes,
            }),
        }
    }

    /// Reads `buf.len()` bytes at `offset` (any alignment).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        let arrived = Instant::now();
        self.engine.check_not_taken_over()?;
        if buf.is_empty() {
            return self.engine.check_readable(arrived);
        }
        let bs = self.engine.bs as u64;
        let first = offset / bs;
        let last = (offset + buf.len() as u64).div_ceil(bs);
        let aligned = offset.is_multiple_of(bs) && (buf.len() as u64).is_multiple_of(bs);
        if aligned {
            self.engine.read_blocks(first, buf)?;
        } else {
            let mut tmp = AlignedBuf::zeroed(((last - first) * bs) as usize);
            self.engine.read_blocks(first, &mut tmp)?;
            let s = (offset - first * bs) as usize;
            buf.copy_from_slice(&tmp[s..s + buf.len()]);
        }
        // IMPORTANT: nothing is returned before the storage vouched that
        // no other client could have written it since the read arrived.
        self.engine.check_readable(arrived)
    }

    /// [`Volume::read_at`] only if it needs no device I/O: whole blocks, each
    /// from the journal's overlay or from the home device's page cache (with
    /// `OpenOptions::read_cache`). None if it would block (`buf` then holds
    /// unspecified bytes), for a caller that must not block (an NBD network
    /// thread, which then hands the read to a worker).
    pub fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<Result<()>> {
        if let Err(e) = self.check(offset, buf.len() as u64) {
            return Some(Err(e));
        }
        if let Err(e) = self.engine.check_readable_now(Instant::now())? {
            return Some(Err(e));
        }
        if buf.is_empty() {
            return Some(Ok(()));
        }
        let bs = self.engine.bs as u64;
        if !offset.is_multiple_of(bs) || !(buf.len() as u64).is_multiple_of(bs) {
            return None;
        }
        match self.engine.try_read_blocks(offset / bs, buf) {
            Ok(true) => Some(Ok(())),
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Writes `buf` at `offset` (any alignment). Visible to readers when this
    /// returns; durable when it returns if `flags.fua`, else after a later
    /// [`Volume::flush`]. Atomic across a crash up to
    /// [`Volume::max_transaction_bytes`]; a larger write (or one at least a
    /// user-lowered `direct_write_threshold`) goes straight home and is
    /// old-or-new per sector until flushed.
    pub fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        let Some(mid) = self.route(offset, buf.len() as u64)? else {
            return self
                .engine
                .journaled(&[Op::Write { offset, data: buf }], flags.fua);
        };
        let (head, tail, sync) = self.write_edges(buf, offset, mid, flags)?;
        self.write_middle(mid, self.engine_copy(&buf[head..tail]), sync)
    }

    /// [`Volume::write_at`] of a buffer the volume may keep until the write
    /// is done: a write large enough to go straight home goes from `buf`
    /// itself (through the page cache, or `O_DIRECT` if it is aligned)
    /// instead of from a copy. The NBD server hands its payload buffers over
    /// this way.
    pub fn write_owned(&self, buf: CallerBuf, offset: u64, flags: WriteFlags) -> Result<()> {
        let bytes: &[u8] = (*buf).as_ref();
        match self.route(offset, bytes.len() as u64)? {
            None => self.engine.journaled(
                &[Op::Write {
                    offset,
                    data: bytes,
                }],
                flags.fua,
            ),
            Some(mid) => self.write_owned_direct(buf, offset, mid, flags),
        }
    }

    /// [`Volume::write_owned`] reporting to `done` as
    /// [`Volume::write_at_then`] does.
    pub fn write_owned_then(
        &self,
        buf: CallerBuf,
        offset: u64,
        flags: WriteFlags,
        done: Completion,
    ) {
        let bytes: &[u8] = (*buf).as_ref();
        match self.route(offset, bytes.len() as u64) {
            Err(e) => done(Err(e)),
            Ok(None) => self.engine.journaled_then(
                &[Op::Write {
                    offset,
                    data: bytes,
                }],
                flags.fua,
                done,
            ),
            Ok(Some(mid)) => done(self.write_owned_direct(buf, offset, mid, flags)),
        }
    }

    /// A routed [`Volume::write_owned`] whose aligned middle `mid` goes
    /// straight home: from `buf` itself if the device can take it there.
    fn write_owned_direct(
        &self,
        buf: CallerBuf,
        offset: u64,
        mid: (u64, u64),
        flags: WriteFlags,
    ) -> Result<()> {
        let bytes: &[u8] = (*buf).as_ref();
        let (head, tail, sync) = self.write_edges(bytes, offset, mid, flags)?;
        let data = if self.engine.takes_caller_buf(bytes[head..].as_ptr()) {
            DirectData::Caller(buf, head..tail)
        } else {
            self.engine_copy(&bytes[head..tail])
        };
        self.write_middle(mid, data, sync)
    }

    /// `bytes` copied into a reused aligned engine buffer.
    fn engine_copy(&self, bytes: &[u8]) -> DirectData {
        let mut copy = self.engine.direct_buf(bytes.len());
        copy.copy_from_slice(bytes);
        DirectData::Engine(copy)
    }

    /// Journals the partial head and tail blocks of a write whose aligned
    /// middle `mid` goes straight home; returns the middle's byte range
    /// within `buf` and what the middle's direct write must make durable
    /// (with FUA, the journaled edges too).
    fn write_edges(
        &self,
        buf: &[u8],
        offset: u64,
        mid: (u64, u64),
        flags: WriteFlags,
    ) -> Result<(usize, usize, DirectSync)> {
        let (mid_start, mid_end) = mid;
        let head = (mid_start - offset) as usize;
        let tail = (mid_end - offset) as usize;
        let journaled = self.journal_edges([
            Op::Write {
                offset,
                data: &buf[..head],
            },
            Op::Write {
                offset: mid_end,
                data: &buf[tail..],
            },
        ])?;
        let sync = match (flags.fua, journaled) {
            (false, _) => DirectSync::None,
            (true, false) => DirectSync::Alone,
            (true, true) => DirectSync::WithRunning,
        };
        Ok((head, tail, sync))
    }

    /// Journals the partial head and tail pieces of a request whose aligned
    /// middle goes straight home, skipping empty ones, in one transaction
    /// and without waiting for durability (the middle's direct write makes
    /// them durable when it must). True if there was any.
    fn journal_edges(&self, edges: [Op<'_>; 2]) -> Result<bool> {
        let ops: SmallVec<[Op<'_>; 2]> = edges.into_iter().filter(|op| !op.is_empty()).collect();
        if !ops.is_empty() {
            self.engine.journaled(&ops, false)?;
        }
        Ok(!ops.is_empty())
    }

    /// Writes the aligned middle `mid` of a large write straight home.
    fn write_middle(&self, mid: (u64, u64), data: DirectData, sync: DirectSync) -> Result<()> {
        let bs = self.engine.bs as u64;
        self.engine.direct(
            mid.0 / bs,
            mid.1 / bs,
            Some(data),
            Zeroing::Deallocate,
            sync,
        )
    }

    /// [`Volume::write_at`] without waiting for durability: the data is
    /// visible to readers when this returns, and `done` gets the outcome
    /// once the write is durable (with `flags.fua`; at once without). Many
    /// FUA writes started this way from one thread share one group commit,
    /// which one thread calling `write_at` in turn cannot. A write too large
    /// for one transaction goes home as in `write_at`, on this thread.
    pub fn write_at_then(&self, buf: &[u8], offset: u64, flags: WriteFlags, done: Completion) {
        match self.route(offset, buf.len() as u64) {
            Err(e) => done(Err(e)),
            Ok(None) => {
                self.engine
                    .journaled_then(&[Op::Write { offset, data: buf }], flags.fua, done)
            }
            Ok(Some(_)) => done(self.write_at(buf, offset, flags)),
        }
    }

    /// [`Volume::write_at`] only if it can run now without waiting: whole
    /// blocks that fit in one transaction, with journal space free right
    /// now. None if it would block (nothing changed); else the write is
    /// done (visible) or failed, and what durability still needs goes to
    /// [`Volume::complete`]. An NBD network thread runs most 4 KiB writes
    /// itself this way and hands the rest to a worker (`write_at_then`).
    pub fn try_write_at(
        &self,
        buf: &[u8],
        offset: u64,
        flags: WriteFlags,
    ) -> Option<Result<Durability>> {
        match self.route(offset, buf.len() as u64) {
            Err(e) => Some(Err(e)),
            Ok(Some(_)) => None,
            Ok(None) => self
                .engine
                .try_journaled(&[Op::Write { offset, data: buf }], flags.fua),
        }
    }

    /// [`Volume::flush`] only if it needs no device I/O on this thread (no
    /// direct home write waits for a home flush); see [`Volume::try_write_at`].
    pub fn try_flush(&self) -> Option<Result<Durability>> {
        if self.closed.load(Ordering::Acquire) {
            return Some(Err(VolumeError::Closed));
        }
        if self.engine.read_only {
            return Some(Ok(Durability::NONE));
        }
        self.engine.try_flush()
    }

    /// Runs `done` once what `d` waits for is durable (at once if nothing),
    /// or with the error if the volume aborts first.
    pub fn complete(&self, d: Durability, done: Completion) {
        self.engine.complete(d, done)
    }

    /// [`Volume::flush`] reporting to `done` instead of waiting (see
    /// [`Volume::write_at_then`]).
    pub fn flush_then(&self, done: Completion) {
        if self.closed.load(Ordering::Acquire) {
            return done(Err(VolumeError::Closed));
        }
        if self.engine.read_only {
            return done(Ok(()));
        }
        self.engine.flush_then(done)
    }

    /// Checks a mutating request of `len` bytes at `offset` (in range, the
    /// volume writable) and says where it goes: its aligned middle
    /// straight home, or None for all of it through the journal.
    fn route(&self, offset: u64, len: u64) -> Result<Option<(u64, u64)>> {
        self.check(offset, len)?;
        self.engine.check_writable()?;
        Ok(self.direct_part(offset, len))
    }

    /// The aligned middle `[start, end)` of a request that goes straight to
    /// its home location, or None if it goes through the journal: requests
    /// that fit in one transaction (and are below a user-lowered
    /// `direct_write_threshold`) are journaled, all-or-nothing.
    fn direct_part(&self, offset: u64, len: u64) -> Option<(u64, u64)> {
        let bs = self.engine.bs as u64;
        let touched = (offset + len).div_ceil(bs) - offset / bs;
        let journaled = len < self.engine.opts.direct_write_threshold
            && touched <= self.engine.max_atomic_blocks();
        let (start, end) = (offset.div_ceil(bs) * bs, (offset + len) / bs * bs);
        (!journaled && end > start).then_some((start, end))
    }

    /// Makes every write that returned before this call durable.
    pub fn flush(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(VolumeError::Closed);
        }
        if self.engine.read_only {
            return Ok(());
        }
        self.engine.flush()
    }

    /// Deallocates a range; it reads back as zeroes (the same guarantees as
    /// [`Volume::write_zeroes`]).
    pub fn trim(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.write_zeroes(offset, len, flags)
    }

    /// Zeroes a range; its blocks may be deallocated at home (a hole
    /// punch), as NBD's WRITE_ZEROES without `NO_HOLE` allows. Ranges that
    /// fit in a transaction go through the journal (atomic); larger ones
    /// are zeroed in place (hole punch / BLKZEROOUT) with revokes.
    pub fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.zero(offset, len, flags, Zeroing::Deallocate)
    }

    /// Zeroes a range and keeps it allocated at home (NBD's `NO_HOLE`,
    /// `fallocate`'s `ZERO_RANGE`), so that a preallocated image keeps its
    /// space: journaled zero blocks are checkpointed as data, a large range
    /// is zeroed in place with `ZERO_RANGE` (files; zero blocks are
    /// written where the filesystem has no `ZERO_RANGE`) or BLKZEROOUT
    /// (block devices). Atomicity and durability as
    /// [`Volume::write_zeroes`].
    pub fn write_zeroes_allocated(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.zero(offset, len, flags, Zeroing::KeepAllocated)
    }

    fn zero(&self, offset: u64, len: u64, flags: WriteFlags, zeroing: Zeroing) -> Result<()> {
        let Some((mid_start, mid_end)) = self.route(offset, len)? else {
            return self.engine.journaled(
                &[Op::Zero {
                    offset,
                    len,
                    zeroing,
                }],
                flags.fua,
            );
        };
        self.journal_edges([
            Op::Zero {
                offset,
                len: mid_start - offset,
                zeroing,
            },
            Op::Zero {
                offset: mid_end,
                len: offset + len - mid_end,
                zeroing,
            },
        ])?;
        let bs = self.engine.bs as u64;
        // Zeroing has no durable form of its own: a FUA zero flushes.
        let sync = if flags.fua {
            DirectSync::WithRunning
        } else {
            DirectSync::None
        };
        self.engine
            .direct(mid_start / bs, mid_end / bs, None, zeroing, sync)
    }

    /// True if [`Volume::write_zeroes`] of this range zeroes in place (hole
    /// punch / BLKZEROOUT) rather than journaling zero blocks — i.e. is fast
    /// (NBD's FAST_ZERO).
    pub fn zeroes_in_place(&self, offset: u64, len: u64) -> bool {
        self.direct_part(offset, len).is_some()
    }

    /// Starts an atomic multi-extent transaction.
    pub fn transaction(&self) -> Transaction<'_> {
        Transaction {
            vol: self,
            extents: TxnExtents::default(),
        }
    }

    /// Applies `extents` (built against this volume) atomically, as
    /// [`Transaction::commit`] does; with `flags.fua`, durably.
    pub fn commit_extents(&self, extents: &TxnExtents, flags: WriteFlags) -> Result<()> {
        self.check(0, 0)?;
        let ops: Vec<Op<'_>> = extents
            .ops
            .iter()
            .map(|o| match o {
                TxOp::Write(off, d) => Op::Write {
                    offset: *off,
                    data: d,
                },
                TxOp::Zero(off, len) => Op::Zero {
                    offset: *off,
                    len: *len,
                    zeroing: Zeroing::Deallocate,
                },
            })
            .collect();
        self.engine.journaled(&ops, flags.fua).map_err(|e| match e {
            VolumeError::EdgeRead { offset, error, .. } => VolumeError::EdgeRead {
                offset,
                request: "a transaction's unaligned extent",
                error,
            },
            e => e,
        })
    }

    /// The most bytes one [`Volume::block_status`] reports on.
    pub const BLOCK_STATUS_WINDOW: u64 = 64 << 30;

    /// Which parts of `[offset, offset+len)` hold data and which read as
    /// zeroes: consecutive extents from `offset`, covering the range or, for
    /// a range longer than [`Volume::BLOCK_STATUS_WINDOW`], that much of it
    /// (ask again from where they end). The work and memory of a call follow
    /// the extents it finds, not the bytes it covers: one NBD request over a
    /// sparse 256 TiB volume once asked for 64 GiB (3 bytes per block) and
    /// aborted the server.
    pub fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.block_status_at_most(offset, len, usize::MAX)
    }

    /// [`Volume::block_status`] for a caller that wants at most
    /// `max_extents` extents (an NBD reply holds 1,024, or 1 with
    /// `REQ_ONE`): it looks at a window from `offset` that starts at 1 MiB
    /// and grows fourfold until it holds more extents than that or covers
    /// the range, so the work follows the extents returned, not the ones a
    /// 64 GiB window holds (session 29's hostile-client pass: a `REQ_ONE`
    /// request on a volume fragmented into 262k extents took 0.3-0.8 s and
    /// 32 of them 1.3 GiB of memory; 128 in flight held another client's
    /// read for 47 s). The extents returned are consecutive from `offset`;
    /// the last may end before the range does.
    pub fn block_status_at_most(
        &self,
        offset: u64,
        len: u64,
        max_extents: usize,
    ) -> Result<Vec<Extent>> {
        self.check(offset, len)?;
        self.engine.check_readable(Instant::now())?;
        if len == 0 || max_extents == 0 {
            return Ok(Vec::new());
        }
        let len = len.min(Self::BLOCK_STATUS_WINDOW);
        if max_extents == usize::MAX {
            return self.block_status_window(offset, len);
        }
        let mut window = len.min(1 << 20);
        loop {
            let mut extents = self.block_status_window(offset, window)?;
            if extents.len() > max_extents || window >= len {
                extents.truncate(max_extents);
                return Ok(extents);
            }
            window = window.saturating_mul(4).min(len);
        }
    }

    /// The extents of `[offset, offset + len)`, `len` at most
    /// [`Volume::BLOCK_STATUS_WINDOW`], all of them.
    fn block_status_window(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let e = &self.engine;
        let bs = e.bs as u64;
        let first = offset / bs;
        let last = (offset + len).div_ceil(bs);
        // IMPORTANT: the overlay first, then the home allocation map, and
        // only for blocks the overlay left to home. In the other order a
        // block checkpointed between the two looks (from the old map) like
        // a hole and (from the new overlay) like home: acknowledged data
        // reported as zeroes. In this order, a block the overlay sends home
        // already has its data there, so the map sees it.
        let overlay_state = |src: Source| match src {
            Source::Journaled(_) | Source::Pending(..) => Some(ExtentState::Data),
            Source::Zero => Some(ExtentState::Zero),
            Source::Home => None,
        };
        // Blocks the overlay decides: those with a map entry, each by its
        // own `source` (which weighs the entry against pending direct
        // writes), and those only a pending direct write covers, by the
        // newest such write (data or zeroes).
        let mut points: Vec<(u64, u64, ExtentState)> = Vec::new();
        let mut pending: Vec<(u64, u64, u64, ExtentState)> = Vec::new();
        if last - first <= 65536 {
            for b in first..last {
                let src = e.overlay.lock_block(b).source(b, e.bs);
                if let Some(st) = overlay_state(src) {
                    points.push((b, b + 1, st));
                }
            }
        } else {
            for s in 0..crate::overlay::SHARDS {
                let sh = e.overlay.lock(s);
                for &b in sh.map.keys().filter(|b| (first..last).contains(*b)) {
                    if let Some(st) = overlay_state(sh.source(b, e.bs)) {
                        points.push((b, b + 1, st));
                    }
                }
                for p in &sh.pending {
                    let (a, z) = (p.start.max(first), p.end.min(last));
                    if a < z {
                        let st = match p.data {
                            Some(_) => ExtentState::Data,
                            None => ExtentState::Zero,
                        };
                        pending.push((a, z, p.ver, st));
                    }
                }
            }
        }
        // Each shard lists every pending write that touches it: once each.
        pending.sort_unstable_by_key(|p| (p.2, p.0, p.1));
        pending.dedup();
        let home = e
            .home
            .dev
            .allocation(e.home.offset + first * bs, (last - first) * bs)?;
        let holes: Vec<(u64, u64, ExtentState)> = home
            .iter()
            .filter(|x| !x.allocated)
            .map(|x| {
                let s = (x.offset - e.home.offset) / bs;
                let t = (x.offset + x.len - e.home.offset) / bs;
                (s.max(first), t.min(last), ExtentState::Zero)
            })
            .filter(|(s, t, _)| s < t)
            .collect();
        let home_runs = cover_runs(first, last, vec![(first, last, ExtentState::Data)], holes);
        points.sort_by_key(|r| r.0);
        let runs = cover_runs(
            first,
            last,
            cover_runs(first, last, home_runs, newest_runs(pending)),
            points,
        );
        Ok(runs
            .into_iter()
            .map(|(a, z, state)| {
                let lo = (a * bs).max(offset);
                let hi = (z * bs).min(offset + len);
                Extent {
                    offset: lo,
                    len: hi - lo,
                    state,
                }
            })
            .collect())
    }

    /// A handle that reports, from any thread, how many bytes of the
    /// journal are in use: what a close still has to write home. It keeps
    /// the volume's engine (not its devices' lock) alive while it exists.
    pub fn journal_probe(&self) -> JournalProbe {
        JournalProbe {
            engine: self.engine.clone(),
        }
    }

    /// Current metrics.
    pub fn stats(&self) -> Stats {
        let e = &self.engine;
        // IMPORTANT: everything that takes another lock comes before the
        // stats lock, a leaf (ARCHITECTURE 26): `avg_commit` takes the state
        // lock, and a commit publishing under the state lock takes the stats
        // lock — taken the other way round here, the two deadlocked (a
        // scrape of a loaded server, or any caller polling stats while the
        // log fills, hung the volume).
        let (used, capacity, _, _) = e.journal_state();
        let avg_commit_us = e.avg_commit().as_micros() as u64;
        let lag_txns = e.committed_len() as u64;
        let pool = e.pool.stats();
        let device_flushes = e.device_flushes();
        let (store_full, store_full_attempts) = e.store_full();
        let aborted = e.aborted();
        let salvage_due = e.salvage_due();
        let s = e.stats.lock();
        let secs = s.started.elapsed().as_secs_f64().max(1e-9);
        Stats {
            commits: s.commits,
            commits_per_sec: s.commits as f64 / secs,
            blocks_journaled: s.data_blocks,
            mean_transaction_blocks: if s.commits == 0 {
                0.0
            } else {
                s.data_blocks as f64 / s.commits as f64
            },
            commit_latency_us_p50: s.commit_latency_us.value_at_quantile(0.5),
            commit_latency_us_p99: s.commit_latency_us.value_at_quantile(0.99),
            commit_latency_us_max: s.commit_latency_us.max(),
            avg_commit_us,
            journal_fill_ratio: if capacity == 0 {
                0.0
            } else {
                used as f64 / capacity as f64
            },
            checkpoint_lag_blocks: used,
            checkpoint_lag_transactions: lag_txns,
            checkpoints: s.checkpoints,
            checkpoint_blocks: s.checkpoint_blocks,
            checkpoint_blocks_skipped: s.checkpoint_blocks_skipped,
            direct_writes: s.direct_writes,
            direct_writes_uncopied: s.direct_writes_uncopied,
            commits_pipelined: s.chained_commits,
            device_flushes,
            log_space_waits: s.log_space_waits,
            revoke_order_waits: s.revoke_order_waits,
            store_full,
            store_full_attempts,
            paced_writes: s.paced_writes,
            pace_sleep_ms: s.pace_sleep_us / 1000,
            bulk_read_yields: s.bulk_read_yields,
            read_retries: s.read_retries,
            locked_reads: s.locked_reads,
            aborted,
            salvaged_blocks: s.salvaged_blocks,
            salvage_uncommitted_blocks: s.salvage_uncommitted_blocks,
            salvage_complete: s.salvage_complete,
            salvage_running: salvage_due && !s.salvage_complete,
            write_buffers_allocated: pool.allocated,
            write_buffers_reused: pool.reused,
            write_buffer_pool_bytes: pool.kept_bytes,
        }
    }

    /// Commits everything, checkpoints it and marks the journal clean. After
    /// an abort this returns the error; the journal is then replayed at the
    /// next open.
    pub fn close(self) -> Result<()> {
        let res = self.shutdown();
        drop(self);
        // The journal's buffers and the overlay were freed just now: give
        // their pages back (a 4 GiB journal left 1.5 GB resident in the
        // embedding process: session 33's C ABI pass).
        jbdev_device::heap::release_free_memory();
        res
    }

    /// [`Volume::close`], and the metrics as the close left them: a salvage
    /// after a journal failure has ended by then (the close joins the
    /// checkpoint thread that runs it), so `salvage_complete` says whether
    /// every committed write reached the home device. For callers that
    /// have no log to read (the C ABI's `jbdev_close`).
    pub fn close_with_stats(self) -> (Result<()>, Stats) {
        let res = self.shutdown();
        let stats = self.stats();
        drop(self);
        jbdev_device::heap::release_free_memory();
        (res, stats)
    }

    fn shutdown(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // Stopped first: an abort now would keep the final checkpoint from
        // writing home what only the journal holds. Checked once more below.
        let (watch, home_watch) = self
            .journal_watch
            .lock()
            .take()
            .map_or((None, None), |w| (w.watched, w.home));
        if self.engine.read_only {
            return Ok(());
        }
        let flushed = self.engine.flush();
        let mut threads = std::mem::take(&mut *self.threads.lock());
        // The last handle may be dropped on one of the volume's own threads:
        // a completion callback that owned it, run by the commit thread.
        // That thread is not joined (it would wait for itself); it finds
        // the shutdown when the callback returns, and ends.
        let me = std::thread::current().id();
        let join = |t: JoinHandle<()>| {
            if t.thread().id() != me {
                let _ = t.join();
            }
        };
        self.engine.stop_commit();
        if !threads.is_empty() {
            join(threads.remove(0));
        }
        self.engine.stop_checkpoint();
        for t in threads {
            join(t);
        }
        if let Err(e) = flushed {
            // A deleted journal file whose writes are not all home: the
            // descriptors closing now are the last way to its content.
            if let Some(w) = watch.as_deref() {
                let home_has_all = self.engine.stats.lock().salvage_complete;
                if !home_has_all && matches!(w.problem(), Some(JournalFileProblem::Deleted)) {
                    let why = match &e {
                        // Its text is the deletion's own message.
                        VolumeError::JournalFileLost(_) => {
                            "the salvage could not finish: see the log".to_string()
                        }
                        e => e.to_string(),
                    };
                    return Err(w.rescue_at_close(&why));
                }
                // Everything committed is home: the abort's message (with
                // advice for while the process still ran, a /proc copy) is
                // stale now; say what happened and the next step
                // (`Stats::close_outcome` adds how the salvage ended).
                if let (true, Some(p)) = (home_has_all, w.problem()) {
                    return Err(VolumeError::JournalFileLost(w.after_salvage_message(&p)));
                }
            }
            return Err(e);
        }
        let res = self.engine.mark_clean();
        if let Some(w) = watch.as_deref() {
            if let Some(p) = w.problem() {
                // Everything acknowledged is home (the final checkpoint ran);
                // the operator must still hear that the journal is gone.
                tracing::error!("{}", w.close_message(&p));
            }
        }
        // A home file deleted or cut since the watch last looked: the
        // close must not report success for writes that are gone with it.
        if let Some((h, p)) = home_watch.as_deref().and_then(|h| Some((h, h.problem()?))) {
            let msg = match p {
                JournalFileProblem::Deleted => format!(
                    "the volume file {} was deleted while the volume was open: its content \
                     (every acknowledged write) is gone with this close",
                    h.path.display()
                ),
                p => h.abort_message(&p),
            };
            return Err(VolumeError::JournalFileLost(msg));
        }
        res
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!("closing the volume: {e}");
        }
    }
}

/// One line for where a journal scan stopped, for messages and logs.
pub fn describe_scan_end(end: &ScanEnd) -> String {
    match end {
        ScanEnd::CleanJournal => "journal clean".into(),
        ScanEnd::End => "log ends at a transaction boundary".into(),
        ScanEnd::TornTail {
            sequence,
            pos,
            reason,
        } => {
            format!("discarded torn last transaction {sequence} at journal block {pos}: {reason}")
        }
        ScanEnd::CorruptMiddle {
            sequence,
            pos,
            reason,
        } => {
            format!("transaction {sequence} at journal block {pos} is corrupt: {reason}")
        }
    }
}

/// What to say of a log that ends at block `at` of transaction `sequence`
/// because the block could not be read ([`recovery::Scan::unreadable`]):
/// not damage, so nothing is lost yet. The read-write refusal, `check` and
/// `journal rescue` say it (session 31's fault pass: "cannot be replayed by
/// any open" sent an operator to a rescue that discarded acknowledged
/// writes still on the medium).
pub fn unreadable_journal_advice(at: u32, sequence: u32) -> String {
    format!(
        "journal block {at} could not be read (an I/O error, not damage found in it): \
         transaction {sequence} and the later ones may still be intact, and an open replays \
         them all once the device reads it again (retry, or copy the device first, e.g. with \
         ddrescue). A read-only open serves the volume with the transactions before it; \
         `jbdev journal rescue --force` discards the rest for good"
    )
}

/// Threads that replay a journal at once (each with its own batches of
/// writes in flight); only while a volume is opened after a crash.
const REPLAY_THREADS: usize = 4;

fn load_plan_into_overlay(
    engine: &Engine,
    plan: &[recovery::ReplayEntry],
    bs: usize,
) -> Result<()> {
    recovery::for_each_replay_window(&engine.log.region, plan, |entries, blocks| {
        for (e, block) in entries.iter().zip(blocks) {
            let mut buf = AlignedBuf::zeroed(bs);
            buf.copy_from_slice(block);
            let data = BlockRef {
                buf: SharedBuf::from_aligned(&engine.pool, buf),
                offset: 0,
            };
            let mut sh = engine.overlay.lock(Overlay::shard_of(e.home));
            let ver = sh.bump();
            sh.map.entry(e.home).or_default().newest = Some(Version { ver, data });
        }
        Ok(())
    })?;
    Ok(())
}

/// The distinct blocks of a transaction's extents, as sorted, disjoint
/// block ranges: so the extent that would make a transaction too large to
/// be atomic is refused when it is added, not the whole transaction at
/// commit, and overlapping extents count once.
#[derive(Clone, Debug, Default)]
pub struct TouchedBlocks {
    /// `[start, end)` block ranges, sorted, neither overlapping nor adjacent.
    ranges: Vec<(u64, u64)>,
    count: u64,
}

impl TouchedBlocks {
    /// Distinct blocks touched so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Adds the extent `[offset, offset + len)` of a transaction on `vol`:
    /// `OutOfRange` past its end, [`VolumeError::TooLarge`] if the
    /// transaction would then touch more blocks than one atomic transaction
    /// holds; on an error nothing changes. (The C ABI's transactions count
    /// with it too.)
    pub fn add(&mut self, vol: &Volume, offset: u64, len: u64) -> Result<()> {
        vol.check(offset, len)?;
        let bs = u64::from(vol.block_size());
        self.try_add(offset, len, bs, vol.max_transaction_blocks())
            .map_err(|blocks| vol.engine.too_large(blocks))
    }

    /// Adds the bytes `[offset, offset + len)` (blocks of `block_size`)
    /// if the distinct blocks then stay within `max_blocks`; otherwise
    /// changes nothing and returns the count it would have made. The caller
    /// has checked that the range lies within the volume.
    fn try_add(
        &mut self,
        offset: u64,
        len: u64,
        block_size: u64,
        max_blocks: u64,
    ) -> std::result::Result<(), u64> {
        if len == 0 {
            return Ok(());
        }
        let (mut start, mut end) = (
            offset / block_size,
            offset.saturating_add(len).div_ceil(block_size),
        );
        // The ranges this one overlaps or touches: [lo, hi).
        let lo = self.ranges.partition_point(|&(_, e)| e < start);
        let hi = self.ranges.partition_point(|&(s, _)| s <= end);
        let mut merged = 0;
        for &(s, e) in self.ranges.get(lo..hi).unwrap_or_default() {
            start = start.min(s);
            end = end.max(e);
            merged += e - s;
        }
        let count = self.count - merged + (end - start);
        if count > max_blocks {
            return Err(count);
        }
        self.ranges.splice(lo..hi, [(start, end)]);
        self.count = count;
        Ok(())
    }
}

/// A group of writes applied all-or-nothing. Build it with
/// [`Transaction::write`] and [`Transaction::write_zeroes`], then
/// [`Transaction::commit`]. Extents may overlap; later ones win.
pub struct Transaction<'v> {
    vol: &'v Volume,
    extents: TxnExtents,
}

/// The extents of a transaction until its commit: what [`Transaction`]
/// holds, and what the C ABI's transaction handles hold (they outlive any
/// borrow of the volume). Validated as they are added: past the volume's
/// end, more distinct blocks than one atomic transaction holds
/// ([`VolumeError::TooLarge`]), or more kept in memory than
/// [`TXN_HELD_FACTOR`] times that ([`VolumeError::TransactionTooBig`]) is
/// refused and changes nothing. When the bound is reached, extents that
/// later ones overwrite whole are dropped first (they change nothing the
/// commit writes), so rewriting one range costs its size once, not once
/// per write (session 29's C ABI pass: 8,192 rewrites of one 64 KiB range
/// held 1 GiB), and adding an extent stays cheap.
#[derive(Default)]
pub struct TxnExtents {
    ops: Vec<TxOp>,
    /// Bytes added so far (every extent, as [`Transaction::len`] says).
    bytes: u64,
    /// Bytes kept: write data, plus [`TXN_EXTENT_COST`] per extent.
    held: u64,
    touched: TouchedBlocks,
}

/// How many times [`Volume::max_transaction_bytes`] a transaction may keep
/// in memory until its commit.
pub const TXN_HELD_FACTOR: u64 = 4;
/// What one extent of a transaction counts as kept, besides its data.
const TXN_EXTENT_COST: u64 = 64;

enum TxOp {
    Write(u64, Vec<u8>),
    Zero(u64, u64),
}

impl TxOp {
    fn range(&self) -> (u64, u64) {
        match self {
            TxOp::Write(off, d) => (*off, off + d.len() as u64),
            TxOp::Zero(off, len) => (*off, off + len),
        }
    }

    fn held(&self) -> u64 {
        TXN_EXTENT_COST
            + match self {
                TxOp::Write(_, d) => d.len() as u64,
                TxOp::Zero(..) => 0,
            }
    }
}

impl TxnExtents {
    /// Adds a write of `data` at `offset` (copied).
    pub fn write(&mut self, vol: &Volume, data: &[u8], offset: u64) -> Result<()> {
        let len = data.len() as u64;
        self.push(vol, offset, len, len, || TxOp::Write(offset, data.to_vec()))
    }

    /// Adds a zeroing of `[offset, offset + len)`.
    pub fn write_zeroes(&mut self, vol: &Volume, offset: u64, len: u64) -> Result<()> {
        self.push(vol, offset, len, 0, || TxOp::Zero(offset, len))
    }

    /// Bytes added so far.
    pub fn len(&self) -> u64 {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Adds the extent `[offset, offset + len)` that `op` makes, which
    /// keeps `data_len` bytes of data.
    fn push(
        &mut self,
        vol: &Volume,
        offset: u64,
        len: u64,
        data_len: u64,
        op: impl FnOnce() -> TxOp,
    ) -> Result<()> {
        vol.check(offset, len)?;
        let cost = TXN_EXTENT_COST + data_len;
        let max = TXN_HELD_FACTOR * vol.max_transaction_bytes() + TXN_EXTENT_COST;
        // Extents that later ones overwrite whole are dropped only when
        // the bound is reached (one pass, O(n log n)), so adding stays
        // cheap: a scan per add made 100k tiny extents take 6 s (session
        // 29's second pass).
        let mut plan = None;
        if self.held + cost > max {
            let (keep, held) = overwritten(&self.ops, (offset, offset + len));
            if held + cost > max {
                return Err(VolumeError::TransactionTooBig {
                    held: held + cost,
                    max,
                    max_extents: max / TXN_EXTENT_COST,
                });
            }
            plan = Some((keep, held));
        }
        // Checked last: on any error nothing has changed.
        self.touched.add(vol, offset, len)?;
        if let Some((keep, held)) = plan {
            self.drop_unkept(&keep, held);
        }
        self.ops.push(op());
        self.held += cost;
        self.bytes += len;
        Ok(())
    }

    /// Keeps the extents `keep` marks, which hold `held` bytes.
    fn drop_unkept(&mut self, keep: &[bool], held: u64) {
        let mut i = 0;
        self.ops.retain(|_| {
            i += 1;
            keep[i - 1]
        });
        self.held = held;
    }
}

/// Which of `ops` (applied in order, later ones winning) later extents and
/// `then` (the extent about to be added) leave a byte of; and what those keep.
/// Empty extents are not kept. One pass from the newest, with the union of
/// the ranges seen so far in a map of disjoint runs.
fn overwritten(ops: &[TxOp], then: (u64, u64)) -> (Vec<bool>, u64) {
    let mut cover: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    let add = |cover: &mut std::collections::BTreeMap<u64, u64>, mut a: u64, mut z: u64| {
        if let Some((&s, &e)) = cover.range(..=a).next_back() {
            if e >= a {
                a = s;
                z = z.max(e);
                cover.remove(&s);
            }
        }
        while let Some((&s, &e)) = cover.range(a..=z).next() {
            z = z.max(e);
            cover.remove(&s);
        }
        cover.insert(a, z);
    };
    if then.0 < then.1 {
        add(&mut cover, then.0, then.1);
    }
    let mut keep = vec![false; ops.len()];
    let mut held = 0;
    for (i, o) in ops.iter().enumerate().rev() {
        let (a, z) = o.range();
        let covered = a >= z || cover.range(..=a).next_back().is_some_and(|(_, &e)| e >= z);
        if !covered {
            keep[i] = true;
            held += o.held();
            add(&mut cover, a, z);
        }
    }
    (keep, held)
}

impl Transaction<'_> {
    /// Adds a write of `data` at `offset`. Fails with
    /// [`VolumeError::TooLarge`], adding nothing, if the transaction would
    /// then touch more blocks than one atomic transaction holds (or with
    /// [`VolumeError::TransactionTooBig`]: see [`TxnExtents`]); the
    /// transaction stays usable.
    pub fn write(&mut self, data: &[u8], offset: u64) -> Result<&mut Self> {
        self.extents.write(self.vol, data, offset)?;
        Ok(self)
    }

    /// Adds a zeroing of `[offset, offset+len)` (journaled like a write, so
    /// it counts against the same limit as [`Transaction::write`]).
    pub fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<&mut Self> {
        self.extents.write_zeroes(self.vol, offset, len)?;
        Ok(self)
    }

    /// Bytes added so far.
    pub fn len(&self) -> u64 {
        self.extents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.extents.is_empty()
    }

    /// Applies every extent atomically; with `flags.fua`, durably. (An
    /// extent that would have made the transaction too large was refused
    /// when it was added.)
    pub fn commit(self, flags: WriteFlags) -> Result<()> {
        self.vol.commit_extents(&self.extents, flags)
    }
}

/// Block runs `(start, end, state)` of `[first, last)`: `top`'s where it
/// has one, `base`'s elsewhere, same states coalesced. Both are sorted,
/// disjoint runs; `base` covers the range. Work and memory follow the runs,
/// not the blocks they cover.
fn cover_runs(
    first: u64,
    last: u64,
    base: Vec<(u64, u64, ExtentState)>,
    top: Vec<(u64, u64, ExtentState)>,
) -> Vec<(u64, u64, ExtentState)> {
    let mut out: Vec<(u64, u64, ExtentState)> = Vec::with_capacity(base.len() + 2 * top.len());
    let mut push = |a: u64, z: u64, st: ExtentState| push_run(&mut out, (a, z, st));
    let mut top = top.into_iter().peekable();
    let mut pos = first;
    for (a, z, st) in base {
        let z = z.min(last);
        pos = pos.max(a);
        while pos < z {
            match top.peek() {
                Some(&(_, tz, _)) if tz <= pos => {
                    top.next();
                }
                Some(&(ta, tz, tst)) if ta <= pos => {
                    let end = tz.min(z);
                    push(pos, end, tst);
                    pos = end;
                }
                Some(&(ta, _, _)) if ta < z => {
                    push(pos, ta, st);
                    pos = ta;
                }
                _ => {
                    push(pos, z, st);
                    pos = z;
                }
            }
        }
    }
    out
}

/// Sorted, disjoint runs of what pending direct writes `(start, end,
/// version, state)` (possibly overlapping) leave in each block: the newest
/// write covering it. Pending writes are few (one per direct write in
/// flight), so the quadratic look is cheap.
fn newest_runs(pending: Vec<(u64, u64, u64, ExtentState)>) -> Vec<(u64, u64, ExtentState)> {
    let mut cuts: Vec<u64> = pending.iter().flat_map(|p| [p.0, p.1]).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut out: Vec<(u64, u64, ExtentState)> = Vec::new();
    for w in cuts.windows(2) {
        let (a, z) = (w[0], w[1]);
        let newest = pending
            .iter()
            .filter(|p| p.0 <= a && z <= p.1)
            .max_by_key(|p| p.2);
        if let Some(p) = newest {
            push_run(&mut out, (a, z, p.3));
        }
    }
    out
}

/// Appends run `r` to `out`, merged into the last run when it continues it
/// with the same state; an empty run is dropped.
fn push_run(out: &mut Vec<(u64, u64, ExtentState)>, r: (u64, u64, ExtentState)) {
    if r.0 >= r.1 {
        return;
    }
    match out.last_mut() {
        Some(l) if l.2 == r.2 && l.1 == r.0 => l.1 = r.1,
        _ => out.push(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An intact superblock of a newer version or with unknown incompat
    /// features is a newer jbdev's volume, not damage: `check` reported it
    /// CORRUPT with exit 2, which says restore or reformat (session 23's
    /// adversarial pass).
    #[test]
    fn a_newer_format_is_not_reported_as_damage() {
        use crate::superblock::SuperblockError as E;
        for e in [E::UnsupportedVersion(2), E::UnsupportedFeatures(0x1)] {
            let v = bad_sb(e, "v.img");
            assert!(matches!(v, VolumeError::NewerFormat(_)), "{v:?}");
            assert_eq!(v.errno(), libc::EOPNOTSUPP);
            assert!(v.to_string().contains("newer jbdev"), "{v}");
        }
        let damaged = bad_sb(
            E::BadChecksum {
                stored: 1,
                computed: 2,
            },
            "v.img",
        );
        assert!(
            matches!(damaged, VolumeError::BadSuperblock(_)),
            "{damaged:?}"
        );
    }

    /// Per block, the state the runs give, for the model below.
    fn per_block(first: u64, last: u64, runs: &[(u64, u64, ExtentState)]) -> Vec<ExtentState> {
        let mut v = Vec::new();
        let mut pos = first;
        for &(a, z, st) in runs {
            assert_eq!(a, pos, "runs are consecutive: {runs:?}");
            assert!(a < z, "empty run: {runs:?}");
            v.extend(std::iter::repeat_n(st, (z - a) as usize));
            pos = z;
        }
        assert_eq!(pos, last, "runs cover the range: {runs:?}");
        for w in runs.windows(2) {
            assert_ne!(w[0].2, w[1].2, "uncoalesced runs: {runs:?}");
        }
        v
    }

    proptest::proptest! {
        /// Block status from runs agrees with a block-by-block model: a map
        /// entry beats pending direct writes, the newest pending write beats
        /// older ones, and home's holes read as zeroes.
        #[test]
        fn block_status_runs_match_a_per_block_model(
            first in 0u64..8,
            width in 1u64..64,
            holes in proptest::collection::vec((0u64..80, 1u64..12), 0..6),
            pending in proptest::collection::vec((0u64..80, 1u64..30, 0u64..20, proptest::bool::ANY), 0..5),
            points in proptest::collection::btree_map(0u64..80, proptest::bool::ANY, 0..12),
        ) {
            use ExtentState::{Data, Zero};
            let last = first + width;
            let st = |zero: bool| if zero { Zero } else { Data };
            // Sorted, disjoint holes, clipped to the range.
            let mut hole_runs: Vec<(u64, u64, ExtentState)> = Vec::new();
            let mut at = 0;
            for (gap, len) in holes {
                let a = at + gap % 8;
                let z = a + len;
                at = z + 1;
                let (a, z) = (a.max(first), z.min(last));
                if a < z {
                    hole_runs.push((a, z, Zero));
                }
            }
            let pending: Vec<(u64, u64, u64, ExtentState)> = pending
                .into_iter()
                .map(|(a, len, ver, zero)| (a.max(first), (a + len).min(last), ver, st(zero)))
                .filter(|p| p.0 < p.1)
                .collect();
            let point_runs: Vec<(u64, u64, ExtentState)> = points
                .iter()
                .filter(|(b, _)| (first..last).contains(*b))
                .map(|(&b, &zero)| (b, b + 1, st(zero)))
                .collect();
            let home = cover_runs(first, last, vec![(first, last, Data)], hole_runs.clone());
            let got = cover_runs(
                first,
                last,
                cover_runs(first, last, home, newest_runs(pending.clone())),
                point_runs,
            );
            let got = per_block(first, last, &got);
            for b in first..last {
                let want = if let Some(&zero) = points.get(&b) {
                    st(zero)
                } else if let Some(p) = pending
                    .iter()
                    .filter(|p| p.0 <= b && b < p.1)
                    .max_by_key(|p| p.2)
                {
                    // (equal versions do not happen: each write has its own)
                    p.3
                } else if hole_runs.iter().any(|h| h.0 <= b && b < h.1) {
                    Zero
                } else {
                    Data
                };
                proptest::prop_assert_eq!(got[(b - first) as usize], want, "block {}", b);
            }
        }
    }
    use jbdev_device::mem::MemDevice;

    /// Stale only when the log needs replay, both stamps are set, and the
    /// journal's is older; ahead when it is newer than any interrupted open
    /// explains (above the pending number, or more than one ahead for a
    /// volume without one); another volume's journal is neither.
    #[test]
    fn a_journal_mismatches_only_with_a_log_to_replay_and_a_stamp_no_open_explains() {
        use SessionMismatch::{Ahead, Stale};
        let (_, v) = mem_volume(1 << 20, 256 << 10);
        let mut sb = v.superblock().clone();
        let mut jsb = JournalSuperblock::new(4096, 64, sb.journal_uuid());
        let uuid = std::cell::Cell::new(sb.journal_uuid());
        let mut check = |vs, pending, js, dirty| {
            jsb.uuid = uuid.get();
            sb.journal_session = vs;
            sb.journal_session_pending = pending;
            jsb.session = js;
            jsb.start = if dirty { 1 } else { 0 };
            session_mismatch(&sb, &jsb)
        };
        let stale = Some(Stale {
            journal: 4,
            volume: 5,
        });
        assert_eq!(check(5, 5, 4, true), stale);
        assert_eq!(check(5, 0, 4, true), stale);
        assert_eq!(check(5, 5, 4, false), None, "clean: nothing to replay");
        assert_eq!(check(5, 5, 5, true), None);
        assert_eq!(check(5, 6, 6, true), None, "interrupted between its stamps");
        assert_eq!(
            check(5, 0, 6, true),
            None,
            "the same, before pending numbers"
        );
        assert_eq!(
            check(5, 6, 5, true),
            None,
            "interrupted before the journal's"
        );
        assert_eq!(
            check(5, 7, 6, true),
            None,
            "interrupted after the journal's, then again before it"
        );
        let ahead = |js| {
            Some(Ahead {
                journal: js,
                volume: 5,
            })
        };
        assert_eq!(check(5, 5, 6, true), ahead(6), "another copy used it");
        assert_eq!(check(5, 5, 7, true), ahead(7), "an older home");
        assert_eq!(check(5, 0, 7, true), ahead(7));
        assert_eq!(check(5, 6, 7, true), ahead(7));
        assert_eq!(check(5, 5, 7, false), None, "clean: nothing to replay");
        assert_eq!(check(0, 0, 3, true), None, "a volume never stamped");
        assert_eq!(
            check(5, 5, 0, true),
            None,
            "a journal written without stamps"
        );
        uuid.set(*b"another-volume!!");
        assert_eq!(check(5, 5, 4, true), None, "another volume's journal");
        assert_eq!(check(5, 5, 7, true), None, "another volume's journal");
        drop(v);
    }

    fn mem_volume(size: u64, journal: u64) -> (Arc<MemDevice>, Volume) {
        let dev = Arc::new(MemDevice::new(size + journal + 4096, 512));
        let mut f = FormatOptions::new(size);
        f.journal_bytes = Some(journal);
        Volume::format_device(dev.clone(), None, &f).unwrap();
        let v = Volume::open_device(dev.clone(), None, &OpenOptions::default()).unwrap();
        (dev, v)
    }

    #[test]
    fn touched_blocks_count_distinct_blocks_and_refuse_without_change() {
        let mut t = TouchedBlocks::default();
        assert_eq!(t.try_add(0, 0, 4096, 4), Ok(()));
        assert_eq!(t.count(), 0);
        // One byte on each side of a block boundary: two blocks.
        assert_eq!(t.try_add(4095, 2, 4096, 4), Ok(()));
        assert_eq!(t.count(), 2);
        // Overlapping and adjacent extents count once.
        assert_eq!(t.try_add(0, 8192, 4096, 4), Ok(()));
        assert_eq!(t.try_add(8192, 1, 4096, 4), Ok(()));
        assert_eq!(t.count(), 3);
        // A gap, then an extent bridging it: ranges merge.
        assert_eq!(t.try_add(5 * 4096, 10, 4096, 6), Ok(()));
        assert_eq!(t.count(), 4);
        assert_eq!(t.try_add(3 * 4096, 2 * 4096, 4096, 6), Ok(()));
        assert_eq!(t.count(), 6);
        assert_eq!(t.ranges, vec![(0, 6)]);
        // Over the limit: the count it would reach, and nothing added.
        assert_eq!(t.try_add(100 * 4096, 4096, 4096, 6), Err(7));
        assert_eq!(t.count(), 6);
        assert_eq!(t.ranges, vec![(0, 6)]);
        // Within what is already there: always fits.
        assert_eq!(t.try_add(4096, 4096, 4096, 6), Ok(()));
        assert_eq!(t.count(), 6);
    }

    /// A transaction refuses the extent that would make it too large when
    /// it is added (before, every extent was accepted and the commit
    /// failed, losing them all), counts a zeroing like a write, and stays
    /// usable after the refusal.
    #[test]
    fn a_transaction_refuses_the_extent_that_makes_it_too_large() {
        let (_dev, v) = mem_volume(8 << 20, 256 << 10);
        let max = v.max_transaction_blocks();
        let bs = u64::from(v.block_size());
        let mut tx = v.transaction();
        for b in 0..max {
            tx.write(b"x", b * bs).expect("within the limit");
        }
        // The same blocks again: no new block, accepted.
        tx.write(&vec![1u8; bs as usize], 0)
            .expect("a block already in");
        let err = tx.write(b"y", max * bs).err().expect("one block too many");
        assert!(
            matches!(err, VolumeError::TooLarge { blocks, max_blocks, .. }
                if blocks == max + 1 && max_blocks == max),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains(&v.max_transaction_bytes().to_string()),
            "{err}"
        );
        assert!(tx.write_zeroes(max * bs, 1).is_err(), "zeroes count too");
        tx.commit(WriteFlags::FUA)
            .expect("the accepted extents commit");
        let mut b = [0u8; 1];
        v.read_at(&mut b, (max - 1) * bs).unwrap();
        assert_eq!(&b, b"x");
        v.read_at(&mut b, max * bs).unwrap();
        assert_eq!(b, [0]);
        // A whole-volume zeroing in a transaction is refused at once.
        let mut tx = v.transaction();
        assert!(matches!(
            tx.write_zeroes(0, v.size()),
            Err(VolumeError::TooLarge { .. })
        ));
        assert!(tx.is_empty());
    }

    #[test]
    fn write_read_close_reopen() {
        let (dev, v) = mem_volume(1 << 20, 256 << 10);
        v.write_at(b"hello", 4093, WriteFlags::NONE).unwrap();
        v.write_at(&[7u8; 8192], 8192, WriteFlags::FUA).unwrap();
        let mut b = [0u8; 5];
        v.read_at(&mut b, 4093).unwrap();
        assert_eq!(&b, b"hello");
        v.close().unwrap();
        let v = Volume::open_device(dev.clone(), None, &OpenOptions::default()).unwrap();
        assert!(v.recovery_report().was_clean);
        v.read_at(&mut b, 4093).unwrap();
        assert_eq!(&b, b"hello");
        let mut c = vec![0u8; 8192];
        v.read_at(&mut c, 8192).unwrap();
        assert!(c.iter().all(|&x| x == 7));
    }

    /// A bug that panics inside a commit aborts the volume: the writer
    /// gets an error, later writes fail, reads still work, and close
    /// returns (before, the transaction stayed in flight and close waited
    /// for it for ever).
    #[test]
    fn a_panic_in_a_commit_aborts_the_volume_instead_of_hanging() {
        let (_dev, v) = mem_volume(1 << 20, 256 << 10);
        v.write_at(&[1u8; 4096], 0, WriteFlags::FUA).unwrap();
        v.engine
            .panic_next_commit
            .store(true, std::sync::atomic::Ordering::Release);
        let err = v
            .write_at(&[2u8; 4096], 4096, WriteFlags::FUA)
            .expect_err("the commit panicked");
        assert!(
            err.to_string().contains("panicked"),
            "the error names the panic: {err}"
        );
        assert!(matches!(
            v.write_at(&[3u8; 4096], 8192, WriteFlags::FUA),
            Err(VolumeError::Aborted { .. })
        ));
        let mut b = vec![0u8; 4096];
        v.read_at(&mut b, 0).unwrap();
        assert!(b.iter().all(|&x| x == 1));
        // Returns (with the abort as its error or not): no hang.
        let _ = v.close();
    }

    /// A panic in a checkpoint round aborts the volume: writers waiting
    /// for log space get an error instead of waiting for ever for a
    /// checkpoint thread that is gone.
    #[test]
    fn a_panic_in_a_checkpoint_aborts_the_volume_instead_of_hanging() {
        let (_dev, v) = mem_volume(1 << 20, 128 << 10);
        v.engine
            .panic_next_checkpoint
            .store(true, std::sync::atomic::Ordering::Release);
        // 32 journal blocks: the log fills within a few dozen writes.
        let failed = (0..2000u64).find_map(|i| {
            v.write_at(&[i as u8; 4096], (i % 200) * 4096, WriteFlags::FUA)
                .err()
        });
        match failed {
            Some(VolumeError::Aborted { reason: why, .. }) => {
                assert!(why.contains("checkpoint panicked"), "{why}")
            }
            other => panic!("expected the abort, got {other:?}"),
        }
        let _ = v.close();
    }

    /// A volume with its journal in the file `j.jnl` beside `v.img` in
    /// `dir`, opened by path (so its journal file is watched), whose first
    /// checkpoint round panics: acknowledged writes then stay in the
    /// journal only, and nothing salvages them. (volume, home, journal,
    /// the value each of blocks 0..16 last acknowledged, and the block and
    /// value of the write that failed: it may or may not have landed.)
    #[allow(clippy::type_complexity)]
    fn journal_only_writes(dir: &Path) -> (Volume, PathBuf, PathBuf, Vec<u8>, (usize, u8)) {
        let (home, jnl) = (dir.join("v.img"), dir.join("j.jnl"));
        let mut f = FormatOptions::new(8 << 20);
        f.journal_bytes = Some(2 << 20);
        f.journal = JournalPlacement::External(jnl.clone());
        Volume::create(&home, &f, &OpenOptions::default())
            .unwrap()
            .close()
            .unwrap();
        let v = Volume::open(&home, &OpenOptions::default()).unwrap();
        v.engine
            .panic_next_checkpoint
            .store(true, std::sync::atomic::Ordering::Release);
        // FUA writes until one fails: the checkpoint's first round (its
        // interval, or the log filling up) panics and aborts the volume.
        let mut acked = vec![0u8; 16];
        let mut failed = (0, 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        for i in 0u64.. {
            let value = (i % 250) as u8 + 1;
            if v.write_at(&[value; 4096], (i % 16) * 4096, WriteFlags::FUA)
                .is_err()
            {
                failed = ((i % 16) as usize, value);
                break;
            }
            acked[(i % 16) as usize] = value;
            assert!(std::time::Instant::now() < deadline, "no abort within 60 s");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!v.stats().salvage_complete);
        (v, home, jnl, acked, failed)
    }

    /// Asserts that blocks 0..16 of `v` read as `acked` (0: never
    /// written), or as the `failed` write.
    fn reads_acked(v: &Volume, acked: &[u8], failed: (usize, u8)) {
        for (b, &want) in acked.iter().enumerate() {
            let mut back = vec![0u8; 4096];
            v.read_at(&mut back, b as u64 * 4096).unwrap();
            let is = |x: u8| back.iter().all(|&y| y == x);
            assert!(
                is(want) || (b == failed.0 && is(failed.1)),
                "block {b}: want {want}, got {}",
                back[0]
            );
        }
    }

    /// A journal file deleted while acknowledged writes are only in it, and
    /// the salvage cannot run (here: the checkpoint thread panicked): the
    /// close saves the journal back to its path before its last descriptor
    /// goes, says so, and the next open replays every acknowledged write.
    /// Before, the close repeated the abort's advice to copy the file back
    /// through /proc "before the volume is closed" — too late by then —
    /// and the writes were lost with the descriptor.
    #[test]
    fn a_deleted_journal_is_saved_back_at_close_when_the_salvage_could_not_run() {
        let dir = tempfile::tempdir().unwrap();
        let (v, home, jnl, acked, failed) = journal_only_writes(dir.path());
        std::fs::remove_file(&jnl).unwrap();
        let err = v.close().unwrap_err();
        assert!(matches!(err, VolumeError::JournalFileLost(_)), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("checkpoint panicked"), "{msg}");
        assert!(
            msg.contains(&format!(
                "Its content was saved back to {} before the close",
                jnl.display()
            )),
            "{msg}"
        );
        assert!(!msg.contains("/proc"), "{msg}");
        let v = Volume::open(&home, &OpenOptions::default()).unwrap();
        assert!(!v.recovery_report().was_clean);
        reads_acked(&v, &acked, failed);
        v.close().unwrap();
    }

    /// The same, with another file at the journal's path by the time of the
    /// close: that file is left alone, the journal goes beside it, and an
    /// open given the saved file replays it.
    #[test]
    fn a_deleted_journal_is_saved_beside_a_file_that_took_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let (v, home, jnl, acked, failed) = journal_only_writes(dir.path());
        std::fs::remove_file(&jnl).unwrap();
        std::fs::write(&jnl, b"someone else's").unwrap();
        let msg = v.close().unwrap_err().to_string();
        let saved = PathBuf::from(format!("{}.rescued-{}", jnl.display(), std::process::id()));
        assert!(
            msg.contains(&format!("`--journal {}`", saved.display())),
            "{msg}"
        );
        assert_eq!(std::fs::read(&jnl).unwrap(), b"someone else's");
        let opts = OpenOptions {
            journal_path: Some(saved),
            ..OpenOptions::default()
        };
        let v = Volume::open(&home, &opts).unwrap();
        reads_acked(&v, &acked, failed);
        v.close().unwrap();
    }

    #[test]
    fn many_commits_wrap_the_log_and_checkpoint() {
        let (dev, v) = mem_volume(1 << 20, 128 << 10);
        for i in 0..400u64 {
            let data = vec![(i % 251) as u8; 4096];
            v.write_at(&data, (i % 200) * 4096, WriteFlags::FUA)
                .unwrap();
        }
        let s = v.stats();
        assert!(s.commits >= 100, "{s:?}");
        assert!(s.checkpoints > 0, "{s:?}");
        drop(v);
        let v = Volume::open_device(dev, None, &OpenOptions::default()).unwrap();
        for i in 200..400u64 {
            let mut b = vec![0u8; 4096];
            v.read_at(&mut b, (i % 200) * 4096).unwrap();
            assert!(b.iter().all(|&x| x == (i % 251) as u8), "block {}", i % 200);
        }
    }
}
