//! The portable backend's request queue: a small bounded pool of threads.
//!
//! `preadv`/`pwritev` block, so requests in flight at once need threads to
//! block in. A [`crate::pread::PreadDevice`] has one pool, created with its
//! first queue and shared by all of them: at most [`POOL_THREADS_MAX`]
//! threads, each started only when a job is waiting and no thread is idle,
//! all joined when the device is dropped. Requests beyond the pool wait in
//! the pool's FIFO; the depth of every queue is what bounds that FIFO. So
//! a queue never costs a thread per request in flight.
//!
//! A worker runs a job (one request) with the same functions as the
//! synchronous calls and sends the completion to the channel of the queue
//! that pushed it. Ordering ([`crate::IoRequest::ordered`]) is enforced by
//! the queue, on its owner's thread: an ordered request is handed to the
//! pool only once nothing earlier of its queue is running, and nothing
//! later is handed over before it completed. Requests held back that way
//! go to the pool at the owner's next `submit` or `reap` (the owner is the
//! only thread that reads the completions, so it learns then that the
//! barrier is gone).
//!
//! Lock order: one lock (the pool's job list); no other lock is taken under it.

use std::collections::VecDeque;
use std::io::IoSliceMut;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::file::{check_writable, pread_all, pwrite_all, zero_range, DeviceFile};
use crate::queue::{
    check_depth, check_mutation, check_push, queue_or_refuse, write_slices, IoDone, IoOp, IoQueue,
    IoRequest, Refused,
};
use crate::{DeviceError, Result};

/// Most threads the pool of one device runs.
pub const POOL_THREADS_MAX: usize = 4;

/// One request handed to the pool; `seq` identifies it to its queue.
struct Job {
    req: IoRequest,
    tag: u64,
    seq: u64,
    reply: mpsc::Sender<(u64, IoDone)>,
}

struct PoolState {
    jobs: VecDeque<Job>,
    idle: usize,
    threads: usize,
    shutdown: bool,
}

struct Shared {
    f: Arc<DeviceFile>,
    state: Mutex<PoolState>,
    wake: Condvar,
}

/// The worker threads of one device.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    pub(crate) fn new(f: Arc<DeviceFile>) -> Self {
        Self {
            shared: Arc::new(Shared {
                f,
                state: Mutex::new(PoolState {
                    jobs: VecDeque::new(),
                    idle: 0,
                    threads: 0,
                    shutdown: false,
                }),
                wake: Condvar::new(),
            }),
            workers: Mutex::new(Vec::new()),
        }
    }

    /// Queues `job`, starting a worker if every one is busy and the pool
    /// is below its bound.
    fn enqueue(&self, job: Job) {
        let mut st = self.shared.state.lock();
        st.jobs.push_back(job);
        if st.jobs.len() <= st.idle || st.threads >= POOL_THREADS_MAX {
            drop(st);
            self.shared.wake.notify_one();
            return;
        }
        st.threads += 1;
        let n = st.threads;
        drop(st);
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("jbdev-pread-{n}"))
            .spawn(move || worker(&shared));
        match spawned {
            Ok(handle) => self.workers.lock().push(handle),
            Err(e) => {
                let mut st = self.shared.state.lock();
                st.threads -= 1;
                tracing::warn!("could not start a pread worker thread: {e}");
                if st.threads == 0 {
                    // Nobody would ever run the jobs: run them here.
                    let jobs: Vec<Job> = st.jobs.drain(..).collect();
                    drop(st);
                    jobs.into_iter().for_each(|j| run_job(&self.shared.f, j));
                }
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.state.lock().shutdown = true;
        self.shared.wake.notify_all();
        // Joined, not detached: the workers hold the device's file, which
        // must be closed (and its lock released) when the device is dropped.
        for handle in self.workers.get_mut().drain(..) {
            let _ = handle.join();
        }
    }
}

fn worker(shared: &Shared) {
    loop {
        let job = {
            let mut st = shared.state.lock();
            loop {
                if let Some(job) = st.jobs.pop_front() {
                    break job;
                }
                if st.shutdown {
                    return;
                }
                st.idle += 1;
                shared.wake.wait(&mut st);
                st.idle -= 1;
            }
        };
        run_job(&shared.f, job);
    }
}

fn run_job(f: &DeviceFile, mut job: Job) {
    // A buffer's `bytes()` is the caller's code: if it panics, the request
    // fails instead of silently vanishing (its queue would wait forever).
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_on_file(f, &mut job.req)
    }))
    .unwrap_or_else(|_| Err(DeviceError::Invalid("a request's buffer panicked".into())));
    let done = IoDone {
        tag: job.tag,
        result,
        req: job.req,
    };
    // The queue may be gone (dropped with requests in flight): nobody waits.
    let _ = job.reply.send((job.seq, done));
}

