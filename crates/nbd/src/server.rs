//! Listeners, connections and shutdown.
//!
//! # Threads
//!
//! The server runs a fixed set of threads, whatever the number of clients:
//! * `net_threads` *network threads* (default: one per core) — a tokio
//!   multi-threaded runtime that multiplexes all socket I/O of every
//!   connection: accepting (one task per listener), the whole handshake
//!   including STARTTLS and the TLS handshake, request parsing, reading
//!   write payloads into pooled buffers and writing replies. Each admitted
//!   connection is one task (handshake, then `conn::serve`'s reading
//!   loop) plus, in transmission, one writing task. Nothing on these
//!   threads blocks on the device or on a lock held across I/O;
//! * `worker_threads` *workers* ([`WorkerPool`], started on demand up to
//!   the cap) — backend calls, which block on the volume. A worker (or a
//!   volume commit thread, for writes and flushes completed through
//!   [`crate::Backend::write_at_then`]) only queues the reply and wakes the
//!   connection's writing task;
//! * the caller's thread, which supervises (shutdown, idle buffer release),
//!   and a signal thread when signals are installed.
//!
//! So 1 or 1000 connections run the same threads; a connection costs its
//! two tasks, its read buffer and its socket. The single client of stdio
//! mode ([`Server::serve_one`]) is the exception when stdin is a pipe rather
//! than a socket: tokio reads stdin and writes stdout through its blocking
//! bridge (up to two more threads, for that one client).
//!
//! Limits, each independent of what clients do:
//! * at most `max_connections` connections (in handshake or transmission);
//!   more are closed at once;
//! * the whole handshake must finish within `handshake_timeout`, however
//!   the client trickles its bytes;
//! * a reply write that cannot proceed for `send_timeout` (a client that
//!   does not read), or a client that takes less than
//!   [`conn::MIN_SEND_PROGRESS_BYTES`] per `send_timeout`, is dropped;
//! * with `idle_timeout` set, a connection with nothing in flight that
//!   sends nothing for that long is closed (off by default);
//! * `worker_threads` workers and `buffer_budget_bytes` of payload buffers
//!   for all connections together.
//!
//! Shutdown ([`ShutdownHandle::shutdown`], wired to SIGINT/SIGTERM/SIGHUP/SIGQUIT by
//! [`Server::run_with_signals`], and optionally to the parent's exit or to
//! the last client's leaving) stops accepting and ends connections in
//! handshake; in transmission, every request already accepted is carried
//! out and answered, and the requests that still arrive are answered
//! `NBD_ESHUTDOWN` (the spec's soft disconnect) until the client pauses,
//! disconnects or closes. Then the server sends its end of stream and
//! reads (discarding) what the client still sends for a moment before it
//! closes the socket: closing with unread bytes would make the kernel reset
//! the connection, and a reset discards the replies the client has not read
//! yet. `serve` returns when every connection has ended (or the grace time
//! has passed); the caller then flushes and closes the volumes.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{watch, Notify};

use crate::buffers::BufferPool;
use crate::conn::{self, ConnLimits, ConnResources};
use crate::handshake::{self, HandshakeLimits, Outcome};
use crate::pool::WorkerPool;
use crate::stream::{AsyncIn, AsyncListener, AsyncOut};
use crate::tls::{TlsConfig, TlsMode};

pub use crate::export::{Export, ExportSet};
pub use crate::stream::{activated_listeners, Listener, Stream, StreamControl};

