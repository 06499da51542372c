//! A journal that fails while its home device works: the committed
//! transactions it holds are written home from memory before the volume's
//! checkpoint thread exits (`Engine::salvage`), so no acknowledged write
//! depends on the failed journal. Before, the abort left them only in the
//! journal: lost with a dead journal device, or with a deleted journal file
//! once the process exited. A home failure still leaves everything to the
//! journal.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{quiet_open_options, stamped, SECTOR};
use jbdev_device::fault::FaultDevice;
use jbdev_device::BlockDevice;
use jbdev_volume::{
    FormatOptions, JournalPlacement, OpenOptions, Stats, Volume, VolumeError, WriteFlags,
};

const BS: u64 = 4096;
const DATA: u64 = 1 << 20;
const JOURNAL: u64 = 4 << 20;
/// Home block 0 on the home device: after the volume superblock (the
/// journal is external).
const DATA_OFF: u64 = BS;

/// A volume with an external journal, both on fault devices:
/// (home, journal).
fn devices() -> (Arc<FaultDevice>, Arc<FaultDevice>) {
    common::external_journal_devices(DATA, JOURNAL)
}

fn open(home: &Arc<FaultDevice>, jnl: &Arc<FaultDevice>) -> Volume {
    Volume::open_device(
        home.clone() as Arc<dyn BlockDevice>,
        Some(jnl.clone() as Arc<dyn BlockDevice>),
        // No checkpoint unless the test causes one: the acknowledged writes
        // stay in the journal only.
        &quiet_open_options(),
    )
    .expect("open")
}

/// Journaled FUA writes, acknowledged: blocks 0..24 and a rewrite of
/// blocks 0..4, the newest version of each block last.
fn acknowledged(v: &Volume) -> Vec<(u64, Vec<u8>)> {
    let mut newest = std::collections::BTreeMap::new();
    for (i, b) in (0..24).chain(0..4).enumerate() {
        let data = stamped(100 + i as u64, b * BS, BS as usize);
        v.write_at(&data, b * BS, WriteFlags::FUA)
            .expect("journaled FUA write");
        newest.insert(b, data);
    }
    newest.into_iter().collect()
}

/// Writes until one fails (the journal's failure); returns its error.
fn next_write_fails(v: &Volume) -> VolumeError {
    v.write_at(&[0xeeu8; BS as usize], 60 * BS, WriteFlags::FUA)
        .expect_err("the journal fails")
}

