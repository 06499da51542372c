//! The `jbdev` admin commands against the real binary: format, info, check,
//! journal dump — and clear errors (never a panic) for bad input.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output};

mod cli_common;
use cli_common::{jbdev, text};

/// Creates `path` as a sparse file of `len` bytes.
fn sparse_file(path: &std::path::Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

fn assert_clean_error(o: &Output, what: &str) {
    let t = text(o);
    assert!(
        !o.status.success(),
        "{what}: expected failure, got success: {t}"
    );
    assert!(!t.contains("panicked"), "{what}: panicked: {t}");
    assert!(!t.trim().is_empty(), "{what}: no message");
}

/// The test cluster's config and a new image target on it named after
/// `tag`, or `None` (the test skips) without a cluster.
#[cfg(feature = "rbd")]
fn rbd_test_image(tag: &str) -> Option<(std::path::PathBuf, String)> {
    use jbdev_device::rbd::test_cluster;
    let conf = test_cluster::or_skip()?;
    let home = test_cluster::target(&conf, &test_cluster::unique_image(tag));
    Some((conf, home))
}

/// `jbdev format P --size 16M --journal-size 1M EXTRA...`, which must succeed.
fn format_16m(p: &str, extra: &[&str]) -> Output {
    let mut args = vec!["format", p, "--size", "16M", "--journal-size", "1M"];
    args.extend_from_slice(extra);
    let o = jbdev(&args);
    assert!(o.status.success(), "{}", text(&o));
    o
}

/// [`format_16m`] of `v.img` with its journal in `j.jnl`, in a new
/// temporary directory: (the directory, the volume, the journal).
fn external_16m() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (img, jnl) = (dir.path().join("v.img"), dir.path().join("j.jnl"));
    format_16m(img.to_str().unwrap(), &["--journal", jnl.to_str().unwrap()]);
    (dir, img, jnl)
}

#[test]
fn format_info_check_dump_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let p = img.to_str().unwrap();
    format_16m(p, &[]);
    assert_eq!(
        std::fs::metadata(&img).unwrap().len(),
        4096 + (1 << 20) + (16 << 20)
    );
    let o = jbdev(&["info", p]);
    let t = text(&o);
    assert!(
        o.status.success() && t.contains("16777216 bytes") && t.contains("clean"),
        "{t}"
    );
    let o = jbdev(&["info", "--json", p]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("info --json is JSON");
    assert_eq!(v["size_bytes"], 16 << 20);
    assert_eq!(v["journal"]["clean"], true);
    let o = jbdev(&["check", p]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("check: ok"));
    let o = jbdev(&["journal", "dump", p]);
    assert!(
        o.status.success() && text(&o).contains("clean"),
        "{}",
        text(&o)
    );
}

/// `--preallocate` leaves no hole in the image (its file system can no
/// longer run out under it), and the volume is as `format` left it.
#[test]
fn format_preallocate_allocates_the_whole_image() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let p = img.to_str().unwrap();
    format_16m(p, &[]);
    let sparse = std::fs::metadata(&img).unwrap();
    assert!(
        sparse.blocks() * 512 < sparse.len(),
        "a plain format is sparse"
    );
    std::fs::remove_file(&img).unwrap();
    let o = format_16m(p, &["--preallocate"]);
    assert!(text(&o).contains("preallocated"), "{}", text(&o));
    let meta = std::fs::metadata(&img).unwrap();
    assert_eq!(meta.len(), 4096 + (1 << 20) + (16 << 20));
    assert!(meta.blocks() * 512 >= meta.len(), "holes left: {meta:?}");
    let o = jbdev(&["info", "--json", p]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("info --json is JSON");
    assert_eq!(v["file_space"]["len_bytes"], meta.len());
    assert_eq!(v["file_space"]["may_run_out"], false);
    assert!(text(&jbdev(&["info", p])).contains("allocated "));
    let o = jbdev(&["check", p]);
    assert!(
        o.status.success() && text(&o).contains("check: ok"),
        "{}",
        text(&o)
    );
}

