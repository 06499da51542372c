//! Reads through the page cache (`read_cache`) stay coherent with the
//! volume's O_DIRECT journal, checkpoint and direct writes: a real file,
//! a small journal (checkpoints all the time), random writes, large direct
//! writes, trims and zeroes, every read checked against a model.

use jbdev_volume::{FormatOptions, OpenOptions, Volume, WriteFlags};
use rand::{Rng, SeedableRng};

/// A volume image path on disk (not tmpfs, so O_DIRECT is in effect next
/// to the page cache), in a directory removed on drop, and its format.
fn on_disk(
    size: u64,
    journal_bytes: u64,
) -> (tempfile::TempDir, std::path::PathBuf, FormatOptions) {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = dir.path().join("v.img");
    let mut f = FormatOptions::new(size);
    f.journal_bytes = Some(journal_bytes);
    (dir, path, f)
}

#[test]
fn cached_reads_match_a_model_through_checkpoints_and_direct_writes() {
    let (_dir, path, f) = on_disk(4 << 20, 256 << 10);
    let size = f.size_bytes;
    let opts = OpenOptions {
        read_cache: true,
        write_cache: true,
        direct_write_threshold: 64 << 10,
        checkpoint_interval: std::time::Duration::from_millis(5),
        ..Default::default()
    };
    let v = Volume::create(&path, &f, &opts).unwrap();
    let mut model = vec![0u8; size as usize];
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed_cace);
    let (mut try_hits, mut try_misses) = (0u32, 0u32);
    for i in 0..3000u32 {
        let off = rng.gen_range(0..size - 1);
        match rng.gen_range(0..10) {
            0..=4 => {
                let len = rng.gen_range(1..=(16 << 10)).min((size - off) as usize);
                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                v.write_at(
                    &data,
                    off,
                    WriteFlags {
                        fua: rng.gen_bool(0.2),
                    },
                )
                .unwrap();
                model[off as usize..off as usize + len].copy_from_slice(&data);
            }
            5 => {
                // A direct (home) write: aligned and at least the threshold.
                let off = off / 4096 * 4096;
                let len = ((128 << 10) as u64).min(size - off) as usize / 4096 * 4096;
                if len >= 64 << 10 {
                    let data = vec![(i % 251) as u8 + 1; len];
                    v.write_at(&data, off, WriteFlags::NONE).unwrap();
                    model[off as usize..off as usize + len].copy_from_slice(&data);
                }
            }
            6 => {
                let len = rng.gen_range(1..(256 << 10)).min(size - off);
                if rng.gen_bool(0.5) {
                    v.trim(off, len, WriteFlags::NONE).unwrap();
                } else {
                    v.write_zeroes(off, len, WriteFlags::NONE).unwrap();
                }
                model[off as usize..(off + len) as usize].fill(0);
            }
            7 => v.flush().unwrap(),
            _ => {
                let len = rng.gen_range(1..(64 << 10)).min(size - off) as usize;
                let mut got = vec![0u8; len];
                v.read_at(&mut got, off).unwrap();
                assert!(
                    got == model[off as usize..off as usize + len],
                    "op {i}: read at {off}+{len} differs"
                );
                // The same range, block-aligned, without blocking: when it
                // reads (overlay or page cache), the bytes are the model's.
                let (a, b) = (off / 4096 * 4096, (off + len as u64).div_ceil(4096) * 4096);
                let mut nowait = vec![0u8; (b.min(size) - a) as usize];
                match v.try_read_at(&mut nowait, a) {
                    Some(res) => {
                        res.unwrap();
                        try_hits += 1;
                        assert!(
                            nowait == model[a as usize..a as usize + nowait.len()],
                            "op {i}: try_read_at {a}+{} differs",
                            nowait.len()
                        );
                    }
                    None => try_misses += 1,
                }
            }
        }
    }
    println!("try_read_at: {try_hits} read without blocking, {try_misses} would have blocked");
    assert!(
        try_hits > 0,
        "ranges just read are in the cache or the overlay"
    );
    // Everything, once more, then after close and reopen (cached again).
    let mut all = vec![0u8; size as usize];
    v.read_at(&mut all, 0).unwrap();
    assert!(all == model, "full read differs from the model");
    v.close().unwrap();
    let v = Volume::open(&path, &opts).unwrap();
    v.read_at(&mut all, 0).unwrap();
    assert!(
        all == model,
        "full read after reopen differs from the model"
    );
    v.close().unwrap();
    // And through O_DIRECT alone (no page cache on the read side).
    let direct = OpenOptions {
        read_cache: false,
        write_cache: false,
        ..opts
    };
    let v = Volume::open(&path, &direct).unwrap();
    v.read_at(&mut all, 0).unwrap();
    assert!(
        all == model,
        "O_DIRECT read after reopen differs from the model"
    );
}

