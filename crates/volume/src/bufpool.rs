//! Pooled, aligned journal buffers.
//!
//! A journaled write copies its data once, into a buffer taken from this
//! pool; the overlay, the commit and the checkpoint then share that buffer
//! until the last of them lets go, and the buffer comes back here instead of
//! going back to the heap. In steady state a write therefore allocates
//! nothing and touches no fresh page (no page fault, no `clear_page`).
//!
//! Design:
//! - Size classes of `2^k` blocks, `k < CLASSES`; a write of `n` blocks
//!   takes one buffer of the smallest class that holds it, or, above the top
//!   class, several top-class buffers ([`WriteBuf`] hides the chunking).
//! - A buffer is an `Arc<Slot>`. [`SharedBuf`] is a clonable handle; when a
//!   handle is dropped and `Arc::get_mut` says it was the only one, the slot
//!   goes back to its class's free list. Two last handles dropped at the
//!   same instant can both see the other one and both let go: the slot is
//!   then freed to the heap, a missed reuse, never a use-after-free. No
//!   `unsafe` anywhere.
//! - Bounded: the free lists together keep at most `keep_bytes`; beyond
//!   that a returned buffer is freed. [`BufPool::trim`] empties them (the
//!   checkpoint thread calls it when the volume goes idle), so an idle
//!   server does not sit on a load's worth of buffers.

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use jbdev_device::AlignedBuf;
use smallvec::SmallVec;

/// Size classes: 1, 2, 4, … 256 blocks (1 MiB of 4 KiB blocks).
pub const CLASSES: usize = 9;

struct Slot {
    buf: AlignedBuf,
    class: u8,
}

struct Class {
    tx: Sender<Arc<Slot>>,
    rx: Receiver<Arc<Slot>>,
}

struct Inner {
    bs: usize,
    classes: Vec<Class>,
    keep_bytes: usize,
    kept: AtomicUsize,
    allocated: AtomicU64,
    reused: AtomicU64,
}

/// The pool. Cheap to clone (shared).
#[derive(Clone)]
pub struct BufPool {
    inner: Arc<Inner>,
}

/// Buffers handed out, by source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Fresh heap allocations.
    pub allocated: u64,
    /// Buffers reused from a free list.
    pub reused: u64,
    /// Bytes on the free lists now.
    pub kept_bytes: u64,
}

impl BufPool {
    /// A pool of buffers of `bs`-byte blocks keeping at most `keep_bytes`
    /// on its free lists.
    pub fn new(bs: usize, keep_bytes: usize) -> Self {
        let classes = (0..CLASSES)
            .map(|k| {
                let cap = (keep_bytes / (bs << k)).max(1);
                let (tx, rx) = crossbeam_channel::bounded(cap);
                Class { tx, rx }
            })
            .collect();
        Self {
            inner: Arc::new(Inner {
                bs,
                classes,
                keep_bytes,
                kept: AtomicUsize::new(0),
                allocated: AtomicU64::new(0),
                reused: AtomicU64::new(0),
            }),
        }
    }

    /// Blocks per buffer of the top class: the chunk size of large writes.
    pub fn top_class_blocks() -> usize {
        1 << (CLASSES - 1)
    }

    fn take_class(&self, class: usize) -> OwnedBuf {
        let inner = &self.inner;
        let slot = match inner.classes[class].rx.try_recv() {
            Ok(slot) => {
                inner.kept.fetch_sub(slot.buf.len(), Ordering::Relaxed);
                inner.reused.fetch_add(1, Ordering::Relaxed);
                slot
            }
            Err(_) => {
                inner.allocated.fetch_add(1, Ordering::Relaxed);
                Arc::new(Slot {
                    buf: AlignedBuf::zeroed(inner.bs << class),
                    class: class as u8,
                })
            }
        };
        OwnedBuf {
            slot,
            pool: self.inner.clone(),
        }
    }

    /// A buffer for a write of `blocks` blocks (contents unspecified: the
    /// caller overwrites every byte it uses).
    pub fn take(&self, blocks: usize) -> WriteBuf {
        let blocks = blocks.max(1);
        let top = Self::top_class_blocks();
        let mut chunks = SmallVec::new();
        let chunk_blocks;
        if blocks <= top {
            let class = blocks.next_power_of_two().trailing_zeros() as usize;
            chunk_blocks = 1 << class;
            chunks.push(self.take_class(class));
        } else {
            chunk_blocks = top;
            for _ in 0..blocks.div_ceil(top) {
                chunks.push(self.take_class(CLASSES - 1));
            }
        }
        WriteBuf {
            chunks,
            chunk_blocks,
            bs: self.inner.bs,
        }
    }

