//! A journal restored from an old copy (a backup taken while its log held
//! transactions) is refused instead of replayed: its transactions are
//! older than what the volume has written home since, and replaying them
//! brought the old data back (a silent rollback, left alone in session
//! 18). Each read-write open stamps a session number into the journal's
//! superblock and then the volume's (FORMAT.md); a log that needs replay
//! with an older stamp than the volume's is stale.

mod common;

use std::sync::Arc;

use common::{quiet_open_options, stamped, SECTOR};
use jbdev_device::fault::FaultDevice;
use jbdev_device::BlockDevice;
use jbdev_volume::{FormatOptions, OpenOptions, Volume, WriteFlags};

const BS: u64 = 4096;
const DATA: u64 = 1 << 20;
const JOURNAL: u64 = 1 << 20;

fn devices() -> (Arc<FaultDevice>, Arc<FaultDevice>) {
    common::external_journal_devices(DATA, JOURNAL)
}

fn open_with(
    home: &Arc<FaultDevice>,
    jnl: &Arc<FaultDevice>,
    o: &OpenOptions,
) -> jbdev_volume::Result<Volume> {
    Volume::open_device(
        home.clone() as Arc<dyn BlockDevice>,
        Some(jnl.clone() as Arc<dyn BlockDevice>),
        o,
    )
}

/// `jbdev journal reset` (no --force) of the volume on `home` with `jnl`.
fn reset_without_force(
    home: &Arc<FaultDevice>,
    jnl: &Arc<FaultDevice>,
) -> jbdev_volume::Result<jbdev_volume::JournalReset> {
    jbdev_volume::reset_journal_device(
        home.clone() as Arc<dyn BlockDevice>,
        Some(jnl.clone() as Arc<dyn BlockDevice>),
        false,
    )
}

fn read_block(v: &Volume, b: u64) -> Vec<u8> {
    let mut back = vec![0u8; BS as usize];
    v.read_at(&mut back, b * BS).unwrap();
    back
}

/// Opens `home` with `jnl` and checks that each `(block, byte)` reads as
/// that byte throughout, then closes.
fn opens_with(home: &Arc<FaultDevice>, jnl: &Arc<FaultDevice>, blocks: &[(u64, u8)]) {
    let v = open_with(home, jnl, &quiet_open_options()).unwrap();
    for &(b, byte) in blocks {
        assert_eq!(read_block(&v, b), vec![byte; BS as usize], "block {b}");
    }
    v.close().unwrap();
}

#[test]
fn a_journal_restored_from_an_old_copy_is_refused_not_replayed() {
    let (home, jnl) = devices();
    let (v1, v2) = (
        stamped(1, 5 * BS, BS as usize),
        stamped(2, 5 * BS, BS as usize),
    );
    // Session 1 writes v1; the journal is copied while its log holds it.
    let v = open_with(&home, &jnl, &quiet_open_options()).unwrap();
    v.write_at(&v1, 5 * BS, WriteFlags::FUA).unwrap();
    let old_copy = jnl.durable_image();
    v.close().unwrap();
    // Session 2 writes v2, and its close puts it home.
    let v = open_with(&home, &jnl, &quiet_open_options()).unwrap();
    v.write_at(&v2, 5 * BS, WriteFlags::FUA).unwrap();
    v.close().unwrap();
    // The old copy comes back: refused, read-write and read-only, instead
    // of replaying v1 over v2.
    let restored = Arc::new(FaultDevice::from_image(old_copy, SECTOR as u32));
    for read_only in [false, true] {
        let o = OpenOptions {
            read_only,
            ..quiet_open_options()
        };
        let e = match open_with(&home, &restored, &o) {
            Ok(v) => panic!(
                "a stale journal was accepted (read_only {read_only}); block 5 reads {}",
                if read_block(&v, 5) == v1 {
                    "v1: rolled back"
                } else {
                    "v2"
                }
            ),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("stale") && e.contains("journal reset"), "{e}");
    }
    // The current journal still opens, with v2.
    let v = open_with(&home, &jnl, &quiet_open_options()).unwrap();
    assert_eq!(read_block(&v, 5), v2);
    v.close().unwrap();
    // A reset discards the stale copy without --force (nothing in it is
    // wanted), and the volume opens with it, with v2.
    let r = reset_without_force(&home, &restored).unwrap();
    assert!(r.previous.contains("stale"), "{r:?}");
    let v = open_with(&home, &restored, &quiet_open_options()).unwrap();
    assert_eq!(read_block(&v, 5), v2);
    v.close().unwrap();
}

