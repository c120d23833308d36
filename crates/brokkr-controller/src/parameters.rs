//! The parameters a ServiceInstance or ServiceBinding sends to its broker: `spec.parameters`
//! merged with the JSON objects held in the Secret keys that `spec.parametersFrom` names.
//!
//! What reaches the broker is the merge; what reaches the resource's status is a copy in which
//! every top-level value that came from a Secret reads `<redacted>`, and a SHA-256 checksum of the
//! merge, so that a change to a Secret is seen without its values ever being written anywhere.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};

use crate::resources::ParametersFromSource;

/// What a top-level value from a Secret shows in status.
pub const REDACTED: &str = "<redacted>";

/// Parameters ready to send.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parameters {
    /// The merge of `parameters` and every `parametersFrom` source; `None` when both are empty.
    pub merged: Option<Map<String, Value>>,
    /// `merged` with the values that came from Secrets replaced by [`REDACTED`].
    pub redacted: Option<Value>,
    /// Hex SHA-256 of `merged` with its object keys sorted; `None` when there are none.
    pub checksum: Option<String>,
}

/// Why the parameters cannot be built. [`Invalid::waits`] tells a user error that only an edit
/// can fix from a Secret that may still appear.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// `spec.parameters` is not a JSON object.
    #[error("spec.parameters must be a JSON object")]
    NotAnObject,
    /// A `parametersFrom` entry names no source.
    #[error("spec.parametersFrom[{0}] names no secretKeyRef")]
    NoSource(usize),
    /// The Secret does not exist (yet).
    #[error("Secret {0:?} named in spec.parametersFrom does not exist")]
    SecretMissing(String),
    /// The Secret has no such key.
    #[error("Secret {secret:?} named in spec.parametersFrom has no key {key:?}")]
    KeyMissing {
        /// The Secret.
        secret: String,
        /// The key.
        key: String,
    },
    /// The key does not hold a JSON object. The value itself is never shown.
    #[error("key {key:?} of Secret {secret:?} must hold a JSON object")]
    NotJson {
        /// The Secret.
        secret: String,
        /// The key.
        key: String,
    },
    /// Two sources give the same top-level key.
    #[error("parameter {key:?} is given twice (in {first} and in {second})")]
    Duplicate {
        /// The key.
        key: String,
        /// Where it was first given.
        first: String,
        /// Where it was given again.
        second: String,
    },
}

impl Invalid {
    /// Whether this may resolve itself by waiting (a Secret, or one of its keys, yet to come).
    pub fn waits(&self) -> bool {
        matches!(self, Self::SecretMissing(_) | Self::KeyMissing { .. })
    }
}

/// Reads the Secrets that `from` names in `namespace` and merges them with `parameters`.
/// `Ok(Err(_))` is a problem with the resource or its Secrets; `Err(_)` is the API failing.
pub async fn build(
    client: &Client,
    namespace: &str,
    parameters: Option<&Value>,
    from: &[ParametersFromSource],
) -> Result<Result<Parameters, Invalid>, kube::Error> {
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let mut sources = Vec::with_capacity(from.len());
    for (i, source) in from.iter().enumerate() {
        let Some(key_ref) = &source.secret_key_ref else {
            return Ok(Err(Invalid::NoSource(i)));
        };
        let Some(secret) = secrets.get_opt(&key_ref.name).await? else {
            return Ok(Err(Invalid::SecretMissing(key_ref.name.clone())));
        };
        let value = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&key_ref.key))
            .map(|bytes| bytes.0.clone())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(&key_ref.key))
                    .map(|s| s.clone().into_bytes())
            });
        let Some(value) = value else {
            return Ok(Err(Invalid::KeyMissing {
                secret: key_ref.name.clone(),
                key: key_ref.key.clone(),
            }));
        };
        sources.push(Source {
            secret: key_ref.name.clone(),
            key: key_ref.key.clone(),
            json: value,
        });
    }
    Ok(merge(parameters, &sources))
}

/// One Secret key named in `parametersFrom`, as read.
#[derive(Clone, Debug)]
pub struct Source {
    /// The Secret's name.
    pub secret: String,
    /// The key.
    pub key: String,
    /// The key's value: should be a JSON object.
    pub json: Vec<u8>,
}

