//! The RBD backend against a real (throwaway, single-node) Ceph cluster:
//! the backend conformance suite, the exclusive lock, breaking it, and the
//! native request queue (the model checks every backend gets, requests in
//! flight at once, barriers, FUA).
#![cfg(feature = "rbd")]

mod common;
mod queue_model;

use std::path::Path;
use std::process::Command;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use common::{conformance, Traits};
use jbdev_device::rbd::test_cluster;
use jbdev_device::{
    open_device, AlignedBuf, DeviceError, IoDone, IoPriority, IoQueue, IoRequest, OpenOptions,
};
use queue_model::Subject;

const SIZE_BYTES: u64 = 8 << 20;

/// `target` opened read-only (no lock taken).
fn open_read_only(target: &Path) -> Arc<dyn jbdev_device::BlockDevice> {
    let opts = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    open_device(target, &opts).unwrap().device
}

use test_cluster::or_skip as cluster;

fn create_opts() -> OpenOptions {
    OpenOptions {
        create_size: Some(SIZE_BYTES),
        ..OpenOptions::default()
    }
}

#[test]
fn rbd_device_conformance() {
    let Some(conf) = cluster() else { return };
    let t = test_cluster::target(&conf, &test_cluster::unique_image("conf"));
    let dev = open_device(t.as_ref(), &create_opts()).unwrap().device;
    assert_eq!(dev.backend_name(), "rbd");
    assert_eq!(dev.size_bytes(), SIZE_BYTES);
    conformance(
        dev.as_ref(),
        // librbd's allocation map (rbd_diff_iterate2) has holes where no
        // object was written, but a range zeroed inside a written object
        // is still data (allocation_reports_unwritten_objects_as_holes).
        Traits {
            reports_holes: false,
        },
    );
}

#[test]
fn a_second_writer_is_refused_naming_the_holder_and_break_lock_spares_a_live_one() {
    let Some(conf) = cluster() else { return };
    let t = test_cluster::target(&conf, &test_cluster::unique_image("lock"));
    let first = open_device(t.as_ref(), &create_opts()).unwrap().device;
    first.write_at(&[7u8; 512], 0, Default::default()).unwrap();
    first.flush().unwrap();
    match open_device(t.as_ref(), &OpenOptions::default()) {
        Err(DeviceError::Busy(msg)) => {
            println!("second opener: {msg}");
            assert!(msg.contains("held by"), "{msg}");
            assert!(!msg.contains("another client"), "owner not named: {msg}");
        }
        Err(e) => panic!("second opener: unexpected error {e}"),
        Ok(_) => panic!("a second read-write opener got the image"),
    }
    // A read-only opener takes no lock and reads what was written.
    let ro = open_read_only(t.as_ref());
    let mut buf = [0u8; 512];
    ro.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [7u8; 512]);
    // --break-lock of a live holder (it still watches the image) is
    // refused after a bounded wait for its watch to expire, saying the
    // holder is alive, and changes nothing: the holder still writes.
    // (`osd_client_watch_timeout=1` shortens this client's wait to 11 s;
    // the OSD's own timeout is unchanged.) Fails on the old code, which
    // broke the live holder's lock and blocklisted it.
    let breaker = format!("{t}:osd_client_watch_timeout=1");
    match open_device(
        breaker.as_ref(),
        &OpenOptions {
            break_lock: true,
            ..OpenOptions::default()
        },
    ) {
        Err(DeviceError::Busy(msg)) => {
            println!("--break-lock of a live holder: {msg}");
            assert!(msg.contains("alive") && msg.contains("held by"), "{msg}");
        }
        Err(e) => panic!("--break-lock of a live holder: unexpected error {e}"),
        Ok(_) => panic!("--break-lock broke a live holder's lock"),
    }
    first
        .write_at(&[1u8; 512], 512, Default::default())
        .unwrap();
    first.flush().unwrap();
    // Once the holder is gone, the lock is free again.
    drop(first);
    let second = open_device(t.as_ref(), &OpenOptions::default())
        .unwrap()
        .device;
    second.write_at(&[9u8; 512], 0, Default::default()).unwrap();
    second.flush().unwrap();
}

