//! The HTTP side of the fake: routing, discovery, and each verb on collections and objects.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::response::{not_found, ok, shown, status};
use crate::select::Selection;
use crate::store::{Key, KindDef, State};
use crate::watch::watch;

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

/// A request, as the verbs read it.
struct Request<'a> {
    method: &'a Method,
    /// The client asked for metadata only (`Accept: …;as=PartialObjectMetadata…`).
    metadata_only: bool,
    content_type: String,
    query: Vec<(String, String)>,
    body: &'a [u8],
}

impl Request<'_> {
    fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Serves one request.
pub(crate) fn handle(
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
    let path = uri.path();
    state
        .requests
        .push(format!("{method} {path}?{query} {content_type}"));
    let user_agent = headers
        .get("user-agent")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    state.user_agents.push(user_agent.to_owned());
    let request = Request {
        method,
        metadata_only: headers
            .get("accept")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("as=PartialObjectMetadata")),
        content_type,
        query: url::form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect(),
        body,
    };
    if path == "/api" {
        return ok(
            json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
        );
    }
    if path == "/apis" {
        return ok(groups(&state));
    }
    let Some((group, version, rest)) = split(path) else {
        return not_found(format!("no route {path}"));
    };
    let defs: Vec<KindDef> = state
        .kinds
        .iter()
        .filter(|k| k.group == group && k.version == version)
        .cloned()
        .collect();
    if defs.is_empty() {
        return not_found(format!("group {group}/{version} is not served"));
    }
    if rest.is_empty() {
        return ok(resources(&defs));
    }
    // [namespaces, NS, plural, (name, (status))] or [plural, (name, (status))]
    let (ns, rest) = if rest[0] == "namespaces" && rest.len() >= 3 && rest[2] != "status" {
        (rest[1].clone(), rest[2..].to_vec())
    } else {
        (String::new(), rest)
    };
    let Some(def) = defs.iter().find(|k| k.plural == rest[0]).cloned() else {
        return not_found(format!(
            "the server could not find the requested resource {}",
            rest[0]
        ));
    };
    let Some(name) = rest.get(1).cloned() else {
        return collection(&mut state, &request, &def, &ns);
    };
    if def.namespaced == ns.is_empty() {
        let not = if def.namespaced { "" } else { "not " };
        return not_found(format!("{} is {not}namespaced", def.kind));
    }
    let status_only = rest.get(2).is_some_and(|s| s == "status");
    let key = (def.group.clone(), def.plural.clone(), ns, name);
    object(&mut state, &request, &def, key, status_only)
}

/// `/apis`: the groups of the kinds served.
fn groups(state: &State) -> Value {
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
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// A group version's resource list.
fn resources(defs: &[KindDef]) -> Value {
    let verbs = [
        "create", "delete", "get", "list", "patch", "update", "watch",
    ];
    let mut resources = Vec::new();
    for k in defs {
        resources.push(
            json!({"name": k.plural, "singularName": k.kind.to_lowercase(),
            "namespaced": k.namespaced, "kind": k.kind, "verbs": verbs}),
        );
        resources.push(
            json!({"name": format!("{}/status", k.plural), "singularName": "",
            "namespaced": k.namespaced, "kind": k.kind, "verbs": ["get", "patch", "update"]}),
        );
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": defs[0].api_version(),
        "resources": resources})
}

/// LIST, WATCH and POST on a collection.
fn collection(state: &mut State, request: &Request<'_>, def: &KindDef, ns: &str) -> Response {
    match *request.method {
        Method::GET => {
            let selection = Selection::new(def, ns, &request.query);
            if request
                .param("watch")
                .is_some_and(|w| w == "true" || w == "1")
            {
                let timeout = request
                    .param("timeoutSeconds")
                    .and_then(|t| t.parse().ok())
                    .map(Duration::from_secs);
                let (from, metadata_only) =
                    (request.param("resourceVersion"), request.metadata_only);
                return watch(state, selection, from, timeout, metadata_only);
            }
            let items: Vec<Value> = state
                .objects
                .iter()
                .filter(|(k, o)| selection.matches(k, o))
                .map(|(_, o)| shown(o, request.metadata_only))
                .collect();
            let (kind, api_version) = if request.metadata_only {
                (
                    "PartialObjectMetadataList".to_owned(),
                    "meta.k8s.io/v1".to_owned(),
                )
            } else {
                (format!("{}List", def.kind), def.api_version())
            };
            ok(json!({"kind": kind, "apiVersion": api_version,
                "metadata": {"resourceVersion": state.version.to_string()}, "items": items}))
        }
        Method::POST => {
            let Ok(mut object) = serde_json::from_slice::<Value>(request.body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON".into());
            };
            let mut name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if name.is_empty()
                && let Some(prefix) = object["metadata"]["generateName"].as_str()
            {
                // The API server adds five random characters; the next version number serves.
                name = format!("{prefix}{:05}", state.version + 1);
                object["metadata"]["name"] = json!(name);
            }
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
            if def.namespaced && !state.namespace_exists(ns) {
                return not_found(format!("namespaces \"{ns}\" not found"));
            }
            if def.namespaced && state.namespace_terminating(ns) {
                let message = format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                );
                return status(StatusCode::FORBIDDEN, "Forbidden", message);
            }
            object["apiVersion"] = json!(def.api_version());
            object["kind"] = json!(def.kind);
            if def.namespaced {
                object["metadata"]["namespace"] = json!(ns);
            }
            let stored = state.store(key, object, None);
            (StatusCode::CREATED, axum::Json(stored)).into_response()
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            request.method.to_string(),
        ),
    }
}

