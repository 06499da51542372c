//! A write through the page cache starts its own writeback (session 27).
//!
//! Session 26's pass found every client of `jbdev serve` stalled 1.3-2.3 s
//! after a 2 GiB bulk copy: the copy's large writes go home through the
//! page cache (`write_cached`), the kernel's flusher left them dirty (it
//! writes an inode back once its pages are 30 s old, or once dirty data
//! passes `vm.dirty_background_ratio`), and the next fdatasync, and every
//! O_DIRECT access to a range they covered, waited for all of it.
//! `write_cached` now starts the writeback of what it wrote at once.
//!
//! Seen on a loop device of the test's own, whose sysfs stat counts the
//! sectors written to it: after `write_cached`, without any flush, the
//! bytes reach the device within seconds (the flusher alone would wait 30
//! s). Needs root and loop devices; skips with a message otherwise.

mod common;

use std::io::IoSlice;
use std::path::Path;
use std::time::{Duration, Instant};

use common::LoopDevice;
use jbdev_device::open::{open_device, OpenOptions};

const SIZE: u64 = 64 << 20;
const WRITTEN: u64 = 16 << 20;

/// Bytes written to the loop device `dev` so far (stat field 7: sectors).
fn bytes_written(dev: &Path) -> u64 {
    let name = dev.file_name().unwrap().to_str().unwrap();
    let stat = std::fs::read_to_string(Path::new("/sys/block").join(name).join("stat")).unwrap();
    let sectors: u64 = stat.split_whitespace().nth(6).unwrap().parse().unwrap();
    sectors * 512
}

#[test]
fn a_write_through_the_page_cache_is_written_back_without_a_flush() {
    // (The loop device's own page cache is what is written back.)
    let Some(l) = LoopDevice::new(SIZE, 512) else {
        return;
    };
    let opts = OpenOptions {
        read_cache: true,
        ..OpenOptions::default()
    };
    let dev = open_device(&l.path, &opts)
        .expect("open the loop device")
        .device;
    assert!(dev.has_write_cache(), "the loop device has no write cache");
    let before = bytes_written(&l.path);
    let data = vec![0x5au8; WRITTEN as usize];
    dev.write_cached(&[IoSlice::new(&data)], 4 << 20).unwrap();
    // Waiting is bounded well below the flusher's 30 s expiry, so a write
    // left dirty for the flusher fails here.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = bytes_written(&l.path) - before;
    while seen < WRITTEN && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        seen = bytes_written(&l.path) - before;
    }
    assert!(
        seen >= WRITTEN,
        "{seen} of {WRITTEN} bytes written through the page cache reached the device \
         in 10 s without a flush: the write left them to the kernel's flusher"
    );
    // The bytes are still where they were written (through the read cache,
    // and so through the same page cache).
    let mut back = vec![0u8; 4096];
    let mut bufs = [std::io::IoSliceMut::new(&mut back)];
    assert!(dev.try_read_cached(&mut bufs, 4 << 20).unwrap());
    assert!(back.iter().all(|&b| b == 0x5a));
}
