//! Rotation: new credentials for a bound ServiceBinding, with working ones at every moment.
//!
//! A rotation starts when the annotation `services.brokkr.dev/rotate` takes a value other than
//! the one last acted on (`status.rotateRequest`), or when `status.nextRotationTime` — the
//! broker's `renew_before`, else its `expires_at` — is reached (the binding is requeued for
//! that time). It
//! 1. records the successor, a new OSB binding id and a new Secret name, in
//!    `status.successorBinding` before any call, so that a restarted controller binds that id
//!    again and never another;
//! 2. binds it with `predecessor_binding_id` and the spec's parameters as they are now (a 202
//!    is polled, then the binding fetched);
//! 3. writes its credentials to the new, immutable Secret and moves `status.binding.name` to it —
//!    servicebinding.io projections and ServiceBindingUsages then roll the workloads — and the
//!    predecessor to `status.previousBinding`, to be unbound after the grace period
//!    (`spec.rotationGracePeriodSeconds`, default 5 min);
//! 4. once that has passed, deletes the predecessor's Secret and unbinds it.
//!
//! A rotation asked for while a predecessor is still bound waits until it is unbound, so a
//! binding never has more than one predecessor. A successor whose bind failed, or whose
//! credentials cannot become a Secret, becomes the binding to unbind at once (it may exist at
//! the broker). A plan without `binding_rotatable` is never rotated: the `Rotating` condition
//! says so and nothing is called. Deleting the ServiceBinding unbinds every binding it has.

use std::time::Duration;

use crate::runner::Action;
use brokkr_osb::client::Poll;
use brokkr_osb::messages::{BindRequest, OperationState};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt as _};
use serde_json::{Map, Value};

use super::secret;
use super::state::{Expiry, RECHECK, Reconcile};
use crate::error::Error;
use crate::identity;
use crate::identity::instance_id;
use crate::platform::osb_context;
use crate::platform::{elapsed_since, humanize, poll_pause};
use crate::resolve::{Resolved, resolve};
use crate::resources::{
    ConditionStatus, CurrentBinding, LocalObjectReference, RotatingBinding,
    ServiceBindingOperation, ServiceInstance,
};

/// The annotation whose every new value asks for a rotation.
pub const ROTATE_ANNOTATION: &str = "services.brokkr.dev/rotate";
/// How long a predecessor's credentials keep working when the spec does not say.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(300);
/// The condition that tells how the last rotation went.
pub(super) const CONDITION: &str = "Rotating";
/// Condition reason: the plan's bindings cannot be rotated.
const NOT_ROTATABLE: &str = "PlanNotRotatable";
/// Condition and Event reason: a rotation waits for the floor between two rotations.
const DEFERRED: &str = "RotationDeferred";

/// The name of a successor's Secret: the binding's Secret name with part of the successor's
/// id, within the 253 characters of a Secret name.
fn successor_secret_name(base: &str, id: &str) -> String {
    let suffix: String = id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(5)
        .collect::<String>()
        .to_ascii_lowercase();
    let keep = 253 - suffix.len() - 1;
    let base = base
        .get(..keep.min(base.len()))
        .unwrap_or(base)
        .trim_end_matches(['-', '.']);
    format!("{base}-{suffix}")
}

/// How long from now `at` is, plus a second for the precision status times lose; zero when
/// it has passed.
fn until(at: Timestamp) -> Duration {
    Duration::try_from(at.duration_since(Timestamp::now()))
        .unwrap_or_default()
        .saturating_add(Duration::from_secs(1))
}

fn is_past(at: Option<&Time>) -> bool {
    at.is_some_and(|t| t.0 <= Timestamp::now())
}

