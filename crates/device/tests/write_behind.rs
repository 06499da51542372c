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

use std::io::IoSlice;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use jbdev_device::open::{open_device, OpenOptions};

const SIZE: u64 = 64 << 20;
const WRITTEN: u64 = 16 << 20;

struct Loop {
    dev: PathBuf,
    file: PathBuf,
}

impl Loop {
    fn setup() -> Option<Loop> {
        // On disk, not in /dev/shm: any file will do, the loop device's own
        // page cache is what is written back.
        let file = std::env::temp_dir().join(format!("jbdev-wb-test-{}.img", std::process::id()));
        std::fs::File::create(&file).ok()?.set_len(SIZE).ok()?;
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&file)
            .output()
            .ok();
        match out {
            Some(o) if o.status.success() => {
                let dev = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim().to_string());
                Some(Loop { dev, file })
            }
            _ => {
                let _ = std::fs::remove_file(&file);
                None
            }
        }
    }

    /// Bytes written to the loop device so far (stat field 7: sectors).
    fn bytes_written(&self) -> u64 {
        let name = self.dev.file_name().unwrap().to_str().unwrap();
        let stat =
            std::fs::read_to_string(Path::new("/sys/block").join(name).join("stat")).unwrap();
        let sectors: u64 = stat.split_whitespace().nth(6).unwrap().parse().unwrap();
        sectors * 512
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
        let _ = std::fs::remove_file(&self.file);
    }
}

#[test]
fn a_write_through_the_page_cache_is_written_back_without_a_flush() {
    let Some(l) = Loop::setup() else {
        eprintln!("SKIP: needs root and loop devices (losetup)");
        return;
    };
    let opts = OpenOptions {
        read_cache: true,
        ..OpenOptions::default()
    };
    let dev = open_device(&l.dev, &opts)
        .expect("open the loop device")
        .device;
    assert!(dev.has_write_cache(), "the loop device has no write cache");
    let before = l.bytes_written();
    let data = vec![0x5au8; WRITTEN as usize];
    dev.write_cached(&[IoSlice::new(&data)], 4 << 20).unwrap();
    // Waiting is bounded well below the flusher's 30 s expiry, so a write
    // left dirty for the flusher fails here.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = l.bytes_written() - before;
    while seen < WRITTEN && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        seen = l.bytes_written() - before;
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
