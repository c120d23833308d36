//! Evaluating a blueprint for one instance or binding: the template context, registry values,
//! the resources a step renders (a resource, in this crate, is a rendered template tree),
//! credentials and an instance's dashboard URL. Pure: the engine calls it with stored instances and bindings, `brokkr render` with
//! made-up ones.

use serde_json::{Map, Value, json};

use crate::config::RegistryEntry;
use crate::template::Renderer;

/// What templates may know about an instance or a binding.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// The instance id, or the binding id.
    pub id: &'a str,
    /// The service offering id.
    pub service_id: &'a str,
    /// The plan id.
    pub plan_id: &'a str,
    /// The parameters the platform passed, if any.
    pub parameters: Option<&'a Map<String, Value>>,
    /// The platform's context, if any.
    pub context: Option<&'a Map<String, Value>>,
    /// Registry values computed so far.
    pub registry: &'a Map<String, Value>,
}

/// Why a blueprint could not be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvaluationError {
    /// A template did not evaluate (e.g. it needs a parameter that is absent).
    #[error("{0}")]
    Template(String),
    /// The credentials break the servicebinding.io well-known entry rules.
    #[error("{0}")]
    Invalid(String),
}

/// Evaluates a blueprint's templates: a [`Renderer`] and what templates know about targets.
#[derive(Default)]
pub struct Evaluator {
    /// The template engine.
    pub renderer: Renderer,
    /// `targets` in templates: for each target name, what bindings are told about it
    /// (`kind`, `host`, `port`).
    pub targets: Value,
}

impl Evaluator {
    /// An evaluator with `renderer` and the targets' facts.
    pub fn new(renderer: Renderer, targets: Value) -> Self {
        Self { renderer, targets }
    }

    /// The template context for an instance, or for a binding of it (see [`template_context`]),
    /// with `targets`.
    pub fn context(&self, instance: &Subject<'_>, binding: Option<&Subject<'_>>) -> Value {
        let mut context = template_context(instance, binding);
        context["targets"] = match &self.targets {
            Value::Null => json!({}),
            t => t.clone(),
        };
        context
    }

    /// Evaluates registry definitions in order, each seeing the values before it: for an
    /// instance from nothing, for a binding from a copy of its instance's registry.
    pub fn registry(
        &self,
        entries: &[RegistryEntry],
        instance: &Subject<'_>,
        binding: Option<&Subject<'_>>,
    ) -> Result<Map<String, Value>, EvaluationError> {
        let mut values = match binding {
            Some(_) => instance.registry.clone(),
            None => Map::new(),
        };
        let mut context = self.context(instance, binding);
        for entry in entries {
            context["registry"] = Value::Object(values.clone());
            let value = self
                .renderer
                .render(&entry.value, &context)
                .map_err(|e| EvaluationError::Template(format!("registry {}: {e}", entry.name)))?;
            values.insert(entry.name.clone(), value);
        }
        Ok(values)
    }

    /// Whether a step's `when` expression holds in `context`: false for `none`, `false`, zero
    /// and empty strings, lists and maps, true otherwise.
    pub fn condition(&self, when: &str, context: &Value) -> Result<bool, EvaluationError> {
        let expression = Value::String(format!("{{{{ {when} }}}}"));
        let value = self
            .renderer
            .render(&expression, context)
            .map_err(|e| EvaluationError::Template(e.to_string()))?;
        Ok(match value {
            Value::Null => false,
            Value::Bool(b) => b,
            Value::Number(n) => n.as_f64() != Some(0.0),
            Value::String(s) => !s.is_empty(),
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
        })
    }

    /// Renders the templates of a `target` step, in order.
    pub fn resources(
        &self,
        templates: &[Value],
        context: &Value,
    ) -> Result<Vec<Value>, EvaluationError> {
        templates
            .iter()
            .enumerate()
            .map(|(i, t)| {
                self.renderer
                    .render(t, context)
                    .map_err(|e| EvaluationError::Template(format!("templates[{i}]: {e}")))
            })
            .collect()
    }

