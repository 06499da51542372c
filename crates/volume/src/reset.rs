//! A new, empty journal for a volume whose journal is lost or damaged
//! beyond replay (`jbdev journal reset`).
//!
//! The volume's content becomes what its home area holds. That is every
//! acknowledged write when the journal failed under a running volume and
//! its salvage completed (`Stats::salvage_complete`, logged "salvage
//! complete"); otherwise what only the old journal held is gone with it.
//! A journal that an open can still replay is refused: opening the volume
//! is the way to use it. A damaged one, another volume's, or anything else
//! found where the journal should be is only overwritten with `force`.

use std::path::Path;
use std::sync::Arc;

use jbdev_device::{open_device, BlockDevice};
use jbdev_journal::recovery::ScanEnd;

use crate::superblock::{JournalLocation, VolumeSuperblock};
use crate::volume::{
    external_journal_path, file_format_would_create, is_journal_of, rbd_image_absent,
    read_volume_superblock, refuse_unused_journal_path, remove_created, truncated_journal_file,
    write_empty_journal,
};
use crate::{Result, VolumeError};

/// What [`reset_journal`] did.
#[derive(Clone, Debug)]
pub struct JournalReset {
    /// Where the new journal is: the external journal's path, or
    /// "internal".
    pub location: String,
    /// The external journal file did not exist and was created.
    pub created: bool,
    /// What was there before, in words ("missing", "a clean, intact journal
    /// (next transaction 7)", "3 committed transaction(s) that ...").
    pub previous: String,
}

/// Writes a new, empty journal for the volume at `path` (its external
/// journal at `journal`, or at the path recorded at format time; a missing
/// file is created). Takes the volume's lock like an open: refused while
/// the volume is open anywhere. An external journal file shorter than the
/// journal (truncated) is refused without `force`, and with it extended
/// and rewritten; a refused reset leaves every byte as it was.
pub fn reset_journal(path: &Path, journal: Option<&Path>, force: bool) -> Result<JournalReset> {
    reset_journal_with(
        path,
        journal,
        &ResetOptions {
            force,
            break_lock: false,
        },
    )
}

/// How [`reset_journal_with`] goes about it.
#[derive(Clone, Copy, Debug, Default)]
pub struct ResetOptions {
    /// Overwrite a journal that a reset would otherwise refuse (see
    /// [`reset_journal`]).
    pub force: bool,
    /// RBD: break a dead holder's exclusive lock of the volume and its
    /// journal image (as `OpenOptions::break_lock`), but only for a reset
    /// that goes ahead: every reason to refuse is checked first, without
    /// any lock, so a refused reset breaks nothing.
    pub break_lock: bool,
}

/// [`reset_journal`] with [`ResetOptions`].
pub fn reset_journal_with(
    path: &Path,
    journal: Option<&Path>,
    opts: &ResetOptions,
) -> Result<JournalReset> {
    if opts.break_lock {
        reset(path, journal, opts, Pass::Check)?;
    }
    reset(path, journal, opts, Pass::Write)
}

/// A dry run that only reads, through unlocked read-only opens, and
/// returns the reason a reset would be refused; or the reset itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    Check,
    Write,
}

