//! The store's schema and its versions: the tables, the migrations that bring a store to this
//! brokkr's version, and the settings rows that record which version a store is at and the
//! oldest brokkr that can still use it.

use sqlx::{Executor, Row};

use super::connect::{Dialect, SqlStore};
use super::{expiry, orphans, upgrades};
use crate::store::error::StoreError;

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS brokkr_settings (
        name TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS brokkr_resources (
        instance_id TEXT NOT NULL,
        binding_id TEXT NOT NULL,
        service_id TEXT NOT NULL,
        plan_id TEXT NOT NULL,
        attrs TEXT NOT NULL,
        status TEXT NOT NULL,
        outputs TEXT NOT NULL,
        dashboard_url TEXT,
        created_at BIGINT NOT NULL,
        deleted_at BIGINT,
        op_id TEXT NOT NULL,
        op_kind TEXT NOT NULL,
        op_state TEXT NOT NULL,
        op_description TEXT,
        op_request TEXT NOT NULL,
        op_plan TEXT NOT NULL,
        op_step BIGINT NOT NULL,
        op_step_started_at BIGINT,
        op_next_run_at BIGINT NOT NULL,
        op_deadline_at BIGINT NOT NULL,
        lease_owner TEXT,
        lease_until BIGINT NOT NULL,
        op_started_at BIGINT NOT NULL,
        op_finished_at BIGINT,
        prev_op_id TEXT,
        prev_op_state TEXT,
        prev_op_description TEXT,
        PRIMARY KEY (instance_id, binding_id)
    )",
    "CREATE INDEX IF NOT EXISTS brokkr_resources_due
        ON brokkr_resources (op_next_run_at) WHERE op_state = 'in progress'",
    "CREATE INDEX IF NOT EXISTS brokkr_resources_op ON brokkr_resources (op_id)",
    "CREATE INDEX IF NOT EXISTS brokkr_resources_created ON brokkr_resources (created_at)",
    "CREATE TABLE IF NOT EXISTS brokkr_events (
        op_id TEXT NOT NULL,
        at BIGINT NOT NULL,
        kind TEXT NOT NULL,
        step TEXT,
        message TEXT
    )",
    "CREATE INDEX IF NOT EXISTS brokkr_events_op ON brokkr_events (op_id, at)",
    "CREATE INDEX IF NOT EXISTS brokkr_resources_deleted
        ON brokkr_resources (deleted_at) WHERE status = 'deleted'",
];

/// One change of the schema, run once, in order; the store's schema version is the number of
/// migrations it has had.
pub struct Migration {
    /// The statements, run in order, in one transaction with the recording of the new version
    /// (PostgreSQL and SQLite both change schemas in transactions): a crash leaves the migration
    /// done or not, so a statement that cannot say `IF NOT EXISTS` (SQLite's `ADD COLUMN`) is
    /// never run twice.
    pub statements: Vec<&'static str>,
    /// Whether a brokkr of an earlier schema version can no longer use the store afterwards (a
    /// column it reads is dropped or changes meaning). Additive migrations — new tables, new
    /// nullable or defaulted columns, new indexes — leave older replicas working, which is what
    /// lets two versions share a store during a rolling update.
    pub breaks_older: bool,
}

/// This brokkr's schema version: the number of [`migrations`].
pub const SCHEMA_VERSION: i64 = 3;

/// Every migration, oldest first. Version 1 is the schema as it was before versions were
/// recorded; its statements all say `IF NOT EXISTS`, so a store from then is brought to version
/// 1 by running them again. Version 2 adds bindings' `expires_at` column and its index; version
/// 3 the tables of fleet upgrades. Add a migration at the end (and raise [`SCHEMA_VERSION`]); never change one that has been released.
pub fn migrations() -> Vec<Migration> {
    vec![
        Migration {
            statements: SCHEMA.iter().chain(orphans::SCHEMA).copied().collect(),
            breaks_older: false,
        },
        Migration {
            statements: expiry::SCHEMA.to_vec(),
            breaks_older: false,
        },
        Migration {
            statements: upgrades::SCHEMA.to_vec(),
            breaks_older: false,
        },
    ]
}

