//! The binding's status: its conditions, `observedGeneration` and `.status.binding`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use crate::resources::LocalObjectReference;
use crate::resources::servicebinding_io::{ServiceBinding, ServiceBindingStatus};
use crate::workloads::Error;

/// One condition to set.
pub(super) struct Observed {
    pub type_: &'static str,
    pub ok: Option<bool>,
    pub reason: &'static str,
    pub message: String,
}

pub(super) async fn write_status(
    api: &Api<ServiceBinding>,
    binding: &ServiceBinding,
    secret: Option<LocalObjectReference>,
    observed: Vec<Observed>,
) -> Result<(), Error> {
    let old = binding.status.clone().unwrap_or_default();
    let now = Time(Timestamp::now());
    let generation = binding.metadata.generation;
    let conditions = observed
        .into_iter()
        .map(|o| {
            let status = match o.ok {
                Some(true) => "True",
                Some(false) => "False",
                None => "Unknown",
            };
            let since = old
                .conditions
                .iter()
                .find(|c| c.type_ == o.type_ && c.status == status)
                .map_or(now.clone(), |c| c.last_transition_time.clone());
            Condition {
                type_: o.type_.into(),
                status: status.into(),
                reason: o.reason.into(),
                message: o.message,
                last_transition_time: since,
                observed_generation: generation,
            }
        })
        .collect();
    let status = ServiceBindingStatus {
        binding: secret.or(old.binding.clone()),
        conditions,
        observed_generation: generation,
    };
    if status == old {
        return Ok(());
    }
    api.patch_status(
        &binding.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await?;
    Ok(())
}
