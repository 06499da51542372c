//! The backend conformance suite, run against every `BlockDevice`
//! implementation: memory, fault, pread and io_uring on a temp file, and
//! pread and io_uring on a real loop device (512- and 4096-byte sectors).

mod common;

use std::sync::Arc;

use common::{conformance, image_path, temp_dir, LoopDevice, Traits};
use jbdev_device::fault::FaultDevice;
use jbdev_device::mem::MemDevice;
use jbdev_device::{open_device, Backend, BlockDevice, OpenOptions};

const SIZE_BYTES: u64 = 8 << 20;

fn open(path: &std::path::Path, backend: Backend, create: bool) -> Arc<dyn BlockDevice> {
    let opts = OpenOptions {
        backend,
        create_size: create.then_some(SIZE_BYTES),
        ..OpenOptions::default()
    };
    let opened =
        open_device(path, &opts).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    println!(
        "opened {} as {} (direct: {}, block device: {})",
        path.display(),
        opened.device.backend_name(),
        opened.direct,
        opened.is_block_device
    );
    opened.device
}

fn uring_available() -> bool {
    match jbdev_device::uring::probe() {
        Ok(()) => true,
        Err(e) => {
            println!("SKIP: io_uring unavailable on this kernel/sandbox: {e}");
            false
        }
    }
}

const NO_HOLES: Traits = Traits {
    reports_holes: false,
};
const FILE: Traits = Traits {
    reports_holes: true,
};

#[test]
fn memory_device() {
    conformance(&MemDevice::new(SIZE_BYTES, 512), NO_HOLES);
    conformance(&MemDevice::new(SIZE_BYTES, 4096), NO_HOLES);
}

#[test]
fn fault_device() {
    let dev = FaultDevice::new(SIZE_BYTES, 512);
    conformance(&dev, NO_HOLES);
    // The suite ends with a flush: everything is durable.
    assert_eq!(dev.unflushed_writes(), 0);
    assert_eq!(dev.durable_image(), dev.live_image());
    conformance(&FaultDevice::new(SIZE_BYTES, 4096), NO_HOLES);
}

#[test]
fn pread_on_a_file() {
    let dir = temp_dir();
    let dev = open(&image_path(dir.path()), Backend::Pread, true);
    assert_eq!(dev.backend_name(), "pread");
    conformance(dev.as_ref(), FILE);
}

#[test]
fn uring_on_a_file() {
    if !uring_available() {
        return;
    }
    let dir = temp_dir();
    let dev = open(&image_path(dir.path()), Backend::Uring, true);
    assert_eq!(dev.backend_name(), "io_uring");
    conformance(dev.as_ref(), FILE);
}

fn on_loop_device(sector_size: u32) {
    let Some(lo) = LoopDevice::new(SIZE_BYTES, sector_size) else {
        return;
    };
    let mut backends = vec![Backend::Pread];
    if uring_available() {
        backends.push(Backend::Uring);
    }
    for backend in backends {
        let dev = open(&lo.path, backend, false);
        // The ioctls report the geometry we asked losetup for.
        assert_eq!(dev.size_bytes(), SIZE_BYTES, "BLKGETSIZE64");
        assert_eq!(dev.logical_block_size(), sector_size, "BLKSSZGET");
        conformance(dev.as_ref(), NO_HOLES);
    }
}

#[test]
fn pread_and_uring_on_a_loop_device() {
    on_loop_device(512);
}

#[test]
fn pread_and_uring_on_a_4k_loop_device() {
    on_loop_device(4096);
}