/// Runs one request with the portable backend's synchronous functions.
pub(crate) fn run_on_file(f: &DeviceFile, req: &mut IoRequest) -> Result<()> {
    let fdatasync = || {
        f.file
            .sync_data()
            .map_err(|e| DeviceError::io("fdatasync", f.what(), e))
    };
    match &mut req.op {
        IoOp::Read { offset, buf } => {
            pread_all(f, &mut [IoSliceMut::new(buf.bytes_mut())], *offset)
        }
        IoOp::Write {
            offset,
            bufs,
            durable,
        } => {
            pwrite_all(f, &write_slices(bufs), *offset)?;
            if *durable {
                fdatasync()?;
            }
            Ok(())
        }
        IoOp::Flush => fdatasync(),
        IoOp::WriteZeroes { offset, len } => zero_range(f, *offset, *len),
    }
}

/// A queue on the pool (see the module docs).
pub(crate) struct PoolQueue<'a> {
    f: &'a DeviceFile,
    pool: &'a Pool,
    depth: u32,
    /// Pushed, not yet submitted.
    queued: VecDeque<(IoRequest, u64)>,
    /// Submitted, held back by ordering.
    held: VecDeque<(IoRequest, u64)>,
    /// Handed to the pool, completion not yet received.
    running: usize,
    /// The ordered request running now, by `seq`.
    barrier: Option<u64>,
    next_seq: u64,
    /// Completions received, not yet reaped.
    ready: VecDeque<IoDone>,
    tx: mpsc::Sender<(u64, IoDone)>,
    rx: mpsc::Receiver<(u64, IoDone)>,
}

impl<'a> PoolQueue<'a> {
    pub(crate) fn new(f: &'a DeviceFile, pool: &'a Pool, depth: u32) -> Result<Self> {
        check_depth(depth)?;
        let (tx, rx) = mpsc::channel();
        Ok(Self {
            f,
            pool,
            depth,
            queued: VecDeque::new(),
            held: VecDeque::new(),
            running: 0,
            barrier: None,
            next_seq: 0,
            ready: VecDeque::new(),
            tx,
            rx,
        })
    }

    /// Hands every request ordering allows to the pool.
    fn pump(&mut self) {
        while let Some((req, _)) = self.held.front() {
            if self.barrier.is_some() || (req.ordered && self.running > 0) {
                return;
            }
            let Some((req, tag)) = self.held.pop_front() else {
                return;
            };
            let seq = self.next_seq;
            self.next_seq += 1;
            if req.ordered {
                self.barrier = Some(seq);
            }
            self.running += 1;
            self.pool.enqueue(Job {
                req,
                tag,
                seq,
                reply: self.tx.clone(),
            });
        }
    }

    fn completed(&mut self, seq: u64, done: IoDone) {
        self.running -= 1;
        if self.barrier == Some(seq) {
            self.barrier = None;
        }
        self.ready.push_back(done);
    }
}

impl IoQueue for PoolQueue<'_> {
    fn depth(&self) -> u32 {
        self.depth
    }

    fn push(&mut self, mut req: IoRequest, tag: u64) -> std::result::Result<(), Refused> {
        let (size, lbs) = (self.f.size_bytes, self.f.logical_block_size);
        let checked = check_push(&mut req, self.in_flight(), self.depth, size, lbs)
            .and_then(|()| check_mutation(&req.op, || check_writable(self.f)));
        queue_or_refuse(checked, req, tag, &mut self.queued)
    }

    fn submit(&mut self) -> Result<()> {
        self.held.extend(self.queued.drain(..));
        self.pump();
        Ok(())
    }

    fn reap(&mut self, min: u32, out: &mut Vec<IoDone>) -> Result<usize> {
        self.submit()?;
        let want = (min as usize).min(self.in_flight() as usize);
        loop {
            while let Ok((seq, done)) = self.rx.try_recv() {
                self.completed(seq, done);
            }
            self.pump();
            if self.ready.len() >= want {
                break;
            }
            // Something is running: `in_flight` counts it, `ready` is short,
            // and pump() hands over whatever can run when nothing is.
            match self.rx.recv() {
                Ok((seq, done)) => self.completed(seq, done),
                // Impossible while we hold `tx`; fail rather than spin.
                Err(_) => return Err(DeviceError::Invalid("pread pool is gone".into())),
            }
        }
        let n = self.ready.len();
        out.extend(self.ready.drain(..));
        Ok(n)
    }

    fn in_flight(&self) -> u32 {
        (self.queued.len() + self.held.len() + self.running + self.ready.len()) as u32
    }
}
