//! Which process runs an operation: claiming the operations that are due (their lease expired or
//! none), releasing one (announced to every replica on PostgreSQL, see `released`), and
//! releasing every lease at start.

use sqlx::AssertSqlSafe;

use super::columns::{binding_col, row_key, row_keys};
use super::connect::{Dialect, SqlStore};
use super::released;
use super::statement::{Statement, sqlite_sql};
use super::view::Touches;
use crate::model::Key;
use crate::store::error::StoreError;

impl SqlStore {
    pub(super) async fn claim_due(
        &self,
        owner: &str,
        lease_until: i64,
        limit: i64,
    ) -> Result<Vec<Key>, StoreError> {
        let lock = match self.dialect {
            Dialect::Postgres => "FOR UPDATE SKIP LOCKED",
            Dialect::Sqlite => "",
        };
        let sql = format!(
            "UPDATE brokkr_resources SET lease_owner = $1, lease_until = $2 \
             WHERE (instance_id, binding_id) IN ( \
                 SELECT instance_id, binding_id FROM brokkr_resources \
                 WHERE op_state = 'in progress' AND (lease_owner IS NULL OR lease_until < $3) \
                 AND (op_next_run_at <= $3 OR op_deadline_at <= $3) \
                 ORDER BY op_next_run_at LIMIT $4 {lock}) \
             RETURNING instance_id, binding_id"
        );
        let now = crate::clock::now_ms();
        if let (Some(writer), Some(view)) = (&self.writer, &self.view) {
            // A change of the rows the view may show: the writer's, and forgotten there once
            // it is committed.
            let owner = owner.to_owned();
            let keys = writer
                .write(Touches::Nothing, move |conn| {
                    let mut statement = conn.prepare_cached(&sqlite_sql(&sql))?;
                    let rows = statement
                        .query_map(rusqlite::params![owner, lease_until, now, limit], |row| {
                            Ok(row_key(row.get(0)?, row.get(1)?))
                        })?;
                    rows.collect::<rusqlite::Result<Vec<Key>>>()
                })
                .await?;
            view.forget(&keys);
            return Ok(keys);
        }
        let rows = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(owner)
            .bind(lease_until)
            .bind(now)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        Ok(row_keys(&rows)?)
    }

    pub(super) async fn release(
        &self,
        key: &Key,
        op_id: &str,
        owner: &str,
    ) -> Result<(), StoreError> {
        let release = Statement::new(
            "UPDATE brokkr_resources SET lease_owner = NULL, lease_until = 0 \
             WHERE instance_id = $1 AND binding_id = $2 AND op_id = $3 AND lease_owner = $4",
            vec![
                key.instance_id.as_str().into(),
                binding_col(key).into(),
                op_id.into(),
                owner.into(),
            ],
        );
        // Announced to every replica, which may claim it at once (see `released`).
        let announce = match self.dialect {
            Dialect::Postgres => vec![Statement::new(released::NOTIFY, Vec::new())],
            Dialect::Sqlite => Vec::new(),
        };
        self.write(release, announce, Touches::Resource(key.clone()))
            .await?;
        Ok(())
    }

    pub(super) async fn release_all(&self) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "UPDATE brokkr_resources SET lease_owner = NULL, lease_until = 0 \
             WHERE lease_owner IS NOT NULL",
        )
        .execute(&self.pool)
        .await?;
        self.forget_all();
        Ok(done.rows_affected() + self.release_orphans().await?)
    }
}
