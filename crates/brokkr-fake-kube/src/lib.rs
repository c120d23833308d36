//! An in-memory fake of the Kubernetes API server, for brokkr's tests (a dev-dependency only).
//!
//! [`FakeCluster::start`] serves, on an ephemeral local port, what kube's client, brokkr's
//! `kubernetes` target and kube-runtime controllers use, for any kind registered with
//! [`FakeCluster::add_kind`] (CRDs included; common built-in kinds are registered from the start):
//!
//! - discovery (`/api`, `/apis`, each group version's resource list, with a `status`
//!   subresource for every kind); [`FakeCluster::stop_serving`] takes a kind away, as an older
//!   API server would not serve it;
//! - the API server's advertised addresses, written as its endpoint reconciler would
//!   ([`FakeCluster::advertise_api_server`]: the Endpoints and the EndpointSlice
//!   `default/kubernetes`);
//! - GET; LIST with label selectors (`k=v`, `k==v`, `k!=v`, `k`, `!k`) and field selectors
//!   (`metadata.name=…`, any dotted field, `=`, `==` or `!=`), answering with the list's
//!   `metadata.resourceVersion`;
//! - WATCH (`?watch=true` on a list path): a stream of JSON-lines `WatchEvent`s (`ADDED`,
//!   `MODIFIED`, `DELETED`) filtered like a LIST. Without `resourceVersion` (or with `0`) it
//!   starts with an `ADDED` event for every matching object; with one, it replays every change
//!   after it (the whole history is kept, so a watch never gets 410 Gone). It ends after
//!   `timeoutSeconds`; bookmarks are never sent;
//! - GET, LIST and WATCH of metadata alone, as `PartialObjectMetadata(List)`, when the `Accept`
//!   header asks for it (`as=PartialObjectMetadata`, what kube's `metadata_watcher` sends);
//! - POST (a `metadata.generateName` becomes a name of its own); PUT (replace); PATCH as JSON
//!   merge patch, server-side apply (applied as a merge patch: fields are never removed by
//!   omission, and field managers are not tracked), strategic merge patch (also as a merge
//!   patch) and JSON patch (RFC 6902; a `test` for `null` passes on an absent path, as on a real
//!   server); on objects and on their `/status`, which changes only
//!   `status` while the object's own path leaves `status` alone;
//! - optimistic concurrency: a PUT or a patch that carries a `metadata.resourceVersion` other
//!   than the stored one gets 409 Conflict (a JSON patch whose `test` fails, 422 Invalid);
//!   [`FakeCluster::change_before_patch`] plays another writer that changes an object between
//!   a client's read and its patch;
//! - DELETE: an object with `metadata.finalizers` is only marked (`deletionTimestamp`, the time
//!   of the deletion) until its finalizers are removed, which then deletes it; deleting a
//!   namespace deletes what is in it the same way, and the namespace itself stays (marked deleted, `status.phase: Terminating`,
//!   refusing new objects with 403) until the last object in it has gone.
//!
//! Every change bumps one cluster-wide counter that becomes the object's
//! `metadata.resourceVersion`; creation sets `uid` and `creationTimestamp` (a fixed time), and
//! `metadata.generation` starts at 1 and grows when anything but `metadata` and `status`
//! changes. Namespaced objects need their namespace.
//!
//! No controller runs in it: no garbage collection by `ownerReferences` (a test deletes
//! dependents itself), no foreground-deletion finalizer, no admission, no defaulting or schema
//! validation, no pods that start. Tests set the status a controller would, with
//! [`FakeCluster::set_status`], and create what an operator would, with [`FakeCluster::create`].
//! What the fake cannot prove is proved by the end-to-end tests against a real API server
//! (docs/testing.md).

mod api;
mod response;
mod select;
mod store;
mod watch;

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri};
use serde_json::{Value, json};

use store::{KindDef, State};

