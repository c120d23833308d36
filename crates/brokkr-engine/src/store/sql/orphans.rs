//! The orphans table: steps a deprovision or unbind left behind, which the engine's janitor
//! retries. One row per step of one resource's life (its key and creation time), so a repeated
//! deprovision refreshes the row instead of adding one, and a reused id starts afresh. The
//! context the step's templates need (parameters, registry) is sealed like a resource's.

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};

use super::columns::{binding_col, row_key};
use super::connect::{Dialect, SqlStore};
use super::row::count_kind;
use super::statement::Statement;
use super::view::Touches;
use crate::model::{Key, OpKind, Orphan};
use crate::store::error::StoreError;

pub(super) const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS brokkr_orphans (
        id TEXT PRIMARY KEY,
        instance_id TEXT NOT NULL,
        binding_id TEXT NOT NULL,
        resource_created_at BIGINT NOT NULL,
        op_kind TEXT NOT NULL,
        op_id TEXT NOT NULL,
        step_name TEXT NOT NULL,
        step TEXT NOT NULL,
        context TEXT NOT NULL,
        since BIGINT NOT NULL,
        attempts BIGINT NOT NULL,
        last_error TEXT NOT NULL,
        next_attempt_at BIGINT NOT NULL,
        lease_owner TEXT,
        lease_until BIGINT NOT NULL,
        UNIQUE (instance_id, binding_id, resource_created_at, step_name)
    )",
    "CREATE INDEX IF NOT EXISTS brokkr_orphans_due ON brokkr_orphans (next_attempt_at)",
];

const COLUMNS: &str = "id, instance_id, binding_id, resource_created_at, op_kind, op_id, \
    step_name, step, since, attempts, last_error, next_attempt_at";

/// Associated data of an orphan's sealed context: the row's unique key, which a refresh keeps.
fn seal_context(key: &Key, created_at: i64, step: &str) -> String {
    format!(
        "orphan\0{}\0{}\0{created_at}\0{step}",
        key.instance_id,
        binding_col(key)
    )
}

impl SqlStore {
    pub(super) async fn record_orphan(&self, o: &Orphan) -> Result<(), StoreError> {
        let context = serde_json::to_string(&o.context).expect("contexts serialize");
        let aad = seal_context(&o.key, o.resource_created_at, &o.step.name);
        let context = match &self.keyring {
            Some(ring) => ring.seal(&context, &aad),
            None => context,
        };
        sqlx::query(
            "INSERT INTO brokkr_orphans (id, instance_id, binding_id, resource_created_at, \
             op_kind, op_id, step_name, step, context, since, attempts, last_error, \
             next_attempt_at, lease_owner, lease_until) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, NULL, 0) \
             ON CONFLICT (instance_id, binding_id, resource_created_at, step_name) DO UPDATE \
             SET op_id = excluded.op_id, step = excluded.step, context = excluded.context, \
             last_error = excluded.last_error",
        )
        .bind(&o.id)
        .bind(&o.key.instance_id)
        .bind(binding_col(&o.key))
        .bind(o.resource_created_at)
        .bind(o.op_kind.as_str())
        .bind(&o.op_id)
        .bind(&o.step.name)
        .bind(serde_json::to_string(&o.step).expect("steps serialize"))
        .bind(context)
        .bind(o.since)
        .bind(o.attempts)
        .bind(&o.last_error)
        .bind(o.next_attempt_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub(super) async fn resolve_orphan(
        &self,
        key: &Key,
        created_at: i64,
        step: &str,
    ) -> Result<bool, StoreError> {
        // Asked after every step of every deprovision and unbind: a change of the hot path.
        let resolve = Statement::new(
            "DELETE FROM brokkr_orphans WHERE instance_id = $1 AND binding_id = $2 \
             AND resource_created_at = $3 AND step_name = $4",
            vec![
                key.instance_id.as_str().into(),
                binding_col(key).into(),
                created_at.into(),
                step.into(),
            ],
        );
        self.write(resolve, Vec::new(), Touches::Nothing).await
    }

    pub(super) async fn claim_orphans(
        &self,
        owner: &str,
        lease_until: i64,
        limit: i64,
    ) -> Result<Vec<Orphan>, StoreError> {
        let lock = match self.dialect {
            Dialect::Postgres => "FOR UPDATE SKIP LOCKED",
            Dialect::Sqlite => "",
        };
        let sql = format!(
            "UPDATE brokkr_orphans SET lease_owner = $1, lease_until = $2 \
             WHERE id IN (SELECT id FROM brokkr_orphans \
                 WHERE next_attempt_at <= $3 AND (lease_owner IS NULL OR lease_until < $3) \
                 ORDER BY next_attempt_at LIMIT $4 {lock}) \
             RETURNING {COLUMNS}, context"
        );
        let rows = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(owner)
            .bind(lease_until)
            .bind(crate::clock::now_ms())
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| self.decode_orphan(r, true)).collect()
    }

    pub(super) async fn remove_orphan(&self, id: &str, owner: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM brokkr_orphans WHERE id = $1 AND lease_owner = $2")
            .bind(id)
            .bind(owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub(super) async fn orphan_failed(
        &self,
        id: &str,
        owner: &str,
        error: &str,
        next_attempt_at: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE brokkr_orphans SET attempts = attempts + 1, last_error = $1, \
             next_attempt_at = $2, lease_owner = NULL, lease_until = 0 \
             WHERE id = $3 AND lease_owner = $4",
        )
        .bind(error)
        .bind(next_attempt_at)
        .bind(id)
        .bind(owner)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub(super) async fn list_orphans(
        &self,
        key: Option<&Key>,
        limit: i64,
    ) -> Result<Vec<Orphan>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM brokkr_orphans \
             WHERE ($1 = '' OR (instance_id = $2 AND binding_id = $3)) \
             ORDER BY since, id LIMIT $4"
        );
        let rows = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(if key.is_some() { "one" } else { "" })
            .bind(key.map_or("", |k| k.instance_id.as_str()))
            .bind(key.map_or("", binding_col))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| self.decode_orphan(r, false)).collect()
    }

