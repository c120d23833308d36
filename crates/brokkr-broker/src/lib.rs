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

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use brokkr_blueprint::Config;
use brokkr_engine::Engine;

pub use credentials::Auth;

/// Default largest request body.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// Default time a synchronous request waits for its operation.
pub const DEFAULT_SYNC_TIMEOUT: Duration = Duration::from_secs(60);
/// Default operation deadline.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(24 * 3600);

/// Everything the handlers share.
pub struct Broker {
    /// The validated configuration; replaced whole when `serve` reloads it. A request works with
    /// the configuration it started with.
    config: ArcSwap<Config>,
    /// The operation engine (and through it, the store).
    pub engine: Engine,
    /// Who may call the OSB API.
    pub auth: Auth,
    /// Who may call the admin API; `None` turns it off.
    pub admin_auth: Option<Auth>,
    /// Prometheus metrics.
    pub metrics: metrics::Metrics,
}

impl Broker {
    /// A broker over `engine` serving `config`.
    pub fn new(config: Arc<Config>, engine: Engine, auth: Auth, admin_auth: Option<Auth>) -> Self {
        let metrics = metrics::Metrics::new(&engine);
        Self {
            config: ArcSwap::new(config),
            engine,
            auth,
            admin_auth,
            metrics,
        }
    }

    /// The configuration now served.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Serves `config` from now on: the catalog and new requests see it; operations already
    /// under way keep the steps they were created with.
    pub fn replace_config(&self, config: Arc<Config>) {
        self.config.store(config);
    }

    fn max_body_bytes(&self) -> usize {
        self.config
            .load()
            .broker
            .max_body_bytes
            .unwrap_or(DEFAULT_MAX_BODY_BYTES)
    }

    fn sync_timeout(&self) -> Duration {
        self.config
            .load()
            .broker
            .sync_timeout
            .unwrap_or(DEFAULT_SYNC_TIMEOUT)
    }
}

/// Shared handler state.
pub type AppState = Arc<Broker>;

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
        broker.config.load().catalog_json().to_vec(),
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
