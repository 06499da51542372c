//! The transmission phase of one connection.
//!
//! Where things run: the connection's *reading task* (on the server's
//! network threads, shared by every connection — see [`crate::server`])
//! parses requests and reads write payloads; it hands every valid request
//! to the shared [`WorkerPool`] (a fixed number of threads for all
//! connections), so many requests of one connection run in the volume at
//! once and complete in any order. A worker (or, for writes and flushes,
//! whichever thread the backend completes them on: a volume commit thread)
//! only queues the reply on the connection's [`ReplySink`] and wakes the
//! connection's *writing task* (a [`Notify`]); that task drains the queue
//! with one vectored write per batch. A worker never writes to a socket,
//! so a client that stops reading its replies stalls only its own writing
//! task, which the send timeout ends; the workers and the network threads
//! keep serving everyone else. No connection has a thread of its own.
//!
//! Locks: the sink's queue mutex is a leaf — nothing else is taken while
//! it is held (the [`InflightGate`] is released after it is dropped, the
//! writer is woken after it is dropped), and it is never held across an
//! `.await` or a socket operation. The TLS session's mutex (in
//! [`crate::tls`]) is another leaf, taken only by the two tasks.
//!
//! Bounds, all checked before anything is allocated for a request:
//! * an [`InflightGate`] admits a request (valid or rejected) only while the
//!   connection has fewer than `max_inflight_requests` requests and
//!   `max_inflight_bytes` payload bytes outstanding; when it is full the
//!   reading task stops reading and TCP pushes back on the client;
//! * payload buffers come from the server-wide [`BufferPool`], whose byte
//!   budget holds across all connections; each connection has a share of
//!   it that the others cannot take, so its small requests are served
//!   whatever they hold; a write's buffer is filled as its bytes arrive,
//!   within `payload_timeout`;
//! * READ/WRITE up to [`MAX_PAYLOAD_BYTES`] are served; longer ones are
//!   answered `EOVERFLOW` and the connection stays usable (a write's payload
//!   is read and dropped up to [`MAX_DRAIN_BYTES`]; beyond that the
//!   connection is dropped).

use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{watch, Notify};

use crate::backend::{Backend, BackendError, Done, OwnedPayload};
use crate::buffers::{BufferPool, PooledBuf, Share};
use crate::codec::{self, ChunkStyle, Command, ExportContext, HeaderMode, Request};
use crate::handshake::Session;
use crate::pool::WorkerPool;
use crate::proto::*;
use crate::stream::{AsyncIn, AsyncOut, StreamControl};

/// Per-connection limits of the transmission phase.
#[derive(Clone, Debug)]
pub struct ConnLimits {
    pub max_inflight_requests: u32,
    pub max_inflight_bytes: u64,
    /// Time a write's whole payload may take to arrive once its header has;
    /// a header, once begun, gets the same.
    pub payload_timeout: Duration,
    /// A client must accept at least [`MIN_SEND_PROGRESS_BYTES`] of replies
    /// per this much time while replies are waiting, or it is dropped.
    pub send_timeout: Duration,
    /// A connection with no request in flight that sends nothing for this
    /// long is closed (None: never). Off by default, as in nbdkit and
    /// qemu-nbd: an idle qemu keeps its connection for hours. With it, a
    /// flood of silent connections cannot hold every slot for good.
    pub idle_timeout: Option<Duration>,
}

/// Reply bytes a client must read per `send_timeout` while replies wait:
/// far below any real link, far above a client that reads a trickle to
/// keep the server's memory and writer busy.
pub const MIN_SEND_PROGRESS_BYTES: u64 = 1 << 20;

/// What a connection shares with the rest of the server.
pub struct ConnResources<'a> {
    pub workers: &'a WorkerPool,
    pub buffers: &'a Arc<BufferPool>,
}

/// Reads of at least this many bytes ask the backend for holes first and
/// send zero ranges as `OFFSET_HOLE` chunks (structured replies only).
const HOLE_SCAN_MIN_BYTES: u32 = 64 << 10;
/// Most block-status descriptors in one reply (the client asks again for
/// the rest).
const MAX_STATUS_DESCRIPTORS: usize = 1024;

// ------------------------------------------------------------ inflight gate

/// Counting bound on requests and bytes in flight on one connection. The
/// reading task waits in [`InflightGate::acquire`] (without holding a
/// thread); replies release from the writing task, workers or completion
/// callbacks.
pub struct InflightGate {
    /// Requests and bytes in flight, and when the last request in flight
    /// finished (or the gate was made).
    state: Mutex<(u32, u64, tokio::time::Instant)>,
    notify: Notify,
    max_requests: u32,
    max_bytes: u64,
}

impl InflightGate {
    pub fn new(max_requests: u32, max_bytes: u64) -> Self {
        Self {
            state: Mutex::new((0, 0, tokio::time::Instant::now())),
            notify: Notify::new(),
            max_requests: max_requests.max(1),
            max_bytes,
        }
    }

