//! ServiceBinding rotation against the fake API server and a scripted broker: the rotate
//! annotation and the broker's `renew_before` bind a successor with `predecessor_binding_id`
//! into a new immutable Secret, `status.binding` moves to it, and the predecessor is unbound
//! only after the grace period; an interrupted rotation finishes with the successor it
//! recorded; deleting mid-rotation unbinds every binding; a plan that is not rotatable is
//! never rotated.

mod support;

use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use brokkr_controller::resources::ServiceBinding;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::DeleteParams;
use serde_json::{Value, json};
use support::{API, Broker, Cluster, Seen, condition};

/// The binding id of a request on a binding.
fn binding_of(seen: &Seen) -> String {
    let mut parts = seen
        .path
        .split('/')
        .skip_while(|p| *p != "service_bindings");
    parts.nth(1).unwrap_or_default().to_owned()
}

/// The password in every binding's credentials.
const PASSWORD: &str = "pw-7c1e93";

/// Credentials that name the binding they are of.
fn credentials(seen: &Seen) -> Value {
    json!({"type": "postgresql", "username": format!("u-{}", binding_of(seen)), "password": PASSWORD})
}

/// Binds synchronously with `metadata`, unbinds, and answers the instance's requests.
fn broker_with(
    metadata: impl Fn(&Seen) -> Option<Value> + Send + 'static,
) -> impl FnMut(&Seen) -> (StatusCode, Value) + Send {
    move |seen: &Seen| match seen.verb() {
        "BIND" => {
            let mut body = json!({"credentials": credentials(seen)});
            if let Some(m) = metadata(seen) {
                body["metadata"] = m;
            }
            (StatusCode::CREATED, body)
        }
        "PUT" => (StatusCode::CREATED, json!({})),
        "POLL" => (StatusCode::OK, json!({"state": "succeeded"})),
        _ => (StatusCode::OK, json!({})),
    }
}

fn binding(cluster: &Cluster, name: &str) -> Option<Value> {
    cluster
        .fake
        .get(API, "ServiceBinding", Some("default"), name)
}

fn secret(cluster: &Cluster, name: &str) -> Option<Value> {
    cluster.fake.get("v1", "Secret", Some("default"), name)
}

/// The Secret entry `key`, decoded.
fn entry(secret: &Value, key: &str) -> String {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(secret["data"][key].as_str().unwrap_or_default())
        .unwrap();
    String::from_utf8(bytes).unwrap()
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
            let b = binding(cluster, name)?;
            (condition(&b, "Ready")?["status"] == "True").then_some(b)
        })
        .await
}

fn annotate(cluster: &Cluster, name: &str, value: &str) {
    cluster.edit(API, "ServiceBinding", Some("default"), name, |b| {
        b["metadata"]["annotations"] = json!({"services.brokkr.dev/rotate": value});
    });
}

