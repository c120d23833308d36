//! Credentials into workloads on a real API server (`#[ignore]`d; run with
//! `BROKKR_E2E_KUBECONFIG=… cargo test -p brokkr --test projection_e2e -- --ignored`): the
//! seeds' ServiceBindingUsage flow on brokkr's shared-server catalog and the local PostgreSQL, and
//! the servicebinding.io conformance scenarios as assertions on pod templates: what a Pod would
//! get is read from the Deployment's template and from the ReplicaSet kube-controller-manager
//! makes of it (the workloads' images are not there to run; node_e2e runs real ones).

mod support;

use serde_json::{Value, json};
use support::cluster::*;
use support::*;

const SBD: &str = "servicebindings.services.brokkr.dev";
const USAGE: &str = "servicebindingusages.services.brokkr.dev";
const SBIO: &str = "servicebindings.servicebinding.io";

/// A Deployment `name` of two containers, labelled `labels`, as YAML for `apply`.
fn deployment(ns: &str, name: &str, labels: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {ns}, labels: {{{labels}}}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers:
      - {{name: app, image: registry.example/app:1, env: [{{name: LOG, value: debug}}]}}
      - name: proxy
        image: registry.example/proxy:1
        env: [{{name: SERVICE_BINDING_ROOT, value: /var/bindings}}]
"
    )
}

/// The pod template of the Deployment `name`.
fn template(ns: &str, name: &str) -> Value {
    get(ns, "deployment", name).expect("the Deployment")["spec"]["template"].clone()
}

/// The template of the newest ReplicaSet of the Deployment `name`, once its pod template
/// satisfies `ready`.
async fn replica_set_template(ns: &str, name: &str, ready: impl Fn(&Value) -> bool) -> Value {
    eventually(&format!("a ReplicaSet of {name} as wanted"), async || {
        let sets = serde_json::from_str::<Value>(&kubectl(
            &["-n", ns, "get", "replicasets", "-o", "json"],
            "",
        ))
        .ok()?;
        sets["items"]
            .as_array()?
            .iter()
            .filter(|rs| rs["metadata"]["ownerReferences"][0]["name"] == name)
            .max_by_key(|rs| {
                rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
                    .as_str()
                    .and_then(|r| r.parse::<u64>().ok())
            })
            .map(|rs| rs["spec"]["template"].clone())
            .filter(&ready)
    })
    .await
}

/// The condition `type_` of the servicebinding.io ServiceBinding `name` with status `status`.
async fn sbio_condition(ns: &str, name: &str, type_: &str, status: &str) -> Value {
    eventually(&format!("{name}: {type_}={status}"), async || {
        let binding = get(ns, SBIO, name)?;
        binding["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == type_ && c["status"] == status)
            .cloned()
    })
    .await
}

/// Whether the pod template's volumes include the servicebinding.io ServiceBinding `binding`'s.
fn projects(template: &Value, binding: &str) -> bool {
    template["spec"]["volumes"].as_array().is_some_and(|v| {
        v.iter()
            .any(|v| v["name"] == format!("servicebinding-{binding}"))
    })
}

/// The seeds' flow: the ServiceBindingUsage first, then the ServiceBinding, then the
/// ServiceInstance; the Deployment's template, and so its ReplicaSet, gets the prefixed envFrom;
/// deleting the usage gives the template back as it was; deleting the binding deletes its usage
/// and the injection. Then a servicebinding.io ServiceBinding reads the same brokkr binding as
/// its Provisioned Service, written as v1beta1.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_usage_written_first_injects_the_deployment_once_binding_and_instance_follow() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, broker_url) = serve_shared(dir.path());
    let scope = Scope::new(&broker_url).await;
    let ns = scope.namespace.as_str();
    apply(&deployment(ns, "shop", ""));
    let original = template(ns, "shop");
    let usage = format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceBindingUsage
metadata: {{name: shop-orders, namespace: {ns}}}
spec:
  serviceBindingRef: {{name: orders-app}}
  usedBy: {{kind: deployment, name: shop}}
  parameters: {{envPrefix: {{name: DB_}}}}
"
    );
    apply(&usage);
    condition(ns, USAGE, "shop-orders", "Ready", "ServiceBindingNotReady").await;
    apply(&format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceBinding
metadata: {{name: orders-app, namespace: {ns}}}
spec:
  instanceRef: {{name: orders}}
"
    ));
    condition(
        ns,
        SBD,
        "orders-app",
        "Ready",
        "ReferencesNonexistentInstance",
    )
    .await;
    apply(&format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: orders, namespace: {ns}}}
