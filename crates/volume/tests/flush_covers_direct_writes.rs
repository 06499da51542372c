//! A flush covers every direct write that returned before it was called
//! (session 24's mutation pass).
//!
//! `flush()` must make durable every write that returned before it was
//! called — also a plain (non-FUA) direct write that completed while
//! *another* thread's flush was already on the device. `flush_home`
//! remembers which direct writes a finished device flush covered
//! (`written_gen` read before the flush → `flushed_gen`). A version that
//! records the generation as it is *after* the device flush (session 24's mutant M25)
//! counts a direct write that completed during the flush as covered, so
//! the next `flush()` skips the device flush and acknowledges a write that
//! a power cut then loses. No existing harness holds a flush on the device
//! while a direct write completes, so every test passed with that bug.
//!
//! Deterministic: a pass-through device holds the first armed flush after
//! the device flushed (so the flush covers exactly what completed before
//! it), the direct write runs meanwhile, then the flush is released.

mod common;

use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jbdev_device::fault::FaultDevice;
use jbdev_device::{BlockDevice, Extent, IoPriority};
use jbdev_volume::{OpenOptions, Volume, WriteFlags};
use parking_lot::{Condvar, Mutex};

const BS: u64 = 4096;
const DATA: u64 = 4 << 20;
const JOURNAL: u64 = 512 << 10;
const SECTOR: u32 = 512;
const BIG: usize = 64 << 10;
/// Longest the test waits for an event it set up (a bound, not a timing
/// assertion: on time-out the test fails with a message instead of hanging).
const WAIT: Duration = Duration::from_secs(10);

/// Forwards to a fault device; an armed flush, once the device flushed,
/// waits for `release` before returning.
struct HoldFlush {
    inner: Arc<FaultDevice>,
    armed: AtomicBool,
    release: AtomicBool,
    held: Mutex<bool>,
    changed: Condvar,
}

impl HoldFlush {
    fn wait_held(&self) {
        let deadline = Instant::now() + WAIT;
        let mut held = self.held.lock();
        while !*held {
            if self.changed.wait_until(&mut held, deadline).timed_out() {
                panic!("timed out waiting for the flush to reach the device");
            }
        }
    }
}

impl BlockDevice for HoldFlush {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn logical_block_size(&self) -> u32 {
        self.inner.logical_block_size()
    }
    fn read_vectored_at(
        &self,
        bufs: &mut [IoSliceMut<'_>],
        offset: u64,
    ) -> jbdev_device::Result<()> {
        self.inner.read_vectored_at(bufs, offset)
    }
    fn write_vectored_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        prio: IoPriority,
    ) -> jbdev_device::Result<()> {
        self.inner.write_vectored_at(bufs, offset, prio)
    }
    fn write_vectored_durable_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        prio: IoPriority,
    ) -> jbdev_device::Result<()> {
        self.inner.write_vectored_durable_at(bufs, offset, prio)
    }
    fn flush(&self) -> jbdev_device::Result<()> {
        self.inner.flush()?;
        if self.armed.swap(false, Ordering::SeqCst) {
            *self.held.lock() = true;
            self.changed.notify_all();
            let deadline = Instant::now() + WAIT;
            while !self.release.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> jbdev_device::Result<()> {
        self.inner.write_zeroes(offset, len)
    }
    fn allocation(&self, offset: u64, len: u64) -> jbdev_device::Result<Vec<Extent>> {
        self.inner.allocation(offset, len)
    }
    fn backend_name(&self) -> &'static str {
        "hold-flush"
    }
}

/// Writes of BIG bytes go straight home; no background commits or
/// checkpoints (they would flush the device on their own).
fn opts() -> OpenOptions {
    common::direct_from(BIG as u64)
}

use common::pattern;

#[test]
fn a_flush_covers_a_direct_write_that_completed_during_an_earlier_flush() {
    let fault = common::formatted_fault_device(DATA, JOURNAL);
    let dev = Arc::new(HoldFlush {
        inner: fault.clone(),
        armed: AtomicBool::new(false),
        release: AtomicBool::new(false),
        held: Mutex::new(false),
        changed: Condvar::new(),
    });
    let vol = Arc::new(Volume::open_device(dev.clone(), None, &opts()).expect("open"));

    // D1: a plain direct write, so the next flush has home work to do.
    let (off1, off2) = (32 * BS, 128 * BS);
    let d1 = pattern(BIG, 1);
    let before = vol.stats().direct_writes;
    vol.write_at(&d1, off1, WriteFlags::NONE).expect("write D1");
    assert_eq!(
        vol.stats().direct_writes,
        before + 1,
        "D1 must go home directly"
    );

    // Thread A flushes; its device flush is held after it reached the device.
    dev.armed.store(true, Ordering::SeqCst);
    let flusher = {
        let vol = vol.clone();
        std::thread::spawn(move || vol.flush())
    };
    dev.wait_held();

    // D2 completes while A's flush is on the device: that flush cannot cover it.
    let d2 = pattern(BIG, 2);
    vol.write_at(&d2, off2, WriteFlags::NONE).expect("write D2");
    assert_eq!(
        vol.stats().direct_writes,
        before + 2,
        "D2 must go home directly"
    );
    dev.release.store(true, Ordering::SeqCst);
    flusher.join().unwrap().expect("flush A");

    // A flush called after D2 returned: D2 is durable when it returns.
    vol.flush().expect("flush B");

    fault.cut_power();
    drop(vol);
    let img = Arc::new(FaultDevice::from_image(fault.durable_image(), SECTOR));
    let vol = Volume::open_device(img, None, &opts()).expect("recovery");
    let mut back = vec![0u8; BIG];
    vol.read_at(&mut back, off1).expect("read D1");
    assert!(back == d1, "lost D1, acknowledged by flush A");
    vol.read_at(&mut back, off2).expect("read D2");
    assert!(
        back == d2,
        "lost D2: a flush called after it returned reported success without flushing it"
    );
}
