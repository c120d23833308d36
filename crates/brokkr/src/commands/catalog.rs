//! `brokkr catalog`: the catalog a configuration serves, exactly as `GET /v2/catalog` returns it.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, ValueEnum};

#[derive(Args)]
pub struct CatalogArgs {
    /// Configuration file or directory (default: the built-in quickstart and local catalogs).
    #[arg(long, short = 'c', env = "BROKKR_CONFIG")]
    config: Option<PathBuf>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Format::Json)]
    output: Format,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Json,
    Yaml,
}

/// Prints the configuration's catalog.
pub async fn run(args: CatalogArgs) -> Result<()> {
    let config = crate::config::load_config(args.config.as_deref())?;
    let text = match args.output {
        Format::Json => serde_json::to_string_pretty(&config.catalog)?,
        Format::Yaml => serde_saphyr::to_string(&config.catalog)?,
    };
    println!("{}", text.trim_end());
    Ok(())
}
