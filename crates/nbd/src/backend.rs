//! What the server serves: the [`Backend`] trait, its implementation for
//! [`jbdev_volume::Volume`], and an in-memory one for tests.
//!
//! The protocol layer validates ranges and flags before it calls a backend,
//! so a backend sees only in-range requests; it still returns errors (never
//! panics) for anything else that goes wrong.

use std::sync::Arc;

use parking_lot::RwLock;

use crate::proto;

/// A failed backend call, carrying the NBD error value to reply with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (nbd error {errno})")]
pub struct BackendError {
    /// Protocol error value (`proto::EIO`, `proto::ENOSPC`, ...).
    pub errno: u32,
    pub message: String,
}

impl BackendError {
    pub fn new(errno: u32, message: impl Into<String>) -> Self {
        Self {
            errno,
            message: message.into(),
        }
    }
}

pub type BackendResult<T> = Result<T, BackendError>;

/// Receives the outcome of a request started with a `*_then` method of
/// [`Backend`]. It runs exactly once, on the calling thread or on one of the
/// backend's own threads (a commit completing), so it must be quick and must
/// not call into the backend: queue a reply, wake a task.
pub type Done = Box<dyn FnOnce(BackendResult<()>) + Send + 'static>;

/// A WRITE's payload, owned: see [`Backend::write_owned_then`] (the
/// volume's own type for such a buffer).
pub type OwnedPayload = jbdev_volume::CallerBuf;

/// A run of bytes in one allocation state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub length: u64,
    /// Reads as zeroes (never written, trimmed or zeroed).
    pub zero: bool,
}

/// A block device the server exports. Called from many worker threads at
/// once; implementations must not serialize independent requests.
///
/// Durability contract (what the server relies on to answer FLUSH and FUA
/// honestly, across all connections):
/// * once `write_at`/`trim`/`write_zeroes` return, every later read on any
///   thread sees the new content;
/// * a call with `fua = true` returns only once its data is durable;
/// * `flush` returns only once every write that had returned before it was
///   called is durable.
pub trait Backend: Send + Sync + 'static {
    fn size_bytes(&self) -> u64;
    /// Preferred I/O size (the volume's block size).
    fn preferred_block_bytes(&self) -> u32;
    fn read_only(&self) -> bool;
    fn read_at(&self, buf: &mut [u8], offset: u64) -> BackendResult<()>;
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> BackendResult<()>;
    fn flush(&self) -> BackendResult<()>;
    /// [`Backend::write_at`] without waiting for durability: the data is
    /// visible to reads once this returns, and `done` gets the outcome once
    /// the write is complete (durable, with `fua`). A backend with group
    /// commit overrides it so that one thread can have many FUA writes in
    /// one commit; the default completes it in place.
    fn write_at_then(&self, buf: &[u8], offset: u64, fua: bool, done: Done) {
        done(self.write_at(buf, offset, fua))
    }
    /// [`Backend::write_at_then`] of a payload buffer the backend may keep
    /// until the write is done, so that a large write need not be copied
    /// on its way to the device. The default borrows it.
    fn write_owned_then(&self, buf: OwnedPayload, offset: u64, fua: bool, done: Done) {
        self.write_at_then((*buf).as_ref(), offset, fua, done)
    }
    /// [`Backend::flush`] reporting to `done` (see [`Backend::write_at_then`]):
    /// covers every write that had returned before this call.
    fn flush_then(&self, done: Done) {
        done(self.flush())
    }
    /// [`Backend::write_at_then`] only if it can run without blocking the
    /// calling thread (no device I/O, no wait for space); otherwise `done`
    /// comes back unused and nothing changed. The server's network threads
    /// try this first and pass what comes back to a worker. The default
    /// never runs in place.
    fn try_write_at_then(
        &self,
        buf: &[u8],
        offset: u64,
        fua: bool,
        done: Done,
    ) -> Result<(), Done> {
        let _ = (buf, offset, fua);
        Err(done)
    }
    /// [`Backend::flush_then`] only if it can run without blocking (see
    /// [`Backend::try_write_at_then`]).
    fn try_flush_then(&self, done: Done) -> Result<(), Done> {
        Err(done)
    }
    /// [`Backend::read_at`] only if it needs no device I/O (cached or
    /// in memory); None if it would block (`buf` then unspecified). The
    /// default never reads.
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<BackendResult<()>> {
        let _ = (buf, offset);
        None
    }
    /// Deallocates; the range then reads as zeroes.
    fn trim(&self, offset: u64, length: u64, fua: bool) -> BackendResult<()>;
    /// Zeroes the range; with `no_hole` (`NBD_CMD_FLAG_NO_HOLE`) it stays
    /// allocated, otherwise it may be deallocated.
    fn write_zeroes(&self, offset: u64, length: u64, fua: bool, no_hole: bool)
        -> BackendResult<()>;
    /// Whether zeroing this range (allowed to deallocate) is cheaper than
    /// writing zero bytes to it (decides the answer to
    /// `NBD_CMD_FLAG_FAST_ZERO`).
    fn zeroes_are_fast(&self, offset: u64, length: u64) -> bool;
    /// Allocation map of `[offset, offset+length)`: consecutive extents
    /// starting at `offset`, covering at least one byte.
    fn block_status(
        &self,
        offset: u64,
        length: u64,
        max_extents: usize,
    ) -> BackendResult<Vec<Extent>>;
    /// `NBD_CMD_CACHE`: a hint to prefetch. The default does nothing.
    fn cache(&self, offset: u64, length: u64) -> BackendResult<()> {
        let _ = (offset, length);
        Ok(())
    }
    /// The connection answered a request of command `kind` (`CMD_*`,
    /// possibly unknown) with `errno` without calling the backend: it failed
    /// validation (read-only export, out of range, over the maximum size,
    /// unknown command or flags) or asked for a fast zero that would write
    /// data. For metrics; the default does nothing.
    fn rejected(&self, kind: u16, errno: u32) {
        let _ = (kind, errno);
    }
}

