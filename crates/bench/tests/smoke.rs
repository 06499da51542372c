//! Smoke test: every scenario runs briefly on a temporary file and produces
//! well-formed output (table, JSON, plots). No timing is asserted: this is
//! not a benchmark, it checks the harness.

mod common;

use std::time::Duration;

use jbdev_bench::backing::BackingKind;
use jbdev_bench::{mixed, readlat, run_plans, sync, Plan};
use jbdev_volume::BatchPolicy;

fn tiny_plans() -> Vec<Plan> {
    vec![
        Plan::SyncWriters(sync::SyncWritersParams {
            threads: vec![1, 2],
            kernel_baseline: true,
            policy: BatchPolicy::Adaptive,
            block_bytes: 4096,
        }),
        Plan::OsyncWriters(sync::OsyncParams {
            threads: 4,
            region_bytes: 64 << 10,
            policy: BatchPolicy::Adaptive,
        }),
        Plan::FsyncBatch(sync::FsyncBatchParams {
            threads: vec![1, 2],
            policies: vec![BatchPolicy::None, BatchPolicy::Adaptive],
            fs_mark: true,
        }),
        Plan::MixedIops(mixed::MixedParams {
            threads: 2,
            iodepth: 2,
            read_percent: 50,
            working_set_bytes: 8 << 20,
            policy: BatchPolicy::Adaptive,
        }),
        Plan::ReadLatency(readlat::ReadLatencyParams {
            samples: 3,
            interval: Duration::from_millis(20),
            read_bytes: 1 << 20,
            write_bytes: 256 << 10,
            read_region_bytes: 4 << 20,
            write_region_bytes: 8 << 20,
            sync_threads: 2,
            policy: BatchPolicy::Adaptive,
        }),
    ]
}

#[test]
fn every_scenario_produces_table_json_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let image = common::backing_file(dir.path(), 64 << 20);
    let args = common::common(image, dir.path(), true);
    let mut out = Vec::new();
    let report = run_plans(&tiny_plans(), &args, &mut out, false, "smoke").expect("bench run");
    let text = String::from_utf8(out).unwrap();

    let names: Vec<&str> = report
        .scenarios
        .iter()
        .map(|s| s.scenario.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "sync-writers",
            "osync-writers",
            "fsync-batch",
            "mixed-iops",
            "read-latency"
        ]
    );
    for s in &report.scenarios {
        assert!(
            text.contains(&format!("=== {} on device", s.scenario)),
            "{text}"
        );
        assert!(!s.runs.is_empty(), "{} has no runs", s.scenario);
        for r in &s.runs {
            assert!(r.ops > 0, "{}: {} did no operation", s.scenario, r.label());
            assert!(r.latency.samples > 0);
            assert!(r.latency.p50_us <= r.latency.max_us);
            // CPU time per operation is reported for every load run (the
            // read probes of read-latency are single timed reads).
            if r.slowest_us.is_empty() {
                let cpu = r.cpu_us_per_op.expect("cpu_us_per_op");
                assert!(cpu.is_finite() && cpu >= 0.0, "{}: {cpu}", r.label());
            }
        }
        // Both sides ran where the backing allows it.
        assert!(s.runs.iter().any(|r| r.engine == "jbdev"), "{}", s.scenario);
        assert!(!s.plots.is_empty(), "{} drew no plot", s.scenario);
        for p in &s.plots {
            let bytes = std::fs::read(p).unwrap();
            if p.ends_with(".png") {
                assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{p}");
            } else {
                assert!(p.ends_with(".svg"));
                assert!(String::from_utf8_lossy(&bytes).contains("<svg"), "{p}");
            }
        }
    }
    let sync = &report.scenarios[0];
    assert!(sync
        .runs
        .iter()
        .any(|r| r.engine == "kernel" && r.threads == 2));
    let mixed = &report.scenarios[3];
    assert!(text.contains("clat percentiles (usec)"));
    assert!(text.contains("cpu_us/op"), "{text}");
    assert!(text.contains("cpu us/op (device)"), "{text}");
    assert_eq!(mixed.runs[0].latency.percentiles_us.len(), 17);
    assert_eq!(
        mixed.runs[1].read_ops + mixed.runs[1].write_ops,
        mixed.runs[1].ops
    );
    // ext4 needs a block device: the kernel half of read-latency is skipped
    // with a note, not silently.
    let rl = &report.scenarios[4];
    assert!(
        rl.notes.iter().any(|n| n.contains("skipped")),
        "{:?}",
        rl.notes
    );
    assert!(rl
        .runs
        .iter()
        .any(|r| r.phase == "loaded" && r.slowest_us.len() == 3));

    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap()).unwrap();
    assert_eq!(json["scenarios"].as_array().unwrap().len(), 5);
    assert!(json["scenarios"][0]["runs"][0]["cpu_us_per_op"].is_number());
    assert!(
        json["scenarios"][0]["runs"][0]["ops_per_sec"]
            .as_f64()
            .unwrap()
            > 0.0
    );
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let parse = common::parse_bench;
    assert!(parse(&["fsync-batch", "--policies", "sometimes"]).is_err());
    assert!(parse(&["sync-writers", "--backing", "floppy"]).is_err());
    let cli = parse(&["fsync-batch", "--backing", "slow", "--slow-flush-ms", "5"]).unwrap();
    let (_, common) = jbdev_bench::plans(&cli).unwrap();
    assert_eq!(common.backing, vec![BackingKind::Slow]);
    assert_eq!(common.slow_flush_ms, 5.0);
    assert!(parse(&["sync-writers", "--backing-size", "12Q"]).is_err());
    let cli = parse(&["sync-writers", "--threads", "0"]).unwrap();
    assert!(matches!(
        jbdev_bench::plans(&cli),
        Err(jbdev_bench::BenchError::InvalidArgument(_))
    ));
    let cli = parse(&["all", "--quick"]).unwrap();
    let (plans, common) = jbdev_bench::plans(&cli).unwrap();
    assert_eq!(plans.len(), 6);
    assert!(common.quick);
}
