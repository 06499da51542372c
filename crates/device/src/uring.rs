//! io_uring backend.
//!
//! # Design: one ring per thread
//!
//! Every thread that does I/O gets its own io_uring instance, created lazily
//! on first use and kept in a `thread_local!` for the life of the thread. It
//! is shared by all devices that thread uses (the file descriptor travels in
//! each SQE, not in the ring). Consequences:
//!
//! * independent threads never contend on a ring lock, nor on a shared
//!   sequence counter or in-flight counter touched by every I/O — the
//!   scaling wall that one atomic shared by all direct I/O becomes);
//! * each call is synchronous: it pushes its SQE(s), enters the kernel with
//!   "submit and wait for one completion", and returns only once the
//!   completion has been reaped. At most one request per thread is in the
//!   kernel, so the buffers the SQE points at (the caller's slices, our iovec
//!   array, or a bounce buffer) are borrowed for the whole time the kernel
//!   may touch them. Concurrency comes from many threads, not queue depth —
//!   for queue depth from one thread, [`BlockDevice::queue`] gives a queue
//!   with its own ring and owned buffers (`uring/queue.rs`);
//! * a ring is set up with `SINGLE_ISSUER | COOP_TASKRUN` where the kernel
//!   allows it (only its own thread ever submits), plain otherwise.
//!
//! Requests are vectored (`IORING_OP_READV` / `IORING_OP_WRITEV`), split at
//! `IOV_MAX` (1024) iovecs per SQE, and short completions are resubmitted for
//! the remainder. A flush is `IORING_OP_FSYNC` with `IORING_FSYNC_DATASYNC`.
//! Zeroing and allocation queries are rare and use the synchronous helpers
//! of the portable backend.
//!
//! With `O_DIRECT`, a request whose buffers are not all aligned to the
//! logical block size (address or length) is bounced through one
//! [`AlignedBuf`]; callers on hot paths pass aligned buffers and pay no copy.
//!
//! [`IoPriority::Background`] sets the SQE's `ioprio` to the idle class so
//! background commit and checkpoint writes do not starve reads;
//! [`IoPriority::Urgent`] leaves the task's default (best effort).

mod queue;

use std::cell::RefCell;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::{Once, OnceLock};

use io_uring::{opcode, squeue, types, IoUring};

use crate::file::{
    advance_iovecs, check_writable, needs_bounce, transfer_all, DeviceFile, IOV_MAX,
};
use crate::{
    check_request, iov_len, iov_len_mut, AlignedBuf, BlockDevice, DeviceError, IoPriority, Result,
    WriteReq,
};

/// Submission queue size of each per-thread ring: a single request has one
/// entry in flight; a [`BlockDevice::write_batch`] submits up to this many at
/// once (the queue depth one thread gets without any helper thread).
const RING_ENTRIES: u32 = 32;

/// `IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT`, level 0.
const IOPRIO_IDLE: u16 = 3 << 13;

/// How often a request completing with `EINTR`/`EAGAIN` is resubmitted
/// before the error is returned (a bound, so a stuck device cannot spin us).
const RETRIES_MAX: u32 = 100;

/// Result of the one-time probe: `Err(errno)` if the kernel refused a ring.
static PROBE: OnceLock<std::result::Result<(), i32>> = OnceLock::new();

/// Checks, once per process, that this process may create io_uring
/// instances (seccomp filters, `kernel.io_uring_disabled` and old kernels
/// refuse with `ENOSYS`/`EPERM`).
pub fn probe() -> Result<()> {
    let res = PROBE.get_or_init(|| match new_ring() {
        Ok(_ring) => Ok(()),
        Err(e) => Err(e.raw_os_error().unwrap_or(libc::ENOSYS)),
    });
    match *res {
        Ok(()) => Ok(()),
        Err(errno) => Err(DeviceError::io(
            "io_uring_setup",
            "this process",
            io::Error::from_raw_os_error(errno),
        )),
    }
}

/// Logs, once per process, that io_uring is unavailable and why.
pub fn log_fallback_once(e: &DeviceError) {
    static LOGGED: Once = Once::new();
    LOGGED.call_once(|| {
        tracing::warn!(
            "io_uring is unavailable ({e}); using the portable pread/pwrite backend \
             (allow io_uring, e.g. sysctl kernel.io_uring_disabled=0 or the container's \
             seccomp profile, for the faster path)"
        );
    });
}

