//! Writing a resource's status only when it changed, as a merge patch of the status
//! subresource: a write wakes the controller again, so an unchanged status is never written.

use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt as _};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Patches `object`'s status to `new` unless it equals `old`, and records the version written
/// in `written`. The fields named in `cleared` are sent as `null` when `new` leaves them out, so
/// a merge patch removes what an operation that ended had set.
pub async fn write<K, S>(
    api: &Api<K>,
    object: &K,
    old: Option<&S>,
    new: &S,
    cleared: &[&str],
    written: &Written,
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
    let patched = api
        .patch_status(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": value })),
        )
        .await?;
    written.record(&patched);
    Ok(())
}

/// The `resourceVersion`s this process wrote last of each object (by uid): what tells a cached
/// object from before one of its own writes without asking the API server
/// ([`crate::platform::status_is_stale`]). Only writes of this process matter: a controller
/// that starts lists everything after its predecessor's last write.
#[derive(Debug, Default)]
pub struct Written(Mutex<HashMap<String, Versions>>);

/// The versions of one object this process wrote, newest last.
#[derive(Debug, Default)]
struct Versions {
    versions: VecDeque<String>,
    /// When the object went with one of these writes (its last finalizer removed): every
    /// version of it the cache still holds is stale, until the entry is forgotten.
    gone: Option<Instant>,
}

/// How many of an object's own writes are remembered.
const REMEMBERED: usize = 8;
/// How long an object that went is remembered (its deletion reaches the cache long before).
const GONE_FOR: Duration = Duration::from_secs(60);

/// What [`Written`] knows of a version of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// The version this process wrote last, or nothing of it was written.
    Current,
    /// A version this process wrote and has written over since (or the object went): the cache
    /// is behind.
    Stale,
    /// A version this process did not write (someone else changed it since, or before).
    Unknown,
}

impl Written {
    /// Records `object` as written (its uid and resourceVersion).
    pub fn record<K: Resource>(&self, object: &K) {
        let meta = object.meta();
        let (Some(uid), Some(version)) = (&meta.uid, &meta.resource_version) else {
            return;
        };
        let mut written = self.0.lock().expect("lock");
        let now = Instant::now();
        if meta.deletion_timestamp.is_some() && meta.finalizers.as_ref().is_none_or(Vec::is_empty) {
            // Gone with this write. Objects gone long ago are forgotten now.
            written.retain(|_, v| v.gone.is_none_or(|at| now.duration_since(at) < GONE_FOR));
            written.entry(uid.clone()).or_default().gone = Some(now);
            return;
        }
        let entry = written.entry(uid.clone()).or_default();
        if entry.versions.len() == REMEMBERED {
            entry.versions.pop_front();
        }
        entry.versions.push_back(version.clone());
    }

    /// What is known of `object`'s version.
    pub fn freshness<K: Resource>(&self, object: &K) -> Freshness {
        let meta = object.meta();
        let (Some(uid), Some(version)) = (&meta.uid, &meta.resource_version) else {
            return Freshness::Unknown;
        };
        match self.0.lock().expect("lock").get(uid) {
            None => Freshness::Current,
            Some(entry) if entry.gone.is_some() => Freshness::Stale,
            Some(entry) if entry.versions.back() == Some(version) => Freshness::Current,
            Some(entry) if entry.versions.contains(version) => Freshness::Stale,
            Some(_) => Freshness::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn version(rv: &str, gone: bool) -> ConfigMap {
        let mut object = ConfigMap::default();
        object.metadata.uid = Some("u1".into());
        object.metadata.resource_version = Some(rv.into());
        if gone {
            object.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
        } else {
            object.metadata.finalizers = Some(vec!["f".into()]);
        }
        object
    }

    #[test]
    fn a_version_written_over_is_stale_and_one_written_by_others_unknown() {
        let written = Written::default();
        assert_eq!(written.freshness(&version("1", false)), Freshness::Current);
        written.record(&version("2", false));
        written.record(&version("3", false));
        assert_eq!(written.freshness(&version("3", false)), Freshness::Current);
        assert_eq!(written.freshness(&version("2", false)), Freshness::Stale);
        assert_eq!(written.freshness(&version("1", false)), Freshness::Unknown);
        assert_eq!(written.freshness(&version("4", false)), Freshness::Unknown);
    }

    #[test]
    fn every_version_of_an_object_that_went_is_stale() {
        let written = Written::default();
        written.record(&version("2", false));
        written.record(&version("3", true));
        assert_eq!(written.freshness(&version("2", false)), Freshness::Stale);
        assert_eq!(written.freshness(&version("1", false)), Freshness::Stale);
    }
}