/// With `write_cache`, a large direct write goes home through the page
/// cache (ARCHITECTURE 22c): after `close` and a reopen the blocks read
/// back without device I/O — the overlay is empty after a clean close, so
/// only the page cache can answer — and hold the bytes written. An O_DIRECT
/// write leaves nothing cached there.
#[test]
fn a_direct_write_leaves_what_it_wrote_in_the_read_cache() {
    let (_dir, path, f) = on_disk(8 << 20, 1 << 20);
    let size = f.size_bytes;
    let opts = OpenOptions {
        read_cache: true,
        write_cache: true,
        direct_write_threshold: 64 << 10,
        ..Default::default()
    };
    let v = Volume::create(&path, &f, &opts).unwrap();
    // 16 scattered 64 KiB direct writes in the second half of the volume.
    let writes: Vec<u64> = (0..16u64).map(|i| (size / 2) + i * (128 << 10)).collect();
    for (i, &off) in writes.iter().enumerate() {
        v.write_at(&vec![i as u8 + 1; 64 << 10], off, WriteFlags::NONE)
            .unwrap();
    }
    assert_eq!(v.stats().direct_writes, 16);
    v.close().unwrap();
    let v = Volume::open(&path, &opts).unwrap();
    for (i, &off) in writes.iter().enumerate() {
        let mut got = vec![0u8; 64 << 10];
        match v.try_read_at(&mut got, off) {
            Some(res) => res.unwrap(),
            None => panic!("the direct write at {off} is not in the page cache"),
        }
        assert!(got == vec![i as u8 + 1; 64 << 10], "direct write at {off}");
    }
}

/// A buffer whose bytes start `skew` bytes into an aligned allocation, so
/// the test decides whether the middle of a write is aligned.
struct Skewed {
    buf: jbdev_device::AlignedBuf,
    skew: usize,
}

impl AsRef<[u8]> for Skewed {
    fn as_ref(&self) -> &[u8] {
        &self.buf[self.skew..]
    }
}

/// `len` patterned bytes starting `skew` bytes into an aligned buffer.
fn skewed(len: usize, skew: usize, seed: u8) -> Skewed {
    let mut buf = jbdev_device::AlignedBuf::zeroed(len + skew);
    for (i, b) in buf[skew..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    Skewed { buf, skew }
}

#[test]
fn write_owned_goes_home_from_the_callers_buffer_when_the_device_can_take_it() {
    let (_dir, path, f) = on_disk(8 << 20, 1 << 20);
    let bs = 4096u64;
    // (write cache, skew of the buffer, byte offset of the write, whether
    // the middle goes home uncopied). The write starts 512 bytes before a
    // block boundary: a journaled head, an aligned middle, a journaled tail.
    let cases = [
        // Through the page cache any address will do.
        (true, 512, 4 * bs - 512, true),
        (true, 100, 104 * bs - 512, true),
        // O_DIRECT: the middle starts at buffer byte 512; with a skew of
        // 3584 that is 4096-aligned, with 100 it is not and is copied.
        (false, 3584, 204 * bs - 512, true),
        (false, 100, 304 * bs - 512, false),
    ];
    let len = 300 << 10;
    let mut written = Vec::new();
    for (i, &(write_cache, skew, offset, uncopied)) in cases.iter().enumerate() {
        let opts = OpenOptions {
            read_cache: write_cache,
            write_cache,
            direct_write_threshold: 64 << 10,
            ..Default::default()
        };
        let v = if i == 0 {
            Volume::create(&path, &f, &opts).unwrap()
        } else {
            Volume::open(&path, &opts).unwrap()
        };
        let data = skewed(len, skew, i as u8);
        let want = data.as_ref().to_vec();
        let before = v.stats();
        v.write_owned(Box::new(data), offset, WriteFlags { fua: true })
            .unwrap();
        let after = v.stats();
        assert_eq!(after.direct_writes - before.direct_writes, 1, "case {i}");
        assert_eq!(
            after.direct_writes_uncopied - before.direct_writes_uncopied,
            u64::from(uncopied),
            "case {i}: write cache {write_cache}, skew {skew}"
        );
        let mut got = vec![0u8; len];
        v.read_at(&mut got, offset).unwrap();
        assert!(got == want, "case {i}: read back before close");
        written.push((offset, want));
        v.close().unwrap();
    }
    // Every write durable and intact, read with O_DIRECT after a reopen.
    let v = Volume::open(&path, &OpenOptions::default()).unwrap();
    for (offset, want) in &written {
        let mut got = vec![0u8; len];
        v.read_at(&mut got, *offset).unwrap();
        let first_bad = got.iter().zip(want.iter()).position(|(a, b)| a != b);
        assert_eq!(first_bad, None, "write at {offset} after reopen");
    }
}
