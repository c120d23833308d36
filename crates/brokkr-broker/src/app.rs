//! The HTTP application: the catalog, instance and binding endpoints behind the OSB header rules
//! and platform authentication, the admin API, health and readiness, and `/metrics`, every
//! request counted and timed.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::broker::AppState;
use crate::{admin, auth, bindings, error, headers, instances, metrics};

/// Builds the HTTP application.
pub fn router(broker: AppState) -> Router {
    let osb = Router::new()
        .route("/v2/catalog", get(catalog))
        .merge(instances::routes())
        .merge(bindings::routes())
        .layer(axum::middleware::from_fn(headers::require_api_version))
        .layer(axum::middleware::from_fn_with_state(
            broker.clone(),
            auth::require_auth,
        ));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics::serve))
        .merge(osb)
        .merge(admin::routes(broker.clone()))
        .fallback(|| async { error::ApiError::new(StatusCode::NOT_FOUND, "no such endpoint") })
        .layer(axum::middleware::from_fn(headers::request_context))
        .route_layer(axum::middleware::from_fn_with_state(
            broker.clone(),
            metrics::track,
        ))
        .with_state(broker)
}

async fn catalog(State(broker): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        broker.config().catalog_json().to_vec(),
    )
        .into_response()
}

async fn readyz(State(broker): State<AppState>) -> Response {
    match broker.engine.store().ping().await {
        Ok(()) => "ok".into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "readiness check failed");
            (StatusCode::SERVICE_UNAVAILABLE, "store unavailable").into_response()
        }
    }
}
