//! `jbdev serve --metrics ADDR:PORT`: Prometheus metrics over HTTP.
//!
//! What is measured, and where:
//! * per export, by NBD command: requests, latency histogram, errors by
//!   errno, bytes in and out, FLUSH and FUA requests — counted by
//!   [`Instrumented`], a [`Backend`] wrapping the volume's backend, so the
//!   NBD server itself is untouched;
//! * per volume: the engine's own [`jbdev_volume::Stats`] (commits, commit
//!   latency, journal fill, checkpoint lag), read at scrape time;
//! * per process: open NBD connections, threads, resident memory.
//!
//! Invariants:
//! * No counter is shared by every request: each worker thread adds to its
//!   own cache-padded shard ([`SHARDS`] of them) and a scrape sums the
//!   shards. One shared atomic (or a histogram's mutex) touched by every
//!   I/O stops scaling with threads; the shards keep the hot path to a few
//!   uncontended atomic adds.
//! * The metrics hold volumes weakly, so they never keep a volume open: a
//!   scrape that finds its volume gone reports nothing for it.
//! * The HTTP side is bounded and concurrent: one thread (a single-threaded
//!   tokio runtime) answers up to [`MAX_HTTP_CONNECTIONS`] connections at
//!   once, each within one deadline from its accept for the whole exchange
//!   (not a timeout per read, which a client sending a byte every few
//!   seconds would renew for ever) and with a cap on the request size;
//!   connections beyond the cap are closed at once. So idle or slow
//!   clients never delay a scrape (before session 20 connections were
//!   answered one at a time, and each idle one held every scrape behind it
//!   for [`HTTP_TIMEOUT`]), and they never grow memory or threads. It is
//!   HTTP/1.0 by hand (GET only, `Connection: close`):
//!   one path, one verb, no keep-alive — a full HTTP stack would add
//!   dependencies and threads for nothing the endpoint needs.

use std::fmt;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use jbdev_nbd::backend::{BackendResult, Done, Extent, OwnedPayload};
use jbdev_nbd::{proto, Backend, ShutdownHandle};
use jbdev_volume::Volume;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Parses `--metrics`: `ADDR:PORT`, or a bare `PORT` on 127.0.0.1.
pub fn parse_metrics_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse().map_err(|_| {
        format!("bad metrics address {s:?}: expected ADDR:PORT (e.g. 127.0.0.1:10810) or PORT")
    })
}

/// Shards of the per-request counters (see the module invariants).
const SHARDS: usize = 16;

/// NBD commands counted separately, in label order ("other": a command
/// type the server does not know, answered EINVAL).
const COMMANDS: [&str; 8] = [
    "read",
    "write",
    "flush",
    "trim",
    "write_zeroes",
    "block_status",
    "cache",
    "other",
];
const READ: usize = 0;
const WRITE: usize = 1;
const FLUSH: usize = 2;
const TRIM: usize = 3;
const WRITE_ZEROES: usize = 4;
const BLOCK_STATUS: usize = 5;
const CACHE: usize = 6;
const OTHER: usize = 7;

/// The [`COMMANDS`] slot of NBD command type `kind`.
fn command_slot(kind: u16) -> usize {
    match kind {
        proto::CMD_READ => READ,
        proto::CMD_WRITE => WRITE,
        proto::CMD_FLUSH => FLUSH,
        proto::CMD_TRIM => TRIM,
        proto::CMD_WRITE_ZEROES => WRITE_ZEROES,
        proto::CMD_BLOCK_STATUS => BLOCK_STATUS,
        proto::CMD_CACHE => CACHE,
        _ => OTHER,
    }
}

/// Errno values the backend replies with, by name; the last slot counts any
/// other value.
const ERRNOS: [(u32, &str); 9] = [
    (proto::EPERM, "EPERM"),
    (proto::EIO, "EIO"),
    (proto::ENOMEM, "ENOMEM"),
    (proto::EINVAL, "EINVAL"),
    (proto::ENOSPC, "ENOSPC"),
    (proto::EOVERFLOW, "EOVERFLOW"),
    (proto::ENOTSUP, "ENOTSUP"),
    (proto::ESHUTDOWN, "ESHUTDOWN"),
    (u32::MAX, "other"),
];

/// Upper bounds of the request latency buckets: 8 µs doubling to ~4.2 s.
const LATENCY_BUCKETS: usize = 20;
const FIRST_BUCKET_NS: u64 = 8_000;

/// The bucket a latency falls in (`LATENCY_BUCKETS` is the +Inf bucket).
fn bucket_of(ns: u64) -> usize {
    let mut bound = FIRST_BUCKET_NS;
    for i in 0..LATENCY_BUCKETS {
        if ns <= bound {
            return i;
        }
        bound = bound.saturating_mul(2);
    }
    LATENCY_BUCKETS
}

fn bucket_bound_seconds(i: usize) -> f64 {
    (FIRST_BUCKET_NS << i) as f64 / 1e9
}

/// One command's counters in one shard.
#[derive(Default)]
struct CommandCounters {
    requests: AtomicU64,
    latency_ns_sum: AtomicU64,
    /// Per-bucket (not cumulative) counts; the last one is +Inf.
    latency_buckets: [AtomicU64; LATENCY_BUCKETS + 1],
    errors: [AtomicU64; ERRNOS.len()],
}

