//! The fake's state: the kinds it serves, the objects, and the history of changes watchers
//! read, all behind one lock so that every change gets the next resourceVersion in order.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

/// When every object was created and marked deleted: the fake keeps no clock.
const CREATED: &str = "2026-01-01T00:00:00Z";

/// A kind the fake serves.
#[derive(Debug, Clone)]
pub(crate) struct KindDef {
    pub(crate) group: String,
    pub(crate) version: String,
    pub(crate) kind: String,
    pub(crate) plural: String,
    pub(crate) namespaced: bool,
}

impl KindDef {
    pub(crate) fn api_version(&self) -> String {
        match self.group.as_str() {
            "" => self.version.clone(),
            g => format!("{g}/{}", self.version),
        }
    }
}

/// Where an object is stored: (group, plural, namespace or "", name).
pub(crate) type Key = (String, String, String, String);

/// One change, as watchers see it.
#[derive(Debug)]
pub(crate) struct Event {
    /// The resourceVersion the change gave.
    pub(crate) version: u64,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub(crate) kind: &'static str,
    pub(crate) key: Key,
    /// The object after the change (before it, for a deletion, with the new resourceVersion).
    pub(crate) object: Value,
}

/// Everything the fake holds.
pub(crate) struct State {
    pub(crate) kinds: Vec<KindDef>,
    pub(crate) objects: BTreeMap<Key, Value>,
    /// The last resourceVersion given.
    pub(crate) version: u64,
    /// Every change so far, oldest first.
    pub(crate) history: Vec<Arc<Event>>,
    /// Live watchers.
    pub(crate) events: broadcast::Sender<Arc<Event>>,
    pub(crate) requests: Vec<String>,
    pub(crate) user_agents: Vec<String>,
    /// Changes made to an object just before a PATCH of it is served, as another writer's.
    pub(crate) interferences: Vec<Interference>,
}

/// Another writer's change to the object at `key`, made before each of the next `remaining`
/// PATCH requests to it is served.
pub(crate) struct Interference {
    pub(crate) key: Key,
    pub(crate) remaining: usize,
    pub(crate) change: Box<dyn FnMut(&mut Value) + Send>,
}

impl Default for State {
    fn default() -> Self {
        Self {
            kinds: Vec::new(),
            objects: BTreeMap::new(),
            version: 0,
            history: Vec::new(),
            events: broadcast::channel(1024).0,
            requests: Vec::new(),
            user_agents: Vec::new(),
            interferences: Vec::new(),
        }
    }
}

impl State {
    /// Makes the changes the [`Interference`]s hold for a PATCH of `key`, each as a write of
    /// its own.
    pub(crate) fn interfere(&mut self, key: &Key) {
        let mut interferences = std::mem::take(&mut self.interferences);
        for interference in interferences
            .iter_mut()
            .filter(|i| i.key == *key && i.remaining > 0)
        {
            interference.remaining -= 1;
            if let Some(before) = self.objects.get(key).cloned() {
                let mut object = before.clone();
                (interference.change)(&mut object);
                self.store(key.clone(), object, Some(&before));
            }
        }
        interferences.retain(|i| i.remaining > 0);
        self.interferences = interferences;
    }

    pub(crate) fn kind_of(&self, api_version: &str, kind: &str) -> Option<KindDef> {
        self.kinds
            .iter()
            .find(|k| k.api_version() == api_version && k.kind == kind)
            .cloned()
    }

