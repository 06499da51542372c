//! Recovery: scan, revoke, replay — jbd2's three passes.
//!
//! **Scan** walks the log from the superblock's `s_start`, expecting
//! transaction `s_sequence`, and verifies every block of every transaction:
//! descriptor and revoke tail checksums, each data block's tag checksum,
//! the commit block checksum. It stops at the first block that does not
//! carry the expected sequence.
//!
//! Decision table for a transaction that fails verification (or has no
//! commit block before the log ends):
//!
//! | later transaction with a valid block exists? | verdict       | read-write open | read-only open |
//! |----------------------------------------------|---------------|-----------------|----------------|
//! | no                                           | torn tail     | discard it      | discard it     |
//! | yes                                          | corrupt middle| error           | replay before it |
//!
//! A later transaction can only exist if this one's commit was flushed
//! before it was written (commits are never pipelined), so a valid later
//! block proves this transaction was complete and has since been damaged.
//!
//! **Revoke** collects, per home block, the newest transaction that revoked
//! it. **Replay** applies, per home block, the newest logged copy that no
//! revoke of the same or a later transaction cancels.

use std::collections::HashMap;

use jbdev_device::AlignedBuf;

use crate::format::{
    self, CommitBlock, DescriptorBlock, JournalSuperblock, RevokeBlock, BLOCKTYPE_COMMIT,
    BLOCKTYPE_DESCRIPTOR, BLOCKTYPE_REVOKE, TAG_FLAG_ESCAPE,
};
use crate::{next_pos, JournalError, JournalRegion, Result};

/// A block logged by a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoggedBlock {
    /// Home block number (volume block).
    pub home: u64,
    /// Position of the copy in the journal.
    pub pos: u32,
    /// The copy had its leading magic zeroed and must be unescaped.
    pub escaped: bool,
}

/// A complete, verified transaction found by the scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScannedTxn {
    pub sequence: u32,
    pub start_pos: u32,
    /// Position after the commit block.
    pub end_pos: u32,
    pub blocks: Vec<LoggedBlock>,
    pub revokes: Vec<u64>,
    pub commit_sec: u64,
}

/// How the scan ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanEnd {
    /// The superblock says the journal is clean (s_start = 0).
    CleanJournal,
    /// The log ended at a transaction boundary.
    End,
    /// The last transaction is incomplete or torn and is discarded.
    TornTail {
        sequence: u32,
        pos: u32,
        reason: String,
    },
    /// A transaction in the middle of the log is damaged.
    CorruptMiddle {
        sequence: u32,
        pos: u32,
        reason: String,
    },
}

/// What the scan found.
#[derive(Clone, Debug)]
pub struct Scan {
    pub superblock: JournalSuperblock,
    pub txns: Vec<ScannedTxn>,
    pub end: ScanEnd,
    /// Sequence number for the first transaction written after recovery.
    /// Like jbd2, one past the first sequence that was not found, so stale
    /// blocks of a discarded transaction can never be mistaken for new ones.
    pub next_sequence: u32,
    pub blocks_read: u64,
}

/// One home block to restore from the journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayEntry {
    pub home: u64,
    pub pos: u32,
    pub escaped: bool,
    pub sequence: u32,
}

/// Why a transaction failed verification.
struct Bad {
    pos: u32,
    reason: String,
}

