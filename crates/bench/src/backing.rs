//! Backings: a loop device over a file in /dev/shm (`ram`), a loop device
//! with direct I/O over a file on disk (`disk`), a loop device over a file
//! on a FUSE file system whose fsync takes a set time (`slow`, see
//! [`crate::slow`]), or a user-given device or file. Also ext4 mounts on a
//! backing for the kernel's filesystem baselines.
//!
//! Every loop device, backing file and mount is owned by a guard registered
//! in [`crate::cleanup`] before it exists, so it is torn down on success, on
//! error and on Ctrl-C.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::cleanup::{self, Action, Cleanup};
use crate::error::{io_err, BenchError, Result};
use crate::slow::SlowServer;

/// Bytes at the end of the backing reserved for the kernel's raw writes.
pub const KERNEL_AREA_BYTES: u64 = 32 << 20;

/// Opens the raw backing for the kernel's own path: `O_DIRECT`, plus
/// `O_SYNC` when `sync`. Falls back to buffered I/O only where the file
/// system refuses `O_DIRECT` (noted in the returned flag).
pub fn open_kernel(path: &Path, sync: bool) -> Result<(File, bool)> {
    let open = |direct: bool| {
        let mut flags = if sync { libc::O_SYNC } else { 0 };
        if direct {
            flags |= libc::O_DIRECT;
        }
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(path)
    };
    match open(true) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let f = open(false).map_err(io_err(format!("open {}", path.display())))?;
            Ok((f, false))
        }
        Err(e) => Err(io_err(format!("open {}", path.display()))(e)),
    }
}

/// Which backing to benchmark on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackingKind {
    /// Loop device over a file in /dev/shm: a fast device (the seed's ramdisk).
    Ram,
    /// Loop device with `--direct-io=on` over a file on disk.
    Disk,
    /// Loop device over a file on a FUSE file system whose fsync and flush
    /// take a set time (a slow-flush device); reads and writes pass
    /// straight through to a store file in /dev/shm (or on disk).
    Slow,
    /// A block device or regular file the user named (its content is destroyed).
    Device(PathBuf),
}

impl BackingKind {
    /// Short name used in tables, JSON and plot file names.
    pub fn name(&self) -> &'static str {
        match self {
            BackingKind::Ram => "ram",
            BackingKind::Disk => "disk",
            BackingKind::Slow => "slow",
            BackingKind::Device(_) => "device",
        }
    }
}

impl std::str::FromStr for BackingKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "ram" => Ok(Self::Ram),
            "disk" => Ok(Self::Disk),
            "slow" => Ok(Self::Slow),
            _ => Err(format!(
                "unknown backing {s:?} (ram, disk or slow; or use --device PATH)"
            )),
        }
    }
}

/// Where to put backing files and how big they are.
#[derive(Clone, Debug)]
pub struct BackingConfig {
    pub size_bytes: u64,
    /// Directory of the `disk` backing file (default /var/tmp).
    pub disk_dir: PathBuf,
    /// Directory of the `ram` backing file (default /dev/shm).
    pub ram_dir: PathBuf,
    /// Use a user-given device even if it holds a jbdev volume or journal,
    /// or a file system (`--force`). A mounted device is refused regardless.
    pub force: bool,
    /// Extra time of every fsync/flush on the `slow` backing.
    pub slow_flush: Duration,
    /// The `slow` backing's store file goes on disk (`disk_dir`) instead of
    /// /dev/shm.
    pub slow_on_disk: bool,
}

impl Default for BackingConfig {
    fn default() -> Self {
        Self {
            size_bytes: 1 << 30,
            disk_dir: PathBuf::from("/var/tmp"),
            ram_dir: PathBuf::from("/dev/shm"),
            force: false,
            slow_flush: crate::slow::DEFAULT_FLUSH_DELAY,
            slow_on_disk: false,
        }
    }
}

