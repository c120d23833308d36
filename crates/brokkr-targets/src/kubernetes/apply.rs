//! Applying and pruning: a rendered object is stamped with brokkr's labels, annotations and
//! namespace and applied server-side, and the API server's answer kept for the readiness check
//! that follows; the objects of a step that an update no longer renders are pruned.

use std::collections::BTreeSet;

use brokkr_blueprint::{NamespacePolicy, PvcPolicy};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tracing::info;

use super::claims::label_claim_templates;
use super::cluster::{Kubernetes, ObjectRef, RefMeta};
use super::names::{
    BINDING, INSTANCE, MANAGED_BY, MANAGER, STEP, annotations, label_value, labels, merge_into,
};
use crate::target::{Scope, Target, TargetError};

/// How many apply answers are kept for the readiness checks that follow them.
const APPLIED_KEPT: usize = 4096;

/// Kinds [`Target::prune`] looks at besides those of the new render and those seen before.
const COMMON_KINDS: &[(&str, &str)] = &[
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("v1", "PersistentVolumeClaim"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "Deployment"),
    ("batch/v1", "Job"),
    ("policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
];

impl Kubernetes {
    /// Applies `resource` (see [`Target::apply`]).
    pub(super) async fn apply_object(
        &self,
        resource: &Value,
        scope: &Scope<'_>,
    ) -> Result<(), TargetError> {
        self.validate(resource)?;
        let r = self.object_ref(resource)?;
        let at = self.locate(&r, scope).await?;
        if let (Some(ns), NamespacePolicy::PerInstance) = (&at.namespace, &self.namespace) {
            self.ensure_namespace(ns, scope).await?;
        }
        self.check_owner(&at, r.name(), scope).await?;
        let body = self.stamp(resource, at.namespace.as_deref(), scope);
        let params = PatchParams::apply(MANAGER).force();
        let applied = at
            .api
            .patch(r.name(), &params, &Patch::Apply(&body))
            .await
            .map_err(|e| self.error(&format!("applying {}", at.what), e))?;
        let mut cache = self.applied.lock().expect("lock");
        // Bounded: an apply whose readiness is never asked leaves its entry behind.
        if cache.len() >= APPLIED_KEPT {
            cache.clear();
        }
        cache.insert(Self::object_key(&at, &r), applied);
        Ok(())
    }

    /// Deletes the objects of `scope`'s step that are not in `kept` (see [`Target::prune`]).
    pub(super) async fn prune_unrendered(
        &self,
        kept: &[Value],
        scope: &Scope<'_>,
    ) -> Result<(), TargetError> {
        let mut refs = Vec::new();
        for k in kept {
            refs.push(self.object_ref(k)?);
        }
        let keep: BTreeSet<(String, String)> = refs
            .iter()
            .map(|r| (r.kind.clone(), r.name().to_owned()))
            .collect();
        let mut kinds: BTreeSet<(String, String)> = COMMON_KINDS
            .iter()
            .map(|(v, k)| ((*v).to_owned(), (*k).to_owned()))
            .collect();
        kinds.extend(refs.iter().map(|r| (r.api_version.clone(), r.kind.clone())));
        kinds.extend(self.kinds.lock().expect("lock").keys().cloned());
        let selector = Self::step_selector(scope);
        for (api_version, kind) in kinds {
            let probe = ObjectRef {
                api_version: api_version.clone(),
                kind: kind.clone(),
                metadata: RefMeta::default(),
                name: Some("-".into()),
            };
            // A kind this cluster does not serve holds nothing to prune.
            let Ok(at) = self.locate(&probe, scope).await else {
                continue;
            };
            let list = match at.api.list(&ListParams::default().labels(&selector)).await {
                Ok(list) => list,
                Err(kube::Error::Api(s)) if matches!(s.code, 403 | 404) => continue,
                Err(e) => return Err(self.error(&format!("listing {kind}"), e)),
            };
            for stale in list {
                let name = stale.metadata.name.clone().unwrap_or_default();
                if keep.contains(&(kind.clone(), name.clone())) {
                    continue;
                }
                // The live object's annotation, as it was applied, says what happens to claims.
                let live = serde_json::to_value(&stale).unwrap_or_default();
                let policy = self.pvc_policy(&live).unwrap_or(self.pvc_policy);
                if kind == "PersistentVolumeClaim" && policy == PvcPolicy::Retain {
                    continue;
                }
                info!(target = %self.name, kind = %kind, name = %name, "pruning");
                match at.api.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(self.error(&format!("pruning {kind} {name}"), e)),
                }
                // A pruned StatefulSet's claims go with it, as on deprovision; they are marked
                // for deletion here and go once its Pods are gone.
                if kind == "StatefulSet"
                    && policy == PvcPolicy::Delete
                    && let Some(ns) = &at.namespace
                {
                    self.delete_claims(ns, &name, scope).await?;
                }
            }
        }
        Ok(())
    }

    /// Adds brokkr's labels, annotations and namespace to a rendered object.
    fn stamp(&self, resource: &Value, ns: Option<&str>, scope: &Scope<'_>) -> Value {
        let mut body = resource.clone();
        let metadata = &mut body["metadata"];
        if let Some(ns) = ns {
            metadata["namespace"] = json!(ns);
        }
        merge_into(&mut metadata["labels"], labels(scope));
        merge_into(&mut metadata["annotations"], annotations(scope));
        if body["kind"] == "StatefulSet" {
            let name = resource["metadata"]["name"].as_str().unwrap_or_default();
            label_claim_templates(&mut body, name, scope);
        }
        body
    }

    /// The label selector of the objects a step of `scope` applied.
    fn step_selector(scope: &Scope<'_>) -> String {
        let mut selector = format!(
            "{MANAGED_BY}={MANAGER},{INSTANCE}={},{STEP}={}",
            label_value(scope.instance_id),
            label_value(scope.step)
        );
        match scope.binding_id {
            Some(b) => selector.push_str(&format!(",{BINDING}={}", label_value(b))),
            None => selector.push_str(&format!(",!{BINDING}")),
        }
        selector
    }
}