    /// Renders an instance's `dashboard_url` expression in `context` (an instance's
    /// [`Evaluator::context`]) and checks that it is an absolute http(s) URL.
    pub fn dashboard_url(
        &self,
        expression: &str,
        context: &Value,
    ) -> Result<String, EvaluationError> {
        let tree = Value::String(expression.to_owned());
        let rendered = self
            .renderer
            .render(&tree, context)
            .map_err(|e| EvaluationError::Template(format!("dashboard_url: {e}")))?;
        let url = match rendered {
            Value::String(url) => url,
            Value::Null => {
                return Err(EvaluationError::Invalid(
                    "dashboard_url: renders to nothing, not a URL".to_owned(),
                ));
            }
            other => {
                let kind = match other {
                    Value::Bool(_) => "a boolean",
                    Value::Number(_) => "a number",
                    Value::Array(_) => "a list",
                    _ => "a map",
                };
                return Err(EvaluationError::Invalid(format!(
                    "dashboard_url: renders to {kind}, not a URL"
                )));
            }
        };
        check_dashboard_url(&url)
            .map_err(|e| EvaluationError::Invalid(format!("dashboard_url: {e}")))?;
        Ok(url)
    }

    /// Renders a credentials template for `binding` of `instance` and checks the result.
    pub fn credentials(
        &self,
        template: &Value,
        instance: &Subject<'_>,
        binding: &Subject<'_>,
    ) -> Result<Map<String, Value>, EvaluationError> {
        let context = self.context(instance, Some(binding));
        let rendered = self
            .renderer
            .render(template, &context)
            .map_err(|e| EvaluationError::Template(e.to_string()))?;
        brokkr_servicebinding::finalize(rendered)
            .map_err(|e| EvaluationError::Invalid(e.to_string()))
    }
    /// Dry-runs a credentials template for `instance` before any binding exists: renders and
    /// checks it as a binding with no parameters of its own would see it (its id a
    /// placeholder, its plan and registry the instance's). A plan whose credentials could never
    /// be valid is refused with this.
    pub fn credentials_dry_run(
        &self,
        template: &Value,
        instance: &Subject<'_>,
    ) -> Result<Map<String, Value>, EvaluationError> {
        let binding = Subject {
            id: "dry-run",
            parameters: None,
            context: None,
            ..*instance
        };
        self.credentials(template, instance, &binding)
    }
}

/// The names [`template_context`] (with an [`Evaluator`]'s `targets`) puts in scope.
pub const SCOPE: &[&str] = &[
    "instance_id",
    "binding_id",
    "service_id",
    "plan_id",
    "parameters",
    "context",
    "instance",
    "registry",
    "targets",
];

/// The template context for an instance, or for a binding of it: `parameters`, `context` and
/// `registry` are the subject's own; `instance` holds the instance's.
pub fn template_context(instance: &Subject<'_>, binding: Option<&Subject<'_>>) -> Value {
    let object = |map: Option<&Map<String, Value>>| Value::Object(map.cloned().unwrap_or_default());
    let own = binding.unwrap_or(instance);
    json!({
        "instance_id": instance.id,
        "binding_id": binding.map(|b| b.id),
        "service_id": own.service_id,
        "plan_id": own.plan_id,
        "parameters": object(own.parameters),
        "context": object(own.context),
        "instance": {
            "id": instance.id,
            "parameters": object(instance.parameters),
            "context": object(instance.context),
        },
        "registry": own.registry,
    })
}

/// The registry keys a `dashboard_url` expression reads: it can be evaluated once all of them
/// exist.
pub fn dashboard_url_reads(expression: &str) -> Vec<String> {
    crate::check::registry_reads_in(expression)
}

/// Whether `url` may be answered as an instance's dashboard: an absolute `http` or `https` URL
/// with a host. The error says why not, without the URL itself.
pub fn check_dashboard_url(url: &str) -> Result<(), String> {
    match url::Url::parse(url) {
        Err(url::ParseError::RelativeUrlWithoutBase) => {
            Err("is not an absolute URL (it has no scheme such as https://)".to_owned())
        }
        Err(e) => Err(format!("is not a valid URL ({e})")),
        Ok(parsed) if !matches!(parsed.scheme(), "http" | "https") => Err(format!(
            "has the scheme `{}`; a dashboard URL is http or https",
            parsed.scheme()
        )),
        Ok(_) => Ok(()),
    }
}