impl<B: Backend + ?Sized> Backend for Arc<B> {
    fn size_bytes(&self) -> u64 {
        (**self).size_bytes()
    }
    fn preferred_block_bytes(&self) -> u32 {
        (**self).preferred_block_bytes()
    }
    fn read_only(&self) -> bool {
        (**self).read_only()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> BackendResult<()> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> BackendResult<()> {
        (**self).write_at(buf, offset, fua)
    }
    fn flush(&self) -> BackendResult<()> {
        (**self).flush()
    }
    fn write_at_then(&self, buf: &[u8], offset: u64, fua: bool, done: Done) {
        (**self).write_at_then(buf, offset, fua, done)
    }
    fn write_owned_then(&self, buf: OwnedPayload, offset: u64, fua: bool, done: Done) {
        (**self).write_owned_then(buf, offset, fua, done)
    }
    fn flush_then(&self, done: Done) {
        (**self).flush_then(done)
    }
    fn try_write_at_then(
        &self,
        buf: &[u8],
        offset: u64,
        fua: bool,
        done: Done,
    ) -> Result<(), Done> {
        (**self).try_write_at_then(buf, offset, fua, done)
    }
    fn try_flush_then(&self, done: Done) -> Result<(), Done> {
        (**self).try_flush_then(done)
    }
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<BackendResult<()>> {
        (**self).try_read_at(buf, offset)
    }
    fn trim(&self, offset: u64, length: u64, fua: bool) -> BackendResult<()> {
        (**self).trim(offset, length, fua)
    }
    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        fua: bool,
        no_hole: bool,
    ) -> BackendResult<()> {
        (**self).write_zeroes(offset, length, fua, no_hole)
    }
    fn zeroes_are_fast(&self, offset: u64, length: u64) -> bool {
        (**self).zeroes_are_fast(offset, length)
    }
    fn block_status(
        &self,
        offset: u64,
        length: u64,
        max_extents: usize,
    ) -> BackendResult<Vec<Extent>> {
        (**self).block_status(offset, length, max_extents)
    }
    fn cache(&self, offset: u64, length: u64) -> BackendResult<()> {
        (**self).cache(offset, length)
    }
    fn rejected(&self, kind: u16, errno: u32) {
        (**self).rejected(kind, errno)
    }
}

// ------------------------------------------------------------------ volume

/// A [`jbdev_volume::Volume`] as an NBD backend.
pub struct VolumeBackend {
    volume: Arc<jbdev_volume::Volume>,
    read_only: bool,
    read_errors: jbdev_volume::ratelimit::RateLimit,
}

/// Read errors are logged at most once per this interval, each warning
/// saying how many were not logged since the last one.
pub const READ_ERROR_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

impl VolumeBackend {
    /// A backend serving `volume`.
    pub fn new(volume: Arc<jbdev_volume::Volume>, read_only: bool) -> Self {
        Self {
            volume,
            read_only,
            read_errors: jbdev_volume::ratelimit::RateLimit::new(READ_ERROR_LOG_INTERVAL),
        }
    }

