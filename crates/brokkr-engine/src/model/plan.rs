//! What an operation runs, fixed when it starts: its [`OpPlan`] of [`OpStep`]s, taken from the
//! blueprint phase that its [`OpKind`] names.
//!
//! The engine keeps its own step type rather than the blueprint's file schema: a step's action
//! is an enum ([`Action`]), and an operation stored by one version of brokkr reads back the same
//! whatever the configuration files accept later. The stored JSON is the blueprint step's
//! spelling (`{"name": "wait", "delay": "10ms"}`), so operations stored before this type
//! existed read back unchanged.

use std::time::Duration;

use brokkr_blueprint::config::{Rotation, duration, opt_duration};
use brokkr_blueprint::{PlanEntry, Step};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The kind of an operation: the blueprint phase whose steps it runs.
pub use brokkr_blueprint::Phase as OpKind;

/// What an operation will do, fixed when it starts: a later configuration change does not alter
/// a running operation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpPlan {
    /// The steps, in order.
    #[serde(default)]
    pub steps: Vec<OpStep>,
    /// For binds: the credentials template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<Value>,
    /// For provisions and updates: the instance's `dashboard_url` expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dashboard_url: Option<String>,
    /// For binds of a plan whose credentials expire: their lifetime and when to renew them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiry: Option<Rotation>,
    /// Why the broker started this operation by itself, when no platform asked for it (the
    /// credentials of a binding expired); its end's description begins with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl OpPlan {
    /// The plan of a new operation of `kind` on a resource of plan `entry`: the steps its
    /// blueprint gives `kind` (for [`OpKind::Upgrade`], an update to a new maintenance version,
    /// the update's steps and the upgrade's), in order, for a bind the credentials template and their expiry, and for a
    /// provision or update the instance's dashboard URL expression. A plan no
    /// longer configured (`entry` is `None`) gives no steps.
    pub fn configured(entry: Option<&PlanEntry>, kind: OpKind) -> Result<Self, PlanError> {
        let steps = match (entry, kind) {
            (None, _) => Vec::new(),
            (
                Some(e),
                OpKind::Provision | OpKind::Update | OpKind::Upgrade | OpKind::Deprovision,
            ) => e.instance_steps(kind),
            (Some(e), OpKind::Bind | OpKind::Unbind) => e.binding_steps(kind),
        };
        let steps = steps
            .iter()
            .map(OpStep::try_from)
            .collect::<Result<_, _>>()?;
        Ok(Self::with_steps(entry, kind, steps))
    }

    /// The plan of a new operation of `kind` on a resource of plan `entry` that runs `steps`
    /// (none, or those a teardown left behind) instead of the configured ones.
    pub fn with_steps(entry: Option<&PlanEntry>, kind: OpKind, steps: Vec<OpStep>) -> Self {
        let binding = match kind {
            OpKind::Bind => entry.and_then(|e| e.blueprint.binding.as_ref()),
            OpKind::Provision
            | OpKind::Update
            | OpKind::Upgrade
            | OpKind::Deprovision
            | OpKind::Unbind => None,
        };
        let credentials = binding.map(|b| b.credentials.clone());
        let expiry = binding
            .and_then(|b| b.rotation.clone())
            .filter(|r| r.lifetime.is_some());
        let dashboard_url = match kind {
            OpKind::Provision | OpKind::Update | OpKind::Upgrade => {
                entry.and_then(|e| e.blueprint.instance.dashboard_url.clone())
            }
            OpKind::Deprovision | OpKind::Bind | OpKind::Unbind => None,
        };
        Self {
            steps,
            credentials,
            dashboard_url,
            expiry,
            reason: None,
        }
    }
}

/// A blueprint step the engine cannot run. Loading refuses such steps, so a loaded
/// configuration never gives one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("step '{0}' has no action (`delay`, `run` or `target`)")]
pub struct PlanError(pub String);

