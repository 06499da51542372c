//! The `jbdev` command.
#![deny(unsafe_code)]
// Parses HTTP and metrics text from sockets: never panic on what it reads.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

use clap::{Parser, Subcommand};

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
    /// Verify superblocks and journal; print what recovery would do.
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
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::Info(_) | Command::Check(_) | Command::Journal { .. } | Command::Stats(_)
    ) {
        // Commands that only print (and read a file or an HTTP reply),
        // whose output may go to `head` or `less`.
        jbdev_device::die_quietly_on_broken_pipe();
    }
    let res = match cli.command {
        Command::Format(a) => admin::format(a),
        Command::Info(a) => admin::info(a),
        Command::Check(a) => admin::check(a),
        Command::Journal { command } => admin::journal(command),
        Command::Serve(a) => serve::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Stats(a) => stats::run(a),
    };
    if let Err(e) = res {
        eprintln!("jbdev: error: {e:#}");
        std::process::exit(1);
    }
}
