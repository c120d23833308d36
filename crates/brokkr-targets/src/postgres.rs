//! The `postgres` target: databases, their owner roles, and a login role per binding on a shared
//! PostgreSQL server (13 or later).
//!
//! Resources:
//!
//! ```yaml
//! kind: Database          # a database and the role that owns it
//! name: db_orders         # ≤ 63 bytes
//! owner: db_orders_owner  # a NOLOGIN role, created with the database
//! extensions: [citext]    # created in the database (allow-list them in the plan's schema)
//! connection_limit: 20    # optional
//! ---
//! kind: User              # a login role for one binding
//! name: u_checkout
//! password: "..."
//! database: db_orders
//! access: read-write      # or read-only (SELECT, including tables created later)
//! ```
//!
//! Every statement is built by the server's own `format()` with `%I` (identifiers) and `%L`
//! (literals), so no name or password can change a statement's structure. A database is closed
//! to `PUBLIC`; only its bindings' roles may connect. A read-write user acts as the owner role
//! (`SET ROLE`), so what one binding creates every read-write binding can use. Deleting a user
//! ends its sessions, hands what it owns to the owner and drops it; deleting a database ends its
//! sessions, drops it with every binding role still marked as its own, then its owner.
//!
//! brokkr never takes over what it did not create. Each role it creates carries, from the
//! transaction that creates it, a comment naming the database it was made for and marking the
//! instance and binding (its owner record: keyed hashes, never the ids, since every user of the
//! server can read role comments; see the crate's `owner` module); a database is the instance's
//! when its owner role is. Applying a resource whose role or database exists without this
//! instance's (or binding's) record fails, and deleting one leaves it alone, so two instances that
//! were given the same names cannot reach each other's data. Grants and role changes for one
//! database are serialized with an advisory lock, so concurrent binds of one instance do not
//! collide in the catalogs. Statements are never logged (they carry passwords).
//!
//! The admin role needs `CREATEDB`, `CREATEROLE` and membership in `pg_signal_backend` (or is a
//! superuser).

use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{AssertSqlSafe, Connection, PgExecutor};
use tracing::warn;

use crate::admin_url::AdminUrl;
use crate::owner::{Owner, Record};
use crate::resource::{check_name, check_secret, parse};
use crate::sql::{Access, admin_options, classify, connect_within, has_code};
use crate::target::{Readiness, Scope, Target, TargetError};

/// PostgreSQL's identifier length limit (NAMEDATALEN - 1).
const MAX_NAME: usize = 63;

/// A rendered resource of this target, parsed: its `kind` says which. (In this crate a
/// resource is always a rendered template tree; this is its typed form.)
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", deny_unknown_fields)]
enum Resource {
    Database {
        name: String,
        owner: String,
        #[serde(default)]
        extensions: Vec<String>,
        #[serde(default)]
        connection_limit: Option<u16>,
    },
    User {
        name: String,
        password: String,
        database: String,
        #[serde(default)]
        access: Access,
    },
}

/// A shared PostgreSQL server.
pub struct Postgres {
    name: String,
    server: String,
    options: PgConnectOptions,
    timeout: Duration,
}

impl Postgres {
    /// A target for the server at `url`. It connects for each call (steps are few and far
    /// between), so a server that is down stops no one from starting and every error is the
    /// server's own.
    pub fn new(name: &str, url: &AdminUrl, timeout: Duration) -> Result<Self, TargetError> {
        let options = admin_options(name, url, "PostgreSQL")?;
        Ok(Self {
            name: name.to_owned(),
            server: url.server(),
            options,
            timeout,
        })
    }

    fn err(&self, e: &sqlx::Error) -> TargetError {
        classify("postgres", &self.name, &self.server, e)
    }

