//! Revoking expired credentials: a binding of a plan whose rotation says `revoke_expired`, past
//! its `expires_at` and not rotated away by its platform, is unbound by the broker itself.
//!
//! Every tick of [`spawn`]'s loop runs [`sweep`]: it asks the store for such bindings (an
//! indexed query, at most [`SWEEP_LIMIT`] of them) and starts on each an ordinary unbind — the
//! plan's unbind steps, as for a platform's DELETE — with the store's compare-and-set on the
//! binding's current operation. So replicas sharing a store, sweeping the same binding, unbind it
//! once: only the one whose start wins runs it. Nothing is kept in memory between ticks: after a
//! restart the next tick finds what is still due.

use std::time::Duration;

use brokkr_blueprint::Config;
use brokkr_engine::{Key, OpKind, Status, StoreError};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tracing::{info, warn};

use crate::bindings::osb_timestamp;
use crate::broker::{AppState, Broker};
use crate::error::ApiError;
use crate::operations::{launch, teardown};

/// Most bindings one sweep revokes: the rest wait for the next tick.
pub const SWEEP_LIMIT: i64 = 100;

/// Sweeps every `interval` (longer than zero) until the task is aborted; a failed sweep is
/// logged and the next tick tries again.
pub fn spawn(broker: AppState, interval: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Err(e) = sweep(&broker).await {
                warn!(error = %e, "cannot look for bindings whose credentials expired");
            }
        }
    })
}

/// The ids of the plans whose bindings' credentials are revoked once expired (`rotation` with
/// `revoke_expired` and a `lifetime`).
pub(crate) fn revoking_plans(config: &Config) -> Vec<String> {
    config
        .plans()
        .filter(|entry| {
            let binding = entry.blueprint.binding.as_ref();
            binding
                .and_then(|b| b.rotation.as_ref())
                .is_some_and(|r| r.revoke_expired && r.lifetime.is_some())
        })
        .map(|entry| entry.plan.id.clone())
        .collect()
}

/// Starts the unbind of up to [`SWEEP_LIMIT`] bindings whose credentials expired, of the
/// plans that revoke them; returns how many this broker started (another replica, or a
/// platform's request, may win some of them).
pub async fn sweep(broker: &Broker) -> Result<usize, StoreError> {
    let plans = revoking_plans(&broker.config());
    if plans.is_empty() {
        return Ok(0);
    }
    let now = brokkr_engine::now_ms();
    let store = broker.engine.store();
    let mut started = 0;
    for key in store.expired_bindings(&plans, now, SWEEP_LIMIT).await? {
        match revoke(broker, &key, now).await {
            Ok(true) => started += 1,
            Ok(false) => {}
            Err(e) => warn!(
                instance_id = key.instance_id,
                binding_id = key.binding_id,
                error = e.body.description.as_deref().unwrap_or_default(),
                "cannot revoke a binding whose credentials expired"
            ),
        }
    }
    Ok(started)
}

/// Starts the unbind of binding `key` if its credentials expired by `now` and nothing else
/// changed it since it was found; returns whether this broker started it.
async fn revoke(broker: &Broker, key: &Key, now: i64) -> Result<bool, ApiError> {
    let store = broker.engine.store();
    // The store's column is a copy: the binding itself says whether it is still due.
    let Some(current) = store.get(key).await? else {
        return Ok(false);
    };
    let Some(expires_at) = current.outputs.expires_at.filter(|at| *at <= now) else {
        return Ok(false);
    };
    if current.status != Status::Ready || current.op.in_progress() {
        return Ok(false);
    }
    let expired = osb_timestamp(expires_at);
    let (mut op, status) = teardown(broker, &current, OpKind::Unbind, Vec::new(), true)?;
    op.plan.reason = Some(format!("the credentials expired at {expired}"));
    let Some(started) = store.start(key, &current.op.id, &op, status).await? else {
        return Ok(false); // another replica, or a platform's request, changed it first
    };
    info!(
        instance_id = key.instance_id,
        binding_id = key.binding_id,
        expires_at = expired,
        operation = op.id,
        "revoking a binding whose credentials expired"
    );
    broker.metrics.revoked.inc();
    launch(broker, &started).await?;
    Ok(true)
}
