//! What the ServiceInstance and ServiceBinding controllers share as an OSB platform: which
//! failures call for orphan mitigation, how long to wait between polls, how waits and timeouts
//! are written, and publishing Kubernetes Events.

use std::fmt::Debug;
use std::time::Duration;

use brokkr_osb::client::Error as OsbError;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::context::Context;
use crate::status::Freshness;

/// The longest pause between polls.
const MAX_BACKOFF: Duration = Duration::from_secs(5 * 60);

/// Whether the broker may have created the instance or binding although the request failed
/// (OSB's "Orphan Mitigation"): the request timed out, the broker answered 5xx, or a 2xx other
/// than 200 whose body could not be read. A malformed 200 and any 4xx are failures without it.
pub fn may_have_created(e: &OsbError) -> bool {
    match e {
        OsbError::Transport { source, .. } => source.is_timeout(),
        OsbError::Broker(b) => b.status.is_server_error(),
        OsbError::InvalidResponse { status, .. } => status.is_success() && status.as_u16() != 200,
        _ => false,
    }
}

/// The pause before the next poll: as long as the operation has run so far, from 1 s to 5 min,
/// so that pauses double.
pub fn backoff(elapsed: Duration) -> Duration {
    elapsed.clamp(Duration::from_secs(1), MAX_BACKOFF)
}

/// How long ago `start` was; zero when it is unknown or in the future.
pub fn elapsed_since(start: Option<&Time>) -> Duration {
    let started = start.map_or_else(Timestamp::now, |t| t.0);
    Timestamp::now()
        .duration_since(started)
        .try_into()
        .unwrap_or_default()
}

/// A duration as people write it: `1h`, `90m`, `45s`.
pub fn humanize(d: Duration) -> String {
    match d.as_secs() {
        s if s > 0 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s > 0 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Publishes a Kubernetes Event about `object`. Events are best effort: a refusal (e.g. in a
/// namespace being deleted) is logged and otherwise ignored. `note` must never hold parameters
/// or credentials.
pub async fn event<K>(
    ctx: &Context,
    object: &K,
    type_: EventType,
    reason: &str,
    note: &str,
    action: &str,
) where
    K: Resource<DynamicType = ()> + Debug,
{
    if let Some(ns) = object.meta().namespace.as_deref()
        && ctx.caches.terminating(ns)
    {
        // Nothing new is written into a namespace being deleted (it would be refused).
        return;
    }
    let recorder = Recorder::new(
        ctx.client.clone(),
        Reporter {
            controller: "brokkr-controller".into(),
            instance: None,
        },
    );
    let published = recorder
        .publish(
            &Event {
                type_,
                reason: reason.into(),
                note: Some(note_of(note)),
                action: action.into(),
                secondary: None,
            },
            &object.object_ref(&()),
        )
        .await;
    if let Err(e) = published {
        tracing::debug!(object = ?object.meta().name, error = %e, "event not published");
    }
}

/// The most bytes of an Event's note: what `events.k8s.io/v1` accepts.
const MAX_NOTE: usize = 1024;

/// `text` cut to [`MAX_NOTE`] bytes on a character boundary, marked with `…` when cut.
pub(crate) fn note_of(text: &str) -> String {
    if text.len() <= MAX_NOTE {
        return text.to_owned();
    }
    let mut end = MAX_NOTE - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
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
    written: &crate::status::Written,
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
    use brokkr_osb::client::{BrokerError, StatusCode};
    use kube::Api;
    use kube::api::{Patch, PatchParams};
    use serde_json::json;

    use crate::resources::{self, ServiceInstance};

    fn broker(status: StatusCode) -> OsbError {
        OsbError::Broker(BrokerError {
            status,
            error: None,
            description: None,
            instance_usable: None,
            update_repeatable: None,
            retry_after: None,
        })
    }

    fn unreadable(status: StatusCode) -> OsbError {
        OsbError::InvalidResponse {
            status,
            message: "not an object".into(),
        }
    }

    #[test]
    fn orphan_mitigation_follows_5xx_and_unreadable_201_or_202_answers_only() {
        assert!(may_have_created(&broker(StatusCode::INTERNAL_SERVER_ERROR)));
        assert!(may_have_created(&broker(StatusCode::BAD_GATEWAY)));
        assert!(may_have_created(&unreadable(StatusCode::CREATED)));
        assert!(may_have_created(&unreadable(StatusCode::ACCEPTED)));
        // OSB: a malformed 200 is a failure without orphan mitigation, as is any 4xx.
        assert!(!may_have_created(&unreadable(StatusCode::OK)));
        assert!(!may_have_created(&broker(StatusCode::BAD_REQUEST)));
        assert!(!may_have_created(&broker(StatusCode::CONFLICT)));
        assert!(!may_have_created(&broker(StatusCode::REQUEST_TIMEOUT)));
        assert!(!may_have_created(&OsbError::Config("bad URL".into())));
    }

    #[test]
    fn polls_back_off_from_one_second_doubling_to_five_minutes() {
        assert_eq!(backoff(Duration::ZERO), Duration::from_secs(1));
        assert_eq!(backoff(Duration::from_secs(1)), Duration::from_secs(1));
        // Waiting as long as it has run doubles the time run: 1, 2, 4, 8 … seconds.
        assert_eq!(backoff(Duration::from_secs(4)), Duration::from_secs(4));
        assert_eq!(backoff(Duration::from_secs(3600)), Duration::from_secs(300));
    }

    #[test]
    fn a_note_fits_what_the_events_api_accepts() {
        assert_eq!(note_of("short"), "short");
        for long in ["x".repeat(5000), "€".repeat(1_000_000)] {
            let note = note_of(&long);
            assert!(
                note.len() <= MAX_NOTE && note.len() > MAX_NOTE - 4,
                "{}",
                note.len()
            );
            assert!(note.ends_with('…'));
        }
    }

    #[test]
    fn durations_read_as_written() {
        assert_eq!(humanize(Duration::from_secs(3600)), "1h");
        assert_eq!(humanize(Duration::from_secs(5400)), "90m");
        assert_eq!(humanize(Duration::from_secs(45)), "45s");
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
        let record = crate::status::Written::default();
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
