//! The shared-server catalog (catalogs/shared) end to end through the OSB API, against the real
//! PostgreSQL, MariaDB/MySQL and Redis servers of this machine (scripts/test starts them and sets
//! BROKKR_TEST_{POSTGRES,MYSQL,REDIS}_URL): provision, bind, use the credentials with a real
//! client, isolation between bindings and instances, unbind, deprovision, and a server that is
//! down.

#[macro_use]
mod harness;

use harness::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::{Connection, MySqlConnection, PgConnection};

const SHARED: &str = include_str!("../../../catalogs/shared/shared.yaml");
const PG: (&str, &str) = (
    "6f1c2b8e-3d4a-4e5f-9a0b-1c2d3e4f5a61",
    "0a8f7e6d-5c4b-4a39-8271-6f5e4d3c2b11",
);
const PG_STANDARD: &str = "0a8f7e6d-5c4b-4a39-8271-6f5e4d3c2b12";
const MYSQL: (&str, &str) = (
    "6f1c2b8e-3d4a-4e5f-9a0b-1c2d3e4f5a62",
    "1b9a8f7e-6d5c-4b4a-9382-7a6f5e4d3c21",
);
const REDIS: (&str, &str) = (
    "6f1c2b8e-3d4a-4e5f-9a0b-1c2d3e4f5a63",
    "2c0b9a8f-7e6d-4c5b-8493-8b7a6f5e4d31",
);

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

fn pg_admin() -> String {
    env_or(
        "BROKKR_TEST_POSTGRES_URL",
        "postgres://brokkr:brokkr@127.0.0.1:5432/brokkr_test",
    )
}

fn mysql_admin() -> String {
    env_or(
        "BROKKR_TEST_MYSQL_URL",
        "mysql://brokkr:brokkr@127.0.0.1:3306/mysql",
    )
}

fn redis_admin() -> String {
    env_or("BROKKR_TEST_REDIS_URL", "redis://127.0.0.1:6379")
}

/// A broker serving the shared catalog, its admin URLs in files of `dir`.
async fn broker(dir: &tempfile::TempDir, tweak: impl Fn(String) -> String) -> TestBroker {
    let mut yaml = SHARED.to_owned();
    for (var, url) in [
        ("BROKKR_SHARED_PG_URL", pg_admin()),
        ("BROKKR_SHARED_MYSQL_URL", mysql_admin()),
        ("BROKKR_SHARED_REDIS_URL", redis_admin()),
    ] {
        let file = dir.path().join(var);
        std::fs::write(&file, url).unwrap();
        yaml = yaml.replace(
            &format!("url_env: {var}"),
            &format!("url_file: {}", file.display()),
        );
    }
    start_with(Backend::Sqlite, &tweak(yaml)).await
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4())
}

impl TestBroker {
    async fn provision_ok(&self, (service, plan): (&str, &str), id: &str, params: Value) {
        let r = self
            .put(
                &format!("/v2/service_instances/{id}?accepts_incomplete=true"),
                json!({"organization_guid": "org", "space_guid": "space", "service_id": service, "plan_id": plan, "parameters": params}),
            )
            .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
        let done = self
            .wait_done(&format!("/v2/service_instances/{id}/last_operation"))
            .await;
        assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
    }

    /// Binds and returns the credentials.
    async fn bind_ok(
        &self,
        (service, plan): (&str, &str),
        id: &str,
        b: &str,
        params: Value,
    ) -> Value {
        let path = format!("/v2/service_instances/{id}/service_bindings/{b}");
        let r = self
            .put(
                &format!("{path}?accepts_incomplete=true"),
                json!({"organization_guid": "org", "space_guid": "space", "service_id": service, "plan_id": plan, "parameters": params}),
            )
            .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
        let done = self.wait_done(&format!("{path}/last_operation")).await;
        assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
        let fetched = self.get(&path).await;
        assert_eq!(fetched.status, StatusCode::OK);
        fetched.body["credentials"].clone()
    }

    async fn unbind_ok(&self, (service, plan): (&str, &str), id: &str, b: &str) {
        let path = format!("/v2/service_instances/{id}/service_bindings/{b}");
        let r = self
            .delete(&format!(
                "{path}?accepts_incomplete=true&service_id={service}&plan_id={plan}"
            ))
            .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
        let done = self.wait_done(&format!("{path}/last_operation")).await;
        assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
    }

    async fn deprovision_ok(&self, (service, plan): (&str, &str), id: &str) -> Reply {
        let r = self
            .delete(&format!(
                "/v2/service_instances/{id}?accepts_incomplete=true&service_id={service}&plan_id={plan}"
            ))
            .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
        let done = self
            .wait_done(&format!("/v2/service_instances/{id}/last_operation"))
            .await;
        assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
        done
    }
}

