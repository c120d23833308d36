//! Kubernetes controllers for brokkr, the platform side of OSB: brokers and their catalogs,
//! service instances and bindings as custom resources (group `services.brokkr.dev`, with the
//! Service Catalog's v1beta1 field names), reconciled by calling any OSB broker with
//! [`brokkr_osb::client`]. This crate never depends on brokkr's broker side.
//!
//! - [`resources`]: the custom resource types and their CustomResourceDefinitions;
//! - [`broker`]: ClusterServiceBroker and ServiceBroker, their catalogs listed into classes and
//!   plans;
//! - [`instance`]: ServiceInstance, provisioned and deprovisioned through its broker;
//! - [`run`]: every controller, until a shutdown signal;
//! - [`lease`]: leader election on a Lease, so that two replicas can run;
//! - [`metrics`]: what they count.

pub mod broker;
mod conditions;
pub mod instance;
pub mod lease;
pub mod metrics;
mod names;
pub mod resources;

use std::future::Future;
use std::sync::Arc;

use futures::{FutureExt as _, StreamExt as _};
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
}

/// Runs every controller until `shutdown` completes; reconciles in progress then finish.
pub async fn run(ctx: Context, shutdown: impl Future<Output = ()> + Send + 'static) {
    let client = ctx.client.clone();
    let ctx = Arc::new(ctx);
    let shutdown = shutdown.boxed().shared();
    let instances = Controller::new(
        Api::<ServiceInstance>::all(client.clone()),
        watcher::Config::default(),
    )
    // A ServiceBinding that comes or goes may unblock its instance's deletion.
    .watches(
        Api::<ServiceBinding>::all(client.clone()),
        watcher::Config::default(),
        |binding| {
            let ns = binding.metadata.namespace.clone()?;
            Some(ObjectRef::new(&binding.spec.instance_ref.name).within(&ns))
        },
    )
    .graceful_shutdown_on(shutdown.clone())
    .run(instance::reconcile, instance::error_policy, ctx.clone())
    .for_each(|result| async move {
        if let Err(e) = result {
            tracing::debug!(error = %e, "instance controller");
        }
    });
    futures::join!(
        broker_controller::<ClusterServiceBroker>(&client, ctx.clone(), shutdown.clone()),
        broker_controller::<ServiceBroker>(&client, ctx, shutdown),
        instances,
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
