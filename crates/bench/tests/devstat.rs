//! The bytes written to a benchmarked loop device are counted (the
//! `dev_MiB/s` column): a write through the device shows up in full, and
//! nothing is counted once the backing is gone. Needs root and loop
//! devices; skips with a message otherwise.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use jbdev_bench::backing::{loop_devices_available, Backing, BackingConfig, BackingKind};
use jbdev_bench::devstat;

#[test]
fn writes_to_the_loop_device_are_counted_while_it_is_benchmarked() {
    if !loop_devices_available() {
        eprintln!("SKIP: needs root and loop devices (losetup)");
        return;
    }
    let cfg = BackingConfig {
        size_bytes: 64 << 20,
        ..BackingConfig::default()
    };
    let b = Backing::setup(&BackingKind::Ram, &cfg).unwrap();
    let before = devstat::written_bytes().expect("the loop device is watched");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&b.path)
        .unwrap();
    let buf = jbdev_device::AlignedBuf::zeroed(1 << 20);
    for _ in 0..4 {
        f.write_all(&buf).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let after = devstat::written_bytes().unwrap();
    assert!(
        after - before >= 4 << 20,
        "4 MiB written, {} counted",
        after - before
    );
    drop(b);
    assert_eq!(
        devstat::written_bytes(),
        None,
        "a removed backing is still watched"
    );
}
