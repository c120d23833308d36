//! `brokkr controller` end to end: the real binary, configured by a kubeconfig file like kubectl,
//! against the fake API server and `brokkr serve`: it takes the Lease, lists brokkr's catalog from
//! a ClusterServiceBroker into ClusterServiceClasses and ClusterServicePlans, serves `/readyz` and
//! `/metrics`, and on SIGTERM stops and releases the Lease. Also `brokkr crds` in both formats.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use brokkr_fake_kube::FakeCluster;
use brokkr_osb::client::{Client as OsbClient, Method};
use serde_json::{Value, json};
use support::*;

const API: &str = "services.brokkr.dev/v1alpha1";

fn serve(dir: &Path) -> (Process, String) {
    serve_with(dir, &[], &[])
}

/// The service and plan ids of the built-in catalog (the quickstart and the local catalog).
fn built_in_ids() -> (Vec<String>, Vec<String>) {
    let out = Command::new(BIN)
        .args(["catalog", "-o", "json"])
        .env_remove("BROKKR_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success());
    let catalog: Value = serde_json::from_slice(&out.stdout).unwrap();
    let services = catalog["services"].as_array().unwrap();
    let ids = |v: &Value| v["id"].as_str().unwrap().to_owned();
    (
        services.iter().map(ids).collect(),
        services
            .iter()
            .flat_map(|s| s["plans"].as_array().unwrap().iter().map(ids))
            .collect(),
    )
}

/// A fake API server that serves brokkr's kinds and Leases, and a kubeconfig file for it in `dir`.
async fn cluster(dir: &Path) -> (FakeCluster, std::path::PathBuf) {
    let (fake, kubeconfig) = cluster_without_crds(dir).await;
    add_crds(&fake);
    (fake, kubeconfig)
}

/// A fake API server that serves Leases but not yet brokkr's kinds.
async fn cluster_without_crds(dir: &Path) -> (FakeCluster, std::path::PathBuf) {
    let fake = FakeCluster::start().await;
    fake.add_kind("coordination.k8s.io", "v1", "Lease", "leases", true);
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig()).unwrap();
    (fake, kubeconfig)
}

fn add_crds(fake: &FakeCluster) {
    for crd in brokkr_controller::resources::crds() {
        fake.add_crd(&crd);
    }
}

/// Waits until the broker at `broker_url` serves its catalog, then writes the Secret with its
/// credentials and a ClusterServiceBroker named `brokkr` for it.
async fn register_broker(fake: &FakeCluster, broker_url: &str) {
    let osb = OsbClient::builder(broker_url)
        .basic_auth("platform", "s3cret")
        .build()
        .unwrap();
    eventually("the broker to serve its catalog", async || {
        osb.catalog().await.ok().map(|_| ())
    })
    .await;
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "brokkr-auth", "namespace": "default"},
        "data": {"username": "cGxhdGZvcm0=", "password": "czNjcmV0"}}));
    fake.create(json!({"apiVersion": API, "kind": "ClusterServiceBroker",
        "metadata": {"name": "brokkr"},
        "spec": {"url": broker_url,
                 "authInfo": {"basic": {"secretRef": {"namespace": "default", "name": "brokkr-auth"}}}}}));
}

