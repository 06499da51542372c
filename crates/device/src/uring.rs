//! io_uring backend. (Being written: see the device-layer helper task.)

use std::io::{IoSlice, IoSliceMut};

use crate::pread::DeviceFile;
use crate::{check_request, iov_len, iov_len_mut, BlockDevice, IoPriority, Result};

/// Checks that this process may create io_uring instances.
pub fn probe() -> Result<()> {
    Ok(())
}

/// Logs, once per process, that io_uring is unavailable and why.
pub fn log_fallback_once(e: &crate::DeviceError) {
    tracing::warn!("io_uring unavailable ({e}); using the portable pread/pwrite backend");
}

/// O_DIRECT I/O through one io_uring per thread.
pub struct UringDevice {
    f: DeviceFile,
}

impl UringDevice {
    pub fn new(f: DeviceFile) -> Self {
        Self { f }
    }
}

impl BlockDevice for UringDevice {
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
        crate::pread::pread_all(&self.f, bufs, offset)
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
        crate::pread::pwrite_all(&self.f, bufs, offset)
    }
    fn flush(&self) -> Result<()> {
        self.f
            .file
            .sync_data()
            .map_err(|e| crate::DeviceError::io("fdatasync", self.f.what(), e))
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        check_request(self.f.size_bytes, self.f.logical_block_size, offset, len)?;
        crate::pread::zero_range(&self.f, offset, len)
    }
    fn allocation(&self, offset: u64, len: u64) -> Result<Vec<crate::Extent>> {
        crate::pread::allocation(&self.f, offset, len)
    }
    fn backend_name(&self) -> &'static str {
        "io_uring"
    }
}
