//! Helpers shared by the device integration tests: a loop device guard and
//! the backend conformance suite.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::{IoSlice, IoSliceMut};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use jbdev_device::{AlignedBuf, BlockDevice, DeviceError, IoPriority};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A loop device over a sparse file in /dev/shm, detached and removed on drop.
pub struct LoopDevice {
    pub path: PathBuf,
    pub backing: PathBuf,
}

impl LoopDevice {
    /// Attaches a loop device of `size_bytes` with `sector_size`-byte logical
    /// blocks, with direct I/O on the backing when the kernel allows it.
    /// Returns `None` (after printing why) when the test cannot use loop
    /// devices here: not root, no losetup, no free loop device.
    #[allow(unsafe_code)] // geteuid: the device layer's tests may call libc
    pub fn new(size_bytes: u64, sector_size: u32) -> Option<Self> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            println!("SKIP: loop device tests need root");
            return None;
        }
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let backing = PathBuf::from(format!(
            "/dev/shm/jbdev-device-test-{}-{}.img",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        if let Err(e) = std::fs::File::create(&backing).and_then(|f| f.set_len(size_bytes)) {
            println!("SKIP: cannot create {}: {e}", backing.display());
            return None;
        }
        let attach = |direct: bool| {
            let mut cmd = Command::new("losetup");
            cmd.args(["-f", "--show", "--sector-size", &sector_size.to_string()]);
            if direct {
                cmd.arg("--direct-io=on");
            }
            cmd.arg(&backing).output()
        };
        let out = match attach(true) {
            Ok(o) if o.status.success() => o,
            Ok(_) => match attach(false) {
                Ok(o) if o.status.success() => o,
                Ok(o) => {
                    println!(
                        "SKIP: losetup failed: {}",
                        String::from_utf8_lossy(&o.stderr).trim()
                    );
                    let _ = std::fs::remove_file(&backing);
                    return None;
                }
                Err(e) => {
                    println!("SKIP: cannot run losetup: {e}");
                    let _ = std::fs::remove_file(&backing);
                    return None;
                }
            },
            Err(e) => {
                println!("SKIP: cannot run losetup (util-linux missing?): {e}");
                let _ = std::fs::remove_file(&backing);
                return None;
            }
        };
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string());
        Some(Self { path, backing })
    }
}

/// A second loop device over an existing file (detached on drop; the file
/// stays).
pub struct LoopAlias {
    pub path: PathBuf,
}

impl LoopAlias {
    /// Attaches another loop device over `backing`; `None` (printed) if
    /// losetup refuses.
    pub fn new(backing: &Path) -> Option<Self> {
        match Command::new("losetup")
            .args(["-f", "--show"])
            .arg(backing)
            .output()
        {
            Ok(o) if o.status.success() => Some(Self {
                path: PathBuf::from(String::from_utf8_lossy(&o.stdout).trim().to_string()),
            }),
            Ok(o) => {
                println!(
                    "SKIP: losetup failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                println!("SKIP: cannot run losetup: {e}");
                None
            }
        }
    }
}

impl Drop for LoopAlias {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).output();
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        // Detach even if the test failed; the backing file goes with it.
        match Command::new("losetup").arg("-d").arg(&self.path).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "warning: losetup -d {} failed: {}",
                self.path.display(),
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => eprintln!("warning: losetup -d {}: {e}", self.path.display()),
        }
        let _ = std::fs::remove_file(&self.backing);
    }
}

/// What the suite may assume about a backend.
#[derive(Clone, Copy, Debug)]
pub struct Traits {
    /// `allocation()` reports holes after `write_zeroes` (regular files).
    pub reports_holes: bool,
}

/// A deterministic byte pattern for (`tag`, absolute device offset): any
/// misplaced or stale byte shows up.
fn fill_pattern(buf: &mut [u8], tag: u64, offset: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        let x = (offset + i as u64)
            .wrapping_mul(0x9E37_79B9)
            .wrapping_add(tag * 131);
        *b = (x >> 7) as u8;
    }
}

