//! The classes and plans of both scopes by the names an instance may give them: its resource
//! name, its catalog name (`externalName`) or its catalog id (`externalID`), a plan within its
//! class.
//!
//! Every reconcile of an instance finds its class and plan. Scanning the cached catalogs for
//! them costs every class and plan of every namespace, so one tenant's large catalogs would
//! slow every other tenant's reconciles; looking them up costs the few entries with that name.

use std::sync::Arc;

use kube::Resource;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;

use crate::index::Index;
use crate::resources::{
    ClusterServiceClass, ClusterServicePlan, CommonServiceClassSpec, CommonServicePlanSpec,
    ServiceClass, ServicePlan,
};

/// A name a class or plan is looked up by.
#[derive(Clone, Copy, Debug)]
pub enum CatalogName<'a> {
    /// Its catalog name (`spec.externalName`).
    External(&'a str),
    /// Its catalog id (`spec.externalID`).
    Id(&'a str),
    /// Its resource name.
    Resource(&'a str),
}

/// Classes and plans of both scopes, each filed under its three names.
pub struct CatalogIndex {
    cluster_classes: Index<ClusterServiceClass>,
    cluster_plans: Index<ClusterServicePlan>,
    classes: Index<ServiceClass>,
    plans: Index<ServicePlan>,
}

impl Default for CatalogIndex {
    fn default() -> Self {
        Self {
            cluster_classes: Index::cluster_wide(|c| class_keys(c, &c.spec.common)),
            cluster_plans: Index::cluster_wide(|p| {
                plan_keys(p, &p.spec.cluster_service_class_ref.name, &p.spec.common)
            }),
            classes: Index::new(|c| class_keys(c, &c.spec.common)),
            plans: Index::new(|p| plan_keys(p, &p.spec.service_class_ref.name, &p.spec.common)),
        }
    }
}

impl CatalogIndex {
    /// Takes in what a watch of ClusterServiceClasses says.
    pub fn cluster_class_event(&self, event: &watcher::Event<ClusterServiceClass>) {
        self.cluster_classes.apply(event);
    }

    /// Takes in what a watch of ClusterServicePlans says.
    pub fn cluster_plan_event(&self, event: &watcher::Event<ClusterServicePlan>) {
        self.cluster_plans.apply(event);
    }

    /// Takes in what a watch of ServiceClasses says.
    pub fn class_event(&self, event: &watcher::Event<ServiceClass>) {
        self.classes.apply(event);
    }

    /// Takes in what a watch of ServicePlans says.
    pub fn plan_event(&self, event: &watcher::Event<ServicePlan>) {
        self.plans.apply(event);
    }

    /// The ClusterServiceClass of `store` named by the first of `names` that names one.
    pub fn cluster_class(
        &self,
        store: &Store<ClusterServiceClass>,
        names: &[CatalogName],
    ) -> Option<Arc<ClusterServiceClass>> {
        first(&self.cluster_classes, store, "", None, names)
    }

    /// The ClusterServicePlan of class `class` named by the first of `names` that names one.
    pub fn cluster_plan(
        &self,
        store: &Store<ClusterServicePlan>,
        class: &str,
        names: &[CatalogName],
    ) -> Option<Arc<ClusterServicePlan>> {
        first(&self.cluster_plans, store, "", Some(class), names)
    }

    /// The ServiceClass of `namespace` named by the first of `names` that names one.
    pub fn class(
        &self,
        store: &Store<ServiceClass>,
        namespace: &str,
        names: &[CatalogName],
    ) -> Option<Arc<ServiceClass>> {
        first(&self.classes, store, namespace, None, names)
    }

    /// The ServicePlan of `namespace` and class `class` named by the first of `names` that
    /// names one.
    pub fn plan(
        &self,
        store: &Store<ServicePlan>,
        namespace: &str,
        class: &str,
        names: &[CatalogName],
    ) -> Option<Arc<ServicePlan>> {
        first(&self.plans, store, namespace, Some(class), names)
    }
}

/// The object of `store` filed in `index` under the first of `names` (within `class`, for a
/// plan) that has one; of two with the same name, the one first by resource name.
fn first<K>(
    index: &Index<K>,
    store: &Store<K>,
    namespace: &str,
    class: Option<&str>,
    names: &[CatalogName],
) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    names.iter().find_map(|name| {
        let mut filed = index.get(namespace, &key(class, *name));
        filed.sort_by(|a, b| a.name.cmp(&b.name));
        filed.iter().find_map(|reference| store.get(reference))
    })
}

fn class_keys<K: Resource>(class: &K, spec: &CommonServiceClassSpec) -> Vec<String> {
    names(
        None,
        class.meta().name.as_deref(),
        &spec.external_name,
        &spec.external_id,
    )
}

fn plan_keys<K: Resource>(plan: &K, class: &str, spec: &CommonServicePlanSpec) -> Vec<String> {
    names(
        Some(class),
        plan.meta().name.as_deref(),
        &spec.external_name,
        &spec.external_id,
    )
}

fn names(class: Option<&str>, name: Option<&str>, external: &str, id: &str) -> Vec<String> {
    let mut keys = vec![
        key(class, CatalogName::External(external)),
        key(class, CatalogName::Id(id)),
    ];
    keys.extend(name.map(|name| key(class, CatalogName::Resource(name))));
    keys
}

/// The key of `name` (within `class`, for a plan): the kind of name, then the name. A class
/// name holds no `/`, so no two keys collide.
fn key(class: Option<&str>, name: CatalogName) -> String {
    let (kind, name) = match name {
        CatalogName::External(n) => ("external", n),
        CatalogName::Id(n) => ("id", n),
        CatalogName::Resource(n) => ("resource", n),
    };
    match class {
        Some(class) => format!("{class}/{kind}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store::Writer;

    fn class(namespace: &str, name: &str, external: &str, id: &str) -> ServiceClass {
        let mut class: ServiceClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "services.brokkr.dev/v1alpha1",
            "kind": "ServiceClass",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"externalName": external, "externalID": id, "serviceBrokerName": "b",
                     "bindable": true, "description": "", "planUpdatable": false}
        }))
        .expect("a ServiceClass");
        class.metadata.namespace = Some(namespace.into());
        class
    }

    #[test]
    fn a_class_is_found_by_each_of_its_names_in_its_namespace_only() {
        let index = CatalogIndex::default();
        let mut writer = Writer::default();
        for event in [
            watcher::Event::Apply(class("a", "c-1", "postgresql", "id-1")),
            watcher::Event::Apply(class("b", "c-2", "postgresql", "id-2")),
        ] {
            writer.apply_watcher_event(&event);
            index.class_event(&event);
        }
        let store = writer.as_reader();
        let found = |namespace, names: &[CatalogName]| {
            index
                .class(&store, namespace, names)
                .map(|c| c.metadata.name.clone().unwrap())
        };
        assert_eq!(
            found("a", &[CatalogName::External("postgresql")]).as_deref(),
            Some("c-1")
        );
        assert_eq!(
            found("b", &[CatalogName::External("postgresql")]).as_deref(),
            Some("c-2")
        );
        assert_eq!(
            found("a", &[CatalogName::Id("id-1")]).as_deref(),
            Some("c-1")
        );
        assert_eq!(
            found("a", &[CatalogName::Resource("c-1")]).as_deref(),
            Some("c-1")
        );
        // Another namespace's class is not found, by any of its names.
        assert_eq!(found("a", &[CatalogName::Id("id-2")]), None);
        assert_eq!(found("a", &[CatalogName::Resource("c-2")]), None);
        // A catalog name is not a resource name.
        assert_eq!(found("a", &[CatalogName::Resource("postgresql")]), None);
        // The first name that names a class wins.
        assert_eq!(
            found(
                "a",
                &[CatalogName::External("redis"), CatalogName::Id("id-1")]
            )
            .as_deref(),
            Some("c-1")
        );
    }
}
