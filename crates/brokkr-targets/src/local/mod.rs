//! The `local` target: a PostgreSQL, Redis, MariaDB or Memcached server per instance, run by
//! brokkr from the programs installed on this machine, on a free loopback port, with its data
//! in a directory per server below the target's `root`.
//!
//! Resources:
//!
//! ```yaml
//! kind: Server
//! engine: postgres            # postgres | redis | mariadb | memcached
//! name: pg-1a2b3c4d5e6f       # the server's directory: lowercase letters, digits, `-`
//! memory_mb: 128              # shared_buffers | maxmemory | innodb_buffer_pool_size | -m
//! max_connections: 20
//! maxmemory_policy: allkeys-lru   # redis only (default noeviction)
//! ```
//!
//! Applying a server creates and starts it (once); applying it with other limits restarts it
//! with them, its data kept. It is ready when its protocol answers as the admin. Deleting it
//! stops the server and removes its directory. A step's `read: [{kind: Server, name, values}]`
//! gives `/host`, `/port`, `/admin_username` and `/admin_password` (`values` maps registry keys
//! to them), which the instance's other steps and
//! its bindings hand to the `postgres`, `mysql` and `redis` targets as their `server`, so
//! databases, roles and ACL users are made by the same code as on shared servers.
//!
//! A server whose five starts in a row (`supervisor::MAX_FAILED_STARTS`) end before it answers
//! fails its step's readiness with the server's own last output lines.
//!
//! Supervision (restarts, adoption after a broker restart, stopping) is `supervisor`'s; what
//! differs between the four servers is `engines`'.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use brokkr_blueprint::TargetConfig;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::resource::parse;
use crate::target::{Readiness, Scope, Target, TargetError};

pub mod engines;
mod supervisor;

pub use engines::{Engine, Limits};
use supervisor::{Account, MAX_FAILED_STARTS, Saved, Starts, Supervisor, free_port};

/// Longest server name (a directory name).
const MAX_NAME: usize = 63;

/// A rendered resource of this target, parsed: its `kind` says which. (In this crate a
/// resource is always a rendered template tree; this is its typed form.)
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", deny_unknown_fields)]
enum Resource {
    Server {
        engine: Engine,
        name: String,
        #[serde(flatten)]
        limits: Limits,
    },
}

#[derive(Debug, Deserialize)]
#[serde(tag = "kind", deny_unknown_fields)]
enum ReadSpec {
    Server {
        name: String,
        /// Registry key → JSON pointer into `{host, port, admin_username, admin_password}`.
        values: std::collections::BTreeMap<String, String>,
    },
}

/// A `local` target.
pub struct Local {
    name: String,
    supervisor: Arc<Supervisor>,
    keep_running: bool,
    /// Why no server can run here (the servers' account cannot reach `root`): provisions are
    /// refused with it, so the rest of the broker still serves.
    unusable: Option<String>,
}

impl Local {
    /// Builds the target with servers under `root`, and adopts (or starts again) every server
    /// found there. Needs a Tokio runtime: each server is watched by a task. When no server can
    /// run here (no unprivileged account, a `root` it cannot reach or create), the target is
    /// still built, so the broker serves its other plans, and refuses provisions with the reason.
    ///
    /// `root` may be relative (to brokkr's working directory), hold `..` or pass through
    /// symbolic links: it is made canonical here, once, so that every path below it — the
    /// servers' directories, the files written there, the command lines the servers run with —
    /// is absolute and no server depends on the working directory it runs in.
    pub fn new(name: &str, config: &TargetConfig, root: PathBuf) -> Self {
        let account = Account::for_servers(config.run_as.as_deref());
        let prepared = match &account {
            Ok(account) => prepare_root(&root, account.is_some()),
            Err(reason) => Err(reason.clone()),
        };
        let (root, unusable) = match prepared {
            Ok(canonical) => (canonical, None),
            Err(reason) => (std::path::absolute(&root).unwrap_or(root), Some(reason)),
        };
        let account = account.unwrap_or_default();
        let supervisor = Arc::new(Supervisor::new(root, account));
        match &unusable {
            None => supervisor.adopt_all(),
            Some(reason) => tracing::warn!(target = name, %reason, "local servers cannot run"),
        }
        Self {
            name: name.to_owned(),
            supervisor,
            keep_running: config.keep_running.unwrap_or(false),
            unusable: unusable.map(|reason| format!("target {name}: {reason}")),
        }
    }

    fn resource(&self, resource: &Value) -> Result<(Engine, String, Limits), TargetError> {
        let Resource::Server {
            engine,
            name,
            limits,
        } = parse(&self.name, resource)?;
        self.check_name(&name)?;
        engine.check(&limits).map_err(|m| self.invalid(&m))?;
        Ok((engine, name, limits))
    }

