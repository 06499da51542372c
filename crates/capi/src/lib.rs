//! jbdev's C ABI: open, read, write, flush, trim, write-zeroes, atomic
//! multi-extent transactions and metrics of a jbdev volume from C or C++.
//!
//! The header is `include/jbdev.h`, generated from this crate by cbindgen
//! (see `cbindgen.toml`; `tests/header.rs` fails when it is stale).
//!
//! Rules of the ABI (repeated in the header):
//! - Every function returns 0 (or a documented non-negative value) on
//!   success and a negative errno on failure; `jbdev_last_error()` gives the
//!   calling thread's message.
//! - No panic crosses the boundary: each entry point runs under
//!   `catch_unwind` (see `error::ffi_call`); a panic becomes `-EIO`.
//! - Handles are not pointers to freed-on-close memory but generation- and
//!   kind-tagged indexes into never-freed slot tables (see `handle`), so a
//!   NULL, stale, closed or forged handle, or one of the other kind, gives
//!   `-EBADF`, never undefined behaviour, and close is safe while other
//!   threads are using the handle.

// An FFI boundary cannot be written without `unsafe`: C hands us raw
// pointers to strings, buffers and structs. It is allowed in this crate
// only, confined to the helpers at the top of `ffi.rs`, each with a
// `// SAFETY:` comment; every other module stays safe.
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
// Takes pointers and lengths from C callers: never panic on them.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]
#![cfg(unix)]

mod error;
mod ffi;
mod handle;
mod log;
mod types;

pub use ffi::*;
pub use types::*;
