//! jbdev's own volume superblock, in the first 512 bytes of the volume
//! (block 0). It says what the volume is and where its parts live: the
//! data region users see, and the journal (an internal region of the same
//! file or device, or a separate one named by uuid).
//!
//! Unlike the journal (big-endian, as jbd2 is), this structure is
//! **little-endian**, and its checksum is the standard crc32c (the `crc32c`
//! crate's `crc32c()`, i.e. with pre- and post-inversion) over bytes
//! `0..508`, stored in the last 4 bytes. Layout: `docs/FORMAT.md`.
//!
//! Decoding never panics, checks the magic first (so a foreign file is
//! reported as [`SuperblockError::NotAVolume`], not as corruption), then the
//! checksum (every version keeps this 512-byte frame and its crc32c at 508,
//! so a flipped version byte is damage, not a newer jbdev), the version, the
//! features and finally the geometry.

use std::os::unix::ffi::OsStrExt;

/// Bytes 0..8 of every jbdev volume.
pub const VOLUME_MAGIC: [u8; 8] = *b"JBDEVVOL";
/// The only superblock version this code reads and writes.
pub const VOLUME_VERSION: u32 = 1;
/// Incompat feature bits this version understands (none are defined yet):
/// any other bit set makes the volume unopenable.
pub const SUPPORTED_FEATURE_INCOMPAT: u32 = 0;
/// Ro-compat feature bits this version understands (none yet): any other
/// bit means the volume may only be opened read-only.
pub const SUPPORTED_FEATURE_RO_COMPAT: u32 = 0;
/// Longest external-journal path hint, in bytes (raw bytes of the path as
/// the OS gives them, not necessarily UTF-8).
pub const MAX_PATH_HINT_LEN: usize = 255;
/// Smallest and largest volume block sizes.
pub const MIN_BLOCK_SIZE: u32 = 512;
/// See [`MIN_BLOCK_SIZE`].
pub const MAX_BLOCK_SIZE: u32 = 65536;

/// Where block 0 keeps a second copy of the superblock: its second 512
/// bytes, when the volume's blocks are at least 1 KiB (since session 30;
/// older jbdev wrote zeroes there). Session 30's operator pass: one flipped
/// bit anywhere in the only copy made every command refuse the volume,
/// with its journal and data intact.
pub const BACKUP_OFFSET: usize = 512;

/// Which copy of block 0's superblock [`VolumeSuperblock::decode_block`]
/// read.
#[derive(Debug)]
pub enum SuperblockCopy {
    /// The first, at offset 0.
    Primary,
    /// The backup at [`BACKUP_OFFSET`]: the first failed, with this error.
    Backup(SuperblockError),
}

/// `journal_kind` values.
const JOURNAL_KIND_INTERNAL: u32 = 1;
const JOURNAL_KIND_EXTERNAL: u32 = 2;

/// Byte offsets of the fields (all integers little-endian).
mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const BLOCK_SIZE: usize = 12;
    pub const UUID: usize = 16;
    pub const SIZE_BYTES: usize = 32;
    pub const DATA_OFFSET_BYTES: usize = 40;
    pub const CREATED_UNIX_SECS: usize = 48;
    pub const FEATURE_COMPAT: usize = 56;
    pub const FEATURE_INCOMPAT: usize = 60;
    pub const FEATURE_RO_COMPAT: usize = 64;
    pub const JOURNAL_KIND: usize = 68;
    pub const JOURNAL_OFFSET_BYTES: usize = 72;
    pub const JOURNAL_LEN_BYTES: usize = 80;
    pub const JOURNAL_UUID: usize = 88;
    pub const PATH_HINT_LEN: usize = 104;
    pub const PATH_HINT: usize = 108;
    /// The journal session stamp (`VolumeSuperblock::journal_session`):
    /// the first 4 bytes of what was reserved before session 19.
    pub const JOURNAL_SESSION: usize = PATH_HINT + super::MAX_PATH_HINT_LEN + 1;
    /// `VolumeSuperblock::journal_session_pending` (since session 21).
    pub const JOURNAL_SESSION_PENDING: usize = JOURNAL_SESSION + 4;
    /// `VolumeSuperblock::checkpoint_sequence` (since session 21).
    pub const CHECKPOINT_SEQUENCE: usize = JOURNAL_SESSION_PENDING + 4;
    /// `VolumeSuperblock::checkpoint_mark_session` (since session 25).
    pub const CHECKPOINT_MARK_SESSION: usize = CHECKPOINT_SEQUENCE + 4;
    /// Reserved, zero when written, ignored when read.
    pub const RESERVED: usize = CHECKPOINT_MARK_SESSION + 4;
    pub const CHECKSUM: usize = 508;
}

