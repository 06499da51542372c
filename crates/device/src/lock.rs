//! Who holds a device: the lock an open takes (flock on files and on a
//! loop device's backing file), the holders `/proc/locks` lists, and the
//! wait for a lock whose holder has exited.

use std::fs::{File, OpenOptions as FsOpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{DeviceError, Result};

/// Longest wait for a file lock whose every holder has exited (see
/// `flock_file`).
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
    live_processes_with_open(max, false, |m| {
        m.ino() == ino && dev_major(m.dev()) == major && dev_minor(m.dev()) == minor
    })
}

/// Live processes with a descriptor (`/proc/PID/fd`, stat through the
/// magic link: the file itself, not the link) whose file `matches`, at
/// most `max` of them; this one only if `with_self`.
fn live_processes_with_open(
    max: usize,
    with_self: bool,
    matches: impl Fn(&std::fs::Metadata) -> bool,
) -> Vec<i64> {
    let me = i64::from(std::process::id());
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i64>().ok()) else {
            continue;
        };
        if pid == me && !with_self {
            continue;
        }
        // A process whose main thread has exited keeps its descriptors in
        // its other threads: their fd table, not the leader's (empty).
        let Some(task) = live_task(pid) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("task").join(task.to_string()).join("fd"))
        else {
            continue;
        };
        if fds
            .flatten()
            .any(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| matches(&m)))
        {
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
    live_task(pid).is_some()
}

/// A thread of process `pid` that has not exited: the main thread if it
/// runs, else any other (a process whose main thread called
/// `pthread_exit` is a zombie leader with live threads that still hold
/// its files and locks: session 33's timing pass saw such a holder taken
/// for dead, waited for, then blamed on a stalled device).
fn live_task(pid: i64) -> Option<i64> {
    if task_alive(&format!("/proc/{pid}/stat")) {
        return Some(pid);
    }
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
        .filter_map(|t| t.file_name().to_str()?.parse::<i64>().ok())
        .find(|tid| task_alive(&format!("/proc/{pid}/task/{tid}/stat")))
}

/// Whether the task whose `stat` file is at `path` exists and has not
/// exited (not a zombie, not dead).
fn task_alive(path: &str) -> bool {
    match std::fs::read_to_string(path) {
        // The state follows the parenthesised command name.
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X' | 'x')
        ),
        Err(_) => false,
    }
}

/// An exclusive open of the block device at `path` failed with EBUSY: why,
/// as the `Busy` error's text, or `None` to wait and try again.
///
/// The kernel does not say who holds a block device. A live process with
/// it open (other than this one, whose own descriptors are its own
/// business: a second open in one process is refused), a mount, swap or a
/// stacked device (md, device-mapper: `holders` in sysfs) is refused at
/// once, named where it can be. With none of those, the claim is a killed
/// process's, released once the kernel has torn down its io_uring (a
/// supervisor's restart right after `kill -9` was refused "already open"
/// 3 times in 20 on a loop device, session 28's pass): waited for, up to
/// [`DEAD_HOLDER_WAIT`] from the first refusal (`since`), saying so once.
pub(crate) fn block_device_busy(
    path: &Path,
    what: &str,
    since: &std::cell::Cell<Option<Instant>>,
) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let held = || held_exclusively(what);
    let Ok(rdev) = std::fs::metadata(path).map(|m| m.rdev()) else {
        return Some(held());
    };
    let (major, minor) = (dev_major(rdev), dev_minor(rdev));
    if let Some(pid) = live_block_device_openers(rdev, 1).first() {
        let who = describe_holder(*pid);
        return Some(with_note(held(), &who));
    }
    if let Some(user) = kernel_user_of(major, minor) {
        return Some(format!("{what} ({user})"));
    }
    let start = since.get().unwrap_or_else(|| {
        tracing::warn!(
            "{what} is held exclusively, by no live process, mount or stacked device: \
             waiting up to {} s for the kernel to release the claim of a process that \
             exited",
            DEAD_HOLDER_WAIT.as_secs()
        );
        Instant::now()
    });
    since.set(Some(start));
    if start.elapsed() >= DEAD_HOLDER_WAIT {
        return Some(with_note(
            held(),
            &format!(
                "no live process has it open, and the claim was not released in {} s",
                DEAD_HOLDER_WAIT.as_secs()
            ),
        ));
    }
    None
}

