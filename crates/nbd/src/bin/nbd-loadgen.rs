//! `nbd-loadgen`: random 4 KiB (or `--bs`) reads or writes against any NBD
//! server at a fixed queue depth, reporting IOPS and latency percentiles.
//! Written for the side-by-side benchmark (`scripts/bench-nbd.sh`) because
//! fio's nbd engine cannot send FUA.
//!
//! ```text
//! nbd-loadgen --addr 127.0.0.1:10809 --mode randwrite-fua --qd 32 --seconds 10
//! ```
#![deny(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jbdev_nbd::client::{Address, Client};
use jbdev_nbd::proto::{CMD_FLAG_FUA, CMD_READ, CMD_WRITE, FLAG_SEND_FUA};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Read,
    Write,
    WriteFua,
}

struct Args {
    addr: Address,
    export: String,
    mode: Mode,
    bs: u32,
    qd: u32,
    conns: u32,
    seconds: f64,
    max_ops: u64,
    span_bytes: Option<u64>,
    json: bool,
    label: String,
}

fn usage() -> ! {
    eprintln!(
        "usage: nbd-loadgen --addr HOST:PORT|unix:PATH [--export NAME] \
         [--mode randread|randwrite|randwrite-fua] [--bs 4096] [--qd 32] [--conns 1] \
         [--seconds 10] [--max-ops N] [--span BYTES] [--label NAME] [--json]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        addr: Address::Tcp("127.0.0.1:10809".into()),
        export: String::new(),
        mode: Mode::Read,
        bs: 4096,
        qd: 32,
        conns: 1,
        seconds: 10.0,
        max_ops: u64::MAX,
        span_bytes: None,
        json: false,
        label: String::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        if k == "--json" {
            a.json = true;
            continue;
        }
        let Some(v) = it.next() else { usage() };
        let num = |v: &str| v.parse::<u64>().unwrap_or_else(|_| usage());
        match k.as_str() {
            "--addr" => {
                a.addr = v.parse().unwrap_or_else(|e| {
                    eprintln!("{e}");
                    usage()
                })
            }
            "--export" => a.export = v,
            "--mode" => {
                a.mode = match v.as_str() {
                    "randread" => Mode::Read,
                    "randwrite" => Mode::Write,
                    "randwrite-fua" => Mode::WriteFua,
                    _ => usage(),
                }
            }
            "--bs" => a.bs = num(&v).clamp(1, 32 << 20) as u32,
            "--qd" => a.qd = num(&v).clamp(1, 1024) as u32,
            "--conns" => a.conns = num(&v).clamp(1, 64) as u32,
            "--seconds" => a.seconds = v.parse().unwrap_or_else(|_| usage()),
            "--max-ops" => a.max_ops = num(&v),
            "--span" => a.span_bytes = Some(num(&v)),
            "--label" => a.label = v,
            _ => usage(),
        }
    }
    a
}

/// splitmix64: a tiny, good-enough generator for offsets.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

struct ConnResult {
    hist: hdrhistogram::Histogram<u64>,
    errors: u64,
}