    /// Frees every buffer on the free lists.
    pub fn trim(&self) {
        for c in &self.inner.classes {
            while let Ok(slot) = c.rx.try_recv() {
                self.inner.kept.fetch_sub(slot.buf.len(), Ordering::Relaxed);
            }
        }
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            allocated: self.inner.allocated.load(Ordering::Relaxed),
            reused: self.inner.reused.load(Ordering::Relaxed),
            kept_bytes: self.inner.kept.load(Ordering::Relaxed) as u64,
        }
    }
}

impl Inner {
    /// Takes back a slot nobody else holds (or frees it past the limit).
    /// When the free lists are full, buffers of other classes are freed
    /// first (largest first) to make room: the pool follows the sizes the
    /// workload writes now. Without that, a burst of 1 MiB writes (a
    /// prefill, a bulk copy) left the whole budget to 1 MiB buffers nobody
    /// took again, and every 4 KiB write after it allocated and faulted in
    /// a fresh buffer.
    fn recycle(&self, slot: Arc<Slot>) {
        let len = slot.buf.len();
        while self.kept.load(Ordering::Relaxed) + len > self.keep_bytes {
            let evicted = (0..self.classes.len())
                .rev()
                .filter(|&c| c != usize::from(slot.class))
                .find_map(|c| self.classes[c].rx.try_recv().ok());
            match evicted {
                Some(old) => {
                    self.kept.fetch_sub(old.buf.len(), Ordering::Relaxed);
                }
                None => break,
            }
        }
        if self.kept.fetch_add(len, Ordering::Relaxed) + len > self.keep_bytes {
            self.kept.fetch_sub(len, Ordering::Relaxed);
            return;
        }
        if self.classes[slot.class as usize].tx.try_send(slot).is_err() {
            self.kept.fetch_sub(len, Ordering::Relaxed);
        }
    }
}

/// A buffer only its holder sees: writable.
struct OwnedBuf {
    slot: Arc<Slot>,
    pool: Arc<Inner>,
}

impl OwnedBuf {
    fn bytes_mut(&mut self) -> &mut [u8] {
        // Never cloned before `share`, so the holder is the only one.
        match Arc::get_mut(&mut self.slot) {
            Some(s) => &mut s.buf,
            None => unreachable!("an owned pool buffer is never shared"),
        }
    }

    fn share(self) -> SharedBuf {
        SharedBuf {
            slot: Some(self.slot),
            pool: self.pool,
        }
    }
}

/// A read-only handle to a pooled buffer, shared by the overlay, the commit
/// and the checkpoint.
pub struct SharedBuf {
    slot: Option<Arc<Slot>>,
    pool: Arc<Inner>,
}

impl SharedBuf {
    /// A buffer outside any pool's accounting (recovery, tests): it goes to
    /// `pool`'s free list when dropped like any other.
    pub fn from_aligned(pool: &BufPool, buf: AlignedBuf) -> Self {
        let bs = pool.inner.bs;
        let blocks = buf.len() / bs;
        // A buffer whose length is not a class size is never recycled.
        let class = if buf.len().is_multiple_of(bs)
            && blocks.is_power_of_two()
            && blocks <= BufPool::top_class_blocks()
        {
            blocks.trailing_zeros() as u8
        } else {
            u8::MAX
        };
        Self {
            slot: Some(Arc::new(Slot { buf, class })),
            pool: pool.inner.clone(),
        }
    }
}

impl Clone for SharedBuf {
    fn clone(&self) -> Self {
        Self {
            slot: self.slot.clone(),
            pool: self.pool.clone(),
        }
    }
}

impl Deref for SharedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.slot {
            Some(s) => &s.buf,
            None => &[],
        }
    }
}

impl Drop for SharedBuf {
    fn drop(&mut self) {
        if let Some(mut slot) = self.slot.take() {
            if slot.class != u8::MAX && Arc::get_mut(&mut slot).is_some() {
                self.pool.recycle(slot);
            }
        }
    }
}

