//! A schema of its own on the test PostgreSQL server, for a test that keeps a store (or a table)
//! there without meeting another test's rows.

/// A fresh schema on the test PostgreSQL server (`BROKKR_TEST_POSTGRES_URL`, as scripts/test
/// sets it up); [`PgSchema::url`] selects it.
pub struct PgSchema {
    /// One connection to the server, not to the schema: for dropping it, or naming it.
    pub admin: sqlx::AnyPool,
    /// The schema's name, `t_` and a UUID.
    pub name: String,
    /// The server's URL with the schema as the `search_path` of every connection.
    pub url: String,
}

impl PgSchema {
    /// Creates the schema.
    pub async fn create() -> Self {
        let base = std::env::var("BROKKR_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://brokkr:brokkr@127.0.0.1:5432/brokkr_test".into());
        sqlx::any::install_default_drivers();
        let admin = sqlx::any::AnyPoolOptions::new()
            .max_connections(1)
            .connect(&base)
            .await
            .expect("PostgreSQL for tests (see scripts/test, BROKKR_TEST_POSTGRES_URL)");
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        let sql = format!("CREATE SCHEMA \"{name}\"");
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&admin)
            .await
            .expect("create schema");
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-c%20search_path%3D{name}");
        Self { admin, name, url }
    }

    /// Drops the schema and all it holds; a failure is left alone (the schema stays behind).
    pub async fn drop_schema(self) {
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name);
        let _ = sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&self.admin)
            .await;
    }
}
