//! Work that may block on a store that stopped answering, run on its own
//! thread so the caller can stop waiting for it (a close at exit, an RBD
//! image's close).

use std::sync::mpsc::Receiver;

/// Runs `f` on a new thread named `name`; its result arrives on the
/// returned channel (which reports a disconnect if `f` panicked). The
/// caller waits as long as it likes (`recv_timeout`); a thread still
/// blocked when the process exits is left behind. Fails only if the thread
/// cannot be started (then `f` is dropped unrun).
pub fn spawn_with_result<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<Receiver<T>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _ = tx.send(f());
        })?;
    Ok(rx)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_result_arrives_and_a_panic_disconnects() {
        let rx = super::spawn_with_result("t-ok", || 7).unwrap();
        assert_eq!(rx.recv().unwrap(), 7);
        let rx = super::spawn_with_result("t-panic", || -> u8 { panic!("boom") }).unwrap();
        assert!(rx.recv().is_err());
    }
}
