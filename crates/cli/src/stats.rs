//! `jbdev stats TARGET [--watch]`: a running server's metrics as a compact
//! table, like iostat.
//!
//! TARGET is the address `jbdev serve --metrics` prints. Rates are deltas
//! between two scrapes `--interval` seconds apart (one report without
//! `--watch`; one per interval with it), so they describe now, not the
//! server's lifetime. Everything read from the socket is untrusted: the
//! parser skips what it does not understand and never panics.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

#[derive(clap::Args)]
pub struct StatsArgs {
    /// Metrics address of `jbdev serve --metrics`: ADDR:PORT, PORT (on
    /// 127.0.0.1) or http://ADDR:PORT/metrics.
    pub target: String,
    /// Keep printing a report every interval until interrupted (or --count).
    #[arg(long)]
    pub watch: bool,
    /// Seconds between the scrapes a report's rates are taken over.
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    pub interval: f64,
    /// Stop after this many reports (with --watch).
    #[arg(long)]
    pub count: Option<u64>,
}

/// Largest metrics response read (a server with many exports is ~100 KiB).
const MAX_RESPONSE_BYTES: u64 = 16 << 20;
const NET_TIMEOUT: Duration = Duration::from_secs(5);

pub fn run(a: StatsArgs) -> anyhow::Result<()> {
    if !(0.05..=3600.0).contains(&a.interval) {
        bail!("--interval must be between 0.05 and 3600 seconds");
    }
    let (host, path) = parse_target(&a.target)?;
    let interval = Duration::from_secs_f64(a.interval);
    let reports = if a.watch { a.count } else { Some(1) };
    let mut prev = scrape(&host, &path)?;
    let mut done = 0u64;
    while reports.is_none_or(|n| done < n) {
        std::thread::sleep(interval);
        let now = scrape(&host, &path)?;
        out!("{}", render(&host, &prev, &now))?;
        prev = now;
        done += 1;
    }
    Ok(())
}

/// `(host:port, path)` from ADDR:PORT, PORT or an http:// URL.
fn parse_target(t: &str) -> anyhow::Result<(String, String)> {
    if std::path::Path::new(t).exists() {
        bail!(
            "{t} is a file: `jbdev stats` reads a running server's metrics. Serve it with \
             `jbdev serve {t} --metrics 127.0.0.1:10810`, then run `jbdev stats 127.0.0.1:10810` \
             (`jbdev info {t}` shows an idle volume)"
        );
    }
    if let Ok(port) = t.parse::<u16>() {
        return Ok((format!("127.0.0.1:{port}"), "/metrics".into()));
    }
    let rest = t.strip_prefix("http://").unwrap_or(t);
    if rest.starts_with("https://") || t.starts_with("https://") {
        bail!("https is not supported; the metrics endpoint is plain HTTP on loopback");
    }
    let (host, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, "/metrics"),
    };
    if !host.contains(':') {
        bail!("bad target {t:?}: expected ADDR:PORT, PORT or http://ADDR:PORT/metrics");
    }
    Ok((host.to_string(), path.to_string()))
}

/// One scrape: when, and every sample.
struct Scrape {
    at: Instant,
    samples: Vec<Sample>,
}

/// One sample line: `name{labels} value`.
#[derive(Debug, PartialEq)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Sample {
    fn label(&self, k: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }
}

fn scrape(host: &str, path: &str) -> anyhow::Result<Scrape> {
    let body = http_get(host, path).with_context(|| {
        format!("cannot read metrics from http://{host}{path} (is `jbdev serve --metrics` running there?)")
    })?;
    let samples: Vec<Sample> = body.lines().filter_map(parse_sample).collect();
    // Something else answering there (another exporter, a web server)
    // would otherwise show as an idle server with nothing in it.
    if !samples.iter().any(|s| s.name.starts_with("jbdev_")) {
        bail!(
            "http://{host}{path} answered, but with no jbdev metrics ({} sample(s) of others): \
             give the address `jbdev serve --metrics` printed",
            samples.len()
        );
    }
    Ok(Scrape {
        at: Instant::now(),
        samples,
    })
}

