//! What both edits stand on: reading and writing the record annotations, finding lists and
//! containers through a mapping, and the error an edit fails with.

use serde_json::{Map, Value};

use super::mapping::{ContainerMapping, Mapping};
use super::path::{Path, PathError};

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

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn record<T: serde::de::DeserializeOwned>(
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

pub(super) fn annotations_mut<'v>(
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

pub(super) fn annotations(workload: &Value, mapping: &Mapping) -> Map<String, Value> {
    mapping
        .annotations
        .get(workload)
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

pub(super) fn list_mut<'v>(
    value: &'v mut Value,
    path: &Path,
    at: &str,
) -> Result<&'v mut Vec<Value>, Error> {
    path.get_or_create(value, || Value::Array(Vec::new()))?
        .as_array_mut()
        .ok_or_else(|| Error::NotA {
            path: format!("{at}{path}"),
            expected: "a list",
        })
}

/// One container the mapping finds: its key (name, or mapping and position) and its name.
pub(super) struct Found<'v> {
    pub(super) key: String,
    pub(super) name: Option<String>,
    pub(super) container: &'v mut Value,
}

/// Calls `f` on every container `mapping` finds in `workload`, stopping at the first error.
pub(super) fn for_each_container(
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
