//! The request queue (`BlockDevice::queue`) on every backend: random mixes
//! of requests checked against a model of the bytes, refused requests,
//! the depth bound, and the fault device's ordering model.

mod queue_model;

use std::sync::Arc;

use jbdev_device::fault::{CrashOdds, FaultDevice};
use jbdev_device::mem::MemDevice;
use jbdev_device::{
    open_device, AlignedBuf, Backend, BlockDevice, DeviceError, IoBuf, IoRequest, OpenOptions,
};
use queue_model::Subject;

const DEV_BYTES: u64 = 256 * 1024;

fn file_subject(backend: Backend, direct: bool, read_cache: bool) -> Subject {
    let dir = tempfile::tempdir_in("/dev/shm").expect("a temp dir in /dev/shm");
    let opts = OpenOptions {
        backend,
        direct,
        read_cache,
        create_size: Some(DEV_BYTES),
        ..OpenOptions::default()
    };
    let dev = open_device(&dir.path().join("img"), &opts).unwrap().device;
    Subject {
        name: format!("{backend:?} direct={direct} read_cache={read_cache}"),
        dev,
        dir: Some(dir),
    }
}

/// Every backend: io_uring (if this kernel allows it) and pread on a file
/// in /dev/shm with O_DIRECT and buffered, memory, fault.
fn subjects() -> Vec<Subject> {
    let mut v = Vec::new();
    let mut backends = vec![Backend::Pread];
    if jbdev_device::uring::probe().is_ok() {
        backends.push(Backend::Uring);
    } else {
        println!("SKIP (io_uring part): io_uring unavailable here");
    }
    for b in backends {
        v.push(file_subject(b, true, false));
        v.push(file_subject(b, false, false));
        v.push(file_subject(b, true, true));
    }
    v.push(Subject {
        name: "memory".into(),
        dev: Arc::new(MemDevice::new(DEV_BYTES, 512)),
        dir: None,
    });
    v.push(Subject {
        name: "fault".into(),
        dev: Arc::new(FaultDevice::new(DEV_BYTES, 512)),
        dir: None,
    });
    v
}

#[test]
fn random_mixes_match_the_model_on_every_backend() {
    for s in subjects() {
        queue_model::random_mixes(&s);
    }
}

#[test]
fn bad_requests_are_refused_whole_and_change_nothing() {
    for s in subjects() {
        queue_model::refuses_bad_requests(&s);
    }
}

#[test]
fn pushing_beyond_depth_is_refused_until_a_completion_is_reaped() {
    for s in subjects() {
        queue_model::bounds_depth(&s);
    }
}

#[test]
fn test_doubles_complete_out_of_submission_order() {
    let devs: Vec<Arc<dyn BlockDevice>> = vec![
        Arc::new(MemDevice::new(DEV_BYTES, 512)),
        Arc::new(FaultDevice::new(DEV_BYTES, 512)),
    ];
    for dev in devs {
        let mut q = dev.queue(32).unwrap();
        for tag in 0..32u64 {
            q.push(IoRequest::write(tag * 512, vec![tag as u8; 512]), tag)
                .unwrap();
        }
        let mut out = Vec::new();
        while q.in_flight() > 0 {
            q.reap(1, &mut out).unwrap();
        }
        let tags: Vec<u64> = out.iter().map(|d| d.tag).collect();
        let mut sorted = tags.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..32).collect::<Vec<_>>());
        assert_ne!(
            tags,
            sorted,
            "{}: completions in submission order",
            dev.backend_name()
        );
    }
}

fn sector(id: u8) -> Vec<u8> {
    vec![id; 512]
}

/// An ordered flush covers exactly the writes queued before it: after a
/// power cut the earlier writes are durable, the later one is not. Without
/// the ordered flag the flush may overtake the unreaped writes, and the
/// fault device makes it so.
#[test]
fn fault_ordered_flush_covers_exactly_the_earlier_writes() {
    for ordered in [true, false] {
        let d = FaultDevice::new(64 * 1024, 512);
        let mut q = d.queue(16).unwrap();
        for i in 0..5u8 {
            q.push(
                IoRequest::write(u64::from(i) * 512, sector(i + 1)),
                u64::from(i),
            )
            .unwrap();
        }
        let flush = if ordered {
            IoRequest::flush().ordered()
        } else {
            IoRequest::flush()
        };
        q.push(flush, 5).unwrap();
        q.push(IoRequest::write(8 * 512, sector(9)), 6).unwrap();
        let mut out = Vec::new();
        while q.in_flight() > 0 {
            q.reap(1, &mut out).unwrap();
        }
        assert!(out.iter().all(|d| d.result.is_ok()));
        d.cut_power();
        let durable = d.durable_image();
        for i in 0..5usize {
            let got = &durable[i * 512..(i + 1) * 512];
            if ordered {
                assert_eq!(got, &sector(i as u8 + 1)[..], "write {i} not durable");
            } else {
                assert_eq!(got, &[0u8; 512][..], "unordered flush covered write {i}");
            }
        }
        assert_eq!(
            &durable[8 * 512..9 * 512],
            &[0u8; 512][..],
            "later write durable"
        );
        // The later write is unflushed: a crash may keep or lose it.
        assert_eq!(
            &d.crash_image_with(0, CrashOdds::LOSE_ALL)[8 * 512..9 * 512],
            &[0u8; 512][..]
        );
    }
}

