//! ServiceInstance parameters and updates against the fake API server and a scripted broker:
//! what an update sends (plan only when it changed, parameters only when their checksum did,
//! `previous_values`), a `parametersFrom` Secret whose change updates the instance, Secrets that
//! are missing (waited for) or give a key twice (refused), and Secret values never written to
//! status or Events.

mod support;

use axum::http::StatusCode;
use base64::Engine as _;
use serde_json::{Value, json};
use support::{API, Broker, Cluster, condition, synchronous};

fn secret(name: &str, key: &str, value: &str) -> Value {
    let data = base64::engine::general_purpose::STANDARD.encode(value);
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "default"}, "data": {key: data}})
}

#[tokio::test]
async fn an_update_sends_the_plan_only_when_it_changed_and_parameters_only_when_they_did() {
    // The second update is asynchronous: accepted, then polled to success.
    let mut patches = 0;
    let broker = Broker::start(move |seen| match seen.verb() {
        "PATCH" => {
            patches += 1;
            if patches == 2 {
                (StatusCode::ACCEPTED, json!({"operation": "update-2"}))
            } else {
                (StatusCode::OK, json!({}))
            }
        }
        _ => synchronous(seen),
    })
    .await;
    let cluster = Cluster::start(&broker).await;
    cluster.create_instance("default", "db", json!({"parameters": {"size": 1}}));
    cluster.ready("default", "db").await;
    assert!(
        broker.seen_verb("PATCH").is_empty(),
        "nothing to update yet"
    );

    // New parameters, same plan.
    cluster.edit(API, "ServiceInstance", Some("default"), "db", |o| {
        o["spec"]["parameters"] = json!({"size": 2});
    });
    let instance = cluster
        .ready_reason("default", "db", "InstanceUpdatedSuccessfully")
        .await;
    assert_eq!(instance["status"]["reconciledGeneration"], 2);
    let patches = broker.seen_verb("PATCH");
    assert_eq!(patches.len(), 1);
    let body = &patches[0].body;
    assert_eq!(patches[0].query, "accepts_incomplete=true");
    assert_eq!(body["service_id"], "svc");
    assert!(body.get("plan_id").is_none(), "plan unchanged: {body}");
    assert_eq!(body["parameters"], json!({"size": 2}));
    assert_eq!(
        body["previous_values"],
        json!({"plan_id": "plan-small", "service_id": "svc"})
    );
    assert_eq!(body["context"]["instance_name"], "db");

    // New plan, same parameters: accepted asynchronously and polled.
    cluster.edit(API, "ServiceInstance", Some("default"), "db", |o| {
        o["spec"]["clusterServicePlanExternalName"] = json!("large");
    });
    let instance = cluster
        .eventually("the plan change accepted", || {
            let i = cluster.instance("default", "db")?;
            (i["status"]["reconciledGeneration"] == 3).then_some(i)
        })
        .await;
    assert_eq!(
        condition(&instance, "Ready").unwrap()["reason"],
        "InstanceUpdatedSuccessfully"
    );
    let external = &instance["status"]["externalProperties"];
    assert_eq!(external["clusterServicePlanExternalID"], "plan-large");
    assert_eq!(external["parameters"], json!({"size": 2}));
    let patches = broker.seen_verb("PATCH");
    assert_eq!(patches.len(), 2);
    let body = &patches[1].body;
    assert_eq!(body["plan_id"], "plan-large");
    assert!(
        body.get("parameters").is_none(),
        "parameters unchanged: {body}"
    );
    assert_eq!(body["previous_values"]["plan_id"], "plan-small");
    let polls = broker.seen_verb("POLL");
    assert!(!polls.is_empty(), "the asynchronous update was polled");
    assert!(
        polls[0].query.contains("operation=update-2"),
        "{}",
        polls[0].query
    );
    assert!(
        polls[0].query.contains("plan_id=plan-large"),
        "{}",
        polls[0].query
    );
    // Successes the user asked for are said by the Ready condition, not by Events.
    let reasons: Vec<String> = cluster.events("db").into_iter().map(|e| e.0).collect();
    assert!(
        !reasons
            .iter()
            .any(|r| r == "ProvisionedSuccessfully" || r == "InstanceUpdatedSuccessfully"),
        "{reasons:?}"
    );
}