/// The `User-Agent` of [`FakeCluster::client`]'s requests.
pub const TEST_CLIENT: &str = "brokkr-fake-kube-test-client";

/// A fake API server on an ephemeral local port; stops when dropped.
pub struct FakeCluster {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    state: Arc<Mutex<State>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The kinds served from the start: (group, version, kind, plural, namespaced).
const BUILT_IN: &[(&str, &str, &str, &str, bool)] = &[
    ("", "v1", "Namespace", "namespaces", false),
    ("", "v1", "ConfigMap", "configmaps", true),
    ("", "v1", "Secret", "secrets", true),
    ("", "v1", "Service", "services", true),
    ("", "v1", "ServiceAccount", "serviceaccounts", true),
    (
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        true,
    ),
    ("", "v1", "Pod", "pods", true),
    ("", "v1", "Endpoints", "endpoints", true),
    (
        "discovery.k8s.io",
        "v1",
        "EndpointSlice",
        "endpointslices",
        true,
    ),
    ("apps", "v1", "StatefulSet", "statefulsets", true),
    ("apps", "v1", "Deployment", "deployments", true),
    ("batch", "v1", "Job", "jobs", true),
    (
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        true,
    ),
];

impl FakeCluster {
    /// Starts a fake with the common built-in kinds and the namespace `default`.
    pub async fn start() -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let shared = state.clone();
        let app = axum::Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let state = shared.clone();
                async move { api::handle(&state, &method, &uri, &headers, &body) }
            },
        );
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("fake API server");
        });
        let fake = Self { url, state, server };
        for (group, version, kind, plural, namespaced) in BUILT_IN {
            fake.add_kind(group, version, kind, plural, *namespaced);
        }
        fake.create(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "default"}}));
        fake
    }

    /// Serves another kind (a CRD's).
    pub fn add_kind(&self, group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) {
        self.lock().kinds.push(KindDef {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced,
        });
    }

    /// Stops serving a kind at `group`/`version`, as an API server of a version that does not
    /// serve it: requests to it get 404, and discovery no longer lists it.
    pub fn stop_serving(&self, group: &str, version: &str, plural: &str) {
        self.lock()
            .kinds
            .retain(|k| !(k.group == group && k.version == version && k.plural == plural));
    }

    /// Advertises `addresses` as the API server's own, as its endpoint reconciler does: the
    /// core `v1` Endpoints `default/kubernetes` and, where `discovery.k8s.io/v1` is served, the
    /// EndpointSlice `default/kubernetes` labelled `kubernetes.io/service-name: kubernetes`.
    pub fn advertise_api_server(&self, addresses: &[&str]) {
        let port = json!({"name": "https", "port": 6443, "protocol": "TCP"});
        self.create(json!({"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": "kubernetes", "namespace": "default",
                "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
            "subsets": [{"addresses": addresses.iter().map(|a| json!({"ip": a})).collect::<Vec<_>>(),
                         "ports": [port]}]}));
        let slices_served = self
            .lock()
            .kinds
            .iter()
            .any(|k| k.group == "discovery.k8s.io" && k.version == "v1");
        if slices_served {
            let ipv6 = addresses.first().is_some_and(|a| a.contains(':'));
            let address_type = if ipv6 { "IPv6" } else { "IPv4" };
            self.create(
                json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "kubernetes", "namespace": "default",
                    "labels": {"kubernetes.io/service-name": "kubernetes"}},
                "addressType": address_type,
                "endpoints": addresses.iter()
                    .map(|a| json!({"addresses": [a], "conditions": {"ready": true}}))
                    .collect::<Vec<_>>(),
                "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]}),
            );
        }
    }

    /// Serves the kind a CustomResourceDefinition defines, at its storage version (the fake
    /// converts nothing between versions).
    pub fn add_crd(
        &self,
        crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    ) {
        let spec = &crd.spec;
        let version = spec
            .versions
            .iter()
            .find(|v| v.storage)
            .or(spec.versions.first())
            .map_or("v1", |v| v.name.as_str());
        self.add_kind(
            &spec.group,
            version,
            &spec.names.kind,
            &spec.names.plural,
            spec.scope == "Namespaced",
        );
    }

    /// A kube client for the fake. Its requests carry the `User-Agent` [`TEST_CLIENT`], so that
    /// a test can tell them from those of the code it tests.
    pub fn client(&self) -> kube::Client {
        let mut config = kube::Config::new(self.url.parse().expect("URL"));
        config.headers.push((
            axum::http::header::USER_AGENT,
            axum::http::HeaderValue::from_static(TEST_CLIENT),
        ));
        kube::Client::try_from(config).expect("client")
    }

    /// A kubeconfig file's text for the fake, with one context named `fake`.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\nclusters:\n- name: fake\n  \
             cluster: {{server: \"{}\"}}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- \
             name: fake\n  context: {{cluster: fake, user: fake}}\n",
            self.url
        )
    }

    /// Stores `object` as is (with the metadata the server adds), as a controller would; its
    /// watchers see it added (or modified, if it existed).
    pub fn create(&self, object: Value) {
        let mut state = self.lock();
        let key = state
            .key(
                object["apiVersion"].as_str().unwrap_or_default(),
                object["kind"].as_str().unwrap_or_default(),
                object["metadata"]["namespace"].as_str(),
                object["metadata"]["name"].as_str().unwrap_or_default(),
            )
            .expect("a registered kind");
        let before = state.objects.get(&key).cloned();
        state.store(key, object, before.as_ref());
    }

    /// The object, if it exists.
    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let state = self.lock();
        let key = state.key(api_version, kind, ns, name)?;
        state.objects.get(&key).cloned()
    }

    /// Every object of `kind` (in every namespace).
    pub fn list(&self, api_version: &str, kind: &str) -> Vec<Value> {
        self.lock()
            .objects
            .values()
            .filter(|o| o["apiVersion"] == api_version && o["kind"] == kind)
            .cloned()
            .collect()
    }

    /// Replaces an object's `status`, as its controller would.
    pub fn set_status(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        status: Value,
    ) {
        self.update(api_version, kind, ns, name, |o| o["status"] = status);
    }

    /// Replaces an object's finalizers; with none left, an object marked deleted goes.
    pub fn set_finalizers(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        finalizers: &[&str],
    ) {
        self.update(api_version, kind, ns, name, |o| {
            o["metadata"]["finalizers"] = json!(finalizers);
        });
    }

    /// Before each of the next `times` PATCH requests to the object is served, changes it with
    /// `change` as another writer would (a new `resourceVersion`, an event for its watchers): the
    /// patch meets a version other than the one its sender read, as when a Deployment's own
    /// controller writes between a read and a patch.
    pub fn change_before_patch(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        times: usize,
        change: impl FnMut(&mut Value) + Send + 'static,
    ) {
        let mut state = self.lock();
        let key = state
            .key(api_version, kind, ns, name)
            .expect("a registered kind");
        state.interferences.push(store::Interference {
            key,
            remaining: times,
            change: Box::new(change),
        });
    }

    /// The requests served so far: `METHOD path?query content-type`.
    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    /// The `User-Agent` of each request served so far, in the order of [`Self::requests`]
    /// (empty where a request had none).
    pub fn user_agents(&self) -> Vec<String> {
        self.lock().user_agents.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("lock")
    }

    /// Changes a stored object as a controller would: a new resourceVersion, an event for its
    /// watchers, and deletion once an object marked deleted has no finalizers left.
    fn update(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) {
        let mut state = self.lock();
        let key = state
            .key(api_version, kind, ns, name)
            .expect("a registered kind");
        let before = state
            .objects
            .get(&key)
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} {name}"));
        let mut object = before.clone();
        change(&mut object);
        state.store(key, object, Some(&before));
    }
}
