//! Replay honours the newest revoke of a block (session 24's mutation pass).
//!
//! Deterministic cover for mutant M10 (the revoke pass keeping the *oldest*
//! revoke of a block instead of the newest). Only 2 of the simulator's 3000
//! default seeds killed it, and no deterministic test did: a change of
//! seeds or of the simulator's workload mix could let it through.
//!
//! A block written journaled, then direct, then journaled again, then
//! direct again: the log holds copy A (T1), a revoke (T2), copy B (T3) and a
//! revoke (T4). Replay must cancel B by T4's revoke; with only T2's revoke
//! remembered, B (older than the last direct write) is put back over it.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use jbdev_device::fault::FaultDevice;
use jbdev_volume::{OpenOptions, Volume, WriteFlags};

const BS: u64 = 4096;
const DATA: u64 = 4 << 20;
const JOURNAL: u64 = 512 << 10;
const SECTOR: u32 = 512;
const BIG: usize = 64 << 10;

/// Writes of BIG bytes go straight home; no background commit or
/// checkpoint: every transaction stays in the log for replay.
fn opts() -> OpenOptions {
    common::direct_from(BIG as u64)
}

use common::pattern;

#[test]
fn a_copy_between_two_revokes_is_not_replayed_over_the_second_direct_write() {
    let dev = common::formatted_fault_device(DATA, JOURNAL);
    let vol = Volume::open_device(dev.clone(), None, &opts()).expect("open");
    let off = 32 * BS;
    let x = off + 3 * BS;

    let s0 = vol.stats();
    vol.write_at(&pattern(BS as usize, 1), x, WriteFlags::FUA)
        .expect("journaled A");
    vol.write_at(&pattern(BIG, 2), off, WriteFlags::FUA)
        .expect("direct 1");
    vol.write_at(&pattern(BS as usize, 3), x, WriteFlags::FUA)
        .expect("journaled B");
    let last = pattern(BIG, 4);
    vol.write_at(&last, off, WriteFlags::FUA).expect("direct 2");
    let s1 = vol.stats();
    assert_eq!(s1.direct_writes, s0.direct_writes + 2, "two direct writes");
    assert_eq!(
        s1.checkpoints, s0.checkpoints,
        "nothing checkpointed: all in the log"
    );

    let mut back = vec![0u8; BIG];
    vol.read_at(&mut back, off).expect("read");
    assert!(back == last, "live read");

    dev.cut_power();
    drop(vol);
    let img = Arc::new(FaultDevice::from_image(dev.durable_image(), SECTOR));
    let vol = Volume::open_device(img, None, &opts()).expect("recovery");
    vol.read_at(&mut back, off).expect("read after recovery");
    let bad: Vec<u64> = (0..BIG as u64 / BS)
        .filter(|b| {
            let r = (*b * BS) as usize..((*b + 1) * BS) as usize;
            back[r.clone()] != last[r]
        })
        .collect();
    assert!(
        bad.is_empty(),
        "blocks {bad:?} of the last acknowledged (FUA) direct write were replaced at replay \
         (block 3 = the journaled copy B between the two revokes)"
    );
}

/// A volume on a fault device whose log holds copy A of block `x`, inside
/// the range at `off` of a direct write of `direct`; `newest` is a newer
/// copy L of `x`: (device, volume, off, x, direct, newest).
struct Scene(Arc<FaultDevice>, Volume, u64, u64, Vec<u8>, Vec<u8>);

fn scene() -> Scene {
    let dev = common::formatted_fault_device(DATA, JOURNAL);
    let vol = Volume::open_device(dev.clone(), None, &opts()).expect("open");
    let off = 32 * BS;
    let x = off + 3 * BS;
    vol.write_at(&pattern(BS as usize, 1), x, WriteFlags::FUA)
        .expect("journaled A");
    Scene(dev, vol, off, x, pattern(BIG, 2), pattern(BS as usize, 3))
}

