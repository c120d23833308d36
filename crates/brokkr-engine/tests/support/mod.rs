//! What the store tests share: a store on SQLite or on PostgreSQL (`BROKKR_TEST_POSTGRES_URL`,
//! as scripts/test sets it up; each test in a schema of its own, dropped afterwards), and an
//! instance to put in it.

// Each test file uses its part.
#![allow(dead_code, unused_macros)]

use brokkr_engine::store::SqlStore;
use brokkr_engine::{Attrs, Key, OpKind, OpPlan, Operation, Resource};
use brokkr_test_support::PgSchema;

#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A store URL: a SQLite file, or a PostgreSQL schema dropped on drop.
pub struct Place {
    pub url: String,
    _dir: tempfile::TempDir,
    schema: Option<(sqlx::AnyPool, String)>,
}

impl Place {
    pub async fn new(backend: Backend) -> Self {
        let dir = tempfile::tempdir().unwrap();
        match backend {
            Backend::Sqlite => Self {
                url: format!("sqlite://{}/brokkr.db", dir.path().display()),
                _dir: dir,
                schema: None,
            },
            Backend::Postgres => {
                let PgSchema { admin, name, url } = PgSchema::create().await;
                Self {
                    url,
                    _dir: dir,
                    schema: Some((admin, name)),
                }
            }
        }
    }

    pub async fn open(&self) -> SqlStore {
        SqlStore::connect(&self.url, None).await.expect("connect")
    }

    pub async fn drop_schema(self) {
        if let Some((pool, name)) = &self.schema {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA \"{name}\" CASCADE"
            )))
            .execute(pool)
            .await
            .unwrap();
        }
    }
}

/// A new instance `id` with its provision, its space GUID its id.
pub fn instance(id: &str) -> Resource {
    let op = Operation::new(
        OpKind::Provision,
        OpPlan::default(),
        None,
        3_600_000,
        "test",
        60_000,
    );
    let attrs = Attrs {
        space_guid: Some(id.to_owned()),
        ..Attrs::default()
    };
    Resource::new(Key::instance(id), "service", "plan", attrs, op)
}

/// Tests `async fn name(backend: Backend)` run on SQLite and on PostgreSQL.
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::Backend::Sqlite).await;
            })*
        }
        mod postgres {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::Backend::Postgres).await;
            })*
        }
    };
}
