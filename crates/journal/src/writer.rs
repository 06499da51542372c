//! Lays out one transaction as journal blocks.
//!
//! Order within a transaction: revoke blocks, then for every run of up to
//! [`DescriptorBlock::capacity`] data blocks a descriptor followed by those
//! data blocks, then the commit block. Recovery does not depend on the order
//! of revoke and descriptor blocks (revokes are collected in their own pass),
//! only on the commit block coming last.
//!
//! # The data digest in the commit block
//! jbd2's CSUM_V3 tag checksum of a data block is crc32c, and crc32c is
//! affine over GF(2): for data made of records that each end with their own
//! crc32c (a common log and page format, and the crash tests' sector
//! stamps), the checksum of a block does not depend on the records' content
//! at all. A data block torn between two such versions — new sectors mixed
//! with stale ones from an older lap of the log — passes its tag checksum.
//! With single-flush commits (descriptor, data and commit in one write, one
//! flush) the commit block can reach the media while a data block is torn,
//! so tag checksums alone would let recovery replay torn data.
//!
//! So the commit block also carries a [`DataDigest`], a non-linear 64-bit
//! hash of the transaction's data blocks as logged, in `h_chksum[1..4]`
//! (marker, then the digest): bytes jbd2 leaves zero in CSUM_V2/V3 commit
//! blocks and never reads, inside the area the commit checksum covers. The
//! kernel, e2fsck and debugfs keep reading our journals; recovery checks the
//! digest when the marker is present (older commit blocks have none).

use std::io::IoSlice;
use std::time::{SystemTime, UNIX_EPOCH};

use jbdev_device::{AlignedBuf, IoPriority};

use crate::format::{
    self, BlockTag, CommitBlock, DescriptorBlock, JournalSuperblock, RevokeBlock, TAG_FLAG_ESCAPE,
};
use crate::{JournalRegion, Result};

/// One block of a laid-out transaction: either built here (descriptor,
/// revoke, commit, escaped data copy) or borrowed from the caller's data.
pub enum LogBlock<'a> {
    Owned(AlignedBuf),
    Borrowed(&'a [u8]),
}

impl LogBlock<'_> {
    pub fn bytes(&self) -> &[u8] {
        match self {
            LogBlock::Owned(b) => b,
            LogBlock::Borrowed(b) => b,
        }
    }
}

/// Journal blocks a transaction of `data_blocks` data blocks and
/// `revoke_records` revoke records occupies.
pub fn transaction_blocks(block_size: usize, data_blocks: usize, revoke_records: usize) -> usize {
    let descriptors = data_blocks.div_ceil(DescriptorBlock::capacity(block_size));
    let revokes = revoke_records.div_ceil(RevokeBlock::capacity(block_size));
    data_blocks + descriptors + revokes + 1
}

/// Offset of `h_chksum[0]` (the commit block checksum) in a commit block.
const COMMIT_CHKSUM0_OFFSET: usize = 16;
/// Offset of the digest marker (`h_chksum[1]`) in a commit block.
pub const DIGEST_MARKER_OFFSET: usize = 20;
/// Offset of the big-endian 64-bit digest (`h_chksum[2..4]`) in a commit block.
pub const DIGEST_OFFSET: usize = 24;
/// Marks a commit block that carries a [`DataDigest`].
pub const DIGEST_MARKER: u32 = u32::from_be_bytes(*b"JBDG");

/// A non-linear 64-bit digest of a transaction's data blocks, as logged
/// and in log order (see the module documentation for why crc32c is not
/// enough). Not cryptographic: it detects torn and stale blocks, not
/// forgeries. The algorithm is part of the on-disk format: never change it
/// without a new marker.
#[derive(Clone, Debug)]
pub struct DataDigest {
    acc: u64,
    blocks: u64,
}

/// Multipliers of the four lanes (odd, so each step is a bijection).
const LANE_MUL: [u64; 4] = [
    0x9E37_79B9_7F4A_7C15,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0xD6E8_FEB8_6659_FD93,
];