/// A journaled copy A of a block, then a direct write over it without FUA
/// (its revoke waits in the running transaction), then a journaled copy L
/// of the same block, then a flush. The revoke and L once went into the
/// same transaction, where the revoke was dropped (it would have cancelled
/// L too, by jbd2's rule); with that transaction damaged, recovery put A
/// back next to the direct write's other blocks, a state that never
/// existed (session 30's verify pass, F3). The revoke must reach the log
/// in a transaction before L's.
#[test]
fn a_revoke_superseded_in_its_own_transaction_still_precedes_the_newer_copy() {
    let Scene(dev, vol, off, x, direct, newest) = scene();
    vol.write_at(&direct, off, WriteFlags::NONE)
        .expect("direct, no FUA");
    vol.write_at(&newest, x, WriteFlags::FUA)
        .expect("journaled L");
    vol.flush().expect("flush");
    dev.cut_power();
    drop(vol);
    revoke_precedes_the_newer_copy(&dev, x, &direct[3 * BS as usize..4 * BS as usize], &newest);
}

/// A journaled copy A of a block, then a direct write over it with FUA and
/// a journaled copy L of the same block that arrives while the direct
/// write's home I/O is in flight. L once went into the log at once, so the
/// direct write found a newer copy of the block and added no revoke for it
/// (replay must not cancel the newer copy); with L's transaction damaged,
/// recovery put A back next to the direct write's other blocks (the racing
/// case left open in session 31). L now waits for the direct write and
/// logs its copy after the revoke.
#[test]
fn a_journaled_write_racing_a_direct_write_logs_its_copy_after_the_revoke() {
    let Scene(dev, vol, off, x, direct, newest) = scene();
    let hold = hold_home(&dev, off);
    std::thread::scope(|s| {
        let d = s.spawn(|| vol.write_at(&direct, off, WriteFlags::FUA));
        assert!(
            hold.wait_reached(Duration::from_secs(60)),
            "the direct write never reached its home I/O"
        );
        let l = s.spawn(|| vol.write_at(&newest, x, WriteFlags::FUA));
        // L runs as far as it can while the direct write is held: to its
        // end (the old order) or into its wait for the direct write.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !l.is_finished() && vol.stats().revoke_order_waits == 0 {
            assert!(Instant::now() < deadline, "L neither finished nor waited");
            std::thread::sleep(Duration::from_millis(1));
        }
        hold.release();
        d.join().expect("direct thread").expect("direct write");
        l.join().expect("L thread").expect("journaled L");
    });
    assert_eq!(vol.stats().direct_writes, 1, "one direct write");
    dev.cut_power();
    drop(vol);
    revoke_precedes_the_newer_copy(&dev, x, &direct[3 * BS as usize..4 * BS as usize], &newest);
}

