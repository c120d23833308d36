//! Deleting a ServiceInstance: its ServiceBindings first (they block it, or with the
//! cascade-delete annotation are deleted), then a deprovision call; the abandon annotation
//! releases it without any broker call. The deprovision calls of an orphan mitigation are made
//! here too.

use std::time::Duration;

use crate::runner::Action;
use kube::api::DeleteParams;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt as _};

use super::outcome::deprovisioned;
use super::poll::{Accepted, started};
use super::state::{
    RECHECK, annotated, end_operation, event, ready_says, reason, remove_finalizer, set,
    write_status,
};
use crate::context::Context;
use crate::error::Error;
use crate::identity::instance_id;
use crate::resolve::{Resolved, broker_of};
use crate::resources::{ABANDON_ANNOTATION, CASCADE_DELETE_ANNOTATION};
use crate::resources::{
    ConditionStatus, DeprovisionStatus, ProvisionStatus, ServiceBinding, ServiceInstance,
    ServiceInstanceOperation, ServiceInstanceStatus,
};

/// Deprovisions the instance being deleted, or the orphan of a failed provision.
pub(super) async fn deprovision(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    resolved: &Resolved,
) -> Result<Action, Error> {
    let deleting = instance.metadata.deletion_timestamp.is_some();
    if deleting
        && !status.orphan_mitigation_in_progress
        && matches!(
            status.deprovision_status,
            None | Some(DeprovisionStatus::NotRequired)
        )
    {
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
            // During orphan mitigation, Ready keeps saying why the provision failed.
            let waiting = (!status.orphan_mitigation_in_progress).then_some((
                "Deprovisioning",
                "The instance is being deprovisioned asynchronously",
            ));
            let operation = response.body.operation.clone();
            let kind = ServiceInstanceOperation::Deprovision;
            started(
                instance,
                ctx,
                status,
                resolved,
                Accepted {
                    kind,
                    operation,
                    retry_after: response.retry_after,
                    waiting,
                },
            )
            .await
        }
        Ok(_) => deprovisioned(instance, ctx, status).await,
        Err(e) => {
            let reason = "DeprovisionCallFailed";
            let message = format!("Deprovision call failed: {}", resolved.said(&e));
            end_operation(&mut status);
            status.deprovision_status = Some(DeprovisionStatus::Failed);
            let message = if deleting {
                format!(
                    "{message}; to remove the resource without deprovisioning, annotate it \
                     {ABANDON_ANNOTATION}=true"
                )
            } else {
                message
            };
            if !ready_says(&status, reason, &message) {
                event(ctx, instance, EventType::Warning, reason, &message).await;
            }
            set(
                &mut status,
                "Ready",
                ConditionStatus::False,
                reason,
                message,
            );
            write_status(instance, ctx, &status).await?;
            Ok(Action::requeue(RECHECK))
        }
    }
}

/// How often an instance whose deletion waits for its bindings looks at them again, though the
/// last of them going wakes it.
const BINDINGS_RECHECK: Duration = Duration::from_secs(60);

