//! How a change of the hot path reaches the database: on a SQLite file through the writer thread
//! (`writer`), on PostgreSQL through the committers (`group`), else in a transaction of its own;
//! and emptying the view after a change made past it.

use super::columns::STATUS_COLUMNS;
use super::connect::SqlStore;
use super::group;
use super::statement::Statement;
use super::view::Touches;
use crate::store::error::StoreError;

impl SqlStore {
    /// Empties the view, after a change of rows made outside the writer.
    pub(super) fn forget_all(&self) {
        if let Some(view) = &self.view {
            view.clear();
        }
    }

    /// Runs `first` and, if it changed a row, `rest`, in one transaction; returns whether
    /// `first` changed a row (when it did not, nothing changes). On a SQLite file this is one
    /// change of the writer's next group commit, which the view shows as `touches` says.
    pub(super) async fn write(
        &self,
        first: Statement,
        rest: Vec<Statement>,
        touches: Touches,
    ) -> Result<bool, StoreError> {
        if let Some(writer) = &self.writer {
            return writer
                .write(touches, move |conn| {
                    if first.run(conn)? == 0 {
                        return Ok(false);
                    }
                    for statement in &rest {
                        statement.run(conn)?;
                    }
                    Ok(true)
                })
                .await;
        }
        if let Some(group) = &self.group {
            let first = match touches {
                Touches::Nothing => first,
                _ => first.returning(&STATUS_COLUMNS),
            };
            return Ok(group.write(first, rest, touches, false).await?.0);
        }
        group::alone(&self.pool, &first, &rest).await
    }
}
