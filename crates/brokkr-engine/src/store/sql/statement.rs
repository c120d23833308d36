//! The statements of the hot path and the rows they read, for both drivers: a statement's
//! arguments bind to an sqlx query (PostgreSQL, and SQLite off the hot path) or to a rusqlite
//! statement (the SQLite writer and readers), and a row of either is decoded by the same code.

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};

use crate::store::error::StoreError;

/// An sqlx query on the `Any` driver, its arguments bound.
pub(super) type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>;

/// A value bound to a statement of the hot path, for either driver.
#[derive(Debug, Clone)]
pub(super) enum Arg {
    Int(Option<i64>),
    Text(Option<String>),
}

impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Self::Int(Some(v))
    }
}

impl From<Option<i64>> for Arg {
    fn from(v: Option<i64>) -> Self {
        Self::Int(v)
    }
}

impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Self::Text(Some(v.to_owned()))
    }
}

impl From<String> for Arg {
    fn from(v: String) -> Self {
        Self::Text(Some(v))
    }
}

impl From<Option<String>> for Arg {
    fn from(v: Option<String>) -> Self {
        Self::Text(v)
    }
}

impl rusqlite::ToSql for Arg {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        match self {
            Self::Int(v) => v.to_sql(),
            Self::Text(v) => v.to_sql(),
        }
    }
}

/// A column type both drivers read.
pub(super) trait Column:
    for<'r> sqlx::Decode<'r, sqlx::Any> + sqlx::Type<sqlx::Any> + rusqlite::types::FromSql
{
}

impl<T> Column for T where
    T: for<'r> sqlx::Decode<'r, sqlx::Any> + sqlx::Type<sqlx::Any> + rusqlite::types::FromSql
{
}

/// A row of either driver, read by column name.
pub(super) trait Columns {
    fn column<T: Column>(&self, name: &str) -> Result<T, StoreError>;
}

impl Columns for AnyRow {
    fn column<T: Column>(&self, name: &str) -> Result<T, StoreError> {
        Ok(self.try_get(name)?)
    }
}

impl Columns for rusqlite::Row<'_> {
    fn column<T: Column>(&self, name: &str) -> Result<T, StoreError> {
        Ok(rusqlite::Row::get(self, name)?)
    }
}

/// `sql`, written with PostgreSQL's numbered parameters (`$n`), with SQLite's (`?n`).
pub(super) fn sqlite_sql(sql: &str) -> String {
    sql.replace('$', "?")
}

/// A statement of the hot path and its arguments, in `$n` order.
pub(super) struct Statement {
    sql: String,
    args: Vec<Arg>,
}

impl Statement {
    pub(super) fn new(sql: impl Into<String>, args: Vec<Arg>) -> Self {
        Self {
            sql: sql.into(),
            args,
        }
    }

    /// The statement with a `RETURNING` clause for `columns`.
    pub(super) fn returning(mut self, columns: &str) -> Self {
        self.sql = format!("{} RETURNING {columns}", self.sql);
        self
    }

    /// The statement as an sqlx query.
    pub(super) fn query(&self) -> AnyQuery<'_> {
        let mut query = sqlx::query(AssertSqlSafe(self.sql.as_str()));
        for arg in &self.args {
            query = match arg {
                Arg::Int(v) => query.bind(*v),
                Arg::Text(v) => query.bind(v.clone()),
            };
        }
        query
    }

    /// The statement's text.
    pub(super) fn sql(&self) -> &str {
        &self.sql
    }

    /// The PostgreSQL types its arguments are bound as, in `$n` order: `bigint, text, …`.
    pub(super) fn types(&self) -> String {
        let types: Vec<&str> = self
            .args
            .iter()
            .map(|arg| match arg {
                Arg::Int(_) => "bigint",
                Arg::Text(_) => "text",
            })
            .collect();
        types.join(", ")
    }

    /// Its arguments written as PostgreSQL literals, `(a, b, …)` (empty when it has none), for
    /// an `EXECUTE` of it prepared in a query of several statements, which PostgreSQL's simple
    /// query protocol runs without parameters. A text is an escape string (`E'…'`) with its
    /// backslashes and quotes doubled, so that no value can end the literal. `None` when a text
    /// holds a NUL character, which PostgreSQL's text cannot hold and which would end the query
    /// string: bound instead, it fails with PostgreSQL's own error.
    pub(super) fn literals(&self) -> Option<String> {
        if self.args.is_empty() {
            return Some(String::new());
        }
        let mut out = String::with_capacity(16 * self.args.len());
        for (i, arg) in self.args.iter().enumerate() {
            out.push_str(if i == 0 { "(" } else { ", " });
            literal(arg, &mut out)?;
        }
        out.push(')');
        Some(out)
    }

    /// Runs the statement on the writer's connection; returns the rows it changed.
    pub(super) fn run(&self, conn: &rusqlite::Connection) -> rusqlite::Result<u64> {
        let mut stmt = conn.prepare_cached(&sqlite_sql(&self.sql))?;
        let changed = stmt.execute(rusqlite::params_from_iter(&self.args))?;
        Ok(u64::try_from(changed).unwrap_or(u64::MAX))
    }
}

/// Appends `arg` to `out` as a PostgreSQL literal; `None` for a text holding a NUL character.
fn literal(arg: &Arg, out: &mut String) -> Option<()> {
    match arg {
        Arg::Int(Some(v)) => out.push_str(&format!("'{v}'")),
        Arg::Int(None) | Arg::Text(None) => out.push_str("NULL"),
        Arg::Text(Some(text)) if text.contains('\0') => return None,
        Arg::Text(Some(text)) => {
            out.push_str("E'");
            for c in text.chars() {
                match c {
                    '\'' => out.push_str("''"),
                    '\\' => out.push_str("\\\\"),
                    c => out.push(c),
                }
            }
            out.push('\'');
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
