//! Growing a volume (`jbdev grow`, [`jbdev_volume::grow`]): a grown image
//! file keeps its data and serves the added range as zeroes; a journal that
//! still holds committed writes replays after a grow; a crash at any step of
//! a grow leaves the old size or the new one, never a volume that does not
//! open; and what must be refused is refused (open elsewhere, shrinking, a
//! size that is not whole blocks, an image file without a size).

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{formatted_fault_device, pattern, quiet_open_options};
use jbdev_device::fault::FaultDevice;
use jbdev_device::{BlockDevice, DeviceError};
use jbdev_volume::superblock::VolumeSuperblock;
use jbdev_volume::{grow, FormatOptions, Grown, OpenOptions, Volume, VolumeError, WriteFlags};

const MIB: u64 = 1 << 20;
const BS: u64 = 4096;

fn small_file_volume(path: &Path, size: u64) {
    let mut f = FormatOptions::new(size);
    f.journal_bytes = Some(MIB);
    Volume::create(path, &f, &quiet_open_options())
        .unwrap()
        .close()
        .unwrap();
}

fn read(vol: &Volume, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    vol.read_at(&mut b, off).unwrap();
    b
}

#[test]
fn a_grown_image_file_keeps_its_data_and_serves_the_added_range() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = dir.path().join("v.img");
    small_file_volume(&path, 8 * MIB);
    let vol = Volume::open(&path, &quiet_open_options()).unwrap();
    let last = pattern(BS as usize, 1);
    vol.write_at(&last, 8 * MIB - BS, WriteFlags::FUA).unwrap();
    vol.close().unwrap();
    let file_before = std::fs::metadata(&path).unwrap().len();

    let g = grow(&path, Some(16 * MIB), false, &OpenOptions::default()).unwrap();
    assert_eq!(g.old_size, 8 * MIB);
    assert_eq!(g.new_size, 16 * MIB);
    let file_after = std::fs::metadata(&path).unwrap().len();
    assert_eq!(g.extended_to, Some(file_after));
    assert_eq!(file_after, file_before + 8 * MIB);

    let vol = Volume::open(&path, &quiet_open_options()).unwrap();
    assert_eq!(vol.size(), 16 * MIB);
    assert_eq!(read(&vol, 8 * MIB - BS, BS as usize), last);
    assert!(read(&vol, 8 * MIB, (8 * MIB) as usize)
        .iter()
        .all(|&b| b == 0));
    let end = pattern(BS as usize, 2);
    vol.write_at(&end, 16 * MIB - BS, WriteFlags::FUA).unwrap();
    vol.close().unwrap();
    let vol = Volume::open(&path, &quiet_open_options()).unwrap();
    assert_eq!(read(&vol, 16 * MIB - BS, BS as usize), end);
    assert_eq!(read(&vol, 8 * MIB - BS, BS as usize), last);
    vol.close().unwrap();

    // The same size again changes nothing.
    let again = grow(&path, Some(16 * MIB), false, &OpenOptions::default()).unwrap();
    assert_eq!(
        again,
        Grown {
            old_size: 16 * MIB,
            new_size: 16 * MIB,
            extended_to: None,
            allocated: false
        }
    );
}

#[test]
fn growing_refuses_an_open_volume_a_shrink_a_partial_block_and_a_file_without_a_size() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = dir.path().join("v.img");
    small_file_volume(&path, 8 * MIB);
    let opts = OpenOptions::default();

    let vol = Volume::open(&path, &quiet_open_options()).unwrap();
    match grow(&path, Some(16 * MIB), false, &opts) {
        Err(VolumeError::Device(DeviceError::Busy(m))) => println!("open elsewhere: {m}"),
        r => panic!("a grow of an open volume: {r:?}"),
    }
    vol.close().unwrap();

    for (size, what) in [
        (Some(4 * MIB), "shrink"),
        (Some(8 * MIB + 512), "partial block"),
        (None, "no size for a file"),
    ] {
        match grow(&path, size, false, &opts) {
            Err(VolumeError::InvalidArgument(m)) => println!("{what}: {m}"),
            r => panic!("{what}: {r:?}"),
        }
    }
    // Nothing was changed by the refusals.
    let vol = Volume::open(&path, &quiet_open_options()).unwrap();
    assert_eq!(vol.size(), 8 * MIB);
    vol.close().unwrap();
}

