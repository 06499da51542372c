//! Which journal belongs to which home, and when: the session stamps a
//! read-write open writes, and the home's identity recorded in its journal
//! (FORMAT.md). A journal that is an old copy, ahead of its home, or another
//! home's is refused before anything is replayed.

use super::*;

/// How the session stamp of a journal whose log needs replay stands against
/// its volume's (FORMAT.md, `journal_session`), when it forbids the
/// replay. A clean journal (nothing to replay), another volume's journal
/// (its own check) and unstamped ones never mismatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionMismatch {
    /// Written by a session before the volume's last one: an old copy of
    /// the journal, restored over the live one.
    Stale { journal: u32, volume: u32 },
    /// Written by a session after the volume's last one that is not an
    /// open interrupted between its stamps: this home is older than the
    /// journal (restored from a copy), or another copy of this volume
    /// (same uuid) has used this journal since.
    Ahead { journal: u32, volume: u32 },
}

impl std::fmt::Display for SessionMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            SessionMismatch::Stale { journal, volume } => write!(
                f,
                "the journal is stale: its log needs replay but was written by session \
                 {journal}, and the volume has been opened read-write since (session {volume}). \
                 It is an old copy (restored from a backup?): replaying it would bring back \
                 old data over newer. Give --journal the current journal, or discard this one \
                 with `jbdev journal reset`"
            ),
            SessionMismatch::Ahead { journal, volume } => write!(
                f,
                "the journal is ahead of the volume: its log needs replay and was written by \
                 session {journal}, but this volume's last session is {volume}. Either this \
                 volume is an older copy than its journal (restored from a backup?), or \
                 another copy of this volume has used this journal since; replaying it here \
                 would mix another state's writes into this one. Open the copy that wrote it, \
                 or, to keep this volume as it is and lose what the journal holds, discard \
                 the journal with `jbdev journal reset --force`"
            ),
        }
    }
}

/// Which home file a volume is being opened from, for the journal's
/// record of the last one ([`JournalSuperblock::home_id`]).
pub(crate) struct HomeOrigin {
    pub(crate) path: PathBuf,
    /// [`home_id`] of the file, or [`identity_id`] of an RBD image's id; 0
    /// for a block device.
    pub(crate) id: u64,
    /// [`home_path_id`] of the path it was opened by, or the crc32c of an
    /// RBD image's `rbd:POOL/IMAGE`; 0 where `id` is.
    pub(crate) path_id: u32,
    /// The external journal, when it was found by the path the volume
    /// recorded at format time (no `--journal`).
    pub(crate) journal: Option<PathBuf>,
}

impl HomeOrigin {
    /// The home at `path`, opened as `file` (a regular file's descriptor;
    /// None for a block device or an RBD image) on `dev`. A file is known
    /// by its inode and canonical path, an RBD image by its id and name
    /// (session 24: an `rbd cp` copy took its original's journal image
    /// unseen); a block device records 0 (a loop device's number is not an
    /// identity).
    pub(crate) fn of(path: &Path, file: Option<&std::fs::File>, dev: &dyn BlockDevice) -> Self {
        let (id, path_id) = match (file, dev.identity()) {
            (Some(f), _) => (home_id(f), home_path_id(path)),
            (None, Some(i)) => (identity_id(&i.id), crc32c::crc32c(i.name.as_bytes()).max(1)),
            (None, None) => (0, 0),
        };
        HomeOrigin {
            path: path.to_path_buf(),
            id,
            path_id,
            journal: None,
        }
    }