static SEQ: AtomicU64 = AtomicU64::new(0);

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A set-up backing. Dropping it detaches the loop device and removes the
/// backing file.
#[derive(Debug)]
pub struct Backing {
    pub kind: BackingKind,
    /// The path both jbdev and the kernel baselines use: the loop device,
    /// or the user's device or file.
    pub path: PathBuf,
    pub is_block_device: bool,
    pub size_bytes: u64,
    /// Human-readable description for the report.
    pub description: String,
    /// The file behind the loop device (ram and disk backings).
    pub backing_file: Option<PathBuf>,
    // Field order is drop order: detach the loop device, then unmount the
    // FUSE file system (slow) and stop its server, then remove the file.
    _watch: crate::devstat::Watch,
    _loop: Option<Cleanup>,
    _fuse: Option<SlowServer>,
    _file: Option<Cleanup>,
}

impl Backing {
    /// Sets up a backing (needs root for `ram` and `disk`).
    pub fn setup(kind: &BackingKind, cfg: &BackingConfig) -> Result<Backing> {
        match kind {
            BackingKind::Ram => Self::setup_loop(kind, &cfg.ram_dir, cfg.size_bytes, false),
            BackingKind::Disk => Self::setup_loop(kind, &cfg.disk_dir, cfg.size_bytes, true),
            BackingKind::Slow => Self::setup_slow(cfg),
            BackingKind::Device(p) => Self::use_device(p, cfg.force),
        }
    }

    fn setup_loop(
        kind: &BackingKind,
        dir: &Path,
        size_bytes: u64,
        direct: bool,
    ) -> Result<Backing> {
        check_tool("losetup")?;
        let file = dir.join(format!("{}.img", unique("jbdev-bench")));
        // Registered before creation (see the module invariant in cleanup.rs).
        let file_guard = Cleanup::register(Action::RemoveFile(file.clone()));
        fill_file(&file, size_bytes, kind == &BackingKind::Ram)?;
        let (dev, loop_guard) = attach_loop(&file, direct)?;
        let dio = read_loop_dio(&dev);
        let probe = match probe_flush(&dev, size_bytes) {
            Ok(p) => p,
            Err(BenchError::Interrupted) => return Err(BenchError::Interrupted),
            Err(e) => format!("flush probe failed: {e}"),
        };
        if direct && dio != Some(true) {
            tracing::warn!(
                "{}: the loop driver did not enable direct I/O over {}; figures include the host page cache",
                dev.display(),
                file.display()
            );
        }
        let description = format!(
            "{} over {} ({} MiB, loop direct-io {}); {probe}",
            dev.display(),
            file.display(),
            size_bytes >> 20,
            match dio {
                Some(true) => "on",
                Some(false) => "off",
                None => "unknown",
            }
        );
        Ok(Backing {
            _watch: crate::devstat::watch(&dev),
            kind: kind.clone(),
            path: dev,
            is_block_device: true,
            size_bytes,
            description,
            backing_file: Some(file),
            _loop: Some(loop_guard),
            _fuse: None,
            _file: Some(file_guard),
        })
    }

