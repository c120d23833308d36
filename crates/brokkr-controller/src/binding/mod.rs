//! The ServiceBinding controller: credentials for a ServiceInstance of the same namespace, in a
//! servicebinding.io Secret.
//!
//! - **Any order.** A binding whose instance does not exist, is not Ready yet, or whose
//!   parameters name a Secret that does not exist yet waits, with a `Ready=False` condition that
//!   says why, and binds once it can; it fails only after the wait timeout (default 1 h,
//!   counted from when it started waiting).
//! - **Bind** with `accepts_incomplete=true`; a 202 is polled (the broker's `Retry-After`, else
//!   a backoff from 1 s doubling to 5 min, up to the plan's `maximumPollingDuration`) and the
//!   credentials are then fetched. 400/409/422 are terminal with the broker's description.
//! - **Orphan mitigation**: a bind that timed out, got a 5xx or a malformed answer, or whose
//!   credentials cannot become a Secret, is followed by unbind calls until one succeeds; the bind
//!   is then tried again.
//! - **The Secret** (see [`secret`]) is checked before the bind: if one of that name exists and
//!   is not this binding's, nothing is bound and the condition says so.
//! - **Deletion** deletes the Secret first, then unbinds (410 counts as done), then releases the
//!   finalizer. `services.brokkr.dev/abandon: "true"` releases it without calling the broker,
//!   for a broker or instance that is gone for good.
//!
//! A bound binding whose Secret is deleted gets it back, fetched from the broker where the
//! class is `bindingRetrievable`; else the condition says the binding must be re-created.
//!
//! A binding is immutable at the broker: spec changes after the bind are not sent (the
//! condition says so); delete and re-create the binding instead.

pub mod secret;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use brokkr_osb::client::{Error as OsbError, Poll};
use brokkr_osb::headers::OriginatingIdentity;
use brokkr_osb::messages::{BindRequest, OperationState};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt as _};
use serde_json::{Map, Value, json};

use crate::broker::Error;
use crate::instance::resolve::{Resolved, resolve};
use crate::instance::{ABANDON_ANNOTATION, instance_id, osb_context};
use crate::parameters;
use crate::platform::{backoff, elapsed_since, humanize, may_have_created};
use crate::resources::{
    ConditionStatus, LocalObjectReference, ServiceBinding, ServiceBindingOperation,
    ServiceBindingPropertiesState, ServiceBindingStatus, ServiceInstance, UnbindStatus,
};
use crate::{Context, conditions, finalizer, platform, status};

/// The finalizer that keeps a ServiceBinding until the broker has unbound it.
pub const FINALIZER: &str = "services.brokkr.dev/service-binding";
/// How often to look again at something only a person or another controller can change.
const RECHECK: Duration = Duration::from_secs(10);
/// Status fields that may be absent: sent as `null` so that the merge patch removes them (those
/// of an operation that ended, and `binding` before there is a Secret).
const CLEARED_FIELDS: &[&str] = &[
    "lastOperation",
    "currentOperation",
    "operationStartTime",
    "inProgressProperties",
    "binding",
];

/// Reconciles one ServiceBinding.
pub async fn reconcile(binding: Arc<ServiceBinding>, ctx: Arc<Context>) -> Result<Action, Error> {
    let result = Reconcile::new(&binding, &ctx).run().await;
    ctx.metrics.reconciled("ServiceBinding", result.is_err());
    if let Err(e) = &result {
        tracing::warn!(namespace = %binding.namespace().unwrap_or_default(), binding = %binding.name_any(), error = %e, "reconcile failed");
    }
    result
}

/// What to do after a failed reconcile: try again soon.
pub fn error_policy(_: Arc<ServiceBinding>, _: &Error, _: Arc<Context>) -> Action {
    Action::requeue(RECHECK)
}

/// The ServiceBindings of `namespace` that name `instance`.
pub async fn bindings_of(
    client: &kube::Client,
    namespace: &str,
    instance: &str,
) -> Result<Vec<ServiceBinding>, kube::Error> {
    let all = Api::<ServiceBinding>::namespaced(client.clone(), namespace)
        .list(&Default::default())
        .await?;
    Ok(all
        .into_iter()
        .filter(|b| b.spec.instance_ref.name == instance)
        .collect())
}

