//! A backing store that runs out of space (a sparse image file on a full
//! file system, a thin pool): the write that meets it fails with `ENOSPC`,
//! the journal aborts (ARCHITECTURE, failure semantics) and every later
//! write reports `ENOSPC` too, so a client can tell "free space, then
//! reopen" from a broken device; reads keep working; and once there is
//! space again, the next open loses nothing that was acknowledged.

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

/// A direct write into unallocated space meets the full store.
#[test]
fn a_direct_write_that_finds_the_store_full_fails_with_enospc_and_so_does_every_later_write() {
    let (dev, vol, done) = volume_on_a_full_store();

    let big = stamped(40, 160 * BS, 64 * 1024);
    let e = vol
        .write_at(&big, 160 * BS, WriteFlags::NONE)
        .expect_err("a write past the full line cannot succeed");
    assert!(matches!(e, VolumeError::Device(_)), "{e:?}");
    assert!(is_enospc(&e), "the failing write says ENOSPC: {e:?}");
    assert!(e.to_string().contains("No space left"), "{e}");

    // The journal aborted; later writes and flushes say why, with ENOSPC,
    // even a journaled one whose own I/O would have fitted.
    let e = vol
        .write_at(&[7u8; 4096], 2 * BS, WriteFlags::FUA)
        .expect_err("no write after the abort");
    assert!(
        matches!(&e, VolumeError::Aborted { cause_errno, .. } if *cause_errno == libc::ENOSPC),
        "{e:?}"
    );
    assert!(is_enospc(&e), "{e:?}");
    assert!(e.to_string().contains("No space left"), "{e}");
    assert!(vol.flush().is_err_and(|e| is_enospc(&e)));
    assert_all_there(&vol, &done, "after the abort");
    let _ = vol.close();

    // Space again: the next open replays the journal; nothing lost.
    dev.set_full_from(None);
    let vol = Volume::open_device(dev.clone(), None, &options()).expect("reopen");
    assert_all_there(&vol, &done, "after reopening");
    vol.write_at(&[8u8; 4096], 3 * BS, WriteFlags::FUA)
        .expect("writable again");
    vol.close().expect("close");
}

/// The checkpoint meets the full store while taking journaled blocks home:
/// the blocks stay in the journal, so nothing is lost, and writers learn
/// of it through ENOSPC.
#[test]
fn a_checkpoint_that_finds_the_store_full_aborts_with_enospc_and_the_journal_keeps_the_data() {
    let (dev, vol, done) = volume_on_a_full_store();
    // Closing checkpoints everything: block 200 cannot go home.
    let e = vol.close().expect_err("the final checkpoint cannot finish");
    assert!(is_enospc(&e), "{e:?}");
    // A power cut now, then space again: the journal still holds block 200.
    let image = dev.durable_image();
    let dev = Arc::new(FaultDevice::from_image(image, SECTOR as u32));
    let vol = Volume::open_device(dev.clone(), None, &options()).expect("reopen");
    assert!(vol.recovery_report().transactions_replayed > 0);
    assert_all_there(&vol, &done, "after recovery");
    vol.close().expect("close");
}