/// A full-avalanche finalizer: every input bit affects every output bit.
fn avalanche(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl DataDigest {
    /// The digest of no blocks of transaction `sequence` in the journal
    /// whose checksum seed is `csum_seed`.
    pub fn new(csum_seed: u32, sequence: u32) -> Self {
        Self {
            acc: avalanche((u64::from(csum_seed) << 32) | u64::from(sequence)),
            blocks: 0,
        }
    }

    /// Adds the next data block: its home block number and its bytes as
    /// written in the journal (escaped).
    pub fn update(&mut self, home_block: u64, journal_block: &[u8]) {
        // Four independent lanes of multiply-rotate steps (fast: no lane
        // waits for another); multiplication carries make every step
        // non-linear over GF(2), unlike a CRC.
        let mut lanes = [
            self.acc,
            self.acc ^ home_block,
            self.acc.rotate_left(21) ^ self.blocks,
            !self.acc,
        ];
        let mut words = journal_block.chunks_exact(32);
        for chunk in &mut words {
            for (i, lane) in lanes.iter_mut().enumerate() {
                let mut w = [0u8; 8];
                w.copy_from_slice(&chunk[i * 8..i * 8 + 8]);
                *lane = (*lane ^ u64::from_le_bytes(w))
                    .wrapping_mul(LANE_MUL[i])
                    .rotate_left(31);
            }
        }
        let rest = words.remainder();
        let mut tail = [0u8; 32];
        tail[..rest.len()].copy_from_slice(rest);
        let mut h = avalanche(journal_block.len() as u64 ^ home_block);
        for (i, lane) in lanes.iter().enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(&tail[i * 8..i * 8 + 8]);
            h = avalanche(h ^ lane ^ u64::from_le_bytes(w).wrapping_mul(LANE_MUL[i]));
        }
        self.acc = avalanche(self.acc.rotate_left(17) ^ h);
        self.blocks += 1;
    }

    /// The digest so far.
    pub fn finish(&self) -> u64 {
        avalanche(self.acc ^ self.blocks)
    }
}

/// The digest a commit block carries, if it carries one.
pub fn commit_digest(commit_block: &[u8]) -> Option<u64> {
    let marker = commit_block.get(DIGEST_MARKER_OFFSET..DIGEST_MARKER_OFFSET + 4)?;
    if marker != DIGEST_MARKER.to_be_bytes() {
        return None;
    }
    let d = commit_block.get(DIGEST_OFFSET..DIGEST_OFFSET + 8)?;
    let mut w = [0u8; 8];
    w.copy_from_slice(d);
    Some(u64::from_be_bytes(w))
}

/// Builds the blocks of transaction `sequence`: `data` is (home block number,
/// block content) in the order to log them; `revokes` are home block numbers;
/// `overlap` is how many transactions before it may still be in flight when
/// it is written ([`CommitBlock::overlap`]).
pub fn build_transaction<'a>(
    sb: &JournalSuperblock,
    sequence: u32,
    overlap: u32,
    data: &[(u64, &'a [u8])],
    revokes: &[u64],
    now: SystemTime,
) -> Vec<LogBlock<'a>> {
    let bs = sb.block_size as usize;
    let seed = sb.csum_seed();
    let mut out = Vec::with_capacity(transaction_blocks(bs, data.len(), revokes.len()));
    let mut digest = DataDigest::new(seed, sequence);
    for chunk in revokes.chunks(RevokeBlock::capacity(bs)) {
        let mut b = AlignedBuf::zeroed(bs);
        RevokeBlock {
            sequence,
            blocks: chunk.to_vec(),
        }
        .encode(seed, &mut b);
        out.push(LogBlock::Owned(b));
    }
    for chunk in data.chunks(DescriptorBlock::capacity(bs)) {
        let mut tags = Vec::with_capacity(chunk.len());
        let mut payload = Vec::with_capacity(chunk.len());
        for &(home, block) in chunk {
            debug_assert_eq!(block.len(), bs);
            let (logged, flags) = if format::needs_escape(block) {
                let mut copy = AlignedBuf::from_slice(block);
                format::escape(&mut copy);
                (LogBlock::Owned(copy), TAG_FLAG_ESCAPE)
            } else {
                (LogBlock::Borrowed(block), 0)
            };
            // IMPORTANT: the tag checksum covers the block as written to the
            // journal (escaped), as jbd2 recovery verifies it.
            let checksum = format::data_block_checksum(seed, sequence, logged.bytes());
            digest.update(home, logged.bytes());
            tags.push(BlockTag {
                home_block: home,
                flags,
                checksum,
            });
            payload.push(logged);
        }
        let mut d = AlignedBuf::zeroed(bs);
        DescriptorBlock { sequence, tags }.encode(&sb.uuid, seed, &mut d);
        out.push(LogBlock::Owned(d));
        out.extend(payload);
    }
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let mut c = AlignedBuf::zeroed(bs);
    CommitBlock {
        sequence,
        commit_sec: since.as_secs(),
        commit_nsec: since.subsec_nanos(),
        overlap,
    }
    .encode(seed, &mut c);
    // IMPORTANT: the digest goes inside the area the commit checksum covers,
    // so the checksum is computed again after it is in place.
    c[DIGEST_MARKER_OFFSET..DIGEST_MARKER_OFFSET + 4].copy_from_slice(&DIGEST_MARKER.to_be_bytes());
    c[DIGEST_OFFSET..DIGEST_OFFSET + 8].copy_from_slice(&digest.finish().to_be_bytes());
    let csum = format::commit_block_checksum(seed, &c);
    c[COMMIT_CHKSUM0_OFFSET..COMMIT_CHKSUM0_OFFSET + 4].copy_from_slice(&csum.to_be_bytes());
    out.push(LogBlock::Owned(c));
    out
}

