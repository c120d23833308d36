//! The per-instance namespace: created with an instance's first object, annotated with each
//! step that has objects in it, and deleted once the last of them is deprovisioned (kept while
//! it holds claims, which only a `retain` policy leaves behind).

use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Map, json};
use tracing::info;

use super::cluster::{Kubernetes, Located};
use super::names::{
    INSTANCE, MANAGED_BY, MANAGER, STEP_ANNOTATION, instance_namespace, label_value,
    step_annotation,
};
use crate::target::{Scope, TargetError};

impl Kubernetes {
    /// Creates the per-instance namespace if needed and records that `scope.step` uses it.
    pub(super) async fn ensure_namespace(
        &self,
        ns: &str,
        scope: &Scope<'_>,
    ) -> Result<(), TargetError> {
        let client = self.client().await?;
        let api: Api<Namespace> = Api::all(client.clone());
        let step_key = step_annotation(scope.step);
        let existing = api
            .get_opt(ns)
            .await
            .map_err(|e| self.error(&format!("reading namespace {ns}"), e))?;
        match existing {
            None => {
                let mut labels = Map::new();
                labels.insert(MANAGED_BY.into(), json!(MANAGER));
                labels.insert(INSTANCE.into(), json!(label_value(scope.instance_id)));
                let body: Namespace = serde_json::from_value(json!({
                    "metadata": {
                        "name": ns,
                        "labels": labels,
                        "annotations": {INSTANCE: scope.instance_id, step_key: scope.step},
                    },
                }))
                .expect("a namespace");
                let params = PostParams {
                    field_manager: Some(MANAGER.into()),
                    ..Default::default()
                };
                api.create(&params, &body)
                    .await
                    .map_err(|e| self.error(&format!("creating namespace {ns}"), e))?;
            }
            Some(found) => {
                let annotations = found.metadata.annotations.unwrap_or_default();
                if annotations.get(INSTANCE).map(String::as_str) != Some(scope.instance_id) {
                    return Err(self.invalid(format!(
                        "namespace {ns} exists and does not belong to this instance"
                    )));
                }
                if !annotations.contains_key(&step_key) {
                    let patch = json!({"metadata": {"annotations": {step_key: scope.step}}});
                    api.patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map_err(|e| self.error(&format!("annotating namespace {ns}"), e))?;
                }
            }
        }
        Ok(())
    }

    /// After a deprovision step: forgets the step and deletes the namespace if no step is left.
    pub(super) async fn release_namespace(&self, scope: &Scope<'_>) -> Result<(), TargetError> {
        let ns = instance_namespace(scope.instance_id);
        let client = self.client().await?;
        let api: Api<Namespace> = Api::all(client.clone());
        let Some(found) = api
            .get_opt(&ns)
            .await
            .map_err(|e| self.error(&format!("reading namespace {ns}"), e))?
        else {
            return Ok(());
        };
        let annotations = found.metadata.annotations.unwrap_or_default();
        if annotations.get(INSTANCE).map(String::as_str) != Some(scope.instance_id) {
            return Ok(());
        }
        let step_key = step_annotation(scope.step);
        if annotations.contains_key(&step_key) && found.metadata.deletion_timestamp.is_none() {
            let patch = json!({"metadata": {"annotations": {step_key.clone(): null}}});
            api.patch(&ns, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| self.error(&format!("annotating namespace {ns}"), e))?;
        }
        let others = annotations
            .keys()
            .any(|k| k.starts_with(STEP_ANNOTATION) && *k != step_key);
        if others {
            return Ok(()); // another step still has objects in it
        }
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        let retained = claims
            .list(&ListParams::default())
            .await
            .map_err(|e| self.error(&format!("listing the claims in namespace {ns}"), e))?;
        // A claim on its way out (held by `pvc-protection` until its Pod is gone, or being
        // removed by an operator) is waited for; only a live one means the data is kept.
        let (leaving, kept): (Vec<_>, Vec<_>) = retained
            .items
            .iter()
            .partition(|c| c.metadata.deletion_timestamp.is_some());
        if !kept.is_empty() {
            info!(target = %self.name, namespace = %ns, "namespace kept: it holds retained claims");
            return Ok(());
        }
        if let Some(claim) = leaving.first() {
            let name = claim.metadata.name.as_deref().unwrap_or_default();
            return Err(TargetError::Unavailable(format!(
                "waiting for PersistentVolumeClaim {name} to be deleted before namespace {ns}"
            )));
        }
        let kind = self.kind(client, "v1", "Namespace").await?;
        let at = Located {
            api: Api::all_with(client.clone(), &kind.resource),
            namespace: None,
            what: format!("namespace {ns}"),
        };
        let gone = found.metadata.deletion_timestamp.is_none()
            && self
                .delete_and_check(&at, &ns, found.metadata.uid.clone(), false)
                .await?
                .is_none();
        match gone {
            true => Ok(()),
            false => Err(TargetError::Unavailable(format!(
                "waiting for {} to be deleted",
                at.what
            ))),
        }
    }
}
