//! Credential rotation on a real API server (`#[ignore]`d; run with
//! `BROKKR_E2E_KUBECONFIG=… cargo test -p brokkr --test rotation_e2e -- --ignored`), with
//! brokkr's shared-server catalog on the local PostgreSQL: a ServiceBinding rotated by its
//! annotation moves a Deployment (through a ServiceBindingUsage) and a servicebinding.io
//! projection to the new Secret and their ReplicaSets roll; the Secret the workloads follow logs
//! in at every moment; the old credentials log in during the grace period and are refused after
//! it. A plan whose bindings expire rotates them by itself.

mod support;

use std::process::Stdio;

use serde_json::Value;
use support::cluster::*;
use support::*;

const SBD: &str = "servicebindings.services.brokkr.dev";
const USAGE: &str = "servicebindingusages.services.brokkr.dev";
const SBIO: &str = "servicebindings.servicebinding.io";

/// A Deployment `name` of one container, as YAML for `apply`.
fn deployment(ns: &str, name: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {ns}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers:
      - {{name: app, image: registry.example/app:1}}
"
    )
}

/// The templates of the ReplicaSets of the Deployment `name`, newest revision last.
fn replica_set_templates(ns: &str, name: &str) -> Vec<Value> {
    let sets: Value = serde_json::from_str(&kubectl(
        &["-n", ns, "get", "replicasets", "-o", "json"],
        "",
    ))
    .unwrap();
    let mut sets: Vec<(u64, Value)> = sets["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|rs| rs["metadata"]["ownerReferences"][0]["name"] == name)
        .map(|rs| {
            let revision = rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
                .as_str()
                .and_then(|r| r.parse().ok())
                .unwrap_or_default();
            (revision, rs["spec"]["template"].clone())
        })
        .collect();
    sets.sort_by_key(|(revision, _)| *revision);
    sets.into_iter().map(|(_, t)| t).collect()
}

/// The Secrets a pod template reads, by name.
fn secrets_of(template: &Value) -> Vec<String> {
    let mut names = Vec::new();
    for container in template["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for from in container["envFrom"].as_array().into_iter().flatten() {
            names.extend(from["secretRef"]["name"].as_str().map(str::to_owned));
        }
    }
    for volume in template["spec"]["volumes"].as_array().into_iter().flatten() {
        for source in volume["projected"]["sources"]
            .as_array()
            .into_iter()
            .flatten()
        {
            names.extend(source["secret"]["name"].as_str().map(str::to_owned));
        }
    }
    names
}

fn binding(ns: &str, name: &str) -> Value {
    get(ns, SBD, name).expect("the ServiceBinding")
}

