//! Polling the bind or unbind in progress until it ends or outlives the plan's maximum polling
//! duration; a finished bind's credentials are then fetched.

use std::time::Duration;

use crate::runner::Action;
use brokkr_osb::client::Poll;
use brokkr_osb::messages::OperationState;

use super::state::{Expiry, RECHECK, Reconcile};
use crate::error::Error;
use crate::identity::instance_id;
use crate::platform::{elapsed_since, humanize, may_have_created, poll_pause};
use crate::resolve::Resolved;
use crate::resources::{ConditionStatus, ServiceBindingOperation, ServiceInstance, UnbindStatus};

impl Reconcile<'_> {
    /// Polls the bind or unbind the broker has just accepted without a `Retry-After`: asked at
    /// once, it says how the operation is going (or that it is done), and one status write serves
    /// for both — none while a young operation's start is held. `None` when that poll failed:
    /// the status is as it was before it, for the caller to write the start alone.
    pub(super) async fn poll_at_once(
        &mut self,
        instance: &ServiceInstance,
        resolved: &Resolved,
    ) -> Option<Action> {
        let started = self.status.clone();
        match self.poll(instance, resolved).await {
            Ok(action) => Some(action),
            Err(e) => {
                tracing::debug!(error = %e, "the first poll of an operation");
                self.status = started;
                None
            }
        }
    }

    /// Polls the bind or unbind in progress.
    pub(super) async fn poll(
        &mut self,
        instance: &ServiceInstance,
        resolved: &Resolved,
    ) -> Result<Action, Error> {
        let unbinding = self.status.current_operation == Some(ServiceBindingOperation::Unbind);
        let mut poll = Poll::binding(instance_id(instance), self.current_id())
            .operation(self.status.last_operation.clone())
            .plan(resolved.plan_ref());
        if unbinding {
            poll = poll.deleting();
        }
        let answer = resolved.osb.last_operation(&poll).await;
        self.ctx.metrics.osb_call("last_operation", &answer);
        let (state, description, retry_after) = match answer {
            Ok(response) => (
                response.body.state,
                response.body.description,
                response.retry_after,
            ),
            Err(e) if unbinding && e.status().is_some_and(|s| s.as_u16() == 410) => {
                (OperationState::Succeeded, None, None)
            }
            Err(e) => return Err(e.into()),
        };
        let verb = if unbinding { "Unbind" } else { "Bind" };
        match state {
            OperationState::InProgress => {
                let elapsed = elapsed_since(self.status.operation_start_time.as_ref());
                if elapsed > resolved.max_polling() {
                    let message = format!(
                        "the broker did not finish the {} within {}",
                        verb.to_lowercase(),
                        humanize(resolved.max_polling())
                    );
                    if unbinding {
                        self.end_operation();
                        self.status.unbind_status = Some(UnbindStatus::Failed);
                        self.set("Ready", ConditionStatus::False, "UnbindTimedOut", message);
                        self.write_status().await?;
                        return Ok(Action::requeue(RECHECK));
                    }
                    return self.start_orphan_mitigation(message).await;
                }
                let description = description.unwrap_or_else(|| format!("{verb} in progress"));
                self.set(
                    "Ready",
                    ConditionStatus::False,
                    &format!("{verb}ing"),
                    description,
                );
                let written = self
                    .binding
                    .status
                    .as_ref()
                    .is_some_and(|s| s.async_op_in_progress);
                // Young, its start is written only if it lasts (most end before).
                let held =
                    self.ctx
                        .held_bindings
                        .hold_start(self.binding, written, elapsed, &self.status);
                if !held {
                    self.write_status().await?;
                }
                Ok(Action::requeue(poll_pause(retry_after, elapsed)))
            }
            OperationState::Succeeded if unbinding => self.unbound().await,
            OperationState::Succeeded if self.binding.metadata.deletion_timestamp.is_some() => {
                // Bound while being deleted: the credentials are not needed; unbind next.
                self.end_operation();
                self.status.unbind_status = Some(UnbindStatus::Required);
                self.write_status().await?;
                Ok(Action::requeue(Duration::from_secs(1)))
            }
            OperationState::Succeeded => {
                let fetched = resolved
                    .osb
                    .binding(
                        &instance_id(instance),
                        &self.current_id(),
                        Some(&resolved.plan_ref()),
                    )
                    .await;
                self.ctx.metrics.osb_call("fetch_binding", &fetched);
                match fetched {
                    Ok(response) => {
                        let expiry = Expiry::of(response.body.metadata.as_ref());
                        let credentials = response.body.credentials.unwrap_or_default();
                        self.publish(instance, resolved, credentials, expiry).await
                    }
                    Err(e) if may_have_created(&e) => {
                        let said = resolved.said(&e);
                        self.start_orphan_mitigation(format!("fetching the binding failed: {said}"))
                            .await
                    }
                    Err(e) => Err(e.into()),
                }
            }
            OperationState::Failed => {
                let message = format!(
                    "{verb} failed: {}",
                    description.unwrap_or_else(|| "the broker gave no reason".into())
                );
                if unbinding {
                    self.end_operation();
                    self.status.unbind_status = Some(UnbindStatus::Failed);
                    self.set("Ready", ConditionStatus::False, "UnbindCallFailed", message);
                    self.write_status().await?;
                    return Ok(Action::requeue(RECHECK));
                }
                self.status.unbind_status = Some(UnbindStatus::NotRequired);
                self.fail("BindCallFailed", message).await
            }
        }
    }
}
