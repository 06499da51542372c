//! An in-memory block device for tests and benchmarks of the upper layers.

use std::io::{IoSlice, IoSliceMut};

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::{check_request, iov_len, iov_len_mut, BlockDevice, IoPriority, Result};

/// A device backed by a `Vec<u8>`. Every write is immediately "durable":
/// use [`crate::fault::FaultDevice`] to model volatile caches.
pub struct MemDevice {
    data: RwLock<Vec<u8>>,
    block_size: u32,
    /// Seeds the completion order of queues; bumped by every queue made.
    queue_seed: AtomicU64,
}

impl MemDevice {
    /// A zero-filled device of `size_bytes` (rounded down to `block_size`).
    pub fn new(size_bytes: u64, block_size: u32) -> Self {
        let size = size_bytes - size_bytes % u64::from(block_size);
        Self {
            data: RwLock::new(vec![0; size as usize]),
            block_size,
            queue_seed: AtomicU64::new(0),
        }
    }

    /// A device holding `image` (its length must be a multiple of `block_size`).
    pub fn from_image(image: Vec<u8>, block_size: u32) -> Self {
        assert_eq!(
            image.len() % block_size as usize,
            0,
            "image length not block aligned"
        );
        Self {
            data: RwLock::new(image),
            block_size,
            queue_seed: AtomicU64::new(0),
        }
    }

    /// Seeds the order in which queues made from now on deliver completions.
    pub fn set_queue_seed(&self, seed: u64) {
        self.queue_seed.store(seed, Ordering::Relaxed);
    }

    /// A copy of the whole content.
    pub fn image(&self) -> Vec<u8> {
        self.data.read().clone()
    }
}

impl BlockDevice for MemDevice {
    fn size_bytes(&self) -> u64 {
        self.data.read().len() as u64
    }

    fn logical_block_size(&self) -> u32 {
        self.block_size
    }

    fn read_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> Result<()> {
        let data = self.data.read();
        check_request(
            data.len() as u64,
            self.block_size,
            offset,
            iov_len_mut(bufs),
        )?;
        let mut pos = offset as usize;
        for b in bufs.iter_mut() {
            let n = b.len();
            b.copy_from_slice(&data[pos..pos + n]);
            pos += n;
        }
        Ok(())
    }

    fn write_vectored_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        _prio: IoPriority,
    ) -> Result<()> {
        let mut data = self.data.write();
        check_request(data.len() as u64, self.block_size, offset, iov_len(bufs))?;
        let mut pos = offset as usize;
        for b in bufs {
            data[pos..pos + b.len()].copy_from_slice(b);
            pos += b.len();
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        let mut data = self.data.write();
        check_request(data.len() as u64, self.block_size, offset, len)?;
        data[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }

    /// Runs each request at submit with the synchronous calls; completions
    /// come back in a seeded random order (see [`crate::queue`]).
    fn queue(&self, depth: u32) -> Result<Box<dyn crate::IoQueue + '_>> {
        let seed = self
            .queue_seed
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        Ok(Box::new(crate::queue::SyncQueue::new(
            crate::queue::Synchronous(self),
            depth,
            Some(seed),
        )?))
    }

    fn backend_name(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_roundtrip_and_bounds() {
        let d = MemDevice::new(8192, 512);
        d.write_at(&[7u8; 1024], 512, IoPriority::Urgent).unwrap();
        let mut b = [0u8; 2048];
        d.read_at(&mut b, 0).unwrap();
        assert!(b[..512].iter().all(|&x| x == 0));
        assert!(b[512..1536].iter().all(|&x| x == 7));
        assert!(d.write_at(&[0u8; 512], 8192, IoPriority::Urgent).is_err());
        assert!(d.write_at(&[0u8; 100], 0, IoPriority::Urgent).is_err());
        d.write_zeroes(512, 512).unwrap();
        d.read_at(&mut b, 0).unwrap();
        assert!(b[512..1024].iter().all(|&x| x == 0));
    }
}
