//! Portable backend: `preadv`/`pwritev`/`fdatasync` on a file descriptor.

use std::fs::{File, OpenOptions as FsOpenOptions};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::{
    check_request, iov_len, iov_len_mut, AlignedBuf, BlockDevice, DeviceError, IoPriority,
    OpenOptions, Result,
};

/// An open file or block device with its geometry.
pub struct DeviceFile {
    pub file: File,
    pub path: PathBuf,
    pub size_bytes: u64,
    pub logical_block_size: u32,
    pub is_block_device: bool,
    pub direct: bool,
}

impl DeviceFile {
    pub(crate) fn what(&self) -> String {
        self.path.display().to_string()
    }
}

/// Opens a regular file or block device according to `opts`.
pub fn open_file(path: &Path, opts: &OpenOptions) -> Result<DeviceFile> {
    let what = path.display().to_string();
    let meta = std::fs::metadata(path);
    let exists = meta.is_ok();
    let is_block_device = meta
        .as_ref()
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false);
    if let Ok(m) = &meta {
        if !m.file_type().is_block_device() && !m.is_file() {
            return Err(DeviceError::Invalid(format!(
                "{what} is neither a regular file nor a block device"
            )));
        }
    } else if opts.create_size.is_none() {
        return Err(DeviceError::io("open", what, meta.unwrap_err()));
    }
    let open = |direct: bool| {
        let mut o = FsOpenOptions::new();
        o.read(true).write(!opts.read_only);
        if !exists && !opts.read_only {
            o.create(true);
        }
        let mut flags = 0;
        if direct {
            flags |= libc::O_DIRECT;
        }
        if is_block_device && opts.exclusive {
            flags |= libc::O_EXCL;
        }
        o.custom_flags(flags);
        o.open(path)
    };
    let (file, direct) = match open(opts.direct) {
        Ok(f) => (f, opts.direct),
        Err(e) if opts.direct && e.raw_os_error() == Some(libc::EINVAL) => {
            tracing::warn!("{what}: the filesystem refuses O_DIRECT; using buffered I/O");
            (
                open(false).map_err(|e| DeviceError::io("open", what.clone(), e))?,
                false,
            )
        }
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Err(DeviceError::Busy(what)),
        Err(e) => return Err(DeviceError::io("open", what, e)),
    };
    if opts.exclusive && !is_block_device {
        let op = if opts.read_only {
            libc::LOCK_SH
        } else {
            libc::LOCK_EX
        };
        // SAFETY: flock on a valid, owned descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } != 0 {
            return Err(DeviceError::Busy(what));
        }
    }
    let (mut size_bytes, logical_block_size) = if is_block_device {
        (
            blkdev_size(&file, &what)?,
            blkdev_logical_block_size(&file, &what)?,
        )
    } else {
        let len = file
            .metadata()
            .map_err(|e| DeviceError::io("stat", what.clone(), e))?
            .len();
        (len, 512)
    };
    if let Some(want) = opts.create_size {
        if !is_block_device && size_bytes < want {
            file.set_len(want)
                .map_err(|e| DeviceError::io("truncate", what.clone(), e))?;
            size_bytes = want;
        }
    }
    let size_bytes = size_bytes - size_bytes % u64::from(logical_block_size);
    Ok(DeviceFile {
        file,
        path: path.to_path_buf(),
        size_bytes,
        logical_block_size,
        is_block_device,
        direct,
    })
}

fn blkdev_size(file: &File, what: &str) -> Result<u64> {
    let mut size: u64 = 0;
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    // SAFETY: the ioctl writes one u64 through a valid pointer.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) };
    if r != 0 {
        return Err(DeviceError::io(
            "ioctl(BLKGETSIZE64)",
            what,
            io::Error::last_os_error(),
        ));
    }
    Ok(size)
}

fn blkdev_logical_block_size(file: &File, what: &str) -> Result<u32> {
    let mut lbs: libc::c_int = 0;
    // BLKSSZGET = _IO(0x12, 104)
    const BLKSSZGET: libc::c_ulong = 0x1268;
    // SAFETY: the ioctl writes one int through a valid pointer.
    let r = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            BLKSSZGET as _,
            &mut lbs as *mut libc::c_int,
        )
    };
    if r != 0 || lbs <= 0 {
        return Err(DeviceError::io(
            "ioctl(BLKSSZGET)",
            what,
            io::Error::last_os_error(),
        ));
    }
    Ok(lbs as u32)
}

/// Zeroes a range of a file or block device (hole punch / BLKZEROOUT).
pub(crate) fn zero_range(f: &DeviceFile, offset: u64, len: u64) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let fd = f.file.as_raw_fd();
    if f.is_block_device {
        // BLKZEROOUT = _IO(0x12, 127)
        const BLKZEROOUT: libc::c_ulong = 0x127f;
        let range: [u64; 2] = [offset, len];
        // SAFETY: the ioctl reads two u64 through a valid pointer.
        let r = unsafe { libc::ioctl(fd, BLKZEROOUT as _, range.as_ptr()) };
        if r != 0 {
            return Err(DeviceError::io(
                "ioctl(BLKZEROOUT)",
                f.what(),
                io::Error::last_os_error(),
            ));
        }
        return Ok(());
    }
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on a valid descriptor with plain integer arguments.
    let r = unsafe { libc::fallocate(fd, mode, offset as libc::off_t, len as libc::off_t) };
    if r == 0 {
        return Ok(());
    }
    // The filesystem cannot punch holes: write zeroes.
    let chunk = AlignedBuf::zeroed(1 << 20);
    let mut pos = offset;
    while pos < offset + len {
        let n = (offset + len - pos).min(chunk.len() as u64) as usize;
        pwrite_all(f, &[IoSlice::new(&chunk[..n])], pos)?;
        pos += n as u64;
    }
    Ok(())
}

