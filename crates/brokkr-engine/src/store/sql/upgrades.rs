//! Fleet upgrades: the orchestrations table and the instances of each, the lease a broker holds
//! on an orchestration while it drives it, and the reads of instances by plan and by
//! maintenance version that choosing and counting them need.

use std::collections::BTreeMap;

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};

use super::columns::{COLUMNS, row_key};
use super::connect::{Dialect, SqlStore};
use crate::model::{
    ItemState, Orchestration, OrchestrationState, Resource, UpgradeItem, VersionCount,
};
use crate::store::error::StoreError;

pub(super) const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS brokkr_upgrades (
        id TEXT PRIMARY KEY,
        service_id TEXT NOT NULL,
        plan_id TEXT NOT NULL,
        target_version TEXT NOT NULL,
        max_parallel BIGINT NOT NULL,
        canary BIGINT NOT NULL,
        max_failures BIGINT NOT NULL,
        state TEXT NOT NULL,
        description TEXT,
        created_at BIGINT NOT NULL,
        finished_at BIGINT,
        lease_owner TEXT,
        lease_until BIGINT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS brokkr_upgrade_items (
        upgrade_id TEXT NOT NULL,
        instance_id TEXT NOT NULL,
        position BIGINT NOT NULL,
        from_version TEXT,
        state TEXT NOT NULL,
        op_id TEXT,
        description TEXT,
        PRIMARY KEY (upgrade_id, instance_id)
    )",
];

/// The orchestrations a broker drives: running and paused ones, and cancelled ones whose
/// upgrades under way it still follows.
const DRIVEN: &str = "(state IN ('running', 'paused') OR (state = 'cancelled' AND EXISTS ( \
    SELECT 1 FROM brokkr_upgrade_items i \
    WHERE i.upgrade_id = brokkr_upgrades.id AND i.state = 'in progress')))";

const UPGRADE_COLUMNS: &str = "id, service_id, plan_id, target_version, max_parallel, canary, \
    max_failures, state, description, created_at, finished_at";

fn orchestration(row: &AnyRow) -> Result<Orchestration, StoreError> {
    let id: String = row.try_get("id")?;
    let state: String = row.try_get("state")?;
    let state = OrchestrationState::parse(&state).ok_or_else(|| StoreError::Corrupt {
        key: format!("upgrade {id}"),
        message: format!("state {state:?}"),
    })?;
    Ok(Orchestration {
        service_id: row.try_get("service_id")?,
        plan_id: row.try_get("plan_id")?,
        target_version: row.try_get("target_version")?,
        max_parallel: row.try_get("max_parallel")?,
        canary: row.try_get("canary")?,
        max_failures: row.try_get("max_failures")?,
        state,
        description: row.try_get("description")?,
        created_at: row.try_get("created_at")?,
        finished_at: row.try_get("finished_at")?,
        id,
    })
}

fn item(row: &AnyRow) -> Result<UpgradeItem, StoreError> {
    let instance_id: String = row.try_get("instance_id")?;
    let state: String = row.try_get("state")?;
    let state = ItemState::parse(&state).ok_or_else(|| StoreError::Corrupt {
        key: format!("upgrade of instance {instance_id}"),
        message: format!("state {state:?}"),
    })?;
    Ok(UpgradeItem {
        position: row.try_get("position")?,
        from_version: row.try_get("from_version")?,
        state,
        op_id: row.try_get("op_id")?,
        description: row.try_get("description")?,
        instance_id,
    })
}

/// The part of an instance's attributes the version count reads.
#[derive(serde::Deserialize)]
struct Versioned {
    maintenance_info: Option<Version>,
}

#[derive(serde::Deserialize)]
struct Version {
    version: String,
}

