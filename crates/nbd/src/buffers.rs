//! The bounded pool of payload buffers shared by every connection.
//!
//! Every WRITE payload and every READ reply lives in a [`PooledBuf`] taken
//! from one [`BufferPool`]. Two limits hold whatever the number of clients:
//!
//! * `budget_bytes` — the bytes of all payload buffers in use at once. A
//!   request waits (and its connection's reader stops reading, so TCP pushes
//!   back on the client) until its length fits: a worker thread blocks in
//!   [`BufferPool::take`], a connection's reading task awaits
//!   [`BufferPool::take_async`] without holding a network thread. A request longer than the
//!   whole budget is admitted only when nothing else is in use, so it always
//!   makes progress.
//! * a share per connection — a few connections that hold large buffers
//!   (64 MiB writes whose payload stalls, big reads whose replies are not
//!   read) must not stall everyone else, so the budget is split in two:
//!   every connection is guaranteed `share_bytes` of its own (256 KiB, or
//!   less when `budget / 2` cannot give that much to each of the most
//!   connections the server takes), and the rest is shared. A buffer comes
//!   out of its connection's share when it fits there, else out of the
//!   shared part; so whatever the other connections hold, a connection can
//!   always have a 4 KiB..256 KiB request in flight (ARCHITECTURE 29).
//! * `retain_bytes` — the bytes of released buffers kept for reuse. Reuse
//!   keeps the allocator from growing a heap per thread under load; what is
//!   released beyond this goes back to the allocator, so memory after a
//!   burst returns to about `retain_bytes`, and to nothing once the pool
//!   has been idle for a while ([`BufferPool::release_when_idle`], called
//!   by the server every 200 ms): kept buffers are the size of the last
//!   burst's requests (256 KiB to 64 MiB). The server keeps 64 MiB
//!   (`ServerConfig::buffer_retain_bytes`): four 16 MiB requests' worth, so
//!   a stream of large writes reuses its buffers instead of faulting in and
//!   clearing fresh ones.
//!
//! A write's buffer is reserved with its capacity but filled only as the
//! payload arrives (see `conn`), so a client that announces a large write
//! and then trickles makes the server touch only the bytes it really sent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tokio::sync::Notify;

/// Smallest buffer kept for reuse; smaller requests round up to it.
const MIN_CLASS_BYTES: usize = 4 << 10;
/// Size classes are powers of two from [`MIN_CLASS_BYTES`]; this many.
const CLASSES: usize = 16; // 4 KiB .. 128 MiB

struct State {
    /// All buffers in use: the shared part's and the shares'.
    in_use_bytes: u64,
    /// Buffers in use charged to the shared part.
    shared_in_use_bytes: u64,
    retained_bytes: u64,
    /// Free buffers per size class.
    free: [Vec<Vec<u8>>; CLASSES],
    /// Buffers taken so far, and the count the idle check saw last with
    /// the time it saw it change.
    takes: u64,
    seen_takes: u64,
    quiet_since: Instant,
}

/// See the module docs.
pub struct BufferPool {
    state: Mutex<State>,
    /// Wakes threads blocked in `take` when bytes are given back...
    cv: Condvar,
    /// ...and tasks waiting in `take_async`.
    notify: Notify,
    /// The shared part of the budget (the whole budget less the shares).
    shared_budget_bytes: u64,
    /// What each connection's [`Share`] guarantees it.
    share_bytes: u64,
    retain_bytes: u64,
}

/// One connection's guaranteed part of the budget (see the module docs).
/// Changed only under the pool's mutex; atomic so it can be shared.
#[derive(Default)]
pub struct Share {
    held: AtomicU64,
}

/// A buffer of the pool; returns to it when dropped.
pub struct PooledBuf {
    pool: Arc<BufferPool>,
    buf: Vec<u8>,
    /// What was charged against the budget...
    charged: u64,
    /// ...and to which share (`None`: the shared part).
    share: Option<Arc<Share>>,
}

/// Most a connection's share guarantees: a few 4 KiB..64 KiB requests.
pub const MAX_SHARE_BYTES: u64 = 256 << 10;

