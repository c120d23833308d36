//! A SQLite store's file: where its URL puts it, the lock that keeps a second process off it, and
//! the settings of every read-write connection to it.

use crate::store::error::StoreError;

/// The settings of every read-write SQLite connection (the writer's and the sqlx pool's): WAL,
/// commits durable at the next checkpoint's `fsync` (a `kill -9` loses nothing committed), and a
/// checkpoint every 10,000 pages (a WAL of up to 40 MB) instead of SQLite's 1,000. A checkpoint
/// runs in the thread that commits, and every caller of the writer's batch waits for it: the
/// longer interval halves the p99 of a busy broker, and writes a page changed many times in
/// between once.
pub(super) const SQLITE_SETTINGS: &str = "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
    PRAGMA wal_autocheckpoint = 10000; PRAGMA busy_timeout = 30000; PRAGMA secure_delete = ON;";

/// The path of the database file a SQLite URL names; `None` for an in-memory database.
pub(super) fn sqlite_path(url: &str) -> Option<&str> {
    let rest = url.trim_start_matches("sqlite:").trim_start_matches("//");
    let path = rest.split('?').next().unwrap_or_default();
    (!path.is_empty() && path != ":memory:").then_some(path)
}

/// Takes `<database>.lock` exclusively: a SQLite store serves one process, which on start
/// resumes every operation left running.
pub(super) fn lock_database(url: &str) -> Result<Option<std::fs::File>, StoreError> {
    let Some(path) = sqlite_path(url) else {
        return Ok(None);
    };
    let lock_path = format!("{path}.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| StoreError::Lock(format!("cannot open {lock_path}: {e}")))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Lock(format!(
            "{path} is in use by another brokkr process (a SQLite store serves one process; \
             use PostgreSQL for several)"
        ))),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(StoreError::Lock(format!("cannot lock {lock_path}: {e}")))
        }
    }
}
