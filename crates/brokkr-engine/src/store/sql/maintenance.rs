//! Keeping the store: purging the resources deleted long enough ago (and their events), and
//! sealing every secret-bearing column again with the keyring's newest key.

use sqlx::Row;

use super::columns::{SEALED_COLUMNS, binding_col, row_key};
use super::connect::{Dialect, SqlStore};
use super::row::seal_context;
use crate::store::error::StoreError;

impl SqlStore {
    pub(super) async fn purge_deleted(&self, before: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM brokkr_resources WHERE status = 'deleted' AND deleted_at < $1 \
             AND op_state <> 'in progress'",
        )
        .bind(before)
        .execute(&self.pool)
        .await?;
        // Bindings whose instance is gone (one created while its instance was deprovisioned).
        let orphans = sqlx::query(
            "DELETE FROM brokkr_resources WHERE binding_id <> '' AND op_state <> 'in progress' \
             AND NOT EXISTS (SELECT 1 FROM brokkr_resources i \
                 WHERE i.instance_id = brokkr_resources.instance_id AND i.binding_id = '')",
        )
        .execute(&self.pool)
        .await?;
        if done.rows_affected() + orphans.rows_affected() > 0 {
            sqlx::query(
                "DELETE FROM brokkr_events WHERE NOT EXISTS (SELECT 1 FROM brokkr_resources r \
                 WHERE r.op_id = brokkr_events.op_id OR r.prev_op_id = brokkr_events.op_id)",
            )
            .execute(&self.pool)
            .await?;
        }
        let purged = done.rows_affected() + orphans.rows_affected();
        if purged > 0 {
            self.forget_all(); // it may show what was just deleted
        }
        Ok(purged)
    }

    pub(super) async fn rekey(&self) -> Result<u64, StoreError> {
        let Some(ring) = &self.keyring else {
            return Ok(0);
        };
        let rows = sqlx::query(
            "SELECT instance_id, binding_id, attrs, outputs, op_request FROM brokkr_resources",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut changed = 0;
        for row in rows {
            let key = row_key(row.try_get("instance_id")?, row.try_get("binding_id")?);
            let mut stored = Vec::with_capacity(SEALED_COLUMNS.len());
            for column in SEALED_COLUMNS {
                stored.push(row.try_get::<String, _>(column)?);
            }
            if stored.iter().all(|v| ring.is_current(v)) {
                continue;
            }
            let mut resealed = Vec::with_capacity(stored.len());
            for (column, value) in SEALED_COLUMNS.iter().zip(&stored) {
                let plain = self.open(&key, column, value.clone())?;
                resealed.push(ring.seal(&plain, &seal_context(&key, column)));
            }
            let done = sqlx::query(
                "UPDATE brokkr_resources SET attrs = $1, outputs = $2, op_request = $3 \
                 WHERE instance_id = $4 AND binding_id = $5 \
                 AND attrs = $6 AND outputs = $7 AND op_request = $8",
            )
            .bind(&resealed[0])
            .bind(&resealed[1])
            .bind(&resealed[2])
            .bind(&key.instance_id)
            .bind(binding_col(&key))
            .bind(&stored[0])
            .bind(&stored[1])
            .bind(&stored[2])
            .execute(&self.pool)
            .await?;
            changed += done.rows_affected();
        }
        changed += self.rekey_orphans(ring).await?;
        self.forget_all(); // it may hold values sealed with the previous key
        if self.dialect == Dialect::Sqlite && changed > 0 {
            // Rewrite the file so that no page keeps a value as it was before.
            sqlx::query("VACUUM").execute(&self.pool).await?;
            sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(&self.pool)
                .await?;
        }
        Ok(changed)
    }
}