/// Server knobs. Every field is a limit that holds whatever clients do.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub max_inflight_requests_per_conn: u32,
    /// Payload bytes (write data and read replies) in flight per connection.
    pub max_inflight_bytes_per_conn: u64,
    /// Worker threads shared by all connections: how many requests are in
    /// the volume at once.
    pub worker_threads: usize,
    /// Network threads shared by all connections: all socket I/O.
    pub net_threads: usize,
    /// Connections at once, in handshake or transmission.
    pub max_connections: usize,
    /// Payload buffer bytes in use at once, over all connections.
    pub buffer_budget_bytes: u64,
    /// Freed payload buffer bytes kept for reuse.
    pub buffer_retain_bytes: u64,
    /// Time a client may take for the whole handshake.
    pub handshake_timeout: Duration,
    /// Time one reply write may block before the client is dropped.
    pub send_timeout: Duration,
    /// Time a write's payload (or a begun request header) may take to arrive.
    pub payload_timeout: Duration,
    /// Time a connection with nothing in flight may send nothing before it
    /// is closed (None: never, the default).
    pub idle_timeout: Option<Duration>,
    /// Options a client may send before it must enter transmission.
    pub max_options: u32,
    /// Time shutdown waits for connections to finish.
    pub shutdown_grace: Duration,
    /// Shut down when the parent process exits (checked twice a second).
    pub exit_with_parent: bool,
    /// Shut down once the last connection ends (after at least one).
    pub exit_when_idle: bool,
    /// TLS mode and credentials; `None` is no TLS (STARTTLS refused).
    pub tls: Option<Arc<TlsConfig>>,
}

/// Default worker count: 8 per core, at least 16 and at most 64. Workers
/// only run what would block a network thread: reads the page cache cannot
/// answer (one device read each, so this is the device queue depth of a
/// read load), partial-block writes (a home read first), writes waiting
/// for journal space, trims, zeroes and block status. Writes and flushes no
/// longer keep a worker through their commit (they complete through the
/// volume's completions), so the count no longer bounds group commit —
/// it used to be 32-128 for that reason.
pub fn default_worker_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores * 8).clamp(16, 64)
}

/// How many workers one export's jobs may hold at once, of `workers`, with
/// `exports` exports: all of them for one export; with more, each of the
/// others keeps at least one (up to half the pool between them), so an
/// export whose store stalls cannot take every worker (session 22's
/// failure pass: a hung FUSE store under one export stopped the others).
pub fn lane_cap(workers: usize, exports: usize) -> usize {
    let workers = workers.max(1);
    let others = exports.saturating_sub(1);
    (workers - others.min(workers / 2)).max(1)
}

/// Default network thread count: one per core.
pub fn default_net_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_inflight_requests_per_conn: 128,
            max_inflight_bytes_per_conn: 64 << 20,
            worker_threads: default_worker_threads(),
            net_threads: default_net_threads(),
            max_connections: 128,
            buffer_budget_bytes: 256 << 20,
            buffer_retain_bytes: 64 << 20,
            handshake_timeout: Duration::from_secs(10),
            send_timeout: Duration::from_secs(30),
            payload_timeout: Duration::from_secs(30),
            idle_timeout: None,
            max_options: 256,
            shutdown_grace: Duration::from_secs(30),
            exit_with_parent: false,
            exit_when_idle: false,
            tls: None,
        }
    }
}

/// How long the payload buffer pool must go unused before the buffers it
/// keeps for reuse are freed (an idle server holds none).
pub const BUFFER_IDLE_RELEASE: Duration = Duration::from_secs(2);

struct ConnRegistry {
    live: Mutex<Vec<(u64, Arc<dyn StreamControl>)>>,
    empty: Condvar,
}

struct Inner {
    exports: ExportSet,
    cfg: ServerConfig,
    pool: WorkerPool,
    buffers: Arc<BufferPool>,
    stopping: AtomicBool,
    /// Tells the network threads' tasks (accept loops, idle readers) that
    /// the server stops.
    stop_tx: watch::Sender<bool>,
    /// Where connection tasks are spawned.
    rt: tokio::runtime::Handle,
    next_id: AtomicU64,
    refused: AtomicU64,
    /// Refusal handshakes in progress ([`REFUSAL_SLOTS`]).
    refusing: std::sync::atomic::AtomicUsize,
    /// Refusals logged at most every [`REFUSAL_LOG_EVERY`].
    refusal_log: jbdev_volume::ratelimit::RateLimit,
    conns: ConnRegistry,
    /// A connection reached transmission: from then on `exit_when_idle`
    /// stops the server when the last one ends. A port probe, a refused
    /// client or a failed TLS handshake does not arm it (session 31's TLS
    /// pass: any of them stopped a `--once` server before its client came;
    /// qemu-nbd counts negotiated clients only, too).
    served: AtomicBool,
}

