use jbdev_device::DeviceError;

/// Result of a volume operation.
pub type Result<T, E = VolumeError> = std::result::Result<T, E>;

/// An error of the volume layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VolumeError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The request reaches past the end of the volume.
    #[error(
        "request at offset {offset} length {len} reaches past the end of the {size}-byte volume"
    )]
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// A bad argument (size, alignment of a format parameter, option).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The path does not hold a jbdev volume.
    #[error("{0}")]
    NotAVolume(String),
    /// The volume superblock is damaged.
    #[error("bad volume superblock: {0}")]
    BadSuperblock(String),
    /// An intact volume superblock (its checksum holds) of a version or
    /// with incompat features this jbdev does not know: a newer jbdev's
    /// volume, not a damaged one.
    #[error("{0}: written by a newer jbdev; open it with that version (nothing was changed)")]
    NewerFormat(String),
    /// The file or device is shorter than the volume its (intact)
    /// superblock describes: a truncated image, or a smaller device.
    #[error("{0}")]
    Truncated(String),
    /// The journal is damaged in a way recovery cannot repair.
    #[error("corrupt journal: {0}")]
    CorruptJournal(String),
    /// A journal block recovery needs could not be read (an I/O error):
    /// not damage, the transactions from it on may replay once it reads.
    #[error("{0}")]
    UnreadableJournal(String),
    /// The journal found belongs to another volume (its uuid differs):
    /// the wrong `--journal`, or a recorded path that now names another
    /// volume's journal ([`crate::foreign_journal`] says which).
    #[error("{0}")]
    WrongJournal(String),
    /// A write or a transaction touches more blocks than one journal
    /// transaction can hold.
    #[error(
        "the request touches {blocks} blocks of {block_size} bytes, more than the {max_blocks} \
         one atomic transaction holds (writes of up to {max_bytes} bytes are atomic at any \
         alignment)"
    )]
    TooLarge {
        /// Distinct blocks the request (or the transaction so far) touches.
        blocks: u64,
        /// The most one transaction holds.
        max_blocks: u64,
        block_size: u64,
        /// [`crate::Volume::max_transaction_bytes`].
        max_bytes: u64,
    },
    /// A transaction's writes kept in memory until its commit would pass
    /// their limit: writes that partly overlap earlier ones of the same
    /// transaction are each kept whole (one that covers an earlier extent
    /// replaces it, and costs nothing more).
    #[error(
        "the transaction would keep {held} bytes until its commit (its writes' data, plus 64 \
         bytes for each write), more than the {max} it may: at most {max_extents} writes, \
         fewer the more data they carry; commit it, or use fewer, larger writes (a write that \
         covers earlier ones whole replaces them; writes that overlap earlier ones only in part \
         are each kept whole)"
    )]
    TransactionTooBig {
        /// Bytes of write data (and extents, 64 bytes each) it would hold.
        held: u64,
        /// The most it may hold: four times [`crate::Volume::max_transaction_bytes`].
        max: u64,
        /// The most extents one transaction keeps.
        max_extents: u64,
    },
    /// Reading the home content of a partial first or last block of an
    /// unaligned write (or transaction extent) failed. Nothing of the
    /// request was applied, and the volume is not aborted: a later write
    /// may succeed.
    #[error(
        "reading the home block at byte {offset} to fill in the partial first or last block \
         of {request} failed: {error}; nothing of it was applied, and the volume is still usable"
    )]
    EdgeRead {
        /// The block's byte offset in the volume.
        offset: u64,
        /// What needed it: "an unaligned write or zeroing", "a transaction's
        /// unaligned extent".
        request: &'static str,
        /// The device's error.
        error: DeviceError,
    },
    /// The volume was opened read-only.
    #[error("the volume is open read-only")]
    ReadOnly,
    /// An earlier write or flush failed (or an engine thread hit a bug);
    /// the volume refuses writes until reopened.
    #[error(
        "the journal was aborted ({reason}): every write fails until the volume is closed and \
         opened again, which replays what the journal holds"
    )]
    Aborted {
        /// What failed, with the device's error.
        reason: String,
        /// The errno of that failure (`EIO` if it had none): `ENOSPC` or
        /// `EDQUOT` say the backing store is full, which [`VolumeError::errno`]
        /// passes on so a client can tell "free space and retry" from a
        /// broken device.
        cause_errno: i32,
    },
    /// The external journal file was deleted, or truncated below the
    /// journal's end, while the volume was open (the journal watch saw it):
    /// as after [`VolumeError::Aborted`] every later write fails, but a
    /// reopen cannot simply replay the journal. The message says what
    /// happened, what is lost and what the operator can do.
    #[error("{0}")]
    JournalFileLost(String),
    /// The backing store is full (`ENOSPC` or `EDQUOT` on a home write):
    /// the checkpoint cannot take journaled blocks home, and the journal
    /// has no room left for this write. Nothing acknowledged is lost and
    /// the volume stays open: once space is freed on the store, the
    /// checkpoint resumes (it retries by itself) and the same write
    /// succeeds. Also the error of a direct write into unallocated space
    /// (ARCHITECTURE, failure semantics), and of a close that could not
    /// take everything home (`closing`: the volume is closed then, its
    /// journal kept for the next open).
    #[error(
        "the backing store is full ({reason}); {}",
        if *closing {
            "the volume is closed with its journal intact: free space on the store, then open \
             it again (restart `jbdev serve`): nothing acknowledged is lost"
        } else {
            "free space on it and retry: nothing acknowledged is lost and the volume stays open"
        }
    )]
    StoreFull {
        /// The home write that failed, with the device's error.
        reason: String,
        /// True for the error of a close.
        closing: bool,
        /// `ENOSPC` or `EDQUOT` ([`VolumeError::errno`] says `ENOSPC` for
        /// both, as for [`VolumeError::Aborted`]).
        cause_errno: i32,
    },
    /// The volume is closed (or closing).
    #[error("the volume is closed")]
    Closed,
    /// A bug: an engine thread panicked. The volume aborts (fail-stop).
    #[error("internal error (a bug in jbdev): {0}")]
    Internal(String),
}

