//! The binding Secret: a bind's credentials published as a Secret of type
//! `servicebinding.io/<type>` in the instance's namespace, with the entries
//! [`brokkr_servicebinding::BindingSecret`] gives, and deleted on unbind.

use base64::Engine as _;
use brokkr_servicebinding::BindingSecret;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Map, Value, json};

use super::cluster::{Kubernetes, Located};
use super::names::{MANAGER, annotations, is_dns_subdomain, labels, merge_into};
use super::watch;
use crate::target::{Scope, TargetError};

impl Kubernetes {
    /// Writes the binding Secret `name` (see [`crate::target::Target::publish_credentials`]).
    pub(super) async fn write_binding_secret(
        &self,
        name: &str,
        credentials: &Map<String, Value>,
        scope: &Scope<'_>,
    ) -> Result<Value, TargetError> {
        if !is_dns_subdomain(name) {
            return Err(self.invalid(format!(
                "the binding Secret name {name:?} is not a DNS subdomain (lowercase letters, \
                 digits, `-` and `.`, at most 253)"
            )));
        }
        let secret = BindingSecret::from_credentials(credentials).map_err(|e| self.invalid(e))?;
        let ns = self.namespace(scope)?;
        let data: Map<String, Value> = secret
            .entries
            .into_iter()
            .map(|(k, text)| {
                let encoded = base64::engine::general_purpose::STANDARD.encode(text);
                (k, Value::String(encoded))
            })
            .collect();
        let mut metadata = json!({"name": name, "namespace": ns});
        merge_into(&mut metadata["labels"], labels(scope));
        merge_into(&mut metadata["annotations"], annotations(scope));
        let body = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
            "type": secret.secret_type,
            "data": data,
        });
        let client = self.client().await?;
        let kind = self.kind(client, "v1", "Secret").await?;
        let at = Located {
            api: Api::namespaced_with(client.clone(), &ns, &kind.resource),
            namespace: Some(ns.clone()),
            what: format!("Secret {name}"),
        };
        self.check_owner(&at, name, scope).await?;
        let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
        api.patch(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|e| self.error(&format!("writing the binding Secret {name}"), e))?;
        Ok(json!({"namespace": ns, "name": name}))
    }

    /// Deletes the binding Secret `name` (see [`crate::target::Target::unpublish_credentials`]).
    pub(super) async fn delete_binding_secret(
        &self,
        name: &str,
        scope: &Scope<'_>,
    ) -> Result<(), TargetError> {
        let ns = self.namespace(scope)?;
        let client = self.client().await?;
        let kind = self.kind(client, "v1", "Secret").await?;
        let at = Located {
            api: Api::namespaced_with(client.clone(), &ns, &kind.resource),
            namespace: Some(ns),
            what: format!("Secret {name}"),
        };
        match self.delete_own(&at, name, scope, false).await? {
            Some(going) if !watch::await_gone(&at.api, &going, self.watch_for).await => Err(
                TargetError::Unavailable(format!("waiting for {} to be deleted", at.what)),
            ),
            _ => Ok(()),
        }
    }
}
