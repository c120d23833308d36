//! The ServiceInstance controller.
//!
//! - The class and plan are resolved from the catalog resources (waiting up to an hour for them).
//! - Parameters are `spec.parameters` merged with the Secret keys `spec.parametersFrom` names
//!   ([`crate::parameters`]); a missing Secret or key waits (`ErrorWithParameters`), a value that
//!   is not a JSON object or a key given twice fails until the spec or the Secret changes. Status
//!   only ever holds the parameters with Secret values redacted, and their checksum.
//! - The instance is provisioned with `accepts_incomplete=true` behind a finalizer
//!   (`provision.rs`); a provision that timed out, got a 5xx or an unreadable 201/202 is followed
//!   by deprovision calls until one succeeds (orphan mitigation), then tried again.
//! - A provisioned instance whose generation, plan or parameter checksum moved is updated
//!   (`update.rs`): `plan_id` only when the plan changed, `parameters` only when their checksum did,
//!   and `previous_values`. A change to a `parametersFrom` Secret is seen as a checksum change
//!   (the controller watches Secrets). A refused update leaves the instance usable as it was
//!   (`Ready=False`, `UpdateInstanceCallFailed`, no `Failed`).
//! - Operations are polled (`poll.rs`) with the broker's `Retry-After` or a backoff from 1 s
//!   doubling to 5 min, until the plan's `maximumPollingDuration` (else 7 days).
//! - Deleting deprovisions (`delete.rs`), unless ServiceBindings still name the instance; with
//!   [`CASCADE_DELETE_ANNOTATION`] they are deleted first; with [`ABANDON_ANNOTATION`] the
//!   finalizer goes without any broker call. A deletion never depends on the parameters'
//!   Secrets; when the broker, its Secret or the plan is gone, the condition says so and names
//!   the abandon annotation as the way out.
//! - Provision, update, deprovision and abandoning are reported as Kubernetes Events (never with
//!   parameters).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt as _};

mod delete;
mod poll;
mod provision;
mod update;

use crate::context::Context;
use crate::error::Error;
use crate::identity::instance_id;
use crate::parameters::{self, Invalid, Parameters};
use crate::platform::osb_context;
use crate::resolve::{Resolved, resolve};
use crate::resources::{ABANDON_ANNOTATION, CASCADE_DELETE_ANNOTATION};
use crate::resources::{
    ConditionStatus, ProvisionStatus, ServiceInstance, ServiceInstancePropertiesState,
    ServiceInstanceStatus, UserInfo,
};
use crate::status::{Freshness, Taken};
use crate::{conditions, finalizer, identity, platform};

use crate::finalizer::SERVICE_INSTANCE as FINALIZER;
/// How often to look again at something only a person can change.
const RECHECK: Duration = Duration::from_secs(10);

/// Condition reasons, as the Service Catalog names them.
pub(crate) mod reason {
    pub const PARAMETERS: &str = "ErrorWithParameters";
    pub const PROVISIONED: &str = "ProvisionedSuccessfully";
    pub const UPDATED: &str = "InstanceUpdatedSuccessfully";
    pub const UPDATE_FAILED: &str = "UpdateInstanceCallFailed";
    pub const UPDATE_ERROR: &str = "ErrorCallingUpdateInstance";
    pub const ORPHAN_MITIGATION: &str = "StartingInstanceOrphanMitigation";
    pub const ORPHAN_MITIGATED: &str = "OrphanMitigationSuccessful";
    pub const DEPROVISIONED: &str = "DeprovisionedSuccessfully";
    pub const BLOCKED: &str = "DeprovisionBlockedByExistingBindings";
    pub const CASCADING: &str = "DeletingServiceBindings";
    pub const NO_BROKER: &str = "ErrorGettingBroker";
    pub const ABANDONED: &str = "Abandoned";
}

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

/// The instances (from the controller's store) whose `parametersFrom` names `secret`: a change
/// to it may change their parameters.
pub fn named_by_secret(
    store: &Store<ServiceInstance>,
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ObjectRef<ServiceInstance>> {
    let (Some(ns), name) = (secret.namespace(), secret.name_any()) else {
        return Vec::new();
    };
    crate::cache::woken(store, |i| {
        i.namespace().as_deref() == Some(&ns)
            && i.spec
                .parameters_from
                .iter()
                .any(|p| p.secret_key_ref.as_ref().is_some_and(|r| r.name == name))
    })
}

fn condition_is<'a>(status: &'a ServiceInstanceStatus, type_: &str) -> Option<&'a str> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == ConditionStatus::True)
        .map(|c| c.reason.as_str())
}

