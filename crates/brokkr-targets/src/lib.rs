//! Where brokkr creates a plan's resources.
//!
//! A [`Target`] receives *resources*: rendered template trees with a `kind` and the fields that
//! kind needs (a PostgreSQL `Database`, a Redis `User`, …). It creates or updates a resource
//! ([`Target::apply`]), removes it ([`Target::delete`]) and tells whether it is usable
//! ([`Target::ready`]). Every call is idempotent: the engine may repeat it after a crash that
//! struck between its effect and the record of it.
//!
//! Targets for shared servers: [`postgres`], [`mysql`] (MySQL 8 and MariaDB) and [`redis`]
//! (Redis 6+ ACLs). Each quotes every identifier and literal it sends by construction and
//! refuses names its server would truncate or misread; admin credentials come from an
//! environment variable or a file and never appear in errors or logs. [`kubernetes`] applies
//! resources as objects of a cluster. [`local`] runs a database server per instance on this
//! machine, supervised, whose databases and users the shared-server targets then make.
//!
//! [`Targets`] builds the targets a configuration declares and the facts templates see about
//! them (`targets.NAME.host`, `targets.NAME.port`, `targets.NAME.kind`).
//!
//! Beyond apply, delete and ready, a target may offer readiness checks a step declares
//! ([`Target::check`]), values read back from what it created ([`Target::read`]), a place to
//! publish a binding's credentials ([`Target::publish_credentials`]) and clean-up once a
//! deprovision step removed everything ([`Target::released`]); the defaults say it does not.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use brokkr_blueprint::{TargetConfig, TargetKind};
use serde_json::{Value, json};

mod admin_url;
pub mod kubernetes;
pub mod local;
pub mod mysql;
mod owner;
pub mod postgres;
pub mod redis;
mod resource;
mod sql;
mod target;

pub use admin_url::AdminUrl;
pub use brokkr_blueprint::NamesKey;
pub use target::{Readiness, Scope, Target, TargetError};

/// The targets of a configuration, by name, with the facts templates see about them.
#[derive(Clone, Default)]
pub struct Targets {
    targets: BTreeMap<String, Arc<dyn Target>>,
    /// Targets without an admin URL, whose steps name the server (`server:`).
    per_step: BTreeMap<String, TargetConfig>,
    facts: serde_json::Map<String, Value>,
}

impl Targets {
    /// Builds every target of `config`: reads each admin URL (from its environment variable or
    /// file) and prepares a connection pool that connects on first use, so a server that is
    /// down does not stop the broker from starting.
    /// Every target whose admin URL cannot be read is named in one error.
    /// A `local` target without `root` keeps its servers in `default_root`.
    pub fn from_config(
        config: &BTreeMap<String, TargetConfig>,
        default_root: &std::path::Path,
    ) -> Result<Self, TargetError> {
        let unreadable: Vec<String> = unreadable_admin_urls(config)
            .into_iter()
            .map(|(_, problem)| problem)
            .collect();
        if !unreadable.is_empty() {
            return Err(TargetError::Invalid(unreadable.join("; ")));
        }
        let mut targets = Self::default();
        for (name, target) in config {
            if target.servers_per_step() {
                targets.per_step.insert(name.clone(), target.clone());
                let facts = json!({"kind": target.kind.as_str()});
                targets.facts.insert(name.clone(), facts);
                continue;
            }
            let (built, facts): (Arc<dyn Target>, Value) = match target.kind {
                TargetKind::Kubernetes => (
                    Arc::new(kubernetes::Kubernetes::new(name, target)),
                    kubernetes::facts(target),
                ),
                TargetKind::Local => {
                    let root = target.root.as_ref().map(std::path::PathBuf::from);
                    let root = root.unwrap_or_else(|| default_root.to_owned());
                    let local = local::Local::new(name, target, root);
                    (Arc::new(local), local_facts())
                }
                _ => {
                    let url = AdminUrl::resolve(name, target)?;
                    (build(name, target, &url)?, facts(target, &url))
                }
            };
            targets.insert(name, built, facts);
        }
        Ok(targets)
    }

    /// Adds a target under `name` with the facts templates see about it.
    pub fn insert(&mut self, name: &str, target: Arc<dyn Target>, facts: Value) {
        self.targets.insert(name.to_owned(), target);
        self.facts.insert(name.to_owned(), facts);
    }