/// ServiceBindings that name the instance block its deletion; with the cascade-delete annotation
/// they are deleted, and the instance waits for them to go.
pub(super) async fn bindings_in_the_way(
    instance: &ServiceInstance,
    ctx: &Context,
    status: &mut ServiceInstanceStatus,
) -> Result<Option<Action>, Error> {
    let ns = instance.namespace().unwrap_or_default();
    let api = Api::<ServiceBinding>::namespaced(ctx.client.clone(), &ns);
    let name = instance.name_any();
    // The bindings' cache says which bindings are in the way; only when it says none is the
    // API server asked, so that a binding just created is not missed. In a namespace being
    // deleted nothing can be created and every binding is being deleted: the cache's answer
    // stands (a binding it has not seen yet was never bound).
    let cached: Vec<ServiceBinding> = (ctx.caches)
        .bindings_of_instance(&ObjectRef::new(&name).within(&ns))
        .iter()
        .filter_map(|b| ctx.caches.bindings.get(b))
        .map(|b| b.as_ref().clone())
        .collect();
    let bindings = if cached.is_empty() && !ctx.caches.terminating(&ns) {
        crate::resolve::bindings_of(&ctx.client, &ns, &name).await?
    } else {
        cached
    };
    if bindings.is_empty() {
        return Ok(None);
    }
    let names: Vec<String> = bindings.iter().map(|b| b.name_any()).collect();
    let (reason, message) = if annotated(instance, CASCADE_DELETE_ANNOTATION) {
        for binding in &bindings {
            if binding.metadata.deletion_timestamp.is_none() {
                match api
                    .delete(&binding.name_any(), &DeleteParams::default())
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        (
            reason::CASCADING,
            format!(
                "deleting the ServiceBindings of this instance first: {}",
                names.join(", ")
            ),
        )
    } else {
        (
            reason::BLOCKED,
            format!(
                "delete the ServiceBindings of this instance first (or annotate it \
                 {CASCADE_DELETE_ANNOTATION}=true): {}",
                names.join(", ")
            ),
        )
    };
    set(status, "Ready", ConditionStatus::False, reason, message);
    if !ctx.caches.terminating(&ns) {
        // In a namespace being deleted nobody reads it, and the bindings go by themselves.
        write_status(instance, ctx, status).await?;
    }
    // Each binding that is gone wakes the instance; this is a safety net.
    Ok(Some(Action::requeue(BINDINGS_RECHECK)))
}

/// The instance is being deleted and its class, plan or broker cannot be had (e.g. the broker
/// resource or its Secret is gone): one never provisioned goes; otherwise the condition says
/// why it waits, and that the abandon annotation releases it.
pub(super) async fn without_broker(
    instance: &ServiceInstance,
    ctx: &Context,
    mut status: ServiceInstanceStatus,
    why: String,
) -> Result<Action, Error> {
    let provisioned = status.provision_status == Some(ProvisionStatus::Provisioned)
        || status.async_op_in_progress
        || status.orphan_mitigation_in_progress
        || matches!(
            status.deprovision_status,
            Some(DeprovisionStatus::Required | DeprovisionStatus::Failed)
        );
    if !provisioned {
        remove_finalizer(instance, ctx).await?;
        return Ok(Action::await_change());
    }
    let message = format!(
        "cannot deprovision: {why}; to remove the resource without deprovisioning, annotate it \
         {ABANDON_ANNOTATION}=true"
    );
    set(
        &mut status,
        "Ready",
        ConditionStatus::False,
        reason::NO_BROKER,
        message,
    );
    write_status(instance, ctx, &status).await?;
    Ok(Action::requeue(RECHECK))
}

/// Releases the instance without any broker call, and says what the broker keeps: asked by its
/// annotation, or `with_namespace`, whose deletion waited too long ([`crate::namespace_deletion`]).
pub(super) async fn abandon(
    instance: &ServiceInstance,
    ctx: &Context,
    with_namespace: bool,
) -> Result<Action, Error> {
    let status = instance.status.clone().unwrap_or_default();
    let kept = status.provision_status == Some(ProvisionStatus::Provisioned)
        || status.async_op_in_progress
        || status.orphan_mitigation_in_progress
        || matches!(
            status.deprovision_status,
            Some(DeprovisionStatus::Required | DeprovisionStatus::Failed)
        );
    let broker = broker_of(instance, ctx)
        .await
        .unwrap_or_else(|| "its broker (no longer known)".into());
    let message = if kept {
        format!(
            "abandoned without deprovisioning: {broker} keeps OSB instance {}",
            instance_id(instance)
        )
    } else {
        format!(
            "abandoned; OSB instance {} at {broker} was never provisioned",
            instance_id(instance)
        )
    };
    let namespace = instance.namespace().unwrap_or_default();
    if with_namespace {
        let name = instance.name_any();
        crate::namespace_deletion::released(ctx, "ServiceInstance", &namespace, &name, &message)
            .await;
    } else {
        event(
            ctx,
            instance,
            EventType::Warning,
            reason::ABANDONED,
            &message,
        )
        .await;
        tracing::info!(%namespace, instance = %instance.name_any(), "{message}");
    }
    remove_finalizer(instance, ctx).await?;
    Ok(Action::await_change())
}
