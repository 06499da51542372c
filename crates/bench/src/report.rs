//! Results: the records that go to JSON, the fio-like tables on stdout and
//! the target checks against the kernel.

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::load::LoadResult;

/// fio's completion-latency percentile set.
pub const FIO_PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

/// Latency summary of a run, in microseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LatencySummary {
    pub samples: u64,
    pub mean_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// (percentile, latency_us) at [`FIO_PERCENTILES`].
    pub percentiles_us: Vec<(f64, f64)>,
    /// (latency_us, cumulative fraction) points of the CDF, for plots.
    pub cdf: Vec<(f64, f64)>,
}

impl LatencySummary {
    /// From a histogram of nanoseconds.
    pub fn from_ns(h: &Histogram<u64>) -> LatencySummary {
        if h.is_empty() {
            return LatencySummary::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        let mut cdf = Vec::new();
        // Quantiles spaced evenly in "nines" so the tail is visible.
        for i in 0..=200 {
            let q = 1.0 - 10f64.powf(-(i as f64) / 50.0);
            cdf.push((us(h.value_at_quantile(q)), q));
        }
        cdf.push((us(h.max()), 1.0));
        cdf.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
        LatencySummary {
            samples: h.len(),
            mean_us: h.mean() / 1000.0,
            min_us: us(h.min()),
            max_us: us(h.max()),
            p50_us: us(h.value_at_quantile(0.50)),
            p99_us: us(h.value_at_quantile(0.99)),
            percentiles_us: FIO_PERCENTILES
                .iter()
                .map(|&p| (p, us(h.value_at_quantile(p / 100.0))))
                .collect(),
            cdf,
        }
    }

    /// From individual samples in microseconds.
    pub fn from_samples_us(samples: &[f64]) -> LatencySummary {
        let mut h = Histogram::<u64>::new_with_bounds(1, 120_000_000_000, 3)
            .expect("static histogram bounds are valid");
        for s in samples {
            h.saturating_record((s * 1000.0).max(1.0) as u64);
        }
        let mut sum = Self::from_ns(&h);
        if !samples.is_empty() {
            // Exact mean, not the histogram's bucketed one.
            sum.mean_us = samples.iter().sum::<f64>() / samples.len() as f64;
        }
        sum
    }
}

/// One measured run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunRecord {
    /// "jbdev", "kernel" or "fs_mark".
    pub engine: String,
    /// Policy or path: "adaptive", "O_DIRECT|O_SYNC pwrite", "ext4 fs_mark -S 1".
    pub variant: String,
    /// Phase within a scenario ("idle", "loaded", "with-reader", ...); empty if none.
    pub phase: String,
    pub threads: usize,
    pub iodepth: usize,
    pub block_bytes: u64,
    pub duration_s: f64,
    pub ops: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    pub ops_per_sec: f64,
    pub mib_per_sec: f64,
    pub latency: LatencySummary,
    /// ops/s in each second (the vmstat-like series).
    pub per_second_ops: Vec<u64>,
    /// MiB/s in each second.
    pub per_second_mib: Vec<f64>,
    /// The slowest samples, slowest first, in microseconds (read-latency).
    pub slowest_us: Vec<f64>,
    /// Wall time of each timed repetition, in seconds (large-writes).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub times_s: Vec<f64>,
    /// User CPU seconds of the bench process during the run (getrusage
    /// RUSAGE_SELF delta; for fs_mark, RUSAGE_CHILDREN), the emulated
    /// device's threads excluded. None where not measured.
    pub cpu_user_s: Option<f64>,
    /// System CPU seconds, likewise.
    pub cpu_sys_s: Option<f64>,
    /// CPU seconds of the slow backing's FUSE server during the run,
    /// excluded from the two figures above (0 on other backings).
    pub cpu_device_s: Option<f64>,
    /// (user + system) microseconds per operation. Work done in kernel
    /// threads (loop workers, jbd2) is not included: see [`CPU_NOTE`].
    pub cpu_us_per_op: Option<f64>,
    /// Busy microseconds of all the machine's CPUs per operation
    /// (`/proc/stat`): kernel threads included, and anything else that ran.
    pub machine_cpu_us_per_op: Option<f64>,
    /// MiB/s written to the benchmarked block device during the run
    /// ([`crate::devstat`]): the journal and the checkpoint's home writes
    /// for jbdev, the data for the kernel path. None where not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_write_mib_per_sec: Option<f64>,
    /// The volume's own metrics after the run (jbdev only).
    pub volume_stats: Option<serde_json::Value>,
    /// Anything worth knowing about this run.
    pub note: String,
}

