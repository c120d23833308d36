//! Prometheus metrics at `/metrics`: HTTP requests by method, route and status, open connections,
//! ready instances by service, plan and maintenance version (`brokkr_instances`), and, also
//! counted from the store at each scrape, whether it answered (`brokkr_store_up`), instances and
//! bindings by status, operations in progress and those no engine runs, expired credentials not
//! revoked and fleet upgrades; and the engine's operation, step and orphan metrics. [`track`]
//! counts and times every request and [`serve`] answers `/metrics`; the families themselves
//! are [`Metrics`]'s.

use std::collections::HashMap;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use brokkr_engine::{ItemState, OrchestrationState, StoreError};

use crate::broker::{AppState, Broker};
use crate::registry::Gauges;

pub use crate::registry::{
    InProgressLabels, Metrics, RequestLabels, ResourceLabels, UpgradeLabels,
};

/// An operation due this long (ms) that no engine claimed counts as unclaimed: an engine looks
/// for due work every second (`--poll-interval`).
const UNCLAIMED_AFTER_MS: i64 = 60_000;

/// Bindings whose credentials expired this long ago (ms) and are still bound count as not
/// revoked: the expiry sweep looks every 10 s (`--expiry-sweep-interval`).
const UNREVOKED_AFTER_MS: i64 = 5 * 60_000;

/// The most expired bindings counted.
const EXPIRED_COUNTED: i64 = 1000;

/// The fleet upgrades a scrape reads, newest first.
const UPGRADES_READ: i64 = 100;

/// An ended fleet upgrade is shown this long (ms) after it ended.
const UPGRADE_SHOWN_MS: i64 = 24 * 3600 * 1000;

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
    let metrics = broker.engine.metrics();
    broker.metrics.set_instances(counts.into_iter().map(|c| {
        let (service, plan) = metrics.plan_names(&c.service_id, &c.plan_id);
        (service, plan, c.version.unwrap_or_default(), c.count)
    }));
}

/// What the store says for the gauges now; an error when it does not answer.
async fn gauges(broker: &Broker) -> Result<Gauges, StoreError> {
    let store = broker.engine.store();
    let names =
        |service_id: &str, plan_id: &str| broker.engine.metrics().plan_names(service_id, plan_id);
    let now = brokkr_engine::now_ms();
    let mut g = Gauges::default();
    for c in store.count_resources().await? {
        let (service, plan) = names(&c.service_id, &c.plan_id);
        let kind = if c.bindings { "binding" } else { "instance" };
        let labels = ResourceLabels {
            kind: kind.to_owned(),
            service,
            plan,
            status: c.status.as_str().to_owned(),
        };
        g.resources.push((labels, c.count));
    }
    for c in store
        .count_in_progress(now, now - UNCLAIMED_AFTER_MS)
        .await?
    {
        let (service, plan) = names(&c.service_id, &c.plan_id);
        let labels = InProgressLabels {
            kind: c.kind.as_str().to_owned(),
            service,
            plan,
        };
        g.in_progress
            .push((labels, [c.count, c.overdue, c.unclaimed]));
    }
    let revoking = crate::expiry::revoking_plans(&broker.config());
    if !revoking.is_empty() {
        let expired = store
            .expired_bindings(&revoking, now - UNREVOKED_AFTER_MS, EXPIRED_COUNTED)
            .await?;
        g.expired = i64::try_from(expired.len()).unwrap_or(i64::MAX);
    }
    // Each plan's latest upgrade (the list is newest first), while it matters.
    let mut latest = HashMap::new();
    for o in store.list_orchestrations(UPGRADES_READ).await? {
        latest
            .entry((o.service_id.clone(), o.plan_id.clone()))
            .or_insert(o);
    }
    for ((service_id, plan_id), o) in latest {
        if o.finished_at.is_some_and(|at| now - at > UPGRADE_SHOWN_MS) {
            continue;
        }
        let (service, plan) = names(&service_id, &plan_id);
        let labels = |state: &str| UpgradeLabels {
            service: service.clone(),
            plan: plan.clone(),
            state: state.to_owned(),
        };
        for state in [
            OrchestrationState::Running,
            OrchestrationState::Paused,
            OrchestrationState::Cancelled,
            OrchestrationState::Succeeded,
            OrchestrationState::Failed,
        ] {
            g.upgrades
                .push((labels(state.as_str()), i64::from(state == o.state)));
        }
        let items = store.orchestration(&o.id).await?.map(|(_, items)| items);
        let items = items.unwrap_or_default();
        for state in [
            ItemState::Pending,
            ItemState::InProgress,
            ItemState::Succeeded,
            ItemState::Failed,
        ] {
            let n = items.iter().filter(|i| i.state == state).count();
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            g.upgrade_instances.push((labels(state.as_str()), n));
        }
    }
    Ok(g)
}

/// `GET /metrics`.
pub async fn serve(State(broker): State<AppState>) -> Response {
    count_instances(&broker).await;
    let gauges = match gauges(&broker).await {
        Ok(gauges) => Some(gauges),
        Err(e) => {
            tracing::warn!(error = %e, "the store did not answer for /metrics");
            None
        }
    };
    broker.metrics.set_gauges(gauges);
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
