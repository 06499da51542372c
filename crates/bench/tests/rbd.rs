//! `jbdev bench sync-writers --target rbd:POOL/IMAGE` against the throwaway
//! test cluster (skipped without Ceph): the target follows `--device`'s
//! rule (a jbdev volume or a file system is refused unless `--force`, a held
//! image always), nothing is created before that check, and every image the
//! run creates is removed when it ends.
#![cfg(feature = "rbd")]

use std::path::Path;

mod common;

use jbdev_bench::cli::BenchCommand;
use jbdev_device::rbd::{test_cluster, RbdTarget};
use jbdev_volume::{FormatOptions, OpenOptions, Volume};

use test_cluster::{exists, or_skip as cluster};

/// `IMAGE` and its three siblings, as targets.
fn all_images(conf: &Path, image: &str) -> Vec<String> {
    ["", "-jl", "-jr", "-jr-journal"]
        .iter()
        .map(|s| test_cluster::target(conf, &format!("{image}{s}")))
        .collect()
}

/// A brief run (1 thread, 0.1 s per run, 16 MiB images).
fn bench(target: &str, dir: &Path, force: bool) -> Result<(), String> {
    let d = dir.display().to_string();
    let mut args = vec![
        "sync-writers",
        "--target",
        target,
        "--threads",
        "1",
        "--duration",
        "0.1",
        "--backing-size",
        "16M",
        "--journal-size",
        "4M",
        "--backing-dir",
        &d,
    ];
    if force {
        args.push("--force");
    }
    let BenchCommand::SyncWriters(s) = common::parse_bench(&args).unwrap() else {
        unreachable!()
    };
    jbdev_bench::rbd::sync_writers(target, &s, &mut std::io::sink())
        .map(drop)
        .map_err(|e| e.to_string())
}

/// A target holding a jbdev volume is refused without --force, untouched,
/// and no sibling image is created. (Fails on the old code, which
/// overwrote it and left the siblings behind.)
#[test]
fn a_target_holding_a_jbdev_volume_is_refused_unless_forced() {
    let Some(conf) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let image = test_cluster::unique_image("benchvol");
    let images = all_images(&conf, &image);
    let mut f = FormatOptions::new(8 << 20);
    f.journal_bytes = Some(4 << 20);
    Volume::create(images[0].as_ref(), &f, &OpenOptions::default())
        .unwrap()
        .close()
        .unwrap();
    let err = bench(&images[0], dir.path(), false).expect_err("a volume was overwritten");
    assert!(
        err.contains("holds a jbdev volume") && err.contains("--force"),
        "{err}"
    );
    for i in &images[1..] {
        assert!(!exists(i), "{i} was created before the refusal");
    }
    Volume::open(images[0].as_ref(), &OpenOptions::default())
        .expect("the refused volume is intact")
        .close()
        .unwrap();
    // With --force it runs, and removes only what it created.
    bench(&images[0], dir.path(), true).unwrap();
    assert!(exists(&images[0]), "the user's image was removed");
    for i in &images[1..] {
        assert!(!exists(i), "{i} was left behind");
    }
    jbdev_device::rbd::remove_image(&RbdTarget::parse(&images[0]).unwrap()).unwrap();
}

/// A target another client holds is refused (even with --force) before
/// any image is created. (Fails on the old code: the three siblings were
/// created, and left, before the target's lock refused the run.)
#[test]
fn a_held_target_is_refused_before_anything_is_created() {
    let Some(conf) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let images = all_images(&conf, &test_cluster::unique_image("benchheld"));
    let holder = jbdev_device::open_device(
        images[0].as_ref(),
        &jbdev_device::OpenOptions {
            create_size: Some(16 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    let err = bench(&images[0], dir.path(), true).expect_err("ran on a held image");
    assert!(err.contains("held by"), "{err}");
    for i in &images[1..] {
        assert!(!exists(i), "{i} was created before the refusal");
    }
    drop(holder);
    jbdev_device::rbd::remove_image(&RbdTarget::parse(&images[0]).unwrap()).unwrap();
}

/// A run on a fresh name creates the four images and removes them all (and
/// the local journal file) when it ends. (Fails
/// on the old code: IMAGE and its siblings stayed.)
#[test]
fn a_run_removes_every_image_it_created() {
    let Some(conf) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let images = all_images(&conf, &test_cluster::unique_image("benchrun"));
    bench(&images[0], dir.path(), false).unwrap();
    for i in &images {
        assert!(!exists(i), "{i} was left behind");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "files left in --backing-dir: {left:?}");
}