    /// Waits until a request of `bytes` fits. A request larger than the byte
    /// bound is admitted alone, so it can always make progress.
    pub async fn acquire(&self, bytes: u64) {
        loop {
            // Registered before the check, so a release in between wakes us.
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.state.lock();
                if st.0 < self.max_requests && (st.0 == 0 || st.1 + bytes <= self.max_bytes) {
                    st.0 += 1;
                    st.1 += bytes;
                    return;
                }
            }
            notified.await;
        }
    }

    pub fn release(&self, requests: u32, bytes: u64) {
        let mut st = self.state.lock();
        st.0 -= requests;
        st.1 -= bytes;
        if st.0 == 0 {
            st.2 = tokio::time::Instant::now();
        }
        drop(st);
        self.notify.notify_waiters();
    }

    /// Returns once nothing has been in flight for `idle`, counted from
    /// the call or from when the last request finished, whichever is later
    /// (a request that takes longer keeps its connection, and its client
    /// gets the whole `idle` after its reply: session 30's verify pass had
    /// a connection closed a second after a 3 s request's reply); never
    /// with `idle` None.
    async fn idle_for(&self, idle: Option<Duration>) {
        let Some(idle) = idle else {
            return std::future::pending().await;
        };
        let start = tokio::time::Instant::now();
        loop {
            let wait = {
                let st = self.state.lock();
                if st.0 > 0 {
                    idle
                } else {
                    let quiet = start.max(st.2);
                    match idle.checked_sub(quiet.elapsed()) {
                        Some(left) if !left.is_zero() => left,
                        _ => return,
                    }
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Waits until nothing is in flight.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.state.lock().0 == 0 {
                return;
            }
            notified.await;
        }
    }
}

// --------------------------------------------------------------- reply sink

/// Bytes of one reply.
pub enum Part {
    Bytes(Vec<u8>),
    Buf(PooledBuf),
    /// Part of a pooled buffer other parts share (a READ's data pieces
    /// around its holes): the buffer stays counted by the pool until the
    /// last piece is sent.
    Piece(Arc<PooledBuf>, std::ops::Range<usize>),
}

impl Part {
    fn as_slice(&self) -> &[u8] {
        match self {
            Self::Bytes(b) => b,
            Self::Buf(b) => b,
            Self::Piece(b, r) => &b[r.clone()],
        }
    }
}

/// One reply: byte parts written back to back, and the gate cost to release
/// once it is on the wire.
pub struct OutMsg {
    parts: Vec<Part>,
    cost: u64,
}

struct SinkState {
    queue: Vec<OutMsg>,
    /// The reading task has finished: the writer exits once the queue is
    /// empty.
    closed: bool,
    broken: bool,
}

/// The queue of replies of one connection, filled from any thread and
/// drained by the connection's writing task.
pub struct ReplySink {
    state: Mutex<SinkState>,
    /// Wakes the writing task: a reply was queued, the sink was closed, or
    /// the TLS session has records to send.
    wake: Arc<Notify>,
    gate: Arc<InflightGate>,
    control: Arc<dyn StreamControl>,
    send_timeout: Duration,
    /// Turns true when the writing task gives up on the client (see
    /// [`ReplySink::is_broken`]); the reading task selects on it.
    broken_tx: watch::Sender<bool>,
}

/// Most messages written in one `writev` batch.
const MAX_BATCH_MSGS: usize = 256;

impl ReplySink {
    fn new(
        gate: Arc<InflightGate>,
        control: Arc<dyn StreamControl>,
        wake: Arc<Notify>,
        send_timeout: Duration,
    ) -> Self {
        Self {
            state: Mutex::new(SinkState {
                queue: Vec::new(),
                closed: false,
                broken: false,
            }),
            wake,
            gate,
            control,
            send_timeout,
            broken_tx: watch::Sender::new(false),
        }
    }

    /// The writing task gave up on this client (a reply write failed or
    /// timed out): nothing more is read, executed or answered on it.
    pub fn is_broken(&self) -> bool {
        *self.broken_tx.borrow()
    }

    fn release(&self, msgs: &[OutMsg]) {
        let bytes = msgs.iter().map(|m| m.cost).sum();
        if !msgs.is_empty() {
            self.gate.release(msgs.len() as u32, bytes);
        }
    }

    /// Queues `msg` for the writing task. Never blocks beyond the queue's
    /// mutex: safe from a volume commit thread.
    pub fn send(&self, msg: OutMsg) {
        let mut st = self.state.lock();
        if st.broken {
            drop(st);
            self.release(std::slice::from_ref(&msg));
            return;
        }
        st.queue.push(msg);
        let wake = st.queue.len() == 1;
        drop(st);
        if wake {
            // Stores a permit if the writer is busy: it re-checks the queue
            // before it waits again.
            self.wake.notify_one();
        }
    }

    fn close(&self) {
        self.state.lock().closed = true;
        self.wake.notify_one();
    }

    /// The writing task: writes queued replies until the sink is closed
    /// and empty, or a write fails (the client is gone or did not read for
    /// the send timeout), which ends the connection.
    async fn run_writer(&self, mut writer: AsyncOut) {
        let mut progress = SendProgress::new(self.send_timeout);
        loop {
            let batch: Option<Vec<OutMsg>> = {
                let mut st = self.state.lock();
                if st.queue.is_empty() {
                    if st.closed {
                        break;
                    }
                    None
                } else {
                    let n = st.queue.len().min(MAX_BATCH_MSGS);
                    Some(st.queue.drain(..n).collect())
                }
            };
            let res = match batch {
                None => {
                    // Nothing to answer; a TLS session may still have records
                    // of its own (handshake, key update) to send.
                    let res = self.timed(writer.flush()).await;
                    if res.is_ok() {
                        self.wake.notified().await;
                    }
                    res
                }
                Some(batch) => {
                    let res = write_batch(&mut writer, &batch, &mut progress, self).await;
                    self.release(&batch);
                    drop(batch); // buffers back to the pool before the next wait
                    res
                }
            };
            if let Err(e) = res {
                tracing::info!("dropping client: reply write failed: {e}");
                let dropped: Vec<OutMsg> = {
                    let mut st = self.state.lock();
                    st.broken = true;
                    st.queue.drain(..).collect()
                };
                self.release(&dropped);
                // The reading task stops at once (it selects on this and
                // checks it per request), and requests still queued for a
                // worker are skipped: a dropped client's requests are not
                // carried out. (Shutting the socket's read side is not
                // enough: Linux still takes, and the reader would still
                // parse, what the client sends afterwards.)
                self.broken_tx.send_replace(true);
                self.control.shutdown();
                return;
            }
        }
        // Everything answered: end the session cleanly (TLS close_notify).
        let _ = self.timed(writer.shutdown()).await;
    }

    /// Bounds one socket operation by the send timeout.
    async fn timed(&self, op: impl std::future::Future<Output = io::Result<()>>) -> io::Result<()> {
        tokio::time::timeout(self.send_timeout, op)
            .await
            .unwrap_or_else(|_| Err(send_timed_out()))
    }
}

fn send_timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "client took no reply bytes for the send timeout",
    )
}

/// Tracks how fast a client takes its replies. The socket's send timeout
/// catches a client that reads nothing; this catches one that reads a
/// trickle (each write then makes a little progress and never times out).
struct SendProgress {
    window: Duration,
    window_start: Instant,
    window_bytes: u64,
}

