//! When bindings' credentials expire, as a column of their own: `expires_at`, a copy of the
//! outputs' `expires_at` (which may be sealed) kept in plain sight and indexed, so that the
//! bindings past it are found without reading every resource. The hot path fills it wherever it
//! writes outputs (`operations`); here are its migration, the one-time indexing of the bindings
//! stored before it, and the query of the expired ones.

use sqlx::{AssertSqlSafe, Row};

use super::columns::{binding_col, row_key, row_keys};
use super::connect::SqlStore;
use crate::model::{Key, Outputs};
use crate::store::error::StoreError;

/// The migration that adds the column and its index: only the bindings that are ready are
/// indexed (a tombstone keeps its outputs, and its `expires_at`, until it is purged).
pub(super) const SCHEMA: &[&str] = &[
    "ALTER TABLE brokkr_resources ADD COLUMN expires_at BIGINT",
    "CREATE INDEX IF NOT EXISTS brokkr_resources_expires ON brokkr_resources (expires_at) \
     WHERE status = 'ready' AND expires_at IS NOT NULL",
];

/// The setting that records that the bindings stored before the column have been indexed.
const INDEXED_SETTING: &str = "store.expires_at_indexed";

impl SqlStore {
    /// Fills `expires_at` of the ready bindings stored before the column existed, from their
    /// outputs (decrypted where sealed), once per store: a setting records that it was done.
    /// Replicas starting together may both do it; they write the same values.
    pub(super) async fn index_expiry(&self) -> Result<(), StoreError> {
        let done = sqlx::query("SELECT value FROM brokkr_settings WHERE name = $1")
            .bind(INDEXED_SETTING)
            .fetch_optional(&self.pool)
            .await?;
        if done.is_some() {
            return Ok(());
        }
        let rows = sqlx::query(
            "SELECT instance_id, binding_id, outputs FROM brokkr_resources \
             WHERE binding_id <> '' AND status = 'ready' AND expires_at IS NULL",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut indexed = 0_u64;
        for row in rows {
            let key = row_key(row.try_get("instance_id")?, row.try_get("binding_id")?);
            let stored: String = row.try_get("outputs")?;
            let text = self.open(&key, "outputs", stored.clone())?;
            let outputs: Outputs =
                serde_json::from_str(&text).map_err(|e| StoreError::Corrupt {
                    key: key.to_string(),
                    message: format!("outputs: {e}"),
                })?;
            let Some(expires_at) = outputs.expires_at else {
                continue;
            };
            // Unless an operation changed the outputs meanwhile: it wrote the column itself.
            let changed = sqlx::query(
                "UPDATE brokkr_resources SET expires_at = $1 \
                 WHERE instance_id = $2 AND binding_id = $3 AND outputs = $4",
            )
            .bind(expires_at)
            .bind(&key.instance_id)
            .bind(binding_col(&key))
            .bind(&stored)
            .execute(&self.pool)
            .await?;
            indexed += changed.rows_affected();
        }
        if indexed > 0 {
            tracing::info!(
                bindings = indexed,
                "indexed when bindings' credentials expire"
            );
        }
        self.init_setting(INDEXED_SETTING, "1").await?;
        Ok(())
    }

    pub(super) async fn expired_bindings(
        &self,
        plan_ids: &[String],
        now: i64,
        limit: i64,
    ) -> Result<Vec<Key>, StoreError> {
        if plan_ids.is_empty() || limit <= 0 {
            return Ok(Vec::new());
        }
        // `status = 'ready'` is written as the index's own condition, so that it is used.
        let plans: Vec<String> = (3..3 + plan_ids.len()).map(|n| format!("${n}")).collect();
        let sql = format!(
            "SELECT instance_id, binding_id FROM brokkr_resources \
             WHERE status = 'ready' AND expires_at <= $1 AND binding_id <> '' \
             AND op_state <> 'in progress' AND plan_id IN ({}) \
             ORDER BY expires_at LIMIT $2",
            plans.join(", ")
        );
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(now).bind(limit);
        for plan in plan_ids {
            query = query.bind(plan);
        }
        let rows = query.fetch_all(&self.pool).await?;
        Ok(row_keys(&rows)?)
    }
}