/// The Secret the binding names now, which must log in.
async fn current_logs_in(ns: &str, name: &str) -> String {
    let secret_name = binding(ns, name)["status"]["binding"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let secret = get(ns, "secret", &secret_name).expect("the Secret status.binding names");
    log_in(&secret)
        .await
        .unwrap_or_else(|e| panic!("the Secret {secret_name} does not log in: {e}"));
    secret_name
}

fn instance_and_binding(scope: &Scope, grace_seconds: u64) -> String {
    let ns = scope.namespace.as_str();
    format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceInstance
metadata: {{name: orders, namespace: {ns}}}
spec:
  {}
---
apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceBinding
metadata: {{name: orders-app, namespace: {ns}}}
spec:
  instanceRef: {{name: orders}}
  rotationGracePeriodSeconds: {grace_seconds}
",
        scope.plan("postgresql", "small")
    )
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_rotation_moves_the_workloads_to_new_credentials_and_retires_the_old_after_the_grace_period()
 {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, broker_url) = serve_shared(dir.path());
    let scope = Scope::new(&broker_url).await;
    let ns = scope.namespace.as_str();
    apply(&deployment(ns, "shop"));
    apply(&deployment(ns, "reports"));
    apply(&instance_and_binding(&scope, 25));
    apply(&format!(
        "apiVersion: services.brokkr.dev/v1alpha1
kind: ServiceBindingUsage
metadata: {{name: shop-orders, namespace: {ns}}}
spec:
  serviceBindingRef: {{name: orders-app}}
  usedBy: {{kind: deployment, name: shop}}
---
apiVersion: servicebinding.io/v1
kind: ServiceBinding
metadata: {{name: reports-db, namespace: {ns}}}
spec:
  service: {{apiVersion: services.brokkr.dev/v1alpha1, kind: ServiceBinding, name: orders-app}}
  workload: {{apiVersion: apps/v1, kind: Deployment, name: reports}}
"
    ));
    condition(ns, USAGE, "shop-orders", "Ready", "Injected").await;
    eventually("reports projected", async || {
        let t = get(ns, "deployment", "reports")?["spec"]["template"].clone();
        (secrets_of(&t) == ["orders-app"]).then_some(())
    })
    .await;
    let old = get(ns, "secret", "orders-app").expect("the first Secret");
    log_in(&old).await.expect("the first credentials log in");
    let first_id = binding(ns, "orders-app")["status"]["externalID"]
        .as_str()
        .unwrap()
        .to_owned();

    kubectl(
        &[
            "-n",
            ns,
            "annotate",
            SBD,
            "orders-app",
            "services.brokkr.dev/rotate=2026-11-27T18:00:00Z",
            "--overwrite",
        ],
        "",
    );
    // At every moment the Secret the binding names logs in, until the new one is named.
    let new_secret = eventually("status.binding moved", async || {
        let name = current_logs_in(ns, "orders-app").await;
        (name != "orders-app").then_some(name)
    })
    .await;
    let fresh = get(ns, "secret", &new_secret).expect("the new Secret");
    assert_eq!(fresh["immutable"], true);
    assert_eq!(fresh["type"], "servicebinding.io/postgresql");
    assert_ne!(entry(&fresh, "username"), entry(&old, "username"));
    log_in(&fresh)
        .await
        .expect("the new credentials log in at once");
    log_in(&old)
        .await
        .expect("the old credentials log in during the grace period");
    let status = binding(ns, "orders-app")["status"].clone();
    assert_eq!(status["previousBinding"]["externalID"], first_id);
    assert_eq!(status["previousBinding"]["secretName"], "orders-app");
    assert!(status["lastRotationTime"].is_string());

    // The workloads follow: the templates name the new Secret, and new ReplicaSets roll out.
    for workload in ["shop", "reports"] {
        eventually(
            &format!("{workload}'s template on the new Secret"),
            async || {
                let t = get(ns, "deployment", workload)?["spec"]["template"].clone();
                (secrets_of(&t) == [new_secret.as_str()]).then_some(())
            },
        )
        .await;
        let sets = eventually(&format!("{workload} rolled"), async || {
            let sets = replica_set_templates(ns, workload);
            sets.last()
                .is_some_and(|t| secrets_of(t) == [new_secret.as_str()])
                .then_some(sets)
        })
        .await;
        assert!(
            sets.iter().any(|t| secrets_of(t) == ["orders-app"]),
            "{workload}: the ReplicaSet of the old Secret came first"
        );
    }

    // The grace period ends: the predecessor is unbound, its Secret deleted, its login refused.
    eventually("the predecessor unbound", async || {
        current_logs_in(ns, "orders-app").await;
        binding(ns, "orders-app")["status"]
            .get("previousBinding")
            .is_none()
            .then_some(())
    })
    .await;
    assert!(get(ns, "secret", "orders-app").is_none());
    assert!(
        log_in(&old).await.is_err(),
        "the old credentials are refused after the grace period"
    );
    log_in(&fresh)
        .await
        .expect("the new credentials still log in");
    let done = binding(ns, "orders-app");
    let rotating = done["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Rotating")
        .cloned()
        .unwrap();
    assert_eq!(rotating["reason"], "Rotated", "{rotating}");

    kubectl(&["-n", ns, "delete", SBIO, "reports-db"], "");
    kubectl(&["-n", ns, "delete", SBD, "orders-app"], "");
    assert!(
        log_in(&fresh).await.is_err(),
        "deleting the binding revokes the credentials"
    );
    kubectl(&["-n", ns, "delete", "serviceinstance", "orders"], "");
}

/// `brokkr serve` on the shared-server catalog whose PostgreSQL bindings live `lifetime` and are
/// renewed `renew_before` ahead.
fn serve_expiring(dir: &std::path::Path, lifetime: &str, renew_before: &str) -> (Process, String) {
    let shared =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../catalogs/shared/shared.yaml");
    let text = std::fs::read_to_string(shared).unwrap();
    let from = "    binding: &pg-binding\n      rotation: {}\n";
    assert!(
        text.contains(from),
        "the shared catalog's PostgreSQL binding"
    );
    let to = format!(
        "    binding: &pg-binding\n      rotation: {{lifetime: {lifetime}, renew_before: {renew_before}}}\n"
    );
    let config = dir.join("expiring.yaml");
    std::fs::write(&config, text.replace(from, &to)).unwrap();
    serve_logged(
        dir,
        &["--config", config.to_str().unwrap()],
        &shared_servers_env(),
        Stdio::null(),
    )
}

