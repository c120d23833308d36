//! The ServiceBinding controller: credentials for a ServiceInstance of the same namespace, in a
//! servicebinding.io Secret.
//!
//! - **Any order.** A binding whose instance does not exist, is not Ready yet, or whose
//!   parameters name a Secret that does not exist yet waits, with a `Ready=False` condition that
//!   says why, and binds once it can; it fails only after the wait timeout (default 1 h,
//!   counted from when it started waiting).
//! - **Bind** (`bind.rs`) with `accepts_incomplete=true`; a 202 is polled (`poll.rs`: the
//!   broker's `Retry-After`, else a backoff from 1 s doubling to 5 min, up to the plan's
//!   `maximumPollingDuration`) and the credentials are then fetched. 400/409/422 are terminal
//!   with the broker's description.
//! - **Orphan mitigation**: a bind that timed out, got a 5xx or a malformed answer, or whose
//!   credentials cannot become a Secret, is followed by unbind calls (`delete.rs`) until one
//!   succeeds; the bind is then tried again.
//! - **The Secret** (see [`secret`]) is checked before the bind: if one of that name exists and
//!   is not this binding's, nothing is bound and the condition says so.
//! - **Deletion** (`delete.rs`) deletes the Secret first, then unbinds (410 counts as done), then
//!   releases the finalizer. `services.brokkr.dev/abandon: "true"` releases it without calling
//!   the broker, for a broker or instance that is gone for good.
//!
//! A bound binding whose Secret is deleted gets it back (`restore.rs`), fetched from the broker
//! where the class is `bindingRetrievable`; else the condition says the binding must be
//! re-created.
//!
//! A binding is immutable at the broker: spec changes after the bind are not sent (the
//! condition says so) until it rotates (`rotate.rs`): new credentials in a new Secret, asked
//! for with the annotation `services.brokkr.dev/rotate` or when the broker's `renew_before` is
//! reached.

mod bind;
mod delete;
mod poll;
mod restore;
mod rotate;
pub mod secret;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt as _};

use crate::context::Context;
use crate::error::Error;
use crate::platform::humanize;
use crate::resolve::resolve;
use crate::resources::{
    ConditionStatus, ServiceBinding, ServiceBindingStatus, ServiceInstance, UnbindStatus,
};
use crate::{conditions, finalizer, identity, platform, status};
pub use identity::binding_id;
pub use rotate::{DEFAULT_GRACE_PERIOD, ROTATE_ANNOTATION};

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
    "successorBinding",
    "previousBinding",
    "nextRotationTime",
    "expiresAt",
    "rotateRequest",
];

/// How long a new binding waits for its instance before its status says so.
const QUIET_WAIT: Duration = Duration::from_secs(30);
/// How long after a binding became Ready its Secret may be missing from the cache without
/// being read from the API server.
const JUST_WRITTEN: Duration = Duration::from_secs(10);

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