/// A minimal HTTP/1.0 GET with timeouts and a size cap.
fn http_get(host: &str, path: &str) -> anyhow::Result<String> {
    let addr = host
        .to_socket_addrs()?
        .next()
        .with_context(|| format!("{host} resolves to no address"))?;
    let mut s = TcpStream::connect_timeout(&addr, NET_TIMEOUT)?;
    s.set_read_timeout(Some(NET_TIMEOUT))?;
    s.set_write_timeout(Some(NET_TIMEOUT))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n")?;
    let mut raw = Vec::new();
    s.take(MAX_RESPONSE_BYTES).read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("the reply is not HTTP (no header end)")?;
    let status = head.lines().next().unwrap_or_default();
    if status.split(' ').nth(1) != Some("200") {
        bail!("the server answered {status:?}");
    }
    Ok(body.to_string())
}

/// Parses `name{k="v",...} value [timestamp]`; `None` for comments and
/// anything malformed.
fn parse_sample(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let name = line.get(..name_end)?.to_string();
    if name.is_empty() {
        return None;
    }
    let mut rest = line.get(name_end..)?;
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(r)?;
        labels = parsed;
        rest = after;
    }
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// Parses `k="v",k2="v2"}` (escapes `\\`, `\"`, `\n`); returns the labels
/// and what follows the closing brace.
fn parse_labels(s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches(',');
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = rest.find('=')?;
        let key = rest.get(..eq)?.trim().to_string();
        rest = rest.get(eq + 1..)?.strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((key, value));
        rest = rest.get(end + 1..)?;
    }
}

/// Sum of `name` over samples whose labels include every pair in `want`.
fn sum(s: &Scrape, name: &str, want: &[(&str, &str)]) -> f64 {
    s.samples
        .iter()
        .filter(|x| x.name == name && want.iter().all(|(k, v)| x.label(k) == Some(*v)))
        .map(|x| x.value)
        .sum()
}

/// Distinct values of label `key` on samples of `name`, in first-seen order.
fn label_values(s: &Scrape, name: &str, key: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for x in s.samples.iter().filter(|x| x.name == name) {
        if let Some(v) = x.label(key) {
            if !out.iter().any(|o| o == v) {
                out.push(v.to_string());
            }
        }
    }
    out
}

/// The report for the interval between two scrapes.
fn render(host: &str, prev: &Scrape, now: &Scrape) -> String {
    let secs = now.at.duration_since(prev.at).as_secs_f64().max(1e-6);
    let rate = |name: &str, want: &[(&str, &str)]| {
        ((sum(now, name, want) - sum(prev, name, want)) / secs).max(0.0)
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "jbdev serve {host}: {} connection(s), {} threads, RSS {:.1} MiB, over {secs:.1}s",
        sum(now, "jbdev_nbd_connections_open", &[]),
        sum(now, "process_threads", &[]),
        sum(now, "process_resident_memory_bytes", &[]) / f64::from(1u32 << 20),
    );
    let _ = writeln!(
        out,
        "{:<14} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>7}",
        "export",
        "read/s",
        "write/s",
        "flush/s",
        "rd MiB/s",
        "wr MiB/s",
        "wr avg ms",
        "inflight",
        "err/s"
    );
    for e in label_values(now, "jbdev_nbd_requests_total", "export") {
        let ex = ("export", e.as_str());
        let cmd = |c: &'static str| rate("jbdev_nbd_requests_total", &[ex, ("command", c)]);
        let writes = cmd("write");
        let wr_secs = rate(
            "jbdev_nbd_request_duration_seconds_sum",
            &[ex, ("command", "write")],
        );
        let mib = |n: &str| rate(n, &[ex]) / f64::from(1u32 << 20);
        let _ = writeln!(
            out,
            "{:<14} {:>9.0} {:>9.0} {:>9.0} {:>9.1} {:>9.1} {:>9.3} {:>8.0} {:>7.0}",
            if e.is_empty() { "(default)" } else { &e },
            cmd("read"),
            writes,
            cmd("flush"),
            mib("jbdev_nbd_read_bytes_total"),
            mib("jbdev_nbd_written_bytes_total"),
            if writes > 0.0 {
                wr_secs / writes * 1e3
            } else {
                0.0
            },
            sum(now, "jbdev_nbd_requests_in_flight", &[ex]),
            rate("jbdev_nbd_errors_total", &[ex]),
        );
    }
    let _ = writeln!(
        out,
        "{:<30} {:>9} {:>9} {:>10} {:>10} {:>8} {:>10} {:>11}",
        "volume",
        "commits/s",
        "txn blks",
        "commit p50",
        "commit p99",
        "journal",
        "ckpt lag",
        "sync/commit"
    );
    let durability = rate("jbdev_nbd_durability_requests_total", &[]);
    for v in label_values(now, "jbdev_commits_total", "volume") {
        let vol = ("volume", v.as_str());
        let commits = rate("jbdev_commits_total", &[vol]);
        let blocks = rate("jbdev_journaled_blocks_total", &[vol]);
        let q = |q: &str| sum(now, "jbdev_commit_latency_seconds", &[vol, ("quantile", q)]) * 1e3;
        let _ = writeln!(
            out,
            "{:<30} {:>9.0} {:>9.1} {:>8.2}ms {:>8.2}ms {:>7.1}% {:>6.0} blk {:>11}",
            shorten(&v, 30),
            commits,
            if commits > 0.0 { blocks / commits } else { 0.0 },
            q("0.5"),
            q("0.99"),
            sum(now, "jbdev_journal_fill_ratio", &[vol]) * 100.0,
            sum(now, "jbdev_checkpoint_lag_blocks", &[vol]),
            if commits > 0.0 {
                format!("{:.1}", durability / commits)
            } else {
                "-".into()
            },
        );
    }
    out
}

