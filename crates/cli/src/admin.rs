//! format, info, check, journal dump.

use std::path::PathBuf;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use jbdev_volume::inspect::{inspect, Inspection};
use jbdev_volume::journal::format::{self, LogRecord};
use jbdev_volume::journal::next_pos;
use jbdev_volume::journal::recovery::{self, ScanEnd};
use jbdev_volume::superblock::JournalLocation;
use jbdev_volume::{FormatOptions, JournalPlacement, OpenOptions, Volume};

use jbdev_bench::cli::parse_size;

#[derive(clap::Args)]
pub struct FormatArgs {
    /// Image file (created if missing), block device, or RBD image
    /// `rbd:POOL/IMAGE[:conf=PATH][:id=USER]` (created if missing).
    pub path: PathBuf,
    /// Size users see, e.g. 1G. Default: all of a block device (minus the
    /// superblock and an internal journal).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Journal size, e.g. 64M (default: 64M or a quarter of the volume, whichever is smaller).
    #[arg(long, value_parser = parse_size)]
    pub journal_size: Option<u64>,
    /// Put the journal in this separate file or device, or in a second RBD
    /// image (`rbd:POOL/IMAGE`: the journal then survives the loss of this node).
    #[arg(long)]
    pub journal: Option<PathBuf>,
    /// Block size in bytes (1024..65536, a power of two).
    #[arg(long, default_value_t = 4096)]
    pub block_size: u32,
    /// RBD: break the exclusive lock of a holder that is dead (never done
    /// without this flag; librbd blocklists the old holder).
    #[arg(long)]
    pub break_lock: bool,
    /// Format even if PATH (or --journal) already holds a jbdev volume or
    /// other data, destroying it. Without this flag, format only writes
    /// over a new, empty or all-zero target.
    #[arg(long, short = 'f')]
    pub force: bool,
    /// Image files: allocate the whole file now (fallocate), so that writes
    /// cannot fail later because its file system filled up. A trim or
    /// write-zeroes that punches a hole gives that space back.
    #[arg(long)]
    pub preallocate: bool,
}

fn spinner(msg: String) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{elapsed}]").expect("static template"),
    );
    pb.set_message(msg);
    pb.enable_steady_tick(std::time::Duration::from_millis(100));
    pb
}

/// The data area of a volume that fills a whole device of `total` bytes:
/// what is left after the superblock block and an internal journal.
fn data_bytes_of(total: u64, bs: u64, a: &FormatArgs) -> u64 {
    let journal = if a.journal.is_some() {
        0
    } else {
        a.journal_size
            .unwrap_or_else(|| jbdev_volume::default_journal_bytes(total))
    };
    (total.saturating_sub(bs + journal)) / bs * bs
}

/// Opens an existing device read-only and shared, to learn its size.
fn open_to_size(path: &std::path::Path) -> jbdev_device::Result<jbdev_device::OpenedDevice> {
    jbdev_device::open_device(
        path,
        &jbdev_device::OpenOptions {
            read_only: true,
            exclusive: false,
            ..Default::default()
        },
    )
}

