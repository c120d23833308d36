//! Changing an instance: the checks and the compare-and-set start of an update, shared by the
//! OSB `PATCH` handler and the upgrade orchestrator. An update that moves the instance to a new
//! maintenance version is an upgrade: it also runs the steps `on: [upgrade]`, and the version is
//! recorded only when it succeeds.

use axum::http::StatusCode;
use brokkr_blueprint::PlanEntry;
use brokkr_engine::{Key, NewStatus, OpKind, Operation, Resource, Status, Update};
use brokkr_osb::messages::UpdateRequest;
use brokkr_osb::{ErrorCode, MaintenanceInfo};
use tracing::info;

use crate::broker::Broker;
use crate::error::ApiError;
use crate::operations::{Steps, new_operation};
use crate::request::{plan_entry, validate_parameters};

/// How a request to change an instance went.
pub(crate) enum Updated {
    /// Nothing changes: the instance as it is.
    Unchanged(Box<Resource>),
    /// The same update already runs: its operation.
    Running(Box<Operation>),
    /// The update started: the instance as the start left it, its operation still to launch.
    Started(Box<Resource>),
}

/// Maintenance information at `version`, as an instance keeps it.
pub(crate) fn maintenance_version(version: String) -> MaintenanceInfo {
    MaintenanceInfo {
        version,
        description: None,
    }
}

/// Refuses a request's maintenance information unless it is the plan's current one.
pub(crate) fn check_maintenance_info(
    entry: &PlanEntry,
    requested: Option<&MaintenanceInfo>,
) -> Result<(), ApiError> {
    let Some(requested) = requested else {
        return Ok(());
    };
    let current = entry
        .plan
        .maintenance_info
        .as_ref()
        .map(|m| m.version.as_str());
    if current == Some(requested.version.as_str()) {
        return Ok(());
    }
    Err(ApiError::unprocessable(
        ErrorCode::MaintenanceInfoConflict,
        match current {
            Some(v) => format!(
                "The maintenance information for plan {:?} has changed: it is {v}, not {}.",
                entry.plan.name, requested.version
            ),
            None => format!(
                "Plan {:?} has no maintenance information; omit maintenance_info.",
                entry.plan.name
            ),
        },
    ))
}

/// The version an instance is recorded at, if any.
pub(crate) fn version_of(r: &Resource) -> Option<&str> {
    r.attrs
        .maintenance_info
        .as_ref()
        .map(|m| m.version.as_str())
}

/// Checks `req` against instance `instance_id` and its plan, and starts the update it asks for
/// with a compare-and-set on the instance's current operation. The operation is not launched:
/// the caller does it ([`crate::operations::launch`]).
pub(crate) async fn start_update(
    broker: &Broker,
    instance_id: &str,
    req: &UpdateRequest,
    accepts_incomplete: bool,
) -> Result<Updated, ApiError> {
    let key = Key::instance(instance_id);
    let Some(current) =
        (broker.engine.store().get(&key).await?).filter(|r| r.status != Status::Deleted)
    else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("instance {instance_id} does not exist"),
        ));
    };
    if req.service_id != current.service_id {
        return Err(ApiError::bad_request(format!(
            "instance {instance_id} belongs to service {:?}, not {:?}",
            current.service_id, req.service_id
        )));
    }
    let target_plan = req
        .plan_id
        .clone()
        .unwrap_or_else(|| current.plan_id.clone());
    let entry = plan_entry(broker, &req.service_id, &target_plan)?;
    let entry = &*entry;
    if target_plan != current.plan_id {
        let updateable = broker
            .config()
            .plan(&current.service_id, &current.plan_id)
            .map_or_else(|| entry.plan_updateable(), |e| e.plan_updateable());
        if !updateable {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "the plan of this instance cannot be changed (plan_updateable is false)",
            ));
        }
    }
    check_maintenance_info(entry, req.maintenance_info.as_ref())?;
    validate_parameters(
        entry.instance_update_schema.as_ref(),
        req.parameters.as_ref(),
    )?;
    match current.status {
        Status::Creating => {
            return Err(ApiError::concurrency(format!(
                "instance {instance_id} is being provisioned"
            )));
        }
        Status::Failed => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "instance {instance_id} failed to provision; deprovision it and provision again"
                ),
            ));
        }
        Status::Ready | Status::Deleted => {}
    }

    let mut attrs = current.attrs.clone();
    if let Some(p) = &req.parameters {
        attrs.parameters = Some(p.clone());
    }
    if let Some(c) = &req.context {
        attrs.context = Some(c.clone());
    }
    // A plan change moves the instance to the new plan's maintenance version.
    let plan_version = (target_plan != current.plan_id)
        .then_some(entry.plan.maintenance_info.as_ref())
        .flatten();
    if let Some(version) = req.maintenance_info.as_ref().or(plan_version) {
        attrs.maintenance_info = Some(maintenance_version(version.version.clone()));
    }
    let upgrade = attrs.maintenance_info != current.attrs.maintenance_info;
    let update = Update {
        plan_id: target_plan.clone(),
        attrs,
    };
    if current.op.in_progress() {
        if current.op.kind == OpKind::Update
            && current.op.update.as_ref() == Some(&update)
            && accepts_incomplete
        {
            return Ok(Updated::Running(Box::new(current.op)));
        }
        return Err(ApiError::concurrency(format!(
            "a {} of instance {instance_id} is in progress",
            current.op.kind.as_str()
        )));
    }
    if target_plan == current.plan_id && update.attrs == current.attrs {
        return Ok(Updated::Unchanged(Box::new(current)));
    }
    // Only the context changed: record it, with nothing to run.
    let context_only =
        target_plan == current.plan_id && update.attrs.identity() == current.attrs.identity();
    let steps = match (context_only, upgrade) {
        (true, _) => Steps::Nothing,
        (false, true) => Steps::Upgrade,
        (false, false) => Steps::Configured,
    };
    let op = new_operation(broker, Some(entry), OpKind::Update, steps, Some(update))?;
    if !op.plan.steps.is_empty() && !accepts_incomplete {
        return Err(ApiError::async_required());
    }
    let store = broker.engine.store();
    let started = store
        .start(&key, &current.op.id, &op, NewStatus::Set(Status::Ready))
        .await?;
    let Some(updated) = started else {
        // Another request got there first: the same update answers with its operation.
        if let Some(now) = store.get(&key).await?
            && now.op.in_progress()
            && now.op.kind == OpKind::Update
            && now.op.update == op.update
            && accepts_incomplete
        {
            return Ok(Updated::Running(Box::new(now.op)));
        }
        return Err(ApiError::concurrency(format!(
            "instance {instance_id} is being changed by another request"
        )));
    };
    info!(instance_id, operation = %op.id, plan = %entry.plan.name, upgrade, "updating");
    Ok(Updated::Started(Box::new(updated)))
}
