//! Generational handle tables: what a C `jbdev_volume *` or `jbdev_txn *`
//! really is.
//!
//! A handle is never a pointer to memory the library frees. It is a number,
//! `generation << INDEX_BITS | slot_index`, cast to an opaque pointer type.
//! Slots live in chunks that are allocated on first use and never freed, so
//! looking a handle up can always be done safely, and a handle whose object
//! was closed (its slot is empty, or holds a newer generation) is reported as
//! `-EBADF` instead of being undefined behaviour. No `unsafe` is involved.
//!
//! Each slot guards its value with a `ShardedLock`: a call takes a read lock
//! on the shard of its own thread, so threads sharing one volume handle do
//! not bounce one cache line per I/O (a line every I/O writes stops scaling
//! with threads); closing takes the write lock,
//! which waits for the calls in flight on that handle and turns every later
//! call into `-EBADF`. Only open and close touch the table-wide allocator
//! mutex.
//!
//! A write lock on a sharded lock is taken shard by shard, so while close
//! waits for one shard's readers, new calls could still enter through the
//! shards it has not reached (64 busy threads kept a close waiting 5 s for
//! thousands of calls that started after it). Close therefore first marks
//! the slot as closing, for the generation it ends; a call that gets its
//! read lock and sees the mark is refused with `-EBADF` at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use crossbeam_utils::sync::ShardedLock;

use crate::error::{Error, Result};

/// Slots per lazily allocated chunk.
const CHUNK_SLOTS: usize = 64;
/// Chunks per table; with `CHUNK_SLOTS` this bounds the live objects of one
/// kind to 65,536 (`-EMFILE` beyond).
const CHUNK_COUNT: usize = 1024;
const SLOT_CAPACITY: usize = CHUNK_SLOTS * CHUNK_COUNT;
/// Bits of a handle holding the slot index; the rest hold the generation.
const INDEX_BITS: u32 = 16;
const _: () = assert!(SLOT_CAPACITY == 1 << INDEX_BITS);
/// Generations wrap within the bits left over (48 on 64-bit targets), skipping 0.
const GENERATION_MAX: usize = usize::MAX >> INDEX_BITS;

struct SlotState<T> {
    /// Generation of the current or most recent occupant; 0 = never used.
    generation: usize,
    value: Option<T>,
}

struct Slot<T> {
    state: ShardedLock<SlotState<T>>,
    /// The generation a close in progress is ending (0: none). Set before
    /// the close takes the write lock; calls of that generation that take
    /// their read lock after it fail instead of entering.
    closing: AtomicUsize,
}

impl<T> Slot<T> {
    /// A close of `generation` has begun: its calls are refused.
    fn closing(&self, generation: usize) -> bool {
        self.closing.load(Ordering::Acquire) == generation
    }
}

struct Allocator {
    /// Slots below this index have been handed out at least once.
    next_index: usize,
    /// Indexes of empty slots, reused before `next_index` grows.
    free: Vec<usize>,
}

/// A table of live objects of one kind.
pub(crate) struct Table<T> {
    /// Used in error messages ("volume", "transaction").
    kind: &'static str,
    chunks: [OnceLock<Box<[Slot<T>]>>; CHUNK_COUNT],
    allocator: Mutex<Allocator>,
}

fn encode(index: usize, generation: usize) -> usize {
    (generation << INDEX_BITS) | index
}

fn decode(handle: usize) -> (usize, usize) {
    (handle & (SLOT_CAPACITY - 1), handle >> INDEX_BITS)
}

impl<T> Table<T> {
    pub(crate) const fn new(kind: &'static str) -> Self {
        Self {
            kind,
            chunks: [const { OnceLock::new() }; CHUNK_COUNT],
            allocator: Mutex::new(Allocator {
                next_index: 0,
                free: Vec::new(),
            }),
        }
    }

    fn slot(&self, index: usize) -> Option<&Slot<T>> {
        let chunk = self.chunks.get(index / CHUNK_SLOTS)?.get()?;
        chunk.get(index % CHUNK_SLOTS)
    }

    /// Stores `value` and returns its handle (never 0).
    pub(crate) fn insert(&self, value: T) -> Result<usize> {
        let index = {
            let mut alloc = self
                .allocator
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match alloc.free.pop() {
                Some(i) => i,
                None if alloc.next_index < SLOT_CAPACITY => {
                    alloc.next_index += 1;
                    alloc.next_index - 1
                }
                None => {
                    return Err(Error::new(
                        libc::EMFILE,
                        format!("too many open {} handles ({SLOT_CAPACITY})", self.kind),
                    ))
                }
            }
        };
        // Invariant: `index` is now owned by this call alone (it is neither
        // in the free list nor below any other caller's fresh next_index).
        #[allow(clippy::indexing_slicing)] // index < SLOT_CAPACITY = chunks.len() * CHUNK_SLOTS
        let chunk = self.chunks[index / CHUNK_SLOTS].get_or_init(|| {
            (0..CHUNK_SLOTS)
                .map(|_| Slot {
                    state: ShardedLock::new(SlotState {
                        generation: 0,
                        value: None,
                    }),
                    closing: AtomicUsize::new(0),
                })
                .collect()
        });
        #[allow(clippy::indexing_slicing)] // every chunk holds CHUNK_SLOTS slots
        let slot = &chunk[index % CHUNK_SLOTS];
        let mut state = slot.state.write().unwrap_or_else(PoisonError::into_inner);
        debug_assert!(state.value.is_none(), "allocated slot must be empty");
        state.generation = if state.generation >= GENERATION_MAX {
            1
        } else {
            state.generation + 1
        };
        state.value = Some(value);
        Ok(encode(index, state.generation))
    }