    /// The slow-flush backing: store file, FUSE mount over it, loop device
    /// over the FUSE image (direct I/O off, like `ram`), then a short probe
    /// showing that a flush on the loop device costs the set delay.
    fn setup_slow(cfg: &BackingConfig) -> Result<Backing> {
        check_tool("losetup")?;
        crate::slow::fuse_available()
            .map_err(|why| BenchError::Setup(format!("the slow backing needs FUSE: {why}")))?;
        if cfg.size_bytes < 2 * KERNEL_AREA_BYTES {
            return Err(BenchError::InvalidArgument(format!(
                "--backing-size must be at least {} MiB for the slow backing",
                (2 * KERNEL_AREA_BYTES) >> 20
            )));
        }
        let dir = if cfg.slow_on_disk {
            &cfg.disk_dir
        } else {
            &cfg.ram_dir
        };
        let store = dir.join(format!("{}.img", unique("jbdev-bench-slow")));
        let file_guard = Cleanup::register(Action::RemoveFile(store.clone()));
        fill_file(&store, cfg.size_bytes, !cfg.slow_on_disk)?;
        let mnt = std::env::temp_dir().join(unique("jbdev-bench-fuse"));
        let server = SlowServer::start(mnt, &store, cfg.size_bytes, cfg.slow_flush)?;
        let image = server.image.clone();
        let (dev, loop_guard) = attach_loop(&image, false)?;
        let probe = match probe_flush(&dev, cfg.size_bytes) {
            Ok(p) => p,
            Err(BenchError::Interrupted) => return Err(BenchError::Interrupted),
            Err(e) => format!("flush probe failed: {e}"),
        };
        let description = format!(
            "{} over {} (FUSE, fsync/flush +{:.1} ms, one at a time; I/O passed through to {}; {} MiB, loop direct-io {}); {probe}",
            dev.display(),
            image.display(),
            cfg.slow_flush.as_secs_f64() * 1e3,
            store.display(),
            cfg.size_bytes >> 20,
            match read_loop_dio(&dev) {
                Some(true) => "on",
                Some(false) => "off",
                None => "unknown",
            }
        );
        Ok(Backing {
            _watch: crate::devstat::watch(&dev),
            kind: BackingKind::Slow,
            path: dev,
            is_block_device: true,
            size_bytes: cfg.size_bytes,
            description,
            backing_file: Some(image),
            _loop: Some(loop_guard),
            _fuse: Some(server),
            _file: Some(file_guard),
        })
    }

    /// The slow backing's FUSE server (None on other backings).
    pub fn slow_server(&self) -> Option<&SlowServer> {
        self._fuse.as_ref()
    }

    fn use_device(path: &Path, force: bool) -> Result<Backing> {
        let meta = std::fs::metadata(path).map_err(io_err(format!("stat {}", path.display())))?;
        let is_block_device = meta.file_type().is_block_device();
        if !is_block_device && !meta.is_file() {
            return Err(BenchError::InvalidArgument(format!(
                "{} is neither a block device nor a regular file",
                path.display()
            )));
        }
        let canon =
            std::fs::canonicalize(path).map_err(io_err(format!("resolve {}", path.display())))?;
        if is_block_device && device_is_mounted(&canon) {
            return Err(BenchError::InvalidArgument(format!(
                "{} is mounted; refusing to overwrite it",
                canon.display()
            )));
        }
        let mut f = File::open(path).map_err(io_err(format!("open {}", path.display())))?;
        if !force {
            if let Some(what) = existing_content(&mut f, path)? {
                return Err(BenchError::InvalidArgument(format!(
                    "{} holds {what}; the benchmark would destroy it. Point --device at a \
                     scratch file or device (e.g. `fallocate -l 1G /var/tmp/scratch.img`), \
                     or add --force to overwrite it",
                    path.display()
                )));
            }
        }
        let size_bytes = f
            .seek(SeekFrom::End(0))
            .map_err(io_err(format!("size of {}", path.display())))?;
        Ok(Backing {
            _watch: crate::devstat::watch(path),
            kind: BackingKind::Device(path.to_path_buf()),
            path: path.to_path_buf(),
            is_block_device,
            size_bytes,
            description: format!(
                "{} ({}, {} MiB; content destroyed)",
                path.display(),
                if is_block_device {
                    "block device"
                } else {
                    "regular file"
                },
                size_bytes >> 20
            ),
            backing_file: None,
            _loop: None,
            _fuse: None,
            _file: None,
        })
    }

    /// Short name ("ram", "disk", "device").
    pub fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// True if an ext4 filesystem can be made and mounted on this backing
    /// (block devices only: a regular file would need another loop device,
    /// which would no longer be the same backing).
    pub fn can_mount(&self) -> bool {
        self.is_block_device && tool_exists("mkfs.ext4") && tool_exists("mount")
    }