/// One shard of an export's counters.
#[derive(Default)]
struct Shard {
    commands: [CommandCounters; COMMANDS.len()],
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    fua_requests: AtomicU64,
    in_flight: AtomicU64,
    done: AtomicU64,
}

/// Counters of one export.
struct ExportCounters {
    name: String,
    shards: Box<[CachePadded<Shard>; SHARDS]>,
}

/// Sum of one command's counters over all shards.
#[derive(Default)]
struct CommandTotals {
    requests: u64,
    latency_ns_sum: u64,
    latency_buckets: [u64; LATENCY_BUCKETS + 1],
    errors: [u64; ERRNOS.len()],
}

impl ExportCounters {
    fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            shards: Box::new(std::array::from_fn(|_| CachePadded::default())),
        }
    }

    /// This thread's shard. Worker threads are long-lived, so each keeps to
    /// one shard; threads are spread round-robin over the shards.
    fn shard(&self) -> &Shard {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
        }
        #[allow(clippy::indexing_slicing)] // `% SHARDS` keeps it in the array
        &self.shards[SLOT.with(|s| *s) % SHARDS]
    }

    fn command_totals(&self, cmd: usize) -> CommandTotals {
        let mut t = CommandTotals::default();
        for s in self.shards.iter() {
            let Some(c) = s.commands.get(cmd) else {
                continue;
            };
            t.requests += c.requests.load(Ordering::Relaxed);
            t.latency_ns_sum += c.latency_ns_sum.load(Ordering::Relaxed);
            for (sum, b) in t.latency_buckets.iter_mut().zip(&c.latency_buckets) {
                *sum += b.load(Ordering::Relaxed);
            }
            for (sum, e) in t.errors.iter_mut().zip(&c.errors) {
                *sum += e.load(Ordering::Relaxed);
            }
        }
        t
    }

    fn total(&self, f: impl Fn(&Shard) -> &AtomicU64) -> u64 {
        self.shards
            .iter()
            .map(|s| f(s).load(Ordering::Relaxed))
            .sum()
    }
}

/// A [`Backend`] that counts what passes through it.
pub struct Instrumented<B> {
    inner: B,
    counters: Arc<ExportCounters>,
}

impl<B: Backend> Instrumented<B> {
    /// Times `op` as one request of command `cmd`.
    fn measure<T>(
        &self,
        cmd: usize,
        fua: bool,
        op: impl FnOnce(&B) -> BackendResult<T>,
    ) -> BackendResult<T> {
        let start = self.begin();
        let res = op(&self.inner);
        record(&self.counters, cmd, fua, start, &res);
        res
    }

    /// Counts a request as started; its end is [`record`]ed.
    fn begin(&self) -> Instant {
        self.counters
            .shard()
            .in_flight
            .fetch_add(1, Ordering::Relaxed);
        Instant::now()
    }

    /// `done`, counting the request (command `cmd`, `written` bytes on
    /// success) from now until it runs.
    fn measured(&self, cmd: usize, fua: bool, written: u64, done: Done) -> Done {
        let start = self.begin();
        let counters = self.counters.clone();
        Box::new(move |res| {
            record(&counters, cmd, fua, start, &res);
            if res.is_ok() && written > 0 {
                counters
                    .shard()
                    .written_bytes
                    .fetch_add(written, Ordering::Relaxed);
            }
            done(res)
        })
    }

    /// A `try_*_then` of the inner backend, measured only if it ran: if it
    /// gives the completion back, the caller gets its own `done` back
    /// (unwrapped, uncounted), so the blocking retry is counted once.
    fn measured_try(
        &self,
        cmd: usize,
        fua: bool,
        written: u64,
        done: Done,
        op: impl FnOnce(&B, Done) -> Result<(), Done>,
    ) -> Result<(), Done> {
        let slot = Arc::new(Mutex::new(Some(done)));
        let inner_slot = slot.clone();
        let wrapped = self.measured(
            cmd,
            fua,
            written,
            Box::new(move |res| {
                let done = inner_slot.lock().ok().and_then(|mut d| d.take());
                if let Some(done) = done {
                    done(res)
                }
            }),
        );
        match op(&self.inner, wrapped) {
            Ok(()) => Ok(()),
            Err(_unused) => {
                self.counters
                    .shard()
                    .in_flight
                    .fetch_sub(1, Ordering::Relaxed);
                let done = slot.lock().ok().and_then(|mut d| d.take());
                Err(done.expect("a completion given back has not run"))
            }
        }
    }
}

