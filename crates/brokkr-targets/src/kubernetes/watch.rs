//! Waiting on the API server instead of asking it again: one watch of one object, from the
//! version just read or written, until it becomes ready or is gone, for a bounded time.
//!
//! A watch that cannot be opened (no `watch` permission, a server that refuses) or that breaks
//! ends the wait early: the caller answers `waiting` and the engine asks again later, so a
//! missing permission costs latency, never correctness.
//!
//! The target judges an object by its kind's readiness rule here, and watches one that is not
//! ready yet.

use std::fmt::Debug;
use std::time::Duration;

use futures::StreamExt as _;
use kube::api::{Api, DynamicObject, WatchEvent, WatchParams};
use kube::{Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use tracing::debug;

use super::cluster::{Kubernetes, Located};
use super::readiness;
use crate::target::{Readiness, TargetError};

/// How long a call waits before it answers when it cannot watch the object.
const WITHOUT_WATCH: Duration = Duration::from_secs(5);

/// What a watch saw of the object.
pub(super) enum Seen<K> {
    /// A version of the object that `wanted` accepted.
    Wanted(K),
    /// The object was deleted.
    Gone,
    /// Neither within the time allowed (or the watch could not be kept open).
    Nothing,
}

/// Watches `object` (from its resource version) for up to `limit` and returns the first
/// version `wanted` accepts, or its deletion. Each version seen is also given to `wanted`,
/// which may note what it still waits for.
pub(super) async fn watch_one<K>(
    api: &Api<K>,
    object: &K,
    limit: Duration,
    mut wanted: impl FnMut(&K) -> bool,
) -> Seen<K>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let name = object.name_any();
    let version = object.resource_version().unwrap_or_default();
    let params = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(limit.as_secs().max(1) as u32);
    let started = tokio::time::Instant::now();
    let events = match api.watch(&params, &version).await {
        Ok(events) => events,
        Err(e) => {
            debug!(error = %e, object = %name, "cannot watch; reading it again later");
            tokio::time::sleep(WITHOUT_WATCH.min(limit)).await;
            return Seen::Nothing;
        }
    };
    let mut events = std::pin::pin!(events);
    let deadline = started + limit;
    while let Ok(Some(event)) = tokio::time::timeout_at(deadline, events.next()).await {
        match event {
            Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) if o.name_any() == name => {
                if wanted(&o) {
                    return Seen::Wanted(o);
                }
            }
            Ok(WatchEvent::Deleted(o)) if o.name_any() == name => return Seen::Gone,
            Ok(WatchEvent::Error(_)) | Err(_) => break,
            Ok(_) => {}
        }
    }
    // A watch the server ended early is not a reason to ask again at once.
    tokio::time::sleep_until(started + limit.min(Duration::from_secs(1))).await;
    Seen::Nothing
}

/// Watches `object`, already being deleted, until it is gone, for up to `limit`; answers
/// whether it went.
pub(super) async fn await_gone<K>(api: &Api<K>, object: &K, limit: Duration) -> bool
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    matches!(watch_one(api, object, limit, |_| false).await, Seen::Gone)
}

impl Kubernetes {
    /// Whether `live` is ready by its kind's rule; one that is not is watched (see
    /// [`Self::await_change`]).
    pub(super) async fn judge(
        &self,
        at: &Located,
        kind: &str,
        live: &DynamicObject,
    ) -> Result<Readiness, TargetError> {
        let object = serde_json::to_value(live).unwrap_or_default();
        match readiness::builtin(kind, &object).map_err(|e| self.invalid(e))? {
            Readiness::Waiting(reason) => self.await_change(at, kind, live, reason).await,
            ready => Ok(ready),
        }
    }

    /// Watches `live` (one object, from the version just read) for up to `watch_for` and
    /// answers as soon as a change makes it ready; else what it still waits for.
    pub(super) async fn await_change(
        &self,
        at: &Located,
        kind: &str,
        live: &DynamicObject,
        mut waiting: String,
    ) -> Result<Readiness, TargetError> {
        let mut invalid = None;
        let seen = watch_one(&at.api, live, self.watch_for, |object| {
            let object = serde_json::to_value(object).unwrap_or_default();
            match readiness::builtin(kind, &object) {
                Ok(Readiness::Waiting(reason)) => {
                    waiting = reason;
                    false
                }
                Ok(Readiness::Ready) => true,
                Err(e) => {
                    invalid = Some(e);
                    true
                }
            }
        })
        .await;
        if let Some(e) = invalid {
            return Err(self.invalid(e));
        }
        Ok(match seen {
            Seen::Wanted(_) => Readiness::Ready,
            Seen::Gone => Readiness::Waiting(format!("{} was deleted", at.what)),
            Seen::Nothing => {
                let object = serde_json::to_value(live).unwrap_or_default();
                match self.pod_trouble(at, kind, &object).await {
                    Some(trouble) => Readiness::Waiting(format!("{waiting}: {trouble}")),
                    None => Readiness::Waiting(waiting),
                }
            }
        })
    }
}
