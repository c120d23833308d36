//! The `redis` target: a key prefix per instance and an ACL user per binding on a shared Redis
//! 6+ server.
//!
//! Resources:
//!
//! ```yaml
//! kind: Keyspace                 # the instance's keys: `<prefix>:*`
//! prefix: i_orders               # letters, digits, `_`, `-`, `.`
//! ---
//! kind: User                     # ACL user confined to `~<prefix>:*` and `&<prefix>:*`
//! name: u_checkout
//! password: "..."
//! prefix: i_orders
//! commands: ["+@read", "+@write", "-@dangerous"]   # the default
//! ```
//!
//! A user is set with one `ACL SETUSER name reset on >password ~prefix:* resetchannels
//! &prefix:* -@all <commands> <denied>`, each rule its own protocol argument. Command rules must
//! look like `+get`, `-@admin` or `+config|get`: a rule that would grant keys, channels,
//! passwords, `allcommands`, or any administrative or dangerous command (`+@admin`, `+acl`,
//! `+config`, …) is refused. Whatever the rules, [`DENIED`] comes last: every command that sees
//! or changes more than the user's own keys and channels (`SCAN`, `KEYS`, `RANDOMKEY`, `DBSIZE`,
//! `PUBSUB CHANNELS`, `FLUSHALL`, `SELECT`, …) stays denied, so a binding learns nothing about
//! another instance. Deleting a keyspace unlinks its keys in batches (`SCAN MATCH` + `UNLINK`)
//! and deletes its bindings' users; deleting a user disconnects and deletes it. On a server
//! with an ACL file (`aclfile`), each change of users is saved to it (`ACL SAVE`).
//!
//! brokkr never takes over what it did not create: it claims each prefix and user name for its
//! instance (or binding) in the hash `{brokkr}:owners` on the server (a key no prefix pattern can
//! reach) before creating it. A name claimed by another, a user that exists without a claim, or a
//! prefix that already has keys without a claim fails the step; deleting one that is not this
//! instance's leaves it alone.

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Client, ErrorKind, RedisError, ServerErrorKind};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Mutex;
use tracing::warn;

use crate::admin_url::AdminUrl;
use crate::owner::{Owner, Record};
use crate::resource::{check_secret, parse};
use crate::target::{Readiness, Scope, Target, TargetError};

/// Longest prefix or user name accepted.
const MAX_NAME: usize = 128;
/// Keys unlinked per round trip when a keyspace is deleted.
const BATCH: usize = 500;

/// A rendered resource of this target, parsed: its `kind` says which. (In this crate a
/// resource is always a rendered template tree; this is its typed form.)
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", deny_unknown_fields)]
enum Resource {
    Keyspace {
        prefix: String,
    },
    User {
        name: String,
        password: String,
        prefix: String,
        #[serde(default = "default_commands")]
        commands: Vec<String>,
    },
}

/// Rules appended to every user's, after the plan's: commands that see or change keys, channels
/// or state beyond the user's own prefix.
pub const DENIED: &[&str] = &[
    "-@admin",
    "-@dangerous",
    "-keys",
    "-scan",
    "-randomkey",
    "-dbsize",
    "-pubsub",
    "-select",
    "-swapdb",
    "-move",
    "-copy",
    "-flushdb",
    "-flushall",
    "-function",
    "-script|flush",
    "-script|kill",
];

/// Commands (before any `|subcommand`) and categories a plan's rules may never grant.
const NEVER_GRANTED: &[&str] = &[
    "@all",
    "@admin",
    "@dangerous",
    "acl",
    "config",
    "module",
    "debug",
    "shutdown",
    "monitor",
    "client",
    "slowlog",
    "latency",
    "info",
    "keys",
    "scan",
    "randomkey",
    "dbsize",
    "pubsub",
    "select",
    "swapdb",
    "move",
    "copy",
    "flushdb",
    "flushall",
    "function",
    "script",
    "sync",
    "psync",
    "replicaof",
    "slaveof",
    "bgsave",
    "save",
    "bgrewriteaof",
    "failover",
    "migrate",
    "restore",
    "sort",
    "sort_ro",
    "object",
    "memory",
    "cluster",
];

