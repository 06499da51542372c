//! The device layer: aligned, vectored block I/O behind one trait.
//!
//! Everything above this crate talks to storage through [`BlockDevice`]. The
//! implementations are:
//!
//! * [`uring::UringDevice`] — `O_DIRECT` I/O on io_uring, one ring per thread
//!   (no ring lock and no shared counter on the I/O path: one atomic touched
//!   by every I/O becomes the scaling wall at millions of IOPS);
//! * [`pread::PreadDevice`] — portable `preadv`/`pwritev`, used when io_uring
//!   is unavailable;
//! * `mem::MemDevice` — an in-memory device for tests;
//! * `fault::FaultDevice` — an in-memory device that remembers which writes
//!   no completed flush covers and can produce the image a power cut leaves;
//! * `rbd::RbdDevice` (cargo feature `rbd`) — a Ceph RBD image through
//!   librbd's asynchronous API, opened from `rbd:POOL/IMAGE[:conf=PATH][:id=USER]`.
//!
//! The two file backends share [`file`](mod@file): the open file or block device with
//! its geometry, and the positional I/O, bounce buffers, zeroing and
//! allocation queries on it.
//!
//! Besides the synchronous calls, every device has a request queue
//! ([`BlockDevice::queue`], see [`queue`]): one thread keeps many requests
//! in flight with owned buffers and reaps their completions; ordering is
//! a per-request barrier flag. io_uring gives each queue its own ring; the
//! portable backend runs queued requests on a pool of at most
//! [`pool::POOL_THREADS_MAX`] threads per device; the test doubles run them
//! at submit and complete them in a seeded random order.
//!
//! The two test doubles are built only for tests (feature `testing`, which
//! the dev-dependencies of the crates above turn on).
//!
//! `unsafe` code of the whole project lives in this crate (and the C ABI)
//! only: the workspace denies it everywhere else.
#![allow(unsafe_code)]

pub mod aligned;
pub mod bounded;
pub mod error;
#[cfg(any(test, feature = "testing"))]
pub mod fault;
pub mod file;
pub mod flush;
pub mod fork;
pub mod heap;
pub mod lock;
#[cfg(any(test, feature = "testing"))]
pub mod mem;
pub mod open;
pub mod options;
pub mod pool;
pub mod pread;
pub mod queue;
#[cfg(feature = "rbd")]
pub mod rbd;
pub mod stdout;
pub mod uring;

pub use aligned::AlignedBuf;
pub use error::{DeviceError, Result};
pub use flush::FlushCoalescer;
pub use open::{is_rbd_target, open_device, OpenedDevice};
pub use options::{Backend, OpenOptions};
pub use queue::{
    IoBuf, IoBufMut, IoDone, IoOp, IoQueue, IoRequest, Refused, IOV_MAX, QUEUE_DEPTH_MAX,
};

use std::io::{IoSlice, IoSliceMut};

/// The largest logical block size any backend reports; buffers aligned to
/// this are aligned for every device.
pub const MAX_ALIGN: usize = 4096;

/// Who waits for a write: decides its I/O priority, so background writeback
/// never starves reads or writes somebody is waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum IoPriority {
    /// Somebody is blocked on this I/O: send it at normal (best-effort) priority.
    #[default]
    Urgent,
    /// Nobody waits (background commit, checkpoint): lowest priority class so
    /// it does not starve reads.
    Background,
}

/// The storage object behind a device ([`BlockDevice::identity`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Changes when the object is replaced by a copy: an RBD image's id
    /// (with its pool), new for `rbd cp` or an image created again under
    /// the same name, kept by `rbd mv`.
    pub id: String,
    /// How it is reached: `rbd:POOL/IMAGE`, kept when a copy is put in its
    /// place under the same name.
    pub name: String,
}

