//! A namespace being deleted ends without an admin. Its instances and bindings are deprovisioned
//! and unbound through their brokers as usual, but a broker that never answers (a tenant may
//! point its own at a dead URL, and the RoleBinding that would let it annotate its objects goes
//! with the namespace) would keep the namespace Terminating for ever. So an instance or binding
//! still there [`Context::namespace_deletion_timeout`] after its namespace's deletion began is
//! released without its broker, as the `abandon` annotation would release it: the controller
//! logs what was left at the broker, counts it, and says it in an Event about the Namespace
//! (written in `default`, as Events about cluster-scoped objects are: the namespace itself
//! takes no new objects).

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;

use crate::Context;

/// The default of [`Context::namespace_deletion_timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// The reason of the Event, and of the log line.
pub const REASON: &str = "AbandonedWithNamespace";

/// Whether `namespace` has been being deleted for longer than the controller waits for brokers.
pub(crate) fn overdue(ctx: &Context, namespace: &str) -> bool {
    let Some(since) = ctx
        .caches
        .namespaces
        .get(&ObjectRef::new(namespace))
        .and_then(|ns| ns.metadata.deletion_timestamp.clone())
    else {
        return false;
    };
    let waited = Timestamp::now().duration_since(since.0);
    waited.as_secs() >= 0 && waited.unsigned_abs() >= ctx.namespace_deletion_timeout
}

/// Says that the `kind` `name` of `namespace` was released with its namespace, `left` saying
/// what the broker may keep: in the log, in the metric and in an Event about the Namespace.
pub(crate) async fn released(ctx: &Context, kind: &str, namespace: &str, name: &str, left: &str) {
    let note = format!(
        "{kind} {name} released {} after the namespace's deletion began, without its broker: {left}",
        humantime::format_duration(ctx.namespace_deletion_timeout)
    );
    tracing::warn!(namespace, kind, name, reason = REASON, "{note}");
    ctx.metrics.released_with_namespace(kind);
    let recorder = Recorder::new(
        ctx.client.clone(),
        Reporter {
            controller: "brokkr-controller".into(),
            instance: None,
        },
    );
    let regarding = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Namespace".into()),
        name: Some(namespace.to_owned()),
        ..ObjectReference::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: REASON.into(),
        note: Some(crate::platform::note_of(&note)),
        action: "Release".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &regarding).await {
        tracing::debug!(namespace, error = %e, "event not published");
    }
}
