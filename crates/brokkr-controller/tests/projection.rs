//! The servicebinding.io ServiceBinding controller against the fake API server, the
//! conformance scenarios as assertions on the pod template: a Provisioned Service (brokkr's
//! ServiceBinding), a Direct Secret Reference with type/provider overrides, env and a container
//! filter, a change of workload kind, a label selector with a late and a relabelled workload, a custom kind through a
//! ClusterWorkloadResourceMapping, a missing service, and unprojection on delete.

use std::sync::Arc;
use std::time::Duration;

use brokkr_controller::resources::{self, servicebinding_io};
use brokkr_fake_kube::FakeCluster;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

const SB: &str = "servicebinding.io/v1";
const NS: Option<&str> = Some("default");

async fn start() -> FakeCluster {
    let fake = FakeCluster::start().await;
    for crd in resources::crds() {
        fake.add_crd(&crd);
    }
    let ctx = brokkr_controller::Context::new(fake.client());
    tokio::spawn(brokkr_controller::servicebinding_io::run(
        Arc::new(ctx),
        futures::future::pending(),
    ));
    fake
}

/// Polls `probe` for up to 25 s (a binding looks again every 10 s).
async fn until<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    for _ in 0..500 {
        if let Some(found) = probe() {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

fn condition(fake: &FakeCluster, binding: &str, type_: &str) -> Option<(String, String)> {
    let binding = fake.get(SB, "ServiceBinding", NS, binding)?;
    let c = binding["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?
        .clone();
    Some((c["status"].as_str()?.into(), c["reason"].as_str()?.into()))
}

async fn ready(fake: &FakeCluster, binding: &str) -> Value {
    until(&format!("{binding} Ready"), || {
        condition(fake, binding, "Ready")
            .filter(|(s, _)| s == "True")
            .and_then(|_| fake.get(SB, "ServiceBinding", NS, binding))
    })
    .await
}

fn deployment(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": name, "namespace": "default", "labels": labels},
    "spec": {"selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
            "spec": {"containers": [
                {"name": "app", "image": "app:1"},
                {"name": "proxy", "image": "proxy:1",
                 "env": [{"name": "SERVICE_BINDING_ROOT", "value": "/var/bindings"}]}
            ]}}}})
}

fn secret(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "default"},
        "type": "servicebinding.io/mysql",
        "stringData": {"type": "mysql", "host": "db"}})
}

fn template(fake: &FakeCluster, name: &str) -> Value {
    fake.get("apps/v1", "Deployment", NS, name).unwrap()["spec"]["template"].clone()
}

#[tokio::test]
async fn a_provisioned_service_is_projected_by_name_and_unprojected_on_delete() {
    let fake = start().await;
    let original = deployment("shop", json!({}));
    fake.create(original.clone());
    fake.create(json!({"apiVersion": SB, "kind": "ServiceBinding",
        "metadata": {"name": "account-db", "namespace": "default"},
        "spec": {"service": {"apiVersion": "services.brokkr.dev/v1alpha1", "kind": "ServiceBinding", "name": "db"},
                 "workload": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "shop"}}}));
    until("ServiceAvailable False", || {
        condition(&fake, "account-db", "ServiceAvailable").filter(|(s, _)| s == "False")
    })
    .await;
    assert_eq!(
        condition(&fake, "account-db", "Ready"),
        Some(("False".into(), "ServiceNotFound".into()))
    );

    // brokkr's own ServiceBinding is a Provisioned Service.
    fake.create(json!({"apiVersion": "services.brokkr.dev/v1alpha1", "kind": "ServiceBinding",
        "metadata": {"name": "db", "namespace": "default"}, "spec": {"instanceRef": {"name": "mysql"}}}));
    fake.create(secret("db-credentials"));
    fake.set_status(
        "services.brokkr.dev/v1alpha1",
        "ServiceBinding",
        NS,
        "db",
        json!({"binding": {"name": "db-credentials"}}),
    );
    let binding = ready(&fake, "account-db").await;
    assert_eq!(binding["status"]["binding"]["name"], "db-credentials");
    assert_eq!(binding["status"]["observedGeneration"], 1);
    for type_ in ["ServiceAvailable", "WorkloadProjected"] {
        assert_eq!(condition(&fake, "account-db", type_).unwrap().0, "True");
    }

    let t = template(&fake, "shop");
    assert_eq!(
        t["spec"]["volumes"],
        json!([{"name": "servicebinding-account-db", "projected": {"sources": [{"secret": {"name": "db-credentials"}}]}}])
    );
    assert_eq!(
        t["spec"]["containers"][0]["volumeMounts"],
        json!([{"name": "servicebinding-account-db", "mountPath": "/bindings/account-db", "readOnly": true}])
    );
    assert_eq!(
        t["spec"]["containers"][0]["env"],
        json!([{"name": "SERVICE_BINDING_ROOT", "value": "/bindings"}])
    );
    // Set already: kept, and the mount follows it.
    assert_eq!(
        t["spec"]["containers"][1]["env"],
        json!([{"name": "SERVICE_BINDING_ROOT", "value": "/var/bindings"}])
    );
    assert_eq!(
        t["spec"]["containers"][1]["volumeMounts"][0]["mountPath"],
        "/var/bindings/account-db"
    );

    Api::<servicebinding_io::ServiceBinding>::namespaced(fake.client(), "default")
        .delete("account-db", &DeleteParams::default())
        .await
        .unwrap();
    until("the binding is gone", || {
        fake.get(SB, "ServiceBinding", NS, "account-db")
            .is_none()
            .then_some(())
    })
    .await;
    let shop = fake.get("apps/v1", "Deployment", NS, "shop").unwrap();
    assert_eq!(shop["spec"], original["spec"]);
    assert!(shop["metadata"].get("annotations").is_none(), "{shop:#}");
}

