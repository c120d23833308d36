//! Retiring a binding at the broker that is no longer current: a rotation's predecessor once
//! its grace period ended, a failed successor, and each binding a deleted ServiceBinding had.

use std::time::Duration;

use crate::runner::Action;
use brokkr_osb::client::Poll;
use brokkr_osb::messages::OperationState;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;

use super::rotate::CONDITION;
use super::secret;
use super::state::{RECHECK, Reconcile, Slot};
use crate::error::Error;
use crate::identity::instance_id;
use crate::platform::{elapsed_since, poll_pause};
use crate::resolve::Resolved;
use crate::resources::{
    ConditionStatus, RotatingBinding, ServiceBindingOperation, ServiceInstance,
};

impl Reconcile<'_> {
    /// Unbinds the binding in `status.previousBinding`, its grace period over.
    pub(super) async fn retire_previous(&mut self) -> Result<Action, Error> {
        let Some((instance, resolved)) = self.bound_broker().await? else {
            return Ok(Action::requeue(RECHECK));
        };
        let retiring = self.status.previous_binding.clone().unwrap_or_default();
        if let Some(action) = self
            .unbind_slot(Slot::Previous, &instance, &resolved)
            .await?
        {
            return Ok(action);
        }
        let message = format!(
            "The binding {:?} was unbound and its Secret {:?} deleted",
            retiring.external_id, retiring.secret_name
        );
        let grace_period = self
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == CONDITION && c.status == ConditionStatus::True);
        if grace_period {
            let done = format!(
                "The credentials were rotated; the predecessor {:?} was unbound",
                retiring.external_id
            );
            self.set(CONDITION, ConditionStatus::False, "Rotated", done);
        }
        self.write_status().await?;
        self.event(EventType::Normal, "PredecessorUnbound", &message, "Rotate")
            .await;
        if self.rotation_wanted().is_some() {
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        Ok(self.next_wakeup())
    }

    /// Deletes the Secret of the binding in `slot` and unbinds it (410 counts as done);
    /// `None` once the broker no longer has it and the slot is empty, else when to look again.
    pub(super) async fn unbind_slot(
        &mut self,
        slot: Slot,
        instance: &ServiceInstance,
        resolved: &Resolved,
    ) -> Result<Option<Action>, Error> {
        let Some(retiring) = self.slot(slot).clone() else {
            return Ok(None);
        };
        let instance_id = instance_id(instance);
        if retiring.current_operation == Some(ServiceBindingOperation::Unbind) {
            let poll = Poll::binding(instance_id, retiring.external_id.clone())
                .operation(retiring.last_operation.clone())
                .plan(resolved.plan_ref())
                .deleting();
            let answer = resolved.osb.last_operation(&poll).await;
            self.ctx.metrics.osb_call("last_operation", &answer);
            let (state, description, retry_after) = match answer {
                Ok(r) => (r.body.state, r.body.description, r.retry_after),
                Err(e) if e.status().is_some_and(|s| s.as_u16() == 410) => {
                    (OperationState::Succeeded, None, None)
                }
                Err(e) => return Err(e.into()),
            };
            return match state {
                OperationState::InProgress => Ok(Some(Action::requeue(poll_pause(
                    retry_after,
                    elapsed_since(retiring.operation_start_time.as_ref()),
                )))),
                OperationState::Succeeded => {
                    *self.slot(slot) = None;
                    Ok(None)
                }
                OperationState::Failed => {
                    *self.slot(slot) = Some(RotatingBinding {
                        current_operation: None,
                        last_operation: None,
                        operation_start_time: None,
                        ..retiring.clone()
                    });
                    let why = description.unwrap_or_else(|| "the broker gave no reason".into());
                    self.unbind_failed(&retiring.external_id, &why).await?;
                    Ok(Some(Action::requeue(RECHECK)))
                }
            };
        }
        let cached = (self.ctx.caches).secret(&self.namespace, &retiring.secret_name);
        secret::delete(
            &self.secrets,
            self.binding,
            &retiring.secret_name,
            cached.as_deref(),
        )
        .await?;
        let answer = resolved
            .osb
            .unbind(
                &instance_id,
                &retiring.external_id,
                &resolved.plan_ref(),
                true,
            )
            .await;
        self.ctx.metrics.osb_call("unbind", &answer);
        match answer {
            Ok(response) if response.is_async() => {
                *self.slot(slot) = Some(RotatingBinding {
                    current_operation: Some(ServiceBindingOperation::Unbind),
                    last_operation: response.body.operation.clone(),
                    operation_start_time: Some(Time(Timestamp::now())),
                    ..retiring
                });
                self.write_status().await?;
                Ok(Some(Action::requeue(poll_pause(
                    response.retry_after,
                    Duration::ZERO,
                ))))
            }
            Ok(_) => {
                *self.slot(slot) = None;
                Ok(None)
            }
            Err(e) => {
                self.unbind_failed(&retiring.external_id, &resolved.said(&e))
                    .await?;
                Ok(Some(Action::requeue(RECHECK)))
            }
        }
    }

    /// Says that unbinding the rotation's binding `id` failed; it is tried again.
    pub(super) async fn unbind_failed(&mut self, id: &str, why: &str) -> Result<(), Error> {
        let message = format!("Unbinding the binding {id:?} failed: {why}; trying again");
        self.write_status().await?;
        self.event(EventType::Warning, "UnbindCallFailed", &message, "Rotate")
            .await;
        Ok(())
    }
}
