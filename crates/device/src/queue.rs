//! The device as a queue: many requests in flight from one thread, with
//! completions delivered to the thread that waits for them.
//!
//! # Shape
//!
//! [`crate::BlockDevice::queue`] gives an [`IoQueue`] with a fixed `depth`.
//! One thread owns it (it is `Send`, not `Sync`) and
//!
//! 1. [`IoQueue::push`]es requests, each with a caller-chosen `tag`;
//! 2. [`IoQueue::submit`]s them (io_uring: one `io_uring_enter` for all of
//!    them), or lets [`IoQueue::reap`] do it;
//! 3. [`IoQueue::reap`]s completions: at least `min` of them, in the order
//!    they completed (never assume submission order), each an [`IoDone`]
//!    that hands the request, and so its buffer, back with its `tag` and
//!    result.
//!
//! # Why owned buffers
//!
//! A request outlives the `push` call that hands it over, so its memory
//! cannot be a borrow: the queue takes ownership of a boxed [`IoBuf`]
//! (write) or [`IoBufMut`] (read) and gives it back in the completion. The
//! traits are small so the layers above can pass their own buffers without
//! a copy (an `Arc<AlignedBuf>` shared with a cache is an [`IoBuf`]). The
//! queue never touches a buffer between push and completion, so the memory
//! `bytes()` returned at push stays valid for the kernel for that whole time.
//!
//! # Why a completion queue, not callbacks
//!
//! Completions are returned to the owner by `reap`, not run as callbacks on
//! whatever thread finished the I/O: the owner decides when to do the work
//! a completion triggers (the volume's commit protocol needs that ordering
//! in one place), no lock or `Send` closure is needed per request, and a
//! waker can be built on top of `reap` but not the other way round.
//!
//! # Limits
//!
//! * A queue holds at most `depth` requests, counted from `push` until their
//!   completion is returned by `reap` ([`IoQueue::in_flight`]); a `push`
//!   beyond that is refused with [`DeviceError::QueueFull`] and the request
//!   handed back. `depth` is at most [`QUEUE_DEPTH_MAX`].
//! * A request is checked against the device contract
//!   ([`crate::check_request`]) at `push`; a bad one is refused there, with
//!   its buffer handed back, and never reaches the device.
//!
//! # Ordering
//!
//! Requests of a queue are unordered among themselves, like the requests of
//! a disk's queue: a flush covers the writes that *completed* before it
//! started, and a write pushed before a flush may still be running when the
//! flush starts. [`IoRequest::ordered`] makes a request a barrier: it starts
//! only after every earlier request of this queue completed, and no later
//! request of this queue starts before it completed (io_uring's
//! `IOSQE_IO_DRAIN`). The journal's write-data → flush → commit-block is
//! `write, write, ..., flush.ordered(), commit.ordered()`. An ordered request
//! runs even if an earlier one failed: ordering, not a dependency, so a
//! caller that must not write a commit block after a failed data write reaps
//! the data writes first.

use std::any::Any;
use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;

pub use crate::file::IOV_MAX;
use crate::{check_request, AlignedBuf, BlockDevice, DeviceError, IoPriority, Result};

/// The largest depth a queue may have (io_uring rings get this many entries;
/// the test doubles hold this many completions).
pub const QUEUE_DEPTH_MAX: u32 = 4096;

