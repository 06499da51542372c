//! Opening a path as a [`BlockDevice`], choosing the backend.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::{BlockDevice, DeviceError, Result};

/// Which backend to use for a path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// io_uring when the kernel allows it, else pread/pwrite (logged once).
    #[default]
    Auto,
    /// io_uring only; opening fails if it is unavailable.
    Uring,
    /// Portable preadv/pwritev.
    Pread,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "uring" | "io_uring" | "io-uring" => Ok(Self::Uring),
            "pread" | "portable" => Ok(Self::Pread),
            _ => Err(format!(
                "unknown backend {s:?} (expected auto, uring or pread)"
            )),
        }
    }
}

/// How to open a device path.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub backend: Backend,
    pub read_only: bool,
    /// Use O_DIRECT (falls back to buffered I/O with a log line if the
    /// filesystem refuses it, e.g. older tmpfs).
    pub direct: bool,
    /// Take an exclusive lock (flock on files, O_EXCL on block devices) so a
    /// second opener gets [`crate::DeviceError::Busy`].
    pub exclusive: bool,
    /// Create a regular file of this size if the path does not exist, or
    /// extend a smaller regular file to it.
    pub create_size: Option<u64>,
    /// With O_DIRECT, also open a buffered read-only descriptor and serve
    /// reads from the page cache through it. Coherent with our O_DIRECT
    /// writes: the kernel invalidates cached pages over a direct write's range
    /// when it completes, and the volume never reads a block from home while
    /// a write of it is in flight (the overlay serves it until then).
    pub read_cache: bool,
    /// RBD targets: break the current holder's exclusive lock before taking
    /// it (an operator's explicit decision that the holder is dead; librbd
    /// blocklists it). Ignored for files and block devices.
    pub break_lock: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            backend: Backend::Auto,
            read_only: false,
            direct: true,
            exclusive: true,
            create_size: None,
            read_cache: false,
            break_lock: false,
        }
    }
}

/// An opened device and facts about what was opened.
pub struct OpenedDevice {
    pub device: Arc<dyn BlockDevice>,
    pub path: PathBuf,
    /// True for a block device node, false for a regular file.
    pub is_block_device: bool,
    /// True if O_DIRECT is in effect.
    pub direct: bool,
    /// For a regular file: a descriptor of the same file (`O_PATH`, not a
    /// duplicate: see `watch_descriptor`), for `fstat` checks while it is
    /// open (the volume notices an external
    /// journal file deleted or truncated under it). `None` for block devices
    /// and RBD targets.
    pub watch: Option<std::fs::File>,
    /// For a regular file this open created (exclusively): its `(st_dev,
    /// st_ino)`. See [`OpenedDevice::remove_if_created`].
    pub created: Option<(u64, u64)>,
}

impl OpenedDevice {
    /// Removes the file this open created, if the path still names it. Call
    /// it while `self.device` is alive, so that the lock is still held and
    /// nobody else can have begun to use the file; a file that existed
    /// before the open is never removed. RBD images: see the volume layer.
    pub fn remove_if_created(&self) {
        if let Some(id) = self.created {
            crate::file::remove_if_same_file(&self.path, id);
        }
    }
}

/// A descriptor of the file `locked` is open on, for `fstat` only: opened
/// anew by path (`O_PATH`), never a `dup` of `locked` — a duplicate shares
/// its open file description and so its flock, and would keep the volume
/// "open" after the device is dropped. The new descriptor must name the same
/// inode (the path could have been replaced in between).
fn watch_descriptor(path: &Path, locked: &std::fs::File) -> Result<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let err = |e| DeviceError::io("open (watch)", path.display().to_string(), e);
    let w = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
        .map_err(err)?;
    let (a, b) = (w.metadata().map_err(err)?, locked.metadata().map_err(err)?);
    if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
        return Err(err(std::io::Error::other(
            "the path was replaced while it was being opened",
        )));
    }
    Ok(w)
}

/// True if `path` names an RBD target (`rbd:POOL/IMAGE...`) rather than a
/// file: its text starts with `rbd:` (write `./rbd:x` for a file of that name).
pub fn is_rbd_target(path: &Path) -> bool {
    path.to_str().is_some_and(|s| s.starts_with("rbd:"))
}

