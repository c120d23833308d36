//! deploy/ on a real API server (`#[ignore]`d; BROKKR_E2E_KUBECONFIG names a cluster-admin
//! kubeconfig, e.g. `scripts/e2e-cluster up`'s): `kubectl apply` of deploy/crds, then of each
//! kustomization — `--dry-run=server` first, then for real — with every object accepted, the
//! CRDs Established, and every object read back as written (the server's defaults aside). The
//! controller's RBAC is then checked where it matters: `kubectl auth can-i` as its
//! ServiceAccount, and `brokkr controller` itself, run on loopback with that ServiceAccount's
//! token, taking the Lease and listing a loopback `brokkr serve`'s catalog (the processes under
//! test run here; node_e2e runs the install's own Pods from the `brokkr:dev` image).
//!
//! Kubernetes before 1.21 has no `policy/v1` PodDisruptionBudget: against such a server the
//! PDBs are left out (and the test says so) and the rest is applied from `kubectl kustomize`;
//! against a newer one each kustomization is applied as is with `kubectl apply -k`.
//!
//! What it applies is left in the cluster for inspection; `kubectl delete -k deploy/base`
//! removes it.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::cluster::{cel_rules_served, kubectl, try_kubectl, without_cel_rules};
use support::node::{apply_crds, crds_established, documents, root, unserved_kinds};
use support::{BIN, free_port};

fn deploy(dir: &str) -> String {
    root().join("deploy").join(dir).display().to_string()
}

fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Whether `written` is found in `live`: every key with an equal value, lists element by element.
fn subset(path: &str, written: &Value, live: &Value) -> Result<(), String> {
    match (written, live) {
        (Value::Object(w), Value::Object(l)) => {
            for (k, v) in w {
                let lv = l.get(k).unwrap_or(&Value::Null);
                subset(&format!("{path}.{k}"), v, lv)?;
            }
            Ok(())
        }
        (Value::Array(w), Value::Array(l)) if w.len() == l.len() => w
            .iter()
            .zip(l)
            .enumerate()
            .try_for_each(|(i, (w, l))| subset(&format!("{path}[{i}]"), w, l)),
        (w, l) if w == l => Ok(()),
        (w, l) => Err(format!("{path}: wrote {w}, the server has {l}")),
    }
}

fn resource_name(object: &Value) -> String {
    let kind = object["kind"].as_str().unwrap().to_lowercase();
    let group = object["apiVersion"]
        .as_str()
        .unwrap()
        .rsplit_once('/')
        .map(|(g, _)| g.to_owned());
    match group {
        Some(g) => format!(
            "{kind}.{g}/{}",
            object["metadata"]["name"].as_str().unwrap()
        ),
        None => format!("{kind}/{}", object["metadata"]["name"].as_str().unwrap()),
    }
}