#[tokio::test]
async fn raising_update_requests_sends_an_update_with_nothing_changed() {
    let broker = Broker::start(synchronous).await;
    let cluster = Cluster::start(&broker).await;
    cluster.create_instance("default", "db", json!({"parameters": {"size": 1}}));
    cluster.ready("default", "db").await;
    cluster.edit(API, "ServiceInstance", Some("default"), "db", |o| {
        o["spec"]["updateRequests"] = json!(1);
    });
    let instance = cluster
        .ready_reason("default", "db", "InstanceUpdatedSuccessfully")
        .await;
    assert_eq!(instance["status"]["reconciledGeneration"], 2);
    let patches = broker.seen_verb("PATCH");
    assert_eq!(patches.len(), 1);
    let body = &patches[0].body;
    assert!(body.get("plan_id").is_none(), "{body}");
    assert!(body.get("parameters").is_none(), "{body}");
    assert_eq!(
        body["previous_values"],
        json!({"plan_id": "plan-small", "service_id": "svc"})
    );
}

#[tokio::test]
async fn a_refused_update_leaves_the_instance_usable_with_its_old_plan() {
    let broker = Broker::start(|seen| match seen.verb() {
        "PATCH" => (
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({"error": "PlanChangeNotSupported", "description": "no downgrades"}),
        ),
        _ => synchronous(seen),
    })
    .await;
    let cluster = Cluster::start(&broker).await;
    cluster.create_instance("default", "db", json!({}));
    cluster.ready("default", "db").await;
    cluster.edit(API, "ServiceInstance", Some("default"), "db", |o| {
        o["spec"]["clusterServicePlanExternalName"] = json!("large");
    });
    let instance = cluster
        .ready_reason("default", "db", "UpdateInstanceCallFailed")
        .await;
    assert!(condition(&instance, "Failed").is_none(), "{instance:#}");
    let message = condition(&instance, "Ready").unwrap()["message"].clone();
    assert!(
        message.as_str().unwrap().contains("no downgrades"),
        "{message}"
    );
    assert_eq!(instance["status"]["provisionStatus"], "Provisioned");
    assert_eq!(instance["status"]["reconciledGeneration"], 1);
    assert_eq!(
        instance["status"]["externalProperties"]["clusterServicePlanExternalID"],
        "plan-small"
    );
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(broker.seen_verb("PATCH").len(), 1, "not sent again");
}