    /// Why the journal `jsb`, found by the recorded path, must not be
    /// replayed into this home: it needs replay, and another file opened
    /// it last. That is what a copy of a volume with an external journal
    /// finds: both record the same journal path, and the copy's replay
    /// would apply, and then clear, the original's acknowledged writes
    /// (session 23's adversarial pass; the session stamps cannot tell
    /// them apart, a copy carrying the original's).
    pub(crate) fn refuses(&self, jsb: &JournalSuperblock, read_only: bool) -> Option<String> {
        let journal = self.journal.as_ref()?;
        // The same file, or a file at the same path (restored in place
        // from a backup or a crash image), is taken for the volume itself.
        if read_only
            || jsb.is_clean()
            || self.id == 0
            || jsb.home_id == 0
            || jsb.home_id == self.id
            || jsb.home_path_id == self.path_id
        {
            return None;
        }
        Some(format!(
            "the journal {} needs replay, but another file or image opened it last (the \
             volume recorded the journal's path at format time, and a copy of the volume \
             carries the same path): a copy of {}, or the volume {} was copied from. The \
             journal holds that one's acknowledged writes, and replaying them here would \
             move them out of its reach: open that one, and give this volume its own \
             journal with --journal. If {} is the volume that wrote it (moved or \
             restored), give --journal {} to replay it",
            journal.display(),
            self.path.display(),
            self.path.display(),
            self.path.display(),
            journal.display()
        ))
    }
}

/// The identity of a home's path recorded in its journal: crc32c of its
/// canonical form, never 0; 0 if it cannot be resolved.
pub(crate) fn home_path_id(path: &Path) -> u32 {
    std::fs::canonicalize(path)
        .map(|p| crc32c::crc32c(p.as_os_str().as_encoded_bytes()).max(1))
        .unwrap_or(0)
}

/// A device's [`jbdev_device::Identity::id`] as recorded in its journal:
/// two crc32c of it with different seeds, never 0.
fn identity_id(id: &str) -> u64 {
    let a = u64::from(crc32c::crc32c(id.as_bytes()));
    let b = u64::from(crc32c::crc32c_append(0x9E37_79B9, id.as_bytes()));
    ((a << 32) | b).max(1)
}

/// The identity of an open regular file recorded in its journal: its
/// device and inode numbers, mixed, never 0.
pub(crate) fn home_id(f: &std::fs::File) -> u64 {
    use std::os::unix::fs::MetadataExt;
    match f.metadata() {
        Ok(m) => (m.dev().rotate_left(32) ^ m.ino()).max(1),
        Err(_) => 0,
    }
}

/// The [`SessionMismatch`] of a journal against its volume, if any.
pub fn session_mismatch(sb: &VolumeSuperblock, jsb: &JournalSuperblock) -> Option<SessionMismatch> {
    let (vs, js, pending) = (sb.journal_session, jsb.session, sb.journal_session_pending);
    if jsb.is_clean() || jsb.uuid != sb.journal_uuid() || vs == 0 || js == 0 {
        return None;
    }
    // An open writes `pending` here, then the journal's stamp, then
    // `journal_session` here, so every crash leaves `vs <= js <= pending`
    // (an open interrupted before its last write, perhaps followed by
    // another interrupted before its journal stamp). Without a pending
    // number (a volume last opened by a jbdev before session 21), one
    // ahead is taken for an interrupted open.
    let interrupted = if pending != 0 {
        js <= pending
    } else {
        js <= vs.wrapping_add(1)
    };
    if js < vs {
        Some(SessionMismatch::Stale {
            journal: js,
            volume: vs,
        })
    } else if js > vs && !interrupted {
        Some(SessionMismatch::Ahead {
            journal: js,
            volume: vs,
        })
    } else {
        None
    }
}

/// [`session_mismatch`] as the message that refuses the replay.
pub fn stale_journal(sb: &VolumeSuperblock, jsb: &JournalSuperblock) -> Option<String> {
    session_mismatch(sb, jsb).map(|m| m.to_string())
}

