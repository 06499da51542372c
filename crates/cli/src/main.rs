//! The `jbdev` command.
#![deny(unsafe_code)]

use clap::{Parser, Subcommand};

mod bench;
mod serve;

#[derive(Parser)]
#[command(name = "jbdev", version, about = "A user-space journaled block device")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve volumes over NBD.
    Serve(serve::ServeArgs),
    /// Run benchmarks against the kernel's own durable-write path.
    Bench(bench::BenchArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("JBDEV_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Serve(a) => serve::run(a),
        Command::Bench(a) => bench::run(a),
    };
    if let Err(e) = res {
        eprintln!("jbdev: error: {e:#}");
        std::process::exit(1);
    }
}