    fn resource(&self, resource: &Value) -> Result<Resource, TargetError> {
        let r: Resource = parse(&self.name, resource)?;
        match &r {
            Resource::Database {
                name,
                owner,
                extensions,
                ..
            } => {
                check_name(&self.name, "database", name, MAX_NAME)?;
                check_name(&self.name, "role", owner, MAX_NAME)?;
                for e in extensions {
                    check_name(&self.name, "extension", e, MAX_NAME)?;
                }
            }
            Resource::User {
                name,
                password,
                database,
                ..
            } => {
                check_name(&self.name, "role", name, MAX_NAME)?;
                check_name(&self.name, "database", database, MAX_NAME)?;
                check_secret(&self.name, "password", password)?;
            }
        }
        Ok(r)
    }

    /// The database the admin URL names.
    fn admin_database(&self) -> String {
        self.options.get_database().unwrap_or("postgres").to_owned()
    }

    /// A connection to `database` with the admin's credentials, or with `login`'s.
    async fn connect(
        &self,
        database: &str,
        login: Option<(&str, &str)>,
    ) -> Result<PgConnection, sqlx::Error> {
        let mut options = self.options.clone().database(database);
        if let Some((user, password)) = login {
            options = options.username(user).password(password);
        }
        connect_within(self.timeout, &options).await
    }

    /// Refuses to go on with role `name` unless its comment is the `expected` record.
    fn require(
        &self,
        name: &str,
        comment: Option<&str>,
        expected: &Owner,
    ) -> Result<(), TargetError> {
        if expected.owns(comment) {
            Ok(())
        } else {
            Err(expected.refusal(&self.name, &format!("role {name}")))
        }
    }

    async fn apply_database(
        &self,
        name: &str,
        owner: &str,
        extensions: &[String],
        connection_limit: Option<u16>,
        scope: &Scope<'_>,
    ) -> Result<(), TargetError> {
        let e = |e: sqlx::Error| self.err(&e);
        let mut admin_conn = self
            .connect(&self.admin_database(), None)
            .await
            .map_err(e)?;
        let admin = &mut admin_conn;
        lock_database(&mut *admin, name).await.map_err(e)?;
        let record = Owner::instance(name, scope);
        match role_comment(&mut *admin, owner).await.map_err(e)? {
            None => create_role(admin, owner, "NOLOGIN", None, &record)
                .await
                .map_err(e)?,
            Some(found) => self.require(owner, found.as_deref(), &record)?,
        }
        // Creating a database owned by a role takes membership in it.
        run(admin, "GRANT %I TO CURRENT_USER", &[owner])
            .await
            .map_err(e)?;
        match database_owner(&mut *admin, name).await.map_err(e)? {
            None => {
                let created = run(admin, "CREATE DATABASE %I OWNER %I", &[name, owner]).await;
                ignore_code(created, "42P04").map_err(e)?;
                // A concurrent create may have won with another owner.
                if database_owner(&mut *admin, name)
                    .await
                    .map_err(e)?
                    .as_deref()
                    != Some(owner)
                {
                    return Err(record.refusal(&self.name, &format!("database {name}")));
                }
            }
            Some(found) if found == owner => {}
            Some(_) => return Err(record.refusal(&self.name, &format!("database {name}"))),
        }
        let limit = connection_limit.map_or(-1, i32::from).to_string();
        run(
            admin,
            "ALTER DATABASE %I CONNECTION LIMIT %s",
            &[name, &limit],
        )
        .await
        .map_err(e)?;
        run(
            admin,
            "REVOKE CONNECT, TEMPORARY ON DATABASE %I FROM PUBLIC",
            &[name],
        )
        .await
        .map_err(e)?;
        if !extensions.is_empty() {
            let mut conn = self.connect(name, None).await.map_err(e)?;
            for ext in extensions {
                run(&mut conn, "CREATE EXTENSION IF NOT EXISTS %I", &[ext])
                    .await
                    .map_err(e)?;
            }
            conn.close().await.ok();
        }
        Ok(())
    }

