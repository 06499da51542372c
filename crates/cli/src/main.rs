//! The `jbdev` command.
#![deny(unsafe_code)]
// Parses HTTP and metrics text from sockets: never panic on what it reads.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]
// Output goes through `outln!`/`out!`: `println!` panics on a closed pipe.
#![deny(clippy::print_stdout)]

use clap::{Parser, Subcommand};

// `outln!`/`out!`: printing that returns an error instead of panicking
// when stdout is gone (crates/device/src/stdout.rs; `jbdev bench` shares it).
#[macro_use]
extern crate jbdev_device;

use jbdev_device::stdout::StdoutError;

/// Exit status of a command-line usage error (sysexits.h `EX_USAGE`): apart
/// from `check`'s 2 (corruption found) and the 1 of every other failure.
const EXIT_USAGE: i32 = 64;

/// A command-line mistake found after parsing: a value clap cannot judge on
/// its own (a size against the block size, a flag that needs another, an
/// `--export` spec). `main` exits [`EXIT_USAGE`] for it, like for clap's own
/// usage errors, so a script can tell a typo from a failure.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// `anyhow::bail!` for a [`UsageError`] (exit 64).
macro_rules! usage_bail {
    ($($arg:tt)+) => {
        return Err(anyhow::Error::new($crate::UsageError(format!($($arg)+))))
    };
}

/// `anyhow::ensure!` for a [`UsageError`] (exit 64).
macro_rules! usage_ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            usage_bail!($($arg)+);
        }
    };
}

/// Exit status after stdout went away (a closed pipe): what a shell
/// reports for a command killed by SIGPIPE (128 + 13).
const EXIT_BROKEN_PIPE: i32 = 141;

mod admin;
mod bench;
mod metrics;
mod serve;
mod stats;

#[derive(Parser)]
#[command(name = "jbdev", version, about = "A user-space journaled block device")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a volume on a file (created if missing) or a block device.
    Format(admin::FormatArgs),
    /// Print the superblocks and journal state of a volume.
    Info(admin::InfoArgs),
    /// Grow a volume that is not open: extend its file or RBD image (or use
    /// more of its block device) and record the larger size. Shrinking is
    /// refused.
    Grow(admin::GrowArgs),
    /// Verify superblocks and journal; print what recovery would do. Exit
    /// status 0 ok, 2 corruption of a jbdev volume or journal, 1 anything
    /// else (not a volume, wrong --journal, device error); usage errors 64.
    Check(admin::CheckArgs),
    /// Inspect the journal.
    Journal {
        #[command(subcommand)]
        command: admin::JournalCommand,
    },
    /// Serve volumes over NBD.
    Serve(serve::ServeArgs),
    /// Run benchmarks against the kernel's own durable-write path.
    Bench(bench::BenchArgs),
    /// Show a running server's metrics (`jbdev serve --metrics`) as a table.
    Stats(stats::StatsArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("JBDEV_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: a log file or journald gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            let asked = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion);
            // clap writes help to stdout and errors to stderr. Help that
            // could not be written (a full disk, a closed pipe) is a failed
            // command, as any other output that fails; a usage error stays
            // one whether or not its message got out.
            let printed = e
                .print()
                .and_then(|()| std::io::Write::flush(&mut std::io::stdout()));
            match printed {
                Err(w) if asked && w.kind() == std::io::ErrorKind::BrokenPipe => {
                    std::process::exit(EXIT_BROKEN_PIPE)
                }
                Err(w) if asked => {
                    eprintln!("jbdev: error: writing to stdout: {w}");
                    std::process::exit(1)
                }
                _ => std::process::exit(if asked { e.exit_code() } else { EXIT_USAGE }),
            }
        }
    };
    if !matches!(cli.command, Command::Serve(_) | Command::Bench(_)) {
        // Commands whose output may go to `head` or `less`: a closed pipe
        // ends them quietly (SIGPIPE, like any Unix filter). `format` prints
        // only after its work is done, so this never cuts a format short.
        // serve keeps SIGPIPE ignored: its sockets must not kill it.
        jbdev_device::die_quietly_on_broken_pipe();
    }
    let res = match cli.command {
        Command::Format(a) => admin::format(a),
        Command::Info(a) => admin::info(a),
        Command::Grow(a) => admin::grow(a),
        Command::Check(a) => admin::check(a),
        Command::Journal { command } => admin::journal(command),
        Command::Serve(a) => serve::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Stats(a) => stats::run(a),
    };
    if let Err(e) = res {
        if e.downcast_ref::<StdoutError>()
            .is_some_and(StdoutError::is_broken_pipe)
        {
            std::process::exit(EXIT_BROKEN_PIPE);
        }
        eprintln!("jbdev: error: {e:#}");
        let usage = e.chain().any(|c| c.is::<UsageError>());
        std::process::exit(if usage { EXIT_USAGE } else { 1 });
    }
}
