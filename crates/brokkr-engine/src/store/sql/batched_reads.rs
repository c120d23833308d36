//! PostgreSQL's reads of one resource, in batches.
//!
//! A request handler reads the resource it is about (a bind its instance, a fetch its binding,
//! an unbind both, a deprovision its instance), and so does a `last_operation` poll that the
//! view does not answer: over sqlx, each such read was a round trip of its own on a pooled
//! connection, with a wake-up on both sides, and on a busy broker most of PostgreSQL's time went
//! to those rather than to the index lookups themselves. Here the reads go to one of
//! [`READERS`] tasks, each on a [`Session`] of its own. Whenever a reader is free it takes every
//! read waiting for it, up to [`MAX_BATCH`], and sends them as one query (an `EXECUTE` of the
//! prepared `SELECT` per read; several queries when they are longer than one TLS record, see
//! `session`), so that reads that arrive together share a round trip; alone, a read is sent at
//! once.
//!
//! A read sees at least everything committed before it was asked: PostgreSQL runs each
//! statement of such a query with a snapshot of its own (read committed), taken when it starts,
//! after the query was sent. Should the batch fail (the connection lost, a key PostgreSQL's text
//! cannot hold), its session is closed and each read is run again alone, with bound parameters,
//! so that an error stays with the read that caused it.

use std::sync::atomic::{AtomicUsize, Ordering};

use futures::StreamExt;
use sqlx::{AnyPool, AssertSqlSafe, Either};
use tokio::sync::{mpsc, oneshot};

use super::columns::{SELECT_ROW, SELECT_STATUS, binding_col};
use super::session::{Session, queries};
use super::statement::Statement;
use super::view::RowValues;
use crate::model::Key;
use crate::store::error::StoreError;

/// Most reads in one query.
const MAX_BATCH: usize = 256;

/// How many readers run at once, each on a connection of its own: while one waits for its
/// batch's answer, another can send the reads that arrived meanwhile.
const READERS: usize = 2;

/// One read: the row of `key`, whole or its status only ([`SELECT_STATUS`]).
struct Read {
    key: Key,
    status_only: bool,
    reply: oneshot::Sender<Result<Option<RowValues>, StoreError>>,
}

impl Read {
    fn statement(&self) -> Statement {
        let sql = if self.status_only {
            &SELECT_STATUS
        } else {
            &SELECT_ROW
        };
        let instance = self.key.instance_id.as_str();
        Statement::new(
            sql.as_str(),
            vec![instance.into(), binding_col(&self.key).into()],
        )
    }
}

/// The readers' handle; they end when it is dropped.
pub(super) struct BatchedReads {
    readers: Vec<mpsc::UnboundedSender<Read>>,
    /// The reader the next read goes to.
    next: AtomicUsize,
}

impl BatchedReads {
    /// Starts [`READERS`] readers on `pool`'s connections.
    pub(super) fn start(pool: &AnyPool) -> Self {
        let readers = (0..READERS)
            .map(|_| {
                let (reads, queue) = mpsc::unbounded_channel();
                tokio::spawn(run(pool.clone(), queue));
                reads
            })
            .collect();
        Self {
            readers,
            next: AtomicUsize::new(0),
        }
    }

    /// The row of `key`, whole or its status only, as committed when it was asked; `None` when
    /// there is no such row.
    pub(super) async fn read(
        &self,
        key: &Key,
        status_only: bool,
    ) -> Result<Option<RowValues>, StoreError> {
        let (reply, answer) = oneshot::channel();
        let gone = || StoreError::Sqlite("the PostgreSQL reader has stopped".into());
        let read = Read {
            key: key.clone(),
            status_only,
            reply,
        };
        let reader = self.next.fetch_add(1, Ordering::Relaxed) % READERS;
        self.readers[reader].send(read).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// A reader: a batch of every read waiting in its queue, one query, then the answers.
async fn run(pool: AnyPool, mut queue: mpsc::UnboundedReceiver<Read>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut session = None;
    // Waits for one, then takes every one waiting; 0 once the store is gone.
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        match read_batch(&pool, &mut session, &batch).await {
            Ok(rows) => {
                for (read, row) in batch.drain(..).zip(rows) {
                    let _ = read.reply.send(Ok(row));
                }
            }
            Err(_) => {
                for read in batch.drain(..) {
                    let result = alone(&pool, &read).await;
                    let _ = read.reply.send(result);
                }
            }
        }
    }
}

/// Reads `batch` in one query on the reader's `session` (opened when there is none); closes the
/// session when that fails.
async fn read_batch(
    pool: &AnyPool,
    session: &mut Option<Session>,
    batch: &[Read],
) -> Result<Vec<Option<RowValues>>, sqlx::Error> {
    let open = match session {
        Some(open) => open,
        None => session.insert(Session::open(pool).await?),
    };
    let result = read_on(open, batch).await;
    if result.is_err()
        && let Some(closing) = session.take()
    {
        closing.close();
    }
    result
}

/// [`read_batch`] on an open session.
async fn read_on(
    open: &mut Session,
    batch: &[Read],
) -> Result<Vec<Option<RowValues>>, sqlx::Error> {
    let mut prepares = Vec::new();
    let selects = batch
        .iter()
        .map(|read| open.execute(&read.statement(), &mut prepares))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| sqlx::Error::Protocol("a key PostgreSQL's text cannot hold".into()))?;
    let mut rows = Vec::with_capacity(batch.len());
    // Results come statement after statement: the `PREPARE`s, then a row or none per read.
    let mut before = prepares.len();
    let mut returned = None;
    for query in queries(prepares.iter().chain(&selects).map(String::as_str)) {
        let mut results = sqlx::raw_sql(AssertSqlSafe(query)).fetch_many(&mut *open.conn);
        while let Some(result) = results.next().await {
            match result? {
                Either::Right(row) => returned = returned.or(Some(row)),
                Either::Left(_) if before > 0 => before -= 1,
                Either::Left(_) => rows.push(
                    returned
                        .take()
                        .as_ref()
                        .map(RowValues::from_any)
                        .transpose()?,
                ),
            }
        }
    }
    if rows.len() != batch.len() {
        return Err(sqlx::Error::Protocol("fewer results than reads".into()));
    }
    Ok(rows)
}

/// Reads alone, with bound parameters, on a pooled connection.
async fn alone(pool: &AnyPool, read: &Read) -> Result<Option<RowValues>, StoreError> {
    let row = read.statement().query().fetch_optional(pool).await?;
    Ok(row.as_ref().map(RowValues::from_any).transpose()?)
}
