//! A ServiceBinding created with its ServiceInstance waits for it without a word (no status
//! write, no broker call) while the instance is provisioned, across a controller's restart too,
//! and binds once the instance is Ready; a binding whose instance is Ready when a controller
//! starts binds then.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use support::{API, Cluster};

/// Creates a ServiceBinding `name` of the instance `db`.
fn create_binding(cluster: &Cluster, name: &str) {
    cluster
        .fake
        .create(json!({"apiVersion": API, "kind": "ServiceBinding",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"instanceRef": {"name": "db"}}}));
}

async fn bound(cluster: &Cluster, name: &str) {
    cluster
        .eventually(&format!("the binding {name} Ready"), || {
            let binding = cluster
                .fake
                .get(API, "ServiceBinding", Some("default"), name)?;
            (support::condition(&binding, "Ready")?["status"] == "True").then_some(())
        })
        .await;
    assert!(
        (cluster.fake)
            .get("v1", "Secret", Some("default"), name)
            .is_some(),
        "the binding's Secret"
    );
}

#[tokio::test]
async fn a_binding_waits_without_a_word_for_its_provisioning_instance_across_a_restart() {
    let busy = Arc::new(Mutex::new(true));
    let broker = support::asynchronous_broker(busy.clone()).await;
    let mut cluster = Cluster::start(&broker).await;
    cluster.create_instance("default", "db", json!({}));
    cluster
        .eventually("the provision polled", || {
            (!broker.seen_verb("POLL").is_empty()).then_some(())
        })
        .await;
    create_binding(&cluster, "app");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let quiet = |cluster: &Cluster, when: &str| {
        let binding = (cluster.fake)
            .get(API, "ServiceBinding", Some("default"), "app")
            .unwrap();
        assert_eq!(binding["status"]["conditions"], json!(null), "{when}");
        assert_eq!(cluster.status_writes("servicebindings"), 0, "{when}");
        assert!(broker.seen_verb("BIND").is_empty(), "{when}");
    };
    quiet(&cluster, "while the instance is provisioned");

    // A controller that starts while the instance is still provisioned leaves the binding be.
    cluster.restart_controllers().await;
    cluster
        .eventually("the provision polled by the new controller", || {
            (broker.seen_verb("POLL").len() >= 2).then_some(())
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    quiet(&cluster, "after the restart");

    // The instance becomes Ready: its change wakes the binding.
    *busy.lock().unwrap() = false;
    bound(&cluster, "app").await;
    assert_eq!(broker.seen_verb("BIND").len(), 1);

    // A binding created while no controller runs, of an instance that is Ready, binds when one
    // starts.
    cluster.stop_controllers().await;
    create_binding(&cluster, "late");
    cluster.start_controllers();
    bound(&cluster, "late").await;
    assert_eq!(broker.seen_verb("BIND").len(), 2);
}
