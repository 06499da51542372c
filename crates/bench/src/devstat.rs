//! Bytes written to the benchmarked block device: the `sectors written`
//! field of its `/sys/class/block/NAME/stat`, read at the same marks as the
//! CPU time ([`crate::cpu::mark`]).
//!
//! Both sides of a comparison write to the same loop device, so its write
//! rate says how close each is to the device's bandwidth, and the device
//! bytes per byte the workload wrote are the write amplification: 1 for
//! the kernel's O_DIRECT path, about 2 for jbdev's journaled writes (the
//! log, then home), plus journal descriptors and commit blocks.

use std::path::{Path, PathBuf};

use parking_lot::Mutex;

/// The stat file of the device being benchmarked, if it has one.
static WATCHED: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Watches block device `dev` (e.g. `/dev/loop0`) until the guard drops.
/// Nothing is watched for a path that is not a block device with a sysfs
/// stat file (a regular file given as `--device`, an RBD image).
pub fn watch(dev: &Path) -> Watch {
    let stat = std::fs::canonicalize(dev)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_owned()))
        .map(|name| Path::new("/sys/class/block").join(name).join("stat"))
        .filter(|p| p.exists());
    *WATCHED.lock() = stat.clone();
    Watch(stat)
}

/// Ends a [`watch`] when dropped.
#[derive(Debug)]
pub struct Watch(Option<PathBuf>);

impl Drop for Watch {
    fn drop(&mut self) {
        let mut w = WATCHED.lock();
        if self.0.is_some() && *w == self.0 {
            *w = None;
        }
    }
}

/// Bytes written to the watched device since it appeared, or None when no
/// device is watched or its stat file cannot be read.
pub fn written_bytes() -> Option<u64> {
    let path = WATCHED.lock().clone()?;
    written_bytes_from_stat(&std::fs::read_to_string(path).ok()?)
}

/// The `sectors written` field (the 7th; sectors of 512 bytes whatever the
/// device's block size) of a block device's `stat` file, in bytes.
fn written_bytes_from_stat(stat: &str) -> Option<u64> {
    let sectors: u64 = stat.split_whitespace().nth(6)?.parse().ok()?;
    sectors.checked_mul(512)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seventh_field_is_sectors_written() {
        // reads merged sectors ticks writes merged sectors ticks in_flight ...
        let stat = "    1234        5    67890      100     4321        7    98765      200        0      300      300\n";
        assert_eq!(written_bytes_from_stat(stat), Some(98765 * 512));
        assert_eq!(written_bytes_from_stat("1 2 3"), None);
        assert_eq!(written_bytes_from_stat("1 2 3 4 5 6 x 8"), None);
        assert_eq!(written_bytes_from_stat(""), None);
    }

    #[test]
    fn a_regular_file_is_not_watched() {
        let f = tempfile::NamedTempFile::new().unwrap();
        assert_eq!(watch(f.path()).0, None);
    }
}