    /// The owner role of `database` when brokkr created it for `scope`'s instance.
    async fn instance_owner(
        &self,
        admin: &mut PgConnection,
        database: &str,
        scope: &Scope<'_>,
    ) -> Result<String, TargetError> {
        let e = |e: sqlx::Error| self.err(&e);
        let Some(owner) = database_owner(&mut *admin, database).await.map_err(e)? else {
            return Err(TargetError::Invalid(format!(
                "target {}: database {database:?} does not exist",
                self.name
            )));
        };
        let comment = role_comment(&mut *admin, &owner)
            .await
            .map_err(e)?
            .flatten();
        let record = Owner::instance(database, scope);
        if !record.owns(comment.as_deref()) {
            return Err(record.refusal(&self.name, &format!("database {database}")));
        }
        Ok(owner)
    }

    async fn apply_user(
        &self,
        name: &str,
        password: &str,
        database: &str,
        access: Access,
        scope: &Scope<'_>,
    ) -> Result<(), TargetError> {
        let e = |e: sqlx::Error| self.err(&e);
        let mut admin_conn = self
            .connect(&self.admin_database(), None)
            .await
            .map_err(e)?;
        let admin = &mut admin_conn;
        lock_database(&mut *admin, database).await.map_err(e)?;
        let owner = self.instance_owner(admin, database, scope).await?;
        let record = Owner::binding(database, scope);
        match role_comment(&mut *admin, name).await.map_err(e)? {
            None => create_role(admin, name, "LOGIN", Some(password), &record)
                .await
                .map_err(e)?,
            Some(found) => {
                self.require(name, found.as_deref(), &record)?;
                run(admin, "ALTER ROLE %I LOGIN PASSWORD %L", &[name, password])
                    .await
                    .map_err(e)?;
            }
        }
        // Handing over and dropping what the role owns, on unbind, takes membership in it.
        run(admin, "GRANT %I TO CURRENT_USER", &[name])
            .await
            .map_err(e)?;
        run(
            admin,
            "GRANT CONNECT ON DATABASE %I TO %I",
            &[database, name],
        )
        .await
        .map_err(e)?;
        let mut conn = self.connect(database, None).await.map_err(e)?;
        match access {
            Access::ReadWrite => {
                run(&mut conn, "GRANT %I TO %I", &[&owner, name])
                    .await
                    .map_err(e)?;
                run(&mut conn, "ALTER ROLE %I SET role = %L", &[name, &owner])
                    .await
                    .map_err(e)?;
            }
            Access::ReadOnly => {
                for template in [
                    "REVOKE %I FROM %I",
                    "GRANT USAGE ON SCHEMA public TO %2$I",
                    "GRANT SELECT ON ALL TABLES IN SCHEMA public TO %2$I",
                    "GRANT SELECT ON ALL SEQUENCES IN SCHEMA public TO %2$I",
                    "ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA public GRANT SELECT ON TABLES TO %I",
                    "ALTER DEFAULT PRIVILEGES FOR ROLE %I IN SCHEMA public GRANT SELECT ON SEQUENCES TO %I",
                ] {
                    run(&mut conn, template, &[&owner, name]).await.map_err(e)?;
                }
                run(&mut conn, "ALTER ROLE %I RESET role", &[name])
                    .await
                    .map_err(e)?;
            }
        }
        conn.close().await.ok();
        Ok(())
    }

    async fn delete_user(
        &self,
        name: &str,
        database: &str,
        scope: &Scope<'_>,
    ) -> Result<(), sqlx::Error> {
        let mut admin_conn = self.connect(&self.admin_database(), None).await?;
        let admin = &mut admin_conn;
        lock_database(&mut *admin, database).await?;
        let Some(comment) = role_comment(&mut *admin, name).await? else {
            return Ok(());
        };
        if !Owner::binding(database, scope).owns(comment.as_deref()) {
            warn!(target = %self.name, role = name, "role not created by brokkr for this binding: left in place");
            return Ok(());
        }
        self.drop_login(admin, name, database).await
    }

    /// Ends `role`'s sessions, hands what it owns in `database` to the owner and drops it.
    async fn drop_login(
        &self,
        admin: &mut PgConnection,
        role: &str,
        database: &str,
    ) -> Result<(), sqlx::Error> {
        terminate(&mut *admin, "usename", role).await?;
        if let Some(owner) = database_owner(&mut *admin, database).await? {
            let mut conn = self.connect(database, None).await?;
            run(&mut conn, "REASSIGN OWNED BY %I TO %I", &[role, &owner]).await?;
            run(&mut conn, "DROP OWNED BY %I", &[role]).await?;
            conn.close().await.ok();
        }
        run(admin, "DROP ROLE IF EXISTS %I", &[role]).await
    }

