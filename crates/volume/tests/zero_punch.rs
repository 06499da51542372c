//! The checkpoint writes journaled zero blocks of zeroing requests
//! (write-zeroes, trim) home as a hole punch when they form a run of at
//! least 64 KiB of consecutive blocks, and as data otherwise; either way
//! they read back as zeroes, before and after a reopen. Zeroes from a
//! plain write are data and are never punched (a preallocated image keeps
//! its space). On a real sparse image file, where a punch shows in the
//! file's allocated size.

mod common;

use std::os::unix::fs::MetadataExt;

use common::quiet_open_options;
use jbdev_volume::{FormatOptions, Volume, WriteFlags};

const BS: u64 = 4096;
const MIB: u64 = 1 << 20;

/// Bytes of `path` allocated on its file system.
fn allocated(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

/// A 16 MiB volume (8 MiB journal) on a sparse image file, with 2 MiB of
/// data at 4 MiB taken home by a close: its directory, the image, the data
/// and the bytes the image then has allocated.
fn image_with_data() -> (tempfile::TempDir, std::path::PathBuf, Vec<u8>, u64) {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let mut f = FormatOptions::new(16 * MIB);
    f.journal_bytes = Some(8 * MIB);
    let v = Volume::create(&img, &f, &quiet_open_options()).unwrap();
    let data: Vec<u8> = (0..2 * MIB).map(|i| (i % 251) as u8 | 1).collect();
    v.write_at(&data, 4 * MIB, WriteFlags::FUA).unwrap();
    v.close().unwrap();
    let with_data = allocated(&img);
    (dir, img, data, with_data)
}

#[test]
fn long_zero_runs_are_punched_at_checkpoint_and_short_ones_written() {
    let (_dir, img, data, with_data) = image_with_data();
    let opts = quiet_open_options();

    let v = Volume::open(&img, &opts).unwrap();
    // 1 MiB zeroed over the first half (journaled: below one
    // transaction), and every other block of the second half zeroed.
    v.write_zeroes(4 * MIB, MIB, WriteFlags::NONE).unwrap();
    for b in (0..MIB / BS).step_by(2) {
        v.write_zeroes(5 * MIB + b * BS, BS, WriteFlags::NONE)
            .unwrap();
    }
    let check = |v: &Volume| {
        let mut got = vec![0xaau8; 2 * MIB as usize];
        v.read_at(&mut got, 4 * MIB).unwrap();
        assert!(got[..MIB as usize].iter().all(|&b| b == 0), "zeroed MiB");
        for (i, block) in got[MIB as usize..].chunks(BS as usize).enumerate() {
            let off = MIB as usize + i * BS as usize;
            if i % 2 == 0 {
                assert!(block.iter().all(|&b| b == 0), "zeroed block {i}");
            } else {
                assert_eq!(block, &data[off..off + BS as usize], "block {i}");
            }
        }
    };
    check(&v);
    v.close().unwrap();
    let after = allocated(&img);
    // The zeroed MiB was punched; the scattered zero blocks were written.
    assert!(
        after + MIB <= with_data && after + MIB + 64 * 1024 > with_data,
        "allocated {with_data} -> {after} bytes: expected 1 MiB less"
    );
    let v = Volume::open(&img, &opts).unwrap();
    check(&v);
    v.close().unwrap();
}

/// A plain write of zeroes is data: written home, never punched, so an
/// image allocated up front (`format --preallocate`) stays allocated and a
/// later write into that range cannot meet a full file system.
#[test]
fn zeroes_from_a_plain_write_are_written_not_punched() {
    let (_dir, img, _, with_data) = image_with_data();
    let opts = quiet_open_options();

    let v = Volume::open(&img, &opts).unwrap();
    v.write_at(&vec![0u8; 2 * MIB as usize], 4 * MIB, WriteFlags::NONE)
        .unwrap();
    v.close().unwrap();
    assert_eq!(
        allocated(&img),
        with_data,
        "zeroes written with a plain write were punched out"
    );
    let v = Volume::open(&img, &opts).unwrap();
    let mut got = vec![0xaau8; 2 * MIB as usize];
    v.read_at(&mut got, 4 * MIB).unwrap();
    assert!(got.iter().all(|&b| b == 0));
    v.close().unwrap();
}
