//! Large writes against a full journal: a write that waits for log space
//! keeps its buffer (its data is copied once, not once per retry); write
//! pacing (`OpenOptions::write_pacing`) pauses writers before the log is
//! full, and only when asked for.

use std::sync::Arc;

use jbdev_device::mem::MemDevice;
use jbdev_volume::{FormatOptions, OpenOptions, Volume, WriteFlags};

const SIZE: u64 = 32 << 20;
const JOURNAL: u64 = 1 << 20;

fn volume() -> Volume {
    volume_with(&OpenOptions::default()).1
}

fn volume_with(opts: &OpenOptions) -> (Arc<MemDevice>, Volume) {
    let dev = Arc::new(MemDevice::new(SIZE + JOURNAL + 4096, 512));
    let mut f = FormatOptions::new(SIZE);
    f.journal_bytes = Some(JOURNAL);
    Volume::format_device(dev.clone(), None, &f).unwrap();
    let vol = Volume::open_device(dev.clone(), None, opts).unwrap();
    (dev, vol)
}

/// Four threads of 4 KiB writes into a 1 MiB log, each over its own
/// region, until `enough` says stop (at most `MAX` writes each); returns
/// the model of what they wrote.
fn hammer(vol: &Volume, enough: &(dyn Fn(&Volume) -> bool + Sync)) -> Vec<(u64, u8)> {
    const MAX: u64 = 20_000;
    const REGION_BLOCKS: u64 = 512;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                s.spawn(move || {
                    let mut last = vec![0u8; REGION_BLOCKS as usize];
                    for i in 0..MAX {
                        let blk = (i * 97) % REGION_BLOCKS;
                        let stamp = (i % 250 + 1) as u8;
                        let off = (t * REGION_BLOCKS + blk) * 4096;
                        vol.write_at(&[stamp; 4096], off, WriteFlags::NONE).unwrap();
                        last[blk as usize] = stamp;
                        if i % 64 == 63 && enough(vol) {
                            break;
                        }
                    }
                    last.iter()
                        .enumerate()
                        .map(|(b, &v)| ((t * REGION_BLOCKS + b as u64) * 4096, v))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

#[test]
fn write_pacing_slows_writers_before_the_log_is_full_and_loses_nothing() {
    let opts = OpenOptions {
        write_pacing: true,
        ..OpenOptions::default()
    };
    let (dev, vol) = volume_with(&opts);
    let model = hammer(&vol, &|v| v.stats().paced_writes >= 50);
    let s = vol.stats();
    println!(
        "paced writes {}, slept {} ms, log-space waits {}",
        s.paced_writes, s.pace_sleep_ms, s.log_space_waits
    );
    assert!(s.paced_writes > 0, "writers at memory speed must be paced");
    vol.close().unwrap();
    let vol = Volume::open_device(dev, None, &OpenOptions::default()).unwrap();
    let mut back = vec![0u8; 4096];
    for (off, v) in model {
        vol.read_at(&mut back, off).unwrap();
        assert!(
            back.iter().all(|&b| b == v),
            "block at {off} lost its last write"
        );
    }
}

#[test]
fn without_write_pacing_no_write_pauses() {
    let (_dev, vol) = volume_with(&OpenOptions::default());
    hammer(&vol, &|v| v.stats().log_space_waits >= 50);
    let s = vol.stats();
    assert!(s.log_space_waits > 0, "the log must have been full");
    assert_eq!(s.paced_writes, 0);
}

#[test]
fn a_large_write_waiting_for_log_space_takes_its_buffer_once() {
    let vol = volume();
    let max = vol.max_transaction_bytes() as usize;
    let data: Vec<u8> = (0..max).map(|i| (i % 251) as u8).collect();
    // Full 256-block buffers, then one per set bit of the rest.
    let blocks = max / 4096;
    let chunks = (blocks / 256) as u64 + u64::from((blocks % 256).count_ones());
    let writes = 40u64;
    let s0 = vol.stats();
    for i in 0..writes {
        let off = (i * max as u64) % (SIZE - max as u64);
        vol.write_at(&data, off / 4096 * 4096, WriteFlags::NONE)
            .unwrap();
    }
    let s1 = vol.stats();
    let taken = (s1.write_buffers_allocated + s1.write_buffers_reused)
        - (s0.write_buffers_allocated + s0.write_buffers_reused);
    println!(
        "{writes} writes of {max} bytes into a {JOURNAL}-byte journal: {} log-space waits, \
         {taken} buffers taken",
        s1.log_space_waits - s0.log_space_waits
    );
    assert!(
        s1.log_space_waits > s0.log_space_waits,
        "the test must make writes wait for log space"
    );
    assert_eq!(
        taken,
        writes * chunks,
        "each write takes its buffer once, however often it waits"
    );
    let mut back = vec![0u8; max];
    let last = ((writes - 1) * max as u64) % (SIZE - max as u64) / 4096 * 4096;
    vol.read_at(&mut back, last).unwrap();
    assert!(back == data);
}

/// `Volume::stats` once took the state lock while holding the stats lock,
/// the reverse of a publishing commit: a caller polling stats while the log
/// filled (a metrics scrape of a loaded server) deadlocked the volume.
#[test]
fn stats_polled_while_the_log_fills_never_deadlock() {
    let (_dev, vol) = volume_with(&OpenOptions::default());
    let vol = Arc::new(vol);
    let (tx, rx) = std::sync::mpsc::channel();
    let v = vol.clone();
    std::thread::spawn(move || {
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::black_box(v.stats());
                    }
                });
            }
            let writers: Vec<_> = (0..4u64)
                .map(|t| {
                    let v = &v;
                    s.spawn(move || {
                        for i in 0..5_000u64 {
                            let off = (t * 512 + (i * 97) % 512) * 4096;
                            v.write_at(&[t as u8 + 1; 4096], off, WriteFlags::NONE)
                                .unwrap();
                        }
                    })
                })
                .collect();
            for w in writers {
                w.join().unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let _ = tx.send(v.stats().log_space_waits);
    });
    let waits = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("writers and stats pollers deadlocked");
    assert!(waits > 0, "the log must have been full");
}
