//! `--device` refuses a device or file that holds a jbdev volume, a jbdev
//! journal or a file system unless `force` is set, and leaves the refused
//! content untouched.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

use jbdev_bench::cli::CommonArgs;
use jbdev_bench::{run_plans, sync, Plan};
use jbdev_volume::{BatchPolicy, FormatOptions, JournalPlacement, OpenOptions, Volume, WriteFlags};

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

/// Report #2: a file holding a jbdev external journal whose log still
/// holds an acknowledged write is refused like a volume (as `jbdev format`
/// refuses it), and stays as it was: the volume opens and reads the write
/// back. So is an internal journal whose volume superblock was lost. (The
/// old bench overwrote the journal: "corrupt journal: journal superblock:
/// bad jbd2 magic".)
#[test]
fn refuses_a_jbdev_journal_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let (img, jnl) = (dir.path().join("v.img"), dir.path().join("v.jnl"));
    let mut f = FormatOptions::new(16 << 20);
    f.journal_bytes = Some(4 << 20);
    f.journal = JournalPlacement::External(jnl.clone());
    Volume::create(&img, &f, &OpenOptions::default())
        .unwrap()
        .close()
        .unwrap();
    // The volume as a crash leaves it: the FUA write is only in the log.
    let held_off = OpenOptions {
        checkpoint_interval: jbdev_volume::MAX_WAIT,
        ..OpenOptions::default()
    };
    let v = Volume::open(&img, &held_off).unwrap();
    v.write_at(&[b'B'; 4096], 0, WriteFlags::FUA).unwrap();
    let crashed = [&img, &jnl].map(|p| {
        let c = p.with_extension(format!("{}.crash", p.extension().unwrap().display()));
        std::fs::copy(p, &c).unwrap();
        (c, p)
    });
    v.close().unwrap();
    for (c, p) in crashed {
        std::fs::rename(c, p).unwrap();
    }
    // Room for the benchmark; the journal is its first 4 MiB.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&jnl)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let before = std::fs::read(&jnl).unwrap();

    let err = bench(&jnl, dir.path(), false).expect_err("a jbdev journal must be refused");
    assert!(
        err.contains("holds a jbdev journal (uuid ") && err.contains("needs recovery"),
        "{err}"
    );
    assert!(err.contains("--force"), "{err}");
    assert!(
        std::fs::read(&jnl).unwrap() == before,
        "refused journal was modified"
    );
    let v = Volume::open(&img, &OpenOptions::default()).unwrap();
    assert_eq!(v.recovery_report().transactions_replayed, 1);
    let mut back = [0u8; 4096];
    v.read_at(&mut back, 0).unwrap();
    assert_eq!(back, [b'B'; 4096]);
    v.close().unwrap();

    bench(&jnl, dir.path(), true).expect("--force runs the benchmark");

    // An internal journal whose volume superblock is gone.
    let lost = dir.path().join("lost.img");
    Volume::create(
        &lost,
        &FormatOptions::new(64 << 20),
        &OpenOptions::default(),
    )
    .unwrap()
    .close()
    .unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&lost).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0u8; 4096], 0).unwrap();
    let err = bench(&lost, dir.path(), false).expect_err("a lost volume must be refused");
    assert!(err.contains("but no volume superblock"), "{err}");
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
