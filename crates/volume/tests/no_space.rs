//! A backing store that runs out of space (a sparse image file on a full
//! file system, a thin pool). A full store is not an abort (ARCHITECTURE,
//! failure semantics): the write that needs space it cannot have fails
//! with `ENOSPC` (`VolumeError::StoreFull`), journaled writes go on while
//! the journal has room, reads and flushes keep working, and once there is
//! space again writes resume on the same open volume, with nothing lost.
//! Only a direct write over blocks whose journaled copies it cancelled
//! still aborts (the checkpoint must not skip them: see
//! `Engine::direct_under`).

mod common;

use std::sync::Arc;

use common::{quiet_open_options, stamped, SECTOR};
use jbdev_device::fault::FaultDevice;
use jbdev_device::BlockDevice;
use jbdev_volume::{FormatOptions, OpenOptions, Volume, VolumeError, WriteFlags};

const BS: u64 = 4096;
const DATA: u64 = 1 << 20;
const JOURNAL: u64 = 256 << 10;
/// Home block 0 on the device: after the volume superblock and the
/// internal journal.
const DATA_OFF: u64 = BS + JOURNAL;
/// Home blocks below this one are "allocated"; the store is full past it.
const FULL_AT_BLOCK: u64 = 128;

fn full_device() -> Arc<FaultDevice> {
    let dev = Arc::new(FaultDevice::new(DATA + JOURNAL + 64 * 1024, SECTOR as u32));
    let mut f = FormatOptions::new(DATA);
    f.journal_bytes = Some(JOURNAL);
    Volume::format_device(dev.clone() as Arc<dyn BlockDevice>, None, &f).expect("format");
    dev
}

fn options() -> OpenOptions {
    OpenOptions {
        // 64 KiB writes go straight home; smaller ones are journaled.
        direct_write_threshold: 64 * 1024,
        ..quiet_open_options()
    }
}

fn read(vol: &Volume, block: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    vol.read_at(&mut b, block * BS).expect("reads keep working");
    b
}

/// Writes acknowledged before the store filled: (home block, data).
type Acked = Vec<(u64, Vec<u8>)>;

fn is_enospc(e: &VolumeError) -> bool {
    e.errno() == libc::ENOSPC
}

/// Acknowledged writes: journaled FUA blocks 0..8 (below the full line and
/// above it: block 200's home is not allocated yet), and a direct 64 KiB
/// write at block 64 made durable by a flush.
fn acknowledged(vol: &Volume) -> Acked {
    let mut done = Vec::new();
    for (i, block) in (0..8).chain([200]).enumerate() {
        let data = stamped(10 + i as u64, block * BS, BS as usize);
        vol.write_at(&data, block * BS, WriteFlags::FUA)
            .expect("journaled FUA write");
        done.push((block, data));
    }
    let big = stamped(30, 64 * BS, 64 * 1024);
    vol.write_at(&big, 64 * BS, WriteFlags::NONE)
        .expect("direct write");
    vol.flush().expect("flush");
    done.push((64, big));
    done
}

/// A volume on a fault device with [`acknowledged`] writes done, and the
/// store then full past [`FULL_AT_BLOCK`].
fn volume_on_a_full_store() -> (Arc<FaultDevice>, Volume, Acked) {
    let dev = full_device();
    let vol = Volume::open_device(dev.clone(), None, &options()).unwrap();
    let done = acknowledged(&vol);
    dev.set_full_from(Some(DATA_OFF + FULL_AT_BLOCK * BS));
    (dev, vol, done)
}

fn assert_all_there(vol: &Volume, done: &Acked, when: &str) {
    for (block, data) in done {
        assert!(
            read(vol, *block, data.len()) == *data,
            "{when}: acknowledged write at block {block} lost"
        );
    }
}

fn is_store_full(e: &VolumeError) -> bool {
    matches!(e, VolumeError::StoreFull { cause_errno, .. } if *cause_errno == libc::ENOSPC)
        && is_enospc(e)
}

