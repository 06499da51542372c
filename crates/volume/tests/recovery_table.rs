//! Recovery's decision table, exercised on real engine-written journals:
//! a damaged LAST transaction is a torn tail (discarded, read-write open
//! works); a damaged transaction with a valid one after it is corruption in
//! the middle (read-write open fails with a clear error, read-only open
//! serves the transactions before it).

use std::sync::Arc;
use std::time::Duration;

use jbdev_device::fault::FaultDevice;
use jbdev_device::mem::MemDevice;
use jbdev_volume::journal::format::{read_header, BLOCKTYPE_DESCRIPTOR};
use jbdev_volume::{FormatOptions, OpenOptions, Volume, VolumeError, WriteFlags};

const BS: usize = 4096;
const DATA: u64 = 1 << 20;
const JOURNAL: u64 = 256 << 10;

/// Formats a volume, commits `n` FUA writes (block i gets byte i+1) and cuts
/// power before any checkpoint. Returns the durable image and the journal's
/// byte offset in it.
fn crashed_image(n: u8) -> (Vec<u8>, usize) {
    let dev = Arc::new(FaultDevice::new(BS as u64 + JOURNAL + DATA, 512));
    let mut f = FormatOptions::new(DATA);
    f.journal_bytes = Some(JOURNAL);
    Volume::format_device(dev.clone(), None, &f).unwrap();
    let opts = OpenOptions {
        checkpoint_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let v = Volume::open_device(dev.clone(), None, &opts).unwrap();
    for i in 0..n {
        v.write_at(&[i + 1; BS], u64::from(i) * BS as u64, WriteFlags::FUA)
            .unwrap();
    }
    dev.cut_power();
    let image = dev.durable_image();
    drop(v);
    (image, BS)
}

/// Journal byte offsets of the descriptor blocks, in log order.
fn descriptors(image: &[u8], journal_off: usize) -> Vec<usize> {
    (1..(JOURNAL as usize / BS))
        .map(|pos| journal_off + pos * BS)
        .filter(|&off| {
            read_header(&image[off..off + BS]).is_some_and(|h| h.block_type == BLOCKTYPE_DESCRIPTOR)
        })
        .collect()
}

fn open(image: Vec<u8>, read_only: bool) -> jbdev_volume::Result<Volume> {
    let opts = OpenOptions {
        read_only,
        ..Default::default()
    };
    Volume::open_device(Arc::new(MemDevice::from_image(image, 512)), None, &opts)
}

fn block(v: &Volume, i: u64) -> u8 {
    let mut b = vec![0u8; BS];
    v.read_at(&mut b, i * BS as u64).unwrap();
    assert!(b.iter().all(|&x| x == b[0]), "block {i} is not uniform");
    b[0]
}

#[test]
fn intact_log_replays_every_transaction() {
    let (image, j) = crashed_image(4);
    assert_eq!(descriptors(&image, j).len(), 4);
    let v = open(image, false).unwrap();
    assert_eq!(v.recovery_report().transactions_replayed, 4);
    for i in 0..4 {
        assert_eq!(block(&v, i), i as u8 + 1);
    }
}

#[test]
fn damaged_last_transaction_is_a_torn_tail() {
    let (mut image, j) = crashed_image(4);
    let last = *descriptors(&image, j).last().unwrap();
    // Damage the data block that follows the last descriptor.
    image[last + BS + 100] ^= 0x55;
    let v = open(image, false).expect("a torn tail must not prevent a read-write open");
    let r = v.recovery_report();
    assert_eq!(r.transactions_replayed, 3);
    assert!(r.end.contains("torn"), "{}", r.end);
    for i in 0..3 {
        assert_eq!(block(&v, i), i as u8 + 1);
    }
    assert_eq!(
        block(&v, 3),
        0,
        "the torn transaction must not be half-applied"
    );
}

#[test]
fn damaged_middle_transaction_refuses_read_write_and_rescues_read_only() {
    let (mut image, j) = crashed_image(4);
    let second = descriptors(&image, j)[1];
    image[second + BS + 7] ^= 0x01;
    match open(image.clone(), false) {
        Err(VolumeError::CorruptJournal(msg)) => {
            assert!(
                msg.contains("read-only"),
                "the error should say how to rescue data: {msg}"
            )
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a read-write open must refuse a journal corrupt in the middle"),
    }
    let v = open(image.clone(), true).expect("read-only open rescues data");
    assert_eq!(
        block(&v, 0),
        1,
        "the transaction before the damage is served"
    );
    assert_eq!(block(&v, 1), 0, "the damaged transaction is not applied");
    assert_eq!(block(&v, 2), 0, "nothing after the damage is applied");
    assert!(matches!(
        v.write_at(&[1], 0, WriteFlags::NONE),
        Err(VolumeError::ReadOnly)
    ));
    drop(v);
    // A read-only open changed nothing on disk: still corrupt for read-write.
    assert!(matches!(
        open(image, false),
        Err(VolumeError::CorruptJournal(_))
    ));
}

#[test]
fn damaged_descriptor_in_the_middle_is_detected_too() {
    let (mut image, j) = crashed_image(3);
    let first = descriptors(&image, j)[0];
    image[first + 40] ^= 0x80; // inside the first tag
    assert!(matches!(
        open(image, false),
        Err(VolumeError::CorruptJournal(_))
    ));
}

/// A commit larger than one journal write run (256 blocks) goes out as
/// several FUA writes in parallel; after a power cut it replays whole, and
/// a torn copy of it (some runs lost) is discarded whole.
#[test]
fn large_commit_written_in_parallel_runs_replays_whole_or_not_at_all() {
    const BIG_JOURNAL: u64 = 16 << 20;
    let dev = Arc::new(FaultDevice::new(BS as u64 + BIG_JOURNAL + (8 << 20), 512));
    let mut f = FormatOptions::new(8 << 20);
    f.journal_bytes = Some(BIG_JOURNAL);
    Volume::format_device(dev.clone(), None, &f).unwrap();
    let opts = OpenOptions {
        checkpoint_interval: Duration::from_secs(3600),
        direct_write_threshold: u64::MAX,
        ..Default::default()
    };
    let v = Volume::open_device(dev.clone(), None, &opts).unwrap();
    let blocks = 700usize;
    let data: Vec<u8> = (0..blocks * BS).map(|i| (i / BS) as u8 ^ 0x5a).collect();
    v.write_at(&data, 0, WriteFlags::FUA).unwrap();
    dev.cut_power();
    let image = dev.durable_image();
    drop(v);
    let v = open(image.clone(), false).unwrap();
    assert_eq!(v.recovery_report().transactions_replayed, 1);
    let mut back = vec![0u8; blocks * BS];
    v.read_at(&mut back, 0).unwrap();
    assert!(back == data, "the large transaction did not replay intact");
    drop(v);
    // Lose one data block of the middle run: the whole transaction goes.
    let mut torn = image;
    let victim = BS + (1 + 300) * BS; // journal block 301: inside the second run
    torn[victim..victim + BS].fill(0);
    let v = open(torn, false).unwrap();
    assert_eq!(
        v.recovery_report().transactions_replayed,
        0,
        "{}",
        v.recovery_report().end
    );
    v.read_at(&mut back, 0).unwrap();
    assert!(
        back.iter().all(|&b| b == 0),
        "a torn large transaction was half-applied"
    );
}
