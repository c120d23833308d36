//! Indexes kept beside the watch caches: which objects name a given thing.
//!
//! A change to one instance or Secret concerns a few bindings or instances of its namespace, yet
//! finding them by scanning a cache costs every cached object, for every change: quadratic in
//! the objects a controller serves. An [`Index`] keeps, for each key (a namespace and a name),
//! the objects whose keys include it, updated from the same watch events that fill the cache
//! and before the change is broadcast, so a follower that hears of a change finds the index
//! already up to date.
//!
//! - bindings by the instance they name ([`crate::cache::Caches::bindings_of_instance`]);
//! - bindings by the Secrets they read (`parametersFrom`, `addKeysFrom`), and instances by the
//!   Secrets their `parametersFrom` names ([`crate::cache::Caches::bindings_of_secret`],
//!   [`crate::cache::Caches::instances_of_secret`]);
//! - instances by their OSB id, across namespaces ([`crate::cache::Caches::instances_with_id`]):
//!   an instance's first provision checks that no other has its id.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

/// What an object is indexed under: a name within the object's namespace.
pub type Key = (String, String);

/// The objects of kind `K` under each key, as the keys of [`Index::new`]'s function say.
pub struct Index<K: Resource<DynamicType = ()>> {
    keys_of: fn(&K) -> Vec<String>,
    /// Whether a key is a name within the object's namespace, or one name for the cluster.
    namespaced: bool,
    state: Mutex<State<K>>,
}

struct State<K: Resource<DynamicType = ()>> {
    by_key: HashMap<Key, HashSet<ObjectRef<K>>>,
    keys: HashMap<ObjectRef<K>, Vec<Key>>,
    /// A relisting in progress: the index it builds replaces the current one at its end.
    relisting: Option<HashMap<ObjectRef<K>, Vec<Key>>>,
}

impl<K: Resource<DynamicType = ()>> Index<K> {
    /// An empty index whose objects are filed under the names `keys_of` gives (each within the
    /// object's namespace).
    pub fn new(keys_of: fn(&K) -> Vec<String>) -> Self {
        Self {
            namespaced: true,
            ..Self::cluster_wide(keys_of)
        }
    }

    /// An empty index whose objects are filed under the names `keys_of` gives, whatever their
    /// namespace: [`Index::get`] them with the namespace `""`.
    pub fn cluster_wide(keys_of: fn(&K) -> Vec<String>) -> Self {
        Self {
            keys_of,
            namespaced: false,
            state: Mutex::new(State {
                by_key: HashMap::new(),
                keys: HashMap::new(),
                relisting: None,
            }),
        }
    }

    /// Takes in what a watch event says, as the cache does.
    pub fn apply(&self, event: &watcher::Event<K>) {
        let mut state = self.state.lock().expect("lock");
        match event {
            watcher::Event::Apply(object) => {
                let keys = self.keys(object);
                state.set(reference(object), keys);
            }
            watcher::Event::Delete(object) => state.set(reference(object), Vec::new()),
            watcher::Event::Init => state.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(object) => {
                let keys = self.keys(object);
                if let Some(relisting) = &mut state.relisting {
                    relisting.insert(reference(object), keys);
                }
            }
            watcher::Event::InitDone => {
                let listed = state.relisting.take().unwrap_or_default();
                state.by_key.clear();
                state.keys.clear();
                for (object, keys) in listed {
                    state.set(object, keys);
                }
            }
        }
    }

