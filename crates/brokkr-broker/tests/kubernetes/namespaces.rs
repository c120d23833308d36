//! The namespace policies through the OSB API: `from-context` without a namespace in the
//! context fails the provision; `per-instance` makes a namespace that lives as long as its
//! instance.

use reqwest::StatusCode;
use serde_json::json;

use crate::cluster::{CLUSTER_TURN, Cluster, broker_kubeconfig, fake, real};
use crate::support::{
    MANIFESTS, PG, PG_SMALL, broker, forget_stand_in_database, manifests_at_stand_in, object_name,
    ok, stand_in_database,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_namespace_missing_from_the_context_fails_the_provision() {
    let (_cluster, _dir, kubeconfig) = fake().await;
    let broker = broker(MANIFESTS, &kubeconfig).await;
    let id = uuid::Uuid::new_v4().to_string();
    let r = broker
        .put(
            &format!("/v2/service_instances/{id}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": PG, "plan_id": PG_SMALL, "context": {"platform": "cloudfoundry"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let done = broker
        .poll(&format!("/v2/service_instances/{id}/last_operation"), None)
        .await;
    assert_eq!(done.body["state"], "failed");
    assert!(
        done.description().contains("no `namespace`"),
        "{:?}",
        done.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_per_instance_namespace_lives_as_long_as_its_instance() {
    let (cluster, _dir, kubeconfig) = fake().await;
    per_instance_namespace(&cluster, &kubeconfig).await;
}

/// provision → ready → deprovision of the manifests PostgreSQL plan with `namespace:
/// per-instance`: the namespace comes with the instance and goes with it.
async fn per_instance_namespace(cluster: &Cluster, kubeconfig: &str) {
    let database = stand_in_database();
    let catalog = manifests_at_stand_in(&database)
        .replace("namespace: from-context", "namespace: per-instance");
    let broker = broker(&catalog, kubeconfig).await;
    let id = uuid::Uuid::new_v4().to_string();
    let name = object_name("pg", &id);
    let ns = brokkr_targets::kubernetes::instance_namespace(&id);
    let instance = format!("/v2/service_instances/{id}");
    let last = format!("{instance}/last_operation");
    let r = broker
        .put(
            &format!("{instance}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": PG, "plan_id": PG_SMALL, "context": {"platform": "cloudfoundry"},
                "parameters": {"storage": "1Gi"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    broker.poll(&last, Some("waiting for StatefulSet")).await;
    assert!(cluster.namespace(&ns).await.is_some());
    cluster.make_ready(&ns, &name).await;
    ok(&broker.poll(&last, None).await);
    cluster.claim(&ns, &name).await;
    let r = broker
        .delete(&format!(
            "{instance}?accepts_incomplete=true&service_id={PG}&plan_id={PG_SMALL}"
        ))
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let done = broker.poll(&last, None).await;
    ok(&done);
    assert!(!done.description().contains("skipped"), "{:?}", done.body);
    assert!(cluster.namespace(&ns).await.is_none());
    forget_stand_in_database(&database).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a cluster: BROKKR_E2E_KUBECONFIG (see docs/testing.md)"]
async fn a_per_instance_namespace_lives_as_long_as_its_instance_on_a_cluster() {
    let _turn = CLUSTER_TURN.lock().await;
    let (cluster, kubeconfig, _) = real().await;
    let roles = ["manifests.yaml", "per-instance-namespaces.yaml"];
    let kubeconfig = broker_kubeconfig(&cluster, &kubeconfig, &roles).await;
    per_instance_namespace(&cluster, &kubeconfig).await;
}
