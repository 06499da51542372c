//! Large writes against a full journal: a write that waits for log space
//! keeps its buffer (its data is copied once, not once per retry).

use std::sync::Arc;

use jbdev_device::mem::MemDevice;
use jbdev_volume::{FormatOptions, OpenOptions, Volume, WriteFlags};

const SIZE: u64 = 32 << 20;
const JOURNAL: u64 = 1 << 20;

fn volume() -> Volume {
    let dev = Arc::new(MemDevice::new(SIZE + JOURNAL + 4096, 512));
    let mut f = FormatOptions::new(SIZE);
    f.journal_bytes = Some(JOURNAL);
    Volume::format_device(dev.clone(), None, &f).unwrap();
    Volume::open_device(dev, None, &OpenOptions::default()).unwrap()
}

#[test]
fn a_large_write_waiting_for_log_space_takes_its_buffer_once() {
    let vol = volume();
    let max = vol.max_transaction_bytes() as usize;
    let data: Vec<u8> = (0..max).map(|i| (i % 251) as u8).collect();
    let chunks = (max / 4096).div_ceil(256) as u64;
    let writes = 40u64;
    let s0 = vol.stats();
    for i in 0..writes {
        let off = (i * max as u64) % (SIZE - max as u64);
        vol.write_at(&data, off / 4096 * 4096, WriteFlags::NONE)
            .unwrap();
    }
    let s1 = vol.stats();
    let taken = (s1.write_buffers_allocated + s1.write_buffers_reused)
        - (s0.write_buffers_allocated + s0.write_buffers_reused);
    println!(
        "{writes} writes of {max} bytes into a {JOURNAL}-byte journal: {} log-space waits, \
         {taken} buffers taken",
        s1.log_space_waits - s0.log_space_waits
    );
    assert!(
        s1.log_space_waits > s0.log_space_waits,
        "the test must make writes wait for log space"
    );
    assert_eq!(
        taken,
        writes * chunks,
        "each write takes its buffer once, however often it waits"
    );
    let mut back = vec![0u8; max];
    let last = ((writes - 1) * max as u64) % (SIZE - max as u64) / 4096 * 4096;
    vol.read_at(&mut back, last).unwrap();
    assert!(back == data);
}
