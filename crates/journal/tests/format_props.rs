//! Property tests for the jbd2 on-disk structures: round trips, decoders
//! that never panic on arbitrary bytes (including bytes whose checksum was
//! fixed up so the parser behind the checksum is reached), and detection of
//! every single-bit flip by the checksums.

use jbdev_journal::format::{
    block_tail_checksum, commit_block_checksum, csum_seed, data_block_checksum, escape,
    needs_escape, read_header, unescape, BlockTag, CommitBlock, DescriptorBlock, FormatError,
    JournalSuperblock, RevokeBlock, BLOCKTYPE_COMMIT, BLOCKTYPE_DESCRIPTOR, BLOCKTYPE_REVOKE,
    JBD2_MAGIC, MAX_COMMIT_OVERLAP, MAX_USERS, TAG_FLAG_DELETED, TAG_FLAG_ESCAPE,
};
use proptest::prelude::*;

fn block_size() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1024usize), Just(2048), Just(4096)]
}

fn tag() -> impl Strategy<Value = BlockTag> {
    (
        any::<u64>(),
        prop_oneof![
            Just(0),
            Just(TAG_FLAG_ESCAPE),
            Just(TAG_FLAG_DELETED),
            Just(TAG_FLAG_ESCAPE | TAG_FLAG_DELETED)
        ],
        any::<u32>(),
    )
        .prop_map(|(home_block, flags, checksum)| BlockTag {
            home_block,
            flags,
            checksum,
        })
}

/// A block size and a descriptor that fits it.
fn descriptor() -> impl Strategy<Value = (usize, DescriptorBlock)> {
    block_size().prop_flat_map(|bs| {
        let cap = DescriptorBlock::capacity(bs);
        (
            Just(bs),
            (any::<u32>(), prop::collection::vec(tag(), 1..=cap))
                .prop_map(|(sequence, tags)| DescriptorBlock { sequence, tags }),
        )
    })
}

/// A block size and a revoke block that fits it.
fn revoke() -> impl Strategy<Value = (usize, RevokeBlock)> {
    block_size().prop_flat_map(|bs| {
        let cap = RevokeBlock::capacity(bs);
        (
            Just(bs),
            (any::<u32>(), prop::collection::vec(any::<u64>(), 0..=cap))
                .prop_map(|(sequence, blocks)| RevokeBlock { sequence, blocks }),
        )
    })
}

fn commit() -> impl Strategy<Value = CommitBlock> {
    (
        any::<u32>(),
        any::<u64>(),
        0u32..1_000_000_000,
        0..=MAX_COMMIT_OVERLAP,
    )
        .prop_map(|(sequence, commit_sec, commit_nsec, overlap)| CommitBlock {
            sequence,
            commit_sec,
            commit_nsec,
            overlap,
        })
}

/// A valid superblock: any values where decode checks nothing, valid ones
/// where it checks geometry.
fn superblock() -> impl Strategy<Value = JournalSuperblock> {
    (
        block_size(),
        2u32..=u32::MAX,
        any::<[u8; 16]>(),
        any::<u32>(),
        any::<i32>(),
        any::<(u32, u32, u32)>(),
        prop::collection::vec(any::<[u8; 16]>(), 0..=MAX_USERS),
        any::<(u32, u32, bool)>(),
    )
        .prop_map(
            |(
                bs,
                max_len,
                uuid,
                sequence,
                errno,
                (max_transaction, max_trans_data, session),
                users,
                (first_pick, start_pick, clean),
            )| {
                let mut sb = JournalSuperblock::new(bs as u32, max_len, uuid);
                sb.first = 1 + first_pick % (max_len - 1); // 1..max_len
                sb.start = if clean {
                    0
                } else {
                    sb.first + start_pick % (max_len - sb.first) // first..max_len
                };
                sb.sequence = sequence;
                sb.errno = errno;
                sb.max_transaction = max_transaction;
                sb.max_trans_data = max_trans_data;
                sb.session = session;
                sb.home_id = u64::from(sequence) << 32 | u64::from(session);
                sb.home_path_id = session ^ sequence;
                sb.nr_users = users.len() as u32;
                sb.users = users;
                sb
            },
        )
}