    /// Runs `f` on the live value of `handle` under a per-thread-shard read
    /// lock; `-EBADF` if the handle is not live.
    pub(crate) fn with<R>(&self, handle: usize, f: impl FnOnce(&T) -> Result<R>) -> Result<R> {
        let (index, generation) = decode(handle);
        let slot = self
            .slot(index)
            .filter(|_| generation != 0)
            .ok_or_else(|| Error::bad_handle(self.kind))?;
        // Refused before the lock too, so a call that starts during a
        // close does not queue on a shard the close holds already.
        if slot.closing(generation) {
            return Err(Error::bad_handle(self.kind));
        }
        let state = slot.state.read().unwrap_or_else(PoisonError::into_inner);
        match &state.value {
            Some(v) if state.generation == generation && !slot.closing(generation) => f(v),
            _ => Err(Error::bad_handle(self.kind)),
        }
    }

    /// Like [`Table::with`] but exclusive: for objects one thread mutates.
    pub(crate) fn with_mut<R>(
        &self,
        handle: usize,
        f: impl FnOnce(&mut T) -> Result<R>,
    ) -> Result<R> {
        let (index, generation) = decode(handle);
        let slot = self
            .slot(index)
            .filter(|_| generation != 0)
            .ok_or_else(|| Error::bad_handle(self.kind))?;
        if slot.closing(generation) {
            return Err(Error::bad_handle(self.kind));
        }
        let mut state = slot.state.write().unwrap_or_else(PoisonError::into_inner);
        let live = state.generation == generation && !slot.closing(generation);
        match &mut state.value {
            Some(v) if live => f(v),
            _ => Err(Error::bad_handle(self.kind)),
        }
    }

