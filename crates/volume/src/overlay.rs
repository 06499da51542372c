//! The overlay: the newest content of every block that has a copy in the
//! journal (running, committing or committed-but-not-checkpointed
//! transactions), and the direct home writes in flight.
//!
//! It is sharded by block number so that readers and writers of different
//! regions never touch the same lock or cache line (a shared line per I/O
//! is a scaling wall). Shards cover
//! `GRANULE` consecutive blocks each, so a small multi-block request usually
//! locks one shard.
//!
//! Invariants, per shard:
//! * `version` grows on every change of what a read of a block in the shard
//!   would return (insert, removal, start of a direct write). A writer that
//!   read a block's home content without a lock re-checks it under the lock
//!   and retries if it changed.
//! * `Entry::newest` is the newest journaled content of the block; `None`
//!   once it is home and durable, or after a direct write superseded it.
//! * `Entry::cancel_below`: journaled versions older than this were
//!   superseded by a direct write and must never be checkpointed; the entry
//!   (a tombstone) is kept until the transaction holding the revoke record,
//!   `tomb_tid`, has been checkpointed.

use std::collections::HashMap;
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use jbdev_device::AlignedBuf;

use crate::bufpool::SharedBuf;
use jbdev_journal::writer::BlockSums;
use parking_lot::Mutex;

use crate::lockorder::{Rank, Ranked};

pub type Lba = u64;
pub type Tid = u64;

/// Shard indices of one request; small requests keep them inline (no heap
/// allocation per request).
pub type ShardIds = smallvec::SmallVec<[usize; 8]>;

/// Consecutive blocks per shard granule.
pub const GRANULE: u64 = 16;
/// Number of shards (power of two).
pub const SHARDS: usize = 256;

/// One block of data inside a shared buffer.
#[derive(Clone)]
pub struct BlockRef {
    pub buf: SharedBuf,
    pub offset: usize,
}

impl BlockRef {
    pub fn bytes(&self, block_size: usize) -> &[u8] {
        &self.buf[self.offset..self.offset + block_size]
    }

    /// The journal sums of the block, if its writer computed them.
    pub fn sums(&self, block_size: usize) -> Option<BlockSums> {
        self.buf.sums(self.offset / block_size)
    }

    /// Whether the block holds zeroes a zeroing request put there (not a
    /// plain write of zeroes).
    pub fn zeroed(&self, block_size: usize) -> bool {
        self.buf.zeroed(self.offset / block_size)
    }
}

/// A journaled version of a block.
#[derive(Clone)]
pub struct Version {
    pub ver: u64,
    pub data: BlockRef,
}

#[derive(Default)]
pub struct Entry {
    pub newest: Option<Version>,
    pub cancel_below: u64,
    pub tomb_tid: Option<Tid>,
}

/// A caller's own buffer, handed to the volume so that a large write is not
/// copied on its way home ([`crate::Volume::write_owned`]).
pub type CallerBuf = Box<dyn AsRef<[u8]> + Send + Sync>;

/// The bytes of a direct write in flight.
pub enum DirectData {
    /// An aligned engine buffer, reused for the next large write.
    Engine(AlignedBuf),
    /// `range` of the caller's buffer, written home as it is.
    Caller(CallerBuf, std::ops::Range<usize>),
}

impl std::ops::Deref for DirectData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            DirectData::Engine(b) => b,
            DirectData::Caller(b, r) => &(**b).as_ref()[r.clone()],
        }
    }
}

/// A direct (home) write or zeroing in flight over `[start, end)`.
pub struct Pending {
    pub id: u64,
    pub start: Lba,
    pub end: Lba,
    pub ver: u64,
    /// The data, starting at block `start`; `None` for zeroes.
    pub data: Option<Arc<DirectData>>,
}

#[derive(Default)]
pub struct Shard {
    pub map: HashMap<Lba, Entry>,
    pub version: u64,
    pub pending: Vec<Pending>,
    /// Blocks of journaled writes waiting for a direct write in flight to
    /// add its revoke (`Engine::wait_direct_writes`): a direct write that
    /// arrives meanwhile over one of them waits until that writer has
    /// logged its copy (ARCHITECTURE 23), so a stream of direct writes
    /// cannot keep it waiting. A block appears once per waiting writer.
    pub waiting: Vec<Lba>,
}

/// Where the current content of a block is.
pub enum Source {
    Journaled(BlockRef),
    /// In a direct write in flight: buffer and byte offset.
    Pending(Arc<DirectData>, usize),
    Zero,
    Home,
}