/// Every object of `objects` as the server has it, compared with what was written.
fn check_as_written(objects: &[Value]) {
    for object in objects {
        let name = resource_name(object);
        let mut args = vec!["get", name.as_str(), "-o", "json"];
        let ns = object["metadata"]["namespace"].as_str().map(str::to_owned);
        if let Some(ns) = &ns {
            args.extend(["-n", ns.as_str()]);
        }
        let live: Value = serde_json::from_str(&kubectl(&args, "")).unwrap();
        let mut written = object.clone();
        // The aggregation controller fills an aggregated role's rules.
        if written.get("aggregationRule").is_some() {
            written.as_object_mut().unwrap().remove("rules");
        }
        subset(&name, &written, &live).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Applies a kustomization (dry run first), the way the server's version allows: the kinds
/// in `unserved` (those of newer Kubernetes versions than the server's) are left out.
/// Before Kubernetes 1.25 the CRDs it holds are applied with `--validate=false` and read back
/// without their CEL rules, as for deploy/crds.
fn apply(dir: &str, unserved: &[&str]) -> Vec<Value> {
    let rendered = kubectl(&["kustomize", &deploy(dir)], "");
    let mut objects = documents(&rendered);
    let cel = cel_rules_served();
    let validate = if cel {
        "--validate=true"
    } else {
        "--validate=false"
    };
    if unserved.is_empty() {
        let path = deploy(dir);
        kubectl(&["apply", validate, "--dry-run=server", "-k", &path], "");
        kubectl(&["apply", validate, "-k", &path], "");
    } else {
        let before = objects.len();
        objects.retain(|o| !unserved.iter().any(|kind| o["kind"] == *kind));
        if objects.len() < before {
            eprintln!(
                "note: the server is older than these kinds: {unserved:?}; deploy/{dir}'s {} \
                 object(s) of them left out",
                before - objects.len()
            );
        }
        let text =
            serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": objects}))
                .unwrap();
        kubectl(&["apply", validate, "--dry-run=server", "-f", "-"], &text);
        kubectl(&["apply", validate, "-f", "-"], &text);
    }
    if !cel {
        objects
            .iter_mut()
            .filter(|o| o["kind"] == "CustomResourceDefinition")
            .for_each(without_cel_rules);
    }
    check_as_written(&objects);
    objects
}

/// Deletes what `apply` applied, but the Namespace and the CRDs, before the next kustomization.
fn remove(objects: &[Value]) {
    let rest: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] != "Namespace" && o["kind"] != "CustomResourceDefinition")
        .collect();
    let text =
        serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": rest})).unwrap();
    kubectl(
        &["delete", "--ignore-not-found", "--wait=true", "-f", "-"],
        &text,
    );
}

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A kubeconfig acting as the ServiceAccount `brokkr/<sa>`, through a token Secret the
/// controller-manager fills in.
fn service_account_kubeconfig(sa: &str, dir: &Path) -> String {
    let secret = format!("{sa}-e2e-token");
    let manifest = json!({"apiVersion": "v1", "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {"name": secret, "namespace": "brokkr",
            "annotations": {"kubernetes.io/service-account.name": sa}}});
    kubectl(&["apply", "-f", "-"], &manifest.to_string());
    let token = eventually("the ServiceAccount token", || {
        let out = kubectl(
            &[
                "-n",
                "brokkr",
                "get",
                "secret",
                &secret,
                "-o",
                "jsonpath={.data.token}",
            ],
            "",
        );
        (!out.is_empty()).then_some(out)
    });
    let token = String::from_utf8(base64_decode(&token).expect("base64 token")).unwrap();
    let mut config: Value = serde_json::from_str(&kubectl(
        &["config", "view", "--raw", "--flatten", "-o", "json"],
        "",
    ))
    .unwrap();
    config["users"] = json!([{"name": sa, "user": {"token": token}}]);
    for context in config["contexts"].as_array_mut().unwrap() {
        context["context"]["user"] = json!(sa);
        context["context"]["namespace"] = json!("brokkr");
    }
    let path = dir.join(format!("{sa}.kubeconfig"));
    std::fs::write(&path, config.to_string()).unwrap();
    path.display().to_string()
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()
}

/// `kubectl auth can-i` as the controller's ServiceAccount: what it needs, and some of what it
/// must not have.
fn check_controller_permissions() {
    let sa = "system:serviceaccount:brokkr:brokkr-controller";
    let can = |args: &[&str]| {
        let mut all = vec!["auth", "can-i", "--as", sa];
        all.extend(args);
        try_kubectl(&all, None).is_ok()
    };
    for args in [
        &[
            "update",
            "serviceinstances.services.brokkr.dev/status",
            "-A",
        ][..],
        &["patch", "clusterservicebrokers.services.brokkr.dev/status"],
        &[
            "update",
            "servicebindings.services.brokkr.dev/finalizers",
            "-n",
            "default",
        ],
        &["create", "clusterserviceclasses.services.brokkr.dev"],
        &["create", "secrets", "-n", "default"],
        &["delete", "secrets", "-n", "default"],
        &["create", "events", "-n", "default"],
        &["get", "namespaces/kube-system"],
        // Which namespaces are being deleted: nothing is written into them.
        &["list", "namespaces"],
        &["watch", "namespaces"],
        &["update", "leases.coordination.k8s.io", "-n", "brokkr"],
    ] {
        assert!(can(args), "the controller may not {args:?}");
    }
    for args in [
        &["get", "namespaces/default"][..],
        &["update", "namespaces/default"],
        &["delete", "namespaces/default"],
        &["update", "leases.coordination.k8s.io", "-n", "default"],
        &["delete", "leases.coordination.k8s.io", "-n", "brokkr"],
        &["delete", "deployments.apps", "-n", "default"],
        &["create", "pods", "-n", "default"],
    ] {
        assert!(!can(args), "the controller may {args:?}");
    }
    // Filled in by the aggregation controller from the labelled ClusterRole.
    eventually("the aggregated workload permissions", || {
        can(&["patch", "deployments.apps", "-n", "default"]).then_some(())
    });
    for args in [
        &["update", "statefulsets.apps", "-A"][..],
        &["watch", "daemonsets.apps", "-A"],
        &["patch", "jobs.batch", "-n", "default"],
        &["list", "cronjobs.batch", "-A"],
    ] {
        assert!(can(args), "the controller may not {args:?}");
    }
}