/// An NBD server over a set of exports.
pub struct Server {
    inner: Arc<Inner>,
    /// The network threads. Owned here, not by `Inner` (which tasks hold):
    /// a runtime must not be dropped on one of its own threads.
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            // Tasks still running after the grace time are dropped (their
            // sockets closed); a blocking stdin read is not waited for.
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// Stops a running server from another thread. Holds the server weakly, so
/// a forgotten handle does not keep the exports (and volumes) open.
#[derive(Clone)]
pub struct ShutdownHandle {
    inner: Weak<Inner>,
}

impl ShutdownHandle {
    /// Connections open now (0 once the server is gone); for metrics.
    pub fn connections_open(&self) -> usize {
        self.inner
            .upgrade()
            .map_or(0, |i| i.conns.live.lock().len())
    }

    /// Payload buffer bytes in use now, over all connections (0 once the
    /// server is gone); for metrics.
    pub fn payload_buffer_bytes(&self) -> u64 {
        self.inner.upgrade().map_or(0, |i| i.buffers.in_use_bytes())
    }

    /// Stops accepting and ends every connection after its in-flight
    /// requests are answered. Returns at once.
    pub fn shutdown(&self) {
        if let Some(inner) = self.inner.upgrade() {
            begin_shutdown(&inner);
        }
    }
}

fn begin_shutdown(inner: &Inner) {
    if inner.stopping.swap(true, Ordering::AcqRel) {
        return;
    }
    tracing::info!("shutting down: finishing in-flight requests");
    // Every connection watches this: handshakes end, transmission answers
    // what it accepted and ESHUTDOWN to the rest (see `conn::serve`). The
    // read side is not shut: data the client still sends must be read,
    // or closing the socket would reset the connection.
    inner.stop_tx.send_replace(true);
    inner.conns.empty.notify_all();
}

impl Server {
    /// # Panics
    /// If the network threads cannot be started (the system refuses new
    /// threads).
    pub fn new(exports: ExportSet, cfg: ServerConfig) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.net_threads.max(1))
            // Only stdio mode's blocking bridge (stdin, stdout) uses these.
            .max_blocking_threads(2)
            .thread_name("nbd-net")
            .enable_io()
            .enable_time()
            .build()
            .unwrap_or_else(|e| panic!("cannot start the NBD network threads: {e}"));
        let pool = WorkerPool::new(cfg.worker_threads);
        let cap = lane_cap(cfg.worker_threads, exports.iter().count());
        for e in exports.iter() {
            e.lane.set_cap(cap);
        }
        // Each connection the server may take has a share of the budget
        // (buffers.rs): a few that hold large buffers cannot stall the rest.
        let buffers = Arc::new(BufferPool::with_shares(
            cfg.buffer_budget_bytes,
            cfg.buffer_retain_bytes,
            cfg.max_connections.max(1),
        ));
        Self {
            inner: Arc::new(Inner {
                exports,
                cfg,
                pool,
                buffers,
                stopping: AtomicBool::new(false),
                stop_tx: watch::Sender::new(false),
                rt: runtime.handle().clone(),
                next_id: AtomicU64::new(1),
                refused: AtomicU64::new(0),
                refusing: std::sync::atomic::AtomicUsize::new(0),
                served: AtomicBool::new(false),
                refusal_log: jbdev_volume::ratelimit::RateLimit::new(REFUSAL_LOG_EVERY),
                conns: ConnRegistry {
                    live: Mutex::new(Vec::new()),
                    empty: Condvar::new(),
                },
            }),
            runtime: Some(runtime),
        }
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// Serves `listeners` until shutdown, then waits (up to the grace time)
    /// for connections to finish. Unix socket files the server created are
    /// removed.
    pub fn serve(&self, listeners: Vec<Listener>) {
        let mut unlink = Vec::new();
        for l in listeners {
            if let Listener::Unix {
                unlink: Some(p), ..
            } = &l
            {
                // The socket file as bound: removed at the end only if the
                // path still names it (see `remove_own_socket`).
                unlink.push((p.clone(), file_identity(p)));
            }
            let what = l.describe();
            let registered = {
                let _rt = self.inner.rt.enter();
                l.into_async()
            };
            match registered {
                Ok(l) => {
                    let inner = Arc::downgrade(&self.inner);
                    let stop = self.inner.stop_tx.subscribe();
                    self.inner.rt.spawn(accept_loop(inner, l, what, stop));
                }
                Err(e) => tracing::warn!("cannot listen on {what}: {e}"),
            }
        }
        self.watch_parent();
        let mut live = self.inner.conns.live.lock();
        while !self.inner.stopping.load(Ordering::Acquire) {
            self.inner
                .conns
                .empty
                .wait_for(&mut live, Duration::from_millis(200));
            parking_lot::MutexGuard::unlocked(&mut live, || self.release_idle_buffers());
        }
        drop(live);
        self.wait_connections();
        for (p, bound) in unlink {
            remove_own_socket(&p, bound);
        }
    }

