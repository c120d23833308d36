//! The `target` step kind: renders a step's templates, then applies them to a target and waits
//! until they are ready, its `readiness` checks pass and its `read` entries are read — or, in
//! deprovision and unbind, deletes them. Also publishing a bind's credentials where its steps
//! with `secret` say. The [`Scope`] a target acts in is built in one place, `scope`.

use std::sync::Arc;
use std::time::Duration;

use brokkr_blueprint::NamesKey;
use brokkr_blueprint::evaluate::EvaluationError;
use brokkr_targets::{Readiness, Scope, Target, TargetError};
use serde_json::{Map, Value};

use super::engine::{Engine, REDO_AFTER};
use super::failure::{Failure, RunError};
use crate::model::{OpKind, OpStep, Resource, TargetAction};
use crate::step::StepOutcome;

/// Why a `target` step stops before its end.
enum Halt {
    /// Not yet: a server out of reach, or a resource not ready; run the step again later.
    Retry(String),
    /// Not ready yet after the target watched the resource for a while: run the step again
    /// soon, which watches again.
    Watched(String),
    /// For good: the step is wrong, or a server refused it.
    Fail(String),
}

impl From<TargetError> for Halt {
    fn from(e: TargetError) -> Self {
        match e {
            TargetError::Unavailable(reason) => Self::Retry(reason),
            TargetError::Invalid(reason) => Self::Fail(reason),
        }
    }
}

/// The pause before a step whose target watched a resource that is not ready yet looks again.
const AFTER_WATCH: Duration = Duration::from_millis(100);

/// Where the resources a waiting step already saw ready are remembered, beside what it applied.
fn ready_key(step: &str) -> String {
    format!("{step}\u{0}ready")
}

/// Goes on when a resource or check is ready; waits otherwise.
fn ready(readiness: Readiness) -> Result<(), Halt> {
    match readiness {
        Readiness::Ready => Ok(()),
        Readiness::Waiting(reason) => Err(Halt::Retry(reason)),
    }
}

/// Templates that do not render fail the step.
fn unrendered(e: EvaluationError) -> Halt {
    Halt::Fail(e.to_string())
}

impl Engine {
    /// Runs a `target` step of `r` on the target `name` once. A server that cannot be reached,
    /// or a resource not ready yet, is retried with a wait that grows with `elapsed_ms`.
    pub(super) async fn target_step(
        &self,
        r: &Resource,
        kind: OpKind,
        step: &OpStep,
        action: &TargetAction,
        context: &Value,
        elapsed_ms: i64,
    ) -> StepOutcome {
        let outcome = self.act_on_target(r, kind, step, action, context).await;
        if !matches!(outcome, Err(Halt::Retry(_) | Halt::Watched(_))) {
            self.forget_done(&r.op.id, &step.name);
        }
        match outcome {
            Ok(values) if values.is_empty() => StepOutcome::Done,
            Ok(values) => StepOutcome::Produced(values),
            Err(Halt::Retry(reason)) => StepOutcome::retry(retry_wait(elapsed_ms), reason),
            Err(Halt::Watched(reason)) => StepOutcome::retry(AFTER_WATCH, reason),
            Err(Halt::Fail(reason)) => StepOutcome::Fail(reason),
        }
    }

    /// What step `step` of operation `op_id` did on its earlier runs, not long ago, that a retry
    /// need not do again: the resources it applied (and now waits for), or, in deprovision and
    /// unbind, those it deleted.
    fn done_before(&self, op_id: &str, step: &str) -> Vec<Value> {
        let done = self.inner.done.lock().expect("done lock");
        done.get(&(op_id.to_owned(), step.to_owned()))
            .filter(|(_, at)| at.elapsed() < REDO_AFTER)
            .map(|(resources, _)| resources.clone())
            .unwrap_or_default()
    }

    fn remember_done(&self, op_id: &str, step: &str, resources: &[Value]) {
        let mut done = self.inner.done.lock().expect("done lock");
        let at = match done.get(&(op_id.to_owned(), step.to_owned())) {
            // Adding to what the step did keeps the time it began trusting it.
            Some((before, at)) if at.elapsed() < REDO_AFTER && resources.starts_with(before) => *at,
            _ => std::time::Instant::now(),
        };
        done.insert(
            (op_id.to_owned(), step.to_owned()),
            (resources.to_vec(), at),
        );
    }

    /// Forgets what a step did: it ended, or its operation did.
    pub(super) fn forget_done(&self, op_id: &str, step: &str) {
        let mut done = self.inner.done.lock().expect("done lock");
        done.remove(&(op_id.to_owned(), step.to_owned()));
        done.remove(&(op_id.to_owned(), ready_key(step)));
    }

    /// Forgets what every step of operation `op_id` did.
    pub(super) fn forget_operation(&self, op_id: &str) {
        let mut done = self.inner.done.lock().expect("done lock");
        done.retain(|(op, _), _| op != op_id);
    }