/// Pass 1: scan the log. `progress` receives the number of blocks read so far.
pub fn scan(region: &JournalRegion, progress: &mut dyn FnMut(u64)) -> Result<Scan> {
    let sb = region.read_superblock()?;
    let mut out = Scan {
        superblock: sb.clone(),
        txns: Vec::new(),
        end: ScanEnd::CleanJournal,
        next_sequence: sb.sequence,
        blocks_read: 0,
    };
    if sb.is_clean() {
        return Ok(out);
    }
    let (first, len) = (sb.first, sb.max_len);
    if sb.first == 0 || sb.first >= sb.max_len || sb.start < sb.first || sb.start >= sb.max_len {
        return Err(JournalError::Inconsistent(format!(
            "s_start {} / s_first {} outside the {}-block journal",
            sb.start, sb.first, sb.max_len
        )));
    }
    if sb.max_len != region.len_blocks() || sb.block_size != region.block_size() {
        return Err(JournalError::Inconsistent(format!(
            "journal superblock says {} blocks of {} bytes, the volume expects {} of {}",
            sb.max_len,
            sb.block_size,
            region.len_blocks(),
            region.block_size()
        )));
    }
    let usable = u64::from(len - first);
    let seed = sb.csum_seed();
    let bs = sb.block_size as usize;
    let mut buf = AlignedBuf::zeroed(bs);
    let mut pos = sb.start;
    let mut sequence = sb.sequence;
    let mut walked: u64 = 0;

    'txns: loop {
        let start_pos = pos;
        let mut txn = ScannedTxn {
            sequence,
            start_pos,
            end_pos: start_pos,
            blocks: Vec::new(),
            revokes: Vec::new(),
            commit_sec: 0,
        };
        let mut first_block = true;
        let failure: Bad = loop {
            if walked >= usable {
                return Err(JournalError::Inconsistent(format!(
                    "log starting at block {} wraps onto itself in transaction {sequence}",
                    sb.start
                )));
            }
            region.read_blocks(pos, &mut buf)?;
            walked += 1;
            out.blocks_read += 1;
            progress(out.blocks_read);
            let header = format::read_header(&buf);
            let header = match header {
                Some(h) if h.sequence == sequence => h,
                _ if first_block => {
                    // Clean end of the log at a transaction boundary.
                    out.end = ScanEnd::End;
                    break 'txns;
                }
                _ => {
                    break Bad {
                        pos,
                        reason: "no commit block".into(),
                    }
                }
            };
            first_block = false;
            let here = pos;
            pos = next_pos(pos, first, len);
            match header.block_type {
                BLOCKTYPE_DESCRIPTOR => {
                    let d = match DescriptorBlock::decode(&buf, seed) {
                        Ok(d) => d,
                        Err(e) => {
                            break Bad {
                                pos: here,
                                reason: format!("descriptor: {e}"),
                            }
                        }
                    };
                    let mut bad = None;
                    for tag in &d.tags {
                        if walked >= usable {
                            bad = Some(Bad {
                                pos,
                                reason: "descriptor runs past the log".into(),
                            });
                            break;
                        }
                        region.read_blocks(pos, &mut buf)?;
                        walked += 1;
                        out.blocks_read += 1;
                        let sum = format::data_block_checksum(seed, sequence, &buf);
                        if sum != tag.checksum {
                            bad = Some(Bad {
                                pos,
                                reason: format!(
                                    "data block for home block {} fails its checksum ({sum:#010x} != {:#010x})",
                                    tag.home_block, tag.checksum
                                ),
                            });
                            break;
                        }
                        txn.blocks.push(LoggedBlock {
                            home: tag.home_block,
                            pos,
                            escaped: tag.flags & TAG_FLAG_ESCAPE != 0,
                        });
                        pos = next_pos(pos, first, len);
                    }
                    if let Some(b) = bad {
                        break b;
                    }
                }
                BLOCKTYPE_REVOKE => match RevokeBlock::decode(&buf, seed) {
                    Ok(r) => txn.revokes.extend(r.blocks),
                    Err(e) => {
                        break Bad {
                            pos: here,
                            reason: format!("revoke block: {e}"),
                        }
                    }
                },
                BLOCKTYPE_COMMIT => match CommitBlock::decode(&buf, seed) {
                    Ok(c) => {
                        txn.commit_sec = c.commit_sec;
                        txn.end_pos = pos;
                        out.txns.push(txn);
                        sequence = sequence.wrapping_add(1);
                        continue 'txns;
                    }
                    Err(e) => {
                        break Bad {
                            pos: here,
                            reason: format!("commit block: {e}"),
                        }
                    }
                },
                other => {
                    break Bad {
                        pos: here,
                        reason: format!("unknown block type {other}"),
                    }
                }
            }
        };
        // Transaction `sequence` failed: torn tail or corrupt middle?
        let later = find_later_block(region, &sb, sequence)?;
        out.end = match later {
            None => ScanEnd::TornTail {
                sequence,
                pos: failure.pos,
                reason: failure.reason,
            },
            Some(at) => ScanEnd::CorruptMiddle {
                sequence,
                pos: failure.pos,
                reason: format!(
                    "{} (transaction {} found at block {at})",
                    failure.reason,
                    sequence.wrapping_add(1)
                ),
            },
        };
        break;
    }
    let end_seq = match &out.end {
        ScanEnd::TornTail { sequence, .. } | ScanEnd::CorruptMiddle { sequence, .. } => *sequence,
        _ => sequence,
    };
    out.next_sequence = end_seq.wrapping_add(1);
    Ok(out)
}

