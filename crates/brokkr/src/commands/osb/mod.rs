//! `brokkr osb`: the OSB API from the command line, for any broker — what a platform does,
//! one request (and, with `--wait`, its polling) at a time.
//!
//! This module runs a command; the rest lives by idea: `args` (the command line), `broker` (the
//! broker talked to, its catalog, and waiting for an operation), `show` (the commands that only
//! read), `change` (those that change something) and `output` (tables, JSON or YAML, and the
//! progress line).

mod args;
mod broker;
mod change;
pub(crate) mod output;
mod show;

use anyhow::{Context as _, Result};
use serde_json::json;

use args::OsbCommand;
use broker::{Broker, Target};
use change::{bind, deprovision, provision, unbind, update};
use show::{binding, catalog, instance, last_operation};

pub use args::OsbArgs;

/// Runs one `brokkr osb` command.
pub async fn run(args: OsbArgs) -> Result<()> {
    let broker = Broker::connect(&args.broker)?;
    let out = args.output;
    match args.command {
        OsbCommand::Catalog => catalog(&broker, out).await,
        OsbCommand::Provision {
            instance_id,
            plan,
            request,
            context,
        } => {
            let id = instance_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            let context = match context {
                Some(text) => crate::config::parameters(Some(&text))
                    .context("--context")?
                    .as_object()
                    .cloned(),
                None => json!({"platform": "brokkr-cli"}).as_object().cloned(),
            };
            provision(&broker, &id, &plan, &request, context, out).await
        }
        OsbCommand::Update {
            instance_id,
            plan,
            request,
        } => update(&broker, &instance_id, &plan, &request, out).await,
        OsbCommand::Deprovision {
            instance_id,
            plan,
            request,
        } => deprovision(&broker, &instance_id, &plan, &request, out).await,
        OsbCommand::Bind {
            instance_id,
            binding_id,
            predecessor,
            plan,
            request,
        } => {
            let id = binding_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            let binding = Target::binding(&instance_id, &id);
            let predecessor = predecessor.as_deref();
            bind(&broker, binding, predecessor, &plan, &request, out).await
        }
        OsbCommand::Unbind {
            instance_id,
            binding_id,
            plan,
            request,
        } => unbind(&broker, &instance_id, &binding_id, &plan, &request, out).await,
        OsbCommand::Instance { instance_id } => instance(&broker, &instance_id, out).await,
        OsbCommand::Binding {
            instance_id,
            binding_id,
        } => binding(&broker, &instance_id, &binding_id, out).await,
        OsbCommand::LastOperation {
            instance_id,
            binding_id,
            operation,
            plan,
            wait,
        } => {
            let target = Target {
                instance_id: &instance_id,
                binding_id: binding_id.as_deref(),
            };
            last_operation(&broker, target, operation, &plan, wait, out).await
        }
    }
}