    fn check_name(&self, name: &str) -> Result<(), TargetError> {
        let ok = !name.is_empty()
            && name.len() <= MAX_NAME
            && !name.starts_with('-')
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        match ok {
            true => Ok(()),
            false => Err(self.invalid(&format!(
                "a server name is 1 to {MAX_NAME} lowercase letters, digits and `-` (got {name:?})"
            ))),
        }
    }

    fn invalid(&self, message: &str) -> TargetError {
        TargetError::Invalid(format!("target {}: {message}", self.name))
    }

    /// Whether the servers of `instance_id` are all usable; `None` when it has none here.
    pub fn instance_usable(&self, instance_id: &str) -> Option<bool> {
        let servers: Vec<bool> = (self.supervisor.all().iter())
            .filter(|s| s.saved().instance_id == instance_id)
            .map(|s| s.usable())
            .collect();
        (!servers.is_empty()).then(|| servers.iter().all(|u| *u))
    }

    /// Why servers of `instance_id` stay down: those the supervisor gave up on, each with its
    /// last output lines; `None` when there is none.
    pub fn instance_problem(&self, instance_id: &str) -> Option<String> {
        let problems: Vec<String> = (self.supervisor.all().iter())
            .filter(|s| s.saved().instance_id == instance_id)
            .filter_map(|s| {
                let starts = s.starts();
                starts.given_up.then(|| given_up(&s.name, &starts))
            })
            .collect();
        (!problems.is_empty()).then(|| problems.join("; "))
    }
}

/// Creates `root` and returns its canonical path (absolute, without `..` or symbolic links);
/// when servers run as another account (brokkr is root), checks that the account can pass
/// through every directory above it.
fn prepare_root(root: &std::path::Path, other_account: bool) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let canonical = std::fs::canonicalize(root).map_err(|e| format!("{}: {e}", root.display()))?;
    if !other_account {
        return Ok(canonical);
    }
    let _ = std::fs::set_permissions(&canonical, std::fs::Permissions::from_mode(0o711));
    match canonical
        .ancestors()
        .find(|dir| std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 == 0))
    {
        Some(closed) => Err(format!(
            "servers run as an unprivileged account (brokkr runs as root), which cannot pass \
             through {}: set the target's `root` below directories others may enter",
            closed.display()
        )),
        None => Ok(canonical),
    }
}

/// What a server the supervisor gave up on reports: how many starts ended, and its last words.
fn given_up(name: &str, starts: &Starts) -> String {
    format!(
        "server {name} did not start: {} starts in a row ended before it answered; its last \
         output: {}",
        starts.failed,
        starts.last_error.as_deref().unwrap_or("")
    )
}

/// A fresh admin password: 32 letters and digits from the operating system's random source.
fn password() -> Result<String, TargetError> {
    use std::io::Read;
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut random = std::fs::File::open("/dev/urandom")
        .map_err(|e| TargetError::Unavailable(format!("cannot read /dev/urandom: {e}")))?;
    let mut password = String::new();
    let mut byte = [0u8; 1];
    while password.len() < 32 {
        random
            .read_exact(&mut byte)
            .map_err(|e| TargetError::Unavailable(format!("cannot read /dev/urandom: {e}")))?;
        // 248 = 4 × 62: bytes above it are dropped, so every character is equally likely.
        if byte[0] < 248 {
            password.push(CHARS[usize::from(byte[0]) % CHARS.len()] as char);
        }
    }
    Ok(password)
}

#[async_trait]
impl Target for Local {
    async fn apply(&self, resource: &Value, scope: &Scope<'_>) -> Result<(), TargetError> {
        let (engine, name, limits) = self.resource(resource)?;
        if let Some(reason) = &self.unusable {
            return Err(TargetError::Invalid(reason.clone()));
        }
        if let Some(server) = self.supervisor.get(&name) {
            let saved = server.saved();
            if saved.instance_id != scope.instance_id || saved.engine != engine {
                return Err(self.invalid(&format!(
                    "server {name} belongs to another instance or is another kind of server"
                )));
            }
            if saved.limits != limits {
                (self.supervisor.change_limits(&server, limits).await)
                    .map_err(|m| self.invalid(&m))?;
            } else if server.starts().given_up {
                self.supervisor.start_again(&server).await;
            }
            return Ok(());
        }
        let bins = engine.binaries().map_err(|missing| {
            self.invalid(&format!(
                "{missing} is not installed: install the Debian package {}",
                engine.package()
            ))
        })?;
        let saved = Saved {
            instance_id: scope.instance_id.to_owned(),
            engine,
            port: free_port()?,
            password: password()?,
            limits,
            pid: None,
            answered_once: false,
        };
        (self.supervisor.create(&name, saved, bins).await).map_err(|m| self.invalid(&m))?;
        Ok(())
    }

    async fn delete(&self, resource: &Value, scope: &Scope<'_>) -> Result<(), TargetError> {
        let (_, name, _) = self.resource(resource)?;
        if let Some(server) = self.supervisor.get(&name)
            && server.saved().instance_id != scope.instance_id
        {
            return Ok(()); // not this instance's: left alone
        }
        (self.supervisor.remove(&name).await).map_err(TargetError::Unavailable)
    }