pub fn format(a: FormatArgs) -> anyhow::Result<()> {
    let bs = u64::from(a.block_size);
    anyhow::ensure!(
        a.block_size.is_power_of_two() && (1024..=65536).contains(&a.block_size),
        "--block-size must be a power of two from 1024 to 65536 (got {})",
        a.block_size
    );
    let size = match a.size {
        Some(s) => s,
        None if jbdev_device::is_rbd_target(&a.path) => {
            // An existing image: all of it, like a block device.
            let dev = open_to_size(&a.path).with_context(|| {
                format!(
                    "{}: give --size to create the image, or create it first",
                    a.path.display()
                )
            })?;
            data_bytes_of(dev.device.size_bytes(), bs, &a)
        }
        None => {
            let meta = std::fs::metadata(&a.path).with_context(|| {
                format!(
                    "{} does not exist: give --size to create an image file",
                    a.path.display()
                )
            })?;
            use std::os::unix::fs::FileTypeExt;
            anyhow::ensure!(
                meta.file_type().is_block_device(),
                "--size is required for an image file (e.g. --size 1G)"
            );
            let dev = open_to_size(&a.path)?;
            data_bytes_of(dev.device.size_bytes(), bs, &a)
        }
    };
    anyhow::ensure!(
        size > 0 && size % bs == 0,
        "--size must be a positive multiple of the {bs}-byte block size"
    );
    if !a.force {
        refuse_to_overwrite(&a.path, "")?;
        if let Some(j) = &a.journal {
            refuse_to_overwrite(j, "--journal ")?;
        }
    }
    // Files this command creates are removed again if it fails, so a
    // failed format leaves nothing behind that looks like a volume.
    let created: Vec<PathBuf> = std::iter::once(&a.path)
        .chain(a.journal.as_ref())
        .filter(|p| !jbdev_device::is_rbd_target(p) && !p.exists())
        .cloned()
        .collect();
    if let Err(e) = format_checked(&a, size) {
        for p in &created {
            let _ = std::fs::remove_file(p);
        }
        return Err(e);
    }
    preallocate(&a)
}

/// How many leading bytes [`refuse_to_overwrite`] looks at: past the
/// signatures of partition tables, file systems and LVM (btrfs keeps its
/// superblock at 64 KiB).
const OVERWRITE_PROBE_BYTES: u64 = 1 << 20;

/// Fails when `path` exists and holds a jbdev volume, a jbdev journal or
/// any non-zero byte in its first [`OVERWRITE_PROBE_BYTES`]: formatting
/// would destroy it. A missing or empty target, or one that reads as
/// zeroes there (a fresh `truncate -s`), is fine. `label` names the
/// argument in the message ("" for PATH, "--journal ").
fn refuse_to_overwrite(path: &std::path::Path, label: &str) -> anyhow::Result<()> {
    use jbdev_volume::journal::format::JournalSuperblock;
    use jbdev_volume::superblock::VolumeSuperblock;
    let local = !jbdev_device::is_rbd_target(path);
    if local && !path.exists() {
        return Ok(());
    }
    let Ok(opened) = open_to_size(path) else {
        // A missing RBD image (format creates it), or a path that cannot
        // be opened: format reports that itself.
        return Ok(());
    };
    let dev = opened.device;
    let lbs = u64::from(dev.logical_block_size()).max(512);
    let len = dev.size_bytes().min(OVERWRITE_PROBE_BYTES) / lbs * lbs;
    if len == 0 {
        return Ok(());
    }
    let mut buf = jbdev_device::AlignedBuf::zeroed(len as usize);
    dev.read_at(&mut buf, 0)
        .with_context(|| format!("reading {} to see whether it holds data", path.display()))?;
    let p = path.display();
    // A format interrupted before its last step (the volume superblock in
    // block 0) left an internal journal at offset one block and zeroes
    // before it. Only a pristine journal (clean, first transaction still to
    // come) says no volume was ever used there: a used volume whose block
    // 0 was lost still has its data, and its journal says so.
    let interrupted = (10..=16).map(|shift| 1usize << shift).any(|off| {
        buf.get(..off)
            .is_some_and(|head| head.iter().all(|&b| b == 0))
            && buf
                .get(off..)
                .and_then(|rest| JournalSuperblock::decode(rest).ok())
                .is_some_and(|j| j.is_clean() && j.sequence == 1)
    });
    if interrupted {
        println!("{label}{p} holds an interrupted jbdev format (a journal without a volume superblock); formatting it again");
        return Ok(());
    }
    let what_is_there = if let Ok(sb) = VolumeSuperblock::decode(&buf) {
        format!(
            "holds a jbdev volume (uuid {}, {} bytes)",
            uuid_str(&sb.uuid),
            sb.size_bytes
        )
    } else if let Ok(jsb) = JournalSuperblock::decode(&buf) {
        format!("holds a jbdev journal (uuid {})", uuid_str(&jsb.uuid))
    } else if let Some(what) = jbdev_bench::backing::describe_head(&buf, local.then_some(path)) {
        format!("holds {what}")
    } else if let Some(at) = buf.iter().position(|&b| b != 0) {
        format!("holds data (byte {at} is not zero)")
    } else {
        return Ok(());
    };
    anyhow::bail!(
        "{label}{p} {what_is_there}: formatting would destroy it; \
         give --force to format it anyway"
    )
}

