//! The `brokkr` command: `serve` runs the broker; `check` and `catalog` inspect a configuration.

mod bench;
mod reload;
mod render;
mod secrets;
mod seed;
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
    /// Show what a plan's provision (or, with --binding, bind) computes — registry values, the
    /// resources each step applies, credentials — without a store or a target.
    Render(render::RenderArgs),
    /// Drive load against an OSB broker (this one or any other) and report throughput and latency.
    Bench(bench::BenchArgs),
    /// Maintain the store.
    #[command(subcommand)]
    Store(StoreCommand),
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

#[derive(Subcommand)]
enum StoreCommand {
    /// Re-encrypt every stored secret with the newest key (and encrypt plaintext ones).
    Rekey {
        /// Store URL: sqlite://PATH or postgres://…
        #[arg(long, env = "BROKKR_STORE", default_value = "sqlite://brokkr.db")]
        store: String,
        #[command(flatten)]
        keys: secrets::KeyArgs,
    },
    /// Add many ready instances to the store, for scale benchmarks (see docs/benchmarks.md).
    Seed(seed::SeedArgs),
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
        Command::Bench(args) => {
            let result = tokio::runtime::Runtime::new()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(bench::run(args)));
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Render(args) => {
            let config = match serve::load_config(args.config().map(PathBuf::as_path)) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            match render::run(args, &config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Store(StoreCommand::Rekey { store, keys }) => match rekey(&store, &keys) {
            Ok(n) => {
                println!("re-encrypted {n} resources");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Store(StoreCommand::Seed(args)) => {
            let config = match serve::load_config(args.config()) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            let result = tokio::runtime::Runtime::new()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(seed::run(args, &config)));
            match result {
                Ok(n) => {
                    println!("seeded {n} instances");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
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

fn rekey(url: &str, keys: &secrets::KeyArgs) -> anyhow::Result<u64> {
    use anyhow::Context as _;
    let keyring = secrets::keyring(keys, url, false)?
        .context("rekey needs an encryption key (not --insecure-plaintext-secrets)")?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let store = brokkr_engine::connect(url, Some(keyring))
            .await
            .with_context(|| format!("cannot open the store {}", brokkr_engine::redact_url(url)))?;
        Ok(store.rekey().await?)
    })
}
