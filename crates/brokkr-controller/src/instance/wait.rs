//! An instance that cannot be provisioned yet, or as it is: parameters that are invalid or wait
//! for a Secret, a spec the controller refuses, a class or plan not in the catalog yet.

use crate::runner::Action;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;

use super::state::{RECHECK, event, ready_says, reason, set, write_status};
use crate::context::Context;
use crate::error::Error;
use crate::parameters::Invalid;
use crate::platform;
use crate::resources::{ConditionStatus, ProvisionStatus, ServiceInstance, ServiceInstanceStatus};

/// The parameters cannot be built: a Secret (or key) yet to come waits; anything else fails
/// until the spec or a Secret changes. The message never holds a parameter's value.
pub(super) async fn parameters_invalid(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    invalid: &Invalid,
) -> Result<Action, Error> {
    let message = invalid.to_string();
    if invalid.waits() {
        set(
            &mut status,
            "Ready",
            ConditionStatus::False,
            reason::PARAMETERS,
            format!("{message}; waiting for it"),
        );
        write_status(instance, ctx, &status).await?;
        return Ok(Action::requeue(RECHECK));
    }
    if !ready_says(&status, reason::PARAMETERS, &message) {
        event(
            ctx,
            instance,
            EventType::Warning,
            reason::PARAMETERS,
            &message,
        )
        .await;
    }
    if status.provision_status != Some(ProvisionStatus::Provisioned) {
        set(
            &mut status,
            "Failed",
            ConditionStatus::True,
            reason::PARAMETERS,
            message.clone(),
        );
    }
    set(
        &mut status,
        "Ready",
        ConditionStatus::False,
        reason::PARAMETERS,
        message,
    );
    write_status(instance, ctx, &status).await?;
    Ok(Action::await_change())
}

/// The spec names other OSB ids than those recorded, or one the OSB API cannot carry: nothing
/// is sent to the broker until it is changed back. An instance never provisioned fails.
pub(super) async fn refuse(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    reason: &str,
    message: String,
) -> Result<Action, Error> {
    if !ready_says(&status, reason, &message) {
        event(ctx, instance, EventType::Warning, reason, &message).await;
    }
    status.observed_generation = instance.metadata.generation.unwrap_or_default();
    if status.provision_status != Some(ProvisionStatus::Provisioned) && status.external_id.is_none()
    {
        set(
            &mut status,
            "Failed",
            ConditionStatus::True,
            reason,
            message.clone(),
        );
    }
    set(
        &mut status,
        "Ready",
        ConditionStatus::False,
        reason,
        message,
    );
    write_status(instance, ctx, &status).await?;
    Ok(Action::await_change())
}

/// The class or plan is not in a catalog: wait, up to an hour after the controller first found
/// it missing (the `Ready=False` condition's transition time; not the creation time, so that an
/// instance created while the controller was down still gets its hour).
pub(super) async fn wait_for_catalog(
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
    if waited > k8s_openapi::jiff::SignedDuration::try_from(ctx.wait_timeout).unwrap_or_default() {
        set(
            &mut status,
            "Failed",
            ConditionStatus::True,
            reason,
            format!(
                "{missing}, after waiting {}",
                platform::humanize(ctx.wait_timeout)
            ),
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
