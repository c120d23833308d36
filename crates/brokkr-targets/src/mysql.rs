//! The `mysql` target: databases and a user per binding on a shared MySQL 8 or MariaDB server.
//!
//! Resources:
//!
//! ```yaml
//! kind: Database        # CREATE DATABASE … CHARACTER SET utf8mb4
//! name: db_orders       # ≤ 64 characters
//! ---
//! kind: User            # 'name'@'%' with a password, granted on one database
//! name: u_checkout      # ≤ 32 characters (MySQL's limit)
//! password: "..."
//! database: db_orders
//! access: read-write    # or read-only (SELECT)
//! ```
//!
//! Identifiers are quoted with backticks (a backtick doubled), literals with single quotes (a
//! quote doubled) on sessions that run with `NO_BACKSLASH_ESCAPES`, so a backslash is never an
//! escape; in `GRANT … ON db.*` the wildcards `_` and `%` are escaped so a grant names exactly
//! one database. Deleting a user kills its connections and drops it; deleting a database kills
//! the connections using it, drops it, and drops the users of its bindings that are left.
//!
//! brokkr never takes over what it did not create. Before it creates a database or a user it
//! claims the name for the instance (or binding) in its own table `_brokkr.owners` on the server;
//! a name that is claimed by another, or that exists without a claim, fails the step, and
//! deleting one that is not this instance's leaves it alone. Statements are never logged (they
//! carry passwords).
//!
//! The admin user needs `CREATE`, `DROP`, `CREATE USER`, `PROCESS`, `CONNECTION ADMIN` (or
//! `SUPER`), `SELECT, INSERT, DELETE` on `_brokkr` (it creates that database and table on first
//! use) and the privileges it grants, `WITH GRANT OPTION`.

use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{AssertSqlSafe, Connection, Executor};
use tracing::warn;

use crate::admin_url::AdminUrl;
use crate::owner::{Owner, Record};
use crate::resource::{check_name, check_secret, parse};
use crate::sql::{Access, admin_options, classify, connect_within};
use crate::target::{Readiness, Scope, Target, TargetError};

/// MySQL's database name limit.
const MAX_DATABASE: usize = 64;
/// MySQL 8's user name limit (MariaDB allows 80).
const MAX_USER: usize = 32;

/// A rendered resource of this target, parsed: its `kind` says which. (In this crate a
/// resource is always a rendered template tree; this is its typed form.)
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", deny_unknown_fields)]
enum Resource {
    Database {
        name: String,
    },
    User {
        name: String,
        password: String,
        database: String,
        #[serde(default)]
        access: Access,
    },
}

/// A shared MySQL or MariaDB server.
pub struct Mysql {
    name: String,
    server: String,
    options: MySqlConnectOptions,
    timeout: Duration,
}

/// Makes `\` an ordinary character in string literals on every session.
const SESSION_SETUP: &str =
    "SET SESSION sql_mode = CONCAT_WS(',', @@SESSION.sql_mode, 'NO_BACKSLASH_ESCAPES')";

impl Mysql {
    /// A target for the server at `url`. It connects for each call (steps are few and far
    /// between), so a server that is down stops no one from starting and every error is the
    /// server's own.
    pub fn new(name: &str, url: &AdminUrl, timeout: Duration) -> Result<Self, TargetError> {
        let options = admin_options(name, url, "MySQL")?;
        Ok(Self {
            name: name.to_owned(),
            server: url.server(),
            options,
            timeout,
        })
    }

    fn err(&self, e: &sqlx::Error) -> TargetError {
        classify("mysql", &self.name, &self.server, e)
    }

    fn resource(&self, resource: &Value) -> Result<Resource, TargetError> {
        let r: Resource = parse(&self.name, resource)?;
        match &r {
            Resource::Database { name } => check_database(&self.name, name)?,
            Resource::User {
                name,
                password,
                database,
                ..
            } => {
                check_name(&self.name, "user", name, MAX_USER)?;
                check_database(&self.name, database)?;
                check_secret(&self.name, "password", password)?;
            }
        }
        Ok(r)
    }

    /// An admin connection whose string literals take no backslash escapes, with brokkr's
    /// table of owners in place.
    async fn admin(&self) -> Result<MySqlConnection, sqlx::Error> {
        let mut conn = self.connect(None, None).await?;
        conn.execute(SESSION_SETUP).await?;
        conn.execute(OWNERS_SETUP).await?;
        Ok(conn)
    }