/// Allocation map from SEEK_DATA / SEEK_HOLE (regular files only).
pub(crate) fn allocation(f: &DeviceFile, offset: u64, len: u64) -> Result<Vec<crate::Extent>> {
    use crate::Extent;
    if f.is_block_device || len == 0 {
        return Ok(vec![Extent {
            offset,
            len,
            allocated: true,
        }]);
    }
    let fd = f.file.as_raw_fd();
    let end = offset + len;
    let mut out = Vec::new();
    let mut pos = offset;
    while pos < end {
        // SAFETY: lseek on a valid descriptor.
        let data = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
        let data = if data < 0 {
            end
        } else {
            (data as u64).min(end)
        };
        if data > pos {
            out.push(Extent {
                offset: pos,
                len: data - pos,
                allocated: false,
            });
            pos = data;
            continue;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_HOLE) };
        let hole = if hole < 0 {
            end
        } else {
            (hole as u64).min(end)
        };
        let hole = hole.max(pos + 1);
        out.push(Extent {
            offset: pos,
            len: hole - pos,
            allocated: true,
        });
        pos = hole;
    }
    Ok(out)
}

/// Writes all of `bufs` at `offset`, looping over short writes.
pub(crate) fn pwrite_all(f: &DeviceFile, bufs: &[IoSlice<'_>], offset: u64) -> Result<()> {
    // Flatten into one aligned buffer if any slice is unaligned for O_DIRECT.
    let lbs = f.logical_block_size as usize;
    let needs_bounce = f.direct
        && bufs
            .iter()
            .any(|b| !AlignedBuf::is_aligned(b.as_ptr(), lbs) || b.len() % lbs != 0);
    if needs_bounce {
        let mut bounce = AlignedBuf::zeroed(iov_len(bufs) as usize);
        let mut pos = 0;
        for b in bufs {
            bounce[pos..pos + b.len()].copy_from_slice(b);
            pos += b.len();
        }
        return write_one(f, &bounce, offset);
    }
    let mut pos = offset;
    for b in bufs {
        write_one(f, b, pos)?;
        pos += b.len() as u64;
    }
    Ok(())
}

fn write_one(f: &DeviceFile, mut buf: &[u8], mut offset: u64) -> Result<()> {
    use std::os::unix::fs::FileExt;
    while !buf.is_empty() {
        match f.file.write_at(buf, offset) {
            Ok(0) => {
                return Err(DeviceError::io(
                    "pwrite",
                    f.what(),
                    io::ErrorKind::WriteZero.into(),
                ))
            }
            Ok(n) => {
                buf = &buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(DeviceError::io("pwrite", f.what(), e)),
        }
    }
    Ok(())
}

fn read_one(f: &DeviceFile, mut buf: &mut [u8], mut offset: u64) -> Result<()> {
    use std::os::unix::fs::FileExt;
    while !buf.is_empty() {
        match f.file.read_at(buf, offset) {
            Ok(0) => {
                return Err(DeviceError::io(
                    "pread",
                    f.what(),
                    io::ErrorKind::UnexpectedEof.into(),
                ))
            }
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(DeviceError::io("pread", f.what(), e)),
        }
    }
    Ok(())
}

/// Reads all of `bufs` at `offset`, bouncing through an aligned buffer if needed.
pub(crate) fn pread_all(f: &DeviceFile, bufs: &mut [IoSliceMut<'_>], offset: u64) -> Result<()> {
    let lbs = f.logical_block_size as usize;
    let needs_bounce = f.direct
        && bufs
            .iter()
            .any(|b| !AlignedBuf::is_aligned(b.as_ptr(), lbs) || b.len() % lbs != 0);
    if needs_bounce {
        let mut bounce = AlignedBuf::zeroed(iov_len_mut(bufs) as usize);
        read_one(f, &mut bounce, offset)?;
        let mut pos = 0;
        for b in bufs.iter_mut() {
            let n = b.len();
            b.copy_from_slice(&bounce[pos..pos + n]);
            pos += n;
        }
        return Ok(());
    }
    let mut pos = offset;
    for b in bufs.iter_mut() {
        read_one(f, b, pos)?;
        pos += b.len() as u64;
    }
    Ok(())
}

/// The portable backend.
pub struct PreadDevice {
    f: DeviceFile,
}

impl PreadDevice {
    pub fn new(f: DeviceFile) -> Self {
        Self { f }
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
        check_request(self.f.size_bytes, self.f.logical_block_size, offset, len)?;
        zero_range(&self.f, offset, len)
    }
    fn allocation(&self, offset: u64, len: u64) -> Result<Vec<crate::Extent>> {
        allocation(&self.f, offset, len)
    }
    fn backend_name(&self) -> &'static str {
        "pread"
    }
}
