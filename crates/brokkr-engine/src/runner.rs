//! The [`Engine`]: runs operations step by step, durably.
//!
//! An operation is created already leased to the engine of the process that accepted the request,
//! which starts it at once. Each step returns done, retry-after or fail; progress is saved after
//! every step with a compare-and-set on the operation id and the lease, so a superseded operation
//! (a deprovision replacing a running provision) or one taken over by another replica stops on
//! its next save. A background worker claims operations that are due and not leased by anyone
//! alive: those that waited out a long retry, those of a process that died, and, on a
//! single-process SQLite store, everything left running at the last shutdown.

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use brokkr_blueprint::evaluate::{EvaluationError, Evaluator, Subject};
use brokkr_blueprint::template::Renderer;
use brokkr_blueprint::{RegistryEntry, Step};
use brokkr_targets::{Readiness, Scope, TargetError, Targets};
use serde_json::{Map, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::metrics::{EngineMetrics, OperationLabels, StepLabels};
use crate::model::{Event, Key, OpKind, Operation, Resource, Status};
use crate::now_ms;
use crate::step::{StepContext, StepKind, StepOutcome};
use crate::store::{Finish, Store, StoreError};

mod janitor;

/// Tunables of the engine; every duration can go down to milliseconds for tests.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// How long a claim on an operation holds without being renewed.
    pub lease: Duration,
    /// How often the worker looks for due operations.
    pub poll_interval: Duration,
    /// Most operations claimed per poll.
    pub claim_batch: i64,
    /// How long tombstones of deleted resources are kept.
    pub retention: Duration,
    /// How long after a deprovision or unbind left a step behind the janitor first tries it
    /// again; each failed attempt doubles the wait.
    pub orphan_backoff: Duration,
    /// The longest wait between two attempts at a step left behind.
    pub orphan_backoff_max: Duration,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            claim_batch: 256,
            retention: Duration::from_secs(24 * 3600),
            orphan_backoff: Duration::from_secs(60),
            orphan_backoff_max: Duration::from_secs(3600),
        }
    }
}

/// What the runner does after a step.
enum Outcome {
    /// Finished, perhaps with values for the registry.
    Done(Option<Map<String, Value>>),
    /// Run again after the wait; the reason, if any, is shown to the user.
    RetryAfter(Duration, Option<String>),
    Fail(String),
    /// Go on without it (condition false, optional step failed, non-blocking budget spent).
    Skip(String),
}

/// Default time a deprovision or unbind step may keep asking to be retried before it is skipped.
const DEFAULT_BUDGET: Duration = Duration::from_secs(300);

/// Deprovision and unbind never block on one step.
fn non_blocking(kind: OpKind) -> bool {
    matches!(kind, OpKind::Deprovision | OpKind::Unbind)
}

