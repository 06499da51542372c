//! FUA writes that go straight home (at least `direct_write_threshold`):
//! one over blocks nothing in the log covers is a single force-unit-access
//! write (no commit, no flush), and each kind survives a power cut that
//! loses every write no flush or FUA covered.

mod common;

use std::sync::Arc;

use jbdev_device::fault::FaultDevice;
use jbdev_device::BlockDevice;
use jbdev_volume::{FormatOptions, OpenOptions, Volume, WriteFlags};

const BS: u64 = 4096;
const DATA: u64 = 4 << 20;
const JOURNAL: u64 = 512 << 10;
const SECTOR: u32 = 512;
const BIG: usize = 64 << 10;

fn opts() -> OpenOptions {
    OpenOptions {
        // No background commits or checkpoints: only what the test causes.
        direct_write_threshold: BIG as u64,
        ..common::quiet_open_options()
    }
}

fn fresh() -> Arc<FaultDevice> {
    let dev = Arc::new(FaultDevice::new(DATA + JOURNAL + 64 * 1024, SECTOR));
    let mut f = FormatOptions::new(DATA);
    f.journal_bytes = Some(JOURNAL);
    Volume::format_device(dev.clone() as Arc<dyn BlockDevice>, None, &f).expect("format");
    dev
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// What reads back at `off` after a power cut now and recovery.
fn after_power_cut(dev: &FaultDevice, vol: Volume, off: u64, len: usize) -> Vec<u8> {
    dev.cut_power();
    drop(vol);
    let dev = Arc::new(FaultDevice::from_image(dev.durable_image(), SECTOR));
    let vol = Volume::open_device(dev, None, &opts()).expect("recovery");
    let mut back = vec![0u8; len];
    vol.read_at(&mut back, off).expect("read");
    back
}

#[test]
fn a_lone_direct_fua_write_is_one_durable_write() {
    let dev = fresh();
    let vol = Volume::open_device(dev.clone(), None, &opts()).expect("open");
    let off = 32 * BS;
    let data = pattern(BIG, 1);
    let before = vol.stats();
    vol.write_at(&data, off, WriteFlags::FUA).expect("write");
    let after = vol.stats();
    assert_eq!(
        after.direct_writes,
        before.direct_writes + 1,
        "must go home directly"
    );
    assert_eq!(
        after.device_flushes, before.device_flushes,
        "a FUA write over blocks no journal copy covers needs no flush"
    );
    assert_eq!(after.commits, before.commits, "and no commit");
    assert!(
        after_power_cut(&dev, vol, off, BIG) == data,
        "lost an acknowledged FUA write"
    );
}

#[test]
fn a_direct_fua_write_over_journaled_blocks_makes_its_revokes_durable() {
    let dev = fresh();
    let vol = Volume::open_device(dev.clone(), None, &opts()).expect("open");
    let off = 32 * BS;
    // A journaled copy of one block of the range, durable in the log.
    vol.write_at(&pattern(BS as usize, 2), off + 3 * BS, WriteFlags::FUA)
        .expect("journaled write");
    let data = pattern(BIG, 3);
    let before = vol.stats();
    vol.write_at(&data, off, WriteFlags::FUA).expect("write");
    assert!(
        vol.stats().device_flushes > before.device_flushes,
        "the revoke of the journaled copy must be committed (after a home flush)"
    );
    // Replay must not put the older journaled copy back over the new data.
    assert!(
        after_power_cut(&dev, vol, off, BIG) == data,
        "replay resurrected a revoked copy"
    );
}

#[test]
fn a_direct_fua_write_with_journaled_edges_makes_them_durable() {
    let dev = fresh();
    let vol = Volume::open_device(dev.clone(), None, &opts()).expect("open");
    // Unaligned at both ends: the partial edge blocks are journaled, the
    // aligned middle goes home.
    let off = 32 * BS + 100;
    let data = pattern(BIG + 2 * BS as usize, 4);
    let before = vol.stats();
    vol.write_at(&data, off, WriteFlags::FUA).expect("write");
    assert_eq!(vol.stats().direct_writes, before.direct_writes + 1);
    assert!(
        after_power_cut(&dev, vol, off, data.len()) == data,
        "lost the journaled edges of an acknowledged FUA write"
    );
}
