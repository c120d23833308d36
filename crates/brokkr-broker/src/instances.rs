//! Instance endpoints: provision, update, deprovision, fetch and last_operation.

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use brokkr_blueprint::PlanEntry;
use brokkr_engine::store::Created;
use brokkr_engine::{EvaluationError, Key, NewStatus, OpKind, Resource, Status};
use brokkr_osb::messages::{
    InstanceOperationResponse, InstanceResource, ProvisionRequest, UpdateRequest,
};
use brokkr_osb::{ErrorCode, OperationState};
use serde_json::{Map, Value, json};
use tracing::info;

use crate::body::{Query, check_id};
use crate::error::ApiError;
use crate::operations::{
    Steps, Written, accepted, launch, new_operation, operation_failed, poll_response, superseded,
    wait_sync,
};
use crate::request::{plan_entry, read_mutation, validate_parameters};
use crate::response::{ApiResult, json_response};
use crate::{AppState, Broker};

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/v2/service_instances/{instance_id}",
            get(fetch).put(provision).patch(update).delete(deprovision),
        )
        .route(
            "/v2/service_instances/{instance_id}/last_operation",
            get(last_operation),
        )
}

/// The attributes whose difference makes a repeated provision a conflict (context excluded:
/// platforms may refresh it between retries).
fn identity(attrs: &Value) -> Value {
    let mut attrs = attrs.clone();
    if let Some(map) = attrs.as_object_mut() {
        map.remove("context");
    }
    attrs
}

fn instance_attrs(req: &ProvisionRequest, entry: &PlanEntry) -> Value {
    let mut attrs = Map::new();
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            attrs.insert(k.to_owned(), v);
        }
    };
    put("parameters", req.parameters.clone().map(Value::Object));
    put("context", req.context.clone().map(Value::Object));
    put(
        "organization_guid",
        req.organization_guid.clone().map(Value::String),
    );
    put("space_guid", req.space_guid.clone().map(Value::String));
    // The instance is built at the plan's current maintenance version.
    let version = req
        .maintenance_info
        .as_ref()
        .or(entry.plan.maintenance_info.as_ref())
        .map(|m| m.version.clone());
    put("maintenance_info", version.map(|v| json!({ "version": v })));
    Value::Object(attrs)
}

