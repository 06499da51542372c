//! The load driver: T worker threads run an operation in a loop for a fixed
//! time (and at most a fixed count), recording every completion latency.
//!
//! The harness must not become the scaling wall it measures: workers share
//! no counter that every operation writes. Each has its own histogram and its own cache-padded
//! progress counter, which only the sampler thread reads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use hdrhistogram::Histogram;
use parking_lot::Mutex;

use crate::cleanup;
use crate::error::{BenchError, Result};
use crate::progress::Progress;

/// Latencies are recorded in nanoseconds up to this bound (larger values
/// are clamped, and counted in `LoadResult::clamped`).
const LATENCY_NS_MAX: u64 = 120_000_000_000;

/// What one operation did.
#[derive(Clone, Copy, Debug)]
pub struct Op {
    pub bytes: u64,
    pub is_write: bool,
}

impl Op {
    pub fn write(bytes: usize) -> Op {
        Op {
            bytes: bytes as u64,
            is_write: true,
        }
    }
    pub fn read(bytes: usize) -> Op {
        Op {
            bytes: bytes as u64,
            is_write: false,
        }
    }
}

/// How long and how hard to run.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    pub threads: usize,
    pub duration: Duration,
    /// Upper bound on operations per thread (the loop is bounded in count too).
    pub max_ops_per_thread: u64,
}

/// What a load produced.
#[derive(Debug)]
pub struct LoadResult {
    pub ops: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    pub bytes: u64,
    pub elapsed: Duration,
    /// Completion latency of every operation, in nanoseconds.
    pub latency_ns: Histogram<u64>,
    /// The same, of reads and of writes alone.
    pub read_latency_ns: Histogram<u64>,
    pub write_latency_ns: Histogram<u64>,
    /// Operations completed in each whole second of the run.
    pub per_second_ops: Vec<u64>,
    /// Bytes moved in each whole second of the run.
    pub per_second_bytes: Vec<u64>,
    /// CPU of this process from the start gate to the last worker's end
    /// (see [`crate::cpu`]); None if getrusage failed.
    pub cpu: Option<crate::cpu::CpuDelta>,
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).expect("static histogram bounds are valid")
}

struct Worker {
    ops: CachePadded<AtomicU64>,
    bytes: CachePadded<AtomicU64>,
}

