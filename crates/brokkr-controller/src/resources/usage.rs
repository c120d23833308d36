//! UsageKind and ServiceBindingUsage, with the fields of Kyma's
//! `servicecatalog.kyma-project.io/v1alpha1` (so its manifests port by changing `apiVersion`),
//! and where a kind keeps its pod template or containers, which Kyma did not need: it injected
//! through PodPresets, brokkr edits the workload.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::shared::{ConditionStatus, LocalObjectReference};
use crate::projector::{ContainerPaths, Mapping, Path, PathError};

/// The spec of a [`UsageKind`]: a kind whose workloads ServiceBindingUsages may name.
#[derive(
    CustomResource, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "services.brokkr.dev",
    version = "v1alpha1",
    kind = "UsageKind",
    status = "UsageKindStatus",
    category = "servicecatalog",
    doc = "A kind of workload ServiceBindingUsages inject Secrets into, and where it keeps its pod template.",
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.resource.kind"),
    printcolumn(name = "Group", type_ = "string", json_path = ".spec.resource.group"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct UsageKindSpec {
    /// A human-readable name.
    pub display_name: String,
    /// The kind.
    pub resource: UsageKindResource,
    /// Where the kind keeps the labels of its pods (Kyma's field, kept for compatibility; brokkr
    /// does not need labels to inject).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub labels_path: String,
    /// Where the kind keeps its pod template and containers (default: a `PodTemplateSpec` at
    /// `.spec.template`).
    #[serde(flatten)]
    pub mapping: WorkloadMapping,
}

/// A kind by group, version and kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UsageKindResource {
    /// The API group (`""` for the core group).
    #[serde(default)]
    pub group: String,
    /// The version.
    pub version: String,
    /// The kind.
    pub kind: String,
}

/// Where a kind keeps what an injection edits: a pod template, or containers of its own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadMapping {
    /// A fixed JSONPath to a `PodTemplateSpec` (default `.spec.template`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_path: Option<String>,
    /// A fixed JSONPath to the annotations that record the injection (default: the pod
    /// template's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations_path: Option<String>,
    /// Where containers are, for kinds without a pod template (default: the pod template's
    /// containers and init containers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<UsageKindContainer>,
}

/// Where some containers are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageKindContainer {
    /// A JSONPath matching each container (`[*]` for every element of a list).
    pub path: String,
    /// A fixed JSONPath, within a container, to its `envFrom` list (default `.envFrom`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_from: Option<String>,
}

impl WorkloadMapping {
    /// The projector's mapping.
    pub fn mapping(&self) -> Result<Mapping, PathError> {
        let template = self
            .pod_template_path
            .as_deref()
            .unwrap_or(".spec.template");
        let mut mapping = Mapping::pod_template(template)?;
        if let Some(annotations) = &self.annotations_path {
            mapping.annotations = Path::parse_fixed(annotations)?;
        }
        if !self.containers.is_empty() {
            let paths: Vec<ContainerPaths<'_>> = self
                .containers
                .iter()
                .map(|c| ContainerPaths {
                    path: &c.path,
                    env_from: c.env_from.as_deref(),
                    ..ContainerPaths::default()
                })
                .collect();
            mapping.containers = Mapping::new(None, &paths, None)?.containers;
        }
        Ok(mapping)
    }
}

/// What the controller last saw of a [`UsageKind`] (nothing yet; there for `kubectl`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageKindStatus {
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The spec of a [`ServiceBindingUsage`]: inject a ServiceBinding's Secret into a workload.
#[derive(
    CustomResource, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "services.brokkr.dev",
    version = "v1alpha1",
    kind = "ServiceBindingUsage",
    namespaced,
    status = "ServiceBindingUsageStatus",
    shortname = "sbu",
    category = "servicecatalog",
    doc = "Injects the Secret of a ServiceBinding of the same namespace into a workload, as envFrom with an optional prefix.",
    printcolumn(
        name = "Service-Binding",
        type_ = "string",
        json_path = ".spec.serviceBindingRef.name"
    ),
    printcolumn(
        name = "Used-By-Kind",
        type_ = "string",
        json_path = ".spec.usedBy.kind"
    ),
    printcolumn(
        name = "Used-By-Name",
        type_ = "string",
        json_path = ".spec.usedBy.name"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceBindingUsageSpec {
    /// The ServiceBinding (`services.brokkr.dev`) whose Secret to inject.
    pub service_binding_ref: LocalObjectReference,
    /// The workload.
    pub used_by: UsedBy,
    /// How to inject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<UsageParameters>,
}

impl ServiceBindingUsageSpec {
    /// The prefix of the injected variables (none when empty).
    pub fn env_prefix(&self) -> &str {
        self.parameters
            .as_ref()
            .and_then(|p| p.env_prefix.as_ref())
            .map_or("", |p| p.name.as_str())
    }
}

/// A workload by UsageKind and name, in the usage's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UsedBy {
    /// The name of a UsageKind (`deployment`, `function`, …).
    pub kind: String,
    /// The workload's name.
    pub name: String,
}

