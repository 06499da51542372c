//! `large-writes` runs briefly on a temporary file and produces the runs,
//! table, targets and JSON counters it promises. No timing is asserted.

mod common;

use jbdev_bench::{large, run_plans, Plan};
use jbdev_volume::BatchPolicy;

#[test]
fn large_writes_reports_both_sides_targets_and_counters() {
    let dir = tempfile::tempdir().unwrap();
    let image = common::backing_file(dir.path(), 64 << 20);
    let args = common::common(image, dir.path(), false);
    // A 4 MiB journal: 4 MiB writes exceed a transaction (direct path),
    // 512 KiB ones are journaled — the shape of the real 16 MiB / 1 MiB run.
    let plan = Plan::LargeWrites(large::LargeWritesParams {
        large_bytes: 4 << 20,
        small_bytes: 512 << 10,
        reps: 2,
        stream_bytes: 16 << 20,
        stream_reps: 2,
        fua_stream: true,
        policy: BatchPolicy::Adaptive,
    });
    let mut out = Vec::new();
    let report = run_plans(&[plan], &args, &mut out, false, "large").expect("bench run");
    let text = String::from_utf8(out).unwrap();

    let [s] = report.scenarios.as_slice() else {
        panic!("one scenario expected: {text}");
    };
    assert_eq!(s.scenario, "large-writes");
    assert!(text.contains("=== large-writes on device"), "{text}");
    assert!(text.contains("large-writes (device): same bytes"), "{text}");
    // single: 2 sides on jbdev and on the raw device; stream: 2 sides x
    // (flush, FUA) on jbdev.
    let phases: Vec<(&str, &str, u64)> = s
        .runs
        .iter()
        .map(|r| (r.phase.as_str(), r.engine.as_str(), r.block_bytes))
        .collect();
    assert_eq!(phases.len(), 8, "{phases:?}");
    assert_eq!(phases.iter().filter(|p| p.0 == "single").count(), 4);
    assert_eq!(phases.iter().filter(|p| p.1 == "kernel").count(), 2);
    assert_eq!(phases.iter().filter(|p| p.0 == "stream").count(), 4);
    for r in &s.runs {
        assert!(r.duration_s > 0.0 && r.mib_per_sec > 0.0, "{}", r.label());
        assert_eq!(r.times_s.len(), 2, "{}", r.label());
        if r.engine == "kernel" {
            assert!(r.volume_stats.is_none());
            continue;
        }
        let v = r.volume_stats.as_ref().expect("volume stats");
        for k in [
            "commits",
            "direct_writes",
            "log_space_waits",
            "write_buffers_allocated",
            "write_buffers_reused",
        ] {
            assert!(v["delta"][k].is_u64(), "{}: {k} in {v}", r.label());
        }
        assert!(v["after"]["commits"].is_u64());
    }
    // Stream writes: one latency sample per write.
    let stream_small = s
        .runs
        .iter()
        .find(|r| r.phase == "stream" && r.block_bytes == 512 << 10)
        .unwrap();
    // Two streams of 32 writes.
    assert_eq!(stream_small.ops, 64);
    assert_eq!(
        stream_small.volume_stats.as_ref().unwrap()["checkpoint_drained_after_flush_s"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // Two targets (single, stream with flush); the FUA stream is a note.
    assert_eq!(s.targets.len(), 2, "{:?}", s.targets);
    for t in &s.targets {
        assert!(t.ratio.is_finite() && t.ratio > 0.0, "{t:?}");
        assert_eq!(t.threshold, large::TARGET_RATIO);
    }
    assert!(text.contains("[MET ]") || text.contains("[MISS]"), "{text}");
    assert!(s.notes.iter().any(|n| n.contains("FUA")), "{:?}", s.notes);
    assert!(
        s.notes.iter().any(|n| n.contains("the device itself")),
        "{:?}",
        s.notes
    );

    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap()).unwrap();
    let runs = json["scenarios"][0]["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 8);
    assert!(runs[0]["times_s"].as_array().unwrap().len() == 2);
    assert!(runs[0]["volume_stats"]["delta"]["direct_writes"].is_u64());
}

#[test]
fn large_writes_arguments() {
    let parse = common::parse_bench;
    let cli = parse(&["large-writes", "--quick"]).unwrap();
    let (plans, _) = jbdev_bench::plans(&cli).unwrap();
    let [Plan::LargeWrites(p)] = plans.as_slice() else {
        panic!("{plans:?}");
    };
    assert_eq!(
        (
            p.large_bytes,
            p.small_bytes,
            p.stream_bytes,
            p.reps,
            p.stream_reps
        ),
        (16 << 20, 1 << 20, 128 << 20, 5, 2)
    );
    let cli = parse(&["large-writes"]).unwrap();
    let (plans, _) = jbdev_bench::plans(&cli).unwrap();
    let [Plan::LargeWrites(p)] = plans.as_slice() else {
        panic!("{plans:?}");
    };
    assert_eq!(
        (p.stream_bytes, p.reps, p.stream_reps, p.fua_stream),
        (512 << 20, 9, 3, true)
    );
    let cli = parse(&["large-writes", "--reps", "0"]).unwrap();
    assert!(jbdev_bench::plans(&cli).is_err());
    let cli = parse(&["large-writes", "--stream-reps", "0"]).unwrap();
    assert!(jbdev_bench::plans(&cli).is_err());
    assert!(parse(&["large-writes", "--large-size", "16Q"]).is_err());
}