    pub(crate) fn key(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<Key> {
        let def = self.kind_of(api_version, kind)?;
        let ns = if def.namespaced {
            ns.unwrap_or_default()
        } else {
            ""
        };
        Some((def.group, def.plural, ns.to_owned(), name.to_owned()))
    }

    pub(crate) fn namespace_exists(&self, ns: &str) -> bool {
        let key = (
            String::new(),
            "namespaces".into(),
            String::new(),
            ns.to_owned(),
        );
        self.objects.contains_key(&key)
    }

    /// Stores `object` at `key` (`before` is what is stored there now) with the metadata the
    /// server keeps, and tells watchers. An object marked deleted whose last finalizer went is
    /// deleted instead. Returns the object as stored (or as last seen).
    pub(crate) fn store(&mut self, key: Key, object: Value, before: Option<&Value>) -> Value {
        let object = self.stamp(object, before);
        let held = object["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        // A namespace being deleted waits for what it holds, not for finalizers.
        if object["metadata"].get("deletionTimestamp").is_some() && !held && !is_namespace(&key) {
            self.objects.insert(key.clone(), object);
            return self.remove(&key).unwrap_or_default();
        }
        self.objects.insert(key.clone(), object.clone());
        let kind = if before.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.record(kind, key, object.clone());
        object
    }

    /// Deletes what `key` names, or marks it deleted while it has finalizers. Returns the
    /// object and whether it is gone.
    pub(crate) fn delete(&mut self, key: &Key) -> Option<(Value, bool)> {
        let before = self.objects.get(key)?.clone();
        if is_namespace(key) {
            return Some(self.delete_namespace(key, before));
        }
        let held = before["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if !held {
            return self.remove(key).map(|o| (o, true));
        }
        if before["metadata"].get("deletionTimestamp").is_some() {
            return Some((before, false));
        }
        let mut marked = before.clone();
        marked["metadata"]["deletionTimestamp"] = json!(deleted_now());
        Some((self.store(key.clone(), marked, Some(&before)), false))
    }

    /// Deletes what a namespace holds, as the namespace controller would: objects with
    /// finalizers are only marked deleted, and the namespace stays (`Terminating`, marked deleted)
    /// until the last of them has gone.
    fn delete_namespace(&mut self, key: &Key, before: Value) -> (Value, bool) {
        for inside in self.inside(&key.3) {
            self.delete(&inside);
        }
        if self.inside(&key.3).is_empty() {
            return (self.remove(key).unwrap_or_default(), true);
        }
        let mut marked = before.clone();
        marked["metadata"]["deletionTimestamp"] = json!(deleted_now());
        marked["status"]["phase"] = json!("Terminating");
        (self.store(key.clone(), marked, Some(&before)), false)
    }

    /// The keys of the objects in namespace `ns`.
    fn inside(&self, ns: &str) -> Vec<Key> {
        self.objects
            .keys()
            .filter(|k| !k.2.is_empty() && k.2 == ns)
            .cloned()
            .collect()
    }

    /// Whether namespace `ns` is being deleted: no new object may be created in it.
    pub(crate) fn namespace_terminating(&self, ns: &str) -> bool {
        let key = (
            String::new(),
            "namespaces".into(),
            String::new(),
            ns.to_owned(),
        );
        self.objects
            .get(&key)
            .is_some_and(|n| n["metadata"].get("deletionTimestamp").is_some())
    }

    /// Removes an object (a namespace with everything in it) and tells watchers; the last object
    /// of a namespace being deleted takes the namespace with it.
    fn remove(&mut self, key: &Key) -> Option<Value> {
        let mut removed = self.objects.remove(key)?;
        if is_namespace(key) {
            let inside: Vec<Key> = self
                .objects
                .keys()
                .filter(|k| k.2 == key.3)
                .cloned()
                .collect();
            for k in inside {
                self.remove(&k);
            }
        }
        self.version += 1;
        removed["metadata"]["resourceVersion"] = json!(self.version.to_string());
        self.record("DELETED", key.clone(), removed.clone());
        if !key.2.is_empty() && self.namespace_terminating(&key.2) && self.inside(&key.2).is_empty()
        {
            let namespace = (
                String::new(),
                "namespaces".into(),
                String::new(),
                key.2.clone(),
            );
            self.remove(&namespace);
        }
        Some(removed)
    }

    fn record(&mut self, kind: &'static str, key: Key, object: Value) {
        let event = Arc::new(Event {
            version: self.version,
            kind,
            key,
            object,
        });
        self.history.push(event.clone());
        // No receiver is fine: nobody watches.
        let _ = self.events.send(event);
    }

    /// Adds the metadata the server keeps: a new resourceVersion; uid, creationTimestamp
    /// and deletionTimestamp kept from `before` (set on creation); generation bumped when
    /// anything but metadata and status changes. A Secret's stringData is written into its data.
    fn stamp(&mut self, mut object: Value, before: Option<&Value>) -> Value {
        self.version += 1;
        if object["kind"] == "Secret"
            && let Some(Value::Object(strings)) =
                object.as_object_mut().and_then(|o| o.remove("stringData"))
        {
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
                if content(b) == content(&object) {
                    g
                } else {
                    g + 1
                }
            }
        };
        let version = self.version.to_string();
        let meta = &mut object["metadata"];
        meta["resourceVersion"] = json!(version);
        meta["generation"] = json!(generation);
        for field in ["uid", "creationTimestamp", "deletionTimestamp"] {
            if let Some(kept) = before.and_then(|b| b["metadata"].get(field)) {
                meta[field] = kept.clone();
            }
        }
        if meta.get("uid").is_none() {
            meta["uid"] = json!(format!("uid-{version}"));
        }
        if meta.get("creationTimestamp").is_none() {
            meta["creationTimestamp"] = json!(CREATED);
        }
        object
    }
}

/// An object without `metadata` and `status`: what its generation describes.
fn content(object: &Value) -> Map<String, Value> {
    let mut map = object.as_object().cloned().unwrap_or_default();
    map.remove("metadata");
    map.remove("status");
    map
}

fn is_namespace(key: &Key) -> bool {
    key.0.is_empty() && key.1 == "namespaces"
}

/// The time a deletion is marked with: now, in whole seconds, as the API server writes it.
fn deleted_now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