/// A direct write into unallocated space meets the full store: it fails
/// alone; the volume goes on, and the same write succeeds once there is room.
#[test]
fn a_direct_write_that_finds_the_store_full_fails_alone_and_succeeds_once_there_is_room() {
    let (dev, vol, mut done) = volume_on_a_full_store();

    let big = stamped(40, 160 * BS, 64 * 1024);
    let e = vol
        .write_at(&big, 160 * BS, WriteFlags::NONE)
        .expect_err("a write past the full line cannot succeed");
    assert!(is_store_full(&e), "{e:?}");
    assert!(e.to_string().contains("No space left"), "{e}");
    assert!(e.to_string().contains("free space"), "{e}");

    // Not an abort: journaled writes and flushes go on.
    let small = stamped(41, 2 * BS, BS as usize);
    vol.write_at(&small, 2 * BS, WriteFlags::FUA)
        .expect("a journaled write after the failed direct one");
    vol.flush().expect("flush after the failed direct write");
    done.retain(|(b, _)| *b != 2);
    done.push((2, small));
    assert_all_there(&vol, &done, "after the failed direct write");

    // Room again: the same write succeeds, without a reopen.
    dev.set_full_from(None);
    vol.write_at(&big, 160 * BS, WriteFlags::FUA)
        .expect("the direct write once there is room");
    done.push((160, big));
    vol.close().expect("a clean close");
    let vol = Volume::open_device(dev.clone(), None, &options()).expect("reopen");
    assert!(vol.recovery_report().was_clean);
    assert_all_there(&vol, &done, "after reopening");
    vol.close().expect("close");
}

/// A direct write over a block whose journaled copy is still in the log
/// (the checkpoint cannot take it home: the store is full) cancels that
/// copy before its own I/O; when the I/O fails the copy is the only good
/// data, so the volume aborts and the next open (with room) keeps it.
#[test]
fn a_direct_write_over_journaled_copies_that_finds_the_store_full_aborts() {
    let (dev, vol, mut done) = volume_on_a_full_store();
    let copy = stamped(50, 150 * BS, BS as usize);
    vol.write_at(&copy, 150 * BS, WriteFlags::FUA)
        .expect("journaled FUA write");
    done.push((150, copy));

    let big = stamped(51, 144 * BS, 64 * 1024);
    let e = vol
        .write_at(&big, 144 * BS, WriteFlags::NONE)
        .expect_err("a write past the full line cannot succeed");
    assert!(matches!(e, VolumeError::Device(_)), "{e:?}");
    assert!(is_enospc(&e), "{e:?}");
    let e = vol
        .write_at(&[7u8; 4096], 2 * BS, WriteFlags::FUA)
        .expect_err("no write after the abort");
    assert!(
        matches!(&e, VolumeError::Aborted { cause_errno, .. } if *cause_errno == libc::ENOSPC),
        "{e:?}"
    );
    assert!(e.to_string().contains("No space left"), "{e}");
    assert_all_there(&vol, &done, "after the abort");
    let _ = vol.close();

    dev.set_full_from(None);
    let vol = Volume::open_device(dev.clone(), None, &options()).expect("reopen");
    assert_all_there(&vol, &done, "after reopening");
    vol.close().expect("close");
}

/// FUA writes of blocks whose home is not allocated yet, one at a time,
/// until one fails (at most `limit`): the acknowledged ones and the error.
fn fill_the_journal(vol: &Volume, first_id: u64, limit: u64) -> (Acked, VolumeError) {
    let mut acked = Vec::new();
    for i in 0..limit {
        let block = 210 + i % 40;
        let data = stamped(first_id + i, block * BS, BS as usize);
        match vol.write_at(&data, block * BS, WriteFlags::FUA) {
            Ok(()) => acked.push((block, data)),
            Err(e) => return (acked, e),
        }
    }
    panic!(
        "{limit} FUA writes into a 256 KiB journal, none refused: the full store was never felt"
    );
}

/// The newest write of each block.
fn newest(acked: &Acked) -> Acked {
    let mut by_block = std::collections::BTreeMap::new();
    for (b, d) in acked {
        by_block.insert(*b, d.clone());
    }
    by_block.into_iter().collect()
}