/// Runs `spec.threads` workers. `make_worker(i)` builds worker `i`'s
/// operation (inside that thread, so buffers and files are per thread);
/// the operation is then called with an increasing sequence number until
/// the time or count runs out, the user interrupts, or it fails.
pub fn run_load<M, W>(spec: &LoadSpec, progress: &Progress, make_worker: M) -> Result<LoadResult>
where
    M: Fn(usize) -> Result<W> + Sync,
    W: FnMut(u64) -> Result<Op>,
{
    let threads = spec.threads.max(1);
    let workers: Vec<Worker> = (0..threads)
        .map(|_| Worker {
            ops: CachePadded::new(AtomicU64::new(0)),
            bytes: CachePadded::new(AtomicU64::new(0)),
        })
        .collect();
    // Written only on failure or at the end; workers only read it.
    let abort = AtomicBool::new(false);
    let first_error: Mutex<Option<BenchError>> = Mutex::new(None);
    let start_gate = Barrier::new(threads + 1);
    let finished = AtomicU64::new(0);
    let mut per_second_ops = Vec::new();
    let mut per_second_bytes = Vec::new();

    let (hists, start, end, cpu) = std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let (abort, first_error, gate, finished) =
                    (&abort, &first_error, &start_gate, &finished);
                let make_worker = &make_worker;
                s.spawn(move || {
                    let (mut read_hist, mut write_hist) = (new_histogram(), new_histogram());
                    let (mut reads, mut writes) = (0u64, 0u64);
                    let mut op = match make_worker(i) {
                        Ok(op) => Some(op),
                        Err(e) => {
                            first_error.lock().get_or_insert(e);
                            abort.store(true, Ordering::Relaxed);
                            None
                        }
                    };
                    gate.wait();
                    let deadline = Instant::now() + spec.duration;
                    if let Some(op) = op.as_mut() {
                        for seq in 0..spec.max_ops_per_thread {
                            if abort.load(Ordering::Relaxed) || cleanup::stop_requested() {
                                break;
                            }
                            let t0 = Instant::now();
                            match op(seq) {
                                Ok(done) => {
                                    let t1 = Instant::now();
                                    let ns = (t1 - t0).as_nanos().min(u128::from(LATENCY_NS_MAX));
                                    let ns = ns.max(1) as u64;
                                    if done.is_write {
                                        write_hist.saturating_record(ns);
                                        writes += 1;
                                    } else {
                                        read_hist.saturating_record(ns);
                                        reads += 1;
                                    }
                                    w.ops.fetch_add(1, Ordering::Relaxed);
                                    w.bytes.fetch_add(done.bytes, Ordering::Relaxed);
                                    if t1 >= deadline {
                                        break;
                                    }
                                }
                                Err(e) => {
                                    first_error.lock().get_or_insert(e);
                                    abort.store(true, Ordering::Relaxed);
                                    break;
                                }
                            }
                        }
                    }
                    // Drop the operation (closing files, volumes' handles) inside the thread.
                    drop(op);
                    finished.fetch_add(1, Ordering::Release);
                    (read_hist, write_hist, reads, writes)
                })
            })
            .collect();
        start_gate.wait();
        let start = Instant::now();
        let cpu0 = crate::cpu::mark();
        // Sample every 100 ms; book whole seconds into the per-second series.
        let (mut last_ops, mut last_bytes) = (0u64, 0u64);
        let mut next_second = start + Duration::from_secs(1);
        let mut last_tick = start;
        while finished.load(Ordering::Acquire) < threads as u64 {
            std::thread::sleep(Duration::from_millis(100));
            let now = Instant::now();
            progress.advance(now - last_tick);
            last_tick = now;
            if now >= next_second {
                let ops: u64 = workers.iter().map(|w| w.ops.load(Ordering::Relaxed)).sum();
                let bytes: u64 = workers
                    .iter()
                    .map(|w| w.bytes.load(Ordering::Relaxed))
                    .sum();
                per_second_ops.push(ops - last_ops);
                per_second_bytes.push(bytes - last_bytes);
                (last_ops, last_bytes) = (ops, bytes);
                next_second += Duration::from_secs(1);
            }
        }
        let end = Instant::now();
        let cpu = crate::cpu::since(cpu0);
        let hists: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("benchmark worker panicked"))
            .collect();
        (hists, start, end, cpu)
    });

    if let Some(e) = first_error.into_inner() {
        return Err(e);
    }
    if cleanup::stop_requested() {
        return Err(BenchError::Interrupted);
    }
    let (mut read_latency_ns, mut write_latency_ns) = (new_histogram(), new_histogram());
    let (mut read_ops, mut write_ops) = (0, 0);
    for (rh, wh, r, w) in &hists {
        read_latency_ns.add(rh).expect("histograms share bounds");
        write_latency_ns.add(wh).expect("histograms share bounds");
        read_ops += r;
        write_ops += w;
    }
    let mut latency_ns = read_latency_ns.clone();
    latency_ns
        .add(&write_latency_ns)
        .expect("histograms share bounds");
    Ok(LoadResult {
        ops: read_ops + write_ops,
        read_ops,
        write_ops,
        bytes: workers
            .iter()
            .map(|w| w.bytes.load(Ordering::Relaxed))
            .sum(),
        elapsed: end - start,
        latency_ns,
        read_latency_ns,
        write_latency_ns,
        per_second_ops,
        per_second_bytes,
        cpu,
    })
}

/// A run of single operations at an interval (the read-latency probe):
/// sleeps `interval`, times `op`, `samples` times. Returns the latencies in
/// microseconds, in order.
pub fn probe_series<F>(
    samples: usize,
    interval: Duration,
    progress: &Progress,
    mut op: F,
) -> Result<Vec<f64>>
where
    F: FnMut(usize) -> Result<()>,
{
    let mut out = Vec::with_capacity(samples);
    for i in 0..samples {
        // Sleep in small steps so Ctrl-C is noticed quickly.
        let wake = Instant::now() + interval;
        while Instant::now() < wake {
            if cleanup::stop_requested() {
                return Err(BenchError::Interrupted);
            }
            std::thread::sleep((wake - Instant::now()).min(Duration::from_millis(50)));
        }
        let t0 = Instant::now();
        op(i)?;
        let dt = t0.elapsed();
        out.push(dt.as_secs_f64() * 1e6);
        progress.advance(interval + dt);
    }
    Ok(out)
}
