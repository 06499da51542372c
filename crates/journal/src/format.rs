//! jbd2 on-disk structures: the journal superblock, descriptor blocks with
//! `journal_block_tag3_t` tags, commit blocks, revoke blocks, data-block
//! checksums and escaping.
//!
//! Everything here is **big-endian**, as jbd2 is, and follows the layout of
//! the Linux kernel's `include/linux/jbd2.h` with the feature set
//! `INCOMPAT_REVOKE | INCOMPAT_64BIT | INCOMPAT_CSUM_V3`, so that e2fsprogs
//! (`debugfs logdump`, `e2fsck`) can read a jbdev journal. The byte layouts
//! are tabulated in `docs/FORMAT.md`.
//!
//! Checksums are crc32c in the Linux convention (no pre- or post-inversion,
//! see [`crc32c_raw`]). Every metadata block is seeded with the journal's
//! `csum_seed` (crc32c of the journal uuid), so a block written for another
//! journal never verifies here.
//!
//! Invariants every decoder keeps: it never panics on any input, never reads
//! outside the block it is given, verifies the checksum before it trusts any
//! length or count field, and only returns values that the matching encoder
//! can write back (`decode(encode(decode(b)?)) == decode(b)?`).

use std::fmt;

/// `h_magic` of every jbd2 metadata block: the first 4 bytes of /dev/random.
pub const JBD2_MAGIC: u32 = 0xc03b_3998;

/// `h_blocktype`: descriptor block (tags for the data blocks that follow).
pub const BLOCKTYPE_DESCRIPTOR: u32 = 1;
/// `h_blocktype`: commit block (ends a transaction).
pub const BLOCKTYPE_COMMIT: u32 = 2;
/// `h_blocktype`: version-1 superblock (not supported by jbdev).
pub const BLOCKTYPE_SUPERBLOCK_V1: u32 = 3;
/// `h_blocktype`: version-2 superblock.
pub const BLOCKTYPE_SUPERBLOCK_V2: u32 = 4;
/// `h_blocktype`: revoke block.
pub const BLOCKTYPE_REVOKE: u32 = 5;

/// `s_feature_compat`: checksum v1 (a crc32 over the whole transaction in
/// the commit block). Mutually exclusive with CSUM_V2/V3; jbdev rejects it.
pub const FEATURE_COMPAT_CHECKSUM: u32 = 0x1;

/// `s_feature_incompat`: revoke blocks may appear in the log.
pub const FEATURE_INCOMPAT_REVOKE: u32 = 0x1;
/// `s_feature_incompat`: block numbers are 64 bits (tags carry
/// `t_blocknr_high`, revoke records are 8 bytes).
pub const FEATURE_INCOMPAT_64BIT: u32 = 0x2;
/// `s_feature_incompat`: commit blocks are written without waiting for the
/// data blocks (not used by jbdev).
pub const FEATURE_INCOMPAT_ASYNC_COMMIT: u32 = 0x4;
/// `s_feature_incompat`: checksum v2 (16-bit tag checksums; superseded).
pub const FEATURE_INCOMPAT_CSUM_V2: u32 = 0x8;
/// `s_feature_incompat`: checksum v3 (`journal_block_tag3_t`, full 32-bit
/// data-block checksums, tail checksums on descriptor and revoke blocks).
pub const FEATURE_INCOMPAT_CSUM_V3: u32 = 0x10;
/// `s_feature_incompat`: ext4 fast commits (not used by jbdev).
pub const FEATURE_INCOMPAT_FAST_COMMIT: u32 = 0x20;

/// The incompat features jbdev writes, and the only set it accepts: every
/// one of them is required, any other bit makes the journal unsupported.
pub const JBDEV_INCOMPAT: u32 =
    FEATURE_INCOMPAT_REVOKE | FEATURE_INCOMPAT_64BIT | FEATURE_INCOMPAT_CSUM_V3;

/// Tag flag: the data block began with [`JBD2_MAGIC`] and was escaped (its
/// first 4 bytes are zero in the journal and must be restored on replay).
pub const TAG_FLAG_ESCAPE: u32 = 1;
/// Tag flag: no uuid follows this tag (it is the same as the previous one).
pub const TAG_FLAG_SAME_UUID: u32 = 2;
/// Tag flag: the block was deleted by this transaction (never replayed).
pub const TAG_FLAG_DELETED: u32 = 4;
/// Tag flag: the last tag of this descriptor block.
pub const TAG_FLAG_LAST_TAG: u32 = 8;
/// Flags a caller may set in [`BlockTag::flags`]; the encoder manages the
/// others.
pub const TAG_FLAGS_CALLER: u32 = TAG_FLAG_ESCAPE | TAG_FLAG_DELETED;
const TAG_FLAGS_KNOWN: u32 =
    TAG_FLAG_ESCAPE | TAG_FLAG_SAME_UUID | TAG_FLAG_DELETED | TAG_FLAG_LAST_TAG;

/// `s_checksum_type` for crc32c, the only type CSUM_V3 allows.
pub const CHECKSUM_TYPE_CRC32C: u8 = 4;

/// Smallest journal block size: the v2 superblock is 1024 bytes and must
/// fit in block 0.
pub const MIN_BLOCK_SIZE: usize = 1024;
/// Largest journal block size jbdev accepts (ext4's largest block size).
pub const MAX_BLOCK_SIZE: usize = 65536;
/// Most entries in `s_users`.
pub const MAX_USERS: usize = 48;

/// `journal_header_t`: magic, blocktype, sequence.
pub const HEADER_LEN: usize = 12;
/// `journal_block_tag3_t`.
pub const TAG_LEN: usize = 16;
/// A uuid, as stored after the first tag of a descriptor and in `s_uuid`.
pub const UUID_LEN: usize = 16;
/// `jbd2_journal_block_tail` / `jbd2_journal_revoke_tail`.
pub const TAIL_LEN: usize = 4;
/// `jbd2_journal_revoke_header_t`: header plus `r_count`.
pub const REVOKE_HEADER_LEN: usize = 16;
/// One 64-bit revoke record (INCOMPAT_64BIT).
pub const REVOKE_RECORD_LEN: usize = 8;
/// `struct commit_header` up to and including `h_commit_nsec`.
pub const COMMIT_HEADER_LEN: usize = 60;

