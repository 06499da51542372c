//! `jbdev bench`: the benchmark suite (crates/bench), side by side with the
//! kernel's own durable-write path on the same backing.

/// Arguments of `jbdev bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub scenario: jbdev_bench::cli::BenchCommand,
}

use jbdev_bench::BenchError;

/// Exit status of `jbdev bench --fail-on-miss` when a target was missed
/// (the run itself succeeded; an error exits 1).
const EXIT_TARGET_MISSED: i32 = 2;

/// Runs the chosen scenario(s); tables go to stdout, plots and JSON to the
/// paths given.
pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    if let jbdev_bench::cli::BenchCommand::SyncWriters(s) = &a.scenario {
        if let Some(target) = &s.target {
            return rbd_sync_writers(target, s);
        }
    }
    // The flags are checked before anything is set up: their refusals are
    // usage errors (exit 64), not failures of a run.
    if let Err(BenchError::InvalidArgument(m)) = jbdev_bench::plans(&a.scenario) {
        usage_bail!("{m}");
    }
    let report = jbdev_bench::run(&a.scenario).map_err(stdout_error)?;
    let missed = report.final_targets().iter().filter(|t| !t.met).count();
    if missed > 0 {
        // A missed target is a finding, not a failure of the tool: the exit
        // status says so only when asked (a CI gate).
        eprintln!("jbdev bench: {missed} target(s) missed; see the table above");
        if a.scenario.common().fail_on_miss {
            std::process::exit(EXIT_TARGET_MISSED);
        }
    }
    Ok(())
}

#[cfg(feature = "rbd")]
fn rbd_sync_writers(target: &str, s: &jbdev_bench::cli::SyncWritersArgs) -> anyhow::Result<()> {
    jbdev_bench::rbd::sync_writers(target, s, &mut std::io::stdout()).map_err(stdout_error)?;
    Ok(())
}

#[cfg(not(feature = "rbd"))]
fn rbd_sync_writers(target: &str, _s: &jbdev_bench::cli::SyncWritersArgs) -> anyhow::Result<()> {
    anyhow::bail!("--target {target}: this jbdev was built without rbd support (rebuild with `--features rbd`)")
}

/// A bench error, with a failed write to stdout as the [`StdoutError`] that
/// `main` looks for (a closed pipe ends the command quietly, exit 141) and
/// an invalid argument as a usage error (exit 64).
///
/// [`StdoutError`]: jbdev_device::stdout::StdoutError
fn stdout_error(e: BenchError) -> anyhow::Error {
    match e {
        BenchError::Stdout(s) => s.into(),
        // Refusals of the flags that need the run's context to judge (a
        // backing too small for the journal, a stream that does not fit
        // the volume) are usage errors too: exit 64, like `plans`' ones.
        BenchError::InvalidArgument(m) => anyhow::Error::new(crate::UsageError(m)),
        e => e.into(),
    }
}
