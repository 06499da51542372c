//! `jbdev serve --metrics`: scraped with curl while real NBD clients
//! (nbdcopy, qemu-io, and the crate's own client holding a connection open)
//! load the server binary; the counters must move as the load did.

mod nbd_common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nbd_common::*;

/// One scrape: `name{labels}` -> value, as printed.
type Scrape = HashMap<String, f64>;

fn curl(url: &str) -> (u32, String) {
    let out = run_tool(
        "curl",
        &[
            "-sS",
            "--max-time",
            "10",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            url,
        ],
        20,
    );
    assert!(out.status.success(), "curl {url}: {:?}", out);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("curl printed the status");
    (code.trim().parse().expect("http status"), body.to_string())
}

fn scrape(url: &str) -> Scrape {
    let (code, body) = curl(url);
    assert_eq!(code, 200, "{body}");
    assert!(
        body.trim_end().ends_with("# EOF"),
        "not a complete exposition:\n{body}"
    );
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').expect("sample line");
            (k.to_string(), v.parse::<f64>().expect("sample value"))
        })
        .collect()
}

fn get(s: &Scrape, key: &str) -> f64 {
    *s.get(key)
        .unwrap_or_else(|| panic!("{key} not in scrape: {:?}", s.keys()))
}

/// The one sample of `name` whatever its labels (e.g. the volume path).
fn only(s: &Scrape, name: &str) -> f64 {
    let hits: Vec<f64> = s
        .iter()
        .filter(|(k, _)| k.starts_with(&format!("{name}{{")))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(hits.len(), 1, "{name}: {hits:?}");
    hits[0]
}

