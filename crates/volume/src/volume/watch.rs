//! The watch over a read-write volume's files: an external journal file or
//! a home file deleted or truncated while open aborts the volume (nothing
//! is acknowledged after it) and says what to do.

use super::*;

/// The external journal file a read-write volume watches, and the sender
/// whose drop stops the watch thread (never sent on: dropping it is the
/// signal).
pub(crate) struct JournalWatch {
    pub(crate) _stop: std::sync::mpsc::Sender<()>,
    pub(crate) watched: Option<Arc<WatchedJournal>>,
    pub(crate) home: Option<Arc<WatchedHome>>,
}

/// A read-write volume's home file, watched like its external journal
/// file. Deleted while open, it took every write with it at the close
/// while each was still acknowledged (with an internal journal, the
/// journal too); truncated, the data past the cut was gone at once and
/// writes there only grew a sparse file (session 22's adversarial pass).
/// Either way the volume now aborts: nothing is acknowledged after it.
pub(crate) struct WatchedHome {
    /// A descriptor of the file (`O_PATH`, from `open_device`).
    pub(crate) file: std::fs::File,
    pub(crate) path: PathBuf,
    /// The byte where the volume's data ends.
    pub(crate) end: u64,
}

impl WatchedHome {
    /// The watch over the home at `path`: through `file`, the descriptor
    /// `open_device` gives a regular file, or one of its own for a block
    /// device ([`block_device_watch`]); None for anything else (RBD).
    pub(crate) fn of(
        file: Option<std::fs::File>,
        path: &Path,
        sb: &VolumeSuperblock,
    ) -> Option<Self> {
        Some(WatchedHome {
            file: file.or_else(|| block_device_watch(path))?,
            path: path.to_path_buf(),
            end: sb.data_offset_bytes + sb.size_bytes,
        })
    }

    pub(crate) fn problem(&self) -> Option<JournalFileProblem> {
        file_problem(&self.file, &self.path, self.end)
    }

    /// The abort's message if the device shrank (`Engine::shrunk`).
    pub(crate) fn shrunk_message(&self) -> Option<String> {
        let p = self.problem().filter(JournalFileProblem::is_shrunk)?;
        Some(self.abort_message(&p))
    }

    /// The abort's message: what happened and what the operator can do.
    pub(crate) fn abort_message(&self, p: &JournalFileProblem) -> String {
        use std::os::unix::io::AsRawFd;
        let h = self.path.display();
        match p {
            JournalFileProblem::Deleted => {
                let (pid, fd) = (std::process::id(), self.file.as_raw_fd());
                format!(
                    "the volume file {h} was deleted while the volume was open: writes are \
                     refused from now on, and its content (every acknowledged write) is gone \
                     when the volume closes. Before that, this process (pid {pid}) still holds \
                     it: `cp /proc/{pid}/fd/{fd} {h}` saves it as it is now, and the next open \
                     of that copy replays its journal"
                )
            }
            JournalFileProblem::Truncated { len } => format!(
                "the volume file {h} was truncated while the volume was open: it holds {len} \
                 bytes, below the volume's end at byte {}: writes are refused from now on, and \
                 the data past the cut is gone. To open what is left: `truncate -s {} {h}`, \
                 then `jbdev check {h}`",
                self.end, self.end
            ),
            JournalFileProblem::Shrunk { len } => format!(
                "the device {h} shrank while the volume was open: it holds {len} bytes, below \
                 the volume's end at byte {}: writes are refused from now on (committed writes \
                 stay in the journal, which the next open replays), and whatever the device \
                 kept past its new end is out of reach. Grow it back to at least {} bytes (a \
                 loop device: enlarge its file, then `losetup -c {h}`), then open the volume \
                 again (`jbdev check {h}` first)",
                self.end, self.end
            ),
        }
    }
}

