//! The custom resources of group `services.brokkr.dev`, version `v1alpha1`, with the field names
//! of the Kubernetes Service Catalog's `servicecatalog.k8s.io/v1beta1` API, so that existing
//! manifests port by changing `apiVersion` only.
//!
//! [`UsageKind`] and [`ServiceBindingUsage`] (Kyma's fields) are in the same group;
//! [`servicebinding_io`] has the Service Binding Specification's own resources.
//!
//! Their schemas are generated from these types (kube-derive and schemars) and are structural:
//! free-form fields (`parameters`, JSON schemas, external metadata) keep unknown fields.

// Clippy takes kube-derive's repeated `printcolumn(type_ = …)` for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
mod binding;
#[allow(clippy::duplicated_attributes)]
mod broker;
#[allow(clippy::duplicated_attributes)]
mod catalog;
#[allow(clippy::duplicated_attributes)]
mod instance;
mod maintenance;
pub mod servicebinding_io;
mod shared;
#[allow(clippy::duplicated_attributes)]
mod usage;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt as _;

/// `"true"` on an instance: deleting it first deletes the ServiceBindings that name it.
pub const CASCADE_DELETE_ANNOTATION: &str = "services.brokkr.dev/cascade-delete";
/// `"true"` on an instance being deleted: it goes without a deprovision call, and the broker
/// keeps whatever it provisioned.
pub const ABANDON_ANNOTATION: &str = "services.brokkr.dev/abandon";

pub use binding::{
    AddKeyTransform, AddKeysFromTransform, BoundInstance, CurrentBinding, RemoveKeyTransform,
    RenameKeyTransform, RotatingBinding, SecretTransform, ServiceBinding, ServiceBindingOperation,
    ServiceBindingPropertiesState, ServiceBindingSpec, ServiceBindingStatus, UnbindStatus,
    transform_sources,
};
pub use broker::{
    BasicAuthConfig, BearerTokenAuthConfig, BrokerAuthInfo, ClusterServiceBroker,
    ClusterServiceBrokerSpec, CommonServiceBrokerSpec, RelistBehavior, ServiceBroker,
    ServiceBrokerSpec, ServiceBrokerStatus,
};
pub use catalog::{
    ClusterServiceClass, ClusterServiceClassSpec, ClusterServicePlan, ClusterServicePlanSpec,
    CommonServiceClassSpec, CommonServicePlanSpec, ServiceClass, ServiceClassSpec,
    ServiceClassStatus, ServicePlan, ServicePlanSpec, ServicePlanStatus,
};
pub use instance::{
    DeprovisionStatus, ProvisionStatus, ServiceInstance, ServiceInstanceOperation,
    ServiceInstancePropertiesState, ServiceInstanceSpec, ServiceInstanceStatus,
};
pub use maintenance::{Day, InstanceMaintenance, MaintenanceWindow, PlanMaintenanceInfo};
pub use shared::{
    Condition, ConditionStatus, EXTERNAL_ID_MAX_LEN, EXTERNAL_ID_PATTERN, GROUP,
    LocalObjectReference, ObjectReference, ParametersFromSource, SecretKeyReference, UserInfo,
    VERSION, parameter_secrets, valid_external_id,
};
pub use usage::{
    EnvPrefix, InjectedTarget, ServiceBindingUsage, ServiceBindingUsageSpec,
    ServiceBindingUsageStatus, UsageCondition, UsageKind, UsageKindContainer, UsageKindResource,
    UsageKindSpec, UsageKindStatus, UsageParameters, UsedBy, WorkloadMapping,
};

/// Every CustomResourceDefinition brokkr's controllers serve, in the order to apply them.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        ClusterServiceBroker::crd(),
        ServiceBroker::crd(),
        ClusterServiceClass::crd(),
        ClusterServicePlan::crd(),
        ServiceClass::crd(),
        ServicePlan::crd(),
        ServiceInstance::crd(),
        ServiceBinding::crd(),
        UsageKind::crd(),
        ServiceBindingUsage::crd(),
        servicebinding_io::service_binding_crd(),
        servicebinding_io::cluster_workload_resource_mapping_crd(),
    ]
}