    /// Serves one already-connected stream (stdin/stdout mode) until it
    /// ends or the server shuts down.
    pub fn serve_one(&self, stream: Stream) {
        self.watch_parent();
        if !admit(&self.inner, stream) {
            return;
        }
        // Wait for the connection or for shutdown (then the grace time).
        let mut live = self.inner.conns.live.lock();
        while !live.is_empty() && !self.inner.stopping.load(Ordering::Acquire) {
            self.inner
                .conns
                .empty
                .wait_for(&mut live, Duration::from_millis(100));
            parking_lot::MutexGuard::unlocked(&mut live, || self.release_idle_buffers());
        }
        drop(live);
        self.wait_connections();
    }

    /// Gives the payload buffers kept for reuse back to the system once no
    /// request has needed one for [`BUFFER_IDLE_RELEASE`].
    fn release_idle_buffers(&self) {
        let freed = self.inner.buffers.release_when_idle(BUFFER_IDLE_RELEASE);
        if freed > 0 {
            // The buffers went back to malloc, which keeps them (and what
            // the burst's other allocations freed) in its arenas: hand that
            // to the system too, once per idle period.
            let trimmed = jbdev_device::heap::release_free_memory();
            tracing::debug!(
                "idle: released {freed} bytes of kept payload buffers (heap trimmed: {trimmed})"
            );
        }
    }

    /// With `exit_with_parent`, a task on the network threads that shuts
    /// the server down when the parent process goes away (we are
    /// reparented).
    fn watch_parent(&self) {
        if !self.inner.cfg.exit_with_parent {
            return;
        }
        let parent = std::os::unix::process::parent_id();
        let handle = self.shutdown_handle();
        self.inner.rt.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let Some(inner) = handle.inner.upgrade() else {
                    return;
                };
                if inner.stopping.load(Ordering::Acquire) {
                    return;
                }
                drop(inner);
                if std::os::unix::process::parent_id() != parent {
                    tracing::info!("parent process {parent} exited; shutting down");
                    handle.shutdown();
                    return;
                }
            }
        });
    }

    fn wait_connections(&self) {
        let deadline = Instant::now() + self.inner.cfg.shutdown_grace;
        let mut live = self.inner.conns.live.lock();
        while !live.is_empty() {
            if self
                .inner
                .conns
                .empty
                .wait_until(&mut live, deadline)
                .timed_out()
            {
                tracing::warn!(
                    "{} connection(s) still busy after the shutdown grace time",
                    live.len()
                );
                for (_, c) in live.iter() {
                    c.shutdown();
                }
                return;
            }
        }
    }

    /// Runs [`Server::serve`] and shuts down on a signal ([`Server::install_signals`]).
    pub fn run_with_signals(&self, listeners: Vec<Listener>) -> io::Result<()> {
        let _guard = self.install_signals()?;
        self.serve(listeners);
        Ok(())
    }

    /// Runs [`Server::serve_one`] and shuts down on a signal ([`Server::install_signals`]).
    pub fn run_one_with_signals(&self, stream: Stream) -> io::Result<()> {
        let _guard = self.install_signals()?;
        self.serve_one(stream);
        Ok(())
    }

    /// Shuts the server down on SIGINT, SIGTERM, SIGHUP or SIGQUIT while
    /// the guard lives (the signals nbdkit exits cleanly on: a closed
    /// terminal's SIGHUP must not kill the server before it flushes).
    /// Install it before announcing the server: a supervisor may signal as
    /// soon as it sees the announcement.
    pub fn install_signals(&self) -> io::Result<SignalGuard> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT])?;
        let handle = signals.handle();
        let shutdown = self.shutdown_handle();
        std::thread::Builder::new()
            .name("nbd-signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    tracing::info!("signal {sig} received");
                    shutdown.shutdown();
                }
            })?;
        Ok(SignalGuard(handle))
    }

    /// Connections open right now (handshake or transmission).
    pub fn connections(&self) -> usize {
        self.inner.conns.live.lock().len()
    }

    /// Connections refused because `max_connections` were open.
    pub fn refused_connections(&self) -> u64 {
        self.inner.refused.load(Ordering::Relaxed)
    }

    /// Payload buffer bytes in use and kept for reuse.
    pub fn buffer_bytes(&self) -> (u64, u64) {
        (
            self.inner.buffers.in_use_bytes(),
            self.inner.buffers.retained_bytes(),
        )
    }
}

