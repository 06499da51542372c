//! The slow-flush backing's file system: a FUSE mount, served by threads of
//! the bench process, exposing one file (`disk.img`) whose reads and writes
//! go straight through to a store file (on /dev/shm or on disk) and whose
//! `fsync` and `flush` take a set time before the store's own `fdatasync`.
//!
//! A loop device over `disk.img` is then a device with a slow cache flush:
//! the loop driver turns a flush (REQ_PREFLUSH, and FUA, which it emulates
//! as write + flush) into `vfs_fsync` of its backing file, which FUSE sends
//! here as FSYNC. Both jbdev and the kernel's own path see the same delay.
//!
//! Model: flushes are served one at a time (a disk's cache flush is a
//! non-queued command), each taking the set delay. The kernel's FUSE client
//! also holds the file's inode lock across an fsync, and the loop driver
//! (direct I/O off) serves one request at a time per cgroup, so nothing
//! else reaches the device during a flush — like a SATA disk. The loop
//! device's own flush merging (blk-flush) still coalesces concurrent flush
//! requests above it, for both sides alike.
//!
//! Teardown: [`SlowServer`] registers the unmount with [`crate::cleanup`]
//! before mounting; dropping it unmounts and joins the server threads
//! (bounded). The loop device over `disk.img` must go first (it holds the
//! file open); [`crate::backing::Backing`]'s field order sees to that, and
//! so does the registry's newest-first order on a signal.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation,
    INodeNo, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, WriteFlags,
};
use parking_lot::Mutex;

use crate::cleanup::{Action, Cleanup};
use crate::error::{io_err, BenchError, Result};

/// Name of the one file in the mount.
pub const IMAGE_NAME: &str = "disk.img";
/// Default extra time of an fsync.
pub const DEFAULT_FLUSH_DELAY: Duration = Duration::from_millis(2);
/// File-system type shown in /proc/mounts (`fuse.jbdev-slow`).
pub const SUBTYPE: &str = "jbdev-slow";

const IMAGE_INO: INodeNo = INodeNo(2);
const TTL: Duration = Duration::from_secs(3600);
/// Server threads: one serves while another sleeps in a flush.
const SERVER_THREADS: usize = 2;
/// How long dropping the server waits for its threads after the unmount.
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// What the file system saw (for the report and tests).
#[derive(Debug, Default)]
pub struct SlowStats {
    pub fsyncs: AtomicU64,
    pub flushes: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
}

struct SlowFs {
    store: File,
    size: u64,
    delay: Duration,
    /// Flushes are served one at a time.
    flush_lock: Mutex<()>,
    stats: Arc<SlowStats>,
    uid: u32,
    gid: u32,
    born: SystemTime,
}

impl SlowFs {
    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let (kind, perm, size, nlink) = match ino {
            INodeNo::ROOT => (FileType::Directory, 0o755, 0, 2),
            IMAGE_INO => (FileType::RegularFile, 0o600, self.size, 1),
            _ => return None,
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.born,
            mtime: self.born,
            ctime: self.born,
            crtime: self.born,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    /// The slow part: wait the set time, then make the store durable.
    fn slow_flush(&self) -> std::io::Result<()> {
        let _one_at_a_time = self.flush_lock.lock();
        std::thread::sleep(self.delay);
        self.store.sync_data()
    }

    fn in_range(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.size)
    }
}

fn errno(e: &std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

impl fuser::Filesystem for SlowFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.attr(IMAGE_INO) {
            Some(a) if parent == INodeNo::ROOT && name == IMAGE_NAME => {
                reply.entry(&TTL, &a, Generation(0))
            }
            _ => reply.error(Errno::ENOENT),
        }
        crate::cpu::record_device_thread();
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
        crate::cpu::record_device_thread();
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // The image has a fixed size; times and modes are not kept.
        match self.attr(ino) {
            Some(a) if size.is_none_or(|s| s == a.size) => reply.attr(&TTL, &a),
            Some(_) => reply.error(Errno::from_i32(libc::EPERM)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino == IMAGE_INO {
            reply.opened(FileHandle(0), FopenFlags::empty());
        } else {
            reply.error(Errno::EISDIR);
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != IMAGE_INO {
            reply.error(Errno::EISDIR);
            return;
        }
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        let len = (size as u64).min(self.size.saturating_sub(offset)) as usize;
        let mut buf = vec![0u8; len];
        match self.store.read_exact_at(&mut buf, offset) {
            Ok(()) => reply.data(&buf),
            Err(e) => reply.error(errno(&e)),
        }
        crate::cpu::record_device_thread();
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != IMAGE_INO {
            reply.error(Errno::EISDIR);
            return;
        }
        if !self.in_range(offset, data.len() as u64) {
            reply.error(Errno::from_i32(libc::ENOSPC));
            return;
        }
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        match self.store.write_all_at(data, offset) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(&e)),
        }
        crate::cpu::record_device_thread();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.stats.flushes.fetch_add(1, Ordering::Relaxed);
        match self.slow_flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
        crate::cpu::record_device_thread();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        match self.slow_flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
        crate::cpu::record_device_thread();
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // The loop driver turns discard and write-zeroes into fallocate
        // (punch hole / zero range); pass them through, within the image.
        if ino != IMAGE_INO || !self.in_range(offset, length) {
            reply.error(Errno::EINVAL);
            return;
        }
        let flags = nix::fcntl::FallocateFlags::from_bits_truncate(mode);
        let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(length)) else {
            reply.error(Errno::EINVAL);
            return;
        };
        match nix::fcntl::fallocate(&self.store, flags, off, len) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(Errno::from_i32(e as i32)),
        }
        crate::cpu::record_device_thread();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            reply.error(Errno::from_i32(libc::ENOTDIR));
            return;
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (IMAGE_INO, FileType::RegularFile, IMAGE_NAME),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        // ENOSYS once, and the kernel stops asking (it would otherwise ask
        // for security.capability before every write).
        reply.error(Errno::ENOSYS);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let blocks = self.size / 4096;
        reply.statfs(blocks, 0, 0, 2, 0, 4096, 255, 4096);
    }
}

