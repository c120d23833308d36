//! brokkr's Open Service Broker API v2.17 server.
//!
//! [`router`] builds the axum application, and [`server::serve`] serves it within limits on
//! connections: platform authentication ([`auth`]), the OSB header
//! rules ([`headers`]), request bodies with size and content-type limits ([`body`]), and the
//! catalog, instance and binding endpoints ([`instances`], [`bindings`]), which share the flow
//! that creates a resource (`creation`) and how operations are planned, started and answered
//! (`operations`). Every decision about
//! idempotency and concurrency — 200 for an identical repeat, 202 with the same operation while in
//! progress, 409 for different attributes, 410 for what does not exist, 422 `ConcurrencyError` — is
//! taken against the [`brokkr_engine::Store`] with atomic operations, so it holds across
//! concurrent requests and across replicas. The work itself is done by the
//! [`brokkr_engine::Engine`]; this crate never knows where a plan's resources live.

pub mod admin;
pub mod auth;
pub mod bindings;
pub mod body;
mod broker;
mod creation;
mod credentials;
pub mod error;
pub mod headers;
pub mod instances;
pub mod metrics;
mod operations;
mod registry;
mod request;
mod response;
pub mod server;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

pub use broker::{
    AppState, Broker, DEFAULT_DEADLINE, DEFAULT_MAX_BODY_BYTES, DEFAULT_SYNC_TIMEOUT,
};
pub use credentials::Auth;

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
