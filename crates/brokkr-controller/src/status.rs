//! Writing a resource's status only when it changed, as a merge patch of the status
//! subresource: a write wakes the controller again, so an unchanged status is never written.

use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
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
    written.record(object, &patched);
    Ok(())
}

/// What this process wrote of each object (by uid), and what of it the watch delivered since:
/// what tells a cached object from before one of its own writes without asking the API server
/// ([`crate::platform::status_is_stale`]). Only writes of this process matter: a controller
/// that starts lists everything after its predecessor's last write.
///
/// A watch delivers an object's versions in the order they were written. So a version it
/// delivers before this process's last write is older than that write, and once the write
/// itself is delivered the cache holds it or something newer: every version seen from then on
/// is current, whoever wrote it (a namespace deletion's `deletionTimestamp`, say), with no GET.
#[derive(Debug, Default)]
pub struct Written(Mutex<Table>);

#[derive(Debug, Default)]
struct Table {
    objects: HashMap<String, Versions>,
    swept: Option<Instant>,
}

/// What is known of one object's versions.
#[derive(Debug)]
struct Versions {
    /// The version of this process's last write.
    last: String,
    /// When it was written.
    written_at: Instant,
    /// Versions older than `last`: earlier writes and the versions they were written over.
    /// Newest last.
    older: VecDeque<String>,
    /// Versions the watch delivered while `last` was on its way: older than `last`, as long as
    /// the watch goes on to deliver it (see [`AWAITED_FOR`]).
    delivered_before: VecDeque<String>,
    /// When the watch delivered `last`.
    delivered: Option<Instant>,
    /// The version the watch delivered last.
    seen: String,
    /// When the object went with one of these writes (its last finalizer removed): every
    /// version of it the cache still holds is stale, until the entry is forgotten.
    gone: Option<Instant>,
}

/// How many older versions of an object are remembered.
const REMEMBERED: usize = 8;
/// How long an object that went is remembered, if its deletion is not seen first.
const GONE_FOR: Duration = Duration::from_secs(300);
/// How long an object is remembered after its last write was delivered: longer than any
/// reconcile holds an object it took from the cache.
const DELIVERED_FOR: Duration = Duration::from_secs(300);
/// How long a version the watch delivered before this process's last write counts as stale
/// while that write has not come: a watch that restarted may list past it and never deliver it,
/// and then such versions are read again from the API server rather than waited on.
const AWAITED_FOR: Duration = Duration::from_secs(30);
/// How often forgotten entries are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// What [`Written`] knows of a version of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// The version this process wrote last, one the watch delivered after it, or nothing of
    /// the object was written.
    Current,
    /// Older than this process's last write (or the object went): the cache is behind.
    Stale,
    /// A version this process did not write and cannot place (someone else changed it while
    /// this process's last write was on its way).
    Unknown,
}

impl Written {
    /// Records `written`, the object as this process's write left it, written over `before`
    /// (the version the write was made from).
    pub fn record<K: Resource>(&self, before: &K, written: &K) {
        let meta = written.meta();
        let (Some(uid), Some(version)) = (&meta.uid, &meta.resource_version) else {
            return;
        };
        let mut table = self.0.lock().expect("lock");
        table.sweep();
        let now = Instant::now();
        let gone =
            meta.deletion_timestamp.is_some() && meta.finalizers.as_ref().is_none_or(Vec::is_empty);
        let Some(entry) = table.objects.get_mut(uid) else {
            let mut entry = Versions::new(version.clone(), now);
            entry.push_older(before.meta().resource_version.clone());
            entry.gone = gone.then_some(now);
            table.objects.insert(uid.clone(), entry);
            return;
        };
        if gone {
            entry.gone = Some(now);
            return;
        }
        if entry.last == *version || before.meta().resource_version.as_ref() == Some(version) {
            // The server changed nothing (and sends no event): what was delivered still is.
            return;
        }
        let previous = std::mem::replace(&mut entry.last, version.clone());
        for older in [Some(previous), before.meta().resource_version.clone()] {
            entry.push_older(older);
        }
        entry.written_at = now;
        entry.delivered_before.clear();
        // A write the server made nothing of answers the version the watch may have brought.
        entry.delivered = (entry.seen == *version).then_some(now);
    }

