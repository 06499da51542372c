//! `decode_log_block` — the one decoder recovery's walk and survey and
//! `journal dump` read the log with — on arbitrary bytes of any block type.
//! A block it accepts must re-encode to a block it decodes the same way.
#![no_main]

#[path = "common.rs"]
mod common;

use jbdev_journal::format::{
    block_tail_checksum, decode_log_block, LogRecord, BLOCKTYPE_COMMIT, BLOCKTYPE_DESCRIPTOR,
    BLOCKTYPE_REVOKE,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((fix_up, mut block)) = common::split(data) else {
        return;
    };
    let seed = common::seed();
    if fix_up && block.len() >= 16 {
        // Pick the type from the input, then make the checksum valid, so
        // the type-specific checks see arbitrary contents.
        let kind = [BLOCKTYPE_DESCRIPTOR, BLOCKTYPE_REVOKE, BLOCKTYPE_COMMIT][block[15] as usize % 3];
        common::set_header(&mut block, kind);
        let tail = block.len() - 4;
        let csum = block_tail_checksum(seed, &block);
        block[tail..].copy_from_slice(&csum.to_be_bytes());
    }
    let Some(view) = decode_log_block(&block, seed) else {
        return;
    };
    let Ok(record) = view.record else {
        return;
    };
    let mut again = vec![0u8; block.len()];
    match &record {
        LogRecord::Descriptor(d) => d.encode(b"jbdev-fuzz-uuid!", seed, &mut again),
        LogRecord::Revoke(r) => r.encode(seed, &mut again),
        LogRecord::Commit(c) => c.encode(seed, &mut again),
    }
    let back = decode_log_block(&again, seed).expect("re-encoded block has a header");
    assert_eq!(back.header, view.header);
    assert_eq!(back.record, Ok(record));
});
