//! The catalog served at `GET /v2/catalog`: service offerings, their plans, parameter schemas and
//! maintenance information.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The body of `GET /v2/catalog`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Catalog {
    /// The service offerings. May be empty.
    pub services: Vec<Service>,
}

impl Catalog {
    /// Finds a plan by service offering id and plan id.
    pub fn plan(&self, service_id: &str, plan_id: &str) -> Option<(&Service, &Plan)> {
        let service = self.service(service_id)?;
        let plan = service.plans.iter().find(|p| p.id == plan_id)?;
        Some((service, plan))
    }

    /// Finds a service offering by id.
    pub fn service(&self, service_id: &str) -> Option<&Service> {
        self.services.iter().find(|s| s.id == service_id)
    }
}

/// A service offering.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Service {
    /// CLI-friendly name, unique in the catalog.
    pub name: String,
    /// Globally unique id.
    pub id: String,
    /// Short description.
    pub description: String,
    /// Classification tags (`mysql`, `relational`, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Permissions the service needs (`syslog_drain`, `route_forwarding`, `volume_mount`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requires: Vec<String>,
    /// Whether instances can be bound; plans may override.
    pub bindable: bool,
    /// Whether `GET /v2/service_instances/:id` is supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances_retrievable: Option<bool>,
    /// Whether `GET …/service_bindings/:id` is supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bindings_retrievable: Option<bool>,
    /// Whether updates carrying only a changed `context` are accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_context_updates: Option<bool>,
    /// Opaque metadata for display.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// Cloud Foundry dashboard SSO client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dashboard_client: Option<Value>,
    /// Whether plan changes are supported by default (the spec's spelling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_updateable: Option<bool>,
    /// The plans; at least one.
    pub plans: Vec<Plan>,
}

/// A service plan.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Globally unique id.
    pub id: String,
    /// CLI-friendly name, unique within its service offering.
    pub name: String,
    /// Short description.
    pub description: String,
    /// Opaque metadata for display.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// Whether the plan is free (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free: Option<bool>,
    /// Overrides the service offering's `bindable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bindable: Option<bool>,
    /// Whether bindings of this plan may be rotated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding_rotatable: Option<bool>,
    /// Overrides the service offering's `plan_updateable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_updateable: Option<bool>,
    /// Parameter schemas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schemas: Option<Schemas>,
    /// How long, in seconds, a platform should poll an operation of this plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum_polling_duration: Option<u64>,
    /// The maintenance version instances of this plan are brought to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_info: Option<MaintenanceInfo>,
}

impl Plan {
    /// Whether instances of this plan can be bound, after applying the service default.
    pub fn is_bindable(&self, service: &Service) -> bool {
        self.bindable.unwrap_or(service.bindable)
    }

    /// Whether this plan may be changed by an update, after applying the service default.
    pub fn is_plan_updateable(&self, service: &Service) -> bool {
        self.plan_updateable
            .or(service.plan_updateable)
            .unwrap_or(false)
    }

    /// The `service_instance.create` parameter schema, if any.
    pub fn instance_create_schema(&self) -> Option<&Value> {
        let s = self.schemas.as_ref()?.service_instance.as_ref()?;
        s.create.as_ref()?.parameters.as_ref()
    }

    /// The `service_instance.update` parameter schema, if any.
    pub fn instance_update_schema(&self) -> Option<&Value> {
        let s = self.schemas.as_ref()?.service_instance.as_ref()?;
        s.update.as_ref()?.parameters.as_ref()
    }

    /// The `service_binding.create` parameter schema, if any.
    pub fn binding_create_schema(&self) -> Option<&Value> {
        let s = self.schemas.as_ref()?.service_binding.as_ref()?;
        s.create.as_ref()?.parameters.as_ref()
    }
}

/// Parameter schemas of a plan.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Schemas {
    /// Schemas for creating and updating instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_instance: Option<InstanceSchemas>,
    /// Schema for creating bindings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_binding: Option<BindingSchemas>,
}

/// Schemas for instance operations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InstanceSchemas {
    /// Schema for provisioning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create: Option<InputParameters>,
    /// Schema for updating.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update: Option<InputParameters>,
}

/// Schemas for binding operations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BindingSchemas {
    /// Schema for binding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create: Option<InputParameters>,
}

/// Wraps one JSON Schema.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InputParameters {
    /// The JSON Schema that `parameters` must satisfy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
}

/// Maintenance information of a plan or an instance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaintenanceInfo {
    /// A semantic version 2.0 string.
    pub version: String,
    /// What the maintenance changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}
