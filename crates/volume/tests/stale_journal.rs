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
use jbdev_volume::{OpenOptions, Volume, WriteFlags};

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

fn read_block(v: &Volume, b: u64) -> Vec<u8> {
    let mut back = vec![0u8; BS as usize];
    v.read_at(&mut back, b * BS).unwrap();
    back
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
    let r = jbdev_volume::reset_journal_device(
        home.clone() as Arc<dyn BlockDevice>,
        Some(restored.clone() as Arc<dyn BlockDevice>),
        false,
    )
    .unwrap();
    assert!(r.previous.contains("stale"), "{r:?}");
    let v = open_with(&home, &restored, &quiet_open_options()).unwrap();
    assert_eq!(read_block(&v, 5), v2);
    v.close().unwrap();
}

/// A clean old copy is harmless (nothing to replay) and is accepted; so is
/// a journal written by a jbdev without stamps (session 0).
#[test]
fn a_clean_old_copy_and_an_unstamped_journal_are_accepted() {
    let (home, jnl) = devices();
    let v = open_with(&home, &jnl, &quiet_open_options()).unwrap();
    v.close().unwrap();
    let clean_copy = jnl.durable_image();
    let v = open_with(&home, &jnl, &quiet_open_options()).unwrap();
    v.write_at(&[9u8; BS as usize], 0, WriteFlags::FUA).unwrap();
    v.close().unwrap();
    let restored = Arc::new(FaultDevice::from_image(clean_copy, SECTOR as u32));
    let v = open_with(&home, &restored, &quiet_open_options()).unwrap();
    assert_eq!(read_block(&v, 0), vec![9u8; BS as usize]);
    v.close().unwrap();
    assert!(
        v_session(&home) >= 3,
        "each read-write open takes a new session"
    );
}

/// The volume superblock's session stamp.
fn v_session(home: &FaultDevice) -> u32 {
    let img = home.durable_image();
    jbdev_volume::superblock::VolumeSuperblock::decode(&img[..512])
        .unwrap()
        .journal_session
}
