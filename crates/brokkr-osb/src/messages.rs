//! Request and response bodies of the instance and binding endpoints.
//!
//! A platform serializes requests with serde; a broker parses them with
//! [`ProvisionRequest::from_slice`] and friends rather than a plain serde derive, so that a
//! malformed body yields a message naming the field and what it must be, without echoing the value
//! that was sent (parameters often carry secrets). Unknown fields are ignored, as
//! the specification requires for vendor extensions.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::catalog::MaintenanceInfo;

/// A request body that cannot be used; the message is safe to show and to log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RequestError(pub String);

/// `PUT /v2/service_instances/:instance_id`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProvisionRequest {
    /// The service offering.
    pub service_id: String,
    /// The plan.
    pub plan_id: String,
    /// Platform context (`platform`, `namespace`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<Map<String, Value>>,
    /// Deprecated Cloud Foundry organization.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub organization_guid: Option<String>,
    /// Deprecated Cloud Foundry space.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub space_guid: Option<String>,
    /// User parameters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
    /// The maintenance version the platform expects; an object without `version` counts as absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maintenance_info: Option<MaintenanceInfo>,
}

/// `PATCH /v2/service_instances/:instance_id`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UpdateRequest {
    /// The service offering; must be the instance's.
    pub service_id: String,
    /// The new plan; absent means unchanged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_id: Option<String>,
    /// Platform context.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<Map<String, Value>>,
    /// New parameters; absent means unchanged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
    /// What the platform believes the instance was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_values: Option<Map<String, Value>>,
    /// The maintenance version to move to; an object without `version` counts as absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maintenance_info: Option<MaintenanceInfo>,
}

/// `PUT /v2/service_instances/:instance_id/service_bindings/:binding_id`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BindRequest {
    /// The service offering.
    pub service_id: String,
    /// The plan.
    pub plan_id: String,
    /// Platform context.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<Map<String, Value>>,
    /// Deprecated application GUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_guid: Option<String>,
    /// Platform resource the binding is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bind_resource: Option<Map<String, Value>>,
    /// User parameters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
    /// For rotation: the binding this one succeeds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predecessor_binding_id: Option<String>,
}

impl ProvisionRequest {
    /// Parses and checks a provision body.
    pub fn from_slice(body: &[u8]) -> Result<Self, RequestError> {
        let f = Fields::parse(body)?;
        Ok(Self {
            service_id: f.required_str("service_id")?,
            plan_id: f.required_str("plan_id")?,
            context: f.object("context")?,
            organization_guid: f.str("organization_guid")?,
            space_guid: f.str("space_guid")?,
            parameters: f.object("parameters")?,
            maintenance_info: f.maintenance_info()?,
        })
    }
}

impl UpdateRequest {
    /// Parses and checks an update body.
    pub fn from_slice(body: &[u8]) -> Result<Self, RequestError> {
        let f = Fields::parse(body)?;
        Ok(Self {
            service_id: f.required_str("service_id")?,
            plan_id: f.str("plan_id")?,
            context: f.object("context")?,
            parameters: f.object("parameters")?,
            previous_values: f.object("previous_values")?,
            maintenance_info: f.maintenance_info()?,
        })
    }
}

impl BindRequest {
    /// Parses and checks a bind body.
    pub fn from_slice(body: &[u8]) -> Result<Self, RequestError> {
        let f = Fields::parse(body)?;
        Ok(Self {
            service_id: f.required_str("service_id")?,
            plan_id: f.required_str("plan_id")?,
            context: f.object("context")?,
            app_guid: f.str("app_guid")?,
            bind_resource: f.object("bind_resource")?,
            parameters: f.object("parameters")?,
            predecessor_binding_id: f.str("predecessor_binding_id")?,
        })
    }
}

/// The top-level object of a request body, with typed accessors that explain what is wrong.
struct Fields(Map<String, Value>);