fn format_checked(a: &FormatArgs, size: u64) -> anyhow::Result<()> {
    let mut f = FormatOptions::new(size);
    f.block_size = a.block_size;
    f.journal_bytes = a.journal_size;
    if let Some(j) = &a.journal {
        f.journal = JournalPlacement::External(j.clone());
    }
    let pb = spinner(format!("formatting {}", a.path.display()));
    let oopts = OpenOptions {
        break_lock: a.break_lock,
        ..OpenOptions::default()
    };
    let res = Volume::create(&a.path, &f, &oopts);
    pb.finish_and_clear();
    let v = res.with_context(|| format!("formatting {}", a.path.display()))?;
    let journal = match &v.superblock().journal {
        JournalLocation::Internal { len_bytes, .. } => {
            format!("internal journal of {len_bytes} bytes")
        }
        JournalLocation::External { len_bytes, .. } => {
            format!(
                "external journal of {len_bytes} bytes in {} ({})",
                a.journal
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                placement_of(a.journal.as_deref())
            )
        }
    };
    println!(
        "formatted {}: {size} bytes, {}-byte blocks, {journal}, uuid {}",
        a.path.display(),
        a.block_size,
        uuid_str(&v.superblock().uuid)
    );
    v.close()?;
    Ok(())
}

/// `--preallocate`, once the volume is formatted (a failure here leaves a
/// valid, sparse volume: nothing is removed).
fn preallocate(a: &FormatArgs) -> anyhow::Result<()> {
    if a.preallocate {
        anyhow::ensure!(
            !jbdev_device::is_rbd_target(&a.path),
            "--preallocate is for image files; an RBD image is thin by design"
        );
        match jbdev_device::file::preallocate(&a.path) {
            Ok(n) => println!("preallocated {}: {n} bytes", a.path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                println!(
                    "{}: not an image file, nothing to preallocate",
                    a.path.display()
                )
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "preallocating {} (the volume is formatted, and sparse)",
                        a.path.display()
                    )
                })
            }
        }
    }
    Ok(())
}

/// What a journal placement promises (docs/ARCHITECTURE.md, "Journal placement").
fn placement_of(journal: Option<&std::path::Path>) -> &'static str {
    match journal {
        Some(p) if jbdev_device::is_rbd_target(p) => {
            "on RBD: nothing acknowledged depends on this node"
        }
        Some(_) => "local: acknowledged writes not yet checkpointed live only on this node",
        None => "internal: in the home device, wherever it lives",
    }
}

fn uuid_str(u: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*u).hyphenated().to_string()
}

