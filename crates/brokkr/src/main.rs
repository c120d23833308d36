//! The `brokkr` command: `serve` runs the broker; `check` and `catalog` inspect a configuration.

mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// brokkr: an Open Service Broker and service-binding system for Kubernetes.
#[derive(Parser)]
#[command(name = "brokkr", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker (OSB API v2.17).
    Serve(serve::ServeArgs),
    /// Validate a configuration and report every problem; exits 1 if there is any.
    Check {
        /// Configuration file or directory (default: the built-in quickstart).
        #[arg(long, short = 'c', env = "BROKKR_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Print the catalog exactly as GET /v2/catalog serves it.
    Catalog {
        /// Configuration file or directory (default: the built-in quickstart).
        #[arg(long, short = 'c', env = "BROKKR_CONFIG")]
        config: Option<PathBuf>,
        /// Output format.
        #[arg(long, short = 'o', value_enum, default_value_t = Format::Json)]
        output: Format,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Json,
    Yaml,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Check { config } => match serve::load_config(config.as_deref()) {
            Ok(c) => {
                let plans: usize = c.catalog.services.iter().map(|s| s.plans.len()).sum();
                println!(
                    "ok: {} services, {plans} plans, every plan with a blueprint",
                    c.catalog.services.len()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Catalog { config, output } => match serve::load_config(config.as_deref()) {
            Ok(c) => {
                let text = match output {
                    Format::Json => {
                        serde_json::to_string_pretty(&c.catalog).map_err(|e| e.to_string())
                    }
                    Format::Yaml => serde_saphyr::to_string(&c.catalog).map_err(|e| e.to_string()),
                };
                match text {
                    Ok(text) => {
                        println!("{}", text.trim_end());
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
    }
}