/// `brokkr controller` as its ServiceAccount takes the Lease and lists a loopback broker's
/// catalog, through a ClusterServiceBroker with the credentials of deploy/'s Secret.
fn run_controller_as_its_service_account(dir: &Path) {
    let broker_port = free_port();
    let _serve = Process(
        Command::new(BIN)
            .args(["serve", "--listen", &format!("127.0.0.1:{broker_port}")])
            .arg("--store")
            .arg(format!("sqlite://{}", dir.join("brokkr.db").display()))
            .args(["--username", "e2e", "--password", "e2e-secret"])
            .arg("--insecure-plaintext-secrets")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "brokkr-broker-auth", "namespace": "brokkr"},
        "stringData": {"username": "e2e", "password": "e2e-secret"}});
    kubectl(&["apply", "-f", "-"], &secret.to_string());
    let local = json!({"apiVersion": "services.brokkr.dev/v1alpha1", "kind": "ClusterServiceBroker",
        "metadata": {"name": "brokkr-e2e-local"},
        "spec": {"url": format!("http://127.0.0.1:{broker_port}"),
            "authInfo": {"basic": {"secretRef": {"namespace": "brokkr", "name": "brokkr-broker-auth"}}}}});
    kubectl(&["apply", "-f", "-"], &local.to_string());

    let config = service_account_kubeconfig("brokkr-controller", dir);
    let port = free_port();
    let _controller = Process(
        Command::new(BIN)
            .args(["controller", "--listen", &format!("127.0.0.1:{port}")])
            .args([
                "--lease-namespace",
                "brokkr",
                "--identity",
                "e2e-controller",
            ])
            .env("KUBECONFIG", &config)
            .env_remove("BROKKR_LEASE_NAMESPACE")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    eventually("the controller's Lease", || {
        let holder = try_kubectl(
            &[
                "-n",
                "brokkr",
                "get",
                "lease",
                "brokkr-controller",
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
            None,
        )
        .ok()?;
        (holder == "e2e-controller").then_some(())
    });
    eventually("the loopback broker's catalog listed", || {
        let status = kubectl(
            &[
                "get",
                "clusterservicebroker",
                "brokkr-e2e-local",
                "-o",
                "json",
            ],
            "",
        );
        let status: Value = serde_json::from_str(&status).unwrap();
        let ready = status["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        let plans: Value =
            serde_json::from_str(&kubectl(&["get", "clusterserviceplans", "-o", "json"], ""))
                .unwrap();
        (ready && !plans["items"].as_array()?.is_empty()).then_some(())
    });
    kubectl(
        &[
            "delete",
            "clusterservicebroker",
            "brokkr-e2e-local",
            "--wait=false",
        ],
        "",
    );
}

#[test]
#[ignore = "needs a cluster: BROKKR_E2E_KUBECONFIG (see docs/testing.md)"]
fn every_kustomization_applies_to_a_real_api_server() {
    let dir = tempfile::tempdir().unwrap();
    // ValidatingAdmissionPolicies (Kubernetes 1.30), PodDisruptionBudgets of policy/v1 (1.21).
    let unserved = unserved_kinds();

    // The CRDs first, Established before anything uses their kinds.
    let crds = deploy("crds");
    apply_crds(&["--dry-run=server"]);
    apply_crds(&[]);
    crds_established();
    let established = kubectl(
        &[
            "get",
            "crd",
            "-l",
            "app.kubernetes.io/part-of=brokkr",
            "-o",
            "name",
        ],
        "",
    );
    let mut written = documents(&kubectl(&["kustomize", &crds], ""));
    if !cel_rules_served() {
        written.iter_mut().for_each(without_cel_rules);
    }
    assert_eq!(
        established.lines().count(),
        written.len(),
        "every CRD of deploy/crds: {established}"
    );
    check_as_written(&written);

    // The namespace, as docs/install.md creates it before the Secrets (a server-side dry run
    // of namespaced objects needs it to exist).
    kubectl(&["apply", "-f", &deploy("base/namespace.yaml")], "");

    // The ServiceMonitor and PrometheusRule kinds, when no Prometheus Operator installed them:
    // only their names matter.
    for (kind, plural) in [
        ("ServiceMonitor", "servicemonitors"),
        ("PrometheusRule", "prometheusrules"),
    ] {
        let name = format!("{plural}.monitoring.coreos.com");
        if try_kubectl(&["get", "crd", &name], None).is_ok() {
            continue;
        }
        let singular = kind.to_lowercase();
        let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": name},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": singular, "listKind": format!("{kind}List")},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}});
        kubectl(&["apply", "-f", "-"], &crd.to_string());
        let established = format!("crd/{name}");
        kubectl(
            &[
                "wait",
                "--for",
                "condition=Established",
                &established,
                "--timeout=60s",
            ],
            "",
        );
    }

    let single = apply("overlays/single", &unserved);
    remove(&single);
    let monitoring = apply("overlays/monitoring", &unserved);
    remove(&monitoring);
    // The base last: left in place, and the controller's permissions tried on it.
    apply("base", &unserved);
    check_controller_permissions();
    run_controller_as_its_service_account(dir.path());
}
