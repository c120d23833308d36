//! Step kinds written in Rust and compiled into the broker.
//!
//! A blueprint step with `run: <name>` calls the [`StepKind`] registered under that name with
//! [`crate::Engine::register`]. A step kind must be idempotent: it may run again after a crash
//! that struck between its effect and the record of it. It answers with a [`StepOutcome`]: done,
//! retry after a while (with the reason, shown to the user), or fail. A panic inside a step fails
//! the operation with the panic's message; the broker keeps serving.
//!
//! ```
//! use brokkr_engine::step::{StepContext, StepKind, StepOutcome, async_trait};
//!
//! /// Waits until the `ready` parameter is true.
//! struct WaitForFlag;
//!
//! #[async_trait]
//! impl StepKind for WaitForFlag {
//!     async fn run(&self, ctx: &StepContext<'_>) -> StepOutcome {
//!         if ctx.template_context["parameters"]["ready"] == true {
//!             StepOutcome::Done
//!         } else {
//!             StepOutcome::retry(std::time::Duration::from_secs(5), "waiting for the flag")
//!         }
//!     }
//! }
//! ```

use std::time::Duration;

/// The attribute step kinds are written with, re-exported so they need no extra dependency.
pub use async_trait::async_trait;
use serde_json::Value;

use crate::model::{OpKind, Resource};

/// What a step asks for next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// Finished; go on with the next step.
    Done,
    /// Finished, with values to add to the resource's registry: later steps and the
    /// credentials see them as `registry('name')`, and they are kept (encrypted) with the
    /// resource.
    Produced(serde_json::Map<String, Value>),
    /// Not yet; run again after `after`. `reason` is shown in the operation's description.
    RetryAfter {
        /// How long to wait.
        after: Duration,
        /// Why, for the user.
        reason: String,
    },
    /// Failed for good, with a reason for the user (never a secret).
    Fail(String),
}

impl StepOutcome {
    /// A retry after `after`, because of `reason`.
    pub fn retry(after: Duration, reason: impl Into<String>) -> Self {
        Self::RetryAfter {
            after,
            reason: reason.into(),
        }
    }
}

/// What a step kind is told about the step it runs.
pub struct StepContext<'a> {
    /// The operation's kind.
    pub op_kind: OpKind,
    /// The step's name in the blueprint.
    pub step: &'a str,
    /// The step's `with:` arguments, rendered as a template tree.
    pub with: &'a Value,
    /// The instance or binding the operation acts on.
    pub resource: &'a Resource,
    /// The values templates see: `parameters`, `context`, `instance`, ids.
    pub template_context: &'a Value,
    /// When this step first started (ms since the Unix epoch), across retries and restarts.
    pub started_at: i64,
}

/// A step kind compiled into the broker.
#[async_trait]
pub trait StepKind: Send + Sync {
    /// Runs the step once.
    async fn run(&self, ctx: &StepContext<'_>) -> StepOutcome;
}
