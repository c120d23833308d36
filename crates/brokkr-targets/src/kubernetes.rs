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

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use brokkr_blueprint::{NamespacePolicy, PvcPolicy, TargetConfig};
use brokkr_servicebinding::BindingSecret;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, Preconditions,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::Scope as KubeScope;
use kube::{Client, Config, ResourceExt as _};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::OnceCell;
use tracing::{info, warn};

use crate::{Readiness, Scope, Target, TargetError};

mod names;
mod namespace;
pub mod readiness;
mod watch;

pub use names::{
    BINDING, CLAIM_OF, INSTANCE, MANAGED_BY, MANAGER, PLAN, PVC_POLICY, SERVICE, STEP,
    instance_namespace, label_value,
};
use names::{annotations, is_dns_subdomain, labels, merge_into};

/// What every request to the cluster says it comes from.
const USER_AGENT: &str = concat!("brokkr/", env!("CARGO_PKG_VERSION"));

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
    name: String,
    source: Source,
    client: OnceCell<Client>,
    namespace: NamespacePolicy,
    pvc_policy: PvcPolicy,
    kinds: Mutex<HashMap<(String, String), Kind>>,
    /// How long one watch for readiness or deletion lasts before the call answers.
    watch_for: Duration,
    /// The objects as the API server answered their last apply, until the readiness check that
    /// follows reads them from here instead of asking again.
    applied: Mutex<HashMap<String, DynamicObject>>,
}

/// Where the client's configuration comes from.
struct Source {
    kubeconfig: Option<String>,
    context: Option<String>,
    timeout: Duration,
}

/// A resolved kind.
#[derive(Clone)]
struct Kind {
    resource: ApiResource,
    namespaced: bool,
}

/// The identity of a rendered object.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectRef {
    api_version: String,
    kind: String,
    #[serde(default)]
    metadata: RefMeta,
    /// Readiness checks and reads name the object at the top level.
    #[serde(default)]
    name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct RefMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
}

impl ObjectRef {
    fn name(&self) -> &str {
        self.metadata
            .name
            .as_deref()
            .or(self.name.as_deref())
            .unwrap_or_default()
    }

    fn describe(&self) -> String {
        format!("{} {}", self.kind, self.name())
    }
}

