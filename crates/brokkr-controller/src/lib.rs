//! Kubernetes controllers for brokkr, the platform side of OSB: brokers and their catalogs,
//! service instances and bindings as custom resources (group `services.brokkr.dev`, with the
//! Service Catalog's v1beta1 field names), reconciled by calling any OSB broker with
//! [`brokkr_osb::client`]. This crate never depends on brokkr's broker side.
//!
//! - [`resources`]: the custom resource types and their CustomResourceDefinitions;
//! - [`broker`]: ClusterServiceBroker and ServiceBroker, their catalogs listed into classes and
//!   plans;
//! - [`instance`]: ServiceInstance, provisioned, updated and deprovisioned through its broker;
//! - [`binding`]: ServiceBinding, bound and unbound through its instance's broker, its
//!   credentials in a servicebinding.io Secret;
//! - [`parameters`]: the parameters both send, with `parametersFrom` Secrets;
//! - [`projector`]: the one piece of code that edits workloads for usages and servicebinding.io;
//! - [`projection`]: servicebinding.io ServiceBinding, a service's Secret projected into workloads;
//! - [`usage`]: ServiceBindingUsage, a binding's Secret injected into a workload;
//! - [`run`]: every controller, until a shutdown signal;
//! - [`url_policy`]: which addresses a namespaced ServiceBroker may point the controller at;
//! - [`cache`]: the watch caches reconciles read instead of the API server;
//! - [`Scope`]: which namespaces one run serves;
//! - [`workloads`]: the workload kinds watched, so that usages and projections follow them;
//! - [`lease`]: leader election on a Lease, so that two replicas can run;
//! - [`metrics`]: what they count.

pub mod backoff;
pub mod binding;
pub mod broker;
pub mod broker_hold;
pub mod cache;
mod conditions;
mod finalizer;
pub mod identity;
pub mod instance;
pub mod lease;
pub mod metrics;
mod names;
pub mod parameters;
mod platform;
pub mod projection;
pub mod projector;
pub mod resources;
mod scope;
mod status;
pub mod url_policy;
pub mod usage;
pub mod user_info;
pub mod workloads;

use std::future::Future;
use std::sync::Arc;

use futures::{FutureExt as _, StreamExt as _, TryStreamExt as _};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt as _, controller, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use broker::BrokerKind;
use cache::SecretSeen;
use metrics::Metrics;
use resources::{ClusterServiceBroker, ServiceBinding, ServiceBroker, ServiceInstance};
pub use scope::Scope;
pub use status::Written;

/// What every reconcile shares.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// Where reconciles and OSB calls are counted.
    pub metrics: Metrics,
    /// The cluster's id for the OSB context's `clusterid` (e.g. the `kube-system` namespace's uid).
    pub cluster_id: Option<String>,
    /// How long a resource waits for what it names to appear or become Ready (a binding for its
    /// instance, an instance for its class and plan) before it fails.
    pub wait_timeout: std::time::Duration,
    /// Every ServiceInstance of the cluster, as the instance controller's watch sees them (set
    /// by [`run`]): a new instance's OSB id is checked against the others'.
    pub instances: std::sync::OnceLock<kube::runtime::reflector::Store<ServiceInstance>>,
    /// Whether `spec.userInfo` is checked by the API server, and so forwarded to brokers.
    pub user_info: user_info::Guard,
    /// When each failing instance or binding may call its broker again.
    pub backoffs: backoff::Backoffs,
    /// How brokers are called and what one may cost: body and catalog limits, timeouts, and
    /// the URL policy of namespaced brokers.
    pub brokers: broker::BrokerPolicy,
    /// The namespaces served.
    pub scope: Scope,
    /// How many objects of one kind are reconciled at once.
    pub concurrency: u16,
    /// The catalog, Secrets' and Namespaces' metadata, and brokers' clients, as watched (filled
    /// by [`run`]).
    pub caches: cache::Caches,
    /// The workload kinds watched for the usage and servicebinding.io controllers.
    pub workloads: workloads::Workloads,
    /// The versions of instances and bindings this process wrote last.
    pub written: Arc<Written>,
    /// Instances' statuses whose write waits ([`status::HOLD_START_FOR`]).
    pub held_instances: status::Held<resources::ServiceInstanceStatus>,
    /// Bindings' statuses whose write waits.
    pub held_bindings: status::Held<resources::ServiceBindingStatus>,
    /// Every ServiceBinding of the scope, as the binding controller's watch sees them (set by
    /// [`run`]): an instance being deleted reads the bindings that still name it here.
    pub bindings: std::sync::OnceLock<kube::runtime::reflector::Store<ServiceBinding>>,
}