/// A block device: a byte-addressed array of `size_bytes()` bytes that is
/// read and written in multiples of `logical_block_size()` at aligned offsets.
///
/// Contract for all implementations:
/// * `offset` and the total length of every request are multiples of
///   `logical_block_size()`, and the request lies inside the device; a
///   request that does not is refused with [`DeviceError::Misaligned`] or
///   [`DeviceError::OutOfRange`], never performed partially.
/// * Buffers need not be memory-aligned: a backend that needs aligned memory
///   (O_DIRECT) bounces unaligned buffers through an [`AlignedBuf`]. Callers
///   on hot paths pass [`AlignedBuf`]-backed slices to avoid the copy.
/// * A write is *completed* when the call returns; it is *durable* only once
///   a later [`BlockDevice::flush`] that was issued after the write completed
///   has returned.
/// * Methods take `&self` and are called from many threads at once.
pub trait BlockDevice: Send + Sync {
    /// Size in bytes (a multiple of the logical block size).
    fn size_bytes(&self) -> u64;

    /// What names the storage object behind the device, where the device
    /// knows (an RBD image); None otherwise (files are told apart by their
    /// inode, which the volume reads itself).
    fn identity(&self) -> Option<Identity> {
        None
    }

    /// Tells the device that its user touches only its first `bytes` bytes
    /// (a volume: its superblock, journal and data area). A device that
    /// watches for its storage being shrunk under it (RBD) fails only a
    /// shrink below this, not one that took back space the user never
    /// uses. Other devices: nothing to do.
    fn set_bytes_in_use(&self, _bytes: u64) {}

    /// For storage another client can take over while this one is open (an
    /// RBD image, whose exclusive lock can be broken: the old holder is
    /// then blocklisted), confirms that this client still had it at some
    /// instant at or after `since`. The volume asks before it answers a
    /// read that arrived at `since`, because it answers some reads from
    /// memory, and once the storage was taken over (another client may
    /// have written it) those answers would be stale. Ok at once when a
    /// request of this client submitted at or after `since` succeeded on
    /// the storage; otherwise the device sends one small read and returns
    /// its failure (`ESHUTDOWN` for a blocklisted RBD client). Concurrent
    /// callers share a probe submitted after all their `since`. Other
    /// devices: always Ok.
    fn confirm_ownership(&self, _since: std::time::Instant) -> Result<()> {
        Ok(())
    }

    /// Whether [`BlockDevice::confirm_ownership`] would send a probe now
    /// (and so block), for a caller that must not block.
    fn ownership_probe_due(&self, _since: std::time::Instant) -> bool {
        false
    }

    /// Smallest unit of I/O, in bytes (512 or 4096).
    fn logical_block_size(&self) -> u32;

    /// Reads `bufs` back to back starting at `offset`.
    fn read_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> Result<()>;