/// Keeps the signal handling of [`Server::install_signals`] installed.
pub struct SignalGuard(signal_hook::iterator::Handle);
impl Drop for SignalGuard {
    fn drop(&mut self) {
        self.0.close();
    }
}

async fn accept_loop(
    weak: Weak<Inner>,
    listener: AsyncListener,
    what: String,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let res = tokio::select! {
            r = listener.accept() => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        let Some(inner) = weak.upgrade() else { return };
        if inner.stopping.load(Ordering::Acquire) {
            return;
        }
        match res {
            Ok(stream) => {
                admit(&inner, stream);
            }
            Err(e) => {
                drop(inner);
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("accept on {what} failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Registers `stream` and starts its task on the network threads, or
/// closes it if the server is stopping or `max_connections` are open.
/// True if admitted.
fn admit(inner: &Arc<Inner>, stream: Stream) -> bool {
    let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
    {
        let mut live = inner.conns.live.lock();
        if inner.stopping.load(Ordering::Acquire) {
            stream.control.shutdown();
            return false;
        }
        if live.len() >= inner.cfg.max_connections {
            drop(live);
            refuse(inner, stream);
            return false;
        }
        live.push((id, stream.control.clone()));
    }
    let registered = Registered {
        inner: inner.clone(),
        id,
    };
    inner.rt.spawn(async move {
        run_connection(&registered.inner, id, stream).await;
        drop(registered);
    });
    true
}

/// Over-limit connections told why at once (each for at most
/// [`REFUSAL_DEADLINE`]); more are closed without a word.
pub const REFUSAL_SLOTS: usize = 16;
/// How long a refused client may take to hear why.
pub const REFUSAL_DEADLINE: Duration = Duration::from_secs(2);
/// A refusal is logged at most this often (with the count since the last).
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// Turns away a connection over `max_connections`: logged (rate-limited),
/// and, while fewer than [`REFUSAL_SLOTS`] refusals are in progress,
/// answered with a handshake that gives the reason (`handshake::refuse`)
/// within [`REFUSAL_DEADLINE`]; otherwise closed at once. A refused client
/// holds no connection slot, worker or payload buffer.
fn refuse(inner: &Arc<Inner>, stream: Stream) {
    let max = inner.cfg.max_connections;
    inner.refused.fetch_add(1, Ordering::Relaxed);
    if let Some(held) = inner.refusal_log.pass(Instant::now()) {
        tracing::warn!(
            "refusing connection from {}: the limit of {max} connections is reached \
             (--max-connections){}",
            stream.peer,
            inner.refusal_log.held_note(held, "refusals")
        );
    }
    if inner.refusing.fetch_add(1, Ordering::AcqRel) >= REFUSAL_SLOTS {
        inner.refusing.fetch_sub(1, Ordering::AcqRel);
        stream.control.shutdown();
        return;
    }
    let inner2 = inner.clone();
    inner.rt.spawn(async move {
        let control = stream.control.clone();
        if let Ok((reader, writer)) = stream.into_async() {
            let mut io = HandshakeIo {
                reader: BufReader::with_capacity(4096, reader),
                writer,
                wake: Arc::new(Notify::new()),
                tls: None,
            };
            let why = format!(
                "too many connections: this server takes {max} at a time (--max-connections); \
                 try again later"
            );
            let _ = tokio::time::timeout(REFUSAL_DEADLINE, handshake::refuse(&mut io, &why)).await;
        }
        control.shutdown();
        inner2.refusing.fetch_sub(1, Ordering::AcqRel);
    });
}

/// Unregisters a connection when its task ends, however it ends (a panic,
/// or the runtime dropping it at exit).
struct Registered {
    inner: Arc<Inner>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        unregister(&self.inner, self.id);
    }
}

fn unregister(inner: &Inner, id: u64) {
    let mut live = inner.conns.live.lock();
    live.retain(|(i, _)| *i != id);
    if live.is_empty() {
        inner.conns.empty.notify_all();
        drop(live);
        if inner.cfg.exit_when_idle
            && inner.served.load(Ordering::Acquire)
            && !inner.stopping.load(Ordering::Acquire)
        {
            tracing::info!("last client left; shutting down");
            begin_shutdown(inner);
        }
    }
}

/// The connection during the handshake, on its task. The whole
/// negotiation is bounded by one deadline (a timeout around
/// [`handshake::negotiate`]), however the client trickles.
struct HandshakeIo<'a> {
    reader: conn::Input,
    writer: AsyncOut,
    /// Notified when the TLS session made records while reading (its own
    /// handshake): the reads below then flush the writer.
    wake: Arc<Notify>,
    tls: Option<&'a TlsConfig>,
}

/// Flushes `w` now and whenever `wake` is notified; returns only on an
/// error.
async fn flush_on_wake(w: &mut AsyncOut, wake: &Notify) -> io::Error {
    loop {
        if let Err(e) = w.flush().await {
            return e;
        }
        wake.notified().await;
    }
}

impl handshake::Transport for HandshakeIo<'_> {
    async fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let Self {
            reader,
            writer,
            wake,
            ..
        } = self;
        // One task reads and writes here: while it waits for the client,
        // records the TLS session made (ServerHello...) must still go out.
        let res = tokio::select! {
            biased;
            r = reader.read_exact(buf) => r.map(drop),
            e = flush_on_wake(writer, wake) => Err(e),
        };
        if res.is_err() {
            // A failed TLS handshake leaves an alert for the client (best
            // effort; the handshake deadline bounds it).
            let _ = writer.flush().await;
        }
        res
    }

    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.writer.write_all(bytes).await?;
        self.writer.flush().await
    }

    async fn start_tls(&mut self) -> io::Result<()> {
        let Some(tls) = self.tls else {
            return Err(io::Error::other("TLS is not configured"));
        };
        let empty: AsyncIn = Box::new(tokio::io::empty());
        let old = std::mem::replace(&mut self.reader, BufReader::with_capacity(1, empty));
        // Bytes read ahead after STARTTLS are the start of the TLS handshake.
        let ahead = old.buffer().to_vec();
        let raw_out = std::mem::replace(&mut self.writer, Box::new(tokio::io::sink()));
        let (r, w) = tls.wrap(old.into_inner(), raw_out, &ahead, self.wake.clone())?;
        self.reader = BufReader::with_capacity(READ_BUFFER_BYTES, Box::new(r));
        self.writer = Box::new(w);
        Ok(())
    }
}