    /// The objects filed under `name` in `namespace`.
    pub fn get(&self, namespace: &str, name: &str) -> Vec<ObjectRef<K>> {
        let state = self.state.lock().expect("lock");
        state
            .by_key
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(|objects| objects.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn keys(&self, object: &K) -> Vec<Key> {
        let namespace = match self.namespaced {
            true => object.meta().namespace.clone().unwrap_or_default(),
            false => String::new(),
        };
        let mut keys: Vec<Key> = (self.keys_of)(object)
            .into_iter()
            .map(|name| (namespace.clone(), name))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }
}

/// A reference to `object` by namespace and name alone. An index needs nothing more, and the
/// uid and version `ObjectRef::from_obj` adds (its `extra`, which equality ignores) would cost
/// two strings for every object filed.
fn reference<K: Resource<DynamicType = ()>>(object: &K) -> ObjectRef<K> {
    let mut reference = ObjectRef::from_obj(object);
    reference.extra = Default::default();
    reference
}

impl<K: Resource<DynamicType = ()>> State<K> {
    /// Files `object` under `keys` alone (none: it is forgotten).
    fn set(&mut self, object: ObjectRef<K>, keys: Vec<Key>) {
        for old in self.keys.remove(&object).unwrap_or_default() {
            if let Some(objects) = self.by_key.get_mut(&old) {
                objects.remove(&object);
                if objects.is_empty() {
                    self.by_key.remove(&old);
                }
            }
        }
        if keys.is_empty() {
            return;
        }
        for key in &keys {
            self.by_key
                .entry(key.clone())
                .or_default()
                .insert(object.clone());
        }
        self.keys.insert(object, keys);
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;

    /// A ConfigMap filed under the values of its data.
    fn map(namespace: &str, name: &str, names: &[&str]) -> ConfigMap {
        let mut object = ConfigMap::default();
        object.metadata.namespace = Some(namespace.into());
        object.metadata.name = Some(name.into());
        object.data = Some(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| (i.to_string(), (*n).to_owned()))
                .collect(),
        );
        object
    }

    fn index() -> Index<ConfigMap> {
        Index::new(|m| m.data.iter().flatten().map(|(_, v)| v.clone()).collect())
    }

    fn names(refs: Vec<ObjectRef<ConfigMap>>) -> Vec<String> {
        let mut names: Vec<String> = refs.into_iter().map(|r| r.name).collect();
        names.sort();
        names
    }

    #[test]
    fn an_object_is_found_under_its_keys_in_its_namespace_until_they_change() {
        let index = index();
        index.apply(&watcher::Event::Apply(map("a", "one", &["db", "creds"])));
        index.apply(&watcher::Event::Apply(map("a", "two", &["db"])));
        index.apply(&watcher::Event::Apply(map("b", "three", &["db"])));
        assert_eq!(names(index.get("a", "db")), ["one", "two"]);
        assert_eq!(names(index.get("a", "creds")), ["one"]);
        assert_eq!(names(index.get("b", "db")), ["three"]);

        // A change of keys moves the object; a deletion forgets it.
        index.apply(&watcher::Event::Apply(map("a", "one", &["other"])));
        assert_eq!(names(index.get("a", "db")), ["two"]);
        assert!(index.get("a", "creds").is_empty());
        assert_eq!(names(index.get("a", "other")), ["one"]);
        index.apply(&watcher::Event::Delete(map("a", "two", &["db"])));
        assert!(index.get("a", "db").is_empty());
    }

    #[test]
    fn a_cluster_wide_index_finds_objects_of_every_namespace_under_one_key() {
        let index = Index::cluster_wide(|m: &ConfigMap| {
            m.data.iter().flatten().map(|(_, v)| v.clone()).collect()
        });
        index.apply(&watcher::Event::Apply(map("a", "one", &["id-1"])));
        index.apply(&watcher::Event::Apply(map("b", "two", &["id-1"])));
        index.apply(&watcher::Event::Apply(map("b", "three", &["id-2"])));
        let found = index.get("", "id-1");
        let mut found: Vec<_> = found
            .iter()
            .map(|r| (r.namespace.clone().unwrap_or_default(), r.name.clone()))
            .collect();
        found.sort();
        assert_eq!(
            found,
            [("a".into(), "one".into()), ("b".into(), "two".into())]
        );
        assert!(index.get("b", "id-1").is_empty());
    }

    #[test]
    fn a_relisting_replaces_the_index_at_its_end() {
        let index = index();
        index.apply(&watcher::Event::Apply(map("a", "gone", &["db"])));
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(map("a", "kept", &["db"])));
        // Until the listing ends, the index says what it said.
        assert_eq!(names(index.get("a", "db")), ["gone"]);
        index.apply(&watcher::Event::InitDone);
        assert_eq!(names(index.get("a", "db")), ["kept"]);
    }
}
