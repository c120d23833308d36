//! ClusterServiceClass / ClusterServicePlan and ServiceClass / ServicePlan: a broker's catalog as
//! resources, written by the broker controller and read by instances.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::maintenance::PlanMaintenanceInfo;
use super::shared::{LocalObjectReference, free_form};

/// A service offering as the broker's catalog describes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommonServiceClassSpec {
    /// The offering's name in the catalog (`name`).
    pub external_name: String,
    /// The offering's id in the catalog (`id`).
    #[serde(rename = "externalID")]
    pub external_id: String,
    /// Short description.
    #[serde(default)]
    pub description: String,
    /// Whether instances can be bound (plans may override).
    #[serde(default)]
    pub bindable: bool,
    /// Whether the broker serves `GET` on bindings.
    #[serde(default)]
    pub binding_retrievable: bool,
    /// Whether the broker serves `GET` on instances (`instances_retrievable`).
    #[serde(default)]
    pub instances_retrievable: bool,
    /// Whether an instance's plan may change.
    #[serde(default)]
    pub plan_updatable: bool,
    /// The catalog's `metadata`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub external_metadata: Option<Value>,
    /// Classification tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Permissions the service needs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requires: Vec<String>,
    /// Parameters every instance of this class starts from (set by an administrator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub default_provision_parameters: Option<Value>,
}

/// A plan as the broker's catalog describes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommonServicePlanSpec {
    /// The plan's name in the catalog (`name`).
    pub external_name: String,
    /// The plan's id in the catalog (`id`).
    #[serde(rename = "externalID")]
    pub external_id: String,
    /// Short description.
    #[serde(default)]
    pub description: String,
    /// Overrides the class's `bindable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bindable: Option<bool>,
    /// Whether the plan is free.
    #[serde(default = "yes")]
    pub free: bool,
    /// The catalog's `metadata`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub external_metadata: Option<Value>,
    /// JSON Schema of a provision's parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub instance_create_parameter_schema: Option<Value>,
    /// JSON Schema of an update's parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub instance_update_parameter_schema: Option<Value>,
    /// JSON Schema of a bind's parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub service_binding_create_parameter_schema: Option<Value>,
    /// JSON Schema of a bind's response (OSB has no field for it; kept for ported manifests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub service_binding_create_response_schema: Option<Value>,
    /// Parameters every instance of this plan starts from (set by an administrator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form")]
    pub default_provision_parameters: Option<Value>,
    /// brokkr: the catalog's `maximum_polling_duration` in seconds, how long to poll an
    /// operation of this plan before it counts as failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum_polling_duration: Option<u64>,
    /// The catalog's `binding_rotatable`: whether a binding may be rotated (bound again with
    /// `predecessor_binding_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding_rotatable: Option<bool>,
    /// The catalog's `maintenance_info`: the version the plan's instances are upgraded to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_info: Option<PlanMaintenanceInfo>,
}

fn yes() -> bool {
    true
}

impl CommonServiceClassSpec {
    /// Drops what no reconcile reads — the description, the catalog's `metadata`, tags,
    /// `requires` and `defaultProvisionParameters` — keeping the names, ids and flags that
    /// instances and bindings are resolved and called with: what the watch caches keep.
    pub fn keep_what_reconciles_read(&mut self) {
        self.description = String::new();
        self.external_metadata = None;
        self.tags = Vec::new();
        self.requires = Vec::new();
        self.default_provision_parameters = None;
    }
}

impl CommonServicePlanSpec {
    /// Drops what no reconcile reads — the description, the catalog's `metadata`, the
    /// parameter schemas and `defaultProvisionParameters`, most of a plan's size — keeping the
    /// names, ids, `bindable`, `free`, `maximumPollingDuration`, `bindingRotatable` and
    /// `maintenanceInfo`: what the watch caches keep.
    pub fn keep_what_reconciles_read(&mut self) {
        self.description = String::new();
        self.external_metadata = None;
        self.instance_create_parameter_schema = None;
        self.instance_update_parameter_schema = None;
        self.service_binding_create_parameter_schema = None;
        self.service_binding_create_response_schema = None;
        self.default_provision_parameters = None;
    }
}

