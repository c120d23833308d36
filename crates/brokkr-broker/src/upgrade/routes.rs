//! The admin API of fleet upgrades: `POST /admin/v1/upgrades` (start one, or with `dry_run`
//! say what it would do), `GET /admin/v1/upgrades` and `GET /admin/v1/upgrades/{id}`, and
//! `POST /admin/v1/upgrades/{id}/pause`, `…/resume` and `…/cancel`. The admin API's
//! credentials guard them (see [`crate::admin`]).

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use brokkr_engine::{ItemState, Orchestration, OrchestrationState, UpgradeItem};
use serde_json::{Value, json};

use super::fleet::UpgradeRequest;
use crate::broker::{AppState, Broker};
use crate::error::ApiError;
use crate::response::{ApiResult, json_response};

/// Most orchestrations a listing returns.
const LIST_LIMIT: i64 = 100;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/admin/v1/upgrades", get(list).post(create))
        .route("/admin/v1/upgrades/{id}", get(show))
        .route("/admin/v1/upgrades/{id}/{action}", post(act))
}

/// The service and plan names of `o`, while its plan is configured.
fn names(broker: &Broker, o: &Orchestration) -> (Option<String>, Option<String>) {
    let config = broker.config();
    match config.plan(&o.service_id, &o.plan_id) {
        Some(e) => (Some(e.service.name.clone()), Some(e.plan.name.clone())),
        None => (None, None),
    }
}

fn summary(broker: &Broker, o: &Orchestration, items: &[UpgradeItem]) -> Value {
    let count = |state| items.iter().filter(|i| i.state == state).count();
    let (service, plan) = names(broker, o);
    json!({
        "id": o.id,
        "service_id": o.service_id,
        "plan_id": o.plan_id,
        "service": service,
        "plan": plan,
        "target_version": o.target_version,
        "max_parallel": o.max_parallel,
        "canary": o.canary,
        "max_failures": o.max_failures,
        "state": o.state.as_str(),
        "description": o.description,
        "created_at": o.created_at,
        "finished_at": o.finished_at,
        "counts": {
            "total": items.len(),
            "pending": count(ItemState::Pending),
            "in_progress": count(ItemState::InProgress),
            "succeeded": count(ItemState::Succeeded),
            "failed": count(ItemState::Failed),
        },
    })
}

fn item_json(o: &Orchestration, i: &UpgradeItem) -> Value {
    json!({
        "instance_id": i.instance_id,
        "canary": i.position < o.canary,
        "from_version": i.from_version,
        "state": i.state.as_str(),
        "operation": i.op_id,
        "description": i.description,
    })
}

async fn create(State(broker): State<AppState>, body: Bytes) -> ApiResult {
    let req: UpgradeRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid upgrade request: {e}")))?;
    let fleet = req.fleet(&broker).await?;
    if req.dry_run {
        let instances: Vec<Value> = (fleet.candidates.iter())
            .map(|c| {
                json!({
                    "instance_id": c.instance_id,
                    "from_version": c.from_version,
                    "to_version": fleet.target_version,
                })
            })
            .collect();
        let body = json!({
            "dry_run": true,
            "service": fleet.entry.service.name,
            "plan": fleet.entry.plan.name,
            "target_version": fleet.target_version,
            "instances": instances,
        });
        return Ok(json_response(StatusCode::OK, &body));
    }
    let store = broker.engine.store();
    let active = [OrchestrationState::Running, OrchestrationState::Paused];
    let busy = (store.list_orchestrations(LIST_LIMIT).await?.into_iter()).find(|o| {
        active.contains(&o.state)
            && o.service_id == fleet.entry.service.id
            && o.plan_id == fleet.entry.plan.id
    });
    if let Some(o) = busy {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("upgrade {} of this plan is {}", o.id, o.state.as_str()),
        ));
    }
    let (o, items) = req.orchestration(&fleet);
    store.create_orchestration(&o, &items).await?;
    tracing::info!(upgrade = %o.id, plan = %fleet.entry.plan.name, instances = items.len(), "fleet upgrade created");
    Ok(json_response(
        StatusCode::CREATED,
        &summary(&broker, &o, &items),
    ))
}

async fn list(State(broker): State<AppState>) -> ApiResult {
    let store = broker.engine.store();
    let mut upgrades = Vec::new();
    for o in store.list_orchestrations(LIST_LIMIT).await? {
        if let Some((o, items)) = store.orchestration(&o.id).await? {
            upgrades.push(summary(&broker, &o, &items));
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({ "upgrades": upgrades }),
    ))
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("no upgrade {id}"))
}

async fn show(State(broker): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let (o, items) =
        (broker.engine.store().orchestration(&id).await?).ok_or_else(|| not_found(&id))?;
    let mut body = summary(&broker, &o, &items);
    body["instances"] = items.iter().map(|i| item_json(&o, i)).collect();
    Ok(json_response(StatusCode::OK, &body))
}

async fn act(
    State(broker): State<AppState>,
    Path((id, action)): Path<(String, String)>,
) -> ApiResult {
    use OrchestrationState::{Cancelled, Paused, Running};
    let (from, to): (&[OrchestrationState], _) = match action.as_str() {
        "pause" => (&[Running], Paused),
        "resume" => (&[Paused], Running),
        "cancel" => (&[Running, Paused], Cancelled),
        _ => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no action {action:?}: pause, resume or cancel"),
            ));
        }
    };
    let store = broker.engine.store();
    let description = (to == Cancelled).then_some("cancelled by an operator");
    if !store
        .set_orchestration_state(&id, from, to, description)
        .await?
    {
        let (o, _) = store
            .orchestration(&id)
            .await?
            .ok_or_else(|| not_found(&id))?;
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("upgrade {id} is {}: it cannot {action}", o.state.as_str()),
        ));
    }
    tracing::info!(upgrade = %id, state = to.as_str(), "fleet upgrade {action}");
    show(State(broker), Path(id)).await
}
