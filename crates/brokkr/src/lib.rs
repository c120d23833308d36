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
//! `osb` calls any OSB broker as a platform does; `upgrade` runs fleet upgrades; `bench` drives
//! OSB load; `store` maintains the
//! store; `crds` prints the Kubernetes controllers' CustomResourceDefinitions and `controller`
//! runs the controllers. examples/custom-step is a complete example.

mod commands;
mod config;
mod reload;
mod secrets;
mod step_kinds;
mod versions;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use commands::{bench, catalog, check, controller, crds, osb, render, serve, store, upgrade};

pub use brokkr_engine::step;
pub use step_kinds::StepKinds;

/// The commit this binary was built from (build.rs; `unknown` without git or `BROKKR_COMMIT`).
pub const COMMIT: &str = env!("BROKKR_COMMIT");
/// When this binary was built, RFC 3339 UTC (build.rs; `BROKKR_BUILD_DATE` when given).
pub const BUILD_DATE: &str = env!("BROKKR_BUILD_DATE");
/// What `brokkr --version` prints after the name: version, commit, build date.
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("BROKKR_COMMIT"),
    ", built ",
    env!("BROKKR_BUILD_DATE"),
    ")"
);

/// brokkr: an Open Service Broker and service-binding system for Kubernetes.
#[derive(Parser)]
#[command(name = "brokkr", version = LONG_VERSION, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker (OSB API v2.17).
    Serve(serve::ServeArgs),
    /// Validate a configuration and report every problem; exits 1 if there is any.
    Check(check::CheckArgs),
    /// Show what a plan's provision (or, with --binding, bind) computes — registry values, the
    /// resources each step applies, credentials — without a store or a target.
    Render(render::RenderArgs),
    /// Drive load against an OSB broker (this one or any other) and report throughput and latency.
    Bench(bench::BenchArgs),
    /// Maintain the store.
    #[command(subcommand)]
    Store(store::StoreCommand),
    /// Print the catalog exactly as GET /v2/catalog serves it.
    Catalog(catalog::CatalogArgs),
    /// Call any OSB broker as a platform does: catalog, provision, bind, … (`--wait` to poll).
    Osb(osb::OsbArgs),
    /// Upgrade every instance of a plan to its maintenance version, in waves, through the
    /// broker's admin API; follow, pause, resume or cancel it.
    Upgrade(upgrade::UpgradeArgs),
    /// Print the CustomResourceDefinitions of brokkr's Kubernetes controllers.
    Crds(crds::CrdsArgs),
    /// Run the Kubernetes controllers (brokers, their catalogs, service instances) against the
    /// cluster that KUBECONFIG or the in-cluster configuration names.
    Controller(controller::ControllerArgs),
    /// Print the version, the commit and the build date.
    Version,
}

/// Runs the `brokkr` command with the built-in step kinds only.
pub fn main() -> ExitCode {
    main_with(StepKinds::new())
}

/// Runs the `brokkr` command; `serve` also offers `kinds` to blueprints. Every command runs on one
/// runtime, and its error, if any, is printed here and makes the exit code 1.
pub fn main_with(kinds: StepKinds) -> ExitCode {
    let cli = Cli::parse();
    let runtime = match &cli.command {
        Command::Controller(_) => {
            controller::without_huge_pages();
            controller::runtime()
        }
        _ => tokio::runtime::Runtime::new(),
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve::run(args, kinds).await,
            Command::Check(args) => check::run(args).await,
            Command::Render(args) => render::run(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Store(command) => store::run(command).await,
            Command::Catalog(args) => catalog::run(args).await,
            Command::Osb(args) => osb::run(args).await,
            Command::Upgrade(args) => upgrade::run(args).await,
            Command::Crds(args) => crds::run(args).await,
            Command::Controller(args) => controller::run(args).await,
            Command::Version => {
                println!(
                    "brokkr {}\ncommit: {COMMIT}\nbuilt: {BUILD_DATE}",
                    env!("CARGO_PKG_VERSION")
                );
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Configuration errors arrive already formatted, one `error:` line each.
            let text = format!("{e:#}");
            if text.starts_with("error: ") {
                eprintln!("{text}");
            } else {
                eprintln!("error: {text}");
            }
            ExitCode::FAILURE
        }
    }
}