/// How to inject.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageParameters {
    /// A prefix for every variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_prefix: Option<EnvPrefix>,
}

/// A prefix for every variable, written as is (add your own separator, e.g. `REDIS_`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EnvPrefix {
    /// The prefix.
    pub name: String,
}

/// What the controller last saw of a [`ServiceBindingUsage`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceBindingUsageStatus {
    /// `Ready`, with reasons `ServiceBindingNotReady`, `UsageKindNotFound`, `TargetNotFound`,
    /// `Injected`, …
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<UsageCondition>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// Where the Secret is injected, and with which mapping: what removing the injection
    /// needs, even after `usedBy` or the UsageKind changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub injected: Option<InjectedTarget>,
}

/// A workload an injection was made into.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InjectedTarget {
    /// The workload's kind.
    pub resource: UsageKindResource,
    /// The workload's name.
    pub name: String,
    /// The mapping the injection used.
    #[serde(flatten)]
    pub mapping: WorkloadMapping,
}

/// One observation about a usage, as Kyma writes them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageCondition {
    /// What the condition is about: `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Whether it holds.
    pub status: ConditionStatus,
    /// When it was last written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// When `status` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// A machine-readable, CamelCase reason.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// A human-readable explanation.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kyma_manifests_port_by_changing_api_version() {
        let kind: UsageKind = serde_json::from_value(json!({
            "apiVersion": "services.brokkr.dev/v1alpha1", "kind": "UsageKind",
            "metadata": {"name": "function"},
            "spec": {"displayName": "Function",
                     "resource": {"group": "kubeless.io", "kind": "function", "version": "v1beta1"},
                     "labelsPath": "spec.deployment.spec.template.metadata.labels"}
        }))
        .unwrap();
        assert_eq!(kind.spec.resource.group, "kubeless.io");
        assert_eq!(
            kind.spec.mapping.mapping().unwrap(),
            Mapping::pod_spec_able()
        );
        let usage: ServiceBindingUsage = serde_json::from_value(json!({
            "apiVersion": "services.brokkr.dev/v1alpha1", "kind": "ServiceBindingUsage",
            "metadata": {"name": "redis-client-binding-usage", "namespace": "production"},
            "spec": {"serviceBindingRef": {"name": "redis-instance-binding"},
                     "usedBy": {"kind": "deployment", "name": "redis-client"},
                     "parameters": {"envPrefix": {"name": "pico-bello"}}}
        }))
        .unwrap();
        assert_eq!(usage.spec.env_prefix(), "pico-bello");
        assert_eq!(usage.spec.used_by.kind, "deployment");
    }

    #[test]
    fn a_usage_kind_maps_a_template_elsewhere_or_containers_of_its_own() {
        let cronjob = WorkloadMapping {
            pod_template_path: Some(".spec.jobTemplate.spec.template".into()),
            ..WorkloadMapping::default()
        };
        assert_eq!(
            cronjob.mapping().unwrap(),
            Mapping::builtin("batch", "CronJob").unwrap()
        );
        let own = WorkloadMapping {
            annotations_path: Some(".metadata.annotations".into()),
            containers: vec![UsageKindContainer {
                path: ".spec.runtimes[*]".into(),
                env_from: Some(".config.envFrom".into()),
            }],
            ..WorkloadMapping::default()
        };
        let mapping = own.mapping().unwrap();
        assert_eq!(mapping.annotations.to_string(), ".metadata.annotations");
        assert_eq!(mapping.containers.len(), 1);
        assert_eq!(mapping.containers[0].path.to_string(), ".spec.runtimes[*]");
        assert_eq!(
            mapping.containers[0].env_from.to_string(),
            ".config.envFrom"
        );
        assert!(
            WorkloadMapping {
                pod_template_path: Some(".spec.templates[*]".into()),
                ..WorkloadMapping::default()
            }
            .mapping()
            .is_err()
        );
    }
}
