//! Isolation between tenants on the shared servers of this machine, as an attacker would test
//! it: two instances given the same names never reach each other's objects, objects brokkr did
//! not create are never taken over or deleted, a Redis binding learns nothing about other
//! instances, concurrent binds of one PostgreSQL database all succeed, and no statement that
//! carries a password reaches the logs.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use brokkr_targets::mysql::Mysql;
use brokkr_targets::postgres::Postgres;
use brokkr_targets::redis::Redis;
use brokkr_targets::{AdminUrl, NamesKey, Readiness, Scope, Target, TargetError};
use serde_json::{Value, json};
use sqlx::{Connection, MySqlConnection, PgConnection};

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

fn pg_url() -> String {
    env_or(
        "BROKKR_TEST_POSTGRES_URL",
        "postgres://brokkr:brokkr@127.0.0.1:5432/brokkr_test",
    )
}

fn mysql_url() -> String {
    env_or(
        "BROKKR_TEST_MYSQL_URL",
        "mysql://brokkr:brokkr@127.0.0.1:3306/mysql",
    )
}

fn redis_url() -> String {
    env_or("BROKKR_TEST_REDIS_URL", "redis://127.0.0.1:6379")
}

fn tag() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..10].to_owned()
}

const TIMEOUT: Duration = Duration::from_secs(10);

fn scope<'a>(instance: &'a str, binding: Option<&'a str>) -> Scope<'a> {
    Scope {
        instance_id: instance,
        binding_id: binding,
        service_id: "s",
        plan_id: "p",
        step: "step",
        context: &Value::Null,
        names_key: names_key(),
    }
}

/// The names key of this test's broker.
fn names_key() -> &'static NamesKey {
    static KEY: OnceLock<NamesKey> = OnceLock::new();
    KEY.get_or_init(NamesKey::generate)
}

fn postgres() -> Postgres {
    Postgres::new("pg", &AdminUrl::parse("pg", &pg_url()).unwrap(), TIMEOUT).unwrap()
}

fn mysql() -> Mysql {
    Mysql::new("my", &AdminUrl::parse("my", &mysql_url()).unwrap(), TIMEOUT).unwrap()
}

fn redis() -> Redis {
    Redis::new("r", &AdminUrl::parse("r", &redis_url()).unwrap(), TIMEOUT).unwrap()
}

