//! Hostile names and values against the real servers of this machine: quotes, semicolons,
//! backslashes, wildcards, spaces and very long strings are either refused before anything is
//! sent, or stored literally without changing a statement's structure.

use std::time::Duration;

use brokkr_targets::mysql::Mysql;
use brokkr_targets::postgres::Postgres;
use brokkr_targets::redis::Redis;
use brokkr_targets::{AdminUrl, NamesKey, Readiness, Scope, Target, TargetError};
use serde_json::json;
use sqlx::{Connection, MySqlConnection, PgConnection};

fn url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

fn pg_url() -> String {
    url(
        "BROKKR_TEST_POSTGRES_URL",
        "postgres://brokkr:brokkr@127.0.0.1:5432/brokkr_test",
    )
}

fn mysql_url() -> String {
    url(
        "BROKKR_TEST_MYSQL_URL",
        "mysql://brokkr:brokkr@127.0.0.1:3306/mysql",
    )
}

fn tag() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}

const TIMEOUT: Duration = Duration::from_secs(10);

const SCOPE: Scope<'static> = Scope {
    instance_id: "i",
    binding_id: None,
    service_id: "s",
    plan_id: "p",
    step: "step",
    context: &serde_json::Value::Null,
    names_key: &NamesKey::RENDER_ONLY,
};

#[tokio::test]
async fn postgres_stores_hostile_names_literally() {
    let target = Postgres::new("pg", &AdminUrl::parse("pg", &pg_url()).unwrap(), TIMEOUT).unwrap();
    let t = tag();
    let db = format!("x\"; DROP DATABASE brokkr_test; -- {t}");
    let owner = format!("o'\\ {t}");
    let user = format!("u\" ; SELECT 1; {t}");
    let database = json!({"kind": "Database", "name": db, "owner": owner});
    target
        .apply(&database, &SCOPE)
        .await
        .expect("created with its literal name");
    assert_eq!(
        target.ready(&database, &SCOPE).await.unwrap(),
        Readiness::Ready
    );
    let password = "p'w\"d\\; DROP ROLE brokkr; --";
    let login = json!({"kind": "User", "name": user, "password": password, "database": db});
    target.apply(&login, &SCOPE).await.unwrap();
    assert_eq!(
        target.ready(&login, &SCOPE).await.unwrap(),
        Readiness::Ready
    );

    let mut admin = PgConnection::connect(&pg_url()).await.unwrap();
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT datname::text FROM pg_database WHERE datname IN ($1, 'brokkr_test')",
    )
    .bind(&db)
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert_eq!(
        names.len(),
        2,
        "both the literal database and brokkr_test exist: {names:?}"
    );

    target.delete(&login, &SCOPE).await.unwrap();
    target.delete(&database, &SCOPE).await.unwrap();
    target
        .delete(&database, &SCOPE)
        .await
        .expect("deleting twice is fine");
    let left: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM pg_database WHERE datname = $1) \
              + (SELECT count(*) FROM pg_roles WHERE rolname IN ($2, $3))",
    )
    .bind(&db)
    .bind(&owner)
    .bind(&user)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(left, 0);
}

#[tokio::test]
async fn names_the_server_would_truncate_or_misread_are_refused() {
    let pg = Postgres::new("pg", &AdminUrl::parse("pg", &pg_url()).unwrap(), TIMEOUT).unwrap();
    let long = "d".repeat(64);
    let e = pg
        .apply(
            &json!({"kind": "Database", "name": long, "owner": "o"}),
            &SCOPE,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&e, TargetError::Invalid(m) if m.contains("1 to 63 bytes")),
        "{e}"
    );
    let e = pg
        .validate(&json!({"kind": "Database", "name": "a", "owner": "o", "extra": 1}))
        .unwrap_err();
    assert!(e.to_string().contains("unknown field"), "{e}");

    let redis = Redis::new(
        "rd",
        &AdminUrl::parse("rd", "redis://127.0.0.1:6379").unwrap(),
        TIMEOUT,
    )
    .unwrap();
    for (prefix, commands) in [
        ("a*", json!(["+@read"])),
        ("a b", json!(["+@read"])),
        ("ok", json!(["+@read", "~*"])),
        ("ok", json!(["+@all"])),
        ("ok", json!(["allkeys"])),
    ] {
        let user = json!({"kind": "User", "name": "u", "password": "p", "prefix": prefix,
                          "commands": commands});
        assert!(redis.validate(&user).is_err(), "{user}");
    }
    let mysql = Mysql::new("my", &AdminUrl::parse("my", &mysql_url()).unwrap(), TIMEOUT).unwrap();
    let e = mysql
        .validate(&json!({"kind": "Database", "name": "a.b"}))
        .unwrap_err();
    assert!(e.to_string().contains("cannot contain"), "{e}");
}

