//! The broker's Prometheus registry ([`Metrics`]): HTTP requests by method, route and status,
//! their latency and open connections, bindings revoked when their credentials expired, and the
//! gauges counted from the store at each scrape ([`Gauges`]): whether it answered, instances
//! and bindings by plan and status, operations in progress and those no engine runs, expired
//! credentials not yet revoked, fleet upgrades; the ready instances by plan and maintenance
//! version, from a query of their own; beside the engine's operation, step and orphan families.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of an HTTP request. The route is the matched pattern, never the ids in the path.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

/// Labels of the instances of a plan at a maintenance version (`""` when they record none).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InstanceLabels {
    service: String,
    plan: String,
    version: String,
}

/// Labels of instances or bindings of a plan in a status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// `instance` or `binding`.
    pub kind: String,
    /// The service's name.
    pub service: String,
    /// The plan's name.
    pub plan: String,
    /// `creating`, `ready`, `failed` or `deleted`.
    pub status: String,
}

/// Labels of operations in progress of a kind on a plan.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InProgressLabels {
    /// provision, update, upgrade, deprovision, bind, unbind.
    pub kind: String,
    /// The service's name.
    pub service: String,
    /// The plan's name.
    pub plan: String,
}

/// Labels of a plan's latest fleet upgrade, or of its instances, in a state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpgradeLabels {
    /// The service's name.
    pub service: String,
    /// The plan's name.
    pub plan: String,
    /// The upgrade's state (`running`, `paused`, `cancelled`, `succeeded`, `failed`), or its
    /// instance's (`pending`, `in progress`, `succeeded`, `failed`).
    pub state: String,
}

/// What the store said at one scrape, for the gauges.
#[derive(Default)]
pub(crate) struct Gauges {
    /// (kind, service, plan, status) and how many.
    pub resources: Vec<(ResourceLabels, i64)>,
    /// Operations in progress, with how many are past their deadline and how many are due and
    /// unclaimed.
    pub in_progress: Vec<(InProgressLabels, [i64; 3])>,
    /// Bindings whose credentials expired and that are still bound.
    pub expired: i64,
    /// Each plan's latest upgrade: 1 for its state, 0 for the others.
    pub upgrades: Vec<(UpgradeLabels, i64)>,
    /// Their instances, by state.
    pub upgrade_instances: Vec<(UpgradeLabels, i64)>,
}

/// The broker's registry and HTTP metric families.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RequestLabels, Histogram>,
    /// Open HTTP connections (see [`crate::server`]).
    pub(crate) connections: Gauge,
    /// Bindings this broker unbound because their credentials expired (see [`crate::expiry`]).
    pub(crate) revoked: Counter,
    instances: Family<InstanceLabels, Gauge>,
    store_up: Gauge,
    resources: Family<ResourceLabels, Gauge>,
    in_progress: Family<InProgressLabels, Gauge>,
    overdue: Family<InProgressLabels, Gauge>,
    unclaimed: Family<InProgressLabels, Gauge>,
    expired: Gauge,
    upgrades: Family<UpgradeLabels, Gauge>,
    upgrade_instances: Family<UpgradeLabels, Gauge>,
}