/// [`JournalFileProblem`] of a watched file whose content must reach byte
/// `end`, from one `fstat` of its descriptor (and, for a block device, its
/// size in sysfs); `None` while nothing is wrong (or the `fstat` failed:
/// logged).
fn file_problem(file: &std::fs::File, path: &Path, end: u64) -> Option<JournalFileProblem> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let md = match file.metadata() {
        Ok(md) => md,
        Err(e) => {
            tracing::warn!("cannot fstat {}: {e}", path.display());
            return None;
        }
    };
    if md.file_type().is_block_device() {
        // A device node removed from /dev is no loss: the device stays.
        // Shrunk (a loop device's file cut and `losetup -c`, a reduced
        // volume), writes past its end failed with ENOSPC and were
        // reported as a full store: "free space" (session 33's pass).
        let len = block_device_bytes(md.rdev())?;
        return (len < end).then_some(JournalFileProblem::Shrunk { len });
    }
    if md.nlink() == 0 {
        Some(JournalFileProblem::Deleted)
    } else if md.len() < end {
        Some(JournalFileProblem::Truncated { len: md.len() })
    } else {
        None
    }
}

/// A descriptor (`O_PATH`) to watch the block device at `path` by
/// ([`file_problem`]); None for anything else (files come with theirs from
/// `open_device`) or if it cannot be opened (then unwatched, as before).
fn block_device_watch(path: &Path) -> Option<std::fs::File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    f.metadata()
        .ok()?
        .file_type()
        .is_block_device()
        .then_some(f)
}

/// The size in bytes of the block device `rdev`, from
/// `/sys/dev/block/MAJOR:MINOR/size` (in 512-byte units, whatever the
/// device's logical block size); None if it cannot be read.
fn block_device_bytes(rdev: u64) -> Option<u64> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let text = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/size")).ok()?;
    text.trim().parse::<u64>().ok()?.checked_mul(512)
}

/// How often an open volume checks that its external journal file is still
/// there (one `fstat`; see [`WatchedJournal::problem`]).
pub(crate) const JOURNAL_WATCH_INTERVAL: std::time::Duration =
    std::time::Duration::from_millis(250);

/// An open volume's external journal file, watched while it is open.
pub(crate) struct WatchedJournal {
    /// A descriptor of the file (`O_PATH`, from `open_device`).
    pub(crate) file: std::fs::File,
    /// Its path, and the volume's (for the messages).
    pub(crate) path: PathBuf,
    pub(crate) home: PathBuf,
    /// The byte where the journal region ends.
    pub(crate) region_end: u64,
}

/// What happened to a watched external journal file.
pub(crate) enum JournalFileProblem {
    /// No links left: the next open cannot find it, and whatever only it
    /// holds is gone when the volume closes.
    Deleted,
    /// Truncated below the journal's end, to `len` bytes: the log beyond
    /// the cut is gone already (its superblock too if the cut is inside
    /// the first block), and writes there only extend a sparse file.
    Truncated { len: u64 },
    /// A block device that now holds `len` bytes, below the end: what it
    /// kept past its new end is out of reach (gone, if whatever shrank it
    /// dropped it), and writes there fail.
    Shrunk { len: u64 },
}

impl JournalFileProblem {
    fn is_shrunk(&self) -> bool {
        matches!(self, Self::Shrunk { .. })
    }
}

impl WatchedJournal {
    /// The watch over the external journal at `path` of the volume at
    /// `home` (its region ending at byte `region_end`), as
    /// [`WatchedHome::of`].
    pub(crate) fn of(
        file: Option<std::fs::File>,
        path: &Path,
        home: &Path,
        region_end: u64,
    ) -> Option<Self> {
        Some(WatchedJournal {
            file: file.or_else(|| block_device_watch(path))?,
            path: path.to_path_buf(),
            home: home.to_path_buf(),
            region_end,
        })
    }

    /// The abort's message if the device shrank (`Engine::shrunk`).
    pub(crate) fn shrunk_message(&self) -> Option<String> {
        let p = self.problem().filter(JournalFileProblem::is_shrunk)?;
        Some(self.abort_message(&p))
    }

    /// What is wrong with the file now, or `None` while nothing is. Either
    /// problem makes acknowledging more writes promise a durability the
    /// journal can no longer give, so the volume aborts
    /// ([`VolumeError::JournalFileLost`]): nothing is acknowledged after it.
    pub(crate) fn problem(&self) -> Option<JournalFileProblem> {
        file_problem(&self.file, &self.path, self.region_end)
    }