/// Creates a ring, with the single-issuer flags where the kernel has them.
fn new_ring() -> io::Result<IoUring> {
    let mut builder = IoUring::builder();
    builder.setup_single_issuer().setup_coop_taskrun();
    match builder.build(RING_ENTRIES) {
        Ok(ring) => Ok(ring),
        // EINVAL: a kernel older than the flags (< 6.0); anything else is a
        // real refusal that the plain setup will report too.
        Err(_) => IoUring::new(RING_ENTRIES),
    }
}

/// The calling thread's ring and its request tag.
struct Ring {
    ring: IoUring,
    /// [`crate::fork::generation`] when the ring was made: the thread that
    /// forked, in the child, replaces the ring it inherited.
    fork_generation: u64,
    /// Tag of the next request; only this thread touches it.
    next_user_data: u64,
    /// An entry is stuck in the submission queue: never submit on this ring
    /// again; `with_ring` drops it (the kernel never runs unsubmitted entries).
    poisoned: bool,
}

enum RingSlot {
    Uninit,
    Ready(Box<Ring>),
    /// Creating a ring failed on this thread; it uses the portable path.
    Unavailable,
}

thread_local! {
    static RING: RefCell<RingSlot> = const { RefCell::new(RingSlot::Uninit) };
}

/// Runs `f` with this thread's ring, creating it on first use. Returns
/// `None` if this thread cannot have a ring (the caller falls back to the
/// portable path), which includes a thread whose thread-locals are gone:
/// the main thread during `exit()` runs its C `atexit` handlers (and C++
/// static destructors) after glibc destroyed them, and a `jbdev_close`
/// there used to panic on the ring and abort the volume, losing the
/// writes its flush was to make durable (session 22's adversarial pass).
fn with_ring<R>(f: impl FnOnce(&mut Ring) -> R) -> Option<R> {
    RING.try_with(|slot| {
        let mut slot = slot.borrow_mut();
        let forks = crate::fork::generation();
        if matches!(&*slot, RingSlot::Ready(r) if r.fork_generation != forks) {
            // Inherited across a fork: dropping it unmaps and closes the
            // child's copy only.
            *slot = RingSlot::Uninit;
        }
        if matches!(*slot, RingSlot::Uninit) {
            *slot = match new_ring() {
                Ok(ring) => RingSlot::Ready(Box::new(Ring {
                    ring,
                    fork_generation: forks,
                    next_user_data: 0,
                    poisoned: false,
                })),
                Err(e) => {
                    log_thread_fallback_once(&e);
                    RingSlot::Unavailable
                }
            };
        }
        let RingSlot::Ready(ring) = &mut *slot else {
            return None;
        };
        let out = f(ring);
        if ring.poisoned {
            // Dropping the ring closes it; the next call creates a fresh one.
            *slot = RingSlot::Uninit;
        }
        Some(out)
    })
    .ok()
    .flatten()
}

fn log_thread_fallback_once(e: &io::Error) {
    static LOGGED: Once = Once::new();
    LOGGED.call_once(|| {
        tracing::warn!(
            "could not create an io_uring for a thread ({e}); that thread uses pread/pwrite"
        );
    });
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}

impl Ring {
    /// Submits `entry` and waits for its completion; returns the CQE result
    /// (negative errno on failure).
    ///
    /// # Safety
    ///
    /// Every buffer and iovec array `entry` points at must stay valid (and,
    /// for reads, not be accessed by anyone else) until this returns. This
    /// function does not return while the kernel may still use them: it
    /// either returns the request's completion, or an error from before the
    /// kernel took the request.
    unsafe fn submit_one(&mut self, entry: squeue::Entry) -> io::Result<i32> {
        let tag = self.next_user_data;
        self.next_user_data = self.next_user_data.wrapping_add(1);
        let entry = entry.user_data(tag);
        // SAFETY: the caller guarantees the memory `entry` points at outlives
        // the request, and we wait for its completion below. The queue is
        // empty here (every earlier call reaped its request), so it has room.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            return Err(io::Error::other("io_uring submission queue full"));
        }
        let mut submitted = false;
        let mut retries = 0;
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(n) => submitted |= n > 0,
                // Once the kernel has the entry we must keep waiting (each
                // wait blocks in the kernel); before that, give up eventually.
                Err(e) if is_transient(&e) && (submitted || retries < RETRIES_MAX) => {
                    retries += 1;
                }
                Err(e) => {
                    let taken = submitted || self.ring.submission().is_empty();
                    if !taken {
                        // The kernel never saw the entry. The ring must go
                        // (see `with_ring`): a later submit would send this
                        // stale entry, pointing at memory we give back now.
                        self.poisoned = true;
                        return Err(e);
                    }
                    // IMPORTANT: the kernel owns the caller's memory until the
                    // completion arrives; returning now would be unsound.
                    // Waiting cannot fail on a healthy ring except transiently.
                    tracing::error!("io_uring wait failed with a request in flight: {e}");
                    std::process::abort();
                }
            }
            if self.ring.submission().is_empty() {
                submitted = true;
            }
            let mut cq = self.ring.completion();
            for cqe in &mut cq {
                if cqe.user_data() == tag {
                    return Ok(cqe.result());
                }
                // Not ours: impossible with one request in flight per ring;
                // ignore rather than misattribute it.
            }
        }
    }
}

