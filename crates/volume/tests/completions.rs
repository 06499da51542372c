//! Writes and flushes that report through a completion instead of waiting
//! (`Volume::write_at_then`, `Volume::flush_then`): one thread keeps many
//! FUA writes in flight, and a completion that says Ok means durable.
//!
//! The check: power is cut *inside* a completion (the k-th to run), so the
//! device's durable image at that moment is what a crash would leave. Every
//! write whose completion ran with Ok — before the cut or after it (a
//! commit whose flush finished before the cut) — must be in the recovered
//! image, and every completion must run exactly once, Ok or error.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use jbdev_device::fault::FaultDevice;
use jbdev_volume::{BatchPolicy, OpenOptions, Volume, WriteFlags};
use parking_lot::{Condvar, Mutex};

const GEO: Geometry = Geometry {
    data_bytes: 2 << 20,
    journal_bytes: 1 << 20,
};
/// Writes in flight from the one submitting thread.
const WRITES: u64 = 192;

/// Outcomes by write index, and how many completions ran.
#[derive(Default)]
struct Outcomes {
    ok: Vec<bool>,
    ran: u64,
    /// Completions that ran more than once for one write (must stay 0).
    twice: u64,
}

struct Tracker {
    out: Mutex<Outcomes>,
    all_ran: Condvar,
    /// Power is cut when this many completions have run.
    cut_at: u64,
    dev: Arc<FaultDevice>,
    runs: AtomicU64,
}

impl Tracker {
    fn done(self: &Arc<Self>, i: usize) -> jbdev_volume::Completion {
        let t = self.clone();
        Box::new(move |res| {
            let n = t.runs.fetch_add(1, Ordering::AcqRel) + 1;
            if n == t.cut_at {
                t.dev.cut_power();
            }
            let mut o = t.out.lock();
            if o.ok[i] {
                o.twice += 1;
            }
            o.ok[i] |= res.is_ok();
            o.ran += 1;
            t.all_ran.notify_all();
        })
    }

    fn wait_all(&self, n: u64) {
        let mut o = self.out.lock();
        while o.ran < n {
            if self
                .all_ran
                .wait_for(&mut o, Duration::from_secs(60))
                .timed_out()
            {
                panic!("only {} of {n} completions ran within 60 s", o.ran);
            }
        }
    }
}

fn options(seed: u64) -> OpenOptions {
    OpenOptions {
        batch_policy: if seed.is_multiple_of(2) {
            BatchPolicy::Adaptive
        } else {
            BatchPolicy::None
        },
        pipeline_depth: 1 + (seed % 3) as u32,
        ..verify_open_options()
    }
}

/// Block `i` of the data area, in a spread-out order (commits then carry
/// non-contiguous blocks).
fn block_of(i: u64) -> u64 {
    (i * 37) % (GEO.data_bytes / BLOCK)
}

/// One run: `WRITES` FUA writes from one thread (with `use_flush`, every
/// fourth a plain write followed by `flush_then`), power cut in the
/// `cut_at`-th completion, recovery, check.
fn run(seed: u64, cut_at: u64, use_flush: bool) {
    let (image, _) = base_image(GEO);
    let dev = Arc::new(FaultDevice::from_image(image, SECTOR as u32));
    let vol = Volume::open_device(dev.clone(), None, &options(seed)).expect("open");
    let tracker = Arc::new(Tracker {
        out: Mutex::new(Outcomes {
            ok: vec![false; WRITES as usize],
            ..Default::default()
        }),
        all_ran: Condvar::new(),
        cut_at,
        dev: dev.clone(),
        runs: AtomicU64::new(0),
    });
    let mut expected_runs = 0;
    for i in 0..WRITES {
        let off = block_of(i) * BLOCK;
        let id = 1000 + i;
        let data = stamped(id, off, BLOCK as usize);
        let via_flush = use_flush && i % 4 == 3;
        if via_flush {
            // A plain write completes at once; its durability is the flush's
            // (after an abort the flush fails too).
            vol.write_at_then(&data, off, WriteFlags::NONE, Box::new(|_| {}));
            vol.flush_then(tracker.done(i as usize));
        } else if i % 2 == 0 {
            // Most of these run in place; any that would wait come back.
            let fua = WriteFlags { fua: true };
            match vol.try_write_at(&data, off, fua) {
                None => vol.write_at_then(&data, off, fua, tracker.done(i as usize)),
                Some(Err(e)) => (tracker.done(i as usize))(Err(e)),
                Some(Ok(d)) => vol.complete(d, tracker.done(i as usize)),
            }
        } else {
            vol.write_at_then(
                &data,
                off,
                WriteFlags { fua: true },
                tracker.done(i as usize),
            );
        }
        expected_runs += 1;
    }
    tracker.wait_all(expected_runs);
    dev.cut_power();
    drop(vol);
    let out = tracker.out.lock();
    assert_eq!(out.twice, 0, "a completion ran twice");
    assert_eq!(out.ran, expected_runs);
    let (got, _) = recover(dev.durable_image(), &verify_open_options()).expect("recovery");
    let mut acked = 0;
    for i in 0..WRITES {
        let off = (block_of(i) * BLOCK) as usize;
        if out.ok[i as usize] {
            acked += 1;
            let want = stamped(1000 + i, off as u64, BLOCK as usize);
            assert!(
                got[off..off + BLOCK as usize] == want[..],
                "seed {seed} cut_at {cut_at}: write {i} (block {}) was acknowledged durable \
                 but is not in the recovered image",
                block_of(i)
            );
        }
    }
    // Every completion up to the one that cut the power said Ok (nothing
    // had failed yet), so the check above covered at least those.
    assert!(
        acked >= cut_at,
        "seed {seed}: {acked} acknowledged, cut at {cut_at}"
    );
}

