//! Listeners, connections and shutdown.
//!
//! One thread per listener accepts; one reader thread per connection runs
//! the handshake and then [`conn::serve`]; requests run on the shared
//! [`WorkerPool`]. Shutdown ([`ShutdownHandle::shutdown`], wired to
//! SIGINT/SIGTERM by [`Server::run_with_signals`]) stops accepting, shuts
//! the read side of every connection so readers see end-of-stream, waits
//! until every request already read has been answered, and returns; the
//! caller then flushes and closes the volumes.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::backend::Backend;
use crate::conn::{self, ConnLimits};
use crate::handshake::{self, HandshakeLimits, Outcome};
use crate::pool::WorkerPool;

/// One export: a name clients ask for and the backend behind it.
pub struct Export {
    pub name: String,
    pub description: String,
    pub backend: Arc<dyn Backend>,
    /// Advertised minimum block size (1: any alignment works).
    pub min_block_bytes: u32,
}

impl Export {
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        backend: Arc<dyn Backend>,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            backend,
            min_block_bytes: 1,
        }
    }

    pub fn size_bytes(&self) -> u64 {
        self.backend.size_bytes()
    }
}

/// The exports of a server; the first one is also the default export (the
/// empty name).
pub struct ExportSet {
    exports: Vec<Arc<Export>>,
}

impl ExportSet {
    /// Fails on an empty set or a repeated name.
    pub fn new(exports: Vec<Export>) -> Result<Self, String> {
        if exports.is_empty() {
            return Err("no export to serve".into());
        }
        for (i, e) in exports.iter().enumerate() {
            if exports[..i].iter().any(|o| o.name == e.name) {
                return Err(format!("export name {:?} given twice", e.name));
            }
            if e.name.len() > crate::proto::MAX_STRING_BYTES || e.name.contains('\0') {
                return Err(format!(
                    "export name {:?} is not a valid NBD string",
                    e.name
                ));
            }
        }
        Ok(Self {
            exports: exports.into_iter().map(Arc::new).collect(),
        })
    }

    /// The export called `name`; the empty name is the default export.
    pub fn find(&self, name: &str) -> Option<Arc<Export>> {
        if name.is_empty() {
            return self.exports.first().cloned();
        }
        self.exports.iter().find(|e| e.name == name).cloned()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Export>> {
        self.exports.iter()
    }
}

/// Out-of-band control of a connection's stream.
pub trait StreamControl: Send + Sync {
    /// Shuts the stream down both ways: a blocked reader sees end-of-stream,
    /// further writes fail.
    fn shutdown(&self);
    /// Shuts down only the read side (server shutdown: finish what was read).
    fn shutdown_read(&self);
    fn set_read_timeout(&self, t: Option<Duration>);
}

impl StreamControl for TcpStream {
    fn shutdown(&self) {
        let _ = TcpStream::shutdown(self, Shutdown::Both);
    }
    fn shutdown_read(&self) {
        let _ = TcpStream::shutdown(self, Shutdown::Read);
    }
    fn set_read_timeout(&self, t: Option<Duration>) {
        let _ = TcpStream::set_read_timeout(self, t);
    }
}

impl StreamControl for UnixStream {
    fn shutdown(&self) {
        let _ = UnixStream::shutdown(self, Shutdown::Both);
    }
    fn shutdown_read(&self) {
        let _ = UnixStream::shutdown(self, Shutdown::Read);
    }
    fn set_read_timeout(&self, t: Option<Duration>) {
        let _ = UnixStream::set_read_timeout(self, t);
    }
}

/// Control for streams that cannot be shut down (pipes).
struct NoControl;
impl StreamControl for NoControl {
    fn shutdown(&self) {}
    fn shutdown_read(&self) {}
    fn set_read_timeout(&self, _t: Option<Duration>) {}
}

/// A connected byte stream split into halves. TLS would plug in here: a TLS
/// session is one object that both reads and writes, so a TLS `Stream` would
/// be driven by one I/O thread owning the session and expose channel-backed
/// `reader`/`writer` halves; the handshake and transmission code see only
/// `Read`/`Write` and need no change.
pub struct Stream {
    pub reader: Box<dyn Read + Send>,
    pub writer: Box<dyn Write + Send>,
    pub control: Arc<dyn StreamControl>,
    pub peer: String,
}

impl Stream {
    pub fn from_tcp(s: TcpStream) -> io::Result<Self> {
        // The spec recommends TCP_NODELAY: replies are small and latency-bound.
        s.set_nodelay(true)?;
        let peer = s
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "tcp".into());
        Ok(Self {
            reader: Box::new(s.try_clone()?),
            control: Arc::new(s.try_clone()?),
            writer: Box::new(s),
            peer,
        })
    }

