//! The `brokkr osb` commands that only read (catalog, instance, binding, last operation, which
//! `--wait` polls to its end), and what they print.

use anyhow::{Result, bail};
use brokkr_osb::OperationState;
use brokkr_osb::client::{Error, PlanRef, Poll, StatusCode, WaitOptions};
use serde_json::Value;

use super::args::PlanArgs;
use super::broker::{Broker, Target, explain, wait_showing_progress};
use super::output::{Format, Table, print};

pub(super) async fn catalog(broker: &Broker, out: Format) -> Result<()> {
    let catalog = broker.catalog().await?;
    print(out, &serde_json::to_value(catalog)?, || {
        let mut table = Table::new(vec![
            "SERVICE",
            "PLAN",
            "SERVICE ID",
            "PLAN ID",
            "BINDABLE",
            "DESCRIPTION",
        ]);
        for service in &catalog.services {
            for plan in &service.plans {
                table.row(vec![
                    service.name.clone(),
                    plan.name.clone(),
                    service.id.clone(),
                    plan.id.clone(),
                    plan.is_bindable(service).to_string(),
                    plan.description.clone(),
                ]);
            }
        }
        table
    })
}

pub(super) async fn instance(broker: &Broker, instance_id: &str, out: Format) -> Result<()> {
    let answer = match broker.client.instance(instance_id, None).await {
        Ok(answer) => answer,
        Err(e) if e.status() == Some(StatusCode::NOT_FOUND) => {
            return not_fetched(broker, instance_id, e, out).await;
        }
        Err(e) => return Err(explain(e)),
    };
    let body = answer.body;
    let catalog = broker.catalog().await.ok();
    let names = catalog.and_then(|c| c.plan(&body.service_id, &body.plan_id));
    print(out, &serde_json::to_value(&body)?, || {
        let mut table = Table::new(vec!["INSTANCE", "SERVICE", "PLAN", "DASHBOARD"]);
        let (service, plan) = match names {
            Some((s, p)) => (s.name.clone(), p.name.clone()),
            None => (body.service_id.clone(), body.plan_id.clone()),
        };
        table.row(vec![
            instance_id.to_owned(),
            service,
            plan,
            body.dashboard_url.clone().unwrap_or_default(),
        ]);
        table
    })?;
    // A broker that says the instance is not usable (brokkr: a server it runs is down) tells
    // why in its last operation's description.
    if body.instance_usable == Some(false) {
        let poll = Poll::instance(instance_id);
        let why = (broker.client.last_operation(&poll).await.ok())
            .and_then(|answer| answer.body.description)
            .map(|description| format!(" (last operation: {description})"));
        eprintln!(
            "instance {instance_id:?} is not usable now{}",
            why.unwrap_or_default()
        );
    }
    Ok(())
}

/// An instance the broker does not show: OSB answers its fetch with 404 while its provision
/// runs, once that failed, and once it is deprovisioned. Its last operation, when the broker
/// still tells it, says which: its state and description are printed, and the command fails
/// (exit 1), as there is no instance to show. A broker that knows nothing of it gets the 404.
async fn not_fetched(broker: &Broker, instance_id: &str, e: Error, out: Format) -> Result<()> {
    let Ok(answer) = broker
        .client
        .last_operation(&Poll::instance(instance_id))
        .await
    else {
        return Err(explain(e));
    };
    let last = answer.body;
    print(out, &serde_json::to_value(&last)?, || {
        let mut table = Table::new(vec!["INSTANCE", "LAST OPERATION", "DESCRIPTION"]);
        table.row(vec![
            instance_id.to_owned(),
            last.state.as_str().to_owned(),
            last.description.clone().unwrap_or_default(),
        ]);
        table
    })?;
    let what = match last.state {
        OperationState::InProgress => "is still in progress",
        OperationState::Succeeded => "succeeded",
        OperationState::Failed => "failed",
    };
    bail!("the broker shows no instance {instance_id:?}: its last operation {what}")
}

pub(super) async fn binding(
    broker: &Broker,
    instance_id: &str,
    binding_id: &str,
    out: Format,
) -> Result<()> {
    let answer = broker
        .client
        .binding(instance_id, binding_id, None)
        .await
        .map_err(explain)?;
    let body = answer.body;
    print(out, &serde_json::to_value(&body)?, || {
        let mut table = Table::new(vec![
            "INSTANCE",
            "BINDING",
            "EXPIRES AT",
            "RENEW BEFORE",
            "CREDENTIALS",
        ]);
        let keys: Vec<&str> = body
            .credentials
            .iter()
            .flat_map(|c| c.keys())
            .map(String::as_str)
            .collect();
        // Binding metadata (OSB `expires_at`, `renew_before`): `-` when the broker gives none.
        let metadata = |key: &str| {
            let value = body.metadata.as_ref().and_then(|m| m.get(key));
            match value {
                Some(Value::String(at)) => at.clone(),
                Some(other) => other.to_string(),
                None => "-".to_owned(),
            }
        };
        table.row(vec![
            instance_id.to_owned(),
            binding_id.to_owned(),
            metadata("expires_at"),
            metadata("renew_before"),
            format!("{} (shown with -o json)", keys.join(", ")),
        ]);
        table
    })
}

pub(super) async fn last_operation(
    broker: &Broker,
    target: Target<'_>,
    operation: Option<String>,
    plan_args: &PlanArgs,
    wait_to_end: bool,
    out: Format,
) -> Result<()> {
    let mut poll = target.poll().operation(operation.clone());
    let mut options = WaitOptions::default();
    if let (Some(service), Some(plan)) = (&plan_args.service, &plan_args.plan) {
        let (service, plan) = broker.resolve(service, plan).await?;
        poll = poll.plan(PlanRef::new(&service.id, &plan.id));
        options = options.for_plan(plan);
    }
    let last = if wait_to_end {
        let label = format!("operation of {}", target.describe());
        wait_showing_progress(broker, &poll, &options, label).await?
    } else {
        broker
            .client
            .last_operation(&poll)
            .await
            .map_err(explain)?
            .body
    };
    print(out, &serde_json::to_value(&last)?, || {
        let mut table = Table::new(vec!["STATE", "DESCRIPTION"]);
        table.row(vec![
            last.state.as_str().to_owned(),
            last.description.clone().unwrap_or_default(),
        ]);
        table
    })?;
    if wait_to_end && last.state == OperationState::Failed {
        bail!("the operation of {} failed", target.describe());
    }
    Ok(())
}