    async fn delete_database(
        &self,
        name: &str,
        owner: &str,
        scope: &Scope<'_>,
    ) -> Result<(), sqlx::Error> {
        let mut admin_conn = self.connect(&self.admin_database(), None).await?;
        let admin = &mut admin_conn;
        lock_database(&mut *admin, name).await?;
        let record = Owner::instance(name, scope);
        let owner_comment = role_comment(&mut *admin, owner).await?;
        let owned = match &owner_comment {
            None => false,
            Some(found) => record.owns(found.as_deref()),
        };
        if owner_comment.is_some() && !owned {
            warn!(target = %self.name, role = owner, database = name,
                  "owner role not created by brokkr for this instance: database and role left in place");
            return Ok(());
        }
        if owned && database_owner(&mut *admin, name).await?.as_deref() == Some(owner) {
            terminate(&mut *admin, "datname", name).await?;
            run(admin, "DROP DATABASE IF EXISTS %I WITH (FORCE)", &[name]).await?;
        }
        // Roles of this instance's bindings that were never unbound.
        let marked: Vec<(String, String)> = sqlx::query_as(
            "SELECT rolname::text, shobj_description(oid, 'pg_authid') FROM pg_roles \
             WHERE shobj_description(oid, 'pg_authid') LIKE '{\"of\":%'",
        )
        .fetch_all(&mut *admin)
        .await?;
        for (role, comment) in marked {
            if Record::parse(&comment).is_some_and(|m| m.is_binding_of(&record)) {
                terminate(&mut *admin, "usename", &role).await?;
                run(admin, "DROP ROLE IF EXISTS %I", &[&role]).await?;
            }
        }
        if owned {
            terminate(&mut *admin, "usename", owner).await?;
            run(admin, "DROP ROLE IF EXISTS %I", &[owner]).await?;
        }
        Ok(())
    }

    async fn login(&self, name: &str, password: &str, database: &str) -> Readiness {
        let probe = async {
            let mut conn = self.connect(database, Some((name, password))).await?;
            let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut conn).await?;
            conn.close().await.ok();
            Ok::<_, sqlx::Error>(one)
        };
        match probe.await {
            Ok(1) => Readiness::Ready,
            Ok(_) => Readiness::Waiting(format!("role {name} got an unexpected answer")),
            Err(e) => Readiness::Waiting(format!(
                "role {name} cannot yet query database {database} on {}: {}",
                self.server,
                without_detail(&e)
            )),
        }
    }
}

#[async_trait]
impl Target for Postgres {
    async fn apply(&self, resource: &Value, scope: &Scope<'_>) -> Result<(), TargetError> {
        match self.resource(resource)? {
            Resource::Database {
                name,
                owner,
                extensions,
                connection_limit,
            } => {
                self.apply_database(&name, &owner, &extensions, connection_limit, scope)
                    .await
            }
            Resource::User {
                name,
                password,
                database,
                access,
            } => {
                self.apply_user(&name, &password, &database, access, scope)
                    .await
            }
        }
    }

    async fn delete(&self, resource: &Value, scope: &Scope<'_>) -> Result<(), TargetError> {
        let result = match self.resource(resource)? {
            Resource::Database { name, owner, .. } => {
                self.delete_database(&name, &owner, scope).await
            }
            Resource::User { name, database, .. } => {
                self.delete_user(&name, &database, scope).await
            }
        };
        result.map_err(|e| self.err(&e))
    }

