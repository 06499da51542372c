//! A volume closed by a program can be opened again by the same program at
//! once: `close` returning means the volume's lock is released. Through
//! io_uring it was not always: the lock belongs to the open file, which
//! the ring's worker threads could still reference for a moment after
//! their last request (a flush, a write that allocated), so 1 to 9 in 400
//! immediate reopens failed with "already open" (found when the page-cache
//! tests flaked under load in session 22). The device now unlocks
//! explicitly when it is dropped.

use jbdev_device::Backend;
use jbdev_volume::{FormatOptions, OpenOptions, Volume, WriteFlags};

/// Cycles of open, write, flush, read, close per configuration.
const CYCLES: u32 = 400;

#[test]
fn a_closed_volume_reopens_at_once_in_the_same_process() {
    for (backend, cache) in [
        (Backend::Auto, false),
        (Backend::Auto, true),
        (Backend::Pread, false),
    ] {
        // On disk, not tmpfs: a sparse image whose writes allocate, and a
        // flush that is real work, are what send requests to the workers.
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let path = dir.path().join("v.img");
        let mut f = FormatOptions::new(8 << 20);
        f.journal_bytes = Some(1 << 20);
        let opts = OpenOptions {
            backend,
            read_cache: cache,
            write_cache: cache,
            direct_write_threshold: 64 << 10,
            ..Default::default()
        };
        Volume::create(&path, &f, &opts).unwrap().close().unwrap();
        let mut refused = Vec::new();
        for i in 0..CYCLES {
            match Volume::open(&path, &opts) {
                Ok(v) => {
                    // Journaled and direct writes, a flush, a read.
                    let off = 4096 * u64::from(i % 512);
                    v.write_at(&[i as u8; 4096], off, WriteFlags::NONE).unwrap();
                    v.write_at(&vec![i as u8; 128 << 10], 4 << 20, WriteFlags::NONE)
                        .unwrap();
                    v.flush().unwrap();
                    let mut b = [0u8; 4096];
                    v.read_at(&mut b, off).unwrap();
                    assert_eq!(b, [i as u8; 4096]);
                    v.close().unwrap();
                }
                Err(e) => refused.push(format!("cycle {i}: {e}")),
            }
        }
        assert!(
            refused.is_empty(),
            "{backend:?} cache {cache}: {} of {CYCLES} reopens right after a close were refused: {refused:#?}",
            refused.len()
        );
    }
}