/// Byte offsets in `journal_superblock_t` (jbd2.h).
mod sb {
    pub const MAGIC: usize = 0x00;
    pub const BLOCKTYPE: usize = 0x04;
    pub const SEQUENCE_HDR: usize = 0x08;
    pub const BLOCKSIZE: usize = 0x0C;
    pub const MAXLEN: usize = 0x10;
    pub const FIRST: usize = 0x14;
    pub const SEQUENCE: usize = 0x18;
    pub const START: usize = 0x1C;
    pub const ERRNO: usize = 0x20;
    pub const FEATURE_COMPAT: usize = 0x24;
    pub const FEATURE_INCOMPAT: usize = 0x28;
    pub const FEATURE_RO_COMPAT: usize = 0x2C;
    pub const UUID: usize = 0x30;
    pub const NR_USERS: usize = 0x40;
    pub const DYNSUPER: usize = 0x44;
    pub const MAX_TRANSACTION: usize = 0x48;
    pub const MAX_TRANS_DATA: usize = 0x4C;
    pub const CHECKSUM_TYPE: usize = 0x50;
    /// `s_num_fc_blks` (fast commit; left zero by jbdev).
    pub const NUM_FC_BLKS: usize = 0x54;
    /// `s_head` (kernel ≥ 6.3; left zero by jbdev).
    pub const HEAD: usize = 0x58;
    /// jbdev: commits that may be in flight at once in the live log
    /// (`s_padding[0]`; jbd2 tools ignore it). 0 means 1.
    pub const PIPELINE_DEPTH: usize = 0x5C;
    /// jbdev: the session stamp of the last read-write open
    /// (`s_padding[1]`; jbd2 tools ignore it). 0: none.
    pub const SESSION: usize = 0x60;
    /// jbdev: identity of the home file of the last read-write open
    /// (`s_padding[2..4]`, big-endian u64; jbd2 tools ignore it). 0: none.
    pub const HOME_ID: usize = 0x64;
    /// jbdev: crc32c of the home's canonical path at that open
    /// (`s_padding[4]`). 0: none.
    pub const HOME_PATH_ID: usize = 0x6C;
    pub const CHECKSUM: usize = 0xFC;
    pub const USERS: usize = 0x100;
    pub const END: usize = 0x400;
}

/// Byte offsets in `struct commit_header` (jbd2.h).
mod commit {
    pub const CHKSUM_TYPE: usize = 12;
    pub const CHKSUM_SIZE: usize = 13;
    /// `h_chksum[0]`; `h_chksum[1..4]` carry the data digest (see
    /// `writer`), `h_chksum[4]` the overlap, `h_chksum[5..8]` stay zero.
    pub const CHKSUM0: usize = 16;
    /// `h_chksum[4]`: jbdev's commit overlap (see [`super::CommitBlock::overlap`]).
    pub const OVERLAP: usize = 32;
    pub const COMMIT_SEC: usize = 48;
    pub const COMMIT_NSEC: usize = 56;
}

/// Byte offsets in `journal_block_tag3_t` (jbd2.h).
mod tag {
    pub const BLOCKNR: usize = 0;
    pub const FLAGS: usize = 4;
    pub const BLOCKNR_HIGH: usize = 8;
    pub const CHECKSUM: usize = 12;
}

/// `r_count` in `jbd2_journal_revoke_header_t`.
const REVOKE_COUNT_OFF: usize = 12;

// Compile-time checks that the offsets above describe jbd2's layout: a typo
// here would silently produce journals no other tool can read.
const _: () = {
    assert!(HEADER_LEN == 3 * 4);
    assert!(sb::BLOCKSIZE == HEADER_LEN);
    assert!(sb::UUID + UUID_LEN == sb::NR_USERS);
    assert!(sb::DYNSUPER == sb::NR_USERS + 4);
    assert!(sb::CHECKSUM_TYPE == sb::MAX_TRANS_DATA + 4);
    assert!(sb::NUM_FC_BLKS == sb::CHECKSUM_TYPE + 4);
    // s_padding[40] lies between s_head and s_checksum.
    assert!(sb::CHECKSUM == sb::HEAD + 4 + 40 * 4);
    assert!(sb::USERS == sb::CHECKSUM + 4);
    assert!(sb::END == sb::USERS + UUID_LEN * MAX_USERS);
    assert!(sb::END == JournalSuperblock::ENCODED_LEN);
    assert!(sb::MAGIC == 0 && sb::BLOCKTYPE == 4 && sb::SEQUENCE_HDR == 8);
    assert!(tag::CHECKSUM + 4 == TAG_LEN);
    assert!(tag::FLAGS == 4 && tag::BLOCKNR == 0 && tag::BLOCKNR_HIGH == 8);
    // commit_header: header, 4 bytes of type/size/padding, 8 x be32 h_chksum,
    // then be64 h_commit_sec and be32 h_commit_nsec.
    assert!(commit::CHKSUM_TYPE == HEADER_LEN && commit::CHKSUM_SIZE == HEADER_LEN + 1);
    assert!(commit::CHKSUM0 == HEADER_LEN + 4);
    assert!(commit::COMMIT_SEC == commit::CHKSUM0 + 8 * 4);
    assert!(commit::COMMIT_NSEC == commit::COMMIT_SEC + 8);
    assert!(COMMIT_HEADER_LEN == commit::COMMIT_NSEC + 4);
    assert!(REVOKE_HEADER_LEN == REVOKE_COUNT_OFF + 4);
    // The smallest block holds a descriptor with one tag, a revoke record,
    // a commit header and the superblock.
    assert!(HEADER_LEN + TAG_LEN + UUID_LEN + TAIL_LEN <= MIN_BLOCK_SIZE);
    assert!(REVOKE_HEADER_LEN + REVOKE_RECORD_LEN + TAIL_LEN <= MIN_BLOCK_SIZE);
    assert!(JournalSuperblock::ENCODED_LEN <= MIN_BLOCK_SIZE);
};

/// What went wrong decoding a jbd2 structure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// The block does not start with [`JBD2_MAGIC`].
    #[error("bad jbd2 magic {found:#010x} (expected {JBD2_MAGIC:#010x})")]
    BadMagic {
        /// The big-endian u32 found at offset 0.
        found: u32,
    },
    /// The block is a jbd2 block of another type.
    #[error("unexpected jbd2 block type {found} (expected {expected})")]
    BadBlockType {
        /// The type the caller asked to decode.
        expected: u32,
        /// `h_blocktype` as found.
        found: u32,
    },
    /// A stored checksum does not match the block's contents.
    #[error("bad {what} checksum: stored {stored:#010x}, computed {computed:#010x}")]
    BadChecksum {
        /// Which structure: "journal superblock", "descriptor block", ...
        what: &'static str,
        /// The checksum found in the block.
        stored: u32,
        /// The checksum computed over the block.
        computed: u32,
    },
    /// A well-formed journal that uses features jbdev does not implement.
    #[error("unsupported journal: {0}")]
    Unsupported(String),
    /// An intact journal superblock (its checksum held) that sets feature
    /// bits this jbdev does not know: written by a newer jbdev (or another
    /// program), not damage.
    #[error("unsupported journal: {0}")]
    NewerFeatures(String),
    /// A field is out of range or inconsistent (or the buffer has a size no
    /// journal block can have).
    #[error("invalid journal structure: {0}")]
    Invalid(String),
}

/// Shorthand for an [`FormatError::Invalid`] result.
fn invalid<T>(msg: impl fmt::Display) -> Result<T, FormatError> {
    Err(FormatError::Invalid(msg.to_string()))
}

// ---------------------------------------------------------------------------
// Checksums
// ---------------------------------------------------------------------------