async fn delete_binding(cluster: &Cluster, name: &str) {
    Api::<ServiceBinding>::namespaced(cluster.fake.client(), "default")
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

async fn cluster_with(broker: &Broker, plan: &str) -> Cluster {
    let cluster = Cluster::start(broker).await;
    cluster.create_instance(
        "default",
        "db",
        json!({"clusterServicePlanExternalName": plan}),
    );
    cluster.ready("default", "db").await;
    cluster
}

#[tokio::test]
async fn the_annotation_rotates_into_a_new_secret_and_the_predecessor_goes_after_its_grace_period()
{
    let broker = Broker::start(broker_with(|_| None)).await;
    let cluster = cluster_with(&broker, "small").await;
    create_binding(
        &cluster,
        "app",
        json!({"rotationGracePeriodSeconds": 3, "parameters": {"access": "read-only"}}),
    );
    let first = bound(&cluster, "app").await;
    let first_id = first["status"]["externalID"].as_str().unwrap().to_owned();
    assert_eq!(first["status"]["binding"]["name"], "app");
    assert_eq!(first["status"]["currentBinding"]["externalID"], first_id);
    assert_eq!(first["status"]["currentBinding"]["secretName"], "app");
    assert!(
        first["status"].get("nextRotationTime").is_none(),
        "no expiry, no schedule"
    );

    annotate(&cluster, "app", "2026-11-27T10:00:00Z");
    let rotated = cluster
        .eventually("status.binding moved", || {
            let b = binding(&cluster, "app")?;
            (b["status"]["binding"]["name"] != "app").then_some(b)
        })
        .await;
    let status = &rotated["status"];
    let new_id = status["currentBinding"]["externalID"]
        .as_str()
        .unwrap()
        .to_owned();
    let new_secret = status["binding"]["name"].as_str().unwrap().to_owned();
    assert_ne!(new_id, first_id);
    assert!(new_secret.starts_with("app-"), "{new_secret}");
    assert_eq!(status["currentBinding"]["secretName"], new_secret);
    assert_eq!(status["previousBinding"]["externalID"], first_id);
    assert_eq!(status["previousBinding"]["secretName"], "app");
    assert!(status["lastRotationTime"].is_string());
    assert_eq!(
        status["externalID"], first_id,
        "the first id stays on record"
    );

    let binds = broker.seen_verb("BIND");
    assert_eq!(binds.len(), 2);
    assert_eq!(binding_of(&binds[1]), new_id);
    assert_eq!(binds[1].body["predecessor_binding_id"], first_id);
    assert_eq!(binds[1].body["parameters"], json!({"access": "read-only"}));

    // Both Secrets exist during the grace period: the new one immutable, with the new
    // credentials; the old one still has the old.
    let fresh = secret(&cluster, &new_secret).expect("the new Secret");
    assert_eq!(fresh["immutable"], true);
    assert_eq!(fresh["type"], "servicebinding.io/postgresql");
    assert_eq!(entry(&fresh, "username"), format!("u-{new_id}"));
    assert_eq!(entry(&fresh, "provider"), "brokkr");
    let old = secret(&cluster, "app").expect("the old Secret during the grace period");
    assert_eq!(entry(&old, "username"), format!("u-{first_id}"));
    assert!(
        broker.seen_verb("UNBIND").is_empty(),
        "not before the grace period"
    );

    let done = cluster
        .eventually("the predecessor unbound", || {
            let b = binding(&cluster, "app")?;
            b["status"].get("previousBinding").is_none().then_some(b)
        })
        .await;
    let unbinds = broker.seen_verb("UNBIND");
    assert_eq!(unbinds.len(), 1);
    assert_eq!(binding_of(&unbinds[0]), first_id);
    assert!(
        secret(&cluster, "app").is_none(),
        "the old Secret is deleted"
    );
    assert!(secret(&cluster, &new_secret).is_some());
    let rotating = condition(&done, "Rotating").unwrap();
    assert_eq!(rotating["status"], "False");
    assert_eq!(rotating["reason"], "Rotated");
    // Each step's Event follows its status write.
    cluster
        .eventually("the rotation's Events", || {
            let reasons: Vec<String> = cluster.events("app").into_iter().map(|e| e.0).collect();
            ["RotationStarted", "Rotated", "PredecessorUnbound"]
                .iter()
                .all(|reason| reasons.iter().any(|r| r == reason))
                .then_some(())
        })
        .await;
    for (_, note) in cluster.events("app") {
        assert!(!note.contains(PASSWORD), "no credentials in events: {note}");
    }

    // The same annotation value again asks for nothing.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(broker.seen_verb("BIND").len(), 2);

    delete_binding(&cluster, "app").await;
    cluster
        .eventually("the binding gone", || {
            binding(&cluster, "app").is_none().then_some(())
        })
        .await;
    let unbinds = broker.seen_verb("UNBIND");
    assert_eq!(unbinds.len(), 2);
    assert_eq!(binding_of(&unbinds[1]), new_id);
    assert!(secret(&cluster, &new_secret).is_none());
}

#[tokio::test]
async fn a_binding_rotates_by_itself_when_the_broker_says_to_renew() {
    // Only the first binding is due soon; its successor lives for a day.
    let broker = Broker::start(broker_with(|seen| {
        let now = Timestamp::now();
        let renew = if seen.body.get("predecessor_binding_id").is_some() {
            now + SignedDuration::from_hours(20)
        } else {
            now + SignedDuration::from_secs(2)
        };
        Some(
            json!({"expires_at": (now + SignedDuration::from_hours(24)).to_string(),
            "renew_before": renew.to_string()}),
        )
    }))
    .await;
    let cluster = cluster_with(&broker, "small").await;
    create_binding(&cluster, "app", json!({"rotationGracePeriodSeconds": 1}));
    let first = bound(&cluster, "app").await;
    let first_id = first["status"]["externalID"].as_str().unwrap().to_owned();
    let next: Timestamp = first["status"]["nextRotationTime"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        next <= Timestamp::now() + SignedDuration::from_secs(3),
        "{next}"
    );
    assert!(first["status"]["expiresAt"].is_string());

    let rotated = cluster
        .eventually("rotated and the predecessor unbound", || {
            let b = binding(&cluster, "app")?;
            (b["status"]["currentBinding"]["externalID"] != first_id.as_str()
                && b["status"].get("previousBinding").is_none())
            .then_some(b)
        })
        .await;
    let binds = broker.seen_verb("BIND");
    assert_eq!(binds.len(), 2, "one rotation");
    assert_eq!(binds[1].body["predecessor_binding_id"], first_id);
    let next: Timestamp = rotated["status"]["nextRotationTime"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        next > Timestamp::now() + SignedDuration::from_hours(19),
        "the successor's renewal: {next}"
    );
    let unbinds = broker.seen_verb("UNBIND");
    assert_eq!(unbinds.len(), 1);
    assert_eq!(binding_of(&unbinds[0]), first_id);
}

#[tokio::test]
async fn a_plan_that_is_not_rotatable_is_never_rotated() {
    let broker = Broker::start(broker_with(|_| None)).await;
    let cluster = cluster_with(&broker, "large").await;
    create_binding(&cluster, "app", json!({}));
    bound(&cluster, "app").await;
    annotate(&cluster, "app", "now");
    let refused = cluster
        .eventually("the refusal", || {
            let b = binding(&cluster, "app")?;
            condition(&b, "Rotating").filter(|c| c["reason"] == "PlanNotRotatable")
        })
        .await;
    assert_eq!(refused["status"], "False");
    assert!(
        refused["message"].as_str().unwrap().contains("large"),
        "{refused}"
    );
    let b = binding(&cluster, "app").unwrap();
    assert_eq!(
        condition(&b, "Ready").unwrap()["status"],
        "True",
        "the credentials still work"
    );
    assert_eq!(broker.seen_verb("BIND").len(), 1);
    assert!(broker.seen_verb("UNBIND").is_empty());
}

/// The successor's bind is accepted (202) and polled until `finished` says it succeeded.
fn asynchronous_successor(
    finished: Arc<Mutex<bool>>,
) -> impl FnMut(&Seen) -> (StatusCode, Value) + Send {
    move |seen: &Seen| match seen.verb() {
        "BIND" if seen.body.get("predecessor_binding_id").is_some() => {
            (StatusCode::ACCEPTED, json!({"operation": "bind-op"}))
        }
        "BINDING_POLL" => {
            let state = if *finished.lock().unwrap() {
                "succeeded"
            } else {
                "in progress"
            };
            (StatusCode::OK, json!({"state": state}))
        }
        "FETCH_BINDING" => (StatusCode::OK, json!({"credentials": credentials(seen)})),
        "BIND" => (
            StatusCode::CREATED,
            json!({"credentials": credentials(seen)}),
        ),
        "PUT" => (StatusCode::CREATED, json!({})),
        "POLL" => (StatusCode::OK, json!({"state": "succeeded"})),
        _ => (StatusCode::OK, json!({})),
    }
}

#[tokio::test]
async fn a_rotation_interrupted_by_a_restart_finishes_with_the_successor_it_recorded() {
    let finished = Arc::new(Mutex::new(false));
    let broker = Broker::start(asynchronous_successor(finished.clone())).await;
    let mut cluster = cluster_with(&broker, "small").await;
    create_binding(&cluster, "app", json!({"rotationGracePeriodSeconds": 1}));
    let first = bound(&cluster, "app").await;
    let first_id = first["status"]["externalID"].as_str().unwrap().to_owned();
    annotate(&cluster, "app", "1");
    let successor = cluster
        .eventually("the successor's bind in progress", || {
            let b = binding(&cluster, "app")?;
            let s = b["status"].get("successorBinding")?;
            (s["currentOperation"] == "Bind").then(|| s.clone())
        })
        .await;
    let successor_id = successor["externalID"].as_str().unwrap().to_owned();

    cluster.restart_controllers().await;
    *finished.lock().unwrap() = true;
    let done = cluster
        .eventually("rotated and the predecessor unbound", || {
            let b = binding(&cluster, "app")?;
            (b["status"]["currentBinding"]["externalID"] == successor_id.as_str()
                && b["status"].get("previousBinding").is_none())
            .then_some(b)
        })
        .await;
    assert_eq!(done["status"]["currentBinding"]["externalID"], successor_id);
    assert_eq!(done["status"]["binding"]["name"], successor["secretName"]);
    let binds = broker.seen_verb("BIND");
    assert_eq!(binds.len(), 2, "the successor is bound once: {binds:?}");
    let polled: Vec<String> = broker
        .seen_verb("BINDING_POLL")
        .iter()
        .map(binding_of)
        .collect();
    assert!(polled.iter().all(|id| *id == successor_id), "{polled:?}");
    let unbinds: Vec<String> = broker.seen_verb("UNBIND").iter().map(binding_of).collect();
    assert_eq!(unbinds, [first_id]);
}

#[tokio::test]
async fn deleting_a_binding_mid_rotation_unbinds_both() {
    let broker = Broker::start(asynchronous_successor(Arc::new(Mutex::new(false)))).await;
    let cluster = cluster_with(&broker, "small").await;
    create_binding(&cluster, "app", json!({}));
    let first = bound(&cluster, "app").await;
    let first_id = first["status"]["externalID"].as_str().unwrap().to_owned();
    annotate(&cluster, "app", "1");
    let successor = cluster
        .eventually("the successor's bind in progress", || {
            let b = binding(&cluster, "app")?;
            let s = b["status"].get("successorBinding")?;
            (s["currentOperation"] == "Bind")
                .then(|| s["externalID"].as_str().map(str::to_owned))?
        })
        .await;
    delete_binding(&cluster, "app").await;
    cluster
        .eventually("the binding gone", || {
            binding(&cluster, "app").is_none().then_some(())
        })
        .await;
    let mut unbinds: Vec<String> = broker.seen_verb("UNBIND").iter().map(binding_of).collect();
    unbinds.sort();
    let mut both = vec![first_id, successor];
    both.sort();
    assert_eq!(unbinds, both);
    assert!(secret(&cluster, "app").is_none());
}

#[tokio::test]
async fn a_refused_successor_leaves_the_credentials_as_they_are() {
    let broker = Broker::start(|seen: &Seen| match seen.verb() {
        "BIND" if seen.body.get("predecessor_binding_id").is_some() => (
            StatusCode::BAD_REQUEST,
            json!({"description": "the predecessor is being unbound"}),
        ),
        "BIND" => (
            StatusCode::CREATED,
            json!({"credentials": credentials(seen)}),
        ),
        "UNBIND" => (StatusCode::GONE, json!({})),
        "PUT" => (StatusCode::CREATED, json!({})),
        "POLL" => (StatusCode::OK, json!({"state": "succeeded"})),
        _ => (StatusCode::OK, json!({})),
    })
    .await;
    let cluster = cluster_with(&broker, "small").await;
    create_binding(&cluster, "app", json!({}));
    let first = bound(&cluster, "app").await;
    let first_id = first["status"]["externalID"].as_str().unwrap().to_owned();
    annotate(&cluster, "app", "1");
    let failed = cluster
        .eventually("the rotation failed and cleaned up", || {
            let b = binding(&cluster, "app")?;
            let c = condition(&b, "Rotating")?;
            (c["reason"] == "RotationFailed" && b["status"].get("previousBinding").is_none())
                .then_some((b, c))
        })
        .await;
    let (b, c) = failed;
    assert_eq!(c["status"], "False");
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("the predecessor is being unbound"),
        "{c}"
    );
    assert_eq!(b["status"]["binding"]["name"], "app");
    assert_eq!(b["status"]["currentBinding"]["externalID"], first_id);
    assert_eq!(condition(&b, "Ready").unwrap()["status"], "True");
    assert!(secret(&cluster, "app").is_some());
    // The successor, which the broker may have, is unbound; the current binding is not.
    let successor = binding_of(&broker.seen_verb("BIND")[1]);
    let unbinds: Vec<String> = broker.seen_verb("UNBIND").iter().map(binding_of).collect();
    assert_eq!(unbinds, [successor]);
    // Asked once, tried once.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(broker.seen_verb("BIND").len(), 2);
    let reasons: Vec<String> = cluster.events("app").into_iter().map(|e| e.0).collect();
    assert!(reasons.iter().any(|r| r == "RotationFailed"), "{reasons:?}");
}
