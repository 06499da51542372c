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

/// `try_write_owned` writes in place only what needs no wait and no
/// journal: an aligned, non-FUA write that goes home through the page
/// cache. Everything else comes back untouched (nothing written), and what
/// it wrote is durable after a flush.
#[test]
fn try_write_owned_runs_only_aligned_page_cache_writes_in_place() {
    let (_dir, path, f) = on_disk(8 << 20, 1 << 20);
    let bs = 4096u64;
    let len = 256 << 10;
    let cached = OpenOptions {
        read_cache: true,
        write_cache: true,
        direct_write_threshold: 64 << 10,
        ..Default::default()
    };
    let v = Volume::create(&path, &f, &cached).unwrap();
    let mut model = vec![0u8; f.size_bytes as usize];
    // (offset, fua, length, runs in place)
    let cases = [
        (16 * bs, false, len, true),
        // FUA waits for a flush; an unaligned write journals its edges; a
        // small write is journaled whole: none runs here.
        (128 * bs, true, len, false),
        (256 * bs + 512, false, len, false),
        (512 * bs, false, 16 << 10, false),
        (1024 * bs, false, len, true),
    ];
    for (i, &(offset, fua, len, in_place)) in cases.iter().enumerate() {
        let data = skewed(len, 0, i as u8 + 1);
        let want = data.as_ref().to_vec();
        let before = v.stats();
        match v.try_write_owned(Box::new(data), offset, WriteFlags { fua }) {
            Ok(res) => {
                assert!(in_place, "case {i} ran in place");
                res.unwrap();
                model[offset as usize..offset as usize + len].copy_from_slice(&want);
                let after = v.stats();
                assert_eq!(
                    after.direct_writes_uncopied - before.direct_writes_uncopied,
                    1
                );
            }
            Err(back) => {
                assert!(!in_place, "case {i} came back");
                assert!(
                    (*back).as_ref() == &want[..],
                    "case {i}: the buffer came back intact"
                );
                assert_eq!(
                    v.stats().direct_writes,
                    before.direct_writes,
                    "case {i} wrote"
                );
            }
        }
    }
    v.flush().unwrap();
    drop(v);
    // Without the page cache nothing runs in place.
    let v = Volume::open(&path, &OpenOptions::default()).unwrap();
    let data = skewed(len, 0, 9);
    assert!(v
        .try_write_owned(Box::new(data), 2048 * bs, WriteFlags::NONE)
        .is_err());
    let mut got = vec![0u8; model.len()];
    v.read_at(&mut got, 0).unwrap();
    let first_bad = got.iter().zip(model.iter()).position(|(a, b)| a != b);
    assert_eq!(first_bad, None, "content after reopen");
}

/// A file device whose page-cache writes report they can stall (as on
/// FUSE or NFS); everything else is the file's.
struct StallingCache(std::sync::Arc<dyn jbdev_device::BlockDevice>);

impl jbdev_device::BlockDevice for StallingCache {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn logical_block_size(&self) -> u32 {
        self.0.logical_block_size()
    }
    fn read_vectored_at(
        &self,
        bufs: &mut [std::io::IoSliceMut<'_>],
        offset: u64,
    ) -> jbdev_device::Result<()> {
        self.0.read_vectored_at(bufs, offset)
    }
    fn has_write_cache(&self) -> bool {
        self.0.has_write_cache()
    }
    fn write_cache_can_stall(&self) -> bool {
        true
    }
    fn write_cached(&self, bufs: &[std::io::IoSlice<'_>], offset: u64) -> jbdev_device::Result<()> {
        self.0.write_cached(bufs, offset)
    }
    fn write_vectored_at(
        &self,
        bufs: &[std::io::IoSlice<'_>],
        offset: u64,
        prio: jbdev_device::IoPriority,
    ) -> jbdev_device::Result<()> {
        self.0.write_vectored_at(bufs, offset, prio)
    }
    fn write_vectored_durable_at(
        &self,
        bufs: &[std::io::IoSlice<'_>],
        offset: u64,
        prio: jbdev_device::IoPriority,
    ) -> jbdev_device::Result<()> {
        self.0.write_vectored_durable_at(bufs, offset, prio)
    }
    fn flush(&self) -> jbdev_device::Result<()> {
        self.0.flush()
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> jbdev_device::Result<()> {
        self.0.write_zeroes(offset, len)
    }
    fn backend_name(&self) -> &'static str {
        "stalling-cache"
    }
}

/// A home whose buffered writes can wait on the storage without bound (a
/// file on FUSE or NFS) never takes `try_write_owned`'s in-place write: it
/// would block an NBD network thread and every connection on it while the
/// store hangs (a stalled export froze the server's other exports). The
/// same write on a local file system does run in place, and a file on
/// tmpfs or ext4 is known not to stall.
#[test]
fn try_write_owned_leaves_a_home_that_can_stall_to_a_worker() {
    let (_dir, path, f) = on_disk(8 << 20, 1 << 20);
    let opts = OpenOptions {
        read_cache: true,
        write_cache: true,
        direct_write_threshold: 64 << 10,
        ..Default::default()
    };
    drop(Volume::create(&path, &f, &opts).unwrap());
    let dopts = jbdev_device::OpenOptions {
        read_cache: true,
        ..Default::default()
    };
    let dev = jbdev_device::open_device(&path, &dopts).unwrap().device;
    assert!(dev.has_write_cache());
    assert!(
        !dev.write_cache_can_stall(),
        "a file in /var/tmp counts as stalling"
    );
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let on_tmpfs = shm.path().join("t.img");
    std::fs::write(&on_tmpfs, vec![0u8; 1 << 20]).unwrap();
    let tmpfs_dev = jbdev_device::open_device(&on_tmpfs, &dopts).unwrap().device;
    assert!(
        !tmpfs_dev.write_cache_can_stall(),
        "tmpfs counts as stalling"
    );
    drop(tmpfs_dev);

    let len = 256 << 10;
    let data = skewed(len, 0, 3);
    let want = data.as_ref().to_vec();
    let stalling =
        Volume::open_device(std::sync::Arc::new(StallingCache(dev)), None, &opts).unwrap();
    let back = stalling
        .try_write_owned(Box::new(data), 16 * 4096, WriteFlags::NONE)
        .expect_err("a write to a home that can stall ran in place");
    assert!((*back).as_ref() == &want[..], "the buffer came back intact");
    stalling.close().unwrap();

    let local = Volume::open(&path, &opts).unwrap();
    local
        .try_write_owned(Box::new(skewed(len, 0, 4)), 16 * 4096, WriteFlags::NONE)
        .map_err(|_| "came back")
        .expect("the same write on a local file system ran in place")
        .unwrap();
}
