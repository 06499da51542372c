//! The io_uring request queue: one ring per [`crate::IoQueue`].
//!
//! Each queue has its own ring with `depth` submission entries (the kernel
//! rounds up to a power of two, and gives the completion queue twice that),
//! so the requests of a queue never wait for room and never overflow the
//! completion queue: a queue holds at most `depth` requests and each has at
//! most one entry in the kernel. `push` only stores the request; `submit`
//! builds one SQE per request and enters the kernel once; `reap` submits,
//! waits with one `io_uring_enter` for as many completions as it needs, and
//! resubmits the rest of a request that completed short (or with `EINTR` /
//! `EAGAIN`) before reporting it. [`crate::IoRequest::ordered`] is
//! `IOSQE_IO_DRAIN`. A write of one buffer is `IORING_OP_WRITE`; a vectored
//! write is `IORING_OP_WRITEV` with its iovec array owned by the request's
//! slot (one SQE, at most `IOV_MAX` iovecs); unaligned memory of either is
//! gathered into one bounce buffer.
//!
//! The ring is not set up `SINGLE_ISSUER` (unlike the per-thread rings):
//! a queue is `Send`, so its owner may move it to another thread.
//!
//! Zeroing is not an io_uring operation on block devices (`BLKZEROOUT` is an
//! ioctl), so a `write_zeroes` runs synchronously at submit on the owner's
//! thread, after every earlier request of the queue completed: a barrier
//! both ways, like an ordered request. Zeroing is rare (discard); a plain
//! rule beats a second path.
//!
//! # Memory safety
//!
//! The kernel reads and writes buffers the queue owns (the requests' boxed
//! buffers, or a bounce buffer) while a request is in flight. The queue
//! never touches a request between building its SQE and reaping its CQE,
//! and never frees it before: dropping the queue first waits for every
//! request in the kernel; if even that wait fails, the memory is leaked
//! rather than freed under the kernel.

use std::collections::VecDeque;
use std::io;
use std::os::unix::io::AsRawFd;

use io_uring::{opcode, squeue, types, IoUring};

use super::{ioprio_of, is_transient, UringDevice, RETRIES_MAX};
use crate::file::{advance_iovecs, check_writable, gather, needs_bounce, zero_range};
use crate::queue::{
    check_depth, check_push, write_len, write_slices, IoDone, IoOp, IoQueue, IoRequest, Refused,
};
use crate::{AlignedBuf, DeviceError, Result};

/// The iovec array of a vectored write in the kernel (`IORING_OP_WRITEV`
/// may read it until the request completes, not only at submission).
struct Iovecs(Vec<libc::iovec>);

// SAFETY: the pointers in the array point into the buffers of the same
// slot's request (boxed `IoBuf`s, which are `Send`); only the thread that
// owns the queue builds the array, and only the kernel reads it. Nothing is
// shared between threads through it.
unsafe impl Send for Iovecs {}

/// A request the queue holds, from push to reap.
struct Slot {
    req: IoRequest,
    tag: u64,
    /// The aligned copy an O_DIRECT request of unaligned memory goes through
    /// (all buffers of a vectored write gathered into one).
    bounce: Option<AlignedBuf>,
    /// A vectored write's iovecs (past what already completed), kept alive
    /// and untouched while its SQE is in the kernel.
    iovecs: Iovecs,
    /// Bytes transferred so far (a request may complete short).
    done_bytes: usize,
    retries: u32,
    /// `Some` once the request completed.
    result: Option<Result<()>>,
}

pub(crate) struct UringQueue<'a> {
    dev: &'a UringDevice,
    ring: IoUring,
    depth: u32,
    /// Indexed by the SQE's `user_data`.
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    /// Pushed, not yet submitted, in push order.
    queued: VecDeque<u32>,
    /// Requests with an SQE in the submission queue or in the kernel.
    in_kernel: usize,
    /// Completed, not yet reaped, in completion order.
    ready: VecDeque<u32>,
}

fn new_queue_ring(depth: u32) -> io::Result<IoUring> {
    let mut builder = IoUring::builder();
    builder.setup_coop_taskrun();
    match builder.build(depth) {
        Ok(ring) => Ok(ring),
        Err(_) => IoUring::new(depth),
    }
}

