//! Creating an instance or a binding: the flow a provision and a bind share.
//!
//! A new resource is prepared (its registry computed, what could never work refused) and created
//! with its first operation. Most requests create, so a request that could tries that first, and
//! reads the resource only when it exists. A request repeated while the resource exists is
//! answered from it: the running operation (or, for a synchronous request, its end), the resource
//! itself once ready, or a new attempt after a failed one — which keeps the attributes and
//! registry the resource was created with. A request whose attributes differ (context aside) is
//! a conflict. A race lost to another request is decided against the winner, up to three times.

use axum::http::StatusCode;
use axum::response::Response;
use brokkr_engine::store::{Created, NewStatus};
use brokkr_engine::{Resource, Status};
use tracing::info;

use crate::broker::Broker;
use crate::error::ApiError;
use crate::operations::{accepted, wait_sync};
use crate::response::ApiResult;

/// What a provision and a bind do their own way.
pub(crate) trait Creation {
    /// What is created, for messages: `instance`, `binding`.
    const NOUN: &'static str;

    /// Refuses to create (or create again) now: a bind while its instance is not ready.
    fn check_now(&self) -> Result<(), ApiError> {
        Ok(())
    }

    /// Prepares a new resource: computes its registry and refuses what could never work.
    fn prepare(&self, resource: &mut Resource) -> Result<(), ApiError>;

    /// The answer to a repeated request while the resource's creation runs: 202 with its
    /// operation.
    fn in_progress(&self, r: &Resource) -> Response {
        accepted(&r.op)
    }

    /// The answer for the resource, which exists and is ready.
    fn ready(&self, r: &Resource) -> Response;

    /// Answers a request that just started `r`'s operation; `r` is its row as written.
    async fn started(&self, r: &Resource) -> ApiResult;
}

/// Creates `resource` with its first operation, or answers from the one that exists (see the
/// module's documentation).
pub(crate) async fn create<C: Creation>(
    broker: &Broker,
    creation: &C,
    mut resource: Resource,
    accepts_incomplete: bool,
) -> ApiResult {
    let key = resource.key.clone();
    let id = key.binding_id.as_deref().unwrap_or(&key.instance_id);
    let what = format!("{} {id}", C::NOUN);
    let store = broker.engine.store();
    let needs_async = !resource.op.plan.steps.is_empty();
    let log = |r: &Resource, message: &str| {
        let (op, binding_id) = (&r.op, key.binding_id.as_deref());
        info!(instance_id = %key.instance_id, binding_id, operation = %op.id,
            kind = op.kind.as_str(), plan = %r.plan_id, "{message}");
    };
    for attempt in 0..3 {
        // Most requests create: the first attempt of one that could tries that at once, and
        // has the resource read only if it exists.
        let first_try = attempt == 0
            && creation.check_now().is_ok()
            && (accepts_incomplete || !needs_async)
            && creation.prepare(&mut resource).is_ok();
        let read = match first_try {
            true => None,
            false => store.get(&key).await?,
        };
        let existing = match read.filter(|r| r.status != Status::Deleted) {
            Some(existing) => existing,
            None => {
                if !first_try {
                    creation.check_now()?;
                    // Computed only for a new resource: a repeat keeps the values it was
                    // created with.
                    creation.prepare(&mut resource)?;
                    if needs_async && !accepts_incomplete {
                        return Err(ApiError::async_required());
                    }
                }
                match store.create(&resource).await? {
                    Created::Inserted => {
                        log(&resource, "creating");
                        return creation.started(&resource).await;
                    }
                    // It exists, or another request won the race: decided against it.
                    Created::Exists(existing) => *existing,
                }
            }
        };
        if existing.attrs.identity() != resource.attrs.identity()
            || existing.service_id != resource.service_id
            || existing.plan_id != resource.plan_id
        {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("{what} already exists with different attributes"),
            ));
        }
        let op = &existing.op;
        if op.in_progress() && op.kind != resource.op.kind {
            return Err(ApiError::concurrency(format!(
                "{what} is busy: its {} is in progress",
                op.kind.as_str()
            )));
        }
        match existing.status {
            Status::Creating if op.in_progress() => {
                if accepts_incomplete {
                    return Ok(creation.in_progress(&existing));
                }
                return match wait_sync(broker, &key, op).await? {
                    Some(r) if r.status == Status::Ready => Ok(creation.ready(&r)),
                    _ => Err(ApiError::concurrency(format!("{what} is being created"))),
                };
            }
            Status::Ready => return Ok(creation.ready(&existing)),
            Status::Creating | Status::Failed | Status::Deleted => {
                // A failed creation with the same attributes: try again. The resource keeps its
                // attributes and registry; only the operation is new.
                creation.check_now()?;
                if needs_async && !accepts_incomplete {
                    return Err(ApiError::async_required());
                }
                let again = NewStatus::Set(Status::Creating);
                if let Some(r) = store.start(&key, &op.id, &resource.op, again).await? {
                    log(&r, "creating again after a failure");
                    return creation.started(&r).await;
                }
            }
        }
    }
    Err(ApiError::concurrency(format!(
        "{what} is being changed by another request"
    )))
}