/// A clean old copy put back is refused too (session 26's pass): the
/// home cannot tell whether its last session closed cleanly (then the
/// copy would be harmless) or crashed with writes only the live journal
/// held (then opening loses them, and leaves blocks the checkpoint had
/// half written home). A reset without --force replaces it, and the volume
/// then opens with everything its home holds.
#[test]
fn a_clean_old_copy_is_refused_until_it_is_reset() {
    let (home, jnl) = devices();
    let v = open_with(&home, &jnl, &quiet_open_options()).unwrap();
    v.close().unwrap();
    let clean_copy = jnl.durable_image();
    let v = open_with(&home, &jnl, &quiet_open_options()).unwrap();
    v.write_at(&[9u8; BS as usize], 0, WriteFlags::FUA).unwrap();
    v.close().unwrap();
    assert!(
        v_session(&home) >= 2,
        "each read-write open takes a new session"
    );
    let restored = Arc::new(FaultDevice::from_image(clean_copy, SECTOR as u32));
    for read_only in [false, true] {
        let e = open_error(&home, &restored, read_only);
        assert!(
            e.contains("stale") && e.contains("closed cleanly by session"),
            "{e}"
        );
    }
    opens_with(&home, &jnl, &[(0, 9u8)]);
    let r = reset_without_force(&home, &restored).unwrap();
    assert!(r.previous.contains("stale"), "{r:?}");
    opens_with(&home, &restored, &[(0, 9u8)]);
}

/// Session 26's pass: a journal copied while the volume was closed (clean),
/// put back over the live journal after a crash that left acknowledged
/// writes in the live log only, some of them half checkpointed. The old
/// binary opened it (and `check` said ok) and served a mix: blocks of one
/// acknowledged write from before it and after it.
#[test]
fn a_clean_old_copy_put_back_after_a_crash_is_refused() {
    // One power supply for both: the crash stops them at one instant (two
    // images taken one after the other could straddle a checkpoint round
    // and look like a home older than its journal).
    let power = jbdev_device::fault::PowerDomain::new();
    let (home, jnl) = common::external_journal_devices_in(DATA, JOURNAL, power.clone());
    let v = open_with(&home, &jnl, &quiet_open_options()).unwrap();
    v.write_at(&[1u8; 8 * BS as usize], 0, WriteFlags::FUA)
        .unwrap();
    v.close().unwrap();
    let clean_copy = jnl.durable_image();
    let v = open_with(&home, &jnl, &fast_checkpoints()).unwrap();
    let before = v.stats().checkpoints;
    v.write_at(&[2u8; 8 * BS as usize], 0, WriteFlags::FUA)
        .unwrap();
    checkpointed_after(&v, before);
    v.write_at(&[3u8; 8 * BS as usize], 0, WriteFlags::FUA)
        .unwrap();
    power.cut_power();
    let (home, jnl) = crashed(&home, &jnl);
    drop(v);
    let restored = Arc::new(FaultDevice::from_image(clean_copy, SECTOR as u32));
    let e = open_error(&home, &restored, false);
    assert!(e.contains("stale"), "{e}");
    // The live journal replays the last write.
    opens_with(&home, &jnl, &[(0, 3u8), (7, 3u8)]);
}

/// The volume superblock's session stamp.
fn v_session(home: &FaultDevice) -> u32 {
    let img = home.durable_image();
    jbdev_volume::superblock::VolumeSuperblock::decode(&img[..512])
        .unwrap()
        .journal_session
}

/// A crash image of both devices of a running volume: what is durable now.
fn crashed(home: &FaultDevice, jnl: &FaultDevice) -> (Arc<FaultDevice>, Arc<FaultDevice>) {
    let img = |d: &FaultDevice| Arc::new(FaultDevice::from_image(d.durable_image(), SECTOR as u32));
    (img(home), img(jnl))
}

fn open_error(home: &Arc<FaultDevice>, jnl: &Arc<FaultDevice>, read_only: bool) -> String {
    let o = OpenOptions {
        read_only,
        ..quiet_open_options()
    };
    match open_with(home, jnl, &o) {
        Ok(v) => panic!(
            "opened (read_only {read_only}); block 0 starts {:#x}",
            read_block(&v, 0)[0]
        ),
        Err(e) => e.to_string(),
    }
}

