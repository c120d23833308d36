//! The ServiceBindingUsage controller against the fake API server: a usage created before its
//! binding, Secret and workload waits with a reason and injects when they appear; a credential
//! change rolls the template; deleting the usage reverts exactly its injection and keeps the
//! Secret; changing `usedBy` moves the injection; two usages share a workload; UsageKinds ship
//! once and are never overwritten, and a custom one maps a kind without a pod template.

use std::sync::Arc;
use std::time::Duration;

use brokkr_controller::resources::{self, ServiceBindingUsage};
use brokkr_fake_kube::FakeCluster;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

const API: &str = "services.brokkr.dev/v1alpha1";
const NS: Option<&str> = Some("default");

async fn start() -> FakeCluster {
    let fake = FakeCluster::start().await;
    for crd in resources::crds() {
        if crd.spec.group == resources::GROUP {
            fake.add_crd(&crd);
        }
    }
    fake
}

/// The usage controller, following the caches' bindings and Secrets as `brokkr_controller::run`
/// makes it.
fn run(fake: &FakeCluster) -> tokio::task::JoinHandle<()> {
    let ctx = Arc::new(brokkr_controller::Context::new(fake.client()));
    let usages = brokkr_controller::usage::run(ctx.clone(), futures::future::pending());
    let caches = ctx.caches.start(&ctx.client, &ctx.scope, &ctx.written);
    tokio::spawn(async move {
        futures::join!(usages, futures::future::join_all(caches));
    })
}

/// Polls `probe` for up to 20 s (a waiting usage looks again every 10 s).
async fn until<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    for _ in 0..400 {
        if let Some(found) = probe() {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

fn ready(fake: &FakeCluster, usage: &str) -> Option<(String, String)> {
    let usage = fake.get(API, "ServiceBindingUsage", NS, usage)?;
    let c = usage["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?
        .clone();
    Some((
        c["status"].as_str()?.to_owned(),
        c["reason"].as_str()?.to_owned(),
    ))
}

async fn reason(fake: &FakeCluster, usage: &str, reason: &str) {
    until(&format!("{usage}: {reason}"), || {
        ready(fake, usage).filter(|(_, r)| r == reason)
    })
    .await;
}

fn deployment(name: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": name, "namespace": "default"},
    "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
            "spec": {"containers": [
                {"name": "app", "image": "app:1", "env": [{"name": "LOG", "value": "debug"}]},
                {"name": "proxy", "image": "proxy:1"}
            ]}}}})
}

/// A brokkr ServiceBinding, bound, and its Secret.
fn bound(fake: &FakeCluster, binding: &str, data: Value) {
    let uid = fake
        .get(API, "ServiceBinding", NS, binding)
        .map(|b| b["metadata"]["uid"].clone())
        .unwrap_or(json!(null));
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("{binding}-secret"), "namespace": "default",
            "ownerReferences": [{"apiVersion": API, "kind": "ServiceBinding", "name": binding,
                                  "uid": uid, "controller": true}]},
        "type": "servicebinding.io/redis", "data": data}));
    fake.set_status(
        API,
        "ServiceBinding",
        NS,
        binding,
        json!({"binding": {"name": format!("{binding}-secret")}}),
    );
}

fn binding(name: &str) -> Value {
    json!({"apiVersion": API, "kind": "ServiceBinding",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"instanceRef": {"name": "redis"}}})
}

fn usage(name: &str, binding: &str, kind: &str, target: &str, prefix: Option<&str>) -> Value {
    let mut usage = json!({"apiVersion": API, "kind": "ServiceBindingUsage",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"serviceBindingRef": {"name": binding}, "usedBy": {"kind": kind, "name": target}}});
    if let Some(prefix) = prefix {
        usage["spec"]["parameters"] = json!({"envPrefix": {"name": prefix}});
    }
    usage
}

fn template(fake: &FakeCluster, kind: &str, name: &str) -> Value {
    fake.get("apps/v1", kind, NS, name).unwrap()["spec"]["template"].clone()
}