/// Whether `secret` matters to `binding`: the binding controls it, or names it in
/// `parametersFrom` or an `addKeysFrom` transform.
pub fn uses_secret(binding: &ServiceBinding, secret: &PartialObjectMeta<Secret>) -> bool {
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
    /// The binding's parameters: `spec.parameters` merged with its `parametersFrom` Secrets.
    async fn parameters(
        &self,
    ) -> Result<Result<crate::parameters::Parameters, crate::parameters::Invalid>, kube::Error>
    {
        crate::parameters::build(
            &self.ctx.client,
            &self.namespace,
            self.binding.spec.parameters.as_ref(),
            &self.binding.spec.parameters_from,
        )
        .await
    }

    /// The ServiceInstance `name` of the binding's namespace: from the instances' cache, else
    /// (not seen there yet) from the API server.
    async fn instance_named(&self, name: &str) -> Result<Option<ServiceInstance>, kube::Error> {
        let cached = self
            .ctx
            .caches
            .instances
            .get(&kube::runtime::reflector::ObjectRef::new(name).within(&self.namespace));
        if let Some(instance) = cached {
            return Ok(Some(instance.as_ref().clone()));
        }
        Api::<ServiceInstance>::namespaced(self.ctx.client.clone(), &self.namespace)
            .get_opt(name)
            .await
    }

    /// Whether the binding's Secret exists: as the Secrets' cache says, or, when the cache
    /// has not seen it, as the API server says; `None` when this controller wrote it seconds
    /// ago (the binding became Ready since) and the cache is only behind.
    async fn secret_exists(&self) -> Result<Option<bool>, kube::Error> {
        let name = self.current_secret();
        if self.ctx.caches.secret(&self.namespace, &name).is_some() {
            return Ok(Some(true));
        }
        let ready_since = self
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready" && c.status == ConditionStatus::True)
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| platform::elapsed_since(Some(t)));
        if ready_since.is_some_and(|d| d < JUST_WRITTEN) {
            return Ok(None);
        }
        Ok(Some(self.secrets.get_metadata_opt(&name).await?.is_some()))
    }

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
        if self.ctx.written.freshness(self.binding) == crate::status::Freshness::Stale {
            // The cache is behind this controller's own last write: its watch event comes soon.
            return Ok(Action::requeue(crate::status::STALE_RETRY));
        }
        match self.ctx.held_bindings.take(self.binding, &self.ctx.written) {
            Some(status::Taken::Unchanged(held)) => self.status = held,
            Some(status::Taken::Changed(held)) => {
                // Someone changed the binding (a deletion, say) while an operation's start was
                // held: written first, as it would have been.
                self.status = held;
                self.write_status().await?;
            }
            None => {}
        }
        if self.binding.metadata.deletion_timestamp.is_some() {
            return self.delete().await;
        }
        if self.ctx.caches.terminating(&self.namespace) {
            // Its namespace is going, and the binding with it: nothing new is written there.
            return Ok(Action::await_change());
        }
        let generation = self.binding.metadata.generation.unwrap_or_default();
        let bound = self.status.unbind_status == Some(UnbindStatus::Required)
            && self.status.binding.is_some();
        if bound && !self.status.async_op_in_progress {
            match self.secret_exists().await? {
                Some(true) => {}
                Some(false) => return self.restore_secret().await,
                // Written an instant ago: the cache has it soon.
                None => return Ok(Action::requeue(crate::status::STALE_RETRY)),
            }
            if self.status.observed_generation != generation {
                self.status.observed_generation = generation;
                self.set(
                    "Ready",
                    ConditionStatus::True,
                    "InjectedBindResult",
                    "The binding was injected; later changes to its spec are not sent to the broker until it rotates (or delete and re-create it)",
                );
                self.write_status().await?;
            }
            return self.rotation().await;
        }
        if !self.status.async_op_in_progress
            && !self.status.orphan_mitigation_in_progress
            && self.status.observed_generation == generation
            && self.condition_is("Failed", ConditionStatus::True)
        {
            return Ok(Action::await_change());
        }
        self.status.observed_generation = generation;
        if let Some((reason, message)) = identity::binding_mismatch(self.binding, None) {
            return self.refuse(reason, message).await;
        }

        let Some(instance) = self.ready_instance().await? else {
            return Ok(Action::requeue(RECHECK));
        };
        if let Some((reason, message)) = identity::binding_mismatch(self.binding, Some(&instance)) {
            return self.refuse(reason, message).await;
        }
        if identity::binding_called(&self.status)
            && identity::record_binding(self.binding, &mut self.status, &instance)
        {
            // Bound before the record existed: adopted with the ids it has now.
            self.write_status().await?;
        }
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
        if self.status.orphan_mitigation_in_progress {
            return self.unbind(&instance, &resolved).await;
        }
        if self.status.async_op_in_progress {
            return self.poll(&instance, &resolved).await;
        }
        // A bind starts an operation at the broker: only from the object as it is now.
        if crate::status::status_is_stale(&self.bindings, self.binding, &self.ctx.written).await? {
            return Ok(Action::requeue(crate::status::STALE_RETRY));
        }
        if !resolved.plan.bindable.unwrap_or(resolved.class.bindable) {
            let message = format!(
                "the plan {} of the class {} is not bindable",
                resolved.plan.external_name, resolved.class.external_name
            );
            return self.fail("ErrorNonbindableServiceClass", message).await;
        }
        if let Some(written) = finalizer::add(&self.bindings, self.binding, FINALIZER).await? {
            self.ctx.written.record(self.binding, &written);
        }
        self.bind(&instance, &resolved).await
    }

    /// The instance, once it exists and is Ready; else the binding waits (and `None`).
    async fn ready_instance(&mut self) -> Result<Option<ServiceInstance>, Error> {
        let name = &self.binding.spec.instance_ref.name;
        let (reason, message) = match self.instance_named(name).await? {
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
                if self.quietly_waits_for(&i) {
                    return Ok(None);
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

    /// Whether the binding waits for its instance without saying so yet: it is new (no Ready
    /// condition, created less than [`QUIET_WAIT`] ago) and the instance is on its way (not
    /// failed). Bindings created with their instances then cost no status write for a wait of
    /// seconds; the instance becoming Ready wakes them.
    fn quietly_waits_for(&self, instance: &ServiceInstance) -> bool {
        let new = !self.status.conditions.iter().any(|c| c.type_ == "Ready")
            && platform::elapsed_since(self.binding.metadata.creation_timestamp.as_ref())
                < QUIET_WAIT;
        let failed = instance.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Failed" && c.status == ConditionStatus::True)
        });
        new && !failed
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

    /// The spec names other OSB ids than those recorded, or one the OSB API cannot carry:
    /// nothing is sent to the broker until it is changed back. A binding never bound fails.
    async fn refuse(&mut self, reason: &str, message: String) -> Result<Action, Error> {
        if self.status.external_id.is_none() {
            return self.fail(reason, message).await;
        }
        let said = self
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.reason == reason && conditions::says(c, &message));
        self.set("Ready", ConditionStatus::False, reason, message.clone());
        self.write_status().await?;
        if !said {
            self.event(EventType::Warning, reason, &message, "Bind")
                .await;
        }
        Ok(Action::await_change())
    }

    /// The binding's uid, which its backoff is kept by.
    fn uid(&self) -> String {
        self.binding.uid().unwrap_or_default()
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
            &self.ctx.written,
        )
        .await?)
    }

    /// Publishes an Event about the binding.
    async fn event(&self, type_: EventType, reason: &str, note: &str, action: &str) {
        platform::event(self.ctx, self.binding, type_, reason, note, action).await;
    }
}