/// Ends a request [`Instrumented::begin`] started: latency, errors, FUA.
fn record<T>(
    counters: &ExportCounters,
    cmd: usize,
    fua: bool,
    start: Instant,
    res: &BackendResult<T>,
) {
    let shard = counters.shard();
    let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    shard.done.fetch_add(1, Ordering::Relaxed);
    if let Some(c) = shard.commands.get(cmd) {
        c.requests.fetch_add(1, Ordering::Relaxed);
        c.latency_ns_sum.fetch_add(ns, Ordering::Relaxed);
        if let Some(b) = c.latency_buckets.get(bucket_of(ns)) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        if let Err(e) = res {
            let slot = ERRNOS
                .iter()
                .position(|(v, _)| *v == e.errno)
                .unwrap_or(ERRNOS.len() - 1);
            if let Some(n) = c.errors.get(slot) {
                n.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    if fua {
        shard.fua_requests.fetch_add(1, Ordering::Relaxed);
    }
}

impl<B: Backend> Backend for Instrumented<B> {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn preferred_block_bytes(&self) -> u32 {
        self.inner.preferred_block_bytes()
    }
    fn read_only(&self) -> bool {
        self.inner.read_only()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> BackendResult<()> {
        let n = buf.len() as u64;
        self.measure(READ, false, |b| b.read_at(buf, offset))?;
        self.counters
            .shard()
            .read_bytes
            .fetch_add(n, Ordering::Relaxed);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> BackendResult<()> {
        self.measure(WRITE, fua, |b| b.write_at(buf, offset, fua))?;
        self.counters
            .shard()
            .written_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }
    fn flush(&self) -> BackendResult<()> {
        self.measure(FLUSH, false, |b| b.flush())
    }
    fn write_at_then(&self, buf: &[u8], offset: u64, fua: bool, done: Done) {
        let done = self.measured(WRITE, fua, buf.len() as u64, done);
        self.inner.write_at_then(buf, offset, fua, done)
    }
    fn write_owned_then(&self, buf: OwnedPayload, offset: u64, fua: bool, done: Done) {
        let done = self.measured(WRITE, fua, (*buf).as_ref().len() as u64, done);
        self.inner.write_owned_then(buf, offset, fua, done)
    }
    fn flush_then(&self, done: Done) {
        let done = self.measured(FLUSH, false, 0, done);
        self.inner.flush_then(done)
    }
    fn try_write_at_then(
        &self,
        buf: &[u8],
        offset: u64,
        fua: bool,
        done: Done,
    ) -> Result<(), Done> {
        self.measured_try(WRITE, fua, buf.len() as u64, done, |b, d| {
            b.try_write_at_then(buf, offset, fua, d)
        })
    }
    fn try_flush_then(&self, done: Done) -> Result<(), Done> {
        self.measured_try(FLUSH, false, 0, done, |b, d| b.try_flush_then(d))
    }
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<BackendResult<()>> {
        let start = self.begin();
        match self.inner.try_read_at(buf, offset) {
            None => {
                self.counters
                    .shard()
                    .in_flight
                    .fetch_sub(1, Ordering::Relaxed);
                None
            }
            Some(res) => {
                record(&self.counters, READ, false, start, &res);
                if res.is_ok() {
                    self.counters
                        .shard()
                        .read_bytes
                        .fetch_add(buf.len() as u64, Ordering::Relaxed);
                }
                Some(res)
            }
        }
    }
    fn trim(&self, offset: u64, length: u64, fua: bool) -> BackendResult<()> {
        self.measure(TRIM, fua, |b| b.trim(offset, length, fua))
    }
    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        fua: bool,
        no_hole: bool,
    ) -> BackendResult<()> {
        self.measure(WRITE_ZEROES, fua, |b| {
            b.write_zeroes(offset, length, fua, no_hole)
        })
    }
    fn zeroes_are_fast(&self, offset: u64, length: u64) -> bool {
        self.inner.zeroes_are_fast(offset, length)
    }
    fn block_status(
        &self,
        offset: u64,
        length: u64,
        max_extents: usize,
    ) -> BackendResult<Vec<Extent>> {
        self.measure(BLOCK_STATUS, false, |b| {
            b.block_status(offset, length, max_extents)
        })
    }
    fn cache(&self, offset: u64, length: u64) -> BackendResult<()> {
        self.measure(CACHE, false, |b| b.cache(offset, length))
    }
    fn rejected(&self, kind: u16, errno: u32) {
        // A request like any other, answered at once with its error.
        let start = self.begin();
        let res: BackendResult<()> = Err(jbdev_nbd::BackendError::new(errno, ""));
        record(&self.counters, command_slot(kind), false, start, &res);
        self.inner.rejected(kind, errno);
    }
}

/// The NBD backend of export `name` on `volume` (canonical path `path`),
/// counted when `metrics` is on.
pub fn backend(
    metrics: Option<&Arc<Metrics>>,
    name: &str,
    path: &std::path::Path,
    volume: Arc<Volume>,
    read_only: bool,
) -> Arc<dyn Backend> {
    let plain = jbdev_nbd::VolumeBackend::new(volume.clone(), read_only);
    match metrics {
        Some(m) => Arc::new(m.instrument(name, &path.display().to_string(), &volume, plain)),
        None => Arc::new(plain),
    }
}

/// Starts answering scrapes when `--metrics` was given; prints the address
/// (tests and scripts read this line).
pub fn start(
    metrics: Option<&Arc<Metrics>>,
    listener: Option<(SocketAddr, TcpListener)>,
    server: &jbdev_nbd::Server,
) -> anyhow::Result<()> {
    use anyhow::Context;
    if let (Some(m), Some((addr, listener))) = (metrics, listener) {
        let at = m
            .serve(listener, server.shutdown_handle())
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
        eprintln!("jbdev serve: metrics on http://{at}/metrics");
    }
    Ok(())
}

/// Binds `--metrics ADDR:PORT`, before any volume is opened (a bad address
/// must fail before `--break-lock` breaks a lock, as for `--listen`).
pub fn bind(addr: Option<SocketAddr>) -> anyhow::Result<Option<(SocketAddr, TcpListener)>> {
    use anyhow::Context;
    addr.map(|addr| {
        TcpListener::bind(addr)
            .map(|l| (addr, l))
            .with_context(|| format!("cannot serve metrics on {addr}"))
    })
    .transpose()
}

/// Everything `--metrics` serves. Cheap to clone handles to; built before
/// the server starts, then served by [`Metrics::serve`].
#[derive(Default)]
pub struct Metrics {
    exports: Mutex<Vec<Arc<ExportCounters>>>,
    volumes: Mutex<Vec<(String, Weak<Volume>)>>,
    server: Mutex<Option<ShutdownHandle>>,
}

impl Metrics {
    /// Wraps `backend` (serving export `name`) so its requests are counted,
    /// and reports `volume` (labelled by `volume_path`) once even if several
    /// exports share it.
    pub fn instrument<B: Backend>(
        &self,
        name: &str,
        volume_path: &str,
        volume: &Arc<Volume>,
        backend: B,
    ) -> Instrumented<B> {
        let counters = Arc::new(ExportCounters::new(name));
        lock(&self.exports).push(counters.clone());
        let mut vols = lock(&self.volumes);
        if !vols.iter().any(|(p, _)| p == volume_path) {
            vols.push((volume_path.to_string(), Arc::downgrade(volume)));
        }
        Instrumented {
            inner: backend,
            counters,
        }
    }

    /// The Prometheus text (OpenMetrics) of every metric now.
    pub fn render(self: &Arc<Self>) -> Result<String, fmt::Error> {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Collector_(self.clone())));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    }

    /// Answers scrapes on `listener` (bound by [`bind`] before anything
    /// was opened) on a background thread for the life of the process.
    /// Returns the bound address (port 0 picks a free port).
    pub fn serve(
        self: &Arc<Self>,
        listener: TcpListener,
        server: ShutdownHandle,
    ) -> std::io::Result<SocketAddr> {
        let local = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        *lock(&self.server) = Some(server);
        let me = self.clone();
        std::thread::Builder::new()
            .name("jbdev-metrics".into())
            .spawn(move || rt.block_on(me.accept_loop(listener)))?;
        Ok(local)
    }

    /// Accepts scrapers for the life of the process; each connection is a
    /// task of this thread, at most [`MAX_HTTP_CONNECTIONS`] at once.
    async fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("metrics: cannot listen: {e}");
                return;
            }
        };
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HTTP_CONNECTIONS));
        loop {
            let s = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("metrics accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::debug!(
                    "metrics: {MAX_HTTP_CONNECTIONS} connections open; closing a new one"
                );
                continue;
            };
            let me = self.clone();
            tokio::spawn(async move {
                // One deadline from accept for the whole exchange.
                let answered = tokio::time::timeout(HTTP_TIMEOUT, me.answer(s)).await;
                match answered {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::debug!("metrics request: {e}"),
                    Err(_) => tracing::debug!(
                        "metrics request: not completed within {HTTP_TIMEOUT:?}; closed"
                    ),
                }
                drop(slot);
            });
        }
    }

    /// Answers one HTTP request on `s` and closes it.
    async fn answer(self: &Arc<Self>, mut s: TcpStream) -> std::io::Result<()> {
        let head = read_request_head(&mut s).await?;
        let (status, ctype, body) = match parse_request_line(&head) {
            Some(("GET", "/metrics")) => match self.render() {
                Ok(text) => ("200 OK", OPENMETRICS_TYPE, text),
                Err(_) => (
                    "500 Internal Server Error",
                    "text/plain",
                    "encoding failed\n".into(),
                ),
            },
            Some(("GET", "/")) => (
                "200 OK",
                "text/plain",
                "jbdev serve metrics: GET /metrics\n".into(),
            ),
            Some(("GET", _)) => ("404 Not Found", "text/plain", "try /metrics\n".into()),
            Some(_) => ("405 Method Not Allowed", "text/plain", "GET only\n".into()),
            None => ("400 Bad Request", "text/plain", "bad request\n".into()),
        };
        let mut reply = format!(
            "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        reply.push_str(&body);
        s.write_all(reply.as_bytes()).await?;
        s.shutdown().await
    }
}

