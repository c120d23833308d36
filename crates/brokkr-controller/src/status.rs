//! Writing a resource's status only when it changed, as a merge patch of the status
//! subresource: a write wakes the controller again, so an unchanged status is never written.

use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::api::{ObjectMeta, Patch, PatchParams};
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
/// (`status_is_stale`). Only writes of this process matter: a controller
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
    objects: HashMap<u128, Versions>,
    swept: Option<Instant>,
}

/// What is known of one object's versions.
#[derive(Debug)]
struct Versions {
    /// The version of this process's last write.
    last: u64,
    /// When it was written.
    written_at: Instant,
    /// Versions older than `last`: earlier writes and the versions they were written over.
    /// Newest last.
    older: VecDeque<u64>,
    /// Versions the watch delivered while `last` was on its way: older than `last`, as long as
    /// the watch goes on to deliver it (see [`AWAITED_FOR`]).
    delivered_before: VecDeque<u64>,
    /// Whether the watch delivered `last`.
    delivered: bool,
    /// The version the watch delivered last.
    seen: Option<u64>,
    /// When the object went with one of these writes (its last finalizer removed): every
    /// version of it the cache still holds is stale, until the entry is forgotten.
    gone: Option<Instant>,
}

/// How many older versions of an object are remembered.
const REMEMBERED: usize = 8;
/// How long an object is remembered after this process's last write of it (or after it went):
/// longer than any reconcile holds an object it took from the cache, and than any cache lags.
const KEPT_FOR: Duration = Duration::from_secs(300);
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
        let Some((uid, version)) = uid_and_version(meta) else {
            return;
        };
        let mut table = self.0.lock().expect("lock");
        table.sweep();
        let now = Instant::now();
        let gone =
            meta.deletion_timestamp.is_some() && meta.finalizers.as_ref().is_none_or(Vec::is_empty);
        let before = version_of(before.meta());
        let unchanged = before == Some(version);
        let Some(entry) = table.objects.get_mut(&uid) else {
            if unchanged && !gone {
                // The server changed nothing (and sends no event).
                return;
            }
            let mut entry = Versions::new(version, now);
            entry.push_older(before);
            entry.gone = gone.then_some(now);
            table.objects.insert(uid, entry);
            return;
        };
        if gone {
            entry.gone = Some(now);
            return;
        }
        if entry.last == version || unchanged {
            // The server changed nothing (and sends no event): what was delivered still is.
            return;
        }
        let previous = std::mem::replace(&mut entry.last, version);
        for older in [Some(previous), before] {
            entry.push_older(older);
        }
        entry.written_at = now;
        entry.delivered_before.clear();
        // A write the server made nothing of answers the version the watch may have brought.
        entry.delivered = entry.seen == Some(version);
    }

    /// Takes note of what a controller's watch delivered, after its cache stored it.
    pub fn watched<K: Resource>(&self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(object) => {
                let meta = object.meta();
                let Some((uid, version)) = uid_and_version(meta) else {
                    return;
                };
                let mut table = self.0.lock().expect("lock");
                let Some(entry) = table.objects.get_mut(&uid) else {
                    return;
                };
                entry.seen = Some(version);
                if entry.gone.is_some() || entry.delivered {
                    return;
                }
                if version == entry.last {
                    entry.delivered = true;
                } else if !entry.older.contains(&version)
                    && !entry.delivered_before.contains(&version)
                {
                    if entry.delivered_before.len() == REMEMBERED {
                        entry.delivered_before.pop_front();
                    }
                    entry.delivered_before.push_back(version);
                }
            }
            // Not forgotten yet: a reconcile may hold a version it took from the cache before
            // the deletion came, which must still read as stale.
            watcher::Event::Delete(object) => {
                if let Some(uid) = object.meta().uid.as_deref().map(uid_key)
                    && let Some(entry) = self.0.lock().expect("lock").objects.get_mut(&uid)
                {
                    entry.gone.get_or_insert_with(Instant::now);
                }
            }
            // A relist replaces the cache at its end; it places no version but the last write.
            watcher::Event::InitApply(object) => {
                let meta = object.meta();
                let Some((uid, version)) = uid_and_version(meta) else {
                    return;
                };
                if let Some(entry) = self.0.lock().expect("lock").objects.get_mut(&uid)
                    && entry.last == version
                {
                    entry.delivered = true;
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// Whether `object` is the version of this process's last write of it.
    pub fn is_last<K: Resource>(&self, object: &K) -> bool {
        self.version_is(object, |entry, version| entry.last == version)
    }

    /// Whether `object` is a version this process had before the watch delivered it: one of
    /// its own writes of it (the last or an earlier one), or a version it wrote over (a
    /// reconcile read it, then wrote). Delivered back, such a version tells the object's own
    /// controller nothing new: the reconcile that wrote chose what comes next. Another writer's
    /// version is one this process never had, and is not one of these.
    pub fn is_own<K: Resource>(&self, object: &K) -> bool {
        self.version_is(object, |entry, version| {
            entry.last == version || entry.older.contains(&version)
        })
    }

    /// Whether `object`'s version is what `test` says of an object this process wrote and that
    /// has not gone.
    fn version_is<K: Resource>(&self, object: &K, test: impl Fn(&Versions, u64) -> bool) -> bool {
        let Some((uid, version)) = uid_and_version(object.meta()) else {
            return false;
        };
        let table = self.0.lock().expect("lock");
        (table.objects.get(&uid)).is_some_and(|entry| entry.gone.is_none() && test(entry, version))
    }

    /// What is known of `object`'s version.
    pub fn freshness<K: Resource>(&self, object: &K) -> Freshness {
        let meta = object.meta();
        let Some((uid, version)) = uid_and_version(meta) else {
            return Freshness::Unknown;
        };
        match self.0.lock().expect("lock").objects.get(&uid) {
            None => Freshness::Current,
            Some(entry) if entry.gone.is_some() => Freshness::Stale,
            Some(entry) if entry.last == version => Freshness::Current,
            Some(entry) if entry.older.contains(&version) => Freshness::Stale,
            // Delivered before the last write: surely older once that came, and taken to be
            // while it is expected.
            Some(entry)
                if entry.delivered_before.contains(&version)
                    && (entry.delivered || entry.written_at.elapsed() < AWAITED_FOR) =>
            {
                Freshness::Stale
            }
            Some(entry) if entry.delivered => Freshness::Current,
            Some(_) => Freshness::Unknown,
        }
    }
}

impl Table {
    /// Forgets, at most every [`SWEEP_EVERY`], objects written or gone long ago.
    fn sweep(&mut self) {
        let now = Instant::now();
        if self
            .swept
            .is_some_and(|at| now.duration_since(at) < SWEEP_EVERY)
        {
            return;
        }
        self.swept = Some(now);
        self.objects
            .retain(|_, v| now.duration_since(v.gone.unwrap_or(v.written_at)) < KEPT_FOR);
    }
}

impl Versions {
    fn new(last: u64, now: Instant) -> Self {
        Self {
            last,
            written_at: now,
            older: VecDeque::new(),
            delivered_before: VecDeque::new(),
            delivered: false,
            seen: None,
            gone: None,
        }
    }

    fn push_older(&mut self, version: Option<u64>) {
        let Some(version) = version else { return };
        if version == self.last || self.older.contains(&version) {
            return;
        }
        if self.older.len() == REMEMBERED {
            self.older.pop_front();
        }
        self.older.push_back(version);
    }
}

/// An object's uid and version, which every object the API server serves has, as numbers: the
/// table keeps them for every object a controller wrote in the last minutes (thousands), and
/// only ever compares them for equality.
fn uid_and_version(meta: &ObjectMeta) -> Option<(u128, u64)> {
    Some((uid_key(meta.uid.as_deref()?), version_of(meta)?))
}

/// A uid as the number its UUID is (the API server's uids are UUIDs); any other string by a
/// 64-bit hash, which no UUID's number equals (a UUID's version bits are in its upper half).
/// Tables kept for every object key by it rather than by the string.
pub(crate) fn uid_key(uid: &str) -> u128 {
    uuid::Uuid::parse_str(uid).map_or_else(|_| u128::from(digest(uid)), |u| u.as_u128())
}

/// A `resourceVersion` as a number: the API server's are decimal integers; any other by a
/// 64-bit hash. `None` when the object has none.
fn version_of(meta: &ObjectMeta) -> Option<u64> {
    let version = meta.resource_version.as_deref().filter(|v| !v.is_empty())?;
    Some(version.parse().unwrap_or_else(|_| digest(version)))
}

fn digest(text: &str) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(text, &mut hasher);
    std::hash::Hasher::finish(&hasher)
}

/// How long an operation's start may stay unwritten: one that ends sooner costs no status
/// write of its start, only of its end.
pub const HOLD_START_FOR: Duration = Duration::from_secs(5);
/// How long a held status is worth taking back.
const HELD_FOR: Duration = Duration::from_secs(60);

/// Statuses computed but not written yet: the start of an operation the broker accepted, while
/// it is young ([`HOLD_START_FOR`]). Each is held with the version of the object it was computed
/// from, and the next reconcile takes it back. A process that dies loses them, and
/// nothing else: the recorded ids and `deprovisionStatus` are written before the broker is
/// called, and the broker answers the identical request made again with the same operation.
#[derive(Debug)]
pub struct Held<S>(Mutex<Holds<S>>);

/// The statuses held, by uid, and when those held too long were last dropped.
#[derive(Debug)]
struct Holds<S> {
    by_uid: HashMap<u128, Hold<S>>,
    swept: Instant,
}

#[derive(Debug)]
struct Hold<S> {
    version: u64,
    status: S,
    at: Instant,
}

/// A held status taken back.
#[derive(Debug, PartialEq)]
pub enum Taken<S> {
    /// The object is as it was: the status goes on from the held one.
    Unchanged(S),
    /// Someone changed the object (not its status) since: the held status is to be written now.
    Changed(S),
}

impl<S> Default for Held<S> {
    fn default() -> Self {
        Self(Mutex::new(Holds {
            by_uid: HashMap::new(),
            swept: Instant::now(),
        }))
    }
}

impl<S: Clone + PartialEq> Held<S> {
    /// Holds `status`, the start of an operation `elapsed` old, for `object`, unless the
    /// operation is no longer young ([`HOLD_START_FOR`]) or its start is already written
    /// (`written`): then it is for the caller to write, and this says false.
    pub fn hold_start<K: Resource>(
        &self,
        object: &K,
        written: bool,
        elapsed: Duration,
        status: &S,
    ) -> bool {
        if written || elapsed >= HOLD_START_FOR {
            return false;
        }
        self.hold(object, status.clone());
        true
    }

    /// Holds `status` for `object`.
    fn hold<K: Resource>(&self, object: &K, status: S) {
        let meta = object.meta();
        let Some((uid, version)) = uid_and_version(meta) else {
            return;
        };
        let mut held = self.0.lock().expect("lock");
        let now = Instant::now();
        // Those held too long (their object never reconciled again) go now and then, not at
        // every hold: thousands are held at once in a burst.
        if now.duration_since(held.swept) >= HELD_FOR / 2 {
            held.by_uid
                .retain(|_, h| now.duration_since(h.at) < HELD_FOR);
            held.swept = now;
        }
        held.by_uid.insert(
            uid,
            Hold {
                version,
                status,
                at: now,
            },
        );
    }

    /// Takes back what is held for `object` (nothing when it was held too long); `written`
    /// knows whether `object` is this process's own last write of it (made in the reconcile
    /// that held the status, e.g. the ids recorded before the broker call).
    pub fn take<K: Resource>(&self, object: &K, written: &Written) -> Option<Taken<S>> {
        let uid = uid_key(object.meta().uid.as_deref()?);
        let hold = self.0.lock().expect("lock").by_uid.remove(&uid)?;
        if hold.at.elapsed() >= HELD_FOR {
            return None;
        }
        Some(
            if version_of(object.meta()) == Some(hold.version) || written.is_last(object) {
                Taken::Unchanged(hold.status)
            } else {
                Taken::Changed(hold.status)
            },
        )
    }
}

/// How soon a reconcile that found its cached object stale runs again, if the watch has not
/// delivered the newer object by then.
pub const STALE_RETRY: Duration = Duration::from_secs(1);

/// Whether the API server holds another status for `object` than the cache it came from. A
/// reconcile can run on a cached object from before its own last status write (another watch
/// event woke it first); starting an operation from that view would send the broker a provision
/// or bind it already has, which brokers that are not idempotent answer with 409 Conflict. One
/// GET, made only before a broker call that starts an operation, and only when `written` says
/// this process wrote the object since the version in hand (or cannot tell).
pub async fn status_is_stale<K>(
    api: &kube::Api<K>,
    object: &K,
    written: &Written,
) -> Result<bool, kube::Error>
where
    K: Resource + Clone + Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    match written.freshness(object) {
        Freshness::Current => return Ok(false),
        Freshness::Stale => return Ok(true),
        Freshness::Unknown => {}
    }
    let name = object.meta().name.clone().unwrap_or_default();
    let Some(fresh) = api.get_opt(&name).await? else {
        return Ok(false);
    };
    let status = |o: &K| serde_json::to_value(o).ok().map(|v| v["status"].clone());
    Ok(status(&fresh) != status(object))
}

