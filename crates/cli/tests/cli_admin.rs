//! The `jbdev` admin commands against the real binary: format, info, check,
//! journal dump — and clear errors (never a panic) for bad input.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output};

fn jbdev(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_jbdev"))
        .args(args)
        .output()
        .expect("run jbdev")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
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

/// `jbdev format P --size 16M --journal-size 1M EXTRA...`, which must succeed.
fn format_16m(p: &str, extra: &[&str]) -> Output {
    let mut args = vec!["format", p, "--size", "16M", "--journal-size", "1M"];
    args.extend_from_slice(extra);
    let o = jbdev(&args);
    assert!(o.status.success(), "{}", text(&o));
    o
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
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
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
    bytes[40] ^= 0xff; // inside the volume superblock
    std::fs::write(&img, &bytes).unwrap();
    let o = jbdev(&["check", p]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("checksum") || t.contains("superblock"), "{t}");
    // Damage the journal superblock instead.
    bytes[40] ^= 0xff;
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
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
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
    std::fs::File::create(&fs)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
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

    // Data past the first 1 MiB is not looked at; zeroes before it are a
    // fresh target (`truncate -s`), which format takes without --force.
    let zeroes = dir.path().join("z.img");
    std::fs::File::create(&zeroes)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    format_16m(zeroes.to_str().unwrap(), &[]);

    // A format interrupted before it wrote the volume superblock (block 0
    // still zero, the internal journal written) is formatted again.
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
    let o = format_16m(p, &[]);
    assert!(text(&o).contains("interrupted"), "{}", text(&o));
    assert!(jbdev(&["check", p]).status.success());
    // But a volume that was written and then lost block 0 is not an
    // interrupted format: its journal has moved on, and data is there.
    let v = jbdev_volume::Volume::open(&img, &jbdev_volume::OpenOptions::default()).unwrap();
    v.write_at(&[9u8; 4096], 0, jbdev_volume::WriteFlags::FUA)
        .unwrap();
    v.close().unwrap();
    zero_block_0();
    let o = jbdev(&["format", p, "--size", "16M", "--journal-size", "1M"]);
    assert_clean_error(&o, "format over a used volume without block 0");
    assert!(text(&o).contains("--force"), "{}", text(&o));
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

#[test]
fn check_and_info_refuse_a_truncated_image() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let p = img.to_str().unwrap();
    format_16m(p, &[]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let o = jbdev(&["check", p]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("holds 8388608 bytes"), "{}", text(&o));
    let o = jbdev(&["info", p]);
    assert_clean_error(&o, "info of a truncated image");
    assert!(text(&o).contains("holds 8388608 bytes"), "{}", text(&o));
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