#[test]
fn fua_completions_are_durable_when_they_run() {
    with_watchdog("completions", Duration::from_secs(600), || {
        for seed in 0..12u64 {
            let cut_at = 1 + (seed * 53) % WRITES;
            run(seed, cut_at, false);
        }
    });
}

#[test]
fn flush_completions_cover_earlier_writes() {
    with_watchdog("flush completions", Duration::from_secs(600), || {
        for seed in 0..12u64 {
            let cut_at = 1 + (seed * 29) % WRITES;
            run(seed, cut_at, true);
        }
    });
}

/// Closing the volume with completions outstanding runs every one of them
/// (the commit thread drains), and the data is there after reopening.
#[test]
fn close_runs_outstanding_completions() {
    let (image, _) = base_image(GEO);
    let dev = Arc::new(FaultDevice::from_image(image, SECTOR as u32));
    let vol = Volume::open_device(dev.clone(), None, &options(0)).expect("open");
    let ran = Arc::new(AtomicU64::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    for i in 0..WRITES {
        let off = block_of(i) * BLOCK;
        let (ran, ok) = (ran.clone(), ok.clone());
        vol.write_at_then(
            &stamped(2000 + i, off, BLOCK as usize),
            off,
            WriteFlags { fua: true },
            Box::new(move |res| {
                ok.fetch_add(u64::from(res.is_ok()), Ordering::AcqRel);
                ran.fetch_add(1, Ordering::AcqRel);
            }),
        );
    }
    vol.close().expect("close");
    assert_eq!(ran.load(Ordering::Acquire), WRITES);
    assert_eq!(ok.load(Ordering::Acquire), WRITES);
    let (got, _) = recover(dev.durable_image(), &verify_open_options()).expect("reopen");
    for i in 0..WRITES {
        let off = block_of(i) * BLOCK;
        assert_eq!(
            got[off as usize..(off + BLOCK) as usize],
            stamped(2000 + i, off, BLOCK as usize)[..],
            "write {i} lost across a clean close"
        );
    }
}

/// After an abort, a new request's completion runs at once with the error.
#[test]
fn completions_after_an_abort_fail() {
    let (image, _) = base_image(GEO);
    let dev = Arc::new(FaultDevice::from_image(image, SECTOR as u32));
    let vol = Volume::open_device(dev.clone(), None, &options(1)).expect("open");
    dev.fail_op(1);
    let res = vol.write_at(&[7; 4096], 0, WriteFlags { fua: true });
    assert!(
        res.is_err(),
        "the failed journal write must fail the FUA write"
    );
    let got = Arc::new(Mutex::new(Vec::new()));
    for fua in [false, true] {
        let got = got.clone();
        vol.write_at_then(
            &[8; 4096],
            4096,
            WriteFlags { fua },
            Box::new(move |r| got.lock().push(r.is_ok())),
        );
    }
    let g = got.clone();
    vol.flush_then(Box::new(move |r| g.lock().push(r.is_ok())));
    assert_eq!(*got.lock(), vec![false, false, false]);
}

/// A write that would have to read home (a partial block) is refused by
/// `try_write_at`, changing nothing; a whole-block one runs in place.
#[test]
fn try_write_runs_whole_blocks_and_refuses_partial_ones() {
    let (image, base) = base_image(GEO);
    let dev = Arc::new(FaultDevice::from_image(image, SECTOR as u32));
    let vol = Volume::open_device(dev, None, &options(0)).expect("open");
    assert!(
        vol.try_write_at(&[9; 100], 4096 + 10, WriteFlags::NONE)
            .is_none(),
        "a partial block needs a home read: refused"
    );
    let mut b = vec![0u8; 4096];
    vol.read_at(&mut b, 4096).unwrap();
    assert_eq!(b[..], base[4096..8192], "a refused write changed nothing");
    let d = vol
        .try_write_at(&[5; 8192], 8192, WriteFlags { fua: true })
        .expect("whole blocks with journal space free run in place")
        .expect("no error");
    vol.read_at(&mut b, 8192).unwrap();
    assert_eq!(b, vec![5; 4096], "visible once try_write_at returns");
    let (tx, rx) = std::sync::mpsc::channel();
    vol.complete(d, Box::new(move |r| tx.send(r.is_ok()).unwrap()));
    assert_eq!(rx.recv_timeout(Duration::from_secs(60)), Ok(true));
}

/// A completion that owns the last handle closes the volume from the
/// commit thread that runs it. That thread used to try to join itself
/// ("Resource deadlock avoided"), panic, and leave the volume open and
/// needing recovery; now the close completes and the journal is clean.
#[test]
fn a_completion_dropping_the_last_handle_closes_the_volume() {
    let (image, _) = base_image(GEO);
    let dev = Arc::new(FaultDevice::from_image(image, SECTOR as u32));
    let vol = Arc::new(Volume::open_device(dev.clone(), None, &options(3)).expect("open"));
    let closed = Arc::new((Mutex::new(false), Condvar::new()));
    let (v2, c2) = (vol.clone(), closed.clone());
    vol.write_at_then(
        &[9; 4096],
        0,
        WriteFlags { fua: true },
        Box::new(move |res| {
            assert!(res.is_ok());
            drop(v2); // the last handle, once `vol` is dropped below
            *c2.0.lock() = true;
            c2.1.notify_all();
        }),
    );
    drop(vol);
    let mut done = closed.0.lock();
    if !*done {
        let _ = closed.1.wait_for(&mut done, Duration::from_secs(30));
    }
    assert!(*done, "the completion never ran");
    drop(done);
    // Closed cleanly (the close ran inside the callback, before it set
    // `done`): nothing to replay, and the write is there.
    let dev2 = Arc::new(FaultDevice::from_image(dev.durable_image(), SECTOR as u32));
    let v = Volume::open_device(dev2, None, &verify_open_options()).expect("reopen");
    assert!(
        v.recovery_report().was_clean,
        "the volume was not closed cleanly: {:?}",
        v.recovery_report()
    );
    let mut got = vec![0u8; 4096];
    v.read_at(&mut got, 0).unwrap();
    assert!(got.iter().all(|&b| b == 9));
}

/// A completion that panics is its owner's bug: later completions still
/// run and the volume keeps committing (the panic used to end the commit
/// thread, and every later completion waited for close).
#[test]
fn a_panicking_completion_does_not_stop_the_others() {
    let (image, _) = base_image(GEO);
    let dev = Arc::new(FaultDevice::from_image(image, SECTOR as u32));
    let vol = Volume::open_device(dev.clone(), None, &options(4)).expect("open");
    vol.write_at_then(
        &[1; 4096],
        0,
        WriteFlags { fua: true },
        Box::new(|_| panic!("a caller's bug in its completion")),
    );
    for i in 1..=8u64 {
        let (tx, rx) = std::sync::mpsc::channel();
        vol.write_at_then(
            &[i as u8; 4096],
            i * 4096,
            WriteFlags { fua: true },
            Box::new(move |res| tx.send(res.is_ok()).unwrap()),
        );
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(30)),
            Ok(true),
            "completion {i} after the panicking one"
        );
    }
    vol.close().expect("close");
}