/// Capacity of a connection's read buffer: several request headers and
/// small payloads per `read`, while idle connections stay cheap.
const READ_BUFFER_BYTES: usize = 64 << 10;

async fn run_connection(inner: &Arc<Inner>, id: u64, stream: Stream) {
    tracing::debug!("connection {id} from {}", stream.peer);
    let peer = stream.peer.clone();
    let control = stream.control.clone();
    let (reader, writer) = match stream.into_async() {
        Ok(halves) => halves,
        Err(e) => {
            tracing::warn!("connection {id} from {peer}: cannot register the socket: {e}");
            control.shutdown();
            return;
        }
    };
    let cfg = &inner.cfg;
    let tls = cfg.tls.as_deref().filter(|t| t.mode != TlsMode::Off);
    let limits = HandshakeLimits {
        max_options: cfg.max_options,
        tls: tls.map_or(TlsMode::Off, |t| t.mode),
    };
    let stopping = || inner.stopping.load(Ordering::Acquire);
    let wake = Arc::new(Notify::new());
    // One buffered reader for both phases: bytes read ahead during the
    // handshake belong to the first requests.
    let mut io = HandshakeIo {
        reader: BufReader::with_capacity(READ_BUFFER_BYTES, reader),
        writer,
        wake: wake.clone(),
        tls,
    };
    let mut stop = inner.stop_tx.subscribe();
    let outcome = tokio::select! {
        r = tokio::time::timeout(
            cfg.handshake_timeout,
            handshake::negotiate(&mut io, &inner.exports, &limits, &stopping),
        ) => r.unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "handshake not completed in time",
            ))
        }),
        // A client still negotiating gets no export once the server stops.
        _ = stop.wait_for(|s| *s) => Err(io::Error::other("the server is shutting down")),
    };
    let HandshakeIo { reader, writer, .. } = io;
    match outcome {
        Ok(Outcome::Transmission(session)) => {
            inner.served.store(true, Ordering::Release);
            tracing::debug!(
                "connection {id}: export {:?}, structured replies {}, {:?} headers, TLS {}",
                session.export.name,
                session.structured_replies,
                session.header_mode,
                session.tls
            );
            let limits = ConnLimits {
                max_inflight_requests: cfg.max_inflight_requests_per_conn,
                max_inflight_bytes: cfg.max_inflight_bytes_per_conn,
                payload_timeout: cfg.payload_timeout,
                send_timeout: cfg.send_timeout,
                idle_timeout: cfg.idle_timeout,
            };
            let res = ConnResources {
                workers: &inner.pool,
                buffers: &inner.buffers,
            };
            conn::serve(
                reader,
                writer,
                wake,
                control.clone(),
                session,
                &res,
                &limits,
                inner.stop_tx.subscribe(),
            )
            .await;
        }
        Ok(Outcome::Closed) => control.shutdown(),
        Err(e) => {
            if e.kind() == io::ErrorKind::InvalidData {
                // A failed TLS handshake: wrong key, untrusted certificate,
                // garbage. Rate-limited with a count of those held back (one
                // line per connection let any peer flood the log: session
                // 31's TLS pass); each is still logged at debug level.
                crate::trouble::client_trouble(format_args!("connection {id} from {peer}: {e}"));
            } else {
                tracing::debug!("connection {id}: handshake ended: {e}");
            }
            control.shutdown();
        }
    }
}

