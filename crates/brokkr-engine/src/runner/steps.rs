//! The step loop: runs an operation's steps in order until it ends, waits long, is superseded
//! or the engine shuts down. A step's own outcome first goes through the rules of its
//! operation (optional steps, teardown that never blocks, budgets); then each outcome — done,
//! skipped, retry after a wait, failed — has one save point, where the operation's progress (or
//! its end) is saved with a compare-and-set, and the loop stops when it no longer holds the
//! operation. Also here: running one step once, the `when`, `delay` and `run:` kinds; the
//! `target` kind is in `target_step`.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use serde_json::{Map, Value};
use tracing::{Instrument, info, info_span, warn};

use super::engine::{Engine, ms};
use super::failure::{Failure, RunError, Skip, StepFailure};
use crate::clock::now_ms;
use crate::metrics::StepLabels;
use crate::model::{Action, Key, OpKind, OpStep, Operation, Resource};
use crate::step::{StepContext, StepOutcome};
use crate::store::StoreError;

/// What the runner does after a step.
pub(super) enum Outcome {
    /// Finished, perhaps with values for the registry.
    Done(Option<Map<String, Value>>),
    /// Run again after the wait; the reason, if any, is shown to the user.
    RetryAfter(Duration, Option<String>),
    /// Failed, and the operation with it.
    Fail(StepFailure),
    /// Go on without it (condition false, optional step failed, non-blocking budget spent).
    Skip(Skip),
}

/// What a finished step leaves: the registry values it produced, and the instance's dashboard
/// URL when it was learnt with them.
struct Learnt {
    /// Values for the registry.
    produced: Option<Map<String, Value>>,
    /// The dashboard URL, evaluated and checked.
    dashboard_url: Option<String>,
}

/// Default time a deprovision or unbind step may keep asking to be retried before it is skipped.
const DEFAULT_BUDGET: Duration = Duration::from_secs(300);

/// A step's request to run again later.
struct Wait {
    /// How long to wait.
    wait: Duration,
    /// Why, for the user.
    reason: Option<String>,
    /// When the step first started (ms).
    started: i64,
    /// Whether this was the first run of a new operation's first step, whose start the
    /// operation's creation committed.
    first_run: bool,
}

/// A wait shorter than this does not change the `Retry-After` a poll is answered with (at
/// least a second), so the first one of a new operation need not be saved.
const SHORT_WAIT: Duration = Duration::from_secs(1);

/// What the step loop does after an outcome's save point.
enum Next {
    /// Go round again: the next step, the same one after its wait, or the operation's end.
    Run,
    /// Stop here: the operation ended, was handed back to the worker for a long wait, or is not
    /// this engine's any more (superseded or taken over).
    Stop,
}

impl Engine {
    /// Runs the steps of `op` on `resource` from where it stands. A `new` operation (just
    /// created or started by a request here) had its first step's start committed with it.
    pub(super) async fn drive_steps(
        &self,
        resource: &mut Resource,
        op: &mut Operation,
        new: bool,
    ) -> Result<(), StoreError> {
        let inner = &self.inner;
        let mut start_committed = new && op.step_started_at.is_some();
        loop {
            let now = now_ms();
            if inner.shutdown.is_cancelled() {
                // Due now, so that another replica (announced the release) or the next start
                // takes it up at once: a step in the middle of a wait runs again sooner, a
                // `delay` waits out the rest of its time there.
                let owner = inner.owner.as_str();
                op.next_run_at = op.next_run_at.min(now);
                if inner.store.save_progress(&resource.key, op, owner).await? {
                    inner.store.release(&resource.key, &op.id, owner).await?;
                }
                return Ok(());
            }
            if now >= op.deadline_at {
                let step = op.plan.steps.get(op.step).map(|s| s.name.clone());
                let waiting = step.as_ref().and_then(|_| last_wait(op));
                let reason = Failure::TimedOut {
                    kind: op.kind,
                    step,
                    waiting,
                };
                return self.finish(resource, &op.id, Err(reason)).await;
            }
            let Some(step) = op.plan.steps.get(op.step) else {
                let outcome = match self.complete(resource).await {
                    Err(RunError::Store(e)) => return Err(e),
                    Err(RunError::Failed(reason)) => Err(reason),
                    Ok(finish) => Ok(finish),
                };
                return self.finish(resource, &op.id, outcome).await;
            };
            // True on the first run of a new operation's first step only.
            let first_run = std::mem::take(&mut start_committed);
            if op.step_started_at.is_none() || first_run {
                self.event(&op.id, "step_started", Some(&step.name), None)
                    .await;
            }
            let started = op.step_started_at.unwrap_or(now);
            let outcome = self
                .run_step(resource, op, step, started, now, None)
                .instrument(info_span!("step", step = %step.name))
                .await?;
            // What follows — the step's duration, its budget, the next run — counts from now
            // that it has run.
            let (outcome, dashboard_url) = match outcome {
                Outcome::Done(produced) => {
                    match (self.learnt_dashboard_url(resource, op, produced.as_ref())).await? {
                        Some(Err(e)) => (Outcome::Fail(StepFailure::DashboardUrl(e)), None),
                        learnt => (Outcome::Done(produced), learnt.and_then(Result::ok)),
                    }
                }
                outcome => (outcome, None),
            };
            let now = now_ms();
            let (outcome, left_behind) = settle(op.kind, step, outcome, now - started);
            let next = match outcome {
                Outcome::Done(produced) => {
                    let learnt = Learnt {
                        produced,
                        dashboard_url,
                    };
                    self.step_done(resource, op, learnt, started, now).await?
                }
                Outcome::Skip(reason) => {
                    self.step_skipped(resource, op, reason, left_behind, now)
                        .await?
                }
                Outcome::RetryAfter(wait, reason) => {
                    let wait = Wait {
                        wait,
                        reason,
                        started,
                        first_run,
                    };
                    self.step_waits(&resource.key, op, wait, now).await?
                }
                Outcome::Fail(reason) => self.step_failed(resource, op, reason).await?,
            };
            if let Next::Stop = next {
                return Ok(());
            }
        }
    }