impl Context {
    /// A context for `client` with fresh metrics, no cluster id, the default wait timeout,
    /// the default [`broker::BrokerPolicy`], every namespace, and [`DEFAULT_CONCURRENCY`].
    pub fn new(client: Client) -> Self {
        Self {
            client,
            metrics: Metrics::default(),
            cluster_id: None,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            instances: std::sync::OnceLock::new(),
            user_info: user_info::Guard::default(),
            backoffs: backoff::Backoffs::default(),
            brokers: broker::BrokerPolicy::default(),
            scope: Scope::default(),
            concurrency: DEFAULT_CONCURRENCY,
            caches: cache::Caches::default(),
            workloads: workloads::Workloads::default(),
            written: Arc::default(),
            held_instances: status::Held::default(),
            held_bindings: status::Held::default(),
            bindings: std::sync::OnceLock::new(),
        }
    }

    /// A controller of `K` over `api`: its objects cached without `managedFields`, its watch
    /// retried with backoff, at most [`Context::concurrency`] reconciles at once.
    pub(crate) fn controller<K>(&self, api: Api<K>, config: watcher::Config) -> Controller<K>
    where
        K: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let (reader, writer) = reflector::store();
        let written = self.written.clone();
        let objects = watcher(api, config)
            .default_backoff()
            .modify(|o: &mut K| o.meta_mut().managed_fields = None)
            .reflect(writer)
            .inspect_ok(move |event| written.watched(event))
            .applied_objects();
        Controller::for_stream(objects, reader)
            .with_config(controller::Config::default().concurrency(self.concurrency))
    }

    /// Changes of the scope's objects of `K`, retried with backoff: what wakes a controller
    /// that follows another kind.
    pub(crate) fn changes<K>(
        &self,
    ) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static
    where
        K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
    {
        watcher(self.scope.api::<K>(&self.client), self.scope.watch_config())
            .default_backoff()
            .touched_objects()
    }

    /// Changes of the metadata of the scope's objects of `K`, retried with backoff: what wakes a
    /// controller that needs to know only that they changed.
    pub(crate) fn metadata_changes<K>(
        &self,
    ) -> impl futures::Stream<Item = Result<kube::core::PartialObjectMeta<K>, watcher::Error>>
    + Send
    + 'static
    where
        K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
    {
        let api = self
            .scope
            .api::<kube::core::PartialObjectMeta<K>>(&self.client);
        watcher(api, self.scope.watch_config())
            .default_backoff()
            .touched_objects()
    }
}

/// The default of [`Context::wait_timeout`]: one hour.
pub const DEFAULT_WAIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60 * 60);
/// The default of [`Context::concurrency`].
pub const DEFAULT_CONCURRENCY: u16 = 16;