fn class_of(len: usize) -> Option<usize> {
    let rounded = len.max(MIN_CLASS_BYTES).checked_next_power_of_two()?;
    let c = (rounded.trailing_zeros() - MIN_CLASS_BYTES.trailing_zeros()) as usize;
    (c < CLASSES).then_some(c)
}

impl BufferPool {
    /// A pool with no per-connection shares: the whole budget is shared.
    pub fn new(budget_bytes: u64, retain_bytes: u64) -> Self {
        Self::with_shares(budget_bytes, retain_bytes, 0)
    }

    /// A pool whose budget guarantees each of up to `connections`
    /// connections a share of its own (see the module docs): at most
    /// [`MAX_SHARE_BYTES`] each, and the shares together at most half the
    /// budget.
    pub fn with_shares(budget_bytes: u64, retain_bytes: u64, connections: usize) -> Self {
        let budget_bytes = budget_bytes.max(1);
        let share_bytes = match connections {
            0 => 0,
            n => (budget_bytes / 2 / n as u64).min(MAX_SHARE_BYTES),
        };
        let shared_budget_bytes = budget_bytes - share_bytes * connections as u64;
        Self {
            state: Mutex::new(State {
                in_use_bytes: 0,
                shared_in_use_bytes: 0,
                retained_bytes: 0,
                free: Default::default(),
                takes: 0,
                seen_takes: 0,
                quiet_since: Instant::now(),
            }),
            cv: Condvar::new(),
            notify: Notify::new(),
            shared_budget_bytes,
            share_bytes,
            retain_bytes,
        }
    }

    /// What each connection's share guarantees.
    pub fn share_bytes(&self) -> u64 {
        self.share_bytes
    }

    /// An empty buffer with capacity for `len` bytes, waiting until the
    /// budget allows it (blocks the thread: for workers).
    pub fn take(self: &Arc<Self>, len: usize) -> PooledBuf {
        self.take_for(None, len)
    }

    /// [`BufferPool::take`] for a connection: out of its `share` if the
    /// buffer fits there, else out of the shared part.
    pub fn take_for(self: &Arc<Self>, share: Option<&Arc<Share>>, len: usize) -> PooledBuf {
        let mut st = self.state.lock();
        loop {
            if let Some(from) = self.fits(&st, share, len) {
                return self.take_locked(st, from, len);
            }
            self.cv.wait(&mut st);
        }
    }

    /// [`BufferPool::take`] for async callers: waits without blocking the
    /// thread.
    pub async fn take_async(self: &Arc<Self>, len: usize) -> PooledBuf {
        self.take_async_for(None, len).await
    }

