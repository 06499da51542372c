//! Read-only access to a volume's superblocks and journal, for `jbdev info`,
//! `check` and `journal dump`. Nothing here writes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use jbdev_device::{open_device, AlignedBuf, BlockDevice};
use jbdev_journal::format::JournalSuperblock;
use jbdev_journal::JournalRegion;

use crate::superblock::{JournalLocation, VolumeSuperblock};
use crate::Result;

/// A volume opened for inspection.
pub struct Inspection {
    pub path: PathBuf,
    pub device: Arc<dyn BlockDevice>,
    pub superblock: VolumeSuperblock,
    /// Why the first copy of the volume superblock could not be used, when
    /// `superblock` is its backup (FORMAT.md, "Backup copy").
    pub superblock_damage: Option<String>,
    pub journal_path: Option<PathBuf>,
    pub region: JournalRegion,
    /// The jbd2 superblock, or why it could not be read.
    pub journal_superblock: std::result::Result<JournalSuperblock, JournalSuperblockError>,
}

/// Why an [`Inspection`]'s journal superblock could not be read.
#[derive(Debug, Clone)]
pub struct JournalSuperblockError {
    /// The error's text ("journal superblock: ...").
    pub message: String,
    /// The superblock is intact (its checksum held) but sets feature bits
    /// this jbdev does not know: a newer jbdev's journal, not damage.
    pub newer: bool,
}

/// A volume whose external journal could not be opened (a deleted or
/// truncated file, a dead device): what can still be read of it.
#[derive(Debug)]
pub struct JournalUnavailable {
    /// The volume's superblock (read and checked).
    pub superblock: VolumeSuperblock,
    /// The journal path tried: `--journal`, or the one recorded at format
    /// time (`None` when neither exists).
    pub journal_path: Option<PathBuf>,
    /// Nothing is there: no file, device or RBD image at `journal_path`.
    pub missing: bool,
    /// Why it could not be opened.
    pub error: crate::VolumeError,
}

/// Opens `path` read-only (shared lock: fails with a clear error while a
/// writer has the volume open) and reads both superblocks.
pub fn inspect(path: &Path, journal_path: Option<&Path>) -> Result<Inspection> {
    inspect_volume(path, journal_path)?.map_err(|u| u.error)
}

/// [`inspect`], except that a volume whose external journal cannot be
/// opened is not an error but a [`JournalUnavailable`]: its superblock is
/// still there to show (`jbdev info`), and what to do depends on why.
pub fn inspect_volume(
    path: &Path,
    journal_path: Option<&Path>,
) -> Result<std::result::Result<Inspection, JournalUnavailable>> {
    let dopts = jbdev_device::OpenOptions {
        read_only: true,
        ..Default::default()
    };
    let device = open_device(path, &dopts)?.device;
    let (superblock, copy) =
        crate::volume::read_volume_superblock_copy(device.as_ref(), &path.display().to_string())?;
    let superblock_damage = match copy {
        crate::superblock::SuperblockCopy::Primary => None,
        crate::superblock::SuperblockCopy::Backup(e) => Some(e.to_string()),
    };
    let bs = superblock.block_size;
    let (jdev, joff, jlen, jpath) = match &superblock.journal {
        JournalLocation::Internal {
            offset_bytes,
            len_bytes,
        } => (device.clone(), *offset_bytes, *len_bytes, None),
        JournalLocation::External {
            len_bytes,
            path_hint,
            uuid,
        } => {
            match crate::volume::open_external_journal(
                path,
                (path_hint, *uuid),
                journal_path,
                *len_bytes,
                &dopts,
                false,
            ) {
                Ok((jp, jdev, _)) => (jdev, 0, *len_bytes, Some(jp)),
                Err(error) => {
                    let tried = journal_path
                        .map(Path::to_path_buf)
                        .or_else(|| (!path_hint.as_os_str().is_empty()).then(|| path_hint.clone()))
                        .map(|j| crate::volume::journal_target(path, &j));
                    // Missing: the open found nothing there. For an RBD
                    // journal only the image open says that: an ENOENT
                    // from reading the Ceph config (no such conf file) or
                    // from the pool is not a missing journal (found by a
                    // new-user pass: `info` said "MISSING" and pointed at
                    // `journal reset` when only the config was missing).
                    let missing = matches!(
                        &error,
                        crate::VolumeError::Device(jbdev_device::DeviceError::Io { op, error, .. })
                            if error.kind() == std::io::ErrorKind::NotFound
                                && tried.as_deref().is_some_and(|t| {
                                    !jbdev_device::is_rbd_target(t) || *op == "rbd_open"
                                })
                    );
                    return Ok(Err(JournalUnavailable {
                        superblock,
                        journal_path: tried,
                        missing,
                        error,
                    }));
                }
            }
        }
    };
    let region = crate::volume::journal_region_at(jdev, joff, jlen, bs)?;
    let journal_superblock = region
        .read_superblock()
        .map_err(|e| JournalSuperblockError {
            newer: matches!(
                e,
                jbdev_journal::JournalError::Superblock(
                    jbdev_journal::format::FormatError::NewerFeatures(_)
                )
            ),
            message: e.to_string(),
        });
    Ok(Ok(Inspection {
        path: path.to_path_buf(),
        device,
        superblock,
        superblock_damage,
        journal_path: jpath,
        region,
        journal_superblock,
    }))
}