/// crc32c (Castagnoli) in the Linux kernel's convention: `seed` is the
/// running CRC register and no inversion is applied on the way in or out.
/// This is the kernel's `crc32c(seed, data, len)` and e2fsprogs'
/// `ext2fs_crc32c_le`, which jbd2's `jbd2_chksum` wraps.
///
/// The `crc32c` crate implements the "standard" CRC (inverted before and
/// after), so `crc32c_append(c, d) == !crc32c_raw(!c, d)`; this undoes both
/// inversions.
pub fn crc32c_raw(seed: u32, data: &[u8]) -> u32 {
    // IMPORTANT: the double inversion is what makes this the kernel's
    // register-in/register-out update; without it no checksum matches jbd2.
    !crc32c::crc32c_append(!seed, data)
}

/// `crc32c_raw(seed, zeros(len))`, without a buffer of that size.
pub fn crc32c_raw_zeros(mut crc: u32, mut len: usize) -> u32 {
    const ZEROS: [u8; 4096] = [0; 4096];
    while len > 0 {
        let n = len.min(ZEROS.len());
        crc = crc32c_raw(crc, &ZEROS[..n]);
        len -= n;
    }
    crc
}

/// `crc32c_raw(seed, a ++ zeros(zero_len) ++ b)`, without copying: used to
/// checksum a block "with its checksum field set to 0".
fn crc32c_raw_with_zeros(seed: u32, before: &[u8], zero_len: usize, after: &[u8]) -> u32 {
    let crc = crc32c_raw(seed, before);
    let crc = crc32c_raw_zeros(crc, zero_len);
    crc32c_raw(crc, after)
}

/// jbd2's `j_csum_seed`: the checksum of the journal uuid, which seeds every
/// descriptor, commit, revoke and data-block checksum.
pub fn csum_seed(uuid: &[u8; 16]) -> u32 {
    // IMPORTANT: seeded with !0, as jbd2 does in load_superblock.
    crc32c_raw(!0, uuid)
}

/// Checksum of a descriptor or revoke block: crc32c seeded with
/// `csum_seed` over the whole block with its last 4 bytes (the tail
/// checksum) taken as zero. Returns 0 for a block shorter than the tail.
pub fn block_tail_checksum(csum_seed: u32, block: &[u8]) -> u32 {
    let Some(tail_off) = block.len().checked_sub(TAIL_LEN) else {
        return 0;
    };
    // IMPORTANT: covers the whole block, tail zeroed (jbd2_descriptor_block_csum_set).
    crc32c_raw_with_zeros(csum_seed, &block[..tail_off], TAIL_LEN, &[])
}

/// Checksum of a commit block: crc32c seeded with `csum_seed` over the whole
/// block with `h_chksum[0]` taken as zero. Returns 0 for a block shorter
/// than the commit header.
pub fn commit_block_checksum(csum_seed: u32, block: &[u8]) -> u32 {
    if block.len() < COMMIT_HEADER_LEN {
        return 0;
    }
    // IMPORTANT: covers the whole block, h_chksum[0] zeroed (jbd2_commit_block_csum_set).
    crc32c_raw_with_zeros(
        csum_seed,
        &block[..commit::CHKSUM0],
        4,
        &block[commit::CHKSUM0 + 4..],
    )
}

/// Checksum of a data block logged in transaction `sequence`, as stored in
/// its tag: crc32c seeded with `csum_seed`, over the big-endian sequence
/// number and then the block **as written in the journal** (escaped).
pub fn data_block_checksum(csum_seed: u32, sequence: u32, journal_block: &[u8]) -> u32 {
    // IMPORTANT: sequence first, then the escaped block (jbd2_block_tag_csum_set).
    let crc = crc32c_raw(csum_seed, &sequence.to_be_bytes());
    crc32c_raw(crc, journal_block)
}

// ---------------------------------------------------------------------------
// Byte helpers. Callers check lengths first; these index directly so that a
// wrong offset is a loud bug in tests, not a silent zero.
// ---------------------------------------------------------------------------

fn get_be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn get_be64(b: &[u8], off: usize) -> u64 {
    (u64::from(get_be32(b, off)) << 32) | u64::from(get_be32(b, off + 4))
}

fn put_be32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

fn put_be64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_be_bytes());
}

/// Whether `len` is a journal block size jbdev reads and writes.
pub fn is_valid_block_size(len: usize) -> bool {
    len.is_power_of_two() && (MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&len)
}

fn check_block_len(len: usize) -> Result<(), FormatError> {
    if is_valid_block_size(len) {
        Ok(())
    } else {
        invalid(format_args!(
            "{len} bytes is not a journal block size (power of two, {MIN_BLOCK_SIZE}..={MAX_BLOCK_SIZE})"
        ))
    }
}

fn assert_block_len(len: usize) {
    assert!(
        is_valid_block_size(len),
        "journal block of {len} bytes: must be a power of two in {MIN_BLOCK_SIZE}..={MAX_BLOCK_SIZE}"
    );
}

/// Checks magic and block type of a metadata block; `block` must hold at
/// least [`HEADER_LEN`] bytes.
fn check_header(block: &[u8], expected_type: u32) -> Result<Header, FormatError> {
    let magic = get_be32(block, 0);
    if magic != JBD2_MAGIC {
        return Err(FormatError::BadMagic { found: magic });
    }
    let block_type = get_be32(block, 4);
    if block_type != expected_type {
        return Err(FormatError::BadBlockType {
            expected: expected_type,
            found: block_type,
        });
    }
    Ok(Header {
        block_type,
        sequence: get_be32(block, 8),
    })
}

fn put_header(block: &mut [u8], block_type: u32, sequence: u32) {
    put_be32(block, 0, JBD2_MAGIC);
    put_be32(block, 4, block_type);
    put_be32(block, 8, sequence);
}

// ---------------------------------------------------------------------------
// Header
// ---------------------------------------------------------------------------

/// `journal_header_t`: the first 12 bytes of every jbd2 metadata block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// `h_blocktype`, one of the `BLOCKTYPE_*` constants (not checked here).
    pub block_type: u32,
    /// `h_sequence`: the transaction (tid) the block belongs to.
    pub sequence: u32,
}

/// The header of a journal block, or `None` if the block is shorter than a
/// header or does not begin with [`JBD2_MAGIC`] (a data block, an escaped
/// data block, or the end of the log). Checks nothing else.
pub fn read_header(block: &[u8]) -> Option<Header> {
    if block.len() < HEADER_LEN || get_be32(block, 0) != JBD2_MAGIC {
        return None;
    }
    Some(Header {
        block_type: get_be32(block, 4),
        sequence: get_be32(block, 8),
    })
}

// ---------------------------------------------------------------------------
// Superblock
// ---------------------------------------------------------------------------