impl SendProgress {
    fn new(window: Duration) -> Self {
        Self {
            window,
            window_start: Instant::now(),
            window_bytes: 0,
        }
    }

    /// A new batch: replies were idle until now, so the clock starts here.
    fn start(&mut self) {
        self.window_start = Instant::now();
        self.window_bytes = 0;
    }

    fn wrote(&mut self, n: usize) -> io::Result<()> {
        self.window_bytes += n as u64;
        if self.window_start.elapsed() < self.window {
            return Ok(());
        }
        if self.window_bytes < MIN_SEND_PROGRESS_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "client reads its replies too slowly",
            ));
        }
        self.start();
        Ok(())
    }
}

async fn write_batch(
    w: &mut AsyncOut,
    batch: &[OutMsg],
    progress: &mut SendProgress,
    sink: &ReplySink,
) -> io::Result<()> {
    progress.start();
    let mut slices: Vec<IoSlice<'_>> = batch
        .iter()
        .flat_map(|m| m.parts.iter())
        .map(Part::as_slice)
        .filter(|p| !p.is_empty())
        .map(IoSlice::new)
        .collect();
    let mut rest: &mut [IoSlice<'_>] = &mut slices;
    while !rest.is_empty() {
        // Linux takes at most 1024 iovecs per call.
        let take = rest.len().min(1024);
        // One write may wait at most the send timeout while the client
        // takes nothing; `progress` catches one that reads a trickle. A
        // full socket becomes writable again only once about half of its
        // send queue has gone, which on loopback (several MiB, autotuned)
        // can take a steady reader longer than the timeout: the queue
        // falling by the floor's worth says it reads (session 33's timing
        // pass: clients taking 1.2-1.6 MiB per 3 s timeout were dropped as
        // taking nothing). Less is not enough: a client's kernel takes
        // about 124 KiB into its receive buffer without the client reading
        // (counted as progress, it bought a client that never reads a
        // second timeout: the session's second verify pass).
        let res = {
            let mut write = std::pin::pin!(w.write_vectored(&rest[..take]));
            // Most writes complete at once: the send queue is read (one
            // ioctl) only for a write that has to wait.
            let first = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(std::future::Future::poll(write.as_mut(), cx))
            })
            .await;
            match first {
                std::task::Poll::Ready(r) => r,
                std::task::Poll::Pending => {
                    let queued = sink.control.unsent_bytes();
                    match tokio::time::timeout(sink.send_timeout, write).await {
                        Ok(r) => r,
                        Err(_) => {
                            let taken = match (queued, sink.control.unsent_bytes()) {
                                (Some(before), Some(now)) => Some(before.saturating_sub(now)),
                                _ => None,
                            };
                            match taken {
                                // This timeout's window is met; the next
                                // starts now (counting the bytes into the
                                // window too would let a client through at
                                // half the floor).
                                Some(t) if t >= MIN_SEND_PROGRESS_BYTES => {
                                    progress.start();
                                    continue;
                                }
                                Some(t) if t > 0 => {
                                    return Err(io::Error::new(
                                        io::ErrorKind::TimedOut,
                                        format!(
                                            "client took {t} bytes of replies in the send \
                                             timeout, less than {MIN_SEND_PROGRESS_BYTES}"
                                        ),
                                    ))
                                }
                                _ => return Err(send_timed_out()),
                            }
                        }
                    }
                }
            }
        };
        let n = match res {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, n);
        progress.wrote(n)?;
    }
    sink.timed(w.flush()).await
}

// --------------------------------------------------------------- execution

/// Everything a worker needs to run a request of this connection.
struct ConnShared {
    backend: Arc<dyn Backend>,
    /// The export's lane for worker jobs.
    lane: Arc<crate::pool::Lane>,
    sink: ReplySink,
    buffers: Arc<BufferPool>,
    /// This connection's guaranteed part of the buffer budget: what other
    /// connections hold never stalls its small requests.
    share: Arc<Share>,
    structured: bool,
    /// Extended headers: every reply is an extended chunk.
    extended: bool,
}

impl ConnShared {
    fn style(&self, request_offset: u64) -> ChunkStyle {
        ChunkStyle {
            extended: self.extended,
            request_offset,
        }
    }
}

/// Releases the gate and drops the connection if a job is lost without a
/// reply (a panicking backend): the client would otherwise wait forever.
struct PendingReply {
    conn: Arc<ConnShared>,
    cost: u64,
    answered: bool,
}

impl PendingReply {
    fn answer(mut self, parts: Vec<Part>) {
        self.answered = true;
        self.conn.sink.send(OutMsg {
            parts,
            cost: self.cost,
        });
    }
}

impl Drop for PendingReply {
    fn drop(&mut self) {
        if !self.answered {
            self.conn.sink.gate.release(1, self.cost);
            self.conn.sink.control.shutdown();
        }
    }
}

fn error_reply(conn: &ConnShared, req: &Request, errno: u32, message: &str) -> Vec<Part> {
    vec![Part::Bytes(if conn.structured {
        codec::encode_error_chunk(conn.style(req.offset), req.cookie, errno, message)
    } else {
        codec::encode_simple_reply(errno, req.cookie).to_vec()
    })]
}

/// The message of a structured error reply to a request refused before it
/// ran. The 64 MiB maximum is sent in `NBD_INFO_BLOCK_SIZE` only to clients
/// that ask for it (ARCHITECTURE 29), so the EOVERFLOW text names the
/// maximum instead of calling it advertised. `ENOSPC` is what `validate`
/// answers a WRITE or WRITE_ZEROES past the end of the export.
fn reject_message(errno: u32) -> &'static str {
    const _: () = assert!(
        MAX_PAYLOAD_BYTES == 64 << 20,
        "reword the EOVERFLOW message"
    );
    match errno {
        EOVERFLOW => "request longer than the server's maximum payload of 64 MiB",
        ENOSPC => "request reaches past the end of the export",
        ESHUTDOWN => "the server is shutting down",
        EPERM => "the export is read-only",
        _ => "invalid request",
    }
}

