//! `brokkr controller` on a real API server (`#[ignore]`d; run with
//! `BROKKR_E2E_KUBECONFIG=… cargo test -p brokkr --test controller_e2e -- --ignored`): the CRDs
//! applied with kubectl, `brokkr serve` on the shared-server catalog and the local PostgreSQL, and
//! a user's resources applied with server-side apply, as a person would. The cluster needs only
//! kube-apiserver, etcd and kube-controller-manager (its garbage collector removes what the
//! tests' objects own).

mod support;

use std::process::{Command, Stdio};

use support::cluster::*;
use support::*;

/// The seeds' flow: the binding written first, then the instance; the binding's Secret logs in
/// to PostgreSQL; deleting the instance waits for the binding; deleting the binding deletes its
/// Secret and unbinds; then the instance is deprovisioned and goes.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn binding_before_instance_then_deletion_blocked_until_the_binding_goes() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, broker_url) = serve_shared(dir.path());
    let scope = Scope::cluster(&broker_url).await;
    let ns = scope.namespace.as_str();

    apply(&format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceBinding
metadata: {{name: orders-app, namespace: {ns}}}
spec:
  instanceRef: {{name: orders}}
  parameters: {{access: read-write}}
"
    ));
    condition(
        ns,
        "servicebindings.services.brokkr.dev",
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
  clusterServiceClassExternalName: postgresql
  clusterServicePlanExternalName: small
"
    ));
    condition(
        ns,
        "serviceinstance",
        "orders",
        "Ready",
        "ProvisionedSuccessfully",
    )
    .await;
    condition(
        ns,
        "servicebindings.services.brokkr.dev",
        "orders-app",
        "Ready",
        "InjectedBindResult",
    )
    .await;

    let binding = get(ns, "servicebindings.services.brokkr.dev", "orders-app").unwrap();
    assert_eq!(binding["status"]["binding"]["name"], "orders-app");
    let secret = get(ns, "secret", "orders-app").expect("the binding Secret");
    assert_eq!(secret["type"], "servicebinding.io/postgresql");
    assert_eq!(
        secret["metadata"]["ownerReferences"][0]["uid"],
        binding["metadata"]["uid"]
    );
    log_in(&secret)
        .await
        .expect("the binding's credentials log in");

    kubectl(
        &[
            "-n",
            ns,
            "delete",
            "serviceinstance",
            "orders",
            "--wait=false",
        ],
        "",
    );
    condition(
        ns,
        "serviceinstance",
        "orders",
        "Ready",
        "DeprovisionBlockedByExistingBindings",
    )
    .await;
    kubectl(
        &[
            "-n",
            ns,
            "delete",
            "servicebindings.services.brokkr.dev",
            "orders-app",
        ],
        "",
    );
    assert!(
        get(ns, "secret", "orders-app").is_none(),
        "the Secret went first"
    );
    assert!(log_in(&secret).await.is_err(), "unbound: the login is gone");
    eventually("the instance to be deprovisioned and go", async || {
        get(ns, "serviceinstance", "orders").is_none().then_some(())
    })
    .await;
}

/// An instance of the shared PostgreSQL plan `small` and a binding of it, both Ready.
async fn ready_instance_and_binding(scope: &Scope, annotations: &str) {
    let ns = scope.namespace.as_str();
    apply(&format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: orders, namespace: {ns}, annotations: {{{annotations}}}}}
spec:
  {plan}
---
apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceBinding
metadata: {{name: orders-app, namespace: {ns}}}
spec:
  instanceRef: {{name: orders}}
",
        plan = scope.plan("postgresql", "small")
    ));
    condition(
        ns,
        "servicebindings.services.brokkr.dev",
        "orders-app",
        "Ready",
        "InjectedBindResult",
    )
    .await;
}

