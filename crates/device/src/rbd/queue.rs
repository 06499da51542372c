//! The RBD backend's native request queue ([`crate::BlockDevice::queue`]).
//!
//! Every request is one `rbd_aio_*` call with its own completion (no
//! callback), so up to `depth` requests are in librbd at once:
//!
//! * read: `rbd_aio_readv` into the owned buffer; fewer bytes than asked is
//!   an error;
//! * write (one buffer or vectored): `rbd_aio_writev` over the buffers as
//!   they are (no copy). A queued write carries at most
//!   [`crate::IOV_MAX`] buffers (refused at push otherwise), which is
//!   [`super::MAX_IOV`], so no bounce buffer is ever needed here;
//! * durable (FUA) write: librbd has no per-write FUA, so it runs in two
//!   stages: the write, then, once it completed, an `rbd_aio_flush`; the
//!   request completes when the flush did (a failed write skips the flush);
//! * flush: `rbd_aio_flush`;
//! * write_zeroes: `rbd_aio_write_zeroes`, in pieces of at most
//!   [`super::ZEROES_STEP`] run one after another (as the synchronous call).
//!
//! Ordering is enforced here, on the owner's thread, as in the pread pool's
//! queue: submitted requests wait in `held`, and one starts only when no
//! ordered request is running and, if it is ordered itself, when nothing is
//! running. The owner learns of completions only in `submit` and `reap`, so
//! held requests are started from there.
//!
//! `reap` sweeps the running requests with `rbd_aio_is_complete` (oldest
//! first) and, while fewer than `min` completions are ready, blocks in
//! `rbd_aio_wait_for_complete` on the oldest request still running, then
//! sweeps again. Dropping the queue waits for every running request: librbd
//! reads and writes the buffers the queue owns until then.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::io;

use super::{ffi, Completion, RbdDevice, MAX_IOV, ZEROES_STEP};
use crate::queue::{
    check_depth, check_mutation, check_push, queue_or_refuse, IoDone, IoOp, IoQueue, IoRequest,
    Refused, IOV_MAX,
};
use crate::{DeviceError, Result};

// Every queued write fits one `rbd_aio_writev` (check_push refuses more
// than IOV_MAX buffers).
const _: () = assert!(IOV_MAX <= MAX_IOV);

/// What a running request is waiting for.
#[derive(Clone, Copy, Debug)]
enum Stage {
    /// A read of `len` bytes at `offset` into the request's iovecs.
    Read { offset: u64, len: u64 },
    /// The write of the request's iovecs at `offset`; a `durable` one
    /// flushes next.
    Write { offset: u64, durable: bool },
    /// A flush (the request's own, or a durable write's second stage).
    Flush,
    /// Zeroing `[offset, offset + piece)`; the request zeroes up to `end`.
    Zeroes { offset: u64, piece: u64, end: u64 },
}

impl Stage {
    /// The first piece of zeroing `[offset, end)`.
    fn zeroes(offset: u64, end: u64) -> Self {
        Stage::Zeroes {
            offset,
            piece: (end - offset).min(ZEROES_STEP),
            end,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Stage::Read { .. } => "rbd read",
            Stage::Write { .. } => "rbd write",
            Stage::Flush => "rbd flush",
            Stage::Zeroes { .. } => "rbd write zeroes",
        }
    }
}

/// A request in librbd.
struct Running {
    // Field order is drop order: the completion (whose drop waits for a
    // request still in flight) goes before the memory the request uses.
    comp: Completion,
    /// The iovecs handed to librbd (a read keeps using the array until it
    /// completes, so it lives as long as the request).
    iov: Vec<libc::iovec>,
    req: IoRequest,
    tag: u64,
    stage: Stage,
}

// SAFETY: the raw pointers are the librbd completion (which may be waited
// for, polled and released from any thread) and iovecs into the buffers this
// request owns (`IoBuf`/`IoBufMut` are `Send`); nothing is shared with
// another thread except through librbd, which synchronizes internally.
unsafe impl Send for Running {}