fn reset(
    path: &Path,
    journal: Option<&Path>,
    opts: &ResetOptions,
    pass: Pass,
) -> Result<JournalReset> {
    let check = pass == Pass::Check;
    let force = opts.force;
    let dopts = jbdev_device::OpenOptions {
        read_only: check,
        exclusive: !check,
        break_lock: opts.break_lock && !check,
        ..Default::default()
    };
    let dev = open_device(path, &dopts)?.device;
    let sb = read_volume_superblock(dev.as_ref(), &path.display().to_string())?;
    let JournalLocation::External {
        path_hint,
        len_bytes,
        uuid,
    } = &sb.journal
    else {
        refuse_unused_journal_path(path, journal)?;
        return reset_device(dev, &sb, None, force, pass, None);
    };
    let (jp, _) = external_journal_path(path, path_hint, journal)?;
    // Only a missing journal is created, and an existing one is extended
    // only once the reset goes ahead: a refused reset changes nothing.
    let created =
        file_format_would_create(&jp).or_else(|| rbd_image_absent(&jp).then(|| jp.clone()));
    // A new journal is never made at a relative recorded path: it names a
    // file in whatever directory this runs in.
    if let (Some(_), None, Some(rel)) = (
        &created,
        journal,
        crate::volume::relative_recorded_journal(&jp),
    ) {
        return Err(VolumeError::InvalidArgument(format!(
            "the external journal is missing: {rel}. A new journal is created only at a path \
             given with --journal; nothing was changed"
        )));
    }
    if check && created.is_some() {
        return Ok(JournalReset {
            location: jp.display().to_string(),
            created: true,
            previous: "missing".into(),
        });
    }
    let open = |create: bool| {
        open_device(
            &jp,
            &jbdev_device::OpenOptions {
                create_size: create.then_some(*len_bytes),
                ..dopts.clone()
            },
        )
    };
    let res = (|| {
        let mut opened = open(created.is_some())?;
        let held = opened.device.size_bytes();
        // A file or RBD image shorter than the journal (a block device
        // cannot grow: reset_journal_device refuses it).
        let truncated =
            held < *len_bytes && (opened.watch.is_some() || jbdev_device::is_rbd_target(&jp));
        // An empty file holds nothing to lose: it is what a reset cut short
        // right after creating the journal file leaves (session 32's crash
        // pass), so it is made whole as a missing one would be, without
        // --force.
        let empty = crate::volume::external::empty_file(opened.watch.as_ref());
        if truncated {
            if !force && !empty {
                if !is_journal_of(opened.device.as_ref(), *uuid) {
                    return Err(VolumeError::InvalidArgument(format!(
                        "{} is not this volume's journal (it holds {held} bytes, less than the \
                         journal's {len_bytes}, and no jbdev journal superblock with this \
                         volume's journal uuid): the wrong --journal? --force overwrites it \
                         with a new journal",
                        jp.display()
                    )));
                }
                return Err(truncated_journal_file(path, &jp, journal, held, *len_bytes));
            }
            if check {
                // --force extends and rewrites it, whatever it holds.
                return Ok(JournalReset {
                    location: jp.display().to_string(),
                    created: false,
                    previous: if empty {
                        "an empty file (0 bytes)".into()
                    } else {
                        "a truncated journal file".into()
                    },
                });
            }
            drop(opened);
            opened = open(true)?;
        }
        let at = if journal.is_some() {
            crate::JournalAt::Given(&jp)
        } else {
            crate::JournalAt::Recorded(&jp)
        };
        let mut r = reset_device(dev, &sb, Some(opened.device), force, pass, Some(at)).map_err(
            |e| match e {
                // Name the journal the refusal is about: found by the path the
                // volume recorded, it may be another volume's (a copy's
                // original), and --force would discard what that one holds.
                VolumeError::InvalidArgument(why) => VolumeError::InvalidArgument(format!(
                    "journal {}{}: {why}",
                    jp.display(),
                    if journal.is_none() {
                        " (the path this volume recorded at format time; a copy of a volume \
                     records its original's)"
                    } else {
                        ""
                    }
                )),
                e => e,
            },
        )?;
        r.location = jp.display().to_string();
        r.created = created.is_some();
        if r.created {
            r.previous = "missing".into();
        } else if truncated && empty {
            r.previous = "an empty file (0 bytes; it was extended)".into();
        } else if truncated {
            r.previous = format!(
                "a truncated journal file ({held} of the journal's {len_bytes} bytes; it \
                 was extended)"
            );
        }
        Ok(r)
    })();
    if res.is_err() {
        if let Some(p) = &created {
            remove_created(p);
        }
    }
    res
}

/// [`reset_journal`] on already-open devices (`journal`: the external
/// journal's device).
pub fn reset_journal_device(
    dev: Arc<dyn BlockDevice>,
    journal: Option<Arc<dyn BlockDevice>>,
    force: bool,
) -> Result<JournalReset> {
    let sb = read_volume_superblock(dev.as_ref(), "the volume device")?;
    reset_device(dev, &sb, journal, force, Pass::Write, None)
}