#[test]
fn a_missing_image_without_create_is_a_clear_error() {
    let Some(conf) = cluster() else { return };
    let t = test_cluster::target(&conf, &test_cluster::unique_image("missing"));
    let err = open_device(t.as_ref(), &OpenOptions::default())
        .err()
        .expect("opened a missing image");
    let msg = err.to_string();
    assert!(
        msg.contains("rbd_open") && msg.contains("No such file"),
        "{msg}"
    );
}

/// `refuse_if_held` (what read-only replays and checks call first) refuses
/// an image another client holds, naming the holder like a second writer's
/// refusal; a plain read-only open still reads; once the holder is gone, or
/// for a missing image, it passes. (New function: the old code had no such
/// check, so a read-only replay of a held volume went ahead.)
#[test]
fn refuse_if_held_names_the_holder_of_a_held_image() {
    use jbdev_device::rbd::{refuse_if_held, RbdTarget};
    let Some(conf) = cluster() else { return };
    let t = test_cluster::target(&conf, &test_cluster::unique_image("rolock"));
    let target = RbdTarget::parse(&t).unwrap();
    let writer = open_device(t.as_ref(), &create_opts()).unwrap().device;
    writer.write_at(&[7u8; 512], 0, Default::default()).unwrap();
    writer.flush().unwrap();
    match refuse_if_held(&target) {
        Err(DeviceError::Busy(msg)) => {
            println!("read-only opener: {msg}");
            assert!(msg.contains("held by"), "{msg}");
            assert!(!msg.contains("another client"), "owner not named: {msg}");
            let full = DeviceError::Busy(msg).to_string();
            assert!(full.contains("already open"), "{full}");
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(()) => panic!("a held image passed"),
    }
    let mut buf = [0u8; 512];
    open_read_only(t.as_ref()).read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [7u8; 512]);
    drop(writer);
    refuse_if_held(&target).unwrap();
    let missing = test_cluster::target(&conf, &test_cluster::unique_image("romissing"));
    refuse_if_held(&RbdTarget::parse(&missing).unwrap()).unwrap();
}

/// Every connection gets `rados_osd_op_timeout` = 30 s unless the target
/// sets its own (0: librados' default, no timeout), so an OSD that stops
/// answering fails a request with ETIMEDOUT instead of blocking for ever.
/// (Fails on the old code: no timeout was set, librados' default is 0.)
#[test]
fn an_osd_op_timeout_is_set_by_default_and_overridable() {
    use jbdev_device::rbd::{RbdDevice, RbdOpenOptions, RbdTarget, DEFAULT_OSD_OP_TIMEOUT_SECS};
    let Some(conf) = cluster() else { return };
    let t = test_cluster::target(&conf, &test_cluster::unique_image("optimeout"));
    let open = |suffix: &str| {
        let target = RbdTarget::parse(&format!("{t}{suffix}")).unwrap();
        RbdDevice::open(
            &target,
            &RbdOpenOptions {
                create_size: Some(SIZE_BYTES),
                ..RbdOpenOptions::default()
            },
        )
        .unwrap()
    };
    let timeout = |d: &RbdDevice| {
        d.conf_value("rados_osd_op_timeout")
            .map(|v| v.parse::<f64>())
    };
    assert_eq!(DEFAULT_OSD_OP_TIMEOUT_SECS, 30);
    assert_eq!(timeout(&open("")), Some(Ok(30.0)));
    assert_eq!(timeout(&open(":rados_osd_op_timeout=0")), Some(Ok(0.0)));
    assert_eq!(timeout(&open(":rados_osd_op_timeout=7")), Some(Ok(7.0)));
    // The monitors' too: `--break-lock` blocklists the holder through them.
    let mon = |d: &RbdDevice| {
        d.conf_value("rados_mon_op_timeout")
            .map(|v| v.parse::<f64>())
    };
    assert_eq!(mon(&open("")), Some(Ok(30.0)));
    assert_eq!(mon(&open(":rados_mon_op_timeout=5")), Some(Ok(5.0)));
}

/// An unknown image option is named as such (librados says ENOENT).
#[test]
fn an_unknown_image_option_is_named() {
    let Some(conf) = cluster() else { return };
    let t = test_cluster::target(&conf, &test_cluster::unique_image("badopt"));
    let msg = open_device(format!("{t}:foo=bar").as_ref(), &create_opts())
        .err()
        .expect("an unknown option was accepted")
        .to_string();
    assert!(msg.contains("unknown Ceph option \"foo\""), "{msg}");
    assert!(!msg.contains("No such file"), "{msg}");
}