    /// Makes a fresh ext4 on the backing and mounts it. Everything on the
    /// backing is lost.
    pub fn mount_ext4(&self) -> Result<Ext4Mount> {
        if !self.can_mount() {
            return Err(BenchError::Setup(format!(
                "cannot mount ext4 on {} (needs a block device, mkfs.ext4 and mount)",
                self.path.display()
            )));
        }
        let mut mkfs = Command::new("mkfs.ext4");
        // No lazy init: ext4lazyinit would write inode tables in the
        // background during the measurement.
        mkfs.args([
            "-F",
            "-q",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0,nodiscard",
        ])
        .arg(&self.path);
        run(mkfs)?;
        let dir = std::env::temp_dir().join(unique("jbdev-bench-mnt"));
        let guard = Cleanup::register(Action::Unmount(dir.clone()));
        std::fs::create_dir(&dir).map_err(io_err(format!("mkdir {}", dir.display())))?;
        let mut mount = Command::new("mount");
        mount.arg("-t").arg("ext4").arg(&self.path).arg(&dir);
        run(mount)?;
        Ok(Ext4Mount { dir, _guard: guard })
    }
}

/// Attaches a loop device to `file`; the guard (registered first) detaches it.
fn attach_loop(file: &Path, direct: bool) -> Result<(PathBuf, Cleanup)> {
    let loop_guard = Cleanup::register(Action::DetachLoopsOf(file.to_path_buf()));
    let mut cmd = Command::new("losetup");
    cmd.arg("--find").arg("--show");
    if direct {
        cmd.arg("--direct-io=on");
    }
    cmd.arg(file);
    let out = run(cmd)?;
    let dev = PathBuf::from(out.trim());
    if !dev.starts_with("/dev/") {
        return Err(BenchError::Setup(format!(
            "losetup printed {out:?} instead of a device path"
        )));
    }
    Ok((dev, loop_guard))
}

/// Median latency of 4 KiB writes at the end of the device (the kernel
/// baselines' area), QD1: `O_DIRECT` alone; `O_DIRECT` + `fdatasync` (one
/// flush); `O_DIRECT|O_SYNC` (a FUA write, which the loop driver emulates
/// as write + flush, and then the O_SYNC flush: two flushes). On the slow
/// backing the second exceeds the first by about the flush delay, the
/// third by about twice that.
pub fn probe_flush(dev: &Path, size_bytes: u64) -> Result<String> {
    const N: usize = 15;
    let off = size_bytes.saturating_sub(4096) & !4095;
    let buf = crate::pattern::pattern_buf(4096, 7);
    let mut p50 = [0.0f64; 3];
    for (slot, (osync, fdatasync)) in
        p50.iter_mut()
            .zip([(false, false), (false, true), (true, false)])
    {
        let (f, _) = open_kernel(dev, osync)?;
        let mut lat = Vec::with_capacity(N);
        for _ in 0..N {
            if cleanup::stop_requested() {
                return Err(BenchError::Interrupted);
            }
            let t0 = Instant::now();
            std::os::unix::fs::FileExt::write_all_at(&f, &buf, off)
                .map_err(io_err(format!("probe write {}", dev.display())))?;
            if fdatasync {
                f.sync_data()
                    .map_err(io_err(format!("probe fdatasync {}", dev.display())))?;
            }
            lat.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        lat.sort_by(f64::total_cmp);
        *slot = lat.get(N / 2).copied().unwrap_or_default();
    }
    Ok(format!(
        "flush probe, 4 KiB QD1 p50: O_DIRECT write {:.0} us, + fdatasync {:.0} us, O_DIRECT|O_SYNC {:.0} us",
        p50[0], p50[1], p50[2]
    ))
}

/// A mounted ext4; dropping it unmounts and removes the mount point.
#[derive(Debug)]
pub struct Ext4Mount {
    pub dir: PathBuf,
    _guard: Cleanup,
}

/// Creates `path` with `size_bytes` of real (allocated) blocks, so that
/// neither jbdev nor the kernel pays for block allocation in the host
/// filesystem during the measurement.
fn fill_file(path: &Path, size_bytes: u64, ram: bool) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(io_err(format!("create {}", path.display())))?;
    if ram {
        // tmpfs: fallocate allocates the pages without writing them.
        drop(f);
        let mut cmd = Command::new("fallocate");
        cmd.arg("-l").arg(size_bytes.to_string()).arg(path);
        run(cmd)?;
        return Ok(());
    }
    let chunk = vec![0u8; 1 << 20];
    let mut left = size_bytes;
    while left > 0 {
        if cleanup::stop_requested() {
            return Err(BenchError::Interrupted);
        }
        let n = left.min(chunk.len() as u64) as usize;
        #[allow(clippy::indexing_slicing)] // n <= chunk.len(): the min above
        let data = &chunk[..n];
        f.write_all(data)
            .map_err(io_err(format!("fill {}", path.display())))?;
        left -= n as u64;
    }
    f.sync_all()
        .map_err(io_err(format!("fsync {}", path.display())))
}