/// With `services.brokkr.dev/cascade-delete: "true"`, deleting the instance deletes its bindings
/// (their Secrets go, their logins stop working) and then deprovisions it.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn cascade_delete_removes_the_bindings_then_deprovisions() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, broker_url) = serve_shared(dir.path());
    let scope = Scope::new(&broker_url).await;
    let ns = scope.namespace.as_str();
    ready_instance_and_binding(&scope, r#"services.brokkr.dev/cascade-delete: "true""#).await;
    let secret = get(ns, "secret", "orders-app").unwrap();

    kubectl(
        &[
            "-n",
            ns,
            "delete",
            "serviceinstance",
            "orders",
            "--wait=false",
        ],
        "",
    );
    eventually("the instance and its binding to go", async || {
        (get(ns, "serviceinstance", "orders").is_none()
            && get(ns, "servicebindings.services.brokkr.dev", "orders-app").is_none())
        .then_some(())
    })
    .await;
    assert!(get(ns, "secret", "orders-app").is_none());
    assert!(log_in(&secret).await.is_err(), "the binding was unbound");
}

/// With the broker gone for good, deletion waits and says so; `services.brokkr.dev/abandon:
/// "true"` releases the binding and then the instance without a broker call.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn abandon_releases_what_a_stopped_broker_cannot_delete() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, broker_url) = serve_shared(dir.path());
    let scope = Scope::new(&broker_url).await;
    let ns = scope.namespace.as_str();
    ready_instance_and_binding(&scope, "").await;
    drop(broker);

    kubectl(
        &[
            "-n",
            ns,
            "delete",
            "servicebindings.services.brokkr.dev",
            "orders-app",
            "--wait=false",
        ],
        "",
    );
    let failed = condition(
        ns,
        "servicebindings.services.brokkr.dev",
        "orders-app",
        "Ready",
        "UnbindCallFailed",
    )
    .await;
    assert!(
        failed["message"]
            .as_str()
            .unwrap()
            .contains("the broker could not be used"),
        "{failed:#}"
    );
    kubectl(
        &[
            "-n",
            ns,
            "annotate",
            "servicebindings.services.brokkr.dev",
            "orders-app",
            "services.brokkr.dev/abandon=true",
        ],
        "",
    );
    eventually("the abandoned binding to go", async || {
        get(ns, "servicebindings.services.brokkr.dev", "orders-app")
            .is_none()
            .then_some(())
    })
    .await;
    kubectl(
        &[
            "-n",
            ns,
            "delete",
            "serviceinstance",
            "orders",
            "--wait=false",
        ],
        "",
    );
    kubectl(
        &[
            "-n",
            ns,
            "annotate",
            "serviceinstance",
            "orders",
            "services.brokkr.dev/abandon=true",
        ],
        "",
    );
    eventually("the abandoned instance to go", async || {
        get(ns, "serviceinstance", "orders").is_none().then_some(())
    })
    .await;
}

