//! ServiceInstance: one provisioned service, asked for by an application team in its namespace.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::maintenance::InstanceMaintenance;
use super::shared::{Condition, LocalObjectReference, ParametersFromSource, UserInfo, free_form};

/// The spec of a [`ServiceInstance`]. The class and plan are named one way: by external name
/// (`clusterServiceClassExternalName` + `clusterServicePlanExternalName`, or the namespaced
/// `serviceClass…`/`servicePlan…`), by external id, or by resource name.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "services.brokkr.dev",
    version = "v1alpha1",
    kind = "ServiceInstance",
    namespaced,
    status = "ServiceInstanceStatus",
    shortname = "si",
    category = "servicecatalog",
    doc = "A provisioned service of a broker's catalog.",
    printcolumn(
        name = "Class",
        type_ = "string",
        json_path = ".status.userSpecifiedClassName"
    ),
    printcolumn(
        name = "Plan",
        type_ = "string",
        json_path = ".status.userSpecifiedPlanName"
    ),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".status.externalProperties.maintenanceInfoVersion"
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
    {"rule": "has(self.clusterServiceClassExternalName) == has(oldSelf.clusterServiceClassExternalName) && (!has(self.clusterServiceClassExternalName) || self.clusterServiceClassExternalName == oldSelf.clusterServiceClassExternalName)", "message": "clusterServiceClassExternalName is immutable"},
    {"rule": "has(self.clusterServiceClassExternalID) == has(oldSelf.clusterServiceClassExternalID) && (!has(self.clusterServiceClassExternalID) || self.clusterServiceClassExternalID == oldSelf.clusterServiceClassExternalID)", "message": "clusterServiceClassExternalID is immutable"},
    {"rule": "has(self.clusterServiceClassName) == has(oldSelf.clusterServiceClassName) && (!has(self.clusterServiceClassName) || self.clusterServiceClassName == oldSelf.clusterServiceClassName)", "message": "clusterServiceClassName is immutable"},
    {"rule": "has(self.serviceClassExternalName) == has(oldSelf.serviceClassExternalName) && (!has(self.serviceClassExternalName) || self.serviceClassExternalName == oldSelf.serviceClassExternalName)", "message": "serviceClassExternalName is immutable"},
    {"rule": "has(self.serviceClassExternalID) == has(oldSelf.serviceClassExternalID) && (!has(self.serviceClassExternalID) || self.serviceClassExternalID == oldSelf.serviceClassExternalID)", "message": "serviceClassExternalID is immutable"},
    {"rule": "has(self.serviceClassName) == has(oldSelf.serviceClassName) && (!has(self.serviceClassName) || self.serviceClassName == oldSelf.serviceClassName)", "message": "serviceClassName is immutable"}
]))]
pub struct ServiceInstanceSpec {
    /// The ClusterServiceClass by its catalog name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_service_class_external_name: Option<String>,
    /// The ClusterServicePlan by its catalog name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_service_plan_external_name: Option<String>,
    /// The ClusterServiceClass by its catalog id.
    #[serde(
        default,
        rename = "clusterServiceClassExternalID",
        skip_serializing_if = "Option::is_none"
    )]
    pub cluster_service_class_external_id: Option<String>,
    /// The ClusterServicePlan by its catalog id.
    #[serde(
        default,
        rename = "clusterServicePlanExternalID",
        skip_serializing_if = "Option::is_none"
    )]
    pub cluster_service_plan_external_id: Option<String>,
    /// The ClusterServiceClass by resource name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_service_class_name: Option<String>,
    /// The ClusterServicePlan by resource name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_service_plan_name: Option<String>,
    /// The ServiceClass by its catalog name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_class_external_name: Option<String>,
    /// The ServicePlan by its catalog name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_plan_external_name: Option<String>,
    /// The ServiceClass by its catalog id.
    #[serde(
        default,
        rename = "serviceClassExternalID",
        skip_serializing_if = "Option::is_none"
    )]
    pub service_class_external_id: Option<String>,
    /// The ServicePlan by its catalog id.
    #[serde(
        default,
        rename = "servicePlanExternalID",
        skip_serializing_if = "Option::is_none"
    )]
    pub service_plan_external_id: Option<String>,
    /// The ServiceClass by resource name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_class_name: Option<String>,
    /// The ServicePlan by resource name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_plan_name: Option<String>,
    /// The ClusterServiceClass resolved (set by the controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_service_class_ref: Option<LocalObjectReference>,
    /// The ClusterServicePlan resolved (set by the controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_service_plan_ref: Option<LocalObjectReference>,
    /// The ServiceClass resolved (set by the controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_class_ref: Option<LocalObjectReference>,
    /// The ServicePlan resolved (set by the controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_plan_ref: Option<LocalObjectReference>,
    /// Parameters for the broker: a JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub parameters: Option<Value>,
    /// More parameters, from Secrets; a change to one of them updates the instance.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameters_from: Vec<ParametersFromSource>,
    /// The OSB instance id (default: the resource's uid). Immutable; letters, digits and
    /// `-._~`, not starting with a dot.
    #[serde(
        default,
        rename = "externalID",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(extend("pattern" = super::shared::EXTERNAL_ID_PATTERN, "maxLength" = super::shared::EXTERNAL_ID_MAX_LEN))]
    pub external_id: Option<String>,
    /// Raising this number sends an update with the same spec.
    #[serde(default)]
    pub update_requests: i64,
    /// Upgrades to the plan's maintenance versions: one version now, or automatically within a
    /// window. Without it the instance stays at the version it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<InstanceMaintenance>,
    /// Who last changed the spec; forwarded to the broker only while the API server checks it
    /// (the `brokkr-user-info` ValidatingAdmissionPolicy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_info: Option<UserInfo>,
}

