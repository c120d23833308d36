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
//! A batch costs two round trips: `BEGIN` and the first statement of every change in one query,
//! then the statements of the changes whose first statement changed a row, and `COMMIT`, in
//! another; one round trip when every change of the batch is one statement (`COMMIT` then ends
//! the first query); a round trip more for every 16 KiB a batch's statements take beyond the
//! first (`session::queries`). Both are queries of several statements, which
//! PostgreSQL's simple query protocol runs in one message but without parameters: each statement
//! is prepared once on the committer's connection, its parameters typed as they are bound, and
//! run as an `EXECUTE` with its arguments written in as literals ([`Statement::literals`]).
//!
//! A change is a compare-and-set statement and the statements that stand only if it changed a
//! row ([`SqlStore::write`](super::SqlStore)): a change whose first statement changes nothing
//! changes nothing, so no savepoint is needed around it. Should a statement fail (a constraint,
//! a deadlock with another replica), PostgreSQL aborts the whole transaction: it is rolled back
//! and each of its changes is run again in a transaction of its own, with bound parameters, so
//! that the failure stays with the change that caused it. A failed `COMMIT`, or a connection lost
//! while the server may have committed, is reported to every caller of the batch, as a failed
//! commit of its own transaction was before.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use futures::StreamExt;
use sqlx::{AnyConnection, AnyPool, AssertSqlSafe, Either};
use tokio::sync::{mpsc, oneshot};

use super::session::{Session, queries};
use super::statement::Statement;
use super::view::{RowValues, Seen, Touches, View};
use crate::store::StoreError;

/// Most changes in one transaction: bounds how long a commit keeps its callers waiting.
const MAX_BATCH: usize = 256;

/// How many committers run at once, each on a connection of its own. A single committer is
/// bound by its batches' latency (two round trips and a commit, one after the other), not by
/// the database; more than two make more and smaller batches, each a commit (measured in
/// docs/benchmarks.md: one, two and four).
const COMMITTERS: usize = 2;

/// One change: `first` and, if it changed a row, `rest`; answered with whether it did, and with
/// the row `first` returned when the caller `returns` it. When it `touches` a resource, `first`
/// returns that resource's columns (`RETURNING`), which the view shows once the change is
/// committed.
struct Change {
    first: Statement,
    rest: Vec<Statement>,
    touches: Touches,
    returns: bool,
    reply: oneshot::Sender<Result<Outcome, StoreError>>,
}

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
    /// return its [`STATUS_COLUMNS`](super::row::STATUS_COLUMNS) or all its columns.
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

/// What a committed change did: whether its first statement changed a row, and the columns of
/// the resource it touches, as it left them.
pub(super) type Outcome = (bool, Option<RowValues>);

/// Runs `batch` in one transaction on the committer's `session` (opened when there is none), in
/// two round trips: `BEGIN` and every change's first statement in one query, then the rest of
/// the changes whose first statement changed a row, and `COMMIT`, in another (in the first when
/// every change is one statement). Both are queries of several statements, which PostgreSQL's
/// simple query protocol runs in one message but without parameters: each statement is prepared
/// once on the connection (`PREPARE`, its arguments typed as they are bound) and run as an
/// `EXECUTE` with its arguments written in ([`Statement::literals`]). `Err` when a statement
/// failed or a value cannot be written as a literal (nothing was committed); `Ok(Err)` when the
/// commit failed; else what each change did. After a failure the session is closed, which also
/// ends its transaction.
async fn commit(
    pool: &AnyPool,
    session: &mut Option<Session>,
    batch: &[Change],
) -> Result<Result<Vec<Outcome>, sqlx::Error>, sqlx::Error> {
    let open = match session {
        Some(open) => open,
        None => session.insert(Session::open(pool).await?),
    };
    let result = commit_on(open, batch).await;
    if !matches!(result, Ok(Ok(_)))
        && let Some(closing) = session.take()
    {
        closing.close();
    }
    result
}

