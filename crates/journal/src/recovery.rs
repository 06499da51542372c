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
//! A transaction verifies when its descriptor, revoke and commit blocks
//! pass their checksums, every data block passes its tag checksum, and the
//! data blocks match the commit block's data digest if it carries one (tag
//! checksums are crc32c, which data made of crc32c-framed records defeats;
//! see [`crate::writer`]).
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
use crate::writer::{self, DataDigest};
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
        let mut digest = DataDigest::new(seed, sequence);
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
                        digest.update(tag.home_block, &buf);
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
                    // IMPORTANT: tag checksums (crc32c) cannot tell a torn
                    // data block made of crc32c-framed records from the
                    // real one; the digest can (see `writer`).
                    Ok(_) if writer::commit_digest(&buf).is_some_and(|d| d != digest.finish()) => {
                        break Bad {
                            pos: here,
                            reason: "the data blocks do not match the commit block's digest \
                                     (a data block is torn or stale)"
                                .into(),
                        }
                    }
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

#[cfg(test)]
mod tests {
    use std::io::IoSlice;
    use std::sync::Arc;
    use std::time::SystemTime;

    use jbdev_device::mem::MemDevice;
    use jbdev_device::{FlushCoalescer, IoPriority};

    use super::*;
    use crate::writer;

    const BS: usize = 4096;
    const SECTOR: usize = 512;
    const LEN_BLOCKS: u32 = 16;

    /// A block of 512-byte records that each end with the crc32c of the
    /// rest (like the crash tests' sector stamps or many log formats).
    fn framed(version: u8) -> Vec<u8> {
        let mut b = vec![0u8; BS];
        for (i, s) in b.chunks_mut(SECTOR).enumerate() {
            for (j, x) in s[..SECTOR - 4].iter_mut().enumerate() {
                *x = version.wrapping_mul(31) ^ (i as u8).wrapping_mul(7) ^ j as u8;
            }
            let crc = crc32c::crc32c(&s[..SECTOR - 4]);
            s[SECTOR - 4..].copy_from_slice(&crc.to_le_bytes());
        }
        b
    }

    fn journal() -> (JournalRegion, JournalSuperblock) {
        let dev = Arc::new(MemDevice::new(u64::from(LEN_BLOCKS) * BS as u64, 512));
        let region = JournalRegion::new(
            dev,
            Arc::new(FlushCoalescer::new()),
            0,
            BS as u32,
            LEN_BLOCKS,
        )
        .unwrap();
        let mut sb = JournalSuperblock::new(BS as u32, LEN_BLOCKS, [7; 16]);
        sb.start = sb.first;
        sb.sequence = 40;
        region.write_superblock_full(&sb).unwrap();
        (region, sb)
    }

    /// Writes transaction `sb.sequence` with one data block for home block
    /// 9 at `sb.start`; returns the position of the data block.
    fn write_txn(region: &JournalRegion, sb: &JournalSuperblock, data: &[u8]) -> u32 {
        let log = writer::build_transaction(sb, sb.sequence, &[(9, data)], &[], SystemTime::now());
        writer::write_log_blocks(
            region,
            sb.first,
            sb.start,
            &log,
            &|| IoPriority::Urgent,
            false,
        )
        .unwrap();
        sb.start + 1
    }

    /// Regression (crash tests, "MISPLACED" sectors after recovery): a data
    /// block torn between the new version and a stale one from an older lap
    /// of the log passes its crc32c tag checksum when both versions are made
    /// of crc32c-framed records; the commit block's digest must catch it.
    #[test]
    fn torn_data_block_of_crc_framed_records_is_a_torn_tail() {
        let (region, sb) = journal();
        let stale = framed(1);
        let new = framed(2);
        let pos = write_txn(&region, &sb, &new);
        // The power cut kept the new descriptor and commit block but only
        // the first half of the data block; the rest is the stale copy.
        let mut torn = new.clone();
        torn[BS / 2..].copy_from_slice(&stale[BS / 2..]);
        assert_ne!(torn, new);
        let seed = sb.csum_seed();
        assert_eq!(
            format::data_block_checksum(seed, sb.sequence, &torn),
            format::data_block_checksum(seed, sb.sequence, &new),
            "crc32c is blind to this tear (why the digest exists)"
        );
        region
            .write_blocks(pos, &[IoSlice::new(&torn)], IoPriority::Urgent)
            .unwrap();
        let scan = scan(&region, &mut |_| {}).unwrap();
        assert!(scan.txns.is_empty(), "a torn transaction was accepted");
        match &scan.end {
            ScanEnd::TornTail { sequence, .. } => assert_eq!(*sequence, sb.sequence),
            other => panic!("expected a torn tail, got {other:?}"),
        }
        assert_eq!(scan.next_sequence, sb.sequence + 1);
    }

    #[test]
    fn intact_transaction_with_digest_is_replayed() {
        let (region, sb) = journal();
        let new = framed(2);
        let pos = write_txn(&region, &sb, &new);
        let scan = scan(&region, &mut |_| {}).unwrap();
        assert_eq!(scan.end, ScanEnd::End);
        assert_eq!(scan.txns.len(), 1);
        let (plan, _) = replay_plan(&scan.txns);
        assert_eq!(plan.len(), 1);
        assert_eq!((plan[0].home, plan[0].pos), (9, pos));
        let mut buf = vec![0u8; BS];
        read_replay_block(&region, &plan[0], &mut buf).unwrap();
        assert_eq!(buf, new);
    }

    /// Commit blocks without the digest marker (older jbdev, or another jbd2
    /// writer) are still accepted on their checksums alone.
    #[test]
    fn commit_block_without_digest_is_accepted() {
        let (region, sb) = journal();
        let new = framed(3);
        let pos = write_txn(&region, &sb, &new);
        let commit_pos = pos + 1;
        let mut c = vec![0u8; BS];
        region.read_blocks(commit_pos, &mut c).unwrap();
        assert!(writer::commit_digest(&c).is_some());
        format::CommitBlock {
            sequence: sb.sequence,
            commit_sec: 1,
            commit_nsec: 2,
        }
        .encode(sb.csum_seed(), &mut c);
        assert!(writer::commit_digest(&c).is_none());
        region
            .write_blocks(commit_pos, &[IoSlice::new(&c)], IoPriority::Urgent)
            .unwrap();
        let scan = scan(&region, &mut |_| {}).unwrap();
        assert_eq!(scan.end, ScanEnd::End);
        assert_eq!(scan.txns.len(), 1);
    }

    #[test]
    fn digest_depends_on_content_order_and_home() {
        let (a, b) = (framed(1), framed(2));
        let d = |blocks: &[(u64, &[u8])]| {
            let mut g = writer::DataDigest::new(5, 6);
            for (h, x) in blocks {
                g.update(*h, x);
            }
            g.finish()
        };
        let base = d(&[(1, &a), (2, &b)]);
        assert_ne!(base, d(&[(2, &b), (1, &a)]));
        assert_ne!(base, d(&[(1, &a), (3, &b)]));
        assert_ne!(base, d(&[(1, &a)]));
        let mut torn = b.clone();
        torn[..SECTOR].copy_from_slice(&a[..SECTOR]);
        assert_ne!(base, d(&[(1, &a), (2, &torn)]));
        assert_eq!(base, d(&[(1, &a), (2, &b)]));
    }
}
