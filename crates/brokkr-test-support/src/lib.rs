//! Helpers that several of the workspace's crates' tests share, each written once here. Used
//! only as a dev-dependency: nothing of it ships.
//!
//! - [`raw_server`]: a server on loopback that answers every request with a given head and a
//!   body of the same bytes written over and over, for testing what a client does with an answer
//!   too large or too slow to read ([`JSON_OK`], the head of a JSON answer without a length).
//! - [`PgSchema`]: a schema of its own on the test PostgreSQL server.

mod pg_schema;
mod raw_server;

pub use pg_schema::PgSchema;
pub use raw_server::{JSON_OK, RawServer, raw_server};
