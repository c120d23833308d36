//! A PostgreSQL connection kept for queries of several statements, and the statements prepared
//! on it.
//!
//! PostgreSQL runs a query of several statements in one message only through its simple query
//! protocol, which takes no parameters. The committers (`group`) and the readers (`batched_reads`)
//! each keep a session: every statement is prepared once on its connection (`PREPARE`, its
//! parameters typed as sqlx binds them) and run as an `EXECUTE` with its arguments written in as
//! literals ([`Statement::literals`]), so that a batch of any size is one round trip and no
//! statement is parsed and planned anew.

use std::collections::HashMap;

use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyPool};

use super::statement::Statement;

/// A connection kept from batch to batch, and the statements prepared on it.
pub(super) struct Session {
    pub(super) conn: PoolConnection<Any>,
    /// The names of the statements prepared here, by their text and their arguments' types.
    pub(super) prepared: HashMap<(String, String), String>,
}

impl Session {
    pub(super) async fn open(pool: &AnyPool) -> Result<Self, sqlx::Error> {
        Ok(Self {
            conn: pool.acquire().await?,
            prepared: HashMap::new(),
        })
    }

    /// `EXECUTE` of `statement` with its arguments written in; a statement not prepared on this
    /// connection yet is named, and its `PREPARE` goes to `prepares`, to run before it. It
    /// counts as prepared from then on: a batch that fails closes its session. `None` when an
    /// argument cannot be written as a literal.
    pub(super) fn execute(
        &mut self,
        statement: &Statement,
        prepares: &mut Vec<String>,
    ) -> Option<String> {
        let literals = statement.literals()?;
        let count = self.prepared.len();
        let key = (statement.sql().to_owned(), statement.types());
        let name = self.prepared.entry(key).or_insert_with_key(|(sql, types)| {
            let name = format!("brokkr_{count}");
            let parameters = match types.as_str() {
                "" => String::new(),
                types => format!(" ({types})"),
            };
            prepares.push(format!("PREPARE {name}{parameters} AS {sql}"));
            name
        });
        Some(format!("EXECUTE {name}{literals}"))
    }

    /// Closes the connection instead of returning it to the pool: nothing it was in the middle
    /// of (a transaction, statements prepared or not) outlives a failure.
    pub(super) fn close(mut self) {
        self.conn.close_on_drop();
    }
}