impl Source {
    fn describe(&self) -> String {
        format!("Secret {:?} key {:?}", self.secret, self.key)
    }
}

/// Merges `parameters` with the JSON object of each source.
pub fn merge(parameters: Option<&Value>, sources: &[Source]) -> Result<Parameters, Invalid> {
    let mut merged = match parameters {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(_) => return Err(Invalid::NotAnObject),
    };
    let mut origin: BTreeMap<String, String> = merged
        .keys()
        .map(|k| (k.clone(), "spec.parameters".to_owned()))
        .collect();
    let mut redacted = merged.clone();
    for source in sources {
        let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(&source.json) else {
            return Err(Invalid::NotJson {
                secret: source.secret.clone(),
                key: source.key.clone(),
            });
        };
        let name = source.describe();
        for (key, value) in map {
            if let Some(first) = origin.get(&key) {
                return Err(Invalid::Duplicate {
                    key,
                    first: first.clone(),
                    second: name.clone(),
                });
            }
            origin.insert(key.clone(), name.clone());
            redacted.insert(key.clone(), Value::String(REDACTED.into()));
            merged.insert(key, value);
        }
    }
    if merged.is_empty() {
        return Ok(Parameters::default());
    }
    Ok(Parameters {
        checksum: Some(checksum(&Value::Object(merged.clone()))),
        redacted: Some(Value::Object(redacted)),
        merged: Some(merged),
    })
}

/// Hex SHA-256 of `value` serialized with every object's keys sorted.
pub fn checksum(value: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                Value::Object(
                    keys.into_iter()
                        .map(|k| (k.clone(), sorted(&map[k])))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    let bytes = serde_json::to_vec(&sorted(value)).unwrap_or_default();
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn source(secret: &str, key: &str, json: &str) -> Source {
        Source {
            secret: secret.into(),
            key: key.into(),
            json: json.as_bytes().to_vec(),
        }
    }

    #[test]
    fn secret_values_are_sent_but_shown_redacted() {
        let spec = json!({"size": "small"});
        let p = merge(
            Some(&spec),
            &[source("db-params", "p", r#"{"password": "hunter2"}"#)],
        )
        .unwrap();
        let merged = Value::Object(p.merged.unwrap());
        assert_eq!(merged, json!({"size": "small", "password": "hunter2"}));
        assert_eq!(
            p.redacted.unwrap(),
            json!({"size": "small", "password": "<redacted>"})
        );
        assert_eq!(p.checksum.unwrap(), checksum(&merged));
    }

    #[test]
    fn the_checksum_ignores_key_order_and_follows_values() {
        let a = merge(Some(&json!({"a": 1, "b": {"x": 1, "y": 2}})), &[]).unwrap();
        let b = merge(Some(&json!({"b": {"y": 2, "x": 1}, "a": 1})), &[]).unwrap();
        let c = merge(Some(&json!({"a": 2, "b": {"x": 1, "y": 2}})), &[]).unwrap();
        assert_eq!(a.checksum, b.checksum);
        assert_ne!(a.checksum, c.checksum);
        let secret_changed = |v: &str| {
            merge(None, &[source("s", "k", &format!(r#"{{"pw": "{v}"}}"#))])
                .unwrap()
                .checksum
        };
        assert_ne!(secret_changed("one"), secret_changed("two"));
    }

    #[test]
    fn duplicate_keys_and_non_objects_are_refused_without_showing_values() {
        let err = merge(
            Some(&json!({"password": "x"})),
            &[source("s", "k", r#"{"password": "hunter2"}"#)],
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"parameter "password" is given twice (in spec.parameters and in Secret "s" key "k")"#
        );
        let err = merge(None, &[source("s", "k", "hunter2")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"key "k" of Secret "s" must hold a JSON object"#
        );
        assert!(!err.waits());
        assert_eq!(
            merge(Some(&json!([1])), &[]).unwrap_err(),
            Invalid::NotAnObject
        );
    }

    #[test]
    fn no_parameters_send_none() {
        assert_eq!(merge(None, &[]).unwrap(), Parameters::default());
        assert_eq!(merge(Some(&json!({})), &[]).unwrap(), Parameters::default());
    }
}
