//! A servicebinding.io ServiceBinding's edit: a projected volume of the Secret (with the `type`
//! and `provider` overrides as downward-API items), mounted under `$SERVICE_BINDING_ROOT` in the
//! bound containers, the binding's `env` entries as variables, recorded in the annotation
//! `projection.services.brokkr.dev/<volume>`.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};

use super::mapping::{ContainerMapping, Mapping};
use super::path::Path;
use super::walk::{
    Error, Found, annotations, annotations_mut, for_each_container, hex, list_mut, record,
};

/// The variable that says where bindings are mounted.
pub const SERVICE_BINDING_ROOT: &str = "SERVICE_BINDING_ROOT";
/// Its value where the workload does not set it.
pub const DEFAULT_SERVICE_BINDING_ROOT: &str = "/bindings";
/// The prefix of the names of projected volumes.
pub const VOLUME_PREFIX: &str = "servicebinding-";

/// The prefix of a projection's record annotation; the volume's name follows.
pub const PROJECTION_ANNOTATION_PREFIX: &str = "projection.services.brokkr.dev/";
/// The prefix of the annotation a projection's `type` override is read from.
pub const TYPE_ANNOTATION_PREFIX: &str = "type.projection.services.brokkr.dev/";
/// The prefix of the annotation a projection's `provider` override is read from.
pub const PROVIDER_ANNOTATION_PREFIX: &str = "provider.projection.services.brokkr.dev/";
/// The annotation listing the containers whose `SERVICE_BINDING_ROOT` the projector added.
pub const ROOT_ANNOTATION: &str = "projection.services.brokkr.dev/service-binding-root";

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

/// The annotation that records the projection of `binding`.
pub fn projection_annotation(binding: &str) -> String {
    format!("{PROJECTION_ANNOTATION_PREFIX}{}", volume_name(binding))
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct ProjectionRecord {
    secret: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    env: Vec<String>,
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