#[test]
fn counters_follow_an_nbd_load() {
    let test = "counters_follow_an_nbd_load";
    if !have_tool("curl", test) || !have_tool("qemu-io", test) || !have_tool("nbdcopy", test) {
        return;
    }
    let dir = TempDir::new("metrics");
    let img = dir.path("m.img");
    format_volume(&img, "64M");
    let srv = ServerProc::start(&[img.to_str().unwrap(), "--metrics", "127.0.0.1:0"], None);
    let url = srv.metrics_url();
    let uri = srv.tcp_uri();
    let before = scrape(&url);
    assert_eq!(get(&before, "jbdev_nbd_connections_open"), 0.0);
    let w = r#"{export="",command="write"}"#;

    // A connection held open shows up.
    let addr: jbdev_nbd::client::Address = srv.tcp.clone().unwrap().parse().unwrap();
    let held = jbdev_nbd::client::Client::connect(&addr, "").expect("nbd connect");
    assert_eq!(get(&scrape(&url), "jbdev_nbd_connections_open"), 1.0);
    held.disconnect().unwrap();

    // nbdcopy 16 MiB of random data in, scraping while it runs.
    let src = dir.path("random.bin");
    let mut data = vec![0u8; 16 << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = (x >> 24) as u8 | 1; // never zero: nbdcopy must write every byte
    }
    std::fs::write(&src, &data).unwrap();
    let mut copy = Command::new("timeout")
        .args(["-k", "5", "120", "nbdcopy", src.to_str().unwrap(), &uri])
        .env("PATH", tool_path())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn nbdcopy");
    let deadline = Instant::now() + Duration::from_secs(150);
    let mut scrapes_during_load = 0;
    let status = loop {
        if let Some(st) = copy.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "nbdcopy did not finish");
        if scrapes_during_load < 50 {
            scrape(&url); // must answer a full exposition under load
            scrapes_during_load += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "nbdcopy failed: {status}");

    // qemu-io: a plain write, a FUA write, a flush, and a read back.
    let out = run_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x5a 20M 1M",
            "-c",
            "write -f -P 0x6b 21M 64k",
            "-c",
            "flush",
            "-c",
            "read -P 0x5a 20M 1M",
            &uri,
        ],
        120,
    );
    assert!(!out.contains("fail"), "{out}");

    let after = scrape(&url);
    let delta = |k: &str| get(&after, k) - before.get(k).copied().unwrap_or(0.0);
    let written = delta(r#"jbdev_nbd_written_bytes_total{export=""}"#);
    assert_eq!(
        written,
        f64::from((16u32 << 20) + (1 << 20) + (64 << 10)),
        "bytes written by nbdcopy and qemu-io"
    );
    assert!(delta(r#"jbdev_nbd_read_bytes_total{export=""}"#) >= f64::from(1u32 << 20));
    let writes = delta(&format!("jbdev_nbd_requests_total{w}"));
    assert!(writes >= 3.0, "write requests: {writes}");
    assert_eq!(
        delta(&format!("jbdev_nbd_request_duration_seconds_count{w}")),
        writes,
        "the histogram counts every write"
    );
    let inf_bucket =
        r#"jbdev_nbd_request_duration_seconds_bucket{le="+Inf",export="",command="write"}"#;
    let inf_key = if after.contains_key(inf_bucket) {
        inf_bucket.to_string()
    } else {
        // Label order of the bucket line is the encoder's choice.
        after
            .keys()
            .find(|k| {
                k.starts_with("jbdev_nbd_request_duration_seconds_bucket")
                    && k.contains("+Inf")
                    && k.contains(r#"command="write""#)
            })
            .expect("+Inf bucket of writes")
            .clone()
    };
    assert_eq!(delta(&inf_key), writes);
    assert!(delta(r#"jbdev_nbd_durability_requests_total{export="",kind="fua"}"#) >= 1.0);
    assert!(delta(r#"jbdev_nbd_durability_requests_total{export="",kind="flush"}"#) >= 1.0);
    assert!(only(&after, "jbdev_commits_total") > only(&before, "jbdev_commits_total"));
    assert!(
        only(&after, "jbdev_journaled_blocks_total")
            > only(&before, "jbdev_journaled_blocks_total")
    );
    // nbdcopy's 256 KiB writes and qemu-io's 1 MiB one go straight home,
    // each from its request's own payload buffer (no copy on the way).
    let direct =
        only(&after, "jbdev_direct_writes_total") - only(&before, "jbdev_direct_writes_total");
    let uncopied = only(&after, "jbdev_direct_writes_uncopied_total")
        - only(&before, "jbdev_direct_writes_uncopied_total");
    assert!(direct >= 65.0, "direct writes: {direct}");
    assert_eq!(uncopied, direct, "direct writes from the payload buffer");
    // Write pacing is off unless asked for (`--write-pacing`).
    assert_eq!(only(&after, "jbdev_paced_writes_total"), 0.0);
    assert_eq!(only(&after, "jbdev_pace_sleep_milliseconds_total"), 0.0);
    // Read retries are counted (how many depends on timing).
    assert!(only(&after, "jbdev_read_retries_total") >= 0.0);
    assert!(only(&after, "jbdev_locked_reads_total") <= only(&after, "jbdev_read_retries_total"));
    let fill = only(&after, "jbdev_journal_fill_ratio");
    assert!((0.0..=1.0).contains(&fill), "fill {fill}");
    assert_eq!(
        get(&after, r#"jbdev_nbd_requests_in_flight{export=""}"#),
        0.0
    );
    assert!(get(&after, "process_threads") >= 2.0);
    assert!(get(&after, "process_resident_memory_bytes") > 0.0);
    assert!(
        !after
            .keys()
            .any(|k| k.starts_with("jbdev_nbd_errors_total")),
        "no request failed"
    );

    // Other paths and garbage get HTTP errors, and the endpoint keeps serving.
    let base = url.trim_end_matches("/metrics");
    assert_eq!(curl(&format!("{base}/nope")).0, 404);
    let mut raw = std::net::TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    raw.write_all(b"\x00\xffgarbage\r\n\r\n").unwrap();
    let mut reply = String::new();
    let _ = raw.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.0 400"), "{reply:?}");
    scrape(&url);

    // The metrics never keep the volume open: shutdown closes it cleanly.
    let log = srv.log.clone();
    assert!(srv.stop(), "serve exits cleanly");
    let log = log.lock().unwrap().join("\n");
    assert!(!log.contains("still in use at exit"), "{log}");
    let info = run_ok(JBDEV, &["info", img.to_str().unwrap()], 60);
    assert!(info.contains("clean"), "{info}");
}

/// Requests the server answers itself, without the volume (a write to a
/// read-only export, a read past the end, an unknown command), are counted
/// with their errno, and so is CACHE; and a client trickling its HTTP
/// request a byte at a time holds the endpoint for at most one exchange's
/// deadline (it used to renew a per-read timeout for as long as it liked,
/// so every scrape behind it timed out).
#[test]
fn rejected_requests_are_counted_and_a_trickling_scraper_is_cut_off() {
    use jbdev_nbd::proto::*;
    let test = "rejected_requests_are_counted_and_a_trickling_scraper_is_cut_off";
    if !have_tool("curl", test) {
        return;
    }
    let dir = TempDir::new("metrics-rej");
    let img = dir.path("r.img");
    format_volume(&img, "16M");
    let srv = ServerProc::start(
        &[
            img.to_str().unwrap(),
            "--read-only",
            "--metrics",
            "127.0.0.1:0",
        ],
        None,
    );
    let url = srv.metrics_url();
    let addr: jbdev_nbd::client::Address = srv.tcp.clone().unwrap().parse().unwrap();
    let mut c = jbdev_nbd::client::Client::connect(&addr, "").expect("nbd connect");
    assert_eq!(
        c.call(CMD_WRITE, 0, 0, 4096, &[1; 4096]).unwrap(),
        Err(EPERM)
    );
    assert_eq!(c.call(CMD_TRIM, 0, 0, 4096, &[]).unwrap(), Err(EPERM));
    assert_eq!(
        c.call(CMD_READ, 0, 16 << 20, 4096, &[]).unwrap(),
        Err(EINVAL)
    );
    assert_eq!(c.call(CMD_CACHE, 0, 0, 4096, &[]).unwrap(), Ok(Vec::new()));
    assert_eq!(c.call(42, 0, 0, 0, &[]).unwrap(), Err(EINVAL));
    c.disconnect().unwrap();
    let m = scrape(&url);
    let count = |cmd: &str| {
        get(
            &m,
            &format!(r#"jbdev_nbd_requests_total{{export="",command="{cmd}"}}"#),
        )
    };
    let errors = |cmd: &str, errno: &str| {
        get(
            &m,
            &format!(r#"jbdev_nbd_errors_total{{export="",command="{cmd}",errno="{errno}"}}"#),
        )
    };
    assert_eq!(count("write"), 1.0);
    assert_eq!(errors("write", "EPERM"), 1.0);
    assert_eq!(errors("trim", "EPERM"), 1.0);
    assert_eq!(count("read"), 1.0);
    assert_eq!(errors("read", "EINVAL"), 1.0);
    assert_eq!(count("cache"), 1.0);
    assert_eq!(errors("other", "EINVAL"), 1.0);

    // One byte every 500 ms for at most 60 s: before, each byte renewed a
    // 5 s read timeout, so the scrape below waited the whole minute.
    let addr = metrics_addr(&url);
    let trickler = std::thread::spawn(move || {
        let mut t = std::net::TcpStream::connect(&addr).unwrap();
        let start = Instant::now();
        let mut sent = 0;
        while start.elapsed() < Duration::from_secs(60) {
            if t.write_all(b"G").is_err() {
                break; // the server cut it off
            }
            sent += 1;
            std::thread::sleep(Duration::from_millis(500));
        }
        sent
    });
    std::thread::sleep(Duration::from_millis(200));
    // curl gives up after 10 s (see `curl`).
    let again = scrape(&url);
    assert!(
        get(
            &again,
            r#"jbdev_nbd_requests_total{export="",command="write"}"#
        ) >= 1.0
    );
    let sent = trickler.join().unwrap();
    assert!(
        sent < 120,
        "the trickling client was never cut off ({sent} bytes)"
    );
    assert!(srv.stop(), "server did not shut down cleanly");
}

#[test]
fn a_bad_metrics_address_is_an_error() {
    let dir = TempDir::new("metrics-bad");
    let img = dir.path("m.img");
    format_volume(&img, "16M");
    let out = run_tool(
        JBDEV,
        &["serve", img.to_str().unwrap(), "--metrics", "nonsense"],
        30,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad metrics address"), "{err}");
}

#[test]
fn stats_and_info_show_a_live_server() {
    let dir = TempDir::new("stats");
    let img = dir.path("s.img");
    format_volume(&img, "64M");
    let srv = ServerProc::start(&[img.to_str().unwrap(), "--metrics", "127.0.0.1:0"], None);
    let url = srv.metrics_url();
    let port = url
        .trim_end_matches("/metrics")
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();

    // Writes through a connection that stays open while `stats` runs.
    let c = client_after_fua_writes(&srv, "", 32);
    let out = run_ok(JBDEV, &["stats", &port, "--interval", "0.2"], 60);
    assert!(out.contains("1 connection(s)"), "{out}");
    assert!(out.contains("(default)"), "{out}");
    assert!(out.contains("s.img"), "{out}");
    let out = run_ok(
        JBDEV,
        &[
            "stats",
            &url,
            "--watch",
            "--count",
            "2",
            "--interval",
            "0.2",
        ],
        60,
    );
    assert_eq!(out.matches("commits/s").count(), 2, "{out}");

    // `info` on the served volume says so and still prints the superblock.
    let info = run_ok(JBDEV, &["info", img.to_str().unwrap()], 60);
    assert!(info.contains("OPEN ELSEWHERE"), "{info}");
    assert!(info.contains(&format!("pid {}", srv.pid())), "{info}");
    assert!(info.contains("journal state"), "{info}");
    let json = run_ok(JBDEV, &["info", "--json", img.to_str().unwrap()], 60);
    assert!(json.contains("\"open_elsewhere\": true"), "{json}");
    c.disconnect().unwrap();
    assert!(srv.stop());
    let info = run_ok(JBDEV, &["info", img.to_str().unwrap()], 60);
    assert!(!info.contains("OPEN ELSEWHERE"), "{info}");
}

/// Idle connections to the metrics port (connected, sending nothing) do
/// not hold up a scrape: connections are answered concurrently. Before,
/// they were answered one at a time and each idle one delayed every
/// scrape behind it by 5 s (20.5 s with four), past curl's limit here.
#[test]
fn idle_metrics_connections_do_not_block_a_scrape() {
    let dir = TempDir::new("metrics-idle");
    let img = dir.path("m.img");
    format_volume(&img, "16M");
    let srv = ServerProc::start(&[img.to_str().unwrap(), "--metrics", "127.0.0.1:0"], None);
    let url = srv.metrics_url();
    let addr = metrics_addr(&url);
    let idle: Vec<std::net::TcpStream> = (0..8)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    // A scrape that waits for the idle ones fails here: the socket's read
    // times out before the idle connections would (8 x 5 s in line).
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("scrape answered");
    assert!(reply.starts_with("HTTP/1.0 200"), "{reply}");
    assert!(reply.contains("jbdev_nbd_connections_open"), "{reply}");
    // The idle connections were still open while the scrape was answered:
    // the server closes each only at the 5 s deadline from its accept.
    for c in &idle {
        c.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        assert!(
            matches!(c.peek(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "an idle connection was closed before the scrape was answered"
        );
    }
    drop(idle);
    assert!(srv.stop(), "server did not shut down cleanly");
}
