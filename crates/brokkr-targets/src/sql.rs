//! What the SQL targets share: connect options from an admin URL, sorting driver errors into
//! retryable and final ones, and the access levels a binding's user may get.

use serde::Deserialize;

use crate::admin_url::AdminUrl;
use crate::target::TargetError;

/// What a binding's user may do in its instance's database.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Read and write data, and create, change and drop tables.
    #[default]
    ReadWrite,
    /// Read data only, including tables created later.
    ReadOnly,
}

/// Turns a driver error into a [`TargetError`] that names the target and its server. Errors
/// that a later attempt may not see (connection failures, timeouts, a busy or restarting
/// server: SQLSTATE classes 08, 40, 53, 57, 58; PostgreSQL's "tuple concurrently updated";
/// MySQL's lock wait timeouts and deadlocks) are [`TargetError::Unavailable`].
/// The connect options of target `name`'s admin URL, which must be a URL of `database`
/// (`MySQL`, `PostgreSQL`), with statement logging off: statements carry passwords, and
/// neither debug nor slow-statement logs may show them.
pub(crate) fn admin_options<O>(name: &str, url: &AdminUrl, database: &str) -> Result<O, TargetError>
where
    O: sqlx::ConnectOptions + std::str::FromStr,
{
    let options = O::from_str(url.expose()).map_err(|_| {
        TargetError::Invalid(format!(
            "target {name}: the admin URL is not a {database} URL"
        ))
    })?;
    Ok(options.disable_statement_logging())
}

pub(crate) fn classify(kind: &str, target: &str, server: &str, e: &sqlx::Error) -> TargetError {
    let cause = match e {
        // The server's own words; the driver's rendering of a PostgreSQL error ends in " at line
        // N", a line of the server's source code, which reads as if it were the user's.
        sqlx::Error::Database(db) => format!("the server said: {}", db.message()),
        other => other.to_string(),
    };
    let message = format!("{kind} target {target} ({server}): {cause}");
    let transient = match e {
        sqlx::Error::Database(db) => {
            db.code().is_some_and(|code| {
                ["08", "40", "53", "57", "58"]
                    .iter()
                    .any(|c| code.starts_with(c))
            })
                // PostgreSQL's catalog update races (concurrent GRANTs): XX000.
                || db.message().contains("concurrently updated")
                // MySQL and MariaDB: lock wait timeout, deadlock.
                || matches!(db.code().as_deref(), Some("HY000") if db.message().contains("try restarting transaction"))
        }
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        _ => false,
    };
    if transient {
        TargetError::Unavailable(message)
    } else {
        TargetError::Invalid(message)
    }
}

/// Connects with `options`, giving up after `timeout` with an I/O error that says so.
pub(crate) async fn connect_within<C: sqlx::Connection>(
    timeout: std::time::Duration,
    options: &<C as sqlx::Connection>::Options,
) -> Result<C, sqlx::Error> {
    match tokio::time::timeout(timeout, C::connect_with(options)).await {
        Ok(result) => result,
        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no connection within {timeout:?}"),
        ))),
    }
}

/// Whether `e` is a database error with SQLSTATE `code`.
pub(crate) fn has_code(e: &sqlx::Error, code: &str) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some(code))
}
