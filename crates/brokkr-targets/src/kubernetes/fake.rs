//! An in-memory fake of the Kubernetes API, for tests (feature `fake`).
//!
//! It serves what the [`super::Kubernetes`] target and kube's client use: discovery (`/api`,
//! `/apis`, resource lists), GET, LIST with label selectors, POST, server-side apply and merge
//! PATCH (both as JSON merge patches: fields are never removed by omission), the `status`
//! subresource, and DELETE, for any kind registered with [`FakeCluster::add_kind`] (common
//! built-in kinds are registered from the start). Namespaced objects need their namespace;
//! deleting a namespace deletes what is in it. An object with `metadata.finalizers` is only
//! marked deleted until a test clears them, so callers can be seen waiting for it. No
//! controller runs: tests set the status readiness waits for.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

/// A kind the fake serves.
#[derive(Debug, Clone)]
struct KindDef {
    group: String,
    version: String,
    kind: String,
    plural: String,
    namespaced: bool,
}

impl KindDef {
    fn api_version(&self) -> String {
        match self.group.as_str() {
            "" => self.version.clone(),
            g => format!("{g}/{}", self.version),
        }
    }
}

/// (group, plural, namespace or "", name)
type Key = (String, String, String, String);

#[derive(Default)]
struct State {
    kinds: Vec<KindDef>,
    objects: BTreeMap<Key, Value>,
    version: u64,
    requests: Vec<String>,
}

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
                async move { handle(&state, &method, &uri, &headers, &body) }
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
        self.state.lock().expect("lock").kinds.push(KindDef {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced,
        });
    }

    /// A kube client for the fake.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url.parse().expect("URL"));
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

    /// Stores `object` as is (with metadata the server would add), as a controller would.
    pub fn create(&self, object: Value) {
        let mut state = self.state.lock().expect("lock");
        let def = state
            .kind_of(
                object["apiVersion"].as_str().unwrap_or_default(),
                object["kind"].as_str().unwrap_or_default(),
            )
            .expect("a registered kind");
        let ns = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let key = (def.group.clone(), def.plural.clone(), ns, name);
        let stored = state.stamp(object, None);
        state.objects.insert(key, stored);
    }

    /// The object, if it exists.
    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let state = self.state.lock().expect("lock");
        let key = state.key(api_version, kind, ns, name)?;
        state.objects.get(&key).cloned()
    }

    /// Every object of `kind` (in every namespace).
    pub fn list(&self, api_version: &str, kind: &str) -> Vec<Value> {
        let state = self.state.lock().expect("lock");
        state
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
        let mut state = self.state.lock().expect("lock");
        if let Some(key) = state.key(api_version, kind, ns, name)
            && finalizers.is_empty()
            && state
                .objects
                .get(&key)
                .is_some_and(|o| o["metadata"].get("deletionTimestamp").is_some())
        {
            state.remove(&key);
        }
    }

    /// The requests served so far: `METHOD path?query content-type`.
    pub fn requests(&self) -> Vec<String> {
        self.state.lock().expect("lock").requests.clone()
    }

    fn update(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) {
        let mut state = self.state.lock().expect("lock");
        let key = state
            .key(api_version, kind, ns, name)
            .expect("a registered kind");
        let object = state
            .objects
            .get_mut(&key)
            .unwrap_or_else(|| panic!("no {kind} {name}"));
        change(object);
    }
}

impl State {
    fn kind_of(&self, api_version: &str, kind: &str) -> Option<KindDef> {
        self.kinds
            .iter()
            .find(|k| k.api_version() == api_version && k.kind == kind)
            .cloned()
    }

    fn key(&self, api_version: &str, kind: &str, ns: Option<&str>, name: &str) -> Option<Key> {
        let def = self.kind_of(api_version, kind)?;
        let ns = if def.namespaced {
            ns.unwrap_or_default()
        } else {
            ""
        };
        Some((def.group, def.plural, ns.to_owned(), name.to_owned()))
    }

