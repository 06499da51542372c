//! The journal's place on a device: `len_blocks` blocks starting at
//! `offset_bytes`. Block 0 holds the jbd2 superblock; the log occupies
//! blocks `first..len_blocks` as a circular buffer.

use std::io::IoSlice;
use std::sync::Arc;

use jbdev_device::{AlignedBuf, BlockDevice, FlushCoalescer, IoPriority};

use crate::format::JournalSuperblock;
use crate::{JournalError, Result};

/// A journal region on a block device.
pub struct JournalRegion {
    dev: Arc<dyn BlockDevice>,
    flusher: Arc<FlushCoalescer>,
    offset_bytes: u64,
    block_size: u32,
    len_blocks: u32,
}

impl JournalRegion {
    /// A region of `len_blocks` blocks of `block_size` at `offset_bytes` of
    /// `dev`. `flusher` is the coalescer shared by every user of `dev`.
    pub fn new(
        dev: Arc<dyn BlockDevice>,
        flusher: Arc<FlushCoalescer>,
        offset_bytes: u64,
        block_size: u32,
        len_blocks: u32,
    ) -> Result<Self> {
        let end = offset_bytes + u64::from(len_blocks) * u64::from(block_size);
        if end > dev.size_bytes() {
            return Err(JournalError::Inconsistent(format!(
                "journal region ends at byte {end} but the device has {} bytes",
                dev.size_bytes()
            )));
        }
        Ok(Self {
            dev,
            flusher,
            offset_bytes,
            block_size,
            len_blocks,
        })
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    pub fn len_blocks(&self) -> u32 {
        self.len_blocks
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    fn byte_offset(&self, pos: u32, count: u64) -> Result<u64> {
        if u64::from(pos) + count > u64::from(self.len_blocks) {
            return Err(JournalError::Inconsistent(format!(
                "journal access at block {pos} (+{count}) beyond the {}-block journal",
                self.len_blocks
            )));
        }
        Ok(self.offset_bytes + u64::from(pos) * u64::from(self.block_size))
    }

    /// Reads `buf.len() / block_size` consecutive blocks starting at `pos`.
    pub fn read_blocks(&self, pos: u32, buf: &mut [u8]) -> Result<()> {
        let off = self.byte_offset(pos, (buf.len() / self.block_size as usize) as u64)?;
        Ok(self.dev.read_at(buf, off)?)
    }

    /// Writes consecutive blocks starting at `pos` (no wrap-around).
    pub fn write_blocks(&self, pos: u32, bufs: &[IoSlice<'_>], prio: IoPriority) -> Result<()> {
        let bytes: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        let off = self.byte_offset(pos, bytes / u64::from(self.block_size))?;
        Ok(self.dev.write_vectored_at(bufs, off, prio)?)
    }

    /// Writes consecutive blocks starting at `pos` (no wrap-around) and
    /// returns once they are durable (force unit access).
    pub fn write_blocks_durable(
        &self,
        pos: u32,
        bufs: &[IoSlice<'_>],
        prio: IoPriority,
    ) -> Result<()> {
        let bytes: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        let off = self.byte_offset(pos, bytes / u64::from(self.block_size))?;
        Ok(self.dev.write_vectored_durable_at(bufs, off, prio)?)
    }

    /// Writes runs of consecutive blocks, `(position, blocks)` each (no
    /// wrap-around inside a run), as one device batch: all submitted at
    /// once, returning when all completed (durably with `durable`).
    pub fn write_runs(
        &self,
        runs: &[(u32, Vec<IoSlice<'_>>)],
        durable: bool,
        prio: IoPriority,
    ) -> Result<()> {
        let mut reqs = Vec::with_capacity(runs.len());
        for (pos, bufs) in runs {
            let bytes: u64 = bufs.iter().map(|b| b.len() as u64).sum();
            let offset = self.byte_offset(*pos, bytes / u64::from(self.block_size))?;
            reqs.push(jbdev_device::WriteReq {
                offset,
                bufs,
                durable,
            });
        }
        Ok(self.dev.write_batch(&reqs, prio)?)
    }

    /// Makes every completed journal write durable (shared with concurrent callers).
    /// The flush coalescer of the journal's device.
    pub fn flusher(&self) -> &Arc<FlushCoalescer> {
        &self.flusher
    }

    pub fn flush(&self) -> Result<()> {
        Ok(self.flusher.flush(self.dev.as_ref())?)
    }

    /// Reads and verifies the jbd2 superblock in block 0.
    pub fn read_superblock(&self) -> Result<JournalSuperblock> {
        let mut buf = AlignedBuf::zeroed(self.block_size as usize);
        self.read_blocks(0, &mut buf)?;
        JournalSuperblock::decode(&buf).map_err(JournalError::Superblock)
    }

    /// Writes the whole superblock block (used at format time).
    pub fn write_superblock_full(&self, sb: &JournalSuperblock) -> Result<()> {
        let mut buf = AlignedBuf::zeroed(self.block_size as usize);
        sb.encode(&mut buf);
        self.write_blocks(0, &[IoSlice::new(&buf)], IoPriority::Urgent)
    }

    /// Rewrites the dynamic part of the superblock (sequence, start, errno).
    ///
    /// IMPORTANT: only the first logical sector is written. Every field that
    /// changes after format and the checksum live in the first 512 bytes, so
    /// this write is a single sector and cannot be torn by a power cut; the
    /// rest of the 1024-byte superblock (s_users) never changes.
    pub fn update_superblock(&self, sb: &JournalSuperblock) -> Result<()> {
        let lbs = self.dev.logical_block_size() as usize;
        let mut buf = AlignedBuf::zeroed(self.block_size as usize);
        sb.encode(&mut buf);
        let n = lbs.clamp(512, self.block_size as usize);
        let off = self.byte_offset(0, 1)?;
        Ok(self.dev.write_at(&buf[..n], off, IoPriority::Urgent)?)
    }
}
