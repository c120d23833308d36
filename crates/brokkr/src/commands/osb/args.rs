//! What `brokkr osb` takes on its command line: which broker and how to reach it, the command,
//! and what its requests share (the plan, parameters, waiting).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand};
use serde_json::{Map, Value};

use super::output::Format;

#[derive(Args)]
pub struct OsbArgs {
    #[command(flatten)]
    pub(super) broker: BrokerArgs,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Format::Table, global = true)]
    pub(super) output: Format,
    #[command(subcommand)]
    pub(super) command: OsbCommand,
}

/// Which broker, and how to reach it.
#[derive(Args)]
pub(super) struct BrokerArgs {
    /// The broker's base URL.
    #[arg(long, env = "BROKKR_OSB_URL", global = true)]
    pub(super) url: Option<String>,
    /// Basic auth user name.
    #[arg(long, env = "BROKKR_OSB_USERNAME", global = true)]
    pub(super) username: Option<String>,
    /// Basic auth password; prefer the environment variable over the flag.
    #[arg(
        long,
        env = "BROKKR_OSB_PASSWORD",
        hide_env_values = true,
        global = true
    )]
    pub(super) password: Option<String>,
    /// Bearer token, instead of a user name and password.
    #[arg(long, env = "BROKKR_OSB_TOKEN", hide_env_values = true, global = true)]
    pub(super) token: Option<String>,
    /// Trust only the certificates of this PEM bundle instead of the system's roots.
    #[arg(long, env = "BROKKR_OSB_CA_BUNDLE", global = true)]
    pub(super) ca_bundle: Option<PathBuf>,
    /// Accept any TLS certificate (tests only).
    #[arg(long, global = true)]
    pub(super) insecure_skip_tls_verify: bool,
    /// Time limit of each request.
    #[arg(long, default_value = "30s", value_parser = crate::config::parse_duration, global = true)]
    pub(super) timeout: Duration,
}

#[derive(Subcommand)]
pub(super) enum OsbCommand {
    /// List the broker's services and plans.
    Catalog,
    /// Create an instance (an id is generated and printed when none is given).
    Provision {
        /// Instance id.
        instance_id: Option<String>,
        #[command(flatten)]
        plan: PlanArgs,
        #[command(flatten)]
        request: RequestArgs,
        /// The platform's context: JSON, or @FILE [default: {"platform":"brokkr-cli"}].
        #[arg(long)]
        context: Option<String>,
    },
    /// Change an instance's plan or parameters.
    Update {
        /// Instance id.
        instance_id: String,
        #[command(flatten)]
        plan: PlanArgs,
        #[command(flatten)]
        request: RequestArgs,
    },
    /// Delete an instance.
    Deprovision {
        /// Instance id.
        instance_id: String,
        #[command(flatten)]
        plan: PlanArgs,
        #[command(flatten)]
        request: WaitArgs,
    },
    /// Create a binding (an id is generated and printed when none is given).
    Bind {
        /// Instance id.
        instance_id: String,
        /// Binding id.
        binding_id: Option<String>,
        /// Rotate this binding: the new one gets new credentials and, unless --params is
        /// given, this one's parameters; both work until this one is unbound. Only for plans
        /// the catalog declares binding_rotatable.
        #[arg(long, value_name = "BINDING_ID")]
        predecessor: Option<String>,
        #[command(flatten)]
        plan: PlanArgs,
        #[command(flatten)]
        request: RequestArgs,
    },
    /// Delete a binding.
    Unbind {
        /// Instance id.
        instance_id: String,
        /// Binding id.
        binding_id: String,
        #[command(flatten)]
        plan: PlanArgs,
        #[command(flatten)]
        request: WaitArgs,
    },
    /// Show an instance (brokers with instances_retrievable).
    Instance {
        /// Instance id.
        instance_id: String,
    },
    /// Show a binding; `-o json` or `-o yaml` prints its credentials.
    Binding {
        /// Instance id.
        instance_id: String,
        /// Binding id.
        binding_id: String,
    },
    /// Show the state of an instance's (or, with a binding id, a binding's) last operation.
    LastOperation {
        /// Instance id.
        instance_id: String,
        /// Binding id.
        binding_id: Option<String>,
        /// The operation the broker returned.
        #[arg(long)]
        operation: Option<String>,
        #[command(flatten)]
        plan: PlanArgs,
        /// Poll until the operation ends.
        #[arg(long)]
        wait: bool,
    },
}

/// The service offering and plan a request is about.
#[derive(Args)]
pub(super) struct PlanArgs {
    /// Service offering, by name or id.
    #[arg(long)]
    pub(super) service: Option<String>,
    /// Plan, by name or id.
    #[arg(long)]
    pub(super) plan: Option<String>,
}

/// What the requests that create or change something share: parameters, and waiting.
#[derive(Args)]
pub(super) struct RequestArgs {
    /// Parameters: JSON, or @FILE.
    #[arg(long)]
    pub(super) params: Option<String>,
    #[command(flatten)]
    pub(super) wait: WaitArgs,
}

/// Whether and how long to wait for the operation a request starts.
#[derive(Args)]
pub(super) struct WaitArgs {
    /// Wait until the operation ends; exit 1 if it failed.
    #[arg(long)]
    pub(super) wait: bool,
    /// With --wait: give up after this long [default: the plan's maximum_polling_duration].
    #[arg(long, value_parser = crate::config::parse_duration)]
    pub(super) wait_timeout: Option<Duration>,
}

pub(super) fn required<'a>(value: &'a Option<String>, flag: &str) -> Result<&'a str> {
    value
        .as_deref()
        .with_context(|| format!("{flag} is required (by name or id)"))
}

pub(super) fn parameters(args: &RequestArgs) -> Result<Option<Map<String, Value>>> {
    match &args.params {
        None => Ok(None),
        Some(text) => Ok(crate::config::parameters(Some(text))?.as_object().cloned()),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::OsbArgs;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: OsbArgs,
    }

    #[test]
    fn only_requests_that_carry_parameters_take_them() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["osb"], args].concat()).map(drop);
        for ok in [
            &["provision", "i1", "--params", "{}", "--wait"][..],
            &["update", "i1", "--params", "{}"],
            &["bind", "i1", "b1", "--params", "{}"],
            &["bind", "i1", "b2", "--predecessor", "b1", "--wait"],
            &["deprovision", "i1", "--wait", "--wait-timeout", "1m"],
            &["unbind", "i1", "b1", "--wait"],
        ] {
            assert!(parse(ok).is_ok(), "{ok:?}");
        }
        for refused in [
            &["deprovision", "i1", "--params", "{}"][..],
            &["unbind", "i1", "b1", "--params", "{}"],
        ] {
            let e = parse(refused).unwrap_err().to_string();
            assert!(e.contains("--params"), "{refused:?}: {e}");
        }
    }
}
