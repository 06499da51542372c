//! How many forks this process is a child of: a `pthread_atfork` child
//! handler bumps a counter, registered on the first call of
//! [`generation`]. Whatever is tied to the process that made it compares
//! the generation it was made at with the current one: a thread's
//! io_uring (the kernel refuses submissions to a `SINGLE_ISSUER` ring from
//! any other task, and a child's copy of a plain ring would share its
//! queues with the parent), and the C ABI's handles (a child must not use
//! the parent's volumes).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

static GENERATION: AtomicU64 = AtomicU64::new(0);

extern "C" fn count_fork_in_child() {
    // Async-signal-safe: one atomic add.
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The forks this process is a child of. Call it once before anything a
/// fork must invalidate exists (later forks are counted from then on).
pub fn generation() -> u64 {
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: registers a handler that only touches an atomic; it runs
        // in the child right after fork, where that is allowed.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(count_fork_in_child)) };
        if rc != 0 {
            tracing::warn!(
                "pthread_atfork failed ({rc}): a child process forked after jbdev started cannot \
                 be told from its parent (its rings and handles are not renewed)"
            );
        }
    });
    GENERATION.load(Ordering::Relaxed)
}