    /// Renders the step's templates; in deprovision and unbind deletes them last to first,
    /// otherwise applies them in order and waits until each is ready, then runs its checks and
    /// returns the values it reads.
    async fn act_on_target(
        &self,
        r: &Resource,
        kind: OpKind,
        step: &OpStep,
        action: &TargetAction,
        context: &Value,
    ) -> Result<Map<String, Value>, Halt> {
        let evaluator = &self.inner.evaluator;
        let target = self.target(action, context).map_err(Halt::Fail)?;
        let resources = (evaluator.resources(&action.templates, context)).map_err(unrendered)?;
        let names_key = (self.names_key().await).map_err(|e| Halt::Retry(e.to_string()))?;
        let scope = &scope(r, step, context, names_key);
        if kind.is_teardown() {
            // What an earlier run of this step deleted is gone: not asked again.
            let mut gone = self.done_before(&r.op.id, &step.name);
            if let Some(secret) = &action.secret {
                let name = self.secret_name(secret, context).map_err(Halt::Fail)?;
                let credentials = serde_json::json!({"credentials": name});
                if !gone.contains(&credentials) {
                    target.unpublish_credentials(&name, scope).await?;
                    gone.push(credentials);
                    self.remember_done(&r.op.id, &step.name, &gone);
                }
            }
            for resource in resources.iter().rev() {
                if gone.contains(resource) {
                    continue;
                }
                target.delete(resource, scope).await?;
                gone.push(resource.clone());
                self.remember_done(&r.op.id, &step.name, &gone);
            }
            if kind == OpKind::Deprovision {
                target.released(scope).await?;
            }
            return Ok(Map::new());
        }
        // A step that waits for readiness applied these very resources on its last run: it only
        // looks again. Rendered anew each run, so a change (a registry value) is still applied.
        if self.done_before(&r.op.id, &step.name) != resources {
            for resource in &resources {
                target.apply(resource, scope).await?;
            }
            if kind == OpKind::Update {
                target.prune(&resources, scope).await?;
            }
            self.remember_done(&r.op.id, &step.name, &resources);
        }
        // What an earlier run of this step saw ready is not asked again (for as long as what it
        // applied is trusted): the step waits for the rest.
        let mut seen_ready = self.done_before(&r.op.id, &ready_key(&step.name));
        for resource in &resources {
            if seen_ready.contains(resource) {
                continue;
            }
            match target.ready(resource, scope).await? {
                Readiness::Ready => {
                    seen_ready.push(resource.clone());
                    self.remember_done(&r.op.id, &ready_key(&step.name), &seen_ready);
                }
                Readiness::Waiting(reason) if target.watches_readiness() => {
                    return Err(Halt::Watched(reason));
                }
                Readiness::Waiting(reason) => return Err(Halt::Retry(reason)),
            }
        }
        let checks = (evaluator.resources(&action.readiness, context)).map_err(unrendered)?;
        let reads = (evaluator.resources(&action.read, context)).map_err(unrendered)?;
        for check in &checks {
            ready(target.check(check, scope).await?)?;
        }
        let mut values = Map::new();
        for read in &reads {
            values.extend(target.read(read, scope).await?);
        }
        Ok(values)
    }

    /// The target a step acts on: the configured target it names, or, for a step with
    /// `server`, one of that kind on the server it renders.
    fn target(&self, action: &TargetAction, context: &Value) -> Result<Arc<dyn Target>, String> {
        let name = &action.target;
        match &action.server {
            None => self.configured(name).cloned(),
            Some(server) => (self.inner.evaluator.renderer.render(server, context))
                .map_err(|e| format!("server: {e}"))
                .and_then(|server| {
                    (self.inner.targets.on_server(name, &server)).map_err(|e| e.to_string())
                }),
        }
    }

    /// The configured target `name`.
    fn configured(&self, name: &str) -> Result<&Arc<dyn Target>, String> {
        (self.inner.targets.get(name))
            .ok_or_else(|| format!("no target named {name:?} is configured"))
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
    pub(super) async fn publish(
        &self,
        r: &Resource,
        credentials: &Map<String, Value>,
        outputs: &mut crate::model::Outputs,
    ) -> Result<(), RunError> {
        let steps: Vec<(&OpStep, &TargetAction, &Value)> = (r.op.plan.steps.iter())
            .filter_map(|step| {
                let action = step.target()?;
                Some((step, action, action.secret.as_ref()?))
            })
            .collect();
        if steps.is_empty() {
            return Ok(());
        }
        let context = self.template_context(r, &r.op, None).await?;
        let names_key = self.names_key().await?;
        let mut published = Vec::new();
        for (step, action, secret) in steps {
            let at = match self.configured(&action.target) {
                Ok(target) => match self.secret_name(secret, &context) {
                    Ok(secret_name) => (target)
                        .publish_credentials(
                            &secret_name,
                            credentials,
                            &scope(r, step, &context, names_key),
                        )
                        .await
                        .map_err(|e| e.to_string()),
                    Err(reason) => Err(reason),
                },
                Err(reason) => Err(reason),
            };
            match at {
                Ok(at) => published.push(at),
                Err(reason) => {
                    let step = step.name.clone();
                    return Err(Failure::Publish { step, reason }.into());
                }
            }
        }
        outputs.secrets = published;
        Ok(())
    }
}

/// Where a `target` step of `r` acts, seen through its template context: an update's steps act
/// for the plan it moves to.
fn scope<'a>(
    r: &'a Resource,
    step: &'a OpStep,
    context: &'a Value,
    names_key: &'a NamesKey,
) -> Scope<'a> {
    Scope {
        instance_id: &r.key.instance_id,
        binding_id: r.key.binding_id.as_deref(),
        service_id: &r.service_id,
        plan_id: context["plan_id"].as_str().unwrap_or(&r.plan_id),
        step: &step.name,
        context: &context["instance"]["context"],
        names_key,
    }
}

/// How long to wait before trying a step again, growing with the time it has been tried:
/// from 200 ms up to 15 s.
fn retry_wait(elapsed_ms: i64) -> Duration {
    let half = u64::try_from(elapsed_ms / 2).unwrap_or(0);
    Duration::from_millis(half.clamp(200, 15_000))
}
