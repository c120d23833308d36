//! The resources of the Service Binding Specification for Kubernetes (group `servicebinding.io`):
//! ServiceBinding and ClusterWorkloadResourceMapping, with the fields of the spec's exemplar
//! CRDs. `v1` is stored; `v1beta1` is served with the same schema. The Rust types of each
//! version live in [`v1`] and [`v1beta1`]; this module re-exports `v1`'s.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt as _;
use kube::core::crd::merge_crds;

use crate::projector::{ContainerPaths, Mapping, PathError};

pub use v1::*;

/// The API group.
pub const GROUP: &str = "servicebinding.io";

/// Defines the types of one version; both versions have the same fields.
macro_rules! servicebinding_version {
    ($version:tt) => {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
        use kube::CustomResource;
        use schemars::JsonSchema;
        use serde::{Deserialize, Serialize};

        use crate::resources::shared::LocalObjectReference;

        /// The spec of a [`ServiceBinding`]: which service's Secret to project into which
        /// workloads.
        #[derive(
            CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema,
        )]
        #[kube(
            group = "servicebinding.io",
            version = $version,
            kind = "ServiceBinding",
            namespaced,
            status = "ServiceBindingStatus",
            doc = "Projects a Provisioned Service's binding Secret into workloads (servicebinding.io).",
            printcolumn(
                name = "Ready",
                type_ = "string",
                json_path = ".status.conditions[?(@.type==\"Ready\")].status"
            ),
            printcolumn(
                name = "Reason",
                type_ = "string",
                json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
            ),
            printcolumn(
                name = "Age",
                type_ = "date",
                json_path = ".metadata.creationTimestamp"
            )
        )]
        #[serde(rename_all = "camelCase")]
        pub struct ServiceBindingSpec {
            /// The directory under `$SERVICE_BINDING_ROOT` (default: the binding's name).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub name: Option<String>,
            /// Overrides the Secret's `type` entry in the projection.
            #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
            pub type_: Option<String>,
            /// Overrides the Secret's `provider` entry in the projection.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub provider: Option<String>,
            /// The Provisioned Service (anything with `.status.binding.name`), or a Secret
            /// (`v1`, `Secret`) directly.
            pub service: ServiceBindingServiceReference,
            /// The workloads: one by name, or every one a label selector matches.
            pub workload: ServiceBindingWorkloadReference,
            /// Secret entries as environment variables.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            pub env: Vec<EnvMapping>,
        }

        /// A Provisioned Service in the binding's namespace.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
        #[serde(rename_all = "camelCase")]
        pub struct ServiceBindingServiceReference {
            /// The service's API version.
            pub api_version: String,
            /// The service's kind.
            pub kind: String,
            /// The service's name.
            pub name: String,
        }

        /// The workloads to bind, in the binding's namespace.
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(rename_all = "camelCase")]
        pub struct ServiceBindingWorkloadReference {
            /// The workloads' API version.
            pub api_version: String,
            /// The workloads' kind.
            pub kind: String,
            /// One workload by name (not with `selector`).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub name: Option<String>,
            /// Every workload whose labels match (not with `name`).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub selector: Option<LabelSelector>,
            /// The containers to bind, by name (default: all).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub containers: Option<Vec<String>>,
        }

        /// One Secret entry as an environment variable.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
        pub struct EnvMapping {
            /// The variable.
            pub name: String,
            /// The Secret entry.
            pub key: String,
        }

        /// What the controller last saw of a [`ServiceBinding`].
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(rename_all = "camelCase")]
        pub struct ServiceBindingStatus {
            /// The Secret projected into the workloads.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub binding: Option<LocalObjectReference>,
            /// `Ready`, `ServiceAvailable` and `WorkloadProjected`.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            pub conditions: Vec<Condition>,
            /// The generation the status describes.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub observed_generation: Option<i64>,
        }

        /// The spec of a [`ClusterWorkloadResourceMapping`], named `<plural>.<group>` after
        /// the kind it maps: where that kind keeps what a pod template would.
        #[derive(
            CustomResource, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema,
        )]
        #[kube(
            group = "servicebinding.io",
            version = $version,
            kind = "ClusterWorkloadResourceMapping",
            doc = "Where a workload kind keeps its pod template's annotations, containers and volumes (servicebinding.io).",
            printcolumn(
                name = "Age",
                type_ = "date",
                json_path = ".metadata.creationTimestamp"
            )
        )]
        pub struct ClusterWorkloadResourceMappingSpec {
            /// One mapping per version of the kind (`*` for the others).
            pub versions: Vec<MappingTemplate>,
        }

        /// The mapping of one version of a kind.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
        #[serde(rename_all = "camelCase")]
        pub struct MappingTemplate {
            /// The version, or `*` for every version without its own entry.
            pub version: String,
            /// A fixed JSONPath to the annotations (default
            /// `.spec.template.metadata.annotations`).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub annotations: Option<String>,
            /// Where containers are (default: the `PodSpec`-able containers and init
            /// containers).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub containers: Option<Vec<MappingContainer>>,
            /// A fixed JSONPath to the volumes (default `.spec.template.spec.volumes`).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub volumes: Option<String>,
        }

        /// Where some containers are.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
        #[serde(rename_all = "camelCase")]
        pub struct MappingContainer {
            /// A JSONPath matching each container.
            pub path: String,
            /// A fixed JSONPath, within a container, to its name.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub name: Option<String>,
            /// A fixed JSONPath, within a container, to its `env` (default `.env`).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub env: Option<String>,
            /// A fixed JSONPath, within a container, to its `volumeMounts` (default
            /// `.volumeMounts`).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub volume_mounts: Option<String>,
        }
    };
}

