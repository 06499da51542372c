//! The protocol layer alone, against in-memory backends: pipelining with
//! out-of-order replies, structured reads with holes, block status, and
//! shutdown finishing in-flight requests.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jbdev_nbd::backend::{Backend, BackendResult, Extent};
use jbdev_nbd::client::{Address, Client};
use jbdev_nbd::codec::{self, OptionHeader, OptionReplyHeader, ReplyHeader, Request};
use jbdev_nbd::proto::*;
use jbdev_nbd::{Export, ExportSet, Listener, MemBackend, Server, ServerConfig};

struct Running {
    _dir: tempfile::TempDir,
    sock: PathBuf,
    handle: jbdev_nbd::ShutdownHandle,
    thread: std::thread::JoinHandle<()>,
}

fn start(backend: Arc<dyn Backend>) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let exports = ExportSet::new(vec![Export::new("mem", "test export", backend)]).unwrap();
    let server = Server::new(exports, ServerConfig::default());
    let handle = server.shutdown_handle();
    let thread = std::thread::spawn(move || {
        server.serve(vec![Listener::Unix {
            listener,
            unlink: None,
        }])
    });
    Running {
        _dir: dir,
        sock,
        handle,
        thread,
    }
}

impl Running {
    fn stop(self) {
        self.handle.shutdown();
        self.thread.join().unwrap();
    }
}

/// Reads at offset 0 block until `release` is set: a serial server would
/// never answer the request behind it.
struct GatedBackend {
    inner: MemBackend,
    release: AtomicBool,
    /// Gated reads that have passed the gate.
    passed: AtomicUsize,
}

