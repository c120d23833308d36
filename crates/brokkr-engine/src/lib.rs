//! brokkr's durable operations.
//!
//! Every provision, update, deprovision, bind and unbind is an [`Operation`] recorded in a
//! [`Store`] together with the resource it acts on, before the platform hears about it. The
//! [`Engine`] runs an operation's steps in order, persisting progress after each one, so that an
//! operation survives a restart or a crash of the process and ends `succeeded` or `failed` —
//! at the latest at its deadline.
//!
//! - [`model`]: resources, operations and their states, the typed plan an operation runs and
//!   what a resource keeps (attributes, outputs);
//! - [`store`]: the [`Store`] trait and its SQL implementation for SQLite and PostgreSQL;
//! - [`runner`]: the [`Engine`]: step execution, leases, recovery, deadlines, and the janitor
//!   that retries steps a deprovision or unbind left behind;
//! - [`step`]: step kinds written in Rust; [`http`]: the built-in `http` step kind;
//! - [`clock`]: [`now_ms`], the time unit of the store.

pub mod clock;
pub mod crypto;
pub mod http;
pub mod metrics;
pub mod model;
pub mod runner;
pub mod step;
pub mod store;

pub use brokkr_blueprint::evaluate::EvaluationError;
pub use clock::now_ms;
pub use model::{
    Action, Attrs, Event, ItemState, Key, OpKind, OpPlan, OpStep, Operation, Orchestration,
    OrchestrationState, Orphan, Outputs, PlanError, PreviousOperation, Resource, Status,
    TargetAction, Update, UpgradeItem, VersionCount,
};
pub use runner::{Engine, EngineOptions, NAMES_KEY_SETTING};
pub use store::{InProgress, NewStatus, ResourceCount, Store, StoreError, connect, redact_url};

/// Step kinds every engine offers, besides those registered with [`Engine::register`].
pub const BUILT_IN_STEP_KINDS: &[&str] = &[http::NAME];