/// Runs every controller until `shutdown` completes; reconciles in progress then finish.
pub async fn run(ctx: Context, shutdown: impl Future<Output = ()> + Send + 'static) {
    let client = ctx.client.clone();
    // Followed before the caches start: no change is missed.
    let secrets_for_instances = ctx.caches.secret_events();
    let secrets_for_bindings = ctx.caches.secret_events();
    let caches = ctx.caches.start(&client, &ctx.scope);
    let instances = instance::controller(&ctx);
    let _ = ctx.instances.set(instances.store());
    let ctx = Arc::new(ctx);
    let shutdown = shutdown.boxed().shared();
    let caches = futures::future::join_all(caches).map(drop);
    let (ctx_for_controllers, shutdown_for_controllers) = (ctx.clone(), shutdown.clone());
    let controllers = async move {
        // An empty catalog would read as a missing one: nothing is reconciled before the caches
        // listed everything once.
        ctx_for_controllers.caches.ready().await;
        controllers(
            ctx_for_controllers,
            instances,
            secrets_for_instances,
            secrets_for_bindings,
            shutdown_for_controllers,
        )
        .await;
    };
    tokio::select! {
        () = controllers => {}
        // The caches run until dropped; their watches end only if the API server goes away.
        () = caches => {}
    }
    drop(ctx);
}

/// Every controller, once the caches are ready.
async fn controllers(
    ctx: Arc<Context>,
    instances: Controller<ServiceInstance>,
    secrets_for_instances: impl futures::Stream<Item = SecretSeen> + Send + 'static,
    secrets_for_bindings: impl futures::Stream<Item = SecretSeen> + Send + 'static,
    shutdown: futures::future::Shared<futures::future::BoxFuture<'static, ()>>,
) {
    let instance_store = instances.store();
    let instances = instances
        // A Secret that `parametersFrom` names may change the parameters.
        .reconcile_on(secrets_for_instances.flat_map(move |seen| {
            futures::stream::iter(match seen {
                SecretSeen::Changed(secret) => instance::named_by_secret(&instance_store, &secret),
                SecretSeen::Lagged => instance_store
                    .state()
                    .iter()
                    .map(|i| ObjectRef::from_obj(i.as_ref()))
                    .collect(),
            })
        }))
        // A ServiceBinding that comes or goes may unblock its instance's deletion.
        .watches_stream(ctx.changes::<ServiceBinding>(), |binding| {
            let ns = binding.metadata.namespace.clone()?;
            Some(ObjectRef::new(identity::bound_instance_name(&binding)).within(&ns))
        })
        .graceful_shutdown_on(shutdown.clone())
        .run(instance::reconcile, instance::error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "instance controller");
            }
        });
    let bindings = ctx.controller(
        ctx.scope.api::<ServiceBinding>(&ctx.client),
        ctx.scope.watch_config(),
    );
    let known_bindings = bindings.store();
    let _ = ctx.bindings.set(known_bindings.clone());
    let bindings_of_secrets = known_bindings.clone();
    let bindings = bindings
        // A Secret wakes the bindings that own it or read it (parametersFrom, addKeysFrom).
        .reconcile_on(secrets_for_bindings.flat_map(move |seen| {
            let woken: Vec<_> = bindings_of_secrets
                .state()
                .into_iter()
                .filter(|b| match &seen {
                    SecretSeen::Changed(secret) => binding::uses_secret(b, secret),
                    SecretSeen::Lagged => true,
                })
                .map(|b| ObjectRef::from_obj(&*b))
                .collect();
            futures::stream::iter(woken)
        }))
        // An instance that becomes Ready (or goes) wakes the bindings that name it.
        .watches_stream(ctx.metadata_changes::<ServiceInstance>(), move |instance| {
            let (ns, name) = (instance.metadata.namespace, instance.metadata.name);
            known_bindings
                .state()
                .into_iter()
                .filter(|b| {
                    b.metadata.namespace == ns
                        && name.as_deref() == Some(identity::bound_instance_name(b))
                })
                .map(|b| ObjectRef::from_obj(&*b))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown.clone())
        .run(binding::reconcile, binding::error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "binding controller");
            }
        });
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
        usage::run(ctx.clone(), shutdown.clone()),
        projection::run(ctx, shutdown),
    );
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