/// `journal_superblock_t`, version 2, in block 0 of the journal.
///
/// `start == 0` is the clean marker: the log holds nothing to replay. When
/// `start != 0`, recovery begins at block `start` expecting transaction
/// `sequence`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalSuperblock {
    /// `s_blocksize`: journal block size in bytes.
    pub block_size: u32,
    /// `s_maxlen`: journal length in blocks, superblock included.
    pub max_len: u32,
    /// `s_first`: first block of the circular log (1: right after the
    /// superblock).
    pub first: u32,
    /// `s_sequence`: first transaction id expected in the log.
    pub sequence: u32,
    /// `s_start`: block where the log starts; 0 when the journal is clean.
    pub start: u32,
    /// `s_errno`: non-zero after the journal was aborted.
    pub errno: i32,
    /// `s_feature_compat`.
    pub feature_compat: u32,
    /// `s_feature_incompat`.
    pub feature_incompat: u32,
    /// `s_feature_ro_compat`.
    pub feature_ro_compat: u32,
    /// `s_uuid`: the journal's uuid; seeds every checksum.
    pub uuid: [u8; 16],
    /// `s_nr_users`: number of filesystems (volumes) sharing the journal.
    pub nr_users: u32,
    /// `s_max_transaction`: limit of journal blocks per transaction (0: none).
    pub max_transaction: u32,
    /// `s_max_trans_data`: limit of data blocks per transaction (0: none).
    pub max_trans_data: u32,
    /// `s_users`: uuids of the users, at most [`MAX_USERS`]. Decoding yields
    /// exactly `nr_users` entries.
    pub users: Vec<[u8; 16]>,
    /// jbdev: how many commits the session writing the live log may have
    /// had in flight at once (at least 1). Recovery needs it to tell a torn
    /// tail from damage in the middle: transaction S + depth is only
    /// written once S is durable.
    pub pipeline_depth: u32,
    /// jbdev: the session of the last read-write open of the volume, also
    /// stamped into its volume superblock (after this one). A log that
    /// needs replay but carries an older session than the volume's is a
    /// journal restored from a backup. 0: none (a journal written before
    /// session stamps, or by a jbdev without them).
    pub session: u32,
    /// jbdev: which home file last opened the volume read-write (a hash of
    /// its device and inode numbers), so a copy of the home does not
    /// replay, and so empty, the original's journal through the path both
    /// record (session 23). 0: not known (a block device, an RBD image, a
    /// journal written before it was recorded).
    pub home_id: u64,
    /// jbdev: which path that home was opened by (crc32c of its canonical
    /// form, at least 1), so a volume restored in place (a new file at the
    /// same path) is still taken for itself. 0: not known.
    pub home_path_id: u32,
}

impl JournalSuperblock {
    /// The `s_uuid` a block that starts with the superblock's magic names,
    /// whether or not the rest of it passes [`JournalSuperblock::decode`]
    /// (a damaged superblock may still say whose journal it was); None
    /// without the magic or for an all-zero uuid.
    pub fn claimed_uuid(block: &[u8]) -> Option<[u8; 16]> {
        let magic = block.get(sb::MAGIC..sb::MAGIC + 4)?;
        let uuid: [u8; 16] = block.get(sb::UUID..sb::UUID + 16)?.try_into().ok()?;
        (magic == JBD2_MAGIC.to_be_bytes() && uuid != [0; 16]).then_some(uuid)
    }

    /// `sizeof(journal_superblock_t)`; also the span the checksum covers.
    pub const ENCODED_LEN: usize = 1024;

    /// A fresh, clean superblock for a journal of `max_len` blocks of
    /// `block_size` bytes, with jbdev's feature set.
    pub fn new(block_size: u32, max_len: u32, uuid: [u8; 16]) -> Self {
        Self {
            block_size,
            max_len,
            first: 1,
            sequence: 1,
            start: 0,
            errno: 0,
            feature_compat: 0,
            feature_incompat: JBDEV_INCOMPAT,
            feature_ro_compat: 0,
            uuid,
            nr_users: 1,
            max_transaction: 0,
            max_trans_data: 0,
            users: vec![uuid],
            pipeline_depth: 1,
            session: 0,
            home_id: 0,
            home_path_id: 0,
        }
    }

    /// The checksum seed of this journal ([`csum_seed`] of its uuid).
    pub fn csum_seed(&self) -> u32 {
        csum_seed(&self.uuid)
    }

    /// Whether the journal was closed cleanly (nothing to replay).
    pub fn is_clean(&self) -> bool {
        self.start == 0
    }

    /// The checksum of a superblock image: crc32c seeded with `!0` over the
    /// first 1024 bytes with `s_checksum` taken as zero. Returns 0 when
    /// `block` is shorter than 1024 bytes.
    pub fn checksum_of(block: &[u8]) -> u32 {
        if block.len() < Self::ENCODED_LEN {
            return 0;
        }
        // IMPORTANT: seed !0 (not the uuid seed), 1024 bytes, s_checksum zeroed.
        crc32c_raw_with_zeros(
            !0,
            &block[..sb::CHECKSUM],
            4,
            &block[sb::CHECKSUM + 4..sb::END],
        )
    }

    /// Writes the superblock into `block`, zero-filling all of it, with
    /// `s_checksum_type = crc32c` and a valid `s_checksum`.
    ///
    /// # Panics
    /// If `block` is shorter than [`Self::ENCODED_LEN`] or `users` has more
    /// than [`MAX_USERS`] entries (programming errors, not disk contents).
    pub fn encode(&self, block: &mut [u8]) {
        assert!(
            block.len() >= Self::ENCODED_LEN,
            "journal superblock needs {} bytes, got {}",
            Self::ENCODED_LEN,
            block.len()
        );
        assert!(
            self.users.len() <= MAX_USERS,
            "at most {MAX_USERS} journal users, got {}",
            self.users.len()
        );
        block.fill(0);
        put_header(block, BLOCKTYPE_SUPERBLOCK_V2, 0);
        put_be32(block, sb::BLOCKSIZE, self.block_size);
        put_be32(block, sb::MAXLEN, self.max_len);
        put_be32(block, sb::FIRST, self.first);
        put_be32(block, sb::SEQUENCE, self.sequence);
        put_be32(block, sb::START, self.start);
        put_be32(block, sb::ERRNO, self.errno as u32);
        put_be32(block, sb::FEATURE_COMPAT, self.feature_compat);
        put_be32(block, sb::FEATURE_INCOMPAT, self.feature_incompat);
        put_be32(block, sb::FEATURE_RO_COMPAT, self.feature_ro_compat);
        block[sb::UUID..sb::UUID + UUID_LEN].copy_from_slice(&self.uuid);
        put_be32(block, sb::NR_USERS, self.nr_users);
        put_be32(block, sb::MAX_TRANSACTION, self.max_transaction);
        put_be32(block, sb::MAX_TRANS_DATA, self.max_trans_data);
        put_be32(block, sb::PIPELINE_DEPTH, self.pipeline_depth.max(1));
        put_be32(block, sb::SESSION, self.session);
        put_be32(block, sb::HOME_ID, (self.home_id >> 32) as u32);
        put_be32(block, sb::HOME_ID + 4, self.home_id as u32);
        put_be32(block, sb::HOME_PATH_ID, self.home_path_id);
        block[sb::CHECKSUM_TYPE] = CHECKSUM_TYPE_CRC32C;
        for (i, user) in self.users.iter().enumerate() {
            let off = sb::USERS + i * UUID_LEN;
            block[off..off + UUID_LEN].copy_from_slice(user);
        }
        // IMPORTANT: checksum last, over the final image with s_checksum = 0.
        let csum = Self::checksum_of(block);
        put_be32(block, sb::CHECKSUM, csum);
    }

