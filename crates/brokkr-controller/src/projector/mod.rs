//! The one piece of code that edits workloads: it finds the pod template, containers and
//! volumes of any kind through a [`Mapping`], and applies or removes one of two edits on a
//! workload given as JSON. No I/O: callers read the workload, call this, and write it back.
//!
//! - [`inject`] / [`uninject`]: a ServiceBindingUsage's edit. Every container gets
//!   `envFrom: [{secretRef: {name}, prefix}]`; the pod template gets the annotation
//!   `usage.services.brokkr.dev/<usage>` recording the Secret, the prefix and a digest of the
//!   Secret's data ([`secret_digest`]), so a credential change rolls the pods.
//! - [`project`] / [`unproject`]: a servicebinding.io ServiceBinding's edit. A projected volume
//!   `servicebinding-<binding>` from the Secret (with `type`/`provider` overrides as downward-API
//!   items read from pod annotations, which win over the Secret's entries), mounted read-only at
//!   `$SERVICE_BINDING_ROOT/<name>` in every bound container, `SERVICE_BINDING_ROOT=/bindings`
//!   added where it is absent (and never changed where present), and the binding's `env`
//!   entries as variables from `secretKeyRef`. The annotation
//!   `projection.services.brokkr.dev/<volume>` records the Secret and the variables.
//!
//! Applying is idempotent and edits in place (an entry that is already there keeps its
//! position, so two edits on one workload never make each other's pods roll); removing takes
//! away exactly what the recorded edit added, keeps every other entry, and removes the lists
//! and maps it leaves empty, so applying then removing gives back the original workload.
//! Removing needs the mapping that applied the edit.

pub mod path;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::ByteString;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};

pub use path::{Path, PathError, Segment};

/// The variable that says where bindings are mounted.
pub const SERVICE_BINDING_ROOT: &str = "SERVICE_BINDING_ROOT";
/// Its value where the workload does not set it.
pub const DEFAULT_SERVICE_BINDING_ROOT: &str = "/bindings";
/// The prefix of the names of projected volumes.
pub const VOLUME_PREFIX: &str = "servicebinding-";
/// The prefix of a usage's record annotation; the usage's name follows.
pub const USAGE_ANNOTATION_PREFIX: &str = "usage.services.brokkr.dev/";
/// The prefix of a projection's record annotation; the volume's name follows.
pub const PROJECTION_ANNOTATION_PREFIX: &str = "projection.services.brokkr.dev/";
/// The prefix of the annotation a projection's `type` override is read from.
pub const TYPE_ANNOTATION_PREFIX: &str = "type.projection.services.brokkr.dev/";
/// The prefix of the annotation a projection's `provider` override is read from.
pub const PROVIDER_ANNOTATION_PREFIX: &str = "provider.projection.services.brokkr.dev/";
/// The annotation listing the containers whose `SERVICE_BINDING_ROOT` the projector added.
pub const ROOT_ANNOTATION: &str = "projection.services.brokkr.dev/service-binding-root";

/// Why an edit could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A mapping's path is wrong, or the workload has something else where it leads.
    #[error(transparent)]
    Path(#[from] PathError),
    /// A location that holds a list (or a map) holds something else.
    #[error("{path}: not {expected}")]
    NotA {
        /// Where.
        path: String,
        /// What was expected there.
        expected: &'static str,
    },
    /// A record annotation is not what the projector writes.
    #[error("annotation {key}: {reason}")]
    Record {
        /// The annotation.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Where a kind keeps what the projector edits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// A fixed path to the pod template's annotations (a map).
    pub annotations: Path,
    /// A fixed path to the pod's volumes (a list).
    pub volumes: Path,
    /// Where containers are.
    pub containers: Vec<ContainerMapping>,
}

/// Where containers are, and where each keeps its lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerMapping {
    /// A path (wildcards allowed) matching each container.
    pub path: Path,
    /// A fixed path, within a container, to its name; without one, every container is bound.
    pub name: Option<Path>,
    /// A fixed path, within a container, to its `env` list.
    pub env: Path,
    /// A fixed path, within a container, to its `envFrom` list.
    pub env_from: Path,
    /// A fixed path, within a container, to its `volumeMounts` list.
    pub volume_mounts: Path,
}

