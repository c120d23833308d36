//! What the store keeps: resources (instances and bindings), each with its current operation.
//!
//! - this module: [`Resource`], [`Operation`], their states and event log, and [`Orphan`]s;
//! - `plan`: what an operation runs, [`OpPlan`] and its [`OpStep`]s, taken from the blueprint
//!   phase its [`OpKind`] names;
//! - `state`: a resource's [`Attrs`] and [`Outputs`], and the [`Update`] an update makes;
//! - `upgrade`: fleet upgrades, [`Orchestration`]s and their [`UpgradeItem`]s.

use brokkr_osb::OperationState;
use serde::{Deserialize, Serialize};

mod plan;
mod state;
mod upgrade;

pub use plan::{Action, OpKind, OpPlan, OpStep, PlanError, TargetAction};
pub use state::{Attrs, Outputs, Skipped, Update};
pub use upgrade::{ItemState, Orchestration, OrchestrationState, UpgradeItem, VersionCount};

/// Identifies an instance (`binding_id` is `None`) or one of its bindings.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    /// The instance id chosen by the platform.
    pub instance_id: String,
    /// The binding id, for bindings.
    pub binding_id: Option<String>,
}

impl Key {
    /// The key of an instance.
    pub fn instance(id: &str) -> Self {
        Self {
            instance_id: id.to_owned(),
            binding_id: None,
        }
    }

    /// The key of a binding.
    pub fn binding(instance_id: &str, binding_id: &str) -> Self {
        Self {
            instance_id: instance_id.to_owned(),
            binding_id: Some(binding_id.to_owned()),
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.binding_id {
            Some(b) => write!(f, "binding {b} of instance {}", self.instance_id),
            None => write!(f, "instance {}", self.instance_id),
        }
    }
}

/// Where a resource is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Its provision or bind is running.
    Creating,
    /// It exists and is usable (an update, deprovision or unbind may be running).
    Ready,
    /// Its provision or bind failed.
    Failed,
    /// It was deprovisioned or unbound; kept for the retention period to answer polls.
    Deleted,
}

impl Status {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Creating => "creating",
            Self::Ready => "ready",
            Self::Failed => "failed",
            Self::Deleted => "deleted",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "creating" => Self::Creating,
            "ready" => Self::Ready,
            "failed" => Self::Failed,
            "deleted" => Self::Deleted,
            _ => return None,
        })
    }
}

/// The current (or last) operation of a resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Operation {
    /// The id returned to the platform as `operation`.
    pub id: String,
    /// What it does.
    pub kind: OpKind,
    /// Where it is.
    pub state: OperationState,
    /// For the user: what is happening, or why it failed.
    pub description: Option<String>,
    /// For updates: the plan and attributes the instance moves to.
    pub update: Option<Update>,
    /// The steps it runs.
    pub plan: OpPlan,
    /// Index of the next step to run.
    pub step: usize,
    /// When the current step first started (ms), persisted so waits survive restarts.
    pub step_started_at: Option<i64>,
    /// Not to be run before this time (ms).
    pub next_run_at: i64,
    /// Fails when not finished by this time (ms).
    pub deadline_at: i64,
    /// The engine currently running it.
    pub lease_owner: Option<String>,
    /// Until when that engine's claim holds (ms).
    pub lease_until: i64,
    /// When it started (ms).
    pub started_at: i64,
    /// When it ended (ms).
    pub finished_at: Option<i64>,
}

impl Operation {
    /// A new operation, leased to `owner` so that it can run at once, its first step started.
    pub fn new(
        kind: OpKind,
        plan: OpPlan,
        update: Option<Update>,
        deadline_ms: i64,
        owner: &str,
        lease_ms: i64,
    ) -> Self {
        let now = crate::clock::now_ms();
        let description = match plan.steps.first() {
            Some(step) => format!(
                "{}: step 1/{} '{}' in progress",
                kind.as_str(),
                plan.steps.len(),
                step.name
            ),
            None => format!("{} in progress", kind.as_str()),
        };
        // The first step starts with the operation: its start is committed with the operation's
        // creation, not by a commit of its own.
        let step_started_at = (!plan.steps.is_empty()).then_some(now);
        Self {
            id: uuid::Uuid::new_v4().to_string(),
            kind,
            state: OperationState::InProgress,
            description: Some(description),
            update,
            plan,
            step: 0,
            step_started_at,
            next_run_at: now,
            deadline_at: now.saturating_add(deadline_ms),
            lease_owner: Some(owner.to_owned()),
            lease_until: now.saturating_add(lease_ms),
            started_at: now,
            finished_at: None,
        }
    }