    /// A step finished: records what it produced, and the dashboard URL learnt with it, then
    /// moves on.
    async fn step_done(
        &self,
        resource: &mut Resource,
        op: &mut Operation,
        learnt: Learnt,
        started: i64,
        now: i64,
    ) -> Result<Next, StoreError> {
        let Learnt {
            produced,
            dashboard_url,
        } = learnt;
        let step = current(op);
        info!(step = %step.name, kind = op.kind.as_str(), "step finished");
        // Done at last, if an earlier deprovision or unbind left it behind. A step is left
        // behind only after the outputs record it as skipped, and they forget skipped steps
        // only when an operation that skipped none ends, having run again those that were
        // still left behind: outputs that record none mean no orphan to resolve.
        if op.kind.is_teardown() && resource.outputs.skipped.is_some() {
            let (key, created) = (&resource.key, resource.created_at);
            (self.inner.store)
                .resolve_orphan(key, created, &step.name)
                .await?;
        }
        if produced.is_some() || dashboard_url.is_some() {
            resource
                .outputs
                .registry
                .extend(produced.unwrap_or_default());
            if let Some(url) = &dashboard_url {
                info!(step = %step.name, "dashboard URL learnt");
                resource.dashboard_url = Some(url.clone());
            }
            let url = dashboard_url.as_deref();
            if !self.save_outputs(resource, &op.id, url).await? {
                return Ok(Next::Stop); // superseded or taken over
            }
        }
        let took = format!("{} ms", now - started);
        let seconds = Duration::from_millis(u64::try_from(now - started).unwrap_or(0));
        (self.inner.metrics.step_seconds)
            .get_or_create(&step_labels(op, step))
            .observe(seconds.as_secs_f64());
        self.event(&op.id, "step_finished", Some(&step.name), Some(took))
            .await;
        self.advance(&resource.key, op, now, " done").await
    }

    /// A step is skipped: one that a deprovision or unbind leaves unfinished is kept, so that
    /// the janitor or a later deprovision can try it again. Then moves on.
    async fn step_skipped(
        &self,
        resource: &mut Resource,
        op: &mut Operation,
        reason: Skip,
        left_behind: bool,
        now: i64,
    ) -> Result<Next, StoreError> {
        let step = current(op);
        let reason = reason.to_string();
        if left_behind {
            resource.outputs.skip(&op.id, step.clone());
            if !self.save_outputs(resource, &op.id, None).await? {
                return Ok(Next::Stop); // superseded or taken over
            }
            self.leave_behind(resource, op, step, &reason).await?;
        } else {
            warn!(step = %step.name, kind = op.kind.as_str(), %reason, "step skipped");
        }
        let state = format!(" skipped ({reason})");
        self.event(&op.id, "step_skipped", Some(&step.name), Some(reason))
            .await;
        self.advance(&resource.key, op, now, &state).await
    }

