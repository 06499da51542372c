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

use smallvec::SmallVec;
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
/// Marks a commit block that carries a [`DataDigest`] (the current
/// algorithm).
pub const DIGEST_MARKER: u32 = u32::from_be_bytes(*b"JBDX");
/// Marks a commit block that carries a [`DataDigestV1`] (journals written
/// before the per-block hash; still verified on recovery).
pub const DIGEST_MARKER_V1: u32 = u32::from_be_bytes(*b"JBDG");

/// A full-avalanche finalizer: every input bit affects every output bit.
fn avalanche(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Both digest algorithms start from the journal and the transaction...
fn digest_start(csum_seed: u32, sequence: u32) -> u64 {
    avalanche((u64::from(csum_seed) << 32) | u64::from(sequence))
}

/// ...and end by folding in the block count.
fn digest_finish(acc: u64, blocks: u64) -> u64 {
    avalanche(acc ^ blocks)
}

/// What the log needs to know of one data block's content, independent of
/// the transaction it lands in and of its home: so a writer can compute it
/// right after copying the block (in its own thread, while the bytes are in
/// cache) and the commit, a serial step, only combines.
///
/// Both fields are of the block as logged (escaped, see
/// [`format::escape`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSums {
    /// `crc32c_raw(0, block)`: the tag checksum of the block in transaction
    /// `s` is this XOR a per-transaction constant (crc32c without inversion
    /// is linear; see [`TagKey`]).
    pub crc: u32,
    /// The block's 64-bit xxh3 hash, folded into the [`DataDigest`].
    pub hash: u64,
}

impl BlockSums {
    pub fn of(logged: &[u8]) -> Self {
        Self {
            crc: format::crc32c_raw(0, logged),
            hash: xxhash_rust::xxh3::xxh3_64(logged),
        }
    }
}

/// Turns [`BlockSums::crc`] into the tag checksum of a block of
/// `block_size` bytes in transaction `sequence`.
///
/// The tag checksum is `crc32c_raw(crc32c_raw(seed, seq_be), block)`. For a
/// CRC without inversion, `crc(s, d) = crc(s, zeros(|d|)) ^ crc(0, d)`, so
/// the first term is one constant for every block of the transaction.
#[derive(Clone, Copy, Debug)]
pub struct TagKey(u32);

impl TagKey {
    pub fn new(csum_seed: u32, sequence: u32, block_size: usize) -> Self {
        let crc = format::crc32c_raw(csum_seed, &sequence.to_be_bytes());
        Self(format::crc32c_raw_zeros(crc, block_size))
    }

    /// The tag checksum of a block whose sums are `sums`.
    pub fn tag_checksum(self, sums: &BlockSums) -> u32 {
        self.0 ^ sums.crc
    }
}

/// A non-linear 64-bit digest of a transaction's data blocks, as logged
/// and in log order (see the module documentation for why crc32c is not
/// enough). Not cryptographic: it detects torn and stale blocks, not
/// forgeries. The algorithm is part of the on-disk format (marker
/// [`DIGEST_MARKER`]): never change it without a new marker.
///
/// `acc = avalanche(seed << 32 | sequence)`; per block, in log order,
/// `acc = avalanche(rotl(acc, 17) ^ xxh3_64(block) ^ avalanche(home))`;
/// the digest is `avalanche(acc ^ blocks)`. The per-block hash does not
/// depend on the transaction, so writers compute it ahead ([`BlockSums`]).
#[derive(Clone, Debug)]
pub struct DataDigest {
    acc: u64,
    blocks: u64,
}

impl DataDigest {
    /// The digest of no blocks of transaction `sequence` in the journal
    /// whose checksum seed is `csum_seed`.
    pub fn new(csum_seed: u32, sequence: u32) -> Self {
        Self {
            acc: digest_start(csum_seed, sequence),
            blocks: 0,
        }
    }