spec:
  {}
",
        scope.plan("postgresql", "small")
    ));
    condition(ns, USAGE, "shop-orders", "Ready", "Injected").await;

    let injected = template(ns, "shop");
    let want = json!([{"secretRef": {"name": "orders-app"}, "prefix": "DB_"}]);
    for container in injected["spec"]["containers"].as_array().unwrap() {
        assert_eq!(container["envFrom"], want, "{injected:#}");
    }
    assert_eq!(
        injected["spec"]["containers"][0]["env"],
        original["spec"]["containers"][0]["env"]
    );
    let rs = replica_set_template(ns, "shop", |t| {
        t["spec"]["containers"][0]["envFrom"] == want
    })
    .await;
    assert_eq!(rs["spec"]["containers"][1]["envFrom"], want);
    // What the pods would read: the Secret's entries log in to PostgreSQL.
    let secret = get(ns, "secret", "orders-app").expect("the binding's Secret");
    log_in(&secret)
        .await
        .expect("the injected credentials log in");

    // Deleting the usage gives the template back; the Secret stays.
    kubectl(&["-n", ns, "delete", USAGE, "shop-orders"], "");
    assert_eq!(template(ns, "shop")["spec"], original["spec"]);
    assert!(get(ns, "secret", "orders-app").is_some());
    replica_set_template(ns, "shop", |t| {
        t["spec"]["containers"][0].get("envFrom").is_none()
    })
    .await;

    // A servicebinding.io ServiceBinding, written as v1beta1, with brokkr's binding as its
    // Provisioned Service: the same Secret as files.
    apply(&deployment(ns, "reports", ""));
    apply(&format!(
        "apiVersion: servicebinding.io/v1beta1
kind: ServiceBinding
metadata: {{name: reports-db, namespace: {ns}}}
spec:
  service: {{apiVersion: services.brokkr.dev/v1alpha1, kind: ServiceBinding, name: orders-app}}
  workload: {{apiVersion: apps/v1, kind: Deployment, name: reports}}
"
    ));
    sbio_condition(ns, "reports-db", "Ready", "True").await;
    let v1 = get(ns, "servicebindings.v1.servicebinding.io", "reports-db").unwrap();
    assert_eq!(v1["apiVersion"], "servicebinding.io/v1");
    assert_eq!(v1["status"]["binding"]["name"], "orders-app");
    let reports = template(ns, "reports");
    assert_eq!(
        reports["spec"]["volumes"],
        json!([{"name": "servicebinding-reports-db",
                "projected": {"defaultMode": 420, "sources": [{"secret": {"name": "orders-app"}}]}}])
    );
    assert_eq!(
        reports["spec"]["containers"][0]["volumeMounts"][0]["mountPath"],
        "/bindings/reports-db"
    );
    assert_eq!(
        reports["spec"]["containers"][1]["volumeMounts"][0]["mountPath"],
        "/var/bindings/reports-db"
    );
    kubectl(&["-n", ns, "delete", SBIO, "reports-db"], "");
    assert!(!projects(&template(ns, "reports"), "reports-db"));

    // The usage again, then the binding goes: the usage goes with it, and so does the injection.
    apply(&usage);
    condition(ns, USAGE, "shop-orders", "Ready", "Injected").await;
    kubectl(&["-n", ns, "delete", SBD, "orders-app"], "");
    eventually("the usage to go with its binding", async || {
        get(ns, USAGE, "shop-orders").is_none().then_some(())
    })
    .await;
    assert_eq!(template(ns, "shop")["spec"], original["spec"]);
    kubectl(&["-n", ns, "delete", "serviceinstance", "orders"], "");
}

