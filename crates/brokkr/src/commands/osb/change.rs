//! The `brokkr osb` commands that change something (provision, update, deprovision, bind,
//! unbind): the request, `--wait`, and what is printed.

use anyhow::{Result, bail};
use brokkr_osb::client::{PlanRef, Response, StatusCode, WaitOptions};
use brokkr_osb::messages::{BindRequest, ProvisionRequest, UpdateRequest};
use brokkr_osb::{OperationState, Plan};
use serde_json::{Map, Value, json};

use super::args::{PlanArgs, RequestArgs, WaitArgs, parameters, required};
use super::broker::{Broker, Target, explain, wait_showing_progress};
use super::output::{Format, Table, print};

/// The outcome of a request that changes something, as printed.
struct Outcome<'a> {
    target: Target<'a>,
    action: &'static str,
    status: StatusCode,
    operation: Option<String>,
    state: OperationState,
    description: Option<String>,
    extra: Map<String, Value>,
}

impl<'a> Outcome<'a> {
    /// What a successful answer to `action` on `target` says, before any `--wait`.
    fn new<T>(
        target: Target<'a>,
        action: &'static str,
        answer: &Response<T>,
        operation: Option<String>,
    ) -> Self {
        Self {
            target,
            action,
            status: answer.status,
            state: state_of(answer),
            operation,
            description: None,
            extra: Map::new(),
        }
    }

    /// With `extra` printed too (a dashboard URL, credentials).
    fn with(mut self, extra: Map<String, Value>) -> Self {
        self.extra = extra;
        self
    }

    fn print(&self, out: Format) -> Result<()> {
        let mut value = json!({
            "instance_id": self.target.instance_id,
            "action": self.action,
            "status": self.status.as_u16(),
            "state": self.state.as_str(),
        });
        let object = value.as_object_mut().expect("an object");
        if let Some(b) = self.target.binding_id {
            object.insert("binding_id".into(), b.into());
        }
        if let Some(op) = &self.operation {
            object.insert("operation".into(), op.clone().into());
        }
        if let Some(d) = &self.description {
            object.insert("description".into(), d.clone().into());
        }
        object.extend(self.extra.clone());
        print(out, &value, || {
            let mut headers = vec!["INSTANCE"];
            let mut row = vec![self.target.instance_id.to_owned()];
            if let Some(b) = self.target.binding_id {
                headers.push("BINDING");
                row.push(b.to_owned());
            }
            headers.extend(["ACTION", "STATE", "OPERATION", "DESCRIPTION"]);
            row.extend([
                self.action.to_owned(),
                self.state.as_str().to_owned(),
                self.operation.clone().unwrap_or_default(),
                self.description
                    .clone()
                    .unwrap_or_else(|| status_text(self.status)),
            ]);
            let mut table = Table::new(headers);
            table.row(row);
            table
        })
    }
}

fn status_text(status: StatusCode) -> String {
    match status {
        StatusCode::OK => "200 OK: already in this state".into(),
        StatusCode::GONE => "410 Gone: did not exist".into(),
        StatusCode::ACCEPTED => "202 Accepted: poll with last-operation, or use --wait".into(),
        s => s.to_string(),
    }
}

/// With `--wait`, polls an accepted operation to its end and records how it ended.
async fn settle(
    broker: &Broker,
    outcome: &mut Outcome<'_>,
    plan: &Plan,
    ids: PlanRef,
    args: &WaitArgs,
) -> Result<()> {
    if outcome.status != StatusCode::ACCEPTED || !args.wait {
        return Ok(());
    }
    let mut poll = outcome
        .target
        .poll()
        .operation(outcome.operation.clone())
        .plan(ids);
    if matches!(outcome.action, "deprovision" | "unbind") {
        poll = poll.deleting();
    }
    let mut options = WaitOptions::default().for_plan(plan);
    if let Some(limit) = args.wait_timeout {
        options.max_duration = Some(limit);
    }
    let label = format!("{} of {}", outcome.action, outcome.target.describe());
    let last = wait_showing_progress(broker, &poll, &options, label).await?;
    outcome.state = last.state;
    outcome.description = last.description;
    Ok(())
}

/// Waits for the operation with `--wait`, then prints the outcome.
async fn finish(
    broker: &Broker,
    mut outcome: Outcome<'_>,
    plan: &Plan,
    ids: PlanRef,
    args: &WaitArgs,
    out: Format,
) -> Result<()> {
    settle(broker, &mut outcome, plan, ids, args).await?;
    report(&outcome, out)
}

