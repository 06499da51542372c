//! Shared by the fuzz targets (included with `#[path]`).
//!
//! Input layout: byte 0 is a control byte, the rest is the block.
//! - bit 0: "fix up" — write a valid header and checksum over the fuzzed
//!   bytes, so the checks behind the checksum see arbitrary values (random
//!   bytes almost never carry a valid crc32c);
//! - bits 1..=3: block size 1024 << n (n in 0..=6, 7 meaning "the raw input
//!   length", to exercise length checks).
#![allow(dead_code)]

use jbdev_journal::format::{csum_seed, JBD2_MAGIC};

/// The seed every target uses: the checksum seed of a fixed uuid.
pub fn seed() -> u32 {
    csum_seed(b"jbdev-fuzz-uuid!")
}

/// Splits the input into (fix_up, block): `block` has the chosen size,
/// zero-padded or truncated.
pub fn split(data: &[u8]) -> Option<(bool, Vec<u8>)> {
    let (&control, rest) = data.split_first()?;
    let shift = (control >> 1) & 7;
    let mut block = rest.to_vec();
    if shift != 7 {
        block.resize(1024usize << shift, 0);
    }
    Some((control & 1 == 1, block))
}

/// Writes the jbd2 magic and `block_type` into the header.
pub fn set_header(block: &mut [u8], block_type: u32) {
    if block.len() >= 8 {
        block[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        block[4..8].copy_from_slice(&block_type.to_be_bytes());
    }
}
