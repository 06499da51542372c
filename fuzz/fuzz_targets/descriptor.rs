//! DescriptorBlock::decode on arbitrary bytes; on success, encode → decode
//! must give the same descriptor.
#![no_main]

#[path = "common.rs"]
mod common;

use jbdev_journal::format::{block_tail_checksum, DescriptorBlock, BLOCKTYPE_DESCRIPTOR};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((fix_up, mut block)) = common::split(data) else {
        return;
    };
    let seed = common::seed();
    if fix_up && block.len() >= 16 {
        common::set_header(&mut block, BLOCKTYPE_DESCRIPTOR);
        let tail = block.len() - 4;
        let csum = block_tail_checksum(seed, &block);
        block[tail..].copy_from_slice(&csum.to_be_bytes());
    }
    if let Ok(d) = DescriptorBlock::decode(&block, seed) {
        assert!(!d.tags.is_empty() && d.tags.len() <= DescriptorBlock::capacity(block.len()));
        let mut again = vec![0u8; block.len()];
        d.encode(b"jbdev-fuzz-uuid!", seed, &mut again);
        let back = DescriptorBlock::decode(&again, seed).expect("re-encoded descriptor decodes");
        assert_eq!(back, d);
    }
});
