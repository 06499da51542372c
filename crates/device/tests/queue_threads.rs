//! The portable backend's queues use a bounded pool, not a thread per
//! request in flight. Alone in its test binary so that no other test's
//! threads change the count.

use jbdev_device::pool::POOL_THREADS_MAX;
use jbdev_device::{open_device, AlignedBuf, Backend, IoRequest, OpenOptions};

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn pread_queues_use_at_most_the_pool_bound_of_threads() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let opts = OpenOptions {
        backend: Backend::Pread,
        create_size: Some(16 << 20),
        ..OpenOptions::default()
    };
    let dev = open_device(&dir.path().join("img"), &opts).unwrap().device;
    let lbs = dev.logical_block_size() as usize;
    let before = threads();
    let mut most = before;
    // 256 requests in flight at once through four queues: durable writes
    // (each waits for fdatasync in a worker) and reads.
    let mut queues: Vec<_> = (0..4).map(|_| dev.queue(64).unwrap()).collect();
    for (qi, q) in queues.iter_mut().enumerate() {
        for i in 0..64u64 {
            let at = (qi as u64 * 64 + i) * 4096;
            let req = if i % 2 == 0 {
                IoRequest::write_durable(at, AlignedBuf::from_slice(&vec![i as u8; lbs]))
            } else {
                IoRequest::read(at, AlignedBuf::zeroed(lbs))
            };
            q.push(req, i).unwrap();
        }
        q.submit().unwrap();
        most = most.max(threads());
    }
    let mut out = Vec::new();
    for q in &mut queues {
        while q.in_flight() > 0 {
            q.reap(1, &mut out).unwrap();
            most = most.max(threads());
        }
    }
    assert_eq!(out.len(), 256);
    assert!(out.iter().all(|d| d.result.is_ok()));
    assert!(
        most - before <= POOL_THREADS_MAX,
        "{} threads before, {most} at most while 256 requests ran",
        before
    );
    drop(queues);
    drop(dev);
    // The device's pool is joined when it is dropped. A joined thread can
    // still be listed for a moment (pthread_join returns when the thread
    // clears its tid, before the kernel releases the task), so wait for
    // the count to settle, a bounded time.
    let mut left = threads();
    for _ in 0..500 {
        if left == before {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        left = threads();
    }
    assert_eq!(
        left, before,
        "pool threads left after the device was dropped"
    );
}