/// Found by an adversarial pass (session 21): the home restored from a
/// backup two sessions old, under a live journal whose log needs replay,
/// opened silently and served a state that never existed (the last
/// session's write over the backup's data, the session between lost).
/// A journal stamped ahead of its home by more than an interrupted open
/// is now refused; the current pair still opens.
#[test]
fn an_older_home_under_a_journal_that_needs_replay_is_refused() {
    let (home, jnl) = devices();
    let blocks = |b: u8| vec![b; 16 * BS as usize];
    let v = open_with(&home, &jnl, &quiet_open_options()).unwrap();
    v.write_at(&blocks(0xaa), 0, WriteFlags::FUA).unwrap();
    v.close().unwrap();
    let backup = home.durable_image();
    let v = open_with(&home, &jnl, &quiet_open_options()).unwrap();
    v.write_at(&blocks(0xbb), 0, WriteFlags::FUA).unwrap();
    v.close().unwrap();
    let v = open_with(&home, &jnl, &quiet_open_options()).unwrap();
    v.write_at(&[0xcc; BS as usize], 0, WriteFlags::FUA)
        .unwrap();
    let (home3, jnl3) = crashed(&home, &jnl);
    drop(v);
    let restored = Arc::new(FaultDevice::from_image(backup, SECTOR as u32));
    for read_only in [false, true] {
        let e = open_error(&restored, &jnl3, read_only);
        assert!(
            e.contains("ahead of the volume") && e.contains("older copy"),
            "{e}"
        );
    }
    // Without --force a reset refuses to discard it too.
    let e = reset_without_force(&restored, &jnl3).unwrap_err();
    assert!(e.to_string().contains("ahead of the volume"), "{e}");
    // The pair as it crashed recovers: 0xcc over 0xbb.
    opens_with(&home3, &jnl3, &[(0, 0xcc), (1, 0xbb)]);
}

/// Found by an adversarial pass (session 21): a copy of a volume (home
/// and journal copied, as a VM disk is) records the original's journal
/// path, so it opened the original's journal; after a crash of the copy,
/// the original's next open replayed the copy's writes into the original
/// and marked the journal clean, and the copy lost its acknowledged
/// write. Now the original refuses that journal, and the copy recovers.
#[test]
fn a_journal_a_copy_of_the_volume_wrote_is_not_replayed_into_the_original() {
    let (home, jnl) = devices();
    let v = open_with(&home, &jnl, &quiet_open_options()).unwrap();
    v.write_at(&[0xaa; 2 * BS as usize], 0, WriteFlags::FUA)
        .unwrap();
    v.close().unwrap();
    let copy = Arc::new(FaultDevice::from_image(home.durable_image(), SECTOR as u32));
    // The copy opens the original's journal and crashes after a FUA write.
    let v = open_with(&copy, &jnl, &quiet_open_options()).unwrap();
    v.write_at(&[0xee; BS as usize], 0, WriteFlags::FUA)
        .unwrap();
    let (copy_crashed, jnl_crashed) = crashed(&copy, &jnl);
    drop(v);
    let (original, journal_before) = (home.durable_image(), jnl_crashed.durable_image());
    let e = open_error(&home, &jnl_crashed, false);
    assert!(e.contains("another copy of this volume"), "{e}");
    // Nothing was replayed into the original nor changed in the journal,
    // and the copy recovers its acknowledged write from it.
    assert!(home.durable_image() == original, "the original was written");
    assert!(jnl_crashed.durable_image() == journal_before);
    opens_with(&copy_crashed, &jnl_crashed, &[(0, 0xee), (1, 0xaa)]);
}