    /// Reads and validates a superblock from the start of `block`.
    ///
    /// Checks, in order: magic, block type (v2), that the journal is
    /// checksummed with CSUM_V3 and crc32c, the checksum, the feature set
    /// (exactly [`JBDEV_INCOMPAT`]; no ro_compat bits; no compat checksum
    /// v1), then the geometry.
    pub fn decode(block: &[u8]) -> Result<Self, FormatError> {
        if block.len() < Self::ENCODED_LEN {
            return invalid(format_args!(
                "journal superblock needs {} bytes, got {}",
                Self::ENCODED_LEN,
                block.len()
            ));
        }
        if let Err(e) = check_header(block, BLOCKTYPE_SUPERBLOCK_V2) {
            return Err(match e {
                FormatError::BadBlockType {
                    found: BLOCKTYPE_SUPERBLOCK_V1,
                    ..
                } => FormatError::Unsupported("version-1 journal superblock".into()),
                other => other,
            });
        }
        let incompat = get_be32(block, sb::FEATURE_INCOMPAT);
        // Without CSUM_V3 there is no checksum to verify, and the tag layout
        // differs: refuse before trusting anything else.
        if incompat & FEATURE_INCOMPAT_CSUM_V3 == 0 || incompat & FEATURE_INCOMPAT_CSUM_V2 != 0 {
            return Err(FormatError::Unsupported(format!(
                "journal is not checksummed with CSUM_V3 (incompat features {incompat:#x})"
            )));
        }
        let checksum_type = block[sb::CHECKSUM_TYPE];
        if checksum_type != CHECKSUM_TYPE_CRC32C {
            return Err(FormatError::Unsupported(format!(
                "journal checksum type {checksum_type} (only crc32c = {CHECKSUM_TYPE_CRC32C})"
            )));
        }
        let stored = get_be32(block, sb::CHECKSUM);
        let computed = Self::checksum_of(block);
        if stored != computed {
            return Err(FormatError::BadChecksum {
                what: "journal superblock",
                stored,
                computed,
            });
        }

        let unknown = incompat & !JBDEV_INCOMPAT;
        if unknown != 0 {
            return Err(FormatError::NewerFeatures(format!(
                "journal incompat features {unknown:#x}"
            )));
        }
        let missing = JBDEV_INCOMPAT & !incompat;
        if missing != 0 {
            return Err(FormatError::Unsupported(format!(
                "journal lacks required incompat features {missing:#x}"
            )));
        }
        let ro_compat = get_be32(block, sb::FEATURE_RO_COMPAT);
        if ro_compat != 0 {
            return Err(FormatError::NewerFeatures(format!(
                "journal ro_compat features {ro_compat:#x}"
            )));
        }
        let compat = get_be32(block, sb::FEATURE_COMPAT);
        if compat & FEATURE_COMPAT_CHECKSUM != 0 {
            return invalid("checksum v1 (compat) together with CSUM_V3");
        }

        let block_size = get_be32(block, sb::BLOCKSIZE);
        if !is_valid_block_size(block_size as usize) {
            return invalid(format_args!("journal block size {block_size}"));
        }
        let max_len = get_be32(block, sb::MAXLEN);
        let first = get_be32(block, sb::FIRST);
        // The log needs at least one block after `first`, and `first` must
        // leave block 0 to the superblock.
        if first == 0 || first >= max_len {
            return invalid(format_args!(
                "journal log start block {first} outside 1..{max_len}"
            ));
        }
        let start = get_be32(block, sb::START);
        if start != 0 && !(first..max_len).contains(&start) {
            return invalid(format_args!(
                "journal s_start {start} outside the log {first}..{max_len}"
            ));
        }
        let nr_users = get_be32(block, sb::NR_USERS);
        if nr_users as usize > MAX_USERS {
            return invalid(format_args!(
                "{nr_users} journal users (at most {MAX_USERS})"
            ));
        }
        let users = (0..nr_users as usize)
            .map(|i| {
                let off = sb::USERS + i * UUID_LEN;
                let mut u = [0u8; 16];
                u.copy_from_slice(&block[off..off + UUID_LEN]);
                u
            })
            .collect();
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&block[sb::UUID..sb::UUID + UUID_LEN]);
        Ok(Self {
            block_size,
            max_len,
            first,
            sequence: get_be32(block, sb::SEQUENCE),
            start,
            errno: get_be32(block, sb::ERRNO) as i32,
            feature_compat: compat,
            feature_incompat: incompat,
            feature_ro_compat: ro_compat,
            uuid,
            nr_users,
            max_transaction: get_be32(block, sb::MAX_TRANSACTION),
            max_trans_data: get_be32(block, sb::MAX_TRANS_DATA),
            users,
            pipeline_depth: get_be32(block, sb::PIPELINE_DEPTH).max(1),
            session: get_be32(block, sb::SESSION),
            home_id: u64::from(get_be32(block, sb::HOME_ID)) << 32
                | u64::from(get_be32(block, sb::HOME_ID + 4)),
            home_path_id: get_be32(block, sb::HOME_PATH_ID),
        })
    }
}

// ---------------------------------------------------------------------------
// Descriptor blocks
// ---------------------------------------------------------------------------

/// `journal_block_tag3_t`: one data block of a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockTag {
    /// The block's home location (volume block number), 64 bits.
    pub home_block: u64,
    /// [`TAG_FLAG_ESCAPE`] and/or [`TAG_FLAG_DELETED`]. The encoder sets
    /// SAME_UUID and LAST_TAG itself (and ignores them here); the decoder
    /// strips them.
    pub flags: u32,
    /// [`data_block_checksum`] of the data block as written in the journal.
    pub checksum: u32,
}

/// A descriptor block: the tags of the data blocks that follow it in the
/// log, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorBlock {
    /// `h_sequence`: the transaction these blocks belong to.
    pub sequence: u32,
    /// One tag per following data block; 1..=capacity of them.
    pub tags: Vec<BlockTag>,
}

impl DescriptorBlock {
    /// How many tags fit in one descriptor block of `block_size` bytes: a
    /// 12-byte header, 16-byte tags, the journal uuid after the first tag
    /// (later tags are SAME_UUID) and the 4-byte tail checksum at the end.
    /// (4096 → 254; the kernel's writer stops at 253 but its reader, like
    /// e2fsprogs', accepts a tag that ends right at the tail.)
    pub fn capacity(block_size: usize) -> usize {
        block_size.saturating_sub(HEADER_LEN + UUID_LEN + TAIL_LEN) / TAG_LEN
    }

