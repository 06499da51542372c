//! Loop devices, backing files and mounts are torn down on success and on
//! error. Needs root and loop devices; skips with a message otherwise.

use jbdev_bench::backing::{loop_devices_available, Backing, BackingConfig, BackingKind};
use jbdev_bench::cleanup::{is_mounted, loops_of};
use jbdev_bench::BenchError;

fn small_ram() -> BackingConfig {
    BackingConfig {
        size_bytes: 64 << 20,
        ..BackingConfig::default()
    }
}

/// Sets up a ram backing and an ext4 mount, then fails like a scenario would.
fn failing_scenario(seen: &mut Vec<std::path::PathBuf>) -> Result<(), BenchError> {
    let b = Backing::setup(&BackingKind::Ram, &small_ram())?;
    let file = b.backing_file.clone().expect("ram has a file");
    assert_eq!(loops_of(&file), vec![b.path.clone()]);
    seen.push(file);
    if b.can_mount() {
        let m = b.mount_ext4()?;
        assert!(is_mounted(&m.dir));
        seen.push(m.dir.clone());
    }
    Err(BenchError::Setup("injected failure".into()))
}

#[test]
fn loop_devices_and_mounts_are_removed_on_error() {
    if !loop_devices_available() {
        eprintln!("SKIP: needs root and loop devices (losetup)");
        return;
    }
    let mut seen = Vec::new();
    let before = jbdev_bench::cleanup::registered_count();
    assert!(failing_scenario(&mut seen).is_err());
    let file = &seen[0];
    assert!(loops_of(file).is_empty(), "loop device left behind");
    assert!(!file.exists(), "backing file left behind");
    if let Some(mnt) = seen.get(1) {
        assert!(!is_mounted(mnt), "mount left behind");
        assert!(!mnt.exists(), "mount point left behind");
    }
    assert_eq!(jbdev_bench::cleanup::registered_count(), before);
}