#[derive(clap::Args)]
pub struct InfoArgs {
    /// Volume image or device.
    pub path: PathBuf,
    /// External journal file or device (default: the path recorded at format time).
    #[arg(long)]
    pub journal: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn info(a: InfoArgs) -> anyhow::Result<()> {
    let (sb, journal_path, journal_superblock, in_use) =
        match inspect(&a.path, a.journal.as_deref()) {
            Ok(ins) => (
                ins.superblock,
                ins.journal_path,
                ins.journal_superblock,
                None,
            ),
            Err(jbdev_volume::VolumeError::Device(jbdev_device::DeviceError::Busy(_))) => {
                let snap = in_use::snapshot(&a.path, a.journal.as_deref())
                    .with_context(|| format!("reading {} (open elsewhere)", a.path.display()))?;
                (
                    snap.superblock,
                    snap.journal_path,
                    snap.journal_superblock,
                    Some(snap.holder),
                )
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", a.path.display())),
        };
    let sb = &sb;
    let (jkind, jlen) = match &sb.journal {
        JournalLocation::Internal { len_bytes, .. } => ("internal".to_string(), *len_bytes),
        JournalLocation::External { len_bytes, .. } => (
            format!(
                "external ({})",
                journal_path
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            ),
            *len_bytes,
        ),
    };
    let home_kind = if jbdev_device::is_rbd_target(&a.path) {
        "rbd"
    } else {
        "local"
    };
    let placement = match &sb.journal {
        JournalLocation::Internal { .. } if home_kind == "rbd" => {
            "internal, on RBD: nothing acknowledged depends on this node"
        }
        JournalLocation::Internal { .. } => "internal: in the home device",
        JournalLocation::External { .. } => placement_of(journal_path.as_deref()),
    };
    let rbd_holder = rbd_lock_holder(&a.path);
    let jsb = journal_superblock.as_ref();
    // Another volume's journal: a wrong --journal.
    let expect_uuid = sb.journal_uuid();
    let foreign = jsb.ok().filter(|j| j.uuid != expect_uuid);
    // Image files only: how much of the file is allocated, and whether its
    // file system could run out before the holes are filled.
    let space = if home_kind == "local" {
        jbdev_device::file::file_space(&a.path).ok().flatten()
    } else {
        None
    };
    if a.json {
        let j = serde_json::json!({
            "path": a.path.display().to_string(),
            "uuid": uuid_str(&sb.uuid),
            "block_size": sb.block_size,
            "size_bytes": sb.size_bytes,
            "data_offset_bytes": sb.data_offset_bytes,
            "home": home_kind,
            "rbd_lock_holder": rbd_holder,
            "journal": { "placement": jkind, "promise": placement, "len_bytes": jlen,
                "clean": jsb.map(|j| j.is_clean()).ok(),
                "sequence": jsb.map(|j| j.sequence).ok(),
                "start": jsb.map(|j| j.start).ok(),
                "error": jsb.err(),
                "belongs_to_volume": jsb.ok().map(|j| j.uuid == expect_uuid),
            },
            "created_unix_secs": sb.created_unix_secs,
            "open_elsewhere": in_use.is_some(),
            "holder": in_use.as_ref().map(|h| h.to_string()),
            "file_space": space.map(|sp| serde_json::json!({
                "len_bytes": sp.len,
                "allocated_bytes": sp.allocated,
                "fs_available_bytes": sp.fs_available,
                "may_run_out": sp.may_run_out(),
            })),
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(());
    }
    println!("volume          {}", a.path.display());
    if let Some(holder) = &in_use {
        println!(
            "state           OPEN ELSEWHERE ({holder}); below is a snapshot read without \
             its lock: the journal state changes while it runs. Live figures: \
             `jbdev stats ADDR:PORT` against its `--metrics` address"
        );
    }
    println!("uuid            {}", uuid_str(&sb.uuid));
    println!(
        "size            {} bytes ({} blocks of {})",
        sb.size_bytes,
        sb.size_bytes / u64::from(sb.block_size),
        sb.block_size
    );
    println!("data offset     {} bytes", sb.data_offset_bytes);
    println!("home            {home_kind}");
    if let Some(sp) = space {
        println!(
            "allocated       {} of {} bytes of the image file; its file system has {} bytes free",
            sp.allocated, sp.len, sp.fs_available,
        );
        if let Some(w) = space_warning(&sp, &a.path) {
            println!("warning         {w}");
        }
    }
    if let Some(h) = &rbd_holder {
        println!("rbd lock        held by {h}");
    }
    println!(
        "journal         {jkind}, {jlen} bytes ({} blocks)",
        jlen / u64::from(sb.block_size)
    );
    println!("placement       {placement}");
    match jsb {
        Ok(j) => {
            println!(
                "journal format  jbd2 v2, features incompat {:#x}, uuid {}",
                j.feature_incompat,
                uuid_str(&j.uuid)
            );
            if j.is_clean() {
                println!("journal state   clean (next transaction {})", j.sequence);
            } else {
                println!(
                    "journal state   in use or needs recovery: log starts at block {} with transaction {}",
                    j.start, j.sequence
                );
            }
        }
        Err(e) => println!("journal state   UNREADABLE: {e}"),
    }
    if let Some(j) = foreign {
        println!(
            "warning         this journal belongs to another volume (uuid {}, expected {}): \
             the wrong --journal? Opening the volume with it is refused",
            uuid_str(&j.uuid),
            uuid_str(&expect_uuid)
        );
    }
    Ok(())
}

/// Who holds an RBD home's exclusive lock (None for files, or nobody).
#[cfg(feature = "rbd")]
fn rbd_lock_holder(path: &std::path::Path) -> Option<String> {
    let t = jbdev_device::rbd::RbdTarget::parse(path.to_str()?).ok()?;
    let owners = jbdev_device::rbd::lock_holders(&t).ok()?;
    (!owners.is_empty()).then(|| owners.join(", "))
}

#[cfg(not(feature = "rbd"))]
fn rbd_lock_holder(_path: &std::path::Path) -> Option<String> {
    None
}

/// Reading a volume that another process holds open (exclusively): no lock,
/// plain buffered reads of the two superblocks, never a write.
mod in_use {
    use std::fs::File;
    use std::os::unix::fs::{FileExt, MetadataExt};
    use std::path::{Path, PathBuf};

    use anyhow::Context;
    use jbdev_volume::journal::format::JournalSuperblock;
    use jbdev_volume::superblock::{JournalLocation, VolumeSuperblock};

    pub struct Snapshot {
        pub superblock: VolumeSuperblock,
        pub journal_path: Option<PathBuf>,
        pub journal_superblock: Result<JournalSuperblock, String>,
        /// Who holds it, as far as /proc tells.
        pub holder: String,
    }

    pub fn snapshot(path: &Path, journal: Option<&Path>) -> anyhow::Result<Snapshot> {
        let f = File::open(path)?;
        let mut head = vec![0u8; VolumeSuperblock::ENCODED_LEN.max(4096)];
        f.read_exact_at(&mut head, 0)
            .context("reading the volume superblock")?;
        let superblock = VolumeSuperblock::decode(&head).map_err(anyhow::Error::msg)?;
        let bs = superblock.block_size as usize;
        let (jfile, joff, journal_path) = match &superblock.journal {
            JournalLocation::Internal { offset_bytes, .. } => (f, *offset_bytes, None),
            JournalLocation::External { path_hint, .. } => {
                let p = journal
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from(path_hint));
                (
                    File::open(&p).with_context(|| format!("opening journal {}", p.display()))?,
                    0,
                    Some(p),
                )
            }
        };
        let mut block = vec![0u8; bs.max(JournalSuperblock::ENCODED_LEN)];
        let journal_superblock = jfile
            .read_exact_at(&mut block, joff)
            .map_err(|e| e.to_string())
            .and_then(|()| JournalSuperblock::decode(&block).map_err(|e| e.to_string()));
        Ok(Snapshot {
            superblock,
            journal_path,
            journal_superblock,
            holder: holder(path),
        })
    }

    /// "held by pid N (command line)" from /proc/locks (flock on image
    /// files); block devices opened with O_EXCL leave no trace there.
    fn holder(path: &Path) -> String {
        let unknown = "held by another process".to_string();
        let Ok(meta) = std::fs::metadata(path) else {
            return unknown;
        };
        let (dev, ino) = (meta.dev(), meta.ino());
        // dev_t to major:minor, as glibc's gnu_dev_major/minor.
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
        let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
        let want = format!("{major:02x}:{minor:02x}:{ino}");
        let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
        let pid = locks.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // "1: FLOCK ADVISORY WRITE 1234 08:01:5678 0 EOF"
            (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str()))
                .then(|| f.get(4).map(|p| p.to_string()))
                .flatten()
        });
        match pid {
            Some(pid) => {
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|c| {
                        String::from_utf8_lossy(&c)
                            .replace('\0', " ")
                            .trim()
                            .to_string()
                    })
                    .unwrap_or_default();
                if cmd.is_empty() {
                    format!("held by pid {pid}")
                } else {
                    format!("held by pid {pid}: {cmd}")
                }
            }
            None => unknown,
        }
    }
}