    /// What happened, as the start of a message.
    pub(crate) fn what(&self, p: &JournalFileProblem) -> String {
        let j = self.path.display();
        match p {
            JournalFileProblem::Deleted => {
                format!("the external journal file {j} was deleted while the volume was open")
            }
            JournalFileProblem::Truncated { len } => format!(
                "the external journal file {j} was truncated while the volume was open: it \
                 holds {len} bytes, below the journal's end at byte {}",
                self.region_end
            ),
            JournalFileProblem::Shrunk { len } => format!(
                "the external journal device {j} shrank while the volume was open: it holds \
                 {len} bytes, below the journal's end at byte {}",
                self.region_end
            ),
        }
    }

    /// The abort's message: what happened, what is lost, and what the
    /// operator can do so that the volume opens again. A deleted file is
    /// still open here, so its content can be copied back through /proc
    /// (the journal is written no more after the abort, so the copy is the
    /// journal as the abort left it, and the next open replays it).
    pub(crate) fn abort_message(&self, p: &JournalFileProblem) -> String {
        let (j, what) = (self.path.display(), self.what(p));
        match p {
            JournalFileProblem::Deleted => {
                use std::os::unix::io::AsRawFd;
                let (pid, fd) = (std::process::id(), self.file.as_raw_fd());
                format!(
                    "{what}: writes are refused from now on. Committed writes not yet written \
                     home (every write a flush or FUA acknowledged) are now written there from \
                     memory: once the log says \"salvage complete\", every one is on the \
                     volume (plain writes no flush covered yet are not), and after the volume is \
                     closed `jbdev journal reset {h}` gives it a new journal. If the salvage \
                     cannot finish, the close saves the journal's content back to {j} (beside \
                     it if that path is taken again) and the next open replays it. A process \
                     killed before its close cannot: a copy taken now with \
                     `cp /proc/{pid}/fd/{fd} {j}` (this process, pid {pid}, still holds it) \
                     does not depend on the close",
                    h = self.home.display()
                )
            }
            JournalFileProblem::Shrunk { .. } => format!(
                "{what}: writes are refused from now on. Committed writes not yet written home \
                 (every write a flush or FUA acknowledged) are now written there from memory: \
                 once the log says \"salvage complete\", every one is on the volume (plain \
                 writes no flush covered yet are not). {}",
                self.next_step(p)
            ),
            JournalFileProblem::Truncated { .. } => format!(
                "{what}: writes are refused from now on. Committed writes not yet written home \
                 (every write a flush or FUA acknowledged) are now written there from memory: \
                 once the log says \"salvage complete\", every one is on the volume (plain \
                 writes no flush covered yet are not), and after the volume is closed \
                 `jbdev journal reset --force {h}` gives it a new journal. If the salvage \
                 cannot finish, writes only in the cut-off part are lost; to open the volume \
                 again with what is left, {}",
                truncated_journal_advice(&self.home, &self.path, self.region_end),
                h = self.home.display()
            ),
        }
    }