/// True if a FUSE file system can be mounted here: /dev/fuse, the fuse
/// file system in the kernel, and root (the mount is made with mount(2)
/// directly; fusermount3 is not used).
pub fn fuse_available() -> std::result::Result<(), String> {
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse is missing (modprobe fuse)".into());
    }
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs
        .lines()
        .any(|l| l.split_whitespace().last() == Some("fuse"))
    {
        return Err("the kernel has no fuse file system (modprobe fuse)".into());
    }
    if !nix::unistd::geteuid().is_root() {
        return Err("mounting the FUSE file system needs root".into());
    }
    Ok(())
}

/// A mounted slow-flush file system, served by threads of this process.
/// Dropping it unmounts and stops the server.
pub struct SlowServer {
    /// The mount point.
    pub dir: PathBuf,
    /// `dir/disk.img`.
    pub image: PathBuf,
    pub delay: Duration,
    pub stats: Arc<SlowStats>,
    // Drop order: unmount (guard), then join the session's threads.
    unmount: Option<Cleanup>,
    session: Option<BackgroundSession>,
}

impl std::fmt::Debug for SlowServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlowServer")
            .field("dir", &self.dir)
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

impl SlowServer {
    /// Mounts a slow-flush file system at `dir` (created here, removed on
    /// teardown) whose image passes through to `store` (`size` bytes,
    /// existing).
    pub fn start(dir: PathBuf, store: &Path, size: u64, delay: Duration) -> Result<SlowServer> {
        fuse_available()
            .map_err(|why| BenchError::Setup(format!("the slow backing needs FUSE: {why}")))?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(store)
            .map_err(io_err(format!("open {}", store.display())))?;
        let stats = Arc::new(SlowStats::default());
        let fs = SlowFs {
            store: file,
            size,
            delay,
            flush_lock: Mutex::new(()),
            stats: stats.clone(),
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
            born: SystemTime::now(),
        };
        // Registered before the mount exists (module invariant of cleanup.rs).
        let unmount = Cleanup::register(Action::Unmount(dir.clone()));
        std::fs::create_dir(&dir).map_err(io_err(format!("mkdir {}", dir.display())))?;
        let mut cfg = Config::default();
        cfg.mount_options = vec![
            MountOption::FSName(SUBTYPE.into()),
            MountOption::Subtype(SUBTYPE.into()),
            MountOption::RW,
            MountOption::NoAtime,
        ];
        cfg.n_threads = Some(SERVER_THREADS);
        cfg.clone_fd = true;
        let session = fuser::spawn_mount(fs, &dir, &cfg)
            .map_err(io_err(format!("mount FUSE at {}", dir.display())))?;
        let image = dir.join(IMAGE_NAME);
        Ok(SlowServer {
            dir,
            image,
            delay,
            stats,
            unmount: Some(unmount),
            session: Some(session),
        })
    }
}

impl Drop for SlowServer {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            // A plain unmount (it fails, without waiting, if the image is
            // still held open); once it succeeds the server threads read
            // ENODEV and end, so the join is short.
            let t0 = Instant::now();
            if let Err(e) = session.umount_and_join() {
                tracing::warn!(
                    "unmount of the FUSE file system at {} failed ({e}); detaching it lazily",
                    self.dir.display()
                );
            } else if t0.elapsed() > JOIN_TIMEOUT {
                tracing::warn!("the FUSE server took {:?} to stop", t0.elapsed());
            }
        }
        // The registered action: lazy unmount if still mounted (the
        // connection then ends with this process), and the mount point.
        drop(self.unmount.take());
    }
}
