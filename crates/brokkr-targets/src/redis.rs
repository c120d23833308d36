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
//! A user is set with one `ACL SETUSER name reset on >password ~prefix:* &prefix:* resetchannels
//! -@all <commands>`, each rule its own protocol argument. Command rules must look like `+get`,
//! `-@admin` or `+config|get`: a rule that would grant keys, channels, passwords or `allcommands`
//! is refused. Deleting a keyspace unlinks its keys in batches (`SCAN MATCH` + `UNLINK`) and
//! deletes the users still confined to it; deleting a user disconnects and deletes it.

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Client, ErrorKind, RedisError, ServerErrorKind};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Mutex;

use crate::{AdminUrl, Readiness, Scope, Target, TargetError, check_secret, parse};

/// Longest prefix or user name accepted.
const MAX_NAME: usize = 128;
/// Keys unlinked per round trip when a keyspace is deleted.
const BATCH: usize = 500;

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
    async fn apply(&self, resource: &Value, _: &Scope<'_>) -> Result<(), TargetError> {
        match self.resource(resource)? {
            // Keys come into being as the application writes them.
            Resource::Keyspace { .. } => Ok(()),
            Resource::User {
                name,
                password,
                prefix,
                commands,
            } => {
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
                for rule in &commands {
                    cmd.arg(rule);
                }
                self.with_admin(async |c| cmd.query_async::<()>(c).await)
                    .await
            }
        }
    }

    async fn delete(&self, resource: &Value, _: &Scope<'_>) -> Result<(), TargetError> {
        match self.resource(resource)? {
            Resource::Keyspace { prefix } => {
                self.with_admin(async |c| unlink_prefix(c, &prefix).await)
                    .await?;
                let users = self
                    .with_admin(async |c| {
                        let rules: Vec<String> =
                            redis::cmd("ACL").arg("LIST").query_async(c).await?;
                        Ok(confined_users(&rules, &prefix))
                    })
                    .await?;
                for user in users {
                    self.with_admin(async |c| delete_user(c, &user).await)
                        .await?;
                }
                Ok(())
            }
            Resource::User { name, .. } => {
                self.with_admin(async |c| delete_user(c, &name).await).await
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

/// Unlinks every key of `prefix:*`, a batch at a time.
async fn unlink_prefix(c: &mut MultiplexedConnection, prefix: &str) -> Result<(), RedisError> {
    let pattern = format!("{}:*", glob_escape(prefix));
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(BATCH)
            .query_async(c)
            .await?;
        if !keys.is_empty() {
            let _: i64 = c.unlink(keys).await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
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

/// The users of `ACL LIST` whose key pattern is exactly `~prefix:*`.
fn confined_users(rules: &[String], prefix: &str) -> Vec<String> {
    let pattern = format!("~{}:*", glob_escape(prefix));
    let plain = format!("~{prefix}:*");
    rules
        .iter()
        .filter_map(|line| {
            let mut words = line.split(' ');
            let (Some("user"), Some(name)) = (words.next(), words.next()) else {
                return None;
            };
            words
                .any(|w| w == pattern || w == plain)
                .then(|| name.to_owned())
        })
        .collect()
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
    let grants_all = rule == "+@all";
    if ok && !grants_all {
        Ok(())
    } else {
        Err(TargetError::Invalid(format!(
            "target {target}: {rule:?} is not a command rule like `+get`, `-@admin` or \
             `+config|get` (`+@all` is refused)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_command_rules_pass() {
        for ok in ["+@read", "-@dangerous", "+get", "+config|get", "-flushall"] {
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

    #[test]
    fn confined_users_are_found_by_their_key_pattern() {
        let rules = [
            "user default on nopass ~* &* +@all".to_owned(),
            "user u1 on #abc ~i_a:* resetchannels &i_a:* -@all +@read".to_owned(),
            "user u2 on #abc ~i_ab:* resetchannels &i_ab:* -@all +@read".to_owned(),
        ];
        assert_eq!(confined_users(&rules, "i_a"), ["u1"]);
    }
}
