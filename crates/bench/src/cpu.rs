//! CPU time per operation: `getrusage(RUSAGE_SELF)` deltas of the bench
//! process around each measured phase.
//!
//! What it counts: user and system time of every thread of this process,
//! so jbdev's own engine threads (commit, checkpoint) are in the jbdev
//! figure, and the system time of the kernel path's syscalls (O_DIRECT
//! submission, page-cache copies, waits) is in the kernel figure. What it
//! cannot count: work the kernel does in its own threads — the loop
//! device's workers (which do the actual file I/O of the ram, disk and slow
//! backings), block-layer completions, ext4/jbd2's commit thread. That work
//! is missing from *both* sides, and it is most of what the kernel path
//! does below its syscall, so the kernel figure under-counts the kernel's
//! real cost more than jbdev's (jbdev's journaling, copying and checksums
//! run in its own threads and are counted). Read the column as "CPU this
//! process burned per operation", not as the whole machine's cost.
//!
//! The slow backing's FUSE server runs as threads of this process: its
//! time is the emulated device's, not jbdev's or the kernel path's. Each
//! server thread reports its own `RUSAGE_THREAD` after every request
//! ([`record_device_thread`]) and that is subtracted ([`CpuDelta::device`]).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nix::sys::resource::{getrusage, Usage, UsageWho};
use parking_lot::Mutex;
use serde::Serialize;

/// User and system CPU time, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CpuTime {
    pub user_us: u64,
    pub sys_us: u64,
}

impl CpuTime {
    fn from_usage(u: &Usage) -> CpuTime {
        let us = |t: nix::sys::time::TimeVal| {
            (t.tv_sec().max(0) as u64) * 1_000_000 + t.tv_usec().max(0) as u64
        };
        CpuTime {
            user_us: us(u.user_time()),
            sys_us: us(u.system_time()),
        }
    }

    fn minus(self, earlier: CpuTime) -> CpuTime {
        CpuTime {
            user_us: self.user_us.saturating_sub(earlier.user_us),
            sys_us: self.sys_us.saturating_sub(earlier.sys_us),
        }
    }

    /// The sum of two times (runs accumulated into one record).
    pub fn plus(self, other: CpuTime) -> CpuTime {
        CpuTime {
            user_us: self.user_us + other.user_us,
            sys_us: self.sys_us + other.sys_us,
        }
    }

    /// User plus system, in microseconds.
    pub fn total_us(self) -> u64 {
        self.user_us + self.sys_us
    }
}

/// One thread's cumulative CPU time, as it last reported it.
#[derive(Default)]
struct Slot {
    user_us: AtomicU64,
    sys_us: AtomicU64,
}

/// Device-emulation threads (the slow backing's FUSE server), ever. A slot
/// outlives its thread and keeps its last value, so the sum stays
/// cumulative; two slots per slow backing set up, so the list stays short.
static DEVICE_SLOTS: Mutex<Vec<Arc<Slot>>> = Mutex::new(Vec::new());

thread_local! {
    static MY_SLOT: RefCell<Option<Arc<Slot>>> = const { RefCell::new(None) };
}

/// Called by a device-emulation thread after each request: publishes the
/// thread's cumulative CPU time so that phases can subtract it.
pub fn record_device_thread() {
    let Ok(u) = getrusage(UsageWho::RUSAGE_THREAD) else {
        return;
    };
    let t = CpuTime::from_usage(&u);
    MY_SLOT.with(|s| {
        let mut s = s.borrow_mut();
        let slot = s.get_or_insert_with(|| {
            let slot = Arc::new(Slot::default());
            DEVICE_SLOTS.lock().push(slot.clone());
            slot
        });
        slot.user_us.store(t.user_us, Ordering::Relaxed);
        slot.sys_us.store(t.sys_us, Ordering::Relaxed);
    });
}

fn device_time() -> CpuTime {
    let all = DEVICE_SLOTS.lock();
    let mut t = CpuTime::default();
    for s in all.iter() {
        t.user_us += s.user_us.load(Ordering::Relaxed);
        t.sys_us += s.sys_us.load(Ordering::Relaxed);
    }
    t
}