impl SqlStore {
    pub(super) async fn create_orchestration(
        &self,
        o: &Orchestration,
        items: &[UpgradeItem],
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO brokkr_upgrades (id, service_id, plan_id, target_version, max_parallel, \
             canary, max_failures, state, description, created_at, finished_at, lease_owner, \
             lease_until) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, NULL, 0)",
        )
        .bind(&o.id)
        .bind(&o.service_id)
        .bind(&o.plan_id)
        .bind(&o.target_version)
        .bind(o.max_parallel)
        .bind(o.canary)
        .bind(o.max_failures)
        .bind(o.state.as_str())
        .bind(&o.description)
        .bind(o.created_at)
        .bind(o.finished_at)
        .execute(&mut *tx)
        .await?;
        for i in items {
            sqlx::query(
                "INSERT INTO brokkr_upgrade_items (upgrade_id, instance_id, position, \
                 from_version, state, op_id, description) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(&o.id)
            .bind(&i.instance_id)
            .bind(i.position)
            .bind(&i.from_version)
            .bind(i.state.as_str())
            .bind(&i.op_id)
            .bind(&i.description)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn list_orchestrations(
        &self,
        limit: i64,
    ) -> Result<Vec<Orchestration>, StoreError> {
        let sql = format!(
            "SELECT {UPGRADE_COLUMNS} FROM brokkr_upgrades ORDER BY created_at DESC LIMIT $1"
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(orchestration).collect()
    }

    pub(super) async fn orchestration(
        &self,
        id: &str,
    ) -> Result<Option<(Orchestration, Vec<UpgradeItem>)>, StoreError> {
        let sql = format!("SELECT {UPGRADE_COLUMNS} FROM brokkr_upgrades WHERE id = $1");
        let Some(row) = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
        else {
            return Ok(None);
        };
        let rows = sqlx::query(
            "SELECT instance_id, position, from_version, state, op_id, description \
             FROM brokkr_upgrade_items WHERE upgrade_id = $1 ORDER BY position",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        let items = rows.iter().map(item).collect::<Result<_, _>>()?;
        Ok(Some((orchestration(&row)?, items)))
    }

    pub(super) async fn set_orchestration_state(
        &self,
        id: &str,
        from: &[OrchestrationState],
        to: OrchestrationState,
        description: Option<&str>,
    ) -> Result<bool, StoreError> {
        // The states are this crate's own spellings, never a caller's text.
        let from: Vec<String> = from.iter().map(|s| format!("'{}'", s.as_str())).collect();
        let sql = format!(
            "UPDATE brokkr_upgrades SET state = $1, description = $2, finished_at = $3 \
             WHERE id = $4 AND state IN ({})",
            from.join(", ")
        );
        let finished_at = to.is_final().then(crate::clock::now_ms);
        let done = sqlx::query(AssertSqlSafe(sql))
            .bind(to.as_str())
            .bind(description)
            .bind(finished_at)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    pub(super) async fn claim_orchestrations(
        &self,
        owner: &str,
        lease_until: i64,
    ) -> Result<Vec<String>, StoreError> {
        // One process uses a SQLite store: a lease left by an earlier run of it is void.
        let now = match self.dialect {
            Dialect::Postgres => crate::clock::now_ms(),
            Dialect::Sqlite => i64::MAX,
        };
        // Most of the time there is nothing to drive: a read says so without writing.
        let driven = format!("SELECT id FROM brokkr_upgrades WHERE {DRIVEN} LIMIT 1");
        let any = sqlx::query(AssertSqlSafe(driven))
            .fetch_optional(&self.pool)
            .await?;
        if any.is_none() {
            return Ok(Vec::new());
        }
        let claim = format!(
            "UPDATE brokkr_upgrades SET lease_owner = $1, lease_until = $2 WHERE {DRIVEN} \
             AND (lease_owner IS NULL OR lease_owner = $1 OR lease_until < $3) RETURNING id"
        );
        let rows = sqlx::query(AssertSqlSafe(claim))
            .bind(owner)
            .bind(lease_until)
            .bind(now)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| r.try_get("id").map_err(Into::into))
            .collect()
    }

    pub(super) async fn save_upgrade_item(
        &self,
        id: &str,
        owner: &str,
        item: &UpgradeItem,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE brokkr_upgrade_items SET state = $1, op_id = $2, description = $3 \
             WHERE upgrade_id = $4 AND instance_id = $5 AND EXISTS ( \
                 SELECT 1 FROM brokkr_upgrades WHERE id = $4 AND lease_owner = $6)",
        )
        .bind(item.state.as_str())
        .bind(&item.op_id)
        .bind(&item.description)
        .bind(id)
        .bind(&item.instance_id)
        .bind(owner)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    pub(super) async fn plan_instances(
        &self,
        service_id: &str,
        plan_id: &str,
    ) -> Result<Vec<Resource>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM brokkr_resources WHERE binding_id = '' AND status = 'ready' \
             AND service_id = $1 AND plan_id = $2 ORDER BY created_at, instance_id"
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(service_id)
            .bind(plan_id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| self.decode(r, false)).collect()
    }

    pub(super) async fn count_instance_versions(&self) -> Result<Vec<VersionCount>, StoreError> {
        let rows = sqlx::query(
            "SELECT instance_id, service_id, plan_id, attrs FROM brokkr_resources \
             WHERE binding_id = '' AND status = 'ready'",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut counts: BTreeMap<(String, String, Option<String>), i64> = BTreeMap::new();
        for row in &rows {
            let key = row_key(row.try_get("instance_id")?, String::new());
            let attrs = self.open(&key, "attrs", row.try_get("attrs")?)?;
            let attrs: Versioned =
                serde_json::from_str(&attrs).map_err(|e| StoreError::Corrupt {
                    key: key.to_string(),
                    message: format!("attrs: {e}"),
                })?;
            let version = attrs.maintenance_info.map(|m| m.version);
            let group = (row.try_get("service_id")?, row.try_get("plan_id")?, version);
            *counts.entry(group).or_default() += 1;
        }
        Ok(counts
            .into_iter()
            .map(|((service_id, plan_id, version), count)| VersionCount {
                service_id,
                plan_id,
                version,
                count,
            })
            .collect())
    }
}
