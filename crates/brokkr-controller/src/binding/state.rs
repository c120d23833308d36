//! One reconcile of one binding, as every phase shares it: the binding, the status being
//! built, the APIs it uses; how it waits, fails and writes; which of its bindings at the
//! broker is current, and when that one's credentials expire.

use std::time::Duration;

use crate::runner::Action;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt as _};
use serde_json::Value;

use super::secret;
use crate::context::Context;
use crate::error::Error;
use crate::identity::binding_id;
use crate::platform::humanize;
use crate::resources::{
    ConditionStatus, CurrentBinding, RotatingBinding, ServiceBinding, ServiceBindingStatus,
    ServiceInstance,
};
use crate::{conditions, platform, status};

/// The finalizer that keeps a ServiceBinding until the broker has unbound it.
pub const FINALIZER: &str = "services.brokkr.dev/service-binding";
/// How often to look again at something only a person or another controller can change.
pub(super) const RECHECK: Duration = Duration::from_secs(10);
/// Status fields that may be absent: sent as `null` so that the merge patch removes them (those
/// of an operation that ended, and `binding` before there is a Secret).
pub(super) const CLEARED_FIELDS: &[&str] = &[
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

/// How long a new binding waits for its instance before its status says so, unless the
/// instance says it is being provisioned.
pub(super) const QUIET_WAIT: Duration = Duration::from_secs(30);
/// How often a binding waiting for its instance looks again although the instance did not
/// change (its changes wake the binding at once: this is a safety net).
pub(super) const WAITING_RESYNC: Duration = Duration::from_secs(5 * 60);
/// How long after a binding became Ready its Secret may be missing from the cache without
/// being read from the API server.
pub(super) const JUST_WRITTEN: Duration = Duration::from_secs(10);

/// One reconcile of one binding: the resource, the status being built, and the APIs it uses.
pub(super) struct Reconcile<'a> {
    pub(super) binding: &'a ServiceBinding,
    pub(super) ctx: &'a Context,
    pub(super) status: ServiceBindingStatus,
    pub(super) bindings: Api<ServiceBinding>,
    pub(super) secrets: Api<Secret>,
    pub(super) namespace: String,
}

/// When the broker says a binding's credentials expire and should be renewed (OSB binding
/// metadata `expires_at`, `renew_before`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Expiry {
    pub(super) expires_at: Option<Timestamp>,
    pub(super) renew_before: Option<Timestamp>,
    /// The fields given that are not RFC 3339 times, and were left out.
    pub(super) ignored: [Option<&'static str>; 2],
}

/// The condition that says a broker's expiry time was not understood.
pub(super) const TIMES_CONDITION: &str = "BrokerTimes";

/// `text` as an RFC 3339 time. A valid time beyond the latest Kubernetes' `Time` holds
/// (`9999-12-30T22:00:00Z`; `9999-12-31T23:59:59Z`, say) is that latest time, and one before
/// the earliest, that one: no renewal is ever due that the broker put at the end of time.
fn rfc3339(text: &str) -> Option<Timestamp> {
    if let Ok(at) = text.parse::<Timestamp>() {
        return Some(at);
    }
    let pieces = k8s_openapi::jiff::fmt::temporal::Pieces::parse(text).ok()?;
    pieces.offset()?;
    pieces.time()?;
    Some(if pieces.date().year() >= 9999 {
        Timestamp::MAX
    } else {
        Timestamp::MIN
    })
}

impl Expiry {
    /// The expiry a bind or fetch answer's `metadata` gives; times that do not parse are left
    /// out, and named in `ignored`.
    pub fn of(metadata: Option<&Value>) -> Self {
        let mut ignored = [None; 2];
        let mut at = |slot: usize, key: &'static str| {
            let given = metadata.and_then(|m| m.get(key)).filter(|v| !v.is_null())?;
            let at = given.as_str().and_then(rfc3339);
            if at.is_none() {
                ignored[slot] = Some(key);
            }
            at
        };
        let expires_at = at(0, "expires_at");
        let renew_before = at(1, "renew_before");
        Self {
            expires_at,
            renew_before,
            ignored,
        }
    }

    /// When to rotate: `renew_before`, else `expires_at`.
    pub(super) fn due(&self) -> Option<Timestamp> {
        self.renew_before.or(self.expires_at)
    }
}

/// A binding of a rotation other than the current one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Slot {
    /// The successor being bound.
    Successor,
    /// The predecessor (or failed successor) to unbind.
    Previous,
}