/// Success without data: a simple reply, or (extended headers, where simple
/// replies are not allowed) a final NONE chunk.
fn ok_reply(conn: &ConnShared, req: &Request) -> Vec<Part> {
    vec![Part::Bytes(if conn.extended {
        codec::encode_done_chunk(conn.style(req.offset), req.cookie)
    } else {
        codec::encode_simple_reply(0, req.cookie).to_vec()
    })]
}

/// The reply to a write or flush, sent when the backend reports its outcome.
fn answer_when_done(pending: PendingReply, req: Request) -> Done {
    Box::new(move |res| {
        let parts = match res {
            Ok(()) => ok_reply(&pending.conn, &req),
            Err(e) => {
                tracing::debug!("request {:#x} failed: {e}", req.cookie);
                error_reply(&pending.conn, &req, e.errno, &e.message)
            }
        };
        pending.answer(parts);
    })
}

/// Runs a request that has no payload and completes in place (writes and
/// flushes go through [`answer_when_done`]).
fn execute(conn: &ConnShared, req: &Request, cmd: Command) -> Vec<Part> {
    let b = &*conn.backend;
    let cookie = req.cookie;
    let ok_reply = |_cookie: u64| ok_reply(conn, req);
    let res: Result<Vec<Part>, BackendError> = match cmd {
        Command::Read { offset, length, df } => read_reply(conn, cookie, offset, length, df),
        Command::Write { .. } | Command::Flush => {
            unreachable!("writes and flushes complete through answer_when_done")
        }
        Command::Trim {
            offset,
            length,
            fua,
        } => {
            if length == 0 {
                Ok(ok_reply(cookie))
            } else {
                b.trim(offset, length, fua).map(|_| ok_reply(cookie))
            }
        }
        Command::Cache { offset, length } => b.cache(offset, length).map(|_| ok_reply(cookie)),
        Command::WriteZeroes {
            offset,
            length,
            fua,
            no_hole,
            fast,
        } => {
            // FAST_ZERO: succeed only where zeroing is a hole punch, a
            // discard or a metadata change; ENOTSUP where it would write
            // zero blocks (the client then writes its own data instead).
            // With NO_HOLE the range must stay allocated, which may mean
            // writing zero blocks (no ZERO_RANGE on tmpfs, BLKZEROOUT
            // without offload): never promised fast.
            // Nothing to zero is fast whatever the flags (a zero-length
            // request was refused with FAST_ZERO and served without it:
            // session 32's differential pass).
            if length == 0 {
                Ok(ok_reply(cookie))
            } else if fast && (no_hole || !b.zeroes_are_fast(offset, length)) {
                b.rejected(req.kind, ENOTSUP);
                Err(BackendError::new(
                    ENOTSUP,
                    "zeroing this range would write data",
                ))
            } else {
                b.write_zeroes(offset, length, fua, no_hole)
                    .map(|_| ok_reply(cookie))
            }
        }
        Command::BlockStatus {
            offset,
            length,
            req_one,
        } => block_status_reply(b, conn.style(req.offset), cookie, offset, length, req_one)
            .map(|chunk| vec![Part::Bytes(chunk)]),
        Command::Disconnect => Ok(Vec::new()), // handled by the reader
    };
    res.unwrap_or_else(|e| {
        tracing::debug!("request {cookie:#x} failed: {e}");
        error_reply(conn, req, e.errno, &e.message)
    })
}

/// A pooled buffer holding `length` bytes read from the backend at `offset`.
fn read_data(conn: &ConnShared, offset: u64, length: u32) -> Result<PooledBuf, BackendError> {
    let mut data = conn.buffers.take_for(Some(&conn.share), length as usize);
    data.vec().resize(length as usize, 0);
    conn.backend.read_at(&mut data, offset)?;
    Ok(data)
}

fn read_reply(
    conn: &ConnShared,
    cookie: u64,
    offset: u64,
    length: u32,
    df: bool,
) -> Result<Vec<Part>, BackendError> {
    if conn.structured && length == 0 {
        return Ok(vec![Part::Bytes(codec::encode_done_chunk(
            conn.style(offset),
            cookie,
        ))]);
    }
    // IMPORTANT: one backend read for the whole request, then holes found
    // in the data itself (see `data_reply`).
    let data = read_data(conn, offset, length)?;
    Ok(data_reply(conn, cookie, offset, df, data))
}

/// The reply to a READ whose bytes are `data` (all of them, read at once).
fn data_reply(conn: &ConnShared, cookie: u64, offset: u64, df: bool, data: PooledBuf) -> Vec<Part> {
    let style = conn.style(offset);
    let length = data.len() as u32;
    if !conn.structured {
        return vec![
            Part::Bytes(codec::encode_simple_reply(0, cookie).to_vec()),
            Part::Buf(data),
        ];
    }
    if length == 0 {
        return vec![Part::Bytes(codec::encode_done_chunk(style, cookie))];
    }
    // Holes are found in the data itself. A separate block-status call
    // before the read (or several reads for one request) could see a
    // different moment: data acknowledged in between would go out as
    // zeroes, or a journaled write would show half old, half new.
    let pieces = if df || length < HOLE_SCAN_MIN_BYTES {
        vec![(0usize, length as usize, false)]
    } else {
        zero_runs(&data, HOLE_GRANULE_BYTES, HOLE_MIN_RUN_BYTES)
    };
    if pieces.len() == 1 && !pieces[0].2 {
        return vec![
            Part::Bytes(codec::encode_data_chunk_head(
                style, cookie, true, offset, length,
            )),
            Part::Buf(data),
        ];
    }
    // IMPORTANT: the data pieces are sent from the pooled buffer itself,
    // not copied: a copy left the pool's budget while it waited for a
    // client that does not read (16 such clients took 1 GiB, session 23).
    let data = Arc::new(data);
    let mut parts = Vec::with_capacity(pieces.len() * 2);
    let last = pieces.len() - 1;
    for (i, (from, to, zero)) in pieces.into_iter().enumerate() {
        let (off, n) = (offset + from as u64, (to - from) as u32);
        if zero {
            parts.push(Part::Bytes(codec::encode_hole_chunk(
                style,
                cookie,
                i == last,
                off,
                n,
            )));
        } else {
            parts.push(Part::Bytes(codec::encode_data_chunk_head(
                style,
                cookie,
                i == last,
                off,
                n,
            )));
            parts.push(Part::Piece(data.clone(), from..to));
        }
    }
    parts
}

