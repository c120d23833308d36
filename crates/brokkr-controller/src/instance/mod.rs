//! The ServiceInstance controller, first part: the class and plan are resolved from the
//! catalog resources (waiting up to an hour for them to appear), the instance is provisioned with
//! `accepts_incomplete=true` behind a finalizer, `last_operation` is polled with the broker's
//! `Retry-After` or a backoff from 1 s doubling to 5 min until the plan's
//! `maximumPollingDuration` (else 7 days), and deleting the resource deprovisions it, unless
//! ServiceBindings still name it (then the condition says so and it waits). Not yet: updates,
//! `parametersFrom`, orphan mitigation, cascade deletion and abandoning.

use std::sync::Arc;
use std::time::Duration;

use brokkr_osb::client::{Error as OsbError, Poll, Response};
use brokkr_osb::messages::{LastOperation, OperationState, ProvisionRequest};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt as _};
use serde_json::{Map, Value, json};

mod resolve;

use resolve::{Resolved, resolve};

use crate::Context;
use crate::broker::Error;
use crate::conditions;
use crate::resources::{
    ConditionStatus, DeprovisionStatus, ProvisionStatus, ServiceBinding, ServiceInstance,
    ServiceInstanceOperation, ServiceInstancePropertiesState, ServiceInstanceStatus,
};

/// The finalizer that keeps a ServiceInstance until the broker has deprovisioned it.
pub const FINALIZER: &str = "services.brokkr.dev/service-instance";
/// How long an instance waits for its class and plan to appear in a catalog.
const CATALOG_WAIT: Duration = Duration::from_secs(60 * 60);
/// The longest pause between polls.
const MAX_BACKOFF: Duration = Duration::from_secs(5 * 60);
/// How often to look again at something only a person can change.
const RECHECK: Duration = Duration::from_secs(10);

/// Reconciles one ServiceInstance.
pub async fn reconcile(instance: Arc<ServiceInstance>, ctx: Arc<Context>) -> Result<Action, Error> {
    let result = reconcile_inner(&instance, &ctx).await;
    ctx.metrics.reconciled("ServiceInstance", result.is_err());
    if let Err(e) = &result {
        tracing::warn!(namespace = %instance.namespace().unwrap_or_default(), instance = %instance.name_any(), error = %e, "reconcile failed");
    }
    result
}

/// What to do after a failed reconcile: try again soon.
pub fn error_policy(_: Arc<ServiceInstance>, _: &Error, _: Arc<Context>) -> Action {
    Action::requeue(RECHECK)
}

async fn reconcile_inner(instance: &ServiceInstance, ctx: &Context) -> Result<Action, Error> {
    let mut status = instance.status.clone().unwrap_or_default();
    let deleting = instance.metadata.deletion_timestamp.is_some();
    let has_finalizer = instance.finalizers().iter().any(|f| f == FINALIZER);
    if deleting && !has_finalizer {
        return Ok(Action::await_change());
    }
    let generation = instance.metadata.generation.unwrap_or_default();
    if !deleting && !status.async_op_in_progress && status.observed_generation == generation {
        let done = |t: &str| {
            status
                .conditions
                .iter()
                .any(|c| c.type_ == t && c.status == ConditionStatus::True)
        };
        if done("Ready") || done("Failed") {
            return Ok(Action::await_change());
        }
    }

    let resolved = match resolve(instance, ctx).await? {
        Ok(resolved) => resolved,
        Err(missing) if deleting => {
            // Nothing can be deprovisioned without a plan: only an instance never provisioned goes.
            if status.provision_status != Some(ProvisionStatus::Provisioned)
                && !status.async_op_in_progress
            {
                remove_finalizer(instance, ctx).await?;
                return Ok(Action::await_change());
            }
            return Err(Error::Catalog(format!("cannot deprovision: {missing}")));
        }
        Err(missing) => return wait_for_catalog(instance, ctx, status, missing).await,
    };
    status.user_specified_class_name = Some(resolved.class_display.clone());
    status.user_specified_plan_name = Some(resolved.plan_display.clone());
    status.observed_generation = generation;

    if status.async_op_in_progress {
        return poll(instance, ctx, status, &resolved).await;
    }
    if deleting {
        return deprovision(instance, ctx, status, &resolved).await;
    }
    if !has_finalizer {
        add_finalizer(instance, ctx).await?;
    }
    if status.provision_status != Some(ProvisionStatus::Provisioned) {
        return provision(instance, ctx, status, &resolved).await;
    }
    // Provisioned and the spec changed: updates are not built yet.
    set(
        &mut status,
        "Ready",
        ConditionStatus::True,
        "ProvisionedSuccessfully",
        "The instance was provisioned successfully; changing it is not supported yet.",
    );
    write_status(instance, ctx, &status).await?;
    Ok(Action::await_change())
}

