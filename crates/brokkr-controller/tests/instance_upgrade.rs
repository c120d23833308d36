//! Maintenance versions against the fake API server and a scripted broker: a provision sends
//! and records the plan's version; a newer version in the catalog shows as the
//! `UpgradeAvailable` condition; `spec.maintenance.version` upgrades (an update carrying
//! `maintenance_info` and nothing else); a refused upgrade leaves the instance at its version;
//! `autoUpgrade` upgrades by itself.

mod support;

use axum::http::StatusCode;
use serde_json::{Value, json};
use support::{API, Broker, Cluster, condition, synchronous};

/// Moves plan `small` to `version` in the broker's catalog and has the broker listed again.
async fn offer(cluster: &Cluster, broker: &Broker, version: &str, relist: i64) {
    broker.set_small_version(json!({"version": version, "description": "max_connections 30"}));
    cluster.edit(API, "ClusterServiceBroker", None, "db", |b| {
        b["spec"]["relistRequests"] = json!(relist);
    });
    cluster
        .eventually("the plan's new version listed", || {
            let plan = cluster
                .fake
                .get(API, "ClusterServicePlan", None, "plan-small")?;
            (plan["spec"]["maintenanceInfo"]["version"] == version).then_some(())
        })
        .await;
}

fn version(instance: &Value) -> &Value {
    &instance["status"]["externalProperties"]["maintenanceInfoVersion"]
}

#[tokio::test]
async fn a_requested_upgrade_sends_the_new_version_and_records_it() {
    let broker = Broker::start(synchronous).await;
    let cluster = Cluster::start(&broker).await;
    offer(&cluster, &broker, "1.0.0", 1).await;
    cluster.create_instance("default", "db", json!({"parameters": {"size": 1}}));
    let instance = cluster.ready("default", "db").await;
    let provisions = broker.seen_verb("PUT");
    assert_eq!(
        provisions[0].body["maintenance_info"],
        json!({"version": "1.0.0"})
    );
    assert_eq!(version(&instance), "1.0.0");
    assert!(condition(&instance, "UpgradeAvailable").is_none());

    // The plan moves on: the instance says so, and waits to be asked.
    offer(&cluster, &broker, "1.1.0", 2).await;
    let instance = cluster
        .eventually("UpgradeAvailable", || {
            let i = cluster.instance("default", "db")?;
            condition(&i, "UpgradeAvailable").map(|_| i)
        })
        .await;
    let said = condition(&instance, "UpgradeAvailable").unwrap();
    assert_eq!(said["status"], "True");
    let message = said["message"].as_str().unwrap();
    assert!(
        message.contains("offers version 1.1.0 (the instance runs 1.0.0): max_connections 30"),
        "{message}"
    );
    assert_eq!(instance["status"]["lastConditionState"], "Ready");
    assert!(broker.seen_verb("PATCH").is_empty(), "nobody asked");

    // Asked: an update with the new version and nothing else.
    cluster.edit(API, "ServiceInstance", Some("default"), "db", |o| {
        o["spec"]["maintenance"] = json!({"version": "1.1.0"});
    });
    let instance = cluster
        .eventually("the upgrade recorded", || {
            let i = cluster.instance("default", "db")?;
            (version(&i) == "1.1.0" && condition(&i, "UpgradeAvailable").is_none()).then_some(i)
        })
        .await;
    let patches = broker.seen_verb("PATCH");
    assert_eq!(patches.len(), 1);
    let body = &patches[0].body;
    assert_eq!(body["maintenance_info"], json!({"version": "1.1.0"}));
    assert!(body.get("plan_id").is_none(), "{body}");
    assert!(body.get("parameters").is_none(), "{body}");
    assert_eq!(
        condition(&instance, "Ready").unwrap()["reason"],
        "InstanceUpdatedSuccessfully"
    );
}

#[tokio::test]
async fn a_refused_upgrade_leaves_the_instance_usable_at_its_version() {
    let broker = Broker::start(|seen| match seen.verb() {
        "PATCH" => (
            StatusCode::BAD_REQUEST,
            json!({"error": "UpgradeRefused", "description": "not today"}),
        ),
        _ => synchronous(seen),
    })
    .await;
    let cluster = Cluster::start(&broker).await;
    offer(&cluster, &broker, "1.0.0", 1).await;
    cluster.create_instance("default", "db", json!({}));
    cluster.ready("default", "db").await;
    offer(&cluster, &broker, "1.1.0", 2).await;
    cluster.edit(API, "ServiceInstance", Some("default"), "db", |o| {
        o["spec"]["maintenance"] = json!({"version": "1.1.0"});
    });
    let instance = cluster
        .ready_reason("default", "db", "UpdateInstanceCallFailed")
        .await;
    assert_eq!(version(&instance), "1.0.0");
    assert!(condition(&instance, "Failed").is_none(), "still usable");
    assert_eq!(
        condition(&instance, "UpgradeAvailable").unwrap()["status"],
        "True"
    );
    // Not sent again until the spec changes.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(broker.seen_verb("PATCH").len(), 1);
}

#[tokio::test]
async fn auto_upgrade_follows_the_plan_by_itself() {
    let broker = Broker::start(synchronous).await;
    let cluster = Cluster::start(&broker).await;
    offer(&cluster, &broker, "1.0.0", 1).await;
    cluster.create_instance(
        "default",
        "db",
        json!({"maintenance": {"autoUpgrade": true}}),
    );
    cluster.ready("default", "db").await;
    assert!(broker.seen_verb("PATCH").is_empty());
    offer(&cluster, &broker, "1.1.0", 2).await;
    cluster
        .eventually("the automatic upgrade recorded", || {
            let i = cluster.instance("default", "db")?;
            (version(&i) == "1.1.0").then_some(())
        })
        .await;
    let patches = broker.seen_verb("PATCH");
    assert_eq!(patches.len(), 1);
    assert_eq!(
        patches[0].body["maintenance_info"],
        json!({"version": "1.1.0"})
    );
}
