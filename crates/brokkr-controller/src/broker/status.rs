//! What the broker controller writes into a broker's status, and when its catalog is due.

use std::time::Duration;

use kube::ResourceExt as _;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use serde_json::json;

use crate::broker_kind::BrokerKind;
use crate::conditions;
use crate::context::Context;
use crate::error::Error;
use crate::resources::{ConditionStatus, RelistBehavior, ServiceBrokerStatus};

/// How often a catalog is listed again when the broker does not say.
pub(super) const DEFAULT_RELIST_DURATION: Duration = Duration::from_secs(15 * 60);

/// Writes `Ready=False` with `reason` and `message` into the broker's status.
pub(super) async fn write_failure<B: BrokerKind>(
    broker: &B,
    ctx: &Context,
    reason: &'static str,
    message: String,
) -> Result<(), Error> {
    let mut status = broker.broker_status().cloned().unwrap_or_default();
    status.observed_generation = broker.meta().generation.unwrap_or_default();
    conditions::set(
        &mut status.conditions,
        "Ready",
        ConditionStatus::False,
        reason,
        message,
    );
    status.last_condition_state = reason.into();
    patch_status(broker, ctx, &status).await
}

pub(super) async fn patch_status<B: BrokerKind>(
    broker: &B,
    ctx: &Context,
    status: &ServiceBrokerStatus,
) -> Result<(), Error> {
    // A status as it was is not written again: a broker refused the same way at each look
    // (its namespace's bounds, say) costs no write, and wakes nothing.
    if broker.broker_status() == Some(status) {
        return Ok(());
    }
    broker
        .broker_api(&ctx.client)
        .patch_status(
            &broker.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await?;
    Ok(())
}

/// When the broker's catalog was listed for its current spec and the next relist is not due
/// yet: what to wait for.
pub(super) fn not_due<B: BrokerKind>(broker: &B) -> Option<Action> {
    let status = broker.broker_status()?;
    let ready = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == ConditionStatus::True);
    if !ready || status.reconciled_generation != broker.meta().generation.unwrap_or_default() {
        return None;
    }
    let common = broker.common();
    match common.relist_behavior {
        RelistBehavior::Manual => Some(Action::await_change()),
        RelistBehavior::Duration => {
            let every = common
                .relist_duration
                .map_or(DEFAULT_RELIST_DURATION, Duration::from);
            let last = status.last_catalog_retrieval_time.as_ref()?.0;
            let since = k8s_openapi::jiff::Timestamp::now().duration_since(last);
            let left = every.checked_sub(since.try_into().ok()?)?;
            (!left.is_zero()).then(|| Action::requeue(left))
        }
    }
}