impl Ring {
    /// Submits `entries` together and waits for all their completions;
    /// returns each one's CQE result, in order.
    ///
    /// # Safety
    ///
    /// As for [`Ring::submit_one`], for every entry: its memory must stay
    /// valid until this returns, and this never returns while the kernel may
    /// still use it (all completions are reaped first; an error is returned
    /// only if the kernel never took the entries).
    unsafe fn submit_many(&mut self, entries: &[squeue::Entry]) -> io::Result<Vec<i32>> {
        debug_assert!(entries.len() <= RING_ENTRIES as usize);
        let base = self.next_user_data;
        self.next_user_data = self.next_user_data.wrapping_add(entries.len() as u64);
        for (i, e) in entries.iter().enumerate() {
            let entry = e.clone().user_data(base.wrapping_add(i as u64));
            // SAFETY: per this function's contract; the queue is empty here
            // (every earlier call reaped all its requests) and holds
            // RING_ENTRIES entries.
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                // Nothing was submitted yet: drop the ring (see `with_ring`)
                // so the entries pushed so far are never sent.
                self.poisoned = true;
                return Err(io::Error::other("io_uring submission queue full"));
            }
        }
        let mut results: Vec<Option<i32>> = vec![None; entries.len()];
        let mut left = entries.len();
        let mut submitted = false;
        let mut retries = 0;
        while left > 0 {
            match self.ring.submit_and_wait(left) {
                Ok(n) => submitted |= n > 0,
                Err(e) if is_transient(&e) && (submitted || retries < RETRIES_MAX) => {
                    retries += 1;
                }
                Err(e) => {
                    if !submitted && self.ring.submission().len() == entries.len() {
                        // The kernel saw none of them.
                        self.poisoned = true;
                        return Err(e);
                    }
                    // IMPORTANT: the kernel owns the caller's memory until
                    // every completion arrived; returning now would be unsound.
                    tracing::error!("io_uring wait failed with requests in flight: {e}");
                    std::process::abort();
                }
            }
            if self.ring.submission().is_empty() {
                submitted = true;
            }
            for cqe in &mut self.ring.completion() {
                let i = cqe.user_data().wrapping_sub(base);
                if let Some(slot) = results.get_mut(i as usize) {
                    if slot.is_none() {
                        *slot = Some(cqe.result());
                        left -= 1;
                    }
                }
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.unwrap_or(-libc::EIO))
            .collect())
    }
}

/// Direction of a vectored transfer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Read,
    Write,
    /// A write that completes only once its data is durable (RWF_DSYNC:
    /// FUA on devices that have it, write + flush otherwise).
    WriteDsync,
}

impl Dir {
    fn op_name(self) -> &'static str {
        match self {
            Dir::Read => "io_uring readv",
            Dir::Write => "io_uring writev",
            Dir::WriteDsync => "io_uring writev (dsync)",
        }
    }
}

/// Transfers all of `iovs` at `offset`, at most `IOV_MAX` iovecs per SQE,
/// resubmitting the rest after a short completion. `iovs` is consumed as a
/// cursor (bases and lengths are advanced).
///
/// # Safety
///
/// Every iovec must describe memory valid for the whole call: readable for
/// `Dir::Write`, writable and not otherwise accessed for `Dir::Read`.
unsafe fn transfer(
    ring: &mut Ring,
    fd: RawFd,
    dir: Dir,
    iovs: &mut [libc::iovec],
    offset: u64,
    ioprio: u16,
    what: &str,
) -> Result<()> {
    transfer_all(iovs, offset, dir == Dir::Read, |chunk, off| {
        let (ptr, count) = (chunk.as_ptr(), chunk.len() as u32);
        let entry = match dir {
            Dir::Read => opcode::Readv::new(types::Fd(fd), ptr, count)
                .offset(off)
                .ioprio(ioprio)
                .build(),
            Dir::Write => opcode::Writev::new(types::Fd(fd), ptr, count)
                .offset(off)
                .ioprio(ioprio)
                .build(),
            Dir::WriteDsync => opcode::Writev::new(types::Fd(fd), ptr, count)
                .offset(off)
                .ioprio(ioprio)
                .rw_flags(libc::RWF_DSYNC)
                .build(),
        };
        // SAFETY: `iovs` (and so `chunk`) lives until we return, and the
        // memory it describes is valid per this function's contract;
        // submit_one returns only after the completion.
        let res = unsafe { ring.submit_one(entry) }?;
        Ok(if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else {
            Ok(res as usize)
        })
    })
    .map_err(|e| DeviceError::io(dir.op_name(), what, e))
}

