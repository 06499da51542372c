//! The checkpoint skips a journaled copy of a block when a newer copy of it
//! is in a committed transaction that stays in the log (ARCHITECTURE,
//! "Checkpoint"): a block rewritten all the time goes home about once per
//! log wrap. Checked here: the skip happens, and a power cut at every device
//! op of a rewrite-heavy run recovers every acknowledged write — both the
//! rewritten blocks and a block written once, long checkpointed.

mod common;

use std::sync::Arc;

use common::{describe_sector, stamped, SECTOR};
use jbdev_device::fault::FaultDevice;
use jbdev_volume::{FormatOptions, Volume, WriteFlags};

const BS: u64 = 4096;
const DATA: u64 = 1 << 20;
/// 64 journal blocks: a rewrite of 4 blocks is a 6-block transaction, so
/// the checkpoint starts (half full) every few writes and runs many rounds.
const JOURNAL: u64 = 256 << 10;
/// Blocks rewritten by every write.
const HOT: (u64, usize) = (0, 4 * BS as usize);
/// Blocks written once, before the rewrites.
const COLD: (u64, usize) = (64 * BS, 2 * BS as usize);
const REWRITES: u64 = 200;
const COLD_ID: u64 = 7;

use common::quiet_open_options as opts;

fn base() -> Vec<u8> {
    let dev = Arc::new(FaultDevice::new(DATA + JOURNAL + 64 * 1024, SECTOR as u32));
    let mut f = FormatOptions::new(DATA);
    f.journal_bytes = Some(JOURNAL);
    Volume::format_device(dev.clone(), None, &f).expect("format");
    dev.durable_image()
}

fn read(vol: &Volume, (off, len): (u64, usize)) -> Vec<u8> {
    let mut b = vec![0u8; len];
    vol.read_at(&mut b, off).expect("read");
    b
}

struct Run {
    /// Ids of the hot writes acknowledged, and of the one that failed.
    acked: Option<u64>,
    cold_acked: bool,
    skipped: u64,
    ops: u64,
    image: Vec<u8>,
}

/// The cold write, then `REWRITES` FUA rewrites of the hot blocks, power
/// cut after `crash_after` device ops (or at the end).
fn run(base: &[u8], crash_after: Option<u64>) -> Run {
    let dev = Arc::new(FaultDevice::from_image(base.to_vec(), SECTOR as u32));
    let vol = Volume::open_device(dev.clone(), None, &opts()).expect("open");
    let at_open = dev.ops();
    if let Some(n) = crash_after {
        dev.crash_after_ops(n);
    }
    let cold_acked = vol
        .write_at(&stamped(COLD_ID, COLD.0, COLD.1), COLD.0, WriteFlags::FUA)
        .is_ok();
    let mut acked = None;
    if cold_acked {
        for id in 100..100 + REWRITES {
            if vol
                .write_at(&stamped(id, HOT.0, HOT.1), HOT.0, WriteFlags::FUA)
                .is_err()
            {
                break;
            }
            acked = Some(id);
        }
    }
    let skipped = vol.stats().checkpoint_blocks_skipped;
    let ops = dev.ops() - at_open;
    dev.cut_power();
    drop(vol);
    Run {
        acked,
        cold_acked,
        skipped,
        ops,
        image: dev.durable_image(),
    }
}

fn check(what: &str, r: &Run, base: &[u8]) {
    let vol = Volume::open_device(
        Arc::new(FaultDevice::from_image(r.image.clone(), SECTOR as u32)),
        None,
        &opts(),
    )
    .unwrap_or_else(|e| panic!("{what}: recovery failed: {e}"));
    let hot = read(&vol, HOT);
    // The last acknowledged rewrite, or the one in flight at the cut — whole.
    let first_unacked = r.acked.map_or(100, |a| a + 1);
    let ok = match r.acked {
        Some(a) => hot == stamped(a, HOT.0, HOT.1),
        None => hot == base_bytes(base, HOT),
    } || (r.cold_acked && hot == stamped(first_unacked, HOT.0, HOT.1));
    assert!(
        ok,
        "{what}: hot blocks read {} (last acknowledged rewrite {:?})",
        describe_sector(&hot[..SECTOR], HOT.0 / SECTOR as u64),
        r.acked
    );
    let cold = read(&vol, COLD);
    if r.cold_acked {
        assert!(
            cold == stamped(COLD_ID, COLD.0, COLD.1),
            "{what}: the block written once was lost: {}",
            describe_sector(&cold[..SECTOR], COLD.0 / SECTOR as u64)
        );
    }
}

fn base_bytes(base: &[u8], (off, len): (u64, usize)) -> Vec<u8> {
    let at = (BS + JOURNAL + off) as usize;
    base[at..at + len].to_vec()
}

