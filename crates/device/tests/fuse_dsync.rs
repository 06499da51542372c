//! A durable (FUA) write to a file on FUSE reaches the store with a flush,
//! on every backend and through a queue. FUSE completes an io_uring
//! O_DIRECT write with `RWF_DSYNC` without the flush the flag asks for
//! (session 29's C ABI pass: acknowledged FUA writes and commits lost on an
//! nbdfuse store after a power cut), so jbdev writes, then flushes, on file
//! systems it does not know to honour the flag. The store here is nbdkit's
//! memory plugin behind its log filter, mounted as a file by nbdfuse: the
//! log shows every flush the kernel sent.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use jbdev_device::{open_device, Backend, IoPriority, IoRequest, OpenOptions};

/// nbdkit and nbdfuse, stopped and unmounted when dropped.
struct FuseStore {
    nbdkit: Child,
    nbdfuse: Option<Child>,
    mount: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl FuseStore {
    fn start() -> Self {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let sock = dir.path().join("nbdkit.sock");
        let log = dir.path().join("nbdkit.log");
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        let nbdkit = Command::new("nbdkit")
            .args(["-f", "-U"])
            .arg(&sock)
            .args(["--filter=log", "memory", "64M"])
            .arg(format!("logfile={}", log.display()))
            .stdout(Stdio::null())
            .spawn()
            .expect("run nbdkit (package nbdkit)");
        let mut store = Self {
            nbdkit,
            nbdfuse: None,
            mount,
            log,
            _dir: dir,
        };
        wait_for(&sock, "nbdkit's socket");
        store.nbdfuse = Some(
            Command::new("nbdfuse")
                .arg(store.mount.join("disk"))
                .arg("--unix")
                .arg(&sock)
                .stdout(Stdio::null())
                .spawn()
                .expect("run nbdfuse (package nbdfuse)"),
        );
        wait_for(&store.disk(), "the nbdfuse file");
        store
    }

    fn disk(&self) -> PathBuf {
        self.mount.join("disk")
    }

    /// Flush requests the store has received so far.
    fn flushes(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(" Flush ") && !l.contains("return="))
            .count()
    }
}

impl Drop for FuseStore {
    fn drop(&mut self) {
        // fusermount3 or fusermount, whichever fuse this machine has; as
        // root, umount does it too (a mount left behind outlives the test).
        let unmounted = [
            ("fusermount3", "-u"),
            ("fusermount", "-u"),
            ("umount", "-l"),
        ]
        .iter()
        .any(|(cmd, flag)| {
            Command::new(cmd)
                .arg(flag)
                .arg(&self.mount)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        if !unmounted {
            eprintln!("could not unmount {}", self.mount.display());
        }
        if let Some(mut c) = self.nbdfuse.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = self.nbdkit.kill();
        let _ = self.nbdkit.wait();
    }
}

fn wait_for(path: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{what} did not appear in 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_durable_write_on_fuse_is_flushed_to_the_store() {
    let store = FuseStore::start();
    for backend in [Backend::Uring, Backend::Pread] {
        let opts = OpenOptions {
            backend,
            ..OpenOptions::default()
        };
        let dev = open_device(&store.disk(), &opts)
            .unwrap_or_else(|e| panic!("open the nbdfuse file with {backend:?}: {e}"))
            .device;
        let buf = jbdev_device::AlignedBuf::zeroed(64 << 10);
        let before = store.flushes();
        dev.write_vectored_durable_at(&[std::io::IoSlice::new(&buf)], 0, IoPriority::Urgent)
            .unwrap();
        let after_write = store.flushes();
        assert!(
            after_write > before,
            "{backend:?}: a durable write returned with no flush at the store ({before} flushes before, {after_write} after)"
        );
        let mut q = dev.queue(4).unwrap();
        q.push(IoRequest::write_durable(64 << 10, buf), 0).unwrap();
        let mut out = Vec::new();
        while q.in_flight() > 0 {
            q.reap(1, &mut out).unwrap();
        }
        out.pop().unwrap().result.unwrap();
        let after_queue = store.flushes();
        assert!(
            after_queue > after_write,
            "{backend:?}: a queued durable write completed with no flush at the store"
        );
    }
}

/// Reads see what direct writes wrote, on FUSE too: the read cache (a
/// buffered descriptor beside O_DIRECT) is not used where the page cache is
/// not known to follow direct writes. Session 30's power pass: on an
/// nbdfuse store, reads of 16 KiB blocks came from pages the checkpoint's
/// io_uring writes had left stale, older than the client's own
/// acknowledged writes.
#[test]
fn reads_on_fuse_see_the_direct_writes_before_them() {
    let store = FuseStore::start();
    for backend in [Backend::Uring, Backend::Pread] {
        let opts = OpenOptions {
            backend,
            read_cache: true,
            ..OpenOptions::default()
        };
        let dev = open_device(&store.disk(), &opts).unwrap().device;
        assert!(
            !dev.has_write_cache(),
            "{backend:?}: the page cache is used on FUSE"
        );
        let len = 16 << 10;
        for round in 0..8u8 {
            let mut buf = jbdev_device::AlignedBuf::zeroed(len);
            buf.fill(round + 1);
            let mut q = dev.queue(4).unwrap();
            q.push(IoRequest::write(0, buf), 0).unwrap();
            let mut out = Vec::new();
            while q.in_flight() > 0 {
                q.reap(1, &mut out).unwrap();
            }
            out.pop().unwrap().result.unwrap();
            let mut back = jbdev_device::AlignedBuf::zeroed(len);
            dev.read_at(&mut back, 0).unwrap();
            assert!(
                back.iter().all(|&b| b == round + 1),
                "{backend:?}, round {round}: read {} after writing {}",
                back[0],
                round + 1
            );
        }
    }
}
