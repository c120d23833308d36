//! Which namespaces a run of the controllers serves, and what it leaves alone, against the fake
//! API server: a namespace's own controller serves its ServiceBrokers and instances and nothing
//! of another namespace; the cluster's controller with that namespace excluded serves the rest
//! and leaves it alone; in a namespace being deleted, a binding's Secret is never written again.

mod support;

use std::time::Duration;

use brokkr_controller::{Context, Scope, resources};
use brokkr_fake_kube::FakeCluster;
use serde_json::json;
use support::*;

const API: &str = "services.brokkr.dev/v1alpha1";

async fn fake_with(namespaces: &[&str]) -> FakeCluster {
    let fake = FakeCluster::start().await;
    for crd in resources::crds() {
        fake.add_crd(&crd);
    }
    fake.add_kind("events.k8s.io", "v1", "Event", "events", true);
    for ns in namespaces {
        fake.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    fake
}

fn run(fake: &FakeCluster, scope: Scope) -> tokio::task::JoinHandle<()> {
    let mut ctx = Context::new(fake.client());
    ctx.scope = scope;
    ctx.brokers.namespaced_urls.allow("127.0.0.1").unwrap();
    tokio::spawn(brokkr_controller::run(ctx, futures::future::pending()))
}

/// A ServiceBroker for `broker` and an instance of its plan `small`, both in `ns`.
fn broker_and_instance(fake: &FakeCluster, broker: &Broker, ns: &str) {
    fake.create(json!({"apiVersion": API, "kind": "ServiceBroker",
        "metadata": {"name": "db", "namespace": ns}, "spec": {"url": broker.url}}));
    fake.create(json!({"apiVersion": API, "kind": "ServiceInstance",
        "metadata": {"name": "orders", "namespace": ns},
        "spec": {"serviceClassExternalName": "db", "servicePlanExternalName": "small"}}));
}

fn ready(fake: &FakeCluster, ns: &str) -> Option<()> {
    let instance = fake.get(API, "ServiceInstance", Some(ns), "orders")?;
    (condition(&instance, "Ready")?["status"] == "True").then_some(())
}

async fn eventually(what: &str, mut check: impl FnMut() -> Option<()>) {
    for _ in 0..600 {
        if check().is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Nothing of the controllers on an object: no status, no finalizer.
fn untouched(fake: &FakeCluster, kind: &str, ns: &str, name: &str) {
    let object = fake.get(API, kind, Some(ns), name).unwrap();
    assert!(
        object.get("status").is_none_or(|s| s.is_null()),
        "{kind} {ns}/{name}: {object}"
    );
    assert!(
        object["metadata"].get("finalizers").is_none(),
        "{kind} {ns}/{name}: {object}"
    );
}

#[tokio::test]
async fn a_namespaces_own_controller_serves_it_alone() {
    let broker = Broker::start(synchronous).await;
    let fake = fake_with(&["team-a", "team-b"]).await;
    let _controllers = run(&fake, Scope::Namespace("team-a".into()));
    broker_and_instance(&fake, &broker, "team-a");
    broker_and_instance(&fake, &broker, "team-b");
    eventually("team-a's instance Ready", || ready(&fake, "team-a")).await;

    tokio::time::sleep(Duration::from_secs(1)).await;
    untouched(&fake, "ServiceBroker", "team-b", "db");
    untouched(&fake, "ServiceInstance", "team-b", "orders");
    assert!(
        fake.get(API, "ServicePlan", Some("team-b"), "plan-small")
            .is_none()
    );
    assert_eq!(broker.seen_verb("PUT").len(), 1, "one provision, team-a's");
    // Nothing was asked of the API server beyond the namespace.
    for request in fake.requests() {
        let path = request.split_whitespace().nth(1).unwrap_or_default();
        assert!(
            !path.contains("/namespaces/team-b") && !path.starts_with("/api/v1/secrets"),
            "{request}"
        );
    }
}

#[tokio::test]
async fn the_clusters_controller_leaves_an_excluded_namespace_alone() {
    let broker = Broker::start(synchronous).await;
    let fake = fake_with(&["team-a", "team-b"]).await;
    let _controllers = run(
        &fake,
        Scope::Cluster {
            except: vec!["team-a".into()],
        },
    );
    broker_and_instance(&fake, &broker, "team-a");
    broker_and_instance(&fake, &broker, "team-b");
    eventually("team-b's instance Ready", || ready(&fake, "team-b")).await;

    tokio::time::sleep(Duration::from_secs(1)).await;
    untouched(&fake, "ServiceBroker", "team-a", "db");
    untouched(&fake, "ServiceInstance", "team-a", "orders");
    assert_eq!(broker.seen_verb("PUT").len(), 1, "one provision, team-b's");
}

#[tokio::test]
async fn nothing_is_written_into_a_namespace_being_deleted() {
    let broker = Broker::start(synchronous).await;
    let cluster = Cluster::start(&broker).await;
    let fake = &cluster.fake;
    fake.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed"}}));
    cluster.create_instance("doomed", "orders", json!({}));
    fake.create(json!({"apiVersion": API, "kind": "ServiceBinding",
        "metadata": {"name": "app", "namespace": "doomed"},
        "spec": {"instanceRef": {"name": "orders"}}}));
    cluster
        .eventually("the binding Ready", || {
            let binding = fake.get(API, "ServiceBinding", Some("doomed"), "app")?;
            (condition(&binding, "Ready")?["status"] == "True").then_some(())
        })
        .await;
    assert!(fake.get("v1", "Secret", Some("doomed"), "app").is_some());

    let before = fake.requests().len();
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(fake.client())
        .delete("doomed", &Default::default())
        .await
        .unwrap();
    cluster
        .eventually("the namespace gone", || {
            fake.get("v1", "Namespace", None, "doomed")
                .is_none()
                .then_some(())
        })
        .await;
    // The fake marks a namespace's objects deleted in the same instant as the namespace (a
    // real one does it after): an Event may beat the namespace's own change to the cache.
    let written: Vec<String> = fake.requests()[before..]
        .iter()
        .filter(|r| r.starts_with("POST") && r.contains("/namespaces/doomed/"))
        .filter(|r| !r.contains("/events"))
        .cloned()
        .collect();
    assert!(
        written.is_empty(),
        "created in a namespace being deleted: {written:?}"
    );
    let verbs: Vec<String> = broker.seen().iter().map(|s| s.verb().to_owned()).collect();
    assert_eq!(broker.seen_verb("UNBIND").len(), 1, "{verbs:?}");
    assert_eq!(
        broker.seen_verb("DELETE").len(),
        1,
        "deprovisioned: {verbs:?}"
    );
}