#[test]
fn external_journal_format_and_check() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let jrn = dir.path().join("v.journal");
    let o = jbdev(&[
        "format",
        img.to_str().unwrap(),
        "--size",
        "8M",
        "--journal",
        jrn.to_str().unwrap(),
        "--journal-size",
        "512K",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::metadata(&jrn).unwrap().len(), 512 << 10);
    let o = jbdev(&["check", img.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    // The journal of another volume is refused.
    let other = dir.path().join("o.img");
    let ojrn = dir.path().join("o.journal");
    let o = jbdev(&[
        "format",
        other.to_str().unwrap(),
        "--size",
        "8M",
        "--journal",
        ojrn.to_str().unwrap(),
        "--journal-size",
        "512K",
    ]);
    assert!(o.status.success());
    let o = jbdev(&[
        "check",
        img.to_str().unwrap(),
        "--journal",
        ojrn.to_str().unwrap(),
    ]);
    // The wrong journal given, not corruption: 1, not check's 2.
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("another volume"), "{}", text(&o));
    // `info` says so too.
    let i = jbdev(&[
        "info",
        img.to_str().unwrap(),
        "--journal",
        ojrn.to_str().unwrap(),
    ]);
    assert!(
        text(&i).contains("belongs to another volume"),
        "{}",
        text(&i)
    );
    let i = jbdev(&["info", "--json", img.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&i.stdout).expect("info --json is JSON");
    assert_eq!(v["journal"]["belongs_to_volume"], true);
}

#[test]
fn a_relative_journal_path_is_recorded_absolute() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_jbdev"))
        .current_dir(dir.path())
        .args(["format", "v.img", "--size", "8M", "--journal", "v.journal"])
        .args(["--journal-size", "512K"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // From another working directory, the recorded path still finds it.
    let img = dir.path().join("v.img");
    let o = jbdev(&["check", img.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = jbdev(&["info", "--json", img.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    // The volume's own file is no place for its external journal.
    let o = jbdev(&[
        "check",
        img.to_str().unwrap(),
        "--journal",
        img.to_str().unwrap(),
    ]);
    assert_clean_error(&o, "check with the journal at the volume");
    assert!(text(&o).contains("the volume's own file"), "{}", text(&o));
    let same = dir.path().join("same.img");
    let s = same.to_str().unwrap();
    let o = jbdev(&["format", s, "--size", "8M", "--journal", s]);
    assert_clean_error(&o, "format with the journal at the volume");
    assert!(text(&o).contains("the volume's own file"), "{}", text(&o));
    assert!(!same.exists());
    // A journal moved away is named, with what to do.
    let moved = dir.path().join("moved.journal");
    std::fs::rename(dir.path().join("v.journal"), &moved).unwrap();
    let o = jbdev(&["check", img.to_str().unwrap()]);
    assert_clean_error(&o, "check with the journal moved");
    assert!(text(&o).contains("give --journal PATH"), "{}", text(&o));
    let o = jbdev(&[
        "check",
        img.to_str().unwrap(),
        "--journal",
        moved.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    // `serve` takes --journal too (and `journal=` in --export): the hint
    // above used to name an option serve did not have. With stdin closed
    // the one stdio client goes away at once; what matters is that the
    // volume opened.
    let (i, m) = (img.to_str().unwrap(), moved.to_str().unwrap());
    let o = jbdev(&["serve", "-s", i]);
    assert_clean_error(&o, "serve with the journal moved");
    assert!(text(&o).contains("give --journal PATH"), "{}", text(&o));
    let export = format!("e={i},journal={m}");
    for args in [
        vec!["serve", "-s", i, "--journal", m],
        vec!["serve", "-s", "--export", &export],
    ] {
        let o = jbdev(&args);
        let t = text(&o);
        assert!(
            !t.contains("cannot open volume") && !t.contains("unexpected argument"),
            "{args:?}: {t}"
        );
        assert!(!t.contains("panicked"), "{args:?}: {t}");
    }
    // The servers closed the volume and its moved journal cleanly.
    let o = jbdev(&["check", i, "--journal", m]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn check_exits_2_on_a_corrupt_superblock() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let p = img.to_str().unwrap();
    assert!(
        jbdev(&["format", p, "--size", "4M", "--journal-size", "256K"])
            .status
            .success()
    );
    let mut bytes = std::fs::read(&img).unwrap();
    // The first copy damaged (a reserved byte, under its checksum): said,
    // exit 2, and every open uses the backup; a read-write open writes
    // the first copy again (session 30's operator pass: one flipped bit
    // made every command refuse the volume).
    bytes[400] ^= 0x10;
    std::fs::write(&img, &bytes).unwrap();
    let o = jbdev(&["check", p]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("backup copy is intact"), "{}", text(&o));
    let o = jbdev(&["info", p]);
    assert!(
        o.status.success() && text(&o).contains("DAMAGED"),
        "{}",
        text(&o)
    );
    jbdev_volume::Volume::open(&img, &jbdev_volume::OpenOptions::default())
        .unwrap()
        .close()
        .unwrap();
    let o = jbdev(&["check", p]);
    assert!(o.status.success(), "{}", text(&o));
    // (Rewritten with the open's session stamps: both copies equal.)
    bytes = std::fs::read(&img).unwrap();
    assert!(
        bytes[..512] == bytes[512..1024],
        "the first copy was not rewritten"
    );
    // Both copies damaged: the first copy's error.
    bytes[40] ^= 0xff; // inside the volume superblock
    bytes[512 + 40] ^= 0xff;
    std::fs::write(&img, &bytes).unwrap();
    let o = jbdev(&["check", p]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("checksum") || t.contains("superblock"), "{t}");
    // Damage the journal superblock instead.
    bytes[40] ^= 0xff;
    bytes[512 + 40] ^= 0xff;
    bytes[4096 + 0x1c] ^= 0x01; // s_start
    std::fs::write(&img, &bytes).unwrap();
    let o = jbdev(&["check", p]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("journal superblock"), "{}", text(&o));
}

#[test]
fn bad_input_gives_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let not_volume = dir.path().join("plain");
    std::fs::write(&not_volume, vec![0u8; 1 << 20]).unwrap();
    let nv = not_volume.to_str().unwrap();
    let o = jbdev(&["info", nv]);
    assert_clean_error(&o, "info on a non-volume");
    assert!(text(&o).contains("not a jbdev volume"), "{}", text(&o));
    let o = jbdev(&["check", nv]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_clean_error(&jbdev(&["info", "/nonexistent/x.img"]), "missing path");
    assert_clean_error(
        &jbdev(&["check", dir.path().to_str().unwrap()]),
        "a directory",
    );
    let img = dir.path().join("n.img");
    let p = img.to_str().unwrap();
    assert_clean_error(&jbdev(&["format", p, "--size", "12Q"]), "bad suffix");
    assert_clean_error(
        &jbdev(&["format", p, "--size", "1000"]),
        "size not a block multiple",
    );
    assert_clean_error(&jbdev(&["format", p]), "missing --size for a file");
    assert_clean_error(
        &jbdev(&["format", p, "--size", "4M", "--block-size", "3000"]),
        "bad block size",
    );
    assert_clean_error(
        &jbdev(&["format", p, "--size", "4M", "--journal-size", "4K"]),
        "journal too small",
    );
    // A failed format removes the file it created.
    assert!(
        !img.exists(),
        "a failed format left {} behind",
        img.display()
    );
    assert_clean_error(
        &jbdev(&["format", "/nonexistent/dir/x.img", "--size", "4M"]),
        "bad directory",
    );
    assert!(!Path::new("/nonexistent/dir/x.img").exists());
    assert_clean_error(&jbdev(&["journal", "dump", nv]), "dump of a non-volume");
}

fn uuid_of(p: &str) -> String {
    let o = jbdev(&["info", "--json", p]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("info --json is JSON");
    v["uuid"].as_str().expect("uuid").to_string()
}

#[test]
fn format_refuses_to_destroy_a_volume_or_data_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let p = img.to_str().unwrap();
    format_16m(p, &[]);
    let first = uuid_of(p);
    let o = jbdev(&["format", p, "--size", "16M", "--journal-size", "1M"]);
    assert_clean_error(&o, "format over a volume");
    assert!(text(&o).contains("holds a jbdev volume") && text(&o).contains(&first));
    assert!(text(&o).contains("--force"), "{}", text(&o));
    assert_eq!(uuid_of(p), first, "the refused format changed the volume");
    assert!(jbdev(&["check", p]).status.success());
    format_16m(p, &["--force"]);
    assert_ne!(uuid_of(p), first, "--force did not format");

    // Anything else with data in it: refused and left as it was.
    let data = dir.path().join("data.bin");
    let bytes: Vec<u8> = (0..(64u32 << 10)).map(|i| (i % 251) as u8 + 1).collect();
    std::fs::write(&data, &bytes).unwrap();
    let o = jbdev(&["format", data.to_str().unwrap(), "--size", "16M"]);
    assert_clean_error(&o, "format over data");
    assert!(text(&o).contains("holds data"), "{}", text(&o));
    assert_eq!(std::fs::read(&data).unwrap(), bytes);
    // A file system is named.
    let fs = dir.path().join("ext4.img");
    sparse_file(&fs, 8 << 20);
    match Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&fs)
        .status()
    {
        Ok(st) if st.success() => {
            let o = jbdev(&["format", fs.to_str().unwrap(), "--size", "4M"]);
            assert_clean_error(&o, "format over ext4");
            assert!(text(&o).contains("ext2/3/4 file system"), "{}", text(&o));
        }
        _ => eprintln!("mkfs.ext4 not available: the file system case is not run"),
    }

    // A fresh target (`truncate -s`) reads as zeroes (all holes): format
    // takes it without --force.
    let zeroes = dir.path().join("z.img");
    sparse_file(&zeroes, 32 << 20);
    format_16m(zeroes.to_str().unwrap(), &[]);

    // A journal without a volume superblock (a format interrupted before
    // its last step, or a volume that lost block 0: they look the same) is
    // refused without --force.
    let zero_block_0 = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&img)
            .unwrap()
            .write_all_at(&[0u8; 4096], 0)
            .unwrap()
    };
    zero_block_0();
    assert_clean_error(&jbdev(&["check", p]), "check of an interrupted format");
    let o = jbdev(&["format", p, "--size", "16M", "--journal-size", "1M"]);
    assert_clean_error(&o, "format over an interrupted format");
    assert!(text(&o).contains("interrupted format"), "{}", text(&o));
    format_16m(p, &["--force"]);
    assert!(jbdev(&["check", p]).status.success());
    // A volume that was written and then lost block 0: the same.
    let v = jbdev_volume::Volume::open(&img, &jbdev_volume::OpenOptions::default()).unwrap();
    v.write_at(&[9u8; 4096], 0, jbdev_volume::WriteFlags::FUA)
        .unwrap();
    v.close().unwrap();
    zero_block_0();
    let o = jbdev(&["format", p, "--size", "16M", "--journal-size", "1M"]);
    assert_clean_error(&o, "format over a used volume without block 0");
    assert!(text(&o).contains("--force"), "{}", text(&o));
    // `serve` says what it is too, and never to format it (session 30's
    // operator pass: "create one with `jbdev format`").
    let sock = dir.path().join("s.sock");
    let o = jbdev(&[
        "serve",
        p,
        "--socket",
        sock.to_str().unwrap(),
        "--read-only",
    ]);
    assert_clean_error(&o, "serve of a used volume without block 0");
    assert!(
        text(&o).contains("first block was lost") && !text(&o).contains("create one"),
        "{}",
        text(&o)
    );
    // Nor `grow` (session 31's docs pass).
    let o = jbdev(&["grow", p, "--size", "32M"]);
    assert_clean_error(&o, "grow of a used volume without block 0");
    assert!(
        text(&o).contains("first block was lost") && !text(&o).contains("create one"),
        "{}",
        text(&o)
    );
    format_16m(p, &["--force"]);

    // An external journal that belongs to a volume is refused too.
    let jrn = dir.path().join("v.journal");
    let other = dir.path().join("o.img");
    format_16m(p, &["--force", "--journal", jrn.to_str().unwrap()]);
    let o = jbdev(&[
        "format",
        other.to_str().unwrap(),
        "--size",
        "16M",
        "--journal",
        jrn.to_str().unwrap(),
        "--journal-size",
        "1M",
    ]);
    assert_clean_error(&o, "format over another volume's journal");
    assert!(text(&o).contains("--journal") && text(&o).contains("holds a jbdev journal"));
    assert!(
        !other.exists(),
        "the refused format created {}",
        other.display()
    );
    assert!(jbdev(&["check", p]).status.success());
}

/// Truncates (or extends) the existing file `p` to `len` bytes.
fn set_len(p: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(p)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn check_and_info_refuse_a_truncated_image() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let p = img.to_str().unwrap();
    format_16m(p, &[]);
    set_len(&img, 8 << 20);
    let o = jbdev(&["check", p]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("holds 8388608 bytes"), "{}", text(&o));
    // Report #20 and the cosmetic one: the superblock is intact, so not
    // "bad volume superblock", and the path is named once.
    assert!(text(&o).contains("shorter than the volume"), "{}", text(&o));
    assert!(!text(&o).contains("bad volume superblock"), "{}", text(&o));
    assert_eq!(text(&o).matches(p).count(), 1, "{}", text(&o));
    let o = jbdev(&["info", p]);
    assert_clean_error(&o, "info of a truncated image");
    assert!(text(&o).contains("holds 8388608 bytes"), "{}", text(&o));
    assert!(!text(&o).contains("bad volume superblock"), "{}", text(&o));
}

#[test]
fn a_volume_is_not_opened_twice() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let p = img.to_str().unwrap();
    assert!(
        jbdev(&["format", p, "--size", "4M", "--journal-size", "256K"])
            .status
            .success()
    );
    let v = jbdev_volume::Volume::open(&img, &jbdev_volume::OpenOptions::default()).unwrap();
    // `check` needs the volume to itself; `info` says who has it and
    // prints the superblocks it can read without the lock.
    let o = jbdev(&["check", p]);
    assert_clean_error(&o, "check while open read-write elsewhere");
    assert!(text(&o).contains("already open"), "{}", text(&o));
    // Naming the holder, as `info` does (it did not: s25 docs pass).
    let me = format!("held by pid {}: ", std::process::id());
    assert!(text(&o).contains(&me), "{}", text(&o));
    let o = jbdev(&["journal", "reset", p, "--force"]);
    assert_clean_error(&o, "reset while open read-write elsewhere");
    assert!(text(&o).contains(&me), "{}", text(&o));
    // A second open in this same process says that it is ours.
    let again = jbdev_volume::Volume::open(&img, &jbdev_volume::OpenOptions::default())
        .err()
        .expect("a second open is refused")
        .to_string();
    assert!(again.contains("held by this process"), "{again}");
    let o = jbdev(&["info", p]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("OPEN ELSEWHERE"), "{}", text(&o));
    assert!(text(&o).contains("journal state"), "{}", text(&o));
    v.close().unwrap();
    let o = jbdev(&["info", p]);
    assert!(o.status.success() && !text(&o).contains("OPEN ELSEWHERE"));
}

/// Without the `rbd` feature an RBD target is a clear error, not a file.
#[cfg(not(feature = "rbd"))]
#[test]
fn rbd_targets_without_the_feature_are_a_clear_error() {
    for args in [
        &["info", "rbd:rbd/vol"][..],
        &["format", "rbd:rbd/vol", "--size", "16M"][..],
    ] {
        let o = jbdev(args);
        assert_clean_error(&o, "rbd target without the feature");
        assert!(
            text(&o).contains("built without rbd support"),
            "{}",
            text(&o)
        );
    }
}

/// format, info, check and journal dump on RBD targets, each journal
/// placement shown with what it promises (throwaway test cluster).
#[cfg(feature = "rbd")]
#[test]
fn rbd_format_info_check_dump_with_each_placement() {
    use jbdev_device::rbd::test_cluster;
    let conf = match test_cluster::ensure() {
        Ok(c) => c,
        Err(why) => {
            println!("SKIP: {why}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("journal");
    let rbd_j = test_cluster::target(&conf, &test_cluster::unique_image("admin-j"));
    for (journal, promise) in [
        (
            None,
            "internal, on RBD: nothing acknowledged depends on this node",
        ),
        (
            Some(local.to_str().unwrap()),
            "local: acknowledged writes not yet checkpointed live only on this node",
        ),
        (
            Some(rbd_j.as_str()),
            "on RBD: nothing acknowledged depends on this node",
        ),
    ] {
        let home = test_cluster::target(&conf, &test_cluster::unique_image("admin"));
        let mut args = vec!["format", &home, "--size", "16M", "--journal-size", "1M"];
        if let Some(j) = journal {
            args.extend(["--journal", j]);
        }
        let o = jbdev(&args);
        assert!(o.status.success(), "{}", text(&o));
        let o = jbdev(&["info", &home]);
        let t = text(&o);
        assert!(
            o.status.success() && t.contains("home            rbd"),
            "{t}"
        );
        assert!(t.contains(promise), "{t}");
        let o = jbdev(&["info", "--json", &home]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("info --json is JSON");
        assert_eq!(v["size_bytes"], 16 << 20);
        assert_eq!(v["journal"]["promise"], promise);
        let o = jbdev(&["check", &home]);
        assert!(text(&o).contains("check: ok"), "{}", text(&o));
        let o = jbdev(&["journal", "dump", &home]);
        assert!(
            o.status.success() && text(&o).contains("clean"),
            "{}",
            text(&o)
        );
    }
    let o = jbdev(&["info", "rbd:rbd/no/such"]);
    assert_clean_error(&o, "a namespace target");
    assert!(text(&o).contains("namespaces"), "{}", text(&o));
}

/// Report s20 #5: `format rbd:... --preallocate` is a usage error (exit
/// 64) before anything is written: no image is created, and the same
/// format without the flag then works. (Fails on the old code: the volume
/// was formatted, then the option refused with exit 1.)
#[cfg(feature = "rbd")]
#[test]
fn rbd_format_preallocate_is_refused_before_anything_is_written() {
    use jbdev_device::rbd::test_cluster;
    let Some((_, home)) = rbd_test_image("prealloc") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let local_j = dir.path().join("j");
    let o = jbdev(&[
        "format",
        &home,
        "--size",
        "16M",
        "--preallocate",
        "--journal",
        local_j.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(64), "{}", text(&o));
    assert!(text(&o).contains("--preallocate"), "{}", text(&o));
    assert!(!text(&o).contains("formatted"), "{}", text(&o));
    assert!(
        !test_cluster::exists(&home),
        "the refused format created {home}"
    );
    assert!(
        !local_j.exists(),
        "the refused format wrote the journal file"
    );
    let o = jbdev(&["format", &home, "--size", "16M"]);
    assert!(o.status.success(), "{}", text(&o));
}

/// Session 21, defect 4: `format` of an existing RBD image smaller than
/// the volume grows it and says so, from and to how many bytes (as it does
/// for an image file); an image as large as needed is not resized and
/// nothing is said. (Fails on the old code: it grew the image silently.)
#[cfg(feature = "rbd")]
#[test]
fn rbd_format_says_when_it_grew_the_image() {
    let Some((_, home)) = rbd_test_image("grow") else {
        return;
    };
    let small = jbdev_device::OpenOptions {
        create_size: Some(8 << 20),
        ..Default::default()
    };
    drop(jbdev_device::open_device(home.as_ref(), &small).unwrap());
    let o = jbdev(&["format", &home, "--size", "16M", "--journal-size", "1M"]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let needed = (16u64 << 20) + (1 << 20) + 4096;
    assert!(
        t.contains(&format!("grew the image from 8388608 to {needed} bytes")),
        "{t}"
    );
    let o = jbdev(&[
        "format",
        &home,
        "--size",
        "16M",
        "--journal-size",
        "1M",
        "--force",
    ]);
    let t = text(&o);
    assert!(o.status.success() && !t.contains("grew"), "{t}");
}

/// An image file smaller than the volume is extended, and format says so.
#[test]
fn format_says_when_it_extended_the_image_file() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    sparse_file(&img, 8 << 20);
    let o = format_16m(img.to_str().unwrap(), &[]);
    let needed = (16u64 << 20) + (1 << 20) + 4096;
    let t = text(&o);
    assert!(
        t.contains(&format!("grew the image from 8388608 to {needed} bytes")),
        "{t}"
    );
    assert_eq!(std::fs::metadata(&img).unwrap().len(), needed);
}

/// `jbdev ARGS` with `$CEPH_CONF` naming a file that does not exist: the
/// node has no default Ceph cluster, only what targets name (`:conf=`).
#[cfg(feature = "rbd")]
fn jbdev_without_default_ceph(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_jbdev"))
        .args(args)
        .env("CEPH_CONF", "/nonexistent/jbdev-test/ceph.conf")
        .output()
        .expect("run jbdev")
}

/// Report s20 #1: a journal recorded as a bare `rbd:POOL/IMAGE` is on its
/// home's cluster (the home's `conf=`), not on the node's default one: with
/// no default cluster at all, format, info, check, journal dump and
/// journal reset all find it. (Fails on the old code: format failed
/// reading the default config, and so did every later open; on a node
/// whose default is another cluster, `info` said MISSING and `journal
/// reset` made a new, empty journal there, losing acknowledged writes.)
#[cfg(feature = "rbd")]
#[test]
fn rbd_a_bare_journal_target_is_on_the_homes_cluster() {
    use jbdev_device::rbd::test_cluster;
    let Some((conf, home)) = rbd_test_image("bare-h") else {
        return;
    };
    let bare = format!("rbd:rbd/{}", test_cluster::unique_image("bare-j"));
    let run = jbdev_without_default_ceph;
    let o = run(&[
        "format",
        &home,
        "--size",
        "16M",
        "--journal-size",
        "1M",
        "--journal",
        &bare,
    ]);
    assert!(o.status.success(), "format: {}", text(&o));
    assert!(
        test_cluster::exists(&format!("{bare}:conf={}", conf.display())),
        "the journal is not on the home's cluster"
    );
    let o = run(&["info", &home]);
    let t = text(&o);
    assert!(
        o.status.success() && t.contains("journal state   clean"),
        "{t}"
    );
    let o = run(&["check", &home]);
    assert!(text(&o).contains("check: ok"), "{}", text(&o));
    let o = run(&["journal", "dump", &home]);
    assert!(
        o.status.success() && text(&o).contains("clean"),
        "{}",
        text(&o)
    );
    // The journal is there and clean: reset refuses (it does not create one).
    let o = run(&["journal", "reset", &home]);
    assert_clean_error(&o, "reset of a clean journal");
    assert!(!text(&o).contains("created"), "{}", text(&o));
}

/// Report s20 #1: a journal that cannot be reached because its Ceph config
/// cannot be read is not "MISSING" (which sends the operator to `journal
/// reset`): info and check say what failed, and `journal reset` creates
/// nothing. (Fails on the old code: info said "journal state MISSING:
/// nothing at ...".)
#[cfg(feature = "rbd")]
#[test]
fn rbd_an_unreadable_ceph_config_is_not_a_missing_journal() {
    use jbdev_device::rbd::test_cluster;
    let Some((conf, home)) = rbd_test_image("noconf-h") else {
        return;
    };
    let jimg = test_cluster::unique_image("noconf-j");
    let journal = test_cluster::target(&conf, &jimg);
    let o = jbdev(&[
        "format",
        &home,
        "--size",
        "16M",
        "--journal-size",
        "1M",
        "--journal",
        &journal,
    ]);
    assert!(o.status.success(), "format: {}", text(&o));
    let bad = format!("rbd:rbd/{jimg}:conf=/nonexistent/jbdev-test/ceph.conf");
    let o = jbdev(&["info", &home, "--journal", &bad]);
    let t = text(&o);
    assert!(!t.contains("MISSING") && !t.contains("nothing at"), "{t}");
    assert!(t.contains("reading ceph configuration"), "{t}");
    let o = jbdev(&["check", &home, "--journal", &bad]);
    let t = text(&o);
    assert_clean_error(&o, "check with an unreadable journal config");
    assert!(!t.contains("nothing at"), "{t}");
    assert!(t.contains("reading ceph configuration"), "{t}");
    let o = jbdev(&["journal", "reset", &home, "--journal", &bad, "--force"]);
    assert_clean_error(&o, "reset with an unreadable journal config");
    assert!(!text(&o).contains("created"), "{}", text(&o));
    // The real journal is untouched and still clean.
    let o = jbdev(&["info", &home]);
    assert!(text(&o).contains("journal state   clean"), "{}", text(&o));
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let p = img.to_str().unwrap();
    let o = jbdev(&["format", p, "--size", "16M", "--journal-size", "16M"]);
    assert!(o.status.success(), "{}", text(&o));
    // 1000 one-block transactions stay in the log area after the close, and
    // `journal dump --all` prints a line for each of their 3000 blocks:
    // more than a pipe holds. The reader goes away after the first bytes,
    // like `| head -1`.
    let v = jbdev_volume::Volume::open(&img, &jbdev_volume::OpenOptions::default()).unwrap();
    for i in 0..1000u64 {
        v.write_at(&[7u8; 4096], i * 4096, jbdev_volume::WriteFlags::FUA)
            .unwrap();
    }
    v.close().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_jbdev"))
        .args(["journal", "dump", "--all", p])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    out.read_exact(&mut first).unwrap();
    drop(out);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        o.status.success() || o.status.signal() == Some(13),
        "{:?}: {err}",
        o.status
    );
}

/// Sets the little-endian field at `off` of the volume superblock in block
/// 0 of `img` and fixes its checksum (like the report's setvol.py).
fn set_volume_field(img: &Path, off: usize, value: &[u8]) {
    use jbdev_volume::superblock::VolumeSuperblock;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let mut b = [0u8; 512];
    f.read_exact_at(&mut b, 0).unwrap();
    b[off..off + value.len()].copy_from_slice(value);
    let c = VolumeSuperblock::checksum_of(&b);
    b[508..512].copy_from_slice(&c.to_le_bytes());
    f.write_all_at(&b, 0).unwrap();
}

/// A crash image of `img` (formatted with a 4096-byte block size): the
/// volume is opened with checkpoints held off, each of `writes` (offset,
/// byte) is written as one FUA block (one committed transaction each), and
/// the file is copied while the volume is still open, as a crash would
/// leave it: the journal needs recovery and holds every transaction.
fn crash_copy(img: &Path, writes: &[(u64, u8)]) -> std::path::PathBuf {
    let opts = jbdev_volume::OpenOptions {
        checkpoint_interval: jbdev_volume::MAX_WAIT,
        ..Default::default()
    };
    let v = jbdev_volume::Volume::open(img, &opts).unwrap();
    for &(off, byte) in writes {
        v.write_at(&[byte; 4096], off, jbdev_volume::WriteFlags::FUA)
            .unwrap();
    }
    let copy = img.with_extension("crash");
    std::fs::copy(img, &copy).unwrap();
    v.close().unwrap();
    copy
}

/// Report #1: a used volume whose block 0 was lost, with a pristine journal
/// (large writes go home without a transaction), is not an interrupted
/// format: format refuses it without --force, and check names the journal
/// instead of suggesting `jbdev format`.
#[test]
fn a_journal_without_a_volume_superblock_is_refused_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let p = img.to_str().unwrap();
    format_16m(p, &[]);
    let opts = jbdev_volume::OpenOptions {
        direct_write_threshold: 256 << 10,
        ..Default::default()
    };
    let v = jbdev_volume::Volume::open(&img, &opts).unwrap();
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8 + 1).collect();
    v.write_at(&data, 0, jbdev_volume::WriteFlags::FUA).unwrap();
    v.close().unwrap();
    let o = jbdev(&["info", p]);
    assert!(
        text(&o).contains("clean (next transaction 1)"),
        "the journal must look pristine for this test: {}",
        text(&o)
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .write_all_at(&[0u8; 4096], 0)
        .unwrap();
    let o = jbdev(&["check", p]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("jbdev journal"), "{}", text(&o));
    assert!(!text(&o).contains("create one"), "{}", text(&o));
    let o = jbdev(&["info", p]);
    assert_clean_error(&o, "info without block 0");
    assert!(text(&o).contains("jbdev journal"), "{}", text(&o));
    let o = jbdev(&["format", p, "--size", "16M", "--journal-size", "1M"]);
    assert_clean_error(&o, "format over a journal without a volume superblock");
    let t = text(&o);
    assert!(
        t.contains("holds a jbdev journal") && t.contains("interrupted format"),
        "{t}"
    );
    assert!(t.contains("jbdev check") && t.contains("--force"), "{t}");
    let mut back = vec![0u8; data.len()];
    std::fs::File::open(&img)
        .unwrap()
        .read_exact_at(&mut back, 4096 + (1 << 20))
        .unwrap();
    assert!(back == data, "the refused format changed the data");
    format_16m(p, &["--force"]);
}

/// Report #2: format looks at every byte it would write over (block 0 and
/// the whole journal area), and at the data of an image file after it.
#[test]
fn format_refuses_data_anywhere_it_would_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let late = dir.path().join("late.img");
    let f = std::fs::File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&late)
        .unwrap();
    f.set_len(16 << 20).unwrap();
    let junk: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 241) as u8 + 1).collect();
    f.write_all_at(&junk, 2 << 20).unwrap();
    // The default journal of an 8 MiB volume is 2 MiB: it covers 2 MiB.
    let o = jbdev(&["format", late.to_str().unwrap(), "--size", "8M"]);
    assert_clean_error(&o, "format over data inside the journal area");
    assert!(
        text(&o).contains("holds data (byte 2097152 is not zero)"),
        "{}",
        text(&o)
    );
    let mut back = vec![0u8; junk.len()];
    f.read_exact_at(&mut back, 2 << 20).unwrap();
    assert!(back == junk, "the refused format changed the file");
    // Data of a sparse image past everything format writes, within the
    // probe's reach: refused too.
    let far = dir.path().join("far.img");
    let f = std::fs::File::create(&far).unwrap();
    f.set_len(128 << 20).unwrap();
    f.write_all_at(&[5u8; 4096], 100 << 20).unwrap();
    let o = jbdev(&["format", far.to_str().unwrap(), "--size", "8M"]);
    assert_clean_error(&o, "format over data in the data area");
    assert!(
        text(&o).contains(&format!("byte {} is not zero", 100u64 << 20)),
        "{}",
        text(&o)
    );
}

/// Report #3: a failed format removes the file it created through a
/// dangling symlink, and never the symlink itself.
#[test]
fn a_failed_format_keeps_the_symlink_and_removes_the_file_it_made() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("dl.img");
    let target = dir.path().join("target.img");
    std::os::unix::fs::symlink("target.img", &link).unwrap();
    // Creating the image works; opening the journal does not.
    let o = jbdev(&[
        "format",
        link.to_str().unwrap(),
        "--size",
        "4M",
        "--journal",
        "/nonexistent/dir/j.journal",
    ]);
    assert_clean_error(&o, "format with a journal in a missing directory");
    let meta = std::fs::symlink_metadata(&link).expect("the symlink was removed");
    assert!(meta.file_type().is_symlink());
    assert!(
        std::fs::symlink_metadata(&target).is_err(),
        "the file format created through the symlink was left behind"
    );
}

/// Report #4: with stdout closed (`| true`) format still does all its work
/// (--preallocate included), and nothing panics.
#[test]
fn format_with_stdout_closed_does_its_work_quietly() {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = Command::new(env!("CARGO_BIN_EXE_jbdev"))
        .args(["format", img.to_str().unwrap(), "--size", "16M"])
        .args(["--journal-size", "1M", "--preallocate"])
        .stdout(writer)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        o.status.signal() == Some(13) || o.status.code() == Some(141),
        "{:?}: {err}",
        o.status
    );
    let meta = std::fs::metadata(&img).unwrap();
    assert!(
        meta.blocks() * 512 >= meta.len(),
        "--preallocate was skipped"
    );
    assert!(jbdev(&["check", img.to_str().unwrap()]).status.success());
}

/// Report #5: a stdout that fails (`>/dev/full`) is a clean error, exit 1,
/// also for help and the version asked for.
#[test]
fn a_failing_stdout_is_a_clean_error() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let p = img.to_str().unwrap();
    format_16m(p, &[]);
    let fresh = dir.path().join("w.img");
    for args in [
        &["check", p][..],
        &["info", "--json", p][..],
        &["info", p][..],
        &["journal", "dump", "--all", p][..],
        &["format", fresh.to_str().unwrap(), "--size", "4M"][..],
        // Help and version asked for: they exited 0 with nothing written.
        &["--help"][..],
        &["grow", "--help"][..],
        &["--version"][..],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_jbdev"))
            .args(args)
            .stdout(full)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("jbdev: error: writing to stdout: No space left on device"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// Report #6: check applies the checks every open applies: a log naming a
/// home block past the end of the volume is corruption.
#[test]
fn check_finds_a_home_block_past_the_end_of_the_volume() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    format_16m(img.to_str().unwrap(), &[]);
    let copy = crash_copy(&img, &[(15 << 20, 1), (0, 2)]);
    let c = copy.to_str().unwrap();
    let o = jbdev(&["check", c]);
    assert!(o.status.success(), "the crash image is fine: {}", text(&o));
    set_volume_field(&copy, 32, &(8u64 << 20).to_le_bytes()); // size_bytes
    let ro = jbdev_volume::OpenOptions {
        read_only: true,
        ..Default::default()
    };
    let opened = jbdev_volume::Volume::open(&copy, &ro);
    assert!(opened.is_err(), "open takes it");
    let o = jbdev(&["check", c]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("home block 3840"), "{}", text(&o));
}

/// Report #7: unknown ro_compat feature bits allow read-only opens only;
/// info shows them and check reports them.
#[test]
fn unknown_ro_compat_features_allow_only_read_only_opens() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let p = img.to_str().unwrap();
    format_16m(p, &[]);
    set_volume_field(&img, 64, &1u32.to_le_bytes()); // feature_ro_compat
    let err = match jbdev_volume::Volume::open(&img, &Default::default()) {
        Ok(_) => panic!("a read-write open took unknown ro_compat features"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("0x1") && err.contains("read-only"), "{err}");
    let ro = jbdev_volume::OpenOptions {
        read_only: true,
        ..Default::default()
    };
    jbdev_volume::Volume::open(&img, &ro)
        .expect("read-only open")
        .close()
        .unwrap();
    let o = jbdev(&["info", p]);
    assert!(text(&o).contains("ro_compat 0x1"), "{}", text(&o));
    let o = jbdev(&["info", "--json", p]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["feature_ro_compat"], 1);
    let o = jbdev(&["check", p]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("features 0x1"), "{}", text(&o));
    // Nor do the commands that write it without an open (session 31's
    // docs pass: grow and reset --force rewrote such a volume).
    let before = std::fs::read(&img).unwrap();
    for args in [
        &["grow", p, "--size", "32M"][..],
        &["journal", "reset", p, "--force"][..],
    ] {
        let o = jbdev(args);
        assert_clean_error(&o, &args.join(" "));
        assert!(text(&o).contains("read-only"), "{args:?}: {}", text(&o));
    }
    assert!(
        std::fs::read(&img).unwrap() == before,
        "the volume was changed"
    );
}

/// Report #8: a usage error exits 64 (EX_USAGE), never check's 2.
#[test]
fn usage_errors_exit_64() {
    for args in [
        &["check", "--jornal", "j.img", "v.img"][..],
        &["format"][..],
        &["no-such-command"][..],
        &[][..],
    ] {
        let o = jbdev(args);
        assert_eq!(o.status.code(), Some(64), "{args:?}: {}", text(&o));
    }
    // Values clap cannot judge alone, refused by `format` itself before it
    // creates anything: usage errors too (they exited 1).
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("u.img");
    let i = img.to_str().unwrap();
    for (args, want) in [
        (
            &["format", i, "--size", "0"][..],
            "--size must be a positive multiple",
        ),
        (
            &["format", i, "--size", "64M", "--block-size", "512"][..],
            "--block-size must be a power of two",
        ),
        (
            &["format", i, "--size", "64M", "--journal-size", "1K"][..],
            "journal size 1024",
        ),
        (&["format", i][..], "give --size"),
    ] {
        let o = jbdev(args);
        assert_eq!(o.status.code(), Some(64), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(want), "{args:?}: {}", text(&o));
        assert!(!img.exists(), "{args:?} created the image");
    }
    assert_eq!(jbdev(&["check", "--help"]).status.code(), Some(0));
    assert_eq!(jbdev(&["--version"]).status.code(), Some(0));
}

/// Report #9: check exits 2 only for a damaged jbdev volume or journal; a
/// file that is no volume, a journal given as the volume, or a --journal
/// that is not this volume's journal are errors (1).
#[test]
fn check_exit_codes_tell_corruption_from_wrong_input() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain");
    std::fs::write(&plain, vec![7u8; 1 << 20]).unwrap();
    let o = jbdev(&["check", plain.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("not a jbdev volume"), "{}", text(&o));
    let img = dir.path().join("v.img");
    let jrn = dir.path().join("v.journal");
    let p = img.to_str().unwrap();
    format_16m(p, &["--journal", jrn.to_str().unwrap()]);
    let o = jbdev(&["check", jrn.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("is a jbdev journal"), "{}", text(&o));
    let other = dir.path().join("o.img");
    format_16m(other.to_str().unwrap(), &[]);
    let o = jbdev(&["check", p, "--journal", other.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("the wrong --journal?"), "{}", text(&o));
    let ojrn = dir.path().join("o.journal");
    let o2 = dir.path().join("o2.img");
    format_16m(o2.to_str().unwrap(), &["--journal", ojrn.to_str().unwrap()]);
    let o = jbdev(&["check", p, "--journal", ojrn.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("another volume"), "{}", text(&o));
    // An internal-journal volume given a --journal: refused, not ignored.
    let o = jbdev(&[
        "check",
        other.to_str().unwrap(),
        "--journal",
        "/nonexistent",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("internal"), "{}", text(&o));
    assert!(jbdev(&["check", p]).status.success());
}

/// Report #12: `stats` against something that serves no jbdev metrics is
/// an error, not an empty report.
#[test]
fn stats_refuses_a_page_without_jbdev_metrics() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            // The whole request, then the reply.
            let mut req = Vec::new();
            let mut b = [0u8; 256];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut b) {
                    Ok(n) if n > 0 => req.extend_from_slice(&b[..n]),
                    _ => break,
                }
            }
            let _ = s.write_all(
                b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n\
                  # HELP node_load1 load\nnode_load1 0.5\nprocess_cpu_seconds_total 3\n",
            );
        }
    });
    let o = jbdev(&["stats", &port.to_string(), "--interval", "0.05"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("no jbdev metrics"), "{}", text(&o));
}

/// Byte offset in `img` of journal block `pos` of its internal journal
/// (4096-byte blocks, journal at block 1).
fn journal_block_offset(pos: u64) -> u64 {
    4096 + pos * 4096
}

/// A 16 MiB volume's crash copy (see [`crash_copy`]) after six FUA writes,
/// one transaction each (block 2i gets byte i+1), and the writes.
fn six_writes_crash_copy() -> (tempfile::TempDir, std::path::PathBuf, Vec<(u64, u8)>) {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    format_16m(img.to_str().unwrap(), &[]);
    let writes: Vec<(u64, u8)> = (0..6u64).map(|i| (i * 8192, i as u8 + 1)).collect();
    let copy = crash_copy(&img, &writes);
    (dir, copy, writes)
}

/// Damages the data digest of the third transaction's commit block of the
/// internal journal of `image` (the block's own checksum made right), found
/// in `dump`, the output of `jbdev journal dump`: what `check` calls mid-log
/// corruption when later transactions follow.
fn damage_third_commit_digest(image: &Path, dump: &str) {
    use jbdev_volume::journal::format::{self, JournalSuperblock};
    let commits: Vec<u64> = dump
        .lines()
        .filter(|l| l.contains(": commit "))
        .map(|l| l.split(':').next().unwrap().trim().parse().unwrap())
        .collect();
    assert!(commits.len() >= 4, "{dump}");
    let at = journal_block_offset(commits[2]);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .unwrap();
    let mut jsb = vec![0u8; 4096];
    f.read_exact_at(&mut jsb, 4096).unwrap();
    let seed = JournalSuperblock::decode(&jsb).unwrap().csum_seed();
    let mut block = vec![0u8; 4096];
    f.read_exact_at(&mut block, at).unwrap();
    block[jbdev_volume::journal::writer::DIGEST_OFFSET] ^= 0x40;
    let sum = format::commit_block_checksum(seed, &block);
    block[16..20].copy_from_slice(&sum.to_be_bytes());
    f.write_all_at(&block, at).unwrap();
}

/// Report #13: `journal dump` verifies each commit block's data digest,
/// and says so (exit 2) when committed transactions follow a damaged one.
#[test]
fn journal_dump_checks_digests_and_reports_mid_log_corruption() {
    let (_dir, copy, _) = six_writes_crash_copy();
    let c = copy.to_str().unwrap();
    let o = jbdev(&["journal", "dump", c]);
    assert!(o.status.success(), "{}", text(&o));
    let dump = text(&o);
    assert!(dump.contains("data digest ok"), "{dump}");
    damage_third_commit_digest(&copy, &dump);
    let o = jbdev(&["journal", "dump", c]);
    let dump = text(&o);
    assert!(dump.contains("data digest MISMATCH"), "{dump}");
    assert!(dump.contains("mid-log corruption"), "{dump}");
    assert_eq!(o.status.code(), Some(2), "{dump}");
    assert_eq!(jbdev(&["check", c]).status.code(), Some(2));
}

/// Report #14: `journal dump` with another volume's journal warns and
/// fails.
#[test]
fn journal_dump_of_another_volumes_journal_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (v1, j1, v2, j2) = (
        dir.path().join("v1.img"),
        dir.path().join("j1"),
        dir.path().join("v2.img"),
        dir.path().join("j2"),
    );
    format_16m(v1.to_str().unwrap(), &["--journal", j1.to_str().unwrap()]);
    format_16m(v2.to_str().unwrap(), &["--journal", j2.to_str().unwrap()]);
    let o = jbdev(&[
        "journal",
        "dump",
        v1.to_str().unwrap(),
        "--journal",
        j2.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("another volume"), "{}", text(&o));
}

/// Report #10: the external journal's path is recorded as given (made
/// absolute, symlinks kept), as raw bytes (a non-UTF-8 path works), and a
/// path too long for the superblock is refused at format.
#[test]
fn the_journal_path_hint_keeps_symlinks_and_raw_bytes() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    // A symlink stays the symlink (a /dev/disk/by-id name stays that name).
    let real = dir.path().join("real.journal");
    sparse_file(&real, 1 << 20);
    let link = dir.path().join("by-id-link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let img = dir.path().join("v.img");
    format_16m(
        img.to_str().unwrap(),
        &["--journal", link.to_str().unwrap()],
    );
    let o = jbdev(&["info", "--json", img.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let placement = v["journal"]["placement"].as_str().unwrap().to_string();
    assert!(
        placement.contains("by-id-link") && !placement.contains("real.journal"),
        "{placement}"
    );
    // A non-UTF-8 directory name: check finds the journal without --journal.
    let odd = dir.path().join(OsStr::from_bytes(b"j\xff\xfe"));
    std::fs::create_dir(&odd).unwrap();
    let img2 = dir.path().join("v2.img");
    let o = Command::new(env!("CARGO_BIN_EXE_jbdev"))
        .arg("format")
        .arg(&img2)
        .args(["--size", "16M", "--journal-size", "1M", "--journal"])
        .arg(odd.join("j"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = jbdev(&["check", img2.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    // Over 255 bytes once absolute: refused, nothing left behind.
    let long = dir.path().join("d".repeat(200)).join("j".repeat(60));
    std::fs::create_dir(long.parent().unwrap()).unwrap();
    let img3 = dir.path().join("v3.img");
    let o = jbdev(&[
        "format",
        img3.to_str().unwrap(),
        "--size",
        "16M",
        "--journal",
        long.to_str().unwrap(),
    ]);
    assert_clean_error(&o, "a journal path over 255 bytes");
    assert!(text(&o).contains("at most 255 bytes"), "{}", text(&o));
    assert!(!img3.exists() && !long.exists());
}

/// A loop device over `backing` (read-only with `-r`), detached on drop;
/// None where losetup is not allowed (not root).
fn loop_device(backing: &Path, read_only: bool) -> Option<LoopDev> {
    let mut cmd = Command::new("losetup");
    if read_only {
        cmd.arg("-r");
    }
    let o = cmd.args(["-f", "--show"]).arg(backing).output().ok()?;
    o.status
        .success()
        .then(|| LoopDev(String::from_utf8_lossy(&o.stdout).trim().to_string()))
}

struct LoopDev(String);

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// Report #11: format of a whole block device without --size uses all of
/// it: superblock + journal + data = the device's size (a loop device;
/// skipped where losetup is not allowed).
#[test]
fn format_of_a_whole_device_uses_all_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("loop.img");
    sparse_file(&backing, 64 << 20);
    let Some(lo) = loop_device(&backing, false) else {
        println!("SKIP: no loop device (losetup needs root)");
        return;
    };
    let dev = lo.0.clone();
    let o = jbdev(&["format", &dev]);
    assert!(o.status.success(), "{}", text(&o));
    let o = jbdev(&["info", "--json", &dev]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let data = v["size_bytes"].as_u64().unwrap();
    let journal = v["journal"]["len_bytes"].as_u64().unwrap();
    assert_eq!(data + journal + 4096, 64 << 20, "{v}");
    // A journal that leaves no room for data: said so (report #19).
    let o = jbdev(&["format", &dev, "--force", "--journal-size", "64M"]);
    assert_clean_error(&o, "a journal as large as the device");
    assert!(text(&o).contains("no room for data"), "{}", text(&o));
    // Report #16: a device held exclusively by something else (here this
    // test, as a mount would) is not blamed on another jbdev.
    use std::os::unix::fs::OpenOptionsExt;
    let held = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(0o200) // O_EXCL: what the kernel does for a mount
        .open(&dev)
        .unwrap();
    let o = jbdev(&["format", &dev, "--force"]);
    assert_clean_error(&o, "format of a device held exclusively");
    assert!(text(&o).contains("mounted file system"), "{}", text(&o));
    drop(held);
}

/// Report #9: a 1 KiB-block volume on a 4 KiB-sector device is not
/// corruption: check says why it cannot be used, exit 1.
#[test]
fn check_of_a_volume_on_a_device_with_larger_sectors_is_not_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("k.img");
    let o = jbdev(&[
        "format",
        img.to_str().unwrap(),
        "--size",
        "8M",
        "--journal-size",
        "1M",
        "--block-size",
        "1024",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = Command::new("losetup")
        .args(["-b", "4096", "-f", "--show"])
        .arg(&img)
        .output();
    let dev = match o {
        Ok(o) if o.status.success() => LoopDev(String::from_utf8_lossy(&o.stdout).trim().into()),
        _ => {
            println!("SKIP: no loop device (losetup needs root)");
            return;
        }
    };
    let o = jbdev(&["check", &dev.0]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("4096-byte logical blocks"),
        "{}",
        text(&o)
    );
}

/// Report #17: a read-only block device is named as such by format.
#[test]
fn format_names_a_read_only_device() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("ro.img");
    sparse_file(&backing, 16 << 20);
    let Some(lo) = loop_device(&backing, true) else {
        println!("SKIP: no loop device (losetup needs root)");
        return;
    };
    let o = jbdev(&["format", &lo.0, "--force"]);
    assert_clean_error(&o, "format of a read-only device");
    assert!(text(&o).contains("read-only block device"), "{}", text(&o));
}

/// Report #15: info and journal dump compare the journal superblock with
/// the volume superblock (check and every open already refuse a mismatch).
#[test]
fn info_and_dump_compare_the_journal_with_the_volume() {
    use jbdev_volume::journal::format::JournalSuperblock;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let p = img.to_str().unwrap();
    format_16m(p, &[]);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&img)
        .unwrap();
    let mut b = vec![0u8; 4096];
    f.read_exact_at(&mut b, 4096).unwrap();
    let mut j = JournalSuperblock::decode(&b).unwrap();
    j.max_len -= 16;
    j.encode(&mut b);
    f.write_all_at(&b, 4096).unwrap();
    assert_eq!(jbdev(&["check", p]).status.code(), Some(2));
    let o = jbdev(&["info", p]);
    assert!(text(&o).contains("s_maxlen"), "{}", text(&o));
    let o = jbdev(&["journal", "dump", p]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("s_maxlen"), "{}", text(&o));
}

/// `jbdev journal reset`: a volume whose external journal file is gone
/// opens again (check ok) with a new, empty journal at the recorded path;
/// a clean journal, and --journal for an internal one, are refused.
#[test]
fn journal_reset_replaces_a_lost_external_journal() {
    let (dir, img, jnl) = external_16m();
    let (i, j) = (img.to_str().unwrap(), jnl.to_str().unwrap());
    // Intact and clean: nothing to reset.
    let o = jbdev(&["journal", "reset", i]);
    assert_clean_error(&o, "reset of a clean journal");
    assert!(text(&o).contains("clean and intact"), "{}", text(&o));
    std::fs::remove_file(&jnl).unwrap();
    assert_clean_error(&jbdev(&["check", i]), "check without its journal");
    let o = jbdev(&["journal", "reset", i]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("created") && text(&o).contains("missing"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::metadata(&jnl).unwrap().len(), 1 << 20);
    let o = jbdev(&["check", i]);
    assert!(o.status.success(), "{}", text(&o));
    // An internal journal takes no --journal.
    let img2 = dir.path().join("w.img");
    format_16m(img2.to_str().unwrap(), &[]);
    let o = jbdev(&["journal", "reset", img2.to_str().unwrap(), "--journal", j]);
    assert_clean_error(&o, "--journal for an internal journal");
    assert!(text(&o).contains("internal"), "{}", text(&o));
}

/// Report #6: `info` of a volume whose external journal file is missing
/// prints the volume's superblock and says the journal is missing, where,
/// and what to do (`jbdev journal reset PATH`), exit 0 as for an unreadable
/// journal; `info --json` has it as fields (`journal.missing`,
/// `journal.path`, `journal.error`, the journal's `uuid` when there is
/// one). `check` and `journal dump` fail with the same advice, which works
/// as given. For a journal of random bytes, `check` and `journal dump`
/// both exit 2 (corruption, as the README says). (The old `info` printed
/// only "jbdev: error: reading v.img: open failed on .../j.jnl ...", exit
/// 1, and `journal dump` of the garbage journal exited 1.)
#[test]
fn info_and_check_of_a_volume_whose_journal_is_missing_say_what_to_do() {
    let (_dir, img, jnl) = external_16m();
    let (i, j) = (img.to_str().unwrap(), jnl.to_str().unwrap());
    let info = |json: bool| {
        let o = jbdev(&[&["info", i][..], if json { &["--json"] } else { &[] }].concat());
        assert!(o.status.success(), "info: {}", text(&o));
        o
    };
    let v: serde_json::Value = serde_json::from_slice(&info(true).stdout).unwrap();
    let (uuid, journal_uuid) = (v["uuid"].clone(), v["journal"]["uuid"].clone());
    assert!(journal_uuid.is_string(), "{v}");
    assert_eq!(v["journal"]["path"], j, "{v}");
    assert_eq!(v["journal"]["missing"], false, "{v}");
    let shown = String::from_utf8_lossy(&info(false).stdout).to_string();
    assert!(
        shown.contains(&format!("uuid {}", journal_uuid.as_str().unwrap())),
        "{shown}"
    );

    std::fs::remove_file(&jnl).unwrap();
    let advice = format!(
        "nothing at {j}, the path recorded at format time. If it moved, give --journal \
         PATH (its new path); if it is lost, `jbdev journal reset {i}` creates a new, empty journal there"
    );
    let shown = String::from_utf8_lossy(&info(false).stdout).to_string();
    assert!(
        shown.contains(&format!("uuid            {}", uuid.as_str().unwrap()))
            && shown.contains("size            16777216 bytes")
            && shown.contains(&format!("journal         external ({j})"))
            && shown.contains(&format!("journal state   MISSING: {advice}")),
        "{shown}"
    );
    let v: serde_json::Value = serde_json::from_slice(&info(true).stdout).unwrap();
    assert_eq!(v["uuid"], uuid, "{v}");
    assert_eq!(v["journal"]["path"], j, "{v}");
    assert_eq!(v["journal"]["missing"], true, "{v}");
    assert_eq!(v["journal"]["uuid"], serde_json::Value::Null, "{v}");
    assert_eq!(v["journal"]["expected_uuid"], journal_uuid, "{v}");
    assert!(
        v["journal"]["error"].as_str().is_some_and(|e| e
            .starts_with("the external journal is missing: ")
            && e.contains(&advice)),
        "{v}"
    );
    for cmd in [&["check", i][..], &["journal", "dump", i][..]] {
        let o = jbdev(cmd);
        assert_eq!(o.status.code(), Some(1), "{cmd:?}: {}", text(&o));
        assert!(
            text(&o).contains(&format!("the external journal is missing: {advice}")),
            "{cmd:?}: {}",
            text(&o)
        );
    }
    // The advice, as given.
    let reset = advice.split('`').nth(1).unwrap();
    let args: Vec<&str> = reset.split(' ').collect();
    assert_eq!(args[0], "jbdev");
    let o = jbdev(&args[1..]);
    assert!(o.status.success(), "{}", text(&o));
    let o = jbdev(&["check", i]);
    assert!(o.status.success(), "{}", text(&o));

    // Random bytes where the journal should be: corruption for both.
    let noise: Vec<u8> = (0..1u32 << 20)
        .map(|x| (x.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&jnl, noise).unwrap();
    for cmd in [&["check", i][..], &["journal", "dump", i][..]] {
        let o = jbdev(cmd);
        assert_eq!(o.status.code(), Some(2), "{cmd:?}: {}", text(&o));
        assert!(
            text(&o).contains("journal superblock: CORRUPT: bad jbd2 magic"),
            "{cmd:?}: {}",
            text(&o)
        );
    }
}

/// A crash of the volume `img` with its external journal `jnl`: opened
/// with checkpoints held off, `writes` FUA blocks written (one committed
/// transaction each, at blocks 0, 1, ...), both files copied while it is
/// open and put back after the close, as a crash leaves them: the writes
/// are only in the journal's log.
fn crash_external(img: &Path, jnl: &Path, writes: u64) {
    let opts = jbdev_volume::OpenOptions {
        checkpoint_interval: jbdev_volume::MAX_WAIT,
        ..Default::default()
    };
    let v = jbdev_volume::Volume::open(img, &opts).unwrap();
    for b in 0..writes {
        v.write_at(
            &[b as u8 + 1; 4096],
            b * 4096,
            jbdev_volume::WriteFlags::FUA,
        )
        .unwrap();
    }
    let copies = [img, jnl].map(|p| {
        let mut c = p.as_os_str().to_owned();
        c.push(".crash");
        std::fs::copy(p, &c).unwrap();
        (c, p)
    });
    v.close().unwrap();
    for (c, p) in copies {
        std::fs::rename(c, p).unwrap();
    }
}

/// Report #3: `journal reset` of a volume whose external journal file was
/// truncated says so, and the refused reset changes nothing: every byte
/// and the length of the file stay, and `check` still reports it. With
/// `--force` the file is extended and gets a new journal; the volume then
/// checks ok. (The old reset refused for the wrong reason, "the journal
/// holds 9 committed transaction(s) that opening the volume replays: open
/// it instead", after padding the file back to 1 MiB with zeroes: `check`
/// then said ok and an open replayed what was left, silently.)
#[test]
fn journal_reset_of_a_truncated_journal_changes_nothing_unless_forced() {
    let (_dir, img, jnl) = external_16m();
    let (i, j) = (img.to_str().unwrap(), jnl.to_str().unwrap());
    crash_external(&img, &jnl, 20);
    set_len(&jnl, 30 * 4096);
    let before = std::fs::read(&jnl).unwrap();
    let checked = jbdev(&["check", i]);
    assert_eq!(checked.status.code(), Some(2), "{}", text(&checked));

    let o = jbdev(&["journal", "reset", i]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "the external journal file {j} holds 122880 bytes, less than the journal's \
             1048576: it was truncated"
        )) && text(&o).contains(&format!("`jbdev journal reset --force {i}`")),
        "{}",
        text(&o)
    );
    assert!(
        std::fs::read(&jnl).unwrap() == before,
        "a refused reset changed the journal file (now {} bytes)",
        std::fs::metadata(&jnl).unwrap().len()
    );
    let o = jbdev(&["check", i]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert_eq!(text(&o), text(&checked));

    let o = jbdev(&["journal", "reset", i, "--force"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o)
            .contains("it held: a truncated journal file (122880 of the journal's 1048576 bytes"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::metadata(&jnl).unwrap().len(), 1 << 20);
    let o = jbdev(&["check", i]);
    assert!(text(&o).contains("journal: clean"), "{}", text(&o));
    jbdev_volume::Volume::open(&img, &jbdev_volume::OpenOptions::default())
        .unwrap()
        .close()
        .unwrap();
}

/// Report #15: a `--journal-size` that is not a whole number of blocks is
/// rounded down, and `format` says so; an error quotes the size asked for
/// (and what whole blocks made of it), never a rounded "journal size 0".
/// (The old format rounded silently, and said "journal size 4096 must be
/// between 16 blocks ..." for 5000.)
#[test]
fn format_says_when_it_rounded_a_size() {
    let dir = tempfile::tempdir().unwrap();
    let format = |name: &str, journal_size: &str| {
        let img = dir.path().join(name);
        let args = ["format", img.to_str().unwrap(), "--size", "16M"];
        let o = jbdev(&[&args[..], &["--journal-size", journal_size]].concat());
        (o.status.code(), text(&o))
    };
    let (code, out) = format("a.img", "100001");
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(
            "internal journal of 98304 bytes (--journal-size 100001 rounded down to whole \
             blocks)"
        ),
        "{out}"
    );
    // A size out of range is a usage error (exit 64).
    let (code, out) = format("b.img", "5000");
    assert_eq!(code, Some(64), "{out}");
    assert!(
        out.contains(
            "journal size 5000 (4096 in whole 4096-byte blocks) must be between 16 blocks \
             (65536 bytes) and 2^32 blocks"
        ),
        "{out}"
    );
    let (code, out) = format("c.img", "1K");
    assert_eq!(code, Some(64), "{out}");
    assert!(
        out.contains("journal size 1024 (0 in whole") && !out.contains("size 0 "),
        "{out}"
    );
    let (code, out) = format("d.img", "64K");
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("rounded"), "{out}");
}

/// Report #13: `journal reset --force` says what the old journal held, not
/// the refusal a reset without --force gives. (The old one printed "it
/// held: the journal is clean and intact: there is nothing to reset (open
/// the volume); --force writes a new one anyway".)
#[test]
fn a_forced_journal_reset_says_what_the_journal_held() {
    let (_dir, img, jnl) = external_16m();
    let (i, j) = (img.to_str().unwrap(), jnl.to_str().unwrap());
    let reset = || {
        let o = jbdev(&["journal", "reset", i, "--force"]);
        assert!(o.status.success(), "{}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(
            !out.contains("--force") && !out.contains("nothing to reset"),
            "{out}"
        );
        out
    };
    let out = reset();
    assert!(
        out.starts_with(&format!(
            "{i}: new empty journal ({j}); it held: a clean, intact journal (next \
             transaction "
        )),
        "{out}"
    );
    crash_external(&img, &jnl, 3);
    let out = reset();
    assert!(
        out.contains(
            "it held: 3 committed transaction(s) that opening the volume would have \
             replayed; they are discarded"
        ),
        "{out}"
    );
}

/// `jbdev bench` with stdout gone stops at its first line instead of
/// running on with nowhere to print: into a closed pipe (`| head -1`) it
/// ends quietly with the shell's SIGPIPE status, into a full device with a
/// `jbdev: error:` line; never a panic. Its first line (the machine) comes
/// before any backing is set up, so the nonexistent `--device` is never
/// reached: a bench that ignored the failed write would fail on it instead.
#[test]
fn bench_with_stdout_gone_stops_at_its_first_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir/dev");
    let bench = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_jbdev"));
        c.args(["bench", "sync-writers", "--quick", "--no-plots"])
            .args(["--no-progress", "--device", missing.to_str().unwrap()]);
        c
    };
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = bench().stdout(writer).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(o.status.code(), Some(141), "closed pipe: {err}");
    assert!(err.trim().is_empty(), "closed pipe: {err}");

    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let o = bench().stdout(full).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "/dev/full: {err}");
    assert_eq!(
        err.trim(),
        "jbdev: error: writing to stdout: No space left on device (os error 28)"
    );
}

/// `check` (and `info`) on a volume whose external journal file was
/// truncated say what happened and what to do, and the steps they give
/// work: `truncate -s` back to the journal's length, then `check` passes
/// and the volume opens. (Before the fix: "CORRUPT: corrupt journal:
/// journal log is inconsistent: journal region ends at byte 1048576 but
/// the device has 524288 bytes", no advice.)
#[test]
fn check_says_what_to_do_about_a_truncated_external_journal() {
    let (_dir, img, jnl) = external_16m();
    let (p, j) = (img.to_str().unwrap(), jnl.to_str().unwrap());
    set_len(&jnl, 512 << 10);
    let truncate = format!("`truncate -s 1048576 {j}`");
    let check = format!("`jbdev check {p} --journal {j}`");
    let o = jbdev(&["check", p]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.starts_with(&format!(
            "CORRUPT: the external journal file {j} holds 524288 bytes, less than the \
             journal's 1048576: it was truncated"
        )) && out.contains(&truncate)
            && out.contains(&check),
        "{out}"
    );
    let o = jbdev(&["info", p]);
    assert!(text(&o).contains(&truncate), "{}", text(&o));
    // The steps, as given.
    let args: Vec<&str> = truncate.trim_matches('`').split(' ').collect();
    let ok = Command::new(args[0]).args(&args[1..]).status().unwrap();
    assert!(ok.success());
    let args: Vec<&str> = check.trim_matches('`').split(' ').collect();
    assert_eq!(args[0], "jbdev");
    let o = jbdev(&args[1..]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("check: ok"), "{}", text(&o));
    jbdev_volume::Volume::open(&img, &jbdev_volume::OpenOptions::default())
        .unwrap()
        .close()
        .unwrap();
}

/// Session 25's docs pass: a wrong `--journal` shorter than the journal
/// (another volume's smaller journal, any small file) was reported as
/// this volume's journal "truncated" (exit 2), with advice to extend the
/// wrong file and to `journal reset --force` the volume, which reset the
/// real journal at the recorded path and lost its acknowledged writes. It
/// is now "not this volume's journal" (exit 1) from check, info-style
/// inspection and reset, and the real journal is untouched; a truncated
/// journal given with `--journal` gets advice that names it.
#[test]
fn a_short_wrong_journal_is_not_called_truncated() {
    let (_dir, img, jnl) = external_16m();
    let p = img.to_str().unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let (oimg, ojnl) = (
        other_dir.path().join("o.img"),
        other_dir.path().join("o.jnl"),
    );
    let o = jbdev(&[
        "format",
        oimg.to_str().unwrap(),
        "--size",
        "4M",
        "--journal-size",
        "256K",
        "--journal",
        ojnl.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let tiny = other_dir.path().join("tiny");
    std::fs::write(&tiny, b"abc").unwrap();
    for wrong in [ojnl.to_str().unwrap(), tiny.to_str().unwrap()] {
        for args in [
            &["check", p, "--journal", wrong][..],
            &["journal", "reset", p, "--journal", wrong][..],
        ] {
            let o = jbdev(args);
            assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
            let t = text(&o);
            assert!(
                t.contains("not this volume's journal") && !t.contains("truncate"),
                "{args:?}: {t}"
            );
        }
    }
    let o = jbdev(&["check", p]);
    assert!(o.status.success(), "{}", text(&o));
    // Truncated for real, and given with --journal: the reset it advises
    // names that journal.
    let moved = other_dir.path().join("moved.jnl");
    std::fs::copy(&jnl, &moved).unwrap();
    set_len(&moved, 512 << 10);
    let o = jbdev(&["check", p, "--journal", moved.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "`jbdev journal reset --force {p} --journal {}`",
            moved.display()
        )),
        "{}",
        text(&o)
    );
}

/// A journal larger than the volume is legal but rarely meant (format
/// zero-fills all of it; `--journal-size 1T` on a 1 MiB volume wrote
/// gigabytes without a word): format says so, and still formats.
#[test]
fn a_journal_larger_than_the_volume_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let p = img.to_str().unwrap();
    let o = jbdev(&["format", p, "--size", "1M", "--journal-size", "2M"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("larger than the volume"), "{}", text(&o));
    let o = format_16m(&dir.path().join("w.img").to_string_lossy(), &[]);
    assert!(!text(&o).contains("larger than the volume"), "{}", text(&o));
}

/// A volume with an external journal whose magic was damaged is corrupt
/// (exit 2, data may still be there), not "not a jbdev volume; create one
/// with `jbdev format`" (exit 1), when `--journal` names its journal. (The
/// magic of both copies of the superblock: with one, the other is read.)
#[test]
fn check_of_a_damaged_magic_with_its_journal_given_is_corruption() {
    let (_dir, img, jnl) = external_16m();
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[0] ^= 0x01; // the JBDEVVOL magic
    let p = img.to_str().unwrap();
    std::fs::write(&img, &bytes).unwrap();
    let o = jbdev(&["check", p]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("backup copy is intact"), "{}", text(&o));
    bytes[512] ^= 0x01; // the backup's
    std::fs::write(&img, &bytes).unwrap();
    let (p, j) = (img.to_str().unwrap(), jnl.to_str().unwrap());
    let o = jbdev(&["check", p, "--journal", j]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("is a jbdev journal") && t.contains("refuses it without --force"),
        "{t}"
    );
    assert!(!t.contains("create one"), "{t}");
    // Without the journal named, nothing says it is a volume.
    assert_eq!(jbdev(&["check", p]).status.code(), Some(1));
}

/// A journal superblock whose checksum holds but which sets feature bits
/// this jbdev does not know is a newer jbdev's journal: `check` says so and
/// exits 1 (it cannot tell), not CORRUPT with 2 (restore or reformat); the
/// same bytes with a checksum that does not hold are damage. `check` used
/// to tell them apart by the error text's first words.
#[test]
fn check_tells_a_newer_journal_from_a_damaged_one() {
    use jbdev_volume::journal::format::JournalSuperblock;
    for (damaged, want) in [(false, 1), (true, 2)] {
        let (_dir, img, jnl) = external_16m();
        let mut bytes = std::fs::read(&jnl).unwrap();
        let mut sb = JournalSuperblock::decode(&bytes[..4096]).unwrap();
        sb.feature_incompat |= 0x100;
        sb.encode(&mut bytes[..4096]);
        if damaged {
            bytes[0xFC] ^= 1; // s_checksum
        }
        std::fs::write(&jnl, &bytes).unwrap();
        let (p, j) = (img.to_str().unwrap(), jnl.to_str().unwrap());
        let o = jbdev(&["check", p, "--journal", j]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(want), "damaged {damaged}: {t}");
        assert_eq!(t.contains("newer jbdev"), !damaged, "{t}");
        assert_eq!(t.contains("CORRUPT"), damaged, "{t}");
    }
}

/// The `size` line of `jbdev info`, in bytes.
fn info_size(p: &str) -> u64 {
    let o = jbdev(&["info", p]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    t.lines()
        .find_map(|l| l.strip_prefix("size"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no size in info: {t}"))
}

/// `jbdev grow` of an image file: extends the file and records the size;
/// refuses a shrink, a missing size and a partial block with exit 64, and
/// an open volume with exit 1 naming it, changing nothing.
#[test]
fn grow_extends_an_image_file_and_refuses_what_it_must() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let p = img.to_str().unwrap();
    format_16m(p, &[]);
    let before = std::fs::metadata(&img).unwrap().len();
    for (args, what) in [
        (&["grow", p, "--size", "8M"][..], "a shrink"),
        (&["grow", p][..], "no --size for a file"),
        (&["grow", p, "--size", "17000000"][..], "a partial block"),
        // Past a file's offsets: said so (a conversion error text before).
        (
            &["grow", p, "--size", "9223372036854771712"][..],
            "too large",
        ),
    ] {
        let o = jbdev(args);
        assert_clean_error(&o, what);
        assert_eq!(o.status.code(), Some(64), "{what}: {}", text(&o));
    }
    let v = jbdev_volume::Volume::open(&img, &jbdev_volume::OpenOptions::default()).unwrap();
    let o = jbdev(&["grow", p, "--size", "32M"]);
    assert_clean_error(&o, "grow while open");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("already open"), "{}", text(&o));
    v.close().unwrap();
    assert_eq!(info_size(p), 16 << 20);
    assert_eq!(std::fs::metadata(&img).unwrap().len(), before);

    let o = jbdev(&["grow", p, "--size", "32M"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("from 16777216 to 33554432 bytes"),
        "{}",
        text(&o)
    );
    assert_eq!(info_size(p), 32 << 20);
    assert_eq!(std::fs::metadata(&img).unwrap().len(), before + (16 << 20));
    let o = jbdev(&["check", p]);
    assert!(o.status.success(), "{}", text(&o));

    // A file already longer than its volume (format --force of a smaller
    // volume over a larger one leaves the tail): the added range reads as
    // zeroes, not as what the file held there (session 26's pass).
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        let len = f.metadata().unwrap().len();
        f.write_all_at(&vec![0xeeu8; 8 << 20], len).unwrap();
    }
    let o = jbdev(&["grow", p, "--size", "40M"]);
    assert!(o.status.success(), "{}", text(&o));
    let v = jbdev_volume::Volume::open(&img, &jbdev_volume::OpenOptions::default()).unwrap();
    let mut added = vec![1u8; 8 << 20];
    v.read_at(&mut added, 32 << 20).unwrap();
    v.close().unwrap();
    assert!(
        added.iter().all(|&b| b == 0),
        "the added range holds the file's old bytes"
    );
}

/// `jbdev grow` of a block device without --size takes all of it, and
/// after the device itself grew (its backing file extended, `losetup -c`),
/// the rest (a loop device; skipped where losetup is not allowed).
#[test]
fn grow_takes_all_of_a_block_device() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("loop.img");
    sparse_file(&backing, 64 << 20);
    let Some(lo) = loop_device(&backing, false) else {
        println!("SKIP: no loop device (losetup needs root)");
        return;
    };
    let p = lo.0.as_str();
    format_16m(p, &[]);
    let o = jbdev(&["grow", p, "--size", "128M"]);
    assert_clean_error(&o, "grow past the device");
    assert!(text(&o).contains("grow the device first"), "{}", text(&o));
    let o = jbdev(&["grow", p]);
    assert!(o.status.success(), "{}", text(&o));
    // Superblock block + 1 MiB journal + data = 64 MiB.
    assert_eq!(info_size(p), (64 << 20) - 4096 - (1 << 20));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&backing)
        .unwrap()
        .set_len(96 << 20)
        .unwrap();
    let c = Command::new("losetup").args(["-c", p]).status().unwrap();
    assert!(c.success());
    let o = jbdev(&["grow", p]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(info_size(p), (96 << 20) - 4096 - (1 << 20));
    let o = jbdev(&["check", p]);
    assert!(o.status.success(), "{}", text(&o));
}

/// `jbdev grow` of a volume on an RBD image: `--size` resizes the image
/// first; after an `rbd resize` by the operator, no size takes all of it;
/// `--preallocate` is refused (throwaway test cluster).
#[cfg(feature = "rbd")]
#[test]
fn rbd_grow_resizes_the_image_or_takes_all_of_it() {
    let Some((conf, home)) = rbd_test_image("growvol") else {
        return;
    };
    format_16m(&home, &[]);
    let o = jbdev(&["grow", &home, "--size", "32M", "--preallocate"]);
    assert_eq!(o.status.code(), Some(64), "{}", text(&o));
    // Past what an image can be: librbd's EINVAL, said as a size the
    // cluster refused, exit 64 as for a file (session 27's pass: exit 1,
    // "rbd_resize failed ... Invalid argument").
    let o = jbdev(&["grow", &home, "--size", "8388607T"]);
    assert_eq!(o.status.code(), Some(64), "{}", text(&o));
    assert!(text(&o).contains("refused to resize"), "{}", text(&o));
    assert_eq!(info_size(&home), 16 << 20);
    let o = jbdev(&["grow", &home, "--size", "32M"]);
    assert!(o.status.success(), "{}", text(&o));
    let total = (32u64 << 20) + (1 << 20) + 4096;
    assert!(
        text(&o).contains(&format!("extended to {total} bytes")),
        "{}",
        text(&o)
    );
    assert_eq!(info_size(&home), 32 << 20);
    let spec = home
        .strip_prefix("rbd:")
        .and_then(|s| s.split(':').next())
        .unwrap()
        .to_string();
    let r = Command::new("rbd")
        .arg("-c")
        .arg(&conf)
        .args(["resize", "--size", "64M", &spec])
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let o = jbdev(&["grow", &home]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(info_size(&home), (64 << 20) - 4096 - (1 << 20));
    let o = jbdev(&["check", &home]);
    assert!(o.status.success(), "{}", text(&o));
}

/// `check` of `image` passes, and each 4 KiB block written as `(offset,
/// byte)` reads back as `want(byte)` after an open.
fn assert_checked_reads(image: &Path, writes: &[(u64, u8)], want: impl Fn(u8) -> u8) {
    let o = jbdev(&["check", image.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let v = jbdev_volume::Volume::open(image, &Default::default()).unwrap();
    for &(off, byte) in writes {
        let mut b = vec![0u8; 4096];
        v.read_at(&mut b, off).unwrap();
        let want = want(byte);
        assert!(
            b.iter().all(|&x| x == want),
            "offset {off}: want {want}, got {}",
            b[0]
        );
    }
    v.close().unwrap();
}

/// `jbdev journal rescue` (session 27): refuses a log that is not damaged
/// in the middle, changing nothing; for one that is, keeps the transactions
/// before the damage, discards the rest, and the volume opens read-write
/// again (`check` says ok).
#[test]
fn journal_rescue_keeps_what_precedes_mid_log_damage() {
    let (_dir, copy, writes) = six_writes_crash_copy();
    let c = copy.to_str().unwrap();
    // Not damaged: refused, nothing changed.
    let before = std::fs::read(&copy).unwrap();
    let o = jbdev(&["journal", "rescue", c]);
    assert_clean_error(&o, "an undamaged log");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("not damaged"), "{}", text(&o));
    assert!(
        std::fs::read(&copy).unwrap() == before,
        "a refused rescue changed the image"
    );
    // Damage the third transaction's commit, as `journal dump`'s test does.
    damage_third_commit_digest(&copy, &text(&jbdev(&["journal", "dump", c])));
    assert_eq!(jbdev(&["check", c]).status.code(), Some(2));
    let refused = jbdev_volume::Volume::open(&copy, &Default::default());
    let msg = refused
        .err()
        .expect("a read-write open of mid-log damage")
        .to_string();
    assert!(msg.contains("jbdev journal rescue"), "{msg}");
    let o = jbdev(&["journal", "rescue", c]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("replayed 2 transaction(s)"),
        "{}",
        text(&o)
    );
    assert_checked_reads(&copy, &writes, |byte| if byte <= 2 { byte } else { 0 });
    // Once rescued there is nothing left to rescue.
    assert_eq!(jbdev(&["journal", "rescue", c]).status.code(), Some(1));
}

/// A journal superblock that fails its checksum (one bit of its padding)
/// over an intact log: every open refuses the volume, `check` says that
/// `journal rescue` rebuilds it, and the rescue does, from the volume's
/// checkpoint mark: every acknowledged write is replayed. Session 30's
/// operator pass: the only way out was `journal reset --force`, which
/// dropped them all.
#[test]
fn journal_rescue_rebuilds_a_lost_journal_superblock() {
    let (_dir, copy, writes) = six_writes_crash_copy();
    let c = copy.to_str().unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&copy).unwrap();
    f.write_all_at(&[1], 4096 + 0x80).unwrap();
    drop(f);
    assert!(jbdev_volume::Volume::open(&copy, &Default::default()).is_err());
    let o = jbdev(&["check", c]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("journal rescue"), "{}", text(&o));
    // The commands that refuse it name the rebuild, not only the lossy
    // `reset --force` (session 31's docs pass).
    let sock = copy.with_extension("sock");
    for args in [
        &["journal", "reset", c][..],
        &["serve", c, "--socket", sock.to_str().unwrap()][..],
    ] {
        let o = jbdev(args);
        assert_clean_error(&o, &args.join(" "));
        assert!(
            text(&o).contains("journal rescue"),
            "{args:?}: {}",
            text(&o)
        );
    }
    let o = jbdev(&["journal", "rescue", c]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("journal superblock rebuilt"),
        "{}",
        text(&o)
    );
    assert_checked_reads(&copy, &writes, |byte| byte);
    // An intact superblock is not rebuilt.
    let e = jbdev_volume::rebuild_journal_superblock(&copy).unwrap_err();
    assert!(e.to_string().contains("intact"), "{e}");
}

/// `info` and `journal dump` say what every open says of a clean old copy
/// of the journal put back (session 27's pass: both called it "clean", exit
/// 0, while `check` and every open refused it).
#[test]
fn info_and_dump_warn_of_a_clean_journal_every_open_refuses() {
    let (_dir, img, jnl) = external_16m();
    let (p, j) = (img.to_str().unwrap(), jnl.to_str().unwrap());
    let old = std::fs::read(&jnl).unwrap();
    let v = jbdev_volume::Volume::open(
        &img,
        &jbdev_volume::OpenOptions {
            journal_path: Some(jnl.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    v.write_at(&[7u8; 4096], 0, jbdev_volume::WriteFlags::FUA)
        .unwrap();
    v.close().unwrap();
    // Fine before the old copy goes back.
    let o = jbdev(&["info", p, "--journal", j]);
    assert!(!text(&o).contains("stale"), "{}", text(&o));
    std::fs::write(&jnl, &old).unwrap();
    assert_eq!(jbdev(&["check", p, "--journal", j]).status.code(), Some(1));
    let o = jbdev(&["info", p, "--journal", j]);
    assert!(text(&o).contains("the journal is stale"), "{}", text(&o));
    let o = jbdev(&["info", p, "--journal", j, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["journal"]["stale"].is_string(), "{v}");
    let o = jbdev(&["journal", "dump", p, "--journal", j]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("every open refuses"), "{}", text(&o));
    // Rescue does not claim an open takes it (session 31's docs pass).
    let o = jbdev(&["journal", "rescue", p, "--journal", j]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(!text(&o).contains("an open replays"), "{}", text(&o));
    // A damaged external journal superblock: refused, saying so (it was a
    // bare CORRUPT line and exit 2).
    let f = std::fs::OpenOptions::new().write(true).open(&jnl).unwrap();
    f.write_all_at(&[1], 0x80).unwrap();
    drop(f);
    let o = jbdev(&["journal", "rescue", p, "--journal", j]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("nothing was changed") && text(&o).contains("external"),
        "{}",
        text(&o)
    );
}

/// Session 28's compatibility pass: two volumes' external journals swap
/// places (devices renumbered after a reboot; here files), so the path
/// volume A recorded at format time names B's journal. Every command says
/// so, names the path and `--journal`, and none calls it corrupt or blames
/// a `--journal` nobody gave; `journal reset` refuses without `--force`
/// and says what `--force` would destroy. Before: "corrupt journal: the
/// journal belongs to another volume" (no path), "the wrong --journal?",
/// and a reset offering "--force overwrites it".
#[test]
fn a_recorded_journal_path_that_names_another_volume_s_journal_is_said_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let (a, aj, b, bj) = (path("a.img"), path("a.jnl"), path("b.img"), path("b.jnl"));
    format_16m(&a, &["--journal", &aj]);
    format_16m(&b, &["--journal", &bj]);
    let tmp = path("swap");
    std::fs::rename(&aj, &tmp).unwrap();
    std::fs::rename(&bj, &aj).unwrap();
    std::fs::rename(&tmp, &bj).unwrap();
    let b_journal = std::fs::read(&aj).unwrap();
    for args in [
        &["check", &a][..],
        &["info", &a][..],
        &["journal", "dump", &a][..],
        &["journal", "rescue", &a][..],
        &["journal", "reset", &a][..],
    ] {
        let o = jbdev(args);
        let t = text(&o);
        // `info` reports it as a warning and succeeds (it only shows).
        assert_eq!(o.status.success(), args[0] == "info", "{args:?}: {t}");
        assert!(
            t.contains(&aj) && t.contains("recorded at format time") && t.contains("--journal"),
            "{args:?}: {t}"
        );
        assert!(
            !t.contains("corrupt") && !t.contains("the wrong --journal"),
            "{args:?}: {t}"
        );
    }
    let o = jbdev(&["journal", "reset", &a]);
    assert!(
        text(&o).contains("it is clean: --force overwrites it"),
        "{}",
        text(&o)
    );
    // Said once: not wrapped in "reading a: invalid argument: journal X: ...".
    assert!(
        !text(&o).contains("invalid argument") && !text(&o).contains("reading "),
        "{}",
        text(&o)
    );
    assert_eq!(
        std::fs::read(&aj).unwrap(),
        b_journal,
        "B's journal was changed"
    );
    // Opened with the right journal, both are fine.
    let o = jbdev(&["check", &a, "--journal", &bj]);
    assert!(o.status.success(), "{}", text(&o));
}

/// `format` of a mounted device says it is mounted and to unmount it, not
/// "give --force" (which the exclusive open then refuses anyway); `journal
/// reset` of another volume's journal says so once, without "reading X:
/// invalid argument:" and the path twice (session 29's pass).
#[test]
fn format_of_a_mounted_device_says_to_unmount_it() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let backing = dir.path().join("loop.img");
    sparse_file(&backing, 32 << 20);
    let Some(lo) = loop_device(&backing, false) else {
        println!("SKIP: no loop device (losetup needs root)");
        return;
    };
    let st = Command::new("mkfs.ext4")
        .args(["-q", "-F", &lo.0])
        .status()
        .unwrap();
    assert!(st.success());
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let st = Command::new("mount").arg(&lo.0).arg(&mnt).status().unwrap();
    assert!(st.success());
    let o = jbdev(&["format", &lo.0]);
    let _ = Command::new("umount").arg(&mnt).status();
    assert_clean_error(&o, "format of a mounted device");
    let t = text(&o);
    assert!(
        t.contains("mounted at") && t.contains("unmount it first") && !t.contains("give --force"),
        "{t}"
    );
}

/// Session 31's compatibility pass: a volume formatted by a jbdev before
/// 2026-11-27 with a relative `--journal` records that relative path. Run
/// from another directory, the advice was `jbdev journal reset VOLUME`,
/// which created a new journal in the current directory and dropped the
/// real one's acknowledged writes. Now the messages say the path is
/// relative, and a reset makes a new journal only at a `--journal` given.
#[test]
fn a_relative_recorded_journal_path_is_never_reset_in_the_current_directory() {
    let (dir, img, jnl) = external_16m();
    let hint = b"j.jnl";
    let mut field = [0u8; 4 + 256];
    field[..4].copy_from_slice(&(hint.len() as u32).to_le_bytes());
    field[4..4 + hint.len()].copy_from_slice(hint);
    set_volume_field(&img, 104, &field);
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let run = |cwd: &Path, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_jbdev"))
            .args(args)
            .current_dir(cwd)
            .output()
            .expect("run jbdev")
    };
    let p = img.to_str().unwrap();
    // From the directory format ran in, the relative path still works.
    let o = run(dir.path(), &["check", p]);
    assert!(o.status.success(), "{}", text(&o));
    // From elsewhere: said, and nothing is created there.
    let o = run(&elsewhere, &["check", p]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("is relative") && text(&o).contains("--journal PATH"),
        "{}",
        text(&o)
    );
    let o = run(&elsewhere, &["journal", "reset", p]);
    assert_clean_error(&o, "reset at a relative recorded path");
    assert!(text(&o).contains("is relative"), "{}", text(&o));
    assert!(
        !elsewhere.join("j.jnl").exists(),
        "a journal was created in the current directory"
    );
    assert!(jnl.exists());
}

/// What a `journal reset` cut short leaves is put right by running it again
/// (session 32's crash pass): an external journal file created but not yet
/// sized (0 bytes) was refused as "the wrong --journal?" without --force;
/// and `check` of a volume whose journal superblock and checkpoint mark a
/// `journal reset --force` had already cleared advised `journal rescue`,
/// which cannot rebuild it without the mark.
#[test]
fn a_journal_reset_cut_short_is_put_right_by_running_it_again() {
    // An empty file where the external journal was lost.
    let (_dir, img, jnl) = external_16m();
    let (i, j) = (img.to_str().unwrap(), jnl.to_str().unwrap());
    std::fs::File::create(&jnl).unwrap();
    let o = jbdev(&["check", i]);
    assert_clean_error(&o, "check with an empty journal file");
    assert!(text(&o).contains("run that reset again"), "{}", text(&o));
    let o = jbdev(&["journal", "reset", i, "--journal", j]);
    assert!(o.status.success(), "reset again: {}", text(&o));
    assert!(text(&o).contains("an empty file"), "{}", text(&o));
    let o = jbdev(&["check", i]);
    assert!(o.status.success(), "{}", text(&o));

    // An internal journal with its superblock and the volume's checkpoint
    // mark cleared, as a `journal reset --force` leaves them part-way.
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let i = img.to_str().unwrap();
    format_16m(i, &[]);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&img)
        .unwrap();
    let mut block = vec![0u8; 4096];
    f.read_exact_at(&mut block, 0).unwrap();
    let (mut sb, _) =
        jbdev_volume::superblock::VolumeSuperblock::decode_block(&block).expect("superblock");
    sb.checkpoint_sequence = 0;
    sb.checkpoint_mark_session = 0;
    sb.encode_block(&mut block);
    f.write_all_at(&block, 0).unwrap();
    f.write_all_at(&[0u8; 4096], 4096).unwrap();
    drop(f);
    let o = jbdev(&["check", i]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("reset --force") && !text(&o).contains("journal rescue"),
        "check names the step that works: {}",
        text(&o)
    );
    let o = jbdev(&["journal", "rescue", i]);
    assert_clean_error(&o, "rescue without a checkpoint mark");
    let o = jbdev(&["journal", "reset", i, "--force"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = jbdev(&["check", i]);
    assert!(o.status.success(), "{}", text(&o));
}

/// A volume held by a live process whose main thread has exited (it called
/// `pthread_exit`; its other thread keeps the descriptor and the lock) is
/// refused at once as held. Session 33's timing pass: the zombie main
/// thread made it look dead ("the lock is left by pid N, which has
/// exited"), `grow` waited 20 s for the kernel to release the lock, then
/// blamed "a slow or stalled device". Skipped without a C compiler.
#[test]
fn a_holder_whose_main_thread_has_exited_is_alive() {
    let dir = tempfile::tempdir().unwrap();
    let (src, exe) = (dir.path().join("h.c"), dir.path().join("h"));
    std::fs::write(
        &src,
        "#include <pthread.h>\n#include <sys/file.h>\n#include <fcntl.h>\n\
         #include <unistd.h>\n#include <stdio.h>\n\
         static void *t(void *a) { (void)a; sleep(120); return 0; }\n\
         int main(int c, char **v) { (void)c; int fd = open(v[1], O_RDWR);\n\
         if (fd < 0 || flock(fd, LOCK_EX)) { perror(\"lock\"); return 1; }\n\
         pthread_t th; pthread_create(&th, 0, t, 0);\n\
         printf(\"locked\\n\"); fflush(stdout); pthread_exit(0); }\n",
    )
    .unwrap();
    let built = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-lpthread")
        .status();
    if !built.is_ok_and(|s| s.success()) {
        println!("SKIP: no C compiler");
        return;
    }
    let img = dir.path().join("v.img");
    let img_s = img.to_str().unwrap();
    format_16m(img_s, &[]);
    let mut holder = Command::new(&exe)
        .arg(&img)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "locked");
    // Until its main thread is a zombie (bounded: it exits right after).
    let stat = format!("/proc/{}/stat", holder.id());
    let zombie = || {
        std::fs::read_to_string(&stat)
            .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
    };
    for _ in 0..1000 {
        if zombie() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(zombie(), "the holder's main thread did not exit");
    let o = jbdev(&["grow", "--size", "32M", img_s]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(!o.status.success(), "grow of a held volume: {}", text(&o));
    assert!(
        text(&o).contains("already open") && !text(&o).contains("has exited"),
        "{}",
        text(&o)
    );
}
