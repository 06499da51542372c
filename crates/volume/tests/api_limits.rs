//! Arguments an embedding program can get wrong are refused up front, with
//! `InvalidArgument` and the target untouched (found by driving the C ABI
//! as a new user would, session 17).

use std::time::Duration;

use jbdev_volume::{FormatOptions, OpenOptions, Volume, VolumeError, WriteFlags};

fn small_format() -> FormatOptions {
    let mut f = FormatOptions::new(4 << 20);
    f.journal_bytes = Some(1 << 20);
    f
}

/// A small volume, formatted and closed, in `dir`.
fn closed_volume(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("v.img");
    Volume::create(&path, &small_format(), &OpenOptions::default())
        .unwrap()
        .close()
        .unwrap();
    path
}

/// A size whose layout (superblock + journal + data) overflows 64 bits
/// used to wrap: the file was grown to a meaningless size and the error
/// claimed a corrupt journal (EUCLEAN) or a failed truncate (EIO).
#[test]
fn a_size_too_large_for_a_file_is_refused_and_the_target_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = closed_volume(&dir);
    let before = std::fs::read(&path).unwrap();
    for size in [
        u64::MAX - 4095,
        0xFFFF_FEFF_FFFF_F000,
        i64::MAX as u64 - 4095,
    ] {
        let mut f = FormatOptions::new(size);
        f.journal_bytes = Some(1 << 20);
        match Volume::create(&path, &f, &OpenOptions::default()) {
            Err(VolumeError::InvalidArgument(m)) => assert!(m.contains("too large"), "{m}"),
            Err(e) => panic!("size {size:#x}: {e}"),
            Ok(_) => panic!("size {size:#x} was accepted"),
        }
        assert!(
            std::fs::read(&path).unwrap() == before,
            "size {size:#x} changed the file"
        );
    }
    let fresh = dir.path().join("never.img");
    assert!(Volume::create(
        &fresh,
        &FormatOptions::new(u64::MAX - 4095),
        &OpenOptions::default()
    )
    .is_err());
    assert!(!fresh.exists(), "a refused create made a file");
}

/// A zero commit interval made the commit thread spin on the journal lock
/// and the first write hang for ever; a zero checkpoint interval spun the
/// checkpoint thread.
#[test]
fn zero_intervals_are_refused_at_open_and_create() {
    let dir = tempfile::tempdir().unwrap();
    let path = closed_volume(&dir);
    for which in ["commit", "checkpoint"] {
        let mut o = OpenOptions::default();
        if which == "commit" {
            o.commit_interval = Duration::ZERO;
        } else {
            o.checkpoint_interval = Duration::from_micros(10);
        }
        for r in [
            Volume::open(&path, &o).map(drop),
            Volume::create(&dir.path().join("other.img"), &small_format(), &o).map(drop),
        ] {
            match r {
                Err(VolumeError::InvalidArgument(m)) => {
                    assert!(m.contains(&format!("{which} interval")), "{m}")
                }
                Err(e) => panic!("{which}: {e}"),
                Ok(()) => panic!("a zero {which} interval was accepted"),
            }
        }
        assert!(!dir.path().join("other.img").exists());
    }
    // One millisecond is allowed, and writes go through.
    let o = OpenOptions {
        commit_interval: Duration::from_millis(1),
        checkpoint_interval: Duration::from_millis(1),
        ..OpenOptions::default()
    };
    let v = Volume::open(&path, &o).unwrap();
    v.write_at(b"ok", 7, WriteFlags::FUA).unwrap();
    v.close().unwrap();
}
