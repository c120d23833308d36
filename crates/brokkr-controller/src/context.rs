//! What every reconcile shares: the [`Context`] (client, caches, policies, metrics), and the
//! controllers built over it, whose reconciles read the watch caches.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt as _;
use kube::runtime::reflector;
use kube::runtime::{Controller, WatchStreamExt as _, controller, watcher};
use kube::{Api, Client};

use crate::broker_policy::BrokerPolicy;
use crate::metrics::Metrics;
use crate::scope::Scope;
use crate::status::{self, Written};
use crate::{backoff, cache, resources, user_info, workloads};

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
    /// How long after its namespace's deletion began an instance or binding still waiting for
    /// its broker is released without it.
    pub namespace_deletion_timeout: std::time::Duration,
    /// The least time between two rotations of one ServiceBinding.
    pub min_rotation_interval: std::time::Duration,
    /// Whether `spec.userInfo` is checked by the API server, and so may be forwarded to brokers.
    pub user_info: user_info::Guard,
    /// When each failing instance or binding may call its broker again.
    pub backoffs: backoff::Backoffs,
    /// How brokers are called and what one may cost: body and catalog limits, timeouts, and
    /// the URL policy of namespaced brokers.
    pub brokers: BrokerPolicy,
    /// The namespaces served.
    pub scope: Scope,
    /// How many objects of one kind are reconciled at once.
    pub concurrency: u16,
    /// Instances, bindings, the catalog, Secrets' and Namespaces' metadata, and brokers'
    /// clients, as watched (filled by [`run`](crate::run)).
    pub caches: cache::Caches,
    /// The workload kinds watched for the usage and servicebinding.io controllers.
    pub workloads: workloads::Workloads,
    /// The versions of instances and bindings this process wrote last.
    pub written: Arc<Written>,
    /// Instances' statuses whose write waits (`HOLD_START_FOR`, 5 s).
    pub held_instances: status::Held<resources::ServiceInstanceStatus>,
    /// Bindings' statuses whose write waits.
    pub held_bindings: status::Held<resources::ServiceBindingStatus>,
}

impl Context {
    /// A context for `client` with fresh metrics, no cluster id, the default wait timeout,
    /// the default [`BrokerPolicy`], every namespace, and [`DEFAULT_CONCURRENCY`].
    pub fn new(client: Client) -> Self {
        Self {
            user_info: user_info::Guard::new(client.clone()),
            client,
            metrics: Metrics::default(),
            cluster_id: None,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            namespace_deletion_timeout: DEFAULT_NAMESPACE_DELETION_TIMEOUT,
            min_rotation_interval: DEFAULT_MIN_ROTATION_INTERVAL,
            backoffs: backoff::Backoffs::default(),
            brokers: BrokerPolicy::default(),
            scope: Scope::default(),
            concurrency: DEFAULT_CONCURRENCY,
            caches: cache::Caches::default(),
            workloads: workloads::Workloads::default(),
            written: Arc::default(),
            held_instances: status::Held::default(),
            held_bindings: status::Held::default(),
        }
    }

    /// A controller of `K` over `api`: its objects cached without `managedFields`, its watch
    /// retried with backoff, at most [`Context::concurrency`] reconciles at once.
    pub(crate) fn controller<K>(&self, api: Api<K>, config: watcher::Config) -> Controller<K>
    where
        K: crate::cache::Watched,
    {
        self.controller_with(api, config, |_| {})
    }

    /// [`Context::controller`], with `also` told each watch event after the cache took it in
    /// (to keep an index beside it).
    pub(crate) fn controller_with<K>(
        &self,
        api: Api<K>,
        config: watcher::Config,
        also: impl Fn(&watcher::Event<K>) + Send + Sync + 'static,
    ) -> Controller<K>
    where
        K: crate::cache::Watched,
    {
        let (reader, writer) = reflector::store();
        let written = self.written.clone();
        let objects = watcher(api, config)
            .default_backoff()
            .modify(|o: &mut K| o.meta_mut().managed_fields = None)
            .reflect(writer)
            .inspect_ok(move |event| {
                written.watched(event);
                also(event);
            })
            .applied_objects();
        Controller::for_stream(objects, reader)
            .with_config(controller::Config::default().concurrency(self.concurrency))
    }
}

/// The default of [`Context::wait_timeout`]: one hour.
pub const DEFAULT_WAIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60 * 60);
/// The default of [`Context::concurrency`].
pub const DEFAULT_CONCURRENCY: u16 = 16;
/// The default of [`Context::min_rotation_interval`]: a minute. A rotation binds, writes a
/// Secret and rolls every workload that uses it: no binding needs that more often, and a broker
/// answering a `renew_before` in the past can ask for it without end.
pub const DEFAULT_MIN_ROTATION_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);
/// The default of [`Context::namespace_deletion_timeout`]: one hour.
pub const DEFAULT_NAMESPACE_DELETION_TIMEOUT: std::time::Duration =
    std::time::Duration::from_secs(60 * 60);

/// How long reconciles in progress may take to finish once shutdown is asked for.
const GRACE: Duration = Duration::from_secs(5);

/// Runs `controller` until it ends, or until `GRACE` after `shutdown`: kube-runtime holds a
/// controller's reconciles until its first list succeeds, and nothing ends that wait when the
/// kind is not served (its CRD not installed), so a graceful shutdown alone would never end.
pub(crate) async fn stopping_on(
    controller: impl Future<Output = ()>,
    shutdown: impl Future<Output = ()>,
) {
    let deadline = async {
        shutdown.await;
        tokio::time::sleep(GRACE).await;
    };
    tokio::select! {
        () = controller => {}
        () = deadline => tracing::info!("a controller did not stop in time; leaving it"),
    }
}
