//! The shared-server catalog (catalogs/shared) end to end through the OSB API, against the real
//! PostgreSQL, MariaDB/MySQL and Redis servers of this machine (scripts/test starts them and sets
//! BROKKR_TEST_{POSTGRES,MYSQL,REDIS}_URL): provision, bind, use the credentials with a real
//! client, isolation between bindings and instances, names and records that tell a bound user
//! no ids, instances made with the names and records of earlier releases, binding rotation,
//! unbind, deprovision, and a server that is down.

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
    start_with(Backend::Sqlite, &tweak(shared(dir))).await
}

/// The shared catalog, its admin URLs in files of `dir`.
fn shared(dir: &tempfile::TempDir) -> String {
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
    yaml
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

    /// Binds `b` as the successor of `predecessor` (no parameters: it takes the predecessor's)
    /// and returns the credentials.
    async fn rotate_ok(
        &self,
        (service, plan): (&str, &str),
        id: &str,
        b: &str,
        predecessor: &str,
    ) -> Value {
        let path = format!("/v2/service_instances/{id}/service_bindings/{b}");
        let r = self
            .put(
                &format!("{path}?accepts_incomplete=true"),
                json!({"service_id": service, "plan_id": plan, "predecessor_binding_id": predecessor}),
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

    // Closed, not dropped: the server has ended their sessions before the database is dropped.
    reader.close().await.unwrap();
    cross.close().await.unwrap();
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

/// The shared catalog as it named things before `opaque_name`: from the ids, readable.
fn old_names(yaml: String) -> String {
    let old = yaml
        .replace(
            "opaque_name('u_', [instance_id, binding_id], 32)",
            "safe_name('u_' ~ binding_id ~ '_' ~ sha256(instance_id)[:8], 32)",
        )
        .replace(
            "opaque_name('u_', [instance_id, binding_id])",
            "safe_name('u_' ~ binding_id ~ '_' ~ sha256(instance_id)[:8])",
        )
        .replace(
            "opaque_name('db_', instance_id)",
            "safe_name('db_' ~ instance_id, 40)",
        )
        .replace(
            "opaque_name('own_', instance_id)",
            "safe_name('own_' ~ instance_id)",
        )
        .replace(
            "opaque_name('i_', instance_id)",
            "safe_name('i_' ~ instance_id)",
        );
    assert!(!old.contains("{{ opaque_name"), "every name is replaced");
    old
}

/// The forms in which `id` could show in a name or record: itself, sanitized as `safe_name`
/// did, its UUID's first group, and the start of its SHA-256.
fn id_forms(id: &str) -> Vec<String> {
    use sha2::Digest as _;
    let uuid = &id[id.len() - 36..];
    let digest = sha2::Sha256::digest(id.as_bytes());
    let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    vec![
        id.to_owned(),
        id.replace('-', "_"),
        uuid[..8].to_owned(),
        hex,
    ]
}

/// Panics when `seen` (what `who` could see) shows any form of any of `ids`.
fn assert_tells_no_ids(who: &str, seen: &str, ids: &[&str]) {
    for id in ids {
        for form in id_forms(id) {
            assert!(
                !seen.contains(&form),
                "{who} sees {form:?} (from id {id:?}) in: {seen}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bound_users_see_no_instance_or_binding_ids() {
    use redis::AsyncCommands;
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(&dir, |y| y).await;
    let (a, b) = (unique("pg-a"), unique("pg-b"));
    let (ba, bb) = (unique("bind"), unique("bind"));
    broker.provision_ok(PG, &a, json!({})).await;
    broker.provision_ok(PG, &b, json!({})).await;
    let mine = broker.bind_ok(PG, &a, &ba, json!({})).await;
    broker.bind_ok(PG, &b, &bb, json!({})).await;
    let ids = [a.as_str(), b.as_str(), ba.as_str(), bb.as_str()];
    assert_tells_no_ids("the credentials", &mine.to_string(), &ids);

    // PostgreSQL shows every database, every role and every comment on them to anyone.
    let mut app = PgConnection::connect(s(&mine, "uri")).await.unwrap();
    let catalogs: Vec<String> = sqlx::query_scalar(
        "SELECT datname::text || ' ' || coalesce(shobj_description(oid, 'pg_database'), '') \
           FROM pg_database \
         UNION ALL \
         SELECT rolname::text || ' ' || coalesce(shobj_description(oid, 'pg_authid'), '') \
           FROM pg_roles",
    )
    .fetch_all(&mut app)
    .await
    .unwrap();
    let seen = catalogs.join("\n");
    assert!(
        seen.contains(s(&mine, "database")),
        "the listing is complete"
    );
    assert_tells_no_ids("a PostgreSQL binding", &seen, &ids);
    app.close().await.ok();
    broker.deprovision_ok(PG, &a).await;
    broker.deprovision_ok(PG, &b).await;

    // MySQL and MariaDB show a user its own databases; brokkr's records are the admin's only,
    // and name no ids either.
    let (a, b) = (unique("my-a"), unique("my-b"));
    let (ba, bb) = (unique("bind"), unique("bind"));
    broker.provision_ok(MYSQL, &a, json!({})).await;
    broker.provision_ok(MYSQL, &b, json!({})).await;
    let mine = broker.bind_ok(MYSQL, &a, &ba, json!({})).await;
    let theirs = broker.bind_ok(MYSQL, &b, &bb, json!({})).await;
    let ids = [a.as_str(), b.as_str(), ba.as_str(), bb.as_str()];
    assert_tells_no_ids("the credentials", &mine.to_string(), &ids);
    let mut app = MySqlConnection::connect(s(&mine, "uri")).await.unwrap();
    let mut seen: Vec<String> =
        sqlx::query_scalar("SELECT SCHEMA_NAME FROM information_schema.SCHEMATA")
            .fetch_all(&mut app)
            .await
            .unwrap();
    seen.push(
        sqlx::query_scalar("SELECT CURRENT_USER()")
            .fetch_one(&mut app)
            .await
            .unwrap(),
    );
    assert!(
        sqlx::query("SELECT owner FROM _brokkr.owners")
            .fetch_all(&mut app)
            .await
            .is_err(),
        "brokkr's records are not the bindings' to read"
    );
    assert_tells_no_ids("a MySQL binding", &seen.join("\n"), &ids);
    app.close().await.ok();
    let mut admin = MySqlConnection::connect(&mysql_admin()).await.unwrap();
    let records: Vec<String> =
        sqlx::query_scalar("SELECT owner FROM _brokkr.owners WHERE name IN (?, ?, ?, ?)")
            .bind(s(&mine, "database"))
            .bind(s(&mine, "username"))
            .bind(s(&theirs, "database"))
            .bind(s(&theirs, "username"))
            .fetch_all(&mut admin)
            .await
            .unwrap();
    assert_eq!(records.len(), 4, "{records:?}");
    assert_tells_no_ids("MySQL's owner records", &records.join("\n"), &ids);
    broker.deprovision_ok(MYSQL, &a).await;
    broker.deprovision_ok(MYSQL, &b).await;

    // Redis: a binding sees its own user name and key prefix (its credentials) and nothing of
    // others' (see redis_bindings_learn_nothing_about_other_instances); the records name no ids.
    let (a, b) = (unique("rd-a"), unique("rd-b"));
    let (ba, bb) = (unique("bind"), unique("bind"));
    broker.provision_ok(REDIS, &a, json!({})).await;
    broker.provision_ok(REDIS, &b, json!({})).await;
    let mine = broker.bind_ok(REDIS, &a, &ba, json!({})).await;
    let theirs = broker.bind_ok(REDIS, &b, &bb, json!({})).await;
    let ids = [a.as_str(), b.as_str(), ba.as_str(), bb.as_str()];
    assert_tells_no_ids("the credentials", &mine.to_string(), &ids);
    let mut admin = redis::Client::open(redis_admin())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut records = Vec::new();
    for credentials in [&mine, &theirs] {
        let prefix = s(credentials, "key-prefix").trim_end_matches(':');
        for field in [
            format!("prefix:{prefix}"),
            format!("user:{}", s(credentials, "username")),
        ] {
            let record: String = admin.hget("{brokkr}:owners", &field).await.unwrap();
            records.push(record);
        }
    }
    assert_tells_no_ids("Redis's owner records", &records.join("\n"), &ids);
    broker.deprovision_ok(REDIS, &a).await;
    broker.deprovision_ok(REDIS, &b).await;
}

/// Rewrites the owner records of an instance's database (or prefix) `of` and of its binding's
/// `user` in the form brokkr wrote before marks, with the ids.
async fn make_records_old(server: &str, of: &str, user: &str, instance: &str, binding: &str) {
    let instance_record = json!({"of": of, "instance": instance}).to_string();
    let binding_record = json!({"of": of, "instance": instance, "binding": binding}).to_string();
    match server {
        "postgres" => {
            let mut admin = PgConnection::connect(&pg_admin()).await.unwrap();
            let owner: String = sqlx::query_scalar(
                "SELECT pg_get_userbyid(datdba)::text FROM pg_database WHERE datname = $1",
            )
            .bind(of)
            .fetch_one(&mut admin)
            .await
            .unwrap();
            for (role, record) in [(owner.as_str(), &instance_record), (user, &binding_record)] {
                let comment: String = sqlx::query_scalar(
                    "SELECT format('COMMENT ON ROLE %I IS %L', $1::text, $2::text)",
                )
                .bind(role)
                .bind(record)
                .fetch_one(&mut admin)
                .await
                .unwrap();
                sqlx::raw_sql(sqlx::AssertSqlSafe(comment))
                    .execute(&mut admin)
                    .await
                    .unwrap();
            }
        }
        "mysql" => {
            let mut admin = MySqlConnection::connect(&mysql_admin()).await.unwrap();
            for (kind, name, record) in [
                ("database", of, &instance_record),
                ("user", user, &binding_record),
            ] {
                let done =
                    sqlx::query("UPDATE _brokkr.owners SET owner = ? WHERE kind = ? AND name = ?")
                        .bind(record)
                        .bind(kind)
                        .bind(name)
                        .execute(&mut admin)
                        .await
                        .unwrap();
                assert_eq!(done.rows_affected(), 1, "{kind} {name}");
            }
        }
        _ => {
            use redis::AsyncCommands;
            let mut admin = redis::Client::open(redis_admin())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            for (field, record) in [
                (format!("prefix:{of}"), &instance_record),
                (format!("user:{user}"), &binding_record),
            ] {
                let new: bool = admin.hset("{brokkr}:owners", &field, record).await.unwrap();
                assert!(!new, "{field} was recorded");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_named_and_recorded_before_opaque_names_keep_working() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(&dir, old_names).await;
    let cases = [("postgres", PG), ("mysql", MYSQL), ("redis", REDIS)];
    let mut before = Vec::new();
    for (server, plan) in cases {
        let id = unique("old");
        broker.provision_ok(plan, &id, json!({})).await;
        let old = broker.bind_ok(plan, &id, "old", json!({})).await;
        let of = match server {
            "redis" => s(&old, "key-prefix").trim_end_matches(':').to_owned(),
            _ => s(&old, "database").to_owned(),
        };
        assert!(
            of.contains(&id[id.len() - 36..id.len() - 28]),
            "the old name: {of}"
        );
        make_records_old(server, &of, s(&old, "username"), &id, "old").await;
        before.push((server, plan, id, old, of));
    }

    // The upgrade: the catalog now names things with opaque_name.
    broker.replace_config(&shared(&dir));
    for (server, plan, id, old, of) in before {
        let new = broker.bind_ok(plan, &id, "new", json!({})).await;
        assert_ne!(new["username"], old["username"]);
        match server {
            "postgres" => {
                assert_eq!(s(&new, "database"), of, "the instance keeps its database");
                let mut conn = PgConnection::connect(s(&new, "uri")).await.unwrap();
                sqlx::raw_sql("CREATE TABLE t (n int)")
                    .execute(&mut conn)
                    .await
                    .unwrap();
                conn.close().await.ok();
            }
            "mysql" => {
                assert_eq!(s(&new, "database"), of, "the instance keeps its database");
                let mut conn = MySqlConnection::connect(s(&new, "uri")).await.unwrap();
                sqlx::raw_sql("CREATE TABLE t (n int)")
                    .execute(&mut conn)
                    .await
                    .unwrap();
                conn.close().await.ok();
            }
            _ => {
                assert_eq!(
                    s(&new, "key-prefix"),
                    format!("{of}:"),
                    "the instance keeps its prefix"
                );
                let mut conn = redis_login(&new).await.unwrap();
                let _: () = redis::AsyncCommands::set(&mut conn, format!("{of}:k"), 1)
                    .await
                    .unwrap();
            }
        }
        // The binding recorded the old way is unbound, its login gone.
        broker.unbind_ok(plan, &id, "old").await;
        let old_login = match server {
            "postgres" => PgConnection::connect(s(&old, "uri"))
                .await
                .map(drop)
                .is_ok(),
            "mysql" => MySqlConnection::connect(s(&old, "uri"))
                .await
                .map(drop)
                .is_ok(),
            _ => redis_login(&old).await.is_ok(),
        };
        assert!(!old_login, "{server}: the old binding's login is gone");
        // Deprovision takes the database (or keys) and the new binding's login with it.
        broker.deprovision_ok(plan, &id).await;
        let new_login = match server {
            "postgres" => PgConnection::connect(s(&new, "uri"))
                .await
                .map(drop)
                .is_ok(),
            "mysql" => MySqlConnection::connect(s(&new, "uri"))
                .await
                .map(drop)
                .is_ok(),
            _ => redis_login(&new).await.is_ok(),
        };
        assert!(!new_login, "{server}: the new binding's login is gone");
        let gone = match server {
            "postgres" => {
                let mut admin = PgConnection::connect(&pg_admin()).await.unwrap();
                sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_database WHERE datname = $1")
                    .bind(&of)
                    .fetch_one(&mut admin)
                    .await
                    .unwrap()
                    == 0
            }
            "mysql" => {
                let mut admin = MySqlConnection::connect(&mysql_admin()).await.unwrap();
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
                )
                .bind(&of)
                .fetch_one(&mut admin)
                .await
                .unwrap()
                    == 0
            }
            _ => {
                let mut admin = redis::Client::open(redis_admin())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                !redis::AsyncCommands::exists::<_, bool>(&mut admin, format!("{of}:k"))
                    .await
                    .unwrap()
            }
        };
        assert!(gone, "{server}: the instance's data is gone");
    }
}

/// What a rotation test does on one server: make data with a writer's credentials, and see
/// whether credentials log in (and read it) and whether they may write.
trait Server {
    async fn setup(&self, writer: &Value);
    async fn logs_in(&self, credentials: &Value) -> bool;
    async fn writes(&self, credentials: &Value) -> bool;
}

struct Postgres;
struct Mysql;
struct Redis;

const ROTATED_TABLE: &str = "CREATE TABLE rotated (n int); INSERT INTO rotated VALUES (1)";

impl Server for Postgres {
    async fn setup(&self, writer: &Value) {
        let mut c = PgConnection::connect(s(writer, "uri")).await.unwrap();
        sqlx::raw_sql(ROTATED_TABLE).execute(&mut c).await.unwrap();
    }
    async fn logs_in(&self, credentials: &Value) -> bool {
        match PgConnection::connect(s(credentials, "uri")).await {
            Ok(mut c) => sqlx::query("SELECT n FROM rotated")
                .execute(&mut c)
                .await
                .is_ok(),
            Err(_) => false,
        }
    }
    async fn writes(&self, credentials: &Value) -> bool {
        let mut c = PgConnection::connect(s(credentials, "uri")).await.unwrap();
        let insert = sqlx::query("INSERT INTO rotated VALUES (2)");
        insert.execute(&mut c).await.is_ok()
    }
}

impl Server for Mysql {
    async fn setup(&self, writer: &Value) {
        let mut c = MySqlConnection::connect(s(writer, "uri")).await.unwrap();
        sqlx::raw_sql(ROTATED_TABLE).execute(&mut c).await.unwrap();
    }
    async fn logs_in(&self, credentials: &Value) -> bool {
        match MySqlConnection::connect(s(credentials, "uri")).await {
            Ok(mut c) => sqlx::query("SELECT n FROM rotated")
                .execute(&mut c)
                .await
                .is_ok(),
            Err(_) => false,
        }
    }
    async fn writes(&self, credentials: &Value) -> bool {
        let mut c = MySqlConnection::connect(s(credentials, "uri"))
            .await
            .unwrap();
        let insert = sqlx::query("INSERT INTO rotated VALUES (2)");
        insert.execute(&mut c).await.is_ok()
    }
}

fn rotated_key(credentials: &Value) -> String {
    format!("{}rotated", s(credentials, "key-prefix"))
}

impl Server for Redis {
    async fn setup(&self, writer: &Value) {
        use redis::AsyncCommands;
        let mut c = redis_login(writer).await.unwrap();
        c.set::<_, _, ()>(rotated_key(writer), "1").await.unwrap();
    }
    async fn logs_in(&self, credentials: &Value) -> bool {
        use redis::AsyncCommands;
        match redis_login(credentials).await {
            Ok(mut c) => c
                .get::<_, Option<String>>(rotated_key(credentials))
                .await
                .is_ok(),
            Err(_) => false,
        }
    }
    async fn writes(&self, credentials: &Value) -> bool {
        use redis::AsyncCommands;
        let mut c = redis_login(credentials).await.unwrap();
        c.set::<_, _, ()>(rotated_key(credentials), "2")
            .await
            .is_ok()
    }
}

/// Rotates a read-only binding of a fresh instance of `plan` on `server`: the successor has a
/// new user and password and the same grants; both log in until the predecessor is unbound,
/// then only the successor.
async fn rotation_on(plan: (&str, &str), server: impl Server) {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(&dir, |y| y).await;
    let id = unique("rot");
    broker.provision_ok(plan, &id, json!({})).await;
    let writer = broker.bind_ok(plan, &id, "writer", json!({})).await;
    server.setup(&writer).await;
    let old = broker
        .bind_ok(plan, &id, "old", json!({"access": "read-only"}))
        .await;
    assert!(server.logs_in(&old).await, "the predecessor logs in");
    assert!(!server.writes(&old).await, "the predecessor is read-only");

    let new = broker.rotate_ok(plan, &id, "new", "old").await;
    assert_ne!(new["username"], old["username"], "a new user");
    assert_ne!(new["password"], old["password"], "a new password");
    let fetched = broker
        .get(&format!("/v2/service_instances/{id}/service_bindings/new"))
        .await;
    assert_eq!(
        fetched.body["parameters"],
        json!({"access": "read-only"}),
        "the successor has the predecessor's parameters"
    );
    assert!(server.logs_in(&new).await, "the successor logs in at once");
    assert!(server.logs_in(&old).await, "the predecessor still logs in");
    assert!(
        !server.writes(&new).await,
        "the successor has the predecessor's grants: read-only"
    );

    broker.unbind_ok(plan, &id, "old").await;
    assert!(
        !server.logs_in(&old).await,
        "the unbound predecessor is refused"
    );
    assert!(server.logs_in(&new).await, "the successor still logs in");

    broker.unbind_ok(plan, &id, "new").await;
    broker.unbind_ok(plan, &id, "writer").await;
    broker.deprovision_ok(plan, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgresql_bindings_rotate() {
    rotation_on(PG, Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_bindings_rotate() {
    rotation_on(MYSQL, Mysql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_bindings_rotate() {
    rotation_on(REDIS, Redis).await;
}