impl Running {
    /// Starts `stage` on a fresh completion (the previous stage's, if any,
    /// has completed and is released).
    fn begin(&mut self, dev: &RbdDevice, stage: Stage) -> Result<()> {
        if self.comp.submitted {
            self.comp = Completion::new(&dev.name)?;
        }
        self.stage = stage;
        let (img, c) = (dev.image.0, self.comp.c);
        let iov = self.iov.as_ptr();
        // At most MAX_IOV (1024) entries: fits a c_int.
        let iovcnt = self.iov.len() as c_int;
        let (call, r) = match stage {
            // SAFETY: an open image and a fresh completion; `iov` points at
            // `iovcnt` iovecs over the request's own buffer, and both the
            // array and the buffer live in this `Running` until the
            // completion is seen complete (reap) or waited for (drop).
            Stage::Read { offset, .. } => ("rbd_aio_readv", unsafe {
                ffi::rbd_aio_readv(img, iov, iovcnt, offset, c)
            }),
            // SAFETY: as for the read: the array and the buffers it points
            // at are owned by this request until its completion is seen.
            Stage::Write { offset, .. } => ("rbd_aio_writev", unsafe {
                ffi::rbd_aio_writev(img, iov, iovcnt, offset, c)
            }),
            // SAFETY: an open image and a fresh completion; no buffer.
            Stage::Flush => ("rbd_aio_flush", unsafe { ffi::rbd_aio_flush(img, c) }),
            // SAFETY: an open image and a fresh completion; no buffer. The
            // piece is at most ZEROES_STEP, so it fits usize.
            Stage::Zeroes { offset, piece, .. } => ("rbd_aio_write_zeroes", unsafe {
                ffi::rbd_aio_write_zeroes(img, offset, piece as usize, c, 0, 0)
            }),
        };
        self.comp.submitted(call, &dev.name, r)
    }

    /// The stage running now completed: starts the next one, or returns
    /// the request's result.
    fn advance(&mut self, dev: &RbdDevice) -> Option<Result<()>> {
        let stage = self.stage;
        let n = match self.comp.result(stage.name(), &dev.name) {
            Ok(n) => n,
            Err(e) => return Some(Err(dev.health.failed(stage.name(), e))),
        };
        if let Stage::Write { .. } | Stage::Zeroes { .. } = stage {
            // librbd clips a write across a shrunk image's new end and
            // reports success: none of it may count as written.
            if let Err(e) = dev.health.poll_size(stage.name()) {
                return Some(Err(e));
            }
        }
        let next = match stage {
            Stage::Read { len, .. } if n != len => {
                let short = DeviceError::io(
                    "rbd read",
                    dev.name.clone(),
                    io::Error::new(io::ErrorKind::UnexpectedEof, format!("{n} of {len} bytes")),
                );
                return Some(Err(dev.health.failed("rbd read", short)));
            }
            Stage::Write { durable: true, .. } => Stage::Flush,
            Stage::Zeroes { offset, piece, end } if offset + piece < end => {
                Stage::zeroes(offset + piece, end)
            }
            _ => return Some(Ok(())),
        };
        match self.begin(dev, next) {
            Ok(()) => None,
            Err(e) => Some(Err(e)),
        }
    }

    fn finish(self, result: Result<()>) -> IoDone {
        IoDone {
            tag: self.tag,
            result,
            req: self.req,
        }
    }
}

/// How a request fared when it was started.
enum Started {
    Running(Running),
    /// Completed at once: nothing to do (no bytes), or it could not start.
    Done(IoDone),
}

/// Starts `req` in librbd.
fn start(dev: &RbdDevice, mut req: IoRequest, tag: u64) -> Started {
    let mut iov = Vec::new();
    let first = match &mut req.op {
        IoOp::Read { offset, buf } => {
            let b = buf.bytes_mut();
            iov.push(libc::iovec {
                iov_base: b.as_mut_ptr().cast::<c_void>(),
                iov_len: b.len(),
            });
            Some(Stage::Read {
                offset: *offset,
                len: b.len() as u64,
            })
        }
        IoOp::Write {
            offset,
            bufs,
            durable,
        } => {
            // Empty pieces are left out (librbd is given only bytes).
            iov.extend(
                bufs.iter()
                    .map(|b| b.bytes())
                    .filter(|b| !b.is_empty())
                    .map(|b| libc::iovec {
                        iov_base: b.as_ptr().cast_mut().cast::<c_void>(),
                        iov_len: b.len(),
                    }),
            );
            Some(Stage::Write {
                offset: *offset,
                durable: *durable,
            })
        }
        IoOp::Flush => Some(Stage::Flush),
        IoOp::WriteZeroes { offset, len } => Some(Stage::zeroes(*offset, *offset + *len)),
    };
    // Nothing to transfer: a zero-length read, write or zeroing completes
    // at once (a durable write of nothing is just its flush).
    let first = match first {
        Some(Stage::Read { len: 0, .. }) | Some(Stage::Zeroes { piece: 0, .. }) => None,
        Some(Stage::Write { durable, .. }) if iov.is_empty() => durable.then_some(Stage::Flush),
        other => other,
    };
    let Some(first) = first else {
        return Started::Done(IoDone {
            tag,
            result: Ok(()),
            req,
        });
    };
    // After a timeout, or on a shrunk image, a mutation is refused here
    // (see `Health::check_mutation`).
    if !matches!(first, Stage::Read { .. }) {
        if let Err(e) = dev.health.check_mutation(first.name()) {
            return Started::Done(IoDone {
                tag,
                result: Err(e),
                req,
            });
        }
    }
    let comp = match Completion::new(&dev.name) {
        Ok(c) => c,
        Err(e) => {
            return Started::Done(IoDone {
                tag,
                result: Err(e),
                req,
            })
        }
    };
    let mut run = Running {
        comp,
        iov,
        req,
        tag,
        stage: first,
    };
    match run.begin(dev, first) {
        Ok(()) => Started::Running(run),
        Err(e) => Started::Done(run.finish(Err(e))),
    }
}

