//! Flush coalescing (seeds 000/001).
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

use parking_lot::{Condvar, Mutex};

use crate::{BlockDevice, DeviceError, Result};

#[derive(Default)]
struct State {
    started: u64,
    completed: u64,
    in_flight: bool,
    /// Number of the first flush that failed; every caller it covers gets an error.
    failed_at: Option<u64>,
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
            if st.completed >= need {
                return match st.failed_at {
                    Some(f) if f >= need => Err(DeviceError::Injected("shared flush")),
                    _ => Ok(()),
                };
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
                if res.is_err() && st.failed_at.is_none() {
                    st.failed_at = Some(mine);
                }
                self.done.notify_all();
                return res;
            }
            self.done.wait(&mut st);
        }
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
}
