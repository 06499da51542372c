//! Shared harness of the volume's crash and concurrency tests.
//!
//! # The durability contract these tests check
//!
//! * **Visibility.** Once `write_at` (or a transaction commit, trim,
//!   write_zeroes) returns, every reader sees the data.
//! * **Durability.** A write is durable once a FUA write (or FUA commit)
//!   returns, or once a `flush()` that was *called after the write returned*
//!   has returned. A successful `close()` makes everything durable.
//! * **Atomicity.** Every journaled single write (below
//!   `direct_write_threshold`, at most `max_transaction_bytes()`) and every
//!   transaction up to `max_transaction_bytes()` is all-or-nothing across a
//!   crash.
//! * **Order.** Journaled writes of one thread persist in order: if a later
//!   journaled write of a thread survived a crash, every earlier journaled
//!   write of that thread survived too (commits are ordered).
//! * **Nothing else changes.** Bytes nobody wrote keep their content.
//! * **Non-atomic ops.** Direct writes (aligned, ≥ `direct_write_threshold`),
//!   trims and large write_zeroes are, per 512-byte sector, old-or-new until
//!   they are durable.
//!
//! # How the model works
//!
//! Every thread owns a disjoint, block-aligned region, so its history is
//! sequential and exact. Every written 512-byte sector carries a *stamp*
//! (write id, volume sector index, checksum) so a recovered sector tells
//! which write it came from. A test-side logical clock orders "write
//! returned" before "flush called", which is what decides durability across
//! threads. After recovery, a thread's region must equal the state after
//! some prefix of its journaled ops that contains every durable op
//! ([`check_prefix`]), or, for workloads with non-atomic ops, every sector
//! must hold a value no older than its last durable write ([`check_sectors`]).
#![allow(dead_code)]

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use jbdev_device::fault::FaultDevice;
use jbdev_device::mem::MemDevice;
use jbdev_device::BlockDevice;
use jbdev_volume::{FormatOptions, OpenOptions, Volume, WriteFlags};

/// Sector size of the test devices: tearing happens at this granularity.
pub const SECTOR: usize = 512;
/// Volume block size used by every test.
pub const BLOCK: u64 = 4096;
/// Write id of the initial content every test volume is filled with.
pub const INITIAL_ID: u64 = 0;

// ---------------------------------------------------------------- stamps

