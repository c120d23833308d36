//! ServiceBinding: credentials for one instance, delivered as a servicebinding.io Secret.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::shared::{
    Condition, LocalObjectReference, ObjectReference, ParametersFromSource, UserInfo, free_form,
};

/// The spec of a [`ServiceBinding`].
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "services.brokkr.dev",
    version = "v1alpha1",
    kind = "ServiceBinding",
    namespaced,
    status = "ServiceBindingStatus",
    shortname = "sbd",
    category = "servicecatalog",
    doc = "Credentials for a ServiceInstance of the same namespace, in a Secret of type servicebinding.io/<type>.",
    printcolumn(
        name = "Service-Instance",
        type_ = "string",
        json_path = ".spec.instanceRef.name"
    ),
    printcolumn(
        name = "Secret-Name",
        type_ = "string",
        json_path = ".status.binding.name"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.lastConditionState"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.externalID) == has(oldSelf.externalID) && (!has(self.externalID) || self.externalID == oldSelf.externalID)", "message": "externalID is immutable"},
    {"rule": "self.instanceRef == oldSelf.instanceRef", "message": "instanceRef is immutable"}
]))]
pub struct ServiceBindingSpec {
    /// The ServiceInstance to bind, in the binding's namespace.
    pub instance_ref: LocalObjectReference,
    /// Parameters for the broker: a JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub parameters: Option<Value>,
    /// More parameters, from Secrets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameters_from: Vec<ParametersFromSource>,
    /// The Secret to write the credentials to (default: the binding's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// Changes to the credentials before they are written, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_transforms: Vec<SecretTransform>,
    /// The OSB binding id (default: the resource's uid). Immutable; letters, digits and `-._~`,
    /// not starting with a dot.
    #[serde(
        default,
        rename = "externalID",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(extend("pattern" = super::shared::EXTERNAL_ID_PATTERN, "maxLength" = super::shared::EXTERNAL_ID_MAX_LEN))]
    pub external_id: Option<String>,
    /// Who last changed the spec; forwarded to the broker only while the API server checks it
    /// (the `brokkr-user-info` ValidatingAdmissionPolicy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_info: Option<UserInfo>,
    /// After a rotation, how long the predecessor's credentials keep working before it is
    /// unbound, in seconds (default 300): long enough for the workloads to roll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub rotation_grace_period_seconds: Option<u64>,
}

/// One change to the credentials; exactly one field is set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretTransform {
    /// Renames a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rename_key: Option<RenameKeyTransform>,
    /// Adds a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_key: Option<AddKeyTransform>,
    /// Adds every key of another Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_keys_from: Option<AddKeysFromTransform>,
    /// Removes a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remove_key: Option<RemoveKeyTransform>,
}

/// Renames `from` to `to`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RenameKeyTransform {
    /// The key to rename.
    pub from: String,
    /// Its new name.
    pub to: String,
}

/// Adds `key` with one of: `value` (base64 bytes), `stringValue`, or `jsonPathExpression`
/// (evaluated on the credentials).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddKeyTransform {
    /// The key to add.
    pub key: String,
    /// Its value, base64-encoded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "byte"))]
    pub value: Option<String>,
    /// Its value as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string_value: Option<String>,
    /// A JSONPath into the credentials whose result is its value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_path_expression: Option<String>,
}

/// Adds every key of the Secret `secretRef`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddKeysFromTransform {
    /// The Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<ObjectReference>,
}

/// Removes `key`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RemoveKeyTransform {
    /// The key to remove.
    pub key: String,
}

