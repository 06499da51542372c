//! `jbdev serve` (being written).

#[derive(clap::Args)]
pub struct ServeArgs {}

pub fn run(_a: ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("jbdev serve is not built yet")
}
