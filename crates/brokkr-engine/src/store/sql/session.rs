//! A PostgreSQL connection kept for queries of several statements, and the statements prepared
//! on it.
//!
//! PostgreSQL runs a query of several statements in one message only through its simple query
//! protocol, which takes no parameters. The committers (`group`) and the readers (`batched_reads`)
//! each keep a session: every statement is prepared once on its connection (`PREPARE`, its
//! parameters typed as sqlx binds them) and run as an `EXECUTE` with its arguments written in as
//! literals ([`Statement::literals`]), so that a batch is one round trip and no statement is
//! parsed and planned anew.
//!
//! A batch's statements go in queries of at most [`QUERY_BYTES`] each ([`queries`]). sqlx (0.9.0)
//! leaves Nagle's algorithm on for its sockets and hands rustls' records to the socket one write
//! at a time, so that over TLS a query longer than one record (16 KiB) was held back after its
//! first record until the server acknowledged it, which a server delays by up to 40 ms: under
//! load, when batches grow, every batch waited that long, and the longer wait made the next
//! batch longer still (256 clients: 290 lifecycles/s over TLS against 830 without).

use std::collections::HashMap;

use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyPool};

use super::statement::Statement;

/// The most bytes of one query of several statements: with the message's header, one TLS
/// record (16 KiB of plaintext).
pub(super) const QUERY_BYTES: usize = 16 * 1024 - 64;

/// `statements`, in order, joined into queries of at most [`QUERY_BYTES`]; a statement longer
/// than that is a query of its own. The statements of a transaction may span several queries:
/// a transaction begun in one goes on in the next.
pub(super) fn queries<'a>(statements: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    const SEPARATOR: &str = ";\n";
    let mut queries: Vec<String> = Vec::new();
    for statement in statements {
        match queries.last_mut() {
            Some(query) if query.len() + SEPARATOR.len() + statement.len() <= QUERY_BYTES => {
                query.push_str(SEPARATOR);
                query.push_str(statement);
            }
            _ => queries.push(statement.to_owned()),
        }
    }
    queries
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_go_in_order_in_queries_of_at_most_one_record() {
        let long = "x".repeat(QUERY_BYTES + 1);
        let statement = "y".repeat(1000);
        let mut statements = vec![statement.as_str(); 40];
        statements.insert(20, &long);
        let queries = queries(statements.iter().copied());
        assert!(queries.len() >= 4, "{}", queries.len());
        assert!(
            queries.contains(&long),
            "a longer statement is a query alone"
        );
        for query in queries.iter().filter(|q| **q != long) {
            assert!(query.len() <= QUERY_BYTES, "{}", query.len());
        }
        assert_eq!(queries.join(";\n"), statements.join(";\n"));
        assert_eq!(super::queries(["BEGIN", "COMMIT"]), ["BEGIN;\nCOMMIT"]);
    }
}