impl Fields {
    fn parse(body: &[u8]) -> Result<Self, RequestError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(RequestError(
                "the request body is empty; a JSON object is required".into(),
            ));
        }
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(map)) => Ok(Self(map)),
            Ok(_) => Err(RequestError(
                "the request body must be a JSON object".into(),
            )),
            // serde_json's syntax errors name a position, never the input.
            Err(e) => Err(RequestError(format!(
                "the request body is not valid JSON: {e}"
            ))),
        }
    }

    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn str(&self, name: &str) -> Result<Option<String>, RequestError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
            Some(_) => Err(RequestError(format!("`{name}` must be a non-empty string"))),
        }
    }

    fn required_str(&self, name: &str) -> Result<String, RequestError> {
        self.str(name)?
            .ok_or_else(|| RequestError(format!("`{name}` is required")))
    }

    fn object(&self, name: &str) -> Result<Option<Map<String, Value>>, RequestError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(map.clone())),
            Some(_) => Err(RequestError(format!("`{name}` must be a JSON object"))),
        }
    }

    fn maintenance_info(&self) -> Result<Option<MaintenanceInfo>, RequestError> {
        let Some(mi) = self.object("maintenance_info")? else {
            return Ok(None);
        };
        let description = match mi.get("description") {
            Some(Value::String(s)) => Some(s.clone()),
            _ => None,
        };
        match mi.get("version") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(v)) if !v.is_empty() => Ok(Some(MaintenanceInfo {
                version: v.clone(),
                description,
            })),
            Some(_) => Err(RequestError(
                "`maintenance_info.version` must be a non-empty string".into(),
            )),
        }
    }
}

/// The state of an asynchronous operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperationState {
    /// Still running; poll again.
    #[serde(rename = "in progress")]
    InProgress,
    /// Finished successfully.
    #[serde(rename = "succeeded")]
    Succeeded,
    /// Finished with an error.
    #[serde(rename = "failed")]
    Failed,
}

impl OperationState {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "in progress",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }

    /// Parses the wire spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "in progress" => Some(Self::InProgress),
            "succeeded" => Some(Self::Succeeded),
            "failed" => Some(Self::Failed),
            _ => None,
        }
    }
}

/// The body of a `last_operation` response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastOperation {
    /// The operation's state.
    pub state: OperationState,
    /// What is happening, for the user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// For failed updates and deprovisions: whether the instance is still usable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_usable: Option<bool>,
    /// For failed updates: whether repeating the update may succeed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_repeatable: Option<bool>,
}

/// The body of a provision or update response (200, 201 or 202).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InstanceOperationResponse {
    /// The instance's dashboard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dashboard_url: Option<String>,
    /// The operation to poll, for 202 responses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// Labels and attributes of the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// The body of a 202 for bind, unbind and deprovision, and of their synchronous 200 (`{}`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AsyncResponse {
    /// The operation to poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
}

/// The body of `GET /v2/service_instances/:instance_id`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InstanceResource {
    /// The service offering.
    pub service_id: String,
    /// The plan.
    pub plan_id: String,
    /// The instance's dashboard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dashboard_url: Option<String>,
    /// The parameters the instance was last provisioned or updated with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
    /// The instance's maintenance version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_info: Option<MaintenanceInfo>,
    /// Labels and attributes of the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// Whether the instance can be used right now (a brokkr extension, as in `last_operation`):
    /// `false` while a server brokkr runs for it is down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_usable: Option<bool>,
}

/// The body of a successful bind or of `GET …/service_bindings/:binding_id`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BindingResource {
    /// `expires_at` and `renew_before`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// The credentials, a flat map.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<Map<String, Value>>,
    /// Where logs are streamed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syslog_drain_url: Option<String>,
    /// Route service URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_service_url: Option<String>,
    /// Volume mounts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mounts: Option<Vec<Value>>,
    /// Network endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Vec<Value>>,
    /// The parameters the binding was created with (fetch only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
}

