//! The instance's state as every phase writes it: its status and conditions, what a provision
//! or update sent, Events, and the finalizer.

use std::time::Duration;

use kube::runtime::events::EventType;
use kube::{Api, ResourceExt as _};

use crate::context::Context;
use crate::error::Error;
use crate::parameters::Parameters;
use crate::resolve::Resolved;
use crate::resources::{
    ConditionStatus, ServiceInstance, ServiceInstancePropertiesState, ServiceInstanceStatus,
    UserInfo,
};
use crate::{conditions, finalizer, platform};

/// The finalizer that keeps a ServiceInstance until its broker deprovisioned it.
pub(super) use crate::finalizer::SERVICE_INSTANCE as FINALIZER;
/// How often to look again at something only a person can change.
pub(super) const RECHECK: Duration = Duration::from_secs(10);

/// Condition reasons, as the Service Catalog names them.
pub(super) mod reason {
    pub const PARAMETERS: &str = "ErrorWithParameters";
    pub const PROVISIONED: &str = "ProvisionedSuccessfully";
    pub const UPDATED: &str = "InstanceUpdatedSuccessfully";
    pub const UPDATE_FAILED: &str = "UpdateInstanceCallFailed";
    pub const UPDATE_ERROR: &str = "ErrorCallingUpdateInstance";
    pub const ORPHAN_MITIGATION: &str = "StartingInstanceOrphanMitigation";
    pub const ORPHAN_MITIGATED: &str = "OrphanMitigationSuccessful";
    pub const BLOCKED: &str = "DeprovisionBlockedByExistingBindings";
    pub const CASCADING: &str = "DeletingServiceBindings";
    pub const NO_BROKER: &str = "ErrorGettingBroker";
    pub const ABANDONED: &str = "Abandoned";
}

pub(super) fn condition_is<'a>(status: &'a ServiceInstanceStatus, type_: &str) -> Option<&'a str> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == ConditionStatus::True)
        .map(|c| c.reason.as_str())
}

pub(super) fn annotated(instance: &ServiceInstance, annotation: &str) -> bool {
    instance
        .annotations()
        .get(annotation)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// Whether the Ready condition already says this (so that an event is sent once).
pub(super) fn ready_says(status: &ServiceInstanceStatus, reason: &str, message: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.reason == reason && conditions::says(c, message))
}

/// What a provision or update sends, as status keeps it: the plan, the parameters redacted and
/// their checksum, the originating identity forwarded with it, and the maintenance version the
/// instance runs once it succeeds.
pub(super) fn properties(
    resolved: &Resolved,
    parameters: &Parameters,
    user: Option<&UserInfo>,
    version: Option<String>,
) -> ServiceInstancePropertiesState {
    let (name, id) = (
        Some(resolved.plan.external_name.clone()),
        Some(resolved.plan.external_id.clone()),
    );
    let plan = if resolved.cluster {
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
    };
    ServiceInstancePropertiesState {
        parameters: parameters.redacted.clone(),
        parameter_checksum: parameters.checksum.clone(),
        user_info: user.cloned(),
        maintenance_info_version: version,
        ..plan
    }
}

/// The plan id recorded in `properties`, of either scope.
pub(super) fn plan_id(properties: &ServiceInstancePropertiesState) -> Option<&str> {
    properties
        .cluster_service_plan_external_id
        .as_deref()
        .or(properties.service_plan_external_id.as_deref())
}

pub(super) fn end_operation(status: &mut ServiceInstanceStatus) {
    status.async_op_in_progress = false;
    status.current_operation = None;
    status.last_operation = None;
    status.operation_start_time = None;
    status.in_progress_properties = None;
}

pub(super) fn set(
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

/// Publishes a Kubernetes Event about `instance`; `note` must never hold parameters.
pub(super) async fn event(
    ctx: &Context,
    instance: &ServiceInstance,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    let action = if reason.starts_with("Deprovision") || reason == reason::ABANDONED {
        "Deprovision"
    } else if reason.contains("Update") {
        "Update"
    } else if reason.contains("Provision") || reason.contains("OrphanMitigation") {
        "Provision"
    } else {
        "Reconcile"
    };
    platform::event(ctx, instance, type_, reason, note, action).await;
}

/// Writes the status if it changed (a write wakes the controller again); fields of an operation
/// that ended are cleared.
pub(super) async fn write_status(
    instance: &ServiceInstance,
    ctx: &Context,
    status: &ServiceInstanceStatus,
) -> Result<(), Error> {
    if platform::goes_with_namespace(instance, ctx) && !status.async_op_in_progress {
        return Ok(());
    }
    Ok(crate::status::write(
        &api(instance, ctx),
        instance,
        instance.status.as_ref(),
        status,
        &[
            "lastOperation",
            "currentOperation",
            "operationStartTime",
            "inProgressProperties",
        ],
        &ctx.written,
    )
    .await?)
}

pub(super) fn api(instance: &ServiceInstance, ctx: &Context) -> Api<ServiceInstance> {
    Api::namespaced(
        ctx.client.clone(),
        &instance.namespace().unwrap_or_default(),
    )
}

pub(super) async fn add_finalizer(instance: &ServiceInstance, ctx: &Context) -> Result<(), Error> {
    if let Some(written) = finalizer::add(&api(instance, ctx), instance, FINALIZER).await? {
        ctx.written.record(instance, &written);
    }
    Ok(())
}

pub(super) async fn remove_finalizer(
    instance: &ServiceInstance,
    ctx: &Context,
) -> Result<(), Error> {
    if let Some(written) = finalizer::remove(&api(instance, ctx), instance, FINALIZER).await? {
        ctx.written.record(instance, &written);
    }
    Ok(())
}
