//! The broker's Prometheus registry ([`Metrics`]): HTTP requests by method, route and status,
//! their latency and open connections, bindings revoked when their credentials expired,
//! instances by plan and maintenance version, beside the engine's operation, step and orphan
//! families.

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
        engine.metrics().register(&mut registry);
        Self {
            registry,
            requests,
            latency,
            connections,
            revoked,
            instances,
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