/// Converts a boxed buffer back to `Box<dyn Any>` so its owner can downcast
/// it to the type it pushed. Implemented for every `'static + Send` type.
pub trait IntoAny {
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

impl<T: Any + Send> IntoAny for T {
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// Memory a queued write reads from. `bytes()` must return the same slice
/// every time it is called while the queue holds the buffer (the queue holds
/// it exclusively and never mutates it, so ordinary buffers do).
pub trait IoBuf: IntoAny + Send + 'static {
    fn bytes(&self) -> &[u8];
}

/// Memory a queued read fills. `bytes_mut()` must return the same slice
/// every time it is called while the queue holds the buffer.
pub trait IoBufMut: IntoAny + Send + 'static {
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl IoBuf for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}
impl IoBuf for Box<[u8]> {
    fn bytes(&self) -> &[u8] {
        self
    }
}
impl IoBuf for AlignedBuf {
    fn bytes(&self) -> &[u8] {
        self
    }
}
impl IoBuf for Arc<AlignedBuf> {
    fn bytes(&self) -> &[u8] {
        self
    }
}
impl IoBuf for Arc<[u8]> {
    fn bytes(&self) -> &[u8] {
        self
    }
}
impl IoBuf for Arc<Vec<u8>> {
    fn bytes(&self) -> &[u8] {
        self
    }
}
impl IoBufMut for Vec<u8> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}
impl IoBufMut for Box<[u8]> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}
impl IoBufMut for AlignedBuf {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// What a request does.
pub enum IoOp {
    /// Fills `buf` from `offset`.
    Read { offset: u64, buf: Box<dyn IoBufMut> },
    /// Writes `bufs` back to back from `offset` (one buffer, or several as
    /// one vectored write: at most [`IOV_MAX`], so it is one request to the
    /// device); with `durable` (force unit access) the write completes only
    /// once this data is durable. The total length is checked like any
    /// request's; the single buffers need not be block multiples.
    Write {
        offset: u64,
        bufs: Vec<Box<dyn IoBuf>>,
        durable: bool,
    },
    /// Makes every write that completed before the flush started durable.
    Flush,
    /// Makes `[offset, offset + len)` read back as zeroes.
    WriteZeroes { offset: u64, len: u64 },
}

impl IoOp {
    /// The byte range the request touches (`None` for a flush).
    pub fn range(&mut self) -> Option<(u64, u64)> {
        match self {
            IoOp::Read { offset, buf } => Some((*offset, buf.bytes_mut().len() as u64)),
            IoOp::Write { offset, bufs, .. } => Some((*offset, write_len(bufs))),
            IoOp::WriteZeroes { offset, len } => Some((*offset, *len)),
            IoOp::Flush => None,
        }
    }

    /// Whether the request changes the device.
    pub fn is_mutating(&self) -> bool {
        !matches!(self, IoOp::Read { .. })
    }

    fn name(&self) -> &'static str {
        match self {
            IoOp::Read { .. } => "read",
            IoOp::Write { durable: false, .. } => "write",
            IoOp::Write { durable: true, .. } => "write (FUA)",
            IoOp::Flush => "flush",
            IoOp::WriteZeroes { .. } => "write_zeroes",
        }
    }
}

impl std::fmt::Debug for IoOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IoOp::Read { offset, buf: _ } => write!(f, "Read {{ offset: {offset} }}"),
            IoOp::Write {
                offset, durable, ..
            } => write!(f, "Write {{ offset: {offset}, durable: {durable} }}"),
            IoOp::Flush => write!(f, "Flush"),
            IoOp::WriteZeroes { offset, len } => {
                write!(f, "WriteZeroes {{ offset: {offset}, len: {len} }}")
            }
        }
    }
}

/// One request of an [`IoQueue`]: an operation, whether it is a barrier,
/// and its I/O priority.
#[derive(Debug)]
pub struct IoRequest {
    pub op: IoOp,
    /// Starts only after every earlier request of the queue completed; no
    /// later request starts before it completed (see the module docs).
    pub ordered: bool,
    /// I/O priority (io_uring: the SQE's `ioprio`; the other backends ignore it).
    pub prio: IoPriority,
}

impl IoRequest {
    fn new(op: IoOp) -> Self {
        Self {
            op,
            ordered: false,
            prio: IoPriority::Urgent,
        }
    }

    /// Reads `buf.len()` bytes at `offset` into `buf`.
    pub fn read(offset: u64, buf: impl IoBufMut) -> Self {
        Self::new(IoOp::Read {
            offset,
            buf: Box::new(buf),
        })
    }

    /// Writes `buf` at `offset`.
    pub fn write(offset: u64, buf: impl IoBuf) -> Self {
        Self::write_v(offset, vec![Box::new(buf)])
    }

