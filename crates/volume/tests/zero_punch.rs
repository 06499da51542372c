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

/// Zeroes asked to stay allocated (`write_zeroes_allocated`, NBD's
/// `NO_HOLE`) are never punched: neither journaled ones at checkpoint nor
/// a range too large for a transaction, zeroed in place. The same large
/// range zeroed plainly afterwards is punched, so the measure would see a
/// punch (found by the session-22 adversarial pass: NBD's NO_HOLE was
/// dropped and a preallocated image lost its space).
#[test]
fn zeroes_kept_allocated_are_never_punched() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let mut f = FormatOptions::new(64 * MIB);
    f.journal_bytes = Some(8 * MIB);
    let opts = quiet_open_options();
    let v = Volume::create(&img, &f, &opts).unwrap();
    let data: Vec<u8> = (0..16 * MIB).map(|i| (i % 251) as u8 | 1).collect();
    v.write_at(&data, 4 * MIB, WriteFlags::FUA).unwrap();
    v.close().unwrap();
    let with_data = allocated(&img);

    let v = Volume::open(&img, &opts).unwrap();
    let (big_off, big_len) = (8 * MIB, 12 * MIB);
    assert!(
        big_len > v.max_transaction_bytes() && v.zeroes_in_place(big_off, big_len),
        "the large range must take the in-place path"
    );
    // Journaled: a whole MiB, and a range with partial blocks at both ends.
    v.write_zeroes_allocated(4 * MIB, MIB, WriteFlags::NONE)
        .unwrap();
    v.write_zeroes_allocated(5 * MIB + 100, 3 * BS, WriteFlags::FUA)
        .unwrap();
    v.write_zeroes_allocated(big_off, big_len, WriteFlags::FUA)
        .unwrap();
    let check = |v: &Volume| {
        let mut got = vec![0xaau8; 16 * MIB as usize];
        v.read_at(&mut got, 4 * MIB).unwrap();
        let zero = |lo: u64, hi: u64| (lo - 4 * MIB) as usize..(hi - 4 * MIB) as usize;
        for (range, what) in [
            (zero(4 * MIB, 5 * MIB), "the journaled MiB"),
            (
                zero(5 * MIB + 100, 5 * MIB + 100 + 3 * BS),
                "the unaligned range",
            ),
            (zero(big_off, big_off + big_len), "the large range"),
        ] {
            assert!(got[range].iter().all(|&b| b == 0), "{what} reads zero");
        }
        let kept = zero(5 * MIB + 100 + 3 * BS, big_off);
        assert_eq!(
            &got[kept.clone()],
            &data[kept],
            "data between the zeroed ranges"
        );
    };
    check(&v);
    v.close().unwrap();
    // (At least: splitting extents may take the file system a block more.)
    assert!(
        allocated(&img) >= with_data,
        "zeroes kept allocated were deallocated: {with_data} -> {} bytes",
        allocated(&img)
    );
    let v = Volume::open(&img, &opts).unwrap();
    check(&v);
    // The control: the same range zeroed plainly is punched.
    v.write_zeroes(big_off, big_len, WriteFlags::FUA).unwrap();
    v.close().unwrap();
    // (Give or take a few blocks the file system may allocate for its
    // extent tree when the punch splits an extent: one more 4 KiB block
    // failed this in two runs of session 23.)
    let slack = 64 << 10;
    assert!(
        allocated(&img) + big_len <= with_data + slack,
        "a plain zeroing of {big_len} bytes did not punch: {with_data} -> {}",
        allocated(&img)
    );
}

/// A sparse copy of a volume (`cp --sparse=always`, `rsync -S`) punches
/// the journal's unused, zeroed blocks out; a read-write open allocates
/// them again, so commits do not depend on finding free space later (on a
/// full file system every commit failed, at every open: session 22's
/// adversarial pass). A read-only open changes nothing.
#[test]
fn a_read_write_open_allocates_the_holes_of_a_sparse_copy_s_journal() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let journal = 8 * MIB;
    let mut f = FormatOptions::new(16 * MIB);
    f.journal_bytes = Some(journal);
    let opts = quiet_open_options();
    Volume::create(&img, &f, &opts).unwrap().close().unwrap();
    let formatted = allocated(&img);
    // The internal journal follows the volume superblock's block; keep the
    // journal's own superblock block and punch the rest, as a sparse copy
    // of the zeroed log would.
    let (off, len) = (2 * BS, journal - BS);
    let punched = std::process::Command::new("fallocate")
        .args([
            "--punch-hole",
            "--offset",
            &off.to_string(),
            "--length",
            &len.to_string(),
        ])
        .arg(&img)
        .status()
        .expect("fallocate(1), from util-linux");
    assert!(punched.success(), "fallocate --punch-hole failed");
    let sparse = allocated(&img);
    assert!(
        sparse + journal / 2 < formatted,
        "the punch took {formatted} -> {sparse}"
    );
    let ro = quiet_open_options_read_only();
    Volume::open(&img, &ro).unwrap().close().unwrap();
    assert_eq!(allocated(&img), sparse, "a read-only open allocated");
    let v = Volume::open(&img, &opts).unwrap();
    v.write_at(&[7; 4096], 0, WriteFlags::FUA).unwrap();
    v.close().unwrap();
    assert!(
        allocated(&img) + BS >= formatted,
        "the journal's holes stayed: {formatted} at format, {sparse} punched, {} after a read-write open",
        allocated(&img)
    );
    let v = Volume::open(&img, &opts).unwrap();
    let mut b = [0u8; 4096];
    v.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [7; 4096]);
    v.close().unwrap();
}

fn quiet_open_options_read_only() -> jbdev_volume::OpenOptions {
    jbdev_volume::OpenOptions {
        read_only: true,
        ..quiet_open_options()
    }
}