/// `same_image` compares pool, image and cluster, not the target strings;
/// `image_exists` and `remove_image` find and remove an image.
#[test]
fn same_image_ignores_options_and_spelling_and_images_can_be_removed() {
    use jbdev_device::rbd::{image_exists, remove_image, same_image, RbdTarget};
    let Some(conf) = cluster() else { return };
    let img = test_cluster::unique_image("same");
    let t = test_cluster::target(&conf, &img);
    // The same ceph.conf under another name: another string, same cluster.
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("other.conf");
    std::os::unix::fs::symlink(&conf, &link).unwrap();
    let t2 = test_cluster::target(&link, &img);
    assert!(same_image(&t, &t));
    assert!(same_image(&t, &format!("{t}:rbd_cache=true")));
    assert!(same_image(&t, &t2), "{t} vs {t2}");
    assert!(same_image(&format!("rbd:rbd/{img}"), &t));
    assert!(!same_image(
        &t,
        &test_cluster::target(&conf, &format!("{img}-x"))
    ));
    assert!(!same_image(&t, &t.replace("rbd:rbd/", "rbd:other/")));
    assert!(!same_image(&t, "/tmp/file"));

    let target = RbdTarget::parse(&t).unwrap();
    assert!(!image_exists(&target).unwrap());
    drop(open_device(t.as_ref(), &create_opts()).unwrap());
    assert!(image_exists(&target).unwrap());
    remove_image(&target).unwrap();
    assert!(!image_exists(&target).unwrap());
    remove_image(&target).unwrap();
    let nopool = RbdTarget::parse(&t.replace("rbd:rbd/", "rbd:nosuchpool/")).unwrap();
    assert!(image_exists(&nopool).is_err());
}

/// The queue checks' image size: as small as the local backends' (so that
/// requests clash often and run ordered), in 64 KiB objects (so that they
/// still spread over several RADOS objects).
const QUEUE_BYTES: u64 = 256 * 1024;

/// librbd's writeback cache (not the default writearound policy, which
/// sends every write at once), on from the first write (not writethrough
/// until the first flush), and dirty data kept for 30 s unless flushed.
const WRITEBACK: &str = ":rbd_cache=true:rbd_cache_policy=writeback\
    :rbd_cache_writethrough_until_flush=false:rbd_cache_max_dirty_age=30";

/// A fresh image of `QUEUE_BYTES` opened read-write; `options` are appended
/// to its target. Returns the subject and the plain target (no options).
fn queue_subject(conf: &Path, prefix: &str, options: &str) -> (Subject, String) {
    let plain = test_cluster::target(conf, &test_cluster::unique_image(prefix));
    let t = format!("{plain}:rbd_default_order=16{options}");
    let opts = OpenOptions {
        create_size: Some(QUEUE_BYTES),
        ..OpenOptions::default()
    };
    let dev = open_device(t.as_ref(), &opts).unwrap().device;
    assert_eq!(dev.backend_name(), "rbd");
    let name = format!(
        "rbd {prefix}{}",
        if options.is_empty() { "" } else { " (cache)" }
    );
    let s = Subject {
        name,
        dev,
        dir: None,
    };
    (s, plain)
}

fn drain(q: &mut dyn IoQueue) -> Vec<IoDone> {
    let mut out = Vec::new();
    while q.in_flight() > 0 {
        q.reap(1, &mut out).unwrap();
    }
    out
}

#[test]
fn rbd_queue_random_mixes_match_the_model() {
    let Some(conf) = cluster() else { return };
    // librbd's cache off (the default) and writeback.
    for options in ["", WRITEBACK] {
        let (s, _) = queue_subject(&conf, "qmix", options);
        queue_model::random_mixes(&s);
    }
}

#[test]
fn rbd_queue_refuses_bad_requests_and_bounds_depth() {
    let Some(conf) = cluster() else { return };
    let (s, _) = queue_subject(&conf, "qbad", "");
    queue_model::refuses_bad_requests(&s);
    queue_model::bounds_depth(&s);
}