#[derive(clap::Args)]
pub struct CheckArgs {
    /// Volume image or device.
    pub path: PathBuf,
    /// External journal file or device.
    #[arg(long)]
    pub journal: Option<PathBuf>,
}

/// Exit status of `check` when it finds corruption.
const EXIT_CORRUPT: i32 = 2;

pub fn check(a: CheckArgs) -> anyhow::Result<()> {
    let ins = match inspect(&a.path, a.journal.as_deref()) {
        Ok(i) => i,
        Err(e) => {
            if matches!(
                e,
                jbdev_volume::VolumeError::NotAVolume(_)
                    | jbdev_volume::VolumeError::BadSuperblock(_)
                    | jbdev_volume::VolumeError::CorruptJournal(_)
            ) {
                println!("{}: {e}", a.path.display());
                std::process::exit(EXIT_CORRUPT);
            }
            return Err(e.into());
        }
    };
    println!(
        "volume superblock: ok (uuid {}, {} bytes)",
        uuid_str(&ins.superblock.uuid),
        ins.superblock.size_bytes
    );
    let jsb = match &ins.journal_superblock {
        Ok(j) => j.clone(),
        Err(e) => {
            println!("journal superblock: CORRUPT: {e}");
            std::process::exit(EXIT_CORRUPT);
        }
    };
    if jsb.uuid != ins.superblock.journal_uuid() {
        println!(
            "journal superblock: belongs to another volume (uuid {})",
            uuid_str(&jsb.uuid)
        );
        std::process::exit(EXIT_CORRUPT);
    }
    println!(
        "journal superblock: ok ({} blocks, next transaction {})",
        jsb.max_len, jsb.sequence
    );
    let pb = ProgressBar::new(u64::from(jsb.max_len));
    pb.set_style(
        ProgressStyle::with_template("scanning journal {bar:40} {pos}/{len} blocks")
            .expect("static template"),
    );
    let scan = recovery::scan(&ins.region, &mut |n| pb.set_position(n));
    pb.finish_and_clear();
    let scan = match scan {
        Ok(s) => s,
        Err(e) => {
            println!("journal: CORRUPT: {e}");
            std::process::exit(EXIT_CORRUPT);
        }
    };
    let (plan, revoked) = recovery::replay_plan(&scan.txns);
    match &scan.end {
        ScanEnd::CleanJournal => println!("journal: clean; recovery has nothing to do"),
        end => {
            println!(
                "journal: needs recovery: {} complete transaction(s) ({} blocks read)",
                scan.txns.len(),
                scan.blocks_read
            );
            for t in &scan.txns {
                println!(
                    "  transaction {}: blocks {}..{}, {} data block(s), {} revoke(s)",
                    t.sequence,
                    t.start_pos,
                    t.end_pos,
                    t.blocks.len(),
                    t.revokes.len()
                );
            }
            println!("recovery would replay {} block(s) to their home location; {revoked} logged copies are revoked", plan.len());
            match end {
                ScanEnd::TornTail {
                    sequence,
                    pos,
                    reason,
                } => {
                    println!("recovery would discard torn last transaction {sequence} (block {pos}): {reason}")
                }
                ScanEnd::CorruptMiddle {
                    sequence,
                    pos,
                    reason,
                } => {
                    println!("CORRUPT: transaction {sequence} (block {pos}): {reason}");
                    println!("a read-write open will refuse this volume; open it read-only to rescue data");
                    std::process::exit(EXIT_CORRUPT);
                }
                _ => println!("log ends cleanly at a transaction boundary"),
            }
        }
    }
    println!("check: ok");
    Ok(())
}