/// A plan change and a change to the Secret named in `parametersFrom` each update the instance
/// at the broker, whose fetch shows the new plan and parameters; Secret values stay out of the
/// status.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_plan_change_and_a_parameters_secret_change_update_the_instance() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, broker_url) = serve_shared(dir.path());
    let scope = Scope::new(&broker_url).await;
    let ns = scope.namespace.as_str();
    let instance = |plan: &str| {
        format!(
            "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: orders, namespace: {ns}}}
spec:
  {fields}
  parametersFrom: [{{secretKeyRef: {{name: db-params, key: p}}}}]
",
            fields = scope.plan("postgresql", plan)
        )
    };
    let params = |extensions: &str| {
        format!(
            "apiVersion: v1
kind: Secret
metadata: {{name: db-params, namespace: {ns}}}
stringData: {{p: '{{\"extensions\": {extensions}}}'}}
"
        )
    };
    apply(&params(r#"["citext"]"#));
    apply(&instance("small"));
    condition(
        ns,
        "serviceinstance",
        "orders",
        "Ready",
        "ProvisionedSuccessfully",
    )
    .await;
    let uid = get(ns, "serviceinstance", "orders").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let osb = brokkr_osb::client::Client::builder(&broker_url)
        .basic_auth("platform", "s3cret")
        .build()
        .unwrap();
    let catalog = osb.catalog().await.unwrap().body;
    let plan_id = |name: &str| {
        let service = catalog
            .services
            .iter()
            .find(|s| s.name == "postgresql")
            .unwrap();
        service
            .plans
            .iter()
            .find(|p| p.name == name)
            .unwrap()
            .id
            .clone()
    };
    let fetched = osb.instance(&uid, None).await.unwrap().body;
    assert_eq!(fetched.plan_id, plan_id("small"));

    apply(&instance("standard"));
    eventually("the broker to have the standard plan", async || {
        let fetched = osb.instance(&uid, None).await.ok()?.body;
        (fetched.plan_id == plan_id("standard")).then_some(())
    })
    .await;
    let before = get(ns, "serviceinstance", "orders").unwrap()["status"]["externalProperties"]
        ["parameterChecksum"]
        .clone();

    apply(&params(r#"["citext", "hstore"]"#));
    eventually("the broker to have the new parameters", async || {
        let fetched = osb.instance(&uid, None).await.ok()?.body;
        let extensions = fetched.parameters?.get("extensions")?.clone();
        (extensions == serde_json::json!(["citext", "hstore"])).then_some(())
    })
    .await;
    let status = eventually("the new checksum in status", async || {
        let status = get(ns, "serviceinstance", "orders")?["status"].clone();
        (status["externalProperties"]["parameterChecksum"] != before
            && status["lastConditionState"] == "Ready")
            .then_some(status)
    })
    .await;
    assert_eq!(
        status["externalProperties"]["parameters"]["extensions"], "<redacted>",
        "{status:#}"
    );
    kubectl(&["-n", ns, "delete", "serviceinstance", "orders"], "");
}

/// The controllers drive a broker that is not brokkr: the openbrokerapi broker of bench/baselines,
/// whose every operation is asynchronous, serving brokkr's quickstart catalog. Its bind is
/// polled, its credentials fetched and written to the Secret.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn drives_a_broker_that_is_not_brokkr() {
    let venv = python_venv().expect("python3 with venv for the openbrokerapi broker");
    let dir = tempfile::tempdir().unwrap();
    let catalog = Command::new(BIN)
        .args(["catalog", "-o", "json"])
        .env_remove("BROKKR_CONFIG")
        .output()
        .unwrap();
    assert!(catalog.status.success());
    let catalog_path = dir.path().join("catalog.json");
    std::fs::write(&catalog_path, &catalog.stdout).unwrap();
    let port = free_port();
    let _python = Process(
        Command::new(venv.join("bin/gunicorn"))
            .arg("--chdir")
            .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/baselines"))
            .args(["-k", "gthread", "--workers", "1", "--threads", "4"])
            .args([
                "-b",
                &format!("127.0.0.1:{port}"),
                "openbrokerapi_broker:app",
            ])
            .env("BENCH_CATALOG", &catalog_path)
            .env("BENCH_DELAY_MS", "300")
            .env("BROKKR_BROKER_USERNAME", "platform")
            .env("BROKKR_BROKER_PASSWORD", "s3cret")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start gunicorn"),
    );
    let broker_url = format!("http://127.0.0.1:{port}");
    let osb = brokkr_osb::client::Client::builder(&broker_url)
        .basic_auth("platform", "s3cret")
        .build()
        .unwrap();
    eventually("the Python broker to serve", async || {
        osb.catalog().await.ok().map(|_| ())
    })
    .await;
    let scope = Scope::new(&broker_url).await;
    let ns = scope.namespace.as_str();

    apply(&format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: legacy-db, namespace: {ns}}}
spec:
  {plan}
  parameters: {{credentials: {{type: mysql, host: db.example.com, port: 3306, password: pw-1}}}}
---
apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceBinding
metadata: {{name: legacy-app, namespace: {ns}}}
spec:
  instanceRef: {{name: legacy-db}}
",
        plan = scope.plan("user-provided", "async")
    ));
    condition(
        ns,
        "servicebindings.services.brokkr.dev",
        "legacy-app",
        "Ready",
        "InjectedBindResult",
    )
    .await;
    let secret = get(ns, "secret", "legacy-app").unwrap();
    assert_eq!(secret["type"], "servicebinding.io/mysql");
    assert_eq!(entry(&secret, "host"), "db.example.com");
    assert_eq!(entry(&secret, "port"), "3306");
    assert_eq!(entry(&secret, "password"), "pw-1");
    kubectl(
        &[
            "-n",
            ns,
            "delete",
            "servicebindings.services.brokkr.dev",
            "legacy-app",
        ],
        "",
    );
    kubectl(&["-n", ns, "delete", "serviceinstance", "legacy-db"], "");
}