fn s<'a>(credentials: &'a Value, key: &str) -> &'a str {
    credentials[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} in {credentials}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgresql_databases_and_roles_per_binding() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(&dir, |y| y).await;
    let (a, b) = (unique("pg-a"), unique("pg-b"));
    broker
        .provision_ok(PG, &a, json!({"extensions": ["citext"]}))
        .await;
    broker.provision_ok(PG, &b, json!({})).await;

    let rw = broker.bind_ok(PG, &a, "writer", json!({})).await;
    assert_eq!(rw["type"], "postgresql");
    assert_eq!(rw["provider"], "brokkr");
    assert_eq!(rw["port"], 5432);
    assert!(s(&rw, "jdbc-url").starts_with("jdbc:postgresql://"));
    let mut writer = PgConnection::connect(s(&rw, "uri"))
        .await
        .expect("writer connects");
    sqlx::raw_sql(
        "CREATE TABLE orders (id int, note citext); INSERT INTO orders VALUES (1, 'Hello')",
    )
    .execute(&mut writer)
    .await
    .expect("a read-write binding creates tables (citext from the extensions parameter)");

    let ro = broker
        .bind_ok(PG, &a, "reader", json!({"access": "read-only"}))
        .await;
    let mut reader = PgConnection::connect(s(&ro, "uri"))
        .await
        .expect("reader connects");
    let note: String = sqlx::query_scalar("SELECT note::text FROM orders WHERE note = 'hello'")
        .fetch_one(&mut reader)
        .await
        .expect("the reader sees the writer's data");
    assert_eq!(note, "Hello");
    let denied = sqlx::query("INSERT INTO orders VALUES (2, 'x')")
        .execute(&mut reader)
        .await;
    assert!(denied.is_err(), "a read-only binding cannot write");
    // Tables created later are readable too (default privileges).
    sqlx::raw_sql("CREATE TABLE later (n int); INSERT INTO later VALUES (7)")
        .execute(&mut writer)
        .await
        .unwrap();
    let n: i32 = sqlx::query_scalar("SELECT n FROM later")
        .fetch_one(&mut reader)
        .await
        .unwrap();
    assert_eq!(n, 7);

    // A second writer shares the data (objects belong to the owner role).
    let rw2 = broker.bind_ok(PG, &a, "writer2", json!({})).await;
    let mut writer2 = PgConnection::connect(s(&rw2, "uri")).await.unwrap();
    sqlx::query("INSERT INTO orders VALUES (3, 'more')")
        .execute(&mut writer2)
        .await
        .unwrap();

    // Instance B's binding cannot reach A's database.
    let other = broker.bind_ok(PG, &b, "writer", json!({})).await;
    let mut cross = other.clone();
    cross["uri"] =
        Value::String(s(&other, "uri").replace(s(&other, "database"), s(&rw, "database")));
    assert!(
        PgConnection::connect(s(&cross, "uri")).await.is_err(),
        "a binding of B cannot connect to A's database"
    );

    // Unbind: the role is gone and its credentials are refused.
    writer.close().await.ok();
    broker.unbind_ok(PG, &a, "writer").await;
    assert!(
        PgConnection::connect(s(&rw, "uri")).await.is_err(),
        "unbound credentials refused"
    );

    // Deprovision with bindings left: the database, its owner and every binding role are gone.
    drop((reader, writer2));
    broker.deprovision_ok(PG, &a).await;
    let mut admin = PgConnection::connect(&pg_admin()).await.unwrap();
    let db_left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname = $1")
        .bind(s(&rw, "database"))
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(db_left, 0, "the database is dropped");
    let roles_left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_roles WHERE rolname = ANY($1)")
            .bind(vec![
                s(&rw, "username"),
                s(&ro, "username"),
                s(&rw2, "username"),
            ])
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert_eq!(roles_left, 0, "every role of the instance is dropped");
    broker.deprovision_ok(PG, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgresql_plan_update_changes_the_connection_limit() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(&dir, |y| y).await;
    let id = unique("pg-up");
    broker.provision_ok(PG, &id, json!({})).await;
    let creds = broker.bind_ok(PG, &id, "app", json!({})).await;
    let limit = async |db: &str| -> i32 {
        let mut admin = PgConnection::connect(&pg_admin()).await.unwrap();
        sqlx::query_scalar("SELECT datconnlimit FROM pg_database WHERE datname = $1")
            .bind(db)
            .fetch_one(&mut admin)
            .await
            .unwrap()
    };
    assert_eq!(limit(s(&creds, "database")).await, 10);
    let r = broker
        .patch(
            &format!("/v2/service_instances/{id}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": PG.0, "plan_id": PG_STANDARD}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{:?}", r.body);
    let done = broker
        .wait_done(&format!("/v2/service_instances/{id}/last_operation"))
        .await;
    assert_eq!(done.body["state"], "succeeded", "{:?}", done.body);
    assert_eq!(limit(s(&creds, "database")).await, 50);
    broker.unbind_ok((PG.0, PG_STANDARD), &id, "app").await;
    broker.deprovision_ok((PG.0, PG_STANDARD), &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_databases_and_users_per_binding() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(&dir, |y| y).await;
    let (a, b) = (unique("my-a"), unique("my-b"));
    broker.provision_ok(MYSQL, &a, json!({})).await;
    broker.provision_ok(MYSQL, &b, json!({})).await;

    let rw = broker.bind_ok(MYSQL, &a, "writer", json!({})).await;
    assert_eq!(rw["type"], "mysql");
    assert!(s(&rw, "jdbc-url").starts_with("jdbc:mysql://"));
    let mut writer = MySqlConnection::connect(s(&rw, "uri"))
        .await
        .expect("writer connects");
    sqlx::raw_sql(
        "CREATE TABLE orders (id int, note text); INSERT INTO orders VALUES (1, 'hello')",
    )
    .execute(&mut writer)
    .await
    .expect("a read-write binding creates tables");

    let ro = broker
        .bind_ok(MYSQL, &a, "reader", json!({"access": "read-only"}))
        .await;
    let mut reader = MySqlConnection::connect(s(&ro, "uri"))
        .await
        .expect("reader connects");
    let note: String = sqlx::query_scalar("SELECT note FROM orders")
        .fetch_one(&mut reader)
        .await
        .unwrap();
    assert_eq!(note, "hello");
    assert!(
        sqlx::query("INSERT INTO orders VALUES (2, 'x')")
            .execute(&mut reader)
            .await
            .is_err(),
        "a read-only binding cannot write"
    );

    let other = broker.bind_ok(MYSQL, &b, "writer", json!({})).await;
    let mut cross = MySqlConnection::connect(s(&other, "uri")).await.unwrap();
    let sql = format!("SELECT note FROM `{}`.orders", s(&rw, "database"));
    assert!(
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_one(&mut cross)
            .await
            .is_err(),
        "a binding of B cannot read A's database"
    );

    writer.close().await.ok();
    broker.unbind_ok(MYSQL, &a, "writer").await;
    assert!(
        MySqlConnection::connect(s(&rw, "uri")).await.is_err(),
        "unbound credentials refused"
    );

    drop((reader, cross));
    broker.deprovision_ok(MYSQL, &a).await;
    let mut admin = MySqlConnection::connect(&mysql_admin()).await.unwrap();
    let dbs: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
    )
    .bind(s(&rw, "database"))
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(dbs, 0, "the database is dropped");
    let users: i64 = sqlx::query_scalar("SELECT count(*) FROM mysql.user WHERE User IN (?, ?)")
        .bind(s(&rw, "username"))
        .bind(s(&ro, "username"))
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(
        users, 0,
        "every user of the instance is dropped, the one left bound too"
    );
    broker.deprovision_ok(MYSQL, &b).await;
}

async fn redis_login(credentials: &Value) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(s(credentials, "uri"))?;
    client.get_multiplexed_async_connection().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_acl_users_confined_to_the_instance_prefix() {
    use redis::AsyncCommands;
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(&dir, |y| y).await;
    let (a, b) = (unique("rd-a"), unique("rd-b"));
    broker.provision_ok(REDIS, &a, json!({})).await;
    broker.provision_ok(REDIS, &b, json!({})).await;

    let rw = broker.bind_ok(REDIS, &a, "writer", json!({})).await;
    assert_eq!(rw["type"], "redis");
    let prefix = s(&rw, "key-prefix").to_owned();
    let mut writer = redis_login(&rw).await.expect("writer logs in");
    let key = format!("{prefix}greeting");
    let _: () = writer
        .set(&key, "hello")
        .await
        .expect("writes under its prefix");
    let outside: redis::RedisResult<()> = writer.set("elsewhere", "x").await;
    assert!(outside.is_err(), "no keys outside the prefix");

    let ro = broker
        .bind_ok(REDIS, &a, "reader", json!({"access": "read-only"}))
        .await;
    let mut reader = redis_login(&ro).await.unwrap();
    let got: String = reader
        .get(&key)
        .await
        .expect("the reader sees the writer's data");
    assert_eq!(got, "hello");
    let write: redis::RedisResult<()> = reader.set(&key, "changed").await;
    assert!(write.is_err(), "a read-only binding cannot write");

    let other = broker.bind_ok(REDIS, &b, "writer", json!({})).await;
    let mut cross = redis_login(&other).await.unwrap();
    let read: redis::RedisResult<Option<String>> = cross.get(&key).await;
    assert!(read.is_err(), "a binding of B cannot read A's keys");

    broker.unbind_ok(REDIS, &a, "writer").await;
    assert!(
        redis_login(&rw).await.is_err(),
        "unbound credentials refused"
    );

    broker.deprovision_ok(REDIS, &a).await;
    let mut admin = redis::Client::open(redis_admin())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let exists: bool = admin.exists(&key).await.unwrap();
    assert!(!exists, "the instance's keys are removed");
    let users: Vec<String> = redis::cmd("ACL")
        .arg("USERS")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(
        !users
            .iter()
            .any(|u| u == s(&rw, "username") || u == s(&ro, "username")),
        "every user of the instance is deleted: {users:?}"
    );
    broker.deprovision_ok(REDIS, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_is_down_fails_provision_after_the_step_budget() {
    let dir = tempfile::tempdir().unwrap();
    // Port 9 (discard) on loopback: nothing listens there.
    let down = dir.path().join("down-url");
    std::fs::write(&down, "postgres://brokkr:brokkr@127.0.0.1:9/postgres").unwrap();
    let broker = broker(&dir, |y| {
        y.replace(
            "{name: database, target: shared-pg, templates: [pg-database]}",
            "{name: database, target: shared-down, templates: [pg-database], budget: 600ms}",
        )
        .replace(
            "targets:\n",
            &format!(
                "targets:\n  shared-down: {{kind: postgres, url_file: {}, timeout: 300ms}}\n",
                down.display()
            ),
        )
    })
    .await;
    let id = unique("pg-down");
    let r = broker
        .put(
            &format!("/v2/service_instances/{id}?accepts_incomplete=true"),
            json!({"organization_guid": "org", "space_guid": "space", "service_id": PG.0, "plan_id": PG.1}),
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    let done = broker
        .wait_done(&format!("/v2/service_instances/{id}/last_operation"))
        .await;
    assert_eq!(done.body["state"], "failed", "{:?}", done.body);
    let description = done.description();
    assert!(description.contains("gave up after"), "{description}");
    assert!(
        description.contains("127.0.0.1:9"),
        "names the server: {description}"
    );
    assert!(
        !description.contains("brokkr:brokkr"),
        "no credentials: {description}"
    );
    // Deprovision never blocks on the server: the step is skipped after its budget.
    let done = broker.deprovision_ok(PG, &id).await;
    assert_eq!(done.body["state"], "succeeded");
}

/// The name an id-derived name had when `safe_name` passed valid names through unchanged: a
/// tenant could choose its instance id so that its database name equalled another's.
fn passthrough_name(text: &str) -> String {
    use sha2::Digest as _;
    let readable: String = text
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_') => c,
            _ => '_',
        })
        .collect();
    let digest = sha2::Sha256::digest(text.as_bytes());
    let hex: String = digest[..5].iter().map(|b| format!("{b:02x}")).collect();
    format!("{readable}_{hex}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_instance_id_crafted_from_another_instances_name_reaches_nothing_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(&dir, |y| y).await;
    let victim = unique("victim");
    broker.provision_ok(PG, &victim, json!({})).await;
    let mine = broker.bind_ok(PG, &victim, "app", json!({})).await;
    let mut app = PgConnection::connect(s(&mine, "uri")).await.unwrap();
    sqlx::raw_sql("CREATE TABLE secrets (v text); INSERT INTO secrets VALUES ('ssn')")
        .execute(&mut app)
        .await
        .unwrap();

    // The attack of a name that maps to the victim's: `db_` + crafted == the victim's old name.
    let crafted = passthrough_name(&format!("db_{victim}"))
        .strip_prefix("db_")
        .unwrap()
        .to_owned();
    broker.provision_ok(PG, &crafted, json!({})).await;
    let theirs = broker.bind_ok(PG, &crafted, "thief", json!({})).await;
    assert_ne!(theirs["database"], mine["database"]);
    let mut thief = PgConnection::connect(s(&theirs, "uri")).await.unwrap();
    assert!(
        sqlx::raw_sql("SELECT * FROM secrets")
            .execute(&mut thief)
            .await
            .is_err(),
        "the crafted instance sees no table of the victim's"
    );
    thief.close().await.ok();
    broker.deprovision_ok(PG, &crafted).await;

    let rows: Vec<String> = sqlx::query_scalar("SELECT v FROM secrets")
        .fetch_all(&mut app)
        .await
        .expect("the victim's binding still works after the crafted instance is gone");
    assert_eq!(rows, ["ssn"]);
    app.close().await.ok();
    broker.deprovision_ok(PG, &victim).await;
}