/// Found by an adversarial pass (session 21): `journal reset` without
/// --force took another volume's journal whose log needed replay for a
/// stale copy of its own (the stale test ran before the uuid test, and
/// ignored the uuid) and replaced it: that volume's acknowledged writes
/// were lost, and it no longer opened.
#[test]
fn a_reset_without_force_leaves_another_volume_s_journal_alone() {
    let (home_a, jnl_a) = devices();
    let (home_b, jnl_b) = devices();
    // B: one session, a FUA write, a crash: its journal needs replay.
    let v = open_with(&home_b, &jnl_b, &quiet_open_options()).unwrap();
    v.write_at(&[0xbb; BS as usize], 0, WriteFlags::FUA)
        .unwrap();
    let (home_b, jnl_b) = crashed(&home_b, &jnl_b);
    drop(v);
    // A: opened more often than B, so B's stamp is below A's.
    for _ in 0..3 {
        open_with(&home_a, &jnl_a, &quiet_open_options())
            .unwrap()
            .close()
            .unwrap();
    }
    let before = jnl_b.durable_image();
    let e = reset_without_force(&home_a, &jnl_b).unwrap_err();
    assert!(e.to_string().contains("another volume"), "{e}");
    assert!(jnl_b.durable_image() == before, "B's journal was changed");
    opens_with(&home_b, &jnl_b, &[(0, 0xbb)]);
}

/// The stamps of an open are three flushed writes (pending, journal,
/// volume). Power cut after each mutating op of an open that has a log to
/// replay, and again during the next open of what survived: every state
/// opens, with the acknowledged write. (The first version of the pending
/// rule accepted only a journal stamp equal to the pending number, and
/// refused two opens interrupted in a row as "ahead".)
#[test]
fn opens_cut_short_at_every_write_twice_in_a_row_still_open() {
    use jbdev_device::fault::PowerDomain;
    let (home, jnl) = devices();
    let v = open_with(&home, &jnl, &quiet_open_options()).unwrap();
    v.write_at(&[0x5a; BS as usize], 0, WriteFlags::FUA)
        .unwrap();
    let (h0, j0) = (home.durable_image(), jnl.durable_image());
    drop(v);
    // Devices on one power supply that fails after `n` mutating ops.
    let powered = |h: Vec<u8>, j: Vec<u8>, n: Option<u64>| {
        let power = PowerDomain::new();
        let h = Arc::new(FaultDevice::from_image_in_domain(
            h,
            SECTOR as u32,
            power.clone(),
        ));
        let j = Arc::new(FaultDevice::from_image_in_domain(
            j,
            SECTOR as u32,
            power.clone(),
        ));
        if let Some(n) = n {
            power.crash_after_ops(n);
        }
        (h, j)
    };
    let mut cut = 0;
    for first in 0..64 {
        let (h1, j1) = powered(h0.clone(), j0.clone(), Some(first));
        let done = open_with(&h1, &j1, &quiet_open_options()).is_ok();
        let (h1, j1) = (h1.durable_image(), j1.durable_image());
        for second in 0..64 {
            let (h2, j2) = powered(h1.clone(), j1.clone(), Some(second));
            let ok2 = open_with(&h2, &j2, &quiet_open_options()).is_ok();
            let (h3, j3) = powered(h2.durable_image(), j2.durable_image(), None);
            match open_with(&h3, &j3, &quiet_open_options()) {
                Ok(v) => {
                    assert_eq!(read_block(&v, 0), vec![0x5a; BS as usize]);
                    v.close().unwrap();
                }
                Err(e) => panic!("cut after {first} then {second} ops: reopen refused: {e}"),
            }
            cut += 1;
            if ok2 {
                break;
            }
        }
        if done {
            break;
        }
    }
    assert!(
        cut > 4,
        "only {cut} cut points: the opens write less than assumed"
    );
}

