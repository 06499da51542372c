//! `jbdev stats TARGET [--watch] [--count N]`: a running server's metrics
//! as a compact table, like iostat, with each volume's failure state.
//!
//! TARGET is the address `jbdev serve --metrics` prints. Rates are deltas
//! between two scrapes `--interval` seconds apart (one report without
//! `--watch` or `--count`; one per interval with them), so they describe
//! now, not the server's lifetime. Everything read from the socket is
//! untrusted: the parser skips what it does not understand and never
//! panics, a value the server does not report shows as "-", and label
//! values are printed with control characters escaped. Command-line
//! mistakes are clap value errors, so they exit 64 like every usage error.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

#[derive(clap::Args)]
pub struct StatsArgs {
    /// Metrics address of `jbdev serve --metrics`: ADDR:PORT, PORT (on
    /// 127.0.0.1) or http://ADDR:PORT/metrics.
    #[arg(value_parser = parse_target)]
    pub target: Target,
    /// Keep printing a report every interval until interrupted (or --count).
    #[arg(long)]
    pub watch: bool,
    /// Seconds between the scrapes a report's rates are taken over
    /// (0.05 to 3600).
    #[arg(long, default_value_t = 1.0, value_name = "SECS", value_parser = parse_interval)]
    pub interval: f64,
    /// Print this many reports, one per interval, then stop (implies
    /// --watch; at least 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
}

/// Largest metrics response read (a server with many exports is ~100 KiB).
const MAX_RESPONSE_BYTES: u64 = 16 << 20;
const NET_TIMEOUT: Duration = Duration::from_secs(5);

pub fn run(a: StatsArgs) -> anyhow::Result<()> {
    let Target { host, path } = a.target;
    let interval = Duration::from_secs_f64(a.interval);
    // --count alone means "watch for that many reports": it used to be
    // ignored silently, printing one.
    let reports = match (a.watch, a.count) {
        (_, Some(n)) => Some(n),
        (true, None) => None,
        (false, None) => Some(1),
    };
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

/// `--interval`: seconds, 0.05 to 3600 (a usage error otherwise, exit 64).
fn parse_interval(s: &str) -> Result<f64, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(0.05..=3600.0).contains(&secs) {
        return Err("must be between 0.05 and 3600 seconds".into());
    }
    Ok(secs)
}

/// Where the metrics are: `host:port` and the HTTP path.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    host: String,
    path: String,
}

/// TARGET from ADDR:PORT, PORT or an http:// URL; a usage error (exit
/// 64) otherwise.
fn parse_target(t: &str) -> Result<Target, String> {
    if std::path::Path::new(t).exists() {
        return Err(format!(
            "{t} is a file: `jbdev stats` reads a running server's metrics. Serve it with \
             `jbdev serve {t} --metrics 127.0.0.1:10810`, then run `jbdev stats 127.0.0.1:10810` \
             (`jbdev info {t}` shows an idle volume)"
        ));
    }
    if let Ok(port) = t.parse::<u16>() {
        return Ok(Target {
            host: format!("127.0.0.1:{port}"),
            path: "/metrics".into(),
        });
    }
    let rest = t.strip_prefix("http://").unwrap_or(t);
    if rest.starts_with("https://") || t.starts_with("https://") {
        return Err(
            "https is not supported; the metrics endpoint is plain HTTP on loopback".into(),
        );
    }
    let (host, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, "/metrics"),
    };
    if !host.contains(':') {
        return Err(format!(
            "bad target {t:?}: expected ADDR:PORT, PORT or http://ADDR:PORT/metrics"
        ));
    }
    Ok(Target {
        host: host.to_string(),
        path: path.to_string(),
    })
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
    let secs = NET_TIMEOUT.as_secs();
    let timed_out = |what: &str, e: std::io::Error| match e.kind() {
        // A read or write timeout is EAGAIN ("Resource temporarily
        // unavailable") on Linux: say what it means.
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            anyhow::anyhow!("timed out after {secs} s {what} {host}")
        }
        _ => anyhow::Error::new(e).context(format!("{what} {host}")),
    };
    let mut s = TcpStream::connect_timeout(&addr, NET_TIMEOUT)
        .map_err(|e| timed_out("connecting to", e))?;
    s.set_read_timeout(Some(NET_TIMEOUT))?;
    s.set_write_timeout(Some(NET_TIMEOUT))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n")
        .map_err(|e| timed_out("sending the request to", e))?;
    let mut raw = Vec::new();
    s.take(MAX_RESPONSE_BYTES)
        .read_to_end(&mut raw)
        .map_err(|e| timed_out("waiting for an answer from", e))?;
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