impl RunRecord {
    /// A record from a load result.
    pub fn from_load(
        engine: &str,
        variant: &str,
        threads: usize,
        iodepth: usize,
        block_bytes: u64,
        r: &LoadResult,
    ) -> RunRecord {
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        RunRecord {
            engine: engine.into(),
            variant: variant.into(),
            threads,
            iodepth,
            block_bytes,
            duration_s: r.elapsed.as_secs_f64(),
            ops: r.ops,
            read_ops: r.read_ops,
            write_ops: r.write_ops,
            ops_per_sec: r.ops as f64 / secs,
            mib_per_sec: r.bytes as f64 / secs / (1 << 20) as f64,
            latency: LatencySummary::from_ns(&r.latency_ns),
            per_second_ops: r.per_second_ops.clone(),
            per_second_mib: r
                .per_second_bytes
                .iter()
                .map(|b| *b as f64 / (1 << 20) as f64)
                .collect(),
            ..Default::default()
        }
        .with_cpu(r.cpu.map(|c| (c.process, c.device)), r.ops)
        .with_machine_cpu(r.cpu.and_then(|c| c.machine_us), r.ops)
        .with_device_writes(r.cpu.and_then(|c| c.device_written_bytes), secs)
    }

    /// Fills the device's write rate from the bytes written to it in `secs`.
    pub fn with_device_writes(mut self, bytes: Option<u64>, secs: f64) -> RunRecord {
        self.device_write_mib_per_sec = bytes
            .filter(|_| secs > 0.0)
            .map(|b| b as f64 / secs / (1 << 20) as f64);
        self
    }

    /// Fills the whole machine's CPU per operation from its busy time.
    pub fn with_machine_cpu(mut self, busy_us: Option<u64>, ops: u64) -> RunRecord {
        self.machine_cpu_us_per_op = busy_us.filter(|_| ops > 0).map(|us| us as f64 / ops as f64);
        self
    }

    /// Fills the CPU fields from a measured (process, device) CPU time.
    pub fn with_cpu(
        mut self,
        cpu: Option<(crate::cpu::CpuTime, crate::cpu::CpuTime)>,
        ops: u64,
    ) -> RunRecord {
        if let Some((c, dev)) = cpu {
            self.cpu_user_s = Some(c.user_us as f64 / 1e6);
            self.cpu_sys_s = Some(c.sys_us as f64 / 1e6);
            self.cpu_device_s = Some(dev.total_us() as f64 / 1e6);
            if ops > 0 {
                self.cpu_us_per_op = Some(c.total_us() as f64 / ops as f64);
            }
        }
        self
    }

    /// "jbdev adaptive" etc.
    pub fn label(&self) -> String {
        let mut s = format!("{} {}", self.engine, self.variant);
        if !self.phase.is_empty() {
            let _ = write!(s, " [{}]", self.phase);
        }
        s
    }
}

/// A target of the issues, checked on one run.
#[derive(Clone, Debug, Serialize)]
pub struct TargetCheck {
    pub name: String,
    /// The measured ratio (e.g. jbdev / kernel ops/s).
    pub ratio: f64,
    /// ">=" or "<=".
    pub comparison: String,
    pub threshold: f64,
    pub met: bool,
    /// The figures behind the ratio.
    pub detail: String,
}