    /// Writes `bufs` back to back from `offset`: one vectored write (at
    /// most [`IOV_MAX`] buffers; their total length is what must be aligned).
    pub fn write_v(offset: u64, bufs: Vec<Box<dyn IoBuf>>) -> Self {
        Self::new(IoOp::Write {
            offset,
            bufs,
            durable: false,
        })
    }

    /// Writes `buf` at `offset`, completing once the data is durable (FUA).
    pub fn write_durable(offset: u64, buf: impl IoBuf) -> Self {
        Self::new(IoOp::Write {
            offset,
            bufs: vec![Box::new(buf)],
            durable: true,
        })
    }

    /// A cache flush.
    pub fn flush() -> Self {
        Self::new(IoOp::Flush)
    }

    /// Zeroes `[offset, offset + len)`.
    pub fn write_zeroes(offset: u64, len: u64) -> Self {
        Self::new(IoOp::WriteZeroes { offset, len })
    }

    /// This request as a barrier (see [`IoRequest::ordered`]).
    pub fn ordered(mut self) -> Self {
        self.ordered = true;
        self
    }

    /// This request at priority `prio`.
    pub fn with_priority(mut self, prio: IoPriority) -> Self {
        self.prio = prio;
        self
    }

    /// The write buffer, if this is a write of one buffer, downcast to the
    /// type pushed.
    pub fn into_write_buf<T: IoBuf>(self) -> Option<T> {
        let mut bufs = self.into_write_bufs();
        match (bufs.pop(), bufs.is_empty()) {
            (Some(buf), true) => buf.into_any().downcast::<T>().ok().map(|b| *b),
            _ => None,
        }
    }

    /// The buffers of a write, in order (empty for any other request).
    pub fn into_write_bufs(self) -> Vec<Box<dyn IoBuf>> {
        match self.op {
            IoOp::Write { bufs, .. } => bufs,
            _ => Vec::new(),
        }
    }

    /// The read buffer, if this is a read, downcast to the type pushed.
    pub fn into_read_buf<T: IoBufMut>(self) -> Option<T> {
        match self.op {
            IoOp::Read { buf, .. } => buf.into_any().downcast::<T>().ok().map(|b| *b),
            _ => None,
        }
    }
}

/// A completed request: its tag, its result, and the request itself (with
/// its buffer: a read's buffer holds the data when `result` is `Ok`).
#[derive(Debug)]
pub struct IoDone {
    pub tag: u64,
    pub result: Result<()>,
    pub req: IoRequest,
}

/// A request [`IoQueue::push`] did not take, handed back with the reason.
#[derive(Debug)]
pub struct Refused {
    pub error: DeviceError,
    pub req: IoRequest,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} refused: {}", self.req.op.name(), self.error)
    }
}

impl std::error::Error for Refused {}

impl From<Refused> for DeviceError {
    fn from(r: Refused) -> Self {
        r.error
    }
}

/// A request queue owned by one thread (see the module docs).
pub trait IoQueue: Send {
    /// The most requests this queue holds at once.
    fn depth(&self) -> u32;

    /// Queues `req`; it starts at the next [`IoQueue::submit`] or
    /// [`IoQueue::reap`]. Refused (and handed back) when `depth` requests
    /// are already in flight or when it breaks the device contract.
    fn push(&mut self, req: IoRequest, tag: u64) -> std::result::Result<(), Refused>;

    /// Starts every queued request (io_uring: one system call).
    fn submit(&mut self) -> Result<()>;

    /// Submits what is queued, waits until at least `min` completions are
    /// available (at most [`IoQueue::in_flight`]: it never waits for
    /// requests that were never pushed), and appends completions to `out`
    /// in completion order: at least `min`, usually all that are available
    /// (the test doubles hand out a random number from `min` up, so callers
    /// loop on `in_flight`). Returns how many it appended. On io_uring it
    /// enters the kernel once per wait (submitting and waiting together).
    /// An `Err` is a failure of the queue itself (the requests stay in flight
    /// and a later `reap` may return them), never of one request.
    fn reap(&mut self, min: u32, out: &mut Vec<IoDone>) -> Result<usize>;