/// Why a journal whose log needs replay must not be replayed because it
/// ends before the transaction the volume's checkpoint mark names
/// (`checkpoint_sequence`, FORMAT.md): an old copy of the journal, taken
/// earlier in the current session, which the session stamps cannot tell
/// from the live one (found by an adversarial pass, session 21: replaying
/// such a copy rolled a checkpointed block back). `None` otherwise, and
/// for another volume's journal (its own check).
///
/// A clean journal stamped by an earlier session than the volume's last
/// read-write open is an old copy too (session 26's pass: a journal copied
/// while the volume was closed, put back over the live one after a crash,
/// opened without a word and served a mix of two states). Every open
/// stamps the journal, and leaves it in use, before it stamps the home; a
/// clean close changes no stamp; a reset writes the volume's own; so no
/// crash or legitimate step leaves a clean journal behind its home.
pub fn journal_behind_home(sb: &VolumeSuperblock, scan: &recovery::Scan) -> Option<String> {
    let jsb = &scan.superblock;
    if jsb.uuid != sb.journal_uuid() {
        return None;
    }
    if let Some(why) = clean_journal_behind_home(sb, jsb) {
        return Some(why);
    }
    // A log cut short by damage in a transaction the home holds is not an
    // old copy: [`scan_journal`] went on past the mark.
    let mark = sb.checkpoint_mark()?;
    if jsb.is_clean() || scan.home_damage.is_some() {
        return None;
    }
    // The newest transaction the log holds (or, for an empty log, the one
    // before its tail); sequences wrap, compared as jbd2 does.
    let end = scan
        .txns
        .last()
        .map_or(jsb.sequence.wrapping_sub(1), |t| t.sequence);
    ((mark.wrapping_sub(end) as i32) > 0).then(|| {
        format!(
            "the journal is stale: its log ends at transaction {end}, but the volume's home \
             already holds transaction {mark} of this journal (the checkpoint wrote it there). \
             It is an old copy of the journal (taken while the volume ran, and restored?): \
             replaying it would roll back blocks written since. Give --journal the current \
             journal, or discard this one with `jbdev journal reset`"
        )
    })
}

