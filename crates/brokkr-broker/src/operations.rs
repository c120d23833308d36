//! Operations as the instance and binding endpoints start and follow them: the plan a new
//! operation runs ([`op_plan`]), the operation itself, running it inline or in the background,
//! waiting for a synchronous one, and what its progress and outcome answer (202,
//! `last_operation`, errors).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use brokkr_blueprint::PlanEntry;
use brokkr_engine::store::NewStatus;
use brokkr_engine::{Key, OpKind, OpPlan, OpStep, Operation, PlanError, Resource, Status, Update};
use brokkr_osb::OperationState;
use brokkr_osb::messages::{AsyncResponse, LastOperation};

use crate::broker::{Broker, DEFAULT_DEADLINE};
use crate::error::ApiError;
use crate::response::{ApiResult, json_response};

/// Which steps a new operation runs.
pub(crate) enum Steps {
    /// Those its plan's blueprint gives its kind.
    Configured,
    /// Those of an update that moves an instance to a new maintenance version: the update's
    /// and those `on: [upgrade]`.
    Upgrade,
    /// Only these: the steps a finished deprovision or unbind left behind, when it is repeated.
    LeftBehind(Vec<OpStep>),
    /// None: an update that only records a new context.
    Nothing,
}

/// The plan of a new operation of `kind` on a resource of plan `entry`: the steps `steps`
/// chooses, in order, and for a bind the credentials template (see [`OpPlan::configured`]).
pub(crate) fn op_plan(
    entry: Option<&PlanEntry>,
    kind: OpKind,
    steps: Steps,
) -> Result<OpPlan, PlanError> {
    match steps {
        Steps::Configured => OpPlan::configured(entry, kind),
        Steps::Upgrade => OpPlan::configured(entry, OpKind::Upgrade),
        Steps::LeftBehind(steps) => Ok(OpPlan::with_steps(entry, kind, steps)),
        Steps::Nothing => Ok(OpPlan::with_steps(entry, kind, Vec::new())),
    }
}

/// A new operation of `kind` leased to this broker's engine, running the plan [`op_plan`] gives
/// it, within `entry`'s deadline; for an update, the change it makes.
pub(crate) fn new_operation(
    broker: &Broker,
    entry: Option<&PlanEntry>,
    kind: OpKind,
    steps: Steps,
    update: Option<Update>,
) -> Result<Operation, ApiError> {
    let deadline = entry
        .and_then(|e| e.blueprint.deadline)
        .unwrap_or(DEFAULT_DEADLINE);
    let deadline_ms = i64::try_from(deadline.as_millis()).unwrap_or(i64::MAX);
    // Loading refuses a step without an action: this is a broker's own mistake.
    let plan = op_plan(entry, kind, steps)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(Operation::new(
        kind,
        plan,
        update,
        deadline_ms,
        broker.engine.owner(),
        broker.engine.lease_ms(),
    ))
}

/// A new deprovision or unbind of `current` (`kind`): the steps its plan gives, or only
/// `retry`, those an earlier one left behind; refused when it has steps and the platform does
/// not accept asynchronous operations. With the status it starts with: one that comes during
/// the provision or bind halts it and removes what it made.
pub(crate) fn teardown(
    broker: &Broker,
    current: &Resource,
    kind: OpKind,
    retry: Vec<OpStep>,
    accepts_incomplete: bool,
) -> Result<(Operation, NewStatus), ApiError> {
    let config = broker.config();
    let entry = config.plan(&current.service_id, &current.plan_id);
    let steps = match retry.is_empty() {
        true => Steps::Configured,
        false => Steps::LeftBehind(retry),
    };
    let op = new_operation(broker, entry.map(|e| e.as_ref()), kind, steps, None)?;
    if !op.plan.steps.is_empty() && !accepts_incomplete {
        return Err(ApiError::async_required());
    }
    let status = match current.status {
        Status::Deleted => NewStatus::Set(Status::Deleted),
        _ => NewStatus::HaltCreation,
    };
    Ok((op, status))
}

/// The answer to a deprovision or unbind repeated while the first one, `op`, runs: its
/// operation to poll, or for a synchronous request its end (`busy` if it ends otherwise).
pub(crate) async fn teardown_running(
    broker: &Broker,
    key: &Key,
    op: &Operation,
    accepts_incomplete: bool,
    busy: String,
) -> ApiResult {
    if accepts_incomplete {
        return Ok(accepted(op));
    }
    match wait_sync(broker, key, op).await? {
        Some(r) if r.status != Status::Deleted => Err(ApiError::concurrency(busy)),
        _ => Ok(json_response(StatusCode::OK, &serde_json::json!({}))),
    }
}