/// Opens `path` (a regular file, a block device, or — with the `rbd` feature —
/// an RBD target `rbd:POOL/IMAGE[:conf=PATH][:id=USER]`) with the requested
/// backend.
pub fn open_device(path: &Path, opts: &OpenOptions) -> Result<OpenedDevice> {
    if is_rbd_target(path) {
        return open_rbd(path, opts);
    }
    let file = crate::file::open_file(path, opts)?;
    let checked = (|| {
        let use_uring = match opts.backend {
            Backend::Pread => false,
            Backend::Uring => {
                crate::uring::probe()?;
                true
            }
            Backend::Auto => match crate::uring::probe() {
                Ok(()) => true,
                Err(e) => {
                    crate::uring::log_fallback_once(&e);
                    false
                }
            },
        };
        let watch = if file.is_block_device {
            None
        } else {
            Some(watch_descriptor(path, &file.file)?)
        };
        let created = if file.created {
            use std::os::unix::fs::MetadataExt;
            let m = file
                .file
                .metadata()
                .map_err(|e| DeviceError::io("stat", path.display().to_string(), e))?;
            Some((m.dev(), m.ino()))
        } else {
            None
        };
        Ok((use_uring, watch, created))
    })();
    let (use_uring, watch, created) = match checked {
        Ok(c) => c,
        Err(e) => {
            // Still locked: a file this open created goes again.
            crate::file::remove_if_created(&file);
            return Err(e);
        }
    };
    let (is_block_device, direct) = (file.is_block_device, file.direct);
    let device: Arc<dyn BlockDevice> = if use_uring {
        Arc::new(crate::uring::UringDevice::new(file))
    } else {
        Arc::new(crate::pread::PreadDevice::new(file))
    };
    Ok(OpenedDevice {
        device,
        path: path.to_path_buf(),
        is_block_device,
        direct,
        watch,
        created,
    })
}

#[cfg(feature = "rbd")]
fn open_rbd(path: &Path, opts: &OpenOptions) -> Result<OpenedDevice> {
    use crate::rbd::{RbdDevice, RbdOpenOptions, RbdTarget};
    let s = path.to_str().unwrap_or_default();
    let target = RbdTarget::parse(s).map_err(DeviceError::Invalid)?;
    let dev = RbdDevice::open(
        &target,
        &RbdOpenOptions {
            read_only: opts.read_only,
            exclusive: opts.exclusive,
            break_lock: opts.break_lock,
            create_size: opts.create_size,
        },
    )?;
    Ok(OpenedDevice {
        device: Arc::new(dev),
        path: path.to_path_buf(),
        is_block_device: false,
        direct: true,
        watch: None,
        created: None,
    })
}

#[cfg(not(feature = "rbd"))]
fn open_rbd(path: &Path, _opts: &OpenOptions) -> Result<OpenedDevice> {
    Err(DeviceError::Invalid(format!(
        "{}: this jbdev was built without rbd support (rebuild with `--features rbd`, which needs librbd-dev and librados-dev); write ./{} for a file of that name",
        path.display(),
        path.display()
    )))
}

/// Longest wait for a file lock whose every holder has exited (see
/// `file::flock_file`).
pub const DEAD_HOLDER_WAIT: Duration = Duration::from_secs(10);

/// Pids holding flock locks on the inode `ino` of device `major:minor`,
/// from `/proc/locks` (0 for a holder whose pid no longer exists in our
/// namespace). `None` if there is no /proc to tell.
pub(crate) fn flock_holders_of(major: u64, minor: u64, ino: u64) -> Option<Vec<i64>> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    Some(parse_proc_locks(&locks, major, minor, ino))
}

/// Live processes other than this one with a descriptor of the inode
/// (`/proc/PID/fd`), at most `max` of them. A flock belongs to an open file,
/// not to a process: `flock -x FD` in a shell takes the lock in the `flock`
/// process, which exits and leaves it held through the shell's descriptor,
/// so `/proc/locks` names a dead pid for a lock a live process holds. A
/// lock whose listed holders are dead while such a process exists is held
/// by it, not left over from a killed one.
pub(crate) fn live_openers_of(major: u64, minor: u64, ino: u64, max: usize) -> Vec<i64> {
    use std::os::unix::fs::MetadataExt;
    let me = i64::from(std::process::id());
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i64>().ok()) else {
            continue;
        };
        if pid == me || !pid_alive(pid) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            // stat through the magic link: the file itself, not the link.
            std::fs::metadata(fd.path()).is_ok_and(|m| {
                m.ino() == ino && dev_major(m.dev()) == major && dev_minor(m.dev()) == minor
            })
        });
        if holds {
            out.push(pid);
            if out.len() >= max {
                break;
            }
        }
    }
    out
}

