//! Instance endpoints: provision, update, deprovision, fetch and last_operation.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use brokkr_blueprint::{Phase, PlanEntry};
use brokkr_engine::store::Created;
use brokkr_engine::{EvaluationError, Key, NewStatus, OpKind, OpPlan, Operation, Resource, Status};
use brokkr_osb::messages::{
    AsyncResponse, InstanceOperationResponse, InstanceResource, LastOperation, ProvisionRequest,
    UpdateRequest,
};
use brokkr_osb::{ErrorCode, OperationState};
use serde::Serialize;
use serde_json::{Map, Value, json};
use tracing::info;

use crate::body::{Query, check_id, read_json};
use crate::error::ApiError;
use crate::{AppState, Broker, DEFAULT_DEADLINE};

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

pub(crate) type ApiResult = Result<Response, ApiError>;

pub(crate) fn json_response(status: StatusCode, body: &impl Serialize) -> Response {
    (status, axum::Json(body)).into_response()
}

pub(crate) fn accepted(op: &Operation) -> Response {
    json_response(
        StatusCode::ACCEPTED,
        &AsyncResponse {
            operation: Some(op.id.clone()),
        },
    )
}

/// Looks up a plan, explaining which id is unknown.
pub(crate) fn plan_entry(
    broker: &Broker,
    service_id: &str,
    plan_id: &str,
) -> Result<Arc<PlanEntry>, ApiError> {
    let config = broker.config();
    if config.catalog.service(service_id).is_none() {
        return Err(ApiError::bad_request(format!(
            "service_id {service_id:?} is not in the catalog"
        )));
    }
    config.plan(service_id, plan_id).cloned().ok_or_else(|| {
        ApiError::bad_request(format!(
            "plan_id {plan_id:?} is not a plan of service {service_id:?}"
        ))
    })
}

/// Validates parameters against an optional schema: 400 with every violation.
pub(crate) fn validate_parameters(
    schema: Option<&brokkr_blueprint::schema::ParameterSchema>,
    parameters: Option<&Map<String, Value>>,
) -> Result<(), ApiError> {
    let Some(schema) = schema else {
        return Ok(());
    };
    let value = Value::Object(parameters.cloned().unwrap_or_default());
    schema.validate(&value).map_err(|messages| {
        ApiError::bad_request(format!("invalid parameters: {}", messages.join("; ")))
    })
}

/// A new operation leased to this broker's engine.
pub(crate) fn new_operation(
    broker: &Broker,
    entry: Option<&PlanEntry>,
    kind: OpKind,
    plan: OpPlan,
    request: Value,
) -> Operation {
    let deadline = entry
        .and_then(|e| e.blueprint.deadline)
        .unwrap_or(DEFAULT_DEADLINE);
    let deadline_ms = i64::try_from(deadline.as_millis()).unwrap_or(i64::MAX);
    Operation::new(
        kind,
        plan,
        request,
        deadline_ms,
        broker.engine.owner(),
        broker.engine.lease_ms(),
    )
}

/// Runs a freshly started operation: inline for synchronous plans (returning the resource as it
/// ended), in the background otherwise.
pub(crate) async fn launch(
    broker: &Broker,
    key: &Key,
    op: &Operation,
) -> Result<Option<Resource>, ApiError> {
    if op.plan.steps.is_empty() {
        broker.engine.run_to_end(key.clone()).await;
        Ok(broker.engine.store().get(key).await?)
    } else {
        broker.engine.spawn(key.clone());
        Ok(None)
    }
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
    let mut probe = instance.clone();
    probe.key = Key::binding(&instance.key.instance_id, "probe");
    probe.attrs = json!({});
    probe.op.plan.credentials = Some(binding.credentials.clone());
    match broker.engine.credentials(instance, &probe) {
        Err(EvaluationError::Invalid(reason)) => Err(ApiError::bad_request(format!(
            "invalid parameters: {reason}"
        ))),
        // A template that needs binding parameters is judged at bind time.
        Ok(_) | Err(EvaluationError::Template(_)) => Ok(()),
    }
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
    let entry = plan_entry(&broker, &req.service_id, &req.plan_id)?;
    let entry = &*entry;
    check_maintenance_info(entry, req.maintenance_info.as_ref())?;
    validate_parameters(
        entry.instance_create_schema.as_ref(),
        req.parameters.as_ref(),
    )?;

    let key = Key::instance(&instance_id);
    let steps = entry.instance_steps(Phase::Provision);
    let op = new_operation(
        &broker,
        Some(entry),
        OpKind::Provision,
        OpPlan {
            steps,
            credentials: None,
        },
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
            if needs_async && !accepts_incomplete {
                return Err(ApiError::async_required());
            }
            match broker.engine.store().create(&resource).await? {
                Created::Inserted => {
                    info!(instance_id, operation = %resource.op.id, plan = %entry.plan.name, "provisioning");
                    return started(&broker, &resource, StatusCode::CREATED).await;
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
                    return started(&broker, &resource, StatusCode::CREATED).await;
                }
            }
        }
    }
    Err(ApiError::concurrency(format!(
        "instance {instance_id} is being changed by another request"
    )))
}