/// Sum of `name` over samples whose labels include every pair in `want`;
/// `None` when there is no such sample (a server that does not export it:
/// shown as "-", not as a zero it never reported).
fn sum(s: &Scrape, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    s.samples
        .iter()
        .filter(|x| x.name == name && want.iter().all(|(k, v)| x.label(k) == Some(*v)))
        .map(|x| x.value)
        .reduce(|a, b| a + b)
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

/// `v` with `prec` decimals, "-" when missing; never "-0".
fn num(v: Option<f64>, prec: usize) -> String {
    match v {
        // Adding +0.0 turns -0.0 into 0.0; a negative value that rounds
        // to zero prints as zero too.
        Some(x) if x.is_finite() => {
            let text = format!("{:.prec$}", x + 0.0);
            if text
                .trim_start_matches('-')
                .chars()
                .all(|c| c == '0' || c == '.')
            {
                text.trim_start_matches('-').to_string()
            } else {
                text
            }
        }
        Some(x) => format!("{x}"),
        None => "-".into(),
    }
}

/// A label value as one line of text: control characters (a newline in
/// an export name) escaped, so a row stays one row.
fn printable(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// The failure state of volume `v` in `now`: the table's short word and,
/// when it is not "ok", a line saying what it means.
fn volume_state(now: &Scrape, v: &str) -> (String, Option<String>) {
    let vol = [("volume", v)];
    let flag = |name: &str| sum(now, name, &vol).map(|x| x > 0.0);
    let (Some(aborted), Some(full)) = (flag("jbdev_aborted"), flag("jbdev_store_full")) else {
        // An older server: it does not say.
        return ("-".into(), None);
    };
    let salvaged = num(sum(now, "jbdev_salvaged_blocks_total", &vol), 0);
    let lost = match sum(now, "jbdev_salvage_uncommitted_blocks", &vol) {
        Some(n) if n > 0.0 => format!(
            " ({} block(s) of plain writes no flush or FUA covered were never committed and \
             are lost)",
            num(Some(n), 0)
        ),
        _ => String::new(),
    };
    let name = printable(v);
    if aborted {
        return if flag("jbdev_salvage_complete") == Some(true) {
            (
                "ABORTED,salvaged".into(),
                Some(format!(
                    "{name}: journal ABORTED; salvage complete ({salvaged} block(s) written \
                     home): every committed write (every write a flush or FUA acknowledged) is \
                     on the volume{lost}; see the server's log"
                )),
            )
        } else if flag("jbdev_salvage_running") == Some(true) {
            (
                "ABORTED,salvaging".into(),
                Some(format!(
                    "{name}: journal ABORTED; salvage under way ({salvaged} block(s) written \
                     home so far)"
                )),
            )
        } else {
            (
                "ABORTED".into(),
                Some(format!(
                    "{name}: journal ABORTED: writes fail until the server is restarted; see \
                     the server's log"
                )),
            )
        };
    }
    if full {
        return (
            "STORE FULL".into(),
            Some(format!(
                "{name}: the backing store is FULL: writes that need space fail (ENOSPC) until \
                 space is freed; no restart needed"
            )),
        );
    }
    ("ok".into(), None)
}

/// The report for the interval between two scrapes.
fn render(host: &str, prev: &Scrape, now: &Scrape) -> String {
    let secs = now.at.duration_since(prev.at).as_secs_f64().max(1e-6);
    // Per second over the interval; missing when `now` lacks the counter.
    let rate = |name: &str, want: &[(&str, &str)]| {
        let n = sum(now, name, want)?;
        Some(((n - sum(prev, name, want).unwrap_or(0.0)) / secs).max(0.0))
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "jbdev serve {host}: {} connection(s), {} threads, RSS {} MiB, over {secs:.1}s",
        num(sum(now, "jbdev_nbd_connections_open", &[]), 0),
        num(sum(now, "process_threads", &[]), 0),
        num(
            sum(now, "process_resident_memory_bytes", &[]).map(|b| b / f64::from(1u32 << 20)),
            1
        ),
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
        let mib = |n: &str| rate(n, &[ex]).map(|r| r / f64::from(1u32 << 20));
        let wr_avg_ms = match (writes, wr_secs) {
            (Some(w), Some(t)) if w > 0.0 => Some(t / w * 1e3),
            (Some(_), Some(_)) => Some(0.0),
            _ => None,
        };
        let _ = writeln!(
            out,
            "{:<14} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>7}",
            if e.is_empty() {
                "(default)".into()
            } else {
                printable(&e)
            },
            num(cmd("read"), 0),
            num(writes, 0),
            num(cmd("flush"), 0),
            num(mib("jbdev_nbd_read_bytes_total"), 1),
            num(mib("jbdev_nbd_written_bytes_total"), 1),
            num(wr_avg_ms, 3),
            num(sum(now, "jbdev_nbd_requests_in_flight", &[ex]), 0),
            // Counted per errno, so absent until the first error.
            num(rate("jbdev_nbd_errors_total", &[ex]).or(Some(0.0)), 0),
        );
    }
    let _ = writeln!(
        out,
        "{:<30} {:>9} {:>9} {:>10} {:>10} {:>8} {:>10} {:>11} {:>12}  state",
        "volume",
        "commits/s",
        "txn blks",
        "commit p50",
        "commit p99",
        "journal",
        "ckpt lag",
        "sync/commit",
        "full waits/s"
    );
    let durability = rate("jbdev_nbd_durability_requests_total", &[]);
    let mut notes = Vec::new();
    for v in label_values(now, "jbdev_commits_total", "volume") {
        let vol = ("volume", v.as_str());
        let commits = rate("jbdev_commits_total", &[vol]);
        let blocks = rate("jbdev_journaled_blocks_total", &[vol]);
        let per_commit = |x: Option<f64>| match (x, commits) {
            (Some(x), Some(c)) if c > 0.0 => Some(x / c),
            _ => None,
        };
        let q = |q: &str| {
            let ms = sum(now, "jbdev_commit_latency_seconds", &[vol, ("quantile", q)]);
            format!("{}ms", num(ms.map(|s| s * 1e3), 2))
        };
        let (state, note) = volume_state(now, &v);
        notes.extend(note);
        let _ = writeln!(
            out,
            "{:<30} {:>9} {:>9} {:>10} {:>10} {:>8} {:>10} {:>11} {:>12}  {state}",
            shorten(&printable(&v), 30),
            num(commits, 0),
            num(per_commit(blocks).or(commits.map(|_| 0.0)), 1),
            q("0.5"),
            q("0.99"),
            format!(
                "{}%",
                num(
                    sum(now, "jbdev_journal_fill_ratio", &[vol]).map(|r| r * 100.0),
                    1
                )
            ),
            format!(
                "{} blk",
                num(sum(now, "jbdev_checkpoint_lag_blocks", &[vol]), 0)
            ),
            num(per_commit(durability), 1),
            // Writers that found the journal full: a journal too small for
            // the load, or a checkpoint that cannot keep up.
            num(rate("jbdev_log_space_waits_total", &[vol]), 0),
        );
    }
    for n in notes {
        let _ = writeln!(out, "! {n}");
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
        let t = |host: &str, path: &str| Target {
            host: host.into(),
            path: path.into(),
        };
        assert_eq!(
            parse_target("10810").unwrap(),
            t("127.0.0.1:10810", "/metrics")
        );
        assert_eq!(
            parse_target("http://[::1]:9/m").unwrap(),
            t("[::1]:9", "/m")
        );
        assert!(parse_target("nonsense").is_err());
        assert!(parse_target("https://a:1/").is_err());
        assert!(parse_interval("0").is_err());
        assert!(parse_interval("x").is_err());
        assert_eq!(parse_interval("0.5"), Ok(0.5));
    }

    fn scrape_of(text: &str, at: Instant) -> Scrape {
        Scrape {
            at,
            samples: text.lines().filter_map(parse_sample).collect(),
        }
    }

    /// Report #12 of session 19: a server without the gauges showed
    /// "-0 connection(s), -0 threads, RSS -0.0 MiB" and "-0" in flight
    /// (the sum of nothing is -0.0); a newline in an export name split
    /// the row in two.
    #[test]
    fn missing_values_show_as_a_dash_and_a_name_stays_on_its_row() {
        let text = "jbdev_nbd_requests_total{export=\"a\\nb\",command=\"write\"} 1\n";
        let t0 = Instant::now();
        let r = render(
            "h:1",
            &scrape_of(text, t0),
            &scrape_of(text, t0 + Duration::from_secs(1)),
        );
        assert!(!r.contains("-0"), "{r}");
        assert!(
            r.starts_with("jbdev serve h:1: - connection(s), - threads, RSS - MiB"),
            "{r}"
        );
        let row = r
            .lines()
            .find(|l| l.starts_with("a"))
            .unwrap_or_else(|| panic!("{r}"));
        assert!(row.starts_with("a\\nb "), "{row}");
        // Header, export header, one export row, volume header.
        assert_eq!(r.lines().count(), 4, "{r}");
        assert_eq!(num(Some(-0.0), 0), "0");
        assert_eq!(num(Some(-0.0001), 1), "0.0");
        assert_eq!(num(Some(-2.0), 0), "-2");
    }

    /// Report #12 of session 19: after the journal was deleted under a
    /// server, `stats` looked normal.
    #[test]
    fn an_aborted_volume_and_its_salvage_are_shown() {
        let text = |aborted: u8, running: u8, complete: u8, full: u8| {
            format!(
                "jbdev_commits_total{{volume=\"/v\"}} 4\n\
                 jbdev_aborted{{volume=\"/v\"}} {aborted}\n\
                 jbdev_salvage_running{{volume=\"/v\"}} {running}\n\
                 jbdev_salvage_complete{{volume=\"/v\"}} {complete}\n\
                 jbdev_salvaged_blocks_total{{volume=\"/v\"}} 64\n\
                 jbdev_store_full{{volume=\"/v\"}} {full}\n"
            )
        };
        let t0 = Instant::now();
        let report = |t: String| {
            render(
                "h:1",
                &scrape_of(&t, t0),
                &scrape_of(&t, t0 + Duration::from_secs(1)),
            )
        };
        for (state, words) in [
            (
                text(1, 0, 1, 0),
                &[
                    " ABORTED,salvaged",
                    "! /v: journal ABORTED; salvage complete (64 block(s) written home)",
                ][..],
            ),
            (
                text(1, 1, 0, 0),
                &[" ABORTED,salvaging", "salvage under way"][..],
            ),
            (text(1, 0, 0, 0), &[" ABORTED\n", "writes fail until"][..]),
            (
                text(0, 0, 0, 1),
                &[" STORE FULL", "backing store is FULL"][..],
            ),
        ] {
            let r = report(state);
            assert!(words.iter().all(|w| r.contains(w)), "{words:?}:\n{r}");
        }
        let r = report(text(0, 0, 0, 0));
        assert!(r.lines().nth(3).is_some_and(|l| l.ends_with("  ok")), "{r}");
        assert!(!r.contains('!'), "{r}");
    }

    #[test]
    fn rates_come_from_deltas() {
        let text = |n: u64| {
            format!(
                "jbdev_nbd_requests_total{{export=\"\",command=\"write\"}} {n}\n\
                 jbdev_commits_total{{volume=\"/v\"}} {}\n\
                 jbdev_nbd_durability_requests_total{{export=\"\",kind=\"fua\"}} {n}\n\
                 jbdev_log_space_waits_total{{volume=\"/v\"}} {}\n",
                n / 4,
                n * 3
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
        assert!(r.contains(" 600 "), "{r}"); // 1200 waits for log space over 2 s
        assert!(r.contains("/v"), "{r}");
    }
}