/// Looks through the whole log for a verified descriptor, revoke or commit
/// block of a transaction newer than `sequence`.
fn find_later_block(
    region: &JournalRegion,
    sb: &JournalSuperblock,
    sequence: u32,
) -> Result<Option<u32>> {
    const CHUNK: u32 = 64;
    let bs = sb.block_size as usize;
    let seed = sb.csum_seed();
    let mut buf = AlignedBuf::zeroed(bs * CHUNK as usize);
    let mut pos = sb.first;
    while pos < sb.max_len {
        let n = CHUNK.min(sb.max_len - pos);
        region.read_blocks(pos, &mut buf[..n as usize * bs])?;
        for i in 0..n as usize {
            let block = &buf[i * bs..(i + 1) * bs];
            let Some(h) = format::read_header(block) else {
                continue;
            };
            // Sequence numbers only grow; `h.sequence - sequence` in 1..2^31
            // means "written after".
            let delta = h.sequence.wrapping_sub(sequence);
            if delta == 0 || delta >= 1 << 31 {
                continue;
            }
            let valid = match h.block_type {
                BLOCKTYPE_DESCRIPTOR => DescriptorBlock::decode(block, seed).is_ok(),
                BLOCKTYPE_REVOKE => RevokeBlock::decode(block, seed).is_ok(),
                BLOCKTYPE_COMMIT => CommitBlock::decode(block, seed).is_ok(),
                _ => false,
            };
            if valid {
                return Ok(Some(pos + i as u32));
            }
        }
        pos += n;
    }
    Ok(None)
}

/// Passes 2 and 3 (planning): the revoke table and, per home block, the copy
/// to restore. `txns` must be in log order. Returns entries sorted by home
/// block, and how many logged copies revokes cancelled.
pub fn replay_plan(txns: &[ScannedTxn]) -> (Vec<ReplayEntry>, u64) {
    // Pass 2: newest revoking transaction per home block.
    let mut revoked: HashMap<u64, u32> = HashMap::new();
    for t in txns {
        for &home in &t.revokes {
            revoked.insert(home, t.sequence);
        }
    }
    // Pass 3: newest copy not cancelled by a revoke of the same or a later
    // transaction (jbd2's rule). Transactions are in log order, so a later
    // copy replaces an earlier one.
    let mut latest: HashMap<u64, ReplayEntry> = HashMap::new();
    let mut cancelled = 0;
    for t in txns {
        for b in &t.blocks {
            if let Some(&rseq) = revoked.get(&b.home) {
                if rseq.wrapping_sub(t.sequence) < 1 << 31 {
                    cancelled += 1;
                    continue;
                }
            }
            latest.insert(
                b.home,
                ReplayEntry {
                    home: b.home,
                    pos: b.pos,
                    escaped: b.escaped,
                    sequence: t.sequence,
                },
            );
        }
    }
    let mut plan: Vec<ReplayEntry> = latest.into_values().collect();
    plan.sort_by_key(|e| e.home);
    (plan, cancelled)
}

/// Reads the journal copy of a replay entry into `buf`, unescaped.
pub fn read_replay_block(region: &JournalRegion, e: &ReplayEntry, buf: &mut [u8]) -> Result<()> {
    region.read_blocks(e.pos, buf)?;
    if e.escaped {
        format::unescape(buf);
    }
    Ok(())
}