    /// The NBD error for a failed read, logged (rate-limited: a failing disk
    /// under a busy client would flood the log). Clients only see `EIO`
    /// or `EPERM`; the log keeps the device's errno.
    fn read_error(&self, e: jbdev_volume::VolumeError, offset: u64, len: usize) -> BackendError {
        if let Some(held) = self.read_errors.pass(std::time::Instant::now()) {
            let more = self.read_errors.held_note(held, "read error(s)");
            tracing::warn!(
                "read of {len} bytes at offset {offset} failed (errno {}): {e}{more}",
                e.errno()
            );
        }
        map_volume_error(e)
    }

    pub fn volume(&self) -> &Arc<jbdev_volume::Volume> {
        &self.volume
    }

    /// Runs `op` once over the whole request. The volume takes any size:
    /// requests that fit in one journal transaction are journaled
    /// (all-or-nothing), larger ones go straight home (NBD promises no
    /// atomicity for them), and FUA makes either durable before it returns.
    fn call(
        &self,
        offset: u64,
        length: u64,
        fua: bool,
        mut op: impl FnMut(u64, u64, jbdev_volume::WriteFlags) -> jbdev_volume::Result<()>,
    ) -> BackendResult<()> {
        op(offset, length, jbdev_volume::WriteFlags { fua }).map_err(write_error)
    }
}

impl VolumeBackend {
    /// Hands what a non-blocking attempt left to do to `done`, or gives
    /// `done` back if the attempt would have blocked.
    fn finish_attempt(
        &self,
        attempt: Option<jbdev_volume::Result<jbdev_volume::Durability>>,
        done: Done,
    ) -> Result<(), Done> {
        match attempt {
            None => Err(done),
            Some(Err(e)) => {
                done(Err(write_error(e)));
                Ok(())
            }
            Some(Ok(d)) => {
                self.volume.complete(d, volume_done(done));
                Ok(())
            }
        }
    }
}

/// The volume's completion that reports to the server's `done`.
fn volume_done(done: Done) -> jbdev_volume::Completion {
    Box::new(move |res| done(res.map_err(write_error)))
}

/// Failed writes, zeroings, trims and flushes logged, for every export
/// together (rate-limited as reads are).
static WRITE_ERRORS: jbdev_volume::ratelimit::RateLimit =
    jbdev_volume::ratelimit::RateLimit::new(READ_ERROR_LOG_INTERVAL);

/// The NBD error for a failed write (or zeroing, trim, flush); a failure of
/// the store is logged too, as a failed read is: the client sees only an
/// errno, and the operator had nothing (session 29's pass: an unaligned
/// write whose edge block could not be read left the server's log empty).
/// A client's own mistake (out of range, too large, read-only) is not
/// logged: its reply says it (`client_message`).
fn write_error(e: jbdev_volume::VolumeError) -> BackendError {
    use jbdev_volume::VolumeError as V;
    let clients_mistake = matches!(
        e,
        V::OutOfRange { .. }
            | V::TooLarge { .. }
            | V::TransactionTooBig { .. }
            | V::ReadOnly
            | V::Closed
    );
    if !clients_mistake {
        if let Some(held) = WRITE_ERRORS.pass(std::time::Instant::now()) {
            let more = WRITE_ERRORS.held_note(held, "write error(s)");
            tracing::warn!("a write failed (errno {}): {e}{more}", e.errno());
        }
    }
    map_volume_error(e)
}

/// Maps a volume error to the NBD error value the spec asks for.
pub fn map_volume_error(e: jbdev_volume::VolumeError) -> BackendError {
    use jbdev_volume::VolumeError as V;
    let errno = match &e {
        V::OutOfRange { .. } | V::TooLarge { .. } | V::TransactionTooBig { .. } => proto::ENOSPC,
        V::ReadOnly => proto::EPERM,
        // The store refuses writes (a file system remounted read-only, a
        // write-protected device, permissions): NBD_EPERM, the protocol's
        // "operation not permitted", not a generic EIO.
        V::Device(d) if jbdev_volume::is_not_writable(d.errno()) => proto::EPERM,
        V::Aborted { cause_errno, .. } if jbdev_volume::is_not_writable(*cause_errno) => {
            proto::EPERM
        }
        V::InvalidArgument(_) => proto::EINVAL,
        V::Closed => proto::ESHUTDOWN,
        // The backing store is full (this request's own write, or the one
        // whose failure aborted the journal): ENOSPC, not EIO, so a client
        // can stop and wait for space (qemu's default werror=enospc pauses
        // the guest) instead of failing the guest's I/O.
        e if jbdev_volume::is_no_space(e.errno()) => proto::ENOSPC,
        _ => proto::EIO,
    };
    BackendError::new(errno, client_message(&e, errno))
}

