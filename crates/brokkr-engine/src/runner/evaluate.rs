//! What a blueprint's templates see of stored resources: the template context of an operation's
//! steps, registry values, a binding's credentials and an instance's dashboard URL.

use brokkr_blueprint::RegistryEntry;
use brokkr_blueprint::evaluate::{EvaluationError, Subject, dashboard_url_reads};
use serde_json::{Map, Value};

use super::engine::Engine;
use crate::model::{Key, Operation, Resource};
use crate::store::StoreError;

impl Engine {
    /// The values templates and step kinds see for an operation on `r`. An update sees the
    /// plan and parameters it is moving to. A binding sees `instance`, or else its instance as
    /// stored.
    pub(super) async fn template_context(
        &self,
        r: &Resource,
        op: &Operation,
        instance: Option<&Resource>,
    ) -> Result<Value, StoreError> {
        let own = match &op.update {
            Some(update) => Subject {
                plan_id: &update.plan_id,
                parameters: update.attrs.parameters.as_ref(),
                context: update.attrs.context.as_ref(),
                ..subject(r)
            },
            None => subject(r),
        };
        let evaluator = &self.inner.evaluator;
        if r.key.binding_id.is_none() {
            return Ok(evaluator.context(&own, None));
        }
        let stored = match instance {
            Some(_) => None,
            None => {
                let key = Key::instance(&r.key.instance_id);
                self.inner.store.get(&key).await?
            }
        };
        let instance = instance.or(stored.as_ref()).map_or(own, subject);
        Ok(evaluator.context(&instance, Some(&own)))
    }

    /// The dashboard URL an instance's provision or update `op` learns when a step of it
    /// finishes having `produced` values: `None` when its plan has no `dashboard_url`, when a
    /// registry key the expression reads is still missing, or when the URL is known and the
    /// step produced none of the keys it reads; else the URL, or why it is not one.
    pub(super) async fn learnt_dashboard_url(
        &self,
        r: &Resource,
        op: &Operation,
        produced: Option<&Map<String, Value>>,
    ) -> Result<Option<Result<String, EvaluationError>>, StoreError> {
        let Some(expression) = &op.plan.dashboard_url else {
            return Ok(None);
        };
        let reads = dashboard_url_reads(expression);
        let has = |key: &String| {
            r.outputs.registry.contains_key(key) || produced.is_some_and(|p| p.contains_key(key))
        };
        let renewed = produced.is_some_and(|p| reads.iter().any(|k| p.contains_key(k)));
        if !reads.iter().all(has) || (r.dashboard_url.is_some() && !renewed) {
            return Ok(None);
        }
        let mut context = self.template_context(r, op, None).await?;
        if let Some(produced) = produced {
            let mut registry = r.outputs.registry.clone();
            registry.extend(produced.clone());
            context["registry"] = Value::Object(registry);
        }
        Ok(Some(
            self.inner.evaluator.dashboard_url(expression, &context),
        ))
    }

    /// The dashboard URL of a new instance `r` whose registry is computed, when its
    /// `expression` reads no key a step outputs: `None` until those steps have run.
    pub fn dashboard_url(
        &self,
        expression: &str,
        r: &Resource,
    ) -> Option<Result<String, EvaluationError>> {
        let known = |key: &String| r.outputs.registry.contains_key(key);
        if !dashboard_url_reads(expression).iter().all(known) {
            return None;
        }
        let evaluator = &self.inner.evaluator;
        let context = evaluator.context(&subject(r), None);
        Some(evaluator.dashboard_url(expression, &context))
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
    ) -> Result<Map<String, Value>, EvaluationError> {
        let Some(template) = &binding.op.plan.credentials else {
            return Ok(Map::new());
        };
        self.inner
            .evaluator
            .credentials(template, &subject(instance), &subject(binding))
    }

    /// Dry-runs `template`, a plan's binding credentials, for `instance` before it exists (see
    /// [`Evaluator::credentials_dry_run`](brokkr_blueprint::evaluate::Evaluator)).
    pub fn credentials_dry_run(
        &self,
        template: &Value,
        instance: &Resource,
    ) -> Result<Map<String, Value>, EvaluationError> {
        (self.inner.evaluator).credentials_dry_run(template, &subject(instance))
    }
}

/// How templates see a stored resource.
fn subject(r: &Resource) -> Subject<'_> {
    Subject {
        id: r.key.binding_id.as_deref().unwrap_or(&r.key.instance_id),
        service_id: &r.service_id,
        plan_id: &r.plan_id,
        parameters: r.attrs.parameters.as_ref(),
        context: r.attrs.context.as_ref(),
        registry: &r.outputs.registry,
    }
}
