//! An operation's events: appended in statements of one row or of a hundred, read back in order.

use sqlx::Row;

use super::connect::SqlStore;
use super::statement::Statement;
use super::view::Touches;
use crate::model::Event;
use crate::store::error::StoreError;

impl SqlStore {
    /// The statements that append `events` of `op_id`: a row each for the SQLite writer, which
    /// runs statements in its own thread and caches them prepared; a hundred rows a statement
    /// over sqlx, where each statement costs far more than a row.
    pub(super) fn event_statements(&self, op_id: &str, events: &[Event]) -> Vec<Statement> {
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

    pub(super) async fn append_events(
        &self,
        op_id: &str,
        events: &[Event],
    ) -> Result<(), StoreError> {
        let mut statements = self.event_statements(op_id, events).into_iter();
        if let Some(first) = statements.next() {
            self.write(first, statements.collect(), Touches::Nothing)
                .await?;
        }
        Ok(())
    }

    pub(super) async fn events(&self, op_id: &str) -> Result<Vec<Event>, StoreError> {
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
}