    /// [`BufferPool::take_for`] for async callers.
    pub async fn take_async_for(
        self: &Arc<Self>,
        share: Option<&Arc<Share>>,
        len: usize,
    ) -> PooledBuf {
        loop {
            // Registered before the check, so a give-back in between wakes us.
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.state.lock();
                if let Some(from) = self.fits(&st, share, len) {
                    return self.take_locked(st, from, len);
                }
            }
            notified.await;
        }
    }

    /// Where a buffer of `len` bytes fits now: `Some(Some(share))` in the
    /// connection's share, `Some(None)` in the shared part (a request
    /// longer than the shared part fits there when it is unused, so it
    /// always makes progress), `None` nowhere yet.
    fn fits(
        &self,
        st: &State,
        share: Option<&Arc<Share>>,
        len: usize,
    ) -> Option<Option<Arc<Share>>> {
        let len = len as u64;
        if let Some(s) = share {
            if s.held.load(Ordering::Relaxed) + len <= self.share_bytes {
                return Some(Some(s.clone()));
            }
        }
        let shared = st.shared_in_use_bytes;
        (shared == 0 || shared + len <= self.shared_budget_bytes).then_some(None)
    }

    fn take_locked(
        self: &Arc<Self>,
        mut st: parking_lot::MutexGuard<'_, State>,
        share: Option<Arc<Share>>,
        len: usize,
    ) -> PooledBuf {
        let charged = len as u64;
        st.in_use_bytes += charged;
        match &share {
            Some(s) => {
                s.held.fetch_add(charged, Ordering::Relaxed);
            }
            None => st.shared_in_use_bytes += charged,
        }
        st.takes += 1;
        let reused = class_of(len).and_then(|c| {
            // Any free buffer of this class or the next larger one fits.
            (c..CLASSES.min(c + 2)).find_map(|k| st.free[k].pop())
        });
        let buf = match reused {
            Some(mut b) => {
                st.retained_bytes -= b.capacity() as u64;
                b.clear();
                b
            }
            None => {
                drop(st);
                // Reserve the class size so the buffer can be reused for
                // any request of its class; pages are touched only as
                // bytes are written into it.
                let cap = class_of(len).map_or(len, |c| MIN_CLASS_BYTES << c);
                Vec::with_capacity(cap)
            }
        };
        PooledBuf {
            pool: self.clone(),
            buf,
            charged,
            share,
        }
    }

    /// Bytes of buffers in use (for tests and metrics).
    pub fn in_use_bytes(&self) -> u64 {
        self.state.lock().in_use_bytes
    }

    /// Bytes of free buffers kept for reuse.
    pub fn retained_bytes(&self) -> u64 {
        self.state.lock().retained_bytes
    }

    /// Frees every buffer kept for reuse if no buffer was taken since the
    /// previous call and for at least `idle`; returns the bytes freed.
    /// Meant to be called periodically.
    pub fn release_when_idle(&self, idle: Duration) -> u64 {
        let mut st = self.state.lock();
        let now = Instant::now();
        if st.takes != st.seen_takes {
            st.seen_takes = st.takes;
            st.quiet_since = now;
            return 0;
        }
        if st.retained_bytes == 0 || now.duration_since(st.quiet_since) < idle {
            return 0;
        }
        let freed: Vec<Vec<Vec<u8>>> = st.free.iter_mut().map(std::mem::take).collect();
        let bytes = std::mem::replace(&mut st.retained_bytes, 0);
        drop(st);
        // Freed outside the lock (large buffers are unmapped at once).
        drop(freed);
        bytes
    }

    fn give_back(&self, buf: Vec<u8>, charged: u64, share: Option<Arc<Share>>) {
        let mut st = self.state.lock();
        st.in_use_bytes -= charged;
        match share {
            Some(s) => {
                s.held.fetch_sub(charged, Ordering::Relaxed);
            }
            None => st.shared_in_use_bytes -= charged,
        }
        let cap = buf.capacity();
        let class = (cap >= MIN_CLASS_BYTES && cap.is_power_of_two())
            .then(|| class_of(cap))
            .flatten();
        let keep = class.is_some() && st.retained_bytes + cap as u64 <= self.retain_bytes;
        let dropped = match (keep, class) {
            (true, Some(c)) => {
                st.retained_bytes += cap as u64;
                st.free[c].push(buf);
                None
            }
            _ => Some(buf),
        };
        drop(st);
        self.cv.notify_all();
        self.notify.notify_waiters();
        // Freed outside the lock.
        drop(dropped);
    }
}

impl PooledBuf {
    pub fn vec(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }
}

