//! A fault-injecting in-memory device for crash tests.
//!
//! # Model
//!
//! The device keeps two images:
//!
//! * the **live** image — what reads return now; every write is applied to it
//!   as soon as it completes;
//! * the **durable** image — what is on stable media; it only changes when a
//!   [`BlockDevice::flush`] returns, and then it takes in every write that
//!   completed before the flush (the writes are replayed in issue order).
//!
//! Between flushes, completed writes sit in a list of *unflushed writes*
//! (a `write_zeroes` is an unflushed write of zeroes). A power cut loses any
//! subset of them, in any order, and may tear a multi-sector write at sector
//! granularity: [`FaultDevice::crash_image`] walks the unflushed writes in
//! issue order and, from a seed, drops each one, applies it whole, or applies
//! a random subset of its sectors. Applying a later write while dropping an
//! earlier overlapping one is how reordering shows up. The same device state
//! and the same seed always give the same image.
//!
//! Invariant (tested): for every sector, a crash image holds either the
//! durable content or the content some unflushed write put in that sector.
//!
//! # Injection
//!
//! * [`FaultDevice::crash_after_ops`] / [`FaultDevice::cut_power`]: after a
//!   power cut every operation, reads included, fails with
//!   [`DeviceError::PowerCut`]. The mutating operation that meets the power
//!   cut does not reach the live image, but a write is kept in the unflushed
//!   list as *in flight*: a real disk may or may not have written some of it,
//!   so a crash image may contain it (whole or torn) — the caller never got a
//!   success for it, so it must not rely on it either way.
//! * [`FaultDevice::fail_op`]: one mutating operation fails with
//!   [`DeviceError::Injected`] without any effect; the device keeps working
//!   (for "sticky error" tests of the layers above). A failed flush has no
//!   effect either: the writes it was to cover stay unflushed, so a later
//!   crash may still lose them.
//! * [`FaultDevice::fail_op_torn`]: one write fails, but some of its sectors
//!   (chosen by a seed) reached the device anyway, as happens when a
//!   multi-sector write fails half-way.
//! * [`FaultDevice::fail_read`] (one transient read error) and
//!   [`FaultDevice::set_unreadable`] (a bad range: every read touching it
//!   fails until [`FaultDevice::clear_unreadable`]).
//! * [`FaultDevice::hold_writes`]: writes overlapping a byte range wait
//!   (before they take effect) until the hold is released, so a test can
//!   stop a layer above half-way through a write and act meanwhile.
//! * Power domains: devices made with [`FaultDevice::new_in_domain`] share
//!   one power supply — `crash_after_ops` counts the mutating ops of all of
//!   them, and the cut hits all of them at the same moment (a volume and its
//!   external journal losing power together).
//!
//! # Queues
//!
//! A queue ([`BlockDevice::queue`]) runs each request at submit time, in
//! push order, through the same code as the synchronous calls (so power
//! cuts, injected failures and tearing apply to queued requests alike),
//! and hands completions back in a seeded random order. For flushes it
//! models the freedom a real queue has: until the caller has *reaped* a
//! queued write's completion, the write may still be in flight, so a flush
//! does not cover it — except an [`crate::IoRequest::ordered`] flush of the
//! same queue, which starts only after every earlier request completed. A
//! write a flush did not cover stays unflushed (a crash may lose it), as
//! does every later write overlapping it, so older data never lands on
//! newer. Callers that forget the ordered flag lose data in crash tests.
//!
//! One mutex guards the whole state: this is a test device, and a single lock
//! makes "writes completed before the flush" exact.

use std::collections::BTreeSet;
use std::io::{IoSlice, IoSliceMut};

use parking_lot::Mutex;

use crate::queue::SplitMix64;
use crate::{check_request, iov_len, iov_len_mut, BlockDevice, DeviceError, IoPriority, Result};

/// Relative weights of what [`FaultDevice::crash_image`] does with each
/// unflushed write. A weight of 0 disables that outcome; at least one weight
/// must be non-zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashOdds {
    /// Weight of "the write never reached the media".
    pub drop: u32,
    /// Weight of "the whole write reached the media".
    pub keep: u32,
    /// Weight of "a random subset of the write's sectors reached the media".
    pub tear: u32,
}

impl Default for CrashOdds {
    /// Drop, keep and tear equally likely.
    fn default() -> Self {
        Self {
            drop: 1,
            keep: 1,
            tear: 1,
        }
    }
}

impl CrashOdds {
    /// Every unflushed write is lost: the crash image is the durable image.
    pub const LOSE_ALL: Self = Self {
        drop: 1,
        keep: 0,
        tear: 0,
    };
    /// Every unflushed write survives whole: the crash image is the live image
    /// (plus any write in flight at the power cut).
    pub const KEEP_ALL: Self = Self {
        drop: 0,
        keep: 1,
        tear: 0,
    };
}

/// The power supply of one or more fault devices.
#[derive(Default)]
pub struct PowerDomain {
    state: Mutex<PowerState>,
}

#[derive(Default)]
struct PowerState {
    /// Mutating ops admitted in the domain.
    ops: u64,
    crash_at_ops: Option<u64>,
    off: bool,
}

impl PowerDomain {
    pub fn new() -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self::default())
    }

    /// After `n` more mutating operations on any device of the domain,
    /// power is cut on all of them (see [`FaultDevice::crash_after_ops`]).
    pub fn crash_after_ops(&self, n: u64) {
        let mut st = self.state.lock();
        st.crash_at_ops = Some(st.ops.saturating_add(n));
    }

    /// Cuts power on every device of the domain.
    pub fn cut_power(&self) {
        self.state.lock().off = true;
    }

    pub fn is_powered_off(&self) -> bool {
        self.state.lock().off
    }

    /// Mutating operations admitted in the domain so far.
    pub fn ops(&self) -> u64 {
        self.state.lock().ops
    }

    /// Admits one mutating op: `Some(true)` proceed, `Some(false)` this op
    /// meets the cut, `None` power is already off.
    fn admit(&self) -> Option<bool> {
        let mut st = self.state.lock();
        if st.off {
            return None;
        }
        if st.crash_at_ops == Some(st.ops) {
            st.off = true;
            return Some(false);
        }
        st.ops += 1;
        Some(true)
    }
}

