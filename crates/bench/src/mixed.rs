//! `mixed-iops`: 4 KiB random reads and writes, T threads × queue depth Q —
//! where one shared counter touched by every I/O would stop scaling.
//!
//! Both sides are driven the same way: T×Q submitter threads, each with one
//! request in flight (the volume API is synchronous, so this is how jbdev
//! reaches depth Q; the kernel side does the same with `pread`/`pwrite` on
//! an `O_DIRECT` descriptor of the raw backing). Writes are plain (not FUA,
//! not O_SYNC) on both sides.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use jbdev_volume::{BatchPolicy, WriteFlags};
use rand::{Rng, SeedableRng};

use crate::backing::open_kernel;
use crate::ctx::{prefill, stats_json, Ctx};
use crate::error::{io_err, BenchError, Result};
use crate::load::{run_load, Op};
use crate::pattern::pattern_buf;
use crate::report::{Percentile, RunRecord, ScenarioReport, TargetCheck};

/// Arguments of `mixed-iops`.
#[derive(Clone, Debug)]
pub struct MixedParams {
    pub threads: usize,
    pub iodepth: usize,
    pub read_percent: u32,
    pub working_set_bytes: u64,
    pub policy: BatchPolicy,
}

const BLOCK: usize = 4096;

struct Pattern {
    blocks: u64,
    read_percent: u32,
    rng: rand::rngs::StdRng,
}

impl Pattern {
    fn new(p: &MixedParams, slot: usize) -> Pattern {
        Pattern {
            blocks: p.working_set_bytes / BLOCK as u64,
            read_percent: p.read_percent,
            rng: rand::rngs::StdRng::seed_from_u64(0x5eed_0000 + slot as u64),
        }
    }
    /// (offset, is_read)
    fn next(&mut self) -> (u64, bool) {
        let off = self.rng.gen_range(0..self.blocks) * BLOCK as u64;
        (off, self.rng.gen_range(0..100) < self.read_percent)
    }
}

/// `jbdev bench mixed-iops`.
pub fn mixed_iops(ctx: &Ctx<'_>, p: &MixedParams) -> Result<ScenarioReport> {
    let mut rep = ScenarioReport::new("mixed-iops", ctx.backing.name(), &ctx.backing.description);
    if p.working_set_bytes < BLOCK as u64 || p.working_set_bytes > ctx.volume_bytes() {
        return Err(BenchError::InvalidArgument(format!(
            "working set {} bytes must lie within the {}-byte volume",
            p.working_set_bytes,
            ctx.volume_bytes()
        )));
    }
    let slots = p.threads * p.iodepth;

    ctx.progress.step(format!(
        "{} kernel O_DIRECT mixed x{slots}",
        ctx.backing.name()
    ));
    let (file, direct) = open_kernel(&ctx.backing.path, false)?;
    let file = Arc::new(file);
    let path = ctx.backing.path.display().to_string();
    let r = run_load(&ctx.spec(slots), ctx.progress, |i| {
        let (file, path) = (file.clone(), path.clone());
        let mut pat = Pattern::new(p, i);
        let mut buf = pattern_buf(BLOCK, i as u64 + 1);
        Ok(move |_seq: u64| {
            let (off, read) = pat.next();
            if read {
                file.read_exact_at(&mut buf, off)
                    .map_err(io_err(format!("pread {path}")))?;
                Ok(Op::read(BLOCK))
            } else {
                file.write_all_at(&buf, off)
                    .map_err(io_err(format!("pwrite {path}")))?;
                Ok(Op::write(BLOCK))
            }
        })
    })?;
    let mut k = RunRecord::from_load(
        "kernel",
        "O_DIRECT pread/pwrite",
        p.threads,
        p.iodepth,
        BLOCK as u64,
        &r,
    );
    if !direct {
        k.note = "O_DIRECT refused by the backing; buffered".into();
    }
    rep.notes.push(format!("kernel: {}", split_latency(&r)));
    drop(file);
    rep.runs.push(k);

    let vol = ctx.create_volume(p.policy)?;
    // Write the working set once so that reads hit written blocks on both
    // sides (the kernel's backing is already fully allocated).
    ctx.progress.step(format!(
        "{} jbdev prefill {} MiB",
        ctx.backing.name(),
        p.working_set_bytes >> 20
    ));
    prefill(&vol, 0, p.working_set_bytes, 99)?;

    ctx.progress
        .step(format!("{} jbdev mixed x{slots}", ctx.backing.name()));
    let vol_ref = &vol;
    let r = run_load(&ctx.spec(slots), ctx.progress, |i| {
        let mut pat = Pattern::new(p, i);
        let mut buf = pattern_buf(BLOCK, i as u64 + 1);
        Ok(move |_seq: u64| {
            let (off, read) = pat.next();
            if read {
                vol_ref.read_at(&mut buf, off)?;
                Ok(Op::read(BLOCK))
            } else {
                vol_ref.write_at(&buf, off, WriteFlags::NONE)?;
                Ok(Op::write(BLOCK))
            }
        })
    })?;
    let mut j = RunRecord::from_load(
        "jbdev",
        &p.policy.to_string(),
        p.threads,
        p.iodepth,
        BLOCK as u64,
        &r,
    );
    j.volume_stats = stats_json(&vol);
    rep.notes.push(format!("jbdev: {}", split_latency(&r)));
    vol.close()?;
    rep.runs.push(j);

    // The kernel record, then jbdev's, as pushed above.
    let [k, j] = rep.runs.as_slice() else {
        return Ok(rep);
    };
    if matches!(ctx.backing.name(), "ram" | "disk") {
        let name = ctx.backing.name();
        let ops = TargetCheck::ops_vs_kernel(
            format!("mixed-iops {name} IOPS vs kernel"),
            j,
            k,
            // Issue 11: >= 1.0x on ram, >= 1.2x on disk.
            if name == "disk" { 1.2 } else { 1.0 },
            " IOPS",
        );
        let p99 = TargetCheck::latency_vs_kernel(
            format!("mixed-iops {name} p99 latency vs kernel"),
            j,
            k,
            Percentile::P99,
            1.0,
        );
        rep.targets.extend([ops, p99]);
    }
    Ok(rep)
}

/// Reads' and writes' latency apart (which of them makes the tail).
fn split_latency(r: &crate::load::LoadResult) -> String {
    let us = |h: &hdrhistogram::Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    format!(
        "reads p50 {:.0} us, p99 {:.0} us, p99.9 {:.0} us; writes p50 {:.0} us, p99 {:.0} us, p99.9 {:.0} us",
        us(&r.read_latency_ns, 0.5),
        us(&r.read_latency_ns, 0.99),
        us(&r.read_latency_ns, 0.999),
        us(&r.write_latency_ns, 0.5),
        us(&r.write_latency_ns, 0.99),
        us(&r.write_latency_ns, 0.999),
    )
}
