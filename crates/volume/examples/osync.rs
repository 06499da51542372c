//! Quick profile driver: T threads each rewriting their own region with FUA
//! writes for D seconds. `cargo run --release -p jbdev-volume --example osync -- PATH THREADS SECS BYTES`
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jbdev_volume::{FormatOptions, OpenOptions, Volume, WriteFlags};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = std::path::PathBuf::from(&args[1]);
    let threads: u64 = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(64);
    let secs: u64 = args.get(3).map(|s| s.parse().unwrap()).unwrap_or(5);
    let bytes: usize = args.get(4).map(|s| s.parse().unwrap()).unwrap_or(65536);
    let policy = args
        .get(5)
        .map(|s| s.parse().unwrap())
        .unwrap_or(jbdev_volume::BatchPolicy::Adaptive);
    let _ = std::fs::remove_file(&path);
    let opts = OpenOptions {
        batch_policy: policy,
        ..Default::default()
    };
    let v = Arc::new(Volume::create(&path, &FormatOptions::new(1 << 30), &opts).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (v, stop, ops) = (v.clone(), stop.clone(), ops.clone());
            std::thread::spawn(move || {
                let buf = vec![t as u8; bytes];
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    v.write_at(&buf, t * bytes as u64, WriteFlags::FUA).unwrap();
                    n += 1;
                }
                ops.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    let el = start.elapsed().as_secs_f64();
    let n = ops.load(Ordering::Relaxed);
    println!(
        "{threads} threads x {bytes} B: {:.0} ops/s, {:.1} MiB/s",
        n as f64 / el,
        n as f64 * bytes as f64 / el / 1048576.0
    );
    println!("{:?}", v.stats());
}
