//! An asynchronous operation that ends within seconds costs no status write of its start, and a
//! controller that dies while it holds one loses nothing: the ids and the need to deprovision
//! or unbind are written before the broker is called.

mod support;

use std::sync::{Arc, Mutex};

use brokkr_controller::resources::{ServiceBinding, ServiceInstance};
use kube::Api;
use kube::api::DeleteParams;
use serde_json::{Value, json};
use support::{API, Broker, Cluster};

/// A broker whose operations are in progress until the flag is cleared, the controllers, and an
/// instance `db` whose provision the controller has polled once.
async fn provision_in_progress() -> (Arc<Mutex<bool>>, Broker, Cluster) {
    let busy = Arc::new(Mutex::new(true));
    let broker = support::asynchronous_broker(busy.clone()).await;
    let cluster = Cluster::start(&broker).await;
    cluster.create_instance("default", "db", json!({}));
    cluster
        .eventually("the provision polled", || {
            (!broker.seen_verb("POLL").is_empty()).then_some(())
        })
        .await;
    (busy, broker, cluster)
}

#[tokio::test]
async fn a_short_operation_writes_its_end_and_not_its_start() {
    let (busy, broker, cluster) = provision_in_progress().await;
    let instance = cluster.instance("default", "db").unwrap();
    assert_eq!(
        instance["status"]["deprovisionStatus"], "Required",
        "written before the provision: {instance:#}"
    );
    assert!(instance["status"].get("lastOperation").is_none());
    *busy.lock().unwrap() = false;
    let ready = cluster.ready("default", "db").await;
    assert_eq!(ready["status"]["asyncOpInProgress"], false);
    assert_eq!(
        cluster.status_writes("serviceinstances"),
        2,
        "the ids recorded, then Ready"
    );
    assert_eq!(broker.seen_verb("PUT").len(), 1);
}

#[tokio::test]
async fn a_controller_that_dies_holding_a_start_deprovisions_what_it_provisioned() {
    let (busy, broker, mut cluster) = provision_in_progress().await;
    // The start is held, not written; the controller dies with it and the user deletes.
    cluster.restart_controllers().await;
    Api::<ServiceInstance>::namespaced(cluster.fake.client(), "default")
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    *busy.lock().unwrap() = false;
    cluster
        .eventually("the instance gone", || {
            cluster.instance("default", "db").is_none().then_some(())
        })
        .await;
    let verbs: Vec<String> = broker.seen().iter().map(|s| s.verb().to_owned()).collect();
    assert!(
        verbs.iter().any(|v| v == "DELETE"),
        "deprovisioned, not forgotten: {verbs:?}"
    );
}

#[tokio::test]
async fn a_controller_that_dies_holding_a_start_repeats_the_identical_request_once() {
    let (busy, broker, mut cluster) = provision_in_progress().await;
    cluster.restart_controllers().await;
    cluster
        .eventually("the provision asked again", || {
            (broker.seen_verb("PUT").len() == 2).then_some(())
        })
        .await;
    *busy.lock().unwrap() = false;
    cluster.ready("default", "db").await;
    let puts: Vec<Value> = broker
        .seen_verb("PUT")
        .into_iter()
        .map(|s| s.body)
        .collect();
    assert_eq!(puts.len(), 2, "once by each controller");
    assert_eq!(puts[0], puts[1], "the identical request");
    bind_app(&cluster).await;
    assert_eq!(
        cluster.status_writes("servicebindings"),
        2,
        "the binding's ids recorded, then Ready"
    );
}

/// Creates a ServiceBinding `app` of the instance `db` and waits until it is Ready.
async fn bind_app(cluster: &Cluster) {
    let bind = json!({"apiVersion": API, "kind": "ServiceBinding",
        "metadata": {"name": "app", "namespace": "default"},
        "spec": {"instanceRef": {"name": "db"}}});
    cluster.fake.create(bind);
    cluster
        .eventually("the binding Ready", || {
            let binding = cluster
                .fake
                .get(API, "ServiceBinding", Some("default"), "app")?;
            (support::condition(&binding, "Ready")?["status"] == "True").then_some(())
        })
        .await;
}

/// A broker whose operations are in progress while the flag is set (clear at first), the
/// controllers, and a ServiceBinding `app` of an instance `db`, both Ready.
async fn bound() -> (Arc<Mutex<bool>>, Broker, Cluster) {
    let busy = Arc::new(Mutex::new(false));
    let broker = support::asynchronous_broker(busy.clone()).await;
    let cluster = Cluster::start(&broker).await;
    cluster.create_instance("default", "db", json!({}));
    cluster.ready("default", "db").await;
    bind_app(&cluster).await;
    (busy, broker, cluster)
}

/// Deletes the ServiceBinding `app` while its unbind is in progress, and waits for a poll of it.
async fn unbind_in_progress(busy: &Mutex<bool>, broker: &Broker, cluster: &Cluster) {
    *busy.lock().unwrap() = true;
    let bind_polls = broker.seen_verb("BINDING_POLL").len();
    Api::<ServiceBinding>::namespaced(cluster.fake.client(), "default")
        .delete("app", &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .eventually("the unbind polled", || {
            let unbound = !broker.seen_verb("UNBIND").is_empty();
            (unbound && broker.seen_verb("BINDING_POLL").len() > bind_polls).then_some(())
        })
        .await;
}

async fn binding_gone(cluster: &Cluster) {
    cluster
        .eventually("the binding gone", || {
            let binding = cluster
                .fake
                .get(API, "ServiceBinding", Some("default"), "app");
            binding.is_none().then_some(())
        })
        .await;
}

#[tokio::test]
async fn a_short_unbind_writes_neither_its_start_nor_its_end() {
    let (busy, broker, cluster) = bound().await;
    let before = cluster.status_writes("servicebindings");
    unbind_in_progress(&busy, &broker, &cluster).await;
    *busy.lock().unwrap() = false;
    binding_gone(&cluster).await;
    assert_eq!(broker.seen_verb("UNBIND").len(), 1);
    assert_eq!(
        cluster.status_writes("servicebindings") - before,
        0,
        "the binding goes with its finalizer: neither the start nor the end is written"
    );
}

#[tokio::test]
async fn a_controller_that_dies_holding_an_unbinds_start_unbinds_again() {
    let (busy, broker, mut cluster) = bound().await;
    unbind_in_progress(&busy, &broker, &cluster).await;
    cluster.restart_controllers().await;
    cluster
        .eventually("the unbind asked again", || {
            (broker.seen_verb("UNBIND").len() == 2).then_some(())
        })
        .await;
    *busy.lock().unwrap() = false;
    binding_gone(&cluster).await;
    let unbinds: Vec<String> = broker
        .seen_verb("UNBIND")
        .into_iter()
        .map(|s| format!("{} {}?{}", s.method, s.path, s.query))
        .collect();
    assert_eq!(unbinds[0], unbinds[1], "the identical request");
}