    pub(super) async fn count_orphans(&self) -> Result<Vec<(OpKind, String, i64)>, StoreError> {
        let rows = sqlx::query(
            "SELECT op_kind, step_name, COUNT(*) AS n FROM brokkr_orphans \
             GROUP BY op_kind, step_name",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let kind = count_kind(r, "brokkr_orphans")?;
                Ok((kind, r.try_get("step_name")?, r.try_get("n")?))
            })
            .collect()
    }

    pub(super) async fn release_orphans(&self) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "UPDATE brokkr_orphans SET lease_owner = NULL, lease_until = 0 \
             WHERE lease_owner IS NOT NULL",
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Re-encrypts the orphans' contexts with the newest key; returns how many changed.
    pub(super) async fn rekey_orphans(
        &self,
        ring: &crate::crypto::Keyring,
    ) -> Result<u64, StoreError> {
        let rows = sqlx::query(
            "SELECT id, instance_id, binding_id, resource_created_at, step_name, context \
             FROM brokkr_orphans",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut changed = 0;
        for row in rows {
            let stored: String = row.try_get("context")?;
            if ring.is_current(&stored) {
                continue;
            }
            let key = row_key(row.try_get("instance_id")?, row.try_get("binding_id")?);
            let step: String = row.try_get("step_name")?;
            let aad = seal_context(&key, row.try_get("resource_created_at")?, &step);
            let plain = self.open_sealed(&key, "context", stored.clone(), &aad)?;
            let done = sqlx::query(
                "UPDATE brokkr_orphans SET context = $1 WHERE id = $2 AND context = $3",
            )
            .bind(ring.seal(&plain, &aad))
            .bind(row.try_get::<String, _>("id")?)
            .bind(&stored)
            .execute(&self.pool)
            .await?;
            changed += done.rows_affected();
        }
        Ok(changed)
    }

    /// An orphan from its row, with its context opened when `with_context`.
    fn decode_orphan(&self, row: &AnyRow, with_context: bool) -> Result<Orphan, StoreError> {
        let key = row_key(row.try_get("instance_id")?, row.try_get("binding_id")?);
        let corrupt = |message: String| StoreError::Corrupt {
            key: format!("orphan of {key}"),
            message,
        };
        let kind: String = row.try_get("op_kind")?;
        let step: String = row.try_get("step")?;
        let step = serde_json::from_str(&step).map_err(|e| corrupt(format!("step: {e}")))?;
        let created_at: i64 = row.try_get("resource_created_at")?;
        let step_name: String = row.try_get("step_name")?;
        let context = if with_context {
            let stored: String = row.try_get("context")?;
            let text = self.open_sealed(
                &key,
                "context",
                stored,
                &seal_context(&key, created_at, &step_name),
            )?;
            serde_json::from_str(&text).map_err(|e| corrupt(format!("context: {e}")))?
        } else {
            None
        };
        Ok(Orphan {
            id: row.try_get("id")?,
            resource_created_at: created_at,
            op_kind: OpKind::parse(&kind).ok_or_else(|| corrupt(format!("op_kind {kind:?}")))?,
            op_id: row.try_get("op_id")?,
            step,
            context,
            since: row.try_get("since")?,
            attempts: row.try_get("attempts")?,
            last_error: row.try_get("last_error")?,
            next_attempt_at: row.try_get("next_attempt_at")?,
            key,
        })
    }
}