impl TargetCheck {
    pub fn at_least(
        name: impl Into<String>,
        ratio: f64,
        threshold: f64,
        detail: String,
    ) -> TargetCheck {
        TargetCheck {
            name: name.into(),
            ratio,
            comparison: ">=".into(),
            threshold,
            met: ratio >= threshold,
            detail,
        }
    }
    pub fn at_most(
        name: impl Into<String>,
        ratio: f64,
        threshold: f64,
        detail: String,
    ) -> TargetCheck {
        TargetCheck {
            name: name.into(),
            ratio,
            comparison: "<=".into(),
            threshold,
            met: ratio <= threshold,
            detail,
        }
    }
}

/// A latency percentile a target compares.
#[derive(Clone, Copy, Debug)]
pub enum Percentile {
    P50,
    P99,
}

impl TargetCheck {
    /// jbdev's rate at least `threshold` times the kernel's; `unit` labels
    /// the figures ("/s", " IOPS").
    pub fn ops_vs_kernel(
        name: impl Into<String>,
        jbdev: &RunRecord,
        kernel: &RunRecord,
        threshold: f64,
        unit: &str,
    ) -> TargetCheck {
        let (j, k) = (jbdev.ops_per_sec, kernel.ops_per_sec);
        Self::at_least(
            name,
            j / k.max(1e-9),
            threshold,
            format!("jbdev {j:.0}{unit}, kernel {k:.0}{unit}"),
        )
    }

    /// jbdev's latency percentile `pct` at most `threshold` times the kernel's.
    pub fn latency_vs_kernel(
        name: impl Into<String>,
        jbdev: &RunRecord,
        kernel: &RunRecord,
        pct: Percentile,
        threshold: f64,
    ) -> TargetCheck {
        let (label, pick): (&str, fn(&LatencySummary) -> f64) = match pct {
            Percentile::P50 => ("p50", |l| l.p50_us),
            Percentile::P99 => ("p99", |l| l.p99_us),
        };
        let (j, k) = (pick(&jbdev.latency), pick(&kernel.latency));
        Self::at_most(
            name,
            j / k.max(1e-9),
            threshold,
            format!("jbdev {label} {j:.0} us, kernel {label} {k:.0} us"),
        )
    }
}

/// All runs of one scenario on one backing.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScenarioReport {
    pub scenario: String,
    pub backing: String,
    pub backing_description: String,
    pub runs: Vec<RunRecord>,
    pub targets: Vec<TargetCheck>,
    pub notes: Vec<String>,
    /// Plot files written (SVG and PNG).
    pub plots: Vec<String>,
}

impl ScenarioReport {
    pub fn new(scenario: &str, backing: &str, description: &str) -> ScenarioReport {
        ScenarioReport {
            scenario: scenario.into(),
            backing: backing.into(),
            backing_description: description.into(),
            ..Default::default()
        }
    }

    /// The first run matching engine, variant (prefix) and threads.
    pub fn find(
        &self,
        engine: &str,
        variant: &str,
        phase: &str,
        threads: usize,
    ) -> Option<&RunRecord> {
        self.runs.iter().find(|r| {
            r.engine == engine
                && r.variant.starts_with(variant)
                && r.phase == phase
                && r.threads == threads
        })
    }
}

/// The machine the run was on.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub kernel: String,
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_mib: u64,
}

impl Machine {
    pub fn detect() -> Machine {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let memory_mib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<u64>().ok())
            })
            .map(|kb| kb / 1024)
            .unwrap_or(0);
        Machine {
            kernel,
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            cpu_model,
            memory_mib,
        }
    }
}

/// The whole JSON document.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub tool: String,
    pub started_unix_s: u64,
    pub machine: Machine,
    pub quick: bool,
    pub command: String,
    pub scenarios: Vec<ScenarioReport>,
    /// With `--rounds N > 1`: each target judged by the median of its
    /// rounds' ratios (the rounds themselves are in `scenarios`).
    pub verdicts: Vec<TargetCheck>,
}