    /// Writes the descriptor into `block` (zero-filled first): header, the
    /// tags with the uuid after the first one, LAST_TAG on the last one and
    /// the tail checksum.
    ///
    /// # Panics
    /// If `block` is not a valid journal block size, or `tags` is empty or
    /// holds more than [`Self::capacity`] tags (programming errors).
    pub fn encode(&self, uuid: &[u8; 16], csum_seed: u32, block: &mut [u8]) {
        assert_block_len(block.len());
        assert!(
            !self.tags.is_empty() && self.tags.len() <= Self::capacity(block.len()),
            "descriptor block with {} tags (1..={} fit in {} bytes)",
            self.tags.len(),
            Self::capacity(block.len()),
            block.len()
        );
        block.fill(0);
        put_header(block, BLOCKTYPE_DESCRIPTOR, self.sequence);
        let mut off = HEADER_LEN;
        let last = self.tags.len() - 1;
        for (i, t) in self.tags.iter().enumerate() {
            let mut flags = t.flags & !(TAG_FLAG_SAME_UUID | TAG_FLAG_LAST_TAG);
            if i > 0 {
                flags |= TAG_FLAG_SAME_UUID;
            }
            if i == last {
                flags |= TAG_FLAG_LAST_TAG;
            }
            put_be32(block, off + tag::BLOCKNR, t.home_block as u32);
            put_be32(block, off + tag::FLAGS, flags);
            put_be32(block, off + tag::BLOCKNR_HIGH, (t.home_block >> 32) as u32);
            put_be32(block, off + tag::CHECKSUM, t.checksum);
            off += TAG_LEN;
            if i == 0 {
                block[off..off + UUID_LEN].copy_from_slice(uuid);
                off += UUID_LEN;
            }
        }
        debug_assert!(off <= block.len() - TAIL_LEN);
        let tail = block.len() - TAIL_LEN;
        // IMPORTANT: tail checksum last, over the final image with the tail zero.
        let csum = block_tail_checksum(csum_seed, block);
        put_be32(block, tail, csum);
    }

    /// Reads a descriptor block: verifies magic, type and tail checksum,
    /// then walks the tags up to the one flagged LAST_TAG. The first tag
    /// must carry a uuid (no SAME_UUID), as every jbd2 writer does; no tag
    /// or uuid may reach into the tail; unknown tag flags are rejected.
    pub fn decode(block: &[u8], csum_seed: u32) -> Result<Self, FormatError> {
        check_block_len(block.len())?;
        let header = check_header(block, BLOCKTYPE_DESCRIPTOR)?;
        let tail = block.len() - TAIL_LEN;
        let stored = get_be32(block, tail);
        let computed = block_tail_checksum(csum_seed, block);
        if stored != computed {
            return Err(FormatError::BadChecksum {
                what: "descriptor block",
                stored,
                computed,
            });
        }
        let mut tags = Vec::new();
        let mut off = HEADER_LEN;
        loop {
            if off + TAG_LEN > tail {
                return invalid("descriptor block has no LAST_TAG before its tail");
            }
            let raw_flags = get_be32(block, off + tag::FLAGS);
            if raw_flags & !TAG_FLAGS_KNOWN != 0 {
                return invalid(format_args!(
                    "descriptor tag {} has unknown flags {raw_flags:#x}",
                    tags.len()
                ));
            }
            if tags.is_empty() && raw_flags & TAG_FLAG_SAME_UUID != 0 {
                return invalid("first descriptor tag has SAME_UUID");
            }
            let home_block = (u64::from(get_be32(block, off + tag::BLOCKNR_HIGH)) << 32)
                | u64::from(get_be32(block, off + tag::BLOCKNR));
            tags.push(BlockTag {
                home_block,
                flags: raw_flags & TAG_FLAGS_CALLER,
                checksum: get_be32(block, off + tag::CHECKSUM),
            });
            off += TAG_LEN;
            if raw_flags & TAG_FLAG_SAME_UUID == 0 {
                // The uuid is not compared: the checksum seed already binds
                // the block to this journal's uuid.
                if off + UUID_LEN > tail {
                    return invalid("descriptor uuid runs into the tail");
                }
                off += UUID_LEN;
            }
            if raw_flags & TAG_FLAG_LAST_TAG != 0 {
                break;
            }
        }
        Ok(Self {
            sequence: header.sequence,
            tags,
        })
    }
}

// ---------------------------------------------------------------------------
// Escaping
// ---------------------------------------------------------------------------

/// Whether a data block must be escaped before it is written to the
/// journal: it begins with the big-endian [`JBD2_MAGIC`], so recovery would
/// take it for a metadata block.
pub fn needs_escape(block: &[u8]) -> bool {
    block.len() >= 4 && get_be32(block, 0) == JBD2_MAGIC
}

/// Escapes a data block for the journal: zeroes its first 4 bytes (its tag
/// gets [`TAG_FLAG_ESCAPE`]). A block shorter than 4 bytes is left as is.
pub fn escape(block: &mut [u8]) {
    if let Some(head) = block.get_mut(..4) {
        head.fill(0);
    }
}

/// Undoes [`escape`] on replay: restores the magic in the first 4 bytes.
/// A block shorter than 4 bytes is left as is.
pub fn unescape(block: &mut [u8]) {
    if let Some(head) = block.get_mut(..4) {
        head.copy_from_slice(&JBD2_MAGIC.to_be_bytes());
    }
}

// ---------------------------------------------------------------------------
// Commit blocks
// ---------------------------------------------------------------------------

/// `struct commit_header`: ends transaction `sequence`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitBlock {
    /// `h_sequence`: the transaction this block commits.
    pub sequence: u32,
    /// `h_commit_sec`: commit time, seconds since the Unix epoch.
    pub commit_sec: u64,
    /// `h_commit_nsec`: nanoseconds, below 1e9.
    pub commit_nsec: u32,
    /// jbdev, `h_chksum[4]`: how many transactions just before this one may
    /// not yet have been durable when this block was written (0 ..=
    /// [`MAX_COMMIT_OVERLAP`]). A verified commit block proves every
    /// transaction before `sequence - overlap` was durable; jbd2 leaves the
    /// word zero, which claims exactly what jbd2's ordering guarantees.
    pub overlap: u32,
}

/// The largest [`CommitBlock::overlap`] a commit block may carry (one less
/// than the deepest commit pipeline a superblock may record).
pub const MAX_COMMIT_OVERLAP: u32 = 15;

impl CommitBlock {
    /// Writes the commit block into `block` (zero-filled first) with
    /// `h_chksum_type = h_chksum_size = 0` (no v1 checksum) and
    /// `h_chksum[0]` = the block checksum.
    ///
    /// # Panics
    /// If `block` is not a valid journal block size.
    pub fn encode(&self, csum_seed: u32, block: &mut [u8]) {
        assert_block_len(block.len());
        block.fill(0);
        put_header(block, BLOCKTYPE_COMMIT, self.sequence);
        block[commit::CHKSUM_TYPE] = 0;
        block[commit::CHKSUM_SIZE] = 0;
        put_be64(block, commit::COMMIT_SEC, self.commit_sec);
        put_be32(block, commit::COMMIT_NSEC, self.commit_nsec);
        put_be32(block, commit::OVERLAP, self.overlap);
        // IMPORTANT: checksum last, over the final image with h_chksum[0] = 0.
        let csum = commit_block_checksum(csum_seed, block);
        put_be32(block, commit::CHKSUM0, csum);
    }