/// A Direct Secret Reference with `.spec.type`/`.spec.provider` overrides, `.spec.env` and a
/// container filter; a Provisioned Service that does not exist makes `ServiceAvailable` False.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_direct_secret_reference_with_overrides_env_and_a_container_filter() {
    let _controller = Controller::start();
    let namespace = Namespace::new();
    let ns = namespace.as_str();
    apply(&deployment(ns, "shop", ""));
    apply(&format!(
        "apiVersion: v1
kind: Secret
metadata: {{name: direct, namespace: {ns}}}
type: servicebinding.io/mysql
stringData: {{type: mysql, host: db.example.com}}
---
apiVersion: servicebinding.io/v1
kind: ServiceBinding
metadata: {{name: direct-binding, namespace: {ns}}}
spec:
  name: db
  type: postgresql
  provider: brokkr
  service: {{apiVersion: v1, kind: Secret, name: direct}}
  workload: {{apiVersion: apps/v1, kind: Deployment, name: shop, containers: [proxy]}}
  env: [{{name: DB_HOST, key: host}}, {{name: DB_TYPE, key: type}}]
"
    ));
    sbio_condition(ns, "direct-binding", "Ready", "True").await;
    let projected = sbio_condition(ns, "direct-binding", "WorkloadProjected", "True").await;
    assert_eq!(projected["reason"], "WorkloadProjected");
    let t = template(ns, "shop");
    assert!(t["spec"]["containers"][0].get("volumeMounts").is_none());
    let proxy = &t["spec"]["containers"][1];
    assert_eq!(proxy["volumeMounts"][0]["mountPath"], "/var/bindings/db");
    assert_eq!(
        proxy["env"][1],
        json!({"name": "DB_HOST", "valueFrom": {"secretKeyRef": {"name": "direct", "key": "host"}}})
    );
    // The overridden type comes from the template's annotations, as a file and as DB_TYPE.
    let annotation = "type.projection.services.brokkr.dev/servicebinding-direct-binding";
    assert_eq!(t["metadata"]["annotations"][annotation], "postgresql");
    assert_eq!(
        proxy["env"][2]["valueFrom"]["fieldRef"]["fieldPath"],
        format!("metadata.annotations['{annotation}']")
    );
    let sources = t["spec"]["volumes"][0]["projected"]["sources"]
        .as_array()
        .unwrap();
    let paths: Vec<&str> = sources
        .iter()
        .filter_map(|s| s["downwardAPI"]["items"][0]["path"].as_str())
        .collect();
    assert_eq!(paths, ["type", "provider"]);
    replica_set_template(ns, "shop", |rs| projects(rs, "direct-binding")).await;

    // A Provisioned Service that does not exist: not available, and nothing projected.
    apply(&format!(
        "apiVersion: servicebinding.io/v1
kind: ServiceBinding
metadata: {{name: missing, namespace: {ns}}}
spec:
  service: {{apiVersion: services.brokkr.dev/v1alpha1, kind: ServiceBinding, name: nothing-here}}
  workload: {{apiVersion: apps/v1, kind: Deployment, name: shop}}
"
    ));
    let unavailable = sbio_condition(ns, "missing", "ServiceAvailable", "False").await;
    assert_eq!(unavailable["reason"], "ServiceNotFound");
    let ready = sbio_condition(ns, "missing", "Ready", "False").await;
    assert_eq!(ready["reason"], "ServiceNotFound");
    assert!(!projects(&template(ns, "shop"), "missing"));
}

