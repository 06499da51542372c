//! VolumeSuperblock::decode and decode_block (first copy or backup) on
//! arbitrary bytes; on success, encode → decode must give the same
//! superblock.
#![no_main]

use jbdev_volume::superblock::{VolumeSuperblock, VOLUME_MAGIC, VOLUME_VERSION};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Byte 0 bit 0: fix up magic, version, incompat features and checksum
    // so the geometry checks see arbitrary values.
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    let mut buf = rest.to_vec();
    if control & 1 == 1 && buf.len() >= VolumeSuperblock::ENCODED_LEN {
        buf[..8].copy_from_slice(&VOLUME_MAGIC);
        buf[8..12].copy_from_slice(&VOLUME_VERSION.to_le_bytes());
        buf[60..64].fill(0);
        let csum = VolumeSuperblock::checksum_of(&buf);
        buf[508..512].copy_from_slice(&csum.to_le_bytes());
    }
    if let Ok(sb) = VolumeSuperblock::decode(&buf) {
        let mut again = [0u8; VolumeSuperblock::ENCODED_LEN];
        sb.encode(&mut again);
        let back = VolumeSuperblock::decode(&again).expect("re-encoded superblock decodes");
        assert_eq!(back, sb);
    }
    if let Ok((sb, _)) = VolumeSuperblock::decode_block(&buf) {
        let mut block = vec![0u8; sb.block_size as usize];
        sb.encode_block(&mut block);
        let (back, _) = VolumeSuperblock::decode_block(&block).expect("re-encoded block 0 decodes");
        assert_eq!(back, sb);
    }
});
