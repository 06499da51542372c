//! The transmission phase of one connection.
//!
//! Threads: the connection's *reader* thread parses requests and reads write
//! payloads; it hands every valid request to the shared [`WorkerPool`], so
//! up to `max_inflight_requests` requests of one connection run in the
//! volume at once and complete in any order. Replies go out through a
//! [`ReplySink`]: whichever worker finds the socket idle becomes the writer
//! and drains the queue that other workers filled meanwhile (one `writev`
//! for a whole group commit's worth of replies), so no thread waits on the
//! socket while another holds it and no lock is held during a volume call.
//!
//! Bounds: an [`InflightGate`] admits a request only while the connection has
//! fewer than `max_inflight_requests` requests and `max_inflight_bytes`
//! buffered bytes (write payloads plus read replies) outstanding; when it is
//! full the reader stops reading and TCP pushes back on the client. A write
//! payload above the protocol's 32 MiB maximum drops the connection (the
//! spec allows it; anything else would have to buffer or skip gigabytes).

use std::io::{self, BufRead, IoSlice, Read, Write};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::backend::{Backend, BackendError};
use crate::codec::{self, Command, ExportContext, Request};
use crate::handshake::Session;
use crate::pool::WorkerPool;
use crate::proto::*;
use crate::server::StreamControl;

/// Per-connection limits of the transmission phase.
#[derive(Clone, Debug)]
pub struct ConnLimits {
    pub max_inflight_requests: u32,
    pub max_inflight_bytes: u64,
}

/// Reads of at least this many bytes ask the backend for holes first and
/// send zero ranges as `OFFSET_HOLE` chunks (structured replies only).
const HOLE_SCAN_MIN_BYTES: u32 = 64 << 10;
/// Most block-status descriptors in one reply (the client asks again for
/// the rest).
const MAX_STATUS_DESCRIPTORS: usize = 1024;

// ------------------------------------------------------------ inflight gate

/// Counting bound on requests and bytes in flight on one connection.
pub struct InflightGate {
    state: Mutex<(u32, u64)>,
    cv: Condvar,
    max_requests: u32,
    max_bytes: u64,
}

impl InflightGate {
    pub fn new(max_requests: u32, max_bytes: u64) -> Self {
        Self {
            state: Mutex::new((0, 0)),
            cv: Condvar::new(),
            max_requests: max_requests.max(1),
            max_bytes,
        }
    }

    /// Waits until a request of `bytes` fits. A request larger than the byte
    /// bound is admitted alone, so it can always make progress.
    pub fn acquire(&self, bytes: u64) {
        let mut st = self.state.lock();
        while st.0 >= self.max_requests || (st.0 > 0 && st.1 + bytes > self.max_bytes) {
            self.cv.wait(&mut st);
        }
        st.0 += 1;
        st.1 += bytes;
    }

    pub fn release(&self, requests: u32, bytes: u64) {
        let mut st = self.state.lock();
        st.0 -= requests;
        st.1 -= bytes;
        drop(st);
        self.cv.notify_all();
    }

    /// Waits until nothing is in flight.
    pub fn wait_idle(&self) {
        let mut st = self.state.lock();
        while st.0 > 0 {
            self.cv.wait(&mut st);
        }
    }
}

// --------------------------------------------------------------- reply sink

/// One reply: byte parts written back to back, and the gate cost to release
/// once it is on the wire.
pub struct OutMsg {
    parts: Vec<Vec<u8>>,
    cost: u64,
    /// Counts against the gate (false for replies to rejected requests,
    /// which never acquired it).
    gated: bool,
}

struct SinkState {
    queue: Vec<OutMsg>,
    /// The writer, absent while a thread is writing with it.
    writer: Option<Box<dyn Write + Send>>,
    broken: bool,
}

/// Combining reply writer (see the module docs).
pub struct ReplySink {
    state: Mutex<SinkState>,
    gate: Arc<InflightGate>,
    control: Arc<dyn StreamControl>,
}

/// Most messages written in one `writev` batch.
const MAX_BATCH_MSGS: usize = 256;