impl AsRef<[u8]> for PooledBuf {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl std::ops::Deref for PooledBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl std::ops::DerefMut for PooledBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        self.pool.give_back(buf, self.charged, self.share.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_to_powers_of_two() {
        assert_eq!(class_of(0), Some(0));
        assert_eq!(class_of(4096), Some(0));
        assert_eq!(class_of(4097), Some(1));
        assert_eq!(class_of(64 << 20), Some(14));
        assert_eq!(class_of(128 << 20), Some(15));
        assert_eq!(class_of((128 << 20) + 1), None);
        assert_eq!(class_of(usize::MAX), None);
    }

    #[test]
    fn buffers_are_reused_and_retention_is_capped() {
        let pool = Arc::new(BufferPool::new(1 << 30, 64 << 10));
        {
            let mut a = pool.take(10_000);
            a.vec().extend_from_slice(&[1; 10_000]);
            assert_eq!(pool.in_use_bytes(), 10_000);
        }
        assert_eq!(pool.in_use_bytes(), 0);
        assert_eq!(pool.retained_bytes(), 16 << 10);
        let b = pool.take(9000);
        assert!(b.is_empty(), "a reused buffer starts empty");
        assert_eq!(pool.retained_bytes(), 0);
        drop(b);
        // Above the retention cap: freed, not kept.
        drop(pool.take(1 << 20));
        assert_eq!(pool.retained_bytes(), 16 << 10);
    }

    #[test]
    fn kept_buffers_are_freed_only_after_a_quiet_period() {
        let pool = Arc::new(BufferPool::new(1 << 30, 1 << 20));
        drop(pool.take(256 << 10));
        assert_eq!(pool.retained_bytes(), 256 << 10);
        // The first check sees a new take: the quiet period starts now.
        assert_eq!(pool.release_when_idle(Duration::ZERO), 0);
        assert_eq!(pool.retained_bytes(), 256 << 10);
        // Not quiet for long enough.
        assert_eq!(pool.release_when_idle(Duration::from_secs(3600)), 0);
        // A take in between restarts the quiet period.
        drop(pool.take(4096));
        assert_eq!(pool.release_when_idle(Duration::ZERO), 0);
        let kept = pool.retained_bytes();
        assert_eq!(kept, (256 << 10) + 4096);
        assert_eq!(pool.release_when_idle(Duration::ZERO), kept);
        assert_eq!(pool.retained_bytes(), 0);
        // Buffers are still handed out afterwards.
        let b = pool.take(8192);
        assert!(b.is_empty() && pool.in_use_bytes() == 8192);
    }

    #[test]
    fn a_connection_share_is_served_while_others_hold_the_shared_part() {
        // 8 MiB for up to 4 connections: 256 KiB each, 7 MiB shared.
        let pool = Arc::new(BufferPool::with_shares(8 << 20, 0, 4));
        assert_eq!(pool.share_bytes(), 256 << 10);
        let (hog, small) = (Arc::new(Share::default()), Arc::new(Share::default()));
        // The hog's large buffers fill the shared part (its share is too
        // small for them).
        let held: Vec<PooledBuf> = (0..7).map(|_| pool.take_for(Some(&hog), 1 << 20)).collect();
        assert_eq!(pool.in_use_bytes(), 7 << 20);
        // Another connection's 64 KiB requests come out of its share, up to
        // the share (no wait: this would block forever on the old pool).
        let mine: Vec<PooledBuf> = (0..4)
            .map(|_| pool.take_for(Some(&small), 64 << 10))
            .collect();
        assert_eq!(pool.in_use_bytes(), (7 << 20) + (256 << 10));
        // A fifth must wait for the shared part or its share.
        let p2 = pool.clone();
        let s2 = small.clone();
        let t = std::thread::spawn(move || drop(p2.take_for(Some(&s2), 64 << 10)));
        drop(mine);
        t.join().unwrap();
        drop(held);
        assert_eq!(pool.in_use_bytes(), 0);
        assert_eq!(hog.held.load(Ordering::Relaxed), 0);
        assert_eq!(small.held.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn shares_take_at_most_half_the_budget() {
        let pool = BufferPool::with_shares(256 << 20, 0, 10_000);
        assert_eq!(pool.share_bytes(), (128 << 20) / 10_000);
        let pool = BufferPool::with_shares(256 << 20, 0, 128);
        assert_eq!(pool.share_bytes(), MAX_SHARE_BYTES);
        assert_eq!(
            pool.shared_budget_bytes,
            (256 << 20) - 128 * MAX_SHARE_BYTES
        );
    }

    #[test]
    fn budget_blocks_until_bytes_are_released_but_never_starves_a_large_request() {
        let pool = Arc::new(BufferPool::new(1 << 20, 0));
        let big = pool.take(4 << 20); // larger than the budget: admitted alone
        let p2 = pool.clone();
        let t = std::thread::spawn(move || {
            let _small = p2.take(4096);
            p2.in_use_bytes()
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!t.is_finished(), "the budget must hold the second request");
        drop(big);
        assert_eq!(t.join().unwrap(), 4096);
        assert_eq!(pool.in_use_bytes(), 0);
    }
}
