//! TEMPORARY naive implementation of the public API (direct device I/O, no
//! journal) so that the front ends can be built against the final
//! signatures. Replaced by the journaled engine.

use std::path::Path;
use std::sync::Arc;

use jbdev_device::{open_device, AlignedBuf, BlockDevice, IoPriority};
use parking_lot::Mutex;

use crate::{FormatOptions, OpenOptions, Result, VolumeError};

/// Flags of a write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteFlags {
    /// Force unit access: the call returns only once the data is durable.
    pub fua: bool,
}

impl WriteFlags {
    pub const NONE: Self = Self { fua: false };
    pub const FUA: Self = Self { fua: true };
}

/// What a range of the volume holds (for NBD block status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtentState {
    /// Allocated; may hold data.
    Data,
    /// Never written or zeroed/trimmed: reads as zeroes.
    Zero,
}

/// A run of the volume in one state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    pub state: ExtentState,
}

/// Operator metrics.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Stats {
    pub commits: u64,
    pub commits_per_sec: f64,
    pub blocks_journaled: u64,
    pub mean_transaction_blocks: f64,
    pub commit_latency_us_p50: u64,
    pub commit_latency_us_p99: u64,
    pub commit_latency_us_max: u64,
    pub journal_fill_ratio: f64,
    pub checkpoint_lag_blocks: u64,
    pub checkpoints: u64,
    pub device_flushes: u64,
    pub direct_writes: u64,
}

struct Inner {
    dev: Arc<dyn BlockDevice>,
    size: u64,
    block_size: u32,
    lock: Mutex<()>,
    read_only: bool,
}

/// A journaled volume. Cheap to share: `Volume` is `Send + Sync`; wrap it in
/// an `Arc` to use it from many threads.
pub struct Volume {
    inner: Arc<Inner>,
}

const DATA_OFFSET: u64 = 4096;

impl Volume {
    /// Formats `path` (creating the file if needed) and opens it.
    pub fn create(path: &Path, fopts: &FormatOptions, oopts: &OpenOptions) -> Result<Volume> {
        let dopts = jbdev_device::OpenOptions {
            backend: oopts.backend,
            direct: oopts.direct_io,
            create_size: Some(fopts.size_bytes + DATA_OFFSET),
            ..Default::default()
        };
        let dev = open_device(path, &dopts)?.device;
        Ok(Volume {
            inner: Arc::new(Inner {
                dev,
                size: fopts.size_bytes,
                block_size: fopts.block_size,
                lock: Mutex::new(()),
                read_only: false,
            }),
        })
    }

    /// Opens an existing volume, running journal recovery if needed.
    pub fn open(path: &Path, opts: &OpenOptions) -> Result<Volume> {
        let dopts = jbdev_device::OpenOptions {
            backend: opts.backend,
            direct: opts.direct_io,
            read_only: opts.read_only,
            ..Default::default()
        };
        let dev = open_device(path, &dopts)?.device;
        let size = dev.size_bytes() - DATA_OFFSET;
        Ok(Volume {
            inner: Arc::new(Inner {
                dev,
                size,
                block_size: 4096,
                lock: Mutex::new(()),
                read_only: opts.read_only,
            }),
        })
    }

    /// Formats a volume on already-open devices (`journal` is the external
    /// journal device, if any). Used by tests with in-memory devices.
    pub fn format_device(
        dev: Arc<dyn BlockDevice>,
        journal: Option<Arc<dyn BlockDevice>>,
        fopts: &FormatOptions,
    ) -> Result<()> {
        let _ = (dev, journal, fopts);
        Ok(())
    }

    /// Opens a volume on already-open devices, running recovery if needed.
    pub fn open_device(
        dev: Arc<dyn BlockDevice>,
        journal: Option<Arc<dyn BlockDevice>>,
        opts: &OpenOptions,
    ) -> Result<Volume> {
        let _ = journal;
        let size = dev.size_bytes() - DATA_OFFSET;
        Ok(Volume {
            inner: Arc::new(Inner { dev, size, block_size: 4096, lock: Mutex::new(()), read_only: opts.read_only }),
        })
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.inner.size
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.inner.block_size
    }