#[test]
fn rbd_queue_on_a_read_only_image_refuses_mutations_at_push() {
    let Some(conf) = cluster() else { return };
    let (s, plain) = queue_subject(&conf, "qro", "");
    s.dev.write_at(&[3u8; 4096], 0, IoPriority::Urgent).unwrap();
    s.dev.flush().unwrap();
    drop(s);
    let dev = open_read_only(plain.as_ref());
    let mut q = dev.queue(8).unwrap();
    for req in [
        IoRequest::write(0, vec![1u8; 512]),
        IoRequest::write_durable(0, vec![1u8; 512]),
        IoRequest::write_zeroes(0, 512),
    ] {
        let r = q.push(req, 0).expect_err("a mutation of a read-only image");
        assert!(
            matches!(&r.error, DeviceError::Io { error, .. } if error.raw_os_error() == Some(libc::EROFS)),
            "{}",
            r.error
        );
        assert!(r.req.op.is_mutating(), "the request is handed back");
    }
    assert_eq!(q.in_flight(), 0);
    q.push(IoRequest::read(0, vec![0u8; 4096]), 1).unwrap();
    q.push(IoRequest::flush(), 2).unwrap();
    let out = drain(&mut *q);
    assert!(out.iter().all(|d| d.result.is_ok()));
    let read = out.into_iter().find(|d| d.tag == 1).unwrap();
    assert_eq!(
        read.req.into_read_buf::<Vec<u8>>().unwrap(),
        vec![3u8; 4096]
    );
}

/// The OSD of the test cluster stopped (SIGSTOP), so that nothing sent to it
/// completes, until this is dropped (SIGCONT). A watchdog resumes it after
/// `WATCHDOG` whatever happens, so that a queue that waits for the OSD in
/// `submit` fails the test instead of hanging it. One at a time (FREEZE).
struct FrozenOsd {
    pid: String,
    stop: Option<mpsc::Sender<()>>,
    watchdog: Option<JoinHandle<bool>>,
    _one: std::sync::MutexGuard<'static, ()>,
}

static FREEZE: Mutex<()> = Mutex::new(());
const WATCHDOG: Duration = Duration::from_secs(15);

fn signal(sig: &str, pid: &str) {
    let ok = Command::new("kill")
        .args([sig, pid])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid} failed");
}