/// What the controller last saw of a binding.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceBindingStatus {
    /// `Ready` and `Failed`, with reasons.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The reason of the last condition that changed, for `kubectl get`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_condition_state: String,
    /// The OSB binding id the broker was first called with; the controller never calls the
    /// broker with another.
    #[serde(
        default,
        rename = "externalID",
        skip_serializing_if = "Option::is_none"
    )]
    pub external_id: Option<String>,
    /// The ServiceInstance the binding was first bound to, and its OSB instance id then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<BoundInstance>,
    /// Whether an asynchronous operation is being polled.
    #[serde(default)]
    pub async_op_in_progress: bool,
    /// The `operation` the broker returned for the operation in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<String>,
    /// The operation in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_operation: Option<ServiceBindingOperation>,
    /// The generation the broker last succeeded for.
    #[serde(default)]
    pub reconciled_generation: i64,
    /// The generation the status describes.
    #[serde(default)]
    pub observed_generation: i64,
    /// When the operation in progress started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_start_time: Option<Time>,
    /// What the operation in progress sends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_progress_properties: Option<ServiceBindingPropertiesState>,
    /// What the broker last accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_properties: Option<ServiceBindingPropertiesState>,
    /// Whether a failed bind is being cleaned up with unbind calls.
    #[serde(default)]
    pub orphan_mitigation_in_progress: bool,
    /// Whether deleting needs an unbind call, and how it went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unbind_status: Option<UnbindStatus>,
    /// The Secret with the credentials (servicebinding.io Provisioned Service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<LocalObjectReference>,
    /// The OSB binding whose credentials are in `binding` now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_binding: Option<CurrentBinding>,
    /// The binding a rotation is binding now, recorded before the bind call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub successor_binding: Option<RotatingBinding>,
    /// The binding on its way out: the predecessor of the current one, unbound once its grace
    /// period ends (or a successor whose credentials could not be used, unbound at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_binding: Option<RotatingBinding>,
    /// When the credentials were last rotated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rotation_time: Option<Time>,
    /// When the credentials rotate by themselves: the broker's `renew_before`, else its
    /// `expires_at`; absent when the broker gives neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_rotation_time: Option<Time>,
    /// When the broker says the current credentials expire (`expires_at`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
    /// The value of the `services.brokkr.dev/rotate` annotation last acted on: a different
    /// value asks for a rotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotate_request: Option<String>,
}

/// The OSB binding whose credentials a ServiceBinding's Secret holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CurrentBinding {
    /// Its OSB binding id.
    #[serde(rename = "externalID")]
    pub external_id: String,
    /// The Secret with its credentials.
    pub secret_name: String,
}

/// An OSB binding of a rotation other than the current one: a successor being bound, or a
/// predecessor being unbound. Absent fields are written as `null` so that a status merge patch
/// removes them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RotatingBinding {
    /// Its OSB binding id.
    #[serde(rename = "externalID")]
    pub external_id: String,
    /// The Secret with its credentials (a successor's, once written).
    pub secret_name: String,
    /// The bind or unbind of it the broker is doing asynchronously.
    #[serde(default)]
    pub current_operation: Option<ServiceBindingOperation>,
    /// The broker's `operation` for it.
    #[serde(default)]
    pub last_operation: Option<String>,
    /// When that operation (or, for a successor, the rotation) started.
    #[serde(default)]
    pub operation_start_time: Option<Time>,
    /// When a predecessor is unbound.
    #[serde(default)]
    pub unbind_after: Option<Time>,
}

/// The instance a binding was bound to, as recorded at the first bind call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BoundInstance {
    /// The ServiceInstance's name, in the binding's namespace.
    pub name: String,
    /// Its OSB instance id.
    #[serde(rename = "externalID")]
    pub external_id: String,
}

/// The parameters of one bind. Values from Secrets are never kept.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceBindingPropertiesState {
    /// The parameters, Secret values redacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub parameters: Option<Value>,
    /// SHA-256 of the parameters as sent, Secret values included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameter_checksum: Option<String>,
    /// Who asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_info: Option<UserInfo>,
}

/// An operation on a binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ServiceBindingOperation {
    /// Creating it.
    Bind,
    /// Deleting it.
    Unbind,
}

/// Whether deleting a binding needs a broker call, and how it went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum UnbindStatus {
    /// Nothing was bound.
    NotRequired,
    /// An unbind call is needed.
    Required,
    /// The broker unbound it.
    Succeeded,
    /// The broker failed to unbind it.
    Failed,
}

/// The names of the Secrets that `transforms` copy keys from (`addKeysFrom`).
pub fn transform_sources(transforms: &[SecretTransform]) -> Vec<String> {
    transforms
        .iter()
        .filter_map(|t| t.add_keys_from.as_ref()?.secret_ref.as_ref())
        .map(|r| r.name.clone())
        .collect()
}
