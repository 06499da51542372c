//! How to open a device path: the backend and the open's options.

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
    /// Ignored (reads stay direct) on a file system not known to keep its
    /// page cache coherent with direct writes: only block devices and
    /// files on ext4, XFS, btrfs and tmpfs get it (FUSE does not).
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