    /// A step asks to be run again after a wait (cut to the deadline): saves that, then hands a
    /// long wait back to the worker, or sleeps through a short one here.
    async fn step_waits(
        &self,
        key: &Key,
        op: &mut Operation,
        wait: Wait,
        now: i64,
    ) -> Result<Next, StoreError> {
        let Wait {
            wait,
            reason,
            started,
            first_run,
        } = wait;
        let inner = &self.inner;
        let step = current(op);
        (inner.metrics.step_waits)
            .get_or_create(&step_labels(op, step))
            .inc();
        if let Some(reason) = &reason {
            self.event(&op.id, "step_retry", Some(&step.name), Some(reason.clone()))
                .await;
        }
        let wait = wait.min(Duration::from_millis(
            u64::try_from(op.deadline_at - now).unwrap_or(0),
        ));
        let state = match &reason {
            Some(reason) => format!(": {reason}"),
            None => " in progress".to_owned(),
        };
        let description = Some(describe(op, &state));
        // The first short wait of a new operation's first step: the row already says that the
        // step started then and is in progress, under a lease that outlasts the wait by more
        // than half its length. Saving that again would only move `next_run_at`, which after a
        // crash makes the step due a few milliseconds sooner, where it waits the rest.
        let unchanged = first_run
            && op.description == description
            && wait < SHORT_WAIT
            && op.lease_until - (now + ms(wait)) > ms(inner.options.lease / 2);
        op.description = description;
        op.step_started_at = Some(started);
        op.next_run_at = now + ms(wait);
        if wait > inner.options.lease / 2 {
            // A long wait: hand the operation back to the worker.
            let owner = inner.owner.as_str();
            if inner.store.save_progress(key, op, owner).await? {
                inner.store.release(key, &op.id, owner).await?;
            }
            return Ok(Next::Stop);
        }
        if !unchanged && !self.save_progress(key, op, now).await? {
            return Ok(Next::Stop); // superseded or taken over
        }
        if wait >= Duration::from_secs(1) {
            self.flush_events(&op.id).await;
        }
        tokio::select! {
            () = inner.shutdown.cancelled() => {}
            () = tokio::time::sleep(wait) => {}
        }
        Ok(Next::Run)
    }

    /// A step failed, and with it the operation: saves its end.
    async fn step_failed(
        &self,
        resource: &Resource,
        op: &Operation,
        reason: StepFailure,
    ) -> Result<Next, StoreError> {
        let step = current(op);
        let reason = Failure::Step {
            step: step.name.clone(),
            reason,
        };
        let message = Some(reason.to_string());
        self.event(&op.id, "step_failed", Some(&step.name), message)
            .await;
        self.finish(resource, &op.id, Err(reason)).await?;
        Ok(Next::Stop)
    }

    /// Moves `op` past its current step, which ended in `state` (`" done"`, `" skipped (…)"`),
    /// and saves its progress — unless no step is left: the operation ends then, and its end is
    /// saved with a compare-and-set of its own.
    async fn advance(
        &self,
        key: &Key,
        op: &mut Operation,
        now: i64,
        state: &str,
    ) -> Result<Next, StoreError> {
        op.description = Some(describe(op, state));
        op.step += 1;
        op.step_started_at = None;
        op.next_run_at = now;
        if op.step == op.plan.steps.len() || self.save_progress(key, op, now).await? {
            return Ok(Next::Run);
        }
        Ok(Next::Stop) // superseded or taken over
    }

    /// Renews the lease of `op` from `now` and saves its progress; false when it is not this
    /// engine's any more (superseded or taken over).
    async fn save_progress(
        &self,
        key: &Key,
        op: &mut Operation,
        now: i64,
    ) -> Result<bool, StoreError> {
        op.lease_until = self.lease_until(now);
        let inner = &self.inner;
        inner.store.save_progress(key, op, &inner.owner).await
    }

    /// Saves `r`'s outputs, and a new `dashboard_url`, while its operation `op_id` is still this
    /// engine's; false when it is not any more (superseded or taken over).
    async fn save_outputs(
        &self,
        r: &Resource,
        op_id: &str,
        dashboard_url: Option<&str>,
    ) -> Result<bool, StoreError> {
        let inner = &self.inner;
        (inner.store)
            .save_outputs(&r.key, op_id, &inner.owner, &r.outputs, dashboard_url)
            .await
    }