/// What one HTTP exchange (request and reply) may take in all, from accept.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
/// Metrics connections answered at once (more are closed at accept).
const MAX_HTTP_CONNECTIONS: usize = 32;

/// Largest request head read; scrapers send a few hundred bytes.
const MAX_REQUEST_HEAD_BYTES: usize = 8 << 10;
const OPENMETRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Reads up to the blank line ending the request head (or the cap); the
/// caller bounds the time.
async fn read_request_head(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while head.len() < MAX_REQUEST_HEAD_BYTES && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(buf.get(..n).unwrap_or_default());
    }
    Ok(head)
}

/// `("GET", "/metrics")` from `GET /metrics HTTP/1.1`; the query string is
/// ignored.
fn parse_request_line(head: &[u8]) -> Option<(&str, &str)> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end();
    let mut parts = line.split(' ');
    let method = parts.next()?;
    let target = parts.next()?;
    let version = parts.next()?;
    if !version.starts_with("HTTP/") || parts.next().is_some() {
        return None;
    }
    Some((method, target.split('?').next().unwrap_or(target)))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere while holding it leaves plain data; keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The scrape-time collector over [`Metrics`].
#[derive(Clone)]
struct Collector_(Arc<Metrics>);

impl fmt::Debug for Collector_ {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("jbdev metrics collector")
    }
}

