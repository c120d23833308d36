//! PostgreSQL's write path: group commit through committer tasks.
//!
//! Over sqlx, each change of the hot path (creating a resource, starting an operation, saving
//! its progress, outputs and end, its events, releasing it) was a transaction of its own: a
//! round trip per statement plus `BEGIN` and `COMMIT`, and a WAL flush per change. Here those
//! changes go to one of [`COMMITTERS`] tasks, each on a connection of its own, chosen by the
//! resource's instance. Whenever a committer is free it takes every change waiting for it, up to
//! [`MAX_BATCH`], runs them in order in one transaction, commits it once, and only then answers
//! each caller, so that a caller still hears of its change only once it is committed. Alone, a
//! change commits at once; under load, the changes that arrive during a commit share the next
//! one.
//!
//! A batch runs in one transaction, in one or two round trips (`batch`).
//!
//! A change is a compare-and-set statement and the statements that stand only if it changed a
//! row ([`SqlStore::write`](super::connect::SqlStore)): a change whose first statement changes
//! nothing changes nothing, so no savepoint is needed around it. Should a statement fail (a
//! constraint, a deadlock with another replica), PostgreSQL aborts the whole transaction: it is
//! rolled back and each of its changes is run again in a transaction of its own, with bound
//! parameters, so that the failure stays with the change that caused it. A failed `COMMIT`, or a
//! connection lost while the server may have committed, is reported to every caller of the
//! batch, as a failed commit of its own transaction was before.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use sqlx::AnyPool;
use tokio::sync::{mpsc, oneshot};

use super::batch::{Change, Outcome, commit};
use super::statement::Statement;
use super::view::{Seen, Touches, View};
use crate::store::error::StoreError;

/// Most changes in one transaction: bounds how long a commit keeps its callers waiting.
const MAX_BATCH: usize = 256;

/// How many committers run at once, each on a connection of its own. A single committer is
/// bound by its batches' latency (two round trips and a commit, one after the other), not by
/// the database; more than two make more and smaller batches, each a commit (measured in
/// docs/benchmarks.md: one, two and four).
const COMMITTERS: usize = 2;

/// The committers' handle; they end when it is dropped.
pub(super) struct GroupCommit {
    /// A queue per committer.
    committers: Vec<mpsc::UnboundedSender<Change>>,
}

impl GroupCommit {
    /// Starts [`COMMITTERS`] committers, which commit the changes sent to them on `pool`'s
    /// connections and show in `view` what they committed. The changes of one instance and its
    /// bindings all go to one committer, so that the view gets them in commit order, and two
    /// committers never wait for each other's row locks.
    pub(super) fn start(pool: &AnyPool, view: &Arc<View>) -> Self {
        let committers = (0..COMMITTERS)
            .map(|_| {
                let (changes, queue) = mpsc::unbounded_channel();
                tokio::spawn(run(pool.clone(), queue, view.clone()));
                changes
            })
            .collect();
        Self { committers }
    }