/// The class or plan is not in a catalog: wait, up to an hour after the controller first found
/// it missing (the `Ready=False` condition's transition time; not the creation time, so that an
/// instance created while the controller was down still gets its hour).
async fn wait_for_catalog(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    missing: String,
) -> Result<Action, Error> {
    status.observed_generation = instance.metadata.generation.unwrap_or_default();
    let reason = "ReferencesNonexistentServicePlan";
    let since = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == ConditionStatus::False && c.reason == reason)
        .and_then(|c| c.last_transition_time.as_ref())
        .map_or_else(Timestamp::now, |t| t.0);
    let waited = Timestamp::now().duration_since(since);
    if waited > k8s_openapi::jiff::SignedDuration::try_from(CATALOG_WAIT).unwrap_or_default() {
        set(
            &mut status,
            "Failed",
            ConditionStatus::True,
            reason,
            format!("{missing}, after waiting 1h"),
        );
        set(
            &mut status,
            "Ready",
            ConditionStatus::False,
            reason,
            missing,
        );
        write_status(instance, ctx, &status).await?;
        return Ok(Action::await_change());
    }
    set(
        &mut status,
        "Ready",
        ConditionStatus::False,
        reason,
        format!("{missing}; waiting for it to appear"),
    );
    write_status(instance, ctx, &status).await?;
    Ok(Action::requeue(RECHECK))
}

/// The OSB instance id: `spec.externalID`, else the resource's uid.
fn instance_id(instance: &ServiceInstance) -> String {
    instance
        .spec
        .external_id
        .clone()
        .unwrap_or_else(|| instance.uid().unwrap_or_default())
}

async fn provision(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    resolved: &Resolved,
) -> Result<Action, Error> {
    let parameters = match &instance.spec.parameters {
        None => None,
        Some(Value::Object(map)) => Some(map.clone()),
        Some(_) => {
            let reason = "InvalidParameters";
            set(
                &mut status,
                "Failed",
                ConditionStatus::True,
                reason,
                "spec.parameters must be a JSON object",
            );
            set(
                &mut status,
                "Ready",
                ConditionStatus::False,
                reason,
                "spec.parameters must be a JSON object",
            );
            write_status(instance, ctx, &status).await?;
            return Ok(Action::await_change());
        }
    };
    let mut context = Map::new();
    context.insert("platform".into(), "kubernetes".into());
    context.insert(
        "namespace".into(),
        instance.namespace().unwrap_or_default().into(),
    );
    context.insert("instance_name".into(), instance.name_any().into());
    if let Some(id) = &ctx.cluster_id {
        context.insert("clusterid".into(), id.clone().into());
    }
    let request = ProvisionRequest {
        service_id: resolved.class.external_id.clone(),
        plan_id: resolved.plan.external_id.clone(),
        context: Some(context),
        parameters: parameters.clone(),
        ..ProvisionRequest::default()
    };
    let answer = resolved
        .osb
        .provision(&instance_id(instance), &request, true)
        .await;
    ctx.metrics.osb_call("provision", &answer);
    let properties = ServiceInstancePropertiesState {
        parameters: parameters.map(Value::Object),
        user_info: instance.spec.user_info.clone(),
        ..plan_properties(resolved)
    };
    match answer {
        Ok(response) if response.is_async() => {
            status.async_op_in_progress = true;
            status.current_operation = Some(ServiceInstanceOperation::Provision);
            status.last_operation = response.body.operation.clone();
            status.operation_start_time = Some(Time(Timestamp::now()));
            status.in_progress_properties = Some(properties);
            status.deprovision_status = Some(DeprovisionStatus::Required);
            status.dashboard_url = response.body.dashboard_url.clone().or(status.dashboard_url);
            set(
                &mut status,
                "Ready",
                ConditionStatus::False,
                "Provisioning",
                "The instance is being provisioned asynchronously",
            );
            write_status(instance, ctx, &status).await?;
            Ok(Action::requeue(
                response.retry_after.unwrap_or(Duration::from_secs(1)),
            ))
        }
        Ok(response) => {
            status.dashboard_url = response.body.dashboard_url.clone();
            status.in_progress_properties = Some(properties);
            provisioned(instance, ctx, status).await
        }
        Err(e) => call_failed(instance, ctx, status, "Provision", e).await,
    }
}