/// What an unflushed write put on the device.
#[derive(Clone, Debug)]
enum Payload {
    Bytes(Vec<u8>),
    /// `write_zeroes` of this many bytes (kept compact: zeroing can be large).
    Zeroes(u64),
}

#[derive(Clone, Debug)]
struct PendingWrite {
    offset: u64,
    payload: Payload,
    /// A FUA write: durable when it completed. It stays in the unflushed
    /// list (always applied, never dropped or torn) so that an older
    /// overlapping unflushed write can never appear on top of it in a crash
    /// image — a device does not write back stale cache over newer durable
    /// data.
    fua: bool,
    /// Set for a write that came through a queue: the id under which the
    /// device waits to hear that the caller reaped its completion (see
    /// "Queues" in the module docs).
    queued_id: Option<u64>,
}

impl PendingWrite {
    fn len(&self) -> u64 {
        match &self.payload {
            Payload::Bytes(b) => b.len() as u64,
            Payload::Zeroes(n) => *n,
        }
    }

    /// Copies bytes `[from, to)` of this write (relative to its start) into `image`.
    fn apply_range(&self, image: &mut [u8], from: u64, to: u64) {
        let dst = &mut image[(self.offset + from) as usize..(self.offset + to) as usize];
        match &self.payload {
            Payload::Bytes(b) => dst.copy_from_slice(&b[from as usize..to as usize]),
            Payload::Zeroes(_) => dst.fill(0),
        }
    }

    fn apply(&self, image: &mut [u8]) {
        self.apply_range(image, 0, self.len());
    }
}

struct State {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Completed writes no flush covers yet, in issue order.
    unflushed: Vec<PendingWrite>,
    /// A write that was being issued when power was cut (see module docs).
    in_flight: Option<PendingWrite>,
    /// Mutating operations that took effect.
    ops: u64,
    /// Mutating operations attempted (successful, injected failures, power cut).
    attempts: u64,
    /// Attempt numbers (0-based, absolute) that fail with `Injected`, with
    /// the seed of the sectors that still reach the device (torn failures).
    fail_at_attempts: std::collections::BTreeMap<u64, Option<u64>>,
    /// Flushes attempted so far, and flush numbers that fail once.
    flushes: u64,
    fail_at_flushes: BTreeSet<u64>,
    /// The errno a flush failure of [`FaultDevice::fail_flush_with`] reports
    /// (None: an injected EIO).
    flush_errno: Option<i32>,
    /// Reads so far, and read numbers that fail once.
    reads: u64,
    fail_at_reads: BTreeSet<u64>,
    /// Byte ranges every read touching fails.
    unreadable: Vec<(u64, u64)>,
    /// Writes reaching at or past this offset fail with `ENOSPC`, without
    /// effect (see [`FaultDevice::set_full_from`]).
    full_from: Option<u64>,
    /// [`FaultDevice::set_full_during`]: from this attempt, until that one
    /// (None: for good), writes past the offset fail with `ENOSPC`.
    full_during: Option<(u64, Option<u64>, u64)>,
    odds: CrashOdds,
    /// Queued writes that completed but whose completion the caller has not
    /// reaped yet: write id -> id of the queue.
    unreaped: std::collections::BTreeMap<u64, u64>,
    next_write_id: u64,
    /// [`FaultDevice::set_taken_over`]: ownership probes fail with this errno.
    taken_over: Option<i32>,
    /// The last [`BlockDevice::set_bytes_in_use`] (for tests to check).
    bytes_in_use: Option<u64>,
}