#[cfg(test)]
mod tests {
    use super::*;
    use brokkr_fake_kube::FakeCluster;
    use k8s_openapi::api::core::v1::ConfigMap;

    use crate::resources::{self, ServiceInstance};

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
    fn own_versions_are_the_writes_and_what_they_were_written_over_never_another_writers() {
        let written = Written::default();
        assert!(!written.is_own(&version("1", false)), "nothing written");
        written.record(&version("1", false), &version("3", false));
        written.record(&version("3", false), &version("4", false));
        for own in ["1", "3", "4"] {
            assert!(written.is_own(&version(own, false)), "version {own}");
        }
        assert!(written.is_last(&version("4", false)));
        assert!(!written.is_last(&version("3", false)));
        // Someone else's change, written between this process's reading and its write.
        assert!(!written.is_own(&version("2", false)));
        assert!(!written.is_own(&version("5", false)));
        // Once the object went with a write, no version of it is handed back as nothing new.
        written.record(&version("4", false), &version("6", true));
        assert!(!written.is_own(&version("4", false)));
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
    fn a_held_status_is_taken_back_once_and_written_first_if_someone_changed_the_object() {
        let held = Held::<String>::default();
        let written = Written::default();
        held.hold(&version("1", false), "started".into());
        assert_eq!(
            held.take(&version("1", false), &written),
            Some(Taken::Unchanged("started".into()))
        );
        assert_eq!(
            held.take(&version("1", false), &written),
            None,
            "taken once"
        );
        // Held over the version before this process's own write: that write is no change.
        held.hold(&version("1", false), "started".into());
        written.record(&version("1", false), &version("2", false));
        assert_eq!(
            held.take(&version("2", false), &written),
            Some(Taken::Unchanged("started".into()))
        );
        held.hold(&version("2", false), "started".into());
        assert_eq!(
            held.take(&version("3", false), &written),
            Some(Taken::Changed("started".into())),
            "someone else changed the object"
        );
    }

    #[test]
    fn a_write_the_server_made_nothing_of_records_nothing() {
        let written = Written::default();
        written.record(&version("4", false), &version("4", false));
        written.watched(&watcher::Event::Apply(version("5", false)));
        assert_eq!(written.freshness(&version("5", false)), Freshness::Current);
    }

    #[test]
    fn every_version_of_an_object_that_went_stays_stale_after_its_deletion_is_seen() {
        let written = Written::default();
        written.record(&version("1", false), &version("2", false));
        written.record(&version("2", false), &version("3", true));
        assert_eq!(written.freshness(&version("2", false)), Freshness::Stale);
        assert_eq!(written.freshness(&version("1", false)), Freshness::Stale);
        written.watched(&watcher::Event::Apply(version("3", true)));
        assert_eq!(written.freshness(&version("2", false)), Freshness::Stale);
        // A reconcile that took version 2 from the cache before the deletion came must not act
        // on it (a second deprovision).
        written.watched(&watcher::Event::Delete(version("3", true)));
        assert_eq!(written.freshness(&version("2", false)), Freshness::Stale);
    }

    #[tokio::test]
    async fn a_cached_object_from_before_a_status_write_is_stale() {
        let fake = FakeCluster::start().await;
        for crd in resources::crds() {
            fake.add_crd(&crd);
        }
        fake.create(json!({"apiVersion": "services.brokkr.dev/v1alpha1", "kind": "ServiceInstance",
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"clusterServiceClassExternalName": "c", "clusterServicePlanExternalName": "p"}}));
        let api = Api::<ServiceInstance>::namespaced(fake.client(), "default");
        let cached = api.get("db").await.unwrap();
        let record = Written::default();
        assert!(!status_is_stale(&api, &cached, &record).await.unwrap());

        let written = api
            .patch_status(
                "db",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"asyncOpInProgress": true}})),
            )
            .await
            .unwrap();
        // Written by someone else: the cached object looks current, and is read again only
        // when this process wrote since.
        assert!(!status_is_stale(&api, &cached, &record).await.unwrap());
        record.record(&cached, &written);
        assert!(status_is_stale(&api, &cached, &record).await.unwrap());
        assert!(!status_is_stale(&api, &written, &record).await.unwrap());
        let requests = fake.requests().len();
        assert!(!status_is_stale(&api, &written, &record).await.unwrap());
        assert_eq!(
            fake.requests().len(),
            requests,
            "no request for an object known current"
        );
    }
}