fn plan_properties(resolved: &Resolved) -> ServiceInstancePropertiesState {
    let (name, id) = (
        Some(resolved.plan.external_name.clone()),
        Some(resolved.plan.external_id.clone()),
    );
    if resolved.cluster {
        ServiceInstancePropertiesState {
            cluster_service_plan_external_name: name,
            cluster_service_plan_external_id: id,
            ..Default::default()
        }
    } else {
        ServiceInstancePropertiesState {
            service_plan_external_name: name,
            service_plan_external_id: id,
            ..Default::default()
        }
    }
}

async fn provisioned(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
) -> Result<Action, Error> {
    status.provision_status = Some(ProvisionStatus::Provisioned);
    status.deprovision_status = Some(DeprovisionStatus::Required);
    status.external_properties = status.in_progress_properties.take();
    status.reconciled_generation = status.observed_generation;
    end_operation(&mut status);
    set(
        &mut status,
        "Ready",
        ConditionStatus::True,
        "ProvisionedSuccessfully",
        "The instance was provisioned successfully",
    );
    write_status(instance, ctx, &status).await?;
    Ok(Action::await_change())
}

/// Ends the operation as failed: `Ready=False` with `reason`, and `Failed=True` unless it was a
/// deprovision (which is retried).
fn record_failure(
    status: &mut ServiceInstanceStatus,
    reason: &str,
    message: String,
    deprovisioning: bool,
) {
    end_operation(status);
    if !deprovisioning {
        set(
            status,
            "Failed",
            ConditionStatus::True,
            reason,
            message.clone(),
        );
    }
    set(status, "Ready", ConditionStatus::False, reason, message);
}

fn end_operation(status: &mut ServiceInstanceStatus) {
    status.async_op_in_progress = false;
    status.current_operation = None;
    status.last_operation = None;
    status.operation_start_time = None;
    status.in_progress_properties = None;
}

/// A call the broker refused or could not answer. 400, 409 and 422 are terminal for a provision;
/// anything else is tried again.
async fn call_failed(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    verb: &str,
    e: OsbError,
) -> Result<Action, Error> {
    let reason = format!("{verb}CallFailed");
    let terminal = matches!(e.status().map(|s| s.as_u16()), Some(400 | 409 | 422));
    let message = format!("{verb} call failed: {e}");
    end_operation(&mut status);
    if verb == "Deprovision" {
        status.deprovision_status = Some(DeprovisionStatus::Failed);
    } else if terminal {
        status.deprovision_status = Some(DeprovisionStatus::NotRequired);
        set(
            &mut status,
            "Failed",
            ConditionStatus::True,
            &reason,
            message.clone(),
        );
    } else {
        status.deprovision_status = Some(DeprovisionStatus::Required);
    }
    set(
        &mut status,
        "Ready",
        ConditionStatus::False,
        &reason,
        message,
    );
    write_status(instance, ctx, &status).await?;
    Ok(if terminal && verb != "Deprovision" {
        Action::await_change()
    } else {
        Action::requeue(RECHECK)
    })
}