impl Report {
    /// The targets as judged: by the median of the rounds when the run had
    /// several (`verdicts`), else each scenario's own.
    pub fn final_targets(&self) -> Vec<&TargetCheck> {
        if self.verdicts.is_empty() {
            self.scenarios
                .iter()
                .flat_map(|s| s.targets.iter())
                .collect()
        } else {
            self.verdicts.iter().collect()
        }
    }
}

fn fmt_rate(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1}k", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Printed under every table with a CPU column.
pub const CPU_NOTE: &str = "cpu_us/op = (user + sys) CPU of the bench process per operation (getrusage RUSAGE_SELF around the measured run; fs_mark: RUSAGE_CHILDREN). jbdev's engine threads are included; work in kernel threads is NOT: the loop device's workers (the actual file I/O of the ram/disk/slow backings), block-layer completions, ext4's jbd2 thread. Both sides lose that work, and the kernel path loses more of its own (below its syscalls), so the kernel figure is an under-count. all_us/op = busy time of all CPUs of the machine per operation (/proc/stat: user, nice, system, irq, softirq) over the same interval: every process and kernel thread, the loop workers included, and anything else that ran then (an upper bound where cpu_us/op is a lower one). dev_MiB/s = MiB/s written to the benchmarked block device over the same interval (its sysfs stat): jbdev's journal and home writes, the kernel path's data; divided by MiB/s it is the write amplification.";

fn fmt_cpu(v: Option<f64>) -> String {
    match v {
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
        None => "-".into(),
    }
}

fn fmt_us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1}ms", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

/// Renders a scenario as fio-like text.
pub fn render_scenario(s: &ScenarioReport, fio_percentiles: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n=== {} on {}: {}",
        s.scenario, s.backing, s.backing_description
    );
    let _ = writeln!(
        out,
        "{:<44} {:>4} {:>3} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>10} {:>10} {:>10}",
        "engine variant [phase]",
        "thr",
        "qd",
        "ops/s",
        "MiB/s",
        "mean_us",
        "p50_us",
        "p99_us",
        "p99.9_us",
        "cpu_us/op",
        "all_us/op",
        "dev_MiB/s"
    );
    for r in &s.runs {
        // fs_mark reports no latency.
        let lat = |v: f64| {
            if r.latency.samples == 0 {
                "-".to_string()
            } else {
                fmt_us(v)
            }
        };
        let p999 = r
            .latency
            .percentiles_us
            .iter()
            .find(|(p, _)| *p == 99.9)
            .map(|x| x.1)
            .unwrap_or(0.0);
        let _ = writeln!(
            out,
            "{:<44} {:>4} {:>3} {:>9} {:>9.1} {:>8} {:>8} {:>8} {:>9} {:>10} {:>10} {:>10}",
            truncate(&r.label(), 44),
            r.threads,
            r.iodepth,
            if r.duration_s > 0.0 {
                fmt_rate(r.ops_per_sec)
            } else {
                "-".into()
            },
            r.mib_per_sec,
            lat(r.latency.mean_us),
            lat(r.latency.p50_us),
            lat(r.latency.p99_us),
            lat(p999),
            fmt_cpu(r.cpu_us_per_op),
            fmt_cpu(r.machine_cpu_us_per_op),
            r.device_write_mib_per_sec
                .map_or_else(|| "-".into(), |m| format!("{m:.1}")),
        );
    }
    if fio_percentiles {
        for r in &s.runs {
            let _ = writeln!(
                out,
                "\n{}: threads={} iodepth={}",
                r.label(),
                r.threads,
                r.iodepth
            );
            let _ = writeln!(
                out,
                "  read: IOPS={}  write: IOPS={}  total: IOPS={}",
                fmt_rate(r.read_ops as f64 / r.duration_s.max(1e-9)),
                fmt_rate(r.write_ops as f64 / r.duration_s.max(1e-9)),
                fmt_rate(r.ops_per_sec)
            );
            let _ = writeln!(out, "    clat percentiles (usec):");
            for row in r.latency.percentiles_us.chunks(4) {
                let cells: Vec<String> = row
                    .iter()
                    .map(|(p, v)| format!("{p:5.2}th=[{:>6.0}]", v))
                    .collect();
                let _ = writeln!(out, "     | {}", cells.join(", "));
            }
        }
    }
    for r in s.runs.iter().filter(|r| !r.slowest_us.is_empty()) {
        let top: Vec<String> = r.slowest_us.iter().map(|v| format!("{v:.0}")).collect();
        let _ = writeln!(
            out,
            "{}: {} reads, mean {:.0} us, 10 slowest (us): {}",
            r.label(),
            r.latency.samples,
            r.latency.mean_us,
            top.join(" ")
        );
    }
    for r in s.runs.iter().filter(|r| !r.note.is_empty()) {
        let _ = writeln!(out, "note: {}: {}", r.label(), r.note);
    }
    for n in &s.notes {
        let _ = writeln!(out, "note: {n}");
    }
    for t in &s.targets {
        let _ = writeln!(out, "{}", render_target(t));
    }
    out
}