/// Prints the outcome; a failed operation makes the command fail.
fn report(outcome: &Outcome<'_>, out: Format) -> Result<()> {
    outcome.print(out)?;
    if outcome.state == OperationState::Failed {
        bail!(
            "{} of {} failed{}",
            outcome.action,
            outcome.target.describe(),
            outcome
                .description
                .as_ref()
                .map(|d| format!(": {d}"))
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// The state a successful answer means: 202 is in progress, anything else is done.
fn state_of<T>(answer: &Response<T>) -> OperationState {
    if answer.is_async() {
        OperationState::InProgress
    } else {
        OperationState::Succeeded
    }
}

pub(super) async fn provision(
    broker: &Broker,
    instance_id: &str,
    plan_args: &PlanArgs,
    args: &RequestArgs,
    context: Option<Map<String, Value>>,
    out: Format,
) -> Result<()> {
    let (service, plan) = broker
        .resolve(
            required(&plan_args.service, "--service")?,
            required(&plan_args.plan, "--plan")?,
        )
        .await?;
    let request = ProvisionRequest {
        service_id: service.id.clone(),
        plan_id: plan.id.clone(),
        context,
        // Deprecated, yet some brokers still require them.
        organization_guid: Some("brokkr-cli".into()),
        space_guid: Some("brokkr-cli".into()),
        parameters: parameters(args)?,
        maintenance_info: plan.maintenance_info.clone(),
    };
    let answer = broker
        .client
        .provision(instance_id, &request, true)
        .await
        .map_err(explain)?;
    let mut extra = Map::new();
    if let Some(url) = &answer.body.dashboard_url {
        extra.insert("dashboard_url".into(), url.clone().into());
    }
    let outcome = Outcome::new(
        Target::instance(instance_id),
        "provision",
        &answer,
        answer.body.operation.clone(),
    )
    .with(extra);
    let ids = PlanRef::new(&service.id, &plan.id);
    finish(broker, outcome, plan, ids, &args.wait, out).await
}

pub(super) async fn update(
    broker: &Broker,
    instance_id: &str,
    plan_args: &PlanArgs,
    args: &RequestArgs,
    out: Format,
) -> Result<()> {
    let (service, plan) = broker.plan_of(instance_id, plan_args).await?;
    let request = UpdateRequest {
        service_id: service.id.clone(),
        plan_id: plan_args.plan.as_ref().map(|_| plan.id.clone()),
        context: json!({"platform": "brokkr-cli"}).as_object().cloned(),
        parameters: parameters(args)?,
        maintenance_info: plan.maintenance_info.clone(),
        ..UpdateRequest::default()
    };
    let answer = broker
        .client
        .update(instance_id, &request, true)
        .await
        .map_err(explain)?;
    let outcome = Outcome::new(
        Target::instance(instance_id),
        "update",
        &answer,
        answer.body.operation.clone(),
    );
    let ids = PlanRef::new(&service.id, &plan.id);
    finish(broker, outcome, plan, ids, &args.wait, out).await
}

pub(super) async fn deprovision(
    broker: &Broker,
    instance_id: &str,
    plan_args: &PlanArgs,
    args: &WaitArgs,
    out: Format,
) -> Result<()> {
    let (service, plan) = broker.plan_of(instance_id, plan_args).await?;
    let ids = PlanRef::new(&service.id, &plan.id);
    let answer = broker
        .client
        .deprovision(instance_id, &ids, true)
        .await
        .map_err(explain)?;
    let outcome = Outcome::new(
        Target::instance(instance_id),
        "deprovision",
        &answer,
        answer.body.operation.clone(),
    );
    finish(broker, outcome, plan, ids, args, out).await
}

/// Binds `target`; with a `predecessor`, as its successor (binding rotation), which the plan
/// must declare `binding_rotatable` (OSB forbids platforms to try otherwise).
pub(super) async fn bind(
    broker: &Broker,
    target: Target<'_>,
    predecessor: Option<&str>,
    plan_args: &PlanArgs,
    args: &RequestArgs,
    out: Format,
) -> Result<()> {
    let instance_id = target.instance_id;
    let binding_id = target.binding_id.unwrap_or_default();
    let (service, plan) = broker.plan_of(instance_id, plan_args).await?;
    if let Some(predecessor) = predecessor {
        if plan.binding_rotatable != Some(true) {
            bail!(
                "cannot rotate binding {predecessor:?}: plan {:?} of service {:?} does not declare \
                 binding_rotatable in the broker's catalog",
                plan.name,
                service.name
            );
        }
        if predecessor == binding_id {
            bail!(
                "binding {binding_id:?} cannot be its own predecessor: give the new binding another id"
            );
        }
    }
    let request = BindRequest {
        service_id: service.id.clone(),
        plan_id: plan.id.clone(),
        context: json!({"platform": "brokkr-cli"}).as_object().cloned(),
        parameters: parameters(args)?,
        predecessor_binding_id: predecessor.map(str::to_owned),
        ..BindRequest::default()
    };
    let answer = broker
        .client
        .bind(instance_id, binding_id, &request, true)
        .await
        .map_err(explain)?;
    let mut outcome = Outcome::new(target, "bind", &answer, answer.body.operation.clone());
    let ids = PlanRef::new(&service.id, &plan.id);
    let mut binding = (!answer.is_async()).then_some(answer.body.binding);
    settle(broker, &mut outcome, plan, ids.clone(), &args.wait).await?;
    if binding.is_none() && args.wait.wait && outcome.state == OperationState::Succeeded {
        // An asynchronous bind's credentials are fetched once it has succeeded.
        let fetched = broker
            .client
            .binding(instance_id, binding_id, Some(&ids))
            .await
            .map_err(explain)?;
        binding = Some(fetched.body);
    }
    if let Some(binding) = binding {
        outcome
            .extra
            .insert("binding".into(), serde_json::to_value(binding)?);
    }
    report(&outcome, out)
}

pub(super) async fn unbind(
    broker: &Broker,
    instance_id: &str,
    binding_id: &str,
    plan_args: &PlanArgs,
    args: &WaitArgs,
    out: Format,
) -> Result<()> {
    let (service, plan) = broker.plan_of(instance_id, plan_args).await?;
    let ids = PlanRef::new(&service.id, &plan.id);
    let answer = broker
        .client
        .unbind(instance_id, binding_id, &ids, true)
        .await
        .map_err(explain)?;
    let outcome = Outcome::new(
        Target::binding(instance_id, binding_id),
        "unbind",
        &answer,
        answer.body.operation.clone(),
    );
    finish(broker, outcome, plan, ids, args, out).await
}
