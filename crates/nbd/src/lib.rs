//! jbdev's NBD server: the protocol of `doc/proto.md` of the reference
//! implementation (fixed newstyle, structured replies, `base:allocation`),
//! written for this project, serving [`jbdev_volume::Volume`]s.
//!
//! Layers, bottom up:
//! * [`proto`] — constants; [`codec`] — pure, fuzzed encoders/decoders;
//! * [`backend`] — the [`Backend`] trait the server serves (a volume, or
//!   memory for tests);
//! * [`export`] — exports and their operator-set descriptions; [`stream`] —
//!   sockets, stdio and socket activation;
//! * [`handshake`] — option haggling; [`conn`] — the transmission phase of
//!   one connection; [`pool`] — the worker threads; [`buffers`] — the
//!   bounded payload buffer pool; [`server`] — limits, connections,
//!   lifecycle and shutdown;
//! * [`client`] — a small client for the load generator and tests.
//!
//! Durability mapping: a WRITE is answered when `write_at` returns (the data
//! is in the volume's running transaction and visible to every connection);
//! a FUA request or a FLUSH is answered only when the volume says it is
//! durable. Requests of all connections run concurrently on the worker
//! pool, so FUAs and flushes from everywhere share group commits. Because
//! every connection to an export shares one volume, `CAN_MULTI_CONN` is
//! honest: a FLUSH on any connection covers every write already answered on
//! every connection.
//!
//! Limits hold whatever clients do: a fixed worker pool, one bounded
//! payload buffer pool, a connection cap, a whole-handshake deadline, a
//! send timeout with a progress floor, per-connection in-flight limits and
//! a 64 MiB request maximum (see [`server`] and [`conn`]). Extended headers
//! (64-bit lengths) are negotiated per connection ([`codec::HeaderMode`]).
//!
//! TLS ([`tls`]): STARTTLS in the spec's modes (off, on, require), X.509
//! through rustls and PSK through OpenSSL. The handshake upgrades its
//! transport when STARTTLS is acknowledged ([`handshake::Transport`]); the
//! transmission phase then reads and writes through TLS halves that share
//! one session, driven by the connection's reading and writing tasks on the
//! server's network threads (see [`server`] for the thread model).
#![deny(unsafe_code)]

pub mod codec;
pub mod proto;

// Everything above the codec needs the `server` feature (on by default);
// without it the crate is the protocol alone, which is what the fuzz
// target builds.
#[cfg(feature = "server")]
pub mod backend;
#[cfg(feature = "server")]
pub mod buffers;
#[cfg(feature = "server")]
pub mod client;
#[cfg(feature = "server")]
pub mod conn;
#[cfg(feature = "server")]
pub mod export;
#[cfg(feature = "server")]
pub mod handshake;
#[cfg(feature = "server")]
pub mod pool;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
pub mod stream;
#[cfg(feature = "server")]
pub mod tls;
#[cfg(feature = "server")]
mod trouble;

#[cfg(feature = "server")]
pub use backend::{Backend, BackendError, Extent, MemBackend, OwnedPayload, VolumeBackend};
#[cfg(feature = "server")]
pub use export::{Export, ExportSet};
#[cfg(feature = "server")]
pub use server::{Server, ServerConfig, ShutdownHandle};
#[cfg(feature = "server")]
pub use stream::{Listener, Stream};
#[cfg(feature = "server")]
pub use tls::{TlsConfig, TlsMode};