/// Live processes, this one included, with a descriptor of the block
/// device `rdev` open (`/proc/PID/fd`), at most `max`.
fn live_block_device_openers(rdev: u64, max: usize) -> Vec<i64> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    live_processes_with_open(max, true, |m| {
        m.file_type().is_block_device() && m.rdev() == rdev
    })
}

/// What in the kernel uses block device `major:minor`, if anything: a
/// mounted file system, swap, or a device stacked on it (sysfs `holders`).
fn kernel_user_of(major: u64, minor: u64) -> Option<String> {
    let id = format!("{major}:{minor}");
    if let Some(at) = mount_point_of(&id) {
        return Some(at);
    }
    let sys = PathBuf::from(format!("/sys/dev/block/{id}"));
    let holders: Vec<String> = std::fs::read_dir(sys.join("holders"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    if !holders.is_empty() {
        return Some(format!("held by {}", holders.join(", ")));
    }
    let name = std::fs::read_link(&sys)
        .ok()
        .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()));
    // A file system unmounted lazily (`umount -l`) while a file on it is
    // still open is in no mount table, but still holds the device, and
    // these file systems list it in sysfs (session 29's pass: waited 10 s
    // as a dead process's claim).
    if let Some(n) = &name {
        for fs in ["ext4", "xfs", "f2fs"] {
            if Path::new("/sys/fs").join(fs).join(n).exists() {
                return Some(format!(
                    "an {fs} file system is still active on it, mounted nowhere: unmounted \
                     lazily (umount -l) while files on it are open?"
                ));
            }
        }
    }
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    if let Some(n) = name {
        if swaps
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().next() == Some(&format!("/dev/{n}")))
        {
            return Some("used as swap".into());
        }
    }
    None
}

/// A block device's `O_EXCL` open failed with EBUSY: the kernel does not
/// say who holds it, and it is seldom jbdev.
pub(crate) fn held_exclusively(what: &str) -> String {
    format!(
        "{what} (a block device held exclusively elsewhere: a mounted file system, LVM, md \
         or device-mapper, swap, or another jbdev)"
    )
}

/// Where the block device at `path` is mounted ("mounted at X", and in
/// which mount namespace when not this process's); None for a path that is
/// no block device or is not mounted anywhere a live process sees.
pub fn block_device_mount(path: &Path) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::metadata(path).ok()?;
    if !m.file_type().is_block_device() {
        return None;
    }
    mount_point_of(&format!("{}:{}", dev_major(m.rdev()), dev_minor(m.rdev())))
}

/// Where the block device `id` ("MAJ:MIN") is mounted: in this process's
/// mount namespace, or else in any other a live process is in (one mount
/// table read per namespace; session 29's pass: a device mounted only
/// inside `unshare -m` was waited for 10 s as a dead process's claim).
fn mount_point_of(id: &str) -> Option<String> {
    // mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT ...
    let find = |mounts: &str| {
        mounts.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&id)).then(|| f.get(4).unwrap_or(&"?").to_string())
        })
    };
    let own_ns = std::fs::read_link("/proc/self/ns/mnt").ok();
    if let Some(at) = find(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default()) {
        return Some(format!("mounted at {at}"));
    }
    let mut seen: std::collections::HashSet<PathBuf> = own_ns.into_iter().collect();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let pid = e.file_name();
        if !pid.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(ns) = std::fs::read_link(e.path().join("ns/mnt")) else {
            continue;
        };
        if !seen.insert(ns) {
            continue;
        }
        let mounts = std::fs::read_to_string(e.path().join("mountinfo")).unwrap_or_default();
        if let Some(at) = find(&mounts) {
            return Some(format!(
                "mounted at {at} in the mount namespace of process {}",
                pid.to_string_lossy()
            ));
        }
    }
    None
}

/// `LOOP_GET_STATUS64` (`0x4C05`).
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;

/// `struct loop_info64` of `<linux/loop.h>`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// The kernel's `new_decode_dev` (how `lo_device` is encoded) as
/// (major, minor).
fn kernel_decode_dev(dev: u64) -> (u64, u64) {
    ((dev & 0xfff00) >> 8, (dev & 0xff) | ((dev >> 12) & 0xfff00))
}

