//! Binding endpoints: bind, unbind, fetch and last_operation. A bind may rotate a predecessor
//! binding of the same instance (OSB `predecessor_binding_id`); a binding whose plan gives its
//! credentials a lifetime answers `expires_at` and `renew_before` as binding metadata.

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use brokkr_blueprint::PlanEntry;
use brokkr_blueprint::config::BindingBlueprint;
use brokkr_engine::{Attrs, Key, OpKind, Resource, Status};
use brokkr_osb::OperationState;
use brokkr_osb::messages::{BindRequest, BindingResource};
use serde_json::{Map, Value, json};
use time::OffsetDateTime;
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

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/v2/service_instances/{instance_id}/service_bindings/{binding_id}",
            get(fetch).put(bind).delete(unbind),
        )
        .route(
            "/v2/service_instances/{instance_id}/service_bindings/{binding_id}/last_operation",
            get(last_operation),
        )
}

fn check_ids(instance_id: &str, binding_id: &str) -> Result<(), ApiError> {
    check_id("instance_id", instance_id)?;
    check_id("binding_id", binding_id)
}

fn binding_attrs(req: &BindRequest, parameters: Option<Map<String, Value>>) -> Attrs {
    Attrs {
        parameters,
        context: req.context.clone(),
        app_guid: req.app_guid.clone(),
        bind_resource: req.bind_resource.clone(),
        predecessor_binding_id: req.predecessor_binding_id.clone(),
        ..Attrs::default()
    }
}

fn binding_body(r: &Resource, with_parameters: bool) -> BindingResource {
    BindingResource {
        metadata: binding_metadata(r),
        credentials: r.outputs.credentials.clone(),
        parameters: with_parameters
            .then(|| r.attrs.parameters.clone())
            .flatten(),
        ..Default::default()
    }
}

/// OSB binding metadata: when the credentials expire and when to renew them, if they do.
fn binding_metadata(r: &Resource) -> Option<Value> {
    let mut metadata = Map::new();
    for (name, at) in [
        ("expires_at", r.outputs.expires_at),
        ("renew_before", r.outputs.renew_before),
    ] {
        if let Some(at) = at {
            metadata.insert(name.to_owned(), Value::String(osb_timestamp(at)));
        }
    }
    (!metadata.is_empty()).then_some(Value::Object(metadata))
}

/// `unix_ms` in the form OSB gives binding metadata, `yyyy-mm-ddThh:mm:ss.sZ` in UTC (tenths
/// of a second, cut rather than rounded: never later than the instant itself).
pub(crate) fn osb_timestamp(unix_ms: i64) -> String {
    let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(unix_ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
        at.millisecond() / 100
    )
}

async fn bind(
    State(broker): State<AppState>,
    Path((instance_id, binding_id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    check_ids(&instance_id, &binding_id)?;
    let (accepts_incomplete, req) = read_mutation(
        &broker,
        query.as_deref(),
        &headers,
        body,
        BindRequest::from_slice,
    )
    .await?;
    let store = broker.engine.store();
    let Some(instance) = store
        .get(&Key::instance(&instance_id))
        .await?
        .filter(|r| r.status != Status::Deleted)
    else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("instance {instance_id} does not exist"),
        ));
    };
    if req.service_id != instance.service_id || req.plan_id != instance.plan_id {
        return Err(ApiError::bad_request(format!(
            "instance {instance_id} has service_id {:?} and plan_id {:?}",
            instance.service_id, instance.plan_id
        )));
    }
    let entry = plan_entry(&broker, &req.service_id, &req.plan_id)?;
    let entry = &*entry;
    let Some(blueprint) = entry
        .blueprint
        .binding
        .as_ref()
        .filter(|_| entry.bindable())
    else {
        return Err(ApiError::bad_request(format!(
            "plan {:?} is not bindable",
            entry.plan.name
        )));
    };
    validate_parameters(
        entry.binding_create_schema.as_ref(),
        req.parameters.as_ref(),
    )?;
    let key = Key::binding(&instance_id, &binding_id);
    let parameters = match &req.predecessor_binding_id {
        None => req.parameters.clone(),
        Some(predecessor) => {
            let parameters = successor_parameters(&broker, entry, &req, &key, predecessor).await?;
            // The predecessor's parameters were checked against the plan it was bound under.
            validate_parameters(entry.binding_create_schema.as_ref(), parameters.as_ref())?;
            parameters
        }
    };
    let op = new_operation(&broker, Some(entry), OpKind::Bind, Steps::Configured, None)?;
    let resource = Resource::new(
        key,
        &req.service_id,
        &req.plan_id,
        binding_attrs(&req, parameters),
        op,
    );
    let creation = NewBinding {
        broker: &broker,
        blueprint,
        instance: &instance,
    };
    create(&broker, &creation, resource, accepts_incomplete).await
}