/// Writes one metric family: `name`, `help`, `kind` and one sample per
/// label set.
fn family<L: prometheus_client::encoding::EncodeLabelSet, V: Sample>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: &[(L, V)],
) -> fmt::Result {
    if samples.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in samples {
        let mut f = m.encode_family(labels)?;
        v.write(&mut f)?;
    }
    Ok(())
}

/// A counter (u64) or gauge (f64) value.
trait Sample {
    fn write(&self, m: &mut prometheus_client::encoding::MetricEncoder<'_>) -> fmt::Result;
}

/// A counter total.
struct Total(u64);
impl Sample for Total {
    fn write(&self, m: &mut prometheus_client::encoding::MetricEncoder<'_>) -> fmt::Result {
        m.encode_counter::<NoLabelSet, _, u64>(&self.0, None)
    }
}
/// A gauge value.
struct Level(f64);
impl Sample for Level {
    fn write(&self, m: &mut prometheus_client::encoding::MetricEncoder<'_>) -> fmt::Result {
        m.encode_gauge(&self.0)
    }
}
/// A latency histogram (per-bucket counts, sum in ns).
struct Latency(CommandTotals);
impl Sample for Latency {
    fn write(&self, m: &mut prometheus_client::encoding::MetricEncoder<'_>) -> fmt::Result {
        let t = &self.0;
        let buckets: Vec<(f64, u64)> = t
            .latency_buckets
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let bound = if i < LATENCY_BUCKETS {
                    bucket_bound_seconds(i)
                } else {
                    f64::INFINITY
                };
                (bound, *n)
            })
            .collect();
        m.encode_histogram::<NoLabelSet>(t.latency_ns_sum as f64 / 1e9, t.requests, &buckets, None)
    }
}

