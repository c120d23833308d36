//! A usage's status: its `Ready` condition and `status.injected`, the workload and mapping an
//! injection used.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};

use crate::resources::{
    ConditionStatus, InjectedTarget, ServiceBindingUsage, ServiceBindingUsageStatus, UsageCondition,
};
use crate::workloads::Error;

/// Where a usage stands, for its `Ready` condition.
pub(super) struct Outcome {
    pub status: ConditionStatus,
    pub reason: &'static str,
    pub message: String,
}

pub(super) fn waiting(reason: &'static str, message: String) -> Outcome {
    Outcome {
        status: ConditionStatus::False,
        reason,
        message,
    }
}

/// Writes the status when anything but its times changed.
pub(super) async fn write_status(
    api: &Api<ServiceBindingUsage>,
    usage: &ServiceBindingUsage,
    mut status: ServiceBindingUsageStatus,
    outcome: Outcome,
) -> Result<(), Error> {
    let old = usage.status.clone().unwrap_or_default();
    let now = Time(Timestamp::now());
    let condition = UsageCondition {
        type_: "Ready".into(),
        status: outcome.status,
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
        reason: outcome.reason.into(),
        message: outcome.message,
    };
    match status.conditions.iter_mut().find(|c| c.type_ == "Ready") {
        Some(c) => {
            let same = c.status == condition.status;
            let since = c.last_transition_time.clone();
            *c = UsageCondition {
                last_transition_time: if same {
                    since
                } else {
                    condition.last_transition_time
                },
                ..condition
            };
        }
        None => status.conditions.push(condition),
    }
    status.observed_generation = usage.metadata.generation;
    let unchanged = |s: &ServiceBindingUsageStatus| {
        let mut s = s.clone();
        s.last_update_time = None;
        for c in &mut s.conditions {
            c.last_update_time = None;
            c.last_transition_time = None;
        }
        s
    };
    if unchanged(&old) == unchanged(&status) {
        return Ok(());
    }
    status.last_update_time = Some(now);
    let mut value = serde_json::to_value(&status).expect("a status");
    if let Value::Object(fields) = &mut value {
        fields.insert("injected".into(), injected_patch(status.injected.as_ref()));
    }
    api.patch_status(
        &usage.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": value })),
    )
    .await?;
    Ok(())
}

/// `status.injected` for a JSON merge patch: a field the target leaves out is cleared, not kept
/// from the last one.
pub(super) fn injected_patch(target: Option<&InjectedTarget>) -> Value {
    let Some(target) = target else {
        return Value::Null;
    };
    let mut value = serde_json::to_value(target).expect("a target");
    if let Value::Object(fields) = &mut value {
        for optional in ["podTemplatePath", "annotationsPath", "containers"] {
            fields.entry(optional).or_insert(Value::Null);
        }
    }
    value
}
