//! What the ServiceInstance and ServiceBinding controllers share as an OSB platform: which
//! failures call for orphan mitigation, how long to wait between polls, how waits and timeouts
//! are written, publishing Kubernetes Events, and the OSB `context` of calls about an instance.

use std::fmt::Debug;
use std::time::Duration;

use brokkr_osb::client::Error as OsbError;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Resource, ResourceExt as _};
use serde_json::{Map, Value};

use crate::context::Context;
use crate::resources::ServiceInstance;

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

/// The pause before the next poll of an operation that has run for `elapsed`: the broker's
/// `Retry-After`, but at least 1 s (a broker answering 0, again and again, would have the
/// controller poll it without pause); without one, as long as the operation has run so far,
/// from 1 s to 5 min, so that pauses double.
pub fn poll_pause(retry_after: Option<Duration>, elapsed: Duration) -> Duration {
    match retry_after {
        Some(asked) => asked.max(MIN_POLL_PAUSE),
        None => elapsed.clamp(MIN_POLL_PAUSE, MAX_BACKOFF),
    }
}

/// The shortest pause between two polls of one operation.
const MIN_POLL_PAUSE: Duration = Duration::from_secs(1);

/// How long ago `start` was; zero when it is unknown or in the future.
pub fn elapsed_since(start: Option<&Time>) -> Duration {
    let started = start.map_or_else(Timestamp::now, |t| t.0);
    Timestamp::now()
        .duration_since(started)
        .try_into()
        .unwrap_or_default()
}

/// Whether `object` is being deleted with its namespace: then nobody reads its status, and
/// only what its finalizer's work needs is written (an operation the broker still runs).
pub fn goes_with_namespace<K: Resource>(object: &K, ctx: &Context) -> bool {
    object.meta().deletion_timestamp.is_some()
        && object
            .meta()
            .namespace
            .as_deref()
            .is_some_and(|ns| ctx.caches.terminating(ns))
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

/// The OSB `context` of requests about `instance`: `{platform: kubernetes, namespace,
/// instance_name, clusterid}`.
pub fn osb_context(instance: &ServiceInstance, ctx: &Context) -> Map<String, Value> {
    let mut context = Map::new();
    context.insert("platform".into(), "kubernetes".into());
    context.insert(
        "namespace".into(),
        instance.namespace().unwrap_or_default().into(),
    );
    context.insert("instance_name".into(), instance.name_any().into());
    if let Some(id) = &ctx.cluster_id {
        context.insert("clusterid".into(), id.clone().into());
    }
    context
}

#[cfg(test)]
mod tests {
    use super::*;
    use brokkr_osb::client::{BrokerError, StatusCode};

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
        let backoff = |elapsed| poll_pause(None, elapsed);
        assert_eq!(backoff(Duration::ZERO), Duration::from_secs(1));
        assert_eq!(backoff(Duration::from_secs(1)), Duration::from_secs(1));
        // Waiting as long as it has run doubles the time run: 1, 2, 4, 8 … seconds.
        assert_eq!(backoff(Duration::from_secs(4)), Duration::from_secs(4));
        assert_eq!(backoff(Duration::from_secs(3600)), Duration::from_secs(300));
    }

    #[test]
    fn a_broker_may_slow_polls_down_but_not_make_them_faster_than_one_a_second() {
        let early = Duration::from_secs(2);
        assert_eq!(
            poll_pause(Some(Duration::from_secs(30)), early),
            Duration::from_secs(30)
        );
        assert_eq!(
            poll_pause(Some(Duration::from_secs(3600)), early),
            Duration::from_secs(3600)
        );
        assert_eq!(
            poll_pause(Some(Duration::ZERO), early),
            Duration::from_secs(1)
        );
        assert_eq!(
            poll_pause(Some(Duration::from_millis(10)), early),
            Duration::from_secs(1)
        );
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
}
