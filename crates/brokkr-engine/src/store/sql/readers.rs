//! SQLite's reads of one resource: plain connections, used in the caller's thread.
//!
//! Through sqlx, each read goes to its connection's thread and back. A read of one row by its
//! primary key takes microseconds, and in WAL mode a reader never waits for the writer (it sees
//! the last commit), so the hot path's reads that the view does not answer (`get`, and the
//! `get_status` of a `last_operation`) run right where they are asked, on a connection taken
//! from a few kept open.

use std::sync::Mutex;

use rusqlite::{Connection, OpenFlags};

use crate::store::error::StoreError;

/// Connections kept open between reads; more are opened when more read at once.
const KEEP: usize = 8;

pub(super) struct Readers {
    path: String,
    idle: Mutex<Vec<Connection>>,
}

impl Readers {
    pub(super) fn new(path: &str) -> Self {
        Self {
            path: path.to_owned(),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs `read` on an idle connection (or a new one).
    pub(super) fn read<R>(
        &self,
        read: impl FnOnce(&Connection) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let idle = self.idle.lock().expect("lock").pop();
        let conn = match idle {
            Some(conn) => conn,
            None => self.open()?,
        };
        let result = read(&conn);
        let mut idle = self.idle.lock().expect("lock");
        if idle.len() < KEEP {
            idle.push(conn);
        }
        result
    }

    fn open(&self) -> Result<Connection, StoreError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&self.path, flags)?;
        conn.execute_batch("PRAGMA busy_timeout = 30000;")?;
        Ok(conn)
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    /// The bundled SQLite is compiled as `.cargo/config.toml` asks: with a page cache of its own
    /// for each connection (a shared one left the readers' caches nearly empty at a million
    /// instances) and no global memory statistics.
    #[test]
    fn sqlite_is_built_with_a_page_cache_per_connection() {
        let conn = Connection::open_in_memory().expect("open");
        let mut statement = conn.prepare("PRAGMA compile_options").expect("prepare");
        let options: Vec<String> = statement
            .query_map([], |row| row.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert!(
            !options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"),
            "{options:?}"
        );
        assert!(
            options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
            "{options:?}"
        );
    }
}
