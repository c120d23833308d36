//! SQLite's write path: one thread, one plain connection, group commit.
//!
//! Through sqlx, every SQLite statement goes to the thread of its connection and its result comes
//! back by waking the caller; with one transaction per change, a busy broker spends its CPU waking
//! threads and committing. Here the changes of the hot path (creating a resource, starting an
//! operation, saving its progress, outputs and end, its events, claiming and releasing it) go to
//! one thread that owns a rusqlite connection. Whenever it is free it takes every change
//! waiting, up to [`MAX_BATCH`], runs each in a savepoint of one transaction, commits that once,
//! shows in the view (`view`) the row each change left, and only then answers each caller. A caller is
//! therefore answered only when its change is committed, as before; a change that fails rolls
//! back alone (its savepoint) and the others commit. The batch grows with the load: alone, a
//! change commits at once; under load, the changes that arrived during a commit share the next
//! one.
//!
//! The rarer writes stay on the sqlx pool (a write there waits for the writer's lock,
//! `busy_timeout`); reads go to the view or to reader connections, which SQLite's WAL lets read
//! the last commit while the writer writes.

use std::sync::{Arc, mpsc};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::sqlite::SQLITE_SETTINGS;
use super::view::{Seen, Touches, View};
use crate::store::error::StoreError;

/// Most changes in one transaction: bounds how long a commit keeps its callers waiting.
const MAX_BATCH: usize = 512;

/// The writer thread's handle; the thread ends when the handle is dropped.
pub(super) struct Writer {
    changes: mpsc::Sender<Box<dyn Change>>,
}

/// One caller's change: applied inside the batch's transaction, answered after its commit.
trait Change: Send {
    /// Runs the change's statements and reads back what it touched for the view; false when
    /// that failed (its savepoint is rolled back).
    fn apply(&mut self, conn: &Connection) -> bool;
    /// What the applied change left in the resources the view shows, once.
    fn seen(&mut self) -> Option<Seen>;
    /// Tells the caller how it ended, given how the batch's commit went.
    fn answer(self: Box<Self>, commit: Result<(), &str>);
}

struct Pending<R, F> {
    work: Option<F>,
    touches: Touches,
    result: Option<rusqlite::Result<R>>,
    seen: Option<Seen>,
    reply: oneshot::Sender<Result<R, StoreError>>,
}

impl<R: Send, F: FnOnce(&Connection) -> rusqlite::Result<R> + Send> Change for Pending<R, F> {
    fn apply(&mut self, conn: &Connection) -> bool {
        let Some(work) = self.work.take() else {
            return false;
        };
        let touches = std::mem::replace(&mut self.touches, Touches::Nothing);
        let result = work(conn).and_then(|value| Ok((value, Seen::read(conn, touches)?)));
        let ok = result.is_ok();
        self.result = Some(result.map(|(value, seen)| {
            self.seen = Some(seen);
            value
        }));
        ok
    }

    fn seen(&mut self) -> Option<Seen> {
        self.seen.take()
    }

    fn answer(self: Box<Self>, commit: Result<(), &str>) {
        let outcome = match (self.result, commit) {
            (Some(Err(e)), _) => Err(e.into()),
            (_, Err(e)) => Err(StoreError::Sqlite(format!("commit failed: {e}"))),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (None, Ok(())) => Err(StoreError::Sqlite("the change was not run".into())),
        };
        // A caller that went away does not need its answer; the change stands.
        let _ = self.reply.send(outcome);
    }
}