    /// Reads a commit block, verifying magic, type and checksum.
    pub fn decode(block: &[u8], csum_seed: u32) -> Result<Self, FormatError> {
        check_block_len(block.len())?;
        let header = check_header(block, BLOCKTYPE_COMMIT)?;
        let stored = get_be32(block, commit::CHKSUM0);
        let computed = commit_block_checksum(csum_seed, block);
        if stored != computed {
            return Err(FormatError::BadChecksum {
                what: "commit block",
                stored,
                computed,
            });
        }
        let commit_nsec = get_be32(block, commit::COMMIT_NSEC);
        if commit_nsec >= 1_000_000_000 {
            return invalid(format_args!("commit time nanoseconds {commit_nsec}"));
        }
        let overlap = get_be32(block, commit::OVERLAP);
        if overlap > MAX_COMMIT_OVERLAP {
            return invalid(format_args!("commit overlap {overlap}"));
        }
        Ok(Self {
            sequence: header.sequence,
            commit_sec: get_be64(block, commit::COMMIT_SEC),
            commit_nsec,
            overlap,
        })
    }
}

// ---------------------------------------------------------------------------
// Revoke blocks
// ---------------------------------------------------------------------------

/// A revoke block: home blocks whose journaled copies in this and earlier
/// transactions must not be replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevokeBlock {
    /// `h_sequence`: the transaction that revokes.
    pub sequence: u32,
    /// Revoked home block numbers (64-bit records), 0..=capacity of them.
    pub blocks: Vec<u64>,
}

impl RevokeBlock {
    /// How many 8-byte records fit in a revoke block of `block_size` bytes
    /// (16-byte header, 4-byte tail checksum). 4096 → 509.
    pub fn capacity(block_size: usize) -> usize {
        block_size.saturating_sub(REVOKE_HEADER_LEN + TAIL_LEN) / REVOKE_RECORD_LEN
    }

    /// Writes the revoke block into `block` (zero-filled first): header,
    /// `r_count` (bytes used, header included), the records and the tail
    /// checksum.
    ///
    /// # Panics
    /// If `block` is not a valid journal block size or holds fewer than
    /// `blocks.len()` records.
    pub fn encode(&self, csum_seed: u32, block: &mut [u8]) {
        assert_block_len(block.len());
        assert!(
            self.blocks.len() <= Self::capacity(block.len()),
            "revoke block with {} records ({} fit in {} bytes)",
            self.blocks.len(),
            Self::capacity(block.len()),
            block.len()
        );
        block.fill(0);
        put_header(block, BLOCKTYPE_REVOKE, self.sequence);
        let used = REVOKE_HEADER_LEN + self.blocks.len() * REVOKE_RECORD_LEN;
        put_be32(block, REVOKE_COUNT_OFF, used as u32);
        for (i, &b) in self.blocks.iter().enumerate() {
            put_be64(block, REVOKE_HEADER_LEN + i * REVOKE_RECORD_LEN, b);
        }
        let tail = block.len() - TAIL_LEN;
        // IMPORTANT: tail checksum last, over the final image with the tail zero.
        let csum = block_tail_checksum(csum_seed, block);
        put_be32(block, tail, csum);
    }

    /// Reads a revoke block: verifies magic, type and tail checksum, and
    /// that `r_count` covers the header plus whole records and does not
    /// reach into the tail.
    pub fn decode(block: &[u8], csum_seed: u32) -> Result<Self, FormatError> {
        check_block_len(block.len())?;
        let header = check_header(block, BLOCKTYPE_REVOKE)?;
        let tail = block.len() - TAIL_LEN;
        let stored = get_be32(block, tail);
        let computed = block_tail_checksum(csum_seed, block);
        if stored != computed {
            return Err(FormatError::BadChecksum {
                what: "revoke block",
                stored,
                computed,
            });
        }
        let r_count = get_be32(block, REVOKE_COUNT_OFF) as usize;
        if r_count < REVOKE_HEADER_LEN
            || r_count > tail
            || !(r_count - REVOKE_HEADER_LEN).is_multiple_of(REVOKE_RECORD_LEN)
        {
            return invalid(format_args!(
                "revoke r_count {r_count} (header {REVOKE_HEADER_LEN} + k*{REVOKE_RECORD_LEN}, at most {tail})"
            ));
        }
        let blocks = (REVOKE_HEADER_LEN..r_count)
            .step_by(REVOKE_RECORD_LEN)
            .map(|off| get_be64(block, off))
            .collect();
        Ok(Self {
            sequence: header.sequence,
            blocks,
        })
    }
}

// ---------------------------------------------------------------------------
// Log blocks, whatever their type
// ---------------------------------------------------------------------------

/// A verified metadata block of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogRecord {
    Descriptor(DescriptorBlock),
    Revoke(RevokeBlock),
    Commit(CommitBlock),
}

/// One block of the log area as the log reader sees it: its header, and the
/// record it verifies as (or why it does not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogBlockView {
    pub header: Header,
    /// The record, or a reason naming the block kind ("descriptor: …",
    /// "commit block: …", "unknown block type 7").
    pub record: std::result::Result<LogRecord, String>,
}

