//! Instance endpoints: provision, update, deprovision, fetch and last_operation.

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use brokkr_blueprint::PlanEntry;
use brokkr_engine::{Attrs, EvaluationError, Key, OpKind, OpStep, Resource, Status};
use brokkr_osb::OperationState;
use brokkr_osb::messages::{
    InstanceOperationResponse, InstanceResource, ProvisionRequest, UpdateRequest,
};
use serde_json::json;
use tracing::info;

use crate::body::{Query, check_id};
use crate::broker::{AppState, Broker};
use crate::creation::{Creation, create};
use crate::error::ApiError;
use crate::operations::{
    Steps, accepted, launch, new_operation, operation_failed, poll_response, superseded, teardown,
    teardown_running,
};
use crate::request::{plan_entry, read_mutation, validate_parameters};
use crate::response::{ApiResult, json_response};
use crate::update::{Updated, check_maintenance_info, maintenance_version, start_update};

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

fn instance_attrs(req: &ProvisionRequest, entry: &PlanEntry) -> Attrs {
    // The instance is built at the plan's current maintenance version.
    let version = req
        .maintenance_info
        .as_ref()
        .or(entry.plan.maintenance_info.as_ref())
        .map(|m| m.version.clone());
    Attrs {
        parameters: req.parameters.clone(),
        context: req.context.clone(),
        organization_guid: req.organization_guid.clone(),
        space_guid: req.space_guid.clone(),
        maintenance_info: version.map(maintenance_version),
        ..Attrs::default()
    }
}

fn instance_body(r: &Resource) -> InstanceOperationResponse {
    InstanceOperationResponse {
        dashboard_url: r.dashboard_url.clone(),
        ..Default::default()
    }
}

/// The 202 answer for `r`'s operation: the operation, and the dashboard URL once known.
fn operation_body(r: &Resource) -> InstanceOperationResponse {
    InstanceOperationResponse {
        operation: Some(r.op.id.clone()),
        ..instance_body(r)
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
        .filter_map(OpStep::target)
        .find_map(|action| targets.cannot_make(&action.target, &action.templates));
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
        None,
    )?;
    let resource = Resource::new(
        key,
        &req.service_id,
        &req.plan_id,
        instance_attrs(&req, entry),
        op,
    );
    let creation = NewInstance {
        broker: &broker,
        entry,
    };
    create(&broker, &creation, resource, accepts_incomplete).await
}

/// How a provision creates its instance.
struct NewInstance<'a> {
    broker: &'a Broker,
    entry: &'a PlanEntry,
}

impl Creation for NewInstance<'_> {
    const NOUN: &'static str = "instance";

    fn prepare(&self, resource: &mut Resource) -> Result<(), ApiError> {
        let registry = &self.entry.blueprint.instance.registry;
        resource.outputs.registry = (self.broker.engine)
            .registry(registry, resource, None)
            .map_err(|e| ApiError::bad_request(format!("invalid parameters: {e}")))?;
        // Known now when it reads no value a step outputs; else learnt when those steps run.
        if let Some(expression) = &resource.op.plan.dashboard_url
            && let Some(url) = self.broker.engine.dashboard_url(expression, resource)
        {
            let url = url.map_err(|e| ApiError::bad_request(format!("invalid parameters: {e}")))?;
            resource.dashboard_url = Some(url);
        }
        check_credentials_possible(self.broker, self.entry, resource)?;
        check_programs(self.broker, resource)
    }

    fn in_progress(&self, r: &Resource) -> Response {
        json_response(StatusCode::ACCEPTED, &operation_body(r))
    }

    fn ready(&self, r: &Resource) -> Response {
        json_response(StatusCode::OK, &instance_body(r))
    }

    async fn started(&self, r: &Resource) -> ApiResult {
        started(self.broker, r, StatusCode::CREATED).await
    }
}

/// Answers a request that just started `r.op`: 202 for asynchronous plans, or the final answer
/// of a synchronous one (`created` on success).
async fn started(broker: &Broker, r: &Resource, created: StatusCode) -> ApiResult {
    match launch(broker, r).await? {
        None => Ok(json_response(StatusCode::ACCEPTED, &operation_body(r))),
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
    match start_update(&broker, &instance_id, &req, accepts_incomplete).await? {
        Updated::Unchanged(r) => Ok(json_response(StatusCode::OK, &instance_body(&r))),
        Updated::Running(op) => Ok(accepted(&op)),
        Updated::Started(r) => started(&broker, &r, StatusCode::OK).await,
    }
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
                OpKind::Deprovision => {
                    let busy = format!("instance {instance_id} is being deprovisioned");
                    let op = &current.op;
                    return teardown_running(&broker, &key, op, accepts_incomplete, busy).await;
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
        let kind = OpKind::Deprovision;
        let (op, status) = teardown(&broker, &current, kind, retry, accepts_incomplete)?;
        let store = broker.engine.store();
        if let Some(r) = store.start(&key, &current.op.id, &op, status).await? {
            info!(instance_id, operation = %op.id, "deprovisioning");
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
    let maintenance_info = r.attrs.maintenance_info.clone();
    let body = InstanceResource {
        service_id: r.service_id.clone(),
        plan_id: r.plan_id.clone(),
        dashboard_url: r.dashboard_url.clone(),
        parameters: r.attrs.parameters.clone(),
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
        .get_status(&Key::instance(&instance_id), query.get("operation"))
        .await?;
    let targets = broker.engine.targets();
    let usable = targets.instance_usable(&instance_id);
    let problem = (usable == Some(false))
        .then(|| targets.instance_problem(&instance_id))
        .flatten();
    poll_response(r, query.get("operation"), usable, problem, || {
        format!("instance {instance_id} does not exist")
    })
}