#[tokio::test]
async fn the_controller_lists_brokkrs_catalog_and_hands_the_lease_back_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    // The controller starts before brokkr's CRDs are installed (applied together, say).
    let (fake, kubeconfig) = cluster_without_crds(dir.path()).await;

    let (_broker, broker_url) = serve(dir.path());
    let listen = format!("127.0.0.1:{}", free_port());
    let mut controller = Process(
        Command::new(BIN)
            .args([
                "controller",
                "--log-format",
                "json",
                "--lease-duration",
                "3s",
            ])
            .args(["--listen", &listen, "--identity", "replica-1"])
            .env("KUBECONFIG", &kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start brokkr controller"),
    );

    // It waits, not ready, instead of exiting; then the CRDs come.
    // brokkr-osb's client is reqwest with brokkr's TLS set-up; here it only speaks plain HTTP.
    let http = OsbClient::builder(format!("http://{listen}"))
        .build()
        .unwrap();
    let waiting = eventually("/readyz to answer", async || {
        http.request(Method::GET, "/readyz").send().await.ok()
    })
    .await;
    assert_eq!(waiting.status(), 503);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        controller.0.try_wait().unwrap().is_none(),
        "the controller exited without brokkr's CRDs"
    );
    add_crds(&fake);
    register_broker(&fake, &broker_url).await;

    let (services, plans) = built_in_ids();
    assert!(!services.is_empty() && !plans.is_empty());
    eventually("every built-in plan as a ClusterServicePlan", async || {
        (fake.list(API, "ClusterServicePlan").len() == plans.len()).then_some(())
    })
    .await;
    for id in &services {
        let class = fake
            .get(API, "ClusterServiceClass", None, id)
            .unwrap_or_else(|| panic!("no class {id}"));
        assert_eq!(class["spec"]["clusterServiceBrokerName"], "brokkr");
    }
    // The broker's status is written after its classes and plans.
    let broker = eventually("the ClusterServiceBroker to be Ready", async || {
        let broker = fake.get(API, "ClusterServiceBroker", None, "brokkr")?;
        (broker["status"]["lastConditionState"] == "Ready").then_some(broker)
    })
    .await;
    assert_eq!(
        broker["status"]["conditions"][0]["reason"], "FetchedCatalog",
        "{broker:#}"
    );
    let lease = fake
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("default"),
            "brokkr-controller",
        )
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "replica-1");

    instances_are_provisioned_and_deprovisioned(&fake, &broker_url).await;

    let ready = http.request(Method::GET, "/readyz").send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let metrics = http
        .request(Method::GET, "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"brokkr_controller_osb_calls_total{verb="catalog",status="200"}"#),
        "{metrics}"
    );

    let pid = controller.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = controller.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the controller did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status}");
    let lease = fake
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("default"),
            "brokkr-controller",
        )
        .unwrap();
    assert!(
        lease["spec"].get("holderIdentity").is_none(),
        "the lease is released: {lease:#}"
    );
    // Every request says where it comes from, for the API server's audit log.
    let agent = format!("brokkr-controller/{}", env!("CARGO_PKG_VERSION"));
    let agents = fake.user_agents();
    assert!(agents.contains(&agent), "{agents:?}");
    assert!(
        agents
            .iter()
            .all(|a| *a == agent || a == brokkr_fake_kube::TEST_CLIENT),
        "{agents:?}"
    );
}

/// The instance `name`'s condition `type_`, once it has `reason`.
async fn condition(fake: &FakeCluster, name: &str, type_: &str, reason: &str) -> Value {
    condition_of(fake, "ServiceInstance", name, type_, reason).await
}

