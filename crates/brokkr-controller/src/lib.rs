//! Kubernetes controllers for brokkr, the platform side of OSB: brokers and their catalogs,
//! service instances and bindings as custom resources (group `services.brokkr.dev`, with the
//! Service Catalog's v1beta1 field names), reconciled by calling any OSB broker with
//! [`brokkr_osb::client`]. This crate never depends on brokkr's broker side.
//!
//! - [`resources`]: the custom resource types and their CustomResourceDefinitions;
//! - [`error`]: the reconciles' error, and what a status may say of it;
//! - [`broker`]: ClusterServiceBroker and ServiceBroker, their catalogs listed into classes and
//!   plans;
//! - [`instance`]: ServiceInstance, provisioned, updated and deprovisioned through its broker;
//! - [`binding`]: ServiceBinding, bound and unbound through its instance's broker, its
//!   credentials in a servicebinding.io Secret;
//! - [`parameters`]: the parameters both send, with `parametersFrom` Secrets;
//! - [`projector`]: the one piece of code that edits workloads for usages and servicebinding.io;
//! - [`servicebinding_io`]: servicebinding.io ServiceBinding, a service's Secret projected into
//!   workloads;
//! - [`usage`]: ServiceBindingUsage, a binding's Secret injected into a workload;
//! - [`run`]: every controller, until a shutdown signal;
//! - [`url_policy`]: which addresses a namespaced ServiceBroker may point the controller at;
//! - [`cache`]: the watch caches reconciles read instead of the API server;
//! - [`catalog_index`]: classes and plans by the names an instance gives them;
//! - [`changes`]: the changes the caches broadcast, and what a follower wakes for each;
//! - [`runner`]: the instance and binding controllers' reconciles, run in the order they fell
//!   due;
//! - [`Scope`]: which namespaces one run serves;
//! - [`workloads`]: the workload kinds watched, so that usages and projections follow them;
//! - [`held_failures`]: a namespaced broker's failures told no sooner than a floor;
//! - [`lease`]: leader election on a Lease, so that two replicas can run;
//! - [`namespace_deletion`]: a namespace being deleted ends even when a broker never answers;
//! - [`metrics`]: what they count;
//! - [`context`], [`resolve`], [`broker_policy`], [`broker_kind`]: what every controller shares:
//!   the reconciles' context, what an object names (class, plan, broker, its OSB client), what a
//!   broker may cost, and the two broker kinds.
//!
//! The modules stand on floors, each importing only from those below it: docs/architecture.md
//! draws them and says what each may import.

pub mod backoff;
pub mod binding;
pub mod broker;
pub mod broker_kind;
pub mod broker_policy;
pub mod cache;
pub mod catalog_index;
pub mod changes;
mod conditions;
pub mod context;
pub mod error;
mod finalizer;
pub mod held_failures;
pub mod identity;
mod index;
pub mod instance;
mod instance_views;
pub mod lease;
pub mod metrics;
mod names;
pub mod namespace_deletion;
pub mod parameters;
mod platform;
pub mod projector;
pub mod resolve;
pub mod resources;
pub mod runner;
mod scope;
pub mod servicebinding_io;
mod status;
pub mod url_policy;
pub mod usage;
pub mod user_info;
pub mod user_info_policy;
pub mod workloads;

use std::future::Future;
use std::sync::Arc;

use futures::{FutureExt as _, StreamExt as _};
use kube::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;

use broker_kind::BrokerKind;
pub use context::{Context, DEFAULT_CONCURRENCY, DEFAULT_WAIT_TIMEOUT};
use resources::{ClusterServiceBroker, ServiceBinding, ServiceBroker};
pub use scope::Scope;
pub use status::Written;

/// Runs every controller until `shutdown` completes; reconciles in progress then finish.
pub async fn run(ctx: Context, shutdown: impl Future<Output = ()> + Send + 'static) {
    let ctx = Arc::new(ctx);
    let shutdown = shutdown.boxed().shared();
    // Made before the caches start, so that each follows the caches' changes from the first.
    let instances = instance_controller(&ctx, shutdown.clone());
    let bindings = binding_controller(&ctx, shutdown.clone());
    let usages = usage::run(ctx.clone(), shutdown.clone());
    let caches = ctx.caches.start(&ctx.client, &ctx.scope, &ctx.written);
    let caches = futures::future::join_all(caches).map(drop);
    let controllers = async move {
        // An empty catalog would read as a missing one: nothing is reconciled before the caches
        // listed everything once.
        ctx.caches.ready().await;
        let cluster_brokers = ctx.scope.reconciles_cluster_brokers().then(|| {
            broker_controller::<ClusterServiceBroker>(
                ctx.clone(),
                Api::all(ctx.client.clone()),
                watcher::Config::default(),
                shutdown.clone(),
            )
        });
        let brokers = broker_controller::<ServiceBroker>(
            ctx.clone(),
            ctx.scope.api(&ctx.client),
            ctx.scope.watch_config(),
            shutdown.clone(),
        );
        futures::join!(
            async move {
                if let Some(c) = cluster_brokers {
                    c.await;
                }
            },
            brokers,
            instances,
            bindings,
            usages,
            servicebinding_io::run(ctx, shutdown),
        );
    };
    tokio::select! {
        () = controllers => {}
        // The caches run until dropped; their watches end only if the API server goes away.
        () = caches => {}
    }
}