#[derive(clap::Subcommand)]
pub enum JournalCommand {
    /// Print the blocks of the journal log, from its tail.
    Dump {
        /// Volume image or device.
        path: PathBuf,
        /// External journal file or device.
        #[arg(long)]
        journal: Option<PathBuf>,
        /// Walk the whole log area from its first block, also when the
        /// journal is clean (shows old, already checkpointed transactions).
        #[arg(long)]
        all: bool,
    },
}

pub fn journal(c: JournalCommand) -> anyhow::Result<()> {
    let JournalCommand::Dump { path, journal, all } = c;
    let ins = inspect(&path, journal.as_deref())
        .with_context(|| format!("reading {}", path.display()))?;
    let jsb = ins
        .journal_superblock
        .clone()
        .map_err(|e| anyhow::anyhow!("journal superblock: {e}"))?;
    println!(
        "journal superblock: block size {}, {} blocks, first {}, sequence {}, start {}{}",
        jsb.block_size,
        jsb.max_len,
        jsb.first,
        jsb.sequence,
        jsb.start,
        if jsb.is_clean() { " (clean)" } else { "" }
    );
    if jsb.is_clean() && !all {
        println!("the journal is clean: nothing to replay (use --all to walk old log blocks)");
        return Ok(());
    }
    dump_log(&ins, &jsb, all)
}

