//! A namespace being deleted ends without an admin. Its instances and bindings are deprovisioned
//! and unbound through their brokers as usual, but a broker that never answers (a tenant may
//! point its own at a dead URL, and the RoleBinding that would let it annotate its objects goes
//! with the namespace) would keep the namespace Terminating for ever. So an instance or binding
//! still there [`Context::namespace_deletion_timeout`] after its namespace's deletion began is
//! released without its broker, as the `abandon` annotation would release it: the controller
//! logs what was left at the broker, counts it, and says it in an Event about the Namespace,
//! written in `kube-system`: the namespace itself takes no new objects, and `kube-system` is
//! where the API server accepts an `events.k8s.io` Event about a cluster-scoped object.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::reflector::ObjectRef;

use crate::context::Context;

/// The reason of the Event, and of the log line.
pub const REASON: &str = "AbandonedWithNamespace";
/// Where the Event about a released namespace is written.
pub const EVENTS_NAMESPACE: &str = "kube-system";
/// The Event's reporting controller.
const REPORTER: &str = "brokkr-controller";

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
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{namespace}-released-")),
            namespace: Some(EVENTS_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(Timestamp::now())),
        type_: Some("Warning".into()),
        reason: Some(REASON.into()),
        action: Some("Release".into()),
        note: Some(crate::platform::note_of(&note)),
        reporting_controller: Some(REPORTER.into()),
        reporting_instance: Some(REPORTER.into()),
        regarding: Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Namespace".into()),
            name: Some(namespace.to_owned()),
            ..ObjectReference::default()
        }),
        ..Event::default()
    };
    let events: Api<Event> = Api::namespaced(ctx.client.clone(), EVENTS_NAMESPACE);
    if let Err(e) = events.create(&PostParams::default(), &event).await {
        tracing::warn!(namespace, error = %e, "the Event about the namespace was not published");
    }
}