/// The body of a bind response: the binding (200, 201) or the operation to poll (202).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BindResponse {
    /// The operation to poll, for 202 responses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// The binding, for 200 and 201 responses.
    #[serde(flatten)]
    pub binding: BindingResource,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provision_body_parses_and_ignores_extensions() {
        let r = ProvisionRequest::from_slice(
            br#"{"service_id":"s","plan_id":"p","x-vendor":1,"parameters":{"a":1},
                 "maintenance_info":{"version":"1.0.0"}}"#,
        )
        .unwrap();
        assert_eq!(r.service_id, "s");
        assert_eq!(r.parameters.unwrap()["a"], 1);
        assert_eq!(r.maintenance_info.unwrap().version, "1.0.0");
    }

    #[test]
    fn maintenance_info_without_version_is_absent() {
        let r = ProvisionRequest::from_slice(
            br#"{"service_id":"s","plan_id":"p","maintenance_info":{"description":"x"}}"#,
        )
        .unwrap();
        assert_eq!(r.maintenance_info, None);
    }

    #[test]
    fn errors_name_the_field_and_never_the_value() {
        let cases: [(&[u8], &str); 6] = [
            (b"", "empty"),
            (b"[]", "must be a JSON object"),
            (b"{\"service_id\":", "not valid JSON"),
            (br#"{"plan_id":"p"}"#, "`service_id` is required"),
            (
                br#"{"service_id":"s","plan_id":"p","parameters":"hunter2"}"#,
                "`parameters` must be a JSON object",
            ),
            (
                br#"{"service_id":"s","plan_id":7}"#,
                "`plan_id` must be a non-empty string",
            ),
        ];
        for (body, expected) in cases {
            let err = ProvisionRequest::from_slice(body).unwrap_err().0;
            assert!(err.contains(expected), "{err}");
            assert!(!err.contains("hunter2"));
        }
    }

    #[test]
    fn requests_round_trip_through_their_wire_form() {
        let object = |v: Value| v.as_object().cloned();
        let provision = ProvisionRequest {
            service_id: "s".into(),
            plan_id: "p".into(),
            context: object(serde_json::json!({"platform": "kubernetes", "namespace": "a"})),
            organization_guid: Some("org".into()),
            space_guid: Some("space".into()),
            parameters: object(serde_json::json!({"size": 3, "tls": {"on": true}})),
            maintenance_info: Some(MaintenanceInfo {
                version: "1.2.0".into(),
                description: Some("patch".into()),
            }),
        };
        let wire = serde_json::to_vec(&provision).unwrap();
        assert_eq!(ProvisionRequest::from_slice(&wire).unwrap(), provision);

        let update = UpdateRequest {
            service_id: "s".into(),
            plan_id: Some("p2".into()),
            previous_values: object(serde_json::json!({"plan_id": "p"})),
            ..UpdateRequest::default()
        };
        let wire = serde_json::to_vec(&update).unwrap();
        assert_eq!(UpdateRequest::from_slice(&wire).unwrap(), update);

        let bind = BindRequest {
            service_id: "s".into(),
            plan_id: "p".into(),
            app_guid: Some("app".into()),
            bind_resource: object(serde_json::json!({"app_guid": "app"})),
            predecessor_binding_id: Some("b0".into()),
            ..BindRequest::default()
        };
        let wire = serde_json::to_vec(&bind).unwrap();
        assert_eq!(BindRequest::from_slice(&wire).unwrap(), bind);
    }

    #[test]
    fn absent_fields_are_left_out_of_the_wire_form() {
        let bind = BindRequest {
            service_id: "s".into(),
            plan_id: "p".into(),
            ..BindRequest::default()
        };
        assert_eq!(
            serde_json::to_value(&bind).unwrap(),
            serde_json::json!({"service_id": "s", "plan_id": "p"})
        );
    }

    #[test]
    fn bind_responses_carry_a_binding_or_an_operation() {
        let sync: BindResponse =
            serde_json::from_str(r#"{"credentials":{"uri":"u"},"metadata":{"expires_at":"x"}}"#)
                .unwrap();
        assert_eq!(sync.operation, None);
        assert_eq!(sync.binding.credentials.unwrap()["uri"], "u");
        let accepted: BindResponse = serde_json::from_str(r#"{"operation":"op-1"}"#).unwrap();
        assert_eq!(accepted.operation.as_deref(), Some("op-1"));
        assert_eq!(accepted.binding, BindingResource::default());
    }
}