/// The spec of a [`ClusterServiceClass`].
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "services.brokkr.dev",
    version = "v1alpha1",
    kind = "ClusterServiceClass",
    status = "ServiceClassStatus",
    shortname = "csc",
    category = "servicecatalog",
    doc = "A service offering of a ClusterServiceBroker's catalog.",
    printcolumn(
        name = "External-Name",
        type_ = "string",
        json_path = ".spec.externalName"
    ),
    printcolumn(
        name = "Broker",
        type_ = "string",
        json_path = ".spec.clusterServiceBrokerName"
    ),
    printcolumn(
        name = "Removed",
        type_ = "boolean",
        json_path = ".status.removedFromBrokerCatalog"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterServiceClassSpec {
    /// The ClusterServiceBroker whose catalog lists it.
    pub cluster_service_broker_name: String,
    /// The offering.
    #[serde(flatten)]
    pub common: CommonServiceClassSpec,
}

/// The spec of a [`ServiceClass`].
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "services.brokkr.dev",
    version = "v1alpha1",
    kind = "ServiceClass",
    namespaced,
    status = "ServiceClassStatus",
    shortname = "svcclass",
    category = "servicecatalog",
    doc = "A service offering of a ServiceBroker's catalog.",
    printcolumn(
        name = "External-Name",
        type_ = "string",
        json_path = ".spec.externalName"
    ),
    printcolumn(
        name = "Broker",
        type_ = "string",
        json_path = ".spec.serviceBrokerName"
    ),
    printcolumn(
        name = "Removed",
        type_ = "boolean",
        json_path = ".status.removedFromBrokerCatalog"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceClassSpec {
    /// The ServiceBroker whose catalog lists it.
    pub service_broker_name: String,
    /// The offering.
    #[serde(flatten)]
    pub common: CommonServiceClassSpec,
}

/// Whether a class is still in its broker's catalog.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceClassStatus {
    /// The broker's catalog no longer lists it; existing instances keep it.
    #[serde(default)]
    pub removed_from_broker_catalog: bool,
}

/// The spec of a [`ClusterServicePlan`].
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "services.brokkr.dev",
    version = "v1alpha1",
    kind = "ClusterServicePlan",
    status = "ServicePlanStatus",
    shortname = "csp",
    category = "servicecatalog",
    doc = "A plan of a ClusterServiceBroker's catalog.",
    printcolumn(
        name = "External-Name",
        type_ = "string",
        json_path = ".spec.externalName"
    ),
    printcolumn(
        name = "Broker",
        type_ = "string",
        json_path = ".spec.clusterServiceBrokerName"
    ),
    printcolumn(
        name = "Class",
        type_ = "string",
        json_path = ".spec.clusterServiceClassRef.name"
    ),
    printcolumn(
        name = "Removed",
        type_ = "boolean",
        json_path = ".status.removedFromBrokerCatalog"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterServicePlanSpec {
    /// The ClusterServiceBroker whose catalog lists it.
    pub cluster_service_broker_name: String,
    /// The ClusterServiceClass it belongs to.
    pub cluster_service_class_ref: LocalObjectReference,
    /// The plan.
    #[serde(flatten)]
    pub common: CommonServicePlanSpec,
}

/// The spec of a [`ServicePlan`].
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "services.brokkr.dev",
    version = "v1alpha1",
    kind = "ServicePlan",
    namespaced,
    status = "ServicePlanStatus",
    shortname = "svcplan",
    category = "servicecatalog",
    doc = "A plan of a ServiceBroker's catalog.",
    printcolumn(
        name = "External-Name",
        type_ = "string",
        json_path = ".spec.externalName"
    ),
    printcolumn(
        name = "Broker",
        type_ = "string",
        json_path = ".spec.serviceBrokerName"
    ),
    printcolumn(
        name = "Class",
        type_ = "string",
        json_path = ".spec.serviceClassRef.name"
    ),
    printcolumn(
        name = "Removed",
        type_ = "boolean",
        json_path = ".status.removedFromBrokerCatalog"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ServicePlanSpec {
    /// The ServiceBroker whose catalog lists it.
    pub service_broker_name: String,
    /// The ServiceClass it belongs to.
    pub service_class_ref: LocalObjectReference,
    /// The plan.
    #[serde(flatten)]
    pub common: CommonServicePlanSpec,
}

/// Whether a plan is still in its broker's catalog.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServicePlanStatus {
    /// The broker's catalog no longer lists it; existing instances keep it.
    #[serde(default)]
    pub removed_from_broker_catalog: bool,
}
