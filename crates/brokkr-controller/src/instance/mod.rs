//! The ServiceInstance controller.
//!
//! - The class and plan are resolved from the catalog resources (waiting up to an hour for them).
//! - Parameters are `spec.parameters` merged with the Secret keys `spec.parametersFrom` names
//!   ([`crate::parameters`]); a missing Secret or key waits (`ErrorWithParameters`), a value that
//!   is not a JSON object or a key given twice fails until the spec or the Secret changes. Status
//!   only ever holds the parameters with Secret values redacted, and their checksum.
//! - The instance is provisioned with `accepts_incomplete=true` behind a finalizer
//!   (`provision.rs`, how operations end in `outcome.rs`); a provision that timed out, got a 5xx or an unreadable 201/202 is followed
//!   by deprovision calls until one succeeds (orphan mitigation), then tried again.
//! - A provisioned instance whose generation, plan or parameter checksum moved is updated
//!   (`update.rs`): `plan_id` only when the plan changed, `parameters` only when their checksum did,
//!   and `previous_values`. A change to a `parametersFrom` Secret is seen as a checksum change
//!   (the controller watches Secrets). A refused update leaves the instance usable as it was
//!   (`Ready=False`, `UpdateInstanceCallFailed`, no `Failed`).
//! - An instance whose plan offers another maintenance version has the `UpgradeAvailable`
//!   condition; it is upgraded (an update carrying the plan's `maintenance_info`) when
//!   `spec.maintenance` asks for it (`upgrade.rs`).
//! - Operations are polled (`poll.rs`) with the broker's `Retry-After` or a backoff from 1 s
//!   doubling to 5 min, until the plan's `maximumPollingDuration` (else 7 days).
//! - Deleting deprovisions (`delete.rs`), unless ServiceBindings still name the instance; with
//!   [`CASCADE_DELETE_ANNOTATION`](crate::resources::CASCADE_DELETE_ANNOTATION) they are
//!   deleted first; with [`ABANDON_ANNOTATION`] the finalizer goes without any broker call. A
//!   deletion never depends on the parameters' Secrets; when the broker, its Secret or the plan
//!   is gone, the condition says so and names the abandon annotation as the way out.
//! - Provision, update, deprovision and abandoning are reported as Kubernetes Events (never with
//!   parameters).

use std::sync::Arc;

use crate::runner::Action;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, ResourceExt as _};

mod delete;
mod outcome;
mod poll;
mod provision;
mod state;
mod update;
mod upgrade;
mod wait;

