//! Generational handle tables: what a C `jbdev_volume *` or `jbdev_txn *`
//! really is.
//!
//! A handle is never a pointer to memory the library frees. It is a number
//! cast to an opaque pointer type:
//!
//! ```text
//!   bits 63..24   generation of the slot's occupant (from 1; 0 is never issued)
//!   bits 23..16   kind tag: 0x56 ('V') volume, 0x54 ('T') transaction
//!   bits 15..0    slot index
//! ```
//!
//! Slots live in chunks that are allocated on first use and never freed, so
//! looking a handle up can always be done safely, and a handle whose object
//! was closed (its slot is empty, or holds a newer generation) is reported as
//! `-EBADF` instead of being undefined behaviour. No `unsafe` is involved.
//! A slot's generations never repeat (a used-up slot is retired, see
//! `GENERATION_MAX`), so a handle value names one object, ever: a stale
//! handle cannot come back to life on a later occupant of its slot.
//!
//! Each kind has its own table and its own tag, so no handle of one kind is
//! ever a handle of another: the first volume handle is `0x1560000`, the
//! first transaction handle `0x1540000`, and a table refuses a handle
//! carrying the other kind's tag with `-EBADF` and a message naming both.
//! (Both used to be `generation << 16 | slot`: the first of each was
//! `0x10000`, and a transaction handle passed as a volume acted on the
//! volume. Bindings that keep handles as `void *` mix the two up easily.) A
//! byte rather than a bit, so that a made-up value (a small integer, a real
//! pointer, stale memory) passes a table's tag check once in 256, not once
//! in 2, before its slot and generation must match too.
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

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use crossbeam_utils::sync::ShardedLock;

use crate::error::{Error, Result};

/// Slots per lazily allocated chunk.
const CHUNK_SLOTS: usize = 64;
/// Chunks per table; with `CHUNK_SLOTS` this bounds the live objects of one
/// kind to 65,536 (`-EMFILE` beyond).
const CHUNK_COUNT: usize = 1024;
const SLOT_CAPACITY: usize = CHUNK_SLOTS * CHUNK_COUNT;
/// Bits of a handle holding the slot index, then the kind tag; the rest
/// hold the generation.
const INDEX_BITS: u32 = 16;
const _: () = assert!(SLOT_CAPACITY == 1 << INDEX_BITS);
const TAG_BITS: u32 = 8;
const GENERATION_SHIFT: u32 = INDEX_BITS + TAG_BITS;
/// The last generation a slot issues (40 bits); the slot is then retired,
/// never wrapped back to 1: its next object would get the handle of its
/// first, which a program may still hold. Reused every microsecond, a slot
/// lasts 12 days and the 65,536 slots 2,000 years.
const GENERATION_MAX: usize = usize::MAX >> GENERATION_SHIFT;
const _: () = assert!(
    usize::BITS >= 64,
    "jbdev's C handles need 64-bit pointers: with 32, a slot would be used up after 255 objects"
);

/// What a handle names. Each kind has one table (in `ffi.rs`) and a tag of
/// its own in the handle bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Volume,
    Transaction,
}

impl Kind {
    const ALL: [Kind; 2] = [Kind::Volume, Kind::Transaction];

    /// The tag byte: ASCII 'V' and 'T', so a handle printed in hex shows its
    /// kind. Never 0, so NULL and small integers carry no kind.
    const fn tag(self) -> usize {
        match self {
            Kind::Volume => 0x56,
            Kind::Transaction => 0x54,
        }
    }

    fn of_tag(tag: usize) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.tag() == tag)
    }

    /// Used in error messages.
    const fn name(self) -> &'static str {
        match self {
            Kind::Volume => "volume",
            Kind::Transaction => "transaction",
        }
    }

    /// The C type of its handles, for error messages.
    const fn c_type(self) -> &'static str {
        match self {
            Kind::Volume => "jbdev_volume *",
            Kind::Transaction => "jbdev_txn *",
        }
    }
}

const _: () = assert!(Kind::Volume.tag() != Kind::Transaction.tag());
const _: () = assert!(Kind::Volume.tag() != 0 && Kind::Volume.tag() < 1 << TAG_BITS);
const _: () = assert!(Kind::Transaction.tag() != 0 && Kind::Transaction.tag() < 1 << TAG_BITS);

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
    /// [`forks`] when the current occupant was stored: a handle is the
    /// process's that made it, never a forked child's.
    made_after_forks: AtomicU64,
}

