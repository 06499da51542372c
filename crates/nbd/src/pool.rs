//! A bounded, lazily grown pool of worker threads shared by all connections.
//!
//! Requests that may wait are executed here, not on the network threads
//! (which never wait for the device; the one exception is a large write
//! into the page cache, ARCHITECTURE 28a), so that
//! many FUA writes and flushes from one or many connections are inside the
//! volume at the same time and share its group commits. Threads are spawned
//! on demand (when no worker is idle) up to `max_threads`, and then requests
//! queue. A worker holds no lock while it runs a job.
//!
//! Jobs of one export go through its [`Lane`], which lets at most `cap` of
//! them run at once (the server sets the cap below the pool's size when it
//! has several exports): one export whose store stalls (a hung FUSE or NFS
//! mount under it) then holds at most `cap` workers, and the others' jobs
//! still find one. The lane's jobs beyond its cap wait in the lane, not in
//! the pool's queue, so they do not stand in front of other exports' jobs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The jobs of one export: at most `cap` of them run at once; the rest wait
/// here, in order, and are run by the workers of the lane's running jobs as
/// those finish.
pub struct Lane {
    cap: AtomicUsize,
    st: parking_lot::Mutex<LaneState>,
}

struct LaneState {
    running: usize,
    queued: std::collections::VecDeque<Job>,
}

impl Default for Lane {
    fn default() -> Self {
        Self::new(usize::MAX)
    }
}

impl Lane {
    /// A lane that runs at most `cap` (at least 1) jobs at once.
    pub fn new(cap: usize) -> Self {
        Self {
            cap: AtomicUsize::new(cap.max(1)),
            st: parking_lot::Mutex::new(LaneState {
                running: 0,
                queued: std::collections::VecDeque::new(),
            }),
        }
    }

    /// Sets the cap (at least 1) for jobs submitted from now on.
    pub fn set_cap(&self, cap: usize) {
        self.cap.store(cap.max(1), Ordering::Relaxed);
    }

    pub fn cap(&self) -> usize {
        self.cap.load(Ordering::Relaxed)
    }

    /// Jobs of the lane running now, and waiting in it.
    pub fn load(&self) -> (usize, usize) {
        let st = self.st.lock();
        (st.running, st.queued.len())
    }
}

/// Runs `job`, then the lane's waiting jobs until there are none; a
/// panicking job is logged and the lane goes on.
fn run_lane(lane: Arc<Lane>, mut job: Job) {
    loop {
        run_caught(job);
        let mut st = lane.st.lock();
        match st.queued.pop_front() {
            Some(next) => job = next,
            None => {
                st.running -= 1;
                return;
            }
        }
    }
}

/// The pool. Dropping the last handle lets idle workers exit.
pub struct WorkerPool {
    tx: Sender<Job>,
    rx: Receiver<Job>,
    shared: Arc<Counters>,
    max_threads: usize,
}

struct Counters {
    idle: AtomicUsize,
    total: AtomicUsize,
}

/// Stack size of a worker: jobs are shallow (a volume call and a reply).
const WORKER_STACK_BYTES: usize = 256 << 10;

impl WorkerPool {
    pub fn new(max_threads: usize) -> Self {
        let (tx, rx) = crossbeam_channel::unbounded();
        Self {
            tx,
            rx,
            shared: Arc::new(Counters {
                idle: AtomicUsize::new(0),
                total: AtomicUsize::new(0),
            }),
            max_threads: max_threads.max(1),
        }
    }

    /// Number of worker threads started so far.
    pub fn threads(&self) -> usize {
        self.shared.total.load(Ordering::Relaxed)
    }

    /// Queues `job`. Each job claims an idle worker (or a newly started one)
    /// before it is queued, so that below the cap every queued job has a
    /// worker that will take it; at the cap, jobs wait for the next free one.
    pub fn submit(&self, job: impl FnOnce() + Send + 'static) {
        let claimed = self
            .shared
            .idle
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if !claimed {
            self.maybe_spawn();
        }
        // The receiver lives in `self`, so the channel cannot be disconnected.
        let _ = self.tx.send(Box::new(job));
    }

