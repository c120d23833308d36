//! Polling the operation in progress (provision, update, deprovision or the deprovision of an
//! orphan mitigation) until it ends or outlives the plan's maximum polling duration; once a
//! provision or update succeeds, the instance's dashboard URL is fetched where the class allows.
//! An operation the broker accepted is recorded here too ([`started`]), and polled at once.

use crate::runner::Action;
use brokkr_osb::client::{Poll, Response};
use brokkr_osb::messages::{LastOperation, OperationState};

use super::outcome::{
    after_operation, deprovisioned, provisioned, start_orphan_mitigation, update_failed, updated,
};
use super::state::{RECHECK, end_operation, reason, set, write_status};
use crate::context::Context;
use crate::error::Error;
use crate::identity::instance_id;
use crate::platform;
use crate::resolve::Resolved;
use crate::resources::{
    ConditionStatus, DeprovisionStatus, ServiceInstance, ServiceInstanceOperation,
    ServiceInstanceStatus,
};

/// Polls the operation in progress.
pub(super) async fn poll(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    resolved: &Resolved,
) -> Result<Action, Error> {
    let operation = status
        .current_operation
        .unwrap_or(ServiceInstanceOperation::Provision);
    let deprovisioning = operation == ServiceInstanceOperation::Deprovision;
    let mut poll = Poll::instance(instance_id(instance))
        .operation(status.last_operation.clone())
        .plan(resolved.plan_ref());
    if deprovisioning {
        poll = poll.deleting();
    }
    let answer = resolved.osb.last_operation(&poll).await;
    ctx.metrics.osb_call("last_operation", &answer);
    let (last, retry_after) = match answer {
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
    let verb = match operation {
        ServiceInstanceOperation::Provision => "Provision",
        ServiceInstanceOperation::Update => "Update",
        ServiceInstanceOperation::Deprovision => "Deprovision",
    };
    match last.state {
        OperationState::InProgress => {
            let elapsed = platform::elapsed_since(status.operation_start_time.as_ref());
            if elapsed > resolved.max_polling() {
                let message = format!(
                    "the broker did not finish the {} within {}",
                    verb.to_lowercase(),
                    platform::humanize(resolved.max_polling())
                );
                return ended_badly(instance, ctx, status, operation, "TimedOut", message).await;
            }
            let description = last
                .description
                .unwrap_or_else(|| format!("{verb} in progress"));
            let reason = match operation {
                ServiceInstanceOperation::Update => "UpdatingInstance".to_owned(),
                _ => format!("{verb}ing"),
            };
            set(
                &mut status,
                "Ready",
                ConditionStatus::False,
                &reason,
                description,
            );
            let written = instance
                .status
                .as_ref()
                .is_some_and(|s| s.async_op_in_progress);
            // Young, its start is written only if it lasts (most end before).
            if !ctx
                .held_instances
                .hold_start(instance, written, elapsed, &status)
            {
                write_status(instance, ctx, &status).await?;
            }
            Ok(Action::requeue(platform::poll_pause(retry_after, elapsed)))
        }
        OperationState::Succeeded => match operation {
            ServiceInstanceOperation::Provision => {
                fetch_dashboard_url(instance, ctx, &mut status, resolved).await;
                provisioned(instance, ctx, status).await
            }
            ServiceInstanceOperation::Update => {
                fetch_dashboard_url(instance, ctx, &mut status, resolved).await;
                updated(instance, ctx, status, &resolved.plan).await
            }
            ServiceInstanceOperation::Deprovision => deprovisioned(instance, ctx, status).await,
        },
        OperationState::Failed => {
            let message = format!(
                "{verb} failed: {}",
                last.description
                    .unwrap_or_else(|| "the broker gave no reason".into())
            );
            ended_badly(instance, ctx, status, operation, "CallFailed", message).await
        }
    }
}

/// After an asynchronous provision or update succeeded: the instance's dashboard URL as the
/// broker now answers it, from a fetch of the instance where the class is
/// `instancesRetrievable` (a broker may learn the URL while the operation runs, and
/// last_operation does not carry it). Without one, or when the fetch fails, the URL known
/// before is kept; the operation's outcome does not depend on it.
async fn fetch_dashboard_url(
    instance: &ServiceInstance,
    ctx: &Context,
    status: &mut ServiceInstanceStatus,
    resolved: &Resolved,
) {
    if !resolved.class.instances_retrievable {
        return;
    }
    let plan = resolved.plan_ref();
    let answer = resolved
        .osb
        .instance(&instance_id(instance), Some(&plan))
        .await;
    ctx.metrics.osb_call("fetch_instance", &answer);
    match answer {
        Ok(fetched) => {
            if let Some(url) = fetched.body.dashboard_url {
                status.dashboard_url = Some(url);
            }
        }
        Err(e) => tracing::warn!(error = %e, "fetching the instance for its dashboard URL failed"),
    }
}

/// An operation failed or timed out. A provision's is followed by orphan mitigation, then
/// `Failed`; an update's leaves the instance as it was; a deprovision is tried again.
async fn ended_badly(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    operation: ServiceInstanceOperation,
    how: &str,
    message: String,
) -> Result<Action, Error> {
    match operation {
        ServiceInstanceOperation::Provision if how == "CallFailed" => {
            start_orphan_mitigation(instance, ctx, status, &message, true).await
        }
        ServiceInstanceOperation::Provision => {
            let reason = format!("Provision{how}");
            end_operation(&mut status);
            set(
                &mut status,
                "Failed",
                ConditionStatus::True,
                &reason,
                message.clone(),
            );
            set(
                &mut status,
                "Ready",
                ConditionStatus::False,
                &reason,
                message,
            );
            write_status(instance, ctx, &status).await?;
            Ok(Action::await_change())
        }
        ServiceInstanceOperation::Update => {
            let ended = status.clone();
            update_failed(instance, ctx, status, reason::UPDATE_FAILED, message).await?;
            Ok(after_operation(instance, &ended, Action::await_change()))
        }
        ServiceInstanceOperation::Deprovision => {
            let reason = format!("Deprovision{how}");
            end_operation(&mut status);
            status.deprovision_status = Some(DeprovisionStatus::Failed);
            set(
                &mut status,
                "Ready",
                ConditionStatus::False,
                &reason,
                message,
            );
            write_status(instance, ctx, &status).await?;
            Ok(Action::requeue(RECHECK))
        }
    }
}

/// Records an operation the broker accepted asynchronously, `operation` being what to poll
/// `last_operation` with, and sets `Ready` to `waiting` (reason, message) when given; polls after
/// the broker's `Retry-After`, else after a second.
/// An operation a broker accepted to run asynchronously (a 202).
pub(super) struct Accepted<'a> {
    pub kind: crate::resources::ServiceInstanceOperation,
    /// The broker's operation key.
    pub operation: Option<String>,
    pub retry_after: Option<std::time::Duration>,
    /// The `Ready` condition's reason and message while it runs, if they change.
    pub waiting: Option<(&'a str, &'a str)>,
}

pub(super) async fn started(
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
        match poll(instance, ctx, status.clone(), resolved).await {
            Ok(action) => return Ok(action),
            Err(e) => tracing::debug!(error = %e, "the first poll of an operation"),
        }
    }
    write_status(instance, ctx, &status).await?;
    Ok(Action::requeue(platform::poll_pause(
        retry_after,
        std::time::Duration::ZERO,
    )))
}
