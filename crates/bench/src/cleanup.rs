//! Teardown of everything the benchmark sets up (loop devices, mounts,
//! backing files), on every exit path.
//!
//! Invariant: every resource is registered here *before* it is created
//! (registration names it by a path the benchmark chose, not by a handle the
//! kernel returns), so there is no window in which a signal could leave an
//! unregistered loop device or mount behind. Normal and error paths release
//! resources through guards (`Cleanup`) whose `Drop` runs the action; a
//! signal sets [`stop_requested`] so load loops end and the guards unwind,
//! and if that takes too long (or a second signal arrives) the handler
//! thread runs every registered action itself and exits.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Once;
use std::time::Duration;

use parking_lot::Mutex;

/// Set once SIGINT/SIGTERM arrived; load loops poll it.
static STOP: AtomicBool = AtomicBool::new(false);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Registered teardown actions, in creation order (undone in reverse).
static REGISTRY: Mutex<Vec<(u64, Action)>> = Mutex::new(Vec::new());
static HANDLER: Once = Once::new();

/// The process group of the external tool running now (fs_mark, which
/// leads its own group), 0 for none: a forced teardown kills it first.
static TOOL_GROUP: AtomicI32 = AtomicI32::new(0);

/// Longest wait for a killed process group's processes to exit.
const GROUP_EXIT_WAIT: Duration = Duration::from_secs(5);

/// Longest wait for a detached loop device to go away.
const DETACH_WAIT: Duration = Duration::from_secs(5);

/// How long a first signal waits for the normal unwinding before forcing
/// the teardown.
const GRACE_PERIOD: Duration = Duration::from_secs(10);

/// True once the user asked to stop (Ctrl-C or SIGTERM).
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// What the registered teardown steps undo, for the Ctrl-C message: "loop
/// devices and mounts" only when there are some (found by a new-user pass:
/// `--target rbd:…` said so when it removed RBD images).
pub(crate) fn pending_description() -> String {
    describe_actions(REGISTRY.lock().iter().map(|(_, a)| a))
}

fn describe_actions<'a>(actions: impl Iterator<Item = &'a Action>) -> String {
    // 0 mounts, 1 loop devices, 2 files, 3 RBD images
    let kinds: Vec<u8> = actions
        .map(|a| match a {
            Action::Unmount(_) => 0,
            Action::DetachLoopsOf(_) => 1,
            Action::RemoveFile(_) => 2,
            #[cfg(feature = "rbd")]
            Action::RemoveRbdImage(_) => 3,
        })
        .collect();
    let [mounts, loops, files, images] = [0u8, 1, 2, 3].map(|k| kinds.contains(&k));
    let parts: Vec<&str> = [
        (loops, "loop devices"),
        (mounts, "mounts"),
        (images, "the RBD images this run created"),
        (files, "the files this run created"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, what)| *what)
    .collect();
    match parts.as_slice() {
        [] => "what this run set up".to_string(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// One teardown step.
#[derive(Clone, Debug)]
pub(crate) enum Action {
    /// `umount` the directory (lazily if busy), then remove it.
    Unmount(PathBuf),
    /// Detach every loop device whose backing file is this path.
    DetachLoopsOf(PathBuf),
    /// Remove a file.
    RemoveFile(PathBuf),
    /// Remove a Ceph RBD image (`rbd:POOL/IMAGE[:options]`; `--target`).
    #[cfg(feature = "rbd")]
    RemoveRbdImage(String),
}

impl Action {
    fn perform(&self) {
        match self {
            Action::Unmount(dir) => {
                if is_mounted(dir) {
                    let ok = run_quiet("umount", &[dir.as_os_str()]);
                    if !ok {
                        // Busy (a worker still holds a file): detach now, the
                        // kernel finishes the unmount when the last user goes.
                        run_quiet("umount", &["-l".as_ref(), dir.as_os_str()]);
                    }
                }
                let _ = std::fs::remove_dir(dir);
            }
            Action::DetachLoopsOf(file) => {
                let devs = loops_of(file);
                for dev in &devs {
                    if !run_quiet("losetup", &["-d".as_ref(), dev.as_os_str()]) {
                        eprintln!("jbdev bench: could not detach {}", dev.display());
                    }
                }
                // A device still open somewhere (udev probing it, a lazy
                // unmount) is only marked for detaching: wait, bounded,
                // until it is gone, so "torn down" is true when said.
                let deadline = std::time::Instant::now() + DETACH_WAIT;
                while !devs.is_empty()
                    && loops_of(file).iter().any(|d| devs.contains(d))
                    && std::time::Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            Action::RemoveFile(path) => {
                let _ = std::fs::remove_file(path);
            }
            #[cfg(feature = "rbd")]
            Action::RemoveRbdImage(target) => {
                use jbdev_device::rbd::{remove_image, RbdTarget};
                if let Ok(t) = RbdTarget::parse(target) {
                    if let Err(e) = remove_image(&t) {
                        eprintln!(
                            "jbdev bench: could not remove the RBD image {} ({e}); `rbd rm` it",
                            t.short_name()
                        );
                    }
                }
            }
        }
    }
}

fn run_quiet(cmd: &str, args: &[&std::ffi::OsStr]) -> bool {
    Command::new(cmd)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// True if `dir` is a mount point (per /proc/self/mounts).
pub fn is_mounted(dir: &Path) -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return false;
    };
    let want = dir.to_string_lossy();
    mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(want.as_ref()))
}

/// Loop devices attached to `file` (`losetup -j FILE`).
pub fn loops_of(file: &Path) -> Vec<PathBuf> {
    let Ok(out) = Command::new("losetup").arg("-j").arg(file).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(':').next())
        .filter(|d| d.starts_with("/dev/"))
        .map(PathBuf::from)
        .collect()
}

/// A registered teardown action, performed when the guard drops.
#[derive(Debug)]
pub(crate) struct Cleanup {
    id: u64,
}

impl Cleanup {
    /// Registers `action`; call this *before* creating the resource.
    pub(crate) fn register(action: Action) -> Cleanup {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        REGISTRY.lock().push((id, action));
        Cleanup { id }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let action = {
            let mut reg = REGISTRY.lock();
            let pos = reg.iter().position(|(id, _)| *id == self.id);
            pos.map(|p| reg.remove(p).1)
        };
        // Already gone if the signal handler forced the teardown.
        if let Some(a) = action {
            a.perform();
        }
    }
}

/// Registers the process group of the tool running now (a child that
/// leads its own group: `process_group(0)`), or forgets it (0).
pub(crate) fn set_tool_group(pgid: i32) {
    TOOL_GROUP.store(pgid, Ordering::SeqCst);
}

/// Kills process group `pgid` (SIGKILL) and waits, at most
/// [`GROUP_EXIT_WAIT`], until none of its processes runs (a zombie holds
/// nothing open). False, doing nothing, for a `pgid` that names no group
/// of a child (0 or less: that would be this process's own group).
pub(crate) fn kill_group(pgid: i32) -> bool {
    if pgid <= 0 {
        return false;
    }
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pgid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let deadline = std::time::Instant::now() + GROUP_EXIT_WAIT;
    while running_in_group(pgid) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// How many processes of group `pgid` are running (zombies are not).
fn running_in_group(pgid: i32) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            // "pid (comm) state ppid pgrp ...": comm may hold spaces.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.first() != Some(&"Z") && f.get(2).and_then(|g| g.parse().ok()) == Some(pgid)
        })
        .count()
}

