//! The log ring's ledger: where the next transaction goes, which sequence
//! it carries, how much of the ring is spoken for, who waits for space, and
//! how far the tail may move.
//!
//! The engine keeps one [`LogSpace`] inside its journal state (under the
//! state lock); every rule about log space lives here, with unit tests,
//! instead of being spread over the engine's commit, reserve and checkpoint
//! paths.
//!
//! Blocks of the ring are in one of three states:
//! - `used`: written by a published transaction not yet checkpointed;
//! - `outstanding`: granted to writers as credits (paid in advance), not
//!   yet written or returned;
//! - free: the rest of `capacity` (one less than the ring, so a full ring
//!   is never mistaken for an empty one).
//!
//! Writers that find the ring full wait in arrival order (tickets). A
//! newcomer may take free space only if what is left covers every queued
//! writer, so a large request keeps its place and small ones cannot starve
//! it, and the queue only forms when the ring is really full.

use std::collections::VecDeque;

use crate::writer;

/// The engine's transaction id (in-memory, never on disk).
pub type Tid = u64;

/// Where a transaction sits in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub sequence: u32,
    pub head: u32,
}

/// A place in the space queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket(u64);

/// The ledger. All methods are plain arithmetic; the caller serialises them.
#[derive(Debug)]
pub struct LogSpace {
    first: u32,
    len_blocks: u32,
    capacity: u64,
    used: u64,
    outstanding: u64,
    head: u32,
    next_sequence: u32,
    /// Start and sequence of every laid-out transaction not yet published,
    /// oldest first: the tail may never pass the oldest of them.
    in_flight: VecDeque<(Tid, Placement)>,
    queue_head: u64,
    queue_tail: u64,
    /// Tickets behind the head whose holders left without a grant: the
    /// head skips them when it gets there.
    abandoned: std::collections::BTreeSet<u64>,
    /// Credits the queued writers wait for, in all.
    wanted: u64,
}

