//! The configuration file model, as written in YAML.
//!
//! The types accept keys they do not know, so that one parse can find every misspelt key: the
//! loader's parser (`parse`) reports each of them as an error.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// One configuration file. In a directory of files, `broker` and `store` may each appear in at
/// most one file; services and blueprints from all files are combined.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct File {
    /// Broker settings.
    #[serde(default)]
    pub broker: Option<BrokerConfig>,
    /// Store URL: `sqlite://PATH` or `postgres://…`.
    #[serde(default)]
    pub store: Option<String>,
    /// The OSB catalog.
    #[serde(default)]
    pub catalog: Option<CatalogConfig>,
    /// Where plans create resources, by name.
    #[serde(default)]
    pub targets: BTreeMap<String, TargetConfig>,
    /// Named template trees that steps refer to.
    #[serde(default)]
    pub templates: BTreeMap<String, Value>,
    /// One blueprint per plan.
    #[serde(default)]
    pub blueprints: Vec<Blueprint>,
}

/// The kinds of place a plan's resources can live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetKind {
    /// A shared PostgreSQL server: databases, owner roles and login roles.
    Postgres,
    /// A shared MySQL or MariaDB server: databases and users.
    Mysql,
    /// A shared Redis 6+ server: ACL users confined to a key prefix.
    Redis,
    /// A Kubernetes cluster: any object, applied server-side.
    Kubernetes,
    /// Database servers brokkr runs itself on this machine, one per instance.
    Local,
}

impl TargetKind {
    /// The name used in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Mysql => "mysql",
            Self::Redis => "redis",
            Self::Kubernetes => "kubernetes",
            Self::Local => "local",
        }
    }
}

/// One entry of `targets:`. The admin connection URL comes from an environment variable or a
/// file, never from the configuration itself, so it stays out of files and logs.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct TargetConfig {
    /// What the target is.
    pub kind: TargetKind,
    /// The environment variable holding the admin URL. A `postgres`, `mysql` or `redis` target
    /// with neither this nor `url_file` administers servers a plan provisions: each step that
    /// uses it names its `server`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_env: Option<String>,
    /// A file holding the admin URL (surrounding whitespace is ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_file: Option<String>,
    /// The host name bindings are given (default: the admin URL's host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The port bindings are given (default: the admin URL's port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// How long one connection attempt or statement may take (default 10s).
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout: Option<Duration>,
    /// `kubernetes`: the kubeconfig file (default: in-cluster, else `$KUBECONFIG` or
    /// `~/.kube/config`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<String>,
    /// `kubernetes`: the kubeconfig context (default: the current one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// `kubernetes`: the namespace of an instance's objects (default `from-context`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<NamespacePolicy>,
    /// `kubernetes`: what deprovision does with an instance's PersistentVolumeClaims (default
    /// `delete`); an object's annotation `brokkr.dev/pvc-policy` overrides it per plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_policy: Option<PvcPolicy>,
    /// `local`: the directory holding a directory per server (default: beside a SQLite store,
    /// `<store>.d/`, else `brokkr.db.d/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// `local`: whether servers keep running when `brokkr serve` stops (default `false`: they
    /// are stopped, and started again on the next start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_running: Option<bool>,
    /// `local`: the account servers run as when brokkr runs as root (default `nobody`);
    /// ignored otherwise (servers run as brokkr's own user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as: Option<String>,
}

impl TargetConfig {
    /// Whether the target administers servers that steps name (`server:`), because it has no
    /// admin URL of its own.
    pub fn servers_per_step(&self) -> bool {
        !matches!(self.kind, TargetKind::Kubernetes | TargetKind::Local)
            && self.url_env.is_none()
            && self.url_file.is_none()
    }
}

/// Where a `kubernetes` target puts an instance's namespaced objects.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NamespacePolicy {
    /// Always this namespace (`namespace: {fixed: NAME}`).
    Fixed(String),
    /// The namespace the platform sends in the OSB `context.namespace`.
    FromContext,
    /// A namespace per instance, `brokkr-<instance id>`, created with its first object and
    /// removed on deprovision.
    PerInstance,
}

/// What deprovision does with PersistentVolumeClaims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PvcPolicy {
    /// Deleted with the instance (their data is lost).
    Delete,
    /// Kept (unlabelled from the instance only by an operator).
    Retain,
}

/// The `catalog:` section: OSB service offerings, exactly as served.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CatalogConfig {
    /// Service offerings.
    #[serde(default)]
    pub services: Vec<brokkr_osb::Service>,
}

