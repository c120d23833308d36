//! How an operation ends, whether the broker answered at once or a poll saw it end: provisioned,
//! updated, deprovisioned, a failed update, and orphan mitigation started and done.

use std::time::Duration;

use crate::runner::Action;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::runtime::events::EventType;

use super::state::{end_operation, event, reason, remove_finalizer, set, write_status};
use super::upgrade::{self, Due};
use crate::context::Context;
use crate::error::Error;
use crate::resources::{
    CommonServicePlanSpec, ConditionStatus, DeprovisionStatus, ProvisionStatus, ServiceInstance,
    ServiceInstanceStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// How long after a successful orphan mitigation the provision is tried again.
pub(super) const RETRY_AFTER_MITIGATION: Duration = Duration::from_secs(5);

/// What follows an operation that ended: `then`, unless something may have come while it ran
/// that is still to be acted on — its spec changed (a generation newer than the one the
/// operation was started for), or its parameters come from Secrets, which may have changed
/// meanwhile. A change that came while the operation ran woke a reconcile that only polled,
/// and the write that ends the operation does not wake the instance again (its own write): so
/// it looks again once the cache has that write.
pub(super) fn after_operation(
    instance: &ServiceInstance,
    status: &ServiceInstanceStatus,
    then: Action,
) -> Action {
    let generation = instance.metadata.generation.unwrap_or_default();
    if generation > status.observed_generation || !instance.spec.parameters_from.is_empty() {
        return Action::requeue(crate::status::STALE_RETRY);
    }
    then
}

pub(super) async fn provisioned(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
) -> Result<Action, Error> {
    ctx.backoffs.forget(&instance.uid().unwrap_or_default());
    status.provision_status = Some(ProvisionStatus::Provisioned);
    status.deprovision_status = Some(DeprovisionStatus::Required);
    status.external_properties = status.in_progress_properties.take();
    status.reconciled_generation = status.observed_generation;
    end_operation(&mut status);
    let message = "The instance was provisioned successfully";
    set(
        &mut status,
        "Ready",
        ConditionStatus::True,
        reason::PROVISIONED,
        message,
    );
    // A success the user asked for is said by the condition alone: no Event.
    write_status(instance, ctx, &status).await?;
    Ok(after_operation(instance, &status, Action::await_change()))
}

/// Deprovision calls follow until one succeeds ([`super::delete::deprovision`]); then the
/// provision is tried again, unless `terminal` (the `Failed` condition says why).
pub(super) async fn start_orphan_mitigation(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    cause: &str,
    terminal: bool,
) -> Result<Action, Error> {
    ctx.backoffs.failed(&instance.uid().unwrap_or_default());
    end_operation(&mut status);
    status.orphan_mitigation_in_progress = true;
    status.deprovision_status = Some(DeprovisionStatus::Required);
    status.operation_start_time = Some(Time(Timestamp::now()));
    if terminal {
        set(
            &mut status,
            "Failed",
            ConditionStatus::True,
            "ProvisionCallFailed",
            cause,
        );
    }
    // A broker that said the provision failed is not ambiguous; an answer that settles
    // nothing (a timeout, a 5xx) is.
    let message = if terminal {
        format!(
            "The provision failed ({cause}); deprovisioning the instance to remove what the \
             broker may have left"
        )
    } else {
        format!(
            "The instance provision call failed with an ambiguous error ({cause}); attempting \
             to deprovision the instance in order to mitigate an orphaned resource"
        )
    };
    set(
        &mut status,
        "Ready",
        ConditionStatus::False,
        reason::ORPHAN_MITIGATION,
        message.clone(),
    );
    write_status(instance, ctx, &status).await?;
    event(
        ctx,
        instance,
        EventType::Warning,
        reason::ORPHAN_MITIGATION,
        &message,
    )
    .await;
    Ok(Action::requeue(Duration::from_millis(100)))
}

/// The deprovision of an orphan mitigation succeeded.
pub(super) async fn orphan_mitigated(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
) -> Result<Action, Error> {
    let start = status.operation_start_time.clone();
    end_operation(&mut status);
    status.orphan_mitigation_in_progress = false;
    status.provision_status = Some(ProvisionStatus::NotProvisioned);
    status.deprovision_status = Some(DeprovisionStatus::NotRequired);
    let terminal = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Failed" && c.status == ConditionStatus::True);
    let message = if terminal {
        "Orphan mitigation was completed successfully; the provision failed".to_owned()
    } else {
        status.operation_start_time = start.or_else(|| Some(Time(Timestamp::now())));
        format!(
            "Orphan mitigation was completed successfully; the provision is tried again in {}s",
            RETRY_AFTER_MITIGATION.as_secs()
        )
    };
    set(
        &mut status,
        "Ready",
        ConditionStatus::False,
        reason::ORPHAN_MITIGATED,
        message.clone(),
    );
    write_status(instance, ctx, &status).await?;
    event(
        ctx,
        instance,
        EventType::Normal,
        reason::ORPHAN_MITIGATED,
        &message,
    )
    .await;
    Ok(if terminal {
        Action::await_change()
    } else {
        Action::requeue(RETRY_AFTER_MITIGATION)
    })
}

/// The broker accepted the update: it is what the broker has now.
/// `UpgradeAvailable` is marked anew in the same write: an upgrade that went drops it.
pub(super) async fn updated(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    plan: &CommonServicePlanSpec,
) -> Result<Action, Error> {
    status.external_properties = status.in_progress_properties.take();
    status.reconciled_generation = status.observed_generation;
    end_operation(&mut status);
    let message = "The instance was updated successfully";
    set(
        &mut status,
        "Ready",
        ConditionStatus::True,
        reason::UPDATED,
        message,
    );
    let due = upgrade::mark(instance, &mut status, plan, Timestamp::now());
    write_status(instance, ctx, &status).await?;
    let then = match due {
        Due::No => Action::await_change(),
        Due::Later(wait) => Action::requeue(wait),
        // The plan moved on again meanwhile: the next reconcile upgrades.
        Due::Now(_) => Action::requeue(Duration::from_secs(1)),
    };
    Ok(after_operation(instance, &status, then))
}

/// Ends an update as failed: the instance keeps its plan and parameters and stays usable.
pub(super) async fn update_failed(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    reason: &str,
    message: String,
) -> Result<(), Error> {
    end_operation(&mut status);
    let message = format!("{message}; the instance keeps its previous plan and parameters");
    set(
        &mut status,
        "Ready",
        ConditionStatus::False,
        reason,
        message.clone(),
    );
    write_status(instance, ctx, &status).await?;
    event(ctx, instance, EventType::Warning, reason, &message).await;
    Ok(())
}

/// The broker deprovisioned the instance: the resource goes, or (orphan mitigation) the
/// provision is tried again.
pub(super) async fn deprovisioned(
    instance: &ServiceInstance,
    ctx: &Context,
    status: ServiceInstanceStatus,
) -> Result<Action, Error> {
    if status.orphan_mitigation_in_progress && instance.metadata.deletion_timestamp.is_none() {
        return orphan_mitigated(instance, ctx, status).await;
    }
    // The instance goes with the finalizer: its last status would never be read, and if the
    // finalizer cannot be removed the next reconcile deprovisions again (a 410 counts as done).
    remove_finalizer(instance, ctx).await?;
    Ok(Action::await_change())
}
