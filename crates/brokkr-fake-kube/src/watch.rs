//! WATCH: a streamed response of JSON-lines `WatchEvent`s for the objects a request selects.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use serde_json::json;
use tokio::sync::broadcast::Receiver;
use tokio::time::Instant;

use crate::response::{shown, status};
use crate::select::Selection;
use crate::store::{Event, State};

/// How long a watch lasts when the request gives no `timeoutSeconds`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Starts a watch of `selection`: from `resource_version` on, or with every selected object as
/// `ADDED` when none (or `0`) is given, then each change as it happens, until `timeout`.
pub(crate) fn watch(
    state: &State,
    selection: Selection,
    resource_version: Option<&str>,
    timeout: Option<Duration>,
    metadata_only: bool,
) -> Response {
    let first: Vec<Bytes> = match resource_version.filter(|v| !v.is_empty() && *v != "0") {
        None => state
            .objects
            .iter()
            .filter(|(key, object)| selection.matches(key, object))
            .map(|(_, object)| line("ADDED", object, metadata_only))
            .collect(),
        Some(v) => {
            let Ok(since) = v.parse::<u64>() else {
                let message = format!("invalid resourceVersion {v:?}");
                return status(StatusCode::BAD_REQUEST, "BadRequest", message);
            };
            state
                .history
                .iter()
                .filter(|e| e.version > since && selection.matches(&e.key, &e.object))
                .map(|e| line(e.kind, &e.object, metadata_only))
                .collect()
        }
    };
    // Subscribed under the same lock as the history was read: no change is missed or repeated.
    let receiver = state.events.subscribe();
    let deadline = Instant::now() + timeout.unwrap_or(DEFAULT_TIMEOUT);
    let live = futures::stream::unfold(
        (receiver, selection),
        move |(mut receiver, selection)| async move {
            let event = next(&mut receiver, &selection, deadline).await?;
            let line = line(event.kind, &event.object, metadata_only);
            Some((line, (receiver, selection)))
        },
    );
    let body = futures::stream::iter(first)
        .chain(live)
        .map(Ok::<_, Infallible>);
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(body),
    )
        .into_response()
}

/// The next selected event; none once the watch times out, or when it fell too far behind
/// (the client watches again from the last resourceVersion it saw).
async fn next(
    receiver: &mut Receiver<Arc<Event>>,
    selection: &Selection,
    deadline: Instant,
) -> Option<Arc<Event>> {
    loop {
        let event = tokio::time::timeout_at(deadline, receiver.recv())
            .await
            .ok()?
            .ok()?;
        if selection.matches(&event.key, &event.object) {
            return Some(event);
        }
    }
}

fn line(kind: &str, object: &serde_json::Value, metadata_only: bool) -> Bytes {
    let object = shown(object, metadata_only);
    let mut text = json!({"type": kind, "object": object}).to_string();
    text.push('\n');
    Bytes::from(text)
}
