//! Reaching the cluster: the client, built on first use from the target's kubeconfig (or the
//! environment it runs in), and kinds resolved by discovery once per process.

use std::time::Duration;

use kube::api::GroupVersionKind;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::Scope as KubeScope;
use kube::{Client, Config};

use super::cluster::{Kind, Kubernetes};
use crate::target::TargetError;

/// What every request to the cluster says it comes from.
const USER_AGENT: &str = concat!("brokkr/", env!("CARGO_PKG_VERSION"));
impl Kubernetes {
    pub(super) async fn client(&self) -> Result<&Client, TargetError> {
        self.client
            .get_or_try_init(|| async {
                let source = &self.source;
                let unavailable = |e: String| {
                    TargetError::Unavailable(format!("kubernetes target {}: {e}", self.name))
                };
                let options = KubeConfigOptions {
                    context: source.context.clone(),
                    ..Default::default()
                };
                let mut config = match &source.kubeconfig {
                    Some(path) => {
                        let file = Kubeconfig::read_from(path)
                            .map_err(|e| unavailable(format!("kubeconfig {path}: {e}")))?;
                        Config::from_custom_kubeconfig(file, &options)
                            .await
                            .map_err(|e| unavailable(format!("kubeconfig {path}: {e}")))?
                    }
                    None if source.context.is_some() => Config::from_kubeconfig(&options)
                        .await
                        .map_err(|e| unavailable(format!("kubeconfig: {e}")))?,
                    None => Config::infer()
                        .await
                        .map_err(|e| unavailable(format!("no cluster configuration: {e}")))?,
                };
                config.headers.push((
                    http::header::USER_AGENT,
                    http::HeaderValue::from_static(USER_AGENT),
                ));
                config.connect_timeout = Some(source.timeout);
                config.read_timeout = Some(source.timeout.max(Duration::from_secs(30)));
                Client::try_from(config).map_err(|e| unavailable(format!("client: {e}")))
            })
            .await
    }
    /// Resolves a kind by discovery, once per process.
    pub(super) async fn kind(
        &self,
        client: &Client,
        api_version: &str,
        kind: &str,
    ) -> Result<Kind, TargetError> {
        let key = (api_version.to_owned(), kind.to_owned());
        if let Some(k) = self.kinds.lock().expect("lock").get(&key) {
            return Ok(k.clone());
        }
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, caps) = match kube::discovery::pinned_kind(client, &gvk).await {
            Ok(found) => found,
            Err(kube::Error::Discovery(_)) => {
                return Err(self.invalid(format!(
                    "the cluster does not serve {kind} in {api_version} (is its CRD installed?)"
                )));
            }
            Err(e) => return Err(self.error(&format!("discovering {kind} in {api_version}"), e)),
        };
        let resolved = Kind {
            resource,
            namespaced: caps.scope == KubeScope::Namespaced,
        };
        self.kinds
            .lock()
            .expect("lock")
            .insert(key, resolved.clone());
        Ok(resolved)
    }
}
