//! An external journal file deleted or truncated while its volume is open
//! aborts the volume with a reason naming the file, so no later write is
//! acknowledged (found by a failure-mode pass, session 18: the server went
//! on acknowledging FUA writes that only a deleted or truncated journal
//! held). Before the fix nothing noticed, and these tests ran into their
//! deadline.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use jbdev_volume::{FormatOptions, JournalPlacement, OpenOptions, Volume, VolumeError, WriteFlags};

/// A volume with an external journal in `dir`, formatted and closed:
/// (volume path, journal path).
fn closed_volume(dir: &Path) -> (PathBuf, PathBuf) {
    let (home, jnl) = (dir.join("v.img"), dir.join("j.jnl"));
    let mut f = FormatOptions::new(8 << 20);
    f.journal_bytes = Some(2 << 20);
    f.journal = JournalPlacement::External(jnl.clone());
    Volume::create(&home, &f, &OpenOptions::default())
        .unwrap()
        .close()
        .unwrap();
    (home, jnl)
}

/// FUA writes until one fails; the failure must be the abort. A bound on
/// how long the volume may go on acknowledging, not a timing assertion:
/// the watch runs every 250 ms.
fn abort_reason(v: &Volume) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let buf = vec![0x5au8; 4096];
    let mut i = 0u64;
    loop {
        match v.write_at(&buf, (i % 64) * 4096, WriteFlags::FUA) {
            Ok(()) => assert!(
                Instant::now() < deadline,
                "FUA writes are still acknowledged a minute after the journal went"
            ),
            Err(VolumeError::Aborted { reason, .. }) => return reason,
            Err(e) => panic!("unexpected error {e}"),
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn open(home: &Path) -> Volume {
    Volume::open(home, &OpenOptions::default()).unwrap()
}

#[test]
fn a_deleted_external_journal_aborts_the_volume() {
    let dir = tempfile::tempdir().unwrap();
    let (home, jnl) = closed_volume(dir.path());
    let v = open(&home);
    v.write_at(&[1u8; 4096], 0, WriteFlags::FUA).unwrap();
    std::fs::remove_file(&jnl).unwrap();
    let why = abort_reason(&v);
    assert!(
        why.contains("was deleted while open") && why.contains("j.jnl"),
        "{why}"
    );
    // Every later write fails too, and so does close.
    assert!(v.write_at(&[2u8; 4096], 0, WriteFlags::NONE).is_err());
    assert!(v.close().is_err());
}

#[test]
fn a_truncated_external_journal_aborts_the_volume() {
    let dir = tempfile::tempdir().unwrap();
    let (home, jnl) = closed_volume(dir.path());
    let v = open(&home);
    v.write_at(&[1u8; 4096], 0, WriteFlags::FUA).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&jnl)
        .unwrap()
        .set_len(0)
        .unwrap();
    let why = abort_reason(&v);
    assert!(
        why.contains("was truncated while open") && why.contains("j.jnl"),
        "{why}"
    );
    assert!(v.write_at(&[2u8; 4096], 0, WriteFlags::NONE).is_err());
    drop(v);
}

/// A read-only open has nothing to protect and starts no watch; a
/// read-write one whose journal stays put is closed cleanly.
#[test]
fn an_untouched_external_journal_closes_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let (home, _jnl) = closed_volume(dir.path());
    let v = open(&home);
    v.write_at(&[1u8; 4096], 0, WriteFlags::FUA).unwrap();
    v.close().unwrap();
    let ro = Volume::open(
        &home,
        &OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    let mut back = vec![0u8; 4096];
    ro.read_at(&mut back, 0).unwrap();
    assert_eq!(back, vec![1u8; 4096]);
}
