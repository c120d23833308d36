//! What a broker's texts and values can make the controllers write, against the fake API server
//! and a scripted broker: a `last_operation` description of 1,000,000 characters is cut in the
//! conditions and Events of a ServiceInstance and a ServiceBinding; a 202 with an `operation`
//! and a `dashboard_url` of 500,000 characters each, or a 201 whose `dashboard_url` is not an
//! http(s) URL, is refused as an answer that is not valid OSB, and what the broker may have
//! made is unbound or deprovisioned (orphan mitigation); nothing of it reaches the status.

mod support;

use axum::http::StatusCode;
use serde_json::{Value, json};
use support::{API, Broker, Cluster, Seen, condition};

/// A ServiceBinding `name` in `default` of the instance `instance`.
fn create_binding(cluster: &Cluster, name: &str, instance: &str) {
    cluster
        .fake
        .create(json!({"apiVersion": API, "kind": "ServiceBinding",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"instanceRef": {"name": instance}}}));
}

/// Waits for the condition `type_` of an object of `kind` to have `reason`; returns the object.
async fn reason_of(cluster: &Cluster, kind: &str, name: &str, type_: &str, reason: &str) -> Value {
    cluster
        .eventually(&format!("{kind} {name}: {type_} {reason}"), || {
            let object = cluster.fake.get(API, kind, Some("default"), name)?;
            condition(&object, type_)
                .is_some_and(|c| c["reason"] == reason)
                .then_some(object)
        })
        .await
}

/// The object's status stays small and its Events' notes fit the Events API.
fn small(cluster: &Cluster, object: &Value) {
    let status = object["status"].to_string();
    assert!(
        status.len() < 16 << 10,
        "a status of {} bytes",
        status.len()
    );
    let name = object["metadata"]["name"].as_str().unwrap();
    for (reason, note) in cluster.events(name) {
        assert!(
            note.len() <= 1024,
            "{reason}: a note of {} bytes",
            note.len()
        );
    }
}

/// A condition's message: cut to the broker's text of 1,024 characters and a marker.
fn cut_message(object: &Value, type_: &str, starts: &str) -> String {
    let message = condition(object, type_).unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.starts_with(starts), "{message}");
    let text = message.trim_start_matches(starts);
    assert!(
        text.starts_with("xxx") && text.ends_with("x…"),
        "{}",
        &message[..100]
    );
    assert_eq!(text.chars().count(), 1025);
    message
}

#[tokio::test]
async fn a_million_character_description_is_cut_in_the_instance_and_binding_conditions() {
    let long = "x".repeat(1_000_000);
    let broker = Broker::start(move |seen: &Seen| match seen.verb() {
        "PUT" if seen.path.ends_with("/failing") => {
            (StatusCode::ACCEPTED, json!({"operation": "op"}))
        }
        "PUT" => (StatusCode::CREATED, json!({})),
        "POLL" => (
            StatusCode::OK,
            json!({"state": "failed", "description": long}),
        ),
        "BIND" => (StatusCode::ACCEPTED, json!({"operation": "bind-op"})),
        "BINDING_POLL" => (
            StatusCode::OK,
            json!({"state": "failed", "description": long}),
        ),
        _ => (StatusCode::OK, json!({})),
    })
    .await;
    let cluster = Cluster::start(&broker).await;

    // The provision fails with the description, its orphan is mitigated, and it stays failed.
    cluster.create_instance("default", "failing", json!({}));
    let instance = reason_of(
        &cluster,
        "ServiceInstance",
        "failing",
        "Ready",
        "OrphanMitigationSuccessful",
    )
    .await;
    cut_message(&instance, "Failed", "Provision failed: ");
    small(&cluster, &instance);
    let events = cluster.events("failing");
    // The broker said it failed: nothing ambiguous about it.
    assert!(
        events.iter().any(
            |(reason, note)| reason == "StartingInstanceOrphanMitigation"
                && note.starts_with("The provision failed (Provision failed: ")
                && note.ends_with('…')
        ),
        "{:?}",
        events
    );

    // The bind fails with it.
    cluster.create_instance("default", "db", json!({}));
    cluster.ready("default", "db").await;
    create_binding(&cluster, "creds", "db");
    let binding = reason_of(
        &cluster,
        "ServiceBinding",
        "creds",
        "Failed",
        "BindCallFailed",
    )
    .await;
    cut_message(&binding, "Ready", "Bind failed: ");
    small(&cluster, &binding);
}

#[tokio::test]
async fn an_operation_or_dashboard_url_too_long_is_refused_and_the_orphan_mitigated() {
    let broker = Broker::start(move |seen: &Seen| match seen.verb() {
        "PUT" if seen.path.ends_with("/huge") => (
            StatusCode::ACCEPTED,
            json!({"operation": "o".repeat(500_000),
                   "dashboard_url": format!("https://dash.example.com/{}", "d".repeat(500_000))}),
        ),
        "PUT" if seen.path.ends_with("/script") => (
            StatusCode::CREATED,
            json!({"dashboard_url": "javascript:alert(document.cookie)"}),
        ),
        "PUT" => (StatusCode::CREATED, json!({})),
        "BIND" => (
            StatusCode::ACCEPTED,
            json!({"operation": "b".repeat(500_000)}),
        ),
        _ => (StatusCode::OK, json!({})),
    })
    .await;
    let cluster = Cluster::start(&broker).await;

    for (name, wrong) in [
        ("huge", "the operation is 500000 bytes long"),
        (
            "script",
            "the dashboard_url is not an absolute http or https URL",
        ),
    ] {
        cluster.create_instance("default", name, json!({}));
        let instance = reason_of(
            &cluster,
            "ServiceInstance",
            name,
            "Ready",
            "OrphanMitigationSuccessful",
        )
        .await;
        let path = format!("/v2/service_instances/{name}");
        let deprovisions = broker
            .seen_verb("DELETE")
            .into_iter()
            .filter(|s| s.path == path)
            .count();
        assert!(deprovisions >= 1, "{name}: the orphan deprovisioned");
        assert!(
            broker.seen_verb("POLL").is_empty(),
            "an operation refused is never polled"
        );
        let status = &instance["status"];
        assert!(status.get("dashboardURL").is_none(), "{name}");
        assert!(status.get("lastOperation").is_none(), "{name}");
        small(&cluster, &instance);
        let said = cluster.events(name).into_iter().any(|(reason, note)| {
            reason == "StartingInstanceOrphanMitigation"
                && note.contains("not a valid OSB response")
                && note.contains(wrong)
        });
        assert!(said, "{name}: {:?}", cluster.events(name));
    }

    cluster.create_instance("default", "db", json!({}));
    cluster.ready("default", "db").await;
    create_binding(&cluster, "creds", "db");
    let binding = reason_of(
        &cluster,
        "ServiceBinding",
        "creds",
        "Ready",
        "OrphanMitigationSuccessful",
    )
    .await;
    assert!(!broker.seen_verb("UNBIND").is_empty(), "the orphan unbound");
    assert!(broker.seen_verb("BINDING_POLL").is_empty());
    assert!(binding["status"].get("lastOperation").is_none());
    small(&cluster, &binding);
}