/// The one decoder of log blocks, used by recovery's walk and survey,
/// `journal dump` and the `log_block` fuzz target: `None` when the block
/// has no jbd2 header (a data block, or never written), else its header
/// and the verified record or why it fails.
pub fn decode_log_block(block: &[u8], csum_seed: u32) -> Option<LogBlockView> {
    let header = read_header(block)?;
    let record = match header.block_type {
        BLOCKTYPE_DESCRIPTOR => DescriptorBlock::decode(block, csum_seed)
            .map(LogRecord::Descriptor)
            .map_err(|e| format!("descriptor: {e}")),
        BLOCKTYPE_REVOKE => RevokeBlock::decode(block, csum_seed)
            .map(LogRecord::Revoke)
            .map_err(|e| format!("revoke block: {e}")),
        BLOCKTYPE_COMMIT => CommitBlock::decode(block, csum_seed)
            .map(LogRecord::Commit)
            .map_err(|e| format!("commit block: {e}")),
        other => Err(format!("unknown block type {other}")),
    };
    Some(LogBlockView { header, record })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = *b"0123456789abcdef";

    #[test]
    fn crc32c_raw_matches_the_standard_check_value() {
        // The standard crc32c of "123456789" is 0xe3069283; the raw form
        // with the conventional !0 seed is its complement.
        assert_eq!(crc32c_raw(!0, b"123456789"), !0xe306_9283);
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        // Chaining is associative, as jbd2's seeded use requires.
        let whole = crc32c_raw(7, b"hello world");
        assert_eq!(whole, crc32c_raw(crc32c_raw(7, b"hello "), b"world"));
    }

    #[test]
    fn zero_window_checksum_equals_copy_with_zeroed_field() {
        let mut block = vec![0xa5u8; 1024];
        let expected = {
            let mut copy = block.clone();
            copy[1020..].fill(0);
            crc32c_raw(99, &copy)
        };
        assert_eq!(block_tail_checksum(99, &block), expected);
        block[commit::CHKSUM0] = 1;
        let expected = {
            let mut copy = block.clone();
            copy[commit::CHKSUM0..commit::CHKSUM0 + 4].fill(0);
            crc32c_raw(5, &copy)
        };
        assert_eq!(commit_block_checksum(5, &block), expected);
    }

    #[test]
    fn capacities() {
        assert_eq!(DescriptorBlock::capacity(4096), 254);
        assert_eq!(DescriptorBlock::capacity(1024), 62);
        assert_eq!(RevokeBlock::capacity(4096), 509);
        assert_eq!(RevokeBlock::capacity(1024), 125);
        assert_eq!(DescriptorBlock::capacity(0), 0);
    }

    /// `jbdev check` tells a newer journal from a damaged one by these
    /// texts (a newer jbdev's features, with the checksum intact).
    #[test]
    fn unknown_features_are_newer_not_damage() {
        let sbk = JournalSuperblock::new(4096, 1000, UUID);
        for (field, bits, text) in [
            (
                sb::FEATURE_INCOMPAT,
                JBDEV_INCOMPAT | 0x100,
                "unsupported journal: journal incompat features 0x100",
            ),
            (
                sb::FEATURE_RO_COMPAT,
                0x1,
                "unsupported journal: journal ro_compat features 0x1",
            ),
        ] {
            let mut block = vec![0u8; 4096];
            sbk.encode(&mut block);
            put_be32(&mut block, field, bits);
            let csum = JournalSuperblock::checksum_of(&block);
            put_be32(&mut block, sb::CHECKSUM, csum);
            let e = JournalSuperblock::decode(&block).unwrap_err();
            assert!(matches!(e, FormatError::NewerFeatures(_)), "{e:?}");
            assert_eq!(e.to_string(), text);
            // The same bits with a checksum that does not hold: damage.
            put_be32(&mut block, sb::CHECKSUM, csum ^ 1);
            let e = JournalSuperblock::decode(&block).unwrap_err();
            assert!(matches!(e, FormatError::BadChecksum { .. }), "{e:?}");
        }
    }

    #[test]
    fn superblock_layout_is_jbd2s() {
        let mut sbk = JournalSuperblock::new(4096, 1000, UUID);
        sbk.start = 7;
        sbk.sequence = 0x0102_0304;
        sbk.session = 0x0a0b_0c0d;
        sbk.home_id = 0x1112_1314_1516_1718;
        sbk.home_path_id = 0x2122_2324;
        let mut block = vec![0xffu8; 4096];
        sbk.encode(&mut block);
        assert_eq!(&block[0x60..0x64], &[0x0a, 0x0b, 0x0c, 0x0d]);
        assert_eq!(
            &block[0x64..0x6c],
            &[0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18]
        );
        assert_eq!(&block[0x6c..0x70], &[0x21, 0x22, 0x23, 0x24]);
        assert_eq!(&block[0..4], &[0xc0, 0x3b, 0x39, 0x98]);
        assert_eq!(get_be32(&block, 4), BLOCKTYPE_SUPERBLOCK_V2);
        assert_eq!(&block[0x0c..0x10], &4096u32.to_be_bytes());
        assert_eq!(&block[0x18..0x1c], &[1, 2, 3, 4]);
        assert_eq!(get_be32(&block, 0x1c), 7);
        assert_eq!(get_be32(&block, 0x28), 0x13);
        assert_eq!(&block[0x30..0x40], &UUID);
        assert_eq!(block[0x50], 4);
        assert_eq!(&block[0x100..0x110], &UUID);
        assert!(block[0x400..].iter().all(|&b| b == 0));
        assert_eq!(JournalSuperblock::decode(&block).unwrap(), sbk);
    }

    /// A superblock that fails its checksum still says whose journal it
    /// was; a block without the magic says nothing.
    #[test]
    fn a_damaged_superblock_still_claims_its_uuid() {
        let mut block = vec![0u8; 4096];
        JournalSuperblock::new(4096, 1024, UUID).encode(&mut block);
        block[0x200] ^= 0x40;
        assert!(JournalSuperblock::decode(&block).is_err());
        assert_eq!(JournalSuperblock::claimed_uuid(&block), Some(UUID));
        block[0] ^= 1;
        assert_eq!(JournalSuperblock::claimed_uuid(&block), None);
        assert_eq!(JournalSuperblock::claimed_uuid(&block[..0x20]), None);
    }

    #[test]
    fn descriptor_layout_is_jbd2s() {
        let d = DescriptorBlock {
            sequence: 9,
            tags: vec![
                BlockTag {
                    home_block: 0x1_0000_0002,
                    flags: TAG_FLAG_ESCAPE,
                    checksum: 0xdead_beef,
                },
                BlockTag {
                    home_block: 3,
                    flags: 0,
                    checksum: 1,
                },
            ],
        };
        let mut block = vec![0u8; 1024];
        d.encode(&UUID, 42, &mut block);
        assert_eq!(get_be32(&block, 12), 2);
        assert_eq!(get_be32(&block, 16), TAG_FLAG_ESCAPE);
        assert_eq!(get_be32(&block, 20), 1);
        assert_eq!(get_be32(&block, 24), 0xdead_beef);
        assert_eq!(&block[28..44], &UUID);
        assert_eq!(get_be32(&block, 44), 3);
        assert_eq!(get_be32(&block, 48), TAG_FLAG_SAME_UUID | TAG_FLAG_LAST_TAG);
        assert_eq!(DescriptorBlock::decode(&block, 42).unwrap(), d);
    }

    #[test]
    fn escape_round_trip() {
        let mut block = vec![7u8; 1024];
        block[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        let original = block.clone();
        assert!(needs_escape(&block));
        escape(&mut block);
        assert!(!needs_escape(&block));
        assert_eq!(&block[..4], &[0, 0, 0, 0]);
        assert_eq!(&block[4..], &original[4..]);
        unescape(&mut block);
        assert_eq!(block, original);
        // Little-endian magic is not the magic.
        let le = JBD2_MAGIC.to_le_bytes();
        assert!(!needs_escape(&le));
        assert!(!needs_escape(&[0xc0, 0x3b, 0x39]));
    }

    #[test]
    fn the_log_block_decoder_names_what_it_found() {
        let seed = 42;
        let c = CommitBlock {
            sequence: 9,
            commit_sec: 1,
            commit_nsec: 2,
            overlap: 3,
        };
        let mut block = vec![0u8; 1024];
        let too_deep = CommitBlock {
            overlap: MAX_COMMIT_OVERLAP + 1,
            ..c
        };
        too_deep.encode(seed, &mut block);
        let bad = decode_log_block(&block, seed).unwrap().record.unwrap_err();
        assert!(bad.contains("commit overlap 16"), "{bad}");
        c.encode(seed, &mut block);
        let v = decode_log_block(&block, seed).unwrap();
        assert_eq!(v.header.sequence, 9);
        assert_eq!(v.record, Ok(LogRecord::Commit(c)));
        block[100] ^= 1;
        let bad = decode_log_block(&block, seed).unwrap().record.unwrap_err();
        assert!(bad.starts_with("commit block: "), "{bad}");
        put_be32(&mut block, 4, 77);
        let v = decode_log_block(&block, seed).unwrap();
        assert_eq!(v.record, Err("unknown block type 77".into()));
        assert_eq!(decode_log_block(&[0u8; 1024], seed), None);
    }
}