/// A live object's place: its API and name.
struct Located {
    api: Api<DynamicObject>,
    namespace: Option<String>,
    what: String,
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
            watch_for: watch::WATCH_FOR,
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
            watch_for: watch::WATCH_FOR,
            applied: Mutex::new(HashMap::new()),
        }
    }

    /// How long one watch for an object's readiness or deletion lasts before the call answers
    /// `waiting` and the engine asks again (default 10 s).
    pub fn watching_for(mut self, watch_for: Duration) -> Self {
        self.watch_for = watch_for;
        self
    }

    async fn client(&self) -> Result<&Client, TargetError> {
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

    fn invalid(&self, message: impl std::fmt::Display) -> TargetError {
        TargetError::Invalid(format!("kubernetes target {}: {message}", self.name))
    }

    /// Classifies an API error: conflicts, throttling, server errors and transport errors may
    /// pass; the rest (refused, forbidden, not found, an apply the server cannot merge) will not.
    fn error(&self, doing: &str, e: kube::Error) -> TargetError {
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

    fn object_ref(&self, value: &Value) -> Result<ObjectRef, TargetError> {
        let r: ObjectRef = serde_json::from_value(value.clone()).map_err(|e| {
            self.invalid(format!("an object needs apiVersion, kind and a name: {e}"))
        })?;
        if r.name().is_empty() {
            return Err(self.invalid(format!("{} has no name", r.kind)));
        }
        Ok(r)
    }

    /// Resolves a kind by discovery, once per process.
    async fn kind(
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

    /// The namespace of the instance's namespaced objects.
    fn namespace(&self, scope: &Scope<'_>) -> Result<String, TargetError> {
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
    async fn locate(&self, r: &ObjectRef, scope: &Scope<'_>) -> Result<Located, TargetError> {
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
    fn object_key(at: &Located, r: &ObjectRef) -> String {
        format!(
            "{}/{}/{}/{}",
            at.namespace.as_deref().unwrap_or_default(),
            r.api_version,
            r.kind,
            r.name()
        )
    }

    async fn get(&self, at: &Located, name: &str) -> Result<Option<DynamicObject>, TargetError> {
        at.api
            .get_opt(name)
            .await
            .map_err(|e| self.error(&format!("reading {}", at.what), e))
    }

    /// Whether `name` exists and was created by brokkr for `scope` (its instance and binding
    /// annotations say so); an object of someone else's is an error, so it is never taken over.
    async fn check_owner(
        &self,
        at: &Located,
        name: &str,
        scope: &Scope<'_>,
    ) -> Result<Option<DynamicObject>, TargetError> {
        let Some(live) = self.get(at, name).await? else {
            return Ok(None);
        };
        let annotations = live.metadata.annotations.clone().unwrap_or_default();
        let ours = annotations.get(INSTANCE).map(String::as_str) == Some(scope.instance_id)
            && annotations.get(BINDING).map(String::as_str) == scope.binding_id;
        if !ours {
            return Err(self.invalid(format!(
                "{} exists and was not created by brokkr for this {}; brokkr does not take it over",
                at.what,
                if scope.binding_id.is_some() {
                    "binding"
                } else {
                    "instance"
                }
            )));
        }
        Ok(Some(live))
    }

    /// Deletes `name` when it is `scope`'s; answers the object while it is still going (`None`
    /// once it is gone). An object that is not brokkr's for `scope` is left alone (and counts as
    /// gone). One already being deleted is not asked again. `foreground` waits for its
    /// dependents (a StatefulSet's Pods) before it goes.
    async fn delete_own(
        &self,
        at: &Located,
        name: &str,
        scope: &Scope<'_>,
        foreground: bool,
    ) -> Result<Option<DynamicObject>, TargetError> {
        match self.check_owner(at, name, scope).await {
            Ok(None) => Ok(None),
            Ok(Some(live)) if live.metadata.deletion_timestamp.is_some() => Ok(Some(live)),
            Ok(Some(live)) => {
                self.delete_and_check(at, name, live.metadata.uid, foreground)
                    .await
            }
            Err(TargetError::Invalid(why)) => {
                warn!(target = %self.name, "{why}: left in place");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes `name` (only the object of that `uid`, when given: a precondition) and answers,
    /// from the API server's answer alone, the object while it waits for finalizers or, with
    /// `foreground`, for its dependents; `None` when it went at once.
    async fn delete_and_check(
        &self,
        at: &Located,
        name: &str,
        uid: Option<String>,
        foreground: bool,
    ) -> Result<Option<DynamicObject>, TargetError> {
        let propagation = if foreground {
            DeleteParams::foreground()
        } else {
            DeleteParams::background()
        };
        let params = DeleteParams {
            preconditions: uid.map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..propagation
        };
        match at.api.delete(name, &params).await {
            // Left: the object, still there; Right: the status of its deletion.
            Ok(answer) => Ok(answer.left()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            // Another object of that name replaced it meanwhile: this one is gone.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
            Err(e) => Err(self.error(&format!("deleting {}", at.what), e)),
        }
    }

    /// Whether `live` is ready by its kind's rule; one that is not is watched (see
    /// [`Self::await_change`]).
    async fn judge(
        &self,
        at: &Located,
        kind: &str,
        live: &DynamicObject,
    ) -> Result<Readiness, TargetError> {
        let object = serde_json::to_value(live).unwrap_or_default();
        match readiness::builtin(kind, &object).map_err(|e| self.invalid(e))? {
            Readiness::Waiting(reason) => self.await_change(at, kind, live, reason).await,
            ready => Ok(ready),
        }
    }

    /// Watches `live` (one object, from the version just read) for up to `watch_for` and
    /// answers as soon as a change makes it ready; else what it still waits for.
    async fn await_change(
        &self,
        at: &Located,
        kind: &str,
        live: &DynamicObject,
        mut waiting: String,
    ) -> Result<Readiness, TargetError> {
        let mut invalid = None;
        let seen = watch::watch_one(&at.api, live, self.watch_for, |object| {
            let object = serde_json::to_value(object).unwrap_or_default();
            match readiness::builtin(kind, &object) {
                Ok(Readiness::Waiting(reason)) => {
                    waiting = reason;
                    false
                }
                Ok(Readiness::Ready) => true,
                Err(e) => {
                    invalid = Some(e);
                    true
                }
            }
        })
        .await;
        if let Some(e) = invalid {
            return Err(self.invalid(e));
        }
        Ok(match seen {
            watch::Seen::Wanted(_) => Readiness::Ready,
            watch::Seen::Gone => Readiness::Waiting(format!("{} was deleted", at.what)),
            watch::Seen::Nothing => Readiness::Waiting(waiting),
        })
    }

    /// The PVC policy for a rendered object.
    fn pvc_policy(&self, resource: &Value) -> Result<PvcPolicy, TargetError> {
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
    async fn delete_claims(
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

    /// Adds brokkr's labels, annotations and namespace to a rendered object.
    fn stamp(&self, resource: &Value, ns: Option<&str>, scope: &Scope<'_>) -> Value {
        let mut body = resource.clone();
        let metadata = &mut body["metadata"];
        if let Some(ns) = ns {
            metadata["namespace"] = json!(ns);
        }
        merge_into(&mut metadata["labels"], labels(scope));
        merge_into(&mut metadata["annotations"], annotations(scope));
        if body["kind"] == "StatefulSet"
            && let Some(templates) = body["spec"]["volumeClaimTemplates"].as_array_mut()
        {
            let name = resource["metadata"]["name"].as_str().unwrap_or_default();
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

#[async_trait]
impl Target for Kubernetes {
    async fn apply(&self, resource: &Value, scope: &Scope<'_>) -> Result<(), TargetError> {
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
            None => {
                // Nothing to watch: the caller asks again at once, so pause here.
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok(Readiness::Waiting(format!(
                    "waiting for {} to be created",
                    at.what
                )))
            }
            Some(live) => self.judge(&at, &r.kind, &live).await,
        }
    }

    fn watches_readiness(&self) -> bool {
        true
    }

    async fn prune(&self, kept: &[Value], scope: &Scope<'_>) -> Result<(), TargetError> {
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
            None => {
                // Nothing to watch: the caller asks again at once, so pause here.
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok(Readiness::Waiting(format!(
                    "waiting for {} to be created",
                    at.what
                )))
            }
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

    async fn unpublish_credentials(
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

    async fn released(&self, scope: &Scope<'_>) -> Result<(), TargetError> {
        if self.namespace != NamespacePolicy::PerInstance || scope.binding_id.is_some() {
            return Ok(());
        }
        self.release_namespace(scope).await
    }
}
