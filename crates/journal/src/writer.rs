//! Lays out one transaction as journal blocks.
//!
//! Order within a transaction: revoke blocks, then for every run of up to
//! [`DescriptorBlock::capacity`] data blocks a descriptor followed by those
//! data blocks, then the commit block. Recovery does not depend on the order
//! of revoke and descriptor blocks (revokes are collected in their own pass),
//! only on the commit block coming last.

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

/// Builds the blocks of transaction `sequence`: `data` is (home block number,
/// block content) in the order to log them; `revokes` are home block numbers.
pub fn build_transaction<'a>(
    sb: &JournalSuperblock,
    sequence: u32,
    data: &[(u64, &'a [u8])],
    revokes: &[u64],
    now: SystemTime,
) -> Vec<LogBlock<'a>> {
    let bs = sb.block_size as usize;
    let seed = sb.csum_seed();
    let mut out = Vec::with_capacity(transaction_blocks(bs, data.len(), revokes.len()));
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
    }
    .encode(seed, &mut c);
    out.push(LogBlock::Owned(c));
    out
}

/// Writes `blocks` to the log starting at `pos`, splitting at the end of the
/// circular log and into runs of at most `max_iov` blocks. `prio` is
/// re-evaluated before every run, so a commit that somebody starts waiting
/// for mid-way is finished at urgent priority. Returns the position after
/// the last block.
pub fn write_log_blocks(
    region: &JournalRegion,
    first: u32,
    mut pos: u32,
    blocks: &[LogBlock<'_>],
    prio: &dyn Fn() -> IoPriority,
) -> Result<u32> {
    const MAX_IOV: usize = 256;
    let len = region.len_blocks();
    let mut i = 0;
    while i < blocks.len() {
        let room = (len - pos) as usize;
        let n = (blocks.len() - i).min(room).min(MAX_IOV);
        let iov: Vec<IoSlice<'_>> = blocks[i..i + n]
            .iter()
            .map(|b| IoSlice::new(b.bytes()))
            .collect();
        region.write_blocks(pos, &iov, prio())?;
        i += n;
        pos += n as u32;
        if pos >= len {
            pos = first;
        }
    }
    Ok(pos)
}

/// Advances `pos` by `n` log blocks.
pub fn advance(pos: u32, n: usize, first: u32, len_blocks: u32) -> u32 {
    let usable = u64::from(len_blocks - first);
    (((u64::from(pos - first)) + n as u64) % usable) as u32 + first
}