/// The hash where brokkr records whom each prefix and user belongs to. `{` is not allowed in
/// prefixes, so no user's key pattern reaches it.
const OWNERS: &str = "{brokkr}:owners";

fn default_commands() -> Vec<String> {
    ["+@read", "+@write", "-@dangerous"]
        .map(String::from)
        .to_vec()
}

/// A shared Redis server.
pub struct Redis {
    name: String,
    server: String,
    client: Client,
    admin: Mutex<Option<MultiplexedConnection>>,
    timeout: Duration,
}

impl Redis {
    /// A target for the server at `url`; connects on first use.
    pub fn new(name: &str, url: &AdminUrl, timeout: Duration) -> Result<Self, TargetError> {
        let client = Client::open(url.expose()).map_err(|_| {
            TargetError::Invalid(format!("target {name}: the admin URL is not a Redis URL"))
        })?;
        Ok(Self {
            name: name.to_owned(),
            server: url.server(),
            client,
            admin: Mutex::new(None),
            timeout,
        })
    }

    fn err(&self, e: &RedisError) -> TargetError {
        let message = format!("redis target {} ({}): {e}", self.name, self.server);
        let transient = e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || matches!(
                e.kind(),
                ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::MasterDown
                )
            );
        if transient {
            TargetError::Unavailable(message)
        } else {
            TargetError::Invalid(message)
        }
    }

    /// A new connection (not yet authenticated as anyone but the admin URL's user).
    async fn connect(&self) -> Result<MultiplexedConnection, RedisError> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        self.client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// The admin connection, opened on first use and again after it broke.
    async fn admin(&self) -> Result<MultiplexedConnection, RedisError> {
        let mut slot = self.admin.lock().await;
        if let Some(conn) = slot.as_ref() {
            return Ok(conn.clone());
        }
        let conn = self.connect().await?;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Runs `f` on the admin connection; forgets the connection when it broke.
    async fn with_admin<T>(
        &self,
        f: impl AsyncFnOnce(&mut MultiplexedConnection) -> Result<T, RedisError>,
    ) -> Result<T, TargetError> {
        let mut conn = self.admin().await.map_err(|e| self.err(&e))?;
        let result = f(&mut conn).await;
        if let Err(e) = &result
            && (e.is_io_error() || e.is_connection_dropped() || e.is_timeout())
        {
            *self.admin.lock().await = None;
        }
        result.map_err(|e| self.err(&e))
    }

    /// The owner record of the claim on `name` of `kind`, if anyone claimed it.
    async fn owner(&self, kind: Kind, name: &str) -> Result<Option<String>, TargetError> {
        let field = kind.field(name);
        self.with_admin(async |c| c.hget(OWNERS, &field).await)
            .await
    }

    /// Claims `name` of `kind` for `owner`; fails when another owns it, or when it exists
    /// without a claim (it was not created by brokkr).
    async fn claim(&self, kind: Kind, name: &str, owner: &Owner) -> Result<(), TargetError> {
        let field = kind.field(name);
        let json = owner.to_json();
        let inserted: bool = self
            .with_admin(async |c| c.hset_nx(OWNERS, &field, &json).await)
            .await?;
        if inserted {
            let exists = self
                .with_admin(async |c| kind.exists(c, name).await)
                .await?;
            if !exists {
                return Ok(());
            }
            self.release(kind, name).await?;
        } else if owner.owns(self.owner(kind, name).await?.as_deref()) {
            return Ok(());
        }
        Err(owner.refusal(&self.name, &format!("{} {name}", kind.as_str())))
    }

    /// Whether `name` of `kind` is `owner`'s; says so in the log when it is not.
    async fn is_own(&self, kind: Kind, name: &str, owner: &Owner) -> Result<bool, TargetError> {
        match self.owner(kind, name).await? {
            Some(found) if owner.owns(Some(&found)) => Ok(true),
            found => {
                let exists = self
                    .with_admin(async |c| kind.exists(c, name).await)
                    .await?;
                if found.is_some() || exists {
                    warn!(target = %self.name, kind = kind.as_str(), name,
                          "not created by brokkr for this instance: left in place");
                }
                Ok(false)
            }
        }
    }

    /// Forgets the claim on `name` of `kind`.
    async fn release(&self, kind: Kind, name: &str) -> Result<(), TargetError> {
        let field = kind.field(name);
        self.with_admin(async |c| c.hdel::<_, _, ()>(OWNERS, &field).await)
            .await
    }

    /// Disconnects and deletes user `name`, and forgets its claim.
    async fn delete_user(&self, name: &str) -> Result<(), TargetError> {
        self.with_admin(async |c| delete_user(c, name).await)
            .await?;
        self.save_acl().await?;
        self.release(Kind::User, name).await
    }

    /// Writes the users to the server's ACL file (`ACL SAVE`) when it has one, so that they
    /// outlive a restart of the server; a server without one keeps them in memory only.
    async fn save_acl(&self) -> Result<(), TargetError> {
        self.with_admin(
            async |c| match redis::cmd("ACL").arg("SAVE").query_async::<()>(c).await {
                Err(e) if e.to_string().contains("not configured to use an ACL file") => Ok(()),
                result => result,
            },
        )
        .await
    }

    fn resource(&self, resource: &Value) -> Result<Resource, TargetError> {
        let r: Resource = parse(&self.name, resource)?;
        match &r {
            Resource::Keyspace { prefix } => check_word(&self.name, "prefix", prefix)?,
            Resource::User {
                name,
                password,
                prefix,
                commands,
            } => {
                check_word(&self.name, "user", name)?;
                check_word(&self.name, "prefix", prefix)?;
                check_secret(&self.name, "password", password)?;
                if name == "default" {
                    return Err(TargetError::Invalid(format!(
                        "target {}: the user `default` belongs to the server",
                        self.name
                    )));
                }
                for rule in commands {
                    check_command_rule(&self.name, rule)?;
                }
            }
        }
        Ok(r)
    }
}

