//! ServiceInstance failures and deletion against the fake API server and a scripted broker:
//! orphan mitigation after a provision that may have half succeeded, the cascade-delete and
//! abandon annotations, and Events.

mod support;

use axum::http::StatusCode;
use brokkr_controller::resources::ServiceInstance;
use brokkr_controller::resources::{ABANDON_ANNOTATION, CASCADE_DELETE_ANNOTATION};
use kube::Api;
use kube::api::DeleteParams;
use serde_json::json;
use support::{API, Broker, Cluster, condition, synchronous};

async fn delete_instance(cluster: &Cluster, name: &str) {
    Api::<ServiceInstance>::namespaced(cluster.fake.client(), "default")
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

/// The first provision gets `first`; then the broker behaves.
async fn orphan_mitigation_after(first: (StatusCode, serde_json::Value)) {
    let mut puts = 0;
    let broker = Broker::start(move |seen| {
        if seen.verb() == "PUT" {
            puts += 1;
            if puts == 1 {
                return first.clone();
            }
        }
        synchronous(seen)
    })
    .await;
    let cluster = Cluster::start(&broker).await;
    cluster.create_instance("default", "db", json!({}));
    let instance = cluster.ready("default", "db").await;
    let verbs: Vec<String> = broker.seen().iter().map(|s| s.verb().to_owned()).collect();
    assert_eq!(
        verbs,
        ["PUT", "DELETE", "PUT"],
        "deprovisioned, then provisioned again"
    );
    let delete = &broker.seen_verb("DELETE")[0];
    assert!(delete.path.ends_with("/v2/service_instances/db"));
    assert!(
        delete.query.contains("plan_id=plan-small"),
        "{}",
        delete.query
    );
    assert_eq!(instance["status"]["orphanMitigationInProgress"], false);
    assert!(condition(&instance, "Failed").is_none());
    // Each Event is published after the status write it reports: the orphan mitigation, which
    // nobody asked for, has its Events; the provision that then succeeded, asked for, has none
    // (its condition says it).
    let reasons = cluster
        .eventually("the orphan mitigation's Events", || {
            let reasons: Vec<String> = cluster.events("db").into_iter().map(|e| e.0).collect();
            [
                "StartingInstanceOrphanMitigation",
                "OrphanMitigationSuccessful",
            ]
            .iter()
            .all(|reason| reasons.iter().any(|r| r == reason))
            .then_some(reasons)
        })
        .await;
    assert!(
        !reasons.iter().any(|r| r == "ProvisionedSuccessfully"),
        "{reasons:?}"
    );
}

#[tokio::test]
async fn a_provision_answered_500_is_deprovisioned_then_tried_again() {
    orphan_mitigation_after((
        StatusCode::INTERNAL_SERVER_ERROR,
        json!({"description": "database crashed"}),
    ))
    .await;
}

#[tokio::test]
async fn a_provision_accepted_with_an_unreadable_body_is_deprovisioned_then_tried_again() {
    orphan_mitigation_after((StatusCode::ACCEPTED, json!({"operation": 42}))).await;
}

#[tokio::test]
async fn an_asynchronous_provision_that_failed_is_deprovisioned_and_stays_failed() {
    let broker = Broker::start(|seen| match seen.verb() {
        "PUT" => (StatusCode::ACCEPTED, json!({"operation": "op-1"})),
        "POLL" => (
            StatusCode::OK,
            json!({"state": "failed", "description": "disk full"}),
        ),
        _ => synchronous(seen),
    })
    .await;
    let cluster = Cluster::start(&broker).await;
    cluster.create_instance("default", "db", json!({}));
    let instance = cluster
        .ready_reason("default", "db", "OrphanMitigationSuccessful")
        .await;
    let failed = condition(&instance, "Failed").expect("Failed");
    assert_eq!(failed["reason"], "ProvisionCallFailed");
    assert!(
        failed["message"].as_str().unwrap().contains("disk full"),
        "{failed}"
    );
    assert_eq!(instance["status"]["orphanMitigationInProgress"], false);
    assert_eq!(instance["status"]["deprovisionStatus"], "NotRequired");
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let verbs: Vec<String> = broker.seen().iter().map(|s| s.verb().to_owned()).collect();
    assert_eq!(verbs, ["PUT", "POLL", "DELETE"], "not provisioned again");
}

#[tokio::test]
async fn a_provision_refused_with_400_is_not_mitigated() {
    let broker = Broker::start(|seen| match seen.verb() {
        "PUT" => (StatusCode::BAD_REQUEST, json!({"description": "bad size"})),
        _ => synchronous(seen),
    })
    .await;
    let cluster = Cluster::start(&broker).await;
    cluster.create_instance("default", "db", json!({}));
    let instance = cluster
        .eventually("the instance failed", || {
            let i = cluster.instance("default", "db")?;
            condition(&i, "Failed").map(|_| i)
        })
        .await;
    assert_eq!(
        condition(&instance, "Failed").unwrap()["reason"],
        "ProvisionCallFailed"
    );
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert!(broker.seen_verb("DELETE").is_empty());
    assert_eq!(broker.seen_verb("PUT").len(), 1);
}

#[tokio::test]
async fn cascade_delete_removes_the_bindings_first_then_deprovisions() {
    let broker = Broker::start(synchronous).await;
    let cluster = Cluster::start(&broker).await;
    cluster.create_instance("default", "db", json!({}));
    cluster.edit(API, "ServiceInstance", Some("default"), "db", |o| {
        o["metadata"]["annotations"] = json!({CASCADE_DELETE_ANNOTATION: "true"});
    });
    cluster.ready("default", "db").await;
    // A binding controller holds its bindings until it has unbound them.
    for (name, instance) in [("app", "db"), ("other", "other-db")] {
        cluster
            .fake
            .create(json!({"apiVersion": API, "kind": "ServiceBinding",
            "metadata": {"name": name, "namespace": "default", "finalizers": ["test/unbind"]},
            "spec": {"instanceRef": {"name": instance}}}));
    }

    delete_instance(&cluster, "db").await;
    cluster
        .eventually("the binding marked deleted", || {
            let b = cluster
                .fake
                .get(API, "ServiceBinding", Some("default"), "app")?;
            b["metadata"].get("deletionTimestamp").map(|_| ())
        })
        .await;
    let instance = cluster
        .ready_reason("default", "db", "DeletingServiceBindings")
        .await;
    assert!(instance["metadata"]["deletionTimestamp"].is_string());
    assert!(
        broker.seen_verb("DELETE").is_empty(),
        "not while a binding exists"
    );

    cluster
        .fake
        .set_finalizers(API, "ServiceBinding", Some("default"), "app", &[]);
    cluster
        .eventually("the instance gone", || {
            cluster.instance("default", "db").is_none().then_some(())
        })
        .await;
    assert_eq!(broker.seen_verb("DELETE").len(), 1);
    let other = cluster
        .fake
        .get(API, "ServiceBinding", Some("default"), "other")
        .expect("another instance's binding stays");
    assert!(other["metadata"].get("deletionTimestamp").is_none());
    // A deletion the user asked for that went well publishes no Event.
    let reasons: Vec<String> = cluster.events("db").into_iter().map(|e| e.0).collect();
    assert!(
        !reasons.iter().any(|r| r == "DeprovisionedSuccessfully"),
        "{reasons:?}"
    );
}

#[tokio::test]
async fn without_cascade_delete_bindings_block_the_deletion() {
    let broker = Broker::start(synchronous).await;
    let cluster = Cluster::start(&broker).await;
    cluster.create_instance("default", "db", json!({}));
    cluster.ready("default", "db").await;
    cluster
        .fake
        .create(json!({"apiVersion": API, "kind": "ServiceBinding",
        "metadata": {"name": "app", "namespace": "default"},
        "spec": {"instanceRef": {"name": "db"}}}));
    delete_instance(&cluster, "db").await;
    let instance = cluster
        .ready_reason("default", "db", "DeprovisionBlockedByExistingBindings")
        .await;
    let message = condition(&instance, "Ready").unwrap()["message"].clone();
    assert!(message.as_str().unwrap().contains("app"), "{message}");
    assert!(
        cluster
            .fake
            .get(API, "ServiceBinding", Some("default"), "app")
            .is_some()
    );
    assert!(broker.seen_verb("DELETE").is_empty());
}

#[tokio::test]
async fn abandon_releases_an_instance_whose_broker_is_unreachable() {
    let broker = Broker::start(synchronous).await;
    let cluster = Cluster::start(&broker).await;
    cluster.create_instance("default", "orders", json!({}));
    cluster.ready("default", "orders").await;
    broker.stop();

    delete_instance(&cluster, "orders").await;
    let instance = cluster
        .ready_reason("default", "orders", "DeprovisionCallFailed")
        .await;
    let message = condition(&instance, "Ready").unwrap()["message"].clone();
    assert!(
        message.as_str().unwrap().contains(ABANDON_ANNOTATION),
        "the way out is named: {message}"
    );
    assert!(
        cluster.instance("default", "orders").is_some(),
        "held by its finalizer"
    );

    cluster.edit(API, "ServiceInstance", Some("default"), "orders", |o| {
        o["metadata"]["annotations"] = json!({ABANDON_ANNOTATION: "true"});
    });
    cluster
        .eventually("the instance gone", || {
            cluster
                .instance("default", "orders")
                .is_none()
                .then_some(())
        })
        .await;
    let events = cluster.events("orders");
    let (_, note) = events
        .iter()
        .find(|(reason, _)| reason == "Abandoned")
        .unwrap_or_else(|| panic!("an Abandoned event: {events:?}"));
    assert!(note.contains("OSB instance orders"), "{note}");
    assert!(note.contains("ClusterServiceBroker/db"), "{note}");
}

#[tokio::test]
async fn abandon_releases_an_instance_whose_broker_resource_is_gone() {
    let broker = Broker::start(synchronous).await;
    let cluster = Cluster::start(&broker).await;
    cluster.create_instance("default", "orders", json!({}));
    cluster.ready("default", "orders").await;
    // The ClusterServiceBroker and its catalog are deleted (no garbage collection in the fake).
    cluster
        .fake
        .set_finalizers(API, "ClusterServiceBroker", None, "db", &[]);
    Api::<brokkr_controller::resources::ClusterServiceBroker>::all(cluster.fake.client())
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();

    delete_instance(&cluster, "orders").await;
    let instance = cluster
        .ready_reason("default", "orders", "ErrorGettingBroker")
        .await;
    let message = condition(&instance, "Ready").unwrap()["message"].clone();
    assert!(
        message.as_str().unwrap().contains(ABANDON_ANNOTATION),
        "{message}"
    );
    cluster.edit(API, "ServiceInstance", Some("default"), "orders", |o| {
        o["metadata"]["annotations"] = json!({ABANDON_ANNOTATION: "true"});
    });
    cluster
        .eventually("the instance gone", || {
            cluster
                .instance("default", "orders")
                .is_none()
                .then_some(())
        })
        .await;
    assert!(broker.seen_verb("DELETE").is_empty());
}

#[tokio::test]
async fn deleting_the_namespace_of_a_ready_instance_deprovisions_it() {
    let broker = Broker::start(synchronous).await;
    let cluster = Cluster::start(&broker).await;
    cluster
        .fake
        .create(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "team-a"}}));
    cluster
        .fake
        .create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "params", "namespace": "team-a"},
        "data": {"p": "eyJ0aWVyIjogImdvbGQifQ=="}}));
    cluster.create_instance(
        "team-a",
        "db",
        json!({"parametersFrom": [{"secretKeyRef": {"name": "params", "key": "p"}}]}),
    );
    cluster.ready("team-a", "db").await;
    cluster
        .fake
        .create(json!({"apiVersion": API, "kind": "ServiceBinding",
        "metadata": {"name": "app", "namespace": "team-a"},
        "spec": {"instanceRef": {"name": "db"}}}));

    delete_namespace(&cluster, "team-a").await;
    let deletes = broker.seen_verb("DELETE");
    assert_eq!(deletes.len(), 1, "deprovisioned once");
    assert!(deletes[0].path.ends_with("/v2/service_instances/db"));
}