    /// Largest write or transaction that is atomic across a crash.
    pub fn max_transaction_bytes(&self) -> u64 {
        16 << 20
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.inner.size => Ok(()),
            _ => Err(VolumeError::OutOfRange {
                offset,
                len,
                size: self.inner.size,
            }),
        }
    }

    /// Reads `buf.len()` bytes at `offset` (any alignment).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        let lbs = self.inner.dev.logical_block_size() as u64;
        let start = offset / lbs * lbs;
        let end = (offset + buf.len() as u64).div_ceil(lbs) * lbs;
        let mut tmp = AlignedBuf::zeroed((end - start) as usize);
        self.inner.dev.read_at(&mut tmp, DATA_OFFSET + start)?;
        let s = (offset - start) as usize;
        buf.copy_from_slice(&tmp[s..s + buf.len()]);
        Ok(())
    }

    /// Writes `buf` at `offset` (any alignment).
    pub fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        if self.inner.read_only {
            return Err(VolumeError::ReadOnly);
        }
        self.check(offset, buf.len() as u64)?;
        let _g = self.inner.lock.lock();
        let lbs = self.inner.dev.logical_block_size() as u64;
        let start = offset / lbs * lbs;
        let end = (offset + buf.len() as u64).div_ceil(lbs) * lbs;
        let mut tmp = AlignedBuf::zeroed((end - start) as usize);
        self.inner.dev.read_at(&mut tmp, DATA_OFFSET + start)?;
        let s = (offset - start) as usize;
        tmp[s..s + buf.len()].copy_from_slice(buf);
        self.inner
            .dev
            .write_at(&tmp, DATA_OFFSET + start, IoPriority::Urgent)?;
        if flags.fua {
            self.inner.dev.flush()?;
        }
        Ok(())
    }

    /// Makes every write that returned before this call durable.
    pub fn flush(&self) -> Result<()> {
        Ok(self.inner.dev.flush()?)
    }

    /// Deallocates a range; it reads back as zeroes.
    pub fn trim(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.write_zeroes(offset, len, flags)
    }

    /// Zeroes a range.
    pub fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.check(offset, len)?;
        let zeros = vec![0u8; len as usize];
        self.write_at(&zeros, offset, flags)
    }

    /// Starts an atomic multi-extent transaction.
    pub fn transaction(&self) -> Transaction<'_> {
        Transaction {
            vol: self,
            ops: Vec::new(),
        }
    }

    /// Which parts of a range hold data and which read as zeroes.
    pub fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.check(offset, len)?;
        Ok(vec![Extent {
            offset,
            len,
            state: ExtentState::Data,
        }])
    }

    /// Current metrics.
    pub fn stats(&self) -> Stats {
        Stats::default()
    }

    /// Flushes, checkpoints and marks the journal clean.
    pub fn close(self) -> Result<()> {
        self.flush()
    }
}

enum TxOp {
    Write(u64, Vec<u8>),
    Zero(u64, u64),
}

/// A group of writes applied all-or-nothing. Build it with [`Transaction::write`]
/// and [`Transaction::write_zeroes`], then [`Transaction::commit`].
pub struct Transaction<'v> {
    vol: &'v Volume,
    ops: Vec<TxOp>,
}

impl Transaction<'_> {
    /// Adds a write of `data` at `offset`.
    pub fn write(&mut self, data: &[u8], offset: u64) -> Result<&mut Self> {
        self.vol.check(offset, data.len() as u64)?;
        self.ops.push(TxOp::Write(offset, data.to_vec()));
        Ok(self)
    }

    /// Adds a zeroing of `[offset, offset+len)`.
    pub fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<&mut Self> {
        self.vol.check(offset, len)?;
        self.ops.push(TxOp::Zero(offset, len));
        Ok(self)
    }

    /// Applies every extent atomically; with `flags.fua`, durably.
    pub fn commit(self, flags: WriteFlags) -> Result<()> {
        for op in &self.ops {
            match op {
                TxOp::Write(off, d) => self.vol.write_at(d, *off, WriteFlags::NONE)?,
                TxOp::Zero(off, len) => self.vol.write_zeroes(*off, *len, WriteFlags::NONE)?,
            }
        }
        if flags.fua {
            self.vol.flush()?;
        }
        Ok(())
    }
}
