//! The library's log for a C program. The volume logs through `tracing`
//! (an abort and why, the salvage after a journal failure and its end,
//! a full backing store, recovery at open); a Rust program installs its
//! own subscriber, a C program has none, so every line would be lost.
//! A library should not write to its host's stderr unasked, so the log is
//! off unless the environment asks for it with `JBDEV_LOG`, the variable
//! (and filter syntax) of the `jbdev` command: `JBDEV_LOG=warn` for
//! warnings and errors, `info`, `debug`, or per-module directives.

use std::sync::Once;

static INIT: Once = Once::new();

/// Installs a stderr subscriber filtered by `JBDEV_LOG`, once per process,
/// when the variable is set and parses. Called by `jbdev_open` and
/// `jbdev_create`, which are where anything can be logged. A process that
/// already has a global subscriber keeps it.
pub(crate) fn init_from_env() {
    INIT.call_once(|| {
        let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("JBDEV_LOG") else {
            return;
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init();
    });
}
