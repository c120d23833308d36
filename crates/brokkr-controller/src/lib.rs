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
//! - [`lease`]: leader election on a Lease, so that two replicas can run;
//! - [`metrics`]: what they count.

pub mod backoff;
pub mod binding;
pub mod broker;
pub mod broker_hold;
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
mod status;
pub mod url_policy;
pub mod usage;
pub mod user_info;

use std::future::Future;
use std::sync::Arc;

use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client};

use broker::BrokerKind;
use metrics::Metrics;
use resources::{ClusterServiceBroker, ServiceBinding, ServiceBroker, ServiceInstance};

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
}

impl Context {
    /// A context for `client` with fresh metrics, no cluster id, the default wait timeout and
    /// the default [`broker::BrokerPolicy`].
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
        }
    }
}

/// The default of [`Context::wait_timeout`]: one hour.
pub const DEFAULT_WAIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60 * 60);

/// Runs every controller until `shutdown` completes; reconciles in progress then finish.
pub async fn run(ctx: Context, shutdown: impl Future<Output = ()> + Send + 'static) {
    let client = ctx.client.clone();
    let instances = instance::controller(&client);
    let _ = ctx.instances.set(instances.store());
    let ctx = Arc::new(ctx);
    let shutdown = shutdown.boxed().shared();
    let instances = instances
        // A ServiceBinding that comes or goes may unblock its instance's deletion.
        .watches(
            Api::<ServiceBinding>::all(client.clone()),
            watcher::Config::default(),
            |binding| {
                let ns = binding.metadata.namespace.clone()?;
                Some(ObjectRef::new(identity::bound_instance_name(&binding)).within(&ns))
            },
        )
        .graceful_shutdown_on(shutdown.clone())
        .run(instance::reconcile, instance::error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "instance controller");
            }
        });
    let bindings = Controller::new(
        Api::<ServiceBinding>::all(client.clone()),
        watcher::Config::default(),
    );
    let known_bindings = bindings.store();
    let bindings_of_secrets = known_bindings.clone();
    let bindings = bindings
        // A Secret wakes the bindings that own it or read it (parametersFrom, addKeysFrom).
        .watches(
            Api::<Secret>::all(client.clone()),
            watcher::Config::default(),
            move |secret| {
                bindings_of_secrets
                    .state()
                    .into_iter()
                    .filter(|b| binding::uses_secret(b, &secret))
                    .map(|b| ObjectRef::from_obj(&*b))
                    .collect::<Vec<_>>()
            },
        )
        // An instance that becomes Ready (or goes) wakes the bindings that name it.
        .watches(
            Api::<ServiceInstance>::all(client.clone()),
            watcher::Config::default(),
            move |instance| {
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
            },
        )
        .graceful_shutdown_on(shutdown.clone())
        .run(binding::reconcile, binding::error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "binding controller");
            }
        });
    let (ctx_for_usages, shutdown_for_usages) = (ctx.clone(), shutdown.clone());
    let (ctx_for_projections, shutdown_for_projections) = (ctx.clone(), shutdown.clone());
    futures::join!(
        broker_controller::<ClusterServiceBroker>(&client, ctx.clone(), shutdown.clone()),
        broker_controller::<ServiceBroker>(&client, ctx, shutdown),
        instances,
        bindings,
        usage::run(ctx_for_usages, shutdown_for_usages),
        projection::run(ctx_for_projections, shutdown_for_projections),
    );
}

async fn broker_controller<B: BrokerKind>(
    client: &Client,
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    Controller::new(Api::<B>::all(client.clone()), watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(broker::reconcile::<B>, broker::error_policy::<B>, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "broker controller");
            }
        })
        .await;
}