impl Metrics {
    /// A registry with the HTTP families and the engine's.
    pub fn new(engine: &brokkr_engine::Engine) -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RequestLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0001, 2.0, 20))
        });
        registry.register(
            "brokkr_http_requests",
            "HTTP requests by method, route and status",
            requests.clone(),
        );
        registry.register(
            "brokkr_http_request_duration_seconds",
            "Time to answer an HTTP request",
            latency.clone(),
        );
        let connections = Gauge::default();
        registry.register(
            "brokkr_http_connections",
            "Open HTTP connections",
            connections.clone(),
        );
        let revoked = Counter::default();
        registry.register(
            "brokkr_bindings_revoked",
            "Bindings unbound by the broker because their credentials expired",
            revoked.clone(),
        );
        let instances = Family::<InstanceLabels, Gauge>::default();
        registry.register(
            "brokkr_instances",
            "Ready instances by service, plan and maintenance version",
            instances.clone(),
        );
        let store_up = Gauge::default();
        registry.register(
            "brokkr_store_up",
            "1 when the store answered the last scrape's queries, 0 when it did not",
            store_up.clone(),
        );
        let resources = Family::<ResourceLabels, Gauge>::default();
        registry.register(
            "brokkr_resources",
            "Instances and bindings by service, plan and status, in the store",
            resources.clone(),
        );
        let in_progress = Family::<InProgressLabels, Gauge>::default();
        registry.register(
            "brokkr_operations_in_progress",
            "Operations in progress in the store, by kind, service and plan",
            in_progress.clone(),
        );
        let overdue = Family::<InProgressLabels, Gauge>::default();
        registry.register(
            "brokkr_operations_overdue",
            "Operations still in progress past their deadline, by kind, service and plan",
            overdue.clone(),
        );
        let unclaimed = Family::<InProgressLabels, Gauge>::default();
        registry.register(
            "brokkr_operations_unclaimed",
            "Operations due for over a minute that no engine holds a lease on, by kind, service and plan",
            unclaimed.clone(),
        );
        let expired = Gauge::default();
        registry.register(
            "brokkr_bindings_expired",
            "Bindings of plans that revoke expired credentials, expired for over five minutes and still bound (at most 1000 counted)",
            expired.clone(),
        );
        let upgrades = Family::<UpgradeLabels, Gauge>::default();
        registry.register(
            "brokkr_upgrades",
            "Each plan's latest fleet upgrade (running, paused, or ended in the last 24 hours): 1 for its state, 0 for the others",
            upgrades.clone(),
        );
        let upgrade_instances = Family::<UpgradeLabels, Gauge>::default();
        registry.register(
            "brokkr_upgrade_instances",
            "The instances of each plan's latest fleet upgrade, by state",
            upgrade_instances.clone(),
        );
        engine.metrics().register(&mut registry);
        Self {
            registry,
            requests,
            latency,
            connections,
            revoked,
            instances,
            store_up,
            resources,
            in_progress,
            overdue,
            unclaimed,
            expired,
            upgrades,
            upgrade_instances,
        }
    }

    /// Records whether the store answered this scrape, and what it said: the gauges are
    /// replaced; a store that did not answer leaves the last ones.
    pub(crate) fn set_gauges(&self, gauges: Option<Gauges>) {
        let Some(g) = gauges else {
            self.store_up.set(0);
            return;
        };
        self.store_up.set(1);
        self.resources.clear();
        for (labels, count) in g.resources {
            self.resources.get_or_create(&labels).set(count);
        }
        for family in [&self.in_progress, &self.overdue, &self.unclaimed] {
            family.clear();
        }
        for (labels, [count, overdue, unclaimed]) in g.in_progress {
            self.in_progress.get_or_create(&labels).set(count);
            self.overdue.get_or_create(&labels).set(overdue);
            self.unclaimed.get_or_create(&labels).set(unclaimed);
        }
        self.expired.set(g.expired);
        self.upgrades.clear();
        for (labels, value) in g.upgrades {
            self.upgrades.get_or_create(&labels).set(value);
        }
        self.upgrade_instances.clear();
        for (labels, count) in g.upgrade_instances {
            self.upgrade_instances.get_or_create(&labels).set(count);
        }
    }

    /// Counts a request answered with `status` and observes the `seconds` it took.
    pub(crate) fn record_request(&self, method: String, route: String, status: u16, seconds: f64) {
        let labels = RequestLabels {
            method,
            route,
            status,
        };
        self.requests.get_or_create(&labels).inc();
        self.latency.get_or_create(&labels).observe(seconds);
    }

    /// Replaces the instance counts with `counts`: (service, plan, version, how many).
    pub(crate) fn set_instances(
        &self,
        counts: impl IntoIterator<Item = (String, String, String, i64)>,
    ) {
        self.instances.clear();
        for (service, plan, version, count) in counts {
            let labels = InstanceLabels {
                service,
                plan,
                version,
            };
            self.instances.get_or_create(&labels).set(count);
        }
    }

    /// The registry in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String does not fail");
        out
    }
}
