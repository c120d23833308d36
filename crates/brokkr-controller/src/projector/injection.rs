//! A ServiceBindingUsage's edit: `envFrom` the Secret (with the usage's prefix) in every
//! container, recorded in the annotation `usage.services.brokkr.dev/<usage>` with a digest of the
//! Secret's data. An entry another usage injected too stays when one of them is removed.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::ByteString;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};

use super::mapping::Mapping;
use super::walk::{Error, annotations, annotations_mut, for_each_container, hex, list_mut, record};

/// The prefix of a usage's record annotation; the usage's name follows.
pub const USAGE_ANNOTATION_PREFIX: &str = "usage.services.brokkr.dev/";

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

/// The annotation that records `usage`'s injection.
pub fn usage_annotation(usage: &str) -> String {
    format!("{USAGE_ANNOTATION_PREFIX}{}", annotation_name(usage))
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct UsageRecord {
    secret: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    prefix: String,
    #[serde(default)]
    digest: String,
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