    /// Runs `first` and, if it changed a row, `rest`, in the next batch; returns whether `first`
    /// changed a row, once that batch is committed, and when `returns`, the row it returned
    /// (`None` when it was committed alone). When the change `touches` a resource, `first` must
    /// return its [`STATUS_COLUMNS`](super::columns::STATUS_COLUMNS) or all its columns.
    pub(super) async fn write(
        &self,
        first: Statement,
        rest: Vec<Statement>,
        touches: Touches,
        returns: bool,
    ) -> Result<Outcome, StoreError> {
        let (reply, answer) = oneshot::channel();
        let gone = || StoreError::Sqlite("the PostgreSQL committer has stopped".into());
        let change = Change {
            first,
            rest,
            touches,
            returns,
            reply,
        };
        let committer = match &change.touches {
            Touches::Nothing => 0,
            Touches::Resource(key) | Touches::InstanceAndBindings(key) => {
                let mut hasher = DefaultHasher::new();
                key.instance_id.hash(&mut hasher);
                usize::try_from(hasher.finish() % COMMITTERS as u64).unwrap_or(0)
            }
        };
        self.committers[committer]
            .send(change)
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// A committer: a batch of every change waiting in its queue, one transaction, then the view,
/// then the answers.
async fn run(pool: AnyPool, mut queue: mpsc::UnboundedReceiver<Change>, view: Arc<View>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut session = None;
    // Waits for one, then takes every one waiting; 0 once the store is gone.
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        match commit(&pool, &mut session, &batch).await {
            Ok(Ok(rows)) => {
                let answers: Vec<Outcome> = batch
                    .iter()
                    .zip(&rows)
                    .map(|(change, (changed, row))| {
                        (*changed, row.as_ref().filter(|_| change.returns).cloned())
                    })
                    .collect();
                let seen = batch
                    .iter()
                    .zip(rows)
                    .map(|(change, (_, row))| Seen::new(change.touches.clone(), row));
                view.publish(seen);
                for (change, answer) in batch.drain(..).zip(answers) {
                    let _ = change.reply.send(Ok(answer));
                }
            }
            Ok(Err(commit_failed)) => {
                // Committed or not, nobody knows: the view forgets what the batch touched.
                let seen = batch.iter().map(|c| Seen::new(c.touches.clone(), None));
                view.publish(seen);
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
                    let _ = change.reply.send(result.map(|changed| (changed, None)));
                }
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use sqlx::Row;

    use super::*;
    use crate::store::sql::scratch_table::{count, table};

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn every_change_is_committed_when_its_caller_is_answered() {
        let (pool, drop_schema) = table().await;
        let group = Arc::new(GroupCommit::start(&pool, &Arc::new(View::new())));
        let mut tasks = Vec::new();
        for k in 0..300_i64 {
            let (group, pool) = (group.clone(), pool.clone());
            tasks.push(tokio::spawn(async move {
                let insert =
                    Statement::new("INSERT INTO t (k, v) VALUES ($1, 'x')", vec![k.into()]);
                // Changes only if the insert did: the second statement of a change.
                let update = Statement::new("UPDATE t SET v = 'y' WHERE k = $1", vec![k.into()]);
                let changed = group
                    .write(insert, vec![update], Touches::Nothing, false)
                    .await
                    .unwrap();
                assert!(changed.0);
                // Another connection sees all of it as soon as the caller is answered.
                let sql = "SELECT count(*) FROM t WHERE k = $1 AND v = 'y'";
                assert_eq!(count(&pool, sql, k).await, 1, "change {k} answered early");
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(
            count(&pool, "SELECT count(*) FROM t WHERE k >= $1", 0).await,
            300
        );
        sqlx::query(sqlx::AssertSqlSafe(drop_schema))
            .execute(&pool)
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_failing_change_fails_alone_and_one_that_changes_nothing_goes_no_further() {
        let (pool, drop_schema) = table().await;
        let group = Arc::new(GroupCommit::start(&pool, &Arc::new(View::new())));
        let mut tasks = Vec::new();
        for k in 0..100_i64 {
            let group = group.clone();
            tasks.push(tokio::spawn(async move {
                let insert =
                    Statement::new("INSERT INTO t (k, v) VALUES ($1, 'x')", vec![k.into()]);
                let rest = match k % 10 {
                    // Its first row was written; the failure takes it back.
                    0 => vec![Statement::new(
                        "INSERT INTO t (k, v) VALUES ($1, NULL)",
                        vec![(k + 1000).into()],
                    )],
                    _ => Vec::new(),
                };
                let first = group.write(insert, rest, Touches::Nothing, false).await;
                // A compare-and-set that misses: its second statement does not run.
                let miss = Statement::new(
                    "UPDATE t SET v = 'y' WHERE k = $1 AND v = 'z'",
                    vec![k.into()],
                );
                let delete = Statement::new("DELETE FROM t WHERE k = $1", vec![k.into()]);
                let second = group
                    .write(miss, vec![delete], Touches::Nothing, false)
                    .await;
                (first.map(|(changed, _)| changed), second.unwrap().0)
            }));
        }
        for (k, task) in (0..).zip(tasks) {
            let (first, second) = task.await.unwrap();
            assert!(!second, "change {k}: the update changed nothing");
            match k % 10 {
                0 => assert!(first.is_err(), "change {k}: {first:?}"),
                _ => assert!(first.unwrap()),
            }
        }
        let rows = sqlx::query("SELECT k FROM t ORDER BY k")
            .fetch_all(&pool)
            .await
            .unwrap();
        let rows: Vec<i64> = rows.iter().map(|r| r.try_get(0).unwrap()).collect();
        let expected: Vec<i64> = (0..100).filter(|k| k % 10 != 0).collect();
        assert_eq!(rows, expected);
        sqlx::query(sqlx::AssertSqlSafe(drop_schema))
            .execute(&pool)
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn values_written_in_as_literals_are_stored_exactly_and_change_no_statement() {
        let (pool, drop_schema) = table().await;
        let group = Arc::new(GroupCommit::start(&pool, &Arc::new(View::new())));
        const HOSTILE: [&str; 9] = [
            "it's",
            "\\",
            "\\'); DELETE FROM t; --",
            "'; DROP TABLE t; --",
            "E'\\x00'",
            "$1 $2 $$ $",
            "line\nbreak\ttab \r",
            "ünïcödé ✓ 🦀",
            "",
        ];
        let mut tasks = Vec::new();
        for (k, value) in (0_i64..).zip(HOSTILE.iter().chain(&["nul \0 inside"])) {
            let group = group.clone();
            tasks.push(tokio::spawn(async move {
                let insert = Statement::new(
                    "INSERT INTO t (k, v) VALUES ($1, $2)",
                    vec![k.into(), (*value).into()],
                );
                let written = group
                    .write(insert, Vec::new(), Touches::Nothing, false)
                    .await;
                written.map(|(changed, _)| changed)
            }));
        }
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.unwrap());
        }
        // PostgreSQL's text holds no NUL: that change fails, as it does bound, and alone.
        let (nul, stored) = results.split_last().unwrap();
        assert!(nul.is_err(), "{nul:?}");
        assert!(stored.iter().all(|r| matches!(r, Ok(true))), "{stored:?}");
        let rows = sqlx::query("SELECT k, v FROM t ORDER BY k")
            .fetch_all(&pool)
            .await
            .unwrap();
        let rows: Vec<(i64, String)> = rows
            .iter()
            .map(|r| (r.try_get(0).unwrap(), r.try_get(1).unwrap()))
            .collect();
        let expected: Vec<(i64, String)> = (0..).zip(HOSTILE.map(String::from)).collect();
        assert_eq!(rows, expected);
        sqlx::query(sqlx::AssertSqlSafe(drop_schema))
            .execute(&pool)
            .await
            .unwrap();
    }
}