const _: () = {
    assert!(off::VERSION == off::MAGIC + VOLUME_MAGIC.len());
    assert!(off::UUID + 16 == off::SIZE_BYTES);
    assert!(off::JOURNAL_UUID + 16 == off::PATH_HINT_LEN);
    assert!(off::PATH_HINT == off::PATH_HINT_LEN + 4);
    assert!(off::JOURNAL_SESSION == 364);
    assert!(off::RESERVED <= off::CHECKSUM);
    assert!(off::CHECKSUM + 4 == VolumeSuperblock::ENCODED_LEN);
    // The superblock fits in one sector and so in block 0 of any volume.
    assert!(VolumeSuperblock::ENCODED_LEN <= MIN_BLOCK_SIZE as usize);
};

/// Where a volume's journal lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JournalLocation {
    /// A region of the volume's own file or device.
    Internal {
        /// Byte offset of the region (block-aligned; the engine puts it at
        /// block 1, right after this superblock).
        offset_bytes: u64,
        /// Region length in bytes (a multiple of the block size).
        len_bytes: u64,
    },
    /// A separate file or device, identified by the jbd2 uuid in its
    /// journal superblock.
    External {
        /// The journal's uuid (`s_uuid` of its jbd2 superblock).
        uuid: [u8; 16],
        /// Journal length in bytes (a multiple of the block size).
        len_bytes: u64,
        /// Where it was at format time; a hint only, the uuid decides.
        /// At most [`MAX_PATH_HINT_LEN`] bytes (the path's raw bytes, any
        /// encoding), no NUL; empty if none was recorded.
        path_hint: std::path::PathBuf,
    },
}

/// The volume superblock. See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeSuperblock {
    /// The volume's uuid.
    pub uuid: [u8; 16],
    /// Block size in bytes: the unit of journaling and of alignment of
    /// every region. A power of two in 512..=65536 (the journal itself
    /// needs at least 1024, jbd2's superblock size).
    pub block_size: u32,
    /// Size of the data region, i.e. what users see, in bytes.
    pub size_bytes: u64,
    /// Byte offset of the data region in the volume's file or device.
    pub data_offset_bytes: u64,
    /// Where the journal lives.
    pub journal: JournalLocation,
    /// Features an older reader may ignore.
    pub feature_compat: u32,
    /// Features an older reader must refuse.
    pub feature_incompat: u32,
    /// Features an older reader may only read.
    pub feature_ro_compat: u32,
    /// Format time, seconds since the Unix epoch.
    pub created_unix_secs: u64,
    /// The journal session of the last read-write open (each one takes the
    /// next number and writes it into the journal's superblock first, then
    /// here): a journal whose log still needs replay but carries an older
    /// session than this was restored from a backup, and replaying it
    /// would bring back old data. 0: never opened by a jbdev that stamps
    /// (the check is skipped).
    pub journal_session: u32,
    /// The session a read-write open is about to stamp into the journal,
    /// written here (flushed) before the journal's stamp, and equal to
    /// [`VolumeSuperblock::journal_session`] once the open has stamped both.
    /// A journal stamped ahead of `journal_session` is an open interrupted
    /// between the two stamps only if it carries this number; any other
    /// stamp ahead means this home is older than the journal (restored from
    /// a copy) or the journal was used by another copy of this volume. 0:
    /// not written (a jbdev before session 21; the check is then lenient).
    pub journal_session_pending: u32,
    /// The journal sequence of the newest transaction the checkpoint has
    /// made durable at home (rewritten, in the same flush as its home
    /// writes, before the journal's tail moves past it). A journal whose
    /// log needs replay and ends before this transaction is an old copy of
    /// the journal (taken earlier in the same session, where the session
    /// stamps cannot tell): replaying it would roll home blocks back. 0:
    /// none recorded (a jbdev before session 21, or a journal reset since).
    pub checkpoint_sequence: u32,
    /// The `journal_session` of the read-write open that set
    /// `checkpoint_sequence` to the transaction before the journal's log
    /// (everything older is home: checkpointed, or replayed by that open).
    /// While it equals `journal_session`, the mark never falls behind the
    /// log: a log starting more than one transaction after it means this
    /// home is older than its journal (a snapshot or copy of the home alone
    /// put back). 0: not set (a jbdev before session 25; its superblock
    /// writes zero these bytes, and a journal reset clears it).
    pub checkpoint_mark_session: u32,
}

/// What is wrong with a volume superblock.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SuperblockError {
    /// The buffer does not start with [`VOLUME_MAGIC`].
    #[error("not a jbdev volume (no JBDEVVOL magic at offset 0)")]
    NotAVolume,
    /// Written by a newer (or older, incompatible) jbdev.
    #[error(
        "unsupported volume superblock version {0} (this jbdev reads version {VOLUME_VERSION})"
    )]
    UnsupportedVersion(u32),
    /// The superblock is damaged.
    #[error(
        "volume superblock checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
    )]
    BadChecksum {
        /// Checksum found in the last 4 bytes.
        stored: u32,
        /// Checksum of bytes 0..508.
        computed: u32,
    },
    /// Incompat features this jbdev does not know (the unknown bits).
    #[error("volume uses unsupported incompat features {0:#x}")]
    UnsupportedFeatures(u32),
    /// A field is out of range or regions overlap.
    #[error("invalid volume superblock: {0}")]
    Invalid(String),
}