    /// Whether the operation is still running.
    pub fn in_progress(&self) -> bool {
        self.state == OperationState::InProgress
    }
}

/// How the operation before the current one ended.
#[derive(Debug, Clone, PartialEq)]
pub struct PreviousOperation {
    /// Its id.
    pub id: String,
    /// How it ended (`failed` if the current operation halted it).
    pub state: OperationState,
    /// Its last description.
    pub description: Option<String>,
}

/// An instance or a binding with its current operation.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    /// Which resource.
    pub key: Key,
    /// The service offering.
    pub service_id: String,
    /// The plan.
    pub plan_id: String,
    /// The request attributes that define it.
    pub attrs: Attrs,
    /// Its life stage.
    pub status: Status,
    /// What its operations produced: registry values, a binding's credentials.
    pub outputs: Outputs,
    /// The instance's dashboard.
    pub dashboard_url: Option<String>,
    /// Its current or last operation.
    pub op: Operation,
    /// The operation before, so a platform still polling it gets its outcome.
    pub previous: Option<PreviousOperation>,
    /// When it was first created (ms).
    pub created_at: i64,
    /// When it was deleted (ms), for tombstones.
    pub deleted_at: Option<i64>,
}

impl Resource {
    /// A resource being created by its first operation, `op`.
    pub fn new(key: Key, service_id: &str, plan_id: &str, attrs: Attrs, op: Operation) -> Self {
        Self {
            key,
            service_id: service_id.to_owned(),
            plan_id: plan_id.to_owned(),
            attrs,
            status: Status::Creating,
            outputs: Outputs::default(),
            dashboard_url: None,
            op,
            previous: None,
            created_at: crate::clock::now_ms(),
            deleted_at: None,
        }
    }
}

/// One entry of an operation's event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// When it happened (ms since the Unix epoch).
    pub at: i64,
    /// What happened: `step_started`, `step_finished`, `step_waiting`, `resumed`, `succeeded`,
    /// `failed`.
    pub kind: String,
    /// The step it concerns, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// Details for an operator; never secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// What a deprovision or unbind left behind: a step skipped because it kept failing, kept so
/// that the janitor can run it again later (see [`crate::Engine`]), with everything the step's
/// templates need — the resource itself may be purged, or its id reused, before it succeeds.
#[derive(Debug, Clone, PartialEq)]
pub struct Orphan {
    /// Its own id.
    pub id: String,
    /// The instance or binding the step belongs to.
    pub key: Key,
    /// When that resource was created (ms): tells a reused id's leftovers apart.
    pub resource_created_at: i64,
    /// Deprovision or unbind.
    pub op_kind: OpKind,
    /// The operation that last skipped the step.
    pub op_id: String,
    /// The skipped step, as its operation had it.
    pub step: OpStep,
    /// What the step's templates see; `None` when read for a listing.
    pub context: Option<OrphanContext>,
    /// When the step was first left behind (ms).
    pub since: i64,
    /// How many times the janitor has tried it since.
    pub attempts: i64,
    /// Why the step last failed (never a secret).
    pub last_error: String,
    /// When the janitor tries it next (ms).
    pub next_attempt_at: i64,
}

/// What an orphaned step's templates see, copied when it was left behind (encrypted at rest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrphanContext {
    /// The instance or binding.
    pub resource: ResourceCopy,
    /// For a binding: its instance.
    pub instance: Option<ResourceCopy>,
}

/// The part of a resource that templates see.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceCopy {
    /// The service offering.
    pub service_id: String,
    /// The plan.
    pub plan_id: String,
    /// The request attributes.
    pub attrs: Attrs,
    /// The resource's outputs (its registry).
    pub outputs: Outputs,
}

impl ResourceCopy {
    /// What `r` shows its templates.
    pub fn of(r: &Resource) -> Self {
        Self {
            service_id: r.service_id.clone(),
            plan_id: r.plan_id.clone(),
            attrs: r.attrs.clone(),
            outputs: r.outputs.clone(),
        }
    }
}