/// A container mapping as text, each `None` meaning the default of a real `Container`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ContainerPaths<'a> {
    /// The JSONPath matching the containers.
    pub path: &'a str,
    /// The name's fixed path (no default: without one, containers are not filtered).
    pub name: Option<&'a str>,
    /// `env`'s fixed path (default `.env`).
    pub env: Option<&'a str>,
    /// `envFrom`'s fixed path (default `.envFrom`).
    pub env_from: Option<&'a str>,
    /// `volumeMounts`' fixed path (default `.volumeMounts`).
    pub volume_mounts: Option<&'a str>,
}

impl ContainerMapping {
    /// Parses `paths`.
    pub fn parse(paths: &ContainerPaths<'_>) -> Result<ContainerMapping, PathError> {
        let fixed = |p: Option<&str>, default: &str| Path::parse_fixed(p.unwrap_or(default));
        Ok(ContainerMapping {
            path: Path::parse(paths.path)?,
            name: paths.name.map(Path::parse_fixed).transpose()?,
            env: fixed(paths.env, ".env")?,
            env_from: fixed(paths.env_from, ".envFrom")?,
            volume_mounts: fixed(paths.volume_mounts, ".volumeMounts")?,
        })
    }
}

impl Mapping {
    /// The mapping of a kind whose `PodTemplateSpec` is at the fixed path `template`:
    /// containers and init containers, named by `.name`.
    pub fn pod_template(template: &str) -> Result<Mapping, PathError> {
        let template = Path::parse_fixed(template)?;
        let at = |rest: &str| template.join(&Path::parse(rest).expect("a valid path"));
        let container = |list: &str| ContainerMapping {
            path: at(list),
            name: Some(Path::parse_fixed(".name").expect("a valid path")),
            env: Path::parse_fixed(".env").expect("a valid path"),
            env_from: Path::parse_fixed(".envFrom").expect("a valid path"),
            volume_mounts: Path::parse_fixed(".volumeMounts").expect("a valid path"),
        };
        Ok(Mapping {
            annotations: at(".metadata.annotations"),
            volumes: at(".spec.volumes"),
            containers: vec![
                container(".spec.containers[*]"),
                container(".spec.initContainers[*]"),
            ],
        })
    }

    /// The mapping of a `PodSpec`-able kind: its template at `.spec.template`.
    pub fn pod_spec_able() -> Mapping {
        Mapping::pod_template(".spec.template").expect("a valid path")
    }

    /// The built-in mapping of the kind `kind` of API group `group` (`""` for the core group):
    /// Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController, Job and CronJob.
    pub fn builtin(group: &str, kind: &str) -> Option<Mapping> {
        match (group, kind) {
            ("apps", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet")
            | ("batch", "Job")
            | ("", "ReplicationController") => Some(Mapping::pod_spec_able()),
            ("batch", "CronJob") => Some(
                Mapping::pod_template(".spec.jobTemplate.spec.template").expect("a valid path"),
            ),
            _ => None,
        }
    }

    /// A mapping from its parts, each `None` meaning the `PodSpec`-able default (as a
    /// servicebinding.io ClusterWorkloadResourceMapping's version entry says); an empty
    /// `containers` means the `PodSpec`-able containers and init containers.
    pub fn new(
        annotations: Option<&str>,
        containers: &[ContainerPaths<'_>],
        volumes: Option<&str>,
    ) -> Result<Mapping, PathError> {
        let default = Mapping::pod_spec_able();
        Ok(Mapping {
            annotations: annotations
                .map(Path::parse_fixed)
                .transpose()?
                .unwrap_or(default.annotations),
            volumes: volumes
                .map(Path::parse_fixed)
                .transpose()?
                .unwrap_or(default.volumes),
            containers: if containers.is_empty() {
                default.containers
            } else {
                containers
                    .iter()
                    .map(ContainerMapping::parse)
                    .collect::<Result<_, _>>()?
            },
        })
    }
}

/// A ServiceBindingUsage's edit: the Secret's variables in every container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Injection {
    /// The usage's name; one workload carries one injection per usage.
    pub usage: String,
    /// The Secret.
    pub secret: String,
    /// The prefix of every variable (none when empty).
    pub prefix: String,
    /// The digest of the Secret's data ([`secret_digest`]).
    pub digest: String,
}

/// A servicebinding.io ServiceBinding's edit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Projection {
    /// What identifies the binding on the workload (its name): the volume is named after it.
    pub binding: String,
    /// The directory under `$SERVICE_BINDING_ROOT` (`.spec.name`, default the binding's name).
    pub name: String,
    /// The Secret.
    pub secret: String,
    /// Overrides the Secret's `type` entry.
    pub type_: Option<String>,
    /// Overrides the Secret's `provider` entry.
    pub provider: Option<String>,
    /// Variables from the Secret's entries: (variable, key).
    pub env: Vec<(String, String)>,
    /// The containers to bind, by name; empty for all.
    pub containers: Vec<String>,
}

