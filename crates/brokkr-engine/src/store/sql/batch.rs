//! A batch of the committers' changes (`group`) in one transaction, in one or two round trips.
//!
//! A batch costs two round trips: `BEGIN` and the first statement of every change in one query,
//! then the statements of the changes whose first statement changed a row, and `COMMIT`, in
//! another; one round trip when every change of the batch is one statement (`COMMIT` then ends
//! the first query); a round trip more for every 16 KiB a batch's statements take beyond the
//! first (`session::queries`). Both are queries of several statements, which
//! PostgreSQL's simple query protocol runs in one message but without parameters: each statement
//! is prepared once on the committer's connection, its parameters typed as they are bound, and
//! run as an `EXECUTE` with its arguments written in as literals ([`Statement::literals`]).

use futures::StreamExt;
use sqlx::{AnyConnection, AnyPool, AssertSqlSafe, Either};
use tokio::sync::oneshot;

use super::session::{Session, queries};
use super::statement::Statement;
use super::view::{RowValues, Touches};
use crate::store::error::StoreError;

/// One change: `first` and, if it changed a row, `rest`; answered with whether it did, and with
/// the row `first` returned when the caller `returns` it. When it `touches` a resource, `first`
/// returns that resource's columns (`RETURNING`), which the view shows once the change is
/// committed.
pub(super) struct Change {
    pub(super) first: Statement,
    pub(super) rest: Vec<Statement>,
    pub(super) touches: Touches,
    pub(super) returns: bool,
    pub(super) reply: oneshot::Sender<Result<Outcome, StoreError>>,
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
pub(super) async fn commit(
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

#[cfg(test)]
mod tests {
    use sqlx::Row;

    use super::*;
    use crate::store::sql::scratch_table::{count, table};

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
