//! `jbdev bench` (being written).

#[derive(clap::Args)]
pub struct BenchArgs {}

pub fn run(_a: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("jbdev bench is not built yet")
}
