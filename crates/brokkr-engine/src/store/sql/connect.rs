//! The [`SqlStore`]: what it holds for each database, and connecting it. Both have an sqlx pool;
//! a SQLite file also its writer thread (`writer`), reader connections (`readers`), the view
//! (`view`) and the lock that keeps a second process off it (`sqlite`); PostgreSQL its committers
//! (`group`), batched reads (`batched_reads`), the view, and a listener for the operations other
//! replicas release (`released`).

use std::sync::Arc;

use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Executor, Row};
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::batched_reads::BatchedReads;
use super::group::GroupCommit;
use super::readers::Readers;
use super::released;
use super::sqlite::{SQLITE_SETTINGS, lock_database, sqlite_path};
use super::view::View;
use super::writer::Writer;
use crate::crypto::Keyring;
use crate::store::error::{StoreError, redact_url};

/// Which SQL database a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dialect {
    Sqlite,
    Postgres,
}

/// A [`Store`](crate::store::Store) on SQLite or PostgreSQL.
pub struct SqlStore {
    pub(super) pool: AnyPool,
    pub(super) dialect: Dialect,
    pub(super) keyring: Option<Keyring>,
    /// For a SQLite file: the thread that makes the hot path's changes, in group commits.
    pub(super) writer: Option<Writer>,
    /// For a SQLite file: connections that read one resource in the caller's thread.
    pub(super) readers: Option<Readers>,
    /// For a SQLite file: the status of the resources the writer changed lately.
    pub(super) view: Option<Arc<View>>,
    /// For PostgreSQL: the task that commits the hot path's changes in groups.
    pub(super) group: Option<GroupCommit>,
    /// For PostgreSQL: the tasks that read one resource, in batches.
    pub(super) reads: Option<BatchedReads>,
    /// For PostgreSQL: woken when a replica released operations (see `released`).
    pub(super) released: Arc<Notify>,
    /// For PostgreSQL: stops listening for releases when the store is dropped.
    _listening: Option<DropGuard>,
    /// For SQLite: an exclusive lock that keeps a second process off the same database.
    _lock: Option<std::fs::File>,
}

impl SqlStore {
    /// Connects to `sqlite://PATH` (created when missing) or `postgres://…`. With a keyring,
    /// resource attributes (parameters, context) and outputs (credentials) are stored encrypted.
    pub async fn connect(url: &str, keyring: Option<Keyring>) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let (dialect, url) = if let Some(rest) = url.strip_prefix("sqlite:") {
            let sep = if rest.contains('?') { '&' } else { '?' };
            let url = if rest.contains("mode=") {
                url.to_owned()
            } else {
                format!("{url}{sep}mode=rwc")
            };
            (Dialect::Sqlite, url)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            (Dialect::Postgres, url.to_owned())
        } else {
            return Err(StoreError::UnsupportedUrl(redact_url(url)));
        };
        let options = match dialect {
            Dialect::Sqlite => AnyPoolOptions::new()
                .max_connections(8)
                .after_connect(|conn, _| {
                    Box::pin(async move {
                        conn.execute(SQLITE_SETTINGS).await?;
                        Ok(())
                    })
                }),
            Dialect::Postgres => AnyPoolOptions::new().max_connections(16),
        };
        let lock = match dialect {
            Dialect::Sqlite => lock_database(&url)?,
            Dialect::Postgres => None,
        };
        let pool = options.connect(&url).await?;
        let view = Arc::new(View::new());
        let released = Arc::new(Notify::new());
        let (group, reads, listening) = match dialect {
            Dialect::Postgres => {
                let schema: String = sqlx::query("SELECT current_schema()::text")
                    .fetch_one(&pool)
                    .await?
                    .try_get(0)?;
                let stop = CancellationToken::new();
                tokio::spawn(released::listen(
                    url.clone(),
                    schema,
                    released.clone(),
                    stop.clone(),
                ));
                let group = GroupCommit::start(&pool, &view);
                let reads = BatchedReads::start(&pool);
                (Some(group), Some(reads), Some(stop.drop_guard()))
            }
            Dialect::Sqlite => (None, None, None),
        };
        // The pool's first connection has created the file.
        let path = match dialect {
            Dialect::Sqlite => sqlite_path(&url),
            Dialect::Postgres => None,
        };
        Ok(Self {
            pool,
            dialect,
            keyring,
            writer: path
                .map(|path| Writer::open(path, view.clone()))
                .transpose()?,
            readers: path.map(Readers::new),
            view: (dialect == Dialect::Postgres || path.is_some()).then_some(view),
            group,
            reads,
            released,
            _listening: listening,
            _lock: lock,
        })
    }
}
