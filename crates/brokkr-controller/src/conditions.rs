//! Setting a resource's conditions the way Kubernetes expects: one per type, and a transition
//! time that changes only when the status does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::resources::{Condition, ConditionStatus};

/// Sets the condition `type_` in `conditions`, keeping its `lastTransitionTime` when its status
/// does not change.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: impl Into<String>,
) {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let new = Condition {
        type_: type_.to_owned(),
        status,
        last_transition_time: Some(now),
        reason: reason.to_owned(),
        message: message.into(),
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(old) => {
            let since = if old.status == status {
                old.last_transition_time.clone()
            } else {
                new.last_transition_time.clone()
            };
            *old = Condition {
                last_transition_time: since,
                ..new
            };
        }
        None => conditions.push(new),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let mut conditions = Vec::new();
        set(
            &mut conditions,
            "Ready",
            ConditionStatus::False,
            "Waiting",
            "first",
        );
        let first = conditions[0].last_transition_time.clone();
        std::thread::sleep(std::time::Duration::from_millis(5));
        set(
            &mut conditions,
            "Ready",
            ConditionStatus::False,
            "StillWaiting",
            "second",
        );
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].reason, "StillWaiting");
        assert_eq!(conditions[0].last_transition_time, first);
        set(
            &mut conditions,
            "Ready",
            ConditionStatus::True,
            "Done",
            "third",
        );
        assert_ne!(conditions[0].last_transition_time, first);
        set(
            &mut conditions,
            "Failed",
            ConditionStatus::True,
            "Broken",
            "",
        );
        assert_eq!(conditions.len(), 2);
    }
}
