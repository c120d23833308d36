//! Prometheus metrics at `/metrics`: HTTP requests by method, route and status, open connections,
//! ready instances by service, plan and maintenance version (`brokkr_instances`, counted from
//! the store at each scrape), and the engine's operation, step and orphan metrics. [`track`] counts and times every request
//! and [`serve`] answers `/metrics`; the families themselves are [`Metrics`]'s.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::broker::AppState;

pub use crate::registry::{Metrics, RequestLabels};

/// Counts and times every request.
pub async fn track(State(broker): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(request).await;
    let status = response.status().as_u16();
    let seconds = started.elapsed().as_secs_f64();
    broker
        .metrics
        .record_request(method, route, status, seconds);
    response
}

/// Counts the ready instances of each plan at each maintenance version, by the names the
/// catalog gives them (their ids for a plan no longer configured). A store that cannot answer
/// leaves the last counts.
async fn count_instances(broker: &AppState) {
    let counts = match broker.engine.store().count_instance_versions().await {
        Ok(counts) => counts,
        Err(e) => {
            tracing::warn!(error = %e, "cannot count instances for /metrics");
            return;
        }
    };
    let config = broker.config();
    broker.metrics.set_instances(counts.into_iter().map(|c| {
        let (service, plan) = match config.plan(&c.service_id, &c.plan_id) {
            Some(e) => (e.service.name.clone(), e.plan.name.clone()),
            None => (c.service_id, c.plan_id),
        };
        (service, plan, c.version.unwrap_or_default(), c.count)
    }));
}

/// `GET /metrics`.
pub async fn serve(State(broker): State<AppState>) -> Response {
    count_instances(&broker).await;
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