/// Offset of the checksum inside a stamped sector.
const STAMP_CRC_AT: usize = SECTOR - 4;

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The full 512-byte content write `write_id` gives volume sector `sector`:
/// id (LE u64), sector index (LE u64), pseudo-random filler, crc32c of the rest.
pub fn stamp(write_id: u64, sector: u64) -> [u8; SECTOR] {
    let mut out = [0u8; SECTOR];
    out[0..8].copy_from_slice(&write_id.to_le_bytes());
    out[8..16].copy_from_slice(&sector.to_le_bytes());
    let mut st = write_id.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ sector;
    for chunk in out[16..STAMP_CRC_AT].chunks_mut(8) {
        let v = splitmix(&mut st).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    let crc = crc32c::crc32c(&out[..STAMP_CRC_AT]);
    out[STAMP_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    out
}

/// The bytes write `write_id` puts at `[offset, offset + len)`: the matching
/// slice of the stamps of every sector it touches.
pub fn stamped(write_id: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let end = offset + len as u64;
    let mut pos = offset;
    while pos < end {
        let sector = pos / SECTOR as u64;
        let sector_start = sector * SECTOR as u64;
        let sector_end = (sector_start + SECTOR as u64).min(end);
        let s = stamp(write_id, sector);
        let from = (pos - sector_start) as usize;
        let to = (sector_end - sector_start) as usize;
        let dst = (pos - offset) as usize;
        buf[dst..dst + (to - from)].copy_from_slice(&s[from..to]);
        pos = sector_end;
    }
    buf
}

/// A whole stamped sector's write id, if `bytes` is exactly the stamp of
/// some write for volume sector `sector`.
pub fn stamp_id(bytes: &[u8], sector: u64) -> Option<u64> {
    if bytes.len() != SECTOR {
        return None;
    }
    let crc = u32::from_le_bytes(bytes[STAMP_CRC_AT..].try_into().ok()?);
    if crc != crc32c::crc32c(&bytes[..STAMP_CRC_AT]) {
        return None;
    }
    let id = u64::from_le_bytes(bytes[0..8].try_into().ok()?);
    let sec = u64::from_le_bytes(bytes[8..16].try_into().ok()?);
    (sec == sector).then_some(id)
}

/// Write ids are `(thread + 1) << 32 | (seq + 1)`; shown as `t<thread>#<seq>`.
pub fn id_name(id: u64) -> String {
    match id {
        INITIAL_ID => "initial".into(),
        _ if id >> 32 == 0 || id >> 32 > 0xffff => format!("{id:#x}"),
        _ => format!("t{}#{}", (id >> 32) - 1, (id & 0xffff_ffff) - 1),
    }
}

/// A short human description of a sector's content, for failure messages.
pub fn describe_sector(bytes: &[u8], sector: u64) -> String {
    if bytes.iter().all(|&b| b == 0) {
        return "zeroes".into();
    }
    if let Some(id) = stamp_id(bytes, sector) {
        return format!("whole stamp of write {}", id_name(id));
    }
    // A whole stamp of another sector: a block landed in the wrong place.
    let head = u64::from_le_bytes(bytes[0..8].try_into().unwrap_or([0; 8]));
    let head_sector = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or([0; 8]));
    if stamp_id(bytes, head_sector).is_some() {
        return format!(
            "MISPLACED whole stamp of write {} for sector {head_sector}",
            id_name(head)
        );
    }
    // A sector written partly by sub-sector writes (or torn data from
    // elsewhere): its first bytes name the write that put the head there.
    format!("mixed content (head from write {})", id_name(head))
}

// ---------------------------------------------------------------- clock

/// The harness's logical clock: orders "a write returned" before "a flush
/// was called" across threads. SeqCst, so tick order is a total order
/// consistent with every thread's program order.
#[derive(Default)]
pub struct Clock(AtomicU64);

impl Clock {
    pub fn tick(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
}

// ---------------------------------------------------------------- history

/// What an op was, for durability and atomicity rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Journaled single write (atomic).
    Write,
    /// Journaled write_zeroes (atomic: small).
    Zeroes,
    /// Multi-extent transaction (atomic).
    Txn,
    /// Direct write (≥ threshold): per-sector old-or-new.
    Direct,
    /// Trim: per-sector old-or-new.
    Trim,
    /// Large write_zeroes: per-sector old-or-new.
    BigZeroes,
}

impl OpKind {
    pub fn atomic(self) -> bool {
        matches!(self, Self::Write | Self::Zeroes | Self::Txn)
    }
}

/// One content-changing op of a thread, as the model sees it.
#[derive(Clone, Debug)]
pub struct Op {
    pub id: u64,
    pub kind: OpKind,
    pub fua: bool,
    /// `(volume offset, bytes the op puts there)`, in application order.
    pub extents: Vec<(u64, Vec<u8>)>,
    /// Clock tick taken right after the call returned Ok; `None` if it failed.
    pub ack: Option<u64>,
}

impl Op {
    pub fn summary(&self) -> String {
        let ext: Vec<String> = self
            .extents
            .iter()
            .map(|(off, d)| format!("[{off}+{}]", d.len()))
            .collect();
        format!(
            "op {} {:?}{} {} {}",
            id_name(self.id),
            self.kind,
            if self.fua { " FUA" } else { "" },
            ext.join(""),
            match self.ack {
                Some(t) => format!("acked@{t}"),
                None => "FAILED".into(),
            }
        )
    }
}

/// A `flush()` (or `close()`) call: clock ticks right before the call and
/// right after it returned Ok.
#[derive(Clone, Copy, Debug)]
pub struct FlushRec {
    pub start: u64,
    pub ack: Option<u64>,
}

/// The latest start tick of a successful flush: every op acknowledged before
/// it is durable.
pub fn durable_horizon(flushes: &[FlushRec]) -> u64 {
    flushes
        .iter()
        .filter(|f| f.ack.is_some())
        .map(|f| f.start)
        .max()
        .unwrap_or(0)
}

/// True if the contract makes `op` durable.
pub fn is_durable(op: &Op, horizon: u64) -> bool {
    match op.ack {
        Some(t) => op.fua || t < horizon,
        None => false,
    }
}

/// A thread's region and history.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub thread: usize,
    pub lo: u64,
    pub hi: u64,
    pub ops: Vec<Op>,
}

