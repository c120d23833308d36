//! The Secret a ServiceBinding writes: the broker's credentials as a servicebinding.io Secret
//! (type `servicebinding.io/<type>`, entries `type`, `provider` and every credential, nested
//! values as JSON text), changed by `spec.secretTransforms`, owned by the ServiceBinding through
//! a controller ownerReference. A Secret of the same name that the binding does not control is
//! never changed or deleted.

use std::collections::BTreeMap;

use base64::Engine as _;
use brokkr_servicebinding::{BindingSecret, DEFAULT_PROVIDER};
use jsonpath_rust::JsonPath as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::{Api, Resource, ResourceExt as _};
use serde_json::{Map, Value};

use crate::resources::{SecretTransform, ServiceBinding};

/// The label on every binding Secret, naming its ServiceBinding.
pub const BINDING_LABEL: &str = "services.brokkr.dev/service-binding";

/// The contents of a binding Secret, before it is written.
#[derive(Clone, Debug, PartialEq)]
pub struct Contents {
    /// `servicebinding.io/<type>`.
    pub secret_type: String,
    /// Entries by name.
    pub data: BTreeMap<String, Vec<u8>>,
}

/// Why credentials cannot become a Secret. Messages name keys, never values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    /// The credentials break the servicebinding.io provider contract.
    #[error("the broker's credentials are unusable: {0}")]
    Credentials(String),
    /// A transform cannot be applied.
    #[error("spec.secretTransforms[{index}]: {message}")]
    Transform {
        /// Which transform.
        index: usize,
        /// What is wrong with it.
        message: String,
    },
}

/// The Secret's contents for `credentials`: `type` defaults to `default_type` (the class's
/// name, for brokers that send none), `provider` to brokkr's; the result is checked against the
/// well-known entry rules; then `transforms` apply in order. `other_secret` reads a Secret of
/// the binding's namespace for `addKeysFrom`.
pub fn contents(
    credentials: Map<String, Value>,
    default_type: &str,
    transforms: &[SecretTransform],
    other_secret: &BTreeMap<String, BTreeMap<String, Vec<u8>>>,
) -> Result<Contents, Unusable> {
    let original = Value::Object(credentials.clone());
    let mut flat: Map<String, Value> = credentials
        .into_iter()
        .map(|(key, value)| match value {
            nested @ (Value::Object(_) | Value::Array(_)) => {
                (key, Value::String(nested.to_string()))
            }
            Value::Null => (key, Value::String(String::new())),
            scalar => (key, scalar),
        })
        .collect();
    flat.entry("type")
        .or_insert_with(|| Value::String(default_type.to_owned()));
    flat.entry("provider")
        .or_insert_with(|| Value::String(DEFAULT_PROVIDER.to_owned()));
    brokkr_servicebinding::validate(&flat).map_err(|e| Unusable::Credentials(e.0))?;
    let secret = BindingSecret::from_credentials(&flat).map_err(|e| Unusable::Credentials(e.0))?;
    let mut data: BTreeMap<String, Vec<u8>> = secret
        .entries
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
    for (index, transform) in transforms.iter().enumerate() {
        apply(&mut data, transform, Some(&original), other_secret)
            .map_err(|message| Unusable::Transform { index, message })?;
    }
    Ok(Contents {
        secret_type: secret.secret_type,
        data,
    })
}

/// What can be known of `transforms` before there are credentials: each sets exactly one
/// action, its values decode, its JSONPath parses and the Secrets it copies from (in
/// `other_secret`) exist. Checked before a bind, so that a binding whose Secret could never be
/// written does not bind (and unbind) again and again.
pub fn precheck(
    transforms: &[SecretTransform],
    other_secret: &BTreeMap<String, BTreeMap<String, Vec<u8>>>,
) -> Result<(), Unusable> {
    let mut data = BTreeMap::new();
    for (index, transform) in transforms.iter().enumerate() {
        apply(&mut data, transform, None, other_secret)
            .map_err(|message| Unusable::Transform { index, message })?;
    }
    Ok(())
}