pub(crate) fn annotated(instance: &ServiceInstance, annotation: &str) -> bool {
    instance
        .annotations()
        .get(annotation)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
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
        if settled {
            return Ok(Action::await_change());
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
    if let Some(change) = update::change(instance, &status, &resolved, &parameters) {
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
    Ok(Action::await_change())
}

/// The parameters cannot be built: a Secret (or key) yet to come waits; anything else fails
/// until the spec or a Secret changes. The message never holds a parameter's value.
async fn parameters_invalid(
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
async fn refuse(
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

/// Whether the Ready condition already says this (so that an event is sent once).
fn ready_says(status: &ServiceInstanceStatus, reason: &str, message: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.reason == reason && conditions::says(c, message))
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

/// What a provision or update sends, as status keeps it: the plan, the parameters redacted and
/// their checksum, the originating identity forwarded with it.
fn properties(
    resolved: &Resolved,
    parameters: &Parameters,
    user: Option<&UserInfo>,
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
        ..plan
    }
}

/// The plan id recorded in `properties`, of either scope.
fn plan_id(properties: &ServiceInstancePropertiesState) -> Option<&str> {
    properties
        .cluster_service_plan_external_id
        .as_deref()
        .or(properties.service_plan_external_id.as_deref())
}

/// Records an operation the broker accepted asynchronously, `operation` being what to poll
/// `last_operation` with, and sets `Ready` to `waiting` (reason, message) when given; polls after
/// the broker's `Retry-After`, else after a second.
/// An operation a broker accepted to run asynchronously (a 202).
struct Accepted<'a> {
    kind: crate::resources::ServiceInstanceOperation,
    /// The broker's operation key.
    operation: Option<String>,
    retry_after: Option<std::time::Duration>,
    /// The `Ready` condition's reason and message while it runs, if they change.
    waiting: Option<(&'a str, &'a str)>,
}

async fn started(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    resolved: &Resolved,
    accepted: Accepted<'_>,
) -> Result<Action, Error> {
    let Accepted {
        kind,
        operation,
        retry_after,
        waiting,
    } = accepted;
    status.async_op_in_progress = true;
    status.current_operation = Some(kind);
    status.last_operation = operation;
    status.operation_start_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    if let Some((reason, message)) = waiting {
        set(
            &mut status,
            "Ready",
            ConditionStatus::False,
            reason,
            message,
        );
    }
    if retry_after.is_none() {
        // Asked at once, the broker says how the operation is going (or that it is done), and
        // one status write says both that it started and how far it got. Should that fail, the
        // start alone is written.
        match poll::poll(instance, ctx, status.clone(), resolved).await {
            Ok(action) => return Ok(action),
            Err(e) => tracing::debug!(error = %e, "the first poll of an operation"),
        }
    }
    write_status(instance, ctx, &status).await?;
    Ok(Action::requeue(
        retry_after.unwrap_or(std::time::Duration::from_secs(1)),
    ))
}

fn end_operation(status: &mut ServiceInstanceStatus) {
    status.async_op_in_progress = false;
    status.current_operation = None;
    status.last_operation = None;
    status.operation_start_time = None;
    status.in_progress_properties = None;
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

/// Publishes a Kubernetes Event about `instance`; `note` must never hold parameters.
async fn event(
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
async fn write_status(
    instance: &ServiceInstance,
    ctx: &Context,
    status: &ServiceInstanceStatus,
) -> Result<(), Error> {
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

fn api(instance: &ServiceInstance, ctx: &Context) -> Api<ServiceInstance> {
    Api::namespaced(
        ctx.client.clone(),
        &instance.namespace().unwrap_or_default(),
    )
}

async fn add_finalizer(instance: &ServiceInstance, ctx: &Context) -> Result<(), Error> {
    if let Some(written) = finalizer::add(&api(instance, ctx), instance, FINALIZER).await? {
        ctx.written.record(instance, &written);
    }
    Ok(())
}

async fn remove_finalizer(instance: &ServiceInstance, ctx: &Context) -> Result<(), Error> {
    if let Some(written) = finalizer::remove(&api(instance, ctx), instance, FINALIZER).await? {
        ctx.written.record(instance, &written);
    }
    Ok(())
}
