//! The [`Store`]: durable state of resources and their operations.
//!
//! Every method is a single atomic statement (or a short sequence that is safe to repeat), so that
//! concurrent requests and several broker processes sharing one PostgreSQL database agree on one
//! outcome: creation is an insert that only one caller wins, and every later change is a
//! compare-and-set on the resource's current operation id and, for the engine, its lease.
//!
//! The trait and the values its methods take and give are in `api`, a store's failure in
//! `error`, the store on SQLite and PostgreSQL in `sql`.

mod api;
mod error;
mod sql;

use std::sync::Arc;

use crate::crypto::Keyring;

pub use api::{Created, Finish, InProgress, NewStatus, ResourceCount, Store};
pub use error::{StoreError, redact_url};
pub use sql::{Migration, SCHEMA_VERSION, SqlStore, migrations};

/// Opens the store a URL names and brings its schema up to date. With a keyring, secrets are
/// encrypted at rest (see [`crate::crypto`]).
pub async fn connect(url: &str, keyring: Option<Keyring>) -> Result<Arc<dyn Store>, StoreError> {
    let store = SqlStore::connect(url, keyring).await?;
    store.migrate().await?;
    Ok(Arc::new(store))
}
