//! The request-queue checks every backend gets (`tests/queue.rs` runs them
//! on the local backends, `tests/rbd.rs` on an RBD image): random mixes of
//! requests checked against a model of the bytes, refused requests, the
//! depth bound.

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::HashMap;
use std::sync::Arc;

use jbdev_device::{
    AlignedBuf, BlockDevice, DeviceError, IoBuf, IoDone, IoOp, IoPriority, IoQueue, IoRequest,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A device under test; its temp dir (if any) lives as long as it.
pub struct Subject {
    pub name: String,
    pub dev: Arc<dyn BlockDevice>,
    pub dir: Option<tempfile::TempDir>,
}

pub fn read_all(dev: &dyn BlockDevice) -> Vec<u8> {
    let mut b = AlignedBuf::zeroed(dev.size_bytes() as usize);
    dev.read_at(&mut b, 0).unwrap();
    b.to_vec()
}

/// What the test expects of a request in flight.
struct Expect {
    range: Option<(u64, u64)>,
    mutating: bool,
    /// A read's expected bytes.
    bytes: Option<Vec<u8>>,
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

fn check_done(name: &str, done: IoDone, inflight: &mut HashMap<u64, Expect>) {
    let exp = inflight
        .remove(&done.tag)
        .unwrap_or_else(|| panic!("{name}: completion for unknown or reaped tag {}", done.tag));
    if let Err(e) = &done.result {
        panic!(
            "{name}: request {} ({:?}) failed: {e}",
            done.tag, done.req.op
        );
    }
    if let (Some(want), IoOp::Read { mut buf, offset }) = (exp.bytes, done.req.op) {
        assert!(
            buf.bytes_mut() == &want[..],
            "{name}: read {} at {offset} returned other bytes than the model",
            done.tag
        );
    }
}

fn reap(name: &str, q: &mut dyn IoQueue, min: u32, inflight: &mut HashMap<u64, Expect>) {
    let mut out = Vec::new();
    let before = q.in_flight();
    let n = q.reap(min, &mut out).unwrap();
    assert_eq!(n, out.len());
    assert!(
        n >= min.min(before) as usize,
        "{name}: reap({min}) returned {n}"
    );
    assert_eq!(q.in_flight(), before - n as u32);
    for d in out {
        check_done(name, d, inflight);
    }
}

/// `data` at `offset` as one vectored write of up to 6 buffers: either
/// whole blocks in aligned memory (the zero-copy path) or pieces of any
/// length in plain vectors (gathered into a bounce buffer under O_DIRECT),
/// some of them empty.
pub fn vectored_write(
    rng: &mut StdRng,
    offset: u64,
    data: &[u8],
    lbs: usize,
    durable: bool,
) -> IoRequest {
    let aligned = rng.gen_bool(0.5);
    let unit = if aligned { lbs } else { 1 };
    let mut cuts: Vec<usize> = (0..rng.gen_range(0..6))
        .map(|_| rng.gen_range(0..=data.len() / unit) * unit)
        .collect();
    cuts.extend([0, data.len()]);
    cuts.sort_unstable();
    let bufs: Vec<Box<dyn IoBuf>> = cuts
        .windows(2)
        .map(|w| -> Box<dyn IoBuf> {
            let piece = &data[w[0]..w[1]];
            match aligned {
                true => Box::new(AlignedBuf::from_slice(piece)),
                false => Box::new(piece.to_vec()),
            }
        })
        .collect();
    let mut req = IoRequest::write_v(offset, bufs);
    if let IoOp::Write { durable: d, .. } = &mut req.op {
        *d = durable;
    }
    req
}

/// Pushes a random mix of reads, writes (plain and FUA, one buffer or
/// vectored, aligned and unaligned memory), flushes and zeroings, reaping at random points, and
/// checks every read and the final image against a model of the bytes. A
/// request overlapping one still in flight (either of them mutating) is
/// pushed ordered, so the model is exact; a few more are ordered at random.
pub fn random_mix(s: &Subject, depth: u32, seed: u64) {
    let name = format!("{} depth {depth} seed {seed}", s.name);
    let dev = &*s.dev;
    let lbs = u64::from(dev.logical_block_size());
    let blocks = dev.size_bytes() / lbs;
    let mut model = read_all(dev);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut q = dev.queue(depth).unwrap();
    assert_eq!(q.depth(), depth);
    let mut inflight: HashMap<u64, Expect> = HashMap::new();
    for tag in 0..300u64 {
        let full = q.in_flight() == depth;
        if full || rng.gen_bool(0.25) {
            // A full queue must hand back at least one completion.
            let min = rng.gen_range(u32::from(full)..=q.in_flight());
            reap(&name, &mut *q, min, &mut inflight);
        }
        if rng.gen_bool(0.1) {
            q.submit().unwrap();
        }
        let count = rng.gen_range(1..=8u64.min(blocks));
        let offset = rng.gen_range(0..=blocks - count) * lbs;
        let len = count * lbs;
        let kind = rng.gen_range(0..10);
        let range = if kind == 9 { None } else { Some((offset, len)) };
        let mutating = kind >= 4;
        let clash = range.is_some_and(|r| {
            inflight
                .values()
                .any(|e| (mutating || e.mutating) && e.range.is_some_and(|o| overlaps(r, o)))
        });
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        let mut bytes = None;
        let req = match kind {
            0..=3 => {
                bytes = Some(model[offset as usize..(offset + len) as usize].to_vec());
                if rng.gen_bool(0.5) {
                    IoRequest::read(offset, AlignedBuf::zeroed(len as usize))
                } else {
                    IoRequest::read(offset, vec![0u8; len as usize])
                }
            }
            4..=7 if rng.gen_bool(0.4) => {
                model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                vectored_write(&mut rng, offset, &data, lbs as usize, kind == 7)
            }
            4..=7 => {
                model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                let durable = kind == 7;
                match (rng.gen_bool(0.5), durable) {
                    (true, false) => IoRequest::write(offset, AlignedBuf::from_slice(&data)),
                    (true, true) => IoRequest::write_durable(offset, AlignedBuf::from_slice(&data)),
                    (false, false) => IoRequest::write(offset, data),
                    (false, true) => IoRequest::write_durable(offset, data),
                }
            }
            8 => {
                model[offset as usize..(offset + len) as usize].fill(0);
                IoRequest::write_zeroes(offset, len)
            }
            _ => IoRequest::flush(),
        };
        let mut req = req.with_priority(if rng.gen_bool(0.3) {
            IoPriority::Background
        } else {
            IoPriority::Urgent
        });
        if clash || rng.gen_bool(0.05) {
            req = req.ordered();
        }
        q.push(req, tag)
            .unwrap_or_else(|r| panic!("{name}: push {tag} refused: {r}"));
        inflight.insert(
            tag,
            Expect {
                range,
                mutating,
                bytes,
            },
        );
    }
    while q.in_flight() > 0 {
        let min = rng.gen_range(1..=q.in_flight());
        reap(&name, &mut *q, min, &mut inflight);
    }
    assert!(inflight.is_empty(), "{name}: completions missing");
    drop(q);
    assert!(
        read_all(dev) == model,
        "{name}: final image differs from the model"
    );
}

/// Random mixes at depths 1 to 64 (one seed per depth).
pub fn random_mixes(s: &Subject) {
    for (i, depth) in [1u32, 2, 7, 32, 64].into_iter().enumerate() {
        random_mix(s, depth, 1000 + i as u64);
    }
}

/// Requests that break the contract are refused at push, whole: the
/// buffers come back, nothing reaches the device.
pub fn refuses_bad_requests(s: &Subject) {
    let dev = &*s.dev;
    let lbs = u64::from(dev.logical_block_size());
    let size = dev.size_bytes();
    dev.write_at(
        &AlignedBuf::from_slice(&vec![0x5A; size as usize]),
        0,
        IoPriority::Urgent,
    )
    .unwrap();
    let before = read_all(dev);
    let mut q = dev.queue(8).unwrap();
    let block = || AlignedBuf::from_slice(&vec![0xEE; lbs as usize]);
    let bad: Vec<IoRequest> = vec![
        IoRequest::write(size, block()),
        IoRequest::write(
            size - lbs,
            AlignedBuf::from_slice(&vec![1; 2 * lbs as usize]),
        ),
        IoRequest::write(1, block()),
        IoRequest::write(0, vec![1u8; lbs as usize + 1]),
        IoRequest::write(u64::MAX - lbs + 1, block()),
        IoRequest::write_durable(size, block()),
        IoRequest::read(size, AlignedBuf::zeroed(lbs as usize)),
        IoRequest::read(lbs / 2, AlignedBuf::zeroed(lbs as usize)),
        IoRequest::write_zeroes(size - lbs, 2 * lbs),
        IoRequest::write_zeroes(0, lbs + 1),
        IoRequest::write_zeroes(u64::MAX - lbs + 1, lbs),
        // Vectored: the total decides, not the pieces.
        IoRequest::write_v(0, vec![Box::new(block()), Box::new(vec![1u8; 1])]),
        IoRequest::write_v(1, vec![Box::new(block()), Box::new(block())]),
        IoRequest::write_v(size - lbs, vec![Box::new(block()), Box::new(block())]),
    ];
    for (tag, req) in bad.into_iter().enumerate() {
        let shown = format!("{:?}", req.op);
        let r = q.push(req, tag as u64).expect_err(&shown);
        assert!(
            matches!(
                r.error,
                DeviceError::Misaligned { .. } | DeviceError::OutOfRange { .. }
            ),
            "{}: {shown}: {}",
            s.name,
            r.error
        );
        // The buffers come back untouched.
        for buf in r.req.into_write_bufs() {
            assert!(
                buf.bytes().iter().all(|&b| b == 0xEE || b == 1),
                "{}",
                s.name
            );
        }
    }
    // More buffers than one vectored request carries.
    let many: Vec<Box<dyn IoBuf>> = (0..=jbdev_device::IOV_MAX)
        .map(|i| -> Box<dyn IoBuf> {
            match i {
                0 => Box::new(block()),
                _ => Box::new(Vec::<u8>::new()),
            }
        })
        .collect();
    let r = q
        .push(IoRequest::write_v(0, many), 99)
        .expect_err("too many buffers");
    assert!(
        matches!(r.error, DeviceError::Invalid(_)),
        "{}: {}",
        s.name,
        r.error
    );
    assert_eq!(r.req.into_write_bufs().len(), jbdev_device::IOV_MAX + 1);
    assert_eq!(q.in_flight(), 0);
    let mut out = Vec::new();
    assert_eq!(
        q.reap(4, &mut out).unwrap(),
        0,
        "{}: nothing to reap",
        s.name
    );
    drop(q);
    assert!(
        read_all(dev) == before,
        "{}: a refused request changed the device",
        s.name
    );
}

/// A push beyond `depth` is refused until a completion is reaped; depth
/// 0 and beyond the maximum are refused at creation.
pub fn bounds_depth(s: &Subject) {
    let lbs = s.dev.logical_block_size() as usize;
    for depth in [1u32, 3, 16] {
        let mut q = s.dev.queue(depth).unwrap();
        for tag in 0..u64::from(depth) {
            q.push(IoRequest::read(0, AlignedBuf::zeroed(lbs)), tag)
                .unwrap();
        }
        assert_eq!(q.in_flight(), depth);
        let r = q
            .push(IoRequest::write(0, AlignedBuf::zeroed(lbs)), 99)
            .expect_err("a push beyond depth");
        assert!(
            matches!(r.error, DeviceError::QueueFull { depth: d } if d == depth),
            "{}: {}",
            s.name,
            r.error
        );
        assert!(
            r.req.into_write_buf::<AlignedBuf>().is_some(),
            "buffer handed back"
        );
        // Submitted but not reaped still counts.
        q.submit().unwrap();
        assert!(q.push(IoRequest::flush(), 100).is_err());
        let mut out = Vec::new();
        let n = q.reap(1, &mut out).unwrap();
        assert!(n >= 1);
        for _ in 0..n {
            q.push(IoRequest::flush(), 101).unwrap();
        }
        assert!(q.push(IoRequest::flush(), 102).is_err());
        while q.in_flight() > 0 {
            q.reap(1, &mut out).unwrap();
        }
        assert_eq!(out.len(), depth as usize + n);
        assert!(out.iter().all(|d| d.result.is_ok()));
    }
    assert!(s.dev.queue(0).is_err(), "{}: depth 0", s.name);
    assert!(s.dev.queue(jbdev_device::QUEUE_DEPTH_MAX + 1).is_err());
}