    /// Reads `bufs` at `offset` only if that needs no device I/O (the bytes
    /// are in a cache: file backends with a read cache or without O_DIRECT):
    /// `Ok(true)` when read, `Ok(false)` when the read would
    /// have to wait for the device (`bufs` then hold unspecified bytes). For
    /// a caller that must not block. The default never reads.
    fn try_read_cached(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> Result<bool> {
        let _ = (bufs, offset);
        Ok(false)
    }

    /// Whether [`BlockDevice::write_cached`] works: a file backend opened
    /// with O_DIRECT and [`OpenOptions::read_cache`], writable.
    fn has_write_cache(&self) -> bool {
        false
    }

    /// Bytes of this device's pages in the kernel's page cache that are
    /// dirty or being written back: what a flush still has to write. None
    /// where no page cache is in play (the default) or the kernel cannot
    /// say (`cachestat(2)`, Linux 6.5). How a close that waits for a flush
    /// on a slow store tells it from a hung one.
    fn cached_unwritten_bytes(&self) -> Option<u64> {
        None
    }

    /// Writes `bufs` at `offset` through the kernel's page cache (the
    /// buffered descriptor next to O_DIRECT), so later reads through the
    /// read cache find the bytes without device I/O. Returns when the
    /// kernel holds the bytes; like any write, durable only after a later
    /// [`BlockDevice::flush`] (fdatasync writes the descriptor's dirty
    /// pages back, whichever descriptor dirtied them). An O_DIRECT write or
    /// zeroing of the same range later writes those pages back first (or
    /// drops them), so the newer bytes win. The default refuses.
    fn write_cached(&self, bufs: &[IoSlice<'_>], offset: u64) -> Result<()> {
        let _ = (bufs, offset);
        Err(DeviceError::Invalid(format!(
            "{} has no write cache",
            self.backend_name()
        )))
    }

    /// Writes `bufs` back to back starting at `offset`.
    fn write_vectored_at(&self, bufs: &[IoSlice<'_>], offset: u64, prio: IoPriority) -> Result<()>;

    /// Writes `bufs` at `offset` and returns once THIS data is durable
    /// (force unit access: RWF_DSYNC on io_uring). It says nothing about any
    /// other write. The default writes, then flushes.
    fn write_vectored_durable_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        prio: IoPriority,
    ) -> Result<()> {
        self.write_vectored_at(bufs, offset, prio)?;
        self.flush()
    }

    /// Writes every request of `reqs` and returns once all completed (the
    /// durable ones durable, as [`BlockDevice::write_vectored_durable_at`]),
    /// or the first error. Nothing orders the requests among themselves.
    /// Backends with a queue submit them all at once and wait for all
    /// completions (io_uring: one `submit_and_wait` per ring's worth), so
    /// a caller gets queue depth without a thread per request; the default
    /// writes them one after another. Every request is checked like a
    /// single write; after an error, some requests may have been written.
    fn write_batch(&self, reqs: &[WriteReq<'_>], prio: IoPriority) -> Result<()> {
        for r in reqs {
            if r.durable {
                self.write_vectored_durable_at(r.bufs, r.offset, prio)?;
            } else {
                self.write_vectored_at(r.bufs, r.offset, prio)?;
            }
        }
        Ok(())
    }

    /// Makes every completed write durable (a device cache flush).
    fn flush(&self) -> Result<()>;

    /// A request queue of `depth` (1 to [`QUEUE_DEPTH_MAX`]) owned by one
    /// thread: many requests in flight without a thread each (see
    /// [`queue`]). io_uring gives each queue its own ring; the portable
    /// backend runs requests on a small pool shared by the device's queues;
    /// Ceph RBD issues each as its own librbd aio request. The default runs each request synchronously when it is submitted and
    /// holds its completion until `reap`: correct everywhere, concurrent
    /// nowhere.
    fn queue(&self, depth: u32) -> Result<Box<dyn IoQueue + '_>> {
        Ok(Box::new(queue::SyncQueue::new(
            queue::Synchronous(self),
            depth,
            None,
        )?))
    }

    /// Makes `[offset, offset+len)` read back as zeroes, deallocating it where
    /// the backing can (hole punch, BLKZEROOUT). The range is aligned like any
    /// other request. Durable like a write: after a later flush.
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()>;

    /// Makes `[offset, offset+len)` read back as zeroes and keeps it
    /// allocated (NBD's `NO_HOLE`, `fallocate`'s `ZERO_RANGE`): a later
    /// write there needs no new space, which a preallocated image counts
    /// on. Durable like a write: after a later flush. The default writes
    /// zero blocks; file backends use `ZERO_RANGE` (files) or `BLKZEROOUT`
    /// (block devices, which never unmaps).
    fn write_zeroes_allocated(&self, offset: u64, len: u64) -> Result<()> {
        check_request(self.size_bytes(), self.logical_block_size(), offset, len)?;
        let zeroes = AlignedBuf::zeroed(len.min(ZERO_CHUNK) as usize);
        let mut pos = offset;
        while pos < offset + len {
            let n = (offset + len - pos).min(zeroes.len() as u64) as usize;
            #[allow(clippy::indexing_slicing)] // n <= zeroes.len(): the min above
            self.write_at(&zeroes[..n], pos, IoPriority::Urgent)?;
            pos += n as u64;
        }
        Ok(())
    }

    /// Allocates whatever of `[offset, offset+len)` is a hole, leaving its
    /// content as it is (`fallocate` mode 0 on a file), so later writes
    /// there need no new space. The default does nothing: block devices
    /// and the test doubles have no holes to fill.
    fn allocate(&self, offset: u64, len: u64) -> Result<()> {
        let _ = (offset, len);
        Ok(())
    }

    /// Which parts of `[offset, offset+len)` are allocated. The default says
    /// everything is; file backends answer from SEEK_DATA/SEEK_HOLE.
    fn allocation(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        Ok(vec![Extent {
            offset,
            len,
            allocated: true,
        }])
    }

    /// A short name for logs and `info` ("io_uring", "pread", "memory", "fault").
    fn backend_name(&self) -> &'static str;

    /// Reads into one buffer.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.read_vectored_at(&mut [IoSliceMut::new(buf)], offset)
    }

    /// Writes one buffer.
    fn write_at(&self, buf: &[u8], offset: u64, prio: IoPriority) -> Result<()> {
        self.write_vectored_at(&[IoSlice::new(buf)], offset, prio)
    }
}

/// Largest zero buffer [`BlockDevice::write_zeroes_allocated`]'s default
/// writes at a time.
const ZERO_CHUNK: u64 = 1 << 20;

/// One write of a [`BlockDevice::write_batch`].
#[derive(Clone, Copy, Debug)]
pub struct WriteReq<'a> {
    pub offset: u64,
    pub bufs: &'a [IoSlice<'a>],
    /// Force unit access: durable when the batch returns.
    pub durable: bool,
}

