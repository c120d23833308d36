//! The `kubernetes` target: a plan's resources are Kubernetes objects of any kind (CRDs too).
//!
//! Each rendered resource is a full manifest (`apiVersion`, `kind`, `metadata.name`, …). brokkr
//! resolves its kind by discovery, places it in the namespace the target's policy gives
//! (`fixed`, `from-context` or `per-instance`), labels it and applies it server-side with the
//! field manager `brokkr`:
//!
//! | label | value |
//! |---|---|
//! | `app.kubernetes.io/managed-by` | `brokkr` |
//! | `brokkr.dev/instance-id`, `brokkr.dev/binding-id` | the ids (hashed when not a valid label value; the full ids are in annotations of the same names) |
//! | `brokkr.dev/service`, `brokkr.dev/plan` | the service offering and plan ids |
//! | `brokkr.dev/step` | the blueprint step's name |
//!
//! A StatefulSet's `volumeClaimTemplates` get the managed-by and instance labels and
//! `brokkr.dev/claim-of: <StatefulSet>`, so the claims it creates can be found again.
//!
//! [`Target::delete`] returns only once the object is gone (foreground deletion: its dependents
//! go first); until then it answers [`TargetError::Unavailable`] ("waiting for StatefulSet pg to
//! be deleted") and the engine polls it with a growing wait. Deleting a StatefulSet also deletes
//! the claims of its volume claim templates, unless the PVC policy is `retain` (the target's
//! `pvc_policy`, or the annotation `brokkr.dev/pvc-policy` on the rendered object); a rendered
//! PersistentVolumeClaim follows the same policy. [`Target::prune`] deletes the objects labelled
//! with the instance and step that an update no longer renders, claims by the same policy (read
//! from the live object's annotation). [`readiness`] holds the
//! built-in rules and the checks a step declares.
//!
//! A binding step may publish the bind's credentials as a Secret of type
//! `servicebinding.io/<type>` in the instance's namespace ([`Target::publish_credentials`]),
//! with the entries [`brokkr_servicebinding::BindingSecret`] gives.
//!
//! This module implements [`Target`] for the target, [`Kubernetes`]; the rest lives by idea:
//! `cluster` (the target itself, the objects it names and where they live), `client` (the
//! client and kind discovery), `apply` (stamping, applying and pruning),
//! `ownership` (never taking over or deleting another's object), `claims` (the PVC policy),
//! `watch` (waiting for readiness or deletion by watching), `pods` (what holds a
//! workload's Pods back, in the words of the wait), `namespace` (the per-instance
//! namespace), `secret` (the binding Secret), `names` (labels, annotations and names) and
//! [`readiness`] (the rules).

use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use brokkr_blueprint::{NamespacePolicy, PvcPolicy};
use serde_json::{Map, Value};
use tracing::info;

use crate::target::{Readiness, Scope, Target, TargetError};

mod apply;
mod claims;
mod client;
mod cluster;
mod names;
mod namespace;
mod ownership;
mod pods;
pub mod readiness;
mod secret;
mod watch;

pub use cluster::{Kubernetes, facts};
pub use names::{
    BINDING, CLAIM_OF, INSTANCE, MANAGED_BY, MANAGER, PLAN, PVC_POLICY, SERVICE, STEP,
    instance_namespace, label_value,
};

#[async_trait]
impl Target for Kubernetes {
    async fn apply(&self, resource: &Value, scope: &Scope<'_>) -> Result<(), TargetError> {
        self.apply_object(resource, scope).await
    }

    async fn delete(&self, resource: &Value, scope: &Scope<'_>) -> Result<(), TargetError> {
        let r = self.object_ref(resource)?;
        let at = self.locate(&r, scope).await?;
        self.applied
            .lock()
            .expect("lock")
            .remove(&Self::object_key(&at, &r));
        let policy = self.pvc_policy(resource)?;
        if r.kind == "PersistentVolumeClaim" && r.api_version == "v1" && policy == PvcPolicy::Retain
        {
            info!(target = %self.name, claim = r.name(), "PersistentVolumeClaim retained");
            return Ok(());
        }
        // Dependents first (a StatefulSet's Pods), except for kinds that have none worth
        // waiting for: those go at once, and the garbage collector has nothing to track.
        let foreground = !readiness::without_status(&r.kind);
        if let Some(going) = self.delete_own(&at, r.name(), scope, foreground).await?
            && !watch::await_gone(&at.api, &going, self.watch_for).await
        {
            return Err(TargetError::Unavailable(format!(
                "waiting for {} to be deleted",
                at.what
            )));
        }
        if r.kind == "StatefulSet"
            && policy == PvcPolicy::Delete
            && let Some(ns) = &at.namespace
            && let Some(waiting) = self.delete_claims(ns, r.name(), scope).await?
        {
            return Err(TargetError::Unavailable(waiting));
        }
        Ok(())
    }