    /// Takes the value out, ending the handle. Waits for calls in flight on
    /// it; every later use of the handle fails with `-EBADF`.
    pub(crate) fn remove(&self, handle: usize) -> Result<T> {
        let (index, generation) = decode(handle);
        let slot = self
            .slot(index)
            .filter(|_| generation != 0)
            .ok_or_else(|| Error::bad_handle(self.kind))?;
        // Calls that take their read lock from here on are refused; the
        // write lock below waits only for the ones already in.
        //
        // IMPORTANT: mark only a live generation, checked under a read
        // lock, which keeps it live (ending it takes the write lock). A
        // mark for a generation not issued yet (a forged or guessed value,
        // a handle of the other table) would refuse every call of the
        // object that later gets it; one for an older generation (a stale
        // handle) would clear the mark of a close in progress. So a mark
        // always names the generation a close is ending.
        {
            let state = slot.state.read().unwrap_or_else(PoisonError::into_inner);
            if state.generation != generation || state.value.is_none() {
                return Err(Error::bad_handle(self.kind));
            }
            slot.closing.store(generation, Ordering::Release);
        }
        let value = {
            let mut state = slot.state.write().unwrap_or_else(PoisonError::into_inner);
            if state.generation != generation {
                return Err(Error::bad_handle(self.kind));
            }
            state
                .value
                .take()
                .ok_or_else(|| Error::bad_handle(self.kind))?
        };
        self.allocator
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .free
            .push(index);
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_and_forged_handles_are_rejected() {
        let table: Table<u32> = Table::new("test");
        let a = table.insert(7).unwrap();
        assert_ne!(a, 0);
        assert_eq!(table.with(a, |v| Ok(*v)).unwrap(), 7);
        assert_eq!(table.remove(a).unwrap(), 7);
        // The slot is reused with a new generation: the old handle stays dead.
        let b = table.insert(8).unwrap();
        assert_eq!(decode(a).0, decode(b).0);
        assert_ne!(a, b);
        assert_eq!(table.with(a, |v| Ok(*v)).unwrap_err().errno, libc::EBADF);
        assert_eq!(table.remove(a).unwrap_err().errno, libc::EBADF);
        assert_eq!(table.with(b, |v| Ok(*v)).unwrap(), 8);
        for forged in [0, 1, usize::MAX, encode(5000, 1), encode(decode(b).0, 0)] {
            assert_eq!(
                table.with(forged, |v| Ok(*v)).unwrap_err().errno,
                libc::EBADF,
                "handle {forged:#x}"
            );
        }
    }

    /// The handle the next occupant of `h`'s slot will get.
    fn next_in_slot(h: usize) -> usize {
        let (index, generation) = decode(h);
        encode(index, generation + 1)
    }

    /// Report 5b of session 21: a close of a generation not issued yet
    /// (garbage, or a handle of the other kind) set the slot's closing
    /// mark, and the object that later got that generation failed every
    /// call with `-EBADF`. Only a close of the live generation marks.
    #[test]
    fn a_close_of_a_handle_not_issued_yet_does_not_poison_it() {
        let table: Table<u32> = Table::new("test");
        let a = table.insert(1).unwrap();
        // Closes of the next two generations of a's slot, while a lives.
        let b = next_in_slot(a);
        let c = next_in_slot(b);
        assert_eq!(table.remove(b).unwrap_err().errno, libc::EBADF);
        assert_eq!(table.remove(c).unwrap_err().errno, libc::EBADF);
        assert_eq!(table.with(a, |x| Ok(*x)).unwrap(), 1);
        assert_eq!(table.remove(a).unwrap(), 1);
        for (expected, value) in [(b, 2), (c, 3)] {
            let h = table.insert(value).unwrap();
            assert_eq!(h, expected, "the slot is reused");
            assert_eq!(table.with(h, |x| Ok(*x)).unwrap(), value);
            assert_eq!(table.with_mut(h, |x| Ok(*x)).unwrap(), value);
            assert_eq!(table.remove(h).unwrap(), value);
        }
    }

    #[test]
    fn with_mut_updates_in_place() {
        let table: Table<Vec<u8>> = Table::new("test");
        let h = table.insert(Vec::new()).unwrap();
        table
            .with_mut(h, |v| {
                v.push(1);
                Ok(())
            })
            .unwrap();
        assert_eq!(table.remove(h).unwrap(), vec![1]);
    }

    #[test]
    fn remove_waits_for_readers_and_concurrent_use_sees_ebadf_after() {
        use std::sync::atomic::{AtomicBool, Ordering};
        static TABLE: Table<u64> = Table::new("test");
        let h = TABLE.insert(42).unwrap();
        let removed = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    // Bounded: each reader stops at the first EBADF or after
                    // 100,000 lookups.
                    for _ in 0..100_000 {
                        match TABLE.with(h, |v| {
                            // A read lock is held here, so remove() cannot
                            // have taken the value yet.
                            assert!(!removed.load(Ordering::SeqCst));
                            Ok(*v)
                        }) {
                            Ok(v) => assert_eq!(v, 42),
                            Err(e) => {
                                assert_eq!(e.errno, libc::EBADF);
                                break;
                            }
                        }
                    }
                });
            }
            s.spawn(|| {
                std::thread::yield_now();
                let mut taken = TABLE.remove(h).unwrap();
                removed.store(true, Ordering::SeqCst);
                taken += 1;
                assert_eq!(taken, 43);
            });
        });
        assert_eq!(TABLE.with(h, |v| Ok(*v)).unwrap_err().errno, libc::EBADF);
    }

    /// While a close waits for a call in flight, a call that starts is
    /// refused at once instead of entering (and delaying the close): before,
    /// it got in through a shard the close had not locked yet.
    #[test]
    fn a_call_that_starts_while_close_waits_is_refused() {
        use std::sync::mpsc;
        static TABLE: Table<u64> = Table::new("test");
        let h = TABLE.insert(7).unwrap();
        let (index, generation) = decode(h);
        let slot = TABLE.slot(index).unwrap();
        let (entered_tx, entered_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            let in_flight = s.spawn(move || {
                TABLE.with(h, |v| {
                    entered_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    Ok(*v)
                })
            });
            entered_rx.recv().unwrap();
            let closer = s.spawn(|| TABLE.remove(h));
            // Bounded wait for the close to announce itself.
            for _ in 0..10_000 {
                if slot.closing(generation) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            assert!(slot.closing(generation));
            // From other threads (other shards) too: refused, not blocked.
            for _ in 0..4 {
                let r = std::thread::spawn(move || TABLE.with(h, |v| Ok(*v)).map_err(|e| e.errno))
                    .join()
                    .unwrap();
                assert_eq!(r, Err(libc::EBADF));
            }
            assert!(!closer.is_finished(), "close waits for the call in flight");
            release_tx.send(()).unwrap();
            assert_eq!(in_flight.join().unwrap().unwrap(), 7);
            assert_eq!(closer.join().unwrap().unwrap(), 7);
        });
        // The slot's next occupant is not affected by the old mark.
        let h2 = TABLE.insert(8).unwrap();
        assert_eq!(TABLE.with(h2, |v| Ok(*v)).unwrap(), 8);
        // A stale handle's close leaves it alone.
        assert_eq!(TABLE.remove(h).unwrap_err().errno, libc::EBADF);
        assert_eq!(TABLE.with(h2, |v| Ok(*v)).unwrap(), 8);
    }
}
