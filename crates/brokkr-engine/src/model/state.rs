//! What a resource keeps besides its operation: the request attributes that define it
//! ([`Attrs`]), what its operations produced ([`Outputs`]), and the change an update makes
//! ([`Update`]). Stored as JSON (encrypted when the store has a keyring) under the same keys
//! the types name.

use brokkr_osb::MaintenanceInfo;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::plan::OpStep;

/// The request attributes that define an instance or a binding; what templates see as
/// `parameters` and `context`. Only what the platform sent is kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Attrs {
    /// The configuration parameters the platform passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
    /// The platform's context (namespace, organization, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Map<String, Value>>,
    /// For instances: the maintenance version the instance is at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_info: Option<MaintenanceInfo>,
    /// For instances: the deprecated `organization_guid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub organization_guid: Option<String>,
    /// For instances: the deprecated `space_guid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space_guid: Option<String>,
    /// For bindings: the deprecated `app_guid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_guid: Option<String>,
    /// For bindings: what the binding is for (`app_guid`, `route`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind_resource: Option<Map<String, Value>>,
    /// For bindings: the binding this one rotates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predecessor_binding_id: Option<String>,
}

impl Attrs {
    /// The attributes whose difference makes a repeated request a conflict: all but `context`,
    /// which platforms may refresh between retries.
    pub fn identity(&self) -> Self {
        Self {
            context: None,
            ..self.clone()
        }
    }
}

/// What a resource's operations produced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Outputs {
    /// Registry values: generated secrets, derived names, values steps read.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub registry: Map<String, Value>,
    /// For a binding: the credentials its bind rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<Map<String, Value>>,
    /// For a binding: where its bind published the credentials (as each target reports it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<Value>,
    /// For a binding whose plan gives credentials a lifetime: when they expire (OSB
    /// `expires_at`), in milliseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// For such a binding: when a platform should rotate it (OSB `renew_before`), likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<i64>,
    /// The steps the last deprovision or unbind left behind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<Skipped>,
}

/// Steps a deprovision or unbind skipped because they kept failing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    /// The operation that skipped them.
    pub op: String,
    /// The steps, as that operation had them.
    #[serde(default)]
    pub steps: Vec<OpStep>,
}

impl Outputs {
    /// Records that operation `op_id` skipped `step`; steps an earlier operation skipped are
    /// forgotten (the current one retried them).
    pub fn skip(&mut self, op_id: &str, step: OpStep) {
        match &mut self.skipped {
            Some(skipped) if skipped.op == op_id => skipped.steps.push(step),
            _ => {
                self.skipped = Some(Skipped {
                    op: op_id.to_owned(),
                    steps: vec![step],
                });
            }
        }
    }

    /// Forgets the steps skipped by any operation but `op_id`.
    pub fn keep_skipped_of(&mut self, op_id: &str) {
        if self.skipped.as_ref().is_some_and(|s| s.op != op_id) {
            self.skipped = None;
        }
    }

    /// The steps the last deprovision or unbind skipped.
    pub fn skipped_steps(&self) -> &[OpStep] {
        self.skipped.as_ref().map_or(&[], |s| &s.steps)
    }
}

/// What an update changes when it succeeds; fixed when it starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Update {
    /// The plan the instance moves to (its own when the plan does not change).
    pub plan_id: String,
    /// The attributes it will have.
    pub attrs: Attrs,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn stored_outputs_keep_their_keys() {
        let stored = json!({
            "registry": {"password": "pw"},
            "credentials": {"type": "postgresql"},
            "secrets": [{"namespace": "ns", "name": "s"}],
            "expires_at": 1_767_225_599_000_i64,
            "renew_before": 1_766_620_799_000_i64,
            "skipped": {"op": "op-1", "steps": [{"name": "db", "target": "pg"}]},
        });
        let outputs: Outputs = serde_json::from_value(stored.clone()).unwrap();
        assert_eq!(outputs.skipped_steps()[0].name, "db");
        assert_eq!(serde_json::to_value(&outputs).unwrap(), stored);
        assert_eq!(serde_json::to_value(Outputs::default()).unwrap(), json!({}));
    }

    #[test]
    fn a_new_operation_forgets_what_an_earlier_one_skipped() {
        let step = |name: &str| -> OpStep {
            serde_json::from_value(json!({"name": name, "delay": "1s"})).unwrap()
        };
        let mut outputs = Outputs::default();
        outputs.skip("op-1", step("a"));
        outputs.skip("op-1", step("b"));
        assert_eq!(outputs.skipped_steps().len(), 2);
        outputs.skip("op-2", step("c"));
        assert_eq!(outputs.skipped_steps(), [step("c")]);
        outputs.keep_skipped_of("op-2");
        assert_eq!(outputs.skipped_steps().len(), 1);
        outputs.keep_skipped_of("op-3");
        assert!(outputs.skipped_steps().is_empty());
    }

    #[test]
    fn attrs_keep_what_the_platform_sent_and_identity_leaves_out_the_context() {
        let stored = json!({"parameters": {"size": 1}, "context": {"namespace": "a"},
                            "maintenance_info": {"version": "1.0.0"}});
        let attrs: Attrs = serde_json::from_value(stored.clone()).unwrap();
        assert_eq!(serde_json::to_value(&attrs).unwrap(), stored);
        let mut moved = attrs.clone();
        moved.context = Some(Map::from_iter([("namespace".into(), json!("b"))]));
        assert_eq!(moved.identity(), attrs.identity());
        assert_ne!(moved, attrs);
    }
}
