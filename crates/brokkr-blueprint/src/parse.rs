//! Parsing one configuration file: its YAML syntax, then its structure against the model.
//!
//! One pass reports every key that is not a field of the object it is written in, with the
//! nearest field for a near miss (`plan_updatable` → `plan_updateable`) or else the fields the
//! object has, and the caret on the key. A value that does not fit the model (a missing field, a
//! wrong type) stops the pass; it is reported with its field path, at its node, and a missing
//! field that is written elsewhere says where: misspelt beside its siblings (`bindabel`), or
//! indented under a neighbouring object instead of its own.
//!
//! Free-form values (`metadata`, `dashboard_client`, parameter schemas, template trees) are
//! `serde_json::Value`s and take any key.

use std::collections::HashSet;

use brokkr_osb::catalog::{BindingSchemas, InputParameters, InstanceSchemas};
use brokkr_osb::{MaintenanceInfo, Plan, Schemas, Service};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_saphyr::Error as YamlError;

use crate::config::{
    AuthConfig, BindingBlueprint, Blueprint, BrokerConfig, CatalogConfig, File, InstanceBlueprint,
    RegistryEntry, Rotation, Step, TargetConfig,
};
use crate::error::ConfigError;
use crate::span::{Position, SourceMap};

/// What parsing one file found.
pub(crate) struct Parsed {
    /// The model, unless a value did not fit it (unknown keys alone leave it whole).
    pub file: Option<File>,
    /// Every problem found, in the order of the file.
    pub errors: Vec<ConfigError>,
}

/// Parses the file `name` (with its source `map`).
pub(crate) fn parse(name: &str, text: &str, map: &SourceMap) -> Parsed {
    if text.trim().is_empty() {
        return Parsed {
            file: Some(File::default()),
            errors: Vec::new(),
        };
    }
    let options = serde_saphyr::options! {
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
    };
    let mut unknown = Vec::new();
    let mut track = serde_path_to_error::Track::new();
    let result = serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
        let de = serde_path_to_error::Deserializer::new(de, &mut track);
        serde_ignored::deserialize(de, |path| unknown.push(field_path(&path)))
    });
    let mut report = Report {
        name,
        map,
        errors: Vec::new(),
        explained: HashSet::new(),
    };
    let file = match result {
        Ok(file) => Some(file),
        Err(e) => {
            report.failure(e.without_snippet(), &path_of(&track.path()));
            None
        }
    };
    for key in &unknown {
        report.unknown_key(key);
    }
    report.errors.sort_by_key(|e| (e.line, e.column));
    Parsed {
        file,
        errors: report.errors,
    }
}

/// The problems of one file.
struct Report<'a> {
    name: &'a str,
    map: &'a SourceMap,
    errors: Vec<ConfigError>,
    /// Unknown keys already explained by a missing field's error.
    explained: HashSet<String>,
}

