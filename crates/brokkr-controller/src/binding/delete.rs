//! Deleting a ServiceBinding: the Secrets first, then unbind calls (410 counts as done) — for a
//! rotation's successor and predecessor, then for the current binding — then the finalizer; the
//! abandon annotation releases it without any broker call. The unbind calls of an orphan
//! mitigation are made here too.

use std::time::Duration;

use crate::runner::Action;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::runtime::events::EventType;

use super::secret;
use super::state::{FINALIZER, RECHECK, Reconcile, Slot};
use crate::error::Error;
use crate::identity::instance_id;
use crate::resolve::{Resolved, resolve};
use crate::resources::ABANDON_ANNOTATION;
use crate::resources::{ConditionStatus, ServiceBindingOperation, ServiceInstance, UnbindStatus};
use crate::{finalizer, identity};

impl Reconcile<'_> {
    /// Deletion: the Secrets first, then unbind, then the finalizer.
    pub(super) async fn delete(mut self) -> Result<Action, Error> {
        self.ctx.backoffs.forget(&self.uid());
        if !finalizer::has(self.binding, FINALIZER) {
            return Ok(Action::await_change());
        }
        let rotating = [
            self.status.successor_binding.as_ref(),
            self.status.previous_binding.as_ref(),
        ];
        let others: Vec<(String, String)> = rotating
            .into_iter()
            .flatten()
            .map(|b| (b.external_id.clone(), b.secret_name.clone()))
            .collect();
        for name in std::iter::once(self.current_secret()).chain(others.iter().map(|o| o.1.clone()))
        {
            let cached = self.ctx.caches.secret(&self.namespace, &name);
            secret::delete(&self.secrets, self.binding, &name, cached.as_deref()).await?;
        }
        let abandoned = self
            .binding
            .annotations()
            .get(ABANDON_ANNOTATION)
            .map(String::as_str)
            == Some("true");
        let with_namespace = crate::namespace_deletion::overdue(self.ctx, &self.namespace);
        if abandoned || with_namespace {
            let left = if matches!(
                self.status.unbind_status,
                Some(UnbindStatus::Required | UnbindStatus::Failed)
            ) || self.status.async_op_in_progress
                || !others.is_empty()
            {
                let mut ids = vec![format!("{:?}", self.current_id())];
                ids.extend(others.iter().map(|(id, _)| format!("{id:?}")));
                format!(
                    "released without unbinding: binding {} of instance {:?} may remain at the broker",
                    ids.join(", "),
                    identity::bound_instance_name(self.binding)
                )
            } else {
                "released; nothing was bound".to_owned()
            };
            if with_namespace && !abandoned {
                let name = self.binding.name_any();
                crate::namespace_deletion::released(
                    self.ctx,
                    "ServiceBinding",
                    &self.namespace,
                    &name,
                    &left,
                )
                .await;
            } else {
                self.event(EventType::Warning, "Abandoned", &left, "Unbind")
                    .await;
            }
            self.release().await?;
            return Ok(Action::await_change());
        }
        let needs_unbind = matches!(
            self.status.unbind_status,
            Some(UnbindStatus::Required | UnbindStatus::Failed)
        ) || self.status.async_op_in_progress
            || !others.is_empty();
        if !needs_unbind {
            self.release().await?;
            return Ok(Action::await_change());
        }
        let name = identity::bound_instance_name(self.binding).to_owned();
        let Some(instance) = self.instance_named(&name).await? else {
            let message = format!(
                "cannot unbind: the ServiceInstance {name:?} is gone; annotate this ServiceBinding with {ABANDON_ANNOTATION}=true to release it"
            );
            self.set("Ready", ConditionStatus::False, "UnbindBlocked", message);
            self.write_status().await?;
            return Ok(Action::requeue(RECHECK));
        };
        if let Some(message) = identity::instance_replaced(self.binding, &instance) {
            self.set("Ready", ConditionStatus::False, identity::CHANGED, message);
            self.write_status().await?;
            return Ok(Action::await_change());
        }
        let resolved = match resolve(&instance, self.ctx).await? {
            Ok(resolved) => resolved,
            Err(missing) => {
                let message = format!(
                    "cannot unbind: {missing}; annotate this ServiceBinding with {ABANDON_ANNOTATION}=true to release it"
                );
                self.set("Ready", ConditionStatus::False, "UnbindBlocked", message);
                self.write_status().await?;
                return Ok(Action::requeue(RECHECK));
            }
        };
        // A rotation's other bindings first: the current one's unbind releases the finalizer.
        for slot in [Slot::Successor, Slot::Previous] {
            if let Some(action) = self.unbind_slot(slot, &instance, &resolved).await? {
                return Ok(action);
            }
        }
        if self.status.async_op_in_progress {
            // The poll writes what it finds, or holds a young unbind's start.
            return self.poll(&instance, &resolved).await;
        }
        self.write_status().await?;
        if crate::status::status_is_stale(&self.bindings, self.binding, &self.ctx.written).await? {
            return Ok(Action::requeue(crate::status::STALE_RETRY));
        }
        self.unbind(&instance, &resolved).await
    }

    /// Removes the finalizer: the binding goes. Its cached versions are stale from now on.
    async fn release(&self) -> Result<(), kube::Error> {
        if let Some(gone) = finalizer::remove(&self.bindings, self.binding, FINALIZER).await? {
            self.ctx.written.record(self.binding, &gone);
        }
        Ok(())
    }

    /// Calls unbind: for a deletion, or to clean up after a bind that went wrong.
    pub(super) async fn unbind(
        &mut self,
        instance: &ServiceInstance,
        resolved: &Resolved,
    ) -> Result<Action, Error> {
        let answer = resolved
            .osb
            .unbind(
                &instance_id(instance),
                &self.current_id(),
                &resolved.plan_ref(),
                true,
            )
            .await;
        self.ctx.metrics.osb_call("unbind", &answer);
        match answer {
            Ok(response) if response.is_async() => {
                self.status.async_op_in_progress = true;
                self.status.current_operation = Some(ServiceBindingOperation::Unbind);
                self.status.last_operation = response.body.operation.clone();
                self.status.operation_start_time = Some(Time(Timestamp::now()));
                self.set(
                    "Ready",
                    ConditionStatus::False,
                    "Unbinding",
                    "The binding is being deleted asynchronously",
                );
                if response.retry_after.is_none()
                    && let Some(action) = self.poll_at_once(instance, resolved).await
                {
                    return Ok(action);
                }
                self.write_status().await?;
                Ok(Action::requeue(
                    response.retry_after.unwrap_or(Duration::from_secs(1)),
                ))
            }
            Ok(_) => self.unbound().await,
            Err(e) => {
                self.end_operation();
                self.status.unbind_status = Some(UnbindStatus::Failed);
                let message = format!("Unbind call failed: {}", resolved.said(&e));
                self.set(
                    "Ready",
                    ConditionStatus::False,
                    "UnbindCallFailed",
                    message.clone(),
                );
                self.write_status().await?;
                self.event(EventType::Warning, "UnbindCallFailed", &message, "Unbind")
                    .await;
                Ok(Action::requeue(RECHECK))
            }
        }
    }

    /// The broker no longer has the binding: end a deletion, or retry the bind after orphan
    /// mitigation.
    pub(super) async fn unbound(&mut self) -> Result<Action, Error> {
        self.end_operation();
        self.status.unbind_status = Some(UnbindStatus::Succeeded);
        if self.binding.metadata.deletion_timestamp.is_some() {
            // The binding goes with the finalizer: its last status would never be read.
            self.release().await?;
            return Ok(Action::await_change());
        }
        self.status.orphan_mitigation_in_progress = false;
        self.status.unbind_status = Some(UnbindStatus::NotRequired);
        self.set(
            "Ready",
            ConditionStatus::False,
            "OrphanMitigationSuccessful",
            "What the failed bind may have created was unbound; binding again",
        );
        self.write_status().await?;
        Ok(Action::requeue(RECHECK))
    }
}