    /// Saves the content of the deleted journal file, still reachable
    /// through the watch's descriptor, to a new file: at its old path if
    /// that is free (the next open then finds it and replays it), else
    /// beside it, `PATH.rescued-PID`. Never overwrites anything; a copy
    /// that fails part way is removed. Returns where it went.
    pub(crate) fn rescue(&self) -> std::io::Result<PathBuf> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::io::AsRawFd;
        // The descriptor is O_PATH: /proc reopens the inode, linked or not.
        let mut src = std::fs::File::open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))?;
        let create = |p: &Path| {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(p)
        };
        let (target, mut out) = match create(&self.path) {
            Ok(f) => (self.path.clone(), f),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let mut name = self.path.clone().into_os_string();
                name.push(format!(".rescued-{}", std::process::id()));
                let t = PathBuf::from(name);
                let f = create(&t)?;
                (t, f)
            }
            Err(e) => return Err(e),
        };
        let copied = (|| {
            let n = std::io::copy(&mut (&mut src).take(self.region_end), &mut out)?;
            if n < self.region_end {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "the journal holds {n} bytes, below its end at {}",
                        self.region_end
                    ),
                ));
            }
            out.sync_all()?;
            if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        })();
        match copied {
            Ok(()) => Ok(target),
            Err(e) => {
                let _ = std::fs::remove_file(&target);
                Err(e)
            }
        }
    }

    /// The close's error for a deleted journal file whose acknowledged
    /// writes did not all reach home (the salvage could not run or finish,
    /// `why`): the journal is saved first ([`WatchedJournal::rescue`]),
    /// since closing drops the last reference to its content.
    pub(crate) fn rescue_at_close(&self, why: &str) -> VolumeError {
        let (j, h) = (self.path.display(), self.home.display());
        let what = format!(
            "the external journal file {j} was deleted while the volume was open, and not \
             every committed write could be written home ({why})"
        );
        let msg = match self.rescue() {
            Ok(t) if t == self.path => format!(
                "{what}. Its content was saved back to {j} before the close: the next open of \
                 {h} replays it"
            ),
            Ok(t) => format!(
                "{what}. Its content was saved to {t} before the close ({j} exists again and \
                 was left alone): open the volume with `--journal {t}` (or move it to {j}) and \
                 the open replays it",
                t = t.display()
            ),
            Err(e) => format!(
                "{what}. Saving its content before the close failed ({e}): the acknowledged \
                 writes that only it held are lost"
            ),
        };
        tracing::error!("{msg}");
        VolumeError::JournalFileLost(msg)
    }

    /// The message when the problem is first seen at close, after the
    /// final checkpoint wrote everything acknowledged home.
    pub(crate) fn close_message(&self, p: &JournalFileProblem) -> String {
        format!(
            "{} (noticed at close: everything acknowledged was written home first); {}",
            self.what(p),
            self.next_step(p)
        )
    }

    /// The close's error after the salvage wrote every committed write
    /// home: what happened and the next step.
    pub(crate) fn after_salvage_message(&self, p: &JournalFileProblem) -> String {
        format!("{}; {}", self.what(p), self.next_step(p))
    }

    /// What gives the volume a journal again.
    fn next_step(&self, p: &JournalFileProblem) -> String {
        match p {
            JournalFileProblem::Deleted => format!(
                "`jbdev journal reset {}` gives the volume a new, empty journal",
                self.home.display()
            ),
            JournalFileProblem::Truncated { .. } => format!(
                "to open the volume again, {}",
                truncated_journal_advice(&self.home, &self.path, self.region_end)
            ),
            JournalFileProblem::Shrunk { .. } => format!(
                "to open the volume again, grow {} back to at least {} bytes (a loop device: \
                 enlarge its file, then `losetup -c`) and open it (`jbdev check {}` first), or \
                 give it a new journal with `jbdev journal reset --force {}`",
                self.path.display(),
                self.region_end,
                self.home.display(),
                self.home.display()
            ),
        }
    }
}

/// The error for an external journal file `journal` of the volume `home`
/// that holds `held` bytes, less than the journal's `len_bytes`: what
/// happened, and both ways on (a new journal, or what is left of the log).
/// Every open refuses it, and so does `jbdev journal reset` without
/// `--force`.
pub(crate) fn truncated_journal_file(
    home: &Path,
    journal: &Path,
    given: Option<&Path>,
    held: u64,
    len_bytes: u64,
) -> VolumeError {
    // The reset names the journal the way this command was given it: a
    // reset without --journal resets the one at the recorded path.
    let journal_arg = given.map_or(String::new(), |g| format!(" --journal {}", g.display()));
    VolumeError::Truncated(format!(
        "the external journal file {} holds {held} bytes, less than the journal's \
         {len_bytes}: it was truncated. If it was truncated under the running volume and \
         its log said \"salvage complete\", every committed write (each write a flush or \
         FUA acknowledged) is on the volume: \
         `jbdev journal reset --force {}{journal_arg}` gives it a new journal. Otherwise \
         acknowledged writes that were only in the cut-off part (not yet written home) are \
         lost; to open the volume with what is left, {}",
        journal.display(),
        home.display(),
        truncated_journal_advice(home, journal, len_bytes)
    ))
}

/// What to do about the external journal file `journal` of the volume
/// `home`, truncated below the journal's end at `region_end`, so that the
/// volume opens again with what is left: the same steps from the journal
/// watch and from the open that refuses the short file.
pub(crate) fn truncated_journal_advice(home: &Path, journal: &Path, region_end: u64) -> String {
    let (h, j) = (home.display(), journal.display());
    format!(
        "give the file back its length with `truncate -s {region_end} {j}` (the cut-off part \
         reads as zeroes), then run \
         `jbdev check {h} --journal {j}`: it says whether the journal's superblock survived \
         and what recovery will replay"
    )
}