    async fn ready(&self, resource: &Value, scope: &Scope<'_>) -> Result<Readiness, TargetError> {
        let r = self.object_ref(resource)?;
        let at = self.locate(&r, scope).await?;
        // Right after an apply, its answer is the object as it is now: enough for a kind whose
        // readiness reads no status, and a place to watch from for one that is not ready yet.
        // A status-driven object the answer shows ready is read again (its controller may not
        // have seen the new spec yet).
        let applied = (self.applied.lock().expect("lock")).remove(&Self::object_key(&at, &r));
        if let Some(answer) = applied {
            let object = serde_json::to_value(&answer).unwrap_or_default();
            match readiness::builtin(&r.kind, &object).map_err(|e| self.invalid(e))? {
                Readiness::Waiting(reason) => {
                    return self.await_change(&at, &r.kind, &answer, reason).await;
                }
                Readiness::Ready if readiness::without_status(&r.kind) => {
                    return Ok(Readiness::Ready);
                }
                Readiness::Ready => {}
            }
        }
        match self.get(&at, r.name()).await? {
            None => Ok(not_created(&at.what).await),
            Some(live) => self.judge(&at, &r.kind, &live).await,
        }
    }

    fn watches_readiness(&self) -> bool {
        true
    }

    async fn prune(&self, kept: &[Value], scope: &Scope<'_>) -> Result<(), TargetError> {
        self.prune_unrendered(kept, scope).await
    }

    fn validate(&self, resource: &Value) -> Result<(), TargetError> {
        let r = self.object_ref(resource)?;
        if !r.api_version.is_empty() && !r.kind.is_empty() && r.metadata.name.is_some() {
            return Ok(());
        }
        Err(self.invalid(format!(
            "{} needs apiVersion, kind and metadata.name",
            r.describe()
        )))
    }

    async fn check(&self, check: &Value, scope: &Scope<'_>) -> Result<Readiness, TargetError> {
        let r = self.object_ref(check)?;
        let rule = readiness::Check::parse(check).map_err(|e| self.invalid(e))?;
        let at = self.locate(&r, scope).await?;
        match self.get(&at, r.name()).await? {
            None => Ok(not_created(&at.what).await),
            Some(live) => {
                Ok(rule.evaluate(&at.what, &serde_json::to_value(live).unwrap_or_default()))
            }
        }
    }

    async fn read(
        &self,
        spec: &Value,
        scope: &Scope<'_>,
    ) -> Result<Map<String, Value>, TargetError> {
        let r = self.object_ref(spec)?;
        let Some(values) = spec["values"].as_object() else {
            return Err(self.invalid(format!(
                "read of {}: `values` maps registry keys to JSON pointers",
                r.describe()
            )));
        };
        let at = self.locate(&r, scope).await?;
        let Some(live) = self.get(&at, r.name()).await? else {
            return Err(TargetError::Unavailable(format!(
                "waiting for {} to be created",
                at.what
            )));
        };
        let live = serde_json::to_value(live).unwrap_or_default();
        let mut out = Map::new();
        for (key, pointer) in values {
            let Some(pointer) = pointer.as_str() else {
                return Err(
                    self.invalid(format!("read of {}: {key} needs a JSON pointer", at.what))
                );
            };
            let Some(found) = live.pointer(pointer) else {
                return Err(TargetError::Unavailable(format!(
                    "waiting for {} to have {pointer}",
                    at.what
                )));
            };
            let value = if r.kind == "Secret" && pointer.starts_with("/data/") {
                let text = found.as_str().unwrap_or_default();
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|_| self.invalid(format!("{} {pointer} is not base64", at.what)))?;
                let text = String::from_utf8(bytes).map_err(|_| {
                    self.invalid(format!("{} {pointer} is not UTF-8 text", at.what))
                })?;
                Value::String(text)
            } else {
                found.clone()
            };
            out.insert(key.clone(), value);
        }
        Ok(out)
    }

    async fn publish_credentials(
        &self,
        name: &str,
        credentials: &Map<String, Value>,
        scope: &Scope<'_>,
    ) -> Result<Value, TargetError> {
        self.write_binding_secret(name, credentials, scope).await
    }

    async fn unpublish_credentials(
        &self,
        name: &str,
        scope: &Scope<'_>,
    ) -> Result<(), TargetError> {
        self.delete_binding_secret(name, scope).await
    }

    async fn released(&self, scope: &Scope<'_>) -> Result<(), TargetError> {
        if self.namespace != NamespacePolicy::PerInstance || scope.binding_id.is_some() {
            return Ok(());
        }
        self.release_namespace(scope).await
    }
}

/// The answer while an object to wait for does not exist yet. There is nothing to watch and the
/// caller asks again at once, so this pauses first.
async fn not_created(what: &str) -> Readiness {
    tokio::time::sleep(Duration::from_secs(1)).await;
    Readiness::Waiting(format!("waiting for {what} to be created"))
}
