//! What the resources share: the group, references to other objects, conditions, the
//! `parametersFrom` sources, the originating user, OSB ids and free-form fields.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of every brokkr service resource.
pub const GROUP: &str = "services.brokkr.dev";
/// The API version of every brokkr service resource.
pub const VERSION: &str = "v1alpha1";

/// What an OSB instance or binding id given in `spec.externalID` may be: RFC 3986 unreserved
/// characters, so that it is one path segment of the OSB API as written, and not `.` or `..`
/// (nor anything else starting with a dot).
pub const EXTERNAL_ID_PATTERN: &str = "^[A-Za-z0-9_~-][A-Za-z0-9._~-]*$";
/// The longest `spec.externalID`.
pub const EXTERNAL_ID_MAX_LEN: usize = 255;

/// Whether `id` may be an OSB instance or binding id given in `spec.externalID`
/// ([`EXTERNAL_ID_PATTERN`], at most [`EXTERNAL_ID_MAX_LEN`] bytes). The API server checks it
/// too; this holds where an older CRD without the pattern is installed.
pub fn valid_external_id(id: &str) -> bool {
    let mut chars = id.chars();
    let unreserved = |c: char| c.is_ascii_alphanumeric() || "-._~".contains(c);
    id.len() <= EXTERNAL_ID_MAX_LEN
        && chars.next().is_some_and(|c| c != '.' && unreserved(c))
        && chars.all(unreserved)
}

/// One observation about a resource, as the Service Catalog writes them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// What the condition is about: `Ready`, `Failed`, …
    #[serde(rename = "type")]
    pub type_: String,
    /// Whether it holds.
    pub status: ConditionStatus,
    /// When `status` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// A machine-readable, CamelCase reason for the last transition.
    #[serde(default)]
    pub reason: String,
    /// A human-readable explanation.
    #[serde(default)]
    pub message: String,
}

/// Whether a [`Condition`] holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    /// It holds.
    True,
    /// It does not hold.
    False,
    /// Not known yet.
    #[default]
    Unknown,
}

/// A reference to an object by name: in the same namespace, or a cluster-scoped one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LocalObjectReference {
    /// The object's name.
    pub name: String,
}

/// A reference to an object by namespace and name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ObjectReference {
    /// The object's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
}

/// One key of a Secret in the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SecretKeyReference {
    /// The Secret's name.
    pub name: String,
    /// The key whose value is a JSON object of parameters.
    pub key: String,
}

/// Where more parameters come from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParametersFromSource {
    /// A Secret key holding a JSON object; its top-level keys must not repeat `parameters`'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<SecretKeyReference>,
}

/// The names of the Secrets that `sources` take parameters from.
pub fn parameter_secrets(sources: &[ParametersFromSource]) -> impl Iterator<Item = &str> {
    sources
        .iter()
        .filter_map(|p| p.secret_key_ref.as_ref())
        .map(|r| r.name.as_str())
}

/// The Kubernetes user who asked for a change, as the platform tells the broker.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UserInfo {
    /// The user's name.
    pub username: String,
    /// The user's uid.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// The user's groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Further attributes of the user.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// The schema of a free-form JSON value: any object, kept as it is.
pub(crate) fn free_form(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}
