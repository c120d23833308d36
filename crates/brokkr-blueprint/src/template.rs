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
//! cannot add keys, documents or structure. The functions available in expressions are those of
//! [`crate::functions`]; docs/templates.md describes them for template authors.

use std::sync::{Arc, Mutex, OnceLock};

use minijinja::{Environment, ErrorKind, UndefinedBehavior, Value as JValue, value::Serde};
use rand::SeedableRng;
use rand::rngs::ChaCha20Rng;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::functions;
use crate::names::NamesKey;

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
///
/// A renderer owns the random generator behind `password`, `pet_name` and certificate serial
/// numbers; successive renders draw successive values from it. `opaque_name` needs the broker's
/// [`NamesKey`], given once ([`Renderer::set_names_key`]); until then it fails.
pub struct Renderer {
    env: Environment<'static>,
    names: Arc<OnceLock<NamesKey>>,
}

impl Default for Renderer {
    fn default() -> Self {
        Self::new()
    }
}

impl Renderer {
    /// Creates an environment with strict undefined values and bounded fuel, whose random values
    /// come from a generator seeded by the operating system.
    pub fn new() -> Self {
        Self::with_rng(rand::make_rng())
    }

    /// Like [`Renderer::new`], but `password`, `pet_name` and certificate serial numbers are
    /// drawn from a ChaCha20 generator seeded with `seed`: the same seed and the same sequence of
    /// renders give the same values. Private keys (and so certificates) still differ every time.
    pub fn with_seed(seed: u64) -> Self {
        Self::with_rng(ChaCha20Rng::seed_from_u64(seed))
    }

    fn with_rng(rng: ChaCha20Rng) -> Self {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_fuel(Some(FUEL));
        env.add_filter("merge", merge);
        let names = Arc::new(OnceLock::new());
        functions::register(&mut env, &Arc::new(Mutex::new(rng)), &names);
        Self { env, names }
    }

    /// This renderer, with `key` behind `opaque_name`.
    #[must_use]
    pub fn with_names_key(self, key: NamesKey) -> Self {
        // A fresh renderer has no key yet.
        let _ = self.names.set(key);
        self
    }

    /// Gives `opaque_name` its key. A renderer keeps the first key it is given: setting another
    /// one afterwards fails (names made before would no longer be made again), the same one
    /// succeeds.
    pub fn set_names_key(&self, key: NamesKey) -> Result<(), NamesKey> {
        match self.names.set(key) {
            Ok(()) => Ok(()),
            Err(key) if self.names.get() == Some(&key) => Ok(()),
            Err(key) => Err(key),
        }
    }

    /// The key behind `opaque_name`, once given.
    pub fn names_key(&self) -> Option<&NamesKey> {
        self.names.get()
    }

