//! A plan's fingerprint: what its blueprint makes, in one canonical JSON form.
//!
//! The fingerprint holds the parts of a plan that decide what its instances and bindings get:
//! the instance's and the binding's registry entries, steps (with their templates, readiness
//! checks, reads and secrets), dashboard URL, credentials and rotation, and the kind of each
//! target the steps name. Catalog text (names, descriptions, display names) and the plan's
//! `deadline` are left out. The form is canonical: object keys sorted, durations in one
//! spelling, templates named from `templates:` replaced by their trees, so the order and
//! formatting of the YAML make no difference. It is kept as JSON rather than a hash, so that a
//! change can be explained: [`Fingerprint::changes_since`] names the paths that differ, never
//! their values (a template may hold a secret).
//!
//! Stores keep fingerprints across upgrades of brokkr, so the form must not change for a
//! blueprint that did not: a field added to the blueprint's types is left out of the serialized
//! form while it has its default (`skip_serializing_if`), as every optional field is now.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

use crate::config::{Blueprint, Step, TargetConfig};

/// The canonical form of what one plan's blueprint makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    value: Value,
    json: String,
}

impl Fingerprint {
    /// The fingerprint of `blueprint`, whose steps name targets of `targets`.
    pub fn of(blueprint: &Blueprint, targets: &BTreeMap<String, TargetConfig>) -> Self {
        let binding_steps = blueprint.binding.iter().flat_map(|b| &b.steps);
        let kinds: Map<String, Value> = (blueprint.instance.steps.iter())
            .chain(binding_steps)
            .filter_map(|step: &Step| step.target.as_deref())
            .map(|name| {
                let kind = targets.get(name).map(|t| t.kind.as_str());
                (name.to_owned(), kind.map_or(Value::Null, Value::from))
            })
            .collect();
        let mut whole = Map::new();
        whole.insert("instance".into(), to_value(&blueprint.instance));
        if let Some(binding) = &blueprint.binding {
            whole.insert("binding".into(), to_value(binding));
        }
        whole.insert("targets".into(), Value::Object(kinds));
        let value = canonical(Value::Object(whole));
        let json = value.to_string();
        Self { value, json }
    }

    /// The canonical JSON text, the same for every spelling of the same blueprint.
    pub fn as_json(&self) -> &str {
        &self.json
    }

    /// What changed from `recorded` (an earlier [`as_json`](Self::as_json)) to this one, path by
    /// path, in document order; empty when they are the same.
    pub fn changes_since(&self, recorded: &str) -> Result<Vec<Change>, serde_json::Error> {
        let before: Value = serde_json::from_str(recorded)?;
        let mut changes = Vec::new();
        diff(
            &canonical(before),
            &self.value,
            &mut String::new(),
            &mut changes,
        );
        Ok(changes)
    }
}

/// A blueprint part as JSON; its types always serialize.
fn to_value<T: serde::Serialize>(part: &T) -> Value {
    serde_json::to_value(part).expect("blueprint parts serialize to JSON")
}

/// `value` with the keys of every object in sorted order.
fn canonical(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<String, Value> = map.into_iter().collect();
            Value::Object(sorted.into_iter().map(|(k, v)| (k, canonical(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(canonical).collect()),
        other => other,
    }
}

/// One path where two fingerprints differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Where, e.g. `instance.steps[0].templates[1].spec.max_connections`.
    pub path: String,
    /// How.
    pub kind: ChangeKind,
}

/// How a path differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Only the newer fingerprint has it.
    Added,
    /// Only the recorded fingerprint has it.
    Removed,
    /// Both have it, with different values.
    Changed,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = match self.kind {
            ChangeKind::Added => "added",
            ChangeKind::Removed => "removed",
            ChangeKind::Changed => "changed",
        };
        let path = if self.path.is_empty() {
            "(the whole blueprint)"
        } else {
            &self.path
        };
        write!(f, "{path} ({how})")
    }
}

/// Adds to `out` every path under `path` where `before` and `after` differ.
fn diff(before: &Value, after: &Value, path: &mut String, out: &mut Vec<Change>) {
    let len = path.len();
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            let keys: std::collections::BTreeSet<&String> = b.keys().chain(a.keys()).collect();
            for key in keys {
                push_key(path, key);
                match (b.get(key), a.get(key)) {
                    (Some(b), Some(a)) => diff(b, a, path, out),
                    (None, _) => out.push(change(path, ChangeKind::Added)),
                    (_, None) => out.push(change(path, ChangeKind::Removed)),
                }
                path.truncate(len);
            }
        }
        (Value::Array(b), Value::Array(a)) => {
            for i in 0..b.len().max(a.len()) {
                path.push_str(&format!("[{i}]"));
                match (b.get(i), a.get(i)) {
                    (Some(b), Some(a)) => diff(b, a, path, out),
                    (None, _) => out.push(change(path, ChangeKind::Added)),
                    (_, None) => out.push(change(path, ChangeKind::Removed)),
                }
                path.truncate(len);
            }
        }
        (b, a) if b != a => out.push(change(path, ChangeKind::Changed)),
        _ => {}
    }
}

fn change(path: &str, kind: ChangeKind) -> Change {
    Change {
        path: path.to_owned(),
        kind,
    }
}