type Labels2 = [(&'static str, String); 2];
type Labels3 = [(&'static str, String); 3];

impl Collector for Collector_ {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let exports = lock(&self.0.exports).clone();
        self.encode_requests(&mut enc, &exports)?;
        self.encode_volumes(&mut enc)?;
        self.encode_process(&mut enc)
    }
}

impl Collector_ {
    fn encode_requests(
        &self,
        enc: &mut DescriptorEncoder,
        exports: &[Arc<ExportCounters>],
    ) -> fmt::Result {
        let mut requests: Vec<(Labels2, Total)> = Vec::new();
        let mut latency: Vec<(Labels2, Latency)> = Vec::new();
        let mut errors: Vec<(Labels3, Total)> = Vec::new();
        let mut read_bytes = Vec::new();
        let mut written_bytes = Vec::new();
        let mut durability = Vec::new();
        let mut in_flight = Vec::new();
        for e in exports {
            let export = || ("export", e.name.clone());
            for (cmd, name) in COMMANDS.iter().enumerate() {
                let t = e.command_totals(cmd);
                let labels = [export(), ("command", name.to_string())];
                requests.push((labels.clone(), Total(t.requests)));
                for ((_, errno), n) in ERRNOS.iter().zip(&t.errors) {
                    if *n > 0 {
                        errors.push((
                            [
                                export(),
                                ("command", name.to_string()),
                                ("errno", errno.to_string()),
                            ],
                            Total(*n),
                        ));
                    }
                }
                latency.push((labels, Latency(t)));
            }
            read_bytes.push(([export()], Total(e.total(|s| &s.read_bytes))));
            written_bytes.push(([export()], Total(e.total(|s| &s.written_bytes))));
            let flushes = e.command_totals(FLUSH).requests;
            durability.push(([export(), ("kind", "flush".into())], Total(flushes)));
            let fua = e.total(|s| &s.fua_requests);
            durability.push(([export(), ("kind", "fua".into())], Total(fua)));
            // Started minus finished; shards are summed one by one, so clamp
            // a transiently negative difference to 0.
            let started = e.total(|s| &s.in_flight);
            let done = e.total(|s| &s.done);
            in_flight.push(([export()], Level(started.saturating_sub(done) as f64)));
        }
        family(
            enc,
            "jbdev_nbd_requests",
            "NBD requests answered, by export and command.",
            MetricType::Counter,
            &requests,
        )?;
        family(
            enc,
            "jbdev_nbd_request_duration_seconds",
            "Time the volume took to serve an NBD request, by export and command.",
            MetricType::Histogram,
            &latency,
        )?;
        family(
            enc,
            "jbdev_nbd_errors",
            "NBD requests answered with an error, by export, command and errno.",
            MetricType::Counter,
            &errors,
        )?;
        family(
            enc,
            "jbdev_nbd_read_bytes",
            "Bytes read by NBD clients (sent out).",
            MetricType::Counter,
            &read_bytes,
        )?;
        family(
            enc,
            "jbdev_nbd_written_bytes",
            "Bytes written by NBD clients (received).",
            MetricType::Counter,
            &written_bytes,
        )?;
        family(enc, "jbdev_nbd_durability_requests", "Durability asked for by clients: FLUSH commands and FUA-flagged requests. Compare with jbdev_commits_total for the group-commit ratio.", MetricType::Counter, &durability)?;
        family(
            enc,
            "jbdev_nbd_requests_in_flight",
            "NBD requests inside the volume now.",
            MetricType::Gauge,
            &in_flight,
        )
    }

    fn encode_volumes(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let vols: Vec<(String, jbdev_volume::Stats)> = lock(&self.0.volumes)
            .iter()
            .filter_map(|(p, w)| w.upgrade().map(|v| (p.clone(), v.stats())))
            .collect();
        let vol = |p: &String| [("volume", p.clone())];
        let counter = |f: fn(&jbdev_volume::Stats) -> u64| -> Vec<_> {
            vols.iter().map(|(p, s)| (vol(p), Total(f(s)))).collect()
        };
        let gauge = |f: fn(&jbdev_volume::Stats) -> f64| -> Vec<_> {
            vols.iter().map(|(p, s)| (vol(p), Level(f(s)))).collect()
        };
        family(
            enc,
            "jbdev_commits",
            "Journal transactions committed since the volume was opened.",
            MetricType::Counter,
            &counter(|s| s.commits),
        )?;
        family(
            enc,
            "jbdev_commits_per_second_since_open",
            "Mean commit rate since open (use rate(jbdev_commits_total[1m]) for the current rate).",
            MetricType::Gauge,
            &gauge(|s| s.commits_per_sec),
        )?;
        family(
            enc,
            "jbdev_journaled_blocks",
            "Data blocks written to the journal since open.",
            MetricType::Counter,
            &counter(|s| s.blocks_journaled),
        )?;
        family(
            enc,
            "jbdev_transaction_blocks_mean",
            "Mean data blocks per committed transaction since open.",
            MetricType::Gauge,
            &gauge(|s| s.mean_transaction_blocks),
        )?;
        let quantiles: Vec<([(&str, String); 2], Level)> = vols
            .iter()
            .flat_map(|(p, s)| {
                [
                    ("0.5", s.commit_latency_us_p50),
                    ("0.99", s.commit_latency_us_p99),
                    ("1", s.commit_latency_us_max),
                ]
                .map(|(q, us)| {
                    (
                        [("volume", p.clone()), ("quantile", q.to_string())],
                        Level(us as f64 / 1e6),
                    )
                })
            })
            .collect();
        family(
            enc,
            "jbdev_commit_latency_seconds",
            "Commit latency quantiles since open (quantile 1 is the maximum).",
            MetricType::Gauge,
            &quantiles,
        )?;
        family(
            enc,
            "jbdev_commit_time_average_seconds",
            "Running average commit time that adaptive batching tunes its wait to.",
            MetricType::Gauge,
            &gauge(|s| s.avg_commit_us as f64 / 1e6),
        )?;
        family(
            enc,
            "jbdev_journal_fill_ratio",
            "Fraction of the journal holding committed transactions not yet checkpointed.",
            MetricType::Gauge,
            &gauge(|s| s.journal_fill_ratio),
        )?;
        family(
            enc,
            "jbdev_store_full",
            "1 while the backing store is full: the checkpoint cannot take journaled blocks home, and writes fail with ENOSPC once the journal is full (free space on the store; the checkpoint retries by itself).",
            MetricType::Gauge,
            &gauge(|s| f64::from(u8::from(s.store_full))),
        )?;
        family(
            enc,
            "jbdev_store_full_attempts",
            "Checkpoint attempts that found the backing store full.",
            MetricType::Counter,
            &counter(|s| s.store_full_attempts),
        )?;
        family(
            enc,
            "jbdev_aborted",
            "1 once the volume's journal aborted (a failed journal or home write or flush, the external journal file deleted or truncated, a bug): every write fails until the server is restarted. A full backing store is no abort (jbdev_store_full).",
            MetricType::Gauge,
            &gauge(|s| f64::from(u8::from(s.aborted))),
        )?;
        family(
            enc,
            "jbdev_salvage_running",
            "1 while the salvage after a journal failure is due or under way (writing committed blocks home from memory); jbdev_salvage_complete follows unless a home write or flush fails.",
            MetricType::Gauge,
            &gauge(|s| f64::from(u8::from(s.salvage_running))),
        )?;
        family(
            enc,
            "jbdev_salvaged_blocks",
            "Blocks of committed transactions written home from memory after the journal failed (its device, or its file deleted or truncated).",
            MetricType::Counter,
            &counter(|s| s.salvaged_blocks),
        )?;
        family(
            enc,
            "jbdev_salvage_complete",
            "1 once a salvage after a journal failure has written every committed block home and flushed it: every write committed before the failure (every write a flush or FUA acknowledged) is then durable on the home device.",
            MetricType::Gauge,
            &gauge(|s| f64::from(u8::from(s.salvage_complete))),
        )?;
        family(
            enc,
            "jbdev_salvage_uncommitted_blocks",
            "Blocks a salvage after a journal failure could not take home because no commit had made them durable (plain writes no flush or FUA covered yet): lost when the volume closes.",
            MetricType::Gauge,
            &gauge(|s| s.salvage_uncommitted_blocks as f64),
        )?;
        family(
            enc,
            "jbdev_checkpoint_lag_blocks",
            "Journal blocks waiting for checkpoint.",
            MetricType::Gauge,
            &gauge(|s| s.checkpoint_lag_blocks as f64),
        )?;
        family(
            enc,
            "jbdev_checkpoint_lag_transactions",
            "Committed transactions waiting for checkpoint.",
            MetricType::Gauge,
            &gauge(|s| s.checkpoint_lag_transactions as f64),
        )?;
        family(
            enc,
            "jbdev_checkpoints",
            "Checkpoints run since open.",
            MetricType::Counter,
            &counter(|s| s.checkpoints),
        )?;
        family(
            enc,
            "jbdev_checkpoint_blocks",
            "Blocks copied home by checkpoints since open.",
            MetricType::Counter,
            &counter(|s| s.checkpoint_blocks),
        )?;
        family(
            enc,
            "jbdev_checkpoint_blocks_skipped",
            "Block copies checkpoints did not write home because a newer committed copy superseded them.",
            MetricType::Counter,
            &counter(|s| s.checkpoint_blocks_skipped),
        )?;
        family(
            enc,
            "jbdev_direct_writes",
            "Writes that went straight home, bypassing the journal.",
            MetricType::Counter,
            &counter(|s| s.direct_writes),
        )?;
        family(
            enc,
            "jbdev_direct_writes_uncopied",
            "Direct writes that went home from the request's own buffer, without a copy.",
            MetricType::Counter,
            &counter(|s| s.direct_writes_uncopied),
        )?;
        family(
            enc,
            "jbdev_commits_pipelined",
            "Commits whose blocks were written while an older commit was still in flight.",
            MetricType::Counter,
            &counter(|s| s.commits_pipelined),
        )?;
        family(
            enc,
            "jbdev_device_flushes",
            "Cache flushes issued to the volume's devices (group commit shares them; FUA commit writes are not counted).",
            MetricType::Counter,
            &counter(|s| s.device_flushes),
        )?;
        family(
            enc,
            "jbdev_log_space_waits",
            "Times a writer found the journal full and waited for the checkpoint.",
            MetricType::Counter,
            &counter(|s| s.log_space_waits),
        )?;
        family(
            enc,
            "jbdev_revoke_order_waits",
            "Journaled writes that waited so that a large write's revoke of their block reaches the journal first, and large writes that waited for such a write.",
            MetricType::Counter,
            &counter(|s| s.revoke_order_waits),
        )?;
        family(
            enc,
            "jbdev_paced_writes",
            "Journaled writes that paused because the log was filling faster than the checkpoint empties it (--write-pacing).",
            MetricType::Counter,
            &counter(|s| s.paced_writes),
        )?;
        family(
            enc,
            "jbdev_pace_sleep_milliseconds",
            "Milliseconds paced writes slept in all (--write-pacing).",
            MetricType::Counter,
            &counter(|s| s.pace_sleep_ms),
        )?;
        family(
            enc,
            "jbdev_bulk_read_yields",
            "Reads of at least 256 KiB from home that held back (at most 2 ms) for a commit writers waited for.",
            MetricType::Counter,
            &counter(|s| s.bulk_read_yields),
        )?;
        family(
            enc,
            "jbdev_read_retries",
            "Reads from home done again because a write or the checkpoint changed their range meanwhile.",
            MetricType::Counter,
            &counter(|s| s.read_retries),
        )?;
        family(
            enc,
            "jbdev_locked_reads",
            "Reads that stopped retrying and read home while holding back writers of their range.",
            MetricType::Counter,
            &counter(|s| s.locked_reads),
        )?;
        family(
            enc,
            "jbdev_write_buffers_allocated",
            "Journaled-write buffers allocated from the heap (the rest are reused from the pool).",
            MetricType::Counter,
            &counter(|s| s.write_buffers_allocated),
        )?;
        family(
            enc,
            "jbdev_write_buffers_reused",
            "Journaled-write buffers reused from the buffer pool.",
            MetricType::Counter,
            &counter(|s| s.write_buffers_reused),
        )?;
        family(
            enc,
            "jbdev_write_buffer_pool_bytes",
            "Bytes of write buffers the pool keeps for reuse (emptied when the volume is idle).",
            MetricType::Gauge,
            &gauge(|s| s.write_buffer_pool_bytes as f64),
        )
    }

    fn encode_process(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let no_labels: [(&str, String); 0] = [];
        if let Some(h) = lock(&self.0.server).as_ref() {
            let n = h.connections_open() as f64;
            family(
                enc,
                "jbdev_nbd_connections_open",
                "NBD connections open now.",
                MetricType::Gauge,
                &[(no_labels.clone(), Level(n))],
            )?;
            family(
                enc,
                "jbdev_nbd_payload_buffer_bytes",
                "Bytes of NBD payload buffers (write data, read replies) in use now, over all connections.",
                MetricType::Gauge,
                &[(no_labels.clone(), Level(h.payload_buffer_bytes() as f64))],
            )?;
        }
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |key: &str| -> Option<f64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        };
        if let Some(t) = field("Threads:") {
            family(
                enc,
                "process_threads",
                "OS threads in this process.",
                MetricType::Gauge,
                &[(no_labels.clone(), Level(t))],
            )?;
        }
        if let Some(kib) = field("VmRSS:") {
            family(
                enc,
                "process_resident_memory_bytes",
                "Resident memory of this process.",
                MetricType::Gauge,
                &[(no_labels, Level(kib * 1024.0))],
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jbdev_nbd::MemBackend;

    #[test]
    fn buckets_cover_the_range() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(FIRST_BUCKET_NS), 0);
        assert_eq!(bucket_of(FIRST_BUCKET_NS + 1), 1);
        assert_eq!(bucket_of(u64::MAX), LATENCY_BUCKETS);
        assert!(bucket_bound_seconds(LATENCY_BUCKETS - 1) > 4.0);
    }

    #[test]
    fn request_lines() {
        assert_eq!(
            parse_request_line(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(parse_request_line(b"GET /metrics\r\n"), None);
        assert_eq!(parse_request_line(b"\xff\xfe"), None);
        assert_eq!(parse_request_line(b""), None);
    }

    #[test]
    fn addresses() {
        assert_eq!(
            parse_metrics_addr("9100").unwrap(),
            SocketAddr::from(([127, 0, 0, 1], 9100))
        );
        assert!(parse_metrics_addr("0.0.0.0:9100").is_ok());
        assert!(parse_metrics_addr("nonsense").is_err());
    }

    /// Metrics with one export "e": a counted 1 MiB memory backend.
    fn counted_mem() -> (Arc<Metrics>, Instrumented<MemBackend>) {
        let m = Arc::new(Metrics::default());
        let counters = Arc::new(ExportCounters::new("e"));
        lock(&m.exports).push(counters.clone());
        let b = Instrumented {
            inner: MemBackend::new(1 << 20, false),
            counters,
        };
        (m, b)
    }

    #[test]
    fn counts_requests_bytes_and_errors() {
        let (m, b) = counted_mem();
        b.write_at(&[1; 4096], 0, true).unwrap();
        let mut buf = [0u8; 512];
        b.read_at(&mut buf, 0).unwrap();
        assert!(b.read_at(&mut buf, 1 << 20).is_err());
        b.flush().unwrap();
        let text = m.render().unwrap();
        for want in [
            "jbdev_nbd_requests_total{export=\"e\",command=\"write\"} 1",
            "jbdev_nbd_requests_total{export=\"e\",command=\"read\"} 2",
            "jbdev_nbd_errors_total{export=\"e\",command=\"read\",errno=\"EINVAL\"} 1",
            "jbdev_nbd_written_bytes_total{export=\"e\"} 4096",
            "jbdev_nbd_read_bytes_total{export=\"e\"} 512",
            "jbdev_nbd_durability_requests_total{export=\"e\",kind=\"fua\"} 1",
            "jbdev_nbd_durability_requests_total{export=\"e\",kind=\"flush\"} 1",
            "jbdev_nbd_request_duration_seconds_count{export=\"e\",command=\"write\"} 1",
            "jbdev_nbd_requests_in_flight{export=\"e\"} 0",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    /// Writes and flushes through completions, including a try the inner
    /// backend refuses (the memory backend never runs one in place) and the
    /// blocking retry with the completion it gave back: each counted once.
    #[test]
    fn completion_paths_count_each_request_once() {
        let (m, b) = counted_mem();
        let ran = Arc::new(AtomicUsize::new(0));
        let done = |ran: &Arc<AtomicUsize>| -> Done {
            let ran = ran.clone();
            Box::new(move |res| {
                assert!(res.is_ok());
                ran.fetch_add(1, Ordering::Relaxed);
            })
        };
        let back = b
            .try_write_at_then(&[1; 4096], 0, true, done(&ran))
            .expect_err("the memory backend gives the completion back");
        b.write_at_then(&[1; 4096], 0, true, back);
        b.write_at_then(&[2; 4096], 4096, false, done(&ran));
        let back = b.try_flush_then(done(&ran)).expect_err("given back");
        b.flush_then(back);
        let mut buf = [0u8; 4096];
        assert!(b.try_read_at(&mut buf, 0).is_none());
        assert_eq!(ran.load(Ordering::Relaxed), 3);
        let text = m.render().unwrap();
        for want in [
            "jbdev_nbd_requests_total{export=\"e\",command=\"write\"} 2",
            "jbdev_nbd_requests_total{export=\"e\",command=\"flush\"} 1",
            "jbdev_nbd_written_bytes_total{export=\"e\"} 8192",
            "jbdev_nbd_durability_requests_total{export=\"e\",kind=\"fua\"} 1",
            "jbdev_nbd_requests_in_flight{export=\"e\"} 0",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }
}
