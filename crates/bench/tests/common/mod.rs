//! Shared by the bench crate's integration tests.
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};

use jbdev_bench::backing::BackingKind;
use jbdev_bench::cli::CommonArgs;
use jbdev_device::Backend;

/// Arguments of a brief run on `device` (a temporary file), results under
/// `dir`; `plots` draws the plots too.
pub fn common(device: PathBuf, dir: &Path, plots: bool) -> CommonArgs {
    CommonArgs {
        backing: vec![BackingKind::Ram],
        slow_flush_ms: 2.0,
        slow_store: jbdev_bench::cli::SlowStore::Ram,
        device: Some(device),
        backing_size: 0,
        backing_dir: dir.to_path_buf(),
        duration: Some(0.3),
        quick: true,
        json: Some(dir.join("report.json")),
        plot_dir: dir.join("plots"),
        no_plots: !plots,
        journal_size: Some(4 << 20),
        backend: Backend::Auto,
        max_batch_us: None,
        direct_write_threshold: None,
        pipeline_depth: None,
        write_pacing: false,
        no_progress: true,
        rounds: 1,
        force: false,
        fail_on_miss: false,
    }
}

/// A `bytes`-long backing file in `dir` for a `--device` run.
pub fn backing_file(dir: &Path, bytes: u64) -> PathBuf {
    let image = dir.join("backing.img");
    let f = std::fs::File::create(&image).unwrap();
    f.set_len(bytes).unwrap();
    image
}

/// Parses `jbdev bench ARGS` as the CLI does.
pub fn parse_bench(args: &[&str]) -> Result<jbdev_bench::cli::BenchCommand, clap::Error> {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: jbdev_bench::cli::BenchCommand,
    }
    Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.cmd)
}
