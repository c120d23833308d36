//! The [`Engine`]: runs operations step by step, durably.
//!
//! An operation is created already leased to the engine of the process that accepted the request,
//! which starts it at once. Each step returns done, retry-after or fail; progress is saved after
//! every step with a compare-and-set on the operation id and the lease, so a superseded operation
//! (a deprovision replacing a running provision) or one taken over by another replica stops on
//! its next save. A background worker claims operations that are due and not leased by anyone
//! alive: those that waited out a long retry, those of a process that died, and, on a
//! single-process SQLite store, everything left running at the last shutdown.
//!
//! The rest lives by idea:
//!
//! - `engine`: the engine, its options and the state its parts share;
//! - `worker`: starting and stopping the engine, the worker that claims due operations, and
//!   entering one operation;
//! - `steps`: the step loop, one save point per outcome, and running one step once;
//! - `target_step`: the `target` step kind and publishing a bind's credentials to targets;
//! - `evaluate`: what templates see of an operation, registry values and credentials;
//! - `finish`: ending an operation, and its events;
//! - `failure`: why an operation fails or a step is skipped, as typed reasons;
//! - `janitor`: steps a deprovision or unbind left behind, retried in the background.

mod engine;
mod evaluate;
mod failure;
mod finish;
mod janitor;
mod steps;
mod target_step;
mod worker;

pub use engine::{Engine, EngineOptions, NAMES_KEY_SETTING};