/// The reset of the volume on `dev`, whose superblock the caller read
/// (`sb`: once, so a damaged first copy is warned of once).
fn reset_device(
    dev: Arc<dyn BlockDevice>,
    sb: &VolumeSuperblock,
    journal: Option<Arc<dyn BlockDevice>>,
    force: bool,
    pass: Pass,
    at: Option<crate::JournalAt<'_>>,
) -> Result<JournalReset> {
    if pass == Pass::Write {
        crate::volume::refuse_unknown_ro_compat(sb, false)?;
    }
    let bs = sb.block_size;
    let (jdev, joff, jlen, location) = match (&sb.journal, journal) {
        (
            JournalLocation::Internal {
                offset_bytes,
                len_bytes,
            },
            _,
        ) => (
            dev.clone(),
            *offset_bytes,
            *len_bytes,
            "internal".to_string(),
        ),
        (JournalLocation::External { len_bytes, .. }, Some(j)) => {
            if j.size_bytes() < *len_bytes {
                return Err(VolumeError::InvalidArgument(format!(
                    "the journal device holds {} bytes but this volume's journal needs {len_bytes}",
                    j.size_bytes()
                )));
            }
            (j, 0, *len_bytes, "external".to_string())
        }
        (JournalLocation::External { .. }, None) => {
            return Err(VolumeError::InvalidArgument(
                "this volume has an external journal: give its device".into(),
            ))
        }
    };
    let uuid = sb.journal_uuid();
    let at = at.unwrap_or(match sb.journal {
        JournalLocation::Internal { .. } => crate::JournalAt::Internal,
        JournalLocation::External { .. } => crate::JournalAt::Device,
    });
    let previous = describe_old_journal(&jdev, joff, jlen, sb, at)?;
    match &previous {
        Old::Refused { why, .. } if !force => {
            return Err(VolumeError::InvalidArgument(why.clone()));
        }
        Old::Foreign { why, .. } if !force => return Err(VolumeError::WrongJournal(why.clone())),
        Old::Forbidden(why) => return Err(VolumeError::WrongJournal(why.clone())),
        _ => {}
    }
    if pass == Pass::Write {
        // The checkpoint mark names a transaction of the old journal: gone
        // first (a crash before the new journal is written leaves the old
        // one with no mark, as a volume from before marks).
        if sb.checkpoint_mark().is_some() {
            let mut cleared = sb.clone();
            cleared.checkpoint_sequence = 0;
            cleared.checkpoint_mark_session = 0;
            crate::volume::write_volume_superblock(dev.as_ref(), &cleared)?;
        }
        write_empty_journal(&jdev, joff, jlen, bs, uuid, sb.journal_session)?;
    }
    Ok(JournalReset {
        location,
        created: false,
        previous: match previous {
            Old::Refused { held, .. } | Old::Foreign { held, .. } | Old::Replaceable(held) => held,
            Old::Forbidden(_) => unreachable!("refused above"),
        },
    })
}

/// What the journal area holds now.
enum Old {
    /// Nothing an open could use: replaced without `force` (what it held).
    Replaceable(String),
    /// Something a reset would destroy: only with `force`. What it held
    /// (for [`JournalReset::previous`]), and why a reset without `force`
    /// is refused.
    Refused { held: String, why: String },
    /// Another volume's journal, clean: only with `force`
    /// ([`VolumeError::WrongJournal`], which names the journal itself).
    Foreign { held: String, why: String },
    /// Another volume's journal that still holds writes that volume needs
    /// replayed: never, not even with `force` (session 29's pass: `reset
    /// --force` with the wrong `--journal` discarded 50 acknowledged writes
    /// of the other volume). Why.
    Forbidden(String),
}

