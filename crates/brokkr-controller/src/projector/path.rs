//! The JSONPath subset workload mappings use: fields (`.spec`, `['spec']`), indices (`[0]`) and
//! the wildcard (`[*]`, `.*`). A *fixed* path (servicebinding.io's "Fixed JSONPath") has fields
//! only, so it names one location, which [`Path::get_or_create`] makes when it is missing.

use std::fmt;

use serde_json::{Map, Value};

/// One step of a [`Path`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// A field of an object.
    Field(String),
    /// An element of an array.
    Index(usize),
    /// Every element of an array (or every value of an object).
    Wildcard,
}

/// A parsed JSONPath of the supported subset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Path(pub Vec<Segment>);

/// Why a path was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The expression is not in the supported subset.
    #[error("{expression:?}: {reason}")]
    Syntax {
        /// The expression.
        expression: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A fixed path uses something other than fields.
    #[error("{0:?} is not a fixed JSONPath (fields separated by the child operator only)")]
    NotFixed(String),
    /// Something other than an object stands where the path goes on.
    #[error("{path}: {found} where an object or array was expected")]
    Blocked {
        /// The path.
        path: String,
        /// What was found.
        found: String,
    },
}

impl Path {
    /// Parses `expression`: an optional leading `$`, then `.field`, `['field']`, `["field"]`,
    /// `[N]`, `[*]` or `.*`, in any order.
    pub fn parse(expression: &str) -> Result<Path, PathError> {
        let syntax = |reason: &str| PathError::Syntax {
            expression: expression.to_owned(),
            reason: reason.to_owned(),
        };
        let mut rest = expression.trim();
        rest = rest.strip_prefix('$').unwrap_or(rest);
        // `spec.template` (no leading dot) is accepted too, as Kyma's labelsPath writes it.
        let mut segments = Vec::new();
        let mut first = true;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('[') {
                let end = after.find(']').ok_or_else(|| syntax("an unclosed ["))?;
                let inner = after[..end].trim();
                rest = &after[end + 1..];
                if inner == "*" {
                    segments.push(Segment::Wildcard);
                } else if let Some(quoted) = inner
                    .strip_prefix('\'')
                    .and_then(|s| s.strip_suffix('\''))
                    .or_else(|| inner.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
                {
                    if quoted.is_empty() {
                        return Err(syntax("an empty field name"));
                    }
                    segments.push(Segment::Field(quoted.to_owned()));
                } else if let Ok(index) = inner.parse::<usize>() {
                    segments.push(Segment::Index(index));
                } else {
                    return Err(syntax(&format!(
                        "[{inner}]: only fields, indices and [*] are supported"
                    )));
                }
            } else {
                let after = match rest.strip_prefix('.') {
                    Some(after) => after,
                    None if first => rest,
                    None => return Err(syntax("expected . or [")),
                };
                if after.starts_with('.') {
                    return Err(syntax("recursive descent (..) is not supported"));
                }
                let end = after.find(['.', '[']).unwrap_or(after.len());
                let name = &after[..end];
                rest = &after[end..];
                match name {
                    "" => return Err(syntax("an empty field name")),
                    "*" => segments.push(Segment::Wildcard),
                    name if name
                        .chars()
                        .all(|c| c.is_alphanumeric() || "_-$".contains(c)) =>
                    {
                        segments.push(Segment::Field(name.to_owned()))
                    }
                    name => return Err(syntax(&format!("{name:?} is not a field name"))),
                }
            }
            first = false;
        }
        Ok(Path(segments))
    }

    /// Parses a fixed path: fields only.
    pub fn parse_fixed(expression: &str) -> Result<Path, PathError> {
        let path = Path::parse(expression)?;
        if path.is_fixed() {
            Ok(path)
        } else {
            Err(PathError::NotFixed(expression.to_owned()))
        }
    }

    /// Whether every segment is a field.
    pub fn is_fixed(&self) -> bool {
        self.0.iter().all(|s| matches!(s, Segment::Field(_)))
    }

