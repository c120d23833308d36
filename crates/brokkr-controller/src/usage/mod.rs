//! The ServiceBindingUsage controller: injects the Secret of a brokkr ServiceBinding into the
//! workload a usage names, through the [`projector`](crate::projector), and removes exactly that
//! injection when the usage goes or names another workload.
//!
//! A usage waits, with its `Ready` condition saying why (`ServiceBindingNotReady`,
//! `SecretNotFound`, `UsageKindNotFound`, `InvalidUsageKind`, `TargetNotFound`), until the
//! binding has a Secret, the UsageKind exists and the workload exists; then it is `Injected`.
//! The usage gets an ownerReference to its ServiceBinding (deleting the binding deletes its
//! usages) and a finalizer under which the injection is removed. `status.injected` records the
//! workload and the mapping used, so a removal uses them even after `usedBy` or the UsageKind
//! changed. The workload is changed with a JSON patch of exactly the projector's edit, guarded
//! by a `test` of its `resourceVersion`: a concurrent change makes it fail and retry, and
//! everybody else's fields are kept.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt as _;

use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kube::{Api, ResourceExt as _};

use crate::cache::{self, BindingChange, SecretChange, Seen};
use crate::context::Context;
use crate::finalizer;
use crate::resources::{ServiceBindingUsage, UsageKind};

mod inject;
mod kinds;
mod status;

use crate::workloads::Error;
use inject::{RECHECK, inject, remove};
pub use kinds::{create_shipped_usage_kinds, shipped_usage_kinds};
use status::write_status;

/// The finalizer under which a usage's injection is removed.
pub const FINALIZER: &str = "services.brokkr.dev/service-binding-usage";

/// Reconciles one ServiceBindingUsage.
pub async fn reconcile(
    usage: Arc<ServiceBindingUsage>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let result = reconcile_inner(&usage, &ctx).await;
    ctx.metrics
        .reconciled("ServiceBindingUsage", result.is_err());
    if let Err(e) = &result {
        tracing::warn!(namespace = %usage.namespace().unwrap_or_default(), usage = %usage.name_any(), error = %e, "reconcile failed");
    }
    result
}

/// What to do after a failed reconcile: try again soon.
pub fn error_policy(_: Arc<ServiceBindingUsage>, _: &Error, _: Arc<Context>) -> Action {
    Action::requeue(RECHECK)
}

/// The ServiceBindingUsage controller, after creating the shipped UsageKinds that are missing.
/// A usage is looked at again when its ServiceBinding, that binding's Secret or its UsageKind
/// changes: bindings and Secrets as the context's caches follow them ([`crate::cache`]; the
/// caller starts them), from the moment `run` is called.
pub fn run(
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let bindings = ctx.caches.binding_changes();
    let secrets = ctx.caches.secret_changes();
    async move {
        if let Err(e) = create_shipped_usage_kinds(&ctx.client).await {
            tracing::warn!(error = %e, "creating the shipped UsageKinds");
        }
        following(ctx, bindings, secrets, shutdown).await;
    }
}

/// The controller of [`run`], woken by `bindings` and `secrets`.
async fn following(
    ctx: Arc<Context>,
    bindings: impl futures::Stream<Item = Seen<Arc<BindingChange>>> + Send + 'static,
    secrets: impl futures::Stream<Item = Seen<Arc<SecretChange>>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) {
    let client = &ctx.client.clone();
    let controller = ctx.controller(
        ctx.scope.api::<ServiceBindingUsage>(client),
        ctx.scope.watch_config(),
    );
    let usages = controller.store();
    let of_kinds = usages.clone();
    let controller = controller
        .reconcile_on(cache::waking(usages.clone(), bindings, |usages, change| {
            let (namespace, name) = (&change.binding.namespace, &change.binding.name);
            cache::woken(usages, |u| {
                u.metadata.namespace == *namespace && u.spec.service_binding_ref.name == *name
            })
        }))
        .reconcile_on(cache::waking(usages.clone(), secrets, |usages, change| {
            let secret = &change.secret;
            let namespace = secret.namespace();
            let owners: Vec<String> = secret
                .owner_references()
                .iter()
                .filter(|o| {
                    o.kind == "ServiceBinding" && o.api_version.starts_with(crate::resources::GROUP)
                })
                .map(|o| o.name.clone())
                .collect();
            cache::woken(usages, |u| {
                u.namespace() == namespace && owners.contains(&u.spec.service_binding_ref.name)
            })
        }))
        .watches(
            Api::<UsageKind>::all(client.clone()),
            watcher::Config::default(),
            move |kind| {
                let name = kind.name_any();
                cache::woken(&of_kinds, |u| u.spec.used_by.kind == name)
            },
        )
        // A workload that appears, goes or changes wakes the usages that name it.
        .reconcile_on(cache::waking(
            usages,
            ctx.workloads.changes(),
            |usages, change| {
                let (namespace, name) = (&change.metadata.namespace, &change.metadata.name);
                cache::woken(usages, |u| {
                    u.metadata.namespace == *namespace
                        && Some(&u.spec.used_by.name) == name.as_ref()
                })
            },
        ))
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "usage controller");
            }
        });
    crate::context::stopping_on(controller, shutdown).await;
}

async fn reconcile_inner(usage: &ServiceBindingUsage, ctx: &Context) -> Result<Action, Error> {
    let namespace = usage.namespace().unwrap_or_default();
    let api = Api::<ServiceBindingUsage>::namespaced(ctx.client.clone(), &namespace);
    let mut status = usage.status.clone().unwrap_or_default();

    if usage.metadata.deletion_timestamp.is_some() {
        if let Some(target) = &status.injected {
            match remove(ctx, &namespace, &usage.name_any(), target).await {
                // A workload nobody can edit back would keep the usage forever: let it go.
                Err(Error::Projector(e)) => {
                    tracing::warn!(usage = %usage.name_any(), error = %e, "injection not removed");
                }
                result => result?,
            }
        }
        finalizer::remove(&api, usage, FINALIZER).await?;
        return Ok(Action::await_change());
    }
    finalizer::add(&api, usage, FINALIZER).await?;

    let (outcome, action) = inject(usage, ctx, &namespace, &mut status).await?;
    write_status(&api, usage, status, outcome).await?;
    Ok(action)
}