    /// Requests pushed whose completion `reap` has not returned yet.
    fn in_flight(&self) -> u32;
}

/// Checks a queue's depth at creation.
pub(crate) fn check_depth(depth: u32) -> Result<()> {
    if depth == 0 || depth > QUEUE_DEPTH_MAX {
        return Err(DeviceError::Invalid(format!(
            "queue depth {depth} is out of range: 1 to {QUEUE_DEPTH_MAX}"
        )));
    }
    Ok(())
}

/// Total length of a write's buffers.
pub(crate) fn write_len(bufs: &[Box<dyn IoBuf>]) -> u64 {
    bufs.iter().map(|b| b.bytes().len() as u64).sum()
}

/// A write's buffers as slices for the vectored synchronous calls.
pub(crate) fn write_slices(bufs: &[Box<dyn IoBuf>]) -> Vec<IoSlice<'_>> {
    bufs.iter().map(|b| IoSlice::new(b.bytes())).collect()
}

/// The checks every `push` makes: room in the queue, and the request
/// contract of the device (alignment of the offset and of the total length,
/// range, and what one SQE carries: a length that fits `u32`, at most
/// [`IOV_MAX`] buffers).
pub(crate) fn check_push(
    req: &mut IoRequest,
    in_flight: u32,
    depth: u32,
    dev_size: u64,
    lbs: u32,
) -> Result<()> {
    if in_flight >= depth {
        return Err(DeviceError::QueueFull { depth });
    }
    if let IoOp::Write { bufs, .. } = &req.op {
        if bufs.len() > IOV_MAX {
            return Err(DeviceError::Invalid(format!(
                "a queued write carries at most {IOV_MAX} buffers, not {}",
                bufs.len()
            )));
        }
    }
    if let Some((offset, len)) = req.op.range() {
        check_request(dev_size, lbs, offset, len)?;
        if !matches!(req.op, IoOp::WriteZeroes { .. }) && len > u64::from(u32::MAX) {
            return Err(DeviceError::Invalid(format!(
                "a queued request carries at most {} bytes, not {len}",
                u32::MAX
            )));
        }
    }
    Ok(())
}

/// The end of a `push` that queues requests until `submit`: `req` joins
/// `queued` if `checked` passed, else it goes back to the caller refused.
pub(crate) fn queue_or_refuse(
    checked: Result<()>,
    req: IoRequest,
    tag: u64,
    queued: &mut VecDeque<(IoRequest, u64)>,
) -> std::result::Result<(), Refused> {
    match checked {
        Ok(()) => {
            queued.push_back((req, tag));
            Ok(())
        }
        Err(error) => Err(Refused { error, req }),
    }
}

/// For a device that may refuse changes (read-only): `writable`'s verdict
/// for a request that changes the device (a flush does not), Ok otherwise.
pub(crate) fn check_mutation(op: &IoOp, writable: impl FnOnce() -> Result<()>) -> Result<()> {
    if op.is_mutating() && !matches!(op, IoOp::Flush) {
        writable()
    } else {
        Ok(())
    }
}

/// Runs one request with the synchronous calls of `dev`.
pub(crate) fn run_sync<D: BlockDevice + ?Sized>(dev: &D, req: &mut IoRequest) -> Result<()> {
    match &mut req.op {
        IoOp::Read { offset, buf } => dev.read_at(buf.bytes_mut(), *offset),
        IoOp::Write {
            offset,
            bufs,
            durable: false,
        } => dev.write_vectored_at(&write_slices(bufs), *offset, req.prio),
        IoOp::Write {
            offset,
            bufs,
            durable: true,
        } => dev.write_vectored_durable_at(&write_slices(bufs), *offset, req.prio),
        IoOp::Flush => dev.flush(),
        IoOp::WriteZeroes { offset, len } => dev.write_zeroes(*offset, *len),
    }
}