/// The namespace `ns` with its own ServiceBroker `own` for `broker`, its plans listed, and a
/// ServiceInstance `db` (OSB id `<ns>-db`) of it, Ready.
async fn namespace_with_its_own_broker(cluster: &Cluster, broker: &Broker, ns: &str) {
    cluster
        .fake
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    cluster
        .fake
        .create(json!({"apiVersion": API, "kind": "ServiceBroker",
        "metadata": {"name": "own", "namespace": ns}, "spec": {"url": broker.url}}));
    cluster
        .eventually("the namespace's plans listed", || {
            cluster
                .fake
                .get(API, "ServicePlan", Some(ns), "plan-small")
                .map(|_| ())
        })
        .await;
    cluster
        .fake
        .create(json!({"apiVersion": API, "kind": "ServiceInstance",
        "metadata": {"name": "db", "namespace": ns},
        "spec": {"serviceClassExternalName": "db", "servicePlanExternalName": "small",
                 "externalID": format!("{ns}-db")}}));
    cluster.ready(ns, "db").await;
}

/// Deletes the namespace `ns` and waits for it to go.
async fn delete_namespace(cluster: &Cluster, ns: &str) {
    Api::<k8s_openapi::api::core::v1::Namespace>::all(cluster.fake.client())
        .delete(ns, &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .eventually("the namespace gone", || {
            cluster
                .fake
                .get("v1", "Namespace", None, ns)
                .is_none()
                .then_some(())
        })
        .await;
}

/// A namespace deleted with its own ServiceBroker: the broker and its catalog are kept until
/// the instance is deprovisioned through them, then everything goes, with no one's help.
#[tokio::test]
async fn a_namespace_deleted_with_its_own_broker_deprovisions_its_instance_and_goes() {
    let broker = Broker::start(synchronous).await;
    let cluster = Cluster::start(&broker).await;
    namespace_with_its_own_broker(&cluster, &broker, "team-b").await;

    delete_namespace(&cluster, "team-b").await;
    let deletes = broker.seen_verb("DELETE");
    assert_eq!(
        deletes.len(),
        1,
        "deprovisioned once, through its own broker"
    );
    assert!(deletes[0].path.ends_with("/v2/service_instances/team-b-db"));
}

/// A namespace deleted after its own broker went dead (its URL points nowhere): the instance
/// and its binding cannot be deprovisioned or unbound, and are released once the namespace's
/// deletion has waited `namespace_deletion_timeout`; an Event about the Namespace, in
/// `kube-system`, says what the broker may keep. The namespace ends with no one's help.
#[tokio::test]
async fn a_namespace_whose_broker_never_answers_ends_after_the_wait() {
    let broker = Broker::start(synchronous).await;
    let cluster = Cluster::start_with(&broker, |ctx| {
        ctx.namespace_deletion_timeout = std::time::Duration::from_secs(2);
    })
    .await;
    cluster.fake.create(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}}),
    );
    namespace_with_its_own_broker(&cluster, &broker, "team-c").await;
    cluster
        .fake
        .create(json!({"apiVersion": API, "kind": "ServiceBinding",
        "metadata": {"name": "app", "namespace": "team-c"},
        "spec": {"instanceRef": {"name": "db"}, "externalID": "team-c-app"}}));
    cluster
        .eventually("the binding bound", || {
            let b = cluster
                .fake
                .get(API, "ServiceBinding", Some("team-c"), "app")?;
            (condition(&b, "Ready")?["status"] == "True").then_some(())
        })
        .await;

    broker.stop();
    delete_namespace(&cluster, "team-c").await;
    let notes: Vec<String> = cluster
        .fake
        .list("events.k8s.io/v1", "Event")
        .into_iter()
        .filter(|e| e["reason"] == "AbandonedWithNamespace")
        .inspect(|e| {
            assert_eq!(e["metadata"]["namespace"], "kube-system");
            assert_eq!(e["regarding"]["kind"], "Namespace");
            assert_eq!(e["regarding"]["name"], "team-c");
        })
        .map(|e| e["note"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("ServiceInstance db") && n.contains("team-c-db")),
        "{notes:?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("ServiceBinding app") && n.contains("team-c-app")),
        "{notes:?}"
    );
}