/// The instance controller: woken by its instances' changes, by a Secret that `parametersFrom`
/// names (it may change the parameters), by a ServiceBinding that is gone (it may unblock its
/// instance's deletion; the bindings' other changes do not concern the instance), and by a
/// change to the plan of a provisioned instance (it may offer another maintenance version).
fn instance_controller(
    ctx: &Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let store = ctx.caches.instances.clone();
    let wakes = futures::stream::select_all([
        changes::waking(store.clone(), ctx.caches.instance_changes(), |_, c| {
            changes::unless_own(&c.instance, c.own_write)
        })
        .boxed(),
        changes::waking(store.clone(), ctx.caches.secret_changes(), {
            let ctx = ctx.clone();
            move |_, change| ctx.caches.instances_of_secret(&change.secret)
        })
        .boxed(),
        changes::waking(store.clone(), ctx.caches.plan_changes(), {
            let ctx = ctx.clone();
            move |_, plan| ctx.caches.instances_of_plan(&plan)
        })
        .boxed(),
        changes::waking(
            store.clone(),
            ctx.caches.binding_changes(),
            |_, binding| match binding.gone {
                true => vec![binding.instance.clone()],
                false => Vec::new(),
            },
        )
        .boxed(),
    ]);
    runner::Runner::new("instance controller", store, ctx.concurrency)
        .counting_in(ctx.metrics.queue("ServiceInstance"))
        .run(
            wakes,
            instance::reconcile,
            instance::error_policy,
            ctx.clone(),
            shutdown,
        )
}

/// The binding controller: woken by its bindings' changes, by a Secret they read
/// (`parametersFrom`, `addKeysFrom`) or own and that was deleted, and by their instance's
/// changes that concern them (one that becomes Ready, fails, or goes:
/// [`changes::InstanceChange::concerns_bindings`]). Where changes may have been missed (a relist,
/// the controller's start), a binding that only waits for its instance is left to that
/// instance's next change ([`binding::waits_for_its_instance`]).
fn binding_controller(
    ctx: &Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let store = ctx.caches.bindings.clone();
    let missed = |ctx: &Arc<Context>| {
        let ctx = ctx.clone();
        move |bindings: &Store<ServiceBinding>| {
            changes::woken(bindings, |b| {
                !binding::waits_for_its_instance(b, &ctx.caches)
            })
        }
    };
    let wakes = futures::stream::select_all([
        changes::waking_or(
            store.clone(),
            ctx.caches.binding_changes(),
            |_, c| changes::unless_own(&c.binding, c.own_write),
            missed(ctx),
        )
        .boxed(),
        changes::waking_or(
            store.clone(),
            ctx.caches.secret_changes(),
            {
                let ctx = ctx.clone();
                move |_, change| ctx.caches.bindings_of_secret(&change)
            },
            missed(ctx),
        )
        .boxed(),
        changes::waking_or(
            store.clone(),
            ctx.caches.instance_changes(),
            {
                let ctx = ctx.clone();
                move |_, change| match change.concerns_bindings {
                    true => ctx.caches.bindings_of_instance(&change.instance),
                    false => Vec::new(),
                }
            },
            missed(ctx),
        )
        .boxed(),
    ]);
    runner::Runner::new("binding controller", store, ctx.concurrency)
        .counting_in(ctx.metrics.queue("ServiceBinding"))
        .run(
            wakes,
            binding::reconcile,
            binding::error_policy,
            ctx.clone(),
            shutdown,
        )
}

async fn broker_controller<B: BrokerKind>(
    ctx: Arc<Context>,
    api: Api<B>,
    config: watcher::Config,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    ctx.controller(api, config)
        .graceful_shutdown_on(shutdown)
        .run(
            broker::reconcile::<B>,
            broker::error_policy::<B>,
            ctx.clone(),
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "broker controller");
            }
        })
        .await;
}
