//! The catalogs/kubedb PostgreSQL plan through the OSB API: provision, readiness by KubeDB's
//! status, two bindings each with a user of its own, an update, unbind and deprovision. The
//! server KubeDB would run is the test PostgreSQL server.

use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use reqwest::StatusCode;
use serde_json::json;
use sqlx::Connection;

use crate::cluster::{CLUSTER_TURN, Cluster, broker_kubeconfig, fake, real};
use crate::support::{
    as_admin, binding_secret, broker, entries, eventually, forget_stand_in_database, login,
    object_name, ok, stand_in_postgres,
};

const KUBEDB: &str = include_str!("../../../../catalogs/kubedb/kubedb.yaml");
const KUBEDB_PG: &str = "5c0e9a31-2b7d-4f6a-9e18-3d4c5b6a7e01";
const KUBEDB_PG_SMALL: &str = "5c0e9a31-2b7d-4f6a-9e18-3d4c5b6a7e11";
const KUBEDB_PG_MEDIUM: &str = "5c0e9a31-2b7d-4f6a-9e18-3d4c5b6a7e12";

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
    let made = format!("SELECT datname::text FROM pg_database WHERE datname = '{database}'");
    assert_eq!(as_admin(&made).await, vec![database.clone()]);

    // Each binding gets a user of its own in the instance's database.
    let writer = uuid::Uuid::new_v4().to_string();
    let credentials = broker
        .bind(
            &instance,
            &writer,
            json!({"service_id": KUBEDB_PG, "plan_id": KUBEDB_PG_SMALL}),
        )
        .await;
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
    let read_only = broker
        .bind(&instance, &reader, json!({"service_id": KUBEDB_PG, "plan_id": KUBEDB_PG_SMALL, "parameters": {"access": "read-only"}}))
        .await;
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
    broker
        .unbind(&instance, &writer, KUBEDB_PG, KUBEDB_PG_MEDIUM)
        .await;
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
    broker
        .unbind(&instance, &reader, KUBEDB_PG, KUBEDB_PG_MEDIUM)
        .await;

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
    forget_stand_in_database(&database).await;
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubedb_postgres_lifecycle_on_the_fake() {
    let (cluster, _dir, kubeconfig) = fake().await;
    kubedb_postgres(&cluster, &kubeconfig, "team-a").await;
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