fn ioprio_of(prio: IoPriority) -> u16 {
    match prio {
        IoPriority::Urgent => 0,
        IoPriority::Background => IOPRIO_IDLE,
    }
}

/// O_DIRECT I/O through one io_uring per thread (see the module docs).
pub struct UringDevice {
    f: DeviceFile,
}

impl UringDevice {
    pub fn new(f: DeviceFile) -> Self {
        Self { f }
    }

    /// Path and kind of the backing, for logs and tests.
    pub fn file(&self) -> &DeviceFile {
        &self.f
    }

    fn read_on_ring(
        &self,
        ring: &mut Ring,
        bufs: &mut [IoSliceMut<'_>],
        offset: u64,
    ) -> Result<()> {
        let fd = self.f.file.as_raw_fd();
        let what = self.f.what();
        if needs_bounce(&self.f, bufs.iter().map(|b| &**b)) {
            // SAFETY: the iovec describes the bounce, borrowed mutably (and
            // touched by nothing else) for the call.
            return crate::file::read_bounced(bufs, |iov| unsafe {
                transfer(ring, fd, Dir::Read, iov, offset, 0, &what)
            });
        }
        let mut iovs = crate::file::read_iovecs(bufs);
        // SAFETY: the iovecs describe `bufs`, which we borrow mutably
        // (exclusively) for the whole call.
        unsafe { transfer(ring, fd, Dir::Read, &mut iovs, offset, 0, &what) }
    }

    fn write_on_ring(
        &self,
        ring: &mut Ring,
        bufs: &[IoSlice<'_>],
        offset: u64,
        ioprio: u16,
        dir: Dir,
    ) -> Result<()> {
        let fd = self.f.file.as_raw_fd();
        let what = self.f.what();
        if needs_bounce(&self.f, bufs.iter().map(|b| &**b)) {
            // SAFETY: the iovec describes the bounce, borrowed for the call.
            return crate::file::write_bounced(bufs, |iov| unsafe {
                transfer(ring, fd, dir, iov, offset, ioprio, &what)
            });
        }
        let mut iovs = crate::file::write_iovecs(bufs);
        // SAFETY: the iovecs describe `bufs`, borrowed for the whole call;
        // a write only reads them.
        unsafe { transfer(ring, fd, dir, &mut iovs, offset, ioprio, &what) }
    }

    fn fsync_on_ring(&self, ring: &mut Ring) -> Result<()> {
        let entry = opcode::Fsync::new(types::Fd(self.f.file.as_raw_fd()))
            .flags(types::FsyncFlags::DATASYNC)
            .build();
        let mut retries = 0;
        loop {
            // SAFETY: an fsync SQE points at no user memory.
            let res = unsafe { ring.submit_one(entry.clone()) }
                .map_err(|e| DeviceError::io("io_uring fsync", self.f.what(), e))?;
            match res {
                0.. => return Ok(()),
                r if -r == libc::EINTR && retries < RETRIES_MAX => retries += 1,
                r => {
                    return Err(DeviceError::io(
                        "io_uring fsync",
                        self.f.what(),
                        io::Error::from_raw_os_error(-r),
                    ))
                }
            }
        }
    }
}

impl UringDevice {
    /// Writes a batch on this thread's ring: up to `RING_ENTRIES` requests
    /// submitted at once, all completions reaped, then any request that
    /// completed short (or transiently failed) finished on its own.
    fn batch_on_ring(&self, ring: &mut Ring, reqs: &[WriteReq<'_>], ioprio: u16) -> Result<()> {
        let fd = self.f.file.as_raw_fd();
        let what = self.f.what();
        // Per request: the iovecs, or a bounce buffer for unaligned memory.
        // Both live until this function returns, after every completion.
        let mut bounces: Vec<Option<AlignedBuf>> = Vec::with_capacity(reqs.len());
        let mut iovs: Vec<Vec<libc::iovec>> = Vec::with_capacity(reqs.len());
        for r in reqs {
            if needs_bounce(&self.f, r.bufs.iter().map(|b| &**b)) {
                let mut b = crate::file::gather(r.bufs);
                iovs.push(vec![libc::iovec {
                    iov_base: b.as_mut_ptr().cast(),
                    iov_len: b.len(),
                }]);
                bounces.push(Some(b));
            } else {
                iovs.push(
                    r.bufs
                        .iter()
                        .map(|b| libc::iovec {
                            // The kernel only reads through a writev iovec.
                            iov_base: b.as_ptr().cast_mut().cast(),
                            iov_len: b.len(),
                        })
                        .collect(),
                );
                bounces.push(None);
            }
        }
        let dir = |r: &WriteReq<'_>| {
            if r.durable {
                Dir::WriteDsync
            } else {
                Dir::Write
            }
        };
        let mut first_err: Option<DeviceError> = None;
        let idx: Vec<usize> = (0..reqs.len()).collect();
        for chunk in idx.chunks(RING_ENTRIES as usize) {
            // Requests with more iovecs than one SQE carries go alone below.
            let (batched, alone): (Vec<usize>, Vec<usize>) =
                chunk.iter().partition(|&&i| iovs[i].len() <= IOV_MAX);
            let entries: Vec<squeue::Entry> = batched
                .iter()
                .map(|&i| {
                    let (ptr, n) = (iovs[i].as_ptr(), iovs[i].len() as u32);
                    let e = opcode::Writev::new(types::Fd(fd), ptr, n)
                        .offset(reqs[i].offset)
                        .ioprio(ioprio);
                    if reqs[i].durable {
                        e.rw_flags(libc::RWF_DSYNC).build()
                    } else {
                        e.build()
                    }
                })
                .collect();
            // SAFETY: every iovec array and the memory it describes (the
            // callers' buffers, borrowed for this call, or `bounces`) lives
            // until we return; submit_many reaps every completion first.
            let results = unsafe { ring.submit_many(&entries) }
                .map_err(|e| DeviceError::io("io_uring writev (batch)", what.clone(), e))?;
            let mut redo: Vec<(usize, usize)> = Vec::new();
            for (&i, &res) in batched.iter().zip(&results) {
                let total: usize = iovs[i].iter().map(|v| v.iov_len).sum();
                match res {
                    r if r >= 0 && r as usize == total => {}
                    // Short (or zero-length) completion: finish it alone.
                    r if r >= 0 => redo.push((i, r as usize)),
                    r if -r == libc::EINTR || -r == libc::EAGAIN => redo.push((i, 0)),
                    r => {
                        first_err.get_or_insert_with(|| {
                            DeviceError::io(
                                dir(&reqs[i]).op_name(),
                                what.clone(),
                                io::Error::from_raw_os_error(-r),
                            )
                        });
                    }
                }
            }
            for (i, done) in redo.into_iter().chain(alone.into_iter().map(|i| (i, 0))) {
                let start = advance_iovecs(&mut iovs[i], 0, done);
                let offset = reqs[i].offset + done as u64;
                // SAFETY: as above; `transfer` waits for its own completions.
                let res = unsafe {
                    transfer(
                        ring,
                        fd,
                        dir(&reqs[i]),
                        &mut iovs[i][start..],
                        offset,
                        ioprio,
                        &what,
                    )
                };
                if let Err(e) = res {
                    first_err.get_or_insert(e);
                }
            }
        }
        drop(bounces);
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A checked vectored write; `Dir::WriteDsync` returns once the data is
    /// durable. Without a ring (this thread could not get one) it falls back
    /// to pwritev, plus a flush for a durable write.
    fn write_checked(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        prio: IoPriority,
        dir: Dir,
    ) -> Result<()> {
        check_request(
            self.f.size_bytes,
            self.f.logical_block_size,
            offset,
            iov_len(bufs),
        )?;
        check_writable(&self.f)?;
        if iov_len(bufs) == 0 {
            return Ok(());
        }
        if dir == Dir::WriteDsync && !self.f.ring_dsync_honoured {
            // The file system may complete the write without the flush
            // RWF_DSYNC asks for (FUSE): write, then flush.
            self.write_checked(bufs, offset, prio, Dir::Write)?;
            return self.flush();
        }
        match with_ring(|ring| self.write_on_ring(ring, bufs, offset, ioprio_of(prio), dir)) {
            Some(res) => res,
            None => {
                crate::file::pwrite_all(&self.f, bufs, offset)?;
                if dir == Dir::WriteDsync {
                    self.flush()?;
                }
                Ok(())
            }
        }
    }
}

impl BlockDevice for UringDevice {
    fn size_bytes(&self) -> u64 {
        self.f.size_bytes
    }

    fn logical_block_size(&self) -> u32 {
        self.f.logical_block_size
    }

    fn read_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> Result<()> {
        check_request(
            self.f.size_bytes,
            self.f.logical_block_size,
            offset,
            iov_len_mut(bufs),
        )?;
        if iov_len_mut(bufs) == 0 {
            return Ok(());
        }
        if let Some(reader) = &self.f.cached {
            return crate::file::pread_cached(&self.f, reader, bufs, offset);
        }
        // Only a thread that cannot have a ring uses the portable path.
        match with_ring(|ring| self.read_on_ring(ring, bufs, offset)) {
            Some(res) => res,
            None => crate::file::pread_all(&self.f, bufs, offset),
        }
    }

    fn try_read_cached(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> Result<bool> {
        crate::file::try_read_cached(&self.f, bufs, offset)
    }

    fn cached_unwritten_bytes(&self) -> Option<u64> {
        crate::file::cached_unwritten_bytes(&self.f)
    }

    fn has_write_cache(&self) -> bool {
        self.f.cached.is_some() && !self.f.read_only
    }

    fn write_cached(&self, bufs: &[IoSlice<'_>], offset: u64) -> Result<()> {
        crate::file::pwrite_cached(&self.f, bufs, offset)
    }

    fn write_vectored_at(&self, bufs: &[IoSlice<'_>], offset: u64, prio: IoPriority) -> Result<()> {
        self.write_checked(bufs, offset, prio, Dir::Write)
    }

    fn write_vectored_durable_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        prio: IoPriority,
    ) -> Result<()> {
        self.write_checked(bufs, offset, prio, Dir::WriteDsync)
    }

    fn write_batch(&self, reqs: &[WriteReq<'_>], prio: IoPriority) -> Result<()> {
        for r in reqs {
            check_request(
                self.f.size_bytes,
                self.f.logical_block_size,
                r.offset,
                iov_len(r.bufs),
            )?;
        }
        check_writable(&self.f)?;
        if !self.f.ring_dsync_honoured && reqs.iter().any(|r| r.durable) {
            // No RWF_DSYNC here (see `write_checked`): every write, then one
            // flush.
            let plain: Vec<WriteReq<'_>> = reqs
                .iter()
                .map(|r| WriteReq {
                    durable: false,
                    ..*r
                })
                .collect();
            self.write_batch(&plain, prio)?;
            return self.flush();
        }
        if reqs.len() <= 1 {
            return reqs.iter().try_for_each(|r| {
                let dir = if r.durable {
                    Dir::WriteDsync
                } else {
                    Dir::Write
                };
                self.write_checked(r.bufs, r.offset, prio, dir)
            });
        }
        match with_ring(|ring| self.batch_on_ring(ring, reqs, ioprio_of(prio))) {
            Some(res) => res,
            None => {
                for r in reqs {
                    crate::file::pwrite_all(&self.f, r.bufs, r.offset)?;
                }
                if reqs.iter().any(|r| r.durable) {
                    self.flush()?;
                }
                Ok(())
            }
        }
    }

    fn flush(&self) -> Result<()> {
        match with_ring(|ring| self.fsync_on_ring(ring)) {
            Some(res) => res,
            None => self
                .f
                .file
                .sync_data()
                .map_err(|e| DeviceError::io("fdatasync", self.f.what(), e)),
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        crate::file::zero_range(&self.f, offset, len)
    }

    fn write_zeroes_allocated(&self, offset: u64, len: u64) -> Result<()> {
        crate::file::zero_range_allocated(&self.f, offset, len)
    }

    fn allocate(&self, offset: u64, len: u64) -> Result<()> {
        crate::file::allocate(&self.f, offset, len)
    }

    fn allocation(&self, offset: u64, len: u64) -> Result<Vec<crate::Extent>> {
        crate::file::allocation(&self.f, offset, len)
    }

    /// A queue with its own ring of `depth` entries (see `uring/queue.rs`).
    /// Where the kernel refuses one more ring, requests run synchronously at
    /// submit (the default queue), after one warning.
    fn queue(&self, depth: u32) -> Result<Box<dyn crate::IoQueue + '_>> {
        if !self.f.ring_dsync_honoured {
            // A ring queue's durable write is one RWF_DSYNC write, which
            // this file system may not make durable: the thread-pool queue
            // writes, then flushes (`write_checked`).
            return Ok(Box::new(crate::queue::SyncQueue::new(
                crate::queue::Synchronous(self),
                depth,
                None,
            )?));
        }
        match queue::UringQueue::new(self, depth) {
            Ok(q) => Ok(Box::new(q)),
            Err(DeviceError::Io { error, .. }) => {
                log_thread_fallback_once(&error);
                Ok(Box::new(crate::queue::SyncQueue::new(
                    crate::queue::Synchronous(self),
                    depth,
                    None,
                )?))
            }
            Err(e) => Err(e),
        }
    }

    fn backend_name(&self) -> &'static str {
        "io_uring"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{open_device, Backend, OpenOptions};

    /// Opens a fresh temp file on the io_uring backend, or None (with a
    /// message) if this kernel/sandbox refuses io_uring.
    fn uring_file(size: u64) -> Option<(tempfile::TempDir, std::sync::Arc<dyn BlockDevice>)> {
        if let Err(e) = probe() {
            eprintln!("SKIP: io_uring unavailable here: {e}");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let opts = OpenOptions {
            backend: Backend::Uring,
            create_size: Some(size),
            ..OpenOptions::default()
        };
        let dev = open_device(&dir.path().join("img"), &opts).unwrap().device;
        assert_eq!(dev.backend_name(), "io_uring");
        Some((dir, dev))
    }

    #[test]
    fn durable_write_round_trips_and_refuses_bad_requests() {
        let Some((_dir, dev)) = uring_file(1 << 20) else {
            return;
        };
        let lbs = dev.logical_block_size() as usize;
        let mut data = AlignedBuf::zeroed(3 * lbs);
        data.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i % 253) as u8);
        let halves: Vec<IoSlice<'_>> = data.chunks(lbs).map(IoSlice::new).collect();
        dev.write_vectored_durable_at(&halves, 2 * lbs as u64, IoPriority::Urgent)
            .unwrap();
        let mut back = AlignedBuf::zeroed(3 * lbs);
        dev.read_at(&mut back, 2 * lbs as u64).unwrap();
        assert!(back[..] == data[..]);
        let one = [IoSlice::new(&data[..lbs])];
        assert!(dev
            .write_vectored_durable_at(&one, (1 << 20) as u64, IoPriority::Urgent)
            .is_err());
        assert!(dev
            .write_vectored_durable_at(&[IoSlice::new(&data[..7])], 0, IoPriority::Urgent)
            .is_err());
    }

    /// A batch larger than the ring, mixing aligned and unaligned (bounced)
    /// memory, plain and durable writes, and a request with more iovecs than
    /// one SQE carries: everything lands where it should; bad requests are
    /// refused before anything is submitted.
    #[test]
    fn write_batch_round_trips() {
        let Some((_dir, dev)) = uring_file(8 << 20) else {
            return;
        };
        let lbs = dev.logical_block_size() as usize;
        let n = RING_ENTRIES as usize * 2 + 3;
        let aligned: Vec<AlignedBuf> = (0..n)
            .map(|i| {
                let mut b = AlignedBuf::zeroed(2 * lbs);
                b.fill(i as u8 + 1);
                b
            })
            .collect();
        // Unaligned memory: a Vec sliced at an odd offset.
        let odd: Vec<u8> = (0..=2 * lbs).map(|i| (i % 7) as u8 + 100).collect();
        let many = AlignedBuf::zeroed((IOV_MAX + 10) * lbs);
        let many_slices: Vec<IoSlice<'_>> = many.chunks(lbs).map(IoSlice::new).collect();
        let slices: Vec<[IoSlice<'_>; 1]> = aligned.iter().map(|b| [IoSlice::new(b)]).collect();
        let odd_slice = [IoSlice::new(&odd[1..])];
        let mut reqs: Vec<WriteReq<'_>> = slices
            .iter()
            .enumerate()
            .map(|(i, s)| WriteReq {
                offset: (i * 2 * lbs) as u64,
                bufs: s,
                durable: i % 3 == 0,
            })
            .collect();
        let odd_at = (n * 2 * lbs) as u64;
        reqs.push(WriteReq {
            offset: odd_at,
            bufs: &odd_slice,
            durable: true,
        });
        let many_at = odd_at + 2 * lbs as u64;
        reqs.push(WriteReq {
            offset: many_at,
            bufs: &many_slices,
            durable: false,
        });
        dev.write_batch(&reqs, IoPriority::Urgent).unwrap();
        for (i, b) in aligned.iter().enumerate() {
            let mut back = AlignedBuf::zeroed(2 * lbs);
            dev.read_at(&mut back, (i * 2 * lbs) as u64).unwrap();
            assert!(back[..] == b[..], "request {i}");
        }
        let mut back = AlignedBuf::zeroed(2 * lbs);
        dev.read_at(&mut back, odd_at).unwrap();
        assert!(back[..] == odd[1..]);
        // Out of range: refused, nothing written.
        let bad = [WriteReq {
            offset: dev.size_bytes(),
            bufs: &odd_slice,
            durable: false,
        }];
        assert!(dev.write_batch(&bad, IoPriority::Urgent).is_err());
    }

    #[test]
    fn more_than_iov_max_iovecs_round_trip() {
        let Some((_dir, dev)) = uring_file(4 << 20) else {
            return;
        };
        let lbs = dev.logical_block_size() as usize;
        // 1500 aligned one-block buffers: two SQEs, split at IOV_MAX.
        let count = IOV_MAX + 476;
        let mut data = AlignedBuf::zeroed(count * lbs);
        for (i, b) in data.chunks_mut(lbs).enumerate() {
            b.fill((i % 251) as u8);
        }
        let slices: Vec<IoSlice<'_>> = data.chunks(lbs).map(IoSlice::new).collect();
        dev.write_vectored_at(&slices, lbs as u64, IoPriority::Background)
            .unwrap();
        let mut back = AlignedBuf::zeroed(count * lbs);
        let mut out: Vec<IoSliceMut<'_>> = back.chunks_mut(lbs).map(IoSliceMut::new).collect();
        dev.read_vectored_at(&mut out, lbs as u64).unwrap();
        drop(out);
        assert!(back[..] == data[..]);
        dev.flush().unwrap();
    }

    #[test]
    fn transfer_writes_many_odd_sized_iovecs() {
        // Drive `transfer` directly with 7-byte iovecs on a buffered file
        // (no alignment rules), at an odd offset.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![0u8; 8192]).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        if probe().is_err() {
            eprintln!("SKIP: io_uring unavailable here");
            return;
        }
        let payload: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8).collect();
        let mut iovs: Vec<libc::iovec> = payload
            .chunks(7)
            .map(|c| libc::iovec {
                iov_base: c.as_ptr().cast_mut().cast(),
                iov_len: c.len(),
            })
            .collect();
        with_ring(|ring| {
            // SAFETY: the iovecs point into `payload`, alive for the call.
            unsafe {
                transfer(
                    ring,
                    file.as_raw_fd(),
                    Dir::Write,
                    &mut iovs,
                    100,
                    0,
                    "test",
                )
            }
        })
        .expect("a ring")
        .unwrap();
        // The cursor consumed every iovec.
        assert!(iovs.iter().all(|v| v.iov_len == 0));
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(&on_disk[100..3100], &payload[..]);
        assert!(on_disk[..100].iter().all(|&b| b == 0));
    }

    #[test]
    fn advance_moves_the_cursor_inside_and_across_iovecs() {
        let mut mem = [0u8; 30];
        let base = mem.as_mut_ptr();
        let mut iovs: Vec<libc::iovec> = [10usize, 5, 15]
            .iter()
            .scan(0usize, |at, &len| {
                let iov = libc::iovec {
                    iov_base: base.wrapping_add(*at).cast(),
                    iov_len: len,
                };
                *at += len;
                Some(iov)
            })
            .collect();
        // 4 bytes: still inside the first iovec.
        assert_eq!(advance_iovecs(&mut iovs, 0, 4), 0);
        assert_eq!(iovs[0].iov_len, 6);
        assert_eq!(iovs[0].iov_base.cast::<u8>(), base.wrapping_add(4));
        // 6 + 5 + 3 bytes: finishes two iovecs, 3 into the third.
        assert_eq!(advance_iovecs(&mut iovs, 0, 14), 2);
        assert_eq!(
            (iovs[0].iov_len, iovs[1].iov_len, iovs[2].iov_len),
            (0, 0, 12)
        );
        assert_eq!(iovs[2].iov_base.cast::<u8>(), base.wrapping_add(18));
        // The rest: past the end.
        assert_eq!(advance_iovecs(&mut iovs, 2, 12), 3);
    }

    #[test]
    fn each_thread_gets_its_own_ring() {
        if probe().is_err() {
            eprintln!("SKIP: io_uring unavailable here");
            return;
        }
        let ring_fd = || with_ring(|r| r.ring.as_raw_fd()).expect("a ring");
        let here = ring_fd();
        assert_eq!(here, ring_fd(), "a thread reuses its ring");
        // Compare while both threads (and so both rings) are alive: a closed
        // ring's descriptor number could be reused.
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(ring_fd()).unwrap();
            done_rx.recv().unwrap();
        });
        let other = rx.recv().unwrap();
        assert_ne!(here, other, "threads share no ring");
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }
}
