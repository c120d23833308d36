//! A binding Secret: what a Kubernetes Secret holding a binding's credentials contains.
//!
//! The Secret's type is `servicebinding.io/<type>`, after the credentials' `type` entry, and
//! each credentials entry becomes one Secret entry: a string as it is, any other value as its
//! JSON text (`5432`, `true`). The entries are plain text; the caller puts them in the Secret's
//! `stringData`, or base64-encodes them into its `data`.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::credentials::CredentialsError;

/// What a binding Secret's `type` starts with; the credentials' `type` entry follows.
pub const SECRET_TYPE_PREFIX: &str = "servicebinding.io/";

/// The type and entries of the Secret that publishes a binding's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingSecret {
    /// The Secret's `type`: `servicebinding.io/<type>`.
    pub secret_type: String,
    /// The Secret's entries, as text, by entry name.
    pub entries: BTreeMap<String, String>,
}

impl BindingSecret {
    /// The Secret for `credentials` (already checked with [`crate::credentials::validate`]); it needs a
    /// string `type` entry to name the Secret's type.
    pub fn from_credentials(credentials: &Map<String, Value>) -> Result<Self, CredentialsError> {
        let Some(kind) = credentials.get("type").and_then(Value::as_str) else {
            return Err(CredentialsError(
                "no `type` entry for the Secret's type".into(),
            ));
        };
        let entries = credentials
            .iter()
            .map(|(name, value)| {
                let text = match value {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (name.clone(), text)
            })
            .collect();
        Ok(Self {
            secret_type: format!("{SECRET_TYPE_PREFIX}{kind}"),
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn strings_stay_as_they_are_and_other_values_become_json() {
        let secret = BindingSecret::from_credentials(&map(json!({
            "type": "postgresql", "host": "db", "port": 5432, "tls": true, "ratio": 0.5,
            "password": "5432"
        })))
        .unwrap();
        assert_eq!(secret.secret_type, "servicebinding.io/postgresql");
        let entries: Vec<(&str, &str)> = secret
            .entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            entries,
            [
                ("host", "db"),
                ("password", "5432"),
                ("port", "5432"),
                ("ratio", "0.5"),
                ("tls", "true"),
                ("type", "postgresql"),
            ]
        );
    }

    #[test]
    fn a_secret_needs_a_string_type() {
        for credentials in [json!({"host": "db"}), json!({"type": 5})] {
            let err = BindingSecret::from_credentials(&map(credentials)).unwrap_err();
            assert!(err.to_string().contains("`type`"), "{err}");
        }
    }
}
