//! Steps a deprovision or unbind left behind, and the janitor that retries them.
//!
//! Teardown never blocks on one step: a step that keeps failing past its budget is skipped and
//! the operation succeeds. What it would have removed is still there, so the step is recorded
//! as an [`Orphan`] — with a copy of what its templates see, since the resource's tombstone is
//! purged after the retention period — and named in the operation's description and a WARN log
//! line. The janitor, part of the engine's worker, claims due orphans with a lease (so replicas
//! sharing a PostgreSQL store never run one twice at the same time), runs the step again, and
//! forgets it once done; a failure is recorded with its reason and retried after a wait that
//! doubles from [`EngineOptions::orphan_backoff`] up to [`EngineOptions::orphan_backoff_max`].

use std::time::Duration;

use tracing::{Instrument, info, info_span, warn};

use super::engine::{Engine, EngineOptions, ms};
use super::steps::Outcome;
use crate::clock::now_ms;
use crate::metrics::{JanitorLabels, OrphanLabels};
use crate::model::{Key, OpPlan, OpStep, Operation, Orphan, OrphanContext, Resource, ResourceCopy};
use crate::store::StoreError;

/// Most orphans one sweep claims.
const SWEEP_BATCH: i64 = 32;

/// Most orphans listed for one resource's description.
const DESCRIBED: i64 = 100;

impl Engine {
    /// Records that `op` skipped `step` of `r` for `reason`, for the janitor to retry.
    pub(super) async fn leave_behind(
        &self,
        r: &Resource,
        op: &Operation,
        step: &OpStep,
        reason: &str,
    ) -> Result<(), StoreError> {
        let instance = match &r.key.binding_id {
            None => None,
            Some(_) => {
                let key = Key::instance(&r.key.instance_id);
                self.inner
                    .store
                    .get(&key)
                    .await?
                    .map(|i| ResourceCopy::of(&i))
            }
        };
        let now = now_ms();
        let orphan = Orphan {
            id: uuid::Uuid::new_v4().to_string(),
            key: r.key.clone(),
            resource_created_at: r.created_at,
            op_kind: op.kind,
            op_id: op.id.clone(),
            step: step.clone(),
            context: Some(OrphanContext {
                resource: ResourceCopy::of(r),
                instance,
            }),
            since: now,
            attempts: 0,
            last_error: reason.to_owned(),
            next_attempt_at: now + ms(self.inner.options.orphan_backoff),
        };
        self.inner.store.record_orphan(&orphan).await?;
        warn!(
            kind = op.kind.as_str(),
            step = %step.name,
            target = step.target().map_or("", |t| t.target.as_str()),
            %reason,
            "left behind: {}; retried in the background",
            leftover(step, reason)
        );
        Ok(())
    }

    /// The description of a deprovision or unbind of `r` that ends now: `done`, followed by
    /// what it left behind, if anything.
    pub(super) async fn left_behind_description(
        &self,
        r: &Resource,
        done: &str,
    ) -> Result<String, StoreError> {
        // A step this operation leaves behind is recorded in its outputs before it is an
        // orphan: without one there, there is nothing to look up.
        if r.outputs.skipped.as_ref().is_none_or(|s| s.op != r.op.id) {
            return Ok(done.to_owned());
        }
        let orphans = self
            .inner
            .store
            .list_orphans(Some(&r.key), DESCRIBED)
            .await?;
        let left: Vec<String> = orphans
            .iter()
            .filter(|o| o.op_id == r.op.id)
            .map(|o| leftover(&o.step, &o.last_error))
            .collect();
        Ok(match left.is_empty() {
            true => done.to_owned(),
            false => format!(
                "{done}; left behind: {}; retried in the background",
                left.join(", ")
            ),
        })
    }

    /// The steps a finished deprovision or unbind of `r` skipped that are still left behind:
    /// what repeating it would run again.
    pub async fn steps_left_behind(&self, r: &Resource) -> Result<Vec<OpStep>, StoreError> {
        let skipped = r.outputs.skipped_steps();
        if skipped.is_empty() {
            return Ok(Vec::new());
        }
        let orphans = self
            .inner
            .store
            .list_orphans(Some(&r.key), DESCRIBED)
            .await?;
        Ok(skipped
            .iter()
            .filter(|s| {
                orphans
                    .iter()
                    .any(|o| o.resource_created_at == r.created_at && o.step.name == s.name)
            })
            .cloned()
            .collect())
    }

    /// Claims the orphans that are due and tries each once, then refreshes the orphan gauge.
    pub(super) async fn sweep_orphans(&self) {
        let inner = &self.inner;
        let lease_until = self.lease_until(now_ms());
        match (inner.store)
            .claim_orphans(&inner.owner, lease_until, SWEEP_BATCH)
            .await
        {
            Ok(orphans) => {
                for orphan in orphans {
                    let span = info_span!("janitor", instance_id = %orphan.key.instance_id,
                        binding_id = orphan.key.binding_id.as_deref().unwrap_or(""),
                        kind = orphan.op_kind.as_str(), step = %orphan.step.name);
                    let engine = self.clone();
                    inner
                        .tasks
                        .spawn(async move { engine.attempt(orphan).await }.instrument(span));
                }
            }
            Err(e) => warn!(error = %e, "cannot claim steps left behind"),
        }
        match inner.store.count_orphans().await {
            Ok(counts) => {
                let gauge = &inner.metrics.orphans;
                gauge.clear();
                for (kind, step, n) in counts {
                    let labels = OrphanLabels {
                        kind: kind.as_str().to_owned(),
                        step,
                    };
                    gauge.get_or_create(&labels).set(n);
                }
            }
            Err(e) => warn!(error = %e, "cannot count steps left behind"),
        }
    }

