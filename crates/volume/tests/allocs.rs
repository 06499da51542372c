//! Heap allocations per write, counted by a global allocator on the calling
//! thread, in steady state (after warm-up). Prints the figures
//! (`--nocapture`) and fails if a 4 KiB write allocates more than the
//! budget below — a guard against new per-write allocations on the hot path.
//!
//! The one `unsafe` outside the device layer and the C ABI: a global
//! allocator must implement an unsafe trait. It only forwards to `System`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use jbdev_device::mem::MemDevice;
use jbdev_volume::{BatchPolicy, FormatOptions, OpenOptions, Volume, WriteFlags};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Allocations on this thread per call of `op`, after `warm` calls.
fn per_op(n: u64, warm: u64, mut op: impl FnMut(u64)) -> f64 {
    for i in 0..warm {
        op(i);
    }
    let before = allocs();
    for i in warm..warm + n {
        op(i);
    }
    (allocs() - before) as f64 / n as f64
}

/// Budget per 4 KiB plain (non-FUA) journaled write on the caller's thread.
/// Today: the data buffer and its shared handle (a pool would remove both).
const PLAIN_4K_BUDGET: f64 = 3.0;

#[test]
fn allocations_per_write() {
    let size = 64 << 20;
    let dev = Arc::new(MemDevice::new(size + (16 << 20) + 4096, 512));
    let mut f = FormatOptions::new(size);
    f.journal_bytes = Some(16 << 20);
    Volume::format_device(dev.clone(), None, &f).unwrap();
    let opts = OpenOptions {
        batch_policy: BatchPolicy::None,
        ..OpenOptions::default()
    };
    let vol = Volume::open_device(dev, None, &opts).unwrap();
    let block = vec![7u8; 4096];
    let blocks = size / 4096;
    let plain = per_op(20_000, 2_000, |i| {
        vol.write_at(&block, (i * 7919 % blocks) * 4096, WriteFlags::NONE)
            .unwrap()
    });
    let fua = per_op(2_000, 200, |i| {
        vol.write_at(&block, (i * 104_729 % blocks) * 4096, WriteFlags::FUA)
            .unwrap()
    });
    let unaligned = per_op(5_000, 500, |i| {
        vol.write_at(
            &block[..1000],
            (i * 7919 % blocks) * 4096 + 100,
            WriteFlags::NONE,
        )
        .unwrap()
    });
    let mut buf = vec![0u8; 4096];
    let read = per_op(20_000, 2_000, |i| {
        vol.read_at(&mut buf, (i * 7919 % blocks) * 4096).unwrap()
    });
    println!(
        "allocations per op on the calling thread: 4 KiB write {plain:.2}, 4 KiB FUA write \
         (leads its own commit) {fua:.2}, 1000-byte unaligned write {unaligned:.2}, 4 KiB read {read:.2}"
    );
    assert!(
        plain <= PLAIN_4K_BUDGET,
        "a 4 KiB write allocates {plain:.2} times (budget {PLAIN_4K_BUDGET})"
    );
}