/// A volume whose journal still holds committed writes (a crash before
/// the checkpoint) is grown: the next open replays them onto the grown
/// volume.
#[test]
fn a_journal_holding_committed_writes_replays_after_a_grow() {
    let dev = formatted_fault_device(8 * MIB, MIB);
    let vol = Volume::open_device(dev.clone(), None, &quiet_open_options()).unwrap();
    let data = pattern(4 * BS as usize, 3);
    vol.write_at(&data, 8 * MIB - 4 * BS, WriteFlags::FUA)
        .unwrap();
    let image = dev.crash_image(7);
    drop(vol);

    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = dir.path().join("crashed.img");
    std::fs::write(&path, &image).unwrap();
    let g = grow(&path, Some(12 * MIB), false, &OpenOptions::default()).unwrap();
    assert_eq!((g.old_size, g.new_size), (8 * MIB, 12 * MIB));

    let vol = Volume::open(&path, &quiet_open_options()).unwrap();
    assert!(
        vol.recovery_report().blocks_replayed > 0,
        "nothing was replayed: {:?}",
        vol.recovery_report()
    );
    assert_eq!(vol.size(), 12 * MIB);
    assert_eq!(read(&vol, 8 * MIB - 4 * BS, 4 * BS as usize), data);
    vol.close().unwrap();
}

/// The superblock is the commit point: a power cut at every device
/// operation of a grow leaves a volume that opens with the old size or the
/// new one and the data it had.
#[test]
fn a_crash_at_any_step_of_a_grow_leaves_the_old_or_the_new_size() {
    let old = 4 * MIB;
    let new = 6 * MIB;
    let dev = formatted_fault_device(old, MIB);
    let vol = Volume::open_device(dev.clone(), None, &quiet_open_options()).unwrap();
    let data = pattern(BS as usize, 4);
    vol.write_at(&data, old - BS, WriteFlags::FUA).unwrap();
    vol.close().unwrap();
    let mut image = dev.durable_image();
    let before = VolumeSuperblock::decode(&image[..512]).unwrap();
    // The storage grown (as a file or RBD image would be) to hold `new`,
    // its added part holding old bytes (a file longer than its volume).
    image.resize((before.data_offset_bytes + new) as usize, 0xee);
    let stale_to = image.len() as u64;

    let mut sizes = Vec::new();
    for ops in 0.. {
        let dev = Arc::new(FaultDevice::from_image(image.clone(), 512));
        dev.crash_after_ops(ops);
        let r = jbdev_volume::grow::grow_on(dev.as_ref(), "fault", &before, new, false, stale_to);
        let done = r.is_ok();
        for seed in 0..4 {
            let after = Arc::new(FaultDevice::from_image(dev.crash_image(seed), 512));
            let vol =
                Volume::open_device(after as Arc<dyn BlockDevice>, None, &quiet_open_options())
                    .unwrap_or_else(|e| panic!("power cut after {ops} op(s), seed {seed}: {e}"));
            assert!(
                vol.size() == old || vol.size() == new,
                "power cut after {ops} op(s): size {}",
                vol.size()
            );
            assert!(!done || vol.size() == new, "a finished grow was lost");
            assert_eq!(read(&vol, old - BS, BS as usize), data);
            if vol.size() == new {
                // The added range reads as zeroes, never the old bytes
                // (session 26's pass: they were exposed).
                let added = read(&vol, old, (new - old) as usize);
                assert!(
                    added.iter().all(|&b| b == 0),
                    "power cut after {ops} op(s): the added range holds old bytes"
                );
            }
            sizes.push(vol.size());
            vol.close().unwrap();
        }
        if done {
            break;
        }
        assert!(ops < 16, "the grow never finished");
    }
    assert!(sizes.contains(&old) && sizes.contains(&new), "{sizes:?}");
}

/// A volume created over an image file that held data (`format --force`
/// over a larger, written volume) reads as zeroes in its data area, as on
/// fresh storage and as `grow` leaves its added range (session 27's pass:
/// a 32 MiB volume formatted over a written 128 MiB one served 8 MiB of
/// its data).
#[test]
fn a_volume_created_over_a_written_file_reads_zeroes() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = dir.path().join("v.img");
    std::fs::write(&path, vec![0xabu8; (24 * MIB) as usize]).unwrap();
    small_file_volume(&path, 8 * MIB);
    let vol = Volume::open(&path, &quiet_open_options()).unwrap();
    let data = read(&vol, 0, (8 * MIB) as usize);
    let stale = data.iter().filter(|&&b| b != 0).count();
    assert_eq!(stale, 0, "{stale} bytes of the file's old data are served");
    vol.close().unwrap();
}
