//! What a broker or a tenant can make rotations cost, against the fake API server and a
//! scripted broker: a broker that always answers a `renew_before` in the past, with a grace
//! period of 0, gets one rotation per `--min-rotation-interval` (a Warning Event and the
//! `Rotating` condition say so), not one per reconcile; the end of time (`9999-12-31T23:59:59Z`)
//! is kept as a time, and a time that is not RFC 3339 is said in a condition; and another
//! tenant's instance is Ready within a second or two while 50 bindings of one namespace rotate
//! at once.

mod support;

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use support::{API, Broker, Cluster, Seen, condition};

/// Binds synchronously with the credentials `{type, password}` and `metadata`, and answers the
/// instance's requests.
fn broker_with(
    metadata: impl Fn() -> Value + Send + 'static,
) -> impl FnMut(&Seen) -> (StatusCode, Value) + Send {
    move |seen: &Seen| match seen.verb() {
        "BIND" => (
            StatusCode::CREATED,
            json!({"credentials": {"type": "postgresql", "password": "pw"},
                   "metadata": metadata()}),
        ),
        "PUT" => (StatusCode::CREATED, json!({})),
        "POLL" => (StatusCode::OK, json!({"state": "succeeded"})),
        _ => (StatusCode::OK, json!({})),
    }
}

fn binding(cluster: &Cluster, ns: &str, name: &str) -> Option<Value> {
    cluster.fake.get(API, "ServiceBinding", Some(ns), name)
}

fn create_binding(cluster: &Cluster, name: &str, spec: Value) {
    let mut object = json!({"apiVersion": API, "kind": "ServiceBinding",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"instanceRef": {"name": "db"}}});
    if let (Some(target), Value::Object(more)) = (object["spec"].as_object_mut(), spec) {
        target.extend(more);
    }
    cluster.fake.create(object);
}

async fn bound(cluster: &Cluster, name: &str) -> Value {
    cluster
        .eventually(&format!("{name} bound"), || {
            let b = binding(cluster, "default", name)?;
            (condition(&b, "Ready")?["status"] == "True").then_some(b)
        })
        .await
}

/// The cluster with `configure`d controllers and the Ready instance `default/db` of the
/// rotatable plan `small`.
async fn cluster(broker: &Broker, configure: fn(&mut brokkr_controller::Context)) -> Cluster {
    let cluster = Cluster::start_with(broker, configure).await;
    cluster.create_instance(
        "default",
        "db",
        json!({"clusterServicePlanExternalName": "small"}),
    );
    cluster.ready("default", "db").await;
    cluster
}

#[tokio::test]
async fn a_broker_that_always_asks_for_renewal_gets_one_rotation_per_floor() {
    // Every binding the broker makes is due for renewal a minute ago.
    let broker = Broker::start(broker_with(|| {
        let past = Timestamp::now() - SignedDuration::from_mins(1);
        json!({"renew_before": past.to_string()})
    }))
    .await;
    let cluster = cluster(&broker, |ctx| {
        ctx.min_rotation_interval = Duration::from_secs(3);
    })
    .await;
    create_binding(&cluster, "app", json!({"rotationGracePeriodSeconds": 0}));
    bound(&cluster, "app").await;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(8)).await;
    // Without the floor: hundreds. With it: the first rotation at once, then one every 3 s.
    let binds = broker.seen_verb("BIND").len();
    assert!(
        (2..=5).contains(&binds),
        "{binds} binds in {:?}",
        started.elapsed()
    );
    let events = cluster.events("app");
    let deferred: Vec<_> = events
        .iter()
        .filter(|(reason, _)| reason == "RotationDeferred")
        .collect();
    assert!(!deferred.is_empty(), "{events:?}");
    assert!(
        deferred[0].1.contains("--min-rotation-interval (3s)"),
        "{deferred:?}"
    );
    assert!(deferred.len() <= binds, "one Event per wait: {deferred:?}");
}

#[tokio::test]
async fn the_end_of_time_is_kept_and_a_time_that_is_not_one_is_said() {
    let broker = Broker::start(broker_with(
        || json!({"expires_at": "9999-12-31T23:59:59Z", "renew_before": "next tuesday"}),
    ))
    .await;
    let cluster = cluster(&broker, |_| {}).await;
    create_binding(&cluster, "app", json!({}));
    let bound = bound(&cluster, "app").await;
    let expires: Timestamp = bound["status"]["expiresAt"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        expires > "9999-12-30T00:00:00Z".parse().unwrap(),
        "{expires}"
    );
    // Rotated by the valid time alone (never, here), and the other one is said.
    let times = condition(&bound, "BrokerTimes").unwrap();
    assert_eq!(times["reason"], "UnparsableTime");
    assert!(
        times["message"].as_str().unwrap().contains("renew_before"),
        "{times}"
    );
    assert_eq!(broker.seen_verb("BIND").len(), 1);
}

#[tokio::test]
async fn another_tenant_is_served_while_fifty_bindings_of_one_namespace_rotate() {
    let broker = Broker::start(broker_with(|| json!({}))).await;
    let cluster = cluster(&broker, |_| {}).await;
    for i in 0..50 {
        create_binding(&cluster, &format!("app-{i}"), json!({}));
    }
    for i in 0..50 {
        bound(&cluster, &format!("app-{i}")).await;
    }
    cluster
        .fake
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-b"}}));
    for i in 0..50 {
        cluster.edit(
            API,
            "ServiceBinding",
            Some("default"),
            &format!("app-{i}"),
            |b| b["metadata"]["annotations"] = json!({"services.brokkr.dev/rotate": "now"}),
        );
    }
    let asked = Instant::now();
    cluster.create_instance(
        "team-b",
        "other",
        json!({"clusterServicePlanExternalName": "small"}),
    );
    cluster.ready("team-b", "other").await;
    let ready_after = asked.elapsed();
    let rotated = (0..50)
        .filter(|i| {
            binding(&cluster, "default", &format!("app-{i}")).is_some_and(|b| {
                b["status"]["successorBinding"].is_object()
                    || b["status"]["previousBinding"].is_object()
            })
        })
        .count();
    eprintln!(
        "another tenant's instance Ready {ready_after:?} after 50 rotations were asked for ({rotated} under way or done by then)"
    );
    assert!(ready_after < Duration::from_secs(3), "{ready_after:?}");
}
