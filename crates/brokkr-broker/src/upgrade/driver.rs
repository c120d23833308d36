//! The loop that drives fleet upgrades, which every broker runs: each turn it leases the running
//! and paused orchestrations no other live broker holds (renewing its own), follows their
//! upgrades in progress (a cancelled one's too), starts pending ones as `max_parallel`, the
//! canary wave and `max_failures` allow, and ends an orchestration once every instance is done,
//! or once it must stop and the upgrades under way have ended. A broker that dies leaves its lease to expire; another (or it, restarted) carries on
//! from what the store says.

use std::sync::Arc;
use std::time::Duration;

use brokkr_engine::{ItemState, Orchestration, OrchestrationState, StoreError, UpgradeItem};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::instance::advance;
use crate::broker::Broker;
use crate::error::ApiError;

/// How often the loop takes a turn.
const TURN: Duration = Duration::from_millis(500);

/// Starts the loop; it runs until the task is aborted.
pub fn spawn(broker: Arc<Broker>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if let Err(e) = turn(&broker).await {
                warn!(error = %e.body.description.unwrap_or_default(), "fleet upgrades: turn failed");
            }
            tokio::time::sleep(TURN).await;
        }
    })
}

/// One turn over every orchestration this broker holds.
async fn turn(broker: &Broker) -> Result<(), ApiError> {
    let engine = &broker.engine;
    let lease_until = brokkr_engine::now_ms() + engine.lease_ms();
    let ids = (engine.store())
        .claim_orchestrations(engine.owner(), lease_until)
        .await?;
    for id in ids {
        drive(broker, &id).await?;
    }
    Ok(())
}

/// What an orchestration's instances have come to.
#[derive(Default)]
struct Tally {
    running: i64,
    failed: i64,
    open: i64,
    canary_failed: Option<String>,
    canaries_done: bool,
}

fn tally(o: &Orchestration, items: &[UpgradeItem]) -> Tally {
    let mut t = Tally {
        canaries_done: true,
        ..Tally::default()
    };
    for item in items {
        let canary = item.position < o.canary;
        match item.state {
            ItemState::InProgress => t.running += 1,
            ItemState::Failed => t.failed += 1,
            ItemState::Pending | ItemState::Succeeded => {}
        }
        if matches!(item.state, ItemState::Pending | ItemState::InProgress) {
            t.open += 1;
        }
        if canary && item.state != ItemState::Succeeded {
            t.canaries_done = false;
        }
        if canary && item.state == ItemState::Failed && t.canary_failed.is_none() {
            t.canary_failed = Some(item.instance_id.clone());
        }
    }
    t
}

/// Why `o` must stop now, if it must.
fn must_stop(o: &Orchestration, t: &Tally) -> Option<String> {
    if let Some(instance) = &t.canary_failed {
        return Some(format!("the upgrade of canary instance {instance} failed"));
    }
    (t.failed >= o.max_failures).then(|| {
        format!(
            "{} instances failed to upgrade (max_failures {})",
            t.failed, o.max_failures
        )
    })
}

/// Saves `item` unless this broker lost the orchestration; returns whether it still holds it.
async fn save(broker: &Broker, o: &Orchestration, item: &UpgradeItem) -> Result<bool, StoreError> {
    let owner = broker.engine.owner();
    broker
        .engine
        .store()
        .save_upgrade_item(&o.id, owner, item)
        .await
}

/// One turn of orchestration `id`.
async fn drive(broker: &Broker, id: &str) -> Result<(), ApiError> {
    let store = broker.engine.store();
    let Some((o, mut items)) = store.orchestration(id).await? else {
        return Ok(());
    };
    let cancelled = o.state == OrchestrationState::Cancelled;
    if o.state.is_final() && !cancelled {
        return Ok(());
    }
    // Upgrades under way are followed even while paused.
    for item in items
        .iter_mut()
        .filter(|i| i.state == ItemState::InProgress)
    {
        if let Some(next) = advance(broker, &o, item).await? {
            if !save(broker, &o, &next).await? {
                return Ok(());
            }
            *item = next;
        }
    }
    if cancelled {
        return Ok(());
    }
    let mut t = tally(&o, &items);
    if o.state == OrchestrationState::Running && must_stop(&o, &t).is_none() {
        for n in 0..items.len() {
            let item = &items[n];
            if item.state != ItemState::Pending {
                continue;
            }
            // The canaries first, all of them succeeded before any other starts.
            let wave_open = item.position < o.canary || t.canaries_done;
            if !wave_open || t.running >= o.max_parallel {
                continue;
            }
            let Some(next) = advance(broker, &o, item).await? else {
                continue;
            };
            if !save(broker, &o, &next).await? {
                return Ok(());
            }
            items[n] = next;
            t = tally(&o, &items);
            if must_stop(&o, &t).is_some() {
                break;
            }
        }
    }
    let active = [OrchestrationState::Running, OrchestrationState::Paused];
    let (end, why) = match (must_stop(&o, &t), t.open) {
        // Stopped: it ends once the upgrades under way have.
        (Some(_), _) if t.running > 0 => return Ok(()),
        (Some(why), _) => (OrchestrationState::Failed, why),
        (None, 0) if t.failed > 0 => (
            OrchestrationState::Failed,
            format!(
                "{} of {} instances failed to upgrade",
                t.failed,
                items.len()
            ),
        ),
        (None, 0) => (
            OrchestrationState::Succeeded,
            format!("{} instances at {}", items.len(), o.target_version),
        ),
        (None, _) => return Ok(()),
    };
    if store
        .set_orchestration_state(id, &active, end, Some(&why))
        .await?
    {
        info!(upgrade = id, state = end.as_str(), reason = %why, "fleet upgrade ended");
    }
    Ok(())
}