/// Found by an adversarial pass (session 21; left alone since session 19):
/// a copy of the journal taken while the volume ran carries the current
/// session's stamp, so after a crash that lost the live journal the copy,
/// put back, was replayed over home blocks the checkpoint had written
/// since: a FUA-acknowledged, checkpointed block rolled back. The
/// checkpoint now records its newest transaction in the volume superblock
/// (`checkpoint_sequence`), and a log that ends before it is refused.
#[test]
fn a_journal_copy_older_than_what_the_checkpoint_wrote_home_is_refused() {
    let (home, jnl) = devices();
    let v = open_with(&home, &jnl, &fast_checkpoints()).unwrap();
    v.write_at(&[0xa1; BS as usize], 0, WriteFlags::FUA)
        .unwrap();
    let copy = jnl.durable_image();
    let before = v.stats().checkpoints;
    v.write_at(&[0xb2; BS as usize], 0, WriteFlags::FUA)
        .unwrap();
    checkpointed_after(&v, before);
    let (home_now, jnl_now) = crashed(&home, &jnl);
    drop(v);
    // The live journal as it crashed recovers 0xb2.
    let (h, j) = (
        Arc::new(FaultDevice::from_image(
            home_now.durable_image(),
            SECTOR as u32,
        )),
        Arc::new(FaultDevice::from_image(
            jnl_now.durable_image(),
            SECTOR as u32,
        )),
    );
    opens_with(&h, &j, &[(0, 0xb2)]);
    // The copy is refused instead of rolling block 0 back to 0xa1.
    let restored = Arc::new(FaultDevice::from_image(copy, SECTOR as u32));
    let e = open_error(&home_now, &restored, false);
    assert!(e.contains("stale") && e.contains("roll back"), "{e}");
    // A reset discards it without --force, and clears the mark with it;
    // the volume then opens with what its home holds.
    let r = reset_without_force(&home_now, &restored).unwrap();
    assert!(r.previous.contains("stale"), "{r:?}");
    let img = home_now.durable_image();
    let sb = jbdev_volume::superblock::VolumeSuperblock::decode(&img[..512]).unwrap();
    assert_eq!(sb.checkpoint_sequence, 0);
    opens_with(&home_now, &restored, &[(0, 0xb2)]);
}

/// A copy of a volume with an external journal records the same journal
/// path as its original. After the original crashed with writes only in
/// its journal, opening the copy by that path replayed the journal into
/// the copy and left it clean: the original then opened "clean" without
/// its acknowledged writes (session 23's adversarial pass). The journal
/// now records which file last opened it, and a copy is refused (naming
/// the journal), while the original, and the copy given the journal with
/// `--journal` on purpose, still recover.
#[test]
fn a_copy_of_a_volume_does_not_replay_its_original_s_journal() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let (x, j, y) = (
        dir.path().join("x.img"),
        dir.path().join("x.jnl"),
        dir.path().join("y.img"),
    );
    let mut f = FormatOptions::new(4 << 20);
    f.journal_bytes = Some(1 << 20);
    f.journal = jbdev_volume::JournalPlacement::External(j.clone());
    let opts = OpenOptions {
        checkpoint_interval: std::time::Duration::from_secs(3600),
        ..OpenOptions::default()
    };
    let v = Volume::create(&x, &f, &opts).unwrap();
    v.write_at(&[0x5a; 4096], 8192, WriteFlags::FUA).unwrap();
    assert!(
        v.stats().checkpoint_blocks == 0,
        "the write must be in the journal only"
    );
    // The crash image: both files as they are now, put back after a clean
    // close (same inodes, as after a real crash).
    let (x_crash, j_crash) = (std::fs::read(&x).unwrap(), std::fs::read(&j).unwrap());
    v.close().unwrap();
    std::fs::write(&x, &x_crash).unwrap();
    std::fs::write(&j, &j_crash).unwrap();
    std::fs::copy(&x, &y).unwrap();

    let e = Volume::open(&y, &opts)
        .err()
        .expect("the copy replayed the original's journal");
    let msg = e.to_string();
    assert!(
        msg.contains("another file or image opened it last"),
        "{msg}"
    );
    assert!(msg.contains(&j.display().to_string()), "{msg}");
    assert_eq!(
        std::fs::read(&j).unwrap(),
        j_crash,
        "the refused open changed the journal"
    );
    // A read-only look at the copy is allowed and changes nothing.
    let ro = OpenOptions {
        read_only: true,
        ..opts.clone()
    };
    Volume::open(&y, &ro).unwrap().close().unwrap();
    assert_eq!(std::fs::read(&j).unwrap(), j_crash);

    // The original recovers its write.
    let v = Volume::open(&x, &opts).unwrap();
    let mut got = vec![0u8; 4096];
    v.read_at(&mut got, 8192).unwrap();
    assert!(
        got.iter().all(|&b| b == 0x5a),
        "the original lost its write"
    );
    v.close().unwrap();
    // Given on purpose, the journal replays into the copy too.
    std::fs::write(&j, &j_crash).unwrap();
    let given = OpenOptions {
        journal_path: Some(j.clone()),
        ..opts.clone()
    };
    let v = Volume::open(&y, &given).unwrap();
    v.read_at(&mut got, 8192).unwrap();
    assert!(got.iter().all(|&b| b == 0x5a));
    v.close().unwrap();
    // Restored in place (a new file at the original's path, as a backup
    // or a crash image is put back) it is the volume itself.
    let restored = dir.path().join("x.restored");
    std::fs::write(&restored, &x_crash).unwrap();
    std::fs::rename(&restored, &x).unwrap();
    std::fs::write(&j, &j_crash).unwrap();
    let v = Volume::open(&x, &opts).unwrap();
    v.read_at(&mut got, 8192).unwrap();
    assert!(
        got.iter().all(|&b| b == 0x5a),
        "the restored original lost its write"
    );
    v.close().unwrap();
}