impl<'a> UringQueue<'a> {
    pub(crate) fn new(dev: &'a UringDevice, depth: u32) -> Result<Self> {
        check_depth(depth)?;
        let ring = new_queue_ring(depth)
            .map_err(|e| DeviceError::io("io_uring_setup (queue)", dev.f.what(), e))?;
        Ok(Self {
            dev,
            ring,
            depth,
            slots: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            queued: VecDeque::new(),
            in_kernel: 0,
            ready: VecDeque::new(),
        })
    }

    fn what(&self) -> String {
        self.dev.f.what()
    }

    /// Builds the SQE for the rest of request `id` and puts it in the
    /// submission queue.
    fn push_sqe(&mut self, id: u32) -> Result<()> {
        let f = &self.dev.f;
        let Some(slot) = self.slots[id as usize].as_mut() else {
            return Err(DeviceError::Invalid(format!("no request in slot {id}")));
        };
        let ioprio = ioprio_of(slot.req.prio);
        let from = slot.done_bytes;
        let entry = match &mut slot.req.op {
            IoOp::Read { offset, buf } => {
                let (fd, direct) = match &f.cached {
                    Some(r) => (r.as_raw_fd(), false),
                    None => (f.file.as_raw_fd(), f.direct),
                };
                let mem = buf.bytes_mut();
                if slot.bounce.is_none() && direct && needs_bounce(f, [&*mem]) {
                    slot.bounce = Some(AlignedBuf::zeroed(mem.len()));
                }
                let mem: &mut [u8] = match &mut slot.bounce {
                    Some(b) => b,
                    None => mem,
                };
                let rest = &mut mem[from..];
                opcode::Read::new(types::Fd(fd), rest.as_mut_ptr(), rest.len() as u32)
                    .offset(*offset + from as u64)
                    .ioprio(ioprio)
                    .build()
            }
            IoOp::Write {
                offset,
                bufs,
                durable,
            } => {
                if slot.bounce.is_none() && needs_bounce(f, bufs.iter().map(|b| b.bytes())) {
                    slot.bounce = Some(gather(&write_slices(bufs)));
                }
                let fd = types::Fd(f.file.as_raw_fd());
                let at = *offset + from as u64;
                let rw_flags = if *durable { libc::RWF_DSYNC } else { 0 };
                let one: Option<&[u8]> = match (&slot.bounce, bufs.as_slice()) {
                    (Some(b), _) => Some(b),
                    (None, [buf]) => Some(buf.bytes()),
                    (None, _) => None,
                };
                match one {
                    Some(mem) => {
                        let rest = &mem[from..];
                        opcode::Write::new(fd, rest.as_ptr(), rest.len() as u32)
                            .offset(at)
                            .ioprio(ioprio)
                            .rw_flags(rw_flags)
                            .build()
                    }
                    None => {
                        // Rebuilt from the buffers at every (re)submission:
                        // the kernel is not using the old array then.
                        let iovs = &mut slot.iovecs.0;
                        iovs.clear();
                        iovs.extend(bufs.iter().map(|b| libc::iovec {
                            iov_base: b.bytes().as_ptr() as *mut libc::c_void,
                            iov_len: b.bytes().len(),
                        }));
                        let idx = advance_iovecs(iovs, 0, from);
                        let rest = &iovs[idx..];
                        opcode::Writev::new(fd, rest.as_ptr(), rest.len() as u32)
                            .offset(at)
                            .ioprio(ioprio)
                            .rw_flags(rw_flags)
                            .build()
                    }
                }
            }
            IoOp::Flush => opcode::Fsync::new(types::Fd(f.file.as_raw_fd()))
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            IoOp::WriteZeroes { .. } => {
                return Err(DeviceError::Invalid(
                    "write_zeroes is not an io_uring request".into(),
                ))
            }
        };
        let flags = if slot.req.ordered {
            squeue::Flags::IO_DRAIN
        } else {
            squeue::Flags::empty()
        };
        let entry = entry.flags(flags).user_data(u64::from(id));
        // SAFETY: the entry points into the slot's buffer (the request's
        // boxed buffers or its bounce buffer: heap memory that does not move
        // when the slot does), at the slot's iovec array (heap memory too,
        // pointing into those buffers) or at no memory (fsync). The slot
        // keeps all of it, untouched, until the entry's completion is
        // reaped, and Drop waits for that or leaks it (see the module docs).
        // The submission queue
        // has room: it has at least `depth` entries and each request has at
        // most one entry in it or in the kernel.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            return Err(DeviceError::io(
                "io_uring push",
                self.what(),
                io::Error::other("submission queue full"),
            ));
        }
        self.in_kernel += 1;
        Ok(())
    }

    /// Enters the kernel: submits what is in the submission queue and waits
    /// for `want` completions; transient failures are retried.
    fn enter(&mut self, want: usize) -> Result<()> {
        let mut retries = 0;
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => return Ok(()),
                Err(e) if is_transient(&e) && retries < RETRIES_MAX => retries += 1,
                Err(e) => return Err(DeviceError::io("io_uring_enter (queue)", self.what(), e)),
            }
        }
    }

    /// Handles every completion in the completion queue: finished requests
    /// go to `ready`, short or transiently failed ones are resubmitted.
    fn drain_completions(&mut self) {
        let cqes: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (id, res) in cqes {
            self.in_kernel -= 1;
            let id = id as u32;
            if let Some(result) = self.complete(id, res) {
                if let Some(slot) = self.slots[id as usize].as_mut() {
                    slot.result = Some(result);
                    self.ready.push_back(id);
                }
            }
        }
    }

    /// What CQE result `res` means for request `id`: `Some(result)` when it
    /// is finished, `None` when the rest was resubmitted.
    fn complete(&mut self, id: u32, res: i32) -> Option<Result<()>> {
        let what = self.what();
        let slot = self.slots.get_mut(id as usize)?.as_mut()?;
        let (total, op) = match &mut slot.req.op {
            IoOp::Read { buf, .. } => (buf.bytes_mut().len(), "io_uring read (queue)"),
            IoOp::Write { bufs, .. } => (write_len(bufs) as usize, "io_uring write (queue)"),
            IoOp::Flush => (0, "io_uring fsync (queue)"),
            IoOp::WriteZeroes { .. } => (0, "write_zeroes"),
        };
        let retry = match res {
            r if r < 0 && (-r == libc::EINTR || -r == libc::EAGAIN) => {
                slot.retries += 1;
                slot.retries <= RETRIES_MAX
            }
            r if r < 0 => {
                return Some(Err(DeviceError::io(
                    op,
                    what,
                    io::Error::from_raw_os_error(-r),
                )))
            }
            _ if matches!(slot.req.op, IoOp::Flush) => return Some(Ok(())),
            0 => {
                let kind = match slot.req.op {
                    IoOp::Read { .. } => io::ErrorKind::UnexpectedEof,
                    _ => io::ErrorKind::WriteZero,
                };
                return Some(Err(DeviceError::io(op, what, kind.into())));
            }
            r => {
                slot.done_bytes += r as usize;
                slot.done_bytes < total
            }
        };
        if !retry {
            if res < 0 {
                return Some(Err(DeviceError::io(
                    op,
                    what,
                    io::Error::from_raw_os_error(-res),
                )));
            }
            // Finished: a bounced read hands its data to the caller's buffer.
            if let (IoOp::Read { buf, .. }, Some(b)) = (&mut slot.req.op, &slot.bounce) {
                buf.bytes_mut().copy_from_slice(b);
            }
            return Some(Ok(()));
        }
        // The rest of the request (it keeps its drain flag: it then waits
        // for everything in flight, a superset of what it must wait for).
        match self.push_sqe(id) {
            Ok(()) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Waits until nothing of this queue is in the kernel.
    fn wait_idle(&mut self) -> Result<()> {
        while self.in_kernel > 0 {
            self.enter(1)?;
            self.drain_completions();
        }
        Ok(())
    }

    /// Runs a `write_zeroes` (a barrier: see the module docs).
    fn zero_now(&mut self, id: u32) -> Result<()> {
        self.wait_idle()?;
        let result = match self.slots[id as usize].as_ref().map(|s| &s.req.op) {
            Some(IoOp::WriteZeroes { offset, len }) => zero_range(&self.dev.f, *offset, *len),
            _ => return Ok(()),
        };
        if let Some(slot) = self.slots[id as usize].as_mut() {
            slot.result = Some(result);
            self.ready.push_back(id);
        }
        Ok(())
    }
}

impl IoQueue for UringQueue<'_> {
    fn depth(&self) -> u32 {
        self.depth
    }

    fn push(&mut self, mut req: IoRequest, tag: u64) -> std::result::Result<(), Refused> {
        let f = &self.dev.f;
        let mut checked = check_push(
            &mut req,
            self.in_flight(),
            self.depth,
            f.size_bytes,
            f.logical_block_size,
        );
        if checked.is_ok() && matches!(req.op, IoOp::Write { .. } | IoOp::WriteZeroes { .. }) {
            checked = check_writable(f);
        }
        if let Err(error) = checked {
            return Err(Refused { error, req });
        }
        let Some(id) = self.free.pop() else {
            // Unreachable: in_flight < depth means a free slot.
            return Err(Refused {
                error: DeviceError::QueueFull { depth: self.depth },
                req,
            });
        };
        self.slots[id as usize] = Some(Slot {
            req,
            tag,
            bounce: None,
            iovecs: Iovecs(Vec::new()),
            done_bytes: 0,
            retries: 0,
            result: None,
        });
        self.queued.push_back(id);
        Ok(())
    }

    fn submit(&mut self) -> Result<()> {
        self.prepare()?;
        self.enter_if_queued()
    }

    fn reap(&mut self, min: u32, out: &mut Vec<IoDone>) -> Result<usize> {
        self.prepare()?;
        let want = (min as usize).min(self.in_flight() as usize);
        loop {
            self.drain_completions();
            if self.ready.len() >= want || self.in_kernel == 0 {
                // Nothing to wait for; still hand the kernel what is new.
                self.enter_if_queued()?;
                break;
            }
            // One system call submits everything new and waits.
            let need = (want - self.ready.len()).min(self.in_kernel);
            self.enter(need)?;
        }
        let n = self.ready.len();
        for id in self.ready.drain(..) {
            if let Some(slot) = self.slots[id as usize].take() {
                self.free.push(id);
                out.push(IoDone {
                    tag: slot.tag,
                    result: slot.result.unwrap_or_else(|| {
                        Err(DeviceError::Invalid("request reaped unfinished".into()))
                    }),
                    req: slot.req,
                });
            }
        }
        Ok(n)
    }

    fn in_flight(&self) -> u32 {
        self.depth - self.free.len() as u32
    }
}