/// Asserts `result` is brokkr refusing to take over something it did not create.
fn refused(result: Result<(), TargetError>, what: &str) {
    match result {
        Err(TargetError::Invalid(m))
            if m.contains("not created by brokkr") || m.contains("is not one brokkr created") => {}
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

async fn pg_admin() -> PgConnection {
    PgConnection::connect(&pg_url()).await.unwrap()
}

async fn pg_count(admin: &mut PgConnection, sql: &str, name: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .bind(name)
        .fetch_one(admin)
        .await
        .unwrap()
}

/// `url` with its login replaced by `user` and `password`.
fn with_login(url: &str, user: &str, password: &str) -> String {
    let mut url = url::Url::parse(url).unwrap();
    url.set_username(user).unwrap();
    url.set_password(Some(password)).unwrap();
    url.to_string()
}

/// An admin login the server refuses (a Service pointed at another tenant's server, a removed
/// admin) fails the step in the server's words, never with the password.
#[tokio::test]
async fn an_admin_login_the_server_refuses_is_said_without_the_password() {
    let t = tag();
    let user = format!("nobody_{t}");
    let password = format!("not-the-password-{t}");
    let pg = Postgres::new(
        "pg",
        &AdminUrl::parse("pg", &with_login(&pg_url(), &user, &password)).unwrap(),
        TIMEOUT,
    )
    .unwrap();
    let my = Mysql::new(
        "my",
        &AdminUrl::parse("my", &with_login(&mysql_url(), &user, &password)).unwrap(),
        TIMEOUT,
    )
    .unwrap();
    let cases: [(&dyn Target, Value, String); 2] = [
        (
            &pg,
            json!({"kind": "Database", "name": format!("db_{t}"), "owner": format!("own_{t}")}),
            // Whichever the server's authentication method says first.
            format!("\"{user}\""),
        ),
        (
            &my,
            json!({"kind": "Database", "name": format!("db_{t}")}),
            format!("Access denied for user '{user}'"),
        ),
    ];
    for (target, resource, said) in cases {
        let message = match target.apply(&resource, &scope("i", None)).await {
            Err(TargetError::Invalid(message)) => message,
            other => panic!("expected the login to be refused, got {other:?}"),
        };
        assert!(message.contains(&said), "{message}");
        assert!(message.contains("the server said: "), "{message}");
        assert!(!message.contains(" at line "), "{message}");
        assert!(!message.contains(&password), "{message}");
    }
}

#[tokio::test]
async fn postgres_never_takes_over_another_instances_objects() {
    let pg = postgres();
    let t = tag();
    let (a, b) = (format!("a-{t}"), format!("b-{t}"));
    let (db, owner, user) = (format!("db_{t}"), format!("own_{t}"), format!("u_{t}"));
    let database = json!({"kind": "Database", "name": db, "owner": owner});
    let login = json!({"kind": "User", "name": user, "password": "pw-a", "database": db});
    pg.apply(&database, &scope(&a, None)).await.unwrap();
    pg.apply(&login, &scope(&a, Some("ba"))).await.unwrap();

    // Another instance given the same names is refused, and its deprovision changes nothing.
    refused(
        pg.apply(&database, &scope(&b, None)).await,
        "database of another instance",
    );
    refused(
        pg.apply(&login, &scope(&b, Some("bb"))).await,
        "bind to another instance's database",
    );
    // Another binding of the same instance cannot take over the first one's role.
    let stolen = json!({"kind": "User", "name": user, "password": "pw-x", "database": db});
    refused(
        pg.apply(&stolen, &scope(&a, Some("bx"))).await,
        "role of another binding",
    );
    pg.delete(&login, &scope(&b, Some("bb"))).await.unwrap();
    pg.delete(&database, &scope(&b, None)).await.unwrap();
    assert_eq!(
        pg.ready(&login, &scope(&a, Some("ba"))).await.unwrap(),
        Readiness::Ready,
        "the password was not reset and nothing was dropped"
    );

    // Roles made by hand are never adopted or dropped.
    let mut admin = pg_admin().await;
    let manual = format!("manual_{t}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE \"{manual}\" LOGIN"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    let foreign_owner = json!({"kind": "Database", "name": format!("db2_{t}"), "owner": manual});
    refused(
        pg.apply(&foreign_owner, &scope(&a, None)).await,
        "hand-made owner role",
    );
    let foreign_user = json!({"kind": "User", "name": manual, "password": "pw", "database": db});
    refused(
        pg.apply(&foreign_user, &scope(&a, Some("bm"))).await,
        "hand-made login role",
    );
    pg.delete(&foreign_user, &scope(&a, Some("bm")))
        .await
        .unwrap();
    let roles = "SELECT count(*) FROM pg_roles WHERE rolname = $1";
    assert_eq!(
        pg_count(&mut admin, roles, &manual).await,
        1,
        "a hand-made role is left alone"
    );
    let dbs = "SELECT count(*) FROM pg_database WHERE datname = $1";
    assert_eq!(pg_count(&mut admin, dbs, &format!("db2_{t}")).await, 0);

    // The owner removes everything it made, leftover binding roles included.
    pg.delete(&database, &scope(&a, None)).await.unwrap();
    assert_eq!(pg_count(&mut admin, dbs, &db).await, 0);
    assert_eq!(pg_count(&mut admin, roles, &user).await, 0);
    assert_eq!(pg_count(&mut admin, roles, &owner).await, 0);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP ROLE \"{manual}\"")))
        .execute(&mut admin)
        .await
        .unwrap();
}

#[tokio::test]
async fn postgres_concurrent_binds_of_one_instance_all_succeed() {
    let pg = Arc::new(postgres());
    let t = tag();
    let instance = format!("i-{t}");
    let db = format!("db_{t}");
    let database = json!({"kind": "Database", "name": db, "owner": format!("own_{t}")});
    pg.apply(&database, &scope(&instance, None)).await.unwrap();
    let binds = (0..20).map(|n| {
        let (pg, instance, db) = (pg.clone(), instance.clone(), db.clone());
        tokio::spawn(async move {
            let access = if n % 2 == 0 {
                "read-only"
            } else {
                "read-write"
            };
            let binding = format!("b{n}");
            let user = json!({"kind": "User", "name": format!("u{n}_{}", &db[3..]),
                              "password": format!("pw-{n}"), "database": db, "access": access});
            pg.apply(&user, &scope(&instance, Some(&binding))).await
        })
    });
    let results = futures::future::join_all(binds).await;
    let failed: Vec<_> = results
        .into_iter()
        .map(Result::unwrap)
        .filter_map(Result::err)
        .collect();
    pg.delete(&database, &scope(&instance, None)).await.unwrap();
    assert!(
        failed.is_empty(),
        "{} of 20 binds failed: {failed:?}",
        failed.len()
    );
}