/// One target's verdict line.
pub fn render_target(t: &TargetCheck) -> String {
    format!(
        "[{}] {}: {:.2}x (target {} {}x) — {}",
        if t.met { "MET " } else { "MISS" },
        t.name,
        t.ratio,
        t.comparison,
        t.threshold,
        t.detail
    )
}

/// Judges every target by the median of its ratios over `rounds` (reports
/// of the same scenario and backing, one per round): targets keep the
/// order of their first appearance; a target missing from some round (its
/// run failed there) is judged on the rounds that have it.
pub fn median_verdicts(rounds: &[ScenarioReport]) -> Vec<TargetCheck> {
    let mut names: Vec<&str> = Vec::new();
    for r in rounds {
        for t in &r.targets {
            if !names.contains(&t.name.as_str()) {
                names.push(&t.name);
            }
        }
    }
    names
        .into_iter()
        .filter_map(|name| {
            let all: Vec<&TargetCheck> = rounds
                .iter()
                .flat_map(|r| r.targets.iter().filter(|t| t.name == name))
                .collect();
            let first = *all.first()?;
            let mut ratios: Vec<f64> = all.iter().map(|t| t.ratio).collect();
            let listed = ratios
                .iter()
                .map(|r| format!("{r:.2}x"))
                .collect::<Vec<_>>()
                .join(", ");
            ratios.sort_by(f64::total_cmp);
            let n = ratios.len();
            // The middle one, or the mean of the middle two.
            let mid = ratios.get((n - 1) / 2..=n / 2)?;
            let median = mid.iter().sum::<f64>() / mid.len() as f64;
            let detail = format!("median of {n} rounds ({listed})");
            Some(if first.comparison == ">=" {
                TargetCheck::at_least(name, median, first.threshold, detail)
            } else {
                TargetCheck::at_most(name, median, first.threshold, detail)
            })
        })
        .collect()
}

/// The group-commit matrix: threads down, policies across, ops/s in the
/// cells; then the same matrix of CPU µs per operation.
pub fn render_matrix(s: &ScenarioReport) -> String {
    let mut out = matrix(s, "ops/s", |r| Some(fmt_rate(r.ops_per_sec)));
    if s.runs.iter().any(|r| r.cpu_us_per_op.is_some()) {
        out.push_str(&matrix(s, "cpu us/op", |r| {
            r.cpu_us_per_op.map(|v| fmt_cpu(Some(v)))
        }));
    }
    out
}

