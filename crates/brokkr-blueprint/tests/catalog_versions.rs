//! The ready-made Kubernetes catalogs name only versions that were checked against what their
//! publishers list: catalogs/kubedb only KubeDB versions in catalogs/kubedb/versions.txt (checked
//! against KubeDB's own catalog), catalogs/manifests only images in
//! catalogs/manifests/versions.txt (checked against the image registries' sources).
//!
//! Every value a plan can produce counts: the `version` enum and default of its parameter schemas
//! and the `param('/version', …)` defaults in its registry and templates, substituted into each
//! KubeDB resource's `spec.version` and each container's `image`. A template that takes a version
//! some other way fails the test rather than going unchecked.

use std::collections::BTreeSet;
use std::path::Path;

use brokkr_blueprint::load::load_path;
use brokkr_blueprint::{Config, PlanEntry};
use regex::Regex;
use serde_json::Value;

/// A checked list: `(kind or image, version or tag)` pairs, from the first two fields of each
/// line that is not blank or a comment.
fn checked(list: &str) -> BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(catalogs().join(list)).unwrap();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut fields = l.split_whitespace();
            match (fields.next(), fields.next()) {
                (Some(name), Some(version)) => (name.to_owned(), version.to_owned()),
                _ => panic!("{list}: a line with no version: {l:?}"),
            }
        })
        .collect()
}

fn catalogs() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../catalogs"))
}

fn load(dir: &str) -> Config {
    load_path(&catalogs().join(dir)).unwrap_or_else(|e| panic!("catalogs/{dir}: {e}"))
}

fn plan_name(entry: &PlanEntry) -> String {
    format!("{}/{}", entry.service.name, entry.plan.name)
}

/// The versions a plan's instances can be given, or why they cannot be told: the enum and
/// default of `version` in its instance schemas and every literal `param('/version', …)` default
/// in its registry and templates.
fn plan_versions(entry: &PlanEntry) -> Result<BTreeSet<String>, String> {
    let mut versions = BTreeSet::new();
    let schemas = [
        entry.plan.instance_create_schema(),
        entry.plan.instance_update_schema(),
    ];
    for property in schemas
        .into_iter()
        .flatten()
        .filter_map(|s| s.pointer("/properties/version"))
    {
        let Some(values) = property.get("enum").and_then(Value::as_array) else {
            return Err(
                "the `version` parameter has no enum: any version could be asked for".into(),
            );
        };
        versions.extend(
            values
                .iter()
                .map(version_string)
                .collect::<Result<Vec<_>, _>>()?,
        );
        if let Some(default) = property.get("default") {
            versions.insert(version_string(default)?);
        }
    }
    let defaults = Regex::new(r#"param\(\s*['"]/version['"]\s*,\s*['"]([^'"]*)['"]\s*\)"#).unwrap();
    for text in plan_strings(entry) {
        versions.extend(defaults.captures_iter(&text).map(|c| c[1].to_owned()));
    }
    Ok(versions)
}

fn version_string(v: &Value) -> Result<String, String> {
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("a `version` value that is not a string: {v}"))
}

/// Every string of a plan's instance blueprint: registry values and step templates.
fn plan_strings(entry: &PlanEntry) -> Vec<String> {
    let mut out = Vec::new();
    for r in &entry.blueprint.instance.registry {
        strings(&r.value, &mut out);
    }
    for step in &entry.blueprint.instance.steps {
        step.templates.iter().for_each(|t| strings(t, &mut out));
    }
    out
}

