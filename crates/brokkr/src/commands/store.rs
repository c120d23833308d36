//! `brokkr store`: maintenance of the store.

use anyhow::{Context as _, Result};
use clap::Subcommand;

use super::seed;

#[derive(Subcommand)]
pub enum StoreCommand {
    /// Re-encrypt every stored secret with the newest key (and encrypt plaintext ones).
    Rekey {
        /// Store URL: sqlite://PATH or postgres://…
        #[arg(long, env = "BROKKR_STORE", default_value = "sqlite://brokkr.db")]
        store: String,
        #[command(flatten)]
        keys: crate::secrets::KeyArgs,
    },
    /// Add many ready instances to the store, for scale benchmarks (see docs/benchmarks.md).
    Seed(seed::SeedArgs),
}

/// Runs one store command.
pub async fn run(command: StoreCommand) -> Result<()> {
    match command {
        StoreCommand::Rekey { store, keys } => rekey(&store, &keys).await,
        StoreCommand::Seed(args) => seed::run(args).await,
    }
}

async fn rekey(url: &str, keys: &crate::secrets::KeyArgs) -> Result<()> {
    let keyring = crate::secrets::keyring(keys, url, false)?
        .context("rekey needs an encryption key (not --insecure-plaintext-secrets)")?;
    let store = brokkr_engine::connect(url, Some(keyring))
        .await
        .with_context(|| format!("cannot open the store {}", brokkr_engine::redact_url(url)))?;
    let n = store.rekey().await?;
    println!("re-encrypted {n} resources");
    Ok(())
}