    /// Adds the next data block: its home block number and its bytes as
    /// written in the journal (escaped).
    pub fn update(&mut self, home_block: u64, journal_block: &[u8]) {
        self.update_hash(home_block, xxhash_rust::xxh3::xxh3_64(journal_block));
    }

    /// Adds the next data block by its [`BlockSums::hash`].
    pub fn update_hash(&mut self, home_block: u64, hash: u64) {
        self.acc = avalanche(self.acc.rotate_left(17) ^ hash ^ avalanche(home_block));
        self.blocks += 1;
    }

    /// The digest so far.
    pub fn finish(&self) -> u64 {
        digest_finish(self.acc, self.blocks)
    }
}

/// The first digest algorithm (marker [`DIGEST_MARKER_V1`]): kept so that
/// journals written with it are still verified on recovery. Four lanes of
/// multiply-rotate steps over each block, chained through the transaction.
#[derive(Clone, Debug)]
pub struct DataDigestV1 {
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

impl DataDigestV1 {
    /// The digest of no blocks of transaction `sequence` in the journal
    /// whose checksum seed is `csum_seed`.
    pub fn new(csum_seed: u32, sequence: u32) -> Self {
        Self {
            acc: digest_start(csum_seed, sequence),
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
        digest_finish(self.acc, self.blocks)
    }
}

/// Which digest algorithm a commit block's marker names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DigestKind {
    /// [`DataDigest`] (marker `JBDX`).
    Hash,
    /// [`DataDigestV1`] (marker `JBDG`).
    V1,
    /// A marker this jbdev does not know (not zero, which means "no
    /// digest"): the algorithm never changes without a new marker and a
    /// new journal feature bit, so under jbdev's feature set it is damage,
    /// and nothing verifies against it.
    Unknown(u32),
}

/// The digest a commit block carries, if it carries one, and its algorithm.
pub fn commit_digest(commit_block: &[u8]) -> Option<(DigestKind, u64)> {
    let marker = commit_block.get(DIGEST_MARKER_OFFSET..DIGEST_MARKER_OFFSET + 4)?;
    let kind = if marker == DIGEST_MARKER.to_be_bytes() {
        DigestKind::Hash
    } else if marker == DIGEST_MARKER_V1.to_be_bytes() {
        DigestKind::V1
    } else if marker == [0; 4] {
        return None;
    } else {
        DigestKind::Unknown(u32::from_be_bytes([
            marker[0], marker[1], marker[2], marker[3],
        ]))
    };
    let d = commit_block.get(DIGEST_OFFSET..DIGEST_OFFSET + 8)?;
    let mut w = [0u8; 8];
    w.copy_from_slice(d);
    Some((kind, u64::from_be_bytes(w)))
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
    TxnBuilder::default().build(
        &LogParams::of(sb),
        TxnHead {
            sequence,
            overlap,
            now,
        },
        data.len(),
        |i| (data[i].0, data[i].1, None),
        revokes,
    )
}

/// What laying out a transaction needs of the journal superblock (copied
/// out, so a caller need not clone the superblock per commit).
#[derive(Clone, Copy, Debug)]
pub struct LogParams {
    pub block_size: usize,
    pub csum_seed: u32,
    pub uuid: [u8; 16],
}

impl LogParams {
    pub fn of(sb: &JournalSuperblock) -> Self {
        Self {
            block_size: sb.block_size as usize,
            csum_seed: sb.csum_seed(),
            uuid: sb.uuid,
        }
    }
}

/// The per-transaction fields of its commit block.
#[derive(Clone, Copy, Debug)]
pub struct TxnHead {
    pub sequence: u32,
    /// [`CommitBlock::overlap`].
    pub overlap: u32,
    pub now: SystemTime,
}

/// Lays out transactions, keeping what one transaction allocated — the
/// block list, the descriptor's tags, the descriptor, commit and escape
/// buffers — for the next one ([`TxnBuilder::recycle`]): a committer that
/// keeps one builder makes no heap allocation per commit in steady state.
#[derive(Default)]
pub struct TxnBuilder {
    /// Block-sized buffers of earlier transactions, for reuse.
    spare: Vec<AlignedBuf>,
    tags: Vec<BlockTag>,
    /// Always empty: only its capacity is kept.
    blocks: Vec<LogBlock<'static>>,
}

/// Buffers a builder keeps for reuse: a descriptor and a commit block,
/// plus a few escaped copies.
const SPARE_BUFS_MAX: usize = 8;

impl TxnBuilder {
    /// Builds the blocks of a transaction (see [`build_transaction`]) of
    /// `n` data blocks, `data(i)` being the i-th (home block number,
    /// content, and the content's [`BlockSums`] if the caller has them), in
    /// log order. Sums given for a block that needs escaping are ignored
    /// (they would be of the unescaped bytes). The result borrows the data;
    /// hand it back with [`TxnBuilder::recycle`] once written.
    pub fn build<'a>(
        &mut self,
        p: &LogParams,
        head: TxnHead,
        n: usize,
        data: impl Fn(usize) -> (u64, &'a [u8], Option<BlockSums>),
        revokes: &[u64],
    ) -> Vec<LogBlock<'a>> {
        let (bs, seed, sequence) = (p.block_size, p.csum_seed, head.sequence);
        let mut out: Vec<LogBlock<'a>> = relabel(std::mem::take(&mut self.blocks));
        out.reserve(transaction_blocks(bs, n, revokes.len()));
        let mut digest = DataDigest::new(seed, sequence);
        let key = TagKey::new(seed, sequence, bs);
        for chunk in revokes.chunks(RevokeBlock::capacity(bs)) {
            let mut b = self.take_buf(bs);
            RevokeBlock {
                sequence,
                blocks: chunk.to_vec(),
            }
            .encode(seed, &mut b);
            out.push(LogBlock::Owned(b));
        }
        let per_descriptor = DescriptorBlock::capacity(bs);
        let mut first = 0;
        while first < n {
            let end = (first + per_descriptor).min(n);
            // The descriptor goes before its data blocks; it is encoded
            // once their tags are known.
            let at = out.len();
            out.push(LogBlock::Owned(self.take_buf(bs)));
            let mut tags = std::mem::take(&mut self.tags);
            tags.clear();
            for i in first..end {
                let (home, block, given) = data(i);
                debug_assert_eq!(block.len(), bs);
                let (logged, flags, sums) = if format::needs_escape(block) {
                    let mut copy = self.take_buf(bs);
                    copy.copy_from_slice(block);
                    format::escape(&mut copy);
                    let sums = BlockSums::of(&copy);
                    (LogBlock::Owned(copy), TAG_FLAG_ESCAPE, sums)
                } else {
                    // IMPORTANT: sums computed ahead must be of exactly
                    // these bytes (a stale sum would make recovery drop
                    // the transaction); debug builds check every one.
                    debug_assert!(given.is_none_or(|g| g == BlockSums::of(block)));
                    let sums = given.unwrap_or_else(|| BlockSums::of(block));
                    (LogBlock::Borrowed(block), 0, sums)
                };
                // IMPORTANT: the tag checksum covers the block as written to
                // the journal (escaped), as jbd2 recovery verifies it.
                let checksum = key.tag_checksum(&sums);
                digest.update_hash(home, sums.hash);
                tags.push(BlockTag {
                    home_block: home,
                    flags,
                    checksum,
                });
                out.push(logged);
            }
            let d = DescriptorBlock { sequence, tags };
            if let LogBlock::Owned(buf) = &mut out[at] {
                d.encode(&p.uuid, seed, buf);
            }
            self.tags = d.tags;
            first = end;
        }
        let since = head.now.duration_since(UNIX_EPOCH).unwrap_or_default();
        let mut c = self.take_buf(bs);
        CommitBlock {
            sequence,
            commit_sec: since.as_secs(),
            commit_nsec: since.subsec_nanos(),
            overlap: head.overlap,
        }
        .encode(seed, &mut c);
        // IMPORTANT: the digest goes inside the area the commit checksum
        // covers, so the checksum is computed again after it is in place.
        c[DIGEST_MARKER_OFFSET..DIGEST_MARKER_OFFSET + 4]
            .copy_from_slice(&DIGEST_MARKER.to_be_bytes());
        c[DIGEST_OFFSET..DIGEST_OFFSET + 8].copy_from_slice(&digest.finish().to_be_bytes());
        let csum = format::commit_block_checksum(seed, &c);
        c[COMMIT_CHKSUM0_OFFSET..COMMIT_CHKSUM0_OFFSET + 4].copy_from_slice(&csum.to_be_bytes());
        out.push(LogBlock::Owned(c));
        out
    }

