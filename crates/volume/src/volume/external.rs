//! Where an external journal is and how it is opened: the path given or
//! recorded at format time, never the home itself, never a device that
//! another holds, never shorter than the journal.

use super::*;

/// Where a volume's external journal is: `given` (`--journal`), else the
/// path recorded at format time (`path_hint`; the bool says it was that
/// one). Never the volume's own file or device.
pub(crate) fn external_journal_path(
    home: &Path,
    path_hint: &Path,
    given: Option<&Path>,
) -> Result<(PathBuf, bool)> {
    let (jp, recorded) = match given {
        Some(p) => (journal_target(home, p), false),
        None if !path_hint.as_os_str().is_empty() => (journal_target(home, path_hint), true),
        None => {
            return Err(VolumeError::InvalidArgument(
                "this volume has an external journal: give its path (--journal)".into(),
            ))
        }
    };
    refuse_same_target(home, &jp)?;
    Ok((jp, recorded))
}

/// For a journal path recorded at format time that is relative (jbdev
/// before 2026-11-27 recorded `--journal` as given): what it is resolved
/// against, to say with "nothing there" — from another directory it names
/// some other file (session 31's compatibility pass: the advice to reset
/// created a new journal in the current directory while the real, dirty
/// one sat beside the volume).
pub fn relative_recorded_journal(tried: &Path) -> Option<String> {
    if tried.is_absolute() || tried.as_os_str().is_empty() || jbdev_device::is_rbd_target(tried) {
        return None;
    }
    let cwd = std::env::current_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_else(|_| "?".into());
    Some(format!(
        "the recorded path {} is relative (an older jbdev recorded it as given to `jbdev \
         format`), so it was looked for in the current directory, {cwd}: run from the \
         directory format ran in, or give --journal PATH",
        tried.display()
    ))
}

/// Opens a volume's external journal, of `len_bytes`: `given` (`--journal`)
/// or else the path recorded at format time (`path_hint`). Returns the path
/// used, and for a regular file the descriptor to watch (see
/// [`WatchedJournal`]). A journal file shorter than the journal
/// (truncated) is refused with what is lost and what to do
/// ([`VolumeError::Truncated`]). With
/// `refuse_foreign`, so is another volume's journal
/// ([`VolumeError::WrongJournal`], before anything is scanned); an
/// inspection leaves that to its own report.
pub(crate) fn open_external_journal(
    home: &Path,
    (path_hint, uuid): (&Path, [u8; 16]),
    given: Option<&Path>,
    len_bytes: u64,
    dopts: &jbdev_device::OpenOptions,
    refuse_foreign: bool,
) -> Result<(PathBuf, Arc<dyn BlockDevice>, Option<std::fs::File>)> {
    let (jp, recorded) = external_journal_path(home, path_hint, given)?;
    let at = if recorded {
        JournalAt::Recorded(&jp)
    } else {
        JournalAt::Given(&jp)
    };
    match open_device(&jp, dopts) {
        // Another volume's journal: said before anything is scanned.
        Ok(o)
            if refuse_foreign
                && journal_uuid_of(o.device.as_ref()).is_some_and(|found| found != uuid) =>
        {
            let found = journal_uuid_of(o.device.as_ref()).unwrap_or_default();
            Err(VolumeError::WrongJournal(foreign_journal(at, found, uuid)))
        }
        // Shorter than the journal, and not this volume's journal at all:
        // the wrong --journal, not a truncated one (whose advice, a reset
        // of the journal at the recorded path, destroyed the real journal
        // in session 25's docs pass).
        Ok(o) if o.device.size_bytes() < len_bytes && !is_journal_of(o.device.as_ref(), uuid) => {
            Err(VolumeError::InvalidArgument(format!(
                "{} is not this volume's journal (it holds {} bytes, less than the journal's \
                 {len_bytes}, and no jbdev journal superblock with this volume's journal uuid \
                 {}): {}",
                jp.display(),
                o.device.size_bytes(),
                uuid::Uuid::from_bytes(uuid).hyphenated(),
                if empty_file(o.watch.as_ref()) {
                    "an empty file, as a `jbdev journal reset` cut short right after creating \
                     it leaves: run that reset again (it holds nothing to lose), or give \
                     --journal the path of this volume's own journal"
                } else if recorded {
                    "the path recorded at format time now names something else (a device \
                     renumbered after a reboot?): give --journal the path of this volume's own"
                } else {
                    "the wrong --journal?"
                }
            )))
        }
        // `watch`: a regular file, which can have been truncated.
        Ok(o) if o.watch.is_some() && o.device.size_bytes() < len_bytes => Err(
            truncated_journal_file(home, &jp, given, o.device.size_bytes(), len_bytes),
        ),
        Ok(o) if o.device.size_bytes() < len_bytes => Err(short_journal_device(
            &jp.display().to_string(),
            o.device.size_bytes(),
            len_bytes,
        )),
        Ok(o) => Ok((jp, o.device, o.watch)),
        Err(jbdev_device::DeviceError::Io { op, what, error }) if recorded => {
            // What `check` and `info` say too (session 31's docs pass).
            let lost = if let (std::io::ErrorKind::NotFound, Some(rel)) =
                (error.kind(), relative_recorded_journal(&jp))
            {
                format!("; {rel}")
            } else if error.kind() == std::io::ErrorKind::NotFound {
                format!(
                    "; if it is lost, `jbdev journal reset {}` creates a new, empty journal \
                     there and the volume is then what its home holds",
                    home.display()
                )
            } else {
                String::new()
            };
            Err(jbdev_device::DeviceError::Io {
                op,
                what: format!(
                    "{what}, the external journal's path recorded at format time \
                     (give --journal PATH if it moved{lost})"
                ),
                error,
            }
            .into())
        }
        Err(e) => Err(e.into()),
    }
}