#[tokio::test]
async fn mysql_never_takes_over_another_instances_objects() {
    let my = mysql();
    let t = tag();
    let (a, b) = (format!("a-{t}"), format!("b-{t}"));
    let (db, user) = (format!("db_{t}"), format!("u_{t}"));
    let database = json!({"kind": "Database", "name": db});
    let login = json!({"kind": "User", "name": user, "password": "pw-a", "database": db});
    my.apply(&database, &scope(&a, None)).await.unwrap();
    my.apply(&login, &scope(&a, Some("ba"))).await.unwrap();

    refused(
        my.apply(&database, &scope(&b, None)).await,
        "database of another instance",
    );
    refused(
        my.apply(&login, &scope(&b, Some("bb"))).await,
        "bind to another instance's database",
    );
    let stolen = json!({"kind": "User", "name": user, "password": "pw-x", "database": db});
    refused(
        my.apply(&stolen, &scope(&a, Some("bx"))).await,
        "user of another binding",
    );
    my.delete(&login, &scope(&b, Some("bb"))).await.unwrap();
    my.delete(&database, &scope(&b, None)).await.unwrap();
    assert_eq!(
        my.ready(&login, &scope(&a, Some("ba"))).await.unwrap(),
        Readiness::Ready
    );

    // Databases and users made by hand are never adopted or dropped.
    let mut admin = MySqlConnection::connect(&mysql_url()).await.unwrap();
    let (manual_db, manual_user) = (format!("mdb_{t}"), format!("mu_{t}"));
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE `{manual_db}`; CREATE USER '{manual_user}'@'%' IDENTIFIED BY 'x'"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    let foreign_db = json!({"kind": "Database", "name": manual_db});
    refused(
        my.apply(&foreign_db, &scope(&a, None)).await,
        "hand-made database",
    );
    let foreign_user =
        json!({"kind": "User", "name": manual_user, "password": "pw", "database": db});
    refused(
        my.apply(&foreign_user, &scope(&a, Some("bm"))).await,
        "hand-made user",
    );
    my.delete(&foreign_db, &scope(&a, None)).await.unwrap();
    my.delete(&foreign_user, &scope(&a, Some("bm")))
        .await
        .unwrap();
    let left: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?) \
              + (SELECT count(*) FROM mysql.user WHERE User = ?)",
    )
    .bind(&manual_db)
    .bind(&manual_user)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(left, 2, "what brokkr did not create is left alone");

    my.delete(&database, &scope(&a, None)).await.unwrap();
    let gone: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?) \
              + (SELECT count(*) FROM mysql.user WHERE User = ?)",
    )
    .bind(&db)
    .bind(&user)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(
        gone, 0,
        "the instance's database and its leftover binding user are gone"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE `{manual_db}`; DROP USER '{manual_user}'@'%'"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
}

async fn redis_conn() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A connection logged in as `user`.
async fn redis_as(user: &str, password: &str) -> redis::aio::MultiplexedConnection {
    let mut conn = redis_conn().await;
    redis::cmd("AUTH")
        .arg(user)
        .arg(password)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    conn
}