impl LogSpace {
    /// An empty log occupying blocks `first..len_blocks` of the journal,
    /// whose next transaction carries `next_sequence`.
    pub fn new(first: u32, len_blocks: u32, next_sequence: u32) -> Self {
        Self {
            first,
            len_blocks,
            capacity: u64::from(len_blocks.saturating_sub(first)).saturating_sub(1),
            used: 0,
            outstanding: 0,
            head: first,
            next_sequence,
            in_flight: VecDeque::new(),
            queue_head: 0,
            queue_tail: 0,
            abandoned: std::collections::BTreeSet::new(),
            wanted: 0,
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn used(&self) -> u64 {
        self.used
    }
    pub fn next_sequence(&self) -> u32 {
        self.next_sequence
    }
    pub fn free(&self) -> u64 {
        self.capacity.saturating_sub(self.used + self.outstanding)
    }
    /// Parts per thousand of the log taken: published and not yet
    /// checkpointed, in flight, or granted to writers.
    pub fn taken_permille(&self) -> u32 {
        if self.capacity == 0 {
            return 1000;
        }
        ((self.capacity - self.free()) * 1000 / self.capacity) as u32
    }
    /// Whether published, not yet checkpointed transactions fill at least
    /// `num/den` of the log.
    pub fn fill_at_least(&self, num: u64, den: u64) -> bool {
        self.used * den >= self.capacity * num
    }

    /// Tries to grant `need` credits to the holder of `ticket` (or to a
    /// newcomer, `None`), plus a stock of at most `max_extra` more when the
    /// free space allows. Returns the grant, or `None` if the caller must
    /// wait (take a ticket with [`LogSpace::enqueue`] if it has none). A
    /// ticket holder that is granted leaves the queue.
    pub fn try_grant(&mut self, ticket: Option<Ticket>, need: u64, max_extra: u64) -> Option<u64> {
        if !self.may_grant(ticket, need) {
            return None;
        }
        let free = self.free();
        if ticket.is_some() {
            self.leave(need);
        }
        let spare = free - need - self.wanted.min(free - need);
        let grant = need + max_extra.min(spare);
        self.outstanding += grant;
        Some(grant)
    }

    /// Whether [`LogSpace::try_grant`] would grant `need` credits to the
    /// holder of `ticket` (or a newcomer) now.
    pub fn may_grant(&self, ticket: Option<Ticket>, need: u64) -> bool {
        let free = self.free();
        match ticket {
            None => free >= need + self.wanted,
            Some(Ticket(t)) => t == self.queue_head && free >= need,
        }
    }

    /// Joins the space queue waiting for `need` credits.
    pub fn enqueue(&mut self, need: u64) -> Ticket {
        let t = Ticket(self.queue_tail);
        self.queue_tail += 1;
        self.wanted += need;
        t
    }

    /// The holder of `ticket` leaves the queue without a grant (the volume
    /// failed or closed, or the store is full). Any holder may leave, in
    /// any order: one behind the head is skipped when the head gets there.
    /// (Waiters of a full store fail one by one, each after a checkpoint
    /// attempt it saw fail, not all at once: the first version advanced
    /// the head for every leaver and stalled the queue.)
    pub fn abandon(&mut self, ticket: Ticket, need: u64) {
        self.wanted = self.wanted.saturating_sub(need);
        if ticket.0 == self.queue_head {
            self.advance_head();
        } else if ticket.0 > self.queue_head {
            self.abandoned.insert(ticket.0);
        }
    }

    fn leave(&mut self, need: u64) {
        self.wanted = self.wanted.saturating_sub(need);
        self.advance_head();
    }

    fn advance_head(&mut self) {
        self.queue_head += 1;
        while self.abandoned.remove(&self.queue_head) {
            self.queue_head += 1;
        }
    }

    /// Whether `ticket` is at the head of the queue.
    pub fn is_head(&self, ticket: Ticket) -> bool {
        ticket.0 == self.queue_head
    }

    /// Credits granted and not spent come back (a cut returns each stripe's
    /// stock, an empty or failed transaction what it paid).
    pub fn give_back(&mut self, credits: u64) {
        debug_assert!(credits <= self.outstanding);
        self.outstanding -= credits.min(self.outstanding);
    }

    /// Lays out transaction `tid` of `blocks` log blocks at the head: its
    /// sequence and start, remembered as in flight until published.
    pub fn lay_out(&mut self, tid: Tid, blocks: usize) -> Placement {
        let p = Placement {
            sequence: self.next_sequence,
            head: self.head,
        };
        self.next_sequence = self.next_sequence.wrapping_add(1);
        self.head = writer::advance(self.head, blocks, self.first, self.len_blocks);
        self.in_flight.push_back((tid, p));
        p
    }

    /// Transaction `tid` (the oldest in flight) is durable and acknowledged:
    /// its `log_blocks` are now used, the `charged` credits it paid spent.
    pub fn publish(&mut self, tid: Tid, log_blocks: u64, charged: u64) {
        let front = self.in_flight.pop_front();
        debug_assert_eq!(front.map(|f| f.0), Some(tid));
        self.used += log_blocks;
        self.give_back(charged);
    }

    /// Where the tail may move once everything before `oldest_unchecked`
    /// (the oldest published transaction still to checkpoint, if any) is
    /// home: to that transaction, else to the oldest one in flight, else to
    /// the head. Never past a transaction in flight: it may be acknowledged
    /// after the tail moves, and recovery must still find it.
    pub fn tail(&self, oldest_unchecked: Option<Placement>) -> Placement {
        match (oldest_unchecked, self.in_flight.front()) {
            (Some(p), _) => p,
            (None, Some(&(_, p))) => p,
            (None, None) => Placement {
                sequence: self.next_sequence,
                head: self.head,
            },
        }
    }

    /// `blocks` of the log were checkpointed and the tail moved past them.
    pub fn checkpointed(&mut self, blocks: u64) {
        debug_assert!(blocks <= self.used);
        self.used -= blocks.min(self.used);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_keeps_one_block_free_and_wraps() {
        let mut s = LogSpace::new(1, 11, 7);
        assert_eq!(s.capacity(), 9);
        assert_eq!(s.try_grant(None, 9, 0), Some(9));
        assert_eq!(s.try_grant(None, 1, 0), None, "the ring is full");
        let a = s.lay_out(1, 6);
        assert_eq!(
            a,
            Placement {
                sequence: 7,
                head: 1
            }
        );
        let b = s.lay_out(2, 3);
        assert_eq!(
            b,
            Placement {
                sequence: 8,
                head: 7
            }
        );
        s.publish(1, 6, 6);
        s.publish(2, 3, 3);
        assert_eq!((s.used(), s.free()), (9, 0));
        s.checkpointed(9);
        let c = s.lay_out(3, 2);
        assert_eq!(
            c,
            Placement {
                sequence: 9,
                head: 10
            },
            "head at the last block"
        );
        assert_eq!(
            s.lay_out(4, 1).head,
            2,
            "the two blocks went to 10 and, wrapping, 1"
        );
    }

    #[test]
    fn the_tail_never_passes_a_transaction_in_flight() {
        let mut s = LogSpace::new(1, 100, 1);
        let a = s.lay_out(1, 4);
        let b = s.lay_out(2, 4);
        assert_eq!(s.tail(None), a, "oldest in flight");
        s.publish(1, 4, 0);
        assert_eq!(s.tail(Some(a)), a, "published, not yet checkpointed");
        assert_eq!(s.tail(None), b, "checkpointed: up to the one in flight");
        s.publish(2, 4, 0);
        assert_eq!(
            s.tail(None),
            Placement {
                sequence: 3,
                head: 9
            },
            "nothing left: the head"
        );
    }

    #[test]
    fn waiters_are_served_in_order_and_newcomers_cannot_starve_them() {
        let mut s = LogSpace::new(0, 101, 1);
        assert_eq!(s.capacity(), 100);
        assert_eq!(s.try_grant(None, 90, 0), Some(90));
        // A large request finds too little space and queues.
        assert_eq!(s.try_grant(None, 30, 0), None);
        let big = s.enqueue(30);
        // A small newcomer fits in the free space but would eat what the
        // queued one waits for: it must wait too.
        assert_eq!(s.try_grant(None, 5, 0), None);
        let small = s.enqueue(5);
        assert!(!s.is_head(small));
        s.give_back(25);
        assert_eq!(s.try_grant(Some(small), 5, 0), None, "not its turn");
        assert_eq!(s.try_grant(Some(big), 30, 0), Some(30));
        assert!(s.is_head(small));
        assert_eq!(
            s.try_grant(Some(small), 5, 8),
            Some(5),
            "no spare for a stock"
        );
        // Queue empty: newcomers take free space directly, with a stock.
        s.give_back(40);
        assert_eq!(s.try_grant(None, 2, 8), Some(10));
    }

    #[test]
    fn a_newcomer_may_take_what_the_queue_does_not_need() {
        let mut s = LogSpace::new(0, 101, 1);
        assert_eq!(s.try_grant(None, 80, 0), Some(80));
        assert_eq!(s.try_grant(None, 30, 0), None);
        let _big = s.enqueue(30);
        // 20 free, 30 wanted: nothing for anyone else.
        assert_eq!(s.try_grant(None, 1, 0), None);
        s.give_back(40);
        // 60 free, 30 wanted: a newcomer of up to 30 fits beside it, and
        // its stock never eats into the queued need.
        assert_eq!(s.try_grant(None, 20, 64), Some(30));
        assert_eq!(s.free(), 30);
    }

    #[test]
    fn abandoning_the_queue_lets_the_next_one_through() {
        let mut s = LogSpace::new(0, 11, 1);
        assert_eq!(s.try_grant(None, 10, 0), Some(10));
        let a = s.enqueue(5);
        let b = s.enqueue(5);
        s.abandon(a, 5);
        assert!(!s.is_head(a) && s.is_head(b));
        s.give_back(10);
        assert_eq!(s.try_grant(Some(b), 5, 0), Some(5));
    }

    #[test]
    fn a_waiter_behind_the_head_may_leave_first_without_stalling_the_queue() {
        let mut s = LogSpace::new(0, 21, 1);
        assert_eq!(s.try_grant(None, 20, 0), Some(20));
        let a = s.enqueue(5);
        let b = s.enqueue(5);
        let c = s.enqueue(5);
        // b leaves before a: a stays the head, and c is next after a.
        s.abandon(b, 5);
        assert!(s.is_head(a));
        s.give_back(10);
        assert_eq!(s.try_grant(Some(a), 5, 0), Some(5));
        assert!(s.is_head(c), "the head skips the ticket b gave up");
        assert_eq!(s.try_grant(Some(c), 5, 0), Some(5));
        // Nobody waits: a newcomer is not held back by a phantom want.
        s.give_back(10);
        assert_eq!(s.try_grant(None, 10, 0), Some(10));
    }

    #[test]
    fn fill_thresholds() {
        let mut s = LogSpace::new(0, 101, 1);
        s.lay_out(1, 25);
        s.publish(1, 25, 0);
        assert!(s.fill_at_least(1, 4));
        assert!(!s.fill_at_least(3, 4));
    }
}