/// Splits `len` into up to `parts` pieces; `unit` is the granularity of the
/// cut points (1 = anywhere, lbs = block aligned).
fn split_points(rng: &mut StdRng, len: usize, parts: usize, unit: usize) -> Vec<usize> {
    let mut cuts: Vec<usize> = (0..parts.saturating_sub(1))
        .map(|_| rng.gen_range(0..=len / unit) * unit)
        .collect();
    cuts.push(0);
    cuts.push(len);
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

/// Writes `data` at `offset` as a vector of slices cut at `cuts`.
fn write_split(dev: &dyn BlockDevice, data: &[u8], cuts: &[usize], offset: u64, prio: IoPriority) {
    let slices: Vec<IoSlice<'_>> = cuts
        .windows(2)
        .map(|w| IoSlice::new(&data[w[0]..w[1]]))
        .collect();
    dev.write_vectored_at(&slices, offset, prio)
        .unwrap_or_else(|e| {
            panic!(
                "{}: write at {offset} len {}: {e}",
                dev.backend_name(),
                data.len()
            )
        });
}

fn read_split(dev: &dyn BlockDevice, out: &mut [u8], cuts: &[usize], offset: u64) {
    let mut rest = out;
    let mut slices = Vec::new();
    for w in cuts.windows(2) {
        let (head, tail) = rest.split_at_mut(w[1] - w[0]);
        slices.push(IoSliceMut::new(head));
        rest = tail;
    }
    let len: usize = slices.iter().map(|s| s.len()).sum();
    dev.read_vectored_at(&mut slices, offset)
        .unwrap_or_else(|e| panic!("{}: read at {offset} len {len}: {e}", dev.backend_name()));
}

/// Runs the whole conformance suite against `dev`. The device must be at
/// least 4 MiB and is overwritten.
pub fn conformance(dev: &dyn BlockDevice, traits: Traits) {
    let name = dev.backend_name();
    let lbs = dev.logical_block_size() as usize;
    let size = dev.size_bytes();
    println!("conformance: {name}, {size} bytes, {lbs}-byte blocks, {traits:?}");
    assert!(lbs.is_power_of_two() && (512..=jbdev_device::MAX_ALIGN).contains(&lbs));
    assert!(size >= 4 << 20 && size.is_multiple_of(lbs as u64));

    vectored_round_trips(dev);
    unaligned_memory(dev);
    bad_requests_are_refused(dev);
    zeroes(dev, traits);
    concurrent_regions(dev);
    dev.flush().unwrap_or_else(|e| panic!("{name}: flush: {e}"));
}

/// Writes at many offsets and sizes with varied slicing (block-aligned
/// cuts in aligned memory, and arbitrary cuts that force a bounce), checks
/// every read-back and finally the whole device against a model.
fn vectored_round_trips(dev: &dyn BlockDevice) {
    let lbs = dev.logical_block_size() as usize;
    // Work in the first 4 MiB; the model is its expected content.
    let span = 4usize << 20;
    let mut model = vec![0u8; span];
    let mut whole = AlignedBuf::zeroed(span);
    // Start from a known state.
    dev.write_at(&whole, 0, IoPriority::Urgent).unwrap();
    let mut rng = StdRng::seed_from_u64(0x5eed_0001);
    let max_blocks = (256 * 1024 / lbs).max(1);
    for iter in 0..96u64 {
        let blocks = match iter % 4 {
            0 => 1,
            1 => rng.gen_range(1..=8),
            _ => rng.gen_range(1..=max_blocks),
        };
        let len = blocks * lbs;
        let offset = rng.gen_range(0..=(span - len) / lbs) * lbs;
        let mut data = AlignedBuf::zeroed(len);
        fill_pattern(&mut data, iter + 1, offset as u64);
        let parts = rng.gen_range(1..=6);
        let unit = if iter % 3 == 0 { 1 } else { lbs };
        let cuts = split_points(&mut rng, len, parts, unit);
        let prio = if iter % 2 == 0 {
            IoPriority::Urgent
        } else {
            IoPriority::Background
        };
        write_split(dev, &data, &cuts, offset as u64, prio);
        model[offset..offset + len].copy_from_slice(&data);
        let mut back = AlignedBuf::zeroed(len);
        let rparts = rng.gen_range(1..=6);
        let rcuts = split_points(&mut rng, len, rparts, if iter % 5 == 0 { 1 } else { lbs });
        read_split(dev, &mut back, &rcuts, offset as u64);
        assert!(
            back[..] == data[..],
            "{}: read-back mismatch at {offset} len {len} (iteration {iter})",
            dev.backend_name()
        );
    }
    dev.read_at(&mut whole, 0).unwrap();
    assert!(
        whole[..] == model[..],
        "{}: device differs from the model",
        dev.backend_name()
    );
    // Reading zero bytes is a no-op, not an error.
    dev.read_vectored_at(&mut [], 0).unwrap();
    dev.write_vectored_at(&[], 0, IoPriority::Urgent).unwrap();
    // The last block of the device is reachable.
    let last = dev.size_bytes() - lbs as u64;
    let mut b = AlignedBuf::zeroed(lbs);
    fill_pattern(&mut b, 999, last);
    dev.write_at(&b, last, IoPriority::Urgent).unwrap();
    let mut r = AlignedBuf::zeroed(lbs);
    dev.read_at(&mut r, last).unwrap();
    assert!(r[..] == b[..]);
}

/// Buffers at odd memory addresses work (bounced where O_DIRECT needs it).
fn unaligned_memory(dev: &dyn BlockDevice) {
    let lbs = dev.logical_block_size() as usize;
    // Growing, then shrinking sizes with new contents: a bounce buffer kept
    // from a larger request must serve a smaller one with none of its old
    // bytes showing.
    for (round, (i, skew)) in [1usize, 3, 8, 511]
        .into_iter()
        .enumerate()
        .chain(
            [511usize, 8, 3, 1]
                .into_iter()
                .enumerate()
                .map(|(i, s)| (3 - i, s)),
        )
        .enumerate()
    {
        let len = lbs * (i + 1);
        let offset = ((3 + 16 * i) * lbs) as u64;
        let mut store = vec![0u8; len + skew];
        fill_pattern(&mut store[skew..], 7 + (i + 4 * round) as u64, offset);
        dev.write_at(&store[skew..], offset, IoPriority::Urgent)
            .unwrap();
        let mut back_store = vec![0u8; len + skew + 1];
        let back = &mut back_store[skew + 1..];
        dev.read_at(back, offset).unwrap();
        assert!(
            back == &store[skew..],
            "{}: skew {skew}",
            dev.backend_name()
        );
    }
}

/// Misaligned and out-of-range requests are refused and change nothing.
fn bad_requests_are_refused(dev: &dyn BlockDevice) {
    let name = dev.backend_name();
    let lbs = dev.logical_block_size() as u64;
    let size = dev.size_bytes();
    let mut before = AlignedBuf::zeroed(2 * lbs as usize);
    dev.read_at(&mut before, 0).unwrap();
    let mut last_before = AlignedBuf::zeroed(lbs as usize);
    dev.read_at(&mut last_before, size - lbs).unwrap();
    let junk = AlignedBuf::from_slice(&vec![0xEE; 2 * lbs as usize]);
    let misaligned = |r: jbdev_device::Result<()>| {
        assert!(
            matches!(r, Err(DeviceError::Misaligned { .. })),
            "{name}: {r:?}"
        )
    };
    let out_of_range = |r: jbdev_device::Result<()>| {
        assert!(
            matches!(r, Err(DeviceError::OutOfRange { .. })),
            "{name}: {r:?}"
        )
    };
    misaligned(dev.write_at(&junk, lbs / 2, IoPriority::Urgent));
    misaligned(dev.write_at(&junk[..lbs as usize + 1], 0, IoPriority::Urgent));
    misaligned(dev.write_at(&junk[..100], 0, IoPriority::Urgent));
    misaligned(dev.write_zeroes(1, lbs));
    misaligned(dev.write_zeroes(0, lbs - 1));
    let mut rb = AlignedBuf::zeroed(2 * lbs as usize);
    misaligned(dev.read_at(&mut rb[..lbs as usize + 7], 0));
    misaligned(dev.read_at(&mut rb, 3));
    out_of_range(dev.write_at(&junk, size - lbs, IoPriority::Urgent));
    out_of_range(dev.write_at(&junk, size, IoPriority::Urgent));
    out_of_range(dev.write_at(&junk, u64::MAX - lbs + 1, IoPriority::Urgent));
    out_of_range(dev.read_at(&mut rb, size - lbs));
    out_of_range(dev.write_zeroes(size - lbs, 2 * lbs));
    out_of_range(dev.write_zeroes(u64::MAX - lbs + 1, lbs));
    // Nothing was written partially: the first blocks and the last block
    // are unchanged.
    let mut after = AlignedBuf::zeroed(2 * lbs as usize);
    dev.read_at(&mut after, 0).unwrap();
    assert!(
        after[..] == before[..],
        "{name}: a refused request wrote data"
    );
    let mut last = AlignedBuf::zeroed(lbs as usize);
    dev.read_at(&mut last, size - lbs).unwrap();
    assert!(
        last[..] == last_before[..],
        "{name}: a refused write landed at the end"
    );
}

/// `write_zeroes` reads back zeroes, leaves neighbours alone, and (on files)
/// leaves a hole.
fn zeroes(dev: &dyn BlockDevice, traits: Traits) {
    let name = dev.backend_name();
    let lbs = dev.logical_block_size() as u64;
    // 1 MiB region starting at 1 MiB: fill, then zero the middle 512 KiB
    // (aligned to 64 KiB so filesystems can really punch it).
    let base = 1u64 << 20;
    let region = 1usize << 20;
    let mut data = AlignedBuf::zeroed(region);
    fill_pattern(&mut data, 42, base);
    dev.write_at(&data, base, IoPriority::Urgent).unwrap();
    dev.flush().unwrap();
    let (zoff, zlen) = (base + (256 << 10), 512u64 << 10);
    assert!(zoff.is_multiple_of(lbs) && zlen.is_multiple_of(lbs));
    dev.write_zeroes(zoff, zlen)
        .unwrap_or_else(|e| panic!("{name}: write_zeroes: {e}"));
    dev.write_zeroes(zoff, 0).unwrap();
    let mut back = AlignedBuf::zeroed(region);
    dev.read_at(&mut back, base).unwrap();
    let (zs, ze) = ((zoff - base) as usize, (zoff - base + zlen) as usize);
    assert!(
        back[zs..ze].iter().all(|&b| b == 0),
        "{name}: zeroed range not zero"
    );
    assert!(
        back[..zs] == data[..zs],
        "{name}: bytes before the zeroed range changed"
    );
    assert!(
        back[ze..] == data[ze..],
        "{name}: bytes after the zeroed range changed"
    );
    let map = dev.allocation(base, region as u64).unwrap();
    // The map covers the range exactly, in order, without gaps.
    let mut pos = base;
    for e in &map {
        assert_eq!(e.offset, pos, "{name}: allocation map has a gap: {map:?}");
        assert!(e.len > 0);
        pos += e.len;
    }
    assert_eq!(pos, base + region as u64, "{name}: allocation map: {map:?}");
    if traits.reports_holes {
        // Bytes of the zeroed range the map reports as holes.
        let hole_bytes: u64 = map
            .iter()
            .filter(|e| !e.allocated)
            .map(|e| {
                (e.offset + e.len)
                    .min(zoff + zlen)
                    .saturating_sub(e.offset.max(zoff))
            })
            .sum();
        assert!(
            hole_bytes > 0,
            "{name}: no hole after write_zeroes: {map:?}"
        );
        // Holes never cover data we wrote.
        for e in map.iter().filter(|e| !e.allocated) {
            assert!(
                e.offset >= zoff && e.offset + e.len <= zoff + zlen,
                "{name}: hole over data: {map:?}"
            );
        }
    }
}

/// Threads each own a region; each writes and verifies its own blocks, in
/// a bounded number of rounds; at the end every region holds its last round.
fn concurrent_regions(dev: &dyn BlockDevice) {
    const THREADS: usize = 4;
    const ROUNDS: u64 = 40;
    let lbs = dev.logical_block_size() as usize;
    let region = 64usize << 10;
    let base = 2u64 << 20;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || {
                let off = base + (t * region) as u64;
                let mut rng = StdRng::seed_from_u64(t as u64);
                let mut buf = AlignedBuf::zeroed(region);
                let mut back = AlignedBuf::zeroed(region);
                for round in 0..ROUNDS {
                    let tag = (t as u64) << 32 | round;
                    fill_pattern(&mut buf, tag, off);
                    // Write the region in a random number of block-aligned pieces.
                    let parts = rng.gen_range(1..=4);
                    let cuts = split_points(&mut rng, region, parts, lbs);
                    write_split(dev, &buf, &cuts, off, IoPriority::Urgent);
                    if round % 8 == 0 {
                        dev.flush().unwrap();
                    }
                    dev.read_at(&mut back, off).unwrap();
                    assert!(
                        back[..] == buf[..],
                        "thread {t} round {round}: region corrupted"
                    );
                }
            });
        }
    });
    for t in 0..THREADS {
        let off = base + (t * region) as u64;
        let mut want = vec![0u8; region];
        fill_pattern(&mut want, (t as u64) << 32 | (ROUNDS - 1), off);
        let mut back = AlignedBuf::zeroed(region);
        dev.read_at(&mut back, off).unwrap();
        assert!(back[..] == want[..], "region {t} lost its last write");
    }
}

/// A fresh temp directory that supports O_DIRECT: `/work`-style disk
/// filesystems do; the default temp dir is used as is.
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

pub fn image_path(dir: &Path) -> PathBuf {
    dir.join("device.img")
}
