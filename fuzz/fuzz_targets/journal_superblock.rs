//! JournalSuperblock::decode on arbitrary bytes; on success, encode →
//! decode must give the same superblock.
#![no_main]

#[path = "common.rs"]
mod common;

use jbdev_journal::format::{JournalSuperblock, BLOCKTYPE_SUPERBLOCK_V2, JBDEV_INCOMPAT};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((fix_up, mut block)) = common::split(data) else {
        return;
    };
    if fix_up && block.len() >= JournalSuperblock::ENCODED_LEN {
        common::set_header(&mut block, BLOCKTYPE_SUPERBLOCK_V2);
        block[0x28..0x2c].copy_from_slice(&JBDEV_INCOMPAT.to_be_bytes());
        block[0x50] = 4; // crc32c
        let csum = JournalSuperblock::checksum_of(&block);
        block[0xfc..0x100].copy_from_slice(&csum.to_be_bytes());
    }
    if let Ok(sb) = JournalSuperblock::decode(&block) {
        let mut again = vec![0u8; sb.block_size as usize];
        sb.encode(&mut again);
        let back = JournalSuperblock::decode(&again).expect("re-encoded superblock decodes");
        assert_eq!(back, sb);
    }
});