    /// Claims `name` of `kind` for `owner`; fails when another owns it, or when it exists
    /// without a claim (it was not created by brokkr).
    async fn claim(
        &self,
        admin: &mut MySqlConnection,
        kind: Kind,
        name: &str,
        owner: &Owner,
    ) -> Result<(), TargetError> {
        let e = |e: sqlx::Error| self.err(&e);
        let inserted =
            sqlx::query("INSERT IGNORE INTO _brokkr.owners (kind, name, owner) VALUES (?, ?, ?)")
                .bind(kind.as_str())
                .bind(name)
                .bind(owner.to_json())
                .execute(&mut *admin)
                .await
                .map_err(e)?
                .rows_affected()
                == 1;
        if inserted {
            if !kind.exists(admin, name).await.map_err(e)? {
                return Ok(());
            }
            release(admin, kind, name).await.map_err(e)?;
        } else if owned_by(admin, kind, name)
            .await
            .map_err(e)?
            .is_some_and(|found| owner.owns(Some(&found)))
        {
            return Ok(());
        }
        Err(owner.refusal(&self.name, &format!("{} {name}", kind.as_str())))
    }

    /// Whether `name` of `kind` is `owner`'s; says so in the log when it is not.
    async fn is_own(
        &self,
        admin: &mut MySqlConnection,
        kind: Kind,
        name: &str,
        owner: &Owner,
    ) -> Result<bool, sqlx::Error> {
        match owned_by(admin, kind, name).await? {
            Some(found) if owner.owns(Some(&found)) => Ok(true),
            found => {
                if found.is_some() || kind.exists(admin, name).await? {
                    warn!(target = %self.name, kind = kind.as_str(), name,
                          "not created by brokkr for this instance: left in place");
                }
                Ok(false)
            }
        }
    }

    async fn apply_user(
        admin: &mut MySqlConnection,
        name: &str,
        password: &str,
        database: &str,
        access: Access,
    ) -> Result<(), sqlx::Error> {
        let user = account(name);
        let secret = literal(password);
        exec(
            admin,
            format!("CREATE USER IF NOT EXISTS {user} IDENTIFIED BY {secret}"),
        )
        .await?;
        exec(admin, format!("ALTER USER {user} IDENTIFIED BY {secret}")).await?;
        let on = format!("{}.*", grant_database(database));
        // Start from no privileges, so a change of access takes away what it no longer gives.
        exec(
            admin,
            format!("REVOKE ALL PRIVILEGES, GRANT OPTION FROM {user}"),
        )
        .await?;
        let privileges = match access {
            Access::ReadWrite => "ALL PRIVILEGES",
            Access::ReadOnly => "SELECT, SHOW VIEW",
        };
        exec(admin, format!("GRANT {privileges} ON {on} TO {user}")).await
    }

    async fn delete_user(admin: &mut MySqlConnection, name: &str) -> Result<(), sqlx::Error> {
        kill(admin, "USER", name).await?;
        exec(admin, format!("DROP USER IF EXISTS {}", account(name))).await?;
        release(admin, Kind::User, name).await
    }

    async fn delete_database(
        &self,
        admin: &mut MySqlConnection,
        name: &str,
        owner: &Owner,
    ) -> Result<(), sqlx::Error> {
        let own = self.is_own(admin, Kind::Database, name, owner).await?;
        if own {
            kill(admin, "DB", name).await?;
            exec(admin, format!("DROP DATABASE IF EXISTS {}", ident(name))).await?;
        }
        // Users of this instance's bindings that were never unbound.
        let users: Vec<(String, String)> =
            sqlx::query_as("SELECT name, owner FROM _brokkr.owners WHERE kind = 'user'")
                .fetch_all(&mut *admin)
                .await?;
        for (user, claim) in users {
            if Record::parse(&claim).is_some_and(|o| o.is_binding_of(owner)) {
                Self::delete_user(admin, &user).await?;
            }
        }
        if own {
            release(admin, Kind::Database, name).await?;
        }
        Ok(())
    }

