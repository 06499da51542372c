//! `--device` refuses a device or file that holds a jbdev volume or a file
//! system unless `force` is set, and leaves the refused content untouched.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use jbdev_bench::cli::CommonArgs;
use jbdev_bench::{run_plans, sync, Plan};
use jbdev_volume::{BatchPolicy, FormatOptions, OpenOptions, Volume};

fn args(device: PathBuf, dir: &Path, force: bool) -> CommonArgs {
    CommonArgs {
        duration: Some(0.1),
        json: None,
        force,
        ..common::common(device, dir, false)
    }
}

fn plan() -> Vec<Plan> {
    vec![Plan::SyncWriters(sync::SyncWritersParams {
        threads: vec![1],
        kernel_baseline: false,
        policy: BatchPolicy::Adaptive,
        block_bytes: 4096,
    })]
}

/// One tiny sync-writers run on `device`.
fn bench(device: &Path, dir: &Path, force: bool) -> Result<(), String> {
    let a = args(device.to_path_buf(), dir, force);
    run_plans(&plan(), &a, &mut Vec::new(), false, "t")
        .map(drop)
        .map_err(|e| e.to_string())
}

fn first_bytes(p: &Path, n: usize) -> Vec<u8> {
    let mut v = std::fs::read(p).unwrap();
    v.truncate(n);
    v
}

#[test]
fn refuses_a_jbdev_volume_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("vol.img");
    Volume::create(&img, &FormatOptions::new(64 << 20), &OpenOptions::default())
        .unwrap()
        .close()
        .unwrap();
    let before = first_bytes(&img, 4096);

    let err = bench(&img, dir.path(), false).expect_err("a jbdev volume must be refused");
    let msg = err;
    assert!(
        msg.contains("jbdev volume") && msg.contains("--force"),
        "{msg}"
    );
    assert_eq!(
        first_bytes(&img, 4096),
        before,
        "refused volume was modified"
    );

    bench(&img, dir.path(), true).expect("--force runs the benchmark");
}

#[test]
fn refuses_a_file_system() {
    if Command::new("mkfs.ext4").arg("-V").output().is_err() {
        eprintln!("SKIP: mkfs.ext4 not installed (Debian package e2fsprogs)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let st = Command::new("mkfs.ext4")
        .args(["-F", "-q"])
        .arg(&img)
        .status()
        .unwrap();
    assert!(st.success(), "mkfs.ext4 failed");
    let err = bench(&img, dir.path(), false).expect_err("an ext4 image must be refused");
    assert!(err.contains("ext2/3/4"), "{err}");
}

#[test]
fn accepts_a_zeroed_scratch_file() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("scratch.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    bench(&img, dir.path(), false).expect("a zeroed scratch file is accepted");
}
