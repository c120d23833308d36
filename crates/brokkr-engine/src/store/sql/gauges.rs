//! What the broker's gauges count from the store at each scrape: instances and bindings by plan
//! and status, the operations in progress, by kind and plan, and those of them that no engine is
//! running (past their deadline, or due and unclaimed).

use sqlx::Row;

use super::connect::SqlStore;
use super::row::count_kind;
use crate::model::Status;
use crate::store::api::{InProgress, ResourceCount};
use crate::store::error::StoreError;

impl SqlStore {
    pub(super) async fn count_in_progress(
        &self,
        now: i64,
        unclaimed_since: i64,
    ) -> Result<Vec<InProgress>, StoreError> {
        // The WHERE is the due index's own, so only in-progress rows are read.
        let rows = sqlx::query(
            "SELECT op_kind, service_id, plan_id, COUNT(*) AS n, \
               CAST(SUM(CASE WHEN op_deadline_at < $1 THEN 1 ELSE 0 END) AS BIGINT) AS overdue, \
               CAST(SUM(CASE WHEN op_next_run_at < $2 AND lease_until < $2 THEN 1 ELSE 0 END) \
                 AS BIGINT) AS unclaimed \
             FROM brokkr_resources WHERE op_state = 'in progress' \
             GROUP BY op_kind, service_id, plan_id",
        )
        .bind(now)
        .bind(unclaimed_since)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(InProgress {
                    kind: count_kind(r, "brokkr_resources")?,
                    service_id: r.try_get("service_id")?,
                    plan_id: r.try_get("plan_id")?,
                    count: r.try_get("n")?,
                    overdue: r.try_get("overdue")?,
                    unclaimed: r.try_get("unclaimed")?,
                })
            })
            .collect()
    }

    pub(super) async fn count_resources(&self) -> Result<Vec<ResourceCount>, StoreError> {
        let rows = sqlx::query(
            "SELECT CAST(CASE WHEN binding_id = '' THEN 0 ELSE 1 END AS BIGINT) AS binding, service_id, plan_id, \
               status, COUNT(*) AS n \
             FROM brokkr_resources GROUP BY 1, service_id, plan_id, status",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let status: String = r.try_get("status")?;
                let status = Status::parse(&status).ok_or_else(|| StoreError::Corrupt {
                    key: "brokkr_resources".into(),
                    message: format!("status {status:?}"),
                })?;
                let binding: i64 = r.try_get("binding")?;
                Ok(ResourceCount {
                    bindings: binding == 1,
                    service_id: r.try_get("service_id")?,
                    plan_id: r.try_get("plan_id")?,
                    status,
                    count: r.try_get("n")?,
                })
            })
            .collect()
    }
}
