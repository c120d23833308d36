//! What a target is: the [`Target`] trait that every kind of target implements, the [`Scope`]
//! of a call (whom it is for), and what a call answers ([`Readiness`], [`TargetError`]).

use async_trait::async_trait;
use brokkr_blueprint::NamesKey;
use serde_json::{Map, Value};

/// Why a target call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// The server could not be reached or is busy; trying again later may succeed.
    #[error("{0}")]
    Unavailable(String),
    /// The resource is wrong or the server refused it; trying again will not help.
    #[error("{0}")]
    Invalid(String),
}

/// Whether a resource is usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Usable.
    Ready,
    /// Not yet, with what is awaited (shown to users).
    Waiting(String),
}

/// Whom a target call is for: the instance (and binding) and the step whose resources it
/// handles. Targets that label or group what they create (Kubernetes) use it; others may not.
/// The shared-server targets mark what they create with keyed hashes of the ids under
/// `names_key`, never with the ids themselves.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// The instance id.
    pub instance_id: &'a str,
    /// The binding id, for a binding's steps.
    pub binding_id: Option<&'a str>,
    /// The service offering id.
    pub service_id: &'a str,
    /// The plan id (the new one, during an update).
    pub plan_id: &'a str,
    /// The step's name.
    pub step: &'a str,
    /// The OSB `context` of the instance (`namespace`, `platform`, …).
    pub context: &'a Value,
    /// The broker's names key, for the marks of owner records on shared servers.
    pub names_key: &'a NamesKey,
}

/// A place where resources are created.
#[async_trait]
pub trait Target: Send + Sync {
    /// Creates `resource`, or brings an existing one in line with it.
    async fn apply(&self, resource: &Value, scope: &Scope<'_>) -> Result<(), TargetError>;
    /// Removes `resource` and what depends on it; succeeds when it is already gone.
    async fn delete(&self, resource: &Value, scope: &Scope<'_>) -> Result<(), TargetError>;
    /// Whether `resource` is usable now (for example: its user can log in and run a query).
    /// A target that [`watches_readiness`](Self::watches_readiness) may wait here a while for a
    /// change before it answers.
    async fn ready(&self, resource: &Value, scope: &Scope<'_>) -> Result<Readiness, TargetError>;
    /// Whether [`ready`](Self::ready) itself waits for the resource to change (a watch), so
    /// that the caller can ask again at once instead of waiting longer and longer between polls.
    fn watches_readiness(&self) -> bool {
        false
    }
    /// After an update applied `kept`, removes what the step created before and no longer
    /// renders. Targets whose resources cannot go stale need not.
    async fn prune(&self, kept: &[Value], scope: &Scope<'_>) -> Result<(), TargetError> {
        let _ = (kept, scope);
        Ok(())
    }
    /// Checks a rendered resource's shape without contacting the server.
    fn validate(&self, resource: &Value) -> Result<(), TargetError>;
    /// Runs one of a step's rendered `readiness` checks.
    async fn check(&self, check: &Value, scope: &Scope<'_>) -> Result<Readiness, TargetError> {
        let _ = (check, scope);
        Err(TargetError::Invalid(
            "this target has no readiness checks; remove the step's `readiness`".into(),
        ))
    }
    /// Reads values from what the target holds, as one of a step's rendered `read` entries says.
    async fn read(
        &self,
        spec: &Value,
        scope: &Scope<'_>,
    ) -> Result<Map<String, Value>, TargetError> {
        let _ = (spec, scope);
        Err(TargetError::Invalid(
            "this target cannot read values back; remove the step's `read`".into(),
        ))
    }
    /// Writes a binding's credentials under `name`; returns where (shown to operators).
    async fn publish_credentials(
        &self,
        name: &str,
        credentials: &Map<String, Value>,
        scope: &Scope<'_>,
    ) -> Result<Value, TargetError> {
        let _ = (name, credentials, scope);
        Err(TargetError::Invalid(
            "this target cannot hold credentials; remove the step's `secret`".into(),
        ))
    }
    /// Removes the credentials written under `name`; succeeds when they are already gone.
    async fn unpublish_credentials(
        &self,
        name: &str,
        scope: &Scope<'_>,
    ) -> Result<(), TargetError> {
        let _ = (name, scope);
        Err(TargetError::Invalid(
            "this target cannot hold credentials; remove the step's `secret`".into(),
        ))
    }
    /// After a deprovision step deleted all its resources: removes what the target made for the
    /// instance on its own (a namespace it created).
    async fn released(&self, scope: &Scope<'_>) -> Result<(), TargetError> {
        let _ = scope;
        Ok(())
    }
    /// Whether the instance's resources here are usable right now (a server that brokkr runs
    /// and that is down is not); `None` when the target does not know.
    fn instance_usable(&self, instance_id: &str) -> Option<bool> {
        let _ = instance_id;
        None
    }
    /// Why the instance's resources here stay unusable, when the target gave up on bringing
    /// them back (a server that brokkr runs and that does not start); `None` otherwise.
    fn instance_problem(&self, instance_id: &str) -> Option<String> {
        let _ = instance_id;
        None
    }
    /// Why this target cannot make what `template` (a step's template as written, before it is
    /// rendered) describes on this machine, known without trying (a program that is not
    /// installed); `None` when nothing is known against it. Provision refuses such a plan.
    fn cannot_make(&self, template: &Value) -> Option<String> {
        let _ = template;
        None
    }
    /// Called once when the broker stops: a target that runs processes stops them (or not, as
    /// its configuration says).
    async fn shutdown(&self) {}
}