/// Whether `dev` starts with a jbdev journal superblock whose uuid is
/// `uuid` (an unreadable or too short device is not).
pub(crate) fn is_journal_of(dev: &dyn BlockDevice, uuid: [u8; 16]) -> bool {
    journal_uuid_of(dev) == Some(uuid)
}

/// The uuid of the jbdev journal superblock `dev` starts with, if it does
/// (an unreadable or too short device does not).
pub(crate) fn journal_uuid_of(dev: &dyn BlockDevice) -> Option<[u8; 16]> {
    let n = (JournalSuperblock::ENCODED_LEN as u64).max(u64::from(dev.logical_block_size()));
    if dev.size_bytes() < n {
        return None;
    }
    let mut buf = AlignedBuf::zeroed(n as usize);
    dev.read_at(&mut buf, 0).ok()?;
    JournalSuperblock::decode(&buf).ok().map(|j| j.uuid)
}

/// An external journal device (not a file: see [`truncated_journal_file`])
/// shorter than the journal: said plainly, not as a "corrupt journal" from
/// the log's geometry check (found by an adversarial pass, session 21).
pub(crate) fn short_journal_device(what: &str, held: u64, len_bytes: u64) -> VolumeError {
    VolumeError::Truncated(format!(
        "{what} holds {held} bytes, less than this volume's {len_bytes}-byte journal: the \
         wrong device, or it shrank (a loop device set up with a smaller --sizelimit, a \
         shrunk logical volume, an RBD image shrunk with `rbd resize --allow-shrink`: grow \
         it back to {len_bytes} bytes)"
    ))
}

/// Fails when `opts` names a journal for the volume `home`, whose journal
/// is internal: refused rather than ignored, as the command line refuses
/// `--journal` there (the caller meant another volume, or another path).
pub(crate) fn refuse_unused_journal_path(home: &Path, given: Option<&Path>) -> Result<()> {
    match given {
        Some(j) => Err(VolumeError::InvalidArgument(format!(
            "a journal path ({}) was given, but the journal of {} is internal: leave it out \
             (or name the volume it belongs to)",
            j.display(),
            home.display()
        ))),
        None => Ok(()),
    }
}

/// What an external journal `journal` of the volume at `home` is opened
/// as, at format time and at every open (open, serve, info, check,
/// journal dump, journal reset): an RBD journal target that names no
/// cluster (no `conf=`, `id=`, `mon_host=`...) is put on the home's cluster,
/// with the home's options (`RbdTarget::on_cluster_of`), so that home and
/// journal are on one cluster unless the journal says otherwise. Anything
/// else (files, devices, a journal naming its cluster, a file home) as
/// given. The superblock records the journal as given at format time.
pub fn journal_target(home: &Path, journal: &Path) -> PathBuf {
    #[cfg(feature = "rbd")]
    if jbdev_device::is_rbd_target(home) && jbdev_device::is_rbd_target(journal) {
        use jbdev_device::rbd::RbdTarget;
        let parse = |p: &Path| p.to_str().and_then(|s| RbdTarget::parse(s).ok());
        if let (Some(h), Some(j)) = (parse(home), parse(journal)) {
            return PathBuf::from(j.on_cluster_of(&h).spec());
        }
    }
    let _ = home;
    journal.to_path_buf()
}

/// Fails when `journal` names the volume's own file or device (`home`):
/// an external journal there would overlap the volume (and its lock would
/// report the volume as "already open" by ourselves).
pub(crate) fn refuse_same_target(home: &Path, journal: &Path) -> Result<()> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let same = if jbdev_device::is_rbd_target(home) || jbdev_device::is_rbd_target(journal) {
        same_rbd_image(home, journal)
    } else {
        match (std::fs::metadata(home), std::fs::metadata(journal)) {
            (Ok(h), Ok(j))
                if h.file_type().is_block_device() && j.file_type().is_block_device() =>
            {
                h.rdev() == j.rdev()
            }
            (Ok(h), Ok(j)) => h.dev() == j.dev() && h.ino() == j.ino(),
            _ => false,
        }
    };
    if same {
        return Err(VolumeError::InvalidArgument(format!(
            "the journal {} is the volume's own file or device {}: an external journal \
             needs a separate one (without --journal the journal is internal)",
            journal.display(),
            home.display()
        )));
    }
    Ok(())
}

