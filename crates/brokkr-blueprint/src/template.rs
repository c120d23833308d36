//! Typed template trees.
//!
//! A template is a JSON/YAML tree. Only its string leaves are evaluated, with
//! [minijinja](https://docs.rs/minijinja) expressions:
//!
//! - a leaf that is exactly one expression, `"{{ parameters.port }}"`, yields the expression's
//!   JSON value (number, object, list, …); a `none` or undefined result removes the key;
//! - any other leaf containing `{{ … }}` renders to a string;
//! - keys are never evaluated.
//!
//! Values from a request can therefore only ever fill a leaf the template author wrote: they
//! cannot add keys, documents or structure.

use minijinja::{Environment, UndefinedBehavior, Value as JValue, value::Serde};
use serde::Serialize;
use serde_json::{Map, Value};

/// A template that failed to evaluate; the message names the leaf's path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("template {path}: {message}")]
pub struct TemplateError {
    /// JSON pointer of the failing leaf.
    pub path: String,
    /// What went wrong.
    pub message: String,
}

/// Upper bound on the work a single template evaluation may do.
const FUEL: u64 = 100_000;

/// The evaluation environment with brokkr's function library.
pub struct Renderer {
    env: Environment<'static>,
}

impl Default for Renderer {
    fn default() -> Self {
        Self::new()
    }
}

impl Renderer {
    /// Creates an environment with strict undefined values and bounded fuel.
    pub fn new() -> Self {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_fuel(Some(FUEL));
        env.add_filter("merge", merge);
        Self { env }
    }

    /// Renders `tree` with the values of `context` in scope.
    pub fn render(&self, tree: &Value, context: &impl Serialize) -> Result<Value, TemplateError> {
        let ctx = JValue::from(Serde(context));
        Ok(self
            .render_node(tree, &ctx, &mut String::new())?
            .unwrap_or(Value::Null))
    }

    /// Checks that every leaf of `tree` parses, without evaluating it.
    pub fn check(&self, tree: &Value) -> Result<(), TemplateError> {
        let mut result = Ok(());
        walk_leaves(tree, &mut String::new(), &mut |path, leaf| {
            if result.is_err() {
                return;
            }
            let parsed = match single_expression(leaf) {
                Some(expr) => self.env.compile_expression(expr).map(drop),
                None if is_template(leaf) => self.env.template_from_str(leaf).map(drop),
                None => Ok(()),
            };
            if let Err(e) = parsed {
                result = Err(error(path, &e));
            }
        });
        result
    }

    fn render_node(
        &self,
        node: &Value,
        ctx: &JValue,
        path: &mut String,
    ) -> Result<Option<Value>, TemplateError> {
        match node {
            Value::String(leaf) => self.render_leaf(leaf, ctx, path),
            Value::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("/{i}"));
                    out.extend(self.render_node(item, ctx, path)?);
                    path.truncate(len);
                }
                Ok(Some(Value::Array(out)))
            }
            Value::Object(map) => {
                let mut out = Map::with_capacity(map.len());
                for (key, value) in map {
                    let len = path.len();
                    path.push('/');
                    path.push_str(&key.replace('~', "~0").replace('/', "~1"));
                    if let Some(v) = self.render_node(value, ctx, path)? {
                        out.insert(key.clone(), v);
                    }
                    path.truncate(len);
                }
                Ok(Some(Value::Object(out)))
            }
            other => Ok(Some(other.clone())),
        }
    }

    fn render_leaf(
        &self,
        leaf: &str,
        ctx: &JValue,
        path: &str,
    ) -> Result<Option<Value>, TemplateError> {
        if let Some(expr) = single_expression(leaf) {
            let value = self
                .env
                .compile_expression(expr)
                .and_then(|e| e.eval(ctx))
                .map_err(|e| error(path, &e))?;
            if value.is_undefined() || value.is_none() {
                return Ok(None);
            }
            let json = serde_json::to_value(&value).map_err(|e| TemplateError {
                path: display_path(path),
                message: e.to_string(),
            })?;
            return Ok(Some(json));
        }
        if is_template(leaf) {
            let text = self
                .env
                .render_str(leaf, ctx)
                .map_err(|e| error(path, &e))?;
            return Ok(Some(Value::String(text)));
        }
        Ok(Some(Value::String(leaf.to_owned())))
    }
}