impl Backend for GatedBackend {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn preferred_block_bytes(&self) -> u32 {
        4096
    }
    fn read_only(&self) -> bool {
        false
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> BackendResult<()> {
        if offset == 0 {
            let mut waited_ms = 0;
            while !self.release.load(Ordering::Acquire) && waited_ms < 20_000 {
                std::thread::sleep(Duration::from_millis(1));
                waited_ms += 1;
            }
            self.passed.fetch_add(1, Ordering::AcqRel);
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> BackendResult<()> {
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> BackendResult<()> {
        self.inner.flush()
    }
    fn trim(&self, o: u64, l: u64, f: bool) -> BackendResult<()> {
        self.inner.trim(o, l, f)
    }
    fn write_zeroes(&self, o: u64, l: u64, f: bool, h: bool) -> BackendResult<()> {
        self.inner.write_zeroes(o, l, f, h)
    }
    fn zeroes_are_fast(&self, _o: u64, _l: u64) -> bool {
        true
    }
    fn block_status(&self, o: u64, l: u64, max: usize) -> BackendResult<Vec<Extent>> {
        self.inner.block_status(o, l, max)
    }
}

#[test]
fn replies_come_out_of_order_and_pipelining_works() {
    let backend = Arc::new(GatedBackend {
        inner: MemBackend::new(1 << 20, false),
        release: AtomicBool::new(false),
        passed: AtomicUsize::new(0),
    });
    let srv = start(backend.clone());
    let c = Client::connect(&Address::Unix(srv.sock.clone()), "mem").unwrap();
    assert_eq!(c.size_bytes, 1 << 20);
    let Client {
        mut writer,
        mut reader,
        ..
    } = c;
    // 64 writes to distinct blocks, FUA on every other one, in one burst.
    for i in 1..=64u64 {
        let data = vec![i as u8; 4096];
        let flags = if i % 2 == 0 { CMD_FLAG_FUA } else { 0 };
        writer
            .queue(CMD_WRITE, flags, i, i * 4096, 4096, &data)
            .unwrap();
    }
    writer.flush().unwrap();
    let mut seen = std::collections::HashSet::new();
    for _ in 1..=64 {
        let (cookie, res) = reader.recv(|_| 0).unwrap();
        assert_eq!(res, Ok(vec![]));
        assert!(seen.insert(cookie), "cookie {cookie} answered twice");
    }
    assert_eq!(seen.len(), 64);
    // A blocked read at offset 0, then a read behind it: the second must be
    // answered first, while the first is still inside the backend.
    writer.queue(CMD_READ, 0, 1000, 0, 4096, &[]).unwrap();
    writer
        .queue(CMD_READ, 0, 1001, 7 * 4096, 4096, &[])
        .unwrap();
    writer.flush().unwrap();
    let (cookie, res) = reader.recv(|_| 4096).unwrap();
    assert_eq!(cookie, 1001, "replies were serialized");
    assert_eq!(res, Ok(vec![7u8; 4096]));
    backend.release.store(true, Ordering::Release);
    let (cookie, res) = reader.recv(|_| 4096).unwrap();
    assert_eq!(cookie, 1000);
    assert_eq!(res, Ok(vec![0u8; 4096]));
    assert!(
        backend.inner.flush_count() >= 32,
        "FUA writes did not flush"
    );
    writer.disconnect().unwrap();
    srv.stop();
}

/// Large payloads are read straight from the socket, and the header after
/// one on its own; small ones come through the read buffer. A pipelined
/// burst that switches between the two, with odd sizes, must land byte for
/// byte.
#[test]
fn a_burst_of_large_and_small_writes_lands_byte_for_byte() {
    const SIZE: usize = 8 << 20;
    let srv = start(Arc::new(MemBackend::new(SIZE, false)));
    let c = Client::connect(&Address::Unix(srv.sock.clone()), "mem").unwrap();
    let Client {
        mut writer,
        mut reader,
        ..
    } = c;
    let mut model = vec![0u8; SIZE];
    let lens = [
        256 << 10,
        512,
        4096,
        (64 << 10) + 1,
        16 << 10,
        (16 << 10) - 1,
        1 << 20,
        1,
        100_000,
    ];
    let mut cookie = 0u64;
    let mut offset = 0usize;
    for round in 0..3usize {
        for (i, &len) in lens.iter().enumerate() {
            let data: Vec<u8> = (0..len).map(|b| (b * 7 + i * 13 + round) as u8).collect();
            // Requests in flight together may run in any order: none overlap.
            offset += 4093 * (i + 1);
            model[offset..offset + len].copy_from_slice(&data);
            cookie += 1;
            writer
                .queue(CMD_WRITE, 0, cookie, offset as u64, len as u32, &data)
                .unwrap();
            offset += len;
        }
    }
    assert!(offset <= SIZE);
    writer.flush().unwrap();
    for _ in 0..cookie {
        let (_, res) = reader.recv(|_| 0).unwrap();
        assert_eq!(res, Ok(vec![]));
    }
    for at in (0..SIZE).step_by(1 << 20) {
        writer
            .queue(CMD_READ, 0, 9000, at as u64, 1 << 20, &[])
            .unwrap();
        writer.flush().unwrap();
        let (_, res) = reader.recv(|_| 1 << 20).unwrap();
        assert!(
            res.unwrap() == model[at..at + (1 << 20)],
            "data differs in the MiB at {at}"
        );
    }
    writer.disconnect().unwrap();
    srv.stop();
}

/// A raw connection to `srv` past the greeting, fixed newstyle without
/// the zero padding: ready for options.
fn newstyle_session(srv: &Running) -> UnixStream {
    let mut s = UnixStream::connect(&srv.sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    s
}

fn opt(s: &mut UnixStream, option: u32, data: &[u8]) -> Vec<(u32, Vec<u8>)> {
    let mut m = OptionHeader {
        option,
        length: data.len() as u32,
    }
    .encode()
    .to_vec();
    m.extend_from_slice(data);
    s.write_all(&m).unwrap();
    let mut out = Vec::new();
    loop {
        let mut hb = [0u8; OptionReplyHeader::BYTES];
        s.read_exact(&mut hb).unwrap();
        let h = OptionReplyHeader::decode(&hb).unwrap();
        let mut body = vec![0u8; h.length as usize];
        s.read_exact(&mut body).unwrap();
        let last = h.reply_type == REP_ACK || h.reply_type & REP_FLAG_ERROR != 0;
        out.push((h.reply_type, body));
        if last {
            return out;
        }
    }
}

/// Reads structured chunks of one reply until DONE.
fn chunks(s: &mut UnixStream) -> Vec<(u16, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let mut hb = [0u8; 20];
        s.read_exact(&mut hb).unwrap();
        let ReplyHeader::Chunk {
            flags,
            chunk_type,
            length,
            ..
        } = ReplyHeader::decode(&hb).unwrap()
        else {
            panic!("simple reply after structured negotiation");
        };
        let mut p = vec![0u8; length as usize];
        s.read_exact(&mut p).unwrap();
        out.push((chunk_type, p));
        if flags & REPLY_FLAG_DONE != 0 {
            return out;
        }
    }
}

#[test]
fn structured_reads_send_holes_and_block_status_matches() {
    let mem = Arc::new(MemBackend::new(1 << 20, false));
    let srv = start(mem.clone());
    let mut s = newstyle_session(&srv);
    // Meta contexts need structured replies first.
    let q = codec::encode_meta_query(&codec::MetaQuery {
        export: "mem".into(),
        queries: vec![CONTEXT_BASE_ALLOCATION.into()],
    });
    assert_eq!(opt(&mut s, OPT_SET_META_CONTEXT, &q)[0].0, REP_ERR_INVALID);
    assert_eq!(opt(&mut s, OPT_STRUCTURED_REPLY, &[])[0].0, REP_ACK);
    let r = opt(
        &mut s,
        OPT_LIST_META_CONTEXT,
        &codec::encode_meta_query(&codec::MetaQuery {
            export: "mem".into(),
            queries: vec![],
        }),
    );
    assert_eq!(r.len(), 2);
    assert_eq!(&r[0].1[4..], CONTEXT_BASE_ALLOCATION.as_bytes());
    let r = opt(&mut s, OPT_SET_META_CONTEXT, &q);
    assert_eq!(r[0].0, REP_META_CONTEXT);
    let ctx_id = u32::from_be_bytes(r[0].1[..4].try_into().unwrap());
    let info = codec::encode_info_request(&codec::InfoRequest {
        export: "mem".into(),
        info_types: vec![INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION],
    });
    let r = opt(&mut s, OPT_GO, &info);
    assert_eq!(r.last().unwrap().0, REP_ACK);
    let kinds: Vec<u16> = r[..r.len() - 1]
        .iter()
        .map(|(_, b)| u16::from_be_bytes([b[0], b[1]]))
        .collect();
    assert_eq!(
        kinds,
        vec![INFO_EXPORT, INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION]
    );

    let send = |s: &mut UnixStream, kind, flags, cookie, offset, length: u32, payload: &[u8]| {
        let h = Request {
            flags,
            kind,
            cookie,
            offset,
            length: length.into(),
        }
        .encode()
        .unwrap();
        s.write_all(&h).unwrap();
        s.write_all(payload).unwrap();
    };
    send(&mut s, CMD_WRITE, 0, 1, 64 << 10, 4096, &[9u8; 4096]);
    assert_eq!(chunks_or_simple(&mut s), 0);
    // A 256 KiB read: hole, data, hole, reassembled to the right bytes.
    send(&mut s, CMD_READ, 0, 2, 0, 256 << 10, &[]);
    let got = chunks(&mut s);
    let mut image = vec![0xffu8; 256 << 10];
    let mut holes = 0;
    for (t, p) in &got {
        let off = u64::from_be_bytes(p[..8].try_into().unwrap()) as usize;
        match *t {
            REPLY_TYPE_OFFSET_HOLE => {
                holes += 1;
                let n = u32::from_be_bytes(p[8..12].try_into().unwrap()) as usize;
                image[off..off + n].fill(0);
            }
            REPLY_TYPE_OFFSET_DATA => image[off..off + p.len() - 8].copy_from_slice(&p[8..]),
            other => panic!("unexpected chunk type {other}"),
        }
    }
    assert_eq!(
        holes,
        2,
        "{:?}",
        got.iter().map(|c| c.0).collect::<Vec<_>>()
    );
    let mut want = vec![0u8; 256 << 10];
    want[64 << 10..(64 << 10) + 4096].fill(9);
    assert!(image == want, "reassembled read differs");
    // DF: one data chunk even with holes.
    send(&mut s, CMD_READ, CMD_FLAG_DF, 3, 0, 256 << 10, &[]);
    let got = chunks(&mut s);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, REPLY_TYPE_OFFSET_DATA);
    assert!(got[0].1[8..] == want[..]);
    // Block status: zero/hole, data, zero/hole.
    send(&mut s, CMD_BLOCK_STATUS, 0, 4, 0, 256 << 10, &[]);
    let got = chunks(&mut s);
    assert_eq!(got[0].0, REPLY_TYPE_BLOCK_STATUS);
    let p = &got[0].1;
    assert_eq!(u32::from_be_bytes(p[..4].try_into().unwrap()), ctx_id);
    let descs: Vec<(u32, u32)> = p[4..]
        .chunks(8)
        .map(|d| {
            (
                u32::from_be_bytes(d[..4].try_into().unwrap()),
                u32::from_be_bytes(d[4..].try_into().unwrap()),
            )
        })
        .collect();
    let hz = STATE_HOLE | STATE_ZERO;
    assert_eq!(
        descs,
        vec![(64 << 10, hz), (4096, 0), ((192 << 10) - 4096, hz)]
    );
    send(&mut s, CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 5, 0, 4096, &[]);
    let got = chunks(&mut s);
    assert_eq!(got[0].1.len(), 4 + 8);
    // Write zeroes with FAST_ZERO on a backend where zeroing is cheap.
    send(
        &mut s,
        CMD_WRITE_ZEROES,
        CMD_FLAG_FAST_ZERO | CMD_FLAG_FUA,
        6,
        64 << 10,
        4096,
        &[],
    );
    assert_eq!(chunks_or_simple(&mut s), 0);
    assert!(mem.snapshot().iter().all(|&b| b == 0));
    // Nothing to zero is fast, NO_HOLE or not (it was ENOTSUP with NO_HOLE
    // and served without FAST_ZERO).
    send(
        &mut s,
        CMD_WRITE_ZEROES,
        CMD_FLAG_FAST_ZERO | CMD_FLAG_NO_HOLE,
        8,
        4096,
        0,
        &[],
    );
    assert_eq!(chunks_or_simple(&mut s), 0, "zero-length FAST_ZERO");
    send(&mut s, CMD_DISC, 0, 7, 0, 0, &[]);
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "bytes after DISC");
    srv.stop();
}

/// Reads one non-read reply (simple, or a structured error) and returns its
/// error value.
fn chunks_or_simple(s: &mut UnixStream) -> u32 {
    let mut head = [0u8; 16];
    s.read_exact(&mut head).unwrap();
    match u32::from_be_bytes(head[..4].try_into().unwrap()) {
        SIMPLE_REPLY_MAGIC => u32::from_be_bytes(head[4..8].try_into().unwrap()),
        _ => panic!("unexpected structured reply"),
    }
}

#[test]
fn shutdown_answers_in_flight_requests_first() {
    let backend = Arc::new(GatedBackend {
        inner: MemBackend::new(1 << 20, false),
        release: AtomicBool::new(false),
        passed: AtomicUsize::new(0),
    });
    let srv = start(backend.clone());
    let Client {
        mut writer,
        mut reader,
        ..
    } = Client::connect(&Address::Unix(srv.sock.clone()), "").unwrap();
    writer.queue(CMD_READ, 0, 77, 0, 4096, &[]).unwrap();
    writer.flush().unwrap();
    // Make sure the read is inside the backend before shutting down.
    writer.queue(CMD_FLUSH, 0, 78, 0, 0, &[]).unwrap();
    writer.flush().unwrap();
    let (cookie, _) = reader.recv(|_| 0).unwrap();
    assert_eq!(cookie, 78);
    let handle = srv.handle.clone();
    let stopper = std::thread::spawn(move || srv.stop());
    std::thread::sleep(Duration::from_millis(50));
    backend.release.store(true, Ordering::Release);
    let (cookie, res) = reader.recv(|_| 4096).unwrap();
    assert_eq!((cookie, res), (77, Ok(vec![0u8; 4096])));
    stopper.join().unwrap();
    handle.shutdown(); // idempotent after the server is gone
}

/// Requests refused before they run say why: a WRITE or WRITE_ZEROES past
/// the end is ENOSPC "past the end" (it said "invalid request"), and a
/// READ above the 64 MiB maximum on a connection that did not ask for
/// NBD_INFO_BLOCK_SIZE is EOVERFLOW without claiming the maximum was
/// advertised (nothing was).
#[test]
fn refused_requests_say_why_in_their_error_messages() {
    let mem = Arc::new(MemBackend::new(1 << 20, false));
    let srv = start(mem);
    let mut s = newstyle_session(&srv);
    assert_eq!(opt(&mut s, OPT_STRUCTURED_REPLY, &[])[0].0, REP_ACK);
    // GO without asking for block sizes: none are sent.
    let info = codec::encode_info_request(&codec::InfoRequest {
        export: "mem".into(),
        info_types: vec![],
    });
    let r = opt(&mut s, OPT_GO, &info);
    assert_eq!(r.last().unwrap().0, REP_ACK);
    assert!(
        r[..r.len() - 1]
            .iter()
            .all(|(_, b)| u16::from_be_bytes([b[0], b[1]]) != INFO_BLOCK_SIZE),
        "block sizes sent unasked"
    );
    let mut error_of = |kind: u16, offset: u64, len: u32, payload: &[u8]| {
        let req = Request {
            flags: 0,
            kind,
            cookie: 9,
            offset,
            length: u64::from(len),
        };
        s.write_all(&req.encode().unwrap()).unwrap();
        s.write_all(payload).unwrap();
        let c = chunks(&mut s);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].0, REPLY_TYPE_ERROR);
        let p = &c[0].1;
        let errno = u32::from_be_bytes(p[..4].try_into().unwrap());
        let n = u16::from_be_bytes([p[4], p[5]]) as usize;
        (errno, String::from_utf8(p[6..6 + n].to_vec()).unwrap())
    };
    let (errno, msg) = error_of(CMD_WRITE, (1 << 20) - 2048, 4096, &[7; 4096]);
    assert_eq!(errno, ENOSPC);
    assert!(msg.contains("past the end"), "{msg}");
    let (errno, msg) = error_of(CMD_WRITE_ZEROES, 1 << 20, 4096, &[]);
    assert_eq!(errno, ENOSPC);
    assert!(msg.contains("past the end"), "{msg}");
    let (errno, msg) = error_of(CMD_READ, 0, MAX_PAYLOAD_BYTES + 4096, &[]);
    assert_eq!(errno, EOVERFLOW);
    assert!(
        !msg.contains("advertised") && msg.contains("64 MiB"),
        "{msg}"
    );
    drop(s);
    srv.stop();
}