/// The storage behind the loop block device open as `file`: the device and
/// inode of its backing file, and the path the kernel recorded for it.
/// `None` if `file` is not a (bound) loop device. A loop *partition*
/// (`/dev/loop3p1`) is resolved through its parent device in sysfs.
fn loop_backing(file: &File) -> Option<((u64, u64), u64, PathBuf)> {
    use std::os::unix::fs::MetadataExt;
    let rdev = file.metadata().ok()?.rdev();
    let sys = PathBuf::from(format!(
        "/sys/dev/block/{}:{}",
        dev_major(rdev),
        dev_minor(rdev)
    ));
    let loop_dir = if sys.join("loop").is_dir() {
        sys.join("loop")
    } else if sys.join("partition").exists() && sys.join("../loop").is_dir() {
        sys.join("../loop")
    } else {
        return None;
    };
    let recorded = std::fs::read_to_string(loop_dir.join("backing_file")).ok()?;
    let recorded = PathBuf::from(recorded.trim_end_matches('\n'));
    if loop_dir == sys.join("loop") {
        // The identity from the kernel itself: the path may be stale.
        // SAFETY: loop_info64 is plain old data; all-zero is valid.
        let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
        // SAFETY: LOOP_GET_STATUS64 fills the struct we pass a pointer to.
        let r = unsafe {
            libc::ioctl(
                file.as_raw_fd(),
                LOOP_GET_STATUS64 as _,
                &mut info as *mut LoopInfo64,
            )
        };
        if r == 0 {
            return Some((kernel_decode_dev(info.lo_device), info.lo_inode, recorded));
        }
    }
    // A partition, or the ioctl refused: identify by what the path names now.
    let md = std::fs::metadata(&recorded).ok()?;
    Some((
        (dev_major(md.dev()), dev_minor(md.dev())),
        md.ino(),
        recorded,
    ))
}

/// If `file` is a loop block device, takes on its backing storage the lock
/// an open of the backing file's own path would take (`flock`, shared for a
/// read-only open, exclusive otherwise; `O_EXCL` if the backing is itself a
/// block device) and returns the descriptor holding it. Without this a
/// volume could be opened through `/dev/loopN` and through its backing file
/// (or a second loop device over it) at once: two writers of one journal.
/// The backing file is identified by device and inode (`LOOP_GET_STATUS64`);
/// if the recorded path no longer names it (moved, deleted) it cannot be
/// locked, and we refuse only if `/proc/locks` shows a live holder. A lock
/// whose holders have all exited is waited for, as for an open of the file
/// ([`flock_file`]).
pub(crate) fn lock_loop_backing(file: &File, what: &str, read_only: bool) -> Result<Option<File>> {
    use std::os::unix::fs::MetadataExt;
    let Some(((major, minor), ino, path)) = loop_backing(file) else {
        return Ok(None);
    };
    let alias = || format!("{what} is backed by {}, which", path.display());
    let md = std::fs::metadata(&path).ok();
    let same = md.as_ref().is_some_and(|m| {
        dev_major(m.dev()) == major && dev_minor(m.dev()) == minor && m.ino() == ino
    });
    if !same {
        if flock_holders_of(major, minor, ino).is_some_and(|h| h.iter().any(|&pid| pid_alive(pid)))
        {
            return Err(DeviceError::Busy(alias()));
        }
        tracing::warn!(
            "{what}: its backing file {} is no longer at that path (moved or deleted), so it cannot be locked against a second opener",
            path.display()
        );
        return Ok(None);
    }
    let is_blk = md.is_some_and(|m| m.file_type().is_block_device());
    let mut o = FsOpenOptions::new();
    o.read(true);
    if is_blk {
        o.custom_flags(libc::O_EXCL);
    }
    let backing = match o.open(&path) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Err(DeviceError::Busy(alias())),
        Err(e) => return Err(DeviceError::io("open (loop backing file)", alias(), e)),
    };
    // The file we opened must still be the loop's (a rename in between).
    let now = backing
        .metadata()
        .map_err(|e| DeviceError::io("stat", path.display().to_string(), e))?;
    if now.ino() != ino {
        return Err(DeviceError::Invalid(format!(
            "{what}: its backing file {} changed while it was being locked; try again",
            path.display()
        )));
    }
    if !is_blk {
        flock_file(&backing, &path, read_only, alias)?;
    }
    Ok(Some(backing))
}