    pub fn from_unix(s: UnixStream) -> io::Result<Self> {
        Ok(Self {
            reader: Box::new(s.try_clone()?),
            control: Arc::new(s.try_clone()?),
            writer: Box::new(s),
            peer: "unix".into(),
        })
    }

    /// Standard input and output (`jbdev serve -s`, libnbd's
    /// `connect_command`): if stdin is a socket (the usual socketpair) it is
    /// used both ways; otherwise stdin is read and stdout written.
    pub fn from_stdio() -> io::Result<Self> {
        use std::os::fd::AsFd;
        let fd = io::stdin().as_fd().try_clone_to_owned()?;
        let sock = UnixStream::from(fd);
        if sock.local_addr().is_ok() {
            let mut s = Self::from_unix(sock)?;
            s.peer = "stdin".into();
            return Ok(s);
        }
        let input = std::fs::File::from(io::stdin().as_fd().try_clone_to_owned()?);
        let output = std::fs::File::from(io::stdout().as_fd().try_clone_to_owned()?);
        Ok(Self {
            reader: Box::new(input),
            writer: Box::new(output),
            control: Arc::new(NoControl),
            peer: "stdio".into(),
        })
    }
}

/// A listening socket.
pub enum Listener {
    Tcp(TcpListener),
    /// A unix socket; `unlink` is removed when the server stops (set for
    /// sockets the server created itself).
    Unix {
        listener: UnixListener,
        unlink: Option<PathBuf>,
    },
}

impl Listener {
    pub fn describe(&self) -> String {
        match self {
            Self::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "tcp".into()),
            Self::Unix { listener, .. } => listener
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
                .unwrap_or_else(|| "unix socket".into()),
        }
    }

    fn accept(&self) -> io::Result<Stream> {
        match self {
            Self::Tcp(l) => Stream::from_tcp(l.accept()?.0),
            Self::Unix { listener, .. } => Stream::from_unix(listener.accept()?.0),
        }
    }

    /// Connects to the listener so that a blocked `accept` returns.
    fn wake(&self) {
        match self {
            Self::Tcp(l) => {
                if let Ok(mut a) = l.local_addr() {
                    if a.ip().is_unspecified() {
                        a.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                    }
                    let _ = TcpStream::connect_timeout(&a, Duration::from_millis(200));
                }
            }
            Self::Unix { listener, .. } => {
                if let Some(p) = listener
                    .local_addr()
                    .ok()
                    .and_then(|a| a.as_pathname().map(|p| p.to_path_buf()))
                {
                    let _ = UnixStream::connect(p);
                }
            }
        }
    }
}

/// Listening sockets passed by systemd-style socket activation
/// (`LISTEN_FDS`/`LISTEN_PID`), e.g. by `nbdinfo -- [ jbdev serve IMG ]`.
/// `Ok(None)` when the process was not socket-activated.
///
/// Uses the `listenfd` crate, which checks `LISTEN_PID` and the socket type
/// and family of each descriptor before adopting it, so this crate needs no
/// `unsafe` for `FromRawFd`.
pub fn activated_listeners() -> io::Result<Option<Vec<Listener>>> {
    let mut fds = listenfd::ListenFd::from_env();
    if fds.len() == 0 {
        return Ok(None);
    }
    let mut out = Vec::new();
    for i in 0..fds.len() {
        if let Ok(Some(l)) = fds.take_unix_listener(i) {
            out.push(Listener::Unix {
                listener: l,
                unlink: None,
            });
        } else if let Some(l) = fds.take_tcp_listener(i)? {
            out.push(Listener::Tcp(l));
        }
    }
    // Children we might start must not see the variables.
    std::env::remove_var("LISTEN_FDS");
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDNAMES");
    Ok(Some(out))
}

