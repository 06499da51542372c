//! Helpers shared by the `nbd_*` integration tests: temporary directories,
//! a `jbdev serve` child process, and external tools with time limits.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const JBDEV: &str = env!("CARGO_BIN_EXE_jbdev");

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let p = std::env::temp_dir().join(format!("jbdev-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).expect("create temp dir");
        Self(p)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// True if `tool` runs; otherwise prints why the caller skips.
pub fn have_tool(tool: &str, test: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .env("PATH", tool_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("SKIP {test}: `{tool}` is not installed (CI installs it)");
    }
    ok
}

/// PATH with /usr/bin first: nbdsh runs `python3 -m nbd`, and the libnbd
/// Python module lives in the system Python, not in a pyenv one.
pub fn tool_path() -> String {
    format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default())
}

/// Runs `tool args` under `timeout`, returning its output.
pub fn run_tool(tool: &str, args: &[&str], limit_s: u32) -> Output {
    let out = Command::new("timeout")
        .arg("-k")
        .arg("5")
        .arg(limit_s.to_string())
        .arg(tool)
        .args(args)
        .env("PATH", tool_path())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {tool}: {e}"));
    out
}

/// Like [`run_tool`] but fails the test on a non-zero exit.
pub fn run_ok(tool: &str, args: &[&str], limit_s: u32) -> String {
    let out = run_tool(tool, args, limit_s);
    assert!(
        out.status.success(),
        "{tool} {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `jbdev serve ARGS` and checks that it refuses them before serving,
/// with `want` in its error.
pub fn assert_serve_refuses(args: &[&str], want: &str) {
    let mut a = vec!["serve"];
    a.extend(args);
    let out = run_tool(JBDEV, &a, 30);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} was accepted: {err}");
    assert!(err.contains(want), "{args:?}: {err}");
    assert!(!err.contains("listening on"), "{args:?} served: {err}");
}

/// [`assert_serve_refuses`], for a mistake in the flags themselves: the
/// exit status is 64 (EX_USAGE), as for clap's own usage errors.
pub fn assert_serve_usage_error(args: &[&str], want: &str) {
    assert_serve_refuses(args, want);
    let mut a = vec!["serve"];
    a.extend(args);
    let out = run_tool(JBDEV, &a, 30);
    assert_eq!(
        out.status.code(),
        Some(64),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Formats a volume with the CLI.
pub fn format_volume(path: &Path, size: &str) {
    let p = path.to_str().expect("utf-8 path");
    run_ok(JBDEV, &["format", p, "--size", size], 120);
}

/// Formats `img` with its journal in the file `jnl`.
pub fn format_with_journal(img: &Path, jnl: &Path, size: &str, journal_size: &str) {
    let (i, j) = (img.to_str().expect("utf-8"), jnl.to_str().expect("utf-8"));
    run_ok(
        JBDEV,
        &[
            "format",
            i,
            "--size",
            size,
            "--journal",
            j,
            "--journal-size",
            journal_size,
        ],
        120,
    );
}

/// A connection to `export` of `srv` that has written `blocks` 4 KiB
/// blocks of 0x42 with FUA from offset 0, each acknowledged.
pub fn client_after_fua_writes(
    srv: &ServerProc,
    export: &str,
    blocks: u64,
) -> jbdev_nbd::client::Client {
    let addr: jbdev_nbd::client::Address = srv.tcp.clone().unwrap().parse().unwrap();
    let mut c = jbdev_nbd::client::Client::connect(&addr, export).expect("nbd connect");
    for i in 0..blocks {
        let reply = c
            .call(
                jbdev_nbd::proto::CMD_WRITE,
                jbdev_nbd::proto::CMD_FLAG_FUA,
                i * 4096,
                4096,
                &[0x42; 4096],
            )
            .expect("write");
        assert!(reply.is_ok(), "write {i} failed: {reply:?}");
    }
    c
}

/// A running `jbdev serve`.
pub struct ServerProc {
    pub child: Child,
    pub tcp: Option<String>,
    pub unix: Option<PathBuf>,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl ServerProc {
    /// Starts `jbdev serve ARGS --listen 127.0.0.1:0 [--socket SOCK]` and
    /// waits for its "listening on" lines.
    pub fn start(args: &[&str], socket: Option<&Path>) -> Self {
        Self::try_start(args, socket)
            .unwrap_or_else(|log| panic!("jbdev serve did not start: {log}"))
    }

    /// [`ServerProc::start`], or the server's log if it did not start.
    pub fn try_start(args: &[&str], socket: Option<&Path>) -> Result<Self, String> {
        let mut cmd = Command::new(JBDEV);
        cmd.arg("serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0"]);
        if let Some(s) = socket {
            cmd.arg("--socket").arg(s);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // Per-connection lines (negotiated header mode) are debug.
            .env("JBDEV_LOG", "info,jbdev_nbd::server=debug");
        let mut child = cmd.spawn().expect("spawn jbdev serve");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("jbdev serve: listening on ") {
                    let _ = tx.send(addr.to_string());
                }
                log2.lock().unwrap().push(line);
            }
        });
        let want = 1 + usize::from(socket.is_some());
        let mut tcp = None;
        let mut unix = None;
        // A bound, not a timing check: a `--break-lock` start waits up to
        // osd_client_watch_timeout (30 s) + 10 s for a killed holder's
        // watch to expire before it breaks the lock.
        let deadline = Instant::now() + Duration::from_secs(120);
        for _ in 0..want {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(addr) = rx.recv_timeout(left) else {
                let _ = child.kill();
                let _ = child.wait();
                return Err(log.lock().unwrap().join("\n"));
            };
            if addr.starts_with('/') {
                unix = Some(PathBuf::from(addr));
            } else {
                tcp = Some(addr);
            }
        }
        Ok(Self {
            child,
            tcp,
            unix,
            log,
        })
    }

    pub fn tcp_uri(&self) -> String {
        format!("nbd://{}", self.tcp.as_ref().expect("tcp listener"))
    }

    pub fn unix_uri(&self) -> String {
        format!(
            "nbd+unix:///?socket={}",
            self.unix.as_ref().expect("unix listener").display()
        )
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends signal `sig` ("TERM", "HUP" ...) with kill(1).
    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status();
        assert!(st.is_ok_and(|s| s.success()), "kill -{sig} failed");
    }

    /// Its exit status once it has exited, waiting at most `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM and wait (bounded); returns whether it exited successfully.
    pub fn stop(mut self) -> bool {
        self.signal("TERM");
        match self.wait_exit(Duration::from_secs(60)) {
            Some(st) => st.success(),
            None => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                false
            }
        }
    }

    /// [`ServerProc::stop`], failing the test with the server's log if it
    /// did not exit successfully.
    pub fn stop_cleanly(self) {
        let log = self.log_text();
        assert!(self.stop(), "server did not stop cleanly:\n{log}");
    }

    /// SIGKILL (a crash) and reap.
    pub fn crash(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Waits (at most a minute) until the server's log holds `what`.
    pub fn wait_for_log(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.log_text().contains(what) {
            assert!(
                Instant::now() < deadline,
                "no {what:?} in the server's log after a minute:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The URL of a server started with `--metrics`, from its log.
    pub fn metrics_url(&self) -> String {
        let log = self.log.lock().unwrap().clone();
        let line = log
            .iter()
            .find_map(|l| l.strip_prefix("jbdev serve: metrics on "))
            .unwrap_or_else(|| panic!("no metrics line in {log:?}"));
        line.to_string()
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        // Never leave a server behind, even when a test fails.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Deterministic pseudo-random bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The `HOST:PORT` of a `--metrics` URL (`http://HOST:PORT/metrics`).
pub fn metrics_addr(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .to_string()
}

/// One scrape of a `--metrics` URL over a plain socket (no curl needed):
/// `name{labels}` -> value. Panics if the server does not answer within
/// 30 s (a bound, not a timing check).
pub fn scrape_metrics(url: &str) -> std::collections::HashMap<String, f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(metrics_addr(url)).expect("connect to metrics");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("metrics reply");
    assert!(text.starts_with("HTTP/1.0 200"), "{text}");
    let body = text.split_once("\r\n\r\n").expect("HTTP head").1;
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse::<f64>().ok()?))
        })
        .collect()
}

/// Polls `cond` every 50 ms until it holds, at most `limit`; true if it did.
pub fn poll_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