impl State {
    /// Where the store is full now: writes reaching past it fail with `ENOSPC`.
    fn full_at(&self) -> Option<u64> {
        let during = self.full_during.and_then(|(from, until, offset)| {
            (self.attempts > from && until.is_none_or(|u| self.attempts <= u)).then_some(offset)
        });
        match (self.full_from, during) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// A fault-injecting in-memory block device (see the module documentation).
pub struct FaultDevice {
    state: Mutex<State>,
    power: std::sync::Arc<PowerDomain>,
    sector_size: u32,
    size_bytes: u64,
    /// Ids of the queues made so far (they key `State::unreaped`).
    next_queue: std::sync::atomic::AtomicU64,
    /// Seeds the completion order of queues (see [`FaultDevice::set_queue_seed`]).
    queue_seed: std::sync::atomic::AtomicU64,
    /// [`FaultDevice::hold_writes`]: the hold writes wait at, if any.
    hold: Mutex<Option<std::sync::Arc<WriteHold>>>,
}

/// Writes overlapping a byte range wait at it until [`WriteHold::release`]
/// ([`FaultDevice::hold_writes`]).
pub struct WriteHold {
    from: u64,
    to: u64,
    /// (released, writes that have reached it)
    state: Mutex<(bool, u64)>,
    cv: parking_lot::Condvar,
}

impl WriteHold {
    /// Waits until a write has reached the hold, at most `limit`; true if
    /// one did.
    pub fn wait_reached(&self, limit: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        let mut st = self.state.lock();
        while st.1 == 0 {
            if self.cv.wait_until(&mut st, deadline).timed_out() {
                return st.1 > 0;
            }
        }
        true
    }

    /// Lets every held write (and every later one) go on.
    pub fn release(&self) {
        self.state.lock().0 = true;
        self.cv.notify_all();
    }

    /// Waits here while the hold lasts if `[offset, offset + len)` meets it.
    fn pass(&self, offset: u64, len: u64) {
        if offset >= self.to || offset + len <= self.from {
            return;
        }
        let mut st = self.state.lock();
        if st.0 {
            return;
        }
        st.1 += 1;
        self.cv.notify_all();
        while !st.0 {
            self.cv.wait(&mut st);
        }
    }
}

/// What happens to a mutating operation before it touches the images.
enum Admission {
    Proceed,
    /// Power was already off.
    PoweredOff,
    /// This op is the one `crash_after_ops` cuts power at.
    CutNow,
    Injected,
    /// Fails, but the sectors chosen by this seed reach the device.
    InjectedTorn(u64),
}

impl FaultDevice {
    /// A zero-filled device of `size_bytes` (rounded down to `sector_size`),
    /// all of it durable.
    ///
    /// # Panics
    /// If `sector_size` is 0.
    pub fn new(size_bytes: u64, sector_size: u32) -> Self {
        assert!(sector_size > 0, "sector size must be non-zero");
        let size = size_bytes - size_bytes % u64::from(sector_size);
        Self::from_image(vec![0; size as usize], sector_size)
    }

    /// A device whose durable (and live) content is `image`.
    ///
    /// # Panics
    /// If `sector_size` is 0 or the image length is not a multiple of it
    /// (a test-setup mistake, not a runtime condition).
    pub fn from_image(image: Vec<u8>, sector_size: u32) -> Self {
        Self::from_image_in_domain(image, sector_size, PowerDomain::new())
    }

    /// A zero-filled device on the power supply `power` (shared with the
    /// other devices of the domain).
    pub fn new_in_domain(
        size_bytes: u64,
        sector_size: u32,
        power: std::sync::Arc<PowerDomain>,
    ) -> Self {
        assert!(sector_size > 0, "sector size must be non-zero");
        let size = size_bytes - size_bytes % u64::from(sector_size);
        Self::from_image_in_domain(vec![0; size as usize], sector_size, power)
    }

    /// [`FaultDevice::from_image`] on the power supply `power`.
    pub fn from_image_in_domain(
        image: Vec<u8>,
        sector_size: u32,
        power: std::sync::Arc<PowerDomain>,
    ) -> Self {
        assert!(sector_size > 0, "sector size must be non-zero");
        assert_eq!(
            image.len() % sector_size as usize,
            0,
            "image length {} is not a multiple of the sector size {sector_size}",
            image.len()
        );
        let size_bytes = image.len() as u64;
        Self {
            state: Mutex::new(State {
                durable: image.clone(),
                live: image,
                unflushed: Vec::new(),
                in_flight: None,
                ops: 0,
                attempts: 0,
                fail_at_attempts: std::collections::BTreeMap::new(),
                flushes: 0,
                fail_at_flushes: BTreeSet::new(),
                flush_errno: None,
                reads: 0,
                fail_at_reads: BTreeSet::new(),
                unreadable: Vec::new(),
                full_from: None,
                full_during: None,
                odds: CrashOdds::default(),
                unreaped: std::collections::BTreeMap::new(),
                next_write_id: 0,
                taken_over: None,
                bytes_in_use: None,
            }),
            power,
            sector_size,
            size_bytes,
            next_queue: std::sync::atomic::AtomicU64::new(0),
            queue_seed: std::sync::atomic::AtomicU64::new(0),
            hold: Mutex::new(None),
        }
    }

    /// From now on, writes (and write-zeroes) overlapping `[offset, offset +
    /// len)` wait, before they take effect, until the returned hold is
    /// released. Replaces an earlier hold (writes already waiting at it
    /// keep waiting for its release).
    pub fn hold_writes(&self, offset: u64, len: u64) -> std::sync::Arc<WriteHold> {
        let hold = std::sync::Arc::new(WriteHold {
            from: offset,
            to: offset + len,
            state: Mutex::new((false, 0)),
            cv: parking_lot::Condvar::new(),
        });
        *self.hold.lock() = Some(hold.clone());
        hold
    }

    /// After `n` more mutating operations (write, write_zeroes, flush)
    /// succeed, power is cut: the next one and every later operation, reads
    /// included, fail with [`DeviceError::PowerCut`]. `n == 0` cuts power at
    /// the next mutating operation. Replaces an earlier setting.
    ///
    /// In a shared power domain `n` counts the ops of every device in it.
    pub fn crash_after_ops(&self, n: u64) {
        self.power.crash_after_ops(n);
    }

    /// Cuts power now: every later operation fails with [`DeviceError::PowerCut`].
    pub fn cut_power(&self) {
        self.power.cut_power();
    }

    /// True once power has been cut.
    pub fn is_powered_off(&self) -> bool {
        self.power.is_powered_off()
    }

    /// The power supply of this device.
    pub fn power(&self) -> &std::sync::Arc<PowerDomain> {
        &self.power
    }

    /// Mutating operations that took effect so far (failed ones not counted).
    pub fn ops(&self) -> u64 {
        self.state.lock().ops
    }

    /// Makes the `n`-th mutating operation from now fail once with
    /// [`DeviceError::Injected`], without effect; the device keeps working.
    /// `n == 1` is the next mutating operation (`0` is treated as `1`).
    /// Several pending failures may be set.
    pub fn fail_op(&self, n: u64) {
        let mut st = self.state.lock();
        let at = st.attempts.saturating_add(n.max(1) - 1);
        st.fail_at_attempts.insert(at, None);
    }

    /// Like [`FaultDevice::fail_op`], but if the op is a write, the sectors
    /// `seed` picks reach the device (live image, unflushed) although the
    /// write reports failure. A flush or zeroing chosen this way just fails.
    pub fn fail_op_torn(&self, n: u64, seed: u64) {
        let mut st = self.state.lock();
        let at = st.attempts.saturating_add(n.max(1) - 1);
        st.fail_at_attempts.insert(at, Some(seed));
    }

    /// Makes the `n`-th flush from now (`n == 1`: the next) fail once,
    /// without effect: the writes it was to cover stay unflushed.
    pub fn fail_flush(&self, n: u64) {
        let mut st = self.state.lock();
        let at = st.flushes.saturating_add(n.max(1) - 1);
        st.fail_at_flushes.insert(at);
    }

    /// [`FaultDevice::fail_flush`] with the failure reported as `errno`
    /// (ENOSPC: a file system that found no room for written data at
    /// writeback, as NFS, FUSE or a thin store may).
    pub fn fail_flush_with(&self, n: u64, errno: i32) {
        self.fail_flush(n);
        self.state.lock().flush_errno = Some(errno);
    }

    /// Makes the `n`-th read from now (`n == 1`: the next) fail once.
    pub fn fail_read(&self, n: u64) {
        let mut st = self.state.lock();
        let at = st.reads.saturating_add(n.max(1) - 1);
        st.fail_at_reads.insert(at);
    }

    /// Models storage another client took over (an RBD image whose lock
    /// was broken, this client blocklisted): from now on
    /// [`BlockDevice::confirm_ownership`] fails with `errno` (`ESHUTDOWN`
    /// is librbd's); `None` ends that. Reads and writes are unaffected, so
    /// a test sees what the volume does with the probe's answer alone.
    pub fn set_taken_over(&self, errno: Option<i32>) {
        self.state.lock().taken_over = errno;
    }

    /// What the device's user last said it touches
    /// ([`BlockDevice::set_bytes_in_use`]), if anything.
    pub fn bytes_in_use(&self) -> Option<u64> {
        self.state.lock().bytes_in_use
    }

    /// Makes every read touching `[offset, offset + len)` fail (a bad range).
    pub fn set_unreadable(&self, offset: u64, len: u64) {
        self.state.lock().unreadable.push((offset, offset + len));
    }

    /// Forgets every bad range.
    pub fn clear_unreadable(&self) {
        self.state.lock().unreadable.clear();
    }

    /// Models a thin or sparse backing store that has run out of space:
    /// from now on every write (not zeroing, which frees space) reaching
    /// at or past `offset` fails with `ENOSPC`, without effect, while
    /// writes below it (space already allocated) and flushes and reads
    /// keep working. `None` makes room again.
    pub fn set_full_from(&self, offset: Option<u64>) {
        self.state.lock().full_from = offset;
    }

    /// [`FaultDevice::set_full_from`] `offset` for a stretch of mutating
    /// operations: from the `after`-th from now (`0` or `1`: the next), for
    /// `lasting` of them (None: for good), counted as [`FaultDevice::fail_op`]
    /// counts. For a simulation that wants the store to fill and then get
    /// room again at points of its own seed's choosing.
    pub fn set_full_during(&self, after: u64, lasting: Option<u64>, offset: u64) {
        let mut st = self.state.lock();
        let from = st.attempts.saturating_add(after.max(1) - 1);
        st.full_during = Some((from, lasting.map(|n| from.saturating_add(n)), offset));
    }

    /// Seeds the order in which queues made from now on deliver completions.
    pub fn set_queue_seed(&self, seed: u64) {
        self.queue_seed
            .store(seed, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sets the odds [`FaultDevice::crash_image`] uses.
    ///
    /// # Panics
    /// If every weight is 0.
    pub fn set_crash_odds(&self, odds: CrashOdds) {
        assert!(
            odds.drop > 0 || odds.keep > 0 || odds.tear > 0,
            "at least one crash outcome must have a non-zero weight"
        );
        self.state.lock().odds = odds;
    }

    /// The image if every unflushed write is lost.
    pub fn durable_image(&self) -> Vec<u8> {
        self.state.lock().durable.clone()
    }

    /// What reads return now (or would, were power not cut).
    pub fn live_image(&self) -> Vec<u8> {
        self.state.lock().live.clone()
    }

    /// Number of completed writes no flush covers yet (plus a write in flight
    /// at the power cut, if any).
    pub fn unflushed_writes(&self) -> usize {
        let st = self.state.lock();
        st.unflushed.len() + usize::from(st.in_flight.is_some())
    }

    /// An image a power cut now could leave, chosen by `seed` with the
    /// device's [`CrashOdds`]. Same state and seed give the same image.
    pub fn crash_image(&self, seed: u64) -> Vec<u8> {
        let odds = self.state.lock().odds;
        self.crash_image_with(seed, odds)
    }

    /// Like [`FaultDevice::crash_image`] with explicit odds.
    ///
    /// # Panics
    /// If every weight in `odds` is 0.
    pub fn crash_image_with(&self, seed: u64, odds: CrashOdds) -> Vec<u8> {
        let total = u64::from(odds.drop) + u64::from(odds.keep) + u64::from(odds.tear);
        assert!(
            total > 0,
            "at least one crash outcome must have a non-zero weight"
        );
        let st = self.state.lock();
        let mut image = st.durable.clone();
        let mut rng = SplitMix64::new(seed);
        let sector = u64::from(self.sector_size);
        for w in st.unflushed.iter().chain(st.in_flight.iter()) {
            if w.fua && !st.in_flight.as_ref().is_some_and(|f| std::ptr::eq(f, w)) {
                // Completed FUA writes are durable; re-applying them here
                // keeps older overlapping writes from landing on top.
                w.apply(&mut image);
                continue;
            }
            let pick = rng.below(total);
            if pick < u64::from(odds.drop) {
                continue;
            }
            if pick < u64::from(odds.drop) + u64::from(odds.keep) {
                w.apply(&mut image);
                continue;
            }
            // Tear: each sector independently reaches the media or not.
            let mut from = 0;
            while from < w.len() {
                let to = (from + sector).min(w.len());
                if rng.next() & 1 == 1 {
                    w.apply_range(&mut image, from, to);
                }
                from = to;
            }
        }
        image
    }

    /// Decides the fate of a mutating op; counts the attempt.
    fn admit(&self, st: &mut State) -> Admission {
        if self.power.is_powered_off() {
            return Admission::PoweredOff;
        }
        let attempt = st.attempts;
        st.attempts += 1;
        if let Some(torn) = st.fail_at_attempts.remove(&attempt) {
            return match torn {
                Some(seed) => Admission::InjectedTorn(seed),
                None => Admission::Injected,
            };
        }
        match self.power.admit() {
            None => Admission::PoweredOff,
            Some(false) => Admission::CutNow,
            Some(true) => Admission::Proceed,
        }
    }

    /// Runs a write-like op (`what` names it for injected errors).
    fn mutate(
        &self,
        what: &'static str,
        offset: u64,
        len: u64,
        payload: Payload,
        fua: bool,
    ) -> Result<()> {
        self.mutate_queued(what, offset, len, payload, fua, None).0
    }

    /// A write-like op; for one from queue `queue`, also the id its
    /// completion must be acknowledged with (see "Queues" in the module docs).
    fn mutate_queued(
        &self,
        what: &'static str,
        offset: u64,
        len: u64,
        payload: Payload,
        fua: bool,
        queue: Option<u64>,
    ) -> (Result<()>, Option<u64>) {
        if let Err(e) = check_request(self.size_bytes, self.sector_size, offset, len) {
            return (Err(e), None);
        }
        let hold = self.hold.lock().clone();
        if let Some(hold) = hold {
            hold.pass(offset, len);
        }
        let mut st = self.state.lock();
        let queued_id = queue.map(|q| {
            let id = st.next_write_id;
            st.next_write_id += 1;
            st.unreaped.insert(id, q);
            id
        });
        let w = PendingWrite {
            offset,
            payload,
            fua,
            queued_id,
        };
        let res = self.mutate_locked(&mut st, what, w);
        if res.is_err() && !matches!(res, Err(DeviceError::Injected(_))) {
            // Nothing of it is in the unflushed list to be covered or not.
            if let Some(id) = queued_id {
                st.unreaped.remove(&id);
            }
        }
        (res, queued_id)
    }

    fn mutate_locked(&self, st: &mut State, what: &'static str, w: PendingWrite) -> Result<()> {
        match self.admit(st) {
            Admission::InjectedTorn(seed) => {
                // Runs of the sectors that made it, each an unflushed write.
                let mut rng = SplitMix64::new(seed);
                let sector = u64::from(self.sector_size);
                let mut from = 0;
                while from < w.len() {
                    let to = (from + sector).min(w.len());
                    if rng.next() & 1 == 1 {
                        let piece = PendingWrite {
                            offset: w.offset + from,
                            payload: match &w.payload {
                                Payload::Bytes(b) => {
                                    Payload::Bytes(b[from as usize..to as usize].to_vec())
                                }
                                Payload::Zeroes(_) => Payload::Zeroes(to - from),
                            },
                            fua: false,
                            queued_id: w.queued_id,
                        };
                        piece.apply(&mut st.live);
                        st.unflushed.push(piece);
                    }
                    from = to;
                }
                Err(DeviceError::Injected(what))
            }
            Admission::CutNow => {
                // Only the op that meets the cut is "in flight"; ops after it
                // never reach the device.
                st.in_flight = Some(w);
                Err(DeviceError::PowerCut)
            }
            Admission::PoweredOff => Err(DeviceError::PowerCut),
            Admission::Injected => Err(DeviceError::Injected(what)),
            Admission::Proceed
                if matches!(w.payload, Payload::Bytes(_))
                    && st.full_at().is_some_and(|f| w.offset + w.len() > f) =>
            {
                Err(DeviceError::Io {
                    op: what,
                    what: "fault device".into(),
                    error: std::io::Error::from_raw_os_error(libc::ENOSPC),
                })
            }
            Admission::Proceed => {
                w.apply(&mut st.live);
                if w.fua {
                    w.apply(&mut st.durable);
                }
                st.unflushed.push(w);
                st.ops += 1;
                Ok(())
            }
        }
    }
}

impl BlockDevice for FaultDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn ownership_probe_due(&self, _since: std::time::Instant) -> bool {
        self.state.lock().taken_over.is_some()
    }

    fn set_bytes_in_use(&self, bytes: u64) {
        self.state.lock().bytes_in_use = Some(bytes);
    }

    fn confirm_ownership(&self, _since: std::time::Instant) -> Result<()> {
        match self.state.lock().taken_over {
            Some(errno) => Err(DeviceError::io(
                "ownership probe",
                "fault device",
                std::io::Error::from_raw_os_error(errno),
            )),
            None => Ok(()),
        }
    }

    fn logical_block_size(&self) -> u32 {
        self.sector_size
    }

    fn read_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> Result<()> {
        let len = iov_len_mut(bufs);
        check_request(self.size_bytes, self.sector_size, offset, len)?;
        let mut st = self.state.lock();
        if self.power.is_powered_off() {
            return Err(DeviceError::PowerCut);
        }
        let read = st.reads;
        st.reads += 1;
        if st.fail_at_reads.remove(&read) {
            return Err(DeviceError::Injected("read"));
        }
        if st
            .unreadable
            .iter()
            .any(|&(lo, hi)| offset < hi && lo < offset + len)
        {
            return Err(DeviceError::Injected("read (unreadable sector)"));
        }
        let mut pos = offset as usize;
        for b in bufs.iter_mut() {
            let n = b.len();
            b.copy_from_slice(&st.live[pos..pos + n]);
            pos += n;
        }
        Ok(())
    }

    fn write_vectored_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        _prio: IoPriority,
    ) -> Result<()> {
        let len = iov_len(bufs);
        check_request(self.size_bytes, self.sector_size, offset, len)?;
        let mut data = Vec::with_capacity(len as usize);
        for b in bufs {
            data.extend_from_slice(b);
        }
        self.mutate("write", offset, len, Payload::Bytes(data), false)
    }

    fn write_vectored_durable_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        _prio: IoPriority,
    ) -> Result<()> {
        let len = iov_len(bufs);
        check_request(self.size_bytes, self.sector_size, offset, len)?;
        let mut data = Vec::with_capacity(len as usize);
        for b in bufs {
            data.extend_from_slice(b);
        }
        self.mutate("write (FUA)", offset, len, Payload::Bytes(data), true)
    }

    fn flush(&self) -> Result<()> {
        self.flush_from(None)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.mutate("write_zeroes", offset, len, Payload::Zeroes(len), false)
    }

    fn queue(&self, depth: u32) -> Result<Box<dyn crate::IoQueue + '_>> {
        let queue_id = self
            .next_queue
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let seed = self.queue_seed.load(std::sync::atomic::Ordering::Relaxed);
        Ok(Box::new(crate::queue::SyncQueue::new(
            FaultQueueRun {
                dev: self,
                queue_id,
            },
            depth,
            Some(seed ^ queue_id.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        )?))
    }

    fn backend_name(&self) -> &'static str {
        "fault"
    }
}

