//! The RBD backend against a real (throwaway, single-node) Ceph cluster:
//! the backend conformance suite, the exclusive lock, breaking it.
#![cfg(feature = "rbd")]

mod common;

use common::{conformance, Traits};
use jbdev_device::rbd::test_cluster;
use jbdev_device::{open_device, DeviceError, OpenOptions};

const SIZE_BYTES: u64 = 8 << 20;

fn cluster() -> Option<std::path::PathBuf> {
    match test_cluster::ensure() {
        Ok(conf) => Some(conf),
        Err(why) => {
            println!("SKIP: {why}");
            None
        }
    }
}

fn create_opts() -> OpenOptions {
    OpenOptions {
        create_size: Some(SIZE_BYTES),
        ..OpenOptions::default()
    }
}

#[test]
fn rbd_device_conformance() {
    let Some(conf) = cluster() else { return };
    let t = test_cluster::target(&conf, &test_cluster::unique_image("conf"));
    let dev = open_device(t.as_ref(), &create_opts()).unwrap().device;
    assert_eq!(dev.backend_name(), "rbd");
    assert_eq!(dev.size_bytes(), SIZE_BYTES);
    conformance(
        dev.as_ref(),
        Traits {
            reports_holes: false,
        },
    );
}

#[test]
fn a_second_writer_is_refused_naming_the_holder_and_break_lock_takes_over() {
    let Some(conf) = cluster() else { return };
    let t = test_cluster::target(&conf, &test_cluster::unique_image("lock"));
    let first = open_device(t.as_ref(), &create_opts()).unwrap().device;
    first.write_at(&[7u8; 512], 0, Default::default()).unwrap();
    first.flush().unwrap();
    match open_device(t.as_ref(), &OpenOptions::default()) {
        Err(DeviceError::Busy(msg)) => {
            println!("second opener: {msg}");
            assert!(msg.contains("held by"), "{msg}");
            assert!(!msg.contains("another client"), "owner not named: {msg}");
        }
        Err(e) => panic!("second opener: unexpected error {e}"),
        Ok(_) => panic!("a second read-write opener got the image"),
    }
    // A read-only opener takes no lock and reads what was written.
    let ro = open_device(
        t.as_ref(),
        &OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .unwrap()
    .device;
    let mut buf = [0u8; 512];
    ro.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [7u8; 512]);
    // Breaking the lock: the new opener writes; the old holder is fenced.
    let second = open_device(
        t.as_ref(),
        &OpenOptions {
            break_lock: true,
            ..OpenOptions::default()
        },
    )
    .unwrap()
    .device;
    second.write_at(&[9u8; 512], 0, Default::default()).unwrap();
    second.flush().unwrap();
    let old = first
        .write_at(&[1u8; 512], 512, Default::default())
        .and_then(|()| first.flush());
    assert!(old.is_err(), "the broken holder could still write");
    println!("old holder after the break: {}", old.unwrap_err());
}

#[test]
fn a_missing_image_without_create_is_a_clear_error() {
    let Some(conf) = cluster() else { return };
    let t = test_cluster::target(&conf, &test_cluster::unique_image("missing"));
    let err = open_device(t.as_ref(), &OpenOptions::default())
        .err()
        .expect("opened a missing image");
    let msg = err.to_string();
    assert!(
        msg.contains("rbd_open") && msg.contains("No such file"),
        "{msg}"
    );
}
