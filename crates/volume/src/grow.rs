//! Growing a closed volume's data region (`jbdev grow`).
//!
//! The data region is the last thing on the home device (FORMAT.md: the
//! superblock, an internal journal, then the data), and nothing but the
//! volume superblock's `size_bytes` records its length: block numbers in
//! the journal are data-region block numbers below the old size, which
//! stay valid. So growing is two steps. The storage grows first (a file is
//! extended, an RBD image resized; a block device must already be large
//! enough), and that is made durable. Then the superblock is rewritten with
//! the new size and flushed: one sector, written whole, the step that
//! commits the change. A crash before it leaves the old size on storage
//! that merely has room after the volume; a crash after it, the new size.
//! The journal is not touched: whatever it holds is replayed by the next
//! open, as it would have been. The device's exclusive lock is held
//! throughout, so no open volume's superblock write can race this one.

use std::path::Path;

use jbdev_device::{is_rbd_target, open_device, AlignedBuf, BlockDevice, IoPriority};

use crate::superblock::VolumeSuperblock;
use crate::volume::read_volume_superblock;
use crate::{OpenOptions, Result, Volume, VolumeError};

/// What [`grow`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grown {
    /// The data region's size before, in bytes.
    pub old_size: u64,
    /// Its size now (equal to `old_size`: nothing was to be done).
    pub new_size: u64,
    /// The file or RBD image was extended to this many bytes first.
    pub extended_to: Option<u64>,
    /// The added range was allocated (`preallocate`).
    pub allocated: bool,
}

/// Grows the data region of the closed volume at `path` to `size` bytes
/// (a multiple of its block size), or, with `None`, to all of its block
/// device or RBD image. A file (and an RBD image) is extended as needed;
/// with `preallocate` a file's added range is allocated as `format
/// --preallocate` would. Shrinking is refused: it would drop data. The
/// volume must not be open anywhere (its lock is taken, as an open does;
/// `opts.break_lock` breaks a dead RBD holder's).
pub fn grow(
    path: &Path,
    size: Option<u64>,
    preallocate: bool,
    opts: &OpenOptions,
) -> Result<Grown> {
    opts.validate()?;
    let what = path.display().to_string();
    if opts.read_only {
        return Err(VolumeError::InvalidArgument(format!(
            "{what}: growing a volume writes its superblock; it cannot be done read-only"
        )));
    }
    let rbd = is_rbd_target(path);
    if preallocate && rbd {
        return Err(VolumeError::InvalidArgument(format!(
            "{what}: preallocation is for image files; an RBD image allocates its objects as \
             they are written"
        )));
    }
    if opts.break_lock {
        Volume::check_openable(path, opts)?;
    }
    let dopts = jbdev_device::OpenOptions {
        backend: opts.backend,
        direct: opts.direct_io,
        break_lock: opts.break_lock,
        ..Default::default()
    };
    let opened = open_device(path, &dopts)?;
    let sb = read_volume_superblock(opened.device.as_ref(), &what)?;
    // A writer that ignored them could break what they mean (FORMAT.md).
    crate::volume::refuse_unknown_ro_compat(&sb, false)?;
    let bs = u64::from(sb.block_size);
    let have = opened.device.size_bytes();
    let opened_is_block_device = opened.is_block_device;
    let new_size = match size {
        Some(s) if s % bs != 0 => {
            return Err(VolumeError::InvalidArgument(format!(
                "{what}: the size must be a multiple of the volume's {bs}-byte block size (got \
                 {s})"
            )))
        }
        Some(s) => s,
        None if opened.is_block_device || rbd => {
            have.saturating_sub(sb.data_offset_bytes) / bs * bs
        }
        None => {
            return Err(VolumeError::InvalidArgument(format!(
                "{what} is an image file: give the size the volume should have (--size); it \
                 is {} bytes now",
                sb.size_bytes
            )))
        }
    };
    if new_size < sb.size_bytes {
        return Err(VolumeError::InvalidArgument(format!(
            "{what}: the volume is {} bytes, and {new_size} would be smaller; jbdev does not \
             shrink volumes (what is stored past the new end would be lost)",
            sb.size_bytes
        )));
    }
    if new_size == sb.size_bytes {
        return Ok(Grown {
            old_size: sb.size_bytes,
            new_size,
            extended_to: None,
            allocated: false,
        });
    }
    // A file's offsets are signed 64-bit (off_t), as format checks.
    let total = sb
        .data_offset_bytes
        .checked_add(new_size)
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| {
            VolumeError::InvalidArgument(format!(
                "{what}: {new_size} bytes is too large: superblock, journal and data must fit \
                 in {} bytes",
                i64::MAX
            ))
        })?;
    let (dev, extended_to) = if total > have {
        if opened.is_block_device {
            return Err(VolumeError::InvalidArgument(format!(
                "{what} holds {have} bytes, and a volume of {new_size} bytes needs {total} \
                 (its superblock and journal come first): grow the device first (the most \
                 this device takes is {} bytes)",
                have.saturating_sub(sb.data_offset_bytes) / bs * bs
            )));
        }
        // The device layer grows a file or an RBD image to `create_size`
        // as it opens it (under the lock), so open it again that way.
        drop(opened);
        let grown = open_device(
            path,
            &jbdev_device::OpenOptions {
                create_size: Some(total),
                ..dopts
            },
        )
        .map_err(|e| {
            // librbd answers EINVAL for a size past what an image can be
            // (session 27's pass: "rbd_resize failed ... Invalid argument",
            // exit 1, where a file says "too large", exit 64).
            if rbd && e.errno() == libc::EINVAL {
                VolumeError::InvalidArgument(format!(
                    "{what}: the cluster refused to resize the image to {total} bytes ({e}): \
                     larger than an RBD image can be? Nothing was changed"
                ))
            } else {
                e.into()
            }
        })?;
        (grown.device, Some(total))
    } else {
        (opened.device, None)
    };
    // A file or RBD image may reach past the volume already (a `format
    // --force` of a smaller volume over a larger one): what it holds there
    // is zeroed, as the added range reads on fresh storage (session 26's
    // pass read 12,288 blocks of old bytes back). A block device's added
    // range holds what the device held, as documented.
    let stale_to = if opened_is_block_device { 0 } else { have };
    grow_on(dev.as_ref(), &what, &sb, new_size, preallocate, stale_to)?;
    Ok(Grown {
        old_size: sb.size_bytes,
        new_size,
        extended_to,
        allocated: preallocate,
    })
}

