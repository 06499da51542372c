//! The journal's core as one type: the log ring's ledger ([`LogSpace`]) and
//! the commit order — which transaction is open, which are cut and being
//! written (several at once, up to a depth), which are published, and how
//! far the checkpoint got.
//!
//! What a transaction holds (blocks, buffers, the overlay) is the volume's
//! business; here it is a type parameter `T` the journal only carries from
//! "finished" to "published". The rules:
//! * transactions are cut in order, one at a time, at most `depth` in
//!   flight (cut and not yet published);
//! * a transaction's I/O may finish in any order, but transactions are
//!   published strictly in order: one is never reported durable while an
//!   older one might still be lost;
//! * after a failure nothing more is published, ever (a later transaction
//!   must not be acknowledged past a failed one);
//! * a cut transaction with blocks is laid out in the ring at once, so
//!   transactions in flight together never overlap in the log, and the
//!   ledger's space moves from "granted" to "used" when it is published.
//!
//! The engine keeps one [`Journal`] under its state lock.

use std::collections::BTreeMap;

use crate::space::{LogSpace, Placement, Tid};

/// What the journal needs of a written transaction to publish it.
pub trait LogCost {
    /// Log blocks the transaction occupies.
    fn log_blocks(&self) -> u64;
    /// Credits it paid (given back to the ledger when it is published).
    fn charged(&self) -> u64;
}

/// How a cut transaction's I/O ended.
#[derive(Debug)]
pub enum Outcome<T> {
    /// It held nothing: no I/O, no log space (it still takes its turn).
    Empty,
    /// Written and flushed.
    Written(T),
    /// Its I/O failed: nothing is published from here on.
    Failed,
}

/// A transaction just cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    pub tid: Tid,
    /// Where it goes in the log (None for an empty transaction).
    pub placement: Option<Placement>,
    /// How many older transactions are still in flight (cut, not yet
    /// published): this one may be written whole now, and its commit block
    /// records this count ([`crate::format::CommitBlock::overlap`]) so that
    /// recovery does not take it as proof that they were durable.
    pub overlap: u32,
}

/// The journal's core state (see the module docs).
#[derive(Debug)]
pub struct Journal<T> {
    /// The log ring's ledger: credits, the space queue, placement, the tail.
    pub space: LogSpace,
    running: Tid,
    committed: Tid,
    checkpointed: Tid,
    in_flight: u32,
    depth: u32,
    finished: BTreeMap<Tid, Outcome<T>>,
    failed: bool,
}

impl<T: LogCost> Journal<T> {
    /// An empty journal whose log occupies blocks `first..len_blocks`, next
    /// disk sequence `next_sequence`, first transaction `first_tid`, and at
    /// most `depth` (>= 1) commits in flight.
    pub fn new(
        first: u32,
        len_blocks: u32,
        next_sequence: u32,
        first_tid: Tid,
        depth: u32,
    ) -> Self {
        assert!(first_tid >= 1, "transaction ids start at 1");
        Self {
            space: LogSpace::new(first, len_blocks, next_sequence),
            running: first_tid,
            committed: first_tid - 1,
            checkpointed: first_tid - 1,
            in_flight: 0,
            depth: depth.max(1),
            finished: BTreeMap::new(),
            failed: false,
        }
    }

    /// The open transaction, which writes join.
    pub fn running(&self) -> Tid {
        self.running
    }

    /// The newest published (durable, acknowledged) transaction.
    pub fn committed(&self) -> Tid {
        self.committed
    }

    /// The newest transaction whose blocks are all home.
    pub fn checkpointed_tid(&self) -> Tid {
        self.checkpointed
    }

    /// Transactions cut and not yet published.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// At most this many transactions in flight at once.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Whether a transaction may be cut now: fewer than `depth` in flight
    /// and nothing failed.
    pub fn has_room(&self) -> bool {
        !self.failed && self.in_flight < self.depth
    }

    pub fn has_failed(&self) -> bool {
        self.failed
    }

    /// Cuts the running transaction, which occupies `log_blocks` log blocks
    /// (None: it is empty), and opens the next one.
    pub fn cut(&mut self, log_blocks: Option<usize>) -> Cut {
        debug_assert!(self.in_flight < self.depth, "cut beyond the pipeline depth");
        let tid = self.running;
        self.running += 1;
        self.in_flight += 1;
        Cut {
            tid,
            placement: log_blocks.map(|k| self.space.lay_out(tid, k)),
            overlap: self.in_flight - 1,
        }
    }

    /// Records how transaction `tid`'s I/O ended. A failure stops all
    /// publishing at once.
    pub fn finish(&mut self, tid: Tid, outcome: Outcome<T>) {
        debug_assert!(tid > self.committed && tid < self.running);
        if matches!(outcome, Outcome::Failed) {
            self.fail();
            return;
        }
        if !self.failed {
            self.finished.insert(tid, outcome);
        }
    }