/// Busy microseconds of all CPUs together from the aggregate `cpu` line of
/// `/proc/stat` (fields in clock ticks: user nice system idle iowait irq
/// softirq steal ...): user + nice + system + irq + softirq. None if the
/// line is missing or malformed.
fn busy_us_from_proc_stat(stat: &str, ticks_per_sec: u64) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    let [user, nice, system, _idle, _iowait, irq, softirq, ..] = f.as_slice() else {
        return None;
    };
    let ticks = user + nice + system + irq + softirq;
    Some(ticks.checked_mul(1_000_000)? / ticks_per_sec.max(1))
}

fn machine_busy_us() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()?;
    busy_us_from_proc_stat(&stat, u64::try_from(hz).ok()?)
}

/// A point in time for CPU accounting.
#[derive(Clone, Copy, Debug)]
pub struct CpuMark {
    process: CpuTime,
    children: CpuTime,
    device: CpuTime,
    machine_us: Option<u64>,
    written: Option<u64>,
}

/// Takes a mark, or None if getrusage failed (then no CPU is reported).
pub fn mark() -> Option<CpuMark> {
    let process = CpuTime::from_usage(&getrusage(UsageWho::RUSAGE_SELF).ok()?);
    let children = CpuTime::from_usage(&getrusage(UsageWho::RUSAGE_CHILDREN).ok()?);
    Some(CpuMark {
        process,
        children,
        device: device_time(),
        machine_us: machine_busy_us(),
        written: crate::devstat::written_bytes(),
    })
}

/// CPU used between two marks.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CpuDelta {
    /// This process, device emulation excluded.
    pub process: CpuTime,
    /// The emulated device's threads (slow backing's FUSE server), excluded
    /// from `process`.
    pub device: CpuTime,
    /// Children that finished and were waited for (fs_mark).
    pub children: CpuTime,
    /// Busy time of all CPUs of the machine (`/proc/stat`), every process
    /// and kernel thread included; None where it could not be read.
    pub machine_us: Option<u64>,
    /// Bytes written to the benchmarked block device ([`crate::devstat`]);
    /// None where it has no stat file.
    pub device_written_bytes: Option<u64>,
}

impl CpuMark {
    /// CPU used since `earlier`.
    pub fn since(&self, earlier: &CpuMark) -> CpuDelta {
        let device = self.device.minus(earlier.device);
        CpuDelta {
            process: self.process.minus(earlier.process).minus(device),
            device,
            children: self.children.minus(earlier.children),
            machine_us: self
                .machine_us
                .zip(earlier.machine_us)
                .map(|(now, then)| now.saturating_sub(then)),
            device_written_bytes: self
                .written
                .zip(earlier.written)
                .map(|(now, then)| now.saturating_sub(then)),
        }
    }
}

/// CPU from `start` to now, if both marks could be taken.
pub fn since(start: Option<CpuMark>) -> Option<CpuDelta> {
    Some(mark()?.since(&start?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_loop_shows_up_and_device_time_is_subtracted() {
        let m0 = mark().expect("getrusage works");
        // Burn a little CPU in a "device" thread and here.
        std::thread::spawn(|| {
            let t0 = std::time::Instant::now();
            let mut x = 0u64;
            while t0.elapsed() < std::time::Duration::from_millis(30) {
                x = x.wrapping_mul(31).wrapping_add(7);
            }
            std::hint::black_box(x);
            record_device_thread();
        })
        .join()
        .unwrap();
        let d = since(Some(m0)).unwrap();
        assert!(d.device.total_us() > 0, "{d:?}");
        // No subtraction below zero.
        assert!(d.process.total_us() < 10_000_000);
        // Linux has /proc/stat: the machine figure is there.
        assert!(d.machine_us.is_some(), "{d:?}");
    }

    #[test]
    fn proc_stat_busy_time_counts_user_system_and_interrupts_only() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let stat = "cpu  100 5 40 9000 300 2 3 50 0 0\ncpu0 50 2 20 4500 150 1 1 25 0 0\n";
        // (100 + 5 + 40 + 2 + 3) ticks at 100 per second = 1.5 s.
        assert_eq!(busy_us_from_proc_stat(stat, 100), Some(1_500_000));
        assert_eq!(busy_us_from_proc_stat(stat, 1000), Some(150_000));
        // Malformed or missing: None, never a panic.
        assert_eq!(busy_us_from_proc_stat("cpu  1 2 x 4 5 6 7\n", 100), None);
        assert_eq!(busy_us_from_proc_stat("cpu  1 2 3\n", 100), None);
        assert_eq!(busy_us_from_proc_stat("intr 5\n", 100), None);
        assert_eq!(busy_us_from_proc_stat("", 100), None);
    }
}
