//! PostgreSQL's write path: group commit through a committer task.
//!
//! Over sqlx, each change of the hot path (creating a resource, starting an operation, saving
//! its progress, outputs and end, its events, releasing it) was a transaction of its own: a
//! round trip per statement plus `BEGIN` and `COMMIT`, and a WAL flush per change. Here those
//! changes go to a committer task on one pooled connection. Whenever it is free it takes every
//! change waiting, up to [`MAX_BATCH`], runs them in order in one transaction, commits it once,
//! and only then answers each caller, so that a caller still hears of its change only once it is
//! committed. Alone, a change commits at once; under load, the changes that arrive during a
//! commit share the next one.
//!
//! A change is a compare-and-set statement and the statements that stand only if it changed a
//! row ([`SqlStore::write`](super::SqlStore)): a change whose first statement changes nothing
//! changes nothing, so no savepoint is needed around it. Should a statement fail (a constraint,
//! a deadlock with another replica), PostgreSQL aborts the whole transaction: it is rolled back
//! and each of its changes is run again in a transaction of its own, so that the failure stays
//! with the change that caused it. A failed `COMMIT` is reported to every caller of the batch, as
//! a failed commit of its own transaction was before.

use std::sync::Arc;

use sqlx::AnyPool;
use tokio::sync::{Mutex, mpsc, oneshot};

use super::statement::Statement;
use super::view::{RowValues, Seen, Touches, View};
use crate::store::StoreError;

/// Most changes in one transaction: bounds how long a commit keeps its callers waiting.
const MAX_BATCH: usize = 256;

/// One change: `first` and, if it changed a row, `rest`; answered with whether it did. When it
/// `touches` a resource, `first` returns that resource's status columns (`RETURNING`), which
/// the view shows once the change is committed.
struct Change {
    first: Statement,
    rest: Vec<Statement>,
    touches: Touches,
    reply: oneshot::Sender<Result<bool, StoreError>>,
}

/// The committers' handle; they end when it is dropped.
pub(super) struct GroupCommit {
    changes: mpsc::UnboundedSender<Change>,
}

impl GroupCommit {
    /// Starts `committers` tasks that commit the changes sent to them on `pool`'s connections
    /// and show in `view` what they committed.
    pub(super) fn start(pool: &AnyPool, committers: usize, view: &Arc<View>) -> Self {
        let (changes, queue) = mpsc::unbounded_channel();
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..committers {
            tokio::spawn(run(pool.clone(), queue.clone(), view.clone()));
        }
        Self { changes }
    }

    /// Runs `first` and, if it changed a row, `rest`, in the next batch; returns whether `first`
    /// changed a row, once that batch is committed. When the change `touches` a resource,
    /// `first` must return its [`STATUS_COLUMNS`](super::row::STATUS_COLUMNS).
    pub(super) async fn write(
        &self,
        first: Statement,
        rest: Vec<Statement>,
        touches: Touches,
    ) -> Result<bool, StoreError> {
        let (reply, answer) = oneshot::channel();
        let gone = || StoreError::Sqlite("the PostgreSQL committer has stopped".into());
        let change = Change {
            first,
            rest,
            touches,
            reply,
        };
        self.changes.send(change).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// A committer: a batch of every change waiting (taken while it holds the queue, so that two
/// committers never split what arrived together), one transaction, then the answers.
async fn run(pool: AnyPool, queue: Arc<Mutex<mpsc::UnboundedReceiver<Change>>>, view: Arc<View>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        {
            let mut queue = queue.lock().await;
            let Some(first) = queue.recv().await else {
                return;
            };
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(change) => batch.push(change),
                    Err(_) => break,
                }
            }
        }
        match commit(&pool, &batch).await {
            Ok(Ok(rows)) => {
                let changed: Vec<bool> = rows.iter().map(|(changed, _)| *changed).collect();
                let seen = batch
                    .iter()
                    .zip(rows)
                    .map(|(change, (_, row))| Seen::new(change.touches.clone(), row));
                view.publish(seen);
                for (change, changed) in batch.drain(..).zip(changed) {
                    let _ = change.reply.send(Ok(changed));
                }
            }
            Ok(Err(commit_failed)) => {
                let message = commit_failed.to_string();
                for change in batch.drain(..) {
                    let error = sqlx::Error::Protocol(format!("commit failed: {message}"));
                    let _ = change.reply.send(Err(error.into()));
                }
            }
            Err(_) => {
                // A statement failed and took the transaction with it: each change alone, and
                // the view forgets what they touch.
                let seen = batch.iter().map(|c| Seen::new(c.touches.clone(), None));
                view.publish(seen);
                for change in batch.drain(..) {
                    let result = alone(&pool, &change.first, &change.rest).await;
                    let _ = change.reply.send(result);
                }
            }
        }
    }
}

/// What a committed change did: whether its first statement changed a row, and the status
/// columns of the resource it touches, as it left them.
type Outcome = (bool, Option<RowValues>);

/// Runs `batch` in one transaction. `Err` when a statement failed (nothing was committed);
/// `Ok(Err)` when the commit failed; else what each change did.
async fn commit(
    pool: &AnyPool,
    batch: &[Change],
) -> Result<Result<Vec<Outcome>, sqlx::Error>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let mut outcomes = Vec::with_capacity(batch.len());
    for change in batch {
        let outcome = match change.touches {
            Touches::Nothing => {
                let done = change.first.query().execute(&mut *tx).await?;
                (done.rows_affected() > 0, None)
            }
            Touches::Resource(_) | Touches::InstanceAndBindings(_) => {
                let row = change.first.query().fetch_optional(&mut *tx).await?;
                (
                    row.is_some(),
                    row.as_ref().map(RowValues::from_any).transpose()?,
                )
            }
        };
        if outcome.0 {
            for statement in &change.rest {
                statement.query().execute(&mut *tx).await?;
            }
        }
        outcomes.push(outcome);
    }
    Ok(tx.commit().await.map(|()| outcomes))
}

/// Runs `first` and, if it changed a row, `rest`, in a transaction of their own (one statement
/// alone needs none); returns whether `first` changed a row.
pub(super) async fn alone(
    pool: &AnyPool,
    first: &Statement,
    rest: &[Statement],
) -> Result<bool, StoreError> {
    if rest.is_empty() {
        return Ok(first.query().execute(pool).await?.rows_affected() > 0);
    }
    let mut tx = pool.begin().await?;
    if first.query().execute(&mut *tx).await?.rows_affected() == 0 {
        tx.rollback().await?;
        return Ok(false);
    }
    for statement in rest {
        statement.query().execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(true)
}