/// One step of an operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpStep {
    /// Its name in the blueprint, unique within its list.
    pub name: String,
    /// What it does.
    #[serde(flatten)]
    pub action: Action,
    /// Registry keys it adds when it finishes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<String>,
    /// A failure of this step never fails the operation; it is skipped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// An expression; the step runs only when it is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// In deprovision and unbind, how long it may keep asking to be retried before it is
    /// skipped.
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub budget: Option<Duration>,
}

impl OpStep {
    /// The target it acts on, for a `target` step.
    pub fn target(&self) -> Option<&TargetAction> {
        match &self.action {
            Action::Target(target) => Some(target),
            Action::Delay { .. } | Action::Run { .. } => None,
        }
    }
}

/// What a step does: exactly one action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Action {
    /// Wait this long, without holding a worker.
    Delay {
        /// How long.
        #[serde(with = "duration")]
        delay: Duration,
    },
    /// Run a step kind compiled into the broker.
    Run {
        /// The step kind's name.
        run: String,
        /// Its arguments, a template tree.
        #[serde(default, skip_serializing_if = "Value::is_null")]
        with: Value,
    },
    /// Create or delete rendered resources on a target.
    Target(TargetAction),
}

/// A `target` step: what it renders, where, and what it waits for and reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetAction {
    /// The configured target, or the kind of target on `server`.
    pub target: String,
    /// The server a target without an admin URL administers (a template tree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<Value>,
    /// The template trees it applies or deletes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub templates: Vec<Value>,
    /// Checks that must pass before it is done (template trees).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readiness: Vec<Value>,
    /// Values read from live objects once it is ready (template trees).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read: Vec<Value>,
    /// For a binding: where the bind's credentials are also written (`{name: …}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<Value>,
}

impl TryFrom<&Step> for OpStep {
    type Error = PlanError;

    fn try_from(step: &Step) -> Result<Self, PlanError> {
        let action = if let Some(target) = &step.target {
            Action::Target(TargetAction {
                target: target.clone(),
                server: step.server.clone(),
                templates: step.templates.clone(),
                readiness: step.readiness.clone(),
                read: step.read.clone(),
                secret: step.secret.clone(),
            })
        } else if let Some(run) = &step.run {
            Action::Run {
                run: run.clone(),
                with: step.with.clone(),
            }
        } else if let Some(delay) = step.delay {
            Action::Delay { delay }
        } else {
            return Err(PlanError(step.name.clone()));
        };
        Ok(Self {
            name: step.name.clone(),
            action,
            outputs: step.outputs.clone(),
            optional: step.optional,
            when: step.when.clone(),
            budget: step.budget,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn steps_are_stored_in_the_blueprint_spelling() {
        let stored = [
            json!({"name": "wait", "delay": "10ms"}),
            json!({"name": "call", "run": "http", "with": {"url": "u"}, "outputs": ["id"]}),
            json!({"name": "db", "target": "pg", "templates": [{"kind": "Database"}],
                   "secret": {"name": "s"}, "optional": true, "budget": "1m"}),
        ];
        for json in stored {
            let step: OpStep = serde_json::from_value(json.clone()).unwrap();
            assert_eq!(serde_json::to_value(&step).unwrap(), json);
        }
    }

    #[test]
    fn a_stored_step_reads_back_with_its_action() {
        let step: OpStep = serde_json::from_value(
            json!({"name": "db", "on": ["provision"], "target": "pg", "read": [{"k": 1}]}),
        )
        .unwrap();
        let target = step.target().expect("a target step");
        assert_eq!(target.target, "pg");
        assert_eq!(target.read, [json!({"k": 1})]);
        let wait: OpStep = serde_json::from_value(json!({"name": "w", "delay": "2s"})).unwrap();
        assert_eq!(
            wait.action,
            Action::Delay {
                delay: Duration::from_secs(2)
            }
        );
    }

    #[test]
    fn a_blueprint_step_without_an_action_is_refused() {
        let step: Step = serde_json::from_value(json!({"name": "nothing"})).unwrap();
        assert_eq!(
            OpStep::try_from(&step).unwrap_err().to_string(),
            "step 'nothing' has no action (`delay`, `run` or `target`)"
        );
    }
}