fn invalid<T>(msg: impl std::fmt::Display) -> Result<T, SuperblockError> {
    Err(SuperblockError::Invalid(msg.to_string()))
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from(get_u32(b, at)) | (u64::from(get_u32(b, at + 4)) << 32)
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_uuid(b: &[u8], at: usize) -> [u8; 16] {
    let mut u = [0u8; 16];
    u.copy_from_slice(&b[at..at + 16]);
    u
}

impl VolumeSuperblock {
    /// The uuid this volume's journal superblock must carry: the volume's
    /// own for an internal journal, the one recorded for an external one.
    /// A journal with another is some other volume's.
    pub fn journal_uuid(&self) -> [u8; 16] {
        match &self.journal {
            JournalLocation::External { uuid, .. } => *uuid,
            JournalLocation::Internal { .. } => self.uuid,
        }
    }

    /// The checkpoint mark, if one is recorded: `checkpoint_sequence`, or
    /// `None` when both it and `checkpoint_mark_session` are 0 (a jbdev
    /// before session 21, or a journal reset since). A sequence of 0 with
    /// the session set is a mark like any other: transaction 0 once the
    /// journal's sequence has wrapped past 2^32, or the one before a fresh
    /// journal's first (session 32's limits pass: taken for "none", it let
    /// an old copy of the journal ending before transaction 0 replay over
    /// newer home blocks).
    pub fn checkpoint_mark(&self) -> Option<u32> {
        (self.checkpoint_sequence != 0 || self.checkpoint_mark_session != 0)
            .then_some(self.checkpoint_sequence)
    }

    /// Encoded size: one 512-byte sector, so it is written atomically on
    /// every device jbdev supports.
    pub const ENCODED_LEN: usize = 512;

    /// The checksum of an encoded superblock: standard crc32c of bytes
    /// `0..508`. Returns 0 for a buffer shorter than [`Self::ENCODED_LEN`].
    pub fn checksum_of(buf: &[u8]) -> u32 {
        match buf.get(..off::CHECKSUM) {
            // IMPORTANT: standard crc32c (inverted in and out), bytes 0..508.
            Some(covered) if buf.len() >= Self::ENCODED_LEN => crc32c::crc32c(covered),
            _ => 0,
        }
    }

    /// Writes the superblock into the first [`Self::ENCODED_LEN`] bytes of
    /// `buf` (zero-padded), checksum in the last 4 of them. Bytes of `buf`
    /// past 512 are not touched.
    ///
    /// Fields are written as they are, even if [`Self::validate`] would
    /// reject them, so tests can build invalid images.
    ///
    /// # Panics
    /// If `buf` is shorter than 512 bytes or an external journal's path hint
    /// is longer than [`MAX_PATH_HINT_LEN`] bytes (programming errors).
    pub fn encode(&self, buf: &mut [u8]) {
        assert!(
            buf.len() >= Self::ENCODED_LEN,
            "volume superblock needs {} bytes, got {}",
            Self::ENCODED_LEN,
            buf.len()
        );
        let b = &mut buf[..Self::ENCODED_LEN];
        b.fill(0);
        b[off::MAGIC..off::MAGIC + 8].copy_from_slice(&VOLUME_MAGIC);
        put_u32(b, off::VERSION, VOLUME_VERSION);
        put_u32(b, off::BLOCK_SIZE, self.block_size);
        b[off::UUID..off::UUID + 16].copy_from_slice(&self.uuid);
        put_u64(b, off::SIZE_BYTES, self.size_bytes);
        put_u64(b, off::DATA_OFFSET_BYTES, self.data_offset_bytes);
        put_u64(b, off::CREATED_UNIX_SECS, self.created_unix_secs);
        put_u32(b, off::JOURNAL_SESSION, self.journal_session);
        put_u32(
            b,
            off::JOURNAL_SESSION_PENDING,
            self.journal_session_pending,
        );
        put_u32(b, off::CHECKPOINT_SEQUENCE, self.checkpoint_sequence);
        put_u32(
            b,
            off::CHECKPOINT_MARK_SESSION,
            self.checkpoint_mark_session,
        );
        put_u32(b, off::FEATURE_COMPAT, self.feature_compat);
        put_u32(b, off::FEATURE_INCOMPAT, self.feature_incompat);
        put_u32(b, off::FEATURE_RO_COMPAT, self.feature_ro_compat);
        match &self.journal {
            JournalLocation::Internal {
                offset_bytes,
                len_bytes,
            } => {
                put_u32(b, off::JOURNAL_KIND, JOURNAL_KIND_INTERNAL);
                put_u64(b, off::JOURNAL_OFFSET_BYTES, *offset_bytes);
                put_u64(b, off::JOURNAL_LEN_BYTES, *len_bytes);
            }
            JournalLocation::External {
                uuid,
                len_bytes,
                path_hint,
            } => {
                let hint = path_hint.as_os_str().as_bytes();
                assert!(
                    hint.len() <= MAX_PATH_HINT_LEN,
                    "journal path hint of {} bytes (at most {MAX_PATH_HINT_LEN})",
                    hint.len()
                );
                put_u32(b, off::JOURNAL_KIND, JOURNAL_KIND_EXTERNAL);
                put_u64(b, off::JOURNAL_LEN_BYTES, *len_bytes);
                b[off::JOURNAL_UUID..off::JOURNAL_UUID + 16].copy_from_slice(uuid);
                put_u32(b, off::PATH_HINT_LEN, hint.len() as u32);
                b[off::PATH_HINT..off::PATH_HINT + hint.len()].copy_from_slice(hint);
            }
        }
        // IMPORTANT: checksum last, over the final bytes 0..508.
        let csum = Self::checksum_of(b);
        put_u32(b, off::CHECKSUM, csum);
    }

    /// Writes block 0 of the volume into `block` (the whole block, which
    /// must be at least [`Self::ENCODED_LEN`] bytes): the superblock, and
    /// when the block has room for it the backup copy at
    /// [`BACKUP_OFFSET`]; zeroes elsewhere. One write of the block puts
    /// both copies down, and a torn one leaves at least one whole copy
    /// where the device's sectors are 512 bytes.
    pub fn encode_block(&self, block: &mut [u8]) {
        block.fill(0);
        self.encode(block);
        if block.len() >= BACKUP_OFFSET + Self::ENCODED_LEN {
            let (first, rest) = block.split_at_mut(BACKUP_OFFSET);
            rest[..Self::ENCODED_LEN].copy_from_slice(&first[..Self::ENCODED_LEN]);
        }
    }

    /// Reads the superblock from block 0 (`block`: its first bytes, at
    /// least 512): the first copy, or, if that one is damaged, the backup
    /// at [`BACKUP_OFFSET`] if it is there and verifies. Damaged means a
    /// bad checksum, or no magic where the rest of the sector is zero (a
    /// lost sector) or is the backup's (a damaged magic); a first sector
    /// holding something else — a partition table or another file
    /// system's superblock written over an old volume — is what it says,
    /// and the volume is gone (session 30's verify pass: the fallback took
    /// such a volume, and its first write went over the partition table).
    /// The error is the first copy's, unless the backup is intact but
    /// written by a newer jbdev.
    pub fn decode_block(block: &[u8]) -> Result<(Self, SuperblockCopy), SuperblockError> {
        let first = match Self::decode(block) {
            Ok(sb) => return Ok((sb, SuperblockCopy::Primary)),
            Err(e @ (SuperblockError::NotAVolume | SuperblockError::BadChecksum { .. })) => e,
            Err(e) => return Err(e),
        };
        let Some(backup) = block.get(BACKUP_OFFSET..BACKUP_OFFSET + Self::ENCODED_LEN) else {
            return Err(first);
        };
        if matches!(first, SuperblockError::NotAVolume) {
            let rest = &block[VOLUME_MAGIC.len()..Self::ENCODED_LEN];
            let lost = block[..Self::ENCODED_LEN].iter().all(|&b| b == 0);
            if !lost && rest != &backup[VOLUME_MAGIC.len()..] {
                return Err(first);
            }
        }
        match Self::decode(backup) {
            // Only a volume whose block 0 holds the backup has one (with
            // 512-byte blocks, these bytes are block 1's).
            Ok(sb) if sb.block_size as usize >= BACKUP_OFFSET + Self::ENCODED_LEN => {
                Ok((sb, SuperblockCopy::Backup(first)))
            }
            Err(
                e @ (SuperblockError::UnsupportedVersion(_)
                | SuperblockError::UnsupportedFeatures(_)),
            ) => Err(e),
            _ => Err(first),
        }
    }

    /// Reads and validates a superblock from the start of `buf`.
    pub fn decode(buf: &[u8]) -> Result<Self, SuperblockError> {
        if buf.get(..VOLUME_MAGIC.len()) != Some(&VOLUME_MAGIC[..]) {
            return Err(SuperblockError::NotAVolume);
        }
        let Some(b) = buf.get(..Self::ENCODED_LEN) else {
            return invalid(format_args!(
                "volume superblock truncated to {} bytes (needs {})",
                buf.len(),
                Self::ENCODED_LEN
            ));
        };
        let stored = get_u32(b, off::CHECKSUM);
        let computed = Self::checksum_of(b);
        if stored != computed {
            return Err(SuperblockError::BadChecksum { stored, computed });
        }
        let version = get_u32(b, off::VERSION);
        if version != VOLUME_VERSION {
            return Err(SuperblockError::UnsupportedVersion(version));
        }
        let feature_incompat = get_u32(b, off::FEATURE_INCOMPAT);
        let unknown = feature_incompat & !SUPPORTED_FEATURE_INCOMPAT;
        if unknown != 0 {
            return Err(SuperblockError::UnsupportedFeatures(unknown));
        }
        let journal = match get_u32(b, off::JOURNAL_KIND) {
            JOURNAL_KIND_INTERNAL => JournalLocation::Internal {
                offset_bytes: get_u64(b, off::JOURNAL_OFFSET_BYTES),
                len_bytes: get_u64(b, off::JOURNAL_LEN_BYTES),
            },
            JOURNAL_KIND_EXTERNAL => {
                let hint_len = get_u32(b, off::PATH_HINT_LEN) as usize;
                if hint_len > MAX_PATH_HINT_LEN {
                    return invalid(format_args!(
                        "journal path hint of {hint_len} bytes (at most {MAX_PATH_HINT_LEN})"
                    ));
                }
                // Raw bytes: a path need not be UTF-8 (Unix paths are bytes).
                let hint = &b[off::PATH_HINT..off::PATH_HINT + hint_len];
                JournalLocation::External {
                    uuid: get_uuid(b, off::JOURNAL_UUID),
                    len_bytes: get_u64(b, off::JOURNAL_LEN_BYTES),
                    path_hint: std::ffi::OsStr::from_bytes(hint).into(),
                }
            }
            other => return invalid(format_args!("unknown journal kind {other}")),
        };
        let sb = Self {
            uuid: get_uuid(b, off::UUID),
            block_size: get_u32(b, off::BLOCK_SIZE),
            size_bytes: get_u64(b, off::SIZE_BYTES),
            data_offset_bytes: get_u64(b, off::DATA_OFFSET_BYTES),
            journal,
            feature_compat: get_u32(b, off::FEATURE_COMPAT),
            feature_incompat,
            feature_ro_compat: get_u32(b, off::FEATURE_RO_COMPAT),
            created_unix_secs: get_u64(b, off::CREATED_UNIX_SECS),
            journal_session: get_u32(b, off::JOURNAL_SESSION),
            journal_session_pending: get_u32(b, off::JOURNAL_SESSION_PENDING),
            checkpoint_sequence: get_u32(b, off::CHECKPOINT_SEQUENCE),
            checkpoint_mark_session: get_u32(b, off::CHECKPOINT_MARK_SESSION),
        };
        sb.validate()?;
        Ok(sb)
    }

    /// Ro-compat feature bits this jbdev does not know: non-zero means the
    /// volume must be opened read-only.
    pub fn unknown_ro_compat(&self) -> u32 {
        self.feature_ro_compat & !SUPPORTED_FEATURE_RO_COMPAT
    }

    /// The geometry checks [`Self::decode`] applies: block size a power of
    /// two in 512..=65536; every offset and length a multiple of it and
    /// non-zero where a region must exist; block 0 left to the superblock;
    /// no region overflowing u64; the internal journal and the data region
    /// disjoint; a path hint without NUL bytes.
    pub fn validate(&self) -> Result<(), SuperblockError> {
        let bs = u64::from(self.block_size);
        if !self.block_size.is_power_of_two()
            || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&self.block_size)
        {
            return invalid(format_args!(
                "block size {} (power of two, {MIN_BLOCK_SIZE}..={MAX_BLOCK_SIZE})",
                self.block_size
            ));
        }
        let region = |what: &str, start: u64, len: u64| -> Result<(u64, u64), SuperblockError> {
            if len == 0 || !start.is_multiple_of(bs) || !len.is_multiple_of(bs) {
                return invalid(format_args!(
                    "{what} at {start}+{len} bytes is empty or not aligned to {bs}-byte blocks"
                ));
            }
            if start < bs {
                return invalid(format_args!(
                    "{what} at {start} overlaps the superblock in block 0"
                ));
            }
            match start.checked_add(len) {
                Some(end) => Ok((start, end)),
                None => invalid(format_args!("{what} at {start}+{len} overflows")),
            }
        };
        let data = region("data region", self.data_offset_bytes, self.size_bytes)?;
        match &self.journal {
            JournalLocation::Internal {
                offset_bytes,
                len_bytes,
            } => {
                let journal = region("internal journal", *offset_bytes, *len_bytes)?;
                if journal.0 < data.1 && data.0 < journal.1 {
                    return invalid(format_args!(
                        "internal journal {}..{} overlaps data region {}..{}",
                        journal.0, journal.1, data.0, data.1
                    ));
                }
            }
            JournalLocation::External {
                len_bytes,
                path_hint,
                ..
            } => {
                if *len_bytes == 0 || !len_bytes.is_multiple_of(bs) {
                    return invalid(format_args!(
                        "external journal of {len_bytes} bytes is empty or not a multiple of {bs}"
                    ));
                }
                let hint = path_hint.as_os_str().as_bytes();
                if hint.len() > MAX_PATH_HINT_LEN || hint.contains(&0) {
                    return invalid("journal path hint too long or contains NUL");
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn internal(bs: u32) -> VolumeSuperblock {
        let bs64 = u64::from(bs);
        VolumeSuperblock {
            uuid: *b"volume-uuid-0001",
            block_size: bs,
            size_bytes: 1000 * bs64,
            data_offset_bytes: 257 * bs64,
            journal: JournalLocation::Internal {
                offset_bytes: bs64,
                len_bytes: 256 * bs64,
            },
            feature_compat: 0,
            feature_incompat: 0,
            feature_ro_compat: 0,
            created_unix_secs: 1_763_000_000,
            journal_session: 0,
            journal_session_pending: 0,
            checkpoint_sequence: 0,
            checkpoint_mark_session: 0,
        }
    }

    fn external() -> VolumeSuperblock {
        VolumeSuperblock {
            journal: JournalLocation::External {
                uuid: *b"journal-uuid-001",
                len_bytes: 1 << 20,
                path_hint: "/dev/disk/by-id/nvme-fast".into(),
            },
            data_offset_bytes: 4096,
            ..internal(4096)
        }
    }

    /// Block 0 holds the superblock twice; either copy alone is enough,
    /// and damage to both is the first copy's error. Session 30's
    /// operator pass: one flipped bit in the reserved bytes of the only
    /// copy made every command refuse the volume.
    #[test]
    fn block_0_decodes_from_either_copy() {
        let sb = external();
        let mut block = vec![0xee; 4096];
        sb.encode_block(&mut block);
        assert!(block[1024..].iter().all(|&b| b == 0));
        assert_eq!(block[..512], block[512..1024]);
        let (back, copy) = VolumeSuperblock::decode_block(&block).unwrap();
        assert_eq!(back, sb);
        assert!(matches!(copy, SuperblockCopy::Primary));

        // The first copy flipped in its reserved bytes or its magic, or
        // its sector lost.
        for damage in [400usize, 0, 508, 3] {
            let mut b = block.clone();
            if damage == 0 {
                b[..512].fill(0);
            } else {
                b[damage] ^= 0x10;
            }
            let (back, copy) = VolumeSuperblock::decode_block(&b).unwrap();
            assert_eq!(back, sb, "damage at {damage}");
            assert!(matches!(copy, SuperblockCopy::Backup(_)), "{copy:?}");
        }
        // Something else written over the first sector (a DOS partition
        // table over an old volume): not a volume, whatever the backup.
        let mut b = block.clone();
        b[..512].fill(0);
        b[446] = 0x80;
        b[450] = 0x83;
        b[510] = 0x55;
        b[511] = 0xaa;
        assert!(matches!(
            VolumeSuperblock::decode_block(&b),
            Err(SuperblockError::NotAVolume)
        ));
        // The backup alone damaged: the first copy, as ever.
        let mut b = block.clone();
        b[600] ^= 1;
        assert!(matches!(
            VolumeSuperblock::decode_block(&b).unwrap().1,
            SuperblockCopy::Primary
        ));
        // Both: the first copy's error.
        b[400] ^= 1;
        assert!(matches!(
            VolumeSuperblock::decode_block(&b),
            Err(SuperblockError::BadChecksum { .. })
        ));
        // Only 512 bytes read: no backup to fall back on.
        let mut b = block.clone();
        b[400] ^= 1;
        assert!(VolumeSuperblock::decode_block(&b[..512]).is_err());
        // A version this jbdev does not read in an intact backup is said
        // as such, not as damage.
        let mut b = block.clone();
        b[..512].fill(0);
        put_u32(&mut b[512..1024], off::VERSION, VOLUME_VERSION + 1);
        let csum = VolumeSuperblock::checksum_of(&b[512..1024]);
        put_u32(&mut b[512..1024], off::CHECKSUM, csum);
        assert!(matches!(
            VolumeSuperblock::decode_block(&b),
            Err(SuperblockError::UnsupportedVersion(_))
        ));
        // 512-byte blocks have no room for a backup in block 0: bytes
        // 512.. are block 1's, never read as a superblock.
        let small = VolumeSuperblock {
            block_size: 512,
            data_offset_bytes: 512,
            ..external()
        };
        let mut b = vec![0u8; 512];
        small.encode_block(&mut b);
        let mut two = b.clone();
        two.extend_from_slice(&b);
        two[400] ^= 1;
        assert!(VolumeSuperblock::decode_block(&two).is_err());
    }

    fn encoded(sb: &VolumeSuperblock) -> Vec<u8> {
        let mut buf = vec![0xee; 4096];
        sb.encode(&mut buf);
        buf
    }

    #[test]
    fn round_trip_both_journal_kinds() {
        for sb in [internal(4096), internal(512), internal(65536), external()] {
            let buf = encoded(&sb);
            assert_eq!(VolumeSuperblock::decode(&buf).unwrap(), sb);
            assert_eq!(VolumeSuperblock::decode(&buf[..512]).unwrap(), sb);
            // Only the first 512 bytes are written.
            assert!(buf[512..].iter().all(|&b| b == 0xee));
        }
    }

    /// A path hint is the path's raw bytes: a non-UTF-8 path (Unix paths
    /// are bytes) comes back exactly, not with U+FFFD in it.
    #[test]
    fn a_non_utf8_path_hint_round_trips_byte_for_byte() {
        let raw: &[u8] = b"/srv/j\xff\xfe-journal";
        let mut sb = external();
        if let JournalLocation::External { path_hint, .. } = &mut sb.journal {
            *path_hint = std::ffi::OsStr::from_bytes(raw).into();
        }
        let back = VolumeSuperblock::decode(&encoded(&sb)).unwrap();
        let JournalLocation::External { path_hint, .. } = &back.journal else {
            panic!("external journal expected")
        };
        assert_eq!(path_hint.as_os_str().as_bytes(), raw);
        assert_eq!(back, sb);
    }

    #[test]
    fn layout_is_little_endian_with_checksum_last() {
        let buf = encoded(&internal(4096));
        assert_eq!(&buf[..8], b"JBDEVVOL");
        assert_eq!(&buf[8..12], &[1, 0, 0, 0]);
        assert_eq!(&buf[12..16], &4096u32.to_le_bytes());
        assert_eq!(&buf[68..72], &[1, 0, 0, 0]);
        assert_eq!(&buf[72..80], &4096u64.to_le_bytes());
        assert_eq!(&buf[508..512], &crc32c::crc32c(&buf[..508]).to_le_bytes());
    }

    #[test]
    fn error_kinds() {
        assert!(matches!(
            VolumeSuperblock::decode(&[0u8; 512]),
            Err(SuperblockError::NotAVolume)
        ));
        assert!(matches!(
            VolumeSuperblock::decode(b"JBDEV"),
            Err(SuperblockError::NotAVolume)
        ));
        let buf = encoded(&internal(4096));
        assert!(matches!(
            VolumeSuperblock::decode(&buf[..511]),
            Err(SuperblockError::Invalid(_))
        ));
        // A newer version (checksummed as written) is named as such; a
        // version byte flipped by damage is a checksum error.
        let mut b = buf.clone();
        b[8] = 2;
        assert!(matches!(
            VolumeSuperblock::decode(&b),
            Err(SuperblockError::BadChecksum { .. })
        ));
        let c = VolumeSuperblock::checksum_of(&b);
        b[508..512].copy_from_slice(&c.to_le_bytes());
        assert!(matches!(
            VolumeSuperblock::decode(&b),
            Err(SuperblockError::UnsupportedVersion(2))
        ));
        let mut b = buf.clone();
        b[33] ^= 0x10;
        assert!(matches!(
            VolumeSuperblock::decode(&b),
            Err(SuperblockError::BadChecksum { .. })
        ));
        let mut sb = internal(4096);
        sb.feature_incompat = 0x4;
        assert!(matches!(
            VolumeSuperblock::decode(&encoded(&sb)),
            Err(SuperblockError::UnsupportedFeatures(0x4))
        ));
        // Unknown ro_compat bits decode, and are reported.
        sb.feature_incompat = 0;
        sb.feature_ro_compat = 0x8;
        let back = VolumeSuperblock::decode(&encoded(&sb)).unwrap();
        assert_eq!(back.unknown_ro_compat(), 0x8);
    }

    #[test]
    fn geometry_checks() {
        let bad = |f: &dyn Fn(&mut VolumeSuperblock)| {
            let mut sb = internal(4096);
            f(&mut sb);
            matches!(
                VolumeSuperblock::decode(&encoded(&sb)),
                Err(SuperblockError::Invalid(_))
            )
        };
        assert!(bad(&|s| s.block_size = 3000));
        assert!(bad(&|s| s.block_size = 256));
        assert!(bad(&|s| s.block_size = 131072));
        assert!(bad(&|s| s.size_bytes = 0));
        assert!(bad(&|s| s.size_bytes += 1));
        assert!(bad(&|s| s.data_offset_bytes = 0));
        assert!(bad(&|s| s.data_offset_bytes = 4096 * 100)); // overlaps journal
        assert!(bad(&|s| s.data_offset_bytes = u64::MAX - 4095));
        assert!(bad(&|s| s.journal = JournalLocation::Internal {
            offset_bytes: 0,
            len_bytes: 4096
        }));
        assert!(bad(&|s| s.journal = JournalLocation::Internal {
            offset_bytes: 4096,
            len_bytes: 0
        }));
        assert!(bad(&|s| s.journal = JournalLocation::External {
            uuid: [0; 16],
            len_bytes: 100,
            path_hint: std::path::PathBuf::new()
        }));
        assert!(bad(&|s| s.journal = JournalLocation::External {
            uuid: [0; 16],
            len_bytes: 4096,
            path_hint: std::ffi::OsStr::from_bytes(b"a\0b").into()
        }));
        // Data before the journal is fine too.
        let mut sb = internal(4096);
        sb.data_offset_bytes = 4096;
        sb.journal = JournalLocation::Internal {
            offset_bytes: 4096 * 1001,
            len_bytes: 4096 * 8,
        };
        assert_eq!(VolumeSuperblock::decode(&encoded(&sb)).unwrap(), sb);
        // Unknown journal kind.
        let mut buf = encoded(&internal(4096));
        buf[68] = 3;
        let csum = crc32c::crc32c(&buf[..508]);
        buf[508..512].copy_from_slice(&csum.to_le_bytes());
        assert!(matches!(
            VolumeSuperblock::decode(&buf),
            Err(SuperblockError::Invalid(_))
        ));
    }

    fn valid_superblock() -> impl Strategy<Value = VolumeSuperblock> {
        (
            9u32..=16,
            any::<[u8; 16]>(),
            (1u64..1 << 30, 1u64..1 << 20, any::<bool>()),
            any::<(u32, u32, u64, (u32, u32, u32, u32))>(),
            prop::option::of(("[a-zA-Z0-9/._ é-]{0,80}", any::<[u8; 16]>())),
        )
            .prop_map(
                |(
                    shift,
                    uuid,
                    (data_blocks, journal_blocks, data_first),
                    (compat, ro, created, (session, pending, checkpointed, mark_session)),
                    ext,
                )| {
                    let bs = 1u64 << shift;
                    let (data_offset_bytes, journal) = match ext {
                        Some((path_hint, juuid)) => (
                            bs,
                            JournalLocation::External {
                                uuid: juuid,
                                len_bytes: journal_blocks * bs,
                                path_hint: path_hint.into(),
                            },
                        ),
                        None if data_first => (
                            bs,
                            JournalLocation::Internal {
                                offset_bytes: bs * (1 + data_blocks),
                                len_bytes: journal_blocks * bs,
                            },
                        ),
                        None => (
                            bs * (1 + journal_blocks),
                            JournalLocation::Internal {
                                offset_bytes: bs,
                                len_bytes: journal_blocks * bs,
                            },
                        ),
                    };
                    VolumeSuperblock {
                        uuid,
                        block_size: bs as u32,
                        size_bytes: data_blocks * bs,
                        data_offset_bytes,
                        journal,
                        feature_compat: compat,
                        feature_incompat: 0,
                        feature_ro_compat: ro,
                        created_unix_secs: created,
                        journal_session: session,
                        journal_session_pending: pending,
                        checkpoint_sequence: checkpointed,
                        checkpoint_mark_session: mark_session,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn prop_round_trip(sb in valid_superblock()) {
            let mut buf = [0u8; 512];
            sb.encode(&mut buf);
            prop_assert_eq!(VolumeSuperblock::decode(&buf).unwrap(), sb);
        }

        #[test]
        fn prop_bit_flip_detected(sb in valid_superblock(), bit in 0usize..512 * 8) {
            let mut buf = [0u8; 512];
            sb.encode(&mut buf);
            buf[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(VolumeSuperblock::decode(&buf).is_err());
        }

        #[test]
        fn prop_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..1024), fix in any::<bool>()) {
            let mut bytes = bytes;
            // Half the time make magic, version and checksum right so the
            // field checks behind them run on arbitrary values.
            if fix && bytes.len() >= 512 {
                bytes[..8].copy_from_slice(&VOLUME_MAGIC);
                bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
                bytes[60..64].fill(0);
                let csum = crc32c::crc32c(&bytes[..508]);
                bytes[508..512].copy_from_slice(&csum.to_le_bytes());
            }
            if let Ok(sb) = VolumeSuperblock::decode(&bytes) {
                let mut again = [0u8; 512];
                sb.encode(&mut again);
                prop_assert_eq!(VolumeSuperblock::decode(&again).unwrap(), sb);
            }
        }
    }
}