/// Writes reaped before a plain flush was pushed are covered by it (the
/// caller saw them complete).
#[test]
fn fault_flush_covers_reaped_writes() {
    let d = FaultDevice::new(8192, 512);
    let mut q = d.queue(4).unwrap();
    q.push(IoRequest::write(0, sector(7)), 0).unwrap();
    let mut out = Vec::new();
    q.reap(1, &mut out).unwrap();
    q.push(IoRequest::flush(), 1).unwrap();
    q.reap(1, &mut out).unwrap();
    assert_eq!(&d.durable_image()[..512], &sector(7)[..]);
    // A synchronous flush does not cover a queued write nobody reaped.
    q.push(IoRequest::write(512, sector(8)), 2).unwrap();
    q.submit().unwrap();
    d.flush().unwrap();
    assert_eq!(&d.durable_image()[512..1024], &[0u8; 512][..]);
    q.reap(1, &mut out).unwrap();
    d.flush().unwrap();
    assert_eq!(&d.durable_image()[512..1024], &sector(8)[..]);
}

/// Power cuts, injected failures and torn writes apply to queued requests
/// the way they apply to synchronous calls.
#[test]
fn fault_injection_applies_to_queued_requests() {
    let results = |d: &FaultDevice, reqs: Vec<IoRequest>| -> Vec<Result<(), DeviceError>> {
        let mut q = d.queue(16).unwrap();
        let n = reqs.len();
        for (tag, r) in reqs.into_iter().enumerate() {
            q.push(r, tag as u64).unwrap();
        }
        let mut out = Vec::new();
        while q.in_flight() > 0 {
            q.reap(1, &mut out).unwrap();
        }
        out.sort_by_key(|d| d.tag);
        assert_eq!(out.len(), n);
        out.into_iter().map(|d| d.result).collect()
    };
    // crash_after_ops: the third mutating op meets the cut, later ones fail.
    let d = FaultDevice::new(8192, 512);
    d.crash_after_ops(2);
    let r = results(
        &d,
        (0..4u8)
            .map(|i| IoRequest::write(u64::from(i) * 512, sector(i + 1)))
            .collect(),
    );
    assert!(r[0].is_ok() && r[1].is_ok());
    assert!(matches!(r[2], Err(DeviceError::PowerCut)));
    assert!(matches!(r[3], Err(DeviceError::PowerCut)));
    assert_eq!(d.ops(), 2);
    // The third was in flight: a crash image may hold it; the fourth never.
    let img = d.crash_image_with(0, CrashOdds::KEEP_ALL);
    assert_eq!(&img[1024..1536], &sector(3)[..]);
    assert_eq!(&img[1536..2048], &[0u8; 512][..]);
    // fail_op: that one op fails without effect; flushes too.
    let d = FaultDevice::new(8192, 512);
    d.fail_op(2);
    let r = results(
        &d,
        vec![
            IoRequest::write(0, sector(1)),
            IoRequest::write(512, sector(2)),
            IoRequest::flush().ordered(),
        ],
    );
    assert!(r[0].is_ok() && r[2].is_ok());
    assert!(matches!(r[1], Err(DeviceError::Injected("write"))));
    assert_eq!(
        &d.durable_image()[..1024],
        &[sector(1), vec![0; 512]].concat()[..]
    );
    // A torn failure lands some sectors of the write (for some seed): the
    // request writes bytes 1 over the first 4096 bytes of an image of 9s.
    let tears = |req: &dyn Fn() -> IoRequest| {
        // Every seed runs (and must fail); some must tear.
        (0..16)
            .filter(|&seed| {
                let d = FaultDevice::from_image(vec![9u8; 8192], 512);
                d.fail_op_torn(1, seed);
                let r = results(&d, vec![req()]);
                assert!(r[0].is_err());
                let landed = d.live_image()[..4096]
                    .chunks(512)
                    .filter(|c| c[0] == 1)
                    .count();
                landed > 0 && landed < 8
            })
            .count()
            > 0
    };
    assert!(
        tears(&|| IoRequest::write(0, vec![1u8; 4096])),
        "no seed tore a queued write"
    );
    // A vectored write is one op: it meets a cut, fails, or tears as a whole.
    let vec_write = |at: u64, ids: &[u8]| {
        IoRequest::write_v(
            at,
            ids.iter()
                .map(|&i| -> Box<dyn IoBuf> { Box::new(sector(i)) })
                .collect(),
        )
    };
    let d = FaultDevice::new(8192, 512);
    d.crash_after_ops(1);
    let r = results(
        &d,
        vec![
            vec_write(0, &[1, 2]),
            vec_write(1024, &[3, 4, 5]),
            vec_write(4096, &[6]),
        ],
    );
    assert!(r[0].is_ok());
    assert!(matches!(r[1], Err(DeviceError::PowerCut)));
    assert!(matches!(r[2], Err(DeviceError::PowerCut)));
    assert_eq!(d.ops(), 1);
    let img = d.crash_image_with(0, CrashOdds::KEEP_ALL);
    assert_eq!(
        &img[..2560],
        &[sector(1), sector(2), sector(3), sector(4), sector(5)].concat()[..]
    );
    assert_eq!(&img[4096..4608], &[0u8; 512][..]);
    let img = d.crash_image_with(0, CrashOdds::LOSE_ALL);
    assert_eq!(&img[..2560], &[0u8; 2560][..]);
    let d = FaultDevice::new(8192, 512);
    d.fail_op(2);
    let r = results(
        &d,
        vec![
            vec_write(0, &[1, 2]),
            vec_write(1024, &[3, 4]),
            IoRequest::flush().ordered(),
        ],
    );
    assert!(r[0].is_ok() && r[2].is_ok());
    assert!(matches!(r[1], Err(DeviceError::Injected("write"))));
    assert_eq!(
        &d.durable_image()[..2048],
        &[sector(1), sector(2), vec![0; 1024]].concat()[..]
    );
    assert!(
        tears(&|| vec_write(0, &[1; 8])),
        "no seed tore a queued vectored write"
    );
    // A failed flush covers nothing.
    let d = FaultDevice::new(8192, 512);
    d.fail_flush(1);
    let r = results(
        &d,
        vec![IoRequest::write(0, sector(1)), IoRequest::flush().ordered()],
    );
    assert!(r[0].is_ok() && r[1].is_err());
    assert_eq!(&d.durable_image()[..512], &[0u8; 512][..]);
}

