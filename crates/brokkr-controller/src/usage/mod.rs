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
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt as _};

use crate::changes::{self, BindingChange, SecretChange, Seen};
use crate::context::Context;
use crate::finalizer;
use crate::index::Index;
use crate::resources::{ServiceBindingUsage, UsageKind};

mod inject;
mod kinds;
mod status;

use crate::status::STALE_RETRY;
use crate::workloads::Error;
use inject::{CONTROLLER, RECHECK, inject, remove};
pub use kinds::{create_shipped_usage_kinds, shipped_usage_kinds};
use status::write_status;

/// The finalizer under which a usage's injection is removed.
pub const FINALIZER: &str = "services.brokkr.dev/service-binding-usage";

/// Reconciles one ServiceBindingUsage.
pub async fn reconcile(
    usage: Arc<ServiceBindingUsage>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let result = match reconcile_inner(&usage, &ctx).await {
        // The usage changed after it was read (a cached version behind its own last write):
        // the watch brings the newer one.
        Err(e) if e.is_conflict() => {
            ctx.metrics.conflict(CONTROLLER);
            tracing::debug!(namespace = %usage.namespace().unwrap_or_default(), usage = %usage.name_any(), error = %e, "changed since read: looking again");
            Ok(Action::requeue(STALE_RETRY))
        }
        result => result,
    };
    ctx.metrics.reconciled(CONTROLLER, result.is_err());
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

/// The controller of [`run`], woken by `bindings` and `secrets`. What a change wakes is found
/// in indexes of the usages, kept from their watch, not by scanning every usage.
async fn following(
    ctx: Arc<Context>,
    bindings: impl futures::Stream<Item = Seen<Arc<BindingChange>>> + Send + 'static,
    secrets: impl futures::Stream<Item = Seen<Arc<SecretChange>>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) {
    let client = &ctx.client.clone();
    let by_name = Arc::new(Index::new(names_of));
    let by_kind = Arc::new(Index::cluster_wide(|u: &ServiceBindingUsage| {
        vec![u.spec.used_by.kind.clone()]
    }));
    let controller = ctx.controller_with(
        ctx.scope.api::<ServiceBindingUsage>(client),
        ctx.scope.watch_config(),
        {
            let (by_name, by_kind) = (by_name.clone(), by_kind.clone());
            move |event| {
                by_name.apply(event);
                by_kind.apply(event);
            }
        },
    );
    let usages = controller.store();
    let controller = controller
        .reconcile_on(changes::waking(usages.clone(), bindings, {
            let by_name = by_name.clone();
            move |_, change| {
                let binding = &change.binding;
                filed(&by_name, &binding.namespace, [binding_key(&binding.name)])
            }
        }))
        .reconcile_on(changes::waking(usages.clone(), secrets, {
            let by_name = by_name.clone();
            move |_, change| {
                let secret = &change.secret;
                let owners = secret
                    .owner_references()
                    .iter()
                    .filter(|o| {
                        o.kind == "ServiceBinding"
                            && o.api_version.starts_with(crate::resources::GROUP)
                    })
                    .map(|o| binding_key(&o.name));
                filed(&by_name, &secret.metadata.namespace, owners)
            }
        }))
        .watches(
            Api::<UsageKind>::all(client.clone()),
            watcher::Config::default(),
            move |kind| by_kind.get("", &kind.name_any()),
        )
        // A workload that appears, goes or changes wakes the usages that name it.
        .reconcile_on(changes::waking(
            usages,
            ctx.workloads.changes(),
            move |_, change| {
                let name = change.metadata.name.as_deref().map(workload_key);
                filed(&by_name, &change.metadata.namespace, name)
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

/// What a usage is indexed under within its namespace: the ServiceBinding it uses and the
/// name of the workload it injects into (of whatever kind: a change to any workload of that
/// name wakes it, as its kind may be the one).
fn names_of(usage: &ServiceBindingUsage) -> Vec<String> {
    vec![
        binding_key(&usage.spec.service_binding_ref.name),
        workload_key(&usage.spec.used_by.name),
    ]
}

/// The usages of `namespace` filed in `index` under any of `keys`.
fn filed(
    index: &Index<ServiceBindingUsage>,
    namespace: &Option<String>,
    keys: impl IntoIterator<Item = String>,
) -> Vec<ObjectRef<ServiceBindingUsage>> {
    let namespace = namespace.as_deref().unwrap_or_default();
    keys.into_iter()
        .flat_map(|key| index.get(namespace, &key))
        .collect()
}

fn binding_key(name: &str) -> String {
    format!("binding/{name}")
}

fn workload_key(name: &str) -> String {
    format!("workload/{name}")
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
    // Go on with the usage as written: a later write guarded by its version (its owner) would
    // otherwise meet the finalizer's own write.
    let added = finalizer::add(&api, usage, FINALIZER).await?;
    let usage = added.as_ref().unwrap_or(usage);

    let (outcome, action) = inject(usage, ctx, &namespace, &mut status).await?;
    write_status(&api, usage, status, outcome).await?;
    Ok(action)
}
