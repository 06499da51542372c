//! A block device that shrinks under an open volume (a loop device's file
//! cut, then `losetup -c`; a reduced logical volume) aborts it with a
//! message that says so, as a truncated volume file does. Before, writes
//! whose home lay past the new end failed with ENOSPC and the volume said
//! "the backing store is full ... free space on it" (session 33's pass):
//! the wrong cause and the wrong remedy. Needs root for `losetup`;
//! skipped otherwise.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use jbdev_volume::{FormatOptions, OpenOptions, Volume, WriteFlags};

struct LoopDev(String);

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

fn loop_device(backing: &Path) -> Option<LoopDev> {
    let o = Command::new("losetup")
        .args(["-f", "--show"])
        .arg(backing)
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| LoopDev(String::from_utf8_lossy(&o.stdout).trim().to_string()))
}

fn resize(backing: &Path, dev: &LoopDev, bytes: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(backing)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    let st = Command::new("losetup")
        .args(["-c", &dev.0])
        .status()
        .unwrap();
    assert!(st.success(), "losetup -c");
}

#[test]
fn a_block_device_that_shrinks_aborts_the_volume_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("loop.img");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let Some(dev) = loop_device(&backing) else {
        println!("SKIP: no loop device (losetup needs root)");
        return;
    };
    let path = Path::new(&dev.0).to_path_buf();
    let mut f = FormatOptions::new(32 << 20);
    f.journal_bytes = Some(4 << 20);
    let vol = Volume::create(&path, &f, &OpenOptions::default()).expect("create");
    let block = vec![7u8; 4096];
    vol.write_at(&block, 0, WriteFlags::FUA).expect("a write");
    resize(&backing, &dev, 16 << 20);
    // At once, before the watch's next look (every 250 ms): a write too
    // large for a transaction goes home directly, past the new end, and
    // fails with ENOSPC there, which was taken for a full store (session
    // 33's verify pass).
    let big = vec![9u8; 2 << 20];
    let at_once = vol
        .write_at(&big, 24 << 20, WriteFlags::NONE)
        .expect_err("a write past the device's new end")
        .to_string();
    assert!(at_once.contains("shrank"), "{at_once}");
    // The watch looks every 250 ms; a bound on that, not a timing check.
    let deadline = Instant::now() + Duration::from_secs(30);
    let err = loop {
        match vol.write_at(&block, 4096, WriteFlags::FUA) {
            Err(e) => break e.to_string(),
            Ok(()) => {
                assert!(Instant::now() < deadline, "writes still acknowledged");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    assert!(err.contains("shrank"), "{err}");
    assert!(!err.contains("backing store is full"), "{err}");
    let closed = vol.close().expect_err("the close reports the shrink");
    assert!(closed.to_string().contains("shrank"), "{closed}");
    // Grown back, the volume opens again with what was acknowledged.
    resize(&backing, &dev, 64 << 20);
    let vol = Volume::open(&path, &OpenOptions::default()).expect("reopen");
    let mut back = vec![0u8; 4096];
    vol.read_at(&mut back, 0).expect("read");
    assert!(back == block, "the acknowledged write");
    vol.close().expect("close");
}
