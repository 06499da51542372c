//! Durable writes reach a real device as FUA (session 24's mutation pass).
//!
//! Every commit of the default single-flush mode and every lone FUA direct
//! write rely on one thing only: `write_vectored_durable_at` (and durable
//! requests of `write_batch`) carry force-unit-access (RWF_DSYNC) down to
//! the device. The crash harnesses check that contract with the fault and
//! memory devices, which implement it themselves; no test looks at what
//! the real io_uring and pread backends send. Dropping RWF_DSYNC from
//! io_uring's durable write (session 24's mutant M28) passed every test, while on a
//! real disk every acknowledged FUA write and commit would sit in the
//! device's volatile cache.
//!
//! The block layer makes this visible: a loop device has a write-back
//! cache and no FUA, so the kernel turns each FUA write into a write plus
//! flush requests, which `/sys/block/loopN/stat` counts (field 16, flush
//! requests completed). A plain write adds none. The test owns its loop
//! device, so nobody else's I/O is counted. Needs root and loop devices;
//! skips with a message otherwise (as `jbdev-bench`'s loop tests do).

use std::io::IoSlice;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use jbdev_device::open::{open_device, Backend, OpenOptions};
use jbdev_device::{AlignedBuf, BlockDevice, IoPriority};

const SIZE: u64 = 16 << 20;

/// A loop device over a file of ours, detached and removed on drop.
struct Loop {
    dev: PathBuf,
    file: PathBuf,
}

impl Loop {
    fn setup(tag: &str) -> Option<Loop> {
        // No root check of our own: losetup refuses a caller without the
        // right to make loop devices, and the test then skips.
        let file =
            std::env::temp_dir().join(format!("jbdev-fua-test-{}-{tag}.img", std::process::id()));
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

    /// Flush requests the loop device completed so far, if the kernel
    /// reports them (17-field stat, Linux 5.5+).
    fn flushes(&self) -> Option<u64> {
        let name = self.dev.file_name()?.to_str()?;
        let stat = std::fs::read_to_string(Path::new("/sys/block").join(name).join("stat")).ok()?;
        let f: Vec<u64> = stat
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        f.get(15).copied()
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
        let _ = std::fs::remove_file(&self.file);
    }
}

fn open(l: &Loop, backend: Backend) -> Arc<dyn BlockDevice> {
    let opts = OpenOptions {
        backend,
        ..OpenOptions::default()
    };
    open_device(&l.dev, &opts)
        .expect("open the loop device")
        .device
}

fn check_backend(backend: Backend, tag: &str) {
    let Some(l) = Loop::setup(tag) else {
        eprintln!("SKIP: needs root and loop devices (losetup)");
        return;
    };
    if l.flushes().is_none() {
        eprintln!("SKIP: this kernel's block stat has no flush counter");
        return;
    }
    let dev = open(&l, backend);
    let buf = AlignedBuf::zeroed(4096);
    let delta = |f: &dyn Fn()| {
        let before = l.flushes().unwrap();
        f();
        l.flushes().unwrap() - before
    };
    // Calibration: a plain write costs no flush, so what follows is ours.
    let plain = delta(&|| {
        dev.write_vectored_at(&[IoSlice::new(&buf)], 0, IoPriority::Urgent)
            .unwrap()
    });
    assert_eq!(plain, 0, "{backend:?}: a plain write caused device flushes");
    let fua = delta(&|| {
        dev.write_vectored_durable_at(&[IoSlice::new(&buf)], 4096, IoPriority::Urgent)
            .unwrap()
    });
    assert!(
        fua >= 1,
        "{backend:?}: write_vectored_durable_at reached the device without FUA \
         (no flush request on a write-back device that lacks FUA)"
    );
    let batch = delta(&|| {
        let iov = [IoSlice::new(&buf)];
        let reqs = [
            jbdev_device::WriteReq {
                offset: 8192,
                bufs: &iov,
                durable: true,
            },
            jbdev_device::WriteReq {
                offset: 3 * 4096,
                bufs: &iov,
                durable: true,
            },
        ];
        dev.write_batch(&reqs, IoPriority::Urgent).unwrap()
    });
    assert!(
        batch >= 1,
        "{backend:?}: durable write_batch requests reached the device without FUA"
    );
}

#[test]
fn io_uring_durable_writes_carry_fua_to_the_device() {
    check_backend(Backend::Uring, "uring");
}

#[test]
fn pread_durable_writes_carry_fua_to_the_device() {
    check_backend(Backend::Pread, "pread");
}
