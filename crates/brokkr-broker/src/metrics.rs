//! Prometheus metrics at `/metrics`: HTTP requests by method, route and status, open connections,
//! and the engine's operation, step and orphan metrics.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::AppState;

/// Labels of an HTTP request. The route is the matched pattern, never the ids in the path.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

/// The broker's registry and HTTP metric families.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RequestLabels, Histogram>,
    /// Open HTTP connections (see [`crate::server`]).
    pub(crate) connections: Gauge,
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
        engine.metrics().register(&mut registry);
        Self {
            registry,
            requests,
            latency,
            connections,
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

/// Counts and times every request.
pub async fn track(State(broker): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(request).await;
    let labels = RequestLabels {
        method,
        route,
        status: response.status().as_u16(),
    };
    broker.metrics.requests.get_or_create(&labels).inc();
    broker
        .metrics
        .latency
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    response
}

/// `GET /metrics`.
pub async fn serve(State(broker): State<AppState>) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        broker.metrics.encode(),
    )
        .into_response()
}