#[tokio::test]
async fn a_changed_parameters_secret_updates_the_instance_and_its_values_stay_out_of_status() {
    let broker = Broker::start(synchronous).await;
    let cluster = Cluster::start(&broker).await;
    cluster
        .fake
        .create(secret("db-params", "p", r#"{"password": "hunter2"}"#));
    cluster.create_instance(
        "default",
        "db",
        json!({"parameters": {"size": 1},
               "parametersFrom": [{"secretKeyRef": {"name": "db-params", "key": "p"}}]}),
    );
    let instance = cluster.ready("default", "db").await;
    let puts = broker.seen_verb("PUT");
    assert_eq!(
        puts[0].body["parameters"],
        json!({"size": 1, "password": "hunter2"})
    );
    let external = instance["status"]["externalProperties"].clone();
    assert_eq!(
        external["parameters"],
        json!({"size": 1, "password": "<redacted>"})
    );
    let first_checksum = external["parameterChecksum"].clone();
    assert!(first_checksum.is_string());
    // Let the controller settle, so that only the Secret's watch can see the change.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert!(broker.seen_verb("PATCH").is_empty());

    cluster
        .fake
        .create(secret("db-params", "p", r#"{"password": "hunter3"}"#));
    let instance = cluster
        .eventually("the new Secret value sent", || {
            let i = cluster.instance("default", "db")?;
            (i["status"]["externalProperties"]["parameterChecksum"] != first_checksum
                && i["status"]["asyncOpInProgress"] == false)
                .then_some(i)
        })
        .await;
    let patches = broker.seen_verb("PATCH");
    assert_eq!(patches.len(), 1);
    assert_eq!(
        patches[0].body["parameters"],
        json!({"size": 1, "password": "hunter3"})
    );
    assert!(patches[0].body.get("plan_id").is_none());
    assert_eq!(
        instance["metadata"]["generation"], 1,
        "the spec never changed"
    );

    let everything = format!(
        "{:#} {:?}",
        cluster.instance("default", "db").unwrap(),
        cluster.events("db")
    );
    assert!(!everything.contains("hunter"), "{everything}");
}

#[tokio::test]
async fn a_missing_parameters_secret_is_waited_for() {
    let broker = Broker::start(synchronous).await;
    let cluster = Cluster::start(&broker).await;
    cluster.create_instance(
        "default",
        "db",
        json!({"parametersFrom": [{"secretKeyRef": {"name": "later", "key": "p"}}]}),
    );
    let instance = cluster
        .ready_reason("default", "db", "ErrorWithParameters")
        .await;
    assert!(
        condition(&instance, "Failed").is_none(),
        "it waits: {instance:#}"
    );
    let message = condition(&instance, "Ready").unwrap()["message"].clone();
    assert!(message.as_str().unwrap().contains("\"later\""), "{message}");
    assert!(broker.seen_verb("PUT").is_empty());

    cluster
        .fake
        .create(secret("later", "p", r#"{"tier": "gold"}"#));
    cluster.ready("default", "db").await;
    let puts = broker.seen_verb("PUT");
    assert_eq!(puts.len(), 1);
    assert_eq!(puts[0].body["parameters"], json!({"tier": "gold"}));
}

#[tokio::test]
async fn a_parameter_given_twice_is_refused_until_the_secret_changes() {
    let broker = Broker::start(synchronous).await;
    let cluster = Cluster::start(&broker).await;
    cluster
        .fake
        .create(secret("dup", "p", r#"{"password": "s3cret-value"}"#));
    cluster.create_instance(
        "default",
        "db",
        json!({"parameters": {"password": "plain"},
               "parametersFrom": [{"secretKeyRef": {"name": "dup", "key": "p"}}]}),
    );
    let instance = cluster
        .eventually("the instance failed", || {
            let i = cluster.instance("default", "db")?;
            condition(&i, "Failed").map(|_| i)
        })
        .await;
    let failed = condition(&instance, "Failed").unwrap();
    assert_eq!(failed["reason"], "ErrorWithParameters");
    assert!(
        failed["message"]
            .as_str()
            .unwrap()
            .contains("\"password\" is given twice"),
        "{failed}"
    );
    assert!(broker.seen_verb("PUT").is_empty());
    let everything = format!("{instance:#} {:?}", cluster.events("db"));
    assert!(!everything.contains("s3cret-value"), "{everything}");
    assert!(
        cluster
            .events("db")
            .iter()
            .any(|(reason, _)| reason == "ErrorWithParameters")
    );

    cluster
        .fake
        .create(secret("dup", "p", r#"{"user": "admin"}"#));
    let instance = cluster.ready("default", "db").await;
    assert!(condition(&instance, "Failed").is_none(), "{instance:#}");
    let puts = broker.seen_verb("PUT");
    assert_eq!(puts.len(), 1);
    assert_eq!(
        puts[0].body["parameters"],
        json!({"password": "plain", "user": "admin"})
    );
}

/// A spec change and a `parametersFrom` Secret's change that come while an operation runs are
/// sent once it ends: the reconciles they woke only polled it.
#[tokio::test]
async fn changes_made_while_an_operation_runs_are_sent_when_it_ends() {
    let busy = std::sync::Arc::new(std::sync::Mutex::new(true));
    let broker = support::asynchronous_broker(busy.clone()).await;
    let cluster = Cluster::start(&broker).await;
    cluster
        .fake
        .create(secret("db-params", "p", r#"{"password": "hunter2"}"#));
    cluster.create_instance(
        "default",
        "db",
        json!({"parametersFrom": [{"secretKeyRef": {"name": "db-params", "key": "p"}}]}),
    );
    cluster
        .eventually("the provision polled", || {
            (!broker.seen_verb("POLL").is_empty()).then_some(())
        })
        .await;
    let polled = broker.seen_verb("POLL").len();
    cluster.edit(API, "ServiceInstance", Some("default"), "db", |i| {
        i["spec"]["parameters"] = json!({"size": 2});
    });
    cluster
        .fake
        .create(secret("db-params", "p", r#"{"password": "hunter3"}"#));
    // The provision is polled again while it runs; then it ends.
    cluster
        .eventually("a poll after the changes", || {
            (broker.seen_verb("POLL").len() > polled).then_some(())
        })
        .await;
    *busy.lock().unwrap() = false;
    cluster
        .eventually("the changes sent in an update", || {
            let patch = broker.seen_verb("PATCH").pop()?;
            (patch.body["parameters"] == json!({"size": 2, "password": "hunter3"})).then_some(())
        })
        .await;
    let instance = cluster
        .eventually("the update's end", || {
            let i = cluster.instance("default", "db")?;
            (i["status"]["reconciledGeneration"] == 2 && i["status"]["asyncOpInProgress"] == false)
                .then_some(i)
        })
        .await;
    assert_eq!(
        condition(&instance, "Ready").unwrap()["status"],
        "True",
        "{instance:#}"
    );
}
