//! Reading resources. One resource: from the view when it shows the row (on PostgreSQL, only an
//! operation's status, lately committed here), else on a SQLite file from a reader connection
//! (`readers`), on PostgreSQL in a batch of reads (`batched_reads`), or over sqlx. The resource
//! of an operation and the instances of a status: over sqlx.

use std::time::Duration;

use sqlx::AssertSqlSafe;

use super::columns::{COLUMNS, SELECT_ROW, SELECT_STATUS, binding_col};
use super::connect::{Dialect, SqlStore};
use super::view::RowValues;
use crate::model::{Key, Resource, Status};
use crate::store::error::StoreError;

/// How long, on PostgreSQL, the view answers for the status of an operation after this
/// process last committed a change of it. Another replica may change the row meanwhile (start
/// another operation, take over this one); the view answers only for the operation asked about,
/// whose state moves only from in progress to ended, so that at worst it says "in progress" for
/// this long after another replica ended it.
const PG_VIEW_AGE: Duration = Duration::from_secs(2);

impl SqlStore {
    /// Reads the row of `key`, decoded in full or for its status only: from the view when it
    /// has it (on PostgreSQL, only the status of `operation` committed here lately, see
    /// [`PG_VIEW_AGE`]).
    pub(super) async fn read(
        &self,
        key: &Key,
        status_only: bool,
        operation: Option<&str>,
    ) -> Result<Option<Resource>, StoreError> {
        let decode = |row: &RowValues| self.decode(row, status_only);
        let shown = match (self.dialect, &self.view, operation) {
            (Dialect::Sqlite, Some(view), _) => view.read(key, decode),
            (Dialect::Postgres, Some(view), Some(op_id)) if status_only => {
                view.read_recent(key, op_id, PG_VIEW_AGE, decode)
            }
            _ => None,
        };
        if let Some(r) = shown {
            return r.map(Some);
        }
        if let Some(readers) = &self.readers {
            return readers.read(|conn| {
                let row = RowValues::read(conn, key, status_only)?;
                row.map(|row| self.decode(&row, status_only)).transpose()
            });
        }
        if let Some(reads) = &self.reads {
            let row = reads.read(key, status_only).await?;
            return row.map(|row| self.decode(&row, status_only)).transpose();
        }
        let sql = if status_only {
            &SELECT_STATUS
        } else {
            &SELECT_ROW
        };
        let row = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(&key.instance_id)
            .bind(binding_col(key))
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref()
            .map(|r| self.decode(r, status_only))
            .transpose()
    }

    pub(super) async fn find_operation(&self, op_id: &str) -> Result<Option<Resource>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM brokkr_resources WHERE op_id = $1 OR prev_op_id = $1 LIMIT 1"
        );
        let row = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(op_id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(|r| self.decode(r, false)).transpose()
    }

    pub(super) async fn list_instances(
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
}