/// Largest READ or WRITE a network thread runs itself (when it needs no
/// I/O): a bigger one is a long copy, which would hold up every other
/// connection on that thread; it goes to a worker.
const INLINE_MAX_BYTES: u32 = 1 << 20;

/// A WRITE payload longer than this is read straight from the socket once
/// the read buffer is drained (shorter ones come through the buffer, which
/// picks up the next request's header in the same read).
const DIRECT_PAYLOAD_MIN_BYTES: u64 = 16 << 10;

/// Granule of the zero scan of read data.
const HOLE_GRANULE_BYTES: usize = 4096;
/// Shortest zero run sent as a hole chunk (shorter runs are not worth a chunk).
const HOLE_MIN_RUN_BYTES: usize = 64 * 1024;

/// Splits `data` into `(from, to, is_zero)` pieces covering it in order:
/// runs of all-zero granules at least `min_run` long are zero pieces.
fn zero_runs(data: &[u8], granule: usize, min_run: usize) -> Vec<(usize, usize, bool)> {
    let mut out: Vec<(usize, usize, bool)> = Vec::new();
    let mut pos = 0;
    let mut data_start = 0;
    while pos < data.len() {
        let is_zero = |at: usize| {
            let end = (at + granule).min(data.len());
            jbdev_device::is_zero(&data[at..end])
        };
        if !is_zero(pos) {
            pos += granule;
            continue;
        }
        let run_start = pos;
        while pos < data.len() && is_zero(pos) {
            pos += granule;
        }
        let run_end = pos.min(data.len());
        if run_end - run_start >= min_run {
            if run_start > data_start {
                out.push((data_start, run_start, false));
            }
            out.push((run_start, run_end, true));
            data_start = run_end;
        }
    }
    if data_start < data.len() || out.is_empty() {
        out.push((data_start, data.len(), false));
    }
    out
}

fn block_status_reply(
    b: &dyn Backend,
    style: ChunkStyle,
    cookie: u64,
    offset: u64,
    length: u64,
    req_one: bool,
) -> Result<Vec<u8>, BackendError> {
    // The work of a request follows what its reply can hold.
    let wanted = if req_one { 1 } else { MAX_STATUS_DESCRIPTORS };
    let extents = b.block_status(offset, length, wanted)?;
    // Compact descriptors hold 32-bit lengths: split longer extents, keeping
    // the pieces 4 KiB-aligned. Extended ones hold 64 bits.
    let max_desc = if style.extended {
        u64::MAX
    } else {
        u64::from(u32::MAX) & !4095
    };
    let mut descs: Vec<(u64, u32)> = Vec::new();
    let mut pos = offset;
    for e in &extents {
        if e.offset != pos || e.length == 0 {
            break;
        }
        let flags = if e.zero { STATE_HOLE | STATE_ZERO } else { 0 };
        let mut left = e.length;
        while left > 0 && descs.len() < MAX_STATUS_DESCRIPTORS {
            let n = left.min(max_desc);
            match descs.last_mut() {
                Some((l, f)) if *f == flags && l.checked_add(n).is_some_and(|t| t <= max_desc) => {
                    *l += n
                }
                _ => descs.push((n, flags)),
            }
            left -= n;
        }
        pos += e.length;
        if descs.len() >= MAX_STATUS_DESCRIPTORS {
            break;
        }
    }
    if descs.is_empty() {
        // The backend described nothing usable: "unknown" is always honest.
        descs.push((length.min(max_desc), 0));
    }
    if req_one {
        descs.truncate(1);
        descs[0].0 = descs[0].0.min(length);
    }
    Ok(codec::encode_block_status_chunk(
        style,
        cookie,
        CONTEXT_ID_BASE_ALLOCATION,
        &descs,
    ))
}

// ------------------------------------------------------------------ reader

/// Why the reader stopped.
type Ended = String;

/// The reader's end when the writing task dropped the client.
const DROPPED: &str = "the client was dropped (its replies could not be sent)";

/// The connection's buffered input: bytes read ahead during the handshake
/// belong to the first requests.
pub(crate) type Input = BufReader<AsyncIn>;

/// The reading task's side of one connection.
struct Reader<'a> {
    input: Input,
    conn: Arc<ConnShared>,
    gate: Arc<InflightGate>,
    ctx: ExportContext,
    session: &'a Session,
    res: &'a ConnResources<'a>,
    limits: &'a ConnLimits,
    /// Becomes true when the server shuts down.
    stop: watch::Receiver<bool>,
    warned_oversize: bool,
    /// The last request was a WRITE whose payload came straight from the
    /// socket: the next header is read on its own too (see `read_header`).
    bulk_writes: bool,
    /// The server shut down while this connection was in transmission:
    /// requests read since are answered `NBD_ESHUTDOWN`, and the reader
    /// ends at the client's first pause, or [`SHUTDOWN_SOFT_LIMIT`] after
    /// the shutdown.
    stopped_by_shutdown: bool,
    /// When this connection saw the shutdown (see [`SHUTDOWN_SOFT_LIMIT`]).
    stopped_at: Option<tokio::time::Instant>,
}