/// What a client is told of a failure. A mistake of its own (out of range,
/// too large, read-only) is described; a failure of the server's storage
/// only by its kind: the volume's error names host paths, the server's pid
/// and the operator's commands (`cp /proc/PID/fd/N ...`), which are the
/// server's log's to show (the failure is logged there), never a client's.
fn client_message(e: &jbdev_volume::VolumeError, errno: u32) -> String {
    use jbdev_volume::VolumeError as V;
    match e {
        V::OutOfRange { .. }
        | V::TooLarge { .. }
        | V::TransactionTooBig { .. }
        | V::ReadOnly
        | V::Closed => e.to_string(),
        V::Aborted { .. } | V::JournalFileLost(_) => "the volume's journal was aborted after a \
            failure of the server's storage: writes fail until the server reopens the volume \
            (details in the server's log)"
            .into(),
        _ if errno == proto::ENOSPC => {
            "the server's storage is full (details in the server's log)".into()
        }
        _ if errno == proto::EPERM => {
            "the server's storage refuses writes (details in the server's log)".into()
        }
        _ if errno == proto::EINVAL => "invalid request (details in the server's log)".into(),
        _ => "I/O error on the server's storage (details in the server's log)".into(),
    }
}

impl Backend for VolumeBackend {
    fn size_bytes(&self) -> u64 {
        self.volume.size()
    }
    fn preferred_block_bytes(&self) -> u32 {
        self.volume.block_size()
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> BackendResult<()> {
        let len = buf.len();
        self.volume
            .read_at(buf, offset)
            .map_err(|e| self.read_error(e, offset, len))
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> BackendResult<()> {
        let vol = &self.volume;
        self.call(offset, buf.len() as u64, fua, |off, len, flags| {
            let start = (off - offset) as usize;
            vol.write_at(&buf[start..start + len as usize], off, flags)
        })
    }
    fn flush(&self) -> BackendResult<()> {
        self.volume.flush().map_err(write_error)
    }
    fn write_at_then(&self, buf: &[u8], offset: u64, fua: bool, done: Done) {
        let flags = jbdev_volume::WriteFlags { fua };
        self.volume
            .write_at_then(buf, offset, flags, volume_done(done))
    }
    fn write_owned_then(&self, buf: OwnedPayload, offset: u64, fua: bool, done: Done) {
        let flags = jbdev_volume::WriteFlags { fua };
        self.volume
            .write_owned_then(buf, offset, flags, volume_done(done))
    }
    fn flush_then(&self, done: Done) {
        self.volume.flush_then(volume_done(done))
    }
    fn try_write_at_then(
        &self,
        buf: &[u8],
        offset: u64,
        fua: bool,
        done: Done,
    ) -> Result<(), Done> {
        let flags = jbdev_volume::WriteFlags { fua };
        let attempt = self.volume.try_write_at(buf, offset, flags);
        self.finish_attempt(attempt, done)
    }
    fn try_flush_then(&self, done: Done) -> Result<(), Done> {
        let attempt = self.volume.try_flush();
        self.finish_attempt(attempt, done)
    }
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Option<BackendResult<()>> {
        let len = buf.len();
        self.volume
            .try_read_at(buf, offset)
            .map(|r| r.map_err(|e| self.read_error(e, offset, len)))
    }
    fn trim(&self, offset: u64, length: u64, fua: bool) -> BackendResult<()> {
        let vol = &self.volume;
        self.call(offset, length, fua, |off, len, flags| {
            vol.trim(off, len, flags)
        })
    }
    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        fua: bool,
        no_hole: bool,
    ) -> BackendResult<()> {
        let vol = &self.volume;
        self.call(offset, length, fua, |off, len, flags| {
            if no_hole {
                vol.write_zeroes_allocated(off, len, flags)
            } else {
                vol.write_zeroes(off, len, flags)
            }
        })
    }
    fn zeroes_are_fast(&self, offset: u64, length: u64) -> bool {
        self.volume.zeroes_in_place(offset, length)
    }
    fn block_status(
        &self,
        offset: u64,
        length: u64,
        max_extents: usize,
    ) -> BackendResult<Vec<Extent>> {
        let extents = self
            .volume
            .block_status_at_most(offset, length, max_extents)
            .map_err(|e| {
                // Logged as a failed read is: the client's reply does not
                // say what failed.
                if let Some(held) = self.read_errors.pass(std::time::Instant::now()) {
                    let more = self.read_errors.held_note(held, "read error(s)");
                    tracing::warn!(
                        "block status of {length} bytes at offset {offset} failed (errno {}): \
                         {e}{more}",
                        e.errno()
                    );
                }
                map_volume_error(e)
            })?;
        Ok(extents
            .into_iter()
            .map(|e| Extent {
                offset: e.offset,
                length: e.len,
                zero: e.state == jbdev_volume::ExtentState::Zero,
            })
            .collect())
    }
}

// ------------------------------------------------------------------ memory

/// Allocation granule of [`MemBackend`]'s block map.
const MEM_BLOCK_BYTES: u64 = 4096;

/// An in-memory backend for protocol tests: contents plus a per-4-KiB
/// "allocated" map, so block status and holes can be tested.
pub struct MemBackend {
    state: RwLock<MemState>,
    read_only: bool,
}

struct MemState {
    data: Vec<u8>,
    allocated: Vec<bool>,
    flushes: u64,
}

impl MemBackend {
    pub fn new(size_bytes: usize, read_only: bool) -> Self {
        let blocks = (size_bytes as u64).div_ceil(MEM_BLOCK_BYTES) as usize;
        Self {
            state: RwLock::new(MemState {
                data: vec![0; size_bytes],
                allocated: vec![false; blocks],
                flushes: 0,
            }),
            read_only,
        }
    }