impl FaultDevice {
    /// A flush; `from` names the queue it came from and whether it was
    /// ordered (see "Queues" in the module docs).
    fn flush_from(&self, from: Option<(u64, bool)>) -> Result<()> {
        let mut st = self.state.lock();
        let flush_no = st.flushes;
        st.flushes += 1;
        if !self.power.is_powered_off() && st.fail_at_flushes.remove(&flush_no) {
            return Err(match st.flush_errno {
                Some(errno) => DeviceError::io(
                    "flush",
                    "the fault device",
                    std::io::Error::from_raw_os_error(errno),
                ),
                None => DeviceError::Injected("flush"),
            });
        }
        match self.admit(&mut st) {
            Admission::CutNow | Admission::PoweredOff => Err(DeviceError::PowerCut),
            Admission::Injected | Admission::InjectedTorn(_) => Err(DeviceError::Injected("flush")),
            Admission::Proceed => {
                // IMPORTANT: the lock is held from admission to here, so
                // exactly the writes completed before this flush become durable.
                let pending = std::mem::take(&mut st.unflushed);
                // Held back: queued writes the flush may have overtaken,
                // and (so that no older data lands on newer) every later
                // write overlapping one of them.
                let mut held: Vec<PendingWrite> = Vec::new();
                for w in pending {
                    let overtaken = w.queued_id.is_some_and(|id| {
                        st.unreaped
                            .get(&id)
                            .is_some_and(|&q| from != Some((q, true)))
                    });
                    let overlaps_held = held
                        .iter()
                        .any(|h| w.offset < h.offset + h.len() && h.offset < w.offset + w.len());
                    if overtaken || overlaps_held {
                        held.push(w);
                    } else {
                        w.apply(&mut st.durable);
                    }
                }
                st.unflushed = held;
                st.ops += 1;
                Ok(())
            }
        }
    }
}

