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
    /// Forget the platform password `serve` generated (it cannot be shown again: only its
    /// digest is kept); the next `serve` start without configured credentials generates and
    /// prints a new one. Replicas already running keep accepting the old one until restarted.
    ResetPassword {
        /// Store URL: sqlite://PATH or postgres://…
        #[arg(long, env = "BROKKR_STORE", default_value = "sqlite://brokkr.db")]
        store: String,
    },
}

/// Runs one store command.
pub async fn run(command: StoreCommand) -> Result<()> {
    match command {
        StoreCommand::Rekey { store, keys } => rekey(&store, &keys).await,
        StoreCommand::Seed(args) => seed::run(args).await,
        StoreCommand::ResetPassword { store } => reset_password(&store).await,
    }
}

async fn reset_password(url: &str) -> Result<()> {
    let store = brokkr_engine::connect(url, None)
        .await
        .with_context(|| format!("cannot open the store {}", brokkr_engine::redact_url(url)))?;
    if store
        .delete_setting(super::serve::GENERATED_PASSWORD_SETTING)
        .await?
    {
        println!(
            "forgot the generated platform password; the next `brokkr serve` without \
             configured credentials generates and prints a new one"
        );
    } else {
        println!("no generated platform password was stored; nothing changed");
    }
    Ok(())
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
