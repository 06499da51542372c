//! CommitBlock::decode on arbitrary bytes; on success, encode → decode must
//! give the same commit block.
#![no_main]

#[path = "common.rs"]
mod common;

use jbdev_journal::format::{commit_block_checksum, CommitBlock, BLOCKTYPE_COMMIT};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((fix_up, mut block)) = common::split(data) else {
        return;
    };
    let seed = common::seed();
    if fix_up && block.len() >= 60 {
        common::set_header(&mut block, BLOCKTYPE_COMMIT);
        let csum = commit_block_checksum(seed, &block);
        block[16..20].copy_from_slice(&csum.to_be_bytes());
    }
    if let Ok(c) = CommitBlock::decode(&block, seed) {
        let mut again = vec![0u8; block.len()];
        c.encode(seed, &mut again);
        let back = CommitBlock::decode(&again, seed).expect("re-encoded commit decodes");
        assert_eq!(back, c);
    }
});
