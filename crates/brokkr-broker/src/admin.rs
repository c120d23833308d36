//! The admin API: what operators need to see what the engine is doing.
//!
//! `GET /admin/v1/operations/{id}` shows an operation and its event log (steps started, finished,
//! waiting, failed); `GET /admin/v1/instances?state=…&limit=…` lists instances by status;
//! `GET /admin/v1/orphans` lists the steps deprovisions and unbinds left behind, which the
//! engine's janitor retries; `/admin/v1/upgrades` runs fleet upgrades (see [`crate::upgrade`]).
//! All use credentials separate from the platform's and never show
//! parameters or credentials.

use axum::Router;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use brokkr_engine::{Operation, Orphan, Resource, Status};
use serde_json::{Value, json};

use crate::body::Query;
use crate::broker::AppState;
use crate::error::ApiError;
use crate::response::{ApiResult, json_response};

/// Most instances one listing returns.
const MAX_LIMIT: i64 = 1000;

pub(crate) fn routes(broker: AppState) -> Router<AppState> {
    Router::new()
        .route("/admin/v1/operations/{operation_id}", get(operation))
        .route("/admin/v1/instances", get(instances))
        .route("/admin/v1/orphans", get(orphans))
        .merge(crate::upgrade::routes())
        .layer(axum::middleware::from_fn_with_state(broker, require_admin))
}

/// Admits requests with admin credentials; without any configured, the admin API is off.
async fn require_admin(State(broker): State<AppState>, request: Request, next: Next) -> Response {
    let Some(auth) = &broker.admin_auth else {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "the admin API is not enabled (set BROKKR_ADMIN_USERNAME and BROKKR_ADMIN_PASSWORD)",
        )
        .into_response();
    };
    let ok = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| auth.accepts(v));
    if ok {
        next.run(request).await
    } else {
        crate::auth::unauthorized(
            "admin authentication required",
            "Basic realm=\"brokkr admin\"",
        )
    }
}

fn operation_summary(op: &Operation) -> Value {
    json!({
        "id": op.id,
        "kind": op.kind.as_str(),
        "state": op.state.as_str(),
        "description": op.description,
        "step": op.step,
        "steps": op.plan.steps.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        "started_at": op.started_at,
        "finished_at": op.finished_at,
        "deadline_at": op.deadline_at,
    })
}

fn resource_summary(r: &Resource) -> Value {
    json!({
        "instance_id": r.key.instance_id,
        "binding_id": r.key.binding_id,
        "service_id": r.service_id,
        "plan_id": r.plan_id,
        "status": r.status.as_str(),
        "created_at": r.created_at,
        "deleted_at": r.deleted_at,
        "maintenance_version": r.attrs.maintenance_info.as_ref().map(|m| &m.version),
        "previous_operation": r.previous.as_ref().map(|p| json!({
            "id": p.id,
            "state": p.state.as_str(),
        })),
    })
}

async fn operation(State(broker): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let store = broker.engine.store();
    let not_found = || ApiError::new(StatusCode::NOT_FOUND, format!("no operation {id}"));
    let r = store.find_operation(&id).await?.ok_or_else(not_found)?;
    let operation = if r.op.id == id {
        operation_summary(&r.op)
    } else {
        let prev = r.previous.as_ref().ok_or_else(not_found)?;
        json!({"id": prev.id, "state": prev.state.as_str(), "description": prev.description})
    };
    let events = store.events(&id).await?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"operation": operation, "resource": resource_summary(&r), "events": events}),
    ))
}

async fn instances(State(broker): State<AppState>, RawQuery(query): RawQuery) -> ApiResult {
    let query = Query::parse(query.as_deref())?;
    let status = match query.get("state") {
        None => None,
        Some(s) => Some(Status::parse(s).ok_or_else(|| {
            ApiError::bad_request("state must be one of creating, ready, failed, deleted")
        })?),
    };
    let limit = match query.get("limit") {
        None => 100,
        Some(l) => l
            .parse::<i64>()
            .ok()
            .filter(|l| (1..=MAX_LIMIT).contains(l))
            .ok_or_else(|| ApiError::bad_request(format!("limit must be 1 to {MAX_LIMIT}")))?,
    };
    let list = broker.engine.store().list_instances(status, limit).await?;
    let instances: Vec<Value> = list
        .iter()
        .map(|r| {
            let mut v = resource_summary(r);
            v["operation"] = operation_summary(&r.op);
            v
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({ "instances": instances }),
    ))
}

fn orphan_summary(o: &Orphan) -> Value {
    json!({
        "instance_id": o.key.instance_id,
        "binding_id": o.key.binding_id,
        "kind": o.op_kind.as_str(),
        "operation": o.op_id,
        "step": o.step.name,
        "target": o.step.target().map(|t| &t.target),
        "since": o.since,
        "attempts": o.attempts,
        "last_error": o.last_error,
        "next_attempt_at": o.next_attempt_at,
    })
}

/// `GET /admin/v1/orphans`: every step left behind, oldest first (at most [`MAX_LIMIT`]).
async fn orphans(State(broker): State<AppState>) -> ApiResult {
    let list = broker.engine.store().list_orphans(None, MAX_LIMIT).await?;
    let orphans: Vec<Value> = list.iter().map(orphan_summary).collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({ "orphans": orphans }),
    ))
}
