//! Recovery checks every data block's tag checksum (session 24's mutation pass).
//!
//! Kills mutant M07: recovery ignoring a data block's tag checksum
//! (`if sum != tag.checksum` never taken). jbdev's own commits also carry
//! the `JBDX` data digest, which catches the same damage, so every existing
//! test passed with the tag check gone. But recovery accepts commit blocks
//! without a digest (jbd2/e2fsprogs-written logs, older jbdev writers:
//! `commit_block_without_digest_is_accepted`), and for those the tag
//! checksum is the only thing that tells a torn or rotted data block from
//! the logged one. Without it, replay writes the damaged block home.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::SystemTime;

use jbdev_device::mem::MemDevice;
use jbdev_device::{BlockDevice, FlushCoalescer, IoPriority};
use jbdev_journal::format::{CommitBlock, JournalSuperblock};
use jbdev_journal::recovery::{scan, ScanEnd};
use jbdev_journal::{writer, JournalRegion};

const BS: usize = 4096;
const LEN_BLOCKS: u32 = 16;

fn journal() -> (JournalRegion, JournalSuperblock) {
    let dev: Arc<dyn BlockDevice> =
        Arc::new(MemDevice::new(u64::from(LEN_BLOCKS) * BS as u64, 512));
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

/// Writes one transaction (descriptor at `sb.start`, data for home block 9
/// at `sb.start + 1`, commit at `sb.start + 2`) whose commit block carries
/// no data digest, as jbd2 writes it. Returns the data block's position.
fn write_digestless_txn(region: &JournalRegion, sb: &JournalSuperblock, data: &[u8]) -> u32 {
    let log = writer::build_transaction(sb, sb.sequence, 0, &[(9, data)], &[], SystemTime::now());
    writer::write_log_blocks(
        region,
        sb.first,
        sb.start,
        &log,
        &|| IoPriority::Urgent,
        false,
    )
    .unwrap();
    let data_pos = sb.start + 1;
    let commit_pos = data_pos + 1;
    let mut c = vec![0u8; BS];
    region.read_blocks(commit_pos, &mut c).unwrap();
    assert!(
        writer::commit_digest(&c).is_some(),
        "layout: commit block expected here"
    );
    CommitBlock {
        sequence: sb.sequence,
        commit_sec: 1,
        commit_nsec: 2,
        overlap: 0,
    }
    .encode(sb.csum_seed(), &mut c);
    assert!(writer::commit_digest(&c).is_none());
    region
        .write_blocks(commit_pos, &[IoSlice::new(&c)], IoPriority::Urgent)
        .unwrap();
    data_pos
}

fn data() -> Vec<u8> {
    (0..BS).map(|i| (i * 37 % 251) as u8 ^ 0x5a).collect()
}

#[test]
fn an_intact_digestless_transaction_is_replayed() {
    let (region, sb) = journal();
    write_digestless_txn(&region, &sb, &data());
    let s = scan(&region, &mut |_| {}).unwrap();
    assert_eq!(s.end, ScanEnd::End);
    assert_eq!(s.txns.len(), 1);
}

#[test]
fn a_damaged_data_block_under_a_digestless_commit_is_a_torn_tail() {
    let (region, sb) = journal();
    let good = data();
    let pos = write_digestless_txn(&region, &sb, &good);
    // One sector of the data block never reached the disk (torn write) or
    // rotted: the descriptor and commit block verify, the tag does not.
    let mut torn = good.clone();
    torn[1024..1536].fill(0);
    region
        .write_blocks(pos, &[IoSlice::new(&torn)], IoPriority::Urgent)
        .unwrap();
    let s = scan(&region, &mut |_| {}).unwrap();
    assert!(
        s.txns.is_empty(),
        "a transaction whose data block fails its tag checksum was accepted for replay: {:?}",
        s.end
    );
    assert!(
        matches!(s.end, ScanEnd::TornTail { .. }),
        "expected a torn tail, got {:?}",
        s.end
    );
}
