//! PersistentVolumeClaims and the PVC policy: the claims a StatefulSet's volume claim templates
//! create are labelled so they can be found again, and deleted with their StatefulSet unless the
//! policy (the target's `pvc_policy`, or the annotation `brokkr.dev/pvc-policy` on the object)
//! is `retain`.

use brokkr_blueprint::PvcPolicy;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};

use super::cluster::Kubernetes;
use super::names::{CLAIM_OF, INSTANCE, MANAGED_BY, MANAGER, PVC_POLICY, label_value, merge_into};
use super::watch;
use crate::target::{Scope, TargetError};

/// Labels the volume claim templates of `statefulset` (a rendered StatefulSet named `name`)
/// with the managed-by and instance labels and `brokkr.dev/claim-of`.
pub(super) fn label_claim_templates(statefulset: &mut Value, name: &str, scope: &Scope<'_>) {
    let Some(templates) = statefulset["spec"]["volumeClaimTemplates"].as_array_mut() else {
        return;
    };
    // Only labels that never change: volume claim templates are immutable.
    let claim = json!({
        MANAGED_BY: MANAGER,
        INSTANCE: label_value(scope.instance_id),
        CLAIM_OF: label_value(name),
    });
    for t in templates {
        merge_into(
            &mut t["metadata"]["labels"],
            claim.as_object().cloned().unwrap_or_default(),
        );
    }
}

impl Kubernetes {
    /// The PVC policy for a rendered object.
    pub(super) fn pvc_policy(&self, resource: &Value) -> Result<PvcPolicy, TargetError> {
        match resource["metadata"]["annotations"][PVC_POLICY].as_str() {
            None => Ok(self.pvc_policy),
            Some("delete") => Ok(PvcPolicy::Delete),
            Some("retain") => Ok(PvcPolicy::Retain),
            Some(other) => Err(self.invalid(format!(
                "annotation {PVC_POLICY} is {other:?}; it is `delete` or `retain`"
            ))),
        }
    }

    /// Deletes the claims of a StatefulSet's volume claim templates; answers whether all are gone.
    pub(super) async fn delete_claims(
        &self,
        ns: &str,
        statefulset: &str,
        scope: &Scope<'_>,
    ) -> Result<Option<String>, TargetError> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client().await?.clone(), ns);
        let selector = format!(
            "{INSTANCE}={},{CLAIM_OF}={}",
            label_value(scope.instance_id),
            label_value(statefulset)
        );
        let claims = api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| {
                self.error(
                    &format!("listing the claims of StatefulSet {statefulset}"),
                    e,
                )
            })?;
        let mut going = Vec::new();
        for claim in claims {
            if claim.metadata.deletion_timestamp.is_some() {
                going.push(claim);
                continue;
            }
            let name = claim.name_any();
            match api.delete(&name, &DeleteParams::background()).await {
                // Left: still there (the `kubernetes.io/pvc-protection` finalizer holds it
                // while a Pod uses it).
                Ok(answer) => going.extend(answer.left()),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    return Err(self.error(&format!("deleting PersistentVolumeClaim {name}"), e));
                }
            }
        }
        for claim in going {
            if !watch::await_gone(&api, &claim, self.watch_for).await {
                return Ok(Some(format!(
                    "waiting for PersistentVolumeClaim {} to be deleted",
                    claim.name_any()
                )));
            }
        }
        Ok(None)
    }
}