#[tokio::test]
async fn a_direct_secret_reference_with_overrides_env_and_a_container_filter() {
    let fake = start().await;
    fake.create(secret("direct"));
    fake.create(deployment("shop", json!({})));
    fake.create(json!({"apiVersion": SB, "kind": "ServiceBinding",
        "metadata": {"name": "direct-binding", "namespace": "default"},
        "spec": {"name": "db", "type": "postgresql", "provider": "brokkr",
                 "service": {"apiVersion": "v1", "kind": "Secret", "name": "direct"},
                 "workload": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "shop",
                              "containers": ["proxy"]},
                 "env": [{"name": "DB_HOST", "key": "host"}, {"name": "DB_TYPE", "key": "type"}]}}));
    ready(&fake, "direct-binding").await;
    let t = template(&fake, "shop");
    assert!(t["spec"]["containers"][0].get("volumeMounts").is_none());
    let proxy = &t["spec"]["containers"][1];
    assert_eq!(proxy["volumeMounts"][0]["mountPath"], "/var/bindings/db");
    assert_eq!(
        proxy["env"][1],
        json!({"name": "DB_HOST", "valueFrom": {"secretKeyRef": {"name": "direct", "key": "host"}}})
    );
    assert_eq!(
        proxy["env"][2]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.annotations['type.projection.services.brokkr.dev/servicebinding-direct-binding']"
    );
    let annotations = &t["metadata"]["annotations"];
    assert_eq!(
        annotations["type.projection.services.brokkr.dev/servicebinding-direct-binding"],
        "postgresql"
    );
    assert_eq!(
        annotations["provider.projection.services.brokkr.dev/servicebinding-direct-binding"],
        "brokkr"
    );
    let sources = t["spec"]["volumes"][0]["projected"]["sources"]
        .as_array()
        .unwrap();
    assert_eq!(sources.len(), 3);
    assert_eq!(sources[1]["downwardAPI"]["items"][0]["path"], "type");

    // Another kind of workload: the Deployment is given back as it was.
    let mut db = deployment("db", json!({}));
    db["kind"] = "StatefulSet".into();
    fake.create(db);
    let bindings = Api::<servicebinding_io::ServiceBinding>::namespaced(fake.client(), "default");
    bindings
        .patch(
            "direct-binding",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"workload": {"kind": "StatefulSet", "name": "db"}}})),
        )
        .await
        .unwrap();
    until("the StatefulSet projected", || {
        let db = fake.get("apps/v1", "StatefulSet", NS, "db")?;
        db["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .map(|_| ())
    })
    .await;
    let shop = fake.get("apps/v1", "Deployment", NS, "shop").unwrap();
    assert_eq!(shop["spec"], deployment("shop", json!({}))["spec"]);

    // A name and a selector: refused.
    bindings
        .patch(
            "direct-binding",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"workload": {"selector": {"matchLabels": {"a": "b"}}}}})),
        )
        .await
        .unwrap();
    until("InvalidWorkloadReference", || {
        condition(&fake, "direct-binding", "Ready").filter(|(_, r)| r == "InvalidWorkloadReference")
    })
    .await;
}