fn check_maintenance_info(
    entry: &PlanEntry,
    requested: Option<&brokkr_osb::MaintenanceInfo>,
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

fn instance_body(r: &Resource) -> InstanceOperationResponse {
    InstanceOperationResponse {
        dashboard_url: r.dashboard_url.clone(),
        ..Default::default()
    }
}

/// Dry-runs the binding credentials template with the instance's parameters and no binding
/// parameters, so that a provision whose credentials could never be valid is refused before
/// anything is stored.
fn check_credentials_possible(
    broker: &Broker,
    entry: &PlanEntry,
    instance: &Resource,
) -> Result<(), ApiError> {
    let Some(binding) = &entry.blueprint.binding else {
        return Ok(());
    };
    match broker
        .engine
        .credentials_dry_run(&binding.credentials, instance)
    {
        Err(EvaluationError::Invalid(reason)) => Err(ApiError::bad_request(format!(
            "invalid parameters: {reason}"
        ))),
        // A template that needs binding parameters is judged at bind time.
        Ok(_) | Err(EvaluationError::Template(_)) => Ok(()),
    }
}

/// OSB 2.17 requires `organization_guid` and `space_guid` in a provision (deprecated in favour
/// of `context`, but REQUIRED); missing ones are a 400 unless the broker is told to accept them.
/// Refuses a plan whose steps need what a target knows is missing here (a `local` target's
/// server program that is not installed), naming what to install.
fn check_programs(broker: &Broker, resource: &Resource) -> Result<(), ApiError> {
    let targets = broker.engine.targets();
    let missing = (resource.op.plan.steps.iter())
        .filter_map(|step| Some((step.target.as_deref()?, &step.templates)))
        .find_map(|(target, templates)| targets.cannot_make(target, templates));
    match missing {
        Some(reason) => Err(ApiError::bad_request(reason)),
        None => Ok(()),
    }
}

fn check_guids(broker: &Broker, req: &ProvisionRequest) -> Result<(), ApiError> {
    if broker.config().broker.accept_provision_without_guids {
        return Ok(());
    }
    let missing: Vec<&str> = [
        ("organization_guid", &req.organization_guid),
        ("space_guid", &req.space_guid),
    ]
    .into_iter()
    .filter(|(_, value)| value.as_deref().is_none_or(str::is_empty))
    .map(|(field, _)| field)
    .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(ApiError::bad_request(format!(
        "{} required (OSB 2.17); a platform that sends only `context` needs \
         broker.accept_provision_without_guids: true",
        match missing.as_slice() {
            [one] => format!("{one} is"),
            _ => "organization_guid and space_guid are".to_owned(),
        }
    )))
}

async fn provision(
    State(broker): State<AppState>,
    Path(instance_id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    check_id("instance_id", &instance_id)?;
    let (accepts_incomplete, req) = read_mutation(
        &broker,
        query.as_deref(),
        &headers,
        body,
        ProvisionRequest::from_slice,
    )
    .await?;
    check_guids(&broker, &req)?;
    let entry = plan_entry(&broker, &req.service_id, &req.plan_id)?;
    let entry = &*entry;
    check_maintenance_info(entry, req.maintenance_info.as_ref())?;
    validate_parameters(
        entry.instance_create_schema.as_ref(),
        req.parameters.as_ref(),
    )?;

    let key = Key::instance(&instance_id);
    let op = new_operation(
        &broker,
        Some(entry),
        OpKind::Provision,
        Steps::Configured,
        json!({}),
    );
    let mut resource = Resource::new(
        key.clone(),
        &req.service_id,
        &req.plan_id,
        instance_attrs(&req, entry),
        op,
    );
    let needs_async = !resource.op.plan.steps.is_empty();

    for _ in 0..3 {
        let existing = broker.engine.store().get(&key).await?;
        let live = existing.filter(|r| r.status != Status::Deleted);
        let Some(existing) = live else {
            // Computed only for a new instance: a repeat keeps the values it was created with.
            let registry = broker
                .engine
                .registry(&entry.blueprint.instance.registry, &resource, None)
                .map_err(|e| ApiError::bad_request(format!("invalid parameters: {e}")))?;
            resource.outputs = json!({ "registry": registry });
            check_credentials_possible(&broker, entry, &resource)?;
            check_programs(&broker, &resource)?;
            if needs_async && !accepts_incomplete {
                return Err(ApiError::async_required());
            }
            match broker.engine.store().create(&resource).await? {
                Created::Inserted => {
                    info!(instance_id, operation = %resource.op.id, plan = %entry.plan.name, "provisioning");
                    return started(&broker, &resource, Written::Row, StatusCode::CREATED).await;
                }
                Created::Exists(_) => continue, // lost a race: decide against the winner
            }
        };
        if identity(&existing.attrs) != identity(&resource.attrs)
            || existing.service_id != resource.service_id
            || existing.plan_id != resource.plan_id
        {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("instance {instance_id} already exists with different attributes"),
            ));
        }
        let op = &existing.op;
        if op.in_progress() && op.kind != OpKind::Provision {
            return Err(ApiError::concurrency(format!(
                "a {} of instance {instance_id} is in progress",
                op.kind.as_str()
            )));
        }
        match existing.status {
            Status::Creating if op.in_progress() => {
                if accepts_incomplete {
                    return Ok(accepted(op));
                }
                let done = wait_sync(&broker, &key, op).await?;
                match done {
                    Some(r) if r.status == Status::Ready => {
                        return Ok(json_response(StatusCode::OK, &instance_body(&r)));
                    }
                    _ => {
                        return Err(ApiError::concurrency(format!(
                            "instance {instance_id} is being provisioned"
                        )));
                    }
                }
            }
            Status::Ready => return Ok(json_response(StatusCode::OK, &instance_body(&existing))),
            _ => {
                // A failed provision with the same attributes: try again.
                if needs_async && !accepts_incomplete {
                    return Err(ApiError::async_required());
                }
                // The instance keeps its attributes and registry; only the operation is new.
                if broker
                    .engine
                    .store()
                    .start(&key, &op.id, &resource.op, NewStatus::Set(Status::Creating))
                    .await?
                {
                    info!(instance_id, operation = %resource.op.id, "provisioning again after a failure");
                    let written = Written::Operation;
                    return started(&broker, &resource, written, StatusCode::CREATED).await;
                }
            }
        }
    }
    Err(ApiError::concurrency(format!(
        "instance {instance_id} is being changed by another request"
    )))
}