/// The `broker:` section.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct BrokerConfig {
    /// Address to listen on (default `127.0.0.1:8080`).
    #[serde(default)]
    pub listen: Option<String>,
    /// How platforms authenticate.
    #[serde(default)]
    pub auth: AuthConfig,
    /// How operators authenticate to the admin API (off when absent).
    #[serde(default)]
    pub admin_auth: Option<AuthConfig>,
    /// Largest accepted request body in bytes (default 1 MiB).
    #[serde(default)]
    pub max_body_bytes: Option<usize>,
    /// How long a deprovisioned instance or an unbound binding still answers `last_operation`
    /// with `succeeded` (default 24h).
    #[serde(default, with = "opt_duration")]
    pub retention: Option<Duration>,
    /// How long a synchronous request waits for its operation (default 60s).
    #[serde(default, with = "opt_duration")]
    pub sync_timeout: Option<Duration>,
    /// Accept a provision without `organization_guid` or `space_guid`, which OSB 2.17 requires
    /// (default false: 400), for platforms that send only `context`.
    #[serde(default)]
    pub accept_provision_without_guids: bool,
    /// Most HTTP connections open at once; beyond, new ones wait in the listen backlog
    /// (default 1024).
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// How long a client may take to send a request's headers (default 10s).
    #[serde(default, with = "opt_duration")]
    pub header_read_timeout: Option<Duration>,
    /// How long a connection may stay open without traffic, unless a request whose body has
    /// arrived is being answered (default 120s).
    #[serde(default, with = "opt_duration")]
    pub idle_timeout: Option<Duration>,
}

/// Platform credentials. With none configured (here or in the environment), `serve` generates a
/// password on first start.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AuthConfig {
    /// Basic auth user name.
    #[serde(default)]
    pub username: Option<String>,
    /// Basic auth password.
    #[serde(default)]
    pub password: Option<String>,
    /// Accepted bearer tokens.
    #[serde(default)]
    pub bearer_tokens: Vec<String>,
}

/// What one plan does.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Blueprint {
    /// The service offering's name.
    pub service: String,
    /// The plan's name.
    pub plan: String,
    /// How long an operation of this plan may take before it fails (default 24h).
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub deadline: Option<Duration>,
    /// The instance's lifecycle.
    #[serde(default)]
    pub instance: InstanceBlueprint,
    /// The lifecycle of a binding; required when the plan is bindable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<BindingBlueprint>,
}

/// Steps of provision, update and deprovision.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct InstanceBlueprint {
    /// Values computed once when the instance is provisioned, in order (a later one may use an
    /// earlier one as `registry('name')`), kept with the instance.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub registry: Vec<RegistryEntry>,
    /// Ordered steps; each names the operations it runs in.
    #[serde(default)]
    pub steps: Vec<Step>,
    /// The instance's dashboard: a template string that renders to an absolute http(s) URL,
    /// answered to the platform as OSB `dashboard_url`. It is evaluated as soon as every
    /// registry key it reads exists: when the instance is provisioned if it reads only the
    /// registry's own entries, else once a step that outputs one of the keys it reads finishes
    /// (and again whenever such a step of a provision or update finishes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dashboard_url: Option<String>,
}

/// One registry definition.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct RegistryEntry {
    /// The key, `[A-Za-z_][A-Za-z0-9_]*`.
    pub name: String,
    /// A template tree (usually one expression, e.g. `"{{ password(32) }}"`).
    pub value: Value,
    /// Masked wherever registry values are shown.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secret: bool,
}

/// Steps of bind and unbind, and the credentials a binding returns.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct BindingBlueprint {
    /// Values computed once per binding, in order, starting from a copy of the instance's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub registry: Vec<RegistryEntry>,
    /// Ordered steps; each names the operations it runs in.
    #[serde(default)]
    pub steps: Vec<Step>,
    /// A template tree that renders to the credentials map (see [`crate::template`]).
    pub credentials: Value,
    /// Whether bindings rotate (OSB `binding_rotatable`), and how long their credentials live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<Rotation>,
}

/// A plan's binding rotation: a bind may name a predecessor binding (OSB
/// `predecessor_binding_id`), and the plan is served with `binding_rotatable: true`. Optionally
/// a binding's credentials expire, answered as OSB binding metadata `expires_at` and
/// `renew_before`, and the broker revokes those nobody rotated in time (`revoke_expired`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct Rotation {
    /// How long a binding's credentials are valid once its bind succeeds (`expires_at`).
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub lifetime: Option<Duration>,
    /// How long before `expires_at` a platform should rotate the binding (`renew_before`);
    /// needs `lifetime`, and must be shorter.
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub renew_before: Option<Duration>,
    /// Whether the broker unbinds by itself a binding past its `expires_at` that nobody
    /// rotated: the plan's unbind steps run, as for a platform's unbind. Needs `lifetime`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub revoke_expired: bool,
}

/// An operation a step can take part in; the engine's operations are of these kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Creating an instance.
    Provision,
    /// Changing an instance's plan or parameters.
    Update,
    /// Removing an instance.
    Deprovision,
    /// Creating a binding.
    Bind,
    /// Removing a binding.
    Unbind,
    /// An update that moves an instance to its plan's new maintenance version. Only a step's
    /// `on` names it: such an update is an operation of kind [`Phase::Update`] that also runs
    /// the steps `on: [upgrade]` selects.
    Upgrade,
}