#[tokio::test]
async fn a_label_selector_binds_each_match_a_late_one_and_unbinds_a_relabelled_one() {
    let fake = start().await;
    fake.create(secret("s"));
    fake.create(deployment("a", json!({"tier": "web"})));
    fake.create(deployment("b", json!({"tier": "web"})));
    fake.create(deployment("c", json!({"tier": "batch"})));
    fake.create(json!({"apiVersion": SB, "kind": "ServiceBinding",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"service": {"apiVersion": "v1", "kind": "Secret", "name": "s"},
                 "workload": {"apiVersion": "apps/v1", "kind": "Deployment",
                              "selector": {"matchLabels": {"tier": "web"}}}}}));
    ready(&fake, "web").await;
    let projected = |fake: &FakeCluster, name: &str| {
        template(fake, name)["spec"]["volumes"]
            .as_array()
            .is_some_and(|v| v.iter().any(|v| v["name"] == "servicebinding-web"))
    };
    until("a and b", || {
        (projected(&fake, "a") && projected(&fake, "b")).then_some(())
    })
    .await;
    assert!(!projected(&fake, "c"));

    let deployments = Api::<kube::api::DynamicObject>::namespaced_with(
        fake.client(),
        "default",
        &kube::api::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            "apps",
            "v1",
            "Deployment",
        )),
    );
    for (name, tier) in [("c", "web"), ("a", "batch")] {
        deployments
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"tier": tier}}})),
            )
            .await
            .unwrap();
    }
    until("c in, a out", || {
        (projected(&fake, "c") && !projected(&fake, "a")).then_some(())
    })
    .await;
    let a = fake.get("apps/v1", "Deployment", NS, "a").unwrap();
    assert_eq!(a["spec"], deployment("a", json!({}))["spec"]);
}

#[tokio::test]
async fn a_custom_kind_is_projected_through_its_cluster_workload_resource_mapping() {
    let fake = start().await;
    fake.add_kind("example.com", "v1", "Pipeline", "pipelines", true);
    fake.create(
        json!({"apiVersion": SB, "kind": "ClusterWorkloadResourceMapping",
        "metadata": {"name": "pipelines.example.com"},
        "spec": {"versions": [{"version": "*",
            "annotations": ".metadata.annotations",
            "containers": [{"path": ".spec.steps[*]", "name": ".id"}],
            "volumes": ".spec.volumes"}]}}),
    );
    fake.create(secret("s"));
    fake.create(json!({"apiVersion": "example.com/v1", "kind": "Pipeline",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"steps": [{"id": "fetch", "image": "f"}, {"id": "store", "image": "s"}]}}));
    fake.create(json!({"apiVersion": SB, "kind": "ServiceBinding",
        "metadata": {"name": "pb", "namespace": "default"},
        "spec": {"service": {"apiVersion": "v1", "kind": "Secret", "name": "s"},
                 "workload": {"apiVersion": "example.com/v1", "kind": "Pipeline", "name": "p",
                              "containers": ["store"]}}}));
    ready(&fake, "pb").await;
    let p = fake.get("example.com/v1", "Pipeline", NS, "p").unwrap();
    assert_eq!(p["spec"]["volumes"][0]["name"], "servicebinding-pb");
    assert!(p["spec"]["steps"][0].get("volumeMounts").is_none());
    assert_eq!(
        p["spec"]["steps"][1]["volumeMounts"][0]["mountPath"],
        "/bindings/pb"
    );
    let recorded =
        p["metadata"]["annotations"]["mapping.projection.services.brokkr.dev/servicebinding-pb"]
            .as_str()
            .unwrap();
    assert!(recorded.contains(".spec.steps[*]"), "{recorded}");
}

#[tokio::test]
async fn a_ready_binding_is_quiet() {
    let fake = start().await;
    fake.create(secret("s"));
    fake.create(deployment("shop", json!({})));
    fake.create(json!({"apiVersion": SB, "kind": "ServiceBinding",
        "metadata": {"name": "quiet", "namespace": "default"},
        "spec": {"service": {"apiVersion": "v1", "kind": "Secret", "name": "s"},
                 "workload": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "shop"}}}));
    ready(&fake, "quiet").await;
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

#[tokio::test]
async fn one_workload_that_cannot_be_edited_does_not_keep_the_others_unbound() {
    let fake = start().await;
    fake.create(secret("s"));
    fake.create(deployment("good", json!({"tier": "web"})));
    let mut bad = deployment("bad", json!({"tier": "web"}));
    bad["spec"]["template"]["spec"]["volumes"] = json!("not a list");
    fake.create(bad);
    fake.create(json!({"apiVersion": SB, "kind": "ServiceBinding",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"service": {"apiVersion": "v1", "kind": "Secret", "name": "s"},
                 "workload": {"apiVersion": "apps/v1", "kind": "Deployment",
                              "selector": {"matchLabels": {"tier": "web"}}}}}));
    until("WorkloadProjectionFailed", || {
        condition(&fake, "web", "Ready")
            .filter(|(s, r)| s == "False" && r == "WorkloadProjectionFailed")
    })
    .await;
    let binding = fake.get(SB, "ServiceBinding", NS, "web").unwrap();
    let message = binding["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "WorkloadProjected")
        .unwrap()["message"]
        .clone();
    assert!(message.as_str().unwrap().starts_with("bad: "), "{message}");
    assert_eq!(
        template(&fake, "good")["spec"]["volumes"][0]["name"],
        "servicebinding-web"
    );
}