/// A write buffer whose memory a pool worker can only read once the test
/// opens the gate (the first `bytes()` call, `push`'s check, passes).
struct GatedBuf {
    data: Vec<u8>,
    calls: std::sync::atomic::AtomicU32,
    gate: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
}

impl jbdev_device::IoBuf for GatedBuf {
    fn bytes(&self) -> &[u8] {
        if self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
            let (open, cv) = &*self.gate;
            let mut g = open.lock().unwrap();
            while !*g {
                g = cv.wait(g).unwrap();
            }
        }
        &self.data
    }
}

/// On the pread pool an ordered read does not start while an earlier write
/// of its queue is still running: the write is held at its gate (opened a
/// little later by another thread) and the read must still see its data.
/// Without the barrier the read runs on another worker and sees old bytes.
#[test]
fn pread_pool_ordered_read_waits_for_the_earlier_write() {
    for round in 0..4u8 {
        let s = file_subject(Backend::Pread, false, false);
        let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let mut q = s.dev.queue(8).unwrap();
        let data = vec![round + 1; 4096];
        let buf = GatedBuf {
            data: data.clone(),
            calls: Default::default(),
            gate: gate.clone(),
        };
        q.push(IoRequest::write(0, buf), 0).unwrap();
        q.push(IoRequest::read(0, vec![0u8; 4096]).ordered(), 1)
            .unwrap();
        q.submit().unwrap();
        let opener = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            *gate.0.lock().unwrap() = true;
            gate.1.notify_all();
        });
        let mut out = Vec::new();
        while q.in_flight() > 0 {
            q.reap(1, &mut out).unwrap();
        }
        opener.join().unwrap();
        let read = out.into_iter().find(|d| d.tag == 1).unwrap();
        assert!(read.result.is_ok());
        let got = read.req.into_read_buf::<Vec<u8>>().unwrap();
        assert!(
            got == data,
            "round {round}: the ordered read overtook the write"
        );
    }
}

/// On io_uring (O_DIRECT on a disk-backed file in /var/tmp, where writes
/// take device time) an ordered read issued in the same submission as a
/// large write of the same range sees the write's data.
#[test]
fn uring_ordered_read_sees_the_earlier_write() {
    if jbdev_device::uring::probe().is_err() {
        println!("SKIP: io_uring unavailable here");
        return;
    }
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let opts = OpenOptions {
        backend: Backend::Uring,
        create_size: Some(64 << 20),
        ..OpenOptions::default()
    };
    let dev = open_device(&dir.path().join("img"), &opts).unwrap().device;
    let mut q = dev.queue(64).unwrap();
    const MIB: usize = 1 << 20;
    for round in 0..16u64 {
        let at = (round % 8) * MIB as u64;
        let data = AlignedBuf::from_slice(&vec![round as u8 + 1; MIB]);
        q.push(IoRequest::write_durable(at, data), 0).unwrap();
        q.push(IoRequest::read(at, AlignedBuf::zeroed(MIB)).ordered(), 1)
            .unwrap();
        let mut out = Vec::new();
        while q.in_flight() > 0 {
            q.reap(2, &mut out).unwrap();
        }
        let read = out.into_iter().find(|d| d.tag == 1).unwrap();
        assert!(read.result.is_ok());
        let got = read.req.into_read_buf::<AlignedBuf>().unwrap();
        assert!(
            got.iter().all(|&b| b == round as u8 + 1),
            "round {round}: the ordered read overtook the write"
        );
    }
}