/// Takes the lock a jbdev open takes on `file` (opened at `path`): shared
/// for a read-only open, exclusive otherwise. `held` names what is locked,
/// for the `Busy` error when another open holds it.
///
/// A lock held by a live process fails at once, and so does one whose
/// listed holders have exited while a live process still has the file open
/// (it inherited the locked descriptor: [`live_openers_of`]).
/// One whose every holder has exited (`/proc/locks`) is waited for, up to
/// [`DEAD_HOLDER_WAIT`](DEAD_HOLDER_WAIT), saying so. Why: a
/// process killed with SIGKILL keeps its flock until the kernel has released
/// every reference to its open file, and io_uring instances are torn down
/// asynchronously after the process is gone, so for a moment the lock
/// outlives its owner and a supervisor's immediate restart would fail with
/// "already open". The same wait serves an open of the file and of a loop
/// device over it (the lock on its backing file, [`lock_loop_backing`]).
pub(crate) fn flock_file(
    file: &File,
    path: &Path,
    read_only: bool,
    held: impl Fn() -> String,
) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let op = if read_only {
        libc::LOCK_SH
    } else {
        libc::LOCK_EX
    };
    let mut deadline: Option<Instant> = None;
    loop {
        // SAFETY: flock on a valid, owned descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(DeviceError::io("flock", held(), e));
        }
        let id = file
            .metadata()
            .ok()
            .map(|m| (dev_major(m.dev()), dev_minor(m.dev()), m.ino()));
        let holders = id.and_then(|(ma, mi, ino)| flock_holders_of(ma, mi, ino));
        let (Some(holders), Some((ma, mi, ino))) = (holders, id) else {
            return Err(DeviceError::Busy(held()));
        };
        if let Some(&pid) = holders.iter().find(|&&pid| pid_alive(pid)) {
            let who = describe_holder(pid);
            return Err(DeviceError::Busy(with_note(held(), &who)));
        }
        if deadline.is_none() {
            // Listed holders all dead, but a live process has the file open:
            // it holds the lock through a descriptor it inherited (a shell's
            // `flock -x FD`), and no wait will end that. Once: a killed
            // holder's descriptors are gone from /proc at once.
            let live = live_openers_of(ma, mi, ino, 4);
            if !live.is_empty() {
                let pids: Vec<String> = live.iter().map(i64::to_string).collect();
                let note = format!(
                    "pid {} has it open, and the lock with it: the process that took the lock has exited",
                    pids.join(", ")
                );
                return Err(DeviceError::Busy(with_note(held(), &note)));
            }
        }
        // All holders have exited, or none is listed any more (the lock
        // went away between our attempt and the look): retry.
        let deadline = *deadline.get_or_insert_with(|| {
            if !holders.is_empty() {
                tracing::warn!(
                    "{} is locked by a process that has exited; waiting up to {} s for the kernel to release the lock",
                    path.display(),
                    DEAD_HOLDER_WAIT.as_secs()
                );
            }
            Instant::now() + DEAD_HOLDER_WAIT
        });
        if Instant::now() >= deadline {
            // Said as it is: no live process holds it (session 26's pass
            // saw such a lock outlive its killed owner by minutes, on a
            // disk another program kept busy).
            let pids: Vec<String> = holders
                .iter()
                .filter(|&&p| p > 0)
                .map(i64::to_string)
                .collect();
            let who = if pids.is_empty() {
                "a process".to_string()
            } else {
                format!("pid {}", pids.join(", "))
            };
            let note = format!(
                "the lock is left by {who}, which has exited; the kernel releases it once that \
                 process's I/O in flight has finished, and has not after {} s (a slow or stalled \
                 device?): try again",
                DEAD_HOLDER_WAIT.as_secs()
            );
            return Err(DeviceError::Busy(with_note(held(), &note)));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `held` (a name, perhaps with who may hold it in parentheses) with `note`
/// in its parentheses.
fn with_note(held: String, note: &str) -> String {
    match held.strip_suffix(')') {
        Some(h) => format!("{h}; {note})"),
        None => format!("{held} ({note})"),
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
}