    /// Takes back a transaction's blocks once written: its buffers and
    /// its list are kept for the next [`TxnBuilder::build`].
    pub fn recycle(&mut self, mut blocks: Vec<LogBlock<'_>>) {
        for b in blocks.drain(..) {
            if let LogBlock::Owned(buf) = b {
                if self.spare.len() < SPARE_BUFS_MAX {
                    self.spare.push(buf);
                }
            }
        }
        self.blocks = relabel(blocks);
    }

    /// A block-sized buffer (contents unspecified: every user overwrites
    /// all of it).
    fn take_buf(&mut self, bs: usize) -> AlignedBuf {
        while let Some(b) = self.spare.pop() {
            if b.len() == bs {
                return b;
            }
        }
        AlignedBuf::zeroed(bs)
    }
}

/// An empty vector that keeps `v`'s allocation, for elements that differ
/// only in lifetime. (The standard library collects an `IntoIter` mapped
/// to a type of the same size and alignment in place; if it ever did not,
/// this would return a new empty vector, which allocates nothing.)
fn relabel<'b>(mut v: Vec<LogBlock<'_>>) -> Vec<LogBlock<'b>> {
    v.clear();
    v.into_iter()
        .map(|_| -> LogBlock<'b> { unreachable!("the vector is empty") })
        .collect()
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
    let mut runs: SmallVec<[(u32, usize, usize); 4]> = SmallVec::new();
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
    if !durable || runs.len() == 1 {
        for &(at, i, n) in &runs {
            // On the stack for a commit of up to 64 blocks.
            let iov: SmallVec<[IoSlice<'_>; 64]> = blocks[i..i + n]
                .iter()
                .map(|b| IoSlice::new(b.bytes()))
                .collect();
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
    let batch: Vec<(u32, Vec<IoSlice<'_>>)> = runs
        .iter()
        .map(|&(at, i, n)| {
            let iov = blocks[i..i + n].iter().map(|b| IoSlice::new(b.bytes()));
            (at, iov.collect())
        })
        .collect();
    region.write_runs(&batch, true, prio())?;
    Ok(pos)
}

/// Advances `pos` by `n` log blocks.
pub fn advance(pos: u32, n: usize, first: u32, len_blocks: u32) -> u32 {
    let usable = u64::from(len_blocks - first);
    (((u64::from(pos - first)) + n as u64) % usable) as u32 + first
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    const BS: usize = 1024;

    /// Data blocks from seeds: some start with the journal magic (escaped).
    fn blocks(seeds: &[(u64, u8, bool)]) -> Vec<(u64, Vec<u8>)> {
        seeds
            .iter()
            .map(|&(home, fill, magic)| {
                let mut b = vec![fill; BS];
                if magic {
                    b[..4].copy_from_slice(&format::JBD2_MAGIC.to_be_bytes());
                }
                (home, b)
            })
            .collect()
    }

    fn bytes_of(log: &[LogBlock<'_>]) -> Vec<Vec<u8>> {
        log.iter().map(|b| b.bytes().to_vec()).collect()
    }

    proptest! {
        /// A builder reused across transactions lays out exactly what a
        /// fresh one does (its kept buffers hold the previous transaction's
        /// bytes: every block built must overwrite all of them).
        #[test]
        fn a_reused_builder_builds_what_a_fresh_one_does(
            txns in proptest::collection::vec(
                (
                    proptest::collection::vec((0u64..1 << 40, any::<u8>(), any::<bool>()), 0..70),
                    proptest::collection::vec(0u64..1 << 40, 0..200),
                    0u32..16,
                ),
                1..6,
            )
        ) {
            let sb = JournalSuperblock::new(BS as u32, 4096, [9; 16]);
            let p = LogParams::of(&sb);
            let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
            let mut builder = TxnBuilder::default();
            for (i, (seeds, revokes, overlap)) in txns.iter().enumerate() {
                let data = blocks(seeds);
                let refs: Vec<(u64, &[u8])> = data.iter().map(|(h, b)| (*h, b.as_slice())).collect();
                let seq = 100 + i as u32;
                let fresh = build_transaction(&sb, seq, *overlap, &refs, revokes, now);
                let head = TxnHead { sequence: seq, overlap: *overlap, now };
                // Sums given ahead, as the engine does; for a block that
                // needs escaping they are of the unescaped bytes and must be
                // ignored.
                let reused = builder.build(
                    &p,
                    head,
                    refs.len(),
                    |i| (refs[i].0, refs[i].1, Some(BlockSums::of(refs[i].1))),
                    revokes,
                );
                prop_assert_eq!(reused.len(), transaction_blocks(BS, refs.len(), revokes.len()));
                prop_assert_eq!(bytes_of(&reused), bytes_of(&fresh));
                builder.recycle(reused);
            }
        }

        /// The tag checksum from sums computed ahead (no sequence, no seed)
        /// is the jbd2 tag checksum of the block in the transaction.
        #[test]
        fn tag_checksums_from_sums_are_jbd2_tag_checksums(
            seed in any::<u32>(),
            sequence in any::<u32>(),
            bs_shift in 9u32..14,
            fill in any::<u64>(),
        ) {
            let bs = 1usize << bs_shift;
            let block: Vec<u8> = (0..bs)
                .map(|i| (fill.rotate_left(i as u32 % 64) >> 7) as u8 ^ i as u8)
                .collect();
            let key = TagKey::new(seed, sequence, bs);
            prop_assert_eq!(
                key.tag_checksum(&BlockSums::of(&block)),
                format::data_block_checksum(seed, sequence, &block)
            );
        }
    }

    /// The point of the builder: after the first transaction, the next one
    /// of the same shape takes no new buffer and no new list.
    #[test]
    fn a_builder_keeps_its_buffers_and_list() {
        let sb = JournalSuperblock::new(BS as u32, 4096, [9; 16]);
        let p = LogParams::of(&sb);
        let data = blocks(&[(5, 1, false), (6, 2, true), (9, 3, false)]);
        let refs: Vec<(u64, &[u8])> = data.iter().map(|(h, b)| (*h, b.as_slice())).collect();
        let head = TxnHead {
            sequence: 1,
            overlap: 0,
            now: SystemTime::now(),
        };
        let mut builder = TxnBuilder::default();
        let first = builder.build(&p, head, refs.len(), |i| (refs[i].0, refs[i].1, None), &[]);
        let owned: Vec<*const u8> = first
            .iter()
            .filter_map(|b| match b {
                LogBlock::Owned(buf) => Some(buf.as_ptr()),
                LogBlock::Borrowed(_) => None,
            })
            .collect();
        // Descriptor, escaped copy, commit.
        assert_eq!(owned.len(), 3);
        let list = first.as_ptr() as usize;
        builder.recycle(first);
        let second = builder.build(&p, head, refs.len(), |i| (refs[i].0, refs[i].1, None), &[]);
        assert_eq!(
            second.as_ptr() as usize,
            list,
            "the block list was not reused"
        );
        for b in &second {
            if let LogBlock::Owned(buf) = b {
                assert!(
                    owned.contains(&buf.as_ptr()),
                    "a log buffer was allocated anew"
                );
            }
        }
    }
}