impl ReplySink {
    fn new(
        writer: Box<dyn Write + Send>,
        gate: Arc<InflightGate>,
        control: Arc<dyn StreamControl>,
    ) -> Self {
        Self {
            state: Mutex::new(SinkState {
                queue: Vec::new(),
                writer: Some(writer),
                broken: false,
            }),
            gate,
            control,
        }
    }

    fn release(&self, msgs: &[OutMsg]) {
        let (n, bytes) = msgs
            .iter()
            .filter(|m| m.gated)
            .fold((0u32, 0u64), |(n, b), m| (n + 1, b + m.cost));
        if n > 0 {
            self.gate.release(n, bytes);
        }
    }

    /// Queues `msg`; writes the queue if no other thread is writing.
    pub fn send(&self, msg: OutMsg) {
        let mut st = self.state.lock();
        if st.broken {
            drop(st);
            self.release(std::slice::from_ref(&msg));
            return;
        }
        st.queue.push(msg);
        let Some(mut writer) = st.writer.take() else {
            return; // the current writer will pick it up
        };
        loop {
            let n = st.queue.len().min(MAX_BATCH_MSGS);
            let batch: Vec<OutMsg> = st.queue.drain(..n).collect();
            drop(st);
            let res = write_batch(&mut *writer, &batch);
            self.release(&batch);
            st = self.state.lock();
            if let Err(e) = res {
                tracing::debug!("reply write failed: {e}");
                st.broken = true;
                let dropped: Vec<OutMsg> = st.queue.drain(..).collect();
                drop(st);
                self.release(&dropped);
                self.control.shutdown();
                return;
            }
            if st.queue.is_empty() {
                st.writer = Some(writer);
                return;
            }
        }
    }
}