    /// Publishes the next transaction in order if its I/O has finished:
    /// returns its id and what it carried (None if it was empty). Its log
    /// blocks become used and its credits spent. None once anything failed.
    pub fn publish_next(&mut self) -> Option<(Tid, Option<T>)> {
        if self.failed {
            return None;
        }
        let tid = self.committed + 1;
        let outcome = self.finished.remove(&tid)?;
        self.committed = tid;
        self.in_flight -= 1;
        match outcome {
            Outcome::Empty => Some((tid, None)),
            Outcome::Written(t) => {
                self.space.publish(tid, t.log_blocks(), t.charged());
                Some((tid, Some(t)))
            }
            Outcome::Failed => unreachable!("a failure is never stored"),
        }
    }

    /// Stops publishing for good (an I/O failed here or elsewhere in the
    /// volume): what finished is dropped, nothing counts as in flight.
    pub fn fail(&mut self) {
        self.failed = true;
        self.finished.clear();
        self.in_flight = 0;
    }

    /// Where the checkpoint may move the tail (see [`LogSpace::tail`]).
    pub fn tail(&self, oldest_unchecked: Option<Placement>) -> Placement {
        self.space.tail(oldest_unchecked)
    }

    /// Transactions up to `tid`, `blocks` log blocks in all, are home and
    /// the tail moved past them.
    pub fn checkpointed(&mut self, tid: Tid, blocks: u64) {
        debug_assert!(tid <= self.committed);
        self.space.checkpointed(blocks);
        self.checkpointed = self.checkpointed.max(tid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Txn(u64, u64);
    impl LogCost for Txn {
        fn log_blocks(&self) -> u64 {
            self.0
        }
        fn charged(&self) -> u64 {
            self.1
        }
    }

    fn journal(depth: u32) -> Journal<Txn> {
        Journal::new(1, 101, 40, 1, depth)
    }

    #[test]
    fn publishes_in_order_whatever_order_the_io_finishes() {
        let mut j = journal(3);
        assert_eq!(j.space.try_grant(None, 30, 0), Some(30));
        let a = j.cut(Some(10));
        let b = j.cut(None);
        let c = j.cut(Some(5));
        assert_eq!((a.tid, b.tid, c.tid), (1, 2, 3));
        assert_eq!((a.overlap, b.overlap, c.overlap), (0, 1, 2));
        assert!(!j.has_room(), "depth 3 reached");
        assert_eq!(a.placement.unwrap().sequence, 40);
        assert_eq!(
            c.placement.unwrap().sequence,
            41,
            "empty ones take no sequence"
        );
        assert_eq!(c.placement.unwrap().head, 11);
        j.finish(3, Outcome::Written(Txn(5, 5)));
        j.finish(2, Outcome::Empty);
        assert_eq!(j.publish_next(), None, "1 is still being written");
        assert_eq!(j.committed(), 0);
        j.finish(1, Outcome::Written(Txn(10, 12)));
        assert_eq!(j.publish_next(), Some((1, Some(Txn(10, 12)))));
        assert_eq!(j.publish_next(), Some((2, None)));
        assert_eq!(j.publish_next(), Some((3, Some(Txn(5, 5)))));
        assert_eq!(j.publish_next(), None);
        assert_eq!((j.committed(), j.in_flight(), j.running()), (3, 0, 4));
        assert_eq!(j.space.used(), 15);
        // 30 granted, 17 paid by the two published: 13 still granted.
        assert_eq!(j.space.free(), 100 - 1 - 15 - 13);
        j.checkpointed(1, 10);
        assert_eq!((j.checkpointed_tid(), j.space.used()), (1, 5));
    }

    #[test]
    fn nothing_is_published_after_a_failure() {
        let mut j = journal(3);
        let a = j.cut(Some(2));
        let b = j.cut(Some(2));
        let c = j.cut(Some(2));
        j.finish(c.tid, Outcome::Written(Txn(2, 0)));
        j.finish(b.tid, Outcome::Failed);
        j.finish(a.tid, Outcome::Written(Txn(2, 0)));
        assert_eq!(
            j.publish_next(),
            None,
            "not even the older transaction: the volume aborted, nothing is acknowledged"
        );
        assert!(j.has_failed() && !j.has_room());
        assert_eq!(j.committed(), 0);
        assert_eq!(j.in_flight(), 0);
    }

    #[test]
    fn the_tail_never_passes_a_transaction_in_flight() {
        let mut j = journal(2);
        let a = j.cut(Some(4));
        let _b = j.cut(Some(4));
        j.finish(a.tid, Outcome::Written(Txn(4, 0)));
        assert!(j.publish_next().is_some());
        // Transaction 1 is home: the tail may move to 2 (in flight), not to the head.
        let t = j.tail(None);
        assert_eq!((t.sequence, t.head), (41, 5));
    }
}
