//! The slow-flush backing (a loop device over a FUSE file whose fsync takes
//! a set time): a brief run of sync-writers and fsync-batch through it, and
//! teardown on success and on error. Needs root, loop devices and /dev/fuse;
//! skips with the reason otherwise. No figure is asserted.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use jbdev_bench::backing::{loop_devices_available, Backing, BackingConfig, BackingKind};
use jbdev_bench::cleanup::{is_mounted, loops_of};
use jbdev_bench::cli::CommonArgs;
use jbdev_bench::{run_plans, sync, BenchError, Plan};
use jbdev_volume::BatchPolicy;

/// Tests in this file share the process id in their resource names; run
/// them one at a time so the "nothing left" checks see only their own.
static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

fn skip_reason() -> Option<String> {
    if !loop_devices_available() {
        return Some("needs root and loop devices (losetup)".into());
    }
    jbdev_bench::slow::fuse_available().err()
}

/// Mounts, loop devices and files of this process's slow backings.
fn leftovers() -> Vec<String> {
    let tag_mnt = format!("jbdev-bench-fuse-{}-", std::process::id());
    let tag_store = format!("jbdev-bench-slow-{}-", std::process::id());
    let mut left: Vec<String> = std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&tag_mnt))
        .map(|l| format!("mount: {l}"))
        .collect();
    if let Ok(out) = std::process::Command::new("losetup").arg("-a").output() {
        left.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.contains(&tag_mnt))
                .map(|l| format!("loop: {l}")),
        );
    }
    for dir in [std::env::temp_dir(), "/dev/shm".into()] {
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(&tag_mnt) || n.starts_with(&tag_store) {
                    left.push(format!("path: {}", e.path().display()));
                }
            }
        }
    }
    left
}

fn slow_cfg() -> BackingConfig {
    BackingConfig {
        size_bytes: 96 << 20,
        slow_flush: Duration::from_millis(2),
        ..BackingConfig::default()
    }
}

#[test]
fn slow_backing_runs_both_sides_and_leaves_nothing() {
    let _one = SERIAL.lock();
    if let Some(why) = skip_reason() {
        eprintln!("SKIP: slow backing: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let args = CommonArgs {
        backing: vec![BackingKind::Slow],
        device: None,
        backing_size: 96 << 20,
        duration: Some(0.2),
        json: Some(dir.path().join("slow.json")),
        ..common::common(PathBuf::new(), dir.path(), true)
    };
    let plans = vec![
        Plan::SyncWriters(sync::SyncWritersParams {
            threads: vec![1, 4],
            kernel_baseline: true,
            policy: BatchPolicy::Adaptive,
            block_bytes: 4096,
        }),
        Plan::FsyncBatch(sync::FsyncBatchParams {
            threads: vec![1, 4],
            policies: vec![BatchPolicy::None, BatchPolicy::Adaptive],
            fs_mark: false,
        }),
    ];
    let mut out = Vec::new();
    let report = run_plans(&plans, &args, &mut out, false, "slow smoke").expect("slow bench run");
    let text = String::from_utf8(out).unwrap();
    assert_eq!(report.scenarios.len(), 2, "{text}");
    for s in &report.scenarios {
        assert_eq!(s.backing, "slow");
        assert!(
            s.backing_description.contains("FUSE"),
            "{}",
            s.backing_description
        );
        assert!(
            s.backing_description.contains("flush probe"),
            "{}",
            s.backing_description
        );
        assert!(s.runs.iter().any(|r| r.engine == "kernel"), "{text}");
        assert!(s.runs.iter().any(|r| r.engine == "jbdev"), "{text}");
        for r in &s.runs {
            assert!(r.ops > 0, "{}: no operation", r.label());
            assert!(r.cpu_us_per_op.is_some(), "{}: no cpu figure", r.label());
            assert!(r.cpu_device_s.is_some());
        }
        // Flushes reached the FUSE server (the note counts them).
        assert!(
            s.notes.iter().any(|n| n.contains("fsyncs")),
            "{:?}",
            s.notes
        );
    }
    assert!(text.contains("=== fsync-batch on slow"), "{text}");
    assert!(text.contains("cpu us/op (slow)"), "{text}");
    assert!(leftovers().is_empty(), "left behind: {:?}", leftovers());
}

/// Sets up a slow backing, checks it is live, then fails like a scenario.
fn failing_scenario(seen: &mut Vec<std::path::PathBuf>) -> Result<(), BenchError> {
    let b = Backing::setup(&BackingKind::Slow, &slow_cfg())?;
    let image = b.backing_file.clone().expect("slow has an image");
    assert_eq!(loops_of(&image), vec![b.path.clone()]);
    let server = b.slow_server().expect("slow has a FUSE server");
    assert!(is_mounted(&server.dir));
    // The flush probe at set-up went through the FUSE fsync.
    assert!(
        server
            .stats
            .fsyncs
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    seen.push(image);
    seen.push(server.dir.clone());
    Err(BenchError::Setup("injected failure".into()))
}

#[test]
fn slow_backing_is_torn_down_on_error() {
    let _one = SERIAL.lock();
    if let Some(why) = skip_reason() {
        eprintln!("SKIP: slow backing: {why}");
        return;
    }
    let before = jbdev_bench::cleanup::registered_count();
    let mut seen = Vec::new();
    assert!(failing_scenario(&mut seen).is_err());
    let (image, mnt): (&Path, &Path) = (&seen[0], &seen[1]);
    assert!(loops_of(image).is_empty(), "loop device left behind");
    assert!(!is_mounted(mnt), "FUSE mount left behind");
    assert!(!mnt.exists(), "mount point left behind");
    assert!(leftovers().is_empty(), "left behind: {:?}", leftovers());
    assert_eq!(jbdev_bench::cleanup::registered_count(), before);
}
