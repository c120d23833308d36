//! One instance of a fleet upgrade, moved one step on: a pending one started (an update to the
//! target version, through the same code as an OSB update, with the store's compare-and-set on
//! the instance's current operation), or found done or under way already; an upgrade in
//! progress followed to its end. Each instance is upgraded at most once: an instance at the
//! target version is done, and an update to it that is running, or that ended since the
//! orchestration began, is taken as this one rather than started again.

use axum::http::StatusCode;
use brokkr_engine::{
    ItemState, Key, OpKind, Operation, Orchestration, Resource, Status, UpgradeItem,
};
use brokkr_osb::messages::UpdateRequest;
use brokkr_osb::{ErrorCode, OperationState};

use crate::broker::Broker;
use crate::error::ApiError;
use crate::operations::launch;
use crate::update::{Updated, maintenance_version, start_update, version_of};

/// `item` with a new state, operation and description.
fn moved(
    item: &UpgradeItem,
    state: ItemState,
    op_id: Option<&str>,
    description: String,
) -> UpgradeItem {
    UpgradeItem {
        state,
        op_id: op_id.map(str::to_owned).or_else(|| item.op_id.clone()),
        description: Some(description),
        ..item.clone()
    }
}

/// Whether `op` is an update to `version`.
fn upgrades_to(op: &Operation, version: &str) -> bool {
    op.kind == OpKind::Update
        && (op.update.as_ref())
            .and_then(|u| u.attrs.maintenance_info.as_ref())
            .is_some_and(|m| m.version == version)
}

/// The item as `op`, an upgrade of it, ended or runs.
fn of_operation(item: &UpgradeItem, op: &Operation) -> Option<UpgradeItem> {
    let description = op.description.clone().unwrap_or_default();
    match op.state {
        OperationState::InProgress if item.state == ItemState::InProgress => None,
        OperationState::InProgress => Some(moved(
            item,
            ItemState::InProgress,
            Some(&op.id),
            description,
        )),
        OperationState::Succeeded => {
            Some(moved(item, ItemState::Succeeded, Some(&op.id), description))
        }
        OperationState::Failed => Some(moved(item, ItemState::Failed, Some(&op.id), description)),
    }
}

/// The instance of `item` moved one step on: a pending one started, or found done or under way
/// already; one in progress followed. `None` when it stays as it is (an upgrade still running;
/// another operation of the instance to wait for).
pub(crate) async fn advance(
    broker: &Broker,
    o: &Orchestration,
    item: &UpgradeItem,
) -> Result<Option<UpgradeItem>, ApiError> {
    let key = Key::instance(&item.instance_id);
    let current = broker.engine.store().get(&key).await?;
    let Some(r) = current.filter(|r| r.status == Status::Ready) else {
        let gone = "the instance was deprovisioned: nothing to upgrade".to_owned();
        return Ok(Some(moved(item, ItemState::Succeeded, None, gone)));
    };
    if item.state == ItemState::InProgress {
        return Ok(follow(o, item, &r));
    }
    let target = o.target_version.as_str();
    if r.op.in_progress() {
        // An upgrade the platform (or this orchestration before a restart) started is this one;
        // another operation is waited for.
        return Ok(upgrades_to(&r.op, target)
            .then(|| of_operation(item, &r.op))
            .flatten());
    }
    let since_begun = r.op.started_at >= o.created_at && upgrades_to(&r.op, target);
    if version_of(&r) == Some(target) {
        let how = match since_begun {
            true => format!("upgraded to {target} by operation {}", r.op.id),
            false => format!("already at {target}"),
        };
        return Ok(Some(moved(item, ItemState::Succeeded, None, how)));
    }
    if since_begun && r.op.state == OperationState::Failed {
        return Ok(of_operation(item, &r.op));
    }
    if r.plan_id != o.plan_id {
        let moved_away = "the instance moved to another plan: nothing to upgrade".to_owned();
        return Ok(Some(moved(item, ItemState::Succeeded, None, moved_away)));
    }
    start(broker, item, &r, target).await
}

/// Starts the upgrade of `r` to `target` as an OSB update with the plan's new maintenance
/// information would.
async fn start(
    broker: &Broker,
    item: &UpgradeItem,
    r: &Resource,
    target: &str,
) -> Result<Option<UpgradeItem>, ApiError> {
    let req = UpdateRequest {
        service_id: r.service_id.clone(),
        maintenance_info: Some(maintenance_version(target.to_owned())),
        ..UpdateRequest::default()
    };
    match start_update(broker, &r.key.instance_id, &req, true).await {
        Ok(Updated::Started(started)) => {
            // Once started, the engine owns it: a crash here leaves it to the engine's recovery.
            launch(broker, &started).await?;
            Ok(of_operation(item, &started.op))
        }
        Ok(Updated::Running(op)) => Ok(of_operation(item, &op)),
        Ok(Updated::Unchanged(_)) => {
            let done = format!("already at {target}");
            Ok(Some(moved(item, ItemState::Succeeded, None, done)))
        }
        // Another operation got there first: waited for.
        Err(e) if e.body.error == Some(ErrorCode::ConcurrencyError) => Ok(None),
        Err(e) if e.status == StatusCode::SERVICE_UNAVAILABLE => Err(e),
        Err(e) => {
            let why = e.body.description.unwrap_or_else(|| e.status.to_string());
            Ok(Some(moved(item, ItemState::Failed, None, why)))
        }
    }
}

/// An upgrade in progress, followed: its operation's end, or how the instance is when another
/// operation replaced it.
fn follow(o: &Orchestration, item: &UpgradeItem, r: &Resource) -> Option<UpgradeItem> {
    let op_id = item.op_id.as_deref().unwrap_or_default();
    if r.op.id == op_id {
        return of_operation(item, &r.op);
    }
    if let Some(prev) = r.previous.as_ref().filter(|p| p.id == op_id) {
        let state = match prev.state {
            OperationState::Succeeded => ItemState::Succeeded,
            _ => ItemState::Failed,
        };
        let description = prev.description.clone().unwrap_or_default();
        return Some(moved(item, state, None, description));
    }
    let target = o.target_version.as_str();
    Some(match version_of(r) == Some(target) {
        true => moved(item, ItemState::Succeeded, None, format!("at {target}")),
        false => moved(
            item,
            ItemState::Failed,
            None,
            format!("operation {op_id} was replaced before the instance reached {target}"),
        ),
    })
}
