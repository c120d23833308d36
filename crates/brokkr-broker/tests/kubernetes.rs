//! The Kubernetes catalogs end to end through the OSB API: provision, readiness, bind (a
//! servicebinding.io Secret), update, unbind and deprovision of the catalogs/manifests PostgreSQL
//! plan and of a catalogs/kubedb plan.
//!
//! The fast tests run against the in-memory fake API server. The `#[ignore]`d ones run the same
//! flows against a real cluster (`BROKKR_E2E_KUBECONFIG=… cargo test -p brokkr-broker --test
//! kubernetes -- --ignored`) that needs only kube-apiserver, etcd and kube-controller-manager: with
//! no kubelet, Pods stay Pending, so the tests set the status readiness waits for (a Pod's Ready
//! condition, a KubeDB resource's phase) and create what KubeDB would (its auth Secret).

#[macro_use]
mod harness;

use std::time::Duration;

use brokkr_fake_kube::FakeCluster;
use harness::*;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

const MANIFESTS: &str = include_str!("../../../catalogs/manifests/manifests.yaml");
const KUBEDB: &str = include_str!("../../../catalogs/kubedb/kubedb.yaml");
const PG: &str = "7a1d0c52-9f3e-4b8a-a1c4-5d2e6f7a8b01";
const PG_SMALL: &str = "7a1d0c52-9f3e-4b8a-a1c4-5d2e6f7a8b11";
const PG_MEDIUM: &str = "7a1d0c52-9f3e-4b8a-a1c4-5d2e6f7a8b12";
const KUBEDB_PG: &str = "5c0e9a31-2b7d-4f6a-9e18-3d4c5b6a7e01";
const KUBEDB_PG_SMALL: &str = "5c0e9a31-2b7d-4f6a-9e18-3d4c5b6a7e11";
const KUBEDB_PG_MEDIUM: &str = "5c0e9a31-2b7d-4f6a-9e18-3d4c5b6a7e12";

/// The cluster a flow runs against: the fake, or a real one.
enum Cluster {
    Fake(FakeCluster),
    Real(kube::Client),
}

impl Cluster {
    async fn api(&self, api_version: &str, kind: &str, ns: Option<&str>) -> Api<DynamicObject> {
        let client = match self {
            Self::Fake(fake) => fake.client(),
            Self::Real(client) => client.clone(),
        };
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, _) = kube::discovery::pinned_kind(&client, &gvk).await.unwrap();
        match ns {
            Some(ns) => Api::namespaced_with(client, ns, &resource),
            None => Api::all_with(client, &resource),
        }
    }

    async fn get(&self, api_version: &str, kind: &str, ns: &str, name: &str) -> Option<Value> {
        let api = self.api(api_version, kind, Some(ns)).await;
        let found = api.get_opt(name).await.unwrap();
        found.map(|o| serde_json::to_value(o).unwrap())
    }

    async fn create(&self, object: Value) {
        let ns = object["metadata"]["namespace"].as_str();
        let api_version = object["apiVersion"].as_str().unwrap();
        let api = self
            .api(api_version, object["kind"].as_str().unwrap(), ns)
            .await;
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        api.create(&PostParams::default(), &object).await.unwrap();
    }

    async fn set_status(&self, api_version: &str, kind: &str, ns: &str, name: &str, status: Value) {
        let api = self.api(api_version, kind, Some(ns)).await;
        let patch = json!({"status": status});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    /// Makes a one-replica StatefulSet ready: on the fake, its status; on a real cluster, the
    /// Ready condition of its Pod, from which the StatefulSet controller computes its status.
    async fn make_ready(&self, ns: &str, name: &str) {
        let sts = eventually(|| async {
            let live = self.get("apps/v1", "StatefulSet", ns, name).await?;
            let seen = live["status"]["observedGeneration"] == live["metadata"]["generation"];
            (seen || matches!(self, Self::Fake(_))).then_some(live)
        })
        .await;
        match self {
            Self::Fake(_) => {
                let generation = sts["metadata"]["generation"].clone();
                let status = json!({"observedGeneration": generation, "replicas": 1,
                    "readyReplicas": 1, "availableReplicas": 1,
                    "currentRevision": format!("{name}-{generation}"),
                    "updateRevision": format!("{name}-{generation}")});
                self.set_status("apps/v1", "StatefulSet", ns, name, status)
                    .await;
            }
            Self::Real(_) => {
                let pod = format!("{name}-0");
                // After an update the controller replaces the Pod: wait for one of the new
                // revision.
                let revision = sts["status"]["updateRevision"].clone();
                eventually(|| async {
                    let found = self.get("v1", "Pod", ns, &pod).await?;
                    let labels = &found["metadata"]["labels"];
                    let current = labels["controller-revision-hash"] == revision;
                    (current && found["metadata"]["deletionTimestamp"].is_null()).then_some(())
                })
                .await;
                let now = "2026-01-01T00:00:00Z";
                let ready = json!({"phase": "Running", "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": now}]});
                self.set_status("v1", "Pod", ns, &pod, ready).await;
            }
        }
    }

    /// The claim the StatefulSet controller makes from the template `data` (the fake has no
    /// controller, so the test makes it there).
    async fn claim(&self, ns: &str, sts: &str) -> String {
        let name = format!("data-{sts}-0");
        if let Self::Fake(_) = self {
            let live = self.get("apps/v1", "StatefulSet", ns, sts).await.unwrap();
            let labels = live["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"].clone();
            self.create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": ns, "labels": labels},
                "spec": {"accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}}}))
                .await;
        }
        eventually(|| async { self.get("v1", "PersistentVolumeClaim", ns, &name).await }).await;
        name
    }
}