/// A queue on an RBD image (see the module docs).
pub(super) struct RbdQueue<'a> {
    dev: &'a RbdDevice,
    depth: u32,
    /// Pushed, not yet submitted.
    queued: VecDeque<(IoRequest, u64)>,
    /// Submitted, not started yet: held back by a barrier.
    held: VecDeque<(IoRequest, u64)>,
    /// In librbd, oldest first.
    running: VecDeque<Running>,
    /// Completed, not yet reaped, in the order they were found.
    ready: Vec<IoDone>,
}

impl<'a> RbdQueue<'a> {
    pub(super) fn new(dev: &'a RbdDevice, depth: u32) -> Result<Self> {
        check_depth(depth)?;
        Ok(Self {
            dev,
            depth,
            queued: VecDeque::new(),
            held: VecDeque::new(),
            running: VecDeque::new(),
            ready: Vec::new(),
        })
    }

    /// Starts every held request ordering allows: none while an ordered
    /// request runs, and an ordered one only when nothing runs.
    fn pump(&mut self) {
        while let Some((front, _)) = self.held.front() {
            let barrier = self.running.iter().any(|r| r.req.ordered);
            if barrier || (front.ordered && !self.running.is_empty()) {
                return;
            }
            let Some((req, tag)) = self.held.pop_front() else {
                return;
            };
            match start(self.dev, req, tag) {
                Started::Running(r) => self.running.push_back(r),
                Started::Done(done) => self.ready.push(done),
            }
        }
    }

    /// Moves every running request whose last stage completed to `ready`
    /// (starting the next stage of those that have one), oldest first.
    fn sweep(&mut self) {
        let mut i = 0;
        while let Some(r) = self.running.get_mut(i) {
            if !r.comp.is_complete() {
                i += 1;
                continue;
            }
            match r.advance(self.dev) {
                None => i += 1,
                Some(result) => {
                    if let Some(r) = self.running.remove(i) {
                        self.ready.push(r.finish(result));
                    }
                }
            }
        }
    }
}

impl IoQueue for RbdQueue<'_> {
    fn depth(&self) -> u32 {
        self.depth
    }

    fn push(&mut self, mut req: IoRequest, tag: u64) -> std::result::Result<(), Refused> {
        let checked = check_push(
            &mut req,
            self.in_flight(),
            self.depth,
            self.dev.size,
            super::RBD_BLOCK_SIZE,
        )
        .and_then(|()| check_mutation(&req.op, || self.dev.check_writable()));
        queue_or_refuse(checked, req, tag, &mut self.queued)
    }

    fn submit(&mut self) -> Result<()> {
        self.held.extend(self.queued.drain(..));
        // A barrier that completed since the last look lets more start.
        self.sweep();
        self.pump();
        Ok(())
    }

    fn reap(&mut self, min: u32, out: &mut Vec<IoDone>) -> Result<usize> {
        self.held.extend(self.queued.drain(..));
        let want = (min as usize).min(self.in_flight() as usize);
        loop {
            self.sweep();
            self.pump();
            if self.ready.len() >= want {
                break;
            }
            // Short of `want` (at most in_flight): something is running,
            // since pump() leaves requests held only behind a running one.
            let Some(oldest) = self.running.front_mut() else {
                return Err(DeviceError::Invalid(format!(
                    "{}: queue has {} held requests and none running",
                    self.dev.name,
                    self.held.len()
                )));
            };
            oldest.comp.wait_done();
        }
        let n = self.ready.len();
        out.append(&mut self.ready);
        Ok(n)
    }

    fn in_flight(&self) -> u32 {
        (self.queued.len() + self.held.len() + self.running.len() + self.ready.len()) as u32
    }
}

impl Drop for RbdQueue<'_> {
    fn drop(&mut self) {
        // librbd still reads or fills the buffers of running requests: wait
        // for each before its memory is freed (each Completion's drop would
        // too; this does not depend on field order). A durable write still
        // in its write stage gets no flush after it: nobody will see its
        // completion.
        for r in &mut self.running {
            r.comp.wait_done();
        }
    }
}
