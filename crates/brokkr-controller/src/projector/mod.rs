//! The one piece of code that edits workloads: it finds the pod template, containers and
//! volumes of any kind through a [`Mapping`] (`mapping.rs`, its paths in [`path`]), and applies
//! or removes one of two edits on a workload given as JSON. No I/O: callers read the workload,
//! call this, and write it back.
//!
//! - [`inject`] / [`uninject`] (`injection.rs`): a ServiceBindingUsage's edit. Every container
//!   gets `envFrom: [{secretRef: {name}, prefix}]`; the pod template gets the annotation
//!   `usage.services.brokkr.dev/<usage>` recording the Secret, the prefix and a digest of the
//!   Secret's data ([`secret_digest`]), so a credential change rolls the pods.
//! - [`project`] / [`unproject`] (`projection.rs`): a servicebinding.io ServiceBinding's edit. A
//!   projected volume `servicebinding-<binding>` from the Secret (with `type`/`provider`
//!   overrides as downward-API items read from pod annotations, which win over the Secret's
//!   entries), mounted read-only at `$SERVICE_BINDING_ROOT/<name>` in every bound container,
//!   `SERVICE_BINDING_ROOT=/bindings` added where it is absent (and never changed where present),
//!   and the binding's `env` entries as variables from `secretKeyRef`. The annotation
//!   `projection.services.brokkr.dev/<volume>` records the Secret and the variables.
//!
//! Applying is idempotent and edits in place (an entry that is already there keeps its
//! position, so two edits on one workload never make each other's pods roll); removing takes
//! away exactly what the recorded edit added, keeps every other entry, and removes the lists
//! and maps it leaves empty, so applying then removing gives back the original workload.
//! Removing needs the mapping that applied the edit.
//!
//! This module holds what both edits stand on: reading the record annotations, and finding
//! lists and containers through the mapping.

mod injection;
mod mapping;
pub mod path;
mod projection;

use serde_json::{Map, Value};

pub use injection::{
    Injection, USAGE_ANNOTATION_PREFIX, inject, injected_usages, secret_digest, uninject,
    usage_annotation,
};
pub use mapping::{ContainerMapping, ContainerPaths, Mapping};
pub use path::{Path, PathError, Segment};
pub use projection::{
    DEFAULT_SERVICE_BINDING_ROOT, PROJECTION_ANNOTATION_PREFIX, PROVIDER_ANNOTATION_PREFIX,
    Projection, ROOT_ANNOTATION, SERVICE_BINDING_ROOT, TYPE_ANNOTATION_PREFIX, VOLUME_PREFIX,
    project, projected_volumes, projection_annotation, unproject, volume_name,
};

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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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

#[cfg(test)]
mod tests;