/// Whether `secret` matters to `binding`: the binding controls it, or names it in
/// `parametersFrom` or an `addKeysFrom` transform.
pub fn uses_secret(binding: &ServiceBinding, secret: &Secret) -> bool {
    if binding.metadata.namespace != secret.metadata.namespace {
        return false;
    }
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    secret::controlled_by(secret, binding)
        || binding
            .spec
            .parameters_from
            .iter()
            .filter_map(|p| p.secret_key_ref.as_ref())
            .any(|r| r.name == name)
        || secret::sources(&binding.spec.secret_transforms)
            .iter()
            .any(|s| s == name)
}

/// One reconcile of one binding: the resource, the status being built, and the APIs it uses.
struct Reconcile<'a> {
    binding: &'a ServiceBinding,
    ctx: &'a Context,
    status: ServiceBindingStatus,
    bindings: Api<ServiceBinding>,
    secrets: Api<Secret>,
    namespace: String,
}

impl<'a> Reconcile<'a> {
    fn new(binding: &'a ServiceBinding, ctx: &'a Context) -> Self {
        let namespace = binding.namespace().unwrap_or_default();
        Self {
            binding,
            ctx,
            status: binding.status.clone().unwrap_or_default(),
            bindings: Api::namespaced(ctx.client.clone(), &namespace),
            secrets: Api::namespaced(ctx.client.clone(), &namespace),
            namespace,
        }
    }

    async fn run(mut self) -> Result<Action, Error> {
        if self.binding.metadata.deletion_timestamp.is_some() {
            return self.delete().await;
        }
        let generation = self.binding.metadata.generation.unwrap_or_default();
        let bound = self.status.unbind_status == Some(UnbindStatus::Required)
            && self.status.binding.is_some();
        if bound && !self.status.async_op_in_progress {
            if self
                .secrets
                .get_opt(&secret::name(self.binding))
                .await?
                .is_none()
            {
                return self.restore_secret().await;
            }
            if self.status.observed_generation != generation {
                self.status.observed_generation = generation;
                self.set(
                    "Ready",
                    ConditionStatus::True,
                    "InjectedBindResult",
                    "The binding was injected; later changes to its spec are not sent to the broker (delete and re-create it to change them)",
                );
                self.write_status().await?;
            }
            return Ok(Action::await_change());
        }
        if !self.status.async_op_in_progress
            && !self.status.orphan_mitigation_in_progress
            && self.status.observed_generation == generation
            && self.condition_is("Failed", ConditionStatus::True)
        {
            return Ok(Action::await_change());
        }
        self.status.observed_generation = generation;

        let Some(instance) = self.ready_instance().await? else {
            return Ok(Action::requeue(RECHECK));
        };
        let resolved = match resolve(&instance, self.ctx).await? {
            Ok(resolved) => resolved,
            Err(missing) => {
                return self
                    .wait(
                        "ErrorInstanceNotReady",
                        format!("the ServiceInstance's plan cannot be found: {missing}"),
                    )
                    .await;
            }
        };
        let resolved = self.with_identity(resolved)?;
        if self.status.orphan_mitigation_in_progress {
            return self.unbind(&instance, &resolved).await;
        }
        if self.status.async_op_in_progress {
            return self.poll(&instance, &resolved).await;
        }
        // A bind starts an operation at the broker: only from the object as it is now.
        if platform::status_is_stale(&self.bindings, self.binding).await? {
            return Ok(Action::requeue(platform::STALE_RETRY));
        }
        if !resolved.plan.bindable.unwrap_or(resolved.class.bindable) {
            let message = format!(
                "the plan {} of the class {} is not bindable",
                resolved.plan.external_name, resolved.class.external_name
            );
            return self.fail("ErrorNonbindableServiceClass", message).await;
        }
        finalizer::add(&self.bindings, self.binding, FINALIZER).await?;
        self.bind(&instance, &resolved).await
    }

    /// The Secret of a bound binding went: fetch the credentials again where the broker keeps
    /// them (`bindings_retrievable`), else say how to get them back.
    async fn restore_secret(&mut self) -> Result<Action, Error> {
        let name = self.binding.spec.instance_ref.name.clone();
        let instances =
            Api::<ServiceInstance>::namespaced(self.ctx.client.clone(), &self.namespace);
        let resolved = match instances.get_opt(&name).await? {
            Some(instance) => match resolve(&instance, self.ctx).await? {
                Ok(resolved) => Some((instance, self.with_identity(resolved)?)),
                Err(_) => None,
            },
            None => None,
        };
        let Some((instance, resolved)) = resolved else {
            return self
                .secret_lost("its instance or plan cannot be found")
                .await;
        };
        if !resolved.class.binding_retrievable {
            return self
                .secret_lost("the broker does not let bindings be fetched again")
                .await;
        }
        let fetched = resolved
            .osb
            .binding(
                &instance_id(&instance),
                &binding_id(self.binding),
                Some(&resolved.plan_ref()),
            )
            .await;
        self.ctx.metrics.osb_call("fetch_binding", &fetched);
        let credentials = fetched?.body.credentials.unwrap_or_default();
        self.publish(&instance, &resolved, credentials).await
    }

