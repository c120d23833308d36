//! A workload whose own controller writes it between brokkr's read and brokkr's patch, against
//! the fake API server playing that writer: the servicebinding.io runtime's projection and a
//! ServiceBindingUsage's injection read the workload again and patch at once (no reconcile
//! error, no wait for a retry), keep the other writer's change, and count the conflicts in
//! `brokkr_controller_conflicts_total`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use brokkr_controller::metrics::Metrics;
use brokkr_controller::resources;
use brokkr_fake_kube::FakeCluster;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

const NS: Option<&str> = Some("default");

/// The fake with every CRD, and a context whose metrics are registered in the returned registry.
async fn start() -> (FakeCluster, Arc<brokkr_controller::Context>, Registry) {
    let fake = FakeCluster::start().await;
    for crd in resources::crds() {
        fake.add_crd(&crd);
    }
    let mut registry = Registry::default();
    let ctx = brokkr_controller::Context {
        metrics: Metrics::register(&mut registry),
        ..brokkr_controller::Context::new(fake.client())
    };
    (fake, Arc::new(ctx), registry)
}

/// The value of the counter `name` with the label `controller`, 0 if it was never counted.
fn counted(registry: &Registry, name: &str, controller: &str) -> u64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    let series = format!("{name}{{controller=\"{controller}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0, |value| value.parse().unwrap())
}

fn deployment(name: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": name, "namespace": "default", "generation": 1},
    "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "app", "image": "app:1"}]}}}})
}

/// What the Deployment's own controller writes while it rolls: its status and revision.
fn roll(deployment: &mut Value) {
    let revision = deployment["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
        .as_str()
        .map_or(1, |r| r.parse::<u64>().unwrap() + 1);
    deployment["metadata"]["annotations"]["deployment.kubernetes.io/revision"] =
        json!(revision.to_string());
    deployment["status"]["observedGeneration"] = json!(revision);
}

/// Polls `probe` for up to 20 s.
async fn until<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    for _ in 0..400 {
        if let Some(found) = probe() {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The PATCH requests sent for the Deployment `name`.
fn patches(fake: &FakeCluster, name: &str) -> usize {
    let path = format!("PATCH /apis/apps/v1/namespaces/default/deployments/{name}?");
    fake.requests()
        .iter()
        .filter(|r| r.starts_with(&path))
        .count()
}

#[tokio::test]
async fn a_projection_whose_deployment_changes_between_read_and_patch_is_made_at_once() {
    let (fake, ctx, registry) = start().await;
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "default"},
        "type": "servicebinding.io/mysql", "stringData": {"type": "mysql", "host": "db"}}));
    fake.create(deployment("shop"));
    // The Deployment's controller writes before each of brokkr's next two patches.
    fake.change_before_patch("apps/v1", "Deployment", NS, "shop", 2, roll);
    tokio::spawn(brokkr_controller::servicebinding_io::run(
        ctx.clone(),
        futures::future::pending(),
    ));
    let created = Instant::now();
    fake.create(
        json!({"apiVersion": "servicebinding.io/v1", "kind": "ServiceBinding",
        "metadata": {"name": "shop-db", "namespace": "default"},
        "spec": {"service": {"apiVersion": "v1", "kind": "Secret", "name": "db"},
                 "workload": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "shop"}}}),
    );
    let shop = until("the projection", || {
        let shop = fake.get("apps/v1", "Deployment", NS, "shop")?;
        shop["spec"]["template"]["spec"]["volumes"]
            .is_array()
            .then_some(shop)
    })
    .await;
    // Not the 10 s a failed reconcile waits.
    assert!(
        created.elapsed() < Duration::from_secs(5),
        "projected after {:?}",
        created.elapsed()
    );
    // The other writer's changes are kept.
    assert_eq!(
        shop["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
        "2"
    );
    assert_eq!(shop["status"]["observedGeneration"], 2);
    assert_eq!(patches(&fake, "shop"), 3);
    let controller = "ServiceBinding.servicebinding.io";
    until("Ready", || {
        let binding = fake.get("servicebinding.io/v1", "ServiceBinding", NS, "shop-db")?;
        binding["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
            .then_some(())
    })
    .await;
    // Each of the Deployment's writes is one conflict (a cached version of the controller's own
    // object behind its last write may add one).
    assert!(counted(&registry, "brokkr_controller_conflicts_total", controller) >= 2);
    assert_eq!(
        counted(
            &registry,
            "brokkr_controller_reconcile_errors_total",
            controller
        ),
        0
    );
}

#[tokio::test]
async fn an_injection_whose_deployment_changes_between_read_and_patch_is_made_at_once() {
    let (fake, ctx, registry) = start().await;
    let api = "services.brokkr.dev/v1alpha1";
    fake.create(json!({"apiVersion": api, "kind": "ServiceBinding",
        "metadata": {"name": "cache", "namespace": "default"},
        "spec": {"instanceRef": {"name": "redis"}}}));
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "cache", "namespace": "default"},
        "type": "servicebinding.io/redis", "data": {"host": "cmVkaXM="}}));
    fake.set_status(
        api,
        "ServiceBinding",
        NS,
        "cache",
        json!({"binding": {"name": "cache"}}),
    );
    fake.create(deployment("shop"));
    fake.change_before_patch("apps/v1", "Deployment", NS, "shop", 1, roll);
    let usages = brokkr_controller::usage::run(ctx.clone(), futures::future::pending());
    let caches = ctx.caches.start(&ctx.client, &ctx.scope, &ctx.written);
    tokio::spawn(async move {
        futures::join!(usages, futures::future::join_all(caches));
    });
    let created = Instant::now();
    fake.create(json!({"apiVersion": api, "kind": "ServiceBindingUsage",
        "metadata": {"name": "shop-cache", "namespace": "default"},
        "spec": {"serviceBindingRef": {"name": "cache"},
                 "usedBy": {"kind": "deployment", "name": "shop"}}}));
    let shop = until("the injection", || {
        let shop = fake.get("apps/v1", "Deployment", NS, "shop")?;
        shop["spec"]["template"]["spec"]["containers"][0]["envFrom"]
            .is_array()
            .then_some(shop)
    })
    .await;
    assert!(
        created.elapsed() < Duration::from_secs(5),
        "injected after {:?}",
        created.elapsed()
    );
    assert_eq!(shop["status"]["observedGeneration"], 1);
    assert_eq!(patches(&fake, "shop"), 2);
    let controller = "ServiceBindingUsage";
    // Each of the Deployment's writes is one conflict (a cached version of the controller's own
    // object behind its last write may add one).
    assert!(counted(&registry, "brokkr_controller_conflicts_total", controller) >= 1);
    assert_eq!(
        counted(
            &registry,
            "brokkr_controller_reconcile_errors_total",
            controller
        ),
        0
    );
}