fn strings(tree: &Value, out: &mut Vec<String>) {
    match tree {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

/// The values a template string takes: itself when it is a literal; the plan's versions when it
/// is exactly the instance's `version` (read from the registry, or a `param('/version', …)`).
fn values_of(text: &str, entry: &PlanEntry) -> Result<BTreeSet<String>, String> {
    if !text.contains("{{") && !text.contains("{%") {
        return Ok(BTreeSet::from([text.to_owned()]));
    }
    let version = Regex::new(
        r#"^\{\{\s*(registry\(\s*['"]version['"]\s*\)|param\(\s*['"]/version['"]\s*,\s*['"][^'"]*['"]\s*\))\s*\}\}$"#,
    )
    .unwrap();
    if !version.is_match(text) {
        return Err(format!("cannot tell which versions {text:?} takes"));
    }
    if text.contains("registry(") {
        let entry_value = (entry.blueprint.instance.registry.iter())
            .find(|r| r.name == "version")
            .and_then(|r| r.value.as_str())
            .ok_or("it reads registry('version'), which the plan does not set from a string")?;
        if entry_value.contains("registry(") {
            return Err(format!("registry entry `version` is {entry_value:?}"));
        }
        return values_of(entry_value, entry);
    }
    plan_versions(entry)
}

/// What one template tree names, as `(key, template string of the value)`, or why a value cannot
/// be checked.
type Found = Vec<Result<(String, String), String>>;

/// What a plan's instance templates produce, by `(key, value)`: for each object `pick` finds, the
/// key it names and every value its template string can take.
fn produced(
    entry: &PlanEntry,
    pick: fn(&Value, &mut Found),
) -> Result<BTreeSet<(String, String)>, String> {
    let mut found = Vec::new();
    for step in &entry.blueprint.instance.steps {
        step.templates.iter().for_each(|t| pick(t, &mut found));
    }
    let mut out = BTreeSet::new();
    for item in found {
        let (key, text) = item?;
        for value in values_of(&text, entry)? {
            out.insert((key.clone(), value));
        }
    }
    Ok(out)
}

/// KubeDB resources (`apiVersion: kubedb.com/…`): their kind and `spec.version`.
fn kubedb_versions(tree: &Value, out: &mut Found) {
    let is_kubedb = tree["apiVersion"]
        .as_str()
        .is_some_and(|a| a.starts_with("kubedb.com/"));
    if let (true, Some(kind)) = (is_kubedb, tree["kind"].as_str()) {
        out.push(
            match tree.pointer("/spec/version").and_then(Value::as_str) {
                Some(version) => Ok((kind.to_owned(), version.to_owned())),
                None => Err(format!("a {kind} resource with no spec.version")),
            },
        );
    }
}

/// Every `image` anywhere in a tree, as `(repository, tag)`.
fn images(tree: &Value, out: &mut Found) {
    match tree {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("image", Value::String(image)) => out.push(split_image(image)),
                    _ => images(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| images(v, out)),
        _ => {}
    }
}

/// An image reference as `(repository, tag)`; the tag may be a template (`postgres:{{ … }}`).
fn split_image(image: &str) -> Result<(String, String), String> {
    let colon = match image.find("{{") {
        Some(i) => image[..i].rfind(':').filter(|&c| c + 1 == i),
        None => image.rfind(':').filter(|&c| !image[c..].contains('/')),
    };
    match colon {
        Some(c) if !image.contains('@') => Ok((image[..c].to_owned(), image[c + 1..].to_owned())),
        _ => Err(format!("image {image:?} has no tag this test can check")),
    }
}

/// Every plan of `config` whose `pick`ed values are not all in `list`, one message each.
fn problems(
    config: &Config,
    list: &BTreeSet<(String, String)>,
    list_name: &str,
    what: &str,
    pick: fn(&Value, &mut Found),
) -> Vec<String> {
    let mut problems = Vec::new();
    for entry in config.plans() {
        let plan = plan_name(entry);
        match produced(entry, pick) {
            Ok(values) if values.is_empty() => problems.push(format!("plan {plan}: no {what}")),
            Ok(values) => problems.extend(values.into_iter().filter(|v| !list.contains(v)).map(
                |(name, value)| {
                    format!("plan {plan}: {what} {name} {value:?} is not in {list_name}")
                },
            )),
            Err(e) => problems.push(format!("plan {plan}: {e}")),
        }
    }
    problems.sort();
    problems
}

/// Every plan of catalogs/`dir` names only what catalogs/`dir`/versions.txt lists.
fn check(dir: &str, what: &str, pick: fn(&Value, &mut Found)) {
    let config = load(dir);
    assert!(config.plans().count() >= 6, "catalogs/{dir}: too few plans");
    let list_name = format!("catalogs/{dir}/versions.txt");
    let problems = problems(
        &config,
        &checked(&format!("{dir}/versions.txt")),
        &list_name,
        what,
        pick,
    );
    assert!(
        problems.is_empty(),
        "catalogs/{dir}:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn kubedb_plans_name_only_checked_kubedb_versions() {
    check("kubedb", "KubeDB version", kubedb_versions);
}

#[test]
fn manifests_plans_run_only_checked_images() {
    check("manifests", "image", images);
}

/// The check sees what it must: a version outside the list, a `version` parameter with no enum
/// and a template that takes its version some other way are each reported, naming the plan.
#[test]
fn unchecked_versions_are_reported() {
    let kubedb = std::fs::read_to_string(catalogs().join("kubedb/kubedb.yaml")).unwrap();
    let cases = [
        // A schema enum and default outside the list.
        (
            kubedb.replace("\"16.13\"", "\"16.4\""),
            "plan postgresql/small: KubeDB version Postgres \"16.4\" is not in",
        ),
        // A `version` parameter that takes any string.
        (
            kubedb.replacen("enum: [\"8.4.8\", \"8.0.36\"]", "type: string", 1),
            "plan mysql/small: the `version` parameter has no enum",
        ),
        // A spec.version the check cannot follow.
        (
            kubedb.replacen(
                "version: \"{{ registry('version') }}\"",
                "version: \"{{ registry('version') ~ '-bookworm' }}\"",
                1,
            ),
            "plan postgresql/small: cannot tell which versions",
        ),
    ];
    let list = checked("kubedb/versions.txt");
    for (yaml, expected) in cases {
        assert_ne!(
            yaml, kubedb,
            "the case no longer changes catalogs/kubedb: {expected}"
        );
        let config = brokkr_blueprint::load::load_str("kubedb.yaml", &yaml).unwrap();
        let found = problems(
            &config,
            &list,
            "the list",
            "KubeDB version",
            kubedb_versions,
        );
        assert!(
            found.iter().any(|m| m.contains(expected)),
            "expected {expected:?} among {found:#?}"
        );
    }
}