fn write_batch(w: &mut dyn Write, batch: &[OutMsg]) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = batch
        .iter()
        .flat_map(|m| m.parts.iter())
        .filter(|p| !p.is_empty())
        .map(|p| IoSlice::new(p))
        .collect();
    let mut rest: &mut [IoSlice<'_>] = &mut slices;
    while !rest.is_empty() {
        // Linux takes at most 1024 iovecs per call.
        let take = rest.len().min(1024);
        let n = w.write_vectored(&rest[..take])?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    w.flush()
}

// --------------------------------------------------------------- execution

/// Everything a worker needs to run a request of this connection.
struct ConnShared {
    backend: Arc<dyn Backend>,
    sink: ReplySink,
    structured: bool,
}

/// Releases the gate and drops the connection if a job is lost without a
/// reply (a panicking backend): the client would otherwise wait forever.
struct PendingReply {
    conn: Arc<ConnShared>,
    cost: u64,
    answered: bool,
}

impl PendingReply {
    fn answer(mut self, parts: Vec<Vec<u8>>) {
        self.answered = true;
        self.conn.sink.send(OutMsg {
            parts,
            cost: self.cost,
            gated: true,
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

fn error_reply(structured: bool, cookie: u64, err: &BackendError) -> Vec<Vec<u8>> {
    if structured {
        vec![codec::encode_error_chunk(cookie, err.errno, &err.message)]
    } else {
        vec![codec::encode_simple_reply(err.errno, cookie).to_vec()]
    }
}

fn ok_reply(cookie: u64) -> Vec<Vec<u8>> {
    vec![codec::encode_simple_reply(0, cookie).to_vec()]
}

fn execute(conn: &ConnShared, cookie: u64, cmd: Command, payload: Vec<u8>) -> Vec<Vec<u8>> {
    let b = &*conn.backend;
    let res: Result<Vec<Vec<u8>>, BackendError> = match cmd {
        Command::Read { offset, length, df } => read_reply(conn, cookie, offset, length, df),
        Command::Write { offset, fua, .. } => {
            b.write_at(&payload, offset, fua).map(|_| ok_reply(cookie))
        }
        Command::Flush => b.flush().map(|_| ok_reply(cookie)),
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
        Command::Cache { .. } => Ok(ok_reply(cookie)),
        Command::WriteZeroes {
            offset,
            length,
            fua,
            fast,
            ..
        } => {
            if fast && !b.zeroes_are_fast(offset, length) {
                Err(BackendError::new(
                    ENOTSUP,
                    "zeroing is not faster than writing",
                ))
            } else if length == 0 {
                Ok(ok_reply(cookie))
            } else {
                b.write_zeroes(offset, length, fua)
                    .map(|_| ok_reply(cookie))
            }
        }
        Command::BlockStatus {
            offset,
            length,
            req_one,
        } => block_status_reply(b, cookie, offset, length, req_one),
        Command::Disconnect => Ok(Vec::new()), // handled by the reader
    };
    res.unwrap_or_else(|e| {
        tracing::debug!("request {cookie:#x} failed: {e}");
        error_reply(conn.structured, cookie, &e)
    })
}

fn read_reply(
    conn: &ConnShared,
    cookie: u64,
    offset: u64,
    length: u32,
    df: bool,
) -> Result<Vec<Vec<u8>>, BackendError> {
    let b = &*conn.backend;
    if !conn.structured {
        let mut data = vec![0u8; length as usize];
        b.read_at(&mut data, offset)?;
        return Ok(vec![codec::encode_simple_reply(0, cookie).to_vec(), data]);
    }
    if length == 0 {
        return Ok(vec![codec::encode_chunk_header(
            REPLY_FLAG_DONE,
            REPLY_TYPE_NONE,
            cookie,
            0,
        )
        .to_vec()]);
    }
    // IMPORTANT: one backend read for the whole request, then holes found
    // in the data itself. A separate block-status call before the read (or
    // several reads for one request) could see a different moment: data
    // acknowledged in between would go out as zeroes, or a journaled write
    // would show half old, half new.
    let mut data = vec![0u8; length as usize];
    b.read_at(&mut data, offset)?;
    let pieces = if df || length < HOLE_SCAN_MIN_BYTES {
        vec![(0usize, length as usize, false)]
    } else {
        zero_runs(&data, HOLE_GRANULE_BYTES, HOLE_MIN_RUN_BYTES)
    };
    if pieces.len() == 1 && !pieces[0].2 {
        return Ok(vec![
            codec::encode_data_chunk_head(cookie, true, offset, length),
            data,
        ]);
    }
    let mut parts = Vec::with_capacity(pieces.len() * 2);
    let last = pieces.len() - 1;
    for (i, (from, to, zero)) in pieces.into_iter().enumerate() {
        let (off, n) = (offset + from as u64, (to - from) as u32);
        if zero {
            parts.push(codec::encode_hole_chunk(cookie, i == last, off, n));
        } else {
            parts.push(codec::encode_data_chunk_head(cookie, i == last, off, n));
            parts.push(data[from..to].to_vec());
        }
    }
    Ok(parts)
}

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
            data[at..end].iter().all(|&x| x == 0)
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
    cookie: u64,
    offset: u64,
    length: u64,
    req_one: bool,
) -> Result<Vec<Vec<u8>>, BackendError> {
    let extents = b.block_status(offset, length)?;
    let mut descs: Vec<(u32, u32)> = Vec::new();
    let mut pos = offset;
    for e in &extents {
        if e.offset != pos || e.length == 0 {
            break;
        }
        let flags = if e.zero { STATE_HOLE | STATE_ZERO } else { 0 };
        let mut left = e.length;
        while left > 0 && descs.len() < MAX_STATUS_DESCRIPTORS {
            // Descriptor lengths are 32-bit; keep them 4 KiB-aligned when split.
            let n = left.min(u64::from(u32::MAX) & !4095) as u32;
            match descs.last_mut() {
                Some((l, f))
                    if *f == flags && u64::from(*l) + u64::from(n) <= u64::from(u32::MAX) =>
                {
                    *l += n
                }
                _ => descs.push((n, flags)),
            }
            left -= u64::from(n);
        }
        pos += e.length;
        if descs.len() >= MAX_STATUS_DESCRIPTORS {
            break;
        }
    }
    if descs.is_empty() {
        // The backend described nothing usable: "unknown" is always honest.
        descs.push((length.min(u64::from(u32::MAX)) as u32, 0));
    }
    if req_one {
        descs.truncate(1);
        descs[0].0 = descs[0].0.min(length.min(u64::from(u32::MAX)) as u32);
    }
    Ok(vec![codec::encode_block_status_chunk(
        cookie,
        CONTEXT_ID_BASE_ALLOCATION,
        &descs,
    )])
}

// ------------------------------------------------------------------ reader

/// Runs the transmission phase until the client disconnects, the stream
/// fails, or the server shuts the stream down. Returns after every request
/// that was read has been answered (or the connection broke).
pub fn serve(
    mut reader: Box<dyn BufRead + Send>,
    writer: Box<dyn Write + Send>,
    control: Arc<dyn StreamControl>,
    session: Session,
    pool: &WorkerPool,
    limits: &ConnLimits,
) {
    let gate = Arc::new(InflightGate::new(
        limits.max_inflight_requests,
        limits.max_inflight_bytes,
    ));
    let backend = session.export.backend.clone();
    let conn = Arc::new(ConnShared {
        backend: backend.clone(),
        sink: ReplySink::new(writer, gate.clone(), control.clone()),
        structured: session.structured_replies,
    });
    let ctx = ExportContext {
        size_bytes: backend.size_bytes(),
        read_only: backend.read_only(),
        structured_replies: session.structured_replies,
        base_allocation: session.base_allocation,
    };
    let header_bytes = session.header_mode.request_header_bytes();
    let mut hb = [0u8; 32];
    let reason = loop {
        let hb = &mut hb[..header_bytes];
        match read_full(&mut reader, hb) {
            Ok(true) => {}
            Ok(false) => break "client closed the connection".to_string(),
            Err(e) => break format!("read failed: {e}"),
        }
        let req = match Request::decode(session.header_mode, hb) {
            Ok(r) => r,
            Err(e) => break format!("bad request: {e}"),
        };
        if req.payload_bytes() > u64::from(MAX_PAYLOAD_BYTES) {
            break format!("write payload of {} bytes exceeds 32 MiB", req.length);
        }
        let cmd = match codec::validate(&req, &ctx) {
            Ok(c) => c,
            Err(errno) => {
                // Stay in sync: consume the payload before answering.
                if let Err(e) = discard(&mut reader, req.payload_bytes()) {
                    break format!("read failed: {e}");
                }
                let parts = if ctx.structured_replies {
                    vec![codec::encode_error_chunk(
                        req.cookie,
                        errno,
                        "invalid request",
                    )]
                } else {
                    vec![codec::encode_simple_reply(errno, req.cookie).to_vec()]
                };
                conn.sink.send(OutMsg {
                    parts,
                    cost: 0,
                    gated: false,
                });
                continue;
            }
        };
        if cmd == Command::Disconnect {
            break "client sent DISC".to_string();
        }
        let cost = match cmd {
            Command::Read { length, .. } => u64::from(length),
            Command::Write { length, .. } => u64::from(length),
            _ => 0,
        };
        gate.acquire(cost);
        let pending = PendingReply {
            conn: conn.clone(),
            cost,
            answered: false,
        };
        let mut payload = Vec::new();
        if let Command::Write { length, .. } = cmd {
            payload.resize(length as usize, 0);
            if let Err(e) = reader.read_exact(&mut payload) {
                drop(pending);
                break format!("truncated write payload: {e}");
            }
        }
        let cookie = req.cookie;
        pool.submit(move || {
            let parts = execute(&pending.conn, cookie, cmd, payload);
            pending.answer(parts);
        });
    };
    tracing::debug!("connection ending: {reason}");
    // NBD_CMD_DISC and shutdown: answer everything already accepted first.
    gate.wait_idle();
    control.shutdown();
}

/// Fills `buf`; `Ok(false)` on a clean end of stream before the first byte.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn discard(r: &mut dyn Read, n: u64) -> io::Result<()> {
    if n == 0 {
        return Ok(());
    }
    let copied = io::copy(&mut r.take(n), &mut io::sink())?;
    if copied < n {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
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