/// One export whose store stalls takes at most its share of the workers:
/// a request to another export is answered while every worker the stalled
/// export may hold waits (before, the stalled export's queued jobs took
/// every worker and the other export's request waited behind them until
/// the store answered: session 22's failure pass, with a hung FUSE store).
#[test]
fn a_stalled_export_leaves_workers_to_the_others() {
    let gated = Arc::new(GatedBackend {
        inner: MemBackend::new(1 << 20, false),
        release: AtomicBool::new(false),
        passed: AtomicUsize::new(0),
    });
    let healthy: Arc<dyn Backend> = Arc::new(MemBackend::new(1 << 20, false));
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let exports = ExportSet::new(vec![
        Export::new("stalled", "", gated.clone()),
        Export::new("healthy", "", healthy),
    ])
    .unwrap();
    let cfg = ServerConfig {
        worker_threads: 4,
        ..ServerConfig::default()
    };
    let server = Server::new(exports, cfg);
    let handle = server.shutdown_handle();
    let thread = std::thread::spawn(move || {
        server.serve(vec![Listener::Unix {
            listener,
            unlink: None,
        }])
    });
    let addr = Address::Unix(sock.clone());
    let Client {
        mut writer,
        mut reader,
        ..
    } = Client::connect(&addr, "stalled").unwrap();
    for i in 0..32u64 {
        writer.queue(CMD_READ, 0, i, 0, 4096, &[]).unwrap();
    }
    writer.flush().unwrap();
    let mut other = Client::connect(&addr, "healthy").unwrap();
    let data = vec![0x5a; 4096];
    other
        .call(CMD_WRITE, CMD_FLAG_FUA, 8192, 4096, &data)
        .unwrap()
        .unwrap();
    assert_eq!(
        other.call(CMD_READ, 0, 8192, 4096, &[]).unwrap().unwrap(),
        data
    );
    assert_eq!(
        gated.passed.load(Ordering::Acquire),
        0,
        "the healthy export was answered only after the stalled one's reads passed"
    );
    gated.release.store(true, Ordering::Release);
    for _ in 0..32 {
        let (_, res) = reader.recv(|_| 4096).unwrap();
        assert_eq!(res, Ok(vec![0u8; 4096]));
    }
    writer.disconnect().unwrap();
    other.disconnect().unwrap();
    handle.shutdown();
    thread.join().unwrap();
}
