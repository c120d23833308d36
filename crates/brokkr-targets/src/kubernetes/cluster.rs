//! The target itself: [`Kubernetes`], a cluster reached through a client built on first use,
//! with its namespace and PVC policies; the identity of a rendered object (`ObjectRef`) and the
//! place of a live one (`Located`); the namespace of an instance's objects; how an API error is
//! classified; and what templates see about a kubernetes target ([`facts`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use brokkr_blueprint::{NamespacePolicy, PvcPolicy, TargetConfig};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use super::names::instance_namespace;
use crate::target::{Scope, TargetError};

/// How long one watch lasts by default before the call answers `waiting`.
const WATCH_FOR: Duration = Duration::from_secs(10);

/// Where the client's configuration comes from.
pub(super) struct Source {
    pub(super) kubeconfig: Option<String>,
    pub(super) context: Option<String>,
    pub(super) timeout: Duration,
}

/// A resolved kind.
#[derive(Clone)]
pub(super) struct Kind {
    pub(super) resource: ApiResource,
    pub(super) namespaced: bool,
}

/// What templates see about a kubernetes target: `kind` and the namespace policy.
pub fn facts(target: &TargetConfig) -> Value {
    let namespace = match &target.namespace {
        Some(NamespacePolicy::Fixed(ns)) => json!({"fixed": ns}),
        Some(NamespacePolicy::PerInstance) => json!("per-instance"),
        Some(NamespacePolicy::FromContext) | None => json!("from-context"),
    };
    json!({"kind": "kubernetes", "namespace": namespace})
}

/// A Kubernetes cluster.
pub struct Kubernetes {
    pub(super) name: String,
    pub(super) source: Source,
    pub(super) client: OnceCell<Client>,
    pub(super) namespace: NamespacePolicy,
    pub(super) pvc_policy: PvcPolicy,
    pub(super) kinds: Mutex<HashMap<(String, String), Kind>>,
    /// How long one watch for readiness or deletion lasts before the call answers.
    pub(super) watch_for: Duration,
    /// The objects as the API server answered their last apply, until the readiness check that
    /// follows reads them from here instead of asking again.
    pub(super) applied: Mutex<HashMap<String, DynamicObject>>,
}

/// The identity of a rendered object.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ObjectRef {
    pub(super) api_version: String,
    pub(super) kind: String,
    #[serde(default)]
    pub(super) metadata: RefMeta,
    /// Readiness checks and reads name the object at the top level.
    #[serde(default)]
    pub(super) name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct RefMeta {
    #[serde(default)]
    pub(super) name: Option<String>,
    #[serde(default)]
    pub(super) namespace: Option<String>,
}

impl ObjectRef {
    pub(super) fn name(&self) -> &str {
        self.metadata
            .name
            .as_deref()
            .or(self.name.as_deref())
            .unwrap_or_default()
    }

    pub(super) fn describe(&self) -> String {
        format!("{} {}", self.kind, self.name())
    }
}

/// A live object's place: its API and name.
pub(super) struct Located {
    pub(super) api: Api<DynamicObject>,
    pub(super) namespace: Option<String>,
    pub(super) what: String,
}

impl Kubernetes {
    /// A target for the cluster `config` describes. The client is built on first use, so a
    /// cluster that cannot be reached stops no one from starting.
    pub fn new(name: &str, config: &TargetConfig) -> Self {
        Self {
            name: name.to_owned(),
            source: Source {
                kubeconfig: config.kubeconfig.clone(),
                context: config.context.clone(),
                timeout: config.timeout.unwrap_or(Duration::from_secs(10)),
            },
            client: OnceCell::new(),
            namespace: config
                .namespace
                .clone()
                .unwrap_or(NamespacePolicy::FromContext),
            pvc_policy: config.pvc_policy.unwrap_or(PvcPolicy::Delete),
            kinds: Mutex::new(HashMap::new()),
            watch_for: WATCH_FOR,
            applied: Mutex::new(HashMap::new()),
        }
    }

    /// A target that uses `client` (tests, embedding).
    pub fn with_client(
        name: &str,
        client: Client,
        namespace: NamespacePolicy,
        pvc_policy: PvcPolicy,
    ) -> Self {
        Self {
            name: name.to_owned(),
            source: Source {
                kubeconfig: None,
                context: None,
                timeout: Duration::from_secs(10),
            },
            client: OnceCell::new_with(Some(client)),
            namespace,
            pvc_policy,
            kinds: Mutex::new(HashMap::new()),
            watch_for: WATCH_FOR,
            applied: Mutex::new(HashMap::new()),
        }
    }

