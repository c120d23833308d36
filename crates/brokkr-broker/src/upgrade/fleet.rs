//! What a fleet upgrade asks for and the instances it takes: the request of
//! `POST /admin/v1/upgrades`, checked, its plan found by name or id, and the ready instances of
//! that plan not yet at the plan's maintenance version, oldest first.

use std::sync::Arc;

use axum::http::StatusCode;
use brokkr_blueprint::PlanEntry;
use brokkr_engine::{ItemState, Orchestration, OrchestrationState, UpgradeItem};
use serde::Deserialize;

use crate::broker::Broker;
use crate::error::ApiError;
use crate::update::version_of;

/// Most upgrades one orchestration runs at once.
const MAX_PARALLEL: i64 = 100;

/// The body of `POST /admin/v1/upgrades`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpgradeRequest {
    /// The service, by name or id.
    service: String,
    /// The plan, by name or id.
    plan: String,
    /// Most upgrades at once (default 1).
    #[serde(default = "one")]
    max_parallel: i64,
    /// How many instances go first, as a wave that must all succeed (default 0).
    #[serde(default)]
    canary: i64,
    /// Stop once this many instances failed (default 1).
    #[serde(default = "one")]
    max_failures: i64,
    /// Only say which instances would be upgraded.
    #[serde(default)]
    pub(crate) dry_run: bool,
}

fn one() -> i64 {
    1
}

/// One instance a fleet upgrade takes.
pub(crate) struct Candidate {
    /// The instance.
    pub(crate) instance_id: String,
    /// The version it is at.
    pub(crate) from_version: Option<String>,
}

/// A checked fleet upgrade: its plan, the version it moves to and the instances it takes.
pub(crate) struct Fleet {
    pub(crate) entry: Arc<PlanEntry>,
    pub(crate) target_version: String,
    pub(crate) candidates: Vec<Candidate>,
}

/// The plan `service` and `plan` name (each by name or by id).
fn find_plan(broker: &Broker, service: &str, plan: &str) -> Option<Arc<PlanEntry>> {
    let config = broker.config();
    let found = config.plans().find(|e| {
        (e.service.name == service || e.service.id == service)
            && (e.plan.name == plan || e.plan.id == plan)
    });
    found.cloned()
}

impl UpgradeRequest {
    /// Checks the request's limits and plan, and chooses its instances.
    pub(crate) async fn fleet(&self, broker: &Broker) -> Result<Fleet, ApiError> {
        if !(1..=MAX_PARALLEL).contains(&self.max_parallel) {
            return Err(ApiError::bad_request(format!(
                "max_parallel must be 1 to {MAX_PARALLEL}"
            )));
        }
        if self.canary < 0 {
            return Err(ApiError::bad_request("canary must be 0 or more"));
        }
        if self.max_failures < 1 {
            return Err(ApiError::bad_request("max_failures must be 1 or more"));
        }
        let entry = find_plan(broker, &self.service, &self.plan).ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "no plan {:?} of service {:?} in the catalog",
                    self.plan, self.service
                ),
            )
        })?;
        let Some(target) = entry.plan.maintenance_info.as_ref() else {
            return Err(ApiError::bad_request(format!(
                "plan {:?} has no maintenance_info: there is no version to upgrade to",
                entry.plan.name
            )));
        };
        let target_version = target.version.clone();
        let instances = (broker.engine.store())
            .plan_instances(&entry.service.id, &entry.plan.id)
            .await?;
        let candidates = instances
            .iter()
            .filter(|r| version_of(r) != Some(target_version.as_str()))
            .map(|r| Candidate {
                instance_id: r.key.instance_id.clone(),
                from_version: version_of(r).map(str::to_owned),
            })
            .collect();
        Ok(Fleet {
            entry,
            target_version,
            candidates,
        })
    }

    /// The orchestration of `fleet` as this request sets it up, and its instances, pending;
    /// one with no instance has nothing left to do.
    pub(crate) fn orchestration(&self, fleet: &Fleet) -> (Orchestration, Vec<UpgradeItem>) {
        let items: Vec<UpgradeItem> = (0..)
            .zip(&fleet.candidates)
            .map(|(position, c)| UpgradeItem {
                instance_id: c.instance_id.clone(),
                position,
                from_version: c.from_version.clone(),
                state: ItemState::Pending,
                op_id: None,
                description: None,
            })
            .collect();
        let now = brokkr_engine::now_ms();
        let state = match items.is_empty() {
            true => OrchestrationState::Succeeded,
            false => OrchestrationState::Running,
        };
        let orchestration = Orchestration {
            id: uuid::Uuid::new_v4().to_string(),
            service_id: fleet.entry.service.id.clone(),
            plan_id: fleet.entry.plan.id.clone(),
            target_version: fleet.target_version.clone(),
            max_parallel: self.max_parallel,
            canary: self.canary,
            max_failures: self.max_failures,
            state,
            description: items
                .is_empty()
                .then(|| "no instance to upgrade".to_owned()),
            created_at: now,
            finished_at: items.is_empty().then_some(now),
        };
        (orchestration, items)
    }
}
