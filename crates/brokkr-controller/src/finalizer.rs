//! The finalizers more than one controller knows, and adding and removing a controller's
//! finalizer on any resource, with a JSON patch whose `test`
//! on the current list makes a concurrent change fail with a conflict instead of being lost.

use std::fmt::Debug;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use serde_json::json;

/// The finalizer that keeps a ServiceInstance until the broker has deprovisioned it.
pub const SERVICE_INSTANCE: &str = "services.brokkr.dev/service-instance";
/// The finalizer on a namespaced broker, its classes, plans and credentials Secret while
/// instances of its namespace use them.
pub const SERVICE_BROKER: &str = "services.brokkr.dev/service-broker";

/// Whether `object` carries `finalizer`.
pub fn has<K: Resource>(object: &K, finalizer: &str) -> bool {
    object.finalizers().iter().any(|f| f == finalizer)
}

/// Adds `finalizer` to `object` through `api`, if it is not there yet; the object as written,
/// if it was.
pub async fn add<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    if has(object, finalizer) {
        return Ok(None);
    }
    let mut finalizers = object.finalizers().to_vec();
    finalizers.push(finalizer.to_owned());
    set(api, object, finalizers).await
}

/// Removes `finalizer` from `object` through `api`, if it is there; the object as written, if
/// it was.
/// `object` may be the object or its metadata alone (a `PartialObjectMeta` of a list).
pub async fn remove<K, O>(
    api: &Api<K>,
    object: &O,
    finalizer: &str,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    O: Resource,
{
    if !has(object, finalizer) {
        return Ok(None);
    }
    let finalizers = object
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    set(api, object, finalizers).await
}

async fn set<K, O>(
    api: &Api<K>,
    object: &O,
    finalizers: Vec<String>,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    O: Resource,
{
    let current = object.meta().finalizers.clone();
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": current},
        {"op": "add", "path": "/metadata/finalizers", "value": finalizers},
    ]))
    .expect("a JSON patch");
    api.patch(
        &object.name_any(),
        &PatchParams::default(),
        &Patch::<()>::Json(patch),
    )
    .await
    .map(Some)
}