/// A run of bytes that is either allocated or a hole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    pub allocated: bool,
}

/// Checks the common request contract; returns the total length.
pub fn check_request(dev_size: u64, lbs: u32, offset: u64, len: u64) -> Result<()> {
    let lbs = u64::from(lbs);
    if !offset.is_multiple_of(lbs) || !len.is_multiple_of(lbs) {
        return Err(DeviceError::Misaligned {
            offset,
            len,
            block_size: lbs as u32,
        });
    }
    match offset.checked_add(len) {
        Some(end) if end <= dev_size => Ok(()),
        _ => Err(DeviceError::OutOfRange {
            offset,
            len,
            size: dev_size,
        }),
    }
}

/// Total length of a vector of slices.
/// Whether every byte of `b` is zero. Compares 4 KiB at a time against a
/// static zero page (the library's vectorized `memcmp`): a byte-at-a-time
/// loop over zero blocks was 14% of the server's CPU under
/// `qemu-img bench -w` (which writes zeroes).
pub fn is_zero(b: &[u8]) -> bool {
    static ZEROS: [u8; 4096] = [0; 4096];
    b.chunks(ZEROS.len()).all(|c| c == &ZEROS[..c.len()])
}

/// Gives SIGPIPE back its default action (end the process quietly), which
/// the Rust runtime sets to "ignore". For commands that only print, so that
/// `jbdev check IMG | head` ends like any Unix tool instead of panicking in
/// `println!` on the closed pipe. Never call it in a process that writes to
/// sockets or has cleanup to run: a vanished peer would kill it.
pub fn die_quietly_on_broken_pipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL installs no handler
    // and touches no memory; it is async-signal-safe and thread-safe.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

pub fn iov_len(bufs: &[IoSlice<'_>]) -> u64 {
    bufs.iter().map(|b| b.len() as u64).sum()
}

/// Total length of a vector of mutable slices.
pub fn iov_len_mut(bufs: &[IoSliceMut<'_>]) -> u64 {
    bufs.iter().map(|b| b.len() as u64).sum()
}

#[cfg(test)]
mod zero_tests {
    #[test]
    fn is_zero_looks_at_every_byte() {
        for len in [0usize, 1, 511, 4096, 4097, 12288 + 5] {
            let mut b = vec![0u8; len];
            assert!(super::is_zero(&b));
            for at in [0, len / 2, len.saturating_sub(1)] {
                if len == 0 {
                    continue;
                }
                b[at] = 1;
                assert!(!super::is_zero(&b), "len {len}, nonzero at {at}");
                b[at] = 0;
            }
        }
    }
}