/// Polls `probe` until it returns something (60 s at most).
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(probe: impl Fn() -> F) -> T {
    for _ in 0..600 {
        if let Some(found) = probe().await {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("gave up waiting");
}

/// The name the catalogs give an instance's objects.
fn object_name(prefix: &str, instance_id: &str) -> String {
    let hash: String = Sha256::digest(instance_id.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{prefix}-{}", &hash[..12])
}

fn binding_secret(name: &str, binding_id: &str) -> String {
    let hash: String = Sha256::digest(binding_id.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{name}-b-{}", &hash[..10])
}

async fn broker(catalog: &str, kubeconfig: &str) -> TestBroker {
    let yaml = catalog.replace(
        "    kind: kubernetes\n",
        &format!("    kind: kubernetes\n    kubeconfig: {kubeconfig}\n"),
    );
    start_with(Backend::Sqlite, &yaml).await
}

impl TestBroker {
    /// Polls a last_operation until it is terminal (`timeout` at most), or until its
    /// description contains `until`.
    async fn poll(&self, path: &str, until: Option<&str>) -> Reply {
        let mut last = Value::Null;
        for _ in 0..1200 {
            let r = self.get(path).await;
            last = r.body.clone();
            assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
            if r.body["state"] != "in progress" {
                return r;
            }
            if until.is_some_and(|u| r.description().contains(u)) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{path} never got there: {last}");
    }
}

fn ok(r: &Reply) {
    assert_eq!(r.body["state"], "succeeded", "{:?}", r.body);
}

/// Decodes every entry of a Secret's `data`.
fn entries(secret: &Value) -> serde_json::Map<String, Value> {
    use base64::Engine as _;
    let data = secret["data"].as_object().unwrap();
    data.iter()
        .map(|(k, v)| {
            let b = base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap())
                .unwrap();
            (k.clone(), Value::String(String::from_utf8(b).unwrap()))
        })
        .collect()
}

/// provision → ready → bind → update → unbind → deprovision of the manifests PostgreSQL plan.
async fn manifests_postgres(cluster: &Cluster, kubeconfig: &str, ns: &str) {
    // A catalog whose small plan also has a Secret the medium plan does not (a kind the broker's
    // role covers): the update to medium must prune it.
    let small =
        "{name: server, target: cluster, templates: [pg-secret, pg-service, pg-statefulset]}";
    assert!(MANIFESTS.contains(small));
    let medium = "    plan: medium\n    instance: *pg-instance\n";
    assert!(MANIFESTS.contains(medium));
    let catalog = MANIFESTS
        .replacen(
            small,
            "{name: server, target: cluster, templates: [pg-secret, pg-service, pg-statefulset, \
             {apiVersion: v1, kind: Secret, metadata: {name: \"{{ registry('name') }}-small\"}, \
             stringData: {plan: small}}]}",
            1,
        )
        .replacen(
            medium,
            &format!(
                "    plan: medium\n    instance: {{registry: *pg-registry, steps: [{small}]}}\n"
            ),
            1,
        );
    let broker = broker(&catalog, kubeconfig).await;
    let id = uuid::Uuid::new_v4().to_string();
    let name = object_name("pg", &id);
    let instance = format!("/v2/service_instances/{id}");
    let last = format!("{instance}/last_operation");
    let r = broker
        .put(
            &format!("{instance}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": PG, "plan_id": PG_SMALL,
                "context": {"platform": "kubernetes", "namespace": ns},
                "parameters": {"version": "16", "storage": "1Gi"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let waiting = broker
        .poll(
            &last,
            Some(&format!("waiting for StatefulSet {name} to be ready")),
        )
        .await;
    assert_eq!(waiting.body["state"], "in progress", "{:?}", waiting.body);
    if let Cluster::Fake(fake) = cluster {
        // While it waits for readiness, the step watches the StatefulSet (10 s at a time, then
        // it reads it again) without applying again: one apply per object, and no read of the
        // Secret or the Service, whose readiness the apply's answer shows.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let statefulset = format!("/apis/apps/v1/namespaces/{ns}/statefulsets");
        let count = |prefix: String| {
            fake.requests()
                .iter()
                .filter(|r| r.starts_with(&prefix))
                .count()
        };
        let named = |verb: &str, path: &str| count(format!("{verb} {path}/{name}?"));
        assert_eq!(named("PATCH", &statefulset), 1, "applies");
        assert_eq!(
            named("GET", &statefulset),
            2,
            "reads: the owner check, then one per watch"
        );
        assert_eq!(
            count(format!("GET {statefulset}?&watch=true")),
            2,
            "watches"
        );
        let services = format!("/api/v1/namespaces/{ns}/services");
        assert_eq!(named("PATCH", &services), 1);
        assert_eq!(named("GET", &services), 1, "the owner check only");
    }

    // Every object is there, labelled, in the namespace from the OSB context.
    for (api_version, kind, object) in [
        ("v1", "Secret", format!("{name}-auth")),
        ("v1", "Service", name.clone()),
        ("apps/v1", "StatefulSet", name.clone()),
        ("v1", "Secret", format!("{name}-small")),
    ] {
        let live = cluster.get(api_version, kind, ns, &object).await;
        let live = live.unwrap_or_else(|| panic!("{kind} {object}"));
        let labels = &live["metadata"]["labels"];
        assert_eq!(labels["app.kubernetes.io/managed-by"], "brokkr", "{kind}");
        assert_eq!(labels["brokkr.dev/instance-id"], id.as_str(), "{kind}");
        assert_eq!(labels["brokkr.dev/service"], PG, "{kind}");
        assert_eq!(labels["brokkr.dev/plan"], PG_SMALL, "{kind}");
        assert_eq!(labels["brokkr.dev/step"], "server", "{kind}");
    }
    let sts = cluster
        .get("apps/v1", "StatefulSet", ns, &name)
        .await
        .unwrap();
    let container = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "postgres:16");
    assert_eq!(container["resources"]["limits"]["memory"], "512Mi");
    let claim_template = &sts["spec"]["volumeClaimTemplates"][0];
    assert_eq!(
        claim_template["spec"]["resources"]["requests"]["storage"],
        "1Gi"
    );
    assert_eq!(
        claim_template["metadata"]["labels"]["brokkr.dev/instance-id"],
        id.as_str()
    );

    // After a long wait, readiness is still seen within a second: the step watches the
    // StatefulSet instead of polling it less and less often.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let flipped = std::time::Instant::now();
    cluster.make_ready(ns, &name).await;
    ok(&broker.poll(&last, None).await);
    let seen = flipped.elapsed();
    assert!(
        seen < Duration::from_secs(2),
        "readiness seen after {seen:?}"
    );
    let claim = cluster.claim(ns, &name).await;

    // Bind: the credentials, and the same as a servicebinding.io Secret.
    let b = uuid::Uuid::new_v4().to_string();
    let binding = format!("{instance}/service_bindings/{b}");
    let r = broker
        .put(
            &format!("{binding}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": PG, "plan_id": PG_SMALL}),
        )
        .await;
    assert!(r.status.is_success(), "{:?}", r.body);
    ok(&broker
        .poll(&format!("{binding}/last_operation"), None)
        .await);
    let credentials = broker.get(&binding).await.body["credentials"].clone();
    assert_eq!(credentials["type"], "postgresql");
    assert_eq!(credentials["host"], format!("{name}.{ns}.svc"));
    let secret_name = binding_secret(&name, &b);
    let secret = cluster.get("v1", "Secret", ns, &secret_name).await.unwrap();
    assert_eq!(secret["type"], "servicebinding.io/postgresql");
    let written = entries(&secret);
    for key in [
        "type", "provider", "host", "username", "password", "database", "uri",
    ] {
        assert_eq!(written[key], credentials[key], "{key}");
    }
    assert_eq!(written["port"], "5432");
    let auth = entries(
        &cluster
            .get("v1", "Secret", ns, &format!("{name}-auth"))
            .await
            .unwrap(),
    );
    assert_eq!(written["password"], auth["password"]);
    assert_eq!(
        secret["metadata"]["labels"]["brokkr.dev/binding-id"],
        b.as_str()
    );

    // The version is chosen at provision: an update may not change it.
    let r = broker
        .patch(
            &format!("{instance}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": PG, "plan_id": PG_MEDIUM, "parameters": {"version": "17"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{:?}", r.body);

    // Update to medium: the StatefulSet changes, the Secret only small has is pruned, and the
    // update waits for the StatefulSet again.
    let r = broker
        .patch(
            &format!("{instance}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": PG, "plan_id": PG_MEDIUM}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let sts = eventually(|| async {
        let live = cluster.get("apps/v1", "StatefulSet", ns, &name).await?;
        (live["metadata"]["labels"]["brokkr.dev/plan"] == PG_MEDIUM).then_some(live)
    })
    .await;
    let container = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "postgres:16", "kept");
    assert_eq!(container["resources"]["limits"]["memory"], "2Gi");
    let claim_template = &sts["spec"]["volumeClaimTemplates"][0];
    assert_eq!(
        claim_template["spec"]["resources"]["requests"]["storage"], "1Gi",
        "kept"
    );
    cluster.make_ready(ns, &name).await;
    ok(&broker.poll(&last, None).await);
    let pruned = cluster
        .get("v1", "Secret", ns, &format!("{name}-small"))
        .await;
    assert!(
        pruned.is_none(),
        "the Secret of the small plan is still there"
    );

    // Unbind removes the Secret.
    let r = broker
        .delete(&format!(
            "{binding}?accepts_incomplete=true&service_id={PG}&plan_id={PG_MEDIUM}"
        ))
        .await;
    assert!(r.status.is_success(), "{:?}", r.body);
    ok(&broker
        .poll(&format!("{binding}/last_operation"), None)
        .await);
    assert!(
        cluster
            .get("v1", "Secret", ns, &secret_name)
            .await
            .is_none()
    );

    // Deprovision removes everything, the claim too (pvc_policy: delete).
    let r = broker
        .delete(&format!(
            "{instance}?accepts_incomplete=true&service_id={PG}&plan_id={PG_MEDIUM}"
        ))
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let done = broker.poll(&last, None).await;
    ok(&done);
    assert!(!done.description().contains("skipped"), "{:?}", done.body);
    // The objects brokkr applied are gone when the deprovision ends; the claim, held by the
    // `kubernetes.io/pvc-protection` finalizer until its Pod is gone, soon after.
    for (api_version, kind, object) in [
        ("apps/v1", "StatefulSet", name.clone()),
        ("v1", "Service", name.clone()),
        ("v1", "Secret", format!("{name}-auth")),
    ] {
        let gone = cluster.get(api_version, kind, ns, &object).await;
        assert!(gone.is_none(), "{kind} {object} is still there");
    }
    eventually(|| async {
        let claim = cluster.get("v1", "PersistentVolumeClaim", ns, &claim).await;
        claim.is_none().then_some(())
    })
    .await;
}

/// The admin URL of the PostgreSQL server that stands in for the one KubeDB would run: the
/// test server (BROKKR_TEST_POSTGRES_URL, as scripts/test sets it).
fn stand_in_admin_url() -> String {
    std::env::var("BROKKR_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://brokkr:brokkr@127.0.0.1:5432/brokkr_test".into())
}

/// The stand-in server's host, port and admin login.
fn stand_in_postgres() -> (String, u16, String, String) {
    let url = reqwest::Url::parse(&stand_in_admin_url()).unwrap();
    let host = url.host_str().unwrap().to_owned();
    let port = url.port().unwrap_or(5432);
    let password = url.password().unwrap_or_default().to_owned();
    (host, port, url.username().to_owned(), password)
}

/// The KubeDB catalog with its PostgreSQL server reached at the stand-in (in a cluster it is
/// the Service `<name>.<namespace>.svc:5432`) and a database name of its own.
fn kubedb_catalog(database: &str) -> String {
    let (host, port, _, _) = stand_in_postgres();
    let service_host =
        "\"{{ registry('name') }}.{{ instance.context.namespace | default('default') }}.svc\"";
    assert!(KUBEDB.contains(service_host));
    KUBEDB
        .replace(service_host, &format!("\"{host}\""))
        .replace(
            "            port: 5432\n",
            &format!("            port: {port}\n"),
        )
        .replace(
            "{name: database, value: app}",
            &format!("{{name: database, value: {database}}}"),
        )
}

/// Connects to `database` as a binding's user.
async fn login(credentials: &Value) -> Result<PgConnection, sqlx::Error> {
    let options = PgConnectOptions::new()
        .host(credentials["host"].as_str().unwrap())
        .port(u16::try_from(credentials["port"].as_u64().unwrap()).unwrap())
        .username(credentials["username"].as_str().unwrap())
        .password(credentials["password"].as_str().unwrap())
        .database(credentials["database"].as_str().unwrap());
    PgConnection::connect_with(&options).await
}

/// Runs `sql` as the stand-in server's admin, in its admin database.
async fn as_admin(sql: &str) -> Vec<String> {
    let mut conn = PgConnection::connect(&stand_in_admin_url()).await.unwrap();
    let rows: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_all(&mut conn)
        .await
        .unwrap();
    rows.into_iter().map(|(r,)| r).collect()
}

/// Binds `b` with `parameters` and returns its credentials.
async fn bind(broker: &TestBroker, instance: &str, b: &str, parameters: Value) -> Value {
    let binding = format!("{instance}/service_bindings/{b}");
    let r = broker
        .put(
            &format!("{binding}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": KUBEDB_PG, "plan_id": KUBEDB_PG_SMALL, "parameters": parameters}),
        )
        .await;
    assert!(r.status.is_success(), "{:?}", r.body);
    ok(&broker
        .poll(&format!("{binding}/last_operation"), None)
        .await);
    broker.get(&binding).await.body["credentials"].clone()
}

/// Unbinds `b` and waits until it is done.
async fn unbind(broker: &TestBroker, instance: &str, b: &str) {
    let binding = format!("{instance}/service_bindings/{b}");
    let r = broker
        .delete(&format!(
            "{binding}?accepts_incomplete=true&service_id={KUBEDB_PG}&plan_id={KUBEDB_PG_MEDIUM}"
        ))
        .await;
    assert!(r.status.is_success(), "{:?}", r.body);
    ok(&broker
        .poll(&format!("{binding}/last_operation"), None)
        .await);
}

/// provision → ready → two binds, each with its own user → update to medium → unbind →
/// deprovision of the KubeDB PostgreSQL plan. The server KubeDB would run is the test
/// PostgreSQL server.
async fn kubedb_postgres(cluster: &Cluster, kubeconfig: &str, ns: &str) {
    let database = format!("app_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let broker = broker(&kubedb_catalog(&database), kubeconfig).await;
    let (host, port, admin_user, admin_password) = stand_in_postgres();
    let id = uuid::Uuid::new_v4().to_string();
    let name = object_name("pg", &id);
    let instance = format!("/v2/service_instances/{id}");
    let last = format!("{instance}/last_operation");
    let r = broker
        .put(
            &format!("{instance}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": KUBEDB_PG, "plan_id": KUBEDB_PG_SMALL,
                "context": {"platform": "kubernetes", "namespace": ns},
                "parameters": {"storage": "1Gi"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let waiting = broker
        .poll(
            &last,
            Some(&format!(
                "waiting for Postgres {name} $.status.phase to be Ready"
            )),
        )
        .await;
    assert_eq!(waiting.body["state"], "in progress", "{:?}", waiting.body);
    let pg = cluster
        .get("kubedb.com/v1", "Postgres", ns, &name)
        .await
        .unwrap();
    assert_eq!(pg["spec"]["version"], "16.13");
    assert_eq!(pg["spec"]["authSecret"]["name"], format!("{name}-auth"));
    assert_eq!(
        pg["spec"]["storage"]["resources"]["requests"]["storage"],
        "1Gi"
    );
    assert_eq!(
        pg["metadata"]["labels"]["brokkr.dev/instance-id"],
        id.as_str()
    );

    // What KubeDB would do: create the auth Secret, then report Ready.
    cluster
        .create(
            json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/basic-auth",
            "metadata": {"name": format!("{name}-auth"), "namespace": ns},
            "stringData": {"username": admin_user, "password": admin_password}}),
        )
        .await;
    cluster.kubedb_ready(ns, &name).await;
    ok(&broker.poll(&last, None).await);
    let owner = format!("{database}_owner");
    let made = format!("SELECT datname::text FROM pg_database WHERE datname = '{database}'");
    assert_eq!(as_admin(&made).await, vec![database.clone()]);

    // Each binding gets a user of its own in the instance's database.
    let writer = uuid::Uuid::new_v4().to_string();
    let credentials = bind(&broker, &instance, &writer, json!({})).await;
    assert_eq!(credentials["host"], host.as_str());
    assert_eq!(credentials["port"], port);
    assert_eq!(credentials["database"], database.as_str());
    let user = credentials["username"].as_str().unwrap().to_owned();
    assert!(user.starts_with("b_"), "{user}");
    assert_ne!(credentials["password"], admin_password.as_str());
    let mut conn = login(&credentials).await.unwrap();
    sqlx::query("CREATE TABLE orders (id int)")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO orders VALUES (1)")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let secret_name = binding_secret(&name, &writer);
    let secret = cluster.get("v1", "Secret", ns, &secret_name).await.unwrap();
    assert_eq!(secret["type"], "servicebinding.io/postgresql");
    let published = entries(&secret);
    assert_eq!(published["provider"], "kubedb");
    assert_eq!(published["username"], user.as_str());

    let reader = uuid::Uuid::new_v4().to_string();
    let read_only = bind(&broker, &instance, &reader, json!({"access": "read-only"})).await;
    assert_ne!(read_only["username"], user.as_str());
    let mut conn = login(&read_only).await.unwrap();
    let (count,): (i64,) = sqlx::query_as("SELECT count(*) FROM orders")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(count, 1);
    let refused = sqlx::query("INSERT INTO orders VALUES (2)")
        .execute(&mut conn)
        .await;
    assert!(refused.is_err(), "a read-only binding wrote");
    conn.close().await.unwrap();

    // Update to medium: the resource gets the new sizes, keeps its version, and the update
    // waits until KubeDB has seen the new spec (its status of the old one does not count).
    let r = broker
        .patch(
            &format!("{instance}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": KUBEDB_PG, "plan_id": KUBEDB_PG_MEDIUM}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let waiting = broker.poll(&last, Some("to observe generation")).await;
    assert_eq!(waiting.body["state"], "in progress", "{:?}", waiting.body);
    let pg = cluster
        .get("kubedb.com/v1", "Postgres", ns, &name)
        .await
        .unwrap();
    assert_eq!(
        pg["metadata"]["labels"]["brokkr.dev/plan"],
        KUBEDB_PG_MEDIUM
    );
    assert_eq!(pg["spec"]["version"], "16.13");
    let container = &pg["spec"]["podTemplate"]["spec"]["containers"][0];
    assert_eq!(container["resources"]["limits"]["memory"], "4Gi");
    cluster.kubedb_ready(ns, &name).await;
    ok(&broker.poll(&last, None).await);
    login(&read_only).await.unwrap().close().await.unwrap();

    // Unbinding drops the user: its credentials stop working, the other binding's do not.
    unbind(&broker, &instance, &writer).await;
    assert!(
        cluster
            .get("v1", "Secret", ns, &secret_name)
            .await
            .is_none()
    );
    let gone = format!("SELECT rolname::text FROM pg_roles WHERE rolname = '{user}'");
    assert!(as_admin(&gone).await.is_empty());
    assert!(login(&credentials).await.is_err());
    login(&read_only).await.unwrap().close().await.unwrap();
    unbind(&broker, &instance, &reader).await;

    let r = broker
        .delete(&format!(
            "{instance}?accepts_incomplete=true&service_id={KUBEDB_PG}&plan_id={KUBEDB_PG_MEDIUM}"
        ))
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    ok(&broker.poll(&last, None).await);
    assert!(
        cluster
            .get("kubedb.com/v1", "Postgres", ns, &name)
            .await
            .is_none()
    );
    // KubeDB's WipeOut would remove the server with its data; the stand-in stays.
    as_admin(&format!("DROP DATABASE {database} WITH (FORCE)")).await;
    as_admin(&format!("DROP ROLE {owner}")).await;
}

async fn fake() -> (Cluster, tempfile::TempDir, String) {
    let fake = FakeCluster::start().await;
    fake.add_kind("kubedb.com", "v1", "Postgres", "postgreses", true);
    fake.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, fake.kubeconfig()).unwrap();
    (Cluster::Fake(fake), dir, path.display().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn manifests_postgres_lifecycle_on_the_fake() {
    let (cluster, _dir, kubeconfig) = fake().await;
    manifests_postgres(&cluster, &kubeconfig, "team-a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubedb_postgres_lifecycle_on_the_fake() {
    let (cluster, _dir, kubeconfig) = fake().await;
    kubedb_postgres(&cluster, &kubeconfig, "team-a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_namespace_missing_from_the_context_fails_the_provision() {
    let (_cluster, _dir, kubeconfig) = fake().await;
    let broker = broker(MANIFESTS, &kubeconfig).await;
    let id = uuid::Uuid::new_v4().to_string();
    let r = broker
        .put(
            &format!("/v2/service_instances/{id}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": PG, "plan_id": PG_SMALL, "context": {"platform": "cloudfoundry"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let done = broker
        .poll(&format!("/v2/service_instances/{id}/last_operation"), None)
        .await;
    assert_eq!(done.body["state"], "failed");
    assert!(
        done.description().contains("no `namespace`"),
        "{:?}",
        done.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_per_instance_namespace_lives_as_long_as_its_instance() {
    let (cluster, _dir, kubeconfig) = fake().await;
    per_instance_namespace(&cluster, &kubeconfig).await;
}

/// provision → ready → deprovision of the manifests PostgreSQL plan with `namespace:
/// per-instance`: the namespace comes with the instance and goes with it.
async fn per_instance_namespace(cluster: &Cluster, kubeconfig: &str) {
    let catalog = MANIFESTS.replace("namespace: from-context", "namespace: per-instance");
    let broker = broker(&catalog, kubeconfig).await;
    let id = uuid::Uuid::new_v4().to_string();
    let name = object_name("pg", &id);
    let ns = brokkr_targets::kubernetes::instance_namespace(&id);
    let instance = format!("/v2/service_instances/{id}");
    let last = format!("{instance}/last_operation");
    let r = broker
        .put(
            &format!("{instance}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": PG, "plan_id": PG_SMALL, "context": {"platform": "cloudfoundry"},
                "parameters": {"storage": "1Gi"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    broker.poll(&last, Some("waiting for StatefulSet")).await;
    assert!(cluster.namespace(&ns).await.is_some());
    cluster.make_ready(&ns, &name).await;
    ok(&broker.poll(&last, None).await);
    cluster.claim(&ns, &name).await;
    let r = broker
        .delete(&format!(
            "{instance}?accepts_incomplete=true&service_id={PG}&plan_id={PG_SMALL}"
        ))
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let done = broker.poll(&last, None).await;
    ok(&done);
    assert!(!done.description().contains("skipped"), "{:?}", done.body);
    assert!(cluster.namespace(&ns).await.is_none());
}

impl Cluster {
    /// What KubeDB reports once a database runs its latest spec: phase Ready, the Ready
    /// condition, the generation it describes.
    async fn kubedb_ready(&self, ns: &str, name: &str) {
        let live = self
            .get("kubedb.com/v1", "Postgres", ns, name)
            .await
            .unwrap();
        let status = json!({"phase": "Ready", "observedGeneration": live["metadata"]["generation"],
            "conditions": [{"type": "Ready", "status": "True"}]});
        self.set_status("kubedb.com/v1", "Postgres", ns, name, status)
            .await;
    }

    /// Namespace `name`, if it exists.
    async fn namespace(&self, name: &str) -> Option<Value> {
        let api = self.api("v1", "Namespace", None).await;
        let found = api.get_opt(name).await.unwrap();
        found.map(|o| serde_json::to_value(o).unwrap())
    }

    /// Server-side applies `object` as the test's own field manager.
    async fn apply(&self, object: &Value) {
        let ns = object["metadata"]["namespace"].as_str();
        let api = self
            .api(
                object["apiVersion"].as_str().unwrap(),
                object["kind"].as_str().unwrap(),
                ns,
            )
            .await;
        let name = object["metadata"]["name"].as_str().unwrap();
        api.patch(
            name,
            &PatchParams::apply("brokkr-e2e").force(),
            &Patch::Apply(object),
        )
        .await
        .unwrap();
    }
}

/// Gives the broker's ServiceAccount exactly the permissions deploy/rbac grants it
/// (serviceaccount.yaml and the `roles` files) and returns a kubeconfig that acts as it, next
/// to the admin's `kubeconfig`: the flows then prove those roles are enough.
async fn broker_kubeconfig(cluster: &Cluster, kubeconfig: &str, roles: &[&str]) -> String {
    let rbac = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/rbac");
    for file in std::iter::once(&"serviceaccount.yaml").chain(roles) {
        let text = std::fs::read_to_string(format!("{rbac}/{file}")).unwrap();
        let objects: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        for object in objects.iter().filter(|o| o.is_object()) {
            cluster.apply(object).await;
        }
    }
    // A token the controller-manager's token controller fills in (on every version).
    cluster
        .apply(&json!({"apiVersion": "v1", "kind": "Secret",
            "type": "kubernetes.io/service-account-token",
            "metadata": {"name": "brokkr-e2e-token", "namespace": "brokkr",
                "annotations": {"kubernetes.io/service-account.name": "brokkr"}}}))
        .await;
    let token = eventually(|| async {
        let secret = cluster
            .get("v1", "Secret", "brokkr", "brokkr-e2e-token")
            .await?;
        secret["data"]["token"]
            .is_string()
            .then(|| entries(&secret)["token"].clone())
    })
    .await;
    let admin = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let mut config = serde_json::to_value(admin).unwrap();
    config["users"] = json!([{"name": "brokkr", "user": {"token": token}}]);
    for context in config["contexts"].as_array_mut().unwrap() {
        context["context"]["user"] = json!("brokkr");
    }
    let path = std::env::temp_dir().join(format!("brokkr-e2e-{}.kubeconfig", uuid::Uuid::new_v4()));
    std::fs::write(&path, serde_json::to_string(&config).unwrap()).unwrap();
    path.display().to_string()
}

/// A real cluster from BROKKR_E2E_KUBECONFIG, and a fresh namespace in it.
async fn real() -> (Cluster, String, String) {
    let path = std::env::var("BROKKR_E2E_KUBECONFIG")
        .expect("BROKKR_E2E_KUBECONFIG: a kubeconfig for the end-to-end cluster");
    let file = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .unwrap();
    let cluster = Cluster::Real(kube::Client::try_from(config).unwrap());
    let ns = format!(
        "brokkr-e2e-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    cluster
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
        .await;
    // The namespace's default ServiceAccount is needed before Pods can be created.
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "default", "namespace": ns}});
    if cluster
        .get("v1", "ServiceAccount", &ns, "default")
        .await
        .is_none()
    {
        let Cluster::Real(client) = &cluster else {
            unreachable!()
        };
        let api: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &ns,
            &kube::api::ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "ServiceAccount")),
        );
        let sa: DynamicObject = serde_json::from_value(sa).unwrap();
        let _ = api.create(&PostParams::default(), &sa).await;
    }
    (cluster, path, ns)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a cluster: BROKKR_E2E_KUBECONFIG (see docs/testing.md)"]
async fn manifests_postgres_lifecycle_on_a_cluster() {
    let _turn = CLUSTER_TURN.lock().await;
    let (cluster, kubeconfig, ns) = real().await;
    let kubeconfig = broker_kubeconfig(&cluster, &kubeconfig, &["manifests.yaml"]).await;
    manifests_postgres(&cluster, &kubeconfig, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a cluster: BROKKR_E2E_KUBECONFIG (see docs/testing.md)"]
async fn a_per_instance_namespace_lives_as_long_as_its_instance_on_a_cluster() {
    let _turn = CLUSTER_TURN.lock().await;
    let (cluster, kubeconfig, _) = real().await;
    let roles = ["manifests.yaml", "per-instance-namespaces.yaml"];
    let kubeconfig = broker_kubeconfig(&cluster, &kubeconfig, &roles).await;
    per_instance_namespace(&cluster, &kubeconfig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a cluster: BROKKR_E2E_KUBECONFIG (see docs/testing.md)"]
async fn kubedb_postgres_lifecycle_on_a_cluster() {
    let _turn = CLUSTER_TURN.lock().await;
    let (cluster, kubeconfig, ns) = real().await;
    // KubeDB's Postgres CRD with a minimal schema: anything in spec and status.
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "postgreses.kubedb.com"},
        "spec": {"group": "kubedb.com", "scope": "Namespaced",
            "names": {"plural": "postgreses", "singular": "postgres", "kind": "Postgres",
                "listKind": "PostgresList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]}});
    let Cluster::Real(client) = &cluster else {
        unreachable!()
    };
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kube::api::ApiResource::from_gvk(&GroupVersionKind::gvk(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
        )),
    );
    let crd: DynamicObject = serde_json::from_value(crd).unwrap();
    crds.patch(
        "postgreses.kubedb.com",
        &PatchParams::apply("brokkr-e2e").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    let gvk = GroupVersionKind::gvk("kubedb.com", "v1", "Postgres");
    eventually(|| async { kube::discovery::pinned_kind(client, &gvk).await.ok() }).await;
    let kubeconfig = broker_kubeconfig(&cluster, &kubeconfig, &["kubedb.yaml"]).await;
    kubedb_postgres(&cluster, &kubeconfig, &ns).await;
}

/// A deprovision step whose last-deleted object is held by a finalizer waits for it without
/// asking again about the objects it already deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_delete_does_not_ask_again_about_what_is_gone() {
    let (cluster, _dir, kubeconfig) = fake().await;
    let Cluster::Fake(fake) = &cluster else {
        unreachable!()
    };
    let catalog = "targets:
  cluster:
    kind: kubernetes
    namespace: from-context
catalog:
  services:
  - {name: pair, id: svc-pair, description: Two Secrets, bindable: false,
     plans: [{name: one, id: plan-one, description: One}]}
blueprints:
- service: pair
  plan: one
  instance:
    steps:
    - name: secrets
      target: cluster
      templates:
      - {apiVersion: v1, kind: Secret, metadata: {name: first}, stringData: {a: b}}
      - {apiVersion: v1, kind: Secret, metadata: {name: second}, stringData: {c: d}}
";
    let broker = broker(catalog, &kubeconfig).await;
    let instance = "/v2/service_instances/pair-1";
    let last = format!("{instance}/last_operation");
    let r = broker
        .put(
            &format!("{instance}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": "svc-pair",
                   "plan_id": "plan-one", "context": {"platform": "kubernetes", "namespace": "team-a"}}),
        )
        .await;
    assert!(r.status.is_success(), "{:?}", r.body);
    ok(&broker.poll(&last, None).await);

    // Deleted last to first: `second` goes, `first` is held by a finalizer for a while.
    fake.set_finalizers("v1", "Secret", Some("team-a"), "first", &["e2e/hold"]);
    let before = fake.requests().len();
    let r = broker
        .delete(&format!(
            "{instance}?accepts_incomplete=true&service_id=svc-pair&plan_id=plan-one"
        ))
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    broker.poll(&last, Some("Secret first")).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let asked = |name: &str| {
        let path = format!("/api/v1/namespaces/team-a/secrets/{name}?");
        fake.requests()[before..]
            .iter()
            .filter(|r| r.contains(&path))
            .count()
    };
    assert_eq!(asked("second"), 2, "one read and one delete of `second`");
    assert!(asked("first") >= 3, "`first` is looked at again");
    fake.set_finalizers("v1", "Secret", Some("team-a"), "first", &[]);
    ok(&broker.poll(&last, None).await);
}

/// One real-cluster test at a time in this binary: the request count reads the API server's
/// own counters, which any other test's requests would move.
static CLUSTER_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The API server's `apiserver_request_total`, summed by (verb, resource) over requests to
/// the objects themselves (not their `status` or other subresources). The counters do not say
/// who asked: besides brokkr, the API server reads the `kubernetes` Service every few seconds,
/// and the garbage collector reads and patches an object deleted in the foreground. The
/// assertions hold only what no one else does here.
async fn requests_served(
    client: &kube::Client,
) -> std::collections::BTreeMap<(String, String), u64> {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(request).await.unwrap();
    let mut counts = std::collections::BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split("\",")
                .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        if !label("subresource").is_empty() {
            continue;
        }
        let value: f64 = value.trim().parse().unwrap_or(0.0);
        *counts
            .entry((label("verb"), label("resource")))
            .or_insert(0) += value as u64;
    }
    counts
}

/// What the API server served between two readings, as `VERB resource` → count.
fn served_between(
    before: &std::collections::BTreeMap<(String, String), u64>,
    after: &std::collections::BTreeMap<(String, String), u64>,
    resources: &[&str],
) -> std::collections::BTreeMap<String, u64> {
    after
        .iter()
        .filter(|((_, resource), _)| resources.contains(&resource.as_str()))
        .filter_map(|((verb, resource), n)| {
            let d = n - before
                .get(&(verb.clone(), resource.clone()))
                .copied()
                .unwrap_or(0);
            (d > 0).then(|| (format!("{verb} {resource}"), d))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a cluster: BROKKR_E2E_KUBECONFIG (see docs/testing.md)"]
async fn manifests_postgres_costs_the_api_server_one_request_per_object_and_phase() {
    let _turn = CLUSTER_TURN.lock().await;
    let (cluster, kubeconfig, ns) = real().await;
    let Cluster::Real(client) = &cluster else {
        unreachable!()
    };
    let kubeconfig = broker_kubeconfig(&cluster, &kubeconfig, &["manifests.yaml"]).await;
    let broker = broker(MANIFESTS, &kubeconfig).await;
    let watched = [
        "secrets",
        "services",
        "statefulsets",
        "persistentvolumeclaims",
    ];
    let id = uuid::Uuid::new_v4().to_string();
    let name = object_name("pg", &id);
    let instance = format!("/v2/service_instances/{id}");
    let last = format!("{instance}/last_operation");
    // Settles the counters: a watch is counted when it ends.
    let settle = || tokio::time::sleep(Duration::from_secs(2));

    // Provision: three objects, each checked to be brokkr's and applied once; the StatefulSet
    // watched until its Pod is ready (the test sets the Pod's status; the controller-manager
    // then sets the StatefulSet's), and that is seen within 2 s.
    let start = requests_served(client).await;
    let r = broker
        .put(
            &format!("{instance}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": PG,
                "plan_id": PG_SMALL, "context": {"platform": "kubernetes", "namespace": ns}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pod = format!("{name}-0");
    eventually(|| async { cluster.get("v1", "Pod", &ns, &pod).await }).await;
    let now = "2026-01-01T00:00:00Z";
    let flipped = std::time::Instant::now();
    cluster
        .set_status(
            "v1",
            "Pod",
            &ns,
            &pod,
            json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now}]}),
        )
        .await;
    ok(&broker.poll(&last, None).await);
    let seen = flipped.elapsed();
    settle().await;
    let provisioned = requests_served(client).await;
    let provision = served_between(&start, &provisioned, &watched);
    eprintln!("provision: {provision:?}, readiness seen after {seen:?}");
    assert!(
        seen < Duration::from_secs(2),
        "readiness seen after {seen:?}"
    );
    // Services are also read by the API server itself (its `kubernetes` Service), so their
    // reads are not counted.
    let expected = [
        ("APPLY secrets", 1),
        ("APPLY services", 1),
        ("APPLY statefulsets", 1),
        ("GET secrets", 1),
        ("GET statefulsets", 1),
        ("WATCH statefulsets", 1),
    ];
    for (request, n) in expected {
        assert_eq!(provision.get(request), Some(&n), "{request}: {provision:?}");
    }

    // Bind and unbind: the binding Secret applied once; then read (is it brokkr's?) and
    // deleted once.
    let b = uuid::Uuid::new_v4().to_string();
    let binding = format!("{instance}/service_bindings/{b}");
    let r = broker
        .put(
            &format!("{binding}?accepts_incomplete=true"),
            json!({"service_id": PG, "plan_id": PG_SMALL}),
        )
        .await;
    assert!(r.status.is_success(), "{:?}", r.body);
    ok(&broker
        .poll(&format!("{binding}/last_operation"), None)
        .await);
    settle().await;
    let bound = requests_served(client).await;
    let bind = served_between(&provisioned, &bound, &watched);
    eprintln!("bind: {bind:?}");
    // The Secret checked to be brokkr's, then applied.
    assert_eq!(bind.get("GET secrets"), Some(&1), "{bind:?}");
    assert_eq!(bind.get("APPLY secrets"), Some(&1), "{bind:?}");
    let r = broker
        .delete(&format!(
            "{binding}?accepts_incomplete=true&service_id={PG}&plan_id={PG_SMALL}"
        ))
        .await;
    assert!(r.status.is_success(), "{:?}", r.body);
    ok(&broker
        .poll(&format!("{binding}/last_operation"), None)
        .await);
    settle().await;
    let unbound = requests_served(client).await;
    let unbind = served_between(&bound, &unbound, &watched);
    eprintln!("unbind: {unbind:?}");
    assert_eq!(unbind.get("GET secrets"), Some(&1), "{unbind:?}");
    assert_eq!(unbind.get("DELETE secrets"), Some(&1), "{unbind:?}");

    // Deprovision: each object read (is it brokkr's?) and deleted once, the StatefulSet
    // watched until it is gone, its claim listed once and deleted once.
    let r = broker
        .delete(&format!(
            "{instance}?accepts_incomplete=true&service_id={PG}&plan_id={PG_SMALL}"
        ))
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    ok(&broker.poll(&last, None).await);
    settle().await;
    let deprovision = served_between(&unbound, &requests_served(client).await, &watched);
    eprintln!("deprovision: {deprovision:?}");
    // The StatefulSet, deleted in the foreground, is also read and patched by the garbage
    // collector (its `foregroundDeletion` finalizer), so its reads are not counted.
    let expected = [
        ("DELETE secrets", 1),
        ("DELETE services", 1),
        ("DELETE statefulsets", 1),
        ("GET secrets", 1),
        ("LIST persistentvolumeclaims", 1),
        ("DELETE persistentvolumeclaims", 1),
    ];
    for (request, n) in expected {
        assert_eq!(
            deprovision.get(request),
            Some(&n),
            "{request}: {deprovision:?}"
        );
    }
}