#[test]
fn superseded_copies_are_skipped_and_every_crash_point_recovers() {
    let base = base();
    let whole = run(&base, None);
    assert_eq!(whole.acked, Some(100 + REWRITES - 1));
    assert!(
        whole.skipped > 0,
        "no checkpoint copy was skipped in {REWRITES} rewrites of the same blocks"
    );
    println!("{} ops, {} copies skipped", whole.ops, whole.skipped);
    check("no crash", &whole, &base);
    for n in 0..=whole.ops {
        let r = run(&base, Some(n));
        check(
            &format!("power cut after {n} of {} ops", whole.ops),
            &r,
            &base,
        );
    }
}

#[test]
fn a_clean_close_writes_the_newest_copies_home() {
    let base = base();
    let dev = Arc::new(FaultDevice::from_image(base.clone(), SECTOR as u32));
    let vol = Volume::open_device(dev.clone(), None, &opts()).expect("open");
    for id in 100..100 + REWRITES {
        vol.write_at(&stamped(id, HOT.0, HOT.1), HOT.0, WriteFlags::FUA)
            .expect("write");
    }
    vol.close().expect("close");
    // Home itself (no journal replay) holds the newest copy.
    let image = dev.durable_image();
    let last = stamped(100 + REWRITES - 1, HOT.0, HOT.1);
    assert!(
        base_bytes(&image, HOT) == last,
        "after a clean close home holds {}",
        describe_sector(&base_bytes(&image, HOT)[..SECTOR], 0)
    );
}

/// A checkpoint write that fails in the middle of a chunk's stream (other
/// writes of the chunk in flight before and after it) aborts the volume,
/// and the journal still holds every acknowledged write: a crash after it,
/// whatever the unflushed home writes did, recovers them all. Scattered
/// single blocks, so the chunk is 200 separate writes through a queue of
/// 32, completed in a seeded random order by the fault device.
#[test]
fn a_failed_write_mid_stream_aborts_and_recovery_finds_every_acknowledged_write() {
    const DATA: u64 = 4 << 20;
    // A quarter of this is more than the 200 transactions below take, so
    // the checkpoint runs only at close, as one round and one chunk.
    const JOURNAL: u64 = 16 << 20;
    const WRITES: u64 = 200;
    let block = |i: u64| 2 * i * BS;
    let mut f = FormatOptions::new(DATA);
    f.journal_bytes = Some(JOURNAL);
    let dev = Arc::new(FaultDevice::new(DATA + JOURNAL + 64 * 1024, SECTOR as u32));
    Volume::format_device(dev.clone(), None, &f).expect("format");
    let base = dev.durable_image();
    let home = |img: &[u8], i: u64| {
        let at = (BS + JOURNAL + block(i)) as usize;
        img[at..at + BS as usize].to_vec()
    };
    for (seed, fail_at) in [(1u64, 40u64), (2, 100), (3, 100), (4, 170)] {
        let what = format!("queue seed {seed}, op {fail_at} after the writes fails");
        let dev = Arc::new(FaultDevice::from_image(base.clone(), SECTOR as u32));
        dev.set_queue_seed(seed);
        let vol = Volume::open_device(dev.clone(), None, &opts()).expect("open");
        for i in 0..WRITES {
            vol.write_at(
                &stamped(i, block(i), BS as usize),
                block(i),
                WriteFlags::FUA,
            )
            .expect("write");
        }
        assert_eq!(
            vol.stats().checkpoints,
            0,
            "{what}: checkpoint before close"
        );
        dev.fail_op(fail_at);
        let ops_before = dev.ops();
        let closed = vol.close();
        let err = closed
            .expect_err(&format!("{what}: close succeeded"))
            .to_string();
        assert!(
            err.contains("checkpoint write failed"),
            "{what}: close failed otherwise: {err}"
        );
        // Mid-stream: some checkpoint writes landed before the failure.
        let live = dev.live_image();
        let landed = (0..WRITES)
            .filter(|&i| home(&live, i) == stamped(i, block(i), BS as usize))
            .count() as u64;
        assert!(
            landed > 10 && landed < WRITES,
            "{what}: {landed} of {WRITES} blocks home ({} ops)",
            dev.ops() - ops_before
        );
        for (kind, image) in [
            ("durable image", dev.durable_image()),
            ("crash image", dev.crash_image(seed)),
        ] {
            let vol = Volume::open_device(
                Arc::new(FaultDevice::from_image(image, SECTOR as u32)),
                None,
                &opts(),
            )
            .unwrap_or_else(|e| panic!("{what}, {kind}: recovery failed: {e}"));
            for i in 0..WRITES {
                let got = read(&vol, (block(i), BS as usize));
                assert!(
                    got == stamped(i, block(i), BS as usize),
                    "{what}, {kind}: acknowledged write {i} reads {}",
                    describe_sector(&got[..SECTOR], block(i) / SECTOR as u64)
                );
            }
        }
    }
}
