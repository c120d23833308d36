//! Binding, and what follows a bind the broker may have half done: orphan mitigation is started
//! here (its unbind calls are in `delete.rs`). Credentials become the binding's Secret
//! (`publish`) after a synchronous bind, a finished asynchronous one, or a
//! fetch of a deleted Secret's credentials.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::runner::Action;
use brokkr_osb::client::Error as OsbError;
use brokkr_osb::messages::BindRequest;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::runtime::events::EventType;
use serde_json::{Map, Value};

use super::secret;
use super::state::{Expiry, Reconcile};
use crate::error::Error;
use crate::identity;
use crate::identity::binding_id;
use crate::identity::instance_id;
use crate::platform::osb_context;
use crate::platform::{may_have_created, poll_pause};
use crate::resolve::Resolved;
use crate::resources::{
    ConditionStatus, LocalObjectReference, ServiceBindingOperation, ServiceBindingPropertiesState,
    ServiceInstance, UnbindStatus,
};
use crate::user_info::{BINDINGS, Guard};

impl Reconcile<'_> {
    /// Binds: waits while a Secret of that name is not this binding's, builds the parameters,
    /// and calls bind; credentials in the answer are published, a 202 is recorded to be polled.
    pub(super) async fn bind(
        &mut self,
        instance: &ServiceInstance,
        resolved: &Resolved,
    ) -> Result<Action, Error> {
        let secret_name = secret::name(self.binding);
        if let Some(existing) = self.ctx.caches.secret(&self.namespace, &secret_name)
            && !secret::controlled_by(existing.as_ref(), self.binding)
        {
            let message = format!(
                "a Secret {secret_name:?} that this ServiceBinding does not own exists; it is never overwritten (delete it, or set spec.secretName)"
            );
            return self.wait("SecretNotOwned", message).await;
        }
        let others = self.transform_sources().await?;
        if let Some(missing) =
            crate::resources::transform_sources(&self.binding.spec.secret_transforms)
                .into_iter()
                .find(|name| !others.contains_key(name))
        {
            let message = format!(
                "spec.secretTransforms copies keys from the Secret {missing:?}, which does not exist; waiting for it"
            );
            return self.wait("ErrorWithSecretTransforms", message).await;
        }
        if let Err(invalid) = secret::precheck(&self.binding.spec.secret_transforms, &others) {
            return self
                .fail("ErrorWithSecretTransforms", invalid.to_string())
                .await;
        }
        if let Some(wait) = self.ctx.backoffs.wait(&self.uid()) {
            // The last bind failed: the next waits its turn.
            return Ok(Action::requeue(wait));
        }
        let params = match self.parameters().await? {
            Ok(params) => params,
            Err(invalid) if invalid.waits() => {
                return self.wait("ErrorWithParameters", invalid.to_string()).await;
            }
            Err(invalid) => return self.fail("ErrorWithParameters", invalid.to_string()).await,
        };
        if identity::record_binding(self.binding, &mut self.status, instance) {
            // The first call: the ids it is made with are recorded before it is made, and from
            // then on the broker may hold the binding: its deletion unbinds it, whatever becomes
            // of the status this process has not written yet.
            self.status.unbind_status = Some(UnbindStatus::Required);
            self.set(
                "Ready",
                ConditionStatus::False,
                "Binding",
                "The binding is being created",
            );
            self.write_status().await?;
        }
        let request = BindRequest {
            service_id: resolved.class.external_id.clone(),
            plan_id: resolved.plan.external_id.clone(),
            context: Some(osb_context(instance, self.ctx)),
            parameters: params.merged,
            ..BindRequest::default()
        };
        // The bind is the binding's spec's: it carries the identity of whoever wrote it, if
        // checked ([`crate::user_info`]).
        let checked = (self.ctx.user_info)
            .checked(
                BINDINGS,
                &self.binding.metadata,
                self.binding.spec.user_info.as_ref(),
            )
            .await;
        checked.record(
            &mut self.status.conditions,
            &self.ctx.metrics,
            "ServiceBinding",
        );
        let user = checked.user();
        let answer = Guard::client(&resolved.osb, user)?
            .bind(
                &instance_id(instance),
                &binding_id(self.binding),
                &request,
                true,
            )
            .await;
        self.ctx.metrics.osb_call("bind", &answer);
        self.status.in_progress_properties = Some(ServiceBindingPropertiesState {
            parameters: params.redacted,
            parameter_checksum: params.checksum,
            user_info: user.cloned(),
        });
        self.status.unbind_status = Some(UnbindStatus::Required);
        match answer {
            Ok(response) if response.is_async() => {
                self.status.async_op_in_progress = true;
                self.status.current_operation = Some(ServiceBindingOperation::Bind);
                self.status.last_operation = response.body.operation.clone();
                self.status.operation_start_time = Some(Time(Timestamp::now()));
                self.set(
                    "Ready",
                    ConditionStatus::False,
                    "Binding",
                    "The binding is being created asynchronously",
                );
                if response.retry_after.is_none()
                    && let Some(action) = self.poll_at_once(instance, resolved).await
                {
                    return Ok(action);
                }
                self.write_status().await?;
                Ok(Action::requeue(poll_pause(
                    response.retry_after,
                    Duration::ZERO,
                )))
            }
            Ok(response) => {
                let binding = response.body.binding;
                let expiry = Expiry::of(binding.metadata.as_ref());
                let credentials = binding.credentials.unwrap_or_default();
                self.publish_with(instance, resolved, credentials, expiry, others)
                    .await
            }
            Err(e) => {
                let said = resolved.said(&e);
                self.bind_failed(e, said).await
            }
        }
    }

    /// A bind the broker refused or did not answer properly.
    async fn bind_failed(&mut self, e: OsbError, said: String) -> Result<Action, Error> {
        let status = e.status().map(|s| s.as_u16());
        let message = format!("Bind call failed: {said}");
        if matches!(status, Some(400 | 409 | 422)) {
            self.status.unbind_status = Some(UnbindStatus::NotRequired);
            return self.fail("BindCallFailed", message).await;
        }
        if may_have_created(&e) {
            return self.start_orphan_mitigation(message).await;
        }
        // The broker could not be reached: nothing was bound; try again.
        self.status.unbind_status = Some(UnbindStatus::NotRequired);
        self.end_operation();
        self.set("Ready", ConditionStatus::False, "BindCallFailed", message);
        self.write_status().await?;
        Ok(Action::requeue(self.ctx.backoffs.failed(&self.uid())))
    }

    /// Starts unbinding what a bind that went wrong may have left at the broker.
    pub(super) async fn start_orphan_mitigation(&mut self, why: String) -> Result<Action, Error> {
        self.ctx.backoffs.failed(&self.uid());
        self.end_operation();
        self.status.orphan_mitigation_in_progress = true;
        self.status.unbind_status = Some(UnbindStatus::Required);
        let message = format!("{why}; unbinding what the broker may have created");
        self.set(
            "Ready",
            ConditionStatus::False,
            "StartingOrphanMitigation",
            message.clone(),
        );
        self.write_status().await?;
        self.event(
            EventType::Warning,
            "StartingOrphanMitigation",
            &message,
            "Bind",
        )
        .await;
        Ok(Action::requeue(Duration::from_secs(1)))
    }

    /// Turns credentials into the binding's Secret and marks the binding Ready; `expiry` is
    /// when the broker says they expire.
    pub(super) async fn publish(
        &mut self,
        instance: &ServiceInstance,
        resolved: &Resolved,
        credentials: Map<String, Value>,
        expiry: Expiry,
    ) -> Result<Action, Error> {
        let others = self.transform_sources().await?;
        self.publish_with(instance, resolved, credentials, expiry, others)
            .await
    }

    /// [`Self::publish`] with the `addKeysFrom` Secrets already read.
    async fn publish_with(
        &mut self,
        instance: &ServiceInstance,
        resolved: &Resolved,
        credentials: Map<String, Value>,
        expiry: Expiry,
        others: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    ) -> Result<Action, Error> {
        let contents = match secret::contents(
            credentials,
            &resolved.class.external_name,
            &self.binding.spec.secret_transforms,
            &others,
        ) {
            Ok(contents) => contents,
            Err(unusable) => return self.start_orphan_mitigation(unusable.to_string()).await,
        };
        let name = self.current_secret();
        // A rotation's Secret is immutable; the first binding's keeps its name and is rewritten.
        let rotated = name != secret::name(self.binding);
        let seen = self.ctx.caches.secret(&self.namespace, &name).is_some();
        match secret::write(&self.secrets, self.binding, &name, contents, rotated, seen).await? {
            secret::Written::Done => {}
            secret::Written::NotOwned => {
                let message = format!(
                    "a Secret {name:?} that this ServiceBinding does not own appeared; it is never overwritten"
                );
                return self.start_orphan_mitigation(message).await;
            }
        }
        self.ctx.backoffs.forget(&self.uid());
        self.record_current(expiry);
        self.status.external_properties = self.status.in_progress_properties.take();
        self.status.reconciled_generation = self.status.observed_generation;
        self.end_operation();
        self.status.binding = Some(LocalObjectReference { name: name.clone() });
        self.status.unbind_status = Some(UnbindStatus::Required);
        let message = format!(
            "The credentials of the ServiceInstance {:?} are in the Secret {name:?}",
            instance.name_any()
        );
        self.set(
            "Ready",
            ConditionStatus::True,
            "InjectedBindResult",
            message.clone(),
        );
        // A success the user asked for is said by the condition alone: no Event.
        self.write_status().await?;
        // Nothing else wakes the binding for its renewal: its own writes do not.
        Ok(self.next_wakeup())
    }

    /// The Secrets `addKeysFrom` transforms copy from that exist, by name, with their data.
    pub(super) async fn transform_sources(
        &self,
    ) -> Result<BTreeMap<String, BTreeMap<String, Vec<u8>>>, Error> {
        let mut others = BTreeMap::new();
        for name in crate::resources::transform_sources(&self.binding.spec.secret_transforms) {
            if let Some(found) = self.secrets.get_opt(&name).await? {
                let data = found
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect();
                others.insert(name, data);
            }
        }
        Ok(others)
    }
}