/// How a [`SyncQueue`] runs a request at submit time. `Ok(Some(id))` / the
/// id passed to `acknowledge` let the fault device know when the caller has
/// seen a write complete (see `fault.rs`).
pub(crate) trait RunNow: Send {
    fn size_bytes(&self) -> u64;
    fn logical_block_size(&self) -> u32;
    /// Runs `req`; returns its result and an id to acknowledge at reap.
    fn run(&mut self, req: &mut IoRequest) -> (Result<()>, Option<u64>);
    /// The completion carrying `id` was returned to the caller (or the
    /// queue was dropped with it unreaped).
    fn acknowledge(&mut self, _id: u64) {}
}

/// Runs requests with a device's synchronous calls.
pub(crate) struct Synchronous<'a, D: ?Sized>(pub &'a D);

impl<D: BlockDevice + ?Sized> RunNow for Synchronous<'_, D> {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn logical_block_size(&self) -> u32 {
        self.0.logical_block_size()
    }
    fn run(&mut self, req: &mut IoRequest) -> (Result<()>, Option<u64>) {
        (run_sync(self.0, req), None)
    }
}

/// A queue that runs each request synchronously, in push order, when it is
/// submitted, and holds the completions until `reap`. The default queue of
/// [`BlockDevice`] (no backend-specific queue: everything keeps working,
/// with depth but without concurrency), and the queue of the test doubles,
/// which deliver completions in a seeded random order and in random-sized
/// groups so that callers cannot come to rely on either.
pub(crate) struct SyncQueue<R: RunNow> {
    run: R,
    depth: u32,
    queued: VecDeque<(IoRequest, u64)>,
    done: Vec<(IoDone, Option<u64>)>,
    /// `Some`: shuffle completions with this generator.
    rng: Option<SplitMix64>,
}

impl<R: RunNow> SyncQueue<R> {
    pub(crate) fn new(run: R, depth: u32, shuffle_seed: Option<u64>) -> Result<Self> {
        check_depth(depth)?;
        Ok(Self {
            run,
            depth,
            queued: VecDeque::new(),
            done: Vec::new(),
            rng: shuffle_seed.map(SplitMix64::new),
        })
    }
}

impl<R: RunNow> IoQueue for SyncQueue<R> {
    fn depth(&self) -> u32 {
        self.depth
    }

    fn push(&mut self, mut req: IoRequest, tag: u64) -> std::result::Result<(), Refused> {
        let (size, lbs) = (self.run.size_bytes(), self.run.logical_block_size());
        let checked = check_push(&mut req, self.in_flight(), self.depth, size, lbs);
        queue_or_refuse(checked, req, tag, &mut self.queued)
    }

    fn submit(&mut self) -> Result<()> {
        while let Some((mut req, tag)) = self.queued.pop_front() {
            let (result, id) = self.run.run(&mut req);
            self.done.push((IoDone { tag, result, req }, id));
        }
        Ok(())
    }

    fn reap(&mut self, min: u32, out: &mut Vec<IoDone>) -> Result<usize> {
        self.submit()?;
        let available = self.done.len();
        let min = (min as usize).min(available);
        let count = match &mut self.rng {
            None => available,
            Some(rng) => {
                // Fisher-Yates over what is available, then hand out a
                // random number of them (at least `min`).
                for i in (1..available).rev() {
                    self.done.swap(i, rng.below(i as u64 + 1) as usize);
                }
                min + rng.below((available - min) as u64 + 1) as usize
            }
        };
        for (done, id) in self.done.drain(..count) {
            if let Some(id) = id {
                self.run.acknowledge(id);
            }
            out.push(done);
        }
        Ok(count)
    }

    fn in_flight(&self) -> u32 {
        (self.queued.len() + self.done.len()) as u32
    }
}

impl<R: RunNow> Drop for SyncQueue<R> {
    fn drop(&mut self) {
        for (_, id) in self.done.drain(..) {
            if let Some(id) = id {
                self.run.acknowledge(id);
            }
        }
    }
}

/// A tiny deterministic generator (SplitMix64): the test doubles' crash
/// images and completion orders must not change when a dependency's RNG does.
#[derive(Clone, Debug)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `[0, n)`; `n > 0`. The modulo bias is irrelevant here.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