/// Waits (bounded) until a checkpoint after the first `before` has run and
/// every committed transaction is home, the journal's tail past them.
fn checkpointed_after(v: &Volume, before: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while v.stats().checkpoints <= before || v.stats().checkpoint_lag_transactions > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint within 20 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Quiet options whose checkpoint runs every 5 ms.
fn fast_checkpoints() -> OpenOptions {
    OpenOptions {
        checkpoint_interval: std::time::Duration::from_millis(5),
        ..quiet_open_options()
    }
}

/// Found by session 25's RBD pass: a snapshot of the home alone (its
/// journal on a second image), put back under a journal that went on
/// (`rbd snap rollback` of the home image), opened silently. Under a log
/// that needed replay, the replay mixed the two (blocks neither old nor
/// new); under a clean journal, the writes only the journal had held at
/// the snapshot were gone. The journal had dropped transactions the old
/// home lacked, and its checkpoint mark shows it: every open now refuses
/// such a pair, a reset without --force refuses to discard the journal,
/// and the pair taken at one moment still opens.
#[test]
fn a_home_older_than_its_journal_is_refused_clean_or_not() {
    // One power supply for both: the crash below stops them at one instant
    // (the checkpoint runs every 5 ms, and two images taken one after the
    // other could straddle one of its rounds).
    let power = jbdev_device::fault::PowerDomain::new();
    let (home, jnl) = common::external_journal_devices_in(DATA, JOURNAL, power.clone());
    let o = fast_checkpoints();
    let v = open_with(&home, &jnl, &o).unwrap();
    let before = v.stats().checkpoints;
    v.write_at(&[0xa1; BS as usize], 0, WriteFlags::FUA)
        .unwrap();
    checkpointed_after(&v, before);
    // The home alone, snapshotted with 0xa1 home: a later write is
    // acknowledged, checkpointed and dropped from the log.
    let home_snapshot = home.durable_image();
    let before = v.stats().checkpoints;
    v.write_at(&[0xb2; BS as usize], BS, WriteFlags::FUA)
        .unwrap();
    checkpointed_after(&v, before);
    v.write_at(&[0xc3; BS as usize], 2 * BS, WriteFlags::FUA)
        .unwrap();
    power.cut_power();
    let (home_now, jnl_now) = crashed(&home, &jnl);
    drop(v);
    let old_home = || {
        Arc::new(FaultDevice::from_image(
            home_snapshot.clone(),
            SECTOR as u32,
        ))
    };
    for read_only in [false, true] {
        let e = open_error(&old_home(), &jnl_now, read_only);
        assert!(e.contains("home is older than its journal"), "{e}");
    }
    let e = reset_without_force(&old_home(), &jnl_now).unwrap_err();
    assert!(e.to_string().contains("older than its journal"), "{e}");
    // The pair as it crashed recovers all three writes, and closes clean.
    let v = open_with(&home_now, &jnl_now, &quiet_open_options()).unwrap();
    for (b, byte) in [(0, 0xa1), (1, 0xb2), (2, 0xc3)] {
        assert_eq!(read_block(&v, b), vec![byte; BS as usize], "block {b}");
    }
    v.close().unwrap();
    // A clean journal that went on past the old home (in a later session)
    // is refused too.
    let e = open_error(&old_home(), &jnl_now, false);
    assert!(e.contains("home is older than its journal"), "{e}");
    opens_with(&home_now, &jnl_now, &[(0, 0xa1), (1, 0xb2), (2, 0xc3)]);

    // Closed clean in the session the snapshot was taken in: the mark
    // tells, as the session stamps cannot.
    let (home, jnl) = devices();
    let v = open_with(&home, &jnl, &o).unwrap();
    let before = v.stats().checkpoints;
    v.write_at(&[0xd4; BS as usize], 0, WriteFlags::FUA)
        .unwrap();
    checkpointed_after(&v, before);
    let snapshot = home.durable_image();
    v.write_at(&[0xe5; BS as usize], BS, WriteFlags::FUA)
        .unwrap();
    v.close().unwrap();
    let old = Arc::new(FaultDevice::from_image(snapshot, SECTOR as u32));
    let e = open_error(&old, &jnl, false);
    assert!(e.contains("dropped it from its log"), "{e}");
    opens_with(&home, &jnl, &[(0, 0xd4), (1, 0xe5)]);
}

/// The mark an open sets keeps up with the log: a crash, a replaying open,
/// more writes and a second crash before any checkpoint (the log then
/// starts after every transaction the checkpoint ever marked) still opens,
/// and so does a replaying open cut short at each of its writes.
#[test]
fn a_replaying_open_leaves_a_mark_the_next_crash_agrees_with() {
    let (home, jnl) = devices();
    let v = open_with(&home, &jnl, &quiet_open_options()).unwrap();
    v.write_at(&[0x11; BS as usize], 0, WriteFlags::FUA)
        .unwrap();
    let (h1, j1) = crashed(&home, &jnl);
    drop(v);
    let v = open_with(&h1, &j1, &quiet_open_options()).unwrap();
    assert!(v.recovery_report().blocks_replayed > 0);
    v.write_at(&[0x22; BS as usize], BS, WriteFlags::FUA)
        .unwrap();
    let (h2, j2) = crashed(&h1, &j1);
    drop(v);
    opens_with(&h2, &j2, &[(0, 0x11), (1, 0x22)]);
    // The replaying open of (h1, j1) cut short after each of its writes.
    for ops in 0..12 {
        let (h, j) = crashed(&h1, &j1);
        h.crash_after_ops(ops);
        j.crash_after_ops(ops);
        let r = open_with(&h, &j, &quiet_open_options());
        let (hc, jc) = crashed(&h, &j);
        drop(r);
        opens_with(&hc, &jc, &[(0, 0x11)]);
    }
}

/// The same across the wrap of the journal's sequence (session 32's limits
/// pass): the checkpoint records transaction 0 as `checkpoint_sequence =
/// 0`, which was read as "no mark", so an old copy of the journal ending
/// before it was replayed over the newer home blocks, with `check` clean.
#[test]
fn an_old_copy_ending_before_transaction_0_after_a_wrap_is_refused() {
    let (home, jnl) = devices();
    // The journal's next transaction is 2^32 - 2.
    let mut image = jnl.durable_image();
    let mut jsb =
        jbdev_volume::journal::format::JournalSuperblock::decode(&image[..BS as usize]).unwrap();
    jsb.sequence = u32::MAX - 1;
    jsb.encode(&mut image[..BS as usize]);
    let jnl = Arc::new(FaultDevice::from_image(image, SECTOR as u32));
    let (old, new) = (
        stamped(1, 5 * BS, BS as usize),
        stamped(2, 5 * BS, BS as usize),
    );
    let v = open_with(&home, &jnl, &quiet_open_options()).unwrap();
    v.write_at(&old, 5 * BS, WriteFlags::FUA).unwrap();
    let old_copy = jnl.durable_image();
    v.write_at(&new, 5 * BS, WriteFlags::FUA).unwrap();
    v.write_at(&stamped(3, 6 * BS, BS as usize), 6 * BS, WriteFlags::FUA)
        .unwrap();
    v.close().unwrap();
    let restored = Arc::new(FaultDevice::from_image(old_copy, SECTOR as u32));
    match open_with(&home, &restored, &quiet_open_options()) {
        Ok(v) => panic!(
            "a stale journal was accepted after the wrap; block 5 reads {}",
            if read_block(&v, 5) == old {
                "the old copy: rolled back"
            } else {
                "the new copy"
            }
        ),
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains("stale"), "{e}");
        }
    }
    opens_with_block(&home, &jnl, 5, &new);
}

fn opens_with_block(home: &Arc<FaultDevice>, jnl: &Arc<FaultDevice>, b: u64, want: &[u8]) {
    let v = open_with(home, jnl, &quiet_open_options()).unwrap();
    assert_eq!(read_block(&v, b), want, "block {b}");
    v.close().unwrap();
}
