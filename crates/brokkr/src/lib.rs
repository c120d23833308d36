//! The `brokkr` command as a library, so that a binary of your own can compile in step kinds
//! written in Rust and still be the whole `brokkr` command:
//!
//! ```no_run
//! use std::sync::Arc;
//! use brokkr::step::{StepContext, StepKind, StepOutcome, async_trait};
//!
//! struct Notify;
//!
//! #[async_trait]
//! impl StepKind for Notify {
//!     async fn run(&self, ctx: &StepContext<'_>) -> StepOutcome {
//!         // Call your systems here; the step may run again after a crash, so make it idempotent.
//!         StepOutcome::Done
//!     }
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     brokkr::main_with(brokkr::StepKinds::new().with("notify", Arc::new(Notify)))
//! }
//! ```
//!
//! Commands: `serve` runs the broker; `check`, `catalog` and `render` inspect a configuration;
//! `bench` drives OSB load; `store` maintains the store. examples/custom-step is a complete
//! example.

mod bench;
mod reload;
mod render;
mod secrets;
mod seed;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};

pub use brokkr_engine::step;
use brokkr_engine::step::StepKind;

/// Step kinds written in Rust and compiled into a brokkr binary, by the name blueprints `run`.
#[derive(Clone, Default)]
pub struct StepKinds(Vec<(String, Arc<dyn StepKind>)>);

impl StepKinds {
    /// No step kinds.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `kind` under `name`.
    pub fn with(mut self, name: &str, kind: Arc<dyn StepKind>) -> Self {
        self.0.push((name.to_owned(), kind));
        self
    }

    /// The names, in the order they were added.
    fn names(&self) -> Vec<String> {
        self.0.iter().map(|(name, _)| name.clone()).collect()
    }
}

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

/// Runs the `brokkr` command with the built-in step kinds only.
pub fn main() -> ExitCode {
    main_with(StepKinds::new())
}

/// Runs the `brokkr` command; `serve` also offers `kinds` to blueprints.
pub fn main_with(kinds: StepKinds) -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(args, kinds),
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
