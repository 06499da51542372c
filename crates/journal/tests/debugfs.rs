//! Interoperability with e2fsprogs: a journal image built with our encoders
//! must be decoded by Debian's `debugfs logdump` (which reads jbd2 journals
//! with e2fsprogs' own parser), and replayed by `e2fsck` (whose recovery
//! code is the kernel's fs/jbd2/recovery.c and verifies every CSUM_V3
//! checksum).
//!
//! Both tests skip, with a message, when the tool is not installed.

use std::path::{Path, PathBuf};
use std::process::Command;

use jbdev_journal::format::{
    data_block_checksum, escape, needs_escape, BlockTag, CommitBlock, DescriptorBlock,
    JournalSuperblock, RevokeBlock, JBD2_MAGIC, TAG_FLAG_ESCAPE,
};

/// Finds an e2fsprogs tool on PATH or in the sbin directories Debian uses
/// (which are not on a non-root PATH).
fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// One journaled data block: where it goes home, and its contents.
struct Logged {
    home_block: u64,
    data: Vec<u8>,
}

/// One transaction in the test image.
struct Txn {
    sequence: u32,
    blocks: Vec<Logged>,
    revoked: Vec<u64>,
}

/// Where each structure landed in the journal, for the assertions.
#[derive(Default)]
struct Placement {
    /// (home block, journal block, tag flags as logdump prints them).
    data: Vec<(u64, u32, u32)>,
    descriptors: Vec<(u32, u32)>,
    revokes: Vec<(u32, u32)>,
    commits: Vec<(u32, u32)>,
    end_block: u32,
}

/// Writes `txns` into a journal of `max_len` blocks of `block_size` bytes
/// starting at block 1, exactly as the engine lays out a transaction:
/// revoke block(s), descriptor, data blocks (escaped where needed), commit.
fn build_journal(
    block_size: usize,
    max_len: u32,
    uuid: [u8; 16],
    txns: &[Txn],
) -> (Vec<u8>, Placement) {
    let mut image = vec![0u8; block_size * max_len as usize];
    let mut sb = JournalSuperblock::new(block_size as u32, max_len, uuid);
    sb.sequence = txns[0].sequence;
    sb.start = 1; // not clean: the log holds transactions to replay
    let seed = sb.csum_seed();
    sb.encode(&mut image[..block_size]);

    let mut placement = Placement::default();
    let mut next: u32 = 1;
    let block_at = |n: u32| n as usize * block_size..(n as usize + 1) * block_size;
    for txn in txns {
        if !txn.revoked.is_empty() {
            let r = RevokeBlock {
                sequence: txn.sequence,
                blocks: txn.revoked.clone(),
            };
            r.encode(seed, &mut image[block_at(next)]);
            placement.revokes.push((txn.sequence, next));
            next += 1;
        }
        let descriptor_at = next;
        next += 1;
        let mut tags = Vec::new();
        for (i, logged) in txn.blocks.iter().enumerate() {
            let mut journal_copy = logged.data.clone();
            let mut flags = 0;
            if needs_escape(&journal_copy) {
                escape(&mut journal_copy);
                flags |= TAG_FLAG_ESCAPE;
            }
            // The checksum covers the block as written, i.e. escaped.
            let checksum = data_block_checksum(seed, txn.sequence, &journal_copy);
            tags.push(BlockTag {
                home_block: logged.home_block,
                flags,
                checksum,
            });
            image[block_at(next)].copy_from_slice(&journal_copy);
            // logdump prints the 16-bit on-disk flags, which include the
            // SAME_UUID (2) and LAST_TAG (8) bits the encoder adds.
            let mut shown = flags;
            if i > 0 {
                shown |= 2;
            }
            if i + 1 == txn.blocks.len() {
                shown |= 8;
            }
            placement.data.push((logged.home_block, next, shown));
            next += 1;
        }
        let d = DescriptorBlock {
            sequence: txn.sequence,
            tags,
        };
        d.encode(&uuid, seed, &mut image[block_at(descriptor_at)]);
        placement.descriptors.push((txn.sequence, descriptor_at));
        let c = CommitBlock {
            sequence: txn.sequence,
            commit_sec: 1_700_000_000 + u64::from(txn.sequence),
            commit_nsec: 123_456_789,
            overlap: 0,
        };
        c.encode(seed, &mut image[block_at(next)]);
        placement.commits.push((txn.sequence, next));
        next += 1;
    }
    placement.end_block = next;
    (image, placement)
}