#[tokio::test]
async fn a_usage_first_waits_for_binding_secret_and_workload_then_injects_and_reverts_on_delete() {
    let fake = start().await;
    let _controller = run(&fake);
    fake.create(usage(
        "redis-usage",
        "redis-binding",
        "deployment",
        "shop",
        Some("REDIS_"),
    ));
    reason(&fake, "redis-usage", "ServiceBindingNotReady").await;

    fake.create(binding("redis-binding"));
    reason(&fake, "redis-usage", "ServiceBindingNotReady").await;
    bound(
        &fake,
        "redis-binding",
        json!({"host": "cmVkaXM=", "port": "NjM3OQ=="}),
    );
    reason(&fake, "redis-usage", "TargetNotFound").await;

    // The workload's kind is watched: its creation wakes the usage at once (no poll).
    let original = deployment("shop");
    let created = std::time::Instant::now();
    fake.create(original.clone());
    reason(&fake, "redis-usage", "Injected").await;
    assert!(
        created.elapsed() < Duration::from_secs(2),
        "injected {:?} after the workload appeared",
        created.elapsed()
    );

    let injected = template(&fake, "Deployment", "shop");
    for container in injected["spec"]["containers"].as_array().unwrap() {
        assert_eq!(
            container["envFrom"],
            json!([{"secretRef": {"name": "redis-binding-secret"}, "prefix": "REDIS_"}])
        );
    }
    assert_eq!(
        injected["spec"]["containers"][0]["env"],
        original["spec"]["template"]["spec"]["containers"][0]["env"]
    );
    let record = injected["metadata"]["annotations"]["usage.services.brokkr.dev/redis-usage"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(record.contains("sha256:"), "{record}");

    let usage = fake
        .get(API, "ServiceBindingUsage", NS, "redis-usage")
        .unwrap();
    let binding_uid = fake
        .get(API, "ServiceBinding", NS, "redis-binding")
        .unwrap()["metadata"]["uid"]
        .clone();
    assert_eq!(usage["metadata"]["ownerReferences"][0]["uid"], binding_uid);
    assert_eq!(
        usage["metadata"]["ownerReferences"][0]["kind"],
        "ServiceBinding"
    );
    assert_eq!(
        usage["metadata"]["finalizers"],
        json!(["services.brokkr.dev/service-binding-usage"])
    );
    assert_eq!(usage["status"]["observedGeneration"], 1);
    assert!(usage["status"]["lastUpdateTime"].is_string());
    assert_eq!(usage["status"]["injected"]["name"], "shop");

    // New credentials: the digest changes, so the pods roll.
    bound(
        &fake,
        "redis-binding",
        json!({"host": "cmVkaXMtMg==", "port": "NjM3OQ=="}),
    );
    until("a new digest", || {
        let t = template(&fake, "Deployment", "shop");
        let now = t["metadata"]["annotations"]["usage.services.brokkr.dev/redis-usage"]
            .as_str()?
            .to_owned();
        (now != record).then_some(())
    })
    .await;

    let usages = Api::<ServiceBindingUsage>::namespaced(fake.client(), "default");
    usages
        .delete("redis-usage", &DeleteParams::default())
        .await
        .unwrap();
    until("the usage is gone", || {
        fake.get(API, "ServiceBindingUsage", NS, "redis-usage")
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(
        template(&fake, "Deployment", "shop"),
        original["spec"]["template"]
    );
    assert!(
        fake.get("v1", "Secret", NS, "redis-binding-secret")
            .is_some()
    );
}

#[tokio::test]
async fn two_usages_share_a_workload_and_changing_used_by_moves_one() {
    let fake = start().await;
    fake.create(binding("a"));
    bound(&fake, "a", json!({"x": "MQ=="}));
    fake.create(binding("b"));
    bound(&fake, "b", json!({"y": "Mg=="}));
    fake.add_kind("batch", "v1", "CronJob", "cronjobs", true);
    fake.create(deployment("one"));
    fake.create(deployment("two"));
    let _controller = run(&fake);
    fake.create(usage("ua", "a", "deployment", "one", Some("A_")));
    fake.create(usage("ub", "b", "deployment", "one", None));
    reason(&fake, "ua", "Injected").await;
    reason(&fake, "ub", "Injected").await;
    until("both injections", || {
        let t = template(&fake, "Deployment", "one");
        (t["spec"]["containers"][1]["envFrom"].as_array()?.len() == 2).then_some(())
    })
    .await;

    let usages = Api::<ServiceBindingUsage>::namespaced(fake.client(), "default");
    usages
        .patch(
            "ua",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"usedBy": {"name": "two"}}})),
        )
        .await
        .unwrap();
    until("ua in two", || {
        let t = template(&fake, "Deployment", "two");
        (t["spec"]["containers"][0]["envFrom"]
            == json!([{"secretRef": {"name": "a-secret"}, "prefix": "A_"}]))
        .then_some(())
    })
    .await;
    let one = template(&fake, "Deployment", "one");
    assert_eq!(
        one["spec"]["containers"][0]["envFrom"],
        json!([{"secretRef": {"name": "b-secret"}}])
    );
    let annotations = one["metadata"]["annotations"].as_object().unwrap();
    assert!(annotations.contains_key("usage.services.brokkr.dev/ub"));
    assert!(!annotations.contains_key("usage.services.brokkr.dev/ua"));

    // To a CronJob (another UsageKind, another mapping) and back: every trace goes each time.
    let nightly = json!({"apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": "default"},
        "spec": {"schedule": "0 1 * * *", "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "job", "image": "job:1"}]}}}}}});
    fake.create(nightly.clone());
    let move_to = |kind: &'static str, name: &'static str| {
        let usages = usages.clone();
        async move {
            usages
                .patch(
                    "ua",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"usedBy": {"kind": kind, "name": name}}})),
                )
                .await
                .unwrap();
        }
    };
    move_to("cronjob", "nightly").await;
    let job_template = |fake: &FakeCluster| {
        fake.get("batch/v1", "CronJob", NS, "nightly").unwrap()["spec"]["jobTemplate"]["spec"]
            ["template"]
            .clone()
    };
    until("ua in nightly", || {
        (job_template(&fake)["spec"]["containers"][0]["envFrom"][0]["prefix"] == "A_").then_some(())
    })
    .await;
    assert!(
        template(&fake, "Deployment", "two")["spec"]["containers"][0]
            .get("envFrom")
            .is_none()
    );
    let usage = fake.get(API, "ServiceBindingUsage", NS, "ua").unwrap();
    assert_eq!(
        usage["status"]["injected"]["podTemplatePath"],
        ".spec.jobTemplate.spec.template"
    );
    move_to("deployment", "two").await;
    until("ua back in two", || {
        template(&fake, "Deployment", "two")["spec"]["containers"][0]
            .get("envFrom")
            .map(|_| ())
    })
    .await;
    assert_eq!(
        job_template(&fake),
        nightly["spec"]["jobTemplate"]["spec"]["template"]
    );
    until("the status names two", || {
        let usage = fake.get(API, "ServiceBindingUsage", NS, "ua")?;
        (usage["status"]["injected"]["name"] == "two").then_some(usage)
    })
    .await;
    let usage = fake.get(API, "ServiceBindingUsage", NS, "ua").unwrap();
    assert!(
        usage["status"]["injected"].get("podTemplatePath").is_none(),
        "{usage:#}"
    );
}

