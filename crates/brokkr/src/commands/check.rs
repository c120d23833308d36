//! `brokkr check`: validates a configuration and reports every problem.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct CheckArgs {
    /// Configuration file or directory (default: the built-in quickstart).
    #[arg(long, short = 'c', env = "BROKKR_CONFIG")]
    config: Option<PathBuf>,
}

/// Loads the configuration; every error it has makes the command fail.
pub async fn run(args: CheckArgs) -> Result<()> {
    let config = crate::config::load_config(args.config.as_deref())?;
    let plans: usize = config.catalog.services.iter().map(|s| s.plans.len()).sum();
    println!(
        "ok: {} services, {plans} plans, every plan with a blueprint",
        config.catalog.services.len()
    );
    Ok(())
}