/// GET, PUT, PATCH and DELETE on an object, or on its `status` when `status_only`.
fn object(
    state: &mut State,
    request: &Request<'_>,
    def: &KindDef,
    key: Key,
    status_only: bool,
) -> Response {
    let what = format!("{} \"{}\"", def.plural, key.3);
    if *request.method == Method::PATCH {
        state.interfere(&key);
    }
    let before = state.objects.get(&key).cloned();
    match *request.method {
        Method::GET => match before {
            Some(o) => ok(shown(&o, request.metadata_only)),
            None => not_found(format!("{what} not found")),
        },
        Method::DELETE => match state.delete(&key) {
            None => not_found(format!("{what} not found")),
            Some((object, false)) => ok(object),
            Some((_, true)) => ok(
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": key.3, "kind": def.plural}}),
            ),
        },
        Method::PUT | Method::PATCH => {
            let apply = request.content_type.starts_with("application/apply-patch");
            if apply && request.param("fieldManager").is_none() {
                let message = "apply needs a fieldManager".into();
                return status(StatusCode::BAD_REQUEST, "BadRequest", message);
            }
            if def.namespaced && !state.namespace_exists(&key.2) {
                return not_found(format!("namespaces \"{}\" not found", key.2));
            }
            let base = match (&before, apply) {
                (Some(b), _) => b.clone(),
                (None, true) => json!({}),
                (None, false) => return not_found(format!("{what} not found")),
            };
            let changed = match change(request, base) {
                Ok(changed) => changed,
                Err((code, reason, message)) => return status(code, reason, message),
            };
            let stale = before.as_ref().is_some_and(|b| {
                let given = &changed["metadata"]["resourceVersion"];
                given.as_str().is_some_and(|v| !v.is_empty())
                    && *given != b["metadata"]["resourceVersion"]
            });
            if stale {
                return status(
                    StatusCode::CONFLICT,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on {what}: the object has been modified; \
                         please apply your changes to the latest version and try again"
                    ),
                );
            }
            let mut object = subresource(before.as_ref(), changed, status_only);
            object["apiVersion"] = json!(def.api_version());
            object["kind"] = json!(def.kind);
            object["metadata"]["name"] = json!(key.3);
            if def.namespaced {
                object["metadata"]["namespace"] = json!(key.2);
            }
            ok(state.store(key, object, before.as_ref()))
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            request.method.to_string(),
        ),
    }
}

/// Why a request is refused: its status code, reason and message.
type Refusal = (StatusCode, &'static str, String);

/// The object a PUT or a PATCH makes of `base`.
fn change(request: &Request<'_>, mut base: Value) -> Result<Value, Refusal> {
    let Ok(body) = serde_json::from_slice::<Value>(request.body) else {
        let message = "the fake reads JSON bodies only".into();
        return Err((StatusCode::BAD_REQUEST, "BadRequest", message));
    };
    if *request.method == Method::PUT {
        return Ok(body);
    }
    let content_type = request.content_type.as_str();
    if content_type.starts_with("application/json-patch") {
        let mut patch: json_patch::Patch = serde_json::from_value(body).map_err(|e| {
            let message = format!("JSON patch: {e}");
            (StatusCode::BAD_REQUEST, "BadRequest", message)
        })?;
        // A real server (evanphx/json-patch) takes an absent value to equal `null`.
        patch.0.retain(|op| match op {
            json_patch::PatchOperation::Test(t) => {
                !(t.value.is_null() && base.pointer(t.path.as_str()).is_none())
            }
            _ => true,
        });
        json_patch::patch(&mut base, &patch).map_err(|e| {
            // As a real server (evanphx/json-patch) words a failed `test`.
            let message = match e.kind {
                json_patch::PatchErrorKind::TestFailed => {
                    format!("testing value {} failed: test failed", e.path)
                }
                _ => format!("JSON patch: {e}"),
            };
            (StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message)
        })?;
        return Ok(base);
    }
    let merges = [
        "application/merge-patch",
        "application/apply-patch",
        "application/strategic-merge-patch",
    ];
    if !merges.iter().any(|m| content_type.starts_with(m)) {
        return Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            content_type.to_owned(),
        ));
    }
    merge(&mut base, body);
    Ok(base)
}

/// What is stored after a change: through `/status`, the stored object with the changed
/// status; through the object's own path, the changed object with the stored status.
fn subresource(before: Option<&Value>, changed: Value, status_only: bool) -> Value {
    let (mut object, status) = match (status_only, before) {
        (true, Some(b)) => (b.clone(), changed.get("status").cloned()),
        (true, None) => (changed, None),
        (false, _) => (changed, before.and_then(|b| b.get("status").cloned())),
    };
    if let Value::Object(map) = &mut object {
        match status {
            Some(s) => map.insert("status".into(), s),
            None => map.remove("status"),
        };
    }
    object
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
