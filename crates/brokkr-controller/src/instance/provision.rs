//! Provisioning: the ids recorded before the first call, the call, and a failure — terminal,
//! tried again, or one the broker may have half done, which starts orphan mitigation
//! ([`super::outcome`]).

use std::time::Duration;

use crate::runner::Action;
use brokkr_osb::client::Error as OsbError;
use brokkr_osb::messages::ProvisionRequest;
use brokkr_osb::{ErrorCode, MaintenanceInfo};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::runtime::events::EventType;

use super::outcome::{RETRY_AFTER_MITIGATION, provisioned, start_orphan_mitigation};
use super::poll::{Accepted, started};
use super::state::{end_operation, event, properties, reason, set, write_status};
use crate::context::Context;
use crate::error::Error;
use crate::identity::instance_id;
use crate::parameters::Parameters;
use crate::platform::osb_context;
use crate::resolve::Resolved;
use crate::resources::{
    ConditionStatus, DeprovisionStatus, ServiceInstance, ServiceInstanceOperation,
    ServiceInstanceStatus,
};
use crate::user_info::{Guard, INSTANCES};
use crate::{identity, platform};

pub(super) async fn provision(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    resolved: &Resolved,
    parameters: &Parameters,
) -> Result<Action, Error> {
    // After an orphan mitigation, pause before trying again (a status write wakes us at once).
    if status.last_condition_state == reason::ORPHAN_MITIGATED
        && let Some(since) = &status.operation_start_time
    {
        let waited: Duration = Timestamp::now()
            .duration_since(since.0)
            .try_into()
            .unwrap_or_default();
        if waited < RETRY_AFTER_MITIGATION {
            return Ok(Action::requeue(RETRY_AFTER_MITIGATION - waited));
        }
    }
    let uid = instance.uid().unwrap_or_default();
    if let Some(wait) = ctx.backoffs.wait(&uid) {
        // The last provision failed: the next waits its turn.
        return Ok(Action::requeue(wait));
    }
    status.conditions.retain(|c| c.type_ != "Failed");
    if status.external_id.is_none() {
        // The first call: the ids it is made with are recorded before it is made.
        let id = instance_id(instance);
        if identity::instance_id_in_use(&ctx.caches.instances_with_id(&id), instance) {
            let message = "another ServiceInstance already has this spec.externalID: leave it out, or choose another".to_owned();
            set(
                &mut status,
                "Failed",
                ConditionStatus::True,
                identity::IN_USE,
                message.clone(),
            );
            set(
                &mut status,
                "Ready",
                ConditionStatus::False,
                identity::IN_USE,
                message.clone(),
            );
            write_status(instance, ctx, &status).await?;
            event(
                ctx,
                instance,
                EventType::Warning,
                identity::IN_USE,
                &message,
            )
            .await;
            return Ok(Action::await_change());
        }
        identity::record_instance(instance, &mut status, &resolved.class.external_id);
        // From the call on, the broker may hold the instance: its deletion deprovisions it,
        // whatever becomes of the status this process has not written yet.
        status.deprovision_status = Some(DeprovisionStatus::Required);
        set(
            &mut status,
            "Ready",
            ConditionStatus::False,
            "Provisioning",
            "The instance is being provisioned",
        );
        write_status(instance, ctx, &status).await?;
    }
    let version = (resolved.plan.maintenance_info.as_ref()).map(|m| m.version.clone());
    let request = ProvisionRequest {
        service_id: resolved.class.external_id.clone(),
        plan_id: resolved.plan.external_id.clone(),
        context: Some(osb_context(instance, ctx)),
        parameters: parameters.merged.clone(),
        // Required by OSB 2.17 (deprecated in favour of `context`, and some brokers refuse a
        // provision without them): the cluster, and the namespace within it.
        organization_guid: Some(
            ctx.cluster_id
                .clone()
                .unwrap_or_else(|| "kubernetes".to_owned()),
        ),
        space_guid: Some(instance.namespace().unwrap_or_default()),
        // The version the instance is built at, as the catalog resources say.
        maintenance_info: version.clone().map(|version| MaintenanceInfo {
            version,
            description: None,
        }),
    };
    // The provision is the spec's: it carries the identity of whoever wrote it, if checked.
    let checked = (ctx.user_info)
        .checked(
            INSTANCES,
            &instance.metadata,
            instance.spec.user_info.as_ref(),
        )
        .await;
    checked.record(&mut status.conditions, &ctx.metrics, "ServiceInstance");
    let user = checked.user();
    let answer = Guard::client(&resolved.osb, user)?
        .provision(&instance_id(instance), &request, true)
        .await;
    ctx.metrics.osb_call("provision", &answer);
    status.in_progress_properties = Some(properties(resolved, parameters, user, version));
    match answer {
        Ok(response) if response.is_async() => {
            status.deprovision_status = Some(DeprovisionStatus::Required);
            status.dashboard_url = response.body.dashboard_url.clone().or(status.dashboard_url);
            let waiting = (
                "Provisioning",
                "The instance is being provisioned asynchronously",
            );
            let operation = response.body.operation.clone();
            let kind = ServiceInstanceOperation::Provision;
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
            status.dashboard_url = response.body.dashboard_url.clone();
            provisioned(instance, ctx, status).await
        }
        Err(e) => {
            let said = resolved.said(&e);
            failed(instance, ctx, status, e, said).await
        }
    }
}

/// A provision the broker refused or could not answer. 400, 409 and 422 (but
/// `MaintenanceInfoConflict`) are terminal; a failure
/// that may have left an instance behind starts orphan mitigation; anything else is tried again.
async fn failed(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    e: OsbError,
    said: String,
) -> Result<Action, Error> {
    let reason = "ProvisionCallFailed";
    let message = format!("Provision call failed: {said}");
    event(ctx, instance, EventType::Warning, reason, &message).await;
    if platform::may_have_created(&e) {
        return start_orphan_mitigation(instance, ctx, status, &message, false).await;
    }
    // A maintenance version the broker's catalog no longer has is tried again: the catalog
    // resources catch up at the next listing.
    let terminal = matches!(e.status().map(|s| s.as_u16()), Some(400 | 409 | 422))
        && !matches!(&e, OsbError::Broker(b) if b.code() == Some(ErrorCode::MaintenanceInfoConflict));
    end_operation(&mut status);
    if terminal {
        status.deprovision_status = Some(DeprovisionStatus::NotRequired);
        set(
            &mut status,
            "Failed",
            ConditionStatus::True,
            reason,
            message.clone(),
        );
    } else {
        status.deprovision_status = Some(DeprovisionStatus::Required);
    }
    set(
        &mut status,
        "Ready",
        ConditionStatus::False,
        reason,
        message,
    );
    write_status(instance, ctx, &status).await?;
    Ok(if terminal {
        Action::await_change()
    } else {
        Action::requeue(ctx.backoffs.failed(&instance.uid().unwrap_or_default()))
    })
}