/// What the controller last saw of an instance.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceInstanceStatus {
    /// `Ready` and `Failed`, with reasons.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The OSB instance id the broker was first called with; the controller never calls the
    /// broker with another.
    #[serde(
        default,
        rename = "externalID",
        skip_serializing_if = "Option::is_none"
    )]
    pub external_id: Option<String>,
    /// The OSB service id of the class the instance was provisioned from; the class cannot
    /// change after that.
    #[serde(
        default,
        rename = "serviceClassExternalID",
        skip_serializing_if = "Option::is_none"
    )]
    pub service_class_external_id: Option<String>,
    /// The class as the user named it, e.g. `ClusterServiceClass/postgresql`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_specified_class_name: Option<String>,
    /// The plan as the user named it, e.g. `ClusterServicePlan/small`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_specified_plan_name: Option<String>,
    /// The reason of the last condition that changed (`Provisioned`, `ProvisionCallFailed`…), for `kubectl get`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_condition_state: String,
    /// Whether an asynchronous operation is being polled.
    #[serde(default)]
    pub async_op_in_progress: bool,
    /// Whether a failed provision is being cleaned up with deprovision calls.
    #[serde(default)]
    pub orphan_mitigation_in_progress: bool,
    /// The `operation` the broker returned for the operation in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_operation: Option<String>,
    /// The dashboard the broker returned.
    #[serde(
        default,
        rename = "dashboardURL",
        skip_serializing_if = "Option::is_none"
    )]
    pub dashboard_url: Option<String>,
    /// The operation in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_operation: Option<ServiceInstanceOperation>,
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
    pub in_progress_properties: Option<ServiceInstancePropertiesState>,
    /// What the broker last accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_properties: Option<ServiceInstancePropertiesState>,
    /// Whether the broker has the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provision_status: Option<ProvisionStatus>,
    /// Whether deleting the resource needs a deprovision call, and how it went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprovision_status: Option<DeprovisionStatus>,
    /// The class's and plan's default parameters merged, as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub default_provision_parameters: Option<Value>,
}

/// The plan and parameters of one request. Values from Secrets are never kept: `parameters`
/// shows them as `<redacted>`, and the checksum covers them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceInstancePropertiesState {
    /// The ClusterServicePlan's catalog name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_service_plan_external_name: Option<String>,
    /// The ClusterServicePlan's catalog id.
    #[serde(
        default,
        rename = "clusterServicePlanExternalID",
        skip_serializing_if = "Option::is_none"
    )]
    pub cluster_service_plan_external_id: Option<String>,
    /// The ServicePlan's catalog name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_plan_external_name: Option<String>,
    /// The ServicePlan's catalog id.
    #[serde(
        default,
        rename = "servicePlanExternalID",
        skip_serializing_if = "Option::is_none"
    )]
    pub service_plan_external_id: Option<String>,
    /// The parameters, Secret values redacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub parameters: Option<Value>,
    /// SHA-256 of the parameters as sent, Secret values included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameter_checksum: Option<String>,
    /// The plan's maintenance version sent (at provision, or by an upgrade).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_info_version: Option<String>,
    /// Who asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_info: Option<UserInfo>,
}

/// An operation on an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ServiceInstanceOperation {
    /// Creating it.
    Provision,
    /// Changing its plan or parameters.
    Update,
    /// Deleting it.
    Deprovision,
}

/// Whether the broker has the instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ProvisionStatus {
    /// It does.
    Provisioned,
    /// It does not (yet, or any more).
    NotProvisioned,
}

/// Whether deleting needs a broker call, and how it went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DeprovisionStatus {
    /// Nothing was provisioned.
    NotRequired,
    /// A deprovision call is needed.
    Required,
    /// The broker deprovisioned it.
    Succeeded,
    /// The broker failed to deprovision it.
    Failed,
}
