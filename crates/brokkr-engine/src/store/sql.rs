//! [`Store`] over SQL, for SQLite (one process, the default) and PostgreSQL (several replicas).
//!
//! Both databases run the same statements; the only differences are connection set-up and the
//! row locking clause used when claiming due operations. The hot path's changes are committed in
//! groups on both: on a SQLite file by one writer thread on a plain rusqlite connection
//! (`writer`), which also reads one resource in the caller's thread (`readers`); on PostgreSQL by
//! committer tasks on connections of sqlx's `Any` pool (`group`), where reads of one resource go
//! in batches too (`batched_reads`; both keep their prepared statements in a `session`). Each
//! keeps the rows it changed lately in memory (`view`): SQLite answers every read of them from
//! there, PostgreSQL, which other replicas change too, only `last_operation` for the operation
//! asked about. On PostgreSQL, a release is announced to every replica (`released`). The rest
//! goes through sqlx. Timestamps are milliseconds since the Unix epoch; JSON is stored as text.
//! The tables and their migrations are in `schema`, the columns of a resource's row in
//! `columns`, how a resource is a row (sealing, decoding) in `row`, the orphans table in
//! `orphans`, a SQLite file's lock and connection settings in `sqlite`.

use async_trait::async_trait;
use brokkr_osb::OperationState;
use sqlx::{AssertSqlSafe, Row};

use super::{Created, Finish, NewStatus, Store, StoreError};
use crate::model::{Event, Key, OpKind, Operation, Orphan, Outputs, Resource, Status};

mod batch;
mod batched_reads;
mod columns;
mod connect;
mod group;
mod orphans;
mod read;
mod readers;
mod released;
mod row;
mod schema;
#[cfg(test)]
mod scratch_table;
mod session;
mod sqlite;
mod statement;
mod view;
mod write;
mod writer;

use columns::{COLUMNS, SEALED_COLUMNS, binding_col, row_key};
use connect::Dialect;
pub use connect::SqlStore;
use row::seal_context;
pub use schema::{Migration, SCHEMA_VERSION, migrations};
use statement::{Arg, Statement, sqlite_sql};
use view::Touches;

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl SqlStore {
    /// Appends an operation's columns, `op_id` to `op_started_at`, in table order.
    fn operation_args(&self, args: &mut Vec<Arg>, key: &Key, op: &Operation) {
        args.extend([
            op.id.as_str().into(),
            op.kind.as_str().into(),
            op.state.as_str().into(),
            op.description.clone().into(),
            self.seal(key, "op_request", &op.update).into(),
            serde_json::to_string(&op.plan)
                .expect("plans serialize")
                .into(),
            to_i64(op.step).into(),
            op.step_started_at.into(),
            op.next_run_at.into(),
            op.deadline_at.into(),
            op.lease_owner.clone().into(),
            op.lease_until.into(),
            op.started_at.into(),
        ]);
    }

    /// The statements that append `events` of `op_id`: a row each for the SQLite writer, which
    /// runs statements in its own thread and caches them prepared; a hundred rows a statement
    /// over sqlx, where each statement costs far more than a row.
    fn event_statements(&self, op_id: &str, events: &[Event]) -> Vec<Statement> {
        let rows = if self.writer.is_some() { 1 } else { 100 };
        events
            .chunks(rows)
            .map(|batch| {
                let values: Vec<String> = (0..batch.len())
                    .map(|i| {
                        let n = i * 5;
                        format!(
                            "(${}, ${}, ${}, ${}, ${})",
                            n + 1,
                            n + 2,
                            n + 3,
                            n + 4,
                            n + 5
                        )
                    })
                    .collect();
                let sql = format!(
                    "INSERT INTO brokkr_events (op_id, at, kind, step, message) VALUES {}",
                    values.join(", ")
                );
                let mut args = Vec::with_capacity(batch.len() * 5);
                for event in batch {
                    args.extend([
                        op_id.into(),
                        event.at.into(),
                        event.kind.as_str().into(),
                        event.step.clone().into(),
                        event.message.clone().into(),
                    ]);
                }
                Statement::new(sql, args)
            })
            .collect()
    }
}

