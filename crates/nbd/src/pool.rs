//! A bounded, lazily grown pool of worker threads shared by all connections.
//!
//! Requests that may wait are executed here, not on the network threads
//! (which never wait for the device; the one exception is a large write
//! into the page cache, ARCHITECTURE 28a), so that
//! many FUA writes and flushes from one or many connections are inside the
//! volume at the same time and share its group commits. Threads are spawned
//! on demand (when no worker is idle) up to `max_threads`, and then requests
//! queue. A worker holds no lock while it runs a job.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

type Job = Box<dyn FnOnce() + Send + 'static>;

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

/// A worker starts claimed (by the submit that spawned it) and counts itself
/// idle again after each job.
fn worker_loop(rx: Receiver<Job>, shared: Arc<Counters>) {
    loop {
        let Ok(job) = rx.recv() else { break };
        // A panicking job is a bug; keep the worker alive for the others. The
        // job's own drop guards release its connection's resources.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
            tracing::error!("an NBD request handler panicked");
        }
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
}