impl FrozenOsd {
    fn new() -> Self {
        let one = FREEZE.lock().unwrap_or_else(|e| e.into_inner());
        let pid = test_cluster::osd_pid();
        signal("-STOP", &pid);
        // SIGSTOP takes effect asynchronously: an OSD thread still running
        // could complete a write sent after `kill` returned. Wait until
        // every thread is stopped.
        let all_stopped = || {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                return false;
            };
            tasks.flatten().all(|t| {
                std::fs::read_to_string(t.path().join("stat")).is_ok_and(|st| {
                    // The state follows the command name's closing paren.
                    st.rsplit_once(") ")
                        .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
                })
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !all_stopped() {
            assert!(
                std::time::Instant::now() < deadline,
                "the OSD did not stop within 10 s of SIGSTOP"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let (stop, rx) = mpsc::channel::<()>();
        let p = pid.clone();
        let watchdog = std::thread::spawn(move || {
            let fired = rx.recv_timeout(WATCHDOG) == Err(mpsc::RecvTimeoutError::Timeout);
            if fired {
                signal("-CONT", &p);
            }
            fired
        });
        Self {
            pid,
            stop: Some(stop),
            watchdog: Some(watchdog),
            _one: one,
        }
    }

    /// Resumes the OSD; false if the watchdog had to.
    fn thaw(mut self) -> bool {
        self.resume()
    }

    fn resume(&mut self) -> bool {
        drop(self.stop.take());
        let fired = self
            .watchdog
            .take()
            .is_some_and(|w| w.join().unwrap_or(true));
        signal("-CONT", &self.pid);
        !fired
    }
}

impl Drop for FrozenOsd {
    fn drop(&mut self) {
        if self.watchdog.is_some() {
            self.resume();
        }
    }
}

/// At depth 32, all 32 writes are in librbd at once: `submit` returns while
/// the OSD is stopped (a queue that ran them one by one would wait for the
/// first), none has completed, and once the OSD runs again all 32 complete
/// and are on the image.
#[test]
fn rbd_queue_keeps_32_requests_in_flight_at_once() {
    let Some(conf) = cluster() else { return };
    let (s, _) = queue_subject(&conf, "qdepth", "");
    let dev = &*s.dev;
    // Objects exist beforehand, so the writes are plain overwrites.
    dev.write_at(&vec![0u8; QUEUE_BYTES as usize], 0, IoPriority::Urgent)
        .unwrap();
    let mut q = dev.queue(32).unwrap();
    let frozen = FrozenOsd::new();
    for tag in 0..32u64 {
        let data = AlignedBuf::from_slice(&[tag as u8 + 1; 4096]);
        q.push(IoRequest::write(tag * 8192, data), tag).unwrap();
    }
    q.submit().unwrap();
    assert_eq!(q.in_flight(), 32);
    let mut out = Vec::new();
    let early = q.reap(0, &mut out).unwrap();
    let seen: Vec<String> = out
        .iter()
        .map(|d| format!("{}: {:?}", d.tag, d.result))
        .collect();
    assert_eq!(early, 0, "a write completed with the OSD stopped: {seen:?}");
    assert!(
        frozen.thaw(),
        "submit waited for the OSD: requests ran one by one"
    );
    out.extend(drain(&mut *q));
    assert_eq!(out.len(), 32);
    assert!(out.iter().all(|d| d.result.is_ok()));
    let mut tags: Vec<u64> = out.iter().map(|d| d.tag).collect();
    tags.sort_unstable();
    assert_eq!(tags, (0..32).collect::<Vec<_>>());
    let image = queue_model::read_all(dev);
    for tag in 0..32usize {
        let at = tag * 8192;
        assert!(
            image[at..at + 4096].iter().all(|&b| b == tag as u8 + 1),
            "write {tag}"
        );
    }
}

/// An ordered read does not start before the earlier write of its queue
/// completed. With the OSD stopped, a write to a fresh object cannot
/// complete (librbd first marks the object in the object map, an OSD
/// update), while a read of that object is answered at once from the
/// in-memory object map (zeroes, "does not exist yet"): the unordered read
/// completes, stale, and the ordered one waits and sees the write's data.
#[test]
fn rbd_queue_ordered_read_waits_for_the_earlier_write() {
    let Some(conf) = cluster() else { return };
    let (s, _) = queue_subject(&conf, "qorder", "");
    let dev = &*s.dev;
    let mut q = dev.queue(8).unwrap();
    for (object, ordered) in [(0u64, false), (1, true)] {
        let at = object * 65536;
        let frozen = FrozenOsd::new();
        q.push(IoRequest::write(at, vec![7u8; 4096]), 0).unwrap();
        let read = IoRequest::read(at, vec![1u8; 4096]);
        q.push(if ordered { read.ordered() } else { read }, 1)
            .unwrap();
        q.submit().unwrap();
        let mut early = Vec::new();
        q.reap(0, &mut early).unwrap();
        if !ordered {
            // The control: without the flag the read overtakes the write
            // (else this test could not tell a held read from a started one).
            while early.is_empty() {
                std::thread::yield_now();
                q.reap(0, &mut early).unwrap();
            }
            assert_eq!(early.len(), 1);
            assert_eq!(early[0].tag, 1, "the write completed with the OSD stopped");
        } else {
            assert!(
                early.is_empty(),
                "{} request(s) completed with the OSD stopped: the ordered read started before the write completed",
                early.len()
            );
        }
        assert!(frozen.thaw(), "submit waited for the OSD");
        early.extend(drain(&mut *q));
        assert!(early.iter().all(|d| d.result.is_ok()));
        // Deterministic even if the early look above came too soon: a read
        // that started before the write completed read zeroes.
        let read = early.into_iter().find(|d| d.tag == 1).unwrap();
        let got = read.req.into_read_buf::<Vec<u8>>().unwrap();
        let want = if ordered { 7u8 } else { 0 };
        assert!(
            got.iter().all(|&b| b == want),
            "ordered {ordered}: the read saw {}, not {want}",
            got[0]
        );
    }
}

/// A durable (FUA) write completes only once its data is on the OSDs, even
/// with librbd's writeback cache on: another client (no cache) reads it as
/// soon as the completion is reaped. The control: a plain write, reaped,
/// is still only in the writer's cache; an ordered flush puts it out.
#[test]
fn rbd_queue_durable_write_is_on_the_osds_when_it_completes() {
    let Some(conf) = cluster() else { return };
    let (s, plain) = queue_subject(&conf, "qfua", WRITEBACK);
    let reader = open_read_only(plain.as_ref());
    let seen = |at: u64| {
        let mut b = vec![0u8; 4096];
        reader.read_at(&mut b, at).unwrap();
        b[0]
    };
    let mut q = s.dev.queue(32).unwrap();
    // Control: a plain write completes into the cache only.
    q.push(IoRequest::write(0, vec![5u8; 4096]), 0).unwrap();
    drain(&mut *q);
    assert_eq!(
        seen(0),
        0,
        "the cache is not writeback: this test would prove nothing"
    );
    q.push(IoRequest::flush().ordered(), 0).unwrap();
    drain(&mut *q);
    assert_eq!(seen(0), 5, "a completed flush left a write in the cache");
    // Rounds of FUA writes among plain ones, 16 in flight.
    for round in 1..=4u8 {
        for i in 0..16u64 {
            let at = i * 16384 + 4096;
            let data = vec![round * 16 + i as u8; 4096];
            let req = if i % 2 == 0 {
                IoRequest::write_durable(at, data)
            } else {
                IoRequest::write(at, data)
            };
            q.push(req, i).unwrap();
        }
        let mut out = Vec::new();
        while q.in_flight() > 0 {
            q.reap(1, &mut out).unwrap();
            for d in out.drain(..) {
                assert!(d.result.is_ok());
                if d.tag % 2 == 0 {
                    let at = d.tag * 16384 + 4096;
                    assert_eq!(
                        seen(at),
                        round * 16 + d.tag as u8,
                        "round {round}: a FUA write completed before it was flushed"
                    );
                }
            }
        }
    }
}

/// Dropping a queue with requests in librbd waits for them: the writes are
/// on the image afterwards, and no buffer is freed under librbd.
#[test]
fn rbd_queue_dropped_with_requests_in_flight_waits_for_them() {
    let Some(conf) = cluster() else { return };
    let (s, _) = queue_subject(&conf, "qdrop", "");
    let dev = Arc::clone(&s.dev);
    for round in 1..=3u8 {
        let mut q = dev.queue(64).unwrap();
        for i in 0..32u64 {
            q.push(IoRequest::write(i * 8192, vec![round + i as u8; 8192]), i)
                .unwrap();
            q.push(
                IoRequest::read(i * 8192 + 4096, AlignedBuf::zeroed(4096)),
                100 + i,
            )
            .unwrap();
        }
        q.submit().unwrap();
        drop(q);
        let image = queue_model::read_all(&*dev);
        for i in 0..32usize {
            let at = i * 8192;
            assert!(
                image[at..at + 8192].iter().all(|&b| b == round + i as u8),
                "round {round}: write {i}"
            );
        }
    }
}

/// Runs the `rbd` tool against the test cluster as another client; panics
/// on failure.
fn rbd_tool(conf: &Path, args: &[&str]) {
    let out = Command::new("timeout")
        .arg("60")
        .arg("rbd")
        .arg("-c")
        .arg(conf)
        .args(args)
        .output()
        .expect("run rbd");
    assert!(
        out.status.success(),
        "rbd {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Session 21, defect 1: `rbd resize --allow-shrink` by another client
/// under an open image. From then on every write, zeroing and flush fails
/// with an error naming the shrink and both sizes — also the first one,
/// which straddles the new end (librbd clips it to the part below the end
/// and reports success: a checkpoint would have counted it home); reads
/// below the new end still work, reads beyond fail with the same cause,
/// through the queue too. (Fails on the old code: the straddling write
/// succeeded, and a read beyond the end failed with a bare "Invalid
/// argument".)
#[test]
fn a_shrunk_image_refuses_writes_and_names_the_cause() {
    let Some(conf) = cluster() else { return };
    let img = test_cluster::unique_image("shrink");
    let t = test_cluster::target(&conf, &img);
    let dev = open_device(t.as_ref(), &create_opts()).unwrap().device;
    dev.write_at(&[5u8; 4096], 0, IoPriority::Urgent).unwrap();
    dev.write_at(&[6u8; 4096], 6 << 20, IoPriority::Urgent)
        .unwrap();
    dev.flush().unwrap();
    let new_size: u64 = 4 << 20;
    rbd_tool(
        &conf,
        &[
            "resize",
            "--allow-shrink",
            "--size",
            "4M",
            &format!("rbd/{img}"),
        ],
    );
    let shrunk = |what: &str, r: Result<(), DeviceError>| {
        let msg = match r {
            Ok(()) => panic!("{what} succeeded on an image shrunk under it"),
            Err(e) => e.to_string(),
        };
        println!("{what}: {msg}");
        assert!(
            msg.contains("shrunk") && msg.contains(&new_size.to_string()),
            "{what}: {msg}"
        );
        assert!(msg.contains(&SIZE_BYTES.to_string()), "{what}: {msg}");
    };
    shrunk(
        "a write across the new end",
        dev.write_at(&[7u8; 8192], new_size - 4096, IoPriority::Urgent),
    );
    let mut buf = vec![0u8; 4096];
    shrunk("a read beyond the new end", dev.read_at(&mut buf, 6 << 20));
    shrunk(
        "a write below the new end",
        dev.write_at(&[8u8; 4096], 4096, IoPriority::Urgent),
    );
    shrunk("write_zeroes", dev.write_zeroes(8192, 4096));
    shrunk("a flush", dev.flush());
    dev.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, vec![5u8; 4096], "a read below the new end");
    let mut q = dev.queue(8).unwrap();
    q.push(IoRequest::write(new_size - 4096, vec![9u8; 8192]), 1)
        .unwrap();
    q.push(IoRequest::read(0, vec![0u8; 4096]), 2).unwrap();
    for d in drain(&mut *q) {
        match d.tag {
            1 => shrunk("a queued write across the new end", d.result),
            _ => d.result.unwrap(),
        }
    }
}

/// s25 RBD pass #5: a shrink that leaves every byte the device's user
/// touches ([`BlockDevice::set_bytes_in_use`]) takes back only unused
/// space, and the device goes on; one below it fails as before, naming the
/// bytes in use. (Fails on the old code: the first shrink, to a size still
/// above everything the volume uses, failed every later write.)
#[test]
fn a_shrink_of_unused_space_is_not_a_failure() {
    let Some(conf) = cluster() else { return };
    let img = test_cluster::unique_image("shrinkunused");
    let t = test_cluster::target(&conf, &img);
    let dev = open_device(t.as_ref(), &create_opts()).unwrap().device;
    let in_use: u64 = 4 << 20;
    assert!(dev.size_bytes() > 6 << 20);
    dev.set_bytes_in_use(in_use);
    dev.write_at(&[5u8; 4096], in_use - 4096, IoPriority::Urgent)
        .unwrap();
    dev.flush().unwrap();
    let resize = |size: &str| {
        rbd_tool(
            &conf,
            &[
                "resize",
                "--allow-shrink",
                "--size",
                size,
                &format!("rbd/{img}"),
            ],
        )
    };
    resize("6M");
    dev.write_at(&[6u8; 4096], in_use - 4096, IoPriority::Urgent)
        .unwrap();
    dev.flush().unwrap();
    let mut buf = vec![0u8; 4096];
    dev.read_at(&mut buf, in_use - 4096).unwrap();
    assert_eq!(buf, vec![6u8; 4096]);
    resize("2M");
    let e = dev
        .write_at(&[7u8; 4096], 0, IoPriority::Urgent)
        .and_then(|()| dev.flush())
        .expect_err("a write after a shrink below the bytes in use");
    let msg = e.to_string();
    assert!(
        msg.contains("shrunk") && msg.contains(&format!("below the {in_use} bytes in use")),
        "{msg}"
    );
}

/// Session 21, defect 2: once a request has timed out
/// (`rados_osd_op_timeout`) the cluster is not answering, and every later
/// write or flush fails at once, saying so, instead of waiting out the
/// timeout again — a close after a timeout made four such waits. Reads are
/// still sent. (Fails on the old code: each later request waited for its
/// own timeout and failed with a bare "Connection timed out".)
#[test]
fn after_a_timeout_later_writes_fail_at_once_naming_it() {
    let Some(conf) = cluster() else { return };
    let t = test_cluster::target(&conf, &test_cluster::unique_image("timeout"));
    let t = format!("{t}:rados_osd_op_timeout=3");
    let dev = open_device(t.as_ref(), &create_opts()).unwrap().device;
    dev.write_at(&[1u8; 4096], 0, IoPriority::Urgent).unwrap();
    dev.flush().unwrap();
    let frozen = FrozenOsd::new();
    let first = dev
        .write_at(&[2u8; 4096], 4096, IoPriority::Urgent)
        .expect_err("a write to a stopped OSD");
    assert!(
        matches!(&first, DeviceError::Io { error, .. } if error.raw_os_error() == Some(libc::ETIMEDOUT)),
        "{first}"
    );
    let later: Vec<(&str, Result<(), DeviceError>)> = vec![
        (
            "a write",
            dev.write_at(&[3u8; 4096], 8192, IoPriority::Urgent),
        ),
        ("a flush", dev.flush()),
        ("write_zeroes", dev.write_zeroes(0, 4096)),
    ];
    assert!(frozen.thaw(), "the requests waited for the OSD");
    for (what, r) in later {
        let msg = r.expect_err(what).to_string();
        println!("{what} after a timeout: {msg}");
        assert!(msg.contains("earlier request timed out"), "{what}: {msg}");
    }
    let mut buf = vec![0u8; 4096];
    dev.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, vec![1u8; 4096]);
}

/// Session 21, defect 6: a monitor that does not answer is named in the
/// error, with the configuration file read. (Fails on the old code:
/// "connecting to the Ceph cluster failed on rbd:…: Connection timed out",
/// naming neither.)
#[test]
fn an_unreachable_monitor_is_named_with_the_config() {
    let Some(conf) = cluster() else { return };
    // Nothing listens on port 9 of 127.0.0.2.
    let t = format!(
        "{}:mon_host=127.0.0.2\\:9:client_mount_timeout=3",
        test_cluster::target(&conf, &test_cluster::unique_image("nomon"))
    );
    let msg = open_device(t.as_ref(), &OpenOptions::default())
        .err()
        .expect("connected through a monitor that is not there")
        .to_string();
    println!("{msg}");
    assert!(msg.contains("127.0.0.2:9"), "{msg}");
    assert!(msg.contains(&conf.display().to_string()), "{msg}");
}

/// Session 21, defect 7: `allocation` reports what librbd says is
/// allocated (rbd_diff_iterate2): objects never written are holes, written
/// ones data. (Fails on the old code: the whole range was "allocated".)
#[test]
fn allocation_reports_unwritten_objects_as_holes() {
    let Some(conf) = cluster() else { return };
    let t = test_cluster::target(&conf, &test_cluster::unique_image("alloc"));
    // 1 MiB objects.
    let t = format!("{t}:rbd_default_order=20");
    let dev = open_device(t.as_ref(), &create_opts()).unwrap().device;
    dev.write_at(&[1u8; 4096], 0, IoPriority::Urgent).unwrap();
    dev.write_at(&[2u8; 4096], 5 << 20, IoPriority::Urgent)
        .unwrap();
    dev.flush().unwrap();
    let map = dev.allocation(0, SIZE_BYTES).unwrap();
    println!("{map:?}");
    let mut pos = 0;
    for e in &map {
        assert_eq!(e.offset, pos, "gap in {map:?}");
        pos += e.len;
    }
    assert_eq!(pos, SIZE_BYTES, "{map:?}");
    let allocated_at = |at: u64| {
        map.iter()
            .find(|e| e.offset <= at && at < e.offset + e.len)
            .map(|e| e.allocated)
    };
    assert_eq!(allocated_at(0), Some(true), "{map:?}");
    assert_eq!(allocated_at(5 << 20), Some(true), "{map:?}");
    for hole in [1u64 << 20, 3 << 20, 7 << 20] {
        assert_eq!(allocated_at(hole), Some(false), "{hole}: {map:?}");
    }
    // A sub-range starts and ends where asked.
    let part = dev.allocation(4 << 20, 2 << 20).unwrap();
    assert_eq!(part.first().map(|e| e.offset), Some(4 << 20), "{part:?}");
    let end = part.last().map(|e| e.offset + e.len);
    assert_eq!(end, Some(6 << 20), "{part:?}");
}
