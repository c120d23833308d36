//! The servicebinding.io ServiceBinding controller: projects a Provisioned Service's Secret
//! into the workloads a binding names (by name or by label selector) through the
//! [`projector`](crate::projector), and unprojects it from workloads it no longer names and when
//! the binding goes.
//!
//! - The service: a `v1` `Secret` directly (Direct Secret Reference), else any resource whose
//!   `.status.binding.name` names a Secret (brokkr's ServiceBinding included).
//! - The mapping: the ClusterWorkloadResourceMapping named `<plural>.<group>` (its entry for the
//!   workload's version, else `*`), else the built-in one, else `PodSpec`-able. The entry used is
//!   recorded on each workload (annotation `mapping.projection.services.brokkr.dev/<volume>` in
//!   its own metadata), and unprojection uses it. A workload whose mapping changed is unprojected
//!   with the old one and projected again with the new one.
//! - Every workload of the kind in the namespace is looked at: those matched are projected, those
//!   carrying this binding's projection but no longer matched (renamed, relabelled) are
//!   unprojected.
//! - Conditions `ServiceAvailable`, `WorkloadProjected` and `Ready`, `observedGeneration` and
//!   `.status.binding`.
//!
//! The service's kind and the workload's kind are watched ([`crate::workloads`]): a workload
//! created, renamed or relabelled, or a service whose `.status.binding` moved, wakes the
//! bindings it concerns at once; each binding also looks again every 5 minutes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt as _};
use serde_json::json;

mod projection;
mod service;
mod status;

use crate::changes;
use crate::context::{Context, stopping_on};
use crate::finalizer;
use crate::projector::Projection;
use crate::resources::LocalObjectReference;
use crate::resources::servicebinding_io::ServiceBinding;
use crate::status::STALE_RETRY;
use crate::workloads::Error;
use projection::{
    CONTROLLER, WORKLOAD_ANNOTATION, concerns, mapping_template, release_previous_kind,
    sync_workloads, workload_api,
};
use service::service_secret;
use status::{Observed, write_status};

/// The finalizer under which a binding's projections are removed.
pub const FINALIZER: &str = "servicebinding.io/finalizer";
/// How soon a failed reconcile is tried again.
const RECHECK: Duration = Duration::from_secs(10);
/// How often a binding looks at its service and workloads although none changed (their changes
/// wake it at once: this is a safety net).
const RESYNC: Duration = Duration::from_secs(5 * 60);

/// Runs the controller until `shutdown` completes.
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let controller = ctx.controller(
        ctx.scope.api::<ServiceBinding>(&client),
        ctx.scope.watch_config(),
    );
    let bindings = controller.store();
    let controller = controller
        // A service or workload that appears, goes or changes wakes the bindings it concerns.
        .reconcile_on(changes::waking(
            bindings,
            ctx.workloads.changes(),
            |bindings, change| changes::woken(bindings, |b| concerns(b, &change)),
        ))
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "servicebinding.io controller");
            }
        });
    stopping_on(controller, shutdown).await;
}

/// Reconciles one servicebinding.io ServiceBinding.
pub async fn reconcile(binding: Arc<ServiceBinding>, ctx: Arc<Context>) -> Result<Action, Error> {
    let result = match reconcile_inner(&binding, &ctx).await {
        // The binding changed after it was read (a cached version behind its own last write):
        // the watch brings the newer one.
        Err(e) if e.is_conflict() => {
            ctx.metrics.conflict(CONTROLLER);
            tracing::debug!(namespace = %binding.namespace().unwrap_or_default(), binding = %binding.name_any(), error = %e, "changed since read: looking again");
            Ok(Action::requeue(STALE_RETRY))
        }
        result => result,
    };
    ctx.metrics.reconciled(CONTROLLER, result.is_err());
    if let Err(e) = &result {
        tracing::warn!(namespace = %binding.namespace().unwrap_or_default(), binding = %binding.name_any(), error = %e, "reconcile failed");
    }
    result
}

/// What to do after a failed reconcile: try again soon.
pub fn error_policy(_: Arc<ServiceBinding>, _: &Error, _: Arc<Context>) -> Action {
    Action::requeue(RECHECK)
}