    /// Queues `job` in `lane`: run by a worker now if fewer than the
    /// lane's cap of its jobs run, else when one of them finishes. A lane
    /// whose cap is the whole pool (a server with one export) is the pool
    /// itself: the job goes straight to it, without the lane's lock.
    pub fn submit_in(&self, lane: &Arc<Lane>, job: impl FnOnce() + Send + 'static) {
        if lane.cap() >= self.max_threads {
            return self.submit(job);
        }
        let job: Job = Box::new(job);
        {
            let mut st = lane.st.lock();
            if st.running >= lane.cap() {
                st.queued.push_back(job);
                return;
            }
            st.running += 1;
        }
        let lane = lane.clone();
        self.submit(move || run_lane(lane, job));
    }

    fn maybe_spawn(&self) {
        let mut total = self.shared.total.load(Ordering::Relaxed);
        loop {
            if total >= self.max_threads {
                return;
            }
            match self.shared.total.compare_exchange_weak(
                total,
                total + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(t) => total = t,
            }
        }
        let rx = self.rx.clone();
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new()
            .name("nbd-worker".into())
            .stack_size(WORKER_STACK_BYTES)
            .spawn(move || worker_loop(rx, shared));
        if let Err(e) = spawned {
            self.shared.total.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!("cannot start an NBD worker thread: {e}");
        }
    }
}

/// Runs `job`. A panicking job is a bug; it is logged and the worker (or
/// lane) goes on for the others. The job's own drop guards release its
/// connection's resources.
fn run_caught(job: Job) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
        tracing::error!("an NBD request handler panicked");
    }
}

/// A worker starts claimed (by the submit that spawned it) and counts itself
/// idle again after each job.
fn worker_loop(rx: Receiver<Job>, shared: Arc<Counters>) {
    loop {
        let Ok(job) = rx.recv() else { break };
        run_caught(job);
        shared.idle.fetch_add(1, Ordering::AcqRel);
    }
    shared.total.fetch_sub(1, Ordering::AcqRel);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    #[test]
    fn runs_jobs_concurrently_up_to_the_cap() {
        let pool = WorkerPool::new(8);
        // 8 jobs that all wait for each other can only finish if 8 threads run
        // them at once.
        let barrier = Arc::new(Barrier::new(9));
        for _ in 0..8 {
            let b = barrier.clone();
            pool.submit(move || {
                b.wait();
            });
        }
        barrier.wait();
        assert!(pool.threads() <= 8);
        assert!(pool.threads() >= 8);
    }

    /// A lane whose jobs all block holds at most its cap of workers: a job
    /// of another lane still runs, and the blocked lane's waiting jobs run
    /// once its running ones finish, in order.
    #[test]
    fn a_blocked_lane_leaves_workers_to_the_others() {
        use std::sync::mpsc;
        let pool = WorkerPool::new(4);
        let stalled = Arc::new(Lane::new(3));
        let other = Arc::new(Lane::new(3));
        let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
        let (done_tx, done_rx) = mpsc::channel::<u32>();
        for i in 0..10 {
            let (r, d) = (release_rx.clone(), done_tx.clone());
            pool.submit_in(&stalled, move || {
                r.recv().unwrap();
                d.send(i).unwrap();
            });
        }
        assert_eq!(stalled.load(), (3, 7));
        // Every job of the stalled lane is waiting for the release: the
        // other lane's job can only finish on a fourth worker.
        let d = done_tx.clone();
        pool.submit_in(&other, move || d.send(100).unwrap());
        assert_eq!(done_rx.recv().unwrap(), 100);
        for _ in 0..10 {
            release_tx.send(()).unwrap();
        }
        let mut got: Vec<u32> = (0..10).map(|_| done_rx.recv().unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        assert!(pool.threads() <= 4);
        // A panicking job does not lose the lane's capacity or its queue.
        let lane = Arc::new(Lane::new(1));
        pool.submit_in(&lane, || panic!("test panic"));
        let d = done_tx.clone();
        pool.submit_in(&lane, move || d.send(7).unwrap());
        assert_eq!(done_rx.recv().unwrap(), 7);
        // (The lane's count drops after the job's send: wait for it.)
        let mut tries = 0;
        while lane.load() != (0, 0) && tries < 10_000 {
            std::thread::sleep(std::time::Duration::from_millis(1));
            tries += 1;
        }
        assert_eq!(lane.load(), (0, 0));
    }
}