/// The buffer of one journaled write: `blocks` blocks, in one pooled buffer
/// or in top-class chunks.
pub struct WriteBuf {
    chunks: SmallVec<[OwnedBuf; 4]>,
    chunk_blocks: usize,
    bs: usize,
}

impl WriteBuf {
    /// Block `i` of the write, writable.
    pub fn block_mut(&mut self, i: usize) -> &mut [u8] {
        let (c, o) = (i / self.chunk_blocks, (i % self.chunk_blocks) * self.bs);
        let bs = self.bs;
        &mut self.chunks[c].bytes_mut()[o..o + bs]
    }

    /// Shares the buffer: `(chunk, blocks per chunk)`; block `i` is at
    /// `chunks[i / per] + (i % per) * bs`.
    pub fn share(self) -> (SmallVec<[SharedBuf; 4]>, usize) {
        (
            self.chunks.into_iter().map(OwnedBuf::share).collect(),
            self.chunk_blocks,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_when_its_last_handle_drops() {
        let pool = BufPool::new(4096, 1 << 20);
        let mut w = pool.take(1);
        w.block_mut(0).fill(9);
        let (chunks, per) = w.share();
        assert_eq!(per, 1);
        let a = chunks[0].clone();
        drop(chunks);
        assert_eq!(pool.stats().kept_bytes, 0, "a handle is still alive");
        assert_eq!(a[0], 9);
        drop(a);
        assert_eq!(pool.stats().kept_bytes, 4096);
        let _again = pool.take(1);
        assert_eq!(
            pool.stats(),
            PoolStats {
                allocated: 1,
                reused: 1,
                kept_bytes: 0
            }
        );
    }

    #[test]
    fn classes_round_up_and_large_writes_are_chunked() {
        let pool = BufPool::new(512, 64 << 20);
        let mut w = pool.take(3);
        assert_eq!(w.chunk_blocks, 4);
        w.block_mut(2).fill(1);
        let top = BufPool::top_class_blocks();
        let mut big = pool.take(2 * top + 1);
        assert_eq!((big.chunks.len(), big.chunk_blocks), (3, top));
        for i in 0..2 * top + 1 {
            big.block_mut(i).fill(i as u8);
        }
        let (chunks, per) = big.share();
        let i = top + 5;
        assert_eq!(chunks[i / per][(i % per) * 512], i as u8);
    }

    #[test]
    fn a_full_pool_makes_room_for_the_sizes_written_now() {
        // Room for two 4-block buffers: a burst of them fills the lists.
        let pool = BufPool::new(4096, 8 * 4096);
        let big: Vec<_> = (0..2).map(|_| pool.take(4).share().0).collect();
        drop(big);
        assert_eq!(pool.stats().kept_bytes, 8 * 4096);
        // Then single blocks: their buffers come back, and are reused,
        // instead of being freed because big ones hold the budget.
        for _ in 0..10 {
            let one = pool.take(1).share().0;
            drop(one);
        }
        let st = pool.stats();
        assert_eq!(st.allocated, 3, "{st:?}");
        assert_eq!(st.reused, 9, "{st:?}");
        assert!(st.kept_bytes <= 8 * 4096, "{st:?}");
    }

    #[test]
    fn the_free_lists_are_bounded_and_trim_empties_them() {
        let pool = BufPool::new(4096, 8192);
        let bufs: Vec<_> = (0..4).map(|_| pool.take(1).share().0).collect();
        drop(bufs);
        assert_eq!(pool.stats().kept_bytes, 8192, "kept at most the limit");
        pool.trim();
        assert_eq!(pool.stats().kept_bytes, 0);
    }

    #[test]
    fn handles_dropped_on_many_threads_never_lose_a_buffer_twice() {
        let pool = BufPool::new(4096, 64 << 20);
        for _ in 0..200 {
            let (chunks, _) = pool.take(1).share();
            let h = chunks[0].clone();
            let t = std::thread::spawn(move || drop(h));
            drop(chunks);
            t.join().unwrap();
        }
        let s = pool.stats();
        assert!(
            s.kept_bytes <= 4096,
            "one buffer can be on the list at most: {s:?}"
        );
        assert_eq!(s.allocated + s.reused, 200);
    }
}
