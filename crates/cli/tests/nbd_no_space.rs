//! The real `jbdev serve` on a sparse image whose file system fills up
//! (a tmpfs mounted for the test, so it needs root, as CI has), with the
//! real `nbdcopy`: the client is told "No space left on device" (NBD's
//! ENOSPC, not EIO), reads keep working, and after the file system gets
//! room a restarted server serves everything that was flushed, and takes
//! writes again.

mod nbd_common;

use std::path::{Path, PathBuf};
use std::process::Command;

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
    let Some(mnt) = Mount::tmpfs(&dir.path("fs"), "24M") else {
        assert!(!is_root(), "running as root, but mounting a tmpfs failed");
        eprintln!(
            "SKIP a_full_file_system_reports_enospc: mounting a tmpfs needs root (CI is root)"
        );
        return;
    };
    let img = mnt.0.join("v.img");
    let img_s = img.to_str().unwrap();
    run_ok(
        JBDEV,
        &["format", img_s, "--size", "64M", "--journal-size", "8M"],
        60,
    );

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
        log.contains("backing store is full"),
        "the log says what to do: {log}"
    );
    srv.stop();

    // Room again; a restarted server serves what was flushed, and writes.
    mnt.resize("160M");
    run_ok(JBDEV, &["check", img_s], 60);
    let srv = ServerProc::start(&[img_s], None);
    let uri = srv.tcp_uri();
    assert!(first_4m_intact(&uri, &back), "flushed data lost");
    let out = nbdcopy(&["--flush", big.to_str().unwrap(), &uri]);
    assert!(out.status.success(), "writes after freeing space: {out:?}");
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