impl<'a> Reconcile<'a> {
    /// The binding's parameters: `spec.parameters` merged with its `parametersFrom` Secrets.
    pub(super) async fn parameters(
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
    pub(super) async fn instance_named(
        &self,
        name: &str,
    ) -> Result<Option<ServiceInstance>, kube::Error> {
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
    pub(super) async fn secret_exists(&self) -> Result<Option<bool>, kube::Error> {
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

    pub(super) fn new(binding: &'a ServiceBinding, ctx: &'a Context) -> Self {
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

    /// How long the binding may still wait before it fails: the wait timeout, counted from
    /// when `Ready` became False (all of it while `Ready` is not False).
    pub(super) fn wait_left(&self) -> Duration {
        let since = self
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready" && c.status == ConditionStatus::False)
            .and_then(|c| c.last_transition_time.as_ref())
            .map_or_else(Timestamp::now, |t| t.0);
        let waited = Duration::try_from(Timestamp::now().duration_since(since)).unwrap_or_default();
        self.ctx.wait_timeout.saturating_sub(waited)
    }

    /// Waits for something to appear, up to the wait timeout counted from when `Ready` became
    /// False; then fails.
    pub(super) async fn wait(&mut self, reason: &str, message: String) -> Result<Action, Error> {
        if self.wait_left().is_zero() {
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
    pub(super) async fn refuse(&mut self, reason: &str, message: String) -> Result<Action, Error> {
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
    pub(super) fn uid(&self) -> String {
        self.binding.uid().unwrap_or_default()
    }

    /// Ends in `Failed=True` (until the spec changes).
    pub(super) async fn fail(&mut self, reason: &str, message: String) -> Result<Action, Error> {
        self.end_operation();
        self.set("Failed", ConditionStatus::True, reason, message.clone());
        self.set("Ready", ConditionStatus::False, reason, message.clone());
        self.write_status().await?;
        self.event(EventType::Warning, reason, &message, "Bind")
            .await;
        Ok(Action::await_change())
    }

    pub(super) fn end_operation(&mut self) {
        self.status.async_op_in_progress = false;
        self.status.current_operation = None;
        self.status.last_operation = None;
        self.status.operation_start_time = None;
        self.status.in_progress_properties = None;
    }

    pub(super) fn condition_is(&self, type_: &str, value: ConditionStatus) -> bool {
        self.status
            .conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == value)
    }

    pub(super) fn set(
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

    pub(super) async fn write_status(&self) -> Result<(), Error> {
        if platform::goes_with_namespace(self.binding, self.ctx)
            && !self.status.async_op_in_progress
        {
            return Ok(());
        }
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
    pub(super) async fn event(&self, type_: EventType, reason: &str, note: &str, action: &str) {
        platform::event(self.ctx, self.binding, type_, reason, note, action).await;
    }
}

impl Reconcile<'_> {
    /// The OSB id of the binding whose credentials are in the Secret now.
    pub(super) fn current_id(&self) -> String {
        self.status
            .current_binding
            .as_ref()
            .map_or_else(|| binding_id(self.binding), |c| c.external_id.clone())
    }

    /// The Secret with the current credentials.
    pub(super) fn current_secret(&self) -> String {
        self.status
            .current_binding
            .as_ref()
            .map_or_else(|| secret::name(self.binding), |c| c.secret_name.clone())
    }

    /// After credentials were published: records whose they are and when they expire. The
    /// first time, the rotate annotation as it is counts as acted on.
    pub(super) fn record_current(&mut self, expiry: Expiry) {
        if self.status.current_binding.is_none() {
            self.status.rotate_request = self.rotate_annotation();
        }
        self.status.current_binding = Some(CurrentBinding {
            external_id: self.current_id(),
            secret_name: self.current_secret(),
        });
        self.status.expires_at = expiry.expires_at.map(Time);
        self.status.next_rotation_time = expiry.due().map(Time);
        self.note_times(&expiry);
    }

    /// Says in the condition [`TIMES_CONDITION`] which of the broker's expiry times were not
    /// RFC 3339 times and were ignored; drops it when none was.
    pub(super) fn note_times(&mut self, expiry: &Expiry) {
        let ignored: Vec<&str> = expiry.ignored.iter().flatten().copied().collect();
        if ignored.is_empty() {
            self.status
                .conditions
                .retain(|c| c.type_ != TIMES_CONDITION);
            return;
        }
        self.set(
            TIMES_CONDITION,
            ConditionStatus::False,
            "UnparsableTime",
            format!(
                "the broker's {} of the current credentials is not an RFC 3339 time, and was \
                 ignored: the binding does not rotate by it",
                ignored.join(" and ")
            ),
        );
    }

    pub(super) fn slot(&mut self, slot: Slot) -> &mut Option<RotatingBinding> {
        match slot {
            Slot::Successor => &mut self.status.successor_binding,
            Slot::Previous => &mut self.status.previous_binding,
        }
    }
}