/// Runs the transmission phase until the client disconnects, the stream
/// fails, or the server shuts the stream down. Returns after every request
/// that was read has been answered (or the connection broke). `wake` is the
/// connection's writer wake-up, shared with its TLS session if any.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve(
    input: Input,
    writer: AsyncOut,
    wake: Arc<Notify>,
    control: Arc<dyn StreamControl>,
    session: Session,
    res: &ConnResources<'_>,
    limits: &ConnLimits,
    stop: watch::Receiver<bool>,
) {
    let gate = Arc::new(InflightGate::new(
        limits.max_inflight_requests,
        limits.max_inflight_bytes,
    ));
    let backend = session.export.backend.clone();
    let conn = Arc::new(ConnShared {
        backend: backend.clone(),
        lane: session.export.lane.clone(),
        sink: ReplySink::new(gate.clone(), control.clone(), wake, limits.send_timeout),
        buffers: res.buffers.clone(),
        share: Arc::new(Share::default()),
        structured: session.structured_replies,
        extended: session.header_mode == HeaderMode::Extended,
    });
    let ctx = ExportContext {
        size_bytes: backend.size_bytes(),
        read_only: backend.read_only(),
        structured_replies: session.structured_replies,
        base_allocation: session.base_allocation,
        extended_headers: session.header_mode == HeaderMode::Extended,
    };
    let conn2 = conn.clone();
    let writer_task = tokio::spawn(async move { conn2.sink.run_writer(writer).await });
    let mut reader = Reader {
        input,
        conn: conn.clone(),
        gate: gate.clone(),
        ctx,
        session: &session,
        res,
        limits,
        stop,
        warned_oversize: false,
        bulk_writes: false,
        stopped_by_shutdown: false,
        stopped_at: None,
    };
    let mut broken = conn.sink.broken_tx.subscribe();
    // `biased`: once the writer has given up, the reader is dropped at its
    // next wait (a socket read, the in-flight gate, the buffer pool), even
    // if more requests are buffered (`run` checks per request as well).
    let reason = tokio::select! {
        biased;
        _ = broken.wait_for(|b| *b) => DROPPED.into(),
        r = reader.run() => r,
    };
    if reason.starts_with("bad request") {
        // A protocol violation: the client is dropped, say so.
        crate::trouble::client_trouble(format_args!("dropping client: {reason}"));
    } else if reason.ends_with("(--idle-timeout)") {
        tracing::info!("closing a connection: {reason}");
    } else {
        tracing::debug!("connection ending: {reason}");
    }
    let linger = reader.stopped_by_shutdown;
    let mut input = reader.input;
    // NBD_CMD_DISC and shutdown: answer everything already accepted first.
    gate.wait_idle().await;
    conn.sink.close();
    // Every reply written, then our end of stream (TLS: close_notify).
    let _ = writer_task.await;
    if linger {
        linger_before_close(&mut input).await;
    }
    control.shutdown();
}

/// After a server shutdown ended a connection whose client may still be
/// sending: reads and discards what arrives until the client closes its
/// side, pauses for [`SHUTDOWN_IDLE`], or [`SHUTDOWN_LINGER`] has passed.
/// Closing a socket with unread bytes makes the kernel reset the
/// connection, and the reset discards the replies the client has not read
/// yet (measured before this: 18 of 74 executed FUA writes answered).
async fn linger_before_close(input: &mut Input) {
    let deadline = tokio::time::Instant::now() + SHUTDOWN_LINGER;
    let mut sink = [0u8; 16 << 10];
    loop {
        let wait = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .min(SHUTDOWN_IDLE);
        match tokio::time::timeout(wait, input.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => continue,
            // End of stream, an error, a pause or the deadline.
            _ => return,
        }
    }
}

/// At server shutdown, a client that sends nothing for this long is done:
/// its connection ends (see [`Reader::read_header`] and
/// [`linger_before_close`]).
const SHUTDOWN_IDLE: Duration = Duration::from_millis(200);
/// Longest a shut-down connection reads what its client still sends after
/// the last reply (see [`linger_before_close`]).
const SHUTDOWN_LINGER: Duration = Duration::from_secs(2);
/// Longest a connection answers new requests with `ESHUTDOWN` (the spec's
/// soft disconnect) after the shutdown began, for a client that never
/// pauses: then it ends like one that paused. Without it a busy qemu kept
/// every connection open for the whole grace time (30 s), each of its
/// requests refused meanwhile, and a restart waited that long (session
/// 25's interop pass; nbdkit exits within 0.2 s).
const SHUTDOWN_SOFT_LIMIT: Duration = Duration::from_secs(1);