/// A data block whose bytes depend on `tag`, so misplaced blocks show.
fn pattern_block(block_size: usize, tag: u8) -> Vec<u8> {
    (0..block_size)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(tag))
        .collect()
}

/// A data block that starts with the jbd2 magic and so must be escaped.
fn magic_block(block_size: usize) -> Vec<u8> {
    let mut b = pattern_block(block_size, 0x77);
    b[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
    b
}

fn run(tool: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", tool.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn debugfs_logdump_decodes_our_journal() {
    let Some(debugfs) = find_tool("debugfs") else {
        eprintln!("SKIP debugfs_logdump_decodes_our_journal: debugfs (e2fsprogs) not installed");
        return;
    };
    // debugfs' logdump reads blocks into an 8 KiB buffer: use 4 KiB blocks.
    let block_size = 4096;
    let uuid = *b"jbdev-fmt-test-1";
    let txns = [
        Txn {
            sequence: 10,
            blocks: vec![
                Logged {
                    home_block: 100,
                    data: pattern_block(block_size, 1),
                },
                // A 64-bit block number: logdump prints only t_blocknr, the
                // low 32 bits (5), which proves the high half went to
                // t_blocknr_high.
                Logged {
                    home_block: (1 << 32) | 5,
                    data: pattern_block(block_size, 2),
                },
                Logged {
                    home_block: 200,
                    data: magic_block(block_size),
                },
            ],
            revoked: vec![300, 301],
        },
        Txn {
            sequence: 11,
            blocks: vec![
                Logged {
                    home_block: 400,
                    data: pattern_block(block_size, 3),
                },
                Logged {
                    home_block: 401,
                    data: pattern_block(block_size, 4),
                },
            ],
            revoked: vec![],
        },
    ];
    let (image, placement) = build_journal(block_size, 512, uuid, &txns);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("journal.img");
    std::fs::write(&path, &image).expect("write journal image");
    let path_str = path.to_str().expect("utf-8 temp path");

    let (ok, out) = run(&debugfs, &["-R", &format!("logdump -a -f {path_str}")]);
    println!("debugfs logdump -a output:\n{out}");
    assert!(ok, "debugfs failed:\n{out}");

    assert!(
        out.contains("Journal starts at block 1, transaction 10"),
        "superblock not decoded:\n{out}"
    );
    for &(seq, at) in &placement.descriptors {
        let line =
            format!("Found expected sequence {seq}, type 1 (descriptor block) at block {at}");
        assert!(out.contains(&line), "missing `{line}`:\n{out}");
    }
    for &(home, at, flags) in &placement.data {
        let line = format!(
            "FS block {} logged at journal block {at} (flags {flags:#x})",
            home as u32
        );
        assert!(out.contains(&line), "missing `{line}`:\n{out}");
    }
    for &(seq, at) in &placement.revokes {
        let line = format!("Found expected sequence {seq}, type 5 (revoke table) at block {at}");
        assert!(out.contains(&line), "missing `{line}`:\n{out}");
    }
    for revoked in [300, 301] {
        let line = format!("Revoke FS block {revoked}");
        assert!(out.contains(&line), "missing `{line}`:\n{out}");
    }
    for &(seq, at) in &placement.commits {
        let line = format!("Found expected sequence {seq}, type 2 (commit block) at block {at}");
        assert!(out.contains(&line), "missing `{line}`:\n{out}");
    }
    let end = format!(
        "No magic number at block {}: end of journal.",
        placement.end_block
    );
    assert!(
        out.contains(&end),
        "log end not found at the right block:\n{out}"
    );
    let lower = out.to_lowercase();
    for complaint in ["checksum", "csum", "unexpected block type", "corrupt"] {
        assert!(
            !lower.contains(complaint),
            "debugfs complained ({complaint}):\n{out}"
        );
    }
}

/// Maps each logical block of an inode to its physical block, from the
/// `EXTENTS:` section of `debugfs -R "stat <ino>"` (entries `(a-b):c-d` or
/// `(a):c`).
fn parse_extents(stat: &str) -> Vec<(u64, u64, u64)> {
    let mut extents = Vec::new();
    let Some(start) = stat.find("EXTENTS:") else {
        return extents;
    };
    for item in stat[start + "EXTENTS:".len()..].split([',', '\n']) {
        let item = item.trim();
        let Some((logical, physical)) = item.strip_prefix('(').and_then(|s| s.split_once("):"))
        else {
            continue;
        };
        if logical.starts_with("ETB") || logical.starts_with("IND") {
            continue; // index blocks of the extent tree, not data
        }
        let range = |s: &str| -> Option<(u64, u64)> {
            match s.split_once('-') {
                Some((a, b)) => Some((a.trim().parse().ok()?, b.trim().parse().ok()?)),
                None => {
                    let a = s.trim().parse().ok()?;
                    Some((a, a))
                }
            }
        };
        if let (Some((l0, l1)), Some((p0, _))) = (range(logical), range(physical)) {
            extents.push((l0, l1, p0));
        }
    }
    extents
}

fn physical_of(extents: &[(u64, u64, u64)], logical: u64) -> u64 {
    extents
        .iter()
        .find(|&&(l0, l1, _)| (l0..=l1).contains(&logical))
        .map(|&(l0, _, p0)| p0 + (logical - l0))
        .unwrap_or_else(|| panic!("journal block {logical} not mapped in {extents:?}"))
}

/// Builds an ext4 image, replaces its internal journal with one written by
/// our encoders, marks it as needing recovery and lets e2fsck replay it.
/// Returns the e2fsck output, the image, the block size and the byte offset
/// of the journal superblock in the image.
fn replay_with_e2fsck(
    tools: &Tools,
    dir: &Path,
    txns: &[Txn],
    corrupt_journal_block: Option<u32>,
) -> (String, Vec<u8>, usize, usize) {
    let block_size = 4096usize;
    let img = dir.join("fs.img");
    let img_str = img.to_str().expect("utf-8 temp path");
    let (ok, out) = run(
        &tools.mke2fs,
        &[
            "-q",
            "-F",
            "-t",
            "ext4",
            "-b",
            "4096",
            "-O",
            "metadata_csum",
            img_str,
            "32M",
        ],
    );
    assert!(ok, "mke2fs failed:\n{out}");

    // Our decoder must read the superblock mke2fs wrote... except that
    // mke2fs leaves the journal features empty (the kernel adds CSUM_V3 on
    // mount), so we only take the uuid and length from it.
    let (ok, stat) = run(&tools.debugfs, &["-R", "stat <8>", img_str]);
    assert!(ok, "debugfs stat <8> failed:\n{stat}");
    let extents = parse_extents(&stat);
    assert!(!extents.is_empty(), "no journal extents in:\n{stat}");
    let mut fs = std::fs::read(&img).expect("read fs image");
    let jsb_at = physical_of(&extents, 0) as usize * block_size;
    let jsb = &fs[jsb_at..jsb_at + 1024];
    assert_eq!(
        &jsb[..4],
        &JBD2_MAGIC.to_be_bytes(),
        "no journal superblock"
    );
    let max_len = u32::from_be_bytes(jsb[0x10..0x14].try_into().unwrap());
    let uuid: [u8; 16] = jsb[0x30..0x40].try_into().unwrap();

    let (mut journal, _) = build_journal(block_size, max_len, uuid, txns);
    if let Some(n) = corrupt_journal_block {
        journal[n as usize * block_size + 100] ^= 0x01;
    }
    for n in 0..u64::from(max_len) {
        let at = physical_of(&extents, n) as usize * block_size;
        let src = n as usize * block_size;
        fs[at..at + block_size].copy_from_slice(&journal[src..src + block_size]);
    }
    std::fs::write(&img, &fs).expect("write fs image");
    let (ok, out) = run(
        &tools.debugfs,
        &["-w", "-R", "feature needs_recovery", img_str],
    );
    assert!(ok, "debugfs feature needs_recovery failed:\n{out}");

    // e2fsck exits 0 (clean) or 1 (errors corrected) after a replay; any
    // other status is a failure the caller inspects through the output.
    let out = Command::new(&tools.e2fsck)
        .args(["-f", "-y", img_str])
        .output()
        .expect("run e2fsck");
    let text = format!(
        "e2fsck exit status {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (
        text,
        std::fs::read(&img).expect("read fs image"),
        block_size,
        jsb_at,
    )
}

struct Tools {
    debugfs: PathBuf,
    mke2fs: PathBuf,
    e2fsck: PathBuf,
}

fn e2fs_tools(test: &str) -> Option<Tools> {
    match (
        find_tool("debugfs"),
        find_tool("mke2fs"),
        find_tool("e2fsck"),
    ) {
        (Some(debugfs), Some(mke2fs), Some(e2fsck)) => Some(Tools {
            debugfs,
            mke2fs,
            e2fsck,
        }),
        _ => {
            eprintln!("SKIP {test}: debugfs, mke2fs or e2fsck (e2fsprogs) not installed");
            None
        }
    }
}

/// Two transactions over free blocks near the end of a 32 MiB ext4 image:
/// block 7003 is logged in transaction 10 and revoked in 11 (must not be
/// replayed); block 7004 is revoked in 10 and logged in 11 (must be).
fn replay_txns(block_size: usize) -> Vec<Txn> {
    vec![
        Txn {
            sequence: 10,
            blocks: vec![
                Logged {
                    home_block: 7000,
                    data: pattern_block(block_size, 0x10),
                },
                Logged {
                    home_block: 7001,
                    data: magic_block(block_size),
                },
                Logged {
                    home_block: 7003,
                    data: pattern_block(block_size, 0x30),
                },
            ],
            revoked: vec![7004],
        },
        Txn {
            sequence: 11,
            blocks: vec![
                Logged {
                    home_block: 7002,
                    data: pattern_block(block_size, 0x20),
                },
                Logged {
                    home_block: 7004,
                    data: pattern_block(block_size, 0x40),
                },
            ],
            revoked: vec![7003],
        },
    ]
}

#[test]
fn e2fsck_replays_our_journal_with_checksums_escapes_and_revokes() {
    let Some(tools) = e2fs_tools("e2fsck_replays_our_journal") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let txns = replay_txns(4096);
    let (out, fs, bs, jsb_at) = replay_with_e2fsck(&tools, dir.path(), &txns, None);
    println!("{out}");
    assert!(
        out.contains("recovering journal"),
        "e2fsck did not replay:\n{out}"
    );
    let lower = out.to_lowercase();
    assert!(!lower.contains("checksum"), "e2fsck complained:\n{out}");
    assert!(
        out.contains("exit status Some(0)") || out.contains("exit status Some(1)"),
        "e2fsck failed:\n{out}"
    );
    let home = |b: usize| &fs[b * bs..(b + 1) * bs];
    assert!(
        home(7000) == pattern_block(bs, 0x10),
        "block 7000 not replayed"
    );
    assert!(
        home(7001) == magic_block(bs),
        "escaped block 7001 not restored"
    );
    assert!(
        home(7002) == pattern_block(bs, 0x20),
        "block 7002 not replayed"
    );
    assert!(
        home(7003).iter().all(|&b| b == 0),
        "revoked block 7003 was replayed"
    );
    assert!(
        home(7004) == pattern_block(bs, 0x40),
        "block 7004 not replayed"
    );

    // e2fsck rewrote the journal superblock (clean, next sequence) with its
    // own checksum code: our decoder must accept it.
    let jsb = JournalSuperblock::decode(&fs[jsb_at..jsb_at + bs])
        .expect("decode the journal superblock e2fsck wrote");
    assert!(jsb.is_clean(), "journal not clean after replay: {jsb:?}");
    assert!(
        jsb.sequence > 11,
        "sequence not advanced past the replayed log: {jsb:?}"
    );
}

#[test]
fn e2fsck_rejects_our_journal_with_a_corrupt_data_block() {
    let Some(tools) = e2fs_tools("e2fsck_rejects_corrupt_data_block") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let txns = replay_txns(4096);
    // Journal block 3 is the first data block of transaction 10 (block 1 is
    // its revoke block, 2 its descriptor): home block 7000.
    let (out, fs, bs, _) = replay_with_e2fsck(&tools, dir.path(), &txns, Some(3));
    println!("{out}");
    assert!(
        out.to_lowercase().contains("checksum"),
        "e2fsck did not notice the bad data-block checksum:\n{out}"
    );
    assert!(
        fs[7000 * bs..7001 * bs] != pattern_block(bs, 0x10)[..],
        "corrupt block 7000 was replayed"
    );
}
