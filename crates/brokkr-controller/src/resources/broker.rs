//! ClusterServiceBroker and ServiceBroker: an OSB broker whose catalog the controller lists into
//! classes and plans.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::shared::{Condition, LocalObjectReference, ObjectReference};

/// What every broker's spec holds, cluster-wide or in a namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommonServiceBrokerSpec {
    /// The broker's base URL, e.g. `https://broker.example.com`.
    pub url: String,
    /// Accept any certificate the broker presents. Only for brokers on a trusted network.
    #[serde(default, rename = "insecureSkipTLSVerify")]
    pub insecure_skip_tls_verify: bool,
    /// PEM certificates (base64-encoded, as any `[]byte` field) to trust instead of the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "byte"))]
    pub ca_bundle: Option<String>,
    /// `Duration` (the default) relists the catalog every `relistDuration`; `Manual` only when
    /// the spec changes (e.g. `relistRequests` grows).
    #[serde(default)]
    pub relist_behavior: RelistBehavior,
    /// How often to relist the catalog (default `15m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relist_duration: Option<kube::core::Duration>,
    /// Raising this number relists the catalog now.
    #[serde(default)]
    pub relist_requests: i64,
}

/// When a broker's catalog is listed again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RelistBehavior {
    /// Every `relistDuration`.
    #[default]
    Duration,
    /// Only when the broker's spec changes.
    Manual,
}

/// The spec of a [`ClusterServiceBroker`]: a broker whose catalog every namespace may use.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "services.brokkr.dev",
    version = "v1alpha1",
    kind = "ClusterServiceBroker",
    status = "ServiceBrokerStatus",
    shortname = "csb",
    category = "servicecatalog",
    doc = "An OSB broker whose catalog the controller lists into ClusterServiceClasses and ClusterServicePlans.",
    printcolumn(name = "URL", type_ = "string", json_path = ".spec.url"),
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
pub struct ClusterServiceBrokerSpec {
    /// URL, TLS and relisting.
    #[serde(flatten)]
    pub common: CommonServiceBrokerSpec,
    /// How to authenticate to the broker: Secrets in any namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_info: Option<BrokerAuthInfo<ObjectReference>>,
}

/// The spec of a [`ServiceBroker`]: a broker whose catalog only its namespace uses.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "services.brokkr.dev",
    version = "v1alpha1",
    kind = "ServiceBroker",
    namespaced,
    status = "ServiceBrokerStatus",
    shortname = "sbr",
    category = "servicecatalog",
    doc = "An OSB broker whose catalog the controller lists into ServiceClasses and ServicePlans of its namespace.",
    printcolumn(name = "URL", type_ = "string", json_path = ".spec.url"),
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
pub struct ServiceBrokerSpec {
    /// URL, TLS and relisting.
    #[serde(flatten)]
    pub common: CommonServiceBrokerSpec,
    /// How to authenticate to the broker: Secrets in the broker's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_info: Option<BrokerAuthInfo<LocalObjectReference>>,
}

/// How to authenticate to a broker; at most one of `basic` and `bearer`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BrokerAuthInfo<R> {
    /// HTTP basic authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic: Option<BasicAuthConfig<R>>,
    /// A bearer token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer: Option<BearerTokenAuthConfig<R>>,
}

/// Basic authentication from a Secret with the keys `username` and `password`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BasicAuthConfig<R> {
    /// The Secret.
    pub secret_ref: R,
}

/// A bearer token from a Secret with the key `token`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BearerTokenAuthConfig<R> {
    /// The Secret.
    pub secret_ref: R,
}

/// What the controller last saw of a broker.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceBrokerStatus {
    /// `Ready` (the catalog was fetched and listed) and, when fetching fails, `Failed`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The `status` of the last condition that changed (`Ready`, `Failed`, `ErrorFetchingCatalog`…), for `kubectl get`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_condition_state: String,
    /// The generation of the spec the catalog was last listed for.
    #[serde(default)]
    pub reconciled_generation: i64,
    /// The generation of the spec the status describes.
    #[serde(default)]
    pub observed_generation: i64,
    /// When the catalog was last fetched successfully.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_catalog_retrieval_time: Option<Time>,
}
