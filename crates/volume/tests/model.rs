//! Property tests of the volume against a `Vec<u8>` model (issue 2, tests).
//!
//! Random sequences of write (unaligned, any size up to a few blocks, FUA or
//! not), trim, write_zeroes, multi-extent transactions, flush and
//! close + reopen run on a volume over a [`MemDevice`] with a small journal
//! (so checkpoints and wrap-around happen); after every op a random range
//! and, at the end, the whole volume must read back exactly as the model
//! says. Out-of-range requests must fail without changing anything.

mod common;

use std::sync::Arc;

use common::*;
use jbdev_device::mem::MemDevice;
use jbdev_volume::{OpenOptions, Volume, VolumeError};
use proptest::prelude::*;

const DATA_BYTES: u64 = 64 * 1024;
const JOURNAL_BYTES: u64 = 64 * 1024;

#[derive(Clone, Debug)]
enum Op {
    Write {
        off: u64,
        len: u64,
        fua: bool,
    },
    Trim {
        off: u64,
        len: u64,
    },
    Zeroes {
        off: u64,
        len: u64,
        fua: bool,
    },
    /// Extents: `(offset, len, zero?)`.
    Txn {
        extents: Vec<(u64, u64, bool)>,
        fua: bool,
    },
    Flush,
    Reopen,
    /// A request reaching `extra` bytes past the end from `back` bytes
    /// before it (or overflowing u64): must fail, change nothing.
    OutOfRange {
        back: u64,
        extra: u64,
        overflow: bool,
    },
    Read {
        off: u64,
        len: u64,
    },
}

fn range(max_len: u64) -> impl Strategy<Value = (u64, u64)> {
    (0..DATA_BYTES, 1..=max_len).prop_map(|(off, len)| (off, len.min(DATA_BYTES - off)))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (range(3 * BLOCK), any::<bool>()).prop_map(|((off, len), fua)| Op::Write { off, len, fua }),
        // Block-aligned multi-block writes too.
        3 => (0..DATA_BYTES / BLOCK, 1..=4u64, any::<bool>()).prop_map(|(b, n, fua)| {
            let n = n.min(DATA_BYTES / BLOCK - b);
            Op::Write { off: b * BLOCK, len: n * BLOCK, fua }
        }),
        2 => range(4 * BLOCK).prop_map(|(off, len)| Op::Trim { off, len }),
        2 => (range(4 * BLOCK), any::<bool>()).prop_map(|((off, len), fua)| Op::Zeroes { off, len, fua }),
        3 => (proptest::collection::vec((range(BLOCK + 700), any::<bool>()), 1..4), any::<bool>())
            .prop_map(|(ex, fua)| Op::Txn {
                extents: ex.into_iter().map(|((o, l), z)| (o, l, z)).collect(),
                fua,
            }),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
        1 => (0..4096u64, 1..4096u64, proptest::bool::weighted(0.2))
            .prop_map(|(back, extra, overflow)| Op::OutOfRange { back, extra, overflow }),
        3 => range(3 * BLOCK).prop_map(|(off, len)| Op::Read { off, len }),
    ]
}

fn open(dev: &Arc<MemDevice>) -> Volume {
    Volume::open_device(dev.clone(), None, &verify_open_options()).expect("open")
}

fn check_read(vol: &Volume, model: &[u8], off: u64, len: u64) -> Result<(), TestCaseError> {
    let mut buf = vec![0u8; len as usize];
    vol.read_at(&mut buf, off)
        .map_err(|e| TestCaseError::fail(format!("read {off}+{len}: {e}")))?;
    let want = &model[off as usize..(off + len) as usize];
    if buf != want {
        let at = buf.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0) as u64 + off;
        return Err(TestCaseError::fail(format!(
            "read {off}+{len} differs from the model first at byte {at}"
        )));
    }
    Ok(())
}