/// The parameters of the bind `req` of binding `key`, which rotates `predecessor`: the
/// request's, or else the predecessor's. The predecessor must be a binding of the same instance
/// that is bound, not being unbound and not expired, of a plan whose bindings rotate; a bind
/// that breaks one of these is refused with 400 and changes nothing. A repeated request for a
/// successor that exists is answered from it, even once its predecessor is gone.
async fn successor_parameters(
    broker: &Broker,
    entry: &PlanEntry,
    req: &BindRequest,
    key: &Key,
    predecessor: &str,
) -> Result<Option<Map<String, Value>>, ApiError> {
    let store = broker.engine.store();
    let existing = store.get(key).await?.filter(|b| {
        b.status != Status::Deleted
            && b.attrs.predecessor_binding_id.as_deref() == Some(predecessor)
    });
    if let Some(existing) = existing {
        return Ok(req.parameters.clone().or(existing.attrs.parameters));
    }
    let instance_id = &key.instance_id;
    if entry.plan.binding_rotatable != Some(true) {
        return Err(ApiError::bad_request(format!(
            "bindings of plan {:?} cannot be rotated: the plan is not binding_rotatable",
            entry.plan.name
        )));
    }
    if key.binding_id.as_deref() == Some(predecessor) {
        return Err(ApiError::bad_request(format!(
            "binding {predecessor} cannot be its own predecessor"
        )));
    }
    let old = store
        .get(&Key::binding(instance_id, predecessor))
        .await?
        .filter(|b| b.status != Status::Deleted);
    let Some(old) = old else {
        return Err(ApiError::bad_request(format!(
            "predecessor binding {predecessor} does not exist for instance {instance_id}"
        )));
    };
    if old.status != Status::Ready {
        return Err(ApiError::bad_request(format!(
            "predecessor binding {predecessor} is not bound: its bind {}",
            if old.op.in_progress() {
                "is in progress"
            } else {
                "failed"
            }
        )));
    }
    if old.op.in_progress() && old.op.kind == OpKind::Unbind {
        return Err(ApiError::bad_request(format!(
            "predecessor binding {predecessor} is being unbound"
        )));
    }
    if let Some(expires_at) = old.outputs.expires_at
        && expires_at <= brokkr_engine::now_ms()
    {
        return Err(ApiError::bad_request(format!(
            "predecessor binding {predecessor} expired at {}",
            osb_timestamp(expires_at)
        )));
    }
    Ok(req.parameters.clone().or(old.attrs.parameters))
}

/// How a bind creates its binding, of `instance`.
struct NewBinding<'a> {
    broker: &'a Broker,
    blueprint: &'a BindingBlueprint,
    instance: &'a Resource,
}

impl Creation for NewBinding<'_> {
    const NOUN: &'static str = "binding";

    fn check_now(&self) -> Result<(), ApiError> {
        let instance = self.instance;
        if instance.status != Status::Ready || instance.op.in_progress() {
            return Err(instance_busy(instance));
        }
        Ok(())
    }

    fn prepare(&self, resource: &mut Resource) -> Result<(), ApiError> {
        let engine = &self.broker.engine;
        let registry = &self.blueprint.registry;
        resource.outputs.registry = engine
            .registry(registry, resource, Some(self.instance))
            .map_err(|e| ApiError::bad_request(format!("invalid parameters: {e}")))?;
        // Credentials that could never be valid are a bad request, refused before any change.
        engine
            .credentials(self.instance, resource)
            .map_err(|reason| ApiError::bad_request(format!("invalid parameters: {reason}")))?;
        Ok(())
    }

    fn ready(&self, r: &Resource) -> Response {
        json_response(StatusCode::OK, &binding_body(r, false))
    }

    async fn started(&self, r: &Resource) -> ApiResult {
        started(self.broker, r).await
    }
}

fn instance_busy(instance: &Resource) -> ApiError {
    let id = &instance.key.instance_id;
    if instance.op.in_progress() {
        ApiError::concurrency(format!(
            "a {} of instance {id} is in progress",
            instance.op.kind.as_str()
        ))
    } else {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("instance {id} is not usable: its provision failed"),
        )
    }
}