/// Appends `key` to `path`: `.key`, or `["key"]` when it is not a plain name.
fn push_key(path: &mut String, key: &str) {
    let plain = key
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if plain {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
    } else {
        path.push('[');
        path.push_str(&Value::from(key).to_string());
        path.push(']');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::load_str;

    /// A configuration with one plan whose blueprint is `blueprint` (YAML, indented by two) and
    /// whose description is `description`.
    fn config(description: &str, blueprint: &str) -> String {
        format!(
            "catalog:\n  services:\n  - {{name: s, id: s1, description: d, bindable: true,\n     \
             plans: [{{name: p, id: p1, description: {description}}}]}}\n\
             targets:\n  k8s: {{kind: kubernetes}}\n\
             blueprints:\n- service: s\n  plan: p\n{blueprint}"
        )
    }

    const BLUEPRINT: &str = "  instance:\n    registry:\n    - {name: password, value: '{{ password(16) }}', secret: true}\n    steps:\n    - name: objects\n      target: k8s\n      templates:\n      - {apiVersion: v1, kind: ConfigMap, metadata: {name: a}, data: {max_connections: '100', mode: fast}}\n      readiness:\n      - {apiVersion: v1, kind: ConfigMap, name: a, jsonpath: '{.data.mode}', equals: fast}\n    - {name: pause, delay: 5m}\n  binding:\n    credentials: {type: postgresql, password: \"{{ registry('password') }}\"}\n";

    fn fingerprint(yaml: &str) -> Fingerprint {
        let config = load_str("test.yaml", yaml).unwrap();
        let entry = config.plan("s1", "p1").unwrap();
        Fingerprint::of(&entry.blueprint, &config.targets)
    }

    fn paths(before: &Fingerprint, after: &Fingerprint) -> Vec<String> {
        let changes = after.changes_since(before.as_json()).unwrap();
        changes.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn key_order_formatting_and_duration_spelling_make_no_difference() {
        let first = fingerprint(&config("d", BLUEPRINT));
        let reordered = "  binding:\n    credentials:\n      password: \"{{ registry('password') }}\"\n      type: postgresql\n  instance:\n    steps:\n    - target: k8s\n      name: objects\n      readiness:\n      - {name: a, equals: fast, kind: ConfigMap, apiVersion: v1, jsonpath: '{.data.mode}'}\n      templates:\n      - data:\n          mode: fast\n          max_connections: '100'\n        metadata: {name: a}\n        kind: ConfigMap\n        apiVersion: v1\n    - {delay: 300s, name: pause}\n    registry:\n    - {secret: true, value: '{{ password(16) }}', name: password}\n";
        let second = fingerprint(&config("d", reordered));
        assert_eq!(first.as_json(), second.as_json());
        assert!(second.changes_since(first.as_json()).unwrap().is_empty());
    }

    #[test]
    fn a_changed_template_value_is_named_by_its_path_never_its_value() {
        let before = fingerprint(&config("d", BLUEPRINT));
        let after = fingerprint(&config("d", &BLUEPRINT.replace("'100'", "'200'")));
        assert_ne!(before, after);
        assert_eq!(
            paths(&before, &after),
            ["instance.steps[0].templates[0].data.max_connections (changed)"]
        );
    }

    #[test]
    fn added_and_removed_parts_are_named() {
        let before = fingerprint(&config("d", BLUEPRINT));
        let edited = BLUEPRINT
            .replace(", mode: fast}", ", \"tuning.level\": high}")
            .replace("    - {name: pause, delay: 5m}\n", "");
        let after = fingerprint(&config("d", &edited));
        assert_eq!(
            paths(&before, &after),
            [
                "instance.steps[0].templates[0].data.mode (removed)",
                "instance.steps[0].templates[0].data[\"tuning.level\"] (added)",
                "instance.steps[1] (removed)",
            ]
        );
    }

    #[test]
    fn credentials_registry_and_target_kinds_count() {
        let before = fingerprint(&config("d", BLUEPRINT));
        let after = fingerprint(&config(
            "d",
            &BLUEPRINT.replace("password(16)", "password(32)"),
        ));
        assert_eq!(
            paths(&before, &after),
            ["instance.registry[0].value (changed)"]
        );
        let after = fingerprint(&config(
            "d",
            &BLUEPRINT.replace("type: postgresql", "type: mysql"),
        ));
        assert_eq!(
            paths(&before, &after),
            ["binding.credentials.type (changed)"]
        );
        assert!(
            before
                .as_json()
                .contains(r#""targets":{"k8s":"kubernetes"}"#)
        );
    }

    #[test]
    fn catalog_text_and_the_deadline_make_no_difference() {
        let before = fingerprint(&config("d", BLUEPRINT));
        let after = fingerprint(&config(
            "another description",
            &format!("  deadline: 1h\n{BLUEPRINT}"),
        ));
        assert_eq!(before, after);
    }

    #[test]
    fn the_canonical_form_is_stable() {
        let yaml = config(
            "d",
            "  instance:\n    steps:\n    - {name: objects, target: k8s, templates: [{kind: ConfigMap, apiVersion: v1}]}\n  binding: {credentials: {type: x}}\n",
        );
        assert_eq!(
            fingerprint(&yaml).as_json(),
            r#"{"binding":{"credentials":{"type":"x"},"steps":[]},"instance":{"steps":[{"name":"objects","target":"k8s","templates":[{"apiVersion":"v1","kind":"ConfigMap"}]}]},"targets":{"k8s":"kubernetes"}}"#
        );
    }

    #[test]
    fn a_recorded_fingerprint_that_is_not_json_is_an_error() {
        let fingerprint = fingerprint(&config("d", BLUEPRINT));
        assert!(fingerprint.changes_since("not json").is_err());
    }
}