    /// Renders `tree` with the values of `context` in scope.
    pub fn render(&self, tree: &Value, context: &impl Serialize) -> Result<Value, TemplateError> {
        let ctx = functions::with_callable_registry(JValue::from(Serde(context)));
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

    /// The variables the template leaf `source` reads that are neither in `scope` nor functions
    /// of the library, sorted: names that are undefined whatever a request holds. A leaf that
    /// does not parse has none ([`Renderer::check`] reports it).
    pub fn unknown_variables(&self, source: &str, scope: &[&str]) -> Vec<String> {
        let Ok(template) = self.env.template_from_str(source) else {
            return Vec::new();
        };
        let globals: Vec<&str> = self.env.globals().map(|(name, _)| name).collect();
        let mut unknown: Vec<String> = (template.undeclared_variables(false).into_iter())
            .filter(|v| !scope.contains(&v.as_str()) && !globals.contains(&v.as_str()))
            .collect();
        unknown.sort();
        unknown
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
                    path.push_str(&escape_key(key));
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

/// The expression inside a leaf that is exactly `{{ expr }}` (whitespace control markers allowed).
fn single_expression(leaf: &str) -> Option<&str> {
    let inner = leaf.trim().strip_prefix("{{")?.strip_suffix("}}")?;
    let inner = inner.strip_prefix(['-', '+']).unwrap_or(inner);
    let inner = inner.strip_suffix(['-', '+']).unwrap_or(inner);
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
                path.push_str(&escape_key(key));
                walk_leaves(value, path, f);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

/// A key as a JSON pointer token.
fn escape_key(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn display_path(path: &str) -> String {
    if path.is_empty() {
        "/".into()
    } else {
        path.into()
    }
}

fn error(path: &str, e: &minijinja::Error) -> TemplateError {
    // The detail names the failing construct; neither minijinja nor brokkr's functions print
    // context values or generated secrets in it. Function errors carry their own wording.
    let message = match e.detail() {
        Some(detail) if e.kind() == ErrorKind::InvalidOperation => detail.to_owned(),
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

    #[test]
    fn whitespace_control_still_makes_a_single_expression() {
        let out = render(
            json!({"n": "{{- p.n -}}", "m": "{{+ p.n }}"}),
            json!({"p": {"n": 3}}),
        )
        .unwrap();
        assert_eq!(out, json!({"n": 3, "m": 3}));
    }

    #[test]
    fn check_paths_escape_keys() {
        let err = Renderer::new()
            .check(&json!({"a/b": {"c~d": "{{ 1 + }}"}}))
            .unwrap_err();
        assert_eq!(err.path, "/a~1b/c~0d");
    }

    // -- the shape of a rendered tree never depends on parameter values ------------------------

    /// The tree with every string replaced by `""`: keys, nesting, list lengths and the other
    /// scalars stay.
    fn shape(v: &Value) -> Value {
        match v {
            Value::String(_) => json!(""),
            Value::Array(items) => Value::Array(items.iter().map(shape).collect()),
            Value::Object(map) => {
                Value::Object(map.iter().map(|(k, v)| (k.clone(), shape(v))).collect())
            }
            other => other.clone(),
        }
    }

    fn hostile_string() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let pieces = prop::sample::select(vec![
            "{{",
            "}}",
            "{%",
            "%}",
            "{#",
            "#}",
            "---",
            "...",
            ": ",
            "- ",
            "\n",
            "\r\n",
            "\"",
            "'",
            "\\",
            "#",
            "&a",
            "*a",
            "!!binary",
            "[",
            "]",
            "{",
            "}",
            "none",
            "null",
            "~",
            "|",
            ">",
            "{{ 7*7 }}",
            "{% if true %}x{% endif %}",
            "kind: Secret",
            "\u{0}",
            "\u{feff}",
            "é",
            "{{ password(8) }}",
            "\t",
        ]);
        prop::collection::vec(
            prop_oneof![pieces.prop_map(String::from), any::<String>()],
            0..12,
        )
        .prop_map(|parts| parts.concat())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        #[test]
        fn a_parameter_string_only_ever_fills_its_leaves(s in hostile_string()) {
            let template = json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": "{{ param('/name') }}",
                    "labels": {"app": "x-{{ param('/name') }}"},
                },
                "data": {
                    "raw": "{{ parameters.name }}",
                    "upper": "{{ param('/name') | upper }}",
                    "b64": "{{ b64encode(param('/name')) }}",
                    "json": "{{ param('/name') | tojson }}",
                    "text": "say {{ parameters.name }}{% if parameters.name %}!{% endif %}",
                    "list": ["{{ param('/name') }}", 1, true],
                    "sha": "{{ sha256(parameters.name) }}",
                },
            });
            let out = Renderer::with_seed(1)
                .render(&template, &json!({"parameters": {"name": s}}))
                .unwrap();
            proptest::prop_assert_eq!(shape(&out), shape(&template));
            proptest::prop_assert_eq!(&out["metadata"]["name"], &json!(s));
            proptest::prop_assert_eq!(&out["metadata"]["labels"]["app"], &json!(format!("x-{s}")));
            proptest::prop_assert_eq!(&out["data"]["raw"], &json!(s));
            proptest::prop_assert_eq!(&out["data"]["upper"], &json!(s.to_uppercase()));
            let json_text = out["data"]["json"].as_str().unwrap();
            proptest::prop_assert_eq!(serde_json::from_str::<Value>(json_text).unwrap(), json!(s));
            let bang = if s.is_empty() { "" } else { "!" };
            proptest::prop_assert_eq!(&out["data"]["text"], &json!(format!("say {s}{bang}")));
            proptest::prop_assert_eq!(&out["data"]["list"][0], &json!(s));
        }

        #[test]
        fn a_parameter_value_of_any_type_stays_in_its_leaf(v in any_json()) {
            let template = json!({
                "spec": {"value": "{{ param('/v', none) }}", "fixed": "k"},
                "items": ["{{ parameters.v | tojson }}", 2],
            });
            let out = Renderer::new()
                .render(&template, &json!({"parameters": {"v": v}}))
                .unwrap();
            let mut expected = json!({"spec": {"fixed": "k"}, "items": ["", 2]});
            if !v.is_null() {
                expected["spec"] = json!({"value": shape(&v), "fixed": ""});
            }
            expected["spec"]["fixed"] = json!("");
            proptest::prop_assert_eq!(shape(&out), expected);
            if !v.is_null() {
                proptest::prop_assert_eq!(&out["spec"]["value"], &v);
            }
        }
    }

    fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            hostile_string().prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((hostile_string(), inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    // -- docs/templates.md ------------------------------------------------------------------

    /// The `yaml example` blocks of docs/templates.md, with the line each starts on.
    fn doc_examples() -> Vec<(usize, String)> {
        const DOC: &str = include_str!("../../../docs/templates.md");
        let mut out = Vec::new();
        let mut current: Option<(usize, String)> = None;
        for (i, line) in DOC.lines().enumerate() {
            match &mut current {
                None if line.trim_end() == "```yaml example" => {
                    current = Some((i + 1, String::new()));
                }
                Some((_, body)) if line.trim_end() != "```" => {
                    body.push_str(line);
                    body.push('\n');
                }
                Some(_) => out.push(current.take().unwrap()),
                None => {}
            }
        }
        assert!(current.is_none(), "unterminated example");
        out
    }

    fn run_example(line: usize, body: &str) {
        let at = format!("docs/templates.md:{line}");
        let ex: Value = serde_saphyr::from_str(body).unwrap_or_else(|e| panic!("{at}: {e}"));
        let known = [
            "template",
            "parameters",
            "context",
            "registry",
            "seed",
            "expect",
            "matches",
            "error",
        ];
        for key in ex.as_object().unwrap().keys() {
            assert!(known.contains(&key.as_str()), "{at}: unknown field {key}");
        }
        let renderer = match ex.get("seed") {
            Some(seed) => Renderer::with_seed(seed.as_u64().unwrap()),
            None => Renderer::new(),
        };
        let renderer = renderer.with_names_key(crate::NamesKey::RENDER_ONLY);
        let mut ctx = json!({"parameters": ex.get("parameters").cloned().unwrap_or(json!({}))});
        if let Some(extra) = ex.get("context") {
            for (k, v) in extra.as_object().unwrap() {
                ctx[k] = v.clone();
            }
        }
        let mut result = Ok(());
        if let Some(entries) = ex.get("registry") {
            ctx["registry"] = json!({});
            for (name, entry) in entries.as_object().unwrap() {
                match renderer.render(entry, &ctx) {
                    Ok(v) => ctx["registry"][name] = v,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
        }
        let template = ex
            .get("template")
            .unwrap_or_else(|| panic!("{at}: no template"));
        let result = result.and_then(|()| renderer.render(template, &ctx));
        let checks = ["expect", "matches", "error"];
        assert!(
            checks.iter().any(|c| ex.get(c).is_some()),
            "{at}: nothing to check"
        );
        if let Some(error) = ex.get("error") {
            let e = result.expect_err(&format!("{at}: expected an error"));
            let want = error.as_str().unwrap();
            assert!(
                e.to_string().contains(want),
                "{at}: error `{e}` lacks `{want}`"
            );
            return;
        }
        let out = result.unwrap_or_else(|e| panic!("{at}: {e}"));
        if let Some(expect) = ex.get("expect") {
            assert_eq!(&out, expect, "{at}");
        }
        for (pointer, pattern) in ex
            .get("matches")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let leaf = out
                .pointer(pointer)
                .unwrap_or_else(|| panic!("{at}: no leaf {pointer}"));
            let leaf = leaf
                .as_str()
                .unwrap_or_else(|| panic!("{at}: {pointer} is not a string"));
            let re = regex::Regex::new(pattern.as_str().unwrap()).unwrap();
            assert!(
                re.is_match(leaf),
                "{at}: {pointer} = {leaf:?} does not match {re}"
            );
        }
    }

    #[test]
    fn docs_examples_render_as_documented() {
        let examples = doc_examples();
        assert!(examples.len() >= 15, "only {} examples", examples.len());
        for (line, body) in &examples {
            run_example(*line, body);
        }
        for name in functions::FUNCTIONS {
            let used = examples.iter().any(|(_, body)| {
                body.contains(&format!("{name}(")) || body.contains(&format!("| {name}"))
            });
            assert!(used, "docs/templates.md has no example of {name}");
        }
    }
}