    async fn ready(&self, resource: &Value, _: &Scope<'_>) -> Result<Readiness, TargetError> {
        match self.resource(resource)? {
            Resource::Database { name, .. } => {
                let probe = async {
                    let mut conn = self.connect(&name, None).await?;
                    sqlx::query("SELECT 1").execute(&mut conn).await?;
                    conn.close().await
                };
                Ok(match probe.await {
                    Ok(()) => Readiness::Ready,
                    Err(e) => Readiness::Waiting(format!(
                        "database {name} on {} is not reachable yet: {}",
                        self.server,
                        without_detail(&e)
                    )),
                })
            }
            Resource::User {
                name,
                password,
                database,
                ..
            } => Ok(self.login(&name, &password, &database).await),
        }
    }

    fn validate(&self, resource: &Value) -> Result<(), TargetError> {
        self.resource(resource).map(drop)
    }
}

/// Creates `role` with `options` (and `password`) and its owner record in one transaction, so a role
/// brokkr created is never seen without its record.
async fn create_role(
    admin: &mut PgConnection,
    role: &str,
    options: &str,
    password: Option<&str>,
    owner: &Owner,
) -> Result<(), sqlx::Error> {
    let mut tx = admin.begin().await?;
    match password {
        Some(password) => {
            let template = format!("CREATE ROLE %I {options} PASSWORD %L");
            run(&mut tx, &template, &[role, password]).await?;
        }
        None => run(&mut tx, &format!("CREATE ROLE %I {options}"), &[role]).await?,
    }
    run(
        &mut tx,
        "COMMENT ON ROLE %I IS %L",
        &[role, &owner.to_json()],
    )
    .await?;
    tx.commit().await
}

/// Holds, for the rest of `admin`'s session, the lock that serializes brokkr's changes to
/// `database` and its roles (concurrent GRANTs on one database fail with "tuple concurrently
/// updated").
async fn lock_database(admin: &mut PgConnection, database: &str) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_lock(hashtextextended('brokkr database ' || $1, 0))")
        .bind(database)
        .execute(admin)
        .await
        .map(drop)
}

/// The comment of `role`: `None` when the role does not exist, `Some(None)` when it has none.
async fn role_comment(
    admin: &mut PgConnection,
    role: &str,
) -> Result<Option<Option<String>>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT shobj_description(oid, 'pg_authid') FROM pg_roles WHERE rolname = $1",
    )
    .bind(role)
    .fetch_optional(admin)
    .await
}

/// Runs a statement built by the server from `template` and `args` (`%I` identifiers, `%L`
/// literals, `%s` plain text for numbers this module formats itself).
async fn run(conn: &mut PgConnection, template: &str, args: &[&str]) -> Result<(), sqlx::Error> {
    let placeholders: Vec<String> = (2..args.len() + 2).map(|i| format!("${i}")).collect();
    let sql = format!("SELECT format($1, {})", placeholders.join(", "));
    let mut query = sqlx::query_scalar::<_, String>(AssertSqlSafe(sql)).bind(template);
    for arg in args {
        query = query.bind(*arg);
    }
    let statement = query.fetch_one(&mut *conn).await?;
    sqlx::raw_sql(AssertSqlSafe(statement))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// `result`, with an error of SQLSTATE `code` (a concurrent create) counted as success.
fn ignore_code(result: Result<(), sqlx::Error>, code: &str) -> Result<(), sqlx::Error> {
    match result {
        Err(e) if has_code(&e, code) => Ok(()),
        other => other,
    }
}

async fn database_owner<'c>(
    executor: impl PgExecutor<'c>,
    name: &str,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_get_userbyid(datdba)::text FROM pg_database WHERE datname = $1")
        .bind(name)
        .fetch_optional(executor)
        .await
}

/// Ends the sessions whose `column` (`usename` or `datname`) is `value`, except this one.
async fn terminate(conn: &mut PgConnection, column: &str, value: &str) -> Result<(), sqlx::Error> {
    let sql = match column {
        "usename" => {
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE usename = $1 AND pid <> pg_backend_pid()"
        }
        _ => {
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()"
        }
    };
    sqlx::query(sql).bind(value).execute(conn).await?;
    Ok(())
}

/// A driver error's first line, for readiness messages.
fn without_detail(e: &sqlx::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_owned()
}