/// The digest of a Secret's data, the same for the same entries in any order.
pub fn secret_digest(data: Option<&BTreeMap<String, ByteString>>) -> String {
    let mut hash = Sha256::new();
    for (key, value) in data.into_iter().flatten() {
        hash.update((key.len() as u64).to_be_bytes());
        hash.update(key.as_bytes());
        hash.update((value.0.len() as u64).to_be_bytes());
        hash.update(&value.0);
    }
    format!("sha256:{}", hex(&hash.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An annotation name (at most 63 characters) for `id`: `id` itself when it fits, else its
/// start and a hash.
fn annotation_name(id: &str) -> String {
    let valid = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    if valid(id) {
        return id.to_owned();
    }
    let hash = hex(&Sha256::digest(id.as_bytes()))[..16].to_owned();
    let start: String = id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
        .take(46)
        .collect();
    let start = start.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if start.is_empty() {
        hash
    } else {
        format!("{start}-{hash}")
    }
}

/// The name of the volume projecting the binding `binding`.
pub fn volume_name(binding: &str) -> String {
    let label = binding.len() + VOLUME_PREFIX.len() <= 63
        && !binding.is_empty()
        && binding
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !binding.ends_with('-');
    if label {
        format!("{VOLUME_PREFIX}{binding}")
    } else {
        format!(
            "{VOLUME_PREFIX}{}",
            &hex(&Sha256::digest(binding.as_bytes()))[..32]
        )
    }
}

/// The annotation that records `usage`'s injection.
pub fn usage_annotation(usage: &str) -> String {
    format!("{USAGE_ANNOTATION_PREFIX}{}", annotation_name(usage))
}

/// The annotation that records the projection of `binding`.
pub fn projection_annotation(binding: &str) -> String {
    format!("{PROJECTION_ANNOTATION_PREFIX}{}", volume_name(binding))
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct UsageRecord {
    secret: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    prefix: String,
    #[serde(default)]
    digest: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct ProjectionRecord {
    secret: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    env: Vec<String>,
}

fn record<T: serde::de::DeserializeOwned>(
    annotations: &Map<String, Value>,
    key: &str,
) -> Result<Option<T>, Error> {
    let Some(value) = annotations.get(key) else {
        return Ok(None);
    };
    let bad = |reason: String| Error::Record {
        key: key.to_owned(),
        reason,
    };
    let text = value.as_str().ok_or_else(|| bad("not a string".into()))?;
    serde_json::from_str(text)
        .map(Some)
        .map_err(|e| bad(e.to_string()))
}

fn annotations_mut<'v>(
    workload: &'v mut Value,
    mapping: &Mapping,
) -> Result<&'v mut Map<String, Value>, Error> {
    mapping
        .annotations
        .get_or_create(workload, || Value::Object(Map::new()))?
        .as_object_mut()
        .ok_or_else(|| Error::NotA {
            path: mapping.annotations.to_string(),
            expected: "a map",
        })
}

fn annotations(workload: &Value, mapping: &Mapping) -> Map<String, Value> {
    mapping
        .annotations
        .get(workload)
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

fn list_mut<'v>(value: &'v mut Value, path: &Path, at: &str) -> Result<&'v mut Vec<Value>, Error> {
    path.get_or_create(value, || Value::Array(Vec::new()))?
        .as_array_mut()
        .ok_or_else(|| Error::NotA {
            path: format!("{at}{path}"),
            expected: "a list",
        })
}

/// One container the mapping finds: its key (name, or mapping and position) and its name.
struct Found<'v> {
    key: String,
    name: Option<String>,
    container: &'v mut Value,
}

/// Calls `f` on every container `mapping` finds in `workload`, stopping at the first error.
fn for_each_container(
    workload: &mut Value,
    mapping: &Mapping,
    mut f: impl FnMut(&ContainerMapping, Found<'_>) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut result = Ok(());
    for (i, containers) in mapping.containers.iter().enumerate() {
        containers
            .path
            .for_each_mut(workload, &mut |at, container| {
                if result.is_err() || !container.is_object() {
                    return;
                }
                let name = containers
                    .name
                    .as_ref()
                    .and_then(|p| p.get(container))
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                let key = match &name {
                    Some(name) => name.clone(),
                    None => format!("{i}:{at}"),
                };
                result = f(
                    containers,
                    Found {
                        key,
                        name,
                        container,
                    },
                );
            });
        if result.is_err() {
            break;
        }
    }
    result
}

fn is_env_from(entry: &Value, secret: &str, prefix: &str) -> bool {
    entry.pointer("/secretRef/name").and_then(Value::as_str) == Some(secret)
        && entry.get("prefix").and_then(Value::as_str).unwrap_or("") == prefix
        && entry.get("configMapRef").is_none()
}

fn env_from_entry(secret: &str, prefix: &str) -> Value {
    let mut entry = json!({"secretRef": {"name": secret}});
    if !prefix.is_empty() {
        entry["prefix"] = json!(prefix);
    }
    entry
}

/// The (secret, prefix) pairs the other usages recorded on the template.
fn other_usages(annotations: &Map<String, Value>, except: &str) -> BTreeSet<(String, String)> {
    annotations
        .iter()
        .filter(|(k, _)| k.starts_with(USAGE_ANNOTATION_PREFIX) && k.as_str() != except)
        .filter_map(|(k, _)| record::<UsageRecord>(annotations, k).ok().flatten())
        .map(|r| (r.secret, r.prefix))
        .collect()
}

/// Injects `injection` into `workload`: updates it in place when the usage injected before.
pub fn inject(workload: &mut Value, mapping: &Mapping, injection: &Injection) -> Result<(), Error> {
    let key = usage_annotation(&injection.usage);
    let current = annotations(workload, mapping);
    let old: Option<UsageRecord> = record(&current, &key)?;
    let others = other_usages(&current, &key);
    let new = UsageRecord {
        secret: injection.secret.clone(),
        prefix: injection.prefix.clone(),
        digest: injection.digest.clone(),
    };
    let stale = old
        .filter(|o| (&o.secret, &o.prefix) != (&new.secret, &new.prefix))
        .filter(|o| !others.contains(&(o.secret.clone(), o.prefix.clone())));
    for_each_container(workload, mapping, |paths, found| {
        let list = list_mut(found.container, &paths.env_from, &found.key)?;
        if let Some(stale) = &stale {
            list.retain(|e| !is_env_from(e, &stale.secret, &stale.prefix));
        }
        if !list
            .iter()
            .any(|e| is_env_from(e, &new.secret, &new.prefix))
        {
            list.push(env_from_entry(&new.secret, &new.prefix));
        }
        Ok(())
    })?;
    let text = serde_json::to_string(&new).expect("a record");
    annotations_mut(workload, mapping)?.insert(key, Value::String(text));
    Ok(())
}

/// Removes the injection of the usage `usage` from `workload`, if it has one; an entry another
/// usage injected too stays.
pub fn uninject(workload: &mut Value, mapping: &Mapping, usage: &str) -> Result<(), Error> {
    let key = usage_annotation(usage);
    let current = annotations(workload, mapping);
    let Some(old) = record::<UsageRecord>(&current, &key)? else {
        return Ok(());
    };
    if !other_usages(&current, &key).contains(&(old.secret.clone(), old.prefix.clone())) {
        for_each_container(workload, mapping, |paths, found| {
            if let Some(Value::Array(list)) = paths.env_from.get_mut(found.container) {
                list.retain(|e| !is_env_from(e, &old.secret, &old.prefix));
            }
            paths.env_from.prune_empty(found.container);
            Ok(())
        })?;
    }
    annotations_mut(workload, mapping)?.remove(&key);
    mapping.annotations.prune_empty(workload);
    Ok(())
}

/// The usages whose injections `workload` carries (their annotation names).
pub fn injected_usages(workload: &Value, mapping: &Mapping) -> Vec<String> {
    annotations(workload, mapping)
        .keys()
        .filter_map(|k| k.strip_prefix(USAGE_ANNOTATION_PREFIX))
        .map(str::to_owned)
        .collect()
}

fn field_path(annotation: &str) -> String {
    format!("metadata.annotations['{annotation}']")
}

/// Whether `entry` is a variable this projection set: one of `names`, from `secret` or from
/// one of the projection's override annotations.
fn is_projected_env(entry: &Value, names: &BTreeSet<&str>, secret: &str, volume: &str) -> bool {
    let Some(name) = entry.get("name").and_then(Value::as_str) else {
        return false;
    };
    if !names.contains(name) {
        return false;
    }
    let from_secret = entry
        .pointer("/valueFrom/secretKeyRef/name")
        .and_then(Value::as_str)
        == Some(secret);
    let field = entry
        .pointer("/valueFrom/fieldRef/fieldPath")
        .and_then(Value::as_str);
    let from_override = field == Some(&field_path(&format!("{TYPE_ANNOTATION_PREFIX}{volume}")))
        || field
            == Some(&field_path(&format!(
                "{PROVIDER_ANNOTATION_PREFIX}{volume}"
            )));
    from_secret || from_override
}

fn upsert_by_name(list: &mut Vec<Value>, entry: Value) {
    let name = entry.get("name").cloned();
    match list.iter_mut().find(|e| e.get("name") == name.as_ref()) {
        Some(old) => *old = entry,
        None => list.push(entry),
    }
}

fn remove_by_name(container: &mut Value, path: &Path, name: &str) {
    if let Some(Value::Array(list)) = path.get_mut(container) {
        list.retain(|e| e.get("name").and_then(Value::as_str) != Some(name));
    }
    path.prune_empty(container);
}

/// Removes `SERVICE_BINDING_ROOT` from a container the projector added it to, once no
/// projected volume is mounted in it.
fn release_root(paths: &ContainerMapping, found: &mut Found<'_>, roots: &mut BTreeSet<String>) {
    if !roots.contains(&found.key) {
        return;
    }
    let mounted = paths
        .volume_mounts
        .get(found.container)
        .and_then(Value::as_array)
        .is_some_and(|mounts| {
            mounts.iter().any(|m| {
                m.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| n.starts_with(VOLUME_PREFIX))
            })
        });
    if !mounted {
        remove_by_name(found.container, &paths.env, SERVICE_BINDING_ROOT);
        roots.remove(&found.key);
    }
}

fn roots(annotations: &Map<String, Value>) -> Result<BTreeSet<String>, Error> {
    Ok(record::<BTreeSet<String>>(annotations, ROOT_ANNOTATION)?.unwrap_or_default())
}

fn write_roots(annotations: &mut Map<String, Value>, roots: &BTreeSet<String>) {
    if roots.is_empty() {
        annotations.remove(ROOT_ANNOTATION);
    } else {
        let text = serde_json::to_string(roots).expect("a list");
        annotations.insert(ROOT_ANNOTATION.to_owned(), Value::String(text));
    }
}

/// Projects `projection` into `workload`: updates it in place when the binding was projected
/// before (a container no longer chosen loses its mount and variables).
pub fn project(
    workload: &mut Value,
    mapping: &Mapping,
    projection: &Projection,
) -> Result<(), Error> {
    let volume = volume_name(&projection.binding);
    let key = projection_annotation(&projection.binding);
    let type_key = format!("{TYPE_ANNOTATION_PREFIX}{volume}");
    let provider_key = format!("{PROVIDER_ANNOTATION_PREFIX}{volume}");
    let current = annotations(workload, mapping);
    let old: ProjectionRecord = record(&current, &key)?.unwrap_or_default();
    let mut roots = roots(&current)?;

    let mut sources = vec![json!({"secret": {"name": projection.secret}})];
    for (file, value, annotation) in [
        ("type", &projection.type_, &type_key),
        ("provider", &projection.provider, &provider_key),
    ] {
        if value.is_some() {
            sources.push(json!({"downwardAPI": {"items": [
                {"path": file, "fieldRef": {"fieldPath": field_path(annotation)}}
            ]}}));
        }
    }
    let volumes = list_mut(workload, &mapping.volumes, "")?;
    upsert_by_name(
        volumes,
        json!({"name": volume, "projected": {"sources": sources}}),
    );

    let env: Vec<Value> = projection
        .env
        .iter()
        .map(|(name, key)| {
            let value_from = match (key.as_str(), &projection.type_, &projection.provider) {
                ("type", Some(_), _) => json!({"fieldRef": {"fieldPath": field_path(&type_key)}}),
                ("provider", _, Some(_)) => {
                    json!({"fieldRef": {"fieldPath": field_path(&provider_key)}})
                }
                _ => json!({"secretKeyRef": {"name": projection.secret, "key": key}}),
            };
            json!({"name": name, "valueFrom": value_from})
        })
        .collect();
    let new_names: BTreeSet<&str> = projection.env.iter().map(|(n, _)| n.as_str()).collect();
    let old_names: BTreeSet<&str> = old.env.iter().map(String::as_str).collect();
    let stale_names: BTreeSet<&str> = old_names.difference(&new_names).copied().collect();
    let all_names: BTreeSet<&str> = old_names.union(&new_names).copied().collect();

    for_each_container(workload, mapping, |paths, mut found| {
        let bound = projection.containers.is_empty()
            || found
                .name
                .as_ref()
                .is_none_or(|n| projection.containers.contains(n));
        if !bound {
            remove_by_name(found.container, &paths.volume_mounts, &volume);
            if let Some(Value::Array(list)) = paths.env.get_mut(found.container) {
                list.retain(|e| !is_projected_env(e, &all_names, &old.secret, &volume));
            }
            paths.env.prune_empty(found.container);
            release_root(paths, &mut found, &mut roots);
            return Ok(());
        }
        let list = list_mut(found.container, &paths.env, &found.key)?;
        list.retain(|e| !is_projected_env(e, &stale_names, &old.secret, &volume));
        let root = match list
            .iter()
            .find(|e| e.get("name").and_then(Value::as_str) == Some(SERVICE_BINDING_ROOT))
        {
            Some(e) => e
                .get("value")
                .and_then(Value::as_str)
                .filter(|v| !v.is_empty())
                .unwrap_or(DEFAULT_SERVICE_BINDING_ROOT)
                .to_owned(),
            None => {
                list.push(
                    json!({"name": SERVICE_BINDING_ROOT, "value": DEFAULT_SERVICE_BINDING_ROOT}),
                );
                roots.insert(found.key.clone());
                DEFAULT_SERVICE_BINDING_ROOT.to_owned()
            }
        };
        for entry in &env {
            upsert_by_name(list, entry.clone());
        }
        let mount_path = format!("{}/{}", root.trim_end_matches('/'), projection.name);
        let mounts = list_mut(found.container, &paths.volume_mounts, &found.key)?;
        upsert_by_name(
            mounts,
            json!({"name": volume, "mountPath": mount_path, "readOnly": true}),
        );
        Ok(())
    })?;

    let annotations = annotations_mut(workload, mapping)?;
    for (annotation, value) in [
        (&type_key, &projection.type_),
        (&provider_key, &projection.provider),
    ] {
        match value {
            Some(value) => annotations.insert(annotation.clone(), Value::String(value.clone())),
            None => annotations.remove(annotation),
        };
    }
    let new = ProjectionRecord {
        secret: projection.secret.clone(),
        env: new_names.iter().map(|n| (*n).to_owned()).collect(),
    };
    annotations.insert(
        key,
        Value::String(serde_json::to_string(&new).expect("a record")),
    );
    write_roots(annotations, &roots);
    Ok(())
}

/// Removes the projection of the binding `binding` from `workload`, if it has one.
pub fn unproject(workload: &mut Value, mapping: &Mapping, binding: &str) -> Result<(), Error> {
    let volume = volume_name(binding);
    let key = projection_annotation(binding);
    let current = annotations(workload, mapping);
    let Some(old) = record::<ProjectionRecord>(&current, &key)? else {
        return Ok(());
    };
    let mut roots = roots(&current)?;
    let names: BTreeSet<&str> = old.env.iter().map(String::as_str).collect();
    remove_by_name(workload, &mapping.volumes, &volume);
    for_each_container(workload, mapping, |paths, mut found| {
        remove_by_name(found.container, &paths.volume_mounts, &volume);
        if let Some(Value::Array(list)) = paths.env.get_mut(found.container) {
            list.retain(|e| !is_projected_env(e, &names, &old.secret, &volume));
        }
        paths.env.prune_empty(found.container);
        release_root(paths, &mut found, &mut roots);
        Ok(())
    })?;
    let annotations = annotations_mut(workload, mapping)?;
    annotations.remove(&key);
    annotations.remove(&format!("{TYPE_ANNOTATION_PREFIX}{volume}"));
    annotations.remove(&format!("{PROVIDER_ANNOTATION_PREFIX}{volume}"));
    write_roots(annotations, &roots);
    mapping.annotations.prune_empty(workload);
    Ok(())
}

/// The volumes of the bindings projected into `workload` (their record annotations' names).
pub fn projected_volumes(workload: &Value, mapping: &Mapping) -> Vec<String> {
    annotations(workload, mapping)
        .keys()
        .filter_map(|k| k.strip_prefix(PROJECTION_ANNOTATION_PREFIX))
        .filter(|v| v.starts_with(VOLUME_PREFIX))
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests;
