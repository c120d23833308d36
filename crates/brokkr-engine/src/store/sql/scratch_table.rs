//! For the tests of PostgreSQL's write path (`group`, `batch`): a table on a fresh schema of the
//! test database, and counting its rows.

use brokkr_test_support::PgSchema;
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Row};

/// A pool on a fresh schema of the test PostgreSQL (`BROKKR_TEST_POSTGRES_URL`) with a
/// table `t (k BIGINT PRIMARY KEY, v TEXT NOT NULL)`, and the statement that drops it.
pub(super) async fn table() -> (AnyPool, String) {
    let schema = PgSchema::create().await;
    let pool = AnyPoolOptions::new()
        .max_connections(4)
        .connect(&schema.url)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE t (k BIGINT PRIMARY KEY, v TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    (pool, format!("DROP SCHEMA \"{}\" CASCADE", schema.name))
}

pub(super) async fn count(pool: &AnyPool, sql: &str, k: i64) -> i64 {
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(k)
        .fetch_one(pool)
        .await
        .unwrap();
    row.try_get(0).unwrap()
}