    /// A connection to `database` (or the admin URL's) with the admin's credentials, or with
    /// `login`'s.
    async fn connect(
        &self,
        database: Option<&str>,
        login: Option<(&str, &str)>,
    ) -> Result<MySqlConnection, sqlx::Error> {
        let mut options = self.options.clone();
        if let Some(database) = database {
            options = options.database(database);
        }
        if let Some((user, password)) = login {
            options = options.username(user).password(password);
        }
        connect_within(self.timeout, &options).await
    }
}

#[async_trait]
impl Target for Mysql {
    async fn apply(&self, resource: &Value, scope: &Scope<'_>) -> Result<(), TargetError> {
        let resource = self.resource(resource)?;
        let mut conn = self.admin().await.map_err(|e| self.err(&e))?;
        let admin = &mut conn;
        let result = match resource {
            Resource::Database { name } => {
                self.claim(admin, Kind::Database, &name, &Owner::instance(&name, scope))
                    .await?;
                exec(
                    admin,
                    format!(
                        "CREATE DATABASE IF NOT EXISTS {} CHARACTER SET utf8mb4",
                        ident(&name)
                    ),
                )
                .await
            }
            Resource::User {
                name,
                password,
                database,
                access,
            } => {
                let instance = Owner::instance(&database, scope);
                let claim = owned_by(admin, Kind::Database, &database)
                    .await
                    .map_err(|e| self.err(&e))?;
                if !instance.owns(claim.as_deref()) {
                    return Err(instance.refusal(&self.name, &format!("database {database}")));
                }
                let owner = Owner::binding(&database, scope);
                self.claim(admin, Kind::User, &name, &owner).await?;
                Self::apply_user(admin, &name, &password, &database, access).await
            }
        };
        result.map_err(|e| self.err(&e))
    }

    async fn delete(&self, resource: &Value, scope: &Scope<'_>) -> Result<(), TargetError> {
        let resource = self.resource(resource)?;
        let mut conn = self.admin().await.map_err(|e| self.err(&e))?;
        let admin = &mut conn;
        let result = match resource {
            Resource::Database { name } => {
                self.delete_database(admin, &name, &Owner::instance(&name, scope))
                    .await
            }
            Resource::User { name, database, .. } => {
                let owner = Owner::binding(&database, scope);
                match self.is_own(admin, Kind::User, &name, &owner).await {
                    Ok(true) => Self::delete_user(admin, &name).await,
                    other => other.map(drop),
                }
            }
        };
        result.map_err(|e| self.err(&e))
    }

    async fn ready(&self, resource: &Value, _: &Scope<'_>) -> Result<Readiness, TargetError> {
        let (database, login) = match self.resource(resource)? {
            Resource::Database { name } => (name, None),
            Resource::User {
                name,
                password,
                database,
                ..
            } => (database, Some((name, password))),
        };
        let login_ref = login.as_ref().map(|(u, p)| (u.as_str(), p.as_str()));
        let probe = async {
            let mut conn = self.connect(Some(&database), login_ref).await?;
            sqlx::query("SELECT 1").execute(&mut conn).await?;
            conn.close().await
        };
        Ok(match probe.await {
            Ok(()) => Readiness::Ready,
            Err(e) => {
                let who = login.as_ref().map_or("the admin user", |(u, _)| u.as_str());
                let first = e.to_string().lines().next().unwrap_or_default().to_owned();
                Readiness::Waiting(format!(
                    "{who} cannot yet query database {database} on {}: {first}",
                    self.server
                ))
            }
        })
    }

    fn validate(&self, resource: &Value) -> Result<(), TargetError> {
        self.resource(resource).map(drop)
    }
}

/// Creates brokkr's table of the databases and users it created, and for whom.
const OWNERS_SETUP: &str = "CREATE DATABASE IF NOT EXISTS _brokkr CHARACTER SET utf8mb4; \
    CREATE TABLE IF NOT EXISTS _brokkr.owners (\
      kind VARCHAR(16) NOT NULL, name VARCHAR(128) NOT NULL, owner TEXT NOT NULL, \
      PRIMARY KEY (kind, name)) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";

