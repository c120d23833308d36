//! brokkr's Open Service Broker API v2.17 server.
//!
//! [`router`] builds the axum application, and [`server::serve`] serves it within limits on
//! connections: platform authentication ([`auth`]), the OSB header
//! rules ([`headers`]), request bodies with size and content-type limits ([`body`]), and the
//! catalog, instance and binding endpoints ([`instances`], [`bindings`]), which share the flow
//! that creates a resource (`creation`) and how operations are planned, started and answered
//! (`operations`); [`expiry`] unbinds, by the broker itself, bindings whose credentials
//! expired. Every decision about
//! idempotency and concurrency — 200 for an identical repeat, 202 with the same operation while in
//! progress, 409 for different attributes, 410 for what does not exist, 422 `ConcurrencyError` — is
//! taken against the [`brokkr_engine::Store`] with atomic operations, so it holds across
//! concurrent requests and across replicas. The work itself is done by the
//! [`brokkr_engine::Engine`]; this crate never knows where a plan's resources live.

pub mod admin;
mod app;
pub mod auth;
pub mod bindings;
pub mod body;
mod broker;
mod creation;
mod credentials;
pub mod error;
pub mod expiry;
pub mod headers;
pub mod instances;
pub mod metrics;
mod operations;
mod registry;
mod request;
mod response;
pub mod server;
mod update;
pub mod upgrade;

pub use app::router;
pub use broker::{
    AppState, Broker, DEFAULT_DEADLINE, DEFAULT_MAX_BODY_BYTES, DEFAULT_SYNC_TIMEOUT,
};
pub use credentials::Auth;