#[async_trait]
impl Target for Redis {
    async fn apply(&self, resource: &Value, scope: &Scope<'_>) -> Result<(), TargetError> {
        match self.resource(resource)? {
            // Keys come into being as the application writes them.
            Resource::Keyspace { prefix } => {
                let owner = Owner::instance(&prefix, scope);
                self.claim(Kind::Prefix, &prefix, &owner).await
            }
            Resource::User {
                name,
                password,
                prefix,
                commands,
            } => {
                let instance = Owner::instance(&prefix, scope);
                if !instance.owns(self.owner(Kind::Prefix, &prefix).await?.as_deref()) {
                    return Err(instance.refusal(&self.name, &format!("prefix {prefix}")));
                }
                self.claim(Kind::User, &name, &Owner::binding(&prefix, scope))
                    .await?;
                let mut cmd = redis::cmd("ACL");
                cmd.arg("SETUSER")
                    .arg(&name)
                    .arg("reset")
                    .arg("on")
                    .arg(format!(">{password}"))
                    .arg(format!("~{prefix}:*"))
                    .arg("resetchannels")
                    .arg(format!("&{prefix}:*"))
                    .arg("-@all");
                for rule in commands
                    .iter()
                    .map(String::as_str)
                    .chain(DENIED.iter().copied())
                {
                    cmd.arg(rule);
                }
                self.with_admin(async |c| cmd.query_async::<()>(c).await)
                    .await?;
                self.save_acl().await
            }
        }
    }