/// Answers a request that just started `r.op`: 202 for asynchronous plans, or the final answer
/// of a synchronous one (`created` on success).
async fn started(
    broker: &Broker,
    r: &Resource,
    written: Written,
    created: StatusCode,
) -> ApiResult {
    match launch(broker, r, written).await? {
        None => Ok(json_response(
            StatusCode::ACCEPTED,
            &InstanceOperationResponse {
                operation: Some(r.op.id.clone()),
                ..instance_body(r)
            },
        )),
        Some(done) if done.op.id != r.op.id => Err(superseded(&done)),
        Some(done) if done.op.state == OperationState::Succeeded => {
            let status = if r.op.kind == OpKind::Provision {
                created
            } else {
                StatusCode::OK
            };
            if r.op.kind == OpKind::Deprovision {
                return Ok(json_response(status, &json!({})));
            }
            Ok(json_response(status, &instance_body(&done)))
        }
        Some(done) => Err(operation_failed(done)),
    }
}

async fn update(
    State(broker): State<AppState>,
    Path(instance_id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    check_id("instance_id", &instance_id)?;
    let (accepts_incomplete, req) = read_mutation(
        &broker,
        query.as_deref(),
        &headers,
        body,
        UpdateRequest::from_slice,
    )
    .await?;
    let key = Key::instance(&instance_id);
    let Some(current) = broker
        .engine
        .store()
        .get(&key)
        .await?
        .filter(|r| r.status != Status::Deleted)
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
    let entry = plan_entry(&broker, &req.service_id, &target_plan)?;
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
    let map = attrs.as_object_mut().expect("attrs are an object");
    if let Some(p) = &req.parameters {
        map.insert("parameters".into(), Value::Object(p.clone()));
    }
    if let Some(c) = &req.context {
        map.insert("context".into(), Value::Object(c.clone()));
    }
    if let Some(version) = req
        .maintenance_info
        .as_ref()
        .map(|m| m.version.clone())
        .or_else(|| {
            // A plan change moves the instance to the new plan's maintenance version.
            (target_plan != current.plan_id)
                .then(|| {
                    entry
                        .plan
                        .maintenance_info
                        .as_ref()
                        .map(|m| m.version.clone())
                })
                .flatten()
        })
    {
        map.insert("maintenance_info".into(), json!({ "version": version }));
    }
    let request = json!({"plan_id": target_plan, "attrs": attrs});
    if current.op.in_progress() {
        if current.op.kind == OpKind::Update && current.op.request == request && accepts_incomplete
        {
            return Ok(accepted(&current.op));
        }
        return Err(ApiError::concurrency(format!(
            "a {} of instance {instance_id} is in progress",
            current.op.kind.as_str()
        )));
    }
    if target_plan == current.plan_id && attrs == current.attrs {
        return Ok(json_response(StatusCode::OK, &instance_body(&current)));
    }
    // Only the context changed: record it, with nothing to run.
    let context_only =
        target_plan == current.plan_id && identity(&attrs) == identity(&current.attrs);
    let steps = match context_only {
        true => Steps::Nothing,
        false => Steps::Configured,
    };
    let op = new_operation(&broker, Some(entry), OpKind::Update, steps, request);
    if !op.plan.steps.is_empty() && !accepts_incomplete {
        return Err(ApiError::async_required());
    }
    let store = broker.engine.store();
    if !store
        .start(&key, &current.op.id, &op, NewStatus::Set(Status::Ready))
        .await?
    {
        // Another request got there first: the same update answers with its operation.
        if let Some(now) = store.get(&key).await?
            && now.op.in_progress()
            && now.op.kind == OpKind::Update
            && now.op.request == op.request
            && accepts_incomplete
        {
            return Ok(accepted(&now.op));
        }
        return Err(ApiError::concurrency(format!(
            "instance {instance_id} is being changed by another request"
        )));
    }
    info!(instance_id, operation = %op.id, plan = %entry.plan.name, "updating");
    let updated = Resource { op, ..current };
    started(&broker, &updated, Written::Operation, StatusCode::OK).await
}

async fn deprovision(
    State(broker): State<AppState>,
    Path(instance_id): Path<String>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    check_id("instance_id", &instance_id)?;
    let query = Query::parse(query.as_deref())?;
    let accepts_incomplete = query.accepts_incomplete()?;
    let service_id = query.required("service_id")?;
    let plan_id = query.required("plan_id")?;
    let key = Key::instance(&instance_id);
    for _ in 0..3 {
        let Some(current) = broker.engine.store().get(&key).await? else {
            return Ok(json_response(StatusCode::GONE, &json!({})));
        };
        // A deprovision that skipped steps may be repeated: it tries those steps again.
        let finished = current.status == Status::Deleted && !current.op.in_progress();
        let retry = if finished {
            broker.engine.steps_left_behind(&current).await?
        } else {
            Vec::new()
        };
        if finished && retry.is_empty() {
            return Ok(json_response(StatusCode::GONE, &json!({})));
        }
        if service_id != current.service_id || plan_id != current.plan_id {
            return Err(ApiError::bad_request(format!(
                "instance {instance_id} has service_id {:?} and plan_id {:?}",
                current.service_id, current.plan_id
            )));
        }
        if current.op.in_progress() {
            match current.op.kind {
                OpKind::Deprovision if accepts_incomplete => return Ok(accepted(&current.op)),
                OpKind::Deprovision => {
                    let done = wait_sync(&broker, &key, &current.op).await?;
                    return match done {
                        Some(r) if r.status != Status::Deleted => Err(ApiError::concurrency(
                            format!("instance {instance_id} is being deprovisioned"),
                        )),
                        _ => Ok(json_response(StatusCode::OK, &json!({}))),
                    };
                }
                OpKind::Provision => {} // halted: the deprovision replaces it
                _ => {
                    return Err(ApiError::concurrency(format!(
                        "a {} of instance {instance_id} is in progress",
                        current.op.kind.as_str()
                    )));
                }
            }
        }
        let config = broker.config();
        let entry = config.plan(&current.service_id, &current.plan_id);
        let steps = match retry.is_empty() {
            true => Steps::Configured,
            false => Steps::LeftBehind(retry),
        };
        let op = new_operation(
            &broker,
            entry.map(|e| e.as_ref()),
            OpKind::Deprovision,
            steps,
            json!({}),
        );
        if !op.plan.steps.is_empty() && !accepts_incomplete {
            return Err(ApiError::async_required());
        }
        let status = match current.status {
            Status::Deleted => NewStatus::Set(Status::Deleted),
            _ => NewStatus::HaltCreation,
        };
        if broker
            .engine
            .store()
            .start(&key, &current.op.id, &op, status)
            .await?
        {
            info!(instance_id, operation = %op.id, "deprovisioning");
            let r = Resource { op, ..current };
            return started(&broker, &r, Written::Operation, StatusCode::OK).await;
        }
    }
    Err(ApiError::concurrency(format!(
        "instance {instance_id} is being changed by another request"
    )))
}

async fn fetch(State(broker): State<AppState>, Path(instance_id): Path<String>) -> ApiResult {
    check_id("instance_id", &instance_id)?;
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("instance {instance_id} does not exist"),
        )
    };
    let r = broker
        .engine
        .store()
        .get(&Key::instance(&instance_id))
        .await?
        .filter(|r| r.status == Status::Ready)
        .ok_or_else(not_found)?;
    let retrievable = broker
        .config()
        .catalog
        .service(&r.service_id)
        .is_none_or(|s| s.instances_retrievable.unwrap_or(false));
    if !retrievable {
        return Err(ApiError::bad_request(
            "instances of this service are not retrievable",
        ));
    }
    if r.op.in_progress() && r.op.kind == OpKind::Update {
        return Err(ApiError::concurrency(format!(
            "instance {instance_id} is being updated"
        )));
    }
    let maintenance_info = r
        .attrs
        .get("maintenance_info")
        .and_then(|m| serde_json::from_value(m.clone()).ok());
    let body = InstanceResource {
        service_id: r.service_id.clone(),
        plan_id: r.plan_id.clone(),
        dashboard_url: r.dashboard_url.clone(),
        parameters: r
            .attrs
            .get("parameters")
            .and_then(|p| p.as_object().cloned()),
        maintenance_info,
        metadata: None,
        instance_usable: broker.engine.targets().instance_usable(&instance_id),
    };
    Ok(json_response(StatusCode::OK, &body))
}

async fn last_operation(
    State(broker): State<AppState>,
    Path(instance_id): Path<String>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    check_id("instance_id", &instance_id)?;
    let query = Query::parse(query.as_deref())?;
    let r = broker
        .engine
        .store()
        .get_status(&Key::instance(&instance_id))
        .await?;
    let usable = broker.engine.targets().instance_usable(&instance_id);
    poll_response(r, query.get("operation"), usable, || {
        format!("instance {instance_id} does not exist")
    })
}
