//! Journaled blocks carry checksums their writers computed (ARCHITECTURE
//! 12a): whole blocks, blocks a partial write completed from home or from
//! the log, blocks that need escaping (which the commit sums itself) and
//! multi-block writes all commit transactions that recovery accepts — if a
//! sum were wrong, recovery would take the transaction for torn and drop
//! it, and the acknowledged data would be gone after the power cut.

mod common;

use std::sync::Arc;

use jbdev_device::fault::FaultDevice;
use jbdev_device::BlockDevice;
use jbdev_journal::format::JBD2_MAGIC;
use jbdev_volume::{FormatOptions, Volume, WriteFlags};

const BS: usize = 4096;
const DATA: u64 = 4 << 20;
const JOURNAL: u64 = 1 << 20;
const SECTOR: u32 = 512;

// Nothing goes home before the power cut: everything read back after it
// comes from replaying the log.
use common::quiet_open_options as opts;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29) ^ seed.wrapping_mul(7) ^ (i >> 9) as u8)
        .collect()
}

#[test]
fn every_kind_of_journaled_block_survives_a_power_cut() {
    let dev = Arc::new(FaultDevice::new(DATA + JOURNAL + 64 * 1024, SECTOR));
    let mut f = FormatOptions::new(DATA);
    f.journal_bytes = Some(JOURNAL);
    Volume::format_device(dev.clone() as Arc<dyn BlockDevice>, None, &f).expect("format");
    let vol = Volume::open_device(dev.clone(), None, &opts()).expect("open");
    // The model: what every byte must read back as.
    let mut model = vec![0u8; DATA as usize];
    let mut write = |vol: &Volume, off: usize, data: &[u8]| {
        vol.write_at(data, off as u64, WriteFlags::FUA)
            .expect("write");
        model[off..off + data.len()].copy_from_slice(data);
    };
    // Whole blocks, one and several per write.
    write(&vol, 0, &pattern(BS, 1));
    write(&vol, 8 * BS, &pattern(16 * BS, 2));
    // Blocks that start with the journal magic: logged escaped.
    let mut magic = pattern(3 * BS, 3);
    for b in magic.chunks_mut(BS) {
        b[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
    }
    write(&vol, 40 * BS, &magic);
    // Partial blocks over home (zeros), over a journaled block, and one
    // that makes a block begin with the magic.
    write(&vol, 64 * BS + 100, &pattern(700, 4));
    write(&vol, 8 * BS + 1000, &pattern(2 * BS, 5));
    write(&vol, 80 * BS, &JBD2_MAGIC.to_be_bytes());
    // Rewrites of journaled blocks, whole and partial.
    write(&vol, 9 * BS, &pattern(BS, 6));
    write(&vol, 41 * BS + 4, &pattern(BS - 8, 7));
    let written = vol.stats().blocks_journaled;
    assert!(written >= 27, "the writes were journaled: {written}");
    dev.cut_power();
    drop(vol);
    let dev = Arc::new(FaultDevice::from_image(dev.durable_image(), SECTOR));
    let vol = Volume::open_device(dev, None, &opts()).expect("recovery");
    let mut back = vec![0u8; 96 * BS];
    vol.read_at(&mut back, 0).expect("read");
    for (i, (got, want)) in back.chunks(BS).zip(model[..96 * BS].chunks(BS)).enumerate() {
        assert!(got == want, "block {i} lost or wrong after recovery");
    }
}
