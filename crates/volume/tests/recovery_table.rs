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
use jbdev_volume::superblock::VolumeSuperblock;
use jbdev_volume::{FormatOptions, OpenOptions, Volume, VolumeError, WriteFlags};

const BS: usize = 4096;
const DATA: u64 = 1 << 20;
const JOURNAL: u64 = 256 << 10;

/// Formats a volume, commits `n` FUA writes (block i gets byte i+1) and cuts
/// power before any checkpoint. Returns the durable image and the journal's
/// byte offset in it.
fn crashed_image(n: u8) -> (Vec<u8>, usize) {
    let writes: Vec<(u64, u8)> = (0..n).map(|i| (u64::from(i), i + 1)).collect();
    crashed_image_of(&writes)
}

/// [`crashed_image`] of one FUA write of a whole block per `(block,
/// byte)`, in order.
fn crashed_image_of(writes: &[(u64, u8)]) -> (Vec<u8>, usize) {
    let dev = Arc::new(FaultDevice::new(BS as u64 + JOURNAL + DATA, 512));
    let mut f = FormatOptions::new(DATA);
    f.journal_bytes = Some(JOURNAL);
    Volume::format_device(dev.clone(), None, &f).unwrap();
    let opts = OpenOptions {
        checkpoint_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let v = Volume::open_device(dev.clone(), None, &opts).unwrap();
    for &(b, x) in writes {
        v.write_at(&[x; BS], b * BS as u64, WriteFlags::FUA)
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

/// Damage in a transaction the checkpoint already wrote home loses
/// nothing. The crash came after the checkpoint wrote transactions 1 to 3
/// home and recorded its mark, before it moved the journal's tail; then
/// transaction 2's data block rotted. Session 28's pass: every open called
/// the journal a stale old copy, and the `journal reset` that advised
/// dropped transactions 4 to 6, acknowledged and not home. Replaying
/// transaction 1 (before the damage) would roll block 0 back.
#[test]
fn damage_in_what_the_checkpoint_wrote_home_loses_nothing() {
    let writes = [
        (0, 0x11),
        (0, 0x22),
        (1, 0x33),
        (2, 0x44),
        (3, 0x55),
        (4, 0x66),
    ];
    let (mut image, j) = crashed_image_of(&writes);
    let descs = descriptors(&image, j);
    assert_eq!(descs.len(), 6);
    let third = read_header(&image[descs[2]..descs[2] + BS])
        .unwrap()
        .sequence;
    // What the checkpoint did: transactions 1-3 home, then its mark.
    let mut sb = VolumeSuperblock::decode(&image[..VolumeSuperblock::ENCODED_LEN]).unwrap();
    let data = sb.data_offset_bytes as usize;
    image[data..data + BS].fill(0x22);
    image[data + BS..data + 2 * BS].fill(0x33);
    sb.checkpoint_sequence = third;
    sb.encode(&mut image[..VolumeSuperblock::ENCODED_LEN]);
    // Transaction 2's data block rots.
    image[descs[1] + BS + 7] ^= 0x01;
    let expect = [0x22, 0x33, 0x44, 0x55, 0x66];
    let v = open(image.clone(), true).expect("a read-only open");
    for (i, &x) in expect.iter().enumerate() {
        assert_eq!(block(&v, i as u64), x, "read-only, block {i}");
    }
    drop(v);
    let v = open(image, false).expect("damage in what is home refuses nothing");
    assert_eq!(v.recovery_report().transactions_replayed, 3);
    for (i, &x) in expect.iter().enumerate() {
        assert_eq!(block(&v, i as u64), x, "block {i}");
    }
}

fn open_rescuing(dev: Arc<FaultDevice>) -> jbdev_volume::Result<Volume> {
    let opts = OpenOptions {
        discard_after_damage: true,
        checkpoint_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    Volume::open_device(dev, None, &opts)
}

/// `jbdev journal rescue` (session 27): a read-write open told to discard
/// what follows mid-log damage keeps the transactions before it for good,
/// and a later crash brings none of the discarded ones back.
#[test]
fn a_rescue_keeps_what_is_before_the_damage_and_discards_the_rest() {
    let (mut image, j) = crashed_image(4);
    let second = descriptors(&image, j)[1];
    image[second + BS + 7] ^= 0x01;
    let dev = Arc::new(FaultDevice::from_image(image, 512));
    let v = open_rescuing(dev.clone()).expect("the rescue opens read-write");
    assert!(
        v.recovery_report().end.contains("found at block"),
        "{}",
        v.recovery_report().end
    );
    assert_eq!(v.recovery_report().transactions_replayed, 1);
    assert_eq!(block(&v, 0), 1, "the transaction before the damage is kept");
    for i in 1..4 {
        assert_eq!(
            block(&v, i),
            0,
            "block {i}: a discarded transaction applied"
        );
    }
    // New writes go after the discarded transactions' sequences: a crash
    // now replays them, and none of the old ones.
    v.write_at(&[0x77; BS], BS as u64, WriteFlags::FUA).unwrap();
    v.write_at(&[0x78; BS], 2 * BS as u64, WriteFlags::FUA)
        .unwrap();
    dev.cut_power();
    let image = dev.durable_image();
    drop(v);
    let v = open(image, false).expect("a plain read-write open after the rescue");
    assert_eq!(block(&v, 0), 1);
    assert_eq!(block(&v, 1), 0x77);
    assert_eq!(block(&v, 2), 0x78);
    assert_eq!(block(&v, 3), 0, "a discarded transaction came back");
}

/// The rescue cut short at every device operation leaves a volume that
/// either is still refused read-write (and a rescue run again completes) or
/// opens with the state the rescue keeps: never a half-applied or lost
/// transaction before the damage, never one after it.
#[test]
fn a_rescue_cut_short_at_every_operation_can_be_run_again() {
    let (mut image, j) = crashed_image(4);
    let second = descriptors(&image, j)[1];
    image[second + BS + 7] ^= 0x01;
    let full = Arc::new(FaultDevice::from_image(image.clone(), 512));
    drop(open_rescuing(full.clone()).unwrap());
    let ops = full.ops();
    assert!(ops > 3, "{ops}");
    let mut rescued_early = 0;
    for n in 0..ops {
        let dev = Arc::new(FaultDevice::from_image(image.clone(), 512));
        dev.crash_after_ops(n);
        drop(open_rescuing(dev.clone()));
        let after = dev.durable_image();
        // Whatever the cut left: a read-only open serves the kept state.
        let v = open(after.clone(), true).unwrap_or_else(|e| panic!("cut at {n}: {e}"));
        assert_eq!(block(&v, 0), 1, "cut at {n}");
        for i in 1..4 {
            assert_eq!(block(&v, i), 0, "cut at {n}: block {i}");
        }
        drop(v);
        if open(after.clone(), false).is_ok() {
            rescued_early += 1;
        }
        // Run again: completes, with the same state.
        let dev = Arc::new(FaultDevice::from_image(after, 512));
        let v = open_rescuing(dev).unwrap_or_else(|e| panic!("cut at {n}, run again: {e}"));
        assert_eq!(block(&v, 0), 1, "cut at {n}, run again");
        for i in 1..4 {
            assert_eq!(block(&v, i), 0, "cut at {n}, run again: block {i}");
        }
    }
    eprintln!("{ops} cut points, {rescued_early} left a volume that opens plainly");
}
