//! Black-box tests of the OSB API v2.17: every endpoint and status row, over HTTP, against both
//! store backends (SQLite and the local PostgreSQL server).
//!
//! One module per part of the API; `harness` starts the broker over a fresh store and
//! `support` holds the helpers the modules share.

#[macro_use]
#[path = "../harness/mod.rs"]
mod harness;

mod support;

mod admin;
mod bindings;
mod catalog;
mod concurrency;
mod deprovision;
mod encryption;
mod operations;
mod provision;
mod update;