    /// How long one watch for an object's readiness or deletion lasts before the call answers
    /// `waiting` and the engine asks again (default 10 s).
    pub fn watching_for(mut self, watch_for: Duration) -> Self {
        self.watch_for = watch_for;
        self
    }

    pub(super) fn invalid(&self, message: impl std::fmt::Display) -> TargetError {
        TargetError::Invalid(format!("kubernetes target {}: {message}", self.name))
    }

    /// Classifies an API error: conflicts, throttling, server errors and transport errors may
    /// pass; the rest (refused, forbidden, not found, an apply the server cannot merge) will not.
    pub(super) fn error(&self, doing: &str, e: kube::Error) -> TargetError {
        match e {
            kube::Error::Api(status) => {
                let message = format!(
                    "kubernetes target {}: {doing}: {} ({} {})",
                    self.name, status.message, status.code, status.reason
                );
                // A server-side apply whose object the server cannot merge (a list entry
                // without its key field, such as a port without `protocol` before Kubernetes
                // 1.21) comes back as a 500, yet no retry will ever pass.
                let unmergeable = status
                    .message
                    .starts_with("failed to create typed patch object");
                match status.code {
                    500 if unmergeable => TargetError::Invalid(message),
                    409 | 429 | 500.. => TargetError::Unavailable(message),
                    _ => TargetError::Invalid(message),
                }
            }
            other => TargetError::Unavailable(format!(
                "kubernetes target {}: {doing}: {other}",
                self.name
            )),
        }
    }

    pub(super) fn object_ref(&self, value: &Value) -> Result<ObjectRef, TargetError> {
        let r: ObjectRef = serde_json::from_value(value.clone()).map_err(|e| {
            self.invalid(format!("an object needs apiVersion, kind and a name: {e}"))
        })?;
        if r.name().is_empty() {
            return Err(self.invalid(format!("{} has no name", r.kind)));
        }
        Ok(r)
    }

    /// The namespace of the instance's namespaced objects.
    pub(super) fn namespace(&self, scope: &Scope<'_>) -> Result<String, TargetError> {
        match &self.namespace {
            NamespacePolicy::Fixed(ns) => Ok(ns.clone()),
            NamespacePolicy::FromContext => scope.context["namespace"]
                .as_str()
                .filter(|ns| !ns.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| {
                    self.invalid(
                        "the OSB context has no `namespace` (the target's namespace policy is \
                         from-context)",
                    )
                }),
            NamespacePolicy::PerInstance => Ok(instance_namespace(scope.instance_id)),
        }
    }

    /// Where `r` lives: its API, resolved kind and namespace.
    pub(super) async fn locate(
        &self,
        r: &ObjectRef,
        scope: &Scope<'_>,
    ) -> Result<Located, TargetError> {
        let client = self.client().await?;
        let kind = self.kind(client, &r.api_version, &r.kind).await?;
        let what = r.describe();
        if !kind.namespaced {
            let api = Api::all_with(client.clone(), &kind.resource);
            return Ok(Located {
                api,
                namespace: None,
                what,
            });
        }
        let ns = self.namespace(scope)?;
        if let Some(given) = &r.metadata.namespace
            && *given != ns
        {
            return Err(self.invalid(format!(
                "{what} sets metadata.namespace {given:?}, but the target places the instance's \
                 objects in {ns:?}; remove metadata.namespace"
            )));
        }
        let api = Api::namespaced_with(client.clone(), &ns, &kind.resource);
        Ok(Located {
            api,
            namespace: Some(ns),
            what,
        })
    }

    /// The key of an object in [`Self::applied`].
    pub(super) fn object_key(at: &Located, r: &ObjectRef) -> String {
        format!(
            "{}/{}/{}/{}",
            at.namespace.as_deref().unwrap_or_default(),
            r.api_version,
            r.kind,
            r.name()
        )
    }

    pub(super) async fn get(
        &self,
        at: &Located,
        name: &str,
    ) -> Result<Option<DynamicObject>, TargetError> {
        at.api
            .get_opt(name)
            .await
            .map_err(|e| self.error(&format!("reading {}", at.what), e))
    }
}
