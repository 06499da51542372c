//! e2fsprogs reads the journal the ENGINE writes: `debugfs -R "logdump -a -f
//! JOURNAL"` must decode our transactions and list every home block we wrote.
//! (crates/journal/tests/debugfs.rs covers hand-built images of every block
//! type; this test covers what a live volume actually puts on disk.)

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use jbdev_device::fault::FaultDevice;
use jbdev_device::mem::MemDevice;
use jbdev_volume::{FormatOptions, JournalPlacement, OpenOptions, Volume, WriteFlags};

#[test]
fn debugfs_logdump_decodes_engine_transactions() {
    if Command::new("debugfs").arg("-V").output().is_err() {
        println!("SKIP: debugfs (e2fsprogs) is not installed");
        return;
    }
    let bs = 4096u64;
    let dev = Arc::new(MemDevice::new(bs + (4 << 20), 512));
    let journal = Arc::new(FaultDevice::new(1 << 20, 512));
    let mut f = FormatOptions::new(4 << 20);
    f.journal = JournalPlacement::External("journal.img".into());
    f.journal_bytes = Some(1 << 20);
    Volume::format_device(dev.clone(), Some(journal.clone()), &f).unwrap();
    // No checkpoint may run during the test, so the log keeps every commit.
    let opts = OpenOptions {
        checkpoint_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let v = Volume::open_device(dev.clone(), Some(journal.clone()), &opts).unwrap();
    let homes = [3u64, 17, 200, 201, 1000];
    for (i, &b) in homes.iter().enumerate() {
        let mut data = vec![i as u8 + 1; bs as usize];
        if i == 2 {
            // A block that starts with the jbd2 magic must be escaped.
            data[..4].copy_from_slice(&0xc03b_3998u32.to_be_bytes());
        }
        v.write_at(&data, b * bs, WriteFlags::FUA).unwrap();
    }
    let mut tx = v.transaction();
    tx.write(&[9u8; 8192], 500 * bs).unwrap();
    tx.commit(WriteFlags::FUA).unwrap();
    // Power cut: what is durable is what a crash leaves.
    journal.cut_power();
    let image = journal.durable_image();
    drop(v);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.img");
    std::fs::write(&path, &image).unwrap();
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(format!("logdump -a -f {}", path.display()))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    for b in homes.iter().chain(&[500, 501]) {
        assert!(
            text.contains(&format!("FS block {b} logged at journal block")),
            "debugfs did not list home block {b}"
        );
    }
    let commits = text.matches("(commit block)").count();
    assert!(
        commits >= 6,
        "expected 6 commit blocks, debugfs found {commits}"
    );
    let line = text
        .lines()
        .find(|l| l.contains("FS block 200 logged"))
        .expect("line for block 200");
    let flags = line
        .rsplit("flags 0x")
        .next()
        .and_then(|f| u32::from_str_radix(f.trim_end_matches(')'), 16).ok());
    assert_eq!(
        flags.map(|f| f & 1),
        Some(1),
        "the escaped block's tag must carry ESCAPE: {line}"
    );
    assert!(
        !text.to_lowercase().contains("checksum error"),
        "debugfs reported a checksum error"
    );
    // And our own recovery replays it.
    let v = Volume::open_device(
        dev,
        Some(Arc::new(MemDevice::from_image(image, 512))),
        &OpenOptions::default(),
    )
    .unwrap();
    assert_eq!(v.recovery_report().transactions_replayed, 6);
    let mut b = vec![0u8; bs as usize];
    v.read_at(&mut b, 200 * bs).unwrap();
    assert_eq!(&b[..4], &0xc03b_3998u32.to_be_bytes());
    assert!(b[4..].iter().all(|&x| x == 3));
}