/// Polls the operation in progress.
async fn poll(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    resolved: &Resolved,
) -> Result<Action, Error> {
    let deprovisioning = status.current_operation == Some(ServiceInstanceOperation::Deprovision);
    let mut poll = Poll::instance(instance_id(instance))
        .operation(status.last_operation.clone())
        .plan(resolved.plan_ref());
    if deprovisioning {
        poll = poll.deleting();
    }
    let answer = resolved.osb.last_operation(&poll).await;
    ctx.metrics.osb_call("last_operation", &answer);
    let last = match answer {
        Ok(Response {
            body, retry_after, ..
        }) => (body, retry_after),
        Err(e) if deprovisioning && e.status().is_some_and(|s| s.as_u16() == 410) => (
            LastOperation {
                state: OperationState::Succeeded,
                description: None,
                instance_usable: None,
                update_repeatable: None,
            },
            None,
        ),
        Err(e) => return Err(e.into()),
    };
    let (operation, retry_after) = last;
    let verb = if deprovisioning {
        "Deprovision"
    } else {
        "Provision"
    };
    match operation.state {
        OperationState::InProgress => {
            let started = status
                .operation_start_time
                .as_ref()
                .map_or_else(Timestamp::now, |t| t.0);
            let elapsed: Duration = Timestamp::now()
                .duration_since(started)
                .try_into()
                .unwrap_or_default();
            if elapsed > resolved.max_polling() {
                let message = format!(
                    "the broker did not finish the {} within {}s",
                    verb.to_lowercase(),
                    resolved.max_polling().as_secs()
                );
                let reason = format!("{verb}TimedOut");
                record_failure(&mut status, &reason, message, deprovisioning);
                write_status(instance, ctx, &status).await?;
                return Ok(Action::await_change());
            }
            let description = operation
                .description
                .unwrap_or_else(|| format!("{verb} in progress"));
            set(
                &mut status,
                "Ready",
                ConditionStatus::False,
                &format!("{verb}ing"),
                description,
            );
            write_status(instance, ctx, &status).await?;
            Ok(Action::requeue(
                retry_after.unwrap_or_else(|| backoff(elapsed)),
            ))
        }
        OperationState::Succeeded if deprovisioning => {
            end_operation(&mut status);
            status.provision_status = Some(ProvisionStatus::NotProvisioned);
            status.deprovision_status = Some(DeprovisionStatus::Succeeded);
            write_status(instance, ctx, &status).await?;
            remove_finalizer(instance, ctx).await?;
            Ok(Action::await_change())
        }
        OperationState::Succeeded => provisioned(instance, ctx, status).await,
        OperationState::Failed => {
            let reason = format!("{verb}CallFailed");
            let message = format!(
                "{verb} failed: {}",
                operation
                    .description
                    .unwrap_or_else(|| "the broker gave no reason".into())
            );
            if deprovisioning {
                status.deprovision_status = Some(DeprovisionStatus::Failed);
            }
            record_failure(&mut status, &reason, message, deprovisioning);
            write_status(instance, ctx, &status).await?;
            Ok(if deprovisioning {
                Action::requeue(RECHECK)
            } else {
                Action::await_change()
            })
        }
    }
}

/// The pause before the next poll: as long as the operation has run so far, from 1 s to 5 min,
/// so that pauses double.
fn backoff(elapsed: Duration) -> Duration {
    elapsed.clamp(Duration::from_secs(1), MAX_BACKOFF)
}