#[async_trait]
impl Store for SqlStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        self.migrate_with(&migrations()).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn get(&self, key: &Key) -> Result<Option<Resource>, StoreError> {
        self.read(key, false, None).await
    }

    async fn get_status(
        &self,
        key: &Key,
        operation: Option<&str>,
    ) -> Result<Option<Resource>, StoreError> {
        self.read(key, true, operation).await
    }

    async fn create(&self, r: &Resource) -> Result<Created, StoreError> {
        let sql = format!(
            "INSERT INTO brokkr_resources ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, \
             $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, NULL, NULL, NULL) \
             ON CONFLICT (instance_id, binding_id) DO UPDATE SET \
             service_id = excluded.service_id, plan_id = excluded.plan_id, attrs = excluded.attrs, \
             status = excluded.status, outputs = excluded.outputs, \
             dashboard_url = excluded.dashboard_url, created_at = excluded.created_at, \
             deleted_at = excluded.deleted_at, op_id = excluded.op_id, op_kind = excluded.op_kind, \
             op_state = excluded.op_state, op_description = excluded.op_description, \
             op_request = excluded.op_request, op_plan = excluded.op_plan, \
             op_step = excluded.op_step, op_step_started_at = excluded.op_step_started_at, \
             op_next_run_at = excluded.op_next_run_at, op_deadline_at = excluded.op_deadline_at, \
             lease_owner = excluded.lease_owner, lease_until = excluded.lease_until, \
             op_started_at = excluded.op_started_at, op_finished_at = excluded.op_finished_at, \
             prev_op_id = NULL, prev_op_state = NULL, prev_op_description = NULL \
             WHERE brokkr_resources.status = 'deleted'"
        );
        let op = &r.op;
        let mut args: Vec<Arg> = vec![
            r.key.instance_id.as_str().into(),
            binding_col(&r.key).into(),
            r.service_id.as_str().into(),
            r.plan_id.as_str().into(),
            self.seal(&r.key, "attrs", &r.attrs).into(),
            r.status.as_str().into(),
            self.seal(&r.key, "outputs", &r.outputs).into(),
            r.dashboard_url.clone().into(),
            r.created_at.into(),
            r.deleted_at.into(),
        ];
        self.operation_args(&mut args, &r.key, op);
        args.push(op.finished_at.into());
        for _ in 0..3 {
            let insert = Statement::new(sql.as_str(), args.clone());
            if self
                .write(insert, Vec::new(), Touches::Resource(r.key.clone()))
                .await?
            {
                return Ok(Created::Inserted);
            }
            // Lost the race to a live row: report it, unless it vanished meanwhile.
            if let Some(existing) = self.get(&r.key).await?
                && existing.status != Status::Deleted
            {
                return Ok(Created::Exists(Box::new(existing)));
            }
        }
        Err(StoreError::Corrupt {
            key: r.key.to_string(),
            message: "insert kept conflicting with a row that is not there".into(),
        })
    }

    async fn start(
        &self,
        key: &Key,
        expected_op: &str,
        op: &Operation,
        status: NewStatus,
    ) -> Result<Option<Resource>, StoreError> {
        let sql = "UPDATE brokkr_resources SET \
             status = CASE WHEN $1 = 'halt' \
                 THEN (CASE WHEN status = 'creating' THEN 'failed' ELSE status END) ELSE $1 END, \
             prev_op_id = op_id, \
             prev_op_state = CASE WHEN op_state = 'in progress' THEN 'failed' ELSE op_state END, \
             prev_op_description = CASE WHEN op_state = 'in progress' \
                 THEN 'halted by a ' || $2 ELSE op_description END, \
             op_id = $3, op_kind = $4, op_state = $5, \
             op_description = $6, op_request = $7, op_plan = $8, op_step = $9, \
             op_step_started_at = $10, op_next_run_at = $11, op_deadline_at = $12, \
             lease_owner = $13, lease_until = $14, op_started_at = $15, op_finished_at = NULL \
             WHERE instance_id = $16 AND binding_id = $17 AND op_id = $18";
        let mut args: Vec<Arg> = vec![
            match status {
                NewStatus::Set(status) => status.as_str(),
                NewStatus::HaltCreation => "halt",
            }
            .into(),
            op.kind.as_str().into(),
        ];
        self.operation_args(&mut args, key, op);
        args.extend([
            key.instance_id.as_str().into(),
            binding_col(key).into(),
            expected_op.into(),
        ]);
        let touches = Touches::Resource(key.clone());
        let statement = Statement::new(sql, args);
        if let Some(group) = &self.group {
            // The row as the start left it, returned by the start itself.
            return match group
                .write(statement.returning(COLUMNS), Vec::new(), touches, true)
                .await?
            {
                (false, _) => Ok(None),
                (true, Some(row)) => self.decode(&row, false).map(Some),
                (true, None) => self.get(key).await, // committed alone: read back
            };
        }
        if !self.write(statement, Vec::new(), touches).await? {
            return Ok(None);
        }
        // On a SQLite file, from the writer's view.
        self.get(key).await
    }

    async fn save_progress(
        &self,
        key: &Key,
        op: &Operation,
        owner: &str,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE brokkr_resources SET op_description = $1, op_step = $2, \
             op_step_started_at = $3, op_next_run_at = $4, lease_until = $5 \
             WHERE instance_id = $6 AND binding_id = $7 AND op_id = $8 \
             AND op_state = 'in progress' AND lease_owner = $9";
        let args = vec![
            op.description.clone().into(),
            to_i64(op.step).into(),
            op.step_started_at.into(),
            op.next_run_at.into(),
            op.lease_until.into(),
            key.instance_id.as_str().into(),
            binding_col(key).into(),
            op.id.as_str().into(),
            owner.into(),
        ];
        let touches = Touches::Resource(key.clone());
        self.write(Statement::new(sql, args), Vec::new(), touches)
            .await
    }

    async fn save_outputs(
        &self,
        key: &Key,
        op_id: &str,
        owner: &str,
        outputs: &Outputs,
        dashboard_url: Option<&str>,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE brokkr_resources SET outputs = $1, \
             dashboard_url = COALESCE($6, dashboard_url) \
             WHERE instance_id = $2 AND binding_id = $3 AND op_id = $4 \
             AND op_state = 'in progress' AND lease_owner = $5";
        let args = vec![
            self.seal(key, "outputs", outputs).into(),
            key.instance_id.as_str().into(),
            binding_col(key).into(),
            op_id.into(),
            owner.into(),
            dashboard_url.map(str::to_owned).into(),
        ];
        let touches = Touches::Resource(key.clone());
        self.write(Statement::new(sql, args), Vec::new(), touches)
            .await
    }

    async fn finish(
        &self,
        key: &Key,
        op_id: &str,
        owner: &str,
        f: &Finish,
        events: &[Event],
    ) -> Result<bool, StoreError> {
        let now = crate::now_ms();
        let state = if f.succeeded {
            OperationState::Succeeded
        } else {
            OperationState::Failed
        };
        let deleted_at = (f.status == Status::Deleted).then_some(now);
        let end = Statement::new(
            "UPDATE brokkr_resources SET op_state = $1, op_description = $2, op_finished_at = $3, \
             lease_owner = NULL, lease_until = 0, status = $4, \
             plan_id = COALESCE($5, plan_id), attrs = COALESCE($6, attrs), \
             outputs = COALESCE($7, outputs), deleted_at = COALESCE($8, deleted_at) \
             WHERE instance_id = $9 AND binding_id = $10 AND op_id = $11 \
             AND op_state = 'in progress' AND lease_owner = $12",
            vec![
                state.as_str().into(),
                f.description.as_str().into(),
                now.into(),
                f.status.as_str().into(),
                f.update.as_ref().map(|u| u.plan_id.clone()).into(),
                (f.update.as_ref())
                    .map(|u| self.seal(key, "attrs", &u.attrs))
                    .into(),
                f.outputs
                    .as_ref()
                    .map(|v| self.seal(key, "outputs", v))
                    .into(),
                deleted_at.into(),
                key.instance_id.as_str().into(),
                binding_col(key).into(),
                op_id.into(),
                owner.into(),
            ],
        );
        // One transaction: the tombstones of the bindings and the events stand only if the
        // operation's end does.
        let mut rest = Vec::new();
        let mut touches = Touches::Resource(key.clone());
        if key.binding_id.is_none() && f.status == Status::Deleted {
            touches = Touches::InstanceAndBindings(key.clone());
            rest.push(Statement::new(
                "UPDATE brokkr_resources SET status = 'deleted', deleted_at = $1, \
                 lease_owner = NULL, lease_until = 0, op_finished_at = $1, \
                 op_state = CASE WHEN op_state = 'in progress' THEN 'failed' ELSE op_state END, \
                 op_description = CASE WHEN op_state = 'in progress' \
                     THEN 'the instance was deprovisioned' ELSE op_description END \
                 WHERE instance_id = $2 AND binding_id <> '' AND status <> 'deleted'",
                vec![now.into(), key.instance_id.as_str().into()],
            ));
        }
        rest.extend(self.event_statements(op_id, events));
        self.write(end, rest, touches).await
    }

    async fn claim_due(
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
        let now = crate::now_ms();
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
        rows.iter()
            .map(|row| {
                Ok(row_key(
                    row.try_get("instance_id")?,
                    row.try_get("binding_id")?,
                ))
            })
            .collect()
    }

    async fn release(&self, key: &Key, op_id: &str, owner: &str) -> Result<(), StoreError> {
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

    async fn release_all(&self) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "UPDATE brokkr_resources SET lease_owner = NULL, lease_until = 0 \
             WHERE lease_owner IS NOT NULL",
        )
        .execute(&self.pool)
        .await?;
        self.forget_all();
        Ok(done.rows_affected() + self.release_orphans().await?)
    }

    async fn record_orphan(&self, orphan: &Orphan) -> Result<(), StoreError> {
        SqlStore::record_orphan(self, orphan).await
    }

    async fn resolve_orphan(
        &self,
        key: &Key,
        created_at: i64,
        step: &str,
    ) -> Result<bool, StoreError> {
        SqlStore::resolve_orphan(self, key, created_at, step).await
    }

    async fn claim_orphans(
        &self,
        owner: &str,
        lease_until: i64,
        limit: i64,
    ) -> Result<Vec<Orphan>, StoreError> {
        SqlStore::claim_orphans(self, owner, lease_until, limit).await
    }

    async fn remove_orphan(&self, id: &str, owner: &str) -> Result<(), StoreError> {
        SqlStore::remove_orphan(self, id, owner).await
    }

    async fn orphan_failed(
        &self,
        id: &str,
        owner: &str,
        error: &str,
        next_attempt_at: i64,
    ) -> Result<(), StoreError> {
        SqlStore::orphan_failed(self, id, owner, error, next_attempt_at).await
    }

    async fn list_orphans(&self, key: Option<&Key>, limit: i64) -> Result<Vec<Orphan>, StoreError> {
        SqlStore::list_orphans(self, key, limit).await
    }

    async fn count_orphans(&self) -> Result<Vec<(OpKind, String, i64)>, StoreError> {
        SqlStore::count_orphans(self).await
    }

    async fn purge_deleted(&self, before: i64) -> Result<u64, StoreError> {
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

    async fn init_setting(&self, name: &str, value: &str) -> Result<String, StoreError> {
        sqlx::query(
            "INSERT INTO brokkr_settings (name, value) VALUES ($1, $2) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(value)
        .execute(&self.pool)
        .await?;
        let row = sqlx::query("SELECT value FROM brokkr_settings WHERE name = $1")
            .bind(name)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get("value")?)
    }

    async fn delete_setting(&self, name: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM brokkr_settings WHERE name = $1")
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn append_events(&self, op_id: &str, events: &[Event]) -> Result<(), StoreError> {
        let mut statements = self.event_statements(op_id, events).into_iter();
        if let Some(first) = statements.next() {
            self.write(first, statements.collect(), Touches::Nothing)
                .await?;
        }
        Ok(())
    }

    async fn events(&self, op_id: &str) -> Result<Vec<Event>, StoreError> {
        let rows = sqlx::query(
            "SELECT at, kind, step, message FROM brokkr_events WHERE op_id = $1 ORDER BY at",
        )
        .bind(op_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Event {
                    at: r.try_get("at")?,
                    kind: r.try_get("kind")?,
                    step: r.try_get("step")?,
                    message: r.try_get("message")?,
                })
            })
            .collect()
    }

    async fn find_operation(&self, op_id: &str) -> Result<Option<Resource>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM brokkr_resources WHERE op_id = $1 OR prev_op_id = $1 LIMIT 1"
        );
        let row = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(op_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(|r| self.decode(r, false)).transpose()
    }

    async fn list_instances(
        &self,
        status: Option<Status>,
        limit: i64,
    ) -> Result<Vec<Resource>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM brokkr_resources WHERE binding_id = '' \
             AND ($1 = '' OR status = $1) ORDER BY created_at DESC LIMIT $2"
        );
        let rows = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(status.map_or("", Status::as_str))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| self.decode(r, false)).collect()
    }

    async fn rekey(&self) -> Result<u64, StoreError> {
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

    fn shared(&self) -> bool {
        self.dialect == Dialect::Postgres
    }

    async fn work_released(&self) {
        match self.dialect {
            Dialect::Postgres => self.released.notified().await,
            Dialect::Sqlite => std::future::pending().await,
        }
    }
}