fn matrix(s: &ScenarioReport, what: &str, cell: impl Fn(&RunRecord) -> Option<String>) -> String {
    let mut cols: Vec<String> = Vec::new();
    let mut threads: Vec<usize> = Vec::new();
    for r in &s.runs {
        let c = format!("{} {}", r.engine, r.variant);
        if !cols.contains(&c) {
            cols.push(c);
        }
        if !threads.contains(&r.threads) {
            threads.push(r.threads);
        }
    }
    threads.sort_unstable();
    let mut out = String::new();
    let _ = write!(out, "\n{what} ({}):\n{:>7}", s.backing, "threads");
    for c in &cols {
        let _ = write!(out, " {:>22}", truncate(c, 22));
    }
    let _ = writeln!(out);
    for t in threads {
        let _ = write!(out, "{t:>7}");
        for c in &cols {
            let v = s
                .runs
                .iter()
                .find(|r| r.threads == t && format!("{} {}", r.engine, r.variant) == *c)
                .and_then(&cell)
                .unwrap_or_else(|| "-".into());
            let _ = write!(out, " {v:>22}");
        }
        let _ = writeln!(out);
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n).collect()
    }
}

/// Seconds as a Duration, for config.
pub fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_are_judged_by_their_median_ratio() {
        let round = |a: f64, b: f64| {
            let mut r = ScenarioReport::new("s", "ram", "");
            r.targets
                .push(TargetCheck::at_least("up", a, 1.0, String::new()));
            r.targets
                .push(TargetCheck::at_most("down", b, 1.0, String::new()));
            r
        };
        // "up" misses in two rounds of three, "down" in one of three.
        let v = median_verdicts(&[round(0.9, 1.2), round(1.3, 0.8), round(0.95, 0.9)]);
        assert_eq!(v.len(), 2);
        assert_eq!(
            (v[0].name.as_str(), v[0].ratio, v[0].met),
            ("up", 0.95, false)
        );
        assert_eq!(
            (v[1].name.as_str(), v[1].ratio, v[1].met),
            ("down", 0.9, true)
        );
        assert_eq!(v[0].comparison, ">=");
        assert!(
            v[0].detail.contains("0.90x, 1.30x, 0.95x"),
            "{}",
            v[0].detail
        );
        // An even count takes the mean of the middle two.
        let v = median_verdicts(&[round(0.9, 1.0), round(1.2, 1.0)]);
        assert!((v[0].ratio - 1.05).abs() < 1e-9 && v[0].met);
        // A target absent from a round is judged on the others.
        let mut partial = round(2.0, 2.0);
        partial.targets.remove(1);
        let v = median_verdicts(&[partial, round(3.0, 0.5)]);
        assert_eq!((v[1].ratio, v[1].met), (0.5, true));
    }

    fn run(ops_per_sec: f64, p50_us: f64, p99_us: f64) -> RunRecord {
        RunRecord {
            ops_per_sec,
            latency: LatencySummary {
                p50_us,
                p99_us,
                ..LatencySummary::from_samples_us(&[])
            },
            ..Default::default()
        }
    }

    #[test]
    fn targets_against_the_kernel() {
        let (j, k) = (run(300.0, 10.0, 90.0), run(100.0, 20.0, 30.0));
        let t = TargetCheck::ops_vs_kernel("ops", &j, &k, 2.0, " IOPS");
        assert!(t.met && (t.ratio - 3.0).abs() < 1e-9, "{t:?}");
        assert_eq!(t.detail, "jbdev 300 IOPS, kernel 100 IOPS");
        let t = TargetCheck::latency_vs_kernel("p50", &j, &k, Percentile::P50, 1.0);
        assert!(t.met && (t.ratio - 0.5).abs() < 1e-9, "{t:?}");
        let t = TargetCheck::latency_vs_kernel("p99", &j, &k, Percentile::P99, 1.0);
        assert!(!t.met && (t.ratio - 3.0).abs() < 1e-9, "{t:?}");
        assert_eq!(t.detail, "jbdev p99 90 us, kernel p99 30 us");
        // A kernel figure of zero gives a huge ratio, not a division by zero.
        let zero = run(0.0, 0.0, 0.0);
        assert!(TargetCheck::ops_vs_kernel("z", &j, &zero, 1.0, "/s")
            .ratio
            .is_finite());
    }
}
