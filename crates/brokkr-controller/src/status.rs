//! Writing a resource's status only when it changed, as a merge patch of the status
//! subresource: a write wakes the controller again, so an unchanged status is never written.

use std::fmt::Debug;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt as _};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Patches `object`'s status to `new` unless it equals `old`. The fields named in `cleared` are
/// sent as `null` when `new` leaves them out, so a merge patch removes what an operation that
/// ended had set.
pub async fn write<K, S>(
    api: &Api<K>,
    object: &K,
    old: Option<&S>,
    new: &S,
    cleared: &[&str],
) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    S: Serialize + PartialEq,
{
    if old == Some(new) {
        return Ok(());
    }
    let mut value = serde_json::to_value(new).unwrap_or_default();
    if let Some(fields) = value.as_object_mut() {
        for field in cleared {
            fields.entry(*field).or_insert(Value::Null);
        }
    }
    api.patch_status(
        &object.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": value })),
    )
    .await?;
    Ok(())
}