#[tokio::test]
async fn usage_kinds_ship_once_and_a_custom_one_maps_a_kind_without_a_pod_template() {
    let fake = start().await;
    // An operator's own `deployment` UsageKind is kept as it is.
    fake.create(json!({"apiVersion": API, "kind": "UsageKind", "metadata": {"name": "deployment"},
        "spec": {"displayName": "Mine", "resource": {"group": "apps", "version": "v1", "kind": "Deployment"},
                 "labelsPath": "spec.template.metadata.labels"}}));
    fake.add_kind("example.com", "v1", "Pipeline", "pipelines", true);
    fake.create(binding("a"));
    bound(&fake, "a", json!({"x": "MQ=="}));
    fake.create(json!({"apiVersion": "example.com/v1", "kind": "Pipeline",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"steps": [{"image": "one"}, {"image": "two"}]}}));
    let _controller = run(&fake);
    fake.create(usage("u", "a", "pipeline", "p", None));
    reason(&fake, "u", "UsageKindNotFound").await;

    let mut names: Vec<String> = until("the shipped UsageKinds", || {
        let kinds = fake.list(API, "UsageKind");
        (kinds.len() == 6).then_some(kinds)
    })
    .await
    .iter()
    .map(|k| k["metadata"]["name"].as_str().unwrap().to_owned())
    .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "cronjob",
            "daemonset",
            "deployment",
            "function",
            "job",
            "statefulset"
        ]
    );
    let deployment = fake.get(API, "UsageKind", None, "deployment").unwrap();
    assert_eq!(deployment["spec"]["displayName"], "Mine");
    let cronjob = fake.get(API, "UsageKind", None, "cronjob").unwrap();
    assert_eq!(
        cronjob["spec"]["podTemplatePath"],
        ".spec.jobTemplate.spec.template"
    );

    fake.create(json!({"apiVersion": API, "kind": "UsageKind", "metadata": {"name": "pipeline"},
        "spec": {"displayName": "Pipeline", "resource": {"group": "example.com", "version": "v1", "kind": "Pipeline"},
                 "annotationsPath": ".metadata.annotations",
                 "containers": [{"path": ".spec.steps[*]"}]}}));
    reason(&fake, "u", "Injected").await;
    let pipeline = fake.get("example.com/v1", "Pipeline", NS, "p").unwrap();
    for step in pipeline["spec"]["steps"].as_array().unwrap() {
        assert_eq!(
            step["envFrom"],
            json!([{"secretRef": {"name": "a-secret"}}])
        );
    }
    assert!(pipeline["metadata"]["annotations"]["usage.services.brokkr.dev/u"].is_string());
}

#[tokio::test]
async fn an_injected_usage_is_quiet() {
    let fake = start().await;
    fake.create(binding("a"));
    bound(&fake, "a", json!({"x": "MQ=="}));
    fake.create(deployment("one"));
    let _controller = run(&fake);
    fake.create(usage("ua", "a", "deployment", "one", None));
    reason(&fake, "ua", "Injected").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = fake.requests().len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes: Vec<String> = fake.requests()[before..]
        .iter()
        .filter(|r| !r.starts_with("GET"))
        .cloned()
        .collect();
    assert!(writes.is_empty(), "{writes:#?}");
}