    /// Takes note of what a controller's watch delivered, after its cache stored it.
    pub fn watched<K: Resource>(&self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(object) => {
                let meta = object.meta();
                let (Some(uid), Some(version)) = (&meta.uid, &meta.resource_version) else {
                    return;
                };
                let mut table = self.0.lock().expect("lock");
                let Some(entry) = table.objects.get_mut(uid) else {
                    return;
                };
                entry.seen.clone_from(version);
                if entry.gone.is_some() || entry.delivered.is_some() {
                    return;
                }
                if *version == entry.last {
                    entry.delivered = Some(Instant::now());
                } else if !entry.older.contains(version)
                    && !entry.delivered_before.contains(version)
                {
                    if entry.delivered_before.len() == REMEMBERED {
                        entry.delivered_before.pop_front();
                    }
                    entry.delivered_before.push_back(version.clone());
                }
            }
            watcher::Event::Delete(object) => {
                if let Some(uid) = &object.meta().uid {
                    self.0.lock().expect("lock").objects.remove(uid);
                }
            }
            // A relist replaces the cache at its end; it places no version but the last write.
            watcher::Event::InitApply(object) => {
                let meta = object.meta();
                let (Some(uid), Some(version)) = (&meta.uid, &meta.resource_version) else {
                    return;
                };
                if let Some(entry) = self.0.lock().expect("lock").objects.get_mut(uid)
                    && entry.last == *version
                {
                    entry.delivered.get_or_insert_with(Instant::now);
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// What is known of `object`'s version.
    pub fn freshness<K: Resource>(&self, object: &K) -> Freshness {
        let meta = object.meta();
        let (Some(uid), Some(version)) = (&meta.uid, &meta.resource_version) else {
            return Freshness::Unknown;
        };
        match self.0.lock().expect("lock").objects.get(uid) {
            None => Freshness::Current,
            Some(entry) if entry.gone.is_some() => Freshness::Stale,
            Some(entry) if entry.last == *version => Freshness::Current,
            Some(entry) if entry.older.contains(version) => Freshness::Stale,
            // Delivered before the last write: surely older once that came, and taken to be
            // while it is expected.
            Some(entry)
                if entry.delivered_before.contains(version)
                    && (entry.delivered.is_some() || entry.written_at.elapsed() < AWAITED_FOR) =>
            {
                Freshness::Stale
            }
            Some(entry) if entry.delivered.is_some() => Freshness::Current,
            Some(_) => Freshness::Unknown,
        }
    }
}

impl Table {
    /// Forgets, at most every [`SWEEP_EVERY`], objects gone or delivered long ago.
    fn sweep(&mut self) {
        let now = Instant::now();
        if self
            .swept
            .is_some_and(|at| now.duration_since(at) < SWEEP_EVERY)
        {
            return;
        }
        self.swept = Some(now);
        let recent =
            |at: Option<Instant>, keep: Duration| at.is_none_or(|at| now.duration_since(at) < keep);
        self.objects
            .retain(|_, v| recent(v.gone, GONE_FOR) && recent(v.delivered, DELIVERED_FOR));
    }
}

impl Versions {
    fn new(last: String, now: Instant) -> Self {
        Self {
            last,
            written_at: now,
            older: VecDeque::new(),
            delivered_before: VecDeque::new(),
            delivered: None,
            seen: String::new(),
            gone: None,
        }
    }

    fn push_older(&mut self, version: Option<String>) {
        let Some(version) = version else { return };
        if version.is_empty() || version == self.last || self.older.contains(&version) {
            return;
        }
        if self.older.len() == REMEMBERED {
            self.older.pop_front();
        }
        self.older.push_back(version);
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
        written.record(&version("1", false), &version("2", false));
        written.record(&version("2", false), &version("3", false));
        assert_eq!(written.freshness(&version("3", false)), Freshness::Current);
        assert_eq!(written.freshness(&version("2", false)), Freshness::Stale);
        assert_eq!(
            written.freshness(&version("1", false)),
            Freshness::Stale,
            "the version the first write was made from"
        );
        assert_eq!(written.freshness(&version("0", false)), Freshness::Unknown);
        assert_eq!(written.freshness(&version("4", false)), Freshness::Unknown);
    }

    #[test]
    fn versions_the_watch_delivers_before_the_last_write_are_stale_and_after_it_current() {
        let written = Written::default();
        written.record(&version("1", false), &version("3", false));
        // Someone else's change, written before this process's: the watch brings it first.
        written.watched(&watcher::Event::Apply(version("2", false)));
        assert_eq!(written.freshness(&version("2", false)), Freshness::Stale);
        assert_eq!(written.freshness(&version("5", false)), Freshness::Unknown);
        written.watched(&watcher::Event::Apply(version("3", false)));
        // Someone else's change after this process's write (a deletionTimestamp, say).
        written.watched(&watcher::Event::Apply(version("5", false)));
        assert_eq!(written.freshness(&version("5", false)), Freshness::Current);
        assert_eq!(written.freshness(&version("2", false)), Freshness::Stale);
        // A write the server made nothing of (the same version, no event) changes nothing.
        written.record(&version("5", false), &version("5", false));
        assert_eq!(written.freshness(&version("8", false)), Freshness::Current);
        written.watched(&watcher::Event::Apply(version("8", false)));
        written.record(&version("5", false), &version("8", false));
        assert_eq!(written.freshness(&version("9", false)), Freshness::Current);
        // A relist places nothing but the last write.
        written.record(&version("5", false), &version("6", false));
        written.watched(&watcher::Event::InitApply(version("7", false)));
        assert_eq!(written.freshness(&version("7", false)), Freshness::Unknown);
        written.watched(&watcher::Event::InitApply(version("6", false)));
        assert_eq!(written.freshness(&version("7", false)), Freshness::Current);
    }

    #[test]
    fn every_version_of_an_object_that_went_is_stale_until_its_deletion_is_seen() {
        let written = Written::default();
        written.record(&version("1", false), &version("2", false));
        written.record(&version("2", false), &version("3", true));
        assert_eq!(written.freshness(&version("2", false)), Freshness::Stale);
        assert_eq!(written.freshness(&version("1", false)), Freshness::Stale);
        written.watched(&watcher::Event::Apply(version("3", true)));
        assert_eq!(written.freshness(&version("2", false)), Freshness::Stale);
        written.watched(&watcher::Event::Delete(version("3", true)));
        assert_eq!(written.freshness(&version("2", false)), Freshness::Current);
    }
}