/// The checkpoint meets the full store while taking journaled blocks home:
/// it keeps them in the journal and retries; writes are acknowledged while
/// the journal has room and then fail with ENOSPC, on the open volume;
/// once there is room the checkpoint resumes and so do writes.
#[test]
fn a_full_store_stops_writes_when_the_journal_fills_and_they_resume_once_there_is_room() {
    let (dev, vol, done) = volume_on_a_full_store();
    let (acked, e) = fill_the_journal(&vol, 1000, 1000);
    assert!(
        acked.len() >= 5,
        "writes stop only once the journal is full: {} acknowledged",
        acked.len()
    );
    assert!(is_store_full(&e), "{e:?}");
    assert!(e.to_string().contains("No space left"), "{e}");
    assert!(vol.stats().store_full);
    assert!(vol.stats().store_full_attempts >= 1);
    // Reads and flushes work; everything acknowledged is there.
    vol.flush().expect("flush while the store is full");
    assert_all_there(&vol, &done, "while full");
    assert_all_there(&vol, &newest(&acked), "while full");
    // Still full: the next write fails too (the checkpoint tried again).
    let before = vol.stats().store_full_attempts;
    let e = vol
        .write_at(&[1u8; 4096], 5 * BS, WriteFlags::NONE)
        .expect_err("still full");
    assert!(is_store_full(&e), "{e:?}");
    assert!(vol.stats().store_full_attempts > before);

    // Room again: writes succeed on the same volume, many more than the
    // journal holds (so the checkpoint resumed and emptied it).
    dev.set_full_from(None);
    let mut acked = acked;
    for i in 0..300u64 {
        let block = 210 + i % 40;
        let data = stamped(5000 + i, block * BS, BS as usize);
        vol.write_at(&data, block * BS, WriteFlags::FUA)
            .unwrap_or_else(|e| panic!("write {i} after space was freed: {e}"));
        acked.push((block, data));
    }
    assert!(!vol.stats().store_full);
    vol.close().expect("a clean close once there is room");
    let vol = Volume::open_device(dev.clone(), None, &options()).expect("reopen");
    assert!(vol.recovery_report().was_clean);
    assert_all_there(&vol, &done, "after reopening");
    assert_all_there(&vol, &newest(&acked), "after reopening");
    vol.close().expect("close");
}

/// Closing while the store is full: the final checkpoint cannot finish,
/// close says so, and the journal keeps the blocks: after a power cut and
/// with room again, the next open replays them.
#[test]
fn closing_while_the_store_is_full_keeps_the_journal_for_the_next_open() {
    let (dev, vol, done) = volume_on_a_full_store();
    let e = vol.close().expect_err("the final checkpoint cannot finish");
    assert!(is_store_full(&e), "{e:?}");
    assert!(e.to_string().contains("next open replays"), "{e}");
    // It is closed: the advice is to open it again, not that it stays open.
    assert!(
        e.to_string().contains("then open it again") && !e.to_string().contains("stays open"),
        "{e}"
    );
    let image = dev.durable_image();
    let dev = Arc::new(FaultDevice::from_image(image, SECTOR as u32));
    let vol = Volume::open_device(dev.clone(), None, &options()).expect("reopen");
    assert!(vol.recovery_report().transactions_replayed > 0);
    assert_all_there(&vol, &done, "after recovery");
    vol.close().expect("close");
}

/// A home flush that fails with ENOSPC (a file system that found no room
/// for written data at writeback: NFS, FUSE, a thin store) is not a full
/// store to retry: the device keeps a failed flush failed, so the volume
/// aborts at once, and says ENOSPC, which tells the operator (and an NBD
/// client) to free space and reopen. It used to be taken for a full store
/// ("writes resume by themselves"), and the retry then aborted with EIO
/// (session 22's adversarial pass). Nothing acknowledged is lost.
#[test]
fn a_home_flush_that_finds_no_space_aborts_with_enospc() {
    let dev = full_device();
    let vol = Volume::open_device(dev.clone(), None, &options()).unwrap();
    let done = acknowledged(&vol);
    // Journaled blocks the final checkpoint takes home and flushes.
    let mut more = Vec::new();
    for block in 8..16 {
        let data = stamped(50 + block, block * BS, BS as usize);
        vol.write_at(&data, block * BS, WriteFlags::FUA).unwrap();
        more.push((block, data));
    }
    dev.fail_flush_with(1, libc::ENOSPC);
    let e = vol.close().expect_err("a home flush failed");
    assert_eq!(e.errno(), libc::ENOSPC, "{e:?}");
    let image = dev.durable_image();
    let dev = Arc::new(FaultDevice::from_image(image, SECTOR as u32));
    let vol = Volume::open_device(dev, None, &options()).expect("reopen");
    assert_all_there(&vol, &done, "after recovery");
    assert_all_there(&vol, &more, "after recovery");
    vol.close().expect("close");
}