/// The last `n` characters of `s`, prefixed with "…" when cut.
fn shorten(s: &str, n: usize) -> String {
    let count = s.chars().count();
    if count <= n {
        return s.to_string();
    }
    let tail: String = s.chars().skip(count - (n - 1)).collect();
    format!("…{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_parse() {
        let s = parse_sample(r#"jbdev_x_total{export="a\"b",command="write"} 12"#).unwrap();
        assert_eq!(s.name, "jbdev_x_total");
        assert_eq!(s.label("export"), Some("a\"b"));
        assert_eq!(s.label("command"), Some("write"));
        assert_eq!(s.value, 12.0);
        assert_eq!(parse_sample("process_threads 7.0").unwrap().value, 7.0);
        assert_eq!(
            parse_sample(r#"x{le="+Inf"} 3"#).unwrap().label("le"),
            Some("+Inf")
        );
        for bad in [
            "# EOF",
            "",
            "x{a=\"1\" 2",
            "x{a=1} 2",
            "x 1e",
            "x{",
            "{} 1",
            "x{a=\"\\",
        ] {
            assert_eq!(parse_sample(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn targets() {
        assert_eq!(
            parse_target("10810").unwrap(),
            ("127.0.0.1:10810".into(), "/metrics".into())
        );
        assert_eq!(
            parse_target("http://[::1]:9/m").unwrap(),
            ("[::1]:9".into(), "/m".into())
        );
        assert!(parse_target("nonsense").is_err());
        assert!(parse_target("https://a:1/").is_err());
    }

    #[test]
    fn rates_come_from_deltas() {
        let text = |n: u64| {
            format!(
                "jbdev_nbd_requests_total{{export=\"\",command=\"write\"}} {n}\n\
                 jbdev_commits_total{{volume=\"/v\"}} {}\n\
                 jbdev_nbd_durability_requests_total{{export=\"\",kind=\"fua\"}} {n}\n",
                n / 4
            )
        };
        let t0 = Instant::now();
        let mk = |n: u64, at: Instant| Scrape {
            at,
            samples: text(n).lines().filter_map(parse_sample).collect(),
        };
        let r = render("h:1", &mk(0, t0), &mk(400, t0 + Duration::from_secs(2)));
        assert!(r.contains(" 200 "), "{r}"); // 400 writes over 2 s
        assert!(r.contains(" 50 "), "{r}"); // 100 commits over 2 s
        assert!(r.contains("4.0"), "{r}"); // 4 syncs per commit
        assert!(r.contains("/v"), "{r}");
    }
}