/// Runs the operation `r.op` a request has just committed, `r` being its row as committed:
/// inline for synchronous plans (returning the resource as it ended), in the background
/// otherwise, from `r` itself without reading it back.
pub(crate) async fn launch(broker: &Broker, r: &Resource) -> Result<Option<Resource>, ApiError> {
    let key = &r.key;
    if r.op.plan.steps.is_empty() {
        broker.engine.run_to_end(key.clone()).await;
        Ok(broker.engine.store().get(key).await?)
    } else {
        broker.engine.spawn_new(r.clone());
        Ok(None)
    }
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

/// 202 Accepted with the operation to poll.
pub(crate) fn accepted(op: &Operation) -> Response {
    json_response(
        StatusCode::ACCEPTED,
        &AsyncResponse {
            operation: Some(op.id.clone()),
        },
    )
}

/// The answer to a synchronous request whose operation was halted by another.
pub(crate) fn superseded(now: &Resource) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        format!("the operation was halted by a {}", now.op.kind.as_str()),
    )
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

/// The `last_operation` answer for a resource: the operation the platform names if it is the one
/// just replaced, else the current one (an unknown `operation` id is not an error). `usable`,
/// when a target knows (a server brokkr runs is down), is the answer's `instance_usable`;
/// `problem`, why it stays down when a target gave up on it, ends a succeeded operation's
/// description.
pub(crate) fn poll_response(
    r: Option<Resource>,
    operation: Option<&str>,
    usable: Option<bool>,
    problem: Option<String>,
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
            instance_usable: usable,
            update_repeatable: None,
        };
        return Ok(json_response(StatusCode::OK, &body));
    }
    let op = &r.op;
    let failed_mutation = op.state == OperationState::Failed
        && matches!(op.kind, OpKind::Update | OpKind::Deprovision);
    let mut description =
        (op.description.clone()).unwrap_or_else(|| format!("{} in progress", op.kind.as_str()));
    // A succeeded operation's resources that went down for good since: the description says why.
    if let Some(problem) = problem.filter(|_| op.state == OperationState::Succeeded) {
        description = format!("{description}; not usable since: {problem}");
    }
    // OSB: `instance_usable` MUST NOT be present for errors of operations other than update and
    // deprovision (a failed provision has no instance to use).
    let failed_provision = op.state == OperationState::Failed && op.kind == OpKind::Provision;
    let body = LastOperation {
        state: op.state,
        description: Some(description),
        instance_usable: usable
            .or_else(|| {
                (failed_mutation && r.key.binding_id.is_none()).then_some(r.status == Status::Ready)
            })
            .filter(|_| !failed_provision),
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

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
catalog:
  services:
  - name: s
    id: svc
    description: d
    bindable: true
    plans:
    - {name: p, id: plan, description: d}
blueprints:
- service: s
  plan: p
  instance:
    steps:
    - {name: create, delay: 1s, on: [provision]}
    - {name: change, delay: 1s, on: [update]}
    - {name: migrate, delay: 1s, on: [upgrade]}
    - {name: first, delay: 1s, on: [deprovision]}
    - {name: second, delay: 1s, on: [deprovision]}
  binding:
    steps:
    - {name: grant, delay: 1s, on: [bind]}
    - {name: revoke, delay: 1s, on: [unbind]}
    credentials: {type: "{{ instance.parameters.type }}"}
"#;

    fn names(plan: &OpPlan) -> Vec<&str> {
        plan.steps.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn op_plan_gives_each_kind_its_steps_and_binds_their_credentials() {
        let config = brokkr_blueprint::load::load_str("test.yaml", CONFIG).unwrap();
        let entry = config.plan("svc", "plan").map(|e| e.as_ref());
        let configured = |kind| op_plan(entry, kind, Steps::Configured).unwrap();
        assert_eq!(names(&configured(OpKind::Provision)), ["create"]);
        assert_eq!(names(&configured(OpKind::Update)), ["change"]);
        // An upgrade, an update to a new maintenance version, also runs its own steps.
        let upgrade = op_plan(entry, OpKind::Update, Steps::Upgrade).unwrap();
        assert_eq!(names(&upgrade), ["change", "migrate"]);
        assert_eq!(names(&configured(OpKind::Deprovision)), ["second", "first"]);
        assert_eq!(names(&configured(OpKind::Bind)), ["grant"]);
        assert_eq!(names(&configured(OpKind::Unbind)), ["revoke"]);
        let template = &entry
            .unwrap()
            .blueprint
            .binding
            .as_ref()
            .unwrap()
            .credentials;
        assert_eq!(
            configured(OpKind::Bind).credentials.as_ref(),
            Some(template)
        );
        for kind in [
            OpKind::Provision,
            OpKind::Update,
            OpKind::Deprovision,
            OpKind::Unbind,
        ] {
            assert_eq!(configured(kind).credentials, None, "{kind:?}");
        }

        let left = configured(OpKind::Deprovision).steps[1..].to_vec();
        let retry = op_plan(entry, OpKind::Deprovision, Steps::LeftBehind(left)).unwrap();
        assert_eq!(names(&retry), ["first"]);
        assert_eq!(
            op_plan(entry, OpKind::Update, Steps::Nothing).unwrap(),
            OpPlan::default()
        );
        // A plan no longer configured runs nothing.
        assert_eq!(
            op_plan(None, OpKind::Unbind, Steps::Configured).unwrap(),
            OpPlan::default()
        );
    }
}