async fn deprovision(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    resolved: &Resolved,
) -> Result<Action, Error> {
    let ns = instance.namespace().unwrap_or_default();
    let bindings = Api::<ServiceBinding>::namespaced(ctx.client.clone(), &ns)
        .list(&Default::default())
        .await?;
    let names: Vec<String> = bindings
        .into_iter()
        .filter(|b| b.spec.instance_ref.name == instance.name_any())
        .map(|b| b.name_any())
        .collect();
    if !names.is_empty() {
        let message = format!(
            "delete the ServiceBindings of this instance first: {}",
            names.join(", ")
        );
        set(
            &mut status,
            "Ready",
            ConditionStatus::False,
            "DeprovisionBlockedByExistingBindings",
            message,
        );
        write_status(instance, ctx, &status).await?;
        return Ok(Action::requeue(RECHECK));
    }
    if matches!(
        status.deprovision_status,
        None | Some(DeprovisionStatus::NotRequired)
    ) {
        remove_finalizer(instance, ctx).await?;
        return Ok(Action::await_change());
    }
    let answer = resolved
        .osb
        .deprovision(&instance_id(instance), &resolved.plan_ref(), true)
        .await;
    ctx.metrics.osb_call("deprovision", &answer);
    match answer {
        Ok(response) if response.is_async() => {
            status.async_op_in_progress = true;
            status.current_operation = Some(ServiceInstanceOperation::Deprovision);
            status.last_operation = response.body.operation.clone();
            status.operation_start_time = Some(Time(Timestamp::now()));
            set(
                &mut status,
                "Ready",
                ConditionStatus::False,
                "Deprovisioning",
                "The instance is being deprovisioned asynchronously",
            );
            write_status(instance, ctx, &status).await?;
            Ok(Action::requeue(
                response.retry_after.unwrap_or(Duration::from_secs(1)),
            ))
        }
        Ok(_) => {
            status.provision_status = Some(ProvisionStatus::NotProvisioned);
            status.deprovision_status = Some(DeprovisionStatus::Succeeded);
            write_status(instance, ctx, &status).await?;
            remove_finalizer(instance, ctx).await?;
            Ok(Action::await_change())
        }
        Err(e) => call_failed(instance, ctx, status, "Deprovision", e).await,
    }
}

fn set(
    status: &mut ServiceInstanceStatus,
    type_: &str,
    value: ConditionStatus,
    reason: &str,
    message: impl Into<String>,
) {
    conditions::set(&mut status.conditions, type_, value, reason, message);
    if type_ == "Ready" {
        status.last_condition_state = if value == ConditionStatus::True {
            "Ready".into()
        } else {
            reason.into()
        };
    }
}

/// Writes the status if it changed (a write wakes the controller again); fields of an operation
/// that ended are cleared.
async fn write_status(
    instance: &ServiceInstance,
    ctx: &Context,
    status: &ServiceInstanceStatus,
) -> Result<(), Error> {
    if instance.status.as_ref() == Some(status) {
        return Ok(());
    }
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(fields) = value.as_object_mut() {
        for cleared in [
            "lastOperation",
            "currentOperation",
            "operationStartTime",
            "inProgressProperties",
        ] {
            fields.entry(cleared).or_insert(Value::Null);
        }
    }
    api(instance, ctx)
        .patch_status(
            &instance.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": value })),
        )
        .await?;
    Ok(())
}

fn api(instance: &ServiceInstance, ctx: &Context) -> Api<ServiceInstance> {
    Api::namespaced(
        ctx.client.clone(),
        &instance.namespace().unwrap_or_default(),
    )
}

/// Sets the finalizers, failing with a conflict if they changed since the instance was read.
async fn set_finalizers(
    instance: &ServiceInstance,
    ctx: &Context,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let current = instance.metadata.finalizers.clone();
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": current},
        {"op": "add", "path": "/metadata/finalizers", "value": finalizers},
    ]))
    .expect("a JSON patch");
    api(instance, ctx)
        .patch(
            &instance.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await?;
    Ok(())
}

async fn add_finalizer(instance: &ServiceInstance, ctx: &Context) -> Result<(), Error> {
    let mut finalizers = instance.finalizers().to_vec();
    finalizers.push(FINALIZER.into());
    set_finalizers(instance, ctx, finalizers).await
}

async fn remove_finalizer(instance: &ServiceInstance, ctx: &Context) -> Result<(), Error> {
    let finalizers = instance
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    set_finalizers(instance, ctx, finalizers).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_back_off_from_one_second_doubling_to_five_minutes() {
        assert_eq!(backoff(Duration::ZERO), Duration::from_secs(1));
        assert_eq!(backoff(Duration::from_secs(1)), Duration::from_secs(1));
        // Waiting as long as it has run doubles the time run: 1, 2, 4, 8 … seconds.
        assert_eq!(backoff(Duration::from_secs(4)), Duration::from_secs(4));
        assert_eq!(backoff(Duration::from_secs(3600)), Duration::from_secs(300));
    }
}