/// Polls the volume's counters until the salvage has ended one way or
/// the other (a bound on a background thread, not a timing assertion).
fn salvage_outcome(v: &Volume) -> Stats {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = v.stats();
        if s.salvage_complete || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A closed volume in `dir` with its journal in a file beside it:
/// (image, journal file).
fn file_volume(dir: &Path) -> (PathBuf, PathBuf) {
    let (img, jpath) = (dir.join("v.img"), dir.join("j.jnl"));
    let mut f = FormatOptions::new(DATA);
    f.journal_bytes = Some(JOURNAL);
    f.journal = JournalPlacement::External(jpath.clone());
    Volume::create(&img, &f, &OpenOptions::default())
        .unwrap()
        .close()
        .unwrap();
    (img, jpath)
}

/// What the home device durably holds of `blocks`, by block.
fn home_holds(home: &FaultDevice, acked: &[(u64, Vec<u8>)]) -> Vec<u64> {
    let image = home.durable_image();
    acked
        .iter()
        .filter(|(b, data)| {
            let at = (DATA_OFF + b * BS) as usize;
            &image[at..at + BS as usize] == data.as_slice()
        })
        .map(|(b, _)| *b)
        .collect()
}

#[test]
fn a_failed_journal_write_leaves_every_acknowledged_write_durable_at_home() {
    let (home, jnl) = devices();
    let v = open(&home, &jnl);
    let acked = acknowledged(&v);
    assert!(
        home_holds(&home, &acked).is_empty(),
        "the test needs the writes in the journal only"
    );
    jnl.fail_op(1);
    let err = next_write_fails(&v);
    assert!(matches!(err, VolumeError::Aborted { .. }), "{err:?}");
    let s = salvage_outcome(&v);
    assert!(s.salvage_complete, "salvage did not finish: {s:?}");
    assert_eq!(s.salvaged_blocks, acked.len() as u64);
    // Durable (flushed) at home, with the journal no longer needed.
    assert_eq!(
        home_holds(&home, &acked),
        acked.iter().map(|(b, _)| *b).collect::<Vec<_>>()
    );
    // The write that failed is not there (block 60 is never written home).
    let image = home.durable_image();
    let at = (DATA_OFF + 60 * BS) as usize;
    assert!(image[at..at + BS as usize].iter().all(|&x| x == 0));
    assert!(v.close().is_err(), "close reports the abort");
    // And the journal, readable again, replays the same data over it.
    let v = open(&home, &jnl);
    common::assert_reads(&v, &acked, "after replay");
    v.close().unwrap();
}

/// A home device that fails too: nothing is salvaged (a failed direct
/// write may have cancelled journaled copies the salvage would skip), the
/// volume closes with its error, no hang, and the journal keeps
/// everything for the next open.
#[test]
fn a_failing_home_device_stops_the_salvage_and_the_journal_keeps_everything() {
    let (home, jnl) = devices();
    let v = open(&home, &jnl);
    let acked = acknowledged(&v);
    // The home's next write fails (the salvage's first), and the journal's.
    home.fail_op(1);
    jnl.fail_op(1);
    next_write_fails(&v);
    assert!(v.close().is_err());
    assert!(
        home_holds(&home, &acked).is_empty(),
        "nothing salvaged after the home failed"
    );
    let v = open(&home, &jnl);
    common::assert_reads(&v, &acked, "after replay");
    v.close().unwrap();
}

/// The user's case: the external journal FILE is deleted under a running
/// volume. The watch aborts the volume, the salvage writes what only the
/// journal held home, and the image file holds every acknowledged write
/// after the process lets go of the deleted journal.
#[test]
fn a_deleted_journal_file_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let (img, jpath) = file_volume(dir.path());
    let v = Volume::open(&img, &quiet_open_options()).unwrap();
    let acked = acknowledged(&v);
    std::fs::remove_file(&jpath).unwrap();
    // Writes go on until the watch sees the deletion (every 250 ms).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut acked = acked;
    let mut i = 0u64;
    loop {
        let b = 30 + i % 16;
        let data = stamped(1000 + i, b * BS, BS as usize);
        match v.write_at(&data, b * BS, WriteFlags::FUA) {
            Ok(()) => {
                acked.retain(|(x, _)| *x != b);
                acked.push((b, data));
            }
            Err(VolumeError::JournalFileLost(_)) => break,
            Err(e) => panic!("unexpected error {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "no abort a minute after the delete"
        );
        i += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let s = salvage_outcome(&v);
    assert!(s.salvage_complete, "salvage did not finish: {s:?}");
    assert!(v.close().is_err());
    let held = home_file_blocks(&img, &acked);
    let missing: Vec<u64> = acked
        .iter()
        .map(|(b, _)| *b)
        .filter(|b| !held.contains(b))
        .collect();
    assert!(
        missing.is_empty(),
        "acknowledged blocks not at home: {missing:?}"
    );
}

/// Plain writes of block `b` until one fails: the journal watch (every
/// 250 ms) saw the journal file deleted and aborted the volume.
fn plain_writes_until_the_abort(v: &Volume, b: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while v
        .write_at(&[7u8; BS as usize], b * BS, WriteFlags::NONE)
        .is_ok()
    {
        assert!(
            Instant::now() < deadline,
            "no abort a minute after the delete"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The blocks of `acked` the image file holds.
fn home_file_blocks(img: &Path, acked: &[(u64, Vec<u8>)]) -> Vec<u64> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(img).unwrap();
    acked
        .iter()
        .filter(|(b, data)| {
            let mut back = vec![0u8; BS as usize];
            f.read_exact_at(&mut back, DATA_OFF + b * BS).unwrap();
            &back == data
        })
        .map(|(b, _)| *b)
        .collect()
}

/// After a salvage, `reset_journal` gives the volume a new, empty journal
/// at the recorded path and it opens again with every acknowledged write.
#[test]
fn a_volume_whose_journal_file_was_deleted_opens_again_after_a_journal_reset() {
    let dir = tempfile::tempdir().unwrap();
    let (img, jpath) = file_volume(dir.path());
    let v = Volume::open(&img, &quiet_open_options()).unwrap();
    let acked = acknowledged(&v);
    // While open, a reset is refused (the volume's lock).
    let busy = jbdev_volume::reset_journal(&img, None, true).unwrap_err();
    assert!(
        matches!(
            busy,
            VolumeError::Device(jbdev_device::DeviceError::Busy(_))
        ),
        "{busy:?}"
    );
    std::fs::remove_file(&jpath).unwrap();
    plain_writes_until_the_abort(&v, 50);
    assert!(salvage_outcome(&v).salvage_complete);
    assert!(v.close().is_err());
    assert!(
        Volume::open(&img, &quiet_open_options()).is_err(),
        "no journal, no open"
    );
    let r = jbdev_volume::reset_journal(&img, None, false).unwrap();
    assert!(r.created, "{r:?}");
    assert_eq!(r.previous, "missing");
    let v = Volume::open(&img, &quiet_open_options()).unwrap();
    common::assert_reads(&v, &acked, "after the reset");
    v.close().unwrap();
}

/// What a reset refuses without `force`: a journal an open would replay,
/// a clean one, another volume's. With `force` the journal is replaced
/// and its transactions are gone (the home area is the content).
#[test]
fn a_journal_reset_refuses_a_usable_journal_without_force() {
    let (home, jnl) = devices();
    let v = open(&home, &jnl);
    let acked = acknowledged(&v);
    // A power cut now: the writes are in the journal only.
    let (himg, jimg) = (home.durable_image(), jnl.durable_image());
    v.close().unwrap();
    let dev = |img: &Vec<u8>| Arc::new(FaultDevice::from_image(img.clone(), SECTOR as u32));
    let (home2, jnl2) = (dev(&himg), dev(&jimg));
    let reset = |h: &Arc<FaultDevice>, j: &Arc<FaultDevice>, force: bool| {
        jbdev_volume::reset_journal_device(
            h.clone() as Arc<dyn BlockDevice>,
            Some(j.clone() as Arc<dyn BlockDevice>),
            force,
        )
    };
    let e = reset(&home2, &jnl2, false).unwrap_err().to_string();
    assert!(e.contains("committed transaction(s)"), "{e}");
    // Clean (after the close above): refused too.
    let e = reset(&home, &jnl, false).unwrap_err().to_string();
    assert!(e.contains("clean and intact"), "{e}");
    // Another volume's journal.
    let (_, other_jnl) = devices();
    let e = reset(&home, &other_jnl, false).unwrap_err().to_string();
    assert!(e.contains("another volume"), "{e}");
    // Another volume's journal that holds writes it has not replayed (jnl2:
    // this volume's own after the power cut, seen from a second volume):
    // not even with force (session 29's pass: `reset --force` with the
    // wrong --journal discarded 50 acknowledged writes of the other one).
    let (other_home, _) = devices();
    let before = jnl2.durable_image();
    let e = reset(&other_home, &jnl2, true).unwrap_err().to_string();
    assert!(
        e.contains("another volume") && e.contains("not even with --force"),
        "{e}"
    );
    assert!(
        jnl2.durable_image() == before,
        "the refused reset wrote to it"
    );
    // The same journal with a damaged superblock (one byte of it flipped):
    // it still names the other volume, and is not reset either.
    let mut damaged = before.clone();
    damaged[0x100] ^= 0x40;
    let jnl3 = dev(&damaged);
    let e = reset(&other_home, &jnl3, true).unwrap_err().to_string();
    assert!(
        e.contains("names another volume's journal") && e.contains("not even with --force"),
        "{e}"
    );
    assert!(
        jnl3.durable_image() == damaged,
        "the refused reset wrote to it"
    );
    // A volume given as the journal (its image as --journal): never reset.
    let volume_as_journal = Arc::new(FaultDevice::new(BS + (256 << 10) + JOURNAL, SECTOR as u32));
    let mut f = jbdev_volume::FormatOptions::new(JOURNAL);
    f.journal_bytes = Some(256 << 10);
    Volume::format_device(volume_as_journal.clone(), None, &f).unwrap();
    let image = volume_as_journal.durable_image();
    let e = reset(&other_home, &volume_as_journal, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds a jbdev volume"), "{e}");
    assert!(
        volume_as_journal.durable_image() == image,
        "the refused reset wrote to the volume"
    );
    // Forced: the journal's writes are gone, the volume opens clean.
    let r = reset(&home2, &jnl2, true).unwrap();
    assert!(r.previous.contains("committed transaction(s)"), "{r:?}");
    let v = open(&home2, &jnl2);
    let mut back = vec![0u8; BS as usize];
    v.read_at(&mut back, acked[0].0 * BS).unwrap();
    assert!(back.iter().all(|&x| x == 0), "the discarded write is gone");
    v.close().unwrap();
}

/// Plain writes that no commit made durable yet (no flush, no FUA, the
/// commit interval far away) when the journal file is deleted: the salvage
/// takes home every committed write and counts those it cannot — no
/// journal protects them any more — and they are not at home afterwards.
/// (Found by an adversarial pass: the salvage wrote 0 blocks of 100 plain
/// writes and logged that "every write acknowledged before the journal
/// failed is durable on the home device"; `jbdev stats` said the same.)
#[test]
fn the_salvage_counts_the_plain_writes_no_commit_made_durable() {
    let dir = tempfile::tempdir().unwrap();
    let (img, jpath) = file_volume(dir.path());
    let v = Volume::open(&img, &quiet_open_options()).unwrap();
    let acked = acknowledged(&v);
    // Blocks 40..50: plain writes, in the running transaction (the commit
    // interval is an hour), so no commit covers them.
    let plain: Vec<(u64, Vec<u8>)> = (40..50u64)
        .map(|b| (b, stamped(5000 + b, b * BS, BS as usize)))
        .collect();
    for (b, data) in &plain {
        v.write_at(data, b * BS, WriteFlags::NONE).unwrap();
    }
    std::fs::remove_file(&jpath).unwrap();
    plain_writes_until_the_abort(&v, 60);
    let s = salvage_outcome(&v);
    assert!(s.salvage_complete, "{s:?}");
    // The ten plain writes; block 60's writes (the last one failed) too.
    assert!(
        (10..=11).contains(&s.salvage_uncommitted_blocks),
        "{}",
        s.salvage_uncommitted_blocks
    );
    assert!(v.close().is_err());
    let held = home_file_blocks(&img, &acked);
    assert_eq!(held.len(), acked.len(), "committed writes not at home");
    assert!(
        home_file_blocks(&img, &plain).is_empty(),
        "uncommitted blocks went home"
    );
}