impl Reader<'_> {
    async fn run(&mut self) -> Ended {
        let header_bytes = self.session.header_mode.request_header_bytes();
        let mut hb = [0u8; 32];
        loop {
            // The reply side gave up on this client: requests it sent (or
            // the read buffer holds) are neither parsed nor carried out.
            if self.conn.sink.is_broken() {
                return DROPPED.into();
            }
            let hb = &mut hb[..header_bytes];
            match self.read_header(hb).await {
                Ok(true) => {}
                Ok(false) => return "client closed the connection".into(),
                Err(e) => return format!("read failed: {e}"),
            }
            let req = match Request::decode(self.session.header_mode, hb) {
                Ok(r) => r,
                Err(e) => return format!("bad request: {e}"),
            };
            let res = match codec::validate(&req, &self.ctx) {
                Ok(Command::Disconnect) => return "client sent DISC".into(),
                // The spec's soft disconnect: what arrives after the
                // server began shutting down is answered, not carried out.
                Ok(_) if self.stopped_by_shutdown => self.reject(&req, ESHUTDOWN).await,
                Ok(cmd) => self.submit(&req, cmd).await,
                Err(errno) => self.reject(&req, errno).await,
            };
            if let Err(reason) = res {
                return reason;
            }
        }
    }

    /// Reads a request header. Waiting for its first byte is unbounded
    /// (clients may idle) until shutdown, then at most [`SHUTDOWN_IDLE`];
    /// once it has begun, the rest must come within the payload timeout.
    /// `Ok(false)`: clean end of stream, or a pause after shutdown.
    async fn read_header(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        // In a stream of large writes, a header read through the buffer
        // would fill it with the head of the payload behind it, which then
        // costs a copy of up to the buffer's size per request; reading just
        // the header from the socket costs a short read instead.
        let direct = self.bulk_writes && self.input.buffer().is_empty();
        let Self {
            input,
            stop,
            limits,
            gate,
            stopped_by_shutdown,
            stopped_at,
            ..
        } = self;
        let from: &mut (dyn AsyncRead + Send + Unpin) =
            if direct { input.get_mut() } else { input };
        // (`has_changed` is one atomic load; the flag only ever turns true.)
        if !*stopped_by_shutdown && stop.has_changed().unwrap_or(true) && *stop.borrow() {
            *stopped_by_shutdown = true;
        }
        let before_stop = if *stopped_by_shutdown {
            None
        } else {
            tokio::select! {
                biased;
                r = from.read(buf) => Some(r?),
                // (A read dropped before it completed consumed nothing.)
                _ = stop.wait_for(|s| *s) => None,
                () = gate.idle_for(limits.idle_timeout) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "idle for {} s (--idle-timeout)",
                            limits.idle_timeout.unwrap_or_default().as_secs()
                        ),
                    ));
                }
            }
        };
        let got = match before_stop {
            Some(n) => n,
            None => {
                *stopped_by_shutdown = true;
                let since = *stopped_at.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() >= SHUTDOWN_SOFT_LIMIT {
                    return Ok(false);
                }
                match tokio::time::timeout(SHUTDOWN_IDLE, from.read(buf)).await {
                    Ok(r) => r?,
                    Err(_) => return Ok(false),
                }
            }
        };
        if got == 0 {
            return Ok(false);
        }
        if got < buf.len() {
            let rest = &mut buf[got..];
            let idle = limits.idle_timeout;
            let finish = async move {
                let mut at = 0;
                while at < rest.len() {
                    let n = stall_guard(idle, from.read(&mut rest[at..])).await?;
                    if n == 0 {
                        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
                    }
                    at += n;
                }
                Ok(())
            };
            match tokio::time::timeout(limits.payload_timeout, finish).await {
                Ok(r) => {
                    r?;
                }
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "request header not completed in time",
                    ))
                }
            }
        }
        Ok(true)
    }

    /// Reads `len` payload bytes into `out` as they arrive (or drops them if
    /// `out` is `None`), within the payload timeout.
    async fn read_payload(&mut self, len: u64, out: Option<&mut Vec<u8>>) -> io::Result<()> {
        let input = &mut self.input;
        let idle = self.limits.idle_timeout;
        let read = async move {
            let mut left = len;
            match out {
                Some(v) => {
                    // Straight into the buffer's reserved capacity (no
                    // zeroing, no growth: `left` never exceeds it).
                    while left > 0 {
                        // Once the read buffer is drained, the rest of a
                        // large payload comes straight from the socket (the
                        // buffered reader would copy what is left below its
                        // capacity through its own buffer first).
                        let n = if input.buffer().is_empty() && left >= DIRECT_PAYLOAD_MIN_BYTES {
                            stall_guard(idle, input.get_mut().take(left).read_buf(v)).await?
                        } else {
                            stall_guard(idle, (&mut *input).take(left).read_buf(v)).await?
                        };
                        if n == 0 {
                            return Err(io::ErrorKind::UnexpectedEof.into());
                        }
                        left -= n as u64;
                    }
                }
                None => {
                    while left > 0 {
                        let avail = stall_guard(idle, input.fill_buf()).await?;
                        if avail.is_empty() {
                            return Err(io::ErrorKind::UnexpectedEof.into());
                        }
                        let n = avail.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                        input.consume(n);
                        left -= n as u64;
                    }
                }
            }
            Ok(())
        };
        tokio::time::timeout(self.limits.payload_timeout, read)
            .await
            .unwrap_or_else(|_| {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "write payload not received in time",
                ))
            })
    }

    /// Answers a request that failed validation. It counts against the
    /// in-flight limits like any other until its reply is on the wire.
    async fn reject(&mut self, req: &Request, errno: u32) -> Result<(), Ended> {
        let payload = req.payload_bytes_in(self.session.header_mode);
        // Any refused request's payload, not only an oversized one's (a
        // 4 GiB WRITE to a read-only export, a PAYLOAD_LEN flag with a
        // 1 TiB length were read on for as long as the client sent).
        if payload > MAX_DRAIN_BYTES {
            return Err(format!(
                "bad request: a refused request's payload of {payload} bytes is beyond the \
                 {MAX_DRAIN_BYTES}-byte drain limit"
            ));
        }
        // Only for a request that is answered (one dropped above is said
        // by the drop: "answered EOVERFLOW" then was not true).
        if errno == EOVERFLOW {
            self.warn_oversize(req);
        }
        // Stay in sync: consume the payload before answering.
        self.read_payload(payload, None)
            .await
            .map_err(|e| format!("read failed: {e}"))?;
        self.gate.acquire(0).await;
        self.conn.backend.rejected(req.kind, errno);
        let msg = reject_message(errno);
        self.conn.sink.send(OutMsg {
            parts: error_reply(&self.conn, req, errno, msg),
            cost: 0,
        });
        Ok(())
    }

    fn warn_oversize(&mut self, req: &Request) {
        if !std::mem::replace(&mut self.warned_oversize, true) {
            crate::trouble::client_trouble(format_args!(
                "client sent a {}-byte request, above the server's {MAX_PAYLOAD_BYTES}-byte maximum payload; answered EOVERFLOW",
                req.length
            ));
        }
    }

    /// Admits a valid request, reads its payload and hands it to a worker.
    async fn submit(&mut self, req: &Request, cmd: Command) -> Result<(), Ended> {
        let cost = match cmd {
            Command::Read { length, .. } | Command::Write { length, .. } => u64::from(length),
            _ => 0,
        };
        self.gate.acquire(cost).await;
        let pending = PendingReply {
            conn: self.conn.clone(),
            cost,
            answered: false,
        };
        self.bulk_writes = matches!(cmd, Command::Write { length, .. }
            if u64::from(length) >= DIRECT_PAYLOAD_MIN_BYTES);
        let payload = match cmd {
            Command::Write { length, .. } => {
                let mut buf = self
                    .res
                    .buffers
                    .take_async_for(Some(&self.conn.share), length as usize)
                    .await;
                if let Err(e) = self.read_payload(length.into(), Some(buf.vec())).await {
                    drop(pending);
                    return Err(format!("truncated write payload: {e}"));
                }
                Some(buf)
            }
            _ => None,
        };
        let req = *req;
        // Try on this network thread first: most writes, flushes and cached
        // reads need no I/O and no wait, and a hand-off to a worker and back
        // costs two context switches. What would block goes to a worker.
        let backend = self.conn.backend.clone();
        match cmd {
            // Writes and flushes complete through the backend's callback, so
            // nobody sits out a commit: with group commit, a whole queue of
            // FUA writes goes into one commit.
            Command::Write {
                offset,
                fua,
                length,
            } => {
                let data = payload.map(|b| Box::new(b) as OwnedPayload);
                let done = answer_when_done(pending, req);
                // What is journaled is tried in memory here. A large write
                // that goes home never runs here, even through the page
                // cache: a buffered write waits for the storage under
                // writeback pressure, and on a slow disk one held this
                // thread, and every connection on it, for 27 s (session 28;
                // session 10 had run them here for 20% less server CPU in
                // nbdcopy in).
                let tried = if length > INLINE_MAX_BYTES {
                    Err((data, done))
                } else {
                    let bytes: &[u8] = data.as_deref().map_or(&[][..], |b| b.as_ref());
                    backend
                        .try_write_at_then(bytes, offset, fua, done)
                        .map_err(|done| (data, done))
                };
                if let Err((payload, done)) = tried {
                    // The worker hands the payload buffer itself over: a
                    // large write goes home from it without a copy.
                    let conn = self.conn.clone();
                    self.res.workers.submit_in(&self.conn.lane, move || {
                        if conn.sink.is_broken() {
                            return; // dropped client: `done` releases its gate
                        }
                        match payload {
                            Some(buf) => backend.write_owned_then(buf, offset, fua, done),
                            None => backend.write_at_then(&[], offset, fua, done),
                        }
                    });
                }
            }
            Command::Flush => {
                if let Err(done) = backend.try_flush_then(answer_when_done(pending, req)) {
                    let conn = self.conn.clone();
                    self.res.workers.submit_in(&self.conn.lane, move || {
                        if !conn.sink.is_broken() {
                            backend.flush_then(done);
                        }
                    });
                }
            }
            Command::Read { offset, length, df } if length > 0 => {
                let mut data = self
                    .res
                    .buffers
                    .take_async_for(Some(&self.conn.share), length as usize)
                    .await;
                data.vec().resize(length as usize, 0);
                let tried = if length <= INLINE_MAX_BYTES {
                    backend.try_read_at(&mut data, offset)
                } else {
                    None
                };
                match tried {
                    Some(Ok(())) => {
                        let parts = data_reply(&pending.conn, req.cookie, offset, df, data);
                        pending.answer(parts);
                    }
                    Some(Err(e)) => {
                        let parts = error_reply(&pending.conn, &req, e.errno, &e.message);
                        pending.answer(parts);
                    }
                    None => self.res.workers.submit_in(&self.conn.lane, move || {
                        if pending.conn.sink.is_broken() {
                            return; // dropped client: not read for nobody
                        }
                        let parts = match backend.read_at(&mut data, offset) {
                            Ok(()) => data_reply(&pending.conn, req.cookie, offset, df, data),
                            Err(e) => error_reply(&pending.conn, &req, e.errno, &e.message),
                        };
                        pending.answer(parts);
                    }),
                }
            }
            _ => self.res.workers.submit_in(&self.conn.lane, move || {
                if pending.conn.sink.is_broken() {
                    return;
                }
                let parts = execute(&pending.conn, &req, cmd);
                pending.answer(parts);
            }),
        }
        Ok(())
    }
}