/// "held by pid N: its command line" for the first live holder of a flock
/// on the file at `path` (`/proc/locks`), "held by this process" when that
/// is us, or None when no live holder is listed (a block device opened
/// with `O_EXCL` leaves no trace there).
pub fn flock_holder_of(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    let pids = flock_holders_of(dev_major(m.dev()), dev_minor(m.dev()), m.ino())?;
    let pid = pids.into_iter().find(|&p| pid_alive(p))?;
    Some(describe_holder(pid))
}

/// "held by pid N: its command line" ("held by this process" for our own).
pub(crate) fn describe_holder(pid: i64) -> String {
    if pid == i64::from(std::process::id()) {
        return "held by this process".to_string();
    }
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            String::from_utf8_lossy(&c)
                .replace('\0', " ")
                .trim()
                .to_string()
        })
        .unwrap_or_default();
    if cmd.is_empty() {
        format!("held by pid {pid}")
    } else {
        format!("held by pid {pid}: {cmd}")
    }
}

/// The glibc/Linux encoding of `dev_t`.
pub(crate) fn dev_major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff)
}
pub(crate) fn dev_minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0xff)
}

/// Pids of the FLOCK entries of `/proc/locks` for one inode. A line reads
/// `N: [->] FLOCK ADVISORY WRITE PID MAJ:MIN:INO START END`, with MAJ and
/// MIN in hex; `->` marks a waiter, not a holder.
fn parse_proc_locks(text: &str, major: u64, minor: u64, ino: u64) -> Vec<i64> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) == Some(&"->") || fields.get(1) != Some(&"FLOCK") {
            continue;
        }
        let (Some(pid), Some(id)) = (fields.get(4), fields.get(5)) else {
            continue;
        };
        let mut parts = id.split(':');
        let (Some(ma), Some(mi), Some(i)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let same = u64::from_str_radix(ma, 16).ok() == Some(major)
            && u64::from_str_radix(mi, 16).ok() == Some(minor)
            && i.parse::<u64>().ok() == Some(ino);
        if let (true, Ok(pid)) = (same, pid.parse::<i64>()) {
            out.push(pid);
        }
    }
    out
}

/// True unless `pid` is known to have exited (absent, a zombie, or dead).
/// Pid 0 is what /proc/locks shows once the holder's pid is gone.
pub(crate) fn pid_alive(pid: i64) -> bool {
    if pid == 0 {
        return false;
    }
    if pid < 0 {
        return true; // an OFD lock: no owner to ask about
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X' | 'x')
        ),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_locks_lines_are_matched_by_inode() {
        let text = "1: FLOCK  ADVISORY  WRITE 18236 fe:00:5308645 0 EOF\n\
                    2: FLOCK  ADVISORY  READ 0 fe:00:5308645 0 EOF\n\
                    3: -> FLOCK  ADVISORY  WRITE 99 fe:00:5308645 0 EOF\n\
                    4: POSIX  ADVISORY  WRITE 77 fe:00:5308645 0 EOF\n\
                    5: FLOCK  ADVISORY  WRITE 5 fe:01:5308645 0 EOF\n\
                    garbage\n";
        assert_eq!(parse_proc_locks(text, 0xfe, 0, 5308645), vec![18236, 0]);
        assert!(parse_proc_locks(text, 0xfe, 0, 1).is_empty());
    }

    #[test]
    fn dev_numbers_decode() {
        // makedev(0xfe, 0) and makedev(259, 70000) as glibc encodes them.
        assert_eq!((dev_major(0xfe00), dev_minor(0xfe00)), (0xfe, 0));
        let (ma, mi) = (259u64, 70000u64);
        let dev = ((ma & 0xfff) << 8) | (mi & 0xff) | ((mi >> 8) << 20);
        assert_eq!((dev_major(dev), dev_minor(dev)), (259, 70000));
    }

    #[test]
    fn liveness_of_this_process_and_of_pid_zero() {
        assert!(pid_alive(i64::from(std::process::id())));
        assert!(!pid_alive(0));
    }

    #[test]
    fn a_live_holder_fails_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        let opts = OpenOptions {
            create_size: Some(1 << 20),
            direct: false,
            backend: Backend::Pread,
            ..OpenOptions::default()
        };
        let _held = open_device(&p, &opts).unwrap();
        // Held by this (live) process: "already open", not a wait.
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(&p).unwrap();
        let (major, minor) = (dev_major(md.dev()), dev_minor(md.dev()));
        assert_eq!(
            flock_holders_of(major, minor, md.ino()),
            Some(vec![i64::from(std::process::id())])
        );
        assert!(matches!(open_device(&p, &opts), Err(DeviceError::Busy(_))));
    }
}
