//! Open Service Broker API v2.17 on the wire.
//!
//! This crate holds what both sides of the OSB API agree on and nothing more: the catalog and
//! request/response bodies ([`catalog`], [`messages`]), the error body and its well-known error
//! codes ([`error`]), and the rules for the `X-Broker-API-*` headers ([`headers`]), so the broker,
//! the platform controllers and the CLI share one definition of the protocol. By default it does
//! no I/O; the `client` feature adds `client`, a typed async client that speaks it to any broker.
//!
//! Field names and optionality follow the specification text (`spec.md`), which wins over the
//! OpenAPI files where the two disagree. Optional fields are omitted, never serialized as `null`.

pub mod catalog;
#[cfg(feature = "client")]
pub mod client;
pub mod error;
pub mod headers;
pub mod messages;

pub use catalog::{Catalog, MaintenanceInfo, Plan, Schemas, Service};
pub use error::{ErrorBody, ErrorCode};
pub use headers::ApiVersion;
pub use messages::{LastOperation, OperationState};