    /// The target called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Target>> {
        self.targets.get(name)
    }

    /// Target `name` administering the server a step names: its rendered `server` tree
    /// (`{host, port, username, password, database}`). Building one opens no connection.
    pub fn on_server(&self, name: &str, server: &Value) -> Result<Arc<dyn Target>, TargetError> {
        let Some(config) = self.per_step.get(name) else {
            return Err(TargetError::Invalid(format!(
                "target {name} is not one whose steps name their server"
            )));
        };
        let url = AdminUrl::from_server(name, config.kind, server)?;
        build(name, config, &url)
    }

    /// Whether the instance's resources are usable, as the targets that know say (a server a
    /// `local` target runs that is down: `Some(false)`); `None` when none knows.
    pub fn instance_usable(&self, instance_id: &str) -> Option<bool> {
        self.targets
            .values()
            .filter_map(|t| t.instance_usable(instance_id))
            .reduce(|a, b| a && b)
    }

    /// Why the instance's resources stay unusable, as the targets that gave up on them say;
    /// `None` when none did.
    pub fn instance_problem(&self, instance_id: &str) -> Option<String> {
        let problems: Vec<String> = (self.targets.values())
            .filter_map(|t| t.instance_problem(instance_id))
            .collect();
        (!problems.is_empty()).then(|| problems.join("; "))
    }

    /// Why `step_target` cannot make one of `templates` here (see [`Target::cannot_make`]).
    pub fn cannot_make(&self, step_target: &str, templates: &[Value]) -> Option<String> {
        let target = self.targets.get(step_target)?;
        templates.iter().find_map(|t| target.cannot_make(t))
    }

    /// Stops what targets run (the servers of `local` targets, unless they keep running).
    pub async fn shutdown(&self) {
        for target in self.targets.values() {
            target.shutdown().await;
        }
    }

    /// `targets` in templates: for each target, `kind`, `host` and `port`.
    pub fn facts(&self) -> Value {
        Value::Object(self.facts.clone())
    }
}

/// Why each target of `config` whose admin URL must be read at start cannot be: an environment
/// variable that is not set, a `url_file` that cannot be read, a URL that does not parse. Empty
/// when `brokkr serve` can build them all. Nothing is connected to. Each is (target, problem).
pub fn unreadable_admin_urls(config: &BTreeMap<String, TargetConfig>) -> Vec<(&str, String)> {
    config
        .iter()
        .filter(|(_, t)| !matches!(t.kind, TargetKind::Kubernetes | TargetKind::Local))
        .filter(|(_, t)| !t.servers_per_step())
        .filter_map(|(name, target)| {
            let problem = AdminUrl::resolve(name, target).err()?;
            Some((name.as_str(), problem.to_string()))
        })
        .collect()
}

/// The shared-server target of `config`'s kind for the server at `url`.
fn build(
    name: &str,
    config: &TargetConfig,
    url: &AdminUrl,
) -> Result<Arc<dyn Target>, TargetError> {
    let timeout = config.timeout.unwrap_or(Duration::from_secs(10));
    Ok(match config.kind {
        TargetKind::Postgres => Arc::new(postgres::Postgres::new(name, url, timeout)?),
        TargetKind::Mysql => Arc::new(mysql::Mysql::new(name, url, timeout)?),
        TargetKind::Redis => Arc::new(redis::Redis::new(name, url, timeout)?),
        TargetKind::Kubernetes | TargetKind::Local => {
            return Err(TargetError::Invalid(format!(
                "target {name}: only a postgres, mysql or redis target has an admin URL"
            )));
        }
    })
}

/// What bindings are told about a target: the configured host and port, else the admin URL's.
pub fn facts(target: &TargetConfig, url: &AdminUrl) -> Value {
    json!({
        "kind": target.kind.as_str(),
        "host": target.host.clone().unwrap_or_else(|| url.host().to_owned()),
        "port": target.port.unwrap_or_else(|| url.port()),
    })
}

/// What bindings are told about a target when its admin URL may not be at hand (`brokkr
/// render` on a workstation): from the URL when it can be read, else the configured host and
/// port, else the placeholder host `NAME.invalid` and the kind's usual port.
pub fn facts_or_placeholder(name: &str, target: &TargetConfig) -> Value {
    if target.kind == TargetKind::Kubernetes {
        return kubernetes::facts(target);
    }
    if target.servers_per_step() {
        return json!({"kind": target.kind.as_str()});
    }
    if let Ok(url) = AdminUrl::resolve(name, target) {
        return facts(target, &url);
    }
    let port = match target.kind {
        TargetKind::Postgres => 5432,
        TargetKind::Mysql => 3306,
        TargetKind::Redis => 6379,
        TargetKind::Kubernetes => 443,
        TargetKind::Local => return local_facts(),
    };
    json!({
        "kind": target.kind.as_str(),
        "host": target.host.clone().unwrap_or_else(|| format!("{name}.invalid")),
        "port": target.port.unwrap_or(port),
    })
}

/// What templates see about a `local` target: its servers listen on 127.0.0.1 (each on a port
/// of its own, which a step reads).
fn local_facts() -> Value {
    json!({"kind": "local", "host": "127.0.0.1"})
}