/// The condition `type_` of the `kind` named `name`, once it has `reason`.
async fn condition_of(
    fake: &FakeCluster,
    kind: &str,
    name: &str,
    type_: &str,
    reason: &str,
) -> Value {
    eventually(
        &format!("{kind} {name}: {type_} with reason {reason}"),
        async || {
            let instance = fake.get(API, kind, Some("default"), name)?;
            let found = instance["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == type_ && c["reason"] == reason)?
                .clone();
            Some(found)
        },
    )
    .await
}

/// The broker's answer to fetching the instance `id`.
async fn broker_instance(broker_url: &str, id: &str) -> u16 {
    let osb = OsbClient::builder(broker_url)
        .basic_auth("platform", "s3cret")
        .build()
        .unwrap();
    match osb.instance(id, None).await {
        Ok(response) => response.status.as_u16(),
        Err(e) => e.status().expect("an answer").as_u16(),
    }
}

/// ServiceInstances of brokkr's async plan: provisioned (polled to the end), a 400 terminal with
/// the broker's description, a plan not in the catalog waited for, and deleting one blocked by a
/// ServiceBinding until the binding goes, then deprovisioned.
async fn instances_are_provisioned_and_deprovisioned(fake: &FakeCluster, broker_url: &str) {
    let instance = |name: &str, plan: &str, parameters: Value| {
        json!({"apiVersion": API, "kind": "ServiceInstance",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterServiceClassExternalName": "user-provided",
                     "clusterServicePlanExternalName": plan, "parameters": parameters}})
    };
    let credentials = json!({"credentials": {"type": "postgresql", "host": "pg.internal"}});
    fake.create(instance("orders-db", "async", credentials.clone()));
    fake.create(instance("broken", "async", json!({})));
    fake.create(instance("later", "nope", credentials));

    let ready = condition(fake, "orders-db", "Ready", "ProvisionedSuccessfully").await;
    assert_eq!(ready["status"], "True");
    let orders = fake
        .get(API, "ServiceInstance", Some("default"), "orders-db")
        .unwrap();
    let status = &orders["status"];
    assert_eq!(status["provisionStatus"], "Provisioned", "{orders:#}");
    assert_eq!(status["deprovisionStatus"], "Required");
    assert_eq!(status["asyncOpInProgress"], false);
    assert_eq!(
        status["userSpecifiedClassName"],
        "ClusterServiceClass/user-provided"
    );
    assert_eq!(status["userSpecifiedPlanName"], "ClusterServicePlan/async");
    assert_eq!(status["lastConditionState"], "Ready");
    assert_eq!(
        status["externalProperties"]["clusterServicePlanExternalName"],
        "async"
    );
    assert!(status.get("lastOperation").is_none() && status.get("currentOperation").is_none());
    assert_eq!(
        orders["metadata"]["finalizers"],
        json!(["services.brokkr.dev/service-instance"])
    );
    let id = orders["metadata"]["uid"].as_str().unwrap().to_owned();
    assert_eq!(
        broker_instance(broker_url, &id).await,
        200,
        "the broker has the instance"
    );

    let failed = condition(fake, "broken", "Failed", "ProvisionCallFailed").await;
    assert_eq!(failed["status"], "True");
    assert!(
        failed["message"].as_str().unwrap().contains("400"),
        "{failed:#}"
    );
    let waiting = condition(fake, "later", "Ready", "ReferencesNonexistentServicePlan").await;
    assert_eq!(waiting["status"], "False");
    let later = fake
        .get(API, "ServiceInstance", Some("default"), "later")
        .unwrap();
    let conditions = later["status"]["conditions"].as_array().unwrap();
    assert!(
        !conditions.iter().any(|c| c["type"] == "Failed"),
        "it waits: {later:#}"
    );
    assert!(
        waiting["message"].as_str().unwrap().contains("\"nope\""),
        "{waiting:#}"
    );

    // A ServiceBinding of the instance blocks its deprovisioning until it is gone.
    fake.create(json!({"apiVersion": API, "kind": "ServiceBinding",
        "metadata": {"name": "orders-app", "namespace": "default"},
        "spec": {"instanceRef": {"name": "orders-db"}}}));
    let client = fake.client();
    let instances: kube::Api<brokkr_controller::resources::ServiceInstance> =
        kube::Api::namespaced(client.clone(), "default");
    instances
        .delete("orders-db", &Default::default())
        .await
        .unwrap();
    let blocked = condition(
        fake,
        "orders-db",
        "Ready",
        "DeprovisionBlockedByExistingBindings",
    )
    .await;
    assert!(
        blocked["message"].as_str().unwrap().contains("orders-app"),
        "{blocked:#}"
    );
    assert_eq!(
        broker_instance(broker_url, &id).await,
        200,
        "not deprovisioned while bound"
    );

    let bindings: kube::Api<brokkr_controller::resources::ServiceBinding> =
        kube::Api::namespaced(client, "default");
    bindings
        .delete("orders-app", &Default::default())
        .await
        .unwrap();
    eventually("the deprovisioned instance to go", async || {
        fake.get(API, "ServiceInstance", Some("default"), "orders-db")
            .is_none()
            .then_some(())
    })
    .await;
    assert_ne!(
        broker_instance(broker_url, &id).await,
        200,
        "the broker deprovisioned it"
    );
}

#[test]
fn crds_prints_every_definition_as_yaml_and_as_a_json_list() {
    let yaml = Command::new(BIN).arg("crds").output().unwrap();
    assert!(yaml.status.success());
    let text = String::from_utf8(yaml.stdout).unwrap();
    assert_eq!(
        text.matches("kind: CustomResourceDefinition").count(),
        12,
        "{text}"
    );
    assert!(text.contains("name: serviceinstances.services.brokkr.dev"));

    let json = Command::new(BIN)
        .args(["crds", "-o", "json"])
        .output()
        .unwrap();
    assert!(json.status.success());
    let list: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(list["kind"], "List");
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"servicebindings.services.brokkr.dev"),
        "{names:?}"
    );
    assert!(
        names.contains(&"servicebindings.servicebinding.io"),
        "{names:?}"
    );
    assert_eq!(names.len(), 12);
}