impl History {
    /// Number of leading ops every recovery must contain: up to the last
    /// durable op (order makes every earlier journaled op durable too).
    pub fn floor(&self, horizon: u64) -> usize {
        self.ops
            .iter()
            .rposition(|op| is_durable(op, horizon))
            .map_or(0, |i| i + 1)
    }

    pub fn touches(&self, off: u64) -> bool {
        off >= self.lo && off < self.hi
    }
}

fn apply_op(state: &mut [u8], base_off: u64, op: &Op, mut touched: impl FnMut(usize)) {
    for (off, data) in &op.extents {
        let at = (off - base_off) as usize;
        state[at..at + data.len()].copy_from_slice(data);
        if data.is_empty() {
            continue;
        }
        let first = at / SECTOR;
        let last = (at + data.len() - 1) / SECTOR;
        for s in first..=last {
            touched(s);
        }
    }
}

fn sector_hash(b: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

/// Hash of a whole image (to skip verifying the same crash image twice).
pub fn image_hash(b: &[u8]) -> u64 {
    sector_hash(b)
}

/// Checks that `recovered[h.lo..h.hi]` equals the state after some prefix of
/// `h.ops` of length at least `floor`. Returns the prefix length found.
pub fn check_prefix(
    base: &[u8],
    h: &History,
    floor: usize,
    recovered: &[u8],
) -> Result<usize, String> {
    let (lo, hi) = (h.lo as usize, h.hi as usize);
    let mut state = base[lo..hi].to_vec();
    let got = &recovered[lo..hi];
    let n = state.len() / SECTOR;
    let got_hash: Vec<u64> = got.chunks(SECTOR).map(sector_hash).collect();
    let mut exp_hash: Vec<u64> = state.chunks(SECTOR).map(sector_hash).collect();
    let mut mismatches = (0..n).filter(|&s| got_hash[s] != exp_hash[s]).count();
    let mut best: (usize, usize) = (usize::MAX, 0); // (mismatches, k) for k >= floor
    let mut valid_below_floor = Vec::new();
    for k in 0..=h.ops.len() {
        if k > 0 {
            let mut touched = Vec::new();
            apply_op(&mut state, h.lo, &h.ops[k - 1], |s| touched.push(s));
            touched.sort_unstable();
            touched.dedup();
            for s in touched {
                let was = exp_hash[s] != got_hash[s];
                exp_hash[s] = sector_hash(&state[s * SECTOR..(s + 1) * SECTOR]);
                let is = exp_hash[s] != got_hash[s];
                match (was, is) {
                    (true, false) => mismatches -= 1,
                    (false, true) => mismatches += 1,
                    _ => {}
                }
            }
        }
        if mismatches == 0 && state == got {
            if k >= floor {
                return Ok(k);
            }
            valid_below_floor.push(k);
        }
        if k >= floor && mismatches < best.0 {
            best = (mismatches, k);
        }
    }
    // Failure: describe the closest allowed prefix.
    let k = best.1;
    let mut state = base[lo..hi].to_vec();
    for op in &h.ops[..k] {
        apply_op(&mut state, h.lo, op, |_| {});
    }
    let mut msg = format!(
        "thread {} region [{lo}, {hi}): recovered content is not the state after any \
         allowed prefix of its {} ops (durable floor {floor}); prefixes matching below the \
         floor: {valid_below_floor:?}; closest allowed prefix k={k} differs in {} sectors:\n",
        h.thread,
        h.ops.len(),
        best.0
    );
    let mut shown = 0;
    for s in 0..n {
        let (e, g) = (
            &state[s * SECTOR..(s + 1) * SECTOR],
            &got[s * SECTOR..(s + 1) * SECTOR],
        );
        if e != g && shown < 12 {
            let sec = (lo / SECTOR + s) as u64;
            msg += &format!(
                "  sector {sec}: expected {}, got {}\n",
                describe_sector(e, sec),
                describe_sector(g, sec)
            );
            shown += 1;
        }
    }
    msg += "ops:\n";
    for (i, op) in h.ops.iter().enumerate() {
        msg += &format!("  #{i} {}\n", op.summary());
    }
    Err(msg)
}

/// Per-sector check for workloads with non-atomic ops: every sector of the
/// region holds the value after some op touching it (or the initial value)
/// that is not older than the last durable op touching it.
pub fn check_sectors(
    base: &[u8],
    h: &History,
    horizon: u64,
    recovered: &[u8],
) -> Result<(), String> {
    let (lo, hi) = (h.lo as usize, h.hi as usize);
    let n = (hi - lo) / SECTOR;
    let mut state = base[lo..hi].to_vec();
    // Per sector: the allowed values, oldest first, each with the op index
    // (usize::MAX = initial content).
    let mut allowed: Vec<Vec<(usize, Vec<u8>)>> = (0..n)
        .map(|s| vec![(usize::MAX, state[s * SECTOR..(s + 1) * SECTOR].to_vec())])
        .collect();
    for (i, op) in h.ops.iter().enumerate() {
        let mut touched = Vec::new();
        apply_op(&mut state, h.lo, op, |s| touched.push(s));
        touched.sort_unstable();
        touched.dedup();
        let durable = is_durable(op, horizon);
        for s in touched {
            let v = state[s * SECTOR..(s + 1) * SECTOR].to_vec();
            if durable {
                allowed[s].clear();
            }
            allowed[s].push((i, v));
        }
    }
    let got = &recovered[lo..hi];
    let mut msg = String::new();
    let mut bad = 0;
    for (s, allowed_s) in allowed.iter().enumerate() {
        let g = &got[s * SECTOR..(s + 1) * SECTOR];
        if allowed_s.iter().any(|(_, v)| v == g) {
            continue;
        }
        bad += 1;
        if bad <= 12 {
            let sec = (lo / SECTOR + s) as u64;
            let from: Vec<String> = allowed_s
                .iter()
                .map(|(i, v)| {
                    let who = if *i == usize::MAX {
                        "initial".to_string()
                    } else {
                        format!("#{i}")
                    };
                    format!("{who}={}", describe_sector(v, sec))
                })
                .collect();
            msg += &format!(
                "  sector {sec}: got {}, allowed {}\n",
                describe_sector(g, sec),
                from.join(" | ")
            );
        }
    }
    if bad == 0 {
        return Ok(());
    }
    let mut out = format!(
        "thread {} region [{lo}, {hi}): {bad} sectors hold a value older than their last \
         durable write or never written there:\n{msg}ops:\n",
        h.thread
    );
    for (i, op) in h.ops.iter().enumerate() {
        out += &format!(
            "  #{i} {}{}\n",
            op.summary(),
            if is_durable(op, horizon) {
                " (durable)"
            } else {
                ""
            }
        );
    }
    Err(out)
}

/// Every byte outside the threads' regions must equal the initial content.
pub fn check_untouched(
    base: &[u8],
    regions: &[(u64, u64)],
    recovered: &[u8],
) -> Result<(), String> {
    let mut regions = regions.to_vec();
    regions.sort_unstable();
    let mut pos = 0u64;
    let end = base.len().min(recovered.len()) as u64;
    let mut gaps = Vec::new();
    for &(lo, hi) in &regions {
        if lo > pos {
            gaps.push((pos, lo));
        }
        pos = pos.max(hi);
    }
    if pos < end {
        gaps.push((pos, end));
    }
    for (lo, hi) in gaps {
        let (a, b) = (
            &base[lo as usize..hi as usize],
            &recovered[lo as usize..hi as usize],
        );
        if a != b {
            let at = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0) + lo as usize;
            let sec = (at / SECTOR) as u64;
            let s = sec as usize * SECTOR;
            return Err(format!(
                "untouched byte {at} (sector {sec}) changed: expected {}, got {}",
                describe_sector(&base[s..s + SECTOR], sec),
                describe_sector(&recovered[s..s + SECTOR], sec)
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- volumes

/// Sizes of a test volume.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub data_bytes: u64,
    pub journal_bytes: u64,
}

impl Geometry {
    /// Bytes of the device holding volume superblock, internal journal and
    /// data, with slack for whatever metadata the engine keeps.
    pub fn device_bytes(&self) -> u64 {
        self.data_bytes + self.journal_bytes + 64 * 1024
    }

    pub fn format_options(&self) -> FormatOptions {
        let mut f = FormatOptions::new(self.data_bytes);
        f.journal_bytes = Some(self.journal_bytes);
        f.block_size = BLOCK as u32;
        f
    }
}

/// Options for a verifying open: no batching delay.
pub fn verify_open_options() -> OpenOptions {
    OpenOptions {
        batch_policy: jbdev_volume::BatchPolicy::None,
        ..OpenOptions::default()
    }
}

/// Options for a test that wants no background commits or checkpoints
/// unless it causes them, and no batching delay.
pub fn quiet_open_options() -> OpenOptions {
    OpenOptions {
        commit_interval: std::time::Duration::from_secs(3600),
        checkpoint_interval: std::time::Duration::from_secs(3600),
        ..verify_open_options()
    }
}

/// A fault device of 512-byte sectors holding a freshly formatted volume
/// of `data` bytes with an internal journal of `journal` bytes.
pub fn formatted_fault_device(data: u64, journal: u64) -> Arc<FaultDevice> {
    let dev = Arc::new(FaultDevice::new(data + journal + 64 * 1024, SECTOR as u32));
    let mut f = FormatOptions::new(data);
    f.journal_bytes = Some(journal);
    Volume::format_device(dev.clone() as Arc<dyn BlockDevice>, None, &f).expect("format");
    dev
}

/// The log region of an internal journal of `journal` bytes with 4 KiB
/// blocks, as [`formatted_fault_device`] lays it out (from block 1).
pub fn internal_journal_region(
    dev: Arc<dyn BlockDevice>,
    journal: u64,
) -> jbdev_volume::journal::JournalRegion {
    jbdev_volume::journal::JournalRegion::new(
        dev,
        Arc::new(jbdev_device::FlushCoalescer::new()),
        BLOCK,
        BLOCK as u32,
        (journal / BLOCK) as u32,
    )
    .expect("journal region")
}

/// [`quiet_open_options`] where writes of `bytes` or more go straight home.
pub fn direct_from(bytes: u64) -> OpenOptions {
    OpenOptions {
        direct_write_threshold: bytes,
        ..quiet_open_options()
    }
}

/// `len` bytes of a pattern that differs for each `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// Formats a device of `geo`, fills the whole volume with stamps of
/// [`INITIAL_ID`] through the volume, closes it and returns the device
/// image and the volume content.
pub fn base_image(geo: Geometry) -> (Vec<u8>, Vec<u8>) {
    let dev = Arc::new(MemDevice::new(geo.device_bytes(), SECTOR as u32));
    Volume::format_device(dev.clone(), None, &geo.format_options()).expect("format");
    let vol = Volume::open_device(dev.clone(), None, &verify_open_options()).expect("open");
    let size = vol.size();
    assert!(size >= geo.data_bytes, "volume smaller than asked for");
    fill_initial(&vol, 64 * 1024);
    vol.close().expect("close");
    let image = dev.image();
    let vol = Volume::open_device(
        Arc::new(MemDevice::from_image(image.clone(), SECTOR as u32)),
        None,
        &verify_open_options(),
    )
    .expect("reopen base");
    let content = read_all(&vol).expect("read base");
    assert_eq!(
        content,
        stamped(INITIAL_ID, 0, size as usize),
        "the base image does not read back as written (engine bug outside crashes)"
    );
    drop(vol);
    (image, content)
}

/// Writes the stamps of [`INITIAL_ID`] over the whole volume, in journaled
/// writes of at most `max_chunk` bytes (half a transaction at most).
pub fn fill_initial(vol: &Volume, max_chunk: u64) {
    let size = vol.size();
    let chunk = (vol.max_transaction_bytes() / 2).clamp(BLOCK, max_chunk);
    let mut off = 0;
    while off < size {
        let len = chunk.min(size - off);
        vol.write_at(
            &stamped(INITIAL_ID, off, len as usize),
            off,
            WriteFlags::NONE,
        )
        .expect("fill");
        off += len;
    }
}

/// Reads the whole volume.
pub fn read_all(vol: &Volume) -> jbdev_volume::Result<Vec<u8>> {
    let mut buf = vec![0u8; vol.size() as usize];
    vol.read_at(&mut buf, 0)?;
    Ok(buf)
}

/// Recovers `image` on a fresh [`FaultDevice`] and returns the volume
/// content and the number of mutating device ops recovery needed.
pub fn recover(image: Vec<u8>, opts: &OpenOptions) -> Result<(Vec<u8>, u64), String> {
    let dev = Arc::new(FaultDevice::from_image(image, SECTOR as u32));
    let vol = Volume::open_device(dev.clone(), None, opts)
        .map_err(|e| format!("recovery (open) failed: {e}"))?;
    let ops = dev.ops();
    let content = read_all(&vol).map_err(|e| format!("read after recovery failed: {e}"))?;
    drop(vol);
    Ok((content, ops))
}

/// Recovers `image` on a [`FaultDevice`] that loses power after
/// `crash_after` mutating ops, and returns that device (so the caller can
/// take crash images of the interrupted recovery).
pub fn recover_interrupted(
    image: Vec<u8>,
    crash_after: u64,
    opts: &OpenOptions,
) -> Arc<FaultDevice> {
    let dev = Arc::new(FaultDevice::from_image(image, SECTOR as u32));
    dev.crash_after_ops(crash_after);
    if let Ok(vol) = Volume::open_device(dev.clone(), None, opts) {
        // Recovery finished before the cut: whatever the open left running
        // meets the power cut now.
        dev.cut_power();
        drop(vol);
    }
    dev
}

/// Runs `f` on its own thread and panics with `what` if it does not finish
/// within `limit` (an engine hang must fail the test, not stall CI).
pub fn with_watchdog<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("crash-case".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .expect("spawn");
    match rx.recv_timeout(limit) {
        Ok(v) => {
            let _ = handle.join();
            v
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => panic!("{what}: worker ended without a result"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: did not finish within {limit:?} (engine hang?)")
        }
    }
}

/// Reads an env var as a number.
pub fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = if let Some(hex) = v.strip_prefix("0x") {
        u64::from_str_radix(hex, 16)
    } else {
        v.parse()
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

/// Derives the seed of case `i` of a test from the test's base seed.
pub fn case_seed(base: u64, i: u64) -> u64 {
    let mut s = base ^ i.wrapping_mul(0xA24B_AED4_963E_E407);
    splitmix(&mut s)
}

/// The write flags for `fua`.
pub fn flags(fua: bool) -> WriteFlags {
    if fua {
        WriteFlags::FUA
    } else {
        WriteFlags::NONE
    }
}

/// Returns the device as the trait object the volume API takes.
pub fn as_dev(d: &Arc<FaultDevice>) -> Arc<dyn BlockDevice> {
    d.clone()
}

/// A volume of `data` bytes formatted on a fault device with its journal
/// of `journal` bytes on a second one (external): (home, journal).
pub fn external_journal_devices(data: u64, journal: u64) -> (Arc<FaultDevice>, Arc<FaultDevice>) {
    let home = Arc::new(FaultDevice::new(data + 4096, SECTOR as u32));
    let jnl = Arc::new(FaultDevice::new(journal, SECTOR as u32));
    format_external(data, journal, home, jnl)
}

/// [`external_journal_devices`] on one power supply (`power`): a power cut
/// stops both at the same instant.
pub fn external_journal_devices_in(
    data: u64,
    journal: u64,
    power: Arc<jbdev_device::fault::PowerDomain>,
) -> (Arc<FaultDevice>, Arc<FaultDevice>) {
    let home = Arc::new(FaultDevice::new_in_domain(
        data + 4096,
        SECTOR as u32,
        power.clone(),
    ));
    let jnl = Arc::new(FaultDevice::new_in_domain(journal, SECTOR as u32, power));
    format_external(data, journal, home, jnl)
}

/// Formats a volume of `data` bytes on `home` with its `journal`-byte
/// journal on `jnl`.
fn format_external(
    data: u64,
    journal: u64,
    home: Arc<FaultDevice>,
    jnl: Arc<FaultDevice>,
) -> (Arc<FaultDevice>, Arc<FaultDevice>) {
    let mut f = FormatOptions::new(data);
    f.journal_bytes = Some(journal);
    f.journal = jbdev_volume::JournalPlacement::External("/nonexistent/j".into());
    Volume::format_device(as_dev(&home), Some(as_dev(&jnl)), &f).expect("format");
    (home, jnl)
}

/// Asserts that `v` reads every block of `blocks` (4 KiB block number,
/// data) as given; `when` names the moment in the failure message.
pub fn assert_reads(v: &Volume, blocks: &[(u64, Vec<u8>)], when: &str) {
    for (b, data) in blocks {
        let mut back = vec![0u8; data.len()];
        v.read_at(&mut back, b * 4096).unwrap();
        assert!(&back == data, "block {b} {when}: not what was acknowledged");
    }
}