/// [`inspect`] for `check` and `journal dump`, which read the journal: an
/// RBD volume another client holds open (a live writer) is refused too,
/// naming the holder, as a file volume is by its shared lock — its journal
/// changes under the reader, and a check of it would report corruption
/// that is not there. `inspect` itself lets `info` read a held RBD
/// volume's superblocks.
pub fn inspect_unshared(path: &Path, journal_path: Option<&Path>) -> Result<Inspection> {
    inspect_volume_unshared(path, journal_path)?.map_err(|u| u.error)
}

/// [`inspect_volume`] with the refusal of [`inspect_unshared`].
pub fn inspect_volume_unshared(
    path: &Path,
    journal_path: Option<&Path>,
) -> Result<std::result::Result<Inspection, JournalUnavailable>> {
    crate::volume::refuse_held_rbd(path)?;
    inspect_volume(path, journal_path)
}

impl Inspection {
    /// Reads one journal block (`InvalidArgument` past the journal's end).
    pub fn read_journal_block(&self, pos: u32) -> Result<AlignedBuf> {
        if pos >= self.region.len_blocks() {
            return Err(crate::VolumeError::InvalidArgument(format!(
                "journal block {pos} is past the end of the {}-block journal",
                self.region.len_blocks()
            )));
        }
        let mut buf = AlignedBuf::zeroed(self.superblock.block_size as usize);
        self.region.read_blocks(pos, &mut buf)?;
        Ok(buf)
    }
}

/// A jbdev journal superblock in `head` (the first bytes of a device or
/// file) where no volume superblock is: at offset 0 (an external journal)
/// or one block in, for any block size (an internal journal whose volume
/// superblock is gone). Returns its offset and the superblock. `None` when
/// `head` starts with a volume superblock's magic (a volume's own internal
/// journal is not "a journal without a volume").
pub fn find_journal_superblock(head: &[u8]) -> Option<(usize, JournalSuperblock)> {
    if head.starts_with(&crate::superblock::VOLUME_MAGIC) {
        return None;
    }
    std::iter::once(0)
        .chain((10..=16).map(|shift| 1usize << shift))
        .find_map(|off| {
            let j = JournalSuperblock::decode(head.get(off..)?).ok()?;
            Some((off, j))
        })
}

/// Bytes from the start of a device that [`find_journal_superblock`] needs
/// to see every place it looks (a journal superblock 64 KiB in).
pub const JOURNAL_PROBE_BYTES: usize = (1 << 16) + JournalSuperblock::ENCODED_LEN;

/// A journal superblock's state, in words.
pub fn journal_state(j: &JournalSuperblock) -> String {
    if j.is_clean() {
        format!("clean, next transaction {}", j.sequence)
    } else {
        format!(
            "needs recovery: log starts at block {} with transaction {}",
            j.start, j.sequence
        )
    }
}

/// What a device whose first bytes are `head` holds when that is a jbdev
/// journal without a volume ([`find_journal_superblock`]), in words for a
/// command that refuses to overwrite it: "a jbdev journal (uuid …, needs
/// recovery: …)", or for a journal one block in, why it may still hold a
/// volume's data (`path` is named in the advice).
pub fn describe_journal_without_volume(head: &[u8], path: &Path) -> Option<String> {
    let (off, j) = find_journal_superblock(head)?;
    let what = format!(
        "a jbdev journal (uuid {}, {})",
        uuid::Uuid::from_bytes(j.uuid).hyphenated(),
        journal_state(&j)
    );
    Some(if off == 0 {
        what
    } else {
        // IMPORTANT: never taken for an interrupted format. A volume whose
        // block 0 was lost looks the same, and its journal cannot say
        // whether data was written (writes of direct_write_threshold bytes
        // and more go home without a transaction).
        format!(
            "{what} but no volume superblock: an interrupted format, or a volume whose first \
             block was lost — `jbdev check {}` tells which journal it is; its data may still \
             be there",
            path.display()
        )
    })
}