    async fn ready(&self, resource: &Value, _: &Scope<'_>) -> Result<Readiness, TargetError> {
        let (_, name, _) = self.resource(resource)?;
        let Some(server) = self.supervisor.get(&name) else {
            return Ok(Readiness::Waiting(format!(
                "server {name} is not created yet"
            )));
        };
        if server.usable() {
            return Ok(Readiness::Ready);
        }
        let starts = server.starts();
        let last = starts.last_error.as_deref().unwrap_or("");
        if starts.given_up {
            return Err(self.invalid(&given_up(&name, &starts)));
        }
        Ok(match server.probe().await {
            Ok(()) => Readiness::Ready,
            Err(_) if starts.failed > 0 => Readiness::Waiting(format!(
                "server {name} is starting again ({} of {MAX_FAILED_STARTS} starts ended \
                 before it answered; the last: {last})",
                starts.failed
            )),
            Err(e) => Readiness::Waiting(format!("server {name} is starting: {e}")),
        })
    }

    fn validate(&self, resource: &Value) -> Result<(), TargetError> {
        self.resource(resource).map(|_| ())
    }

    async fn read(&self, spec: &Value, _: &Scope<'_>) -> Result<Map<String, Value>, TargetError> {
        let ReadSpec::Server { name, values } = parse(&self.name, spec)?;
        let Some(server) = self.supervisor.get(&name) else {
            return Err(TargetError::Unavailable(format!(
                "server {name} is not created yet"
            )));
        };
        let saved = server.saved();
        let facts = json!({
            "host": "127.0.0.1",
            "port": saved.port,
            "admin_username": engines::ADMIN,
            "admin_password": saved.password,
        });
        values
            .into_iter()
            .map(|(key, pointer)| match facts.pointer(&pointer) {
                Some(value) => Ok((key, value.clone())),
                None => Err(self.invalid(&format!(
                    "read: {pointer} is none of /host, /port, /admin_username, /admin_password"
                ))),
            })
            .collect()
    }

    fn instance_usable(&self, instance_id: &str) -> Option<bool> {
        Local::instance_usable(self, instance_id)
    }

    fn instance_problem(&self, instance_id: &str) -> Option<String> {
        Local::instance_problem(self, instance_id)
    }

    fn cannot_make(&self, template: &Value) -> Option<String> {
        if template["kind"] != "Server" {
            return None;
        }
        if let Some(reason) = &self.unusable {
            return Some(reason.clone());
        }
        let engine: Engine = serde_json::from_value(template["engine"].clone()).ok()?;
        let missing = engine.binaries().err()?;
        Some(format!(
            "this plan needs {missing}, which is not installed on the broker's machine: \
             install the Debian package {}",
            engine.package()
        ))
    }

    async fn shutdown(&self) {
        if !self.keep_running {
            self.supervisor.stop_all().await;
        }
    }
}

/// What `brokkr check` reports about this machine: each engine, and the path of each program
/// it needs or the Debian package to install.
pub fn programs_report() -> Vec<(Engine, Result<Vec<PathBuf>, String>)> {
    Engine::ALL
        .iter()
        .map(|e| {
            let found = e.binaries().map_err(|missing| {
                format!(
                    "{missing} not found: install the Debian package {}",
                    e.package()
                )
            });
            (*e, found)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_with_a_key_it_does_not_know_is_refused() {
        let server = json!({"kind": "Server", "engine": "redis", "name": "r1",
            "memory_mb": 64, "max_connections": 10});
        assert!(parse::<Resource>("here", &server).is_ok());
        for (key, value) in [
            ("maxmemory_polcy", json!("allkeys-lru")),
            ("colour", json!(1)),
        ] {
            let mut wrong = server.clone();
            wrong[key] = value;
            let e = parse::<Resource>("here", &wrong).unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
    }

    #[test]
    fn a_root_another_account_cannot_reach_is_named() {
        use std::os::unix::fs::PermissionsExt;
        let closed = tempfile::tempdir().unwrap();
        std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let root = closed.path().join("servers");
        let e = prepare_root(&root, true).unwrap_err();
        assert!(e.contains(&closed.path().display().to_string()), "{e}");
        // brokkr's own account needs no way through for others.
        prepare_root(&root, false).unwrap();
        std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        prepare_root(&root, true).unwrap();
    }

    #[test]
    fn a_root_with_dot_dot_or_through_a_symbolic_link_is_made_canonical() {
        let dir = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
        let canonical = real.join("servers");
        for root in [
            dir.path().join("link/servers"),
            dir.path().join("real/../link/./servers"),
        ] {
            assert_eq!(prepare_root(&root, false).unwrap(), canonical, "{root:?}");
        }
    }

    #[test]
    fn passwords_are_32_letters_and_digits_and_differ() {
        let (a, b) = (password().unwrap(), password().unwrap());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }
}