fn run_conn(
    a: &Args,
    conn_idx: u32,
    deadline: Instant,
    issued: &AtomicU64,
) -> std::io::Result<ConnResult> {
    let client = Client::connect(&a.addr, &a.export)?;
    if a.mode == Mode::WriteFua && client.transmission_flags & FLAG_SEND_FUA == 0 {
        return Err(std::io::Error::other("server does not support FUA"));
    }
    let size = client.size_bytes;
    let span = a.span_bytes.unwrap_or(size).min(size);
    let blocks = span / u64::from(a.bs);
    if blocks == 0 {
        return Err(std::io::Error::other("export smaller than one block"));
    }
    let Client {
        mut writer,
        mut reader,
        ..
    } = client;
    let qd = a.qd as usize;
    let start_ns: Arc<Vec<AtomicU64>> = Arc::new((0..qd).map(|_| AtomicU64::new(0)).collect());
    // Slots come back from the receiver through `free`; `available` holds
    // the ones the sender may use, `pending` counts requests on the wire.
    let (free_tx, free_rx) = crossbeam_channel::bounded::<usize>(qd);
    let mut available: Vec<usize> = (0..qd).collect();
    let mut pending = 0usize;
    let epoch = Instant::now();
    let mode = a.mode;
    let bs = a.bs;
    let read_len = if mode == Mode::Read { bs as usize } else { 0 };
    let starts = start_ns.clone();
    // Receiver: records latencies and frees slots.
    let receiver = std::thread::spawn(move || -> std::io::Result<ConnResult> {
        let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let mut errors = 0;
        loop {
            let (cookie, res) = match reader.recv(|_| read_len) {
                Ok(r) => r,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(e),
            };
            let slot = cookie as usize;
            let Some(t0) = starts.get(slot) else {
                return Err(std::io::Error::other("reply with an unknown cookie"));
            };
            let now_ns = epoch.elapsed().as_nanos() as u64;
            let lat_us = (now_ns.saturating_sub(t0.load(Ordering::Acquire)) / 1000).max(1);
            let _ = hist.record(lat_us);
            if res.is_err() {
                errors += 1;
            }
            if free_tx.send(slot).is_err() {
                break;
            }
        }
        Ok(ConnResult { hist, errors })
    });
    let mut rng = Rng(0x006a_6264_6576 ^ (u64::from(conn_idx) << 32));
    let payload: Vec<u8> = (0..bs).map(|i| (i as u8) ^ 0x5a).collect();
    'outer: loop {
        if available.is_empty() {
            // Block for one returned slot, take every other returned one
            // too, and send them all in one write.
            match free_rx.recv_timeout(Duration::from_secs(30)) {
                Ok(s) => available.push(s),
                Err(_) => break,
            }
            while let Ok(s) = free_rx.try_recv() {
                available.push(s);
            }
            pending -= available.len();
        }
        while let Some(slot) = available.pop() {
            if Instant::now() >= deadline || issued.fetch_add(1, Ordering::Relaxed) >= a.max_ops {
                available.push(slot);
                break 'outer;
            }
            let offset = (rng.next() % blocks) * u64::from(bs);
            start_ns[slot].store(epoch.elapsed().as_nanos() as u64, Ordering::Release);
            match mode {
                Mode::Read => writer.queue(CMD_READ, 0, slot as u64, offset, bs, &[])?,
                Mode::Write => writer.queue(CMD_WRITE, 0, slot as u64, offset, bs, &payload)?,
                Mode::WriteFua => {
                    writer.queue(CMD_WRITE, CMD_FLAG_FUA, slot as u64, offset, bs, &payload)?
                }
            }
            pending += 1;
        }
        writer.flush()?;
    }
    writer.flush()?;
    // Wait for the outstanding replies, then leave.
    let drain_deadline = Instant::now() + Duration::from_secs(30);
    while pending > 0 && Instant::now() < drain_deadline {
        if free_rx.recv_timeout(Duration::from_secs(1)).is_ok() {
            pending -= 1;
        }
    }
    writer.disconnect()?;
    drop(free_rx);
    receiver
        .join()
        .map_err(|_| std::io::Error::other("receiver thread panicked"))?
}

fn main() {
    let a = parse_args();
    let deadline = Instant::now() + Duration::from_secs_f64(a.seconds.max(0.1));
    let issued = AtomicU64::new(0);
    let started = Instant::now();
    let results: Vec<std::io::Result<ConnResult>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..a.conns)
            .map(|i| {
                let a = &a;
                let issued = &issued;
                s.spawn(move || run_conn(a, i, deadline, issued))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("panicked")))
            })
            .collect()
    });
    let elapsed_s = started.elapsed().as_secs_f64();
    let mut hist = match hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("nbd-loadgen: {e}");
            std::process::exit(1)
        }
    };
    let mut errors = 0;
    for r in results {
        match r {
            Ok(r) => {
                let _ = hist.add(&r.hist);
                errors += r.errors;
            }
            Err(e) => {
                eprintln!("nbd-loadgen: {e}");
                std::process::exit(1);
            }
        }
    }
    let ops = hist.len();
    let iops = ops as f64 / elapsed_s;
    let p = |q: f64| hist.value_at_quantile(q);
    let mode = match a.mode {
        Mode::Read => "randread",
        Mode::Write => "randwrite",
        Mode::WriteFua => "randwrite-fua",
    };
    if a.json {
        let v = serde_json::json!({
            "label": a.label, "mode": mode, "bs": a.bs, "qd": a.qd, "conns": a.conns,
            "seconds": elapsed_s, "ops": ops, "errors": errors, "iops": iops,
            "lat_us": {"mean": hist.mean(), "p50": p(0.5), "p90": p(0.9), "p99": p(0.99),
                        "p99_9": p(0.999), "max": hist.max()},
        });
        println!("{v}");
    } else {
        println!(
            "{} mode={mode} bs={} qd={} conns={} ops={ops} errors={errors} secs={elapsed_s:.2} iops={iops:.0} \
             lat_us: mean={:.0} p50={} p90={} p99={} p99.9={} max={}",
            a.label,
            a.bs,
            a.qd,
            a.conns,
            hist.mean(),
            p(0.5),
            p(0.9),
            p(0.99),
            p(0.999),
            hist.max()
        );
    }
    if errors > 0 {
        std::process::exit(1);
    }
}
