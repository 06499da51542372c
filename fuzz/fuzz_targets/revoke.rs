//! RevokeBlock::decode on arbitrary bytes; on success, encode → decode must
//! give the same revoke block.
#![no_main]

#[path = "common.rs"]
mod common;

use jbdev_journal::format::{block_tail_checksum, RevokeBlock, BLOCKTYPE_REVOKE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((fix_up, mut block)) = common::split(data) else {
        return;
    };
    let seed = common::seed();
    if fix_up && block.len() >= 16 {
        common::set_header(&mut block, BLOCKTYPE_REVOKE);
        let tail = block.len() - 4;
        let csum = block_tail_checksum(seed, &block);
        block[tail..].copy_from_slice(&csum.to_be_bytes());
    }
    if let Ok(r) = RevokeBlock::decode(&block, seed) {
        assert!(r.blocks.len() <= RevokeBlock::capacity(block.len()));
        let mut again = vec![0u8; block.len()];
        r.encode(seed, &mut again);
        let back = RevokeBlock::decode(&again, seed).expect("re-encoded revoke decodes");
        assert_eq!(back, r);
    }
});