/// Writes a header and a valid tail checksum into arbitrary bytes, so that
/// decoding gets past the checksum and exercises the field checks.
fn fix_up_tail(block: &mut [u8], block_type: u32, seed: u32) {
    block[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
    block[4..8].copy_from_slice(&block_type.to_be_bytes());
    let tail = block.len() - 4;
    let csum = block_tail_checksum(seed, block);
    block[tail..].copy_from_slice(&csum.to_be_bytes());
}

fn is_detected(r: &Result<impl std::fmt::Debug, FormatError>) -> bool {
    r.is_err()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn superblock_round_trip(sb in superblock(), fill in any::<u8>()) {
        let mut block = vec![fill; sb.block_size as usize];
        sb.encode(&mut block);
        prop_assert_eq!(JournalSuperblock::decode(&block).unwrap(), sb);
    }

    #[test]
    fn descriptor_round_trip((bs, d) in descriptor(), uuid in any::<[u8; 16]>(), fill in any::<u8>()) {
        let seed = csum_seed(&uuid);
        let mut block = vec![fill; bs];
        d.encode(&uuid, seed, &mut block);
        prop_assert_eq!(DescriptorBlock::decode(&block, seed).unwrap(), d);
        // The uuid is stored once, right after the first tag.
        prop_assert_eq!(&block[28..44], &uuid[..]);
    }

    #[test]
    fn descriptor_flags_managed_by_encoder((bs, mut d) in descriptor(), junk in any::<u32>()) {
        // Callers' SAME_UUID/LAST_TAG bits (and unknown bits) never reach disk.
        let expected = d.clone();
        for t in &mut d.tags {
            t.flags |= junk & !(TAG_FLAG_ESCAPE | TAG_FLAG_DELETED) & 0xA;
        }
        let mut block = vec![0u8; bs];
        d.encode(&[7; 16], 1, &mut block);
        prop_assert_eq!(DescriptorBlock::decode(&block, 1).unwrap(), expected);
    }

    #[test]
    fn commit_round_trip(c in commit(), bs in block_size(), seed in any::<u32>(), fill in any::<u8>()) {
        let mut block = vec![fill; bs];
        c.encode(seed, &mut block);
        prop_assert_eq!(CommitBlock::decode(&block, seed).unwrap(), c);
    }

    #[test]
    fn revoke_round_trip((bs, r) in revoke(), seed in any::<u32>(), fill in any::<u8>()) {
        let mut block = vec![fill; bs];
        r.encode(seed, &mut block);
        prop_assert_eq!(RevokeBlock::decode(&block, seed).unwrap(), r);
    }

    #[test]
    fn decoders_never_panic_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..5000), seed in any::<u32>()) {
        let _ = JournalSuperblock::decode(&bytes);
        let _ = DescriptorBlock::decode(&bytes, seed);
        let _ = CommitBlock::decode(&bytes, seed);
        let _ = RevokeBlock::decode(&bytes, seed);
        let _ = read_header(&bytes);
        let _ = needs_escape(&bytes);
    }

    #[test]
    fn decoders_behind_fixed_up_checksums_never_panic_and_round_trip(
        bs in block_size(),
        body in prop::collection::vec(any::<u8>(), 4096),
        // Bias toward small counts and known flag values, which random
        // bytes almost never hit.
        small in (0u32..64, 0u32..16),
        seed in any::<u32>(),
    ) {
        let mut block = body[..bs].to_vec();
        // Descriptor: random tags, sometimes with plausible flags.
        for off in (16..bs - 4).step_by(16).take(small.0 as usize) {
            block[off..off + 4].copy_from_slice(&(small.1).to_be_bytes());
        }
        fix_up_tail(&mut block, BLOCKTYPE_DESCRIPTOR, seed);
        if let Ok(d) = DescriptorBlock::decode(&block, seed) {
            let mut again = vec![0u8; bs];
            d.encode(&[1; 16], seed, &mut again);
            prop_assert_eq!(DescriptorBlock::decode(&again, seed).unwrap(), d);
        }

        let mut block = body[..bs].to_vec();
        block[12..16].copy_from_slice(&(16 + 8 * small.0).to_be_bytes());
        fix_up_tail(&mut block, BLOCKTYPE_REVOKE, seed);
        let r = RevokeBlock::decode(&block, seed);
        prop_assert!(r.is_ok(), "plausible r_count rejected: {:?}", r);
        let r = r.unwrap();
        let mut again = vec![0u8; bs];
        r.encode(seed, &mut again);
        prop_assert_eq!(RevokeBlock::decode(&again, seed).unwrap(), r);

        let mut block = body[..bs].to_vec();
        block[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        block[4..8].copy_from_slice(&BLOCKTYPE_COMMIT.to_be_bytes());
        let csum = commit_block_checksum(seed, &block);
        block[16..20].copy_from_slice(&csum.to_be_bytes());
        if let Ok(c) = CommitBlock::decode(&block, seed) {
            let mut again = vec![0u8; bs];
            c.encode(seed, &mut again);
            prop_assert_eq!(CommitBlock::decode(&again, seed).unwrap(), c);
        }

        let mut block = body[..bs].to_vec();
        block[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        block[4..8].copy_from_slice(&4u32.to_be_bytes());
        block[0x28..0x2c].copy_from_slice(&0x13u32.to_be_bytes());
        block[0x50] = 4;
        let csum = JournalSuperblock::checksum_of(&block);
        block[0xfc..0x100].copy_from_slice(&csum.to_be_bytes());
        if let Ok(sb) = JournalSuperblock::decode(&block) {
            let mut again = vec![0u8; sb.block_size as usize];
            sb.encode(&mut again);
            prop_assert_eq!(JournalSuperblock::decode(&again).unwrap(), sb);
        }
    }

    #[test]
    fn superblock_bit_flip_detected(sb in superblock(), bit in 0usize..(1024 * 8)) {
        let mut block = vec![0u8; sb.block_size as usize];
        sb.encode(&mut block);
        block[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(is_detected(&JournalSuperblock::decode(&block)));
    }

    #[test]
    fn descriptor_bit_flip_detected((bs, d) in descriptor(), bit in any::<prop::sample::Index>(), seed in any::<u32>()) {
        let mut block = vec![0u8; bs];
        d.encode(&[3; 16], seed, &mut block);
        let bit = bit.index(bs * 8);
        block[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(is_detected(&DescriptorBlock::decode(&block, seed)));
    }

    #[test]
    fn commit_bit_flip_detected(c in commit(), bs in block_size(), bit in any::<prop::sample::Index>(), seed in any::<u32>()) {
        let mut block = vec![0u8; bs];
        c.encode(seed, &mut block);
        let bit = bit.index(bs * 8);
        block[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(is_detected(&CommitBlock::decode(&block, seed)));
    }

    #[test]
    fn revoke_bit_flip_detected((bs, r) in revoke(), bit in any::<prop::sample::Index>(), seed in any::<u32>()) {
        let mut block = vec![0u8; bs];
        r.encode(seed, &mut block);
        let bit = bit.index(bs * 8);
        block[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(is_detected(&RevokeBlock::decode(&block, seed)));
    }

    #[test]
    fn wrong_seed_detected((bs, d) in descriptor(), r in revoke(), c in commit(), a in any::<u32>(), b in any::<u32>()) {
        prop_assume!(a != b);
        let mut block = vec![0u8; bs];
        d.encode(&[0; 16], a, &mut block);
        prop_assert!(DescriptorBlock::decode(&block, b).is_err());
        c.encode(a, &mut block);
        prop_assert!(CommitBlock::decode(&block, b).is_err());
        let (rbs, r) = r;
        let mut block = vec![0u8; rbs];
        r.encode(a, &mut block);
        prop_assert!(RevokeBlock::decode(&block, b).is_err());
    }

    #[test]
    fn data_checksum_detects_bit_flips_and_sequence(
        data in prop::collection::vec(any::<u8>(), 1024),
        seq in any::<u32>(),
        seed in any::<u32>(),
        bit in 0usize..(1024 * 8),
    ) {
        let good = data_block_checksum(seed, seq, &data);
        let mut bad = data.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        prop_assert_ne!(good, data_block_checksum(seed, seq, &bad));
        prop_assert_ne!(good, data_block_checksum(seed, seq.wrapping_add(1), &data));
    }

    #[test]
    fn escape_unescape(mut data in prop::collection::vec(any::<u8>(), 4..2048), magic in any::<bool>()) {
        if magic {
            data[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        }
        let original = data.clone();
        prop_assert_eq!(needs_escape(&data), magic || data[..4] == JBD2_MAGIC.to_be_bytes());
        if needs_escape(&data) {
            escape(&mut data);
            prop_assert!(!needs_escape(&data));
            prop_assert!(read_header(&data).is_none());
            prop_assert_eq!(&data[4..], &original[4..]);
            unescape(&mut data);
        }
        prop_assert_eq!(data, original);
    }
}

#[test]
fn short_buffers_are_errors_not_panics() {
    for len in [0usize, 3, 11, 12, 59, 60, 512, 1023, 1025, 3000] {
        let block = vec![0xc0; len];
        assert!(JournalSuperblock::decode(&block).is_err(), "len {len}");
        assert!(DescriptorBlock::decode(&block, 0).is_err(), "len {len}");
        assert!(CommitBlock::decode(&block, 0).is_err(), "len {len}");
        assert!(RevokeBlock::decode(&block, 0).is_err(), "len {len}");
    }
    let mut tiny = [0u8; 3];
    escape(&mut tiny);
    unescape(&mut tiny);
    assert_eq!(tiny, [0, 0, 0]);
}

#[test]
fn descriptor_at_full_capacity_and_errors() {
    let seed = csum_seed(&[9; 16]);
    for bs in [1024usize, 4096, 65536] {
        let cap = DescriptorBlock::capacity(bs);
        let d = DescriptorBlock {
            sequence: 1,
            tags: (0..cap as u64)
                .map(|i| BlockTag {
                    home_block: i,
                    flags: 0,
                    checksum: i as u32,
                })
                .collect(),
        };
        let mut block = vec![0u8; bs];
        d.encode(&[9; 16], seed, &mut block);
        assert_eq!(DescriptorBlock::decode(&block, seed).unwrap(), d);
    }

    // No LAST_TAG anywhere: clear it on the one tag of a valid block, fix
    // the checksum, and the decoder must refuse rather than run off the end.
    let d = DescriptorBlock {
        sequence: 1,
        tags: vec![BlockTag {
            home_block: 1,
            flags: 0,
            checksum: 0,
        }],
    };
    let mut block = vec![0u8; 1024];
    d.encode(&[9; 16], seed, &mut block);
    block[12 + 7] &= !8;
    fix_up_tail(&mut block, BLOCKTYPE_DESCRIPTOR, seed);
    assert!(matches!(
        DescriptorBlock::decode(&block, seed),
        Err(FormatError::Invalid(_))
    ));

    // Wrong type is reported as such.
    let c = CommitBlock {
        sequence: 5,
        commit_sec: 1,
        commit_nsec: 2,
        overlap: 0,
    };
    c.encode(seed, &mut block);
    assert!(matches!(
        DescriptorBlock::decode(&block, seed),
        Err(FormatError::BadBlockType {
            expected: 1,
            found: 2
        })
    ));
    assert_eq!(read_header(&block).map(|h| h.sequence), Some(5));
}

#[test]
fn revoke_count_out_of_bounds_rejected() {
    let seed = 77;
    for r_count in [0u32, 15, 17, 1024 - 4 + 8, 1024, u32::MAX] {
        let mut block = vec![0u8; 1024];
        block[12..16].copy_from_slice(&r_count.to_be_bytes());
        fix_up_tail(&mut block, BLOCKTYPE_REVOKE, seed);
        assert!(
            matches!(
                RevokeBlock::decode(&block, seed),
                Err(FormatError::Invalid(_))
            ),
            "r_count {r_count} accepted"
        );
    }
}

#[test]
fn superblock_feature_and_geometry_checks() {
    let good = JournalSuperblock::new(4096, 1024, [5; 16]);
    let mut block = vec![0u8; 4096];
    let mut check = |sb: &JournalSuperblock| {
        sb.encode(&mut block);
        JournalSuperblock::decode(&block)
    };
    assert!(check(&good).is_ok());
    assert!(good.is_clean());

    let mut sb = good.clone();
    sb.feature_incompat |= 0x20; // fast commit
    assert!(matches!(check(&sb), Err(FormatError::NewerFeatures(_))));
    let mut sb = good.clone();
    sb.feature_incompat &= !0x2; // no 64bit
    assert!(matches!(check(&sb), Err(FormatError::Unsupported(_))));
    let mut sb = good.clone();
    sb.feature_incompat &= !0x10; // no CSUM_V3
    assert!(matches!(check(&sb), Err(FormatError::Unsupported(_))));
    let mut sb = good.clone();
    sb.feature_ro_compat = 1;
    assert!(matches!(check(&sb), Err(FormatError::NewerFeatures(_))));
    let mut sb = good.clone();
    sb.feature_compat = 1; // checksum v1
    assert!(matches!(check(&sb), Err(FormatError::Invalid(_))));
    let mut sb = good.clone();
    sb.start = 1024; // past the end
    assert!(matches!(check(&sb), Err(FormatError::Invalid(_))));
    let mut sb = good.clone();
    sb.first = 0;
    assert!(matches!(check(&sb), Err(FormatError::Invalid(_))));
    let mut sb = good.clone();
    sb.block_size = 3000;
    assert!(matches!(check(&sb), Err(FormatError::Invalid(_))));
    let mut sb = good.clone();
    sb.nr_users = 49;
    assert!(matches!(check(&sb), Err(FormatError::Invalid(_))));

    // A corrupted checksum type is refused before the checksum.
    good.encode(&mut block);
    block[0x50] = 1;
    assert!(matches!(
        JournalSuperblock::decode(&block),
        Err(FormatError::Unsupported(_))
    ));
    good.encode(&mut block);
    block[0x20] ^= 1; // s_errno
    assert!(matches!(
        JournalSuperblock::decode(&block),
        Err(FormatError::BadChecksum { .. })
    ));
    good.encode(&mut block);
    block[0] ^= 1;
    assert!(matches!(
        JournalSuperblock::decode(&block),
        Err(FormatError::BadMagic { .. })
    ));
}
