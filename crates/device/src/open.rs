//! Opening a path as a [`BlockDevice`], choosing the backend.

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use crate::options::{Backend, OpenOptions};
use crate::{BlockDevice, DeviceError, Result};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::{dev_major, dev_minor, flock_holders_of};
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