/// [`commit`] on an open session.
async fn commit_on(
    open: &mut Session,
    batch: &[Change],
) -> Result<Result<Vec<Outcome>, sqlx::Error>, sqlx::Error> {
    let unwritable = || sqlx::Error::Protocol("a value PostgreSQL's text cannot hold".into());
    let mut prepares = Vec::new();
    let firsts = batch
        .iter()
        .map(|change| open.execute(&change.first, &mut prepares))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(unwritable)?;
    // A batch whose changes are one statement each commits in the same query.
    let single = batch.iter().all(|change| change.rest.is_empty());
    let outcomes =
        match firsts_in_transaction(&mut open.conn, batch, &prepares, &firsts, single).await? {
            Ok(outcomes) if single => return Ok(Ok(outcomes)),
            Ok(outcomes) => outcomes,
            Err(commit_failed) => return Ok(Err(commit_failed)),
        };
    prepares.clear();
    let rests = batch
        .iter()
        .zip(&outcomes)
        .filter(|(_, (changed, _))| *changed)
        .flat_map(|(change, _)| change.rest.iter())
        .map(|statement| open.execute(statement, &mut prepares))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(unwritable)?;
    let statements = prepares.len() + rests.len();
    let queries = queries((prepares.iter().chain(&rests).map(String::as_str)).chain(["COMMIT"]));
    let last = queries.len() - 1;
    let mut done = 0;
    for (i, query) in queries.into_iter().enumerate() {
        let mut results = sqlx::raw_sql(AssertSqlSafe(query)).execute_many(&mut *open.conn);
        while let Some(result) = results.next().await {
            match result {
                Ok(_) => done += 1,
                // A statement the server refused: it skipped the rest, `COMMIT` too.
                Err(failed @ sqlx::Error::Database(_)) if done < statements => return Err(failed),
                // Anything that failed before the query with `COMMIT` was sent.
                Err(failed) if i < last => return Err(failed),
                // The commit failed, or the connection did while the server may have committed.
                Err(commit_failed) => return Ok(Err(commit_failed)),
            }
        }
    }
    Ok(Ok(outcomes))
}

