//! Checks of template trees that need no rendering: the registry keys a tree reads, and the
//! credentials entries that are written as literals and so can be judged before any request.
//!
//! Registry reads are found in the source of each expression (`{{ … }}` and `{% … %}` blocks):
//! `registry('key')`, `registry("key")`, `registry['key']` and `registry.key`. A key computed at
//! run time (`registry(name)`) cannot be known and is not reported. Positions are returned as
//! field-path suffixes (`.metadata.name`, `[0]`) to append to the tree's own field.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

/// The expression blocks of a template leaf.
static BLOCK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)\{\{.*?\}\}|\{%.*?%\}").expect("valid regex"));

/// A registry read with a literal key: call, subscript or attribute (not a method call).
static REGISTRY_READ: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"\bregistry\s*(?:\(\s*(?:'([^']*)'|"([^"]*)")\s*\)|\[\s*(?:'([^']*)'|"([^"]*)")\s*\]|\.\s*([A-Za-z_][A-Za-z0-9_]*)(\s*\()?)"#,
    )
    .expect("valid regex")
});

/// Every string leaf of `tree` with its field-path suffix.
fn leaves<'a>(tree: &'a Value, at: &mut String, out: &mut Vec<(String, &'a str)>) {
    match tree {
        Value::String(s) => out.push((at.clone(), s)),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = at.len();
                at.push_str(&format!("[{i}]"));
                leaves(item, at, out);
                at.truncate(len);
            }
        }
        Value::Object(map) => {
            for (key, value) in map {
                let len = at.len();
                at.push('.');
                at.push_str(key);
                leaves(value, at, out);
                at.truncate(len);
            }
        }
        _ => {}
    }
}

/// The registry keys an expression source reads, in order.
pub fn registry_reads_in(source: &str) -> Vec<String> {
    BLOCK
        .find_iter(source)
        .flat_map(|block| REGISTRY_READ.captures_iter(block.as_str()))
        .filter(|c| c.get(6).is_none())
        .filter_map(|c| {
            (1..=5)
                .find_map(|i| c.get(i))
                .map(|m| m.as_str().to_owned())
        })
        .collect()
}

/// The registry keys `tree` reads, each with the field-path suffix of its leaf.
pub fn registry_reads(tree: &Value) -> Vec<(String, String)> {
    let mut found = Vec::new();
    leaves(tree, &mut String::new(), &mut found);
    found
        .into_iter()
        .flat_map(|(at, leaf)| {
            registry_reads_in(leaf)
                .into_iter()
                .map(move |key| (at.clone(), key))
        })
        .collect()
}

/// Converts a template error's JSON pointer within `tree` to a field-path suffix.
pub fn pointer_to_field(tree: &Value, pointer: &str) -> String {
    let mut at = String::new();
    if pointer == "/" {
        return at;
    }
    let mut node = Some(tree);
    for token in pointer.split('/').skip(1) {
        let token = token.replace("~1", "/").replace("~0", "~");
        match node {
            Some(Value::Array(items)) => {
                at.push_str(&format!("[{token}]"));
                node = token.parse::<usize>().ok().and_then(|i| items.get(i));
            }
            _ => {
                at.push('.');
                at.push_str(&token);
                node = node.and_then(|n| n.get(&token));
            }
        }
    }
    at
}

fn is_template(leaf: &str) -> bool {
    leaf.contains("{{") || leaf.contains("{%")
}

/// Problems a credentials template will have whatever it is rendered with: it is not a map, it
/// has no `type`, or a well-known entry written as a literal breaks the servicebinding.io rules.
/// Each problem comes with the field-path suffix of the entry. A credentials template that is a
/// single expression can only be checked when rendered.
pub fn credentials_literals(tree: &Value) -> Vec<(String, String)> {
    let map = match tree {
        Value::Object(map) => map,
        Value::String(s) if is_template(s) => return Vec::new(),
        _ => return vec![(String::new(), "credentials must be a map of entries".into())],
    };
    let mut problems = Vec::new();
    if !map.contains_key("type") {
        problems.push((
            String::new(),
            "credentials need a `type` entry (servicebinding.io)".into(),
        ));
    }
    for (key, value) in map {
        let literal = match value {
            Value::String(s) => !is_template(s),
            Value::Object(_) | Value::Array(_) => {
                let mut found = Vec::new();
                leaves(value, &mut String::new(), &mut found);
                !found.iter().any(|(_, leaf)| is_template(leaf))
            }
            _ => true,
        };
        if !literal {
            continue;
        }
        let mut alone = Map::new();
        if key != "type" {
            alone.insert("type".into(), Value::String("type".into()));
        }
        alone.insert(key.clone(), value.clone());
        if let Err(e) = brokkr_servicebinding::validate(&alone) {
            problems.push((format!(".{key}"), e.to_string()));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_literal_registry_reads_only() {
        let tree = json!({
            "a": "{{ registry('one') }}-{{ registry[\"two\"] }}",
            "b": ["{% if registry.three %}x{% endif %}", "registry('not-an-expression')"],
            "c": "{{ registry(name) }} {{ registry.items() }} {{ myregistry.x }}",
        });
        assert_eq!(
            registry_reads(&tree),
            [
                (".a".to_owned(), "one".to_owned()),
                (".a".to_owned(), "two".to_owned()),
                (".b[0]".to_owned(), "three".to_owned()),
            ]
        );
    }

    #[test]
    fn pointers_become_field_paths() {
        let tree = json!({"spec": {"ports": [{"port": "{{ x }}"}]}, "a/b": 1});
        assert_eq!(
            pointer_to_field(&tree, "/spec/ports/0/port"),
            ".spec.ports[0].port"
        );
        assert_eq!(pointer_to_field(&tree, "/a~1b"), ".a/b");
        assert_eq!(pointer_to_field(&tree, "/"), "");
    }

    #[test]
    fn literal_credentials_entries_are_judged_now() {
        let problems = credentials_literals(&json!({
            "type": "postgresql", "host": "bad host", "port": 70000,
            "uri": "{{ registry('uri') }}", "username": 5,
        }));
        let fields: Vec<_> = problems.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(fields, [".host", ".port", ".username"], "{problems:?}");
        assert!(problems[1].1.contains("1 to 65535"));
        let problems = credentials_literals(&json!({"host": "db"}));
        assert!(problems[0].1.contains("`type`"), "{problems:?}");
        assert!(credentials_literals(&json!("{{ parameters.credentials }}")).is_empty());
        assert!(!credentials_literals(&json!(["type"])).is_empty());
    }
}