/// True if two targets, at least one an RBD target, name the same image
/// (pool and image on the same cluster, however the options are spelled).
#[cfg(feature = "rbd")]
fn same_rbd_image(a: &Path, b: &Path) -> bool {
    match (a.to_str(), b.to_str()) {
        (Some(x), Some(y)) => jbdev_device::rbd::same_image(x, y),
        _ => false,
    }
}

#[cfg(not(feature = "rbd"))]
fn same_rbd_image(a: &Path, b: &Path) -> bool {
    a == b
}

/// Whether the RBD image `p` names is missing (so that a create making it
/// may remove it again on failure). `false` when that cannot be told (a
/// missing pool, an unreachable cluster): such an image is never removed.
#[cfg(feature = "rbd")]
pub(crate) fn rbd_image_absent(p: &Path) -> bool {
    use jbdev_device::rbd::{image_exists, RbdTarget};
    p.to_str()
        .and_then(|s| RbdTarget::parse(s).ok())
        .is_some_and(|t| matches!(image_exists(&t), Ok(false)))
}

#[cfg(not(feature = "rbd"))]
pub(crate) fn rbd_image_absent(_p: &Path) -> bool {
    false
}

/// A read-only open of an RBD image another client holds (a live writer)
/// is refused, naming the holder, as a file's shared flock refuses it: a
/// replay of a journal that is being appended and checkpointed under us
/// would serve a state that never existed. Files and block devices pass.
pub(crate) fn refuse_held_rbd(p: &Path) -> Result<()> {
    #[cfg(feature = "rbd")]
    if jbdev_device::is_rbd_target(p) {
        if let Some(Ok(t)) = p.to_str().map(jbdev_device::rbd::RbdTarget::parse) {
            jbdev_device::rbd::refuse_if_held(&t)?;
        }
    }
    let _ = p;
    Ok(())
}

/// Removes what a failed create made: a file, or an RBD image.
pub(crate) fn remove_created(p: &Path) {
    #[cfg(feature = "rbd")]
    if jbdev_device::is_rbd_target(p) {
        if let Some(t) = p
            .to_str()
            .and_then(|s| jbdev_device::rbd::RbdTarget::parse(s).ok())
        {
            if let Err(e) = jbdev_device::rbd::remove_image(&t) {
                tracing::warn!(
                    "could not remove the RBD image {} this create made: {e}",
                    t.short_name()
                );
            }
        }
        return;
    }
    let _ = std::fs::remove_file(p);
}

/// The path an external journal is recorded by: absolute, so the volume
/// opens from any working directory, but with its symlinks kept (a
/// `/dev/disk/by-id/...` name must not become the `/dev/sdX` it points to
/// today); RBD targets as given. The path's raw bytes, refused (before
/// anything is written) if they do not fit the superblock's field.
pub(crate) fn journal_path_hint(p: &Path) -> Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let abs = if jbdev_device::is_rbd_target(p) {
        p.to_path_buf()
    } else {
        std::path::absolute(p).map_err(|e| {
            VolumeError::InvalidArgument(format!(
                "cannot make the journal path {} absolute: {e}",
                p.display()
            ))
        })?
    };
    let len = abs.as_os_str().as_bytes().len();
    if len > crate::superblock::MAX_PATH_HINT_LEN {
        return Err(VolumeError::InvalidArgument(format!(
            "the journal path {} is {len} bytes long once absolute; the volume superblock \
             records at most {} bytes: use a shorter path (a symlink, or a shorter \
             directory)",
            abs.display(),
            crate::superblock::MAX_PATH_HINT_LEN
        )));
    }
    Ok(abs)
}

/// The file a format of `p` would create, if any: `p` itself when nothing
/// is there, or, for a dangling symlink, the file it points to (opening
/// follows the link). None for an existing target (file, device, or a
/// symlink to one) and for RBD. A failed format removes exactly this, never
/// the symlink.
pub fn file_format_would_create(p: &Path) -> Option<PathBuf> {
    if jbdev_device::is_rbd_target(p) {
        return None;
    }
    let mut at = p.to_path_buf();
    // As many links as the kernel follows (ELOOP past 40).
    for _ in 0..40 {
        match std::fs::symlink_metadata(&at) {
            Err(_) => return Some(at),
            Ok(m) if m.file_type().is_symlink() => {
                let to = std::fs::read_link(&at).ok()?;
                at = match at.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            Ok(_) => return None,
        }
    }
    None
}

/// Whether `file` (an opened regular file) holds no bytes at all: by its
/// own length, which the device rounds down to whole sectors.
pub(crate) fn empty_file(file: Option<&std::fs::File>) -> bool {
    file.is_some_and(|f| f.metadata().is_ok_and(|m| m.len() == 0))
}