impl VolumeError {
    /// The closest POSIX errno (positive), for the C ABI and the NBD server.
    pub fn errno(&self) -> i32 {
        match self {
            Self::Device(e) | Self::EdgeRead { error: e, .. } => e.errno(),
            Self::OutOfRange { .. } => libc::ENOSPC,
            Self::InvalidArgument(_) => libc::EINVAL,
            Self::NotAVolume(_)
            | Self::BadSuperblock(_)
            | Self::Truncated(_)
            | Self::CorruptJournal(_) => libc::EUCLEAN,
            Self::WrongJournal(_) => libc::EINVAL,
            Self::NewerFormat(_) => libc::EOPNOTSUPP,
            Self::TooLarge { .. } | Self::TransactionTooBig { .. } => libc::EFBIG,
            Self::ReadOnly => libc::EROFS,
            Self::Aborted { cause_errno, .. } if is_no_space(*cause_errno) => libc::ENOSPC,
            Self::StoreFull { .. } => libc::ENOSPC,
            Self::Aborted { .. }
            | Self::JournalFileLost(_)
            | Self::UnreadableJournal(_)
            | Self::Internal(_) => libc::EIO,
            Self::Closed => libc::EBADF,
        }
    }
}

/// Whether an errno says the backing store is out of space (or over quota).
pub fn is_no_space(errno: i32) -> bool {
    errno == libc::ENOSPC || errno == libc::EDQUOT
}

/// Whether an errno says the store cannot be opened for writing here (a
/// read-only file system or mount, no write permission).
pub fn is_not_writable(errno: i32) -> bool {
    errno == libc::EROFS || errno == libc::EACCES || errno == libc::EPERM
}

impl From<jbdev_journal::JournalError> for VolumeError {
    fn from(e: jbdev_journal::JournalError) -> Self {
        match e {
            jbdev_journal::JournalError::Device(d) => Self::Device(d),
            // The checksum held: a newer jbdev's journal, not damage.
            e @ jbdev_journal::JournalError::Superblock(
                jbdev_journal::format::FormatError::NewerFeatures(_),
            ) => Self::NewerFormat(e.to_string()),
            other => Self::CorruptJournal(other.to_string()),
        }
    }
}