/// What brokkr creates on a MySQL server.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Database,
    User,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Database => "database",
            Self::User => "user",
        }
    }

    /// Whether `name` of this kind exists on the server.
    async fn exists(self, admin: &mut MySqlConnection, name: &str) -> Result<bool, sqlx::Error> {
        let sql = match self {
            Self::Database => {
                "SELECT EXISTS (SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?)"
            }
            Self::User => "SELECT EXISTS (SELECT 1 FROM mysql.user WHERE User = ? AND Host = '%')",
        };
        let found: i64 = sqlx::query_scalar(sql).bind(name).fetch_one(admin).await?;
        Ok(found != 0)
    }
}

/// The owner record of the claim on `name` of `kind`, if anyone claimed it.
async fn owned_by(
    admin: &mut MySqlConnection,
    kind: Kind,
    name: &str,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT owner FROM _brokkr.owners WHERE kind = ? AND name = ?")
        .bind(kind.as_str())
        .bind(name)
        .fetch_optional(admin)
        .await
}

/// Forgets the claim on `name` of `kind`.
async fn release(admin: &mut MySqlConnection, kind: Kind, name: &str) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM _brokkr.owners WHERE kind = ? AND name = ?")
        .bind(kind.as_str())
        .bind(name)
        .execute(admin)
        .await
        .map(drop)
}

/// Kills the connections whose processlist `column` (`USER` or `DB`) is `value`. The id is cast:
/// MySQL has it `BIGINT UNSIGNED`, MariaDB `BIGINT`.
async fn kill(admin: &mut MySqlConnection, column: &str, value: &str) -> Result<(), sqlx::Error> {
    let sql = match column {
        "USER" => {
            "SELECT CAST(ID AS UNSIGNED) FROM information_schema.PROCESSLIST \
             WHERE USER = ? AND ID <> CONNECTION_ID()"
        }
        _ => {
            "SELECT CAST(ID AS UNSIGNED) FROM information_schema.PROCESSLIST \
             WHERE DB = ? AND ID <> CONNECTION_ID()"
        }
    };
    let ids: Vec<u64> = sqlx::query_scalar(sql)
        .bind(value)
        .fetch_all(&mut *admin)
        .await?;
    for id in ids {
        // The connection may have ended meanwhile (unknown thread id): nothing to do.
        let _ = exec(admin, format!("KILL CONNECTION {id}")).await;
    }
    Ok(())
}

/// Runs a statement this module built with [`ident`], [`literal`] and [`account`].
async fn exec(admin: &mut MySqlConnection, statement: String) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(AssertSqlSafe(statement))
        .execute(admin)
        .await
        .map(drop)
}

fn check_database(target: &str, name: &str) -> Result<(), TargetError> {
    check_name(target, "database", name, MAX_DATABASE)?;
    if grant_pattern(name).len() > MAX_DATABASE {
        return Err(TargetError::Invalid(format!(
            "target {target}: database {name} is too long for GRANT, where each `_` and `%` \
             counts twice (at most {MAX_DATABASE}); `safe_name(text, 40)` makes one that fits"
        )));
    }
    if name.eq_ignore_ascii_case("_brokkr") {
        return Err(TargetError::Invalid(format!(
            "target {target}: the database `_brokkr` holds brokkr's own records"
        )));
    }
    if name.ends_with(' ') || name.contains(['/', '\\', '.']) {
        return Err(TargetError::Invalid(format!(
            "target {target}: a database name cannot contain `/`, `\\` or `.`, or end with a space"
        )));
    }
    Ok(())
}

/// An identifier in backticks.
fn ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// A string literal, for sessions with `NO_BACKSLASH_ESCAPES`.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The account `'name'@'%'`.
fn account(name: &str) -> String {
    format!("{}@'%'", literal(name))
}

/// A database name as `GRANT` reads it: `_` and `%` would be wildcards there.
fn grant_pattern(name: &str) -> String {
    name.replace('\\', "\\\\")
        .replace('_', "\\_")
        .replace('%', "\\%")
}

/// The database part of `GRANT … ON db.*`, matching exactly `name`.
fn grant_database(name: &str) -> String {
    ident(&grant_pattern(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_is_by_construction() {
        assert_eq!(ident("a`b"), "`a``b`");
        assert_eq!(literal("it's"), "'it''s'");
        assert_eq!(literal(r"a\'b"), r"'a\''b'");
        assert_eq!(
            account("u'; DROP USER root; --"),
            r"'u''; DROP USER root; --'@'%'"
        );
        assert_eq!(grant_database("db_1%"), r"`db\_1\%`");
    }
}