/// Server knobs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub max_inflight_requests_per_conn: u32,
    pub max_inflight_bytes_per_conn: u64,
    /// Worker threads shared by all connections (started on demand).
    pub max_worker_threads: usize,
    /// Time a client may take for the whole handshake.
    pub handshake_timeout: Duration,
    /// Options a client may send before it must enter transmission.
    pub max_options: u32,
    /// Time shutdown waits for connections to finish.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_inflight_requests_per_conn: 128,
            max_inflight_bytes_per_conn: 64 << 20,
            max_worker_threads: 256,
            handshake_timeout: Duration::from_secs(30),
            max_options: 256,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

struct ConnRegistry {
    live: Mutex<Vec<(u64, Arc<dyn StreamControl>)>>,
    empty: Condvar,
}

struct Inner {
    exports: ExportSet,
    cfg: ServerConfig,
    pool: WorkerPool,
    stopping: AtomicBool,
    next_id: AtomicU64,
    conns: ConnRegistry,
    /// Listeners to wake on shutdown.
    wakers: Mutex<Vec<Arc<Listener>>>,
}

/// An NBD server over a set of exports.
pub struct Server {
    inner: Arc<Inner>,
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

    /// Stops accepting and ends every connection after its in-flight
    /// requests are answered. Returns at once.
    pub fn shutdown(&self) {
        let Some(inner) = self.inner.upgrade() else {
            return; // already gone
        };
        if inner.stopping.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::info!("shutting down: finishing in-flight requests");
        for (_, c) in inner.conns.live.lock().iter() {
            c.shutdown_read();
        }
        for l in inner.wakers.lock().iter() {
            l.wake();
        }
        inner.conns.empty.notify_all();
    }
}