/// The answer to a synchronous request whose operation was halted by another.
pub(crate) fn superseded(now: &Resource) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        format!("the operation was halted by a {}", now.op.kind.as_str()),
    )
}

/// Waits for a running synchronous operation (one without steps: it ends within moments). A
/// request cannot wait for an asynchronous one: AsyncRequired.
pub(crate) async fn wait_sync(
    broker: &Broker,
    key: &Key,
    op: &Operation,
) -> Result<Option<Resource>, ApiError> {
    if !op.plan.steps.is_empty() {
        return Err(ApiError::async_required());
    }
    Ok(broker
        .engine
        .wait(key, &op.id, broker.sync_timeout())
        .await?)
}

/// The answer to a synchronous request whose operation failed.
pub(crate) fn operation_failed(done: Resource) -> ApiError {
    let kind = done.op.kind.as_str();
    let reason = done
        .op
        .description
        .unwrap_or_else(|| format!("{kind} failed"));
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, reason)
}

/// Reads what every mutating request carries: `accepts_incomplete` and a JSON body.
pub(crate) async fn read_mutation<T>(
    broker: &Broker,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Body,
    parse: fn(&[u8]) -> Result<T, brokkr_osb::messages::RequestError>,
) -> Result<(bool, T), ApiError> {
    let accepts_incomplete = Query::parse(query)?.accepts_incomplete()?;
    let bytes = read_json(headers, body, broker.max_body_bytes()).await?;
    let request = parse(&bytes).map_err(|e| ApiError::bad_request(e.0))?;
    Ok((accepts_incomplete, request))
}

/// Answers a request that just started `r.op`: 202 for asynchronous plans, or the final answer
/// of a synchronous one (`created` on success).
async fn started(broker: &Broker, r: &Resource, created: StatusCode) -> ApiResult {
    match launch(broker, &r.key, &r.op).await? {
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
    let steps = if context_only {
        Vec::new()
    } else {
        entry.instance_steps(Phase::Update)
    };
    if !steps.is_empty() && !accepts_incomplete {
        return Err(ApiError::async_required());
    }
    let op = new_operation(
        &broker,
        Some(entry),
        OpKind::Update,
        OpPlan {
            steps,
            credentials: None,
        },
        request,
    );
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
    started(&broker, &updated, StatusCode::OK).await
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
            true => entry
                .map(|e| e.instance_steps(Phase::Deprovision))
                .unwrap_or_default(),
            false => retry,
        };
        if !steps.is_empty() && !accepts_incomplete {
            return Err(ApiError::async_required());
        }
        let op = new_operation(
            &broker,
            entry.map(|e| e.as_ref()),
            OpKind::Deprovision,
            OpPlan {
                steps,
                credentials: None,
            },
            json!({}),
        );
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
            return started(&broker, &r, StatusCode::OK).await;
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
    poll_response(r, query.get("operation"), || {
        format!("instance {instance_id} does not exist")
    })
}

/// The `last_operation` answer for a resource: the operation the platform names if it is the one
/// just replaced, else the current one (an unknown `operation` id is not an error).
pub(crate) fn poll_response(
    r: Option<Resource>,
    operation: Option<&str>,
    missing: impl FnOnce() -> String,
) -> ApiResult {
    let r = r.ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, missing()))?;
    // A platform still polling the operation this one replaced gets that operation's outcome
    // (`failed` when it was halted).
    if let Some(prev) = r
        .previous
        .as_ref()
        .filter(|p| Some(p.id.as_str()) == operation)
    {
        let body = LastOperation {
            state: prev.state,
            description: prev.description.clone(),
            instance_usable: None,
            update_repeatable: None,
        };
        return Ok(json_response(StatusCode::OK, &body));
    }
    let op = &r.op;
    let failed_mutation = op.state == OperationState::Failed
        && matches!(op.kind, OpKind::Update | OpKind::Deprovision);
    let body = LastOperation {
        state: op.state,
        description: Some(
            op.description
                .clone()
                .unwrap_or_else(|| format!("{} in progress", op.kind.as_str())),
        ),
        instance_usable: (failed_mutation && r.key.binding_id.is_none())
            .then_some(r.status == Status::Ready),
        update_repeatable: (op.state == OperationState::Failed && op.kind == OpKind::Update)
            .then_some(true),
    };
    let mut response = json_response(StatusCode::OK, &body);
    if op.in_progress() {
        let wait_ms = (op.next_run_at - brokkr_engine::now_ms()).clamp(1000, 60_000);
        let secs = (wait_ms + 999) / 1000;
        response.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_str(&secs.to_string()).expect("digits are a valid header"),
        );
    }
    Ok(response)
}
