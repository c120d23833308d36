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
//! reached; the predecessor is unbound once its grace period ends (`retire.rs`).
//!
//! Every phase is a method of one `Reconcile` (`state.rs`: the binding, the
//! status being built, how it waits, fails and writes); a binding waiting for its instance is
//! `wait.rs`'s. `run` below reads the binding and hands it to the phase it is in.

mod bind;
mod delete;
mod poll;
mod restore;
mod retire;
mod rotate;
pub mod secret;
mod state;
mod wait;

use std::sync::Arc;
use std::time::Duration;

use crate::runner::Action;
use kube::ResourceExt as _;

use crate::context::Context;
use crate::error::Error;
use crate::resolve::resolve;
use crate::resources::{ConditionStatus, ServiceBinding, UnbindStatus};
use crate::{finalizer, identity, status};
pub use rotate::{DEFAULT_GRACE_PERIOD, ROTATE_ANNOTATION};
use state::{FINALIZER, RECHECK, Reconcile, WAITING_RESYNC};
pub use wait::waits_for_its_instance;

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

impl<'a> Reconcile<'a> {
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
            // The instance's changes wake the binding; the wait timeout is looked at in time.
            let left = self.wait_left().max(Duration::from_secs(1));
            return Ok(Action::requeue(left.min(WAITING_RESYNC)));
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
}