#[tokio::test]
async fn redis_never_takes_over_another_instances_objects() {
    let r = redis();
    let t = tag();
    let (a, b) = (format!("a-{t}"), format!("b-{t}"));
    let (prefix, user) = (format!("i_{t}"), format!("u_{t}"));
    let keyspace = json!({"kind": "Keyspace", "prefix": prefix});
    let login = json!({"kind": "User", "name": user, "password": "pw-a", "prefix": prefix});
    r.apply(&keyspace, &scope(&a, None)).await.unwrap();
    r.apply(&login, &scope(&a, Some("ba"))).await.unwrap();
    let mut own = redis_as(&user, "pw-a").await;
    redis::cmd("SET")
        .arg(format!("{prefix}:k"))
        .arg("v")
        .query_async::<()>(&mut own)
        .await
        .unwrap();

    refused(
        r.apply(&keyspace, &scope(&b, None)).await,
        "prefix of another instance",
    );
    refused(
        r.apply(&login, &scope(&b, Some("bb"))).await,
        "bind to another instance's prefix",
    );
    let stolen = json!({"kind": "User", "name": user, "password": "pw-x", "prefix": prefix});
    refused(
        r.apply(&stolen, &scope(&a, Some("bx"))).await,
        "user of another binding",
    );
    r.delete(&login, &scope(&b, Some("bb"))).await.unwrap();
    r.delete(&keyspace, &scope(&b, None)).await.unwrap();
    let kept: Option<String> = redis::cmd("GET")
        .arg(format!("{prefix}:k"))
        .query_async(&mut own)
        .await
        .unwrap();
    assert_eq!(
        kept.as_deref(),
        Some("v"),
        "the keys and the user are untouched"
    );

    // A user or keys made by hand are never adopted.
    let mut admin = redis_conn().await;
    let manual = format!("manual_{t}");
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&manual)
        .arg("on")
        .arg(">x")
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    let foreign_user = json!({"kind": "User", "name": manual, "password": "pw", "prefix": prefix});
    refused(
        r.apply(&foreign_user, &scope(&a, Some("bm"))).await,
        "hand-made user",
    );
    r.delete(&foreign_user, &scope(&a, Some("bm")))
        .await
        .unwrap();
    let exists: Option<redis::Value> = redis::cmd("ACL")
        .arg("GETUSER")
        .arg(&manual)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(
        exists.is_some_and(|v| v != redis::Value::Nil),
        "a hand-made user is left alone"
    );
    let used = format!("used_{t}");
    redis::cmd("SET")
        .arg(format!("{used}:k"))
        .arg("v")
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    refused(
        r.apply(
            &json!({"kind": "Keyspace", "prefix": used}),
            &scope(&a, None),
        )
        .await,
        "prefix already in use",
    );

    r.delete(&keyspace, &scope(&a, None)).await.unwrap();
    let left: i64 = redis::cmd("EXISTS")
        .arg(format!("{prefix}:k"))
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(left, 0);
    let user_left: Option<redis::Value> = redis::cmd("ACL")
        .arg("GETUSER")
        .arg(&user)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(
        user_left.is_none_or(|v| v == redis::Value::Nil),
        "the binding's user went with its keyspace"
    );
    redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&manual)
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    redis::cmd("DEL")
        .arg(format!("{used}:k"))
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
}

#[tokio::test]
async fn redis_bindings_learn_nothing_about_other_instances() {
    let r = redis();
    let t = tag();
    let (mine, theirs) = (format!("i_m{t}"), format!("i_t{t}"));
    r.apply(
        &json!({"kind": "Keyspace", "prefix": mine}),
        &scope("mine", None),
    )
    .await
    .unwrap();
    r.apply(
        &json!({"kind": "Keyspace", "prefix": theirs}),
        &scope("theirs", None),
    )
    .await
    .unwrap();
    let mut admin = redis_conn().await;
    redis::cmd("SET")
        .arg(format!("{theirs}:customer:alice@example.com:ssn"))
        .arg("1")
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    // The catalog's two access levels (catalogs/shared).
    let levels = [
        ("ro", json!(["+@read", "+@connection", "-@dangerous"])),
        (
            "rw",
            json!([
                "+@read",
                "+@write",
                "+@pubsub",
                "+@connection",
                "-@dangerous"
            ]),
        ),
    ];
    for (level, commands) in levels {
        let user = format!("u_{level}{t}");
        let login = json!({"kind": "User", "name": user, "password": "pw", "prefix": mine, "commands": commands});
        r.apply(&login, &scope("mine", Some(level))).await.unwrap();
        let mut conn = redis_as(&user, "pw").await;
        let own: Result<Option<String>, _> = redis::cmd("GET")
            .arg(format!("{mine}:k"))
            .query_async(&mut conn)
            .await;
        assert!(own.is_ok(), "{level}: reads its own keys: {own:?}");
        let probes: &[&[&str]] = &[
            &["SCAN", "0"],
            &["SCAN", "0", "MATCH", "*", "COUNT", "1000"],
            &["KEYS", "*"],
            &["RANDOMKEY"],
            &["DBSIZE"],
            &["PUBSUB", "CHANNELS"],
            &["PUBSUB", "NUMSUB", "x"],
            &["PUBSUB", "NUMPAT"],
            &["INFO", "keyspace"],
            &["CLIENT", "LIST"],
            &["ACL", "LIST"],
            &["ACL", "SETUSER", "evil", "on", ">x", "~*", "+@all"],
            &["CONFIG", "GET", "*"],
            &["SLOWLOG", "GET"],
            &["MONITOR"],
            &["SELECT", "1"],
            &["FLUSHALL"],
            &["FLUSHDB"],
            &["FUNCTION", "LIST"],
            &["OBJECT", "ENCODING", "x"],
            &["MEMORY", "STATS"],
        ];
        for probe in probes {
            let mut cmd = redis::cmd(probe[0]);
            for arg in &probe[1..] {
                cmd.arg(*arg);
            }
            let answer: Result<redis::Value, _> = cmd.query_async(&mut conn).await;
            assert!(answer.is_err(), "{level}: {probe:?} answered {answer:?}");
        }
        let other: Result<Option<String>, _> = redis::cmd("GET")
            .arg(format!("{theirs}:customer:alice@example.com:ssn"))
            .query_async(&mut conn)
            .await;
        assert!(other.is_err(), "{level}: reads another instance's key");
        r.delete(&login, &scope("mine", Some(level))).await.unwrap();
    }
    r.delete(
        &json!({"kind": "Keyspace", "prefix": mine}),
        &scope("mine", None),
    )
    .await
    .unwrap();
    r.delete(
        &json!({"kind": "Keyspace", "prefix": theirs}),
        &scope("theirs", None),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn redis_rules_that_escape_the_prefix_are_refused() {
    let r = redis();
    for rule in [
        "+@all",
        "+@admin",
        "+@ADMIN",
        "+@dangerous",
        "+acl",
        "+ACL|setuser",
        "+config",
        "+config|set",
        "+module",
        "+debug",
        "+keys",
        "+scan",
        "+pubsub",
        "+flushall",
        "+select",
    ] {
        let login = json!({"kind": "User", "name": "u", "password": "pw", "prefix": "p", "commands": ["+@read", rule]});
        let e = r.validate(&login).unwrap_err();
        assert!(matches!(&e, TargetError::Invalid(_)), "{rule}: {e}");
    }
}

/// Everything every test of this binary logs, at every level, sqlx's statement logs included.
fn captured() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        logs
    })
    .clone()
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logs_contain(logs: &Arc<Mutex<Vec<u8>>>, needle: &str) -> bool {
    String::from_utf8_lossy(&logs.lock().unwrap()).contains(needle)
}

