//! A measurement, not a test: 4 KiB random writes from ONE thread through
//! the device's queue at queue depth 1, 8 and 32, against synchronous
//! `write_at` from one thread: by default through io_uring on a file in
//! /dev/shm and one in /var/tmp (O_DIRECT on both); with a target (any path
//! `open_device` takes, e.g. an `rbd:POOL/IMAGE:conf=PATH` image, created
//! if missing) on that device instead.
//!
//! ```text
//! cargo run --release -p jbdev-device --example queue_iops [WRITES [TARGET]]
//! cargo run --release -p jbdev-device --features rbd --example queue_iops -- 5000 rbd:rbd/qi:conf=/tmp/c/ceph.conf
//! ```

use std::time::Instant;

use jbdev_device::{
    open_device, AlignedBuf, Backend, BlockDevice, IoPriority, IoRequest, OpenOptions,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const FILE_BYTES: u64 = 256 << 20;
const BLOCK: usize = 4096;

fn offsets(count: usize, seed: u64) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let blocks = FILE_BYTES / BLOCK as u64;
    (0..count)
        .map(|_| rng.gen_range(0..blocks) * BLOCK as u64)
        .collect()
}

fn sync_iops(dev: &dyn BlockDevice, offs: &[u64]) -> f64 {
    let buf = AlignedBuf::from_slice(&[0xA5; BLOCK]);
    let t = Instant::now();
    for &at in offs {
        dev.write_at(&buf, at, IoPriority::Urgent).unwrap();
    }
    offs.len() as f64 / t.elapsed().as_secs_f64()
}

fn queue_iops(dev: &dyn BlockDevice, depth: u32, offs: &[u64]) -> f64 {
    let mut q = dev.queue(depth).unwrap();
    // A pool of buffers: each completion hands its buffer to the next write.
    let mut free: Vec<AlignedBuf> = (0..depth)
        .map(|_| AlignedBuf::from_slice(&[0x5A; BLOCK]))
        .collect();
    let mut done = Vec::with_capacity(depth as usize);
    let t = Instant::now();
    let mut next = offs.iter();
    let mut finished = 0;
    while finished < offs.len() {
        while let Some(buf) = free.pop() {
            let Some(&at) = next.next() else { break };
            q.push(IoRequest::write(at, buf), at).unwrap();
        }
        q.reap(1, &mut done).unwrap();
        for d in done.drain(..) {
            d.result.unwrap();
            finished += 1;
            free.push(d.req.into_write_buf::<AlignedBuf>().unwrap());
        }
    }
    offs.len() as f64 / t.elapsed().as_secs_f64()
}

/// Fills `dev` once (so every measured write is an overwrite), then
/// measures synchronous writes and the queue at depths 1, 8 and 32.
fn measure(what: &str, dev: &dyn BlockDevice, writes: usize) {
    let fill = AlignedBuf::zeroed(1 << 20);
    for at in (0..FILE_BYTES).step_by(fill.len()) {
        dev.write_at(&fill, at, IoPriority::Urgent).unwrap();
    }
    dev.flush().unwrap();
    let offs = offsets(writes, 7);
    println!(
        "{what} [{}] ({writes} random 4 KiB writes, one thread, no flush):",
        dev.backend_name()
    );
    println!("  sync write_at      {:>9.0} IOPS", sync_iops(dev, &offs));
    for depth in [1u32, 8, 32] {
        println!(
            "  queue QD{depth:<2}         {:>9.0} IOPS",
            queue_iops(dev, depth, &offs)
        );
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let writes: usize = args
        .next()
        .map(|a| a.parse().expect("WRITES is a number"))
        .unwrap_or(50_000);
    if let Some(target) = args.next() {
        let opts = OpenOptions {
            create_size: Some(FILE_BYTES),
            ..OpenOptions::default()
        };
        let dev = open_device(target.as_ref(), &opts).unwrap().device;
        let shown = target.split(':').take(2).collect::<Vec<_>>().join(":");
        measure(&shown, &*dev, writes);
        return;
    }
    jbdev_device::uring::probe().expect("io_uring is needed for this measurement");
    for dir in ["/dev/shm", "/var/tmp"] {
        let tmp = tempfile::tempdir_in(dir).unwrap();
        let opts = OpenOptions {
            backend: Backend::Uring,
            create_size: Some(FILE_BYTES),
            ..OpenOptions::default()
        };
        let dev = open_device(&tmp.path().join("img"), &opts).unwrap().device;
        measure(&format!("{dir} (O_DIRECT)"), &*dev, writes);
    }
}
