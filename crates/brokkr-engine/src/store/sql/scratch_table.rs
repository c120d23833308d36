//! For the tests of PostgreSQL's write path (`group`, `batch`): a table on a fresh schema of the
//! test database, and counting its rows.

use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Row};

/// A pool on a fresh schema of the test PostgreSQL (`BROKKR_TEST_POSTGRES_URL`) with a
/// table `t (k BIGINT PRIMARY KEY, v TEXT NOT NULL)`, and the statement that drops it.
pub(super) async fn table() -> (AnyPool, String) {
    let admin = std::env::var("BROKKR_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://brokkr:brokkr@127.0.0.1:5432/brokkr_test".into());
    sqlx::any::install_default_drivers();
    let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
    let setup = AnyPoolOptions::new()
        .max_connections(1)
        .connect(&admin)
        .await
        .expect("PostgreSQL for tests (see scripts/test, BROKKR_TEST_POSTGRES_URL)");
    let create = format!("CREATE SCHEMA \"{schema}\"");
    sqlx::query(sqlx::AssertSqlSafe(create))
        .execute(&setup)
        .await
        .unwrap();
    let sep = if admin.contains('?') { '&' } else { '?' };
    let url = format!("{admin}{sep}options=-c%20search_path%3D{schema}");
    let pool = AnyPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE t (k BIGINT PRIMARY KEY, v TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    (pool, format!("DROP SCHEMA \"{schema}\" CASCADE"))
}

pub(super) async fn count(pool: &AnyPool, sql: &str, k: i64) -> i64 {
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(k)
        .fetch_one(pool)
        .await
        .unwrap();
    row.try_get(0).unwrap()
}