    async fn secret_lost(&mut self, why: &str) -> Result<Action, Error> {
        let message = format!(
            "the Secret {:?} was deleted and cannot be written again: {why}; delete and re-create this ServiceBinding",
            secret::name(self.binding)
        );
        self.set("Ready", ConditionStatus::False, "SecretDeleted", message);
        self.write_status().await?;
        Ok(Action::await_change())
    }

    /// The instance, once it exists and is Ready; else the binding waits (and `None`).
    async fn ready_instance(&mut self) -> Result<Option<ServiceInstance>, Error> {
        let name = &self.binding.spec.instance_ref.name;
        let instances =
            Api::<ServiceInstance>::namespaced(self.ctx.client.clone(), &self.namespace);
        let (reason, message) = match instances.get_opt(name).await? {
            None => (
                "ReferencesNonexistentInstance",
                format!("the ServiceInstance {name:?} does not exist; waiting for it"),
            ),
            Some(i) if i.metadata.deletion_timestamp.is_some() => (
                "ReferencesDeletedInstance",
                format!("the ServiceInstance {name:?} is being deleted"),
            ),
            Some(i) => {
                let ready = i.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == ConditionStatus::True)
                });
                if ready {
                    return Ok(Some(i));
                }
                (
                    "ErrorInstanceNotReady",
                    format!("the ServiceInstance {name:?} is not Ready yet; waiting for it"),
                )
            }
        };
        self.wait(reason, message).await?;
        Ok(None)
    }

    /// Waits for something to appear, up to the wait timeout counted from when `Ready` became
    /// False; then fails.
    async fn wait(&mut self, reason: &str, message: String) -> Result<Action, Error> {
        let since = self
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready" && c.status == ConditionStatus::False)
            .and_then(|c| c.last_transition_time.as_ref())
            .map_or_else(Timestamp::now, |t| t.0);
        let limit = SignedDuration::try_from(self.ctx.wait_timeout).unwrap_or(SignedDuration::MAX);
        if Timestamp::now().duration_since(since) > limit {
            let message = format!(
                "{message}; gave up after {}",
                humanize(self.ctx.wait_timeout)
            );
            return self.fail(reason, message).await;
        }
        self.set("Ready", ConditionStatus::False, reason, message);
        self.write_status().await?;
        Ok(Action::requeue(RECHECK))
    }

    /// Ends in `Failed=True` (until the spec changes).
    async fn fail(&mut self, reason: &str, message: String) -> Result<Action, Error> {
        self.end_operation();
        self.set("Failed", ConditionStatus::True, reason, message.clone());
        self.set("Ready", ConditionStatus::False, reason, message.clone());
        self.write_status().await?;
        self.event(EventType::Warning, reason, &message, "Bind")
            .await;
        Ok(Action::await_change())
    }

    fn with_identity(&self, mut resolved: Resolved) -> Result<Resolved, Error> {
        let user = self
            .binding
            .spec
            .user_info
            .as_ref()
            .map_or_else(|| json!({}), |u| json!(u));
        resolved.osb = resolved
            .osb
            .with_originating_identity(&OriginatingIdentity::new("kubernetes", user))?;
        Ok(resolved)
    }

    async fn bind(
        &mut self,
        instance: &ServiceInstance,
        resolved: &Resolved,
    ) -> Result<Action, Error> {
        let secret_name = secret::name(self.binding);
        if let Some(existing) = self.secrets.get_opt(&secret_name).await?
            && !secret::controlled_by(&existing, self.binding)
        {
            let message = format!(
                "a Secret {secret_name:?} that this ServiceBinding does not own exists; it is never overwritten (delete it, or set spec.secretName)"
            );
            return self.wait("SecretNotOwned", message).await;
        }
        let params = match parameters::build(
            &self.ctx.client,
            &self.namespace,
            self.binding.spec.parameters.as_ref(),
            &self.binding.spec.parameters_from,
        )
        .await?
        {
            Ok(params) => params,
            Err(invalid) if invalid.waits() => {
                return self.wait("ErrorWithParameters", invalid.to_string()).await;
            }
            Err(invalid) => return self.fail("ErrorWithParameters", invalid.to_string()).await,
        };
        let request = BindRequest {
            service_id: resolved.class.external_id.clone(),
            plan_id: resolved.plan.external_id.clone(),
            context: Some(osb_context(instance, self.ctx)),
            parameters: params.merged,
            ..BindRequest::default()
        };
        let answer = resolved
            .osb
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
            user_info: self.binding.spec.user_info.clone(),
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
                self.write_status().await?;
                Ok(Action::requeue(
                    response.retry_after.unwrap_or(Duration::from_secs(1)),
                ))
            }
            Ok(response) => {
                let credentials = response.body.binding.credentials.unwrap_or_default();
                self.publish(instance, resolved, credentials).await
            }
            Err(e) => self.bind_failed(e).await,
        }
    }

    /// A bind the broker refused or did not answer properly.
    async fn bind_failed(&mut self, e: OsbError) -> Result<Action, Error> {
        let status = e.status().map(|s| s.as_u16());
        let message = format!("Bind call failed: {e}");
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
        Ok(Action::requeue(RECHECK))
    }

    async fn start_orphan_mitigation(&mut self, why: String) -> Result<Action, Error> {
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

    /// Turns credentials into the binding's Secret and marks the binding Ready.
    async fn publish(
        &mut self,
        instance: &ServiceInstance,
        resolved: &Resolved,
        credentials: Map<String, Value>,
    ) -> Result<Action, Error> {
        let mut others = BTreeMap::new();
        for name in secret::sources(&self.binding.spec.secret_transforms) {
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
        let contents = match secret::contents(
            credentials,
            &resolved.class.external_name,
            &self.binding.spec.secret_transforms,
            &others,
        ) {
            Ok(contents) => contents,
            Err(unusable) => return self.start_orphan_mitigation(unusable.to_string()).await,
        };
        match secret::write(&self.secrets, self.binding, contents).await? {
            secret::Written::Done => {}
            secret::Written::NotOwned => {
                let message = format!(
                    "a Secret {:?} that this ServiceBinding does not own appeared; it is never overwritten",
                    secret::name(self.binding)
                );
                return self.start_orphan_mitigation(message).await;
            }
        }
        let name = secret::name(self.binding);
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
        self.write_status().await?;
        self.event(EventType::Normal, "InjectedBindResult", &message, "Bind")
            .await;
        Ok(Action::await_change())
    }

    /// Polls the bind or unbind in progress.
    async fn poll(
        &mut self,
        instance: &ServiceInstance,
        resolved: &Resolved,
    ) -> Result<Action, Error> {
        let unbinding = self.status.current_operation == Some(ServiceBindingOperation::Unbind);
        let mut poll = Poll::binding(instance_id(instance), binding_id(self.binding))
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
                self.write_status().await?;
                Ok(Action::requeue(
                    retry_after.unwrap_or_else(|| backoff(elapsed)),
                ))
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
                        &binding_id(self.binding),
                        Some(&resolved.plan_ref()),
                    )
                    .await;
                self.ctx.metrics.osb_call("fetch_binding", &fetched);
                match fetched {
                    Ok(response) => {
                        let credentials = response.body.credentials.unwrap_or_default();
                        self.publish(instance, resolved, credentials).await
                    }
                    Err(e) if may_have_created(&e) => {
                        self.start_orphan_mitigation(format!("fetching the binding failed: {e}"))
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

    /// Deletion: the Secret first, then unbind, then the finalizer.
    async fn delete(mut self) -> Result<Action, Error> {
        if !finalizer::has(self.binding, FINALIZER) {
            return Ok(Action::await_change());
        }
        secret::delete(&self.secrets, self.binding).await?;
        if self
            .binding
            .annotations()
            .get(ABANDON_ANNOTATION)
            .map(String::as_str)
            == Some("true")
        {
            let left = if self.status.unbind_status == Some(UnbindStatus::Required)
                || self.status.async_op_in_progress
            {
                format!(
                    "released without unbinding: binding {:?} of instance {:?} may remain at the broker",
                    binding_id(self.binding),
                    self.binding.spec.instance_ref.name
                )
            } else {
                "released; nothing was bound".to_owned()
            };
            self.event(EventType::Warning, "Abandoned", &left, "Unbind")
                .await;
            finalizer::remove(&self.bindings, self.binding, FINALIZER).await?;
            return Ok(Action::await_change());
        }
        let needs_unbind = matches!(
            self.status.unbind_status,
            Some(UnbindStatus::Required | UnbindStatus::Failed)
        ) || self.status.async_op_in_progress;
        if !needs_unbind {
            finalizer::remove(&self.bindings, self.binding, FINALIZER).await?;
            return Ok(Action::await_change());
        }
        let name = self.binding.spec.instance_ref.name.clone();
        let instances =
            Api::<ServiceInstance>::namespaced(self.ctx.client.clone(), &self.namespace);
        let Some(instance) = instances.get_opt(&name).await? else {
            let message = format!(
                "cannot unbind: the ServiceInstance {name:?} is gone; annotate this ServiceBinding with {ABANDON_ANNOTATION}=true to release it"
            );
            self.set("Ready", ConditionStatus::False, "UnbindBlocked", message);
            self.write_status().await?;
            return Ok(Action::requeue(RECHECK));
        };
        let resolved = match resolve(&instance, self.ctx).await? {
            Ok(resolved) => self.with_identity(resolved)?,
            Err(missing) => {
                let message = format!(
                    "cannot unbind: {missing}; annotate this ServiceBinding with {ABANDON_ANNOTATION}=true to release it"
                );
                self.set("Ready", ConditionStatus::False, "UnbindBlocked", message);
                self.write_status().await?;
                return Ok(Action::requeue(RECHECK));
            }
        };
        if self.status.async_op_in_progress {
            return self.poll(&instance, &resolved).await;
        }
        if platform::status_is_stale(&self.bindings, self.binding).await? {
            return Ok(Action::requeue(platform::STALE_RETRY));
        }
        self.unbind(&instance, &resolved).await
    }

    /// Calls unbind: for a deletion, or to clean up after a bind that went wrong.
    async fn unbind(
        &mut self,
        instance: &ServiceInstance,
        resolved: &Resolved,
    ) -> Result<Action, Error> {
        let answer = resolved
            .osb
            .unbind(
                &instance_id(instance),
                &binding_id(self.binding),
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
                self.write_status().await?;
                Ok(Action::requeue(
                    response.retry_after.unwrap_or(Duration::from_secs(1)),
                ))
            }
            Ok(_) => self.unbound().await,
            Err(e) => {
                self.end_operation();
                self.status.unbind_status = Some(UnbindStatus::Failed);
                let message = format!("Unbind call failed: {e}");
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
    async fn unbound(&mut self) -> Result<Action, Error> {
        self.end_operation();
        self.status.unbind_status = Some(UnbindStatus::Succeeded);
        if self.binding.metadata.deletion_timestamp.is_some() {
            self.write_status().await?;
            finalizer::remove(&self.bindings, self.binding, FINALIZER).await?;
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

    fn end_operation(&mut self) {
        self.status.async_op_in_progress = false;
        self.status.current_operation = None;
        self.status.last_operation = None;
        self.status.operation_start_time = None;
        self.status.in_progress_properties = None;
    }

    fn condition_is(&self, type_: &str, value: ConditionStatus) -> bool {
        self.status
            .conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == value)
    }

    fn set(
        &mut self,
        type_: &str,
        value: ConditionStatus,
        reason: &str,
        message: impl Into<String>,
    ) {
        conditions::set(&mut self.status.conditions, type_, value, reason, message);
        if type_ == "Ready" {
            self.status.last_condition_state = if value == ConditionStatus::True {
                "Ready".into()
            } else {
                reason.into()
            };
        }
    }

    async fn write_status(&self) -> Result<(), Error> {
        Ok(status::write(
            &self.bindings,
            self.binding,
            self.binding.status.as_ref(),
            &self.status,
            CLEARED_FIELDS,
        )
        .await?)
    }

    /// Publishes an Event about the binding.
    async fn event(&self, type_: EventType, reason: &str, note: &str, action: &str) {
        platform::event(self.ctx, self.binding, type_, reason, note, action).await;
    }
}

/// The OSB binding id: `spec.externalID`, else the resource's uid.
pub fn binding_id(binding: &ServiceBinding) -> String {
    binding
        .spec
        .external_id
        .clone()
        .unwrap_or_else(|| binding.uid().unwrap_or_default())
}
