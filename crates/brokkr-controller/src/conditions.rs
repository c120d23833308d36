//! Setting a resource's conditions the way Kubernetes expects: one per type, and a transition
//! time that changes only when the status does; a message is cut at [`MAX_MESSAGE`] characters,
//! whatever it holds (a broker's texts are cut shorter where its answers come in, but a message
//! may hold several, or names a broker chose).

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::resources::{Condition, ConditionStatus};

/// The most characters of a condition's message.
pub const MAX_MESSAGE: usize = 4096;

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
    let mut message = message.into();
    if let Cow::Owned(cut) = brokkr_osb::client::clipped(&message, MAX_MESSAGE) {
        message = cut;
    }
    let new = Condition {
        type_: type_.to_owned(),
        status,
        last_transition_time: Some(now),
        reason: reason.to_owned(),
        message,
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

/// Whether `conditions` hold the condition `type_` with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    (conditions.iter()).any(|c| c.type_ == type_ && c.status == ConditionStatus::True)
}

/// Whether `condition` holds `message` as [`set`] writes it.
pub fn says(condition: &Condition, message: &str) -> bool {
    condition.message == brokkr_osb::client::clipped(message, MAX_MESSAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_cut_and_still_reads_as_said() {
        let mut conditions = Vec::new();
        let long = "é".repeat(1_000_000);
        set(
            &mut conditions,
            "Ready",
            ConditionStatus::False,
            "Failed",
            long.clone(),
        );
        assert_eq!(conditions[0].message.chars().count(), MAX_MESSAGE + 1);
        assert!(conditions[0].message.ends_with("é…"));
        assert!(says(&conditions[0], &long));
        assert!(!says(&conditions[0], "other"));
    }

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