/// Runs `prepares`, begins a transaction and runs the first statement of each change of
/// `batch` (`firsts`), in one query on `conn`; returns what each change did. With `commit` (no
/// change of the batch has more statements), `COMMIT` ends the same query, and `Ok(Err)` says
/// that the commit failed, or the connection did once every statement had run: the server may
/// have committed. `Err` when a statement failed, or anything did before `COMMIT` was sent:
/// nothing was committed.
async fn firsts_in_transaction(
    conn: &mut AnyConnection,
    batch: &[Change],
    prepares: &[String],
    firsts: &[String],
    commit: bool,
) -> Result<Result<Vec<Outcome>, sqlx::Error>, sqlx::Error> {
    let statements = (prepares.iter().map(String::as_str))
        .chain(["BEGIN"])
        .chain(firsts.iter().map(String::as_str))
        .chain(commit.then_some("COMMIT"));
    let queries = queries(statements);
    let last = queries.len() - 1;
    let mut outcomes = Vec::with_capacity(batch.len());
    // Results come statement after statement: the `PREPARE`s and `BEGIN`, then the changes',
    // then `COMMIT`'s.
    let mut before = prepares.len() + 1;
    let mut returned = None;
    let mut committed = false;
    for (i, query) in queries.into_iter().enumerate() {
        let mut results = sqlx::raw_sql(AssertSqlSafe(query)).fetch_many(&mut *conn);
        while let Some(result) = results.next().await {
            let result = match result {
                Ok(result) => result,
                // A statement the server refused: it skipped the rest, `COMMIT` too.
                Err(failed @ sqlx::Error::Database(_)) if outcomes.len() < batch.len() => {
                    return Err(failed);
                }
                // Anything that failed before the query with `COMMIT` was sent.
                Err(failed) if !commit || i < last => return Err(failed),
                Err(commit_failed) => return Ok(Err(commit_failed)),
            };
            match result {
                Either::Right(row) => returned = returned.or(Some(row)),
                Either::Left(_) if before > 0 => before -= 1,
                Either::Left(_) if commit && outcomes.len() == batch.len() => committed = true,
                Either::Left(done) => {
                    let change = batch.get(outcomes.len()).ok_or_else(|| {
                        sqlx::Error::Protocol("more results than statements".into())
                    })?;
                    let row = returned.take();
                    outcomes.push(match change.touches {
                        Touches::Nothing => (done.rows_affected() > 0, None),
                        Touches::Resource(_) | Touches::InstanceAndBindings(_) => (
                            row.is_some(),
                            row.as_ref().map(RowValues::from_any).transpose()?,
                        ),
                    });
                }
            }
        }
    }
    if outcomes.len() != batch.len() {
        return Err(sqlx::Error::Protocol(
            "fewer results than statements".into(),
        ));
    }
    if commit && !committed {
        return Ok(Err(sqlx::Error::Protocol("no answer to COMMIT".into())));
    }
    Ok(Ok(outcomes))
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
    use sqlx::any::AnyPoolOptions;

    use super::*;

    /// A pool on a fresh schema of the test PostgreSQL (`BROKKR_TEST_POSTGRES_URL`) with a
    /// table `t (k BIGINT PRIMARY KEY, v TEXT NOT NULL)`, and the statement that drops it.
    async fn table() -> (AnyPool, String) {
        let admin = std::env::var("BROKKR_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://brokkr:brokkr@127.0.0.1:5432/brokkr_test".into());
        sqlx::any::install_default_drivers();
        let schema = format!("t_{}", uuid::Uuid::new_v4().simple());
        let setup = AnyPoolOptions::new()
            .max_connections(1)
            .connect(&admin)
            .await
            .expect("PostgreSQL for tests (see scripts/test, BROKKR_TEST_POSTGRES_URL)");
        let create = format!("CREATE SCHEMA \"{schema}\"");
        sqlx::query(sqlx::AssertSqlSafe(create))
            .execute(&setup)
            .await
            .unwrap();
        let sep = if admin.contains('?') { '&' } else { '?' };
        let url = format!("{admin}{sep}options=-c%20search_path%3D{schema}");
        let pool = AnyPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .unwrap();
        sqlx::query("CREATE TABLE t (k BIGINT PRIMARY KEY, v TEXT NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        (pool, format!("DROP SCHEMA \"{schema}\" CASCADE"))
    }

    async fn count(pool: &AnyPool, sql: &str, k: i64) -> i64 {
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(k)
            .fetch_one(pool)
            .await
            .unwrap();
        row.try_get(0).unwrap()
    }

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

    #[test]
    fn arguments_are_written_as_literals_that_no_value_can_end() {
        let statement = Statement::new(
            "UPDATE t SET v = $2 WHERE k = $1",
            vec![
                (-9_223_372_036_854_775_808_i64).into(),
                "a'b\\c".into(),
                None::<String>.into(),
                None::<i64>.into(),
            ],
        );
        assert_eq!(
            statement.literals().unwrap(),
            "('-9223372036854775808', E'a''b\\\\c', NULL, NULL)"
        );
        assert_eq!(statement.types(), "bigint, text, text, bigint");
        let nul = Statement::new("SELECT $1", vec!["a\0b".into()]);
        assert_eq!(nul.literals(), None);
    }

    /// A change for [`commit`], its answer dropped.
    fn change(first: Statement, rest: Vec<Statement>) -> Change {
        Change {
            first,
            rest,
            touches: Touches::Nothing,
            returns: false,
            reply: oneshot::channel().0,
        }
    }

    fn insert(k: i64) -> Statement {
        Statement::new("INSERT INTO t (k, v) VALUES ($1, 'x')", vec![k.into()])
    }

    fn update(k: i64, from: &str) -> Statement {
        let sql = "UPDATE t SET v = v || '+' WHERE k = $1 AND v = $2";
        Statement::new(sql, vec![k.into(), from.into()])
    }

    /// A constraint checked at `COMMIT` fails the commit itself, whether the batch commits in
    /// its first query (every change one statement) or in its second: every caller hears that
    /// the commit failed, nothing stays, and the session is closed.
    #[tokio::test]
    async fn a_failed_commit_fails_the_whole_batch_in_one_round_trip_or_two() {
        let (pool, drop_schema) = table().await;
        let deferred = "ALTER TABLE t ADD CONSTRAINT t_v UNIQUE (v) DEFERRABLE INITIALLY DEFERRED";
        sqlx::query(deferred).execute(&pool).await.unwrap();
        let same =
            |k: i64| Statement::new("INSERT INTO t (k, v) VALUES ($1, 'same')", vec![k.into()]);
        let mut session = None;
        let one_query = vec![change(same(1), Vec::new()), change(same(2), Vec::new())];
        let failed = commit(&pool, &mut session, &one_query).await;
        assert!(matches!(failed, Ok(Err(_))), "{failed:?}");
        assert!(session.is_none());
        let two_queries = vec![
            change(same(3), vec![insert(30)]),
            change(same(4), Vec::new()),
        ];
        let failed = commit(&pool, &mut session, &two_queries).await;
        assert!(matches!(failed, Ok(Err(_))), "{failed:?}");
        assert!(session.is_none());
        assert_eq!(
            count(&pool, "SELECT count(*) FROM t WHERE k >= $1", 0).await,
            0
        );
        // A batch that commits in its first query is seen at once by another connection.
        let committed = commit(&pool, &mut session, &[change(insert(5), Vec::new())]).await;
        assert!(matches!(committed, Ok(Ok(_))), "{committed:?}");
        assert_eq!(
            count(&pool, "SELECT count(*) FROM t WHERE k = $1", 5).await,
            1
        );
        sqlx::query(sqlx::AssertSqlSafe(drop_schema))
            .execute(&pool)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_batch_prepares_each_statement_once_on_its_session_and_a_failure_closes_it() {
        let (pool, drop_schema) = table().await;
        let mut session = None;
        // Inserts, each followed by an update; a compare-and-set that misses goes no further.
        let batch = vec![
            change(insert(1), vec![update(1, "x")]),
            change(insert(2), vec![update(2, "x")]),
            change(update(1, "nope"), vec![update(1, "x+")]),
        ];
        let outcomes = commit(&pool, &mut session, &batch).await.unwrap().unwrap();
        let changed: Vec<bool> = outcomes.iter().map(|(changed, _)| *changed).collect();
        assert_eq!(changed, [true, true, false]);
        assert_eq!(session.as_ref().map(|s| s.prepared.len()), Some(2));
        let batch = vec![change(update(2, "x+"), Vec::new())];
        let outcomes = commit(&pool, &mut session, &batch).await.unwrap().unwrap();
        assert!(outcomes[0].0);
        assert_eq!(
            session.as_ref().map(|s| s.prepared.len()),
            Some(2),
            "prepared again"
        );
        let rows = sqlx::query("SELECT v FROM t ORDER BY k")
            .fetch_all(&pool)
            .await
            .unwrap();
        let rows: Vec<String> = rows.iter().map(|r| r.try_get(0).unwrap()).collect();
        assert_eq!(rows, ["x+", "x++"]);
        // A duplicate key: nothing of the batch stays, and the session is closed.
        let batch = vec![change(insert(3), Vec::new()), change(insert(1), Vec::new())];
        assert!(commit(&pool, &mut session, &batch).await.is_err());
        assert!(session.is_none());
        let three = count(&pool, "SELECT count(*) FROM t WHERE k = $1", 3).await;
        assert_eq!(three, 0);
        sqlx::query(sqlx::AssertSqlSafe(drop_schema))
            .execute(&pool)
            .await
            .unwrap();
    }

    /// A batch longer than one query (see `session::queries`) is still one transaction: every
    /// change stands, whether in its first query or in its second; a failure in a later query
    /// leaves nothing of the earlier ones.
    #[tokio::test]
    async fn a_batch_longer_than_one_query_is_one_transaction() {
        let (pool, drop_schema) = table().await;
        let long = |k: i64| {
            let v = format!("{k}-{}", "v".repeat(1_000));
            Statement::new(
                "INSERT INTO t (k, v) VALUES ($1, $2)",
                vec![k.into(), v.into()],
            )
        };
        let mut session = None;
        // Forty inserts of a kilobyte each (one statement each: committed in the first query),
        // then forty with a second statement (committed in the second).
        let batch: Vec<Change> = (0..40).map(|k| change(long(k), Vec::new())).collect();
        let outcomes = commit(&pool, &mut session, &batch).await.unwrap().unwrap();
        assert!(outcomes.iter().all(|(changed, _)| *changed));
        let batch: Vec<Change> = (100..140)
            .map(|k| change(long(k), vec![long(k + 1_000)]))
            .collect();
        let outcomes = commit(&pool, &mut session, &batch).await.unwrap().unwrap();
        assert!(outcomes.iter().all(|(changed, _)| *changed));
        assert_eq!(
            count(&pool, "SELECT count(*) FROM t WHERE k >= $1", 0).await,
            120
        );
        // The last change's second statement fails (a duplicate key): nothing stays.
        let mut batch: Vec<Change> = (200..240)
            .map(|k| change(long(k), vec![long(k + 1_000)]))
            .collect();
        batch.push(change(long(300), vec![long(0)]));
        let failed = commit(&pool, &mut session, &batch).await;
        assert!(failed.is_err(), "{failed:?}");
        assert!(session.is_none());
        let third = "SELECT count(*) FROM t WHERE k BETWEEN $1 AND $1 + 100 OR k >= $1 + 1000";
        assert_eq!(count(&pool, third, 200).await, 0);
        sqlx::query(sqlx::AssertSqlSafe(drop_schema))
            .execute(&pool)
            .await
            .unwrap();
    }
}