    /// This path followed by `other`.
    pub fn join(&self, other: &Path) -> Path {
        Path(self.0.iter().chain(&other.0).cloned().collect())
    }

    /// The value at this fixed path, if every step exists.
    pub fn get<'v>(&self, value: &'v Value) -> Option<&'v Value> {
        let mut current = value;
        for segment in &self.0 {
            current = match segment {
                Segment::Field(name) => current.get(name.as_str())?,
                Segment::Index(i) => current.get(*i)?,
                Segment::Wildcard => return None,
            };
        }
        Some(current)
    }

    /// The value at this fixed path, if every step exists, to change.
    pub fn get_mut<'v>(&self, value: &'v mut Value) -> Option<&'v mut Value> {
        let mut current = value;
        for segment in &self.0 {
            current = match segment {
                Segment::Field(name) => current.get_mut(name.as_str())?,
                Segment::Index(i) => current.get_mut(*i)?,
                Segment::Wildcard => return None,
            };
        }
        Some(current)
    }

    /// The value at this fixed path, made (objects on the way, `empty` at the end) where it is
    /// missing or null.
    pub fn get_or_create<'v>(
        &self,
        value: &'v mut Value,
        empty: impl FnOnce() -> Value,
    ) -> Result<&'v mut Value, PathError> {
        let mut current = value;
        let last = self.0.len().saturating_sub(1);
        let mut empty = Some(empty);
        for (i, segment) in self.0.iter().enumerate() {
            let Segment::Field(name) = segment else {
                return Err(PathError::NotFixed(self.to_string()));
            };
            if current.is_null() {
                *current = Value::Object(Map::new());
            }
            let Value::Object(object) = current else {
                return Err(PathError::Blocked {
                    path: self.to_string(),
                    found: kind(current).to_owned(),
                });
            };
            let next = object.entry(name.clone()).or_insert(Value::Null);
            if i == last && next.is_null() {
                *next = empty.take().expect("once")();
            }
            current = next;
        }
        Ok(current)
    }

    /// Removes the value at this fixed path if it is an empty object or array, then every
    /// parent on the path that this leaves empty (never `value` itself).
    pub fn prune_empty(&self, value: &mut Value) {
        fn prune(value: &mut Value, segments: &[Segment]) {
            let Some((Segment::Field(name), rest)) = segments.split_first() else {
                return;
            };
            let Some(object) = value.as_object_mut() else {
                return;
            };
            let Some(child) = object.get_mut(name) else {
                return;
            };
            prune(child, rest);
            let empty = match child {
                Value::Object(o) => o.is_empty(),
                Value::Array(a) => a.is_empty(),
                Value::Null => true,
                _ => false,
            };
            if empty {
                object.remove(name);
            }
        }
        prune(value, &self.0);
    }

    /// Calls `f` with every value this path matches, and the concrete path to it (indices for
    /// wildcards). Missing steps match nothing.
    pub fn for_each_mut(&self, value: &mut Value, f: &mut dyn FnMut(&str, &mut Value)) {
        fn walk(
            value: &mut Value,
            segments: &[Segment],
            at: &mut String,
            f: &mut dyn FnMut(&str, &mut Value),
        ) {
            let Some((segment, rest)) = segments.split_first() else {
                f(at, value);
                return;
            };
            let len = at.len();
            match segment {
                Segment::Field(name) => {
                    if let Some(child) = value.get_mut(name.as_str()) {
                        at.push('.');
                        at.push_str(name);
                        walk(child, rest, at, f);
                    }
                }
                Segment::Index(i) => {
                    if let Some(child) = value.get_mut(*i) {
                        at.push_str(&format!("[{i}]"));
                        walk(child, rest, at, f);
                    }
                }
                Segment::Wildcard => match value {
                    Value::Array(items) => {
                        for (i, child) in items.iter_mut().enumerate() {
                            at.push_str(&format!("[{i}]"));
                            walk(child, rest, at, f);
                            at.truncate(len);
                        }
                    }
                    Value::Object(fields) => {
                        for (name, child) in fields.iter_mut() {
                            at.push_str(&format!("['{name}']"));
                            walk(child, rest, at, f);
                            at.truncate(len);
                        }
                    }
                    _ => {}
                },
            }
            at.truncate(len);
        }
        walk(value, &self.0, &mut String::new(), f);
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for segment in &self.0 {
            match segment {
                Segment::Field(name)
                    if !name.is_empty()
                        && name
                            .chars()
                            .all(|c| c.is_alphanumeric() || "_-$".contains(c)) =>
                {
                    write!(f, ".{name}")?
                }
                Segment::Field(name) => write!(f, "['{name}']")?,
                Segment::Index(i) => write!(f, "[{i}]")?,
                Segment::Wildcard => write!(f, "[*]")?,
            }
        }
        Ok(())
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(name: &str) -> Segment {
        Segment::Field(name.to_owned())
    }

    #[test]
    fn parses_the_fixed_forms_of_the_spec() {
        let expected = Path(vec![
            field("spec"),
            field("template"),
            field("spec"),
            field("volumes"),
        ]);
        for expression in [
            ".spec.template.spec.volumes",
            ".spec['template'].spec['volumes']",
            "$.spec[\"template\"].spec.volumes",
            "spec.template.spec.volumes",
        ] {
            assert_eq!(
                Path::parse_fixed(expression).unwrap(),
                expected,
                "{expression}"
            );
        }
        assert_eq!(
            Path::parse_fixed(".name").unwrap(),
            Path(vec![field("name")])
        );
        assert_eq!(
            Path::parse_fixed("['name']").unwrap(),
            Path(vec![field("name")])
        );
    }

    #[test]
    fn wildcards_and_indices_are_not_fixed() {
        let path = Path::parse(".spec.containers[*]").unwrap();
        assert_eq!(
            path,
            Path(vec![field("spec"), field("containers"), Segment::Wildcard])
        );
        assert_eq!(path.to_string(), ".spec.containers[*]");
        assert!(Path::parse_fixed(".spec.containers[*]").is_err());
        assert!(Path::parse_fixed(".spec.containers[0]").is_err());
        for bad in [
            ".spec..containers",
            ".spec[?(@.name=='a')]",
            ".spec[0,1]",
            ".spec[",
            ".spec.",
            "['']",
        ] {
            assert!(Path::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn get_or_create_makes_what_is_missing_and_prune_removes_it() {
        let mut value = json!({"spec": {"template": {"spec": {}}}});
        let original = value.clone();
        let path = Path::parse_fixed(".spec.template.metadata.annotations").unwrap();
        let annotations = path
            .get_or_create(&mut value, || Value::Object(Map::new()))
            .unwrap();
        assert_eq!(annotations, &json!({}));
        assert_eq!(
            value["spec"]["template"]["metadata"]["annotations"],
            json!({})
        );
        path.prune_empty(&mut value);
        assert_eq!(value, original);
        let mut blocked = json!({"spec": {"template": "x"}});
        assert!(path.get_or_create(&mut blocked, || json!({})).is_err());
    }

    #[test]
    fn for_each_mut_visits_every_match() {
        let mut value = json!({"a": [{"n": 1}, {"n": 2}], "b": {"x": {"n": 3}}});
        let mut seen = Vec::new();
        Path::parse(".a[*]")
            .unwrap()
            .for_each_mut(&mut value, &mut |at, v| {
                seen.push((at.to_owned(), v["n"].clone()))
            });
        Path::parse(".b.*")
            .unwrap()
            .for_each_mut(&mut value, &mut |at, v| {
                seen.push((at.to_owned(), v["n"].clone()))
            });
        Path::parse(".missing[*]")
            .unwrap()
            .for_each_mut(&mut value, &mut |at, v| {
                seen.push((at.to_owned(), v.clone()))
            });
        assert_eq!(
            seen,
            vec![
                (".a[0]".to_owned(), json!(1)),
                (".a[1]".to_owned(), json!(2)),
                (".b['x']".to_owned(), json!(3)),
            ]
        );
    }
}