impl Server {
    pub fn new(exports: ExportSet, cfg: ServerConfig) -> Self {
        let pool = WorkerPool::new(cfg.max_worker_threads);
        Self {
            inner: Arc::new(Inner {
                exports,
                cfg,
                pool,
                stopping: AtomicBool::new(false),
                next_id: AtomicU64::new(1),
                conns: ConnRegistry {
                    live: Mutex::new(Vec::new()),
                    empty: Condvar::new(),
                },
                wakers: Mutex::new(Vec::new()),
            }),
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
        let listeners: Vec<Arc<Listener>> = listeners.into_iter().map(Arc::new).collect();
        *self.inner.wakers.lock() = listeners.clone();
        for l in &listeners {
            let inner = Arc::downgrade(&self.inner);
            let l = l.clone();
            // Accept threads are not joined: one may stay blocked in accept
            // if waking it fails; it holds the server only weakly and exits
            // with the process.
            let _ = std::thread::Builder::new()
                .name("nbd-accept".into())
                .spawn(move || accept_loop(&inner, &l));
        }
        let mut live = self.inner.conns.live.lock();
        while !self.inner.stopping.load(Ordering::Acquire) {
            self.inner
                .conns
                .empty
                .wait_for(&mut live, Duration::from_millis(200));
        }
        drop(live);
        self.wait_connections();
        for l in &listeners {
            if let Listener::Unix {
                unlink: Some(p), ..
            } = &**l
            {
                let _ = std::fs::remove_file(p);
            }
        }
    }

    /// Serves one already-connected stream (stdin/stdout mode) until it
    /// ends or the server shuts down.
    pub fn serve_one(&self, stream: Stream) {
        let inner = self.inner.clone();
        let t = std::thread::Builder::new()
            .name("nbd-conn".into())
            .spawn(move || run_connection(&inner, stream));
        match t {
            Ok(t) => {
                // Wait for the connection or for shutdown (then the grace time).
                let mut live = self.inner.conns.live.lock();
                while !t.is_finished() && !self.inner.stopping.load(Ordering::Acquire) {
                    self.inner
                        .conns
                        .empty
                        .wait_for(&mut live, Duration::from_millis(100));
                }
                drop(live);
                self.wait_connections();
            }
            Err(e) => tracing::error!("cannot start a connection thread: {e}"),
        }
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

    /// Runs [`Server::serve`] and shuts down on SIGINT or SIGTERM.
    pub fn run_with_signals(&self, listeners: Vec<Listener>) -> io::Result<()> {
        let _guard = self.install_signals()?;
        self.serve(listeners);
        Ok(())
    }

    /// Runs [`Server::serve_one`] and shuts down on SIGINT or SIGTERM.
    pub fn run_one_with_signals(&self, stream: Stream) -> io::Result<()> {
        let _guard = self.install_signals()?;
        self.serve_one(stream);
        Ok(())
    }

    fn install_signals(&self) -> io::Result<SignalGuard> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
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
}

struct SignalGuard(signal_hook::iterator::Handle);
impl Drop for SignalGuard {
    fn drop(&mut self) {
        self.0.close();
    }
}

fn accept_loop(weak: &Weak<Inner>, listener: &Listener) {
    loop {
        let res = listener.accept();
        let Some(inner) = weak.upgrade() else { return };
        if inner.stopping.load(Ordering::Acquire) {
            return;
        }
        match res {
            Ok(stream) => {
                let inner2 = inner.clone();
                let spawned = std::thread::Builder::new()
                    .name("nbd-conn".into())
                    .spawn(move || run_connection(&inner2, stream));
                if let Err(e) = spawned {
                    tracing::warn!("cannot start a connection thread: {e}");
                }
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("accept on {} failed: {e}", listener.describe());
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn run_connection(inner: &Arc<Inner>, stream: Stream) {
    let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
    {
        let mut live = inner.conns.live.lock();
        if inner.stopping.load(Ordering::Acquire) {
            stream.control.shutdown();
            return;
        }
        live.push((id, stream.control.clone()));
    }
    tracing::debug!("connection {id} from {}", stream.peer);
    let Stream {
        reader,
        mut writer,
        control,
        ..
    } = stream;
    // One buffered reader for both phases: bytes read ahead during the
    // handshake belong to the first requests.
    let mut reader: Box<dyn BufRead + Send> = Box::new(BufReader::with_capacity(256 << 10, reader));
    control.set_read_timeout(Some(inner.cfg.handshake_timeout));
    let limits = HandshakeLimits {
        max_options: inner.cfg.max_options,
    };
    let stopping = || inner.stopping.load(Ordering::Acquire);
    let outcome =
        handshake::negotiate(&mut reader, &mut writer, &inner.exports, &limits, &stopping);
    match outcome {
        Ok(Outcome::Transmission(session)) => {
            control.set_read_timeout(None);
            tracing::debug!(
                "connection {id}: export {:?}, structured replies {}",
                session.export.name,
                session.structured_replies
            );
            let limits = ConnLimits {
                max_inflight_requests: inner.cfg.max_inflight_requests_per_conn,
                max_inflight_bytes: inner.cfg.max_inflight_bytes_per_conn,
            };
            conn::serve(
                reader,
                writer,
                control.clone(),
                session,
                &inner.pool,
                &limits,
            );
        }
        Ok(Outcome::Closed) => control.shutdown(),
        Err(e) => {
            tracing::debug!("connection {id}: handshake ended: {e}");
            control.shutdown();
        }
    }
    let mut live = inner.conns.live.lock();
    live.retain(|(i, _)| *i != id);
    if live.is_empty() {
        inner.conns.empty.notify_all();
    }
}
