//! The lock order of the volume engine, checked in debug builds.
//!
//! Every lock the engine takes has a rank; a thread may only take a lock
//! whose rank is at least the highest rank it already holds (locks of one
//! rank are taken in ascending index order: stripes by number, overlay
//! shards by number). The order, lowest first:
//!
//! | rank | lock (engine part)                      | taken by                                   |
//! |------|----------------------------------------|--------------------------------------------|
//! | 0    | `Home::lock` (RwLock)                   | direct writes (shared), checkpoint (exclusive) |
//! | 1    | `StateSync::st` (journal state)         | commits, credits, waits                    |
//! | 2    | stripes                                 | writers joining, `cut` (all, under `st`)    |
//! | 3    | overlay shards                          | reads, writers publishing, checkpoint      |
//! | 4    | leaves: stats, `Log::committed`, `Log::jsb`, `Log::builders`, `Home::direct_bufs` | never hold another lock while held (not even another leaf) |
//!
//! Nothing that can be called with a stripe or shard held takes `st`: the
//! abort reason a writer checks under its stripe lock is a lock-free
//! `OnceLock` (`AbortFlag::reason`), not a field of `st` (a writer holding a stripe and waiting
//! for `st` while `cut` holds `st` and waits for that stripe deadlocks).
//!
//! Leaves are [`Leaf`] mutexes: taking any ranked lock while holding one
//! panics in debug builds, which would have caught the stats deadlock
//! (ARCHITECTURE 26: the stats lock held while taking `st`).
//!
//! In release builds the guards below are plain mutex guards.

use std::ops::{Deref, DerefMut};

use parking_lot::{Mutex, MutexGuard};

/// Rank of a lock in the engine's order (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rank {
    State = 1,
    Stripe = 2,
    Shard = 3,
    Leaf = 4,
}

#[cfg(debug_assertions)]
mod held {
    use std::cell::Cell;

    use super::Rank;

    thread_local! {
        static HELD: Cell<[u16; 5]> = const { Cell::new([0; 5]) };
    }

    pub fn acquire(rank: Rank) {
        HELD.with(|h| {
            let mut v = h.get();
            // A leaf excludes every other lock, leaves included.
            let from = (rank as usize + 1).min(Rank::Leaf as usize);
            if let Some(higher) = (from..v.len()).find(|&r| v[r] > 0) {
                panic!(
                    "lock order violated: taking a {rank:?} lock (rank {}) while holding a lock of rank {higher}",
                    rank as usize
                );
            }
            v[rank as usize] += 1;
            h.set(v);
        });
    }

    pub fn release(rank: Rank) {
        HELD.with(|h| {
            let mut v = h.get();
            v[rank as usize] -= 1;
            h.set(v);
        });
    }
}

/// A mutex guard that records its rank while held (debug builds).
pub struct Ranked<'a, T> {
    guard: MutexGuard<'a, T>,
    #[cfg(debug_assertions)]
    rank: Rank,
}

impl<'a, T> Ranked<'a, T> {
    /// Locks `m` as a lock of `rank`.
    pub fn lock(m: &'a Mutex<T>, rank: Rank) -> Self {
        #[cfg(debug_assertions)]
        held::acquire(rank);
        #[cfg(not(debug_assertions))]
        let _ = rank;
        Ranked {
            guard: m.lock(),
            #[cfg(debug_assertions)]
            rank,
        }
    }

    /// The underlying guard, for condition variable waits (a wait releases
    /// and retakes this same lock, so the ranks held do not change).
    pub fn inner(&mut self) -> &mut MutexGuard<'a, T> {
        &mut self.guard
    }
}

/// A mutex of the leaf rank: nothing else may be locked while it is held.
#[derive(Debug, Default)]
pub struct Leaf<T>(Mutex<T>);

impl<T> Leaf<T> {
    pub fn new(value: T) -> Self {
        Leaf(Mutex::new(value))
    }

    pub fn lock(&self) -> Ranked<'_, T> {
        Ranked::lock(&self.0, Rank::Leaf)
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut()
    }
}

impl<T> Drop for Ranked<'_, T> {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        held::release(self.rank);
    }
}

impl<T> Deref for Ranked<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for Ranked<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[test]
    fn ascending_ranks_are_allowed() {
        let (a, b, c) = (Mutex::new(1), Mutex::new(2), Mutex::new(3));
        let _st = Ranked::lock(&a, Rank::State);
        let _s1 = Ranked::lock(&b, Rank::Stripe);
        let _s2 = Ranked::lock(&c, Rank::Shard);
    }

    #[test]
    #[should_panic(expected = "lock order violated")]
    fn state_under_a_stripe_panics() {
        let (a, b) = (Mutex::new(1), Mutex::new(2));
        let _stripe = Ranked::lock(&b, Rank::Stripe);
        let _st = Ranked::lock(&a, Rank::State);
    }

    #[test]
    #[should_panic(expected = "lock order violated")]
    fn state_under_a_leaf_panics() {
        let (a, b) = (Leaf::new(1), Mutex::new(2));
        let _stats = a.lock();
        let _st = Ranked::lock(&b, Rank::State);
    }

    #[test]
    #[should_panic(expected = "lock order violated")]
    fn a_leaf_under_a_leaf_panics() {
        let (a, b) = (Leaf::new(1), Leaf::new(2));
        let _stats = a.lock();
        let _jsb = b.lock();
    }

    #[test]
    fn a_leaf_under_the_state_is_allowed() {
        let (a, b) = (Mutex::new(1), Leaf::new(2));
        let _st = Ranked::lock(&a, Rank::State);
        let _q = b.lock();
        drop(_q);
        let _again = b.lock();
    }

    #[test]
    fn released_locks_are_forgotten() {
        let (a, b) = (Mutex::new(1), Mutex::new(2));
        drop(Ranked::lock(&b, Rank::Shard));
        let _st = Ranked::lock(&a, Rank::State);
    }
}