/// A label selector binds each match, a Deployment labelled later, and unbinds one relabelled
/// away, giving its template back as it was.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_label_selector_follows_late_and_relabelled_workloads() {
    let _controller = Controller::start();
    let namespace = Namespace::new();
    let ns = namespace.as_str();
    for (name, tier) in [("a", "web"), ("b", "web"), ("c", "batch")] {
        apply(&deployment(ns, name, &format!("tier: {tier}")));
    }
    let original = template(ns, "a");
    apply(&format!(
        "apiVersion: v1
kind: Secret
metadata: {{name: s, namespace: {ns}}}
stringData: {{type: redis, host: cache}}
---
apiVersion: servicebinding.io/v1
kind: ServiceBinding
metadata: {{name: web, namespace: {ns}}}
spec:
  service: {{apiVersion: v1, kind: Secret, name: s}}
  workload:
    apiVersion: apps/v1
    kind: Deployment
    selector: {{matchLabels: {{tier: web}}}}
"
    ));
    sbio_condition(ns, "web", "Ready", "True").await;
    eventually("a and b projected", async || {
        (projects(&template(ns, "a"), "web") && projects(&template(ns, "b"), "web")).then_some(())
    })
    .await;
    assert!(!projects(&template(ns, "c"), "web"));

    kubectl(
        &[
            "-n",
            ns,
            "label",
            "deployment",
            "c",
            "tier=web",
            "--overwrite",
        ],
        "",
    );
    kubectl(
        &[
            "-n",
            ns,
            "label",
            "deployment",
            "a",
            "tier=batch",
            "--overwrite",
        ],
        "",
    );
    apply(&deployment(ns, "d", "tier: web"));
    eventually("c and d in, a out", async || {
        (projects(&template(ns, "c"), "web")
            && projects(&template(ns, "d"), "web")
            && !projects(&template(ns, "a"), "web"))
        .then_some(())
    })
    .await;
    assert_eq!(template(ns, "a")["spec"], original["spec"]);
}

/// A kind of its own (a CRD) projected through its ClusterWorkloadResourceMapping: containers
/// at a jsonpath with a name field, filtered by name.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_custom_kind_is_projected_through_its_mapping() {
    let _controller = Controller::start();
    apply(
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: pipelines.e2e.brokkr.dev}
spec:
  group: e2e.brokkr.dev
  scope: Namespaced
  names: {plural: pipelines, singular: pipeline, kind: Pipeline}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: servicebinding.io/v1
kind: ClusterWorkloadResourceMapping
metadata: {name: pipelines.e2e.brokkr.dev}
spec:
  versions:
  - version: '*'
    annotations: .metadata.annotations
    containers: [{path: '.spec.steps[*]', name: .id}]
    volumes: .spec.volumes
",
    );
    kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/pipelines.e2e.brokkr.dev",
        ],
        "",
    );
    let namespace = Namespace::new();
    let ns = namespace.as_str();
    apply(&format!(
        "apiVersion: v1
kind: Secret
metadata: {{name: s, namespace: {ns}}}
stringData: {{type: redis, host: cache}}
---
apiVersion: e2e.brokkr.dev/v1
kind: Pipeline
metadata: {{name: p, namespace: {ns}}}
spec:
  steps: [{{id: fetch, image: f}}, {{id: store, image: s}}]
---
apiVersion: servicebinding.io/v1
kind: ServiceBinding
metadata: {{name: pb, namespace: {ns}}}
spec:
  service: {{apiVersion: v1, kind: Secret, name: s}}
  workload: {{apiVersion: e2e.brokkr.dev/v1, kind: Pipeline, name: p, containers: [store]}}
"
    ));
    sbio_condition(ns, "pb", "Ready", "True").await;
    let p = get(ns, "pipelines.e2e.brokkr.dev", "p").unwrap();
    assert_eq!(p["spec"]["volumes"][0]["name"], "servicebinding-pb");
    assert!(p["spec"]["steps"][0].get("volumeMounts").is_none());
    assert_eq!(
        p["spec"]["steps"][1]["volumeMounts"][0]["mountPath"],
        "/bindings/pb"
    );

    kubectl(&["-n", ns, "delete", SBIO, "pb"], "");
    let p = get(ns, "pipelines.e2e.brokkr.dev", "p").unwrap();
    assert_eq!(
        p["spec"],
        json!({"steps": [{"id": "fetch", "image": "f"}, {"id": "store", "image": "s"}]})
    );
}