impl Writer {
    /// Opens `path` and starts the writer thread, which shows what it commits in `view`.
    pub(super) fn open(path: &str, view: Arc<View>) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.execute_batch(SQLITE_SETTINGS)?;
        conn.set_prepared_statement_cache_capacity(64);
        let (changes, queue) = mpsc::channel::<Box<dyn Change>>();
        std::thread::Builder::new()
            .name("brokkr-sqlite-writer".into())
            .spawn(move || run(&conn, &queue, &view))
            .map_err(|e| StoreError::Sqlite(format!("cannot start the writer thread: {e}")))?;
        Ok(Self { changes })
    }

    /// Runs `work`, which changes what `touches` says, in the next batch and returns its result
    /// once that batch is committed and the view shows it.
    pub(super) async fn write<R, F>(&self, touches: Touches, work: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<R> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let change = Pending {
            work: Some(work),
            touches,
            result: None,
            seen: None,
            reply,
        };
        let gone = || StoreError::Sqlite("the writer thread has stopped".into());
        self.changes.send(Box::new(change)).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// The writer thread: a batch of every change waiting, one transaction, then the view, then
/// the answers.
fn run(conn: &Connection, queue: &mpsc::Receiver<Box<dyn Change>>, view: &View) {
    let mut batch: Vec<Box<dyn Change>> = Vec::with_capacity(MAX_BATCH);
    while let Ok(first) = queue.recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(change) => batch.push(change),
                Err(_) => break,
            }
        }
        let committed = commit(conn, &mut batch).map_err(|e| {
            // Leaves nothing half done for the next batch (a no-op when nothing is open).
            let _ = conn.execute_batch("ROLLBACK");
            e.to_string()
        });
        if committed.is_ok() {
            view.publish(batch.iter_mut().filter_map(|change| change.seen()));
        }
        for change in batch.drain(..) {
            change.answer(committed.as_ref().map(|_| ()).map_err(String::as_str));
        }
    }
}

/// Applies `batch` in one transaction, each change in a savepoint of its own, and commits.
fn commit(conn: &Connection, batch: &mut [Box<dyn Change>]) -> rusqlite::Result<()> {
    let exec = |sql: &str| conn.prepare_cached(sql)?.execute([]).map(|_| ());
    exec("BEGIN IMMEDIATE")?;
    for change in batch.iter_mut() {
        exec("SAVEPOINT change")?;
        if !change.apply(conn) {
            exec("ROLLBACK TO change")?;
        }
        exec("RELEASE change")?;
    }
    exec("COMMIT")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(dir: &tempfile::TempDir) -> (String, Connection) {
        let path = dir.path().join("w.db").display().to_string();
        let reader = Connection::open(&path).unwrap();
        reader
            .execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
            .unwrap();
        (path, reader)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn every_change_is_committed_when_its_caller_is_answered() {
        let dir = tempfile::tempdir().unwrap();
        let (path, reader) = table(&dir);
        let writer = std::sync::Arc::new(Writer::open(&path, Arc::new(View::new())).unwrap());
        let mut tasks = Vec::new();
        for k in 0..300_i64 {
            let writer = writer.clone();
            let path = path.clone();
            tasks.push(tokio::spawn(async move {
                let sql = "INSERT INTO t (k, v) VALUES (?1, 'x')";
                let n = writer
                    .write(Touches::Nothing, move |c| c.execute(sql, [k]))
                    .await
                    .unwrap();
                assert_eq!(n, 1);
                // Another connection sees it as soon as the caller is answered.
                let seen: i64 = Connection::open(&path)
                    .unwrap()
                    .query_row("SELECT count(*) FROM t WHERE k = ?1", [k], |r| r.get(0))
                    .unwrap();
                assert_eq!(seen, 1, "change {k} answered before its commit");
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let all: i64 = reader
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(all, 300);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_failing_change_rolls_back_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (path, reader) = table(&dir);
        let writer = std::sync::Arc::new(Writer::open(&path, Arc::new(View::new())).unwrap());
        let mut tasks = Vec::new();
        for k in 0..100_i64 {
            let writer = writer.clone();
            tasks.push(tokio::spawn(async move {
                writer
                    .write(Touches::Nothing, move |c| {
                        c.execute("INSERT INTO t (k, v) VALUES (?1, 'x')", [k])?;
                        if k % 10 == 0 {
                            // Its first row was written; the failure takes it back.
                            c.execute("INSERT INTO t (k, v) VALUES (?1, NULL)", [k + 1000])?;
                        }
                        Ok(k)
                    })
                    .await
            }));
        }
        for (k, task) in (0..).zip(tasks) {
            let result = task.await.unwrap();
            match k % 10 {
                0 => assert!(
                    matches!(result, Err(StoreError::Sqlite(ref m)) if m.contains("NOT NULL")),
                    "{result:?}"
                ),
                _ => assert_eq!(result.unwrap(), k),
            }
        }
        let rows: Vec<i64> = reader
            .prepare("SELECT k FROM t ORDER BY k")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let expected: Vec<i64> = (0..100).filter(|k| k % 10 != 0).collect();
        assert_eq!(rows, expected);
    }
}