fn describe_old_journal(
    jdev: &Arc<dyn BlockDevice>,
    joff: u64,
    jlen: u64,
    sb: &VolumeSuperblock,
    at: crate::JournalAt<'_>,
) -> Result<Old> {
    let (bs, uuid) = (sb.block_size, sb.journal_uuid());
    let region = crate::volume::journal_region_at(jdev.clone(), joff, jlen, bs)?;
    let scan = match crate::volume::scan_journal(&region, sb, &mut |_| {}) {
        Ok(scan) => scan,
        Err(jbdev_journal::JournalError::Device(e)) => {
            return Ok(Old::Replaceable(format!("unreadable ({e})")))
        }
        Err(e) => {
            if let Some(why) = not_a_journal_to_reset(jdev, joff, uuid, at)? {
                return Ok(Old::Forbidden(why));
            }
            // Session 31's docs pass: this named only --force, which drops
            // every committed transaction, where `journal rescue` rebuilds
            // an internal journal's lost superblock and keeps them.
            let next = if matches!(at, crate::JournalAt::Internal) {
                "`jbdev journal rescue` rebuilds a lost internal journal superblock and keeps \
                 the log's committed transactions; --force overwrites the journal, and them"
            } else {
                "check it is the right one; an external journal's superblock cannot be \
                 rebuilt, so --force overwrites it (with whatever its log held)"
            };
            return Ok(if region_is_zero(jdev, joff, jlen)? {
                Old::Replaceable("empty (all zero)".into())
            } else {
                Old::Refused {
                    held: format!("no usable journal ({e}), and not all zero"),
                    why: format!(
                        "the journal area holds no usable journal ({e}) but is not empty \
                         either: {next}"
                    ),
                }
            });
        }
    };
    let sequence = scan.superblock.sequence;
    // The uuid first: another volume's journal is never this one's stale
    // copy, whatever its stamp (found by an adversarial pass, session 21:
    // a reset without --force replaced another volume's dirty journal,
    // and its acknowledged writes with it, as "stale").
    if scan.superblock.uuid != uuid {
        let foreign = crate::volume::foreign_journal(at, scan.superblock.uuid, uuid);
        if scan.superblock.start != 0 || !scan.txns.is_empty() {
            let holds = if scan.txns.is_empty() {
                "Its log is marked in use (that volume was not closed cleanly), so it may hold \
                 writes that volume needs"
            } else {
                "It holds writes that volume has not replayed yet"
            };
            return Ok(Old::Forbidden(format!(
                "{foreign}. {holds}, so it is not reset, not even with --force: open that \
                 volume first (its next open replays them), then reset this volume's journal \
                 with the right --journal"
            )));
        }
        return Ok(Old::Foreign {
            held: format!(
                "another volume's journal (uuid {})",
                uuid::Uuid::from_bytes(scan.superblock.uuid).hyphenated()
            ),
            why: format!(
                "{foreign} (it is clean: --force overwrites it, and that volume then needs \
                 a journal reset of its own)"
            ),
        });
    }
    match crate::volume::session_mismatch(sb, &scan.superblock) {
        // Its transactions are older than the volume: nothing in it is
        // wanted, and opening refuses it.
        Some(m @ crate::SessionMismatch::Stale { .. }) => {
            return Ok(Old::Replaceable(m.to_string()))
        }
        // Newer than the volume: another copy's writes, or this home is
        // the older copy. Which one is wanted is the operator's call.
        Some(m @ crate::SessionMismatch::Ahead { journal, volume }) => {
            return Ok(Old::Refused {
                held: format!(
                    "a journal written after this volume's last session ({journal} > {volume})"
                ),
                why: m.to_string(),
            })
        }
        None => {}
    }
    if let Some(why) = crate::volume::journal_behind_home(sb, &scan) {
        // Older than what the checkpoint wrote home: as stale as above.
        return Ok(Old::Replaceable(why));
    }
    if let Some(why) = crate::volume::home_behind_journal(sb, &scan.superblock) {
        // Newer than this home: discarding it keeps the older home as it
        // is, the operator's call.
        return Ok(Old::Refused {
            held: "a journal that went on past this (older) home".into(),
            why,
        });
    }
    let n = scan.txns.len();
    Ok(match scan.end {
        ScanEnd::CleanJournal => Old::Refused {
            held: format!("a clean, intact journal (next transaction {sequence})"),
            why: "the journal is clean and intact: there is nothing to reset (open the \
                  volume); --force writes a new one anyway"
                .into(),
        },
        ScanEnd::CorruptMiddle {
            sequence, reason, ..
        } => Old::Refused {
            held: format!(
                "a journal damaged in the middle (transaction {sequence}: {reason}), with \
                 committed transactions after the damage; they are discarded"
            ),
            why: format!(
                "the journal is damaged in the middle (transaction {sequence}: {reason}). \
                 `jbdev journal rescue` writes the transactions before the damage home and \
                 then a clean journal; a read-only open (`jbdev serve --read-only`) serves the \
                 volume with them replayed, changing nothing: copy out what you need first; the \
                 committed transactions after the damage cannot be replayed by any open. \
                 --force discards the journal, and the volume is then what its home holds, \
                 without the transactions before the damage either"
            ),
        },
        _ => Old::Refused {
            held: format!(
                "{n} committed transaction(s) that opening the volume would have replayed; \
                 they are discarded"
            ),
            why: format!(
                "the journal holds {n} committed transaction(s) that opening the volume \
                 replays: open it instead (`jbdev check` shows them); --force discards them"
            ),
        },
    })
}