    /// Adds the metadata the server keeps: uid, resourceVersion, generation (bumped when the
    /// spec changes), creationTimestamp.
    fn stamp(&mut self, mut object: Value, before: Option<&Value>) -> Value {
        self.version += 1;
        // A Secret's stringData is written into its data.
        if object["kind"] == "Secret"
            && let Some(Value::Object(strings)) =
                object.as_object_mut().and_then(|o| o.remove("stringData"))
        {
            use base64::Engine as _;
            for (k, v) in strings {
                let text = v.as_str().unwrap_or_default();
                let encoded = base64::engine::general_purpose::STANDARD.encode(text);
                object["data"][k] = Value::String(encoded);
            }
        }
        let generation = match before {
            None => 1,
            Some(b) => {
                let g = b["metadata"]["generation"].as_i64().unwrap_or(1);
                if b.get("spec") == object.get("spec") {
                    g
                } else {
                    g + 1
                }
            }
        };
        let meta = &mut object["metadata"];
        meta["resourceVersion"] = json!(self.version.to_string());
        meta["generation"] = json!(generation);
        if meta.get("uid").is_none() {
            meta["uid"] = json!(format!("uid-{}", self.version));
            meta["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        object
    }

    fn remove(&mut self, key: &Key) {
        let removed = self.objects.remove(key);
        if key.1 == "namespaces" && key.0.is_empty() && removed.is_some() {
            self.objects.retain(|k, _| k.2 != key.3);
        }
    }
}

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16()});
    (code, axum::Json(body)).into_response()
}

fn ok(body: Value) -> Response {
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// The path split into API group, version and the rest.
fn split(path: &str) -> Option<(String, String, Vec<String>)> {
    let parts: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .map(str::to_owned)
        .collect();
    match parts.first().map(String::as_str) {
        Some("api") if parts.len() >= 2 => {
            Some((String::new(), parts[1].clone(), parts[2..].to_vec()))
        }
        Some("apis") if parts.len() >= 3 => {
            Some((parts[1].clone(), parts[2].clone(), parts[3..].to_vec()))
        }
        _ => None,
    }
}

fn handle(
    state: &Mutex<State>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let mut state = state.lock().expect("lock");
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let query = uri.query().unwrap_or_default();
    state
        .requests
        .push(format!("{method} {}?{query} {content_type}", uri.path()));
    let path = uri.path();
    if path == "/api" {
        return ok(
            json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
        );
    }
    if path == "/apis" {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for k in state.kinds.iter().filter(|k| !k.group.is_empty()) {
            let versions = groups.entry(k.group.clone()).or_default();
            if !versions.contains(&k.version) {
                versions.push(k.version.clone());
            }
        }
        let groups: Vec<Value> = groups
            .into_iter()
            .map(|(name, versions)| {
                let vs: Vec<Value> = versions
                    .iter()
                    .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
                    .collect();
                json!({"name": name, "versions": vs, "preferredVersion": vs[0]})
            })
            .collect();
        return ok(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}));
    }
    let Some((group, version, rest)) = split(path) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no route {path}"),
        );
    };
    let defs: Vec<KindDef> = state
        .kinds
        .iter()
        .filter(|k| k.group == group && k.version == version)
        .cloned()
        .collect();
    if defs.is_empty() {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("group {group}/{version} is not served"),
        );
    }
    let gv = defs[0].api_version();
    if rest.is_empty() {
        let verbs = ["create", "delete", "get", "list", "patch", "update"];
        let mut resources = Vec::new();
        for k in &defs {
            resources.push(
                json!({"name": k.plural, "singularName": k.kind.to_lowercase(),
                "namespaced": k.namespaced, "kind": k.kind, "verbs": verbs}),
            );
            resources.push(
                json!({"name": format!("{}/status", k.plural), "singularName": "",
                "namespaced": k.namespaced, "kind": k.kind, "verbs": ["get", "patch", "update"]}),
            );
        }
        return ok(
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
            "resources": resources}),
        );
    }
    // [namespaces, NS, plural, (name, (status))] or [plural, (name, (status))]
    let (ns, rest) = if rest[0] == "namespaces" && rest.len() >= 3 && rest[2] != "status" {
        (rest[1].clone(), rest[2..].to_vec())
    } else {
        (String::new(), rest)
    };
    let Some(def) = defs.iter().find(|k| k.plural == rest[0]).cloned() else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!(
                "the server could not find the requested resource {}",
                rest[0]
            ),
        );
    };
    let name = rest.get(1).cloned();
    let subresource = rest.get(2).cloned();
    if def.namespaced == ns.is_empty() && name.is_some() {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!(
                "{} is {}namespaced",
                def.kind,
                if def.namespaced { "" } else { "not " }
            ),
        );
    }
    let Some(name) = name else {
        return collection(&mut state, method, &def, &ns, query, body);
    };
    let key = (
        def.group.clone(),
        def.plural.clone(),
        ns.clone(),
        name.clone(),
    );
    let what = format!("{} \"{name}\"", def.plural);
    match *method {
        Method::GET => match state.objects.get(&key) {
            Some(o) => ok(o.clone()),
            None => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("{what} not found"),
            ),
        },
        Method::DELETE => {
            let Some(object) = state.objects.get_mut(&key) else {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("{what} not found"),
                );
            };
            let held = object["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty());
            if held {
                object["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:01Z");
                return ok(object.clone());
            }
            state.remove(&key);
            ok(
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "kind": def.plural}}),
            )
        }
        Method::PATCH => {
            let Ok(patch) = serde_json::from_slice::<Value>(body) else {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "the fake reads JSON patches only".into(),
                );
            };
            let apply = content_type.starts_with("application/apply-patch");
            if !apply && !content_type.starts_with("application/merge-patch") {
                return status(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    content_type,
                );
            }
            if apply && !query.contains("fieldManager=") {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    "apply needs a fieldManager".into(),
                );
            }
            if def.namespaced && !namespace_exists(&state, &ns) {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("namespaces \"{ns}\" not found"),
                );
            }
            let before = state.objects.get(&key).cloned();
            let mut object = match (&before, apply) {
                (Some(b), _) => b.clone(),
                (None, true) => json!({}),
                (None, false) => {
                    return status(
                        StatusCode::NOT_FOUND,
                        "NotFound",
                        format!("{what} not found"),
                    );
                }
            };
            let mut patch = patch;
            if subresource.as_deref() == Some("status") {
                merge(&mut object["status"], patch["status"].take());
            } else {
                if let Value::Object(p) = &mut patch {
                    p.remove("status");
                }
                merge(&mut object, patch);
            }
            object["apiVersion"] = json!(def.api_version());
            object["kind"] = json!(def.kind);
            object["metadata"]["name"] = json!(name);
            if def.namespaced {
                object["metadata"]["namespace"] = json!(ns);
            }
            let held = object["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty());
            let stored = state.stamp(object, before.as_ref());
            if stored["metadata"].get("deletionTimestamp").is_some() && !held {
                state.remove(&key);
            } else {
                state.objects.insert(key, stored.clone());
            }
            ok(stored)
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            method.to_string(),
        ),
    }
}