/// The steps of [`grow`] on a device already large enough: checks that the
/// superblock is still `before`'s volume (a second open came between the
/// two of [`grow`]), zeroes what the storage held in the added range below
/// `stale_to` (its length before it was grown; 0: keep it, as on a block
/// device), allocates the added range if asked, makes the storage durable,
/// then writes and flushes the superblock with `new_size`.
pub fn grow_on(
    dev: &dyn BlockDevice,
    what: &str,
    before: &VolumeSuperblock,
    new_size: u64,
    preallocate: bool,
    stale_to: u64,
) -> Result<()> {
    // Read again to see nothing changed; the first read warned already.
    let (mut sb, _) = crate::volume::read_volume_superblock_copy(dev, what)?;
    if sb.uuid != before.uuid
        || sb.data_offset_bytes != before.data_offset_bytes
        || sb.block_size != before.block_size
        || sb.size_bytes > new_size
    {
        return Err(VolumeError::Device(jbdev_device::DeviceError::Busy(
            format!(
                "{what} changed while it was being grown (another program wrote its superblock): \
             nothing was changed; run grow again"
            ),
        )));
    }
    let end = sb.data_offset_bytes + new_size;
    if dev.size_bytes() < end {
        return Err(VolumeError::InvalidArgument(format!(
            "{what} holds {} bytes after growing it; the volume needs {end}",
            dev.size_bytes()
        )));
    }
    let from = sb.data_offset_bytes + sb.size_bytes;
    let stale_end = stale_to.min(end);
    if stale_end > from {
        dev.write_zeroes(from, stale_end - from)?;
    }
    if preallocate {
        dev.allocate(from, end - from)?;
    }
    // IMPORTANT: the storage's new length (a file's size is metadata) is
    // durable before the superblock says the volume reaches into it; an
    // open of a volume longer than its storage is refused.
    dev.flush()?;
    sb.size_bytes = new_size;
    let mut buf = AlignedBuf::zeroed(sb.block_size as usize);
    sb.encode_block(&mut buf);
    dev.write_at(&buf, 0, IoPriority::Urgent)?;
    dev.flush()?;
    Ok(())
}