/// A journaled write L waits for a direct write D1 in flight over its block
/// (as above); a second direct write D2 over the block that arrives
/// meanwhile waits for L, rather than L waiting for D2 too. L used to wait
/// for every overlapping direct write in flight, so a stream of them with
/// no gap kept it waiting (up to about a second in session 32's verify
/// pass). D2 then goes after L: newest everywhere, also after a crash.
#[test]
fn a_direct_write_arriving_while_a_journaled_write_waits_goes_after_it() {
    let Scene(dev, vol, off, x, direct, newest) = scene();
    let second = pattern(BIG, 5);
    let hold = hold_home(&dev, off);
    // A bound on an event that takes microseconds, not a timing check.
    let waits_reach = |n: u64| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while vol.stats().revoke_order_waits < n {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    };
    let (l_waited, d2_waited) = std::thread::scope(|s| {
        let d1 = s.spawn(|| vol.write_at(&direct, off, WriteFlags::FUA));
        assert!(
            hold.wait_reached(Duration::from_secs(60)),
            "the first direct write never reached its home I/O"
        );
        let l = s.spawn(|| vol.write_at(&newest, x, WriteFlags::FUA));
        let l_waited = waits_reach(1);
        let d2 = s.spawn(|| vol.write_at(&second, off, WriteFlags::FUA));
        let d2_waited = waits_reach(2);
        // Released whatever happened, so the threads end and a failure
        // reports instead of hanging.
        hold.release();
        d1.join().expect("D1 thread").expect("first direct write");
        l.join().expect("L thread").expect("journaled L");
        d2.join().expect("D2 thread").expect("second direct write");
        (l_waited, d2_waited)
    });
    assert!(l_waited, "L never waited for the first direct write");
    assert!(
        d2_waited,
        "the second direct write went in ahead of L (L waited for it too)"
    );
    let mut back = vec![0u8; BIG];
    vol.read_at(&mut back, off).expect("read");
    assert!(back == second, "the second direct write is the newest");
    dev.cut_power();
    drop(vol);
    let vol = Volume::open_device(
        Arc::new(FaultDevice::from_image(dev.durable_image(), SECTOR)),
        None,
        &opts(),
    )
    .expect("recovery");
    vol.read_at(&mut back, off).expect("read after recovery");
    assert!(
        back == second,
        "the second direct write is the newest after recovery"
    );
}

/// Holds writes to the home of `[off, off + BIG)` on `dev`.
fn hold_home(dev: &FaultDevice, off: u64) -> Arc<jbdev_device::fault::WriteHold> {
    let image = dev.live_image();
    let data_offset = u64::from_le_bytes(image[40..48].try_into().expect("8 bytes"));
    assert!(
        data_offset >= BS + JOURNAL,
        "home after the journal: {data_offset}"
    );
    dev.hold_writes(data_offset + off, BIG as u64)
}

/// Checks the durable log of `dev`: two transactions hold copies of block
/// `x` (A, then L), and a direct write's revoke is logged between them; with
/// L's transaction damaged, the block reads the direct write's `direct`
/// (or `newest`, L), never A.
fn revoke_precedes_the_newer_copy(dev: &FaultDevice, x: u64, direct: &[u8], newest: &[u8]) {
    let mut image = dev.durable_image();

    let scan = jbdev_volume::journal::recovery::scan(
        &common::internal_journal_region(
            Arc::new(FaultDevice::from_image(image.clone(), SECTOR)),
            JOURNAL,
        ),
        &mut |_| {},
    )
    .expect("scan");
    let home = x / BS;
    let with_copy: Vec<u32> = scan
        .txns
        .iter()
        .filter(|t| !t.blocks.is_empty())
        .map(|t| t.sequence)
        .collect();
    let with_revoke: Vec<u32> = scan
        .txns
        .iter()
        .filter(|t| !t.revokes.is_empty())
        .map(|t| t.sequence)
        .collect();
    assert_eq!(with_copy.len(), 2, "A and L each committed: {with_copy:?}");
    assert!(
        with_revoke
            .iter()
            .any(|&r| r > with_copy[0] && r < with_copy[1]),
        "the direct write's revoke must be logged between A ({}) and L ({}); revokes in {with_revoke:?} (home block {home})",
        with_copy[0],
        with_copy[1]
    );

    // Damage L's transaction: the revoke still holds, so the block reads
    // the direct write (L is lost with its transaction), never A.
    let last = scan
        .txns
        .iter()
        .find(|t| t.sequence == with_copy[1])
        .expect("L's transaction");
    let at = (BS + u64::from(last.start_pos) * BS) as usize;
    image[at..at + BS as usize].fill(0);
    let ro = Volume::open_device(
        Arc::new(FaultDevice::from_image(image, SECTOR)),
        None,
        &OpenOptions {
            read_only: true,
            ..opts()
        },
    )
    .expect("read-only rescue");
    let mut back = vec![0u8; BS as usize];
    ro.read_at(&mut back, x).expect("read");
    assert!(
        back == direct || back == newest,
        "block {home} read A back after L's transaction was damaged"
    );
}