    async fn delete(&self, resource: &Value, scope: &Scope<'_>) -> Result<(), TargetError> {
        match self.resource(resource)? {
            Resource::Keyspace { prefix } => {
                let instance = Owner::instance(&prefix, scope);
                if !self.is_own(Kind::Prefix, &prefix, &instance).await? {
                    return Ok(());
                }
                self.with_admin(async |c| unlink_prefix(c, &prefix).await)
                    .await?;
                let claims: Vec<(String, String)> =
                    self.with_admin(async |c| c.hgetall(OWNERS).await).await?;
                for (field, claim) in claims {
                    let Some(user) = field.strip_prefix(Kind::User.field_prefix()) else {
                        continue;
                    };
                    if Record::parse(&claim).is_some_and(|o| o.is_binding_of(&instance)) {
                        self.delete_user(user).await?;
                    }
                }
                self.release(Kind::Prefix, &prefix).await
            }
            Resource::User { name, prefix, .. } => {
                if self
                    .is_own(Kind::User, &name, &Owner::binding(&prefix, scope))
                    .await?
                {
                    self.delete_user(&name).await?;
                }
                Ok(())
            }
        }
    }

    async fn ready(&self, resource: &Value, _: &Scope<'_>) -> Result<Readiness, TargetError> {
        match self.resource(resource)? {
            Resource::Keyspace { .. } => self
                .with_admin(async |c| redis::cmd("PING").query_async::<String>(c).await)
                .await
                .map(|_| Readiness::Ready),
            Resource::User { name, password, .. } => {
                let probe = async {
                    let mut conn = self.connect().await?;
                    redis::cmd("AUTH")
                        .arg(&name)
                        .arg(&password)
                        .query_async::<()>(&mut conn)
                        .await?;
                    redis::cmd("PING").query_async::<String>(&mut conn).await
                };
                Ok(match probe.await {
                    Ok(_) => Readiness::Ready,
                    Err(e) => Readiness::Waiting(format!(
                        "user {name} cannot yet log in to {}: {:?}",
                        self.server,
                        e.kind()
                    )),
                })
            }
        }
    }

    fn validate(&self, resource: &Value) -> Result<(), TargetError> {
        self.resource(resource).map(drop)
    }
}

/// The keys of `prefix:*`, a `SCAN` batch at a time.
struct PrefixScan {
    pattern: String,
    cursor: Option<u64>,
}

impl PrefixScan {
    fn new(prefix: &str) -> Self {
        Self {
            pattern: format!("{}:*", glob_escape(prefix)),
            cursor: Some(0),
        }
    }

    /// The next batch (possibly empty), or `None` when the scan is complete.
    async fn next(
        &mut self,
        c: &mut MultiplexedConnection,
    ) -> Result<Option<Vec<Vec<u8>>>, RedisError> {
        let Some(cursor) = self.cursor else {
            return Ok(None);
        };
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&self.pattern)
            .arg("COUNT")
            .arg(BATCH)
            .query_async(c)
            .await?;
        self.cursor = (next != 0).then_some(next);
        Ok(Some(keys))
    }
}

/// Unlinks every key of `prefix:*`, a batch at a time.
async fn unlink_prefix(c: &mut MultiplexedConnection, prefix: &str) -> Result<(), RedisError> {
    let mut scan = PrefixScan::new(prefix);
    while let Some(keys) = scan.next(c).await? {
        if !keys.is_empty() {
            let _: i64 = c.unlink(keys).await?;
        }
    }
    Ok(())
}

/// Disconnects and deletes user `name`; succeeds when it does not exist.
async fn delete_user(c: &mut MultiplexedConnection, name: &str) -> Result<(), RedisError> {
    let _: i64 = redis::cmd("ACL")
        .arg("DELUSER")
        .arg(name)
        .query_async(c)
        .await?;
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("USER")
        .arg(name)
        .query_async(c)
        .await
        .or_else(|e| {
            if e.kind() == ErrorKind::Server(ServerErrorKind::ResponseError) {
                Ok(0)
            } else {
                Err(e)
            }
        })?;
    Ok(())
}