    /// Runs a claimed orphan's step once; forgets the orphan when it is done, else records
    /// why not and when to try again.
    async fn attempt(&self, orphan: Orphan) {
        let inner = &self.inner;
        let result = match &orphan.context {
            Some(context) => self.rerun(&orphan, context).await,
            None => Ok(Attempt::NotDone("its context was not read".to_owned())),
        };
        let owner = inner.owner.as_str();
        let (result, saved) = match result {
            Ok(Attempt::Done) => {
                info!("a step left behind is done at last");
                (
                    "resolved",
                    inner.store.remove_orphan(&orphan.id, owner).await,
                )
            }
            Ok(Attempt::NotDone(reason)) => {
                let wait = backoff(&inner.options, orphan.attempts);
                info!(attempts = orphan.attempts + 1, %reason, retry_in = ?wait,
                    "a step left behind failed again");
                let next = now_ms() + ms(wait);
                let saved = (inner.store)
                    .orphan_failed(&orphan.id, owner, &reason, next)
                    .await;
                ("failed", saved)
            }
            Err(e) => {
                // Its lease runs out and another sweep tries it.
                warn!(error = %e, "cannot retry a step left behind");
                ("error", Ok(()))
            }
        };
        if let Err(e) = saved {
            warn!(error = %e, "cannot record an attempt at a step left behind");
        }
        let labels = JanitorLabels {
            result: result.to_owned(),
        };
        inner.metrics.janitor_attempts.get_or_create(&labels).inc();
    }

    /// Runs an orphan's step against the copy of its resource.
    async fn rerun(&self, orphan: &Orphan, context: &OrphanContext) -> Result<Attempt, StoreError> {
        let inner = &self.inner;
        let plan = OpPlan {
            steps: vec![orphan.step.clone()],
            ..OpPlan::default()
        };
        let deadline = ms(inner.options.lease);
        let op = Operation::new(orphan.op_kind, plan, None, deadline, &inner.owner, 0);
        let resource = restore(&orphan.key, &context.resource, orphan, op.clone());
        let instance = (context.instance.as_ref()).map(|i| {
            let key = Key::instance(&orphan.key.instance_id);
            restore(&key, i, orphan, op.clone())
        });
        let outcome = self
            .run_step(
                &resource,
                &op,
                &orphan.step,
                orphan.since,
                now_ms(),
                instance.as_ref(),
            )
            .await?;
        Ok(match outcome {
            Outcome::Done(_) | Outcome::Skip(_) => Attempt::Done,
            Outcome::RetryAfter(_, reason) => {
                Attempt::NotDone(reason.unwrap_or_else(|| "not done yet".into()))
            }
            Outcome::Fail(reason) => Attempt::NotDone(reason.to_string()),
        })
    }
}

/// What one more attempt at a step left behind gave.
enum Attempt {
    /// It is done at last.
    Done,
    /// Not yet, for this reason (never a secret).
    NotDone(String),
}

/// How an orphaned step is named to users: the step, its target, and why it was left.
fn leftover(step: &OpStep, reason: &str) -> String {
    match step.target() {
        Some(action) => {
            let target = &action.target;
            format!("step '{}' on target {target} ({reason})", step.name)
        }
        None => format!("step '{}' ({reason})", step.name),
    }
}

/// The wait before the attempt after `attempts` failed ones.
fn backoff(options: &EngineOptions, attempts: i64) -> Duration {
    let doublings = u32::try_from(attempts.clamp(0, 30)).unwrap_or(30);
    let wait = options.orphan_backoff.saturating_mul(1 << doublings);
    wait.min(options.orphan_backoff_max)
}

/// A deleted resource rebuilt from its copy, for templates.
fn restore(key: &Key, copy: &ResourceCopy, orphan: &Orphan, op: Operation) -> Resource {
    let mut r = Resource::new(
        key.clone(),
        &copy.service_id,
        &copy.plan_id,
        copy.attrs.clone(),
        op,
    );
    r.outputs = copy.outputs.clone();
    r.status = crate::model::Status::Deleted;
    r.created_at = orphan.resource_created_at;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_up_to_its_cap() {
        let options = EngineOptions {
            orphan_backoff: Duration::from_secs(60),
            orphan_backoff_max: Duration::from_secs(3600),
            ..EngineOptions::default()
        };
        let waits: Vec<u64> = (0..8).map(|n| backoff(&options, n).as_secs()).collect();
        assert_eq!(waits, [60, 120, 240, 480, 960, 1920, 3600, 3600]);
        assert_eq!(backoff(&options, i64::MAX).as_secs(), 3600);
    }
}