#[tokio::test]
async fn statements_carrying_passwords_are_never_logged() {
    let logs = captured();
    let t = tag();
    // The capture sees sqlx's statement logs on a connection with sqlx's defaults.
    let control = format!("control-{t}");
    let mut conn = PgConnection::connect(&pg_url()).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SELECT '{control}'")))
        .execute(&mut conn)
        .await
        .unwrap();
    assert!(
        logs_contain(&logs, &control),
        "the capture sees statement logs"
    );

    let pg = postgres();
    let instance = format!("i-{t}");
    let (db, user) = (format!("db_{t}"), format!("u_{t}"));
    let database = json!({"kind": "Database", "name": db, "owner": format!("own_{t}")});
    pg.apply(&database, &scope(&instance, None)).await.unwrap();
    let first = format!("first-secret-{t}");
    let login = |password: &str| json!({"kind": "User", "name": user, "password": password, "database": db});
    pg.apply(&login(&first), &scope(&instance, Some("b")))
        .await
        .unwrap();
    // A password change that waits on a lock held elsewhere: a slow statement.
    let mut holder = pg_admin().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; ALTER ROLE \"{user}\" CONNECTION LIMIT 5"
    )))
    .execute(&mut holder)
    .await
    .unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        sqlx::raw_sql("COMMIT").execute(&mut holder).await.unwrap();
    });
    let second = format!("second-secret-{t}");
    // The statement that waited may lose to the other change and be retried, as the engine would.
    let mut attempts = 0;
    while let Err(e) = pg
        .apply(&login(&second), &scope(&instance, Some("b")))
        .await
    {
        attempts += 1;
        assert!(
            matches!(e, TargetError::Unavailable(_)) && attempts < 3,
            "{e}"
        );
    }
    release.await.unwrap();
    pg.delete(&database, &scope(&instance, None)).await.unwrap();

    let my = mysql();
    let third = format!("third-secret-{t}");
    let my_db = json!({"kind": "Database", "name": db});
    my.apply(&my_db, &scope(&instance, None)).await.unwrap();
    let my_login = json!({"kind": "User", "name": user, "password": third, "database": db});
    my.apply(&my_login, &scope(&instance, Some("b")))
        .await
        .unwrap();
    my.delete(&my_db, &scope(&instance, None)).await.unwrap();

    for secret in [&first, &second, &third] {
        assert!(!logs_contain(&logs, secret), "a password reached the logs");
    }
}