impl Reconcile<'_> {
    pub(super) fn rotate_annotation(&self) -> Option<String> {
        self.binding.annotations().get(ROTATE_ANNOTATION).cloned()
    }

    /// A bound binding: carries on with a rotation, unbinds a predecessor whose grace period
    /// is over, or starts a rotation that was asked for or is due.
    pub(super) async fn rotation(&mut self) -> Result<Action, Error> {
        if self.status.successor_binding.is_some() {
            return self.continue_rotation().await;
        }
        if let Some(previous) = &self.status.previous_binding {
            if previous.current_operation.is_some() || is_past(previous.unbind_after.as_ref()) {
                return self.retire_previous().await;
            }
        } else if let Some((why, by_broker)) = self.rotation_wanted() {
            if let Some(wait) = self.rotation_floor(by_broker).await? {
                return Ok(Action::requeue(wait));
            }
            return self.start_rotation(why).await;
        }
        Ok(self.next_wakeup())
    }

    /// How long a wanted rotation waits for the floor between two rotations of one binding
    /// (`--min-rotation-interval`, from `status.lastRotationTime`), if it does. The first wait
    /// of each rotation is said once: the `Rotating` condition, reason `RotationDeferred`, and
    /// a Warning Event of that reason when it is the broker that asks for more (its
    /// `renew_before`, or `expires_at`, comes sooner), counted in
    /// `brokkr_controller_rotations_deferred_total{asked_by}`.
    async fn rotation_floor(&mut self, by_broker: bool) -> Result<Option<Duration>, Error> {
        let Some(last) = self.status.last_rotation_time.as_ref().map(|t| t.0) else {
            return Ok(None);
        };
        let floor = SignedDuration::try_from(self.ctx.min_rotation_interval).unwrap_or_default();
        let Some(next) = last
            .checked_add(floor)
            .ok()
            .filter(|n| *n > Timestamp::now())
        else {
            return Ok(None);
        };
        let said = self
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == CONDITION && c.reason == DEFERRED);
        if !said {
            let asked_by = if by_broker { "broker" } else { "annotation" };
            self.ctx.metrics.rotation_deferred(asked_by);
            let message = format!(
                "The {asked_by} asks for a rotation sooner than --min-rotation-interval ({}) \
                 after the last one ({last}): it starts at {next}",
                humanize(self.ctx.min_rotation_interval)
            );
            self.set(CONDITION, ConditionStatus::False, DEFERRED, message.clone());
            self.write_status().await?;
            if by_broker {
                self.event(EventType::Warning, DEFERRED, &message, "Rotate")
                    .await;
            }
        }
        Ok(Some(until(next)))
    }

    /// Why the binding should rotate now, if it should, and whether the broker asks for it
    /// (else the annotation).
    pub(super) fn rotation_wanted(&self) -> Option<(String, bool)> {
        if self.rotate_annotation() != self.status.rotate_request {
            return Some((
                format!("asked by the annotation {ROTATE_ANNOTATION}"),
                false,
            ));
        }
        let due = self.status.next_rotation_time.as_ref()?;
        let refused = self
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == CONDITION && c.reason == NOT_ROTATABLE);
        (due.0 <= Timestamp::now() && !refused)
            .then(|| (format!("the broker asks for renewal from {}", due.0), true))
    }

    /// When to look at the binding again: when its predecessor is to be unbound (at once, when
    /// its grace period is already over: nothing else wakes the binding for it) or its
    /// credentials are due for renewal (a renewal already due was refused, and waits for a
    /// change).
    pub(super) fn next_wakeup(&self) -> Action {
        let now = Timestamp::now();
        let retire = (self.status.previous_binding.as_ref())
            .and_then(|p| p.unbind_after.as_ref())
            .map(|t| t.0);
        let renew = (self.status.next_rotation_time.as_ref())
            .map(|t| t.0)
            .filter(|t| *t > now);
        [retire, renew]
            .into_iter()
            .flatten()
            .min()
            .map_or_else(Action::await_change, |t| Action::requeue(until(t)))
    }

    /// The instance the binding is bound to and its broker; `None`, with the condition saying
    /// why, when either cannot be found.
    pub(super) async fn bound_broker(
        &mut self,
    ) -> Result<Option<(ServiceInstance, Resolved)>, Error> {
        let name = identity::bound_instance_name(self.binding).to_owned();
        let instances =
            Api::<ServiceInstance>::namespaced(self.ctx.client.clone(), &self.namespace);
        let why = match instances.get_opt(&name).await? {
            Some(instance) if identity::instance_replaced(self.binding, &instance).is_some() => {
                format!("the ServiceInstance {name:?} was re-created since it was bound")
            }
            Some(instance) => match resolve(&instance, self.ctx).await? {
                Ok(resolved) => return Ok(Some((instance, resolved))),
                Err(missing) => missing.to_string(),
            },
            None => format!("the ServiceInstance {name:?} does not exist"),
        };
        let rotating =
            self.status.successor_binding.is_some() || self.status.previous_binding.is_some();
        let status = if rotating {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        };
        self.set(
            CONDITION,
            status,
            "RotationBlocked",
            format!("cannot call the broker: {why}"),
        );
        self.write_status().await?;
        Ok(None)
    }

    /// Starts a rotation: the successor is recorded, then bound.
    async fn start_rotation(&mut self, why: String) -> Result<Action, Error> {
        let Some((instance, resolved)) = self.bound_broker().await? else {
            return Ok(Action::requeue(RECHECK));
        };
        if resolved.plan.binding_rotatable != Some(true) {
            self.status.rotate_request = self.rotate_annotation();
            let message = format!(
                "the plan {} of the class {} is not binding_rotatable: its bindings cannot be rotated (delete and re-create the ServiceBinding for new credentials)",
                resolved.plan.external_name, resolved.class.external_name
            );
            let said = self
                .status
                .conditions
                .iter()
                .any(|c| c.type_ == CONDITION && c.reason == NOT_ROTATABLE);
            self.set(
                CONDITION,
                ConditionStatus::False,
                NOT_ROTATABLE,
                message.clone(),
            );
            self.write_status().await?;
            if !said {
                self.event(EventType::Warning, NOT_ROTATABLE, &message, "Rotate")
                    .await;
            }
            return Ok(self.next_wakeup());
        }
        if let Some(wait) = self.ctx.backoffs.wait(&self.uid()) {
            // The last rotation failed: the next waits its turn.
            return Ok(Action::requeue(wait));
        }
        // A bind starts an operation at the broker: only from the object as it is now.
        if crate::status::status_is_stale(&self.bindings, self.binding, &self.ctx.written).await? {
            return Ok(Action::requeue(crate::status::STALE_RETRY));
        }
        let id = uuid::Uuid::new_v4().to_string();
        let secret_name = successor_secret_name(&secret::name(self.binding), &id);
        self.status.rotate_request = self.rotate_annotation();
        self.status.successor_binding = Some(RotatingBinding {
            external_id: id.clone(),
            secret_name,
            operation_start_time: Some(Time(Timestamp::now())),
            ..RotatingBinding::default()
        });
        let message = format!(
            "Rotating the credentials ({why}): binding {id:?} as the successor of {:?}",
            self.current_id()
        );
        self.set(
            CONDITION,
            ConditionStatus::True,
            "BindingSuccessor",
            message.clone(),
        );
        self.write_status().await?;
        self.event(EventType::Normal, "RotationStarted", &message, "Rotate")
            .await;
        self.bind_successor(&instance, &resolved, &id).await
    }

    /// Carries on with the recorded successor: polls its bind, or binds it (again).
    async fn continue_rotation(&mut self) -> Result<Action, Error> {
        let Some((instance, resolved)) = self.bound_broker().await? else {
            return Ok(Action::requeue(RECHECK));
        };
        let successor = self.status.successor_binding.clone().unwrap_or_default();
        if successor.current_operation == Some(ServiceBindingOperation::Bind) {
            return self.poll_successor(&instance, &resolved, successor).await;
        }
        if let Some(wait) = self.ctx.backoffs.wait(&self.uid()) {
            return Ok(Action::requeue(wait));
        }
        self.bind_successor(&instance, &resolved, &successor.external_id)
            .await
    }

    /// Binds the successor `id` with `predecessor_binding_id`.
    async fn bind_successor(
        &mut self,
        instance: &ServiceInstance,
        resolved: &Resolved,
        id: &str,
    ) -> Result<Action, Error> {
        let params = match self.parameters().await? {
            Ok(params) => params,
            Err(invalid) => {
                let message = format!("the parameters cannot be built: {invalid}");
                return self.rotation_failed("ErrorWithParameters", message).await;
            }
        };
        let request = BindRequest {
            service_id: resolved.class.external_id.clone(),
            plan_id: resolved.plan.external_id.clone(),
            context: Some(osb_context(instance, self.ctx)),
            parameters: params.merged,
            predecessor_binding_id: Some(self.current_id()),
            ..BindRequest::default()
        };
        let answer = resolved
            .osb
            .bind(&instance_id(instance), id, &request, true)
            .await;
        self.ctx.metrics.osb_call("bind", &answer);
        match answer {
            Ok(response) if response.is_async() => {
                if let Some(successor) = &mut self.status.successor_binding {
                    successor.current_operation = Some(ServiceBindingOperation::Bind);
                    successor.last_operation = response.body.operation.clone();
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
                self.finish_rotation(
                    instance,
                    resolved,
                    binding.credentials.unwrap_or_default(),
                    expiry,
                )
                .await
            }
            Err(e) if matches!(e.status().map(|s| s.as_u16()), Some(400 | 409 | 422)) => {
                let said = resolved.said(&e);
                self.rotation_failed("RotationFailed", format!("Bind call failed: {said}"))
                    .await
            }
            Err(e) => {
                // It may have bound, or not been reached: the same id is bound again.
                let said = resolved.said(&e);
                let message =
                    format!("Bind call failed: {said}; binding the successor {id:?} again");
                self.set(
                    CONDITION,
                    ConditionStatus::True,
                    "BindCallFailed",
                    message.clone(),
                );
                self.write_status().await?;
                self.event(EventType::Warning, "BindCallFailed", &message, "Rotate")
                    .await;
                Ok(Action::requeue(self.ctx.backoffs.failed(&self.uid())))
            }
        }
    }

    /// Polls the successor's asynchronous bind; once it succeeded, fetches its credentials.
    async fn poll_successor(
        &mut self,
        instance: &ServiceInstance,
        resolved: &Resolved,
        successor: RotatingBinding,
    ) -> Result<Action, Error> {
        let poll = Poll::binding(instance_id(instance), successor.external_id.clone())
            .operation(successor.last_operation.clone())
            .plan(resolved.plan_ref());
        let answer = resolved.osb.last_operation(&poll).await;
        self.ctx.metrics.osb_call("last_operation", &answer);
        let response = match answer {
            Ok(response) => response,
            Err(e) if e.status().is_some_and(|s| s.as_u16() == 410) => {
                let message = "the broker no longer knows the successor's bind".to_owned();
                return self.rotation_failed("RotationFailed", message).await;
            }
            Err(e) => return Err(e.into()),
        };
        match response.body.state {
            OperationState::InProgress => {
                let elapsed = elapsed_since(successor.operation_start_time.as_ref());
                if elapsed > resolved.max_polling() {
                    let message = format!(
                        "the broker did not finish the bind within {}",
                        humanize(resolved.max_polling())
                    );
                    return self.rotation_failed("RotationFailed", message).await;
                }
                Ok(Action::requeue(poll_pause(response.retry_after, elapsed)))
            }
            OperationState::Succeeded => {
                let fetched = resolved
                    .osb
                    .binding(
                        &instance_id(instance),
                        &successor.external_id,
                        Some(&resolved.plan_ref()),
                    )
                    .await;
                self.ctx.metrics.osb_call("fetch_binding", &fetched);
                let binding = fetched?.body;
                let expiry = Expiry::of(binding.metadata.as_ref());
                self.finish_rotation(
                    instance,
                    resolved,
                    binding.credentials.unwrap_or_default(),
                    expiry,
                )
                .await
            }
            OperationState::Failed => {
                let message = format!(
                    "Bind failed: {}",
                    response
                        .body
                        .description
                        .unwrap_or_else(|| "the broker gave no reason".into())
                );
                self.rotation_failed("RotationFailed", message).await
            }
        }
    }

    /// The successor is bound: its credentials go to its own Secret, `status.binding` moves
    /// to it, and the predecessor waits out its grace period.
    async fn finish_rotation(
        &mut self,
        instance: &ServiceInstance,
        resolved: &Resolved,
        credentials: Map<String, Value>,
        expiry: Expiry,
    ) -> Result<Action, Error> {
        let Some(successor) = self.status.successor_binding.clone() else {
            return Ok(Action::requeue(Duration::from_secs(1)));
        };
        let others = self.transform_sources().await?;
        let contents = match secret::contents(
            credentials,
            &resolved.class.external_name,
            &self.binding.spec.secret_transforms,
            &others,
        ) {
            Ok(contents) => contents,
            Err(unusable) => {
                return self
                    .rotation_failed("RotationFailed", unusable.to_string())
                    .await;
            }
        };
        let name = successor.secret_name.clone();
        let seen = self.ctx.caches.secret(&self.namespace, &name).is_some();
        if secret::write(&self.secrets, self.binding, &name, contents, true, seen).await?
            == secret::Written::NotOwned
        {
            let message = format!(
                "a Secret {name:?} that this ServiceBinding does not own exists; it is never overwritten"
            );
            return self.rotation_failed("SecretNotOwned", message).await;
        }
        let now = Timestamp::now();
        let grace = self
            .binding
            .spec
            .rotation_grace_period_seconds
            .map_or(DEFAULT_GRACE_PERIOD, Duration::from_secs);
        let unbind_after = now
            .checked_add(SignedDuration::try_from(grace).unwrap_or(SignedDuration::MAX))
            .unwrap_or(Timestamp::MAX);
        let predecessor = RotatingBinding {
            external_id: self.current_id(),
            secret_name: self.current_secret(),
            unbind_after: Some(Time(unbind_after)),
            ..RotatingBinding::default()
        };
        let message = format!(
            "The credentials of the binding {:?} are in the new Secret {name:?}; the predecessor {:?} and its Secret {:?} go in {}",
            successor.external_id,
            predecessor.external_id,
            predecessor.secret_name,
            humanize(grace)
        );
        self.status.current_binding = Some(CurrentBinding {
            external_id: successor.external_id,
            secret_name: name.clone(),
        });
        self.status.binding = Some(LocalObjectReference { name: name.clone() });
        self.status.previous_binding = Some(predecessor);
        self.status.successor_binding = None;
        self.status.last_rotation_time = Some(Time(now));
        self.status.expires_at = expiry.expires_at.map(Time);
        self.status.next_rotation_time = expiry.due().map(Time);
        self.note_times(&expiry);
        self.ctx.backoffs.forget(&self.uid());
        self.set(
            CONDITION,
            ConditionStatus::True,
            "PredecessorGracePeriod",
            message.clone(),
        );
        self.set(
            "Ready",
            ConditionStatus::True,
            "InjectedBindResult",
            format!(
                "The credentials of the ServiceInstance {:?} are in the Secret {name:?}",
                instance.name_any()
            ),
        );
        self.write_status().await?;
        self.event(EventType::Normal, "Rotated", &message, "Rotate")
            .await;
        Ok(self.next_wakeup())
    }

    /// A rotation that cannot go on: a successor the broker may have becomes the binding to
    /// unbind at once; the next rotation waits its backoff (a due one is tried again then, one
    /// asked for waits for the annotation to change again).
    async fn rotation_failed(&mut self, reason: &str, message: String) -> Result<Action, Error> {
        self.ctx.backoffs.failed(&self.uid());
        if let Some(successor) = self.status.successor_binding.take() {
            self.status.previous_binding = Some(RotatingBinding {
                unbind_after: Some(Time(Timestamp::now())),
                current_operation: None,
                last_operation: None,
                operation_start_time: None,
                ..successor
            });
        }
        self.set(CONDITION, ConditionStatus::False, reason, message.clone());
        self.write_status().await?;
        self.event(EventType::Warning, reason, &message, "Rotate")
            .await;
        Ok(Action::requeue(Duration::from_secs(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renewal_is_due_at_renew_before_else_at_expiry() {
        let both = Expiry::of(Some(&json!({"expires_at": "2026-12-27T18:03:15.4Z",
            "renew_before": "2026-12-20T18:03:15.4Z"})));
        assert_eq!(
            both.due().map(|t| t.to_string()).as_deref(),
            Some("2026-12-20T18:03:15.4Z")
        );
        let expiry_only = Expiry::of(Some(&json!({"expires_at": "2026-12-27T18:03:15Z"})));
        assert_eq!(
            expiry_only.due().map(|t| t.to_string()).as_deref(),
            Some("2026-12-27T18:03:15Z")
        );
        assert_eq!(Expiry::of(None).due(), None);
        let unparsable = Expiry::of(Some(&json!({"expires_at": "soon", "renew_before": 7})));
        assert_eq!(unparsable.due(), None);
        assert_eq!(
            unparsable.ignored,
            [Some("expires_at"), Some("renew_before")]
        );
        // Valid times are kept, the end of time too (as the latest time Kubernetes holds).
        let far = Expiry::of(Some(&json!({"expires_at": "9999-12-31T23:59:59Z",
            "renew_before": "9999-12-30T23:00:00+00:00"})));
        assert_eq!(far.expires_at, Some(Timestamp::MAX));
        assert_eq!(far.due(), Some(Timestamp::MAX));
        assert_eq!(far.ignored, [None, None]);
        assert_eq!(Expiry::of(Some(&json!({}))).ignored, [None, None]);
    }

    #[test]
    fn a_successor_secret_is_named_after_the_binding_and_fits() {
        assert_eq!(successor_secret_name("db", "3F2a-91c0-..."), "db-3f2a9");
        let long = "a".repeat(253);
        let name = successor_secret_name(&long, "0123456789");
        assert_eq!(name.len(), 253);
        assert!(name.ends_with("-01234"));
    }
}