/// Runs operations. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    owner: String,
    options: EngineOptions,
    evaluator: Evaluator,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    /// Operations running in this process, by resource and operation id.
    running: Mutex<HashSet<(Key, String)>>,
    wake: Notify,
    metrics: EngineMetrics,
    steps: RwLock<HashMap<String, Arc<dyn StepKind>>>,
    targets: Targets,
    /// Events not yet written, by operation id.
    events: Mutex<HashMap<String, Vec<Event>>>,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Engine {
    /// Creates an engine with a fresh owner id and no targets.
    pub fn new(store: Arc<dyn Store>, options: EngineOptions) -> Self {
        Self::with_targets(store, options, Targets::default())
    }

    /// Creates an engine with a fresh owner id whose `target` steps act on `targets`.
    pub fn with_targets(store: Arc<dyn Store>, options: EngineOptions, targets: Targets) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                owner: format!("brokkr-{}", uuid::Uuid::new_v4()),
                options,
                evaluator: Evaluator::new(Renderer::new(), targets.facts()),
                shutdown: CancellationToken::new(),
                tasks: TaskTracker::new(),
                running: Mutex::new(HashSet::new()),
                wake: Notify::new(),
                metrics: EngineMetrics::default(),
                steps: RwLock::new(HashMap::from([(
                    crate::http::NAME.to_owned(),
                    Arc::new(crate::http::Http::default()) as Arc<dyn StepKind>,
                )])),
                targets,
                events: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The store the engine runs on.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Makes a step kind available to blueprints as `run: <name>`.
    pub fn register(&self, name: &str, kind: Arc<dyn StepKind>) {
        let mut steps = self.inner.steps.write().expect("lock");
        steps.insert(name.to_owned(), kind);
    }

    /// The engine's metrics, to register with a Prometheus registry.
    pub fn metrics(&self) -> &EngineMetrics {
        &self.inner.metrics
    }

    /// This engine's lease owner id.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// The lease length in milliseconds, for operations created for this engine.
    pub fn lease_ms(&self) -> i64 {
        ms(self.inner.options.lease)
    }

    /// Starts the background worker. On a single-process store, first takes over every lease
    /// left by a previous run.
    pub async fn start(&self) -> Result<(), StoreError> {
        if !self.inner.store.shared() {
            let released = self.inner.store.release_all().await?;
            if released > 0 {
                info!(operations = released, "resuming operations left running");
            }
        }
        let engine = self.clone();
        self.inner.tasks.spawn(async move { engine.worker().await });
        Ok(())
    }

    /// Stops claiming work, lets running steps reach a save point, and waits for them. Unfinished
    /// operations stay in the store and resume on the next start.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }

    /// Runs the operation of `key` in the background; it must be leased to this engine.
    pub fn spawn(&self, key: Key) -> tokio::task::JoinHandle<()> {
        let engine = self.clone();
        self.inner.tasks.spawn(async move { engine.run(key).await })
    }

    /// Runs the operation of `key` to its end (or to a long wait) in its own task and waits for
    /// it: the operation goes on even if the caller (a request whose client left) is dropped.
    pub async fn run_to_end(&self, key: Key) {
        if let Err(e) = self.spawn(key).await {
            warn!(error = %e, "an operation task ended abnormally; it will be resumed");
        }
    }

    async fn run(&self, key: Key) {
        let span = info_span!("operation", instance_id = %key.instance_id,
            binding_id = key.binding_id.as_deref().unwrap_or(""),
            operation = tracing::field::Empty, kind = tracing::field::Empty);
        if let Err(e) = self.drive(&key).instrument(span).await {
            warn!(%key, error = %e, "operation interrupted by a store error; it will be resumed");
        }
    }

    /// Waits until the operation `op_id` of `key` is no longer in progress, or `timeout` passes.
    /// Returns the resource as last read.
    pub async fn wait(
        &self,
        key: &Key,
        op_id: &str,
        timeout: Duration,
    ) -> Result<Option<Resource>, StoreError> {
        let until = tokio::time::Instant::now() + timeout;
        loop {
            let r = self.inner.store.get(key).await?;
            let running = r
                .as_ref()
                .is_some_and(|r| r.op.id == op_id && r.op.in_progress());
            if !running || tokio::time::Instant::now() >= until {
                return Ok(r);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn worker(&self) {
        let inner = &self.inner;
        let mut last_purge = 0;
        loop {
            tokio::select! {
                () = inner.shutdown.cancelled() => return,
                () = tokio::time::sleep(inner.options.poll_interval) => {}
                () = inner.wake.notified() => {}
            }
            let lease_until = now_ms() + ms(inner.options.lease);
            match inner
                .store
                .claim_due(&inner.owner, lease_until, inner.options.claim_batch)
                .await
            {
                Ok(keys) => {
                    for key in keys {
                        debug!(%key, "claimed operation");
                        self.spawn(key);
                    }
                }
                Err(e) => warn!(error = %e, "cannot claim due operations"),
            }
            self.sweep_orphans().await;
            // Purge at most every minute, and often enough for short retentions.
            let purge_every = ms(inner.options.retention).clamp(1, 60_000);
            if now_ms() - last_purge >= purge_every {
                last_purge = now_ms();
                let before = last_purge - ms(inner.options.retention);
                match inner.store.purge_deleted(before).await {
                    Ok(0) => {}
                    Ok(n) => info!(resources = n, "purged deleted resources past retention"),
                    Err(e) => warn!(error = %e, "cannot purge deleted resources"),
                }
            }
        }
    }

    async fn drive(&self, key: &Key) -> Result<(), StoreError> {
        let inner = &self.inner;
        let owner = inner.owner.as_str();
        let Some(resource) = inner.store.get(key).await? else {
            return Ok(());
        };
        let mut op = resource.op.clone();
        if !op.in_progress() || op.lease_owner.as_deref() != Some(owner) {
            return Ok(());
        }
        let Some(_running) = Running::enter(&inner.running, key, &op.id) else {
            return Ok(()); // already running in this process
        };
        let span = tracing::Span::current();
        span.record("operation", op.id.as_str());
        span.record("kind", op.kind.as_str());
        if op.step > 0 || op.step_started_at.is_some() {
            self.event(&op.id, "resumed", None, None).await;
        }
        inner.metrics.running.inc();
        let mut resource = resource;
        let result = self.drive_steps(&mut resource, &mut op).await;
        self.flush_events(&op.id).await;
        inner.metrics.running.dec();
        result
    }

    async fn drive_steps(
        &self,
        resource: &mut Resource,
        op: &mut Operation,
    ) -> Result<(), StoreError> {
        let inner = &self.inner;
        let owner = inner.owner.as_str();
        let key = &resource.key.clone();
        loop {
            let now = now_ms();
            if inner.shutdown.is_cancelled() {
                return inner.store.release(key, &op.id, owner).await;
            }
            let total = op.plan.steps.len();
            if now >= op.deadline_at {
                let at = op.plan.steps.get(op.step).map_or_else(
                    || "while finishing".to_owned(),
                    |s| format!("in step '{}'", s.name),
                );
                let reason = format!("{} timed out {at}", op.kind.as_str());
                self.finish(resource, &op.id, Err(reason)).await?;
                return Ok(());
            }
            let Some(step) = op.plan.steps.get(op.step) else {
                let outcome = self.complete(resource).await?;
                self.finish(resource, &op.id, outcome).await?;
                return Ok(());
            };
            if op.step_started_at.is_none() {
                self.event(&op.id, "step_started", Some(&step.name), None)
                    .await;
            }
            let started = op.step_started_at.unwrap_or(now);
            let mut outcome = self
                .run_step(resource, op, step, started, now, None)
                .instrument(info_span!("step", step = %step.name))
                .await?;
            // What follows — the step's duration, its budget, the next run — counts from now
            // that it has run.
            let now = now_ms();
            // A deprovision or unbind step skipped because it failed is kept, so that a later
            // deprovision can try it again.
            let mut unfinished = false;
            if let Outcome::Fail(reason) = &outcome
                && (step.optional || non_blocking(op.kind))
            {
                unfinished = non_blocking(op.kind);
                outcome = Outcome::Skip(format!("failed: {reason}"));
            }
            // Deprovision and unbind skip a step that keeps asking to be retried past its budget;
            // other operations fail, when the step has a budget.
            let budget = match non_blocking(op.kind) {
                true => Some(step.budget.unwrap_or(DEFAULT_BUDGET)),
                false => step.budget,
            };
            if let Outcome::RetryAfter(_, reason) = &outcome
                && let Some(budget) = budget
                && now - started >= ms(budget)
            {
                let last = reason.as_deref().unwrap_or("still waiting");
                let spent = humantime_ms(budget);
                let reason = format!("gave up after {spent}: {last}");
                unfinished = non_blocking(op.kind);
                outcome = match non_blocking(op.kind) {
                    true => Outcome::Skip(reason),
                    false => Outcome::Fail(reason),
                };
            }
            match outcome {
                Outcome::Skip(reason) => {
                    if unfinished {
                        let skipped = skipped_steps_mut(&mut resource.outputs, &op.id);
                        skipped.push(serde_json::to_value(step).expect("steps serialize"));
                        if !self.save_outputs(resource, &op.id).await? {
                            return Ok(()); // superseded or taken over
                        }
                        self.leave_behind(resource, op, step, &reason).await?;
                    } else {
                        warn!(step = %step.name, kind = op.kind.as_str(), %reason, "step skipped");
                    }
                    self.event(
                        &op.id,
                        "step_skipped",
                        Some(&step.name),
                        Some(reason.clone()),
                    )
                    .await;
                    op.step += 1;
                    op.step_started_at = None;
                    op.next_run_at = now;
                    op.description = Some(format!(
                        "{}: step {}/{total} '{}' skipped ({reason})",
                        op.kind.as_str(),
                        op.step,
                        step.name
                    ));
                }
                Outcome::Done(produced) => {
                    info!(step = %step.name, kind = op.kind.as_str(), "step finished");
                    if non_blocking(op.kind) {
                        // Done at last, if an earlier deprovision or unbind left it behind.
                        let (key, created) = (&resource.key, resource.created_at);
                        inner.store.resolve_orphan(key, created, &step.name).await?;
                    }
                    if let Some(values) = produced {
                        if !resource.outputs.is_object() {
                            resource.outputs = Value::Object(Map::new());
                        }
                        let registry = &mut resource.outputs["registry"];
                        if !registry.is_object() {
                            *registry = Value::Object(Map::new());
                        }
                        if let Value::Object(registry) = registry {
                            registry.extend(values);
                        }
                        if !self.save_outputs(resource, &op.id).await? {
                            return Ok(()); // superseded or taken over
                        }
                    }
                    let took = format!("{} ms", now - started);
                    let seconds = Duration::from_millis(u64::try_from(now - started).unwrap_or(0));
                    inner
                        .metrics
                        .step_seconds
                        .get_or_create(&step_labels(op, step))
                        .observe(seconds.as_secs_f64());
                    self.event(&op.id, "step_finished", Some(&step.name), Some(took))
                        .await;
                    op.step += 1;
                    op.step_started_at = None;
                    op.next_run_at = now;
                    op.description = Some(format!(
                        "{}: step {}/{total} '{}' done",
                        op.kind.as_str(),
                        op.step,
                        step.name
                    ));
                }
                Outcome::RetryAfter(wait, reason) => {
                    inner
                        .metrics
                        .step_waits
                        .get_or_create(&step_labels(op, step))
                        .inc();
                    if let Some(reason) = &reason {
                        self.event(&op.id, "step_retry", Some(&step.name), Some(reason.clone()))
                            .await;
                    }
                    let wait = wait.min(Duration::from_millis(
                        u64::try_from(op.deadline_at - now).unwrap_or(0),
                    ));
                    op.step_started_at = Some(started);
                    op.next_run_at = now + ms(wait);
                    op.description = Some(match &reason {
                        Some(reason) => format!(
                            "{}: step {}/{total} '{}': {reason}",
                            op.kind.as_str(),
                            op.step + 1,
                            step.name
                        ),
                        None => format!(
                            "{}: step {}/{total} '{}' in progress",
                            op.kind.as_str(),
                            op.step + 1,
                            step.name
                        ),
                    });
                    if wait > inner.options.lease / 2 {
                        // A long wait: hand the operation back to the worker.
                        if inner.store.save_progress(key, op, owner).await? {
                            inner.store.release(key, &op.id, owner).await?;
                        }
                        return Ok(());
                    }
                    op.lease_until = now + ms(inner.options.lease);
                    if !inner.store.save_progress(key, op, owner).await? {
                        return Ok(());
                    }
                    if wait >= Duration::from_secs(1) {
                        self.flush_events(&op.id).await;
                    }
                    tokio::select! {
                        () = inner.shutdown.cancelled() => {}
                        () = tokio::time::sleep(wait) => {}
                    }
                    continue;
                }
                Outcome::Fail(reason) => {
                    let reason = format!("step '{}' failed: {reason}", step.name);
                    self.event(
                        &op.id,
                        "step_failed",
                        Some(&step.name),
                        Some(reason.clone()),
                    )
                    .await;
                    self.finish(resource, &op.id, Err(reason)).await?;
                    return Ok(());
                }
            }
            if op.step == total {
                // The operation ends now; its end is saved with a compare-and-set of its own.
                continue;
            }
            op.lease_until = now + ms(inner.options.lease);
            if !inner.store.save_progress(key, op, owner).await? {
                return Ok(()); // superseded or taken over
            }
        }
    }

    /// Saves `r`'s outputs while its operation `op_id` is still this engine's; false when it
    /// is not any more (superseded or taken over).
    async fn save_outputs(&self, r: &Resource, op_id: &str) -> Result<bool, StoreError> {
        let inner = &self.inner;
        inner
            .store
            .save_outputs(&r.key, op_id, &inner.owner, &r.outputs)
            .await
    }

    /// Runs one step once.
    async fn run_step(
        &self,
        r: &Resource,
        op: &Operation,
        step: &Step,
        started: i64,
        now: i64,
        instance: Option<&Resource>,
    ) -> Result<Outcome, StoreError> {
        let context = if step.when.is_some() || step.run.is_some() || step.target.is_some() {
            self.template_context(r, op, instance).await?
        } else {
            Value::Null
        };
        if let Some(when) = &step.when {
            match self.inner.evaluator.condition(when, &context) {
                Ok(true) => {}
                Ok(false) => return Ok(Outcome::Skip("its condition is false".into())),
                Err(e) => return Ok(Outcome::Fail(format!("condition: {e}"))),
            }
        }
        if let Some(delay) = step.delay {
            let elapsed = u64::try_from(now - started).unwrap_or(0);
            let remaining = delay.saturating_sub(Duration::from_millis(elapsed));
            return Ok(if remaining.is_zero() {
                Outcome::Done(None)
            } else {
                Outcome::RetryAfter(remaining, None)
            });
        }
        let result = if let Some(target) = &step.target {
            let scope = Scope {
                instance_id: &r.key.instance_id,
                binding_id: r.key.binding_id.as_deref(),
                service_id: &r.service_id,
                plan_id: context["plan_id"].as_str().unwrap_or(&r.plan_id),
                step: &step.name,
                context: &context["instance"]["context"],
            };
            let run = self.target_step(op.kind, step, target, &context, &scope, now - started);
            futures::FutureExt::catch_unwind(AssertUnwindSafe(run)).await
        } else {
            let Some(name) = &step.run else {
                return Ok(Outcome::Fail("the step has no action".into()));
            };
            let kind = self.inner.steps.read().expect("lock").get(name).cloned();
            let Some(kind) = kind else {
                return Ok(Outcome::Fail(format!(
                    "no step kind named {name:?} is compiled into this broker"
                )));
            };
            let with = match self.inner.evaluator.renderer.render(&step.with, &context) {
                Ok(with) => with,
                Err(e) => return Ok(Outcome::Fail(format!("with: {e}"))),
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
        };
        Ok(match result {
            Ok(StepOutcome::Done) => Outcome::Done(None),
            Ok(StepOutcome::Produced(values)) => {
                let undeclared: Vec<&str> = values
                    .keys()
                    .filter(|k| !step.outputs.contains(k))
                    .map(String::as_str)
                    .collect();
                if undeclared.is_empty() {
                    Outcome::Done(Some(values))
                } else {
                    Outcome::Fail(format!(
                        "produced registry values the step does not declare in `outputs`: {}",
                        undeclared.join(", ")
                    ))
                }
            }
            Ok(StepOutcome::RetryAfter { after, reason }) => {
                Outcome::RetryAfter(after, Some(reason))
            }
            Ok(StepOutcome::Fail(reason)) => Outcome::Fail(reason),
            Err(panic) => Outcome::Fail(format!("panicked: {}", panic_message(panic.as_ref()))),
        })
    }

    /// Runs a `target` step once: renders its templates, then in deprovision and unbind deletes
    /// them last to first, otherwise applies them in order and waits until each is ready. A
    /// server that cannot be reached is retried with a growing wait.
    async fn target_step(
        &self,
        kind: OpKind,
        step: &Step,
        name: &str,
        context: &Value,
        scope: &Scope<'_>,
        elapsed_ms: i64,
    ) -> StepOutcome {
        let target = match &step.server {
            None => (self.inner.targets.get(name).cloned())
                .ok_or_else(|| format!("no target named {name:?} is configured")),
            Some(server) => (self.inner.evaluator.renderer.render(server, context))
                .map_err(|e| format!("server: {e}"))
                .and_then(|server| {
                    (self.inner.targets.on_server(name, &server)).map_err(|e| e.to_string())
                }),
        };
        let target = match target {
            Ok(target) => target,
            Err(reason) => return StepOutcome::Fail(reason),
        };
        let resources = match self.inner.evaluator.resources(&step.templates, context) {
            Ok(resources) => resources,
            Err(e) => return StepOutcome::Fail(e.to_string()),
        };
        let wait = retry_wait(elapsed_ms);
        let failed = |e: TargetError| match e {
            TargetError::Unavailable(reason) => StepOutcome::retry(wait, reason),
            TargetError::Invalid(reason) => StepOutcome::Fail(reason),
        };
        if non_blocking(kind) {
            if let Some(secret) = &step.secret {
                let unpublished = match self.secret_name(secret, context) {
                    Ok(name) => target.unpublish_credentials(&name, scope).await,
                    Err(reason) => return StepOutcome::Fail(reason),
                };
                if let Err(e) = unpublished {
                    return failed(e);
                }
            }
            for resource in resources.iter().rev() {
                if let Err(e) = target.delete(resource, scope).await {
                    return failed(e);
                }
            }
            if kind == OpKind::Deprovision
                && let Err(e) = target.released(scope).await
            {
                return failed(e);
            }
            return StepOutcome::Done;
        }
        for resource in &resources {
            if let Err(e) = target.apply(resource, scope).await {
                return failed(e);
            }
        }
        if kind == OpKind::Update
            && let Err(e) = target.prune(&resources, scope).await
        {
            return failed(e);
        }
        for resource in &resources {
            match target.ready(resource, scope).await {
                Ok(Readiness::Ready) => {}
                Ok(Readiness::Waiting(reason)) => return StepOutcome::retry(wait, reason),
                Err(e) => return failed(e),
            }
        }
        let (checks, reads) = match (
            self.inner.evaluator.resources(&step.readiness, context),
            self.inner.evaluator.resources(&step.read, context),
        ) {
            (Ok(checks), Ok(reads)) => (checks, reads),
            (Err(e), _) | (_, Err(e)) => return StepOutcome::Fail(e.to_string()),
        };
        for check in &checks {
            match target.check(check, scope).await {
                Ok(Readiness::Ready) => {}
                Ok(Readiness::Waiting(reason)) => return StepOutcome::retry(wait, reason),
                Err(e) => return failed(e),
            }
        }
        let mut values = Map::new();
        for read in &reads {
            match target.read(read, scope).await {
                Ok(read) => values.extend(read),
                Err(e) => return failed(e),
            }
        }
        match values.is_empty() {
            true => StepOutcome::Done,
            false => StepOutcome::Produced(values),
        }
    }

    /// Renders a step's `secret: {name}` to the name its credentials are published under.
    fn secret_name(&self, secret: &Value, context: &Value) -> Result<String, String> {
        let rendered = self.inner.evaluator.renderer.render(secret, context);
        match rendered.map_err(|e| format!("secret: {e}"))?.get("name") {
            Some(Value::String(name)) => Ok(name.clone()),
            _ => Err("secret: `name` must render to a string".into()),
        }
    }

    /// Writes a bind's credentials where its steps with `secret` say; records where in the
    /// binding's outputs (`secrets`).
    async fn publish(
        &self,
        r: &Resource,
        credentials: &Value,
        outputs: &mut Value,
    ) -> Result<Result<(), String>, StoreError> {
        let steps: Vec<&Step> =
            r.op.plan
                .steps
                .iter()
                .filter(|s| s.secret.is_some())
                .collect();
        if steps.is_empty() {
            return Ok(Ok(()));
        }
        let context = self.template_context(r, &r.op, None).await?;
        let empty = Map::new();
        let credentials = credentials.as_object().unwrap_or(&empty);
        let mut published = Vec::new();
        for step in steps {
            let (Some(secret), Some(name)) = (&step.secret, &step.target) else {
                continue;
            };
            let Some(target) = self.inner.targets.get(name) else {
                return Ok(Err(format!("no target named {name:?} is configured")));
            };
            let scope = Scope {
                instance_id: &r.key.instance_id,
                binding_id: r.key.binding_id.as_deref(),
                service_id: &r.service_id,
                plan_id: &r.plan_id,
                step: &step.name,
                context: &context["instance"]["context"],
            };
            let secret_name = match self.secret_name(secret, &context) {
                Ok(secret_name) => secret_name,
                Err(reason) => return Ok(Err(format!("step '{}': {reason}", step.name))),
            };
            match target
                .publish_credentials(&secret_name, credentials, &scope)
                .await
            {
                Ok(at) => published.push(at),
                Err(e) => return Ok(Err(format!("step '{}': {e}", step.name))),
            }
        }
        outputs["secrets"] = Value::Array(published);
        Ok(Ok(()))
    }

    /// The values templates and step kinds see for an operation on `r`. An update sees the
    /// plan and parameters it is moving to. A binding sees `instance`, or else its instance as
    /// stored.
    async fn template_context(
        &self,
        r: &Resource,
        op: &Operation,
        instance: Option<&Resource>,
    ) -> Result<Value, StoreError> {
        let attrs = match op.kind {
            OpKind::Update => op.request.get("attrs").unwrap_or(&r.attrs),
            _ => &r.attrs,
        };
        let plan_id = match op.kind {
            OpKind::Update => op.request["plan_id"].as_str().unwrap_or(&r.plan_id),
            _ => &r.plan_id,
        };
        let own = Resource {
            attrs: attrs.clone(),
            plan_id: plan_id.to_owned(),
            ..r.clone()
        };
        let evaluator = &self.inner.evaluator;
        if r.key.binding_id.is_none() {
            return Ok(evaluator.context(&subject(&own), None));
        }
        let stored = match instance {
            Some(_) => None,
            None => {
                let key = Key::instance(&r.key.instance_id);
                self.inner.store.get(&key).await?
            }
        };
        let instance = instance.or(stored.as_ref()).unwrap_or(&own);
        Ok(evaluator.context(&subject(instance), Some(&subject(&own))))
    }

    /// Records an event of operation `op_id`. Events are written in batches (see
    /// [`Engine::flush_events`]); one that a crash catches unwritten is lost, the operation not.
    async fn event(&self, op_id: &str, kind: &str, step: Option<&str>, message: Option<String>) {
        let event = Event {
            at: now_ms(),
            kind: kind.to_owned(),
            step: step.map(str::to_owned),
            message,
        };
        let mut pending = self.inner.events.lock().expect("lock");
        pending.entry(op_id.to_owned()).or_default().push(event);
    }

    /// Writes the events of `op_id` recorded so far: before a wait of a second or more, and when
    /// the operation stops running here (its end writes them with it). A store failure is
    /// logged, never fatal.
    async fn flush_events(&self, op_id: &str) {
        let events = self.inner.events.lock().expect("lock").remove(op_id);
        if let Some(events) = events
            && let Err(e) = self.inner.store.append_events(op_id, &events).await
        {
            warn!(error = %e, "cannot record operation events");
        }
    }

    /// The changes a successful operation makes, or why it cannot succeed.
    async fn complete(&self, r: &Resource) -> Result<Result<Finish, String>, StoreError> {
        let ok = Finish::success;
        Ok(Ok(match r.op.kind {
            OpKind::Provision => ok("provisioned", Status::Ready),
            OpKind::Deprovision | OpKind::Unbind => {
                // Keep only the steps this operation skipped: those of an earlier one were
                // retried by this one.
                let mut outputs = r.outputs.clone();
                let current = outputs["skipped"]["op"] == r.op.id.as_str();
                if let Some(map) = outputs.as_object_mut().filter(|_| !current) {
                    map.remove("skipped");
                }
                let done = match r.op.kind {
                    OpKind::Deprovision => "deprovisioned",
                    _ => "unbound",
                };
                let description = self.left_behind_description(r, done).await?;
                Finish {
                    outputs: Some(outputs),
                    ..ok(&description, Status::Deleted)
                }
            }
            OpKind::Update => Finish {
                plan_id: r.op.request["plan_id"].as_str().map(str::to_owned),
                attrs: r.op.request.get("attrs").cloned(),
                ..ok("updated", Status::Ready)
            },
            OpKind::Bind => {
                let instance = self
                    .inner
                    .store
                    .get(&Key::instance(&r.key.instance_id))
                    .await?;
                let Some(instance) = instance.filter(|i| i.status == Status::Ready) else {
                    return Ok(Err("the instance no longer exists".into()));
                };
                let credentials = match self.credentials(&instance, r) {
                    Ok(credentials) => credentials,
                    Err(reason) => return Ok(Err(reason.to_string())),
                };
                let mut outputs = r.outputs.clone();
                if let Err(reason) = self.publish(r, &credentials, &mut outputs).await? {
                    return Ok(Err(reason));
                }
                outputs["credentials"] = credentials;
                Finish {
                    outputs: Some(outputs),
                    ..ok("bound", Status::Ready)
                }
            }
        }))
    }

    /// Evaluates registry definitions for `r` in order, each seeing the values before it: for an
    /// instance from nothing, for a binding (with its `instance`) from a copy of the instance's.
    pub fn registry(
        &self,
        entries: &[RegistryEntry],
        r: &Resource,
        instance: Option<&Resource>,
    ) -> Result<Map<String, Value>, EvaluationError> {
        let evaluator = &self.inner.evaluator;
        match instance {
            Some(i) => evaluator.registry(entries, &subject(i), Some(&subject(r))),
            None => evaluator.registry(entries, &subject(r), None),
        }
    }

    /// Renders and checks the credentials a bind of `binding` to `instance` produces.
    pub fn credentials(
        &self,
        instance: &Resource,
        binding: &Resource,
    ) -> Result<Value, EvaluationError> {
        let Some(template) = &binding.op.plan.credentials else {
            return Ok(Value::Object(Default::default()));
        };
        self.inner
            .evaluator
            .credentials(template, &subject(instance), &subject(binding))
            .map(Value::Object)
    }

    async fn finish(
        &self,
        r: &Resource,
        op_id: &str,
        outcome: Result<Finish, String>,
    ) -> Result<(), StoreError> {
        let finish = outcome.unwrap_or_else(|reason| Finish {
            succeeded: false,
            description: reason,
            status: match r.op.kind {
                OpKind::Provision | OpKind::Bind => Status::Failed,
                OpKind::Update | OpKind::Deprovision | OpKind::Unbind => r.status,
            },
            plan_id: None,
            attrs: None,
            outputs: None,
        });
        let kind = if finish.succeeded {
            "succeeded"
        } else {
            "failed"
        };
        // The steps' events and the last one are written with the operation's end.
        self.event(op_id, kind, None, Some(finish.description.clone()))
            .await;
        let events = self
            .inner
            .events
            .lock()
            .expect("lock")
            .remove(op_id)
            .unwrap_or_default();
        let saved = self
            .inner
            .store
            .finish(&r.key, op_id, &self.inner.owner, &finish, &events)
            .await?;
        if !saved {
            // Superseded: what its steps did still happened; the end is another's to tell.
            let steps = &events[..events.len() - 1];
            if let Err(e) = self.inner.store.append_events(op_id, steps).await {
                warn!(error = %e, "cannot record operation events");
            }
        }
        if saved {
            let labels = OperationLabels {
                kind: r.op.kind.as_str().to_owned(),
                state: kind.to_owned(),
            };
            self.inner.metrics.operations.get_or_create(&labels).inc();
            if finish.succeeded {
                info!(kind = r.op.kind.as_str(), "operation succeeded");
            } else {
                warn!(kind = r.op.kind.as_str(), reason = %finish.description, "operation failed");
            }
        }
        Ok(())
    }
}

/// The list of steps operation `op_id` skipped, kept in a resource's outputs as
/// `{"skipped": {"op": ID, "steps": [...]}}`; a list of another operation is replaced.
fn skipped_steps_mut<'a>(outputs: &'a mut Value, op_id: &str) -> &'a mut Vec<Value> {
    if !outputs.is_object() {
        *outputs = Value::Object(Map::new());
    }
    if outputs["skipped"]["op"] != op_id || !outputs["skipped"]["steps"].is_array() {
        outputs["skipped"] = serde_json::json!({"op": op_id, "steps": []});
    }
    outputs["skipped"]["steps"]
        .as_array_mut()
        .expect("an array, just checked")
}

/// The steps a finished deprovision or unbind of `r` skipped, to try again.
fn skipped_steps(r: &Resource) -> Vec<Step> {
    r.outputs["skipped"]["steps"]
        .as_array()
        .map(|steps| {
            steps
                .iter()
                .filter_map(|s| serde_json::from_value(s.clone()).ok())
                .collect()
        })
        .unwrap_or_default()
}

fn step_labels(op: &Operation, step: &Step) -> StepLabels {
    StepLabels {
        kind: op.kind.as_str().to_owned(),
        step: step.name.clone(),
    }
}

/// Marks an operation as running in this process for as long as it lives, even if the task
/// running it is dropped midway.
struct Running<'a> {
    set: &'a Mutex<HashSet<(Key, String)>>,
    entry: (Key, String),
}

impl<'a> Running<'a> {
    /// `None` when the operation already runs here. (The guard is built only after the lock
    /// is released: one built and dropped under it would lock it again, and remove the entry of
    /// the run that holds it.)
    fn enter(set: &'a Mutex<HashSet<(Key, String)>>, key: &Key, op_id: &str) -> Option<Self> {
        let entry = (key.clone(), op_id.to_owned());
        let inserted = set.lock().expect("lock").insert(entry.clone());
        inserted.then(|| Self { set, entry })
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.set.lock().expect("lock").remove(&self.entry);
    }
}

/// How templates see a stored resource.
fn subject(r: &Resource) -> Subject<'_> {
    Subject {
        id: r.key.binding_id.as_deref().unwrap_or(&r.key.instance_id),
        service_id: &r.service_id,
        plan_id: &r.plan_id,
        attrs: &r.attrs,
        registry: &r.outputs["registry"],
    }
}

/// How long to wait before trying a step again, growing with the time it has been tried:
/// from 200 ms up to 15 s.
fn retry_wait(elapsed_ms: i64) -> Duration {
    let half = u64::try_from(elapsed_ms / 2).unwrap_or(0);
    Duration::from_millis(half.clamp(200, 15_000))
}

fn humantime_ms(d: Duration) -> String {
    if d.as_millis().is_multiple_of(1000) {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_already_running_here_is_not_entered_twice() {
        let set = Mutex::new(HashSet::new());
        let key = Key::instance("i-1");
        let first = Running::enter(&set, &key, "op-1").expect("entered");
        assert!(Running::enter(&set, &key, "op-1").is_none());
        assert_eq!(
            set.lock().unwrap().len(),
            1,
            "the first run keeps its entry"
        );
        drop(first);
        assert!(set.lock().unwrap().is_empty());
    }
}