impl Phase {
    /// Whether the phase removes what earlier phases created (deprovision, unbind). Teardown
    /// phases run their steps in reverse order, and never block on one step.
    pub fn is_teardown(self) -> bool {
        matches!(self, Self::Deprovision | Self::Unbind)
    }

    /// The name used in configuration, logs and the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provision => "provision",
            Self::Update => "update",
            Self::Deprovision => "deprovision",
            Self::Bind => "bind",
            Self::Unbind => "unbind",
            Self::Upgrade => "upgrade",
        }
    }

    /// Parses [`as_str`](Self::as_str)'s spelling.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Provision,
            Self::Update,
            Self::Deprovision,
            Self::Bind,
            Self::Unbind,
            Self::Upgrade,
        ]
        .into_iter()
        .find(|phase| phase.as_str() == s)
    }
}

/// One step of an operation. Exactly one action field is set.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Step {
    /// Unique within its list; shown in operation descriptions.
    pub name: String,
    /// The operations this step runs in. Instance steps default to provision and update; binding
    /// steps to bind. An instance step `on: [upgrade]` runs only in an update that moves the
    /// instance to a new maintenance version (and, `on: [update]` too, in every update).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<Vec<Phase>>,
    /// Action: wait this long, without holding a worker, before the next step.
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub delay: Option<Duration>,
    /// Action: run a step kind compiled into the broker, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// Arguments for `run`, passed to the step kind as written.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub with: Value,
    /// Action: create (provision, update, bind) or delete (deprovision, unbind) the rendered
    /// `templates` on this target, then wait until each is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// For a `target` whose admin URL is not configured (a `postgres`, `mysql` or `redis` target
    /// without `url_env`/`url_file`): the server this step administers, one the plan itself
    /// provisioned. A template tree `{host, port, username, password, database}` (`port` and
    /// `database` optional); it is rendered for every call and never shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<Value>,
    /// For `target`: template trees, by name from the top-level `templates:` or written inline.
    /// Once loaded, every entry is the tree itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub templates: Vec<Value>,
    /// For `target`: checks that must pass, after the built-in readiness of each object, before
    /// the step is done (template trees; for `kubernetes`: `{apiVersion, kind, name, condition:
    /// {type, status}}` or `{apiVersion, kind, name, jsonpath, equals}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readiness: Vec<Value>,
    /// For `target`: values read from live objects once the step is ready, added to the registry
    /// (template trees; for `kubernetes`: `{apiVersion, kind, name, values: {KEY: /json/pointer}}`;
    /// every KEY must be in `outputs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read: Vec<Value>,
    /// For a binding's `target` step: also write the bind's credentials where the target keeps
    /// secrets (for `kubernetes`: a Secret of type `servicebinding.io/<type>` named `name`, in the
    /// instance's namespace), and remove them on unbind. A template tree `{name: …}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<Value>,
    /// Registry keys the step adds when it finishes (a `run` step kind's results, such as values
    /// an `http` call extracts), for later steps and the credentials.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<String>,
    /// A failure of this step never fails the operation; it is recorded as skipped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// An expression; the step runs only when it is true (e.g. `parameters.backups`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// In deprovision and unbind, how long a step that keeps asking to be retried may do so before
    /// it is skipped (default 5m). Those operations never block on one step.
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub budget: Option<Duration>,
}

impl Step {
    /// Whether the step runs in `phase`, given the defaults of the list it belongs to. A
    /// `target` step also runs, by default, in the phase that removes what it created.
    pub fn runs_in(&self, phase: Phase, defaults: &[Phase]) -> bool {
        match &self.on {
            Some(on) => on.contains(&phase),
            None => defaults.contains(&phase) || (self.target.is_some() && phase.is_teardown()),
        }
    }
}

/// Phases instance steps run in when they do not say.
pub const INSTANCE_STEP_DEFAULTS: &[Phase] = &[Phase::Provision, Phase::Update];
/// Phases binding steps run in when they do not say.
pub const BINDING_STEP_DEFAULTS: &[Phase] = &[Phase::Bind];

/// A duration written as a humantime string: `50ms`, `2s`, `5m`, `24h`.
pub mod duration {
    use super::*;

    /// Parses a humantime duration.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        parse(&String::deserialize(d)?)
    }

    /// `text` as a duration, or the error that names it.
    pub(super) fn parse<E: serde::de::Error>(text: &str) -> Result<Duration, E> {
        humantime::parse_duration(text)
            .map_err(|e| E::custom(format!("invalid duration {text:?}: {e}")))
    }

    /// Writes a duration as a humantime string.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }
}

/// Optional durations written as humantime strings (see [`duration`]).
pub mod opt_duration {
    use super::*;

    /// Parses an optional humantime duration.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| duration::parse(&text))
            .transpose()
    }

    /// Writes an optional duration as a humantime string.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => duration::serialize(d, s),
            None => s.serialize_none(),
        }
    }
}