/// Why the journal area, which holds no usable journal, must not be reset
/// even with `force`: it holds a jbdev volume (an image given as
/// `--journal`), or a jbd2 journal superblock that fails its checks but
/// names another volume's journal uuid (that volume's damaged journal,
/// which `journal rescue` on it may still read). Session 29's pass: `reset
/// --force --journal c.img` overwrote volume c.img, and a foreign journal
/// with one flipped byte lost its 50 unreplayed writes.
fn not_a_journal_to_reset(
    jdev: &Arc<dyn BlockDevice>,
    joff: u64,
    uuid: [u8; 16],
    at: crate::JournalAt<'_>,
) -> Result<Option<String>> {
    let mut head = jbdev_device::AlignedBuf::zeroed(4096.max(jdev.logical_block_size() as usize));
    if joff + head.len() as u64 > jdev.size_bytes() {
        return Ok(None);
    }
    jdev.read_at(&mut head, joff)?;
    let what = match at {
        crate::JournalAt::Given(j) | crate::JournalAt::Recorded(j) => j.display().to_string(),
        crate::JournalAt::Internal => "the volume's journal area".into(),
        crate::JournalAt::Device => "the journal device".into(),
    };
    if let Ok((sb, _)) = crate::superblock::VolumeSuperblock::decode_block(&head) {
        return Ok(Some(format!(
            "{what} holds a jbdev volume (uuid {}, {} bytes), not a journal: it is never \
             reset, not even with --force. Give this volume's own journal with --journal",
            uuid::Uuid::from_bytes(sb.uuid).hyphenated(),
            sb.size_bytes
        )));
    }
    let named = jbdev_journal::format::JournalSuperblock::claimed_uuid(&head);
    if let Some(named) = named.filter(|n| *n != uuid) {
        return Ok(Some(format!(
            "{what} holds a jbd2 journal superblock that fails its checks but names another \
             volume's journal (uuid {}; this volume's journal has {}): most likely that \
             volume's damaged journal, with writes it may still need. It is not reset, not even \
             with --force: `jbdev journal rescue` that volume, or give this volume's own journal",
            uuid::Uuid::from_bytes(named).hyphenated(),
            uuid::Uuid::from_bytes(uuid).hyphenated()
        )));
    }
    Ok(None)
}