    /// Runs one step once.
    pub(super) async fn run_step(
        &self,
        r: &Resource,
        op: &Operation,
        step: &OpStep,
        started: i64,
        now: i64,
        instance: Option<&Resource>,
    ) -> Result<Outcome, StoreError> {
        let context = match (&step.action, &step.when) {
            (Action::Delay { .. }, None) => Value::Null,
            _ => self.template_context(r, op, instance).await?,
        };
        if let Some(when) = &step.when {
            match self.inner.evaluator.condition(when, &context) {
                Ok(true) => {}
                Ok(false) => return Ok(Outcome::Skip(Skip::ConditionFalse)),
                Err(e) => return Ok(Outcome::Fail(StepFailure::Condition(e))),
            }
        }
        let result = match &step.action {
            Action::Delay { delay } => {
                let elapsed = u64::try_from(now - started).unwrap_or(0);
                let remaining = delay.saturating_sub(Duration::from_millis(elapsed));
                return Ok(if remaining.is_zero() {
                    Outcome::Done(None)
                } else {
                    Outcome::RetryAfter(remaining, None)
                });
            }
            Action::Target(target) => {
                let run = self.target_step(r, op.kind, step, target, &context, now - started);
                futures::FutureExt::catch_unwind(AssertUnwindSafe(run)).await
            }
            Action::Run { run, with } => {
                let kind = self.inner.steps.read().expect("lock").get(run).cloned();
                let Some(kind) = kind else {
                    return Ok(Outcome::Fail(StepFailure::UnknownKind(run.clone())));
                };
                let with = match self.inner.evaluator.renderer.render(with, &context) {
                    Ok(with) => with,
                    Err(e) => return Ok(Outcome::Fail(StepFailure::Render(format!("with: {e}")))),
                };
                let ctx = StepContext {
                    op_kind: op.kind,
                    step: &step.name,
                    with: &with,
                    resource: r,
                    template_context: &context,
                    started_at: started,
                };
                futures::FutureExt::catch_unwind(AssertUnwindSafe(kind.run(&ctx))).await
            }
        };
        Ok(match result {
            Ok(StepOutcome::Done) => Outcome::Done(None),
            Ok(StepOutcome::Produced(values)) => {
                let undeclared: Vec<String> = values
                    .keys()
                    .filter(|k| !step.outputs.contains(k))
                    .cloned()
                    .collect();
                if undeclared.is_empty() {
                    Outcome::Done(Some(values))
                } else {
                    Outcome::Fail(StepFailure::Undeclared(undeclared))
                }
            }
            Ok(StepOutcome::RetryAfter { after, reason }) => {
                Outcome::RetryAfter(after, Some(reason))
            }
            Ok(StepOutcome::Fail(reason)) => Outcome::Fail(StepFailure::Refused(reason)),
            Err(panic) => Outcome::Fail(StepFailure::Panicked(panic_message(panic.as_ref()))),
        })
    }
}

/// Applies the rules of an operation of `kind` to the outcome of its `step`, which has been
/// tried for `elapsed_ms`: an optional step, or one of a deprovision or unbind, that fails is
/// skipped; a step that keeps asking to be retried past its budget is skipped by deprovision
/// and unbind (which always have one) and fails other operations. The flag tells a step that
/// deprovision or unbind skipped this way: it is left behind, unfinished.
fn settle(kind: OpKind, step: &OpStep, outcome: Outcome, elapsed_ms: i64) -> (Outcome, bool) {
    let teardown = kind.is_teardown();
    let budget = match teardown {
        true => Some(step.budget.unwrap_or(DEFAULT_BUDGET)),
        false => step.budget,
    };
    match outcome {
        Outcome::Fail(reason) if step.optional || teardown => {
            (Outcome::Skip(Skip::Failed(reason)), teardown)
        }
        Outcome::RetryAfter(wait, reason) => match budget.filter(|b| elapsed_ms >= ms(*b)) {
            None => (Outcome::RetryAfter(wait, reason), false),
            Some(budget) => {
                let last = reason.unwrap_or_else(|| "still waiting".to_owned());
                match teardown {
                    true => (Outcome::Skip(Skip::GaveUp { budget, last }), true),
                    false => (Outcome::Fail(StepFailure::GaveUp { budget, last }), false),
                }
            }
        },
        outcome => (outcome, false),
    }
}

/// The step `op` is at; the loop handles an outcome only while there is one.
fn current(op: &Operation) -> &OpStep {
    &op.plan.steps[op.step]
}

/// The description of `op` at its current step, in `state`.
fn describe(op: &Operation, state: &str) -> String {
    let (kind, total) = (op.kind.as_str(), op.plan.steps.len());
    let name = &current(op).name;
    format!("{kind}: step {}/{total} '{name}'{state}", op.step + 1)
}

/// What the current step last said it waits for, from the description [`describe`] gave it.
fn last_wait(op: &Operation) -> Option<String> {
    let description = op.description.as_deref()?;
    let head = describe(op, ": ");
    description.strip_prefix(&head).map(str::to_owned)
}

fn step_labels(op: &Operation, step: &OpStep) -> StepLabels {
    StepLabels {
        kind: op.kind.as_str().to_owned(),
        step: step.name.clone(),
    }
}

/// The message of a panic payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}
