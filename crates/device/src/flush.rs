//! Flush coalescing: many synchronous writers must not queue behind one
//! another's device flushes.
//!
//! Many threads may need "everything I wrote so far is durable" at once.
//! Issuing one device flush per caller serializes them behind each other;
//! the rule from the block_dev fsync fix is: never hold a lock while the
//! flush runs, and never issue a flush that an in-flight one already covers.
//!
//! Protocol: `started` counts flushes issued, `completed` the number of the
//! newest finished one. A caller arriving when `started == s` needs a flush
//! numbered `s + 1` or later (one that starts after its writes completed).
//! If none is in flight it starts one itself; otherwise it waits for the
//! in-flight one and then, if that did not cover it, for the next.
//!
//! A failure is sticky. After a failed flush the device may have dropped
//! writes that completed before it (Linux reports a writeback error once
//! and then forgets it), so a later flush that succeeds proves nothing
//! about them: every caller from then on, joined or new, gets
//! [`DeviceError::FlushFailed`] with the original error.

use parking_lot::{Condvar, Mutex};

use crate::{BlockDevice, DeviceError, Result};

#[derive(Default)]
struct State {
    started: u64,
    completed: u64,
    in_flight: bool,
    /// The first flush failure; every later caller gets it.
    /// The first failure: its message and its errno.
    failed: Option<(String, i32)>,
}

/// Shares device flushes between concurrent callers.
#[derive(Default)]
pub struct FlushCoalescer {
    state: Mutex<State>,
    done: Condvar,
}

impl FlushCoalescer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Returns once a flush that started after this call began has completed.
    pub fn flush(&self, dev: &dyn BlockDevice) -> Result<()> {
        let mut st = self.state.lock();
        let need = st.started + 1;
        loop {
            if let Some((why, errno)) = &st.failed {
                return Err(DeviceError::FlushFailed {
                    why: why.clone(),
                    errno: *errno,
                });
            }
            if st.completed >= need {
                return Ok(());
            }
            if !st.in_flight {
                st.in_flight = true;
                st.started += 1;
                let mine = st.started;
                drop(st);
                // IMPORTANT: no lock is held while the device flushes.
                let res = dev.flush();
                let mut st = self.state.lock();
                st.in_flight = false;
                st.completed = mine;
                if let Err(e) = &res {
                    st.failed.get_or_insert_with(|| (e.to_string(), e.errno()));
                }
                self.done.notify_all();
                return res;
            }
            self.done.wait(&mut st);
        }
    }

    /// True once a flush through this coalescer failed.
    pub fn has_failed(&self) -> bool {
        self.state.lock().failed.is_some()
    }

    /// Number of device flushes issued so far.
    pub fn flushes_issued(&self) -> u64 {
        self.state.lock().started
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemDevice;
    use std::sync::Arc;

    #[test]
    fn concurrent_callers_share_flushes() {
        let dev = Arc::new(MemDevice::new(1 << 20, 512));
        let fc = Arc::new(FlushCoalescer::new());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (dev, fc) = (dev.clone(), fc.clone());
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        fc.flush(dev.as_ref()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let n = fc.flushes_issued();
        assert!((100..=800).contains(&n), "flushes issued: {n}");
    }

    /// A device whose flushes block until released, and fail on demand.
    struct GatedFlush {
        inner: MemDevice,
        gate: parking_lot::Mutex<bool>,
        opened: parking_lot::Condvar,
        fail_next: std::sync::atomic::AtomicBool,
        entered: std::sync::atomic::AtomicU64,
    }

    impl crate::BlockDevice for GatedFlush {
        fn size_bytes(&self) -> u64 {
            self.inner.size_bytes()
        }
        fn logical_block_size(&self) -> u32 {
            self.inner.logical_block_size()
        }
        fn read_vectored_at(
            &self,
            bufs: &mut [std::io::IoSliceMut<'_>],
            offset: u64,
        ) -> Result<()> {
            self.inner.read_vectored_at(bufs, offset)
        }
        fn write_vectored_at(
            &self,
            bufs: &[std::io::IoSlice<'_>],
            offset: u64,
            prio: crate::IoPriority,
        ) -> Result<()> {
            self.inner.write_vectored_at(bufs, offset, prio)
        }
        fn flush(&self) -> Result<()> {
            use std::sync::atomic::Ordering;
            self.entered.fetch_add(1, Ordering::SeqCst);
            let mut open = self.gate.lock();
            while !*open {
                self.opened.wait(&mut open);
            }
            if self.fail_next.swap(false, Ordering::SeqCst) {
                return Err(DeviceError::Injected("flush"));
            }
            Ok(())
        }
        fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
            self.inner.write_zeroes(offset, len)
        }
        fn backend_name(&self) -> &'static str {
            "gated"
        }
    }

    /// Regression: a caller that joined a failing flush (and had to wait for
    /// the next one) used to get Ok from that next flush, and every caller
    /// after a failure got Ok again: data the failed flush was to make
    /// durable was reported durable.
    /// A later caller is told the first failure's errno: a flush that
    /// found no space keeps saying ENOSPC (the volume's checkpoint aborts
    /// with it, and an NBD client gets ENOSPC, not EIO, whichever caller
    /// met the failure first).
    #[test]
    fn a_sticky_failure_keeps_its_errno() {
        let dev = crate::fault::FaultDevice::new(1 << 20, 512);
        dev.fail_flush_with(0, libc::ENOSPC);
        let fc = FlushCoalescer::new();
        let first = fc.flush(&dev).unwrap_err();
        assert_eq!(first.errno(), libc::ENOSPC, "{first}");
        let later = fc.flush(&dev).unwrap_err();
        assert!(
            matches!(later, DeviceError::FlushFailed { .. }),
            "{later:?}"
        );
        assert_eq!(later.errno(), libc::ENOSPC, "{later}");
    }

    #[test]
    fn a_failed_flush_fails_every_later_caller() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let dev = Arc::new(GatedFlush {
            inner: MemDevice::new(1 << 16, 512),
            gate: parking_lot::Mutex::new(false),
            opened: parking_lot::Condvar::new(),
            fail_next: AtomicBool::new(true),
            entered: AtomicU64::new(0),
        });
        let fc = Arc::new(FlushCoalescer::new());
        let leader = {
            let (dev, fc) = (dev.clone(), fc.clone());
            std::thread::spawn(move || fc.flush(dev.as_ref()))
        };
        while dev.entered.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        // Joins while the failing flush is in flight: needs the next one.
        let joiner = {
            let (dev, fc) = (dev.clone(), fc.clone());
            std::thread::spawn(move || fc.flush(dev.as_ref()))
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        *dev.gate.lock() = true;
        dev.opened.notify_all();
        assert!(leader.join().unwrap().is_err());
        let j = joiner.join().unwrap();
        assert!(
            matches!(j, Err(DeviceError::FlushFailed { .. })),
            "joiner: {j:?}"
        );
        // And a caller arriving long after, with a healthy device.
        let later = fc.flush(dev.as_ref());
        match later {
            Err(e @ DeviceError::FlushFailed { .. }) => {
                assert!(e.to_string().contains("injected"), "{e}");
                // The first failure's errno, not a generic EIO: a flush
                // that found no space keeps saying ENOSPC.
                assert_eq!(e.errno(), libc::EIO);
            }
            other => panic!("later flush: {other:?}"),
        }
        assert!(fc.has_failed());
    }
}