/// A file's device and inode numbers (None if it cannot be stat'ed).
fn file_identity(p: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Removes the unix socket file at `p` if it is still the one this server
/// bound (`bound`): a newer server that took the path over (after a
/// restart, serving another image on the same `--socket`) keeps its
/// socket. Before, the old server's shutdown removed it, and the new
/// server went on running unreachable (session 25's interop pass).
fn remove_own_socket(p: &std::path::Path, bound: Option<(u64, u64)>) {
    match (bound, file_identity(p)) {
        (Some(b), Some(now)) if b == now => {
            let _ = std::fs::remove_file(p);
        }
        (_, None) => {}
        _ => tracing::info!(
            "{} now belongs to another socket (a newer server?): left in place",
            p.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shutting-down server removes its socket file only while the path
    /// still names the socket it bound; one a newer server bound there
    /// stays (session 25's interop pass: the new server became
    /// unreachable).
    #[test]
    fn only_the_socket_this_server_bound_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.sock");
        let ours = std::os::unix::net::UnixListener::bind(&p).unwrap();
        let bound = file_identity(&p);
        assert!(bound.is_some());
        // A newer server took the path over.
        std::fs::remove_file(&p).unwrap();
        let theirs = std::os::unix::net::UnixListener::bind(&p).unwrap();
        remove_own_socket(&p, bound);
        assert!(p.exists(), "another server's socket was removed");
        // Its own is removed.
        remove_own_socket(&p, file_identity(&p));
        assert!(!p.exists());
        drop((ours, theirs));
    }
}