/// Applies `transform` to `data`; with no `credentials` yet, a JSONPath is only parsed.
fn apply(
    data: &mut BTreeMap<String, Vec<u8>>,
    transform: &SecretTransform,
    credentials: Option<&Value>,
    other_secret: &BTreeMap<String, BTreeMap<String, Vec<u8>>>,
) -> Result<(), String> {
    let set = [
        transform.rename_key.is_some(),
        transform.add_key.is_some(),
        transform.add_keys_from.is_some(),
        transform.remove_key.is_some(),
    ];
    if set.iter().filter(|s| **s).count() != 1 {
        return Err(
            "exactly one of renameKey, addKey, addKeysFrom and removeKey must be set".into(),
        );
    }
    if let Some(rename) = &transform.rename_key {
        if let Some(value) = data.remove(&rename.from) {
            data.insert(rename.to.clone(), value);
        }
    } else if let Some(add) = &transform.add_key {
        let value = match (&add.value, &add.string_value, &add.json_path_expression) {
            (Some(b64), None, None) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| format!("addKey {:?}: value is not base64", add.key))?,
            (None, Some(text), None) => text.clone().into_bytes(),
            (None, None, Some(path)) => match credentials {
                Some(credentials) => json_path(credentials, path)
                    .ok_or_else(|| {
                        format!(
                            "addKey {:?}: {path:?} matches nothing in the credentials",
                            add.key
                        )
                    })?
                    .into_bytes(),
                None if Value::Null.query(&query(path)).is_ok() => Vec::new(),
                None => {
                    return Err(format!(
                        "addKey {:?}: {path:?} is not a JSONPath expression",
                        add.key
                    ));
                }
            },
            _ => {
                return Err(format!(
                    "addKey {:?}: exactly one of value, stringValue and jsonPathExpression must be set",
                    add.key
                ));
            }
        };
        data.insert(add.key.clone(), value);
    } else if let Some(from) = &transform.add_keys_from {
        let Some(reference) = &from.secret_ref else {
            return Err("addKeysFrom names no secretRef".into());
        };
        let Some(entries) = other_secret.get(&reference.name) else {
            return Err(format!("Secret {:?} does not exist", reference.name));
        };
        data.extend(entries.iter().map(|(k, v)| (k.clone(), v.clone())));
    } else if let Some(remove) = &transform.remove_key {
        data.remove(&remove.key);
    }
    Ok(())
}

/// The value at `path` in `credentials` as text: a string as it is, anything else as JSON. The
/// Service Catalog's `{.a.b}` form and JSONPath's `$.a.b` are both accepted.
fn json_path(credentials: &Value, path: &str) -> Option<String> {
    let found = credentials.query(&query(path)).ok()?;
    found.first().map(|v| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// `path` in either accepted form as a JSONPath query (`$…`).
fn query(path: &str) -> String {
    let trimmed = path.trim();
    let inner = trimmed
        .strip_prefix('{')
        .and_then(|p| p.strip_suffix('}'))
        .unwrap_or(trimmed);
    if inner.starts_with('$') {
        inner.to_owned()
    } else {
        format!(
            "${}",
            if inner.starts_with('.') || inner.starts_with('[') {
                inner.to_owned()
            } else {
                format!(".{inner}")
            }
        )
    }
}

/// The Secret a binding names: `spec.secretName`, else the binding's name.
pub fn name(binding: &ServiceBinding) -> String {
    binding
        .spec
        .secret_name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| binding.name_any())
}

/// Whether `binding` is `secret`'s controller.
pub fn controlled_by(secret: &impl Resource, binding: &ServiceBinding) -> bool {
    let uid = binding.uid();
    secret
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
}

/// What [`write()`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Written {
    /// The Secret holds the contents.
    Done,
    /// A Secret of that name exists and is not this binding's.
    NotOwned,
}

