//! format, info, check, journal dump.

use std::path::PathBuf;

use anyhow::Context;
use jbdev_volume::{FormatOptions, JournalPlacement, OpenOptions, Volume};

use crate::size::parse_size;

#[derive(clap::Args)]
pub struct FormatArgs {
    /// Image file (created if missing) or block device.
    pub path: PathBuf,
    /// Size users see, e.g. 1G (default: the whole block device).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Journal size, e.g. 64M.
    #[arg(long, value_parser = parse_size)]
    pub journal_size: Option<u64>,
    /// Put the journal in this separate file or device.
    #[arg(long)]
    pub journal: Option<PathBuf>,
    /// Block size in bytes.
    #[arg(long, default_value_t = 4096)]
    pub block_size: u32,
}

pub fn format(a: FormatArgs) -> anyhow::Result<()> {
    let size = a.size.context("--size is required (e.g. --size 1G)")?;
    let mut f = FormatOptions::new(size);
    f.block_size = a.block_size;
    f.journal_bytes = a.journal_size;
    if let Some(j) = a.journal {
        f.journal = JournalPlacement::External(j);
    }
    let v = Volume::create(&a.path, &f, &OpenOptions::default())
        .with_context(|| format!("formatting {}", a.path.display()))?;
    v.close()?;
    println!("formatted {}: {} bytes", a.path.display(), size);
    Ok(())
}

#[derive(clap::Args)]
pub struct InfoArgs {
    pub path: PathBuf,
    #[arg(long)]
    pub journal: Option<PathBuf>,
}

pub fn info(_a: InfoArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}

#[derive(clap::Args)]
pub struct CheckArgs {
    pub path: PathBuf,
    #[arg(long)]
    pub journal: Option<PathBuf>,
}

pub fn check(_a: CheckArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}

#[derive(clap::Subcommand)]
pub enum JournalCommand {
    /// Print every block of the journal log.
    Dump {
        path: PathBuf,
        #[arg(long)]
        journal: Option<PathBuf>,
    },
}

pub fn journal(_c: JournalCommand) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