/// Writes `blocks` to the log starting at `pos`, splitting at the end of the
/// circular log and into runs of at most `max_iov` blocks. `prio` is
/// re-evaluated before every run, so a commit that somebody starts waiting
/// for mid-way is finished at urgent priority. Returns the position after
/// the last block.
///
/// With `durable`, every run is written with force-unit-access
/// ([`jbdev_device::BlockDevice::write_vectored_durable_at`]): when this
/// returns, these blocks are durable without a separate flush, and the runs
/// (up to 256 blocks each) go out as one device batch — nothing orders
/// them, since recovery verifies every block, and a large commit then keeps
/// the device busy at queue depth instead of one request at a time.
pub fn write_log_blocks(
    region: &JournalRegion,
    first: u32,
    mut pos: u32,
    blocks: &[LogBlock<'_>],
    prio: &(dyn Fn() -> IoPriority + Sync),
    durable: bool,
) -> Result<u32> {
    const MAX_IOV: usize = 256;
    let len = region.len_blocks();
    // (log position, first block, block count) of each run.
    let mut runs: Vec<(u32, usize, usize)> = Vec::new();
    let mut i = 0;
    while i < blocks.len() {
        let room = (len - pos) as usize;
        let n = (blocks.len() - i).min(room).min(MAX_IOV);
        runs.push((pos, i, n));
        i += n;
        pos += n as u32;
        if pos >= len {
            pos = first;
        }
    }
    let iov_of = |i: usize, n: usize| -> Vec<IoSlice<'_>> {
        blocks[i..i + n]
            .iter()
            .map(|b| IoSlice::new(b.bytes()))
            .collect()
    };
    if !durable || runs.len() == 1 {
        for &(at, i, n) in &runs {
            let iov = iov_of(i, n);
            if durable {
                region.write_blocks_durable(at, &iov, prio())?;
            } else {
                region.write_blocks(at, &iov, prio())?;
            }
        }
        return Ok(pos);
    }
    // A large durable commit: every run in one device batch (queue depth
    // without a thread per request).
    let batch: Vec<(u32, Vec<IoSlice<'_>>)> =
        runs.iter().map(|&(at, i, n)| (at, iov_of(i, n))).collect();
    region.write_runs(&batch, true, prio())?;
    Ok(pos)
}

/// Advances `pos` by `n` log blocks.
pub fn advance(pos: u32, n: usize, first: u32, len_blocks: u32) -> u32 {
    let usable = u64::from(len_blocks - first);
    (((u64::from(pos - first)) + n as u64) % usable) as u32 + first
}