/// A database and a user are deleted though connections are still open on them, and those
/// connections end with them.
#[tokio::test]
async fn mysql_deletes_a_database_and_a_user_with_connections_open() {
    let target = Mysql::new("my", &AdminUrl::parse("my", &mysql_url()).unwrap(), TIMEOUT).unwrap();
    let t = tag();
    let (db, user, password) = (format!("open_{t}"), format!("open_{t}"), "open-sesame");
    let database = json!({"kind": "Database", "name": db});
    let login = json!({"kind": "User", "name": user, "password": password, "database": db});
    target.apply(&database, &SCOPE).await.unwrap();
    target.apply(&login, &SCOPE).await.unwrap();
    let mut options: sqlx::mysql::MySqlConnectOptions = mysql_url().parse().unwrap();
    options = options.username(&user).password(password).database(&db);
    let mut on_database = MySqlConnection::connect_with(&options).await.unwrap();
    let mut as_user = MySqlConnection::connect_with(&options).await.unwrap();

    target.delete(&database, &SCOPE).await.unwrap();
    assert!(
        sqlx::query("SELECT 1")
            .execute(&mut on_database)
            .await
            .is_err()
    );
    target.delete(&login, &SCOPE).await.unwrap();
    assert!(sqlx::query("SELECT 1").execute(&mut as_user).await.is_err());
}

#[tokio::test]
async fn mysql_grants_name_exactly_one_database() {
    let target = Mysql::new("my", &AdminUrl::parse("my", &mysql_url()).unwrap(), TIMEOUT).unwrap();
    let t = tag();
    // `_` is a wildcard in GRANT: a grant on db_<t> must not reach dbx<t>.
    let (db, lookalike) = (format!("db_{t}"), format!("dbx{t}"));
    let user = format!("u'`\\{t}");
    let password = "p'w\\d`; DROP DATABASE mysql; --";
    for name in [&db, &lookalike] {
        target
            .apply(&json!({"kind": "Database", "name": name}), &SCOPE)
            .await
            .unwrap();
    }
    let login = json!({"kind": "User", "name": user, "password": password, "database": db});
    target.apply(&login, &SCOPE).await.unwrap();
    assert_eq!(
        target.ready(&login, &SCOPE).await.unwrap(),
        Readiness::Ready
    );

    let mut options: sqlx::mysql::MySqlConnectOptions = mysql_url().parse().unwrap();
    options = options.username(&user).password(password).database(&db);
    let mut conn = MySqlConnection::connect_with(&options)
        .await
        .expect("the hostile user logs in");
    sqlx::raw_sql("CREATE TABLE t (n int)")
        .execute(&mut conn)
        .await
        .unwrap();
    let sql = format!("CREATE TABLE `{lookalike}`.t (n int)");
    assert!(
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .is_err(),
        "the grant on {db} does not reach {lookalike}"
    );
    conn.close().await.ok();
    target.delete(&login, &SCOPE).await.unwrap();
    for name in [&db, &lookalike] {
        target
            .delete(&json!({"kind": "Database", "name": name}), &SCOPE)
            .await
            .unwrap();
    }
    assert!(MySqlConnection::connect_with(&options).await.is_err());
}

#[tokio::test]
async fn an_unreachable_server_is_reported_as_unavailable_with_its_address() {
    let url = AdminUrl::parse("pg", "postgres://admin:s3cret@127.0.0.1:9/postgres").unwrap();
    let target = Postgres::new("pg", &url, Duration::from_millis(500)).unwrap();
    let e = target
        .apply(
            &json!({"kind": "Database", "name": "a", "owner": "b"}),
            &SCOPE,
        )
        .await
        .unwrap_err();
    assert!(matches!(&e, TargetError::Unavailable(_)), "{e}");
    assert!(e.to_string().contains("127.0.0.1:9"), "{e}");
    assert!(!e.to_string().contains("s3cret"), "{e}");
}