/// One read of a request begun (the rest of its header, its payload), ended
/// with `TimedOut` when no byte comes for the idle timeout (`--idle-timeout`):
/// a client silent halfway through a request is as idle as one silent
/// between requests (session 30's verify pass: such a client was held until
/// the 30 s payload timeout). Without the option, the read as it is.
async fn stall_guard<T>(
    idle: Option<Duration>,
    read: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match idle {
        None => read.await,
        Some(t) => tokio::time::timeout(t, read).await.unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "idle for {} s halfway through a request (--idle-timeout)",
                    t.as_secs()
                ),
            ))
        }),
    }
}

#[cfg(test)]
mod idle_tests {
    use super::*;

    /// `idle_for` counts from when the last request finished: a request
    /// longer than the idle time keeps the connection, and its client then
    /// gets the whole idle time again (session 30's verify pass: closed a
    /// second after a 3 s request's reply with a 2 s timeout). Paused clock.
    #[tokio::test(start_paused = true)]
    async fn the_idle_time_starts_when_the_last_request_ends() {
        let gate = Arc::new(InflightGate::new(4, 1 << 20));
        let idle = Some(Duration::from_secs(2));
        gate.acquire(1).await;
        let g = gate.clone();
        let waiter = tokio::spawn(async move { g.idle_for(idle).await });
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!waiter.is_finished(), "closed with a request in flight");
        gate.release(1, 1);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(!waiter.is_finished(), "closed 1.5 s after the reply");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(waiter.is_finished(), "not closed 2.5 s after the reply");
        // None: never.
        let g = gate.clone();
        let never = tokio::spawn(async move { g.idle_for(None).await });
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!never.is_finished());
        never.abort();
    }
}

#[cfg(test)]
mod zero_run_tests {
    use super::zero_runs;

    #[test]
    fn zero_runs_cover_the_data_in_order() {
        let g = 4;
        let mut d = vec![1u8; 64];
        d[8..40].fill(0); // 32 zero bytes at 8
        let runs = zero_runs(&d, g, 16);
        assert_eq!(runs, vec![(0, 8, false), (8, 40, true), (40, 64, false)]);
        // Too short to be a hole.
        assert_eq!(zero_runs(&d, g, 64), vec![(0, 64, false)]);
        assert_eq!(zero_runs(&[0u8; 10], g, 8), vec![(0, 10, true)]);
        assert_eq!(zero_runs(&[7u8; 10], g, 8), vec![(0, 10, false)]);
        // A single non-zero byte keeps its granule as data.
        let mut e = vec![0u8; 64];
        e[33] = 9;
        assert_eq!(
            zero_runs(&e, g, 16),
            vec![(0, 32, true), (32, 36, false), (36, 64, true)]
        );
    }
}