async fn reconcile_inner(binding: &ServiceBinding, ctx: &Context) -> Result<Action, Error> {
    let namespace = binding.namespace().unwrap_or_default();
    let api = Api::<ServiceBinding>::namespaced(ctx.client.clone(), &namespace);
    let workload = &binding.spec.workload;
    let workloads = workload_api(ctx, &workload.api_version, &workload.kind, &namespace).await?;
    let kind = format!("{} {}", workload.api_version, workload.kind);

    if binding.metadata.deletion_timestamp.is_some() {
        if let Some((api, _)) = &workloads {
            let (_, failures) = sync_workloads(binding, ctx, api, None, &[]).await?;
            // A record nobody can read again would keep the binding forever: let it go.
            for failure in failures {
                tracing::warn!(binding = %binding.name_any(), %failure, "not unprojected");
            }
        }
        release_previous_kind(binding, ctx, &namespace, Some(&kind)).await?;
        finalizer::remove(&api, binding, FINALIZER).await?;
        return Ok(Action::await_change());
    }
    finalizer::add(&api, binding, FINALIZER).await?;
    // Another kind of workload than last time: unproject from the old kind's workloads first.
    release_previous_kind(binding, ctx, &namespace, Some(&kind)).await?;
    if binding.annotations().get(WORKLOAD_ANNOTATION) != Some(&kind) {
        api.patch(
            &binding.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {WORKLOAD_ANNOTATION: kind}}})),
        )
        .await?;
    }
    let invalid = match (&workload.name, &workload.selector) {
        (Some(_), Some(_)) => Some("sets both name and selector"),
        (None, None) => Some("sets neither name nor selector"),
        _ => None,
    };

    let mut observed = Vec::new();
    let secret = service_secret(binding, ctx, &namespace).await?;
    observed.push(match &secret {
        Ok(name) => Observed {
            type_: "ServiceAvailable",
            ok: Some(true),
            reason: "ResolvedBindingSecret",
            message: format!("Secret {name}"),
        },
        Err((reason, message)) => Observed {
            type_: "ServiceAvailable",
            ok: Some(false),
            reason,
            message: message.clone(),
        },
    });

    let projected = match (&workloads, &secret) {
        _ if invalid.is_some() => Observed {
            type_: "WorkloadProjected",
            ok: Some(false),
            reason: "InvalidWorkloadReference",
            message: format!("spec.workload {}", invalid.unwrap_or_default()),
        },
        (None, _) => Observed {
            type_: "WorkloadProjected",
            ok: Some(false),
            reason: "WorkloadNotFound",
            message: format!(
                "{} {} is not served",
                binding.spec.workload.api_version, binding.spec.workload.kind
            ),
        },
        (Some(_), Err(_)) => Observed {
            type_: "WorkloadProjected",
            ok: None,
            reason: "ServiceNotAvailable",
            message: "waiting for the service".into(),
        },
        (Some((api, resource)), Ok(secret)) => {
            let template = mapping_template(ctx, resource).await?;
            let projection = Projection {
                binding: binding.name_any(),
                name: binding
                    .spec
                    .name
                    .clone()
                    .unwrap_or_else(|| binding.name_any()),
                secret: secret.clone(),
                type_: binding.spec.type_.clone(),
                provider: binding.spec.provider.clone(),
                env: binding
                    .spec
                    .env
                    .iter()
                    .map(|e| (e.name.clone(), e.key.clone()))
                    .collect(),
                containers: binding.spec.workload.containers.clone().unwrap_or_default(),
            };
            match sync_workloads(binding, ctx, api, Some(&projection), &[template]).await {
                Ok((_, failures)) if !failures.is_empty() => Observed {
                    type_: "WorkloadProjected",
                    ok: Some(false),
                    reason: "WorkloadProjectionFailed",
                    message: failures.join("; "),
                },
                Ok((0, _)) => Observed {
                    type_: "WorkloadProjected",
                    ok: Some(false),
                    reason: "WorkloadNotFound",
                    message: "no workload matches".into(),
                },
                Ok((n, _)) => Observed {
                    type_: "WorkloadProjected",
                    ok: Some(true),
                    reason: "WorkloadProjected",
                    message: format!("projected into {n} workload(s)"),
                },
                Err(Error::Projector(e)) => Observed {
                    type_: "WorkloadProjected",
                    ok: Some(false),
                    reason: "WorkloadProjectionFailed",
                    message: e.to_string(),
                },
                Err(e) => return Err(e),
            }
        }
    };
    let service = &observed[0];
    let ready = if service.ok != Some(true) {
        Observed {
            type_: "Ready",
            ok: Some(false),
            reason: service.reason,
            message: service.message.clone(),
        }
    } else {
        Observed {
            type_: "Ready",
            ok: Some(projected.ok == Some(true)),
            reason: if projected.ok == Some(true) {
                "Ready"
            } else {
                projected.reason
            },
            message: projected.message.clone(),
        }
    };
    observed.push(projected);
    observed.push(ready);
    let binding_secret = secret.ok().map(|name| LocalObjectReference { name });
    write_status(&api, binding, binding_secret, observed).await?;
    Ok(Action::requeue(RESYNC))
}