    /// How many flushes (explicit or FUA) reached the backend.
    pub fn flush_count(&self) -> u64 {
        self.state.read().flushes
    }

    /// A copy of the contents.
    pub fn snapshot(&self) -> Vec<u8> {
        self.state.read().data.clone()
    }

    fn check(&self, offset: u64, length: u64) -> BackendResult<()> {
        let size = self.size_bytes();
        match offset.checked_add(length) {
            Some(end) if end <= size => Ok(()),
            _ => Err(BackendError::new(proto::EINVAL, "out of range")),
        }
    }

    fn fill(&self, offset: u64, length: u64, allocate: bool) -> BackendResult<()> {
        self.check(offset, length)?;
        if self.read_only {
            return Err(BackendError::new(proto::EPERM, "read-only"));
        }
        let mut st = self.state.write();
        st.data[offset as usize..(offset + length) as usize].fill(0);
        if length > 0 {
            let first = offset / MEM_BLOCK_BYTES;
            let last = (offset + length - 1) / MEM_BLOCK_BYTES;
            for b in first..=last {
                let b_start = b * MEM_BLOCK_BYTES;
                let whole = b_start >= offset && b_start + MEM_BLOCK_BYTES <= offset + length;
                if whole {
                    st.allocated[b as usize] = allocate;
                }
            }
        }
        Ok(())
    }
}

impl Backend for MemBackend {
    fn size_bytes(&self) -> u64 {
        self.state.read().data.len() as u64
    }
    fn preferred_block_bytes(&self) -> u32 {
        MEM_BLOCK_BYTES as u32
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> BackendResult<()> {
        self.check(offset, buf.len() as u64)?;
        let st = self.state.read();
        buf.copy_from_slice(&st.data[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> BackendResult<()> {
        self.check(offset, buf.len() as u64)?;
        if self.read_only {
            return Err(BackendError::new(proto::EPERM, "read-only"));
        }
        let mut st = self.state.write();
        st.data[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        if !buf.is_empty() {
            let first = offset / MEM_BLOCK_BYTES;
            let last = (offset + buf.len() as u64 - 1) / MEM_BLOCK_BYTES;
            for b in first..=last {
                st.allocated[b as usize] = true;
            }
        }
        if fua {
            st.flushes += 1;
        }
        Ok(())
    }
    fn flush(&self) -> BackendResult<()> {
        self.state.write().flushes += 1;
        Ok(())
    }
    fn trim(&self, offset: u64, length: u64, _fua: bool) -> BackendResult<()> {
        self.fill(offset, length, false)
    }
    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        _fua: bool,
        no_hole: bool,
    ) -> BackendResult<()> {
        self.fill(offset, length, no_hole)
    }
    fn zeroes_are_fast(&self, _offset: u64, _length: u64) -> bool {
        true
    }
    fn block_status(
        &self,
        offset: u64,
        length: u64,
        _max_extents: usize,
    ) -> BackendResult<Vec<Extent>> {
        self.check(offset, length)?;
        let st = self.state.read();
        let end = offset + length;
        let mut out: Vec<Extent> = Vec::new();
        let mut pos = offset;
        while pos < end {
            let b = pos / MEM_BLOCK_BYTES;
            let b_end = ((b + 1) * MEM_BLOCK_BYTES).min(end);
            let zero = !st.allocated[b as usize];
            match out.last_mut() {
                Some(last) if last.zero == zero => last.length += b_end - pos,
                _ => out.push(Extent {
                    offset: pos,
                    length: b_end - pos,
                    zero,
                }),
            }
            pos = b_end;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_refusing_writes_is_eperm_not_eio() {
        use jbdev_volume::VolumeError as V;
        let dev = |errno| {
            V::Device(jbdev_device::DeviceError::Io {
                op: "write",
                what: "v.img".into(),
                error: std::io::Error::from_raw_os_error(errno),
            })
        };
        // EPERM, EROFS, EACCES (Linux numbers; this crate has no libc).
        for errno in [1, 30, 13] {
            assert_eq!(map_volume_error(dev(errno)).errno, proto::EPERM, "{errno}");
            let aborted = V::Aborted {
                reason: "write failed".into(),
                cause_errno: errno,
            };
            assert_eq!(map_volume_error(aborted).errno, proto::EPERM, "{errno}");
        }
        assert_eq!(map_volume_error(dev(5)).errno, proto::EIO);
        assert_eq!(map_volume_error(dev(28)).errno, proto::ENOSPC);
        assert_eq!(map_volume_error(V::ReadOnly).errno, proto::EPERM);
    }

    /// Session 33's multi-export pass: a client's error reply carried the
    /// volume's error text, with host paths, the server's pid and a
    /// `cp /proc/PID/fd/N PATH` command for the operator.
    #[test]
    fn a_client_is_told_what_failed_but_no_path() {
        use jbdev_volume::VolumeError as V;
        let secret = "/srv/private/vol.img";
        let failures = [
            V::Device(jbdev_device::DeviceError::Io {
                op: "write",
                what: secret.into(),
                error: std::io::Error::from_raw_os_error(5),
            }),
            V::Device(jbdev_device::DeviceError::Io {
                op: "write",
                what: secret.into(),
                error: std::io::Error::from_raw_os_error(28),
            }),
            V::Aborted {
                reason: format!("writing {secret} failed"),
                cause_errno: 5,
            },
            V::JournalFileLost(format!("cp /proc/7/fd/6 {secret}")),
            V::StoreFull {
                reason: format!("writing {secret}"),
                closing: false,
                cause_errno: 28,
            },
            V::Internal(format!("panic in {secret}")),
        ];
        for e in failures {
            let shown = e.to_string();
            assert!(shown.contains(secret), "the test's premise: {shown}");
            let reply = map_volume_error(e);
            for leak in ["/srv", "/proc", "pid", "cp "] {
                assert!(!reply.message.contains(leak), "{}", reply.message);
            }
            assert!(reply.message.contains("server's log"), "{}", reply.message);
        }
        let mistake = map_volume_error(V::OutOfRange {
            offset: 4096,
            len: 512,
            size: 4096,
        });
        assert!(
            mistake.message.contains("past the end"),
            "{}",
            mistake.message
        );
    }

    #[test]
    fn mem_backend_tracks_allocation() {
        let m = MemBackend::new(64 << 10, false);
        assert_eq!(
            m.block_status(0, 64 << 10, usize::MAX).unwrap(),
            vec![Extent {
                offset: 0,
                length: 64 << 10,
                zero: true
            }]
        );
        m.write_at(&[7; 10], 8192 + 5, false).unwrap();
        let ext = m.block_status(0, 64 << 10, usize::MAX).unwrap();
        assert_eq!(ext.len(), 3);
        assert_eq!(
            ext[1],
            Extent {
                offset: 8192,
                length: 4096,
                zero: false
            }
        );
        m.trim(8192, 4096, false).unwrap();
        assert_eq!(m.block_status(0, 64 << 10, usize::MAX).unwrap().len(), 1);
        let mut b = [1u8; 16];
        m.read_at(&mut b, 8192).unwrap();
        assert_eq!(b, [0; 16]);
        assert!(m.read_at(&mut b, 64 << 10).is_err());
    }
}
