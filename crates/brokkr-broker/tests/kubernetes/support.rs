//! What the flows share: the manifests catalog and its plan ids, a broker on a catalog that
//! reaches the cluster through a kubeconfig, the PostgreSQL server that stands in for an
//! instance's own, the names the catalogs give objects, and polling.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use sha2::{Digest, Sha256};
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

use crate::harness::{Backend, Reply, TestBroker, start_with};

pub(crate) const MANIFESTS: &str = include_str!("../../../../catalogs/manifests/manifests.yaml");
pub(crate) const PG: &str = "7a1d0c52-9f3e-4b8a-a1c4-5d2e6f7a8b01";
pub(crate) const PG_SMALL: &str = "7a1d0c52-9f3e-4b8a-a1c4-5d2e6f7a8b11";
pub(crate) const PG_MEDIUM: &str = "7a1d0c52-9f3e-4b8a-a1c4-5d2e6f7a8b12";

/// The admin URL of the PostgreSQL server that stands in for an instance's own server (which
/// the broker, outside the cluster, cannot reach): the test server (BROKKR_TEST_POSTGRES_URL,
/// as scripts/test sets it).
fn stand_in_admin_url() -> String {
    std::env::var("BROKKR_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://brokkr:brokkr@127.0.0.1:5432/brokkr_test".into())
}

/// The stand-in server's host, port and admin login.
pub(crate) fn stand_in_postgres() -> (String, u16, String, String) {
    let url = reqwest::Url::parse(&stand_in_admin_url()).unwrap();
    let host = url.host_str().unwrap().to_owned();
    let port = url.port().unwrap_or(5432);
    let password = url.password().unwrap_or_default().to_owned();
    (host, port, url.username().to_owned(), password)
}

/// A database name of a flow's own on the stand-in server.
pub(crate) fn stand_in_database() -> String {
    format!("app_{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// The manifests catalog with its PostgreSQL plans' database and binding users made on the
/// stand-in server (in a cluster, the instance's own at `<name>.<namespace>.svc:5432`, as
/// `postgres`) in `database`. The credentials still name the instance's Service.
pub(crate) fn manifests_at_stand_in(database: &str) -> String {
    let (host, port, user, password) = stand_in_postgres();
    let server = "          server: &pg-server
            host: \"{{ registry('host') }}\"
            port: 5432
            username: postgres
            password: \"{{ registry('password') }}\"
";
    let registry = "        - {name: database, value: app}
      steps:
        - {name: server, target: cluster, templates: [pg-secret,";
    assert!(MANIFESTS.contains(server) && MANIFESTS.contains(registry));
    MANIFESTS
        .replace(
            server,
            &format!(
                "          server: &pg-server
            host: {host}
            port: {port}
            username: {user}
            password: {}
",
                serde_json::to_string(&password).unwrap()
            ),
        )
        .replace(
            registry,
            &registry.replace("value: app}", &format!("value: {database}}}")),
        )
}

/// Removes what a flow's instance left on the stand-in server: its database and owner role
/// (in a cluster, they go with the instance's server).
pub(crate) async fn forget_stand_in_database(database: &str) {
    as_admin(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)")).await;
    as_admin(&format!("DROP ROLE IF EXISTS {database}_owner")).await;
}

/// Runs `sql` as the stand-in server's admin, in its admin database.
pub(crate) async fn as_admin(sql: &str) -> Vec<String> {
    let mut conn = PgConnection::connect(&stand_in_admin_url()).await.unwrap();
    let rows: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_all(&mut conn)
        .await
        .unwrap();
    rows.into_iter().map(|(r,)| r).collect()
}

/// Connects to `database` on `host` as a binding's user: `host` the stand-in's, or the one
/// the credentials name.
pub(crate) async fn login_at(
    host: Option<(&str, u16)>,
    credentials: &Value,
) -> Result<PgConnection, sqlx::Error> {
    let (host, port) = host.unwrap_or_else(|| {
        (
            credentials["host"].as_str().unwrap(),
            u16::try_from(credentials["port"].as_u64().unwrap()).unwrap(),
        )
    });
    let options = PgConnectOptions::new()
        .host(host)
        .port(port)
        .username(credentials["username"].as_str().unwrap())
        .password(credentials["password"].as_str().unwrap())
        .database(credentials["database"].as_str().unwrap());
    PgConnection::connect_with(&options).await
}

/// Connects as a binding's user where its credentials say.
pub(crate) async fn login(credentials: &Value) -> Result<PgConnection, sqlx::Error> {
    login_at(None, credentials).await
}

/// Polls `probe` until it returns something (60 s at most).
pub(crate) async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    probe: impl Fn() -> F,
) -> T {
    for _ in 0..600 {
        if let Some(found) = probe().await {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("gave up waiting");
}

/// The name the catalogs give an instance's objects.
pub(crate) fn object_name(prefix: &str, instance_id: &str) -> String {
    let hash: String = Sha256::digest(instance_id.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{prefix}-{}", &hash[..12])
}

/// The name the catalogs give a binding's Secret.
pub(crate) fn binding_secret(name: &str, binding_id: &str) -> String {
    let hash: String = Sha256::digest(binding_id.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{name}-b-{}", &hash[..10])
}

/// A broker on SQLite serving `catalog`, whose kubernetes target reaches the cluster through
/// `kubeconfig`.
pub(crate) async fn broker(catalog: &str, kubeconfig: &str) -> TestBroker {
    let yaml = catalog.replace(
        "    kind: kubernetes\n",
        &format!("    kind: kubernetes\n    kubeconfig: {kubeconfig}\n"),
    );
    start_with(Backend::Sqlite, &yaml).await
}

impl TestBroker {
    /// Binds `b` to `instance` with the request `body`, waits until the bind is done and returns
    /// the binding's credentials.
    pub(crate) async fn bind(&self, instance: &str, b: &str, body: Value) -> Value {
        let binding = format!("{instance}/service_bindings/{b}");
        let r = self
            .put(&format!("{binding}?accepts_incomplete=true"), body)
            .await;
        assert!(r.status.is_success(), "{:?}", r.body);
        ok(&self.poll(&format!("{binding}/last_operation"), None).await);
        self.get(&binding).await.body["credentials"].clone()
    }

    /// Unbinds `b` of `instance`, of `service` and `plan`, and waits until it is done.
    pub(crate) async fn unbind(&self, instance: &str, b: &str, service: &str, plan: &str) {
        let binding = format!("{instance}/service_bindings/{b}");
        let r = self
            .delete(&format!(
                "{binding}?accepts_incomplete=true&service_id={service}&plan_id={plan}"
            ))
            .await;
        assert!(r.status.is_success(), "{:?}", r.body);
        ok(&self.poll(&format!("{binding}/last_operation"), None).await);
    }

    /// Polls a last_operation until it is terminal (`timeout` at most), or until its
    /// description contains `until`.
    pub(crate) async fn poll(&self, path: &str, until: Option<&str>) -> Reply {
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

/// Asserts that an operation succeeded.
pub(crate) fn ok(r: &Reply) {
    assert_eq!(r.body["state"], "succeeded", "{:?}", r.body);
}

/// Decodes every entry of a Secret's `data`.
pub(crate) fn entries(secret: &Value) -> serde_json::Map<String, Value> {
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
