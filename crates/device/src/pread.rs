//! Portable backend: `preadv`/`pwritev`/`fdatasync` on a file descriptor
//! (the I/O itself is in [`crate::file`]), with a bounded thread pool for
//! its queues ([`crate::pool`]).

use std::io::{IoSlice, IoSliceMut};

use crate::file::{
    allocation, pread_all, pwrite_all, pwrite_cached, try_read_cached, zero_range, DeviceFile,
};
use crate::{check_request, iov_len, iov_len_mut, BlockDevice, DeviceError, IoPriority, Result};

/// The portable backend.
pub struct PreadDevice {
    f: std::sync::Arc<DeviceFile>,
    /// Runs the requests of this device's queues; started with the first
    /// queue (see [`crate::pool`]).
    pool: std::sync::OnceLock<crate::pool::Pool>,
}

impl PreadDevice {
    pub fn new(f: DeviceFile) -> Self {
        Self {
            f: std::sync::Arc::new(f),
            pool: std::sync::OnceLock::new(),
        }
    }
}

impl BlockDevice for PreadDevice {
    fn size_bytes(&self) -> u64 {
        self.f.size_bytes
    }
    fn logical_block_size(&self) -> u32 {
        self.f.logical_block_size
    }
    fn read_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> Result<()> {
        check_request(
            self.f.size_bytes,
            self.f.logical_block_size,
            offset,
            iov_len_mut(bufs),
        )?;
        pread_all(&self.f, bufs, offset)
    }
    fn try_read_cached(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> Result<bool> {
        try_read_cached(&self.f, bufs, offset)
    }

    fn cached_unwritten_bytes(&self) -> Option<u64> {
        crate::file::cached_unwritten_bytes(&self.f)
    }

    fn has_write_cache(&self) -> bool {
        self.f.cached.is_some() && !self.f.read_only
    }

    fn write_cached(&self, bufs: &[IoSlice<'_>], offset: u64) -> Result<()> {
        pwrite_cached(&self.f, bufs, offset)
    }
    fn write_vectored_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        _prio: IoPriority,
    ) -> Result<()> {
        check_request(
            self.f.size_bytes,
            self.f.logical_block_size,
            offset,
            iov_len(bufs),
        )?;
        pwrite_all(&self.f, bufs, offset)
    }
    fn flush(&self) -> Result<()> {
        self.f
            .file
            .sync_data()
            .map_err(|e| DeviceError::io("fdatasync", self.f.what(), e))
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        zero_range(&self.f, offset, len)
    }
    fn write_zeroes_allocated(&self, offset: u64, len: u64) -> Result<()> {
        crate::file::zero_range_allocated(&self.f, offset, len)
    }
    fn allocate(&self, offset: u64, len: u64) -> Result<()> {
        crate::file::allocate(&self.f, offset, len)
    }
    fn allocation(&self, offset: u64, len: u64) -> Result<Vec<crate::Extent>> {
        allocation(&self.f, offset, len)
    }
    /// A queue on the device's thread pool (at most
    /// [`crate::pool::POOL_THREADS_MAX`] threads for all its queues).
    fn queue(&self, depth: u32) -> Result<Box<dyn crate::IoQueue + '_>> {
        let pool = self
            .pool
            .get_or_init(|| crate::pool::Pool::new(self.f.clone()));
        Ok(Box::new(crate::pool::PoolQueue::new(&self.f, pool, depth)?))
    }

    fn backend_name(&self) -> &'static str {
        "pread"
    }
}