/// `a | merge(b)`: the keys of map `a` overlaid with those of map `b`; `b` may be none.
fn merge(a: JValue, b: Option<JValue>) -> Result<JValue, minijinja::Error> {
    let to_map = |v: &JValue| -> Result<Map<String, Value>, minijinja::Error> {
        match serde_json::to_value(v) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(Value::Null) => Ok(Map::new()),
            _ => Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                "merge() takes maps",
            )),
        }
    };
    let mut out = to_map(&a)?;
    if let Some(b) = b.filter(|b| !b.is_none() && !b.is_undefined()) {
        out.extend(to_map(&b)?);
    }
    Ok(JValue::from(Serde(Value::Object(out))))
}

/// The expression inside a leaf that is exactly `{{ expr }}`.
fn single_expression(leaf: &str) -> Option<&str> {
    let inner = leaf.trim().strip_prefix("{{")?.strip_suffix("}}")?;
    if inner.contains("{{") || inner.contains("}}") || inner.contains("{%") {
        return None;
    }
    Some(inner.trim())
}

fn is_template(leaf: &str) -> bool {
    leaf.contains("{{") || leaf.contains("{%") || leaf.contains("{#")
}

fn walk_leaves(node: &Value, path: &mut String, f: &mut impl FnMut(&str, &str)) {
    match node {
        Value::String(leaf) => f(path, leaf),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("/{i}"));
                walk_leaves(item, path, f);
                path.truncate(len);
            }
        }
        Value::Object(map) => {
            for (key, value) in map {
                let len = path.len();
                path.push('/');
                path.push_str(key);
                walk_leaves(value, path, f);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

fn display_path(path: &str) -> String {
    if path.is_empty() {
        "/".into()
    } else {
        path.into()
    }
}

fn error(path: &str, e: &minijinja::Error) -> TemplateError {
    // The detail names the failing construct; minijinja never prints context values in it.
    let message = match e.detail() {
        Some(detail) => format!("{}: {detail}", e.kind()),
        None => e.kind().to_string(),
    };
    TemplateError {
        path: display_path(path),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(tree: Value, ctx: Value) -> Result<Value, TemplateError> {
        Renderer::new().render(&tree, &ctx)
    }

    #[test]
    fn single_expression_leaves_keep_their_type() {
        let out = render(
            json!({"port": "{{ p.port }}", "tags": "{{ p.tags }}", "name": "db-{{ p.id }}"}),
            json!({"p": {"port": 5432, "tags": ["a", "b"], "id": 7}}),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"port": 5432, "tags": ["a", "b"], "name": "db-7"})
        );
    }

    #[test]
    fn none_removes_the_key() {
        let out = render(json!({"a": "{{ none }}", "b": 1}), json!({})).unwrap();
        assert_eq!(out, json!({"b": 1}));
    }

    #[test]
    fn hostile_values_fill_one_leaf_only() {
        let hostile = "x\"}\n---\nkind: Secret\n{{ 7*7 }}";
        let out = render(
            json!({"metadata": {"name": "{{ p.name }}", "label": "v-{{ p.name }}"}}),
            json!({"p": {"name": hostile}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["name"], hostile);
        assert_eq!(out["metadata"]["label"], format!("v-{hostile}"));
        assert_eq!(out.as_object().unwrap().len(), 1);
    }

    #[test]
    fn merge_overlays_maps_and_tolerates_none() {
        let out = render(
            json!("{{ a | merge(b) }}"),
            json!({"a": {"x": 1, "y": 2}, "b": {"y": 3}}),
        )
        .unwrap();
        assert_eq!(out, json!({"x": 1, "y": 3}));
        let out = render(
            json!("{{ a | merge(b) }}"),
            json!({"a": {"x": 1}, "b": null}),
        )
        .unwrap();
        assert_eq!(out, json!({"x": 1}));
    }

    #[test]
    fn undefined_values_are_errors_with_the_leaf_path() {
        let err = render(json!({"a": {"b": "{{ nope.x }}"}}), json!({})).unwrap_err();
        assert_eq!(err.path, "/a/b");
    }

    #[test]
    fn check_reports_syntax_errors() {
        let r = Renderer::new();
        assert!(r.check(&json!({"a": "{{ 1 + }}"})).is_err());
        assert!(
            r.check(&json!({"a": "{{ x.y | merge(z) }}", "b": "plain"}))
                .is_ok()
        );
    }
}
