//! Fleet upgrades as the store keeps them: an [`Orchestration`] moves the instances of one plan
//! to the plan's maintenance version in waves, and records each instance's [`UpgradeItem`].

/// Where an orchestration is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrchestrationState {
    /// Starting upgrades as its limits allow.
    Running,
    /// Starting none; those under way are followed to their end.
    Paused,
    /// Stopped by an operator; upgrades under way still end on their own.
    Cancelled,
    /// Every instance upgraded.
    Succeeded,
    /// Stopped: a canary failed, or too many instances did.
    Failed,
}

impl OrchestrationState {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Cancelled => "cancelled",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Running,
            Self::Paused,
            Self::Cancelled,
            Self::Succeeded,
            Self::Failed,
        ]
        .into_iter()
        .find(|state| state.as_str() == s)
    }

    /// Whether it has ended (cancelled, succeeded or failed).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Cancelled | Self::Succeeded | Self::Failed)
    }
}

/// One fleet upgrade: the instances of a plan moved to `target_version`.
#[derive(Debug, Clone, PartialEq)]
pub struct Orchestration {
    /// Its id.
    pub id: String,
    /// The service of the plan.
    pub service_id: String,
    /// The plan whose instances it upgrades.
    pub plan_id: String,
    /// The plan's maintenance version the instances move to.
    pub target_version: String,
    /// Most upgrades running at once.
    pub max_parallel: i64,
    /// How many instances are upgraded first, as one wave that must all succeed.
    pub canary: i64,
    /// It stops once this many instances failed.
    pub max_failures: i64,
    /// Where it is.
    pub state: OrchestrationState,
    /// Why it ended, for a failed one.
    pub description: Option<String>,
    /// When it was created (ms).
    pub created_at: i64,
    /// When it ended (ms).
    pub finished_at: Option<i64>,
}

/// Where one instance of an orchestration is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemState {
    /// Not started yet.
    Pending,
    /// Its update runs.
    InProgress,
    /// At the target version.
    Succeeded,
    /// Its update failed; the instance stays at its old version.
    Failed,
}

impl ItemState {
    /// The stored spelling (OSB's for operations).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::InProgress => "in progress",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Pending,
            Self::InProgress,
            Self::Succeeded,
            Self::Failed,
        ]
        .into_iter()
        .find(|state| state.as_str() == s)
    }
}

/// One instance of an orchestration.
#[derive(Debug, Clone, PartialEq)]
pub struct UpgradeItem {
    /// The instance.
    pub instance_id: String,
    /// Its place in the orchestration's order, from 0; the first `canary` are the canaries.
    pub position: i64,
    /// The version it was at when the orchestration was created.
    pub from_version: Option<String>,
    /// Where it is.
    pub state: ItemState,
    /// The update operation that upgrades it, once started (or found running).
    pub op_id: Option<String>,
    /// How it went.
    pub description: Option<String>,
}

/// How many ready instances of a plan are at a maintenance version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionCount {
    /// The service.
    pub service_id: String,
    /// The plan.
    pub plan_id: String,
    /// The version; `None` for instances that record none.
    pub version: Option<String>,
    /// How many.
    pub count: i64,
}