impl Shard {
    /// Whether a direct write in flight covers `lba` while the log holds a
    /// copy of it (or a revoke): that direct write will add a revoke for
    /// the block once its home I/O is done.
    pub fn direct_over_logged(&self, lba: Lba) -> bool {
        self.map.contains_key(&lba) && self.pending.iter().any(|p| p.start <= lba && lba < p.end)
    }

    /// The current content of `lba` as a read right now would return it.
    pub fn source(&self, lba: Lba, block_size: usize) -> Source {
        let journaled = self.map.get(&lba).and_then(|e| e.newest.as_ref());
        let pending = self
            .pending
            .iter()
            .filter(|p| p.start <= lba && lba < p.end)
            .max_by_key(|p| p.ver);
        match (journaled, pending) {
            (Some(j), Some(p)) if j.ver > p.ver => Source::Journaled(j.data.clone()),
            (Some(j), None) => Source::Journaled(j.data.clone()),
            (_, Some(p)) => match &p.data {
                Some(buf) => Source::Pending(buf.clone(), ((lba - p.start) as usize) * block_size),
                None => Source::Zero,
            },
            (None, None) => Source::Home,
        }
    }

    pub fn bump(&mut self) -> u64 {
        self.version += 1;
        self.version
    }
}

/// The sharded overlay.
pub struct Overlay {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
}

impl Default for Overlay {
    fn default() -> Self {
        Self::new()
    }
}

impl Overlay {
    pub fn new() -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| CachePadded::new(Mutex::new(Shard::default())))
                .collect(),
        }
    }

    /// Shard index of a block.
    pub fn shard_of(lba: Lba) -> usize {
        let g = lba / GRANULE;
        // Mix the granule number so strided access patterns spread out.
        (g.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % SHARDS
    }

    pub fn lock(&self, idx: usize) -> Ranked<'_, Shard> {
        Ranked::lock(&self.shards[idx], Rank::Shard)
    }

    pub fn lock_block(&self, lba: Lba) -> Ranked<'_, Shard> {
        self.lock(Self::shard_of(lba))
    }

    /// Sorted, de-duplicated shard indices covering `[start, end)`.
    pub fn shards_for_range(start: Lba, end: Lba) -> ShardIds {
        if end <= start {
            return ShardIds::new();
        }
        let granules = (end - 1) / GRANULE - start / GRANULE + 1;
        if granules >= SHARDS as u64 * 4 {
            return (0..SHARDS).collect();
        }
        let mut v: ShardIds = (start / GRANULE..=(end - 1) / GRANULE)
            .map(|g| Self::shard_of(g * GRANULE))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// `[start, end)` cut at granule boundaries, as `(shard, first, end)`
    /// pieces sorted by shard: the blocks of the range that one shard owns
    /// are the pieces with its index, found without hashing every block
    /// once per shard.
    pub fn pieces_by_shard(start: Lba, end: Lba) -> Vec<(usize, Lba, Lba)> {
        let mut v = Vec::with_capacity(((end.saturating_sub(start)) / GRANULE + 2) as usize);
        let mut b = start;
        while b < end {
            let hi = ((b / GRANULE + 1) * GRANULE).min(end);
            v.push((Self::shard_of(b), b, hi));
            b = hi;
        }
        v.sort_unstable();
        v
    }

    /// Sorted, de-duplicated shard indices of a set of blocks.
    pub fn shards_for_blocks(lbas: impl Iterator<Item = Lba>) -> ShardIds {
        let mut v: ShardIds = lbas.map(Self::shard_of).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_by_shard_cover_the_range_once_each_in_its_shard() {
        for (start, end) in [
            (0, 1),
            (5, 17),
            (15, 16),
            (16, 48),
            (3, 4099),
            (1000, 1000),
            (7, 9000),
        ] {
            let pieces = Overlay::pieces_by_shard(start, end);
            let mut seen: Vec<Lba> = Vec::new();
            for w in pieces.windows(2) {
                assert!(w[0].0 <= w[1].0, "sorted by shard");
            }
            for &(s, lo, hi) in &pieces {
                assert!(lo < hi && hi - lo <= GRANULE);
                for b in lo..hi {
                    assert_eq!(Overlay::shard_of(b), s);
                    seen.push(b);
                }
            }
            seen.sort_unstable();
            assert_eq!(seen, (start..end).collect::<Vec<_>>());
            let mut shards: Vec<usize> = pieces.iter().map(|p| p.0).collect();
            shards.dedup();
            if end - start < GRANULE * SHARDS as u64 * 4 {
                assert_eq!(
                    shards.as_slice(),
                    Overlay::shards_for_range(start, end).as_slice()
                );
            }
        }
    }
}
