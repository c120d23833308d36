//! Why an operation fails or a step does not finish: typed reasons whose text is what the
//! operation's description, its events and the logs tell the user. None carries a secret:
//! template errors name the template and the function at fault, never a value.

use std::time::Duration;

use brokkr_blueprint::evaluate::EvaluationError;

use crate::model::OpKind;
use crate::store::StoreError;

/// Why an operation ends failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(super) enum Failure {
    /// It ran past its deadline.
    #[error("{} timed out {}{}", kind.as_str(), match step {
        Some(step) => format!("in step '{step}'"),
        None => "while finishing".to_owned(),
    }, match waiting {
        Some(waiting) => format!(": {waiting}"),
        None => String::new(),
    })]
    TimedOut {
        /// The operation's kind.
        kind: OpKind,
        /// The step it was in, if any.
        step: Option<String>,
        /// What that step was still waiting for when time ran out, if it said.
        waiting: Option<String>,
    },
    /// One of its steps failed.
    #[error("step '{step}' failed: {reason}")]
    Step {
        /// The step's name.
        step: String,
        /// Why.
        reason: StepFailure,
    },
    /// A bind whose instance was deleted, or never became ready, meanwhile.
    #[error("the instance no longer exists")]
    InstanceGone,
    /// A bind's credentials do not render, or break the servicebinding.io rules.
    #[error("{0}")]
    Credentials(EvaluationError),
    /// A bind's credentials could not be published where a step says.
    #[error("step '{step}': {reason}")]
    Publish {
        /// The step with `secret`.
        step: String,
        /// Why.
        reason: String,
    },
}

/// Why a step fails.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(super) enum StepFailure {
    /// Its `when` does not evaluate.
    #[error("condition: {0}")]
    Condition(EvaluationError),
    /// `run:` names a step kind this broker does not have.
    #[error("no step kind named {0:?} is compiled into this broker")]
    UnknownKind(String),
    /// Its `with:` arguments, or its templates, do not render.
    #[error("{0}")]
    Render(String),
    /// It produced registry values it does not declare in `outputs`.
    #[error(
        "produced registry values the step does not declare in `outputs`: {}",
        .0.join(", ")
    )]
    Undeclared(Vec<String>),
    /// The instance's dashboard URL, evaluated with what it produced, does not render or is
    /// not an absolute http(s) URL.
    #[error("{0}")]
    DashboardUrl(EvaluationError),
    /// Its step kind panicked.
    #[error("panicked: {0}")]
    Panicked(String),
    /// Its step kind or its target refused it (the reason is theirs).
    #[error("{0}")]
    Refused(String),
    /// It kept asking to be retried past its budget.
    #[error("gave up after {}: {last}", budget_text(*.budget))]
    GaveUp {
        /// Its budget.
        budget: Duration,
        /// Why it last waited.
        last: String,
    },
}

/// Why a step is skipped and the operation goes on without it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(super) enum Skip {
    /// Its `when` is false.
    #[error("its condition is false")]
    ConditionFalse,
    /// It failed, and it is optional or part of a deprovision or unbind.
    #[error("failed: {0}")]
    Failed(StepFailure),
    /// A deprovision or unbind step kept asking to be retried past its budget.
    #[error("gave up after {}: {last}", budget_text(*.budget))]
    GaveUp {
        /// Its budget.
        budget: Duration,
        /// Why it last waited.
        last: String,
    },
}

/// Why the engine stops working on an operation: the store failed (the operation stays as it
/// is, for this engine or another to pick up), or the operation cannot succeed.
#[derive(Debug, thiserror::Error)]
pub(super) enum RunError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The operation, or the step, cannot succeed.
    #[error(transparent)]
    Failed(#[from] Failure),
}

/// A budget as blueprints write it: `5m` is `300s`, `1500ms` stays.
fn budget_text(d: Duration) -> String {
    if d.as_millis().is_multiple_of(1000) {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_read_as_the_operation_describes_them() {
        let timed_out = Failure::TimedOut {
            kind: OpKind::Provision,
            step: Some("db".into()),
            waiting: None,
        };
        assert_eq!(timed_out.to_string(), "provision timed out in step 'db'");
        let waiting = Failure::TimedOut {
            kind: OpKind::Provision,
            step: Some("db".into()),
            waiting: Some("waiting for StatefulSet pg to be ready (0/1)".into()),
        };
        assert_eq!(
            waiting.to_string(),
            "provision timed out in step 'db': waiting for StatefulSet pg to be ready (0/1)"
        );
        let finishing = Failure::TimedOut {
            kind: OpKind::Bind,
            step: None,
            waiting: None,
        };
        assert_eq!(finishing.to_string(), "bind timed out while finishing");
        let gave_up = Failure::Step {
            step: "db".into(),
            reason: StepFailure::GaveUp {
                budget: Duration::from_millis(1500),
                last: "not ready".into(),
            },
        };
        assert_eq!(
            gave_up.to_string(),
            "step 'db' failed: gave up after 1500ms: not ready"
        );
        let undeclared = StepFailure::Undeclared(vec!["a".into(), "b".into()]);
        assert_eq!(
            undeclared.to_string(),
            "produced registry values the step does not declare in `outputs`: a, b"
        );
    }
}