/// Runs `ops` on the volume `open` opens (freshly formatted, reopened by
/// `Op::Reopen`), checking every read against the model; closes it and
/// returns the model.
fn run_model(ops: &[Op], open: &dyn Fn() -> Volume) -> Result<Vec<u8>, TestCaseError> {
    let mut vol = open();
    prop_assert!(vol.size() >= DATA_BYTES);
    let size = vol.size();
    // A freshly formatted volume reads as zeroes.
    let mut model = vec![0u8; size as usize];
    check_read(&vol, &model, 0, size)?;
    let max_tx = vol.max_transaction_bytes();
    for (i, op) in ops.iter().enumerate() {
        let id = i as u64 + 1;
        match op {
            Op::Write { off, len, fua } => {
                let data = stamped(id, *off, *len as usize);
                vol.write_at(&data, *off, flags(*fua)).expect("write");
                model[*off as usize..(*off + *len) as usize].copy_from_slice(&data);
                check_read(&vol, &model, *off, *len)?;
            }
            Op::Trim { off, len } => {
                vol.trim(*off, *len, flags(false)).expect("trim");
                model[*off as usize..(*off + *len) as usize].fill(0);
                check_read(&vol, &model, *off, *len)?;
            }
            Op::Zeroes { off, len, fua } => {
                vol.write_zeroes(*off, *len, flags(*fua))
                    .expect("write_zeroes");
                model[*off as usize..(*off + *len) as usize].fill(0);
                check_read(&vol, &model, *off, *len)?;
            }
            Op::Txn { extents, fua } => {
                let blocks: u64 = extents
                    .iter()
                    .map(|&(o, l, _)| (o + l - 1) / BLOCK - o / BLOCK + 1)
                    .sum();
                let mut tx = vol.transaction();
                let mut next = model.clone();
                let mut refused = false;
                for &(o, l, zero) in extents {
                    let added = if zero {
                        tx.write_zeroes(o, l).map(|_| ())
                    } else {
                        tx.write(&stamped(id, o, l as usize), o).map(|_| ())
                    };
                    match added {
                        Ok(()) if zero => next[o as usize..(o + l) as usize].fill(0),
                        Ok(()) => next[o as usize..(o + l) as usize]
                            .copy_from_slice(&stamped(id, o, l as usize)),
                        // Allowed only when the transaction is really too
                        // big; the test then drops it (nothing applied).
                        Err(VolumeError::TooLarge { .. }) if blocks * BLOCK > max_tx => {
                            refused = true;
                            break;
                        }
                        Err(e) => {
                            prop_assert!(false, "adding to a {blocks}-block transaction: {e}")
                        }
                    }
                }
                if !refused {
                    match tx.commit(flags(*fua)) {
                        Ok(()) => model = next,
                        Err(e) => prop_assert!(false, "commit of {blocks} blocks failed: {e}"),
                    }
                }
                check_read(&vol, &model, 0, size)?;
            }
            Op::Flush => vol.flush().expect("flush"),
            Op::Reopen => {
                vol.close().expect("close");
                vol = open();
                check_read(&vol, &model, 0, size)?;
            }
            Op::OutOfRange {
                back,
                extra,
                overflow,
            } => {
                let (off, len) = if *overflow {
                    (u64::MAX - back, back + extra + 1)
                } else {
                    (size - back, back + extra)
                };
                let data = vec![1u8; len as usize];
                prop_assert!(vol.write_at(&data, off, flags(false)).is_err());
                prop_assert!(vol.write_zeroes(off, len, flags(false)).is_err());
                prop_assert!(vol.trim(off, len, flags(false)).is_err());
                let mut tx = vol.transaction();
                prop_assert!(tx.write(&data, off).is_err());
                let mut buf = vec![0u8; len as usize];
                prop_assert!(vol.read_at(&mut buf, off).is_err());
                check_read(&vol, &model, size - 8192, 8192)?;
            }
            Op::Read { off, len } => check_read(&vol, &model, *off, *len)?,
        }
    }
    check_read(&vol, &model, 0, size)?;
    vol.close().expect("close");
    Ok(model)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn volume_matches_vec_model(ops in proptest::collection::vec(op(), 1..60)) {
        let geo = Geometry { data_bytes: DATA_BYTES, journal_bytes: JOURNAL_BYTES };
        let dev = Arc::new(MemDevice::new(geo.device_bytes(), SECTOR as u32));
        Volume::format_device(dev.clone(), None, &geo.format_options()).expect("format");
        let model = run_model(&ops, &|| open(&dev))?;
        let size = model.len() as u64;
        // What is on the device after a clean close is the model.
        let vol = Volume::open_device(
            Arc::new(MemDevice::from_image(dev.image(), SECTOR as u32)),
            None,
            &OpenOptions::default(),
        )
        .expect("open copy");
        check_read(&vol, &model, 0, size)?;
    }
}

/// The same model-checked workload on volumes homed on a Ceph RBD image
/// (the throwaway test cluster), with each journal placement: internal (in
/// the RBD home), a local file, and a second RBD image. Every reopen goes
/// through `Volume::open` on the target string, as `jbdev serve` does.
#[cfg(feature = "rbd")]
mod rbd {
    use super::*;
    use jbdev_device::rbd::test_cluster;
    use jbdev_volume::{FormatOptions, JournalPlacement};

    #[derive(Clone, Copy, Debug)]
    enum Placement {
        Internal,
        LocalFile,
        Rbd,
    }

    fn run_on_rbd(placement: Placement, ops: &[Op]) -> Result<(), TestCaseError> {
        let conf = match test_cluster::ensure() {
            Ok(c) => c,
            Err(why) => {
                println!("SKIP: {why}");
                return Ok(());
            }
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let home = test_cluster::target(&conf, &test_cluster::unique_image("model"));
        let mut f = FormatOptions::new(DATA_BYTES);
        f.journal_bytes = Some(JOURNAL_BYTES);
        f.block_size = BLOCK as u32;
        f.journal = match placement {
            Placement::Internal => JournalPlacement::Internal,
            Placement::LocalFile => JournalPlacement::External(dir.path().join("journal")),
            Placement::Rbd => JournalPlacement::External(
                test_cluster::target(&conf, &test_cluster::unique_image("model-j")).into(),
            ),
        };
        let opts = verify_open_options();
        Volume::create(home.as_ref(), &f, &opts)
            .expect("format on rbd")
            .close()
            .expect("close");
        let open = || Volume::open(home.as_ref(), &opts).expect("open on rbd");
        let model = run_model(ops, &open)?;
        // A fresh read-only open (another client) sees the model.
        let ro = Volume::open(
            home.as_ref(),
            &OpenOptions {
                read_only: true,
                ..OpenOptions::default()
            },
        )
        .expect("read-only open");
        assert_eq!(ro.backend_name(), "rbd");
        check_read(&ro, &model, 0, model.len() as u64)
    }

    proptest! {
        // Each case formats fresh images and reconnects on every reopen:
        // few cases, short sequences.
        #![proptest_config(ProptestConfig::with_cases(6))]

        #[test]
        fn rbd_home_internal_journal_matches_model(ops in proptest::collection::vec(op(), 1..40)) {
            run_on_rbd(Placement::Internal, &ops)?;
        }

        #[test]
        fn rbd_home_local_journal_matches_model(ops in proptest::collection::vec(op(), 1..40)) {
            run_on_rbd(Placement::LocalFile, &ops)?;
        }

        #[test]
        fn rbd_home_rbd_journal_matches_model(ops in proptest::collection::vec(op(), 1..40)) {
            run_on_rbd(Placement::Rbd, &ops)?;
        }
    }
}