/// Signatures at fixed offsets that say a device or file holds data:
/// (offset, magic, what it is). Checked before `blkid`, so the refusal also
/// works where util-linux is missing.
const SIGNATURES: &[(usize, &[u8], &str)] = &[
    (0, b"JBDEVVOL", "a jbdev volume"),
    (1080, &[0x53, 0xEF], "an ext2/3/4 file system"),
    (0, b"XFSB", "an XFS file system"),
    (0x10040, b"_BHRfS_M", "a btrfs file system"),
    (0, b"LUKS\xba\xbe", "a LUKS container"),
    (512, b"EFI PART", "a GPT partition table"),
    (512, b"LABELONE", "an LVM physical volume"),
    (4086, b"SWAPSPACE2", "a swap area"),
    (510, &[0x55, 0xAA], "a partition table or boot sector"),
];

/// Bytes read from the start of a device to look for [`SIGNATURES`] and a
/// jbdev journal.
pub(crate) const PROBE_BYTES: usize = {
    let signatures = 0x10048;
    let journal = jbdev_volume::inspect::JOURNAL_PROBE_BYTES;
    if signatures > journal {
        signatures
    } else {
        journal
    }
};

/// What `f` visibly holds (a jbdev volume or journal, a file system, a
/// partition table ...), or `None` if neither the built-in signatures nor
/// `blkid -p` recognise anything.
pub fn existing_content(f: &mut File, path: &Path) -> Result<Option<String>> {
    let mut head = Vec::with_capacity(PROBE_BYTES);
    f.seek(SeekFrom::Start(0))
        .and_then(|_| {
            Read::by_ref(f)
                .take(PROBE_BYTES as u64)
                .read_to_end(&mut head)
        })
        .map_err(io_err(format!("read {}", path.display())))?;
    f.seek(SeekFrom::Start(0))
        .map_err(io_err(format!("seek {}", path.display())))?;
    Ok(describe_head(&head, path, true))
}

/// What a device whose first bytes are `head` visibly holds: one of the
/// known signatures (`SIGNATURES`), a jbdev journal without a volume
/// (`jbdev format` refuses it the same way), or else, for a `local` file
/// or device, what `blkid -p` finds on `path`. `None` when none of them
/// recognizes anything.
pub fn describe_head(head: &[u8], path: &Path, local: bool) -> Option<String> {
    match_signature(head)
        .map(str::to_string)
        .or_else(|| jbdev_volume::inspect::describe_journal_without_volume(head, path))
        .or_else(|| {
            local
                .then(|| blkid_type(path))
                .flatten()
                .map(|t| format!("a {t} signature (blkid)"))
        })
}