fn namespace_exists(state: &State, ns: &str) -> bool {
    state.objects.contains_key(&(
        String::new(),
        "namespaces".into(),
        String::new(),
        ns.to_owned(),
    ))
}

/// LIST and POST on a collection.
fn collection(
    state: &mut State,
    method: &Method,
    def: &KindDef,
    ns: &str,
    query: &str,
    body: &[u8],
) -> Response {
    match *method {
        Method::GET => {
            let selector = url::form_urlencoded::parse(query.as_bytes())
                .find(|(k, _)| k == "labelSelector")
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default();
            let items: Vec<Value> = state
                .objects
                .iter()
                .filter(|(k, _)| {
                    k.0 == def.group && k.1 == def.plural && (ns.is_empty() || k.2 == ns)
                })
                .filter(|(_, o)| selects(&selector, &o["metadata"]["labels"]))
                .map(|(_, o)| o.clone())
                .collect();
            ok(
                json!({"kind": format!("{}List", def.kind), "apiVersion": def.api_version(),
                "metadata": {"resourceVersion": state.version.to_string()}, "items": items}),
            )
        }
        Method::POST => {
            let Ok(mut object) = serde_json::from_slice::<Value>(body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON".into());
            };
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let key = (
                def.group.clone(),
                def.plural.clone(),
                ns.to_owned(),
                name.clone(),
            );
            if state.objects.contains_key(&key) {
                return status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    format!("{} \"{name}\" already exists", def.plural),
                );
            }
            if def.namespaced && !namespace_exists(state, ns) {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("namespaces \"{ns}\" not found"),
                );
            }
            object["apiVersion"] = json!(def.api_version());
            object["kind"] = json!(def.kind);
            if def.namespaced {
                object["metadata"]["namespace"] = json!(ns);
            }
            let stored = state.stamp(object, None);
            state.objects.insert(key, stored.clone());
            (StatusCode::CREATED, axum::Json(stored)).into_response()
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            method.to_string(),
        ),
    }
}

/// Whether `labels` match a selector of `k=v`, `k==v`, `k!=v`, `k` and `!k` terms.
fn selects(selector: &str, labels: &Value) -> bool {
    let empty = Map::new();
    let labels = labels.as_object().unwrap_or(&empty);
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            labels.get(k).and_then(Value::as_str) != Some(v)
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            labels.get(k).and_then(Value::as_str) == Some(v)
        } else if let Some(k) = term.strip_prefix('!') {
            !labels.contains_key(k)
        } else {
            labels.contains_key(term)
        }
    })
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let Value::Object(t) = target else { return };
            for (k, v) in p {
                if v.is_null() {
                    t.remove(&k);
                } else {
                    merge(t.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other,
    }
}