async fn started(broker: &Broker, r: &Resource) -> ApiResult {
    match launch(broker, r).await? {
        None => Ok(accepted(&r.op)),
        Some(done) if done.op.id != r.op.id => Err(superseded(&done)),
        Some(done) if done.op.state == OperationState::Succeeded => match r.op.kind {
            OpKind::Bind => Ok(json_response(
                StatusCode::CREATED,
                &binding_body(&done, false),
            )),
            _ => Ok(json_response(StatusCode::OK, &json!({}))),
        },
        Some(done) => Err(operation_failed(done)),
    }
}

async fn unbind(
    State(broker): State<AppState>,
    Path((instance_id, binding_id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    check_ids(&instance_id, &binding_id)?;
    let query = Query::parse(query.as_deref())?;
    let accepts_incomplete = query.accepts_incomplete()?;
    let service_id = query.required("service_id")?;
    let plan_id = query.required("plan_id")?;
    let key = Key::binding(&instance_id, &binding_id);
    let instance_key = Key::instance(&instance_id);
    let store = broker.engine.store();
    for _ in 0..3 {
        // Read together (on PostgreSQL, at the same time rather than one after the other). Of
        // the instance only its status and plan are asked: the writer's view has them without a
        // read.
        let (current, instance) =
            tokio::try_join!(store.get(&key), store.get_status(&instance_key, None))?;
        let Some(current) = current else {
            return Ok(json_response(StatusCode::GONE, &json!({})));
        };
        // An unbind that skipped steps may be repeated, while its instance lives: it tries
        // those steps again.
        let finished = current.status == Status::Deleted && !current.op.in_progress();
        let instance_lives = instance
            .as_ref()
            .is_some_and(|i| i.status != Status::Deleted);
        let retry = if finished && instance_lives {
            broker.engine.steps_left_behind(&current).await?
        } else {
            Vec::new()
        };
        if finished && retry.is_empty() {
            return Ok(json_response(StatusCode::GONE, &json!({})));
        }
        // Platforms send the instance's current plan, which an update may have changed.
        let instance_plan = instance.map(|i| i.plan_id);
        if service_id != current.service_id
            || (plan_id != current.plan_id && Some(plan_id) != instance_plan.as_deref())
        {
            return Err(ApiError::bad_request(format!(
                "binding {binding_id} has service_id {:?} and plan_id {:?}",
                current.service_id, current.plan_id
            )));
        }
        if current.op.in_progress() && current.op.kind == OpKind::Unbind {
            let busy = format!("binding {binding_id} is being unbound");
            return teardown_running(&broker, &key, &current.op, accepts_incomplete, busy).await;
        }
        let (op, status) = teardown(&broker, &current, OpKind::Unbind, retry, accepts_incomplete)?;
        if let Some(r) = store.start(&key, &current.op.id, &op, status).await? {
            info!(instance_id, binding_id, operation = %op.id, "unbinding");
            return started(&broker, &r).await;
        }
    }
    Err(ApiError::concurrency(format!(
        "binding {binding_id} is being changed by another request"
    )))
}

async fn fetch(
    State(broker): State<AppState>,
    Path((instance_id, binding_id)): Path<(String, String)>,
) -> ApiResult {
    check_ids(&instance_id, &binding_id)?;
    let r = broker
        .engine
        .store()
        .get(&Key::binding(&instance_id, &binding_id))
        .await?
        .filter(|r| r.status == Status::Ready)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("binding {binding_id} does not exist"),
            )
        })?;
    let retrievable = broker
        .config()
        .catalog
        .service(&r.service_id)
        .is_none_or(|s| s.bindings_retrievable.unwrap_or(false));
    if !retrievable {
        return Err(ApiError::bad_request(
            "bindings of this service are not retrievable",
        ));
    }
    Ok(json_response(StatusCode::OK, &binding_body(&r, true)))
}

async fn last_operation(
    State(broker): State<AppState>,
    Path((instance_id, binding_id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> ApiResult {
    check_ids(&instance_id, &binding_id)?;
    let query = Query::parse(query.as_deref())?;
    let r = broker
        .engine
        .store()
        .get_status(
            &Key::binding(&instance_id, &binding_id),
            query.get("operation"),
        )
        .await?;
    poll_response(r, query.get("operation"), None, None, || {
        format!("binding {binding_id} does not exist")
    })
}

#[cfg(test)]
mod tests {
    use super::osb_timestamp;

    #[test]
    fn timestamps_take_the_form_osb_gives_binding_metadata() {
        assert_eq!(osb_timestamp(1_577_836_799_000), "2019-12-31T23:59:59.0Z");
        assert_eq!(osb_timestamp(1_577_836_799_999), "2019-12-31T23:59:59.9Z");
        assert_eq!(osb_timestamp(951_782_400_050), "2000-02-29T00:00:00.0Z");
    }
}