impl SqlStore {
    /// Brings the schema to `migrations.len()` (see
    /// [`Store::migrate`](crate::store::Store::migrate)). Replicas starting together on
    /// PostgreSQL take turns under an advisory lock.
    pub async fn migrate_with(&self, migrations: &[Migration]) -> Result<(), StoreError> {
        let mut conn = self.pool.acquire().await?;
        if self.dialect == Dialect::Postgres {
            conn.execute("SELECT pg_advisory_lock(72616) ").await?;
        }
        let result = migrate_conn(&mut conn, migrations).await;
        if self.dialect == Dialect::Postgres {
            conn.execute("SELECT pg_advisory_unlock(72616)").await?;
        }
        result
    }

    /// The store's schema version and the oldest version that can use it (0 and 0 for a store
    /// from before versions were recorded, or an empty one).
    pub async fn schema_version(&self) -> Result<(i64, i64), StoreError> {
        let mut conn = self.pool.acquire().await?;
        read_version(&mut conn).await
    }
}

/// The `brokkr_settings` rows that record the schema.
const VERSION_KEY: &str = "schema_version";
const COMPATIBLE_KEY: &str = "schema_compatible_since";

async fn read_setting(conn: &mut sqlx::AnyConnection, name: &str) -> Result<i64, StoreError> {
    let row = sqlx::query("SELECT value FROM brokkr_settings WHERE name = $1")
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?;
    match row {
        None => Ok(0),
        Some(row) => {
            let value: String = row.try_get("value")?;
            value.parse().map_err(|_| StoreError::Corrupt {
                key: format!("brokkr_settings.{name}"),
                message: format!("{value:?} is not a schema version"),
            })
        }
    }
}

async fn read_version(conn: &mut sqlx::AnyConnection) -> Result<(i64, i64), StoreError> {
    conn.execute(SCHEMA[0]).await?;
    Ok((
        read_setting(conn, VERSION_KEY).await?,
        read_setting(conn, COMPATIBLE_KEY).await?,
    ))
}

async fn write_setting(
    conn: &mut sqlx::AnyConnection,
    name: &str,
    value: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO brokkr_settings (name, value) VALUES ($1, $2) \
         ON CONFLICT (name) DO UPDATE SET value = excluded.value",
    )
    .bind(name)
    .bind(value.to_string())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Runs the migrations the store has not had, recording the version after each; refuses a
/// store that needs a newer brokkr.
async fn migrate_conn(
    conn: &mut sqlx::AnyConnection,
    migrations: &[Migration],
) -> Result<(), StoreError> {
    let supported = i64::try_from(migrations.len()).unwrap_or(i64::MAX);
    let (found, compatible_since) = read_version(conn).await?;
    if found > supported {
        if compatible_since > supported {
            return Err(StoreError::SchemaTooNew {
                found,
                compatible_since,
                supported,
            });
        }
        tracing::info!(
            store_schema = found,
            schema = supported,
            "the store's schema is newer than this brokkr's and compatible with it"
        );
        return Ok(());
    }
    let mut compatible = compatible_since;
    for (version, migration) in (1..).zip(migrations) {
        if version <= found {
            continue;
        }
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        for statement in &migration.statements {
            tx.execute(*statement).await?;
        }
        if migration.breaks_older {
            compatible = version;
        }
        write_setting(&mut tx, COMPATIBLE_KEY, compatible).await?;
        write_setting(&mut tx, VERSION_KEY, version).await?;
        tx.commit().await?;
        if found > 0 {
            tracing::info!(from = version - 1, to = version, "store schema migrated");
        }
    }
    Ok(())
}