/// [`jbdev_device::fork::generation`] now.
///
/// IMPORTANT: a child of `fork()` inherits the parent's handles but not
/// its volumes: the engine's threads are gone, its locks may be held
/// forever by threads that do not exist in the child, and its descriptors
/// are the parent's. A child that used one wrote its own commit into the
/// parent's journal (the parent then lost an acknowledged write after a
/// crash, 10 of 10 runs), hung, or panicked in close (session 22's
/// adversarial pass). So every call refuses a handle made before the
/// latest fork, before it takes any lock, and its close leaves the
/// parent's volume alone (the child's copy of it is simply not freed).
fn forks() -> u64 {
    jbdev_device::fork::generation()
}

impl<T> Slot<T> {
    /// The occupant was made before a fork this process is a child of.
    fn inherited(&self) -> bool {
        self.made_after_forks.load(Ordering::Acquire) != forks()
    }

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

/// A table of live objects of one kind. Invariant: one table per kind in
/// the library (tests make their own), or two tables would issue the same
/// handles.
pub(crate) struct Table<T> {
    kind: Kind,
    chunks: [OnceLock<Box<[Slot<T>]>>; CHUNK_COUNT],
    allocator: Mutex<Allocator>,
}

/// The fields of a handle (see the layout at the top).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fields {
    index: usize,
    tag: usize,
    generation: usize,
}

fn encode(kind: Kind, index: usize, generation: usize) -> usize {
    debug_assert!(index < SLOT_CAPACITY && generation <= GENERATION_MAX);
    (generation << GENERATION_SHIFT) | (kind.tag() << INDEX_BITS) | index
}

fn decode(handle: usize) -> Fields {
    Fields {
        index: handle & (SLOT_CAPACITY - 1),
        tag: (handle >> INDEX_BITS) & ((1 << TAG_BITS) - 1),
        generation: handle >> GENERATION_SHIFT,
    }
}