/// Creates or replaces the binding's Secret `name` with `contents`; a Secret the binding does
/// not control is left as it is. An `immutable` Secret (a rotation's) is never changed in place:
/// different contents replace it with a new one. `seen` says whether the Secrets' cache holds
/// one of that name: when it does not, the Secret is created without reading it first (and
/// read only if it exists after all).
pub async fn write(
    secrets: &Api<Secret>,
    binding: &ServiceBinding,
    name: &str,
    contents: Contents,
    immutable: bool,
    seen: bool,
) -> Result<Written, kube::Error> {
    let mut labels = BTreeMap::new();
    labels.insert(
        BINDING_LABEL.to_owned(),
        crate::names::label_value(&binding.name_any()),
    );
    let mut desired = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: binding.namespace(),
            labels: Some(labels),
            owner_references: binding.controller_owner_ref(&()).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        type_: Some(contents.secret_type.clone()),
        data: Some(
            contents
                .data
                .into_iter()
                .map(|(k, v)| (k, ByteString(v)))
                .collect(),
        ),
        immutable: immutable.then_some(true),
        ..Secret::default()
    };
    if !seen {
        match secrets.create(&PostParams::default(), &desired).await {
            Ok(_) => return Ok(Written::Done),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    let existing = secrets.get_opt(name).await?;
    if let Some(existing) = &existing
        && !controlled_by(existing, binding)
    {
        return Ok(Written::NotOwned);
    }
    desired.metadata.resource_version = existing.as_ref().and_then(|s| s.resource_version());
    match existing {
        None => {
            secrets.create(&PostParams::default(), &desired).await?;
        }
        Some(existing)
            if existing.type_ == desired.type_
                && existing.data == desired.data
                && existing.labels() == desired.labels()
                && existing.immutable == desired.immutable => {}
        // A Secret's type cannot change, nor an immutable one's data: a new Secret replaces it.
        Some(existing)
            if existing.type_ != desired.type_
                || existing.immutable == Some(true)
                || desired.immutable == Some(true) =>
        {
            secrets.delete(name, &DeleteParams::default()).await?;
            let fresh = Secret {
                metadata: ObjectMeta {
                    resource_version: None,
                    ..desired.metadata
                },
                ..desired
            };
            secrets.create(&PostParams::default(), &fresh).await?;
        }
        Some(_) => {
            secrets
                .replace(name, &PostParams::default(), &desired)
                .await?;
        }
    }
    Ok(Written::Done)
}

/// Deletes the binding's Secret `name` if the binding controls it, as `cached` (the Secrets'
/// cache) shows it. One the cache has not seen (written an instant ago) goes with the binding
/// anyway: it is owned by it, and the garbage collector deletes it.
pub async fn delete(
    secrets: &Api<Secret>,
    binding: &ServiceBinding,
    name: &str,
    cached: Option<&PartialObjectMeta<Secret>>,
) -> Result<(), kube::Error> {
    if cached.is_some_and(|secret| controlled_by(secret, binding)) {
        match secrets.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{
        AddKeyTransform, AddKeysFromTransform, ObjectReference, RemoveKeyTransform,
        RenameKeyTransform,
    };
    use serde_json::json;

    fn credentials(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    fn text(contents: &Contents, key: &str) -> Option<String> {
        contents
            .data
            .get(key)
            .map(|v| String::from_utf8(v.clone()).unwrap())
    }

    #[test]
    fn credentials_become_a_servicebinding_secret_with_nested_values_as_json() {
        let c = contents(
            credentials(json!({"type": "postgresql", "host": "db", "port": 5432,
                "tls": {"ca": "PEM"}, "hosts": ["a", "b"]})),
            "ignored",
            &[],
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(c.secret_type, "servicebinding.io/postgresql");
        assert_eq!(text(&c, "provider").as_deref(), Some("brokkr"));
        assert_eq!(text(&c, "port").as_deref(), Some("5432"));
        assert_eq!(text(&c, "tls").as_deref(), Some(r#"{"ca":"PEM"}"#));
        assert_eq!(text(&c, "hosts").as_deref(), Some(r#"["a","b"]"#));
    }

    #[test]
    fn a_broker_that_sends_no_type_gets_the_class_name_and_keeps_its_provider() {
        let c = contents(
            credentials(json!({"uri": "redis://cache:6379", "provider": "acme"})),
            "redis",
            &[],
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(c.secret_type, "servicebinding.io/redis");
        assert_eq!(text(&c, "provider").as_deref(), Some("acme"));
    }

    #[test]
    fn invalid_well_known_entries_are_refused_without_their_values() {
        let err = contents(
            credentials(json!({"type": "mysql", "port": 99999, "password": "hunter2"})),
            "mysql",
            &[],
            &BTreeMap::new(),
        )
        .unwrap_err();
        let message = err.to_string();
        assert!(message.contains("port"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        let err = contents(
            credentials(json!({"type": "x", "bad/key": "v"})),
            "x",
            &[],
            &BTreeMap::new(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("bad/key"), "{err}");
    }

    #[test]
    fn transforms_apply_in_order() {
        let mut others = BTreeMap::new();
        others.insert(
            "extra".to_owned(),
            BTreeMap::from([("region".to_owned(), b"eu".to_vec())]),
        );
        let transforms = vec![
            SecretTransform {
                rename_key: Some(RenameKeyTransform {
                    from: "username".into(),
                    to: "user".into(),
                }),
                ..Default::default()
            },
            SecretTransform {
                add_key: Some(AddKeyTransform {
                    key: "DB_HOST".into(),
                    json_path_expression: Some("{.host}".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            SecretTransform {
                add_key: Some(AddKeyTransform {
                    key: "mode".into(),
                    string_value: Some("rw".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            SecretTransform {
                add_key: Some(AddKeyTransform {
                    key: "raw".into(),
                    value: Some("aGk=".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            SecretTransform {
                add_keys_from: Some(AddKeysFromTransform {
                    secret_ref: Some(ObjectReference {
                        namespace: None,
                        name: "extra".into(),
                    }),
                }),
                ..Default::default()
            },
            SecretTransform {
                remove_key: Some(RemoveKeyTransform { key: "host".into() }),
                ..Default::default()
            },
        ];
        let c = contents(
            credentials(json!({"type": "postgresql", "host": "db", "username": "u"})),
            "postgresql",
            &transforms,
            &others,
        )
        .unwrap();
        let keys: Vec<&str> = c.data.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "DB_HOST", "mode", "provider", "raw", "region", "type", "user"
            ]
        );
        assert_eq!(text(&c, "DB_HOST").as_deref(), Some("db"));
        assert_eq!(text(&c, "raw").as_deref(), Some("hi"));
        assert_eq!(crate::resources::transform_sources(&transforms), ["extra"]);
    }

    #[test]
    fn a_transform_with_two_actions_or_a_path_that_matches_nothing_is_refused() {
        let both = SecretTransform {
            rename_key: Some(RenameKeyTransform {
                from: "a".into(),
                to: "b".into(),
            }),
            remove_key: Some(RemoveKeyTransform { key: "c".into() }),
            ..Default::default()
        };
        let creds = credentials(json!({"type": "t"}));
        let err = contents(creds.clone(), "t", &[both], &BTreeMap::new()).unwrap_err();
        assert!(
            err.to_string().starts_with("spec.secretTransforms[0]"),
            "{err}"
        );
        let nothing = SecretTransform {
            add_key: Some(AddKeyTransform {
                key: "k".into(),
                json_path_expression: Some("$.missing".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(contents(creds, "t", &[nothing], &BTreeMap::new()).is_err());
    }
}
