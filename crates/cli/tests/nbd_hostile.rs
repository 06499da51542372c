//! Hostile clients against the real `jbdev serve`: a flood of idle and
//! trickling connections, connections beyond `--max-connections`, and a
//! client that sends reads but never reads the replies — while a normal
//! client's writes and reads keep being served and verified, and the
//! server's memory stays bounded. Then every hostile connection must have
//! been dropped by the server (handshake deadline, send timeout).

mod nbd_common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jbdev_nbd::client::{Address, Client};
use jbdev_nbd::proto::*;
use nbd_common::*;

const MAX_CONNECTIONS: usize = 48;
const IDLE: usize = 24;
const TRICKLING: usize = 12;
/// Worker threads of the flooded server (`--threads`).
const WORKERS: usize = 32;

/// Resident memory of a process, in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kib << 10
}

/// Threads of a process.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// True once the server has closed `s` (reads end or fail), waiting at
/// most `limit`.
fn dropped_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 64 << 10];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn flood_of_idle_trickling_and_non_reading_clients_does_not_starve_a_normal_one() {
    let dir = TempDir::new("hostile");
    let img = dir.path("a.img");
    format_volume(&img, "256M");
    let max_conn = MAX_CONNECTIONS.to_string();
    let srv = ServerProc::start(
        &[
            img.to_str().unwrap(),
            "--max-connections",
            &max_conn,
            "--handshake-timeout",
            "3",
            "--send-timeout",
            "3",
            "--threads",
            &WORKERS.to_string(),
        ],
        None,
    );
    let tcp = srv.tcp.clone().unwrap();
    let pid = srv.pid();

    // The normal client connects first, so the flood cannot take its slot.
    let mut normal = Client::connect(&Address::Tcp(tcp.clone()), "").unwrap();

    // A client that asks for 64 reads of 1 MiB and never reads a reply.
    let mut deaf_sock = TcpStream::connect(&tcp).unwrap();
    let mut deaf = Client::handshake(
        Box::new(deaf_sock.try_clone().unwrap()),
        Box::new(deaf_sock.try_clone().unwrap()),
        "",
    )
    .unwrap();
    for i in 0..64u64 {
        deaf.writer
            .queue(CMD_READ, 0, i, i << 20, 1 << 20, &[])
            .unwrap();
    }
    deaf.writer.flush().unwrap();

    // Idle connections: connect, never send a byte.
    let mut idle: Vec<TcpStream> = (0..IDLE)
        .map(|_| TcpStream::connect(&tcp).unwrap())
        .collect();
    // Trickling ones: one byte of the client flags at a time, slowly.
    let stop = Arc::new(AtomicBool::new(false));
    let mut trickling: Vec<TcpStream> = (0..TRICKLING)
        .map(|_| TcpStream::connect(&tcp).unwrap())
        .collect();
    let tricklers: Vec<_> = trickling
        .iter()
        .map(|s| {
            let mut s = s.try_clone().unwrap();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut greeting = [0u8; 18];
                let _ = s.read_exact(&mut greeting);
                // 4 flag bytes, then option-header bytes forever, 1 per 500 ms
                // (bounded: at most 40 bytes).
                for _ in 0..40 {
                    if stop.load(Ordering::Relaxed) || s.write_all(&[0]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            })
        })
        .collect();
    // Connections beyond the limit are closed at once.
    let mut over: Vec<TcpStream> = (0..(MAX_CONNECTIONS - IDLE - TRICKLING - 2 + 8))
        .map(|_| TcpStream::connect(&tcp).unwrap())
        .collect();

    // The normal client's I/O is served throughout (bounded: 200 rounds).
    let mut peak_rss = 0;
    for round in 0..200u64 {
        let data = pattern(round, 64 << 10);
        let off = (128 << 20) + (round % 64) * (64 << 10);
        let flags = if round % 4 == 0 { CMD_FLAG_FUA } else { 0 };
        normal
            .call(CMD_WRITE, flags, off, data.len() as u32, &data)
            .unwrap()
            .unwrap_or_else(|e| panic!("write {round}: NBD error {e}"));
        let back = normal
            .call(CMD_READ, 0, off, data.len() as u32, &[])
            .unwrap()
            .unwrap();
        assert!(back == data, "round {round}: read back differs");
        peak_rss = peak_rss.max(rss_bytes(pid));
    }
    normal.call(CMD_FLUSH, 0, 0, 0, &[]).unwrap().unwrap();
    let flood_threads = threads(pid);
    eprintln!(
        "served 200 rounds; server peak RSS {} MiB, {flood_threads} threads with {} connections attempted",
        peak_rss >> 20,
        2 + IDLE + TRICKLING + over.len()
    );
    // Bounded by limits, not by clients: the deaf client can pin at most
    // its per-connection in-flight bytes (64 MiB) in read replies.
    assert!(
        peak_rss < 256 << 20,
        "server RSS {} MiB under the flood",
        peak_rss >> 20
    );
    // Threads: the workers plus a fixed set (network threads, the volume's,
    // main and signals) — none per connection.
    assert!(flood_threads <= WORKERS + 24, "{flood_threads} threads");

    // Every hostile connection is dropped by the server: the ones over the
    // limit at once, idle and trickling ones at the handshake deadline,
    // the deaf one at the send timeout. (Bounded waits, generous.)
    for s in &mut over {
        assert!(
            dropped_within(s, Duration::from_secs(30)),
            "over-limit connection kept"
        );
    }
    for s in idle.iter_mut().chain(trickling.iter_mut()) {
        assert!(
            dropped_within(s, Duration::from_secs(30)),
            "idle/trickling connection outlived the handshake deadline"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for t in tricklers {
        t.join().unwrap();
    }
    // The deaf client: the server gives up on it once its replies stop
    // moving for the send timeout. Only then read its socket (reading
    // earlier would make it a client that reads): what the kernel had
    // buffered comes out, then the end.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !srv
        .log_text()
        .contains("dropping client: reply write failed")
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(deaf);
    assert!(
        dropped_within(&mut deaf_sock, Duration::from_secs(60)),
        "a client that never reads was not dropped; server log:\n{}",
        srv.log_text()
    );
    // And the normal client still works.
    let back = normal
        .call(CMD_READ, 0, 128 << 20, 4096, &[])
        .unwrap()
        .unwrap();
    assert_eq!(back.len(), 4096);
    normal.disconnect().unwrap();
    srv.stop_cleanly();
}

/// The server's threads are a fixed set: the count with one client is the
/// count with 64 more connections open, idle after the handshake or stuck
/// in the middle of it. (No timing: the connections are all accepted and
/// past their first handshake bytes before the count is taken.)
#[test]
fn thread_count_does_not_depend_on_the_number_of_connections() {
    let dir = TempDir::new("threads");
    let img = dir.path("a.img");
    format_volume(&img, "64M");
    let srv = ServerProc::start(
        &[
            img.to_str().unwrap(),
            "--max-connections",
            "200",
            "--handshake-timeout",
            "120",
        ],
        None,
    );
    let tcp = srv.tcp.clone().unwrap();
    let pid = srv.pid();
    let idle_server = threads(pid);

    let mut first = Client::connect(&Address::Tcp(tcp.clone()), "").unwrap();
    let data = pattern(1, 4096);
    first
        .call(CMD_WRITE, CMD_FLAG_FUA, 0, 4096, &data)
        .unwrap()
        .unwrap();
    assert_eq!(
        first.call(CMD_READ, 0, 0, 4096, &[]).unwrap().unwrap(),
        data
    );
    let one_client = threads(pid);

    // 48 clients through the whole handshake, then idle in transmission.
    let mut idle: Vec<Client> = (0..48)
        .map(|_| Client::connect(&Address::Tcp(tcp.clone()), "").unwrap())
        .collect();
    // 16 in the middle of the handshake: greeting received, client flags
    // and half an option header sent, then silence.
    let mid: Vec<TcpStream> = (0..16)
        .map(|_| {
            let mut s = TcpStream::connect(&tcp).unwrap();
            let mut greeting = [0u8; 18];
            s.read_exact(&mut greeting).unwrap();
            s.write_all(&FLAG_C_FIXED_NEWSTYLE.to_be_bytes()).unwrap();
            s.write_all(&IHAVEOPT.to_be_bytes()).unwrap();
            s
        })
        .collect();
    let sixty_five = threads(pid);
    eprintln!(
        "server threads: {idle_server} idle, {one_client} with 1 client, {sixty_five} with 65 connections"
    );
    assert_eq!(
        one_client, sixty_five,
        "the server's thread count grew with its connections"
    );
    // (Requests are sent only now: a worker that finishes a job counts
    // itself idle just after its reply leaves, so back-to-back requests
    // may start another worker — that depends on timing, not connections.)
    // Every one of them is being served: the idle ones answer too.
    for c in idle.iter_mut().step_by(8) {
        assert_eq!(c.call(CMD_READ, 0, 0, 4096, &[]).unwrap().unwrap(), data);
    }
    drop(mid);
    for c in idle {
        c.disconnect().unwrap();
    }
    first.disconnect().unwrap();
    srv.stop_cleanly();
}

/// `jbdev_nbd_requests_total` of READs on the default export.
fn reads_run(m: &std::collections::HashMap<String, f64>) -> f64 {
    m.get(r#"jbdev_nbd_requests_total{export="",command="read"}"#)
        .copied()
        .unwrap_or(0.0)
}

/// A client that pipelines 16 MiB READs and never reads a reply is dropped
/// at the send timeout; from then on none of its requests is carried out
/// and its connection slot is free. Before, the reader went on parsing what
/// the client sent (Linux still takes data on a socket whose read side is
/// shut down) and the server read ~50 GiB for a dropped client, with the
/// connection counted open, for as long as the client kept sending.
#[test]
fn a_dropped_client_s_requests_are_not_carried_out() {
    let dir = TempDir::new("dropped");
    let img = dir.path("a.img");
    format_volume(&img, "256M");
    let srv = ServerProc::start(
        &[
            img.to_str().unwrap(),
            "--send-timeout",
            "2",
            "--metrics",
            "127.0.0.1:0",
        ],
        None,
    );
    let url = srv.metrics_url();
    let sock = TcpStream::connect(srv.tcp.clone().unwrap()).unwrap();
    let mut deaf = Client::handshake(
        Box::new(sock.try_clone().unwrap()),
        Box::new(sock.try_clone().unwrap()),
        "",
    )
    .unwrap();
    // Sends until the server closes the connection (bounded).
    let sender = std::thread::spawn(move || {
        let mut sent = 0u64;
        for i in 0..1_000_000u64 {
            let queued = deaf
                .writer
                .queue(CMD_READ, 0, i, (i % 16) << 24, 16 << 20, &[]);
            if queued.is_err() || deaf.writer.flush().is_err() {
                break;
            }
            sent += 1;
        }
        sent
    });
    srv.wait_for_log("dropping client: reply write failed");
    let open = || scrape_metrics(&url)["jbdev_nbd_connections_open"];
    assert!(
        poll_until(Duration::from_secs(60), || open() == 0.0),
        "the dropped client's connection is still open; {} reads run so far",
        reads_run(&scrape_metrics(&url))
    );
    let at_close = reads_run(&scrape_metrics(&url));
    let sent = sender.join().unwrap();
    let after = reads_run(&scrape_metrics(&url));
    eprintln!("client sent {sent} reads; the server ran {after}");
    assert_eq!(at_close, after, "reads ran after the connection closed");
    // What ran is what the client's in-flight limit (64 MiB: 4 reads) and
    // the socket buffers let through before the drop.
    assert!(
        after < 64.0,
        "{after} reads of 16 MiB were run for a client that never read a reply"
    );
    srv.stop_cleanly();
}

/// True if the server has not closed `s` (nothing to read yet, no EOF).
fn still_open(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let open =
        matches!(s.peek(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    s.set_nonblocking(false).unwrap();
    open
}

/// Four connections each send the header of a 64 MiB WRITE and 1 MiB of
/// its payload, then stall (within the 30 s payload timeout): together
/// they would hold the whole 256 MiB payload-buffer budget. A normal
/// client's 4 KiB and 64 KiB requests are served meanwhile, from its own
/// share of the budget. Before, they waited until the stallers were
/// dropped (27-29 s in the report), so this test found the stallers gone.
#[test]
fn clients_holding_large_payload_buffers_do_not_stall_small_requests() {
    const STALLERS: usize = 4;
    let dir = TempDir::new("stalled-payloads");
    let img = dir.path("a.img");
    format_volume(&img, "256M");
    let srv = ServerProc::start(&[img.to_str().unwrap(), "--metrics", "127.0.0.1:0"], None);
    let url = srv.metrics_url();
    let tcp = srv.tcp.clone().unwrap();
    let mut normal = Client::connect(&Address::Tcp(tcp.clone()), "").unwrap();
    let stallers: Vec<(TcpStream, Client)> = (0..STALLERS)
        .map(|i| {
            let s = TcpStream::connect(&tcp).unwrap();
            let mut c = Client::handshake(
                Box::new(s.try_clone().unwrap()),
                Box::new(s.try_clone().unwrap()),
                "",
            )
            .unwrap();
            c.writer
                .queue(
                    CMD_WRITE,
                    0,
                    1,
                    (i as u64) << 26,
                    64 << 20,
                    &[0x5a; 1 << 20],
                )
                .unwrap();
            c.writer.flush().unwrap();
            (s, c)
        })
        .collect();
    let held = || scrape_metrics(&url)["jbdev_nbd_payload_buffer_bytes"];
    // The stallers hold at least three 64 MiB buffers (the shared part of
    // the budget, 224 MiB, takes three; the old pool took all four).
    assert!(
        poll_until(Duration::from_secs(20), || held()
            >= f64::from(3 * (64 << 20))),
        "the stallers' buffers were not taken: {}",
        held()
    );
    for round in 0..8u64 {
        let len = if round % 2 == 0 { 4096 } else { 64 << 10 };
        let data = pattern(round, len);
        let off = (250 << 20) + round * (64 << 10);
        normal
            .call(CMD_WRITE, 0, off, len as u32, &data)
            .unwrap()
            .unwrap_or_else(|e| panic!("write {round}: NBD error {e}"));
        let back = normal
            .call(CMD_READ, 0, off, len as u32, &[])
            .unwrap()
            .unwrap();
        assert!(back == data, "round {round}: read back differs");
    }
    // Served while the stallers were provably still there, holding.
    let still_held = held();
    assert!(
        still_held >= f64::from(3 * (64 << 20)),
        "the stallers let go before the normal client was served ({still_held} bytes held)"
    );
    for (s, _) in &stallers {
        assert!(
            still_open(s),
            "a staller was dropped before the normal client was served"
        );
    }
    normal.disconnect().unwrap();
    drop(stallers);
    srv.stop_cleanly();
}

/// A client over `--max-connections` is told why: every option it sends is
/// answered `ERR_POLICY` with the reason, which qemu-img prints,
/// where before the server closed at once and the client saw only "server
/// disconnected unexpectedly", like a crash (session 23's adversarial
/// pass). The server logs the refusal. The held connection is unaffected.
#[test]
fn a_client_over_the_connection_limit_is_told_why() {
    let dir = TempDir::new("refused");
    let img = dir.path("a.img");
    format_volume(&img, "64M");
    let srv = ServerProc::start(&[img.to_str().unwrap(), "--max-connections", "1"], None);
    let tcp = srv.tcp.clone().unwrap();
    let mut held = Client::connect(&Address::Tcp(tcp.clone()), "").unwrap();
    let uri = format!("nbd://{tcp}");
    let mut told = 0;
    if have_tool("nbdinfo", "a_client_over_the_connection_limit_is_told_why") {
        let out = run_tool("nbdinfo", &["--size", &uri], 30);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "nbdinfo got in: {err}");
        // libnbd prints the reply's code, not its text (the text is in its
        // debug output): "server policy prevents NBD_OPT_GO".
        assert!(err.contains("policy"), "nbdinfo said: {err}");
        told += 1;
    }
    if have_tool("qemu-img", "a_client_over_the_connection_limit_is_told_why") {
        let out = run_tool("qemu-img", &["info", &uri], 30);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "qemu-img got in: {err}");
        assert!(err.contains("too many connections"), "qemu-img said: {err}");
        told += 1;
    }
    // Our own client too (no tool needed).
    let e = Client::connect(&Address::Tcp(tcp.clone()), "")
        .err()
        .expect("a second client got in");
    assert!(e.to_string().contains("too many connections"), "{e}");
    srv.wait_for_log("refusing connection");
    eprintln!("refused {} clients with the reason", told + 1);
    let data = pattern(7, 4096);
    held.call(CMD_WRITE, CMD_FLAG_FUA, 0, 4096, &data)
        .unwrap()
        .unwrap();
    assert_eq!(held.call(CMD_READ, 0, 0, 4096, &[]).unwrap().unwrap(), data);
    held.disconnect().unwrap();
    srv.stop_cleanly();
}

/// `--idle-timeout`: a connection that sends nothing, with nothing in
/// flight, is closed, so silent connections cannot hold every
/// `--max-connections` slot for good (session 29's hostile pass: 128 of them
/// locked every other client out). A client that keeps sending requests
/// keeps its connection.
#[test]
fn idle_connections_are_closed_with_idle_timeout_and_busy_ones_kept() {
    let dir = TempDir::new("idle");
    let img = dir.path("a.img");
    format_volume(&img, "64M");
    let srv = ServerProc::start(
        &[
            img.to_str().unwrap(),
            "--max-connections",
            "2",
            "--idle-timeout",
            "2",
        ],
        None,
    );
    let tcp = srv.tcp.clone().unwrap();
    let mut idle = Client::connect(&Address::Tcp(tcp.clone()), "").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let (tcp, stop) = (tcp.clone(), stop.clone());
        let mut c = Client::connect(&Address::Tcp(tcp), "").unwrap();
        std::thread::spawn(move || {
            let data = pattern(3, 4096);
            c.call(CMD_WRITE, CMD_FLAG_FUA, 0, 4096, &data)
                .unwrap()
                .unwrap();
            let mut calls = 0u32;
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(c.call(CMD_READ, 0, 0, 4096, &[]).unwrap().unwrap(), data);
                calls += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            c.disconnect().unwrap();
            calls
        })
    };
    // Both slots are taken; a third client gets in once the idle one is
    // closed (bounded wait: a slot that never frees fails the test).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut third = loop {
        match Client::connect(&Address::Tcp(tcp.clone()), "") {
            Ok(c) => break c,
            Err(e) => {
                assert!(e.to_string().contains("too many connections"), "{e}");
                assert!(Instant::now() < deadline, "no slot freed: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    srv.wait_for_log("idle for 2 s (--idle-timeout)");
    assert!(
        idle.call(CMD_READ, 0, 0, 4096, &[]).is_err(),
        "the idle connection still answers"
    );
    let data = pattern(3, 4096);
    assert_eq!(
        third.call(CMD_READ, 0, 0, 4096, &[]).unwrap().unwrap(),
        data
    );
    third.disconnect().unwrap();
    stop.store(true, Ordering::Relaxed);
    let calls = busy.join().expect("the busy client failed");
    assert!(calls > 0);
    // A client silent halfway through a request (its WRITE's payload cut
    // short) is idle too: it was held until the 30 s payload timeout
    // (session 30's verify pass).
    let mut half = Client::connect(&Address::Tcp(tcp.clone()), "").unwrap();
    half.writer
        .queue(CMD_WRITE, 0, 7, 0, 4096, &[0x5A; 100])
        .unwrap();
    half.writer.flush().unwrap();
    srv.wait_for_log("halfway through a request (--idle-timeout)");
    assert!(
        half.call(CMD_READ, 0, 0, 4096, &[]).is_err(),
        "the connection silent mid-request still answers"
    );
    srv.stop_cleanly();
}
