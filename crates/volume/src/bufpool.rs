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
//!   takes as many top-class buffers as it fills, then one buffer per set
//!   bit of the rest (5 blocks: 4 + 1), so it holds exactly `n` blocks
//!   ([`WriteBuf`] hides the chunking). Rounding up to one class instead
//!   held up to twice the bytes a write needed until its checkpoint (5 KiB
//!   writes took 8 KiB buffers; a mix of sizes ran at three times the
//!   memory of 4 KiB writes alone: session 28's pass).
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
use jbdev_device::{AlignedBuf, MAX_ALIGN};
use jbdev_journal::writer::BlockSums;
use smallvec::SmallVec;

/// Size classes: 1, 2, 4, … 256 blocks (1 MiB of 4 KiB blocks).
pub const CLASSES: usize = 9;

/// Buffers of at most this many bytes are carved from one allocation of
/// [`CARVE_CHUNK`] bytes ([`AlignedBuf::carve`]).
const CARVE_MAX: usize = 16 << 10;
/// The allocation small buffers are carved from: 16 buffers of 4 KiB, and
/// below glibc's default mmap threshold (128 KiB), so chunks come from the
/// heap rather than one memory mapping each.
const CARVE_CHUNK: usize = 64 << 10;

struct Slot {
    buf: AlignedBuf,
    /// Per block: the journal sums of its bytes, if the writer computed
    /// them ([`WriteBuf::seal`]); cleared whenever the slot is taken.
    sums: Vec<Option<BlockSums>>,
    /// Per block: it holds zeroes a zeroing request (write-zeroes, trim)
    /// put there, not data that happens to be zero ([`WriteBuf::mark_zeroed`]);
    /// cleared whenever the slot is taken. Only such blocks may become
    /// holes at checkpoint.
    zeroed: Vec<bool>,
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
            Ok(mut slot) => {
                inner.kept.fetch_sub(slot.buf.len(), Ordering::Relaxed);
                inner.reused.fetch_add(1, Ordering::Relaxed);
                // IMPORTANT: sums of the previous contents must not survive
                // into the next write. (A slot that came from
                // `SharedBuf::from_aligned` has no sums list yet.)
                match Arc::get_mut(&mut slot) {
                    Some(s) => {
                        s.sums.clear();
                        s.sums.resize(1 << class, None);
                        s.zeroed.clear();
                        s.zeroed.resize(1 << class, false);
                    }
                    None => unreachable!("a free-list slot is never shared"),
                }
                slot
            }
            Err(_) => {
                inner.allocated.fetch_add(1, Ordering::Relaxed);
                let len = inner.bs << class;
                let new_slot = |buf| {
                    Arc::new(Slot {
                        buf,
                        sums: vec![None; 1 << class],
                        zeroed: vec![false; 1 << class],
                        class: class as u8,
                    })
                };
                if len <= CARVE_MAX
                    && len.is_multiple_of(MAX_ALIGN)
                    && inner.keep_bytes >= CARVE_CHUNK
                {
                    // Small buffers come carved from one allocation: alone,
                    // each would cost a page more (ARCHITECTURE 12b). The
                    // rest of the chunk goes to the free list (a pool that
                    // could not keep it carves nothing: pieces it dropped
                    // would hold their chunk's memory until the last one
                    // went).
                    let mut pieces = AlignedBuf::carve(len, CARVE_CHUNK / len);
                    let mine = pieces.pop().expect("carve gives at least one piece");
                    for piece in pieces {
                        inner.recycle(new_slot(piece));
                    }
                    new_slot(mine)
                } else {
                    new_slot(AlignedBuf::zeroed(len))
                }
            }
        };
        OwnedBuf {
            slot: Some(slot),
            pool: self.inner.clone(),
        }
    }

    /// A buffer for a write of `blocks` blocks (contents unspecified: the
    /// caller overwrites every byte it uses).
    pub fn take(&self, blocks: usize) -> WriteBuf {
        let blocks = blocks.max(1);
        let top = Self::top_class_blocks();
        let full = blocks / top;
        let rest = blocks % top;
        let mut chunks = SmallVec::new();
        for _ in 0..full {
            chunks.push(self.take_class(CLASSES - 1));
        }
        // The rest's set bits, largest first (see `WriteBuf::locate`).
        for class in (0..CLASSES - 1).rev() {
            if rest & (1 << class) != 0 {
                chunks.push(self.take_class(class));
            }
        }
        WriteBuf {
            chunks,
            layout: Layout { full, rest },
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

/// A buffer only its holder sees: writable. Dropped unshared (a write
/// that gave up: a non-blocking attempt finding the log full, an error), it
/// goes back to the pool like a last [`SharedBuf`]; freed instead, a carved
/// buffer would hold its whole chunk while the chunk's other buffers went
/// round the pool.
struct OwnedBuf {
    /// Always `Some` until `share` or the drop takes it.
    slot: Option<Arc<Slot>>,
    pool: Arc<Inner>,
}

impl OwnedBuf {
    fn slot_mut(&mut self) -> &mut Slot {
        // Never cloned before `share`, so the holder is the only one.
        match self.slot.as_mut().and_then(Arc::get_mut) {
            Some(s) => s,
            None => unreachable!("an owned pool buffer is never shared"),
        }
    }

    fn share(mut self) -> SharedBuf {
        SharedBuf {
            slot: self.slot.take(),
            pool: self.pool.clone(),
        }
    }
}

impl Drop for OwnedBuf {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            if slot.class != u8::MAX {
                self.pool.recycle(slot);
            }
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
            slot: Some(Arc::new(Slot {
                buf,
                sums: Vec::new(),
                zeroed: Vec::new(),
                class,
            })),
            pool: pool.inner.clone(),
        }
    }

    /// The sums of block `i` of this buffer, if its writer computed them.
    pub fn sums(&self, i: usize) -> Option<BlockSums> {
        self.slot.as_ref()?.sums.get(i).copied().flatten()
    }

    /// Whether block `i` holds zeroes a zeroing request put there
    /// ([`WriteBuf::mark_zeroed`]).
    pub fn zeroed(&self, i: usize) -> bool {
        self.slot
            .as_ref()
            .is_some_and(|s| s.zeroed.get(i).copied().unwrap_or(false))
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

/// How the blocks of one write lie in its buffers: `full` top-class
/// buffers, then one buffer per set bit of `rest`, largest first.
#[derive(Clone, Copy, Debug)]
struct Layout {
    full: usize,
    rest: usize,
}

impl Layout {
    /// The buffer holding block `i` and the block's index in it.
    fn locate(self, i: usize) -> (usize, usize) {
        let top = BufPool::top_class_blocks();
        if i < self.full * top {
            return (i / top, i % top);
        }
        let mut r = i - self.full * top;
        let mut chunk = self.full;
        for class in (0..CLASSES - 1).rev() {
            let size = 1 << class;
            if self.rest & size != 0 {
                if r < size {
                    return (chunk, r);
                }
                r -= size;
                chunk += 1;
            }
        }
        unreachable!("block {i} is past the write's {:?}", self)
    }
}

/// The buffer of one journaled write: exactly its blocks, in pooled
/// buffers of the size classes (see the module documentation).
pub struct WriteBuf {
    chunks: SmallVec<[OwnedBuf; 4]>,
    layout: Layout,
    bs: usize,
}

/// A [`WriteBuf`] shared: the buffers the overlay, the commit and the
/// checkpoint hold its blocks by.
pub struct SharedWrite {
    chunks: SmallVec<[SharedBuf; 4]>,
    layout: Layout,
    bs: usize,
}

impl SharedWrite {
    /// The buffer holding block `i` of the write, and the block's byte
    /// offset in it.
    pub fn block(&self, i: usize) -> (&SharedBuf, usize) {
        let (c, b) = self.layout.locate(i);
        (&self.chunks[c], b * self.bs)
    }

    /// The buffers, in the order of the write's blocks.
    #[cfg(test)]
    fn into_chunks(self) -> SmallVec<[SharedBuf; 4]> {
        self.chunks
    }
}

impl WriteBuf {
    /// Block `i` of the write, writable. Forgets the block's sums and its
    /// zeroed mark: they would not describe what the caller writes now.
    pub fn block_mut(&mut self, i: usize) -> &mut [u8] {
        let (slot, b, bs) = self.locate(i);
        slot.sums[b] = None;
        slot.zeroed[b] = false;
        &mut slot.buf[b * bs..(b + 1) * bs]
    }

    /// The slot holding block `i`, the block's index in it, the block size.
    fn locate(&mut self, i: usize) -> (&mut Slot, usize, usize) {
        let (c, b) = self.layout.locate(i);
        (self.chunks[c].slot_mut(), b, self.bs)
    }

    /// Computes and keeps the journal sums of block `i` as it is now. The
    /// block must not change afterwards (see [`WriteBuf::block_mut`]); a
    /// block that needs escaping in the log gets none (the commit computes
    /// them over the escaped bytes).
    pub fn seal(&mut self, i: usize) {
        let (slot, b, bs) = self.locate(i);
        let bytes = &slot.buf[b * bs..(b + 1) * bs];
        slot.sums[b] = (!jbdev_journal::format::needs_escape(bytes)).then(|| BlockSums::of(bytes));
    }

    /// Marks block `i`, all zeroes now, as written by a zeroing request:
    /// the checkpoint may punch it out of home instead of writing it (a
    /// plain write of zeroes stays data, so a preallocated image keeps its
    /// space).
    pub fn mark_zeroed(&mut self, i: usize) {
        let (slot, b, _) = self.locate(i);
        slot.zeroed[b] = true;
    }

    /// Shares the buffers ([`SharedWrite::block`] finds block `i`).
    pub fn share(self) -> SharedWrite {
        SharedWrite {
            chunks: self.chunks.into_iter().map(OwnedBuf::share).collect(),
            layout: self.layout,
            bs: self.bs,
        }
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
        // The rest of the carved chunk waits on the free list.
        let rest = (CARVE_CHUNK - 4096) as u64;
        assert_eq!(pool.stats().kept_bytes, rest);
        let chunks = w.share().into_chunks();
        assert_eq!(chunks.len(), 1);
        let a = chunks[0].clone();
        drop(chunks);
        assert_eq!(pool.stats().kept_bytes, rest, "a handle is still alive");
        assert_eq!(a[0], 9);
        drop(a);
        assert_eq!(pool.stats().kept_bytes, rest + 4096);
        let _again = pool.take(1);
        assert_eq!(
            pool.stats(),
            PoolStats {
                allocated: 1,
                reused: 1,
                kept_bytes: rest
            }
        );
    }

    /// A write that gives up before sharing its buffer (the NBD server's
    /// non-blocking attempt finding the log full) gives the buffer back:
    /// freed, a carved one would hold its chunk for as long as the chunk's
    /// other buffers went round the pool.
    #[test]
    fn a_buffer_dropped_unshared_comes_back() {
        let pool = BufPool::new(4096, 4 << 20);
        let kept = pool.stats().kept_bytes;
        let mut w = pool.take(1);
        w.block_mut(0).fill(3);
        w.seal(0);
        w.mark_zeroed(0);
        drop(w);
        let st = pool.stats();
        assert_eq!(st.kept_bytes, kept + CARVE_CHUNK as u64, "{st:?}");
        // Reused without its old sums or zeroed mark.
        let again = pool.take(1).share().into_chunks();
        assert_eq!(pool.stats().allocated, 1);
        assert!(again[0].sums(0).is_none() && !again[0].zeroed(0));
        // Large writes too: 300 blocks are 256 + 32 + 8 + 4, and the
        // 4-block buffer (16 KiB) is carved with three more.
        drop(pool.take(300));
        assert_eq!(
            pool.stats().kept_bytes,
            (CARVE_CHUNK - 4096 + (300 << 12) + 3 * (16 << 10)) as u64
        );
    }

    /// Small buffers are carved 64 KiB at a time: sixteen 4 KiB writes
    /// make one allocation, each buffer aligned and distinct; a pool too
    /// small to keep a chunk's rest allocates buffers one by one.
    #[test]
    fn small_buffers_are_carved_from_one_allocation() {
        let pool = BufPool::new(4096, 1 << 20);
        let held: Vec<_> = (0..16)
            .map(|i| {
                let mut w = pool.take(1);
                w.block_mut(0).fill(i as u8);
                w.share().into_chunks()
            })
            .collect();
        let st = pool.stats();
        assert_eq!(
            (st.allocated, st.reused, st.kept_bytes),
            (1, 15, 0),
            "{st:?}"
        );
        for (i, h) in held.iter().enumerate() {
            assert!(AlignedBuf::is_aligned(h[0].as_ptr(), MAX_ALIGN));
            assert!(
                h[0].iter().all(|&b| b == i as u8),
                "buffer {i} was overwritten"
            );
        }
        // Eight-block buffers (32 KiB) are not carved.
        let _big = pool.take(8);
        assert_eq!(pool.stats().allocated, 2);
        drop(held);
        assert_eq!(pool.stats().kept_bytes, CARVE_CHUNK as u64);

        let small = BufPool::new(4096, 16 << 10);
        let _a = small.take(1);
        let _b = small.take(1);
        let st = small.stats();
        assert_eq!(
            (st.allocated, st.reused, st.kept_bytes),
            (2, 0, 0),
            "{st:?}"
        );
    }

    /// The zeroed mark says a zeroing request wrote the block: writing the
    /// block again clears it, and a reused buffer starts without it (a
    /// stale mark would let the checkpoint punch out a block of data).
    #[test]
    fn zeroed_marks_do_not_outlive_their_block() {
        let pool = BufPool::new(4096, 1 << 20);
        let mut w = pool.take(2);
        w.block_mut(0).fill(0);
        w.block_mut(1).fill(0);
        w.mark_zeroed(0);
        w.mark_zeroed(1);
        w.block_mut(1)[7] = 9;
        let chunks = w.share().into_chunks();
        assert!(chunks[0].zeroed(0));
        assert!(!chunks[0].zeroed(1), "block 1 written after its mark");
        drop(chunks);
        let again = pool.take(2);
        assert_eq!(pool.stats().reused, 1);
        let chunks = again.share().into_chunks();
        assert!(!chunks[0].zeroed(0), "the previous write's mark survived");
        let outside = SharedBuf::from_aligned(&pool, AlignedBuf::zeroed(4096));
        assert!(!outside.zeroed(0));
    }

    /// Sums describe the bytes they were computed over and nothing else:
    /// writing the block again forgets them, a reused buffer starts without
    /// them, and a block that needs escaping in the log gets none.
    #[test]
    fn sums_are_of_the_sealed_bytes_only() {
        let pool = BufPool::new(4096, 1 << 20);
        let mut w = pool.take(2);
        w.block_mut(0).fill(3);
        w.block_mut(1).fill(4);
        w.seal(0);
        w.seal(1);
        w.block_mut(1)[7] = 9;
        let chunks = w.share().into_chunks();
        assert_eq!(chunks[0].sums(0), Some(BlockSums::of(&chunks[0][..4096])));
        assert_eq!(chunks[0].sums(1), None, "block 1 changed after its seal");
        drop(chunks);
        let mut again = pool.take(2);
        assert_eq!(pool.stats().reused, 1);
        let mut magic = [0u8; 4096];
        magic[..4].copy_from_slice(&jbdev_journal::format::JBD2_MAGIC.to_be_bytes());
        again.block_mut(0).copy_from_slice(&magic);
        again.seal(0);
        let chunks = again.share().into_chunks();
        assert_eq!(
            chunks[0].sums(0),
            None,
            "needs escaping: the commit sums it"
        );
        assert_eq!(
            chunks[0].sums(1),
            None,
            "the previous write's sums survived"
        );
        // A buffer from outside the pool has no sums, and once recycled it
        // is taken like any other.
        let outside = SharedBuf::from_aligned(&pool, AlignedBuf::zeroed(4096));
        assert_eq!(outside.sums(0), None);
        drop(outside);
        let mut one = pool.take(1);
        one.block_mut(0).fill(1);
        one.seal(0);
        assert!(one.share().into_chunks()[0].sums(0).is_some());
    }

    /// A write holds exactly its blocks: full top-class buffers, then one
    /// per set bit of the rest, largest first; every block has its own
    /// bytes, found where `block` says.
    #[test]
    fn a_write_holds_exactly_its_blocks() {
        let pool = BufPool::new(512, 64 << 20);
        let top = BufPool::top_class_blocks();
        for n in [1, 2, 3, 5, 7, 8, 13, top - 1, top, top + 1, 2 * top + 77] {
            let mut w = pool.take(n);
            let lens: Vec<usize> = w
                .chunks
                .iter()
                .map(|c| c.slot.as_ref().unwrap().buf.len())
                .collect();
            assert_eq!(lens.iter().sum::<usize>(), n * 512, "{n} blocks: {lens:?}");
            assert!(
                lens.windows(2).all(|p| p[0] >= p[1]),
                "{n} blocks: {lens:?}"
            );
            for i in 0..n {
                w.block_mut(i).fill(i as u8);
                w.seal(i);
            }
            let shared = w.share();
            let mut seen = std::collections::HashSet::new();
            for i in 0..n {
                let (buf, off) = shared.block(i);
                assert!(
                    seen.insert((buf.as_ptr(), off)),
                    "block {i} of {n} shares bytes"
                );
                assert!(
                    buf[off..off + 512].iter().all(|&b| b == i as u8),
                    "block {i} of {n}"
                );
                assert!(
                    buf.sums(off / 512).is_some(),
                    "block {i} of {n} lost its sums"
                );
            }
        }
    }

    #[test]
    fn a_full_pool_makes_room_for_the_sizes_written_now() {
        // Room for two 4-block buffers: a burst of them fills the lists.
        let pool = BufPool::new(4096, 8 * 4096);
        let big: Vec<_> = (0..2).map(|_| pool.take(4).share().into_chunks()).collect();
        drop(big);
        assert_eq!(pool.stats().kept_bytes, 8 * 4096);
        // Then single blocks: their buffers come back, and are reused,
        // instead of being freed because big ones hold the budget.
        for _ in 0..10 {
            let one = pool.take(1).share().into_chunks();
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
        let bufs: Vec<_> = (0..4).map(|_| pool.take(1).share().into_chunks()).collect();
        drop(bufs);
        assert_eq!(pool.stats().kept_bytes, 8192, "kept at most the limit");
        pool.trim();
        assert_eq!(pool.stats().kept_bytes, 0);
    }

    #[test]
    fn handles_dropped_on_many_threads_never_lose_a_buffer_twice() {
        let pool = BufPool::new(4096, 64 << 20);
        for _ in 0..200 {
            let chunks = pool.take(1).share().into_chunks();
            let h = chunks[0].clone();
            let t = std::thread::spawn(move || drop(h));
            drop(chunks);
            t.join().unwrap();
        }
        let s = pool.stats();
        assert!(
            s.kept_bytes <= CARVE_CHUNK as u64,
            "one carved chunk can be on the list at most: {s:?}"
        );
        assert_eq!(s.allocated + s.reused, 200);
    }
}