/// The first of [`SIGNATURES`] found in `head`.
fn match_signature(head: &[u8]) -> Option<&'static str> {
    SIGNATURES.iter().find_map(|&(off, magic, what)| {
        (head.get(off..off + magic.len()) == Some(magic)).then_some(what)
    })
}

/// The content type `blkid -p` reports (file systems, RAID members,
/// partition tables), if blkid is installed and finds one.
fn blkid_type(path: &Path) -> Option<String> {
    if !tool_exists("blkid") {
        return None;
    }
    let out = Command::new("blkid")
        .args(["-p", "-o", "export"])
        .arg(path)
        .output()
        .ok()?;
    // Exit status 2: nothing found.
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k).map(str::to_string))
    };
    field("TYPE=").or_else(|| field("PTTYPE=").map(|t| format!("{t} partition table")))
}

fn read_loop_dio(dev: &Path) -> Option<bool> {
    let name = dev.file_name()?.to_str()?;
    let s = std::fs::read_to_string(format!("/sys/block/{name}/loop/dio")).ok()?;
    Some(s.trim() == "1")
}

fn device_is_mounted(dev: &Path) -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return false;
    };
    let want = dev.to_string_lossy();
    mounts
        .lines()
        .any(|l| l.split_whitespace().next() == Some(want.as_ref()))
}

/// True if `tool` is on PATH (or an absolute path that exists).
pub fn tool_exists(tool: &str) -> bool {
    if tool.contains('/') {
        return Path::new(tool).exists();
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/sbin", "/usr/sbin"].iter().map(PathBuf::from))
        .any(|d| d.join(tool).is_file())
}

fn check_tool(tool: &str) -> Result<()> {
    if tool_exists(tool) {
        Ok(())
    } else {
        Err(BenchError::Setup(format!(
            "{tool} not found (Debian package util-linux/e2fsprogs); use --device PATH instead"
        )))
    }
}

/// Runs a command, returning its stdout, or a [`BenchError::Command`].
pub(crate) fn run(mut cmd: Command) -> Result<String> {
    let shown = format!("{cmd:?}").replace('"', "");
    let out = cmd.output().map_err(io_err(format!("run {shown}")))?;
    if !out.status.success() {
        return Err(BenchError::Command {
            cmd: shown,
            status: out.status.to_string(),
            stderr: first_lines(&String::from_utf8_lossy(&out.stderr), 3),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// True when loop devices can be set up here (root and losetup present).
/// The slow backing also needs [`crate::slow::fuse_available`].
pub fn loop_devices_available() -> bool {
    tool_exists("losetup")
        && Path::new("/dev/loop-control").exists()
        && std::fs::read_to_string("/proc/self/status")
            .map(|s| {
                s.lines()
                    .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
            })
            .unwrap_or(false)
}

/// The first `n` lines of a tool's output (error messages stay short).
pub(crate) fn first_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.trim().lines().collect();
    let mut out = lines
        .iter()
        .take(n)
        .copied()
        .collect::<Vec<_>>()
        .join(" | ");
    if lines.len() > n {
        out.push_str(&format!(" | ... ({} more lines)", lines.len() - n));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_found_at_their_offsets() {
        let mut head = vec![0u8; PROBE_BYTES];
        assert_eq!(match_signature(&head), None);
        head[1080..1082].copy_from_slice(&[0x53, 0xEF]);
        assert_eq!(match_signature(&head), Some("an ext2/3/4 file system"));
        head[..8].copy_from_slice(b"JBDEVVOL");
        assert_eq!(match_signature(&head), Some("a jbdev volume"));
        // A short file (smaller than every offset) is not an error.
        assert_eq!(match_signature(&[0u8; 16]), None);
        assert_eq!(match_signature(b"XFSB"), Some("an XFS file system"));
    }
}