/// What brokkr creates on a Redis server.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Prefix,
    User,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Prefix => "prefix",
            Self::User => "user",
        }
    }

    fn field_prefix(self) -> &'static str {
        match self {
            Self::Prefix => "prefix:",
            Self::User => "user:",
        }
    }

    /// `name`'s field in [`OWNERS`].
    fn field(self, name: &str) -> String {
        format!("{}{name}", self.field_prefix())
    }

    /// Whether a user called `name` exists, or keys with prefix `name` do.
    async fn exists(self, c: &mut MultiplexedConnection, name: &str) -> Result<bool, RedisError> {
        match self {
            Self::User => {
                let rules: Option<redis::Value> = redis::cmd("ACL")
                    .arg("GETUSER")
                    .arg(name)
                    .query_async(c)
                    .await?;
                Ok(rules.is_some_and(|r| r != redis::Value::Nil))
            }
            Self::Prefix => has_keys(c, name).await,
        }
    }
}

/// Whether any key starts with `prefix:`.
async fn has_keys(c: &mut MultiplexedConnection, prefix: &str) -> Result<bool, RedisError> {
    let mut scan = PrefixScan::new(prefix);
    while let Some(keys) = scan.next(c).await? {
        if !keys.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Escapes glob metacharacters (`*?[]\`) so a pattern matches the text literally.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A user name or prefix: 1 to 128 of `[A-Za-z0-9_.-]`, so it cannot be read as an ACL rule or
/// a glob.
fn check_word(target: &str, what: &str, word: &str) -> Result<(), TargetError> {
    let ok = !word.is_empty()
        && word.len() <= MAX_NAME
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(TargetError::Invalid(format!(
            "target {target}: a {what} is 1 to {MAX_NAME} of letters, digits, `_`, `-` and `.`"
        )))
    }
}

/// A command rule: `+cmd`, `-cmd`, `+@category`, `-@category` or `+cmd|subcommand`.
fn check_command_rule(target: &str, rule: &str) -> Result<(), TargetError> {
    let body = rule.strip_prefix(['+', '-']).unwrap_or("");
    let name = body.strip_prefix('@').unwrap_or(body);
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '|'))
        && !matches!(name, "all" if !body.starts_with('@'));
    if !ok {
        return Err(TargetError::Invalid(format!(
            "target {target}: {rule:?} is not a command rule like `+get`, `-@write` or \
             `+hget|…`"
        )));
    }
    // Redis reads command and category names in any case.
    let granted = body.to_ascii_lowercase();
    let command = granted.split('|').next().unwrap_or_default();
    if rule.starts_with('+') && NEVER_GRANTED.contains(&command) {
        return Err(TargetError::Invalid(format!(
            "target {target}: {rule:?} would let a binding see or change more than its own keys; \
             administrative, dangerous and keyspace-wide commands are never granted"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_command_rules_pass() {
        for ok in [
            "+@read",
            "-@dangerous",
            "+get",
            "+hget",
            "-flushall",
            "-@admin",
        ] {
            assert!(check_command_rule("r", ok).is_ok(), "{ok}");
        }
        for bad in [
            "+@all",
            "allcommands",
            "~*",
            "allkeys",
            ">pw",
            "nopass",
            "on",
            "+",
            "+@",
            "&*",
            "+get ~*",
            "resetpass",
            "+@admin",
            "+@ADMIN",
            "+@dangerous",
            "+acl",
            "+ACL",
            "+acl|setuser",
            "+config|set",
            "+config|get",
            "+module",
            "+debug",
            "+keys",
            "+scan",
            "+pubsub|channels",
            "+flushall",
        ] {
            assert!(check_command_rule("r", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn words_cannot_carry_rules_or_globs() {
        assert!(check_word("r", "prefix", "i_orders-1.a").is_ok());
        for bad in ["", "a b", "a*", "~x", "a:b", &"a".repeat(129)] {
            assert!(check_word("r", "prefix", bad).is_err(), "{bad}");
        }
        assert_eq!(glob_escape(r"a*b?[c]\"), r"a\*b\?\[c\]\\");
    }
}