impl<T> Table<T> {
    pub(crate) const fn new(kind: Kind) -> Self {
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

    /// The slot `handle` names in this table and the generation it claims;
    /// `-EBADF` for a handle of another kind (said so), NULL, or a value
    /// that names no slot ever used. Whether the generation is live is the
    /// caller's check, under the slot's lock.
    fn locate(&self, handle: usize) -> Result<(usize, &Slot<T>, usize)> {
        let Fields {
            index,
            tag,
            generation,
        } = decode(handle);
        if tag != self.kind.tag() {
            return Err(match Kind::of_tag(tag) {
                Some(given) => Error::new(
                    libc::EBADF,
                    format!(
                        "a {} handle is expected ({}), but this is a {} handle ({})",
                        self.kind.name(),
                        self.kind.c_type(),
                        given.name(),
                        given.c_type()
                    ),
                ),
                None => self.bad_handle(),
            });
        }
        let slot = self
            .slot(index)
            .filter(|_| generation != 0)
            .ok_or_else(|| self.bad_handle())?;
        Ok((index, slot, generation))
    }

    fn bad_handle(&self) -> Error {
        Error::bad_handle(self.kind.name())
    }

    /// `-EBADF` for a handle this process inherited through `fork()` (see
    /// [`forks`]), before any lock is taken.
    fn refuse_inherited(&self, slot: &Slot<T>) -> Result<()> {
        if slot.inherited() {
            return Err(Error::new(
                libc::EBADF,
                format!(
                    "this {} handle was made by the parent process before fork(): a child \
                     cannot use it (open the volume in the child after the parent closed it); \
                     the parent's volume is left as it is",
                    self.kind.name()
                ),
            ));
        }
        Ok(())
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
                        format!(
                            "too many open {} handles ({SLOT_CAPACITY})",
                            self.kind.name()
                        ),
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
                    made_after_forks: AtomicU64::new(0),
                })
                .collect()
        });
        #[allow(clippy::indexing_slicing)] // every chunk holds CHUNK_SLOTS slots
        let slot = &chunk[index % CHUNK_SLOTS];
        let mut state = slot.state.write().unwrap_or_else(PoisonError::into_inner);
        debug_assert!(state.value.is_none(), "allocated slot must be empty");
        debug_assert!(
            state.generation < GENERATION_MAX,
            "a used-up slot is never handed out"
        );
        state.generation += 1;
        state.value = Some(value);
        slot.made_after_forks.store(forks(), Ordering::Release);
        Ok(encode(self.kind, index, state.generation))
    }

    /// Runs `f` on the live value of `handle` under a per-thread-shard read
    /// lock; `-EBADF` if the handle is not live.
    pub(crate) fn with<R>(&self, handle: usize, f: impl FnOnce(&T) -> Result<R>) -> Result<R> {
        let (_, slot, generation) = self.locate(handle)?;
        self.refuse_inherited(slot)?;
        // Refused before the lock too, so a call that starts during a
        // close does not queue on a shard the close holds already.
        if slot.closing(generation) {
            return Err(self.bad_handle());
        }
        let state = slot.state.read().unwrap_or_else(PoisonError::into_inner);
        match &state.value {
            Some(v) if state.generation == generation && !slot.closing(generation) => f(v),
            _ => Err(self.bad_handle()),
        }
    }

    /// Like [`Table::with`] but exclusive: for objects one thread mutates.
    pub(crate) fn with_mut<R>(
        &self,
        handle: usize,
        f: impl FnOnce(&mut T) -> Result<R>,
    ) -> Result<R> {
        let (_, slot, generation) = self.locate(handle)?;
        self.refuse_inherited(slot)?;
        if slot.closing(generation) {
            return Err(self.bad_handle());
        }
        let mut state = slot.state.write().unwrap_or_else(PoisonError::into_inner);
        let live = state.generation == generation && !slot.closing(generation);
        match &mut state.value {
            Some(v) if live => f(v),
            _ => Err(self.bad_handle()),
        }
    }

    /// Takes the value out, ending the handle. Waits for calls in flight on
    /// it; every later use of the handle fails with `-EBADF`.
    pub(crate) fn remove(&self, handle: usize) -> Result<T> {
        let (index, slot, generation) = self.locate(handle)?;
        self.refuse_inherited(slot)?;
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
                return Err(self.bad_handle());
            }
            slot.closing.store(generation, Ordering::Release);
        }
        let value = {
            let mut state = slot.state.write().unwrap_or_else(PoisonError::into_inner);
            if state.generation != generation {
                return Err(self.bad_handle());
            }
            state.value.take().ok_or_else(|| self.bad_handle())?
        };
        // A used-up slot is retired (see GENERATION_MAX).
        if generation < GENERATION_MAX {
            self.allocator
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .free
                .push(index);
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_and_forged_handles_are_rejected() {
        let table: Table<u32> = Table::new(Kind::Volume);
        let a = table.insert(7).unwrap();
        assert_ne!(a, 0);
        assert_eq!(table.with(a, |v| Ok(*v)).unwrap(), 7);
        assert_eq!(table.remove(a).unwrap(), 7);
        // The slot is reused with a new generation: the old handle stays dead.
        let b = table.insert(8).unwrap();
        assert_eq!(decode(a).index, decode(b).index);
        assert_ne!(a, b);
        assert_eq!(table.with(a, |v| Ok(*v)).unwrap_err().errno, libc::EBADF);
        assert_eq!(table.remove(a).unwrap_err().errno, libc::EBADF);
        assert_eq!(table.with(b, |v| Ok(*v)).unwrap(), 8);
        let Fields {
            index, generation, ..
        } = decode(b);
        for forged in [
            0,
            1,
            usize::MAX,
            encode(Kind::Volume, 5000, 1),
            encode(Kind::Volume, index, 0),
            // b without its tag, and with the other kind's.
            b & !(((1 << TAG_BITS) - 1) << INDEX_BITS),
            encode(Kind::Transaction, index, generation),
        ] {
            assert_eq!(
                table.with(forged, |v| Ok(*v)).unwrap_err().errno,
                libc::EBADF,
                "handle {forged:#x}"
            );
        }
    }

    /// Report 5a of session 21: both tables encoded `generation << 16 |
    /// slot` from generation 1, so the first transaction handle was the
    /// first volume handle, and a transaction handle passed as a volume
    /// acted on the volume. A handle of one table is refused by the other,
    /// at every generation, with a message naming both kinds.
    #[test]
    fn a_handle_of_one_kind_is_refused_by_the_other_table() {
        static VOLUMES: Table<u32> = Table::new(Kind::Volume);
        static TXNS: Table<u32> = Table::new(Kind::Transaction);
        for round in 0..8 {
            let v = VOLUMES.insert(1).unwrap();
            let t = TXNS.insert(2).unwrap();
            assert_ne!(v, t, "round {round}: one value for two kinds");
            // Refused with EBADF, naming the kind given and the one expected.
            let wrong_kind = |e: Error, given: &str, expected: &str| {
                assert_eq!(e.errno, libc::EBADF, "round {round}");
                assert!(
                    e.message.contains(&format!("{given} handle"))
                        && e.message
                            .contains(&format!("{expected} handle is expected")),
                    "{}",
                    e.message
                );
            };
            wrong_kind(
                VOLUMES.with(t, |x| Ok(*x)).unwrap_err(),
                "transaction",
                "volume",
            );
            wrong_kind(
                TXNS.with_mut(v, |x| Ok(*x)).unwrap_err(),
                "volume",
                "transaction",
            );
            assert_eq!(VOLUMES.remove(t).unwrap_err().errno, libc::EBADF);
            assert_eq!(TXNS.remove(v).unwrap_err().errno, libc::EBADF);
            // Both objects are untouched by the refused calls.
            assert_eq!(VOLUMES.remove(v).unwrap(), 1);
            assert_eq!(TXNS.remove(t).unwrap(), 2);
            // Transactions come and go faster than volumes: their slot's
            // generation runs ahead.
            for _ in 0..round {
                let t = TXNS.insert(3).unwrap();
                TXNS.remove(t).unwrap();
            }
        }
    }

    /// The handle the next occupant of `h`'s slot will get.
    fn next_in_slot(h: usize) -> usize {
        let f = decode(h);
        encode(Kind::of_tag(f.tag).unwrap(), f.index, f.generation + 1)
    }

    /// Report 5b of session 21: a close of a generation not issued yet
    /// (garbage, or a handle of the other kind) set the slot's closing
    /// mark, and the object that later got that generation failed every
    /// call with `-EBADF`. Only a close of the live generation marks.
    #[test]
    fn a_close_of_a_handle_not_issued_yet_does_not_poison_it() {
        let table: Table<u32> = Table::new(Kind::Volume);
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

    /// A slot whose generations are used up is retired, not wrapped back
    /// to generation 1: wrapping gave the new object the handle of the
    /// slot's first, long closed one, which then reached it.
    #[test]
    fn a_slot_is_retired_when_its_generations_run_out() {
        let table: Table<u32> = Table::new(Kind::Volume);
        let first = table.insert(1).unwrap();
        let index = decode(first).index;
        assert_eq!(table.remove(first).unwrap(), 1);
        // Skip ahead: the slot's next occupant gets the last generation.
        table.slot(index).unwrap().state.write().unwrap().generation = GENERATION_MAX - 1;
        let last = table.insert(2).unwrap();
        assert_eq!(
            decode(last),
            Fields {
                index,
                tag: Kind::Volume.tag(),
                generation: GENERATION_MAX
            }
        );
        assert_eq!(table.remove(last).unwrap(), 2);
        let next = table.insert(3).unwrap();
        for stale in [first, last] {
            assert_eq!(
                table.with(stale, |x| Ok(*x)).map_err(|e| e.errno),
                Err(libc::EBADF),
                "stale handle {stale:#x} reaches the object of {next:#x}"
            );
            assert_eq!(table.remove(stale).unwrap_err().errno, libc::EBADF);
        }
        assert_ne!(decode(next).index, index, "a used-up slot is not reused");
        assert_eq!(table.with(next, |x| Ok(*x)).unwrap(), 3);
    }

    #[test]
    fn with_mut_updates_in_place() {
        let table: Table<Vec<u8>> = Table::new(Kind::Volume);
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
        static TABLE: Table<u64> = Table::new(Kind::Volume);
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
        static TABLE: Table<u64> = Table::new(Kind::Volume);
        let h = TABLE.insert(7).unwrap();
        let Fields {
            index, generation, ..
        } = decode(h);
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