/// How a [`FaultDevice`] queue runs its requests: at submit, in push order,
/// through the same code as the synchronous calls.
struct FaultQueueRun<'a> {
    dev: &'a FaultDevice,
    queue_id: u64,
}

impl crate::queue::RunNow for FaultQueueRun<'_> {
    fn size_bytes(&self) -> u64 {
        self.dev.size_bytes
    }

    fn logical_block_size(&self) -> u32 {
        self.dev.sector_size
    }

    fn run(&mut self, req: &mut crate::IoRequest) -> (Result<()>, Option<u64>) {
        use crate::IoOp;
        let q = Some(self.queue_id);
        match &mut req.op {
            IoOp::Read { offset, buf } => (self.dev.read_at(buf.bytes_mut(), *offset), None),
            IoOp::Write {
                offset,
                bufs,
                durable,
            } => {
                // One op however many buffers: a vectored write is one
                // request to the device (failed, cut or torn as a whole).
                let mut data = Vec::with_capacity(crate::queue::write_len(bufs) as usize);
                for b in bufs.iter() {
                    data.extend_from_slice(b.bytes());
                }
                let (what, len) = match durable {
                    true => ("write (FUA)", data.len() as u64),
                    false => ("write", data.len() as u64),
                };
                self.dev
                    .mutate_queued(what, *offset, len, Payload::Bytes(data), *durable, q)
            }
            IoOp::WriteZeroes { offset, len } => self.dev.mutate_queued(
                "write_zeroes",
                *offset,
                *len,
                Payload::Zeroes(*len),
                false,
                q,
            ),
            IoOp::Flush => (
                self.dev.flush_from(Some((self.queue_id, req.ordered))),
                None,
            ),
        }
    }

    fn acknowledge(&mut self, id: u64) {
        self.dev.state.lock().unreaped.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECTOR: u32 = 512;

    /// A sector's worth of bytes that names the write (`id`) and the sector
    /// index inside it, so a crash image shows where each sector came from.
    fn pattern(id: u8, sectors: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(sectors * SECTOR as usize);
        for s in 0..sectors {
            let mut sec = vec![id; SECTOR as usize];
            sec[0] = s as u8;
            v.extend_from_slice(&sec);
        }
        v
    }

    fn w(d: &FaultDevice, buf: &[u8], offset: u64) -> Result<()> {
        d.write_at(buf, offset, IoPriority::Urgent)
    }

    #[test]
    fn torn_failed_write_lands_some_sectors_and_reports_failure() {
        let mut seen_partial = false;
        for seed in 0..16 {
            let d = FaultDevice::from_image(vec![9u8; 8192], SECTOR);
            d.fail_op_torn(1, seed);
            assert!(w(&d, &pattern(1, 8), 0).is_err());
            let live = d.live_image();
            let landed = (0..8)
                .filter(|&i| live[i * SECTOR as usize + 1] == 1)
                .count();
            // Every sector is old or new, never anything else.
            for i in 0..8 {
                let sec = &live[i * SECTOR as usize..(i + 1) * SECTOR as usize];
                assert!(sec == &pattern(1, 8)[i * 512..(i + 1) * 512] || sec == [9u8; 512]);
            }
            seen_partial |= landed > 0 && landed < 8;
            // Unflushed: a crash may lose them, a flush keeps them.
            assert_eq!(d.crash_image_with(1, CrashOdds::LOSE_ALL), vec![9u8; 8192]);
            d.flush().unwrap();
            assert_eq!(d.durable_image(), live);
        }
        assert!(seen_partial, "no seed tore the write");
    }

    #[test]
    fn shared_power_domain_cuts_every_device_at_once() {
        let power = PowerDomain::new();
        let a = FaultDevice::new_in_domain(8192, SECTOR, power.clone());
        let b = FaultDevice::new_in_domain(8192, SECTOR, power.clone());
        a.crash_after_ops(3);
        w(&a, &pattern(1, 1), 0).unwrap();
        w(&b, &pattern(2, 1), 0).unwrap();
        b.flush().unwrap();
        // The fourth op of the domain meets the cut, on either device.
        assert!(matches!(
            w(&a, &pattern(3, 1), 512),
            Err(DeviceError::PowerCut)
        ));
        assert!(b.is_powered_off());
        assert!(matches!(b.flush(), Err(DeviceError::PowerCut)));
        let mut buf = vec![0u8; 512];
        assert!(b.read_at(&mut buf, 0).is_err());
        assert_eq!(power.ops(), 3);
    }

    #[test]
    fn read_errors_transient_and_persistent() {
        let d = FaultDevice::from_image(vec![5u8; 8192], SECTOR);
        let mut buf = vec![0u8; 512];
        d.fail_read(2);
        d.read_at(&mut buf, 0).unwrap();
        assert!(d.read_at(&mut buf, 0).is_err());
        d.read_at(&mut buf, 0).unwrap();
        d.set_unreadable(1024, 512);
        assert!(d.read_at(&mut buf, 1024).is_err());
        let mut big = vec![0u8; 2048];
        assert!(d.read_at(&mut big, 0).is_err());
        d.read_at(&mut buf, 512).unwrap();
        d.clear_unreadable();
        d.read_at(&mut buf, 1024).unwrap();
    }

    #[test]
    fn flush_makes_everything_durable() {
        let d = FaultDevice::new(64 * 1024, SECTOR);
        w(&d, &pattern(1, 4), 0).unwrap();
        w(&d, &pattern(2, 2), 4096).unwrap();
        d.write_zeroes(512, 1024).unwrap();
        assert_eq!(d.unflushed_writes(), 3);
        assert_ne!(d.durable_image(), d.live_image());
        d.flush().unwrap();
        assert_eq!(d.unflushed_writes(), 0);
        assert_eq!(d.durable_image(), d.live_image());
        for seed in 0..20 {
            assert_eq!(d.crash_image(seed), d.live_image());
        }
        // Read-back matches the live image.
        let mut b = vec![0u8; 4096];
        d.read_at(&mut b, 0).unwrap();
        assert_eq!(&b[..], &d.live_image()[..4096]);
        assert!(b[512..1536].iter().all(|&x| x == 0));
    }

    #[test]
    fn odds_extremes_give_durable_or_live() {
        let d = FaultDevice::from_image(vec![9u8; 8192], SECTOR);
        w(&d, &pattern(1, 4), 1024).unwrap();
        for seed in 0..10 {
            assert_eq!(
                d.crash_image_with(seed, CrashOdds::LOSE_ALL),
                vec![9u8; 8192]
            );
            assert_eq!(
                d.crash_image_with(seed, CrashOdds::KEEP_ALL),
                d.live_image()
            );
        }
        d.set_crash_odds(CrashOdds::LOSE_ALL);
        assert_eq!(d.crash_image(77), d.durable_image());
    }

    #[test]
    fn crash_image_is_deterministic() {
        let build = || {
            let d = FaultDevice::new(32 * 1024, SECTOR);
            for i in 0..10u8 {
                w(&d, &pattern(i + 1, 3), u64::from(i) * 1024).unwrap();
            }
            d
        };
        let (a, b) = (build(), build());
        let mut distinct = std::collections::HashSet::new();
        for seed in 0..50 {
            let img = a.crash_image(seed);
            assert_eq!(img, a.crash_image(seed), "same device, same seed");
            assert_eq!(img, b.crash_image(seed), "same history, same seed");
            distinct.insert(img);
        }
        // The seed matters: 10 overlapping writes give many possible images.
        assert!(
            distinct.len() > 10,
            "only {} distinct images",
            distinct.len()
        );
    }

    #[test]
    fn tearing_happens_for_multi_sector_writes() {
        let d = FaultDevice::new(16 * 1024, SECTOR);
        let data = pattern(0xAB, 8);
        w(&d, &data, 0).unwrap();
        let mut torn = 0;
        for seed in 0..300 {
            let img = d.crash_image(seed);
            let written = (0..8)
                .filter(|&s| {
                    let r = s * SECTOR as usize..(s + 1) * SECTOR as usize;
                    img[r.clone()] == data[r]
                })
                .count();
            if written > 0 && written < 8 {
                torn += 1;
            }
        }
        // With 1/3 tear odds and 8 sectors, ~99% of tears are partial.
        assert!(torn > 30, "only {torn} torn images in 300 seeds");
    }

    #[test]
    fn reordering_shows_up() {
        // Two writes to different sectors: some seed keeps the later one and
        // drops the earlier one.
        let d = FaultDevice::new(4096, SECTOR);
        w(&d, &pattern(1, 1), 0).unwrap();
        w(&d, &pattern(2, 1), 512).unwrap();
        let later_only = (0..200).any(|seed| {
            let img = d.crash_image(seed);
            img[..512].iter().all(|&x| x == 0) && img[512..1024] == pattern(2, 1)[..]
        });
        assert!(later_only);
    }

    #[test]
    fn crash_after_ops_fails_exactly_the_right_op() {
        let d = FaultDevice::new(8192, SECTOR);
        d.crash_after_ops(3);
        w(&d, &pattern(1, 1), 0).unwrap();
        d.flush().unwrap();
        d.write_zeroes(0, 512).unwrap();
        assert!(!d.is_powered_off());
        let mut b = [0u8; 512];
        d.read_at(&mut b, 0).unwrap(); // reads are not mutating ops
        assert_eq!(d.ops(), 3);
        assert!(matches!(
            w(&d, &pattern(2, 1), 512),
            Err(DeviceError::PowerCut)
        ));
        assert!(d.is_powered_off());
        assert_eq!(d.ops(), 3);
        assert!(matches!(d.read_at(&mut b, 0), Err(DeviceError::PowerCut)));
        assert!(matches!(d.flush(), Err(DeviceError::PowerCut)));
        assert!(matches!(d.write_zeroes(0, 512), Err(DeviceError::PowerCut)));
        // The failed write never reached the live image...
        assert!(d.live_image()[512..1024].iter().all(|&x| x == 0));
        // ...but it was in flight: a crash image may contain it.
        assert_eq!(d.unflushed_writes(), 2);
        let img = d.crash_image_with(0, CrashOdds::KEEP_ALL);
        assert_eq!(&img[512..1024], &pattern(2, 1)[..]);
        assert!(img[..512].iter().all(|&x| x == 0));
        // Durable: the first write (flushed), not the zeroing.
        assert_eq!(&d.durable_image()[..512], &pattern(1, 1)[..]);
    }

    #[test]
    fn crash_after_zero_ops_cuts_at_next_flush() {
        let d = FaultDevice::new(4096, SECTOR);
        w(&d, &pattern(1, 1), 0).unwrap();
        d.crash_after_ops(0);
        assert!(matches!(d.flush(), Err(DeviceError::PowerCut)));
        // The flush never happened: the write is still unflushed.
        assert!(d.durable_image().iter().all(|&x| x == 0));
        assert_eq!(d.unflushed_writes(), 1);
    }

    #[test]
    fn cut_power_now() {
        let d = FaultDevice::new(4096, SECTOR);
        d.cut_power();
        assert!(d.is_powered_off());
        let mut b = [0u8; 512];
        assert!(matches!(d.read_at(&mut b, 0), Err(DeviceError::PowerCut)));
        assert!(matches!(w(&d, &b, 0), Err(DeviceError::PowerCut)));
        assert_eq!(d.unflushed_writes(), 0, "nothing was in flight");
    }

    #[test]
    fn fail_op_fails_once_without_effect() {
        let d = FaultDevice::new(4096, SECTOR);
        d.fail_op(2);
        w(&d, &pattern(1, 1), 0).unwrap();
        assert!(matches!(
            w(&d, &pattern(2, 1), 512),
            Err(DeviceError::Injected("write"))
        ));
        w(&d, &pattern(3, 1), 1024).unwrap();
        assert_eq!(d.ops(), 2);
        assert!(d.live_image()[512..1024].iter().all(|&x| x == 0));
        assert_eq!(d.unflushed_writes(), 2);
        d.fail_op(1);
        assert!(matches!(d.flush(), Err(DeviceError::Injected("flush"))));
        assert_eq!(d.unflushed_writes(), 2, "failed flush made nothing durable");
        d.flush().unwrap();
        assert_eq!(d.durable_image(), d.live_image());
        assert!(!d.is_powered_off());
    }

    #[test]
    fn requests_are_checked() {
        let d = FaultDevice::new(4096, SECTOR);
        assert!(matches!(
            w(&d, &[0u8; 100], 0),
            Err(DeviceError::Misaligned { .. })
        ));
        assert!(matches!(
            w(&d, &[0u8; 512], 4096),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            d.write_zeroes(u64::MAX - 511, 512),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert_eq!(d.ops(), 0, "refused requests are not ops");
    }

    #[derive(Clone, Debug)]
    enum Op {
        Write { sector: u64, sectors: u64 },
        Zero { sector: u64, sectors: u64 },
        Flush,
    }

    const DEV_SECTORS: u64 = 32;

    fn op_strategy() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..DEV_SECTORS, 1..8u64).prop_map(|(sector, sectors)| Op::Write {
                sector,
                sectors: sectors.min(DEV_SECTORS - sector)
            }),
            1 => (0..DEV_SECTORS, 1..8u64).prop_map(|(sector, sectors)| Op::Zero {
                sector,
                sectors: sectors.min(DEV_SECTORS - sector)
            }),
            1 => Just(Op::Flush),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Per sector, a crash image holds the durable content or the content
        /// of some unflushed write to that sector; and the device agrees with
        /// a simple model of live/durable images.
        #[test]
        fn crash_images_only_hold_durable_or_unflushed_content(
            ops in proptest::collection::vec(op_strategy(), 1..40),
            crash_at in proptest::option::of(0..40u64),
            seeds in proptest::collection::vec(any::<u64>(), 1..8),
        ) {
            let ss = SECTOR as usize;
            let d = FaultDevice::new(DEV_SECTORS * u64::from(SECTOR), SECTOR);
            if let Some(n) = crash_at {
                d.crash_after_ops(n);
            }
            let mut live = vec![0u8; d.size_bytes() as usize];
            let mut durable = live.clone();
            // Per sector: contents written by ops since the last flush
            // (including a write in flight at the power cut).
            let mut candidates: Vec<Vec<Vec<u8>>> = vec![Vec::new(); DEV_SECTORS as usize];
            for (i, op) in ops.iter().enumerate() {
                let id = (i + 1) as u8;
                let (res, range, data) = match *op {
                    Op::Write { sector, sectors } => {
                        let data = pattern(id, sectors as usize);
                        (w(&d, &data, sector * u64::from(SECTOR)), Some((sector, sectors)), data)
                    }
                    Op::Zero { sector, sectors } => (
                        d.write_zeroes(sector * u64::from(SECTOR), sectors * u64::from(SECTOR)),
                        Some((sector, sectors)),
                        vec![0; sectors as usize * ss],
                    ),
                    Op::Flush => (d.flush(), None, Vec::new()),
                };
                match res {
                    Ok(()) => match range {
                        Some((sector, sectors)) => {
                            let at = sector as usize * ss;
                            live[at..at + data.len()].copy_from_slice(&data);
                            for s in 0..sectors as usize {
                                candidates[sector as usize + s]
                                    .push(data[s * ss..(s + 1) * ss].to_vec());
                            }
                        }
                        None => {
                            durable.clone_from(&live);
                            candidates.iter_mut().for_each(Vec::clear);
                        }
                    },
                    Err(DeviceError::PowerCut) => {
                        prop_assert!(d.is_powered_off());
                        if let Some((sector, sectors)) = range {
                            for s in 0..sectors as usize {
                                candidates[sector as usize + s]
                                    .push(data[s * ss..(s + 1) * ss].to_vec());
                            }
                        }
                        break;
                    }
                    Err(e) => prop_assert!(false, "unexpected error {e}"),
                }
            }
            prop_assert_eq!(&d.live_image(), &live);
            prop_assert_eq!(&d.durable_image(), &durable);
            for seed in seeds {
                let img = d.crash_image(seed);
                prop_assert_eq!(&img, &d.crash_image(seed));
                for s in 0..DEV_SECTORS as usize {
                    let got = &img[s * ss..(s + 1) * ss];
                    prop_assert!(
                        got == &durable[s * ss..(s + 1) * ss]
                            || candidates[s].iter().any(|c| c == got),
                        "sector {} holds content that is neither durable nor unflushed", s
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod fua_tests {
    use super::*;

    #[test]
    fn fua_write_is_durable_alone_and_never_overwritten_by_older_writes() {
        let d = FaultDevice::new(8192, 512);
        d.write_at(&[1u8; 512], 0, IoPriority::Urgent).unwrap(); // older, unflushed
        d.write_at(&[2u8; 512], 4096, IoPriority::Urgent).unwrap(); // unrelated, unflushed
        d.write_vectored_durable_at(&[IoSlice::new(&[3u8; 512])], 0, IoPriority::Urgent)
            .unwrap();
        assert_eq!(&d.durable_image()[..512], &[3u8; 512][..]);
        assert_eq!(
            d.durable_image()[4096],
            0,
            "FUA must not make other writes durable"
        );
        let mut lost_other = false;
        for seed in 0..64 {
            let img = d.crash_image(seed);
            assert_eq!(
                &img[..512],
                &[3u8; 512][..],
                "seed {seed}: FUA data replaced by an older write"
            );
            lost_other |= img[4096] == 0;
        }
        assert!(lost_other, "the unrelated unflushed write was never lost");
    }
}
