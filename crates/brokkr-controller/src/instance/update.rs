//! Updating a provisioned instance: a new generation, plan or parameter checksum is sent to the
//! broker as an OSB update, `plan_id` only when the plan changed, `parameters` only when their
//! checksum did, with `previous_values`; an upgrade that is due ([`super::upgrade`]) sends the
//! plan's `maintenance_info`. A failed update leaves the instance as it was, and usable.

use crate::runner::Action;
use brokkr_osb::client::Error as OsbError;
use brokkr_osb::messages::UpdateRequest;
use brokkr_osb::{ErrorCode, MaintenanceInfo};
use serde_json::{Map, Value};

use super::outcome::{update_failed, updated};
use super::poll::{Accepted, started};
use super::state::{RECHECK, plan_id, properties, reason};
use super::upgrade::Due;
use crate::context::Context;
use crate::error::Error;
use crate::identity::instance_id;
use crate::parameters::Parameters;
use crate::platform::osb_context;
use crate::resolve::Resolved;
use crate::resources::{ServiceInstance, ServiceInstanceOperation, ServiceInstanceStatus};
use crate::user_info::{Guard, INSTANCES};

/// What an update changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Change {
    plan: bool,
    parameters: bool,
    /// The maintenance version it upgrades to.
    upgrade: Option<String>,
}

/// What differs from what the broker last accepted, if anything (or the generation moved, e.g.
/// `spec.updateRequests` grew, or an upgrade is due).
pub(super) fn change(
    instance: &ServiceInstance,
    status: &ServiceInstanceStatus,
    resolved: &Resolved,
    parameters: &Parameters,
    due: &Due,
) -> Option<Change> {
    let external = status.external_properties.clone().unwrap_or_default();
    let change = Change {
        plan: plan_id(&external) != Some(resolved.plan.external_id.as_str()),
        parameters: external.parameter_checksum != parameters.checksum,
        upgrade: match due {
            Due::Now(version) => Some(version.clone()),
            Due::No | Due::Later(_) => None,
        },
    };
    let generation = instance.metadata.generation.unwrap_or_default();
    (change.plan
        || change.parameters
        || change.upgrade.is_some()
        || generation != status.reconciled_generation)
        .then_some(change)
}

pub(super) async fn update(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    resolved: &Resolved,
    parameters: &Parameters,
    change: Change,
) -> Result<Action, Error> {
    let external = status.external_properties.clone().unwrap_or_default();
    let mut previous = Map::new();
    if let Some(id) = plan_id(&external) {
        previous.insert("plan_id".into(), Value::String(id.to_owned()));
    }
    previous.insert(
        "service_id".into(),
        Value::String(resolved.class.external_id.clone()),
    );
    let request = UpdateRequest {
        service_id: resolved.class.external_id.clone(),
        plan_id: change.plan.then(|| resolved.plan.external_id.clone()),
        context: Some(osb_context(instance, ctx)),
        // Parameters that were removed altogether are sent as an empty object.
        parameters: change
            .parameters
            .then(|| parameters.merged.clone().unwrap_or_default()),
        previous_values: Some(previous),
        maintenance_info: change.upgrade.clone().map(|version| MaintenanceInfo {
            version,
            description: None,
        }),
    };
    // The version the instance runs once the update succeeds: the one it upgrades to; after a
    // change of plan, the new plan's (the broker moves it there); else the one it runs.
    let version = change.upgrade.clone().or_else(|| match change.plan {
        true => (resolved.plan.maintenance_info.as_ref()).map(|m| m.version.clone()),
        false => external.maintenance_info_version.clone(),
    });
    // Only an update that a new generation of the spec asks for is its writer's; one that a
    // parameters Secret or the catalog caused carries no identity.
    let user = if instance.metadata.generation.unwrap_or_default() != status.reconciled_generation {
        let checked = (ctx.user_info)
            .checked(
                INSTANCES,
                &instance.metadata,
                instance.spec.user_info.as_ref(),
            )
            .await;
        checked.record(&mut status.conditions, &ctx.metrics, "ServiceInstance");
        checked.user()
    } else {
        None
    };
    let answer = Guard::client(&resolved.osb, user)?
        .update(&instance_id(instance), &request, true)
        .await;
    ctx.metrics.osb_call("update", &answer);
    status.in_progress_properties = Some(properties(resolved, parameters, user, version));
    match answer {
        Ok(response) if response.is_async() => {
            status.dashboard_url = response.body.dashboard_url.clone().or(status.dashboard_url);
            let waiting = (
                "UpdatingInstance",
                "The instance is being updated asynchronously",
            );
            let operation = response.body.operation.clone();
            let kind = ServiceInstanceOperation::Update;
            started(
                instance,
                ctx,
                status,
                resolved,
                Accepted {
                    kind,
                    operation,
                    retry_after: response.retry_after,
                    waiting: Some(waiting),
                },
            )
            .await
        }
        Ok(response) => {
            status.dashboard_url = response.body.dashboard_url.clone().or(status.dashboard_url);
            updated(instance, ctx, status, &resolved.plan).await
        }
        Err(e) => {
            let said = resolved.said(&e);
            call_failed(instance, ctx, status, &e, said).await
        }
    }
}

/// The update call failed. A broker's refusal stands until the spec (or a parameters Secret)
/// changes; a broker that cannot be reached or answers 5xx/429 is tried again.
async fn call_failed(
    instance: &ServiceInstance,
    ctx: &Context,
    status: ServiceInstanceStatus,
    e: &OsbError,
    said: String,
) -> Result<Action, Error> {
    // A maintenance version the broker's catalog no longer has: the catalog resources catch up
    // at the next listing, and the upgrade is tried again.
    let retry = e.is_transient()
        || !matches!(e, OsbError::Broker(_))
        || matches!(e, OsbError::Broker(b) if b.code() == Some(ErrorCode::MaintenanceInfoConflict));
    let reason = if retry {
        reason::UPDATE_ERROR
    } else {
        reason::UPDATE_FAILED
    };
    update_failed(
        instance,
        ctx,
        status,
        reason,
        format!("Update call failed: {said}"),
    )
    .await?;
    Ok(if retry {
        Action::requeue(RECHECK)
    } else {
        Action::await_change()
    })
}