#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn an_expiring_binding_rotates_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    // Renewal is due 10 s after each bind.
    let (_broker, broker_url) = serve_expiring(dir.path(), "40s", "30s");
    let scope = Scope::new(&broker_url).await;
    let ns = scope.namespace.as_str();
    apply(&instance_and_binding(&scope, 3));
    let first = eventually("bound", async || {
        let b = get(ns, SBD, "orders-app")?;
        b["status"]["nextRotationTime"].is_string().then_some(b)
    })
    .await;
    assert!(first["status"]["expiresAt"].is_string());
    let first_id = first["status"]["currentBinding"]["externalID"].clone();
    let old = get(ns, "secret", "orders-app").expect("the first Secret");
    log_in(&old).await.expect("the first credentials log in");

    let rotated = eventually("rotated by itself", async || {
        current_logs_in(ns, "orders-app").await;
        let b = binding(ns, "orders-app");
        (b["status"]["currentBinding"]["externalID"] != first_id).then_some(b)
    })
    .await;
    let status = &rotated["status"];
    assert!(status["lastRotationTime"].is_string());
    assert_ne!(
        status["nextRotationTime"],
        first["status"]["nextRotationTime"]
    );
    assert_eq!(status["previousBinding"]["externalID"], first_id);
    eventually("the predecessor unbound", async || {
        current_logs_in(ns, "orders-app").await;
        let b = binding(ns, "orders-app");
        (b["status"]["previousBinding"]["externalID"] != first_id).then_some(())
    })
    .await;
    assert!(
        log_in(&old).await.is_err(),
        "the expired binding's credentials are refused once it is unbound"
    );
    let events = kubectl(
        &[
            "-n",
            ns,
            "get",
            "events.events.k8s.io",
            "--field-selector",
            "regarding.name=orders-app",
            "-o",
            "json",
        ],
        "",
    );
    let events: Value = serde_json::from_str(&events).unwrap();
    let reasons: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    for reason in ["RotationStarted", "Rotated", "PredecessorUnbound"] {
        assert!(reasons.contains(&reason), "{reason} in {reasons:?}");
    }
    kubectl(&["-n", ns, "delete", SBD, "orders-app"], "");
    kubectl(&["-n", ns, "delete", "serviceinstance", "orders"], "");
}

/// A broker that asks for renewal a second after every bind (`renew_before` 30 s of a 31 s
/// lifetime), with a grace period of 0: the tenant's binding rotates once, then waits for the
/// controller's floor between rotations (`--min-rotation-interval`, 1 minute), and the tenant
/// reads why in a Warning Event and the `Rotating` condition — not a rotation per reconcile.
#[tokio::test]
#[ignore = "needs a Kubernetes API server: BROKKR_E2E_KUBECONFIG"]
async fn a_broker_that_always_asks_for_renewal_gets_one_rotation_a_minute() {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, broker_url) = serve_expiring(dir.path(), "31s", "30s");
    let scope = Scope::new(&broker_url).await;
    let ns = scope.namespace.as_str();
    let tenant = Tenant::edit(ns).await;
    tenant.apply(&instance_and_binding(&scope, 0));
    let deferred = eventually("the second rotation deferred", async || {
        let b = get(ns, SBD, "orders-app")?;
        let rotating = b["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Rotating" && c["reason"] == "RotationDeferred")?
            .clone();
        Some((b, rotating))
    })
    .await;
    let (bound, rotating) = deferred;
    let last = bound["status"]["lastRotationTime"].clone();
    assert!(last.is_string(), "{bound}");
    assert!(
        rotating["message"]
            .as_str()
            .unwrap()
            .contains("--min-rotation-interval (1m)"),
        "{rotating}"
    );
    let events = tenant
        .try_kubectl(
            &[
                "get",
                "events",
                "--field-selector",
                "reason=RotationDeferred",
                "-o",
                "json",
            ],
            None,
        )
        .unwrap();
    assert!(events.contains("orders-app"), "{events:.2000}");
    // No rotation meanwhile.
    tokio::time::sleep(std::time::Duration::from_secs(15)).await;
    let after = get(ns, SBD, "orders-app").unwrap();
    assert_eq!(after["status"]["lastRotationTime"], last);
}
