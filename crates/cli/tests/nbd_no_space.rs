//! The real `jbdev serve` on a sparse image whose file system fills up
//! (a tmpfs mounted for the test, so it needs root, as CI has), with the
//! real `nbdcopy`: the client is told "No space left on device" (NBD's
//! ENOSPC, not EIO), reads keep working, and once the file system has
//! room the same server takes writes again, with nothing lost.

mod nbd_common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use jbdev_nbd::client::{Address, Client};
use jbdev_nbd::proto::*;
use nbd_common::*;

/// A tmpfs of a given size mounted for the test, unmounted on drop.
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(dir: &Path, size: &str) -> Option<Mount> {
        std::fs::create_dir_all(dir).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        ok.then(|| Mount(dir.to_path_buf()))
    }

    fn resize(&self, size: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .expect("mount -o remount");
        assert!(
            st.success(),
            "remount {} with size={size}",
            self.0.display()
        );
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn nbdcopy(args: &[&str]) -> std::process::Output {
    run_tool("nbdcopy", args, 120)
}

#[test]
fn a_full_file_system_reports_enospc_and_a_restart_after_freeing_space_loses_nothing() {
    if !have_tool("nbdcopy", "a_full_file_system_reports_enospc") {
        return;
    }
    let dir = TempDir::new("nospace");
    // 24 MiB of file system: the volume superblock and the 8 MiB journal
    // (written whole at format) fit, 64 MiB of sparse home data does not.
    let Some((mnt, img)) = volume_on_tmpfs(&dir, "a_full_file_system_reports_enospc") else {
        return;
    };
    let img_s = img.to_str().unwrap();

    let first = dir.path("first.raw");
    std::fs::write(&first, pattern(1, 4 << 20)).unwrap();
    // The big copy starts with the same 4 MiB, so whichever of its
    // unflushed writes landed before the failure, they change nothing there.
    let big = dir.path("big.raw");
    let mut b = pattern(1, 4 << 20);
    b.extend(pattern(2, 44 << 20));
    std::fs::write(&big, b).unwrap();

    let srv = ServerProc::start(&[img_s], None);
    let uri = srv.tcp_uri();
    // 4 MiB copied and flushed: acknowledged.
    let out = nbdcopy(&["--flush", first.to_str().unwrap(), &uri]);
    assert!(out.status.success(), "{out:?}");
    // 48 MiB cannot fit.
    let out = nbdcopy(&["--flush", big.to_str().unwrap(), &uri]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "48 MiB fitted in a 24 MiB file system"
    );
    assert!(
        stderr.contains("No space left on device"),
        "the client is told ENOSPC, not EIO: {stderr}"
    );
    // The server still serves reads.
    let back = dir.path("back.raw");
    assert!(first_4m_intact(&uri, &back), "flushed data changed");
    let log = srv.log_text();
    assert!(
        log.contains("not allocated yet"),
        "the start warned that the image cannot fill: {log}"
    );
    assert!(
        log.contains("backing store is full"),
        "the log says what to do: {log}"
    );

    // Room again: the same server, never restarted, takes the copy.
    mnt.resize("160M");
    let out = nbdcopy(&["--flush", big.to_str().unwrap(), &uri]);
    assert!(
        out.status.success(),
        "writes after freeing space, same server: {out:?}"
    );
    assert!(srv.stop(), "clean stop");
    run_ok(JBDEV, &["check", img_s], 60);
    // A restarted server serves it.
    let srv = ServerProc::start(&[img_s], None);
    let out = nbdcopy(&[&srv.tcp_uri(), back.to_str().unwrap()]);
    assert!(out.status.success(), "reading the export: {out:?}");
    let (got, want) = (std::fs::read(&back).unwrap(), std::fs::read(&big).unwrap());
    assert!(
        got[..want.len()] == want[..],
        "the copy made after space was freed is not what was written"
    );
    assert!(srv.stop(), "clean stop");
}

/// Mounts a 24 MiB tmpfs under `dir` and formats a 64 MiB volume with an
/// 8 MiB journal on it; None (the caller skips) where mounting needs root.
fn volume_on_tmpfs(dir: &TempDir, test: &str) -> Option<(Mount, PathBuf)> {
    let Some(mnt) = Mount::tmpfs(&dir.path("fs"), "24M") else {
        assert!(!is_root(), "running as root, but mounting a tmpfs failed");
        eprintln!("SKIP {test}: mounting a tmpfs needs root (CI is root)");
        return None;
    };
    let img = mnt.0.join("v.img");
    run_ok(
        JBDEV,
        &[
            "format",
            img.to_str().unwrap(),
            "--size",
            "64M",
            "--journal-size",
            "8M",
        ],
        60,
    );
    Some((mnt, img))
}

/// Journaled FUA writes are acknowledged while the file system is full
/// (the journal's blocks were allocated at format); the checkpoint then
/// cannot take them home. After a crash, a restart refuses to open while
/// there is no space, and says why without telling anyone to reformat;
/// once space is freed, the restart replays them all.
#[test]
fn acknowledged_writes_survive_a_crash_while_the_file_system_is_full() {
    let test = "acknowledged_writes_survive_a_crash_while_the_file_system_is_full";
    let dir = TempDir::new("nospace-crash");
    let Some((mnt, img)) = volume_on_tmpfs(&dir, test) else {
        return;
    };
    let img_s = img.to_str().unwrap();
    // Fill the file system: a write reaching an unallocated page fails.
    let filler = mnt.0.join("filler");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "status=none"])
        .arg(format!("of={}", filler.display()))
        .status();

    let srv = ServerProc::start(&[img_s], None);
    let mut c = Client::connect(&Address::Tcp(srv.tcp.clone().unwrap()), "").unwrap();
    let mut acked = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    // 4 KiB FUA writes at scattered offsets until the checkpoint, failing
    // to take them home, lets the journal fill and a write is refused (or
    // 30 s pass: a failure).
    for i in 0u64.. {
        let off = (i * 61 % 16_000) * 4096;
        let data = pattern(100 + i, 4096);
        match c.call(CMD_WRITE, CMD_FLAG_FUA, off, 4096, &data).unwrap() {
            Ok(_) => acked.push((off, data)),
            Err(errno) => {
                assert_eq!(errno, ENOSPC, "a full store: ENOSPC, not EIO");
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the full store was never noticed"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(!acked.is_empty());
    srv.crash();

    // Still full: the restart refuses, and says what to do.
    let out = run_tool(JBDEV, &["serve", img_s, "--listen", "127.0.0.1:0"], 60);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "opened with no space to replay into");
    assert!(stderr.contains("backing store is full"), "{stderr}");
    assert!(stderr.contains("do not reformat"), "{stderr}");
    assert!(!stderr.contains("jbdev format"), "{stderr}");

    // Space again: everything acknowledged is there.
    std::fs::remove_file(&filler).unwrap();
    let srv = ServerProc::start(&[img_s], None);
    let mut c = Client::connect(&Address::Tcp(srv.tcp.clone().unwrap()), "").unwrap();
    // Later writes to one offset replace earlier ones: compare the newest.
    let newest: std::collections::BTreeMap<u64, Vec<u8>> = acked.into_iter().collect();
    for (off, data) in &newest {
        let got = c.call(CMD_READ, 0, *off, 4096, &[]).unwrap().unwrap();
        assert!(got == *data, "acknowledged write at {off} lost");
    }
    c.disconnect().unwrap();
    assert!(srv.stop(), "clean stop");
    run_ok(JBDEV, &["check", img_s], 60);
}

/// Copies the export out to `back` (reads must work) and says whether its
/// first 4 MiB are the flushed copy's.
fn first_4m_intact(uri: &str, back: &Path) -> bool {
    let out = nbdcopy(&[uri, back.to_str().unwrap()]);
    assert!(out.status.success(), "reading the export: {out:?}");
    let got = std::fs::read(back).unwrap();
    got[..4 << 20] == pattern(1, 4 << 20)[..]
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