fn dump_log(ins: &Inspection, jsb: &format::JournalSuperblock, all: bool) -> anyhow::Result<()> {
    let seed = jsb.csum_seed();
    let (first, len) = (jsb.first, jsb.max_len);
    let mut pos = if all || jsb.is_clean() {
        first
    } else {
        jsb.start
    };
    let mut expect = if all { None } else { Some(jsb.sequence) };
    let mut walked = 0u64;
    let usable = u64::from(len - first);
    while walked < usable {
        let block = ins.read_journal_block(pos)?;
        walked += 1;
        let Some(view) = format::decode_log_block(&block, seed) else {
            if !all {
                println!("{pos:>8}: no journal header: end of log");
                return Ok(());
            }
            pos = next_pos(pos, first, len);
            continue;
        };
        let h = view.header;
        if let Some(e) = expect {
            if h.sequence != e {
                println!(
                    "{pos:>8}: sequence {} where {e} was expected: end of log",
                    h.sequence
                );
                return Ok(());
            }
        }
        let here = pos;
        pos = next_pos(pos, first, len);
        match view.record {
            Ok(LogRecord::Descriptor(d)) => {
                println!(
                    "{here:>8}: descriptor  transaction {} with {} tag(s)",
                    h.sequence,
                    d.tags.len()
                );
                for t in &d.tags {
                    let data = ins.read_journal_block(pos)?;
                    let ok = format::data_block_checksum(seed, h.sequence, &data) == t.checksum;
                    println!(
                        "{pos:>8}:   data -> home block {} flags {:#x} checksum {:#010x} {}",
                        t.home_block,
                        t.flags,
                        t.checksum,
                        if ok { "ok" } else { "MISMATCH" }
                    );
                    pos = next_pos(pos, first, len);
                    walked += 1;
                }
            }
            Ok(LogRecord::Revoke(r)) => println!(
                "{here:>8}: revoke      transaction {}: {:?}",
                h.sequence, r.blocks
            ),
            Ok(LogRecord::Commit(c)) => {
                println!(
                    "{here:>8}: commit      transaction {} at {}.{:09}",
                    h.sequence, c.commit_sec, c.commit_nsec
                );
                expect = expect.map(|e| e.wrapping_add(1));
            }
            Err(reason) => {
                println!(
                    "{here:>8}: BAD block of transaction {} ({reason})",
                    h.sequence
                );
                if h.block_type == format::BLOCKTYPE_COMMIT {
                    expect = expect.map(|e| e.wrapping_add(1));
                }
            }
        }
    }
    Ok(())
}

/// The warning for an image file whose holes its file system could not
/// fill (`jbdev info`, and `jbdev serve` at startup); None if it can.
pub(crate) fn space_warning(
    sp: &jbdev_device::file::FileSpace,
    path: &std::path::Path,
) -> Option<String> {
    sp.may_run_out().then(|| {
        format!(
            "{} MiB of this sparse image is not allocated yet, and its file system has \
             {} MiB free: writes will fail with ENOSPC once it is full. Free space, or \
             allocate the image now with `fallocate -l {} {}` (or format with --preallocate)",
            sp.unallocated() >> 20,
            sp.fs_available >> 20,
            sp.len,
            path.display()
        )
    })
}