/// The platform side end to end on brokkr's shared-server catalog and the local PostgreSQL: a
/// ServiceBinding written before its ServiceInstance waits for it, then gets a servicebinding.io
/// Secret whose credentials log in; a Secret the binding does not own is never overwritten;
/// deleting the binding deletes its Secret and unbinds (the login stops working); then the
/// instance is deprovisioned.
#[tokio::test]
async fn a_binding_written_before_its_instance_gets_credentials_that_log_in() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, kubeconfig) = cluster(dir.path()).await;
    let (_broker, broker_url) = serve_shared(dir.path());
    let _controller = controller(&kubeconfig, Stdio::null());
    register_broker(&fake, &broker_url).await;

    // The binding first, its parameters from a Secret that does not exist yet.
    fake.create(json!({"apiVersion": API, "kind": "ServiceBinding",
        "metadata": {"name": "orders-app", "namespace": "default"},
        "spec": {"instanceRef": {"name": "orders"},
                 "parametersFrom": [{"secretKeyRef": {"name": "bind-params", "key": "p"}}],
                 "secretTransforms": [{"addKey": {"key": "DATABASE_URL", "jsonPathExpression": "{.uri}"}}]}}));
    let waiting = condition_of(
        &fake,
        "ServiceBinding",
        "orders-app",
        "Ready",
        "ReferencesNonexistentInstance",
    )
    .await;
    assert_eq!(waiting["status"], "False");
    fake.create(json!({"apiVersion": API, "kind": "ServiceInstance",
        "metadata": {"name": "orders", "namespace": "default"},
        "spec": {"clusterServiceClassExternalName": "postgresql",
                 "clusterServicePlanExternalName": "small"}}));
    let waiting = condition_of(
        &fake,
        "ServiceBinding",
        "orders-app",
        "Ready",
        "ErrorWithParameters",
    )
    .await;
    assert!(
        waiting["message"].as_str().unwrap().contains("bind-params"),
        "{waiting:#}"
    );
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "bind-params", "namespace": "default"},
        "stringData": {"p": r#"{"access": "read-write"}"#}}));

    let ready = condition_of(
        &fake,
        "ServiceBinding",
        "orders-app",
        "Ready",
        "InjectedBindResult",
    )
    .await;
    assert_eq!(ready["status"], "True");
    let binding = fake
        .get(API, "ServiceBinding", Some("default"), "orders-app")
        .unwrap();
    assert_eq!(
        binding["status"]["binding"]["name"], "orders-app",
        "{binding:#}"
    );
    assert_eq!(
        binding["status"]["externalProperties"]["parameters"],
        json!({"access": "<redacted>"}),
        "Secret values never reach the status"
    );
    let secret = fake
        .get("v1", "Secret", Some("default"), "orders-app")
        .unwrap();
    assert_eq!(secret["type"], "servicebinding.io/postgresql");
    assert_eq!(entry(&secret, "type"), "postgresql");
    assert_eq!(entry(&secret, "provider"), "brokkr");
    assert_eq!(entry(&secret, "DATABASE_URL"), entry(&secret, "uri"));
    let owner = &secret["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "ServiceBinding");
    assert_eq!(owner["uid"], binding["metadata"]["uid"]);
    assert_eq!(owner["controller"], true);
    log_in(&secret)
        .await
        .expect("the binding's credentials log in");

    // A Secret deleted by hand comes back: the broker keeps its bindings (bindings_retrievable).
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(fake.client(), "default");
    secrets
        .delete("orders-app", &Default::default())
        .await
        .unwrap();
    let restored = eventually("the binding Secret to be written again", async || {
        fake.get("v1", "Secret", Some("default"), "orders-app")
    })
    .await;
    assert_eq!(restored["data"], secret["data"]);

    // A Secret of the same name that the binding does not own is left alone; nothing is bound.
    fake.create(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "taken", "namespace": "default"},
        "stringData": {"mine": "keep"}}));
    fake.create(json!({"apiVersion": API, "kind": "ServiceBinding",
        "metadata": {"name": "second", "namespace": "default"},
        "spec": {"instanceRef": {"name": "orders"}, "secretName": "taken"}}));
    let refused = condition_of(&fake, "ServiceBinding", "second", "Ready", "SecretNotOwned").await;
    assert!(
        refused["message"].as_str().unwrap().contains("taken"),
        "{refused:#}"
    );
    let taken = fake.get("v1", "Secret", Some("default"), "taken").unwrap();
    assert!(
        taken["metadata"].get("ownerReferences").is_none(),
        "{taken:#}"
    );

    // Deleting the binding deletes its Secret and unbinds: the login no longer works.
    let bindings: kube::Api<brokkr_controller::resources::ServiceBinding> =
        kube::Api::namespaced(fake.client(), "default");
    for name in ["orders-app", "second"] {
        bindings.delete(name, &Default::default()).await.unwrap();
    }
    eventually("both bindings to go", async || {
        fake.list(API, "ServiceBinding").is_empty().then_some(())
    })
    .await;
    assert!(
        fake.get("v1", "Secret", Some("default"), "orders-app")
            .is_none()
    );
    assert!(fake.get("v1", "Secret", Some("default"), "taken").is_some());
    assert!(
        log_in(&secret).await.is_err(),
        "unbind dropped the binding's login"
    );

    let instances: kube::Api<brokkr_controller::resources::ServiceInstance> =
        kube::Api::namespaced(fake.client(), "default");
    instances
        .delete("orders", &Default::default())
        .await
        .unwrap();
    eventually("the instance to be deprovisioned", async || {
        fake.list(API, "ServiceInstance").is_empty().then_some(())
    })
    .await;
}