use crate::context::Context;
use crate::error::Error;
use crate::identity;
use crate::parameters::{self};
use crate::resolve::resolve;
use crate::resources::ABANDON_ANNOTATION;
use crate::resources::{ConditionStatus, ProvisionStatus, ServiceInstance};
use crate::status::{Freshness, Taken};
use state::{
    FINALIZER, RECHECK, add_finalizer, annotated, condition_is, reason, set, write_status,
};
use wait::{parameters_invalid, refuse, wait_for_catalog};

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
    if ctx.written.freshness(instance) == Freshness::Stale {
        // The cache is behind this controller's own last write: its watch event comes soon.
        return Ok(Action::requeue(crate::status::STALE_RETRY));
    }
    let mut status = instance.status.clone().unwrap_or_default();
    match ctx.held_instances.take(instance, &ctx.written) {
        Some(Taken::Unchanged(held)) => status = held,
        Some(Taken::Changed(held)) => {
            // Someone changed the instance (a deletion, a new spec) while an operation's start
            // was held: written first, as it would have been.
            write_status(instance, ctx, &held).await?;
            status = held;
        }
        None => {}
    }
    let deleting = instance.metadata.deletion_timestamp.is_some();
    let has_finalizer = instance.finalizers().iter().any(|f| f == FINALIZER);
    if deleting && !has_finalizer {
        return Ok(Action::await_change());
    }
    if deleting && annotated(instance, ABANDON_ANNOTATION) {
        return delete::abandon(instance, ctx, false).await;
    }
    if deleting
        && crate::namespace_deletion::overdue(ctx, &instance.namespace().unwrap_or_default())
    {
        return delete::abandon(instance, ctx, true).await;
    }
    let generation = instance.metadata.generation.unwrap_or_default();
    let from_secrets = !instance.spec.parameters_from.is_empty();
    if !deleting
        && !status.async_op_in_progress
        && !status.orphan_mitigation_in_progress
        && status.observed_generation == generation
    {
        // Settled: only a new generation (or, with parametersFrom, a Secret) changes anything.
        let settled = match condition_is(&status, "Failed") {
            Some(r) => r != reason::PARAMETERS || !from_secrets,
            None => {
                (condition_is(&status, "Ready").is_some()
                    || status.last_condition_state == reason::UPDATE_FAILED)
                    && !from_secrets
            }
        };
        if settled && let Some(action) = upgrade::settled(instance, &status, ctx).await? {
            return Ok(action);
        }
    }

    let resolved = match resolve(instance, ctx).await {
        Ok(Ok(resolved)) => resolved,
        Ok(Err(_)) | Err(_)
            if let Some((reason, message)) = identity::instance_mismatch(instance, None) =>
        {
            return refuse(instance, ctx, status, reason, message).await;
        }
        Ok(Err(missing)) if deleting => {
            // Nothing can be deprovisioned without a plan: only an instance never provisioned goes.
            return delete::without_broker(instance, ctx, status, missing).await;
        }
        Err(e) if deleting => {
            return delete::without_broker(instance, ctx, status, e.to_string()).await;
        }
        Ok(Err(missing)) => return wait_for_catalog(instance, ctx, status, missing).await,
        Err(e) => return Err(e),
    };
    status.user_specified_class_name = Some(resolved.class_display.clone());
    status.user_specified_plan_name = Some(resolved.plan_display.clone());
    let class_id = resolved.class.external_id.as_str();
    if let Some((reason, message)) = identity::instance_mismatch(instance, Some(class_id)) {
        return refuse(instance, ctx, status, reason, message).await;
    }
    if identity::adopt_instance(instance, &mut status, class_id) {
        write_status(instance, ctx, &status).await?;
    }

    if status.async_op_in_progress {
        return poll::poll(instance, ctx, status, &resolved).await;
    }
    // What follows may start an operation at the broker: only from the object as it is now.
    let api = Api::<ServiceInstance>::namespaced(
        ctx.client.clone(),
        &instance.namespace().unwrap_or_default(),
    );
    if deleting
        && let Some(action) = delete::bindings_in_the_way(instance, ctx, &mut status).await?
    {
        // Before anything is read from the API server: waiting costs no request.
        return Ok(action);
    }
    if crate::status::status_is_stale(&api, instance, &ctx.written).await? {
        return Ok(Action::requeue(crate::status::STALE_RETRY));
    }
    if deleting || status.orphan_mitigation_in_progress {
        return delete::deprovision(instance, ctx, status, &resolved).await;
    }
    status.observed_generation = generation;
    if !has_finalizer {
        add_finalizer(instance, ctx).await?;
    }
    let parameters = match parameters::build(
        &ctx.client,
        &instance.namespace().unwrap_or_default(),
        instance.spec.parameters.as_ref(),
        &instance.spec.parameters_from,
    )
    .await?
    {
        Ok(parameters) => parameters,
        Err(invalid) => return parameters_invalid(instance, ctx, status, &invalid).await,
    };
    if condition_is(&status, "Failed") == Some(reason::PARAMETERS) {
        status.conditions.retain(|c| c.type_ != "Failed");
    }
    if status.provision_status != Some(ProvisionStatus::Provisioned) {
        return provision::provision(instance, ctx, status, &resolved, &parameters).await;
    }
    let due = upgrade::mark(instance, &mut status, &resolved.plan, Timestamp::now());
    if let Some(change) = update::change(instance, &status, &resolved, &parameters, &due) {
        return update::update(instance, ctx, status, &resolved, &parameters, change).await;
    }
    // The broker has what the spec asks for.
    if condition_is(&status, "Ready").is_none() {
        set(
            &mut status,
            "Ready",
            ConditionStatus::True,
            reason::PROVISIONED,
            "The instance is provisioned and up to date",
        );
    }
    write_status(instance, ctx, &status).await?;
    Ok(match due {
        upgrade::Due::Later(wait) => Action::requeue(wait),
        _ => Action::await_change(),
    })
}