/// Whether the journal area reads as all zeroes (a journal file created but
/// never written, a zeroed device).
fn region_is_zero(jdev: &Arc<dyn BlockDevice>, joff: u64, jlen: u64) -> Result<bool> {
    let mut buf = jbdev_device::AlignedBuf::zeroed(1 << 20);
    let mut at = 0u64;
    while at < jlen {
        let n = (jlen - at).min(buf.len() as u64) as usize;
        jdev.read_at(&mut buf[..n], joff + at)?;
        if buf[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

/// Rebuilds the journal superblock of the volume at `path` (internal
/// journals) when it is lost: it fails its checksum or has no jbd2 magic,
/// while the log behind it may be intact (jbd2 keeps no second copy, and
/// one flipped bit, padding included, made every open refuse the volume:
/// session 30's operator pass). The geometry, uuid and session stamp come
/// from the volume superblock; the log's tail from its checkpoint mark
/// ([`jbdev_journal::recovery::rebuild_superblock`]). Takes the volume's
/// lock like an open. Returns what it wrote, in words; refuses, changing
/// nothing, an intact superblock, an external journal, a volume that
/// records no checkpoint mark (the tail cannot be known), and a log whose
/// transaction after the mark has no first block to start from.
pub fn rebuild_journal_superblock(path: &Path) -> Result<String> {
    use jbdev_journal::format::FormatError;
    use jbdev_journal::JournalError;
    let dopts = jbdev_device::OpenOptions {
        exclusive: true,
        ..Default::default()
    };
    let dev = open_device(path, &dopts)?.device;
    let sb = read_volume_superblock(dev.as_ref(), &path.display().to_string())?;
    crate::volume::refuse_unknown_ro_compat(&sb, false)?;
    let JournalLocation::Internal {
        offset_bytes,
        len_bytes,
    } = sb.journal
    else {
        return Err(VolumeError::InvalidArgument(
            "the journal superblock of an external journal is not rebuilt (only an internal \
             journal's, whose volume superblock holds all it needs)"
                .into(),
        ));
    };
    let bs = sb.block_size;
    let region = crate::volume::journal_region_at(dev.clone(), offset_bytes, len_bytes, bs)?;
    let lost = match region.read_superblock() {
        Ok(_) => {
            return Err(VolumeError::InvalidArgument(
                "the journal superblock is intact: nothing to rebuild".into(),
            ))
        }
        Err(JournalError::Superblock(
            e @ (FormatError::BadChecksum { .. } | FormatError::BadMagic { .. }),
        )) => e.to_string(),
        Err(e) => return Err(e.into()),
    };
    // Set by a checkpoint (a non-zero sequence) or by a read-write open
    // (its session stamp beside it; a fresh volume's first open sets 0).
    // IMPORTANT: the checkpoint writes the mark before the flush that makes
    // its home writes durable; a crash in between with this superblock
    // lost too would skip transactions the home lacks (a double fault;
    // `scan_past_mark` trusts the mark the same way).
    let Some(mark) = sb.checkpoint_mark() else {
        return Err(VolumeError::CorruptJournal(format!(
            "journal superblock: {lost}; the volume records no checkpoint mark, so where its \
             log begins cannot be known, and it is not rebuilt (`jbdev journal reset --force` \
             replaces the journal, dropping what only its log holds)"
        )));
    };
    let mut template =
        crate::volume::fresh_journal_superblock(&region, sb.uuid, sb.journal_session);
    // The deepest pipeline any writer may have used: a commit block's
    // overlap is checked against it.
    template.pipeline_depth = jbdev_journal::recovery::MAX_PIPELINE_DEPTH;
    let Some(rebuilt) =
        jbdev_journal::recovery::rebuild_superblock(&region, &template, mark, &mut |_| {})?
    else {
        return Err(VolumeError::CorruptJournal(format!(
            "journal superblock: {lost}; the log holds transactions after the checkpoint mark \
             ({mark}) but no descriptor or revoke block of transaction {} to begin it from, so it is not \
             rebuilt (`jbdev journal reset --force` replaces the journal, dropping what only \
             its log holds)",
            mark.wrapping_add(1)
        )));
    };
    region.write_superblock_full(&rebuilt)?;
    dev.flush()?;
    Ok(if rebuilt.is_clean() {
        format!(
            "journal superblock rebuilt ({lost}): the log holds nothing after the checkpoint \
             mark (transaction {mark}); the journal is clean, next transaction {}",
            rebuilt.sequence
        )
    } else {
        format!(
            "journal superblock rebuilt ({lost}): the log begins at block {} with transaction {}, \
             the one after the checkpoint mark",
            rebuilt.start, rebuilt.sequence
        )
    })
}