impl Report<'_> {
    fn push(&mut self, field: &str, message: String, position: Option<Position>) {
        let error = ConfigError::new(self.name, field, message).at(self.map, position);
        self.errors.push(error);
    }

    /// The error that stopped the pass, found at `path`.
    fn failure(&mut self, e: &YamlError, path: &str) {
        let location = e.location().filter(|l| l.line() > 0).map(|l| Position {
            line: l.line() as usize,
            column: (l.column() as usize).max(1),
            width: 1,
        });
        match e {
            YamlError::SerdeMissingField { field, .. } => self.missing(path, field),
            YamlError::SerdeInvalidType { .. }
            | YamlError::SerdeInvalidValue { .. }
            | YamlError::SerdeInvalidLength { .. }
            | YamlError::SerdeUnknownVariant { .. }
            | YamlError::Message { .. }
            | YamlError::NullIntoString { .. }
            | YamlError::InvalidBooleanStrict { .. }
            | YamlError::InvalidScalar { .. }
                if !path.is_empty() =>
            {
                let position = self.map.locate(path).or(location);
                self.push(path, message(e), position);
            }
            // A syntax error: the parser's own position.
            _ => self.push("", message(e), location),
        }
    }

    /// `field` is missing from the object at `path`.
    fn missing(&mut self, path: &str, field: &str) {
        let map = self.map;
        let object = if path.is_empty() { "the file" } else { path };
        let join = |key: &str| match path {
            "" => key.to_owned(),
            _ => format!("{path}.{key}"),
        };
        // Misspelt beside its siblings.
        let known = known_fields(path);
        let mut siblings: Vec<&str> = map
            .keys_of(path)
            .filter(|key| !known.contains(key) && is_near(key, field))
            .collect();
        siblings.sort_unstable();
        if let Some(written) = siblings.first() {
            let key = join(written);
            let message = format!(
                "unknown field `{written}`; did you mean `{field}`? ({object} needs `{field}`)"
            );
            self.push(&key, message, map.locate_key(&key));
            self.explained.insert(key);
            return;
        }
        // Written under a neighbouring object, or beside its own object: indented wrongly.
        let mut elsewhere: Vec<&str> = map
            .keys_named(field)
            .filter(|key| {
                let parent = object_of(key);
                is_within(parent, path) || is_within(path, parent)
            })
            .collect();
        elsewhere.sort_unstable();
        if let Some(key) = elsewhere.first() {
            let parent = object_of(key);
            let how = if is_within(parent, path) {
                "too far"
            } else {
                "too little"
            };
            let message = format!(
                "`{field}` is a field of {object}, not of {}: is it indented {how}?",
                if parent.is_empty() {
                    "the file"
                } else {
                    parent
                }
            );
            self.push(key, message, map.locate_key(key));
            self.explained.insert((*key).to_owned());
            return;
        }
        let message = format!("missing field `{field}`");
        self.push(path, message, map.locate(path));
    }

    /// `key` (a field path) is not a field of the object it is written in.
    fn unknown_key(&mut self, key: &str) {
        if self.explained.contains(key) {
            return;
        }
        let name = last_of(key);
        let fields = known_fields(object_of(key));
        let nearest = fields
            .iter()
            .filter(|f| is_near(name, f))
            .min_by_key(|f| strsim::damerau_levenshtein(name, f));
        let message = match nearest {
            Some(f) => format!("unknown field `{name}`; did you mean `{f}`?"),
            None if fields.is_empty() => format!("unknown field `{name}`"),
            None => format!(
                "unknown field `{name}`; expected one of {}",
                fields
                    .iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        self.push(key, message, self.map.locate_key(key));
    }
}

/// The error's text without serde-saphyr's "at line …" suffix (the position is shown below).
fn message(e: &YamlError) -> String {
    let text = e.to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    match e.location().filter(|l| l.line() > 0) {
        Some(l) => {
            let suffix = format!(" at line {}, column {}", l.line(), l.column());
            text.strip_suffix(&suffix).unwrap_or(text).to_owned()
        }
        None => text.to_owned(),
    }
}

/// Whether `written` is a near miss of the field `name`.
fn is_near(written: &str, name: &str) -> bool {
    written != name && strsim::damerau_levenshtein(written, name) <= 2.max(name.len() / 4)
}

/// The path of the object a field path is in: `a.b[0]` for `a.b[0].c`.
pub(crate) fn object_of(path: &str) -> &str {
    path.rsplit_once('.').map_or("", |(parent, _)| parent)
}

/// The field's own name: `c` for `a.b[0].c`.
fn last_of(path: &str) -> &str {
    path.rsplit_once('.').map_or(path, |(_, last)| last)
}

/// Whether the object at `inner` is `outer` or inside it.
fn is_within(inner: &str, outer: &str) -> bool {
    outer.is_empty()
        || inner == outer
        || inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.starts_with(['.', '[']))
}

/// A path as serde_path_to_error tracks it, in this crate's form: `blueprints[0].instance`.
fn path_of(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => {}
        }
    }
    out
}

/// A path as serde_ignored reports it, in this crate's form.
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => match field_path(parent) {
            parent if parent.is_empty() => key.clone(),
            parent => format!("{parent}.{key}"),
        },
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