/// Performs every registered action, newest first, after killing the
/// tool's process group (whose open files would keep a mount busy).
fn force_teardown() {
    kill_group(TOOL_GROUP.swap(0, Ordering::SeqCst));
    loop {
        let next = REGISTRY.lock().pop();
        match next {
            Some((_, a)) => a.perform(),
            None => break,
        }
    }
}

/// Installs the SIGINT/SIGTERM/SIGHUP handler (idempotent; ctrlc with its
/// `termination` feature). The first signal asks
/// the load to stop and lets the guards unwind; a second one, or the grace
/// period running out, tears everything down from the handler thread and
/// exits with status 130.
pub fn install_signal_handler() {
    HANDLER.call_once(|| {
        let res = ctrlc::set_handler(|| {
            if STOP.swap(true, Ordering::SeqCst) {
                eprintln!("jbdev bench: second signal, tearing down now");
                force_teardown();
                std::process::exit(130);
            }
            eprintln!("jbdev bench: stopping; tearing down {}", pending_description());
            std::thread::spawn(|| {
                std::thread::sleep(GRACE_PERIOD);
                force_teardown();
                std::process::exit(130);
            });
        });
        if let Err(e) = res {
            tracing::warn!("cannot install the Ctrl-C handler ({e}); an interrupted run may leave loop devices behind");
        }
    });
}

/// Number of registered (not yet torn down) resources; for tests.
pub fn registered_count() -> usize {
    REGISTRY.lock().len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// Report s20 #7: Ctrl-C names what it tears down: RBD images, not
    /// loop devices and mounts, for a `--target` run. (Fails on the old
    /// code, which always said "loop devices and mounts".)
    #[test]
    fn the_teardown_message_names_what_is_torn_down() {
        let loops = [
            Action::DetachLoopsOf("/x".into()),
            Action::Unmount("/m".into()),
        ];
        assert_eq!(describe_actions(loops.iter()), "loop devices and mounts");
        assert_eq!(describe_actions([].iter()), "what this run set up");
        #[cfg(feature = "rbd")]
        {
            let rbd = [
                Action::RemoveRbdImage("rbd:p/i".into()),
                Action::RemoveFile("/j".into()),
            ];
            let d = describe_actions(rbd.iter());
            assert_eq!(
                d,
                "the RBD images this run created and the files this run created"
            );
            assert!(!d.contains("loop") && !d.contains("mount"), "{d}");
        }
    }

    /// kill_group stops every process of a child's group, the grandchildren
    /// too (which killing the child alone leaves running), and is back only
    /// once none runs; it never signals this process's own group.
    #[test]
    fn kill_group_stops_the_whole_group_and_waits_for_it() {
        let mut child = Command::new("sh")
            .args(["-c", "sleep 60 & sleep 60 & wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = i32::try_from(child.id()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while running_in_group(pgid) < 3 {
            assert!(std::time::Instant::now() < deadline, "sh never forked");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(kill_group(pgid));
        assert_eq!(running_in_group(pgid), 0);
        assert!(!child.wait().unwrap().success());
        assert!(!kill_group(0) && !kill_group(-1));
    }
}