/// Where a journal was found, for [`foreign_journal`].
#[derive(Clone, Copy, Debug)]
pub enum JournalAt<'a> {
    /// The volume's own journal area.
    Internal,
    /// A path the operator gave (`--journal`).
    Given(&'a Path),
    /// The path the volume recorded at format time.
    Recorded(&'a Path),
    /// A device handed to [`Volume::open_device`].
    Device,
}

/// Why the journal found at `at`, whose uuid is `found`, is not the journal
/// of a volume expecting `expected`. Said by every open, `check`, `info`,
/// `journal dump`, `rescue` and `reset` (session 28's pass: a recorded path
/// renumbered to another volume's journal device was "corrupt", or "the
/// wrong --journal?" with no `--journal` given, and a reset offered
/// `--force` to overwrite it).
pub fn foreign_journal(at: JournalAt<'_>, found: [u8; 16], expected: [u8; 16]) -> String {
    let uuid = |u: [u8; 16]| uuid::Uuid::from_bytes(u).hyphenated().to_string();
    let (what, hint) = match at {
        JournalAt::Internal => (
            "the journal in the volume".to_string(),
            "the volume's journal area holds another volume's journal (another image copied \
             over this one's start?)",
        ),
        JournalAt::Given(j) => (
            format!("the journal {}", j.display()),
            "the wrong --journal? Give the path of this volume's own",
        ),
        JournalAt::Recorded(j) => (
            format!("the journal {}", j.display()),
            "that is the path the volume recorded at format time, and it now names another \
             volume's journal (a device renumbered after a reboot, or a file replaced?): give \
             --journal the path of this volume's own",
        ),
        JournalAt::Device => (
            "the journal device given".to_string(),
            "the wrong device? Give this volume's own journal",
        ),
    };
    format!(
        "{what} is not this volume's journal: it belongs to another volume (its uuid is {}, \
         this volume's journal has {}): {hint}. \
         Do not reset or overwrite it: the other volume may need what it holds",
        uuid(found),
        uuid(expected)
    )
}

/// The recovery scan of a volume's journal that every open, `check`,
/// `journal dump`, `journal rescue` and `journal reset` make:
/// [`recovery::scan_past_mark`] with the volume's checkpoint mark, so that
/// damage in a transaction the home already holds neither hides the
/// committed transactions after the mark nor passes for an old copy.
pub fn scan_journal(
    region: &jbdev_journal::JournalRegion,
    sb: &VolumeSuperblock,
    progress: &mut dyn FnMut(u64),
) -> jbdev_journal::Result<recovery::Scan> {
    recovery::scan_past_mark(region, sb.journal_uuid(), sb.checkpoint_mark(), progress)
}

/// Every refusal of a journal that its superblock and the volume's tell
/// without reading the log: [`stale_journal`], a clean journal behind its
/// home ([`journal_behind_home`]'s first case) and [`home_behind_journal`].
/// For `jbdev info` and `journal dump`, which do not scan (session 27's
/// pass: both called such a journal "clean" while every open refused it).
pub fn refusal_by_superblocks(sb: &VolumeSuperblock, jsb: &JournalSuperblock) -> Option<String> {
    stale_journal(sb, jsb)
        .or_else(|| clean_journal_behind_home(sb, jsb))
        .or_else(|| home_behind_journal(sb, jsb))
}

/// [`journal_behind_home`] for a clean journal: stamped by an earlier
/// session than the volume's last read-write open.
fn clean_journal_behind_home(sb: &VolumeSuperblock, jsb: &JournalSuperblock) -> Option<String> {
    if jsb.uuid != sb.journal_uuid() {
        return None;
    }
    let (vs, js) = (sb.journal_session, jsb.session);
    if jsb.is_clean() && vs != 0 && js != 0 && vs.wrapping_sub(js) as i32 > 0 {
        return Some(format!(
            "the journal is stale: it was closed cleanly by session {js}, but the volume has \
             been opened read-write since (session {vs}), and what that session journaled is \
             not in it. It is an old copy of the journal (restored from a backup?): the writes \
             only the current journal holds would be lost, and blocks the checkpoint had \
             written home would stay a mix of two states. Give --journal the current \
             journal; if there is none and the volume was closed cleanly after session {vs}'s \
             writes, its home holds them all: `jbdev journal reset` writes a new journal"
        ));
    }
    None
}

/// Why a volume must not be opened with this journal because its home is
/// older than the journal: the journal has dropped transactions from its
/// log (the checkpoint wrote them home) that this home does not hold, as
/// its checkpoint mark shows. A snapshot or copy of the home alone, put
/// back under a journal that went on (an RBD `snap rollback` of the home
/// image; session 25's RBD pass): replaying the log onto it left blocks
/// that were neither the old state nor the new one, and a clean journal
/// opened silently without the writes only it had held. The mark is
/// trusted only while it was set by an open of the current session
/// (`checkpoint_mark_session`), which keeps it at least at the transaction
/// before the log. `None` otherwise, and for another volume's journal.
pub fn home_behind_journal(sb: &VolumeSuperblock, jsb: &JournalSuperblock) -> Option<String> {
    if jsb.uuid != sb.journal_uuid() {
        return None;
    }
    let (vs, js) = (sb.journal_session, jsb.session);
    let advice = "Opening it would mix the two: blocks neither the old state nor the new one. \
                  Put back the home and journal taken at the same moment (a snapshot of \
                  both), or the current home; `jbdev journal reset --force` keeps this home \
                  as it is and discards the journal";
    // A clean journal stamped by a later session than this home's last
    // open: every open stamps both, a clean close changes neither, and an
    // open cut short leaves its journal in use (not clean). So a later
    // session opened this journal with another (newer) home.
    if jsb.is_clean() && vs != 0 && js != 0 && js.wrapping_sub(vs) as i32 > 0 {
        return Some(format!(
            "the volume's home is older than its journal: the journal was last used by \
             session {js}, this home only by session {vs} (a snapshot or copy of the home \
             alone put back under a journal that went on?). {advice}"
        ));
    }
    // Within one session: the open set the mark to the transaction before
    // the log, and the checkpoint moves the log's start only past what the
    // mark covers, so the mark is at least the transaction before the log.
    // Trusted only when this session's open set it and stamped the
    // journal (a crash inside an open leaves the stamps apart).
    let mark = sb.checkpoint_mark()?;
    if sb.checkpoint_mark_session != vs || js != vs {
        return None;
    }
    // The transaction before the log's first (for a clean journal, the last
    // one it held): the home must hold it. Sequences wrap, compared as jbd2
    // does.
    let before_log = jsb.sequence.wrapping_sub(1);
    (before_log.wrapping_sub(mark) as i32 > 0).then(|| {
        format!(
            "the volume's home is older than its journal: the journal has written every \
             transaction up to {before_log} home and dropped it from its log, but this home \
             holds transactions up to {mark} only (a snapshot or copy of the home alone put \
             back under a journal that went on?). {advice}"
        )
    })
}
