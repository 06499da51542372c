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

/// Waits too long for a clock to add (`Instant + d` panicked in the engine:
/// the commit thread with `commit_interval: Duration::MAX`, a writer with
/// `Fixed(Duration::MAX)`) and pipeline depths outside 1..=16 (silently
/// clamped) are refused.
#[test]
fn waits_past_a_day_and_depths_outside_the_range_are_refused() {
    use jbdev_volume::BatchPolicy;
    let dir = tempfile::tempdir().unwrap();
    let path = closed_volume(&dir);
    let cases: [(&str, OpenOptions); 6] = [
        (
            "commit interval",
            OpenOptions {
                commit_interval: Duration::MAX,
                ..OpenOptions::default()
            },
        ),
        (
            "checkpoint interval",
            OpenOptions {
                checkpoint_interval: Duration::from_secs(2 * 86400),
                ..OpenOptions::default()
            },
        ),
        (
            "max_batch",
            OpenOptions {
                max_batch: Duration::MAX,
                ..OpenOptions::default()
            },
        ),
        (
            "fixed batching wait",
            OpenOptions {
                batch_policy: BatchPolicy::Fixed(Duration::MAX),
                ..OpenOptions::default()
            },
        ),
        (
            "pipeline depth",
            OpenOptions {
                pipeline_depth: 0,
                ..OpenOptions::default()
            },
        ),
        (
            "pipeline depth",
            OpenOptions {
                pipeline_depth: 17,
                ..OpenOptions::default()
            },
        ),
    ];
    for (what, o) in cases {
        match Volume::open(&path, &o) {
            Err(VolumeError::InvalidArgument(m)) => assert!(m.contains(what), "{what}: {m}"),
            Err(e) => panic!("{what}: {e}"),
            Ok(_) => panic!("{what} was accepted"),
        }
    }
    // The bounds themselves are fine.
    let o = OpenOptions {
        commit_interval: jbdev_volume::MAX_WAIT,
        pipeline_depth: 16,
        ..OpenOptions::default()
    };
    let v = Volume::open(&path, &o).unwrap();
    v.write_at(b"ok", 0, WriteFlags::FUA).unwrap();
    v.close().unwrap();
}

/// A create that fails removes the files it created (here the volume file,
/// made before the external journal's directory turned out not to exist),
/// and leaves a file that was there alone.
#[test]
fn a_failed_create_leaves_no_file_behind() {
    use jbdev_volume::JournalPlacement;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.img");
    let mut f = small_format();
    f.journal = JournalPlacement::External(dir.path().join("nodir/x.jnl"));
    assert!(Volume::create(&path, &f, &OpenOptions::default()).is_err());
    assert!(!path.exists(), "the failed create left the volume file");
    let old = closed_volume(&dir);
    assert!(Volume::create(&old, &f, &OpenOptions::default()).is_err());
    assert!(
        old.exists(),
        "a file that was there before is not the create's to remove"
    );
}

/// A journal block past the journal's end is the caller's mistake
/// (`InvalidArgument`), not a corrupt journal.
#[test]
fn reading_past_the_journal_is_an_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let path = closed_volume(&dir);
    let ins = jbdev_volume::inspect::inspect(&path, None).unwrap();
    let blocks = ins.region.len_blocks();
    assert!(ins.read_journal_block(blocks - 1).is_ok());
    assert!(matches!(
        ins.read_journal_block(blocks),
        Err(VolumeError::InvalidArgument(_))
    ));
}

/// `create_checked` shows its check each target open and locked, saying
/// whether this create made it; a refusal writes nothing, removes what the
/// create made, and never a file that took the path in the meantime (found
/// by an adversarial pass, session 21: a failed format removed a volume
/// another process had just created at the path and was writing).
#[test]
fn a_refused_create_removes_only_the_file_it_made() {
    use jbdev_volume::{CreateTarget, TargetRole};
    let dir = tempfile::tempdir().unwrap();
    let refuse = |t: &CreateTarget<'_>| -> jbdev_volume::Result<()> {
        Err(VolumeError::InvalidArgument(format!(
            "refused {} ({:?}, created {})",
            t.path.display(),
            t.role,
            t.created
        )))
    };
    // A new file: the check sees it as created, and it goes again.
    let new = dir.path().join("new.img");
    let e = Volume::create_checked(&new, &small_format(), &OpenOptions::default(), &mut |t| {
        refuse(t)
    })
    .err()
    .expect("refused");
    assert!(e.to_string().contains("Home, created true"), "{e}");
    assert!(!new.exists(), "the refused create left the file it made");
    // An existing file: not created, its bytes untouched.
    let old = dir.path().join("old.img");
    std::fs::write(&old, vec![7u8; 8 << 20]).unwrap();
    let e = Volume::create_checked(&old, &small_format(), &OpenOptions::default(), &mut |t| {
        refuse(t)
    })
    .err()
    .expect("refused");
    assert!(e.to_string().contains("created false"), "{e}");
    assert!(std::fs::read(&old).unwrap().iter().all(|&b| b == 7));
    // A file put at the path after this create made its own: left alone.
    let other = dir.path().join("other.img");
    std::fs::write(&other, b"someone else's").unwrap();
    let e = Volume::create_checked(&new, &small_format(), &OpenOptions::default(), &mut |t| {
        std::fs::rename(&other, t.path).unwrap();
        refuse(t)
    })
    .err()
    .expect("refused");
    assert!(e.to_string().contains("created true"), "{e}");
    assert_eq!(std::fs::read(&new).unwrap(), b"someone else's");
    // The journal's turn comes after the home's, with its own role.
    let mut f = small_format();
    f.journal = jbdev_volume::JournalPlacement::External(dir.path().join("j.jnl"));
    let v2 = dir.path().join("v2.img");
    let mut roles = Vec::new();
    let e = Volume::create_checked(&v2, &f, &OpenOptions::default(), &mut |t| {
        roles.push(t.role);
        if t.role == TargetRole::Journal {
            refuse(t)
        } else {
            Ok(())
        }
    })
    .err()
    .expect("refused");
    assert!(e.to_string().contains("Journal, created true"), "{e}");
    assert_eq!(roles, [TargetRole::Home, TargetRole::Journal]);
    assert!(!v2.exists() && !dir.path().join("j.jnl").exists());
}