/// The fields of the object at `path`, from its type's own `Deserialize` (so the lists never
/// drift from the model); empty where the object's type is not known by its path.
fn known_fields(path: &str) -> &'static [&'static str] {
    // The object's kind, from the field names along its path (indices and map keys of
    // `targets` dropped).
    let mut shape: Vec<&str> = path
        .split('.')
        .map(|part| part.split('[').next().unwrap_or_default())
        .filter(|part| !part.is_empty())
        .collect();
    if shape.first() == Some(&"targets") && shape.len() > 1 {
        shape.remove(1);
    }
    match shape.as_slice() {
        [] => field_names::<File>(),
        ["broker"] => field_names::<BrokerConfig>(),
        ["broker", "auth" | "admin_auth"] => field_names::<AuthConfig>(),
        ["targets"] => field_names::<TargetConfig>(),
        ["catalog"] => field_names::<CatalogConfig>(),
        ["catalog", "services"] => field_names::<Service>(),
        ["catalog", "services", "plans"] => field_names::<Plan>(),
        ["catalog", "services", "plans", "schemas"] => field_names::<Schemas>(),
        [
            "catalog",
            "services",
            "plans",
            "schemas",
            "service_instance",
        ] => field_names::<InstanceSchemas>(),
        ["catalog", "services", "plans", "schemas", "service_binding"] => {
            field_names::<BindingSchemas>()
        }
        ["catalog", "services", "plans", "schemas", _, _] => field_names::<InputParameters>(),
        ["catalog", "services", "plans", "maintenance_info"] => field_names::<MaintenanceInfo>(),
        ["blueprints"] => field_names::<Blueprint>(),
        ["blueprints", "instance"] => field_names::<InstanceBlueprint>(),
        ["blueprints", "binding"] => field_names::<BindingBlueprint>(),
        ["blueprints", "binding", "rotation"] => field_names::<Rotation>(),
        ["blueprints", _, "registry"] => field_names::<RegistryEntry>(),
        ["blueprints", _, "steps"] => field_names::<Step>(),
        _ => &[],
    }
}

/// The field names `T`'s derived `Deserialize` asks for, read by a deserializer that only
/// listens.
fn field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    struct Listener<'a>(&'a mut &'static [&'static str]);

    impl<'de> Deserializer<'de> for Listener<'_> {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("only structs are listened to"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("heard"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Listener(&mut fields));
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(yaml: &str) -> Vec<String> {
        let map = SourceMap::new(yaml);
        parse("f.yaml", yaml, &map)
            .errors
            .iter()
            .map(|e| format!("{}:{}: {}: {}", e.line, e.column, e.field, e.message))
            .collect()
    }

    #[test]
    fn every_unknown_key_is_reported_at_the_key() {
        let yaml = "\
blueprints:
- service: db
  plan: small
  instance:
    steps:
    - {name: a, delya: 1s}
    - name: b
      dealy: 1s
";
        assert_eq!(
            problems(yaml),
            [
                "6:17: blueprints[0].instance.steps[0].delya: unknown field `delya`; did you mean `delay`?",
                "8:7: blueprints[0].instance.steps[1].dealy: unknown field `dealy`; did you mean `delay`?",
            ]
        );
    }

    #[test]
    fn a_missing_field_names_its_object_and_a_near_miss() {
        let yaml = "\
catalog:
  services:
  - name: db
    id: svc
    description: d
    bindabel: true
    plans: [{name: small, id: p, description: s}]
";
        assert_eq!(
            problems(yaml),
            [
                "6:5: catalog.services[0].bindabel: unknown field `bindabel`; did you mean `bindable`? (catalog.services[0] needs `bindable`)"
            ]
        );
        let yaml = "blueprints:\n- service: db\n  instance: {steps: []}\n";
        assert_eq!(problems(yaml), ["2:3: blueprints[0]: missing field `plan`"]);
    }

    #[test]
    fn a_field_indented_wrongly_is_shown_where_it_is() {
        let too_far = "\
blueprints:
- service: db
  instance:
    plan: small
    steps: []
";
        assert_eq!(
            problems(too_far),
            [
                "4:5: blueprints[0].instance.plan: `plan` is a field of blueprints[0], not of blueprints[0].instance: is it indented too far?"
            ]
        );
        let too_little = "\
blueprints:
- service: db
  instance: {steps: []}
plan: small
";
        assert_eq!(
            problems(too_little),
            [
                "4:1: plan: `plan` is a field of blueprints[0], not of the file: is it indented too little?"
            ]
        );
    }

    #[test]
    fn a_wrong_value_is_named_by_its_path() {
        let yaml = "\
blueprints:
- service: db
  plan: small
  instance:
    steps:
    - name: a
      delay: soon
";
        let found = problems(yaml);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("7:14: blueprints[0].instance.steps[0].delay: invalid duration"),
            "{found:?}"
        );
    }

    #[test]
    fn syntax_errors_keep_the_parsers_position() {
        let found = problems("catalog:\n  services: [\n");
        assert!(found[0].starts_with("2:13: : "), "{found:?}");
    }
}