impl UringQueue<'_> {
    /// Submits what is in the submission queue, if anything.
    fn enter_if_queued(&mut self) -> Result<()> {
        if self.ring.submission().is_empty() {
            return Ok(());
        }
        self.enter(0)
    }

    /// Turns every pushed request into an SQE (or runs it now: zeroing,
    /// empty transfers), in push order; nothing enters the kernel here
    /// except for a zeroing barrier.
    fn prepare(&mut self) -> Result<()> {
        while let Some(&id) = self.queued.front() {
            let (zeroes, empty) = match self.slots[id as usize].as_mut().map(|s| &mut s.req.op) {
                Some(IoOp::WriteZeroes { .. }) => (true, false),
                Some(op) => (false, op.range().is_some_and(|(_, len)| len == 0)),
                None => (false, true),
            };
            if zeroes {
                self.zero_now(id)?;
            } else if empty {
                // Nothing to transfer: done without the kernel.
                if let Some(slot) = self.slots[id as usize].as_mut() {
                    slot.result = Some(Ok(()));
                    self.ready.push_back(id);
                }
            } else {
                self.push_sqe(id)?;
            }
            self.queued.pop_front();
        }
        Ok(())
    }
}

impl Drop for UringQueue<'_> {
    fn drop(&mut self) {
        // IMPORTANT: the kernel may use the slots' memory until every
        // request in it completed; wait for that (no resubmission), or leak.
        while self.in_kernel > 0 {
            if let Err(e) = self.enter(1) {
                tracing::error!(
                    "io_uring queue dropped with {} requests in flight and the wait failed ({e}); \
                     leaking their buffers",
                    self.in_kernel
                );
                Box::leak(Box::new(std::mem::take(&mut self.slots)));
                return;
            }
            let n = self.ring.completion().count();
            self.in_kernel -= n.min(self.in_kernel);
        }
    }
}