/// `servicebinding.io/v1`, the stored version.
#[allow(clippy::duplicated_attributes)]
pub mod v1 {
    servicebinding_version!("v1");
}

/// `servicebinding.io/v1beta1`, served with `v1`'s schema.
#[allow(clippy::duplicated_attributes)]
pub mod v1beta1 {
    servicebinding_version!("v1beta1");
}

/// The ServiceBinding CRD: `v1` stored, `v1beta1` served.
pub fn service_binding_crd() -> CustomResourceDefinition {
    merge_crds(
        vec![v1::ServiceBinding::crd(), v1beta1::ServiceBinding::crd()],
        "v1",
    )
    .expect("two versions of one kind")
}

/// The ClusterWorkloadResourceMapping CRD: `v1` stored, `v1beta1` served.
pub fn cluster_workload_resource_mapping_crd() -> CustomResourceDefinition {
    merge_crds(
        vec![
            v1::ClusterWorkloadResourceMapping::crd(),
            v1beta1::ClusterWorkloadResourceMapping::crd(),
        ],
        "v1",
    )
    .expect("two versions of one kind")
}

impl MappingTemplate {
    /// The projector's mapping this entry describes.
    pub fn mapping(&self) -> Result<Mapping, PathError> {
        let containers: Vec<ContainerPaths<'_>> = self
            .containers
            .iter()
            .flatten()
            .map(|c| ContainerPaths {
                path: &c.path,
                name: c.name.as_deref(),
                env: c.env.as_deref(),
                env_from: None,
                volume_mounts: c.volume_mounts.as_deref(),
            })
            .collect();
        Mapping::new(
            self.annotations.as_deref(),
            &containers,
            self.volumes.as_deref(),
        )
    }
}

impl ClusterWorkloadResourceMappingSpec {
    /// The entry for `version` of the mapped kind: its own, else the `*` one.
    pub fn template_for(&self, version: &str) -> Option<&MappingTemplate> {
        self.versions
            .iter()
            .find(|t| t.version == version)
            .or_else(|| self.versions.iter().find(|t| t.version == "*"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_spec_example_mapping_for_cronjobs_is_the_builtin_one() {
        let spec: ClusterWorkloadResourceMappingSpec = serde_json::from_value(json!({
            "versions": [{
                "version": "*",
                "annotations": ".spec.jobTemplate.spec.template.metadata.annotations",
                "containers": [
                    {"path": ".spec.jobTemplate.spec.template.spec.containers[*]", "name": ".name",
                     "env": ".env", "volumeMounts": ".volumeMounts"},
                    {"path": ".spec.jobTemplate.spec.template.spec.initContainers[*]", "name": ".name",
                     "env": ".env", "volumeMounts": ".volumeMounts"}
                ],
                "volumes": ".spec.jobTemplate.spec.template.spec.volumes"
            }, {"version": "v2"}]
        }))
        .unwrap();
        assert_eq!(
            spec.template_for("v1").unwrap().mapping().unwrap(),
            Mapping::builtin("batch", "CronJob").unwrap()
        );
        assert_eq!(
            spec.template_for("v2").unwrap().mapping().unwrap(),
            Mapping::pod_spec_able()
        );
        let only_v2 = ClusterWorkloadResourceMappingSpec {
            versions: vec![spec.versions[1].clone()],
        };
        assert!(only_v2.template_for("v1").is_none());
    }

    #[test]
    fn both_versions_are_served_with_one_schema_and_v1_is_stored() {
        for crd in [
            service_binding_crd(),
            cluster_workload_resource_mapping_crd(),
        ] {
            let versions = &crd.spec.versions;
            assert_eq!(versions.len(), 2);
            let v1 = versions.iter().find(|v| v.name == "v1").unwrap();
            let v1beta1 = versions.iter().find(|v| v.name == "v1beta1").unwrap();
            assert!(v1.served && v1.storage && v1beta1.served && !v1beta1.storage);
            assert_eq!(v1.schema, v1beta1.schema);
        }
    }
}
